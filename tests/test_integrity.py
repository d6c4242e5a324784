"""Weights that went bad and weights from timm's own tools (issue 31, items 2 and 6).

* tcnn's own files (T-CNN ``.pt``/``.safetensors`` files, training checkpoints, Hub folders of ``tcnn publish``)
  carry per-tensor checksums that loading checks: a byte flipped inside a stored tensor (torch.load and safetensors
  read it without a word, and the logits stay finite) is named; files without checksums (tcnn 0.3.x) still load.
* Non-finite logits are an error of ``tcnn eval`` naming the parameters that hold non-finite values.
* Checkpoints of timm's train.py (``args`` is an ``argparse.Namespace``) load with weights-only loading; any other
  pickled class is still refused (and its payload never runs). A T-CNN's state dict gets a way in:
  ``tcnn convert t_MODEL --weights SD --out FILE``, which the messages spell out.
"""
import argparse
import json
import os
import shutil

import pytest
import timm
import torch

import tcnn
from imagegen import make_image_folder
from nontrivial import nontrivial
from tcnn.files import tcnn_file as tio
from tcnn.files.hub_folder import HUB_CHECKSUMS_KEY
from tcnn.files import run_folder
from tcnn.cli import main
from tcnn.errors import TcnnError
from tcnn.files.integrity import CorruptFileError, tensor_checksums

TENSOR = 'layer4.0.conv2.proj_weight'


@pytest.fixture(scope='module', autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small models on a shared 2-core machine
    yield
    torch.set_num_threads(threads)


def _x() -> torch.Tensor:
    return torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope='module')
def t_model() -> torch.nn.Module:
    """A fine-tuned-looking t_resnet18d: non-default qk_dim, moved gates and localities, random BN statistics."""
    torch.manual_seed(0)
    model = nontrivial(timm.create_model('t_resnet18d', num_classes=5, qk_dim=16, zero_init_last=False))
    with torch.no_grad():
        for _, layer in tcnn.gpsa_layers(model):
            layer.gating.add_(torch.linspace(-1, 1, layer.gating.numel()))
            layer.pos_locality.add_(0.5)
    return model.eval()


def _flip(path: str, tensor: torch.Tensor, element: int = 100) -> None:
    """Flip the lowest bit of one float32 element of ``tensor`` where the file stores it (found by its bytes: a
    safetensors data region or an uncompressed ``archive/data/N`` zip entry); the value moves by ~1e-7 relative."""
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    data = bytearray(open(path, 'rb').read())
    start = data.find(raw)
    assert start >= 0 and data.count(raw[:256]) == 1, 'the tensor is stored once, as is'
    data[start + 4 * element] ^= 0x01
    with open(path, 'wb') as f:
        f.write(data)


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert '\n' not in text
    return text


# ---------------------------------------------------------------------------------------------- checksums


@pytest.mark.parametrize('ext', ['.pt', '.safetensors'])
def test_a_flipped_byte_in_a_t_cnn_file_is_named(t_model, tmp_path, ext):
    path = str(tmp_path / f't{ext}')
    tcnn.save(t_model, path)
    assert torch.equal(tcnn.load(path)(_x()), t_model(_x()))
    _flip(path, t_model.state_dict()[TENSOR])
    with pytest.raises(CorruptFileError) as e:
        tcnn.load(path)
    assert _one_line(e) == (f'{path}: the tensor {TENSOR} does not match its checksum: the file is corrupt '
                            '(re-download or re-save it)')


def test_files_without_checksums_still_load(t_model, tmp_path):
    """Files of tcnn 0.3.x hold no checksums: loaded unchecked, no error."""
    path = str(tmp_path / 'old.pt')
    d = tio.model_to_dict(t_model)
    assert tio.CHECKSUMS_KEY not in d
    torch.save(d, path)
    assert torch.equal(tcnn.load(path)(_x()), t_model(_x()))
    old = str(tmp_path / 'old.safetensors')
    tcnn.save(t_model, old)
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open
    with safe_open(old, 'pt') as f:
        settings = json.loads(f.metadata()['tcnn'])
    settings.pop(tio.CHECKSUMS_KEY)
    save_file(load_file(old), old, metadata={'format': 'pt', 'tcnn': json.dumps(settings)})
    assert torch.equal(tcnn.load(old)(_x()), t_model(_x()))


