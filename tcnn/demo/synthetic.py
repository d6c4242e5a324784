"""Synthetic visual-reasoning images for ``tcnn demo``: shape tasks and ImageNet-C-style corruptions, generated
deterministically from a seed (no download).

**The tasks**, in the spirit of the synthetic visual reasoning tests that strain CNNs (Fleuret et al. 2011, SVRT;
Kim, Ricci & Serre 2018). Every image holds a few shapes from a vocabulary of six (circle, cross, ring, square, star,
triangle) at random, distant positions, each with its own random size and colour, on a smooth random background;
colour and size are distractors.

- ``OddColour`` (the demo's): five shapes of random kinds and sizes, one of a colour seen once, the others in two
  pairs of one colour each; the class is the colour seen once (6 classes). Recognising a colour is as local as it
  gets; knowing which colour is seen once takes a comparison of shapes that lie far apart, and the sizes vary enough
  that the amount of each colour does not tell. A CNN must learn the comparison in its convolutions, separately for
  every relative offset; one attention head can match tokens of equal content wherever they are.
- ``OddOneOut``: three shapes, the odd one out by kind instead of colour.
- ``SameDifferent`` (SVRT problem 1): two shapes, ``same`` when they are of one kind, else ``different`` (no local
  cue helps at all; a small CNN trained from scratch stays at chance for many epochs).

**Determinism.** Image ``i`` of a split is drawn from its own generator ``numpy.random.default_rng((seed, split,
i))``: the same seed gives the same images (the same bytes with the same numpy/Pillow), whatever the number of
worker processes, and a larger set extends a smaller one.

**Corruptions** (``corrupt``): gaussian, shot and impulse noise, defocus blur, contrast, pixelate and JPEG, five
severities each, with the parameters of ImageNet-C (Hendrycks & Dietterich 2019), blur radii scaled to the image
size. ``generate`` writes corrupted copies of the test split in the ImageNet-C layout
``test-c/<corruption>/<severity>/<class>/<image>``, which ``tcnn eval --suite imagenet-c`` and
``tcnn.evaluation.scoring.evaluate`` read as they are (give ``--img-size`` the image size: ImageNet-C's default
is 224).

Typical use::

    from tcnn.demo import synthetic
    info = synthetic.generate('data/odd', sizes={'train': 100_000, 'val': 5000, 'test': 5000}, seed=0)
    img, label, scene = synthetic.make_example(synthetic.OddColour(num_objects=5), seed=0, split='train', index=7)
    synthetic.generate('data/sd', sizes={'train': 20_000, 'val': 2000}, task=synthetic.SameDifferent(), seed=1)
"""
import collections
import colorsys
import dataclasses
import io
import json
import math
import multiprocessing
import os
import shutil
import time
from typing import Any, Callable, ClassVar, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from ..errors import InvalidArgumentError, TcnnError, check_number

__all__ = ['SHAPES', 'SPLITS', 'CORRUPTIONS', 'DEFAULT_CORRUPTIONS', 'SEVERITIES', 'ShapeTask', 'SameDifferent',
           'OddOneOut', 'OddColour', 'TASKS', 'HUES', 'hue_class', 'ShapeInstance', 'Scene', 'sample_scene', 'render',
           'make_example', 'corrupt', 'corruption_params', 'generate', 'read_manifest', 'MANIFEST', 'CORRUPTED_SPLIT',
           'GENERATOR_VERSION']

SHAPES = ('circle', 'square', 'triangle', 'cross', 'star', 'ring')
SPLITS = ('train', 'val', 'test')
CORRUPTED_SPLIT = 'test-c'
MANIFEST = 'dataset.json'
SEVERITIES = (1, 2, 3, 4, 5)
# Bumped whenever a change to this module changes the images of a seed (a manifest of another version is stale).
GENERATOR_VERSION = 2  # 2: impulse noise salts each channel value on its own, as ImageNet-C's
# Stream ids of the per-image generators: train, val, test, then the corruptions' own noise.
_STREAM = {'train': 0, 'val': 1, 'test': 2, CORRUPTED_SPLIT: 3}
_SUPERSAMPLE = 2  # shapes are drawn at twice the size and box-filtered down: anti-aliased edges

