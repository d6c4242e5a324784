"""``tcnn inspect FILE [--image IMG ...] [--images-dir DIR] --out DIR``: gates, spans, nonlocality, attention maps.

Writes ``DIR/summary.json`` (per layer and head: gate, alpha, span, sigma, centre, nonlocality over all keys and over
the real keys, share of attention on padded keys; the units under ``units``), ``DIR/heads.png`` (the per-layer chart)
and, per ``--image``, ``DIR/attention_<name>.png`` (T-CNN, arXiv:2106.05795, Fig. 5 layout).
"""
import argparse
import json
import os
from typing import List, Optional, Tuple

from ..atomic import atomic_write_text
from ..errors import TcnnError, check_number
from .arguments import add_device, add_img_size, add_out, add_use_ema, load_model, parse_img_size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('model', metavar='FILE', help='a T-CNN file (tcnn convert), a training checkpoint or a Hub '
                                                      'folder (tcnn publish)')
    add_use_ema(parser)
    parser.add_argument('--image', nargs='+', default=[], metavar='IMG',
                        help='images to draw the attention maps of (and to measure the nonlocality on)')
    parser.add_argument('--images-dir', metavar='DIR', help='a folder of images (searched recursively) to average '
                                                             'the nonlocality over, in addition to --image')
    parser.add_argument('--max-images', type=int, default=256, metavar='N',
                        help='at most this many images from --images-dir, a seeded sample spread evenly over its '
                             'folders (the classes) (default 256)')
    parser.add_argument('--seed', type=int, default=0, metavar='N',
                        help='seed of the --images-dir sample (default 0; printed and stored in summary.json)')
    parser.add_argument('--query', metavar='Y,X', help='query pixel (row, column) in the model input image after '
                                                       'resizing/cropping (default: the centre)')
    add_img_size(parser, 'of the images, resized and centre-cropped to it', "the model's eval size")
    parser.add_argument('--parts', default='mixed,content,positional',
                        help='attention parts to draw, comma-separated (default mixed,content,positional)')
    parser.add_argument('--batch-size', type=int, default=32, metavar='N', help='images per batch for the nonlocality')
    add_device(parser)
    add_out(parser, 'the folder to write summary.json and the figures to', folder=True, required=True)


def parse_query(text: Optional[str]) -> Optional[Tuple[float, float]]:
    if text is None:
        return None
    try:
        y, x = (float(v) for v in text.split(','))
    except ValueError:
        raise TcnnError(f'--query takes Y,X (pixel row and column), got {text!r}') from None
    return check_number(y, '--query'), check_number(x, '--query')


def _parts(text: str) -> List[str]:
    from ..analysis.heads import ATTENTION_PARTS
    parts = [p.strip() for p in text.split(',') if p.strip()]
    bad = [p for p in parts if p not in ATTENTION_PARTS]
    if bad or not parts:
        raise TcnnError(f'--parts: unknown part {bad[0] if bad else text!r}; choose from {", ".join(ATTENTION_PARTS)}')
    return parts


def _figure_names(paths: List[str]) -> List[str]:
    """``attention_<stem>.png`` per image, made unique when two images share a stem."""
    names, seen = [], {}
    for p in paths:
        stem = os.path.splitext(os.path.basename(p))[0]
        seen[stem] = seen.get(stem, 0) + 1
        names.append(f'attention_{stem}.png' if seen[stem] == 1 else f'attention_{stem}_{seen[stem]}.png')
    return names


