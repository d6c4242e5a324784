"""The mutants that only a CUDA device can kill, checked on one (docs/tests.md, "Scores").

    python tools/mutation.py cuda --json results/cuda-mutants.json   # on a GPU machine (benchmarks/gpu/third.sh)
    python tools/mutation.py cuda --smoke                             # the same machinery on the CPU

On the CPU these mutants are equivalent (a CPU tensor's ``.to(None)`` stays on the CPU; CPU autocast casts none of
the depthwise chunks' operations), so the campaign recorded them as survivors that the CUDA case of a test is there
to kill. Here each is written as a one-line edit into a copy of ``tcnn`` and ``tests`` (``tests/conftest.py`` puts the
copy first on ``sys.path``; the copy's conftest also refuses to run when ``tcnn`` comes from elsewhere) and its test
runs in a fresh process: ``killed`` when it fails. First the tests run on the unmutated tree and must pass without
a skip: a test that skips kills nothing. Exit status 0 when the baseline passed and every mutant was killed.

``--smoke`` checks the machinery without a GPU: the CPU case of the autocast test must pass, the first autocast
mutant must survive it (equivalent there), and a mutant the CPU case does see (the taps left in float32 under
autocast) must be killed.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, NamedTuple, Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
AUTOCAST_TEST = 'tests/test_depthwise.py::test_autocast_casts_every_input_once'


class Mutant(NamedTuple):
    name: str  # mutmut's name, as docs/tests.md records it
    path: str  # the file, relative to the repository root
    old: str  # the text replaced: found exactly once in the file, or the mutant is "not applied"
    new: str
    test: str  # the test that kills it


_AUTOCAST_OFF = "return torch.autocast(t.device.type, enabled=False) if _has_autocast(t) else contextlib.nullcontext()"
CUDA_MUTANTS = (
    Mutant('tcnn.layers.depthwise.x__autocast_off__mutmut_1', 'tcnn/layers/depthwise.py', _AUTOCAST_OFF,
           _AUTOCAST_OFF.replace('if _has_autocast(t) else', 'if (_has_autocast(t)) and False else'),
           AUTOCAST_TEST + '[cuda]'),
    Mutant('tcnn.layers.depthwise.x__autocast_off__mutmut_6', 'tcnn/layers/depthwise.py', _AUTOCAST_OFF,
           _AUTOCAST_OFF.replace('enabled=False', ''), AUTOCAST_TEST + '[cuda]'),
    Mutant('tcnn.layers.depthwise.x__autocast_off__mutmut_7', 'tcnn/layers/depthwise.py', _AUTOCAST_OFF,
           _AUTOCAST_OFF.replace('enabled=False', 'enabled=True'), AUTOCAST_TEST + '[cuda]'),
    Mutant('tcnn.files.tcnn_file.x_safetensors_tensors__mutmut_3', 'tcnn/files/tcnn_file.py',
           "v = v.detach().to('cpu').contiguous()", 'v = v.detach().to(None).contiguous()',
           'tests/test_safetensors_files.py::test_safetensors_tensors_of_a_gpu_model_are_on_the_cpu'),
    Mutant('tcnn.files.integrity.x__crc32__mutmut_4', 'tcnn/files/integrity.py',
           "data = tensor.detach().to('cpu').contiguous()", 'data = tensor.detach().to(None).contiguous()',
           'tests/test_integrity.py::test_checksums_of_gpu_tensors_are_those_of_their_bytes'),
    # the batched pipeline's finishing thread (tcnn.data.prefetch): without a stream of its own it launches on the
    # default stream, which a CUDA graph capture refuses; without the event (or the consumer's wait on it, or the
    # stream recorded for the batch's memory) the consumer reads a batch its kernels may still be writing
    *(Mutant(f'tcnn.data.prefetch.{function}__mutmut_{n}', 'tcnn/data/prefetch.py', old, new,
             'tests/test_cuda.py::test_a_cuda_graph_captured_beside_the_finishing_thread_replays_its_numbers')
      for function, n, old, new in (
          ('x__finish_ahead', 9, "cuda = device.type == 'cuda'", 'cuda = None'),
          ('x__finish_ahead', 11, "cuda = device.type == 'cuda'", "cuda = device.type == 'XXcudaXX'"),
          ('x__finish_ahead', 12, "cuda = device.type == 'cuda'", "cuda = device.type == 'CUDA'"),
          ('x__finish_ahead', 16, 'stream = torch.cuda.Stream(device) if cuda else None', 'stream = None'),
          ('x__finish_ahead', 17, 'stream = torch.cuda.Stream(device) if cuda else None',
           'stream = torch.cuda.Stream(device) if (cuda) and False else None'),
          ('x__finish_ahead', 20, 'with torch.cuda.stream(stream) if cuda else',
           'with torch.cuda.stream(stream) if (cuda) and False else'),
          ('x__finish_ahead', 22, 'with torch.cuda.stream(stream) if cuda else',
           'with torch.cuda.stream(None) if cuda else'),
          ('x__finish_ahead', 26, 'event = torch.cuda.Event()', 'event = None'),
          ('xǁFinishedAheadǁ__next__', 12, 'current = torch.cuda.current_stream(images.device)', 'current = None'),
          ('xǁFinishedAheadǁ__next__', 13, 'current = torch.cuda.current_stream(images.device)',
           'current = torch.cuda.current_stream(None)'),
          ('xǁFinishedAheadǁ__next__', 14, 'current.wait_event(event)', 'current.wait_event(None)'),
          ('xǁFinishedAheadǁ__next__', 15, 'images.record_stream(current)', 'images.record_stream(None)'),
          ('xǁFinishedAheadǁ__next__', 16, 'targets.record_stream(current)', 'targets.record_stream(None)'))),
    # a resident split's batch index left on the CPU (tcnn.data.resident.ResidentSplit.gather): the GPU's images and
    # labels refuse it (the meta device accepts a CPU index in index_select)
    *(Mutant(f'tcnn.data.resident.xǁResidentSplitǁgather__mutmut_{n}', 'tcnn/data/resident.py', old,
             old.replace('index.to(self.device)', 'index.to(None)'),
             'tests/test_cuda.py::test_train_on_cuda_with_the_batched_pipelines[resident]')
      for n, old in ((14, 'images = self.stacked.index_select(0, index.to(self.device))'),
                     (21, 'return images, self.targets.index_select(0, index.to(self.device))'))),
    # hue's table of which of v, p, q, t each channel takes (tcnn.data.batch_colour._hsv_to_rgb) made on the CPU:
    # indexed by the images' sectors on the GPU (the CPU and the meta device accept a CPU tensor there)
    *(Mutant(f'tcnn.data.batch_colour.x__hsv_to_rgb__mutmut_{n}', 'tcnn/data/batch_colour.py',
             'dtype=torch.long,\n                          device=img.device)', new,
             'tests/test_cuda.py::test_batch_augment_on_cuda_matches_the_cpu[hue]')
      for n, new in ((58, 'dtype=torch.long,\n                          device=None)'),
                     (61, 'dtype=torch.long,\n                          )'))),
    # random erasing's noise (tcnn.data.batch_misc.erase): a CPU generator, or a draw on the CPU with the GPU's one
    *(Mutant(f'tcnn.data.batch_misc.x_erase__mutmut_{n}', 'tcnn/data/batch_misc.py', old, new,
             'tests/test_cuda.py::test_erasing_noise_on_cuda_is_drawn_there')
      for n, old, new in (
          (10, 'torch.Generator(device=images.device)', 'torch.Generator(device=None)'),
          (34, 'dtype=images.dtype, device=images.device)', 'dtype=images.dtype, device=None)'),
          (38, 'dtype=images.dtype, device=images.device)', 'dtype=images.dtype, )'))),
    # resize's nearest indices and normalize's mean and std made on the CPU, and torch's uint8 kernel (the CPU's)
    # taken off it (the meta device accepts CPU indices and in-place operands there)
    *(Mutant(f'tcnn.data.{module}.{function}__mutmut_{n}', f'tcnn/data/{module}.py', old, new,
             'tests/test_cuda.py::test_resize_and_normalize_on_cuda_match_the_cpu')
      for module, function, n, old, new in (
          ('batch_geometry', 'x_resize', 17, 'size[0]).to(x.device)', 'size[0]).to(None)'),
          ('batch_geometry', 'x_resize', 26, 'size[1]).to(x.device)', 'size[1]).to(None)'),
          ('batch_geometry', 'x_resize', 47, "elif x.device.type == 'cpu' and _uint8_antialias(interpolation)",
           "elif x.device.type == 'cpu' or _uint8_antialias(interpolation)"),
          ('batch_misc', 'x_normalize', 10, 'm = torch.tensor(mean, dtype=torch.float32, device=images.device)',
           'm = torch.tensor(mean, dtype=torch.float32, device=None)'),
          ('batch_misc', 'x_normalize', 13, 'm = torch.tensor(mean, dtype=torch.float32, device=images.device)',
           'm = torch.tensor(mean, dtype=torch.float32, )'),
          ('batch_misc', 'x_normalize', 27, 's = torch.tensor(std, dtype=torch.float32, device=images.device)',
           's = torch.tensor(std, dtype=torch.float32, device=None)'),
          ('batch_misc', 'x_normalize', 30, 's = torch.tensor(std, dtype=torch.float32, device=images.device)',
           's = torch.tensor(std, dtype=torch.float32, )'))),
    # the nearest affine transform's coordinates made on the CPU (the meta device cannot run it: its running sums
    # are read on the CPU)
    *(Mutant(f'tcnn.data.batch_geometry.x__affine_nearest__mutmut_{n}', 'tcnn/data/batch_geometry.py', old, new,
             'tests/test_cuda.py::test_nearest_affine_on_cuda_is_the_cpus')
      for n, old, new in (
          (16, '    dev = images.device\n', '    dev = None\n'),
          (26, 'torch.arange(w, dtype=torch.float64, device=dev)', 'torch.arange(w, dtype=torch.float64, device=None)'),
          (29, 'torch.arange(w, dtype=torch.float64, device=dev)', 'torch.arange(w, dtype=torch.float64, )'),
          (41, 'torch.arange(h, dtype=torch.float64, device=dev)', 'torch.arange(h, dtype=torch.float64, device=None)'),
          (44, 'torch.arange(h, dtype=torch.float64, device=dev)', 'torch.arange(h, dtype=torch.float64, )'),
          (79, 'torch.cumsum(steps, dim=1).floor_().to(dev)', 'torch.cumsum(steps, dim=1).floor_().to(None)'))),
    # affine's per-resample gather and scatter with the chosen images' index left on the CPU
    *(Mutant(f'tcnn.data.batch_geometry.x_affine__mutmut_{n}', 'tcnn/data/batch_geometry.py', old, new,
             'tests/test_cuda.py::test_nearest_affine_on_cuda_is_the_cpus')
      for n, old, new in (
          (47, 'images.index_select(0, chosen.to(images.device))', 'images.index_select(0, chosen.to(None))'),
          (56, 'matrix.index_select(0, chosen.to(matrix.device))', 'matrix.index_select(0, chosen.to(None))'),
          (120, 'out.index_copy_(0, chosen.to(images.device), result)',
           'out.index_copy_(0, chosen.to(None), result)'))),
)
# --smoke: (mutant, the verdict it must get on the CPU)
SMOKE_MUTANTS = (
    (CUDA_MUTANTS[0]._replace(test=AUTOCAST_TEST + '[cpu]'), 'survived'),
    (Mutant('smoke: the taps left in float32 under autocast', 'tcnn/layers/depthwise.py',
            'taps.to(dtype).contiguous()', 'taps.contiguous()', AUTOCAST_TEST + '[cpu]'), 'killed'),
)

# the copy's conftest refuses a tcnn imported from anywhere else (a wrong sys.path would make every mutant survive)
_GUARD = """
import tcnn as _tcnn_under_test
assert Path(_tcnn_under_test.__file__).resolve().is_relative_to(ROOT), (
    f'tcnn imported from {_tcnn_under_test.__file__}, not from the mutated copy {ROOT}')