# ImageNet-C parameters per severity 1-5 (Hendrycks & Dietterich 2019, github.com/hendrycks/robustness
# make_imagenet_c.py). Defocus radii are for 224 px images and are scaled to the image size.
CORRUPTIONS: Dict[str, Tuple[Any, ...]] = {
    'gaussian_noise': (0.08, 0.12, 0.18, 0.26, 0.38),  # noise std on [0, 1] pixels
    'shot_noise': (60, 25, 12, 5, 3),  # Poisson photon count per unit intensity
    'impulse_noise': (0.03, 0.06, 0.09, 0.17, 0.27),  # salt-and-pepper fraction
    'defocus_blur': ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)),  # disk radius, anti-alias sigma (224 px)
    'contrast': (0.4, 0.3, 0.2, 0.1, 0.05),  # contrast factor around the image mean
    'pixelate': (0.6, 0.5, 0.4, 0.3, 0.25),  # down-scaling factor
    'jpeg_compression': (25, 18, 15, 10, 7),  # JPEG quality
}
# What the demo writes by default: one or two per ImageNet-C category the miniature can render (no weather).
DEFAULT_CORRUPTIONS = ('gaussian_noise', 'impulse_noise', 'defocus_blur', 'contrast', 'pixelate', 'jpeg_compression')


@dataclasses.dataclass(frozen=True)
class ShapeTask:
    """Parameters shared by the shape tasks (sizes as fractions of the image side, so any resolution works).

    Args:
        img_size: Image side in pixels.
        shapes: The shape vocabulary (names from ``SHAPES``).
        num_objects: Shapes per image.
        radius: Range of the shape radius.
        min_distance: Smallest distance between shape centres: the comparison is long-range.
        margin: Gap between a shape and the image border.
    """
    img_size: int = 96
    shapes: Tuple[str, ...] = SHAPES
    num_objects: int = 2
    radius: Tuple[float, float] = (0.085, 0.14)
    min_distance: float = 0.42
    margin: float = 0.02

    name: ClassVar[str] = ''
    rule: ClassVar[str] = ''
    min_objects: ClassVar[int] = 2  # the fewest shapes the rule can be posed with

    def __post_init__(self):
        check_number(self.img_size, 'img_size', ge=16, integer=True)
        check_number(self.num_objects, 'num_objects', integer=True)
        if self.num_objects < self.min_objects:
            raise InvalidArgumentError(f'{self.name or "a shape task"} needs at least {self.min_objects} objects, got '
                                       f'{self.num_objects}')
        unknown = [s for s in self.shapes if s not in SHAPES]
        if unknown or len(self.shapes) < 2 or len(set(self.shapes)) != len(self.shapes):
            raise InvalidArgumentError(f'shapes must be at least 2 distinct names of {", ".join(SHAPES)}, got '
                                       f'{self.shapes!r}')
        lo, hi = self.radius
        if not 0 < lo <= hi < 0.5:
            raise InvalidArgumentError(f'radius must be 0 < low <= high < 0.5 (fractions of the image), got '
                                       f'{self.radius!r}')
        check_number(self.min_distance, 'min_distance', ge=0, le=1)
        check_number(self.margin, 'margin', ge=0, le=0.25)

    @property
    def classes(self) -> Tuple[str, ...]:
        """Class names, sorted: ImageFolder's label order."""
        raise NotImplementedError

    def sample_kinds(self, rng: np.random.Generator, label: int) -> List[str]:
        """The shape kinds of an image of class ``label``, in drawing order (default: independent draws)."""
        return [self.shapes[int(i)] for i in rng.integers(len(self.shapes), size=self.num_objects)]

    def sample_colors(self, rng: np.random.Generator, label: int) -> List[Tuple[int, int, int]]:
        """The RGB colours of the shapes of an image of class ``label`` (default: independent random hues)."""
        return [_color(rng) for _ in range(self.num_objects)]

    def label_of(self, objects: Sequence['ShapeInstance']) -> int:
        """The rule: the class of an image holding these shapes."""
        raise NotImplementedError

    def label_of_index(self, index: int) -> int:
        """Balanced classes: image ``index`` of a split is of class ``index % num_classes``."""
        return index % len(self.classes)

    def to_dict(self) -> Dict[str, Any]:
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}
        return {'task': self.name, **d}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> 'ShapeTask':
        """The task a ``to_dict`` describes (``task`` names the class; default same/different)."""
        d = dict(d)
        cls = TASKS.get(d.pop('task', SameDifferent.name))
        if cls is None:
            raise InvalidArgumentError(f'unknown task {d!r}; known: {", ".join(TASKS)}')
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


