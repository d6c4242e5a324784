"""``tcnn demo`` end to end on its tiny plan: the files and keys of the report, its numbers against ``tcnn eval`` on
the saved model files, one CNN per seed, reproducibility, stopping and continuing a demo, the comparison with the
documented distribution, and the command's argument errors."""
import argparse
import copy
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import tcnn
import tcnn.demo.command
from tcnn.demo.dynamics import INIT_GATE
from tcnn.demo.judgement import SIGMOID_SLOPE, interval, judge, judgement_lines, t_quantile_975
from tcnn.demo.plan import PLANS, PRETRAIN_EPOCHS, SHIPPED, recipe_changes, warmup_epochs
from tcnn.demo.pool import loader_workers, parallel_layout
from tcnn.demo.reference import HEADLINE, build_reference, headline_values
from tcnn.demo.report import verdict
from tcnn.demo.results import summarize_runs
from tcnn.demo.runner import run_demo
from tcnn.evaluation import scoring
from tcnn.evaluation.plots import load_metrics
from tcnn.convert.settings import gpsa_layers
from tcnn.errors import TcnnError
from tcnn.train.recipe import load_recipe

pytestmark = pytest.mark.filterwarnings('ignore')


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp('demo') / 'out'
    lines = []
    # jobs=2: two training processes of one thread each, on any machine (the numbers depend on the threads)
    results = run_demo(str(out), plan='tiny', device='cpu', workers=0, jobs=2, progress=False,
                            log=lines.append)
    return out, results, lines


def test_the_demo_writes_every_report_file_and_key(tiny):
    out, results, _ = tiny
    plan = PLANS['tiny']
    for f in ('results.json', 'README.md', 'eval.json', 'eval.md', 'demo.json', 'data/dataset.json',
              'figures/fig3_robustness.png', 'models/seed0-cnn.pt', 'models/seed1-init-t-cnn.pt',
              'runs/seed1-cnn/metrics.jsonl'):
        assert (out / f).is_file(), f
    assert json.loads((out / 'results.json').read_text()) == json.loads(json.dumps(results))
    names = {f'seed{s}-{a}' for s in range(plan.seeds) for a in ('cnn', *plan.arms)}
    assert {r['name'] for r in results['runs']} == names and len(names) == 8
    for name in names:
        assert (out / 'models' / f'{name}.pt').is_file()
        rows = [json.loads(line) for line in (out / 'runs' / name / 'metrics.jsonl').read_text().splitlines()]
        epochs = plan.pretrain_epochs if name.split('-', 1)[1] == 'cnn' else plan.finetune_epochs
        assert [r['epoch'] for r in rows] == list(range(epochs))
        log = (out / 'runs' / name / 'log.txt').read_text()  # each run's own output
        assert log.startswith('== tcnn train') and 'done: best val top-1' in log
    for arm in ('cnn', 'no-sa', 't-cnn', 't-cnn-late'):
        entry = results['summary'][arm]
        assert len(entry['clean_top1']['values']) == plan.seeds
        assert ('gain_clean' in entry) == (arm not in ('cnn', 'no-sa'))
    for run in results['runs']:
        assert set(run['corruptions']) == set(results['dataset']['corruptions'])
        assert all(len(c['severities']) == 5 for c in run['corruptions'].values())
        assert (run['analysis'] is None) == (run['arm'] in ('cnn', 'no-sa'))
        if run['analysis']:
            assert 0 <= run['gate_mean'] <= 1 and run['span_mean'] > 0 and run['nonlocality_mean'] >= 0
            assert run['sigma_mean'] > 0 and run['nonlocality_real_mean'] >= 0 and 0 <= run['padding_share_mean'] < 1
    conv = results['conversion']
    assert [c['seed'] for c in conv['seeds']] == [0, 1]
    assert conv['max_rel_err'] == max(c['max_rel_err'] for c in conv['seeds']) < 1e-4 and conv['gpsa_layers'] == 2
    assert min(conv['init_max_rel_err_range']) > 1e-3  # the paper's init is not the CNN
    assert [s['seed'] for s in results['init']['seeds']] == [0, 1]
    assert results['init']['gate_mean'] == pytest.approx(sum(s['gate_mean'] for s in results['init']['seeds']) / 2)
    assert len(results['recipe_changes']) >= 5 and results['wall_s'] > 0
    assert results['figures']['attention'] and all(os.path.isfile(p) for p in results['figures']['attention'])
    assert set(results['figures']['curves']) == {'cnn', 'no-sa', 't-cnn', 't-cnn-late'}
    env = results['environment']
    assert env['jobs'] == 2 and env['threads'] == 1 and env['torch'] == torch.__version__ and env['pillow']
    assert env['cpu'] and env['cpu_capability'] == torch.backends.cpu.get_cpu_capability() and env['gpu'] is None
    assert f'{env["cpu"]}, torch\'s {env["cpu_capability"]} kernels' in (out / 'README.md').read_text()


