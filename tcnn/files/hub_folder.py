"""Hugging Face Hub folders: what ``tcnn publish`` writes and ``--push`` uploads, and how tcnn reads such a folder back.

A Hub folder is what timm's ``save_for_hf`` writes, ``config.json`` (the ``t_*`` architecture, its ``model_args``
with every conversion setting, the data config) and ``model.safetensors`` (with the weights' checksums in its
metadata, which every load checks), plus a model card ``README.md`` (``tcnn.evaluation.model_card``). config.json also
holds tcnn's facts under the key ``'tcnn'`` (timm ignores keys it does not know).

``timm.create_model('local-dir:DIR' | 'hf-hub:ORG/NAME', pretrained=True)`` (with ``import tcnn``) and
``tcnn.load(DIR)`` rebuild the T-CNN from such a folder through its ``t_*`` entrypoint (``tcnn.models``), which loads
the folder's own weights and checks that they fit (``check_folder_weights``).
"""
import difflib
import json
import os
import shutil
import tempfile
from typing import Any, Dict, List, Optional, Tuple, Union

import timm
import torch
import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import save_file
from timm.models import load_model_config_from_hf, push_to_hf_hub
from timm.models._hub import generate_readme  # the card push_to_hf_hub writes (not exported by timm.models)
from timm.models._hub import load_model_config_from_path  # what 'local-dir:' names read (not in timm.models)
from timm.models._hub import save_config_for_hf

from ..atomic import atomic_write
from ..convert.settings import ConversionSettings, gpsa_layers
from ..errors import InvalidArgumentError, TcnnError
from ..paths import HUB_PREFIXES, check_replaceable_dir
from ..version import __version__
from . import run_folder
from .integrity import safetensors_damage, tensor_checksums, verify_checksums
from .tcnn_file import model_from_dict, read, safetensors_error, safetensors_tensors, unwrap_model
from .sources import hub_unreachable, source_model_name, split_model_name, transformed_model_name
from .weights import check_map_location, error_reason, gpsa_layer_names, state_dict_misfit

__all__ = ['HUB_CONFIG', 'HUB_WEIGHTS', 'HUB_CHECKSUMS_KEY', 'CONFIG_KEY', 'check_architecture',
           'load_folder', 'verify_hub_weights', 'timm_location', 'folder_config', 'check_folder_weights',
           'read_published', 'write_hub_weights', 'write_folder', 'push']

HUB_CONFIG = 'config.json'
HUB_WEIGHTS = 'model.safetensors'
HUB_CHECKSUMS_KEY = 'tcnn_checksums'  # the weights' checksums (tcnn.files.integrity) in model.safetensors' metadata
CONFIG_KEY = 'tcnn'  # tcnn's facts in config.json (timm ignores this key)


# ---------------------------------------------------------------------------------------------- reading a folder


def check_architecture(architecture: Any, config_path: str) -> None:
    """A config.json's architecture must be a model that timm's registry (with tcnn's ``t_*`` models) holds."""
    if not isinstance(architecture, str) or not architecture:
        raise TcnnError(f'{config_path} names no architecture (its "architecture" is {architecture!r}): it is not a '
                        'timm model config; give a folder written by tcnn publish or timm.models.save_for_hf')
    if not timm.is_model(architecture):
        close = difflib.get_close_matches(architecture, timm.list_models(), n=3, cutoff=0.75)
        hint = f' (did you mean: {", ".join(close)}?)' if close else ''
        raise TcnnError(f'{config_path} names architecture {architecture!r} that neither timm {timm.__version__} nor '
                        f'tcnn {__version__} knows{hint}: a newer timm or tcnn may, or the config.json is wrong')


