"""A training checkpoint read as a T-CNN file (``tcnn.files.run_folder`` writes it, ``tcnn.files.tcnn_file`` reads it):
its model, its run and recipe, and its EMA weights (``tcnn.load(ema=True)``, ``tcnn info / inspect / eval --use-ema``);
EMA weights asked of any other file are refused in one line."""
import copy
import json
import os
import re

import pytest
import torch

import tcnn
from tcnn.files import tcnn_file
from tcnn.files import run_folder
from tcnn.errors import TcnnError

from helpers import images


def test_a_training_checkpoint_loads_its_model_and_reads_its_run_and_recipe(t_model, tmp_path):
    """OUTPUT/last.pt of tcnn train: the model is under 'model_file'."""
    path = tmp_path / 'last.pt'
    torch.save({'model_file': tcnn_file.model_to_dict(t_model), 'ema': None, 'optimizer': {'state': {}},
                'scheduler': {}, 'scaler': None, 'epoch': 4, 'rng': {}, 'config': {'lr': 1e-4}, 'best_top1': 51.5},
               path)
    loaded = tcnn.load(str(path))
    with torch.no_grad():
        assert torch.equal(loaded(images()), t_model(images()))
    assert tcnn_file.read(str(path))['training'] == {'epoch': 4, 'best_top1': 51.5}
    assert tcnn_file.read(str(path))['recipe'] == {'lr': 1e-4}  # the run's recipe, for tcnn publish's model card


def test_a_training_checkpoint_yields_its_model_with_its_run(t_model):
    """A training checkpoint's T-CNN dict carries its epoch and best top-1 (not when stored as tensors), its recipe
    (a dict, else None) and, read with its EMA weights, ``'weights': 'ema'``."""
    good = tcnn_file.model_to_dict(t_model)
    d = tcnn_file.check_dict({'model_file': good, 'epoch': 7, 'best_top1': torch.tensor(50.0), 'config': 'lr=1'},
                             'last.pt')
    assert d['training'] == {'epoch': 7} and d['recipe'] is None and d['state_dict'] is good['state_dict']
    d = tcnn_file.check_dict({'model_file': good, 'best_top1': 12.5, 'config': {'lr': 0.1}, 'ema_weights': True},
                             'last.pt')
    assert d['training'] == {'best_top1': 12.5, 'weights': 'ema'} and d['recipe'] == {'lr': 0.1}
    # a T-CNN dict that holds a model_file entry is a T-CNN dict, not a checkpoint
    assert 'training' not in tcnn_file.check_dict(dict(good, model_file={'x': 1}), 'f.pt')


def test_a_training_checkpoints_ema_weights_load_only_when_asked_for(t_model, tmp_path):
    """A tcnn train checkpoint keeps the EMA under 'ema': load(ema=True) rebuilds the model with those weights;
    a file without EMA weights is a one-line error, never the raw weights in their place."""
    ema = copy.deepcopy(t_model)
    with torch.no_grad():
        for p in ema.parameters():
            p.add_(0.01 * torch.randn_like(p))
    path = str(tmp_path / 'last.pt')
    checkpoint = run_folder.make_checkpoint(t_model, ema=ema.state_dict(), epoch=3, best_top1=40.0)
    run_folder.write_checkpoint(checkpoint, path)
    with torch.no_grad():
        assert torch.equal(tcnn.load(path)(images()), t_model(images()))
        assert torch.equal(tcnn.load(path, ema=True)(images()), ema(images()))
    assert tcnn_file.read(path, ema=True)['training'] == {'epoch': 3, 'best_top1': 40.0, 'weights': 'ema'}
    assert tcnn_file.read(path)['training'] == {'epoch': 3, 'best_top1': 40.0}
    no_ema = str(tmp_path / 'no_ema.pt')
    run_folder.write_checkpoint(run_folder.make_checkpoint(t_model, ema=None, epoch=3), no_ema)
    model_file = tcnn.save(t_model, str(tmp_path / 't.safetensors'))
    for where, message in ((no_ema, 'holds no EMA weights (its run did not use --model-ema)'),
                           (model_file, 'is a T-CNN file, which holds no EMA weights')):
        with pytest.raises(TcnnError, match=re.escape(message)) as info:
            tcnn.load(where, ema=True)
        assert '\n' not in str(info.value)


