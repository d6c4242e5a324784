"""The mutation campaign's tooling (``tools/mutation.py``, docs/tests.md) stays in step with the tests it names.

The tooling is not run by CI, so nothing else notices when a test it names is renamed or moved: each module's owning
tests, the tests left for later and the CUDA-only mutants' tests must exist; the equivalent mutants are data, one
mutant and its reason a line; the commands docs/tests.md gives are the command's own. No mutmut is needed here.
"""
import ast
import contextlib
import csv
import importlib
import json
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Dict, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def tools(monkeypatch) -> Iterator[Dict[str, ModuleType]]:
    """The command and its parts, imported as the command imports them (``tools/`` first on ``sys.path``), and
    forgotten afterwards (with the folders a test set)."""
    monkeypatch.syspath_prepend(str(ROOT / 'tools'))
    before = set(sys.modules)
    found = {name: importlib.import_module(name) for name in (
        'mutation', 'mutation_testing.modules', 'mutation_testing.copies', 'mutation_testing.cuda',
        'mutation_testing.verdicts')}
    monkeypatch.setattr(found['mutation_testing.copies'], 'FOLDERS', {})
    yield found
    for name in set(sys.modules) - before:
        del sys.modules[name]


def _test_functions(path: Path) -> set:
    return {node.name for node in ast.parse(path.read_text(encoding='utf-8')).body
            if isinstance(node, ast.FunctionDef) and node.name.startswith('test_')}


def test_every_test_the_mutation_tooling_names_exists(tools):
    modules, cuda = tools['mutation_testing.modules'], tools['mutation_testing.cuda']
    named = [test for _, tests, _ in modules.MODULES.values() for test in tests]
    named += [test for tests in modules.LATER.values() for test in tests]
    named += [mutant.test for mutant in cuda.CUDA_MUTANTS] + [mutant.test for mutant, _ in cuda.SMOKE_MUTANTS]
    missing = []
    for test in named:
        path, _, function = test.partition('::')
        if not (ROOT / path).is_file() or function and function.split('[')[0] not in _test_functions(ROOT / path):
            missing.append(test)
    assert not missing, 'tests named by tools/mutation_testing that do not exist:\n' + '\n'.join(missing)


def test_the_equivalent_mutants_are_one_mutant_and_its_reason_a_line(tools):
    path = ROOT / 'tools' / 'mutation_testing' / 'equivalent.tsv'
    with open(path, encoding='utf-8', newline='') as f:
        rows = list(csv.reader(f, delimiter='\t', quoting=csv.QUOTE_NONE))
    assert rows[0] == ['mutant', 'reason']
    names = [row[0] for row in rows[1:]]
    assert all(len(row) == 2 and row[1].strip() for row in rows[1:]), [row for row in rows if len(row) != 2]
    assert all(re.fullmatch(r'tcnn(\.\w+)+\.x(ǁ\w+ǁ|_)\w+__mutmut_\d+', name) for name in names), names
    assert len(set(names)) == len(names)
    assert tools['mutation_testing.verdicts'].equivalent_mutants() == dict(row for row in rows[1:])


def test_the_docs_commands_are_the_tools_own(tools):
    text = (ROOT / 'docs' / 'tests.md').read_text(encoding='utf-8')
    commands = re.findall(r'python tools/mutation\.py ([\w-]+)', text)
    assert commands and set(commands) <= set(tools['mutation'].COMMANDS) | {'COMMAND', '--help'}, commands
    assert 'tools/mutation_testing/equivalent.tsv' in text
    assert '`.ci/mutation' not in text and '.ci/cuda_mutants' not in text


def test_a_report_without_a_run_says_so_in_one_line(tools, capsys):
    assert tools['mutation'].main(['report', 'integrity', '--folder', 'no-run-here']) == 1
    captured = capsys.readouterr()
    assert captured.out == '' and captured.err == (
        f"integrity: no run in {ROOT / 'mutants' / 'no-run-here'}: start one with `python tools/mutation.py run "
        'integrity`\n')


