"""Machine description, the results file ``<device>-<date>.json`` and the markdown summary ``README.md``."""
import datetime
import glob
import json
import os
import platform
import subprocess
from typing import Any, Dict, List, Optional

import torch

from tcnn.atomic import atomic_write_text
from tcnn.demo.pool import cpu_model

__all__ = ['machine_info', 'config_tag', 'result_name', 'load_average', 'write_json', 'render_result', 'write_readme']

SCHEMA = 'tcnn-benchmark/1'
# A results folder's README: a hand-written head (what the folder holds, comparisons made by hand), this line, then
# what write_readme generates from the JSON files, which every run rewrites
GENERATED_BELOW = ('<!-- Generated below this line by benchmarks/report.py from the JSON files of this folder '
                   '(python -m benchmarks.report); a rewrite keeps what stands above it. -->')
MIB = 2 ** 20


def _memory_gib() -> Optional[float]:
    try:
        with open('/proc/meminfo') as f:
            for line in f:
                if line.startswith('MemTotal'):
                    return round(int(line.split()[1]) / 2 ** 20, 1)
    except OSError:
        pass
    return None


def _git_commit() -> Optional[str]:
    """``$TCNN_GIT_COMMIT`` if set, else the checkout's commit.

    The variable comes first: a rented GPU machine gets a copy of the working tree whose ``.git``, where it has
    one, may name an older commit than the files (seen on 2026-11-26: the base commit of the session, not the
    commit that was run), so the caller names the commit (benchmarks/gpu/README.md)."""
    if os.environ.get('TCNN_GIT_COMMIT'):
        return os.environ['TCNN_GIT_COMMIT']
    try:
        out = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True, timeout=5,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
        commit = out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ''
    return commit or None


def load_average() -> Optional[List[float]]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def machine_info(device: torch.device) -> Dict[str, Any]:
    """CPU model, cores and threads, memory, software versions, the GPU if any, and the load at start."""
    import timm
    import tcnn
    info = {
        'cpu': cpu_model(),
        'logical_cpus': os.cpu_count(),
        'usable_cpus': len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count(),
        'torch_threads': torch.get_num_threads(),
        'memory_gib': _memory_gib(),
        'os': platform.platform(),
        'python': platform.python_version(),
        'torch': torch.__version__,
        'timm': timm.__version__,
        'tcnn': tcnn.__version__,
        'git_commit': _git_commit(),
        'loadavg_start': load_average(),
    }
    if device.type == 'cuda':
        props = torch.cuda.get_device_properties(device)
        info['gpu'] = {'name': props.name, 'memory_gib': round(props.total_memory / 2 ** 30, 1),
                       'capability': f'{props.major}.{props.minor}', 'cuda': torch.version.cuda,
                       'cudnn': torch.backends.cudnn.version()}
    return info


def config_tag(settings) -> str:
    """``<device>-<preset>[-cputime][-bf16][-channels_last][-compile[-<mode>]][-<label>]``: what makes runs
    comparable (the default mode keeps the plain ``compile`` of the results written before modes existed)."""
    tag = [settings.torch_device.type, settings.preset]
    if settings.timer == 'cpu':
        tag.append('cputime')
    if settings.amp:
        tag.append('bf16')
    if settings.channels_last:
        tag.append('channels_last')
    if settings.compile:
        tag.append('compile' if settings.compile in (True, 'default') else f'compile-{settings.compile}')
    if getattr(settings, 'label', ''):
        tag.append(settings.label)
    return '-'.join(tag)


def result_name(settings) -> str:
    """``<config tag>-<date>``: the results file name (without ``.json``), one per configuration and day."""
    return f'{config_tag(settings)}-{datetime.date.today().isoformat()}'


def write_json(results: Dict[str, Any], path: str) -> None:
    atomic_write_text(path, json.dumps(results, indent=1) + '\n')


# ---------------------------------------------------------------------------------------------- markdown


def _f(v: Optional[float], digits: int = 1) -> str:
    return '-' if v is None else f'{v:.{digits}f}'


