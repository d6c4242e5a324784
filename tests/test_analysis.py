"""tcnn.analysis (heads, figures), tcnn.evaluation.plots and `tcnn inspect` / `tcnn plot`: summaries, attention maps,
nonlocality, figures."""
import itertools
import json
import math
import os

import numpy as np
import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

import tcnn
from tcnn.analysis import figures, heads
from tcnn.evaluation import plots
from tcnn.data.config import data_config
from tcnn.data.images import denormalize, find_images, sample_images
from tcnn.cli import main
from tcnn.errors import TcnnError
from tcnn.layers.gpsa import GPSA

from nontrivial import varied_heads

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


@pytest.fixture(scope='module')
def t_cnn() -> nn.Module:
    """resnet18d T-CNN (4 GPSA layers, the first with stride 2) with distinct per-head parameters."""
    torch.manual_seed(0)
    return varied_heads(tcnn.reparameterize(timm.create_model('resnet18d', num_classes=5), verify=False).eval())


def _assert_png(path) -> None:
    data = open(path, 'rb').read()
    assert data[:8] == PNG_MAGIC and len(data) > 5000, path


def _taps(kernel: int, dilation: int):
    """Tap offsets (row, col) of a k x k kernel, row-major, relative to the centre tap."""
    c = (kernel - 1) // 2
    return [(dilation * (ky - c), dilation * (kx - c)) for ky, kx in itertools.product(range(kernel), repeat=2)]


def test_summary_values_equal_the_parameters(t_cnn):
    x = torch.randn(2, 3, 64, 64)
    summary = heads.summarize(t_cnn, x)
    layers = tcnn.gpsa_layers(t_cnn)
    assert list(summary['layers']) == [n for n, _ in layers] and summary['num_images'] == 2
    assert summary['config'] == t_cnn.tcnn_config
    for name, layer in layers:
        entry = summary['layers'][name]
        gate = torch.sigmoid(layer.gating.detach())
        alpha = F.softplus(layer.pos_locality.detach(), beta=5)
        assert entry['gate'] == pytest.approx(gate.tolist(), rel=1e-6)
        assert entry['alpha'] == pytest.approx(alpha.tolist(), rel=1e-6)
        assert entry['span'] == pytest.approx((1 / alpha).tolist(), rel=1e-6)
        torch.testing.assert_close(torch.tensor(entry['center']), layer.pos_centers.detach())
        assert entry['gate_mean'] == pytest.approx(gate.mean().item(), rel=1e-6)
        assert len(entry['nonlocality']) == layer.num_heads
        assert entry['nonlocality_mean'] == pytest.approx(float(np.mean(entry['nonlocality'])), rel=1e-6)
    json.dumps(summary)  # plain values only
    assert all(v['nonlocality'] is None for v in heads.summarize(t_cnn)['layers'].values())


@pytest.mark.parametrize('query', [None, (0, 0), (63, 95), (40, 10)])
def test_exact_configuration_attention_is_one_hot_on_the_taps(t_cnn, query):
    x = torch.randn(2, 3, 64, 96)  # non-square; layer4 sees 4 x 6 (stride-2 conv) then 2 x 3
    with tcnn.exact_configuration(t_cnn):
        maps = heads.attention_maps(t_cnn, x, query=query)
    assert list(maps) == [n for n, _ in tcnn.gpsa_layers(t_cnn)]
    for name, m in maps.items():
        layer = t_cnn.get_submodule(name)
        taps = _taps(3, 1)
        stride = layer.stride[0]
        qy, qx = (32, 48) if query is None else query
        assert m.query == (int(qy * m.out_size[0] / 64), int(qx * m.out_size[1] / 96))
        assert m.query_key == (stride * m.query[0] + 1, stride * m.query[1] + 1)  # padded coordinates, anchor 1
        for part in ('mixed', 'positional'):
            for b in range(2):
                att = m.part(part, b)
                for h, (dy, dx) in enumerate(taps):
                    expect = torch.zeros(m.key_size)
                    expect[m.query_key[0] + dy, m.query_key[1] + dx] = 1
                    torch.testing.assert_close(att[h], expect, atol=1e-5, rtol=0)
        assert m.content.shape == m.mixed.shape == (2, 9, *m.key_size)
        torch.testing.assert_close(m.content.sum(dim=(-1, -2)), torch.ones(2, 9))
        assert torch.all(m.gate == 1)


