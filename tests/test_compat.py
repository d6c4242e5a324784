"""Files written by earlier releases load in this one and compute the same logits.

``tests/fixtures/tcnn-RELEASE/`` holds files that tcnn RELEASE wrote (``tests/fixtures/make_release_files.py`` says
how): T-CNN files in ``.pt`` and ``.safetensors`` (dense GPSA layers, format version 2; depthwise ones, version 3), a
training checkpoint with optimiser state and EMA weights, and a Hub folder written by ``tcnn publish``; ``expected.pt``
holds the logits that release computed from each on a fixed input. 0.3.1 files have no checksums, no class names and
no stored test size; 0.4.0 files have all three, and were written by the last release before the package's modules
moved into subpackages (0.5.0); 0.5.1 files were written by the last release before the layout's second step (0.6.0:
no import cycles, export and data split by concept, a typed recipe).
"""
import os

import pytest
import timm
import torch

import tcnn
from tcnn.convert.settings import gpsa_layers

from helpers import rel_err

RELEASES = ('0.3.1', '0.4.0', '0.5.1')


@pytest.fixture(params=RELEASES, scope='module')
def release(request):
    """(fixture folder, what that release computed) of each earlier release."""
    folder = os.path.join(os.path.dirname(__file__), 'fixtures', f'tcnn-{request.param}')
    expected = torch.load(os.path.join(folder, 'expected.pt'), weights_only=True)
    assert expected['versions']['tcnn'] == request.param
    return folder, expected


def _assert_same_logits(model: torch.nn.Module, expected: dict, key: str) -> None:
    with torch.no_grad():
        out = model.eval()(expected['input'])
    reference = expected[key]
    assert out.shape == reference.shape
    assert torch.isfinite(out).all()
    # the same kernels on the same input: equal up to float32 rounding of a changed summation order, at most
    err = rel_err(out, reference)
    assert err <= 1e-5, f'{key}: max rel err {err:.2g}'


@pytest.mark.parametrize('name, key, layers', [
    ('t_demo_resnet10.pt', 't_demo_resnet10', 2),
    ('t_demo_resnet10.safetensors', 't_demo_resnet10', 2),
    ('t_test_convnext.safetensors', 't_test_convnext', 1),
])
def test_t_cnn_files_of_earlier_releases_load_with_the_same_logits(release, name, key, layers):
    folder, expected = release
    model = tcnn.load(os.path.join(folder, name))
    assert len(gpsa_layers(model)) >= layers
    _assert_same_logits(model, expected, key)


@pytest.mark.parametrize('ema, key', [(False, 'run_last'), (True, 'run_last_ema')])
def test_training_checkpoints_of_earlier_releases_load_with_the_same_logits(release, ema, key):
    folder, expected = release
    _assert_same_logits(tcnn.load(os.path.join(folder, 'run_last.pt'), ema=ema), expected, key)


def test_training_checkpoint_weights_differ_from_its_ema(release):
    # the two fixtures above are not the same tensor twice: the EMA test checks the EMA weights
    _, expected = release
    assert not torch.allclose(expected['run_last'], expected['run_last_ema'])


def test_hub_folders_of_earlier_releases_load_with_the_same_logits(release):
    folder, expected = release
    hub_folder = os.path.join(folder, 'hub_folder')
    _assert_same_logits(tcnn.load(hub_folder), expected, 'hub_folder')
    _assert_same_logits(timm.create_model(f'local-dir:{hub_folder}', pretrained=True), expected, 'hub_folder')


def test_training_checkpoint_of_earlier_releases_keeps_its_run_size(release):
    from timm.data import resolve_data_config
    folder, _ = release
    model = tcnn.load(os.path.join(folder, 'run_last.pt'))
    config = resolve_data_config({}, model=model, use_test_size=True)
    assert config['input_size'] == (3, 48, 48)  # the run trained and validated at 48 px (test_resnet's own: 160)


def test_timm_loads_earlier_release_files_with_their_records(release):
    """Through timm's pretrained_cfg_overlay too, an earlier release's training checkpoint gets its run's size (not
    the source's test size) and no tag or license of the source's published weights (it was trained from a random
    init)."""
    from timm.data import resolve_data_config
    folder, expected = release
    model = timm.create_model('t_test_resnet', pretrained=True,  # offline: a local file
                              pretrained_cfg_overlay=dict(file=os.path.join(folder, 'run_last.pt')))
    _assert_same_logits(model, expected, 'run_last')
    assert resolve_data_config({}, model=model, use_test_size=True)['input_size'] == (3, 48, 48)
    assert 'license' not in model.pretrained_cfg and 'tag' not in model.pretrained_cfg
