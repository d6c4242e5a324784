"""Tests of ``tcnn.demo.synthetic``: determinism, the label rules checked on rendered pixels, corruptions that grow with
severity, the dataset folder (ImageFolder + ImageNet-C layout) and argument checks."""
import hashlib
import json
import os

import numpy as np
import pytest
from PIL import Image

from tcnn.demo import synthetic
from tcnn.errors import InvalidArgumentError, TcnnError

TASKS = [synthetic.OddColour(), synthetic.OddOneOut(), synthetic.SameDifferent()]


def _digest(img: Image.Image) -> str:
    return hashlib.sha256(img.tobytes()).hexdigest()


@pytest.mark.parametrize('task', TASKS, ids=lambda t: t.name)
def test_examples_are_a_function_of_seed_split_and_index(task):
    a, la, sa = synthetic.make_example(task, 3, 'train', 11)
    b, lb, sb = synthetic.make_example(task, 3, 'train', 11)
    assert _digest(a) == _digest(b) and la == lb and sa == sb
    others = [synthetic.make_example(task, 4, 'train', 11)[0], synthetic.make_example(task, 3, 'val', 11)[0],
              synthetic.make_example(task, 3, 'train', 12)[0]]
    assert len({_digest(a)} | {_digest(o) for o in others}) == 4
    assert a.size == (task.img_size, task.img_size) and a.mode == 'RGB'


@pytest.mark.parametrize('task', TASKS, ids=lambda t: t.name)
def test_classes_are_balanced_and_follow_the_rule(task):
    n = 6 * len(task.classes)
    labels = []
    for i in range(n):
        _, label, scene = synthetic.make_example(task, 0, 'test', i)
        assert task.label_of(scene.objects) == label
        assert len(scene.objects) == task.num_objects
        labels.append(label)
    assert np.bincount(labels).tolist() == [6] * len(task.classes)


def _point_on(obj: synthetic.ShapeInstance):
    """A pixel inside the drawn shape (the ring's centre is background: a point on its band instead)."""
    x, y = obj.center
    if obj.shape == 'ring':
        x += 0.8 * obj.radius
    return int(round(y)), int(round(x))


def test_the_odd_colour_rule_holds_on_the_rendered_pixels():
    """Read each shape's colour back from the image, classify its hue, and apply the rule to what the pixels say."""
    task = synthetic.OddColour()
    for i in range(24):
        img, label, scene = synthetic.make_example(task, 0, 'val', i)
        pixels = np.asarray(img)
        hues = [synthetic.hue_class(pixels[_point_on(o)]) for o in scene.objects]
        counts = {h: hues.count(h) for h in hues}
        (odd,) = [h for h, c in counts.items() if c == 1]
        assert task.classes[label] == odd, (i, hues, label)
        assert sorted(counts.values()) == [1, 2, 2]  # the odd one and two pairs


def test_shapes_are_drawn_where_the_scene_says():
    """Each shape's colour is at its position; the background is elsewhere (corners are kept free by the margin)."""
    task = synthetic.OddOneOut()
    for i in range(12):
        img, _, scene = synthetic.make_example(task, 0, 'train', i)
        pixels = np.asarray(img).astype(int)
        for obj in scene.objects:
            assert np.abs(pixels[_point_on(obj)] - np.asarray(obj.color)).max() <= 12, (i, obj)
        corner = pixels[0, 0]
        assert all(np.abs(corner - np.asarray(o.color)).max() > 40 for o in scene.objects)


def test_objects_are_far_apart():
    task = synthetic.OddColour()
    for i in range(30):
        _, _, scene = synthetic.make_example(task, 1, 'train', i)
        centres = [np.asarray(o.center) for o in scene.objects]
        dists = [np.linalg.norm(a - b) for k, a in enumerate(centres) for b in centres[k + 1:]]
        assert min(dists) >= task.min_distance * task.img_size


