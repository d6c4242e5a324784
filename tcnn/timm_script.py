"""Run timm's own scripts (``train.py``, ``validate.py``, ``benchmark.py``, ...) on T-CNNs.

``python -m tcnn.timm_script PATH/train.py ARGS...`` (or ``torchrun --nproc_per_node N -m tcnn.timm_script
PATH/train.py ARGS...``) runs the script as ``__main__`` with ``ARGS`` as its command line, after

* ``import tcnn``, which registers the ``t_*`` models in timm's registry (timm's scripts know them by name, and Hub
  folders ``local-dir:PATH`` / ``hf-hub:ORG/NAME`` of T-CNNs then build);
* giving every optimizer that timm's ``create_optimizer_v2`` builds for a model with GPSA layers the paper's
  parameter groups (``tcnn.param_groups`` with ``lr_scale=True``: the gates at 1000 x the lr, T-CNN section 3), made
  from the lr and weight decay of the call itself, i.e. from the script's own ``--lr`` (after train.py's batch
  scaling) and ``--weight-decay``: timm's scripts pass no ``param_group_fn`` of their own, and without one the
  gates would train at the base lr, which is not the paper's method.

Options of the runner (anywhere on the command line; timm's scripts have no ``--tcnn-*`` flags):

* ``--tcnn-recipe NAME|FILE``: add a tcnn recipe's settings as train.py flags (``recipe_flags``); flags given on the
  command line win, ``--tcnn-set KEY=VALUE`` changes a recipe key first (e.g. ``pretrained=false``);
* ``--tcnn-print-flags``: print those flags (with ``--tcnn-recipe``) and exit, without running anything.

The scripts are timm's own files (they are not in timm's pip package: take them from timm's repository, matching
the installed timm's version); nothing of them is copied here.
"""
import contextlib
import functools
import inspect
import os
import runpy
import shlex
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch.nn as nn

from .errors import TcnnError
from .train.optim import GATING_LR_RATIO, param_groups
from .train.recipe import Recipe, find_recipe, resolve_recipe

__all__ = ['main', 'recipe_flags', 'tcnn_param_groups', 'run_script', 'RECIPE_FLAGS']

PROG = 'python -m tcnn.timm_script'
# recipe key -> train.py flag, for the keys that mean the same in both (values passed as they are)
RECIPE_FLAGS: Dict[str, str] = {
    'img_size': '--img-size', 'drop_path_rate': '--drop-path', 'batch_size': '--batch-size',
    'accum_steps': '--grad-accum-steps', 'opt': '--opt', 'opt_eps': '--opt-eps', 'opt_betas': '--opt-betas',
    'momentum': '--momentum', 'weight_decay': '--weight-decay', 'sched': '--sched', 'warmup_epochs': '--warmup-epochs',
    'warmup_lr': '--warmup-lr', 'min_lr': '--min-lr', 'clip_grad': '--clip-grad', 'aa': '--aa',
    'color_jitter': '--color-jitter', 'scale': '--scale', 'reprob': '--reprob', 'remode': '--remode',
    'recount': '--recount', 'mixup': '--mixup', 'cutmix': '--cutmix', 'mixup_prob': '--mixup-prob',
    'mixup_switch_prob': '--mixup-switch-prob', 'mixup_mode': '--mixup-mode', 'smoothing': '--smoothing',
    'interpolation': '--train-interpolation', 'crop_pct': '--crop-pct', 'num_classes': '--num-classes',
    'seed': '--seed', 'workers': '--workers', 'data': '--data-dir', 'train_split': '--train-split',
    'val_split': '--val-split', 'model_ema_decay': '--model-ema-decay',
}
# train.py's short forms of the flags above
_ALIASES = {'--batch-size': ('-b',), '--workers': ('-j',)}
# tcnn train features that train.py has no flag for: a recipe that turns them on is refused, not silently dropped
_UNSUPPORTED = {'no_sa': False, 'reparam_epoch': None}


def _given(argv: Sequence[str]) -> set:
    """The flags present in ``argv`` (``--lr 1e-3`` and ``--lr=1e-3`` alike)."""
    return {a.split('=', 1)[0] for a in argv if a.startswith('-')}


def _int_flag(argv: Sequence[str], names: Tuple[str, ...], default: int) -> int:
    """The last value of an integer flag in ``argv`` (``-b 32``, ``--batch-size=32``), else ``default``."""
    value = default
    for i, arg in enumerate(argv):
        name, _, inline = arg.partition('=')
        if name in names:
            text = inline or (argv[i + 1] if i + 1 < len(argv) else '')
            try:
                value = int(text)
            except ValueError:
                raise TcnnError(f'{name} needs an integer, got {text!r}') from None
    return value


