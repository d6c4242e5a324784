"""The pixel ops of timm's training augmentation on batches of uint8 images, one argument per image.

Each op takes a uint8 tensor ``(n, 3, H, W)`` (the images that drew it) and per-image arguments as tensors of shape
``(n,)``, and returns a new uint8 tensor: the caller (``tcnn.data.batch_augment``) gathers the images that drew an op,
calls it once and scatters the result back. Each mirrors what timm's transform runs on a PIL image:

* ``resize``: PIL's ``Image.resize`` (what ``RandomResizedCropAndInterpolation`` and the eval ``Resize`` call),
  antialiased when shrinking, in Pillow's two passes (``_first_pass``). On the CPU, torch's uint8 antialiased
  kernel, which follows Pillow's fixed-point arithmetic; elsewhere two float passes, each rounded to uint8 as
  Pillow rounds them; nearest: Pillow's pixel choice exactly.
* ``autocontrast``, ``equalize``, ``invert``, ``posterize``, ``solarize``, ``solarize_add``: ``PIL.ImageOps`` (and
  timm's ``solarize_add``, tcnn's 0-bit ``posterize``): the same lookup tables, computed in the same integer and
  double arithmetic, hence the same bytes.
* ``color``, ``contrast``, ``brightness``, ``sharpness``: ``PIL.ImageEnhance``: ``Image.blend`` of a degenerate image
  with the image in float32 and truncated as Pillow's ``ImagingBlend`` does, the degenerate image as Pillow makes it
  (the ITU-R 601-2 'L' conversion in 16-bit fixed point, the L histogram's rounded mean, the SMOOTH 3x3 filter in
  float32 with the border left as is).
* ``affine``, ``rotate``, ``shear_x``/``shear_y``, ``translate_x``/``translate_y``: ``Image.transform(AFFINE)`` and
  ``Image.rotate`` with a fill colour: PIL's coordinate convention and its out-of-image test, resampled by
  ``grid_sample`` (bilinear, bicubic) or exactly (nearest, in Pillow's 16.16 fixed point). Pillow's transform
  bicubic is a cubic convolution with a = -1 (``BICUBIC`` in ``libImaging/Geometry.c``; its *resize* uses a =
  -0.5), ``grid_sample``'s uses a = -0.75: bicubic outputs differ from Pillow's on many pixels, by several levels at
  edges (measured on photo-like images in docs/benchmarks.md, pinned in ``tests/test_batch_augment.py``). Pillow's
  own arithmetic in torch ops (``benchmarks/pil_agreement.py``'s reference: its bytes exactly) costs several times
  ``grid_sample``'s fused kernel on the CPU, so it is not used.
* ``adjust_brightness``, ``adjust_contrast``, ``adjust_saturation``, ``adjust_hue``: torchvision's ``ColorJitter``
  ops with the arithmetic of ``torchvision.transforms.v2.functional`` on uint8 tensors (not its PIL path, which
  timm's PIL pipeline runs: contrast and saturation differ from it by a level on some pixels, hue, through Pillow's
  8-bit HSV image, by more; docs/benchmarks.md).
* ``normalize`` (``ToTensor`` + ``Normalize``) and ``erase`` (timm's ``RandomErasing._erase`` for given boxes).

Nothing here draws a random number except ``erase``, from generators seeded by its caller.
"""
import functools
import itertools
from typing import List, Optional, Sequence, Tuple

import PIL
import torch
import torch.nn.functional as F

__all__ = ['INTERPOLATIONS', 'resize', 'resize_float', 'resized_crops', 'hflip', 'invert', 'posterize', 'solarize',
           'solarize_add', 'autocontrast', 'equalize', 'grayscale', 'blend', 'color', 'contrast', 'brightness',
           'sharpness', 'affine', 'rotate', 'shear_x', 'shear_y', 'translate_x', 'translate_y', 'adjust_brightness',
           'adjust_contrast', 'adjust_saturation', 'adjust_hue', 'color_jitter', 'normalize', 'erase']

# Interpolation codes of the parameter tensors (``tcnn.data.batch_augment``): an index into this tuple.
INTERPOLATIONS = ('nearest', 'bilinear', 'bicubic')
NEAREST, BILINEAR, BICUBIC = range(3)

Tensor = torch.Tensor


def _to_uint8(x: Tensor) -> Tensor:
    """Float values in [0, 256) to uint8, truncated (C's cast). Through int16: torch's direct float -> uint8 cast
    is 3x slower on the CPU (measured)."""
    return x.to(torch.int16).to(torch.uint8)


def _column(values: Tensor, like: Tensor, dtype: torch.dtype) -> Tensor:
    """Per-image values ``(n,)`` as ``(n, 1, 1, 1)`` of ``dtype`` on ``like``'s device."""
    return values.to(device=like.device, dtype=dtype).view(-1, 1, 1, 1)


# ------------------------------------------------------------------------------------------------------------ resize


_UINT8_ANTIALIAS: dict = {}


def _uint8_antialias(mode: str) -> bool:
    """Whether this torch resizes uint8 tensors with antialiasing on the CPU (torch >= 2.1 has a kernel that follows
    Pillow's fixed-point resampling; checked once per mode rather than assumed from the version)."""
    if mode not in _UINT8_ANTIALIAS:
        try:
            F.interpolate(torch.zeros(1, 3, 8, 8, dtype=torch.uint8), size=(5, 5), mode=mode, antialias=True)
            _UINT8_ANTIALIAS[mode] = True
        except RuntimeError:
            _UINT8_ANTIALIAS[mode] = False
    return _UINT8_ANTIALIAS[mode]


