"""Create source CNNs by name (timm or torchvision) with pretrained, local or random weights.

Offline behaviour matters here: timm alone retries a download for about 50 s before failing. We look in the local
caches first, then probe the weight host with a short timeout, and fail within seconds with a
``WeightsUnavailableError`` whose message names the Python fix (``pretrained=False``, or local weights through
``weights=``/``pretrained_cfg_overlay=dict(file=...)``); the commands re-word it with their flags
(``--weights``/``--no-pretrained``) through ``WeightsUnavailableError.with_hint``.
"""
import difflib
import os
import socket
import urllib.parse
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from .errors import InvalidTypeError, TcnnError, check_number

__all__ = ['TORCHVISION_PREFIX', 'split_model_name', 'create_cnn', 'load_state_dict_file', 'clean_state_dict',
           'WeightsUnavailableError', 'PYTHON_HINT', 'CLI_HINT', 'OFFLINE_HINT']

TORCHVISION_PREFIX = 'torchvision:'
# What to do without the pretrained weights, in the caller's terms: Python arguments, or the flags of tcnn
# convert/train (which translate the error, see WeightsUnavailableError.with_hint).
PYTHON_HINT = ('pass pretrained=False (random init) or local weights: timm.create_model(..., '
               'pretrained_cfg_overlay=dict(file=PATH)), tcnn.hub.create_cnn(..., weights=PATH), or tcnn.load(PATH) '
               'for a saved T-CNN')
CLI_HINT = 'pass --weights PATH (a local checkpoint) or --no-pretrained (random init)'
OFFLINE_HINT = CLI_HINT  # the name of CLI_HINT before it had a Python counterpart; kept for existing callers
PROBE_TIMEOUT_S = 3.0
_WRAPPER_KEYS = ('state_dict_ema', 'model_ema', 'state_dict', 'model')


class WeightsUnavailableError(TcnnError):
    """Pretrained weights cannot be had (offline and not cached, no weights published, a failed download).

    The message is ``REASON: HINT``. ``hint`` defaults to the Python fix (``PYTHON_HINT``); a command that reaches
    ``create_cnn`` re-raises ``error.with_hint(CLI_HINT)`` so that its user reads the flags instead.

    Attributes:
        reason: What went wrong, without the fix.
        hint: The fix, in the caller's terms.
    """

    def __init__(self, reason: str, hint: str = PYTHON_HINT):
        self.reason = reason
        self.hint = hint
        super().__init__(f'{reason}: {hint}')

    def __reduce__(self):  # pickles (e.g. from a worker process) with both parts, not the joined message
        return type(self), (self.reason, self.hint)

    def with_hint(self, hint: str) -> 'WeightsUnavailableError':
        """The same error with another fix, e.g. ``CLI_HINT`` for the commands."""
        return type(self)(self.reason, hint)


def split_model_name(name: str) -> Tuple[str, str]:
    """``'torchvision:resnet50'`` -> ``('torchvision', 'resnet50')``; anything else is a timm name."""
    if name.startswith(TORCHVISION_PREFIX):
        return 'torchvision', name[len(TORCHVISION_PREFIX):]
    return 'timm', name


def _close_matches(name: str, candidates: List[str]) -> str:
    matches = difflib.get_close_matches(name, candidates, n=5, cutoff=0.6)
    return f' (did you mean: {", ".join(matches)}?)' if matches else ''


def _check_known(source: str, arch: str) -> None:
    if source == 'torchvision':
        import torchvision
        names = torchvision.models.list_models(module=torchvision.models)
        if arch not in names:
            raise TcnnError(f'unknown torchvision model {arch!r}{_close_matches(arch, names)}')
        return
    import timm
    if not timm.is_model(arch):
        names = timm.list_models()
        hint = _close_matches(arch, names)
        if not hint and arch.split('.')[0] != arch and timm.is_model(arch.split('.')[0]):
            return  # a tagged name ('resnet50d.ra2_in1k') of a known architecture
        raise TcnnError(f'unknown timm model {arch!r}{hint}; torchvision models are named torchvision:NAME')


