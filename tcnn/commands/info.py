"""``tcnn info FILE``: what a T-CNN file (or training checkpoint) holds: source architecture, conversion settings,
data config, parameter counts, and per GPSA layer the gates sigmoid(lambda) and spans 1/alpha (seed 001 Fig. 4)."""
import argparse
import json
import os
from typing import Any, Dict, List

import torch
import torch.nn as nn

__all__ = ['add_arguments', 'run', 'collect']


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('file', metavar='FILE',
                        help='a T-CNN file (.pt/.pth/.safetensors from tcnn convert / tcnn.save) or a training '
                             'checkpoint (last.pt / best.pt)')
    parser.add_argument('--heads', action='store_true', help='also list every head: gate, alpha, span, centre')
    parser.add_argument('--json', action='store_true', help='print everything as one JSON object')


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _cnn_parameters(d: Dict[str, Any]) -> int:
    """Parameters of the source CNN, rebuilt without weights on the meta device (exact for grouped convs too)."""
    from ..hub import create_cnn
    source = d['source']
    with torch.device('meta'):
        cnn = create_cnn(source['model'], pretrained=False, num_classes=d.get('num_classes'),
                         **(source.get('kwargs') or {}))
    return _count(cnn)


def collect(path: str) -> Dict[str, Any]:
    """Everything ``tcnn info`` shows, as a JSON-ready dict."""
    from .. import io as tio
    from ..convert import gpsa_summary

    d = tio.read(path)
    model = tio.model_from_dict(d, map_location=None, where=path)
    total = _count(model)
    cnn = _cnn_parameters(d) if d['conversion'] else total
    return {
        'file': path,
        'file_size': os.path.getsize(path),
        'format': d['format'], 'version': d['version'], 'tcnn_version': d.get('tcnn_version'),
        'source': d['source'], 'num_classes': d.get('num_classes'),
        'conversion': d['conversion'], 'data_config': d.get('data_config'),
        'parameters': {'total': total, 'cnn': cnn, 'self_attention': total - cnn},
        'training': d.get('training'),
        'layers': gpsa_summary(model),
    }


def _m(n: int) -> str:
    return f'{n / 1e6:.2f}M'


def _range(values: List[float]) -> str:
    return f'{sum(values) / len(values):.3f} [{min(values):.3f}-{max(values):.3f}]'


def _size(n: int) -> str:
    return f'{n / 2 ** 20:.1f} MiB' if n >= 2 ** 20 else f'{n / 2 ** 10:.1f} KiB'


def _data_text(config: Dict[str, Any]) -> str:
    if not config:
        return 'unknown'
    size = 'x'.join(map(str, config.get('input_size', [])))
    mean = ','.join(f'{v:.3f}' for v in config.get('mean', []))
    std = ','.join(f'{v:.3f}' for v in config.get('std', []))
    crop = config.get('crop_pct')
    crop = f'{crop:.3g}' if isinstance(crop, float) else crop
    return (f'{size}, {config.get("interpolation")}, crop {crop} ({config.get("crop_mode")}), '
            f'mean {mean}, std {std}')


def format_info(info: Dict[str, Any], heads: bool = False) -> str:
    """The human-readable report of ``collect``'s dict."""
    source, conversion, params = info['source'], info['conversion'], info['parameters']
    kwargs = f', kwargs {source["kwargs"]}' if source.get('kwargs') else ''
    lines = [f'{info["file"]}: T-CNN file (format {info["format"]} v{info["version"]}, written by tcnn '
             f'{info["tcnn_version"]}), {_size(info["file_size"])}',
             f'  source      {source["model"]}, {info["num_classes"]} classes{kwargs}']
    if conversion:
        lines.append(f'  conversion  {", ".join(conversion["stages"])}: {len(conversion["layers"])} GPSA layers, '
                     f'init alpha={conversion["locality_strength"]:g} lambda={conversion["gating_init"]:g}, '
                     f'qk_dim {conversion["qk_dim"] or "C_in // heads"}')
        lines.append(f'  parameters  {_m(params["total"])} (CNN {_m(params["cnn"])}, '
                     f'{params["self_attention"] / 1e6:+.2f}M for self-attention)')
    else:
        lines.append('  conversion  none: a plain CNN (e.g. the no-SA baseline)')
        lines.append(f'  parameters  {_m(params["total"])}')
    lines.append(f'  data        {_data_text(info["data_config"])}')
    if info.get('training'):
        lines.append('  training    ' + ', '.join(f'{k} {v}' for k, v in info['training'].items()))
    if info['layers']:
        width = max(len(n) for n in info['layers'])
        lines.append(f'  {"layer":<{width}}  heads  gate sigmoid(lambda) mean [min-max]  span 1/alpha mean [min-max]')
        for name, layer in info['layers'].items():
            lines.append(f'  {name:<{width}}  {len(layer["gate"]):>5}  {_range(layer["gate"]):<35}  '
                         f'{_range(layer["span"])}')
            if heads:
                for h, (g, a, s, c) in enumerate(zip(layer['gate'], layer['alpha'], layer['span'], layer['center'])):
                    lines.append(f'    head {h}: gate {g:.3f}  alpha {a:.3f}  span {s:.3f}  '
                                 f'centre ({c[0]:+.2f}, {c[1]:+.2f})')
    return '\n'.join(lines)


def run(args: argparse.Namespace) -> int:
    info = collect(args.file)
    print(json.dumps(info, indent=1) if args.json else format_info(info, heads=args.heads))
    return 0
