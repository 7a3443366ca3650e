#!/usr/bin/env bash
# One device session's GPU work over build-device/ (scripts/build_device.sh): the attention benchmark
# of each backend named in BACKENDS (default "VARLEN FLASHINFER CUDNN", those this build registers)
# on the same workloads, each with the ceilings measured in its own run, then
# scripts/device_check.sh (tests, conformance, replay, demo, sanitizers) within CHECK_SECONDS
# (default 540; 0 skips it). The check alone took 480 s in r50 (the CUDNN conformance campaign 309 s
# of it: each case builds cuDNN graphs of its own, bench/notes/cudnn.md), so the benchmarks
# and the check no longer fit one device call of 600 s: run them as two calls (CHECK_SECONDS=0 for
# the benchmarks, BACKENDS=none for the check). Everything lands in $OUT/session.tgz (the device tool returns few files) plus
# the printed summaries. Exits non-zero if the check failed or ran out of time.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/device_env.sh
out="${OUT:-$PWD/device-out}"
work=$(mktemp -d)
mkdir -p "$out"
workloads="${WORKLOADS:-decode_1x4096,decode_16x4096,decode_64x4096,decode_8x32768,decode_256x1024,prefill_1x4096,prefill_1x16384,prefill_16x1024}"
commit=$(cat build-device/COMMIT 2>/dev/null || echo unknown)
for backend in $(built_backends); do
  mkdir -p "$work/bench_$(bench_dir_name "$backend")"
  ATTNKIT_COMMIT="$commit" build-device/attnkit_attention_bench --backend "$backend" --workloads "$workloads" \
    --out "$work/bench_$(bench_dir_name "$backend")" >"$work/bench_$(bench_dir_name "$backend")/stdout.txt" 2>&1
  echo "== $backend (exit $?)"
  grep -E '^\| (decode|prefill|mixed)' "$work/bench_$(bench_dir_name "$backend")/attention_bench.md" | cut -d'|' -f2-11
done
check=0
if [[ "${CHECK_SECONDS:-540}" != 0 ]]; then
  OUT="$work/check" timeout "${CHECK_SECONDS:-540}" bash scripts/device_check.sh
  check=$?
  [[ $check -eq 124 ]] && echo "device_check.sh ran out of time (${CHECK_SECONDS:-540} s)"
fi
tar czf "$out/session.tgz" -C "$work" .
exit $check
