"""The campaign's results kept in git, so that a module's run goes on in a later session instead of starting again.

A module's copy (``mutants/MODULE/``) does not outlive the machine it ran on, and a module of 3,000 mutants takes
longer than a session on 2 cores. ``save`` writes what the copy knows into ``state/MODULE.json`` (beside this file):
for each mutated file, mutmut's hash of each function and the exit code and seconds of each mutant that ran, and the
verdicts of the rechecks and checks since (``recheck.json``), each with the hash of its function when it was given.
``restore`` puts the results back into a fresh copy as mutmut's ``.meta`` files before its run: mutmut keeps the
result of a mutant whose function's hash is unchanged and runs again the mutants of the functions changed since (its
own rule for an interrupted run, ``create_mutants_for_file``). A recheck's verdict counts only while its function's
hash is the one it was given for (``verdicts.results``).
"""
import json
import os
from pathlib import Path
from typing import Dict, List, Optional

from .copies import folder

STATE = Path(__file__).with_name('state')
SAVED_RECHECKS = 'saved_rechecks.json'  # in the copy: {mutant: [verdict, its function's hash then]}
NO_TESTS = (5, 33)  # mutmut's exit codes of a mutant whose function no owning test called


def path(module: str) -> Path:
    """The file that keeps ``module``'s results."""
    return STATE / f'{module}.json'


def function_of(mutant: str) -> str:
    """The key of ``mutant``'s function in mutmut's ``hash_by_function_name`` (as ``create_mutants_for_file`` finds
    it): ``tcnn.data.batch_misc.xǁBatchErasingǁ__call____mutmut_3`` -> ``xǁBatchErasingǁ__call__``."""
    return mutant.partition('__mutmut_')[0].rpartition('.')[2]


def _metas(module: str) -> Dict[str, dict]:
    """``{source path: mutmut's .meta data}`` of ``module``'s copy."""
    mutants = folder(module) / 'mutants'
    return {meta.relative_to(mutants).as_posix()[:-len('.meta')]: json.loads(meta.read_text(encoding='utf-8'))
            for meta in sorted(mutants.rglob('*.py.meta'))}


def hashes(module: str, metas: Optional[Dict[str, dict]] = None) -> Dict[str, str]:
    """``{mutant: its function's hash}`` of every mutant in ``module``'s copy, as mutmut last generated them (from
    ``metas``, its ``.meta`` files already read, if given)."""
    return {name: data.get('hash_by_function_name', {}).get(function_of(name), '')
            for data in (metas or _metas(module)).values() for name in data['exit_code_by_key']}


def save(module: str) -> Path:
    """``module``'s results in its copy written to ``path(module)`` (atomically); returns the path.

    A result whose function has no hash (mutmut could not parse its file) is not kept: nothing could tell whether
    it still holds.
    """
    files, metas = {}, _metas(module)
    for source, data in metas.items():
        known = data.get('hash_by_function_name', {})
        done = {name: code for name, code in data['exit_code_by_key'].items()
                if code is not None and function_of(name) in known}
        durations = data.get('durations_by_key', {})
        files[source] = {'hashes': dict(sorted(known.items())), 'exit_codes': dict(sorted(done.items())),
                         'durations': {name: round(durations[name], 2) for name in sorted(done) if name in durations}}
    now = hashes(module, metas)
    rechecks = {name: [verdict, given] for name, (verdict, given) in _saved_rechecks(module).items()
                if now.get(name) == given}
    kept = folder(module) / 'recheck.json'
    for name, verdict in (json.loads(kept.read_text()) if kept.exists() else {}).items():
        if now.get(name):
            rechecks[name] = [verdict, now[name]]
    out = path(module)
    out.parent.mkdir(exist_ok=True)
    temp = out.with_suffix('.json.tmp')
    # a line per function and per mutant: the diff of a saved state shows what a session ran
    temp.write_text(json.dumps({'files': files, 'rechecks': dict(sorted(rechecks.items()))}, indent=1,
                               ensure_ascii=False) + '\n', encoding='utf-8')
    os.replace(temp, out)
    return out


def restore(module: str) -> Optional[int]:
    """The saved results of ``module`` put into its fresh copy, before mutmut generates its mutants; returns how many
    mutant results were restored (None: nothing saved)."""
    if not path(module).exists():
        return None
    saved = json.loads(path(module).read_text(encoding='utf-8'))
    mutants = folder(module) / 'mutants'
    count = 0
    for source, data in saved['files'].items():
        # a "no tests" result is not kept: the module's owning tests may reach its function since (and it costs no
        # time to find again)
        codes = {name: code for name, code in data['exit_codes'].items() if code not in NO_TESTS}
        meta = mutants / f'{source}.meta'
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps({'exit_code_by_key': codes, 'hash_by_function_name': data['hashes'],
                                    'type_check_error_by_key': {}, 'durations_by_key': data['durations'],
                                    'estimated_durations_by_key': {}}, indent=1), encoding='utf-8')
        count += len(codes)
    (folder(module) / SAVED_RECHECKS).write_text(json.dumps(saved['rechecks'], indent=1) + '\n', encoding='utf-8')
    return count


def _saved_rechecks(module: str) -> Dict[str, List[str]]:
    """The rechecks' verdicts restored into ``module``'s copy: ``{mutant: [verdict, its function's hash then]}``."""
    saved = folder(module) / SAVED_RECHECKS
    return json.loads(saved.read_text(encoding='utf-8')) if saved.exists() else {}


def saved_verdicts(module: str) -> Dict[str, str]:
    """The restored rechecks' verdicts that still hold: those whose function's hash is the one they were given for."""
    now = hashes(module)
    return {name: verdict for name, (verdict, given) in _saved_rechecks(module).items() if now.get(name) == given}
