"""mutmut's run of a module in its copy: a fresh one, or an interrupted one resumed.

mutmut switches a mutant on inside functions that run after the tests started (its trampolines read which mutant is
active), so a mutant in code that runs while ``tcnn`` is imported (the recipe's schema: ``Recipe``'s fields and
``RECIPE_KEYS`` are built by functions at import) is never active and survives whatever the tests check: the
rechecks (``rechecks.py``) test the survivors the plain way.
"""
import os
import subprocess
import sys
import time
from typing import Sequence

from .copies import mutmut, prepare, refresh
from .modules import ENV
from .state import restore


def run(module: str, max_children: int, only: Sequence[str] = (), killers_first: bool = False,
        resume: bool = False, fresh: bool = False) -> float:
    """Run mutmut on ``module`` in its copy; returns the wall time (s). Its output goes to ``mutmut.log`` there.

    Args:
        module: The campaign's module.
        max_children: Mutants tested at once.
        only: Mutant name patterns (e.g. ``tcnn.layers.positional.*``): a sample, to measure the time per mutant.
        killers_first: Each mutant's tests in ``copy_conftest.py``'s order (earlier killers of its function first,
            then the fastest), not mutmut's.
        resume: Go on with an interrupted run in its copy, refreshed (``copies.refresh``): mutmut tests only the
            mutants without a result.
        fresh: A new copy without the results saved in git (``state.restore``): every mutant runs.
    """
    work = refresh(module) if resume else prepare(module)
    if not resume and not fresh:
        restored = restore(module)
        if restored is not None:
            print(f'{module}: {restored} results of earlier sessions restored (those of changed functions run again)',
                  file=sys.stderr)
    start = time.monotonic()
    env = {'TCNN_MUTATION_ORDER': 'killers' if killers_first else 'mutmut'}
    with open(work / 'mutmut.log', 'a' if resume else 'w') as log:
        code = mutmut(work, 'run', '--max-children', str(max_children), *only, stdout=log, stderr=subprocess.STDOUT,
                      env=dict(os.environ, **ENV, **env))
    elapsed = time.monotonic() - start
    if resume and (work / 'wall_time_s').exists():
        elapsed += float((work / 'wall_time_s').read_text())
    (work / 'wall_time_s').write_text(f'{elapsed:.0f}\n')
    if code:
        print(f'{module}: mutmut exited {code}; see {work / "mutmut.log"}', file=sys.stderr)
    return elapsed
