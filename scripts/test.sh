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
# Every FLASHINFER head size is built (-DATTNKIT_FLASHINFER_ALL_HEAD_SIZES=OFF would save 16
# translation units of about a minute, but kernel_libraries_test expects the fp8 refusal at head
# size 64 and fails without it: to be reconciled before CI is cut that way).
"$cmake" -S . -B build -G Ninja --no-warn-unused-cli -DATTNKIT_WITH_PYTHON="${ATTNKIT_WITH_PYTHON:-ON}"
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

# --- the sanitizer build and the fuzzers --------------------------------------------------------
# A second build, CPU only, in build-sanitize/: the library, CLI, tests and examples with
# AddressSanitizer and UndefinedBehaviorSanitizer (ATTNKIT_SANITIZE, cmake/sanitizers.cmake), at -O1
# to keep it quick; a sanitizer report fails the test it happens in. The Python binding is left
# out (the interpreter is not instrumented), and so are the benchmarks. clang builds it where it
# links the sanitizers (setup.sh installs Debian's), with the fuzz targets of tests/fuzz when it
# links libFuzzer too (ATTNKIT_FUZZ): each is then fuzzed for ATTNKIT_FUZZ_SECONDS (default 60)
# from its committed seed corpus. Elsewhere the default compiler builds it and the seeds run once,
# as tests. ATTNKIT_SANITIZE_STAGE=OFF in the environment skips the stage (a quicker local run).
clang_links() {  # clang_links FLAGS SOURCE: clang++ compiles and links SOURCE with FLAGS
  command -v clang++ >/dev/null 2>&1 || return 1
  local probe status
  probe="$(mktemp -d)"
  printf '%s\n' "$2" >"$probe/probe.cc"
  clang++ "$1" "$probe/probe.cc" -o "$probe/probe" >/dev/null 2>&1
  status=$?
  rm -rf "$probe"
  return $status
}

if [[ "${ATTNKIT_SANITIZE_STAGE:-ON}" != "OFF" ]]; then
  sanitize_args=(-DATTNKIT_ENABLE_CUDA=OFF -DATTNKIT_WITH_PYTHON=OFF -DATTNKIT_BUILD_BENCH=OFF
                 -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g" -DATTNKIT_SANITIZE=address,undefined)
  fuzz=OFF
  compiler="the default compiler"
  if clang_links -fsanitize=address,undefined 'int main() { return 0; }'; then
    compiler=clang++
    sanitize_args+=(-DCMAKE_CXX_COMPILER=clang++)
    if clang_links -fsanitize=fuzzer,address,undefined \
         'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }'; then
      fuzz=ON
    fi
  fi
  sanitize_args+=(-DATTNKIT_FUZZ=$fuzz)
  echo "test.sh: sanitizer build with $compiler, fuzz targets $fuzz"
  stage_start=$SECONDS
  "$cmake" -S . -B build-sanitize -G Ninja "${sanitize_args[@]}"
  "$cmake" --build build-sanitize -j "$jobs"
  echo "test.sh: sanitizer build took $((SECONDS - stage_start)) s"
  # Left out here, all run by the main build above: build.* configures and compiles the library
  # again in a scratch folder (a generator check, not a run of the code); install.* links the
  # installed libattnkit.a into a consumer project built without the sanitizer runtime; and, for
  # CI's time (together half of this stage's test time), the conformance harness's two self-tests
  # (CoverageCheck*: they rerun campaigns to test the harness's reporting, not the library) and the
  # executor-vs-dense cases of llama2, llama3, qwen2 and mistral in float32: every family still runs
  # through the executor here (engine.Families, the other executor cases), and every backend.
  sanitize_excluded='^(build|install)\.|^conformance\.ConformanceHarness\.CoverageCheck'
  sanitize_excluded+='|ExecutorMatchesDenseReference\.SixteenGreedyStepsTokenExact/'
  sanitize_excluded+='(llama2|llama3|qwen2|mistral)_[A-Z_]+_F32$'
  stage_start=$SECONDS
  ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$ctest" --test-dir build-sanitize --output-on-failure -j "$jobs" -E "$sanitize_excluded"
  echo "test.sh: sanitizer tests took $((SECONDS - stage_start)) s"

  if [[ "$fuzz" == ON ]]; then
    # New inputs go to a scratch corpus (the committed seeds stay as they are); a failure prints
    # the end of the fuzzer's log and leaves the input under build-sanitize/fuzz/.
    for target in npy batch_record prepare_step; do
      scratch="build-sanitize/fuzz/corpus/$target"
      log="build-sanitize/fuzz/$target.log"
      mkdir -p "$scratch"
      if ! build-sanitize/tests/fuzz/fuzz_$target -max_total_time="${ATTNKIT_FUZZ_SECONDS:-60}" -print_final_stats=1 \
             -artifact_prefix="build-sanitize/fuzz/$target-" "$scratch" "tests/fuzz/corpus/$target" >"$log" 2>&1; then
        tail -n 80 "$log" >&2
        echo "test.sh: fuzz_$target failed (its input is under build-sanitize/fuzz/; log $log)" >&2
        exit 1
      fi
      echo "test.sh: fuzz_$target: $(grep -m1 -oE 'number_of_executed_units: [0-9]+' "$log"), 0 failures"
    done
  fi
fi
