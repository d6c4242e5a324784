"""Hugging Face Hub conventions (issue 21): T-CNNs saved with timm's ``save_for_hf`` / ``tcnn publish`` and loaded
back with ``timm.create_model('local-dir:DIR' | 'hf-hub:ORG/NAME', pretrained=True)`` and ``tcnn.load``, offline.

The ``hf-hub:`` tests lay out a Hugging Face cache folder as huggingface_hub writes it
(``models--ORG--NAME/blobs``, ``snapshots/REV/`` links to the blobs, ``refs/main``) and point ``HF_HUB_CACHE`` at it
with ``HF_HUB_OFFLINE=1``. Every model has its GPSA parameters moved away from their init (as after fine-tuning) and
a non-default conversion, so a loader that rebuilt the default T-CNN, or converted the source CNN's weights, would
give other logits (each test checks that its model is that far from its CNN).
"""
import hashlib
import json
import os
import subprocess
import sys
import types

import huggingface_hub.constants
import pytest
import timm
import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file
from timm.models import save_for_hf

import tcnn
import tcnn.evaluation.model_card
import tcnn.files.hub_folder
import tcnn.files.sources
from helpers import images
from imagegen import make_image_folder
from nontrivial import nontrivial, varied_heads
from tcnn.cli import main
from tcnn.errors import TcnnError

REPO = 'tcnn-tests/t_resnet18d-layer3'
REVISION = 'a' * 40  # a commit hash, as refs/main holds one
# the smallest model of every family, converted at a stage other than its default
FAMILIES = [('t_resnet10t', [2, 4]), ('t_seresnext26d_32x4d', 'layer3'), ('t_resnext26ts', 'stages.2'),
            ('t_regnetx_002', 's3'), ('t_convnext_atto', 'stages.2'), ('t_efficientnet_b0', 'blocks.5'),
            ('t_mobilenetv3_small_050', 'blocks.3')]

pytestmark = pytest.mark.usefixtures('one_thread')  # small models on a shared 2-core machine (conftest.py)


