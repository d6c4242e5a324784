r"""Mutation testing of tcnn, one module at a time, with the test files that own it (scores and method: docs/tests.md).

A developer's command, not part of CI: mutmut (``pip install -e '.[test,mutation]'``) changes one operator, constant or
argument of a module at a time (a mutant) and runs the module's owning tests on it; a mutant no test notices survives.
Each survivor is then killed by a test, or listed in ``tools/mutation_testing/equivalent.tsv`` with the reason it
cannot change behaviour. Each module runs in its own copy of the repository, ``mutants/MODULE/`` (ignored by git).

    python tools/mutation.py list                          # the modules, their files and owning tests
    nice -n 19 python tools/mutation.py run integrity      # one module; several names run one after the other
    python tools/mutation.py report integrity              # the counts and every survivor of the last run
    python tools/mutation.py save augment                  # the copy's results into git (state/augment.json): a
                                                           # later session's run starts from them
    nice -n 19 python tools/mutation.py recheck recipe     # the last run's survivors again, one fresh process each
                                                           # (--tests: those tests instead of the owning ones)
    nice -n 19 python tools/mutation.py resume tcnn_file   # go on with an interrupted run (the mutants left; the
                                                           # sources and tests as they are now: changed functions
                                                           # run again)
    python tools/mutation.py check tcnn_file tests/test_checkpoint_files.py::test_x \
        --only 'tcnn.files.tcnn_file.x__with_ema__*'       # which of those mutants a test kills (one process,
                                                           # mutmut's switch)
    python tools/mutation.py check-later layers            # the survivors against the owning tests the run left out
    python tools/mutation.py check-scripted layers tests/test_gpsa.py \
        --only 'tcnn.layers.gpsa.x__forward_path__*'       # mutants of what only TorchScript runs: TorchScript on
    python tools/mutation.py cuda --smoke                  # the CUDA-only mutants' machinery, on the CPU

``python tools/mutation.py COMMAND --help`` explains each command.
"""
import argparse
import json
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from mutation_testing import copies, cuda, rechecks, runs, state, switched, verdicts
from mutation_testing.modules import LATER, MODULES

# command -> (its line in the list of commands, what it does: its --help)
COMMANDS = {
    'list': ('the modules, their files and owning tests',
             'Each module of the campaign: the files its run mutates <- the test files (or node IDs) that own them, '
             'and the extra pytest arguments of its runs.'),
    'run': ('run mutmut on modules, each in a fresh copy',
            "A fresh copy of the repository under mutants/MODULE/ with the results saved in git "
            "(tools/mutation_testing/state/MODULE.json; none with --fresh), then mutmut's run of every mutant of the "
            'module without a result (the mutants of functions changed since their result run again) against the '
            "owning tests that call its function; saves the results and prints the report. mutmut's output goes to "
            'mutants/MODULE/mutmut.log.'),
    'resume': ('go on with an interrupted run',
               "The mutants without a result, in the run's copy refreshed with the repository's sources and tests "
               'as they are now (mutmut runs again the mutants of the functions changed since); the owning tests '
               'and arguments stay those the run started with. Prints the report.'),
    'recheck': ("the last run's survivors again, one fresh process each",
                "Each survivor (and 'no tests' mutant) written into the copy's source (mutmut apply), the owning tests "
                'as they are now run in a new process (pytest -x, at most 15 minutes), the source restored: catches '
                'mutants of code that runs at import, which mutmut never switches on, and the survivors that tests '
                'written since kill. Verdicts go to recheck.json beside the run; prints the report.'),
    'check': ('which mutants these tests kill, in one process',
              "The given tests, as they are now, against the last run's mutants (those matching --only; all "
              "without), each switched on as mutmut does (MUTANT_UNDER_TEST) in one process: to check the tests "
              "written for survivors. The survivors they kill count as killed (recheck.json, as each comes); a mutant "
              "whose tests run past 120 s is a timeout. Prints {mutant: verdict}."),
    'check-later': ('the survivors against the owning tests the run left out',
                    "The last run's survivors against the owning tests that the module's runs leave out for their "
                    'time (LATER), as check runs them.'),
    'check-scripted': ('which survivors these tests kill with TorchScript on',
                       "Each survivor matching --only (all without) applied to the copy's source as recheck applies "
                       'it, the given tests run with PYTORCH_JIT=1: mutants of the code only TorchScript runs, which '
                       "a run cannot test (TorchScript compiles no mutmut trampoline). Prints {mutant: verdict}."),
    'save': ("the copy's results into git, for a later session's run",
             "The results in mutants/MODULE/ (mutmut's, and the verdicts of rechecks and checks) written to "
             'tools/mutation_testing/state/MODULE.json, each with the hash of its function: `run` starts from them '
             'and runs again the mutants of the functions changed since. run, resume, recheck and check save on '
             'their own (not with --fresh or --folder); save is for a run stopped before its end.'),
    'report': ("the last run's counts and survivors, without running",
               "Counts by status (mutmut's, the rechecks', the equivalent mutants of "
               'tools/mutation_testing/equivalent.tsv), the wall times and the survivors of the last run, as JSON.'),
    'cuda': ('the mutants only a CUDA device kills, checked on one',
             'Each CUDA-only survivor of the campaign written into a copy of tcnn, its test run in a fresh process '
             '(it must fail there), after the unmutated tests passed without a skip. Exit status 0 when every '
             'mutant got its expected verdict. benchmarks/gpu/third.sh runs it.'),
}


