"""Tests of ``tcnn.data``: the paper's augmentation on today's Pillow (soak + every op at its magnitude extremes),
unreadable images (stop naming the file, or skip and log once), folder layouts."""
import copy
import dataclasses
import os
import random

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data.auto_augment import RandAugment
from torch.utils.data import DataLoader

from tcnn.data.folders import BadImageError, open_dataset
from tcnn.errors import TcnnError
from tcnn.train.data import build_transforms, recipe_data_config
from tcnn.train.recipe import load_recipe, resolve_recipe

from imagegen import draw_shape, make_image_folder

PAPER = resolve_recipe('t_resnet50_d')  # rand-m9-mstd0.5-inc1, random erasing 0.25 (pixel), bicubic


def _transforms(img_size):
    recipe = dataclasses.replace(PAPER, img_size=img_size)
    cfg = {'input_size': [3, img_size, img_size], 'interpolation': 'bicubic', 'mean': [0.485, 0.456, 0.406],
           'std': [0.229, 0.224, 0.225], 'crop_pct': 0.875, 'crop_mode': 'center'}
    return build_transforms(recipe, cfg)


def _rand_augment(transform):
    (ra,) = [t for t in transform.transforms if isinstance(t, RandAugment)]
    return ra


def test_recipe_is_the_papers_policy():
    assert load_recipe('t_resnet50_d').get('aa', PAPER.aa) == 'rand-m9-mstd0.5-inc1' and PAPER.reprob == 0.25


def test_every_op_of_the_papers_policy_runs_at_the_magnitude_extremes():
    """Each op of the paper's RandAugment policy at magnitude 0 and 10 (the clip maximum), forced, not drawn."""
    ra = _rand_augment(_transforms(64)[0])
    names = sorted(op.name for op in ra.ops)
    assert 'PosterizeIncreasing' in names and len(names) >= 14, names
    img = draw_shape('circle', 64, np.random.default_rng(0))
    black = 0
    for op in ra.ops:
        for magnitude in (0, 10):
            forced = copy.copy(op)
            forced.prob, forced.magnitude, forced.magnitude_std = 1.0, magnitude, 0
            out = forced(img)
            assert isinstance(out, Image.Image) and out.size == img.size, (op.name, magnitude)
            if op.name == 'PosterizeIncreasing' and magnitude == 10:
                black += int(np.asarray(out).max() == 0)  # 0 bits: the black image older Pillow returned
    assert black == 1


def test_the_recipes_train_transform_gives_finite_images_of_its_size_in_a_soak():
    """Thousands of generated images through the exact train transform at three sizes, fixed seeds."""
    rng = np.random.default_rng(0)
    images = [draw_shape(('circle', 'square', 'triangle', 'cross')[i % 4], 40, rng) for i in range(64)]
    random.seed(0)
    torch.manual_seed(0)
    count = 0
    for size in (32, 48, 64):
        train, _ = _transforms(size)
        for i in range(1200):
            x = train(images[i % len(images)])
            assert x.shape == (3, size, size) and torch.isfinite(x).all()
            count += 1
    assert count == 3600


