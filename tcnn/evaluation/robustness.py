"""Accuracy and robustness suites of the T-CNN paper (arXiv:2106.05795, Table 2, Fig. 3): ImageNet, ImageNet-C,
ImageNet-A and ImageNet-R.

* ``imagenet``: top-1/top-5 on an ImageFolder ``DIR/<class>/<image>``.
* ``imagenet-c`` (Hendrycks & Dietterich 2019): ``DIR/<corruption>/<severity 1-5>/<class>/<image>``; top-1 per
  corruption and severity, per category (noise, blur, weather, digital) and per severity (T-CNN Fig. 3), the mean,
  and the mCE normalised by AlexNet's published errors when all 15 corruptions x 5 severities are present with the
  same image counts. Evaluated at 224 px by default, as the paper does ("to avoid distorting the corruptions").
* ``imagenet-a`` / ``imagenet-r``: ``DIR/<wnid>/<image>`` over their published 200-class subsets of ImageNet-1k;
  the logits are restricted to those 200 classes, as the datasets' authors evaluate them.

Resolution: by default each model runs at its test size and crop (``test_input_size``/``test_crop_pct`` of its
``pretrained_cfg`` where it has them, else its input size and crop), as timm's ``validate.py`` does; ``'model'``
takes the models' own input size (timm's *training* size for many pretrained CNNs), an integer one size for all.
ImageNet-C stays at 224 px, crop 1, unless its size is asked for. Every result records its size and crop.

Labels: class folders named by ImageNet-1k wnids are mapped to ImageNet-1k indices when the model has 1000 outputs
(so a folder holding only some classes is scored correctly); otherwise the sorted folder order is the label order
(``torchvision.datasets.ImageFolder``, the order a model fine-tuned on such a folder was trained with).

Several models can be evaluated at once (``evaluate({'A': a, 'B': b}, ...)``): models sharing a data config share
one pass over the images, which is what dominates the cost of ImageNet-C (3.75 M images).
"""
import dataclasses
import json
import math
import os
import pkgutil
from collections import Counter
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
from PIL import Image
from timm.data import create_transform
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from ..atomic import atomic_write_text
from ..train.compiling import CompiledForward, compile_mode
from ..convert.verify import eval_mode
from ..data import IMAGE_EXTENSIONS, check_image_options, data_config
from ..train.distributed import resolve_device
from ..errors import InvalidArgumentError, InvalidTypeError, TcnnError, check_module, check_number
from ..files.integrity import nonfinite_output_error
from ..paths import check_output_file

__all__ = ['SUITES', 'CORRUPTION_CATEGORIES', 'BENCHMARK_CORRUPTIONS', 'EXTRA_CORRUPTIONS', 'ALEXNET_ERRORS',
           'IMAGENET_C_SIZE', 'RESOLUTION_POLICIES', 'RELEASE_IMAGES', 'imagenet_wnids', 'subset_wnids', 'SuiteData',
           'scan_suite', 'image_counts', 'LabelSpace', 'label_space', 'check_resolution', 'resolution_policy',
           'eval_data_config', 'evaluate', 'results_table', 'results_notes', 'format_table', 'format_markdown',
           'write_results', 'num_outputs']

SUITES = ('imagenet', 'imagenet-c', 'imagenet-a', 'imagenet-r')
SEVERITIES = ('1', '2', '3', '4', '5')
IMAGENET_C_SIZE = 224
# 'test': the model's test size and crop where its pretrained_cfg has them (timm validate.py's default), else its
# input size; 'model': its input size and crop (timm's training size for many pretrained CNNs).
RESOLUTION_POLICIES = ('test', 'model')
Resolution = Union[str, int, None]
# Images of the released ImageNet-A and ImageNet-R: fewer means a subset, which the outputs say.
RELEASE_IMAGES = {'imagenet-a': 7500, 'imagenet-r': 30000}

