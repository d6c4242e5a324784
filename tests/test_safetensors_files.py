"""T-CNN files in safetensors (``tcnn.files.tcnn_file``): the settings of a torch file in the metadata, safetensors'
convention, tensors it can store (no shared storage, on the CPU, copied only where they must be), and its refusals."""
import json
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import tcnn
from tcnn.files import tcnn_file
from tcnn.errors import TcnnError


def test_safetensors_holds_the_same_settings(t_model, tmp_path):
    tcnn.save(t_model, str(tmp_path / 'model.pt'))
    tcnn.save(t_model, str(tmp_path / 'model.safetensors'))
    d = torch.load(tmp_path / 'model.pt', weights_only=True)
    with safe_open(str(tmp_path / 'model.safetensors'), framework='pt') as f:
        settings = json.loads(f.metadata()['tcnn'])
        assert set(f.keys()) == set(d['state_dict'])
    assert settings == {k: v for k, v in d.items() if k != 'state_dict'}


def test_a_safetensors_file_keeps_the_convention_and_goes_where_it_is_mapped(t_model, tmp_path):
    """``.safetensors``: the metadata's ``'format': 'pt'`` (safetensors' convention for torch tensors); read with no
    map_location the tensors stay on the CPU, with one they go there (the meta device: no memory)."""
    path = tcnn.save(t_model, str(tmp_path / 'm.safetensors'))
    with safe_open(path, framework='pt') as f:
        assert f.metadata()['format'] == 'pt'
    assert all(v.device.type == 'cpu' for v in tcnn_file.read(path, map_location=None)['state_dict'].values())
    state_dict = tcnn_file.read_raw(path, map_location='meta')['state_dict']
    assert set(state_dict) == set(t_model.state_dict()) and all(v.is_meta for v in state_dict.values())


def test_a_safetensors_file_that_safetensors_refuses_is_corrupt_with_its_reason(tmp_path):
    """A layout that holds (8-byte header length, JSON header, the bytes its offsets name) around a tensor whose
    shape needs more bytes than its offsets give: safetensors refuses it, and the message gives safetensors' own
    reason, its exception's name first."""
    header = json.dumps({'w': {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 4]}}).encode()
    path = tmp_path / 'bad.safetensors'
    path.write_bytes(struct.pack('<Q', len(header)) + header + bytes(4))
    with pytest.raises(TcnnError) as e:
        tcnn_file.read(str(path))
    assert str(e.value).startswith(f'{path} is corrupt (not a valid safetensors file: SafetensorError: ')
    assert str(e.value).endswith('): re-download or re-save it')


def test_a_safetensors_file_mapped_to_a_device_it_cannot_reach_says_so(t_model, tmp_path):
    """A device torch knows by name but cannot use here (Apple's ``mps`` on a machine without it): the tensors read on
    the CPU cannot move there, and the one-line error names the file, the map_location and torch's own reason."""
    if torch.backends.mps.is_available():
        pytest.skip('this machine has an mps device: the move succeeds')
    try:
        torch.zeros(1).to('mps')
    except RuntimeError as e:  # torch's reason, e.g. "PyTorch is not linked with support for mps devices"
        reason = ' '.join(str(e).split())
    else:
        pytest.skip('torch moves tensors to mps here')
    assert reason and '. ' not in reason and ': ' not in reason[20:] and len(reason) <= 160  # one sentence, whole
    path = tcnn.save(t_model, str(tmp_path / 'm.safetensors'))
    with pytest.raises(TcnnError) as e:
        tcnn_file.read(path, map_location='mps')
    assert str(e.value) == f"cannot load {path} onto map_location='mps': RuntimeError: {reason}"


def test_safetensors_tensors_share_no_storage_and_copy_only_what_they_must(tmp_path):
    """What ``.safetensors`` stores of a state dict: the same values, contiguous, no two tensors on one storage (tied
    weights, views: safetensors refuses them), and the state dict's own memory wherever it can be (saving a large
    model must not hold a second copy of every weight). Empty tensors share no bytes: left as they are."""
    from safetensors.torch import load_file
    w = torch.arange(12.).reshape(3, 4)
    state_dict = {'w': w, 'tied': w, 'row': w[1], 'wt': w.t(), 'other': torch.ones(2), 'empty': torch.zeros(0),
                  'empty_too': torch.zeros(0)}
    tensors = tcnn_file.safetensors_tensors(state_dict)
    assert list(tensors) == list(state_dict)
    for name, tensor in tensors.items():
        assert tensor.device.type == 'cpu' and tensor.is_contiguous() and torch.equal(tensor, state_dict[name])
    storages = [t.untyped_storage().data_ptr() for t in tensors.values() if t.numel()]
    assert len(set(storages)) == len(storages)  # 'tied' and 'row' are copies, 'wt' made contiguous
    assert tensors['w'].data_ptr() == w.data_ptr() and tensors['other'].data_ptr() == state_dict['other'].data_ptr()
    path = str(tmp_path / 'tied.safetensors')
    save_file(tensors, path)  # safetensors' own check of shared storage
    assert all(torch.equal(t, state_dict[k]) for k, t in load_file(path).items())


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
def test_safetensors_tensors_of_a_gpu_model_are_on_the_cpu():
    tensors = tcnn_file.safetensors_tensors({'w': torch.arange(4.).cuda()})
    assert tensors['w'].device.type == 'cpu' and torch.equal(tensors['w'], torch.arange(4.))