def resize(images: Tensor, size: Tuple[int, int], interpolation: str) -> Tensor:
    """PIL's ``Image.resize(size[::-1], resample)`` of uint8 images ``(n, 3, h, w)`` (or ``(3, h, w)``) to ``size``
    (height, width).

    Bilinear and bicubic are antialiased like PIL when shrinking (PIL's bicubic: a = -0.5); nearest picks PIL's pixel
    exactly. A same-size resize is PIL's copy.
    """
    single = images.dim() == 3
    x = images[None] if single else images
    if tuple(x.shape[-2:]) == tuple(size):
        out = x
    elif interpolation == 'nearest':
        rows = _nearest_indices(x.shape[-2], size[0]).to(x.device)
        columns = _nearest_indices(x.shape[-1], size[1]).to(x.device)
        out = x.index_select(-2, rows).index_select(-1, columns)
    elif x.device.type == 'cpu' and _uint8_antialias(interpolation):
        first = _first_pass(x.shape[-2:], size)
        if first[0] != x.shape[-2]:  # the vertical pass first: torch's kernel runs the horizontal one first
            x = F.interpolate(x, size=first, mode=interpolation, antialias=True)
        out = F.interpolate(x, size=size, mode=interpolation, antialias=True)
    else:
        out = resize_float(x, size, interpolation)
    return out[0] if single else out


def _first_pass(size_in: Sequence[int], size: Sequence[int]) -> Tuple[int, int]:
    """The size after Pillow's first resampling pass of a resize from ``size_in`` to ``size`` (height, width).

    Pillow resamples in two passes, each rounded to uint8 (and so clipping bicubic's overshoot), so their order
    changes the result by up to a few dozen levels at edges. Pillow 13 (``ImagingResampleInner``, ``libImaging/
    Resample.c``) runs the vertical one first when the height shrinks by more than twice what the width shrinks,
    ``h_in - h > 0 and h_in - h > 2 * (w_in - w)`` (a growing width shrinks by a negative amount), to make the
    horizontal pass shorter; otherwise, and always before Pillow 13, the horizontal one first. Checked against
    Pillow's output on random sizes (``benchmarks/pil_agreement.py``, docs/benchmarks.md).
    """
    shrink_h, shrink_w = size_in[0] - size[0], size_in[1] - size[1]
    if _PILLOW_PICKS_THE_ORDER and shrink_h > 0 and shrink_h > 2 * shrink_w:
        return size[0], size_in[1]
    return size_in[0], size[1]


_PILLOW_PICKS_THE_ORDER = tuple(int(p) for p in PIL.__version__.split('.')[:2]) >= (13, 0)


def resize_float(images: Tensor, size: Tuple[int, int], interpolation: str) -> Tensor:
    """``resize`` (bilinear, bicubic) for devices without torch's uint8 kernel: the two antialiased passes in
    float32, each rounded and clipped to uint8 levels as Pillow rounds them."""
    x = images.float()
    x = F.interpolate(x, size=_first_pass(x.shape[-2:], size), mode=interpolation, antialias=True)
    x = F.interpolate(x.round_().clamp_(0, 255), size=size, mode=interpolation, antialias=True)
    return _to_uint8(x.round_().clamp_(0, 255))


