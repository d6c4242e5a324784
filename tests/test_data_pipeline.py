"""Tests of the batched data pipelines (``tcnn.data.decode``, ``encoded``, ``resident``; ``--data-pipeline``): JPEG
bytes decoded in batches give Pillow's pixels, other formats and bad files go the PIL pipeline's way, the streamed and
the resident pipelines give the same batches whatever the worker count, ``auto`` chooses as documented, and training
runs resume exactly on each pipeline."""
import dataclasses
import gc
import io
import math
import os
import random
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import create_transform
from torch.utils.data import DataLoader

from tcnn.train import launch
from tcnn.data.batch_augment import BatchAugment
from tcnn.data.decode import decode_batch, decode_pil, jpeg_size
from tcnn.data.encoded import (BatchFinisher, CollateAndFinish, DeviceLoader, EncodedBatch, EncodedDataset,
                               collate_encoded, replace_failed)
from tcnn.data.folders import BadImageError, open_dataset
from tcnn.data.resident import ResidentLoader, ResidentSplit, estimate_decoded_bytes
from tcnn.errors import TcnnError
import tcnn.train.data
from tcnn.train.builders import EpochSampler
from tcnn.train.recipe import resolve_recipe

from imagegen import draw_shape, make_image_folder
from test_train import assert_same_weights, common, load, metrics, same_numbers
from test_train_reliability import _stop_after

pytestmark = pytest.mark.usefixtures('one_thread')  # small models on a shared 2-core machine (conftest.py)

PAPER = resolve_recipe('t_resnet50_d')  # rand-m9-mstd0.5-inc1, random erasing 0.25 (pixel), bicubic, mixup