def test_the_training_section_reads_the_runs_own_metrics(tiny):
    out, results, _ = tiny
    tr = results['training']
    assert tr['warmup_epochs'] == 1 and tr['cnns'] == 2
    assert tr['cnn'] == {'0': None, '1': None}  # 1 CNN epoch: too short to tell a plateau
    for seed in (0, 1):
        cnn_last = load_metrics(str(out / 'runs' / f'seed{seed}-cnn'))[-1]['val_top1']
        rows = load_metrics(str(out / 'runs' / f'seed{seed}-t-cnn'))
        run = tr['runs'][f'seed{seed}-t-cnn']
        assert run['dip']['start'] == cnn_last and run['dip']['final'] == rows[-1]['val_top1']
        assert run['dip']['warmup_min'] == rows[0]['val_top1']
        for layer, gpsa in rows[-1]['gpsa'].items():
            assert run['layers'][layer]['gate']['final'] == pytest.approx(sum(gpsa['gate']) / len(gpsa['gate']))
            assert run['layers'][layer]['span']['final'] == pytest.approx(sum(gpsa['span']) / len(gpsa['span']))
        assert tr['runs'][f'seed{seed}-no-sa']['layers'] == {}
        late = tr['runs'][f'seed{seed}-t-cnn-late']['layers']
        assert late and all(e['warmup_epoch'] == PLANS['tiny'].late_epoch for e in late.values())
    readme = (out / 'README.md').read_text()
    assert "### Over training (the paper's Fig. 4 in numbers)" in readme
    assert '| T-CNN, late reparam. | layer4.0.conv2 |' in readme and 'Fig. 4A, T-CNN:' in readme


def test_numbers_are_what_tcnn_eval_measures_on_the_model_files(tiny):
    out, results, _ = tiny
    files = {r['name']: r['model_file'] for r in results['runs']}
    models = {name: tcnn.load(path) for name, path in files.items()}
    clean = scoring.evaluate(models, 'imagenet', str(out / 'data' / 'test'), img_size=96, crop_pct=1.0,
                             workers=0, progress=False)
    corrupted = scoring.evaluate(models, 'imagenet-c', str(out / 'data' / 'test-c'), img_size=96, crop_pct=1.0,
                                 workers=0, progress=False)
    runs = {r['name']: r for r in results['runs']}
    for name, run in runs.items():
        assert run['clean_top1'] == clean[name]['top1'], name
        assert run['corrupted_top1'] == corrupted[name]['top1'], name
        for c, entry in run['corruptions'].items():
            assert entry['top1'] == corrupted[name]['corruptions'][c]['top1']
    for arm in ('cnn', 'no-sa', 't-cnn'):
        values = [runs[f'seed{s}-{arm}']['clean_top1'] for s in range(2)]
        assert results['summary'][arm]['clean_top1']['values'] == values
    gains = [runs[f'seed{s}-t-cnn']['clean_top1'] - runs[f'seed{s}-no-sa']['clean_top1'] for s in range(2)]
    assert results['summary']['t-cnn']['gain_clean']['values'] == pytest.approx(gains)


