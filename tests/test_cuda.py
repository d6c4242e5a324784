"""GPU tests (skipped without CUDA): conversion exactness on the GPU, bf16/fp16 autocast, `tcnn train` with AMP,
channels_last and torch.compile (CUDA graphs too), `tcnn eval` (also compiled) and `tcnn inspect` on cuda.

CI has no GPU, so these run only where CUDA is available (``python -m pytest tests/test_cuda.py -s`` prints the
measured errors). Every test restores the global TF32 switches it touches: ``tcnn train`` turns TF32 on for speed,
and an exactness test run after it would otherwise measure TF32 rounding.
"""
import contextlib
import json
import math
import os
from typing import Dict, Iterator

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from PIL import Image

import tcnn
from tcnn.train import launch
from tcnn.cli import main
from tcnn.layers.gpsa import GPSA

from helpers import rel_err
from nontrivial import varied_heads
from test_convert import _nontrivial_batchnorm
from test_eval import CLASSES, _class_folder, _rigged_tcnn
from test_train import common, metrics

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')

CUDA = torch.device('cuda')


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """TF32 for matmuls and cuDNN convolutions on or off inside the block; the previous switches afterwards."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


@pytest.fixture(autouse=True)
def restore_global_switches():
    # tcnn train sets TF32 and cudnn.benchmark for the whole process: keep them from leaking into the next test
    with tf32(torch.backends.cudnn.allow_tf32):
        benchmark = torch.backends.cudnn.benchmark
        yield
        torch.backends.cudnn.benchmark = benchmark


# ------------------------------------------------------------------------------------------------ exactness

@pytest.mark.parametrize('name', ['resnet18d', 'resnet50d'])
def test_conversion_exact_on_cuda_fp32_without_tf32(name):
    torch.manual_seed(0)
    cnn = _nontrivial_batchnorm(timm.create_model(name)).to(CUDA)
    with tf32(False):
        t_cnn = tcnn.reparameterize(cnn)  # verify=True on the GPU: raises above 1e-4
        report = t_cnn.tcnn_report
        assert report.float64_max_rel_err is None, report  # passed in float32, no float64 repeat needed
        assert report.max_rel_err < 1e-4, report
        errors = {'verify': report.max_rel_err}
        for size in [(3, 160, 160), (3, 97, 131)]:
            r = tcnn.check_equivalence(cnn, t_cnn, input_size=size, batch_size=4)
            assert r.max_rel_err < 1e-4 and r.init_max_rel_err > 1e-3, r
            errors[size[1:]] = r.max_rel_err
        # the GPU's exact T-CNN against the CPU's CNN: the same function on either device
        x = torch.randn(2, 3, 128, 128)
        with torch.no_grad(), tcnn.exact_configuration(t_cnn):
            gpu = t_cnn(x.to(CUDA))
        with torch.no_grad():
            cpu = cnn.cpu()(x)
        errors['gpu_tcnn_vs_cpu_cnn'] = rel_err(gpu, cpu)
        assert errors['gpu_tcnn_vs_cpu_cnn'] < 1e-4
    print(f'\n{name} cuda fp32 TF32 off, max rel logits error: ' +
          ', '.join(f'{k}: {v:.2e}' for k, v in errors.items()))


@pytest.mark.parametrize('name', ['resnet18d', 'resnet50d'])
def test_conversion_error_with_tf32_is_reported(name):
    """With TF32 the CNN's convs and the GPSA layers round differently; measure (and bound loosely) the gap."""
    torch.manual_seed(0)
    cnn = _nontrivial_batchnorm(timm.create_model(name)).to(CUDA)
    t_cnn = tcnn.reparameterize(cnn, verify=False)
    with tf32(True):
        r = tcnn.check_equivalence(cnn, t_cnn, input_size=(3, 160, 160), batch_size=4)
    with tf32(False):
        exact = tcnn.check_equivalence(cnn, t_cnn, input_size=(3, 160, 160), batch_size=4)
    print(f'\n{name} cuda fp32, max rel logits error: TF32 on {r.max_rel_err:.2e}, TF32 off {exact.max_rel_err:.2e}')
    assert math.isfinite(r.max_rel_err) and r.max_rel_err < 5e-2, r
    assert exact.max_rel_err < 1e-4


