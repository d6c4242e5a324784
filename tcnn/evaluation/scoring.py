"""Evaluating classifiers on the suites of ``tcnn.evaluation.suites``: the loop over the images, top-1 and top-5
counted on the device, and each suite's results (ImageNet-C: per corruption, severity and category, and the mCE).

Several models can be evaluated at once (``evaluate({'A': a, 'B': b}, ...)``): models sharing a data config share
one pass over the images, which is what dominates the cost of ImageNet-C (3.75 M images).
"""
import dataclasses
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
from PIL import Image
from timm.data import create_transform
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from ..data.config import check_image_options
from ..errors import InvalidArgumentError, InvalidTypeError, TcnnError, check_module, check_number
from ..files.integrity import nonfinite_output_error
from ..runtime.compiling import CompiledForward, compile_mode
from ..runtime.devices import resolve_device
from ..runtime.precision import AMP_BARE, AMP_MODES, amp_dtype
from .suites import (ALEXNET_ERRORS, BENCHMARK_CORRUPTIONS, CORRUPTION_CATEGORIES, EXTRA_CORRUPTIONS, RELEASE_IMAGES,
                     SEVERITIES, LabelSpace, Resolution, SuiteData, check_suite, eval_data_config, image_counts,
                     label_space, num_outputs, resolution_policy, scan_suite)

__all__ = ['evaluate']


# ---------------------------------------------------------------------- evaluation


class _Images(Dataset):
    def __init__(self, data: SuiteData, transform):
        self.data = data
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        path = self.data.path(i)
        try:
            with Image.open(path) as img:
                x = self.transform(img.convert('RGB'))
        except OSError as e:
            raise TcnnError(f'cannot read image {path}: {e}') from e
        return x, int(self.data.targets[i]), int(self.data.group_ids[i])


def _config_key(cfg: Mapping[str, Any]) -> str:
    return json.dumps(cfg, sort_keys=True, default=str)


def _worker_error(e: Exception) -> TcnnError:
    """One line out of an error re-raised from a DataLoader worker (whose message holds the worker traceback)."""
    last = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
    return TcnnError(last.split('TcnnError: ', 1)[-1])


