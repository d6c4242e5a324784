"""``python -m tcnn.timm_script``: timm's own scripts (train.py, validate.py, ...) run on T-CNNs.

timm's scripts are not in its pip package (and are not copied here), so the tests drive the runner with small scripts
that use timm's real APIs the way train.py does: ``create_model`` by name (``t_*`` and ``local-dir:``), train.py's lr
scaling, ``create_optimizer_v2(model, **optimizer_kwargs(cfg=args))`` and a timm scheduler stepped per update.
"""
import argparse
import json
import os
import subprocess
import sys
import textwrap

import pytest
import timm

import tcnn.models  # noqa: F401 - t_* names, for the folder this test writes
from tcnn.train.recipe import find_recipe, resolve_recipe
from tcnn.timm_script import main, recipe_flags

TRAIN_LIKE = textwrap.dedent('''
    """What timm's train.py does to build its model, optimizer and scheduler (same calls, same order)."""
    import argparse, json
    from timm.models import create_model
    from timm.optim import create_optimizer_v2, optimizer_kwargs
    from timm.scheduler import create_scheduler_v2, scheduler_kwargs

    parser = argparse.ArgumentParser()
    parser.add_argument('--model', default='resnet50')
    parser.add_argument('--pretrained', action='store_true')
    parser.add_argument('--num-classes', type=int, default=None)
    parser.add_argument('-b', '--batch-size', type=int, default=128)
    parser.add_argument('--opt', default='sgd')
    parser.add_argument('--momentum', type=float, default=0.9)
    parser.add_argument('--weight-decay', type=float, default=2e-5)
    parser.add_argument('--lr', type=float, default=None)
    parser.add_argument('--lr-base', type=float, default=0.1)
    parser.add_argument('--lr-base-size', type=int, default=256)
    parser.add_argument('--lr-base-scale', default='')
    parser.add_argument('--sched', default='cosine')
    parser.add_argument('--epochs', type=int, default=300)
    parser.add_argument('--warmup-epochs', type=int, default=5)
    parser.add_argument('--warmup-lr', type=float, default=1e-5)
    parser.add_argument('--min-lr', type=float, default=0)
    parser.add_argument('--out', required=True)
    args = parser.parse_args()
    model = create_model(args.model, pretrained=args.pretrained, num_classes=args.num_classes)
    if not args.lr:  # train.py's batch rule
        batch_ratio = args.batch_size / args.lr_base_size
        if not args.lr_base_scale:
            args.lr_base_scale = 'sqrt' if any(o in args.opt.lower() for o in ('ada', 'lamb')) else 'linear'
        if args.lr_base_scale == 'sqrt':
            batch_ratio = batch_ratio ** 0.5
        args.lr = args.lr_base * batch_ratio
    optimizer = create_optimizer_v2(model, **optimizer_kwargs(cfg=args))
    scheduler, _ = create_scheduler_v2(optimizer, **scheduler_kwargs(args), updates_per_epoch=4)
    history = []
    for update in range(8):  # warm-up and decay, stepped per update as train.py --sched-on-updates does
        scheduler.step_update(update)
        history.append({g.get('group_name', str(i)): g['lr'] for i, g in enumerate(optimizer.param_groups)})
    groups = [{k: g.get(k) for k in ('group_name', 'lr', 'weight_decay', 'lr_scale')} for g in optimizer.param_groups]
    with open(args.out, 'w') as f:
        json.dump({'lr': args.lr, 'weight_decay': args.weight_decay, 'groups': groups, 'history': history}, f)
''')


@pytest.fixture(scope='module')
def train_like(tmp_path_factory):
    path = tmp_path_factory.mktemp('scripts') / 'train_like.py'
    path.write_text(TRAIN_LIKE)
    return str(path)


def _check_gating(result, lr, weight_decay):
    groups = {g['group_name']: g for g in result['groups']}
    assert result['lr'] == pytest.approx(lr)
    assert groups['decay']['weight_decay'] == pytest.approx(weight_decay)
    assert groups['gating']['weight_decay'] == 0 and groups['no_decay']['weight_decay'] == 0
    assert groups['gating']['lr_scale'] == pytest.approx(1000)
    for step in result['history']:  # the paper's 1000:1 at every update, warm-up included
        assert step['gating'] == pytest.approx(1000 * step['decay'], rel=1e-9) and step['decay'] > 0


