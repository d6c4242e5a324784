"""``tcnn convert MODEL --out FILE``: turn a CNN into a T-CNN file, verified against the CNN.

The conversion (T-CNN, arXiv:2106.05795, section 2) replaces the k x k convs of the chosen stages by GPSA layers
holding their filters, checks in the exact configuration that the T-CNN computes the CNN's logits, sets the requested
init (default: the paper's alpha = lambda = 1) and reports how far that init departs from the CNN.
"""
import argparse
import sys
import time
import warnings
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple, Union

from ..errors import TcnnError, check_conversion_settings, check_number
from ..paths import check_output_file
from ..version import EXTENSIONS
from .arguments import (add_img_size, add_out, add_use_ema, file_size_text, input_size, parse_img_size,
                        parse_model_kwargs)

if TYPE_CHECKING:  # torch loads in run(), after the flags are checked
    import torch.nn as nn

    from ..convert.stages import StageRow

__all__ = ['add_arguments', 'run', 'parse_stages', 'FLAG_NAMES']

# the conversion settings under their command-line names, for error messages
FLAG_NAMES = {'locality_strength': '--locality-strength', 'gating_init': '--gating-init', 'qk_dim': '--qk-dim',
              'tol': '--tol'}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('model', metavar='MODEL',
                        help='timm model name (resnet50d, resnetrs50, resnet50d.a1_in1k, convnext_tiny, regnety_040, '
                             'efficientnet_b0, ...) or torchvision:NAME (classifiers, and detection and segmentation '
                             'models: torchvision:fasterrcnn_resnet50_fpn, torchvision:fcn_resnet50, ...); a T-CNN '
                             'name (t_resnet50d) with --weights holding that T-CNN\'s state dict makes a T-CNN file of '
                             'it')
    add_out(parser, 'the T-CNN file to write: .pt (a plain dict, torch.load(weights_only=True)) or .safetensors '
                    '(required unless --list-stages)')
    parser.add_argument('--list-stages', action='store_true',
                        help='print the stages of MODEL (random init, offline) with their k x k convs, channels, '
                             'token grid at the pretrained input size (or --img-size), whether they convert exactly, '
                             'and the default; convert nothing')
    weights = parser.add_mutually_exclusive_group()
    weights.add_argument('--weights', metavar='PATH',
                         help='local checkpoint of MODEL (.pt/.pth/.safetensors; plain state_dict or wrapped under '
                              'state_dict/model, e.g. Lightning\'s; module., _orig_mod. and a wrapper\'s model. '
                              'prefixes handled) instead of the pretrained weights; its '
                              'head sets the class count')
    weights.add_argument('--no-pretrained', action='store_true', help='random init (no weights needed)')
    add_use_ema(parser)  # of --weights
    parser.add_argument('--num-classes', type=int, metavar='N',
                        help='classifier size (default: the head of --weights, else the model\'s); a checkpoint head '
                             'of another size is dropped for a new random one, with a warning')
    parser.add_argument('--model-kwargs', nargs='+', metavar='KEY=VALUE',
                        help='further arguments of the model: timm.create_model\'s (drop_path_rate=0.1) or a '
                             'torchvision detection or segmentation builder\'s (min_size=512 max_size=683, '
                             'aux_loss=True); values are Python literals, else strings; the file records them')
    parser.add_argument('--stages', nargs='+', metavar='STAGE',
                        help='what becomes GPSA: stage names (layer4, stages.3, s4, blocks.5, features.7, '
                             'trunk_output.block4), module paths (layer4.2), fnmatch patterns of module names '
                             '(\'stages.3.blocks.*.conv_dw\') or resolution levels 1-4 (ResNet layer1-layer4; other '
                             'models: every stage at 1/2**(i+1) of the input). Default: the last stage with a k x k '
                             'conv (layer4 for ResNets, as in the paper); see --list-stages')
    parser.add_argument('--locality-strength', type=float, default=1.0, metavar='ALPHA',
                        help='initial locality strength alpha of every head (default 1.0, the paper\'s fine-tuning '
                             'init; >= 30 gives a T-CNN that is exactly the CNN)')
    parser.add_argument('--gating-init', type=float, default=1.0, metavar='LAMBDA',
                        help='initial gating parameter lambda of every head (default 1.0; >= 20 with a large alpha '
                             'gives the exact CNN)')
    parser.add_argument('--qk-dim', type=int, metavar='D',
                        help='per-head query/key width of the content attention (default C_in // heads; for a grouped '
                             'conv the group width C_in // groups if smaller)')
    add_img_size(parser, 'of the equivalence check and of the --list-stages grids',
                 "the model's pretrained input size")
    parser.add_argument('--no-verify', action='store_true', help='skip the numerical equivalence check')
    parser.add_argument('--tol', type=float, default=1e-4,
                        help='largest accepted relative logits error in the exact configuration (default 1e-4)')