@torch.no_grad()
def evaluate(
        models: Mapping[str, nn.Module],
        suite: str,
        root: str,
        *,
        img_size: Optional[Union[int, Tuple[int, int]]] = None,
        crop_pct: Optional[float] = None,
        resolution: Resolution = None,
        batch_size: int = 64,
        workers: Optional[int] = None,
        device: Optional[str] = None,
        amp: Union[bool, str] = False,
        progress: bool = True,
        data: Optional[SuiteData] = None,
        compile: Optional[str] = None,
) -> Dict[str, Dict[str, Any]]:
    """Evaluate one or several classifiers on a suite (the models are moved to ``device`` and put in eval mode).

    Args:
        models: Name -> model (a T-CNN, a CNN, any ImageNet-style classifier).
        suite: ``'imagenet'``, ``'imagenet-c'``, ``'imagenet-a'`` or ``'imagenet-r'``.
        root: The suite's data directory.
        img_size: Input size in pixels for every model, N or (H, W) (an explicit ask, also for ImageNet-C).
        crop_pct: Centre-crop fraction; default the model's test crop (1.0 for ImageNet-C).
        resolution: Instead of ``img_size``, the policy: ``'test'`` (default; ImageNet-C: 224 px) or ``'model'``
            (see ``tcnn.evaluation.suites.eval_data_config``), or a size in pixels (N or (H, W)).
        batch_size: Images per batch.
        workers: DataLoader worker processes; default ``min(8, cpu count)``.
        device: ``'cuda'``, ``'cpu'``, ...; default CUDA when available.
        amp: Mixed precision, a mode of ``tcnn.runtime.precision.AMP_MODES`` (``tcnn eval --amp``): ``'auto'``,
            ``'bf16'``, ``'fp16'`` (GPU) or ``'none'``; True is ``'bf16'``, False ``'none'``.
        progress: Show tqdm progress bars.
        data: A ``scan_suite`` result to reuse (the folder is scanned otherwise).
        compile: A ``torch.compile`` mode (``tcnn.runtime.compiling.COMPILE_MODES``) for the full batches of each model;
            None: eager.

    Returns:
        Per model name, the suite's results (see ``docs/analysis.md``): ``top1``/``top5`` (%), ``num_images``,
        ``img_size`` and ``crop_pct`` (what the model ran at), ``partial`` (a marker such as ``'(3/15 corruptions)'``
        or ``'(120 of 7500 images)'``, None for a full run); for ImageNet-C also ``corruptions``, ``categories``,
        ``severities``, ``mce``, ``complete`` and ``image_counts``; for ImageNet-A/R ``complete``.

    Raises:
        tcnn.files.integrity.NonFiniteOutputError: A model computed NaN or infinite logits (no accuracy is reported from
            them): the message names the model's parameters that hold non-finite values, if any.
    """

    # every argument before the folder scan and the first batch: a mistake costs no pass over the data
    if not isinstance(models, Mapping):
        raise InvalidTypeError(f'models must be a dict of name -> model, got {type(models).__name__}')
    if not models:
        raise InvalidArgumentError('models is empty: no model to evaluate')
    for name, model in models.items():
        check_module(model, f'models[{name!r}]')
    check_suite(suite)
    check_image_options(img_size, crop_pct)
    resolution_policy(suite, resolution, img_size)
    check_number(batch_size, 'batch_size', ge=1, integer=True)
    if workers is not None:
        check_number(workers, 'workers', ge=0, integer=True)
    compile = compile_mode(compile, 'compile')
    dev = resolve_device(device)
    mode = AMP_BARE if amp is True else 'none' if amp is False else amp
    if mode not in AMP_MODES:
        raise InvalidArgumentError(f'amp must be True, False or one of {", ".join(AMP_MODES)}, got {amp!r}')
    dtype = amp_dtype(mode, dev)
    data = data or scan_suite(suite, root)
    if data.suite != suite:
        raise InvalidArgumentError(f'data was scanned for {data.suite}, not {suite}')
    workers = min(8, os.cpu_count() or 1) if workers is None else workers
    configs, spaces = {}, {}
    for name, model in models.items():
        model.to(dev).eval()
        configs[name] = eval_data_config(model, suite, img_size, crop_pct, resolution)
        spaces[name] = label_space(suite, data.classes, num_outputs(model, configs[name]['input_size']))
        spaces[name] = dataclasses.replace(
            spaces[name], targets=spaces[name].targets.to(dev),
            subset=None if spaces[name].subset is None else spaces[name].subset.to(dev))
    forwards = {name: CompiledForward(model, compile, batch_size) if compile else model
                for name, model in models.items()}
    n_groups = len(data.groups)
    # per model and group: [images, top-1 correct, top-5 correct], kept on the device (no sync per batch)
    counts = {name: torch.zeros(n_groups, 3, dtype=torch.float64, device=dev) for name in models}
    # per model: images whose logits hold a NaN / an infinity / either (argmax of NaN is a silent class 0)
    nonfinite = {name: torch.zeros(3, dtype=torch.float64, device=dev) for name in models}
    passes: Dict[str, List[str]] = {}
    for name in models:  # models with the same data config share a pass over the images
        passes.setdefault(_config_key(configs[name]), []).append(name)
    for names in passes.values():
        cfg = configs[names[0]]
        loader = DataLoader(_Images(data, create_transform(**cfg, is_training=False)),
                            batch_size=batch_size, shuffle=False, num_workers=workers,
                            pin_memory=dev.type == 'cuda', persistent_workers=False)
        height, width = cfg['input_size'][-2:]
        desc = f'{suite} [{", ".join(names)}] {height if height == width else f"{height}x{width}"}px'
        try:
            for x, cls, group in tqdm(loader, desc=desc, disable=not progress, unit='batch', dynamic_ncols=True):
                x = x.to(dev, non_blocking=True)
                cls, group = cls.to(dev), group.to(dev)
                for name in names:
                    with torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                        logits = forwards[name](x)  # used before the next forward (CUDA graphs)
                    _accumulate(counts[name], logits.float(), cls, group, spaces[name], n_groups)
                    _count_nonfinite(nonfinite[name], logits)
        except Exception as e:
            # a TcnnError raised in a DataLoader worker comes back with the worker's traceback in its message
            worker = 'DataLoader worker' in str(e) and 'TcnnError' in str(e)
            if worker:
                raise _worker_error(e) from e
            raise
    for name, model in models.items():
        nan, inf, bad = (int(v) for v in nonfinite[name].tolist())
        if bad:
            raise nonfinite_output_error(name, model, bad, int(counts[name][:, 0].sum().item()), nan, inf)
    per_group = image_counts(data) if suite == 'imagenet-c' else None
    return {name: _results(data, counts[name].cpu(), spaces[name], configs[name], per_group) for name in models}


