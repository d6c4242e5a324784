"""Tests of what makes a long ``tcnn train`` run survive (the reliability issue): preemption signals with mid-epoch
checkpoints and exact resume, ``--resume auto``/``RUN_DIR``, failed checkpoint writes, short-run adjustments, the
data-throughput line and bad numbers. Random-init resnet18d on generated 64 px shapes, on the CPU, or with
``TCNN_TEST_DEVICE=cuda`` the one-process runs on the GPU (``tests/devices.py``: NCCL under torchrun)."""
import functools
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import tcnn
from helpers import write_partial
from tcnn.train import launch
from tcnn.cli import main as tcnn_main
from tcnn.train.distributed import EXIT_INTERRUPTED, EXIT_PREEMPTED, StopRequest
from tcnn.train.recipe import resolve_recipe

from devices import DEVICE, process_group_backend
from imagegen import make_image_folder
from test_train import _free_port, assert_same_weights, common, evaluate_checkpoint, load, metrics, same_numbers

pytestmark = pytest.mark.usefixtures('one_thread')  # small models on a shared 2-core machine (conftest.py)

UPDATES = 12  # 48 training images / batch 4


IMAGE_FOLDER = dict(num_classes=3, train_per_class=16, val_per_class=2, size=64)  # the data_dir fixture's


@pytest.fixture(scope='module')
def straight(data_dir, tmp_path_factory):
    """An uninterrupted 3-epoch run, the reference of every exact-resume test."""
    out = tmp_path_factory.mktemp('straight') / 'run'
    assert launch.main(common(data_dir, out, epochs=3)) == 0
    return out


class _StopAfter(StopRequest):
    """A stop request that arrives by itself after ``polls`` update boundaries (a deterministic SIGTERM)."""
    polls = 0

    @property
    def requested(self) -> bool:
        type(self).polls -= 1
        if type(self).polls == -1:
            self.request('SIGTERM')
        return self.signal_name is not None


def _stop_after(monkeypatch, polls):
    monkeypatch.setattr(_StopAfter, 'polls', polls)
    monkeypatch.setattr(launch, 'StopRequest', _StopAfter)


def test_stop_mid_epoch_writes_partial_checkpoint_and_resume_is_exact(data_dir, straight, tmp_path, monkeypatch,
                                                                       capsys):
    run = tmp_path / 'run'
    _stop_after(monkeypatch, UPDATES + 5)  # the 5th update of the second epoch
    assert launch.main(common(data_dir, run, epochs=3)) == EXIT_PREEMPTED
    out = capsys.readouterr().out
    assert 'stopped by SIGTERM in epoch 2 after update 5/12' in out and f'--resume {run}' in out
    last = load(run / 'last.pt')
    assert last['epoch'] == 0 and last['partial']['epoch'] == 1 and last['num_updates'] == UPDATES + 5
    assert last['partial']['positions'][0]['updates'] == 5
    assert [r['epoch'] for r in metrics(run)] == [0]
    monkeypatch.undo()
    assert launch.main(['--resume', str(run), '--no-progress']) == 0  # a run folder is accepted
    assert 'resuming in epoch 2/3 after 5 of 12 updates (update 17)' in capsys.readouterr().out
    assert same_numbers(metrics(run), metrics(straight), keys=('train_loss', 'train_top1', 'val_loss', 'lr'))
    assert_same_weights(load(run / 'last.pt'), load(straight / 'last.pt'))
    assert load(run / 'last.pt')['optimizer']['state'].keys() == load(straight / 'last.pt')['optimizer']['state'].keys()


def test_mid_epoch_resume_is_exact_with_loader_workers(data_dir, tmp_path, monkeypatch):
    """With worker processes the resumed epoch loads the remaining images on other workers than the uninterrupted
    run did; per-image augmentation seeds keep the result identical."""
    straight, run = tmp_path / 'straight', tmp_path / 'run'

    def workers(out):
        return common(data_dir, out, epochs=2) + ['--workers', '2']  # the last --workers wins

    assert launch.main(workers(straight)) == 0
    _stop_after(monkeypatch, UPDATES + 3)
    assert launch.main(workers(run)) == EXIT_PREEMPTED
    monkeypatch.undo()
    assert launch.main(['--resume', str(run), '--no-progress']) == 0
    assert same_numbers(metrics(run), metrics(straight), keys=('train_loss', 'train_top1', 'val_loss'))
    assert_same_weights(load(run / 'last.pt'), load(straight / 'last.pt'))


