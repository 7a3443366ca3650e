#!/usr/bin/env bash
# One device call over the package scripts/build_device.sh makes (build-device.tar.xz, carried;
# unpacked when build-device/ is missing). CALL names the parts that run, in order (e.g.
# CALL="start models"), within one 600 s call:
#   diag    the cause of the non-finite logits: `attnkit generate` of CUDNN (Llama-3.2-1B shape)
#           and FLASHINFER (Llama-3.1-8B shape, XQA decodes) on prompts that fill whole KV pages
#           and on prompts that leave the last page part-written, one and three steps each.
#   tests   test_runner's poisoned-cache runs of every CUDA kernel variant (each line it prints).
#   gputests  the other GPU tests: test_runner's CUDA cases, test_ops' and test_model's,
#           test_engine on CUDA (continuous batching, prefix caching, preemption, graphs, faults).
#   models  scripts/device_models.sh over every CUDA backend, eager and graph (FAMILIES, BACKENDS).
#   start   an 8B engine's start-up split (serve-bench with 2 and 40 GB of KV, KV_MBS), a short run each.
#   engine  scripts/device_engine.sh with PARTS (default "decode sweep"): the 8B decode steps against
#           the floor (VARLEN, context 1024 unless DECODE_BACKENDS / DECODE_CONTEXTS say more), then
#           the ShareGPT-like sweep at concurrency 16 and 64.
#   serve   scripts/device_engine.sh PARTS="sweep prefix peer": prefix caching on and off and the
#           transformers peer at concurrency 64.
# Everything lands in $OUT: device_<call>.log (all output) and the parts' own files.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
call="${CALL:-diag}"
log="$out/device_${call// /_}.log"
exec > >(tee "$log") 2>&1

if [[ ! -x build-device/attnkit ]]; then
  start=$SECONDS
  python3 -c "import tarfile; tarfile.open('build-device.tar.xz').extractall()" || exit 1
  echo "== unpacked build-device in $((SECONDS - start)) s (commit $(cat build-device/COMMIT))"
fi
source scripts/device_env.sh
echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
status=0
models="${MODELS_DIR:-/tmp/attnkit-models}"
mkdir -p "$models"

make_model() {  # family size: a random-weight checkpoint in $models/<family>-<size>
  local dir="$models/$1-$2" start=$SECONDS
  [[ -f "$dir/config.json" ]] && return 0
  build-device/attnkit make-model --family "$1" --size "$2" --seed 39 --dtype bf16 "$dir" >/dev/null || return 1
  echo "== make-model $1 $2: $((SECONDS - start)) s"
}

ids() {  # n: n comma-separated token ids
  seq -s, 11 $((10 + $1))
}

gen() {  # label model backend prompt_len max_tokens [extra flags]: one generate, its tokens or its error
  local label=$1 model=$2 backend=$3 len=$4 steps=$5 start=$SECONDS
  shift 5
  local text
  text="$(timeout 240 build-device/attnkit generate --model "$models/$model" --platform cuda --backend "$backend" \
           --prompt-ids "$(ids "$len")" --max-tokens "$steps" --ignore-eos "$@" 2>&1)"
  local rc=$?
  echo "== $label ($backend, $model, prompt $len, $steps steps $*): exit $rc, $((SECONDS - start)) s"
  grep -iE 'error|tokens|selected|kernel' <<<"$text" | head -8
}

gtest() {  # name timeout program args...: one test program, its summary lines
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  echo "== $name: exit $rc, $((SECONDS - start)) s: $(grep -E '^\[  (PASSED|FAILED) \]' "$out/$name.txt" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|^\[  SKIPPED \]' "$out/$name.txt" | head -30
  [[ $rc -eq 0 ]] || status=1
}

for part in $call; do
case "$part" in
  diag)
    make_model llama 1b && make_model llama 8b || status=1
    for backend in CUDNN VARLEN; do
      gen part-page llama-1b $backend 5 3
      gen whole-then-decode llama-1b $backend 16 3
    done
    for backend in FLASHINFER CUDNN; do
      gen part-page llama-8b $backend 5 3
      gen whole-then-decode llama-8b $backend 16 3
    done
    ;;
  tests)
    gtest test_runner_poison 240 build-device/test_runner --gtest_filter='*PoisonedCache*'
    grep -E '^  [A-Z_]+:' "$out/test_runner_poison.txt" | head -80
    ;;
  gputests)
    gtest test_runner_cuda 200 build-device/test_runner --gtest_filter='*Cuda*:*Gpu*:*GPU*'
    gtest test_ops_cuda 120 build-device/test_ops --gtest_filter='CudaOps*:*Cuda*:*GPU*:*Gpu*'
    gtest test_model_cuda 120 build-device/test_model --gtest_filter='*Cuda*:*GPU*:*Gpu*'
    ATTNKIT_TEST_PLATFORM=cuda gtest test_engine_cuda 200 build-device/test_engine
    ;;
  models)
    OUT="$out" TIME_BUDGET=$(( ${MODELS_BUDGET:-540} - SECONDS )) bash scripts/device_models.sh || status=1
    [[ -f "$out/models/summary.md" ]] && cat "$out/models/summary.md"
    ;;
  start)
    make_model llama 8b || status=1
    for kv_mb in ${KV_MBS:-2000 40000}; do
      start=$SECONDS
      timeout 240 build-device/attnkit serve-bench --model "$models/llama-8b" --platform cuda --backend VARLEN \
        --kv-memory-mb "$kv_mb" --num-requests 8 --concurrency 8 --lengths fixed --input-len 128 --output-len 16 \
        --capture-sizes 8 --out "$out/start_$kv_mb" --no-progress >"$out/start_$kv_mb.txt" 2>&1
      echo "== serve-bench (8B, $kv_mb MB of KV): exit $?, $((SECONDS - start)) s in all"
      grep -E 'engine started|concurrency|error' "$out/start_$kv_mb.txt" | head -5
    done
    ;;
  engine)
    OUT="$out" PARTS="${PARTS:-decode sweep}" DECODE_BACKENDS="${DECODE_BACKENDS:-VARLEN}" \
      DECODE_CONTEXTS="${DECODE_CONTEXTS:-1024}" CONCURRENCY="${CONCURRENCY:-16,64}" NUM_REQUESTS="${NUM_REQUESTS:-64,256}" \
      RUN_TIMEOUT="${RUN_TIMEOUT:-270}" bash scripts/device_engine.sh || status=1
    ;;
  serve)
    OUT="$out" PARTS="${PARTS:-sweep prefix peer}" CONCURRENCY="${CONCURRENCY:-64}" NUM_REQUESTS="${NUM_REQUESTS:-256}" \
      bash scripts/device_engine.sh || status=1
    ;;
  *) echo "device_run.sh: CALL's parts are diag, tests, gputests, models, start, engine or serve, not $part"; status=1 ;;
esac
done
tar czf "$out/device_${call// /_}.tgz" -C "$out" --exclude="*.tgz" --exclude="*.log" . 2>/dev/null
echo "== call $call done in $SECONDS s, status $status"
exit $status
