#!/usr/bin/env bash
# Runs on a GPU machine over build-device/: Nsight Compute on the first two varlen launches (the
# attention kernel and, when the plan split, the merge) of the given benchmark workloads (default:
# decode 1 x 4096, decode 64 x 4096, prefill 16 x 1024), with the clocks left
# alone (--clock-control none). Writes $OUT/ncu_<workload>.txt: speed of light, occupancy, launch
# statistics, warp stall reasons, scheduler and memory workload sections.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/device_env.sh
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
workloads=("$@")
[[ ${#workloads[@]} -gt 0 ]] || workloads=(decode_1x4096 decode_64x4096 prefill_16x1024)
for w in "${workloads[@]}"; do
  ncu --clock-control none --kernel-name regex:varlen --launch-count 2 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters \
    build-device/attnkit_attention_bench --workloads "$w" --iters 1 --warmup 0 --no-check >"$out/ncu_$w.txt" 2>&1
  echo "ncu $w: exit $?"
done
