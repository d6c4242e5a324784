"""tcnn.train.resume: where a run starts (a fresh recipe, or a checkpoint's) and what a resumed run may change,
checked at the unit that decides it, without training (tests/test_train_reliability.py resumes real runs)."""
import argparse
import dataclasses
import os

import pytest

from tcnn.errors import TcnnError
from tcnn.train import resume
from tcnn.train.args import add_arguments
from tcnn.train.recipe import Recipe


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def _checkpoint(**config) -> dict:
    recipe = Recipe(model='resnet18d', num_classes=3, data='/data/x', epochs=10, warmup_epochs=1,
                    output='/somewhere/else', **config)
    return {'config': recipe.to_dict()}


def test_a_fresh_run_writes_to_runs_named_after_its_recipe_or_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe, checkpoint, notes = resume.resolve(_args('--model', 'hf-hub:timm/resnet18d', '--data', 'd'))
    assert checkpoint is None and recipe.output == os.path.join('runs', 'hf-hub_timm/resnet18d')
    recipe, _, _ = resume.resolve(_args('--recipe', 't_resnet50_d', '--data', 'd'))
    assert recipe.output == os.path.join('runs', 't_resnet50_d') and recipe.model == 'resnet50d'
    recipe, _, _ = resume.resolve(_args('--data', 'd', '--output', 'mine'))
    assert recipe.output == 'mine'


def test_resume_auto_starts_the_run_when_its_output_holds_no_last_checkpoint(tmp_path):
    out = tmp_path / 'run'
    recipe, checkpoint, _ = resume.resolve(_args('--resume', 'auto', '--data', 'd', '--output', str(out),
                                                 '--recipe', 't_resnet50_d'))
    assert checkpoint is None and recipe.output == str(out) and recipe.model == 'resnet50d'
    out.mkdir()
    (out / 'last.pt').write_bytes(b'')
    assert resume._resume_path(_args('--resume', 'auto', '--output', str(out)), []) == (str(out / 'last.pt'), None)


def test_resume_from_a_folder_takes_its_last_checkpoint_and_refuses_a_folder_without_one(tmp_path):
    with pytest.raises(TcnnError) as info:
        resume._resume_path(_args('--resume', str(tmp_path)), [])
    assert str(info.value) == (f'{tmp_path} holds no last.pt: resume from a tcnn train output folder, or pass the '
                               'checkpoint file itself')
    (tmp_path / 'last.pt').write_bytes(b'')
    assert resume._resume_path(_args('--resume', str(tmp_path)), []) == (str(tmp_path / 'last.pt'), None)
    assert resume._resume_path(_args('--resume', str(tmp_path / 'x.pt')), []) == (str(tmp_path / 'x.pt'), None)
    with pytest.raises(TcnnError) as info:
        resume._resume_path(_args('--resume', str(tmp_path), '--recipe', 't_resnet50_d'), [])
    assert str(info.value) == ("--recipe cannot be combined with --resume PATH: the run's recipe is in the "
                               'checkpoint; override single keys with flags or --set (--resume auto accepts --recipe '
                               'for the first start)')


def test_a_resumed_run_takes_the_checkpoints_recipe_and_writes_beside_the_checkpoint(tmp_path):
    path = str(tmp_path / 'run' / 'last.pt')
    recipe = resume.resumed_recipe(_args(), _checkpoint(data_pipeline='device'), path)
    assert recipe == dataclasses.replace(Recipe.from_dict(_checkpoint(data_pipeline='device')['config']),
                                         output=str(tmp_path / 'run'))
    relative = resume.resumed_recipe(_args(), _checkpoint(), os.path.join('rel', 'last.pt'))
    assert relative.output == os.path.abspath('rel')
    # flags and --set override single keys; a learning rate typed by the user is used as given
    recipe = resume.resumed_recipe(_args('--epochs', '9', '--set', 'mixup=0', '--lr', '3e-4', '--output', 'o'),
                                   _checkpoint(), path)
    assert (recipe.epochs, recipe.mixup, recipe.lr, recipe.output) == (9, 0, 3e-4, 'o')
    assert recipe.absolute_lrs == ('lr',)


def test_a_checkpoint_of_a_release_before_the_batched_pipelines_goes_on_with_pils():
    config = _checkpoint()['config']
    del config['data_pipeline']
    assert resume.resumed_recipe(_args(), {'config': config}, 'last.pt').data_pipeline == 'pil'
    assert resume.resumed_recipe(_args(), _checkpoint(), 'last.pt').data_pipeline == 'auto'


@pytest.mark.parametrize('argv, changed', [
    (['--model', 'resnet26d'], 'model'),
    (['--set', 'num_classes=4'], 'num_classes'),
    (['--no-sa'], 'no_sa'),
    (['--set', 'reparam_epoch=2'], 'reparam_epoch'),
    (['--set', 'stages=[3, 4]'], 'stages'),
    (['--set', 'qk_dim=8'], 'qk_dim'),
    (['--set', 'locality_strength=2.0'], 'locality_strength'),
    (['--set', 'gating_init=2.0'], 'gating_init'),
    (['--set', 'opt=sgd'], 'opt'),
    (['--set', 'drop_path_rate=0.1', '--model', 'resnet26d'], 'model, drop_path_rate'),
])
def test_a_resumed_run_cannot_change_what_defines_the_model_or_the_optimiser(argv, changed):
    with pytest.raises(TcnnError) as info:
        resume.resumed_recipe(_args(*argv), _checkpoint(), 'last.pt')
    assert str(info.value) == (f'cannot change {changed} when resuming (they define the model and the optimiser); '
                               'start a new run instead')
    # the same values as the checkpoint's are no change (a requeue repeats its first command)
    same = resume.resumed_recipe(_args('--model', 'resnet18d', '--set', 'num_classes=3', '--set', 'opt=adamw'),
                                 _checkpoint(), 'last.pt')
    assert (same.model, same.num_classes, same.opt) == ('resnet18d', 3, 'adamw')


def test_a_resumed_run_is_validated_with_its_overrides(tmp_path):
    with pytest.raises(TcnnError, match='warmup_epochs'):
        resume.resumed_recipe(_args('--set', 'warmup_epochs=12'), _checkpoint(), 'last.pt')


@pytest.mark.parametrize('processes', [1, 2])
def test_a_mid_epoch_resumes_sampler_and_loader_have_the_length_of_what_is_left_of_the_epoch(processes):
    """An epoch resumed after 4 of this process's samples: the sampler yields the rest, and its length (the loader's
    batch count) says so; the next epoch is whole again."""
    from torch.utils.data import DataLoader
    from tcnn.train.builders import EpochSampler
    data = list(range(20))
    sampler = EpochSampler(data, processes, 0, seed=3)
    whole = 20 // processes
    sampler.set_epoch(2, start=4)
    assert len(sampler) == len(list(sampler)) == whole - 4
    assert len(DataLoader(data, batch_size=4, sampler=sampler, drop_last=True)) == (whole - 4) // 4
    sampler.set_epoch(3)
    assert len(sampler) == len(list(sampler)) == whole
