"""tcnn.train.distributed.StopRequest: how a run is asked to stop. A cluster's SIGTERM or SIGUSR1 and a first Ctrl-C
become a request the loop honours at its next update (then it saves and exits 75, or 130 for Ctrl-C); a second Ctrl-C
interrupts at once. The handler is called here as Python calls it (tests/test_train_reliability.py sends real
signals to training processes); a loader worker leaves them to the training process unless its parent sends them
(``ignore_stop_signals``, in forked children here)."""
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, List, Optional, Sequence, Tuple

import pytest

from tcnn.train.distributed import EXIT_INTERRUPTED, EXIT_PREEMPTED, StopRequest, ignore_stop_signals


def _signal(stop: StopRequest, signum: int) -> None:
    """``stop``'s handler as Python calls it, for a signal that must not interrupt: a KeyboardInterrupt fails the test
    (uncaught, it would end pytest's whole session instead)."""
    try:
        stop._handle(signum, None)
    except KeyboardInterrupt:
        pytest.fail(f'{signal.Signals(signum).name} interrupted at once')


def test_a_first_ctrl_c_asks_for_a_stop_and_a_second_interrupts_at_once():
    stop = StopRequest()
    assert not stop.requested
    _signal(stop, signal.SIGINT)
    assert stop.requested and stop.signal_name == 'SIGINT' and stop.exit_code == EXIT_INTERRUPTED == 130
    with pytest.raises(KeyboardInterrupt):
        stop._handle(signal.SIGINT, None)


@pytest.mark.parametrize('first', ['SIGTERM', 'SIGUSR1'])
def test_a_preemption_signal_asks_for_a_stop_and_the_first_signal_names_it(first):
    stop = StopRequest()
    _signal(stop, getattr(signal, first))
    assert stop.signal_name == first and stop.exit_code == EXIT_PREEMPTED == 75
    # what comes after does not change the request, and a Ctrl-C after a preemption is no second Ctrl-C
    _signal(stop, signal.SIGINT)
    _signal(stop, signal.SIGTERM)
    assert stop.signal_name == first and stop.exit_code == EXIT_PREEMPTED


def test_a_preemption_after_a_ctrl_c_waits_for_the_update_as_the_ctrl_c_does():
    stop = StopRequest()
    _signal(stop, signal.SIGINT)
    _signal(stop, signal.SIGTERM)
    assert stop.signal_name == 'SIGINT' and stop.exit_code == EXIT_INTERRUPTED


def test_the_handlers_are_installed_in_the_main_thread_and_the_previous_ones_come_back():
    before = {name: signal.getsignal(getattr(signal, name)) for name in StopRequest.SIGNALS}
    with StopRequest() as stop:
        for name in StopRequest.SIGNALS:
            assert signal.getsignal(getattr(signal, name)) == stop._handle
        stop.request('SIGUSR1')
        stop.request('SIGTERM')
        assert stop.signal_name == 'SIGUSR1'
    assert {name: signal.getsignal(getattr(signal, name)) for name in StopRequest.SIGNALS} == before


# ----------------------------------------------------------------- loader workers: ignore_stop_signals in a fork
# A forked child runs the worker_init_fn as a DataLoader worker does (this process is its parent): blocking the
# signals in the test process itself would leave them blocked, and a thread waiting for them there would take the
# signals other tests send to this process.
STOP_SIGNALS = StopRequest.SIGNALS  # as a child that empties the class's sees them
linux = pytest.mark.skipif(not hasattr(signal, 'sigwaitinfo'), reason='signal.sigwaitinfo and fork: Linux')


def _new_threads(before: Sequence[threading.Thread]) -> List[Tuple[str, bool]]:
    """(name, daemon) of this process's threads started since ``before`` (libraries may restart threads of their own
    in a forked child, e.g. wandb's OpenTelemetry exporters)."""
    return sorted((t.name, t.daemon) for t in threading.enumerate() if t not in before)


