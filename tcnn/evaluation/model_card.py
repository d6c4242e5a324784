"""The model card of a published T-CNN, and tcnn's facts in its config.json.

The card is timm's own ``generate_readme`` (the card ``push_to_hf_hub`` uploads) made from what tcnn knows of the
model: the source CNN and where its weights came from, the conversion's verified error, the settings, the recipe and
metrics of the ``tcnn train`` run it comes from, and the gates and spans of every GPSA layer (T-CNN, arXiv:2106.05795,
Fig. 4). ``hub_config`` gives the same facts as plain values for config.json (``tcnn.files.hub_folder.CONFIG_KEY``).
"""
import math
import os
from typing import Any, Dict, List, Sequence, Tuple

import timm
import torch
import torch.nn as nn

from ..data.config import data_config
from ..convert.settings import gpsa_summary
from ..evaluation.tables import format_markdown
from ..layers.gpsa import EXACT_GATING, EXACT_LOCALITY
from ..train.recipe import Recipe, dump_recipe
from ..version import __version__
from ..files.tcnn_file import report_to_dict

__all__ = ['hub_config', 'model_card', 'PAPER_BIBTEX']

CARD_TAGS = ['image-classification', 'timm', 'tcnn', 'transformed-cnn']
PAPER_URL = 'https://arxiv.org/abs/2106.05795'
PAPER_BIBTEX = """@article{dascoli2021transformed,
  title={Transformed CNNs: recasting pre-trained convolutional layers with self-attention},
  author={d'Ascoli, St{\\'e}phane and Sagun, Levent and Biroli, Giulio and Morcos, Ari},
  journal={arXiv preprint arXiv:2106.05795},
  year={2021}
}"""
# recipe keys that hold paths of the machine the run was on: the card shows their last component only
_PATH_KEYS = ('data', 'output', 'weights')
# metrics of a tcnn train epoch shown in the card, with their labels
_METRICS = (('val_top1', 'top-1 %'), ('val_top5', 'top-5 %'), ('val_loss', 'val loss'), ('train_loss', 'train loss'),
            ('ema_val_top1', 'EMA top-1 %'))