def _count_nonfinite(counts: torch.Tensor, logits: torch.Tensor) -> None:
    """Add the images whose logits hold a NaN, an infinity, either (on the device: no sync per batch)."""
    nan = logits.isnan().any(dim=1)
    inf = logits.isinf().any(dim=1)
    counts += torch.stack([nan.sum(), inf.sum(), (nan | inf).sum()]).double()


def _accumulate(counts: torch.Tensor, logits: torch.Tensor, cls: torch.Tensor, group: torch.Tensor,
                space: LabelSpace, n_groups: int) -> None:
    if space.subset is not None:
        logits = logits[:, space.subset]  # ImageNet-A/R: argmax over the 200 classes only
    target = space.targets[cls]
    top = logits.topk(min(5, logits.shape[1]), dim=1).indices
    hit = top == target[:, None]
    batch = torch.stack([
        torch.bincount(group, minlength=n_groups).double(),
        torch.bincount(group, weights=hit[:, 0].double(), minlength=n_groups),
        torch.bincount(group, weights=hit.any(dim=1).double(), minlength=n_groups),
    ], dim=1)
    counts += batch


# ---------------------------------------------------------------------- results


def _pct(correct: float, total: float) -> float:
    return 100.0 * correct / total


def _mean(values: Sequence[float]) -> Optional[float]:
    return float(np.mean(values)) if len(values) else None