def parse_stages(values: Optional[Sequence[str]]) -> Optional[List[Union[int, str]]]:
    """``['3', 'layer4.2']`` (or ``['3,4']``) -> ``[3, 'layer4.2']``; None stays None (the last stage)."""
    if not values:
        return None
    stages: List[Union[int, str]] = []
    for value in values:
        for item in filter(None, (v.strip() for v in value.split(','))):
            stages.append(int(item) if item.isdigit() else item)
    return stages or None


def _count(model: 'nn.Module') -> int:
    return sum(p.numel() for p in model.parameters())


def _millions(n: int) -> str:
    return f'{n / 1e6:.2f}M'


def _weights_text(args: argparse.Namespace) -> str:
    if args.weights:
        return f'{"EMA " if args.use_ema else ""}weights {args.weights}'
    return 'random init' if args.no_pretrained else 'pretrained weights'


def _layer_lines(t_model: 'nn.Module') -> List[str]:
    from ..convert.settings import gpsa_layers
    lines = []
    for name, layer in gpsa_layers(t_model):
        kh, kw = layer.kernel_size
        stride = f', stride {layer.stride[0]}' if max(layer.stride) > 1 else ''
        if layer.groups > 1:
            stride += ', depthwise' if layer.groups == layer.in_chs else f', groups {layer.groups}'
        lines.append(f'{name}: {layer.in_chs}->{layer.out_chs}, {kh}x{kw}{stride} -> {layer.num_heads} heads, '
                     f'qk_dim {layer.qk_dim}')
    return lines


def _num_classes(model: 'nn.Module') -> Optional[int]:
    from ..files.sources import classifier_layer, dense_num_classes, model_task
    if model_task(model):
        return dense_num_classes(model)  # box predictors and per-pixel convs: not the last nn.Linear
    if isinstance(getattr(model, 'num_classes', None), int):
        return model.num_classes
    _, head = classifier_layer(model)  # torchvision: its last nn.Linear
    return head.out_features if head is not None else None


def _print_summary(args: argparse.Namespace, cnn: 'nn.Module', t_model: 'nn.Module', path: str,
                   seconds: float) -> None:
    config = t_model.tcnn_config
    lines = _layer_lines(t_model)
    n_cnn, n_t = _count(cnn), _count(t_model)
    classes = _num_classes(t_model)
    classes = f', {classes} classes' if classes is not None else ''
    out = [f'{args.model} ({_weights_text(args)}{classes}) -> {path}',
           f'  replaced    {len(lines)} convs in {", ".join(config["stages"])} by GPSA layers:']
    out += [f'                {line}' for line in lines]
    out.append(f'  parameters  {_millions(n_cnn)} -> {_millions(n_t)} ({(n_t - n_cnn) / 1e6:+.2f}M, '
               f'{100 * (n_t - n_cnn) / max(n_cnn, 1):+.1f}%)')
    report = getattr(t_model, 'tcnn_report', None)
    init = f'alpha={args.locality_strength:g}, lambda={args.gating_init:g}'
    if report is None:
        out.append('  verified    no (--no-verify)')
    else:
        shape = 'x'.join(map(str, (report.batch_size, *report.input_size)))
        out.append(f'  verified    exact configuration: max rel err {report.max_rel_err:.2g} (max abs '
                   f'{report.max_abs_err:.2g}) on {shape} logits, tolerance {args.tol:g}')
        if report.float64_max_rel_err is not None:
            out.append(f'  float64     max rel err {report.float64_max_rel_err:.2g}: the {report.dtype} error above is '
                       'rounding amplified by the network, not the conversion')
        if report.vacuous:
            # e.g. a random-init timm ResNet: zero-initialised last BNs silence every residual branch
            out.append('  note        the replaced layers do not affect these logits (zero-initialised residual '
                       'branches or tiny layer scales?), so this check cannot catch a wrong conversion')
        else:
            note = ('within tolerance: at this init the T-CNN is the CNN' if report.init_max_rel_err <= args.tol
                    else 'this init departs from the CNN by design, T-CNN paper section 2')
            out.append(f'  at init     {init}: max rel err {report.init_max_rel_err:.2g} ({note})')
    out.append(f'  init        {init}, qk_dim {config["qk_dim"] or "min(C_in // heads, C_in // groups)"}')
    out.append(f'  saved       {path} ({file_size_text(path)}) in {seconds:.1f} s')
    print('\n'.join(out))