def _photo(height=48, width=64, seed=0):
    """A generated image with smooth gradients, edges and noise: what a JPEG codec sees in a photo."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], -1)
    pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    img = Image.fromarray(pixels)
    img.paste(draw_shape('circle', min(height, width) // 2, rng), (width // 4, height // 4))
    return img


def _jpeg(img, **kwargs):
    buffer = io.BytesIO()
    img.save(buffer, 'JPEG', **kwargs)
    return buffer.getvalue()


def _tensor(data):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _broken_huffman_table(data):
    """A JPEG whose header reads (size, mode, end marker: the batch decoder gets it) but whose first Huffman table has
    no codes: every decoder fails on it (on every supported Pillow, where a file cut before its scan is refused
    already by the header check of older ones)."""
    dht = data.index(b'\xff\xc4')
    return data[:dht + 5] + bytes(16) + data[dht + 21:]


def test_batch_decoding_gives_pillows_pixels_on_the_cpu():
    img = _photo()
    files = [_jpeg(img, quality=90), _jpeg(img.convert('L')), _jpeg(img, progressive=True),
             _jpeg(_photo(31, 17, seed=1), quality=75, subsampling=2)]
    payloads = [_tensor(f) for f in files]
    assert all(jpeg_size(f) == (Image.open(io.BytesIO(f)).size[1], Image.open(io.BytesIO(f)).size[0]) for f in files)
    png = io.BytesIO()
    img.save(png, 'PNG')
    payloads.append(decode_pil(png.getvalue()))  # a decoded payload passes through
    images, failed = decode_batch(payloads, 'cpu')
    assert failed == []
    for data, out in zip(files + [png.getvalue()], images):
        reference = torch.from_numpy(np.array(Image.open(io.BytesIO(data)).convert('RGB'))).permute(2, 0, 1)
        assert out.dtype == torch.uint8 and torch.equal(out, reference)


def test_the_batch_decoder_leaves_other_files_to_pillow_and_fails_a_broken_jpeg_alone():
    img = _photo()
    good = _jpeg(img)
    assert jpeg_size(good[:len(good) // 2]) is None  # cut: no end marker, the PIL path reports it
    assert jpeg_size(_jpeg(img.convert('CMYK'))) is None  # another colour mode: Pillow converts it
    png = io.BytesIO()
    img.save(png, 'PNG')
    assert jpeg_size(png.getvalue()) is None and jpeg_size(b'') is None
    # a broken file with a readable header and its end marker passes the check; the batch fails on it alone
    broken = _broken_huffman_table(good)
    assert jpeg_size(broken) == (48, 64)
    images, failed = decode_batch([_tensor(good), _tensor(broken), _tensor(good)], 'cpu')
    assert failed == [1] and images[1] is None and torch.equal(images[0], images[2])


@pytest.fixture(scope='module')
def mixed_folder(tmp_path_factory):
    """Two classes: JPEGs (RGB, grayscale) of two sizes, PNGs and one CMYK JPEG."""
    root = tmp_path_factory.mktemp('mixed')
    for c, name in enumerate(('a', 'b')):
        for split, count in (('train', 10), ('val', 3)):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                img = _photo(40 + 8 * (i % 2), 56, seed=100 * c + i)
                if i % 5 == 0:
                    img.save(folder / f'{i}.png')
                elif i % 5 == 1:
                    (folder / f'{i}.jpg').write_bytes(_jpeg(img.convert('L')))
                elif i == 2 and split == 'train':
                    (folder / f'{i}.jpg').write_bytes(_jpeg(img.convert('CMYK')))
                else:
                    (folder / f'{i}.jpg').write_bytes(_jpeg(img, quality=85))
    return str(root)


def test_read_encoded_sends_bytes_for_jpegs_only(mixed_folder):
    dataset = open_dataset(mixed_folder, 'train')
    kinds = {}
    for i in range(len(dataset)):
        name, payload, size, target = dataset.read_encoded(i)
        kinds[os.path.basename(name)] = payload.dim()
        pixels = dataset.read_decoded(i)[1]
        assert size == tuple(pixels.shape[1:]) and target == dataset.reader.samples[i][1]
        decoded = decode_batch([payload], 'cpu')[0][0]
        assert torch.equal(decoded, pixels), name  # the same pixels as Pillow's, bytes or not
    assert kinds['0.png'] == 3 and kinds['1.jpg'] == 1 and kinds['3.jpg'] == 1 and kinds['2.jpg'] == 3  # CMYK


def _augment(img_size=32, **kwargs):
    settings = dict(auto_augment='rand-m9-mstd0.5-inc1', interpolation='bicubic', re_prob=0.25, re_mode='pixel')
    settings.update(kwargs)
    return BatchAugment(img_size, **settings)


def _batches(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


@pytest.mark.parametrize('workers, where', [(0, 'here'), (2, 'workers'), (0, 'collate'), (2, 'thread')])
def test_streamed_and_resident_pipelines_give_the_same_batches(mixed_folder, workers, where, one_thread):
    """The same samples, parameters (seeded per sample) and pixels, whether each batch is decoded from file bytes
    (in the loader workers' collate, in this process, or in this process's finishing thread as on a GPU) or gathered
    from a split decoded once. ``collate``: the workers' collate run in this process, where the tests' trace sees
    it."""
    dataset = open_dataset(mixed_folder, 'train')
    dataset.augment_seed = 3
    augment = _augment()
    sampler = EpochSampler(dataset, 1, 0, seed=0)
    finish = BatchFinisher(augment, torch.device('cpu'), dataset.report_bad, train=True)
    in_workers = where in ('workers', 'collate')
    loader = DeviceLoader(DataLoader(EncodedDataset(dataset, augment.draw), batch_size=4, sampler=sampler,
                                     num_workers=workers, drop_last=True,
                                     collate_fn=CollateAndFinish(finish) if in_workers else collate_encoded),
                          None if in_workers else finish, prefetch=2 if where == 'thread' else 0)
    resident = ResidentLoader(ResidentSplit(dataset, 'cpu', workers), sampler, 4, augment, draw_many=augment.draw_many,
                              drop_last=True, prefetch=2 if where == 'thread' else 0)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        dataset.set_epoch(epoch)
        streamed, kept = _batches(loader), _batches(resident)
        assert len(streamed) == len(kept) == len(loader) == len(resident) == 5
        for (xa, ya), (xb, yb) in zip(streamed, kept):
            assert xa.shape == (4, 3, 32, 32) and xa.dtype == torch.float32
            assert torch.equal(ya, yb) and torch.equal(xa, xb)
    sampler.set_epoch(0)  # another epoch draws other augmentations
    dataset.set_epoch(0)
    first = _batches(resident)
    sampler.set_epoch(1)
    dataset.set_epoch(1)
    assert not torch.equal(first[0][0], _batches(resident)[0][0])


def test_a_resident_validation_split_gives_the_pil_pipelines_batches(mixed_folder):
    """Kept as timm's eval transform makes it (Pillow's resize and crop once, the normalisation per batch): the same
    floats as the PIL pipeline, so a run's validation numbers are tcnn eval's on every pipeline."""
    dataset = open_dataset(mixed_folder, 'val')
    dataset.transform = create_transform(32, is_training=False, interpolation='bicubic', crop_pct=0.875,
                                          mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    pil = _batches(DataLoader(dataset, batch_size=4))
    split = ResidentSplit(dataset, 'cpu', prepare=dataset.transform)
    kept = _batches(ResidentLoader(split, range(len(dataset)), 4, ResidentSplit.normalizer(dataset.transform)))
    assert [x.shape[0] for x, _ in pil] == [4, 2] == [x.shape[0] for x, _ in kept]
    assert split.stacked is not None and split.stacked.shape[1:] == (3, 32, 32)
    for (xa, ya), (xb, yb) in zip(pil, kept):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)



def test_a_resident_split_takes_only_an_eval_transform_that_ends_in_its_normalisation():
    """What the one decoding pass applies (the Pillow part) and what each batch gets (the normalisation) are read off
    timm's eval transform; anything else is refused naming the steps it has, so that no split is kept half
    transformed."""
    transform = create_transform(32, is_training=False, mean=(0.5, 0.25, 0.125), std=(0.5, 0.75, 0.375))
    normalize = ResidentSplit.normalizer(transform)
    assert (normalize.mean, normalize.std) == ((0.5, 0.25, 0.125), (0.5, 0.75, 0.375))  # float32 exactly
    for other, steps in ((lambda img: img, []), (transform.transforms[0], []),
                         (type(transform)(transform.transforms[:-1]), ['Resize', 'CenterCrop', 'MaybeToTensor'])):
        with pytest.raises(ValueError) as error:
            ResidentSplit.normalizer(other)
        assert str(error.value) == f'not an eval transform ending in ToTensor and Normalize: {steps}'



def test_a_resident_split_takes_torchvisions_to_tensor_and_eval_transforms_of_other_lengths():
    """torchvision's ``ToTensor`` ends an eval transform as timm's ``MaybeToTensor`` does, and the Pillow part is
    whatever comes before the last two steps, however many there are (one here, three below)."""
    from torchvision import transforms as T
    from tcnn.data.resident import _split_eval_transform
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 30, 3), dtype=np.uint8))
    for steps in ([T.CenterCrop(24)], [T.Resize(36), T.CenterCrop(32), T.Resize(28)]):
        for to_tensor in (T.ToTensor(), create_transform(32, is_training=False).transforms[-2]):
            transform = T.Compose([*steps, to_tensor, T.Normalize((0.5, 0.25, 0.125), (0.5, 0.75, 0.375))])
            pillow, (mean, std) = _split_eval_transform(transform)
            assert [type(t) for t in pillow.transforms] == [type(t) for t in steps]
            assert np.array_equal(np.asarray(pillow(image)), np.asarray(T.Compose(steps)(image)))
            assert (mean, std) == ((0.5, 0.25, 0.125), (0.5, 0.75, 0.375))
    for end in (['ToTensor'], ['Normalize'], ['Normalize', 'ToTensor']):
        steps = [T.CenterCrop(24)] + [T.ToTensor() if n == 'ToTensor' else T.Normalize((0.5,), (0.5,)) for n in end]
        with pytest.raises(ValueError) as error:
            _split_eval_transform(T.Compose(steps))
        assert str(error.value) == f"not an eval transform ending in ToTensor and Normalize: {['CenterCrop', *end]}"

@pytest.fixture()
def folder_with_undecodable_jpeg(tmp_path):
    root = make_image_folder(str(tmp_path / 'data'), num_classes=2, train_per_class=4, val_per_class=2, size=32)
    bad = tmp_path / 'data' / 'train' / 'circle' / 'broken.jpg'
    data = _jpeg(_photo(32, 32))
    bad.write_bytes(_broken_huffman_table(data))  # passes the header check, fails to decode
    cut = tmp_path / 'data' / 'train' / 'square' / 'cut.jpg'
    cut.write_bytes(data[:len(data) // 2])  # caught in the worker, as the PIL pipeline catches it
    return root, str(bad), str(cut)


@pytest.mark.parametrize('workers, prefetch', [(0, 0), (2, 0), (0, 1)])
def test_bad_images_on_the_batched_pipeline_stop_or_are_skipped(folder_with_undecodable_jpeg, workers, prefetch):
    root, bad, cut = folder_with_undecodable_jpeg
    augment = _augment(32, auto_augment=None)

    def batches(dataset):
        finish = BatchFinisher(augment, torch.device('cpu'), dataset.report_bad, train=True)
        loader = DataLoader(EncodedDataset(dataset, augment.draw), batch_size=5, num_workers=workers,
                            collate_fn=CollateAndFinish(finish) if workers else collate_encoded)
        return _batches(DeviceLoader(loader, None if workers else finish, prefetch=prefetch))

    dataset = open_dataset(root, 'train')
    with pytest.raises(BadImageError) as info:
        batches(dataset)
    message = str(info.value)
    assert len(message.splitlines()) == 1 and '--skip-bad-images' in message
    assert bad in message or cut in message
    dataset = open_dataset(root, 'train', skip_bad_images=True)
    out = batches(dataset)
    assert sum(x.shape[0] for x, _ in out) == 10 and all(torch.isfinite(x).all() for x, _ in out)
    assert set(dataset.bad_images()) == {bad, cut}


class _CountingFinish:
    """A finisher that records the batches it finished and fails at batch ``fail_at``."""

    def __init__(self, fail_at=None):
        self.device, self.done, self.fail_at = torch.device('cpu'), [], fail_at

    def __call__(self, batch):
        if len(self.done) == self.fail_at:
            raise BadImageError(f'batch {self.fail_at}')
        self.done.append(int(batch))
        return torch.full((2, 3), float(batch)), torch.tensor([int(batch)])


def test_the_finishing_thread_keeps_the_order_and_raises_at_the_failed_batch():
    out = [int(y) for _, y in DeviceLoader(list(range(7)), _CountingFinish(), prefetch=2)]
    assert out == list(range(7))
    finish = _CountingFinish(fail_at=3)
    got = []
    with pytest.raises(BadImageError, match='batch 3'):
        for _, y in DeviceLoader(list(range(7)), finish, prefetch=2):
            got.append(int(y))
    assert got == [0, 1, 2]  # the batches before the failure, then the failure where its batch would have come


def test_leaving_the_finishing_thread_early_stops_it():
    """An epoch that ends before its loader (its updates done, a stop request) leaves at most ``prefetch`` batches
    finished beyond it, and no thread running."""
    finish = _CountingFinish()
    batches = iter(DeviceLoader(range(1000), finish, prefetch=2))
    assert int(next(batches)[1]) == 0
    thread = batches._thread
    del batches
    thread.join(timeout=5)
    assert not thread.is_alive() and len(finish.done) <= 1 + 2 + 1  # consumed, queued, one in the thread's hands
    assert not any(t.name == 'tcnn-finish' and t.is_alive() for t in threading.enumerate())


def test_a_finishing_thread_stopped_while_it_finishes_takes_no_further_batch_from_the_loader():
    """A stop that comes while the thread finishes a batch ends it there: it does not take one more batch from the
    loader (whose workers would have read and decoded it for nothing)."""
    from tcnn.data.prefetch import FinishedAhead
    taken, inside, release = [], threading.Event(), threading.Event()

    def loader():
        for i in range(100):
            taken.append(i)
            yield i

    def finish(i):
        if i == 1:
            inside.set()
            release.wait(10)
        return torch.zeros(1), torch.tensor(i)
    # no garbage collection while the thread waits in finish(1): a collection may finalise an earlier test's
    # DataLoader iterator, whose finaliser joins each worker for up to 5 s (the mutation campaign's clean runs twice
    # saw 11 s here: close's wait timed, or release.wait running out before close came)
    gc.collect()
    gc.disable()
    try:
        ahead = FinishedAhead(loader(), finish, torch.device('cpu'), depth=2)
        assert int(next(ahead)[1]) == 0
        assert inside.wait(10)
        thread = ahead._thread
        started = time.monotonic()
        ahead.close()  # the thread is in finish(1): close waits a second for it, then leaves it to end
        waited = time.monotonic() - started
    finally:
        gc.enable()
    assert waited < 1.8  # not until the batch is done
    release.set()
    thread.join(10)
    assert not thread.is_alive() and taken == [0, 1]


def test_closing_the_finishing_thread_ends_it_and_releases_the_batches_it_finished_ahead():
    """``close`` waits for a thread inside ``finish`` (up to a second) and empties the queue once it has ended: no
    batch finished ahead keeps its memory (on a GPU, device memory) while the closed iterator lives on."""
    from tcnn.data.prefetch import FinishedAhead
    inside = threading.Event()

    def finish(i):
        if i == 3:  # 0 taken, 1 and 2 queued (depth 2): the thread is in the fourth batch when close comes
            inside.set()
            time.sleep(0.5)
        return torch.zeros(1), torch.tensor(i)
    ahead = FinishedAhead(iter(range(100)), finish, torch.device('cpu'), depth=2)
    assert int(next(ahead)[1]) == 0
    assert inside.wait(10)
    assert ahead._queue.full()
    ahead.close()
    assert not ahead._thread.is_alive() and ahead._queue.empty()


@pytest.mark.filterwarnings('ignore::pytest.PytestUnhandledThreadExceptionWarning')  # the thread's death, on purpose
def test_a_finishing_thread_that_fails_before_its_first_batch_or_dies_mid_put_fails_the_consumer_not_hangs_it():
    from tcnn.data.prefetch import FinishedAhead

    def finish(i):
        return torch.zeros(1), torch.tensor(i)
    # its set-up fails (a device that is none): the error comes out where the first batch would have
    with pytest.raises(AttributeError, match="'str' object has no attribute 'type'"):
        next(FinishedAhead(iter(range(3)), finish, 'cuda:0', depth=2))
    # its queue refuses the batch and then the error: the thread ends without a word, and the consumer is told
    allowed = threading.Event()

    def loader():
        allowed.wait(10)
        yield 0
    ahead = FinishedAhead(loader(), finish, torch.device('cpu'), depth=2)

    def refuse(item, timeout=None):
        raise OSError('no room')
    ahead._queue.put = refuse
    allowed.set()
    outcome = []

    def consume():  # in a thread of its own: a consumer that waits for ever fails the test instead of hanging it
        try:
            next(ahead)
        except Exception as e:  # noqa: BLE001 - what the consumer gets is the point
            outcome.append(e)
    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    consumer.join(15)
    assert not consumer.is_alive(), 'the consumer still waits for a batch'
    assert [(type(e), str(e)) for e in outcome] == [
        (RuntimeError, 'the thread that finishes batches ended without a batch or an error')]


def test_a_finished_iterator_stays_finished_and_its_thread_is_a_named_daemon():
    """The thread never keeps the process alive and is found by its name in a stack dump; an iterator that handed
    out its last batch raises StopIteration again (the protocol), not an error about its ended thread."""
    from tcnn.data.prefetch import FinishedAhead
    ahead = FinishedAhead(iter(range(2)), lambda i: (torch.zeros(1), torch.tensor(i)), torch.device('cpu'), depth=1)
    assert ahead._thread.name == 'tcnn-finish' and ahead._thread.daemon is True
    assert [int(y) for _, y in ahead] == [0, 1]
    for _ in range(2):
        with pytest.raises(StopIteration):
            next(ahead)


def test_a_batch_that_takes_longer_than_the_consumers_wait_still_comes():
    from tcnn.data.prefetch import FinishedAhead

    def slow(i):  # longer than the one second the consumer waits before it looks whether the thread still runs
        time.sleep(1.5)
        return torch.zeros(1), torch.tensor(i)
    assert [int(y) for _, y in FinishedAhead(iter(range(2)), slow, torch.device('cpu'), depth=1)] == [0, 1]


def test_auto_chooses_resident_when_the_splits_fit(mixed_folder, monkeypatch):
    recipe = dataclasses.replace(PAPER, data=mixed_folder, img_size=32)
    data = tcnn.train.data.open_training_data(recipe)
    cfg = {'input_size': (3, 32, 32), 'interpolation': 'bicubic', 'mean': (0.5,) * 3, 'std': (0.5,) * 3,
           'crop_pct': 0.875, 'crop_mode': 'center'}
    cpu = torch.device('cpu')
    estimate = estimate_decoded_bytes(data.train)
    assert 0.8 * 20 * 44 * 56 * 3 < estimate < 1.2 * 20 * 44 * 56 * 3  # the headers' sizes, not the file sizes
    assert tcnn.train.data.resolve_pipeline(recipe, data, cfg, cpu)[0] == 'resident'
    monkeypatch.setitem(tcnn.train.data.RESIDENT_SHARE, 'cpu', 1e-12)
    assert tcnn.train.data.resolve_pipeline(recipe, data, cfg, cpu) == ('device', 'the splits are too large to keep '
                                                                   'decoded')
    # on a GPU, where nvjpeg against the PIL workers is not measured yet, a split too large to keep stays on PIL
    monkeypatch.setattr(tcnn.train.data, 'memory_budget', lambda device, share, processes: 0)
    chosen, why = tcnn.train.data.resolve_pipeline(recipe, data, cfg, torch.device('cuda'))
    assert chosen == 'pil' and '--data-pipeline device decodes on the GPU' in why
    for asked in ('pil', 'device', 'resident'):
        assert tcnn.train.data.resolve_pipeline(dataclasses.replace(recipe, data_pipeline=asked), data, cfg, cpu) == (
            asked, 'asked for')
    augmix = dataclasses.replace(recipe, aa='augmix-m5-w4-d2')
    chosen, why = tcnn.train.data.resolve_pipeline(augmix, data, cfg, cpu)
    assert chosen == 'pil' and 'augmix' in why
    with pytest.raises(TcnnError, match='--data-pipeline pil'):
        tcnn.train.data.resolve_pipeline(dataclasses.replace(augmix, data_pipeline='device'), data, cfg, cpu)


# ------------------------------------------------------------------------------------------------ training runs

@pytest.fixture(scope='module')
def jpeg_dir(tmp_path_factory):
    """48 training images (JPEG and PNG, 64 px) in 3 classes: 12 updates of batch 4."""
    root = make_image_folder(str(tmp_path_factory.mktemp('jpegs')), num_classes=3, train_per_class=16,
                             val_per_class=2, size=64)
    for i, path in enumerate(sorted(p for p, _, _ in os.walk(root))):
        for name in sorted(os.listdir(path)):
            if name.endswith('.png') and (i + len(name)) % 3:
                png = os.path.join(path, name)
                Image.open(png).convert('RGB').save(png[:-4] + '.jpg', quality=90)
                os.remove(png)
    return root


@pytest.mark.parametrize('pipeline,workers,thread', [('device', 2, False), ('device', 0, True), ('resident', 0, False),
                                                     ('resident', 0, True)])
def test_mid_epoch_resume_is_exact_on_the_batched_pipelines(jpeg_dir, tmp_path, monkeypatch, capsys, pipeline,
                                                            workers, thread):
    """A run stopped mid-epoch (SIGTERM) resumes to the uninterrupted run's weights; ``thread``: the batches finished
    ahead by the thread a GPU run uses (``tcnn.data.encoded.default_prefetch``), here on the CPU."""
    straight, run = tmp_path / 'straight', tmp_path / 'run'

    def finish_ahead():
        if thread:
            for module in ('encoded', 'resident'):
                monkeypatch.setattr(f'tcnn.data.{module}.default_prefetch', lambda device: 2)

    finish_ahead()

    def args(out):  # the smallest T-CNN at 32 px: the promise is the data's, 2.3x faster than resnet18d at 64 px
        return common(jpeg_dir, out, epochs=2) + ['--workers', str(workers), '--data-pipeline', pipeline,
                                                  '--model', 'resnet10t', '--img-size', '32']

    assert launch.main(args(straight)) == 0
    assert f'data pipeline {pipeline} (asked for)' in capsys.readouterr().out
    _stop_after(monkeypatch, 12 + 3)
    assert launch.main(args(run)) == 75
    monkeypatch.undo()
    finish_ahead()
    assert launch.main(['--resume', str(run), '--no-progress']) == 0
    assert same_numbers(metrics(run), metrics(straight), keys=('train_loss', 'train_top1', 'val_loss'))
    assert_same_weights(load(run / 'last.pt'), load(straight / 'last.pt'))
    assert load(run / 'last.pt')['config']['data_pipeline'] == pipeline


def test_auto_is_recorded_and_an_old_checkpoint_resumes_on_pil(jpeg_dir, tmp_path, capsys):
    run = tmp_path / 'run'
    assert launch.main(common(jpeg_dir, run, epochs=2) + ['--model', 'resnet10t', '--img-size', '32']) == 0
    assert 'data pipeline resident (the splits take about' in capsys.readouterr().out
    ckpt = load(run / 'last.pt')
    assert ckpt['config']['data_pipeline'] == 'resident'
    with open(run / 'config.yaml') as f:
        assert 'data_pipeline: resident' in f.read()
    # a checkpoint of tcnn <= 0.6 has no data_pipeline: its run trained on timm's PIL transform and goes on with it
    del ckpt['config']['data_pipeline']
    torch.save(ckpt, run / 'last.pt')
    assert launch.main(['--resume', str(run), '--epochs', '3', '--no-progress']) == 0
    assert 'data pipeline pil (asked for)' in capsys.readouterr().out
    assert load(run / 'last.pt')['config']['data_pipeline'] == 'pil'


# ---------------------------------------------------------------------- a batch with images that did not decode


def test_a_pinned_encoded_batch_pins_its_parameters_and_labels_and_keeps_its_files(monkeypatch):
    """What ``DataLoader(pin_memory=True)`` calls on the batched pipeline's batches. Pinning needs a GPU, so what each
    tensor's ``pin_memory`` returns is seen instead: a new tensor, which the batch must hold in place of its own."""
    pinned = []

    def pin(tensor):
        pinned.append(tensor.clone())
        return pinned[-1]
    monkeypatch.setattr(torch.Tensor, 'pin_memory', pin)
    batch = EncodedBatch(names=['a.jpg', 'b.png'], payloads=[torch.zeros(5, dtype=torch.uint8), torch.ones(3, 2, 2)],
                         params={'crop': torch.arange(8).reshape(2, 4), 'flip': torch.tensor([0., 1.])},
                         targets=torch.tensor([3, 4]))
    out = batch.pin_memory()
    assert len(pinned) == 3 and out.params['crop'] is pinned[0] and out.params['flip'] is pinned[1]
    assert out.targets is pinned[2] and out.targets.tolist() == [3, 4]
    assert out.params['crop'].equal(batch.params['crop'])
    assert out.names is batch.names and out.payloads is batch.payloads  # the files stay as read (decoded later)


