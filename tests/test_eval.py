"""tcnn.evaluation (suites, scoring, tables) and `tcnn eval`: suites on generated folders, with classifiers whose
answers are known."""
import json
import os
import types
from typing import Dict, List, Optional, Sequence

import numpy as np
import pytest
import timm
import torch
import torch.nn as nn
from PIL import Image

import tcnn
import tcnn.files.tcnn_file
from tcnn.cli import main
from tcnn.errors import TcnnError
from tcnn.evaluation import scoring, suites, tables

from nontrivial import nontrivial

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


def test_imagenet_c_scores_give_the_known_accuracies(tmp_path):
    # (corruption, severity) -> images per class with the right colour (out of 4): known accuracy 25 * k %
    right = {('gaussian_noise', '1'): 4, ('gaussian_noise', '3'): 2, ('motion_blur', '1'): 3,
             ('motion_blur', '3'): 1, ('fog', '1'): 0, ('fog', '3'): 4, ('pixelate', '3'): 2,
             ('spatter', '1'): 1}
    for (c, s), k in right.items():
        _class_folder(str(tmp_path / c / s), CLASSES, _rigged_plan(k))
    res = scoring.evaluate({'colour': _colour_model()}, 'imagenet-c', str(tmp_path), batch_size=8, workers=0,
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
    assert res['mce'] is None and res['complete'] is False and res['mce_missing'] == list(suites.BENCHMARK_CORRUPTIONS)
    assert res['num_images'] == 4 * 4 * len(right) and res['top5'] is None  # 4 labels: top-5 is meaningless


C_CLASSES = dict(list(CLASSES.items())[:3])


def _complete_imagenet_c(root) -> List[float]:
    """All 15 benchmark corruptions x 5 severities, one image per class (3 classes); corruption i gets
    ``min(i % 4, 3)`` classes right at every severity. Returns the expected CE per corruption."""
    colours = list(C_CLASSES.values())
    expected_ce = []
    for i, c in enumerate(suites.BENCHMARK_CORRUPTIONS):
        n_right = i % 4
        for s in '12345':
            plan = [[col if j < n_right else colours[(j + 1) % 3]] for j, col in enumerate(colours)]
            _class_folder(str(root / c / s), C_CLASSES, plan)
        err = 1 - min(n_right, 3) / 3
        expected_ce.append(100 * err / suites.ALEXNET_ERRORS[c])
    return expected_ce


def _c_model() -> ColourNet:
    return ColourNet(list(C_CLASSES.values()), num_classes=3, outputs=range(3))


def test_imagenet_c_mce_is_normalised_by_alexnet(tmp_path):
    # published AlexNet errors (Hendrycks & Dietterich 2019, in %, rounded as in the paper's table)
    published = [88.6, 89.4, 92.3, 82.0, 82.6, 78.6, 79.8, 86.7, 82.7, 81.9, 56.5, 85.3, 64.6, 71.8, 60.7]
    assert [round(100 * suites.ALEXNET_ERRORS[c], 1) for c in suites.BENCHMARK_CORRUPTIONS] == published
    assert len(suites.BENCHMARK_CORRUPTIONS) == 15
    expected_ce = _complete_imagenet_c(tmp_path)
    res = scoring.evaluate({'m': _c_model()}, 'imagenet-c', str(tmp_path), batch_size=64, workers=0, progress=False,
                           img_size=8)['m']
    assert res['complete'] and res['mce_missing'] == []
    assert [res['corruptions'][c]['ce'] for c in suites.BENCHMARK_CORRUPTIONS] == pytest.approx(expected_ce)
    assert res['mce'] == pytest.approx(sum(expected_ce) / 15)
    assert set(res['categories']) == {'noise', 'blur', 'weather', 'digital'}


def test_imagenet_c_default_resolution_is_224_without_crop():
    model = timm.create_model('resnet18d', num_classes=4)
    cfg = suites.eval_data_config(model, 'imagenet-c')
    assert cfg['input_size'] == (3, 224, 224) and cfg['crop_pct'] == 1.0
    assert suites.eval_data_config(model, 'imagenet-c', img_size=160)['input_size'] == (3, 160, 160)
    # the other suites: timm validate.py's test size and crop by default, the model's input size on request
    cfg = suites.eval_data_config(model, 'imagenet')
    assert cfg['input_size'] == model.pretrained_cfg['test_input_size'] == (3, 288, 288)
    assert cfg['crop_pct'] == model.pretrained_cfg['test_crop_pct'] == 0.95
    cfg = suites.eval_data_config(model, 'imagenet-a', resolution='model')
    assert cfg['input_size'] == (3, 224, 224) and cfg['crop_pct'] == model.pretrained_cfg['crop_pct'] == 0.875
    assert suites.eval_data_config(model, 'imagenet-r', resolution=160)['input_size'] == (3, 160, 160)
    with pytest.raises(ValueError, match='test or model or a size'):
        suites.eval_data_config(model, 'imagenet', resolution='train')
    with pytest.raises(ValueError, match='not both'):
        suites.eval_data_config(model, 'imagenet', img_size=160, resolution='model')


@pytest.mark.parametrize('suite', ['imagenet-a', 'imagenet-r'])
def test_200_class_suites_restrict_the_logits(tmp_path, suite):
    wnids_1k = suites.imagenet_wnids()
    subset = suites.subset_wnids(suite)
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

    res = scoring.evaluate({'m': Decoy(full)}, suite, str(tmp_path), batch_size=4, workers=0, progress=False,
                           img_size=16)['m']
    assert res['num_images'] == 9 and res['num_labels'] == 200
    assert res['top1'] == pytest.approx(100.0)
    # the unrestricted ImageNet protocol on the same folder would score 0: the decoy wins every image
    res_1k = scoring.evaluate({'m': Decoy(full)}, 'imagenet', str(tmp_path), batch_size=4, workers=0, progress=False,
                              img_size=16)['m']
    assert res_1k['top1'] == 0.0 and res_1k['labels'] == 'imagenet-1k wnids'

    # a folder that is not one of the 200 classes: a layout error naming the level
    _image(str(tmp_path / wnids_1k[decoy] / '0.png'), 'red')
    with pytest.raises(TcnnError, match='level 1'):
        suites.scan_suite(suite, str(tmp_path))
    with pytest.raises(TcnnError, match='1000 outputs'):
        suites.label_space(suite, picked, 10)


def test_imagenet_wnid_folders_map_to_imagenet_indices(tmp_path):
    wnids_1k = suites.imagenet_wnids()
    assert len(wnids_1k) == 1000 and wnids_1k == sorted(wnids_1k)
    picked = [wnids_1k[5], wnids_1k[400], wnids_1k[999]]  # a few classes only: folder order != ImageNet index
    colours = ['red', 'green', 'blue']
    _class_folder(str(tmp_path), dict(zip(picked, colours)), [[c, c] for c in colours])
    model = ColourNet(colours, 1000, [5, 400, 999])
    res = scoring.evaluate({'m': model}, 'imagenet', str(tmp_path), batch_size=4, workers=0, progress=False,
                           img_size=16)['m']
    assert res['top1'] == 100.0 and res['top5'] == 100.0 and res['num_images'] == 6
    with pytest.raises(TcnnError, match='class folders'):
        suites.label_space('imagenet', ['x', 'y'], 5)  # neither wnids nor one folder per output


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
        suites.scan_suite(suite, str(tmp_path))
    assert '\n' not in str(e.value) and 'expected DIR/' in str(e.value)


def test_unreadable_image_is_a_one_line_error(tmp_path):
    _class_folder(str(tmp_path), CLASSES, [[c] for c in CLASSES.values()])
    (tmp_path / 'a_red' / 'broken.png').write_bytes(b'not an image')
    for workers in (0, 1):
        with pytest.raises(TcnnError, match='cannot read image .*broken.png') as e:
            scoring.evaluate({'m': _colour_model()}, 'imagenet', str(tmp_path), workers=workers, progress=False,
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
        paths.append(tcnn.files.tcnn_file.save(_rigged_tcnn(k), str(tmp_path / f'model{k}.pt')))
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
    assert 'ImageNet top-1 % (higher is better)' in printed and '10.00' in printed and '30.00' in printed
    md = (tmp_path / 'res' / 'results.md').read_text()
    assert md.startswith('| metric | model0 | model2 |')
    assert '| ImageNet top-1 % (higher is better) | 10.00 | 30.00 |' in md
    assert '| ImageNet input: size, centre-crop fraction | 32 px, crop 0.95 | 32 px, crop 0.95 |' in md


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
    # resolution flags: a policy or a size, and --img-size is --resolution N
    for flags, message in ((['--resolution', 'train'], 'expected test, model or a size in pixels'),
                           (['--imagenet-c-size', '0'], 'a size in pixels must be >= 1'),
                           (['--resolution', 'model', '--img-size', '64'], 'not allowed with argument --resolution')):
        with pytest.raises(SystemExit) as e:  # argparse's usage error
            main(['eval', 'missing.pt', '--suite', 'imagenet', '--data', str(tmp_path / 'val'), *flags])
        assert e.value.code == 2 and message in capsys.readouterr().err, flags


# ---------------------------------------------------------------------- resolution policy: a CNN and its T-CNN


def _timm_predictions(model: nn.Module, images: Sequence[Image.Image], size: int = None, crop_pct: float = None,
                      subset: Sequence[int] = None) -> List[int]:
    """Class indices ``model`` predicts under timm validate.py's preprocessing (the test size by default): an
    oracle independent of tcnn.evaluation."""
    args = {} if size is None else {'input_size': (3, size, size), 'crop_pct': crop_pct}
    cfg = timm.data.resolve_data_config(args, model=model, use_test_size=True)
    transform = timm.data.create_transform(**cfg, is_training=False)
    with torch.no_grad():
        logits = model.eval()(torch.stack([transform(img) for img in images]))
    if subset is not None:
        return [subset[i] for i in logits[:, subset].argmax(1).tolist()]
    return logits.argmax(1).tolist()


@pytest.fixture(scope='module')
def cnn_and_t_cnn(tmp_path_factory):
    """resnet10t (timm: trained at 176 px, tested at 224 px, crop 0.95) saved as a file, its exact T-CNN saved with
    another data config (224 px, crop 1.0; its test crop 0.95 given too: a crop alone would also be its test crop, as
    in timm's save_for_hf), and ImageNet-A/-C folders whose labels are the CNN's own answers at timm's test size: at
    that size both models score 100%."""
    from imagegen import SHAPES, draw_shape
    root = tmp_path_factory.mktemp('resolution')
    torch.manual_seed(0)
    cnn = nontrivial(timm.create_model('resnet10t', num_classes=1000))
    t_cnn = tcnn.reparameterize(cnn, locality_strength=50.0, gating_init=25.0)  # the CNN's function, verified
    files = [tcnn.files.tcnn_file.save(cnn, str(root / 'cnn.pt')),
             tcnn.files.tcnn_file.save(t_cnn, str(root / 't-cnn.pt'),
                          data_config={'input_size': (3, 224, 224), 'crop_pct': 1.0, 'test_crop_pct': 0.95})]
    rng = np.random.default_rng(0)
    wnids = suites.imagenet_wnids()
    subset = [wnids.index(w) for w in suites.subset_wnids('imagenet-a')]
    images_a = [draw_shape(SHAPES[i % len(SHAPES)], 256, rng) for i in range(6)]
    for k, (img, label) in enumerate(zip(images_a, _timm_predictions(cnn, images_a, subset=subset))):
        os.makedirs(root / 'a' / wnids[label], exist_ok=True)
        img.save(root / 'a' / wnids[label] / f'{k}.png')
    for corruption in ('gaussian_noise', 'spatter'):
        images_c = [draw_shape(SHAPES[i], 224, rng) for i in range(2)]
        for k, (img, label) in enumerate(zip(images_c, _timm_predictions(cnn, images_c, 224, 1.0))):
            os.makedirs(root / 'c' / corruption / '1' / wnids[label], exist_ok=True)
            img.save(root / 'c' / corruption / '1' / wnids[label] / f'{k}.png')
    return root, files, cnn


def _eval_cli(root, files, capsys, *flags):
    out = root / f'res{len(list(root.glob("res*")))}' / 'r.json'
    rc = main(['eval', *files, '--names', 'CNN', 'T-CNN', '--suite', 'imagenet-a', 'imagenet-c',
               '--data', str(root / 'a'), str(root / 'c'), '--workers', '0', '--no-progress', '--out', str(out),
               *flags])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads(out.read_text()), captured.out, out.with_suffix('.md').read_text()


def _row(text: str, start: str) -> str:
    """The table line (console or markdown) whose label starts with ``start``."""
    lines = [line for line in text.splitlines() if line.lstrip('| ').startswith(start)]
    assert len(lines) == 1, (start, text)
    return lines[0]


def test_cnn_and_t_cnn_are_compared_at_the_test_size_the_output_states(cnn_and_t_cnn, capsys):
    root, files, cnn = cnn_and_t_cnn
    assert cnn.pretrained_cfg['input_size'] == (3, 176, 176) and cnn.pretrained_cfg['test_input_size'] == (3, 224, 224)
    report, printed, md = _eval_cli(root, files, capsys)
    a, c = report['suites']['imagenet-a'], report['suites']['imagenet-c']
    for name in ('CNN', 'T-CNN'):  # timm validate.py's default: the test size and crop, for both models
        assert a['results'][name]['data_config']['input_size'] == [3, 224, 224]
        assert (a['results'][name]['img_size'], a['results'][name]['crop_pct']) == (224, 0.95)
        assert (c['results'][name]['img_size'], c['results'][name]['crop_pct']) == (224, 1.0)
        assert a['results'][name]['top1'] == pytest.approx(100.0) and c['results'][name]['top1'] == pytest.approx(100.0)
    for text in (printed, md):
        assert _row(text, 'ImageNet-A input').count('224 px, crop 0.95') == 2
        assert _row(text, 'ImageNet-C input').count('224 px, crop 1.0') == 2
    assert 'different input sizes' not in printed + md
    assert a['resolution'] == 'test' and c['resolution'] == 224


def test_resolution_policies_and_imagenet_c_stays_at_224_under_img_size(cnn_and_t_cnn, capsys):
    root, files, _ = cnn_and_t_cnn
    report, printed, md = _eval_cli(root, files, capsys, '--img-size', '64')
    for name in ('CNN', 'T-CNN'):  # its corruptions are defined at 224 px
        assert report['suites']['imagenet-c']['results'][name]['data_config']['input_size'] == [3, 224, 224]
        assert report['suites']['imagenet-c']['results'][name]['img_size'] == 224
        assert report['suites']['imagenet-a']['results'][name]['img_size'] == 64
    assert report['suites']['imagenet-a']['resolution'] == 64
    assert _row(printed, 'ImageNet-C input').count('224 px, crop 1.0') == 2
    # --img-size takes what it takes in every command: N or HxW
    report, printed, _ = _eval_cli(root, files, capsys, '--img-size', '64x48')
    for name in ('CNN', 'T-CNN'):
        assert report['suites']['imagenet-a']['results'][name]['data_config']['input_size'] == [3, 64, 48]
        assert report['suites']['imagenet-a']['results'][name]['img_size'] == [64, 48]
    assert report['suites']['imagenet-a']['resolution'] == [64, 48]
    assert _row(printed, 'ImageNet-A input').count('64x48 px') == 2
    # asked explicitly, ImageNet-C runs at another size
    report, _, _ = _eval_cli(root, files, capsys, '--imagenet-c-size', '96')
    assert {r['img_size'] for r in report['suites']['imagenet-c']['results'].values()} == {96}
    # the models' own (train) sizes differ: stated in the table and in a note, in both outputs
    report, printed, md = _eval_cli(root, files, capsys, '--resolution', 'model')
    results = report['suites']['imagenet-a']['results']
    assert (results['CNN']['img_size'], results['CNN']['crop_pct']) == (176, 0.875)
    assert (results['T-CNN']['img_size'], results['T-CNN']['crop_pct']) == (224, 1.0)
    for text in (printed, md):
        row = _row(text, 'ImageNet-A input')
        assert '176 px, crop 0.875' in row and '224 px, crop 1.0' in row
        assert 'imagenet-a: the models ran at different input sizes (CNN 176 px, T-CNN 224 px)' in text


# ---------------------------------------------------------------------- tables nobody can misread


def _report(suite: str, results: Dict[str, dict]) -> dict:
    return {'models': {n: {} for n in results}, 'suites': {suite: {'results': results}}}


def _labels_and_sections(rows: Sequence[Sequence[str]]) -> List[tuple]:
    """``(section header, row label, values)`` of every row with values: indented rows belong to the last header."""
    out, header = [], None
    for label, *values in rows:
        if not label.startswith('  '):
            header = label
        if any(v.strip() for v in values):
            out.append((header, label, values))
    return out


def test_imagenet_c_table_rows_say_what_they_hold(tmp_path):
    expected_ce = _complete_imagenet_c(tmp_path / 'c')
    _class_folder(str(tmp_path / 'c' / 'spatter' / '1'), C_CLASSES, [[c] for c in C_CLASSES.values()])  # an extra
    results = scoring.evaluate({'m': _c_model(), 'n': _c_model()}, 'imagenet-c', str(tmp_path / 'c'), workers=0,
                               progress=False, img_size=8)
    assert results['m']['complete'] and results['m']['partial'] is None
    header, rows = tables.results_table(_report('imagenet-c', results))
    assert [r[1:] for r in rows if r[0].startswith('ImageNet-C input')] == [['8 px, crop 1.0'] * 2]
    for section, label, values in _labels_and_sections(rows):
        if 'input' in section:
            continue
        # every number sits under a label with its unit and the right direction: CE and mCE lower, top-1 higher
        assert '%' in section, section
        is_ce = 'CE' in section
        assert ('lower is better' if is_ce else 'higher is better') in section, section
        assert ('higher is better' if is_ce else 'lower is better') not in section, section
    sections = {label: values for section, label, values in _labels_and_sections(rows) if label == section}
    mce_label = next(label for label in sections if 'mCE' in label)
    assert sections[mce_label] == [f'{sum(expected_ce) / 15:.2f}'] * 2
    ce_rows = [(label.strip(), values) for section, label, values in _labels_and_sections(rows)
               if section.startswith('ImageNet-C CE') and label != section]
    assert [name for name, _ in ce_rows] == list(suites.BENCHMARK_CORRUPTIONS)  # per-corruption CE in the table
    assert [float(v[0]) for _, v in ce_rows] == pytest.approx(expected_ce, abs=0.006)
    # the extra corruption: its own section, marked, after every benchmark row, and in no mean
    extra = [(section, label) for section, label, _ in _labels_and_sections(rows) if 'spatter' in label]
    assert len(extra) == 1 and 'extra' in extra[0][0] and 'not in' in extra[0][0] and '(extra)' in extra[0][1]
    labels = [r[0] for r in rows]
    assert labels.index(extra[0][1]) > max(labels.index(f'  {c}') for c in suites.BENCHMARK_CORRUPTIONS)
    assert not any('/15 corruptions' in label for label in labels)  # a complete run has no partial marker


def test_partial_imagenet_c_is_marked_in_every_output(tmp_path, capsys):
    for c, severities in (('gaussian_noise', '12345'), ('fog', '12345'), ('spatter', '1')):
        for s in severities:
            _class_folder(str(tmp_path / 'c' / c / s), C_CLASSES, [[col] for col in C_CLASSES.values()])
    path = tcnn.files.tcnn_file.save(_rigged_tcnn(0, num_classes=3), str(tmp_path / 'm.pt'))
    out = tmp_path / 'r.json'
    assert main(['eval', path, '--suite', 'imagenet-c', '--data', str(tmp_path / 'c'), '--imagenet-c-size', '32',
                 '--workers', '0', '--no-progress', '--out', str(out)]) == 0
    printed = capsys.readouterr().out
    md = (tmp_path / 'r.md').read_text()
    result = json.loads(out.read_text())['suites']['imagenet-c']['results']['m']
    assert result['partial'] == '(2/15 corruptions)' and result['complete'] is False and result['mce'] is None
    for text in (printed, md):
        for start in ('ImageNet-C top-1 %, mean', 'ImageNet-C top-1 % by category', 'ImageNet-C top-1 % by severity'):
            assert '(2/15 corruptions)' in _row(text, start), start
        assert '(2/15 corruptions)' in _row(text, 'ImageNet-C mCE')
    # a corruption with some severities missing is counted in the marker too
    _class_folder(str(tmp_path / 'c' / 'snow' / '2'), C_CLASSES, [[col] for col in C_CLASSES.values()])
    res = scoring.evaluate({'m': _c_model()}, 'imagenet-c', str(tmp_path / 'c'), workers=0, progress=False,
                           img_size=8)['m']
    assert res['partial'] == '(3/15 corruptions, 11/75 corruption x severity pairs)'


def test_complete_needs_the_same_image_counts_everywhere(tmp_path):
    _complete_imagenet_c(tmp_path)
    kept = tmp_path.parent / f'{tmp_path.name}-kept.png'

    def check(group: str, cause: str):
        res = scoring.evaluate({'m': _c_model()}, 'imagenet-c', str(tmp_path), workers=0, progress=False,
                               img_size=8)['m']
        assert res['complete'] is False and res['mce'] is None
        assert list(res['image_counts']['mismatched']) == [group]
        assert res['image_counts']['images_per_group'] == 3
        assert cause in res['partial'] and group in res['partial']
        header, rows = tables.results_table(_report('imagenet-c', {'m': res}))
        assert group in next(r[0] for r in rows if r[0].startswith('ImageNet-C mCE'))
        return res

    res = scoring.evaluate({'m': _c_model()}, 'imagenet-c', str(tmp_path), workers=0, progress=False, img_size=8)['m']
    assert res['complete']
    # one image missing in fog/3 (its class folder empty): every folder still has images, the counts differ
    removed = tmp_path / 'fog' / '3' / 'b_green' / '0.png'
    removed.rename(kept)
    res = check('fog/3', 'image counts differ')
    assert res['image_counts']['mismatched']['fog/3'] == {'images': 2, 'expected': 3, 'classes': ['b_green']}
    kept.rename(removed)
    res = scoring.evaluate({'m': _c_model()}, 'imagenet-c', str(tmp_path), workers=0, progress=False, img_size=8)['m']
    assert res['complete'] and res['image_counts'] == {'images_per_group': 3, 'mismatched': {}}
    # same total, but an image moved between classes in snow/2
    (tmp_path / 'snow' / '2' / 'a_red' / '0.png').rename(tmp_path / 'snow' / '2' / 'c_blue' / '1.png')
    res = check('snow/2', 'image counts differ')
    assert res['image_counts']['mismatched']['snow/2'] == {'images': 3, 'expected': 3, 'classes': ['a_red', 'c_blue']}


def test_imagenet_a_and_r_counts_are_checked_against_the_release(tmp_path):
    wnids = suites.subset_wnids('imagenet-a')[:2]
    _class_folder(str(tmp_path), dict(zip(wnids, ('red', 'green'))), [['red'], ['green']])
    model = ColourNet(['red', 'green'], 1000, [suites.imagenet_wnids().index(w) for w in wnids])
    res = scoring.evaluate({'m': model}, 'imagenet-a', str(tmp_path), workers=0, progress=False, img_size=8)['m']
    assert res['partial'] == '(2 of 7500 images)' and res['complete'] is False
    header, rows = tables.results_table(_report('imagenet-a', {'m': res}))
    label = next(r for r in rows if r[0].startswith('ImageNet-A top-1'))[0]
    assert label == 'ImageNet-A top-1 % (2 of 7500 images) (higher is better)'
    notes = tables.results_notes(_report('imagenet-a', {'m': res}))
    assert notes == ['imagenet-a: 2 of 7500 images: a subset of the release']


def test_a_plain_table_left_aligns_the_first_column_and_right_aligns_the_others_under_a_line_of_dashes():
    # every cell but the widest of its column is padded, so each alignment shows; two spaces between columns
    text = tables.format_table(['metric', 'a', 'model b'], [['top-1 %', '71.23', '5.00'], ['x', '-', '100.00']])
    assert text.split('\n') == ['metric       a  model b',
                                '-------  -----  -------',
                                'top-1 %  71.23     5.00',
                                'x            -   100.00']


def test_table_values_have_two_decimals_and_a_dash_where_a_model_has_none():
    # None (no top-5 over 5 labels or fewer) and NaN (a JSON report's NaN) both read as no value, never as 'nan'
    res = {'m': {'img_size': 224, 'crop_pct': 0.875, 'top1': 100 / 3, 'top5': None},
           'n': {'img_size': 224, 'crop_pct': 0.875, 'top1': float('nan'), 'top5': 5}}
    header, rows = tables.results_table(_report('imagenet', res))
    assert header == ['metric', 'm', 'n']
    assert rows == [['ImageNet input: size, centre-crop fraction', '224 px, crop 0.875', '224 px, crop 0.875'],
                    ['ImageNet top-1 % (higher is better)', '33.33', '-'],
                    ['ImageNet top-5 % (higher is better)', '-', '5.00']]


def test_results_table_refuses_what_is_not_a_report_and_titles_a_suite_it_does_not_know_by_its_name():
    for report in ({'models': {}, 'suites': []}, {'models': [], 'suites': {}}, {'suites': {}}, ['models', 'suites']):
        with pytest.raises(TcnnError) as error:
            tables.results_table(report)
        assert str(error.value) == 'report must be a tcnn eval report: a dict with "models" and "suites" entries'
    # every suite has its rows, in the report's order; a hand-written report's own suite is titled by its name
    result = {'img_size': 8, 'crop_pct': 1.0, 'top1': 50.0, 'top5': 75.0}
    report = {'models': {'m': {}}, 'suites': {'imagenet-a': {'results': {'m': result}},
                                              'my-suite': {'results': {'m': result}}}}
    assert [r[0] for r in tables.results_table(report)[1]] == [
        'ImageNet-A input: size, centre-crop fraction', 'ImageNet-A top-1 % (higher is better)',
        'ImageNet-A top-5 % (higher is better)',
        'my-suite input: size, centre-crop fraction', 'my-suite top-1 % (higher is better)',
        'my-suite top-5 % (higher is better)']


def test_imagenet_c_rows_of_other_corruptions_only_word_for_word_and_a_dash_where_a_model_has_no_entry():
    # m: a folder of an extra and an unknown corruption only (scoring's summary: means over them, categories 'weather'
    # and 'other', no mCE); n: a result reduced to its means, without the per-category, per-severity and
    # per-corruption entries
    mark = ' (0/15 corruptions; means over the 2 other corruptions found)'
    m = {'img_size': 224, 'crop_pct': 1.0, 'top1': 60.0, 'mce': None, 'partial': mark[1:],
         'categories': {'weather': 50.0, 'other': 70.0}, 'severities': {'1': 65.0, '2': 55.0},
         'corruptions': {'spatter': {'top1': 50.0, 'ce': None}, 'my_warp': {'top1': 70.0, 'ce': None}}}
    n = {'img_size': 224, 'crop_pct': 1.0, 'top1': 55.0, 'mce': 80.5}
    header, rows = tables.results_table(_report('imagenet-c', {'m': m, 'n': n}))
    assert rows == [
        ['ImageNet-C input: size, centre-crop fraction', '224 px, crop 1.0', '224 px, crop 1.0'],
        [f'ImageNet-C top-1 %, mean over corruptions x severities{mark} (higher is better)', '60.00', '55.00'],
        [f'ImageNet-C mCE %, AlexNet = 100{mark} (lower is better)', '-', '80.50'],
        # a section's title row has no values ('', not '-'), its rows are indented under it
        [f'ImageNet-C top-1 % by category{mark} (higher is better)', '', ''],
        ['  weather', '50.00', '-'],
        ['  other', '70.00', '-'],
        [f'ImageNet-C top-1 % by severity, mean over corruptions{mark} (higher is better)', '', ''],
        ['  severity 1', '65.00', '-'],
        ['  severity 2', '55.00', '-'],
        ['ImageNet-C top-1 % of the extra corruptions, the only corruptions found: in the means above (higher is '
         'better)', '', ''],
        ['  spatter (extra)', '50.00', '-'],
        ['  my_warp (other)', '70.00', '-']]


def test_imagenet_c_rows_per_corruption_word_for_word_in_the_benchmark_order_with_the_extras_apart():
    # the corruptions of every model, the benchmark ones in the release's order (not the results'), per-corruption
    # rows without the partial marker (they are no means over the corruptions); a result without per-severity means
    # (none here): no severity section
    m = {'img_size': [224, 192], 'crop_pct': 0.875, 'top1': 45.0, 'mce': None, 'partial': '(2/15 corruptions)',
         'categories': {'noise': 40.0, 'weather': 50.0},
         'corruptions': {'fog': {'top1': 50.0, 'ce': None}, 'spatter': {'top1': 30.0, 'ce': None},
                         'gaussian_noise': {'top1': 40.0, 'ce': 67.5}}}
    n = {'img_size': 224, 'crop_pct': 1.0, 'top1': 46.0, 'mce': None, 'partial': '(2/15 corruptions)',
         'categories': {'noise': 42.0, 'weather': 50.0},
         'corruptions': {'gaussian_noise': {'top1': 42.0, 'ce': 65.0}, 'snow': {'top1': 50.0, 'ce': 57.68}}}
    header, rows = tables.results_table(_report('imagenet-c', {'m': m, 'n': n}))
    assert rows == [
        ['ImageNet-C input: size, centre-crop fraction', '224x192 px, crop 0.875', '224 px, crop 1.0'],
        ['ImageNet-C top-1 %, mean over corruptions x severities (2/15 corruptions) (higher is better)', '45.00',
         '46.00'],
        ['ImageNet-C mCE %, AlexNet = 100 (2/15 corruptions) (lower is better)', '-', '-'],
        ['ImageNet-C top-1 % by category (2/15 corruptions) (higher is better)', '', ''],
        ['  noise', '40.00', '42.00'],
        ['  weather', '50.00', '50.00'],
        ['ImageNet-C CE % by corruption, AlexNet = 100 (lower is better)', '', ''],
        ['  gaussian_noise', '67.50', '65.00'],
        ['  snow', '-', '57.68'],
        ['  fog', '-', '-'],
        ['ImageNet-C top-1 % by corruption, mean over severities (higher is better)', '', ''],
        ['  gaussian_noise', '40.00', '42.00'],
        ['  snow', '-', '50.00'],
        ['  fog', '50.00', '-'],
        ['ImageNet-C top-1 % of the extra corruptions, not in any mean (higher is better)', '', ''],
        ['  spatter (extra)', '30.00', '-']]


def test_notes_name_each_models_size_or_crop_word_for_word_where_they_differ():
    report = {'models': {'CNN': {}, 'T-CNN': {}, 'third': {}}, 'suites': {
        # sizes differ: one note, about resolution (the crops differ too: a size note says enough, no crop note)
        'imagenet': {'results': {'CNN': {'img_size': 176, 'crop_pct': 0.875},
                                 'T-CNN': {'img_size': [224, 192], 'crop_pct': 1.0}}},
        # one size, two crops (two models: any difference is one), and a subset of the release: two notes
        'imagenet-r': {'results': {'CNN': {'img_size': 224, 'crop_pct': 0.875, 'partial': '(2 of 30000 images)'},
                                   'T-CNN': {'img_size': 224, 'crop_pct': 1.0, 'partial': '(2 of 30000 images)'}}},
        # the same size and crop for all: nothing to say
        'imagenet-a': {'results': {n: {'img_size': 224, 'crop_pct': 0.875} for n in ('CNN', 'T-CNN', 'third')}}}}
    assert tables.results_notes(report) == [
        'imagenet: the models ran at different input sizes (CNN 176 px, T-CNN 224x192 px): a difference between them '
        'is partly one of resolution; give one size to compare them',
        'imagenet-r: the models ran with different centre crops (CNN 0.875, T-CNN 1)',
        'imagenet-r: 2 of 30000 images: a subset of the release']


def _c_result(absent: Sequence[str] = (), short: Sequence[str] = (), mismatched: Sequence[str] = (),
              partial: Optional[str] = None) -> dict:
    """An ImageNet-C result as ``scoring`` builds it, reduced to what the notes read.

    Args:
        absent: Benchmark corruptions without a folder.
        short: Benchmark corruptions with fewer than 5 severities.
        mismatched: Groups (``corruption/severity``) with 2 images where the others have 3.
        partial: The partial marker; None for a complete run.
    """
    return {'img_size': 224, 'crop_pct': 1.0, 'complete': partial is None, 'partial': partial,
            'corruptions': {c: {'top1': 50.0} for c in suites.BENCHMARK_CORRUPTIONS if c not in absent},
            # as scoring lists them: every benchmark corruption without a CE, the absent ones too, in benchmark order
            'mce_missing': [c for c in suites.BENCHMARK_CORRUPTIONS if c in absent or c in short],
            'image_counts': {'images_per_group': 3,
                             'mismatched': {g: {'images': 2, 'expected': 3, 'classes': ['a']} for g in mismatched}}}


@pytest.mark.parametrize('result, why', [
    # every cause at once: the first absent corruption as the example, the first 3 short corruptions and benchmark
    # groups by name with the counts of all, the extra corruption's uneven group (spatter/1) in no mean, left out
    (_c_result(absent=('gaussian_noise', 'shot_noise'),
               short=('defocus_blur', 'glass_blur', 'motion_blur', 'zoom_blur'),
               mismatched=('spatter/1', 'snow/2', 'frost/1', 'fog/3', 'brightness/5'),
               partial='(13/15 corruptions, 61/75 corruption x severity pairs; image counts differ: snow/2, frost/1, '
                       'fog/3 and 1 more)'),
     '2 of the 15 corruptions missing (e.g. gaussian_noise); 4 without all 5 severities (defocus_blur, glass_blur, '
     'motion_blur); image counts differ: snow/2 2 images (others 3), frost/1 2 images (others 3), fog/3 2 images '
     '(others 3)'),
    # each cause alone: no empty part for the others
    (_c_result(absent=('fog',), partial='(14/15 corruptions)'), '1 of the 15 corruptions missing (e.g. fog)'),
    (_c_result(short=('fog',), partial='(15/15 corruptions, 74/75 corruption x severity pairs)'),
     '1 without all 5 severities (fog)'),
    (_c_result(mismatched=('fog/3',), partial='(15/15 corruptions; image counts differ: fog/3)'),
     'image counts differ: fog/3 2 images (others 3)'),
])
def test_partial_imagenet_c_notes_say_word_for_word_why_there_is_no_mce(result: dict, why: str):
    notes = tables.results_notes(_report('imagenet-c', {'m': result, 'n': result}))
    assert notes == [f'imagenet-c: no mCE {result["partial"]}: {why}; the means cover the corruptions found']


def test_a_complete_imagenet_c_run_or_one_that_does_not_say_it_is_partial_has_no_note():
    complete = _c_result()
    assert tables.results_notes(_report('imagenet-c', {'m': complete})) == []
    # a hand-written or older report without 'complete': incomplete only when it says so, as the table's marker is
    unsaid = {k: v for k, v in complete.items() if k not in ('complete', 'partial')}
    assert tables.results_notes(_report('imagenet-c', {'m': unsaid})) == []


def _small_report() -> dict:
    """One model on a subset of ImageNet-A, without top-5: every kind of row and a note."""
    return _report('imagenet-a', {'m': {'img_size': 224, 'crop_pct': 0.875, 'top1': 12.5, 'top5': None,
                                        'partial': '(2 of 7500 images)'}})


def test_write_results_writes_the_json_indented_and_the_markdown_table_with_its_notes_in_place_of_old_files(tmp_path):
    json_path, md_path = tmp_path / 'r.json', tmp_path / 'r.md'
    json_path.write_text('an older report')
    md_path.write_text('an older table')
    tables.write_results(_small_report(), str(json_path), str(md_path))
    assert json_path.read_text() == '\n'.join([
        '{',
        '  "models": {',
        '    "m": {}',
        '  },',
        '  "suites": {',
        '    "imagenet-a": {',
        '      "results": {',
        '        "m": {',
        '          "img_size": 224,',
        '          "crop_pct": 0.875,',
        '          "top1": 12.5,',
        '          "top5": null,',
        '          "partial": "(2 of 7500 images)"',
        '        }',
        '      }',
        '    }',
        '  }',
        '}',
        ''])
    assert md_path.read_text() == '\n'.join([
        '| metric | m |',
        '|:---|---:|',
        '| ImageNet-A input: size, centre-crop fraction | 224 px, crop 0.875 |',
        '| ImageNet-A top-1 % (2 of 7500 images) (higher is better) | 12.50 |',
        '| ImageNet-A top-5 % (2 of 7500 images) (higher is better) | - |',
        '',
        '- imagenet-a: 2 of 7500 images: a subset of the release',
        ''])
    # written atomically: a temporary file beside each, moved over it, none left behind
    assert sorted(os.listdir(tmp_path)) == ['r.json', 'r.md']
    # the markdown alone
    md_path.unlink()
    tables.write_results(_small_report(), None, str(md_path))
    assert md_path.exists() and sorted(os.listdir(tmp_path)) == ['r.json', 'r.md']


@pytest.mark.parametrize('json_name, md_name, refused, message', [
    ('r.txt', None, 'r.txt', 'json_path {}: the extension must be one of .json'),
    ('r.json', 'r.html', 'r.html', 'markdown_path {}: the extension must be one of .md'),
])
def test_write_results_refuses_a_wrong_extension_by_its_argument_and_writes_nothing(
        tmp_path, json_name: str, md_name: Optional[str], refused: str, message: str):
    with pytest.raises(TcnnError) as error:
        tables.write_results(_small_report(), str(tmp_path / json_name), md_name and str(tmp_path / md_name))
    assert str(error.value) == message.format(tmp_path / refused)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------- the loop's counters and each suite's results


def _space(num_labels: int = 7) -> suites.LabelSpace:
    """Class folder k is label ``(k + 2) % num_labels``: a mapping that is not the identity."""
    return suites.LabelSpace(targets=(torch.arange(num_labels) + 2) % num_labels, subset=None,
                             num_labels=num_labels, mapping='test')


def test_each_batch_adds_its_images_and_top1_and_top5_hits_to_their_groups():
    # the target's rank in each image's logits: 1st, 5th (a top-5 hit only), 6th (no hit), 2nd
    ranks, classes = [0, 4, 5, 1], torch.tensor([0, 1, 2, 3])
    targets = _space().targets[classes]
    logits = torch.zeros(4, 7)
    for i, (rank, target) in enumerate(zip(ranks, targets.tolist())):
        others = [c for c in range(7) if c != target]
        order = others[:rank] + [target] + others[rank:]  # classes from the highest logit down
        logits[i, order] = torch.arange(7, 0, -1, dtype=torch.float32)
    counts = torch.ones(3, 3, dtype=torch.float64)  # what earlier batches counted
    scoring._accumulate(counts, logits, classes, torch.tensor([0, 1, 1, 0]), _space(), n_groups=3)
    # group 0: images 0 and 3 (one top-1 hit, two top-5); group 1: images 1 and 2 (one top-5 hit); group 2: none
    assert counts.tolist() == [[3, 2, 3], [3, 1, 2], [1, 1, 1]]


def test_images_with_a_nan_an_infinity_or_either_in_their_logits_are_counted():
    logits = torch.tensor([[0., 1.], [float('nan'), 1.], [float('inf'), 1.], [float('nan'), -float('inf')]])
    counts = torch.ones(3, dtype=torch.float64)
    scoring._count_nonfinite(counts, logits)
    assert counts.tolist() == [3, 3, 4]


def test_models_share_a_pass_when_their_data_configs_are_equal_in_any_key_order():
    key = scoring._config_key({'std': (0.5, 0.5), 'dtype': torch.float32})
    assert key == '{"dtype": "torch.float32", "std": [0.5, 0.5]}'
    assert scoring._config_key({'dtype': torch.float32, 'std': [0.5, 0.5]}) == key


def test_a_suites_results_give_top5_over_more_than_five_labels_and_the_data_config_as_lists():
    cfg = {'input_size': (3, 32, 48), 'crop_pct': 0.9, 'interpolation': 'bicubic'}
    counts = torch.tensor([[4., 2., 3.], [4., 1., 4.]])
    res = scoring._results(types.SimpleNamespace(suite='imagenet'), counts, _space(6), cfg, None)
    assert res == {'top1': 37.5, 'top5': 87.5, 'partial': None, 'num_images': 8, 'labels': 'test', 'num_labels': 6,
                   'img_size': [32, 48], 'crop_pct': 0.9,
                   'data_config': {'input_size': [3, 32, 48], 'crop_pct': 0.9, 'interpolation': 'bicubic'}}
    # top-5 of five labels is always 100%: none
    assert scoring._results(types.SimpleNamespace(suite='imagenet'), counts, _space(5), cfg, None)['top5'] is None
    # ImageNet-A: a folder of the release's 7500 images is complete, a smaller one a subset
    whole = scoring._results(types.SimpleNamespace(suite='imagenet-a'), torch.tensor([[7500., 10., 20.]]), _space(6),
                             cfg, None)
    assert whole['complete'] is True and whole['partial'] is None and whole['img_size'] == [32, 48]
    part = scoring._results(types.SimpleNamespace(suite='imagenet-a'), counts, _space(6), cfg, None)
    assert part['complete'] is False and part['partial'] == '(8 of 7500 images)'
    # ImageNet-C's results take the same top-5 rule
    data, c_counts = _c_groups({('fog', '1'): (4, 2, 3)})
    data.suite = 'imagenet-c'
    square = dict(cfg, input_size=(3, 32, 32))
    res = scoring._results(data, c_counts, _space(6), square, {'mismatched': {}})
    assert res['top5'] == 75.0 and res['corruptions']['fog']['top5'] == 75.0 and res['img_size'] == 32
    assert scoring._results(data, c_counts, _space(5), square, {'mismatched': {}})['top5'] is None


def test_a_timm_without_its_class_lists_is_told_to_upgrade(monkeypatch):
    import pkgutil
    monkeypatch.setattr(pkgutil, 'get_data', lambda package, resource: None)
    with pytest.raises(TcnnError) as info:
        suites.imagenet_wnids()
    assert str(info.value) == 'timm does not ship imagenet_synsets.txt; upgrade timm (>= 1.0.9)'


@pytest.mark.parametrize('n_outputs, message', [(0, 'n_outputs must be >= 1, got 0'),
                                                 (2.5, 'n_outputs must be an integer, got 2.5 (float)')])
def test_a_label_space_needs_a_whole_positive_number_of_outputs(n_outputs, message):
    with pytest.raises(TcnnError) as info:
        suites.label_space('imagenet', ['a_red'], n_outputs)
    assert str(info.value) == message


def test_an_evaluated_image_reaches_the_transform_in_rgb_whatever_its_mode(tmp_path):
    path = tmp_path / 'grey.png'
    Image.new('L', (4, 3), 128).save(path)
    data = types.SimpleNamespace(path=lambda i: str(path), targets=np.array([3]), group_ids=np.array([1]))
    assert scoring._Images(data, lambda img: (img.mode, img.size))[0] == (('RGB', (4, 3)), 3, 1)


# ---------------------------------------------------------------------- ImageNet-C's results from the counts


def _c_groups(counts: Dict[tuple, tuple]):
    """What ``scoring._imagenet_c_results`` reads, from
    ``{(corruption, severity): (images, top-1 hits, top-5 hits)}``."""
    return types.SimpleNamespace(groups=list(counts)), torch.tensor(list(counts.values()), dtype=torch.int64)


def test_a_folder_of_other_corruptions_only_is_summarised_over_them():
    # no benchmark corruption: the means are over what is there, each corruption in its category or 'other';
    # a group without images is left out (a mean over it would divide by zero), one of a single image is kept
    data, counts = _c_groups({('spatter', '1'): (4, 1, 2), ('spatter', '2'): (4, 3, 4), ('saturate', '1'): (2, 2, 2),
                              ('my_warp', '1'): (1, 1, 1), ('fog', '2'): (0, 0, 0)})
    res = scoring._imagenet_c_results(data, counts, top5_valid=True, per_group={'mismatched': {}})
    assert res == {
        'top1': 75.0, 'top5': 87.5, 'mce': None, 'complete': False,
        'partial': '(0/15 corruptions; means over the 3 other corruptions found)',
        'mce_missing': list(suites.BENCHMARK_CORRUPTIONS), 'image_counts': {'mismatched': {}},
        'categories': {'weather': 50.0, 'digital': 100.0, 'other': 100.0},
        'severities': {'1': 75.0, '2': 75.0},
        'corruptions': {
            'my_warp': {'category': 'other', 'benchmark': False, 'top1': 100.0, 'top5': 100.0,
                        'severities': {'1': 100.0}, 'ce': None},
            'saturate': {'category': 'digital', 'benchmark': False, 'top1': 100.0, 'top5': 100.0,
                         'severities': {'1': 100.0}, 'ce': None},
            'spatter': {'category': 'weather', 'benchmark': False, 'top1': 50.0, 'top5': 75.0,
                        'severities': {'1': 25.0, '2': 75.0}, 'ce': None}}}
    assert list(res['corruptions']) == ['my_warp', 'saturate', 'spatter']
    # top-5 of 5 labels or fewer is always 100%: no top-5 anywhere
    res = scoring._imagenet_c_results(data, counts, top5_valid=False, per_group={'mismatched': {}})
    assert res['top5'] is None and all(c['top5'] is None for c in res['corruptions'].values())
    assert res['top1'] == 75.0 and res['corruptions']['spatter']['top1'] == 50.0


def test_a_corruption_outside_the_release_is_in_category_other():
    assert scoring._category('my_warp') == 'other'
    assert scoring._category('spatter') == 'weather' and scoring._category('fog') == 'weather'
    assert scoring._category('speckle_noise') == 'noise' and scoring._category('pixelate') == 'digital'


@pytest.mark.parametrize('args, marker', [
    ((15, 74, [], 15), '(15/15 corruptions, 74/75 corruption x severity pairs)'),
    ((0, 0, [], 3), '(0/15 corruptions; means over the 3 other corruptions found)'),
    ((0, 0, ['spatter/1'], 2), '(0/15 corruptions; means over the 2 other corruptions found; image counts differ: '
                               'spatter/1)'),
    ((2, 10, ['fog/1', 'fog/2', 'snow/3'], 2), '(2/15 corruptions; image counts differ: fog/1, fog/2, snow/3)'),
    ((2, 9, ['fog/1', 'fog/2', 'snow/3', 'snow/4'], 2),
     '(2/15 corruptions, 9/75 corruption x severity pairs; image counts differ: fog/1, fog/2, snow/3 and 1 more)'),
    ((2, 10, ['a/1', 'b/1', 'c/1', 'd/1', 'e/1'], 2),
     '(2/15 corruptions; image counts differ: a/1, b/1, c/1 and 2 more)'),
])
def test_the_partial_marker_names_what_the_means_miss(args, marker):
    assert scoring._partial_marker(*args) == marker


def test_image_counts_see_a_class_missing_from_the_last_group():
    # the last group's last class has no image: the table still has a row and a column for it
    data = types.SimpleNamespace(groups=[('fog', '1'), ('fog', '2')], classes=['a', 'b'],
                                 group_ids=np.array([0, 0, 1]), targets=np.array([0, 1, 0]))
    assert suites.image_counts(data) == {'images_per_group': 2,
                                         'mismatched': {'fog/2': {'images': 1, 'expected': 2, 'classes': ['b']}}}


def _counted(groups: Dict[tuple, List[int]]):
    """A ``SuiteData`` stand-in with ``counts[k]`` images of class ``k`` in each ``(corruption, severity)`` group."""
    group_ids, targets = [], []
    for g, counts in enumerate(groups.values()):
        for k, n in enumerate(counts):
            group_ids += [g] * n
            targets += [k] * n
    return types.SimpleNamespace(groups=list(groups), classes=['a', 'b'], group_ids=np.array(group_ids),
                                 targets=np.array(targets))


def test_image_counts_take_the_benchmark_groups_as_the_reference():
    # the held-out corruptions outnumber the benchmark's one group, and still the benchmark says what is complete
    data = _counted({('fog', '1'): [2, 2], ('spatter', '1'): [1, 1], ('spatter', '2'): [1, 1],
                     ('saturate', '1'): [1, 1]})
    assert suites.image_counts(data) == {'images_per_group': 4, 'mismatched': {
        g: {'images': 2, 'expected': 4, 'classes': ['a', 'b']} for g in ('spatter/1', 'spatter/2', 'saturate/1')}}
    # without a benchmark group, every group votes (a tie goes to the first group)
    data = _counted({('spatter', '1'): [1, 1], ('saturate', '1'): [1, 0], ('saturate', '2'): [1, 1]})
    assert suites.image_counts(data) == {'images_per_group': 2, 'mismatched': {
        'saturate/1': {'images': 1, 'expected': 2, 'classes': ['b']}}}


# ---------------------------------------------------------------------- what reaches the user from the loop


def test_a_worker_error_becomes_the_one_line_that_tcnn_raised_in_the_worker():
    # what DataLoader re-raises: its header, the worker's traceback, then the TcnnError's own line
    worker = RuntimeError('Caught TcnnError in DataLoader worker process 0.\nOriginal Traceback (most recent call '
                          'last):\n  File "x.py", line 1, in f\ntcnn.errors.TcnnError: cannot read image a.png: '
                          'TcnnError: the inner one\n\n')
    error = scoring._worker_error(worker)
    assert isinstance(error, TcnnError) and str(error) == 'cannot read image a.png: TcnnError: the inner one'
    assert str(scoring._worker_error(RuntimeError('plain last line'))) == 'plain last line'
    for empty in ('', ' \n '):  # no message at all: the error's type
        assert str(scoring._worker_error(ValueError(empty))) == 'ValueError'


def test_an_imagenet_c_group_is_named_corruption_slash_severity():
    assert suites._group_name(('fog', '3')) == 'fog/3'
    assert suites._group_name(('imagenet', '')) == 'imagenet'


def test_a_models_output_count_is_read_from_num_classes_then_fc_then_a_dry_run():
    """timm's ``num_classes`` is read without running the model (a full-size forward costs seconds); a torchvision
    classifier, which has no ``num_classes``, by its ``fc``; anything else by one small forward."""
    import torchvision

    def no_forward(*args, **kwargs):
        raise AssertionError('the model ran')
    model = timm.create_model('resnet10t', num_classes=7)
    model.forward = no_forward
    model.fc = nn.Linear(4, 3)  # num_classes comes first
    assert suites.num_outputs(model) == 7
    classifier = torchvision.models.resnet18(num_classes=5)
    classifier.forward = no_forward
    assert suites.num_outputs(classifier) == 5
    assert suites.num_outputs(nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 4)), input_size=(3, 8, 8)) == 4
