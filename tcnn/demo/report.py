"""The demo's report: what the numbers say in plain words (``verdict``), the result table of its log
(``summary_lines``) and its ``README.md`` (``render_readme``: the table, the judgement of the paper's claim and what
the numbers mean, the details, the runs over their epochs (the paper's Fig. 4 in numbers), the figures, how
it was made).
"""
import os
from statistics import fmean
from typing import Any, Dict, List, Mapping, Sequence

from ..evaluation.tables import format_markdown, format_table
from .judgement import interval, judgement_lines
from .plan import ARM_TITLES, IMG_SIZE, SHIPPED

__all__ = ['verdict', 'training_verdict', 'summary_lines', 'render_readme']


def _pm(stats: Mapping[str, Any], signed: bool = False) -> str:
    fmt = '+.1f' if signed else '.1f'
    if len(stats['values']) == 1:
        return format(stats['mean'], fmt)
    return f'{stats["mean"]:{fmt}} ± {stats["std"]:.1f}'


def _ci(values: Sequence[float]) -> str:
    """A paired gain as the table shows it: mean and 95% interval over seeds."""
    g = interval(values)
    return f'{g["mean"]:+.1f}' if g['lo'] is None else f'{g["mean"]:+.1f} [{g["lo"]:+.1f}, {g["hi"]:+.1f}]'


def verdict(results: Mapping[str, Any]) -> List[str]:
    """What the numbers say, in plain words, whatever their sign."""
    s = results['summary']
    n = results['plan']['seeds']
    lines = []
    t = s.get('t-cnn')
    if results.get('judgement'):
        lines += judgement_lines(results['judgement'])
    if t and 'gain_clean' in t and n > 1:
        for key, what in (('gain_clean', 'clean test accuracy'), ('gain_corrupted', 'accuracy on corrupted images')):
            favour = sum(v > 0 for v in t[key]['values'])
            lines.append(f'On {what}, {favour} of {n} seeds favour the T-CNN'
                         + ('.' if favour in (0, n) else ': the direction does not hold on every seed.'))
    base = s.get('no-sa')
    if t and base:
        ratio_t = t['corrupted_top1']['mean'] / t['clean_top1']['mean']
        ratio_b = base['corrupted_top1']['mean'] / base['clean_top1']['mean']
        more = ratio_t > ratio_b + 0.01
        lines.append(f'Relative to clean accuracy, the T-CNN keeps {ratio_t:.0%} on corrupted images and the baseline '
                     f'{ratio_b:.0%}: the T-CNN is {"more" if more else "not more"} robust in relative terms'
                     + ('.' if more else ': its gain on corrupted images is part of its clean gain.'))
    init = results['init']
    trained = [r for r in results['runs'] if r['arm'] == 't-cnn']
    if trained and init.get('gate_mean') is not None:
        gate = sum(r['gate_mean'] for r in trained) / len(trained)
        span = sum(r['span_mean'] for r in trained) / len(trained)
        nl = [r['nonlocality_mean'] for r in trained if r.get('nonlocality_mean') is not None]
        moved = ('fell: heads moved towards content attention' if gate < init['gate_mean'] - 0.01 else
                 'rose: heads moved towards positional attention' if gate > init['gate_mean'] + 0.01 else
                 'barely moved')
        grew = ('grew' if span > init['span_mean'] * 1.05 else 'shrank' if span < init['span_mean'] / 1.05 else
                'barely moved')
        line = (f'Where the T-CNN\'s heads went: mean gate sigma(lambda) {init["gate_mean"]:.3f} at init -> '
                f'{gate:.3f} after fine-tuning ({moved}); mean span 1/alpha {init["span_mean"]:.2f} -> {span:.2f} '
                f'tokens^2 ({grew})')
        if nl and init.get('nonlocality_mean') is not None:
            line += f'; mean nonlocality {init["nonlocality_mean"]:.2f} -> {sum(nl) / len(nl):.2f} tokens'
        lines.append(line + '.')
    return lines + training_verdict(results)


