"""torch.hub on a clone of this checkout (``hubconf.py``): the ``t_*`` entrypoints, ``convert`` and ``load``, in a
fresh interpreter that has imported neither tcnn nor timm and has the clone on no path of its own, as a user's has.

The checkout is cloned with ``git clone`` where it is a git checkout (so what is checked is what is committed: commit
``hubconf.py`` before running this), else copied. ``torch.hub.list`` and ``torch.hub.help`` take GitHub repositories
only (no ``source='local'``), so they run on the clone placed where a GitHub download lands in torch.hub's cache
(``HUB/OWNER_NAME_REF``), which torch.hub reads without the network. The interpreter runs offline with empty Hugging
Face and torch caches, so that ``pretrained=True`` has no weights to find.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import timm
import torch

from nontrivial import nontrivial

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HUB_REPO = 'tcnn-hub/tcnn:main'  # any OWNER/NAME:REF: torch.hub's cache folder is OWNER_NAME_REF

# One interpreter for every check (importing torch and timm costs seconds); it prints one JSON line.
SCRIPT = textwrap.dedent('''
    import json, os, sys, time
    clone, weights, out = sys.argv[1:4]
    fresh = not any(m.split('.')[0] in ('tcnn', 'timm') for m in sys.modules)
    import torch
    r = {'fresh': fresh}
    hub_model = torch.hub.load(clone, 't_resnet18d', source='local', pretrained=False)
    import tcnn, timm
    r['tcnn_file'] = tcnn.__file__
    r['clone_left_on_path'] = any(os.path.abspath(p or '.') == clone for p in sys.path)
    r['class'] = type(hub_model).__name__
    r['gpsa'] = sorted(n for n, m in hub_model.named_modules() if isinstance(m, tcnn.GPSA))
    ref = timm.create_model('t_resnet18d')
    r['same_repr'] = repr(hub_model) == repr(ref)
    r['same_shapes'] = ({k: tuple(v.shape) for k, v in hub_model.state_dict().items()}
                        == {k: tuple(v.shape) for k, v in ref.state_dict().items()})
    ref.load_state_dict(hub_model.state_dict())
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        r['same_logits'] = torch.equal(hub_model.eval()(x), ref.eval()(x))

    r['listed'] = torch.hub.list(HUB_REPO, verbose=False, skip_validation=True)
    r['help'] = torch.hub.help(HUB_REPO, 't_resnetrs50', skip_validation=True)
    r['registered'] = [tcnn.files.sources.transformed_model_name(s) for s in tcnn.models.SOURCE_MODELS]

    converted = torch.hub.load(clone, 'convert', 'resnet18d', weights=weights, input_size=(3, 64, 64), source='local')
    report = converted.tcnn_report
    r['convert'] = {'class': type(converted).__name__, 'max_rel_err': report.max_rel_err,
                    'init_max_rel_err': report.init_max_rel_err, 'vacuous': report.vacuous,
                    'gpsa': sum(isinstance(m, tcnn.GPSA) for m in converted.modules())}
    by_name = torch.hub.load(clone, 't_resnet18d', weights=weights, source='local')
    r['differ_from_convert'] = sorted(k for k, v in by_name.state_dict().items()
                                      if not torch.equal(v, converted.state_dict()[k]))
    tcnn.save(converted, out)
    loaded = torch.hub.load(clone, 'load', out, source='local')
    r['load'] = {'class': type(loaded).__name__, 'training': loaded.training,
                 'same': all(torch.equal(v, converted.state_dict()[k]) for k, v in loaded.state_dict().items())}

    r['offline'] = {}
    for entry, args in (('t_resnet18d', ()), ('convert', ('resnet18d',))):
        start = time.perf_counter()
        try:
            torch.hub.load(clone, entry, *args, source='local', pretrained=True)
            r['offline'][entry] = ['loaded', time.perf_counter() - start]
        except Exception as e:
            r['offline'][entry] = [f'{type(e).__name__}: {e}', time.perf_counter() - start]
    print(json.dumps(r))
''').replace('HUB_REPO', repr(HUB_REPO))


def _clone(dest: str) -> str:
    """This checkout at ``dest``: its committed files (``git clone``) if it is a git checkout, else a copy."""
    inside = subprocess.run(['git', '-C', ROOT, 'rev-parse', '--show-toplevel'], capture_output=True, text=True)
    if inside.returncode == 0 and os.path.realpath(inside.stdout.strip()) == os.path.realpath(ROOT):
        subprocess.run(['git', 'clone', '--quiet', ROOT, dest], check=True, timeout=120)
    else:
        shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns('.git', '__pycache__', '*.egg-info', 'mutants'))
    return dest


@pytest.fixture(scope='module')
def hub(tmp_path_factory) -> dict:
    """What the fresh interpreter found, and where the clone is."""
    tmp = tmp_path_factory.mktemp('torch_hub')
    clone = _clone(str(tmp / 'tcnn'))
    if not os.path.isfile(os.path.join(clone, 'hubconf.py')):
        pytest.fail('the clone has no hubconf.py: commit it (the test clones what is committed)')
    owner_name_ref = HUB_REPO.replace('/', '_').replace(':', '_')
    shutil.copytree(clone, str(tmp / 'torch' / 'hub' / owner_name_ref), ignore=shutil.ignore_patterns('.git'))
    cnn = nontrivial(timm.create_model('resnet18d'))  # every block reaches the logits: the check is not vacuous
    weights = str(tmp / 'resnet18d.pth')
    torch.save(cnn.state_dict(), weights)
    env = {k: v for k, v in os.environ.items()
           if k not in ('PYTHONPATH', 'HF_HUB_CACHE', 'HUGGINGFACE_HUB_CACHE', 'TORCH_HUB', 'TIMM_CACHE')}
    env.update(HF_HUB_OFFLINE='1', HF_HOME=str(tmp / 'hf'), TORCH_HOME=str(tmp / 'torch'))
    proc = subprocess.run([sys.executable, '-c', SCRIPT, clone, weights, str(tmp / 't_resnet18d.pt')], env=env,
                          cwd=str(tmp), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]), clone=clone)


def test_t_entrypoint_builds_timms_t_cnn_from_the_clone(hub):
    """``torch.hub.load(CLONE, 't_resnet18d', source='local')``: the clone's tcnn (not an installed one), the model
    ``timm.create_model('t_resnet18d')`` builds (same modules, shapes and logits), with layer4's four 3x3 convs as GPSA
    layers; torch.hub takes the clone off ``sys.path`` again."""
    assert hub['fresh']
    assert hub['tcnn_file'] == os.path.join(hub['clone'], 'tcnn', '__init__.py')
    assert not hub['clone_left_on_path']
    assert hub['class'] == 'TransformedResNet'
    assert hub['gpsa'] == ['layer4.0.conv1', 'layer4.0.conv2', 'layer4.1.conv1', 'layer4.1.conv2']
    assert hub['same_repr'] and hub['same_shapes'] and hub['same_logits']


def test_list_and_help_show_every_registered_t_model(hub):
    """``torch.hub.list`` gives ``convert``, ``load`` and one entrypoint per registered ``t_*`` model, the paper's
    ResNet-D and ResNet-RS backbones among them, and nothing else (no imported helper); ``help`` gives its doc."""
    listed, registered = set(hub['listed']), set(hub['registered'])
    assert listed == registered | {'convert', 'load'}
    backbones = {f't_resnet{d}d' for d in (18, 26, 34, 50, 101, 152, 200)} | \
        {f't_resnetrs{d}' for d in (50, 101, 152, 200, 270, 350, 420)}
    assert backbones <= listed and len(registered) > 250
    assert "T-CNN of timm's ``resnetrs50``" in hub['help'] and 'weights' in hub['help']


def test_the_hub_helpers_convert_and_load_the_same_weights(hub):
    """``convert`` verifies the conversion (exact to 1e-5 on a CNN whose every block counts) and returns the T-CNN at
    the fine-tuning init; ``t_resnet18d(weights=CNN checkpoint)`` converts the same weights to the same state dict but
    for the content queries and keys, which start random in both; ``load`` reads back what ``tcnn.save`` wrote, in
    eval mode."""
    convert = hub['convert']
    assert convert['class'] == 'ResNet'  # tcnn.reparameterize keeps the CNN's class (the t_* models re-class theirs)
    assert convert['gpsa'] == 4 and not convert['vacuous']
    assert convert['max_rel_err'] < 1e-5 < 1e-2 < convert['init_max_rel_err']
    assert hub['differ_from_convert'] == sorted(f'layer4.{b}.conv{c}.{w}_weight' for b in (0, 1) for c in (1, 2)
                                                for w in 'qk')
    # tcnn.load rebuilds a timm ResNet as its t_* model
    assert hub['load'] == {'class': 'TransformedResNet', 'training': False, 'same': True}


def test_pretrained_offline_fails_fast_naming_the_hub_arguments(hub):
    """Offline and not cached, ``pretrained=True`` fails in seconds (timm's own retries take about 50) with tcnn's
    one line, its fix in this API's terms (``tcnn convert``'s --weights / --no-pretrained)."""
    for entry, source in (('t_resnet18d', 'resnet18d.ra2_in1k'), ('convert', 'resnet18d')):
        message, seconds = hub['offline'][entry]
        assert message == (f"WeightsUnavailableError: cannot download pretrained weights for '{source}' (offline, not "
                           'in the local cache): pass weights=PATH (a local checkpoint) or pretrained=False (random '
                           'init)'), entry
        assert seconds < 10, (entry, seconds)