def test_models_are_what_the_arms_say(tiny):
    _, results, _ = tiny
    for run in results['runs']:
        model = tcnn.load(run['model_file'])
        assert (len(gpsa_layers(model)) == 2) == (run['arm'] not in ('cnn', 'no-sa')), run['name']
        assert model.num_classes == 6


def test_every_seed_trains_its_own_cnn_and_fine_tunes_from_it(tiny):
    out, results, _ = tiny
    cnns = [torch.load(out / 'models' / f'seed{s}-cnn.pt', weights_only=True)['state_dict'] for s in range(2)]
    assert any(not torch.equal(cnns[0][k], cnns[1][k]) for k in cnns[0])  # two CNNs, not one
    for run in results['runs']:
        recipe = load_recipe(str(out / 'runs' / run['name'] / 'config.yaml'))
        assert recipe['seed'] == run['seed']
        if run['arm'] == 'cnn':
            assert not recipe['pretrained'] and recipe['weights'] is None and recipe['epochs'] == 1
        else:
            assert recipe['weights'] == str(out / 'models' / f'seed{run["seed"]}-cnn.pt'), run['name']
        assert recipe['channels_last'] is True


def test_readme_states_the_result_and_the_changes(tiny):
    out, results, _ = tiny
    text = (out / 'README.md').read_text()
    assert 'T-CNN' in text and 'no-SA' in text and 'Changes from the paper' in text
    assert f'{results["summary"]["t-cnn"]["clean_top1"]["mean"]:.1f}' in text
    for line in verdict(results):
        assert line in text
    for change in results['recipe_changes']:
        assert change in text
    assert '](figures/fig3_robustness.png)' in text
    # the attention statistics carry their units (the definitions of tcnn.analysis.heads)
    for header in ('span 1/α, tokens²', 'σ = 1/√(2α), tokens', 'nonlocality on real keys, tokens',
                   'attention on padding, %', '6x6 tokens of 16 px'):
        assert header in text, header


def test_continuing_a_finished_demo_trains_nothing(tiny):
    out, results, _ = tiny
    lines = []
    again = run_demo(str(out), plan='tiny', device='cpu', workers=0, jobs=2, progress=False, log=lines.append)
    assert [r['clean_top1'] for r in again['runs']] == [r['clean_top1'] for r in results['runs']]
    assert again['timings_s']['data'] == 0.0
    assert not any(line.startswith('== seed') for line in lines)  # no tcnn train process started
    assert set(again['timings_s']) == {'data', 'evaluation', 'analysis', 'figures'}


def _status(run_dir) -> dict:
    """A run's ``status.json`` (``tcnn train``), {} before it is written."""
    try:
        return json.loads((run_dir / 'status.json').read_text())
    except (OSError, ValueError):  # not written yet (it is written atomically: never half)
        return {}


def _launches(run_dir) -> int:
    """How many ``tcnn train`` processes the demo started for a run: each appends its command to the run's log."""
    log = run_dir / 'log.txt'
    return log.read_text().count('== tcnn train') if log.is_file() else 0