@pytest.mark.parametrize('stride, padding_mode', [(1, 'zeros'), (2, 'zeros'), (1, 'reflect'), (2, 'circular')])
@pytest.mark.parametrize('channels_last', [False, True])
@pytest.mark.parametrize('groups, out_chs', [(1, 48), (4, 48), (32, 64)], ids=['dense', 'grouped', 'depthwise-x2'])
def test_gpsa_layer_cuda_matches_cpu(stride, padding_mode, channels_last, groups, out_chs):
    """One layer far from the conv configuration (content attention matters): GPU == CPU in fp32 without TF32, and
    the output keeps the input's memory format."""
    torch.manual_seed(0)
    layer = GPSA(32, out_chs, stride=stride, padding_mode=padding_mode, groups=groups, locality_strength=0.7,
                 gating_init=0.3)
    with torch.no_grad():
        layer.q_weight.normal_(0, 0.3)
        layer.k_weight.normal_(0, 0.3)
    x = torch.randn(3, 32, 11, 9)
    gpu_layer = GPSA(32, out_chs, stride=stride, padding_mode=padding_mode, groups=groups).to(CUDA)
    gpu_layer.load_state_dict(layer.state_dict())
    xg = x.to(CUDA)
    if channels_last:
        xg = xg.contiguous(memory_format=torch.channels_last)
    with tf32(False), torch.no_grad():
        out = gpu_layer(xg)
        ref = layer(x)
    assert rel_err(out, ref) < 1e-5
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


@pytest.mark.parametrize('batch', [2, 32])
def test_folded_depthwise_layer_cuda_matches_cpu(batch):
    """A 7x7 depthwise layer (the folded product, one chunk on the GPU) far from the conv configuration: forward and
    gradients on the GPU equal the CPU's in fp32 without TF32; under bf16 autocast it runs in bf16 and stays close."""
    torch.manual_seed(0)
    layer = GPSA.from_conv(torch.nn.Conv2d(64, 64, 7, padding=3, groups=64, bias=True))
    with torch.no_grad():
        layer.q_weight.normal_(0, 0.3)
        layer.k_weight.normal_(0, 0.3)
        layer.gating.fill_(0.3)
        layer.pos_locality.fill_(0.2)
    gpu_layer = GPSA.from_conv(torch.nn.Conv2d(64, 64, 7, padding=3, groups=64, bias=True)).to(CUDA)
    gpu_layer.load_state_dict(layer.state_dict())
    x = torch.randn(batch, 64, 7, 7)
    grads = {}
    for name, module, inp in (('cpu', layer, x), ('cuda', gpu_layer, x.to(CUDA))):
        inp = inp.clone().requires_grad_(True)
        with tf32(False):
            out = module(inp)
            out.square().mean().backward()
        grads[name] = [out.detach().cpu(), inp.grad.cpu()] + [p.grad.cpu() for p in module.parameters()]
    for got, want in zip(grads['cuda'], grads['cpu']):
        assert rel_err(got, want) < 1e-4
    with torch.autocast('cuda', dtype=torch.bfloat16):
        low = gpu_layer(x.to(CUDA))
    assert low.dtype == torch.bfloat16 and rel_err(low.float().cpu(), grads['cpu'][0]) < 3e-2


# ------------------------------------------------------------------------------------------------ autocast