def test_stop_at_epoch_end_and_resume_auto(data_dir, straight, tmp_path, monkeypatch, capsys):
    run = tmp_path / 'run'
    auto = common(data_dir, run, epochs=3) + ['--resume', 'auto']
    _stop_after(monkeypatch, UPDATES)  # requested at the last update of epoch 1: the epoch completes first
    assert launch.main(auto) == EXIT_PREEMPTED
    assert 'stopped by SIGTERM after epoch 1' in capsys.readouterr().out
    last = load(run / 'last.pt')
    assert last['epoch'] == 0 and 'partial' not in last
    monkeypatch.undo()
    assert launch.main(auto) == 0  # the same command resumes
    assert 'resuming after epoch 1/3' in capsys.readouterr().out
    assert_same_weights(load(run / 'last.pt'), load(straight / 'last.pt'))


def _wait_for(predicate, proc, timeout=240):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, 'timed out'
        time.sleep(0.02)


@pytest.mark.parametrize('target', ['process', 'torchrun', 'one-rank'])
def test_real_sigterm_stops_every_rank_and_resume_is_exact(data_dir, straight, tmp_path, target):
    """A real SIGTERM during the second epoch: to a single process, to the torchrun agent of a 2-process job (it
    forwards the signal to the workers), or to one worker only (the other must stop at the same update)."""
    processes = 1 if target == 'process' else 2
    run = tmp_path / 'run'
    env = dict(os.environ, HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    args = common(data_dir, run, epochs=3, processes=processes)
    if processes == 1:
        cmd = [sys.executable, '-m', 'tcnn.train', *args]
    else:
        args[args.index('--batch-size') + 1] = '2'  # the same global batch of 4 as the reference
        cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2', '--master_addr=127.0.0.1',
               f'--master_port={_free_port()}', '-m', 'tcnn.train', *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: os.path.isfile(run / 'metrics.jsonl') and len(metrics(run)) >= 1, proc)
        if target != 'one-rank':
            proc.send_signal(signal.SIGTERM)
        else:
            children = subprocess.run(['pgrep', '-P', str(proc.pid)], capture_output=True, text=True).stdout.split()
            assert len(children) == 2, children
            os.kill(int(max(children, key=int)), signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    # alone: our exit code; under torchrun: the agent's (non-zero), the graceful stop shows in the log
    assert (proc.returncode == EXIT_PREEMPTED) if processes == 1 else (proc.returncode != 0), stderr[-3000:]
    assert 'holds the state; continue with --resume' in stdout
    last = load(run / 'last.pt')
    assert last['epoch'] < 2 and last['world_size'] == processes
    if processes == 2:
        return  # the 2-process run is a different computation (two half batches); its exactness is its own
    assert launch.main(['--resume', str(run / 'last.pt'), '--no-progress']) == 0
    assert_same_weights(load(run / 'last.pt'), load(straight / 'last.pt'))


def test_torchrun_one_process_preempted_resumes_exactly_and_loads_on_the_cpu(data_dir, straight, tmp_path, capsys):
    """``torchrun --nproc_per_node 1``, as a one-GPU job runs: a process group for the one process (NCCL on a GPU,
    gloo on the CPU) and DDP; a SIGTERM to the agent in the second epoch saves ``last.pt`` in the middle of it
    (``status.json``: preempted), the same command with ``--resume auto`` finishes the run with the weights of the
    uninterrupted lone process, and the checkpoint loads and evaluates on a CPU."""
    run = tmp_path / 'run'
    env = dict(os.environ, HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=1', '--master_addr=127.0.0.1',
           f'--master_port={_free_port()}', '-m', 'tcnn.train', *common(data_dir, run, epochs=3), '--resume', 'auto']
    backend = process_group_backend()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: os.path.isfile(run / 'metrics.jsonl') and len(metrics(run)) >= 1, proc)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode != 0 and 'holds the state; continue with --resume' in stdout, stderr[-3000:]
    assert f'device {DEVICE}' in stdout and f'1 process(es) ({backend} process group)' in stdout
    with open(run / 'status.json') as f:
        status = json.load(f)
    assert status['state'] == 'preempted' and status['exit_code'] == EXIT_PREEMPTED
    assert status['process_group'] == backend
    last = load(run / 'last.pt')
    assert last['epoch'] < 2 and last['world_size'] == 1
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'resuming' in proc.stdout and f'({backend} process group)' in proc.stdout
    assert [r['epoch'] for r in metrics(run)] == [0, 1, 2]
    assert same_numbers(metrics(run), metrics(straight), keys=('train_loss', 'train_top1', 'val_loss', 'lr'))
    assert_same_weights(load(run / 'last.pt'), load(straight / 'last.pt'))
    model = tcnn.load(str(run / 'last.pt'))  # on the CPU, whatever the run trained on
    assert len(tcnn.gpsa_layers(model)) == 4 and all(p.device.type == 'cpu' for p in model.parameters())
    out = tmp_path / 'eval.json'
    assert tcnn_main(['eval', str(run / 'last.pt'), '--suite', 'imagenet', '--data', os.path.join(data_dir, 'val'),
                      '--img-size', '64', '--device', 'cpu', '--workers', '0', '--no-progress', '--out', str(out)]) == 0
    capsys.readouterr()
    (result,) = json.loads(out.read_text())['suites']['imagenet']['results'].values()
    # the run's own validation, redone on the CPU from the file: equal, or to bf16 rounding after a GPU run; and
    # tcnn eval, at the size and crop the run validated at, counts the same images right
    logged, again = metrics(run)[-1], evaluate_checkpoint(run / 'last.pt')
    assert again['val_loss'] == pytest.approx(logged['val_loss'], rel=1e-5 if DEVICE == 'cpu' else 2e-2)
    assert result['num_images'] == again['val_images'] == logged['val_images']
    assert result['top1'] == pytest.approx(again['val_top1'], abs=1e-9)
    if DEVICE == 'cpu':
        assert result['top1'] == pytest.approx(logged['val_top1'], abs=1e-9)