def training_verdict(results: Mapping[str, Any]) -> List[str]:
    """What the runs did over their epochs, in plain words: the CNNs' plateau and the paper's Fig. 4 (A the warm-up
    dip, B spans and C gates per GPSA layer)."""
    tr = results.get('training')
    if not tr:
        return []
    lines = []
    told = [p for p in tr['cnn'].values() if p is not None]
    if told:
        gains = ', '.join(f'{p["gain"]:+.1f}' for p in told)
        window = told[0]['window']
        state = (f'all {len(told)} at their plateau' if tr['cnns_at_plateau'] == len(told) else
                 f'{tr["cnns_at_plateau"]} of {len(told)} at their plateau')
        lines.append(f'Were the CNNs converged before fine-tuning? Their mean val top-1 over the last {window} epochs '
                     f'moved {gains} points against the {window} before: {state} (at most '
                     f'{tr["plateau_points"]:g} point).'
                     + ('' if tr['cnns_at_plateau'] == len(told) else ' A CNN still rising gains from any further '
                        'training, with or without attention: the comparison is then with the no-SA arm only.'))
    for arm in ('t-cnn', 'no-sa'):
        dips = [r['dip'] for r in tr['runs'].values() if r['arm'] == arm and r['dip']]
        if dips:
            dip = fmean([d['dip'] for d in dips])
            fell = (f'fell {dip:.1f} points below the CNN it started from' if dip >= 0.05 else
                    'did not fall below the CNN it started from')
            lines.append(f'Fig. 4A, {ARM_TITLES[arm]}: during the {tr["warmup_epochs"]} warm-up epoch(s) val top-1 '
                         f'{fell} (mean over seeds), and ended '
                         f'{fmean([d["final"] - d["start"] for d in dips]):+.1f} points from it. The paper: a dip '
                         'during the warm-up, then a rise above the CNN as the learning rate decays.')
    layers = _mean_layers(tr, 't-cnn')
    if layers:
        gates = '; '.join(f'{name} {e["gate_init"]:.2f} -> {e["gate_final"]:.2f} ({e["content_heads"]:.1f} of '
                          f'{e["heads"]} heads below {tr["content_gate"]:g})' for name, e in layers.items())
        spans = '; '.join(f'{name} {e["span_init"]:.2f} -> {e["span_final"]:.2f}' for name, e in layers.items())
        lines.append(f'Fig. 4C, T-CNN gates sigma(lambda) per GPSA layer, init -> end (mean over heads and seeds): '
                     f'{gates}. The paper: the first GPSA layer stays convolutional (gates near 1), the later ones '
                     'escape locality, most heads attending by content.')
        lines.append(f'Fig. 4B, T-CNN spans 1/alpha per GPSA layer, init -> end: {spans}. The paper: the span widens '
                     'on average, some heads contracting.')
    return lines


def _mean_layers(training: Mapping[str, Any], arm: str) -> Dict[str, Dict[str, Any]]:
    """Per GPSA layer, the layer trajectories of an arm's runs averaged over seeds."""
    per_layer: Dict[str, List[Mapping[str, Any]]] = {}
    for run in training['runs'].values():
        if run['arm'] != arm:
            continue
        for name, e in run['layers'].items():
            per_layer.setdefault(name, []).append(e)
    out = {}
    for name, es in per_layer.items():
        warm_gates = [e['gate']['warmup'] for e in es if e['gate']['warmup'] is not None]
        warm_spans = [e['span']['warmup'] for e in es if e['span']['warmup'] is not None]
        out[name] = {'heads': es[0]['heads'], 'seeds': len(es), 'gate_init': es[0]['gate']['init'],
                     'gate_warmup': fmean(warm_gates) if warm_gates else None,
                     'gate_final': fmean([e['gate']['final'] for e in es]),
                     'content_heads': fmean([e['content_heads'] for e in es]),
                     'span_init': es[0]['span']['init'],
                     'span_warmup': fmean(warm_spans) if warm_spans else None,
                     'span_final': fmean([e['span']['final'] for e in es]),
                     'wider': fmean([e['span']['wider'] for e in es]),
                     'narrower': fmean([e['span']['narrower'] for e in es])}
    return out


def _result_rows(results: Mapping[str, Any]) -> List[List[str]]:
    """The result table: per arm (the CNN first) clean and corrupted top-1 and the gains over no-SA."""
    rows = []
    for arm, e in results['summary'].items():
        rows.append([ARM_TITLES[arm], _pm(e['clean_top1']), _pm(e['corrupted_top1']),
                     _ci(e['gain_clean']['values']) if 'gain_clean' in e else '',
                     _ci(e['gain_corrupted']['values']) if 'gain_corrupted' in e else ''])
    return rows


def summary_lines(results: Mapping[str, Any]) -> str:
    """The result table as plain text (the end of the demo's log)."""
    return format_table(['model', 'clean top-1 %', 'corrupted top-1 %', 'gain clean', 'gain corrupted'],
                        _result_rows(results))


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return format_markdown(header, rows).rstrip('\n')