def _amp_vs_fp32(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, amp_dtype: torch.dtype):
    """Loss and gradients of one train-mode step in fp32 (TF32 off) and under autocast, same model and batch."""
    out = {}
    for dtype in (None, amp_dtype):
        model.zero_grad(set_to_none=True)
        with tf32(False), torch.autocast('cuda', dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        out[dtype] = (loss.detach().float(), {n: p.grad.detach().double() for n, p in model.named_parameters()})
    return out[None], out[amp_dtype]


def _grad_error(ref: Dict[str, torch.Tensor], amp: Dict[str, torch.Tensor], names) -> float:
    """Relative L2 error of the concatenated gradients of ``names``."""
    a = torch.cat([amp[n].flatten() for n in names])
    b = torch.cat([ref[n].flatten() for n in names])
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize('amp_dtype', [torch.bfloat16, torch.float16], ids=['bf16', 'fp16'])
def test_autocast_forward_backward_of_a_t_cnn(amp_dtype):
    """A T-CNN (paper init) in train mode, channels_last, under autocast: the loss is close to the fp32 one, every
    gradient is finite, and the gradients are no less accurate than those of its CNN under the same autocast.

    The yardstick is the CNN because a random 50-layer network's gradients are far from the fp32 ones in bf16 anyway
    (rounding amplified through the backward pass): an absolute bound would test the network, not the layer.
    """
    torch.manual_seed(0)
    cnn = _nontrivial_batchnorm(timm.create_model('resnet50d', num_classes=10))
    t_cnn = tcnn.reparameterize(cnn, verify=False)
    x = torch.randn(8, 3, 128, 128, device=CUDA).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (8,), device=CUDA)
    errors = {}
    for kind, model in (('cnn', cnn), ('tcnn', t_cnn)):
        model = model.to(CUDA).to(memory_format=torch.channels_last).train()
        (ref_loss, ref), (loss, amp) = _amp_vs_fp32(model, x, y, amp_dtype)
        assert loss.dtype == torch.float32 and torch.isfinite(loss)
        assert all(torch.isfinite(g).all() for g in amp.values()), [n for n, g in amp.items()
                                                                    if not torch.isfinite(g).all()]
        stage4 = [n for n in amp if n.startswith('layer4.')]
        errors[kind] = {'loss': abs(float(loss - ref_loss)) / abs(float(ref_loss)), 'grads': _grad_error(ref, amp, amp),
                        'layer4_grads': _grad_error(ref, amp, stage4)}
        if kind == 'tcnn':
            gpsa = [n for n in amp if any(n.startswith(layer + '.') for layer, _ in tcnn.gpsa_layers(model))]
            errors[kind]['gpsa_grads'] = _grad_error(ref, amp, gpsa)
    print(f'\n{amp_dtype} vs fp32 (relative errors): ' + '; '.join(
        f'{k}: ' + ', '.join(f'{m} {v:.2e}' for m, v in e.items()) for k, e in errors.items()))
    for kind in errors:
        assert errors[kind]['loss'] < 2e-2, errors
    assert errors['tcnn']['grads'] <= 2 * errors['cnn']['grads'] + 0.02, errors
    assert errors['tcnn']['layer4_grads'] <= 2 * errors['cnn']['layer4_grads'] + 0.05, errors


def test_gpsa_compiles_without_graph_breaks():
    """torch.compile(fullgraph=True) of a stride-2 GPSA layer, forward and backward, in bf16 autocast."""
    torch.manual_seed(0)
    layer = GPSA(64, 64, stride=2, locality_strength=0.7, gating_init=0.3).to(CUDA)
    compiled = torch.compile(layer, fullgraph=True, dynamic=False)
    x = torch.randn(4, 64, 14, 14, device=CUDA).contiguous(memory_format=torch.channels_last).requires_grad_(True)
    with tf32(False):
        with torch.autocast('cuda', dtype=torch.bfloat16):
            out_c = compiled(x)
        out_c.float().square().mean().backward()
        grad_c = x.grad.clone()
        x.grad = None
        with torch.autocast('cuda', dtype=torch.bfloat16):
            out_e = layer(x)
        out_e.float().square().mean().backward()
    assert out_c.shape == out_e.shape == (4, 64, 7, 7)
    assert rel_err(out_c, out_e) < 3e-2 and rel_err(grad_c, x.grad) < 5e-2


