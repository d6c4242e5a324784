"""What every test file may use: the repository root on ``sys.path`` (the benchmarks package lives beside tcnn/,
outside the installed package: tests that check it, or use its reference GPSA as an oracle, import it from there)
and the fixtures several test files share, defined once (``tests/test_layout.py`` fails on a test file that defines
one again). Shared plain functions are in ``helpers.py``."""
import os
import sys
from pathlib import Path

import pytest
import torch

from imagegen import make_image_folder

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# make_image_folder's arguments of the data_dir fixture; a module sets IMAGE_FOLDER to change some of them
IMAGE_FOLDER = dict(num_classes=3, train_per_class=8, val_per_class=4, size=64)


@pytest.fixture(scope='module')
def one_thread():
    """One intra-op thread for the module's tests, the previous count afterwards. The tests of small models ask for it
    (``pytestmark = pytest.mark.usefixtures('one_thread')``): on a shared, loaded 2-core CI machine several threads
    slow them down 10x or more."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope='module')
def t_model() -> torch.nn.Module:
    """A converted resnet18d with non-default settings whose GPSA parameters moved away from their init: the model
    that the T-CNN file tests save, load and read (a test file that needs another defines its own ``t_model``)."""
    import tcnn  # here, not at the top: the tcnn of the checkout that the sys.path set-up above puts first
    from tcnn.files.sources import create_cnn
    torch.manual_seed(0)
    cnn = create_cnn('resnet18d', pretrained=False, num_classes=10, zero_init_last=False, drop_path_rate=0.05)
    model = tcnn.reparameterize(cnn, stages=[3, 4], qk_dim=16, gating_init=0.5, verify=False).eval()
    with torch.no_grad():  # as after fine-tuning: per-head gates, moved centres, other localities
        for _, layer in tcnn.gpsa_layers(model):
            layer.gating.uniform_(-2, 2)
            layer.pos_centers.add_(0.3 * torch.randn_like(layer.pos_centers))
            layer.pos_locality.uniform_(0.2, 3)
    return model


@pytest.fixture(scope='module')
def data_dir(request, tmp_path_factory) -> str:
    """A generated ImageFolder of drawn shapes (``imagegen.make_image_folder``) for the module's training runs: 3
    classes of 8 training and 4 validation images, 64 px, unless the module's ``IMAGE_FOLDER`` dict says otherwise."""
    kwargs = dict(IMAGE_FOLDER, **getattr(request.module, 'IMAGE_FOLDER', {}))
    return make_image_folder(str(tmp_path_factory.mktemp('shapes')), **kwargs)


def pytest_runtest_logreport(report):
    """With ``TCNN_FAILURE_LOG`` set, each failure's traceback is appended to that file as it happens: a run on a
    lent GPU that its time limit kills (before pytest prints its summary) still tells why a test failed."""
    path = os.environ.get('TCNN_FAILURE_LOG')
    if path and report.failed:
        with open(path, 'a', encoding='utf-8') as f:
            f.write(f'==== {report.nodeid} ({report.when})\n{report.longreprtext}\n')
            for name, text in report.sections:
                if 'stdout' in name:
                    f.write(f'---- {name}\n{text}\n')
