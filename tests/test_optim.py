"""The paper's optimiser settings outside ``tcnn train`` (issue 25): ``tcnn.param_groups`` in a plain torch loop, with
timm's ``create_optimizer_v2(..., param_group_fn=...)``, with torch and timm schedulers; which parameters take weight
decay (``tcnn.param_groups``, the ``t_*`` models' ``no_weight_decay()`` for timm's factory, the GPSA's roles)."""
import functools
import math
import textwrap
from pathlib import Path

import pytest
import timm
import torch
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2

import tcnn
from tcnn.train.optim import GATING_LR_RATIO, group_lrs

from nontrivial import nontrivial

pytestmark = pytest.mark.usefixtures('one_thread')  # small models on a shared 2-core machine (conftest.py)

LR, GATING_LR, WD = 1e-4, 0.1, 0.05  # T-CNN (arXiv:2106.05795) section 3


def _t_resnet():
    torch.manual_seed(0)
    return nontrivial(timm.create_model('t_resnet18d', num_classes=3))  # every block reaches the logits


@pytest.fixture(scope='module')
def t_resnet():
    return _t_resnet()


def _names(model, group):
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)] for p in group['params']}


def _by_name(groups):
    return {g['group_name']: g for g in groups}


def _gating_names(model):
    return {n for n, _ in model.named_parameters() if n.endswith('.gating')}


def _one_adam_step(model, optimizer, seed=0):
    """One AdamW step on a random batch; returns each parameter's change, element by element (the gradients stay in
    ``.grad``)."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.manual_seed(seed)
    model.train()
    loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 3, 64, 64)), torch.tensor([0, 1, 2, 0]))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {n: (p.detach() - before[n]).abs() for n, p in model.named_parameters()}


# ------------------------------------------------------------------------------------------------ gating lr

def test_param_groups_give_the_gates_their_lr_in_a_plain_torch_loop():
    model = _t_resnet()
    groups = tcnn.param_groups(model, lr=LR, weight_decay=WD)  # gating lr: the paper's 1000x by default
    by_name = _by_name(groups)
    assert GATING_LR_RATIO == 1000
    assert _names(model, by_name['gating']) == _gating_names(model) and len(_gating_names(model)) == 4
    assert math.isclose(by_name['gating']['lr'], GATING_LR) and by_name['gating']['weight_decay'] == 0
    assert all(g['lr'] == LR for g in groups if g['group_name'] != 'gating')
    assert sum(len(g['params']) for g in groups) == len(list(model.parameters()))

    # no scheduler: Adam's first step moves every parameter by about its group's lr
    optimizer = torch.optim.AdamW(groups, lr=LR)
    moved = _one_adam_step(model, optimizer)
    # Adam's first step is lr * |g| / (|g| + eps) per element: the group's lr wherever |g| >> eps (no weight decay on
    # the gates)
    params = dict(model.named_parameters())
    gates = torch.cat([moved[n] for n in _gating_names(model)])
    grads = torch.cat([params[n].grad.abs() for n in _gating_names(model)])
    assert (grads > 0).all()
    torch.testing.assert_close(gates, GATING_LR * grads / (grads + optimizer.defaults['eps']), rtol=1e-5, atol=0)
    assert max(m.max().item() for n, m in moved.items() if n not in _gating_names(model)) <= LR * 1.1  # + lr*wd*|w|


def test_timm_create_optimizer_v2_with_param_group_fn(t_resnet):
    """What a timm user writes: the groups come from ``param_group_fn``, the factory's lr is the base lr."""
    fn = functools.partial(tcnn.param_groups, lr=3e-4, weight_decay=WD)
    optimizer = create_optimizer_v2(t_resnet, 'adamw', lr=3e-4, weight_decay=WD, param_group_fn=fn)
    lrs = group_lrs(optimizer)
    assert math.isclose(lrs['lr'], 3e-4) and math.isclose(lrs['gating_lr'], 0.3)  # the ratio follows the base lr
    assert _names(t_resnet, _by_name(optimizer.param_groups)['gating']) == _gating_names(t_resnet)
    # a gating lr of one's own
    fn = functools.partial(tcnn.param_groups, lr=LR, weight_decay=WD, gating_lr=0.05)
    optimizer = create_optimizer_v2(t_resnet, 'adamw', lr=LR, weight_decay=WD, param_group_fn=fn)
    assert math.isclose(group_lrs(optimizer)['gating_lr'], 0.05)


