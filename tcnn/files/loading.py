"""``tcnn.load``: one entry for every model file tcnn reads, and the models of the state dicts users hold.

``load`` takes a T-CNN file or training checkpoint (``tcnn.files.tcnn_file``), a Hub folder
(``tcnn.files.hub_folder``), or a checkpoint of timm's train.py (built here, ``model_from_state_dict``), and gives the
model in eval mode; nothing is downloaded.

What users hold besides T-CNN files: the checkpoints of timm's train.py (a dict of 'state_dict', 'args' (an
argparse.Namespace, read with weights-only loading that allows it: tcnn.files.weights.load_torch_file), 'arch', 'epoch',
'optimizer', 'version', maybe 'state_dict_ema', 'metric', 'amp_scaler', 'saver') and plain state dicts
(torch.save(model.state_dict()), timm's clean_checkpoint.py). Neither records the architecture's settings; a
T-CNN's conversion settings (stages, qk_dim) show in its keys and shapes.
"""
import os
from typing import Any, Dict, List, Optional, Union

import timm
import torch
import torch.nn as nn

from ..convert.settings import gpsa_layers

from ..convert.stages import stage_candidates
from ..errors import TcnnError
from ..paths import HUB_PREFIXES
from .hub_folder import load_folder
from .tcnn_file import model_from_dict, read_raw, validated
from .sources import (classifier_names, create_cnn, model_keys, record_source, source_model_name,
                      transformed_model_name)
from .weights import (GPSA_KEY, check_path, checkpoint_num_classes, clean_state_dict, gpsa_layer_names,
                      state_dict_misfit, strip_wrapper_prefix)

__all__ = ['load', 'timm_checkpoint_arch', 'tcnn_state_dict_settings', 'model_from_state_dict']


def load(path: str, map_location: Union[str, torch.device, None] = 'cpu', *, ema: bool = False) -> nn.Module:
    """Rebuild the model stored in a T-CNN file (or training checkpoint) or a Hub folder without network, load its
    weights strictly and return it in eval mode.

    Args:
        path: A ``.pt``/``.pth``/``.safetensors`` file written by ``tcnn.save`` (or ``OUTPUT/last.pt``/
            ``best.pt``), or a Hub folder (``config.json`` + weights, from ``tcnn publish`` or
            ``timm.models.save_for_hf``): its path, ``'local-dir:PATH'`` or ``'hf-hub:ORG/NAME'`` (read from the local
            Hugging Face cache when offline).
        map_location: Where the weights go (as in ``torch.load``; a device for a Hub folder).
        ema: Load the EMA weights of a training checkpoint (``tcnn train --model-ema``) instead of the raw ones.

    Raises:
        TcnnError: Missing, junk, truncated or non-T-CNN file; unknown format version; weights that do not fit;
            ``ema`` and a file without EMA weights.
    """
    if isinstance(path, str) and path.startswith(HUB_PREFIXES) or os.path.isdir(check_path(path, 'path')):
        if ema:
            raise TcnnError(f'{path} is a Hub folder, which holds one set of weights (no EMA): load it without ema / '
                            '--use-ema')
        return load_folder(os.fspath(path), map_location)
    d = read_raw(path, map_location)
    arch = timm_checkpoint_arch(d)
    if arch is not None:  # a checkpoint of timm's train.py: its arch (and model_kwargs) rebuild the model
        args = d.get('args')
        model = model_from_state_dict(arch, clean_state_dict(d, use_ema=ema), where=str(path),
                                      kwargs=dict(getattr(args, 'model_kwargs', None) or {}))
        return model.to(map_location) if isinstance(map_location, (str, torch.device)) else model
    return model_from_dict(validated(d, str(path), ema), map_location=None, where=str(path))


def timm_checkpoint_arch(d: Any) -> Optional[str]:
    """The architecture of a checkpoint of timm's train.py (``args.model``, else its ``'arch'``), or None for
    anything else."""
    if not (isinstance(d, dict) and isinstance(d.get('state_dict'), dict) and 'arch' in d and 'format' not in d):
        return None
    arch = getattr(d.get('args'), 'model', None) or d.get('arch')
    return arch if isinstance(arch, str) and arch else None