@pytest.fixture()
def folder_with_bad_images(tmp_path):
    root = make_image_folder(str(tmp_path / 'data'), num_classes=2, train_per_class=6, val_per_class=2, size=32)
    good = tmp_path / 'data' / 'train' / 'circle' / 'circle_000.png'
    truncated = tmp_path / 'data' / 'train' / 'circle' / 'truncated.jpg'
    Image.open(good).convert('RGB').save(truncated, quality=90)
    data = truncated.read_bytes()
    truncated.write_bytes(data[:len(data) // 2])
    empty = tmp_path / 'data' / 'train' / 'square' / 'empty.png'
    empty.write_bytes(b'')
    return root, {str(truncated), str(empty)}


def _all_batches(dataset, workers):
    return [b for b in DataLoader(dataset, batch_size=4, num_workers=workers)]


@pytest.mark.parametrize('workers', [0, 2])
def test_bad_image_stops_with_one_line_naming_the_file(folder_with_bad_images, workers):
    root, bad = folder_with_bad_images
    _, val = _transforms(32)
    dataset = open_dataset(root, 'train')
    dataset.transform = val
    with pytest.raises(BadImageError) as info:
        _all_batches(dataset, workers)
    message = str(info.value)
    assert len(message.splitlines()) == 1 and 'cannot read image' in message and '--skip-bad-images' in message
    assert any(path in message for path in bad), message


@pytest.mark.parametrize('workers', [0, 2])
def test_skip_bad_images_replaces_and_logs_each_once(folder_with_bad_images, workers):
    root, bad = folder_with_bad_images
    _, val = _transforms(32)
    dataset = open_dataset(root, 'train', skip_bad_images=True)
    dataset.transform = val
    assert len(dataset) == 14
    for _ in range(2):  # two epochs: each path is reported once
        batches = _all_batches(dataset, workers)
        assert sum(b[0].shape[0] for b in batches) == 14
    assert set(dataset.bad_images()) == bad
    _all_batches(dataset, workers)
    assert dataset.bad_images() == []


def test_a_missing_folder_or_one_without_class_folders_is_refused(tmp_path):
    flat = tmp_path / 'flat' / 'train'
    flat.mkdir(parents=True)
    draw_shape('circle', 32, np.random.default_rng(0)).save(flat / 'a.png')
    with pytest.raises(TcnnError, match='has no class folders'):
        open_dataset(str(tmp_path / 'flat'), 'train')
    with pytest.raises(TcnnError, match='data folder not found'):
        open_dataset(str(tmp_path / 'nowhere'), 'train')


def test_a_folders_refusals_word_for_word_and_what_it_opens(tmp_path):
    """Each way a split folder is not timm's ImageFolder layout is refused naming the path and the layout; one image
    is a split; a class map (the training set's) gives the labels; what the dataset keeps (no queue of bad images
    unless they are skipped)."""
    from timm.data.readers import create_reader
    from tcnn.data.folders import ImageFolderDataset
    layout = 'expected the ImageFolder layout DATA/train/CLASS/IMAGE'

    def refusal(data):
        with pytest.raises(TcnnError) as error:
            open_dataset(str(data), 'train')
        return str(error.value)

    (tmp_path / 'no_split').mkdir()
    assert refusal(tmp_path / 'no_split') == f'data folder not found: {tmp_path / "no_split" / "train"} ({layout})'
    flat = tmp_path / 'flat' / 'train'
    flat.mkdir(parents=True)
    draw_shape('circle', 32, np.random.default_rng(0)).save(flat / 'a.png')
    assert refusal(tmp_path / 'flat') == (f'{flat} has no class folders ({layout}): images directly in train/ would '
                                          'make a 1-class problem')
    empty = tmp_path / 'empty' / 'train'
    (empty / 'cat').mkdir(parents=True)
    with pytest.raises(RuntimeError) as timm_error:
        create_reader('', root=str(empty))
    first_line = str(timm_error.value).strip().splitlines()[0]
    assert refusal(tmp_path / 'empty') == f'no images in {empty} ({layout}; {first_line})'
    one = tmp_path / 'one' / 'train'
    (one / 'b').mkdir(parents=True)
    (one / 'a').mkdir()
    draw_shape('circle', 32, np.random.default_rng(0)).save(one / 'a' / 'x.png')
    draw_shape('square', 32, np.random.default_rng(0)).save(one / 'b' / 'y.png')
    os.remove(one / 'b' / 'y.png')
    dataset = open_dataset(str(tmp_path / 'one'), 'train')
    assert len(dataset) == 1 and dataset.class_to_idx == {'a': 0}
    assert dataset.root == str(one) and dataset.transform is None and not dataset.skip_bad_images
    assert dataset._bad_queue is None  # a queue's pipe in every worker only where bad images are skipped
    draw_shape('square', 32, np.random.default_rng(0)).save(one / 'b' / 'y.png')
    mapped = open_dataset(str(tmp_path / 'one'), 'train', class_map={'a': 1, 'b': 0})
    assert mapped.class_to_idx == {'a': 1, 'b': 0} and [mapped[i][1] for i in range(2)] == [1, 0]
    many = tmp_path / 'many' / 'train'
    for c in range(7):
        (many / f'c{c}').mkdir(parents=True)
        draw_shape('circle', 8, np.random.default_rng(c)).save(many / f'c{c}' / 'x.png')
    with pytest.raises(TcnnError) as error:  # the first five classes the training set lacks, in order
        open_dataset(str(tmp_path / 'many'), 'train', class_map={'c0': 0})
    assert str(error.value) == f'{many} has classes that the training set lacks: c1, c2, c3, c4, c5'
    assert open_dataset(str(tmp_path / 'one'), 'train', class_map={'a': 1, 'b': 0},
                        skip_bad_images=True).skip_bad_images  # the policy survives the class map
    assert not ImageFolderDataset(str(one)).skip_bad_images  # unreadable files are an error unless asked
    mapped = ImageFolderDataset(str(one), class_map={'a': 1, 'b': 0}, transform=np.asarray)
    assert [label for _, label in (mapped[0], mapped[1])] == [1, 0] and isinstance(mapped[0][0], np.ndarray)


def test_the_decoder_hands_torch_an_array_of_its_own(monkeypatch):
    """``pil_to_tensor`` copies Pillow's buffer into a writable array: a read-only one makes torch warn (once per
    process) in every user's log, and the tensor would share memory it may not write."""
    import tcnn.data.decode as decode
    seen = []
    from_numpy = torch.from_numpy
    monkeypatch.setattr(decode.torch, 'from_numpy', lambda a: (seen.append(a.flags.writeable), from_numpy(a))[1])
    image = Image.fromarray(np.arange(36, dtype=np.uint8).reshape(3, 4, 3))
    tensor = decode.pil_to_tensor(image)
    assert seen == [True] and tensor.dtype == torch.uint8 and tensor.is_contiguous()
    assert torch.equal(tensor, torch.arange(36, dtype=torch.uint8).reshape(3, 4, 3).permute(2, 0, 1))

def test_data_config_follows_the_model_unless_the_recipe_says(tmp_path):
    import timm
    model = timm.create_model('resnet18d', num_classes=3)
    cfg = recipe_data_config(dataclasses.replace(PAPER, img_size=96, crop_pct=None, mean=None), model)
    assert tuple(cfg['input_size']) == (3, 96, 96) and cfg['crop_pct'] == model.pretrained_cfg['crop_pct']
    assert tuple(cfg['mean']) == tuple(model.pretrained_cfg['mean']) and cfg['interpolation'] == 'bicubic'


# ---------------------------------------------------------------------- a streamed split (webdataset, HF, TFDS)


def _stream(samples, num_classes):
    from tcnn.data.readers import StreamDataset
    return StreamDataset(samples, 'wds/shards', 'train', num_samples=len(samples), num_classes=num_classes, shards=1)


def test_a_streamed_sample_whose_label_is_outside_the_class_count_stops_the_run_naming_the_fix():
    from tcnn.data.folders import SampleError
    assert list(_stream([('a', 0), ('b', 2)], 3)) == [('a', 0), ('b', 2)]
    assert list(_stream([('a', 7), ('b', 'x')], None)) == [('a', 7), ('b', 'x')]  # no class count: labels unchecked
    for label in (3, -1, '1', 1.0):
        with pytest.raises(SampleError) as info:
            list(_stream([('a', 0), ('b', label)], 3))
        assert str(info.value) == (f'a sample of wds/shards (split train) has label {label!r}, outside 0..2: set '
                                   'num_classes (--set num_classes=N) to the data\'s class count')


def test_a_transform_that_fails_on_a_streamed_sample_names_the_dataset_and_the_error():
    from tcnn.data.folders import SampleError
    stream = _stream([(4, 0), (0, 1)], 2)
    stream.transform = lambda x: 8 // x
    with pytest.raises(SampleError) as info:
        list(stream)
    assert str(info.value) == 'the transform failed on a sample of wds/shards (ZeroDivisionError: integer division ' \
                              'or modulo by zero)'
    stream.transform = lambda x: x + 1
    assert list(_stream([(4, 0)], 2)) == [(4, 0)] and list(stream)[0] == (5, 0)


def _draws(img):
    """A transform that returns the image's size and what Python's, numpy's and torch's global RNGs draw."""
    return img.size, random.random(), float(np.random.rand()), torch.rand(1).item()


def test_a_seeded_samples_draws_depend_on_seed_epoch_and_index_alone_and_leave_the_callers_rngs_as_they_were(tmp_path):
    from tcnn.data.folders import sample_seed
    dataset = open_dataset(make_image_folder(str(tmp_path / 'd'), num_classes=2, train_per_class=6, size=8), 'train')
    dataset.transform = _draws
    dataset.augment_seed = 5
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    states = random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state()
    first = [dataset[i][0] for i in range(len(dataset))]
    assert random.getstate() == states[0] and np.array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2])
    # again, in another order, after other draws: the same numbers for each sample
    random.random(), np.random.rand(), torch.rand(3)
    assert [dataset[i][0] for i in reversed(range(len(dataset)))] == first[::-1]
    # each of the three generators is seeded from the sample's seed (numpy's takes 32 bits), so samples differ
    seed = sample_seed(5, 0, 3)
    assert first[3] == ((8, 8), random.Random(seed).random(), float(np.random.RandomState(seed % 2 ** 32).rand()),
                        torch.rand(1, generator=torch.Generator().manual_seed(seed)).item())
    assert all(len({draws[k] for draws in first}) == len(dataset) for k in (1, 2, 3))
    dataset.set_epoch(1)  # another epoch, other draws
    assert all(a != b for a, b in zip(dataset[3][0][1:], first[3][1:]))


