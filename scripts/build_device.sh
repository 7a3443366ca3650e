#!/usr/bin/env bash
# Builds, on the CPU machine, what scripts/device_check.sh runs on the lent GPU machine: the test
# binaries and the CLI, Release, for sm_90a, stripped, into build-device/ (small enough to carry).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup.sh
PATH="$(./scripts/cmake_path.sh):$PATH"
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNKIT_BUILD_BENCH=ON >/dev/null
targets=(attnkit_cli engine_loop attnkit_attention_bench test_platform test_kv test_backends test_runner test_conformance test_cli)
cmake --build build-dev -j "$(nproc)" --target "${targets[@]}"
rm -rf build-device && mkdir -p build-device
cp build-dev/attnkit build-dev/examples/engine_loop/engine_loop build-dev/bench/attnkit_attention_bench build-device/
for t in "${targets[@]:3}"; do cp "build-dev/tests/$t" build-device/; done
strip build-device/*
git rev-parse --short HEAD >build-device/COMMIT
du -sh build-device
