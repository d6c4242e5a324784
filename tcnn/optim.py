"""Parameter groups, optimiser and schedule of T-CNN fine-tuning (arXiv:2106.05795, section 3).

Groups:
  * ``decay``    every other weight (ndim >= 2): base lr, weight decay;
  * ``no_decay`` norms and biases (ndim <= 1) and the GPSA positional parameters (``pos_centers``,
    ``pos_locality``): base lr, no weight decay;
  * ``gating``   the GPSA gating parameters lambda (``*.gating``): gating lr, no weight decay.

The gating lr is expressed as ``lr_scale = gating_lr / lr`` on a group whose ``lr`` is the base lr. timm schedulers
multiply every group's scheduled value by its ``lr_scale``, so the warm-up, the cosine decay and the floor move both
learning rates together and the ratio (1000 in the paper: 0.1 vs 1e-4) holds at every update.

Late reparameterisation (Table 3) keeps the optimiser: the replaced conv weights leave it, the new GPSA parameters
join as three more groups (``gpsa_decay``, ``gpsa_no_decay``, ``gating``), and the scheduler is rebuilt over all
groups so that it keeps driving them.
"""
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
import torch.nn as nn
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2

from .convert import gpsa_layers
from .gpsa import GPSA

__all__ = ['param_groups', 'create_optimizer', 'create_scheduler',
           'add_gpsa_groups', 'apply_group_settings', 'group_lrs']

DECAY_GROUPS = ('decay', 'gpsa_decay')


def _gpsa_roles(model: nn.Module) -> Dict[str, str]:
    """Group kind of every GPSA parameter by full name, from the roles ``GPSA`` declares for its parameters."""
    roles = {}
    for layer_name, layer in gpsa_layers(model):
        for name, _ in layer.named_parameters():
            role = ('gating' if name in GPSA.gating_params else
                    'no_decay' if name in GPSA.no_weight_decay_params else 'decay')
            roles[f'{layer_name}.{name}' if layer_name else name] = role
    return roles


def _gating_scale(lr: float, gating_lr: float) -> float:
    """The gating group's ``lr_scale``: timm schedulers multiply every group's scheduled lr by it."""
    return gating_lr / lr


def param_groups(
        model: nn.Module,
        weight_decay: float,
        lr_scale_gating: float,
        gpsa_separate: bool = False,
        only_gpsa: bool = False,
) -> List[Dict[str, Any]]:
    """Parameter groups of a CNN or T-CNN (see the module docstring), empty groups left out.

    Args:
        model: The raw model (not DDP-wrapped or compiled).
        weight_decay: Weight decay of the ``decay`` groups.
        lr_scale_gating: ``gating_lr / lr``; stored as the gating group's ``lr_scale``.
        gpsa_separate: Put the GPSA weights in groups of their own after the CNN's (the layout that late
            reparameterisation produces, so that a resumed run rebuilds the same optimiser).
        only_gpsa: Return only the GPSA groups (what late reparameterisation adds).
    """
    no_wd = set(getattr(model, 'no_weight_decay', lambda: set())())
    gpsa_roles = _gpsa_roles(model)
    order = ['decay', 'no_decay', 'gpsa_decay', 'gpsa_no_decay', 'gating']
    buckets: Dict[str, List[torch.Tensor]] = {k: [] for k in order}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        is_gpsa = name in gpsa_roles
        if only_gpsa and not is_gpsa:
            continue
        kind = gpsa_roles.get(name) or ('no_decay' if param.ndim <= 1 or name in no_wd else 'decay')
        if kind != 'gating' and is_gpsa and (gpsa_separate or only_gpsa):
            kind = 'gpsa_' + kind
        buckets[kind].append(param)
    settings = {
        'decay': {'weight_decay': weight_decay}, 'no_decay': {'weight_decay': 0.0},
        'gpsa_decay': {'weight_decay': weight_decay}, 'gpsa_no_decay': {'weight_decay': 0.0},
        'gating': {'weight_decay': 0.0, 'lr_scale': lr_scale_gating},
    }
    return [{'params': buckets[k], 'group_name': k, **settings[k]} for k in order if buckets[k]]


