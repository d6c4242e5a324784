"""tcnn.robustness and `tcnn eval`: suites on generated folders, with classifiers whose answers are known."""
import json
import os
from typing import Dict, List, Sequence

import pytest
import timm
import torch
import torch.nn as nn
from PIL import Image

import tcnn
from tcnn import robustness as rb
from tcnn.cli import main
from tcnn.errors import TcnnError

MEAN = torch.tensor((0.485, 0.456, 0.406))
STD = torch.tensor((0.229, 0.224, 0.225))
PALETTE = {'red': (255, 0, 0), 'green': (0, 255, 0), 'blue': (0, 0, 255), 'yellow': (255, 255, 0),
           'magenta': (255, 0, 255), 'cyan': (0, 255, 255)}


class ColourNet(nn.Module):
    """Classifies solid-colour images: the palette colour nearest to the image's mean colour wins.

    Palette colour ``j`` scores at output index ``outputs[j]``; every other output gets ``rest`` (a decoy output with
    a huge ``rest`` beats every palette class unless the logits are restricted to a subset).
    """

    def __init__(self, colours: Sequence[str], num_classes: int, outputs: Sequence[int], rest: float = -1e4):
        super().__init__()
        rgb = torch.tensor([PALETTE[c] for c in colours], dtype=torch.float32) / 255
        self.register_buffer('palette', (rgb - MEAN) / STD)  # in the normalised space the model sees
        self.num_classes = num_classes
        self.outputs = list(outputs)
        self.rest = rest
        self.scale = nn.Parameter(torch.ones(()))  # so that the model has a parameter (device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=(2, 3))
        scores = -torch.cdist(mean, self.palette) * self.scale
        logits = torch.full((x.shape[0], self.num_classes), self.rest, dtype=x.dtype, device=x.device)
        logits[:, self.outputs] = scores
        return logits


def _image(path: str, colour: str, size: int = 8) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new('RGB', (size, size), PALETTE[colour]).save(path)


def _class_folder(root: str, labels: Dict[str, str], plan: Sequence[Sequence[str]]) -> None:
    """``plan[i]`` lists the colours of the images of class folder ``i`` (in ``labels`` order)."""
    for (folder, _), colours in zip(labels.items(), plan):
        for k, colour in enumerate(colours):
            _image(os.path.join(root, folder, f'{k}.png'), colour)


CLASSES = {'a_red': 'red', 'b_green': 'green', 'c_blue': 'blue', 'd_yellow': 'yellow'}


def _rigged_plan(n_right: int, n: int = 4) -> List[List[str]]:
    """Per class: ``n`` images of which the first ``n_right`` have the class colour and the rest a wrong one."""
    colours = list(CLASSES.values())
    return [[c] * n_right + [colours[(i + 1) % len(colours)]] * (n - n_right) for i, c in enumerate(colours)]


def _colour_model() -> ColourNet:
    return ColourNet(list(CLASSES.values()), num_classes=4, outputs=range(4))


