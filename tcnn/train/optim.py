"""Parameter groups, optimiser and schedule of T-CNN fine-tuning (arXiv:2106.05795, section 3).

Groups (``param_groups``, also public as ``tcnn.param_groups`` for any training loop):
  * ``decay``    every other weight (ndim >= 2): base lr, weight decay;
  * ``no_decay`` norms and biases (ndim <= 1, the GPSA's ``proj_bias`` too), the names a model's
    ``no_weight_decay()`` lists, and what the GPSA declares decay-free (``GPSA.no_weight_decay()``: ``pos_centers``,
    ``pos_locality``, a per-channel ``v_weight``): base lr, no weight decay;
  * ``gating``   the GPSA gating parameters lambda (``*.gating``, T-CNN eq. 7): gating lr, no weight decay.

Why explicit groups and not a sigmoid temperature. The paper boosts the gates with their own lr (0.1 against 1e-4)
and notes that "one could equivalently decrease the temperature of the sigmoid function": ``sigmoid(T * g)`` with a
stored ``g = lambda / T`` moves lambda by about ``T * lr`` per Adam step, so a plain ``create_optimizer_v2(model,
'adamw')`` would get the boost by construction. That equivalence holds for Adam-like optimisers only (their step
does not depend on the gradient's scale): SGD would move lambda by ``T**2 * lr`` times the gradient, LAMB, LARS and
Adafactor (steps relative to the parameter's norm) not faster at all; gradient clipping by global norm would see the
gates' gradients ``T`` times larger and clip every other parameter harder; Adam's epsilon shrinks by ``T``; and the
stored ``gating`` would change meaning in every T-CNN file. An explicit group is the paper's method in any
optimiser that honours a group's lr, which is all of them; what it needs is that the user's optimiser is built from
these groups (``tcnn.param_groups``; with timm's factory ``param_group_fn``): docs/train.md says what to call.

Two forms of the gating group, because timm's and torch's schedulers read a group's lr differently:
  * default: the group's own ``lr`` is the gating lr. Right without a scheduler and under the torch schedulers that
    scale each group's own lr (``LambdaLR``, ``StepLR``, ``LinearLR``, ...); those that take absolute learning rates
    (``OneCycleLR``'s ``max_lr``, ``CyclicLR``'s, a ``CosineAnnealingLR`` ``eta_min`` above 0) need them per group,
    e.g. ``max_lr=[g['lr'] for g in optimizer.param_groups]`` (docs/train.md); a timm scheduler reaches the same peak
    but starts its warm-up and ends its decay at the absolute ``warmup_lr``/``min_lr`` it applies to every group.
  * ``lr_scale=True`` (what ``tcnn train`` uses): the group also holds ``lr_scale = gating_lr / lr`` and
    ``initial_lr = lr``. timm schedulers multiply their scheduled value of ``initial_lr`` by ``lr_scale``, so the
    warm-up, the cosine decay and the floor move both learning rates together and the ratio (1000 in the paper)
    holds at every update; before any scheduler step the group's own lr is the gating lr. A torch scheduler that
    restarts from ``initial_lr`` (``LambdaLR``) would put the gates at the base lr: use the default form there.

Late reparameterisation (Table 3) keeps the optimiser: the replaced conv weights leave it, the new GPSA parameters
join as three more groups (``gpsa_decay``, ``gpsa_no_decay``, ``gating``), and the scheduler is rebuilt over all
groups so that it keeps driving them.
"""
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn as nn
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2

from ..convert.settings import gpsa_layers
from ..errors import check_module, check_number
from ..layers.gpsa import GPSA
from .recipe import Recipe

__all__ = ['GATING_LR_RATIO', 'param_groups', 'create_optimizer', 'create_scheduler',
           'add_gpsa_groups', 'apply_group_settings', 'group_lrs']

DECAY_GROUPS = ('decay', 'gpsa_decay')
# The paper's gating lr over its base lr: 0.1 / 1e-4 (T-CNN section 3).
GATING_LR_RATIO = 1000.0


def _gpsa_roles(model: nn.Module) -> Dict[str, str]:
    """Group kind of every GPSA parameter by full name, from the roles ``GPSA`` declares for its parameters."""
    roles = {}
    for layer_name, layer in gpsa_layers(model):
        no_decay = layer.no_weight_decay()
        for name, _ in layer.named_parameters():
            role = 'gating' if name in GPSA.gating_params else 'no_decay' if name in no_decay else 'decay'
            roles[f'{layer_name}.{name}' if layer_name else name] = role
    return roles


def _gating_scale(lr: float, gating_lr: float) -> float:
    """The gating group's ``lr_scale``: timm schedulers multiply every group's scheduled lr by it."""
    return gating_lr / lr


