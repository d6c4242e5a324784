"""The copy of the repository that each module's runs use, and mutmut's command line there.

mutmut 3 copies the source tree into ``mutants/`` of the folder it runs in and runs pytest there. Each module runs in
its own copy of the repository, ``mutants/<module>/`` (ignored by git), whose ``pyproject.toml`` is the repository's
``[tool.mutmut]`` plus the module (``only_mutate``) and its test files (``pytest_add_cli_args_test_selection``): a
module's run neither sees nor overwrites another's results, and its stats run collects its own tests only. The
copy's ``tests/conftest.py`` puts the copy first on ``sys.path``, so the tests import the mutated ``tcnn``. The
copy's own ``conftest.py`` is ``copy_conftest.py`` (beside this file): it logs each mutant's killer and time to
``mutants/<module>/mutants/mutmut-kills.jsonl`` and, with ``--killers-first``, runs each mutant's tests in another
order.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

from .modules import ENV, MODULES

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / 'mutants'
CONFTEST = Path(__file__).with_name('copy_conftest.py')
COPIED = ('tcnn', 'tests', 'benchmarks', 'recipes', 'setup.cfg', 'pyproject.toml', 'README.md', 'docs', 'tools')

# module -> the folder of its copy under mutants/ (--folder; default the module's name)
FOLDERS: Dict[str, str] = {}


def folder(module: str) -> Path:
    """The copy of the repository that ``module``'s runs use."""
    return WORK / FOLDERS.get(module, module)


def has_run(module: str) -> bool:
    """Whether ``module``'s copy holds a run's mutants (a run started, finished or not)."""
    return (folder(module) / 'mutants').is_dir()


def prepare(module: str) -> Path:
    """A fresh copy of the repository for ``module`` (the previous one's results are dropped), its config set, and
    ``copy_conftest.py`` as its ``conftest.py`` (each mutant's log, and the order of its tests)."""
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
    """``module``'s copy set up for mutmut (``mutmut_config``), and ``copy_conftest.py`` as its ``conftest.py``."""
    shutil.copy(CONFTEST, folder(module) / 'conftest.py')
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
    """``module``'s copy with the repository's sources, tests and ``copy_conftest.py`` as they are now, its results
    kept: mutmut rebuilds the mutants of a source file newer than its mutated copy and forgets the results of the
    functions whose code changed only (their mutants run again), and traces the tests new to it."""
    work = folder(module)
    if not has_run(module):
        raise SystemExit(f'{module}: no run to resume in {work}; start one with `python tools/mutation.py run '
                         f'{module}`')
    # the run's config stays: mutmut drops every result when its tests or their arguments change (its fingerprint)
    if (work / 'pyproject.toml').read_text(encoding='utf-8') != mutmut_config(module):
        print(f'{module}: the run keeps the owning tests and arguments it started with, not those MODULES lists now '
              f'(mutmut would drop every result); a fresh run (`run`, not `resume`) takes them, `check` runs tests on '
              f'its survivors', file=sys.stderr)
    pairs: List[Tuple[Path, Path]] = [(CONFTEST, work / 'conftest.py')]
    for top in ('tcnn', 'tests'):
        pairs += [(src, work / src.relative_to(ROOT)) for src in (ROOT / top).rglob('*')
                  if src.is_file() and '__pycache__' not in src.parts and src.suffix != '.pyc']
    for src, dst in pairs:
        if not dst.exists() or dst.read_bytes() != src.read_bytes():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)  # not copy2: a fresh mtime, newer than the mutants built from the old file
    return work


def mutmut(work: Path, *args: str, **kwargs: Any) -> int:
    """mutmut's command line in ``work`` (its cli from its module, not ``python -m mutmut``, which it warns re-executes
    ``mutmut.__main__``); returns its exit status.

    Args:
        work: The copy it runs in.
        *args: mutmut's arguments (``run``, ``apply NAME``).
        **kwargs: ``subprocess.call``'s (its output, its environment: by default this one plus ``ENV``).
    """
    kwargs.setdefault('env', dict(os.environ, **ENV))
    return subprocess.call([sys.executable, '-c', 'import sys; from mutmut.__main__ import cli; sys.exit(cli())',
                            *args], cwd=work, **kwargs)