@dataclasses.dataclass(frozen=True)
class SameDifferent(ShapeTask):
    """SVRT problem 1: ``same`` when every shape is of one kind, ``different`` when all kinds differ."""
    name: ClassVar[str] = 'same-different'
    rule: ClassVar[str] = 'same: every shape of the image is of the same kind; different: all kinds differ'

    def __post_init__(self):
        super().__post_init__()
        if self.num_objects > len(self.shapes):
            raise InvalidArgumentError(f'{self.num_objects} objects need at least as many shapes for a "different" '
                                       f'image with no repeated kind, got {len(self.shapes)}')

    @property
    def classes(self) -> Tuple[str, ...]:
        return ('different', 'same')

    def sample_kinds(self, rng: np.random.Generator, label: int) -> List[str]:
        if label == 1:
            return [self.shapes[int(rng.integers(len(self.shapes)))]] * self.num_objects
        picks = rng.choice(len(self.shapes), size=self.num_objects, replace=False)
        return [self.shapes[int(i)] for i in picks]

    def label_of(self, objects: Sequence['ShapeInstance']) -> int:
        kinds = [o.shape for o in objects]
        distinct = len(set(kinds))
        if distinct not in (1, len(kinds)):
            raise InvalidArgumentError(f'{list(kinds)} is neither same nor different')
        return int(distinct == 1)


@dataclasses.dataclass(frozen=True)
class OddOneOut(ShapeTask):
    """The odd one out: every shape but one is of one kind; the class is the kind of the one that differs.

    Recognising kinds is local; telling which of the two kinds present is the single one needs the shapes to be
    compared across the image (a detector of one shape cannot know whether its kind is repeated far away).
    """
    num_objects: int = 3
    radius: Tuple[float, float] = (0.08, 0.12)
    min_distance: float = 0.3

    name: ClassVar[str] = 'odd-one-out'
    rule: ClassVar[str] = 'the class is the kind of the one shape whose kind differs from all the others'
    min_objects: ClassVar[int] = 3

    @property
    def classes(self) -> Tuple[str, ...]:
        return tuple(sorted(self.shapes))

    def sample_kinds(self, rng: np.random.Generator, label: int) -> List[str]:
        odd = self.classes[label]
        others = [k for k in self.classes if k != odd]
        kinds = [odd] + [others[int(rng.integers(len(others)))]] * (self.num_objects - 1)
        return [kinds[int(i)] for i in rng.permutation(len(kinds))]

    def label_of(self, objects: Sequence['ShapeInstance']) -> int:
        return self.classes.index(_single(o.shape for o in objects))


# Hue of each colour class, in degrees; objects of one class vary by up to HUE_JITTER around it.
HUES = {'red': 0, 'yellow': 60, 'green': 120, 'cyan': 180, 'blue': 240, 'magenta': 300}
HUE_JITTER = 12.0


def hue_class(color: Sequence[int]) -> str:
    """The colour class (``HUES``) nearest to an RGB colour's hue."""
    h = colorsys.rgb_to_hsv(*(c / 255 for c in color))[0] * 360
    return min(HUES, key=lambda name: min(abs(h - HUES[name]), 360 - abs(h - HUES[name])))


@dataclasses.dataclass(frozen=True)
class OddColour(ShapeTask):
    """The odd colour out: one shape has a colour seen once, the others come in groups (pairs for an odd number of
    shapes) of one colour each; the class is the colour seen once.

    Shapes are of random kinds and sizes (distractors), hues of one class vary by up to ``HUE_JITTER`` degrees.
    Recognising a hue is as local as it gets (a 1x1 feature), but which hue is seen once needs every shape to be
    compared with the others across the image. The sizes vary enough that the amount of a colour in the image does
    not tell (one large shape can cover as much as two small ones), so no shortcut through a global average pool
    solves it: with three shapes (one pair) a CNN finds such a shortcut quickly, with five (two pairs) it has to learn
    the comparison.
    """
    num_objects: int = 5
    radius: Tuple[float, float] = (0.07, 0.1)
    min_distance: float = 0.25

    name: ClassVar[str] = 'odd-colour'
    rule: ClassVar[str] = 'the class is the colour seen once; every other colour of the image is seen at least twice'
    min_objects: ClassVar[int] = 3

    def __post_init__(self):
        super().__post_init__()
        if (self.num_objects - 1) // 2 > len(HUES) - 1:
            raise InvalidArgumentError(f'{self.num_objects} objects need more than {len(HUES)} colours')

    @property
    def classes(self) -> Tuple[str, ...]:
        return tuple(sorted(HUES))

    def sample_colors(self, rng: np.random.Generator, label: int) -> List[Tuple[int, int, int]]:
        odd = self.classes[label]
        others = [k for k in self.classes if k != odd]
        # the other shapes come in pairs (or more) of one hue each: the odd hue is the only one seen once
        groups = (self.num_objects - 1) // 2
        picks = rng.choice(len(others), size=groups, replace=False)
        hues = [odd] + [others[int(picks[i % groups])] for i in range(self.num_objects - 1)]
        order = rng.permutation(len(hues))
        return [_color(rng, HUES[hues[int(i)]]) for i in order]

    def label_of(self, objects: Sequence['ShapeInstance']) -> int:
        return self.classes.index(_single(hue_class(o.color) for o in objects))


