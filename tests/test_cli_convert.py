"""``tcnn convert`` and ``tcnn info`` end to end (in-process through ``tcnn.cli.main``; the offline failure in a
fresh process, as a user meets it)."""
import json
import os
import subprocess
import sys
import time

import pytest
import timm
import torch

import tcnn
from tcnn.cli import main
from tcnn.files.sources import create_cnn

from helpers import images, write_partial


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope='module')
def cnn_checkpoint(tmp_path_factory):
    """A resnet18d checkpoint as training scripts write them: wrapped, DDP prefixes; every residual branch live."""
    torch.manual_seed(0)
    cnn = timm.create_model('resnet18d', zero_init_last=False).eval()
    with torch.no_grad():
        for m in cnn.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp('ckpt') / 'resnet18d.pth'
    torch.save({'state_dict': {f'module.{k}': v for k, v in cnn.state_dict().items()}, 'epoch': 90}, path)
    return cnn, str(path)


def test_convert_without_pretrained_weights_writes_a_verified_t_cnn(tmp_path, capsys):
    out_path = str(tmp_path / 't_resnet18d.pt')
    rc, out, err = _run(['convert', 'resnet18d', '--no-pretrained', '--out', out_path, '--img-size', '64'], capsys)
    assert rc == 0, err
    for text in ('random init', '4 convs in layer4', 'layer4.0.conv1: 256->512, 3x3, stride 2 -> 9 heads',
                 'parameters', 'verified    exact configuration', 'on 2x3x64x64 logits', 'saved'):
        assert text in out, (text, out)
    model = tcnn.load(out_path)
    assert [n for n, _ in tcnn.gpsa_layers(model)] == ['layer4.0.conv1', 'layer4.0.conv2', 'layer4.1.conv1',
                                                       'layer4.1.conv2']
    assert os.listdir(tmp_path) == ['t_resnet18d.pt']


def test_convert_of_a_checkpoint_at_the_exact_init_computes_its_logits(cnn_checkpoint, tmp_path, capsys):
    """--weights with the exact init: the file's T-CNN computes the checkpoint's logits."""
    cnn, ckpt = cnn_checkpoint
    out_path = str(tmp_path / 't.safetensors')
    rc, out, err = _run(['convert', 'resnet18d', '--weights', ckpt, '--out', out_path, '--img-size', '64',
                         '--locality-strength', '50', '--gating-init', '25'], capsys)
    assert rc == 0, err
    assert f'weights {ckpt}' in out and 'within tolerance' in out and 'note' not in out
    model = tcnn.load(out_path)
    conv = cnn.layer4[0].conv2
    torch.testing.assert_close(model.layer4[0].conv2.conv_filter(), conv.weight)
    with torch.no_grad():
        torch.testing.assert_close(model(images()), cnn(images()), rtol=1e-4, atol=1e-4)


def test_convert_at_the_papers_init_reports_the_deviation_and_keeps_the_flags(cnn_checkpoint, tmp_path, capsys):
    """The default init (alpha = lambda = 1) is verified in the exact configuration, then reported as a deviation;
    --stages, --qk-dim and --num-classes reach the file."""
    cnn, ckpt = cnn_checkpoint
    out_path = str(tmp_path / 't.pt')
    rc, out, err = _run(['convert', 'resnet18d', '--weights', ckpt, '--out', out_path, '--img-size', '64x80',
                         '--stages', '3', 'layer4', '--qk-dim', '8', '--num-classes', '10'], capsys)
    assert rc == 0, err
    assert '8 convs in layer3, layer4' in out and 'departs from the CNN' in out and '2x3x64x80' in out
    d = tcnn.files.tcnn_file.read(out_path)
    assert d['conversion']['stages'] == ['layer3', 'layer4'] and d['conversion']['qk_dim'] == 8
    assert d['num_classes'] == 10
    assert d['source'] == {'model': 'resnet18d', 'kwargs': {}, 'weights': 'file:resnet18d.pth'}
    model = tcnn.load(out_path)
    gate = torch.sigmoid(torch.tensor(1.0)).item()
    assert all(g == pytest.approx(gate) for layer in tcnn.gpsa_summary(model).values() for g in layer['gate'])
    torch.testing.assert_close(model.layer3[0].conv1.conv_filter(), cnn.layer3[0].conv1.weight)


def test_convert_vacuous_check_is_flagged(tmp_path, capsys):
    """A random-init timm ResNet zero-initialises its last BNs: the check cannot see the GPSA layers; say so."""
    rc, out, err = _run(['convert', 'resnet18d', '--no-pretrained', '--out', str(tmp_path / 'a.pt'),
                         '--img-size', '64'], capsys)
    assert rc == 0 and 'cannot catch a wrong conversion' in out


