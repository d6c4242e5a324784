"""The converged CNNs tcnn ships for its demo (``tcnn/demo/cnns``): the demo fine-tunes them as the paper fine-tunes
CNNs pretrained on ImageNet (T-CNN, arXiv:2106.05795, section 3), instead of a CNN still climbing.

Each ``seedS-cnn.pt`` is a ``tcnn.save`` file of ``demo_resnet10`` trained from scratch on the default plan's data
with the plan's ``tcnn train`` arguments, the seed as its ``--seed``; ``seedS-cnn.metrics.jsonl`` is that run's own
per-epoch record (the report reads the plateau from it), and ``record.json`` says how they were made: the command
(``python benchmarks/demo_cnns.py``), the data, the environment, and each file's SHA-256, checked before use.
"""
import hashlib
import json
import os
import shutil
from typing import Any, Dict, List, Mapping, Optional

from ..atomic import atomic_write_text
from ..errors import TcnnError
from ..files import run_folder
from .plan import CNN, DATA_SEED, Plan, run_name

__all__ = ['SHIPPED_DIR', 'RECORD_FILE', 'RECORD_FORMAT', 'data_key', 'load_record', 'shipped_seeds', 'check_plan',
           'install', 'model_name', 'metrics_name', 'sha256']

SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'cnns')
RECORD_FILE = os.path.join(SHIPPED_DIR, 'record.json')
RECORD_FORMAT = 'tcnn-demo-cnns'


def model_name(seed: int) -> str:
    return f'{run_name(seed, CNN)}.pt'


def metrics_name(seed: int) -> str:
    return f'{run_name(seed, CNN)}.metrics.jsonl'


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            h.update(block)
    return h.hexdigest()


def data_key(plan: Plan) -> Dict[str, Any]:
    """What a CNN's training data depends on: the task, its parameters and the dataset seed (the training images of a
    smaller plan are the first of a larger one's: ``synthetic.generate`` extends a set deterministically)."""
    return {'task_params': plan.task().to_dict(), 'seed': DATA_SEED}


def load_record(folder: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """``record.json`` of the shipped CNNs (None where there is none)."""
    path = os.path.join(folder or SHIPPED_DIR, 'record.json')
    if not os.path.isfile(path):
        return None
    with open(path, encoding='utf-8') as f:
        record = json.load(f)
    return record if record.get('format') == RECORD_FORMAT else None


def shipped_seeds(folder: Optional[str] = None) -> List[int]:
    record = load_record(folder)
    return sorted(int(s) for s in record['cnns']) if record else []


def _check(plan: Plan, record: Optional[Mapping[str, Any]], seed: int) -> Mapping[str, Any]:
    fix = 'pass --train-cnns (tcnn demo) to train the CNNs from scratch'
    if record is None:
        raise TcnnError(f'this tcnn ships no converged demo CNNs ({RECORD_FILE} is missing); {fix}')
    if record['data'] != data_key(plan):
        raise TcnnError(f'the shipped demo CNNs were trained on other data than plan {plan.name!r} makes; {fix}')
    if plan.train > record['train']:
        raise TcnnError(f'plan {plan.name!r} has {plan.train} training images; the shipped CNNs saw the first '
                        f'{record["train"]}; {fix}')
    entry = record['cnns'].get(str(seed))
    if entry is None:
        raise TcnnError(f'tcnn ships converged demo CNNs for seeds {", ".join(sorted(record["cnns"], key=int))} '
                        f'only, not seed {seed}: pass --seeds {len(record["cnns"])} or fewer, or {fix}')
    return entry


def check_plan(plan: Plan, folder: Optional[str] = None) -> None:
    """Raise ``TcnnError`` (one line naming the fix) unless a converged CNN of the plan's data is shipped for every
    one of its seeds: checked before a demo generates its data."""
    record = load_record(folder)
    for seed in range(plan.seeds):
        _check(plan, record, seed)


def install(plan: Plan, seed: int, model_file: str, run_dir: str, folder: Optional[str] = None) -> Dict[str, Any]:
    """Copy the shipped CNN of ``seed`` to ``model_file`` and its training record to ``run_dir``'s
    ``metrics.jsonl``, after checking that it was trained on the plan's data and that its bytes are those recorded.

    Returns:
        The CNN's entry of ``record.json`` (its SHA-256, its final val top-1, its plateau).
    """
    folder = folder or SHIPPED_DIR
    entry = _check(plan, load_record(folder), seed)
    source = os.path.join(folder, model_name(seed))
    if not os.path.isfile(source) or sha256(source) != entry['sha256']:
        raise TcnnError(f'{source} is missing or not the file its record names (SHA-256 differs): reinstall tcnn')
    os.makedirs(os.path.dirname(model_file), exist_ok=True)
    if not os.path.isfile(model_file) or sha256(model_file) != entry['sha256']:
        tmp = f'{model_file}.tmp'
        shutil.copyfile(source, tmp)
        os.replace(tmp, model_file)
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(folder, metrics_name(seed)), encoding='utf-8') as f:
        atomic_write_text(os.path.join(run_dir, run_folder.METRICS_FILE), f.read())
    return dict(entry)