def _convs_text(row: 'StageRow') -> str:
    if not row.convs:
        return 'none (1x1 only)' if row.in_chs is not None else 'none'
    return ', '.join(f'{n} {kind}' for kind, n in row.conv_kinds.items())


def _grid_text(grid: Optional[Tuple[int, int]]) -> str:
    return 'x'.join(map(str, grid)) if grid else '-'


def list_stages(args: argparse.Namespace) -> int:
    """``--list-stages``: the stage table of ``list_stages`` for a random-init MODEL (nothing downloaded)."""
    from ..convert.stages import default_input_size, list_stages as stage_rows
    from ..files.sources import create_cnn, source_model_name

    source = source_model_name(args.model)
    cnn = create_cnn(source or args.model, pretrained=False, num_classes=args.num_classes,
                     **parse_model_kwargs(args.model_kwargs))
    size = input_size(parse_img_size(args.img_size), cnn)
    rows = stage_rows(cnn, size)
    if not rows:
        raise TcnnError(f'{args.model} has no known stages (no ResNet layer1-4, timm feature_info or '
                        'features/stages/blocks container): name modules or patterns with --stages')
    size = size or default_input_size(cnn)
    header = ('stage', 'level', 'channels', 'grid', 'tokens', 'k x k convs', 'exact')
    notes: Dict[str, List[str]] = {}  # reason -> the convs it applies to (one note per reason)
    table = []
    for row in rows:
        for conv, reason in row.unsupported.items():
            notes.setdefault(reason, []).append(conv)
        numbers = sorted({list(notes).index(r) + 1 for r in row.unsupported.values()})
        exact = 'yes' if row.exact else '-' if not row.convs else f'no ({", ".join(map(str, numbers))})'
        channels = f'{row.in_chs}->{row.out_chs}' if row.in_chs is not None else '-'
        table.append((row.name + (' *' if row.default else ''), '-' if row.level is None else str(row.level),
                      channels, _grid_text(row.out_grid), _grid_text(row.tokens), _convs_text(row), exact))
    widths = [max(len(r[i]) for r in (header, *table)) for i in range(len(header))]
    default = next((r.name for r in rows if r.default), None)
    out = [f'{args.model}: {len(rows)} stages at {"x".join(map(str, size))} (random init); '
           f'default {default + " (*)" if default else "none: no stage holds a k x k conv"}']
    out += ['  ' + '  '.join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in (header, *table)]
    out += [f'  ({i}) {", ".join(convs)}: {reason}' for i, (reason, convs) in enumerate(notes.items(), 1)]
    out += ['  level i: output at 1/2**(i+1) of the input (ResNet layer{i}); grid: the stage\'s output; tokens: '
            'the key grid of its largest GPSA layer',
            '  --stages takes stage names, levels, module paths (layer4.2) or patterns (\'stages.3.blocks.*.conv_dw\')']
    print('\n'.join(out))
    return 0