def _check_local_folder(folder: str) -> None:
    """One-line errors for a local folder that is not a Hub folder, or whose config.json names a plain CNN while its
    weights hold GPSA layers (a T-CNN from ``tcnn.reparameterize`` saved under its CNN's timm name)."""
    if not os.path.isdir(folder):
        raise TcnnError(f'Hub folder not found: {folder}' if not os.path.exists(folder) else
                        f'{folder} is a file, not a Hub folder: load a T-CNN file with tcnn.load(PATH)')
    config_path = os.path.join(folder, HUB_CONFIG)
    if not os.path.isfile(config_path):
        runs = [f for f in (run_folder.BEST_CHECKPOINT, run_folder.LAST_CHECKPOINT)  # a run folder for a Hub folder
                if os.path.isfile(os.path.join(folder, f))]
        hint = (f'it is a tcnn train run folder: load {os.path.join(folder, runs[0])}' if runs else
                'give a T-CNN file, or a folder written by tcnn publish or timm.models.save_for_hf')
        raise TcnnError(f'{folder} is a folder without {HUB_CONFIG}: {hint}')
    try:
        with open(config_path, encoding='utf-8') as f:
            architecture = json.load(f).get('architecture')
    except (OSError, ValueError, AttributeError) as e:
        raise TcnnError(f'{config_path} is not a timm model config ({error_reason(e)})') from e
    check_architecture(architecture, config_path)
    weights = os.path.join(folder, HUB_WEIGHTS)
    if not os.path.isfile(weights):
        return  # another weights file (pytorch_model.bin, ...) or none: timm's loader reports
    try:
        with safe_open(weights, framework='pt', device='cpu') as f:
            gpsa = bool(gpsa_layer_names(f.keys()))
        damage = safetensors_damage(weights)  # safe_open reads the header only
    except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError and OSError / ValueError
        raise TcnnError(safetensors_error(weights, e)) from e
    if damage:
        raise TcnnError(f'{weights} is {damage}: re-download or re-save it')
    if gpsa and source_model_name(architecture) is None:
        raise TcnnError(f'{folder}: config.json names the CNN {architecture} but the weights hold GPSA layers (a '
                        'T-CNN saved under its CNN\'s name): save T-CNNs as t_* models, e.g. tcnn publish FILE '
                        'of a tcnn.save file, or timm.models.save_for_hf(tcnn.load(FILE), DIR)')


def load_folder(name: str, map_location: Union[str, torch.device, None] = 'cpu') -> nn.Module:
    """``timm.create_model(name, pretrained=True)`` of a Hub folder, with one-line errors; the model in eval mode.

    Args:
        name: A folder path, ``'local-dir:PATH'`` or ``'hf-hub:ORG/NAME'``.
        map_location: Device of the model (None: where timm builds it, the CPU).
    """
    if map_location is not None and not isinstance(map_location, (str, torch.device)):
        raise InvalidArgumentError(f'map_location of a Hub folder must be a device, got {type(map_location).__name__}')
    check_map_location(map_location)
    if not name.startswith(HUB_PREFIXES):
        name = f'local-dir:{name}'
    if name.startswith('local-dir:'):
        _check_local_folder(name[len('local-dir:'):])
    try:
        model = timm.create_model(name, pretrained=True)
    except TcnnError:
        raise
    except Exception as e:  # noqa: BLE001 - timm, huggingface_hub and torch report missing files, an offline Hub
        # without a cached copy and weights that do not fit a plain CNN's architecture in their own exception types
        raise TcnnError(f'cannot load {name}: {error_reason(e)}') from e
    if map_location is not None:
        model = model.to(map_location)
    return model.eval()


def _hub_weights_file(location: str) -> Optional[str]:
    """The local ``model.safetensors`` that timm reads for ``'local-dir:PATH'`` or (from the local Hugging Face
    cache) ``'hf-hub:ORG/NAME'``, or None."""
    if location.startswith('local-dir:'):
        path = os.path.join(location[len('local-dir:'):], HUB_WEIGHTS)
        return path if os.path.isfile(path) else None
    if location.startswith('hf-hub:'):
        repo, _, revision = location[len('hf-hub:'):].partition('@')
        try:
            from huggingface_hub import try_to_load_from_cache
            path = try_to_load_from_cache(repo, HUB_WEIGHTS, revision=revision or None)
        except (ImportError, ValueError):
            return None
        return path if isinstance(path, str) else None
    return None


