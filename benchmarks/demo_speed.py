#!/usr/bin/env python3
"""What one training image of ``tcnn demo`` costs on a CPU, by setting: the choices behind the demo's layout.

    python benchmarks/demo_speed.py                # about 2 minutes; --out FILE writes JSON

A training step (forward, backward, AdamW) of ``demo_resnet10`` and of its T-CNN at 96 px, contiguous vs
channels-last, batch 64 vs 128, with one torch thread and with two; and the demo's training transform (PNG decode,
flip, colour jitter, normalisation) per image. Medians of interleaved repeats in one process, CPU time (the
``process_time`` clock, robust to other work on the machine) and wall time: with two threads, CPU time counts both,
so two threads pay only if wall time falls by more than the CPU time grows. Random inputs; the transform runs on
generated images.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List

if __package__ in (None, ''):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import timm  # noqa: E402
import torch  # noqa: E402

import tcnn.demo.cnn  # noqa: E402,F401  (registers demo_resnet10)
from tcnn.convert.transform import reparameterize  # noqa: E402

from benchmarks.report import machine_info, write_json  # noqa: E402


def _model(kind: str, channels_last: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model('demo_resnet10', num_classes=6)
    if kind == 't-cnn':
        model = reparameterize(model, input_size=(3, 96, 96), verify=False)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model.train()


def _step_fn(model: torch.nn.Module, batch: int, channels_last: bool) -> Callable[[], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 3, 96, 96)
    y = torch.randint(0, 6, (batch,))
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def _time(fn: Callable[[], None], calls: int) -> Dict[str, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    return {'wall': time.perf_counter() - wall, 'cpu': time.process_time() - cpu}


def _transform_fn() -> Callable[[], None]:
    """The demo's training transform on 64 generated images (decode included), as ``tcnn train`` builds it."""
    from timm.data import create_transform
    from PIL import Image

    from tcnn.demo import synthetic
    folder = tempfile.mkdtemp(prefix='demo-speed-')
    paths = []
    for i in range(64):
        img, _, _ = synthetic.make_example(synthetic.OddColour(img_size=96), 0, 'train', i)
        paths.append(os.path.join(folder, f'{i}.png'))
        img.save(paths[-1])
    tf = create_transform(96, is_training=True, auto_augment=None, color_jitter=0.3, re_prob=0, scale=(1.0, 1.0),
                          interpolation='bicubic', mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))

    def run() -> None:
        for p in paths:
            with Image.open(p) as im:
                tf(im.convert('RGB'))
    return run


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--images', type=int, default=640, help='images per timed repeat of a training step')
    parser.add_argument('--out', help='write the results as JSON here')
    args = parser.parse_args(argv)
    cases = {}
    for threads in (1, 2):
        for kind in ('cnn', 't-cnn'):
            for cl in (False, True):
                for batch in (64, 128):
                    if threads == 2 and batch == 128:
                        continue
                    model = _model(kind, cl)
                    cases[f'{kind} {"channels-last" if cl else "contiguous"} batch {batch}, {threads} thread(s)'] = (
                        threads, batch, _step_fn(model, batch, cl))
    cases['training transform per 64 images, 1 thread'] = (1, 64, _transform_fn())
    times: Dict[str, List[Dict[str, float]]] = {k: [] for k in cases}
    for _ in range(args.repeats):
        for name, (threads, batch, fn) in cases.items():
            torch.set_num_threads(threads)
            fn()  # warm-up
            calls = max(1, args.images // batch)
            t = _time(fn, calls)
            times[name].append({k: v / (calls * batch) * 1000 for k, v in t.items()})
    rows = {name: {k: statistics.median(r[k] for r in rs) for k in ('cpu', 'wall')} for name, rs in times.items()}
    width = max(len(n) for n in rows)
    print(f'{"case":{width}s}  CPU ms/img  wall ms/img')
    for name, r in rows.items():
        print(f'{name:{width}s}  {r["cpu"]:10.2f}  {r["wall"]:11.2f}')
    if args.out:
        write_json({'schema': 'tcnn-demo-speed', 'date': datetime.date.today().isoformat(),
                    'machine': machine_info(torch.device('cpu')), 'repeats': args.repeats, 'ms_per_image': rows},
                   args.out)
    print(json.dumps({'loadavg_end': os.getloadavg()}))
    return 0


if __name__ == '__main__':
    sys.exit(main())