def _table(header: List[str], rows: List[List[str]]) -> List[str]:
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    lines += ['| ' + ' | '.join(r) + ' |' for r in rows]
    return lines + ['']


def _compile_text(mode: Any) -> str:
    """``eager``, or ``torch.compile`` and its mode (``True``: results of runs before modes existed: the default)."""
    return f'torch.compile {"default" if mode is True else mode}' if mode else 'eager'


def _describe(res: Dict[str, Any]) -> List[str]:
    m, s = res['machine'], res['settings']
    cpu = (f'{m["cpu"]}, {m["usable_cpus"]} usable of {m["logical_cpus"]} logical CPUs, {m["torch_threads"]} torch '
           f'threads, {_f(m["memory_gib"], 0)} GiB')
    gpu = f'; GPU {m["gpu"]["name"]} ({m["gpu"]["memory_gib"]} GiB, CUDA {m["gpu"]["cuda"]})' if 'gpu' in m else ''
    mode = ', '.join([('bf16 autocast' if s['amp'] else 'fp32'), _compile_text(s['compile']),
                      ('channels_last' if s['channels_last'] else 'contiguous')])
    clock = 'CPU-time clock, one thread' if s.get('timer') == 'cpu' else 'wall clock'
    load = f'load average {m["loadavg_start"][0]} at start, {res["loadavg_end"][0]} at end' \
        if m.get('loadavg_start') and res.get('loadavg_end') else ''
    return [
        f'Machine: {cpu}{gpu}. torch {m["torch"]}, timm {m["timm"]}, tcnn {m["tcnn"]}'
        f'{" @ " + m["git_commit"] if m.get("git_commit") else ""}.',
        f'Run: {mode}; {clock}; {s["repeats"]} repeats after {s["warmup"]} warm-up, {s["iters"]} call(s) per repeat, '
        'medians; '
        f'{load}; {res["wall_time_s"] / 60:.1f} min in all.', '',
    ]


def _goals(res: Dict[str, Any]) -> List[str]:
    goals = res.get('goals', [])
    if not goals:
        return []
    rows = [[g['goal'], g['subject'], _f(g['value'], 3), g['target'], 'pass' if g['passed'] else '**MISS**']
            for g in goals]
    return ['### Goals (issue 5)', ''] + _table(['goal', 'measured on', 'value', 'target', ''], rows)


def _models(res: Dict[str, Any]) -> List[str]:
    rows, alt = [], []
    for r in res.get('models', []):
        inf, tr, mem = r['inference'], r['train'], r['memory']
        rows.append([
            r['model'], str(r['size']), str(r['batch_size']),
            _f(inf['cnn']['img_s']), _f(inf['tcnn']['img_s']), f'**{_f(r["inference_ratio"]["tcnn"], 2)}**',
            _f(tr['cnn']['img_s']), _f(tr['tcnn']['img_s']), f'**{_f(r["train_ratio"]["tcnn"], 2)}**',
            _f(mem['cnn']['train']['peak_bytes'] / MIB, 0), _f(mem['tcnn']['train']['peak_bytes'] / MIB, 0),
            _f(r['memory_ratio']['tcnn']['train'], 3),
            _f(r['gflops']['cnn'], 2), _f(r['gflops']['tcnn'], 2), _f(r['flops_ratio']['tcnn'], 3),
            _f(r['params']['cnn'] / 1e6, 1), _f(r['params']['tcnn'] / 1e6, 1),
        ])
        for k in r['inference_ratio']:
            if k != 'tcnn':
                alt.append([r['model'], str(r['size']), str(r['batch_size']), k.replace('tcnn_', 'T-CNN, '),
                            _f(r['inference_ratio'][k], 2), _f(r['train_ratio'][k], 2),
                            _f(r['memory_ratio'][k]['train'], 3), _f(r['flops_ratio'][k], 3)])
    if not rows:
        return []
    out = ['### Whole models: T-CNN against its own CNN', '',
           'img/s of the inference forward and of the training step (forward, backward, AdamW step); peak memory '
           'of the training step; forward GFLOPs per image (`torch.utils.flop_counter`, 2 per multiply-add); '
           'ratios are T-CNN / CNN (speed: > 1 is faster).', '']
    out += _table(['model', 'px', 'batch', 'infer CNN', 'infer T-CNN', 'ratio', 'train CNN', 'train T-CNN', 'ratio',
                   'mem CNN MiB', 'mem T-CNN MiB', 'ratio', 'GFLOPs CNN', 'GFLOPs T-CNN', 'ratio', 'params CNN M',
                   'params T-CNN M'], rows)
    if alt:
        out += ['Other designs of the GPSA layer in the same model (ratios to the CNN, same run): `sdpa` = content '
                'attention through `scaled_dot_product_attention` + separate positional matmul, `reference` = the '
                'straightforward GPSA (`benchmarks/reference_gpsa.py`).', '']
        out += _table(['model', 'px', 'batch', 'design', 'infer ratio', 'train ratio', 'mem ratio', 'FLOPs ratio'],
                      alt)
    return out