def test_an_image_that_did_not_decode_is_replaced_by_the_next_readable_sample_with_its_parameters_and_label():
    a, b = torch.full((3, 4, 4), 1, dtype=torch.uint8), torch.full((3, 6, 2), 3, dtype=torch.uint8)
    images = [None, a, None, b, None]
    crop = torch.arange(20).reshape(5, 4)
    batch = EncodedBatch(names=[f'{i}.jpg' for i in range(5)], payloads=[torch.zeros(1)] * 5,
                         params={'crop': crop, 'flip': torch.tensor([0., 1., 0., 1., 0.])},
                         targets=torch.tensor([10, 11, 12, 13, 14]))
    out = replace_failed(images, batch, [0, 2, 4])
    # the next readable sample of the batch (the PIL pipeline's skip policy); after the last, the first readable
    assert [img is a for img in images] == [True, True, False, False, True] and images[2] is b and images[3] is b
    assert out.targets.tolist() == [11, 11, 13, 13, 11]
    assert out.params['crop'].tolist() == [crop[k].tolist() for k in (1, 1, 3, 3, 1)]
    assert out.params['flip'].tolist() == [1., 1., 1., 1., 1.]
    assert out.names == batch.names and out.payloads is batch.payloads
    # the collated batch is left as it was (a DataLoader may hand it out again on a retry)
    assert batch.targets.tolist() == [10, 11, 12, 13, 14] and batch.params['crop'].equal(torch.arange(20).reshape(5, 4))
    with pytest.raises(BadImageError) as info:
        replace_failed([None, None, None], dataclasses.replace(batch, names=['x.jpg', 'y.jpg', 'z.jpg']), [0, 1, 2])
    assert str(info.value) == 'no image of a batch of 3 could be decoded (first: x.jpg): is the data folder intact?'