@pytest.mark.parametrize('corruption', list(synthetic.CORRUPTIONS))
def test_corruptions_grow_with_severity(corruption):
    img, _, _ = synthetic.make_example(synthetic.OddColour(), 0, 'test', 5)
    clean = np.asarray(img).astype(float)
    diffs = []
    for severity in synthetic.SEVERITIES:
        rng = np.random.default_rng(0)
        out = synthetic.corrupt(img, corruption, severity, rng)
        assert out.size == img.size and out.mode == 'RGB'
        again = synthetic.corrupt(img, corruption, severity, np.random.default_rng(0))
        assert _digest(out) == _digest(again)
        diffs.append(np.abs(np.asarray(out).astype(float) - clean).mean())
    assert diffs[0] > 0
    assert all(b >= a * 0.97 for a, b in zip(diffs, diffs[1:])), diffs  # stepwise (JPEG's steps are small)
    assert diffs[-1] > 1.3 * diffs[0], diffs


def test_impulse_noise_salts_each_channel_value_on_its_own():
    """ImageNet-C's impulse noise is ``skimage.util.random_noise(mode='s&p', amount=c)``: each of a pixel's three
    values is replaced with probability c, by 0 or 255 half and half (skimage's documented semantics). On mid-grey at
    severity 5 (c = 0.27) that touches 1 - 0.73^3 = 61.1% of the pixels and colours all but the 0.27^3 / 4 = 0.5% whose
    three values all became the same; salting whole pixels (one draw per pixel) touches 27% and colours none."""
    c = synthetic.corruption_params('impulse_noise', 5)
    grey = Image.new('RGB', (160, 160), (128, 128, 128))
    out = np.asarray(synthetic.corrupt(grey, 'impulse_noise', 5, np.random.default_rng(0))).astype(int)
    changed = out != 128
    assert set(np.unique(out[changed])) == {0, 255}
    # 76,800 values, 25,600 pixels: binomial standard errors of 0.0016 and 0.003, so 0.01 and 0.015 are 5-6 of them
    assert changed.mean() == pytest.approx(c, abs=0.01)
    assert (out[changed] == 255).mean() == pytest.approx(0.5, abs=0.015)
    assert changed.any(-1).mean() == pytest.approx(1 - (1 - c) ** 3, abs=0.015)
    coloured = out.max(-1) != out.min(-1)
    assert coloured.mean() == pytest.approx(1 - (1 - c) ** 3 - c ** 3 / 4, abs=0.015)


def test_generate_writes_imagefolders_and_imagenet_c_layout(tmp_path):
    root = tmp_path / 'ds'
    sizes = {'train': 12, 'val': 6, 'test': 6}
    info = synthetic.generate(str(root), sizes=sizes, seed=2, corruptions=('contrast', 'jpeg_compression'),
                              corrupt_count=4, workers=0, progress=False)
    task = synthetic.OddColour()
    assert info['task'] == task.name and info['classes'] == list(task.classes)
    for split, n in sizes.items():
        files = [f for c in task.classes for f in os.listdir(root / split / c)]
        assert len(files) == n
        records = [json.loads(line) for line in open(root / f'{split}.jsonl')]
        assert [r['index'] for r in records] == list(range(n))
        for r in records:  # the file is the image make_example gives, in its class folder
            img, label, _ = synthetic.make_example(task, 2, split, r['index'])
            with Image.open(root / r['file']) as f:
                assert np.array_equal(np.asarray(f.convert('RGB')), np.asarray(img))
            assert r['class'] == task.classes[label]
    for corruption in ('contrast', 'jpeg_compression'):
        for severity in synthetic.SEVERITIES:
            files = [f for c in task.classes for f in os.listdir(root / 'test-c' / corruption / str(severity) / c)]
            assert len(files) == 4
    manifest = synthetic.read_manifest(str(root))
    assert manifest['seed'] == 2 and manifest['sizes'] == sizes
    assert not os.path.exists(f'{root}.partial')


def _tree_digest(root) -> dict:
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            path = os.path.join(dirpath, f)
            out[os.path.relpath(path, root)] = hashlib.sha256(open(path, 'rb').read()).hexdigest()
    return out