"""


def run_tests(root: Path, tests: Sequence[str], timeout: float = 600) -> Dict[str, object]:
    """Run ``tests`` in a fresh pytest process in ``root``: its exit status and junit counts."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / 'junit.xml'
        env = dict(os.environ, HF_HUB_OFFLINE='1')
        env.pop('TCNN_FAILURE_LOG', None)  # a killed mutant's failure is the expected one: its tail goes to the JSON
        start = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider', '-q', '-x', '-rfEs',
                                   f'--junitxml={xml}', *tests], cwd=root, env=env, capture_output=True, text=True,
                                  timeout=timeout)
            rc, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, output = 'timeout', str(e.stdout or '')
        counts = {}
        if xml.exists():
            suite = ET.parse(xml).getroot()
            suite = suite if suite.tag == 'testsuite' else suite.find('testsuite')
            counts = {k: int(suite.get(k, 0)) for k in ('tests', 'failures', 'errors', 'skipped')}
    return {'rc': rc, **counts, 'seconds': round(time.monotonic() - start, 1), 'tail': output[-2000:]}


def verdict(result: Dict[str, object]) -> str:
    """killed (a test failed), survived (all ran and passed), skipped (one skipped: it proves nothing), or error."""
    if result['rc'] == 1 and result.get('failures', 0) + result.get('errors', 0) > 0:
        return 'killed'
    if result['rc'] == 0:
        return 'skipped' if result.get('skipped', 0) else 'survived'
    return 'timeout' if result['rc'] == 'timeout' else f'error (exit {result["rc"]})'


