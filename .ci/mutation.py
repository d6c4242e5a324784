"""Mutation testing of one module with the test files that own it (issue 47; scores and method: docs/tests.md).

    pip install -e '.[mutation]'                 # mutmut, a dev-only extra (not part of 'test')
    nice -n 19 python .ci/mutation.py integrity  # one module; several names run one after the other
    python .ci/mutation.py --list                # the modules, their files and owning tests
    python .ci/mutation.py --report integrity    # the counts and every survivor of the last run, without running
    nice -n 19 python .ci/mutation.py --recheck recipe  # the last run's survivors again, one fresh process each
    nice -n 19 python .ci/mutation.py --resume tcnn_file  # go on with an interrupted run (the mutants left; the
                                                 # sources and tests as they are now: changed functions run again)
    python .ci/mutation.py tcnn_file --only 'tcnn.files.tcnn_file.x__with_ema__*' --check tests/test_checkpoint_files.py::test_x
                                                 # which of those mutants a test kills (one process, mutmut's switch)
    python .ci/mutation.py --check-later layers  # the survivors against the owning tests the run left out (LATER)
    python .ci/mutation.py layers --only 'tcnn.layers.gpsa.x__forward_path__*' --check-scripted tests/test_gpsa.py
                                                 # mutants of what only TorchScript runs: tests with TorchScript on

mutmut 3 copies the source tree into ``mutants/`` of the folder it runs in and runs pytest there. Each module runs in
its own copy of the repository, ``mutants/<module>/`` (ignored by git), whose ``pyproject.toml`` is the repository's
``[tool.mutmut]`` plus the module (``only_mutate``) and its test files (``pytest_add_cli_args_test_selection``): a
module's run neither sees nor overwrites another's results, and its stats run collects its own tests only. The
copy's ``tests/conftest.py`` puts the copy first on ``sys.path``, so the tests import the mutated ``tcnn``. The
copy's own ``conftest.py`` is ``.ci/mutation_order.py``: it logs each mutant's killer and time to
``mutants/<module>/mutants/mutmut-kills.jsonl`` and, with ``--killers-first``, runs each mutant's tests in another
order (earlier killers of its function first, then the fastest).

mutmut switches a mutant on inside functions that run after the tests started (its trampolines read which mutant is
active), so a mutant in code that runs while ``tcnn`` is imported (the recipe's schema: ``Recipe``'s fields and
``RECIPE_KEYS`` are built by functions at import) is never active and survives whatever the tests check. ``--recheck``
tests every survivor of the last run the plain way: the mutant written into the copy's source (``mutmut apply``),
the module's owning tests as they are now run in a new process (``pytest -x``, at most 15 minutes), the source
restored; a survivor that fails there counts as killed (``recheck.json`` beside the run). It also tells which
survivors the tests written since the run kill, without a new run.

A survivor is killed by a test, or listed as equivalent in docs/tests.md ("Equivalent mutants": one line each, the
mutant's name in backquotes and why it cannot change behaviour); the report counts those lines as equivalent.
"""
import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / 'mutants'
DOC = ROOT / 'docs' / 'tests.md'