@pytest.mark.parametrize('images, drop_last, batches', [(10, False, 3), (10, True, 2), (8, False, 2), (8, True, 2),
                                                       (3, True, 0), (3, False, 1)])
def test_a_resident_loader_has_as_many_batches_as_it_yields(images, drop_last, batches):
    split = type('Split', (), {'device': torch.device('cpu'),
                               'gather': staticmethod(lambda idx: (torch.tensor(idx), torch.tensor(idx)))})()
    loader = ResidentLoader(split, range(images), 4, transform=lambda x: x, drop_last=drop_last, prefetch=0)
    out = [x.tolist() for x, _ in loader]
    assert len(loader) == len(out) == batches
    assert sum(out, []) == list(range(batches * 4 if drop_last else images))


def test_a_resident_loader_finishes_ahead_only_training_batches_and_only_when_told(monkeypatch):
    """Training batches (with ``draw_many``) are finished ahead by ``default_prefetch`` of the device (a thread, from
    one batch ahead on); evaluation batches are made when asked for; ``_index_batches`` ends at the last index."""
    import itertools
    import tcnn.data.resident as resident
    from tcnn.data.prefetch import FinishedAhead
    monkeypatch.setattr(resident, 'default_prefetch', lambda device: 3)  # as on a GPU
    split = type('Split', (), {'device': torch.device('cpu'),
                               'gather': staticmethod(lambda idx: (torch.tensor(idx), torch.tensor(idx)))})()
    assert ResidentLoader(split, range(4), 2, transform=lambda x: x).prefetch == 0
    assert ResidentLoader(split, range(4), 2, transform=lambda x, p: x, draw_many=lambda r: None).prefetch == 3
    for prefetch, ahead in ((0, False), (1, True)):
        loader = ResidentLoader(split, range(5), 2, transform=lambda x: x, prefetch=prefetch)
        batches = iter(loader)
        assert isinstance(batches, FinishedAhead) == ahead
        assert [x.tolist() for x, _ in itertools.islice(batches, 4)] == [[0, 1], [2, 3], [4]]  # and no more
    for drop_last, expected in ((False, [[0, 1], [2, 3], [4]]), (True, [[0, 1], [2, 3]])):
        loader = ResidentLoader(split, range(5), 2, transform=lambda x: x, drop_last=drop_last, prefetch=0)
        assert list(itertools.islice(loader._index_batches(iter(range(5))), 6)) == expected