def verify_hub_weights(state_dict: Dict[str, torch.Tensor], location: str) -> None:
    """Check the weights that timm read from a Hub folder against the checksums in its ``model.safetensors``
    metadata (``write_hub_weights``); folders without them (timm's ``save_for_hf``, tcnn 0.3.x) are not checked.

    Raises:
        CorruptFileError: A tensor that does not match its checksum, named with the file.
    """
    path = _hub_weights_file(location)
    if path is None:
        return
    try:
        with safe_open(path, framework='pt', device='cpu') as f:
            raw = (f.metadata() or {}).get(HUB_CHECKSUMS_KEY)
    except Exception:  # noqa: BLE001 - timm has just read the file: a race with its replacement, nothing to check
        return
    if raw is not None:
        try:
            checksums = json.loads(raw)
        except ValueError:
            checksums = {'algorithm': None}
        verify_checksums(state_dict, checksums, path)


# ---------------------------------------------------------------------------------------------- t_* models' weights
# ``timm.create_model('local-dir:DIR' | 'hf-hub:ORG/NAME', pretrained=True)`` reads DIR/config.json, passes its
# ``model_args`` (the conversion settings among them, see ``_model_args`` in ``tcnn.models.create``) to the
# entrypoint named by its
# ``architecture`` and its ``pretrained_cfg`` with the weights' location ('source': 'local-dir' or 'hf-hub'). Those
# weights are the T-CNN's own: timm's ``load_pretrained`` fetches them and ``check_folder_weights`` makes sure they
# are exactly this T-CNN's (never a CNN's converted on the fly, never a partial load).

def timm_location(cfg: Dict[str, Any]) -> Optional[str]:
    """Where timm's ``load_pretrained`` finds the T-CNN weights of a resolved pretrained config (``'local-dir:PATH'``,
    ``'hf-hub:ORG/NAME'``, a URL), or None when tcnn supplies them (a file, a state dict, the source's weights).
    The ``t_*`` registry's own configs hold no location (``tcnn.models``): one here came from a Hub folder or from the
    caller."""
    if cfg.get('source') == 'local-dir':
        return f'local-dir:{cfg.get("file")}'
    if cfg.get('source') == 'hf-hub' or (cfg.get('hf_hub_id') and not cfg.get('file')):
        return f'hf-hub:{cfg.get("hf_hub_id")}'
    if cfg.get('url') and not cfg.get('file'):
        return str(cfg['url'])
    return None