def test_a_flipped_byte_in_a_training_checkpoint_is_named(t_model, tmp_path):
    ema = timm.create_model('t_resnet18d', num_classes=5, qk_dim=16)
    ema.load_state_dict({k: v + 0.01 if v.is_floating_point() else v for k, v in t_model.state_dict().items()})
    path = str(tmp_path / 'last.pt')
    run_folder.write_checkpoint(run_folder.make_checkpoint(t_model, ema=ema.state_dict(), epoch=2), path)
    assert torch.equal(tcnn.load(path)(_x()), t_model(_x()))
    _flip(path, ema.state_dict()[TENSOR])
    assert torch.equal(tcnn.load(path)(_x()), t_model(_x()))  # the raw weights are whole
    with pytest.raises(CorruptFileError) as e:
        tcnn.load(path, ema=True)
    assert _one_line(e) == (f'{path} (its EMA weights): the tensor {TENSOR} does not match its checksum: the file '
                            'is corrupt (re-download or re-save it)')
    with pytest.raises(CorruptFileError):  # resuming reads the whole checkpoint
        run_folder.read_checkpoint(path)
    run_folder.write_checkpoint(run_folder.make_checkpoint(t_model, ema=ema.state_dict(), epoch=2), path)
    _flip(path, t_model.state_dict()[TENSOR])
    with pytest.raises(CorruptFileError, match=f'{path}: the tensor {TENSOR} does not match its checksum'):
        tcnn.load(path)


@pytest.fixture(scope='module')
def published(t_model, tmp_path_factory) -> str:
    """The Hub folder that ``tcnn publish`` writes of ``t_model``."""
    root = tmp_path_factory.mktemp('published')
    path = str(root / 't.pt')
    tcnn.save(t_model, path)
    assert main(['publish', path, '--out', str(root / 'hub')]) == 0
    return str(root / 'hub')


def test_a_flipped_byte_in_a_published_folder_is_named(t_model, published, tmp_path):
    out = str(tmp_path / 'hub')
    shutil.copytree(published, out)
    weights = os.path.join(out, 'model.safetensors')
    from safetensors import safe_open
    with safe_open(weights, 'pt') as f:
        assert json.loads(f.metadata()[HUB_CHECKSUMS_KEY]) == json.loads(json.dumps(
            tensor_checksums(t_model.state_dict())))
    assert torch.equal(tcnn.load(out)(_x()), t_model(_x()))
    _flip(weights, t_model.state_dict()[TENSOR])
    message = f'{weights}: the tensor {TENSOR} does not match its checksum: the file is corrupt'
    with pytest.raises(TcnnError, match=message):
        tcnn.load(out)
    with pytest.raises(CorruptFileError, match=message):  # timm's own loader goes through tcnn.models.create
        timm.create_model(f'local-dir:{out}', pretrained=True)


def test_checksum_names_several_tensors_and_lost_ones(t_model):
    sd = t_model.state_dict()
    checksums = tensor_checksums(sd)
    bad = dict(sd, **{'fc.bias': sd['fc.bias'] + 1, TENSOR: sd[TENSOR] * 2})
    with pytest.raises(CorruptFileError, match=r'w: 2 tensors do not match their checksums \(layer4.0.conv2'):
        tcnn.files.integrity.verify_checksums(bad, checksums, 'w')
    with pytest.raises(CorruptFileError, match='missing fc.bias'):
        tcnn.files.integrity.verify_checksums({k: v for k, v in sd.items() if k != 'fc.bias'}, checksums, 'w')


# ---------------------------------------------------------------------------------------------- non-finite logits


def test_nan_weights_are_an_eval_error_naming_them(t_model, tmp_path, capsys):
    model = timm.create_model('t_resnet18d', num_classes=3)
    with torch.no_grad():
        model.get_parameter(TENSOR).view(-1)[:3] = float('nan')
        model.get_parameter('layer4.1.conv1.gating')[0] = float('nan')
    path = str(tmp_path / 't.pt')
    tcnn.save(model, path)
    data = os.path.join(make_image_folder(str(tmp_path / 'images'), 3, 0, 2, size=40), 'val')
    capsys.readouterr()
    rc = main(['eval', path, '--suite', 'imagenet', '--data', data, '--img-size', '32', '--workers', '0',
               '--no-progress'])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count('\n') == 0, err
    assert (f'{path} computes non-finite logits (NaN) on 6 of 6 images: 2 of its parameters hold non-finite values '
            f'({TENSOR}, layer4.1.conv1.gating)') in err


# ---------------------------------------------------------------------------------------------- timm's train.py


def _train_args(model: str, **extra) -> argparse.Namespace:
    """What timm's train.py stores as 'args': its parsed flags (strings, numbers, lists, tuples, None, bools, dicts)."""
    return argparse.Namespace(
        data='/data/imagenet', data_dir='/data/imagenet', dataset='', train_split='train', model=model,
        pretrained=True, initial_checkpoint='', resume='', num_classes=5, img_size=64, input_size=None,
        crop_pct=None, mean=None, std=None, interpolation='', batch_size=32, opt='adamw', opt_eps=None,
        opt_betas=(0.9, 0.999), momentum=0.9, weight_decay=0.05, lr=None, lr_base=5e-4, lr_base_size=256,
        sched='cosine', epochs=3, decay_milestones=[90, 180, 270], warmup_epochs=0, model_kwargs=extra,
        amp=True, model_ema=True, model_ema_decay=0.9998, prefetcher=True, distributed=False, world_size=1, rank=0,
        grad_accum_steps=1, device='cpu', drop_path=None, smoothing=0.1, mixup=0.0, aa=None, seed=42)