def test_a_check_gives_each_mutant_its_verdict_and_a_hanging_one_times_out_in_a_process_of_its_own(tools, tmp_path,
                                                                                                  monkeypatch):
    """``check``'s children (``switched.switch_each``), on a test that reads the mutant switched on as mutmut's
    trampolines do: a failing test kills, a passing one lets survive, a hang is stopped and counted a timeout, and the
    mutant after it gets its verdict from a new process; each verdict reaches the caller as it comes."""
    monkeypatch.syspath_prepend(str(ROOT / 'tools'))
    switched = importlib.import_module('mutation_testing.switched')
    (tmp_path / 'test_switched.py').write_text('\n'.join([
        'import os, time',
        'def test_it():',
        '    mutant = os.environ["MUTANT_UNDER_TEST"]',
        '    with open(f"{mutant or \'none\'}.pid", "w") as f:',
        '        f.write(str(os.getpid()))',
        '    if mutant == "m.hangs":',
        '        time.sleep(600)',
        '    assert mutant != "m.breaks"', '']))
    env = dict(os.environ, PYTHONPATH=str(ROOT / 'tools'), TCNN_CHECK_TIMEOUT_S='2')
    seen = []
    outcome = switched.switch_each(['m.breaks', 'm.hangs', 'm.passes'], ['test_switched.py'], tmp_path, env,
                                   on_verdict=lambda name, verdict: seen.append((name, verdict)))
    assert outcome == {'m.breaks': 'killed', 'm.hangs': 'timeout', 'm.passes': 'survived'}
    assert seen == [('m.breaks', 'killed'), ('m.hangs', 'timeout'), ('m.passes', 'survived')]
    pid = {name: (tmp_path / f'{name}.pid').read_text() for name in ('m.breaks', 'm.hangs', 'm.passes')}
    assert pid['m.breaks'] == pid['m.hangs'] != pid['m.passes']
    # tests that fail without a mutant: no verdict, the child's own words
    (tmp_path / 'test_switched.py').write_text('def test_it():\n    assert False\n')
    with pytest.raises(RuntimeError, match='the tests fail without a mutant'):
        switched.switch_each(['m.breaks'], ['test_switched.py'], tmp_path, env)


def test_a_survivor_of_any_kind_that_a_check_kills_counts_as_killed(tools, tmp_path, monkeypatch, capsys):
    """A mutant mutmut left alive (survived, no tests, timed out, or 'suspicious': ended by a signal of its own, such
    as a KeyboardInterrupt that stops pytest) that ``check`` kills is recorded and counts as killed in a fresh
    process; a mutant mutmut killed keeps its status, and one the check did not kill stays a survivor."""
    verdicts, mutation = tools['mutation_testing.verdicts'], tools['mutation']
    monkeypatch.setattr(verdicts, 'folder', lambda module: tmp_path)
    meta = tmp_path / 'mutants' / 'tcnn' / 'm.py.meta'
    meta.parent.mkdir(parents=True)
    codes = {'m.survived': 0, 'm.no_tests': 33, 'm.suspicious': -2, 'm.timeout': 36, 'm.killed': 1, 'm.left': 0}
    meta.write_text(json.dumps({'exit_code_by_key': codes}))
    checked = dict({name: 'killed' for name in codes}, **{'m.left': 'survived'})

    def check(module, patterns, tests, on_verdict):
        for name, verdict in checked.items():
            on_verdict(name, verdict)
        return checked
    monkeypatch.setattr(mutation.switched, 'check', check)
    mutation._checked('train', ['m.*'], ['tests/test_x.py'])
    capsys.readouterr()
    assert json.loads((tmp_path / 'recheck.json').read_text()) == {
        name: 'killed' for name in ('m.survived', 'm.no_tests', 'm.suspicious', 'm.timeout')}
    assert {name: status for name, (status, _) in verdicts.results('train').items()} == {
        'm.survived': 'killed (fresh process)', 'm.no_tests': 'killed (fresh process)',
        'm.suspicious': 'killed (fresh process)', 'm.timeout': 'killed (fresh process)', 'm.killed': 'killed',
        'm.left': 'survived'}
    assert verdicts.results('train', rechecked=False)['m.suspicious'][0] == 'suspicious'


