"""``tcnn demo`` end to end on its tiny plan: the files and keys of the report, its numbers against ``tcnn eval`` on
the saved model files, reproducibility, continuing a demo, and the command's argument errors."""
import json
import os
import subprocess
import sys

import pytest
import torch

import tcnn
from tcnn import demo, robustness
from tcnn.convert import gpsa_layers
from tcnn.errors import TcnnError

pytestmark = pytest.mark.filterwarnings('ignore')


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp('demo') / 'out'
    lines = []
    results = demo.run_demo(str(out), plan='tiny', device='cpu', workers=0, progress=False, log=lines.append)
    return out, results, lines


def test_report_files_and_keys(tiny):
    out, results, _ = tiny
    plan = demo.PLANS['tiny']
    for f in ('results.json', 'README.md', 'eval.json', 'eval.md', 'demo.json', 'data/dataset.json',
              'figures/fig3_robustness.png', 'models/cnn.pt', 'models/init-t-cnn.pt', 'runs/cnn/metrics.jsonl'):
        assert (out / f).is_file(), f
    assert json.loads((out / 'results.json').read_text()) == json.loads(json.dumps(results))
    names = {f'seed{s}-{a}' for s in range(plan.seeds) for a in plan.arms}
    assert {r['name'] for r in results['runs']} == names and len(names) == 6
    for name in names:
        assert (out / 'models' / f'{name}.pt').is_file()
        rows = [json.loads(line) for line in (out / 'runs' / name / 'metrics.jsonl').read_text().splitlines()]
        assert [r['epoch'] for r in rows] == list(range(plan.finetune_epochs))
    for arm in ('no-sa', 't-cnn', 't-cnn-late'):
        entry = results['summary'][arm]
        assert len(entry['clean_top1']['values']) == plan.seeds
        assert ('gain_clean' in entry) == (arm != 'no-sa')
    for run in results['runs']:
        assert set(run['corruptions']) == set(results['dataset']['corruptions'])
        assert all(len(c['severities']) == 5 for c in run['corruptions'].values())
        assert (run['analysis'] is None) == (run['arm'] == 'no-sa')
        if run['analysis']:
            assert 0 <= run['gate_mean'] <= 1 and run['span_mean'] > 0 and run['nonlocality_mean'] >= 0
            assert run['sigma_mean'] > 0 and run['nonlocality_real_mean'] >= 0 and 0 <= run['padding_share_mean'] < 1
    assert results['conversion']['max_rel_err'] < 1e-4 and results['conversion']['gpsa_layers'] == 2
    assert results['conversion']['init_max_rel_err'] > 1e-3  # the paper's init is not the CNN
    assert len(results['recipe_changes']) >= 5 and results['wall_s'] > 0
    assert results['figures']['attention'] and all(os.path.isfile(p) for p in results['figures']['attention'])
    assert set(results['figures']['curves']) == {'no-sa', 't-cnn', 't-cnn-late'}


def test_numbers_are_what_tcnn_eval_measures_on_the_model_files(tiny):
    out, results, _ = tiny
    files = {r['name']: r['model_file'] for r in results['runs']}
    files['cnn'] = results['cnn']['model_file']
    models = {name: tcnn.load(path) for name, path in files.items()}
    clean = robustness.evaluate(models, 'imagenet', str(out / 'data' / 'test'), img_size=96, crop_pct=1.0,
                                workers=0, progress=False)
    corrupted = robustness.evaluate(models, 'imagenet-c', str(out / 'data' / 'test-c'), img_size=96, crop_pct=1.0,
                                    workers=0, progress=False)
    runs = {r['name']: r for r in results['runs']}
    runs['cnn'] = results['cnn']
    for name, run in runs.items():
        assert run['clean_top1'] == clean[name]['top1'], name
        assert run['corrupted_top1'] == corrupted[name]['top1'], name
        for c, entry in run['corruptions'].items():
            assert entry['top1'] == corrupted[name]['corruptions'][c]['top1']
    for arm in ('no-sa', 't-cnn'):
        values = [runs[f'seed{s}-{arm}']['clean_top1'] for s in range(2)]
        assert results['summary'][arm]['clean_top1']['values'] == values
    gains = [runs[f'seed{s}-t-cnn']['clean_top1'] - runs[f'seed{s}-no-sa']['clean_top1'] for s in range(2)]
    assert results['summary']['t-cnn']['gain_clean']['values'] == pytest.approx(gains)


