#!/usr/bin/env bash
# One device call of issue 34 (the model executor and the engine on the GPU), over the package
# scripts/build_device.sh makes (build-device.tar.xz, carried; unpacked here when build-device/ is
# missing). CALL picks what runs, each part within one 600 s call:
#   models  the model and engine tests on the GPU (test_model's CUDA ops and executor cases,
#           test_engine with ATTNKIT_TEST_PLATFORM=cuda: continuous batching, prefix caching,
#           preemption and graph-vs-eager on the GPU), then scripts/device_models.sh (every family
#           against transformers on every CUDA backend, eager and graph) in what is left of
#           MODELS_BUDGET (default 420 s from the start of the call).
#   engine  scripts/device_engine.sh with PARTS (default "decode sweep"): the 8B decode steps
#           against the floor (VARLEN, context 1024 unless DECODE_BACKENDS / DECODE_CONTEXTS say
#           more), then the ShareGPT-like sweep at concurrency 16 and 64.
#   serve   scripts/device_engine.sh PARTS="sweep prefix peer" trimmed to fit: the prefix-caching
#           runs on and off and the transformers peer (the peer needs the sweep's request lengths).
# Everything lands in $OUT: issue34_<call>.log (all output) and each part's own files.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
call="${CALL:-models}"
log="$out/issue34_$call.log"
exec > >(tee "$log") 2>&1

if [[ ! -x build-device/attnkit ]]; then
  start=$SECONDS
  python3 -c "import tarfile; tarfile.open('build-device.tar.xz').extractall()" || exit 1
  echo "== unpacked build-device in $((SECONDS - start)) s (commit $(cat build-device/COMMIT))"
fi
source scripts/device_env.sh
echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
echo "== $(python3 -c 'import torch, transformers; print("torch", torch.__version__, "CUDA", torch.version.cuda, "transformers", transformers.__version__)' 2>&1 | tail -1)"
status=0

gtest() {  # name timeout program args...: one test program, its summary lines
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  echo "== $name: exit $rc, $((SECONDS - start)) s: $(grep -E '^\[  (PASSED|FAILED) \]' "$out/$name.txt" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|^\[  SKIPPED \]' "$out/$name.txt" | head -20
  [[ $rc -eq 0 ]] || status=1
}

case "$call" in
  models)
    ATTNKIT_TEST_PLATFORM=cuda gtest test_engine_cuda 150 build-device/test_engine
    gtest test_model_cuda 120 build-device/test_model --gtest_filter='CudaOps*:*Cuda*:*GPU*:*Gpu*'
    OUT="$out" TIME_BUDGET=$(( ${MODELS_BUDGET:-420} - SECONDS )) bash scripts/device_models.sh || status=1
    [[ -f "$out/models/summary.md" ]] && cat "$out/models/summary.md"
    ;;
  engine)
    # The first 8B runs (2026-12-06, H100) did not finish in 150 s each with nothing written, so
    # this call starts small (VARLEN, context 1024) and gives each run most of the call; widen with
    # DECODE_BACKENDS / DECODE_CONTEXTS once a run's time (serve-bench prints its engine's start
    # time and each finished run) is known.
    OUT="$out" PARTS="${PARTS:-decode sweep}" DECODE_BACKENDS="${DECODE_BACKENDS:-VARLEN}" \
      DECODE_CONTEXTS="${DECODE_CONTEXTS:-1024}" CONCURRENCY="${CONCURRENCY:-16,64}" NUM_REQUESTS="${NUM_REQUESTS:-64,256}" \
      RUN_TIMEOUT="${RUN_TIMEOUT:-270}" bash scripts/device_engine.sh || status=1
    ;;
  serve)
    OUT="$out" PARTS="${PARTS:-sweep prefix peer}" CONCURRENCY="${CONCURRENCY:-64}" NUM_REQUESTS="${NUM_REQUESTS:-256}" \
      bash scripts/device_engine.sh || status=1
    ;;
  *) echo "device_issue34.sh: CALL is models, engine or serve, not $call"; status=1 ;;
esac
# The device tool brings back few files: the parts' folders go in one archive.
tar czf "$out/issue34_$call.tgz" -C "$out" --exclude="issue34_$call.tgz" --exclude="issue34_$call.log" . 2>/dev/null
echo "== call $call done in $SECONDS s, status $status"
exit $status
