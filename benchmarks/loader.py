#!/usr/bin/env python3
"""What feeding the model costs, the model left out: training batches per second of each data pipeline, and the CPU
time they take, with a consumer that does nothing (a GPU pipeline's batches are synchronised).

    python benchmarks/loader.py                                   # CPU: both settings, 1 loader worker
    python benchmarks/loader.py --device cuda --workers 8 16      # a GPU machine
    python benchmarks/loader.py --smoke                           # the code paths in a minute

Two settings, each on data it generates once (kept in the temporary folder):

- ``recipe``: the paper's augmentation (timm's ``rand-m9-mstd0.5-inc1``, bicubic, random erasing 0.25 in pixel mode)
  at 224 px on ImageNet-size JPEGs (``benchmarks/photos.py``: 500 x 375, about 110 KB);
- ``demo``: the demo's (colour jitter 0.3, flips, no crop) at 96 px on its PNGs (``tcnn.demo.synthetic``).

Pipelines (``tcnn train --data-pipeline``): ``pil`` (timm's PIL transform per image in the loader workers),
``device`` (workers read bytes and draw parameters; on the CPU they also decode and augment the batch, in their
``collate_fn``; on a GPU this process does it there) and ``resident`` (the split decoded once, batches gathered and
augmented in this process; only for data that fits). Numbers: img/s of wall time over the timed batches, and img/s
per CPU core: images over the CPU seconds of this process and its loader workers together (``getrusage``; workers
are counted when they exit at the end of each pass), which does not depend on how many workers share the machine.
"""
import argparse
import dataclasses
import datetime
import json
import os
import resource
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

if __package__ in (None, ''):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from tcnn.data.encoded import BatchFinisher, CollateAndFinish, DeviceLoader, EncodedDataset, collate_encoded  # noqa
from tcnn.data.folders import open_dataset  # noqa: E402
from tcnn.data.resident import ResidentLoader, ResidentSplit  # noqa: E402
from tcnn.demo import synthetic  # noqa: E402
from tcnn.demo.plan import DATA_SEED, IMG_SIZE  # noqa: E402
from tcnn.train.builders import EpochSampler  # noqa: E402
from tcnn.train.data import batched_augmentation, build_transforms  # noqa: E402
from tcnn.train.recipe import Recipe, resolve_recipe  # noqa: E402

from benchmarks import photos  # noqa: E402
from benchmarks.report import machine_info, write_json  # noqa: E402

EVAL_CFG = {'interpolation': 'bicubic', 'mean': (0.485, 0.456, 0.406), 'std': (0.229, 0.224, 0.225),
            'crop_pct': 0.875, 'crop_mode': 'center'}


def _settings(smoke: bool) -> Dict[str, Dict[str, Any]]:
    paper = resolve_recipe('t_resnet50_d')
    demo = dataclasses.replace(Recipe(), aa=None, color_jitter=0.3, scale=[1.0, 1.0], reprob=0.0, mixup=0.0,
                               cutmix=0.0, crop_pct=1.0)
    return {
        'recipe': {'recipe': dataclasses.replace(paper, img_size=64 if smoke else 224), 'kind': 'photos',
                   'images': 64 if smoke else 1024, 'resident': False},
        'demo': {'recipe': dataclasses.replace(demo, img_size=IMG_SIZE), 'kind': 'demo',
                 'images': 128 if smoke else 2400, 'resident': True},
    }


def _data(kind: str, images: int, root: str) -> str:
    if kind == 'photos':
        folder = os.path.join(root, f'photos-{images}')
        photos.generate(folder, train=images, val=0, unique=min(images, 256))
        return folder
    folder = os.path.join(root, f'demo-{images}')
    synthetic.generate(folder, sizes={'train': images, 'val': 0, 'test': 0}, seed=DATA_SEED,
                       task=synthetic.OddColour(img_size=IMG_SIZE), corruptions=(), progress=False)
    return folder


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _loader(pipeline: str, dataset, recipe: Recipe, device: torch.device, workers: int, batch: int):
    cfg = dict(EVAL_CFG, input_size=(3, recipe.img_size, recipe.img_size), crop_pct=recipe.crop_pct or 0.875)
    sampler = EpochSampler(dataset, 1, 0, seed=0)
    dataset.augment_seed = 0
    if pipeline == 'pil':
        dataset.transform = build_transforms(recipe, cfg)[0]
        return DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=workers, drop_last=True), sampler
    augment = batched_augmentation(recipe, cfg)
    if pipeline == 'resident':
        split = ResidentSplit(dataset, device, workers)
        return ResidentLoader(split, sampler, batch, augment, draw_many=augment.draw_many, drop_last=True), sampler
    finish = BatchFinisher(augment, device, dataset.report_bad, train=True)
    in_workers = device.type == 'cpu' and workers > 0
    loader = DataLoader(EncodedDataset(dataset, augment.draw), batch_size=batch, sampler=sampler,
                        num_workers=workers, drop_last=True,
                        collate_fn=CollateAndFinish(finish) if in_workers else collate_encoded)
    return DeviceLoader(loader, None if in_workers else finish), sampler


