"""The demo's plan: its sizes and schedules (``PLANS``), its arms, the names of its runs, and every change from
the paper's fine-tuning recipe (T-CNN section 3, Table 1) that the miniature makes, with why.
"""
import dataclasses
from typing import Any, Dict, List, Optional

from .synthetic import OddColour

__all__ = ['Plan', 'PLANS', 'PAPER_FINETUNE_EPOCHS', 'PRETRAIN_EPOCHS', 'ARMS', 'ARM_TITLES', 'CNN', 'SHIPPED',
           'SCRATCH', 'DEMO_FORMAT', 'DEMO_VERSION', 'DATA_SEED', 'IMG_SIZE', 'recipe_changes', 'warmup_epochs',
           'run_name']


DEMO_FORMAT = 'tcnn-demo'
# 3: the fine-tuning starts from converged CNNs shipped with tcnn (tcnn/demo/cnns) unless told to train them; 2: one
# CNN per seed trained from scratch for 14 epochs (mid-climb); 1: one CNN for every seed (runs/cnn)
DEMO_VERSION = 3
DATA_SEED = 0  # one dataset for every seed: a seed varies the rest of the pipeline, the CNN's training included
CNN = 'cnn'  # the arm name of the CNN trained from scratch (the start point of the seed's fine-tuning arms)
ARMS = ('no-sa', 't-cnn', 't-cnn-late')  # the fine-tuning arms
ARM_TITLES = {CNN: 'CNN (start point, converged)', 'no-sa': 'CNN fine-tuned, no SA', 't-cnn': 'T-CNN',
              't-cnn-late': 'T-CNN, late reparam.'}
