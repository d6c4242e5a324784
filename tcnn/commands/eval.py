"""``tcnn eval MODEL [MODEL ...] --suite SUITE [SUITE ...] --data DIR [DIR ...]``: accuracy and robustness suites.

Several models give one table with a column per model (T-CNN, arXiv:2106.05795, Table 2, sideways); several suites
are paired with their data directories in order. Every model runs at a size and crop the table states: by default its
test size (timm's validate.py; ``--resolution model|N`` otherwise), ImageNet-C at 224 px (``--imagenet-c-size``).
"""
import argparse
import os
from typing import TYPE_CHECKING, Dict, List, Sequence

from ..errors import TcnnError
from ..runtime.compiling import COMPILE_HELP, compile_mode
from ..runtime.precision import AMP_BARE, AMP_HELP, AMP_MODES
from .arguments import (MODEL_FILE_EXTENSIONS, add_device, add_img_size, add_out, add_use_ema, load_model,
                        parse_img_size)

if TYPE_CHECKING:  # torch loads in run(), after the flags are checked
    import torch.nn as nn


def _resolution(text: str):
    """``test``, ``model`` or a size in pixels (argparse type)."""
    if text in ('test', 'model'):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected test, model or a size in pixels, got {text!r}') from None
    if value < 1:
        raise argparse.ArgumentTypeError(f'a size in pixels must be >= 1, got {value}')
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('models', nargs='+', metavar='MODEL',
                        help='T-CNN files (tcnn convert), training checkpoints (last.pt/best.pt), or timm/torchvision '
                             'model names with pretrained weights (e.g. resnet50d) for the CNN baseline')
    parser.add_argument('--suite', nargs='+', required=True, choices=['imagenet', 'imagenet-c', 'imagenet-a',
                                                                      'imagenet-r'],
                        help='benchmark(s); one --data directory per suite, in the same order')
    parser.add_argument('--data', nargs='+', required=True, metavar='DIR',
                        help='data directory per suite: imagenet DIR/<class>/<img>, imagenet-c '
                             'DIR/<corruption>/<1-5>/<class>/<img>, imagenet-a/-r DIR/<wnid>/<img>')
    add_use_ema(parser)  # of every MODEL
    parser.add_argument('--names', nargs='+', metavar='NAME', help='column names of the models (default: file names)')
    size = parser.add_mutually_exclusive_group()
    size.add_argument('--resolution', type=_resolution, default=None, metavar='test|model|N',
                      help='input size of imagenet, imagenet-a and imagenet-r: test (default: each model\'s test size '
                           'and crop where its pretrained config has one, else its input size, as timm\'s '
                           'validate.py), model (each model\'s own input size and crop: timm\'s training size for '
                           'many pretrained CNNs), or N pixels for every model')
    add_img_size(size, 'of imagenet, imagenet-a and imagenet-r for every model, as --resolution N',
                 "each model's test size, --resolution test")
    parser.add_argument('--imagenet-c-size', type=_resolution, default=None, metavar='N',
                        help='input size of imagenet-c (default 224: its corruptions are defined at that size; '
                             '--resolution and --img-size leave it alone), or test/model; its centre crop is always '
                             '1.0 (the images are the crops)')
    parser.add_argument('--crop-pct', type=float, metavar='F',
                        help='centre-crop fraction for imagenet, imagenet-a and imagenet-r (default: the model\'s '
                             'test crop)')
    parser.add_argument('--batch-size', type=int, default=64, metavar='N', help='images per batch (default 64)')
    parser.add_argument('--workers', type=int, metavar='N', help='data loading processes (default min(8, CPUs))')
    add_device(parser)
    # the --amp of tcnn train; off unless asked for: the accuracies of the tables are float32's
    parser.add_argument('--amp', nargs='?', const=AMP_BARE, default='none', choices=AMP_MODES, metavar='MODE',
                        help=f'{AMP_HELP} (default none; a bare --amp: {AMP_BARE})')
    parser.add_argument('--compile', nargs='?', const='default', metavar='MODE', help=COMPILE_HELP)
    add_out(parser, 'the .json file to write the results to, and a markdown table beside it (default: print the table '
                    'only)')
    parser.add_argument('--markdown', metavar='MD', help='markdown table path (default: --out with .md)')
    parser.add_argument('--no-progress', action='store_true', help='no progress bars')


