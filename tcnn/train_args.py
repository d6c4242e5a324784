"""The arguments of ``tcnn train``, ``python -m tcnn.train`` and ``torchrun -m tcnn.train`` (one definition for all).

Torch-free on purpose: ``tcnn train --help`` and argument errors answer without the seconds that importing torch and
timm takes; ``tcnn.train`` (the run itself) imports this module for its own parser.
"""
import argparse
from typing import Any, Dict, Tuple

from .compiling import COMPILE_HELP
from .recipe import LOG_BACKENDS, RECIPE_KEYS

__all__ = ['FLAGS', 'ALIASES', 'add_arguments', 'flag_overrides']

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
    ('--img-size', 'img_size', {'type': int, 'metavar': 'PX'}),
    ('--workers', 'workers', {'type': int, 'metavar': 'N'}),
    ('--device', 'device', {'metavar': 'DEV'}),
    ('--amp', 'amp', {'nargs': '?', 'const': 'bf16', 'choices': ('auto', 'bf16', 'fp16', 'none'), 'metavar': 'MODE'}),
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


def flag_overrides(args: argparse.Namespace) -> Dict[str, Any]:
    """The recipe keys that named flags set (flags not given are absent)."""
    return {key: getattr(args, key) for _, key, _ in FLAGS if getattr(args, key, None) is not None}