def state_dict_file(args: argparse.Namespace, start: float) -> int:
    """``tcnn convert t_MODEL --weights PATH``: the T-CNN file of a T-CNN's state dict (``torch.save(t_model
    .state_dict())``, timm's clean_checkpoint.py, a checkpoint of timm's train.py), loaded strictly into ``t_MODEL``
    as its GPSA layers show it (stages, qk_dim); nothing to convert or verify."""
    from ..files import tcnn_file
    from ..files.loading import model_from_state_dict
    from ..files.sources import source_model_name
    from ..files.weights import gpsa_layer_names, load_state_dict_file

    stages = parse_stages(args.stages)
    kwargs = {k: v for k, v in (('stages', stages), ('qk_dim', args.qk_dim)) if v is not None}
    kwargs.update(parse_model_kwargs(args.model_kwargs))
    state_dict = load_state_dict_file(args.weights, use_ema=args.use_ema)
    if not gpsa_layer_names(state_dict):
        raise TcnnError(f'{args.weights} holds the weights of a CNN (no GPSA layers), not of the T-CNN {args.model}: '
                        f'convert them with `tcnn convert {source_model_name(args.model)} --weights {args.weights} '
                        f'--out {args.out}`')
    t_model = model_from_state_dict(args.model, state_dict, where=args.weights, num_classes=args.num_classes,
                                    kwargs=kwargs)
    tcnn_file.save(t_model, args.out)
    config = t_model.tcnn_config
    classes = _num_classes(t_model)
    lines = _layer_lines(t_model)
    print('\n'.join([f'{args.model} ({"EMA " if args.use_ema else ""}T-CNN weights {args.weights}, {classes} classes) '
                     f'-> {args.out}',
                     f'  loaded      {len(lines)} GPSA layers in {", ".join(config["stages"])} (strict: every tensor '
                     'of the state dict, nothing converted or verified):'] +
                    [f'                {line}' for line in lines] +
                    [f'  saved       {args.out} ({file_size_text(args.out)}) in {time.perf_counter() - start:.1f} s']))
    return 0


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    if args.list_stages:
        parse_img_size(args.img_size)
        return list_stages(args)
    if not args.out:
        raise TcnnError('--out FILE is required (or --list-stages to list the stages of MODEL)')
    # every flag and the output path before torch loads and the CNN is built: a mistake costs no conversion
    check_output_file(args.out, '--out', EXTENSIONS)
    path = args.out
    check_conversion_settings(args.locality_strength, args.gating_init, args.qk_dim, args.tol, names=FLAG_NAMES)
    if args.num_classes is not None:
        check_number(args.num_classes, '--num-classes', ge=0, integer=True)
    if args.use_ema and not args.weights:
        raise TcnnError('--use-ema reads the EMA weights of a checkpoint: give it with --weights PATH')
    size = parse_img_size(args.img_size)
    model_kwargs = parse_model_kwargs(args.model_kwargs)
    flags = {'pretrained': '--no-pretrained', 'weights': '--weights PATH', 'weights_backbone': '--weights PATH',
             'num_classes': '--num-classes N', 'use_ema': '--use-ema'}
    for key in sorted(set(model_kwargs) & set(flags)):
        raise TcnnError(f'--model-kwargs {key}=...: this command sets {key} itself; give it with {flags[key]} (or '
                        'leave it out for the pretrained weights)')

    from tqdm import tqdm

    from ..files import tcnn_file
    from ..convert.transform import reparameterize
    from ..files.sources import CLI_HINT, WeightsUnavailableError, create_cnn, source_model_name

    source = source_model_name(args.model)
    if source is not None and args.weights:
        return state_dict_file(args, start)
    if source is not None:
        raise TcnnError(f'{args.model} is already a T-CNN architecture: convert its CNN, '
                        f'`tcnn convert {source} --out FILE`, or give the T-CNN\'s weights with --weights PATH')
    stages = parse_stages(args.stages)
    steps = ['creating ' + args.model, 'converting' + ('' if args.no_verify else ' and verifying'), 'saving']
    # a bar on a terminal only (tqdm disables itself otherwise); the summary goes to stdout
    with tqdm(total=len(steps), file=sys.stderr, disable=None, leave=False,
              bar_format='{desc} [{n_fmt}/{total_fmt}, {elapsed}]') as bar:
        bar.set_description(steps[0])
        try:
            cnn = create_cnn(args.model, pretrained=not args.no_pretrained, weights=args.weights,
                             num_classes=args.num_classes, use_ema=args.use_ema, **model_kwargs)
        except WeightsUnavailableError as e:  # the fix in this command's terms: its flags, not Python arguments
            raise e.with_hint(CLI_HINT) from None
        bar.update()
        bar.set_description(steps[1])
        with warnings.catch_warnings():  # a vacuous check is reported in the summary below
            warnings.filterwarnings('ignore', message='the replaced layers do not influence')
            t_model = reparameterize(cnn, stages=stages, locality_strength=args.locality_strength,
                                     gating_init=args.gating_init, qk_dim=args.qk_dim, verify=not args.no_verify,
                                     input_size=input_size(size, cnn), tol=args.tol)
        bar.update()
        bar.set_description(steps[2])
        tcnn_file.save(t_model, path)
        bar.update()
    _print_summary(args, cnn, t_model, path, time.perf_counter() - start)
    return 0

