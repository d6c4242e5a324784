"""The accuracy and robustness suites of the T-CNN paper (arXiv:2106.05795, Table 2, Fig. 3): ImageNet, ImageNet-C,
ImageNet-A and ImageNet-R; what their folders hold, how their class folders map to a model's logits, and the input
size and crop each model runs at. ``tcnn.evaluation.scoring`` evaluates models on them, ``tcnn.evaluation.tables``
shows the results.

* ``imagenet``: top-1/top-5 on an ImageFolder ``DIR/<class>/<image>``.
* ``imagenet-c`` (Hendrycks & Dietterich 2019): ``DIR/<corruption>/<severity 1-5>/<class>/<image>``; top-1 per
  corruption and severity, per category (noise, blur, weather, digital) and per severity (T-CNN Fig. 3), the mean,
  and the mCE normalised by AlexNet's published errors when all 15 corruptions x 5 severities are present with the
  same image counts. Evaluated at 224 px by default, as the paper does ("to avoid distorting the corruptions").
* ``imagenet-a`` / ``imagenet-r``: ``DIR/<wnid>/<image>`` over their published 200-class subsets of ImageNet-1k;
  the logits are restricted to those 200 classes, as the datasets' authors evaluate them.

Resolution: by default each model runs at its test size and crop (``test_input_size``/``test_crop_pct`` of its
``pretrained_cfg`` where it has them, else its input size and crop), as timm's ``validate.py`` does; ``'model'``
takes the models' own input size (timm's *training* size for many pretrained CNNs), a size in pixels (N, or (H, W))
one size for all. ImageNet-C stays at 224 px, crop 1, unless its size is asked for. Every result records its size
and crop.

Labels: class folders named by ImageNet-1k wnids are mapped to ImageNet-1k indices when the model has 1000 outputs
(so a folder holding only some classes is scored correctly); otherwise the sorted folder order is the label order
(``torchvision.datasets.ImageFolder``, the order a model fine-tuned on such a folder was trained with).
"""
import dataclasses
import os
import pkgutil
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn as nn

from ..convert.verify import eval_mode
from ..data.config import check_image_options, data_config
from ..data.images import IMAGE_EXTENSIONS
from ..errors import InvalidArgumentError, TcnnError, check_module, check_number, check_size

__all__ = ['SUITES', 'SEVERITIES', 'SUITE_TITLES', 'CORRUPTION_CATEGORIES', 'BENCHMARK_CORRUPTIONS',
           'EXTRA_CORRUPTIONS', 'ALEXNET_ERRORS', 'IMAGENET_C_SIZE', 'RESOLUTION_POLICIES', 'RELEASE_IMAGES',
           'imagenet_wnids', 'subset_wnids', 'check_suite', 'SuiteData', 'scan_suite', 'image_counts', 'LabelSpace',
           'label_space', 'num_outputs', 'check_resolution', 'resolution_policy', 'eval_data_config']

SUITES = ('imagenet', 'imagenet-c', 'imagenet-a', 'imagenet-r')
SEVERITIES = ('1', '2', '3', '4', '5')
IMAGENET_C_SIZE = 224
# 'test': the model's test size and crop where its pretrained_cfg has them (timm validate.py's default), else its
# input size; 'model': its input size and crop (timm's training size for many pretrained CNNs).
RESOLUTION_POLICIES = ('test', 'model')
Resolution = Union[str, int, Tuple[int, int], None]  # a policy or a size: N, or (H, W)
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
SUITE_TITLES = {'imagenet': 'ImageNet', 'imagenet-c': 'ImageNet-C', 'imagenet-a': 'ImageNet-A',
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


def check_suite(suite: str) -> None:
    """Refuse a suite name that is not one of ``SUITES``."""
    if suite not in SUITES:
        raise InvalidArgumentError(f'unknown suite {suite!r}; choose from {", ".join(SUITES)}')


def scan_suite(suite: str, root: str) -> SuiteData:
    """List the images of ``root`` in the layout of ``suite``; a wrong layout is an error naming the level."""
    check_suite(suite)
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
                                f'{SUITE_TITLES[suite]} classes (expected {_SUITE_LAYOUT[suite]})')
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
    check_suite(suite)
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
    """``resolution`` if it is ``None``, ``'test'``, ``'model'`` or a size in pixels: a positive integer, or a pair of
    them (height, width)."""
    if resolution is None or (isinstance(resolution, str) and resolution in RESOLUTION_POLICIES):
        return resolution
    if isinstance(resolution, str):
        raise InvalidArgumentError(f'{name} must be {" or ".join(RESOLUTION_POLICIES)} or a size in pixels, got '
                                   f'{resolution!r}')
    if isinstance(resolution, (tuple, list)):
        return check_size(resolution, name, 2, what='(H, W)')
    return check_number(resolution, name, ge=1, integer=True)


def resolution_policy(suite: str, resolution: Resolution = None,
                      img_size: Optional[Union[int, Tuple[int, int]]] = None) -> Resolution:
    """The resolution a suite runs at: ``img_size`` (pixels: N or (H, W)) if given, else ``resolution``, else the
    suite's default (``'test'``; 224 px for ImageNet-C, whose corruptions are defined at that size)."""
    check_suite(suite)
    check_resolution(resolution)
    check_image_options(img_size, None)
    if img_size is not None and resolution is not None:
        raise InvalidArgumentError(f'give img_size or resolution, not both (got {img_size} and {resolution!r})')
    chosen = img_size if img_size is not None else resolution
    if chosen is None:
        chosen = IMAGENET_C_SIZE if suite == 'imagenet-c' else 'test'
    return chosen


def eval_data_config(model: nn.Module, suite: str, img_size: Optional[Union[int, Tuple[int, int]]] = None,
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
