"""Weight files: the one ``torch.load`` (always ``weights_only=True``), safetensors state dicts, checkpoints of
timm's train.py and of Lightning (wrappers, prefixes, EMA weights), and what a state dict shows of itself (its GPSA
layers, its classifier head, the keys that do not fit a model).

Every file tcnn reads goes through here (``tcnn.files.tcnn_file``'s formats included), with one-line errors for a
missing path, a folder, an empty or truncated file and one holding pickled code. Where the model a file is loaded
into comes from is ``tcnn.files.sources``.
"""
import argparse
import os
import pickle
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from safetensors.torch import load_file

from .. import compat  # noqa: F401  (its import refuses a torch older than tcnn supports, in one line)
from ..errors import InvalidTypeError, TcnnError, check_device
from ..paths import check_input_file

__all__ = ['ZIP_MAGIC', 'PICKLE_MAGIC', 'error_reason', 'check_map_location', 'check_path', 'file_head',
           'load_torch_file', 'clean_state_dict', 'load_state_dict_file', 'state_dict_misfit', 'shared_prefix',
           'strip_wrapper_prefix', 'GPSA_KEY', 'gpsa_layer_names', 'checkpoint_head', 'checkpoint_num_classes']

# Where checkpoints keep their weights: the raw model first, its EMA only when asked for (timm's validate.py loads
# the EMA only with --use-ema; timm's train.py writes both 'state_dict' and 'state_dict_ema')
_WRAPPER_KEYS = ('state_dict', 'model')
_EMA_KEYS = ('state_dict_ema', 'model_ema')
ZIP_MAGIC = b'PK\x03\x04'  # torch.save's (zip) format
PICKLE_MAGIC = b'\x80'  # torch.save's legacy format starts with a pickle protocol opcode


def error_reason(e: BaseException) -> str:
    """The first sentence of an exception's message (torch's are paragraphs)."""
    text = ' '.join(str(e).split())
    for end in ('. ', ': '):
        if end in text[20:]:
            text = text[:20 + text[20:].index(end)]
            break
    return f'{type(e).__name__}: {text[:160]}'


def _read_torch(path: str, map_location: Union[str, torch.device, None], what: str = 'T-CNN file') -> Any:
    # timm's train.py stores its argparse.Namespace of flags ('args') in every checkpoint: allowed, as timm's own
    # loader allows it (a Namespace unpickles as a plain attribute bag, its values under weights_only's rules).
    # Made before the try: only what torch.load raises may say that the file is corrupt.
    allowed = torch.serialization.safe_globals([argparse.Namespace])
    try:
        with allowed:
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's own message advises weights_only=False, i.e. running the file's code: never repeat that advice
        raise TcnnError(f'{path} is not a {what}: it holds pickled Python objects other than tensors and plain '
                        'values, which tcnn never loads (unpickling can run code); save a state_dict '
                        '(torch.save(model.state_dict(), PATH)) or a safetensors file instead') from e
    except (RuntimeError, EOFError, OSError, ValueError, AttributeError, ImportError, IndexError, KeyError) as e:
        if isinstance(e, RuntimeError) and 'device' in str(e).lower() and map_location not in (None, 'cpu'):
            raise TcnnError(f'cannot load {path} onto map_location={map_location!r}: {error_reason(e)}') from e
        raise TcnnError(f'cannot read {path}: truncated or corrupt torch file ({error_reason(e)})') from e


def check_map_location(map_location: Any) -> None:
    """A device string torch does not know is the caller's mistake, not a corrupt file."""
    if (map_location is None or isinstance(map_location, dict)
            or (callable(map_location) and not isinstance(map_location, (str, torch.device)))):
        return  # torch.load's remapping forms
    check_device(map_location, 'map_location')


