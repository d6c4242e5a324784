"""Creating source CNNs by name with local, random or (unavailable offline) pretrained weights."""
import time
import warnings

import pytest
import safetensors.torch
import timm
import torch

from tcnn.errors import TcnnError
from tcnn.files.sources import CLI_HINT, PYTHON_HINT, WeightsUnavailableError, create_cnn
from tcnn.files.weights import clean_state_dict, load_state_dict_file


def test_offline_pretrained_fails_fast_and_names_the_python_fix(monkeypatch):
    """From Python the message names arguments (pretrained=False, weights=PATH, ...), not the CLI's flags."""
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    monkeypatch.setattr('tcnn.files.sources._cached_timm_file', lambda cfg: None)  # whatever this machine has cached
    start = time.perf_counter()
    with pytest.raises(WeightsUnavailableError) as info:
        create_cnn('resnet18d', pretrained=True)  # offline: must fail fast
    assert time.perf_counter() - start < 10
    message = str(info.value)
    assert message == f"cannot download pretrained weights for 'resnet18d' (offline, not in the local cache): " \
                      f'{PYTHON_HINT}'
    assert 'pretrained=False' in message and 'weights=PATH' in message and 'pretrained_cfg_overlay=dict(file=PATH)' \
        in message and '--' not in message
    assert isinstance(info.value, TcnnError)


def test_weights_unavailable_error_rewords_for_the_cli():
    """The commands swap the hint for their flags; the reason stays, and the error survives pickling (e.g. from a
    worker process) with both parts."""
    import pickle
    error = WeightsUnavailableError("timm has no pretrained weights for 'x'")
    cli = error.with_hint(CLI_HINT)
    assert str(cli) == "timm has no pretrained weights for 'x': pass --weights PATH (a local checkpoint) or " \
                       '--no-pretrained (random init)'
    assert type(cli) is WeightsUnavailableError and cli.reason == error.reason and error.hint == PYTHON_HINT
    again = pickle.loads(pickle.dumps(cli))
    assert str(again) == str(cli) and again.hint == CLI_HINT


def test_unreachable_host_fails_fast(monkeypatch):
    # no HF_HUB_OFFLINE: the short connection probe must stop us before timm's ~50 s of retries
    monkeypatch.delenv('HF_HUB_OFFLINE', raising=False)
    monkeypatch.setenv('HF_ENDPOINT', 'http://127.0.0.1:9')  # discard port: nothing listens
    monkeypatch.setattr('tcnn.files.sources._cached_timm_file', lambda cfg: None)
    start = time.perf_counter()
    with pytest.raises(TcnnError, match='offline'):
        create_cnn('resnet18d', pretrained=True)  # offline: must fail fast
    assert time.perf_counter() - start < 10


def test_unknown_names_suggest_close_matches():
    with pytest.raises(TcnnError, match=r"unknown timm model 'resnet50dd'.*resnet50d"):
        create_cnn('resnet50dd', pretrained=False)
    with pytest.raises(TcnnError, match=r'unknown torchvision model.*resnet50'):
        create_cnn('torchvision:resnet5O', pretrained=False)


def test_random_init_records_the_source():
    model = create_cnn('resnet18d', pretrained=False, num_classes=7, drop_path_rate=0.1)
    assert model.num_classes == 7
    assert model.tcnn_source == {'model': 'resnet18d', 'num_classes': 7, 'kwargs': {'drop_path_rate': 0.1},
                                 'weights': 'random'}
    tv = create_cnn('torchvision:resnet18', pretrained=False, num_classes=5)
    assert tv.fc.out_features == 5 and tv.tcnn_source['model'] == 'torchvision:resnet18'


@pytest.mark.parametrize('wrap', ['plain', 'state_dict', 'model', 'state_dict_ema', 'ddp', 'safetensors'])
def test_local_weights_load_in_common_layouts(tmp_path, wrap):
    src = timm.create_model('resnet18d', num_classes=4)
    sd = src.state_dict()
    if wrap == 'safetensors':
        path = tmp_path / 'w.safetensors'
        safetensors.torch.save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    else:
        if wrap == 'ddp':
            payload = {'state_dict': {f'module.{k}': v for k, v in sd.items()}, 'epoch': 3}
        else:
            payload = sd if wrap == 'plain' else {wrap: sd, 'epoch': 3}
        path = tmp_path / 'w.pth'
        torch.save(payload, path)
    model = create_cnn('resnet18d', weights=str(path), num_classes=4)
    for k, v in model.state_dict().items():
        assert torch.equal(v, sd[k]), k
    assert model.tcnn_source['weights'] == f'file:{path.name}'  # where the weights came from (a model card says)


def test_checkpoint_with_another_head_keeps_the_backbone(tmp_path):
    src = timm.create_model('resnet18d', num_classes=1000)
    torch.save(src.state_dict(), tmp_path / 'w.pt')
    with pytest.warns(UserWarning, match="'fc' .1000 classes. is dropped"):
        model = create_cnn('resnet18d', weights=str(tmp_path / 'w.pt'), num_classes=10)
    assert model.fc.out_features == 10
    assert torch.equal(model.conv1[0].weight, src.conv1[0].weight)


def test_bad_weight_files_are_rejected_clearly(tmp_path):
    with pytest.raises(TcnnError, match='not found'):
        create_cnn('resnet18d', weights=str(tmp_path / 'missing.pt'))
    junk = tmp_path / 'junk.pt'
    junk.write_bytes(b'not a checkpoint at all')
    with pytest.raises(TcnnError, match='weights file .* is not a torch file'):
        load_state_dict_file(str(junk))
    torch.save(timm.create_model('resnet26d').state_dict(), tmp_path / 'other.pt')
    with pytest.raises(TcnnError, match='does not fit resnet18d'):
        create_cnn('resnet18d', weights=str(tmp_path / 'other.pt'))
    torch.save({'epoch': 1}, tmp_path / 'empty.pt')
    with pytest.raises(TcnnError, match='no state_dict'):
        load_state_dict_file(str(tmp_path / 'empty.pt'))