IMG_SIZE = 96
SHIPPED = 'shipped'  # the plan's CNNs are the converged ones tcnn ships (tcnn.demo.shipped)
SCRATCH = 'scratch'  # the plan trains its CNNs from scratch (tcnn demo --train-cnns; how the shipped ones were made)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Sizes and schedule of a demo (``PLANS``). Epoch counts are those of the miniature, see ``recipe_changes``.

    Args:
        name: ``default``, ``quick``, ``paper`` (the paper's 50 fine-tuning epochs, a GPU's job) or ``tiny`` (the test
            suite's).
        train: Training images (balanced over the classes).
        val: Validation images (the model-selection split: the demo's settings were chosen on it).
        test: Test images (reported, never used to choose anything).
        corrupt: Test images that get corrupted copies (every corruption, 5 severities).
        pretrain_epochs: Epochs of a CNN trained from scratch (``cnns='scratch'``; how the shipped CNNs were made).
        finetune_epochs: Epochs of every fine-tuning arm.
        late_epoch: Arm (c) is reparameterised after this many of its fine-tuning epochs (None: no arm (c)).
        seeds: Seeds (0 .. seeds - 1): seed S fine-tunes CNN S (its own init, data order and augmentation).
        cnns: ``'shipped'``: the converged CNNs tcnn ships, trained with ``cnns='scratch'`` on this plan's data
            (``tcnn.demo.shipped``; the paper fine-tunes pretrained CNNs); ``'scratch'``: train them here.
        num_objects: Shapes per image of the odd-colour task (one colour seen once, the others in pairs or more).
        min_distance: Least distance between shape centres, in image widths.
        batch_size: Images per update.
        pretrain_lr: Peak lr of a CNN's training from scratch.
        lr: Peak lr of the fine-tuning arms.
        gating_lr: Peak lr of the gating parameters (T-CNN arms).
        inspect_images: Test images whose attention maps are drawn (Fig. 5).
        nonlocality_images: Test images the nonlocality is averaged over.
    """
    name: str
    train: int
    val: int
    test: int
    corrupt: int
    pretrain_epochs: int
    finetune_epochs: int
    late_epoch: Optional[int]
    seeds: int
    cnns: str = SHIPPED
    num_objects: int = 5
    min_distance: float = 0.25
    batch_size: int = 64
    pretrain_lr: float = 5e-3
    lr: float = 1e-3
    gating_lr: float = 0.1
    inspect_images: int = 3
    nonlocality_images: int = 256

    @property
    def arms(self) -> List[str]:
        return [a for a in ARMS if a != 't-cnn-late' or self.late_epoch is not None]

    def task(self) -> OddColour:
        """The generated task of the plan's data."""
        return OddColour(img_size=IMG_SIZE, num_objects=self.num_objects, min_distance=self.min_distance)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


PAPER_FINETUNE_EPOCHS = 50  # T-CNN section 3 (Table 1): 50 fine-tuning epochs, 5 of them warm-up
# The CNNs' schedule from scratch: long enough for every shipped CNN to reach its plateau (tcnn.demo.shipped's record)
PRETRAIN_EPOCHS = 50

PLANS: Dict[str, Plan] = {
    'default': Plan('default', train=2000, val=1000, test=1000, corrupt=300, pretrain_epochs=PRETRAIN_EPOCHS,
                    finetune_epochs=10, late_epoch=None, seeds=5),
    # the default's first CNN fine-tuned briefly on the first images of its data: a smoke run (its trajectory is
    # pinned by tests/test_demo_record.py)
    'quick': Plan('quick', train=600, val=300, test=300, corrupt=60, pretrain_epochs=PRETRAIN_EPOCHS,
                  finetune_epochs=2, late_epoch=None, seeds=1, inspect_images=1, nonlocality_images=64),
    # The paper's fine-tuning schedule from the same converged CNNs, a GPU's job (benchmarks/gpu/6_paper_demo.sh): 50
    # epochs with 5 of warm-up, the late arm reparameterised half-way; 3 seeds.
    'paper': Plan('paper', train=2000, val=1000, test=1000, corrupt=300, pretrain_epochs=PRETRAIN_EPOCHS,
                  finetune_epochs=PAPER_FINETUNE_EPOCHS, late_epoch=PAPER_FINETUNE_EPOCHS // 2, seeds=3),
    'tiny': Plan('tiny', train=96, val=24, test=24, corrupt=6, pretrain_epochs=1, finetune_epochs=2, late_epoch=1,
                 seeds=2, cnns=SCRATCH, batch_size=16, inspect_images=1, nonlocality_images=8),
}


def recipe_changes(plan: Plan) -> List[str]:
    """Every change from the paper's fine-tuning recipe (T-CNN section 3, Table 1), and why."""
    if plan.finetune_epochs == PAPER_FINETUNE_EPOCHS:
        epochs = (f'epochs: {plan.finetune_epochs} with {warmup_epochs(plan.finetune_epochs)} of warm-up, as the '
                  f'paper\'s, from CNNs trained from scratch for {plan.pretrain_epochs} epochs to their plateau '
                  '(checked in the report)')
    else:
        epochs = (f'epochs: {plan.finetune_epochs} instead of 50, warm-up scaled with them (5 of 50 -> '
                  f'{warmup_epochs(plan.finetune_epochs)} of {plan.finetune_epochs}): a miniature that fits minutes on '
                  '2 CPU cores')
    return [
        epochs,
        f'batch: {plan.batch_size} instead of 1024, learning rates not scaled by the batch rule (scale_lr false)',
        f'lr: {plan.lr:g} instead of 1e-4 (at batch 1024): a small CNN on a small task instead of a ResNet on '
        f'ImageNet; gating lr: {plan.gating_lr:g}, as the paper\'s, unscaled',
        'augmentation: no RandAugment (its translations push shapes out of the image, its colour ops change the '
        'colours that are the labels), no mixup or cutmix (a blend or a pasted patch changes which shape is the odd '
        'one), no random erasing (it can erase a shape), no random '
        'resized crop (scale [1, 1]: a crop can cut a shape off); instead, timm\'s colour jitter 0.3 (brightness, '
        'contrast, saturation: no hue change) and horizontal flips; kept: label smoothing 0.1, weight decay 0.05',
        'model: demo_resnet10 (timm ResNet, one BasicBlock per stage, 1/4 of ResNet-18\'s widths, output stride 16: a '
        '6x6 last-stage token grid at 96 px) trained from scratch on the task instead of a ResNet-RS/-D pretrained on '
        'ImageNet; its layer4 has 2 3x3 convs (BasicBlock) instead of one per bottleneck block',
        'no stochastic depth (drop_path 0) and no EMA, as in the paper\'s ResNet-50 settings',
    ]


def warmup_epochs(epochs: int) -> int:
    """The paper's 5 warm-up epochs of 50, kept as a fraction, at least one epoch (none for a 1-epoch run)."""
    return 0 if epochs < 2 else max(1, round(epochs / 10))


def run_name(seed: int, arm: str) -> str:
    """``seed0-cnn``, ``seed0-t-cnn``, ...: the name of a run, its folder under ``runs/`` and its model file."""
    return f'seed{seed}-{arm}'