def folder_config(variant: str, location: Dict[str, str]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """``pretrained_cfg_overlay=dict(file=FOLDER)`` or ``dict(hf_hub_id=ORG/NAME)``: read the folder's config.json as
    ``timm.create_model('local-dir:FOLDER' | 'hf-hub:ORG/NAME')`` does. Returns its pretrained config (which
    describes the weights) and its ``model_args`` (defaults of the entrypoint's keyword arguments)."""
    folder, hub_id = location.get('file'), location.get('hf_hub_id')
    where = f'hf-hub:{hub_id}' if hub_id else folder
    try:
        if hub_id:
            cfg, architecture, model_args = load_model_config_from_hf(hub_id)
        else:
            cfg, architecture, model_args = load_model_config_from_path(folder)
    except FileNotFoundError:
        raise TcnnError(f'{folder} is a folder without config.json: give a T-CNN file, or a folder written by tcnn '
                        'publish or timm.models.save_for_hf') from None
    except Exception as e:  # noqa: BLE001 - huggingface_hub's (offline, not found) and JSON errors
        raise TcnnError(f'cannot read the config.json of {where} ({error_reason(e)})') from e
    check_architecture(architecture, f'the config.json of {where}')
    if architecture != variant:
        what = 'a T-CNN of another CNN' if source_model_name(architecture) else 'a plain CNN, not a T-CNN'
        name = where if hub_id else f'local-dir:{folder}'
        raise TcnnError(f'{where} holds {architecture} ({what}): load it with '
                        f'timm.create_model("{name}", pretrained=True) or tcnn.load')
    return cfg, dict(model_args)


def check_folder_weights(
        state_dict: Dict[str, torch.Tensor],
        model: nn.Module,
        where: str,
        features: bool,
) -> Dict[str, torch.Tensor]:
    """timm ``pretrained_filter_fn`` for T-CNN weights that timm fetched (``timm_location``): they must fit the
    model that the folder's config built, key for key and shape for shape, or a one-line ``TcnnError`` says why.

    The classifier may differ when the caller asked for another class count or ``features_only`` (timm then drops
    it), and the first conv's input channels when ``in_chans`` differs (timm adapts it after this filter).
    """
    verify_hub_weights(state_dict, where)  # the tensors as tcnn publish wrote them: a corrupt one is named
    cfg = model.pretrained_cfg
    arch = cfg.get('architecture')
    expected = model.state_dict()
    layers = [name for name, _ in gpsa_layers(model)]
    held = gpsa_layer_names(state_dict)
    if not held:
        raise TcnnError(f'{where} holds the weights of a plain CNN (no GPSA layers), not of the T-CNN {arch} that its '
                        'config names: convert the CNN first (tcnn convert), then tcnn publish')
    if set(held) != set(layers):  # a safetensors file lists its keys sorted, not in module order
        raise TcnnError(f'{where}: {arch} as built from its config.json (and the arguments given) has GPSA layers '
                        f'{_layer_range(sorted(layers))} (stages {model.tcnn_config["stages"]}), the weights have GPSA '
                        f'layers {_layer_range(held)}')
    check = dict(state_dict)
    first = cfg.get('first_conv')
    for conv in ([first] if isinstance(first, str) else list(first or ())):
        key = f'{conv}.weight'
        if key in check and key in expected and check[key].shape[0] == expected[key].shape[0]:
            check[key] = expected[key]  # another in_chans: timm adapts the input conv after this filter
    classifier = cfg.get('classifier')
    head = features or getattr(model, 'num_classes', None) != cfg.get('num_classes')
    misfit = state_dict_misfit(model, check, optional=f'{classifier}.' if head and classifier else '')
    if misfit:
        raise TcnnError(f'{where}: the weights do not fit {arch} as built from its config.json (and the arguments '
                        f'given): {misfit}')
    return state_dict


def _layer_range(layers: List[str]) -> str:
    return f'{layers[0]}..{layers[-1]} ({len(layers)})' if len(layers) > 1 else str(layers)


# ---------------------------------------------------------------------------------------------- publishing


def _run_checkpoint(folder: str) -> str:
    """A ``tcnn train`` run folder's checkpoint to publish: ``best.pt`` (best validation top-1), else ``last.pt``."""
    for name in (run_folder.BEST_CHECKPOINT, run_folder.LAST_CHECKPOINT):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    raise TcnnError(f'{folder} is a folder without {run_folder.BEST_CHECKPOINT} or {run_folder.LAST_CHECKPOINT}: give '
                    'a T-CNN file, a training checkpoint or a tcnn train run folder')


def read_published(path: str) -> Tuple[nn.Module, Dict[str, Any], List[Dict[str, Any]]]:
    """The T-CNN to publish, read from ``path``.

    Args:
        path: A T-CNN file (``tcnn convert``, ``tcnn.save``), a training checkpoint (``RUN/best.pt``, ``RUN/last.pt``)
            or a ``tcnn train`` run folder (its ``best.pt``, else ``last.pt``).

    Returns:
        The model (a ``t_*`` timm model, eval mode), the file's T-CNN dict without its state dict (with
        ``'training'`` and ``'recipe'`` for a checkpoint) and the run's ``metrics.jsonl`` records (empty when the
        file is not a checkpoint with that file beside it).

    Raises:
        TcnnError: Not a T-CNN (a plain CNN, the no-SA baseline), or a T-CNN without a timm architecture
            (a torchvision source), or any error of ``tcnn.files.tcnn_file.read``.
    """
    if os.path.isdir(path):
        path = _run_checkpoint(path)
    d = read(path)
    where = str(path)
    if not d['conversion']:
        raise TcnnError(f'{where} holds a plain CNN ({d["source"]["model"]}), not a T-CNN: tcnn publish shares '
                        'T-CNNs (a plain timm CNN is shared with timm.models.push_to_hf_hub)')
    kind, name = split_model_name(d['source']['model'])
    t_name = transformed_model_name(name.split('.')[0])
    if kind != 'timm' or source_model_name(t_name) is None:
        raise TcnnError(f'{where} is a T-CNN of {d["source"]["model"]}, which has no timm architecture ({t_name} is '
                        'not registered): Hub folders are loaded by timm.create_model, so only T-CNNs of timm CNNs '
                        'can be published')
    model = model_from_dict(d, where=where)
    metrics_path = os.path.join(os.path.dirname(os.path.abspath(path)), run_folder.METRICS_FILE)
    has_metrics = d.get('training') is not None and os.path.isfile(metrics_path)
    metrics = run_folder.read_metrics(metrics_path) if has_metrics else []
    return model, {k: v for k, v in d.items() if k != 'state_dict'}, metrics


def write_hub_weights(model: nn.Module, path: str) -> None:
    """Write ``model``'s weights as a Hub folder's ``model.safetensors`` (what timm's ``save_for_hf`` writes), with
    their checksums in the metadata entry ``'tcnn_checksums'``, which every load of the folder checks."""
    tensors = safetensors_tensors(unwrap_model(model).state_dict())
    checksums = json.dumps(tensor_checksums(tensors))
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata={'format': 'pt', HUB_CHECKSUMS_KEY: checksums}))


