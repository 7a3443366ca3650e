#!/usr/bin/env bash
# Runs on a GPU machine over build-device/ (scripts/build_device.sh): the serving engine under load
# (issue 33, sections 6 and 9) with `attnkit serve-bench` on a Llama-3.1-8B-shaped model of random
# weights (`attnkit make-model --family llama --size 8b`: the published shape, bf16, ~16 GB).
#   sweep   ShareGPT-like lengths (lognormal, medians 100 input / 200 output tokens, clipped to
#           1..1024; src/attnkit/serve_bench/trace.h says where the numbers come from), closed loop at
#           CONCURRENCY (default 1,16,64,256) with NUM_REQUESTS requests per point (default
#           16,64,256,512: enough to fill each level several times over without running the
#           low-concurrency points for minutes), then bench/serve_plot.py's PNG when matplotlib is there.
#   prefix  a shared system prompt: SHARED_FRACTION (default 0.8) of the requests start with one
#           common prompt of SHARED_LEN tokens (default 1024), ShareGPT-like lengths after it,
#           concurrency PREFIX_CONCURRENCY (default 64), PREFIX_REQUESTS requests (default 256),
#           once with prefix caching on and once off.
#   peer    transformers' generate on the same checkpoint and request lengths (transformers_peer below).
#   sync    the sweep's points again with synchronous steps (--no-async-scheduling): against the
#           sweep (async scheduling, CUDA's default), what overlapping hides (host gap, ITL, tok/s).
# PARTS picks them (default "sweep prefix"); the two together may not fit one 600 s device call
# with the model's creation: run PARTS=sweep and PARTS=prefix as two calls (the model stays in
# MODEL_DIR while the machine is warm).
#
# Leaves in $OUT/engine/: <part>/serve_bench.{json,md} and stdout.txt, sweep.png, SUMMARY.md.
# Exit 1 when a run failed.
#
# The per-step split (prepare_step, attention, GEMMs, other) in the reports is the executor's host
# wall clock per part: on CUDA without the executor's profiling it is the time to enqueue each
# part, not its GPU time, and a graph replay reports only its total (the engine has no switch for
# the executor's profiling yet). Schedule, sampling, host gap and the latencies are exact.
#
# Other knobs: ATTNKIT_BIN (default build-device/attnkit; build-cpu/attnkit with FAMILY=qwen3
# SIZE=small PLATFORM=cpu LENGTHS=fixed and small counts tries the script on a CPU: the tiny shapes'
# head sizes are below the CPU backends'), FAMILY (llama), SIZE (8b), MODEL_DIR, PLATFORM (cuda),
# LENGTHS (sharegpt; fixed or uniform take serve-bench's --input-len etc. from EXTRA_ARGS), BACKEND (default:
# automatic selection), KV_MEMORY_MB (30000: the 8B model's ~16 GB of weights leave that much of an
# H100's 80 GB with room for activations and graphs), CAPTURE_SIZES (1,2,4,8,16,32,64,128,256;
# empty: no CUDA graphs), MAX_BATCHED_TOKENS (2048), RUN_TIMEOUT (seconds per serve-bench run, 560),
# EXTRA_ARGS (more serve-bench flags for every run, split on spaces).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
source scripts/device_env.sh
bin="${ATTNKIT_BIN:-build-device/attnkit}"
out="${OUT:-$PWD/device-out}/engine"
mkdir -p "$out"
commit=$(cat build-device/COMMIT 2>/dev/null || echo unknown)
family="${FAMILY:-llama}"
size="${SIZE:-8b}"
model="${MODEL_DIR:-/tmp/attnkit-models/$family-$size}"
status=0

if [[ ! -x "$bin" ]]; then
  echo "device_engine.sh: $bin is missing (scripts/build_device.sh builds build-device/attnkit)"
  exit 1
fi
if [[ ! -f "$model/config.json" ]]; then
  start=$SECONDS
  rm -rf "$model"
  "$bin" make-model --family "$family" --size "$size" --seed 1 "$model" >"$out/make_model.txt" 2>&1 || {
    echo "== make-model failed:"; tail -5 "$out/make_model.txt"; exit 1; }
  echo "== made $model in $((SECONDS - start)) s: $(tail -1 "$out/make_model.txt")"
fi

# The flags every run shares.
common=(--model "$model" --platform "${PLATFORM:-cuda}" --max-num-batched-tokens "${MAX_BATCHED_TOKENS:-2048}"
        --seed 1 --no-progress)
lengths=(--lengths "${LENGTHS:-sharegpt}" --kv-memory-mb "${KV_MEMORY_MB:-30000}")
# shellcheck disable=SC2206  # EXTRA_ARGS is split on spaces on purpose
common+=(${EXTRA_ARGS:-})
[[ -n "${BACKEND:-}" ]] && common+=(--backend "$BACKEND")
capture="${CAPTURE_SIZES-1,2,4,8,16,32,64,128,256}"
[[ -n "$capture" ]] && common+=(--capture-sizes "$capture")

# serve_bench NAME ARGS...: one invocation into $out/NAME; prints its summary lines.
serve_bench() {
  local name=$1 rc start=$SECONDS
  shift
  mkdir -p "$out/$name"
  ATTNKIT_COMMIT="$commit" timeout "${RUN_TIMEOUT:-560}" "$bin" serve-bench "${common[@]}" --out "$out/$name" "$@" \
    >"$out/$name/stdout.txt" 2>&1
  rc=$?
  echo "== serve-bench $name: exit $rc, $((SECONDS - start)) s"
  grep -E '^(concurrency|poisson) ' "$out/$name/stdout.txt"
  if [[ $rc -ne 0 ]]; then
    tail -5 "$out/$name/stdout.txt"
    status=1
  fi
}