def test_models_are_what_the_arms_say(tiny):
    _, results, _ = tiny
    for run in results['runs']:
        model = tcnn.load(run['model_file'])
        assert (len(gpsa_layers(model)) == 2) == (run['arm'] != 'no-sa'), run['name']
    cnn = tcnn.load(results['cnn']['model_file'])
    assert not gpsa_layers(cnn) and cnn.num_classes == 6


def test_readme_states_the_result_and_the_changes(tiny):
    out, results, _ = tiny
    text = (out / 'README.md').read_text()
    assert 'T-CNN' in text and 'no-SA' in text and 'Changes from the paper' in text
    assert f'{results["summary"]["t-cnn"]["clean_top1"]["mean"]:.1f}' in text
    for line in demo.verdict(results):
        assert line in text
    for change in results['recipe_changes']:
        assert change in text
    assert '](figures/fig3_robustness.png)' in text
    # the attention statistics carry their units (the definitions of tcnn.analysis)
    for header in ('span 1/α, tokens²', 'σ = 1/√(2α), tokens', 'nonlocality on real keys, tokens',
                   'attention on padding, %', '6x6 tokens of 16 px'):
        assert header in text, header


def test_same_seed_same_numbers_and_continuing_reuses_the_runs(tiny, tmp_path):
    out, results, _ = tiny
    # continuing the finished demo: every run is complete, nothing is trained again, same numbers
    lines = []
    again = demo.run_demo(str(out), plan='tiny', device='cpu', workers=0, progress=False, log=lines.append)
    assert [r['clean_top1'] for r in again['runs']] == [r['clean_top1'] for r in results['runs']]
    assert again['timings_s']['data'] == 0.0
    # a fresh demo in another folder: the same data and the same numbers (same machine and thread count)
    fresh = demo.run_demo(str(tmp_path / 'fresh'), plan='tiny', seeds=1, device='cpu', workers=0, progress=False,
                          log=lambda s: None)
    first = {r['name']: r for r in results['runs']}
    for run in fresh['runs']:
        assert run['clean_top1'] == first[run['name']]['clean_top1']
        assert run['corrupted_top1'] == first[run['name']]['corrupted_top1']
        a, b = torch.load(run['model_file'], weights_only=True), torch.load(first[run['name']]['model_file'],
                                                                              weights_only=True)
        assert all(torch.equal(a['state_dict'][k], b['state_dict'][k]) for k in a['state_dict'])


def test_another_plan_in_the_same_folder_is_refused(tiny):
    out, _, _ = tiny
    with pytest.raises(TcnnError, match='other settings'):
        demo.run_demo(str(out), plan='tiny', seeds=3, device='cpu', workers=0, progress=False, log=lambda s: None)


def test_a_folder_of_other_files_is_refused(tmp_path):
    (tmp_path / 'notes.txt').write_text('mine')
    with pytest.raises(TcnnError, match='holds no demo'):
        demo.run_demo(str(tmp_path), plan='tiny', progress=False, log=lambda s: None)
    assert (tmp_path / 'notes.txt').read_text() == 'mine'


def _cli(*args, **kwargs):
    env = dict(os.environ, HF_HUB_OFFLINE='1')
    return subprocess.run([sys.executable, '-m', 'tcnn', *args], capture_output=True, text=True, env=env, **kwargs)


@pytest.mark.parametrize('args, match', [
    (['--seeds', '0'], '--seeds must be'),
    (['--workers', '-1'], '--workers must be'),
    (['--device', 'gpu0'], "--device 'gpu0' is not a device"),
    (['--seeds', 'x'], "invalid int value: 'x'"),
])
def test_cli_argument_errors_are_one_line(tmp_path, args, match):
    r = _cli('demo', '--out', str(tmp_path / 'o'), *args)
    assert r.returncode == 2 and match in r.stderr and 'Traceback' not in r.stderr
    assert not (tmp_path / 'o').exists()


def test_cli_help_names_the_options():
    r = _cli('demo', '--help')
    assert r.returncode == 0
    for flag in ('--quick', '--seeds', '--out', '--device', '--workers'):
        assert flag in r.stdout
