"""Tests of ``--compile [MODE]`` (issue 22): ``tcnn train`` and ``tcnn eval`` under ``torch.compile`` modes, the
recipe key, checkpoints and resume. CPU only: ``reduce-overhead`` compiles without CUDA graphs here, so these check
what the CPU can (a CUDA-graph step is marked before every compiled forward and only
there, evaluation's last smaller batch runs eagerly, checkpoints hold the raw model, a compiled run resumes exactly,
compiled evaluation scores as eager does); tests/test_cuda.py runs the CUDA graphs themselves."""
import argparse
import json

import pytest
import torch
import torch.nn as nn
from torch._dynamo.utils import counters

import tcnn
from tcnn.runtime import compiling
import tcnn.evaluation.scoring
from tcnn.train import launch
from tcnn.cli import main
from tcnn.errors import TcnnError
from tcnn.train.recipe import Recipe, resolve_recipe
from tcnn.train.args import add_arguments
from tcnn.train.resume import resumed_recipe

from helpers import rel_err
from test_train import assert_same_weights, common, evaluate_checkpoint, interrupt_in_epoch, load, metrics

pytestmark = pytest.mark.usefixtures('one_thread')  # small models on a shared 2-core machine (conftest.py)

BATCH = 8  # 24 training images: 3 updates an epoch; 12 validation images: a full batch of 8 and a last batch of 4


def count_step_marks(monkeypatch) -> list:
    """A list that grows by one at each CUDA-graph step mark (``torch.compiler.cudagraph_mark_step_begin``, which
    still runs: on a CPU it only counts steps)."""
    calls = []
    original = torch.compiler.cudagraph_mark_step_begin
    monkeypatch.setattr(torch.compiler, 'cudagraph_mark_step_begin', lambda: (calls.append(1), original())[1])
    return calls


@pytest.fixture
def step_marks(monkeypatch):
    return count_step_marks(monkeypatch)


def compiled_run(data_dir, output, epochs=2, mode='reduce-overhead'):
    # resnet10t: what is checked (step marks, exact resume, the raw model saved) does not depend on the depth, and
    # its graph compiles in about half resnet18d's time
    return common(data_dir, output, epochs=epochs) + ['--batch-size', str(BATCH), '--compile', mode,
                                                      '--model', 'resnet10t']


# ------------------------------------------------------------------------------------------------ modes


def test_compile_setting_reads_true_as_default_and_names_the_modes():
    assert compiling.compile_mode(True) == 'default' and compiling.compile_mode(False) is None
    assert compiling.compile_mode(None) is None and compiling.compile_mode('max-autotune') == 'max-autotune'
    for bad in ('fast', 1, 'Default'):
        with pytest.raises(TcnnError, match='default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs'):
            compiling.compile_mode(bad)
    assert [m for m in compiling.COMPILE_MODES if compiling.uses_cuda_graphs(m)] == ['reduce-overhead',
                                                                                      'max-autotune']
    # recipes and checkpoints written before modes existed hold `compile: true`: the default mode
    assert resolve_recipe(sets=['compile=true']).compile == 'default'
    assert resolve_recipe(flags={'compile': 'reduce-overhead'}).compile == 'reduce-overhead'
    assert resolve_recipe().compile is False
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(['--compile']).compile == 'default'  # the bare flag, as before modes existed
    old = {'config': dict(Recipe().to_dict(), compile=True, num_classes=3)}
    assert resumed_recipe(parser.parse_args([]), old, '/runs/x/last.pt').compile == 'default'


@pytest.mark.parametrize('command', [['train', '--data', 'nowhere'],
                                     ['eval', 'missing.pt', '--suite', 'imagenet', '--data', 'nowhere']])
def test_a_bad_mode_is_a_one_line_error(command, capsys):
    assert main([*command, '--compile', 'fast']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f'tcnn {command[0]}: error: --compile') and "got 'fast'" in err[0]
    assert 'reduce-overhead, max-autotune, max-autotune-no-cudagraphs' in err[0]


def test_compiled_forward_runs_other_batch_sizes_eagerly(step_marks):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 5)).eval()
    forward = compiling.CompiledForward(model, 'reduce-overhead', batch_size=4)
    assert forward.eval() is forward and not model.training
    counters.clear()
    x = torch.randn(6, 3, 16, 16)
    with torch.no_grad():
        full, rest = forward(x[:4]), forward(x[4:])
        graphs = counters['stats']['unique_graphs']
        assert forward(x[:4]).equal(full)  # the compiled graph again: no recompilation
        assert graphs == counters['stats']['unique_graphs'] == 1  # the batch of 2 compiled nothing
        torch.testing.assert_close(torch.cat([full, rest]), model(x), rtol=1e-5, atol=1e-6)
    assert len(step_marks) == 2  # one step per compiled call, none for the eager batch


