"""The arguments of ``tcnn train``, ``python -m tcnn.train`` and ``torchrun -m tcnn.train`` (one definition for all).

Torch-free on purpose: ``tcnn train --help`` and argument errors answer without the seconds that importing torch and
timm takes; ``tcnn.train.launch`` (the run itself) imports this module for its own parser.
"""
import argparse
import difflib
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import TcnnError, parse_img_size
from ..runtime.compiling import COMPILE_HELP
from ..runtime.devices import DEVICE_HELP
from ..runtime.precision import AMP_BARE, AMP_MODES
from .recipe import LOG_BACKENDS, PIPELINES, RECIPE_KEYS

__all__ = ['FLAGS', 'ALIASES', 'TIMM_FLAGS', 'add_arguments', 'flag_overrides', 'square_img_size',
           'unknown_argument_message']

# (flag, recipe key, argparse kwargs): the named overrides. Everything else goes through --set KEY=VALUE.
FLAGS: Tuple[Tuple[str, str, Dict[str, Any]], ...] = (
    ('--data', 'data', {'metavar': 'DATA',
                        'help': 'dataset root in ImageFolder layout (train/ and val/ class folders), or a timm reader: '
                        'wds/FOLDER (webdataset shards), hfds/NAME, hfids/NAME, tfds/NAME'}),
    ('--output', 'output', {'metavar': 'DIR'}),
    ('--model', 'model', {'metavar': 'NAME'}),
    ('--weights', 'weights', {'metavar': 'PATH'}),
    ('--no-pretrained', 'pretrained', {'action': 'store_const', 'const': False,
                                       'help': 'start from a random init instead of the pretrained weights'}),
    ('--epochs', 'epochs', {'type': int, 'metavar': 'N'}),
    ('--batch-size', 'batch_size', {'type': int, 'metavar': 'N'}),
    ('--accum-steps', 'accum_steps', {'type': int, 'metavar': 'N'}),
    ('--lr', 'lr', {'type': float, 'metavar': 'LR'}),
    ('--gating-lr', 'gating_lr', {'type': float, 'metavar': 'LR'}),
    # read by square_img_size, with the parser of every command's --img-size: N or NxN (the training images are square)
    ('--img-size', 'img_size', {'metavar': 'SIZE', 'help': f'{RECIPE_KEYS["img_size"].help}: N, or HxW with H = W '
                                '(the training crops and batches are square)'}),
    ('--workers', 'workers', {'type': int, 'metavar': 'N'}),
    ('--data-pipeline', 'data_pipeline', {'choices': PIPELINES, 'metavar': 'WHERE'}),
    ('--device', 'device', {'metavar': 'DEVICE', 'help': DEVICE_HELP}),
    ('--amp', 'amp', {'nargs': '?', 'const': AMP_BARE, 'choices': AMP_MODES, 'metavar': 'MODE'}),
    ('--deterministic', 'deterministic', {'action': 'store_const', 'const': True}),
    ('--no-sa', 'no_sa', {'action': 'store_const', 'const': True}),
    ('--reparam-epoch', 'reparam_epoch', {'type': int, 'metavar': 'N'}),
    ('--seed', 'seed', {'type': int, 'metavar': 'N'}),
    ('--compile', 'compile', {'nargs': '?', 'const': 'default', 'metavar': 'MODE', 'help': COMPILE_HELP}),
    ('--model-ema', 'model_ema', {'action': 'store_const', 'const': True}),
    ('--skip-bad-images', 'skip_bad_images', {'action': 'store_const', 'const': True}),
    ('--no-progress', 'progress', {'action': 'store_const', 'const': False,
                                   'help': 'no progress bar (log lines only)'}),
    ('--log', 'log', {'nargs': '+', 'choices': LOG_BACKENDS + ('none',), 'metavar': 'BACKEND',
                      'help': 'live dashboards on rank 0: tensorboard (OUTPUT/tensorboard) and/or wandb; none: off '
                      '(extras: pip install "tcnn[tensorboard]" / "tcnn[wandb]"); under torchrun write --log-to'}),
    ('--log-every', 'log_every', {'type': int, 'metavar': 'N'}),
)
# Other spellings of a flag. torchrun's parser (argparse) checks every argument of its command line, the script's
# too, against abbreviations of its own options: it refuses --log as ambiguous (--log-dir, --logs-specs, ...).
ALIASES: Dict[str, Tuple[str, ...]] = {'--log': ('--log-to',)}

# timm's train.py flags that users type, and tcnn train's way to the same setting: a flag ('--...'; VALUE: the
# values given), a recipe key (set with --set KEY=VALUE) or a sentence. Flags spelled as a recipe key
# (--weight-decay, --warmup-epochs, --opt, --sched, --mixup, --smoothing, ...) need no entry: they map to their key.
TIMM_FLAGS: Dict[str, str] = {
    '--num-classes': 'the class count comes from the data (one output per class folder); for data that does not '
                     'state its classes: --set num_classes=VALUE',
    '-b': '--batch-size VALUE',
    '-j': '--workers VALUE',
    '--data-dir': '--data VALUE',
    '--dataset': '--data READER/NAME (a timm reader spec: wds/FOLDER, hfds/NAME, ...)',
    '--experiment': '--output DIR (the run folder itself)',
    '--initial-checkpoint': '--weights VALUE',
    '--pretrained-path': '--weights VALUE',
    '--pretrained': 'a run starts from the pretrained weights by default (--no-pretrained: a random init)',
    '--input-size': '--img-size N (the side alone: the training images are square)',
    '--grad-accum-steps': '--accum-steps VALUE',
    '--amp-dtype': '--amp bf16 or --amp fp16',
    '--torchcompile': '--compile VALUE',
    '--log-wandb': '--log wandb',
    '--log-interval': '--log-every VALUE',
    '--drop-path': 'drop_path_rate',
    '--pin-mem': 'pin_memory',
    '--channels-last': 'channels_last',
    '--lr-base-size': 'lr_base_batch',
    '--clip-grad': 'clip_grad',
}