def test_torch_scheduler_keeps_the_ratio_at_every_step(t_resnet):
    """A torch ``LambdaLR`` warm-up + cosine (the form of transformers' and many Lightning schedules) scales each
    group's own lr: the gates stay at 1000x the base lr throughout."""
    optimizer = torch.optim.AdamW(tcnn.param_groups(t_resnet, lr=LR, weight_decay=WD))
    warmup, total = 5, 20

    def factor(step):
        return (step + 1) / warmup if step < warmup else 0.5 * (1 + math.cos(math.pi * (step - warmup) / total))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    for step in range(warmup + total):
        lrs = group_lrs(optimizer)
        assert math.isclose(lrs['gating_lr'], 1000 * lrs['lr'], rel_tol=1e-9), step
        assert math.isclose(lrs['lr'], LR * factor(step), rel_tol=1e-9)
        optimizer.step()
        scheduler.step()


ABSOLUTE_LR_SCHEDULERS = ['OneCycleLR', 'CyclicLR', 'ReduceLROnPlateau', 'LambdaLR']


def _docs_scheduler_lines():
    """docs/train.md's one-liners for torch schedulers that take absolute lrs: the block's set-up lines and one
    ``scheduler = ...`` line per scheduler."""
    text = (Path(__file__).parents[1] / 'docs' / 'train.md').read_text()
    start = text.index('```python', text.index('Give them one value per group'))
    block = textwrap.dedent(text[start:text.index('```', start + 3)].split('\n', 1)[1])
    lines = [line for line in block.splitlines() if line.strip()]
    setup = [line for line in lines if not line.startswith('scheduler =')]
    return setup, {name: line for line in lines if line.startswith('scheduler =')
                   for name in ABSOLUTE_LR_SCHEDULERS if f'.{name}(' in line}


def _step(scheduler, step):
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        scheduler.step(1.0)  # a metric that never improves: a reduction every patience + 1 steps
    else:
        scheduler.step()


@pytest.mark.parametrize('name', ABSOLUTE_LR_SCHEDULERS)
def test_docs_one_liners_keep_the_ratio_under_absolute_lr_schedulers(t_resnet, name):
    """OneCycleLR(max_lr=float) and CyclicLR put every group, the gates too, at one absolute lr (ratio 1.0 after the
    first step). docs/train.md's one-liners give them per-group values: 1000x at every step. Fails if a one-liner is
    dropped from the docs or loses the per-group values."""
    setup, lines = _docs_scheduler_lines()
    assert name in lines, f'docs/train.md lost its {name} one-liner'
    optimizer = torch.optim.AdamW(tcnn.param_groups(t_resnet, lr=LR, weight_decay=WD))
    env = {'torch': torch, 'math': math, 'optimizer': optimizer, 'total_steps': 40}
    exec('\n'.join(setup + [lines[name]]), env)
    scheduler, seen = env['scheduler'], set()
    for step in range(40):
        optimizer.step()
        _step(scheduler, step)
        lrs = group_lrs(optimizer)
        seen.add(round(lrs['lr'], 15))
        assert math.isclose(lrs['gating_lr'], 1000 * lrs['lr'], rel_tol=1e-9), (step, lrs)
    assert len(seen) > 2  # the schedule moved the lrs