def test_a_resident_training_split_without_a_seed_draws_as_seed_0(tmp_path):
    """A split whose ``augment_seed`` was never set (a dataset used outside ``tcnn train``) draws each sample's
    parameters from seed 0, as the PIL pipeline's ``ImageFolderDataset`` does."""
    root = make_image_folder(str(tmp_path / 'data'), num_classes=2, train_per_class=3, val_per_class=1, size=24)
    dataset = open_dataset(root, 'train')
    split = ResidentSplit(dataset, 'cpu')
    drawn = []

    def draw_many(rngs_and_sizes):
        drawn.append([rng.random() for rng, _ in rngs_and_sizes])
        return None

    for seed in (None, 0, 1):
        dataset.augment_seed = seed
        list(ResidentLoader(split, range(6), 3, transform=lambda x, p: x, draw_many=draw_many, prefetch=0))
    assert drawn[0:2] == drawn[2:4] and drawn[4:6] != drawn[0:2]


def test_a_resident_split_decodes_in_its_workers_onto_its_device_and_says_what_it_holds(tmp_path, monkeypatch):
    """The one decoding pass runs in ``workers`` loader processes (none by default); the pixels and labels go to the
    split's device (the meta device here: a CPU tensor left behind shows); the log line names the image count, the
    folder, the device and the decoded size in MiB (uint8 RGB: 3 bytes a pixel)."""
    import tcnn.data.resident as resident
    root = make_image_folder(str(tmp_path / 'data'), num_classes=2, train_per_class=8, val_per_class=1, size=256)
    dataset = open_dataset(root, 'train')
    workers = []
    data_loader = resident.DataLoader
    monkeypatch.setattr(resident, 'DataLoader', lambda *a, **k: (workers.append(k['num_workers']),
                                                                 data_loader(*a, **k))[1])
    logged = []
    split = ResidentSplit(dataset, 'cpu', log=logged.append)
    assert split.nbytes == 16 * 256 * 256 * 3 == 3 * 2 ** 20
    assert logged == [f'decoded 16 images of {dataset.root} into memory on cpu (3 MiB)']
    ResidentSplit(dataset, 'cpu', workers=2)
    assert workers == [0, 2]
    stacked = ResidentSplit(dataset, 'meta')  # 256 px images: one (16, 3, 256, 256) tensor
    read = dataset.read_decoded
    dataset.read_decoded = lambda i, prepare: read(i, lambda img: img.resize((200 + 8 * i,) * 2))
    listed = ResidentSplit(dataset, 'meta')  # sizes differ: one tensor per image
    assert stacked.stacked.shape == (16, 3, 256, 256) and listed.stacked is None and len(listed.images) == 16
    for split in (stacked, listed):
        held = [split.stacked] if split.stacked is not None else split.images
        assert all(t.device.type == 'meta' for t in [*held, split.targets]) and split.targets.dtype == torch.long