# ------------------------------------------------------------------------------------------------ tcnn train / eval


@pytest.fixture(scope='module')
def compiled_runs(data_dir, tmp_path_factory):
    """A 2-epoch ``--compile reduce-overhead`` run, and the same run stopped in epoch 2 and resumed; the step marks
    of the uninterrupted one."""
    root = tmp_path_factory.mktemp('compiled')
    with pytest.MonkeyPatch.context() as mp:
        marks = count_step_marks(mp)
        assert launch.main(compiled_run(data_dir, root / 'whole')) == 0
    with pytest.MonkeyPatch.context() as mp:
        interrupt_in_epoch(mp, epoch=1)
        assert launch.main(compiled_run(data_dir, root / 'resumed')) == 130
    assert launch.main(['--resume', str(root / 'resumed'), '--no-progress']) == 0
    return root, len(marks)


def test_compiled_training_resumes_exactly_and_saves_the_raw_model(compiled_runs, data_dir):
    root, marks = compiled_runs
    # a step per training update (3 an epoch) and per full validation batch (1 of 2), in each of 2 epochs
    assert marks == 2 * (3 + 1)
    whole, resumed = load(str(root / 'whole' / 'last.pt')), load(str(root / 'resumed' / 'last.pt'))
    assert whole['config']['compile'] == resumed['config']['compile'] == 'reduce-overhead'
    assert_same_weights(whole, resumed)
    assert [r['val_loss'] for r in metrics(root / 'whole')] == [r['val_loss'] for r in metrics(root / 'resumed')]
    state = whole['model_file']['state_dict']
    assert not any('_orig_mod' in k or k.startswith('module.') for k in state)
    # the checkpoint loads into an uncompiled model, which validates as the compiled run reported
    model = tcnn.load(str(root / 'whole' / 'last.pt'))
    assert len(tcnn.gpsa_layers(model)) == 2 and not hasattr(model, '_orig_mod')  # resnet10t's layer4.0
    eager = evaluate_checkpoint(root / 'whole' / 'last.pt')
    row = metrics(root / 'whole')[-1]
    assert eager['val_top1'] == row['val_top1'] and eager['val_images'] == row['val_images'] == 12
    assert eager['val_loss'] == pytest.approx(row['val_loss'], rel=1e-4)


def test_compiled_eval_scores_as_eager(compiled_runs, data_dir, tmp_path, capsys, step_marks, monkeypatch):
    root, _ = compiled_runs
    results, logits = {}, {}
    accumulate = tcnn.evaluation.scoring._accumulate

    def recording(counts, batch_logits, *args):  # the logits each evaluation scores, in order
        logits[current].append(batch_logits.detach().clone())
        return accumulate(counts, batch_logits, *args)

    monkeypatch.setattr(tcnn.evaluation.scoring, '_accumulate', recording)
    for flags in ([], ['--compile', 'reduce-overhead']):
        current = len(flags)
        logits[current] = []
        out = tmp_path / f'{len(flags)}' / 'results.json'
        # --img-size 64: the training size, whose compiled graph this process has already (the test size is 288 px)
        rc = main(['eval', str(root / 'whole' / 'last.pt'), '--suite', 'imagenet', '--data', f'{data_dir}/val',
                   '--img-size', '64', '--workers', '0', '--batch-size', str(BATCH), '--no-progress', '--device', 'cpu',
                   *flags, '--out', str(out)])
        assert rc == 0, capsys.readouterr().err
        (results[len(flags)],) = json.loads(out.read_text())['suites']['imagenet']['results'].values()
    assert results[2]['num_images'] == results[0]['num_images'] == 12
    assert (results[2]['top1'], results[2]['top5']) == (results[0]['top1'], results[0]['top5'])
    # the scores above move in steps of 8.3 points: the logits themselves are the compiled model's, equal to eager
    compiled, eager = torch.cat(logits[2]), torch.cat(logits[0])
    assert compiled.shape == eager.shape == (12, eager.shape[1])
    assert rel_err(compiled, eager) < 1e-5
    assert len(step_marks) == 1  # the compiled run's full batch; its last batch of 4 ran eagerly