def test_a_samples_seed_is_the_same_in_every_release():
    """A run resumed by a later release draws each sample's augmentation as the release that began it did, so the
    seed function is pinned: (seed * 1000003 + epoch) * 10000019 + index, kept below 2 ** 63 (a non-negative int64
    for any generator)."""
    from tcnn.data.folders import sample_seed
    assert [sample_seed(0, 0, 0), sample_seed(0, 1, 0), sample_seed(1, 0, 0), sample_seed(5, 2, 7)] == [
        0, 10_000_019, 10_000_049_000_057, 50_000_265_000_330]
    assert sample_seed(2 ** 62, 1, 3) == 4_611_686_018_437_387_926  # wrapped: the product is far past 2 ** 63
    assert sample_seed(10 ** 12, 1, 3) == 4_474_094_794_095_535_766  # 2 ** 64 would leave it above 2 ** 63


def test_a_transform_that_fails_on_a_folders_image_names_the_file_and_the_error(tmp_path):
    from tcnn.data.folders import SampleError
    dataset = open_dataset(make_image_folder(str(tmp_path / 'd'), num_classes=2, train_per_class=2, size=8), 'train')
    dataset.transform = lambda img: img.size[0] // 0
    with pytest.raises(SampleError) as info:
        dataset[1]
    assert str(info.value) == (f'the transform failed on {dataset.filename(1)} (ZeroDivisionError: integer division '
                               'or modulo by zero)')
    assert isinstance(info.value.__cause__, ZeroDivisionError)


