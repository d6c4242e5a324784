"""tcnn.data.images: the image files the CLI reads (``tcnn inspect``, the demo): found in a stable order, sampled
over classes with a seed, loaded exactly as timm's eval transform loads them, and denormalised for display; each
refusal word for word."""
import os
import random

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import create_transform

from tcnn.data.images import IMAGE_EXTENSIONS, denormalize, find_images, load_images, sample_images
from tcnn.errors import TcnnError

CFG = {'input_size': (3, 8, 8), 'interpolation': 'bilinear', 'mean': (0.5, 0.4, 0.3), 'std': (0.2, 0.25, 0.5),
       'crop_pct': 0.875, 'crop_mode': 'center'}


def _write(path, colour=(10, 20, 30), size=(12, 10)):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new('RGB', size, colour).save(path)
    return str(path)


def test_images_are_found_recursively_in_sorted_order_by_extension_in_any_case(tmp_path):
    for name in ('b/2.PNG', 'b/1.jpeg', 'a/x.webp', 'a/sub/y.TIF', 'c/z.bmp'):
        _write(tmp_path / name)
    for skipped in ('a/notes.txt', 'a/.hidden.png', '.cache/k.png', 'b/.git/h.png'):
        os.makedirs(tmp_path / os.path.dirname(skipped), exist_ok=True)
        (tmp_path / skipped).write_bytes(b'x')
    expected = [str(tmp_path / n) for n in ('a/x.webp', 'a/sub/y.TIF', 'b/1.jpeg', 'b/2.PNG', 'c/z.bmp')]
    assert find_images(str(tmp_path)) == expected
    assert find_images(str(tmp_path), limit=2) == expected[:2] and find_images(str(tmp_path), limit=5) == expected
    assert find_images(str(tmp_path), limit=1) == expected[:1]
    assert IMAGE_EXTENSIONS == ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff', '.webp')


def test_a_missing_or_empty_image_folder_and_a_bad_limit_are_refused_word_for_word(tmp_path):
    with pytest.raises(TcnnError) as info:
        find_images(str(tmp_path / 'nowhere'))
    assert str(info.value) == f'image folder not found: {tmp_path / "nowhere"}'
    (tmp_path / 'readme.txt').write_text('no images')
    with pytest.raises(TcnnError) as info:
        find_images(str(tmp_path))
    assert str(info.value) == (f'no images (.jpg, .jpeg, .png, .ppm, .bmp, .pgm, .tif, .tiff, .webp) under '
                               f'{tmp_path}')
    with pytest.raises(ValueError, match='limit'):
        find_images(str(tmp_path), limit=0)
    with pytest.raises(TypeError, match='limit must be an integer, got 1.5'):
        find_images(str(tmp_path), limit=1.5)


def _reference_sample(paths, limit, seed):
    """The documented draw, written out: folders in a seeded order, one random image of each per round."""
    rng = random.Random(seed)
    folders = {}
    for p in sorted(paths):
        folders.setdefault(os.path.dirname(p), []).append(p)
    queues = [list(folders[d]) for d in sorted(folders)]
    for q in queues:
        rng.shuffle(q)
    rng.shuffle(queues)
    order = [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]
    return sorted(order[:limit])


def test_a_sample_takes_one_image_of_each_folder_per_round_in_a_seeded_order(tmp_path):
    sizes = {'a': 5, 'b': 1, 'c': 3, 'd': 4}
    paths = [_write(tmp_path / d / f'{i}.png') for d, n in sizes.items() for i in range(n)]
    for limit, seed in ((3, 0), (4, 1), (6, 2), (9, 3), (12, 4)):
        picked = sample_images(str(tmp_path), limit, seed=seed)
        assert picked == _reference_sample(paths, limit, seed) and len(picked) == limit
    assert len({os.path.dirname(p) for p in sample_images(str(tmp_path), 4, seed=0)}) == 4  # every folder once
    assert sample_images(str(tmp_path), 4, seed=0) != sample_images(str(tmp_path), 4, seed=5)
    # a list is taken as it is (sorted); at most limit images: all of them
    assert sample_images(list(reversed(paths)), 13) == sorted(paths) == sample_images(paths, 100)
    assert sample_images(str(tmp_path), 5) == sample_images(str(tmp_path), 5, seed=0)  # seed 0 unless told
    assert len(sample_images(paths, 1)) == 1
    for limit, error in ((0, ValueError), (1.5, TypeError)):
        with pytest.raises(error) as info:
            sample_images(paths, limit)
        assert str(info.value).startswith('limit must be ')
    with pytest.raises(TypeError, match='seed must be an integer, got 0.5'):
        sample_images(paths, 2, seed=0.5)


def test_images_load_as_timms_eval_transform_loads_them(tmp_path):
    paths = [_write(tmp_path / 'a.png', (200, 10, 60), (12, 10)), _write(tmp_path / 'b.jpg', (5, 250, 128), (9, 16))]
    x = load_images(paths, CFG)
    transform = create_transform(**CFG, is_training=False)
    expected = torch.stack([transform(Image.open(p).convert('RGB')) for p in paths])
    assert x.shape == (2, 3, 8, 8) and torch.equal(x, expected)
    gray = tmp_path / 'g.png'
    Image.new('L', (8, 8), 77).save(gray)  # converted to RGB as every pipeline does
    shown = denormalize(load_images([str(gray)], CFG)[0], CFG)
    assert torch.allclose(shown, torch.full((3, 8, 8), 77 / 255), rtol=0, atol=1e-6)


def test_load_images_refuses_a_string_nothing_a_missing_file_and_an_unreadable_one_word_for_word(tmp_path):
    with pytest.raises(TypeError) as info:
        load_images(str(tmp_path / 'a.png'), CFG)
    assert str(info.value) == 'paths must be a list of image paths, got str'
    with pytest.raises(ValueError) as info:
        load_images([], CFG)
    assert str(info.value) == 'paths is empty: give at least one image'
    with pytest.raises(TcnnError) as info:
        load_images([str(tmp_path / 'gone.png')], CFG)
    assert str(info.value) == f'image not found: {tmp_path / "gone.png"}'
    (tmp_path / 'bad.png').write_bytes(b'\x89PNG\r\n\x1a\n not an image')
    with pytest.raises(TcnnError) as info:
        load_images([str(tmp_path / 'bad.png')], CFG)
    assert str(info.value).startswith(f'cannot read image {tmp_path / "bad.png"}: cannot identify image file')


def test_denormalize_undoes_the_normalisation_and_clips_to_the_unit_range():
    pixels = torch.rand(2, 3, 4, 4, dtype=torch.float64)
    mean, std = torch.tensor(CFG['mean'], dtype=torch.float64), torch.tensor(CFG['std'], dtype=torch.float64)
    normalised = (pixels - mean[:, None, None]) / std[:, None, None]
    assert torch.allclose(denormalize(normalised, CFG), pixels, rtol=0, atol=1e-12)
    assert denormalize(normalised, CFG).dtype == torch.float64
    out = denormalize(torch.tensor([[[10.0]], [[-10.0]], [[0.0]]]), CFG)
    assert out.flatten().tolist() == [1.0, 0.0, 0.30000001192092896]
    with pytest.raises(ValueError) as info:
        denormalize(normalised, {'mean': CFG['mean']})
    assert str(info.value) == 'data_config must hold the normalisation mean and std (see data_config)'
    assert np.isclose(denormalize(torch.zeros(3, 1, 1), CFG).flatten().numpy(), CFG['mean']).all()
    assert denormalize(torch.zeros(2, 3, 1, 1, device='meta'), CFG).device.type == 'meta'  # on the images' device