# ------------------------------------------------------------------------------------------------ commands

@pytest.fixture(scope='module')
def cnn_weights(tmp_path_factory):
    """A resnet18d whose every block reaches the logits (a random-init timm ResNet zeroes the last BN of each
    residual block, so its GPSA layers would change nothing and a training test would not test them)."""
    path = tmp_path_factory.mktemp('cnn') / 'resnet18d.pth'
    torch.save(_nontrivial_batchnorm(timm.create_model('resnet18d', num_classes=3)).state_dict(), path)
    return str(path)


def _gpsa_args(data_dir, run, cnn_weights, **kwargs):
    """``common``'s run on ``cnn_weights`` instead of a random init."""
    args = [a for a in common(data_dir, run, **kwargs) if a != '--no-pretrained']
    return args + ['--weights', cnn_weights]


def _assert_gpsa_trained(out, run):
    """The conversion was not vacuous and the GPSA layers' gates and localities moved in training."""
    assert 'verified exact configuration' in out and 'vacuous' not in out
    model = tcnn.load(str(run / 'last.pt'))
    for _, layer in tcnn.gpsa_layers(model):
        assert not torch.allclose(layer.gating, torch.ones_like(layer.gating))
        assert not torch.allclose(layer.pos_locality, layer.pos_locality[0].expand_as(layer.pos_locality))


@pytest.mark.parametrize('flags', [
    ['--amp', 'bf16', '--set', 'channels_last=true'],
    ['--amp', 'fp16', '--set', 'channels_last=true'],
    ['--amp', 'bf16', '--set', 'channels_last=true', '--compile'],
], ids=['bf16-channels_last', 'fp16-channels_last', 'bf16-channels_last-compile'])
def test_an_epoch_on_cuda_trains_the_gpsa_layers(data_dir, cnn_weights, tmp_path, capsys, flags):
    run = tmp_path / 'run'
    assert launch.main(_gpsa_args(data_dir, run, cnn_weights, epochs=1, device='cuda') + flags) == 0
    out = capsys.readouterr().out
    assert 'device cuda' in out
    _assert_gpsa_trained(out, run)
    (row,) = metrics(run)
    assert math.isfinite(row['train_loss']) and math.isfinite(row['val_loss'])
    assert row['train_images'] == 24 and row['val_images'] == 12
    model = tcnn.load(str(run / 'last.pt'))  # loads on the CPU: the checkpoint holds no CUDA-only state
    assert len(tcnn.gpsa_layers(model)) == 4
    assert all(torch.isfinite(p).all() for p in model.parameters())
    print(f'\n{" ".join(flags)}: train loss {row["train_loss"]:.4f}, val loss {row["val_loss"]:.4f}')


def test_cuda_graph_training_and_eval_match_eager(data_dir, cnn_weights, tmp_path, capsys):
    """``--compile reduce-overhead`` on cuda in bf16: CUDA graphs are recorded (no skip), 3 updates train to the
    eager run's losses, and ``tcnn eval --compile reduce-overhead`` scores the checkpoint as eager evaluation does
    (its last batch of 4 runs eagerly)."""
    from torch._dynamo.utils import counters
    counters.clear()
    rows = {}
    for mode in ([], ['--compile', 'reduce-overhead']):
        run = tmp_path / f'run{len(mode)}'
        args = _gpsa_args(data_dir, run, cnn_weights, epochs=1) + ['--device', 'cuda', '--amp', 'bf16',
                                                                    '--batch-size', '8', *mode]
        assert launch.main(args) == 0, capsys.readouterr().err
        _assert_gpsa_trained(capsys.readouterr().out, run)
        (rows[len(mode)],) = metrics(run)
    assert counters['inductor']['cudagraph_skips'] == 0, 'the compiled run fell back to launching kernels'
    eager, graphed = rows[0], rows[2]
    print(f'\neager / CUDA graphs: train loss {eager["train_loss"]:.5f} / {graphed["train_loss"]:.5f}, val loss '
          f'{eager["val_loss"]:.5f} / {graphed["val_loss"]:.5f}')
    assert graphed['train_loss'] == pytest.approx(eager['train_loss'], rel=2e-2)
    assert graphed['val_loss'] == pytest.approx(eager['val_loss'], rel=2e-2)
    results = {}
    for mode in ([], ['--compile', 'reduce-overhead']):
        out = tmp_path / f'eval{len(mode)}' / 'results.json'
        rc = main(['eval', str(tmp_path / 'run0' / 'last.pt'), '--suite', 'imagenet', '--data', f'{data_dir}/val',
                   '--img-size', '64', '--workers', '0', '--batch-size', '8', '--no-progress', '--device', 'cuda',
                   *mode, '--out', str(out)])
        assert rc == 0, capsys.readouterr().err
        (results[len(mode)],) = json.loads(out.read_text())['suites']['imagenet']['results'].values()
    assert (results[2]['top1'], results[2]['top5']) == (results[0]['top1'], results[0]['top5'])
    assert results[2]['num_images'] == 12