def _stages_of(name: str, layers: List[str], kwargs: Dict[str, Any]) -> List[str]:
    """The stages of the CNN under a T-CNN ``name`` that hold ``layers`` (e.g. ``['layer4']``)."""
    with torch.device('meta'):
        cnn = create_cnn(source_model_name(name), pretrained=False, **kwargs)
    names = [n for n, _ in stage_candidates(cnn)]
    stages = [n for n in names if any(layer.startswith(n + '.') for layer in layers)]
    return stages or list(layers)


def tcnn_state_dict_settings(name: str, state_dict: Dict[str, torch.Tensor], where: str, num_classes: Optional[int],
                             kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """``stages`` and ``qk_dim`` of the T-CNN ``name`` whose state dict this is: the model's defaults where they
    build the state dict's GPSA layers and shapes, else those the state dict shows."""
    layers = gpsa_layer_names(state_dict)
    if not layers:
        source = source_model_name(name)
        raise TcnnError(f'{where} holds the weights of a CNN (no GPSA layers), not of the T-CNN {name}: convert them '
                        f'with `tcnn convert {source} --weights {where} --out FILE`')
    settings = {k: kwargs.pop(k) for k in ('stages', 'qk_dim') if k in kwargs}

    def built() -> nn.Module:
        with torch.device('meta'):
            return timm.create_model(name, pretrained=False, num_classes=num_classes, **settings, **kwargs)
    model = built()
    if 'stages' not in settings and sorted(n for n, _ in gpsa_layers(model)) != layers:
        settings['stages'] = _stages_of(name, layers, kwargs)
        model = built()
    dims = {state_dict[f'{n}.q_weight'].shape[0] // state_dict[f'{n}{GPSA_KEY}'].shape[0]
            for n in layers if f'{n}.q_weight' in state_dict}
    expected = model.state_dict()
    differs = any(expected[k].shape != state_dict[k].shape for n in layers for k in (f'{n}.q_weight',)
                  if k in expected and k in state_dict)
    if 'qk_dim' not in settings and differs and len(dims) == 1:
        settings['qk_dim'] = dims.pop()
    return settings


def model_from_state_dict(
        name: str,
        state_dict: Dict[str, torch.Tensor],
        *,
        where: str = 'the state dict',
        num_classes: Optional[int] = None,
        kwargs: Optional[Dict[str, Any]] = None,
) -> nn.Module:
    """Build the timm model ``name`` (a ``t_*`` T-CNN or a CNN) for a state dict (a plain one, or a checkpoint of
    timm's train.py cleaned by ``tcnn.files.weights.clean_state_dict``) and load it strictly; the model in eval mode.

    A T-CNN's conversion settings come from the state dict: its GPSA layers give the stages, their query weights the
    ``qk_dim``; the GPSA parameters (positions, locality strengths, gates) are the state dict's own.

    Args:
        name: A timm model name: the architecture the state dict was saved from.
        state_dict: The weights (a prefix that a wrapper module added to every key, e.g. a Lightning module's
            ``model.``, is removed: ``tcnn.files.weights.strip_wrapper_prefix``).
        where: Their origin in messages (a file).
        num_classes: Classifier size (default the state dict's head).
        kwargs: Further ``timm.create_model`` arguments (e.g. the ``model_kwargs`` of timm's train.py).
    """
    kwargs = dict(kwargs or {})
    state_dict, note = strip_wrapper_prefix(state_dict, lambda: model_keys(name, kwargs))
    source = source_model_name(name)
    classifiers = classifier_names(source or name)
    num_classes = checkpoint_num_classes(state_dict, classifiers, num_classes, where=where)
    if source is None:
        if gpsa_layer_names(state_dict):
            t_name = transformed_model_name(name)
            raise TcnnError(f'{where} holds the weights of a T-CNN (GPSA layers), not of the CNN {name}: load them as '
                            f'{t_name}, `tcnn convert {t_name} --weights {where} --out FILE`')
        model = create_cnn(name, pretrained=False, num_classes=num_classes, **kwargs)
    else:
        kwargs.update(tcnn_state_dict_settings(name, state_dict, where, num_classes, kwargs))
        model = timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
    misfit = state_dict_misfit(model, state_dict)
    if misfit:
        raise TcnnError(f'{where} does not fit {name} (built with {kwargs or "its defaults"}){note}: {misfit}')
    model.load_state_dict(state_dict, strict=True)
    source_name = getattr(model, 'tcnn_source', {}).get('model', name)
    record_source(model, source_name, num_classes, {k: v for k, v in kwargs.items()
                                                    if k not in ('stages', 'qk_dim')}, None)
    return model.eval()