def _module_name(text: str) -> str:
    """``text`` if it names a module of ``MODULES``; argparse's error otherwise."""
    if text not in MODULES:
        raise argparse.ArgumentTypeError(f'unknown module {text!r}: one of {", ".join(MODULES)}')
    return text


def parser() -> argparse.ArgumentParser:
    """The command line: a subcommand each (``COMMANDS``)."""
    main = argparse.ArgumentParser(prog='python tools/mutation.py', description=__doc__.split('\n\n')[0],
                                   epilog=__doc__.split('\n\n', 1)[1],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = main.add_subparsers(dest='command', required=True, metavar='COMMAND')
    commands = {name: sub.add_parser(name, help=short, description=long)
                for name, (short, long) in COMMANDS.items()}
    modules = dict(type=_module_name, metavar='MODULE', help=f'of {", ".join(MODULES)}')
    for name in ('run', 'resume', 'recheck', 'check-later', 'report', 'save'):
        commands[name].add_argument('modules', nargs='+', **modules)
    for name in ('check', 'check-scripted'):
        commands[name].add_argument('module', **modules)
        commands[name].add_argument('tests', nargs='+', metavar='TEST', help='pytest node IDs or test files')
    only = {'run': 'only these mutants (name patterns, e.g. tcnn.convert.stages.*): a sample, to measure the time '
                   'per mutant',
            'resume': 'only these mutants (name patterns)',
            'recheck': 'only the survivors matching these name patterns (the others keep an earlier verdict)',
            'check': "the last run's mutants to check (name patterns; default: all)",
            'check-scripted': 'the survivors to check (name patterns; default: all)'}
    for name, text in only.items():
        commands[name].add_argument('--only', nargs='+', default=(), metavar='PATTERN', help=text)
    commands['recheck'].add_argument('--tests', nargs='+', default=(), metavar='TEST',
                                     help='these pytest node IDs (or files) instead of the owning tests')
    for name in ('run', 'resume'):
        commands[name].add_argument('--max-children', type=int, default=1, metavar='N',
                                    help='mutants tested at once (default 1)')
        commands[name].add_argument('--killers-first', action='store_true',
                                    help="each mutant's tests in tools/mutation_testing/copy_conftest.py's order "
                                         "(earlier killers of its function first, then the fastest), not mutmut's")
    for name in ('run', 'resume', 'recheck', 'check', 'check-later', 'check-scripted', 'report', 'save'):
        commands[name].add_argument('--folder', metavar='NAME',
                                    help="the copy's folder under mutants/ (default: the module's name): a second "
                                         'copy, e.g. to time a sample in both orders at once')
    commands['run'].add_argument('--fresh', action='store_true',
                                 help='without the results saved in git: every mutant runs (and nothing is saved)')
    commands['cuda'].add_argument('--smoke', action='store_true',
                                  help='check the machinery on the CPU (no GPU needed)')
    commands['cuda'].add_argument('--json', type=Path, metavar='PATH',
                                  help='write the verdicts, times and test output tails here (after each verdict)')
    commands['cuda'].add_argument('--jobs', type=int, default=1, metavar='N',
                                  help='mutants tested at once, each test a process of its own (default 1)')
    return main


def _print(value: object) -> None:
    """``value`` as indented JSON on stdout, as every command prints its result."""
    print(json.dumps(value, indent=1))


def _checked(module: str, patterns: Sequence[str], tests: Sequence[str]) -> None:
    """``switched.check``'s verdicts printed; the run's survivors they kill count as killed by a test written since,
    as a recheck's (``recheck.json``)."""
    survivors = {n for n, (status, _) in verdicts.results(module, rechecked=False).items()
                 if status in (*verdicts.SURVIVING, 'equivalent')}  # 'suspicious' and 'timeout' too

    def record(name: str, verdict: str) -> None:  # each at once: a check stopped half-way keeps what it found
        if verdict in ('killed', 'timeout') and name in survivors:
            verdicts.record(module, {name: verdict})

    _print(switched.check(module, patterns, tests, on_verdict=record))


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command line ``argv`` (``sys.argv[1:]`` without); returns the exit status."""
    args = parser().parse_args(argv)
    if args.command == 'list':
        for name, (files, tests, pytest_args) in MODULES.items():
            print(f'{name}: {" ".join(files)} <- {" ".join(tests + pytest_args)}')
        return 0
    if args.command == 'cuda':
        return cuda.check_all(args.smoke, args.json, args.jobs)
    names = args.modules if hasattr(args, 'modules') else [args.module]
    if args.folder:
        copies.FOLDERS.update({module: args.folder for module in names})
    status = 0
    for module in names:
        if args.command not in ('run', 'resume') and not copies.has_run(module):
            print(f'{module}: no run in {copies.folder(module)}: start one with `python tools/mutation.py run '
                  f'{module}`', file=sys.stderr)
            status = 1
            continue
        if args.command == 'check-later':
            if module not in LATER:
                print(f'{module} runs all its owning tests: nothing was left for later', file=sys.stderr)
                status = 1
                continue
            survivors = verdicts.report(module)['survivors']
            if not survivors:
                print(f'{module}: no survivors to check')
                continue
            _checked(module, survivors, LATER[module])
        elif args.command == 'save':
            print(f'{module}: saved to {state.save(module).relative_to(copies.ROOT)}')
        elif args.command == 'check':
            _checked(module, args.only or ['*'], args.tests)
        elif args.command == 'check-scripted':
            _print(rechecks.check_scripted(module, args.only, args.tests))
        else:
            if args.command == 'recheck':
                start = time.monotonic()
                rechecks.recheck(module, args.only, args.tests)
                (copies.folder(module) / 'recheck_time_s').write_text(f'{time.monotonic() - start:.0f}\n')
            elif args.command in ('run', 'resume'):
                runs.run(module, args.max_children, args.only, args.killers_first, resume=args.command == 'resume',
                         fresh=getattr(args, 'fresh', False))
            _print(verdicts.report(module))
        if args.command in ('run', 'resume', 'recheck', 'check', 'check-later', 'check-scripted') and not (
                args.folder or getattr(args, 'fresh', False)):
            state.save(module)  # a later session's run starts from these results
    return status


if __name__ == '__main__':
    sys.exit(main())
