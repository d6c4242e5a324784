"""Which of a run's mutants tests kill, as the tests are now: each mutant switched on as mutmut does, in one process.

``check`` copies the run's mutated tree (``mutants/<module>/mutants``) to ``mutants/<module>/check`` with the
repository's tests as they are now, and runs this module there (``python -m mutation_testing.switched NAMES
TESTS...``): the tests once without a mutant (they must pass), then once for each mutant, switched on through
``MUTANT_UNDER_TEST`` as mutmut's trampolines read it (``pytest -x``). Seconds a mutant, where a recheck starts a
process and every owning test for each.
"""
import fnmatch
import json
import os
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

from .copies import ROOT, folder
from .modules import ENV
from .verdicts import results


def check(module: str, patterns: Sequence[str], tests: Sequence[str]) -> Dict[str, str]:
    """Which of the last run's mutants the test node IDs ``tests`` kill, as they are now (e.g. the tests written for
    its survivors): ``{mutant: 'killed' | 'survived'}``.

    Args:
        module: The campaign's module.
        patterns: The mutants' name patterns (``'*'``: all).
        tests: pytest node IDs (or files).
    """
    run_tree, work = folder(module) / 'mutants', folder(module) / 'check'
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(run_tree, work, ignore=shutil.ignore_patterns('__pycache__', 'tests', 'conftest.py', '*.jsonl'))
    shutil.copytree(ROOT / 'tests', work / 'tests', ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
    names = sorted(name for name in results(module, rechecked=False)
                   if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns))
    # the copy first on sys.path (the working folder, then PYTHONPATH), this package after it
    path = os.pathsep.join([str(work), str(ROOT / 'tools')])
    out = subprocess.run([sys.executable, '-m', 'mutation_testing.switched', json.dumps(names), *tests], cwd=work,
                         stdout=subprocess.PIPE, text=True, env=dict(os.environ, **ENV, PYTHONPATH=path))
    if out.returncode:
        raise SystemExit(f'{module}: the check did not run (exit {out.returncode}); its tests: {" ".join(tests)}')
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: Optional[List[str]] = None) -> int:
    """In the copy: ``argv`` is the mutants' names (a JSON list) and the tests; prints ``{mutant: verdict}`` as JSON
    on its last line, each verdict also on stderr as it comes."""
    import pytest  # here, in the copy's process: the command needs no pytest to answer ``list`` or ``--help``
    argv = sys.argv[1:] if argv is None else argv
    names, tests = json.loads(argv[0]), argv[1:]
    os.environ['MUTANT_UNDER_TEST'] = ''
    if pytest.main(['-q', '-p', 'no:cacheprovider', *tests]):
        sys.exit('the tests fail without a mutant')
    outcome = {}
    for name in names:
        os.environ['MUTANT_UNDER_TEST'] = name
        outcome[name] = 'killed' if pytest.main(['-x', '-q', '-p', 'no:cacheprovider', *tests]) else 'survived'
        print(f'{outcome[name]} {name}', file=sys.stderr, flush=True)
    print(json.dumps(outcome))
    return 0


if __name__ == '__main__':
    sys.exit(main())