def _measure(loader, sampler, device: torch.device, passes: int) -> Dict[str, float]:
    """Whole passes over the split (the first one untimed: workers' start, caches); img/s and img/s per core."""
    rows = []
    for epoch in range(passes + 1):
        sampler.set_epoch(epoch)
        loader_dataset = getattr(getattr(loader, 'split', None), 'dataset', None)
        if loader_dataset is not None:
            loader_dataset.set_epoch(epoch)
        cpu, start, images = _cpu_seconds(), time.perf_counter(), 0
        for x, _ in loader:
            images += x.shape[0]
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
        wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
        if epoch > 0:
            rows.append({'images': images, 'wall_s': wall, 'cpu_s': cpu})
    images = sum(r['images'] for r in rows)
    wall, cpu = sum(r['wall_s'] for r in rows), sum(r['cpu_s'] for r in rows)
    return {'images': images, 'wall_s': wall, 'cpu_s': cpu, 'img_per_s': images / wall,
            'img_per_cpu_s': images / cpu if cpu > 0 else None}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--device', default='cpu')
    p.add_argument('--workers', type=int, nargs='+', default=[1], help='loader workers (default 1: one core each)')
    p.add_argument('--settings', nargs='+', default=['recipe', 'demo'], choices=('recipe', 'demo'))
    p.add_argument('--pipelines', nargs='+', default=['pil', 'device', 'resident'])
    p.add_argument('--batch-size', type=int, help='default: 64 on the CPU, 256 on a GPU')
    p.add_argument('--passes', type=int, default=2, help='timed passes over each split (after an untimed one)')
    p.add_argument('--data', help='where the generated data is kept (default: the temporary folder)')
    p.add_argument('--threads', type=int, default=1, help='torch threads of this process (default 1: the batched '
                   'pipelines\' CPU work in this process on one core, as in a demo run)')
    p.add_argument('--smoke', action='store_true', help='tiny splits and sizes: the code paths only')
    p.add_argument('--out', help='write the results JSON here')
    args = p.parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    batch = args.batch_size or (8 if args.smoke else 64 if device.type == 'cpu' else 256)
    root = args.data or os.path.join(tempfile.gettempdir(), 'tcnn-loader-bench')
    rows = []
    print('| setting | pipeline | workers | img/s | img/s per CPU core | CPU s | images |')
    print('|---|---|---|---|---|---|---|')
    for name, setting in _settings(args.smoke).items():
        if name not in args.settings:
            continue
        folder = _data(setting['kind'], setting['images'], root)
        for pipeline in args.pipelines:
            if pipeline == 'resident' and not setting['resident']:
                continue
            for workers in ([0] if pipeline == 'resident' else args.workers):
                dataset = open_dataset(folder, 'train')
                loader, sampler = _loader(pipeline, dataset, setting['recipe'], device, workers, batch)
                row = dict(setting=name, pipeline=pipeline, workers=workers, batch_size=batch,
                           img_size=setting['recipe'].img_size, **_measure(loader, sampler, device, args.passes))
                rows.append(row)
                per_core = row['img_per_cpu_s']
                print(f'| {name} | {pipeline} | {workers} | {row["img_per_s"]:.0f} | '
                      f'{per_core:.0f} | {row["cpu_s"]:.1f} | {row["images"]} |', flush=True)
    if args.out:
        write_json({'schema': 'tcnn-loader', 'date': datetime.date.today().isoformat(),
                    'command': 'python benchmarks/loader.py ' + ' '.join(sys.argv[1:] if argv is None else argv),
                    'machine': machine_info(device), 'rows': rows}, args.out)
        print(f'wrote {args.out}')
    print(json.dumps({'rows': len(rows)}))
    return 0


if __name__ == '__main__':
    sys.exit(main())