# ---------------------------------------------------------------------- errors that name a file, one line each


def test_an_error_is_named_by_its_type_and_its_message_on_one_line_cut_at_200_characters():
    from tcnn.data.folders import error_text
    assert error_text(OSError('image file is truncated\n  (3 bytes   not processed)')) == \
        'OSError: image file is truncated (3 bytes not processed)'
    assert error_text(ValueError('x' * 250)) == 'ValueError: ' + 'x' * 200
    assert error_text(ValueError('y' * 199 + ' z')) == 'ValueError: ' + 'y' * 199 + ' '
    assert error_text(KeyError()) == 'KeyError' and error_text(RuntimeError(' \n ')) == 'RuntimeError'


def test_a_bad_image_error_raised_in_a_loader_worker_comes_back_as_its_own_line():
    from tcnn.data.folders import BadImageError, SampleError
    worker = ('Caught BadImageError in DataLoader worker process 1.\nOriginal Traceback (most recent call last):\n'
              '  File "w.py", line 3, in f\n    raise BadImageError(x)\ntcnn.data.folders.BadImageError: cannot read '
              'a.jpg (OSError: truncated)\n\n')
    assert str(BadImageError(worker)) == 'cannot read a.jpg (OSError: truncated)'
    # another type's last line stays whole; a message that is not a worker's is left as it is
    assert str(SampleError(worker)) == 'tcnn.data.folders.BadImageError: cannot read a.jpg (OSError: truncated)'
    for message in ('Caught a cold, no traceback', 'Original Traceback first\nthen Caught ', ''):
        assert str(BadImageError(message)) == message
    assert str(BadImageError()) == ''