@pytest.mark.parametrize('make', [
    lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=40),
    lambda opt: torch.optim.lr_scheduler.CyclicLR(opt, base_lr=1e-5, max_lr=1e-4),
], ids=['OneCycleLR', 'CyclicLR'])
def test_absolute_lr_schedulers_with_one_number_lose_the_ratio(t_resnet, make):
    """Why the one-liners: given one number, these schedulers put the gates at the base lr (torch's behaviour; if a
    torch release changes it, docs/train.md's warning can go)."""
    optimizer = torch.optim.AdamW(tcnn.param_groups(t_resnet, lr=LR, weight_decay=WD))
    scheduler = make(optimizer)
    optimizer.step()
    scheduler.step()
    lrs = group_lrs(optimizer)
    assert lrs['gating_lr'] == lrs['lr']


def test_group_names_in_torch_and_timm_optimizers_and_their_checkpoints(t_resnet, tmp_path):
    """Each group's ``name`` (what Lightning's LearningRateMonitor logs) is kept by torch's and timm's optimisers,
    saved in their state dicts, read back with weights_only=True and restored by load_state_dict."""
    names = ['decay', 'no_decay', 'gating']
    for opt in ('adamw', 'sgd', 'lamb', 'lion'):
        fn = functools.partial(tcnn.param_groups, lr=LR, weight_decay=WD)
        optimizer = create_optimizer_v2(t_resnet, opt, lr=LR, weight_decay=WD, param_group_fn=fn)
        assert [g['name'] for g in optimizer.param_groups] == names, opt
        _one_adam_step(t_resnet, optimizer)  # steps with the extra key
        torch.save(optimizer.state_dict(), tmp_path / 'opt.pt')
        fresh = create_optimizer_v2(t_resnet, opt, lr=LR, weight_decay=WD, param_group_fn=fn)
        for group in fresh.param_groups:
            del group['name']  # a resumed run takes the names from the checkpoint
        fresh.load_state_dict(torch.load(tmp_path / 'opt.pt', weights_only=True))
        assert [g['name'] for g in fresh.param_groups] == names, opt
        assert [g['lr'] for g in fresh.param_groups] == [g['lr'] for g in optimizer.param_groups]
        _one_adam_step(t_resnet, fresh)
    late = tcnn.param_groups(t_resnet, lr=LR, weight_decay=WD, gpsa_separate=True)
    assert [g['name'] for g in late] == ['decay', 'no_decay', 'gpsa_decay', 'gpsa_no_decay', 'gating']
    assert all(g['name'] == g['group_name'] for g in late)


def _timm_trace(optimizer, updates):
    scheduler, _ = create_scheduler_v2(optimizer, sched='cosine', num_epochs=4, warmup_epochs=1, warmup_lr=1e-6,
                                       min_lr=1e-6, warmup_prefix=True, step_on_epochs=False,
                                       updates_per_epoch=updates)
    trace = []
    for step in range(5 * updates + 1):
        scheduler.step_update(step)
        trace.append(group_lrs(optimizer))
    return trace


def test_timm_scheduler_peak_and_exact_ratio_with_lr_scale(t_resnet):
    # default groups (each its own lr): a timm scheduler reaches both peaks and starts/ends every group at its
    # absolute warmup_lr/min_lr, as timm does for any group with an lr of its own
    trace = _timm_trace(torch.optim.AdamW(tcnn.param_groups(t_resnet, lr=LR, weight_decay=WD)), updates=4)
    peak = trace[4]
    assert math.isclose(peak['lr'], LR) and math.isclose(peak['gating_lr'], GATING_LR)
    # lr_scale=True: timm's convention, the ratio holds at every update, warm-up start and floor included; the
    # group's own lr is right before any scheduler too
    groups = tcnn.param_groups(t_resnet, lr=LR, weight_decay=WD, lr_scale=True)
    assert math.isclose(_by_name(groups)['gating']['lr'], GATING_LR)
    assert math.isclose(_by_name(groups)['gating']['lr_scale'], 1000)
    trace = _timm_trace(torch.optim.AdamW(groups), updates=4)
    assert all(math.isclose(t['gating_lr'], 1000 * t['lr'], rel_tol=1e-9) for t in trace)
    assert math.isclose(trace[0]['lr'], 1e-6) and math.isclose(trace[4]['lr'], LR)
    assert math.isclose(trace[-1]['lr'], 1e-6)


