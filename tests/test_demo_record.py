"""``tcnn demo --quick`` from the converged CNN tcnn ships: its trajectory is pinned, and the shipped CNNs are what
their record says.

The quick demo's numbers, to the digit its log and report print (every epoch's train loss and val top-1, the result
table), are recorded per environment in ``tests/fixtures/demo_quick_record.json``. A change that moves them (code,
data, the shipped CNN) fails here until the record, and README's numbers, are updated on purpose:

    TCNN_WRITE_DEMO_RECORD=1 HF_HUB_OFFLINE=1 python -m pytest tests/test_demo_record.py

which adds or replaces the entry of this environment (torch build, CPU vendor and the kernels torch picks for it).
In an environment without an entry (another torch build or CPU, whose rounding can move a trajectory) the run is
compared with the nearest entry within a tolerance instead, and says so.
"""
import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import tcnn
from tcnn.demo import shipped
from tcnn.demo.plan import PLANS
from tcnn.demo.report import summary_lines
from tcnn.demo.runner import run_demo
from tcnn.errors import TcnnError
from tcnn.evaluation.plots import load_metrics

pytestmark = pytest.mark.filterwarnings('ignore')

RECORD = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixtures', 'demo_quick_record.json')
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cpu_vendor() -> str:
    try:
        with open('/proc/cpuinfo', encoding='utf-8') as f:
            return next((line.split(':', 1)[1].strip() for line in f if line.startswith('vendor_id')), 'unknown')
    except OSError:
        return 'unknown'


def _environment() -> dict:
    import platform
    return {'torch': torch.__version__, 'machine': platform.machine(), 'cpu_vendor': _cpu_vendor(),
            'cpu_capability': torch.backends.cpu.get_cpu_capability()}


def _trajectory(out, results) -> dict:
    """What the quick demo prints: per run and epoch the train loss (4 decimals) and val top-1 (1 decimal), and the
    result table."""
    runs = {}
    for run in results['runs']:
        if run['arm'] == 'cnn':
            continue
        runs[run['name']] = [[f'{r["train_loss"]:.4f}', f'{r["val_top1"]:.1f}'] for r in load_metrics(run['run_dir'])]
    return {'runs': runs, 'table': summary_lines(results).splitlines()}


@pytest.fixture(scope='module')
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp('quick') / 'out'
    results = run_demo(str(out), plan='quick', device='cpu', workers=0, progress=False, log=lambda s: None)
    return out, results


def test_the_quick_demo_follows_its_recorded_trajectory(quick):
    out, results = quick
    got = _trajectory(out, results)
    env = _environment()
    record = {'format': 'tcnn-demo-quick-record', 'entries': []}
    if os.path.isfile(RECORD):
        with open(RECORD, encoding='utf-8') as f:
            record = json.load(f)
    same = [e for e in record['entries'] if e['environment'] == env]
    if os.environ.get('TCNN_WRITE_DEMO_RECORD') == '1':
        record['entries'] = [e for e in record['entries'] if e['environment'] != env]
        record['entries'].append({'environment': env, **got})
        with open(RECORD, 'w', encoding='utf-8') as f:
            json.dump(record, f, indent=1)
            f.write('\n')
        return
    assert record['entries'], f'{RECORD} holds no trajectory: write it (this file\'s docstring says how)'
    if same:
        assert got == {k: same[0][k] for k in ('runs', 'table')}, (
            'the quick demo left its recorded trajectory: if on purpose, update the record and README '
            '(this file\'s docstring says how)')
        return
    # another torch build or CPU: its rounding may move the last digits, never the run itself
    nearest = record['entries'][0]
    assert set(got['runs']) == set(nearest['runs'])
    for name, rows in got['runs'].items():
        assert len(rows) == len(nearest['runs'][name])
        for (loss, top1), (ref_loss, ref_top1) in zip(rows, nearest['runs'][name]):
            assert abs(float(loss) - float(ref_loss)) < 0.05 and abs(float(top1) - float(ref_top1)) < 5.0, (
                name, rows, nearest['runs'][name])


