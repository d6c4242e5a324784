"""The order of a mutant's tests, and a log of each mutant's run (copied by ``tools/mutation.py`` as the
``conftest.py`` of a module's copy; docs/tests.md, "Time").

mutmut runs a mutant against the tests that called the mutated function, with ``-x``: the first failure ends the
run. Its fork server passes those tests in the order of a Python set. With ``TCNN_MUTATION_ORDER=killers``
(``tools/mutation.py run --killers-first``) they run instead

1. first those that killed an earlier mutant of the same function in this run (the latest first): mutants of one
   function mostly break the same promise;
2. then the others, the fastest first, weighted by how many mutants each killed in this run (seconds / (1 + kills)).

Measured on a sample it gained nothing (docs/tests.md), so it is not the default. Only the order changes, never
which tests run: a mutant that survives still ran every test, and one that is killed failed a test it would have
failed in any order (the tests do not depend on each other's order).

Each mutant's run is appended to ``mutmut-kills.jsonl`` beside this file: the mutant, the test that failed (None: it
survived), the tests run, and the seconds (wall, and CPU: the machine is shared) from pytest's start to its end
(mutmut 3.8's fork server records no duration).
"""
import json
import os
import re
import time
from pathlib import Path

KILLS = Path(__file__).resolve().parent / 'mutmut-kills.jsonl'
_RUN = {'start': time.monotonic(), 'cpu': time.process_time(), 'failed': None, 'ran': 0}


def _mutant() -> str:
    name = os.environ.get('MUTANT_UNDER_TEST', '')
    return name if '__mutmut_' in name else ''


def _durations() -> dict:
    try:
        from mutmut.state import state
        if state().duration_by_test:
            return dict(state().duration_by_test)
    except Exception:  # mutmut's internals moved: read its stats file
        pass
    stats = Path('mutmut-stats.json') if Path('mutmut-stats.json').exists() else Path('mutants/mutmut-stats.json')
    try:
        return json.loads(stats.read_text())['duration_by_test']
    except (OSError, ValueError, KeyError):
        return {}


def _kills() -> list:
    try:
        lines = KILLS.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:  # a line cut by a worker killed mid-write
            pass
    return out


def pytest_collection_modifyitems(session, config, items) -> None:
    mutant = _mutant()
    if not mutant or len(items) < 2 or os.environ.get('TCNN_MUTATION_ORDER') != 'killers':
        return
    function = re.sub(r'__mutmut_\d+$', '', mutant)
    durations, kills = _durations(), _kills()
    latest = {}  # test -> index of its latest kill of this function's mutants
    count = {}
    kills = [kill for kill in kills if kill.get('test')]
    for i, kill in enumerate(kills):
        count[kill['test']] = count.get(kill['test'], 0) + 1
        if re.sub(r'__mutmut_\d+$', '', kill['mutant']) == function:
            latest[kill['test']] = i

    def key(item):
        if item.nodeid in latest:
            return (0, -latest[item.nodeid])
        return (1, durations.get(item.nodeid, 0.0) / (1 + count.get(item.nodeid, 0)))

    items[:] = sorted(items, key=key)


def pytest_configure(config) -> None:
    _RUN.update(start=time.monotonic(), cpu=time.process_time(), failed=None, ran=0)


def pytest_runtest_logreport(report) -> None:
    if report.when == 'call':
        _RUN['ran'] += 1
    if report.failed and _RUN['failed'] is None:
        _RUN['failed'] = report.nodeid


def pytest_unconfigure(config) -> None:
    mutant = _mutant()
    if mutant:
        line = {'mutant': mutant, 'test': _RUN['failed'], 'ran': _RUN['ran'],
                'seconds': round(time.monotonic() - _RUN['start'], 2),
                'cpu_seconds': round(time.process_time() - _RUN['cpu'], 2)}
        with open(KILLS, 'a') as f:
            f.write(json.dumps(line) + '\n')