def test_eval_offline_names_its_own_fix(monkeypatch):
    """tcnn eval has no --weights/--no-pretrained: its wording of the same error points at a model file."""
    from tcnn.commands.arguments import load_model
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    monkeypatch.setattr('tcnn.files.sources._cached_timm_file', lambda cfg: None)
    with pytest.raises(WeightsUnavailableError) as info:
        load_model('resnet18d', names=True)  # offline: must fail fast
    assert str(info.value).endswith(': give a model file instead (a CNN saved with tcnn.save, a tcnn convert '
                                    'file or a checkpoint)')
    assert '--weights' not in str(info.value) and 'pretrained=False' not in str(info.value)


def _wrapped_checkpoint(tmp_path, num_classes: int, name: str = 'r18d.pth', with_ema: bool = False):
    """A resnet18d checkpoint as timm's train.py writes it (``{'state_dict': ...}``, optionally beside
    ``state_dict_ema``): returns the raw model, the EMA model and the path."""
    torch.manual_seed(0)
    raw = timm.create_model('resnet18d', num_classes=num_classes)
    ema = timm.create_model('resnet18d', num_classes=num_classes)
    payload = {'state_dict': raw.state_dict(), 'epoch': 9, 'arch': 'resnet18d'}
    if with_ema:
        payload['state_dict_ema'] = ema.state_dict()
    torch.save(payload, tmp_path / name)
    return raw, ema, str(tmp_path / name)


def test_class_count_comes_from_the_checkpoint_head(tmp_path, recwarn):
    """A 10-class checkpoint gives a 10-class model with the checkpoint's head, timm and torchvision alike."""
    raw, _, path = _wrapped_checkpoint(tmp_path, 10)
    model = create_cnn('resnet18d', weights=path)
    assert model.num_classes == 10 and model.fc.out_features == 10
    assert torch.equal(model.fc.weight, raw.fc.weight) and model.tcnn_source['num_classes'] == 10
    tv = create_cnn('torchvision:resnet18', pretrained=False, num_classes=7)
    torch.save({'model': tv.state_dict()}, tmp_path / 'tv.pth')
    torchvision_model = create_cnn('torchvision:resnet18', weights=str(tmp_path / 'tv.pth'))
    assert torchvision_model.fc.out_features == 7 and torch.equal(torchvision_model.fc.weight, tv.fc.weight)
    assert not [w for w in recwarn if 'head' in str(w.message)]  # nothing dropped: no warning


def test_explicit_num_classes_drops_the_head_with_one_warning(tmp_path):
    raw, _, path = _wrapped_checkpoint(tmp_path, 10)
    with pytest.warns(UserWarning) as record:
        model = create_cnn('resnet18d', weights=path, num_classes=4)
    messages = [str(w.message) for w in record if 'head' in str(w.message)]
    assert len(messages) == 1 and '\n' not in messages[0]
    assert "'fc'" in messages[0] and '10 classes' in messages[0] and 'num_classes=4' in messages[0]
    assert model.fc.out_features == 4 and torch.equal(model.conv1[0].weight, raw.conv1[0].weight)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # the same count: nothing dropped, nothing said
        assert create_cnn('resnet18d', weights=path, num_classes=10).num_classes == 10


def test_raw_weights_before_the_ema_unless_asked(tmp_path):
    """timm's convention (validate.py loads the EMA only with --use-ema): state_dict first."""
    raw, ema, path = _wrapped_checkpoint(tmp_path, 10, with_ema=True)
    model = create_cnn('resnet18d', weights=path)
    assert torch.equal(model.fc.weight, raw.fc.weight) and not torch.equal(model.fc.weight, ema.fc.weight)
    model = create_cnn('resnet18d', weights=path, use_ema=True)
    assert torch.equal(model.fc.weight, ema.fc.weight)
    sd = torch.load(path, weights_only=True)
    assert torch.equal(clean_state_dict(sd)['fc.weight'], raw.fc.weight)
    assert torch.equal(clean_state_dict(sd, use_ema=True)['fc.weight'], ema.fc.weight)
    # asked for an EMA that is not there: an error, never the raw weights in its place
    _, _, plain = _wrapped_checkpoint(tmp_path, 10, name='plain.pth')
    with pytest.raises(TcnnError, match='no EMA weights') as info:
        create_cnn('resnet18d', weights=plain, use_ema=True)
    assert '\n' not in str(info.value)


def test_t_models_and_create_cnn_agree_on_the_head(tmp_path):
    """The t_* path (pretrained_cfg_overlay=dict(file=...)) reads the class count and the EMA choice as create_cnn
    does: one helper for both."""
    import tcnn  # noqa: F401  (registers the t_* models)
    raw, ema, path = _wrapped_checkpoint(tmp_path, 10, with_ema=True)
    t_model = timm.create_model('t_resnet18d', pretrained=True, pretrained_cfg_overlay=dict(file=path))
    assert t_model.num_classes == 10 and torch.equal(t_model.fc.weight, raw.fc.weight)
    with pytest.warns(UserWarning, match="'fc'.*10 classes.*num_classes=3"):
        t_model = timm.create_model('t_resnet18d', pretrained=True, num_classes=3,
                                    pretrained_cfg_overlay=dict(file=path))
    assert t_model.num_classes == 3 and torch.equal(t_model.conv1[0].weight, raw.conv1[0].weight)