def test_the_quick_demo_fine_tunes_the_shipped_cnn(quick):
    out, results = quick
    record = shipped.load_record()
    entry = record['cnns']['0']
    assert shipped.sha256(str(out / 'models' / 'seed0-cnn.pt')) == entry['sha256']
    assert results['cnns']['source'] == 'shipped' and results['cnns']['shipped']['0']['sha256'] == entry['sha256']
    with open(os.path.join(shipped.SHIPPED_DIR, shipped.metrics_name(0)), encoding='utf-8') as f:
        assert (out / 'runs' / 'seed0-cnn' / 'metrics.jsonl').read_text() == f.read()
    assert results['training']['cnn']['0']['at_plateau']  # the report reads the shipped CNN's own epochs
    assert results['conversion']['max_rel_err'] < 1e-4
    for run in ('seed0-no-sa', 'seed0-t-cnn'):
        assert not (out / 'runs' / 'seed0-cnn' / 'last.pt').exists()  # not trained here
        assert f'--weights {out / "models" / "seed0-cnn.pt"}' in (out / 'runs' / run / 'log.txt').read_text()


def test_the_shipped_cnns_are_converged_below_100_percent_and_packaged():
    record = shipped.load_record()
    assert record is not None and record['data'] == shipped.data_key(PLANS['default'])
    assert record['train'] == PLANS['default'].train and record['pretrain_epochs'] == PLANS['default'].pretrain_epochs
    assert shipped.shipped_seeds() == list(range(len(record['cnns']))) and len(record['cnns']) >= PLANS['default'].seeds
    for seed, entry in record['cnns'].items():
        path = os.path.join(shipped.SHIPPED_DIR, shipped.model_name(int(seed)))
        assert shipped.sha256(path) == entry['sha256'], seed
        metrics = [json.loads(line) for line in open(os.path.join(shipped.SHIPPED_DIR,
                                                                  shipped.metrics_name(int(seed))))]
        assert len(metrics) == entry['epochs'] == record['pretrain_epochs']
        assert metrics[-1]['val_top1'] == entry['val_top1'] < 100.0  # room left above the converged CNN
        assert entry['plateau']['at_plateau'], seed
        model = tcnn.load(path)
        assert model.num_classes == 6 and not any(isinstance(m, tcnn.GPSA) for m in model.modules())
    setup = open(os.path.join(REPO, 'setup.cfg'), encoding='utf-8').read()
    assert 'tcnn.demo = cnns/*.pt, cnns/*.jsonl, cnns/record.json' in setup


def test_a_demo_with_more_seeds_than_shipped_cnns_is_refused_before_it_starts(tmp_path):
    seeds = len(shipped.shipped_seeds())
    r = subprocess.run([sys.executable, '-m', 'tcnn', 'demo', '--seeds', str(seeds + 1), '--out', str(tmp_path / 'o')],
                       capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE='1'), timeout=120)
    assert r.returncode != 0 and 'Traceback' not in r.stderr
    assert r.stderr.strip().splitlines()[-1].endswith(
        f'not seed {seeds}: pass --seeds {seeds} or fewer, or pass --train-cnns (tcnn demo) to train the CNNs from '
        'scratch')
    assert not (tmp_path / 'o').exists()  # refused before any data was made


def test_a_shipped_cnn_is_refused_for_other_data_seeds_or_bytes(tmp_path):
    plan = PLANS['default']
    with pytest.raises(TcnnError, match='only, not seed 99: pass --seeds'):
        shipped.install(plan, 99, str(tmp_path / 'm.pt'), str(tmp_path / 'run'))
    with pytest.raises(TcnnError, match='other data'):
        shipped.install(dataclasses.replace(plan, num_objects=7), 0, str(tmp_path / 'm.pt'), str(tmp_path / 'run'))
    with pytest.raises(TcnnError, match='the shipped CNNs saw the first'):
        shipped.install(dataclasses.replace(plan, train=plan.train + 6), 0, str(tmp_path / 'm.pt'),
                        str(tmp_path / 'run'))
    folder = tmp_path / 'cnns'
    shutil.copytree(shipped.SHIPPED_DIR, folder)
    path = folder / shipped.model_name(0)
    data = bytearray(path.read_bytes())
    data[-100] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(TcnnError, match='SHA-256 differs'):
        shipped.install(plan, 0, str(tmp_path / 'm.pt'), str(tmp_path / 'run'), folder=str(folder))
    entry = shipped.install(plan, 1, str(tmp_path / 'm.pt'), str(tmp_path / 'run'), folder=str(folder))
    assert shipped.sha256(str(tmp_path / 'm.pt')) == entry['sha256']
