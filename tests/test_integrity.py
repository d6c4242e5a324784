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
from helpers import images
from imagegen import make_image_folder
from nontrivial import nontrivial
from tcnn.files import tcnn_file
from tcnn.files.hub_folder import HUB_CHECKSUMS_KEY
from tcnn.files import run_folder
from tcnn.cli import main
from tcnn.errors import TcnnError
from tcnn.files.integrity import CorruptFileError, tensor_checksums

TENSOR = 'layer4.0.conv2.proj_weight'

pytestmark = pytest.mark.usefixtures('one_thread')  # small models on a shared 2-core machine (conftest.py)


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
    assert torch.equal(tcnn.load(path)(images()), t_model(images()))
    _flip(path, t_model.state_dict()[TENSOR])
    with pytest.raises(CorruptFileError) as e:
        tcnn.load(path)
    assert _one_line(e) == (f'{path}: the tensor {TENSOR} does not match its checksum: the file is corrupt '
                            '(re-download or re-save it)')


def test_files_without_checksums_still_load(t_model, tmp_path):
    """Files of tcnn 0.3.x hold no checksums: loaded unchecked, no error."""
    path = str(tmp_path / 'old.pt')
    d = tcnn_file.model_to_dict(t_model)
    assert tcnn_file.CHECKSUMS_KEY not in d
    torch.save(d, path)
    assert torch.equal(tcnn.load(path)(images()), t_model(images()))
    old = str(tmp_path / 'old.safetensors')
    tcnn.save(t_model, old)
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open
    with safe_open(old, 'pt') as f:
        settings = json.loads(f.metadata()['tcnn'])
    settings.pop(tcnn_file.CHECKSUMS_KEY)
    save_file(load_file(old), old, metadata={'format': 'pt', 'tcnn': json.dumps(settings)})
    assert torch.equal(tcnn.load(old)(images()), t_model(images()))


def test_a_flipped_byte_in_a_training_checkpoint_is_named(t_model, tmp_path):
    ema = timm.create_model('t_resnet18d', num_classes=5, qk_dim=16)
    ema.load_state_dict({k: v + 0.01 if v.is_floating_point() else v for k, v in t_model.state_dict().items()})
    path = str(tmp_path / 'last.pt')
    run_folder.write_checkpoint(run_folder.make_checkpoint(t_model, ema=ema.state_dict(), epoch=2), path)
    assert torch.equal(tcnn.load(path)(images()), t_model(images()))
    _flip(path, ema.state_dict()[TENSOR])
    assert torch.equal(tcnn.load(path)(images()), t_model(images()))  # the raw weights are whole
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
    assert torch.equal(tcnn.load(out)(images()), t_model(images()))
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
    model(images()).sum().backward()
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
    assert torch.equal(tcnn.load(path)(images()), cnn(images()))
    assert torch.equal(tcnn.files.sources.create_cnn('resnet18d', weights=path).eval()(images()), cnn(images()))
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
    expected = model(images())
    assert torch.equal(tcnn.load(path)(images()), expected)
    assert torch.equal(timm.create_model('t_resnet18d', pretrained=True,
                                         pretrained_cfg_overlay=dict(file=path)).eval()(images()), expected)
    out = str(tmp_path / 't.safetensors')
    assert main(['convert', 't_resnet18d', '--weights', path, '--out', out]) == 0
    assert torch.equal(tcnn.load(out)(images()), expected)


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
    assert torch.equal(loaded(images()), t_model(images()))
    # timm's own way, with the settings its GPSA layers show
    model = timm.create_model('t_resnet18d', pretrained=True, pretrained_cfg_overlay=dict(file=sd)).eval()
    assert torch.equal(model(images()), t_model(images()))


def test_a_t_cnn_state_dict_at_other_stages(tmp_path, capsys):
    torch.manual_seed(1)
    model = nontrivial(timm.create_model('t_resnet18d', num_classes=3, stages=[3, 4], zero_init_last=False)).eval()
    sd = str(tmp_path / 'sd.safetensors')
    from safetensors.torch import save_file
    save_file(model.state_dict(), sd)
    out = str(tmp_path / 't.pt')
    assert main(['convert', 't_resnet18d', '--weights', sd, '--out', out]) == 0
    loaded = tcnn.load(out)
    assert loaded.tcnn_config['stages'] == ['layer3', 'layer4'] and torch.equal(loaded(images()), model(images()))


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


def test_an_unknown_architecture_in_a_folder_is_refused_in_one_line(published, tmp_path):
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


# ------------------------------------------------------------------ the promises line by line (issue 47, mutants)
# Each expected value is computed by hand or by an independent routine (zlib over the tensor's bytes, struct-packed
# headers): the messages are what a user reads, so their words are part of the promise.

FIX = 'the file is corrupt (re-download or re-save it)'


