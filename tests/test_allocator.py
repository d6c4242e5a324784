"""Tests of ``tcnn.allocator``: a training process keeps the memory a step frees for the next step (glibc's malloc,
tuned by ``keep_freed_memory``), which the long-running commands turn on and a user can turn off."""
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from tcnn import allocator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLIBC = platform.system() == 'Linux' and platform.libc_ver()[0] == 'glibc'

# A training step's pattern: activations of many sizes allocated, then freed together; the page faults of ten more
# steps after the first are what the kernel charges for handing the memory back and faulting it in again.
STEPS = textwrap.dedent('''
    import resource, sys, torch
    from tcnn.allocator import keep_freed_memory
    applied = keep_freed_memory()
    sizes = [1 << k for k in range(14, 23)] * 4  # 64 KiB .. 16 MiB of float32, four of each
    def step():
        xs = [torch.ones(n) for n in sizes]
        del xs
    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        step()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, sorted(applied))
''')


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith('MALLOC_') and k != allocator.OPT_OUT}
    env['PYTHONPATH'] = ROOT + os.pathsep + env.get('PYTHONPATH', '')
    return dict(env, **extra)


def _steps(**extra):
    out = subprocess.run([sys.executable, '-c', STEPS], env=_env(**extra), capture_output=True, text=True,
                         check=True).stdout.split(maxsplit=1)
    return int(out[0]), out[1].strip()


@pytest.mark.skipif(not GLIBC, reason='the tuning is glibc malloc\'s; other C libraries are left alone')
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    faults_system, applied_system = _steps(TCNN_MALLOC='system')
    faults_kept, applied_kept = _steps()
    assert applied_system == '[]' and 'MALLOC_TRIM_THRESHOLD_' in applied_kept
    pages = 10 * sum(4 << k for k in range(14, 23)) * 4 // 4096  # what ten steps touch: 327,000 pages
    # measured: 64-8,192 faults kept, in steps of the largest block's 4,096 pages (the heap's high-water mark still
    # rises in the first steps after the warm-up when a 16 MiB block lands above it: 0 after three warm-up steps);
    # with glibc's defaults 35,000-314,000 (how much it trims depends on where Python's own objects land in the heap)
    assert faults_kept < 0.04 * pages and faults_kept < 0.5 * faults_system, (faults_kept, faults_system, pages)


@pytest.mark.skipif(not GLIBC, reason='the tuning is glibc malloc\'s; other C libraries are left alone')
def test_the_users_own_malloc_settings_win(monkeypatch):
    monkeypatch.setenv('MALLOC_TRIM_THRESHOLD_', '131072')
    assert allocator.keep_freed_memory() == {}
    monkeypatch.delenv('MALLOC_TRIM_THRESHOLD_')
    monkeypatch.setenv(allocator.OPT_OUT, 'system')
    assert allocator.keep_freed_memory() == {}


# Each program, run as a process: its arguments (--print-config: done before any work), then what its process's
# environment holds afterwards (what the processes it starts inherit)
PROGRAMS = {
    'tcnn train': 'from tcnn.cli import main; main(["train", "--print-config"])',
    'python -m tcnn.train': ('import runpy, sys; sys.argv = ["tcnn.train", "--print-config"]\n'
                             'try:\n    runpy.run_module("tcnn.train", run_name="__main__", alter_sys=True)\n'
                             'except SystemExit:\n    pass'),
}


@pytest.mark.parametrize('program', list(PROGRAMS))
def test_the_training_programs_turn_it_on(program):
    """``tcnn train`` and ``python -m tcnn.train`` (what torchrun starts) tune their process and pass it on to the
    processes they start (``tcnn.train.main`` called from Python does not: the next test)."""
    code = PROGRAMS[program] + '\nimport os; print("TOP_PAD", os.environ.get("MALLOC_TOP_PAD_"))'
    out = subprocess.run([sys.executable, '-c', code], env=_env(), capture_output=True, text=True, check=True).stdout
    expected = str(allocator.MALLOC_SETTINGS['MALLOC_TOP_PAD_'][1]) if GLIBC else 'None'
    assert 'model: ' in out and f'TOP_PAD {expected}' in out, out[-300:]


def test_a_training_run_through_the_python_api_leaves_malloc_and_the_environment_alone(data_dir, tmp_path,
                                                                                       monkeypatch):
    """In this process: ``tcnn.train.main`` with ``--print-config`` and a whole one-epoch run (loader workers
    included) calls no ``mallopt`` and adds no ``MALLOC_*`` variable."""
    import tcnn.train
    environ = {k: v for k, v in os.environ.items() if not k.startswith('MALLOC_') and k != allocator.OPT_OUT}
    monkeypatch.setattr(os, 'environ', environ)
    calls = []

    class Libc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1
    monkeypatch.setattr(allocator, '_glibc', lambda: Libc())
    assert tcnn.train.main(['--print-config']) == 0
    assert tcnn.train.main(['--data', data_dir, '--output', str(tmp_path / 'run'), '--model', 'resnet18d',
                            '--no-pretrained', '--epochs', '1', '--batch-size', '4', '--img-size', '32',
                            '--workers', '1', '--no-progress', '--no-sa', '--device', 'cpu']) == 0
    assert (tmp_path / 'run' / 'last.pt').is_file()
    assert calls == [] and not [k for k in os.environ if k.startswith('MALLOC_')]
    assert allocator.keep_freed_memory() and len(calls) == len(allocator.MALLOC_SETTINGS)  # the spy sees a call


