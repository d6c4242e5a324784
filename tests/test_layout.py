"""The package's layout: its concepts depend on each other one way, and no modules import each other in a circle.

README's Layout section states the order below; this test reads every ``import`` of ``tcnn/`` (at module level, in
functions, and under ``TYPE_CHECKING``: each is a dependency a reader must follow) and fails on an import from a
concept to a later one (a back-import) or on an import cycle between modules, naming the file and line to change.
Modules that ``importlib`` loads by name at run time (the CLI's command table, ``tcnn``'s PEP 562 attributes, the
registration hook) are not imports of this kind: they are how the entry points find what they run.

The test files' own layout is checked here too: the helpers they share (``helpers.py``, the fixtures of
``conftest.py``) are defined once, with one argument order, and not copied into a test file under any name.
"""
import ast
import os
from typing import Dict, List, Set, Tuple

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'tcnn')

# Lowest first: a module may import its own concept and the concepts above it in this list, never one below.
ORDER: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ('foundations', ('tcnn', 'tcnn.errors', 'tcnn.version', 'tcnn.paths', 'tcnn.atomic', 'tcnn.allocator',
                     'tcnn.compat', 'tcnn._registration', 'tcnn.gpsa_parameters')),
    ('the layer', ('tcnn.layers',)),
    ('conversion', ('tcnn.convert',)),
    ('data', ('tcnn.data',)),
    ('files and weights', ('tcnn.files',)),
    ('timm models', ('tcnn.models',)),
    ('deployment', ('tcnn.export', 'tcnn.flops', 'tcnn.pruning')),
    ('analysis', ('tcnn.analysis',)),
    ('runtime', ('tcnn.runtime',)),
    ('training', ('tcnn.train',)),
    ('evaluation', ('tcnn.evaluation',)),
    ('command line', ('tcnn.commands', 'tcnn.cli', 'tcnn.__main__')),
    ('demo', ('tcnn.demo',)),
    ("timm's scripts", ('tcnn.timm_script',)),
)

Edge = Tuple[str, str, str, int]  # importer, imported module, file, line


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(ROOT))[:-len('.py')].split(os.sep)
    return '.'.join(rel[:-1] if rel[-1] == '__init__' else rel)


def _modules() -> Dict[str, str]:
    """Every module of the package: name -> file."""
    found = {}
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith('.py'):
                found[_module_name(os.path.join(folder, f))] = os.path.join(folder, f)
    return found


def _resolve(name: str, modules: Dict[str, str]) -> str:
    """The module that ``name`` (a module, or a name defined in one) lives in."""
    while name not in modules and '.' in name:
        name = name.rsplit('.', 1)[0]
    return name