def test_ema_weights_asked_of_what_is_not_a_checkpoint_are_refused_word_for_word():
    """EMA weights are only in training checkpoints: a state dict (a dict, but no T-CNN file) or anything else is
    'not a training checkpoint', in one line that tells where they are."""
    for d in ({'w': torch.zeros(1)}, [torch.zeros(1)]):
        with pytest.raises(TcnnError) as e:
            tcnn_file.validated(d, 'f.pt', ema=True)
        assert str(e.value) == ('f.pt is not a training checkpoint, which holds no EMA weights: EMA weights are in the '
                                'checkpoints of `tcnn train --model-ema` (RUN/last.pt, RUN/best.pt); load this file '
                                'without ema / --use-ema')
    good = {'model_file': {'format': 'tcnn', 'version': 2, 'source': {'model': 'resnet18d'},
                           'state_dict': {'w': torch.zeros(1)}}, 'epoch': 1}
    for ema in (None, {}, {'w': 1.0}):  # a checkpoint whose run kept no EMA (or no tensors of one)
        with pytest.raises(TcnnError) as e:
            tcnn_file.validated(dict(good, ema=ema), 'last.pt', ema=True)
        assert str(e.value) == ('last.pt holds no EMA weights (its run did not use --model-ema): load it without ema '
                                '/ --use-ema')


def test_info_inspect_and_eval_read_a_checkpoints_ema_weights_with_use_ema(t_model, tmp_path, capsys):
    """tcnn info / inspect / eval --use-ema read the checkpoint's EMA weights (eval: scores only the EMA can give)."""
    from tcnn.cli import main
    raw, ema = copy.deepcopy(t_model), copy.deepcopy(t_model)
    with torch.no_grad():
        for _, layer in tcnn.gpsa_layers(ema):
            layer.gating.fill_(-3.0)  # gate sigmoid(-3) = 0.047 in every head
        for model, cls in ((raw, 1), (ema, 0)):  # a head that always predicts class `cls`
            model.fc.weight.zero_()
            model.fc.bias.copy_(torch.nn.functional.one_hot(torch.tensor(cls), 10).float())
    path = str(tmp_path / 'best.pt')
    run_folder.write_checkpoint(run_folder.make_checkpoint(raw, ema=ema.state_dict(), epoch=2), path)
    assert main(['info', path, '--use-ema']) == 0
    out = capsys.readouterr().out
    assert '0.047 [0.047-0.047]' in out and 'weights ema' in out
    assert main(['info', path]) == 0 and '0.047 [0.047-0.047]' not in capsys.readouterr().out
    assert main(['inspect', path, '--use-ema', '--out', str(tmp_path / 'inspect')]) == 0
    summary = json.loads((tmp_path / 'inspect' / 'summary.json').read_text())
    assert summary['weights'] == 'ema'
    assert all(g == pytest.approx(0.0474, abs=1e-4) for layer in summary['layers'].values() for g in layer['gate'])
    capsys.readouterr()
    from PIL import Image
    for k, cls in enumerate('abcdefghij'):  # the model's 10 classes: 3 images of class a, 1 of each other class
        os.makedirs(tmp_path / 'val' / cls)
        for i in range(3 if cls == 'a' else 1):
            Image.new('RGB', (8, 8), (40 * k, 90, 20 * i)).save(tmp_path / 'val' / cls / f'{i}.png')
    scores = {}
    for flags in (['--use-ema'], []):
        out_json = tmp_path / f'res{len(flags)}.json'
        rc = main(['eval', path, *flags, '--suite', 'imagenet', '--data', str(tmp_path / 'val'), '--img-size', '32',
                   '--workers', '0', '--no-progress', '--out', str(out_json)])
        result = json.loads(out_json.read_text())
        assert rc == 0 and result['models']['best'].get('weights') == ('ema' if flags else None)
        (scores[len(flags)],) = result['suites']['imagenet']['results'].values()
    assert scores[1]['top1'] == pytest.approx(100 * 3 / 12)  # the EMA's head: always class a
    assert scores[0]['top1'] == pytest.approx(100 * 1 / 12)  # the model's head: always class b
    capsys.readouterr()
    raw_file = tcnn.save(t_model, str(tmp_path / 't.pt'))
    for argv in (['info', raw_file, '--use-ema'], ['inspect', raw_file, '--use-ema', '--out', str(tmp_path / 'x')],
                 ['eval', 'resnet18d', '--use-ema', '--suite', 'imagenet', '--data', str(tmp_path / 'val')]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and 'EMA weights' in err[0], err