def _readme_result(results: Mapping[str, Any]) -> str:
    """Title, the result table, the verdict in words and the conversion's exactness."""
    plan, ds, conv = results['plan'], results['dataset'], results['conversion']
    seeds_note = (f'accuracies: mean ± standard deviation over {plan["seeds"]} seeds, each its own CNN and '
                  'fine-tuning; gains: mean [95% interval], paired by seed' if plan['seeds'] > 1 else
                  'one seed (run with --seeds 2 or more for an interval)')
    lo, hi = conv['init_max_rel_err_range']
    init_dev = f'{lo:.1%}' if f'{lo:.1%}' == f'{hi:.1%}' else f'{lo:.1%} to {hi:.1%}'
    cnns = f'each of the {plan["seeds"]} trained CNNs' if plan['seeds'] > 1 else 'the trained CNN'
    smoke = ('\n**A smoke run (`--quick`)**: one seed, 2 fine-tuning epochs on the first 600 training images, so the '
             'numbers below check the pipeline, not the claim; `tcnn demo` without `--quick` gives the result.\n'
             if plan['name'] == 'quick' else '')
    corrupted = f'corrupted top-1 % (mean of {len(ds["corruptions"])} corruptions x 5 severities)'
    header = ['model', 'clean top-1 %', corrupted, 'gain clean (points)', 'gain corrupted (points)']
    return f"""# tcnn demo: a Transformed CNN in miniature

T-CNN (arXiv:2106.05795): the last-stage 3x3 convolutions of a trained CNN become GPSA self-attention layers
(ConViT, arXiv:2103.10697) that hold the CNN's filters (in their exact configuration, the CNN's function), then
the hybrid is fine-tuned. This folder holds the
whole experiment on a task made for it, with every file needed to check the numbers.
{smoke}
## Result ({seeds_note}; test split, never used to choose settings)

{_md_table(header, _result_rows(results))}

Gains are T-CNN minus the no-SA baseline of the same seed. In plain words:

""" + '\n'.join(f'- {line}' for line in verdict(results)) + f"""

The conversion is exact: in its exact configuration the T-CNN computes {cnns} with a maximum relative
logits error of {conv['max_rel_err']:.1e} (float32, {conv['gpsa_layers']} GPSA layers,
{conv['params_cnn'] / 1e6:.3f}M -> {conv['params_t_cnn'] / 1e6:.3f}M parameters); at the fine-tuning init
(alpha = lambda = 1) the logits deviate by {init_dev}: the init loosens locality and gates so that heads can learn
content attention.
"""


def _readme_details(results: Mapping[str, Any]) -> str:
    """Per seed (with the attention statistics) and per corruption."""
    def attention(r: Mapping[str, Any]) -> List[str]:  # the ANALYSIS_MEANS columns
        return ['' if r.get(key) is None else format(r[key] * scale, fmt) for key, fmt, scale in (
            ('gate_mean', '.3f', 1), ('span_mean', '.2f', 1), ('sigma_mean', '.2f', 1), ('nonlocality_mean', '.2f', 1),
            ('nonlocality_real_mean', '.2f', 1), ('padding_share_mean', '.1f', 100))]

    per_seed = [[str(r['seed']), ARM_TITLES[r['arm']], f'{r["clean_top1"]:.1f}', f'{r["corrupted_top1"]:.1f}',
                 *attention(r), f'{r["train_s"]:.0f}'] for r in results['runs']]
    for init in results['init']['seeds']:
        per_seed.append([str(init['seed']), 'T-CNN at init (before fine-tuning)', '', '', *attention(init), ''])
    corr_names = list(results['runs'][0]['corruptions'])
    corr_rows = []
    for arm in results['summary']:
        rs = [r for r in results['runs'] if r['arm'] == arm]
        corr_rows.append([ARM_TITLES[arm]] + [
            f'{sum(r["corruptions"][c]["top1"] for r in rs) / len(rs):.1f}' for c in corr_names])
    analysed = next((r['analysis'] for r in results['runs'] if r.get('analysis')), {})
    grids = sorted({f'{e["grid"][0]}x{e["grid"][1]} tokens of {e["token_px"][0]:.3g} px' for e in
                    analysed.get('layers', {}).values() if e.get('grid')})
    return f"""
### Per seed

{_md_table(['seed', 'model', 'clean top-1 %', 'corrupted top-1 %', 'gate σ(λ), 0-1', 'span 1/α, tokens²',
            'σ = 1/√(2α), tokens', 'nonlocality, tokens', 'nonlocality on real keys, tokens',
            'attention on padding, %', 'train s'], per_seed)}

Means over heads and GPSA layers, with `tcnn.analysis.heads` (docs/analysis.md, "What the numbers mean"). Gate:
sigma(lambda) (1: positional attention only, 0: content only). Span: 1/alpha, in tokens² (not a distance); σ: the
width (standard deviation) of the positional Gaussian, in tokens. Nonlocality (ConViT eq. 8): mean distance between a
query and the keys it attends to (gated attention), in tokens of the layers' input grid
({', '.join(grids) or 'not measured'}), over all keys including the conv's zero padding, and over the real keys with
each query's attention renormalised over them; attention on padding: the share of the gated attention on padded keys.
Averaged over {analysed.get('num_images', 0)} test images.

### Accuracy by corruption (top-1 %, mean over severities and seeds)

{_md_table(['model'] + corr_names, corr_rows)}
"""


