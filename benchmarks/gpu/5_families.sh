#!/usr/bin/env bash
# Issue 22, item 5: T-CNN vs CNN on the GPU beyond the ResNets (benchmarks/run.py: convnext_tiny stages.3,
# resnext50_32x4d, efficientnet_b0 at 224 px, batch 32 and 256, bf16, channels_last, and the conversion) and the
# depthwise product's two orders (benchmarks/depthwise.py, bf16 and float32: does folding_pays pick the faster one on
# the GPU?). About 5 minutes on an H100 (README.md).
# SMOKE=1: the same code paths on the CPU at 64 px, batch 2, one repeat.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
environment
MODELS=(--models convnext_tiny resnext50_32x4d efficientnet_b0 --stages convnext_tiny=stages.3)
if [ "$SMOKE" = 1 ]; then
    RUN=(--device cpu --smoke --sizes 64 --batch-size 2 --no-profile)
    DW=(--device cpu --batch-size 1 --repeats 1 --warmup 0 --cases efficientnet_b0:blocks.6)
else
    RUN=(--device cuda --amp --channels-last --sizes 224 --batch-size 32 256)
    DW=(--device cuda --batch-size 1 32 128 --repeats 10 --iters 5 --warmup 3)
fi
step families timeout 330 "$PY" benchmarks/run.py "${RUN[@]}" "${MODELS[@]}" --variants --sections models conversion \
    --label families --out "$WORK/results"
step depthwise_bf16 timeout 90 "$PY" benchmarks/depthwise.py "${DW[@]}" --amp \
    --out "$WORK/results/$DEVICE-depthwise-bf16-$DATE.json"
step depthwise_fp32 timeout 90 "$PY" benchmarks/depthwise.py "${DW[@]}" \
    --out "$WORK/results/$DEVICE-depthwise-fp32-$DATE.json"
pack families
