"""The demo's steps after training and what they put in ``results.json``: ``tcnn eval`` of every model on the test
split and ``test-c``, gates / spans / nonlocality of every T-CNN (``tcnn.analysis.heads``), the figures
(Fig. 3, 4 and 5 of the paper in miniature, the attention maps with ``tcnn inspect``), the statistics over seeds
and the environment the numbers depend on.
"""
import json
import math
import os
import platform
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import timm
import torch

from ..cli import main
from ..data.config import data_config
from ..data.images import find_images, load_images
from ..errors import TcnnError
from ..analysis import heads
from ..evaluation import plots
from ..evaluation.plots import load_metrics
from ..files import loading
from ..train.distributed import EXIT_INTERRUPTED, EXIT_PREEMPTED
from ..version import __version__
from .dynamics import summarize_training
from .plan import ARM_TITLES, CNN, DEMO_FORMAT, DEMO_VERSION, IMG_SIZE, recipe_changes, run_name, warmup_epochs
from .pool import Context, DemoStopped, available_cpus, cpu_model
from .synthetic import CORRUPTED_SPLIT, hue_class

__all__ = ['ANALYSIS_MEANS', 'evaluate', 'collect_results', 'draw_figures', 'summarize_runs', 'seed_stats',
           'environment']


def _tcnn(argv: Sequence[str]) -> int:
    """Run a ``tcnn`` sub-command in this process (its one-line errors and exit codes)."""
    return main(list(argv))


def _check_rc(rc: int, what: str, ctx: Context) -> None:
    if rc in (EXIT_INTERRUPTED, EXIT_PREEMPTED):
        raise DemoStopped(f'{what} stopped and saved its checkpoint; run the same tcnn demo command again to continue '
                          'the demo where it stopped', rc)
    if rc != 0:
        raise TcnnError(f'{what} failed (exit {rc}, its error is above); the demo so far is in {ctx.out}')


def evaluate(ctx: Context, files: Mapping[str, str]) -> Dict[str, Any]:
    """``tcnn eval`` of every model file on the test split (suite ``imagenet``) and ``test-c`` (``imagenet-c``)."""
    out = os.path.join(ctx.out, 'eval.json')
    argv = ['eval', *files.values(), '--names', *files.keys(), '--suite', 'imagenet', 'imagenet-c',
            '--data', os.path.join(ctx.data, 'test'), os.path.join(ctx.data, CORRUPTED_SPLIT),
            '--img-size', str(IMG_SIZE), '--crop-pct', '1.0', '--imagenet-c-size', str(IMG_SIZE),
            '--device', ctx.device, '--out', out]
    if ctx.workers is not None:
        argv += ['--workers', str(ctx.workers)]
    if not ctx.progress:
        argv.append('--no-progress')
    ctx.log(f'\n== tcnn {" ".join(argv)}')
    _check_rc(_tcnn(argv), 'evaluation', ctx)
    with open(out, encoding='utf-8') as f:
        return json.load(f)


def _test_images(ctx: Context, limit: int) -> List[str]:
    """The first ``limit`` test images, classes interleaved (the same files on every run)."""
    paths = find_images(os.path.join(ctx.data, 'test'))
    return sorted(paths, key=lambda p: (os.path.basename(p), p))[:limit]


def _analyse(ctx: Context, model_file: str) -> Dict[str, Any]:
    """Gates, spans and nonlocality (mixed, content, positional) of a T-CNN on test images."""
    model = loading.load(model_file).to(ctx.device)
    cfg = data_config(model)
    paths = _test_images(ctx, ctx.plan.nonlocality_images)
    batches = (load_images(paths[i:i + 64], cfg).to(ctx.device) for i in range(0, len(paths), 64))
    with torch.no_grad():
        summary = heads.summarize(model, batches)
    return {'num_images': summary['num_images'], 'units': summary['units'], 'layers': {
        name: {k: entry[k] for k in ('gate', 'span', 'sigma', 'nonlocality', 'nonlocality_content',
                                     'nonlocality_positional', 'nonlocality_real', 'padding_share', 'grid', 'token_px',
                                     *ANALYSIS_MEANS)}
        for name, entry in summary['layers'].items()}}


# Layer means of tcnn.analysis.heads.summarize that the report shows (their units: tcnn.analysis.heads.UNITS).
ANALYSIS_MEANS = ('gate_mean', 'span_mean', 'sigma_mean', 'nonlocality_mean', 'nonlocality_real_mean',
                  'padding_share_mean')