def imports_of(path: str, module: str, modules: Dict[str, str]) -> List[Edge]:
    """The tcnn modules that ``path`` imports (``from .x import y`` is module ``.x.y`` if that is a module)."""
    package = module if path.endswith('__init__.py') else module.rsplit('.', 1)[0]
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
    edges = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split('.')[:len(package.split('.')) - node.level + 1]
                target = '.'.join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ''
            if target.startswith('tcnn') and target not in modules:
                raise AssertionError(f'{path}:{node.lineno}: imports from {target}, which is not a module of tcnn')
            names = [f'{target}.{alias.name}' for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            if name == 'tcnn' or name.startswith('tcnn.'):
                imported = _resolve(name, modules)
                if imported != module:
                    edges.append((module, imported, path, node.lineno))
    return edges


def all_imports() -> List[Edge]:
    modules = _modules()
    return [edge for module, path in sorted(modules.items()) for edge in imports_of(path, module, modules)]


def concept_rank(module: str) -> Tuple[int, str]:
    best = None
    for rank, (concept, prefixes) in enumerate(ORDER):
        for prefix in prefixes:
            if module == prefix or (prefix != 'tcnn' and module.startswith(prefix + '.')):
                if best is None or len(prefix) > best[2]:
                    best = (rank, concept, len(prefix))
    if best is None:
        raise AssertionError(f'{module} belongs to no concept of ORDER: add it there and to README\'s Layout table')
    return best[0], best[1]


def back_imports(edges: List[Edge]) -> List[str]:
    found = []
    for importer, imported, path, line in edges:
        (low, low_name), (high, high_name) = concept_rank(importer), concept_rank(imported)
        if high > low:
            found.append(f'{os.path.relpath(path, os.path.dirname(ROOT))}:{line}: {importer} ({low_name}) imports '
                         f'{imported} ({high_name}), a later concept')
    return found


def cycles(edges: List[Edge]) -> List[List[str]]:
    """The import cycles between modules (each as the path that closes it)."""
    graph: Dict[str, Set[str]] = {}
    for importer, imported, _, _ in edges:
        graph.setdefault(importer, set()).add(imported)
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []
    found = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_every_module_has_a_concept():
    for module in _modules():
        concept_rank(module)


def test_concepts_depend_one_way():
    problems = back_imports(all_imports())
    assert not problems, 'back-imports (see README, Layout):\n' + '\n'.join(problems)


def test_no_import_cycle_between_modules():
    found = cycles(all_imports())
    assert not found, 'import cycles:\n' + '\n'.join(' -> '.join(c) for c in found)


def test_the_checks_see_function_level_and_type_checking_imports(tmp_path):
    # the two checks catch what they promise: a late import inside a function, and a cycle kept for type hints only
    modules = {'tcnn.layers.gpsa': '', 'tcnn.train': '', 'tcnn.train.trainer': '', 'tcnn.train.report': ''}
    late = tmp_path / 'gpsa.py'
    late.write_text('def f():\n    from ..train.trainer import Trainer\n')
    edges = imports_of(str(late), 'tcnn.layers.gpsa', modules)
    assert edges == [('tcnn.layers.gpsa', 'tcnn.train.trainer', str(late), 2)]
    assert back_imports(edges) and 'tcnn.layers.gpsa (the layer) imports tcnn.train.trainer' in back_imports(edges)[0]
    report = tmp_path / 'report.py'
    report.write_text('from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .trainer import Trainer\n')
    trainer = tmp_path / 'trainer.py'
    trainer.write_text('from . import report\n')
    edges = imports_of(str(report), 'tcnn.train.report', modules) + imports_of(str(trainer), 'tcnn.train.trainer',
                                                                                modules)
    assert cycles(edges) == [['tcnn.train.report', 'tcnn.train.trainer', 'tcnn.train.report']]


def layout_table() -> List[Tuple[str, List[str]]]:
    """README's Layout table as (concept, the paths its module cell names), a row each; a bare name (``content.py``)
    is in the folder of the path before it in the cell."""
    with open(os.path.join(os.path.dirname(ROOT), 'README.md'), encoding='utf-8') as f:
        section = f.read().split('\n## Layout\n', 1)[1].split('\n## ', 1)[0]
    rows, concept = [], None
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        if not line.startswith('|') or len(cells) < 3 or cells[0] == 'concept' or (cells[0] and set(cells[0]) <= {'-'}):
            continue
        concept = cells[0] or concept
        paths, folder = [], ''
        for token in cells[1].split('`')[1::2]:
            path = token if '/' in token else folder + token
            folder = path if path.endswith('/') else path.rsplit('/', 1)[0] + '/'
            paths.append(path)
        rows.append((concept, paths))
    return rows


def test_readme_layout_matches_the_tree():
    repo = os.path.dirname(ROOT)
    rows = layout_table()
    assert [c for c, _ in rows if c in dict(ORDER)] and {c for c, _ in rows} >= {c for c, _ in ORDER}, \
        'README\'s Layout table must have a row for every concept of ORDER'
    named = set()
    for concept, paths in rows:
        for path in paths:
            assert os.path.exists(os.path.join(repo, path)), f'README\'s Layout names {path}, which does not exist'
            named.add(path)
            if path.startswith('tcnn/') and path.endswith('.py'):
                module = _module_name(os.path.join(repo, path))
                assert concept_rank(module)[1] == concept, f'README lists {path} under {concept!r}, ORDER under ' \
                                                          f'{concept_rank(module)[1]!r}'
    for module, path in _modules().items():
        rel = os.path.relpath(path, repo).replace(os.sep, '/')
        folders = [rel.rsplit('/', k)[0] + '/' for k in range(1, rel.count('/') + 1)]
        if os.path.basename(rel) == '__init__.py' and module != 'tcnn':
            continue  # a package's own docstring: its folder's modules are named
        assert rel in named or any(f in named for f in folders[:-1] if f != 'tcnn/'), \
            f'{rel} is missing from README\'s Layout table'


# ----------------------------------------------------------------------------- the tests' helpers, defined once

TESTS = os.path.dirname(os.path.abspath(__file__))
# What every test file takes from tests/helpers.py and tests/conftest.py, and where each is defined
SHARED_HELPERS = {'rel_err': 'helpers.py', 'images': 'helpers.py', 'script': 'helpers.py', 'data_dir': 'conftest.py',
                  'one_thread': 'conftest.py'}
# The names their copies had: (the shared helper, what the copy was)
RETIRED_NAMES = {'_rel_err': 'rel_err', '_rel': 'rel_err', '_x': 'images'}


def _is_call_of(node: ast.AST, method: str) -> bool:
    """``node`` is ``<something>.method()``, without arguments."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method
            and not node.args and not node.keywords)


def _abs_max(node: ast.AST) -> bool:
    """``node`` is ``X.abs().max()``."""
    return _is_call_of(node, 'max') and _is_call_of(node.func.value, 'abs')


def _calls(node: ast.AST, dotted: str) -> bool:
    """``node`` calls ``dotted`` (``'torch.set_num_threads'``) somewhere."""
    return any(isinstance(n, ast.Call) and ast.unparse(n.func) == dotted for n in ast.walk(node))


def _is_fixture(node: ast.FunctionDef) -> bool:
    return any('fixture' in ast.unparse(d) for d in node.decorator_list)


def _returns_seeded_randn(node: ast.FunctionDef) -> bool:
    """``node`` returns ``torch.randn(..., generator=...)``."""
    return any(isinstance(n, ast.Return) and isinstance(n.value, ast.Call) and
               ast.unparse(n.value.func) == 'torch.randn' and any(k.arg == 'generator' for k in n.value.keywords)
               for n in ast.walk(node))


def helper_copies(path: str) -> List[str]:
    """Where the test file ``path`` defines a shared helper again, under its name, a retired name or another one
    (what each copy is made of: a relative error ``X.abs().max() / Y.abs().max()``, a fixture that sets the thread
    count, a function that returns seeded ``torch.randn`` images, a ``torch.jit.script`` call outside a
    ``pytest.raises`` block), in line order."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
    found: List[Tuple[int, str]] = []
    expected_to_fail = {id(n) for w in ast.walk(tree) if isinstance(w, ast.With) and
                        any('pytest.raises' in ast.unparse(item.context_expr) for item in w.items)
                        for statement in w.body for n in ast.walk(statement)}
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _abs_max(node.left) and \
                _abs_max(node.right):
            found.append((node.lineno, 'computes a relative error: use helpers.rel_err(out, ref)'))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == 'torch.jit.script' and \
                id(node) not in expected_to_fail:
            found.append((node.lineno, 'calls torch.jit.script: use helpers.script (a stale builtin id fails it)'))
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        name = node.name
        if name in SHARED_HELPERS:
            found.append((node.lineno, f'defines {name} again: it is in tests/{SHARED_HELPERS[name]}'))
        elif name in RETIRED_NAMES:
            found.append((node.lineno, f'defines {name}, a copy of {RETIRED_NAMES[name]}: use that'))
        elif _is_fixture(node) and _calls(node, 'torch.set_num_threads'):
            found.append((node.lineno, f"the fixture {name} sets the thread count: use "
                                       "pytest.mark.usefixtures('one_thread')"))
        elif _returns_seeded_randn(node):
            found.append((node.lineno, f'{name} returns seeded random images: use helpers.images'))
    where = os.path.relpath(path, os.path.dirname(TESTS))
    return [f'{where}:{line}: {what}' for line, what in sorted(found)]


def test_the_test_helpers_are_defined_once():
    paths = [os.path.join(folder, f) for folder, _, files in os.walk(TESTS) for f in files
             if f.endswith('.py') and os.path.join(folder, f) not in (os.path.join(TESTS, 'helpers.py'),
                                                                       os.path.join(TESTS, 'conftest.py'))]
    found = [line for path in sorted(paths) for line in helper_copies(path)]
    assert not found, 'test helpers defined again (one definition each, one argument order):\n' + '\n'.join(found)


def test_the_helper_check_sees_copies_under_other_names(tmp_path):
    copies = tmp_path / 'test_copies.py'
    copies.write_text('\n'.join([
        'import pytest', 'import torch',
        'def _relative(ref, out):', '    return ((out - ref).abs().max() / ref.abs().max()).item()',
        '@pytest.fixture(scope="module", autouse=True)', 'def single_thread():', '    torch.set_num_threads(1)',
        '    yield',
        'def _inputs(batch):', '    return torch.randn(batch, 3, 8, 8, generator=torch.Generator().manual_seed(0))',
        '@pytest.fixture', 'def data_dir(tmp_path):', '    return str(tmp_path)',
        'def _x():', '    return torch.zeros(1)', 'scripted = torch.jit.script(torch.nn.ReLU())',
        'with pytest.raises(RuntimeError):', '    torch.jit.script(torch.nn.ReLU())', '']))
    lines = [line.split(': ', 1)[1] for line in helper_copies(str(copies))]
    assert lines == ['computes a relative error: use helpers.rel_err(out, ref)',
                     "the fixture single_thread sets the thread count: use pytest.mark.usefixtures('one_thread')",
                     '_inputs returns seeded random images: use helpers.images',
                     'defines data_dir again: it is in tests/conftest.py', 'defines _x, a copy of images: use that',
                     'calls torch.jit.script: use helpers.script (a stale builtin id fails it)']