def test_param_groups_of_a_plain_cnn_and_bad_arguments():
    cnn = timm.create_model('resnet18d', num_classes=3)
    assert [g['group_name'] for g in tcnn.param_groups(cnn)] == ['decay', 'no_decay']
    with pytest.raises(tcnn.TcnnError, match='lr must be > 0'):
        tcnn.param_groups(cnn, lr=0)
    with pytest.raises(tcnn.TcnnError, match='weight_decay must be >= 0'):
        tcnn.param_groups(cnn, weight_decay=-1)


# ------------------------------------------------------------------------------------------------ weight decay

def _decayed(model, groups):
    return {n for g in groups if g['weight_decay'] > 0 for n in _names(model, g)}


def _timm_decayed(model):
    optimizer = create_optimizer_v2(model, 'adamw', lr=LR, weight_decay=WD)
    return {n for g in optimizer.param_groups if g['weight_decay'] > 0 for n in _names(model, g)}


def test_no_decay_on_biases_and_per_channel_value_gains():
    """convnext_atto's depthwise ``stages.3.blocks.0.conv_dw`` has a bias the CNN did not decay: the GPSA's
    ``proj_bias`` is not decayed either; its per-channel value gain ``v_weight`` (C, 1) is norm-like: not decayed."""
    cnn = timm.create_model('convnext_atto', num_classes=3)
    t_cnn = timm.create_model('t_convnext_atto', num_classes=3)
    layer = 'stages.3.blocks.0.conv_dw'
    decayed = _decayed(t_cnn, tcnn.param_groups(t_cnn))
    assert f'{layer}.bias' not in _decayed(cnn, tcnn.param_groups(cnn))
    assert f'{layer}.proj_bias' not in decayed and f'{layer}.v_weight' not in decayed
    assert t_cnn.get_submodule(layer).v_weight.shape == (320, 1)
    assert {f'{layer}.{p}' for p in ('q_weight', 'k_weight', 'proj_weight')} <= decayed
    # timm's own factory agrees through the t_* model's no_weight_decay()
    assert _timm_decayed(t_cnn) == decayed
    # the layer declares its roles
    assert t_cnn.get_submodule(layer).no_weight_decay() == {'pos_centers', 'pos_locality', 'gating', 'proj_bias',
                                                             'v_weight'}


def test_dense_value_matrix_is_decayed_like_the_papers_linear(t_resnet):
    """A dense ``W_val`` is the C x C ``nn.Linear`` of ConViT/T-CNN's code, decayed by timm's factory there."""
    decayed = _decayed(t_resnet, tcnn.param_groups(t_resnet))
    layer = t_resnet.get_submodule('layer4.0.conv1')
    assert layer.no_weight_decay() == {'pos_centers', 'pos_locality', 'gating'}  # no bias, dense W_val
    assert 'layer4.0.conv1.v_weight' in decayed and 'layer4.0.conv1.pos_centers' not in decayed
    assert _timm_decayed(t_resnet) == decayed


# ---------------------------------------------------------------- what tcnn train builds (issue 47, mutants)
# tcnn.train's optimiser, schedule and late-reparameterisation groups, checked against hand-computed values.