def _layer_means(analysis_result: Mapping[str, Any], key: str) -> Optional[float]:
    values = [e[key] for e in analysis_result['layers'].values() if e.get(key) is not None]
    return sum(values) / len(values) if values else None


def _odd_shape_queries(ctx: Context, limit: int) -> List[Tuple[str, Tuple[int, int]]]:
    """The first ``limit`` test images with the pixel (row, column) at the centre of the shape seen once: the query
    whose attention shows whether heads look at the other shapes."""
    out = []
    with open(os.path.join(ctx.data, 'test.jsonl'), encoding='utf-8') as f:
        for line in f:
            record = json.loads(line)
            hues = [hue_class(o['color']) for o in record['objects']]
            odd = next(o for o, h in zip(record['objects'], hues) if hues.count(h) == 1)
            x, y = odd['center']
            out.append((os.path.join(ctx.data, record['file']), (int(round(y)), int(round(x)))))
            if len(out) == limit:
                break
    return out


def _inspect(ctx: Context, model_file: str, name: str) -> List[str]:
    """``tcnn inspect`` of a T-CNN on a few test images, the query on the shape seen once: Fig. 5 attention maps
    and the per-head chart (one folder per image: each holds that image's nonlocality)."""
    figures = []
    for image, (row, col) in _odd_shape_queries(ctx, ctx.plan.inspect_images):
        out = os.path.join(ctx.out, 'figures', f'inspect-{name}', os.path.splitext(os.path.basename(image))[0])
        argv = ['inspect', model_file, '--image', image, '--query', f'{row},{col}', '--out', out,
                '--device', ctx.device]
        ctx.log(f'\n== tcnn {" ".join(argv)}')
        _check_rc(_tcnn(argv), f'inspecting {name}', ctx)
        figures += sorted(os.path.join(out, f) for f in os.listdir(out) if f.startswith('attention_'))
    figures.append(os.path.join(out, 'heads.png'))
    return figures


# ---------------------------------------------------------------------------------------------- statistics