def test_checksums_are_zlib_crc32_of_the_stored_bytes():
    """One CRC-32 per tensor over its row-major bytes, as zlib computes it (an empty tensor: CRC-32 of no bytes, 0);
    a non-contiguous tensor is checked over the bytes it would be stored with."""
    import zlib
    t = torch.arange(12, dtype=torch.float32).view(3, 4)
    tensors = {'a': t, 'b': t.t(), 'e': torch.empty(0), 'h': torch.tensor([1.5], dtype=torch.float16)}
    expected = {'a': zlib.crc32(t.numpy().tobytes()), 'b': zlib.crc32(t.t().contiguous().numpy().tobytes()),
                'e': 0, 'h': zlib.crc32(b'\x00\x3e')}  # float16 1.5 = 0x3e00, little-endian
    assert tensor_checksums(tensors) == {'algorithm': 'crc32', 'tensors': expected}


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
def test_checksums_of_gpu_tensors_are_those_of_their_bytes():
    t = torch.arange(6, dtype=torch.float32)
    assert tensor_checksums({'a': t.cuda()}) == tensor_checksums({'a': t})


def test_names_text_lists_three_names_and_counts_the_rest():
    from tcnn.files.integrity import names_text
    assert names_text(['a', 'b', 'c']) == 'a, b, c'
    assert names_text(['a', 'b', 'c', 'd', 'e']) == 'a, b, c (and 2 more)'
    assert names_text(['a', 'b'], most=1) == 'a (and 1 more)'


@pytest.mark.parametrize('checksums,algorithm', [
    (['crc32'], None),  # not a dict
    ({'algorithm': 'md5', 'tensors': None}, "'md5'"),  # stored correct values below, of another algorithm
    ({'algorithm': 'crc32', 'tensors': ['a']}, "'crc32'"),  # tensors not a dict
    ({'algorithm': 'crc32', 'tensors': {'a': True}}, "'crc32'"),  # a bool is not a checksum
    ({'algorithm': 'crc32', 'tensors': {'a': '123'}}, "'crc32'"),
])
def test_unreadable_checksums_are_named(checksums, algorithm):
    from tcnn.files.integrity import verify_checksums
    tensors = {'a': torch.ones(2)}
    if isinstance(checksums, dict) and checksums['tensors'] is None:
        checksums = dict(checksums, tensors=tensor_checksums(tensors)['tensors'])
    with pytest.raises(CorruptFileError) as e:
        verify_checksums(tensors, checksums, 'f.pt')
    assert str(e.value) == f'f.pt: its tensor checksums are unreadable (algorithm {algorithm}): {FIX}'


def test_added_and_lost_tensors_are_named():
    from tcnn.files.integrity import verify_checksums
    tensors = {'a': torch.ones(2), 'b': torch.zeros(3)}
    checksums = tensor_checksums(tensors)
    verify_checksums(tensors, checksums, 'f.pt')  # the same tensors: nothing to say
    verify_checksums(tensors, None, 'f.pt')  # a file without checksums: nothing checked
    with pytest.raises(CorruptFileError) as e:
        verify_checksums(dict(tensors, c=torch.ones(1)), checksums, 'f.pt')
    assert str(e.value) == f'f.pt: its tensors differ from those its checksums list (unexpected c): {FIX}'
    with pytest.raises(CorruptFileError) as e:
        verify_checksums({'c': torch.ones(1), 'b': tensors['b']}, checksums, 'f.pt')
    assert str(e.value) == f'f.pt: its tensors differ from those its checksums list (missing a; unexpected c): {FIX}'
    with pytest.raises(CorruptFileError) as e:
        verify_checksums(dict(tensors, a=torch.full((2,), 2.0)), checksums, 'f.pt')
    assert str(e.value) == f'f.pt: the tensor a does not match its checksum: {FIX}'


def _safetensors_bytes(header_length: int, rest: bytes = b'') -> bytes:
    import struct
    return struct.pack('<Q', header_length) + rest


def _layout(header: str, data: int = 0) -> bytes:
    """A safetensors file's bytes: the header's length (8 bytes, little-endian), the header, ``data`` zero bytes."""
    return _safetensors_bytes(len(header), header.encode() + b'\0' * data)


ONE = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'  # 54 bytes


@pytest.mark.parametrize('content,expected', [
    (b'1234', 'truncated (4 bytes: not even the 8-byte header length of a safetensors file)'),
    # a length of 2**64 - 1 (eight 0xff bytes): not a length (safetensors' limit is 100 MiB)
    (b'\xff' * 16, 'corrupt (not a safetensors file: its first 8 bytes are no header length)'),
    (_safetensors_bytes(100 * 2 ** 20 + 1, b'{}'),
     'corrupt (not a safetensors file: its first 8 bytes are no header length)'),
    (_safetensors_bytes(100 * 2 ** 20, b'{}'), f'truncated (10 bytes: its header alone takes {8 + 100 * 2 ** 20})'),
    (_safetensors_bytes(3, b'{}'), 'truncated (10 bytes: its header alone takes 11)'),
    (_layout('{]'), 'corrupt (its header is not a safetensors header: JSONDecodeError)'),
    (_layout('[]'), 'corrupt (its header is not a safetensors header: ValueError)'),  # not a JSON object
    (_layout('{}'), None),  # no tensors: the header is the whole file
    (_layout(ONE, 8), None),
    (_layout(ONE, 9), None),  # bytes after the last tensor's: not damage
    (_layout(ONE, 4), 'truncated (66 of its 70 bytes)'),
    (_layout(ONE), 'truncated (62 of its 70 bytes)'),
])
def test_safetensors_damage_is_read_from_the_layout(tmp_path, content, expected):
    from tcnn.files.integrity import safetensors_damage
    path = tmp_path / 'f.safetensors'
    path.write_bytes(content)
    assert safetensors_damage(str(path)) == expected


