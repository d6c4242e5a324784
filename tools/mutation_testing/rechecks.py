"""The survivors of a run tested once more, the plain way: each written into the copy's source, tests in a new process.

``recheck`` tests every survivor of the last run so: the mutant written into the copy's source (``mutmut apply``),
the module's owning tests as they are now run in a new process (``pytest -x``, at most 15 minutes), the source
restored; a survivor that fails there counts as killed (``recheck.json`` beside the run). It also tells which
survivors the tests written since the run kill, without a new run. ``check_scripted`` does the same with TorchScript
on, for the code that only TorchScript runs.
"""
import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Sequence

from .copies import ROOT, folder, mutmut
from .modules import ENV, MODULES
from .verdicts import record, results


def recheck(module: str, only: Sequence[str] = (), tests: Sequence[str] = ()) -> Dict[str, str]:
    """Every survivor (and 'no tests' mutant) of ``module``'s last run once more, the plain way (module docstring):
    ``{mutant: 'killed' | 'survived' | 'timeout'}``, also written to ``recheck.json`` beside the run (merged with
    an earlier recheck's).

    Args:
        module: The campaign's module.
        only: The survivors whose names match these patterns (the others keep an earlier recheck's outcome, if
            any); all without.
        tests: pytest node IDs to run instead of the owning tests (those that own the code the mutants change:
            minutes saved per mutant where the owning tests are many).
    """
    _, owning, pytest_args = MODULES[module]
    return record(module, _applied(module, only, list(tests) or [*owning, *pytest_args], ENV, 'killed'),
                  fresh=not (only or tests))


def check_scripted(module: str, only: Sequence[str], tests: Sequence[str]) -> Dict[str, str]:
    """Which survivors of ``module``'s last run the test node IDs ``tests`` kill with TorchScript on
    (``PYTORCH_JIT=1``): mutants of the code that only TorchScript runs (the scripted forward's branch), which a run
    cannot test, as TorchScript compiles no trampoline. Each mutant is applied as ``recheck`` applies it (no
    trampoline); the ones killed count as ``'killed (TorchScript on)'`` (``recheck.json``, merged).

    Args:
        module: The campaign's module.
        only: The survivors whose names match these patterns; all without.
        tests: pytest node IDs (or files).
    """
    found = _applied(module, only, tests, dict(ENV, PYTORCH_JIT='1'), 'killed (TorchScript on)')
    record(module, {name: verdict for name, verdict in found.items() if verdict != 'survived'})
    return found


def _ambiguous(work: Path, name: str) -> bool:
    """Whether ``mutmut apply`` may write mutant ``name`` into the wrong function: a method (``xǁClassǁmethod``) whose
    name another class of its file also defines. mutmut 3.8 writes it over the file's first ``def`` of that name (seen
    with ``_AttendDepthwiseBackward.vmap``, written over ``_AttendDepthwise.vmap``: a killed mutant that was not)."""
    module, function = name.split('__mutmut_')[0].rsplit('.', 1)
    if 'ǁ' not in function:
        return False
    source = (work / (module.replace('.', '/') + '.py')).read_text(encoding='utf-8')
    return len(re.findall(rf'^\s+def {re.escape(function.split("ǁ")[-1])}\(', source, re.M)) > 1


def _applied(module: str, only: Sequence[str], pytest_args: Sequence[str], env: Dict[str, str],
             killed: str) -> Dict[str, str]:
    """Each survivor (or 'no tests' mutant) of ``module``'s last run matching ``only`` (all without) written into
    the copy's source (``mutmut apply``) and ``pytest -x`` with ``pytest_args`` and ``env`` run on it in a new
    process (at most 15 minutes), the tests as they are now (a survivor of the run may have a test since):
    ``{mutant: killed | 'survived' | 'timeout' | 'not applied'}``. The sources are restored after each."""
    files = MODULES[module][0]
    work = folder(module)
    shutil.rmtree(work / 'tests')
    shutil.copytree(ROOT / 'tests', work / 'tests', ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
    sources = sorted({p for pattern in files for p in work.glob(pattern) if p.suffix == '.py'})
    for path in sources:
        shutil.copy2(ROOT / path.relative_to(work), path)

    def tests_fail() -> bool:
        return subprocess.call([sys.executable, '-m', 'pytest', '-x', '-q', '-p', 'no:cacheprovider', *pytest_args],
                               cwd=work, env=dict(os.environ, **env), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=900) != 0
    if tests_fail():  # else every mutant would count as killed
        raise SystemExit(f'{module}: the tests fail without a mutant: {" ".join(pytest_args)}')
    outcome = {}
    for name, (status, _) in sorted(results(module, rechecked=False).items()):
        if status not in ('survived', 'no tests', 'equivalent'):
            continue
        if only and not any(fnmatch.fnmatchcase(name, pattern) for pattern in only):
            continue
        for path in sources:
            shutil.copy2(ROOT / path.relative_to(work), path)
        if _ambiguous(work, name) or mutmut(work, 'apply', name, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL):
            outcome[name] = 'not applied'
            continue
        try:
            outcome[name] = killed if tests_fail() else 'survived'
        except subprocess.TimeoutExpired:
            outcome[name] = 'timeout'
        print(f'{outcome[name]} {name}', file=sys.stderr, flush=True)
    for path in sources:
        shutil.copy2(ROOT / path.relative_to(work), path)
    return outcome