# The transformers peer (scripts/hf_serve_peer.py): the request lengths of the sweep's run at
# PEER_CONCURRENCY (default 64) through transformers' generate (bf16, SDPA, static cache) in batches
# of that size, PEER_REQUESTS of them (default 128), on the same checkpoint. Needs the sweep's JSON.
transformers_peer() {
  local json="$out/sweep/serve_bench.json" concurrency="${PEER_CONCURRENCY:-64}" index
  if [[ ! -f "$json" ]]; then
    echo "== transformers peer: no $json (run PARTS=sweep first)"; status=1; return
  fi
  index=$(python3 -c "import json,sys; runs=json.load(open('$json'))['runs']; \
print(next((i for i,r in enumerate(runs) if r['trace'].get('concurrency')==$concurrency), -1))")
  if [[ "$index" == -1 ]]; then
    echo "== transformers peer: the sweep has no run at concurrency $concurrency"; status=1; return
  fi
  timeout "${RUN_TIMEOUT:-560}" python3 scripts/hf_serve_peer.py "$model" "$json" --run "$index" \
    --concurrency "$concurrency" --max-requests "${PEER_REQUESTS:-128}" --out "$out/peer.json" \
    >"$out/peer.txt" 2>&1 || { echo "== transformers peer failed:"; tail -5 "$out/peer.txt"; status=1; return; }
  tail -1 "$out/peer.txt"
}

# Decode steps against the floor (issue 34 §2): every request of a run has the same prompt (the
# context) and they start together, so after the prompts every step decodes the whole batch; the
# ITL p50 is that step as a user sees it. Batches 1, 16, 64, 256 at contexts 1024 and 4096 where
# their KV fits DECODE_KV_MB (default 40000: 64 x 4096 tokens of the 8B model's 128 KiB per token),
# per backend of DECODE_BACKENDS (default "VARLEN FLASHINFER"); the card's ceilings measured first
# (scripts/device_ceilings.py), the floors by bench/decode_floor.py.
decode_floor() {
  python3 scripts/device_ceilings.py "$out/ceilings.json" || { status=1; return; }
  local backend context batches runs=()
  for backend in ${DECODE_BACKENDS:-VARLEN FLASHINFER}; do
    for context in ${DECODE_CONTEXTS:-1024 4096}; do
      batches=$(python3 -c "print(','.join(str(b) for b in (1, 16, 64, 256) if b * $context <= ${DECODE_MAX_TOKENS:-262144}))")
      serve_bench "decode_${backend}_$context" --backend "$backend" --lengths fixed \
        --input-len "$context" --output-len "${DECODE_STEPS:-32}" --kv-memory-mb "${DECODE_KV_MB:-40000}" \
        --concurrency "$batches" --num-requests "$batches" --warmup-requests 1
      [[ -f "$out/decode_${backend}_$context/serve_bench.json" ]] && runs+=("$out/decode_${backend}_$context/serve_bench.json")
    done
  done
  [[ ${#runs[@]} -gt 0 ]] && python3 bench/decode_floor.py "$model" "${runs[@]}" --ceilings "$out/ceilings.json" \
    --out "$out/decode_floor.md"
}

for part in ${PARTS:-sweep prefix}; do
  case "$part" in
    sweep)
      serve_bench sweep "${lengths[@]}" --concurrency "${CONCURRENCY:-1,16,64,256}" \
        --num-requests "${NUM_REQUESTS:-16,64,256,512}"
      if [[ -f "$out/sweep/serve_bench.json" ]]; then
        python3 bench/serve_plot.py "$out/sweep/serve_bench.json" --out "$out/sweep.png" \
          --title "serve-bench, $family $size (random weights), ${LENGTHS:-sharegpt} lengths" || true
      fi
      ;;
    prefix)
      for caching in on off; do
        extra=()
        [[ $caching == off ]] && extra=(--no-prefix-caching)
        serve_bench "prefix_$caching" "${lengths[@]}" --concurrency "${PREFIX_CONCURRENCY:-64}" \
          --num-requests "${PREFIX_REQUESTS:-256}" --shared-prefix-fraction "${SHARED_FRACTION:-0.8}" \
          --shared-prefix-len "${SHARED_LEN:-1024}" "${extra[@]}"
      done
      ;;
    sync)
      serve_bench sweep_sync "${lengths[@]}" --concurrency "${CONCURRENCY:-1,16,64,256}" \
        --num-requests "${NUM_REQUESTS:-16,64,256,512}" --no-async-scheduling
      ;;
    peer) transformers_peer ;;
    decode) decode_floor ;;
    *) echo "device_engine.sh: unknown part $part (sweep, sync, prefix, peer, decode)"; status=1 ;;
  esac
done

{
  echo "# Serving engine under load ($(date -u +%Y-%m-%d), commit $commit, model $model)"
  echo
  [[ -f "$out/decode_floor.md" ]] && { echo "## decode steps against the floor"; echo; cat "$out/decode_floor.md"; echo; }
  [[ -f "$out/peer.txt" ]] && { echo "## transformers peer"; echo; tail -1 "$out/peer.txt"; echo; }
  for name in sweep sweep_sync prefix_on prefix_off; do
    f="$out/$name/serve_bench.md"
    [[ -f "$f" ]] || continue
    echo "## $name"
    echo
    sed 's/^# /### /' "$f"
    echo
  done
} >"$out/SUMMARY.md"
echo "== results in $out (SUMMARY.md)"
exit $status
