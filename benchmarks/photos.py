#!/usr/bin/env python3
"""An ImageFolder of generated JPEGs the size and weight of ImageNet's (about 500 x 375 px, about 110 KB), for the
data-loading benchmarks: what a decoder and the augmentation cost depends on the pixels and the file size, and the
demo's flat shapes compress to a few KB.

    python benchmarks/photos.py --out /tmp/photos --train 20000 --val 1000

Each image is coloured 1/f^1.1 noise (the power spectrum of natural images falls about as 1/f^2, so the amplitude
as 1/f) with a random colour mix and a little sensor noise, saved at JPEG quality 90 with 4:2:0 chroma subsampling
(what ImageNet's files mostly are); a tenth are portrait, 375 x 500. Deterministic per seed; written by a process
pool, into a folder renamed into place when complete (an existing complete folder of the same parameters is kept).
"""
import argparse
import io
import json
import multiprocessing
import os
import shutil
import sys
from typing import Dict, List, Tuple

import numpy as np
from PIL import Image

MANIFEST = 'photos.json'
SLOPE = 1.1  # amplitude spectrum ~ 1 / f^SLOPE
QUALITY = 90


def photo(seed: int, height: int = 375, width: int = 500) -> Image.Image:
    """One generated photo-like RGB image."""
    rng = np.random.default_rng(seed)
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.rfftfreq(width)[None, :]
    f = np.sqrt(fx ** 2 + fy ** 2)
    f[0, 0] = 1.0
    shape = (3, height, width // 2 + 1)
    spectrum = (rng.normal(size=shape) + 1j * rng.normal(size=shape)) / f ** SLOPE
    planes = np.fft.irfft2(spectrum, s=(height, width), axes=(1, 2))
    planes = (planes - planes.mean(axis=(1, 2), keepdims=True)) / planes.std(axis=(1, 2), keepdims=True)
    mix = rng.normal(size=(3, 3)) * 0.3 + np.eye(3)
    pixels = np.einsum('ij,jhw->hwi', mix, planes) * 45 + rng.uniform(90, 166, size=3)
    pixels += rng.normal(0, 4, pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def jpeg_bytes(seed: int) -> bytes:
    portrait = seed % 10 == 0
    img = photo(seed, *((500, 375) if portrait else (375, 500)))
    buffer = io.BytesIO()
    img.save(buffer, 'JPEG', quality=QUALITY, subsampling=2)
    return buffer.getvalue()


def _write(job: Tuple[str, int]) -> int:
    path, seed = job
    data = jpeg_bytes(seed)
    with open(path, 'wb') as f:
        f.write(data)
    return len(data)


def generate(root: str, train: int, val: int, classes: int = 10, seed: int = 0, workers: int = 0,
             unique: int = 0) -> Dict:
    """Write ``root/{train,val}/cNN/*.jpg`` (``train`` and ``val`` images spread over ``classes``); returns the
    manifest (``root/photos.json``: the parameters and the mean file size).

    ``unique``: generate only this many distinct training images and hard-link the rest to them (a decoder's work is
    the same; generating 20,000 takes minutes of CPU, which a lent GPU's minutes should not pay)."""
    params = {'train': train, 'val': val, 'classes': classes, 'seed': seed, 'slope': SLOPE, 'quality': QUALITY,
              'unique': unique}
    try:
        with open(os.path.join(root, MANIFEST)) as f:
            manifest = json.load(f)
        if {k: manifest.get(k) for k in params} == params:
            return manifest
    except (OSError, ValueError):
        pass
    tmp = root.rstrip('/') + '.partial'
    shutil.rmtree(tmp, ignore_errors=True)
    jobs: List[Tuple[str, int]] = []
    links: List[Tuple[str, str]] = []
    for split, count, offset in (('train', train, 0), ('val', val, 10 ** 7)):
        for c in range(classes):
            os.makedirs(os.path.join(tmp, split, f'c{c:02d}'), exist_ok=True)
        for i in range(count):
            path = os.path.join(tmp, split, f'c{i % classes:02d}', f'{i:06d}.jpg')
            if split == 'train' and 0 < unique <= i:
                links.append((jobs[i % unique][0], path))
            else:
                jobs.append((path, seed * 10 ** 8 + offset + i))
    workers = workers or len(os.sched_getaffinity(0))
    with multiprocessing.get_context('fork').Pool(workers) as pool:
        sizes = pool.map(_write, jobs, chunksize=16)
    for source, path in links:
        os.link(source, path)
    manifest = dict(params, mean_kib=sum(sizes) / len(sizes) / 1024, images=len(sizes))
    with open(os.path.join(tmp, MANIFEST), 'w') as f:
        json.dump(manifest, f, indent=2)
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
    return manifest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--out', required=True)
    p.add_argument('--train', type=int, default=20000)
    p.add_argument('--val', type=int, default=1000)
    p.add_argument('--classes', type=int, default=10)
    p.add_argument('--workers', type=int, default=0, help='processes (default: the usable CPUs)')
    p.add_argument('--unique', type=int, default=0, help='distinct training images, the rest hard links (0: all)')
    args = p.parse_args(argv)
    manifest = generate(args.out, args.train, args.val, args.classes, workers=args.workers, unique=args.unique)
    print(json.dumps(manifest))
    return 0


if __name__ == '__main__':
    sys.exit(main())