def mutated_copy(mutant: Mutant, folder: Path) -> bool:
    """``tcnn`` and ``tests`` copied into ``folder``, ``mutant`` written into the copy; False if its text is not
    found exactly once (the source changed since the campaign: the list needs updating)."""
    shutil.copytree(ROOT / 'tcnn', folder / 'tcnn', ignore=shutil.ignore_patterns('__pycache__'))
    shutil.copytree(ROOT / 'tests', folder / 'tests', ignore=shutil.ignore_patterns('__pycache__'))
    for name in ('setup.cfg', 'pyproject.toml'):
        shutil.copy(ROOT / name, folder / name)
    for other in ('benchmarks', 'recipes', 'docs', 'README.md'):  # read by some tests, not mutated
        if (ROOT / other).exists():
            (folder / other).symlink_to(ROOT / other)
    conftest = folder / 'tests' / 'conftest.py'
    conftest.write_text(conftest.read_text() + _GUARD)
    source = folder / mutant.path
    text = source.read_text()
    if text.count(mutant.old) != 1:
        return False
    source.write_text(text.replace(mutant.old, mutant.new))
    return True


def _one(mutant: Mutant) -> Dict[str, object]:
    """``mutant``'s test run in a copy of its own with the mutant written in: its verdict, times and output tail."""
    with tempfile.TemporaryDirectory(prefix='tcnn-cuda-mutant.') as tmp:
        if not mutated_copy(mutant, Path(tmp)):
            return {'verdict': 'not applied', 'tail': f'{mutant.old!r} is not in {mutant.path} exactly once'}
        result = run_tests(Path(tmp), [mutant.test])
        return dict(result, verdict=verdict(result))