def seed_stats(values: Sequence[float]) -> Dict[str, Any]:
    """Mean, sample standard deviation, min and max over seeds."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return {'mean': mean, 'std': std, 'min': min(values), 'max': max(values), 'values': list(values)}


def summarize_runs(runs: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> Dict[str, Any]:
    """Per arm (the CNN included): clean and corrupted top-1 over seeds; per T-CNN arm: the gain over ``no-sa``
    seed by seed."""
    by_arm = {arm: [r for r in runs if r['arm'] == arm] for arm in arms}
    out: Dict[str, Any] = {}
    for arm, rs in by_arm.items():
        if not rs:
            continue
        entry = {'clean_top1': seed_stats([r['clean_top1'] for r in rs]),
                 'corrupted_top1': seed_stats([r['corrupted_top1'] for r in rs])}
        if arm not in (CNN, 'no-sa') and by_arm.get('no-sa'):
            base = {r['seed']: r for r in by_arm['no-sa']}
            paired = [(r, base[r['seed']]) for r in rs if r['seed'] in base]
            entry['gain_clean'] = seed_stats([r['clean_top1'] - b['clean_top1'] for r, b in paired])
            entry['gain_corrupted'] = seed_stats([r['corrupted_top1'] - b['corrupted_top1'] for r, b in paired])
        out[arm] = entry
    return out


_CONVERSION_KEYS = ('seed', 'max_abs_err', 'max_rel_err', 'init_max_abs_err', 'init_max_rel_err', 'sensitivity',
                    'vacuous', 'float64_max_rel_err', 'dtype', 'gpsa_layers', 'params_cnn', 'params_t_cnn')


def collect_results(ctx: Context, report: Mapping[str, Any], runs: List[Dict[str, Any]],
                    conversions: Sequence[Mapping[str, Any]], dataset: Mapping[str, Any],
                    timings: Mapping[str, float]) -> Dict[str, Any]:
    clean = report['suites']['imagenet']['results']
    corrupted = report['suites']['imagenet-c']['results']

    def scores(name: str) -> Dict[str, Any]:
        c = corrupted[name]
        return {'clean_top1': clean[name]['top1'], 'corrupted_top1': c['top1'],
                'corrupted_by_severity': c['severities'],
                'corruptions': {k: {'top1': v['top1'], 'severities': v['severities']}
                                for k, v in c['corruptions'].items()}}

    for r in runs:
        r.update(scores(r['name']))
        r['train_s'] = _train_time(r['run_dir'])
        r['analysis'] = _analyse(ctx, r['model_file']) if r['arm'] not in (CNN, 'no-sa') else None
        if r['analysis']:
            r.update({key: _layer_means(r['analysis'], key) for key in ANALYSIS_MEANS})
    per_seed = [{k: c.get(k) for k in _CONVERSION_KEYS} for c in conversions]
    worst = max(per_seed, key=lambda c: c['max_rel_err'])
    return {
        'format': DEMO_FORMAT, 'version': DEMO_VERSION, 'plan': ctx.plan.to_dict(),
        'dataset': {k: dataset[k] for k in ('task', 'rule', 'seed', 'classes', 'sizes', 'corruptions', 'severities',
                                             'corrupt_count', 'task_params')},
        # the seed whose conversion was the least exact, and every seed's
        'conversion': dict(worst, init_max_rel_err_range=[min(c['init_max_rel_err'] for c in per_seed),
                                                          max(c['init_max_rel_err'] for c in per_seed)],
                           seeds=per_seed),
        'init': _analyse_init(ctx),
        'runs': runs,
        'summary': summarize_runs(runs, [CNN, *ctx.plan.arms]),
        'training': summarize_training(runs, {r['name']: load_metrics(r['run_dir']) for r in runs},
                                       warmup_epochs(ctx.plan.finetune_epochs), cnn_arm=CNN,
                                       batch_size=ctx.plan.batch_size),
        'recipe_changes': recipe_changes(ctx.plan),
        'eval_file': os.path.join(ctx.out, 'eval.json'),
        'environment': environment(ctx.device, ctx.jobs, ctx.threads),
    }


def environment(device: str = 'cpu', jobs: int = 1, threads: Optional[int] = None) -> Dict[str, Any]:
    """What the numbers depend on besides the plan: the library versions, the device and the threads per process."""
    import numpy
    import PIL
    import torchvision
    gpu = torch.cuda.get_device_name(torch.device(device)) if device.startswith('cuda') else None
    # the CPU and the kernels torch picks for it: two CPUs of one name can round differently (docs/demo.md)
    return {'device': device, 'gpu': gpu, 'cpu': cpu_model(),
            'cpu_capability': torch.backends.cpu.get_cpu_capability(), 'jobs': jobs,
            'threads': threads if threads is not None else torch.get_num_threads(),
            'cpus': available_cpus(), 'python': platform.python_version(), 'torch': torch.__version__,
            'torchvision': torchvision.__version__, 'timm': timm.__version__, 'pillow': PIL.__version__,
            'numpy': numpy.__version__, 'tcnn': __version__, 'machine': platform.machine()}


def _train_time(run_dir: str) -> float:
    """Seconds the run's epochs took (training and validation), from its metrics: also right for a run that was
    interrupted and continued."""
    return float(sum(r.get('epoch_time_s') or 0.0 for r in load_metrics(run_dir)))


def _analyse_init(ctx: Context) -> Dict[str, Any]:
    """Gates, spans and nonlocality of every seed's T-CNN at the fine-tuning init (before any training), and their
    means over the seeds."""
    seeds = []
    for seed in range(ctx.plan.seeds):
        path = ctx.model_file(run_name(seed, 'init-t-cnn'))
        result = _analyse(ctx, path)
        seeds.append({'seed': seed, 'model_file': path, **{key: _layer_means(result, key) for key in ANALYSIS_MEANS},
                      'analysis': result})
    out: Dict[str, Any] = {}
    for key in ANALYSIS_MEANS:
        values = [s[key] for s in seeds if s[key] is not None]
        out[key] = sum(values) / len(values) if values else None
    out['seeds'] = seeds
    return out


def draw_figures(ctx: Context, results: Mapping[str, Any]) -> Dict[str, Any]:
    fig_dir = os.path.join(ctx.out, 'figures')
    os.makedirs(fig_dir, exist_ok=True)
    figures: Dict[str, Any] = {}
    figures['robustness'] = plots.plot_demo_robustness(results, os.path.join(fig_dir, 'fig3_robustness.png'),
                                                       titles=ARM_TITLES)
    curves = {}
    for run in results['runs']:
        if run['seed'] == 0:
            curves[run['arm']] = plots.plot_training_curves(
                plots.load_metrics(run['run_dir']), os.path.join(fig_dir, f'fig4_curves_{run["name"]}.png'),
                title=f'{ARM_TITLES[run["arm"]]} (seed 0)')
    figures['curves'] = curves
    t_cnn = next(r for r in results['runs'] if r['arm'] == 't-cnn' and r['seed'] == 0)
    figures['attention'] = _inspect(ctx, t_cnn['model_file'], t_cnn['name'])
    return figures