def _values(extras: Sequence[str], start: int) -> Tuple[str, List[str]]:
    """The flag at ``extras[start]`` and the values after it (up to the next flag; ``--flag=value`` too)."""
    flag, _, inline = extras[start].partition('=')
    values = [inline] if inline else []
    for token in extras[start + 1:]:
        if token.startswith('-') and not re.fullmatch(r'-[0-9.]+(e-?[0-9]+)?', token):
            break
        values.append(token)
    return flag, values


def _set_item(key: str, values: List[str]) -> str:
    if not values:
        value = 'true'  # a switch (timm: store_true)
    elif len(values) == 1 and RECIPE_KEYS[key].types[0] is not list:
        value = values[0]
    else:
        value = f'[{",".join(values)}]'  # one shell word
    return f'--set {key}={value}'


def unknown_argument_message(extras: Sequence[str]) -> Optional[str]:
    """One line for the first flag of ``extras`` (arguments ``tcnn train`` does not know) pointing at tcnn train's
    way: timm's train.py flags (``TIMM_FLAGS``, or spelled as a recipe key) get their equivalent, others the
    ``--set KEY=VALUE`` route with the closest recipe keys. None when ``extras`` holds no flag."""
    starts = [i for i, a in enumerate(extras) if a.startswith('-')]
    if not starts:
        return None
    flag, values = _values(extras, starts[0])
    key = flag.lstrip('-').replace('-', '_')
    target = TIMM_FLAGS.get(flag)
    if target is None and key in RECIPE_KEYS:
        target = key
    if target in RECIPE_KEYS:
        return f'tcnn train has no {flag} flag: use {_set_item(target, values)} (the recipe key {target})'
    if target is not None:
        target = target.replace('VALUE', ' '.join(values) or 'VALUE')
        return f'{flag} is timm train.py\'s flag; tcnn train\'s way: {target}'
    close = difflib.get_close_matches(key, list(RECIPE_KEYS), n=3, cutoff=0.6)
    hint = f' (closest: {", ".join(close)})' if close else ''
    return (f'unknown argument {flag}: tcnn train takes its flags (tcnn train --help) and any recipe key as --set '
            f'KEY=VALUE{hint}; every key and its value: tcnn train --print-config')


def _one_line_unknown_arguments(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` answer a flag it does not know with one line (``unknown_argument_message``), not argparse's
    usage. Wraps the parser's own ``parse_known_args``: it is what the ``tcnn`` command's sub-command parser and
    ``parse_args`` call, before argparse's usage error on what is left over."""
    parse = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        namespace, extras = parse(args, namespace)
        message = unknown_argument_message(extras)
        if message is not None:
            parser.exit(2, f'{parser.prog}: error: {message}\n')
        return namespace, extras

    parser.parse_known_args = parse_known_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``tcnn train`` and ``python -m tcnn.train`` to ``parser``.

    Args:
        parser: The sub-command's parser (``tcnn train``) or the module's own (``python -m tcnn.train``).
    """
    parser.add_argument('--recipe', metavar='YAML', help='recipe file, or the name of a bundled one (t_resnet50_rs ... '
                        't_resnet350_rs, t_resnet50_d ... t_resnet200_d); default: the paper\'s shared settings with '
                        'model resnet50d')
    parser.add_argument('--resume', metavar='PATH', help='continue a run: its OUTPUT/last.pt or OUTPUT folder (the '
                        'recipe comes from the checkpoint; flags and --set still override it); "auto": continue '
                        'OUTPUT/last.pt if it exists, else start the run (one command for the first start and every '
                        'requeue)')
    parser.add_argument('--set', dest='set_items', action='append', default=[], metavar='KEY=VALUE',
                        help='override any recipe key (value read as YAML), e.g. --set mixup=0 --set stages=[3,4]; '
                        'applied after the named flags')
    parser.add_argument('--print-config', action='store_true', help='print the resolved recipe and exit')
    group = parser.add_argument_group('recipe overrides')
    for flag, key, kwargs in FLAGS:
        kwargs = dict(kwargs)
        help_text = kwargs.pop('help', RECIPE_KEYS[key].help)
        group.add_argument(flag, *ALIASES.get(flag, ()), dest=key, default=None, help=f'{help_text} (recipe key {key})',
                           **kwargs)
    _one_line_unknown_arguments(parser)


def square_img_size(text: Any) -> int:
    """``--img-size`` of ``tcnn train``: the side of its square images, N or NxN (``parse_img_size``, the parser of
    every command's ``--img-size``); another shape is a one-line error naming the fix."""
    size = parse_img_size(str(text))
    if isinstance(size, tuple):
        raise TcnnError(f'--img-size {text}: tcnn train trains on square images (N or NxN, e.g. --img-size '
                        f'{max(size)}); HxW is for the commands that read a model (tcnn eval --img-size {text})')
    return size


# Flags whose text is read when the run starts, not by argparse: a mistake is then one line, not argparse's usage
_PARSERS = {'img_size': square_img_size}


def flag_overrides(args: argparse.Namespace) -> Dict[str, Any]:
    """The recipe keys that named flags set (flags not given are absent), their values parsed.

    Raises:
        TcnnError: A value its parser refuses (``--img-size 160x192``).
    """
    given = {key: getattr(args, key) for _, key, _ in FLAGS if getattr(args, key, None) is not None}
    return {key: _PARSERS[key](value) if key in _PARSERS else value for key, value in given.items()}