def _blocked() -> List[str]:
    """The stop signals blocked in the calling thread."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    return sorted(n for n in STOP_SIGNALS if getattr(signal, n) in mask)


def _worker(report: Connection, linger: bool, without: Optional[str] = None) -> None:
    """A loader worker's start: ``ignore_stop_signals`` (``without`` an attribute of the platform's ``signal`` module,
    or its stop signals), then its threads and blocked signals to ``report``, then work for a minute if ``linger``."""
    if without == 'sigwaitinfo':
        del signal.sigwaitinfo  # the child's own module: not Linux
    elif without == 'signals':
        StopRequest.SIGNALS = ()
    before = threading.enumerate()
    ignore_stop_signals()
    report.send((_new_threads(before), _blocked()))
    if linger:
        time.sleep(60)


def _start_worker(linger: bool, without: Optional[str] = None) -> Tuple[multiprocessing.Process, Any]:
    """A forked ``_worker`` and what it reported. Forked as ``start_workers`` forks a loader's: on Linux with the stop
    signals blocked, so that the threads a library restarts in a forked child (wandb's OpenTelemetry exporters, after
    the dashboards' tests) inherit the mask instead of taking a signal with its default action, killing the worker."""
    reports, report = multiprocessing.Pipe(duplex=False)
    worker = multiprocessing.get_context('fork').Process(target=_worker, args=(report, linger, without), daemon=True)
    blocked = {getattr(signal, n) for n in STOP_SIGNALS} if without is None else set()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        worker.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    report.close()  # the child's end: recv raises EOFError if the child dies before reporting
    try:
        assert reports.poll(30), 'the worker did not start'
        return worker, reports.recv()
    except BaseException:
        worker.kill()
        raise


def _send_from_another_process(pid: int, signums: Sequence[int]) -> None:
    subprocess.run([sys.executable, '-c', 'import os, sys\nfor s in sys.argv[2:]: os.kill(int(sys.argv[1]), int(s))',
                    str(pid), *map(str, signums)], check=True, timeout=60)


@linux
@pytest.mark.parametrize('name', ['SIGTERM', 'SIGINT', 'SIGUSR1'])
def test_a_loader_worker_drops_job_signals_from_others_and_dies_of_its_parents_with_the_shells_code(name):
    """A stop signal from another process (the cluster's, to the whole job) is dropped: the worker works on, and the
    training process, which got its own copy, stops at its next update. Its parent's (the DataLoader's
    ``terminate()``) ends it at once with 128 + the signal's number, the shell's code for death by that signal."""
    worker, (threads, blocked) = _start_worker(linger=True)
    try:
        assert threads == [('tcnn-stop-signals', True)] and blocked == sorted(STOP_SIGNALS)
        _send_from_another_process(worker.pid, [getattr(signal, n) for n in STOP_SIGNALS])
        time.sleep(0.5)
        assert worker.is_alive()
        os.kill(worker.pid, getattr(signal, name))
        worker.join(30)
        assert worker.exitcode == 128 + getattr(signal, name)
    finally:
        worker.kill()


@linux
def test_a_loader_worker_that_ends_its_work_exits_at_once_despite_its_signal_thread():
    """The thread waiting for the signals is a daemon: a worker process ending joins its other threads, and would
    wait for that one forever (until its parent's ``terminate()``)."""
    worker, _ = _start_worker(linger=False)
    try:
        worker.join(30)
        assert worker.exitcode == 0
    finally:
        worker.kill()


@linux
@pytest.mark.parametrize('without', ['sigwaitinfo', 'signals'])
def test_a_loader_worker_keeps_the_default_signal_behaviour_where_the_platform_cannot_wait_for_signals(without):
    """No ``signal.sigwaitinfo`` (not Linux) or none of the stop signals: nothing blocked, no thread."""
    worker, (threads, blocked) = _start_worker(linger=False, without=without)
    try:
        assert threads == [] and blocked == []
        worker.join(30)
        assert worker.exitcode == 0
    finally:
        worker.kill()