def test_a_stopped_demo_continues_to_the_same_numbers(tiny, tmp_path):
    """Ctrl-C during the fine-tuning: the demo passes it to its training processes (each saves its checkpoint or
    had not started), exits 130 with one line; the same command continues it, keeping the finished runs (not
    started again, their files untouched), resuming the interrupted arm from its checkpoint, to the numbers of an
    uninterrupted demo (same data, same seeds, one thread per process).

    The stop is placed by state, not time: once the T-CNN arm's ``tcnn train`` has written ``status.json``
    ``running`` (its model built, its signal handlers on), i.e. with the seed's CNN finished and the arm at its first
    update; its 2 epochs take seconds, the demo forwards the signal within its 0.5 s poll."""
    out, results, _ = tiny
    fresh = tmp_path / 'fresh'
    runs = fresh / 'runs'
    argv = ['demo', '--plan', 'tiny', '--seeds', '1', '--jobs', '2', '--workers', '0', '--out', str(fresh),
            '--no-progress']
    proc = subprocess.Popen([sys.executable, '-m', 'tcnn', *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, HF_HUB_OFFLINE='1'))
    try:
        while _status(runs / 'seed0-t-cnn').get('state') != 'running':
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert 'run the same tcnn demo command again' in err and 'Traceback' not in err
    assert not (fresh / 'results.json').exists()
    cnn, arm = runs / 'seed0-cnn', runs / 'seed0-t-cnn'
    assert _status(cnn)['state'] == 'finished' and _launches(cnn) == 1
    stopped = _status(arm)
    assert stopped['state'] == 'interrupted' and stopped['completed_epochs'] < 2 and (arm / 'last.pt').is_file()
    # what the continuation must keep: every run finished at the stop, file for file
    at_stop = {d.name: _status(d) for d in runs.iterdir()}
    finished = {d.name: {f.name: f.stat().st_mtime_ns for f in d.iterdir()} for d in runs.iterdir()
                if at_stop[d.name].get('state') == 'finished'}
    kept_rows = (arm / 'metrics.jsonl').read_text() if (arm / 'metrics.jsonl').is_file() else ''
    lines = []
    fresh_results = run_demo(str(fresh), plan='tiny', seeds=1, device='cpu', workers=0, jobs=2,
                             progress=False, log=lines.append)
    for name, files in finished.items():
        assert not any(line.startswith(f'== {name}:') for line in lines), f'{name} was trained again'
        assert _launches(runs / name) == 1
        assert {f: (runs / name / f).stat().st_mtime_ns for f in files} == files, name
    assert any(line.startswith('== seed0-t-cnn:') for line in lines) and _launches(arm) == 2
    log = (arm / 'log.txt').read_text()
    assert 'resuming' in log.split('== tcnn train')[2]  # from its checkpoint, not from the CNN again
    assert (arm / 'metrics.jsonl').read_text().startswith(kept_rows)
    first = {r['name']: r for r in results['runs']}
    for run in fresh_results['runs']:
        assert run['clean_top1'] == first[run['name']]['clean_top1']
        assert run['corrupted_top1'] == first[run['name']]['corrupted_top1']
        a, b = torch.load(run['model_file'], weights_only=True), torch.load(first[run['name']]['model_file'],
                                                                              weights_only=True)
        differ = [k for k in a['state_dict'] if not torch.equal(a['state_dict'][k], b['state_dict'][k])]
        assert not differ, (run['name'], differ[:5], at_stop)


PAPER_DEMO_SCRIPT = os.path.join(os.path.dirname(__file__), '..', 'benchmarks', 'gpu', '6_paper_demo.sh')


