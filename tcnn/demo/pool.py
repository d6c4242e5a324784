"""The pool of ``tcnn train`` processes that trains a demo's runs: several at once on a CPU (``parallel_layout``),
each run in its own process with its output in ``runs/NAME/log.txt``, in the order their dependencies allow
(``train_all``). Complete runs are not started again, and a stopped demo continues every run from its ``last.pt``.
"""
import contextlib
import dataclasses
import os
import platform
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import TcnnError
from ..files import run_folder
from ..train.distributed import EXIT_INTERRUPTED, EXIT_PREEMPTED, StopRequest
from .plan import Plan

__all__ = ['Context', 'Run', 'DemoStopped', 'parallel_layout', 'loader_workers', 'available_cpus', 'cpu_model',
           'train_all']


@dataclasses.dataclass
class Context:
    """A demo being run: its folder, plan and settings, and where each of its files goes."""

    out: str
    plan: Plan
    device: str
    workers: Optional[int]
    progress: bool
    log: Callable[[str], None]
    jobs: int = 1
    threads: Optional[int] = None  # torch threads per training process (None: torch's default)

    @property
    def data(self) -> str:
        return os.path.join(self.out, 'data')

    def run_dir(self, name: str) -> str:
        return os.path.join(self.out, 'runs', name)

    def model_file(self, name: str) -> str:
        return os.path.join(self.out, 'models', f'{name}.pt')


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo; elsewhere what ``platform`` knows)."""
    try:
        with open('/proc/cpuinfo', encoding='utf-8') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def parallel_layout(device: str, runs: int, jobs: Optional[int] = None,
                    cpus: Optional[int] = None) -> Tuple[int, Optional[int]]:
    """How many training processes run at once and the torch threads of each: ``(jobs, threads)``.

    ``runs``: the fine-tuning runs that could train side by side (seeds x arms). On a CPU, one process per core up to
    that number, each with one thread, whatever the machine: the
    threads of a process change how its sums are split, and so its rounding and every number after it, so a fixed
    count keeps a seed's numbers those of any other machine with the same kernels (docs/demo.md); the demo's small
    model keeps one thread busy, and two threads of one process wait for each other at every layer (measured in
    docs/demo.md). On a GPU, one process at a time with torch's default threads unless ``jobs`` asks for more: then
    each process gets its share of the cores (its threads, and its loader workers, ``loader_workers``), so that
    processes sharing the GPU do not oversubscribe the CPUs that feed it.
    """
    cpus = cpus or available_cpus()
    if device == 'cpu':
        return (jobs or max(1, min(runs, cpus))), 1
    jobs = jobs or 1
    return jobs, (max(1, cpus // jobs) if jobs > 1 else None)


def loader_workers(device: str, threads: Optional[int]) -> Optional[int]:
    """Loader workers per training process where the demo was not given ``--workers``: none for a one-thread CPU
    process (it loads its own images on its own core), one less than its share of the cores for a process that shares
    a GPU with others (the training process keeps a core), and ``tcnn train``'s own choice (None) otherwise."""
    if threads is None:
        return None
    if device == 'cpu':
        return 0 if threads == 1 else None
    return max(1, threads - 1)