def test_attention_maps_follow_dilation_and_the_gate():
    torch.manual_seed(0)
    conv = nn.Conv2d(6, 6, 3, padding=2, dilation=2)
    model = nn.Sequential(nn.Conv2d(3, 6, 1), GPSA.from_conv(conv, locality_strength=1.0, gating_init=0.3))
    x = torch.randn(1, 3, 9, 7)
    maps = heads.attention_maps(model, x, query=(4, 3))['1']
    assert maps.query == (4, 3) and maps.query_key == (6, 5) and maps.key_size == (13, 11)
    gate = torch.sigmoid(torch.tensor(0.3))
    torch.testing.assert_close(maps.mixed, (1 - gate) * maps.content + gate * maps.positional[None])
    with tcnn.exact_configuration(model):
        exact = heads.attention_maps(model, x, query=(4, 3))['1']
    for h, (dy, dx) in enumerate(_taps(3, 2)):
        assert exact.mixed[0, h, 6 + dy, 5 + dx] > 1 - 1e-5


def test_nonlocality_of_the_exact_configuration_is_the_mean_tap_distance(t_cnn):
    x = torch.randn(3, 3, 64, 64)
    with tcnn.exact_configuration(t_cnn):
        nl = heads.nonlocality(t_cnn, x)
    distances = [math.hypot(dy, dx) for dy, dx in _taps(3, 1)]
    for name, entry in nl.items():
        assert entry['mixed'] == pytest.approx(distances, abs=1e-5)
        assert entry['positional'] == pytest.approx(distances, abs=1e-5)
        assert entry['mean'] == pytest.approx(sum(distances) / 9, abs=1e-5)
        assert entry['num_images'] == 3
    # dilation 2 doubles every distance
    model = nn.Sequential(nn.Conv2d(3, 6, 1), GPSA.from_conv(nn.Conv2d(6, 6, 3, padding=2, dilation=2)))
    with tcnn.exact_configuration(model):
        nl2 = heads.nonlocality(model, torch.randn(1, 3, 8, 10))['1']
    assert nl2['mean'] == pytest.approx(2 * sum(distances) / 9, abs=1e-5)


def test_nonlocality_matches_eq8_by_brute_force(t_cnn):
    x = torch.randn(2, 3, 64, 64)
    nl = heads.nonlocality(t_cnn, [(x[:1], 0), (x[1:], 1)])  # a DataLoader-like iterable of (images, labels)
    inputs = heads.capture_gpsa_inputs(t_cnn, x)
    name = 'layer4.0.conv1'  # the stride-2 layer: queries at padded coordinates (2i + 1, 2j + 1)
    layer = t_cnn.get_submodule(name)
    att = layer.attention(inputs[name])['mixed']  # (B, N_h, N_q, N_k)
    (h_out, w_out), (h_k, w_k) = layer.output_size(4, 4), (6, 6)
    expect = torch.zeros(9)
    for b, h in itertools.product(range(2), range(9)):
        total = 0.0
        for (i, j), (r, c) in itertools.product(itertools.product(range(h_out), range(w_out)),
                                                itertools.product(range(h_k), range(w_k))):
            total += att[b, h, i * w_out + j, r * w_k + c].item() * math.hypot(r - (2 * i + 1), c - (2 * j + 1))
        expect[h] += total / (h_out * w_out) / 2
    assert nl[name]['mixed'] == pytest.approx(expect.tolist(), rel=1e-4)
    assert nl[name]['num_images'] == 2


