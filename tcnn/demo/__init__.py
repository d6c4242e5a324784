"""``tcnn demo``: the whole method end to end, offline, in miniature (T-CNN, arXiv:2106.05795).

1. **Data**: ``tcnn.demo.synthetic`` writes an odd-colour-out task (train / val / test ImageFolders and an
   ImageNet-C-style ``test-c``) from a fixed seed.
2. **The "pretrained" CNN**, one per seed: ``demo_resnet10`` (timm's ``ResNet`` class, see ``tcnn.demo.cnn``) trained
   from scratch on it with ``tcnn train --no-pretrained --no-sa``.
3. **The method**, from the seed's CNN, with the same epochs and data: (a) ``no-sa``: the CNN fine-tuned
   without self-attention (T-CNN Table 1's baseline); (b) ``t-cnn``: ``tcnn.reparameterize`` (verified) and the
   fine-tuning recipe (AdamW, warm-up + cosine, gating lr, init alpha = lambda = 1); (c) ``t-cnn-late``: the CNN
   fine-tuned for part of the epochs, then reparameterised (Table 3), where the plan has it.
4. **Evaluation and analysis**: ``tcnn eval`` on the test split and ``test-c``, gates / spans / nonlocality of every
   T-CNN (``tcnn.analysis.heads``), the figures (Fig. 3, 4 and 5 of the paper in miniature), ``results.json`` and a
   ``README.md`` that says what the numbers mean, whatever their sign, and how far they lie from the distribution
   documented for the plan (``tcnn.demo.reference``, measured over many full-pipeline seeds).

A seed varies the whole pipeline on the one dataset (the CNN's init, data order and augmentation, then the
fine-tuning's and the GPSA layers' query/key init), so the spread over seeds includes the start point: what
another machine's torch build changes first.

Every step goes through the project's public code paths (the ``tcnn`` command's ``train`` and ``eval``, ``tcnn.load``,
``tcnn.save``, ``tcnn.reparameterize``, ``tcnn.analysis.heads``, ``tcnn.evaluation.plots``), so the demo is also
their end-to-end check. Training runs are ``tcnn train`` processes, several at once on a CPU (see
``tcnn.demo.pool``). An interrupted demo continues where it stopped when the same command is run again (every
training run resumes from its ``last.pt``).

The modules, in the order a demo uses them: ``plan`` (sizes, schedules, arms, the changes from the paper's recipe),
``synthetic`` (the data), ``pool`` (the ``tcnn train`` processes), ``results`` (evaluation, analysis, figures and
``results.json``), ``reference`` (the documented distribution), ``report`` (the verdict and ``README.md``) and
``runner`` (``run_demo``, which runs them in turn).

``run_demo`` and ``DemoStopped`` load on first use (PEP 562), so that importing one light module of this package
(e.g. ``tcnn.demo.synthetic``) does not import the demo's runner and everything it needs.
"""
import importlib
from typing import Any

__all__ = ['run_demo', 'DemoStopped']
_HOMES = {'run_demo': 'runner', 'DemoStopped': 'pool'}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f'{__name__}.{_HOMES[name]}'), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