def test_eval_on_cuda_scores_the_known_accuracies_with_amp_and_compile(tmp_path, capsys):
    # 4 classes with 1, 2, 3, 4 images: a model always answering class k scores (k + 1) / 10 (as in test_eval)
    plan = [[c] * (i + 1) for i, c in enumerate(CLASSES.values())]
    _class_folder(str(tmp_path / 'val'), CLASSES, plan)
    paths = [tcnn.save(_rigged_tcnn(k), str(tmp_path / f'model{k}.pt')) for k in (0, 2)]
    for i, flags in enumerate(([], ['--amp'], ['--amp', '--compile', 'reduce-overhead'])):
        out = tmp_path / f'res{i}' / 'results.json'
        rc = main(['eval', *paths, '--suite', 'imagenet', '--data', str(tmp_path / 'val'), '--img-size', '32',
                   '--workers', '0', '--batch-size', '4', '--no-progress', '--device', 'cuda', *flags, '--out',
                   str(out)])
        assert rc == 0, capsys.readouterr().err
        results = json.loads(out.read_text())['suites']['imagenet']['results']
        assert results['model0']['top1'] == pytest.approx(10.0) and results['model2']['top1'] == pytest.approx(30.0)


def test_inspect_command_on_cuda_matches_cpu(tmp_path, capsys):
    torch.manual_seed(0)
    model = varied_heads(tcnn.reparameterize(timm.create_model('resnet18d', num_classes=5), verify=False).eval())
    path = tcnn.save(model, str(tmp_path / 't.pt'), data_config={'input_size': (3, 64, 64), 'crop_pct': 1.0})
    rng = np.random.default_rng(0)
    images = []
    for k in range(3):
        images.append(str(tmp_path / 'imgs' / f'img{k}.png'))
        os.makedirs(os.path.dirname(images[-1]), exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (80, 70, 3), dtype=np.uint8)).save(images[-1])
    summaries = {}
    with tf32(False):
        for device in ('cpu', 'cuda'):
            out = tmp_path / device
            rc = main(['inspect', path, '--image', images[1], '--images-dir', str(tmp_path / 'imgs'), '--query',
                       '10,50', '--device', device, '--out', str(out)])
            assert rc == 0, capsys.readouterr().err
            summaries[device] = json.loads((out / 'summary.json').read_text())
            assert (out / 'heads.png').exists() and (out / 'attention_img1.png').exists()
    cpu, gpu = summaries['cpu']['layers'], summaries['cuda']['layers']
    assert cpu.keys() == gpu.keys() and len(cpu) == 4
    for name in cpu:
        for key in ('gate', 'span', 'nonlocality'):
            assert gpu[name][key] == pytest.approx(cpu[name][key], rel=1e-4, abs=1e-6), (name, key)


