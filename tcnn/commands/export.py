"""``tcnn export FILE --out OUT.onnx|OUT.pt2|OUT.pte [--aoti]``: a T-CNN for deployment (ONNX, ``torch.export``,
AOTInductor, ExecuTorch), checked against PyTorch in the runtime that reads it before it is written
(``tcnn.export``).

The options are checked once, before the model is read (``tcnn.export.options.check_export_options``, torch-free
until they are valid), and the export runs with what that check returned (``export_checked``)."""
import argparse
import os
import warnings
from typing import TYPE_CHECKING

from ..errors import TcnnError
from ..version import EXPORT_EXTENSIONS
from .arguments import add_img_size, add_out, check_model_file, input_size, load_model, parse_img_size, size_text

if TYPE_CHECKING:
    import torch.nn as nn

__all__ = ['add_arguments', 'run']


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('file', metavar='FILE',
                        help='a T-CNN file (.pt/.pth/.safetensors from tcnn convert / tcnn.save), a training '
                             'checkpoint (last.pt / best.pt of tcnn train) or a Hub folder (tcnn publish: its path, '
                             'local-dir:PATH or hf-hub:ORG/NAME)')
    add_out(parser, 'the file to write: .onnx (checked in onnxruntime), .pt2 (torch.export archive, checked with '
                    'torch.export.load; with --aoti an AOTInductor package) or .pte (ExecuTorch, XNNPACK, batch 1; '
                    'checked in ExecuTorch\'s runtime)', required=True)
    parser.add_argument('--aoti', action='store_true',
                        help='compile the .pt2 with AOTInductor (a package for torch._inductor.aoti_load_package), '
                             'checked with its input checks on (AOTI_RUNTIME_CHECK_INPUTS=1)')
    add_img_size(parser, 'of the trace and of the check', "the file's data config")
    parser.add_argument('--dynamic-size', action='store_true',
                        help='dynamic height and width too (checked at a second size, +32 px); default: only the '
                             'batch is dynamic')
    parser.add_argument('--exporter', choices=['dynamo', 'torchscript'],
                        help='ONNX exporter: dynamo (default; torch.export-based, opsets 18 and later) or torchscript '
                             '(legacy tracing exporter, opsets 13-20)')
    parser.add_argument('--opset', type=int, metavar='N',
                        help='ONNX opset (default 18 with the dynamo exporter, 17 with the torchscript one)')
    parser.add_argument('--backbone', action='store_true',
                        help='of a torchvision detection or segmentation model: export its backbone\'s ResNet (image '
                             '-> its last stage\'s features, where the GPSA layers are), the part that exports')
    parser.add_argument('--tol', type=float, default=1e-4,
                        help='largest accepted logit error relative to the largest logit (default 1e-4)')


def _shape(shape) -> str:
    return '(' + ', '.join(map(str, shape)) + ')'


def _exportable(model: 'nn.Module', args: argparse.Namespace) -> 'nn.Module':
    """The model to export: the file's, or with ``--backbone`` the ResNet of a torchvision detection or segmentation
    model (``tcnn.export.backbone_trunk``); a detection or segmentation model itself is one line naming why not."""
    from ..export.backbone import backbone_trunk
    from ..files.sources import model_task
    task = model_task(model)
    name = (getattr(model, 'tcnn_source', None) or {}).get('model', type(model).__name__)
    if args.backbone:
        if task is None:
            raise TcnnError(f'--backbone exports the backbone of a torchvision detection or segmentation model; '
                            f'{args.file} holds {name}: export it without --backbone')
        return backbone_trunk(model)
    if task == 'detection':
        raise TcnnError(f'{args.file} holds {name}, a detection model: its resizing, anchors and NMS (a varying '
                        'number of boxes per image) do not export as one checked tensor; export its backbone (the '
                        'GPSA layers\' part) with --backbone')
    if task == 'segmentation':
        raise TcnnError(f'{args.file} holds {name}, a segmentation model: it returns a dict of masks, not one '
                        'tensor; export its backbone (the GPSA layers\' part) with --backbone')
    return model


def run(args: argparse.Namespace) -> int:
    # the checks first: a mistake costs no model load and no export
    check_model_file(args.file, 'T-CNN file')
    extension = os.path.splitext(args.out)[1]
    if args.exporter and extension.lower() in EXPORT_EXTENSIONS and extension.lower() != '.onnx':
        raise TcnnError(f'--exporter applies to .onnx files; a {extension} file is written by torch.export')
    size = parse_img_size(args.img_size)
    from ..export.options import check_export_options
    options = check_export_options(args.out, args.exporter or 'dynamo', args.opset, args.aoti, args.dynamic_size,
                                   args.tol, names=('--out', '--tol'))

    from ..convert.settings import gpsa_layers
    from ..export.metadata import INPUT_NAME, OUTPUT_NAME
    from ..export.pipeline import export_checked

    model = _exportable(load_model(args.file, 'T-CNN file'), args)
    if not gpsa_layers(model):
        raise TcnnError(f'{args.file} holds a plain CNN (no GPSA layers), not a T-CNN: convert it first, '
                        '`tcnn convert MODEL --weights WEIGHTS --out FILE`')
    size = input_size(size, model)
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', module=r'torch\.(onnx|export|_export|fx)')  # exporters' progress notes
        report = export_checked(model, options, input_size=size)
    how = f'ONNX opset {report.opset}, {report.exporter} exporter' if report.format == 'onnx' else report.exporter
    checks = ', '.join(f'batch {c.batch} {c.height}x{c.width} {c.max_rel_err:.2g}' for c in report.checks)
    print('\n'.join([
        f'{args.file} -> {report.path} ({how}, {size_text(report.size_bytes)}) in {report.seconds:.1f} s',
        f'  input       {INPUT_NAME} {_shape(report.input_shape)} float32',
        f'  output      {OUTPUT_NAME} {_shape(report.output_shape)}',
        f'  checked     {report.runtime} against PyTorch, max rel err of the logits: {checks} '
        f'(tolerance {report.tol:g})',
    ]))
    return 0
