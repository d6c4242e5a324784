#!/usr/bin/env bash
# Issue 33, item 5: tcnn demo on the paper's schedule (--plan paper: each seed's converged CNN, shipped with tcnn, then
# 50 fine-tuning epochs with 5 of warm-up for the no-SA, T-CNN and late T-CNN arms; 3 seeds) on the GPU, 4 training
# processes sharing it. It takes more than one 10-minute call: each call continues the demo where the last one
# stopped. The demo folder stays on the machine while it is warm; every call that does not finish also packs the
# demo's state (each run's last.pt and records, no data) into $OUT as paper-demo-state.tar.part-*, which a call on a
# fresh machine continues from when they are carried in .paper-demo-state/ (README.md, "The paper's schedule").
# SMOKE=1: --plan tiny on the CPU (DEMO_LIMIT=25 stops it part-way, to try the continuation).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
environment
DEMO=${PAPER_DEMO_DIR:-/tmp/tcnn-paper-demo}
STATE=${PAPER_DEMO_STATE:-.paper-demo-state}
if [ "$SMOKE" = 1 ]; then
    ARGS=(--plan tiny --device cpu --jobs 2 --workers 0)
    LIMIT=${DEMO_LIMIT:-300}
else
    ARGS=(--plan paper --device cuda --jobs "${JOBS:-4}")
    LIMIT=${DEMO_LIMIT:-510}  # of the call's 600 s: the start before, the stop (a checkpoint) and the packing after
fi

# a fresh machine: continue from the carried state, if any (the demo regenerates its data, the same images)
if [ ! -f "$DEMO/demo.json" ] && compgen -G "$STATE/paper-demo-state.tar.part-*" >/dev/null; then
    mkdir -p "$DEMO"
    cat "$STATE"/paper-demo-state.tar.part-* | tar -xzf - -C "$DEMO" || { echo "unpacking $STATE failed" >&2; exit 1; }
    echo "continuing from the carried state: $(ls "$DEMO/runs" | wc -l) run folder(s)" | tee -a "$WORK/steps.log"
fi

# a stop request (SIGTERM from timeout) makes every training run save its checkpoint and the demo exit 75
step demo timeout -s TERM -k 60 "$LIMIT" "$PY" -m tcnn demo "${ARGS[@]}" --out "$DEMO" --no-progress

mkdir -p "$WORK/demo"
(cd "$DEMO" && cp -r --parents demo.json runs/*/metrics.jsonl runs/*/config.yaml runs/*/status.json runs/*/log.txt \
    "$WORK/demo/" 2>/dev/null)
if [ -f "$DEMO/results.json" ]; then
    echo "the demo finished: its report comes back" | tee -a "$WORK/steps.log"
    SUFFIX=$([ "$SMOKE" = 1 ] && echo cpu-smoke || echo cuda)
    cp "$DEMO/results.json" "$WORK/results/$SUFFIX-paper-demo-$DATE.json"
    cp "$DEMO/README.md" "$DEMO/eval.json" "$DEMO/eval.md" "$WORK/demo/"
    tar -czf "$OUT/paper-demo-figures.tar.gz" -C "$DEMO" figures README.md
else
    # what a fresh machine needs to continue: the settings, every run's last checkpoint and records (complete runs
    # are exported again from theirs); in parts that fit what comes back (16 MiB a file)
    (cd "$DEMO" && tar -czf - demo.json runs/*/last.pt runs/*/metrics.jsonl runs/*/config.yaml runs/*/status.json \
        runs/*/log.txt 2>/dev/null) | split -b 15M -d - "$OUT/paper-demo-state.tar.part-"
    echo "the demo did not finish: its state is in $(ls "$OUT"/paper-demo-state.tar.part-* | wc -l) part(s)" \
        | tee -a "$WORK/steps.log"
fi
pack paper-demo
