#!/usr/bin/env bash
# README's main job as a new user runs it, timed: a clean clone of this checkout's HEAD, a new virtual environment,
# `pip install .`, then `tcnn demo` (offline), under /usr/bin/time. Writes DIR/timing.json (schema tcnn-demo-timing:
# the install, the wall/user/kernel time, every run's epochs, the headline) and prints the demo's last lines.
#
#     bash benchmarks/demo_fresh_install.sh DIR [tcnn demo arguments...]
#
# Two calls into two folders on one machine must print the same headline (docs/demo.md, "Reproducible numbers").
set -euo pipefail
DIR=$(realpath -m "${1:?usage: demo_fresh_install.sh DIR [tcnn demo arguments...]}")
shift
REPO=$(cd "$(dirname "$0")/.." && pwd)
[ ! -e "$DIR" ] || { echo "$DIR exists: give a new folder" >&2; exit 2; }
mkdir -p "$DIR"
git clone -q "$REPO" "$DIR/tcnn"
start=$SECONDS
python3 -m venv "$DIR/venv"
"$DIR/venv/bin/pip" install -q "$DIR/tcnn" >"$DIR/pip.log" 2>&1 || { tail -20 "$DIR/pip.log" >&2; exit 1; }
pip_s=$((SECONDS - start))
cd "$DIR"  # not the clone: the installed package runs, not the source tree
HF_HUB_OFFLINE=1 /usr/bin/time -v "$DIR/venv/bin/tcnn" demo --out "$DIR/demo" --no-progress "$@" \
    >"$DIR/demo.log" 2>"$DIR/time.txt"
"$DIR/venv/bin/python" - "$DIR" "$pip_s" "$(git -C "$DIR/tcnn" rev-parse --short HEAD)" <<'EOF'
import json, os, platform, re, sys
import numpy, PIL, timm, torch, torchvision
from tcnn.evaluation.plots import load_metrics
folder, pip_s, commit = sys.argv[1], float(sys.argv[2]), sys.argv[3]
text = open(os.path.join(folder, 'time.txt')).read()
def field(name):
    return re.search(rf'{re.escape(name)}: (.+)', text).group(1).strip()
wall = field('Elapsed (wall clock) time (h:mm:ss or m:ss)').split(':')
wall_s = sum(float(p) * 60 ** i for i, p in enumerate(reversed(wall)))
results = json.load(open(os.path.join(folder, 'demo', 'results.json')))
runs = {}
for r in results['runs']:
    rows = load_metrics(r['run_dir'])
    runs[r['name']] = {k: [row.get(k) for row in rows] for k in ('epoch_time_s', 'img_per_s', 'data_wait')}
out = {'schema': 'tcnn-demo-timing', 'command': 'bash benchmarks/demo_fresh_install.sh DIR',
       'install': {'pip_install_s': pip_s, 'torch': torch.__version__, 'torchvision': torchvision.__version__,
                   'timm': timm.__version__, 'pillow': PIL.__version__, 'numpy': numpy.__version__,
                   'tcnn_commit': commit},
       'machine': f'{os.cpu_count()} CPUs, {results["environment"]["cpu"]} ({platform.machine()})',
       'wall_s': wall_s, 'user_s': float(field('User time (seconds)')), 'sys_s': float(field('System time (seconds)')),
       'max_rss_mib': float(field('Maximum resident set size (kbytes)')) / 1024,
       'timings_s': results['timings_s'], 'runs': runs,
       'headline': {'summary': results['summary'], 'judgement': results['judgement']}}
with open(os.path.join(folder, 'timing.json'), 'w') as f:
    json.dump(out, f, indent=1)
print(f'pip install {pip_s:.0f} s; tcnn demo {wall_s / 60:.1f} min wall ({out["user_s"]:.0f} s user, '
      f'{out["sys_s"]:.0f} s kernel); {os.path.join(folder, "timing.json")}')
EOF
tail -n 12 "$DIR/demo.log"