def check_path(path: Any, name: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidTypeError(f'{name} must be a file path (str or os.PathLike), got {type(path).__name__}')
    return os.fspath(path)


def file_head(path: str, what: str) -> bytes:
    """The first bytes of a user-named file, or a one-line error: missing, a folder, empty."""
    with open(check_input_file(path, what), 'rb') as f:
        return f.read(8)


def load_torch_file(path: str, what: str = 'file', map_location: Union[str, torch.device, None] = 'cpu') -> Any:
    """``torch.load(path, weights_only=True)`` of a file a user named, with one-line ``TcnnError``s for a missing
    path, a folder, an empty file, a file that is not a torch file and one holding pickled code.

    Args:
        path: The file.
        what: Its role, for messages (e.g. ``'checkpoint'``, ``'weights file'``).
        map_location: As in ``torch.load``.
    """
    path = check_path(path, 'path')
    check_map_location(map_location)
    head = file_head(path, what)
    if not head.startswith((ZIP_MAGIC, PICKLE_MAGIC)):
        raise TcnnError(f'{what} {path} is not a torch file (neither a torch zip archive nor a legacy torch file)')
    return _read_torch(path, map_location, what=what)


def clean_state_dict(checkpoint: Any, use_ema: bool = False) -> Dict[str, torch.Tensor]:
    """Unwrap a checkpoint into a plain state_dict: ``state_dict``/``model`` wrappers (nested too) and ``module.``
    (DDP) / ``_orig_mod.`` (torch.compile) prefixes are handled.

    Args:
        checkpoint: What ``torch.load`` returned.
        use_ema: Take the EMA weights (``state_dict_ema``/``model_ema``) instead of the raw ones; a checkpoint
            without them is an error, never the raw weights in their place. Without it the raw weights are taken,
            as timm's validate.py does without ``--use-ema``; a checkpoint that holds only EMA weights gives those.
    """
    sd, found_ema = checkpoint, False
    for _ in range(3):  # wrappers can nest (e.g. {'model': {'state_dict': ...}})
        if not isinstance(sd, dict):
            break
        raw = next((k for k in _WRAPPER_KEYS if isinstance(sd.get(k), dict)), None)
        ema = next((k for k in _EMA_KEYS if isinstance(sd.get(k), dict)), None)
        key = ema if use_ema and ema is not None else raw or ema
        if key is None:
            break
        found_ema = found_ema or key in _EMA_KEYS
        sd = sd[key]
    if use_ema and not found_ema:
        raise TcnnError(f'the checkpoint holds no EMA weights (no {"/".join(_EMA_KEYS)} entry): load its raw weights '
                        '(without use_ema / --use-ema)')
    if not isinstance(sd, dict) or not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise TcnnError('the checkpoint holds no state_dict (expected a dict of tensors, possibly under '
                        f'{"/".join(_WRAPPER_KEYS + _EMA_KEYS)})')
    out = {}
    for k, v in sd.items():
        for prefix in ('module.', '_orig_mod.'):
            if k.startswith(prefix):
                k = k[len(prefix):]
        out[k] = v
    return out


def load_state_dict_file(path: str, use_ema: bool = False) -> Dict[str, torch.Tensor]:
    """Load a ``.pt``/``.pth``/``.bin``/``.safetensors`` checkpoint safely (no unpickling of code); ``use_ema`` as in
    ``clean_state_dict``."""
    if not path.endswith('.safetensors'):
        return _clean_file_state_dict(load_torch_file(path, 'weights file'), path, use_ema)
    file_head(path, 'weights file')  # missing, a folder, empty: one line each
    try:
        tensors = load_file(path, device='cpu')
    except Exception as e:  # safetensors raises its own SafetensorError, OSError and ValueError
        reason = ' '.join(str(e).split())[:160] or type(e).__name__
        raise TcnnError(f'cannot read weights from {path}: not a valid safetensors file ({reason})') from e
    return _clean_file_state_dict(tensors, path, use_ema)


def _clean_file_state_dict(checkpoint: Any, path: str, use_ema: bool) -> Dict[str, torch.Tensor]:
    try:
        return clean_state_dict(checkpoint, use_ema)
    except TcnnError as e:
        raise TcnnError(f'{path}: {e}') from None


def state_dict_misfit(model: nn.Module, state_dict: Dict[str, torch.Tensor],
                      optional: Union[str, Tuple[str, ...]] = '') -> str:
    """What keeps ``state_dict`` from loading strictly into ``model`` ('' when it fits): keys missing, unexpected
    and of another shape. Keys under the prefix ``optional`` (a classifier head; or a tuple of prefixes) may be
    missing or mismatched."""
    expected = model.state_dict()
    allowed = (lambda k: bool(optional) and k.startswith(optional))
    missing = [k for k in expected if k not in state_dict and not allowed(k)]
    unexpected = [k for k in state_dict if k not in expected]
    mismatched = [k for k in expected if k in state_dict and expected[k].shape != state_dict[k].shape
                  and not allowed(k)]
    return '; '.join(f'{label} {len(keys)} (e.g. {", ".join(keys[:3])})' for label, keys in
                     (('missing', missing), ('unexpected', unexpected), ('shape mismatch', mismatched)) if keys)


def shared_prefix(state_dict: Dict[str, Any]) -> str:
    """The first key component that every key of ``state_dict`` starts with (``'model.'``), else ''."""
    first = {k.split('.', 1)[0] + '.' if '.' in k else '' for k in state_dict}
    return first.pop() if len(first) == 1 else ''


def strip_wrapper_prefix(state_dict: Dict[str, torch.Tensor], model_keys: Callable[[], Iterable[str]]
                         ) -> Tuple[Dict[str, torch.Tensor], str]:
    """``(state_dict, note)``: the keys without the prefix a wrapper module added to every one of them (a Lightning
    module's ``self.model`` gives ``model.conv1.weight``; nested wrappers give several), removed one component at a
    time while all keys share one and none is a key of the model (``model_keys()``, called only when every key
    shares a prefix). The stripped keys are taken only when some are the model's keys, else the state dict is
    returned as it is; either way the caller's strict load checks every key and shape (never a different model).
    ``note`` is what a message about keys that do not fit adds about the prefix ('' when there is none)."""
    removed, sd, expected = '', state_dict, None
    while True:
        prefix = shared_prefix(sd)
        if not prefix:
            break
        expected = set(model_keys()) if expected is None else expected
        if not expected.isdisjoint(sd):
            break
        sd, removed = {k[len(prefix):]: v for k, v in sd.items()}, removed + prefix
    if not removed:
        return state_dict, ''
    if expected.isdisjoint(sd):
        return state_dict, (f' (every key starts with {removed!r}; neither with nor without it are they this '
                            'model\'s keys: the weights of another model?)')
    return sd, f' (after removing the prefix {removed!r} that all its keys share, as a wrapper module adds)'


GPSA_KEY = '.pos_centers'  # one per GPSA layer: a T-CNN's state dict shows its GPSA layers by these keys


def gpsa_layer_names(state_dict: Union[Dict[str, Any], Iterable[str]]) -> List[str]:
    """The GPSA layers whose weights a state dict (or its keys) holds, sorted."""
    return sorted(k[:-len(GPSA_KEY)] for k in state_dict if k.endswith(GPSA_KEY))


def checkpoint_head(state_dict: Dict[str, torch.Tensor], classifiers: Sequence[str]) -> Optional[Tuple[str, int]]:
    """``(name, classes)`` of the first of ``classifiers`` whose weight ``state_dict`` holds, else None."""
    for name in classifiers:
        weight = state_dict.get(f'{name}.weight')
        if isinstance(weight, torch.Tensor) and weight.ndim >= 1:
            return name, weight.shape[0]
    return None


def checkpoint_num_classes(
        state_dict: Dict[str, torch.Tensor],
        classifiers: Sequence[str],
        num_classes: Optional[int] = None,
        where: str = 'the checkpoint',
        classes_of: Optional[str] = None,
) -> Optional[int]:
    """The class count of a model built for ``state_dict``: its head's unless ``num_classes`` is given (timm's
    ``create_model(num_classes=...)`` convention; with neither, None: the model's default).

    A head that an explicit, different ``num_classes`` drops is one warning naming it: the model gets a new, randomly
    initialised head, which a check against the CNN built the same way cannot see.

    Args:
        state_dict: The checkpoint's weights.
        classifiers: The head's module names (``classifier_names``); the first found in ``state_dict`` counts.
        num_classes: The caller's class count, or None.
        where: The checkpoint, for the warning.
        classes_of: Whose class count ``num_classes`` is, for the warning (``"the data's"``: ``tcnn train`` takes it
            from the data, the user gave none); default: the caller's ``num_classes``.
    """
    found = checkpoint_head(state_dict, classifiers)
    if found is None:
        if classifiers and num_classes != 0:
            warnings.warn(f'{where} holds no classifier head ({classifiers[0]!r}): the model\'s head is new, randomly '
                          'initialised', stacklevel=3)
        return num_classes
    head, classes = found
    if num_classes is None:
        return classes
    if num_classes != classes:
        new = (f'for {classes_of} {num_classes} classes' if classes_of else
               f'(num_classes={num_classes}); leave num_classes out to keep it')
        warnings.warn(f'{where}: its head {head!r} ({classes} classes) is dropped for a new, randomly initialised one '
                      f'{new}', stacklevel=3)
    return num_classes