# The 15 benchmark corruptions by category, in the order of Hendrycks & Dietterich (2019), Fig. 1 / Table 1.
CORRUPTION_CATEGORIES = {
    'noise': ('gaussian_noise', 'shot_noise', 'impulse_noise'),
    'blur': ('defocus_blur', 'glass_blur', 'motion_blur', 'zoom_blur'),
    'weather': ('snow', 'frost', 'fog', 'brightness'),
    'digital': ('contrast', 'elastic_transform', 'pixelate', 'jpeg_compression'),
}
BENCHMARK_CORRUPTIONS = tuple(c for group in CORRUPTION_CATEGORIES.values() for c in group)
# The 4 held-out corruptions of the ImageNet-C release ("extra"): reported, not part of the mean or mCE.
EXTRA_CORRUPTIONS = {'speckle_noise': 'noise', 'gaussian_blur': 'blur', 'spatter': 'weather', 'saturate': 'digital'}
# AlexNet's top-1 error (fraction, mean over severities 1-5) per benchmark corruption, the mCE normaliser.
# Published by the dataset's authors: Hendrycks & Dietterich (2019) Table (88.6, 89.4, 92.3, ...), unrounded in
# github.com/google-research/augmix imagenet.py (ALEXNET_ERR, "taken from github.com/hendrycks/robustness").
ALEXNET_ERRORS = dict(zip(BENCHMARK_CORRUPTIONS, (
    0.886428, 0.894468, 0.922640, 0.819880, 0.826268, 0.785948, 0.798360,
    0.866816, 0.826572, 0.819324, 0.564592, 0.853204, 0.646056, 0.717840, 0.606500)))

_SUITE_LAYOUT = {
    'imagenet': 'DIR/<class>/<image>',
    'imagenet-c': 'DIR/<corruption>/<1-5>/<class>/<image>',
    'imagenet-a': 'DIR/<wnid>/<image>',
    'imagenet-r': 'DIR/<wnid>/<image>',
}
_SUITE_TITLE = {'imagenet': 'ImageNet', 'imagenet-c': 'ImageNet-C', 'imagenet-a': 'ImageNet-A',
                'imagenet-r': 'ImageNet-R'}


def _timm_info(filename: str) -> List[str]:
    data = pkgutil.get_data('timm.data', f'_info/{filename}')
    if data is None:
        raise TcnnError(f'timm does not ship {filename}; upgrade timm (>= 1.0.9)')
    return data.decode('utf-8').split()


def imagenet_wnids() -> List[str]:
    """The 1000 ImageNet-1k wnids in class-index order (sorted), as timm ships them."""
    return _timm_info('imagenet_synsets.txt')


def subset_wnids(suite: str) -> List[str]:
    """The 200 wnids of ImageNet-A or ImageNet-R, sorted (= ImageNet-1k index order).

    timm ships the lists; they equal the published ones: ImageNet-A's ``thousand_k_to_200`` in
    github.com/hendrycks/natural-adv-examples eval.py and ImageNet-R's ``imagenet_r_wnids`` in
    github.com/hendrycks/imagenet-r eval.py (checked index by index when this module was written).
    """
    files = {'imagenet-a': 'imagenet_a_synsets.txt', 'imagenet-r': 'imagenet_r_synsets.txt'}
    if suite not in files:
        raise InvalidArgumentError(f'suite {suite!r} has no class subset; choose from {", ".join(files)}')
    return _timm_info(files[suite])


# ---------------------------------------------------------------------- folder layouts


@dataclasses.dataclass
class SuiteData:
    """The images of a suite, stored compactly (numpy arrays, no Python object per image: ImageNet-C has 3.75 M
    images, and DataLoader workers would copy a list of Python tuples page by page as they touch it).

    Image ``i`` is ``root/group_dirs[group_ids[i]]/classes[targets[i]]/files[i]``; ``groups`` are the
    ``(corruption, severity)`` pairs of ImageNet-C and ``[('all', '')]`` otherwise.
    """
    suite: str
    root: str
    classes: List[str]
    groups: List[Tuple[str, str]]
    group_dirs: List[str]
    files: np.ndarray
    targets: np.ndarray
    group_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.files)

    def path(self, i: int) -> str:
        return os.path.join(self.root, self.group_dirs[self.group_ids[i]], self.classes[self.targets[i]],
                            os.fsdecode(self.files[i]))


def _layout_error(suite: str, what: str, name: str, level: int, path: str) -> TcnnError:
    return TcnnError(f'{suite}: expected {_SUITE_LAYOUT[suite]}, found {what} {name!r} at level {level} ({path})')