def test_imagenet_c_known_answers(tmp_path):
    # (corruption, severity) -> images per class with the right colour (out of 4): known accuracy 25 * k %
    right = {('gaussian_noise', '1'): 4, ('gaussian_noise', '3'): 2, ('motion_blur', '1'): 3,
             ('motion_blur', '3'): 1, ('fog', '1'): 0, ('fog', '3'): 4, ('pixelate', '3'): 2,
             ('spatter', '1'): 1}
    for (c, s), k in right.items():
        _class_folder(str(tmp_path / c / s), CLASSES, _rigged_plan(k))
    res = rb.evaluate({'colour': _colour_model()}, 'imagenet-c', str(tmp_path), batch_size=8, workers=0,
                      progress=False, img_size=16)['colour']

    acc = {key: 25.0 * k for key, k in right.items()}
    assert set(res['corruptions']) == {'gaussian_noise', 'motion_blur', 'fog', 'pixelate', 'spatter'}
    for c in res['corruptions']:
        entry = res['corruptions'][c]
        expect = {s: a for (cc, s), a in acc.items() if cc == c}
        assert entry['severities'] == pytest.approx(expect)
        assert entry['top1'] == pytest.approx(sum(expect.values()) / len(expect))
        assert entry['ce'] is None  # not all 5 severities
    assert res['corruptions']['spatter']['benchmark'] is False  # an extra corruption: out of the summaries
    assert res['corruptions']['spatter']['category'] == 'weather'
    bench = {k: v for k, v in acc.items() if k[0] != 'spatter'}
    assert res['top1'] == pytest.approx(sum(bench.values()) / len(bench))
    for s in ('1', '3'):
        vals = [v for (c, ss), v in bench.items() if ss == s]
        assert res['severities'][s] == pytest.approx(sum(vals) / len(vals))
    assert set(res['severities']) == {'1', '3'}
    per_corruption = {c: res['corruptions'][c]['top1'] for c in ('gaussian_noise', 'motion_blur', 'fog', 'pixelate')}
    assert res['categories'] == pytest.approx({'noise': per_corruption['gaussian_noise'],
                                               'blur': per_corruption['motion_blur'],
                                               'weather': per_corruption['fog'],
                                               'digital': per_corruption['pixelate']})
    assert res['mce'] is None and res['complete'] is False and res['mce_missing'] == list(rb.BENCHMARK_CORRUPTIONS)
    assert res['num_images'] == 4 * 4 * len(right) and res['top5'] is None  # 4 labels: top-5 is meaningless


def test_imagenet_c_mce_is_normalised_by_alexnet(tmp_path):
    # published AlexNet errors (Hendrycks & Dietterich 2019, in %, rounded as in the paper's table)
    published = [88.6, 89.4, 92.3, 82.0, 82.6, 78.6, 79.8, 86.7, 82.7, 81.9, 56.5, 85.3, 64.6, 71.8, 60.7]
    assert [round(100 * rb.ALEXNET_ERRORS[c], 1) for c in rb.BENCHMARK_CORRUPTIONS] == published
    assert len(rb.BENCHMARK_CORRUPTIONS) == 15
    # one image per class and (corruption, severity); corruption i gets i % 3 right classes at every severity
    classes = dict(list(CLASSES.items())[:3])
    colours = list(classes.values())
    expected_ce = []
    for i, c in enumerate(rb.BENCHMARK_CORRUPTIONS):
        n_right = i % 4
        for s in '12345':
            plan = [[col if j < n_right else colours[(j + 1) % 3]] for j, col in enumerate(colours)]
            _class_folder(str(tmp_path / c / s), classes, plan)
        err = 1 - min(n_right, 3) / 3
        expected_ce.append(100 * err / rb.ALEXNET_ERRORS[c])
    model = ColourNet(colours, num_classes=3, outputs=range(3))
    res = rb.evaluate({'m': model}, 'imagenet-c', str(tmp_path), batch_size=64, workers=0, progress=False,
                      img_size=8)['m']
    assert res['complete'] and res['mce_missing'] == []
    assert [res['corruptions'][c]['ce'] for c in rb.BENCHMARK_CORRUPTIONS] == pytest.approx(expected_ce)
    assert res['mce'] == pytest.approx(sum(expected_ce) / 15)
    assert set(res['categories']) == {'noise', 'blur', 'weather', 'digital'}


def test_imagenet_c_default_resolution_is_224_without_crop():
    model = timm.create_model('resnet18d', num_classes=4)
    cfg = rb.eval_data_config(model, 'imagenet-c')
    assert cfg['input_size'] == (3, 224, 224) and cfg['crop_pct'] == 1.0
    assert rb.eval_data_config(model, 'imagenet-c', img_size=160)['input_size'] == (3, 160, 160)
    assert rb.eval_data_config(model, 'imagenet')['crop_pct'] == model.pretrained_cfg['crop_pct']