def _values(value: Any) -> List[str]:
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def recipe_flags(recipe: Recipe, given: Sequence[str] = ()) -> List[str]:
    """train.py flags for a resolved tcnn recipe (``tcnn.train.recipe``), minus the flags in ``given`` (the user's win).

    The lr is given as train.py's own batch rule when the recipe scales it (``--lr-base LR --lr-base-size
    lr_base_batch --lr-base-scale linear``: train.py computes the lr of its global batch as ``tcnn train`` does),
    otherwise as ``--lr``; the gating lr is the runner's (``tcnn_param_groups``, the recipe's ``gating_lr / lr``).
    The warm-up is a prefix as in ``tcnn train``: ``--warmup-prefix --epochs (epochs - warmup_epochs)``, and train.py
    then runs ``epochs`` epochs in all. ``warmup_lr``/``min_lr``, which train.py does not scale, are scaled here as
    ``tcnn train`` does, with the global batch of the flags (``-b``, ``--grad-accum-steps``; ``given`` or the
    recipe's) and torchrun's ``WORLD_SIZE``. Runtime keys (device, amp, compile, output, dashboards) are the user's.
    """
    for key, off in _UNSUPPORTED.items():
        if getattr(recipe, key) != off:
            raise TcnnError(f'{key}={getattr(recipe, key)!r} is a tcnn train feature that timm\'s train.py does not '
                            f'have: use tcnn train, or --tcnn-set {key}={"false" if off is False else "null"}')
    argv, given = list(given), _given(given)
    flags: List[str] = []

    def add(flag: str, *values: Any, aliases: Tuple[str, ...] = ()) -> None:
        if flag not in given and not given & set(aliases) and not (values and values[0] is None):
            flags.extend([flag, *[v for value in values for v in _values(value)]])

    add('--model', f't_{recipe.model}')
    if recipe.pretrained:
        add('--pretrained')
    plain = recipe.to_dict()  # stages=[3, 4] as a file writes it (the recipe holds a tuple)
    conversion = {k: plain[k] for k in ('stages', 'locality_strength', 'gating_init', 'qk_dim') if plain[k] is not None}
    if conversion and '--model-kwargs' not in given:
        flags.extend(['--model-kwargs', *[f'{k}={v!r}' for k, v in conversion.items()]])
    if recipe.scale_lr and '--lr' not in given:
        add('--lr-base', recipe.lr)
        add('--lr-base-size', recipe.lr_base_batch)
        add('--lr-base-scale', 'linear')
    else:
        add('--lr', recipe.lr)
    epochs, warmup = recipe.epochs, recipe.warmup_epochs
    if '--epochs' in given or '--warmup-epochs' in given:
        add('--epochs', epochs)
    else:
        add('--epochs', epochs - warmup)
        add('--warmup-prefix')
    add('--sched-on-updates')  # tcnn train steps its schedule per update
    scaled = dict(plain)
    if recipe.scale_lr:  # train.py scales only --lr-base: the warm-up start and floor are scaled here
        batch = _int_flag(argv, ('-b', '--batch-size'), recipe.batch_size)
        batch *= _int_flag(argv, ('--grad-accum-steps',), recipe.accum_steps)
        batch *= int(os.environ.get('WORLD_SIZE', '1'))  # torchrun's processes
        for key in ('warmup_lr', 'min_lr'):
            scaled[key] = scaled[key] * batch / recipe.lr_base_batch
    for key, flag in RECIPE_FLAGS.items():
        add(flag, scaled[key], aliases=_ALIASES.get(flag, ()))
    if recipe.model_ema:
        add('--model-ema')
    return flags


def _unwrapped(model: nn.Module) -> nn.Module:
    """The model inside DDP (``module``) or ``torch.compile`` (``_orig_mod``) wrappers."""
    while isinstance(getattr(model, 'module', None), nn.Module) or isinstance(getattr(model, '_orig_mod', None),
                                                                            nn.Module):
        model = getattr(model, 'module', None) or model._orig_mod
    return model