def test_saved_results_come_back_in_a_fresh_copy_and_a_recheck_holds_while_its_function_is_unchanged(tools, tmp_path,
                                                                                                     monkeypatch):
    """``save`` keeps the mutants that ran (not those left) with their function's hash, and the rechecks' verdicts
    with the hash they were given for; ``restore`` writes mutmut's ``.meta`` files into a fresh copy, from which
    mutmut keeps the results of unchanged functions (less "no tests", which the owning tests may reach since); a
    restored recheck counts only while its function's hash is the one it was given for."""
    state, verdicts = importlib.import_module('mutation_testing.state'), tools['mutation_testing.verdicts']
    copy = tmp_path / 'copy'
    monkeypatch.setattr(state, 'folder', lambda module: copy)
    monkeypatch.setattr(verdicts, 'folder', lambda module: copy)
    monkeypatch.setattr(state, 'STATE', tmp_path / 'state')
    meta = copy / 'mutants' / 'tcnn' / 'm.py.meta'
    meta.parent.mkdir(parents=True)
    codes = {'tcnn.m.x_f__mutmut_1': 1, 'tcnn.m.x_f__mutmut_2': 0, 'tcnn.m.xǁCǁg__mutmut_1': None,
             'tcnn.m.xǁCǁg__mutmut_2': 0, 'tcnn.m.xǁCǁg__mutmut_3': 33}
    meta.write_text(json.dumps({'exit_code_by_key': codes, 'hash_by_function_name': {'x_f': 'f1', 'xǁCǁg': 'g1'},
                                'durations_by_key': {'tcnn.m.x_f__mutmut_1': 1.234}}))
    (copy / 'recheck.json').write_text(json.dumps({'tcnn.m.x_f__mutmut_2': 'killed'}))
    saved = json.loads(state.save('train').read_text(encoding='utf-8'))
    assert saved == {'files': {'tcnn/m.py': {
        'hashes': {'x_f': 'f1', 'xǁCǁg': 'g1'},
        'exit_codes': {'tcnn.m.x_f__mutmut_1': 1, 'tcnn.m.x_f__mutmut_2': 0, 'tcnn.m.xǁCǁg__mutmut_2': 0,
                       'tcnn.m.xǁCǁg__mutmut_3': 33},
        'durations': {'tcnn.m.x_f__mutmut_1': 1.23}}}, 'rechecks': {'tcnn.m.x_f__mutmut_2': ['killed', 'f1']}}
    # a fresh copy: the results come back as mutmut's .meta, the recheck beside them
    import shutil
    shutil.rmtree(copy)
    assert state.restore('train') == 3
    restored = json.loads(meta.read_text())
    kept = saved['files']['tcnn/m.py']['exit_codes']
    assert restored['exit_code_by_key'] == {name: code for name, code in kept.items()
                                            if name != 'tcnn.m.xǁCǁg__mutmut_3'}  # "no tests": mutmut runs it again
    assert set(restored) == {'exit_code_by_key', 'hash_by_function_name', 'type_check_error_by_key',
                             'durations_by_key', 'estimated_durations_by_key'}  # what mutmut's load reads
    assert verdicts.results('train')['tcnn.m.x_f__mutmut_2'][0] == 'killed (fresh process)'
    # mutmut regenerates the mutants: f changed (its results reset), g did not
    meta.write_text(json.dumps({'exit_code_by_key': dict(codes, **{'tcnn.m.x_f__mutmut_2': 0}),
                                'hash_by_function_name': {'x_f': 'f2', 'xǁCǁg': 'g1'}}))
    assert state.saved_verdicts('train') == {}
    assert verdicts.results('train')['tcnn.m.x_f__mutmut_2'][0] == 'survived'
    assert state.restore('nothing-saved') is None


def test_the_cuda_check_runs_mutants_at_once_and_reports_each_verdict_as_it_comes(tools, monkeypatch):
    """``tools/mutation.py cuda --jobs N``: the mutants' tests run N at once, their verdicts come in the list's order,
    and the report reaches the caller after the baseline and after each verdict (a time limit keeps what it had)."""
    import threading
    import time as time_
    cuda = tools['mutation_testing.cuda']
    running, peak, lock = [0], [0], threading.Lock()

    def run_tests(root, tests, timeout=600):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time_.sleep(0.2)
        with lock:
            running[0] -= 1
        return {'rc': 1 if 'break' in str(root) else 0, 'failures': 1, 'seconds': 0.2, 'tail': ''}
    monkeypatch.setattr(cuda, 'run_tests', run_tests)
    monkeypatch.setattr(cuda, 'mutated_copy', lambda mutant, folder: mutant.new != 'absent')
    monkeypatch.setattr(cuda.tempfile, 'TemporaryDirectory',
                        lambda prefix: contextlib.nullcontext(prefix + 'break'))
    mutants = [cuda.Mutant(f'm{i}', 'p', 'old', 'absent' if i == 2 else 'new', 't') for i in range(4)]
    seen = []
    report = cuda.check(mutants, jobs=3, on_result=lambda r: seen.append(list(r['mutants'])))
    assert peak[0] == 3 and list(report['mutants']) == ['m0', 'm1', 'm2', 'm3']
    assert [r['verdict'] for r in report['mutants'].values()] == ['killed', 'killed', 'not applied', 'killed']
    assert seen == [[], ['m0'], ['m0', 'm1'], ['m0', 'm1', 'm2'], ['m0', 'm1', 'm2', 'm3']]
