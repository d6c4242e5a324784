"""timm's training augmentation split in two: per-sample random parameters drawn in Python (``BatchAugment.draw``,
cheap, in a DataLoader worker, from one seeded ``random.Random``) and the pixel work on a whole batch with tensor ops
on the training device (``BatchAugment.__call__``); and timm's eval transform on a batch (``BatchEval``).

``BatchAugment(img_size, ...)`` is ``timm.data.create_transform(img_size, is_training=True, ...)`` with the same
arguments, in timm's order (``transforms_imagenet_train``): ``RandomResizedCropAndInterpolation`` ->
``RandomHorizontalFlip`` -> ``RandAugment`` (``rand-...`` strings) or ``ColorJitter`` -> ``ToTensor``/``Normalize``
-> ``RandomErasing``. The draws follow timm's distributions (``get_params``' 10 attempts and centre fallback,
``RandAugment.__call__``'s op choice, ``AugmentOp``'s probability and magnitude noise, ``LEVEL_TO_ARG``: see
``tcnn.data.rand_augment``; torchvision's ``ColorJitter.get_params``, ``RandomErasing._erase``); the pixel ops are
``tcnn.data.batch_geometry``, ``batch_colour`` and ``batch_misc`` (equal to timm's PIL ops except where a resampler
differs: see there). What the batched path does not implement raises ``UnsupportedAugmentation`` when the object is
made, never silently does something else.

The parameters of one sample (``draw``; ``torch.utils.data.default_collate`` stacks them to ``(B, ...)``) are
``PARAMS``: each key's shape, dtype and meaning, for a ``BatchAugment`` with ``L`` RandAugment layers (0 without
RandAugment) and ``K = re_count`` erasing boxes.
"""
import math
import random
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from timm.data.constants import DEFAULT_CROP_PCT, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from ..errors import InvalidArgumentError, InvalidTypeError, check_number
from . import batch_colour, batch_geometry, batch_misc
from .batch_geometry import BICUBIC, BILINEAR, INTERPOLATIONS
from .rand_augment import (SUPPORTED_AA, RandAugmentConfig, UnsupportedAugmentation, draw_rand_augment,
                           parse_rand_augment, rand_augment_level, rand_augment_op)

__all__ = ['UnsupportedAugmentation', 'RandAugmentConfig', 'parse_rand_augment', 'rand_augment_level',
           'Param', 'PARAMS', 'BatchAugment', 'BatchEval', 'batched_resize']

Tensor = torch.Tensor
Images = Union[List[Tensor], Tensor]

# On the CPU the batch is augmented a few images at a time (at most this many uint8 elements): each op's float
# temporaries then stay in the caches and below glibc's mmap threshold, where one call on many images pays page
# faults for fresh memory (measured at 224 px, an op on 64 images: a blend 5.7x, sharpness 12x, equalize 3.5x faster
# in chunks of 4 images than in one call); other devices take the whole batch at once
CPU_CHUNK_ELEMENTS = 1 << 19


class Param(NamedTuple):
    """One key of a sample's parameters.

    Attributes:
        key: The dict key.
        dtype: The tensor's dtype.
        shape: One sample's shape: sizes, ``'L'`` for the RandAugment layers, ``'K'`` for the erasing boxes.
        meaning: What the values are.
    """
    key: str
    dtype: torch.dtype
    shape: Tuple[Union[int, str], ...]
    meaning: str


# The parameters of one sample (``BatchAugment.draw``), in the order they are drawn
PARAMS: Tuple[Param, ...] = (
    Param('crop', torch.int64, (4,), 'the crop box (top, left, height, width) in the source image'),
    Param('interp', torch.int64, (), "the crop's resize interpolation, an index of batch_geometry.INTERPOLATIONS"),
    Param('flip', torch.bool, (), 'horizontal flip'),
    Param('ra_op', torch.int64, ('L',), 'per RandAugment layer the op, an index of BatchAugment.ra_ops; -1: the '
                                        'layer was not applied (its probability)'),
    Param('ra_arg', torch.float64, ('L',), "the op's argument as timm's level function returns it (degrees, bits, "
                                           'threshold, enhancement factor, shear, pixels, or fraction for *Rel)'),
    Param('ra_interp', torch.int64, ('L',), 'the resample of a geometric op (rotate, shear, translate); -1 for others'),
    Param('cj_factor', torch.float64, (4,), "ColorJitter's brightness, contrast, saturation and hue factors (1, 1, 1, "
                                            '0 where a component is off)'),
    Param('cj_order', torch.int64, (4,), "the order of those four (torchvision's fn_idx)"),
    Param('re_box', torch.int64, ('K', 4), 'the erasing boxes (top, left, height, width) in drawing order; zeros: no '
                                           'box'),
    Param('re_seed', torch.int64, (), "the seed of the erasing noise ('rand' and 'pixel' modes; else 0)"),
)