def _timeout_process_of(out_dir):
    """The pid of the ``timeout`` process that runs ``tcnn demo --out out_dir`` (Linux: from /proc)."""
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                argv = f.read().decode(errors='replace').split('\0')
        except OSError:
            continue
        if os.path.basename(argv[0]) == 'timeout' and str(out_dir) in argv:
            return int(pid)
    raise AssertionError(f'no timeout process runs tcnn demo --out {out_dir}')


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='the GPU kit runs on Linux (/proc, bash)')
def test_the_paper_demo_script_continues_on_a_fresh_machine_to_the_same_numbers(tiny, tmp_path):
    """benchmarks/gpu/6_paper_demo.sh in SMOKE mode (the tiny plan on the CPU): stopped by its time limit once the
    CNNs are trained, it packs the demo's state into $OUT; a second call on a "fresh machine" (another demo folder,
    no data) continues from those parts, carried, without training the finished runs again, to the numbers of an
    uninterrupted demo."""
    out, results, _ = tiny
    env = dict(os.environ, SMOKE='1', PYTHON=sys.executable, HF_HUB_OFFLINE='1')
    first = tmp_path / 'machine1'
    proc = subprocess.Popen(['bash', PAPER_DEMO_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(env, OUT=str(tmp_path / 'out1'), PAPER_DEMO_DIR=str(first)))
    for line in proc.stdout:
        if line.startswith('== seed0-t-cnn:'):  # both CNNs trained (one per process), the arms starting
            time.sleep(0.5)
            os.kill(_timeout_process_of(first), signal.SIGTERM)  # what the time limit does
            break
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log
    assert 'the demo did not finish' in log
    parts = sorted((tmp_path / 'out1').glob('paper-demo-state.tar.part-*'))
    assert parts and all(p.stat().st_size <= 15 * 2 ** 20 for p in parts)
    assert not list((tmp_path / 'out1').glob('*.json'))

    state = tmp_path / 'carried'
    state.mkdir()
    for p in parts:
        (state / p.name).write_bytes(p.read_bytes())
    second = tmp_path / 'machine2'
    log = subprocess.run(['bash', PAPER_DEMO_SCRIPT], capture_output=True, text=True, timeout=600,
                         env=dict(env, OUT=str(tmp_path / 'out2'), PAPER_DEMO_DIR=str(second),
                                  PAPER_DEMO_STATE=str(state))).stdout
    assert 'continuing from the carried state' in log and 'the demo finished' in log, log
    # the CNNs were complete in the state: exported again, not trained again
    for seed in (0, 1):
        assert (second / 'runs' / f'seed{seed}-cnn' / 'log.txt').read_text().count('== tcnn train') == 1
    (result_file,) = (tmp_path / 'out2').glob('cpu-smoke-paper-demo-*.json')
    continued = json.loads(result_file.read_text())
    assert (tmp_path / 'out2' / 'paper-demo-figures.tar.gz').stat().st_size > 0
    uninterrupted = {r['name']: r for r in results['runs']}
    for run in continued['runs']:
        assert run['clean_top1'] == uninterrupted[run['name']]['clean_top1']
        assert run['corrupted_top1'] == uninterrupted[run['name']]['corrupted_top1']


ALL_ARMS = ['cnn', 'no-sa', 't-cnn', 't-cnn-late']


def _shifted(results, arm, points):
    """A copy of ``results`` whose ``arm`` scored ``points`` more (per seed, a sequence) on the clean test split."""
    out = copy.deepcopy(results)
    for run in out['runs']:
        if run['arm'] == arm:
            run['clean_top1'] += points[run['seed']]
    out['summary'] = summarize_runs(out['runs'], ALL_ARMS)
    return out


def test_the_distribution_pools_the_headline_numbers_of_demos(tiny):
    _, results, _ = tiny
    values = headline_values(results)
    assert set(values) == {key for key, _ in HEADLINE}  # the tiny plan has every arm
    assert values['cnn/clean_top1'] == [r['clean_top1'] for r in results['runs'] if r['arm'] == 'cnn']
    assert values['t-cnn/gain_clean'] == results['summary']['t-cnn']['gain_clean']['values']
    other = _shifted(results, 't-cnn', [10, 10])
    other['environment'] = dict(other['environment'], torch='0.0+other')
    reference = build_reference([results, other], measured='today')
    assert [e['torch'] for e in reference['environments']] == [torch.__version__, '0.0+other']
    stats = reference['stats']['t-cnn/clean_top1']
    assert stats['n'] == 4 and stats['max'] == max(values['t-cnn/clean_top1']) + 10
    quick = dict(results, plan=dict(results['plan'], name='quick', train=2400))
    with pytest.raises(TcnnError, match='different plans'):
        build_reference([results, quick])


@pytest.mark.parametrize('df, expected', [(1, 12.706), (4, 2.776), (9, 2.262), (30, 2.042), (40, 2.021),
                                          (60, 2.000), (120, 1.980), (100000, 1.960)])
def test_t_quantiles_are_students(df, expected):
    assert t_quantile_975(df) == pytest.approx(expected, abs=1.5e-3)


def test_the_paired_gain_interval_is_students_t_over_the_seeds():
    g = interval([1.0, 2.0, 3.0, 4.0, 5.0])  # mean 3, sd sqrt(2.5), t(4) = 2.776
    assert g['mean'] == 3.0 and g['half'] == pytest.approx(2.776 * math.sqrt(2.5) / math.sqrt(5))
    assert g['sign'] == 'positive' and g['lo'] == pytest.approx(3 - g['half'])
    assert interval([-1.0, 0.5, 2.0])['sign'] == 'zero inside'
    assert interval([-3.0, -2.0, -2.5])['sign'] == 'negative'
    assert interval([2.0])['sign'] == 'one seed' and interval([2.0])['lo'] is None


def _judged(results, gains_clean, gains_corrupted, gate_final):
    """A copy of ``results`` with the T-CNN's paired gains and every head's final gate set, judged again."""
    out = copy.deepcopy(results)
    out['summary']['t-cnn']['gain_clean']['values'] = list(gains_clean)
    out['summary']['t-cnn']['gain_corrupted']['values'] = list(gains_corrupted)
    for run in out['training']['runs'].values():
        for layer in run['layers'].values():
            layer['gate']['heads_final'] = [gate_final] * len(layer['gate']['heads_final'])
    return judge(out)


def test_the_judgement_reads_the_intervals_once_the_gates_moved(tiny):
    _, results, _ = tiny
    moved = INIT_GATE - 0.2
    up, down, mixed = [2, 3, 2.5, 3.5, 2.8], [-3, -2, -2.5, -3.5, -2.8], [-1, 2, 0.5, -0.5, 1]
    assert _judged(results, up, mixed, moved)['verdict'] == 'supports'
    assert _judged(results, up, down, moved)['verdict'] == 'contradicts'
    assert _judged(results, mixed, mixed, moved)['verdict'] == 'no difference shown'
    # two seeds: the interval is wide (t = 12.7), a consistent gain of two seeds shows no difference yet
    assert _judged(results, [2, 3], [2, 3], moved)['verdict'] == 'no difference shown'
    # gates at their init in every head: the T-CNN learned no attention, whatever its gains
    frozen = _judged(results, [5, 6], [5, 6], INIT_GATE)
    assert frozen['verdict'] == 'method failed' and not frozen['attention_learned']
    # the line is what the base learning rate could have moved the gates: just below it fails, just above passes
    bound = sum(frozen['base_bound'].values()) / len(frozen['base_bound'])
    assert _judged(results, up, up, INIT_GATE + bound * 0.95)['verdict'] == 'method failed'
    assert _judged(results, up, up, INIT_GATE - bound * 1.05)['verdict'] == 'supports'
    lines = judgement_lines(frozen)
    assert lines[0].startswith('Headline: T-CNN minus the same CNN fine-tuned without self-attention, paired by seed: '
                               'clean +5.5 points, 95% CI -0.9 to +11.9 (2 seeds)')
    assert lines[1].startswith("Verdict: the method failed its check: the T-CNN's gates moved no further than the "
                               'base learning rate allows (mean |gate change| 0.000 over seeds')


def test_the_tiny_demo_learns_attention_and_is_judged(tiny):
    out, results, lines = tiny
    j = results['judgement']
    assert j == judge(results)
    assert j['attention_learned'], (j['gate_change'], j['base_bound'])
    assert set(j['gate_change']) == set(j['base_bound']) == {'0', '1'}
    for seed in (0, 1):  # the bound: the base learning rate summed over the run's updates (16 images each)
        rows = load_metrics(str(out / 'runs' / f'seed{seed}-t-cnn'))
        total, before = 0.0, 0.0
        for r in rows:
            total += r['train_images'] // 16 * max(before, r['lr'])
            before = r['lr']
        assert j['base_bound'][str(seed)] == pytest.approx(SIGMOID_SLOPE * total) and total > 0
    assert j['gain_clean']['n'] == 2 and j['gain_clean']['mean'] == pytest.approx(
        results['summary']['t-cnn']['gain_clean']['mean'])
    text = (out / 'README.md').read_text()
    for line in judgement_lines(j):
        assert line in text and line in lines[-1]


@pytest.mark.parametrize('gating_lr', [1e-9, 1e-3])
def test_a_t_cnn_that_cannot_learn_attention_fails_the_judgement(tmp_path, gating_lr):
    """The same pipeline with the T-CNN's gates frozen (gating lr 1e-9: tcnn train refuses 0) or at the base learning
    rate instead of the paper's 0.1: its gates move no further than the base rate allows, and the report says the
    method failed, whatever the accuracies."""
    plan = dataclasses.replace(PLANS['tiny'], seeds=1, late_epoch=None, gating_lr=gating_lr, lr=1e-3)
    results = run_demo(str(tmp_path / 'out'), plan=plan, device='cpu', workers=0, jobs=1, progress=False,
                       log=lambda s: None)
    j = results['judgement']
    assert not j['attention_learned'] and j['verdict'] == 'method failed', j
    assert j['gate_change']['0'] < (j['base_bound']['0'] if gating_lr == 1e-3 else 1e-6)
    assert "Verdict: the method failed its check" in (tmp_path / 'out' / 'README.md').read_text()


def test_the_verdict_says_when_the_direction_does_not_hold_on_every_seed(tiny):
    _, results, _ = tiny
    base = {r['seed']: r['clean_top1'] for r in results['runs'] if r['arm'] == 'no-sa'}
    now = {r['seed']: r['clean_top1'] for r in results['runs'] if r['arm'] == 't-cnn'}
    mixed = _shifted(results, 't-cnn', [base[0] - now[0] + 5, base[1] - now[1] - 1])
    assert mixed['summary']['t-cnn']['gain_clean']['values'] == pytest.approx([5, -1])
    assert 'On clean test accuracy, 1 of 2 seeds favour the T-CNN: the direction does not hold on every seed.' in \
        verdict(mixed)
    better = _shifted(results, 't-cnn', [base[0] - now[0] + 5, base[1] - now[1] + 4])
    assert 'On clean test accuracy, 2 of 2 seeds favour the T-CNN.' in verdict(better)


@pytest.mark.parametrize('device, runs, jobs, cpus, expected', [
    ('cpu', 10, None, 2, (2, 1)),  # the default run on 2 cores: two runs side by side, one thread each
    ('cpu', 2, None, 2, (2, 1)),  # --quick: its two arms side by side
    ('cpu', 1, None, 2, (1, 1)),  # one run: one thread (the same numbers on any machine)
    ('cpu', 10, None, 16, (10, 1)),  # more cores: more processes, never more threads
    ('cpu', 2, None, 1, (1, 1)),
    ('cpu', 6, 6, 2, (6, 1)),
    ('cpu', 5, 1, 16, (1, 1)),
    ('cuda', 6, None, 16, (1, None)),  # one process on the GPU, torch's threads and tcnn train's loader workers
    ('cuda', 3, 4, 16, (4, 4)),  # processes sharing a GPU share the cores too
])
def test_parallel_layout_shares_the_cores_between_runs(device, runs, jobs, cpus, expected):
    assert parallel_layout(device, runs, jobs, cpus) == expected


@pytest.mark.parametrize('device, threads, expected', [
    ('cpu', 1, 0),  # a one-thread process loads its own images
    ('cpu', 2, None),  # tcnn train's own choice
    ('cuda', None, None),
    ('cuda', 4, 3),  # a GPU process with 4 cores: 3 workers feed it, its own thread drives the GPU
    ('cuda', 1, 1),
])
def test_loader_workers_follow_the_device_and_the_threads(device, threads, expected):
    assert loader_workers(device, threads) == expected


def test_the_paper_plan_is_the_papers_schedule_on_the_default_data():
    """--plan paper: the default plan's data and converged CNNs, 50 fine-tuning epochs with 5 of warm-up (T-CNN
    section 3), the late arm half-way, 3 seeds; its report says so."""
    paper, default = PLANS['paper'], PLANS['default']
    assert (paper.train, paper.val, paper.test, paper.corrupt, paper.task()) == (
        default.train, default.val, default.test, default.corrupt, default.task())
    schedule = (paper.finetune_epochs, warmup_epochs(paper.finetune_epochs), paper.late_epoch, paper.seeds)
    assert schedule == (50, 5, 25, 3)
    assert paper.cnns == default.cnns == SHIPPED and paper.pretrain_epochs == default.pretrain_epochs == PRETRAIN_EPOCHS
    changes = recipe_changes(paper)
    assert changes[0].startswith('epochs: 50 with 5 of warm-up, as the paper\'s')
    assert recipe_changes(default)[0].startswith(f'epochs: {default.finetune_epochs} instead of 50')
    parser = argparse.ArgumentParser()
    tcnn.demo.command.add_arguments(parser)
    assert parser.parse_args(['--plan', 'paper']).plan == 'paper'


def test_another_plan_in_the_same_folder_is_refused(tiny):
    out, _, _ = tiny
    with pytest.raises(TcnnError, match='other settings'):
        run_demo(str(out), plan='tiny', seeds=3, device='cpu', workers=0, jobs=2, progress=False,
                      log=lambda s: None)
    with pytest.raises(TcnnError, match='other settings'):  # another learning rate: another experiment
        run_demo(str(out), plan=dataclasses.replace(PLANS['tiny'], lr=2e-3), device='cpu', workers=0, jobs=2,
                 progress=False, log=lambda s: None)


def test_a_folder_of_other_files_is_refused(tmp_path):
    (tmp_path / 'notes.txt').write_text('mine')
    with pytest.raises(TcnnError, match='holds no demo'):
        run_demo(str(tmp_path), plan='tiny', progress=False, log=lambda s: None)
    assert (tmp_path / 'notes.txt').read_text() == 'mine'


def _cli(*args, **kwargs):
    env = dict(os.environ, HF_HUB_OFFLINE='1')
    return subprocess.run([sys.executable, '-m', 'tcnn', *args], capture_output=True, text=True, env=env, **kwargs)


@pytest.mark.parametrize('args, match', [
    (['--seeds', '0'], '--seeds must be'),
    (['--workers', '-1'], '--workers must be'),
    (['--device', 'gpu0'], "--device 'gpu0' is not a device"),
    (['--seeds', 'x'], "invalid int value: 'x'"),
    (['--jobs', '0'], '--jobs must be'),
    (['--plan', 'huge'], "invalid choice: 'huge'"),
    (['--quick', '--plan', 'tiny'], '--quick is --plan quick'),
])
def test_cli_argument_errors_are_one_line(tmp_path, args, match):
    r = _cli('demo', '--out', str(tmp_path / 'o'), *args)
    assert r.returncode == 2 and match in r.stderr and 'Traceback' not in r.stderr
    assert not (tmp_path / 'o').exists()


def test_cli_help_names_the_options():
    r = _cli('demo', '--help')
    assert r.returncode == 0
    for flag in ('--quick', '--plan', '--seeds', '--train-cnns', '--out', '--device', '--workers', '--jobs'):
        assert flag in r.stdout