# module -> (files mutated, test files that own them, extra pytest arguments)
MODULES: Dict[str, Tuple[List[str], List[str], List[str]]] = {
    'integrity': (['tcnn/files/integrity.py'], ['tests/test_integrity.py'], []),
    'optim': (['tcnn/train/optim.py'], ['tests/test_optim.py'], []),
    # less the resumed training runs of earlier releases (18 s a mutant): test_the_recipe_of_an_earlier_releases_
    # checkpoint_loads reads the same recipes without training
    'recipe': (['tcnn/train/recipe.py'], ['tests/test_recipe.py'], ['-k', 'not run_resumes']),
    # the T-CNN file tests (saving, loading, safetensors, training checkpoints); test_detection.py's test of saving a
    # detector built by hand owns the torchvision detection and segmentation models' part (_dense_source,
    # _check_rebuilds, _settings, _builder_example), which the file tests do not call; test_timm_models.py's refusal
    # of a fused T-CNN owns model_to_dict's message for it
    'tcnn_file': (['tcnn/files/tcnn_file.py'], ['tests/test_file_saving.py', 'tests/test_file_loading.py',
                                              'tests/test_safetensors_files.py', 'tests/test_checkpoint_files.py',
                                              'tests/test_integrity.py',
                                              'tests/test_detection.py::test_save_records_how_to_rebuild',
                                              'tests/test_timm_models.py::test_a_fused_t_cnn_is_refused_by_save_with_'
                                              'the_fix'], []),
    # TorchScript cannot compile mutmut's trampolines (``*args``): the layers run with PYTORCH_JIT=0 (``jit.script``
    # returns the module itself, so the scripting tests compare eager with eager), less the tests that read a
    # TorchScript graph or count dynamo's graph breaks, which mutmut's trampolines add. Less, too, test_grouped.py's
    # whole-model tests (LATER: about 70% of the four files' time, run by every survivor of GPSA's forward); the run's
    # survivors are then checked against them (``--check-later``), so their kills still count
    'layers': (['tcnn/layers/*'], ['tests/test_gpsa.py', 'tests/test_precision.py', 'tests/test_depthwise.py',
                                  'tests/test_grouped.py'],
               ['-k', 'not softplus_without_beta and not without_graph_breaks and not models_are_exact and not '
                      'models_train and not dense_grouped_filters_loads_dense and not name_their_arguments']),
    # test_timm_models.py's fusion tests own fusion.py's RepVGG / MobileOne blocks (timm.utils.reparameterize_model),
    # which test_convert.py does not build: the two smallest models (float32) and the refusal to save a fused model;
    # test_bad_inputs.py owns the refusals of bad arguments (reparameterize's, check_equivalence's; 12 s in all)
    'convert': (['tcnn/convert/*'], ['tests/test_convert.py', 'tests/test_stages.py', 'tests/test_bad_inputs.py', *(
        f'tests/test_timm_models.py::test_timm_reparameterize_model_keeps_the_function_and_the_gpsa_layers[{name}]'
        for name in ('t_repvgg_a0', 't_mobileone_s0')),
        'tests/test_timm_models.py::test_a_fused_t_cnn_is_refused_by_save_with_the_fix'], []),
}
# module -> owning tests left out of mutmut's run for their time, run on its survivors only (``--check-later``)
LATER: Dict[str, List[str]] = {
    'layers': ['tests/test_grouped.py::test_grouped_and_depthwise_models_are_exact',
               'tests/test_grouped.py::test_grouped_and_depthwise_models_train',
               'tests/test_grouped.py::test_file_with_dense_grouped_filters_loads_dense'],
}
# environment of every run: offline (no test downloads), TorchScript off (see 'layers')
ENV = {'HF_HUB_OFFLINE': '1', 'PYTORCH_JIT': '0'}

# mutmut's exit codes -> status (mutmut.stats.status_by_exit_code)
STATUS = {1: 'killed', 3: 'killed', 0: 'survived', 5: 'no tests', 33: 'no tests', 34: 'skipped', 36: 'timeout',
          -24: 'timeout', 24: 'timeout', 152: 'timeout', 255: 'timeout', 37: 'caught by type check', None: 'not run'}
COPIED = ('tcnn', 'tests', 'benchmarks', 'recipes', 'setup.cfg', 'pyproject.toml', 'README.md', 'docs', '.ci')


# module -> the folder of its copy under mutants/ (--folder; default the module's name)
FOLDERS: Dict[str, str] = {}


def folder(module: str) -> Path:
    """The copy of the repository that ``module``'s runs use."""
    return WORK / FOLDERS.get(module, module)


def equivalent_mutants() -> Dict[str, str]:
    """The mutants docs/tests.md lists as equivalent (``| `name` | why |`` rows), with the reason."""
    if not DOC.exists():
        return {}
    rows = re.findall(r'^\| `(tcnn\.[^`]+__mutmut_\d+)` \| (.+?) \|$', DOC.read_text(encoding='utf-8'), re.M)
    return dict(rows)


def prepare(module: str) -> Path:
    """A fresh copy of the repository for ``module`` (the previous one's results are dropped), its config set, and
    ``.ci/mutation_order.py`` as its ``conftest.py`` (each mutant's log, and the order of its tests)."""
    work = folder(module)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns('__pycache__', '*.pyc', '.pytest_cache')
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, work / name, symlinks=True, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, work / name)
    configure(module)
    return work


def configure(module: str) -> None:
    """``module``'s copy set up for mutmut (``mutmut_config``), and ``.ci/mutation_order.py`` as its
    ``conftest.py``."""
    shutil.copy(ROOT / '.ci' / 'mutation_order.py', folder(module) / 'conftest.py')
    (folder(module) / 'pyproject.toml').write_text(mutmut_config(module), encoding='utf-8')