def _fmt(value: Any, fmt: str) -> str:
    return '' if value is None else format(value, fmt)


def _readme_training(results: Mapping[str, Any]) -> str:
    """Over the epochs: every CNN's plateau, every fine-tuning run's warm-up dip, every T-CNN arm's gates and spans
    per GPSA layer (the paper's Fig. 4 in numbers; the curves are in the figures)."""
    tr = results.get('training')
    if not tr:
        return ''
    cnn_rows = [[seed, str(p['epochs']), f'{p["final"]:.1f}', f'{p["best"]:.1f}', f'{p["before_mean"]:.1f}',
                 f'{p["last_mean"]:.1f}', f'{p["gain"]:+.1f}', 'yes' if p['at_plateau'] else 'no']
                for seed, p in tr['cnn'].items() if p is not None]
    dip_rows = [[str(r['seed']), ARM_TITLES[r['arm']], f'{r["dip"]["start"]:.1f}', f'{r["dip"]["warmup_min"]:.1f}',
                 f'{r["dip"]["dip"]:.1f}', f'{r["dip"]["final"]:.1f}']
                for r in tr['runs'].values() if r['dip']]
    layer_rows = []
    for arm in ('t-cnn', 't-cnn-late'):
        for name, e in _mean_layers(tr, arm).items():
            layer_rows.append([ARM_TITLES[arm], name, f'{e["gate_init"]:.3f}', _fmt(e['gate_warmup'], '.3f'),
                               f'{e["gate_final"]:.3f}', f'{e["content_heads"]:.1f} of {e["heads"]}',
                               f'{e["span_init"]:.2f}', _fmt(e['span_warmup'], '.2f'), f'{e["span_final"]:.2f}',
                               f'{e["wider"]:.1f} / {e["narrower"]:.1f}'])
    parts = ['\n### Over training (the paper\'s Fig. 4 in numbers)\n']
    if cnn_rows:
        window = next(p['window'] for p in tr['cnn'].values() if p is not None)
        parts.append(f"""
The CNNs before fine-tuning, val top-1 %: at their plateau when the mean over the last {window} epochs is at most
{tr['plateau_points']:g} point above the mean over the {window} before.

{_md_table(['seed', 'epochs', 'last epoch', 'best epoch', f'mean, {window} epochs before', f'mean, last {window}',
            'gain', 'at plateau'], cnn_rows)}
""")
    if dip_rows:
        parts.append(f"""
Fine-tuning from the CNN, val top-1 % (Fig. 4A): the CNN's last epoch, the lowest during the {tr['warmup_epochs']}
warm-up epoch(s), how far below the CNN that is, and the last epoch.

{_md_table(['seed', 'run', 'CNN', 'warm-up low', 'dip (points)', 'last epoch'], dip_rows)}
""")
    if layer_rows:
        parts.append(f"""
Gates sigma(lambda) and spans 1/alpha per GPSA layer (Fig. 4B and C), means over heads and seeds: at the fine-tuning
init (sigmoid(1) and 1 for every head), at the end of the warm-up (a late run: its first epoch with attention) and at
the end; heads with a final gate below {tr['content_gate']:g} attend by content almost only; heads whose span ended
over 5% wider / narrower than 1.

{_md_table(['run', 'layer', 'gate init', 'gate warm-up', 'gate end', 'content heads', 'span init', 'span warm-up',
            'span end', 'heads wider / narrower'], layer_rows)}
""")
    return ''.join(parts)