def _results(data: SuiteData, counts: torch.Tensor, space: LabelSpace, cfg: Mapping[str, Any],
             per_group: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    top5_valid = space.num_labels > 5  # top-5 of 5 or fewer labels is always 100%
    height, width = cfg['input_size'][-2:]
    base = {'num_images': int(counts[:, 0].sum().item()), 'labels': space.mapping, 'num_labels': space.num_labels,
            'img_size': height if height == width else [height, width], 'crop_pct': cfg['crop_pct'],
            'data_config': {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}}
    if data.suite != 'imagenet-c':
        n, c1, c5 = counts.sum(0).tolist()
        out = {'top1': _pct(c1, n), 'top5': _pct(c5, n) if top5_valid else None, 'partial': None, **base}
        release = RELEASE_IMAGES.get(data.suite)
        if release is not None:  # ImageNet-A/R: a fixed release, a smaller folder is a subset
            out['complete'] = base['num_images'] == release
            out['partial'] = None if out['complete'] else f'({base["num_images"]} of {release} images)'
        return out
    return {**_imagenet_c_results(data, counts, top5_valid, per_group), **base}


def _imagenet_c_results(data: SuiteData, counts: torch.Tensor, top5_valid: bool,
                        per_group: Mapping[str, Any]) -> Dict[str, Any]:
    """Per corruption/severity top-1, Fig. 3's per-category and per-severity means, the mean, and the mCE."""
    per: Dict[str, Dict[str, Tuple[float, float]]] = {}
    for (corruption, severity), (n, c1, c5) in zip(data.groups, counts.tolist()):
        if n > 0:
            per.setdefault(corruption, {})[severity] = (_pct(c1, n), _pct(c5, n))
    benchmark = [c for c in BENCHMARK_CORRUPTIONS if c in per]
    # the summary covers the 15 benchmark corruptions; a folder of other corruptions only is summarised as it is
    summarized = benchmark or sorted(per)
    corruptions = {}
    for corruption in benchmark + sorted(set(per) - set(BENCHMARK_CORRUPTIONS)):
        sev = per[corruption]
        top1 = _mean([v[0] for v in sev.values()])
        entry = {
            'category': _category(corruption),
            'benchmark': corruption in BENCHMARK_CORRUPTIONS,
            'top1': top1,
            'top5': _mean([v[1] for v in sev.values()]) if top5_valid else None,
            'severities': {s: sev[s][0] for s in SEVERITIES if s in sev},
            'ce': None,
        }
        if corruption in ALEXNET_ERRORS and all(s in sev for s in SEVERITIES):
            # CE_c = sum_s E_{s,c} / sum_s E^AlexNet_{s,c} (Hendrycks & Dietterich 2019), in %
            entry['ce'] = 100.0 * (1.0 - top1 / 100.0) / ALEXNET_ERRORS[corruption]
        corruptions[corruption] = entry
    categories = {}
    for category in list(CORRUPTION_CATEGORIES) + ['other']:
        values = [corruptions[c]['top1'] for c in summarized if corruptions[c]['category'] == category]
        if values:
            categories[category] = _mean(values)
    severities = {s: _mean([per[c][s][0] for c in summarized if s in per[c]]) for s in SEVERITIES}
    severities = {s: v for s, v in severities.items() if v is not None}
    pairs = sum(len(per[c]) for c in benchmark)
    uneven = [g for g in per_group['mismatched'] if g.split('/')[0] in BENCHMARK_CORRUPTIONS]
    complete = len(benchmark) == len(BENCHMARK_CORRUPTIONS) and pairs == len(BENCHMARK_CORRUPTIONS) * 5 and not uneven
    missing = [c for c in BENCHMARK_CORRUPTIONS if corruptions.get(c, {}).get('ce') is None]
    return {
        'top1': _mean([per[c][s][0] for c in summarized for s in per[c]]),
        'top5': _mean([per[c][s][1] for c in summarized for s in per[c]]) if top5_valid else None,
        'mce': _mean([corruptions[c]['ce'] for c in BENCHMARK_CORRUPTIONS]) if complete else None,
        'complete': complete,
        'partial': None if complete else _partial_marker(len(benchmark), pairs, uneven, len(summarized)),
        'mce_missing': missing,
        'image_counts': dict(per_group),
        'categories': categories,
        'severities': severities,
        'corruptions': corruptions,
    }


def _partial_marker(n_benchmark: int, pairs: int, uneven: Sequence[str], n_summarized: int) -> str:
    """``'(k/15 corruptions)'``, with the corruption x severity pairs when some severities are missing and the
    groups whose image counts differ: the means of such a run are not the benchmark's."""
    n = len(BENCHMARK_CORRUPTIONS)
    text = f'{n_benchmark}/{n} corruptions'
    if pairs != 5 * n_benchmark:
        text += f', {pairs}/{5 * n} corruption x severity pairs'
    if not n_benchmark:
        text += f'; means over the {n_summarized} other corruptions found'
    if uneven:
        text += f'; image counts differ: {", ".join(uneven[:3])}' + (f' and {len(uneven) - 3} more' if len(uneven) > 3
                                                                     else '')
    return f'({text})'


def _category(corruption: str) -> str:
    for category, names in CORRUPTION_CATEGORIES.items():
        if corruption in names:
            return category
    return EXTRA_CORRUPTIONS.get(corruption, 'other')