def _single(values: Iterable[str]) -> str:
    """The one value that occurs once when every other value occurs at least twice."""
    counts = collections.Counter(values)
    singles = [k for k, c in counts.items() if c == 1]
    if len(singles) != 1 or len(counts) < 2:
        raise InvalidArgumentError(f'{dict(counts)} has no single odd one out')
    return singles[0]


TASKS: Dict[str, type] = {SameDifferent.name: SameDifferent, OddOneOut.name: OddOneOut, OddColour.name: OddColour}


@dataclasses.dataclass(frozen=True)
class ShapeInstance:
    """One drawn shape: kind, centre ``(x, y)`` and radius in pixels, RGB colour."""
    shape: str
    center: Tuple[float, float]
    radius: float
    color: Tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class Scene:
    """Everything an image is drawn from: background (base colour and linear gradient) and shapes."""
    background: Tuple[int, int, int]
    gradient: Tuple[float, float, float]  # (dx, dy, amplitude): brightness ramp across the image
    objects: Tuple[ShapeInstance, ...]

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------- sampling


def _color(rng: np.random.Generator, hue: Optional[float] = None) -> Tuple[int, int, int]:
    """A saturated, bright colour (it stands out of the dark background): a random hue, or ``hue`` degrees give or
    take ``HUE_JITTER``."""
    h = rng.uniform() if hue is None else ((hue + rng.uniform(-HUE_JITTER, HUE_JITTER)) % 360) / 360
    r, g, b = colorsys.hsv_to_rgb(h, rng.uniform(0.6, 1.0), rng.uniform(0.8, 1.0))
    return int(round(r * 255)), int(round(g * 255)), int(round(b * 255))


def _positions(rng: np.random.Generator, task: ShapeTask, radii: Sequence[float]) -> List[Tuple[float, float]]:
    """Centres at least ``min_distance`` apart (rejection sampling; the constraints always leave room)."""
    size = task.img_size
    min_dist = task.min_distance * size
    for _ in range(1000):
        centers = []
        for r in radii:
            lo, hi = r + task.margin * size, size - r - task.margin * size
            centers.append((float(rng.uniform(lo, hi)), float(rng.uniform(lo, hi))))
        if all(math.dist(a, b) >= min_dist for i, a in enumerate(centers) for b in centers[i + 1:]):
            return centers
    raise InvalidArgumentError(f'cannot place {task.num_objects} shapes {task.min_distance} image sides apart: '
                               'lower min_distance or radius')


def sample_scene(rng: np.random.Generator, task: ShapeTask, label: int) -> Scene:
    """Draw a scene of class ``label`` (an index of ``task.classes``) from ``rng``."""
    if not isinstance(label, int) or not 0 <= label < len(task.classes):
        raise InvalidArgumentError(f'label must be an index of {task.classes}, got {label!r}')
    kinds = task.sample_kinds(rng, label)
    radii = [float(rng.uniform(*task.radius)) * task.img_size for _ in kinds]
    centers = _positions(rng, task, radii)
    colors = task.sample_colors(rng, label)
    objects = tuple(ShapeInstance(k, c, r, col) for k, c, r, col in zip(kinds, centers, radii, colors))
    background = tuple(int(v) for v in rng.integers(0, 70, size=3))
    angle = rng.uniform(0, 2 * math.pi)
    gradient = (math.cos(angle), math.sin(angle), float(rng.uniform(0, 40)))
    return Scene(background, gradient, objects)


# ---------------------------------------------------------------------------------------------- rendering


def _polygon(cx: float, cy: float, radii: Sequence[float], start: float = -math.pi / 2) -> List[Tuple[float, float]]:
    n = len(radii)
    return [(cx + r * math.cos(start + 2 * math.pi * i / n), cy + r * math.sin(start + 2 * math.pi * i / n))
            for i, r in enumerate(radii)]