@pytest.mark.parametrize('suite', ['imagenet-a', 'imagenet-r'])
def test_200_class_suites_restrict_the_logits(tmp_path, suite):
    wnids_1k = rb.imagenet_wnids()
    subset = rb.subset_wnids(suite)
    assert len(subset) == 200 and subset == sorted(subset) and set(subset) <= set(wnids_1k)
    picked = [subset[3], subset[77], subset[150]]
    colours = ['red', 'green', 'blue']
    _class_folder(str(tmp_path), dict(zip(picked, colours)), [[c] * 3 for c in colours])
    decoy = next(i for i, w in enumerate(wnids_1k) if w not in subset)
    # the decoy output (not one of the 200 classes) beats every image's right answer: only a restriction of the
    # logits to the 200 classes leaves the right answer on top
    full = ColourNet(colours, 1000, [wnids_1k.index(w) for w in picked])

    class Decoy(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.num_classes = inner, 1000

        def forward(self, x):
            out = self.inner(x).clone()
            out[:, decoy] = 1e3
            return out

    res = rb.evaluate({'m': Decoy(full)}, suite, str(tmp_path), batch_size=4, workers=0, progress=False,
                      img_size=16)['m']
    assert res['num_images'] == 9 and res['num_labels'] == 200
    assert res['top1'] == pytest.approx(100.0)
    # the unrestricted ImageNet protocol on the same folder would score 0: the decoy wins every image
    res_1k = rb.evaluate({'m': Decoy(full)}, 'imagenet', str(tmp_path), batch_size=4, workers=0, progress=False,
                         img_size=16)['m']
    assert res_1k['top1'] == 0.0 and res_1k['labels'] == 'imagenet-1k wnids'

    # a folder that is not one of the 200 classes: a layout error naming the level
    _image(str(tmp_path / wnids_1k[decoy] / '0.png'), 'red')
    with pytest.raises(TcnnError, match='level 1'):
        rb.scan_suite(suite, str(tmp_path))
    with pytest.raises(TcnnError, match='1000 outputs'):
        rb.label_space(suite, picked, 10)


def test_imagenet_wnid_folders_map_to_imagenet_indices(tmp_path):
    wnids_1k = rb.imagenet_wnids()
    assert len(wnids_1k) == 1000 and wnids_1k == sorted(wnids_1k)
    picked = [wnids_1k[5], wnids_1k[400], wnids_1k[999]]  # a few classes only: folder order != ImageNet index
    colours = ['red', 'green', 'blue']
    _class_folder(str(tmp_path), dict(zip(picked, colours)), [[c, c] for c in colours])
    model = ColourNet(colours, 1000, [5, 400, 999])
    res = rb.evaluate({'m': model}, 'imagenet', str(tmp_path), batch_size=4, workers=0, progress=False,
                      img_size=16)['m']
    assert res['top1'] == 100.0 and res['top5'] == 100.0 and res['num_images'] == 6
    with pytest.raises(TcnnError, match='class folders'):
        rb.label_space('imagenet', ['x', 'y'], 5)  # neither wnids nor one folder per output


@pytest.mark.parametrize('suite, build, level', [
    ('imagenet-c', lambda r: _image(f'{r}/gaussian_noise/foo/a_red/0.png', 'red'), 'level 2'),
    ('imagenet-c', lambda r: _image(f'{r}/0.png', 'red'), 'level 1'),
    ('imagenet-c', lambda r: _image(f'{r}/fog/2/0.png', 'red'), 'level 3'),
    ('imagenet-c', lambda r: _image(f'{r}/fog/2/a_red/deeper/0.png', 'red'), 'level 4'),
    ('imagenet', lambda r: _image(f'{r}/fog/2/a_red/0.png', 'red'), 'level 2'),
    ('imagenet', lambda r: _image(f'{r}/0.png', 'red'), 'level 1'),
])
def test_wrong_layouts_name_the_level(tmp_path, suite, build, level):
    build(str(tmp_path))
    with pytest.raises(TcnnError, match=level) as e:
        rb.scan_suite(suite, str(tmp_path))
    assert '\n' not in str(e.value) and 'expected DIR/' in str(e.value)


def test_unreadable_image_is_a_one_line_error(tmp_path):
    _class_folder(str(tmp_path), CLASSES, [[c] for c in CLASSES.values()])
    (tmp_path / 'a_red' / 'broken.png').write_bytes(b'not an image')
    for workers in (0, 1):
        with pytest.raises(TcnnError, match='cannot read image .*broken.png') as e:
            rb.evaluate({'m': _colour_model()}, 'imagenet', str(tmp_path), workers=workers, progress=False,
                        img_size=8)
        assert '\n' not in str(e.value)


def _rigged_tcnn(constant_class: int, num_classes: int = 4) -> nn.Module:
    """A real small T-CNN whose classifier always answers ``constant_class``."""
    t_cnn = tcnn.reparameterize(timm.create_model('resnet18d', num_classes=num_classes), verify=False)
    with torch.no_grad():
        t_cnn.fc.weight.zero_()
        t_cnn.fc.bias.copy_(torch.nn.functional.one_hot(torch.tensor(constant_class), num_classes).float())
    return t_cnn


def test_eval_command_compares_models(tmp_path, capsys):
    # 4 classes with 1, 2, 3, 4 images: a model always answering class k scores (k + 1) / 10
    plan = [[c] * (i + 1) for i, c in enumerate(CLASSES.values())]
    _class_folder(str(tmp_path / 'val'), CLASSES, plan)
    paths = []
    for k in (0, 2):
        paths.append(tcnn.io.save(_rigged_tcnn(k), str(tmp_path / f'model{k}.pt')))
    out = tmp_path / 'res' / 'results.json'
    rc = main(['eval', *paths, '--suite', 'imagenet', '--data', str(tmp_path / 'val'), '--img-size', '32',
               '--workers', '0', '--batch-size', '4', '--no-progress', '--out', str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert list(report['models']) == ['model0', 'model2']
    results = report['suites']['imagenet']['results']
    assert results['model0']['top1'] == pytest.approx(10.0) and results['model2']['top1'] == pytest.approx(30.0)
    assert results['model0']['data_config']['input_size'] == [3, 32, 32]
    printed = capsys.readouterr().out
    header = printed.splitlines()[0].split()
    assert header == ['metric', 'model0', 'model2']
    assert 'ImageNet top-1' in printed and '10.00' in printed and '30.00' in printed
    md = (tmp_path / 'res' / 'results.md').read_text()
    assert md.startswith('| metric | model0 | model2 |') and '| ImageNet top-1 | 10.00 | 30.00 |' in md


def test_eval_command_errors_are_one_line(tmp_path, capsys):
    _image(str(tmp_path / 'c' / 'fog' / 'seven' / 'x' / '0.png'), 'red')
    rc = main(['eval', 'missing.pt', '--suite', 'imagenet-c', '--data', str(tmp_path / 'c')])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count('\n') == 0 and "'seven' at level 2" in err  # the layout is checked first
    rc = main(['eval', 'missing.pt', '--suite', 'imagenet', 'imagenet-c', '--data', str(tmp_path / 'c')])
    assert rc == 2 and 'one per suite' in capsys.readouterr().err
    _class_folder(str(tmp_path / 'val'), CLASSES, [[c] for c in CLASSES.values()])
    rc = main(['eval', 'missing.pt', '--suite', 'imagenet', '--data', str(tmp_path / 'val')])
    assert rc == 2 and 'model file not found: missing.pt' in capsys.readouterr().err
    # the output path is checked before the data is scanned or a model loaded: a mistake costs no evaluation
    blocker = tmp_path / 'results'
    blocker.write_text('a file, not a folder')
    for out, message in ((str(blocker / 'r.json'), 'is a file, so'), (str(tmp_path / 'r.txt'), 'one of .json')):
        rc = main(['eval', 'missing.pt', '--suite', 'imagenet', '--data', str(tmp_path / 'nowhere'), '--out', out])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and message in err[0], err
