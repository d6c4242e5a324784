"""Where a ``tcnn train`` run starts: a fresh recipe (file, flags, ``--set``), or a checkpoint to resume with the
recipe it holds, and what a resumed run may change.

``--resume PATH`` (a ``last.pt`` or a run folder) takes the recipe from the checkpoint; flags and ``--set`` override
single keys, except those that define the model or the optimiser's parameter layout (``FROZEN_ON_RESUME``).
``--resume auto`` resumes the output folder's ``last.pt`` if there is one, and starts the run otherwise (the same
command for the first start and every requeue).
"""
import argparse
import dataclasses
import os
from typing import Any, Dict, List, Optional, Tuple

from ..errors import TcnnError
from ..files.run_folder import LAST_CHECKPOINT, read_checkpoint
from .args import flag_overrides
from .recipe import Recipe, apply_overrides, mark_absolute_lrs, parse_set, resolve_recipe, validate_recipe

__all__ = ['FROZEN_ON_RESUME', 'SCHEDULE_KEYS', 'resolve', 'resumed_recipe']

# Keys a resumed run cannot change: they define the model or the optimiser's parameter layout.
FROZEN_ON_RESUME = ('model', 'num_classes', 'no_sa', 'reparam_epoch', 'stages', 'qk_dim', 'locality_strength',
                    'gating_init', 'opt', 'drop_path_rate')
# If these are unchanged on resume, the saved scheduler state is loaded as is; otherwise it is rebuilt.
SCHEDULE_KEYS = ('sched', 'epochs', 'warmup_epochs', 'warmup_lr', 'min_lr', 'lr', 'gating_lr', 'lr_base_batch',
                 'scale_lr', 'absolute_lrs')


def _default_output(args: argparse.Namespace, recipe: Recipe) -> str:
    stem = os.path.splitext(os.path.basename(args.recipe))[0] if args.recipe else recipe.model
    return os.path.join('runs', stem.replace(':', '_'))


def _fresh_recipe(args: argparse.Namespace, notes: List[str]) -> Recipe:
    recipe = resolve_recipe(args.recipe, flag_overrides(args), args.set_items, notes)
    if recipe.output is None:
        recipe = dataclasses.replace(recipe, output=_default_output(args, recipe))
    return recipe


def resumed_recipe(args: argparse.Namespace, checkpoint: Dict[str, Any], path: str) -> Recipe:
    """The recipe of ``checkpoint`` (read from ``path``) with the flags' and ``--set``'s overrides. A key the
    checkpoint lacks (written by an older tcnn) takes its default, but for the data pipeline: a run of tcnn <= 0.6
    went through timm's PIL transform, and goes on with it so that its augmentation stays the same."""
    config = dict(checkpoint['config'])
    config.setdefault('data_pipeline', 'pil')
    recipe = Recipe.from_dict(config, f'the checkpoint {path}', validate=False)
    overrides = dict(flag_overrides(args), **parse_set(args.set_items))
    plain = recipe.to_dict()  # as the overrides spell values: lists where the recipe holds tuples
    changed = [k for k in FROZEN_ON_RESUME if k in overrides and overrides[k] != plain[k]]
    if changed:
        raise TcnnError(f'cannot change {", ".join(changed)} when resuming (they define the model and the '
                        'optimiser); start a new run instead')
    recipe = mark_absolute_lrs(apply_overrides(recipe, overrides), overrides)
    if 'output' not in overrides:
        recipe = dataclasses.replace(recipe, output=os.path.dirname(os.path.abspath(path)))
    return validate_recipe(recipe)


def _resume_path(args: argparse.Namespace, notes: List[str]) -> Tuple[Optional[str], Optional[Recipe]]:
    """The checkpoint to resume from (None: a fresh run) and, for a fresh run, its recipe."""
    if args.resume is None:
        return None, _fresh_recipe(args, notes)
    if args.resume == 'auto':
        recipe = _fresh_recipe(args, notes)
        last = os.path.join(recipe.output, LAST_CHECKPOINT)
        return (last, None) if os.path.isfile(last) else (None, recipe)
    if args.recipe:
        raise TcnnError('--recipe cannot be combined with --resume PATH: the run\'s recipe is in the checkpoint; '
                        'override single keys with flags or --set (--resume auto accepts --recipe for the first start)')
    path = args.resume
    if os.path.isdir(path):
        path = os.path.join(path, LAST_CHECKPOINT)
        if not os.path.isfile(path):
            raise TcnnError(f'{args.resume} holds no {LAST_CHECKPOINT}: resume from a tcnn train output folder, or '
                            'pass the checkpoint file itself')
    return path, None


def resolve(args: argparse.Namespace) -> Tuple[Recipe, Optional[Dict[str, Any]], List[str]]:
    """The recipe, the checkpoint to resume (or None) and notes to log."""
    notes: List[str] = []
    path, recipe = _resume_path(args, notes)
    if path is None:
        return recipe, None, notes
    checkpoint = read_checkpoint(path)
    return resumed_recipe(args, checkpoint, path), checkpoint, []