def _draw_shape(draw: ImageDraw.ImageDraw, obj: ShapeInstance, scale: float) -> None:
    cx, cy, r = obj.center[0] * scale, obj.center[1] * scale, obj.radius * scale
    color = tuple(obj.color)
    if obj.shape == 'circle':
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=color)
    elif obj.shape == 'square':
        h = 0.85 * r  # about the circle's area
        draw.rectangle((cx - h, cy - h, cx + h, cy + h), fill=color)
    elif obj.shape == 'triangle':
        draw.polygon(_polygon(cx, cy + 0.2 * r, [1.2 * r] * 3), fill=color)
    elif obj.shape == 'cross':
        w = r / 3
        draw.rectangle((cx - r, cy - w, cx + r, cy + w), fill=color)
        draw.rectangle((cx - w, cy - r, cx + w, cy + r), fill=color)
    elif obj.shape == 'star':
        draw.polygon(_polygon(cx, cy + 0.1 * r, [1.15 * r, 0.5 * r] * 5), fill=color)
    elif obj.shape == 'ring':
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), outline=color, width=max(1, int(round(0.38 * r))))
    else:
        raise InvalidArgumentError(f'unknown shape {obj.shape!r}; known: {", ".join(SHAPES)}')


def _background(scene: Scene, size: int) -> np.ndarray:
    dx, dy, amplitude = scene.gradient
    t = np.linspace(-0.5, 0.5, size, dtype=np.float32)
    ramp = amplitude * (dx * t[None, :] + dy * t[:, None])  # (H, W), within +-amplitude / sqrt(2)
    base = np.asarray(scene.background, dtype=np.float32)
    return np.clip(base[None, None, :] + ramp[..., None] + amplitude / 2, 0, 255).astype(np.uint8)


def render(scene: Scene, img_size: int) -> Image.Image:
    """Draw ``scene`` as an ``img_size`` x ``img_size`` RGB image (anti-aliased shapes)."""
    big = img_size * _SUPERSAMPLE
    img = Image.fromarray(_background(scene, big), 'RGB')
    draw = ImageDraw.Draw(img)
    for obj in scene.objects:
        _draw_shape(draw, obj, _SUPERSAMPLE)
    return img.reduce(_SUPERSAMPLE)


def _check_split(split: str, allowed: Sequence[str] = SPLITS) -> None:
    if split not in allowed:
        raise InvalidArgumentError(f'split must be one of {", ".join(allowed)}, got {split!r}')


def make_example(task: ShapeTask, seed: int, split: str, index: int) -> Tuple[Image.Image, int, Scene]:
    """Image ``index`` of ``split`` for ``seed``: ``(image, label, scene)``; a pure function of its arguments."""
    _check_split(split)
    check_number(seed, 'seed', ge=0, integer=True)
    check_number(index, 'index', ge=0, integer=True)
    rng = np.random.default_rng((int(seed), _STREAM[split], int(index)))
    label = task.label_of_index(index)
    scene = sample_scene(rng, task, label)
    return render(scene, task.img_size), label, scene


# ---------------------------------------------------------------------------------------------- corruptions


def corruption_params(corruption: str, severity: int, img_size: int = 224) -> Any:
    """The parameter of ``corruption`` at ``severity`` (1-5), scaled to ``img_size`` where it is a length."""
    if corruption not in CORRUPTIONS:
        raise InvalidArgumentError(f'unknown corruption {corruption!r}; known: {", ".join(CORRUPTIONS)}')
    if severity not in SEVERITIES:
        raise InvalidArgumentError(f'severity must be 1-5, got {severity!r}')
    value = CORRUPTIONS[corruption][severity - 1]
    if corruption == 'defocus_blur':
        return value[0] * img_size / 224, value[1] * img_size / 224
    return value


def _gaussian_kernel(sigma: float) -> np.ndarray:
    half = max(1, int(math.ceil(3 * sigma)))
    t = np.arange(-half, half + 1, dtype=np.float64)
    k = np.exp(-0.5 * (t / max(sigma, 1e-6)) ** 2)
    return np.outer(k, k) / np.outer(k, k).sum()


