"""``tcnn demo``: the whole method end to end on a generated task, offline (see ``tcnn.demo``)."""
import argparse

from ..commands.arguments import add_device, add_out
from ..errors import InvalidArgumentError, check_device, check_number
from .plan import PLANS

DEFAULT_OUT = 'tcnn-demo'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_out(parser, f'the folder to write the demo to (default ./{DEFAULT_OUT}); run the same command again to '
                    'continue an interrupted demo', folder=True)
    parser.add_argument('--quick', action='store_true',
                        help='a smoke run of about a minute (small data, 2 fine-tuning epochs, one seed): '
                             '--plan quick')
    parser.add_argument('--plan', choices=list(PLANS),
                        help='sizes and schedules: default (the result, about 13 minutes on 2 CPU cores), quick (a '
                             'smoke run), paper (the paper\'s 50 fine-tuning epochs, 3 seeds; a GPU\'s job, hours '
                             'on a CPU) or tiny (a check of the pipeline, no result)')
    parser.add_argument('--seeds', type=int, metavar='N',
                        help=f'seeds, each fine-tuning its own converged CNN with and without self-attention '
                             f'(default {PLANS["default"].seeds}; 1 with --quick); tcnn ships converged CNNs for '
                             'seeds 0-9, --train-cnns trains any number')
    parser.add_argument('--train-cnns', action='store_true',
                        help='train the CNNs from scratch to their plateau here (as the shipped ones were made: '
                             'about 7 minutes per CNN and core) instead of fine-tuning the converged CNNs tcnn ships')
    # The CPU unless asked: the default plan's schedule and the distribution its report places each number in
    # (docs/demo.md) were measured on CPU cores; a GPU is one flag away (--device auto or cuda)
    add_device(parser, default='cpu')
    parser.add_argument('--workers', type=int, metavar='N',
                        help='data-loading processes per training run (default: none for a one-thread run, else '
                             'sized to the machine)')
    parser.add_argument('--jobs', type=int, metavar='N',
                        help='training runs at once (default: on CPU one per core, at most one per seed, the cores '
                             'shared out as threads; 1 on a GPU)')
    parser.add_argument('--no-progress', action='store_true', help='no progress bars (log lines only)')


def run(args: argparse.Namespace) -> int:
    if args.seeds is not None:
        check_number(args.seeds, '--seeds', ge=1, integer=True)
    if args.workers is not None:
        check_number(args.workers, '--workers', ge=0, integer=True)
    if args.jobs is not None:
        check_number(args.jobs, '--jobs', ge=1, integer=True)
    from ..runtime.devices import default_device
    # the training processes are given a device by name: 'auto' is resolved here, once for all of them
    device = default_device() if args.device == 'auto' else args.device
    check_device(device, '--device')
    if args.quick and args.plan not in (None, 'quick'):
        raise InvalidArgumentError(f'--quick is --plan quick: give one of --quick and --plan {args.plan}')
    plan = 'quick' if args.quick else args.plan or 'default'
    import sys
    from ..allocator import keep_freed_memory
    from . import DemoStopped, run_demo
    keep_freed_memory()  # its own evaluations, and (through the environment) the training processes it starts
    try:
        run_demo(args.out or DEFAULT_OUT, plan=plan, seeds=args.seeds, train_cnns=args.train_cnns, device=device,
                 workers=args.workers, jobs=args.jobs, progress=not args.no_progress)
    except DemoStopped as e:
        print(f'tcnn demo: {e}', file=sys.stderr)
        return e.exit_code
    return 0
