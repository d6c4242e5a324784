"""The ``tcnn`` command: one sub-command per module of ``tcnn.commands``, and ``tcnn demo`` (``tcnn.demo.command``).

The table below names each command's module, imported when that command runs: the CLI itself imports nothing of
tcnn but its errors. The demo's module lives in its own package because the demo runs the other commands (``tcnn
eval``, ``tcnn inspect`` through ``main``, ``tcnn train`` as processes): it is the one command above the command line.

Each command module defines ``add_arguments(parser)`` and ``run(args) -> int``. User mistakes raise ``TcnnError``
and are printed as one line (exit 2); ``--debug`` shows the traceback instead.
"""
import argparse
import importlib
import sys
import warnings
from typing import List, Optional

from .errors import TcnnError

# name -> (module, one-line help). Modules are imported only when their command runs, so --help stays fast.
COMMANDS = {
    'demo': ('tcnn.demo.command', 'the whole method offline on a generated task: CNN, T-CNN, baseline, report'),
    'convert': ('tcnn.commands.convert', 'convert a CNN into a T-CNN file (verified against the CNN)'),
    'info': ('tcnn.commands.info', 'show the settings, parameter counts and gates/spans of a T-CNN file'),
    'train': ('tcnn.commands.train', 'fine-tune a T-CNN (or the no-SA baseline) with a recipe'),
    'inspect': ('tcnn.commands.inspect', 'gates, spans, nonlocality and attention-map figures of a T-CNN'),
    'plot': ('tcnn.commands.plot', 'training curves (accuracy, gates, spans) of a run directory'),
    'eval': ('tcnn.commands.eval', 'accuracy on ImageNet / ImageNet-C / -A / -R layouts'),
    'publish': ('tcnn.commands.publish', 'write a T-CNN as a Hugging Face Hub folder with a model card (and push it)'),
    'export': ('tcnn.commands.export', 'export a T-CNN to ONNX or torch.export (.pt2), checked against PyTorch'),
}


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='tcnn', description='Transformed CNNs: CNN -> CNN + self-attention.')
    parser.add_argument('--debug', action='store_true', help='show tracebacks of errors')
    sub = parser.add_subparsers(dest='command', metavar='COMMAND')
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument('--debug', action='store_true', default=argparse.SUPPRESS, help='show tracebacks of errors')
        if name == command:  # only the command being run pays for its imports
            importlib.import_module(module).add_arguments(p)
    return parser


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f'tcnn: warning: {message}\n'


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if '--debug' not in argv:
        warnings.formatwarning = _one_line_warning  # users get a line, not a source location
    command = next((a for a in argv if not a.startswith('-')), None)
    parser = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)
    except TcnnError as e:
        if args.debug:
            raise
        print(f'tcnn {args.command}: error: {e}', file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f'tcnn {args.command}: interrupted', file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `tcnn info --json FILE | head`: the reader left, nothing to report
        sys.stdout = None  # stop the interpreter flushing into the closed pipe at exit
        return 0


if __name__ == '__main__':
    sys.exit(main())