def test_robustness_evaluate_on_cuda_and_cpu_agree(tmp_path):
    """scoring.evaluate of a CPU model on the GPU gives the same top-1 as on the CPU."""
    from tcnn.evaluation import scoring
    plan = [[c] * (i + 1) for i, c in enumerate(CLASSES.values())]
    _class_folder(str(tmp_path / 'val'), CLASSES, plan)
    model = _rigged_tcnn(2)
    results = {dev: scoring.evaluate({'m': model}, 'imagenet', str(tmp_path / 'val'), batch_size=4, workers=0,
                                     progress=False, img_size=32, device=dev)['m'] for dev in ('cpu', 'cuda')}
    assert results['cuda']['top1'] == pytest.approx(results['cpu']['top1']) == pytest.approx(30.0)


# ------------------------------------------------------------------------------------------------ data pipelines

def _jpegs():
    """Photo-like JPEGs of the kinds a dataset holds: 4:2:0 and 4:4:4 chroma, grayscale, progressive, odd sizes."""
    from test_data_pipeline import _jpeg, _photo
    img = _photo(120, 160)
    return [_jpeg(img, quality=90), _jpeg(img, quality=95, subsampling=0), _jpeg(img.convert('L')),
            _jpeg(img, progressive=True), _jpeg(_photo(77, 53, seed=3), quality=80)]


def test_batch_decoding_on_cuda_is_close_to_pillows_pixels():
    """nvjpeg's batch decode against libjpeg-turbo's (Pillow's): IDCT and chroma upsampling differ by a few levels;
    a file that fails fails alone."""
    from tcnn.data.decode import decode_batch
    from test_data_pipeline import _broken_huffman_table, _tensor
    files = _jpegs()
    payloads = [_tensor(f) for f in files]
    cpu, failed_cpu = decode_batch(payloads, 'cpu')
    gpu, failed_gpu = decode_batch(payloads, 'cuda')
    assert failed_cpu == failed_gpu == [], (failed_cpu, failed_gpu)
    measured = []  # every file's numbers first, so that a failure shows them all
    for kind, a, b in zip(('4:2:0 q90', '4:4:4 q95', 'grayscale', 'progressive', '77x53 q80'), cpu, gpu):
        assert b.device.type == 'cuda' and b.dtype == torch.uint8 and a.shape == b.shape, (kind, a.shape, b.shape)
        diff = (a.int() - b.cpu().int()).abs().float()
        measured.append((kind, round(float(diff.mean()), 3), int(diff.max())))
        print(f'\nnvjpeg vs Pillow {kind} {tuple(a.shape)}: mean {diff.mean():.3f}, max {diff.max():.0f} levels')
    assert all(mean < 1.0 and top <= 12 for _, mean, top in measured), measured
    images, failed = decode_batch([payloads[0], _tensor(_broken_huffman_table(files[0])), payloads[1]], 'cuda')
    assert failed == [1] and images[1] is None and images[0] is not None and images[2] is not None, (
        f'the file with an empty Huffman table: failed {failed}, decoded {[img is not None for img in images]}')


@pytest.mark.parametrize('setting', ['recipe', 'demo', 'hue'])
def test_batch_augment_on_cuda_matches_the_cpu(setting):
    """The same parameters on both devices: the pixel ops are the same integer arithmetic; resizes and affine ops go
    through float kernels whose rounding may differ (measured and printed)."""
    import random
    from tcnn.data.batch_augment import BatchAugment
    from test_data_pipeline import _photo
    from tcnn.data.decode import pil_to_tensor
    kwargs = {'recipe': dict(auto_augment='rand-m9-mstd0.5-inc1', re_prob=0.25, re_mode='const'),
              'demo': dict(auto_augment=None, color_jitter=0.3, scale=(1.0, 1.0)),
              'hue': dict(auto_augment=None, color_jitter=(0.3, 0.3, 0.3, 0.3), scale=(1.0, 1.0))}[setting]
    augment = BatchAugment(64, interpolation='bicubic', **kwargs)
    images = [pil_to_tensor(_photo(96 + 8 * (i % 3), 80 + 4 * (i % 5), seed=i)) for i in range(32)]
    params = augment.draw_many([(random.Random(i), tuple(img.shape[1:])) for i, img in enumerate(images)])
    cpu = augment(images, params)
    gpu = augment([img.cuda() for img in images], params)
    assert gpu.device.type == 'cuda' and gpu.shape == cpu.shape == (32, 3, 64, 64)
    levels = ((gpu.cpu() - cpu) * torch.tensor(augment.std).view(1, 3, 1, 1) * 255).abs()
    print(f'\n{setting}: cuda vs cpu, mean {levels.mean():.4f}, p99 {levels.flatten().quantile(0.99):.2f}, '
          f'max {levels.max():.1f} levels')
    assert levels.mean() < 0.25 and levels.flatten().quantile(0.99) <= 3