def tcnn_param_groups(factory: Callable[..., Any], gating_ratio: float = GATING_LR_RATIO,
                      announce: Callable[[str], None] = print) -> Callable[..., Any]:
    """Wrap timm's ``create_optimizer_v2`` so that a model with GPSA layers gets ``tcnn.param_groups`` (with
    ``lr_scale=True``, for timm's schedulers) made from the call's own ``lr`` and ``weight_decay``; any other call,
    or one with a ``param_group_fn`` of its own, goes through unchanged."""
    from .convert.settings import gpsa_layers

    signature = inspect.signature(factory)

    @functools.wraps(factory)
    def create_optimizer_v2(model_or_params: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(model_or_params, nn.Module) or kwargs.get('param_group_fn') is not None:
            return factory(model_or_params, *args, **kwargs)
        kwargs = dict(signature.bind_partial(model_or_params, *args, **kwargs).arguments)
        del kwargs['model_or_params']
        kwargs.update(kwargs.pop('kwargs', {}))
        model = _unwrapped(model_or_params)
        layers = gpsa_layers(model)
        if not layers or kwargs.get('lr') is None:
            return factory(model_or_params, **kwargs)
        lr, weight_decay = kwargs['lr'], kwargs.get('weight_decay', 0.0)
        kwargs['param_group_fn'] = functools.partial(param_groups, lr=lr, weight_decay=weight_decay,
                                                     gating_lr=gating_ratio * lr, lr_scale=True)
        if kwargs.pop('layer_decay', None) is not None:
            announce('tcnn: --layer-decay is not applied to a T-CNN (its groups are tcnn.param_groups)')
        optimizer = factory(model, **kwargs)
        announce(f'tcnn: {len(layers)} GPSA layers: parameter groups of tcnn.param_groups, lr {lr:g}, gating lr '
                 f'{gating_ratio * lr:g} ({gating_ratio:g} x lr), weight decay {weight_decay:g}')
        return optimizer

    return create_optimizer_v2


@contextlib.contextmanager
def _patched_factory(gating_ratio: float) -> Iterator[None]:
    """timm's ``create_optimizer_v2`` wrapped (``tcnn_param_groups``) where scripts import it from, and restored."""
    import timm.optim
    from timm.optim import _optim_factory
    original = _optim_factory.create_optimizer_v2
    wrapped = tcnn_param_groups(original, gating_ratio)
    saved = timm.optim.create_optimizer_v2
    timm.optim.create_optimizer_v2 = _optim_factory.create_optimizer_v2 = wrapped
    try:
        yield
    finally:
        timm.optim.create_optimizer_v2, _optim_factory.create_optimizer_v2 = saved, original


def run_script(script: str, argv: Sequence[str], gating_ratio: float = GATING_LR_RATIO) -> None:
    """Run ``script`` as ``__main__`` with ``argv`` (``sys.argv[1:]``), T-CNNs registered and their optimizers built
    from ``tcnn.param_groups``; the script's folder comes first on ``sys.path``, as when Python runs it."""
    import tcnn.models  # noqa: F401 - registers the t_* models in timm's registry
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        with _patched_factory(gating_ratio):
            runpy.run_path(script, run_name='__main__')
    finally:
        sys.argv[:], sys.path[:] = saved_argv, saved_path


def _take(argv: List[str], flag: str, has_value: bool) -> List[str]:
    """Remove every ``flag`` (with its value) from ``argv``; return the values (or ``['']`` per bare flag)."""
    found, rest, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == flag:
            if has_value:
                if i + 1 >= len(argv):
                    raise TcnnError(f'{flag} needs a value')
                found.append(argv[i + 1])
                i += 1
            else:
                found.append('')
        elif has_value and arg.startswith(flag + '='):
            found.append(arg.split('=', 1)[1])
        else:
            rest.append(arg)
        i += 1
    argv[:] = rest
    return found


def _usage() -> str:
    return (f'usage: {PROG} [--tcnn-recipe NAME|FILE [--tcnn-set KEY=VALUE ...]] [--tcnn-print-flags] '
            'SCRIPT.py [SCRIPT ARGS ...]')


def _parse(argv: List[str]) -> Tuple[Optional[str], List[str], List[str], Optional[Recipe], bool]:
    """The script, its arguments, the recipe's flags, the resolved recipe (or None) and whether to print only."""
    argv = list(argv)
    recipes = _take(argv, '--tcnn-recipe', True)
    sets = _take(argv, '--tcnn-set', True)
    print_only = bool(_take(argv, '--tcnn-print-flags', False))
    unknown = [a for a in argv if a.startswith('--tcnn-')]
    if unknown:
        raise TcnnError(f'unknown option {unknown[0].split("=")[0]} (the runner has --tcnn-recipe, --tcnn-set, '
                        '--tcnn-print-flags)')
    if len(recipes) > 1:
        raise TcnnError('give one --tcnn-recipe')
    if sets and not recipes:
        raise TcnnError('--tcnn-set changes a recipe key: give --tcnn-recipe NAME too')
    script = argv.pop(0) if argv else None
    recipe, flags = None, []
    if recipes:
        recipe = resolve_recipe(find_recipe(recipes[0]), sets=sets)
        flags = recipe_flags(recipe, argv)
    return script, argv, flags, recipe, print_only


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m tcnn.timm_script [--tcnn-recipe NAME] SCRIPT.py ARGS...``; see the module docstring."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ('-h', '--help'):
        print(_usage() + '\n\n' + (__doc__ or '').strip())
        return 0 if argv else 2
    try:
        script, args, flags, recipe, print_only = _parse(argv)
        if print_only:
            if recipe is None:
                raise TcnnError('--tcnn-print-flags prints the flags of --tcnn-recipe NAME: give one')
            print(shlex.join(flags))
            return 0
        if script is None or not script.endswith('.py') or not os.path.isfile(script):
            raise TcnnError(f'{script or "no script"}: give the path of a timm script (train.py, validate.py, '
                            "benchmark.py from timm's repository) first")
    except TcnnError as e:
        print(f'{PROG}: error: {e}', file=sys.stderr)
        return 2
    ratio = recipe.gating_lr / recipe.lr if recipe is not None else GATING_LR_RATIO
    run_script(script, flags + args, ratio)
    return 0


if __name__ == '__main__':
    sys.exit(main())