def test_an_unreadable_image_and_a_run_of_them_are_refused_word_for_word(tmp_path):
    """Without the skip policy the first unreadable file stops the run, naming it and Pillow's reason; with it, a
    split whose every image is unreadable (a damaged folder, not a few bad files) stops after MAX_CONSECUTIVE_BAD
    tries from the sample asked for."""
    from tcnn.data.folders import MAX_CONSECUTIVE_BAD, SKIP_HINT, error_text
    root = make_image_folder(str(tmp_path / 'd'), num_classes=2, train_per_class=2, val_per_class=1, size=8)
    for folder, _, files in os.walk(os.path.join(root, 'train')):
        for name in files:
            with open(os.path.join(folder, name), 'wb') as f:
                f.write(b'not an image')
    strict = open_dataset(root, 'train')
    with pytest.raises(Exception) as pillow, open(strict.filename(1), 'rb') as f:
        Image.open(f)  # as the folder reads it: from the open file
    with pytest.raises(BadImageError) as info:
        strict[1]
    assert str(info.value) == f'cannot read image {strict.filename(1)} ({error_text(pillow.value)}): {SKIP_HINT}'
    assert strict.bad_images() == []  # a dataset without the policy has no queue to read
    skipping = open_dataset(root, 'train', skip_bad_images=True)
    with pytest.raises(BadImageError) as info:
        skipping[2]
    assert str(info.value) == (f'{MAX_CONSECUTIVE_BAD} consecutive unreadable images from {skipping.filename(2)} on: '
                               'is the data folder intact?')
    assert sorted(skipping.bad_images()) == sorted(skipping.filename(i) for i in range(4))  # each once


def test_a_skipped_image_is_replaced_by_the_next_one_and_reported_once(tmp_path):
    """The skip policy reads the next sample in order (wrapping at the end), not an earlier one: the replacement is
    the same in every worker and every run."""
    root = make_image_folder(str(tmp_path / 'd'), num_classes=2, train_per_class=3, val_per_class=1, size=8)
    skipping = open_dataset(root, 'train', skip_bad_images=True)
    for index in (2, 5):  # the middle and the last sample
        with open(skipping.filename(index), 'wb') as f:
            f.write(b'not an image')
    assert skipping._read(2)[0] == skipping.filename(3)
    assert skipping._read(5)[0] == skipping.filename(0)
    assert skipping.bad_images() == [skipping.filename(2), skipping.filename(5)]
    assert skipping._read(2)[0] == skipping.filename(3) and skipping.bad_images() == []