def test_safetensors_damage_finds_none_in_real_files_and_names_truncation(tmp_path):
    from safetensors.torch import save_file
    from tcnn.files.integrity import safetensors_damage
    for tensors in ({}, {'a': torch.ones(3)}):
        path = str(tmp_path / 'f.safetensors')
        save_file(tensors, path)
        assert safetensors_damage(path) is None
    size = os.path.getsize(path)
    with open(path, 'r+b') as f:
        f.truncate(size - 4)
    assert safetensors_damage(path) == f'truncated ({size - 4} of its {size} bytes)'


def _with_nonfinite(names) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    with torch.no_grad():
        for name in names:
            dict([*model.named_parameters(), *model.named_buffers()])[name].view(-1)[0] = float('nan')
    return model


def test_nonfinite_messages_name_the_kind_and_the_damaged_tensors():
    from tcnn.files.integrity import nonfinite_kind, nonfinite_output_error, nonfinite_text, nonfinite_tensors
    assert nonfinite_kind(1, 0) == 'NaN' and nonfinite_kind(0, 2) == 'inf' and nonfinite_kind(3, 1) == 'NaN and inf'
    assert nonfinite_kind(0, 0) == 'non-finite'
    assert nonfinite_tensors(_with_nonfinite(['0.bias', '1.running_var'])) == ['0.bias', '1.running_var']
    assert nonfinite_text(_with_nonfinite([])) == (
        'its parameters and buffers are all finite: the computation overflows (reduced precision? try without --amp) '
        'or the input holds non-finite values')
    assert nonfinite_text(_with_nonfinite(['0.weight'])) == (
        'its parameter holds non-finite values (0.weight): the weights are damaged; re-download or re-train')
    assert nonfinite_text(_with_nonfinite(['0.weight', '0.bias', '1.weight', '1.running_mean'])) == (
        '4 of its parameters hold non-finite values (0.weight, 0.bias, 1.weight (and 1 more)): the weights are '
        'damaged; re-download or re-train')
    error = nonfinite_output_error('m.pt', _with_nonfinite(['0.bias']), 3, 10, 0, 3, what='features', of='crops')
    assert str(error) == ('m.pt computes non-finite features (inf) on 3 of 10 crops: its parameter holds non-finite '
                          'values (0.bias): the weights are damaged; re-download or re-train')
    assert str(error.renamed('other')).startswith('other computes non-finite features (inf)')
    import pickle
    copy = pickle.loads(pickle.dumps(error))  # errors cross process boundaries (evaluation workers)
    assert type(copy) is type(error) and (copy.name, copy.detail) == (error.name, error.detail)


def test_check_finite_outputs_refuses_non_finite_logits_naming_the_cause():
    from tcnn.files.integrity import check_finite_outputs
    check_finite_outputs(torch.ones(2, 3), _with_nonfinite(['0.bias']), 'cannot export m')  # finite: no error
    with pytest.raises(TcnnError) as e:
        check_finite_outputs(torch.tensor([1.0, float('inf')]), _with_nonfinite([]), 'cannot export m')
    assert str(e.value) == ('cannot export m: the model computes non-finite logits (NaN or infinity); its parameters '
                            'and buffers are all finite, so the computation overflows (e.g. float16 range or extreme '
                            'inputs)')
    with pytest.raises(TcnnError) as e:
        check_finite_outputs(torch.tensor([float('nan')]), _with_nonfinite(['0.weight', '1.bias']), 'cannot export m')
    assert str(e.value) == ('cannot export m: the model computes non-finite logits (NaN or infinity); 2 of its '
                            'parameters/buffers hold NaN or infinite values (0.weight, 1.bias): the weights are '
                            'damaged (a corrupted file or a diverged training run); use an earlier checkpoint or '
                            'reconvert')


def test_the_same_model_saves_to_the_same_bytes_under_any_name(tmp_path):
    """A T-CNN file's bytes are a function of the model: its SHA-256 can name it (the demo's shipped CNNs are checked
    that way). torch.save given a path names the archive's root after the file, which atomic writes make random."""
    import hashlib
    model = tcnn.reparameterize(timm.create_model('resnet18d', num_classes=3), input_size=(3, 64, 64))
    digests = []
    for name in ('a.pt', 'other-name.pt', 'a.pt'):
        tcnn.save(model, str(tmp_path / name))
        digests.append(hashlib.sha256((tmp_path / name).read_bytes()).hexdigest())
    assert len(set(digests)) == 1