def _list_dir(path: str) -> Tuple[List[str], List[str]]:
    """Sub-directories and image files of ``path`` (sorted, hidden entries and other files ignored)."""
    dirs, images = [], []
    with os.scandir(path) as it:
        for entry in it:
            if entry.name.startswith('.'):
                continue
            if entry.is_dir():
                dirs.append(entry.name)
            elif entry.is_file() and entry.name.lower().endswith(IMAGE_EXTENSIONS):
                images.append(entry.name)
    return sorted(dirs), sorted(images)


def _scan_dir_level(suite: str, path: str, level: int, what: str) -> List[str]:
    """Sub-directories of a directory level; an image there means the layout is off by a level."""
    dirs, images = _list_dir(path)
    if images:
        raise _layout_error(suite, 'image', images[0], level, path)
    if not dirs:
        raise TcnnError(f'{suite}: expected {_SUITE_LAYOUT[suite]}, but {path} has no {what} folders (level '
                        f'{level})')
    return dirs


def _scan_image_level(suite: str, path: str, level: int) -> List[str]:
    dirs, images = _list_dir(path)
    if dirs:
        raise _layout_error(suite, 'directory', dirs[0], level, path)
    return images


class _Listing:
    """Accumulates (file name, class, group) during a scan."""

    def __init__(self):
        self.class_ids: Dict[str, int] = {}
        self.files: List[bytes] = []
        self.targets: List[int] = []
        self.group_ids: List[int] = []

    def add_classes(self, suite: str, directory: str, level: int, class_dirs: Sequence[str], group: int) -> None:
        for name in class_dirs:
            idx = self.class_ids.setdefault(name, len(self.class_ids))
            names = _scan_image_level(suite, os.path.join(directory, name), level)
            self.files += [os.fsencode(f) for f in names]
            self.targets += [idx] * len(names)
            self.group_ids += [group] * len(names)


def _check_suite(suite: str) -> None:
    if suite not in SUITES:
        raise InvalidArgumentError(f'unknown suite {suite!r}; choose from {", ".join(SUITES)}')


def scan_suite(suite: str, root: str) -> SuiteData:
    """List the images of ``root`` in the layout of ``suite``; a wrong layout is an error naming the level."""
    _check_suite(suite)
    if not os.path.isdir(root):
        raise TcnnError(f'{suite}: data directory not found: {root}')
    listing = _Listing()
    groups: List[Tuple[str, str]] = []
    if suite == 'imagenet-c':
        for corruption in _scan_dir_level(suite, root, 1, 'corruption'):
            c_dir = os.path.join(root, corruption)
            severities = _scan_dir_level(suite, c_dir, 2, 'severity')
            for severity in severities:
                if severity not in SEVERITIES:
                    raise _layout_error(suite, 'severity', severity, 2, c_dir)
            for severity in severities:
                s_dir = os.path.join(c_dir, severity)
                groups.append((corruption, severity))
                listing.add_classes(suite, s_dir, 4, _scan_dir_level(suite, s_dir, 3, 'class'), len(groups) - 1)
    else:
        class_dirs = _scan_dir_level(suite, root, 1, 'class')
        if suite in ('imagenet-a', 'imagenet-r'):
            allowed = set(subset_wnids(suite))
            unknown = [d for d in class_dirs if d not in allowed]
            if unknown:
                raise TcnnError(f'{suite}: folder {unknown[0]!r} at level 1 ({root}) is not one of the 200 '
                                f'{_SUITE_TITLE[suite]} classes (expected {_SUITE_LAYOUT[suite]})')
        groups.append(('all', ''))
        listing.add_classes(suite, root, 2, class_dirs, 0)
    if not listing.files:
        raise TcnnError(f'{suite}: no images ({", ".join(IMAGE_EXTENSIONS)}) in {root} (expected '
                        f'{_SUITE_LAYOUT[suite]})')
    # class indices in sorted folder order (ImageFolder's), whatever order the scan met them in
    classes = sorted(listing.class_ids)
    remap = np.empty(len(classes), dtype=np.int64)
    for i, name in enumerate(classes):
        remap[listing.class_ids[name]] = i
    return SuiteData(
        suite, os.path.abspath(root), classes, groups, [os.path.join(*g) if g[1] else '' for g in groups],
        np.array(listing.files), remap[np.asarray(listing.targets, dtype=np.int64)],
        np.asarray(listing.group_ids, dtype=np.int64))


def _group_name(group: Tuple[str, str]) -> str:
    return f'{group[0]}/{group[1]}' if group[1] else group[0]


