#!/usr/bin/env bash
# Runs on a GPU machine over build-device/ (scripts/build_device.sh): where a step's time goes.
#   1. build-device/attnkit_host_bench, the cases HOST_FILTER selects (default '^host_step_cuda/':
#      the CUDA-platform cases, registered with the GPU present: host_step_cuda/<BACKEND>/reqs:R/
#      groups:G/short:S, device workspaces, pinned mirrors, prepare_step enqueueing on a stream; '.'
#      adds the CPU-platform host_step/... cases), --benchmark_min_time HOST_MIN_TIME (default
#      0.05); a configuration a backend refuses (the recurrent-state group on CUDA) is an error row.
#   2. build-device/attnkit_step_bench for each backend of BACKENDS (default "VARLEN FLASHINFER
#      CUDNN", those this build registers): STEP_LAYERS layers (default 32), every built-in step
#      shape, STEP_STEPS measured steps per phase (default 10). Most of a run is the runner's
#      start-up (it fills each layer's ~1 GiB KV cache through a host staging copy); a backend is
#      started only while STEP_BUDGET seconds (default 100) are not used up by the earlier ones.
# Leaves in $OUT: host_bench.json, host_bench.txt; step_<BACKEND>/step_bench.{json,md} and
# stdout.txt; SUMMARY.md (every step table, then the host-bench lines). Exit 1 when a run failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/device_env.sh
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
commit=$(cat build-device/COMMIT 2>/dev/null || echo unknown)
status=0

start=$SECONDS
if [[ -x build-device/attnkit_host_bench ]]; then
  timeout 240 build-device/attnkit_host_bench --benchmark_min_time="${HOST_MIN_TIME:-0.05}" \
    --benchmark_filter="${HOST_FILTER:-^host_step_cuda/}" \
    --benchmark_out="$out/host_bench.json" --benchmark_out_format=json >"$out/host_bench.txt" 2>&1
  rc=$?
  echo "== host bench: exit $rc, $((SECONDS - start)) s, $(grep -c '^host_step_cuda/' "$out/host_bench.txt") CUDA-platform lines"
  [[ $rc -ne 0 ]] && status=1 && tail -5 "$out/host_bench.txt"
else
  echo "== host bench: build-device/attnkit_host_bench is missing (scripts/build_device.sh)"
  status=1
fi

budget=${STEP_BUDGET:-100}
step_start=$SECONDS
last=0
for backend in ${BACKENDS:-VARLEN FLASHINFER CUDNN}; do
  if ! build-device/attnkit backends 2>/dev/null | grep -q "^$backend"; then
    echo "skip $backend: not in this build (build-device/attnkit backends)"
    continue
  fi
  used=$((SECONDS - step_start))
  if ((used + last > budget)); then
    echo "skip $backend: STEP_BUDGET ${budget} s would be exceeded (${used} s used, the last run took ${last} s)"
    continue
  fi
  dir="$out/step_$backend"
  mkdir -p "$dir"
  start=$SECONDS
  ATTNKIT_COMMIT="$commit" timeout 300 build-device/attnkit_step_bench --backend "$backend" \
    --layers "${STEP_LAYERS:-32}" --steps "${STEP_STEPS:-10}" --out "$dir" >"$dir/stdout.txt" 2>&1
  rc=$?
  last=$((SECONDS - start))
  echo "== step bench $backend: exit $rc, $last s"
  grep -E '^  |^no GPU' "$dir/stdout.txt" | head -8
  [[ $rc -ne 0 ]] && status=1
done

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
  fi
} >"$out/SUMMARY.md"
echo "== results in $out (SUMMARY.md)"
exit $status