def test_a_resident_normalizer_takes_a_list_of_images_as_their_stack():
    """An evaluation batch of one image size comes as a tensor; of several sizes cropped alike, as a list."""
    normalize = ResidentSplit.normalizer(create_transform(8, is_training=False))
    images = [torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(i))
              for i in range(3)]
    assert torch.equal(normalize(images), normalize(torch.stack(images)))

def test_a_jpeg_padded_with_zero_bytes_after_its_end_marker_goes_to_the_batch_decoder():
    buf = io.BytesIO()
    Image.new('RGB', (6, 4), (10, 200, 30)).save(buf, format='JPEG')
    data = buf.getvalue()
    # some cameras and encoders pad the file after its end marker; it is still whole
    assert jpeg_size(data + b'\x00' * 7) == jpeg_size(data) == (4, 6)
    # other bytes after the end marker (trailing garbage) or none at all: Pillow's path judges the file
    assert jpeg_size(data + b' \n') is None and jpeg_size(data + b'XX') is None
    assert jpeg_size(data[:-2] + b'\x00\x00') is None


class _Split:
    """A map-style split as the batched pipeline reads it: sample i is (name, payload, (h, w), label)."""

    def __init__(self, augment_seed, epoch=3):
        self.augment_seed, self.epoch = augment_seed, epoch

    def __len__(self):
        return 4

    def read_encoded(self, index):
        return f'{index}.jpg', torch.tensor([index], dtype=torch.uint8), (10 + index, 20), index % 2