def _moved(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random BN statistics and layer scales, per-head gates, localities and centres, values off the identity:
    the model is neither its init nor its CNN."""
    nontrivial(model, seed)
    varied_heads(model, seed + 1)
    gen = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for _, layer in tcnn.gpsa_layers(model):
            layer.v_weight.add_(torch.randn(layer.v_weight.shape, generator=gen) * 0.1)
    return model.eval()


def _logits(model: nn.Module, size: int = 64) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(images(size=size))


def _far_from_its_cnn(model: nn.Module, size: int = 64) -> None:
    """The model's logits differ visibly from those of the CNN whose filters it holds (its exact configuration):
    a loader that converted CNN weights instead of loading these could not pass the equality checks."""
    logits = _logits(model, size)
    with tcnn.exact_configuration(model):
        cnn_logits = _logits(model, size)
    assert (logits - cnn_logits).abs().max() > 0.01 * cnn_logits.abs().max()  # 1000x the rounding _close allows


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal to float rounding: the same weights in other memory (a file's tensors are assigned, not copied, by
    ``tcnn.load``) may take other GEMM kernel paths."""
    assert (a - b).abs().max() <= 1e-5 * b.abs().max(), (a - b).abs().max()


@pytest.fixture(scope='module')
def t_model() -> nn.Module:
    """t_resnet18d converted at layer3 (not the default layer4) with qk_dim 16, 10 classes, moved gates."""
    torch.manual_seed(0)
    model = _moved(timm.create_model('t_resnet18d', num_classes=10, stages='layer3', qk_dim=16))
    _far_from_its_cnn(model)
    return model


@pytest.fixture(scope='module')
def folder(t_model, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp('hub') / 't_resnet18d-layer3'
    save_for_hf(t_model, path, safe_serialization=True)
    return str(path)


def hf_cache(root, repo: str, folder: str) -> str:
    """A Hugging Face cache holding ``folder``'s files as revision ``main`` of ``repo``; returns the cache folder."""
    org, name = repo.split('/')
    base = os.path.join(str(root), f'models--{org}--{name}')
    snapshot = os.path.join(base, 'snapshots', REVISION)
    os.makedirs(os.path.join(base, 'blobs'), exist_ok=True)
    os.makedirs(os.path.join(base, 'refs'), exist_ok=True)
    os.makedirs(snapshot, exist_ok=True)
    for file in os.listdir(folder):
        with open(os.path.join(folder, file), 'rb') as f:
            data = f.read()
        blob = os.path.join(base, 'blobs', hashlib.sha256(data).hexdigest())
        with open(blob, 'wb') as f:
            f.write(data)
        os.symlink(os.path.relpath(blob, snapshot), os.path.join(snapshot, file))
    with open(os.path.join(base, 'refs', 'main'), 'w') as f:
        f.write(REVISION)
    return str(root)


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """Point huggingface_hub at an empty cache under tmp_path, offline (the env for subprocesses, the constants
    huggingface_hub read at import for this one)."""
    cache = tmp_path / 'hf-cache'
    cache.mkdir()
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    monkeypatch.setenv('HF_HUB_CACHE', str(cache))
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_OFFLINE', True)
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_CACHE', str(cache))
    return cache


# ---------------------------------------------------------------------------------------------- round trips


def test_local_dir_round_trip_is_exact(t_model, folder):
    config = json.load(open(os.path.join(folder, 'config.json')))
    assert config['architecture'] == 't_resnet18d'
    # the conversion settings as the model was created with them (timm records the factory's arguments)
    assert config['model_args']['stages'] == 'layer3' and config['model_args']['qk_dim'] == 16
    loaded = timm.create_model(f'local-dir:{folder}', pretrained=True)  # offline: a local folder
    assert type(loaded) is type(t_model)
    assert loaded.tcnn_config == t_model.tcnn_config
    assert torch.equal(_logits(loaded), _logits(t_model))
    # the loaded model carries its settings: saving it again writes the same architecture and arguments
    again = os.path.join(os.path.dirname(folder), 'again')
    save_for_hf(loaded, again, safe_serialization=True)
    config_again = json.load(open(os.path.join(again, 'config.json')))
    assert config_again['model_args'] == config['model_args']
    assert config_again['pretrained_cfg'] == config['pretrained_cfg']


def test_hf_hub_round_trip_from_the_cache(t_model, folder, offline_cache):
    hf_cache(offline_cache, REPO, folder)
    loaded = timm.create_model(f'hf-hub:{REPO}', pretrained=True)  # offline: the local HF cache
    assert loaded.pretrained_cfg['hf_hub_id'] == REPO and loaded.tcnn_config == t_model.tcnn_config
    assert torch.equal(_logits(loaded), _logits(t_model))
    via_tcnn = tcnn.load(f'hf-hub:{REPO}')
    assert not via_tcnn.training and torch.equal(_logits(via_tcnn), _logits(t_model))
    # the repo as a registry model's weight location: read as the hf-hub: name reads it
    overlay = timm.create_model('t_resnet18d', pretrained=True,  # offline: the local HF cache
                                pretrained_cfg_overlay=dict(hf_hub_id=REPO))
    assert overlay.num_classes == 10 and torch.equal(_logits(overlay), _logits(t_model))
    with pytest.raises(TcnnError, match='t_resnet18d as built .* has GPSA layers layer4'):
        timm.create_model('t_resnet18d', pretrained=True, stages=4,  # offline: the local HF cache
                          pretrained_cfg_overlay=dict(hf_hub_id=REPO))
    with pytest.raises(TcnnError, match='cannot load hf-hub:tcnn-tests/missing') as info:
        tcnn.load('hf-hub:tcnn-tests/missing')  # not in the cache, offline
    assert '\n' not in str(info.value)


def test_an_hf_hub_model_loads_in_a_fresh_process_from_the_cache(t_model, folder, offline_cache, tmp_path):
    """As a user meets it: only the environment variables point at the cache."""
    hf_cache(offline_cache, REPO, folder)
    out = tmp_path / 'logits.pt'
    code = ('import sys, timm, torch, tcnn; torch.manual_seed(0); '
            f'm = timm.create_model("hf-hub:{REPO}", pretrained=True).eval(); '
            'x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0)); '
            'torch.save(m(x).detach(), sys.argv[1])')
    proc = subprocess.run([sys.executable, '-c', code, str(out)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    _close(torch.load(out, weights_only=True), _logits(t_model))  # another process: its own thread count


@pytest.mark.parametrize('name, stages', FAMILIES)
def test_every_family_round_trips_exactly(name, stages, tmp_path, offline_cache):
    torch.manual_seed(0)
    model = _moved(timm.create_model(name, num_classes=7, stages=stages))
    _far_from_its_cnn(model)
    expected = _logits(model)
    path = tmp_path / name
    save_for_hf(model, path, safe_serialization=True)
    hf_cache(offline_cache, f'tcnn-tests/{name}', str(path))
    for location in (f'local-dir:{path}', f'hf-hub:tcnn-tests/{name}'):
        loaded = timm.create_model(location, pretrained=True)  # offline: a local folder / the local HF cache
        assert type(loaded) is type(model) and loaded.tcnn_config == model.tcnn_config, location
        assert torch.equal(_logits(loaded), expected), location


def test_num_classes_and_features_only_on_a_folder(t_model, folder):
    new_head = timm.create_model(f'local-dir:{folder}', pretrained=True, num_classes=3).eval()  # offline: local
    assert new_head.fc.out_features == 3 and new_head.tcnn_config == t_model.tcnn_config
    with torch.no_grad():  # every weight but the new head's is the folder's
        assert torch.equal(new_head.forward_features(images()), t_model.forward_features(images()))
    features = timm.create_model(f'local-dir:{folder}', pretrained=True, features_only=True,  # offline: local
                                 out_indices=(2, 3, 4)).eval()
    with torch.no_grad():
        maps = features(images())
    assert [m.shape[1] for m in maps] == [128, 256, 512]
    with torch.no_grad():
        assert torch.equal(maps[-1], t_model.forward_features(images()))
    overlay = timm.create_model('t_resnet18d', pretrained=True,  # offline: the folder as pretrained_cfg file
                                pretrained_cfg_overlay=dict(file=folder))
    assert overlay.tcnn_config == t_model.tcnn_config and torch.equal(_logits(overlay), _logits(t_model))
    gray = timm.create_model(f'local-dir:{folder}', pretrained=True, in_chans=1)  # offline: a local folder
    assert gray.conv1[0].in_channels == 1  # timm adapts the stem, the rest is the folder's
    torch.testing.assert_close(gray.conv1[0].weight[:, 0], t_model.conv1[0].weight.sum(1))
    assert torch.equal(gray.layer3[1].conv2.gating, t_model.layer3[1].conv2.gating)


def test_tcnn_load_reads_folders(t_model, folder):
    for name in (folder, f'local-dir:{folder}'):
        loaded = tcnn.load(name)
        assert not loaded.training and torch.equal(_logits(loaded), _logits(t_model))
        assert loaded.tcnn_source['model'].split('.')[0] == 'resnet18d'
    path = os.path.join(os.path.dirname(folder), 'resaved.safetensors')
    tcnn.save(tcnn.load(folder), path)  # a folder's T-CNN is a T-CNN file's as well
    _close(_logits(tcnn.load(path)), _logits(t_model))


# ---------------------------------------------------------------------------------------------- bad folders


def _copy_folder(folder: str, dst, config=None, weights=None) -> str:
    os.makedirs(dst)
    with open(os.path.join(folder, 'config.json')) as f:
        cfg = json.load(f)
    with open(os.path.join(dst, 'config.json'), 'w') as f:
        json.dump(config(cfg) if config else cfg, f)
    sd = load_file(os.path.join(folder, 'model.safetensors'))
    save_file(weights(sd) if weights else sd, os.path.join(dst, 'model.safetensors'))
    return str(dst)


def _one_line_error(name: str, match: str, **kwargs) -> str:
    with pytest.raises(TcnnError, match=match) as info:
        timm.create_model(name, pretrained=True, **kwargs)  # offline: a local folder
    assert '\n' not in str(info.value)
    return str(info.value)


def test_folder_whose_config_does_not_fit_its_weights(folder, tmp_path):
    stage4 = _copy_folder(folder, tmp_path / 'stage4', config=lambda c: dict(
        c, model_args=dict(c['model_args'], stages=['layer4'])))
    text = _one_line_error(f'local-dir:{stage4}', r'has GPSA layers layer4\.0\.conv1\.\.layer4\.1\.conv2 \(4\)')
    assert 'the weights have GPSA layers layer3.0.conv1..layer3.1.conv2 (4)' in text
    with pytest.raises(TcnnError, match='GPSA layers'):
        tcnn.load(stage4)
    qk = _copy_folder(folder, tmp_path / 'qk', config=lambda c: dict(c, model_args=dict(c['model_args'], qk_dim=8)))
    _one_line_error(f'local-dir:{qk}', r'do not fit t_resnet18d.*shape mismatch')
    missing = _copy_folder(folder, tmp_path / 'missing',
                           weights=lambda sd: {k: v for k, v in sd.items() if not k.startswith('layer2.1.')})
    _one_line_error(f'local-dir:{missing}', r'do not fit t_resnet18d.*missing \d+ \(e\.g\. layer2\.1\.')


def test_plain_cnn_folders_are_not_t_cnns(tmp_path):
    torch.manual_seed(0)
    cnn = timm.create_model('resnet18d', num_classes=10)
    plain = tmp_path / 'resnet18d'
    save_for_hf(cnn, plain, safe_serialization=True)
    # a plain CNN folder as the weights of a t_ model
    _one_line_error('t_resnet18d', r'holds resnet18d \(a plain CNN, not a T-CNN\)',
                    pretrained_cfg_overlay=dict(file=str(plain)))
    # a config naming the T-CNN over the CNN's weights: never converted on the fly
    renamed = _copy_folder(str(plain), tmp_path / 'renamed', config=lambda c: dict(c, architecture='t_resnet18d'))
    _one_line_error(f'local-dir:{renamed}', 'holds the weights of a plain CNN')
    # tcnn.load of the plain folder is the plain CNN (tcnn.load reads plain CNN files too)
    assert not tcnn.gpsa_layers(tcnn.load(str(plain)))
    # a T-CNN made by tcnn.reparameterize keeps its CNN's timm name: saved so, tcnn.load names the way out
    t_cnn = tcnn.reparameterize(cnn, verify=False)
    mislabelled = tmp_path / 'mislabelled'
    save_for_hf(t_cnn, mislabelled, safe_serialization=True)
    with pytest.raises(TcnnError, match='names the CNN resnet18d but the weights hold GPSA layers'):
        tcnn.load(str(mislabelled))


def test_folder_of_another_t_cnn_and_not_a_folder(folder, tmp_path):
    _one_line_error('t_resnet26d', r'holds t_resnet18d \(a T-CNN of another CNN\)',
                    pretrained_cfg_overlay=dict(file=folder))
    (tmp_path / 'empty').mkdir()
    for name, match in ((str(tmp_path / 'empty'), 'folder without config.json'),
                        (f'local-dir:{tmp_path / "nowhere"}', 'Hub folder not found')):
        with pytest.raises(TcnnError, match=match):
            tcnn.load(name)
    no_weights = tmp_path / 'no-weights'
    no_weights.mkdir()
    (no_weights / 'config.json').write_text(open(os.path.join(folder, 'config.json')).read())
    with pytest.raises(TcnnError, match='cannot load local-dir:.*No suitable checkpoints'):
        tcnn.load(str(no_weights))


# ---------------------------------------------------------------------------------------------- tcnn publish


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope='module')
def converted_file(tmp_path_factory) -> tuple:
    """A verified conversion (a non-vacuous report) of a CNN with pretend-pretrained weights from a local file,
    fine-tuned a little (moved gates), saved with tcnn.save."""
    root = tmp_path_factory.mktemp('converted')
    torch.manual_seed(0)
    cnn = nontrivial(timm.create_model('resnet18d', num_classes=10, zero_init_last=False))
    weights = root / 'my-resnet18d.pth'
    torch.save(cnn.state_dict(), weights)
    source = tcnn.files.sources.create_cnn('resnet18d', weights=str(weights), num_classes=10)
    model = _moved(tcnn.reparameterize(source, stages=[3, 4], input_size=(3, 64, 64)))
    path = root / 't_resnet18d.safetensors'
    tcnn.save(model, str(path))
    return model, str(path)


def test_publish_writes_a_loadable_folder_and_card(converted_file, tmp_path, capsys):
    model, path = converted_file
    out = tmp_path / 'hub' / 'my-t-resnet18d'
    rc, text, err = _run(['publish', path, '--out', str(out)], capsys)
    assert rc == 0, err
    assert sorted(os.listdir(out)) == ['README.md', 'config.json', 'model.safetensors']
    assert os.listdir(out.parent) == ['my-t-resnet18d']  # no temporary folder left
    assert f'local-dir:{out}' in text and 'max rel err' in text
    loaded = timm.create_model(f'local-dir:{out}', pretrained=True)  # offline: a local folder
    _close(_logits(loaded), _logits(model))
    config = json.load(open(out / 'config.json'))
    report = model.tcnn_report
    assert config['architecture'] == 't_resnet18d' and config['model_args']['stages'] == ['layer3', 'layer4']
    assert config['tcnn']['source'] == {'model': 'resnet18d', 'kwargs': {}, 'weights': 'file:my-resnet18d.pth'}
    assert config['tcnn']['report']['max_rel_err'] == report.max_rel_err
    assert config['tcnn']['conversion'] == model.tcnn_config
    card = (out / 'README.md').read_text()
    assert card.startswith('---\ntags:\n- image-classification\n- timm\n')
    assert '# Model card for my-t-resnet18d' in card
    # weights from the user's own file: not the source's published weights, so none of their tag, license or notes
    assert 'license: unknown' in card and 'apache' not in card and 'ra2_in1k' not in card
    cfg = config['pretrained_cfg']
    assert not {'tag', 'license', 'origin_url'} & set(cfg) and 'ra2_in1k' not in json.dumps(config)
    assert cfg['notes'] == ['T-CNN of resnet18d (tcnn) whose source weights came from the local file '
                            'my-resnet18d.pth, not from a published checkpoint: license unknown']
    # converted, not fine-tuned: it computes its CNN's function, so it keeps the CNN's test size (timm's validate.py)
    source_cfg = timm.models.get_pretrained_cfg('resnet18d')
    assert (cfg['test_input_size'], cfg['test_crop_pct']) == (list(source_cfg.test_input_size),
                                                              source_cfg.test_crop_pct)
    assert 'tested at 288x288 (crop 0.95, bicubic)' in card
    for expected in ('`resnet18d`', 'a local checkpoint, `my-resnet18d.pth`', 'layer3, layer4',
                     f'max relative error of {report.max_rel_err:.2g}', f'by {report.init_max_rel_err:.2g}',
                     # the exact configuration's constants are the code's (tcnn.exact_configuration)
                     f'alpha = {tcnn.layers.gpsa.EXACT_LOCALITY:g}, lambda = {tcnn.layers.gpsa.EXACT_GATING:g}',
                     "timm.create_model('local-dir:my-t-resnet18d', pretrained=True)",
                     '@article{dascoli2021transformed'):
        assert expected in card, expected
    summary = tcnn.gpsa_summary(model)['layer4.1.conv2']
    gate = sum(summary['gate']) / len(summary['gate'])
    assert f'| `layer4.1.conv2` | 9 | {gate:.3f} [{min(summary["gate"]):.3f}, {max(summary["gate"]):.3f}] |' in card
    assert 'Fine-tuning' not in card  # not from a training run
    # publishing again replaces the folder as a whole
    rc, _, err = _run(['publish', path, '--out', str(out)], capsys)
    assert rc == 0 and sorted(os.listdir(out.parent)) == ['my-t-resnet18d'], err


def test_card_states_the_exact_configuration_of_the_code(converted_file):
    """The card's alpha and lambda are the ones tcnn.exact_configuration sets (not a copy that can drift)."""
    model, _ = converted_file
    text = tcnn.evaluation.model_card._report_text(model)
    with tcnn.exact_configuration(model):
        layer = tcnn.gpsa_layers(model)[0][1]
        lam, alpha = layer.gating.flatten()[0].item(), layer.locality_strength().flatten()[0].item()
    assert f'(alpha = {alpha:g}, lambda = {lam:g},' in text, text


@pytest.mark.parametrize('origin, text', [
    ('pretrained', "timm's pretrained weights of `resnet50d.a1_in1k` ([timm/resnet50d.a1_in1k]"
                   '(https://huggingface.co/timm/resnet50d.a1_in1k))'),
    ('random', 'random initialisation'), ('file:w.pth', 'a local checkpoint, `w.pth`'), (None, 'not recorded')])
def test_card_names_the_source_weights(origin, text):
    source = {'model': 'resnet50d.a1_in1k', 'weights': origin}
    assert tcnn.evaluation.model_card._source_weights(source).startswith(text)


def test_card_names_pretrained_weights_without_a_hub_copy_without_a_link():
    assert timm.models.get_pretrained_cfg('gcvit_tiny.in1k').hf_hub_id is None  # released on GitHub only
    assert tcnn.evaluation.model_card._source_weights({'model': 'gcvit_tiny.in1k', 'weights': 'pretrained'}) == \
        "timm's pretrained weights of `gcvit_tiny.in1k`"


@pytest.mark.filterwarnings('ignore:the replaced layers do not influence')  # random init: a vacuous check
def test_publish_makes_a_model_card_of_a_training_run(tmp_path, capsys):
    data = make_image_folder(str(tmp_path / 'shapes'), num_classes=3, train_per_class=4, val_per_class=2, size=48)
    run = tmp_path / 'run'
    argv = ['train', '--data', data, '--output', str(run), '--model', 'resnet10t', '--no-pretrained',
            '--epochs', '2', '--batch-size', '4', '--img-size', '48', '--workers', '0', '--no-progress',
            '--lr', '1e-3', '--gating-lr', '1.0', '--set', 'warmup_epochs=1', '--set', 'scale_lr=false',
            '--device', 'cpu', '--set', 'stages=3']
    assert _run(argv, capsys)[0] == 0
    records = [json.loads(line) for line in open(run / 'metrics.jsonl')]
    out = tmp_path / 'published'
    rc, text, err = _run(['publish', str(run), '--out', str(out)], capsys)
    assert rc == 0, err
    best = torch.load(run / 'best.pt', weights_only=True)
    card = (out / 'README.md').read_text()
    row = next(r for r in records if r['epoch'] == best['epoch'])
    for expected in ('## Fine-tuning', 'random initialisation', f'after epoch {best["epoch"] + 1}',
                     f'| top-1 % | {row["val_top1"]:.4g}',
                     f'Best validation top-1 of the run: {best["best_top1"]:.2f}%',
                     '```yaml', 'epochs: 2', 'data: shapes', 'stages: 3', 'layer3'):
        assert expected in card, expected
    assert str(tmp_path) not in card  # the machine's paths stay on the machine
    config = json.load(open(out / 'config.json'))
    # epochs counted from 1, as the card and the console count them (the checkpoint's 'epoch' is 0-based)
    training = config['tcnn']['training']
    assert training['epochs_completed'] == best['epoch'] + 1 and 'epoch' not in training
    assert config['tcnn']['report'] is not None
    loaded = timm.create_model(f'local-dir:{out}', pretrained=True)  # offline: a local folder
    _close(_logits(loaded, 48), _logits(tcnn.load(str(run / 'best.pt')), 48))
    assert f'{run}' in text and 'training    epoch' in text


def test_publish_refuses_bad_input_in_one_line(converted_file, tmp_path, capsys):
    _, path = converted_file
    plain = tmp_path / 'cnn.safetensors'
    tcnn.save(timm.create_model('resnet10t'), str(plain))
    tv = tmp_path / 'tv.pt'
    tv_cnn = tcnn.files.sources.create_cnn('torchvision:resnet18', pretrained=False)
    tcnn.save(tcnn.reparameterize(tv_cnn, verify=False), str(tv))
    busy = tmp_path / 'busy'
    busy.mkdir()
    (busy / 'notes.txt').write_text('mine')
    cases = [
        (['publish', str(tmp_path / 'nope.pt'), '--out', str(tmp_path / 'o')], 'FILE not found'),
        (['publish', str(plain), '--out', str(tmp_path / 'o')], 'holds a plain CNN'),
        (['publish', str(tv), '--out', str(tmp_path / 'o')], 'has no timm architecture'),
        (['publish', path, '--out', str(busy)], 'folder with other files'),
        (['publish', path, '--out', str(tmp_path / 'o'), '--push', 'no-slash'], 'ORG/NAME'),
        (['publish', path, '--out', str(tmp_path / 'o'), '--private'], '--push'),
        (['publish', str(tmp_path), '--out', str(tmp_path / 'o')], 'without best.pt or last.pt'),
    ]
    for argv, message in cases:
        rc, _, err = _run(argv, capsys)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and message in err, (argv, err)
        assert err.startswith('tcnn publish: error: ')
    assert os.listdir(busy) == ['notes.txt'] and not os.path.exists(tmp_path / 'o')


def test_publish_push_offline_keeps_the_folder(converted_file, tmp_path, capsys, monkeypatch):
    """--push cannot be tested without the Hub: offline it fails in one line, after the folder is written."""
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    _, path = converted_file
    out = tmp_path / 'out'
    rc, text, err = _run(['publish', path, '--out', str(out), '--push', 'my-org/t_resnet18d'], capsys)
    assert rc == 2 and err.strip() == ('tcnn publish: error: cannot push to the Hugging Face Hub: HF_HUB_OFFLINE is '
                                       'set (offline mode)')
    assert sorted(os.listdir(out)) == ['README.md', 'config.json', 'model.safetensors']
    assert "timm.create_model('hf-hub:my-org/t_resnet18d', pretrained=True)" in (out / 'README.md').read_text()


def test_non_finite_numbers_of_a_card_become_null_and_others_stay_as_they_are():
    finite = tcnn.evaluation.model_card._finite
    assert [finite(v) for v in (float('nan'), float('inf'), -float('inf'))] == [None, None, None]
    assert [finite(v) for v in (1.5, 0.0, 3, 'nan', None)] == [1.5, 0.0, 3, 'nan', None]


def test_the_hub_config_holds_the_version_source_conversion_report_parameters_and_training_progress():
    model = nn.Module()
    model.tcnn_config = {'stages': [4], 'locality_strength': 1.0}
    source = {'model': 'resnet18d', 'weights': 'random'}
    d = {'source': source, 'parameters': {'total': 10}, 'training': {'epoch': 4, 'best_top1': 71.5,
                                                                     'val_loss': float('nan')}}
    config = tcnn.evaluation.model_card.hub_config(model, d)
    assert config == {'tcnn_version': tcnn.__version__, 'source': source, 'conversion': model.tcnn_config,
                      'report': None, 'parameters': {'total': 10},
                      'training': {'epochs_completed': 5, 'best_top1': 71.5, 'val_loss': None}}
    assert config['conversion'] is not model.tcnn_config  # a copy: the card cannot change the model's record
    # an epoch that is no count (an old checkpoint's) is left out; nothing recorded is None
    assert tcnn.evaluation.model_card.hub_config(model, {'source': source, 'training': {'epoch': None}})['training'] \
        is None
    assert tcnn.evaluation.model_card.hub_config(model, {'source': source})['parameters'] is None


def test_the_cards_conversion_section_lists_the_settings_layers_and_parameters_word_for_word():
    model = nn.Module()
    model.tcnn_config = {'layers': ['layer4.0.conv2', 'layer4.1.conv2'], 'stages': [3, 4], 'locality_strength': 1.0,
                         'gating_init': 2.5, 'qk_dim': None}
    unverified = tcnn.evaluation.model_card._report_text(model)
    section = tcnn.evaluation.model_card._conversion_section(model, {'parameters': {'total': 12_345_678,
                                                                                    'cnn': 11_000_000}})
    assert section == '\n'.join([
        '## Conversion', '', '| setting | value |', '|:---|---:|', '| stages | 3, 4 |',
        '| GPSA layers | 2: `layer4.0.conv2`, `layer4.1.conv2` |', '| initial locality strength alpha | 1 |',
        '| initial gate lambda | 2.5 |', '| qk_dim | default (min(C_in // heads, C_in // groups)) |',
        '| parameters | 12.35M (CNN 11.00M, +1.35M for self-attention) |', '', unverified, ''])
    model.tcnn_config = dict(model.tcnn_config, qk_dim=16, stages=[4], layers=['l.c'], locality_strength=0.25)
    section = tcnn.evaluation.model_card._conversion_section(model, {'parameters': {'total': 5}})
    assert '| qk_dim | 16 |' in section and '| stages | 4 |' in section and '| GPSA layers | 1: `l.c` |' in section
    assert '| initial locality strength alpha | 0.25 |' in section and 'parameters |' not in section
    assert 'parameters |' not in tcnn.evaluation.model_card._conversion_section(model, {})
    # a model of 16 G parameters, 8 G of them the CNN's: the counts in millions, to the hundredth
    section = tcnn.evaluation.model_card._conversion_section(model, {'parameters': {'total': 16e9, 'cnn': 8e9}})
    assert '| parameters | 16000.00M (CNN 8000.00M, +8000.00M for self-attention) |' in section
    # the model's own verification report, in words
    model.tcnn_report = types.SimpleNamespace(batch_size=2, input_size=(3, 64, 64), max_rel_err=1.5e-7,
                                              max_abs_err=2e-6, dtype='float32', float64_max_rel_err=None,
                                              vacuous=False, init_max_rel_err=0.3)
    section = tcnn.evaluation.model_card._conversion_section(model, {})
    assert section.endswith('\n\n' + tcnn.evaluation.model_card._report_text(model) + '\n')
    assert 'to a max relative error of 1.5e-07 (max absolute 2e-06) on 2x3x64x64 random float32 inputs' in section


def test_the_cards_fine_tuning_section_states_the_recipe_the_checkpoint_and_the_metrics_word_for_word():
    training_section = tcnn.evaluation.model_card._training_section
    stored = {'model': 'resnet18d', 'epochs': 10, 'batch_size': 32, 'lr': 5e-4, 'gating_lr': 0.5, 'img_size': 96,
              'data': '/data/sets/shapes/', 'no_sa': False}
    metrics = [{'epoch': 3, 'val_top1': 71.234, 'val_loss': 0.98765, 'train_loss': 1.5},
               {'epoch': 9, 'val_top1': 80.5, 'val_top5': 99.0, 'ema_val_top1': 81.0}]
    assert training_section({'training': {'epoch': 3, 'best_top1': 80.5}, 'recipe': stored}, metrics) == '\n'.join([
        '## Fine-tuning', '',
        'Fine-tuned with `tcnn train` (T-CNN, the recipe of T-CNN section 3 with the values below): 10 epochs '
        'planned, batch 32 per process, lr 0.0005, gating lr 0.5, 96 px.',
        'This checkpoint: after epoch 4.', 'Best validation top-1 of the run: 80.50%.', '',
        '| metric | this checkpoint | last epoch (10) |', '|:---|---:|---:|', '| top-1 % | 71.23 | 80.5 |',
        '| val loss | 0.9877 | - |', '| train loss | 1.5 | - |', '',
        '<details><summary>recipe (paths shortened to their last component)</summary>', '', '```yaml',
        '{model: resnet18d, no_sa: false, data: shapes, img_size: 96, epochs: 10, batch_size: 32,',
        '  lr: 0.0005, gating_lr: 0.5}', '```', '', '</details>', '', ''])
    # the last epoch's checkpoint, no recipe stored, a best top-1 that is not a number: the metrics only
    assert training_section({'training': {'epoch': 9, 'best_top1': float('nan')}}, metrics) == '\n'.join([
        '## Fine-tuning', '', 'This checkpoint: after epoch 10.', '', '| metric | this checkpoint |', '|:---|---:|',
        '| top-1 % | 80.5 |', '| top-5 % | 99 |', '| EMA top-1 % | 81 |', '', ''])
    baseline = training_section({'training': {}, 'recipe': dict(stored, no_sa=True)}, [])
    assert baseline.startswith('## Fine-tuning\n\nFine-tuned with `tcnn train` (no-SA baseline, ')
    assert 'This checkpoint' not in baseline and 'Best validation' not in baseline and '| metric |' not in baseline
    assert training_section({'recipe': stored}, metrics) == ''  # not from a training run
    # the checkpoint before the last of three; the data folder's last component, whatever it ends with
    three = metrics[:1] + [{'epoch': 5, 'val_top1': 75.0}] + metrics[1:]
    section = training_section({'training': {'epoch': 5}, 'recipe': dict(stored, data='/data/shapes-X/')}, three)
    assert '| metric | this checkpoint | last epoch (10) |\n|:---|---:|---:|\n| top-1 % | 75 | 80.5 |' in section
    assert 'data: shapes-X,' in section
    # a checkpoint's recipe is shown as it was, even one a run would refuse now (warm-up longer than the run)
    assert '2 epochs planned' in training_section({'training': {}, 'recipe': {'epochs': 2}}, [])
    with pytest.raises(tcnn.errors.TcnnError) as info:  # a key this release does not know: named, with the source
        training_section({'training': {}, 'recipe': {'epochs': 2, 'fancy_new_key': 1}}, [])
    assert str(info.value) == ("unknown recipe key 'fancy_new_key' in the checkpoint's recipe; keys are listed in "
                               'docs/train.md')


def test_the_cards_small_texts_word_for_word():
    mc = tcnn.evaluation.model_card
    names = [f'c{i}' for i in range(12)]
    assert mc._classes_text({'num_classes': 12, 'label_names': names}) == (
        "12: `c0`, `c1`, `c2`, `c3`, `c4`, `c5`, `c6`, `c7`, `c8`, `c9`, ... (2 more, in config.json's `label_names`)")
    assert mc._classes_text({'num_classes': 3, 'label_names': ['a', 'b', 'c']}) == '3: `a`, `b`, `c`'
    assert mc._classes_text({'num_classes': 10, 'label_names': names[:10]}).endswith('`c9`')
    assert mc._classes_text({'num_classes': 7}) == '7' == mc._classes_text({'num_classes': 7, 'label_names': []})
    assert mc._usage('hf-hub:org/t_resnet18d') == '\n'.join([
        '```python', 'import timm', 'import tcnn  # registers the t_* architectures with timm (pip install tcnn)', '',
        "model = timm.create_model('hf-hub:org/t_resnet18d', pretrained=True).eval()",
        'transform = timm.data.create_transform(**timm.data.resolve_data_config(model=model))',
        "# or: model = tcnn.load('hf-hub:org/t_resnet18d')", '```', ''])
    model = timm.create_model('resnet18d', pretrained=False)  # 224 px, crop 0.875; tested at 288 px, crop 0.95
    assert mc._size_text(model) == '224x224 (crop 0.875, bicubic), tested at 288x288 (crop 0.95, bicubic)'
    model.pretrained_cfg = {k: v for k, v in model.pretrained_cfg.items() if not k.startswith('test_')}
    assert mc._size_text(model) == '224x224 (crop 0.875, bicubic)'


def test_the_cards_verification_text_states_the_reports_numbers_word_for_word():
    model = nn.Module()  # no report at all (no attribute): said so
    assert tcnn.evaluation.model_card._report_text(model) == (
        'The conversion was not verified, or its report was not recorded (converted with `--no-verify`, by '
        '`timm.create_model` directly, or by tcnn 0.3 or earlier).')
    model.tcnn_report = types.SimpleNamespace(batch_size=2, input_size=(3, 64, 48), max_rel_err=1.5e-7,
                                              max_abs_err=2e-6, dtype='float32', float64_max_rel_err=3.2e-16,
                                              vacuous=False, init_max_rel_err=0.3)
    exact = ('Verified at conversion: with every GPSA layer in the exact configuration (alpha = 50, lambda = 40, as '
             '`tcnn.exact_configuration` sets it) the T-CNN computed the CNN\'s logits to a max relative error of '
             '1.5e-07 (max absolute 2e-06) on 2x3x64x48 random float32 inputs.')
    assert tcnn.evaluation.model_card._report_text(model) == exact + (
        ' In float64 the error is 3.2e-16: the float32 figure is the network\'s rounding, not the conversion.'
        ' At the fine-tuning init the T-CNN departed from the CNN by 0.3 (relative), by design: the heads start "on '
        'the verge of locality" (T-CNN section 2).')
    model.tcnn_report = types.SimpleNamespace(**dict(vars(model.tcnn_report), float64_max_rel_err=None, vacuous=True))
    assert tcnn.evaluation.model_card._report_text(model) == exact + (
        ' The converted layers hardly changed those logits (e.g. zero-initialised residual branches), so the check '
        'could not catch a wrong conversion.')


def test_the_model_card_is_its_intro_details_usage_and_sections_word_for_word(converted_file):
    mc = tcnn.evaluation.model_card
    model, path = converted_file
    model, d, metrics = tcnn.files.hub_folder.read_published(path)
    card = mc.model_card(model, d, metrics, location='local-dir:/models/t')
    assert d['source'] == {'model': 'resnet18d', 'kwargs': {}, 'weights': 'file:my-resnet18d.pth'}
    assert (card['license'], card['tags'], card['citation']) == ('unknown', ['image-classification', 'timm', 'tcnn',
                                                                            'transformed-cnn'], mc.PAPER_BIBTEX)
    summary = tcnn.gpsa_summary(model)

    def spread(values):
        return f'{sum(values) / len(values):.3f} [{min(values):.3f}, {max(values):.3f}]'
    gates = '\n'.join([
        '## Gates and spans per layer', '',
        'Per GPSA layer, over its heads: mean [min, max] of the gate sigmoid(lambda) (1: positional attention, the '
        'convolution\'s; 0: content attention) and of the attention span 1/alpha (T-CNN Fig. 4).', '',
        '| layer | heads | gate | span |', '|:---|---:|---:|---:|',
        *[f'| `{name}` | {len(s["gate"])} | {spread(s["gate"])} | {spread(s["span"])} |'
          for name, s in summary.items()],
        ''])
    assert len(summary) == 8 and len({spread(s['gate']) for s in summary.values()}) > 1  # moved gates differ
    assert card['description'] == '\n'.join([
        'A Transformed CNN (T-CNN, [arXiv:2106.05795](https://arxiv.org/abs/2106.05795)) made with tcnn from timm\'s '
        '`resnet18d`: the k x k convolutions of `layer3`, `layer4` are Gated Positional Self-Attention layers (ConViT, '
        'arXiv:2103.10697) that started out as those convolutions (their filters are the output projections) and '
        'were then free to learn content attention.', '', '## Model Details', '',
        f'- **Architecture:** `{model.pretrained_cfg["architecture"]}` (timm; `import tcnn` registers it)',
        '- **Source CNN:** `resnet18d`', '- **Source weights:** a local checkpoint, `my-resnet18d.pth`',
        '- **License:** unknown: the weights did not come from a published checkpoint whose license tcnn knows; the '
        'publisher states it',
        '- **Classes:** 10', f'- **Image size:** {mc._size_text(model)}',
        f'- **Made with:** tcnn {tcnn.__version__}, timm {timm.__version__}, torch {torch.__version__.split("+")[0]}',
        '', '## Usage', '', mc._usage('local-dir:/models/t'), mc._conversion_section(model, d),
        mc._training_section(d, list(metrics)), gates])
    # a source CNN built with arguments, from timm's published weights (named with their tag), under their license
    model.pretrained_cfg = dict(model.pretrained_cfg, license='apache-2.0')
    d = dict(d, source={'model': 'resnet18d.ra2_in1k', 'kwargs': {'drop_rate': 0.1}, 'weights': 'pretrained'})
    card = mc.model_card(model, d, [], location='x')
    assert card['license'] == 'apache-2.0' and '- **License:**' not in card['description']
    assert "made with tcnn from timm's `resnet18d.ra2_in1k`" in card['description']
    assert "- **Source CNN:** `resnet18d.ra2_in1k` with `{'drop_rate': 0.1}`" in card['description']
    # weights from a file: the tag names timm's published weights, not these; a training run's section and metrics
    d = dict(d, source={'model': 'resnet18d.ra2_in1k', 'kwargs': {}, 'weights': 'file:mine.pth'},
             training={'epoch': 0})
    card = mc.model_card(model, d, [{'epoch': 0, 'val_top1': 50.0}], location='x')
    assert "made with tcnn from timm's `resnet18d`:" in card['description']
    assert mc._training_section(d, [{'epoch': 0, 'val_top1': 50.0}]) in card['description']
    assert '| top-1 % | 50 |' in card['description']
