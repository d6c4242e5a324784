#!/usr/bin/env python3
"""How far the batched augmentation's pixels (``tcnn.data.batch_geometry``, ``batch_colour``) lie from timm's PIL
transform's, in uint8 levels.

    python benchmarks/pil_agreement.py                  # every section: about 7 minutes on 2 busy cores
    python benchmarks/pil_agreement.py --quick          # fewer images: a smoke run
    python benchmarks/pil_agreement.py --section order resize
    python benchmarks/pil_agreement.py --save           # also writes results/cpu-pil-agreement-<date>.json

Sections (CPU, one torch thread; photo-like images from ``benchmarks/photos.py``, 375 x 500 and 500 x 375):

* ``order``: Pillow's pass order. For random sizes (tall, wide, both shrinking, both growing, and around the rule's
  boundary), the two orders computed by torch's uint8 kernel (Pillow's fixed-point resampling) are compared with
  Pillow's resize; where one order is closer, whether ``batch_geometry._first_pass`` picks it.
* ``resize``: the recipe's random resized crops (``BatchAugment.draw``: scale (0.08, 1), ratio (3/4, 4/3)) resized
  to 224 px, bicubic and bilinear, by each path (``resize``: torch's uint8 kernel, the CPU's; ``resize_float``:
  per image, float passes; ``resized_crops``: the batched product a GPU runs) against Pillow's ``crop().resize()``,
  over all crops and over the tall ones (Pillow resamples them vertically first; tcnn did not before issue 59).
* ``affine``: the recipe's RandAugment draws of the geometric ops (Rotate, ShearX/Y, TranslateX/YRel at magnitude
  9, std 0.5) on 224 px crops, through ``BatchAugment``'s op against timm's PIL op, for each interpolation.
* ``cost``: what matching Pillow's affine filters exactly would cost: rotations of 16 crops by
  ``batch_geometry.rotate`` (``grid_sample``), by ``pillow_affine_reference`` (Pillow's arithmetic in torch ops,
  float64 and float32) and by Pillow, their agreement with Pillow and their times.
* ``jitter``: ``batch_colour.tv_color_jitter`` (torchvision's tensor arithmetic) against torchvision's ColorJitter on
  PIL images (what timm's PIL pipeline runs), with ``ColorJitter(0.4, 0.4, 0.4, 0.1)``'s draws (factors and orders),
  each op alone and all four.

Each row: the fraction of values (pixels x channels) that differ, the mean and the maximum |difference|.
"""
import argparse
import datetime
import os
import random
import sys
from typing import Any, Callable, Dict, List, Sequence, Tuple

if __package__ in (None, ''):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402

from tcnn.data import batch_colour, batch_geometry  # noqa: E402
from tcnn.data.batch_augment import BatchAugment  # noqa: E402
from tcnn.data.rand_augment import rand_augment_op  # noqa: E402

from benchmarks.photos import photo  # noqa: E402
from benchmarks.report import machine_info, write_json  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
RECIPE = dict(auto_augment='rand-m9-mstd0.5-inc1', re_prob=0.0, mean=MEAN, std=STD)
PIL_RESAMPLE = {'nearest': Image.NEAREST, 'bilinear': Image.BILINEAR, 'bicubic': Image.BICUBIC}
SIZE = 224


def photo_arrays(count: int) -> List[np.ndarray]:
    """Photo-like HWC uint8 images, every fifth portrait."""
    return [np.array(photo(seed, *((500, 375) if seed % 5 == 4 else (375, 500)))) for seed in range(count)]


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1).contiguous()


def _levels(t: torch.Tensor) -> np.ndarray:
    return t.permute(1, 2, 0).numpy().astype(np.int64)


def _stats(diffs: Sequence[np.ndarray], **extra: Any) -> Dict[str, Any]:
    d = np.concatenate([x.ravel() for x in diffs]) if diffs else np.zeros(0, np.int64)
    if not d.size:
        return dict(extra, values=0)
    return dict(extra, values=int(d.size), differing=float((d > 0).mean()), mean=float(d.mean()), max=int(d.max()))


def _row(name: str, s: Dict[str, Any]) -> str:
    if 'values' not in s:
        return f'{name:<44} {s}'
    if not s['values']:
        return f'{name:<44} (none)'
    return f"{name:<44} differing {100 * s['differing']:7.3f}%  mean {s['mean']:.4f}  max {s['max']:3d}"