def test_info_prints_a_files_settings_parameters_and_heads(cnn_checkpoint, tmp_path, capsys):
    _, ckpt = cnn_checkpoint
    out_path = str(tmp_path / 't.pt')
    assert _run(['convert', 'resnet18d', '--weights', ckpt, '--out', out_path, '--no-verify'], capsys)[0] == 0
    rc, out, err = _run(['info', out_path], capsys)
    assert rc == 0, err
    cnn_params = sum(p.numel() for p in create_cnn('resnet18d', pretrained=False).parameters())
    t_params = sum(p.numel() for p in tcnn.load(out_path).parameters())
    for text in ('format tcnn v2', 'source      resnet18d, 1000 classes', 'layer4: 4 GPSA layers',
                 f'{t_params / 1e6:.2f}M (CNN {cnn_params / 1e6:.2f}M', 'layer4.1.conv2', '0.731 [0.731-0.731]'):
        assert text in out, (text, out)
    rc, out, _ = _run(['info', out_path, '--json'], capsys)
    info = json.loads(out)
    assert info['parameters'] == {'total': t_params, 'cnn': cnn_params, 'self_attention': t_params - cnn_params}
    assert list(info['layers']) == [n for n, _ in tcnn.gpsa_layers(tcnn.load(out_path))]
    rc, out, _ = _run(['info', out_path, '--heads'], capsys)
    assert out.count('head 8:') == 4
    # a training checkpoint holding the model
    ckpt_path = tmp_path / 'last.pt'
    model_file = tcnn.files.tcnn_file.model_to_dict(tcnn.load(out_path))
    torch.save({'model_file': model_file, 'epoch': 4, 'best_top1': 12.5}, ckpt_path)
    rc, out, _ = _run(['info', str(ckpt_path)], capsys)
    assert rc == 0 and 'training    after epoch 5, best_top1 12.5' in out  # counted from 1, as the console


def test_offline_fails_fast_with_one_line(tmp_path):
    """A fresh process, no network, empty caches: exit 2 within seconds, one line naming the two flags."""
    env = dict(os.environ, HF_HUB_OFFLINE='1', HF_HOME=str(tmp_path / 'hf'), TORCH_HOME=str(tmp_path / 'torch'),
               XDG_CACHE_HOME=str(tmp_path / 'cache'))
    out_path = tmp_path / 'out' / 'model.pt'
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, '-m', 'tcnn', 'convert', 'resnet50d', '--out', str(out_path)],
                          env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1000:], proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('tcnn convert: error:'), proc.stderr
    assert '--weights' in lines[0] and '--no-pretrained' in lines[0] and 'Traceback' not in proc.stderr
    assert elapsed < 30, elapsed  # timm alone retries ~50 s; most of this is the interpreter start on a busy CI box
    assert not out_path.exists() and not out_path.parent.exists()