def test_generate_is_deterministic_whatever_the_workers(tmp_path):
    kwargs = dict(sizes={'train': 210, 'val': 6, 'test': 6}, seed=5, corruptions=('gaussian_noise',), progress=False)
    synthetic.generate(str(tmp_path / 'a'), workers=0, **kwargs)
    synthetic.generate(str(tmp_path / 'b'), workers=2, **kwargs)
    a, b = _tree_digest(tmp_path / 'a'), _tree_digest(tmp_path / 'b')
    assert len(a) > 250 and a == b


def test_generate_reuses_a_complete_dataset_and_replaces_another(tmp_path):
    root = str(tmp_path / 'ds')
    kwargs = dict(sizes={'train': 6, 'val': 6}, corruptions=(), workers=0, progress=False)
    first = synthetic.generate(root, seed=0, **kwargs)
    assert first['generation_s'] > 0
    assert synthetic.generate(root, seed=0, **kwargs)['generation_s'] == 0.0
    synthetic.generate(root, seed=1, **kwargs)
    assert synthetic.read_manifest(root)['seed'] == 1


def test_generate_writes_jpeg_files_that_decode_to_the_png_images(tmp_path):
    """JPEG datasets (benchmarks/loop.py: a loader decoding what photo datasets hold): .jpg files that decode to the
    PNG dataset's images up to JPEG's loss; a PNG dataset's manifest is as it was, and the format is part of reuse."""
    kwargs = dict(sizes={'train': 6, 'val': 6}, corruptions=(), workers=0, progress=False)
    png = synthetic.generate(str(tmp_path / 'png'), **kwargs)
    jpeg = synthetic.generate(str(tmp_path / 'jpeg'), image_format='jpeg', **kwargs)
    assert 'image_format' not in png and jpeg['image_format'] == 'jpeg'
    files = sorted(p.relative_to(tmp_path / 'jpeg') for p in (tmp_path / 'jpeg').rglob('*.jpg'))
    assert len(files) == 12 and not list((tmp_path / 'jpeg').rglob('*.png'))
    for rel in files[:3]:
        with Image.open(tmp_path / 'jpeg' / rel) as a, Image.open((tmp_path / 'png' / rel).with_suffix('.png')) as b:
            assert a.format == 'JPEG'
            diff = np.abs(np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16))
            assert diff.mean() < 4
    assert synthetic.generate(str(tmp_path / 'jpeg'), image_format='jpeg', **kwargs)['generation_s'] == 0.0
    with pytest.raises(InvalidArgumentError, match='image_format'):
        synthetic.generate(str(tmp_path / 'gif'), image_format='gif', **kwargs)


def test_generate_refuses_a_folder_of_other_files(tmp_path):
    (tmp_path / 'mine.txt').write_text('x')
    with pytest.raises(TcnnError, match='not a generated dataset'):
        synthetic.generate(str(tmp_path), sizes={'train': 6}, progress=False)
    assert (tmp_path / 'mine.txt').exists()


@pytest.mark.parametrize('kwargs, match', [
    (dict(sizes={'train': 3}), 'at least 6 images'),
    (dict(sizes={'tran': 10}), 'sizes must map'),
    (dict(sizes={'train': 12}, corruptions=('fog',)), 'corruptions must be'),
    (dict(sizes={'train': 12}, seed=-1), 'seed'),
    (dict(sizes={'train': 12}, task='odd'), 'task must be'),
])
def test_generate_refuses_bad_arguments_before_writing(tmp_path, kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        synthetic.generate(str(tmp_path / 'x'), progress=False, **kwargs)
    assert not (tmp_path / 'x').exists()


def test_tasks_refuse_bad_arguments_and_round_trip_as_dicts():
    with pytest.raises(InvalidArgumentError, match='at least 3 objects'):
        synthetic.OddColour(num_objects=2)
    with pytest.raises(InvalidArgumentError, match='shapes must be'):
        synthetic.OddOneOut(shapes=('circle', 'hexagon'))
    with pytest.raises(InvalidArgumentError, match='radius'):
        synthetic.OddColour(radius=(0.2, 0.1))
    task = synthetic.OddColour(img_size=64)
    assert synthetic.ShapeTask.from_dict(task.to_dict()) == task
