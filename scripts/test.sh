#!/usr/bin/env bash
# Builds everything (library, CLI, tests, benchmarks) and runs the whole test suite; this is
# what CI runs. Exits non-zero if anything fails to build or any test fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/setup.sh
# The system cmake when it is new enough, else the one setup.sh installed into .tools/cmake.
cmake_bin="$(./scripts/cmake_path.sh)"
cmake="$cmake_bin/cmake"
ctest="$cmake_bin/ctest"
echo "test.sh: $("$cmake" --version | head -n1) ($cmake)"

jobs=$(nproc)
# No build type here: CMakeLists.txt defaults to RelWithDebInfo. The Python binding is required
# (setup.sh installed its tools), so a missing install step fails here instead of leaving its tests
# out; ATTNKIT_WITH_PYTHON=OFF in the environment builds and tests without it.
"$cmake" -S . -B build -G Ninja -DATTNKIT_WITH_PYTHON="${ATTNKIT_WITH_PYTHON:-ON}"
"$cmake" --build build -j "$jobs"
"$ctest" --test-dir build --output-on-failure -j "$jobs"

# Smoke run of the host-path benchmark: proves it builds and runs; the timings are a record, not
# a pass/fail criterion (a crash still fails).
if [[ -x build/bench/attnkit_host_bench ]]; then
  # A few sizes of each backend keep it short on CI's 2 cores; it fails if a step allocates.
  build/bench/attnkit_host_bench --benchmark_min_time=0.01 --benchmark_filter='/(1|256)/(1|3)/0$' \
    --benchmark_out=build/bench/host_bench_smoke.json --benchmark_out_format=json >/dev/null
  echo "test.sh: benchmark smoke run written to build/bench/host_bench_smoke.json"
fi