def _train_checkpoint(model: torch.nn.Module, arch: str, path: str, **model_kwargs) -> None:
    """A checkpoint as timm's CheckpointSaver writes it."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    model(_x()).sum().backward()
    optimizer.step()
    model.eval()
    torch.save({'epoch': 2, 'arch': arch, 'optimizer': optimizer.state_dict(), 'version': 2,
                'args': _train_args(arch, **model_kwargs), 'amp_scaler': {'scale': 65536.0, 'growth_factor': 2.0},
                'state_dict': model.state_dict(), 'state_dict_ema': model.state_dict(), 'metric': 41.5,
                'saver': {'checkpoint_files': [('checkpoint-1.pth.tar', 40.0)], 'best_epoch': 1,
                          'best_metric': 40.0, 'pending': (2, 41.5)}}, path)


def test_timm_train_checkpoints_of_a_cnn_load(tmp_path, capsys):
    torch.manual_seed(0)
    cnn = nontrivial(timm.create_model('resnet18d', num_classes=5, zero_init_last=False))
    path = str(tmp_path / 'model_best.pth.tar')
    _train_checkpoint(cnn, 'resnet18d', path)
    assert torch.equal(tcnn.load(path)(_x()), cnn(_x()))
    assert torch.equal(tcnn.files.sources.create_cnn('resnet18d', weights=path).eval()(_x()), cnn(_x()))
    out = str(tmp_path / 't.pt')
    assert main(['convert', 'resnet18d', '--weights', path, '--out', out, '--img-size', '64']) == 0
    assert 'verified' in capsys.readouterr().out
    t_model = timm.create_model('t_resnet18d', pretrained=True, pretrained_cfg_overlay=dict(file=path)).eval()
    for model in (t_model, tcnn.load(out)):  # the checkpoint's weights, converted
        assert model.num_classes == 5 and torch.equal(model.fc.weight, cnn.fc.weight)
        assert torch.equal(model.layer3[1].conv2.weight, cnn.layer3[1].conv2.weight)


def test_timm_train_checkpoints_of_a_t_cnn_load(t_model, tmp_path):
    model = timm.create_model('t_resnet18d', num_classes=5, qk_dim=16)
    model.load_state_dict(t_model.state_dict())
    path = str(tmp_path / 'last.pth.tar')
    _train_checkpoint(model, 't_resnet18d', path, qk_dim=16)
    expected = model(_x())
    assert torch.equal(tcnn.load(path)(_x()), expected)
    assert torch.equal(timm.create_model('t_resnet18d', pretrained=True,
                                         pretrained_cfg_overlay=dict(file=path)).eval()(_x()), expected)
    out = str(tmp_path / 't.safetensors')
    assert main(['convert', 't_resnet18d', '--weights', path, '--out', out]) == 0
    assert torch.equal(tcnn.load(out)(_x()), expected)


class Payload:
    """A pickled object whose unpickling would create a marker file."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, 'w')


class UserConfig:
    """A user's own class stored in a checkpoint."""

    def __init__(self):
        self.lr = 0.1


def test_other_pickled_classes_are_still_refused(tmp_path, capsys):
    cnn = timm.create_model('resnet18d', num_classes=5)
    marker = str(tmp_path / 'marker')
    for i, extra in enumerate((Payload(marker), UserConfig())):
        path = str(tmp_path / f'c{i}.pth.tar')
        torch.save({'state_dict': cnn.state_dict(), 'arch': 'resnet18d', 'args': _train_args('resnet18d'),
                    'epoch': 1, 'version': 2, 'extra': extra}, path)
        for load in (lambda: tcnn.load(path), lambda: tcnn.files.sources.create_cnn('resnet18d', weights=path),
                     lambda: timm.create_model('t_resnet18d', pretrained=True,
                                               pretrained_cfg_overlay=dict(file=path))):
            with pytest.raises(TcnnError, match='holds pickled Python objects other than tensors'):
                load()
        capsys.readouterr()
        assert main(['convert', 'resnet18d', '--weights', path, '--out', str(tmp_path / 't.pt')]) == 2
        assert 'holds pickled Python objects' in capsys.readouterr().err
    assert not os.path.exists(marker)