def _layers(res: Dict[str, Any]) -> List[str]:
    layers = res.get('layers', [])
    if not layers:
        return []
    rows = []
    # rows of several batch sizes (runs merged into one results file) get a batch column
    mixed = len({r['batch_size'] for r in layers}) > 1
    for r in layers:
        ms = lambda k: f'{_f(r["fwd"][k]["ms"], 2)} / {_f(r["fwd_bwd"][k]["ms"], 2)}'  # noqa: E731
        sp = lambda k: f'{_f(r["fwd_speedup"][k], 2)} / {_f(r["fwd_bwd_speedup"][k], 2)}'  # noqa: E731
        rows.append(([str(r['batch_size'])] if mixed else []) + [
            f'{r["in_size"]}->{r["grid"]}', str(r['stride']), ms('conv'), ms('gpsa'), ms('gpsa_sdpa'),
            ms('reference'), f'**{sp("gpsa_vs_reference")}**', sp('gpsa_vs_sdpa'), sp('gpsa_vs_conv'),
            ' / '.join(_f(r['gflops'][k], 3) for k in ('conv', 'gpsa', 'gpsa_sdpa', 'reference')),
            ' / '.join(_f(r['memory_fwd_bwd'][k] / MIB, 1) for k in ('conv', 'gpsa', 'gpsa_sdpa', 'reference')),
        ])
    first = layers[0]
    batch = 'batch as given' if mixed else f'batch {first["batch_size"]}'
    return ['### One last-stage layer', '',
            f'{first["channels"]} -> {first["channels"]} channels, 3x3, {batch}; milliseconds '
            'per call as forward / forward+backward; speed-ups > 1 mean ours is faster; GFLOPs per image and peak '
            'forward+backward MiB as conv / ours / SDPA / reference.', ''] + _table(
        (['batch'] if mixed else []) + ['grid in->out', 'stride', 'conv ms', 'ours ms', 'SDPA ms', 'reference ms',
                                        'ours vs reference', 'ours vs SDPA', 'ours vs conv', 'GFLOPs', 'peak MiB'],
        rows)


def _conversion(res: Dict[str, Any]) -> List[str]:
    rows = [[r['model'], _f(r['seconds']['no_verify'], 2), _f(r['seconds']['verify'], 2),
             f'{r["verify_batch_size"]}x{"x".join(map(str, r["verify_input_size"]))}', f'{r["max_rel_err"]:.1e}']
            for r in res.get('conversion', [])]
    if not rows:
        return []
    return ['### Conversion time (`tcnn.reparameterize`)', ''] + _table(
        ['model', 'seconds', 'seconds with verification', 'verification input', 'verified max rel logits error'],
        rows)


def _gflops_at(row_at_res: Optional[Dict[str, Any]], row: Optional[Dict[str, Any]], key: str) -> Optional[float]:
    """GFLOPs of ``key`` at the paper's resolution: from the run's row at that size, or counted apart."""
    if row_at_res is not None:
        return row_at_res['gflops'][key]
    return (row or {}).get('gflops_at_paper_res', {}).get(key)


