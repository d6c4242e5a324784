#!/usr/bin/env bash
# Issues 45 and 46: the command of a session lent a GPU, first.sh's successor (its step questions are answered,
# benchmarks/gpu/README.md). At most 8 minutes on an H100; every step under its own `timeout`, cut to what is left of
# SECOND_BUDGET (480 s), and everything packed into $OUT again after each step.
#
#   phase 1, at once (untimed, so they share the machine):
#     - tests/test_cuda.py, all of it (the training tests on a CNN whose last BNs are not zero, so the GPSA layers
#       matter; the data pipelines on the GPU: nvjpeg against Pillow, the batched augmentation against the CPU,
#       training on the device and resident pipelines);
#     - the exact mid-epoch resume on the device and resident pipelines with TCNN_TEST_DEVICE=cuda;
#     - the data: 20,000 ImageNet-size JPEGs (benchmarks/photos.py: 2,000 distinct, the rest hard links) and the
#       paper demo's images;
#   phase 2, one at a time (timed):
#     - loader only (benchmarks/loader.py): the recipe's augmentation at 224 px, batch 256, on the PIL pipeline with 8
#       and 16 workers and on the device pipeline (nvjpeg) with 8; the demo's data resident on the GPU;
#     - the whole loop (benchmarks/loop.py): tcnn train under torchrun --nproc_per_node 1 (NCCL), resnet50d T-CNN and
#       CNN, bf16, channels_last, batch 256, the recipe's augmentation, 2 epochs of the 20k JPEGs each, on the PIL
#       pipeline (16 workers) and the device pipeline (8 workers): loop and step img/s, data wait, GPU utilisation;
#     - the paper-schedule demo's epochs (benchmarks/demo_epoch.py, 4 processes sharing the GPU, its data resident)
#       and the whole paper demo's time estimated from them.
# What is left for a later command (FAMILIES=1 here, with more than 8 minutes): 5_families.sh.
#
# SMOKE=1: the same steps on the CPU with tiny sizes (a few CPU tests), to try the script.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
BUDGET=${SECOND_BUDGET:-480}
environment

if [ "$SMOKE" = 1 ]; then
    CUDA_SELECT=(-k 'batched_pipelines')
    RESUME_SELECT=(-k 'resident')
    TEST_FILE=tests/test_data_pipeline.py  # test_cuda.py skips on the CPU: the same pipelines' CPU tests instead
    LOADER=(--device cpu --smoke --workers 1 --pipelines pil device resident)
    LOOP=(--smoke --device cpu --pipelines pil device --workers 2)
    DEMO=(--smoke --device cpu --jobs 2 --seeds 2)
    PHOTOS=(--train 48 --val 12 --unique 16)
else
    CUDA_SELECT=()
    RESUME_SELECT=(-k 'mid_epoch_resume_is_exact_on_the_batched_pipelines')
    TEST_FILE=tests/test_cuda.py
    LOADER=(--device cuda --workers 8 16 --pipelines pil device resident --batch-size 256 --passes 1)
    LOOP=(--device cuda --pipelines pil device --workers 16 8 --batch-size 256 --images 20000 --val-images 1000)
    DEMO=(--device cuda --jobs 4 --seeds 4 --epochs 2)
    PHOTOS=(--train 20000 --val 1000 --unique 2000)
fi
PYTEST=("$PY" -m pytest -p no:cacheprovider -rfEs --durations=15 -v -s)
PARALLEL=()
"$PY" -c 'import xdist' 2>/dev/null && [ "$SMOKE" != 1 ] && PARALLEL=(-n 2)
PHOTO_DIR=/tmp/tcnn-photos  # local disk, outside the tree; reused by a later call on the same machine

pack_now() {  # what is there so far into $OUT: results JSONs as they are, the logs in one archive, a summary
    cp "$WORK"/results/*.json "$OUT"/ 2>/dev/null
    tar -czf "$OUT/.second-logs.tar.gz" -C "$WORK" --exclude='*.pt' --exclude='*.png' --exclude='*.jpg' \
        --exclude=runs . && mv "$OUT/.second-logs.tar.gz" "$OUT/second-logs.tar.gz"
    {
        cat "$WORK/steps.log"
        grep -h -E '^(FAILED|ERROR) |^=+ .*(passed|failed|skipped|error).* in ' "$WORK"/*tests.log 2>/dev/null
        grep -h -E 'nvjpeg vs|cuda vs cpu' "$WORK"/*tests.log 2>/dev/null
        grep -h -E '^\| |T-CNN / CNN|steady epoch|estimated' "$WORK"/loader.log "$WORK"/loop.log \
            "$WORK"/demo_epoch.log 2>/dev/null
    } > "$OUT/second-summary.txt"
}

# ---- phase 1: the GPU tests, the resume tests and the data at once (nothing here is timed)
P1=$(limit 190 290)
echo "=== phase 1: limit $P1 s" | tee -a "$WORK/steps.log"
(
    step photos timeout -k 10 "$P1" "$PY" benchmarks/photos.py --out "$PHOTO_DIR" "${PHOTOS[@]}"
) &
DATA=$!
(
    step resume_tests env TCNN_TEST_DEVICE="$DEVICE" timeout -k 10 "$P1" "${PYTEST[@]}" \
        tests/test_data_pipeline.py --junitxml="$WORK/resume_tests.xml" "${RESUME_SELECT[@]}" >/dev/null
) &
RESUME=$!
step cuda_tests timeout -k 10 "$P1" "${PYTEST[@]}" "${PARALLEL[@]}" "$TEST_FILE" --junitxml="$WORK/cuda_tests.xml" \
    "${CUDA_SELECT[@]}"
wait "$DATA" "$RESUME"
pack_now

# ---- phase 2: timed, one at a time
timed_step loader 55 235 "$PY" benchmarks/loader.py "${LOADER[@]}" --data /tmp/tcnn-loader-bench \
    --out "$WORK/results/$DEVICE-loader-$DATE.json"
timed_step loop 165 70 "$PY" benchmarks/loop.py "${LOOP[@]}" --data "$PHOTO_DIR" --runs "$WORK/runs" \
    --out "$WORK/results"
find "$WORK/runs" \( -name '*.pt' -o -name tensorboard \) -prune -exec rm -rf {} + 2>/dev/null
DEMO_DIR=$(mktemp -d /tmp/tcnn-demo-epoch.XXXXXX)
SUFFIX=$([ "$SMOKE" = 1 ] && echo cpu-smoke || echo cuda)
timed_step demo_epoch 70 0 "$PY" benchmarks/demo_epoch.py "${DEMO[@]}" --out "$DEMO_DIR" \
    --json "$WORK/results/$SUFFIX-demo-epoch-$DATE.json"
mkdir -p "$WORK/demo_epoch"
(cd "$DEMO_DIR" && cp -r --parents runs/*/metrics.jsonl runs/*/log.txt "$WORK/demo_epoch/" 2>/dev/null)
rm -rf "$DEMO_DIR"
if [ "${FAMILIES:-0}" = 1 ]; then
    timed_step families 330 0 bash benchmarks/gpu/5_families.sh
fi
echo "=== second.sh: done after $SECONDS s" | tee -a "$WORK/steps.log"
pack_now
rm -rf "$WORK"
ls -la "$OUT"
