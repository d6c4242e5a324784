"""Which of a run's mutants tests kill, as the tests are now: each mutant switched on as mutmut does, in one process.

``check`` copies the run's mutated tree (``mutants/<module>/mutants``) to ``mutants/<module>/check`` (or the folder
``$TCNN_CHECK_FOLDER`` names there: two checks of one module at once) with the repository's tests as they are now, and
runs this module there (``python -m mutation_testing.switched NAMES TESTS...``): the tests once without a mutant (they
must pass), then once for each mutant, switched on through ``MUTANT_UNDER_TEST`` as mutmut's trampolines read it
(``pytest -x``). Seconds a mutant, where a recheck starts a process and every owning test for each. Each verdict
reaches the parent as it comes; a mutant that hangs is stopped after ``TIMEOUT_S`` and counted a timeout, and the
mutants after it run in a fresh process.
"""
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from .copies import ROOT, folder
from .modules import ENV
from .verdicts import results


VERDICT = 'mutation-verdict: '  # the child's lines the parent reads, among the tests' own output on stderr
# a mutant whose tests run longer hangs (a loop that never ends, a queue nobody reads)
TIMEOUT_S = float(os.environ.get('TCNN_CHECK_TIMEOUT_S', '120'))


def check(module: str, patterns: Sequence[str], tests: Sequence[str],
          on_verdict: Optional[Callable[[str, str], None]] = None) -> Dict[str, str]:
    """Which of the last run's mutants the test node IDs ``tests`` kill, as they are now (e.g. the tests written for
    its survivors): ``{mutant: 'killed' | 'survived' | 'timeout'}``.

    A mutant whose tests run past ``TIMEOUT_S`` is a timeout; the process that ran it may hold its threads, so the
    mutants after it run in a new one (without the mutant, the tests must pass again there first).

    Args:
        module: The campaign's module.
        patterns: The mutants' name patterns (``'*'``: all).
        tests: pytest node IDs (or files).
        on_verdict: Called with each mutant and its verdict as it comes (an interrupted check keeps what it found).
    """
    run_tree, work = folder(module) / 'mutants', folder(module) / os.environ.get('TCNN_CHECK_FOLDER', 'check')
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(run_tree, work, ignore=shutil.ignore_patterns('__pycache__', 'tests', 'conftest.py', '*.jsonl'))
    shutil.copytree(ROOT / 'tests', work / 'tests', ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
    names = sorted(name for name in results(module, rechecked=False)
                   if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns))
    # the copy first on sys.path (the working folder, then PYTHONPATH), this package after it
    env = dict(os.environ, **ENV, PYTHONPATH=os.pathsep.join([str(work), str(ROOT / 'tools')]))
    try:
        return switch_each(names, tests, work, env, on_verdict)
    except RuntimeError as e:
        raise SystemExit(f'{e}\n{module}: the check did not run; its tests: {" ".join(tests)}') from None


def switch_each(names: Sequence[str], tests: Sequence[str], cwd: Path, env: Dict[str, str],
                on_verdict: Optional[Callable[[str, str], None]] = None) -> Dict[str, str]:
    """``{mutant: verdict}`` of ``tests`` run in ``cwd`` with each of ``names`` switched on, in child processes of
    ``main``: a new one after each timeout, until every mutant has its verdict.

    Raises:
        RuntimeError: A child stopped before its first verdict (the tests fail without a mutant, a bad node ID):
            what it last said.
    """
    outcome: Dict[str, str] = {}
    while len(outcome) < len(names):
        remaining = [n for n in names if n not in outcome]
        output = Path(cwd) / 'check-output.txt'  # pytest's own report of the last child (why the tests fail)
        with open(output, 'w') as pytest_output:
            child = subprocess.Popen([sys.executable, '-m', 'mutation_testing.switched', json.dumps(remaining),
                                      *tests], cwd=cwd, stdout=pytest_output, stderr=subprocess.PIPE, text=True,
                                     env=env)
        said: List[str] = []
        for line in child.stderr:
            if not line.startswith(VERDICT):
                said = (said + [line.rstrip()])[-20:]
                continue
            verdict, name = line[len(VERDICT):].split()
            outcome[name] = verdict
            print(f'{verdict} {name}', file=sys.stderr, flush=True)
            if on_verdict is not None:
                on_verdict(name, verdict)
        if len(outcome) == len(names) - len(remaining):  # not one verdict: it would fail the same way again
            child.wait()
            raise RuntimeError('\n'.join(said + [f'(exit {child.returncode}; pytest said: {output})']))
        child.wait()
    return outcome


class _Timeout(KeyboardInterrupt):
    """Raised in the tests by the timer: pytest stops the session as on Ctrl-C."""


def _time_out(signum, frame):
    raise _Timeout()


def main(argv: Optional[List[str]] = None) -> int:
    """In the copy: ``argv`` is the mutants' names (a JSON list) and the tests; writes each verdict on stderr as it
    comes (``VERDICT`` first); stops after a timeout (the parent starts a new process for the mutants left)."""
    import pytest  # here, in the copy's process: the command needs no pytest to answer ``list`` or ``--help``
    argv = sys.argv[1:] if argv is None else argv
    names, tests = json.loads(argv[0]), argv[1:]
    os.environ['MUTANT_UNDER_TEST'] = ''
    if pytest.main(['-q', '-p', 'no:cacheprovider', *tests]):
        sys.exit('the tests fail without a mutant')
    signal.signal(signal.SIGALRM, _time_out)
    for name in names:
        os.environ['MUTANT_UNDER_TEST'] = name
        timed_out = False
        signal.setitimer(signal.ITIMER_REAL, TIMEOUT_S)
        try:
            failed = pytest.main(['-x', '-q', '-p', 'no:cacheprovider', *tests])
        except _Timeout:  # outside a test: pytest did not catch it
            failed, timed_out = True, True
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        timed_out = timed_out or failed == pytest.ExitCode.INTERRUPTED
        verdict = 'timeout' if timed_out else 'killed' if failed else 'survived'
        print(f'{VERDICT}{verdict} {name}', file=sys.stderr, flush=True)
        if timed_out:
            break
    sys.stdout.flush()
    os._exit(0)  # a mutant's threads may still run (or wait forever): they are not waited for


if __name__ == '__main__':
    sys.exit(main())
