"""Multi-node training on one machine: two ``torchrun`` agents (``--nnodes 2 --nproc_per_node 1``, c10d rendezvous
on localhost, gloo on CPU) run a short recipe; the same run preempted by a SIGTERM to one agent in the middle of an
epoch and continued by a fresh two-agent launch with ``--resume auto`` ends with the same epochs and weights.

torchrun turns the preemption into its own exit codes (the signalled agent exits 1 with a ``SignalException``
traceback, the other reports its worker's failure), so what says "preempted" is ``OUTPUT/status.json``."""
import argparse
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from test_train import _free_port, assert_same_weights, load, metrics, same_numbers

EPOCHS, UPDATES = 2, 20  # 80 training images / (2 processes x batch 2)


IMAGE_FOLDER = dict(num_classes=2, train_per_class=40, val_per_class=2, size=32)  # the data_dir fixture's


def train_args(data_dir, output, *extra):
    return ['--data', data_dir, '--output', str(output), '--model', 'demo_resnet10', '--no-pretrained', '--epochs',
            str(EPOCHS), '--batch-size', '2', '--img-size', '32', '--workers', '0', '--lr', '1e-3',
            '--gating-lr', '1.0', '--set', 'warmup_epochs=1', '--set', 'scale_lr=false', '--device', 'cpu',
            '--resume', 'auto', *extra]  # with the progress bar: it shows when an epoch is under way


def epoch_progress(text, epoch, epochs):
    """The most updates of epoch ``epoch`` (1-based) that the progress bars in a log ``text`` show done (0: none)."""
    done = re.findall(rf'epoch {epoch}/{epochs}: +\d+%\|[^|\n\r]*\| *(\d+)/\d+', text)
    return max((int(n) for n in done), default=0)


def launch_two_nodes(args, logs):
    """Two torchrun agents of one 2-node job (one process each), as two machines would start them."""
    port, rdzv_id = _free_port(), f'tcnn-test-{time.monotonic_ns()}'
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nnodes', '2', '--nproc_per_node', '1',
           '--rdzv-backend', 'c10d', '--rdzv-endpoint', f'localhost:{port}', '--rdzv-id', rdzv_id,
           '-m', 'tcnn.train', *args]
    env = dict(os.environ, HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    agents = []
    for node in range(2):
        log = open(logs / f'node{node}.log', 'w')
        agents.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True))
        log.close()
    return agents


def finish(agents, logs, timeout=300):
    """Wait for both agents; returns their exit codes."""
    deadline = time.monotonic() + timeout
    try:
        for agent in agents:
            agent.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        for agent in agents:
            agent.kill()
    return [a.returncode for a in agents]


def tail(logs, chars=3000):
    return '\n'.join(f'--- {p}\n' + (logs / p).read_text()[-chars:] for p in sorted(os.listdir(logs)))


def test_every_train_option_passes_through_torchrun():
    """torchrun's parser checks the script's arguments too, against abbreviations of its own options: every option of
    ``tcnn train`` reaches the script, or has a spelling that does (``--log`` clashes with ``--log-dir``...)."""
    from torch.distributed.run import get_args_parser
    from tcnn.train.args import ALIASES, add_arguments
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parser.add_argument('--debug', action='store_true')  # python -m tcnn.train's own
    torchrun = get_args_parser()

    def passes(option):
        try:
            args = torchrun.parse_args(['--nproc_per_node', '1', '-m', 'tcnn.train', option, 'x'])
        except SystemExit:
            return False
        return args.training_script_args == [option, 'x']
    options = [o for action in parser._actions for o in action.option_strings if o not in ('-h', '--help')]
    assert '--log-to' in options and '--log-every' in options
    refused = [o for o in options if not passes(o)]
    assert set(refused) <= set(ALIASES), refused
    assert all(any(passes(alias) for alias in ALIASES[o]) for o in refused)


def test_two_agents_and_a_preempted_agent_resume_exactly(data_dir, tmp_path):
    straight, run = tmp_path / 'straight', tmp_path / 'run'
    for name in ('straight-logs', 'run-logs', 'resume-logs'):
        (tmp_path / name).mkdir()
    codes = finish(launch_two_nodes(train_args(data_dir, straight), tmp_path / 'straight-logs'), tmp_path)
    assert codes == [0, 0], tail(tmp_path / 'straight-logs')
    assert [r['epoch'] for r in metrics(straight)] == list(range(EPOCHS))
    assert load(straight / 'last.pt')['world_size'] == 2

    logs, dashboard = tmp_path / 'run-logs', ('--log-to', 'tensorboard', '--log-every', '5')
    agents = launch_two_nodes(train_args(data_dir, run, *dashboard), logs)
    try:
        deadline = time.monotonic() + 300
        while not epoch_progress(tail(logs), 2, EPOCHS):  # the first update of epoch 2 is done
            assert all(a.poll() is None for a in agents), tail(logs)
            assert time.monotonic() < deadline, tail(logs)
            time.sleep(0.05)
        agents[1].send_signal(signal.SIGTERM)  # preempt one machine
    finally:
        codes = finish(agents, logs)
    with open(run / 'status.json') as f:
        status = f.read()
    assert '"state": "preempted"' in status, f'torchrun exit codes {codes}\n{status}\n{tail(logs)}'
    last = load(run / 'last.pt')
    assert last['partial']['epoch'] == 1 and 0 < last['num_updates'] - UPDATES < UPDATES, tail(logs)
    assert [r['epoch'] for r in metrics(run)] == [0]

    codes = finish(launch_two_nodes(train_args(data_dir, run, *dashboard), tmp_path / 'resume-logs'), tmp_path)
    assert codes == [0, 0], tail(tmp_path / 'resume-logs')
    assert 'resuming in epoch 2/2' in tail(tmp_path / 'resume-logs')
    assert same_numbers(metrics(run), metrics(straight), keys=('train_loss', 'train_top1', 'val_loss', 'lr'))
    assert_same_weights(load(run / 'last.pt'), load(straight / 'last.pt'))  # logging on rank 0 changes nothing

    # the dashboard: rank 0 only (one event file a start), every 5th update once across the preemption
    assert len(os.listdir(run / 'tensorboard')) == 2
    events = EventAccumulator(str(run / 'tensorboard'), size_guidance={'scalars': 0})
    events.Reload()
    assert [e.step for e in events.Scalars('train/loss')] == list(range(5, EPOCHS * UPDATES + 1, 5))
    assert [(e.step, e.value) for e in events.Scalars('val/top1')] == [
        (UPDATES * (r['epoch'] + 1), pytest.approx(r['val_top1'])) for r in metrics(run)]
