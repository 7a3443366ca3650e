#!/usr/bin/env bash
# Runs on a GPU machine over build-device/ (scripts/build_device.sh): the attention benchmark
# (bench/attention_bench.cc) on every workload, with the card's copy bandwidth and bf16 matrix
# rate measured in the same run. Writes $OUT/attention_bench.{md,json}; prints the table.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/device_env.sh
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
commit=$(cat build-device/COMMIT 2>/dev/null || echo unknown)
ATTNKIT_COMMIT="$commit" build-device/attnkit_attention_bench --out "$out" "$@"
