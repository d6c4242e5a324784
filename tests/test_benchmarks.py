"""The benchmark's reference GPSA and SDPA variant compute the conv / our GPSA, and the harness runs end to end."""
import json
import math
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.measure import PeakTensorMemory, interleaved_times, paired_ratio, storage_bytes
from benchmarks.reference_gpsa import ReferenceGPSA, to_reference
from conftest import ROOT
from benchmarks.sdpa_gpsa import SdpaGPSA, to_sdpa  # noqa: E402
from tcnn.layers.gpsa import EXACT_GATING, EXACT_LOCALITY, GPSA  # noqa: E402

from helpers import rel_err


def _asymmetric_conv(c_in: int, c_out: int, stride: int, dilation: int = 1, bias: bool = True) -> nn.Conv2d:
    torch.manual_seed(0)
    conv = nn.Conv2d(c_in, c_out, 3, stride, padding=dilation, dilation=dilation, bias=bias)
    with torch.no_grad():
        conv.weight[:, :, 0, 2] += 1.0  # an asymmetric filter: a transposed tap order cannot hide
    return conv


def _off_exact(gpsa: GPSA) -> GPSA:
    """Move a GPSA far from the conv: random q/k, gates and shifted centres (content and positional both matter)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        gpsa.q_weight.normal_(generator=gen)
        gpsa.k_weight.normal_(generator=gen)
        gpsa.gating.normal_(generator=gen)
        gpsa.pos_centers.add_(torch.randn(gpsa.pos_centers.shape, generator=gen) * 0.5)
        gpsa.v_weight.add_(torch.randn(gpsa.v_weight.shape, generator=gen) * 0.1)
    return gpsa


@pytest.mark.parametrize('stride,size,dilation', [(1, (7, 9), 1), (2, (14, 11), 1), (2, (9, 10), 1), (1, (8, 8), 2),
                                                  (2, (12, 12), 2)])
def test_reference_in_exact_configuration_is_the_conv(stride, size, dilation):
    # Stride 2 is computed by attention at full resolution then subsampling, which is the strided conv.
    conv = _asymmetric_conv(16, 24, stride, dilation)
    ref = ReferenceGPSA.from_conv(conv, EXACT_LOCALITY, EXACT_GATING)
    x = torch.randn(2, 16, *size)
    expected = F.conv2d(x, conv.weight, conv.bias, stride, dilation, dilation)
    out = ref(x)
    assert out.shape == expected.shape
    assert rel_err(out, expected) < 1e-5


@pytest.mark.parametrize('stride,size', [(1, (7, 6)), (2, (14, 14)), (2, (9, 11))])
def test_reference_and_sdpa_compute_our_gpsa_away_from_the_conv(stride, size):
    gpsa = _off_exact(GPSA.from_conv(_asymmetric_conv(18, 12, stride)))
    x = torch.randn(3, 18, *size)
    ours = gpsa(x)
    assert rel_err(ours, F.conv2d(x, gpsa.conv_filter(), gpsa.proj_bias, stride, 1)) > 0.1
    reference = ReferenceGPSA.from_gpsa(gpsa)
    sdpa = SdpaGPSA.from_conv(_asymmetric_conv(18, 12, stride))
    sdpa.load_state_dict(gpsa.state_dict())
    assert rel_err(reference(x), ours) < 1e-5
    assert rel_err(sdpa(x), ours) < 1e-5


@pytest.mark.parametrize('c_in,c_out,groups', [(16, 24, 4), (12, 12, 12), (6, 12, 6)])
def test_reference_and_sdpa_compute_our_grouped_gpsa(c_in, c_out, groups):
    torch.manual_seed(0)
    conv = nn.Conv2d(c_in, c_out, 3, 2, 1, groups=groups, bias=True)
    x = torch.randn(2, c_in, 9, 10)
    exact = GPSA.from_conv(conv, EXACT_LOCALITY, EXACT_GATING)
    assert rel_err(ReferenceGPSA.from_gpsa(exact)(x), conv(x)) < 1e-5
    gpsa = _off_exact(GPSA.from_conv(conv))
    ours = gpsa(x)
    assert rel_err(ours, conv(x)) > 0.1
    sdpa = SdpaGPSA.from_conv(conv)
    sdpa.load_state_dict(gpsa.state_dict())
    assert rel_err(ReferenceGPSA.from_gpsa(gpsa)(x), ours) < 1e-5
    assert rel_err(sdpa(x), ours) < 1e-5


def test_reference_avgpool_is_botnet_and_not_the_conv():
    conv = _asymmetric_conv(8, 8, 2)
    x = torch.randn(2, 8, 10, 10)
    out = ReferenceGPSA.from_conv(conv, EXACT_LOCALITY, EXACT_GATING, downsample='avgpool')(x)
    stride1 = F.conv2d(x, conv.weight, conv.bias, 1, 1)
    torch.testing.assert_close(out, F.avg_pool2d(stride1, 2), rtol=1e-5, atol=1e-5)
    assert rel_err(out, conv(x)) > 0.1


def test_reference_rejects_what_it_cannot_compute():
    with pytest.raises(ValueError, match='zero padding'):
        ReferenceGPSA.from_conv(nn.Conv2d(4, 4, 3, padding=1, padding_mode='reflect'))
    with pytest.raises(ValueError, match='downsample'):
        ReferenceGPSA(4, 4, downsample='maxpool')


def test_whole_model_designs_keep_the_function():
    import tcnn
    from benchmarks.suites import _create_cnn
    cnn = _create_cnn('resnet18d', seed=0).eval()  # random BN: the last stage matters for the logits
    t_cnn = tcnn.reparameterize(cnn, verify=False).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        out = t_cnn(x)
        assert rel_err(out, cnn(x)) > 1e-3  # the paper init: the GPSA layers are not the convs
        for model, cls in ((to_reference(tcnn.reparameterize(cnn, verify=False)), ReferenceGPSA),
                           (to_sdpa(tcnn.reparameterize(cnn, verify=False)), SdpaGPSA)):
            assert sum(isinstance(m, cls) for m in model.modules()) == 4
            assert not any(type(m) is GPSA for m in model.modules())
            model.load_state_dict(t_cnn.state_dict())  # same names and shapes; q/k were drawn anew
            assert rel_err(model.eval()(x), out) < 1e-5


def test_peak_tensor_memory_counts_live_storages():
    with PeakTensorMemory() as tracker:
        a = torch.ones(1000)  # 4000 bytes
        b = a * 2  # +4000, peak 8000
        del a  # -4000
        c = b.view(10, 100)  # a view: no new memory
        d = torch.ones(250)  # +1000: current 5000
        b.add_(1)  # in place: no new memory
    assert tracker.peak == 8000
    assert tracker.current == 5000
    del b, c, d
    assert tracker.current == 0
    w = torch.ones(10)
    assert storage_bytes([w, w[2:], w.view(2, 5), None]) == 40


def test_peak_tensor_memory_sees_backward_and_optimizer():
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(32, 64)

    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    with PeakTensorMemory() as first:
        step()  # creates gradients and AdamW's two moment buffers per parameter
    params = storage_bytes(model.parameters())
    assert first.peak >= 3 * params  # grads + exp_avg + exp_avg_sq alive at once
    with torch.no_grad(), PeakTensorMemory() as inference:
        model(x)
    assert inference.peak < first.peak


def test_interleaved_timing_alternates_the_order_and_pairs_the_ratio():
    calls = []
    fns = {'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')}
    times = interleaved_times(fns, torch.device('cpu'), warmup=1, repeats=4, iters=2)
    assert {k: len(v) for k, v in times.items()} == {'a': 4, 'b': 4}
    assert calls[:2] == ['a', 'b']  # warm-up
    assert calls[2:] == ['a'] * 2 + ['b'] * 2 + ['b'] * 2 + ['a'] * 2 + ['a'] * 2 + ['b'] * 2 + ['b'] * 2 + ['a'] * 2
    assert paired_ratio([2.0, 4.0, 6.0], [1.0, 1.0, 3.0]) == 2.0


def test_cpu_timer_needs_one_thread():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with pytest.raises(ValueError, match='one CPU thread'):
            interleaved_times({'a': lambda: None}, torch.device('cpu'), timer='cpu')
        torch.set_num_threads(1)
        times = interleaved_times({'a': lambda: sum(range(10000))}, torch.device('cpu'), repeats=2, timer='cpu')
        assert all(t > 0 for t in times['a'])
    finally:
        torch.set_num_threads(threads)


def test_smoke_run_writes_results_and_readme(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE='1')
    proc = subprocess.run([sys.executable, str(ROOT / 'benchmarks' / 'run.py'), '--smoke', '--out', str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = sorted(tmp_path.glob('cpu-*.json'))
    assert len(files) == 1 and files[0].name.startswith('cpu-smoke-')
    res = json.loads(files[0].read_text())
    for key in ('machine', 'settings', 'models', 'layers', 'conversion', 'goals', 'profiles', 'paper'):
        assert key in res, key
    assert res['machine']['torch'] == torch.__version__ and res['machine']['torch_threads'] >= 1
    (row,) = res['models']
    assert row['model'] == 'resnet18d' and row['size'] == 64
    assert set(row['inference']) == {'cnn', 'tcnn', 'tcnn_sdpa', 'tcnn_reference'}
    for mode in ('inference', 'train'):
        assert all(v['img_s'] > 0 for v in row[mode].values())
        assert set(row[mode + '_ratio']) == {'tcnn', 'tcnn_sdpa', 'tcnn_reference'}
    assert row['params']['tcnn'] > row['params']['cnn']
    assert row['gflops']['tcnn'] > row['gflops']['cnn'] > 0
    assert row['memory']['tcnn']['train']['peak_bytes'] > row['memory']['tcnn']['inference']['peak_bytes'] > 0
    assert {(r['grid'], r['stride']) for r in res['layers']} == {(4, 1), (4, 2)}
    for r in res['layers']:
        assert set(r['fwd']) == {'conv', 'gpsa', 'gpsa_sdpa', 'reference'}
        assert r['gflops']['reference'] > r['gflops']['gpsa']  # the reference attends at full resolution
    (conv,) = res['conversion']
    assert 0 < conv['seconds']['no_verify'] < conv['seconds']['verify'] and conv['max_rel_err'] < 1e-4
    names = {g['goal'] for g in res['goals']}
    assert {'inference img/s T-CNN / CNN', 'training step img/s T-CNN / CNN', 'peak training memory T-CNN / CNN',
            'forward FLOPs T-CNN / CNN', 'GPSA speed vs reference (forward)'} <= names
    assert all(isinstance(g['passed'], bool) for g in res['goals'])
    missed_speed = [g for g in res['goals'] if not g['passed'] and 'img/s' in g['goal']]
    assert len(res['profiles']) == len(missed_speed)
    readme = (tmp_path / 'README.md').read_text()
    assert 'resnet18d' in readme and '| goal |' in readme and res['machine']['cpu'] in readme
    glance = readme.split('## At a glance')[1].split('\n## ')[0]  # one row for the run, its goals counted
    met = sum(g['passed'] for g in res['goals'])
    assert f'[{files[0].stem}](#{files[0].stem})' in glance and f'{met} / {len(res["goals"])}' in glance


def test_rewriting_the_results_readme_keeps_its_hand_written_head_and_changes_nothing_else(tmp_path):
    """``benchmarks/results/README.md`` as committed is what ``write_readme`` writes from that folder's JSON files below
    its marker line, with its hand-written head (the files, the same-speed comparisons) above it: the next run's rewrite
    keeps the head, and no generated table was edited by hand."""
    from benchmarks import report
    results = ROOT / 'benchmarks' / 'results'
    shutil.copytree(results, tmp_path / 'results')
    report.write_readme(str(tmp_path / 'results'))
    committed = (results / 'README.md').read_text(encoding='utf-8')
    assert (tmp_path / 'results' / 'README.md').read_text(encoding='utf-8') == committed
    head = committed.split(report.GENERATED_BELOW)[0]
    assert '## The same speed after each refactor' in head and '## At a glance' not in head


def test_cli_rejects_bad_arguments(tmp_path):
    from benchmarks import run
    with pytest.raises(SystemExit):
        run.main(['--smoke', '--models', 'not_a_model', '--out', str(tmp_path)])
    with pytest.raises(SystemExit):
        run.main(['--smoke', '--timer', 'cpu', '--threads', '2', '--out', str(tmp_path)])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            run.main(['--smoke', '--device', 'cuda', '--out', str(tmp_path)])
    assert not list(tmp_path.iterdir())


def test_presets_and_options_make_the_settings_and_name_the_results():
    from benchmarks import run, report
    parser = run.build_parser()
    quick = run.make_settings(parser.parse_args(['--quick']), parser)
    assert quick.preset == 'quick' and quick.models == ['resnet50d', 'resnetrs50'] and quick.warmup == 1
    assert report.config_tag(quick) == 'cpu-quick'
    full = run.make_settings(parser.parse_args(['--timer', 'cpu', '--warmup', '0']), parser)
    assert full.preset == 'full' and full.models == run.FULL_MODELS and full.sizes == [224] and full.warmup == 0
    assert report.config_tag(full) == 'cpu-full-cputime'
    # Compiled functions compile on their first calls: those are never timed, whatever --warmup says.
    compiled = run.make_settings(parser.parse_args(['--smoke', '--compile', '--warmup', '1']), parser)
    assert compiled.warmup == run.COMPILE_WARMUP >= 2 and report.config_tag(compiled) == 'cpu-smoke-compile'
    # a mode other than the default names the results (runs of different modes never replace each other)
    graphs = run.make_settings(parser.parse_args(['--smoke', '--compile', 'reduce-overhead']), parser)
    assert graphs.compile == 'reduce-overhead' and report.config_tag(graphs) == 'cpu-smoke-compile-reduce-overhead'
    with pytest.raises(SystemExit):
        parser.parse_args(['--smoke', '--compile', 'fast'])
    # other models with their stages, under their own label (a preset's results are not replaced)
    other = run.make_settings(parser.parse_args(['--timer', 'cpu', '--models', 'resnext50_32x4d', 'convnext_tiny',
                                                 '--stages', 'convnext_tiny=stages.3', '--label', 'grouped']), parser)
    assert other.stages == {'convnext_tiny': ['stages.3']} and report.config_tag(other) == 'cpu-full-cputime-grouped'
    for bad in (['--models', 'convnext_tiny', '--stages', 'resnet50d=layer4'], ['--stages', 'resnet50d'],
                ['--label', 'a/b']):
        with pytest.raises(SystemExit):
            run.make_settings(parser.parse_args(bad), parser)


def test_batch_one_is_measured(tmp_path):
    """Inference at batch 1 (the latency case of issue 22) and the training step beside it: timed, paired, their
    memory measured, the misses profiled."""
    from benchmarks import run
    parser = run.build_parser()
    settings = run.make_settings(parser.parse_args(['--smoke', '--batch-size', '1', '--sections', 'models',
                                                    '--variants']), parser)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as run.py's --smoke: many-threaded first calls on a busy machine take minutes
    try:
        res = run.run(settings, str(tmp_path), 'python benchmarks/run.py --smoke --batch-size 1')
    finally:
        torch.set_num_threads(threads)
    (row,) = res['models']
    assert row['batch_size'] == 1 and set(row['inference']) == {'cnn', 'tcnn'}
    for mode in ('inference', 'train'):
        assert all(v['img_s'] > 0 for v in row[mode].values()) and row[mode + '_ratio']['tcnn'] > 0
        assert row['memory']['tcnn'][mode]['peak_bytes'] > row['memory']['tcnn'][mode]['baseline_bytes'] > 0
    assert all(p['batch_size'] == 1 for p in res['profiles'])


def test_cuda_graph_modes_start_a_step_before_each_compiled_call(monkeypatch):
    from benchmarks import suites
    marks = []
    monkeypatch.setattr(torch.compiler, 'cudagraph_mark_step_begin', lambda: marks.append(1))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 36, 3))
    x, y = torch.randn(2, 3, 8, 8), torch.tensor([0, 2])
    for mode, expected in (('default', 0), ('reduce-overhead', 2)):
        runner = suites.Runner(model, suites.Settings(compile=mode))
        runner.infer(x)
        runner.train_step(x, y)
        runner.train_step(x, y, eager=True)  # the memory measurement of a compiled CPU or CUDA-graph run
        assert len(marks) == expected, mode


def test_flops_at_the_papers_resolutions_match_its_table_2():
    from benchmarks import suites
    settings = suites.Settings(models=['resnetrs50'])
    models = suites.model_variants('resnetrs50', settings)
    got = suites._flops_at_paper_resolutions('resnetrs50', models, settings)
    assert abs(got['cnn'] - 4.6) / 4.6 < 0.02  # Table 2: ResNet50-RS, 4.6 GFLOPs at 160 px
    assert 9.0 < got['tcnn'] < 10.0  # ours at the paper's 224 px (the paper's T-ResNet50-RS: 17.6)
    assert suites._flops_at_paper_resolutions('resnet18d', models, settings) == {}


def test_depthwise_benchmark_runs_and_records_both_orders(tmp_path):
    import benchmarks.depthwise
    from tcnn.layers import depthwise
    out = tmp_path / 'dw.json'
    budget, threads = depthwise.CPU_CHUNK_ELEMENTS, torch.get_num_threads()
    try:
        assert benchmarks.depthwise.main(['--cases', 'efficientnet_b0:blocks.6', '--batch-size', '1', '--repeats',
                                          '1', '--warmup', '0', '--out', str(out)]) == 0
    finally:
        torch.set_num_threads(threads)  # main() measures one thread
    assert depthwise.CPU_CHUNK_ELEMENTS == budget  # the budget sweep leaves the default behind
    res = json.loads(out.read_text())
    assert [r['mode'] for r in res['rows']] == ['fwd', 'fwd_bwd'] and res['machine']['torch_threads'] == 1
    for r in res['rows']:
        assert set(r['ms']) == {'heads_first'} | {f'folded_{b}' for b in benchmarks.depthwise.BUDGETS}
        assert all(v > 0 for v in r['ms'].values()) and r['picked'] == 'heads_first'  # 3x3 at batch 1


def test_the_loop_benchmark_runs_end_to_end_in_smoke_mode(tmp_path):
    """benchmarks/loop.py --smoke end to end: photo-like JPEGs generated, tcnn train under torchrun (gloo on the CPU)
    for the T-CNN and its CNN on two data pipelines, the run's own throughput numbers in the JSON, named after the
    device and the backend."""
    env = dict(os.environ, HF_HUB_OFFLINE='1')
    out, runs, data = tmp_path / 'out', tmp_path / 'runs', tmp_path / 'data'
    proc = subprocess.run([sys.executable, str(ROOT / 'benchmarks' / 'loop.py'), '--smoke', '--out', str(out),
                           '--runs', str(runs), '--data', str(data), '--pipelines', 'pil', 'device'], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = out.glob('*.json')
    assert path.name.startswith('cpu-loop-gloo-')
    res = json.loads(path.read_text())
    for key in ('name', 'date', 'command', 'device', 'backend', 'machine', 'settings', 'data', 'runs', 'ratios',
                'definitions', 'tcnn_default_workers', 'wall_time_s'):
        assert key in res, key
    assert res['machine']['torch'] == torch.__version__ and res['backend'] == 'gloo' and res['device'] == 'cpu'
    assert res['data']['format'] == 'jpeg' and len(list(data.rglob('*.jpg'))) == 48 + 12
    assert res['data']['source'] == 'photos' and res['data']['mean_file_kib'] > 50  # ImageNet-size files
    assert [(r['pipeline'], r['variant']) for r in res['runs']] == [('pil', 'tcnn'), ('pil', 'cnn'),
                                                                     ('device', 'cnn'), ('device', 'tcnn')]
    for r in res['runs']:
        assert r['process_group'] == 'gloo' and r['state'] == 'finished' and r['workers'] == 2
        assert 'torchrun --standalone --nproc_per_node 1 -m tcnn.train' in r['command']
        assert ('--no-sa' in r['command']) == (r['variant'] == 'cnn')
        assert f'--data-pipeline {r["pipeline"]}' in r['command'] and r['gpu_utilisation'] is None
        assert r['step_img_per_s'] >= r['img_per_s'] > 0 and math.isfinite(r['step_img_per_s'])
        assert 0 <= r['data_wait'] < 1 and r['wall_s'] > 0
        assert r['step_img_per_s'] == pytest.approx(r['img_per_s'] / (1 - r['data_wait']))  # the documented identity
        last = r['epochs'][-1]
        assert last['train_images'] / last['img_per_s'] <= last['epoch_time_s']  # the loop is part of the epoch
        assert last['train_images'] == 48 and (runs / f'{r["variant"]}-{r["pipeline"]}-w2.log').is_file()
    assert [(r['pipeline'], r['workers']) for r in res['ratios']] == [('device', 2), ('pil', 2)]
    assert all(math.isfinite(r[k]) and r[k] > 0 for r in res['ratios'] for k in ('loop', 'step'))
    assert 'T-CNN / CNN, device pipeline, 2 workers' in proc.stdout


def test_first_calls_are_recorded_apart_from_the_timed_repeats():
    """``first_calls``: the wall time of each function's first warm-up call (with --compile, the compilation), which
    the timed repeats never include."""
    slow_first = {'a': True, 'b': True}

    def make(name):
        def fn():
            if slow_first[name]:
                slow_first[name] = False
                time.sleep(0.2)
        return fn
    first = {}
    times = interleaved_times({'a': make('a'), 'b': make('b')}, torch.device('cpu'), warmup=2, repeats=3,
                              first_calls=first)
    assert set(first) == {'a', 'b'} and all(v >= 0.2 for v in first.values())
    assert all(t < 0.1 for ts in times.values() for t in ts)
    none = {}
    interleaved_times({'a': lambda: None}, torch.device('cpu'), warmup=0, first_calls=none)
    assert none == {}  # no warm-up call, no first call to report


def test_a_stopped_run_keeps_the_rows_it_measured(tmp_path, monkeypatch):
    """run.py rewrites its JSON after each row (marked partial), so that a run stopped by a time limit (a rented
    GPU's minutes) keeps what it measured; a finished run's file is whole."""
    from benchmarks import report, run, suites
    parser = run.build_parser()
    settings = run.make_settings(parser.parse_args(['--smoke', '--batch-size', '1', '2', '--sections', 'models',
                                                    '--variants', '--no-profile']), parser)
    real, calls = suites._bench_case, []

    def stop_at_the_second_row(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # what a SIGINT or a time limit does to the run
        return real(*args, **kwargs)
    monkeypatch.setattr(suites, '_bench_case', stop_at_the_second_row)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.raises(KeyboardInterrupt):
            run.run(settings, str(tmp_path), 'python benchmarks/run.py --smoke --batch-size 1 2', profile=False)
        saved = json.loads((tmp_path / (report.result_name(settings) + '.json')).read_text())
        assert saved['partial'] is True and [r['batch_size'] for r in saved['models']] == [1]
        assert saved['goals'] and all('batch 2' not in g['subject'] for g in saved['goals'])
        assert 'PARTIAL' in report.render_result(saved).upper()
        monkeypatch.setattr(suites, '_bench_case', real)
        run.run(settings, str(tmp_path), 'python benchmarks/run.py --smoke --batch-size 1 2', profile=False)
    finally:
        torch.set_num_threads(threads)
    whole = json.loads((tmp_path / (report.result_name(settings) + '.json')).read_text())
    assert 'partial' not in whole and [r['batch_size'] for r in whole['models']] == [1, 2]


def test_the_commit_named_by_the_caller_comes_first(monkeypatch):
    """A rented GPU's copy of the tree may carry a .git naming an older commit: TCNN_GIT_COMMIT wins."""
    from benchmarks import report
    monkeypatch.setenv('TCNN_GIT_COMMIT', 'abc1234')
    assert report.machine_info(torch.device('cpu'))['git_commit'] == 'abc1234'
    monkeypatch.delenv('TCNN_GIT_COMMIT')
    commit = report.machine_info(torch.device('cpu'))['git_commit']
    if (ROOT / '.git').exists():
        head = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True)
        assert commit == head.stdout.strip()