def _paper(res: Dict[str, Any]) -> List[str]:
    ours = {}
    for r in res.get('models', []):
        ours.setdefault(r['model'], r)
        if r['size'] == res['settings']['goal_size']:
            ours[r['model']] = r
    by_size = {(r['model'], r['size']): r for r in res.get('models', [])}
    rows = []
    for name, p in res.get('paper', {}).items():
        o = ours.get(name)
        at_paper = [_gflops_at(by_size.get((name, p[k]['res'])), o, k) for k in ('cnn', 'tcnn')]
        rows.append([
            name, f'{p["cnn"]["res"]} / {p["tcnn"]["res"]}', f'{p["cnn"]["params_m"]} / {p["tcnn"]["params_m"]}',
            f'{p["cnn"]["gflops"]} / {p["tcnn"]["gflops"]}', f'{p["cnn"]["img_s"]} / {p["tcnn"]["img_s"]}',
            _f(p['gflops_ratio_same_res'], 2), _f(p['finetune_speed_ratio'], 2),
            f'{_f(o["params"]["cnn"] / 1e6)} / {_f(o["params"]["tcnn"] / 1e6)}' if o else '-',
            ' / '.join(_f(v, 2) for v in at_paper),
            f'{_f(o["gflops"]["cnn"], 2)} / {_f(o["gflops"]["tcnn"], 2)} @ {o["size"]}' if o else '-',
            _f(o['flops_ratio']['tcnn'], 2) if o else '-', _f(o['train_ratio']['tcnn'], 2) if o else '-',
        ])
    if not rows:
        return []
    return ['### Beside the paper', '',
            'Left: **the paper\'s figures** (T-CNN, arXiv:2106.05795, Table 2: V100, batch 32, CNN at its training '
            'resolution, T-CNN at its fine-tuning resolution; GFLOPs in the same 2-per-multiply-add convention as '
            'ours; the same-resolution ratio scales the CNN by pixel count, an approximation; fine-tuning speed '
            'SA / no-SA from Table 1 times). Right: **ours**, this run, both at the same resolution.', ''] + \
        _table(['model', 'paper res CNN / T', 'paper params M', 'paper GFLOPs', 'paper img/s V100',
                'paper T/CNN GFLOPs same res', 'paper fine-tune speed SA/no-SA', 'our params M',
                'our GFLOPs at the paper\'s res', 'our GFLOPs same res', 'our T/CNN FLOPs', 'our train speed T/CNN'],
               rows)


def _profiles(res: Dict[str, Any]) -> List[str]:
    out = []
    for p in res.get('profiles', []):
        head = (f'#### Profile of a missed goal: {p["model"]} {p["size"]}px batch {p["batch_size"]}, {p["mode"]} '
                f'(eager, `torch.profiler`): CNN {_f(p["total_ms"]["cnn"])} ms, T-CNN {_f(p["total_ms"]["tcnn"])} ms '
                'per step; the ops whose self time grew most, then those that shrank most')
        rows = [[f'`{o["op"]}`', _f(o['cnn_ms']), _f(o['tcnn_ms']), _f(o['delta_ms'])]
                for o in p['top_increases_ms'] + p.get('top_decreases_ms', [])]
        out += [head, ''] + _table(['op', 'CNN ms', 'T-CNN ms', 'delta ms'], rows)
    return out


def render_result(res: Dict[str, Any]) -> str:
    """Markdown section of one results file."""
    title = f'## {res["name"]}'
    lines = [title, '', f'`{res["command"]}`', ''] + _describe(res)
    if res.get('partial'):
        lines += ['**Partial**: the run was stopped (a time limit) before it finished; the rows below are the ones it '
                  'had measured.', '']
    for part in (_goals, _models, _layers, _conversion, _paper, _profiles):
        lines += part(res)
    return '\n'.join(lines)


