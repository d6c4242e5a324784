#!/usr/bin/env bash
# Issue 22, items 1 and 2: the GPU tests and the training tests on cuda (one process on the GPU with --deterministic,
# torchrun --nproc_per_node 1 with NCCL, SIGTERM mid-epoch -> exit 75 + last.pt -> --resume auto equals the
# uninterrupted run, the checkpoint loads on the CPU). About 6 minutes on an H100 (README.md).
# SMOKE=1: on the CPU (TCNN_TEST_DEVICE=cpu), a few of the same tests.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
environment
PYTEST=("$PY" -m pytest -p no:cacheprovider -rfEs --durations=15)
TRAIN_TESTS=(tests/test_train.py tests/test_train_reliability.py tests/test_gpu_fallbacks.py)
SELECT=()  # all of them; SMOKE=1: a few
[ "$SMOKE" = 1 ] && SELECT=(-k 'pin_the_device or torchrun_one_process or test_stop_mid_epoch')
# each pytest under its own limit, so that a hang still leaves time to pack the logs
step cuda_tests timeout 240 "${PYTEST[@]}" tests/test_cuda.py -v --junitxml="$WORK/cuda_tests.xml"
step train_tests env TCNN_TEST_DEVICE="$DEVICE" timeout 300 "${PYTEST[@]}" "${TRAIN_TESTS[@]}" -v \
    --junitxml="$WORK/train_tests.xml" "${SELECT[@]}"
grep -h -E '^(FAILED|ERROR) |^=+ .*(passed|failed|skipped|error).* in ' "$WORK"/cuda_tests.log \
    "$WORK"/train_tests.log | tee "$WORK/summary.txt"
cp "$WORK/summary.txt" "$OUT/tests-summary.txt"
pack tests