def image_counts(data: SuiteData) -> Dict[str, Any]:
    """Do all groups of an ImageNet-C folder hold the same images per class (50 per class and group in the
    release)? A group whose count differs is a truncated or mixed-up extraction, and means over it are not the
    benchmark's.

    The reference is the most common per-class count among the benchmark corruptions' groups (among all groups if
    there is none).

    Returns:
        ``{'images_per_group': reference total, 'mismatched': {'<corruption>/<severity>': {'images': n,
        'expected': reference total, 'classes': [class folders whose count differs]}}}``.
    """
    n_groups, n_classes = len(data.groups), len(data.classes)
    table = np.bincount(data.group_ids * n_classes + data.targets,
                        minlength=n_groups * n_classes).reshape(n_groups, n_classes)
    reference_groups = [i for i, g in enumerate(data.groups) if g[0] in BENCHMARK_CORRUPTIONS] or range(n_groups)
    votes = Counter(table[i].tobytes() for i in reference_groups)
    reference = np.frombuffer(votes.most_common(1)[0][0], dtype=table.dtype)
    mismatched = {}
    for i, group in enumerate(data.groups):
        differ = np.nonzero(table[i] != reference)[0]
        if len(differ):
            mismatched[_group_name(group)] = {'images': int(table[i].sum()), 'expected': int(reference.sum()),
                                              'classes': [data.classes[j] for j in differ]}
    return {'images_per_group': int(reference.sum()), 'mismatched': mismatched}


# ---------------------------------------------------------------------- label spaces and data configs


@dataclasses.dataclass
class LabelSpace:
    """How a model's logits are scored on a suite: ``targets[class folder index]`` is the label, and ``subset``
    (if any) the logit indices kept, in label order (ImageNet-A/R)."""
    targets: torch.Tensor
    subset: Optional[torch.Tensor]
    num_labels: int
    mapping: str


def num_outputs(model: nn.Module, input_size: Sequence[int] = (3, 64, 64)) -> int:
    """Number of logits of a classifier (timm ``num_classes``, a torchvision ``fc``, else a dry run)."""
    check_module(model, 'model')
    n = getattr(model, 'num_classes', None)
    if isinstance(n, int) and n > 0:
        return n
    fc = getattr(model, 'fc', None)
    if isinstance(fc, nn.Linear):
        return fc.out_features
    param = next(model.parameters())
    with torch.no_grad(), eval_mode(model):
        out = model(torch.zeros(1, *input_size, device=param.device, dtype=param.dtype))
    return out.shape[-1]


def label_space(suite: str, classes: Sequence[str], n_outputs: int) -> LabelSpace:
    """Map class folders to labels for a model with ``n_outputs`` logits (see the module docstring)."""
    _check_suite(suite)
    check_number(n_outputs, 'n_outputs', ge=1, integer=True)
    if suite in ('imagenet-a', 'imagenet-r'):
        if n_outputs != 1000:
            raise TcnnError(f'{suite} scores ImageNet-1k classifiers (1000 outputs); the model has {n_outputs}')
        wnids = subset_wnids(suite)
        position = {w: i for i, w in enumerate(wnids)}
        index_1k = {w: i for i, w in enumerate(imagenet_wnids())}
        return LabelSpace(torch.tensor([position[c] for c in classes]),
                          torch.tensor([index_1k[w] for w in wnids]), len(wnids), f'{len(wnids)}-class subset')
    index_1k = {w: i for i, w in enumerate(imagenet_wnids())}
    if n_outputs == 1000 and all(c in index_1k for c in classes):
        return LabelSpace(torch.tensor([index_1k[c] for c in classes]), None, 1000, 'imagenet-1k wnids')
    if len(classes) != n_outputs:
        raise TcnnError(f'{suite}: {len(classes)} class folders for a model with {n_outputs} outputs; folders must be '
                        'ImageNet-1k wnids (for a 1000-class model) or exactly the classes the model was trained on')
    return LabelSpace(torch.arange(len(classes)), None, n_outputs, 'sorted folder order')


def check_resolution(resolution: Resolution, name: str = 'resolution') -> Resolution:
    """``resolution`` if it is ``None``, ``'test'``, ``'model'`` or a positive integer (pixels)."""
    if resolution is None or (isinstance(resolution, str) and resolution in RESOLUTION_POLICIES):
        return resolution
    if isinstance(resolution, str):
        raise InvalidArgumentError(f'{name} must be {" or ".join(RESOLUTION_POLICIES)} or a size in pixels, got '
                                   f'{resolution!r}')
    return check_number(resolution, name, ge=1, integer=True)