@pytest.mark.parametrize('pipeline', ['device', 'resident'])
def test_train_on_cuda_with_the_batched_pipelines(data_dir, cnn_weights, tmp_path, capsys, pipeline):
    run = tmp_path / 'run'
    args = _gpsa_args(data_dir, run, cnn_weights, epochs=2, device='cuda')
    assert launch.main(args + ['--amp', 'bf16', '--set', 'channels_last=true', '--workers', '2',
                                   '--data-pipeline', pipeline]) == 0
    out = capsys.readouterr().out
    assert f'data pipeline {pipeline} (asked for)' in out
    _assert_gpsa_trained(out, run)
    rows = metrics(run)
    assert len(rows) == 2 and all(math.isfinite(r['train_loss']) and math.isfinite(r['val_loss']) for r in rows)
    assert torch.load(run / 'last.pt', map_location='cpu', weights_only=True)['config']['data_pipeline'] == pipeline


def test_fsdp2_eval_after_an_in_place_edit_of_a_sharded_gate_is_fresh():
    """FSDP2 on CUDA (NCCL, one rank, an in-process store): the eval forward keeps each GPSA layer's gates and
    positional attention while its parameters are the same tensors at the same version and address
    (``tcnn.layers.kept_values``). FSDP2 all-gathers the unsharded parameters into storage that the caching allocator
    may give the same address again, keeping their version counters; an in-place edit of a sharded gate between two
    eval forwards must still reach the second one (the edited unsharded model's output)."""
    import copy
    from test_convert import _fully_shard
    dist, fully_shard = _fully_shard()
    torch.manual_seed(0)
    plain = torch.nn.Sequential(GPSA.from_conv(torch.nn.Conv2d(8, 8, 3, padding=1)), torch.nn.ReLU(),
                                GPSA.from_conv(torch.nn.Conv2d(8, 8, 3, padding=1))).cuda().eval()
    x = torch.randn(2, 8, 6, 6, device='cuda')
    dist.init_process_group('nccl', store=dist.HashStore(), rank=0, world_size=1)
    try:
        sharded = copy.deepcopy(plain)
        fully_shard(sharded)
        sharded.eval()
        with torch.no_grad():
            torch.testing.assert_close(sharded(x), plain(x), rtol=0, atol=0)
            sharded(x)  # kept from here on, if anything is
            for layer in (sharded[0], plain[0]):
                gating = layer.gating
                (gating.to_local() if hasattr(gating, 'to_local') else gating).add_(1.5)
            fresh = plain(x)
            out = sharded(x)
        assert rel_err(out, fresh) < 1e-6, 'the eval forward after the edit read gates kept from before it'
    finally:
        dist.destroy_process_group()


