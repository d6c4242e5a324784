"""CPU tests of what went wrong on a GPU machine (the H100 run of issue 13): the CPU training tests pin their device,
more processes than GPUs fail with one line naming the fix, and conversion verification runs with TF32 off whatever
the caller's settings, restoring them afterwards. CUDA is faked where needed, so these run on the CPU CI."""
import warnings
from typing import Iterator, List, Tuple

import pytest
import timm
import torch
import yaml

import tcnn
import tcnn.train.distributed
from tcnn.train import launch
from tcnn.convert.verify import full_precision_matmul
from tcnn.errors import TcnnError
from tcnn.runtime.devices import resolve_device

from devices import DEVICE
from test_convert import _nontrivial_batchnorm
from test_train import common

Switches = Tuple[bool, bool, str]


def _switches() -> Switches:
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision())


@pytest.fixture
def tf32_on() -> Iterator[Switches]:
    """TF32 on for matmuls ('medium': not the default, so a restore to a default value cannot pass by chance) and
    cuDNN, as ``tcnn train`` leaves them on a GPU; the process's own switches come back after the test."""
    saved = _switches()
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision('medium')
    try:
        yield _switches()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


# ------------------------------------------------------------------------------------------------- device of the tests

def test_training_tests_pin_the_device(tmp_path, capsys):
    """The shared arguments of the training tests name the device: the default (auto) is cuda on a GPU machine,
    where two torchrun processes on one GPU fail and an autotuned resumed run is not bit-exact. One process trains
    where TCNN_TEST_DEVICE says (the CPU unless set; on the GPU deterministically), several on the CPU."""
    for processes, device in ((1, DEVICE), (2, 'cpu')):
        assert launch.main(common(str(tmp_path), tmp_path / 'out', processes=processes) + ['--print-config']) == 0
        config = yaml.safe_load(capsys.readouterr().out)
        assert config['device'] == device and config['deterministic'] == (device == 'cuda')


# -------------------------------------------------------------------------------------------- more processes than GPUs

@pytest.fixture
def gpus(monkeypatch) -> List[torch.device]:
    """A machine with CUDA and as many GPUs as the test sets (``gpus.count``); records set_device calls."""
    calls: List[torch.device] = []
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)
    monkeypatch.setattr(torch.cuda, 'set_device', calls.append)
    monkeypatch.setattr(tcnn.train.distributed.dist, 'init_process_group', lambda **kwargs: None)  # never reached
    for name in ('WORLD_SIZE', 'RANK', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE'):
        monkeypatch.delenv(name, raising=False)
    return calls


def _torchrun_env(monkeypatch, rank: int, world: int, local_world: bool = True) -> None:
    monkeypatch.setenv('WORLD_SIZE', str(world))
    monkeypatch.setenv('RANK', str(rank))
    monkeypatch.setenv('LOCAL_RANK', str(rank))
    if local_world:
        monkeypatch.setenv('LOCAL_WORLD_SIZE', str(world))


@pytest.mark.parametrize('device', ['auto', 'cuda'])
def test_rank_without_a_gpu_names_the_fix(gpus, monkeypatch, device):
    """Rank 1 of 2 on a 1-GPU machine: CUDA would say 'invalid device ordinal'."""
    _torchrun_env(monkeypatch, rank=1, world=2, local_world=False)
    with pytest.raises(TcnnError) as e:
        tcnn.train.distributed.setup_distributed(device)
    assert str(e.value) == ('process LOCAL_RANK=1 needs cuda:1 but this machine has 1 GPU: start at most 1 process '
                            'per node (torchrun --nproc_per_node 1) or pass --device cpu')
    assert gpus == []


def test_rank_zero_fails_too_so_the_error_is_printed(gpus, monkeypatch, tmp_path, capsys):
    """Rank 0 has its GPU, but it is the rank that prints errors and it would wait for the others: torchrun's
    LOCAL_WORLD_SIZE tells it that the node has more processes than GPUs."""
    _torchrun_env(monkeypatch, rank=0, world=2)
    assert launch.main(['--data', str(tmp_path), '--output', str(tmp_path / 'out'), '--no-pretrained']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ['tcnn train: error: 2 processes on this node need 2 GPUs but this machine has 1 GPU: start at most '
                   '1 process per node (torchrun --nproc_per_node 1) or pass --device cpu']
    assert gpus == []


def test_devices_resolve_to_the_ranks_gpu_or_name_the_gpus_there_are(gpus, monkeypatch):
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    _torchrun_env(monkeypatch, rank=1, world=2)
    assert resolve_device('auto', 2, 1, 2) == torch.device('cuda', 1) == gpus[-1]
    assert resolve_device('cuda:1', 1, 0) == torch.device('cuda', 1) == gpus[-1]
    with pytest.raises(TcnnError, match=r'^device cuda:2 requested but this machine has 2 GPUs \(cuda:0 to cuda:1\): '
                                        'pass one of them or --device cpu$'):
        resolve_device('cuda:2', 1, 0)
    # --device cpu: any number of processes
    assert resolve_device('cpu', 2, 5, 2) == torch.device('cpu')
    assert len(gpus) == 2


# ----------------------------------------------------------------------------------------------- TF32 and verification

def _spy(model: torch.nn.Module, seen: List[Switches]) -> None:
    model.register_forward_pre_hook(lambda module, args: seen.append(_switches()))


def test_verification_runs_without_tf32_and_restores_the_switches(tf32_on):
    cnn = _nontrivial_batchnorm(timm.create_model('resnet18d', num_classes=5))
    seen: List[Switches] = []
    _spy(cnn, seen)  # the copy made by reparameterize shares the hook and its list
    t_cnn = tcnn.reparameterize(cnn, input_size=(3, 64, 64))
    assert len(seen) == 4  # the CNN, then the T-CNN exact, at init and content-only
    assert set(seen) == {(False, False, 'highest')}
    assert _switches() == tf32_on == (True, True, 'medium')
    seen.clear()
    tcnn.check_equivalence(cnn, t_cnn, input_size=(3, 64, 64))  # a measurement: under the caller's settings
    assert set(seen) == {tf32_on}


def test_switches_restored_when_verification_fails(tf32_on):
    class Boom(Exception):
        pass

    def explode(module, args):
        raise Boom

    cnn = timm.create_model('resnet18d', num_classes=5)
    cnn.register_forward_pre_hook(explode)
    with pytest.raises(Boom), warnings.catch_warnings():
        warnings.simplefilter('ignore')
        tcnn.reparameterize_(cnn, input_size=(3, 64, 64))
    assert _switches() == tf32_on
    with pytest.raises(Boom), full_precision_matmul():
        assert _switches() == (False, False, 'highest')
        raise Boom
    assert _switches() == tf32_on
