"""``tcnn plot RUN_DIR``: training curves of a run (T-CNN, arXiv:2106.05795, Fig. 4) from ``RUN_DIR/metrics.jsonl``."""
import argparse
import os

from .arguments import add_out


FIGURE_SUFFIXES = ('.png', '.pdf', '.svg')


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('run', metavar='RUN_DIR', help='a tcnn train output folder (or its metrics.jsonl)')
    add_out(parser, 'the figure to write, .png/.pdf/.svg (default RUN_DIR/curves.png)')
    parser.add_argument('--title', help='figure title (default: the run folder name)')


def run(args: argparse.Namespace) -> int:
    from ..evaluation.plots import load_metrics, plot_training_curves
    from ..paths import check_output_file
    run_dir = args.run if os.path.isdir(args.run) else os.path.dirname(os.path.abspath(args.run))
    out = check_output_file(args.out or os.path.join(run_dir, 'curves.png'), '--out', FIGURE_SUFFIXES)
    records = load_metrics(args.run)
    title = args.title or os.path.basename(os.path.normpath(os.path.abspath(run_dir)))
    plot_training_curves(records, out, title=title)
    val = [(r['val_top1'], r['epoch']) for r in records if isinstance(r.get('val_top1'), (int, float))]
    line = f'{len(records)} epochs'
    if val:
        best, epoch = max(val)
        line += f', best val top-1 {best:.2f} (epoch {epoch + 1}), last {val[-1][0]:.2f}'
    print(line)
    print(f'wrote {out}')
    return 0
