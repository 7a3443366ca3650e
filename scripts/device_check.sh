#!/usr/bin/env bash
# Runs on the lent GPU machine (see ../shared tools: device), over binaries built here with nvcc
# for sm_90 and carried in build-dev/: the GPU probe tests, the backend list and the demo.
# Results go to $OUT/device_check.txt.
set -uo pipefail
out="${OUT:-.}/device_check.txt"
{
  echo "== nvidia-smi"; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv
  echo "== test_platform"; ./build-dev/test_platform
  echo "== attnkit backends"; ./build-dev/attnkit backends 2>&1
  echo "== attnkit demo"; ./build-dev/attnkit demo
} >"$out" 2>&1
rc=$?
cat "$out"
exit $rc
