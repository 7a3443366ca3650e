#!/usr/bin/env bash
# Runs on a GPU machine (one NVIDIA H200, sm_90a) over the binaries scripts/build_device.sh built
# on the CPU machine into build-device/ (carry it): the GPU kernel tests, whole captured steps
# through the runner, the GPU reference's conformance campaign (against the dense brute force and
# the CPU reference), `attnkit replay` on random batches on the GPU, the demo, and
# compute-sanitizer memcheck and racecheck on small mixed batches: the runner's captured steps
# (GPU_REFERENCE's, and every backend's at its declared CUDA-graph level),
# VARLEN's split decodes with the merge, and the worked example's mixed batch through every CUDA
# backend (`attnkit demo`, VARLEN first). Everything goes to one log,
# $OUT/device_check.log (the device tool returns few files); the summary is printed last. Exits
# non-zero if anything failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/device_env.sh
bin=build-device
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
export ATTNKIT_CLI="$PWD/$bin/attnkit"
summary=()
failed=0
log="$out/device_check.log"
: >"$log"
run() {
  local name=$1
  shift
  local start=$SECONDS
  local part
  part=$(mktemp)
  "$@" >"$part" 2>&1
  local rc=$?
  local verdict="ok"
  [[ $rc -eq 0 ]] || { verdict="FAILED (exit $rc)"; failed=1; }
  { echo "===== $name: $*"; cat "$part"; echo; } >>"$log"
  local tests
  tests=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) \] [0-9]+ test' "$part" | tr '\n' ' ')
  summary+=("$(printf '%-12s %-16s %4ss  %s' "$name" "$verdict" $((SECONDS - start)) "$tests")")
  [[ $name == *memcheck || $name == *racecheck || $name == synccheck ]] && grep -h -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$part" | sed "s/^/$name: /" >>"$out/sanitizer.txt"
  [[ $name == demo ]] && tail -n 5 "$part" >"$out/demo_tail.txt"
  rm -f "$part"
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -n 1)"
  compute-sanitizer --version 2>/dev/null | head -n 1
} >"$out/conditions.txt" 2>&1

run platform "$bin/test_platform"
run kv_kernels "$bin/test_kv" --gtest_filter='KVUpdateKernel*:SlotMappingKernel*'
run ref_kernel "$bin/test_backends" --gtest_filter='GpuReferenceKernel*'
run varlen "$bin/test_backends" --gtest_filter='VarlenCuda*:VarlenPlan*'
# The kernel libraries' own layers: FlashInfer's launchers, cuDNN's graphs (what it refuses).
run kernel_libs "$bin/test_backends" --gtest_filter='FlashInfer*:Cudnn*'
run cuda_steps "$bin/test_runner" --gtest_filter='CudaStep*:*CudaGraphBackend*'
# An engine-sized CUDNN run starts with every capture shape's graphs built (prints the time).
run cudnn_startup "$bin/test_runner" --gtest_filter='CudnnStartup*'
run conformance "$bin/test_conformance" --gtest_filter='*GPU_REFERENCE*:*VARLEN*:*FLASHINFER*:*CUDNN*:ConformanceHarness*'
run replay_cli "$bin/test_cli" --gtest_filter='CliReplayOnTheGpu*:CliDemo*'
run context_parallel "$bin/test_parallel"
run demo "$bin/attnkit" demo
run runner_loop "$bin/runner_loop"
run backends "$bin/attnkit" backends
run memcheck compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_runner" --gtest_filter='CudaStep*:*CudaGraphBackend*'
run racecheck compute-sanitizer --tool racecheck --error-exitcode 9 --kernel-name-exclude kns=cudnn_generated "$bin/test_runner" --gtest_filter='CudaStep*:*CudaGraphBackend*'
run varlen_memcheck compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_backends" --gtest_filter='VarlenCuda.LongDecodes*'
run varlen_racecheck compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/test_backends" --gtest_filter='VarlenCuda.LongDecodes*'
run demo_memcheck compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/attnkit" demo
# D1: two context-parallel ranks (threads) on VARLEN with the all-gather and the merge kernel.
run cp_memcheck compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_parallel" --gtest_filter='*OnOneGpu*VARLEN_size2*'
run cp_racecheck compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/test_parallel" --gtest_filter='*OnOneGpu*VARLEN_size2*'
# cuDNN's own SDPA kernels (CUDNN backend) are left out of racecheck: racecheck reports shared-memory
# hazards inside them (cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_*, 384 on
# 2026-12-01) that we cannot inspect or change; memcheck covers them. The unfiltered count is logged.
# FlashInfer's FA3 kernel (FLASHINFER's fa3-paged variant, flashinfer::PrefillWithKVCacheKernel)
# computes wrong outputs under racecheck's tracking of asynchronous copies (cp.async), with no
# hazard reported (2026-12-01: its LSE stayed right, outputs were off by up to 1.9; with
# --racecheck-memcpy-async no, under memcheck and initcheck, and without a sanitizer it is right):
# it runs in a racecheck pass of its own without that tracking.
run demo_racecheck compute-sanitizer --tool racecheck --error-exitcode 9 --kernel-name-exclude kns=cudnn_generated,kns=PrefillWithKVCacheKernel "$bin/attnkit" demo
run fa3_racecheck compute-sanitizer --tool racecheck --error-exitcode 9 --racecheck-memcpy-async no --kernel-name kns=PrefillWithKVCacheKernel "$bin/attnkit" demo
run cudnn_racecheck_info bash -c "compute-sanitizer --tool racecheck '$bin/attnkit' demo 2>&1 | grep -E 'RACECHECK SUMMARY|Race reported' | head -n 4; true"
# The Python binding (built by build_device.sh with the device Python's headers) on the GPU.
if [[ -d $bin/python/attnkit ]]; then
  run python env PYTHONPATH="$bin/python" python3 -m pytest -q -rs -p no:cacheprovider tests/python
fi
run synccheck compute-sanitizer --tool synccheck --error-exitcode 9 "$bin/test_kv" --gtest_filter='SlotMappingKernel.Random*'

cat "$out/conditions.txt" "$out/sanitizer.txt" "$out/demo_tail.txt" 2>/dev/null
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
exit $failed
