"""A T-CNN trained with Lightning: the paper's parameter groups under Lightning's scheduler stepping and its
``LearningRateMonitor`` (which logs each group under its ``name``), resuming from a Lightning checkpoint, and
Lightning checkpoints read by ``tcnn convert`` and ``tcnn.load`` (keys under the ``LightningModule``'s attribute,
``model.conv1.0.weight``). Real Lightning files, written by ``Trainer``; runs only where ``lightning`` is installed
(the ``test`` extra)."""
import csv
import math
import warnings

import pytest
import timm
import torch

import tcnn
from tcnn.cli import main
from tcnn.errors import TcnnError

from nontrivial import nontrivial

pytestmark = pytest.mark.usefixtures('one_thread')  # small models on a shared 2-core machine (conftest.py)

L = pytest.importorskip('lightning', reason="lightning is not installed (pip install lightning; in tcnn's test extra)")

LR, WD, STEPS = 1e-4, 0.05, 4


class Classifier(L.LightningModule):
    """What a Lightning user writes around a timm model: ``self.model``, the paper's groups and a OneCycleLR with
    docs/train.md's per-group ``max_lr``."""

    def __init__(self, model: torch.nn.Module, total_steps: int = 2 * STEPS):
        super().__init__()
        self.model, self.total_steps = model, total_steps

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.model(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(tcnn.param_groups(self.model, lr=LR, weight_decay=WD))
        peaks = [g['lr'] for g in optimizer.param_groups]
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=peaks, total_steps=self.total_steps)
        return {'optimizer': optimizer, 'lr_scheduler': {'scheduler': scheduler, 'interval': 'step'}}


def _data():
    gen = torch.Generator().manual_seed(0)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    data = torch.utils.data.TensorDataset(torch.randn(8, 3, 64, 64, generator=gen), labels)
    return torch.utils.data.DataLoader(data, batch_size=2)