def _host_reachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    parsed = urllib.parse.urlparse(url)
    port = parsed.port or (443 if parsed.scheme == 'https' else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _offline_env() -> bool:
    return os.environ.get('HF_HUB_OFFLINE', '0').lower() in ('1', 'true', 'yes', 'on')


def _cached_timm_file(pretrained_cfg: Dict[str, Any]) -> Optional[str]:
    """A locally cached weight file for a timm pretrained config, if any (hub cache or torch hub cache)."""
    hub_id = pretrained_cfg.get('hf_hub_id')
    if hub_id:
        try:
            from huggingface_hub import try_to_load_from_cache
            for filename in ('open_clip_model.safetensors', 'model.safetensors', 'pytorch_model.bin'):
                path = try_to_load_from_cache(hub_id, filename)
                if isinstance(path, str):
                    return path
        except ImportError:
            pass
    url = pretrained_cfg.get('url')
    if url:
        path = os.path.join(torch.hub.get_dir(), 'checkpoints', os.path.basename(urllib.parse.urlparse(url).path))
        if os.path.isfile(path):
            return path
    return None


def _create_timm(arch: str, pretrained: bool, **kwargs) -> nn.Module:
    import timm
    if not pretrained:
        return timm.create_model(arch, pretrained=False, **kwargs)
    cfg = timm.models.get_pretrained_cfg(arch.split('.')[0] if '.' not in arch else arch)
    cfg = cfg.to_dict() if cfg is not None else {}
    if not (cfg.get('hf_hub_id') or cfg.get('url') or cfg.get('file')):
        raise WeightsUnavailableError(f'timm has no pretrained weights for {arch!r}')
    cached = _cached_timm_file(cfg)
    if cached:
        overlay = dict(kwargs.pop('pretrained_cfg_overlay', None) or {}, file=cached)
        return timm.create_model(arch, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)
    host = 'https://huggingface.co' if cfg.get('hf_hub_id') else cfg['url']
    host = os.environ.get('HF_ENDPOINT', host) if cfg.get('hf_hub_id') else host
    if _offline_env() or not _host_reachable(host):
        raise WeightsUnavailableError(f'cannot download pretrained weights for {arch!r} (offline, not in the local '
                                      'cache)')
    try:
        return timm.create_model(arch, pretrained=True, **kwargs)
    except Exception as e:  # network errors come in many types (requests, urllib, hub)
        reason = ' '.join(str(e).split())[:200] or type(e).__name__
        raise WeightsUnavailableError(f'downloading pretrained weights for {arch!r} failed ({type(e).__name__}: '
                                      f'{reason})') from e


def _create_torchvision(arch: str, pretrained: bool, num_classes: Optional[int] = None) -> nn.Module:
    import torchvision
    if not pretrained:
        return torchvision.models.get_model(arch, weights=None, num_classes=num_classes or 1000)
    weights = torchvision.models.get_model_weights(arch).DEFAULT
    cached = os.path.join(torch.hub.get_dir(), 'checkpoints', os.path.basename(weights.url))
    if not os.path.isfile(cached) and not _host_reachable(weights.url):
        raise WeightsUnavailableError(f'cannot download pretrained weights for torchvision:{arch} (offline, not in '
                                      'the local cache)')
    try:
        model = torchvision.models.get_model(arch, weights=weights)
    except Exception as e:
        reason = ' '.join(str(e).split())[:200] or type(e).__name__
        raise WeightsUnavailableError(f'downloading pretrained weights for torchvision:{arch} failed '
                                      f'({type(e).__name__}: {reason})') from e
    name, head = classifier_layer(model)
    if num_classes is not None and head is not None and num_classes != head.out_features:
        model.set_submodule(name, nn.Linear(head.in_features, num_classes, bias=head.bias is not None))
    return model


def classifier_layer(model: nn.Module) -> Tuple[str, Optional[nn.Linear]]:
    """``(name, layer)`` of a torchvision model's classifier: its last ``nn.Linear`` (``fc`` of ResNets,
    ``classifier.1`` of EfficientNets, ``classifier.2`` of ConvNeXts), or ``('', None)``."""
    return next(((n, m) for n, m in reversed(list(model.named_modules())) if isinstance(m, nn.Linear)), ('', None))


def clean_state_dict(checkpoint: Any) -> Dict[str, torch.Tensor]:
    """Unwrap a checkpoint into a plain state_dict: ``state_dict_ema``/``model_ema``/``state_dict``/``model``
    wrappers and ``module.`` (DDP) / ``_orig_mod.`` (torch.compile) prefixes are handled."""
    sd = checkpoint
    for _ in range(3):  # wrappers can nest (e.g. {'model': {'state_dict': ...}})
        if not isinstance(sd, dict):
            break
        key = next((k for k in _WRAPPER_KEYS if isinstance(sd.get(k), dict)), None)
        if key is None:
            break
        sd = sd[key]
    if not isinstance(sd, dict) or not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise TcnnError('the checkpoint holds no state_dict (expected a dict of tensors, possibly under '
                        f'{"/".join(_WRAPPER_KEYS)})')
    out = {}
    for k, v in sd.items():
        for prefix in ('module.', '_orig_mod.'):
            if k.startswith(prefix):
                k = k[len(prefix):]
        out[k] = v
    return out


def load_state_dict_file(path: str) -> Dict[str, torch.Tensor]:
    """Load a ``.pt``/``.pth``/``.bin``/``.safetensors`` checkpoint safely (no unpickling of code)."""
    if not path.endswith('.safetensors'):
        from .io import load_torch_file
        return clean_state_dict(load_torch_file(path, 'weights file'))
    from .io import _file_head
    _file_head(path, 'weights file')  # missing, a folder, empty: one line each
    try:
        from safetensors.torch import load_file
        return clean_state_dict(load_file(path, device='cpu'))
    except Exception as e:  # safetensors raises its own SafetensorError, OSError and ValueError
        reason = ' '.join(str(e).split())[:160] or type(e).__name__
        raise TcnnError(f'cannot read weights from {path}: not a valid safetensors file ({reason})') from e


def _load_weights(model: nn.Module, path: str, name: str) -> None:
    sd = load_state_dict_file(path)
    model_sd = model.state_dict()
    head = getattr(model, 'pretrained_cfg', {}).get('classifier', 'fc')
    mismatched = [k for k, v in sd.items() if k in model_sd and model_sd[k].shape != v.shape]
    if mismatched and all(k.startswith(head + '.') for k in mismatched):
        # a checkpoint with another class count: keep the backbone, leave the new head at its init
        sd = {k: v for k, v in sd.items() if k not in mismatched}
    elif mismatched:
        raise TcnnError(f'{path} does not fit {name}: shape mismatch for {", ".join(mismatched[:3])}')
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.startswith(head + '.')]
    if missing or unexpected:
        detail = (f'missing {len(missing)} keys (e.g. {missing[:2]})' if missing else '') + \
                 (f' unexpected {len(unexpected)} keys (e.g. {unexpected[:2]})' if unexpected else '')
        raise TcnnError(f'{path} does not fit {name}: {detail.strip()}')