def mutmut_config(module: str) -> str:
    """The copy's ``pyproject.toml``: the repository's, its ``[tool.mutmut]`` plus the module's files, owning tests
    and test arguments (``MODULES``) and the copy's ``conftest.py``."""
    files, tests, pytest_args = MODULES[module]
    config = (ROOT / 'pyproject.toml').read_text(encoding='utf-8')
    extra = f'only_mutate = {json.dumps(files)}\npytest_add_cli_args_test_selection = {json.dumps(tests)}\n'
    config = config.replace('[tool.mutmut]\n', '[tool.mutmut]\n' + extra, 1)
    shared = re.search(r'^pytest_add_cli_args = (.*)$', config, re.M)
    args = json.loads(shared.group(1)) + pytest_args
    config = config.replace(shared.group(0), f'pytest_add_cli_args = {json.dumps(args)}')
    also = re.search(r'^also_copy = (.*)$', config, re.M)
    return config.replace(also.group(0), f'also_copy = {json.dumps(json.loads(also.group(1)) + ["conftest.py"])}')


def refresh(module: str) -> Path:
    """``module``'s copy with the repository's sources, tests and ``.ci/mutation_order.py`` as they are now, its
    results kept: mutmut rebuilds the mutants of a source file newer than its mutated copy and forgets the results of
    the functions whose code changed only (their mutants run again), and traces the tests new to it."""
    work = folder(module)
    if not (work / 'mutants').is_dir():
        raise SystemExit(f'{module}: no run to resume in {work}; run it first (without --resume)')
    # the run's config stays: mutmut drops every result when its tests or their arguments change (its fingerprint)
    if (work / 'pyproject.toml').read_text(encoding='utf-8') != mutmut_config(module):
        print(f'{module}: the run keeps the owning tests and arguments it started with, not those MODULES lists now '
              f'(mutmut would drop every result); a fresh run (without --resume) takes them, --check runs tests on '
              f'its survivors', file=sys.stderr)
    pairs = [(ROOT / '.ci' / 'mutation_order.py', work / 'conftest.py')]
    for top in ('tcnn', 'tests'):
        pairs += [(src, work / src.relative_to(ROOT)) for src in (ROOT / top).rglob('*')
                  if src.is_file() and '__pycache__' not in src.parts and src.suffix != '.pyc']
    for src, dst in pairs:
        if not dst.exists() or dst.read_bytes() != src.read_bytes():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)  # not copy2: a fresh mtime, newer than the mutants built from the old file
    return work


def run(module: str, max_children: int, only: Sequence[str] = (), killers_first: bool = False,
        resume: bool = False) -> float:
    """Run mutmut on ``module`` in its copy (``only``: mutant name patterns, e.g. ``tcnn.layers.positional.*``, to
    measure a sample; ``killers_first``: each mutant's tests in ``.ci/mutation_order.py``'s order, not mutmut's);
    returns the wall time (s). Its output goes to ``mutmut.log`` there. ``resume``: go on with an interrupted run in
    its copy, refreshed (``refresh``): mutmut tests only the mutants without a result."""
    work = refresh(module) if resume else prepare(module)
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


def mutmut(work: Path, *args: str, **kwargs) -> int:
    """mutmut's command line in ``work`` (its cli from its module, not ``python -m mutmut``, which it warns re-executes
    ``mutmut.__main__``)."""
    kwargs.setdefault('env', dict(os.environ, **ENV))
    return subprocess.call([sys.executable, '-c', 'import sys; from mutmut.__main__ import cli; sys.exit(cli())',
                            *args], cwd=work, **kwargs)


def recheck(module: str, only: Sequence[str] = ()) -> Dict[str, str]:
    """Every survivor (and 'no tests' mutant) of ``module``'s last run once more, the plain way (module docstring):
    ``{mutant: 'killed' | 'survived' | 'timeout'}``, also written to ``recheck.json`` beside the run (merged with
    an earlier recheck's). ``only``: the survivors whose names match these patterns (the others keep an earlier
    recheck's outcome, if any)."""
    _, tests, pytest_args = MODULES[module]
    return _record(module, _applied(module, only, [*tests, *pytest_args], ENV, 'killed'), fresh=not only)