def _filter(code: int, x: Tensor) -> Tensor:
    """Pillow's resampling filters (``libImaging/Resample.c``): the triangle, and the cubic with a = -0.5."""
    x = x.abs()
    if code == BILINEAR:
        return (1 - x).clamp_(min=0)
    a = -0.5
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return torch.where(x < 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


def _crop_weights(start: Tensor, extent: Tensor, size: int, length: int, code: int, device: torch.device) -> Tensor:
    """Per image the ``(size, length)`` matrix that resamples the source pixels ``start .. start + extent`` (CPU
    ``(k,)`` tensors) of a line of ``length`` to ``size`` pixels as Pillow's resize of the cropped image does
    (``precompute_coeffs``: the window ``[trunc(c - support + 0.5), trunc(c + support + 0.5))`` around each output
    pixel's centre ``c``, clipped to the crop, the filter stretched by the scale when shrinking, the taps normalised),
    zero outside the window; nearest: Pillow's pixel choice (``_nearest_indices``) as ones. Float64 (the weights
    become exact bfloat16 pairs later)."""
    rel = (torch.arange(length, dtype=torch.float64).view(1, 1, -1)
           - start.to(torch.float64).view(-1, 1, 1)).to(device)  # each source pixel's place in the crop
    if code == NEAREST:
        pick = torch.stack([_nearest_indices(int(e), size) for e in extent.tolist()])
        return (rel == pick.to(device=device, dtype=torch.float64).unsqueeze(-1)).to(torch.float64)
    extent = extent.to(device=device, dtype=torch.float64).view(-1, 1, 1)
    out = torch.arange(size, dtype=torch.float64, device=device).view(1, -1, 1)
    scale = extent / size
    filterscale = scale.clamp(min=1.0)
    support = (1.0 if code == BILINEAR else 2.0) * filterscale
    centre = (out + 0.5) * scale
    low = torch.trunc(centre - support + 0.5).clamp_(min=0)
    high = torch.minimum(torch.trunc(centre + support + 0.5), extent)
    w = _filter(code, (rel - centre + 0.5) / filterscale) * ((rel >= low) & (rel < high))
    total = w.sum(-1, keepdim=True)
    return w / torch.where(total == 0, torch.ones_like(total), total)


def _exact_pair(w: Tensor) -> Tuple[Tensor, Tensor]:
    """``w`` as the sum of two float32 matrices whose values bfloat16 holds exactly (error ~2^-17 relative): their
    products with uint8 levels are exact in TF32 too, so the matmuls below give float32 sums whatever the run's
    matmul precision (``tcnn train`` allows TF32)."""
    high = w.to(torch.bfloat16).to(torch.float64)
    return high.float(), (w - high).to(torch.bfloat16).float()


def _matmul_exact(x: Tensor, pair: Tuple[Tensor, Tensor], right: bool) -> Tensor:
    """``x @ w.T`` (``right``) or ``w @ x`` for ``w`` given by ``_exact_pair``, rounded and clipped to uint8 levels
    as Pillow rounds each pass."""
    if right:
        y = torch.matmul(x, pair[0].transpose(-1, -2)) + torch.matmul(x, pair[1].transpose(-1, -2))
    else:
        y = torch.matmul(pair[0], x) + torch.matmul(pair[1], x)
    return y.round_().clamp_(0, 255)


def resized_crops(images: Sequence[Tensor], boxes: Tensor, size: int, codes: Tensor, flips: Tensor,
                  chunk: int = 64) -> Tensor:
    """``resize(image[:, top:top + h, left:left + w], (size, size), INTERPOLATIONS[code])`` per image, flipped
    horizontally where ``flips``, for a batch at once: uint8 ``(n, 3, size, size)``.

    Why: one resize per image is about ten kernel launches each on a GPU; here the images are padded into one tensor
    and each pass is a batched matrix product with per-image weights (the crop's offset, its scale and the flip are
    the weights' columns and rows), a few launches per chunk of images. The passes and their order are ``resize``'s
    (``_first_pass``), each rounded to uint8 levels; the sums are float32 (``_exact_pair``), so the result is
    ``resize_float``'s but where a sum lies within rounding error of .5 (the two are equally far from Pillow's).

    Args:
        images: n uint8 ``(3, H_i, W_i)`` images on one device.
        boxes: ``(n, 4)`` crop boxes ``(top, left, height, width)``.
        size: The output side.
        codes: ``(n,)`` indices of ``INTERPOLATIONS``.
        flips: ``(n,)`` bool, a horizontal flip after the resize.
        chunk: Images per batched product (bounds the float32 copy of the padded images).
    """
    device = images[0].device
    out = torch.empty((len(images), 3, size, size), dtype=torch.uint8, device=device)
    boxes, codes, flips = boxes.cpu(), codes.cpu(), flips.cpu().bool()
    vertical_first = torch.tensor([_first_pass((int(h), int(w)), (size, size))[0] != int(h)
                                   for _, _, h, w in boxes.tolist()], dtype=torch.bool)
    for code in torch.unique(codes).tolist():
        for first_v in (False, True):
            group = ((codes == code) & (vertical_first == first_v)).nonzero().view(-1).tolist()
            for lo in range(0, len(group), chunk):
                index = group[lo:lo + chunk]
                heights = [images[i].shape[-2] for i in index]
                widths = [images[i].shape[-1] for i in index]
                x = images[index[0]].new_zeros((len(index), 3, max(heights), max(widths)), dtype=torch.float32)
                for k, i in enumerate(index):
                    x[k, :, :heights[k], :widths[k]] = images[i]
                b = boxes[index]
                rows = _exact_pair(_crop_weights(b[:, 0], b[:, 2], size, x.shape[-2], code, device))
                wx = _crop_weights(b[:, 1], b[:, 3], size, x.shape[-1], code, device)
                flip = flips[index].to(device).view(-1, 1, 1)
                columns = _exact_pair(torch.where(flip, wx.flip(1), wx))
                rows = tuple(r.unsqueeze(1) for r in rows)  # (k, 1, size, H): the same rows for the 3 channels
                columns = tuple(c.unsqueeze(1) for c in columns)
                if first_v:
                    y = _matmul_exact(_matmul_exact(x, rows, right=False), columns, right=True)
                else:
                    y = _matmul_exact(_matmul_exact(x, columns, right=True), rows, right=False)
                out.index_copy_(0, torch.tensor(index, device=device), y.to(torch.uint8))
    return out


@functools.lru_cache(maxsize=1024)
def _nearest_indices(size_in: int, size_out: int) -> Tensor:
    """The source pixel of each output pixel in PIL's nearest resize (``ImagingScaleAffine``: ``xo = scale / 2``,
    then ``xo += scale`` per pixel in double precision, ``floor``). The running sum matters: where ``(x + 0.5) *
    scale`` is an exact integer (96 -> 71 px, x = 35), Pillow's accumulated value lies just below it, and
    ``nearest-exact``'s product does not."""
    scale = size_in / size_out
    index, xo = [], scale * 0.5
    for _ in range(size_out):
        index.append(min(int(xo), size_in - 1))
        xo += scale
    return torch.tensor(index, dtype=torch.int64)


def hflip(images: Tensor) -> Tensor:
    return images.flip(-1)


# ----------------------------------------------------------------------------------------------- lookup-table ops


def invert(images: Tensor) -> Tensor:
    """``ImageOps.invert``."""
    return 255 - images


def posterize(images: Tensor, bits: Tensor) -> Tensor:
    """``ImageOps.posterize`` keeping ``bits`` bits per image (``i & ~(2 ** (8 - bits) - 1)``); 8 or more bits: the
    image, 0 or fewer: black (``tcnn.data.transforms.posterize``, as timm's op gets it on every Pillow)."""
    shift = (8 - _column(bits, images, torch.int64)).clamp(0, 8)
    mask = ((255 >> shift) << shift).to(torch.uint8)  # the kept high bits; 8 dropped bits: mask 0, a black image
    return images & mask


def solarize(images: Tensor, threshold: Tensor) -> Tensor:
    """``ImageOps.solarize``: ``255 - i`` where ``i >= threshold``."""
    t = _column(threshold, images, torch.int64)
    return torch.where(images.long() < t, images, 255 - images)


def solarize_add(images: Tensor, add: Tensor, threshold: int = 128) -> Tensor:
    """timm's ``solarize_add``: ``min(255, i + add)`` where ``i < threshold``."""
    a = _column(add, images, torch.int64)
    i = images.long()
    return torch.where(i < threshold, (i + a).clamp_(max=255), i).to(torch.uint8)


def _histograms(images: Tensor) -> Tensor:
    """``Image.histogram()`` of each image: ``(n, 3, 256)`` int64 counts per channel."""
    n, c = images.shape[:2]
    offsets = torch.arange(n * c, device=images.device).view(n, c, 1) * 256
    index = images.reshape(n, c, -1).long() + offsets
    return torch.bincount(index.view(-1), minlength=n * c * 256).view(n, c, 256)


def _apply_luts(images: Tensor, luts: Tensor) -> Tensor:
    """``Image.point(lut)`` with one 256-entry table per image and channel (``luts``: ``(n, 3, 256)``)."""
    n, c, h, w = images.shape
    return luts.to(torch.uint8).gather(2, images.reshape(n, c, h * w).long()).view(n, c, h, w)


def autocontrast(images: Tensor) -> Tensor:
    """``ImageOps.autocontrast`` (no cutoff): per channel, ``int(i * 255 / (hi - lo) - lo * 255 / (hi - lo))``
    clipped to [0, 255], in double precision as PIL's Python computes it; identity where ``hi <= lo``."""
    hist = _histograms(images)
    levels = torch.arange(256, device=images.device)
    present = hist > 0
    lo = torch.where(present, levels, 256).amin(-1, keepdim=True)
    hi = torch.where(present, levels, -1).amax(-1, keepdim=True)
    # a true division (``255.0 / tensor`` would multiply by a rounded reciprocal, one ulp off PIL's quotient)
    scale = torch.full_like(lo, 255, dtype=torch.float64).div_((hi - lo).clamp(min=1))
    offset = -lo.double() * scale
    lut = (levels.double() * scale + offset).trunc_().clamp_(0, 255).long()
    return _apply_luts(images, torch.where(hi <= lo, levels, lut))


def equalize(images: Tensor) -> Tensor:
    """``ImageOps.equalize``: per channel, ``step = (count - count of the last used level) // 255`` and
    ``lut[i] = (step // 2 + count below i) // step``, in integers; identity with one used level or ``step == 0``."""
    hist = _histograms(images)
    levels = torch.arange(256, device=images.device)
    present = hist > 0
    last = torch.where(present, levels, -1).amax(-1, keepdim=True)
    step = (hist.sum(-1, keepdim=True) - hist.gather(-1, last.clamp(min=0))) // 255
    below = hist.cumsum(-1) - hist
    lut = ((step // 2 + below) // step.clamp(min=1)).clamp_(max=255)  # Image.point clips a table to 8 bits
    keep = (present.sum(-1, keepdim=True) <= 1) | (step == 0)
    return _apply_luts(images, torch.where(keep, levels, lut))


# --------------------------------------------------------------------------------------------- ImageEnhance ops


def grayscale(images: Tensor) -> Tensor:
    """``Image.convert('L')`` of RGB images: ``(R * 19595 + G * 38470 + B * 7471 + 0x8000) >> 16`` (ITU-R 601-2 in
    Pillow's 16-bit fixed point), uint8 ``(n, 1, H, W)``."""
    x = images.int()
    lum = (x[:, 0] * 19595 + x[:, 1] * 38470 + x[:, 2] * 7471 + 0x8000) >> 16
    return lum.unsqueeze(1).to(torch.uint8)


def blend(degenerate: Tensor, images: Tensor, factor: Tensor) -> Tensor:
    """``Image.blend(degenerate, image, factor)`` as Pillow's ``ImagingBlend`` computes it: ``in1 + alpha * (in2 -
    in1)`` in float32 (alpha a C float), truncated to uint8 and clipped when extrapolating (the enhancement of
    ``PIL.ImageEnhance``); ``degenerate`` broadcasts against ``images``."""
    alpha = _column(factor, images, torch.float32)
    base = degenerate.float()
    value = base + alpha * (images.int() - degenerate.int()).float()
    return _to_uint8(value.clamp_(0, 255))  # truncated, as Pillow's (UINT8) cast


def color(images: Tensor, factor: Tensor) -> Tensor:
    """``ImageEnhance.Color(img).enhance(factor)``: a blend with the image's 'L' conversion."""
    return blend(grayscale(images), images, factor)


def contrast(images: Tensor, factor: Tensor) -> Tensor:
    """``ImageEnhance.Contrast(img).enhance(factor)``: a blend with a flat image of the 'L' histogram's mean, rounded
    (``int(mean + 0.5)``; the sum of integers is exact in double precision, as in ``ImageStat``)."""
    lum = grayscale(images)
    count = lum[0].numel()
    mean = lum.view(lum.shape[0], -1).sum(-1, dtype=torch.int64).double() / count
    flat = (mean + 0.5).floor_().view(-1, 1, 1, 1).to(torch.uint8)
    return blend(flat, images, factor)


def brightness(images: Tensor, factor: Tensor) -> Tensor:
    """``ImageEnhance.Brightness(img).enhance(factor)``: a blend with black."""
    return blend(torch.zeros((), dtype=torch.uint8, device=images.device), images, factor)


# Pillow's SMOOTH kernel (ImageFilter.SMOOTH: 1 1 1 / 1 5 1 / 1 1 1, scale 13), divided by its scale in double and
# stored as C floats, as Pillow's _imaging.c does before ImagingFilter3x3
_SMOOTH_EDGE = float(torch.tensor(1 / 13, dtype=torch.float32))
_SMOOTH_CENTRE = float(torch.tensor(5 / 13, dtype=torch.float32))


def _smooth(images: Tensor) -> Tensor:
    """``img.filter(ImageFilter.SMOOTH)``: Pillow's ``ImagingFilter3x3`` in float32, in its order of operations (row
    below, row, row above; 0.5 added first for rounding; clipped and truncated), the one-pixel border copied."""
    x = images.float()
    k1 = torch.tensor(_SMOOTH_EDGE, dtype=torch.float32, device=x.device)
    k5 = torch.tensor(_SMOOTH_CENTRE, dtype=torch.float32, device=x.device)

    def row(r: Tensor, centre: Tensor) -> Tensor:
        return (r[..., :-2] * k1 + r[..., 1:-1] * centre) + r[..., 2:] * k1

    ss = torch.full_like(x[..., 1:-1, 1:-1], 0.5)
    ss = ss + row(x[..., 2:, :], k1)
    ss = ss + row(x[..., 1:-1, :], k5)
    ss = ss + row(x[..., :-2, :], k1)
    out = images.clone()
    out[..., 1:-1, 1:-1] = _to_uint8(ss.clamp_(0, 255))
    return out


def sharpness(images: Tensor, factor: Tensor) -> Tensor:
    """``ImageEnhance.Sharpness(img).enhance(factor)``: a blend with the SMOOTH-filtered image."""
    if images.shape[-1] < 3 or images.shape[-2] < 3:
        return images.clone()  # Pillow's filter returns a copy of an image smaller than its kernel
    return blend(_smooth(images), images, factor)


# --------------------------------------------------------------------------------------------------- affine ops


def _sampling_grid(matrix: Tensor, height: int, width: int) -> Tuple[Tensor, Tensor]:
    """``grid_sample``'s grid (``align_corners=False``) for PIL's ``transform(AFFINE, (a, b, c, d, e, f))``, which
    samples output pixel (x, y) at ``(a (x + .5) + b (y + .5) + c, d (x + .5) + e (y + .5) + f)`` in continuous
    coordinates (pixel i spans [i, i + 1)): the same map in normalised coordinates, ``(n, H, W, 2)`` float32; and
    where that point lies inside the image, Pillow's ``0 <= x < W and 0 <= y < H`` (``(n, H, W)`` bool).

    Broadcast sums of a row and a column term (3x faster than ``affine_grid``'s batched product on the CPU).
    """
    a, b, c, d, e, f = (v.view(-1, 1, 1) for v in matrix.double().unbind(-1))
    ratio = height / width
    dev = matrix.device
    xn = ((torch.arange(width, device=dev, dtype=torch.float64) * 2 + 1) / width - 1).view(1, 1, width)
    yn = ((torch.arange(height, device=dev, dtype=torch.float64) * 2 + 1) / height - 1).view(1, height, 1)
    grid = torch.empty((len(matrix), height, width, 2), dtype=torch.float32, device=dev)
    gx, gy = grid[..., 0], grid[..., 1]
    torch.add((a * xn).float(), (b * ratio * yn).float(), out=gx).add_((a + b * ratio + 2 * c / width - 1).float())
    torch.add((d / ratio * xn).float(), (e * yn).float(), out=gy).add_((d / ratio + e + 2 * f / height - 1).float())
    inside = (gx >= -1) & (gx < 1) & (gy >= -1) & (gy < 1)
    return grid, inside


def _affine_nearest(images: Tensor, matrix: Tensor) -> Tuple[Tensor, Tensor]:
    """Pillow's nearest-neighbour affine transform exactly: ``ImagingScaleAffine`` for a pure scale/translation
    (``b == d == 0``: floor of the double coordinate), else ``affine_fixed`` (16.16 fixed point, ``>> 16``).
    Returns the gathered images and where the source pixel lies inside."""
    n, ch, h, w = images.shape
    m = matrix.double().view(-1, 6, 1, 1)
    dev = images.device
    x = torch.arange(w, dtype=torch.float64, device=dev).view(1, 1, w)
    y = torch.arange(h, dtype=torch.float64, device=dev).view(1, h, 1)
    a, b, c, d, e, f = m.unbind(1)
    # ImagingScaleAffine: xo = c + a / 2, then xo += a per pixel; the running sums in double on the CPU, where
    # cumsum adds in order (on a GPU a parallel scan would round differently)
    cpu = m.cpu()

    def running(start: Tensor, step: Tensor, count: int) -> Tensor:
        steps = torch.cat([start.view(-1, 1), step.view(-1, 1).expand(-1, count - 1)], dim=1)
        return torch.cumsum(steps, dim=1).floor_().to(dev)

    scale_x = running(cpu[:, 2] + cpu[:, 0] * 0.5, cpu[:, 0], w).view(n, 1, w).expand(n, h, w)
    scale_y = running(cpu[:, 5] + cpu[:, 4] * 0.5, cpu[:, 4], h).view(n, h, 1).expand(n, h, w)

    def fix(v: Tensor) -> Tensor:
        return torch.floor(v * 65536.0 + 0.5).long()

    a0, a1, a3, a4 = fix(a), fix(b), fix(d), fix(e)
    a2, a5 = fix(c + a * 0.5 + b * 0.5), fix(f + d * 0.5 + e * 0.5)
    xl, yl = x.long(), y.long()
    fixed_x = ((a2 + yl * a1 + xl * a0) >> 16).double()
    fixed_y = ((a5 + yl * a4 + xl * a3) >> 16).double()
    scaling = ((b == 0) & (d == 0)).view(-1, 1, 1)
    sx = torch.where(scaling, scale_x, fixed_x).long()
    sy = torch.where(scaling, scale_y, fixed_y).long()
    inside = (sx >= 0) & (sx < w) & (sy >= 0) & (sy < h)
    index = (sy.clamp(0, h - 1) * w + sx.clamp(0, w - 1)).view(n, 1, h * w).expand(n, ch, h * w)
    return images.reshape(n, ch, h * w).gather(2, index).view(n, ch, h, w), inside


def affine(images: Tensor, matrix: Tensor, fill: Sequence[int], interpolation: Tensor) -> Tensor:
    """``img.transform(img.size, Image.AFFINE, matrix, resample, fillcolor=fill)`` of each image.

    Args:
        images: uint8 ``(n, 3, H, W)``.
        matrix: ``(n, 6)`` PIL affine coefficients ``(a, b, c, d, e, f)``: output (x, y) samples the input at
            ``(a x + b y + c, d x + e y + f)``, pixel centres at half-integers.
        fill: The RGB fill of pixels whose source lies outside the image (timm's ``img_mean``).
        interpolation: ``(n,)`` codes of ``INTERPOLATIONS`` (Pillow's resample).

    A pixel is filled where its source point lies outside [0, W) x [0, H), Pillow's test (here on float32 normalised
    coordinates, Pillow's are double: a pixel whose source lies within ~1e-5 px of the edge may go the other way);
    inside, bilinear and bicubic taps beyond the edge repeat the edge pixel (``XCLIP``/``YCLIP``: ``grid_sample``'s
    ``border`` padding) and the value is truncated to uint8 (Pillow's ``(UINT8)`` cast; ``1e-3`` absorbs float32
    rounding of exact values). Nearest is Pillow's own arithmetic, exactly.
    """
    n, _, h, w = images.shape
    out = torch.empty_like(images)
    codes = interpolation.to('cpu', torch.int64)
    fill_value = torch.tensor(list(fill), dtype=torch.uint8, device=images.device).view(1, 3, 1, 1)
    for code in torch.unique(codes).tolist():
        chosen = (codes == code).nonzero().view(-1)
        every = len(chosen) == n
        sub = images if every else images.index_select(0, chosen.to(images.device))
        mat = matrix if every else matrix.index_select(0, chosen.to(matrix.device))
        mat = mat.to(images.device)
        if code == NEAREST:
            result, inside = _affine_nearest(sub, mat)
        else:
            grid, inside = _sampling_grid(mat, h, w)
            mode = 'bilinear' if code == BILINEAR else 'bicubic'
            value = F.grid_sample(sub.float(), grid, mode=mode, padding_mode='border', align_corners=False)
            result = _to_uint8(value.clamp_(0, 255).add_(1e-3))
        result = torch.where(inside.unsqueeze(1), result, fill_value)
        if every:
            return result
        out.index_copy_(0, chosen.to(images.device), result)
    return out


def _matrix(*columns: Tensor) -> Tensor:
    return torch.stack([c.double() for c in columns], dim=-1)


def rotate(images: Tensor, degrees: Tensor, fill: Sequence[int], interpolation: Tensor) -> Tensor:
    """``img.rotate(degrees, resample, fillcolor=fill)``: counter-clockwise about the image centre, Pillow's matrix
    (``angle % 360``, cos and sin rounded to 15 decimals, centre ``(w / 2, h / 2)``); angle 0 is the image."""
    h, w = images.shape[-2:]
    angle = torch.remainder(degrees.double(), 360.0)
    theta = -torch.deg2rad(angle)
    cos, sin = torch.round(torch.cos(theta), decimals=15), torch.round(torch.sin(theta), decimals=15)
    cx, cy = w / 2, h / 2
    c = cos * -cx + sin * -cy + cx
    f = -sin * -cx + cos * -cy + cy
    out = affine(images, _matrix(cos, sin, c, -sin, cos, f), fill, interpolation)
    same = angle == 0
    if bool(same.any()):  # Pillow returns a copy
        out = torch.where(same.to(images.device).view(-1, 1, 1, 1), images, out)
    return out


def shear_x(images: Tensor, factor: Tensor, fill: Sequence[int], interpolation: Tensor) -> Tensor:
    """timm's ``shear_x``: ``transform(AFFINE, (1, factor, 0, 0, 1, 0))``."""
    one, zero = torch.ones_like(factor, dtype=torch.float64), torch.zeros_like(factor, dtype=torch.float64)
    return affine(images, _matrix(one, factor, zero, zero, one, zero), fill, interpolation)


def shear_y(images: Tensor, factor: Tensor, fill: Sequence[int], interpolation: Tensor) -> Tensor:
    """timm's ``shear_y``: ``transform(AFFINE, (1, 0, 0, factor, 1, 0))``."""
    one, zero = torch.ones_like(factor, dtype=torch.float64), torch.zeros_like(factor, dtype=torch.float64)
    return affine(images, _matrix(one, zero, zero, factor, one, zero), fill, interpolation)


def translate_x(images: Tensor, pixels: Tensor, fill: Sequence[int], interpolation: Tensor) -> Tensor:
    """timm's ``translate_x_abs``: ``transform(AFFINE, (1, 0, pixels, 0, 1, 0))`` (the content moves left)."""
    one, zero = torch.ones_like(pixels, dtype=torch.float64), torch.zeros_like(pixels, dtype=torch.float64)
    return affine(images, _matrix(one, zero, pixels, zero, one, zero), fill, interpolation)


def translate_y(images: Tensor, pixels: Tensor, fill: Sequence[int], interpolation: Tensor) -> Tensor:
    """timm's ``translate_y_abs``: ``transform(AFFINE, (1, 0, 0, 0, 1, pixels))``."""
    one, zero = torch.ones_like(pixels, dtype=torch.float64), torch.zeros_like(pixels, dtype=torch.float64)
    return affine(images, _matrix(one, zero, zero, zero, one, pixels), fill, interpolation)


# ------------------------------------------------------------------------------------- ColorJitter (torchvision)


def _gray_v2(images: Tensor) -> Tensor:
    """torchvision v2's ``_rgb_to_grayscale_image(preserve_dtype=False)`` of uint8 images, floored as its contrast
    and saturation ops floor it: float32 ``(n, 1, H, W)``; the same tensor ops, hence the same floats."""
    r, g, b = images.unbind(dim=-3)
    gray = r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(-3)
    return gray.floor_()  # the values are >= 0: torchvision's truncating cast (floor_ is in place, trunc_ slow)


def _blend_v2_(x: Tensor, other: Tensor, ratio: Tensor) -> Tensor:
    """torchvision v2's ``_blend`` in place on float32 images ``x`` (uint8 values): ``x.mul(ratio).add_(other,
    alpha=1 - ratio)`` in float32, clamped (``1 - ratio`` in double first, as torchvision computes its ``alpha``);
    the caller truncates.

    torch's vectorised ``add_`` with ``alpha`` is a fused multiply-add (one rounding), which a per-image ``alpha``
    tensor cannot call; ``addcmul_`` runs the same fused kernel (measured: bit-equal to torchvision, where an unfused
    float32 add differs by one level on 0.2% of saturation's pixels).
    """
    r = _column(ratio, x, torch.float64)
    x.mul_(r.float())
    if other.shape[-2:] != x.shape[-2:]:
        # contrast's per-image mean: addcmul_ with two broadcast (n, 1, 1, 1) operands takes torch's strided loop
        # (7x the time of one full-size operand on the CPU); the same values spread over (n, 1, H, W) do not
        other = other.expand(*other.shape[:-2], *x.shape[-2:]).contiguous()
    return x.addcmul_(other, (1.0 - r).float()).clamp_(0, 255)


def _brightness_(x: Tensor, factor: Tensor) -> Tensor:
    """torchvision's ``adjust_brightness`` in place on float32 images (uint8 values), clamped; the caller
    truncates."""
    return x.mul_(_column(factor, x, torch.float32)).clamp_(0, 255)


def _contrast_(x: Tensor, factor: Tensor) -> Tensor:
    """torchvision's ``adjust_contrast`` in place on float32 images (uint8 values): a blend with the mean of the
    floored grayscale; the caller truncates."""
    return _blend_v2_(x, _gray_v2(x).mean(dim=(-3, -2, -1), keepdim=True), factor)


def _saturation_(x: Tensor, factor: Tensor) -> Tensor:
    """torchvision's ``adjust_saturation`` in place on float32 images (uint8 values): a blend with the floored
    grayscale; the caller truncates."""
    return _blend_v2_(x, _gray_v2(x), factor)


def _hue_(x: Tensor, factor: Tensor) -> Tensor:
    """torchvision's ``adjust_hue`` of float32 images ``x`` (uint8 values, left unchanged): to [0, 1], HSV, hue
    shifted modulo 1, back to RGB, scaled as ``to_dtype(scale=True)`` scales (``* (255 + 1 - 1e-3)``); the caller
    truncates."""
    hsv = _rgb_to_hsv(x.mul(1.0 / 255))
    h, s, v = hsv.unbind(dim=-3)
    h = h.add(_column(factor, x, torch.float32).view(-1, 1, 1)).remainder_(1.0)
    return _hsv_to_rgb(torch.stack((h, s, v), dim=-3)).mul_(255 + 1.0 - 1e-3)


def adjust_brightness(images: Tensor, factor: Tensor) -> Tensor:
    """torchvision's ``adjust_brightness`` on uint8 tensors."""
    return _to_uint8(_brightness_(images.float(), factor))


def adjust_contrast(images: Tensor, factor: Tensor) -> Tensor:
    """torchvision's ``adjust_contrast`` on uint8 tensors: a blend with the mean of the floored grayscale."""
    return _to_uint8(_contrast_(images.float(), factor))


def adjust_saturation(images: Tensor, factor: Tensor) -> Tensor:
    """torchvision's ``adjust_saturation`` on uint8 tensors: a blend with the floored grayscale."""
    return _to_uint8(_saturation_(images.float(), factor))


def _rgb_to_hsv(image: Tensor) -> Tensor:
    """torchvision v2's ``_rgb_to_hsv`` (float RGB in [0, 1]; Pillow's algorithm), the same tensor ops."""
    r, g, _ = image.unbind(dim=-3)
    minc, maxc = torch.aminmax(image, dim=-3)
    eqc = maxc == minc
    channels_range = maxc - minc
    ones = torch.ones_like(maxc)
    s = channels_range / torch.where(eqc, ones, maxc)
    channels_range_divisor = torch.where(eqc, ones, channels_range).unsqueeze_(dim=-3)
    rc, gc, bc = ((maxc.unsqueeze(dim=-3) - image) / channels_range_divisor).unbind(dim=-3)
    mask_maxc_neq_r = maxc != r
    mask_maxc_eq_g = maxc == g
    hg = rc.add(2.0).sub_(bc).mul_(mask_maxc_eq_g & mask_maxc_neq_r)
    hr = bc.sub_(gc).mul_(~mask_maxc_neq_r)
    hb = gc.add_(4.0).sub_(rc).mul_(mask_maxc_neq_r.logical_and_(mask_maxc_eq_g.logical_not_()))
    h = hr.add_(hg).add_(hb)
    h = h.mul_(1.0 / 6.0).add_(1.0).fmod_(1.0)
    return torch.stack((h, s, maxc), dim=-3)


def _hsv_to_rgb(img: Tensor) -> Tensor:
    """torchvision v2's ``_hsv_to_rgb``, the same tensor ops."""
    h, s, v = img.unbind(dim=-3)
    h6 = h.mul(6)
    i = torch.floor(h6)
    f = h6.sub_(i)
    i = i.to(dtype=torch.int32)
    sxf = s * f
    one_minus_s = 1.0 - s
    q = (1.0 - sxf).mul_(v).clamp_(0.0, 1.0)
    t = sxf.add_(one_minus_s).mul_(v).clamp_(0.0, 1.0)
    p = one_minus_s.mul_(v).clamp_(0.0, 1.0)
    i.remainder_(6)
    vpqt = torch.stack((v, p, q, t), dim=-3)
    select = torch.tensor([[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]], dtype=torch.long,
                          device=img.device)
    select = select[:, i].moveaxis(0, -3)
    return vpqt.gather(-3, select)


def adjust_hue(images: Tensor, factor: Tensor) -> Tensor:
    """torchvision's ``adjust_hue`` on uint8 tensors: to float in [0, 1], HSV, hue shifted modulo 1, back to RGB and
    to uint8 as ``to_dtype(scale=True)`` does (``* (255 + 1 - 1e-3)``, truncated)."""
    return _to_uint8(_hue_(images.float(), factor))


def color_jitter(images: Tensor, factors: Tensor, orders: Tensor, active: Sequence[bool], out: Tensor) -> Tensor:
    """torchvision's ``ColorJitter`` (v2's uint8 tensor ops, each result truncated to uint8 as the next one reads it)
    of uint8 images ``(n, 3, H, W)``, written into ``out`` as float32 holding the uint8 values.

    Args:
        images: The uint8 images.
        factors: ``(n, 4)`` brightness, contrast, saturation and hue factors.
        orders: ``(n, 4)`` each image's order of the four (a permutation of 0-3).
        active: Which of the four are on.
        out: float32 ``(n, 3, H, W)``.

    An image's steps depend on its order only: the batch is gathered by order (as uint8, the cheap copy), converted
    to float once, each order's images go through their steps together on one slice, in place, and the batch is
    scattered back into ``out``. A float image holding uint8 values is as exact as the uint8 one (every op casts to
    float32 first, and the truncating cast is a floor of values >= 0), without two casts per op.
    """
    steps = (_brightness_, _contrast_, _saturation_, _hue_)
    keys = [tuple(f for f in order if active[f]) for order in orders.tolist()]
    perm = sorted(range(len(keys)), key=keys.__getitem__)  # stable: an order's images keep their batch order
    identity = perm == list(range(len(perm)))
    index = torch.tensor(perm, device=images.device)
    block = out.copy_(images) if identity else images.index_select(0, index).float()
    factors = factors.to(device=images.device, dtype=torch.float64)
    factors = factors if identity else factors.index_select(0, index.to(factors.device))
    lo = 0
    for key, run in itertools.groupby(keys[i] for i in perm):
        hi = lo + sum(1 for _ in run)
        view = block[lo:hi]
        for f in key:
            if f == 3:  # the only step not in place: HSV needs the unchanged RGB
                view.copy_(_hue_(view, factors[lo:hi, f]))
            else:
                steps[f](view, factors[lo:hi, f])
            view.floor_()  # uint8's truncating cast of values >= 0 (trunc_ is 15x slower on the CPU)
        lo = hi
    return out if identity else out.index_copy_(0, index, block)


# ------------------------------------------------------------------------------------------ normalise and erase


def normalize(images: Tensor, mean: Sequence[float], std: Sequence[float], out: Optional[Tensor] = None) -> Tensor:
    """torchvision's ``ToTensor`` then ``Normalize``: ``(x / 255 - mean) / std`` in float32, the same ops (into
    ``out`` if given; ``out=images``: in place on float images)."""
    m = torch.tensor(mean, dtype=torch.float32, device=images.device).view(-1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=images.device).view(-1, 1, 1)
    x = images.float() if out is None else out if out is images else out.copy_(images)
    return x.div_(255).sub_(m).div_(s)


def erase(images: Tensor, boxes: List[List[Tuple[int, int, int, int]]], seeds: Optional[Sequence[int]],
          mode: str) -> Tensor:
    """timm's ``RandomErasing._erase`` for given boxes, in place on normalised float images ``(n, 3, H, W)``.

    Args:
        images: The normalised images.
        boxes: Per image its boxes ``(top, left, height, width)`` in drawing order (a later box covers an earlier).
        seeds: Per image the seed of its noise (modes 'rand' and 'pixel'): a generator on the images' device draws
            each box's normal noise in order, ``(3, h, w)`` per pixel or ``(3, 1, 1)`` per box, as timm's
            ``_get_pixels``.
        mode: 'const' (zeros), 'rand' or 'pixel'.
    """
    generator = None
    for i, image_boxes in enumerate(boxes):
        if not image_boxes:
            continue
        if mode != 'const':
            generator = generator or torch.Generator(device=images.device)
            generator.manual_seed(int(seeds[i]))
        for top, left, h, w in image_boxes:
            shape = (images.shape[1], h, w) if mode == 'pixel' else (images.shape[1], 1, 1)
            if mode == 'const':
                images[i, :, top:top + h, left:left + w] = 0
            else:
                noise = torch.randn(shape, generator=generator, dtype=images.dtype, device=images.device)
                images[i, :, top:top + h, left:left + w] = noise
    return images
