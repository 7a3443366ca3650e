#!/usr/bin/env bash
# Runs on a GPU machine: a kernel A/B comparison of the VARLEN builds in ab/<NAME>/
# (scripts/build_ab.sh). First the GPU tests, the VARLEN conformance campaign and racecheck on the
# last NAME (the candidate); then the builds' attention benches alternating ROUNDS times (default 2)
# over WORKLOADS (default: the large and small decodes of issue 6 and two short causal prefills),
# so machine drift shows as a difference between rounds and not between builds. Prints per round
# and build: workload, median us, clean-flush us, rate and check. Leaves everything in $OUT/ab.tgz (one file: the device tool
# returns a limited number).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ $# -ge 1 ]] || { echo "usage: scripts/device_ab.sh NAME [NAME ...]" >&2; exit 2; }
out="${OUT:-$PWD/device-out}"
work=$(mktemp -d)
workloads="${WORKLOADS:-decode_64x4096,decode_128x2048,decode_256x1024,decode_32x16384,decode_8x32768,decode_16x4096,decode_1x4096,prefill_16x1024,prefill_1x4096}"
candidate="ab/${!#}"
status=0
check() {
  local name=$1
  shift
  timeout 300 "$@" >"$work/$name.txt" 2>&1
  local rc=$?
  [[ $rc -eq 0 ]] || status=1
  echo "== $name: exit $rc; $(grep -h -E '^\[  (PASSED|FAILED)  \]|SUMMARY' "$work/$name.txt" | tail -2 | tr '\n' ' ')"
}
check tests "$candidate/test_backends" --gtest_filter='VarlenCuda*:VarlenPlan*'
check conformance "$candidate/test_conformance" --gtest_filter='*VARLEN*'
check racecheck compute-sanitizer --tool racecheck --error-exitcode 9 "$candidate/test_backends" \
  --gtest_filter='VarlenCuda.LongDecodes*'
for round in $(seq "${ROUNDS:-2}"); do
  for name in "$@"; do
    dir="$work/${name}_$round"
    timeout 300 "ab/$name/attnkit_attention_bench" --backend VARLEN --workloads "$workloads" --iters "${ITERS:-30}" \
      --out "$dir" >"$dir.txt" 2>&1
    rc=$?
    [[ $rc -eq 0 ]] || status=1
    echo "== $name ($(cat "ab/$name/COMMIT" | tr '\n' ' ')), round $round: exit $rc"
    grep -E '^\| (decode|prefill|mixed)' "$dir/attention_bench.md" 2>/dev/null |
      awk -F'|' '{printf "  %-30s %9s us %9s us %16s  %s\n", $2, $5, $8, $10, substr($14, 1, 8)}'
  done
done
mkdir -p "$out"
tar czf "$out/ab.tgz" -C "$work" .
exit $status