class DemoStopped(Exception):
    """A training run of the demo stopped on a signal after saving its checkpoint (``exit_code``: 130 or 75)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclasses.dataclass
class Run:
    """One ``tcnn train`` run of the demo.

    Args:
        name: The run's name (``run_name``).
        argv: Its ``tcnn`` arguments.
        epochs: Its epochs (a run whose ``metrics.jsonl`` has them all is complete and not started again).
        after: The run that must be complete first (a fine-tuning arm's CNN).
        finished: Called in the demo's process when the run is complete.
    """
    name: str
    argv: List[str]
    epochs: int
    after: Optional[str] = None
    finished: Optional[Callable[[], None]] = None


def _epochs(ctx: Context, name: str) -> List[Dict[str, Any]]:
    """The epochs a run has logged so far (none before its first)."""
    path = os.path.join(ctx.run_dir(name), run_folder.METRICS_FILE)
    return run_folder.read_metrics(path) if os.path.isfile(path) else []


def _complete(ctx: Context, run: Run) -> bool:
    return (os.path.isfile(os.path.join(ctx.run_dir(run.name), run_folder.LAST_CHECKPOINT))
            and len(_epochs(ctx, run.name)) >= run.epochs)


def _log_tail(path: str, lines: int = 1) -> str:
    try:
        with open(path, encoding='utf-8', errors='replace') as f:
            return ' | '.join(line.strip() for line in f.read().strip().splitlines()[-lines:])
    except OSError:
        return ''


class _Process:
    """A running ``tcnn train`` process, its output appended to ``runs/NAME/log.txt``."""

    def __init__(self, ctx: Context, run: Run):
        self.run, self.ctx = run, ctx
        os.makedirs(ctx.run_dir(run.name), exist_ok=True)
        self.log_path = os.path.join(ctx.run_dir(run.name), 'log.txt')
        env = dict(os.environ)
        if ctx.threads is not None:
            env['OMP_NUM_THREADS'] = env['MKL_NUM_THREADS'] = str(ctx.threads)
        self.epochs_seen = len(_epochs(ctx, run.name))
        self.start = time.perf_counter()
        with open(self.log_path, 'a', encoding='utf-8') as log:
            log.write(f'== tcnn {" ".join(run.argv)}\n')
            log.flush()
            # its own session: a Ctrl-C in the terminal reaches the demo only, which forwards it once (a second
            # signal to a training process would stop it without its checkpoint)
            self.proc = subprocess.Popen([sys.executable, '-m', 'tcnn', *run.argv], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)

    def new_epochs(self) -> List[Dict[str, Any]]:
        rows = _epochs(self.ctx, self.run.name)
        new, self.epochs_seen = rows[self.epochs_seen:], len(rows)
        return new

    def signal(self, name: str) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(getattr(signal, name))


def train_all(ctx: Context, runs: Sequence[Run], timings: Dict[str, float]) -> None:
    """Every training run, ``ctx.jobs`` ``tcnn train`` processes at a time, in order as their ``after`` allows
    (each seed's CNN first, so its arms can start as soon as a process is free).

    Complete runs are not started again. A signal to the demo (Ctrl-C, SIGTERM) is passed once to every running
    process, which stops at its next update boundary and saves its checkpoint; the demo then raises
    ``DemoStopped``, and the same command continues it. A run that fails stops the others the same way.
    """
    pending = list(runs)
    done = set()
    running: List[_Process] = []
    total = sum(r.epochs for r in runs)
    epochs_done = 0
    for run in runs:
        if _complete(ctx, run):
            pending.remove(run)
            done.add(run.name)
            epochs_done += run.epochs
            if run.finished:
                run.finished()
    failed: Optional[str] = None
    forwarded = False
    with StopRequest() as stop:
        try:
            while pending or running:
                while not stop.requested and failed is None and len(running) < ctx.jobs:
                    ready = next((r for r in pending if r.after is None or r.after in done), None)
                    if ready is None:
                        break
                    pending.remove(ready)
                    running.append(_Process(ctx, ready))
                    epochs_done += running[-1].epochs_seen
                    ctx.log(f'== {ready.name}: tcnn {" ".join(ready.argv)}\n   (output in '
                            f'{running[-1].log_path})')
                if not running:
                    break
                time.sleep(0.5)
                for p in list(running):
                    for row in p.new_epochs():
                        epochs_done += 1
                        ctx.log(f'{p.run.name}: epoch {row["epoch"] + 1}/{p.run.epochs}, val top-1 '
                                f'{row["val_top1"]:.1f}%, {row["epoch_time_s"]:.0f} s [{epochs_done}/{total} '
                                f'epochs of the demo]')
                    rc = p.proc.poll()
                    if rc is None:
                        continue
                    running.remove(p)
                    timings[p.run.name] = timings.get(p.run.name, 0.0) + time.perf_counter() - p.start
                    # after a stop request, a process that the signal reached before it could install its
                    # handlers (still importing) ends killed by it: stopped too, its run continues from its last
                    # checkpoint
                    stopped = rc in (EXIT_INTERRUPTED, EXIT_PREEMPTED) or (forwarded and rc < 0)
                    if rc == 0 and _complete(ctx, p.run):
                        done.add(p.run.name)
                        if p.run.finished:
                            p.run.finished()
                    elif not stopped and failed is None:
                        failed = (f'training {p.run.name} failed (exit {rc}): {_log_tail(p.log_path)} (its log: '
                                  f'{p.log_path})')
                        for other in running:
                            other.signal('SIGTERM')
                if stop.requested and not forwarded:
                    forwarded = True
                    for p in running:
                        p.signal(stop.signal_name)
        except KeyboardInterrupt:  # a second Ctrl-C: pass it on, the processes stop without a new checkpoint
            for p in running:
                p.signal('SIGINT')
            for p in running:
                p.proc.wait()
            raise DemoStopped('interrupted; run the same tcnn demo command again to continue the demo (each '
                              'training run from its last checkpoint)', EXIT_INTERRUPTED) from None
    if failed:
        raise TcnnError(f'{failed}; the demo so far is in {ctx.out}')
    if stop.requested:
        raise DemoStopped('stopped: every training run saved its checkpoint; run the same tcnn demo command again '
                          'to continue the demo where it stopped', stop.exit_code)