def test_a_cuda_graph_captured_beside_the_finishing_thread_replays_its_numbers():
    """``--compile reduce-overhead`` records CUDA graphs (``capture_error_mode='thread_local'``, as torch's CUDA graph
    trees do) while the batched pipelines' thread allocates and launches on its own stream
    (``tcnn.data.prefetch``): the capture succeeds and every replay computes what the eager op does, and the
    thread's batches arrive whole and in order."""
    from tcnn.data.prefetch import FinishedAhead
    device = torch.device('cuda', torch.cuda.current_device())

    def finish(i):
        x = torch.arange(64 * 3 * 96 * 96, device=device, dtype=torch.float32).view(64, 3, 96, 96) * i
        return (x * 2) * 0.5, torch.full((64,), i, device=device)

    ahead = FinishedAhead(iter(range(40)), finish, device, depth=2)
    weight = torch.randn(256, 256, device=device)
    static_in = torch.randn(8, 256, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graph's docs ask
        static_in @ weight
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode='thread_local'):
        static_out = static_in @ weight
    for i, (images, labels) in enumerate(ahead):
        new = torch.randn(8, 256, device=device)
        static_in.copy_(new)
        graph.replay()
        torch.testing.assert_close(static_out, new @ weight)
        assert int(labels[0]) == i and float(images[1, 2, 3, 4]) == float(i * (((1 * 3 + 2) * 96 + 3) * 96 + 4))
    assert i == 39


def test_erasing_noise_on_cuda_is_drawn_there():
    """The random erasing's noise on a GPU: each image's generator and draws on the images' device (a CPU generator
    or draw there fails), the same numbers as a CUDA generator seeded alike."""
    from tcnn.data.batch_misc import erase
    images = torch.zeros(2, 3, 16, 16, device='cuda')
    erase(images, [[(1, 2, 5, 6)], [(0, 0, 16, 16)]], [7, 8], 'pixel')
    g = torch.Generator(device='cuda').manual_seed(7)
    assert torch.equal(images[0, :, 1:6, 2:8], torch.randn((3, 5, 6), generator=g, device='cuda'))


def test_resize_and_normalize_on_cuda_match_the_cpu():
    """``batch_geometry.resize`` on a GPU (the float passes; nearest picks Pillow's pixels with indices moved there)
    within a level of the CPU's, and ``normalize``'s floats equal to the CPU's (mean and std moved there)."""
    from tcnn.data import batch_geometry, batch_misc
    images = torch.randint(0, 256, (3, 3, 41, 29), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    for interpolation in batch_geometry.INTERPOLATIONS:
        gpu = batch_geometry.resize(images.cuda(), (17, 23), interpolation)
        cpu = batch_geometry.resize(images, (17, 23), interpolation)
        assert gpu.device.type == 'cuda' and (gpu.cpu().int() - cpu.int()).abs().max() <= (
            0 if interpolation == 'nearest' else 1), interpolation
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    assert torch.equal(batch_misc.normalize(images.cuda(), mean, std).cpu(), batch_misc.normalize(images, mean, std))


def test_nearest_affine_on_cuda_is_the_cpus():
    """Pillow's nearest affine transform (the scale/translation running sums and the 16.16 fixed point) on a GPU:
    the same pixels as on the CPU, the coordinates made on the images' device; a bilinear image among them (each
    resample's images gathered on the device) within a level."""
    from tcnn.data import batch_geometry
    images = torch.randint(0, 256, (3, 3, 21, 17), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    matrix = torch.tensor([[1.0, 0.2, 0.5, 0.1, 1.0, 0.3], [1.0, 0.0, 2.5, 0.0, 1.0, -3.0],
                           [0.9, -0.3, 4.0, 0.3, 0.9, -2.0]])
    codes = torch.tensor([batch_geometry.NEAREST, batch_geometry.BILINEAR, batch_geometry.NEAREST])
    gpu = batch_geometry.affine(images.cuda(), matrix.cuda(), (124, 116, 104), codes.cuda())
    cpu = batch_geometry.affine(images, matrix, (124, 116, 104), codes)
    assert gpu.device.type == 'cuda' and torch.equal(gpu[[0, 2]].cpu(), cpu[[0, 2]])
    assert (gpu[1].cpu().int() - cpu[1].int()).abs().max() <= 1
