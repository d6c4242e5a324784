#!/usr/bin/env bash
# Issue 22, item 3 (CUDA graphs): resnet50d and its T-CNN compiled with torch.compile(mode='reduce-overhead') at
# 224 px, bf16, channels_last, batch 32 (and 1 where time is left), against each other (benchmarks/run.py --compile
# reduce-overhead). Compiling a training step took about 150 s per model on the last H100 (default mode), so this is
# the longest command: about 8 minutes (README.md). Run it after 2_small_batch.sh, whose eager numbers it is read
# against. MODELS="resnet50d resnetrs50" adds the second model (about 15 minutes: split it over two calls).
# SMOKE=1: the same code paths on the CPU (a tiny model at 64 px; no CUDA graphs there).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
environment
if [ "$SMOKE" = 1 ]; then
    RUN=(--device cpu --smoke --sizes 64 --batch-size 2 --no-profile)
else
    read -r -a NAMES <<< "${MODELS:-resnet50d}"
    RUN=(--device cuda --amp --channels-last --models "${NAMES[@]}" --sizes 224 --batch-size ${BATCHES:-32})
fi
step compiled timeout 540 "$PY" benchmarks/run.py "${RUN[@]}" --compile reduce-overhead --variants --sections models \
    --label small_batch --out "$WORK/results"
pack compiled