def _model_args(model: nn.Module) -> Dict[str, Any]:
    """config.json's ``model_args``: the conversion settings with the stages as resolved module names."""
    return ConversionSettings.of(model.tcnn_config).kwargs()


def _model_config(model: nn.Module, config: Dict[str, Any]) -> Dict[str, Any]:
    """timm's ``model_config`` of ``save_for_hf``: tcnn's facts under ``CONFIG_KEY`` and the class names as timm's
    top-level ``label_names`` (which timm's Hub loader puts in the model's ``pretrained_cfg``)."""
    names = model.pretrained_cfg.get('label_names')
    return {CONFIG_KEY: config, **({'label_names': list(names)} if names else {})}


def write_folder(model: nn.Module, out: str, card: Dict[str, Any], config: Dict[str, Any]) -> str:
    """Write the Hub folder of ``model`` atomically: what timm's ``save_for_hf`` writes (config.json by timm's
    ``save_config_for_hf``, with ``config`` under ``CONFIG_KEY``; model.safetensors, with checksums) and the card as
    README.md, in a temporary folder beside ``out`` that then
    replaces ``out`` (a crash leaves the previous folder or none, never a partial one).

    Returns:
        The absolute path of the folder.
    """
    out = check_replaceable_dir(out, HUB_CONFIG)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f'.{os.path.basename(out)}.', suffix='.tmp', dir=parent)
    old = None
    try:
        # what timm's save_for_hf writes, with the weights' checksums in model.safetensors (written once, by tcnn)
        write_hub_weights(model, os.path.join(tmp, HUB_WEIGHTS))
        save_config_for_hf(model, os.path.join(tmp, HUB_CONFIG), model_config=_model_config(model, config),
                           model_args=_model_args(model))
        name = os.path.basename(out)
        with open(os.path.join(tmp, 'README.md'), 'w', encoding='utf-8') as f:
            f.write(generate_readme(card, name))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700, safetensors 0600: the usual permissions instead
        for entry in os.listdir(tmp):
            os.chmod(os.path.join(tmp, entry), 0o666 & ~umask)
        if os.path.isdir(out) and os.listdir(out):  # a previous Hub folder: moved aside, removed once replaced
            old = tempfile.mkdtemp(prefix=f'.{name}.', suffix='.old', dir=parent)
            os.replace(out, old)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not os.path.exists(out):
            os.replace(old, out)  # put the previous folder back
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out


def push(model: nn.Module, repo_id: str, card: Dict[str, Any], config: Dict[str, Any], *,
         private: bool = False) -> str:
    """Upload ``model`` to the Hub with timm's ``push_to_hf_hub`` (config.json, model.safetensors; the card when the
    repo has no README.md yet). Returns the commit URL.

    Raises:
        TcnnError: Offline (``HF_HUB_OFFLINE``, or the Hub unreachable), not logged in, or any Hub error, in one line.
    """
    reason = hub_unreachable()
    if reason:
        raise TcnnError(f'cannot push to the Hugging Face Hub: {reason}')
    try:
        commit = push_to_hf_hub(model, repo_id, commit_message=f'Add T-CNN (tcnn {__version__})', private=private,
                                model_config=_model_config(model, config), model_card=card,
                                model_args=_model_args(model), safe_serialization=True)
    except Exception as e:  # noqa: BLE001 - huggingface_hub's HTTP, auth and offline errors have many types
        raise TcnnError(f'cannot push to the Hugging Face Hub: {error_reason(e)}') from e
    return str(getattr(commit, 'commit_url', commit))
