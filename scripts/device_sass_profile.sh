#!/usr/bin/env bash
# Runs on a GPU machine over build-device/: Nsight Compute's per-instruction view (SASS, with warp
# stall samples per instruction) of the first varlen attention launch of each given benchmark
# workload, clocks left alone. Writes $OUT/sass_<workload>.csv.gz (the source page as CSV) and
# $OUT/sass_<workload>_top.txt (the 60 instructions with the most stall samples).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/device_env.sh
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
for w in "$@"; do
  rep="$out/rep_$w"
  ncu --clock-control none --kernel-name regex:varlen_attention --launch-count 1 --set full \
    --import-source no -o "$rep" build-device/attnkit_attention_bench --workloads "$w" --iters 1 --warmup 0 \
    --no-check >"$out/ncu_log_$w.txt" 2>&1
  ncu -i "$rep.ncu-rep" --page source --print-source sass --csv >"$out/sass_$w.csv" 2>>"$out/ncu_log_$w.txt"
  python3 - "$out/sass_$w.csv" >"$out/sass_${w}_top.txt" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if any('Warp Stall Sampling (All' in c for c in r))
cols = rows[head]
data = rows[head + 1:]
all_i = next(i for i, c in enumerate(cols) if c.startswith('Warp Stall Sampling (All'))
src_i = next(i for i, c in enumerate(cols) if c == 'Source')
def num(s):
    try: return float(s.replace(',', ''))
    except ValueError: return 0.0
total = sum(num(r[all_i]) for r in data if len(r) > all_i)
print('total stall samples', total, 'instructions', len(data))
for r in sorted(data, key=lambda r: -num(r[all_i]) if len(r) > all_i else 0)[:60]:
    print(f"{num(r[all_i]) / total * 100:5.2f}%  {r[0]:>6}  {r[src_i]}")
PY
  gzip -f "$out/sass_$w.csv"
  rm -f "$rep.ncu-rep"
  echo "sass $w: done"
done