def check_scripted(module: str, only: Sequence[str], tests: Sequence[str]) -> Dict[str, str]:
    """Which survivors of ``module``'s last run matching ``only`` the test node IDs ``tests`` kill with TorchScript on
    (``PYTORCH_JIT=1``): mutants of the code that only TorchScript runs (the scripted forward's branch), which a run
    cannot test, as TorchScript compiles no trampoline. Each mutant is applied as ``--recheck`` applies it (no
    trampoline); the ones killed count as ``'killed (TorchScript on)'`` (``recheck.json``, merged)."""
    found = _applied(module, only, tests, dict(ENV, PYTORCH_JIT='1'), 'killed (TorchScript on)')
    _record(module, {name: verdict for name, verdict in found.items() if verdict != 'survived'})
    return found


def _record(module: str, verdicts: Dict[str, str], fresh: bool = False) -> Dict[str, str]:
    """``verdicts`` merged into the verdicts kept beside ``module``'s run (``recheck.json``; ``fresh``: in place of
    them), which ``results`` reads; returns them all."""
    path = folder(module) / 'recheck.json'
    kept = json.loads(path.read_text()) if path.exists() and not fresh else {}
    kept.update(verdicts)
    path.write_text(json.dumps(kept, indent=1) + '\n')
    return kept


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


_CHECK = """
import json, os, sys
import pytest
names, tests = json.loads(sys.argv[1]), sys.argv[2:]
os.environ['MUTANT_UNDER_TEST'] = ''
if pytest.main(['-q', '-p', 'no:cacheprovider', *tests]):
    sys.exit('the tests fail without a mutant')
outcome = {}
for name in names:
    os.environ['MUTANT_UNDER_TEST'] = name
    outcome[name] = 'killed' if pytest.main(['-x', '-q', '-p', 'no:cacheprovider', *tests]) else 'survived'
    print(f'{outcome[name]} {name}', file=sys.stderr, flush=True)
print(json.dumps(outcome))
"""


def check(module: str, patterns: Sequence[str], tests: Sequence[str]) -> Dict[str, str]:
    """Which of the last run's mutants matching ``patterns`` the test node IDs ``tests`` kill, as they are now (e.g.
    the tests written for its survivors): ``{mutant: 'killed' | 'survived'}``. One process for all of them, in a copy
    of the run's mutated tree: each mutant switched on as mutmut does (``MUTANT_UNDER_TEST``), the repository's tests
    run against it (``pytest -x``)."""
    run_tree, work = folder(module) / 'mutants', folder(module) / 'check'
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(run_tree, work, ignore=shutil.ignore_patterns('__pycache__', 'tests', 'conftest.py', '*.jsonl'))
    shutil.copytree(ROOT / 'tests', work / 'tests', ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
    names = sorted(name for name in results(module, rechecked=False)
                   if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns))
    out = subprocess.run([sys.executable, '-c', _CHECK, json.dumps(names), *tests], cwd=work, stdout=subprocess.PIPE,
                         text=True, env=dict(os.environ, **ENV, PYTHONPATH=str(work)))
    if out.returncode:
        raise SystemExit(f'{module}: the check did not run (exit {out.returncode}); its tests: {" ".join(tests)}')
    return json.loads(out.stdout.strip().splitlines()[-1])


def results(module: str, rechecked: bool = True) -> Dict[str, Tuple[str, float]]:
    """``{mutant: (status, seconds)}`` of the last run of ``module`` (mutmut's ``.meta`` files); survivors listed as
    equivalent in docs/tests.md count as ``equivalent``, those ``--recheck`` killed as ``killed (fresh process)``."""
    equivalent = equivalent_mutants()
    again = folder(module) / 'recheck.json'
    again = json.loads(again.read_text()) if rechecked and again.exists() else {}
    out = {}
    for meta in sorted((folder(module) / 'mutants').rglob('*.py.meta')):
        data = json.loads(meta.read_text(encoding='utf-8'))
        durations = data.get('durations_by_key', {})
        for name, code in data['exit_code_by_key'].items():
            status = STATUS.get(code, 'suspicious')
            if status in ('survived', 'no tests') and again.get(name) == 'killed':
                status = 'killed (fresh process)'
            elif status in ('survived', 'no tests') and again.get(name) == 'killed (TorchScript on)':
                status = 'killed (TorchScript on)'
            elif status in ('survived', 'no tests', 'timeout') and name in equivalent:
                status = 'equivalent'  # a timeout too: an equivalent one that ran past mutmut's limit, machine busy
            out[name] = (status, durations.get(name, 0.0))
    return out