def _convolve(x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """2-D convolution of an ``(H, W, C)`` image with reflected borders (small kernels: a sum of shifts)."""
    kh, kw = kernel.shape
    ph, pw = kh // 2, kw // 2
    padded = np.pad(x, ((ph, ph), (pw, pw), (0, 0)), mode='reflect')
    out = np.zeros_like(x)
    h, w = x.shape[:2]
    for i in range(kh):
        for j in range(kw):
            if kernel[i, j] != 0:
                out += kernel[i, j] * padded[i:i + h, j:j + w]
    return out


def _defocus(x: np.ndarray, radius: float, alias_sigma: float) -> np.ndarray:
    """ImageNet-C's defocus blur: a disk kernel, slightly blurred against aliasing."""
    half = int(math.ceil(radius))
    t = np.arange(-half, half + 1)
    disk = ((t[None, :] ** 2 + t[:, None] ** 2) <= radius ** 2).astype(np.float64)
    disk /= disk.sum()
    x = _convolve(x, disk)
    return _convolve(x, _gaussian_kernel(alias_sigma)) if alias_sigma >= 0.1 else x


def corrupt(img: Image.Image, corruption: str, severity: int, rng: np.random.Generator) -> Image.Image:
    """``img`` with ``corruption`` at ``severity`` (1-5), ImageNet-C style; random draws from ``rng``.

    The formulas and parameters of ImageNet-C's code (``make_imagenet_c.py``; the ``imagecorruptions`` package,
    against which ``tests/test_imagenet_c_reference.py`` checks every one at 224 px where it is installed: ``pip install
    'tcnn[imagenet-c-reference]'``), impulse noise included: each channel value is replaced on its own, as
    ``skimage.util.random_noise(mode='s&p')`` does. Known differences: values are rounded to 8 bits where ImageNet-C
    truncates (``np.uint8``: half a level darker on average) and its released files are JPEGs of quality 85; defocus
    blur's radii are scaled to the image size and its kernel sums to 1, where ImageNet-C's sums to 1.013 and 1.011 at
    severities 4 and 5 (its disk touches the kernel's border, which ``cv2.GaussianBlur`` reflects back in: 1% brighter);
    pixelate scales back up with ``BOX`` as ``make_imagenet_c.py`` does (``imagecorruptions`` uses ``NEAREST``, the
    same image at 224 px and at the demo's 96).

    Args:
        img: An RGB image.
        corruption: A name of ``CORRUPTIONS``.
        severity: 1 (mild) to 5 (strong).
        rng: Source of the noise (the noise corruptions only).
    """
    c = corruption_params(corruption, severity, img.size[0])
    if corruption == 'jpeg_compression':
        buffer = io.BytesIO()
        img.convert('RGB').save(buffer, 'JPEG', quality=int(c))
        with Image.open(io.BytesIO(buffer.getvalue())) as out:
            return out.convert('RGB')
    if corruption == 'pixelate':
        w, h = img.size
        small = img.resize((max(1, int(w * c)), max(1, int(h * c))), Image.BOX)
        return small.resize((w, h), Image.BOX)
    x = np.asarray(img.convert('RGB'), dtype=np.float64) / 255.0
    if corruption == 'gaussian_noise':
        x = x + rng.normal(size=x.shape, scale=c)
    elif corruption == 'shot_noise':
        x = rng.poisson(x * c) / c
    elif corruption == 'impulse_noise':
        # ImageNet-C's skimage.util.random_noise(x, mode='s&p', amount=c): every channel value on its own, so most
        # pixels it hits turn a saturated colour; the same draws as skimage's (rng.random(shape) <= p, twice)
        flipped = rng.random(x.shape) <= c
        salted = rng.random(x.shape) <= 0.5
        x = np.where(flipped, salted.astype(x.dtype), x)
    elif corruption == 'defocus_blur':
        x = _defocus(x, *c)
    elif corruption == 'contrast':
        mean = x.mean(axis=(0, 1), keepdims=True)
        x = (x - mean) * c + mean
    return Image.fromarray((np.clip(x, 0, 1) * 255 + 0.5).astype(np.uint8), 'RGB')


def _corruption_rng(seed: int, corruption: str, severity: int, index: int) -> np.random.Generator:
    return np.random.default_rng((int(seed), _STREAM[CORRUPTED_SPLIT], list(CORRUPTIONS).index(corruption),
                                  int(severity), int(index)))


# ---------------------------------------------------------------------------------------------- writing a dataset


IMAGE_FORMATS = {'png': ('.png', {'format': 'PNG', 'compress_level': 6}),  # lossless: the demo's
                 'jpeg': ('.jpg', {'format': 'JPEG', 'quality': 90})}  # what photo datasets hold (decoding costs more)


def _file_name(index: int, image_format: str = 'png') -> str:
    return f'{index:06d}{IMAGE_FORMATS[image_format][0]}'


def _write_image(img: Image.Image, path: str, image_format: str = 'png') -> None:
    # fixed settings (no optimisation pass): the same pixels always give the same bytes
    img.save(path, **IMAGE_FORMATS[image_format][1])


def _job(args: Tuple[Dict[str, Any], int, str, int, int, Tuple[str, ...], int, str, str]) -> List[Dict[str, Any]]:
    """Write images ``start`` to ``stop`` of one split (and, for the test split, their corrupted copies below
    ``corrupt_count``); returns their records. Runs in a worker process."""
    task_dict, seed, split, start, stop, corruptions, corrupt_count, root, image_format = args
    task = ShapeTask.from_dict(task_dict)
    records = []
    for i in range(start, stop):
        img, label, scene = make_example(task, seed, split, i)
        name = _file_name(i, image_format)
        cls = task.classes[label]
        _write_image(img, os.path.join(root, split, cls, name), image_format)
        if split == 'test' and i < corrupt_count:
            for corruption in corruptions:
                for severity in SEVERITIES:
                    out = corrupt(img, corruption, severity, _corruption_rng(seed, corruption, severity, i))
                    _write_image(out, os.path.join(root, CORRUPTED_SPLIT, corruption, str(severity), cls, name),
                                 image_format)
        records.append({'index': i, 'file': f'{split}/{cls}/{name}', 'label': label, 'class': cls,
                        **scene.to_dict()})
    return records


def _check_sizes(sizes: Mapping[str, int], num_classes: int) -> Dict[str, int]:
    if not isinstance(sizes, Mapping) or set(sizes) - set(SPLITS):
        raise InvalidArgumentError(f'sizes must map splits ({", ".join(SPLITS)}) to image counts, got {sizes!r}')
    out = {}
    for split in SPLITS:
        n = sizes.get(split, 0)
        check_number(n, f'sizes[{split!r}]', ge=0, integer=True)
        if 0 < n < num_classes:
            raise InvalidArgumentError(f'sizes[{split!r}] = {n}: a split needs at least {num_classes} images (one '
                                       'per class) or none')
        out[split] = int(n)
    return out


def _manifest(task: ShapeTask, seed: int, sizes: Dict[str, int], corruptions: Sequence[str],
              corrupt_count: int, image_format: str = 'png') -> Dict[str, Any]:
    ext = IMAGE_FORMATS[image_format][0]
    manifest = {
        'format': 'tcnn-synthetic', 'generator_version': GENERATOR_VERSION, 'task': task.name, 'rule': task.rule,
        'seed': int(seed), 'task_params': task.to_dict(), 'classes': list(task.classes), 'sizes': dict(sizes),
        'corruptions': list(corruptions), 'severities': list(SEVERITIES), 'corrupt_count': int(corrupt_count),
        'layout': {'splits': f'SPLIT/CLASS/IMAGE{ext}', 'corrupted': f'{CORRUPTED_SPLIT}/CORRUPTION/SEVERITY/CLASS/'
                                                                    f'IMAGE{ext} (ImageNet-C)',
                   'scenes': 'SPLIT.jsonl: per image its file, label and scene (shapes, centres, radii, colours)'},
    }
    if image_format != 'png':  # PNG manifests (the demo's datasets) stay as they were
        manifest['image_format'] = image_format
    return manifest


def read_manifest(root: str) -> Optional[Dict[str, Any]]:
    """The manifest of a generated dataset folder, or None if ``root`` holds none."""
    path = os.path.join(root, MANIFEST)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding='utf-8') as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def _same_dataset(old: Optional[Mapping[str, Any]], new: Mapping[str, Any]) -> bool:
    keys = ('format', 'generator_version', 'seed', 'task_params', 'sizes', 'corruptions', 'corrupt_count',
            'image_format')
    return old is not None and all(old.get(k) == new.get(k) for k in keys)