def _tiny_t_cnn() -> torch.nn.Module:
    """A conv, a BN and one GPSA layer: every group kind, in a model that builds in milliseconds."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                               tcnn.GPSA.from_conv(torch.nn.Conv2d(8, 8, 3, padding=1)))


def test_create_optimizer_follows_the_recipe():
    from tcnn.train.optim import create_optimizer
    from tcnn.train.recipe import Recipe
    model = _tiny_t_cnn()
    recipe = Recipe(opt='adamw', opt_eps=1e-7, opt_betas=[0.8, 0.95], weight_decay=0.03)
    opt = create_optimizer(model, recipe, 2e-4, 0.3)
    assert type(opt) is torch.optim.AdamW
    groups = _by_name(opt.param_groups)
    assert [g['name'] for g in opt.param_groups] == ['decay', 'no_decay', 'gating']
    assert _names(model, groups['decay']) == {'0.weight', '2.q_weight', '2.k_weight', '2.v_weight', '2.proj_weight'}
    assert _names(model, groups['gating']) == {'2.gating'}
    for name, (lr, wd) in {'decay': (2e-4, 0.03), 'no_decay': (2e-4, 0.0), 'gating': (0.3, 0.0)}.items():
        g = groups[name]
        assert (g['lr'], g['weight_decay'], g['eps'], g['betas']) == (lr, wd, 1e-7, (0.8, 0.95)), name
    assert math.isclose(groups['gating']['lr_scale'], 1500) and groups['gating']['initial_lr'] == 2e-4
    # the defaults of a group added later without its own (e.g. by a callback) are the run's
    assert (opt.defaults['lr'], opt.defaults['weight_decay']) == (2e-4, 0.03)
    separate = create_optimizer(model, recipe, 2e-4, 0.3, gpsa_separate=True)
    assert [g['name'] for g in separate.param_groups] == ['decay', 'no_decay', 'gpsa_decay', 'gpsa_no_decay',
                                                          'gating']
    assert _names(model, _by_name(separate.param_groups)['decay']) == {'0.weight'}
    plain = create_optimizer(model, Recipe(opt_eps=None, opt_betas=None), 1e-4, 0.1).param_groups[0]
    assert (plain['eps'], plain['betas']) == (1e-8, (0.9, 0.999))  # AdamW's own defaults
    sgd = create_optimizer(model, Recipe(opt='sgd', momentum=0.7, opt_eps=None), 1e-4, 0.1)
    assert type(sgd) is torch.optim.SGD and sgd.param_groups[0]['momentum'] == 0.7


@pytest.mark.parametrize('sched', ['cosine', 'poly'])
def test_create_scheduler_warm_up_then_decay_per_update(sched):
    """Linear warm-up from warmup_lr over warmup_epochs, the peak when it ends, then the recipe's decay over the
    remaining updates t < T: cosine ``min_lr + (peak - min_lr) (1 + cos(pi t / T)) / 2`` (T-CNN section 3) or timm's
    poly ``min_lr + (peak - min_lr) (1 - t / T) ** 0.1``; the gates at lr_scale times it."""
    from tcnn.train.optim import create_optimizer, create_scheduler
    from tcnn.train.recipe import Recipe
    recipe = Recipe(epochs=5, warmup_epochs=1, sched=sched)
    opt = create_optimizer(_tiny_t_cnn(), recipe, 1e-3, 0.5)
    scheduler = create_scheduler(opt, recipe, 4, warmup_lr=3e-6, min_lr=2e-5)
    peak, low, total = 1e-3, 2e-5, 16  # 4 epochs of 4 updates after the warm-up
    decay = {'cosine': lambda t: (1 + math.cos(math.pi * t / total)) / 2, 'poly': lambda t: (1 - t / total) ** 0.1}
    expected = [3e-6 + (peak - 3e-6) * u / 4 for u in range(4)]
    expected += [low + (peak - low) * decay[sched](t) for t in range(total)]
    for update, lr in enumerate(expected):
        scheduler.step_update(update)
        lrs = group_lrs(opt)
        assert math.isclose(lrs['lr'], lr, rel_tol=1e-9), update
        assert math.isclose(lrs['gating_lr'], 500 * lr, rel_tol=1e-9), update


def test_late_reparameterisation_adds_the_gpsa_groups_to_the_optimiser():
    """``add_gpsa_groups``: the replaced conv weights leave the optimiser with their state, no group is left empty,
    and the GPSA parameters join in three groups at the base groups' initial lr (the scheduler sets it), gates at
    lr_scale = gating_lr / lr, weight decay on the decay group only."""
    from tcnn.train.optim import add_gpsa_groups, create_optimizer
    from tcnn.train.recipe import Recipe
    torch.manual_seed(0)
    nn = torch.nn
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3, padding=1, bias=False),
                        nn.Flatten(), nn.Linear(8, 2))
    opt = create_optimizer(cnn, Recipe(weight_decay=0.03), 2e-4, 0.3)
    cnn(torch.randn(2, 3, 1, 1)).sum().backward()
    opt.step()
    removed = [cnn[2].weight]
    assert cnn[2].weight in opt.state
    tcnn.reparameterize_(cnn, stages='2', verify=False)
    add_gpsa_groups(opt, cnn, removed, weight_decay=0.03, lr=2e-4, gating_lr=0.3)
    held = [p for g in opt.param_groups for p in g['params']]
    assert not any(p is removed[0] for p in held) and removed[0] not in opt.state
    assert all(g['params'] for g in opt.param_groups)
    assert len(held) == len({id(p) for p in held}) == len(list(cnn.parameters()))
    groups = {g['name']: g for g in opt.param_groups}
    assert [g['name'] for g in opt.param_groups] == ['decay', 'no_decay', 'gpsa_decay', 'gpsa_no_decay', 'gating']
    assert _names(cnn, groups['gpsa_decay']) == {'2.q_weight', '2.k_weight', '2.v_weight', '2.proj_weight'}
    assert _names(cnn, groups['gpsa_no_decay']) == {'2.pos_centers', '2.pos_locality'}
    for name in ('gpsa_decay', 'gpsa_no_decay', 'gating'):
        assert groups[name]['lr'] == groups[name]['initial_lr'] == 2e-4, name
    assert [groups[n]['weight_decay'] for n in ('gpsa_decay', 'gpsa_no_decay', 'gating')] == [0.03, 0.0, 0.0]
    assert math.isclose(groups['gating']['lr_scale'], 1500)
    # a scheduler mid-warm-up: the new groups start at the base groups' initial lr, not at its current lr
    opt = torch.optim.AdamW([{'params': [cnn[0].weight], 'group_name': 'decay', 'lr': 5e-6, 'initial_lr': 5e-4},
                             {'params': [torch.nn.Parameter(torch.zeros(1))], 'group_name': 'no_decay', 'lr': 1.0}])
    add_gpsa_groups(opt, cnn, [opt.param_groups[1]['params'][0]], weight_decay=0.03, lr=2e-4, gating_lr=0.3)
    assert [g['lr'] for g in opt.param_groups] == [5e-6, 5e-4, 5e-4, 5e-4]  # the emptied group is gone
    # without an initial_lr (no scheduler has run), at the base group's lr; a removed weight without state is fine
    opt = torch.optim.AdamW([{'params': [cnn[0].weight], 'group_name': 'decay', 'lr': 5e-4}])
    add_gpsa_groups(opt, cnn, [torch.nn.Parameter(torch.zeros(1))], weight_decay=0.03, lr=2e-4, gating_lr=0.3)
    assert [g['lr'] for g in opt.param_groups] == [5e-4] * 4


def test_apply_group_settings_renews_the_groups_after_a_resume():
    from tcnn.train.optim import apply_group_settings
    groups = tcnn.param_groups(_tiny_t_cnn(), lr=1e-4, weight_decay=0.05, lr_scale=True, gpsa_separate=True)
    opt = torch.optim.AdamW(groups)
    del opt.param_groups[0]['name']  # a checkpoint of tcnn 0.5.1 or earlier
    apply_group_settings(opt, lr=3e-4, gating_lr=0.6, weight_decay=0.02)
    for g in opt.param_groups:
        assert g['name'] == g['group_name'] and g['initial_lr'] == 3e-4
        assert g['weight_decay'] == (0.02 if g['group_name'] in ('decay', 'gpsa_decay') else 0.0), g['name']
    assert math.isclose(_by_name(opt.param_groups)['gating']['lr_scale'], 2000)


def test_group_lrs_reads_the_first_base_and_gating_groups():
    p = [torch.nn.Parameter(torch.zeros(1)) for _ in range(4)]
    opt = torch.optim.SGD([{'params': [p[0]], 'group_name': 'gating', 'lr': 0.5},
                           {'params': [p[1]], 'group_name': 'decay', 'lr': 0.1},
                           {'params': [p[2]], 'group_name': 'no_decay', 'lr': 0.2},
                           {'params': [p[3]], 'group_name': 'gating', 'lr': 0.7}])
    assert group_lrs(opt) == {'lr': 0.1, 'gating_lr': 0.5}
    assert group_lrs(torch.optim.SGD([p[1]], lr=0.3)) == {'lr': 0.3, 'gating_lr': None}


def test_param_groups_keep_the_papers_defaults_and_each_parameters_role():
    """The paper's defaults (lr 1e-4, weight decay 0.05, gates at 1000 x lr), the messages of bad arguments, a model's
    own ``no_weight_decay()`` names, frozen parameters left out (the others all kept), a bare GPSA layer's roles, and
    ``only_gpsa`` (what late reparameterisation adds)."""
    model = _tiny_t_cnn()
    groups = _by_name(tcnn.param_groups(model))
    assert [(g['lr'], g['weight_decay']) for g in groups.values()] == [(1e-4, 0.05), (1e-4, 0.0), (0.1, 0.0)]
    for bad, message in ((dict(model=None), 'model must be a torch.nn.Module, got None'),
                         (dict(gating_lr=0), 'gating_lr must be > 0'), (dict(gating_lr=-1.0), 'gating_lr must be > 0')):
        with pytest.raises(tcnn.TcnnError, match=message):
            tcnn.param_groups(**{'model': model, **bad})
    model.no_weight_decay = lambda: {'0.weight'}  # a 4-D weight the model exempts (timm's contract)
    model[0].bias.requires_grad_(False)
    model[1].weight.requires_grad_(False)
    groups = _by_name(tcnn.param_groups(model))
    assert _names(model, groups['decay']) == {'2.q_weight', '2.k_weight', '2.v_weight', '2.proj_weight'}
    assert _names(model, groups['no_decay']) == {'0.weight', '1.bias', '2.proj_bias', '2.pos_centers',
                                                 '2.pos_locality'}
    layer = model[2]
    bare = _by_name(tcnn.param_groups(layer))
    assert _names(layer, bare['gating']) == {'gating'}
    assert _names(layer, bare['no_decay']) == {'proj_bias', 'pos_centers', 'pos_locality'}
    separate = {g['name']: (g['lr'], g['weight_decay']) for g in tcnn.param_groups(model, lr=2e-4, weight_decay=0.03,
                                                                                   gpsa_separate=True)}
    # the groups' own values (no optimiser default fills them in); the conv weight is exempt: no 'decay' group
    assert separate == {'no_decay': (2e-4, 0.0), 'gpsa_decay': (2e-4, 0.03), 'gpsa_no_decay': (2e-4, 0.0),
                        'gating': (0.2, 0.0)}
    only = tcnn.param_groups(model, only_gpsa=True)
    assert [g['name'] for g in only] == ['gpsa_decay', 'gpsa_no_decay', 'gating']
    assert set().union(*(_names(model, g) for g in only)) == {f'2.{n}' for n, _ in layer.named_parameters()}
