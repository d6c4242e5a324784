"""``tcnn info FILE``: what a T-CNN file (or training checkpoint) holds: source architecture, conversion settings,
data config, parameter counts, and per GPSA layer the gates sigmoid(lambda) and spans 1/alpha (T-CNN Fig. 4)."""
import argparse
import json
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from ..files.safetensors_header import read_tcnn_settings
from ..gpsa_parameters import HEAD_PARAMETERS, summary_of_values
from .arguments import add_use_ema, size_text

if TYPE_CHECKING:  # torch loads only once a file is to be read
    import torch.nn as nn

__all__ = ['add_arguments', 'run', 'collect']


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('file', metavar='FILE',
                        help='a T-CNN file (.pt/.pth/.safetensors from tcnn convert / tcnn.save) or a training '
                             'checkpoint (last.pt / best.pt)')
    add_use_ema(parser)
    parser.add_argument('--heads', action='store_true', help='also list every head: gate, alpha, span, centre')
    parser.add_argument('--json', action='store_true', help='print everything as one JSON object')


def _count(model: 'nn.Module') -> int:
    return sum(p.numel() for p in model.parameters())


def _cnn_parameters(d: Dict[str, Any]) -> int:
    """Parameters of the source CNN, rebuilt without weights on the meta device (exact for grouped convs too)."""
    import torch

    from ..files.sources import create_cnn
    source = d['source']
    with torch.device('meta'):
        cnn = create_cnn(source['model'], pretrained=False, num_classes=d.get('num_classes'),
                         **(source.get('kwargs') or {}))
    return _count(cnn)


def collect(path: str, ema: bool = False) -> Dict[str, Any]:
    """Everything ``tcnn info`` shows, as a JSON-ready dict; ``ema``: from the EMA weights of a training checkpoint.

    Files written by this tcnn store their parameter counts, so the gates and spans are computed from the stored
    parameters without building the model: timm is not imported, nor torch for a ``.safetensors`` file (its header
    and those few tensors are read as bytes). Older files (and anything unexpected) take the full path: rebuild the
    model, load its weights, count.
    """
    d = read_tcnn_settings(path, HEAD_PARAMETERS) if path.lower().endswith('.safetensors') and not ema else None
    if d is None:
        from ..files import tcnn_file
        d = tcnn_file.read(path, ema=ema)
        values = {k: v.float().tolist() for k, v in d['state_dict'].items() if k.endswith(HEAD_PARAMETERS)}
        d = dict(d, tensor_values=values)
    layers = _layers_from_values(d)
    if layers is None or not _valid_counts(d.get('parameters')):
        return _collect_by_rebuilding(path, ema)
    total, cnn = d['parameters']['total'], d['parameters']['cnn']
    return _info(path, d, {'total': total, 'cnn': cnn, 'self_attention': total - cnn}, layers)


def _info(path: str, d: Dict[str, Any], parameters: Dict[str, int], layers: Dict[str, Any]) -> Dict[str, Any]:
    return {
        'file': path,
        'file_size': os.path.getsize(path),
        'format': d['format'], 'version': d['version'], 'tcnn_version': d.get('tcnn_version'),
        'source': d['source'], 'num_classes': d.get('num_classes'), 'label_names': d.get('label_names'),
        'conversion': d['conversion'], 'data_config': d.get('data_config'),
        'parameters': parameters,
        'training': d.get('training'),
        'layers': layers,
    }


def _collect_by_rebuilding(path: str, ema: bool = False) -> Dict[str, Any]:
    """``collect`` for files without stored counts: rebuild the T-CNN (and the CNN, on the meta device)."""
    from ..convert.settings import gpsa_summary
    from ..files import tcnn_file

    d = tcnn_file.read(path, ema=ema)
    model = tcnn_file.model_from_dict(d, map_location=None, where=path)
    total = _count(model)
    cnn = _cnn_parameters(d) if d['conversion'] else total
    return _info(path, d, {'total': total, 'cnn': cnn, 'self_attention': total - cnn}, gpsa_summary(model))


def _valid_counts(counts: Any) -> bool:
    return isinstance(counts, dict) and all(isinstance(counts.get(k), int) and counts[k] >= 0
                                            for k in ('total', 'cnn'))