def resolution_policy(suite: str, resolution: Resolution = None, img_size: Optional[int] = None) -> Union[str, int]:
    """The resolution a suite runs at: ``img_size`` (pixels) if given, else ``resolution``, else the suite's
    default (``'test'``; 224 px for ImageNet-C, whose corruptions are defined at that size)."""
    _check_suite(suite)
    check_resolution(resolution)
    check_image_options(img_size, None)
    if img_size is not None and resolution is not None:
        raise InvalidArgumentError(f'give img_size or resolution, not both (got {img_size} and {resolution!r})')
    chosen = img_size if img_size is not None else resolution
    if chosen is None:
        chosen = IMAGENET_C_SIZE if suite == 'imagenet-c' else 'test'
    return chosen


def eval_data_config(model: nn.Module, suite: str, img_size: Optional[int] = None,
                     crop_pct: Optional[float] = None, resolution: Resolution = None) -> Dict[str, Any]:
    """timm eval data config of ``model`` on ``suite`` under a resolution policy (see ``resolution_policy``).

    ``'test'`` (the default but for ImageNet-C) is timm ``validate.py``'s: the model's ``test_input_size`` and
    ``test_crop_pct`` where its ``pretrained_cfg`` has them, else its ``input_size`` and ``crop_pct``; ``'model'``
    its ``input_size`` and ``crop_pct``; a size in pixels (``img_size`` or an integer ``resolution``) that size with
    the test crop. ``crop_pct`` overrides the crop.

    ImageNet-C images are 224 x 224 already: at 224 px with ``crop_pct=1`` the transform is the identity, as the
    authors' evaluation (``CenterCrop(224)`` only) and the T-CNN paper (section 3: "resolution of 224 to avoid
    distorting the corruptions") have it; its crop is 1 unless ``crop_pct`` is given.
    """
    chosen = resolution_policy(suite, resolution, img_size)
    if suite == 'imagenet-c':
        crop_pct = 1.0 if crop_pct is None else crop_pct
    if isinstance(chosen, str):
        return data_config(model, None, crop_pct, use_test_size=chosen == 'test')
    return data_config(model, chosen, crop_pct, use_test_size=True)


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
        img_size: Optional[int] = None,
        crop_pct: Optional[float] = None,
        resolution: Resolution = None,
        batch_size: int = 64,
        workers: Optional[int] = None,
        device: Optional[str] = None,
        amp: bool = False,
        progress: bool = True,
        data: Optional[SuiteData] = None,
        compile: Optional[str] = None,
) -> Dict[str, Dict[str, Any]]:
    """Evaluate one or several classifiers on a suite (the models are moved to ``device`` and put in eval mode).

    Args:
        models: Name -> model (a T-CNN, a CNN, any ImageNet-style classifier).
        suite: ``'imagenet'``, ``'imagenet-c'``, ``'imagenet-a'`` or ``'imagenet-r'``.
        root: The suite's data directory.
        img_size: Input resolution in pixels for every model (an explicit ask, also for ImageNet-C).
        crop_pct: Centre-crop fraction; default the model's test crop (1.0 for ImageNet-C).
        resolution: Instead of ``img_size``, the policy: ``'test'`` (default; ImageNet-C: 224 px) or ``'model'``
            (see ``eval_data_config``), or a size in pixels.
        batch_size: Images per batch.
        workers: DataLoader worker processes; default ``min(8, cpu count)``.
        device: ``'cuda'``, ``'cpu'``, ...; default CUDA when available.
        amp: Run the models under bfloat16 autocast.
        progress: Show tqdm progress bars.
        data: A ``scan_suite`` result to reuse (the folder is scanned otherwise).
        compile: A ``torch.compile`` mode (``tcnn.train.compiling.COMPILE_MODES``) for the full batches of each model;
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
    _check_suite(suite)
    check_image_options(img_size, crop_pct)
    resolution_policy(suite, resolution, img_size)
    check_number(batch_size, 'batch_size', ge=1, integer=True)
    if workers is not None:
        check_number(workers, 'workers', ge=0, integer=True)
    compile = compile_mode(compile, 'compile')
    dev = resolve_device(device)
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
        desc = f'{suite} [{", ".join(names)}] {cfg["input_size"][-1]}px'
        try:
            for x, cls, group in tqdm(loader, desc=desc, disable=not progress, unit='batch', dynamic_ncols=True):
                x = x.to(dev, non_blocking=True)
                cls, group = cls.to(dev), group.to(dev)
                for name in names:
                    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
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


# ---------------------------------------------------------------------- tables and files


def _fmt(v: Any) -> str:
    if isinstance(v, str):
        return v
    return '-' if v is None or (isinstance(v, float) and math.isnan(v)) else f'{v:.2f}'


def _size_text(result: Mapping[str, Any]) -> str:
    size = result['img_size']
    return f'{size} px' if isinstance(size, int) else f'{size[0]}x{size[1]} px'


def _input_cell(result: Mapping[str, Any]) -> str:
    crop = f'{result["crop_pct"]:g}'
    return f'{_size_text(result)}, crop {crop if "." in crop else crop + ".0"}'


def _marker(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The partial-run marker of a suite (the same data for every model), with a leading space, or ''."""
    marks = [r.get('partial') for r in results.values() if r.get('partial')]
    return f' {marks[0]}' if marks else ''