def _brute_force_layer(att: torch.Tensor, layer: GPSA, in_size, image_size) -> dict:
    """Per head, by loops over images, queries and keys: nonlocality over the padded keys and over the real keys
    (each query's attention renormalised over them), the share of attention on padded keys, and the real-key
    nonlocality in input pixels and as a fraction of the image diagonal."""
    (h_in, w_in), (hi, wi) = in_size, image_size
    (ph, pw), (sy, sx), (ay, ax) = layer.padding, layer.stride, layer.anchor
    h_out, w_out = layer.output_size(h_in, w_in)
    h_k, w_k = h_in + 2 * ph, w_in + 2 * pw
    ty, tx = hi / h_in, wi / w_in  # input pixels per token
    n_img, n_h = att.shape[0], att.shape[1]
    out = {k: np.zeros(n_h) for k in ('padded', 'real', 'share', 'real_px', 'real_fraction')}
    for b, h in itertools.product(range(n_img), range(n_h)):
        for i, j in itertools.product(range(h_out), range(w_out)):
            qy, qx = sy * i + ay, sx * j + ax
            acc = dict.fromkeys(('padded', 'real_w', 'real_mass', 'pad_mass', 'real_px'), 0.0)
            for r, c in itertools.product(range(h_k), range(w_k)):
                a = att[b, h, i * w_out + j, r * w_k + c].item()
                d = math.hypot(r - qy, c - qx)
                acc['padded'] += a * d
                if ph <= r < ph + h_in and pw <= c < pw + w_in:
                    acc['real_w'] += a * d
                    acc['real_mass'] += a
                    acc['real_px'] += a * math.hypot((r - qy) * ty, (c - qx) * tx)
                else:
                    acc['pad_mass'] += a
            n = n_img * h_out * w_out
            out['padded'][h] += acc['padded'] / n
            out['real'][h] += acc['real_w'] / acc['real_mass'] / n
            out['share'][h] += acc['pad_mass'] / n
            out['real_px'][h] += acc['real_px'] / acc['real_mass'] / n
    out['real_fraction'] = out['real_px'] / math.hypot(hi, wi)
    return out


@pytest.mark.parametrize('name', ['layer4.0.conv1', 'layer4.1.conv2'])
def test_padding_share_and_real_key_nonlocality_match_a_brute_force(t_cnn, name):
    x = torch.randn(2, 3, 64, 80)  # non-square: the stride-2 layer sees 4 x 5 (padded 6 x 7), the next 2 x 3
    nl = heads.nonlocality(t_cnn, [x[:1], x[1:]])[name]
    layer = t_cnn.get_submodule(name)
    feats = heads.capture_gpsa_inputs(t_cnn, x)[name]
    for part in heads.ATTENTION_PARTS:
        att = layer.attention(feats)[part]
        att = att if att.ndim == 4 else att[None].expand(2, -1, -1, -1)
        expect = _brute_force_layer(att, layer, feats.shape[-2:], x.shape[-2:])
        assert nl[part] == pytest.approx(expect['padded'].tolist(), rel=1e-4)  # ConViT eq. 8, padded keys
        assert nl['real'][part] == pytest.approx(expect['real'].tolist(), rel=1e-4)
        assert nl['padding_share'][part] == pytest.approx(expect['share'].tolist(), rel=1e-4, abs=1e-7)
        if part == 'mixed':
            assert nl['real_px'] == pytest.approx(expect['real_px'].tolist(), rel=1e-4)
            assert nl['real_image_fraction'] == pytest.approx(expect['real_fraction'].tolist(), rel=1e-4)
        assert max(expect['share']) > 0.05  # attention does land on the padding at this size
    assert nl['grid'] == list(feats.shape[-2:]) and nl['image'] == [64, 80]
    assert nl['real_mean'] == pytest.approx(float(np.mean(nl['real']['mixed'])), rel=1e-6)
    assert nl['padding_share_mean'] == pytest.approx(float(np.mean(nl['padding_share']['mixed'])), rel=1e-6)
    summary = heads.summarize(t_cnn, x)['layers'][name]
    assert summary['nonlocality_real'] == pytest.approx(nl['real']['mixed'], rel=1e-6)
    assert summary['padding_share'] == pytest.approx(nl['padding_share']['mixed'], rel=1e-6)


