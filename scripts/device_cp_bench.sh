#!/usr/bin/env bash
# Runs on a GPU machine over build-device/ (scripts/build_device.sh): D1's benchmark,
# attnkit_cp_bench (bench/context_parallel_bench.cc), on every visible GPU up to 8 (one GPU gives
# the single-GPU rows only), long-context decode of REQUESTS requests at CONTEXTS tokens. Writes
# $OUT/context_parallel_bench.{md,json} and prints the table. NCCL's NVLink multicast stays off.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/device_env.sh
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
ATTNKIT_COMMIT="$(cat build-device/COMMIT 2>/dev/null || echo unknown)" build-device/attnkit_cp_bench --requests "${REQUESTS:-1,2,4,8}" --contexts "${CONTEXTS:-131072,524288,1048576}" \
  --iters "${ITERS:-20}" --out "$out" "$@"