def _layers_from_values(d: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """``tcnn.gpsa_summary`` of the file's GPSA layers, computed from their stored parameters
    (``d['tensor_values']``), or None when those do not fit the file's conversion settings."""
    conversion, values = d.get('conversion'), d.get('tensor_values') or {}
    summary: Dict[str, Any] = {}
    for name in (conversion or {}).get('layers', []):
        gating, raw, centers = (values.get(f'{name}.{p}') for p in HEAD_PARAMETERS)
        if not (isinstance(gating, list) and isinstance(raw, list) and isinstance(centers, list)
                and gating and len(gating) == len(raw) == len(centers)):
            return None
        summary[name] = summary_of_values(gating, raw, centers)
    return summary


def _m(n: int) -> str:
    return f'{n / 1e6:.2f}M'


def _range(values: List[float]) -> str:
    return f'{sum(values) / len(values):.3f} [{min(values):.3f}-{max(values):.3f}]'


def _data_text(config: Dict[str, Any], source: str = '') -> str:
    if not config and source.startswith('torchvision:'):  # tcnn.data.config.dense_data_config: nothing applies
        return 'none: a torchvision detection model resizes and normalises its images (in [0, 1]) itself'
    if not config:
        return 'unknown'
    if 'input_size' not in config:  # a torchvision segmentation model: any size
        mean = ','.join(f'{v:.3f}' for v in config.get('mean', []))
        std = ','.join(f'{v:.3f}' for v in config.get('std', []))
        return f'any size, {config.get("interpolation")}, mean {mean}, std {std}'
    size = 'x'.join(map(str, config.get('input_size', [])))
    mean = ','.join(f'{v:.3f}' for v in config.get('mean', []))
    std = ','.join(f'{v:.3f}' for v in config.get('std', []))
    crop = config.get('crop_pct')
    crop = f'{crop:.3g}' if isinstance(crop, float) else crop
    text = f'{size}, {config.get("interpolation")}, crop {crop} ({config.get("crop_mode")}), mean {mean}, std {std}'
    test_size, test_crop = config.get('test_input_size'), config.get('test_crop_pct')
    if test_size is not None and (test_size != config.get('input_size') or test_crop != config.get('crop_pct')):
        text += f'; tested at {"x".join(map(str, test_size))}, crop {test_crop:.3g}'  # timm's use_test_size
    return text


def _classes_text(names: Optional[List[str]], shown: int = 8) -> Optional[str]:
    """The first ``shown`` class names, or None when the file stores none."""
    if not names:
        return None
    return ', '.join(names[:shown]) + (f', ... ({len(names) - shown} more)' if len(names) > shown else '')


def _training_text(training: Dict[str, Any]) -> str:
    """A checkpoint's training facts; its 0-based ``epoch`` counted from 1, as the console and the card count."""
    return ', '.join(f'after epoch {v + 1}' if k == 'epoch' and isinstance(v, int) else f'{k} {v}'
                     for k, v in training.items())


def format_info(info: Dict[str, Any], heads: bool = False) -> str:
    """The human-readable report of ``collect``'s dict."""
    source, conversion, params = info['source'], info['conversion'], info['parameters']
    kwargs = f', kwargs {source["kwargs"]}' if source.get('kwargs') else ''
    lines = [f'{info["file"]}: T-CNN file (format {info["format"]} v{info["version"]}, written by tcnn '
             f'{info["tcnn_version"]}), {size_text(info["file_size"])}',
             f'  source      {source["model"]}, {info["num_classes"]} classes{kwargs}']
    classes = _classes_text(info.get('label_names'))
    if classes:
        lines.append(f'  classes     {classes}')
    if conversion:
        lines.append(f'  conversion  {", ".join(conversion["stages"])}: {len(conversion["layers"])} GPSA layers, '
                     f'init alpha={conversion["locality_strength"]:g} lambda={conversion["gating_init"]:g}, '
                     f'qk_dim {conversion["qk_dim"] or "min(C_in // heads, C_in // groups)"}')
        lines.append(f'  parameters  {_m(params["total"])} (CNN {_m(params["cnn"])}, '
                     f'{params["self_attention"] / 1e6:+.2f}M for self-attention)')
    else:
        lines.append('  conversion  none: a plain CNN (e.g. the no-SA baseline)')
        lines.append(f'  parameters  {_m(params["total"])}')
    lines.append(f'  data        {_data_text(info["data_config"], source["model"])}')
    if info.get('training'):
        lines.append('  training    ' + _training_text(info['training']))
    if info['layers']:
        width = max(len(n) for n in info['layers'])
        lines.append(f'  {"layer":<{width}}  heads  {"gate sigmoid(lambda), 0-1":<26}  {"span 1/alpha, tokens^2":<26}  '
                     'sigma 1/sqrt(2 alpha), tokens  (each: mean [min-max] over heads)')
        for name, layer in info['layers'].items():
            lines.append(f'  {name:<{width}}  {len(layer["gate"]):>5}  {_range(layer["gate"]):<26}  '
                         f'{_range(layer["span"]):<26}  {_range(layer["sigma"])}')
            if heads:
                for h, (g, a, s, w, c) in enumerate(zip(layer['gate'], layer['alpha'], layer['span'], layer['sigma'],
                                                        layer['center'])):
                    lines.append(f'    head {h}: gate {g:.3f}  alpha {a:.3f} /tokens^2  span {s:.3f} tokens^2  '
                                 f'sigma {w:.3f} tokens  centre ({c[0]:+.2f}, {c[1]:+.2f}) tokens')
    return '\n'.join(lines)


def run(args: argparse.Namespace) -> int:
    from ..paths import check_input_file
    check_input_file(args.file, 'T-CNN file')  # before torch loads: a wrong path is answered at once
    info = collect(args.file, ema=args.use_ema)
    print(json.dumps(info, indent=1) if args.json else format_info(info, heads=args.heads))
    return 0