def _readme_figures(results: Mapping[str, Any]) -> str:
    figs = results.get('figures', {})
    rel = lambda p: os.path.relpath(p, os.path.dirname(results['eval_file']))  # noqa: E731
    fig_lines = []
    if figs.get('robustness'):
        fig_lines.append(f'![accuracy by corruption]({rel(figs["robustness"])})')
    for arm, path in figs.get('curves', {}).items():
        fig_lines.append(f'![training curves, {ARM_TITLES[arm]}]({rel(path)})')
    for path in figs.get('attention', []):
        fig_lines.append(f'![{os.path.basename(path)}]({rel(path)})')
    return '\n## Figures\n\n' + '\n\n'.join(fig_lines) + '\n'


def _readme_method(results: Mapping[str, Any]) -> str:
    """The task, how the experiment was made, the files and the environment."""
    plan, ds, env = results['plan'], results['dataset'], results['environment']
    device = env['device'] + (f' ({env["gpu"]})' if env.get('gpu') else '')
    cpu = f", {env['cpu']}, torch's {env['cpu_capability']} kernels" if env.get('cpu') else ''
    cnn_source = (f"the converged `demo_resnet10` shipped with tcnn for that seed (trained from scratch on this data "
                  f"for {plan['pretrain_epochs']} epochs by `python benchmarks/demo_cnns.py`, its epochs in "
                  "`runs/seedS-cnn/metrics.jsonl`)" if plan.get('cnns') == SHIPPED else
                  f"`demo_resnet10` trained from scratch for {plan['pretrain_epochs']} epochs (`runs/seedS-cnn`)")
    late = (f""", `t-cnn-late` (CNN for {plan['late_epoch']} epochs, then
   reparameterised: the paper's Table 3)""" if plan['late_epoch'] is not None else '')
    return f"""
## The task

{ds['rule'].capitalize()} (classes: {', '.join(ds['classes'])}). Every image ({ds['task_params']['img_size']} px)
holds {ds['task_params']['num_objects']} shapes with random kinds, positions (at least
{ds['task_params']['min_distance']} image widths apart) and sizes on a random background. Telling a shape's class
apart is local; finding the single one needs the shapes to be compared across the image. Splits:
{ds['sizes']['train']} train, {ds['sizes']['val']} val, {ds['sizes']['test']} test images (dataset seed
{ds['seed']}); {ds['corrupt_count']} test images corrupted with {', '.join(ds['corruptions'])} at 5 severities
(ImageNet-C parameters) in `data/test-c`.

## How it was made

1. Per seed, the CNN: {cnn_source}.
2. From the seed's CNN, {plan['finetune_epochs']} fine-tuning epochs each: `no-sa` (the CNN, `tcnn train --no-sa`),
   `t-cnn` (`tcnn.reparameterize`, verified, then the recipe){late}.
3. `tcnn eval` of every final model on `data/test` and `data/test-c` (`eval.json`), gates, spans and nonlocality
   with `tcnn.analysis.heads`, attention maps with `tcnn inspect`.

Changes from the paper's fine-tuning recipe:

""" + '\n'.join(f'- {c}' for c in results['recipe_changes']) + f"""

The settings (epochs, learning rates) were chosen on the validation split; the test split only gives the table.

## Files

- `data/`: the dataset (`dataset.json` its parameters, `SPLIT.jsonl` every image's scene); `data/test-c` ImageNet-C
  layout
- `runs/NAME/`: each training run (`metrics.jsonl`, `last.pt`, `best.pt`, `log.txt`)
- `models/NAME.pt`: each final model, `tcnn.load`-able; `models/seedS-init-t-cnn.pt` the seed's T-CNN before
  fine-tuning
- `eval.json`, `eval.md`: `tcnn eval`'s output; `results.json`: everything in this page
- Check a number: `tcnn eval models/seed0-t-cnn.pt --suite imagenet --data data/test --img-size {IMG_SIZE} --crop-pct 1`

Wall time of the last `tcnn demo` call {results.get('wall_s', 0) / 60:.1f} min (every training run's time in the
per-seed table above; {env['jobs']} training process(es) at a time) on {env['cpus']} CPUs ({env['threads']} torch
threads per process{cpu}, device {device}); torch {env['torch']}, torchvision {env['torchvision']}, timm
{env['timm']}, Pillow {env['pillow']}, numpy {env['numpy']}, tcnn {env['tcnn']}.
"""


def render_readme(results: Mapping[str, Any]) -> str:
    """The demo's ``README.md``: the table, what it means, the details, the figures, how it was made."""
    return ''.join(f(results) for f in (_readme_result, _readme_details, _readme_training,
                                         _readme_figures, _readme_method))