def test_an_encoded_sample_draws_its_parameters_from_seed_epoch_and_index_alone():
    from tcnn.data.folders import sample_seed

    def draw(rng, size):
        return {'u': torch.tensor([rng.random(), float(size[0])])}
    for seed in (None, 0, 7):
        name, payload, params, target = EncodedDataset(_Split(seed), draw)[2]
        expected = draw(random.Random(sample_seed(seed or 0, 3, 2)), (12, 20))  # no seed: seed 0
        assert (name, payload.tolist(), target) == ('2.jpg', [2], 0) and params['u'].equal(expected['u'])
    assert EncodedDataset(_Split(None), draw)[1][2]['u'].tolist() != EncodedDataset(_Split(1), draw)[1][2]['u'].tolist()
    # evaluation draws nothing: an empty dict, which a batch of one collates to no parameters
    sample = EncodedDataset(_Split(None))[1]
    assert sample[2] == {}
    batch = collate_encoded([sample])
    assert batch.params == {} and batch.names == ['1.jpg'] and batch.targets.tolist() == [1]
    assert batch.targets.dtype == torch.long


def test_the_torchvision_decoder_decodes_on_the_device_asked_and_silences_only_torchvisions_notices(monkeypatch):
    import warnings
    import torchvision.io
    from tcnn.data import decode
    calls = []

    def decode_jpeg(encoded, mode, device='cpu'):
        calls.append((len(encoded), mode, device))
        warnings.warn('prefer TorchCodec', UserWarning)
        warnings.warn('decode_jpeg is deprecated', DeprecationWarning)
        warnings.warn('corrupt data: 3 extraneous bytes', RuntimeWarning)
        return [torch.zeros(3, 1, 1) for _ in encoded]
    monkeypatch.setattr(torchvision.io, 'decode_jpeg', decode_jpeg)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter('always')
        images = decode._torchvision_decoder()([torch.zeros(2, dtype=torch.uint8)] * 2, torch.device('meta'))
    assert len(images) == 2 and calls == [(2, torchvision.io.ImageReadMode.RGB, torch.device('meta'))]
    assert [(w.category, str(w.message)) for w in seen] == [(RuntimeWarning, 'corrupt data: 3 extraneous bytes')]


def test_the_torchcodec_decoder_gives_torchvisions_rgb_pixels_on_the_device_asked(monkeypatch):
    """TorchCodec's ``decode_jpeg``, the batch decoder where torchvision's is gone (torchvision >= 0.29 deprecates its
    own): colour and greyscale JPEGs come out as RGB, pixel for pixel what torchvision decodes, and the device asked
    reaches TorchCodec (a device CPU tests cannot decode on: seen on its way in)."""
    try:
        import torchcodec.decoders
    except Exception as e:  # noqa: BLE001 - its native library is built for one torch: it fails to load on others
        pytest.skip(f'torchcodec does not load beside torch {torch.__version__}: {type(e).__name__}: {e}')
    from torchvision.io import ImageReadMode
    from torchvision.io import decode_jpeg as torchvision_decode_jpeg
    from tcnn.data import decode
    photo = _photo(20, 30)
    encoded = [_tensor(_jpeg(photo, quality=90)), _tensor(_jpeg(photo.convert('L')))]
    images = decode._torchcodec_decoder()(encoded, torch.device('cpu'))
    assert [tuple(img.shape) for img in images] == [(3, 20, 30)] * 2 and images[0].dtype == torch.uint8
    for img, e in zip(images, encoded):
        assert torch.equal(img, torchvision_decode_jpeg(e, mode=ImageReadMode.RGB))
    seen = []
    real = torchcodec.decoders.decode_jpeg

    def on_the_cpu(source, *, device, **kwargs):
        seen.append(device)
        return real(source, device='cpu', **kwargs)
    monkeypatch.setattr(torchcodec.decoders, 'decode_jpeg', on_the_cpu)
    images = decode._torchcodec_decoder()(encoded, torch.device('cuda', 1))
    assert seen == ['cuda:1', 'cuda:1'] and [tuple(img.shape) for img in images] == [(3, 20, 30)] * 2


def test_the_batch_decoder_is_torchvisions_else_torchcodecs_else_a_one_line_import_error(monkeypatch):
    from tcnn.data import decode
    monkeypatch.setattr(decode, '_DECODER', None)
    assert decode.decoder_name() == 'torchvision'
    fake = object()
    monkeypatch.setattr(decode, '_DECODER', None)
    monkeypatch.setattr(decode, '_torchvision_decoder', lambda: None)
    monkeypatch.setattr(decode, '_torchcodec_decoder', lambda: fake)
    assert decode.decoder_name() == 'torchcodec' and decode._decoder()[1] is fake
    monkeypatch.setattr(decode, '_DECODER', None)
    monkeypatch.setattr(decode, '_torchcodec_decoder', lambda: None)
    with pytest.raises(ImportError) as info:
        decode.decoder_name()
    assert str(info.value) == 'decoding JPEGs in batches needs torchvision.io.decode_jpeg or torchcodec'