def test_train_py_like_script_gets_the_gating_lr_from_its_own_scaled_lr(train_like, tmp_path):
    """``python -m tcnn.timm_script SCRIPT ...`` as a user types it (a subprocess): the t_* name resolves, and the
    optimizer's gating group runs at 1000 x the lr that the script computed from --lr-base and its batch (never a
    value of tcnn's), with the script's --weight-decay."""
    out = tmp_path / 'result.json'
    env = dict(os.environ, HF_HUB_OFFLINE='1')
    proc = subprocess.run(
        [sys.executable, '-m', 'tcnn.timm_script', train_like, '--model', 't_resnet18d', '--num-classes', '3',
         '--opt', 'adamw', '--lr-base', '4e-4', '--lr-base-size', '1024', '--lr-base-scale', 'linear', '-b', '64',
         '--weight-decay', '0.07', '--warmup-epochs', '1', '--epochs', '2', '--out', str(out)],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    _check_gating(result, 4e-4 * 64 / 1024, 0.07)
    assert 'lr 2.5e-05, gating lr 0.025 (1000 x lr), weight decay 0.07' in proc.stdout


def test_hub_folder_by_local_dir_name_and_explicit_lr(train_like, tmp_path):
    """A T-CNN Hub folder (``local-dir:PATH``, as validate.py/train.py take it) builds in the script; an explicit
    --lr is used as given. Without the runner the same script does not know the folder's architecture."""
    folder = tmp_path / 'hub'
    model = timm.create_model('t_resnet18d', num_classes=3)
    timm.models.save_for_hf(model, str(folder))
    out = tmp_path / 'result.json'
    args = ['--model', f'local-dir:{folder}', '--pretrained', '--opt', 'sgd', '--lr', '0.02', '--weight-decay',
            '1e-4', '--warmup-epochs', '1', '--epochs', '2', '--out', str(out)]
    assert main([train_like, *args]) == 0
    _check_gating(json.loads(out.read_text()), 0.02, 1e-4)
    proc = subprocess.run([sys.executable, train_like, *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, HF_HUB_OFFLINE='1'))
    assert proc.returncode != 0 and 't_resnet18d' in proc.stderr  # the failure the runner exists for


def _train_py_parser() -> argparse.ArgumentParser:
    """The train.py flags that recipes set, with train.py's names, types and nargs (timm's train.py)."""
    p = argparse.ArgumentParser()
    for flags, kwargs in (
            (('--model',), {}), (('--pretrained',), dict(action='store_true')), (('--img-size',), dict(type=int)),
            (('--drop-path',), dict(type=float)), (('-b', '--batch-size'), dict(type=int)),
            (('--grad-accum-steps',), dict(type=int)), (('--opt',), {}), (('--opt-eps',), dict(type=float)),
            (('--opt-betas',), dict(type=float, nargs='+')), (('--momentum',), dict(type=float)),
            (('--weight-decay',), dict(type=float)), (('--lr',), dict(type=float)), (('--lr-base',), dict(type=float)),
            (('--lr-base-size',), dict(type=int)), (('--lr-base-scale',), {}), (('--sched',), {}),
            (('--sched-on-updates',), dict(action='store_true')), (('--epochs',), dict(type=int)),
            (('--warmup-epochs',), dict(type=int)), (('--warmup-prefix',), dict(action='store_true')),
            (('--warmup-lr',), dict(type=float)), (('--min-lr',), dict(type=float)),
            (('--clip-grad',), dict(type=float)), (('--aa',), {}), (('--color-jitter',), dict(type=float)),
            (('--scale',), dict(type=float, nargs='+')), (('--reprob',), dict(type=float)), (('--remode',), {}),
            (('--recount',), dict(type=int)), (('--mixup',), dict(type=float)), (('--cutmix',), dict(type=float)),
            (('--mixup-prob',), dict(type=float)), (('--mixup-switch-prob',), dict(type=float)),
            (('--mixup-mode',), {}), (('--smoothing',), dict(type=float)), (('--train-interpolation',), {}),
            (('--crop-pct',), dict(type=float)), (('--num-classes',), dict(type=int)), (('--seed',), dict(type=int)),
            (('-j', '--workers'), dict(type=int)), (('--data-dir',), {}), (('--train-split',), {}),
            (('--val-split',), {}), (('--model-ema',), dict(action='store_true')),
            (('--model-ema-decay',), dict(type=float)), (('--model-kwargs',), dict(nargs='*'))):
        p.add_argument(*flags, **kwargs)
    return p


def test_recipe_expands_to_train_py_flags_with_the_recipes_values():
    recipe = resolve_recipe(find_recipe('t_resnet50_rs'))
    args = _train_py_parser().parse_args(recipe_flags(recipe))
    assert args.model == 't_resnetrs50' and args.pretrained and args.img_size == recipe.img_size
    assert args.drop_path == recipe.drop_path_rate and args.batch_size == recipe.batch_size
    assert args.opt == recipe.opt == 'adamw' and args.weight_decay == recipe.weight_decay == 0.05
    # the lr as train.py's own batch rule: lr_base at lr_base_size, linear (tcnn's rule)
    assert (args.lr, args.lr_base, args.lr_base_size, args.lr_base_scale) == (None, recipe.lr,
                                                                              recipe.lr_base_batch, 'linear')
    # the warm-up as a prefix: train.py runs epochs + warmup-epochs = the recipe's epochs
    assert args.warmup_prefix and args.epochs + args.warmup_epochs == recipe.epochs == 50
    assert args.warmup_epochs == recipe.warmup_epochs and args.sched == 'cosine' and args.sched_on_updates
    # the warm-up start and the floor scaled with the global batch as tcnn train does (train.py scales only the lr)
    assert (args.warmup_lr, args.min_lr) == (recipe.warmup_lr * 128 / 1024, recipe.min_lr * 128 / 1024)
    assert args.aa == recipe.aa == 'rand-m9-mstd0.5-inc1' and args.mixup == 0.8 and args.cutmix == 1.0
    assert args.reprob == 0.25 and args.smoothing == 0.1 and args.mixup_switch_prob == recipe.mixup_switch_prob
    assert args.scale == list(recipe.scale) and args.opt_eps == recipe.opt_eps and args.momentum == recipe.momentum
    assert args.train_interpolation == recipe.interpolation and args.grad_accum_steps == recipe.accum_steps


def test_explicit_flags_win_over_the_recipe(capsys):
    """``--tcnn-print-flags``: the flags the runner adds; those the user gives are not added again."""
    assert main(['--tcnn-recipe', 't_resnet50_rs', '--tcnn-set', 'pretrained=false', '--tcnn-print-flags',
                 'train.py', '--lr', '1e-3', '--epochs', '10', '-b', '32', '--model', 't_resnet18d']) == 0
    flags = capsys.readouterr().out.split()
    assert '--lr-base' not in flags and '--lr' not in flags and '--pretrained' not in flags
    assert '--batch-size' not in flags and '--model' not in flags and '--warmup-prefix' not in flags
    args = _train_py_parser().parse_args(flags + ['--lr', '1e-3', '--epochs', '10', '-b', '32'])
    assert (args.lr, args.epochs, args.batch_size, args.warmup_epochs) == (1e-3, 10, 32, 5)
    assert args.min_lr == pytest.approx(1e-6 * 32 / 1024)  # the user's batch


@pytest.mark.parametrize('argv, message', [
    (['--tcnn-recipe', 'no_such_recipe', 'train.py'], 'no_such_recipe'),
    (['--tcnn-lr', '1', 'train.py'], 'unknown option --tcnn-lr'),
    (['--tcnn-recipe', 't_resnet50_rs', '--tcnn-set', 'no_sa=true', 'train.py'], 'tcnn train'),
    (['not_a_script.py', '--model', 't_resnet18d'], 'give the path of a timm script'),
])
def test_bad_runner_input_is_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('python -m tcnn.timm_script: error:') and message in err and '\n' not in err


def test_docs_snippet_takes_the_callers_lr_and_weight_decay():
    """docs/train.md's timm snippet builds its groups from the caller's lr and weight decay (train.py: args.lr after
    its scaling, args.weight_decay), not from values written into it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, 'docs', 'train.md')) as f:
        text = f.read()
    start = text.index('```python', text.index('### The paper\'s recipe in your own training loop'))
    code = text[start + len('```python'):text.index('```', start + 3)]
    code = code.replace("'t_resnet50d', pretrained=True", "'t_resnet18d', pretrained=False")
    code = '\n'.join(line for line in code.splitlines() if not line.startswith('lr, weight_decay ='))
    namespace = {'lr': 3e-4, 'weight_decay': 0.02}
    exec(compile(code, 'docs/train.md', 'exec'), namespace)  # noqa: S102 - our own documentation
    for group in namespace['optimizer'].param_groups:
        expected = 1000 * 3e-4 if group['group_name'] == 'gating' else 3e-4
        assert group['lr'] == pytest.approx(expected)
        assert group['weight_decay'] == (0.02 if group['group_name'] == 'decay' else 0)
    with open(os.path.join(root, 'README.md')) as f:
        readme = f.read()
    assert 'param_group_fn=functools.partial(tcnn.param_groups, lr=lr, weight_decay=weight_decay' in readme
