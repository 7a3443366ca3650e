#!/usr/bin/env bash
# Builds, on the CPU machine, what scripts/device_check.sh runs on the lent GPU machine: the test
# binaries and the CLI, Release, for sm_90a, stripped, into build-device/ and its archive
# build-device.tar.xz (what is carried; the device tool's limit is 64 MiB).
# With ATTNKIT_PYTHON_INCLUDE (a folder with the device Python's Python.h, e.g. a copy of its
# /usr/include/python3.12, with its x86_64-linux-gnu/python3.12/pyconfig.h beside that folder) and
# ATTNKIT_PYTHON_EXT_SUFFIX (its EXT_SUFFIX, .cpython-312-x86_64-linux-gnu.so), also the Python
# extension for that Python, into build-device/python/attnkit (no such interpreter is needed here).
# On the device: PYTHONPATH=build-device/python python3 -m pytest -q -rs tests/python
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup.sh
PATH="$(./scripts/cmake_path.sh):$PATH"
python_include="${ATTNKIT_PYTHON_INCLUDE:-}"
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNKIT_BUILD_BENCH=ON \
  -DATTNKIT_PYTHON_INCLUDE="$python_include" -DATTNKIT_PYTHON_EXT_SUFFIX="${ATTNKIT_PYTHON_EXT_SUFFIX:-}" >/dev/null
# ATTNKIT_DEVICE_TESTS picks the test programs (default: all the GPU checks use, the model and engine
# tests too); ATTNKIT_DEVICE_BENCH=0 leaves the step, host and context-parallel benchmarks out.
read -r -a tests <<<"${ATTNKIT_DEVICE_TESTS:-test_platform test_kv test_backends test_runner test_conformance test_cli test_parallel test_checkpoint test_ops test_model test_engine test_serve_bench}"
targets=(attnkit_cli runner_loop attnkit_attention_bench "${tests[@]}")
python_targets=()
if [[ -n "$python_include" ]]; then
  python_targets=(attnkit_python)
fi
# The step breakdown and the host-path benchmark (scripts/device_step_bench.sh runs both).
bench_targets=(attnkit_step_bench attnkit_host_bench attnkit_cp_bench)
[[ "${ATTNKIT_DEVICE_BENCH:-1}" == 0 ]] && bench_targets=()
cmake --build build-dev -j "$(nproc)" --target "${targets[@]}" "${bench_targets[@]+"${bench_targets[@]}"}" \
  "${python_targets[@]+"${python_targets[@]}"}"
rm -rf build-device && mkdir -p build-device
cp build-dev/attnkit build-dev/examples/runner_loop/runner_loop build-dev/bench/attnkit_attention_bench build-device/
for t in "${bench_targets[@]+"${bench_targets[@]}"}"; do cp "build-dev/bench/$t" build-device/; done
for t in "${targets[@]:3}"; do cp "build-dev/tests/$t" build-device/; done
strip build-device/*
# The host bench links Debian's shared Google Benchmark, which the GPU machine lacks: carry it
# (scripts/device_env.sh puts build-device/lib on LD_LIBRARY_PATH).
mkdir -p build-device/lib
cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian build-device/lib/
# Every program links Debian's OpenBLAS (the CPU model ops' products, ops/cpu_ops.cc), which the
# GPU machine lacks too, with the gfortran runtime it needs.
openblas="$(readlink -f /usr/lib/x86_64-linux-gnu/libopenblas.so.0)"
cp "$openblas" build-device/lib/libopenblas.so.0
for dependency in $(ldd "$openblas" | awk '/libgfortran|libquadmath/ {print $3}'); do
  cp -L "$dependency" build-device/lib/
done
if [[ -n "$python_include" ]]; then
  # The package folder as the build lays it out: __init__.py and _attnkit<EXT_SUFFIX>.
  mkdir -p build-device/python
  cp -r build-dev/python/attnkit build-device/python/
  strip --strip-unneeded build-device/python/attnkit/_attnkit*.so
else
  echo "build_device.sh: ATTNKIT_PYTHON_INCLUDE not set: the Python extension is not carried" >&2
fi
# The commit the binaries were built from; a copy of the tree without its history names it in
# ATTNKIT_COMMIT (a tree with uncommitted changes should say so, e.g. "abc1234+wip").
echo "${ATTNKIT_COMMIT:-$(git rev-parse --short HEAD)}" >build-device/COMMIT
du -sh build-device
# The programs are statically linked: each holds every kernel instantiation (~57 MB each, 660 MB in
# all, more than the device tool carries). One xz stream with a dictionary that spans several of
# them (512 MiB) stores each program after the first mostly as matches against the ones before
# (-9's 64 MiB, split into blocks over threads, no longer did: 68.5 MB); about 5 GB of memory
# here, 512 MiB to unpack. A shared libattnkit would be smaller still, but compute-sanitizer
# disables itself under one: FlashInfer's XQA source initializes a namespace-scope static with a
# CUDA call, and a shared library's static initializers run before the sanitizer's. On the GPU
# machine: python3 -c "import tarfile; tarfile.open('build-device.tar.xz').extractall()"
tar cf - build-device | xz -T1 --lzma2=preset=9,dict=512MiB >build-device.tar.xz
du -sh build-device.tar.xz