def report(module: str) -> Dict[str, object]:
    """Counts by status, the run's wall time and the survivors of ``module``'s last run."""
    res = results(module)
    counts = Counter(status for status, _ in res.values())
    wall, again = folder(module) / 'wall_time_s', folder(module) / 'recheck_time_s'
    return {'module': module, 'files': MODULES[module][0], 'tests': MODULES[module][1], 'mutants': len(res),
            'counts': dict(counts), 'wall_time_s': float(wall.read_text()) if wall.exists() else None,
            'recheck_time_s': float(again.read_text()) if again.exists() else None,
            'survivors': sorted(n for n, (s, _) in res.items() if s in ('survived', 'no tests', 'suspicious',
                                                                           'timeout'))}


def main(argv: Sequence[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('modules', nargs='*', help=f'of {", ".join(MODULES)}')
    parser.add_argument('--list', action='store_true', help='the modules, their files and owning tests')
    parser.add_argument('--report', action='store_true', help="the last run's counts and survivors, without running")
    parser.add_argument('--recheck', action='store_true', help="the last run's survivors, one fresh process each")
    parser.add_argument('--only', nargs='+', default=(), metavar='PATTERN',
                        help='run (or --recheck) only these mutants (name patterns: a sample, to measure the time per '
                             'mutant; the survivors that new tests should kill)')
    parser.add_argument('--check', nargs='+', metavar='TEST',
                        help='which mutants of --only (patterns) these test node IDs kill, in one process (the tests '
                             'as they are now against the last run\'s mutants: to check the tests written for '
                             'survivors)')
    parser.add_argument('--check-scripted', nargs='+', metavar='TEST',
                        help='which survivors of --only (patterns) these test node IDs kill with TorchScript on, each '
                             'applied to the sources as --recheck does (mutants of the code only TorchScript runs)')
    parser.add_argument('--check-later', action='store_true',
                        help="the last run's survivors against the owning tests its run left out for their time "
                             '(LATER)')
    parser.add_argument('--max-children', type=int, default=1, help='mutants tested at once (default 1)')
    parser.add_argument('--folder', metavar='NAME',
                        help="the copy's folder under mutants/ (default: the module's name): a second copy, e.g. to "
                             'time a sample in both orders at once')
    parser.add_argument('--resume', action='store_true',
                        help="go on with an interrupted run: the mutants without a result, with the repository's "
                             'sources and tests as they are now (those of functions changed since run again)')
    parser.add_argument('--killers-first', action='store_true',
                        help="each mutant's tests in .ci/mutation_order.py's order (earlier killers of its function "
                             "first, then the fastest), not mutmut's")
    args = parser.parse_args(argv)
    if args.list:
        for name, (files, tests, pytest_args) in MODULES.items():
            print(f'{name}: {" ".join(files)} <- {" ".join(tests + pytest_args)}')
        return 0
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown or not args.modules:
        parser.error(f'name modules of {", ".join(MODULES)}' + (f' (unknown: {", ".join(unknown)})' if unknown else ''))
    if args.folder:
        FOLDERS.update({module: args.folder for module in args.modules})
    for module in args.modules:
        if args.check_later:
            if module not in LATER:
                parser.error(f'{module} runs all its owning tests: nothing was left for later')
            args.check = LATER[module]
            args.only = report(module)['survivors']
            if not args.only:
                print(f'{module}: no survivors to check')
                continue
        if args.check_scripted:
            print(json.dumps(check_scripted(module, args.only, args.check_scripted), indent=1))
            continue
        if args.check:
            outcome = check(module, args.only or ['*'], args.check)
            # the run's survivors they kill count as killed by a test written since, as --recheck's (recheck.json)
            survivors = {n for n, (status, _) in results(module, rechecked=False).items()
                         if status in ('survived', 'no tests', 'equivalent')}
            _record(module, {n: 'killed' for n, verdict in outcome.items() if verdict == 'killed' and n in survivors})
            print(json.dumps(outcome, indent=1))
            continue
        if args.recheck:
            start = time.monotonic()
            recheck(module, args.only)
            (folder(module) / 'recheck_time_s').write_text(f'{time.monotonic() - start:.0f}\n')
        elif not args.report:
            run(module, args.max_children, args.only, args.killers_first, args.resume)
        print(json.dumps(report(module), indent=1))
    return 0


if __name__ == '__main__':
    sys.exit(main())
