#!/usr/bin/env bash
# Builds, on the CPU machine, one side of a kernel A/B comparison (bench/notes/*.md: "the two builds
# alternating in one run"): the attention bench and the GPU test binaries of a VARLEN-only build
# (FLASHINFER, CUDNN and the binding off, a few minutes), stripped, into ab/<NAME>/ (git-ignored
# build output; carry the folder). Run it once per variant of the working tree, e.g.
#   scripts/build_ab.sh base; <edit the kernel>; scripts/build_ab.sh new
# then on the GPU machine: scripts/device_ab.sh base new (scripts/device_ab.sh says what it runs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
name="${1:?usage: scripts/build_ab.sh NAME}"
./scripts/setup.sh >/dev/null
PATH="$(./scripts/cmake_path.sh):$PATH"
cmake -S . -B build-ab -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNKIT_BUILD_BENCH=ON -DATTNKIT_WITH_FLASHINFER=OFF \
  -DATTNKIT_WITH_CUDNN=OFF -DATTNKIT_WITH_PYTHON=OFF >/dev/null
cmake --build build-ab -j "$(nproc)" --target attnkit_attention_bench test_backends test_conformance
rm -rf "ab/$name" && mkdir -p "ab/$name"
cp build-ab/bench/attnkit_attention_bench build-ab/tests/test_backends build-ab/tests/test_conformance "ab/$name/"
strip "ab/$name"/*
git rev-parse --short HEAD >"ab/$name/COMMIT"
git diff --quiet HEAD -- src bench || echo "+working-tree" >>"ab/$name/COMMIT"
du -sh "ab/$name"