# ------------------------------------------------------------------------------------------------- pass order


def _two_orders(a: np.ndarray, size: Tuple[int, int], mode: str) -> Tuple[np.ndarray, np.ndarray]:
    """Pillow's two-pass resize in each order (horizontal first, vertical first) by torch's uint8 kernel."""
    x = _tensor(a)[None]
    h, w = a.shape[:2]
    out = []
    for first in ((h, size[1]), (size[0], w)):
        y = F.interpolate(F.interpolate(x, size=first, mode=mode, antialias=True), size=size, mode=mode,
                          antialias=True)
        out.append(y[0].permute(1, 2, 0).numpy().astype(np.int64))
    return out[0], out[1]


def pass_order(cases: int, seed: int = 0) -> Dict[str, Any]:
    rng = random.Random(seed)
    g = np.random.default_rng(seed)
    informative = agree = 0
    wrong: List[Tuple[int, int, Tuple[int, int]]] = []
    for i in range(cases):
        size = rng.choice([(32, 32), (48, 48), (64, 64), (40, 56), (56, 40)])
        kind = rng.choice(['tall', 'wide', 'any', 'boundary'])
        if kind == 'tall':
            h, w = rng.randint(size[0] + 1, 3 * size[0]), rng.randint(4, 2 * size[1])
        elif kind == 'wide':
            h, w = rng.randint(4, 2 * size[0]), rng.randint(size[1] + 1, 3 * size[1])
        elif kind == 'boundary':  # h_in - h = 2 (w_in - w) + {-1, 0, 1}
            dw = rng.randint(-size[1] // 2, size[1])
            h, w = size[0] + 2 * dw + rng.choice([-1, 0, 1]), size[1] + dw
        else:
            h, w = rng.randint(4, 3 * size[0]), rng.randint(4, 3 * size[1])
        if h < 2 or w < 2:
            continue
        # coarse blocks of random colours plus noise: edges whose bicubic overshoot the first pass clips
        blocks = g.integers(0, 256, (h // 4 + 2, w // 4 + 2, 3))
        a = np.clip(blocks.repeat(4, 0).repeat(4, 1)[:h, :w] + g.integers(-20, 21, (h, w, 3)), 0, 255).astype(np.uint8)
        mode = rng.choice(['bicubic', 'bilinear'])
        ref = np.asarray(Image.fromarray(a).resize(size[::-1], PIL_RESAMPLE[mode])).astype(np.int64)
        horizontal, vertical = (np.abs(o - ref).sum() for o in _two_orders(a, size, mode))
        if horizontal == vertical:
            continue
        informative += 1
        vertical_first = batch_geometry._first_pass((h, w), size)[0] != h
        if vertical_first == (vertical < horizontal):
            agree += 1
        else:
            wrong.append((h, w, size))
    return {'sizes': cases, 'informative': informative, 'agree': agree, 'disagree': len(wrong),
            'disagreeing sizes (h, w, to)': wrong[:5]}


# ----------------------------------------------------------------------------------------------------- resize


def _recipe_crops(images: List[np.ndarray], seed: int) -> List[Tuple[int, int, int, int]]:
    aug = BatchAugment(SIZE, **RECIPE)
    params = aug.draw_many([(random.Random(seed * 100003 + i), a.shape[:2]) for i, a in enumerate(images)])
    return [tuple(b) for b in params['crop'].tolist()]


def _tall(h: int, w: int) -> bool:
    """Whether Pillow 13 resizes an h x w crop to SIZE x SIZE vertically first (``ImagingResampleInner``: the
    height shrinks by more than twice what the width does) while the width shrinks too: the crops whose order tcnn's
    rule before issue 59 (vertical first only where the width grows) got wrong."""
    return h - SIZE > 2 * (w - SIZE) and w > SIZE


def resize_agreement(images: List[np.ndarray], seed: int = 0) -> Dict[str, Any]:
    boxes = _recipe_crops(images, seed)
    vertical = [_tall(h, w) for _, _, h, w in boxes]
    result: Dict[str, Any] = {'crops': len(boxes), 'tall crops': int(sum(vertical))}
    tensors = [_tensor(a) for a in images]
    for mode in ('bicubic', 'bilinear'):
        code = batch_geometry.INTERPOLATIONS.index(mode)
        batched = batch_geometry.resized_crops(tensors, torch.tensor(boxes), SIZE, torch.full((len(boxes),), code),
                                          torch.zeros(len(boxes), dtype=torch.bool))
        diffs: Dict[str, List[np.ndarray]] = {'uint8': [], 'float': [], 'batched': []}
        for k, (a, (top, left, h, w)) in enumerate(zip(images, boxes)):
            ref = np.asarray(Image.fromarray(a).crop((left, top, left + w, top + h)).resize(
                (SIZE, SIZE), PIL_RESAMPLE[mode])).astype(np.int64)
            crop = tensors[k][:, top:top + h, left:left + w]
            outs = {'uint8': batch_geometry.resize(crop, (SIZE, SIZE), mode),
                    'float': batch_geometry.resize_float(crop[None], (SIZE, SIZE), mode)[0], 'batched': batched[k]}
            for path, out in outs.items():
                diffs[path].append(np.abs(_levels(out) - ref))
        for path, d in diffs.items():
            result[f'{mode} {path}'] = _stats(d)
            result[f'{mode} {path}, tall crops'] = _stats([x for x, v in zip(d, vertical) if v])
    return result


# ----------------------------------------------------------------------------------------------------- affine


def _crops_224(images: List[np.ndarray], seed: int) -> List[np.ndarray]:
    """The recipe's crops of ``images`` as Pillow makes them (bicubic): RandAugment's input."""
    return [np.array(Image.fromarray(a).crop((left, top, left + w, top + h)).resize((SIZE, SIZE), Image.BICUBIC))
            for a, (top, left, h, w) in zip(images, _recipe_crops(images, seed))]


def affine_agreement(images: List[np.ndarray], seed: int = 1) -> Dict[str, Any]:
    import timm.data.auto_augment as timm_aa
    aug = BatchAugment(SIZE, **RECIPE)
    crops = _crops_224(images, seed)
    params = aug.draw_many([(random.Random(seed * 100003 + i), (SIZE, SIZE)) for i in range(len(crops))])
    # every geometric draw of the two layers, as (image, op name, argument)
    draws = [(i, aug.ra_ops[int(op)], float(params['ra_arg'][i, layer]))
             for i in range(len(crops)) for layer in range(aug.num_layers)
             for op in [params['ra_op'][i, layer]]
             if op >= 0 and aug.ra_ops[int(op)] in ('Rotate', 'ShearX', 'ShearY', 'TranslateXRel', 'TranslateYRel')]
    result: Dict[str, Any] = {}
    for mode in ('bicubic', 'bilinear', 'nearest'):
        code = batch_geometry.INTERPOLATIONS.index(mode)
        every: List[np.ndarray] = []
        for name in ('Rotate', 'ShearX', 'ShearY', 'TranslateXRel', 'TranslateYRel'):
            chosen = [(i, arg) for i, op, arg in draws if op == name]
            if not chosen:
                continue
            x = torch.stack([_tensor(crops[i]) for i, _ in chosen])
            args = torch.tensor([arg for _, arg in chosen], dtype=torch.float64)
            out = rand_augment_op(name).apply(x, args, aug.fill, torch.full((len(chosen),), code), aug.img_size)
            d = []
            for k, (i, arg) in enumerate(chosen):
                ref = timm_aa.NAME_TO_OP[name](Image.fromarray(crops[i]), arg, fillcolor=aug.fill,
                                               resample=PIL_RESAMPLE[mode])
                d.append(np.abs(_levels(out[k]) - np.asarray(ref).astype(np.int64)))
            result[f'{name} {mode}'] = _stats(d, images=len(chosen))
            every += d
        result[f'all {mode}'] = _stats(every, images=len(draws))
    return result


def _cubic_(v1: torch.Tensor, v2: torch.Tensor, v3: torch.Tensor, v4: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Pillow's ``BICUBIC(v, v1, v2, v3, v4, d)`` (``libImaging/Geometry.c``: a cubic convolution with a = -1),
    operation for operation in its order (so in double precision the same bits); consumes v1 and v3."""
    p4 = (v2 - v1).sub_(v3).add_(v4)
    p3 = (v1 - v2).mul_(2).add_(v3).sub_(v4)
    p2 = v3.sub_(v1)
    return p4.mul_(t).add_(p3).mul_(t).add_(p2).mul_(t).add_(v2)


def pillow_affine_reference(images: torch.Tensor, matrix: torch.Tensor, code: int,
                            dtype: torch.dtype = torch.float64) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pillow's bilinear (``code`` 1) or bicubic (2) affine filter in torch ops: each output pixel's source point in
    double (``affine_transform``), its 2 x 2 or 4 x 4 taps gathered with the edge repeated (``XCLIP``/``YCLIP``),
    Pillow's formulas in ``dtype``, clipped and truncated. Returns the images and where the source lies inside
    (the rest is the fill colour). What matching Pillow exactly costs outside ``grid_sample``'s fused kernel (the
    ``cost`` section); not used by tcnn."""
    n, ch, h, w = images.shape
    a, b, c, d, e, f = (v.view(-1, 1, 1) for v in matrix.double().unbind(-1))
    xo = torch.arange(w, dtype=torch.float64).add_(0.5).view(1, 1, w)
    yo = torch.arange(h, dtype=torch.float64).add_(0.5).view(1, h, 1)
    xs, ys = (a * xo + b * yo).add_(c), (d * xo + e * yo).add_(f)
    inside = (xs >= 0) & (xs < w) & (ys >= 0) & (ys < h)
    xs, ys = xs.sub_(0.5), ys.sub_(0.5)
    x0, y0 = xs.floor(), ys.floor()
    dx, dy = (xs - x0).view(1, -1).to(dtype), (ys - y0).view(1, -1).to(dtype)
    first, taps = (0, 2) if code == batch_geometry.BILINEAR else (-1, 4)
    x0, y0 = x0.clamp_(-8, w + 8).long(), y0.clamp_(-8, h + 8).long()  # outside points: any tap, filled later
    offset = (torch.arange(n) * (h * w)).view(n, 1, 1)
    columns = [(x0 + (first + k)).clamp_(0, w - 1) for k in range(taps)]
    pixels = images.transpose(0, 1).reshape(ch, n * h * w).to(dtype)

    def row(j: int) -> List[torch.Tensor]:
        base = (y0 + (first + j)).clamp_(0, h - 1).mul_(w).add_(offset)
        return [pixels.index_select(1, (base + column).view(-1)) for column in columns]

    if code == batch_geometry.BILINEAR:  # BILINEAR(v, a, b, d): a + (b - a) * d
        top, bottom = ((v1.sub_(v0).mul_(dx).add_(v0)) for v0, v1 in (row(0), row(1)))
        v = bottom.sub_(top).mul_(dy).add_(top)
    else:
        v = _cubic_(*[_cubic_(*row(j), dx) for j in range(4)], dy)
    out = v.clamp_(0, 255).to(torch.int16).to(torch.uint8).view(ch, n, h, w).transpose(0, 1).contiguous()
    return out, inside


def exact_cost(images: List[np.ndarray], repeats: int, seed: int = 3) -> Dict[str, Any]:
    """Rotations of 224 px crops (random angles within the recipe's 30 degrees), one batch:
    ``batch_geometry.rotate`` (``grid_sample``), the reference above in float64 and float32, and Pillow one image at
    a time; agreement with Pillow and the medians of interleaved repeats (one thread)."""
    import statistics
    import time
    crops = _crops_224(images, seed)
    rng = random.Random(seed)
    degrees = torch.tensor([rng.uniform(-30, 30) for _ in crops], dtype=torch.float64)
    x = torch.stack([_tensor(c) for c in crops])
    fill = BatchAugment(SIZE, **RECIPE).fill
    fill_value = torch.tensor(fill, dtype=torch.uint8).view(1, 3, 1, 1)
    theta = -torch.deg2rad(torch.remainder(degrees, 360.0))
    cos, sin = torch.round(torch.cos(theta), decimals=15), torch.round(torch.sin(theta), decimals=15)
    cx, cy = SIZE / 2, SIZE / 2
    matrix = torch.stack([cos, sin, cos * -cx + sin * -cy + cx, -sin, cos, -sin * -cx + cos * -cy + cy], -1)
    result: Dict[str, Any] = {'images': len(crops)}
    for mode in ('bicubic', 'bilinear'):
        code = batch_geometry.INTERPOLATIONS.index(mode)
        refs = [np.asarray(Image.fromarray(c).rotate(float(a), resample=PIL_RESAMPLE[mode], fillcolor=fill))
                for c, a in zip(crops, degrees.tolist())]

        def reference(dtype: torch.dtype) -> torch.Tensor:
            out, inside = pillow_affine_reference(x, matrix, code, dtype)
            return torch.where(inside.unsqueeze(1), out, fill_value)
        candidates = {'grid_sample (tcnn)': lambda: batch_geometry.rotate(x, degrees, fill,
                                                                          torch.full((len(x),), code)),
                      'reference float64': lambda: reference(torch.float64),
                      'reference float32': lambda: reference(torch.float32)}
        for name, fn in candidates.items():
            out = fn()
            d = [np.abs(_levels(out[k]) - r.astype(np.int64)) for k, r in enumerate(refs)]
            result[f'{mode} {name}'] = _stats(d)
        candidates['Pillow'] = lambda: [Image.fromarray(c).rotate(float(a), resample=PIL_RESAMPLE[mode],
                                                                  fillcolor=fill)
                                        for c, a in zip(crops, degrees.tolist())]
        times: Dict[str, List[float]] = {name: [] for name in candidates}
        for r in range(repeats):
            for name in (list(candidates) if r % 2 else list(candidates)[::-1]):
                start = time.perf_counter()
                candidates[name]()
                times[name].append(time.perf_counter() - start)
        result[f'{mode} ms per batch'] = {name: round(1000 * statistics.median(t), 1) for name, t in times.items()}
    return result


# ----------------------------------------------------------------------------------------------------- jitter


def jitter_agreement(images: List[np.ndarray], seed: int = 2) -> Dict[str, Any]:
    import torchvision.transforms.functional as TF
    crops = _crops_224(images, seed)
    aug = BatchAugment(SIZE, auto_augment=None, color_jitter=(0.4, 0.4, 0.4, 0.1), mean=MEAN, std=STD)
    params = aug.draw_many([(random.Random(seed * 100003 + i), (SIZE, SIZE)) for i in range(len(crops))])
    factors, orders = params['cj_factor'], params['cj_order']
    x = torch.stack([_tensor(c) for c in crops])
    pil_ops = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)
    result: Dict[str, Any] = {}
    for name, active in (('brightness', (True, False, False, False)), ('contrast', (False, True, False, False)),
                         ('saturation', (False, False, True, False)), ('hue', (False, False, False, True)),
                         ('all four', (True, True, True, True))):
        out = batch_colour.tv_color_jitter(x, factors, orders, active, out=torch.empty(x.shape)).to(torch.uint8)
        d = []
        for k, c in enumerate(crops):
            img = Image.fromarray(c)
            for f in orders[k].tolist():
                if active[f]:
                    img = pil_ops[f](img, float(factors[k, f]))
            d.append(np.abs(_levels(out[k]) - np.asarray(img).astype(np.int64)))
        result[name] = _stats(d)
    return result


SECTIONS: Dict[str, Callable[[argparse.Namespace], Dict[str, Any]]] = {
    'order': lambda args: pass_order(300 if args.quick else 3000),
    'resize': lambda args: resize_agreement(photo_arrays(12 if args.quick else 200)),
    'affine': lambda args: affine_agreement(photo_arrays(24 if args.quick else 400)),
    'jitter': lambda args: jitter_agreement(photo_arrays(12 if args.quick else 200)),
    'cost': lambda args: exact_cost(photo_arrays(4 if args.quick else 16), 3 if args.quick else 7),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--section', nargs='+', choices=list(SECTIONS), default=list(SECTIONS))
    parser.add_argument('--quick', action='store_true', help='fewer images and sizes: a smoke run')
    parser.add_argument('--save', action='store_true', help='write benchmarks/results/cpu-pil-agreement-<date>.json')
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results: Dict[str, Any] = {}
    for section in args.section:
        res = SECTIONS[section](args)
        results[section] = res
        print(f'== {section}')
        for key, value in res.items():
            print(_row(key, value) if isinstance(value, dict) else f'{key}: {value}')
    if args.save:
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.path.join(here, 'results', f'cpu-pil-agreement-{datetime.date.today().isoformat()}.json')
        write_json({'schema': 'tcnn-pil-agreement/1', 'date': datetime.date.today().isoformat(),
                    'machine': machine_info(torch.device('cpu')), 'quick': args.quick, 'results': results}, path)
        print(f'wrote {path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