def _fit(module, root, max_steps, ckpt_path=None, monitor=True):
    trainer = L.Trainer(accelerator='cpu', devices=1, max_steps=max_steps, default_root_dir=root,
                        logger=L.pytorch.loggers.CSVLogger(root, name='logs'), log_every_n_steps=1,
                        callbacks=[L.pytorch.callbacks.LearningRateMonitor('step')] if monitor else [],
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # Lightning's advice on num_workers, on the small dataset, ...
        trainer.fit(module, _data(), ckpt_path=ckpt_path)
    return trainer


def _t_resnet():
    torch.manual_seed(0)
    return nontrivial(timm.create_model('t_resnet18d', num_classes=3))


def _cnn():
    torch.manual_seed(0)
    return nontrivial(timm.create_model('resnet18d', num_classes=3))


@pytest.fixture(scope='module')
def t_run(tmp_path_factory):
    """A T-CNN trained 4 steps under Lightning: its module, the trainer and the checkpoint Lightning wrote."""
    root = tmp_path_factory.mktemp('lightning_t')
    module = Classifier(_t_resnet())
    trainer = _fit(module, str(root), STEPS)
    path = str(root / 'last.ckpt')
    trainer.save_checkpoint(path)
    return module, trainer, path


@pytest.fixture(scope='module')
def cnn_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp('lightning_cnn')
    module = Classifier(_cnn())
    trainer = _fit(module, str(root), 1, monitor=False)
    path = str(root / 'cnn.ckpt')
    trainer.save_checkpoint(path)
    return module.model.eval(), path


def test_learning_rate_monitor_logs_the_named_groups_at_the_papers_ratio(t_run):
    """Lightning steps the OneCycleLR every update; its LearningRateMonitor reads each group's ``name``: the gates
    are logged as ``gating`` (not ``pg3``), at 1000x the base lr at every step."""
    _, trainer, _ = t_run
    with open(f'{trainer.logger.log_dir}/metrics.csv') as f:
        rows = [r for r in csv.DictReader(f) if r.get('lr-AdamW/gating')]
    assert {'lr-AdamW/decay', 'lr-AdamW/no_decay', 'lr-AdamW/gating'} <= set(rows[0])
    assert not any(k.startswith('lr-AdamW/pg') for k in rows[0])
    assert len(rows) == STEPS
    lrs = [float(r['lr-AdamW/decay']) for r in rows]
    assert len(set(lrs)) == STEPS  # the schedule moved the lr at every step
    for row in rows:
        assert math.isclose(float(row['lr-AdamW/gating']), 1000 * float(row['lr-AdamW/decay']), rel_tol=1e-6)
        assert float(row['lr-AdamW/no_decay']) == float(row['lr-AdamW/decay'])


def test_resume_from_a_lightning_checkpoint_keeps_the_groups(t_run, tmp_path):
    """The checkpoint holds the optimiser's groups with their names (read with weights_only=True); Lightning resumes
    from it, the names and the ratio intact."""
    _, _, path = t_run
    saved = torch.load(path, weights_only=True)
    assert [g['name'] for g in saved['optimizer_states'][0]['param_groups']] == ['decay', 'no_decay', 'gating']
    module = Classifier(_t_resnet())
    trainer = _fit(module, str(tmp_path), STEPS + 2, ckpt_path=path)
    assert trainer.global_step == STEPS + 2
    groups = trainer.optimizers[0].param_groups
    assert [g['name'] for g in groups] == ['decay', 'no_decay', 'gating']
    assert math.isclose(groups[2]['lr'], 1000 * groups[0]['lr'], rel_tol=1e-9)


def test_tcnn_convert_reads_a_lightning_checkpoint_of_a_cnn(cnn_checkpoint, tmp_path, capsys):
    """``model.conv1.0.weight``...: the prefix that every key shares is removed since without it they are exactly
    resnet18d's keys; the T-CNN holds the checkpoint's weights (exact configuration: the CNN's logits)."""
    cnn, path = cnn_checkpoint
    assert all(k.startswith('model.') for k in torch.load(path, weights_only=True)['state_dict'])
    out = str(tmp_path / 't.pt')
    rc = main(['convert', 'resnet18d', '--weights', path, '--out', out, '--img-size', '64',
               '--locality-strength', '50', '--gating-init', '25'])
    assert rc == 0, capsys.readouterr().err
    t_model = tcnn.load(out)
    assert t_model.fc.out_features == 3  # the checkpoint's head, found under the prefix
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        # the exact configuration up to float32 rounding: max abs difference measured 6.0e-7 (logits of order 1)
        torch.testing.assert_close(t_model(x), cnn(x), rtol=0, atol=3e-6)
    torch.testing.assert_close(t_model.layer4[0].conv2.conv_filter(), cnn.layer4[0].conv2.weight, rtol=0, atol=0)
    model = tcnn.files.sources.create_cnn('resnet18d', weights=path)  # tcnn's Python path: the same weights
    for (k, v), (k2, v2) in zip(model.state_dict().items(), cnn.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k


def test_tcnn_convert_and_load_of_a_lightning_checkpoint_of_a_t_cnn(t_run, tmp_path, capsys):
    """A trained T-CNN's Lightning checkpoint: ``tcnn.load`` cannot know its architecture and says which command
    makes a T-CNN file of it; that command then loads every tensor strictly."""
    module, _, path = t_run
    with pytest.raises(TcnnError) as e:
        tcnn.load(path)
    assert 'is a Lightning checkpoint' in str(e.value) and f'`tcnn convert t_MODEL --weights {path}' in str(e.value)
    out = str(tmp_path / 't.pt')
    assert main(['convert', 't_resnet18d', '--weights', path, '--out', out]) == 0, capsys.readouterr().err
    loaded = tcnn.load(out)
    for k, v in module.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


@pytest.mark.filterwarnings('ignore:.*holds no classifier head')  # keys not stripped: no head found either
def test_a_prefix_is_removed_only_when_the_keys_are_then_the_models(cnn_checkpoint, tmp_path, capsys):
    """Strict: the prefix comes off only when every key has it and the rest is MODEL's; otherwise one line names
    the prefix, and nothing is loaded."""
    _, path = cnn_checkpoint
    ckpt = torch.load(path, weights_only=True)
    # another model's weights under the same prefix: resnet34d has layers resnet18d lacks
    other = dict(ckpt, state_dict={f'model.{k}': v for k, v in
                                   timm.create_model('resnet34d', num_classes=3).state_dict().items()})
    torch.save(other, tmp_path / 'other.ckpt')
    rc = main(['convert', 'resnet18d', '--weights', str(tmp_path / 'other.ckpt'), '--out', str(tmp_path / 'o.pt'),
               '--img-size', '64'])
    err = capsys.readouterr().err
    assert rc != 0 and "after removing the prefix 'model.'" in err and 'unexpected' in err and 'Traceback' not in err
    # keys with nothing of resnet18d's even without the prefix
    junk = dict(ckpt, state_dict={f'model.{k}': v for k, v in torch.nn.Linear(2, 2).state_dict().items()})
    torch.save(junk, tmp_path / 'junk.ckpt')
    rc = main(['convert', 'resnet18d', '--weights', str(tmp_path / 'junk.ckpt'), '--out', str(tmp_path / 'j.pt'),
               '--img-size', '64'])
    err = capsys.readouterr().err
    assert rc != 0 and "every key starts with 'model.'" in err and len(err.strip().splitlines()) == 1
    # not every key under the prefix (a loss's weights beside the model): nothing is removed
    mixed = dict(ckpt, state_dict=dict(ckpt['state_dict'], **{'loss_fn.weight': torch.ones(3)}))
    torch.save(mixed, tmp_path / 'mixed.ckpt')
    rc = main(['convert', 'resnet18d', '--weights', str(tmp_path / 'mixed.ckpt'), '--out', str(tmp_path / 'm.pt'),
               '--img-size', '64'])
    err = capsys.readouterr().err
    assert rc != 0 and 'does not fit resnet18d' in err and 'model.conv1' in err
    assert not any(p.name.endswith('.pt') for p in tmp_path.iterdir())