def param_groups(
        model: nn.Module,
        lr: float = 1e-4,
        weight_decay: float = 0.05,
        gating_lr: Optional[float] = None,
        *,
        lr_scale: bool = False,
        gpsa_separate: bool = False,
        only_gpsa: bool = False,
) -> List[Dict[str, Any]]:
    """The paper's parameter groups of a CNN or T-CNN, for any optimiser (see the module docstring); empty groups
    are left out. Also timm's ``param_group_fn``: ``create_optimizer_v2(model, 'adamw', lr=lr, weight_decay=wd,
    param_group_fn=functools.partial(tcnn.param_groups, lr=lr, weight_decay=wd))`` with the factory's own values

    Args:
        model: The raw model (not DDP-wrapped or compiled).
        lr: Base learning rate (T-CNN: 1e-4 at batch 1024).
        weight_decay: Weight decay of the ``decay`` groups (DeiT's 0.05).
        gating_lr: Learning rate of the gates; default ``GATING_LR_RATIO * lr`` (the paper's 0.1 for 1e-4).
        lr_scale: Also express the gating lr as timm's ``lr_scale`` on ``initial_lr = lr``, so that a timm scheduler
            keeps the ratio at every update (warm-up start and floor included). Leave it off for torch schedulers.
        gpsa_separate: Put the GPSA weights in groups of their own after the CNN's (the layout that late
            reparameterisation produces, so that a resumed run rebuilds the same optimiser).
        only_gpsa: Return only the GPSA groups (what late reparameterisation adds).

    Returns:
        Dicts with ``params``, ``group_name`` and ``name`` (both the group's name, e.g. ``'gating'``), ``lr``,
        ``weight_decay`` (and ``lr_scale``, ``initial_lr``).
    """
    check_module(model, 'model')
    check_number(lr, 'lr', gt=0)
    check_number(weight_decay, 'weight_decay', ge=0)
    gating_lr = GATING_LR_RATIO * lr if gating_lr is None else check_number(gating_lr, 'gating_lr', gt=0)
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
    gating = {'lr': gating_lr, 'weight_decay': 0.0}
    if lr_scale:
        gating.update(lr_scale=_gating_scale(lr, gating_lr), initial_lr=lr)
    settings = {
        'decay': {'lr': lr, 'weight_decay': weight_decay}, 'no_decay': {'lr': lr, 'weight_decay': 0.0},
        'gpsa_decay': {'lr': lr, 'weight_decay': weight_decay}, 'gpsa_no_decay': {'lr': lr, 'weight_decay': 0.0},
        'gating': gating,
    }
    # 'name' too: what Lightning's LearningRateMonitor (and other loggers) label a group's lr with ('lr-AdamW/gating')
    return [{'params': buckets[k], 'group_name': k, 'name': k, **settings[k]} for k in order if buckets[k]]


def create_optimizer(model: nn.Module, recipe: Recipe, lr: float, gating_lr: float,
                     gpsa_separate: bool = False) -> torch.optim.Optimizer:
    """timm's ``create_optimizer_v2`` over our explicit groups. ``lr``/``gating_lr`` are the batch-scaled peaks."""
    kwargs = {}
    if recipe.opt_eps is not None:
        kwargs['eps'] = recipe.opt_eps
    if recipe.opt_betas is not None:
        kwargs['betas'] = tuple(recipe.opt_betas)
    groups = param_groups(model, lr, recipe.weight_decay, gating_lr, lr_scale=True, gpsa_separate=gpsa_separate)
    return create_optimizer_v2(groups, opt=recipe.opt, lr=lr, weight_decay=recipe.weight_decay,
                               momentum=recipe.momentum, **kwargs)


def create_scheduler(optimizer: torch.optim.Optimizer, recipe: Recipe, updates_per_epoch: int,
                     warmup_lr: float, min_lr: float):
    """Linear warm-up from ``warmup_lr`` to the peak over ``warmup_epochs``, then the decay (cosine by default) to
    ``min_lr`` over the remaining epochs, stepped per optimiser update (``step_update``).

    The warm-up is a prefix (timm ``warmup_prefix``), so the peak lr (1e-4 in the paper) is reached exactly when the
    warm-up ends. ``warmup_lr``/``min_lr`` are the batch-scaled base-group values; ``lr_scale`` scales them for the
    gating group.
    """
    scheduler, _ = create_scheduler_v2(
        optimizer, sched=recipe.sched, num_epochs=recipe.epochs - recipe.warmup_epochs,
        warmup_epochs=recipe.warmup_epochs, warmup_lr=warmup_lr, warmup_prefix=True, min_lr=min_lr,
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
    for group in param_groups(model, lr, weight_decay, gating_lr, lr_scale=True, only_gpsa=True):
        # the scheduler sets the lr; start the group from the base groups' initial lr like the others
        group['lr'] = reference['initial_lr'] if 'initial_lr' in reference else reference['lr']
        group['initial_lr'] = group['lr']
        optimizer.add_param_group(group)


def apply_group_settings(optimizer: torch.optim.Optimizer, lr: float, gating_lr: float, weight_decay: float) -> None:
    """Set every group's peak lr (``initial_lr``), weight decay and gating ``lr_scale`` from the recipe (after
    ``load_state_dict`` restored a checkpoint's, which a resumed run may override). Rebuild the scheduler after."""
    for group in optimizer.param_groups:
        group.setdefault('name', group['group_name'])  # a checkpoint of tcnn 0.5.1 or earlier has no 'name'
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