def results_table(report: Mapping[str, Any]) -> Tuple[List[str], List[List[str]]]:
    """Rows of metrics, one column per model (T-CNN Table 2 turned sideways): ``(header, rows)``.

    Every row's label says what it holds: the input size and crop each model ran at, then top-1 accuracy in % (higher
    is better) or corruption error CE / mCE in % of AlexNet's (lower is better). Rows indented under a section
    title (its own values empty) are in its unit. Means over a partial ImageNet-C folder carry a ``(k/15
    corruptions)`` marker; the 4 extra corruptions (and any other folder) are in a section of their own, in no mean.

    Args:
        report: ``{'models': {name: ...}, 'suites': {suite: {'results': {name: result}}}}`` (``tcnn eval``'s JSON).
    """
    if not (isinstance(report, Mapping) and isinstance(report.get('models'), Mapping)
            and isinstance(report.get('suites'), Mapping)):
        raise InvalidArgumentError('report must be a tcnn eval report: a dict with "models" and "suites" entries')
    names = list(report['models'])
    header = ['metric'] + names
    rows: List[List[str]] = []

    def add(label: str, results: Mapping[str, Any], getter=None) -> None:
        values = []
        for name in names:
            try:
                values.append('' if getter is None else _fmt(getter(results[name])))
            except (KeyError, TypeError):  # a model without this entry (e.g. no mCE on a partial ImageNet-C)
                values.append('-')
        rows.append([label] + values)

    for suite, block in report['suites'].items():
        res = block['results']
        title = _SUITE_TITLE.get(suite, suite)
        mark = _marker(res)
        add(f'{title} input: size, centre-crop fraction', res, _input_cell)
        if suite != 'imagenet-c':
            add(f'{title} top-1 %{mark} (higher is better)', res, lambda r: r['top1'])
            add(f'{title} top-5 %{mark} (higher is better)', res, lambda r: r['top5'])
            continue
        add(f'{title} top-1 %, mean over corruptions x severities{mark} (higher is better)', res, lambda r: r['top1'])
        add(f'{title} mCE %, AlexNet = 100{mark} (lower is better)', res, lambda r: r['mce'])
        categories = [c for c in list(CORRUPTION_CATEGORIES) + ['other']
                      if any(c in res[n].get('categories', {}) for n in names)]
        if categories:
            add(f'{title} top-1 % by category{mark} (higher is better)', res)
            for category in categories:
                add(f'  {category}', res, lambda r, c=category: r['categories'][c])
        sevs = [s for s in SEVERITIES if any(s in res[n].get('severities', {}) for n in names)]
        if sevs:
            add(f'{title} top-1 % by severity, mean over corruptions{mark} (higher is better)', res)
            for s in sevs:
                add(f'  severity {s}', res, lambda r, s=s: r['severities'][s])
        found: List[str] = []
        for n in names:
            found += [c for c in res[n].get('corruptions', {}) if c not in found]
        benchmark = [c for c in BENCHMARK_CORRUPTIONS if c in found]
        if benchmark:
            add(f'{title} CE % by corruption, AlexNet = 100 (lower is better)', res)
            for c in benchmark:
                add(f'  {c}', res, lambda r, c=c: r['corruptions'][c]['ce'])
            add(f'{title} top-1 % by corruption, mean over severities (higher is better)', res)
            for c in benchmark:
                add(f'  {c}', res, lambda r, c=c: r['corruptions'][c]['top1'])
        others = [c for c in found if c not in BENCHMARK_CORRUPTIONS]
        if others:
            what = 'not in any mean' if benchmark else 'the only corruptions found: in the means above'
            add(f'{title} top-1 % of the extra corruptions, {what} (higher is better)', res)
            for c in others:
                kind = 'extra' if c in EXTRA_CORRUPTIONS else 'other'
                add(f'  {c} ({kind})', res, lambda r, c=c: r['corruptions'][c]['top1'])
    return header, rows