def test_warm_compile_takes_run_options_and_one_function(tmp_path, capsys):
    from benchmarks import warm_compile
    for bad in (['--smoke', '--compile', '--only', 'cnn'], ['--smoke', '--compile', '--only', 'tcnn:backward'],
                ['--smoke', '--only', 'tcnn:train']):
        with pytest.raises(SystemExit):
            warm_compile.main(bad)
    assert 'expected cnn or tcnn' in capsys.readouterr().err


def test_the_paper_demos_time_is_estimated_from_epoch_times():
    """Phase 1: none, the paper plan fine-tunes the shipped converged CNNs; phase 2: 9 arms over the jobs (no-SA at
    the CNN's cost, the late arm half at each), each run's start-up added."""
    from benchmarks.demo_epoch import estimate_paper_demo
    est = estimate_paper_demo(cnn_epoch_s=2.0, t_cnn_epoch_s=3.0, startup_s=10.0, jobs=4)
    assert est['phase1_cnns_s'] == 0.0
    assert est['phase2_arms_s'] == (3 * (50 + 25) * 2.0 + 3 * (50 + 25) * 3.0 + 9 * 10.0) / 4
    assert est['total_s'] == est['phase1_cnns_s'] + est['phase2_arms_s']


def test_the_demo_epoch_benchmark_runs_end_to_end_on_the_tiny_plan(tmp_path):
    """benchmarks/demo_epoch.py end to end on the tiny plan: the demo's own CNN and T-CNN runs, their epoch times, the
    estimate (the code path of first.sh's last step)."""
    out = tmp_path / 'demo-epoch.json'
    proc = subprocess.run([sys.executable, str(ROOT / 'benchmarks' / 'demo_epoch.py'), '--smoke', '--jobs', '2',
                           '--seeds', '2', '--out', str(tmp_path / 'work'), '--json', str(out)],
                          cwd=tmp_path, env=dict(os.environ, HF_HUB_OFFLINE='1'), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert [r['run'] for r in res['runs']] == ['seed0-cnn', 'seed1-cnn', 'seed0-t-cnn', 'seed1-t-cnn']
    assert all(r['epochs'] == 1 and r['epoch_time_s'][0] > 0 for r in res['runs'])
    assert res['steady_epoch_s']['cnn'] > 0 and res['paper_demo_estimate']['total_s'] > 0
    assert (tmp_path / 'work' / 'models' / 'seed0-cnn.pt').is_file()  # the CNNs were exported for their arms
