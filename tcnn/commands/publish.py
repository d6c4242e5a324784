"""``tcnn publish FILE --out DIR [--push ORG/NAME]``: a T-CNN as a Hugging Face Hub folder, the timm way.

DIR gets timm's ``config.json`` and ``model.safetensors`` (``timm.models.save_for_hf``) and a model card
``README.md`` (``tcnn.files.hub_folder``, ``tcnn.evaluation.model_card``); ``timm.create_model('local-dir:DIR',
pretrained=True)`` (with ``import tcnn``) and
``tcnn.load(DIR)`` rebuild the T-CNN from it. ``--push`` uploads it with timm's ``push_to_hf_hub``, after DIR is
written, so an upload that fails (offline, not logged in) leaves DIR to upload later.
"""
import argparse
import os
import re

from ..errors import TcnnError
from .arguments import add_out, file_size_text

__all__ = ['add_arguments', 'run', 'REPO_ID']

REPO_ID = re.compile(r'[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*')  # the Hub's ORG/NAME


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('file', metavar='FILE',
                        help='a T-CNN file (tcnn convert, tcnn.save), a training checkpoint (RUN/best.pt, '
                             'RUN/last.pt) or a tcnn train run folder (its best.pt, else last.pt; the card then '
                             'shows the recipe and the metrics)')
    add_out(parser, 'the Hub folder to write: config.json, model.safetensors, README.md (a new or empty folder, or one '
                    'tcnn publish wrote before, which is replaced)', folder=True, required=True)
    parser.add_argument('--push', metavar='ORG/NAME',
                        help="also upload to the Hugging Face Hub with timm's push_to_hf_hub (network and a token: "
                             '`hf auth login` or HF_TOKEN); the card is uploaded when the repo has no README.md yet')
    parser.add_argument('--private', action='store_true', help='with --push: create the repo private')


def run(args: argparse.Namespace) -> int:
    from ..paths import check_input_file, check_replaceable_dir
    if args.push is not None and not REPO_ID.fullmatch(args.push):
        raise TcnnError(f'--push takes a Hub repo id ORG/NAME (e.g. my-org/t_resnet50d), got {args.push!r}')
    if args.private and args.push is None:
        raise TcnnError('--private applies to --push ORG/NAME only')
    out = check_replaceable_dir(args.out, 'config.json')  # before torch loads: a wrong path costs nothing
    if not os.path.isdir(args.file):
        check_input_file(args.file, 'FILE')

    from ..evaluation import model_card
    from ..files import hub_folder

    model, d, metrics = hub_folder.read_published(args.file)
    # the card names the folder by its name only: the machine's paths stay on the machine
    location = f'hf-hub:{args.push}' if args.push else f'local-dir:{os.path.basename(out)}'
    card = model_card.model_card(model, d, metrics, location=location)
    config = model_card.hub_config(model, d)
    hub_folder.write_folder(model, out, card, config)
    report = getattr(model, 'tcnn_report', None)
    training = d.get('training')
    lines = [f'{args.file} -> {out}',
             f'  model       {model.pretrained_cfg["architecture"]} ({d["source"]["model"]}), '
             f'{len(model.tcnn_config["layers"])} GPSA layers in {", ".join(model.tcnn_config["stages"])}',
             '  verified    ' + (f'max rel err {report.max_rel_err:.2g} in the exact configuration' if report else
                                 'not recorded (the card says so)')]
    if training:
        best = training.get('best_top1')
        lines.append(f'  training    epoch {training.get("epoch", -1) + 1}'
                     + (f', best top-1 {best:.2f}%' if isinstance(best, float) else '')
                     + (f', {len(metrics)} epochs in metrics.jsonl' if metrics else ''))
    weights = file_size_text(os.path.join(out, 'model.safetensors'))
    lines += [f'  wrote       config.json, model.safetensors ({weights}), README.md',
              f"  load with   import tcnn; timm.create_model('local-dir:{out}', pretrained=True)"]
    print('\n'.join(lines), flush=True)
    if args.push:
        url = hub_folder.push(model, args.push, card, config, private=args.private)
        print(f"  pushed      {url}\n  load with   timm.create_model('hf-hub:{args.push}', pretrained=True)")
    return 0