def _interpolation_code(interpolation: str, what: str, allow_random: bool) -> int:
    allowed = INTERPOLATIONS + (('random',) if allow_random else ())
    if interpolation not in allowed:
        raise UnsupportedAugmentation(f'{what} {interpolation!r} is not implemented by the batched augmentation; '
                                      f'supported: {", ".join(allowed)}')
    return -1 if interpolation == 'random' else INTERPOLATIONS.index(interpolation)


def _jitter_range(value: Union[float, Sequence[float]], name: str, center: float, bound: Tuple[float, float],
                  clip_first_on_zero: bool = True) -> Optional[Tuple[float, float]]:
    """torchvision's ``ColorJitter._check_input``: a factor range, or None for a component that does nothing."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise InvalidArgumentError(f'color_jitter {name} must be non-negative, got {value!r}')
        lo, hi = center - float(value), center + float(value)
        if clip_first_on_zero:
            lo = max(lo, 0.0)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        lo, hi = float(value[0]), float(value[1])
    else:
        raise InvalidTypeError(f'color_jitter {name} must be a number or a (min, max) pair, got {value!r}')
    if not bound[0] <= lo <= hi <= bound[1]:
        raise InvalidArgumentError(f'color_jitter {name} must lie in {bound}, got {(lo, hi)}')
    return None if lo == hi == center else (lo, hi)


def _stack(images: Images) -> Tuple[List[Tensor], torch.device]:
    """The images as a list of uint8 ``(3, H, W)`` tensors on one device."""
    if isinstance(images, Tensor):
        if images.dim() != 4:
            raise InvalidArgumentError(f'images must be (B, 3, H, W), got shape {tuple(images.shape)}')
        images = list(images)
    if not images:
        raise InvalidArgumentError('images is empty')
    device = None
    for i, img in enumerate(images):
        if not isinstance(img, Tensor) or img.dtype != torch.uint8 or img.dim() != 3 or img.shape[0] != 3:
            got = f'{img.dtype} {tuple(img.shape)}' if isinstance(img, Tensor) else type(img).__name__
            raise InvalidArgumentError(f'images[{i}] must be a uint8 (3, H, W) tensor, got {got}')
        device = device or img.device  # read once it is a tensor (numpy < 2's arrays have no device)
        if img.device != device:
            raise InvalidArgumentError(f'images[{i}] is on {img.device}, images[0] on {device}: one device only')
    return images, device


def batched_resize(device: torch.device) -> bool:
    """Whether a batch's crops are resized together (``batch_geometry.resized_crops``: a few matrix products)
    rather than one ``batch_geometry.resize`` per image: on a GPU, where each resize would be about ten kernel
    launches. The CPU keeps torch's uint8 kernel, Pillow's fixed-point arithmetic and faster there."""
    return device.type == 'cuda'


class BatchAugment:
    """timm's training transform (``create_transform(img_size, is_training=True, ...)``) with parameters drawn per
    sample (``draw``) and pixels computed per batch (``__call__``). ``PARAMS`` lists the parameters.

    Args:
        img_size: Output side.
        scale: RandomResizedCrop's area range (None: (0.08, 1)).
        ratio: Its aspect-ratio range (None: (3/4, 4/3)).
        hflip: Horizontal flip probability.
        auto_augment: A RandAugment string ('rand-m9-mstd0.5-inc1'), or None.
        color_jitter: ColorJitter's strength: a float (brightness, contrast, saturation), a 3- or 4-tuple (with hue);
            None or with ``auto_augment``: off (as timm does).
        interpolation: 'bilinear', 'bicubic', 'nearest', or 'random' (bilinear or bicubic per image and per op).
        mean: Normalisation mean (and RandAugment's fill colour).
        std: Normalisation std.
        re_prob: Random erasing probability (0: off).
        re_mode: 'const', 'rand' or 'pixel'.
        re_count: Maximum number of erasing boxes per image.

    Raises:
        UnsupportedAugmentation: An AutoAugment policy, AugMix, 3-Augment, an unknown interpolation or erasing mode.
    """

    def __init__(self, img_size: int, *, scale: Optional[Sequence[float]] = (0.08, 1.0),
                 ratio: Optional[Sequence[float]] = (3 / 4, 4 / 3), hflip: float = 0.5,
                 auto_augment: Optional[str] = None,
                 color_jitter: Optional[Union[float, Sequence[float]]] = 0.4, interpolation: str = 'bilinear',
                 mean: Sequence[float] = IMAGENET_DEFAULT_MEAN, std: Sequence[float] = IMAGENET_DEFAULT_STD,
                 re_prob: float = 0., re_mode: str = 'const', re_count: int = 1) -> None:
        self.img_size = int(check_number(img_size, 'img_size', ge=3, integer=True))
        self.scale = tuple(float(s) for s in (scale or (0.08, 1.0)))
        self.ratio = tuple(float(r) for r in (ratio or (3. / 4., 4. / 3.)))
        self.log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        self.hflip = float(check_number(hflip, 'hflip', ge=0, le=1))
        self.interpolation = interpolation
        self.interp_code = _interpolation_code(interpolation, 'interpolation', allow_random=True)
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        # timm's aa_params for the RandAugment ops (transforms_imagenet_train)
        self.translate_const = int(self.img_size * 0.45)
        self.fill = tuple(min(255, round(255 * x)) for x in self.mean)
        self.rand_augment: Optional[RandAugmentConfig] = None
        if auto_augment:
            if not isinstance(auto_augment, str):
                raise InvalidTypeError(f'auto_augment must be a string, got {auto_augment!r}')
            if not auto_augment.startswith('rand'):
                kind = 'AugMix' if auto_augment.startswith('augmix') else 'an AutoAugment policy'
                raise UnsupportedAugmentation(f'auto_augment {auto_augment!r} ({kind}) is not implemented by the '
                                              f'batched augmentation; supported: {SUPPORTED_AA}')
            self.rand_augment = parse_rand_augment(auto_augment)
        self.ra_ops: Tuple[str, ...] = self.rand_augment.ops if self.rand_augment else ()
        # ColorJitter only without auto-augment (timm's disable_color_jitter); components as torchvision checks them
        self.jitter: Tuple[Optional[Tuple[float, float]], ...] = (None,) * 4
        if color_jitter is not None and not auto_augment:
            if isinstance(color_jitter, (list, tuple)):
                if len(color_jitter) not in (3, 4):
                    raise InvalidArgumentError(f'color_jitter must be a number or 3 or 4 values, got {color_jitter!r}')
                values = tuple(color_jitter) + (0,) * (4 - len(color_jitter))
            else:
                values = (float(color_jitter),) * 3 + (0,)
            self.jitter = tuple(_jitter_range(v, n, c, b, z) for v, n, c, b, z in zip(
                values, ('brightness', 'contrast', 'saturation', 'hue'), (1, 1, 1, 0),
                ((0, math.inf),) * 3 + ((-0.5, 0.5),), (True, True, True, False)))
        self.re_prob = float(check_number(re_prob, 're_prob', ge=0, le=1))
        self.re_mode = (re_mode or 'const').lower()
        if self.re_mode not in ('const', 'rand', 'pixel'):
            raise UnsupportedAugmentation(f're_mode {re_mode!r} is not a random-erasing mode; supported: const, rand, '
                                          f'pixel')
        self.re_count = max(1, int(check_number(re_count, 're_count', ge=0, integer=True)))

    @property
    def num_layers(self) -> int:
        """RandAugment layers per image (the length of ``ra_op``); 0 without RandAugment."""
        return self.rand_augment.num_layers if self.rand_augment else 0

    # ------------------------------------------------------------------------------------------------ drawing

    def _draw_crop(self, rng: random.Random, height: int, width: int) -> Tuple[int, int, int, int]:
        """``RandomResizedCropAndInterpolation.get_params``: 10 attempts, then the centre crop of the ratio range."""
        area = width * height
        # random.uniform(a, b) is a + (b - a) * random(), written out: the same numbers without a call per draw (the
        # demo's whole-image scale fails all ten tries, twenty draws per sample)
        (s_lo, s_hi), (r_lo, r_hi), draw, exp, sqrt = self.scale, self.log_ratio, rng.random, math.exp, math.sqrt
        for _ in range(10):
            target_area = (s_lo + (s_hi - s_lo) * draw()) * area
            aspect_ratio = exp(r_lo + (r_hi - r_lo) * draw())
            w = int(round(sqrt(target_area * aspect_ratio)))
            h = int(round(sqrt(target_area / aspect_ratio)))
            if w <= width and h <= height:
                return rng.randint(0, height - h), rng.randint(0, width - w), h, w
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            w, h = width, int(round(width / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            h, w = height, int(round(height * max(self.ratio)))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def _draw_erasing(self, rng: random.Random) -> List[Tuple[int, int, int, int]]:
        """``RandomErasing._erase``'s boxes (min_count 1, area 0.02-1/3 split over the count, log aspect 0.3-1/0.3)."""
        boxes: List[Tuple[int, int, int, int]] = []
        if rng.random() > self.re_prob:
            return boxes
        size = self.img_size
        area = size * size
        count = 1 if self.re_count == 1 else rng.randint(1, self.re_count)
        log_aspect = (math.log(0.3), math.log(1 / 0.3))
        for _ in range(count):
            for _ in range(10):
                target_area = rng.uniform(0.02, 1 / 3) * area / count
                aspect_ratio = math.exp(rng.uniform(*log_aspect))
                h = int(round(math.sqrt(target_area * aspect_ratio)))
                w = int(round(math.sqrt(target_area / aspect_ratio)))
                if w < size and h < size:
                    boxes.append((rng.randint(0, size - h), rng.randint(0, size - w), h, w))
                    break
        return boxes

    def _draw_values(self, rng: random.Random, size: Tuple[int, int]) -> Dict[str, Any]:
        """One sample's parameters as plain values by ``PARAMS``' keys: every random number from ``rng``, in timm's
        order (crop, its interpolation, flip, RandAugment, ColorJitter, erasing and its seed)."""
        height, width = size
        if not (type(height) is int and type(width) is int and height >= 1 and width >= 1):  # the checks' fast path
            height, width = (int(check_number(s, 'size', ge=1, integer=True)) for s in size)
        top, left, h, w = self._draw_crop(rng, height, width)
        interp = rng.choice((BILINEAR, BICUBIC)) if self.interp_code < 0 else self.interp_code
        flip = self.hflip > 0 and rng.random() < self.hflip
        ra_op, ra_arg, ra_interp = (draw_rand_augment(self.rand_augment, rng, self.translate_const, self.interp_code)
                                    if self.rand_augment else ([], [], []))
        cj_factor, cj_order = [1., 1., 1., 0.], [0, 1, 2, 3]
        if any(r is not None for r in self.jitter):
            rng.shuffle(cj_order)  # torch.randperm(4): a uniform permutation
            for i, r in enumerate(self.jitter):
                if r is not None:
                    cj_factor[i] = rng.uniform(*r)
        re_box = [[0, 0, 0, 0]] * self.re_count
        seed = 0
        if self.re_prob > 0:
            boxes = self._draw_erasing(rng)
            re_box = [list(b) for b in boxes] + re_box[len(boxes):]
            if self.re_mode != 'const':
                seed = rng.getrandbits(63)
        return {'crop': [top, left, h, w], 'interp': interp, 'flip': flip, 'ra_op': ra_op, 'ra_arg': ra_arg,
                'ra_interp': ra_interp, 'cj_factor': cj_factor, 'cj_order': cj_order, 're_box': re_box,
                're_seed': seed}

    def draw_many(self, draws: Sequence[Tuple[random.Random, Tuple[int, int]]]) -> Dict[str, Tensor]:
        """The parameters of a batch, ``(rng, size)`` per sample: what ``draw`` of each, collated, gives, built with
        one tensor per key (a batch drawn in the training process: the resident pipeline)."""
        rows = [self._draw_values(rng, size) for rng, size in draws]
        sizes = {'L': self.num_layers, 'K': self.re_count}
        return {p.key: torch.tensor([row[p.key] for row in rows], dtype=p.dtype).view(
                    len(rows), *(sizes.get(d, d) for d in p.shape)) for p in PARAMS}

    def draw(self, rng: random.Random, size: Tuple[int, int]) -> Dict[str, Tensor]:
        """One sample's parameters for a source image of ``size`` (height, width): CPU tensors of fixed shapes and
        dtypes (``PARAMS``), every random number from ``rng``."""
        return {key: value[0] for key, value in self.draw_many([(rng, size)]).items()}

    # ---------------------------------------------------------------------------------------------- applying

    @staticmethod
    def _apply(out: Tensor, chosen: Tensor, fn: Callable[..., Tensor], *args: Any) -> None:
        """``out[chosen] = fn(out[chosen], *args)``: gather the images that drew an op, run it, scatter them back."""
        if not len(chosen):
            return
        index = chosen.to(out.device)
        result = fn(out.index_select(0, index), *args).contiguous()
        if out.device.type == 'cpu' and out[0].numel() % 4 == 0 and result.storage_offset() % 4 == 0:
            # torch's uint8 index_copy_ moves single bytes on the CPU: whole images as int32 words are 7x faster
            out.view(len(out), -1).view(torch.int32).index_copy_(0, index, result.view(len(result), -1).view(
                torch.int32))
        else:
            out.index_copy_(0, index, result)

    def __call__(self, images: Images, params: Dict[str, Tensor]) -> Tensor:
        """The augmented batch: float32 ``(B, 3, img_size, img_size)``, normalised, erased, on the images' device.

        Args:
            images: B uint8 ``(3, H_i, W_i)`` tensors (sizes may differ) or a uint8 ``(B, 3, H, W)`` tensor, on one
                device.
            params: ``draw``'s dicts collated to ``(B, ...)`` (on the CPU or that device).
        """
        stacked = images if isinstance(images, Tensor) and images.dim() == 4 else None
        images, device = _stack(images)
        p = {k: v.cpu() for k, v in params.items()}
        n, size = len(images), self.img_size
        if p['crop'].shape[0] != n:
            raise InvalidArgumentError(f'{n} images but parameters for {p["crop"].shape[0]}')
        result = torch.empty((n, 3, size, size), dtype=torch.float32, device=device)
        # On the CPU RandAugment's batches go through in chunks of a few images, every step on a chunk while it is in
        # the caches (CPU_CHUNK_ELEMENTS); colour jitter alone runs fastest on the whole batch (64 demo images: 6.0
        # ms whole, 7.2 ms in chunks), as does every batch on other devices
        chunked = device.type == 'cpu' and self.rand_augment is not None
        step = max(1, CPU_CHUNK_ELEMENTS // (3 * size * size)) if chunked else n
        for lo in range(0, n, step):
            chunk = {k: v[lo:lo + step] for k, v in p.items()}
            self._augment(images[lo:lo + step], chunk, result[lo:lo + step],
                          None if stacked is None else stacked[lo:lo + step])
        if self.re_prob > 0:
            boxes = [[tuple(b) for b in image_boxes if b[2] > 0 and b[3] > 0] for image_boxes in p['re_box'].tolist()]
            batch_misc.erase(result, boxes, p['re_seed'].tolist(), self.re_mode)
        return result

    def _augment(self, images: List[Tensor], p: Dict[str, Tensor], result: Tensor,
                 stacked: Optional[Tensor] = None) -> None:
        """Crop, flip, RandAugment, ColorJitter and normalise ``images`` (also given as one ``(n, 3, H, W)`` tensor,
        ``stacked``, when they came so) into ``result``."""
        n, size = len(images), self.img_size
        # RandomResizedCropAndInterpolation: each crop has its own size, so one resize per image; where every crop is
        # a whole image of the output size (the demo's scale (1, 1) on its 96 px data), PIL's same-size resize is a
        # copy: one copy of the batch instead of one per image
        whole = torch.tensor([0, 0, size, size], dtype=p['crop'].dtype)
        if stacked is not None and tuple(stacked.shape[-2:]) == (size, size) and bool((p['crop'] == whole).all()):
            out = stacked.clone()
            self._apply(out, p['flip'].nonzero().view(-1), batch_geometry.hflip)
        elif batched_resize(result.device):
            out = batch_geometry.resized_crops(images, p['crop'], size, p['interp'], p['flip'])
        else:
            out = torch.empty((n, 3, size, size), dtype=torch.uint8, device=result.device)
            for i, ((top, left, h, w), code) in enumerate(zip(p['crop'].tolist(), p['interp'].tolist())):
                out[i] = batch_geometry.resize(images[i][:, top:top + h, left:left + w], (size, size),
                                               INTERPOLATIONS[code])
            self._apply(out, p['flip'].nonzero().view(-1), batch_geometry.hflip)
        # RandAugment: per layer, each op once on the images that drew it
        for layer in range(self.num_layers):
            column = p['ra_op'][:, layer]
            for k in torch.unique(column).tolist():
                if k >= 0:
                    chosen = (column == k).nonzero().view(-1)
                    self._apply(out, chosen, rand_augment_op(self.ra_ops[k]).apply, p['ra_arg'][chosen, layer],
                                self.fill, p['ra_interp'][chosen, layer], size)
        active = [r is not None for r in self.jitter]
        if any(active):  # ColorJitter on the float batch the normalisation then reads (uint8 values, exactly)
            batch_colour.tv_color_jitter(out, p['cj_factor'], p['cj_order'], active, out=result)
            batch_misc.normalize(result, self.mean, self.std, out=result)
        else:
            batch_misc.normalize(out, self.mean, self.std, out=result)

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(img_size={self.img_size}, scale={self.scale}, ratio={self.ratio}, '
                f'hflip={self.hflip}, rand_augment={self.rand_augment}, jitter={self.jitter}, '
                f'interpolation={self.interpolation!r}, re_prob={self.re_prob}, re_mode={self.re_mode!r}, '
                f're_count={self.re_count})')


class BatchEval:
    """timm's eval transform (``transforms_imagenet_eval``) on a batch: resize (the shorter side to
    ``floor(img_size / crop_pct)``, or both sides with ``crop_mode='squash'``), centre crop, normalise.

    Raises:
        UnsupportedAugmentation: A crop mode other than 'center' and 'squash', or an interpolation other than
            nearest, bilinear and bicubic.
    """

    def __init__(self, img_size: int, *, crop_pct: Optional[float] = DEFAULT_CROP_PCT,
                 crop_mode: Optional[str] = 'center', interpolation: str = 'bilinear',
                 mean: Sequence[float] = IMAGENET_DEFAULT_MEAN, std: Sequence[float] = IMAGENET_DEFAULT_STD) -> None:
        self.img_size = int(check_number(img_size, 'img_size', ge=1, integer=True))
        self.crop_pct = float(check_number(crop_pct or DEFAULT_CROP_PCT, 'crop_pct', gt=0))
        self.crop_mode = crop_mode or 'center'
        if self.crop_mode not in ('center', 'squash'):
            raise UnsupportedAugmentation(f'crop_mode {crop_mode!r} is not implemented by the batched eval '
                                          f'transform; supported: center, squash')
        _interpolation_code(interpolation, 'interpolation', allow_random=False)
        self.interpolation = interpolation
        self.scale_size = math.floor(self.img_size / self.crop_pct)
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)

    def _resized_size(self, height: int, width: int) -> Tuple[int, int]:
        """torchvision's ``Resize(scale_size)`` (the shorter side; the longer one truncated) or ``Resize((s, s))``."""
        s = self.scale_size
        if self.crop_mode == 'squash':
            return s, s
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = s, int(s * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)

    def _center_crop(self, x: Tensor) -> Tensor:
        """torchvision's ``center_crop``: zero padding where the image is smaller, offsets ``int(round(d / 2))``."""
        size = self.img_size
        h, w = x.shape[-2:]
        if size > h or size > w:
            pad = [(size - w) // 2 if size > w else 0, (size - w + 1) // 2 if size > w else 0,
                   (size - h) // 2 if size > h else 0, (size - h + 1) // 2 if size > h else 0]
            x = torch.nn.functional.pad(x, pad)
            h, w = x.shape[-2:]
        top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
        return x[..., top:top + size, left:left + size]

    def __call__(self, images: Images) -> Tensor:
        """The eval batch: float32 ``(B, 3, img_size, img_size)``, normalised, on the images' device."""
        if isinstance(images, Tensor) and images.dim() == 4 and images.dtype == torch.uint8 and images.shape[1] == 3:
            # one size: one resize for the whole batch
            x = batch_geometry.resize(images, self._resized_size(*images.shape[-2:]), self.interpolation)
            return batch_misc.normalize(self._center_crop(x), self.mean, self.std)
        images, device = _stack(images)
        out = torch.empty((len(images), 3, self.img_size, self.img_size), dtype=torch.uint8, device=device)
        for i, img in enumerate(images):
            resized = batch_geometry.resize(img, self._resized_size(*img.shape[-2:]), self.interpolation)
            out[i] = self._center_crop(resized)
        return batch_misc.normalize(out, self.mean, self.std)

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(img_size={self.img_size}, crop_pct={self.crop_pct}, '
                f'crop_mode={self.crop_mode!r}, interpolation={self.interpolation!r})')