def test_sigma_is_the_width_of_the_positional_gaussian():
    # the positional logits are -alpha |delta - Delta|^2 (tokens): along each axis a Gaussian of variance 1/(2 alpha)
    # (sampled on the integer grid: its standard deviation equals sigma to 1e-4 for sigma >= 1, 0.1% at alpha = 1)
    conv = nn.Conv2d(4, 4, 3, padding=1)
    model = nn.Sequential(nn.Conv2d(3, 4, 1), GPSA.from_conv(conv))
    layer = model[1]
    alphas = torch.tensor([0.05, 0.1, 0.2, 0.5, 0.08, 0.4, 0.3, 0.12, 0.06])
    layer.set_locality_strength(alphas)
    size = 61
    pos = layer.positional_attention(size, size, torch.device('cpu'))  # (N_h, N_q, N_k), keys padded to 63 x 63
    q = (size // 2) * size + size // 2  # the centre query, far from every border
    rows = torch.arange(size + 2, dtype=torch.float64)[:, None].expand(size + 2, size + 2).flatten()
    summary = heads.summarize(model)['layers']['1']
    for h in range(9):
        a = pos[h, q].double()
        mean = (a * rows).sum()
        sigma = math.sqrt((a * (rows - mean) ** 2).sum().item())
        assert summary['sigma'][h] == pytest.approx(sigma, rel=1e-4)
        assert summary['sigma'][h] == pytest.approx(1 / math.sqrt(2 * alphas[h].item()), rel=1e-5)
        assert summary['span'][h] == pytest.approx(1 / alphas[h].item(), rel=1e-5)
    assert summary['sigma_mean'] == pytest.approx(float(np.mean(summary['sigma'])), rel=1e-6)


def test_inspect_images_dir_takes_a_seeded_sample_across_class_folders(t_cnn, tmp_path, capsys):
    path = tcnn.save(t_cnn, str(tmp_path / 't.pt'), data_config={'input_size': (3, 32, 32), 'crop_pct': 1.0})
    rng = np.random.default_rng(0)
    for c in range(12):  # an ImageNet val layout in miniature: class folders in sorted order, 5 images each
        os.makedirs(tmp_path / 'val' / f'n{c:08d}')
        for k in range(5):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(
                tmp_path / 'val' / f'n{c:08d}' / f'ILSVRC_{c * 5 + k:04d}.png')

    def sample(*flags):
        out = tmp_path / f'out{len(list(tmp_path.glob("out*")))}'
        assert main(['inspect', path, '--images-dir', str(tmp_path / 'val'), '--max-images', '6', *flags,
                     '--out', str(out)]) == 0
        summary = json.loads((out / 'summary.json').read_text())
        return summary, capsys.readouterr().out

    summary, printed = sample()
    classes = [os.path.basename(os.path.dirname(p)) for p in summary['images']]
    assert len(summary['images']) == 6 and len(set(classes)) == 6  # 6 classes, not the first 2 folders
    assert summary['sample'] == {'images_dir': str(tmp_path / 'val'), 'seed': 0, 'max_images': 6, 'found': 60,
                                 'classes': 12, 'classes_sampled': 6}
    assert 'seed 0' in printed and '6 of 60 images' in printed
    assert sample()[0]['images'] == summary['images']  # the seed fixes the sample
    other, printed = sample('--seed', '1')
    assert other['images'] != summary['images'] and other['sample']['seed'] == 1 and 'seed 1' in printed
    # balanced: 24 images of 12 classes are 2 per class
    picked = sample_images(str(tmp_path / 'val'), 24, seed=3)
    counts = {}
    for p in picked:
        counts[os.path.dirname(p)] = counts.get(os.path.dirname(p), 0) + 1
    assert sorted(counts.values()) == [2] * 12 and picked == sorted(picked)
    assert sample_images(str(tmp_path / 'val'), 100, seed=0) == find_images(str(tmp_path / 'val'))


def test_query_cell_maps_a_pixel_to_its_grid_cell_and_refuses_one_outside():
    assert heads.query_cell(None, (224, 224), (7, 7)) == (3, 3)
    assert heads.query_cell((223, 0), (224, 224), (7, 7)) == (6, 0)
    with pytest.raises(TcnnError, match='outside'):
        heads.query_cell((300, 0), (224, 224), (7, 7))
    with pytest.raises(TcnnError, match='no GPSA layer'):
        heads.summarize(timm.create_model('resnet18d', num_classes=3))


def test_figures_are_written(t_cnn, tmp_path):
    x = torch.randn(2, 3, 64, 64)
    summary = heads.summarize(t_cnn, x)
    _assert_png(figures.plot_summary(summary, str(tmp_path / 'heads.png')))
    maps = heads.attention_maps(t_cnn, x)
    cfg = data_config(t_cnn)
    path = figures.plot_attention(maps, denormalize(x[1], cfg), str(tmp_path / 'sub' / 'att.png'), index=1)
    _assert_png(path)
    img = Image.open(path)
    assert img.height > img.width  # 12 rows (3 parts x 4 layers) of 9 heads
    assert not [f for f in os.listdir(tmp_path / 'sub') if f.startswith('.tmp')]


def _metrics(layers, epochs: int, resumed_at: int = None):
    records = []
    for e in range(epochs):
        gpsa = {}
        for k, name in enumerate(layers):
            gate = [1 / (1 + math.exp(-(1 - 0.3 * e * (h % 3)))) for h in range(9)]
            span = [1 + 0.1 * e * (h + k) for h in range(9)]
            gpsa[name] = {'gate': gate, 'span': span, 'alpha': [1 / s for s in span], 'gate_mean': np.mean(gate),
                          'span_mean': np.mean(span)}
        records.append({'epoch': e, 'lr': 1e-4, 'gating_lr': 0.1, 'train_loss': 2.0 - 0.1 * e,
                        'train_top1': 40.0 + e, 'val_loss': 1.5, 'val_top1': 50.0 + 2 * e, 'val_top5': 80.0,
                        'img_per_s': 10.0, 'epoch_time_s': 1.0, 'gpsa': gpsa})
    if resumed_at is not None:  # a resumed run logs the epochs after its checkpoint again
        records += [dict(r, val_top1=r['val_top1'] + 100) for r in records[resumed_at:]]
    return records


def test_plot_command_draws_training_curves(tmp_path, capsys):
    run = tmp_path / 'run'
    run.mkdir()
    lines = [json.dumps(r) for r in _metrics(['layer4.0.conv2', 'layer4.1.conv2'], 6, resumed_at=4)]
    (run / 'metrics.jsonl').write_text('\n'.join(lines) + '\n{"epoch": 6, "val_to')  # a line being written
    records = plots.load_metrics(str(run))
    assert [r['epoch'] for r in records] == list(range(6))
    assert [r['val_top1'] for r in records][-2:] == [158.0, 160.0]  # the last record of an epoch wins
    assert main(['plot', str(run)]) == 0
    _assert_png(run / 'curves.png')
    assert 'best val top-1 160.00 (epoch 6)' in capsys.readouterr().out
    # the no-SA baseline logs no GPSA layers: accuracy only
    base = tmp_path / 'baseline'
    base.mkdir()
    (base / 'metrics.jsonl').write_text('\n'.join(json.dumps(r) for r in _metrics([], 3)) + '\n')
    assert main(['plot', str(base / 'metrics.jsonl'), '--out', str(tmp_path / 'b.png')]) == 0
    _assert_png(tmp_path / 'b.png')
    (base / 'metrics.jsonl').write_text('{"epoch": 0}\nnot json\n{"epoch": 1}\n')
    with pytest.raises(TcnnError, match='line 2'):
        plots.load_metrics(str(base))
    assert main(['plot', str(tmp_path / 'nowhere')]) == 2
    assert 'no metrics file' in capsys.readouterr().err
    (base / 'best.pt').write_bytes(b'PK\x03\x04 a checkpoint')
    for args, message in (([str(base / 'best.pt')], 'tcnn plot takes the run folder'),
                          ([str(base), '--out', str(tmp_path / 'fig.xyz')], 'extension must be one of .png, .pdf'),
                          ([str(base), '--out', str(base / 'best.pt' / 'fig.png')], 'is a file, so')):
        assert main(['plot', *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_inspect_writes_the_summary_and_figures_of_the_images_it_is_given(t_cnn, tmp_path, capsys):
    path = tcnn.save(t_cnn, str(tmp_path / 't.pt'), data_config={'input_size': (3, 64, 64), 'crop_pct': 1.0})
    images = []
    rng = np.random.default_rng(0)
    for k in range(3):
        images.append(str(tmp_path / 'imgs' / f'img{k}.png'))
        os.makedirs(os.path.dirname(images[-1]), exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (80, 70, 3), dtype=np.uint8)).save(images[-1])
    out = tmp_path / 'out'
    rc = main(['inspect', path, '--image', images[1], '--images-dir', str(tmp_path / 'imgs'), '--query', '10,50',
               '--out', str(out)])
    assert rc == 0
    summary = json.loads((out / 'summary.json').read_text())
    assert summary['num_images'] == 3 and summary['images'] == [images[1], images[0], images[2]]
    assert summary['data_config']['input_size'] == [3, 64, 64]
    expected = tcnn.gpsa_summary(t_cnn)
    for name, entry in expected.items():
        assert summary['layers'][name]['gate'] == pytest.approx(entry['gate'], rel=1e-6)
        assert summary['layers'][name]['span'] == pytest.approx(entry['span'], rel=1e-6)
        assert len(summary['layers'][name]['nonlocality']) == 9
    for f in ('heads.png', 'attention_img1.png'):
        _assert_png(out / f)
    assert not (out / 'attention_img0.png').exists()  # --images-dir images count for the nonlocality only
    assert 'layer4.1.conv2' in capsys.readouterr().out
    # --img-size takes what it takes in every command: N or HxW
    assert main(['inspect', path, '--image', images[1], '--img-size', '64x48', '--out', str(tmp_path / 'hw')]) == 0
    summary = json.loads((tmp_path / 'hw' / 'summary.json').read_text())
    assert summary['data_config']['input_size'] == [3, 64, 48] and summary['layers']['layer4.1.conv2']['grid'] == [2, 2]
    # a plain CNN has nothing to inspect; a bad query is a one-line error
    plain = tcnn.save(timm.create_model('resnet18d', num_classes=3), str(tmp_path / 'cnn.pt'))
    assert main(['inspect', plain, '--out', str(out)]) == 2
    assert 'no GPSA layer' in capsys.readouterr().err
    assert main(['inspect', path, '--image', images[0], '--query', '999,1', '--out', str(out)]) == 2
    assert 'outside' in capsys.readouterr().err
    fresh = tmp_path / 'fresh' / 'out'  # a bad query fails before anything is written, and leaves no folder
    assert main(['inspect', path, '--image', images[0], '--query', '999,1', '--out', str(fresh)]) == 2
    assert 'outside' in capsys.readouterr().err and not (tmp_path / 'fresh').exists()


def test_figures_of_many_headed_layers_stay_readable(tmp_path):
    # a 7x7 depthwise stage (49 heads per layer): heat charts stacked, attention maps laid out as the kernel
    torch.manual_seed(0)
    model = tcnn.reparameterize(timm.create_model('convnext_atto', num_classes=3), stages=['stages.3']).eval()
    x = torch.randn(1, 3, 64, 64)
    summary = heads.summarize(model, x)
    heads_path = figures.plot_summary(summary, str(tmp_path / 'heads.png'))
    maps = heads.attention_maps(model, x)
    assert {m.kernel_size for m in maps.values()} == {(2, 2), (7, 7)}  # the downsample and the depthwise convs
    att_path = figures.plot_attention(maps, x[0].sigmoid(), str(tmp_path / 'att.png'), title='x')
    _assert_png(heads_path)
    _assert_png(att_path)
    heads_png, att = Image.open(heads_path), Image.open(att_path)
    # one row of 49 cells per chart was 10352 px wide; 49 panels per (layer, part) in a row, 6539 px
    assert heads_png.width < 2000 and heads_png.height > heads_png.width / 4
    assert att.width < 2000 and 0.5 < att.height / att.width < 2
