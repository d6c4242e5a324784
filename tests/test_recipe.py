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

import tcnn.train.launch as tcnn_train
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
    assert tcnn_train.main(['--set', 'warmup_epoch=1', '--print-config']) == 2
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
    assert resolve_recipe(sets=['log=wandb']).log == ['wandb']
    assert RECIPE_KEYS['amp'].choices == ('auto', 'bf16', 'fp16', 'none')
    coerced = Recipe.from_dict({'lr': 1, 'warmup_lr': '1e-6'})  # PyYAML reads 1e-6 as a string
    assert (coerced.lr, coerced.warmup_lr) == (1.0, 1e-6) and isinstance(coerced.lr, float)


def test_recipes_do_not_share_their_lists():
    a, b = Recipe(), Recipe()
    a.scale.append(0.5)
    assert b.scale == [0.08, 1.0] == Recipe().scale
    plain = b.to_dict()
    plain['scale'][0] = 0.5
    assert b.scale == [0.08, 1.0]


@pytest.mark.parametrize('name', bundled_recipes() + ['base'])
def test_every_shipped_recipe_round_trips_to_identical_yaml(name, tmp_path):
    path = os.path.join(BUNDLED_DIR, f'{name}.yaml')
    recipe = resolve_recipe(path)
    with open(path) as f:
        own = {k: v for k, v in yaml.safe_load(f).items() if k != 'base'}
    assert {k: getattr(recipe, k) for k in own} == own  # the file's values, with their types
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
    assert tcnn_train.main(['--resume', str(run), '--epochs', '2', '--set', f'data={data}']) == 0
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
