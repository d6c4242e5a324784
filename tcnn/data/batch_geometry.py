"""The geometric pixel ops of timm's training and eval transforms on batches of uint8 images, as PIL computes them.

Each op takes a uint8 tensor ``(n, 3, H, W)`` (the images that drew it) and per-image arguments as tensors of shape
``(n,)``, and returns a new uint8 tensor (``tcnn.data.batch_augment`` gathers the images that drew an op, calls it
once and scatters the result back):

* ``resize``: PIL's ``Image.resize`` (what ``RandomResizedCropAndInterpolation`` and the eval ``Resize`` call),
  antialiased when shrinking, in Pillow's two passes (``_first_pass``). On the CPU, torch's uint8 antialiased
  kernel, which follows Pillow's fixed-point arithmetic; elsewhere two float passes, each rounded to uint8 as
  Pillow rounds them (``resize_float``), or, for a batch of crops, a few batched matrix products (``resized_crops``);
  nearest: Pillow's pixel choice exactly. ``hflip``: ``RandomHorizontalFlip``.
* ``affine``, ``rotate``, ``shear_x``/``shear_y``, ``translate_x``/``translate_y``: ``Image.transform(AFFINE)`` and
  ``Image.rotate`` with a fill colour: PIL's coordinate convention and its out-of-image test, resampled by
  ``grid_sample`` (bilinear, bicubic) or exactly (nearest, in Pillow's 16.16 fixed point). Pillow's transform
  bicubic is a cubic convolution with a = -1 (``BICUBIC`` in ``libImaging/Geometry.c``; its *resize* uses a =
  -0.5), ``grid_sample``'s uses a = -0.75: bicubic outputs differ from Pillow's on many pixels, by several levels at
  edges (measured on photo-like images in docs/benchmarks.md, pinned in ``tests/test_batch_geometry.py``). Pillow's
  own arithmetic in torch ops (``benchmarks/pil_agreement.py``'s reference: its bytes exactly) costs several times
  ``grid_sample``'s fused kernel on the CPU, so it is not used.

Nothing here draws a random number.
"""
import functools
from typing import Sequence, Tuple

import PIL
import torch
import torch.nn.functional as F

from .batch_misc import to_uint8

__all__ = ['INTERPOLATIONS', 'NEAREST', 'BILINEAR', 'BICUBIC', 'resize', 'resize_float', 'resized_crops', 'hflip',
           'affine', 'rotate', 'shear_x', 'shear_y', 'translate_x', 'translate_y']

# Interpolation codes of the parameter tensors (``tcnn.data.batch_augment``): an index into this tuple.
INTERPOLATIONS = ('nearest', 'bilinear', 'bicubic')
NEAREST, BILINEAR, BICUBIC = range(3)

Tensor = torch.Tensor


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
    # torch's uint8 kernel fails an internal assert on a one-pixel output from more than one row: the float passes
    elif x.device.type == 'cpu' and _uint8_antialias(interpolation) and tuple(size) != (1, 1):
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
    return to_uint8(x.round_().clamp_(0, 255))


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
            result = to_uint8(value.clamp_(0, 255).add_(1e-3))
        result = torch.where(inside.unsqueeze(1), result, fill_value)
        if every:
            return result
        out.index_copy_(0, chosen.to(images.device), result)
    return out


def _matrix(*columns: Tensor) -> Tensor:
    """The ``(n, 6)`` float64 affine coefficients of six per-image columns."""
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


def _identity_with(value: Tensor, index: int) -> Tensor:
    """PIL's identity affine coefficients ``(1, 0, 0, 0, 1, 0)`` per image with coefficient ``index`` set to the
    image's ``value``: ``(n, 6)`` float64."""
    one, zero = torch.ones_like(value, dtype=torch.float64), torch.zeros_like(value, dtype=torch.float64)
    columns = [one, zero, zero, zero, one, zero]
    columns[index] = value
    return _matrix(*columns)


def shear_x(images: Tensor, factor: Tensor, fill: Sequence[int], interpolation: Tensor) -> Tensor:
    """timm's ``shear_x``: ``transform(AFFINE, (1, factor, 0, 0, 1, 0))``."""
    return affine(images, _identity_with(factor, 1), fill, interpolation)


def shear_y(images: Tensor, factor: Tensor, fill: Sequence[int], interpolation: Tensor) -> Tensor:
    """timm's ``shear_y``: ``transform(AFFINE, (1, 0, 0, factor, 1, 0))``."""
    return affine(images, _identity_with(factor, 3), fill, interpolation)


def translate_x(images: Tensor, pixels: Tensor, fill: Sequence[int], interpolation: Tensor) -> Tensor:
    """timm's ``translate_x_abs``: ``transform(AFFINE, (1, 0, pixels, 0, 1, 0))`` (the content moves left)."""
    return affine(images, _identity_with(pixels, 2), fill, interpolation)


def translate_y(images: Tensor, pixels: Tensor, fill: Sequence[int], interpolation: Tensor) -> Tensor:
    """timm's ``translate_y_abs``: ``transform(AFFINE, (1, 0, 0, 0, 1, pixels))``."""
    return affine(images, _identity_with(pixels, 5), fill, interpolation)