def _chunks(sizes: Dict[str, int], chunk: int) -> List[Tuple[str, int, int]]:
    return [(split, start, min(start + chunk, n)) for split, n in sizes.items() for start in range(0, n, chunk)]


def generate(
        root: str,
        *,
        sizes: Mapping[str, int],
        seed: int = 0,
        task: Optional[ShapeTask] = None,
        corruptions: Sequence[str] = DEFAULT_CORRUPTIONS,
        corrupt_count: Optional[int] = None,
        workers: Optional[int] = None,
        progress: bool = True,
        reuse: bool = True,
        image_format: str = 'png',
) -> Dict[str, Any]:
    """Write a dataset folder: ``train``/``val``/``test`` ImageFolders, ImageNet-C-style ``test-c``, the scenes of
    every image (``SPLIT.jsonl``) and ``dataset.json`` (the parameters).

    The folder is written beside ``root`` and renamed into place when complete, so ``root`` never holds half a
    dataset; an existing dataset with the same parameters is kept as it is (``reuse``), one with others is replaced.

    Args:
        root: Output folder.
        sizes: Images per split, e.g. ``{'train': 8000, 'val': 1000, 'test': 1000}``.
        seed: The dataset seed.
        task: The task and its parameters (default ``OddColour()``, the demo's).
        corruptions: Corruptions of ``test-c`` (names of ``CORRUPTIONS``; empty: no ``test-c``).
        corrupt_count: Corrupt the first this many test images (default all of them).
        workers: Processes (default: the CPUs available to this process).
        progress: Show a progress bar.
        reuse: Keep an existing dataset with the same parameters instead of writing it again.
        image_format: ``'png'`` (lossless, the demo's) or ``'jpeg'`` (quality 90: a loader then decodes JPEGs, as
            it does for photo datasets such as ImageNet; ``benchmarks/loop.py``).

    Returns:
        The manifest (also written to ``root/dataset.json``), with ``generation_s`` the time it took (0 if reused).
    """
    task = OddColour() if task is None else task
    if not isinstance(task, ShapeTask) or type(task) is ShapeTask:
        names = ', '.join(c.__name__ for c in TASKS.values())
        raise InvalidArgumentError(f'task must be a task of tcnn.demo.synthetic ({names}), got {type(task).__name__}')
    check_number(seed, 'seed', ge=0, integer=True)
    sizes = _check_sizes(sizes, len(task.classes))
    unknown = [c for c in corruptions if c not in CORRUPTIONS]
    if isinstance(corruptions, str) or unknown:
        raise InvalidArgumentError(f'corruptions must be a list of {", ".join(CORRUPTIONS)}, got {corruptions!r}')
    corrupt_count = sizes['test'] if corrupt_count is None else corrupt_count
    check_number(corrupt_count, 'corrupt_count', ge=0, integer=True)
    corrupt_count = min(int(corrupt_count), sizes['test']) if corruptions else 0
    if workers is not None:
        check_number(workers, 'workers', ge=0, integer=True)
    if image_format not in IMAGE_FORMATS:
        raise InvalidArgumentError(f'image_format must be one of {", ".join(IMAGE_FORMATS)}, got {image_format!r}')
    manifest = _manifest(task, seed, sizes, list(corruptions), corrupt_count, image_format)
    root = os.path.abspath(root)
    if reuse and _same_dataset(read_manifest(root), manifest):
        return dict(read_manifest(root), generation_s=0.0)
    if os.path.exists(root) and not os.path.isdir(root):
        raise TcnnError(f'{root} is a file; the dataset needs a folder')
    if os.path.isdir(root) and os.listdir(root) and read_manifest(root) is None:
        raise TcnnError(f'{root} holds files that are not a generated dataset; choose an empty or new folder')
    start = time.perf_counter()
    tmp = f'{root}.partial'
    shutil.rmtree(tmp, ignore_errors=True)
    _make_dirs(tmp, task.classes, sizes, corruptions if corrupt_count else ())
    records = _run_jobs(task, seed, sizes, corruptions, corrupt_count, tmp, workers, progress, image_format)
    for split in SPLITS:
        if sizes[split]:
            with open(os.path.join(tmp, f'{split}.jsonl'), 'w', encoding='utf-8') as f:
                f.writelines(json.dumps(r) + '\n' for r in sorted(records[split], key=lambda r: r['index']))
    with open(os.path.join(tmp, MANIFEST), 'w', encoding='utf-8') as f:
        json.dump(manifest, f, indent=2)
    if os.path.isdir(root):
        shutil.rmtree(root)
    os.replace(tmp, root)
    return dict(manifest, generation_s=time.perf_counter() - start)


