#!/usr/bin/env bash
# session 11 (untracked): CUDNN start-up graphs + head sizes, then the whole device check.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$SECONDS
python3 -c "import tarfile; tarfile.open('build-device.tar.xz').extractall()"
echo "unpacked in $((SECONDS - start)) s; commit $(cat build-device/COMMIT)"
source scripts/device_env.sh
out="${OUT:-/tmp/out}"; mkdir -p "$out"
build-device/test_backends --gtest_filter='Cudnn*' >"$out/cudnn_unit.txt" 2>&1; echo "cudnn unit rc $?"
grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|Failure|error" "$out/cudnn_unit.txt" | head -20
build-device/test_runner --gtest_filter='*CudaGraphBackend*' >"$out/graphs.txt" 2>&1; echo "graphs rc $?"
grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|Failure" "$out/graphs.txt" | head -30
OUT="$out/check" timeout 470 bash scripts/device_check.sh; echo "device_check rc $?"
cat "$out/check/sanitizer.txt" 2>/dev/null
grep -n "FAILED\|Failure" "$out/check/device_check.log" | head -30
grep -n "CUDNN" "$out/check/device_check.log" | grep -E "OK|FAILED" | head -20