def results_notes(report: Mapping[str, Any]) -> List[str]:
    """What a reader of the table must know, one line each: models run at different sizes or crops, partial
    suites and why there is no mCE. ``tcnn eval`` prints them under the table and writes them under the markdown."""
    notes = []
    for suite, block in report['suites'].items():
        res = block['results']
        sizes = {name: _size_text(r) for name, r in res.items()}
        crops = {name: r['crop_pct'] for name, r in res.items()}
        if len(set(sizes.values())) > 1:
            notes.append(f'{suite}: the models ran at different input sizes ('
                         + ', '.join(f'{n} {v}' for n, v in sizes.items())
                         + '): a difference between them is partly one of resolution; give one size to compare them')
        elif len(set(crops.values())) > 1:
            notes.append(f'{suite}: the models ran with different centre crops ('
                         + ', '.join(f'{n} {v:g}' for n, v in crops.items()) + ')')
        first = next(iter(res.values()))
        if suite == 'imagenet-c' and not first.get('complete', True):
            absent = [c for c in BENCHMARK_CORRUPTIONS if c not in first['corruptions']]
            short = [c for c in first.get('mce_missing') or [] if c not in absent]
            why = [f'{len(absent)} of the 15 corruptions missing (e.g. {absent[0]})'] if absent else []
            why += [f'{len(short)} without all 5 severities ({", ".join(short[:3])})'] if short else []
            uneven = {g: v for g, v in first['image_counts']['mismatched'].items()
                      if g.split('/')[0] in BENCHMARK_CORRUPTIONS}
            why += ['image counts differ: ' + ', '.join(f'{g} {v["images"]} images (others {v["expected"]})'
                                                        for g, v in list(uneven.items())[:3])] if uneven else []
            notes.append(f'imagenet-c: no mCE {first["partial"]}: {"; ".join(why)}; the means cover the corruptions '
                         'found')
        elif first.get('partial'):
            notes.append(f'{suite}: {first["partial"][1:-1]}: a subset of the release')
    return notes


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Plain-text table with aligned columns."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ['  '.join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [header, *rows]]
    lines.insert(1, '  '.join('-' * w for w in widths))
    return '\n'.join(lines)


def format_markdown(header: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str] = ()) -> str:
    """GitHub markdown table (metric names left-aligned, numbers right-aligned), then ``notes`` as a list."""
    def esc(s: str) -> str:
        s = str(s).replace('|', '\\|')
        return s.replace('  ', '&nbsp;&nbsp;') if s.startswith('  ') else s
    lines = ['| ' + ' | '.join(esc(h) for h in header) + ' |',
             '|' + '|'.join([':---'] + ['---:'] * (len(header) - 1)) + '|']
    lines += ['| ' + ' | '.join(esc(c) for c in r) + ' |' for r in rows]
    if notes:
        lines += [''] + [f'- {note}' for note in notes]
    return '\n'.join(lines) + '\n'


def write_results(report: Mapping[str, Any], json_path: Optional[str], markdown_path: Optional[str] = None) -> None:
    """Write the report as JSON and/or its table and notes as markdown, atomically (both paths are checked first)."""
    for path, name, suffixes in ((json_path, 'json_path', ('.json',)), (markdown_path, 'markdown_path', ('.md',))):
        if path:
            check_output_file(path, name, suffixes)
    if json_path:
        atomic_write_text(json_path, json.dumps(report, indent=2) + '\n')
    if markdown_path:
        header, rows = results_table(report)
        atomic_write_text(markdown_path, format_markdown(header, rows, results_notes(report)))
