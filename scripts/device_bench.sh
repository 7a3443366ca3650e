#!/usr/bin/env bash
# Runs on a GPU machine over build-device/ (scripts/build_device.sh, with the Python extension in
# build-device/python when it was built with ATTNKIT_PYTHON_INCLUDE): the side-by-side benchmark.
#   1. build-device/attnkit_attention_bench for each attnkit CUDA backend of BACKENDS (default
#      "VARLEN FLASHINFER CUDNN", those this build registers; each output checked against
#      GPU_REFERENCE on the same inputs, each run measuring the copy and bf16 matrix ceilings),
#   2. bench/peers.py (PyTorch SDPA flash / cuDNN, FlexAttention, each checked against the binding's
#      GPU_REFERENCE) within PEERS_BUDGET seconds (default 150), PEER_BUDGET (default 60) per peer,
#   3. bench/report.py: one table per workload, each system with its ratio to the best.
# Workloads: WORKLOADS (default "default": the "default": true entries of bench/workloads.json;
# "all" or comma-separated names). Extra arguments go to attnkit_attention_bench (e.g. --iters 20).
# Leaves in $OUT: bench_<BACKEND>/attention_bench.{json,md} and stdout.txt, peers/peer_*.json and
# peers.txt, results/<date>_<TAG>.{md,json} (TAG default "device"), results/plots/*.png (from the
# checkout's bench/results plus this session) and README.md with its performance section
# rewritten: copy results/ into bench/results/ and README.md over the checkout's to log the run.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/device_env.sh
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
commit=$(cat build-device/COMMIT 2>/dev/null || echo unknown)
workloads="${WORKLOADS:-default}"
status=0
files=()
for backend in $(built_backends); do
  dir="$out/bench_$(bench_dir_name "$backend")"
  mkdir -p "$dir"
  start=$SECONDS
  ATTNKIT_COMMIT="$commit" build-device/attnkit_attention_bench --backend "$backend" --workloads "$workloads" \
    --out "$dir" "$@" >"$dir/stdout.txt" 2>&1
  rc=$?
  echo "== $backend: exit $rc, $((SECONDS - start)) s"
  [[ $rc -ne 0 ]] && status=1
  if [[ -f "$dir/attention_bench.json" ]]; then
    files+=("$dir/attention_bench.json")
  else
    tail -5 "$dir/stdout.txt"
  fi
done
start=$SECONDS
if [[ -d build-device/python/attnkit ]]; then
  ATTNKIT_COMMIT="$commit" PYTHONPATH="$PWD/build-device/python${PYTHONPATH:+:$PYTHONPATH}" \
    python3 bench/peers.py --workloads "$workloads" --out "$out/peers" --time-budget "${PEERS_BUDGET:-150}" \
    --peer-budget "${PEER_BUDGET:-60}" \
    >"$out/peers.txt" 2>&1
  rc=$?
  echo "== peers: exit $rc, $((SECONDS - start)) s"
  [[ $rc -ne 0 ]] && status=1
  grep -v '^running\|^  ' "$out/peers.txt" | tail -3
  shopt -s nullglob
  files+=("$out"/peers/peer_*.json)
  shopt -u nullglob
else
  echo "== peers: not run: build-device/python/attnkit is missing (build_device.sh without ATTNKIT_PYTHON_INCLUDE)"
fi
if [[ ${#files[@]} -eq 0 || ! -f "${files[0]}" ]]; then
  echo "no bench JSON was written: nothing to report"
  exit 1
fi
cp README.md "$out/README.md"
python3 bench/report.py "${files[@]}" --tag "${TAG:-device}" --results-dir "$out/results" \
  --log-dir bench/results --readme "$out/README.md" --link-prefix bench/results
rc=$?
[[ $rc -ne 0 ]] && status=1
exit $status