def check(mutants: Sequence[Mutant], jobs: int = 1,
          on_result: Optional[Callable[[Dict[str, object]], None]] = None) -> Dict[str, object]:
    """The baseline on the unmutated tree, then every mutant in its own copy, ``jobs`` at once (each test is one
    process; a GPU machine's cores and the GPU take several: 39 mutants one at a time outlast a device step).

    Args:
        mutants: The mutants, in the order their verdicts are reported.
        jobs: Mutants tested at once.
        on_result: Called with the report after the baseline and after each verdict (a step stopped by its time
            limit keeps the verdicts it had).
    """
    tests = list(dict.fromkeys(m.test for m in mutants))
    baseline = run_tests(ROOT, tests)
    report = {'baseline': {'tests': tests, 'verdict': verdict(baseline), **baseline}, 'mutants': {}}
    print(f'baseline ({len(tests)} tests): {report["baseline"]["verdict"]} in {baseline["seconds"]} s', flush=True)
    if on_result is not None:
        on_result(report)
    if report['baseline']['verdict'] != 'survived':  # the tests must pass, none skipped, before a mutant means much
        print(baseline['tail'])
        return report
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # threads: each waits on its own pytest process
        for mutant, result in zip(mutants, pool.map(_one, mutants)):
            report['mutants'][mutant.name] = {'test': mutant.test, **result}
            print(f'{mutant.name}: {result["verdict"]} ({mutant.test})', flush=True)
            if result['verdict'] not in ('killed', 'survived'):
                print(result['tail'])
            if on_result is not None:
                on_result(report)
    return report


def check_all(smoke: bool = False, json_path: Optional[Path] = None, jobs: int = 1) -> int:
    """Check every CUDA mutant (``smoke``: the CPU's two, each against the verdict it must get there); returns the
    exit status: 0 when the baseline passed and every mutant got its expected verdict.

    Args:
        smoke: Check the machinery on the CPU (no GPU needed).
        json_path: Where to write the verdicts, times and test output tails: after each verdict, atomically.
        jobs: Mutants tested at once.
    """
    if smoke:
        expected = {m.name: v for m, v in SMOKE_MUTANTS}
        mutants = [m for m, _ in SMOKE_MUTANTS]
    else:
        expected = {m.name: 'killed' for m in CUDA_MUTANTS}
        mutants = list(CUDA_MUTANTS)

    def write(report: Dict[str, object]) -> None:
        got = {name: r['verdict'] for name, r in report['mutants'].items()}
        report['ok'] = report['baseline']['verdict'] == 'survived' and got == expected
        if json_path:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = json_path.with_suffix('.tmp')
            tmp.write_text(json.dumps(report, indent=1))
            tmp.replace(json_path)
    report = check(mutants, jobs, on_result=write)
    write(report)
    got = {name: r['verdict'] for name, r in report['mutants'].items()}
    print('every mutant got its expected verdict' if report['ok'] else f'expected {expected}, got {got}')
    return 0 if report['ok'] else 1
