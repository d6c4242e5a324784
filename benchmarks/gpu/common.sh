# Sourced by the session scripts of benchmarks/gpu/ (see README.md there): repository root, SMOKE mode, $OUT, the
# Python environment (PYTHONPATH, carried wheels), logging and packing of what comes back.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
SMOKE=${SMOKE:-0}
if [ "$SMOKE" = 1 ]; then
    DEVICE=cpu
    OUT=${OUT:-$(mktemp -d /tmp/tcnn-gpu-smoke-out.XXXXXX)}
else
    DEVICE=cuda
fi
: "${OUT:?OUT must name the folder that comes back (the device tool sets it)}"
WORK=$(mktemp -d /tmp/tcnn-gpu-work.XXXXXX)  # logs and results, packed into $OUT at the end
mkdir -p "$WORK/results" "$OUT"
PY=${PYTHON:-python3}
"$PY" -c "import torch" || { echo "$PY cannot import torch" >&2; exit 1; }
DATE=$(date +%F)
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
# a copy of the tree has no .git: the caller may name the commit (TCNN_GIT_COMMIT=abc1234 bash ...)
TCNN_GIT_COMMIT=${TCNN_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export TCNN_GIT_COMMIT

# tcnn from this tree (no install: the device has no network, and a smoke run must not touch the local venv);
# wheels carried in .whl/ (timm >= 1.0.31 where the machine's is older) go to a folder of their own, ahead of
# site-packages
SITE=/tmp/tcnn-gpu-site
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
        || { echo "installing .whl/*.whl failed" >&2; exit 1; }
    export PYTHONPATH=$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi

step() {  # step NAME COMMAND...: run with its output in $WORK/NAME.log (and on the terminal), time it
    local name=$1; shift
    local start=$SECONDS
    echo "=== $name: $*" | tee -a "$WORK/steps.log"
    "$@" 2>&1 | tee "$WORK/$name.log"
    local code=${PIPESTATUS[0]}
    echo "=== $name: exit $code after $((SECONDS - start)) s" | tee -a "$WORK/steps.log"
    return 0
}

environment() {  # versions, the GPU, what tcnn is imported from
    {
        echo "smoke=$SMOKE device=$DEVICE commit=$TCNN_GIT_COMMIT date=$(date -Is) cpus=$(nproc)"
        "$PY" - <<'PY'
import sys, torch, timm, tcnn
print('python', sys.version.split()[0], 'torch', torch.__version__, 'timm', timm.__version__, 'tcnn', tcnn.__version__,
      tcnn.__file__)
print('cuda', torch.version.cuda, 'available', torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')
if tuple(int(p) for p in timm.__version__.split('.')[:3] if p.isdigit()) < (1, 0, 31):
    print('WARNING: timm < 1.0.31 (setup.cfg): carry its wheel in .whl/ (benchmarks/gpu/README.md)')
PY
        command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    } 2>&1 | tee "$WORK/environment.log"
}

pack() {  # pack NAME: $WORK's results JSONs to $OUT as they are, everything else in $OUT/NAME-logs.tar.gz
    local name=$1
    cp "$WORK"/results/*.json "$OUT"/ 2>/dev/null
    tar -czf "$OUT/$name-logs.tar.gz" -C "$WORK" --exclude='*.pt' --exclude='*.jpg' --exclude='*.png' .
    rm -rf "$WORK"  # checkpoints and data of the runs: only what was packed comes back
    echo "packed into $OUT:"; ls -la "$OUT"
}

# A script with a time budget (first.sh, third.sh) sets BUDGET (seconds from its start) and defines pack_now (what it
# has produced so far into $OUT); its steps are then:
limit() {  # limit CAP RESERVE: CAP seconds, cut so that RESERVE seconds stay for the steps after it (0: no time)
    local left=$((BUDGET - SECONDS - $2))
    local t=$(($1 < left ? $1 : left))
    echo $((t < 15 ? 0 : t))
}

timed_step() {  # timed_step NAME CAP RESERVE COMMAND...: step under the cut limit, then pack
    local name=$1 t; t=$(limit "$2" "$3"); shift 3
    if [ "$t" = 0 ]; then
        echo "=== $name: skipped, no time left ($SECONDS s of $BUDGET)" | tee -a "$WORK/steps.log"
    else
        step "$name" timeout -k 10 "$t" "$@"
    fi
    pack_now
}

# The paper demo's epochs (benchmarks/demo_epoch.py, arguments in DEMO) as the step demo_epoch (100 s): their JSON in
# results/, their metrics and logs in demo_epoch/; their data and checkpoints in a temporary folder, out of the logs
demo_epoch_step() {
  local dir suffix
  dir=$(mktemp -d /tmp/tcnn-demo-epoch.XXXXXX)
  suffix=$([ "$SMOKE" = 1 ] && echo cpu-smoke || echo cuda)
  timed_step demo_epoch 100 0 "$PY" benchmarks/demo_epoch.py "${DEMO[@]}" --out "$dir" \
      --json "$WORK/results/$suffix-demo-epoch-$DATE.json"
  mkdir -p "$WORK/demo_epoch"
  (cd "$dir" && cp -r --parents runs/*/metrics.jsonl runs/*/log.txt "$WORK/demo_epoch/" 2>/dev/null)
  rm -rf "$dir"
}