@pytest.mark.parametrize('pipeline', ['pil', 'device'])
def test_sigterm_to_the_whole_process_group_with_loader_workers(data_dir, tmp_path, pipeline):
    """SLURM's preemption and a terminal's Ctrl-C signal every process of the job, the DataLoader workers too: the
    workers leave the signal to the training process, which stops at its next update and saves (without the fix the
    run died with "DataLoader worker ... killed by signal: Terminated" and lost the epoch). The same with the device
    pipeline's workers, which decode and augment batches on the CPU."""
    run = tmp_path / 'run'
    env = dict(os.environ, HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    cmd = [sys.executable, '-m', 'tcnn.train', *common(data_dir, run, epochs=3), '--workers', '2',
           '--data-pipeline', pipeline]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _wait_for(lambda: os.path.isfile(run / 'metrics.jsonl') and len(metrics(run)) >= 1, proc)
        group = lambda: subprocess.run(['pgrep', '-g', str(proc.pid)], capture_output=True, text=True).stdout.split()
        _wait_for(lambda: len(group()) >= 3, proc)  # the training process and its 2 loader workers, mid-epoch
        os.killpg(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_PREEMPTED, stderr[-3000:]
    assert 'holds the state; continue with --resume' in stdout and 'killed by signal' not in stderr
    assert launch.main(['--resume', str(run), '--no-progress']) == 0
    assert [r['epoch'] for r in metrics(run)] == [0, 1, 2]


def test_loader_workers_drop_job_signals_but_obey_their_parent():
    """A SIGTERM to a loader worker from another process (the scheduler) is dropped and the loader goes on; the
    DataLoader's own ``terminate()`` still ends the workers: an interpreter that exits with a live iterator ends at
    once instead of waiting for its workers forever (what simply ignoring the signals did)."""
    code = (
        'import sys\n'
        'from torch.utils.data import DataLoader\n'
        'from tcnn.train.distributed import ignore_stop_signals\n'
        'loader = DataLoader(list(range(100000)), batch_size=1, num_workers=2, worker_init_fn=ignore_stop_signals)\n'
        'it = iter(loader)\n'
        'for _ in range(4):  # batches come from the workers in turn: both have started\n'
        '    next(it)\n'
        'print(*[w.pid for w in it._workers], flush=True)\n'
        'sys.stdin.readline()\n'
        'print(sum(int(next(it)) for _ in range(200)), flush=True)\n'
        'keep = it  # alive at exit: multiprocessing terminates and joins the workers\n')
    env = dict(os.environ, OMP_NUM_THREADS='1')
    proc = subprocess.Popen([sys.executable, '-c', code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2, proc.stderr.read()[-2000:]
        for pid in pids:
            os.kill(pid, signal.SIGTERM)  # from this process: not the workers' parent
        time.sleep(0.5)
        for pid in pids:
            os.kill(pid, 0)  # still alive (raises if not)
        start = time.monotonic()
        stdout, stderr = proc.communicate('go\n', timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0 and 'killed by signal' not in stderr, stderr[-2000:]
    assert int(stdout.split()[-1]) > 0 and time.monotonic() - start < 60

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    deadline = time.monotonic() + 20  # orphaned workers may finish their exit just after the parent's
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(gone(pid) for pid in pids)


def test_first_ctrl_c_stops_at_the_next_update_second_interrupts():
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN in a shell's background job
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and stop.signal_name == 'SIGINT' and stop.exit_code == EXIT_INTERRUPTED
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGUSR1)  # a later signal does not change the first request
        assert stop.signal_name == 'SIGINT'
    assert signal.getsignal(signal.SIGINT) is before


def test_failed_checkpoint_write_keeps_the_previous_one(data_dir, tmp_path, monkeypatch, capsys):
    run = tmp_path / 'run'
    real_save = torch.save

    def disk_full(obj, f, *args, **kwargs):
        if os.path.isfile(run / 'last.pt'):  # epoch 1's checkpoint is on disk: the disk is full from now on
            write_partial(f, b'PK\x03\x04 partial')
            raise RuntimeError('[enforce fail at inline_container.cc:859] . PytorchStreamWriter failed writing file '
                               'data/3: file write failed')
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, 'save', disk_full)
    assert launch.main(common(data_dir, run, epochs=3)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f'cannot write {run}' in err[0] and 'the previous last.pt is intact' in err[0], err
    assert 'free disk space' in err[0]
    monkeypatch.undo()
    assert load(run / 'last.pt')['epoch'] == 0
    assert not [p for p in os.listdir(run) if p.endswith('.tmp')]
    assert [r['epoch'] for r in metrics(run)] == [0]  # the metrics row follows the checkpoint, never precedes it


def test_resume_errors_are_one_line(data_dir, straight, tmp_path, capsys):
    empty = tmp_path / 'empty.pt'
    empty.write_bytes(b'')
    (tmp_path / 'folder').mkdir()
    other = make_image_folder(str(tmp_path / 'two'), num_classes=2, train_per_class=4, val_per_class=1, size=32)
    cases = [
        (['--resume', str(straight), '--data', other, '--epochs', '4'],
         "the resumed run's model has 3 classes, the data 2"),
        (['--resume', str(empty)], 'empty.pt'),
        (['--resume', str(tmp_path / 'folder')], 'holds no last.pt'),
        (['--resume', str(tmp_path / 'folder'), '--recipe', 't_resnet50_d'], '--resume auto accepts --recipe'),
    ]
    for args, message in cases:
        assert launch.main(args) == 2, message
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize('args, message', [
    (['--lr', 'nan'], "'lr' in the command line must be a finite number"),
    (['--set', 'gating_lr=.nan'], "'gating_lr' in --set must be a finite number"),
    (['--set', 'mean=[0.5, .inf, 0.5]'], "'mean' in --set must hold finite numbers"),
    (['--set', 'warmup_epochs=3'], 'set a shorter one with --set warmup_epochs=N'),
    (['--batch-size', '64'], 'smaller than one update'),
])
def test_bad_numbers_fail_before_any_file(data_dir, tmp_path, capsys, args, message):
    out = tmp_path / 'deep' / 'out'
    assert launch.main(common(data_dir, out, epochs=2) + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / 'deep').exists()  # no empty folder left behind


def test_short_run_shortens_the_warmup_with_a_notice(capsys):
    notes = []
    recipe = resolve_recipe('t_resnet50_d', {'epochs': 2}, [], notes)
    assert recipe.warmup_epochs == 0 and len(notes) == 1 and 'shortened from 5 to 0' in notes[0]
    assert resolve_recipe('t_resnet50_d', {'epochs': 20}, []).warmup_epochs == 5  # fits: unchanged
    recipe = resolve_recipe('t_resnet50_d', {'epochs': 4}, ['warmup_epochs=2'])  # explicit: kept
    assert recipe.warmup_epochs == 2


def test_a_small_run_works_the_first_try(data_dir, tmp_path, capsys):
    """Defaults a user with a small folder meets: warm-up fitted, lr-scaling warning, the data kept decoded in memory
    (no loader workers), and the throughput of the loader against the step in the log and the metrics."""
    run = tmp_path / 'small'
    args = ['--data', data_dir, '--output', str(run), '--model', 'resnet18d', '--no-pretrained', '--epochs', '1',
            '--batch-size', '8', '--img-size', '64', '--no-progress', '--set', 'mixup=0', '--set', 'cutmix=0']
    assert launch.main(args) == 0
    out = capsys.readouterr().out
    assert 'note: warm-up shortened from 5 to 0 epochs' in out
    assert 'warning: the batch rule scales every learning rate by 8/1024' in out
    assert 'data pipeline resident (the splits take about 1 MiB decoded, within' in out and '0 loader workers' in out
    assert 'step alone' in out and 'waiting for data' in out
    (row,) = metrics(run)
    assert 0 <= row['data_wait'] <= 1 and row['step_img_per_s'] >= row['img_per_s'] > 0


def test_no_pretrained_help_says_what_it_does(capsys):
    with pytest.raises(SystemExit):
        launch.main(['--help'])
    help_text = ' '.join(capsys.readouterr().out.split())
    assert '--no-pretrained start from a random init instead of the pretrained weights' in help_text


def test_bad_images_stop_the_run_or_are_skipped_and_logged(tmp_path, capsys):
    data = make_image_folder(str(tmp_path / 'data'), num_classes=2, train_per_class=6, val_per_class=2, size=64)
    bad = tmp_path / 'data' / 'train' / 'circle' / 'zero.png'
    bad.write_bytes(b'')
    args = common(data, tmp_path / 'run', epochs=1)
    assert launch.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f'cannot read image {bad}' in err[0] and '--skip-bad-images' in err[0], err
    assert not (tmp_path / 'run').exists() or not os.path.isfile(tmp_path / 'run' / 'last.pt')
    run = tmp_path / 'skip'
    assert launch.main(common(data, run, epochs=1) + ['--skip-bad-images']) == 0
    assert f'warning: skipped unreadable image {bad}' in capsys.readouterr().out
    (row,) = metrics(run)
    assert row['bad_images'] == [str(bad)]


class _VirtualClock:
    """``time`` for ``tcnn.train.engine``: a ``perf_counter`` that only ``advance`` moves, so that the loop's times
    are known exactly (nothing else the loop does takes time on it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class _SlowImages(torch.utils.data.Dataset):
    """Tiny random images whose every read takes ``delay`` seconds of ``clock``: a loader far slower than the step."""

    def __init__(self, n: int, delay: float, clock: _VirtualClock):
        self.n, self.delay, self.clock = n, delay, clock

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        self.clock.advance(self.delay)
        return torch.full((3, 16, 16), float(i) / self.n), i % 2


def test_loop_numbers_of_a_data_bound_epoch(monkeypatch):
    """A loader that takes 40 ms per image (160 ms a batch) before a step of 5 ms, on a virtual clock (every time is
    then known exactly; the real clock's epoch time: the next test): the loop's img/s is the images over the whole
    time (waiting included), the step's over the compute alone, data_wait the waiting share, and the times add up to
    the call's whole time (a report every update agrees)."""
    from tcnn.train import engine
    from tcnn.train.engine import EpochPlan, ForwardPass, UpdateStep, train_one_epoch
    clock = _VirtualClock()
    monkeypatch.setattr(engine, 'time', clock)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 2))
    batches, batch, delay, step = 5, 4, 0.04, 0.005
    model.register_forward_pre_hook(lambda module, args: clock.advance(step))
    loader = torch.utils.data.DataLoader(_SlowImages(batch * batches, delay, clock), batch_size=batch)
    reports = []
    plan = EpochPlan(0, batches, on_update=reports.append, log_every=1)
    update = UpdateStep(torch.optim.SGD(model.parameters(), lr=0.1))
    start = clock.perf_counter()
    position, stats = train_one_epoch(model, loader, torch.nn.functional.cross_entropy, update, plan,
                                      ForwardPass(torch.device('cpu')))
    wall = clock.perf_counter() - start
    images = batch * batches
    waited, computed = images * delay, batches * step
    assert stats['train_images'] == images
    exact = functools.partial(pytest.approx, rel=1e-12)  # sums of the same floats in another order
    assert position.data_time_s == exact(waited) and position.compute_time_s == exact(computed)
    assert stats['train_time_s'] == exact(wall) == exact(waited + computed)  # the loop's whole time
    assert stats['data_wait'] == exact(waited / wall) and stats['data_wait'] > 0.5
    assert stats['img_per_s'] == exact(images / wall)
    assert stats['step_img_per_s'] == exact(images / computed)
    assert stats['step_img_per_s'] == exact(stats['img_per_s'] / (1 - stats['data_wait']))  # benchmarks/loop
    assert [r['step'] for r in reports] == list(range(1, batches + 1))
    for r in reports:  # each update alone: one batch's reads and one step
        assert r['img_per_s'] == exact(batch / (batch * delay + step))
        assert r['data_wait'] == exact(batch * delay / (batch * delay + step))


def test_epoch_time_is_the_wall_time_of_a_data_bound_epoch(data_dir, tmp_path, monkeypatch, capsys):
    """``tcnn train`` with image reads that sleep: the metrics row's epoch time holds the waiting (every read of the
    epoch, training and validation), data_wait is the waiting share and the log line says the run is data-bound."""
    from tcnn.data.folders import ImageFolderDataset
    delay = 0.05
    read = ImageFolderDataset.__getitem__

    def slow(self, index):
        time.sleep(delay)
        return read(self, index)

    monkeypatch.setattr(ImageFolderDataset, '__getitem__', slow)
    run = tmp_path / 'run'
    small = ['--no-sa', '--model', 'demo_resnet10', '--img-size', '32',  # a step of a few ms
             '--data-pipeline', 'pil']  # the reads of the PIL pipeline's workers
    assert launch.main(common(data_dir, run, epochs=1) + small) == 0
    (row,) = metrics(run)
    reads = row['train_images'] + row['val_images']
    assert row['epoch_time_s'] >= reads * delay
    assert row['train_images'] / row['img_per_s'] <= row['epoch_time_s']
    assert 0.5 < row['data_wait'] <= 1
    assert row['step_img_per_s'] == pytest.approx(row['img_per_s'] / (1 - row['data_wait']), rel=1e-6)
    assert 'data-bound: raise --workers' in capsys.readouterr().out