_GLANCE = [  # (column, goal names): the worst value over every row that measures the goal
    ('inference T/CNN', ('inference img/s T-CNN / CNN',)),
    ('training step T/CNN', ('training step img/s T-CNN / CNN',)),
    ('train memory T/CNN', ('peak training memory T-CNN / CNN',)),
    ('FLOPs T/CNN', ('forward FLOPs T-CNN / CNN',)),
    ('GPSA vs reference, stride 2',
     ('GPSA speed vs reference (forward)', 'GPSA speed vs reference (forward+backward)')),
]


def _at_a_glance(results: List[Dict[str, Any]]) -> List[str]:
    """One line per run: the worst value of each goal (lowest speed ratio, highest cost ratio) and where."""
    rows = []
    for res in results:
        m, cells = res['machine'], []
        device = m['gpu']['name'] if 'gpu' in m else f'{m["cpu"]}, {m["torch_threads"]} thread(s)'
        for _, names in _GLANCE:
            goals = [g for g in res.get('goals', []) if g['goal'] in names]
            if not goals:
                cells.append('-')
                continue
            worst = min(goals, key=lambda g: g['value'] if g['target'].startswith('>=') else -g['value'])
            mark = '' if worst['passed'] else ' **MISS**'
            cells.append(f'{_f(worst["value"], 3)}{mark} ({worst["subject"].split(" batch")[0]})')
        passed = sum(g['passed'] for g in res.get('goals', []))
        anchor = res['name'].lower()
        rows.append([f'[{res["name"]}](#{anchor})', device, str(len(res.get('models', []))), *cells,
                     f'{passed} / {len(res.get("goals", []))}'])
    header = ['run', 'device', 'model rows', *(c for c, _ in _GLANCE), 'goals met']
    return ['## At a glance', '', 'Worst value of each goal in each run (lowest speed ratio, highest cost ratio), and '
            'where it was measured; targets: speed >= 0.9, memory <= 1.15, FLOPs <= 1.1 (all at 224 px), GPSA vs '
            'reference >= 2.', ''] + _table(header, rows) + ['']


def _hand_written_head(path: str) -> str:
    """What stands above ``GENERATED_BELOW`` in the README at ``path``, which a rewrite keeps; the title alone where
    the README or its marker is missing (then the whole file is rewritten)."""
    try:
        with open(path, encoding='utf-8') as f:
            text = f.read()
    except FileNotFoundError:
        text = ''
    head, found, _ = text.partition(GENERATED_BELOW)
    return head.rstrip() + '\n' if found else '# Benchmark results\n'


def write_readme(directory: str) -> str:
    """(Re)write ``README.md`` of a results folder from its JSON files: the newest file of each configuration, below
    the README's hand-written head (kept as it is)."""
    newest: Dict[str, Dict[str, Any]] = {}
    for path in sorted(glob.glob(os.path.join(directory, '*.json'))):
        with open(path) as f:
            res = json.load(f)
        if res.get('schema') != SCHEMA:
            continue
        key = res['config']
        if key not in newest or res['date'] >= newest[key]['date']:
            newest[key] = res
    parts = [
        'Generated by `benchmarks/run.py` from the JSON files of this folder (the newest of each configuration); '
        'what is measured and how: [docs/benchmarks.md](../../docs/benchmarks.md). Ratios compare things measured '
        'side by side, interleaved, in one process; absolute img/s depend on the machine and its load.', '',
    ]
    parts += _at_a_glance([newest[k] for k in sorted(newest)])
    for key in sorted(newest):
        parts.append(render_result(newest[key]))
    path = os.path.join(directory, 'README.md')
    atomic_write_text(path, f'{_hand_written_head(path)}\n{GENERATED_BELOW}\n\n' + '\n'.join(parts).rstrip() + '\n')
    return path


if __name__ == '__main__':  # python -m benchmarks.report [DIR]: rewrite DIR/README.md from its JSON files
    import sys
    print(write_readme(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), 'results')))
