#!/usr/bin/env bash
# Builds, on the CPU machine, what scripts/device_check.sh runs on the lent GPU machine: the test
# binaries and the CLI, Release, for sm_90a, stripped, into build-device/ and its archive
# build-device.tar.xz (what is carried; the device tool's limit is 64 MiB).
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
# The commit the binaries were built from; a copy of the tree without its history names it in
# ATTNKIT_COMMIT (a tree with uncommitted changes should say so, e.g. "abc1234+wip").
echo "${ATTNKIT_COMMIT:-$(git rev-parse --short HEAD)}" >build-device/COMMIT
du -sh build-device
# The binaries share the kernel libraries' machine code (FlashInfer's instantiations alone are
# ~13 MB in each), more than the device tool carries; compressed together they are ~9 MB. On the
# GPU machine: python3 -c "import tarfile; tarfile.open('build-device.tar.xz').extractall()"
tar cf - build-device | xz -T0 -9 >build-device.tar.xz
du -sh build-device.tar.xz