def run(args: argparse.Namespace) -> int:
    from ..data.config import data_config
    from ..data.images import denormalize, load_images
    from ..convert.settings import gpsa_layers
    from ..analysis import heads
    from ..paths import check_output_dir, output_dir
    from ..runtime.devices import resolve_device
    query = parse_query(args.query)
    parts = _parts(args.parts)
    size = parse_img_size(args.img_size)
    check_number(args.max_images, '--max-images', ge=1, integer=True)
    check_number(args.seed, '--seed', integer=True)
    check_number(args.batch_size, '--batch-size', ge=1, integer=True)
    device = resolve_device(args.device, what='--device')
    check_output_dir(args.out, '--out')
    model = load_model(args.model, use_ema=args.use_ema)
    try:
        model.to(device).eval()
    except RuntimeError as e:
        raise TcnnError(f'cannot use device {args.device!r}: {str(e).splitlines()[0]}') from e
    if not gpsa_layers(model):
        raise TcnnError(f'{args.model} has no GPSA layer (a plain CNN, e.g. the no-SA baseline): nothing to inspect')
    cfg = data_config(model, size)

    extra, sample = _sample(args) if args.images_dir else ([], None)
    all_paths = list(args.image) + [p for p in extra if p not in args.image]
    batches = (load_images(all_paths[i:i + args.batch_size], cfg).to(device)
               for i in range(0, len(all_paths), args.batch_size))
    summary = heads.summarize(model, batches if all_paths else None)
    summary.update({'source': os.path.abspath(args.model), 'weights': 'ema' if args.use_ema else 'raw',
                    'images': all_paths, 'sample': sample, 'data_config': {
        k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}})

    maps = None
    if args.image:  # before writing anything: a --query outside the image must not leave half the figures
        x = load_images(args.image, cfg).to(device)
        maps = heads.attention_maps(model, x, query)
        images = denormalize(x.cpu(), cfg)
    with output_dir(args.out):
        written = _write_figures(args, summary, maps, images if maps is not None else None, parts)
    _print_summary(summary)
    if sample:
        print(f'--images-dir: {len(extra)} of {sample["found"]} images from {sample["classes_sampled"]} of '
              f'{sample["classes"]} folders, sampled with seed {sample["seed"]} (--seed)')
    if not all_paths:
        print('nonlocality: not measured (give --image or --images-dir)')
    for path in written:
        print(f'wrote {path}')
    return 0


def _write_figures(args: argparse.Namespace, summary: dict, maps, images, parts: List[str]) -> List[str]:
    from ..analysis import figures
    written = [atomic_write_text(os.path.join(args.out, 'summary.json'), json.dumps(summary, indent=2) + '\n'),
               figures.plot_summary(summary, os.path.join(args.out, 'heads.png'))]
    if maps is not None:
        for i, (path, fig_name) in enumerate(zip(args.image, _figure_names(args.image))):
            written.append(figures.plot_attention(maps, images[i], os.path.join(args.out, fig_name), index=i,
                                                parts=parts, title=os.path.basename(path)))
    return written


def _sample(args: argparse.Namespace) -> Tuple[List[str], dict]:
    """A seeded sample of ``--images-dir`` spread over its folders, and what it is (stored in summary.json)."""
    from ..data.images import find_images, sample_images
    found = find_images(args.images_dir)
    picked = sample_images(found, args.max_images, args.seed)
    return picked, {'images_dir': args.images_dir, 'seed': args.seed, 'max_images': args.max_images,
                    'found': len(found), 'classes': len({os.path.dirname(p) for p in found}),
                    'classes_sampled': len({os.path.dirname(p) for p in picked})}


def _print_summary(summary: dict) -> None:
    def num(value, fmt: str, scale: float = 1.0) -> str:
        return '-' if value is None else format(value * scale, fmt)

    rows = [('layer', 'input grid', 'gate', 'span 1/alpha', 'sigma', 'nonlocality', 'nonlocality', 'padding share',
             'nonlocality'),
            ('', 'tokens @ px/token', '0-1', 'tokens^2', 'tokens', 'all keys, tokens', 'real keys, tokens',
             '% of attention', '% of image diag.')]
    for name, entry in summary['layers'].items():
        grid, token = entry.get('grid'), entry.get('token_px')
        grid_text = '-' if not grid else f'{grid[0]}x{grid[1]}' + (f' @ {token[0]:.3g}' if token else '')
        rows.append((name, grid_text, f'{entry["gate_mean"]:.3f}', f'{entry["span_mean"]:.3f}',
                     f'{entry["sigma_mean"]:.3f}', num(entry['nonlocality_mean'], '.3f'),
                     num(entry.get('nonlocality_real_mean'), '.3f'), num(entry.get('padding_share_mean'), '.1f', 100),
                     num(entry.get('nonlocality_real_image_fraction_mean'), '.1f', 100)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print('  '.join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    if summary['num_images']:
        print(f'(layer means over heads of the gated attention, {summary["num_images"]} images; distances in tokens '
              'of each layer\'s own input grid; real keys: each query\'s attention renormalised over the unpadded '
              'keys; sigma = 1/sqrt(2 alpha))')