def _finite(value: Any) -> Any:
    """NaN and infinities as None: config.json is strict JSON."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def hub_config(model: nn.Module, d: Dict[str, Any]) -> Dict[str, Any]:
    """tcnn's facts for config.json (under ``CONFIG_KEY``): versions, source CNN and its weights, conversion
    settings, verified report, training progress (``epochs_completed``, counted from 1 as the card and the console
    count: the checkpoint's 0-based ``epoch`` + 1) and best top-1."""
    training = dict(d.get('training') or {})
    epoch = training.pop('epoch', None)
    training = {**({'epochs_completed': epoch + 1} if isinstance(epoch, int) else {}),
                **{k: _finite(v) for k, v in training.items()}}
    return {
        'tcnn_version': __version__,
        'source': d['source'],
        'conversion': dict(model.tcnn_config),
        'report': report_to_dict(getattr(model, 'tcnn_report', None)),
        'parameters': d.get('parameters'),
        'training': training or None,
    }


def _source_weights(source: Dict[str, Any]) -> str:
    """Where the source CNN's weights came from, in words (with the Hub link of timm's pretrained weights)."""
    origin, name = source.get('weights'), source['model']
    if origin == 'pretrained':
        cfg = timm.models.get_pretrained_cfg(name)
        hub_id = getattr(cfg, 'hf_hub_id', None)
        link = f' ([{hub_id}](https://huggingface.co/{hub_id}))' if hub_id else ''
        return f"timm's pretrained weights of `{name}`{link}"
    if origin == 'random':
        return 'random initialisation (no pretrained weights)'
    if isinstance(origin, str) and origin.startswith('file:'):
        return f'a local checkpoint, `{origin[len("file:"):]}`'
    return 'not recorded (a file written by tcnn 0.3 or earlier)'


def _range(values: Sequence[float]) -> str:
    return f'{sum(values) / len(values):.3f} [{min(values):.3f}, {max(values):.3f}]'


def _report_text(model: nn.Module) -> str:
    """The conversion's verified error, in words."""
    report = getattr(model, 'tcnn_report', None)
    if report is None:
        return ('The conversion was not verified, or its report was not recorded (converted with `--no-verify`, by '
                '`timm.create_model` directly, or by tcnn 0.3 or earlier).')
    shape = 'x'.join(map(str, (report.batch_size, *report.input_size)))
    text = (f'Verified at conversion: with every GPSA layer in the exact configuration (alpha = {EXACT_LOCALITY:g}, '
            f'lambda = {EXACT_GATING:g}, as `tcnn.exact_configuration` sets it) the T-CNN computed the CNN\'s logits '
            f'to a max relative error of {report.max_rel_err:.2g} (max absolute {report.max_abs_err:.2g}) on {shape} '
            f'random {report.dtype} inputs.')
    if report.float64_max_rel_err is not None:
        text += (f' In float64 the error is {report.float64_max_rel_err:.2g}: the float32 figure is the network\'s '
                 'rounding, not the conversion.')
    if report.vacuous:
        text += (' The converted layers hardly changed those logits (e.g. zero-initialised residual branches), so '
                 'the check could not catch a wrong conversion.')
    else:
        text += (f' At the fine-tuning init the T-CNN departed from the CNN by {report.init_max_rel_err:.2g} '
                 '(relative), by design: the heads start "on the verge of locality" (T-CNN section 2).')
    return text


def _conversion_section(model: nn.Module, d: Dict[str, Any]) -> str:
    cfg = model.tcnn_config
    layers = cfg['layers']
    params = d.get('parameters') or {}
    rows = [('stages', ', '.join(map(str, cfg['stages']))),
            ('GPSA layers', f'{len(layers)}: ' + ', '.join(f'`{n}`' for n in layers)),
            ('initial locality strength alpha', f'{cfg["locality_strength"]:g}'),
            ('initial gate lambda', f'{cfg["gating_init"]:g}'),
            ('qk_dim', str(cfg['qk_dim']) if cfg['qk_dim'] else 'default (min(C_in // heads, C_in // groups))')]
    if params.get('total') and params.get('cnn'):
        extra = params['total'] - params['cnn']
        rows.append(('parameters', f'{params["total"] / 1e6:.2f}M (CNN {params["cnn"] / 1e6:.2f}M, '
                                   f'{extra / 1e6:+.2f}M for self-attention)'))
    return '\n'.join(['## Conversion', '', format_markdown(['setting', 'value'], rows), _report_text(model), ''])


def _metrics_rows(record: Dict[str, Any]) -> List[Tuple[str, str]]:
    return [(label, f'{record[key]:.4g}') for key, label in _METRICS if isinstance(record.get(key), (int, float))]


def _training_section(d: Dict[str, Any], metrics: List[Dict[str, Any]]) -> str:
    """The recipe and final metrics of the ``tcnn train`` run the model comes from ('' when it does not)."""
    training, stored = d.get('training'), d.get('recipe')
    if training is None:
        return ''
    # the keys the checkpoint holds, as a recipe (a key an older release did not have takes its default)
    recipe = Recipe.from_dict(stored, "the checkpoint's recipe", validate=False) if stored else None
    epoch = training.get('epoch')
    lines = ['## Fine-tuning', '']
    if recipe is not None:
        kind = 'no-SA baseline' if recipe.no_sa else 'T-CNN'
        lines.append(f'Fine-tuned with `tcnn train` ({kind}, the recipe of T-CNN section 3 with the values below): '
                     f'{recipe.epochs} epochs planned, batch {recipe.batch_size} per process, '
                     f'lr {recipe.lr:g}, gating lr {recipe.gating_lr:g}, {recipe.img_size} px.')
    if isinstance(epoch, int):
        lines.append(f'This checkpoint: after epoch {epoch + 1}.')
    best = _finite(training.get('best_top1'))
    if best is not None:
        lines.append(f'Best validation top-1 of the run: {best:.2f}%.')
    by_epoch = {r.get('epoch'): r for r in metrics}
    shown = [('this checkpoint', by_epoch.get(epoch))]
    if metrics and metrics[-1] is not by_epoch.get(epoch):
        shown.append((f'last epoch ({metrics[-1]["epoch"] + 1})', metrics[-1]))
    shown = [(label, record) for label, record in shown if record and _metrics_rows(record)]
    if shown:
        names = [label for label, _ in _metrics_rows(shown[0][1])]
        table = [[name] + [dict(_metrics_rows(r)).get(name, '-') for _, r in shown] for name in names]
        lines += ['', format_markdown(['metric'] + [label for label, _ in shown], table)]
    if recipe is not None:  # the keys the checkpoint holds, no default it did not state
        shown_recipe = {k: (os.path.basename(str(v).rstrip('/')) if k in _PATH_KEYS and v else v)
                        for k, v in recipe.to_dict().items() if k in stored}
        lines += ['<details><summary>recipe (paths shortened to their last component)</summary>', '', '```yaml',
                  dump_recipe(shown_recipe).rstrip(), '```', '', '</details>', '']
    return '\n'.join(lines) + '\n'


def _gates_section(model: nn.Module) -> str:
    rows = [(f'`{name}`', str(len(layer['gate'])), _range(layer['gate']), _range(layer['span']))
            for name, layer in gpsa_summary(model).items()]
    return '\n'.join([
        '## Gates and spans per layer', '',
        'Per GPSA layer, over its heads: mean [min, max] of the gate sigmoid(lambda) (1: positional attention, the '
        'convolution\'s; 0: content attention) and of the attention span 1/alpha (T-CNN Fig. 4).', '',
        format_markdown(['layer', 'heads', 'gate', 'span'], rows)])


def _usage(location: str) -> str:
    return '\n'.join([
        '```python', 'import timm', 'import tcnn  # registers the t_* architectures with timm (pip install tcnn)', '',
        f"model = timm.create_model('{location}', pretrained=True).eval()",
        'transform = timm.data.create_transform(**timm.data.resolve_data_config(model=model))',
        f"# or: model = tcnn.load('{location}')", '```', ''])


def model_card(
        model: nn.Module,
        d: Dict[str, Any],
        metrics: Sequence[Dict[str, Any]] = (),
        *,
        location: str,
) -> Dict[str, Any]:
    """The model card as timm's ``generate_readme`` / ``push_to_hf_hub`` take it (``description``, ``citation``,
    ``tags``, ``license``).

    Args:
        model: The T-CNN (``read_published``).
        d: Its T-CNN dict (``read_published``).
        metrics: The ``metrics.jsonl`` records of its training run.
        location: The name that loads it (``'hf-hub:ORG/NAME'`` or ``'local-dir:PATH'``), for the usage example.
    """
    cfg, source = model.pretrained_cfg, d['source']
    architecture = cfg.get('architecture')
    # a tag names timm's published weights: not these when they came from a user's file or a random init
    source_name = source['model'] if source.get('weights') in ('pretrained', None) else source['model'].split('.')[0]
    stages = ', '.join(f'`{s}`' for s in model.tcnn_config['stages'])
    intro = (f'A Transformed CNN (T-CNN, [arXiv:2106.05795]({PAPER_URL})) made with tcnn from timm\'s '
             f'`{source_name}`: the k x k convolutions of {stages} are Gated Positional Self-Attention layers '
             '(ConViT, arXiv:2103.10697) that started out as those convolutions (their filters are the output '
             'projections) and were then free to learn content attention.')
    license_ = cfg.get('license') or 'unknown'
    details = [f'- **Architecture:** `{architecture}` (timm; `import tcnn` registers it)',
               f'- **Source CNN:** `{source_name}`' + (f' with `{source["kwargs"]}`' if source['kwargs'] else ''),
               f'- **Source weights:** {_source_weights(source)}',
               f'- **Classes:** {_classes_text(d)}',
               f'- **Image size:** {_size_text(model)}',
               f'- **Made with:** tcnn {__version__}, timm {timm.__version__}, torch {torch.__version__.split("+")[0]}']
    if license_ == 'unknown':
        details.insert(3, '- **License:** unknown: the weights did not come from a published checkpoint whose '
                          'license tcnn knows; the publisher states it')
    description = '\n'.join([
        intro, '', '## Model Details', '', *details, '', '## Usage', '', _usage(location),
        _conversion_section(model, d), _training_section(d, list(metrics)), _gates_section(model)])
    return {'description': description, 'citation': PAPER_BIBTEX, 'tags': list(CARD_TAGS), 'license': license_}


def _classes_text(d: Dict[str, Any], shown: int = 10) -> str:
    """The class count and the first ``shown`` class names (config.json's ``label_names`` holds them all)."""
    names = d.get('label_names') or []
    if not names:
        return str(d.get('num_classes'))
    more = f', ... ({len(names) - shown} more, in config.json\'s `label_names`)' if len(names) > shown else ''
    return f'{d.get("num_classes")}: ' + ', '.join(f'`{n}`' for n in names[:shown]) + more


def _size_text(model: nn.Module) -> str:
    """The model's input size and crop, and its test size and crop where they differ (timm's validate.py and
    ``tcnn eval`` use those)."""
    def text(cfg: Dict[str, Any]) -> str:
        return f'{"x".join(map(str, cfg["input_size"][1:]))} (crop {cfg["crop_pct"]:g}, {cfg["interpolation"]})'
    cfg, test = data_config(model), data_config(model, use_test_size=True)
    return text(cfg) + ('' if text(test) == text(cfg) else f', tested at {text(test)}')