def create_optimizer(model: nn.Module, recipe: Mapping[str, Any], lr: float, gating_lr: float,
                     gpsa_separate: bool = False) -> torch.optim.Optimizer:
    """timm's ``create_optimizer_v2`` over our explicit groups. ``lr``/``gating_lr`` are the batch-scaled peaks."""
    kwargs = {}
    if recipe.get('opt_eps') is not None:
        kwargs['eps'] = recipe['opt_eps']
    if recipe.get('opt_betas') is not None:
        kwargs['betas'] = tuple(recipe['opt_betas'])
    groups = param_groups(model, recipe['weight_decay'], _gating_scale(lr, gating_lr), gpsa_separate=gpsa_separate)
    return create_optimizer_v2(groups, opt=recipe['opt'], lr=lr, weight_decay=recipe['weight_decay'],
                               momentum=recipe['momentum'], **kwargs)


def create_scheduler(optimizer: torch.optim.Optimizer, recipe: Mapping[str, Any], updates_per_epoch: int,
                     warmup_lr: float, min_lr: float):
    """Linear warm-up from ``warmup_lr`` to the peak over ``warmup_epochs``, then the decay (cosine by default) to
    ``min_lr`` over the remaining epochs, stepped per optimiser update (``step_update``).

    The warm-up is a prefix (timm ``warmup_prefix``), so the peak lr (1e-4 in the paper) is reached exactly when the
    warm-up ends. ``warmup_lr``/``min_lr`` are the batch-scaled base-group values; ``lr_scale`` scales them for the
    gating group.
    """
    scheduler, _ = create_scheduler_v2(
        optimizer, sched=recipe['sched'], num_epochs=recipe['epochs'] - recipe['warmup_epochs'],
        warmup_epochs=recipe['warmup_epochs'], warmup_lr=warmup_lr, warmup_prefix=True, min_lr=min_lr,
        step_on_epochs=False, updates_per_epoch=updates_per_epoch)
    return scheduler


def add_gpsa_groups(optimizer: torch.optim.Optimizer, model: nn.Module, removed: Sequence[torch.Tensor],
                    weight_decay: float, lr: float, gating_lr: float) -> None:
    """Late reparameterisation: drop ``removed`` (the replaced conv weights) with their state, and add the GPSA
    parameters of ``model`` as new groups. Rebuild the scheduler afterwards so that it drives the new groups."""
    removed_ids = {id(p) for p in removed}
    for group in optimizer.param_groups:
        group['params'] = [p for p in group['params'] if id(p) not in removed_ids]
    for p in removed:
        optimizer.state.pop(p, None)
    optimizer.param_groups[:] = [g for g in optimizer.param_groups if g['params']]
    reference = optimizer.param_groups[0]
    for group in param_groups(model, weight_decay, _gating_scale(lr, gating_lr), only_gpsa=True):
        # the scheduler sets the lr; start the group from the base groups' initial lr like the others
        group['lr'] = reference['initial_lr'] if 'initial_lr' in reference else reference['lr']
        group['initial_lr'] = group['lr']
        optimizer.add_param_group(group)


def apply_group_settings(optimizer: torch.optim.Optimizer, lr: float, gating_lr: float, weight_decay: float) -> None:
    """Set every group's peak lr (``initial_lr``), weight decay and gating ``lr_scale`` from the recipe (after
    ``load_state_dict`` restored a checkpoint's, which a resumed run may override). Rebuild the scheduler after."""
    for group in optimizer.param_groups:
        group['initial_lr'] = lr
        group['weight_decay'] = weight_decay if group['group_name'] in DECAY_GROUPS else 0.0
        if group['group_name'] == 'gating':
            group['lr_scale'] = _gating_scale(lr, gating_lr)


def group_lrs(optimizer: torch.optim.Optimizer) -> Dict[str, Optional[float]]:
    """Current ``lr`` (of the first non-gating group) and ``gating_lr`` (None without a gating group)."""
    lr = gating = None
    for group in optimizer.param_groups:
        if group.get('group_name') == 'gating':
            gating = group['lr'] if gating is None else gating
        elif lr is None:
            lr = group['lr']
    return {'lr': lr, 'gating_lr': gating}
