"""Files written by the previous release load in this one and compute the same logits.

``tests/fixtures/tcnn-0.3.1/`` holds files tcnn 0.3.1 wrote (``make.py`` there says how): T-CNN files in ``.pt`` and
``.safetensors`` (dense GPSA layers, format version 2; depthwise ones, version 3), a training checkpoint with
optimiser state and EMA weights, and a Hub folder written by ``tcnn publish``; ``expected.pt`` holds the logits
0.3.1 computed from each on a fixed input.
"""
import os

import pytest
import timm
import torch

import tcnn
from tcnn.convert.settings import gpsa_layers

FIXTURES = os.path.join(os.path.dirname(__file__), 'fixtures', 'tcnn-0.3.1')
EXPECTED = torch.load(os.path.join(FIXTURES, 'expected.pt'), weights_only=True)


def _assert_same_logits(model: torch.nn.Module, key: str) -> None:
    with torch.no_grad():
        out = model.eval()(EXPECTED['input'])
    reference = EXPECTED[key]
    assert out.shape == reference.shape
    assert torch.isfinite(out).all()
    # the same kernels on the same input: equal up to float32 rounding of a changed summation order, at most
    err = (out - reference).abs().max() / reference.abs().max()
    assert err <= 1e-5, f'{key}: max rel err {err:.2g}'


@pytest.mark.parametrize('name, key, layers', [
    ('t_demo_resnet10.pt', 't_demo_resnet10', 2),
    ('t_demo_resnet10.safetensors', 't_demo_resnet10', 2),
    ('t_test_convnext.safetensors', 't_test_convnext', 1),
])
def test_t_cnn_files_of_the_previous_release(name, key, layers):
    model = tcnn.load(os.path.join(FIXTURES, name))
    assert len(gpsa_layers(model)) >= layers
    _assert_same_logits(model, key)


@pytest.mark.parametrize('ema, key', [(False, 'run_last'), (True, 'run_last_ema')])
def test_training_checkpoint_of_the_previous_release(ema, key):
    _assert_same_logits(tcnn.load(os.path.join(FIXTURES, 'run_last.pt'), ema=ema), key)


def test_training_checkpoint_weights_differ_from_its_ema():
    # the two fixtures above are not the same tensor twice: the EMA test checks the EMA weights
    assert not torch.allclose(EXPECTED['run_last'], EXPECTED['run_last_ema'])


def test_hub_folder_of_the_previous_release():
    folder = os.path.join(FIXTURES, 'hub_folder')
    _assert_same_logits(tcnn.load(folder), 'hub_folder')
    _assert_same_logits(timm.create_model(f'local-dir:{folder}', pretrained=True), 'hub_folder')


def test_training_checkpoint_of_the_previous_release_keeps_its_run_size():
    from timm.data import resolve_data_config
    model = tcnn.load(os.path.join(FIXTURES, 'run_last.pt'))
    config = resolve_data_config({}, model=model, use_test_size=True)
    assert config['input_size'] == (3, 48, 48)  # the run trained and validated at 48 px (test_resnet's own: 160)


def test_timm_loads_previous_release_files_with_their_records():
    """Through timm's pretrained_cfg_overlay too, a 0.3.1 training checkpoint gets its run's size (not the source's
    test size) and no tag or license of the source's published weights (it was trained from a random init)."""
    from timm.data import resolve_data_config
    model = timm.create_model('t_test_resnet', pretrained=True,  # offline: a local file
                              pretrained_cfg_overlay=dict(file=os.path.join(FIXTURES, 'run_last.pt')))
    _assert_same_logits(model, 'run_last')
    assert resolve_data_config({}, model=model, use_test_size=True)['input_size'] == (3, 48, 48)
    assert 'license' not in model.pretrained_cfg and 'tag' not in model.pretrained_cfg