def test_tcnn_demo_turns_it_on_for_its_training_processes(monkeypatch, tmp_path):
    import tcnn.demo
    from tcnn.cli import build_parser
    from tcnn.demo import command
    environ = {k: v for k, v in os.environ.items() if not k.startswith('MALLOC_') and k != allocator.OPT_OUT}
    monkeypatch.setattr(os, 'environ', environ)  # what the demo sets stays out of this process's environment
    seen = {}
    monkeypatch.setattr(tcnn.demo, 'run_demo', lambda *a, **k: seen.update(os.environ))
    assert command.run(build_parser('demo').parse_args(['demo', '--out', str(tmp_path / 'demo')])) == 0
    assert ('MALLOC_TOP_PAD_' in seen) == GLIBC


class _Libc:
    """A C library's stand-in that records ``mallopt``'s calls and answers ``result`` (glibc: 1 on success)."""

    def __init__(self, result=1, refuse=()):
        self.calls, self.result, self.refuse = [], result, refuse

    def mallopt(self, param, value):
        self.calls.append((param.value, value.value))
        return 0 if param.value in self.refuse else self.result


def test_each_setting_goes_to_mallopt_and_the_applied_ones_to_the_environment(monkeypatch):
    """mallopt gets each parameter with its value; only those it accepted (1) are returned and exported as glibc's
    tunables (their decimal values), so that processes started afresh get the same settings."""
    # a copy of the environment, not an empty one: mutmut's mutation tests switch mutants on through it
    environ = {k: v for k, v in os.environ.items() if not k.startswith('MALLOC_') and k != allocator.OPT_OUT}
    monkeypatch.setattr(os, 'environ', environ)
    libc = _Libc(refuse={-2})  # M_TOP_PAD refused
    monkeypatch.setattr(allocator, '_glibc', lambda: libc)
    applied = allocator.keep_freed_memory()
    assert libc.calls == [(-4, 0), (-3, 32 * 2 ** 20), (-1, 2 ** 31 - 1), (-2, 256 * 2 ** 20)]
    assert applied == {'MALLOC_MMAP_MAX_': 0, 'MALLOC_MMAP_THRESHOLD_': 33554432,
                       'MALLOC_TRIM_THRESHOLD_': 2147483647}
    exported = {k: v for k, v in environ.items() if k.startswith('MALLOC_')}
    assert exported == {'MALLOC_MMAP_MAX_': '0', 'MALLOC_MMAP_THRESHOLD_': '33554432',
                        'MALLOC_TRIM_THRESHOLD_': '2147483647'}


def test_only_glibc_on_linux_is_tuned(monkeypatch):
    """musl on Linux and other systems' C libraries are left alone: ``_glibc`` opens nothing there."""
    opened = []
    monkeypatch.setattr(allocator.ctypes, 'CDLL', lambda name: opened.append(name) or _Libc())
    for system, libc in (('Linux', ('musl', '')), ('Darwin', ('', '')), ('Windows', ('', '')),
                         ('Darwin', ('glibc', '2.39'))):
        monkeypatch.setattr(allocator.platform, 'system', lambda: system)
        monkeypatch.setattr(allocator.platform, 'libc_ver', lambda: libc)
        assert allocator._glibc() is None, (system, libc)
    assert opened == []
    monkeypatch.setattr(allocator.platform, 'system', lambda: 'Linux')
    monkeypatch.setattr(allocator.platform, 'libc_ver', lambda: ('glibc', '2.39'))
    assert isinstance(allocator._glibc(), _Libc) and len(opened) == 1


def test_the_c_library_is_the_one_ctypes_finds_else_glibcs_soname(monkeypatch):
    """The library ctypes finds for ``c`` (its soname differs on some architectures: libc.so.6.1 on IA-64), else
    ``libc.so.6``; a library without ``mallopt``, or one that does not open, is no glibc to tune."""
    monkeypatch.setattr(allocator.platform, 'system', lambda: 'Linux')
    monkeypatch.setattr(allocator.platform, 'libc_ver', lambda: ('glibc', '2.39'))
    opened, found = [], {'c': 'libc.so.6.1'}
    monkeypatch.setattr(allocator.ctypes.util, 'find_library', lambda name: found.get(name))
    monkeypatch.setattr(allocator.ctypes, 'CDLL', lambda name: opened.append(name) or _Libc())
    assert isinstance(allocator._glibc(), _Libc)
    found.clear()
    assert isinstance(allocator._glibc(), _Libc)
    assert opened == ['libc.so.6.1', 'libc.so.6']
    monkeypatch.setattr(allocator.ctypes, 'CDLL', lambda name: object())  # no mallopt
    assert allocator._glibc() is None

    def missing(name):
        raise OSError(f'{name}: cannot open shared object file')
    monkeypatch.setattr(allocator.ctypes, 'CDLL', missing)
    assert allocator._glibc() is None