# ---------------------------------------------------------------------------------------------- T-CNN state dicts


def test_a_t_cnn_state_dict_gets_a_t_cnn_file(t_model, tmp_path, capsys):
    sd = str(tmp_path / 'sd.pth')
    torch.save(t_model.state_dict(), sd)  # what timm's clean_checkpoint.py writes
    with pytest.raises(TcnnError) as e:
        tcnn.load(sd)
    assert f'`tcnn convert t_MODEL --weights {sd} --out FILE`' in _one_line(e)
    # the CNN's name leads to the exact command
    capsys.readouterr()
    assert main(['convert', 'resnet18d', '--weights', sd, '--out', str(tmp_path / 'x.pt')]) == 2
    err = capsys.readouterr().err.strip()
    command = f'`tcnn convert t_resnet18d --weights {sd} --out FILE`'
    assert err.count('\n') == 0 and command in err, err
    out = str(tmp_path / 't.pt')
    argv = command.strip('`').split()[1:]
    assert main(argv[:-1] + [out]) == 0
    printed = capsys.readouterr().out
    assert 'qk_dim 16' in printed and 'layer4' in printed
    loaded = tcnn.load(out)
    assert loaded.tcnn_config['qk_dim'] == 16 and loaded.tcnn_config['stages'] == ['layer4']
    assert torch.equal(loaded(_x()), t_model(_x()))
    # timm's own way, with the settings its GPSA layers show
    model = timm.create_model('t_resnet18d', pretrained=True, pretrained_cfg_overlay=dict(file=sd)).eval()
    assert torch.equal(model(_x()), t_model(_x()))


def test_a_t_cnn_state_dict_at_other_stages(tmp_path, capsys):
    torch.manual_seed(1)
    model = nontrivial(timm.create_model('t_resnet18d', num_classes=3, stages=[3, 4], zero_init_last=False)).eval()
    sd = str(tmp_path / 'sd.safetensors')
    from safetensors.torch import save_file
    save_file(model.state_dict(), sd)
    out = str(tmp_path / 't.pt')
    assert main(['convert', 't_resnet18d', '--weights', sd, '--out', out]) == 0
    loaded = tcnn.load(out)
    assert loaded.tcnn_config['stages'] == ['layer3', 'layer4'] and torch.equal(loaded(_x()), model(_x()))


def test_a_cnn_state_dict_for_a_t_cnn_name_gets_the_cnn_command(tmp_path, capsys):
    """``tcnn convert t_MODEL --weights SD`` with a CNN's state dict (no GPSA layers): one line naming the command
    that converts it."""
    sd = str(tmp_path / 'cnn.pth')
    torch.save(timm.create_model('resnet18d', num_classes=3).state_dict(), sd)
    out = str(tmp_path / 't.pt')
    assert main(['convert', 't_resnet18d', '--weights', sd, '--out', out]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count('\n') == 0 and 'holds the weights of a CNN (no GPSA layers)' in err, err
    assert f'`tcnn convert resnet18d --weights {sd} --out {out}`' in err, err
    assert not os.path.exists(out)


# ---------------------------------------------------------------------------------------------- messages


def test_unknown_architecture_in_a_folder(published, tmp_path):
    out = str(tmp_path / 'hub')
    shutil.copytree(published, out)
    config_path = os.path.join(out, 'config.json')
    config = json.load(open(config_path))
    config['architecture'] = 't_resnet18x'
    json.dump(config, open(config_path, 'w'))
    with pytest.raises(TcnnError) as e:
        tcnn.load(out)
    text = _one_line(e)
    assert f"{config_path} names architecture 't_resnet18x' that neither timm" in text and "CNN's name" not in text
    with pytest.raises(TcnnError, match="names architecture 't_resnet18x' that neither timm"):
        timm.create_model('t_resnet18d', pretrained=True, pretrained_cfg_overlay=dict(file=out))


def test_truncated_safetensors_files_are_named(t_model, published, tmp_path):
    out = str(tmp_path / 'hub')
    shutil.copytree(published, out)
    weights = os.path.join(out, 'model.safetensors')
    path = str(tmp_path / 't.safetensors')
    tcnn.save(t_model, path)
    for file, load in ((weights, lambda: tcnn.load(out)), (path, lambda: tcnn.load(path))):
        size = os.path.getsize(file)
        with open(file, 'r+b') as f:
            f.truncate(size // 2)
        with pytest.raises(TcnnError) as e:
            load()
        assert _one_line(e) == f'{file} is truncated ({size // 2} of its {size} bytes): re-download or re-save it'
        with open(file, 'r+b') as f:
            f.truncate(100)
        with pytest.raises(TcnnError, match=f'{file} is truncated \\(100 bytes: its header alone takes'):
            load()
