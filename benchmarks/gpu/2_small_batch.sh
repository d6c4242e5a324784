#!/usr/bin/env bash
# Issue 22, item 3 (eager): is the T-CNN still host-bound at small batches? One GPSA layer's wall time against its GPU
# kernel time, kernel launches and operators (benchmarks/profile_layer.py: inference, training forward, forward and
# backward at batch 1, 32, 256), then resnet50d and resnetrs50 against their CNNs at 224 px, batch 1, 32 and 256,
# bf16, channels_last (benchmarks/run.py). About 4 minutes on an H100 (README.md).
# SMOKE=1: the same code paths on the CPU (64 channels, a tiny model at 64 px, one repeat).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
environment
if [ "$SMOKE" = 1 ]; then
    LAYER=(--device cpu --channels 64 --batch-size 1 2)
    RUN=(--device cpu --smoke --sizes 64 --batch-size 1 2 --no-profile)
else
    LAYER=(--device cuda --amp --channels-last --batch-size 1 32 256)
    RUN=(--device cuda --amp --channels-last --models resnet50d resnetrs50 --sizes 224 --batch-size 1 32 256)
fi
step layer_profile timeout 150 "$PY" benchmarks/profile_layer.py "${LAYER[@]}" \
    --out "$WORK/results/$DEVICE-gpsa-layer-profile-$DATE.json"
step small_batch timeout 330 "$PY" benchmarks/run.py "${RUN[@]}" --variants --sections models --label small_batch \
    --out "$WORK/results"
pack small-batch
