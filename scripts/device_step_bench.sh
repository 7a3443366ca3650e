#!/usr/bin/env bash
# Runs on a GPU machine over build-device/ (scripts/build_device.sh): where a step's time goes.
#   1. build-device/attnkit_step_bench for each backend of BACKENDS (default "VARLEN FLASHINFER
#      CUDNN", those this build registers): STEP_LAYERS layers (default 32), every built-in step
#      shape, STEP_STEPS measured steps per phase (default 10); the runs set up concurrently and
#      measure one at a time (STEP_PARALLEL=0: one run after another). Each run measures its own
#      ceilings (copy bandwidth, bf16 matrix rate; ~4.4 GiB more GPU memory for a few seconds) once
#      it may use the GPU alone, and reports each shape's per-layer attention as fractions of them.
#   2. build-device/attnkit_host_bench, the cases HOST_FILTER selects (default '^host_step_cuda/':
#      the CUDA-platform cases, registered with the GPU present: host_step_cuda/<BACKEND>/reqs:R/
#      groups:G/short:S, device workspaces, pinned mirrors, prepare_step enqueueing on a stream; '.'
#      adds the CPU-platform host_step/... cases), --benchmark_min_time HOST_MIN_TIME (default
#      0.05); a configuration a backend refuses (the recurrent-state group on CUDA) is an error row.
# Leaves in $OUT: host_bench.json, host_bench.txt, host_bench.md (each case against the GPU floor of
# its step at the ceilings the host bench measured: bench/host_floor.py); step_<BACKEND>/step_bench.{json,md} and
# stdout.txt; SUMMARY.md (every step table, then the host-bench lines). Exit 1 when a run failed.
# The time is mostly the runners' start-up (see below), then ~10-30 s of measuring per backend
# and the host bench; the per-run figures are printed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/device_env.sh
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
commit=$(cat build-device/COMMIT 2>/dev/null || echo unknown)
status=0

# One run per backend. Most of a run is the runner's start-up (it fills each layer's ~1 GiB KV
# cache through a host staging copy, single-threaded), so with STEP_PARALLEL=1 (default) every run
# sets up at once (~35 GiB of GPU memory each at 32 layers) and they measure one after another,
# each alone on the GPU (--ready-file / --go-file); STEP_PARALLEL=0 runs them strictly in turn.
declare -A pids
runs=()
parallel=${STEP_PARALLEL:-1}
start=$SECONDS
for backend in $(built_backends); do
  dir="$out/step_$backend"
  mkdir -p "$dir"
  rm -f "$dir/.ready" "$dir/.go"
  [[ $parallel == 0 ]] && touch "$dir/.go"
  ATTNKIT_COMMIT="$commit" timeout 500 build-device/attnkit_step_bench --backend "$backend" \
    --layers "${STEP_LAYERS:-32}" --steps "${STEP_STEPS:-10}" --out "$dir" \
    --ready-file "$dir/.ready" --go-file "$dir/.go" >"$dir/stdout.txt" 2>&1 &
  pids[$backend]=$!
  runs+=("$backend")
  [[ $parallel == 0 ]] && wait "${pids[$backend]}"
done
# Nothing measures before every run has set up (or ended).
for backend in "${runs[@]}"; do
  while [[ ! -f "$out/step_$backend/.ready" ]] && kill -0 "${pids[$backend]}" 2>/dev/null; do sleep 0.2; done
done
[[ ${#runs[@]} -gt 0 && $parallel != 0 ]] && echo "== step bench: ${#runs[@]} run(s) set up in $((SECONDS - start)) s"
for backend in "${runs[@]}"; do
  dir="$out/step_$backend"
  t=$SECONDS
  touch "$dir/.go"
  wait "${pids[$backend]}"
  rc=$?
  echo "== step bench $backend: exit $rc, start-up $(cat "$dir/.ready" 2>/dev/null || echo '-') s, then $((SECONDS - t)) s"
  grep -E '^  |^no GPU|^attnkit_step_bench' "$dir/stdout.txt" | head -8
  [[ $rc -ne 0 ]] && status=1
  rm -f "$dir/.ready" "$dir/.go"
done

# The host bench after the step runs: nothing else on the GPU or the copy engines meanwhile.
start=$SECONDS
if [[ -x build-device/attnkit_host_bench ]]; then
  timeout 240 build-device/attnkit_host_bench --benchmark_min_time="${HOST_MIN_TIME:-0.05}" \
    --benchmark_filter="${HOST_FILTER:-^host_step_cuda/}" \
    --benchmark_out="$out/host_bench.json" --benchmark_out_format=json >"$out/host_bench.txt" 2>&1
  rc=$?
  echo "== host bench: exit $rc, $((SECONDS - start)) s, $(grep -c '^host_step_cuda/' "$out/host_bench.txt") CUDA-platform lines"
  [[ $rc -ne 0 ]] && status=1 && tail -5 "$out/host_bench.txt"
  # Each case against the GPU floor of its step, from the ceilings the host bench measured.
  python3 bench/host_floor.py "$out/host_bench.json" --out "$out/host_bench.md" || status=1
else
  echo "== host bench: build-device/attnkit_host_bench is missing (scripts/build_device.sh)"
  status=1
fi

{
  echo "# Where a step's time goes ($(date -u +%Y-%m-%d), commit $commit)"
  echo
  for f in "$out"/step_*/step_bench.md; do
    [[ -f "$f" ]] || continue
    sed 's/^# /## /' "$f"
    echo
  done
  if [[ -f "$out/host_bench.txt" ]]; then
    echo "## Host path per prepare_step (attnkit_host_bench; CPU platform host_step/..., CUDA platform host_step_cuda/...)"
    echo
    echo '```'
    grep -E '^(host_step|Benchmark|-----)' "$out/host_bench.txt"
    echo '```'
    echo
    [[ -f "$out/host_bench.md" ]] && sed 's/^# /## /' "$out/host_bench.md"
  fi
} >"$out/SUMMARY.md"
echo "== results in $out (SUMMARY.md)"
exit $status
