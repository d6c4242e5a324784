"""Tests of the typed recipe (``tcnn.train.recipe.Recipe``, issue 41): a misspelt key is an error where it is made
(a YAML file, ``--set``, code), the YAML of the shipped recipes, ``config.yaml`` and checkpoints keeps its form, and
the recipes that earlier releases stored in their checkpoints still load and resume."""
import argparse
import dataclasses
import os
import shutil

import pytest
import torch
import yaml

from tcnn.train import launch
from tcnn.errors import TcnnError
from tcnn.train.args import add_arguments
from tcnn.train.recipe import (BUNDLED_DIR, RECIPE_KEYS, Recipe, bundled_recipes, dump_recipe, load_recipe, parse_set,
                               resolve_recipe)
from tcnn.train.resume import resumed_recipe
from tcnn.files.run_folder import read_checkpoint

from imagegen import make_image_folder

FIXTURES = os.path.join(os.path.dirname(__file__), 'fixtures')
RELEASES = ('0.3.1', '0.4.0')


def _args(argv=()) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def _one_line(error: BaseException) -> str:
    text = str(error)
    assert '\n' not in text, text
    return text


def test_a_misspelt_set_key_is_one_line_naming_the_key_and_the_fix():
    with pytest.raises(TcnnError) as e:
        parse_set(['lrr=0.1'])
    assert _one_line(e.value).startswith("unknown recipe key 'lrr' in --set (did you mean lr?)")


