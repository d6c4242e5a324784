"""The package's layout: its concepts depend on each other one way, and no modules import each other in a circle.

README's Layout section states the order below; this test reads every ``import`` of ``tcnn/`` (at module level, in
functions, and under ``TYPE_CHECKING``: each is a dependency a reader must follow) and fails on an import from a
concept to a later one (a back-import) or on an import cycle between modules, naming the file and line to change.
Modules that ``importlib`` loads by name at run time (the CLI's command table, ``tcnn``'s PEP 562 attributes, the
registration hook) are not imports of this kind: they are how the entry points find what they run.
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
    ('deployment', ('tcnn.export', 'tcnn.flops')),
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