def column_names(specs: Sequence[str], names: Sequence[str] = None) -> List[str]:
    """Unique short names: the file stem, else ``parent/stem``, else the path as given."""
    if names:
        if len(names) != len(specs) or len(set(names)) != len(names):
            raise TcnnError(f'--names needs {len(specs)} distinct names, one per model')
        return list(names)
    if len(set(specs)) != len(specs):
        raise TcnnError('the same model is given twice')

    def stem(s: str, parents: int) -> str:
        parts = os.path.normpath(os.path.splitext(s)[0] if s.endswith(MODEL_FILE_EXTENSIONS) else s).split(os.sep)
        return '/'.join(parts[-1 - parents:])
    for parents in range(3):
        out = [stem(s, parents) for s in specs]
        if len(set(out)) == len(out):
            return out
    return list(specs)


def run(args: argparse.Namespace) -> int:
    from ..evaluation import scoring, suites, tables
    from ..files.integrity import NonFiniteOutputError
    if len(args.suite) != len(args.data):
        raise TcnnError(f'{len(args.suite)} suites but {len(args.data)} --data directories: give one per suite, '
                        'in the same order')
    if len(set(args.suite)) != len(args.suite):
        raise TcnnError('a suite is given twice')
    from ..data.config import check_image_options
    from ..errors import check_number
    from ..paths import check_output_file
    from ..runtime.devices import resolve_device
    from ..runtime.precision import amp_dtype
    # every flag and output path before the data is scanned or a model loaded: a mistake must not cost an
    # ImageNet-C pass and its results
    img_size = parse_img_size(args.img_size)
    check_image_options(img_size, args.crop_pct, names=('--img-size', '--crop-pct'))
    resolution = img_size if img_size is not None else args.resolution
    check_number(args.batch_size, '--batch-size', ge=1, integer=True)
    compile_mode(args.compile, '--compile')
    if args.workers is not None:
        check_number(args.workers, '--workers', ge=0, integer=True)
    device = resolve_device(args.device, what='--device')
    amp_dtype(args.amp, device)  # fp16 on the CPU: one line before any work
    if args.out:
        check_output_file(args.out, '--out', ('.json',))
    if args.markdown:
        check_output_file(args.markdown, '--markdown', ('.md',))
    elif args.out:
        check_output_file(os.path.splitext(args.out)[0] + '.md', '--out (its .md table)', ('.md',))
    names = column_names(args.models, args.names)
    # scan every folder before loading models: a layout mistake should cost seconds, not a model load
    data = {suite: suites.scan_suite(suite, d) for suite, d in zip(args.suite, args.data)}
    models: Dict[str, nn.Module] = {name: load_model(spec, use_ema=args.use_ema, names=True)
                                    for name, spec in zip(names, args.models)}

    weights = {'weights': 'ema'} if args.use_ema else {}
    report = {'format': 'tcnn-eval', 'version': 2,
              'models': {name: {'source': spec, **weights} for name, spec in zip(names, args.models)}, 'suites': {}}
    for suite, d in data.items():
        if suite == 'imagenet-c':  # its own size: the corruptions are defined at 224 px, the images are the crops
            size, crop = suites.resolution_policy(suite, args.imagenet_c_size), 1.0
        else:
            size, crop = suites.resolution_policy(suite, resolution), args.crop_pct
        try:
            results = scoring.evaluate(models, suite, d.root, resolution=size, crop_pct=crop,
                                       batch_size=args.batch_size, workers=args.workers, device=args.device,
                                       amp=args.amp, progress=not args.no_progress, data=d, compile=args.compile)
        except NonFiniteOutputError as e:  # named by the file the user gave, not its column
            raise e.renamed(dict(zip(names, args.models)).get(e.name, e.name)) from None
        report['suites'][suite] = {'data': d.root, 'num_images': len(d), 'resolution': size, 'results': results}

    header, rows = tables.results_table(report)
    print(tables.format_table(header, rows))
    for note in tables.results_notes(report):
        print(note)
    if args.out or args.markdown:
        md = args.markdown or os.path.splitext(args.out)[0] + '.md'
        tables.write_results(report, args.out, md)
        print('wrote ' + ' and '.join(p for p in (args.out, md) if p))
    return 0
