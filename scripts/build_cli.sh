#!/usr/bin/env bash
# Builds only the CLI, installing what it needs first, and prints the folder it is in (the only
# line on stdout; everything else goes to stderr, so that demo.sh and generate.sh keep stdout for
# the program's own). One probe decides which CLI, said on the first line:
#   - a usable GPU (nvidia-smi lists one) and nvcc: the CUDA CLI in build/, every backend and
#     kernel instantiation (FlashInfer's take most of the time: README, "Building and testing");
#   - otherwise the CPU-only CLI in build-cpu/: no CUDA source compiled, no kernel library or
#     test tool installed (a fresh 2-core machine has it in minutes).
# ATTNKIT_PLATFORM=cpu or cuda skips the probe.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

nvcc_path() { command -v nvcc 2>/dev/null || { [[ -x /usr/local/cuda/bin/nvcc ]] && echo /usr/local/cuda/bin/nvcc; } || true; }
gpu_name() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 || true; }

platform="${ATTNKIT_PLATFORM:-}"
if [[ -z "$platform" ]]; then
  gpu="$(gpu_name)"
  nvcc="$(nvcc_path)"
  if [[ -n "$gpu" && -n "$nvcc" ]]; then
    platform=cuda
    echo "build_cli.sh: GPU $gpu and $nvcc: the CUDA CLI, into build/" >&2
  else
    platform=cpu
    why="no GPU found by nvidia-smi"
    [[ -n "$gpu" ]] && why="GPU $gpu but no nvcc"
    echo "build_cli.sh: $why: the CPU-only CLI, into build-cpu/ (no CUDA source compiled)" >&2
  fi
else
  echo "build_cli.sh: ATTNKIT_PLATFORM=$platform: the $platform CLI" >&2
fi

case "$platform" in
  cuda)
    ./scripts/setup.sh >&2
    dir=build
    cmake="$(./scripts/cmake_path.sh)/cmake"
    "$cmake" -S . -B "$dir" -G Ninja >&2
    ;;
  cpu)
    # Only what the CLI needs: compiler, CMake, Ninja and the CLI's libraries.
    ATTNKIT_SETUP=cli ./scripts/setup.sh >&2
    dir=build-cpu
    cmake="$(./scripts/cmake_path.sh)/cmake"
    "$cmake" -S . -B "$dir" -G Ninja -DATTNKIT_ENABLE_CUDA=OFF -DATTNKIT_BUILD_TESTS=OFF -DATTNKIT_BUILD_BENCH=OFF \
      -DATTNKIT_BUILD_EXAMPLES=OFF -DATTNKIT_WITH_PYTHON=OFF >&2
    ;;
  *) echo "build_cli.sh: ATTNKIT_PLATFORM is cpu or cuda, not $platform" >&2; exit 2 ;;
esac
start=$SECONDS
"$cmake" --build "$dir" --target attnkit_cli -j "$(nproc)" >&2
echo "build_cli.sh: $dir/attnkit built in $((SECONDS - start)) s" >&2
echo "$dir"
