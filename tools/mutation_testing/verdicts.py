"""A run's verdicts: mutmut's, those of the rechecks since, and the equivalent mutants; the report of a run.

A survivor is killed by a test, or listed as equivalent in ``equivalent.tsv`` (beside this file: one line each, the
mutant's name and, after a tab, why it cannot change behaviour); the report counts those as equivalent.
"""
import csv
import json
import os
from collections import Counter
from pathlib import Path
from typing import Dict, Tuple

from .copies import folder
from .state import saved_verdicts
from .modules import MODULES

EQUIVALENT = Path(__file__).with_name('equivalent.tsv')

# mutmut's exit codes -> status (mutmut.stats.status_by_exit_code)
STATUS = {1: 'killed', 3: 'killed', 0: 'survived', 5: 'no tests', 33: 'no tests', 34: 'skipped', 36: 'timeout',
          -24: 'timeout', 24: 'timeout', 152: 'timeout', 255: 'timeout', 37: 'caught by type check', None: 'not run'}
# the statuses of a mutant that no test killed
SURVIVING = ('survived', 'no tests', 'suspicious', 'timeout')


def equivalent_mutants() -> Dict[str, str]:
    """The mutants ``equivalent.tsv`` lists as equivalent, with the reason."""
    with open(EQUIVALENT, encoding='utf-8', newline='') as f:
        return {row['mutant']: row['reason'] for row in csv.DictReader(f, delimiter='\t', quoting=csv.QUOTE_NONE)}


def record(module: str, verdicts: Dict[str, str], fresh: bool = False) -> Dict[str, str]:
    """``verdicts`` merged into the verdicts kept beside ``module``'s run (``recheck.json``), which ``results``
    reads; returns them all.

    Args:
        module: The campaign's module.
        verdicts: ``{mutant: verdict}`` of a recheck or a check.
        fresh: In place of the kept verdicts, not merged with them.
    """
    path = folder(module) / 'recheck.json'
    kept = json.loads(path.read_text()) if path.exists() and not fresh else {}
    kept.update(verdicts)
    temp = path.with_suffix('.json.tmp')
    temp.write_text(json.dumps(kept, indent=1) + '\n')
    os.replace(temp, path)  # a check stopped while it writes leaves the verdicts it had
    return kept


def results(module: str, rechecked: bool = True) -> Dict[str, Tuple[str, float]]:
    """``{mutant: (status, seconds)}`` of the last run of ``module`` (mutmut's ``.meta`` files); survivors listed as
    equivalent count as ``equivalent``, those a recheck killed as ``killed (fresh process)`` (or ``killed
    (TorchScript on)``).

    Args:
        module: The campaign's module.
        rechecked: Whether the rechecks' verdicts count (``recheck.json``, and those of earlier sessions that
            ``state.restore`` brought back while their function is unchanged); without them, mutmut's alone.
    """
    equivalent = equivalent_mutants()
    kept = folder(module) / 'recheck.json'
    again = {**saved_verdicts(module), **(json.loads(kept.read_text()) if kept.exists() else {})} if rechecked else {}
    out = {}
    for meta in sorted((folder(module) / 'mutants').rglob('*.py.meta')):
        data = json.loads(meta.read_text(encoding='utf-8'))
        durations = data.get('durations_by_key', {})
        for name, code in data['exit_code_by_key'].items():
            status = STATUS.get(code, 'suspicious')
            if status in SURVIVING and again.get(name) == 'killed':  # a suspicious or timed-out one too
                status = 'killed (fresh process)'
            elif status in SURVIVING and again.get(name) == 'killed (TorchScript on)':
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
            'survivors': sorted(n for n, (s, _) in res.items() if s in SURVIVING)}