def create_cnn(
        name: str,
        *,
        pretrained: bool = True,
        weights: Optional[str] = None,
        num_classes: Optional[int] = None,
        **kwargs,
) -> nn.Module:
    """Create a source CNN by name, failing fast and clearly when weights cannot be had.

    Args:
        name: A timm model name (``'resnet50d'``, ``'resnetrs50'``, tags allowed) or ``'torchvision:NAME'``.
        pretrained: Load the library's pretrained weights (from the local cache, else the network).
        weights: Path of a local checkpoint to load instead (``.pt``/``.pth``/``.safetensors``; plain or wrapped
            state_dict). Takes precedence over ``pretrained``.
        num_classes: Classifier size; a checkpoint head of another size is dropped and re-initialised.
        **kwargs: Passed to ``timm.create_model`` (e.g. ``drop_path_rate``, ``in_chans``).

    Raises:
        WeightsUnavailableError: ``pretrained`` weights cannot be had (offline and not cached, none published, a
            failed download); the message names the Python fix, ``with_hint(CLI_HINT)`` the CLI flags.
        TcnnError: Unknown name (with close matches), unreadable/mismatched file.
    """
    if not isinstance(name, str) or not name:
        raise InvalidTypeError(f'name must be a model name (e.g. \'resnet50d\' or \'torchvision:resnet50\'), got '
                               f'{name!r}')
    if num_classes is not None:
        check_number(num_classes, 'num_classes', ge=0, integer=True)
    if weights is not None and not isinstance(weights, (str, os.PathLike)):
        raise InvalidTypeError(f'weights must be a file path, got {type(weights).__name__}')
    source, arch = split_model_name(name)
    _check_known(source, arch)
    if source == 'torchvision':
        if kwargs:
            raise TcnnError(f'options {sorted(kwargs)} are timm-only; not supported for {name}')
        model = _create_torchvision(arch, pretrained and weights is None, num_classes)
    else:
        if num_classes is not None:
            kwargs['num_classes'] = num_classes
        model = _create_timm(arch, pretrained and weights is None, **kwargs)
    if weights is not None:
        _load_weights(model, os.fspath(weights), name)
    # What it takes to rebuild this architecture offline (tcnn.load uses it): name and creation kwargs.
    model.tcnn_source = {'model': name, 'num_classes': num_classes, 'kwargs': dict(kwargs)}
    model.tcnn_source['kwargs'].pop('num_classes', None)
    model.tcnn_source['kwargs'].pop('pretrained_cfg_overlay', None)
    return model
