#!/usr/bin/env bash
# Issue 40: the first (and usually only) command of a session lent a GPU: at most 8 minutes on an H100, the GPU
# questions in order of value, every step under its own `timeout`, what it produced packed into $OUT as soon as it
# ends (a step that hangs costs only its own results).
#
#   phase 1, at once (none of it is timed, so they share the machine):
#     - tests/test_cuda.py, all of it (junit XML; two pytest workers where pytest-xdist is installed);
#     - the one-process torchrun run with NCCL stopped by SIGTERM and resumed to the uninterrupted run's weights, and
#       the one-process SIGTERM mid-epoch run (tests/test_train_reliability.py with TCNN_TEST_DEVICE=cuda);
#     - a compile-cache warm-up: the four functions that phase 2 compiles (CNN and T-CNN, inference and training
#       step), each in a process of its own (benchmarks/warm_compile.py), so that inductor's and Triton's caches
#       hold their graphs and kernels (a training step compiled cold took about 150 s per model on the last H100;
#       phase 2 then traces and finds them in the cache)
#   phase 2, one after another and alone (timed):
#     - resnet50d against its T-CNN at 224 px, bf16, channels_last, eager: inference and training step at batch 1,
#       32 and 256 (benchmarks/run.py; profiles of the configurations that miss 0.9x);
#     - the same at batch 32 with --compile reduce-overhead (CUDA graphs: README's mode for small batches);
#     - the paper-schedule demo's epochs: 4 CNNs, then their T-CNN arms, 2 epochs each, 4 processes sharing the
#       GPU as the demo runs them (benchmarks/demo_epoch.py), and the whole demo's training time estimated.
#
# SMOKE=1: the same steps on the CPU with tiny sizes (the test steps select a few CPU tests), to try the script.
# FIRST_BUDGET (seconds, default 480): the end of the last step; each step's limit is cut to what is left.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
BUDGET=${FIRST_BUDGET:-480}
environment

if [ "$SMOKE" = 1 ]; then
    EAGER=(--device cpu --smoke --sizes 64 --batch-size 1 2 --no-profile)
    COMPILED=(--device cpu --smoke --sizes 64 --batch-size 2 --compile reduce-overhead --no-profile)
    DEMO=(--smoke --device cpu --jobs 2 --seeds 2)
    CUDA_SELECT=(-k 'conversion_exact')
    TRAIN_SELECT=(-k 'torchrun_one_process')
else
    EAGER=(--device cuda --amp --channels-last --models resnet50d --sizes 224 --batch-size 1 32 256)
    COMPILED=(--device cuda --amp --channels-last --models resnet50d --sizes 224 --batch-size 32
              --compile reduce-overhead)
    DEMO=(--device cuda --jobs 4 --seeds 4 --epochs 2)
    CUDA_SELECT=()
    TRAIN_SELECT=(-k 'torchrun_one_process or test_stop_mid_epoch')
fi
PYTEST=("$PY" -m pytest -p no:cacheprovider -rfEs --durations=15 -v)
PARALLEL=()  # the GPU tests in two processes, where pytest-xdist is there
"$PY" -c 'import xdist' 2>/dev/null && [ "$SMOKE" != 1 ] && PARALLEL=(-n 2)

pack_now() {  # what is there so far into $OUT: the results JSONs as they are, the logs in one archive, a summary
    cp "$WORK"/results/*.json "$OUT"/ 2>/dev/null
    tar -czf "$OUT/.first-logs.tar.gz" -C "$WORK" --exclude='*.pt' --exclude='*.png' --exclude='*.jpg' \
        --exclude=inductor-cold . \
        && mv "$OUT/.first-logs.tar.gz" "$OUT/first-logs.tar.gz"
    {
        cat "$WORK/steps.log"
        grep -h -E '^(FAILED|ERROR) |^=+ .*(passed|failed|skipped|error).* in ' "$WORK"/*tests.log 2>/dev/null
        grep -h -E 'ratio|first call|goal |steady epoch|estimated' "$WORK"/eager.log "$WORK"/compiled.log \
            "$WORK"/demo_epoch.log 2>/dev/null
    } > "$OUT/first-summary.txt"
}

# ---- phase 1: tests, the NCCL run and the compile-cache warm-up at once (nothing here is timed)
P1=$(limit 220 250)
echo "=== phase 1: limit $P1 s" | tee -a "$WORK/steps.log"
WARM=()
for only in cnn:inference tcnn:inference cnn:train tcnn:train; do  # 4 processes, 3 compile threads each
    (
        step "compile_warm_${only/:/_}" timeout -k 10 "$P1" env TORCHINDUCTOR_COMPILE_THREADS=3 \
            "$PY" benchmarks/warm_compile.py --only "$only" "${COMPILED[@]}" >/dev/null
    ) &
    WARM+=($!)
done
(
    step nccl_tests env TCNN_TEST_DEVICE="$DEVICE" timeout -k 10 "$P1" "${PYTEST[@]}" \
        tests/test_train_reliability.py --junitxml="$WORK/nccl_tests.xml" "${TRAIN_SELECT[@]}" >/dev/null
) &
NCCL=$!
step cuda_tests timeout -k 10 "$P1" "${PYTEST[@]}" "${PARALLEL[@]}" tests/test_cuda.py \
    --junitxml="$WORK/cuda_tests.xml" "${CUDA_SELECT[@]}"
WARM_FAILED=0
for pid in "${WARM[@]}"; do wait "$pid"; done
wait "$NCCL"
grep -q 'compile_warm.*exit [^0]' "$WORK/steps.log" && WARM_FAILED=1
pack_now
# A C++ compilation killed by its timeout can leave a truncated library in inductor's cache (seen on the CPU, where
# run.py then fails to load it); Triton's and inductor's GPU files are written whole or not at all. On the CPU, after
# a warm-up that did not finish, the compiled step starts from an empty cache.
if [ "$WARM_FAILED" = 1 ] && [ "$DEVICE" = cpu ]; then
    export TORCHINDUCTOR_CACHE_DIR="$WORK/inductor-cold"
fi

# ---- phase 2: timed, one at a time
timed_step eager 70 180 "$PY" benchmarks/run.py "${EAGER[@]}" --variants --sections models --label small_batch \
    --out "$WORK/results"
timed_step compiled 90 90 "$PY" benchmarks/run.py "${COMPILED[@]}" --variants --sections models --label small_batch \
    --out "$WORK/results"
demo_epoch_step
echo "=== first.sh: done after $SECONDS s" | tee -a "$WORK/steps.log"
pack_now
rm -rf "$WORK"
ls -la "$OUT"