def _make_dirs(root: str, classes: Sequence[str], sizes: Mapping[str, int], corruptions: Sequence[str]) -> None:
    for split, n in sizes.items():
        for cls in classes if n else ():
            os.makedirs(os.path.join(root, split, cls), exist_ok=True)
    for corruption in corruptions:
        for severity in SEVERITIES:
            for cls in classes:
                os.makedirs(os.path.join(root, CORRUPTED_SPLIT, corruption, str(severity), cls), exist_ok=True)


def _run_jobs(task: ShapeTask, seed: int, sizes: Dict[str, int], corruptions: Sequence[str], corrupt_count: int,
              root: str, workers: Optional[int], progress: bool,
              image_format: str = 'png') -> Dict[str, List[Dict[str, Any]]]:
    jobs = [(task.to_dict(), seed, split, a, b, tuple(corruptions), corrupt_count, root, image_format)
            for split, a, b in _chunks(sizes, 100)]
    total = sum(sizes.values())
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)
    records: Dict[str, List[Dict[str, Any]]] = {split: [] for split in SPLITS}
    bar = tqdm(total=total, desc='generating images', unit='img', disable=not progress, dynamic_ncols=True)
    run: Callable = map
    pool = None
    try:
        if workers > 1 and len(jobs) > 1:
            # spawn, not fork: the caller may hold torch threads, which a forked child must not inherit
            pool = multiprocessing.get_context('spawn').Pool(min(workers, len(jobs)))
            run = pool.imap_unordered
        for chunk in run(_job, jobs):
            records[chunk[0]['file'].split('/')[0]].extend(chunk)
            bar.update(len(chunk))
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
            pool.join()
    return records