def test_pixels_decoded_already_and_the_labels_go_to_the_batchs_device():
    pixels = torch.full((3, 2, 2), 7, dtype=torch.uint8)
    images, failed = decode_batch([pixels], torch.device('meta'))
    assert images[0].device.type == 'meta' and images[0].shape == (3, 2, 2) and failed == []
    seen = []

    def evaluate(images, *params):
        seen.append(params)
        return torch.zeros(len(images), 3, 2, 2, device='meta')
    finish = BatchFinisher(evaluate, torch.device('meta'), report_bad=None, train=False)
    batch = EncodedBatch(names=['a.png'], payloads=[pixels], params={}, targets=torch.tensor([4]))
    out, targets = finish(batch)
    assert seen == [()] and out.device.type == 'meta' and targets.device.type == 'meta'  # evaluation: no params
    finish = BatchFinisher(evaluate, torch.device('meta'), report_bad=None, train=True)
    finish(dataclasses.replace(batch, params={'flip': torch.tensor([1.])}))
    assert list(seen[1][0]) == ['flip']


# ---------------------------------------------------------------------- will a split fit: its size, the budget


class _Files:
    """A split of image files whose headers the estimate reads, recording which it opened."""

    def __init__(self, paths):
        self.paths, self.opened = paths, []

    def __len__(self):
        return len(self.paths)

    def filename(self, i):
        self.opened.append(i)
        return self.paths[i]


def test_a_splits_decoded_size_is_estimated_from_headers_spread_over_it(tmp_path):
    sizes = [(10 + i, 20 + 2 * i) for i in range(10)]
    paths = []
    for i, (w, h) in enumerate(sizes):
        paths.append(str(tmp_path / f'{i}.png'))
        Image.new('RGB', (w, h)).save(paths[-1])
    split = _Files(paths)
    picked = [0, 3, 6, 9]  # 4 of 10, evenly spread, both ends included
    mean = sum(sizes[i][0] * sizes[i][1] for i in picked) / 4
    assert estimate_decoded_bytes(split, sample=4) == math.ceil(mean * 3 * 10) and split.opened == picked
    split.opened.clear()
    assert estimate_decoded_bytes(split, sample=64) == math.ceil(sum(w * h for w, h in sizes) / 10 * 3 * 10)
    assert split.opened == list(range(10))
    assert estimate_decoded_bytes(_Files(paths[:1]), sample=1) == sizes[0][0] * sizes[0][1] * 3
    # a sample that is no readable file counts as the mean of the others, and the reading goes on after it
    broken = list(paths)
    broken[3] = str(tmp_path / 'missing.png')
    mean = sum(sizes[i][0] * sizes[i][1] for i in (0, 6, 9)) / 3
    assert estimate_decoded_bytes(_Files(broken), sample=4) == math.ceil(mean * 3 * 10)
    assert estimate_decoded_bytes(_Files([str(tmp_path / 'missing.png')] * 3)) is None
    # by default 64 headers, spread over a larger split from its first file to its last
    two = _Files(paths)
    estimate_decoded_bytes(two, sample=2)
    assert two.opened == [0, 9]  # two headers: the first file's and the last's
    large = _Files(paths * 10)
    estimate_decoded_bytes(large)
    assert large.opened == sorted({round(i * 99 / 63) for i in range(64)}) and len(large.opened) == 64


def test_the_memory_budget_is_a_share_of_available_memory_divided_between_the_local_processes(monkeypatch):
    from tcnn.data.resident import memory_budget
    monkeypatch.setattr(os, 'sysconf', lambda name: {'SC_AVPHYS_PAGES': 1000, 'SC_PAGE_SIZE': 4096}[name])
    assert memory_budget(torch.device('cpu'), 0.5) == 2_048_000
    assert memory_budget(torch.device('cpu'), 0.5, local_processes=4) == 512_000
    assert memory_budget(torch.device('cpu'), 0.5, local_processes=0) == 2_048_000
    asked = []
    monkeypatch.setattr(torch.cuda, 'get_device_properties',
                        lambda device: asked.append(device) or type('P', (), {'total_memory': 80 * 2 ** 30})())
    assert memory_budget(torch.device('cuda', 1), 0.25, local_processes=2) == 10 * 2 ** 30
    assert asked == [torch.device('cuda', 1)]  # the device's own GPU, not the current one

    def no_sysconf(name):
        raise ValueError(name)
    monkeypatch.setattr(os, 'sysconf', no_sysconf)
    assert memory_budget(torch.device('cpu'), 0.5) == 0  # unknown: nothing is kept resident


def test_a_device_loader_finishes_ahead_in_a_thread_only_when_asked_or_on_a_gpu():
    from tcnn.data.prefetch import FinishedAhead

    class Finish:
        def __init__(self, device):
            self.device = torch.device(device)

        def __call__(self, batch):
            return torch.tensor([batch]), torch.tensor([batch % 2])
    batches = [3, 4, 5]
    assert DeviceLoader(batches, Finish('cpu')).prefetch == 0  # the step takes every core: none ahead
    assert DeviceLoader(batches, Finish('cuda')).prefetch == 2
    assert DeviceLoader(batches, None).prefetch == 0
    assert list(iter(DeviceLoader(batches, None))) == batches  # the workers finished them
    # the batched pipeline's own finisher holds the device it is given by name as a device
    gpu = BatchFinisher(lambda images: images, 'cuda:1', print, train=False)
    assert gpu.device == torch.device('cuda', 1) and DeviceLoader(batches, gpu).prefetch == 2
    now, ahead = DeviceLoader(batches, Finish('cpu'), prefetch=0), DeviceLoader(batches, Finish('cpu'), prefetch=1)
    assert not isinstance(iter(now), FinishedAhead) and isinstance(iter(ahead), FinishedAhead)
    assert [x.item() for x, _ in now] == [x.item() for x, _ in ahead] == batches