@pytest.mark.parametrize('argv, message', [
    (['resnet18d', '--no-pretrained', '--out', 'model.bin'], 'the extension must be one of .pt, .pth, .safetensors'),
    (['resnt18d', '--no-pretrained', '--out', 'model.pt'], 'did you mean: resnet18d'),
    (['torchvision:resnet17', '--no-pretrained', '--out', 'model.pt'], "unknown torchvision model 'resnet17'"),
    (['vit_tiny_patch16_224', '--no-pretrained', '--out', 'model.pt'], 'searched for layer1, layer2, layer3, layer4'),
    (['resnet18d', '--no-pretrained', '--out', 'model.pt', '--stages', 'layer9'], "no submodule 'layer9'"),
    (['convnext_atto', '--no-pretrained', '--out', 'model.pt', '--stages', 'stage3'],
     "no submodule 'stage3'; stages of convnext_atto: stages.0, stages.1, stages.2, stages.3"),
    (['convnext_atto', '--no-pretrained', '--out', 'model.pt', '--stages', 'stages.3.*.conv_pw'],
     "no module of convnext_atto matches 'stages.3.*.conv_pw'; stages of convnext_atto: stages.0"),
    (['convnext_atto', '--no-pretrained', '--out', 'model.pt', '--stages', '5'],
     'no stage at level 5 (an int i is the resolution 1/2**(i+1) of the input'),
    (['tf_efficientnet_b0', '--no-pretrained', '--out', 'model.pt', '--stages', 'blocks.5'],
     'cannot reproduce blocks.5.0.conv_dw exactly: Conv2dSame'),
    (['convnext_atto', '--no-pretrained'], '--out FILE is required (or --list-stages'),
    (['--list-stages', 'resnt18d'], 'did you mean: resnet18d'),
    (['--list-stages', 'resnet18d', '--img-size', '8x'], '--img-size takes N or HxW'),
    (['--list-stages', 'convnext_atto', '--img-size', '2'], 'input_size (3, 2, 2) does not fit convnext_atto'),
    (['resnet18d', '--no-pretrained', '--out', 'model.pt', '--img-size', 'big'], '--img-size takes N or HxW'),
    (['resnet18d', '--weights', 'missing.pth', '--out', 'model.pt'], 'weights file not found: missing.pth'),
    (['t_resnet18d', '--no-pretrained', '--out', 'model.pt'], 'tcnn convert resnet18d'),
])
def test_user_mistakes_are_one_line_errors(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    rc, out, err = _run(['convert', *argv], capsys)
    assert rc == 2 and out == ''
    assert err.count('\n') == 1 and err.startswith('tcnn convert: error:') and message in err, err
    assert os.listdir(tmp_path) == []


def test_failed_write_leaves_previous_file(tmp_path, monkeypatch, capsys):
    out_path = tmp_path / 'model.pt'
    out_path.write_bytes(b'previous')

    def failing_save(obj, f, *args, **kwargs):
        write_partial(f, b'partial')
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(torch, 'save', failing_save)
    rc, _, err = _run(['convert', 'resnet18d', '--no-pretrained', '--no-verify', '--out', str(out_path)], capsys)
    assert rc == 2 and 'No space left on device' in err
    assert out_path.read_bytes() == b'previous' and os.listdir(tmp_path) == ['model.pt']


def test_conversion_without_verification_runs_no_forward_pass():
    """Converting without verification is a copy and a few GEMM-free parameter loads (0.3 s for resnet50d on 2 cores):
    no forward pass of the CNN or of the T-CNN. The time bound is only a guard against a hang on a busy machine; speed
    goals live in benchmarks/."""
    cnn = create_cnn('resnet50d', pretrained=False)
    calls = []
    cnn.register_forward_pre_hook(lambda module, args: calls.append(module))
    start = time.perf_counter()
    model = tcnn.reparameterize(cnn, verify=False)
    assert time.perf_counter() - start < 30
    assert not calls and tcnn.gpsa_layers(model)
    model(torch.randn(1, 3, 64, 64))  # the hook is still there: it would have seen a forward pass
    assert len(calls) == 1


def test_convert_keeps_the_checkpoint_head(tmp_path, capsys):
    """A 10-class checkpoint wrapped as {'state_dict': ...} gives a 10-class T-CNN with its head; --num-classes that
    drops it says so in one line; --use-ema reads the EMA weights beside the raw ones."""
    torch.manual_seed(0)
    raw, ema = timm.create_model('resnet18d', num_classes=10), timm.create_model('resnet18d', num_classes=10)
    ckpt = tmp_path / 'r18d_10.pth'
    torch.save({'state_dict': raw.state_dict(), 'state_dict_ema': ema.state_dict(), 'epoch': 9}, ckpt)
    out_path = str(tmp_path / 't.pt')
    rc, out, err = _run(['convert', 'resnet18d', '--weights', str(ckpt), '--out', out_path, '--img-size', '64'], capsys)
    assert rc == 0, err
    assert '10 classes' in out and 'warning' not in err
    model = tcnn.load(out_path)
    assert model.num_classes == 10 and torch.equal(model.fc.weight, raw.fc.weight)
    rc, out, err = _run(['convert', 'resnet18d', '--weights', str(ckpt), '--use-ema', '--out', out_path,
                         '--img-size', '64'], capsys)
    assert rc == 0, err
    assert torch.equal(tcnn.load(out_path).fc.weight, ema.fc.weight)
    with pytest.warns(UserWarning) as record:  # the command prints it as one line, 'tcnn: warning: ...'
        rc, out, err = _run(['convert', 'resnet18d', '--weights', str(ckpt), '--num-classes', '4', '--out', out_path,
                             '--img-size', '64', '--no-verify'], capsys)
    assert rc == 0 and '4 classes' in out
    messages = [str(w.message) for w in record if 'head' in str(w.message)]
    assert len(messages) == 1 and "'fc' (10 classes) is dropped" in messages[0] and '\n' not in messages[0]
    # --use-ema without EMA weights, or without --weights: one line each
    torch.save({'state_dict': raw.state_dict()}, tmp_path / 'plain.pth')
    for argv, message in ((['--weights', str(tmp_path / 'plain.pth'), '--use-ema'], 'no EMA weights'),
                          (['--no-pretrained', '--use-ema'], '--use-ema reads the EMA weights')):
        rc, out, err = _run(['convert', 'resnet18d', *argv, '--out', out_path], capsys)
        assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