def test_a_misspelt_set_key_on_the_command_line(capsys):
    assert launch.main(['--set', 'warmup_epoch=1', '--print-config']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown recipe key 'warmup_epoch' in --set (did you mean warmup_epochs " in err[0], err


def test_a_misspelt_yaml_key_names_the_file_and_the_fix(tmp_path):
    path = tmp_path / 'mine.yaml'
    path.write_text('base: t_resnet50_rs.yaml\nlr: 2e-4\ngatting_lr: 0.2\n'.replace(
        't_resnet50_rs.yaml', os.path.join(BUNDLED_DIR, 't_resnet50_rs.yaml')))
    with pytest.raises(TcnnError) as e:
        resolve_recipe(str(path))
    assert _one_line(e.value).startswith(f"unknown recipe key 'gatting_lr' in {path} (did you mean gating_lr")


def test_bad_values_are_one_line_errors_naming_the_key():
    with pytest.raises(TcnnError) as e:
        Recipe.from_dict({'lr': 'fast'}, 'my dict')
    assert _one_line(e.value) == "recipe key 'lr' in my dict must be float, got 'fast'"
    with pytest.raises(TcnnError, match=r"recipe key 'sched' in --set must be one of cosine, tanh, poly, got 'step'"):
        resolve_recipe(sets=['sched=step'])
    with pytest.raises(TcnnError, match=r"recipe key 'epochs' must be > 0, got 0"):
        Recipe.from_dict({'epochs': 0, 'warmup_epochs': 0})


def test_from_dict_checks_the_combinations_unless_told_not_to():
    """``Recipe.from_dict`` checks the combinations of keys by default (a warm-up as long as the run is impossible)
    and gives the resolved forms (``log`` as a tuple of backends); with ``validate=False`` each key is checked alone
    and the combination stays as given (``resolve_recipe`` fits a file's warm-up to a shorter run first)."""
    data = {'epochs': 3, 'warmup_epochs': 5}
    assert _error(lambda: Recipe.from_dict(data)) == (
        'warmup_epochs 5 must be smaller than epochs 3 (the decay follows the warm-up): set a shorter one with '
        '--set warmup_epochs=N')
    unchecked = Recipe.from_dict(data, validate=False)
    assert (unchecked.epochs, unchecked.warmup_epochs) == (3, 5)
    assert Recipe.from_dict({'log': 'wandb'}).log == ('wandb',)
    assert Recipe.from_dict({'log': 'wandb'}, validate=False).log == 'wandb'


def test_a_misspelt_key_in_code_is_an_attribute_error():
    recipe = resolve_recipe()
    with pytest.raises(AttributeError, match='lrr'):
        recipe.lrr
    with pytest.raises(AttributeError):  # frozen: no key is added or changed by assignment
        recipe.lr = 1.0
    with pytest.raises(TypeError, match='lrr'):
        dataclasses.replace(recipe, lrr=1.0)
    with pytest.raises(TypeError, match='lrr'):
        Recipe(lrr=1.0)


def test_the_schema_is_read_off_the_typed_fields():
    assert list(RECIPE_KEYS) == [f.name for f in dataclasses.fields(Recipe)] and len(RECIPE_KEYS) == 67
    assert RECIPE_KEYS['lr'].types == (float,) and RECIPE_KEYS['lr'].default == 1e-4
    assert RECIPE_KEYS['mean'].types == (list, type(None)) and RECIPE_KEYS['scale'].default == [0.08, 1.0]
    assert RECIPE_KEYS['stages'].types == (int, str, list, type(None))
    assert RECIPE_KEYS['log'].types == (list, str)  # a file may say `log: wandb`; the resolved recipe holds a list
    assert resolve_recipe(sets=['log=wandb']).log == ('wandb',)
    assert RECIPE_KEYS['amp'].choices == ('auto', 'bf16', 'fp16', 'none')
    coerced = Recipe.from_dict({'lr': 1, 'warmup_lr': '1e-6'})  # PyYAML reads 1e-6 as a string
    assert (coerced.lr, coerced.warmup_lr) == (1.0, 1e-6) and isinstance(coerced.lr, float)


def test_a_recipe_holds_tuples_that_nothing_changes():
    """Frozen all the way down: a list given in code, a file or --set becomes a tuple; the plain form (files,
    checkpoints, dashboards) holds lists again, the recipe's own copies."""
    recipe = Recipe(scale=[0.5, 1.0], opt_betas=[0.8, 0.9], stages=[3, 4], absolute_lrs=['lr'], log=['wandb'])
    assert (recipe.scale, recipe.opt_betas, recipe.stages, recipe.absolute_lrs, recipe.log) == (
        (0.5, 1.0), (0.8, 0.9), (3, 4), ('lr',), ('wandb',))
    assert Recipe().scale == (0.08, 1.0) and Recipe().absolute_lrs == () and Recipe().log == ()
    with pytest.raises(AttributeError):
        recipe.scale.append(0.5)
    assert Recipe.from_dict({'mean': [0.5, 0.5, 0.5]}).mean == (0.5, 0.5, 0.5)
    plain = recipe.to_dict()
    assert (plain['scale'], plain['stages'], plain['log']) == ([0.5, 1.0], [3, 4], ['wandb'])
    plain['scale'][0] = 0.1
    assert recipe.scale == (0.5, 1.0) and recipe.to_dict()['scale'] == [0.5, 1.0]
    # a recipe's tuple given back as an override is a value like the file's list
    from tcnn.train.recipe import apply_overrides
    assert apply_overrides(Recipe(), {'scale': recipe.scale}).scale == (0.5, 1.0)


def test_bounds_are_declared_with_the_fields_and_checked_whenever_a_recipe_is_made(tmp_path):
    """``Recipe(epochs=-1)`` fails as a YAML file with ``epochs: -1`` does, with the same line: the range is the
    field's, checked on construction (code, files, --set, dataclasses.replace), not in a list kept apart."""
    from tcnn.train.recipe import NON_NEGATIVE, POSITIVE, UNIT_INTERVAL
    expected = "recipe key 'epochs' must be > 0, got -1"
    assert _error(lambda: Recipe(epochs=-1)) == expected
    path = tmp_path / 'r.yaml'
    path.write_text('epochs: -1\n')
    assert _error(lambda: resolve_recipe(str(path))) == expected
    assert _error(lambda: resolve_recipe(sets=['epochs=-1'])) == expected
    assert _error(lambda: Recipe.from_dict({'epochs': -1}, validate=False)) == expected
    assert _error(lambda: dataclasses.replace(Recipe(), epochs=-1)) == expected
    bounds = {key: spec.bound for key, spec in RECIPE_KEYS.items() if spec.bound}
    assert bounds == {**{k: POSITIVE for k in POSITIVE_KEYS}, **{k: NON_NEGATIVE for k in NON_NEGATIVE_KEYS},
                      **{k: UNIT_INTERVAL for k in UNIT_INTERVAL_KEYS}}
    assert Recipe(crop_pct=None, workers=None).crop_pct is None  # an optional key may be null


@pytest.mark.parametrize('name', bundled_recipes() + ['base'])
def test_every_shipped_recipe_round_trips_to_identical_yaml(name, tmp_path):
    path = os.path.join(BUNDLED_DIR, f'{name}.yaml')
    recipe = resolve_recipe(path)
    with open(path) as f:
        own = {k: v for k, v in yaml.safe_load(f).items() if k != 'base'}
    assert {k: recipe.to_dict()[k] for k in own} == own  # the file's values, with their types (plain: lists)
    text = dump_recipe(recipe)
    written = tmp_path / 'config.yaml'
    written.write_text(text)
    again = resolve_recipe(str(written))
    assert again == recipe and dump_recipe(again) == text
    assert yaml.safe_load(text) == recipe.to_dict() and list(yaml.safe_load(text)) == list(RECIPE_KEYS)


@pytest.mark.parametrize('release', RELEASES)
def test_the_recipe_of_an_earlier_releases_checkpoint_loads(release):
    path = os.path.join(FIXTURES, f'tcnn-{release}', 'run_last.pt')
    config = torch.load(path, map_location='cpu', weights_only=True)['config']
    recipe = resumed_recipe(_args(), {'config': config}, path)
    # its run went through timm's PIL transform (releases before 0.7 had no other data pipeline) and goes on with it
    assert {k: v for k, v in recipe.to_dict().items() if k != 'output'} == \
        {k: v for k, v in dict(config, data_pipeline='pil').items() if k != 'output'}
    assert recipe.output == os.path.dirname(path) and recipe.model == 'test_resnet' and recipe.model_ema
    # the same YAML as the release wrote (config.yaml, the model card's dump), for the keys it had
    assert dump_recipe({k: v for k, v in Recipe.from_dict(config).to_dict().items() if k in config}) == \
        dump_recipe(config)
    # a key that release did not have yet takes its default; one no release had is named
    older = {k: v for k, v in config.items() if k not in ('skip_bad_images', 'log', 'log_every', 'wandb_project')}
    assert resumed_recipe(_args(), {'config': older}, path) == recipe
    with pytest.raises(TcnnError, match=r"unknown recipe key 'lr_warmup' in the checkpoint .*run_last.pt"):
        resumed_recipe(_args(), {'config': dict(config, lr_warmup=3)}, path)


@pytest.mark.parametrize('release', RELEASES)
def test_an_earlier_releases_run_resumes(release, tmp_path, capsys):
    """The fixture's run (1 epoch of test_resnet on 3 classes at 48 px) continues for a second epoch here, with its
    data given again (the release's data folder was temporary); config.yaml is the checkpoint's recipe with the
    overrides."""
    data = make_image_folder(str(tmp_path / 'data'), num_classes=3, train_per_class=4, val_per_class=2, size=48)
    run = tmp_path / 'run'
    run.mkdir()
    shutil.copy(os.path.join(FIXTURES, f'tcnn-{release}', 'run_last.pt'), run / 'last.pt')
    old = read_checkpoint(str(run / 'last.pt'))['config']
    assert launch.main(['--resume', str(run), '--epochs', '2', '--set', f'data={data}']) == 0
    assert 'resuming after epoch 1/2' in capsys.readouterr().out
    ckpt = read_checkpoint(str(run / 'last.pt'))
    assert ckpt['epoch'] == 1
    expected = dict(old, epochs=2, data=data, output=str(run), data_pipeline='pil')  # the release's pipeline
    assert ckpt['config'] == expected
    assert (run / 'config.yaml').read_text() == dump_recipe(expected)
    assert load_recipe(str(run / 'config.yaml')) == expected


# ----------------------------------------------------------------- the recipes line by line (issue 47, mutants)

# The paper's fine-tuning recipes (T-CNN, arXiv:2106.05795, section 3, Tables 1 and 5; docs/train.md): per model the
# source CNN, the fine-tuning resolution and the stochastic depth, and the settings they share. Written out here, not
# read from the files, so that a changed value in a bundled recipe fails.
PAPER_RECIPES = {
    't_resnet50_rs': ('resnetrs50', 224, 0.1), 't_resnet101_rs': ('resnetrs101', 224, 0.1),
    't_resnet152_rs': ('resnetrs152', 320, 0.2), 't_resnet200_rs': ('resnetrs200', 320, 0.2),
    't_resnet270_rs': ('resnetrs270', 320, 0.2), 't_resnet350_rs': ('resnetrs350', 320, 0.2),
    't_resnet50_d': ('resnet50d', 320, 0.1), 't_resnet101_d': ('resnet101d', 384, 0.1),
    't_resnet152_d': ('resnet152d', 384, 0.2), 't_resnet200_d': ('resnet200d', 384, 0.2),
}
PAPER_SHARED = dict(
    stages=None, locality_strength=1.0, gating_init=1.0, pretrained=True, epochs=50, opt='adamw', weight_decay=0.05,
    lr=1e-4, gating_lr=0.1, lr_base_batch=1024, scale_lr=True, batch_size=128, accum_steps=1, sched='cosine',
    warmup_epochs=5, warmup_lr=1e-6, min_lr=1e-6, aa='rand-m9-mstd0.5-inc1', interpolation='bicubic', reprob=0.25,
    remode='pixel', mixup=0.8, cutmix=1.0, mixup_prob=1.0, mixup_switch_prob=0.5, smoothing=0.1, amp='auto',
    workers=None)


def test_bundled_recipes_are_the_papers():
    assert bundled_recipes() == sorted(PAPER_RECIPES)
    for name, (model, img_size, drop_path) in PAPER_RECIPES.items():
        recipe = resolve_recipe(name)
        assert (recipe.model, recipe.img_size, recipe.drop_path_rate) == (model, img_size, drop_path), name
        assert {k: getattr(recipe, k) for k in PAPER_SHARED} == PAPER_SHARED, name
        assert load_recipe(name).keys() == {*PAPER_SHARED, 'model', 'img_size', 'drop_path_rate'}, name


def _error(call) -> str:
    with pytest.raises(TcnnError) as e:
        call()
    return _one_line(e.value)


# written out here (not read from tcnn.train.recipe): the keys each range covers
POSITIVE_KEYS = ('epochs', 'batch_size', 'accum_steps', 'lr', 'gating_lr', 'lr_base_batch', 'img_size',
                 'locality_strength', 'model_ema_decay', 'log_every')
NON_NEGATIVE_KEYS = ('workers', 'warmup_epochs', 'warmup_lr', 'min_lr', 'weight_decay', 'mixup', 'cutmix', 'recount',
                     'reparam_epoch', 'num_classes', 'eval_img_size', 'qk_dim', 'clip_grad')
UNIT_INTERVAL_KEYS = ('drop_path_rate', 'reprob', 'mixup_prob', 'mixup_switch_prob', 'smoothing', 'crop_pct')


def test_recipe_ranges_hold_at_their_bounds():
    from tcnn.train.recipe import validate_recipe
    ok = Recipe(epochs=10, warmup_epochs=0)
    for key in POSITIVE_KEYS:
        assert _error(lambda: dataclasses.replace(ok, **{key: 0})) == f"recipe key '{key}' must be > 0, got 0"
        validate_recipe(dataclasses.replace(ok, **{key: 2}))
    for key in NON_NEGATIVE_KEYS:
        assert _error(lambda: dataclasses.replace(ok, **{key: -1})) == f"recipe key '{key}' must be >= 0, got -1"
        validate_recipe(dataclasses.replace(ok, **{key: 0}))
    for key in UNIT_INTERVAL_KEYS:
        for bad in (-0.5, 1.5):
            assert _error(lambda: dataclasses.replace(ok, **{key: bad})) == \
                f"recipe key '{key}' must be in [0, 1], got {bad}"
        for good in (0.0, 1.0):
            validate_recipe(dataclasses.replace(ok, **{key: good}))


def test_validate_recipe_refuses_combinations_word_for_word():
    from tcnn.train.recipe import validate_recipe
    ok = Recipe(epochs=10, warmup_epochs=2)

    def fails(**kw) -> str:
        return _error(lambda: validate_recipe(dataclasses.replace(ok, **kw)))
    assert fails(reparam_epoch=3, no_sa=True) == ('reparam_epoch (late reparameterisation) and no_sa (no '
                                                  'self-attention) exclude each other')
    assert fails(reparam_epoch=10) == ('reparam_epoch 10 must be smaller than epochs 10 (it is the number of CNN '
                                       'epochs before the conversion)')
    validate_recipe(dataclasses.replace(ok, reparam_epoch=9))
    assert fails(warmup_epochs=10) == ('warmup_epochs 10 must be smaller than epochs 10 (the decay follows the '
                                       'warm-up): set a shorter one with --set warmup_epochs=N')
    validate_recipe(dataclasses.replace(ok, warmup_epochs=9))
    for bad in (['lr', 'epochs'], ['lr', 'lr']):
        assert fails(absolute_lrs=bad) == ("recipe key 'absolute_lrs' lists learning-rate keys (lr, gating_lr, "
                                           f"warmup_lr, min_lr) once each, got {bad!r}")
    validate_recipe(dataclasses.replace(ok, absolute_lrs=['min_lr', 'lr']))
    assert fails(batch_size=3) == 'mixup/cutmix need an even batch_size, got 3'
    assert fails(batch_size=3, mixup=0.0) == 'mixup/cutmix need an even batch_size, got 3'  # cutmix alone
    assert fails(batch_size=3, cutmix=0.0) == 'mixup/cutmix need an even batch_size, got 3'  # mixup alone
    for odd_ok in (dict(mixup=0.0, cutmix=0.0), dict(mixup_prob=0.0)):
        validate_recipe(dataclasses.replace(ok, batch_size=3, **odd_ok))
    for bad in ([0.0, 1.0], [0.5, 0.4], [0.5, 1.1], [0.5], ['a', 1.0]):
        assert fails(scale=bad) == f"recipe key 'scale' must be [low, high] with 0 < low <= high <= 1, got {bad!r}"
    for good in ([1.0, 1.0], [0.08, 1.0], [1, 1]):
        validate_recipe(dataclasses.replace(ok, scale=good))
    for key in ('mean', 'std'):
        for bad in ([0.5, 0.5], [0.5, 'a', 0.5]):
            assert fails(**{key: bad}) == f"recipe key '{key}' must be a list of 3 numbers, got {bad!r}"
        validate_recipe(dataclasses.replace(ok, **{key: [0.5, 1, 0.5]}))
    assert fails(device='tpu') == "device must be auto, cpu, cuda or cuda:N, got 'tpu'"
    for device in ('auto', 'cpu', 'cuda', 'cuda:1'):
        assert validate_recipe(dataclasses.replace(ok, device=device)).device == device
    assert fails(log='mlflow') == "recipe key 'log' takes tensorboard, wandb or none, got 'mlflow'"
    for log, backends in (('wandb', ('wandb',)), (['wandb', 'tensorboard', 'wandb'], ('tensorboard', 'wandb')),
                          ('none', ()), (['none'], ())):
        assert validate_recipe(dataclasses.replace(ok, log=log)).log == backends
    for compile, mode in ((True, 'default'), (False, False), ('max-autotune', 'max-autotune')):
        assert validate_recipe(dataclasses.replace(ok, compile=compile)).compile == mode


def test_values_are_coerced_and_checked_against_the_schema():
    from tcnn.train.recipe import apply_overrides
    base = Recipe()

    def fails(**kw) -> str:
        return _error(lambda: apply_overrides(base, kw, 'here'))
    coerced = apply_overrides(base, {'lr': '3e-4', 'min_lr': 0, 'epochs': 3.0, 'crop_pct': None})
    assert (coerced.lr, coerced.min_lr, coerced.epochs, coerced.crop_pct) == (3e-4, 0.0, 3, None)
    assert type(coerced.min_lr) is float and type(coerced.epochs) is int
    assert fails(epochs=3.5) == "recipe key 'epochs' in here must be int, got 3.5"
    assert fails(epochs=True) == "recipe key 'epochs' in here must be int, got True"
    assert fails(lr=True) == "recipe key 'lr' in here must be float, got True"
    assert fails(lr='fast') == "recipe key 'lr' in here must be float, got 'fast'"
    assert fails(crop_pct='x') == "recipe key 'crop_pct' in here must be float or null, got 'x'"
    assert fails(lr=float('inf')) == "recipe key 'lr' in here must be a finite number, got inf"
    assert fails(mean=[0.5, float('nan'), 0.5]) == ("recipe key 'mean' in here must hold finite numbers, got "
                                                    "[0.5, nan, 0.5]")
    assert fails(amp='fp8') == "recipe key 'amp' in here must be one of auto, bf16, fp16, none, got 'fp8'"
    assert fails(interpolation='lanczos') == ("recipe key 'interpolation' in here must be one of bilinear, bicubic, "
                                              "nearest, random, null, got 'lanczos'")
    # where the values come from, by default: code (from_dict), the command line (apply_overrides)
    assert _error(lambda: Recipe.from_dict({'lr': 'x'})) == "recipe key 'lr' in the recipe must be float, got 'x'"
    assert _error(lambda: apply_overrides(base, {'lr': 'x'})) == \
        "recipe key 'lr' in the command line must be float, got 'x'"
    over = Recipe.from_dict({'lr': 2e-4}, base=Recipe(epochs=7, warmup_epochs=1))
    assert (over.lr, over.epochs, over.warmup_epochs) == (2e-4, 7, 1)
    assert fails(lrr=1) == "unknown recipe key 'lrr' in here (did you mean lr?); keys are listed in docs/train.md"
    assert fails(zzzz=1) == "unknown recipe key 'zzzz' in here; keys are listed in docs/train.md"
    assert fails(mixup_pob=1) == ("unknown recipe key 'mixup_pob' in here (did you mean mixup_prob or mixup_mode or "
                                  "mixup?); keys are listed in docs/train.md")  # the 3 closest of 4
    assert apply_overrides(base, {}) == base


def test_parse_set_reads_key_value_pairs_and_refuses_malformed_ones():
    assert parse_set(['lr=3e-4', 'stages=[3, 4]', ' warmup-epochs =2', 'crop_pct=', 'data=/d/a=b']) == {
        'lr': 3e-4, 'stages': [3, 4], 'warmup_epochs': 2, 'crop_pct': None, 'data': '/d/a=b'}  # the first '=' splits
    for bad in ('lr', '=3'):
        assert _error(lambda: parse_set([bad])) == f'--set expects KEY=VALUE, got {bad!r}'
    assert _error(lambda: parse_set(['lr=[1'])) == "--set lr: cannot read value '[1'"
    assert _error(lambda: parse_set(['lr='])) == "recipe key 'lr' in --set must be float, got None"


def test_load_recipe_reads_files_and_their_bases(tmp_path):
    from tcnn.train.recipe import find_recipe
    (tmp_path / 'a.yaml').write_text('base: b.yaml\nlr: 2.0e-4\n')
    (tmp_path / 'b.yaml').write_text('lr: 1.0e-3\nepochs: 7\n')
    assert load_recipe(str(tmp_path / 'a.yaml')) == {'lr': 2e-4, 'epochs': 7}
    (tmp_path / 'typo.yaml').write_text('base: b.yaml\nepochs: many\n')
    assert _error(lambda: load_recipe(str(tmp_path / 'typo.yaml'))) == \
        f"recipe key 'epochs' in {tmp_path / 'typo.yaml'} must be int, got 'many'"
    (tmp_path / 'empty.yaml').write_text('')
    assert load_recipe(str(tmp_path / 'empty.yaml')) == {}
    (tmp_path / 'loop.yaml').write_text('base: loop.yaml\n')
    loop = str(tmp_path / 'loop.yaml')
    assert _error(lambda: load_recipe(loop)) == f'recipe {loop} includes itself through "base"'
    (tmp_path / 'list.yaml').write_text('- lr\n')
    assert _error(lambda: load_recipe(str(tmp_path / 'list.yaml'))) == \
        f'recipe {tmp_path / "list.yaml"} must be a mapping of key: value, got list'
    (tmp_path / 'bad.yaml').write_text('lr: [1\n')
    assert _error(lambda: load_recipe(str(tmp_path / 'bad.yaml'))).startswith(
        f'cannot parse recipe {tmp_path / "bad.yaml"}: while parsing a flow sequence')
    missing = str(tmp_path / 'none.yaml')
    assert _error(lambda: load_recipe(missing)) == f'recipe file not found: {missing}'
    (tmp_path / 'broken_base.yaml').write_text('base: none.yaml\n')
    assert _error(lambda: load_recipe(str(tmp_path / 'broken_base.yaml'))) == f'recipe file not found: {missing}'
    bundled = os.path.join(BUNDLED_DIR, 't_resnet50_rs.yaml')
    assert find_recipe('t_resnet50_rs') == find_recipe('t_resnet50_rs.yaml') == bundled
    assert find_recipe(missing) == missing  # a path: loading it says it is missing
    assert _error(lambda: find_recipe('t_resnet9')) == (
        f"recipe 't_resnet9' is neither a file nor a bundled recipe ({', '.join(sorted(PAPER_RECIPES))})")


def test_resolve_recipe_precedence_and_the_fitted_warm_up(tmp_path):
    from tcnn.train.recipe import fit_warmup, mark_absolute_lrs
    path = tmp_path / 'r.yaml'
    path.write_text('epochs: 10\nwarmup_epochs: 5\nlr: 2.0e-4\nmin_lr: 3.0e-6\n')
    notes = []
    recipe = resolve_recipe(str(path), {'lr': 5e-4, 'epochs': 4}, ['min_lr=1e-5', 'gating_lr=0.2'], notes)
    assert (recipe.lr, recipe.min_lr, recipe.gating_lr, recipe.epochs) == (5e-4, 1e-5, 0.2, 4)
    assert recipe.absolute_lrs == ('lr', 'gating_lr', 'min_lr')
    # 5 of 10 epochs warm up: a 4-epoch run keeps the fraction, round(5 * 4 / 10) = 2
    assert recipe.warmup_epochs == 2 and notes == [
        'warm-up shortened from 5 to 2 epochs for a 4-epoch run (the recipe warms up 5 of 10 epochs); choose another '
        'with --set warmup_epochs=N']
    assert resolve_recipe(str(path), {'epochs': 4}, ['warmup_epochs=1']).warmup_epochs == 1  # the user's own
    with pytest.raises(TcnnError, match='warmup_epochs 5 must be smaller than epochs 4'):
        resolve_recipe(str(path), {'epochs': 4, 'warmup_epochs': 5})  # explicit: never changed
    with pytest.raises(TcnnError, match='warmup_epochs 4 must be smaller than epochs 4'):
        resolve_recipe(str(path), {'epochs': 4}, ['warmup_epochs=4'])  # explicit by --set too
    notes = []
    assert resolve_recipe(str(path), notes=notes).warmup_epochs == 5 and notes == []  # nothing to note
    # the file alone may be invalid: the overrides make the recipe that is checked
    path.write_text('epochs: 3\nwarmup_epochs: 5\n')
    assert resolve_recipe(str(path), sets=['epochs=10']).epochs == 10
    planned = Recipe(epochs=10, warmup_epochs=5)
    for epochs, fitted in ((5, 3), (1, 0), (9, 5)):  # floor(5 * e / 10 + 0.5), at most e - 1
        run = dataclasses.replace(planned, epochs=epochs)
        assert fit_warmup(run, planned, False)[0].warmup_epochs == (fitted if epochs <= 5 else 5), epochs
    for unchanged in (dataclasses.replace(planned, epochs=10),
                      dataclasses.replace(planned, epochs=12), dataclasses.replace(planned, epochs=8),
                      dataclasses.replace(planned, epochs=12, warmup_epochs=12)):
        assert fit_warmup(unchanged, planned, False) == (unchanged, None)
    long_warm_up = Recipe(epochs=10, warmup_epochs=12)  # not shortened: the run is as long as the recipe's
    assert fit_warmup(long_warm_up, long_warm_up, False) == (long_warm_up, None)
    assert fit_warmup(dataclasses.replace(planned, epochs=4), planned, True)[1] is None
    marked = mark_absolute_lrs(Recipe(absolute_lrs=['min_lr', 'bogus']), ['lr', 'batch_size'])
    assert marked.absolute_lrs == ('lr', 'min_lr', 'bogus')


def test_the_schema_carries_the_help_lines():
    """``tcnn train --help`` and docs/train.md read each key's help line off the schema."""
    assert RECIPE_KEYS['epochs'].help == 'fine-tuning epochs (SM C also reports 10 and 20)'
    assert RECIPE_KEYS['amp'].help.startswith('mixed precision: auto (bf16 on GPU, none on CPU)')
    assert all(isinstance(key.help, str) and key.help for key in RECIPE_KEYS.values())


def test_recipes_dump_to_dicts_and_scale_their_lrs():
    from tcnn.train.recipe import scaled_lrs
    recipe = Recipe(opt_betas=(0.8, 0.9), lr=2e-4, absolute_lrs=['min_lr'])
    plain = recipe.to_dict()
    assert list(plain) == list(RECIPE_KEYS) and plain['opt_betas'] == [0.8, 0.9]
    text = dump_recipe(recipe)
    assert text.splitlines()[0] == 'model: resnet50d' and yaml.safe_load(text) == plain
    assert dump_recipe({'lr': 0.5, 'other': 1, 'epochs': 3}) == '{epochs: 3, lr: 0.5}\n'  # field order, known keys
    assert scaled_lrs(recipe, 2048) == {'factor': 2.0, 'lr': 4e-4, 'gating_lr': 0.2, 'warmup_lr': 2e-6,
                                        'min_lr': 1e-6}
    assert scaled_lrs(dataclasses.replace(recipe, scale_lr=False), 2048) == {
        'factor': 1.0, 'lr': 2e-4, 'gating_lr': 0.1, 'warmup_lr': 1e-6, 'min_lr': 1e-6}


def test_auto_workers_leave_a_core_and_cap_at_eight(monkeypatch):
    from tcnn.train.recipe import auto_workers
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(9)), raising=False)
    assert [auto_workers(), auto_workers(2), auto_workers(0), auto_workers(1, cap=3)] == [8, 3, 8, 3]
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(16)), raising=False)
    assert auto_workers() == 8  # at most 8 by default
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0}, raising=False)
    assert auto_workers() == 0
    monkeypatch.delattr(os, 'sched_getaffinity', raising=False)
    monkeypatch.setattr(os, 'cpu_count', lambda: 5)
    assert auto_workers() == 4
    monkeypatch.setattr(os, 'cpu_count', lambda: None)
    assert auto_workers() == 0
