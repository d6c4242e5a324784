#!/usr/bin/env bash
# Issue 22, item 4: the whole training loop (benchmarks/loop.py): 20k JPEGs at 256 px generated on the local disk,
# tcnn train under torchrun --nproc_per_node 1 (NCCL), the recipe's full augmentation at 224 px, T-CNN and CNN
# (resnet50d, random weights, bf16, channels_last), loader workers 16 (the cores) and 8. About 5 minutes on an H100.
# SMOKE=1: loop.py --smoke on the CPU (gloo).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
environment
if [ "$SMOKE" = 1 ]; then
    ARGS=(--smoke --device cpu)
else
    ARGS=(--device cuda --workers "$(nproc)" 8)
fi
DATA=/tmp/tcnn-loop-data  # local disk, outside the tree; reused by a second call on the same machine
[ "$SMOKE" = 1 ] && DATA=$WORK/data
step loop timeout 500 "$PY" benchmarks/loop.py "${ARGS[@]}" --data "$DATA" --runs "$WORK/runs" \
    --out "$WORK/results"
# the runs' own records (metrics, status, recipe) beside their logs; checkpoints stay behind
find "$WORK/runs" \( -name '*.pt' -o -name tensorboard \) -prune -exec rm -rf {} + 2>/dev/null
pack loop
