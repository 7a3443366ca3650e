#!/usr/bin/env bash
# Installs what attnkit needs to build and test, only what is missing: the Debian packages (OpenBLAS
# among them: the CPU model ops' matrix products; clang: the sanitizer build and the fuzzers), and a
# CMake >= 3.25.2 (C++20 CUDA sources) when the system one is older: PyPI's `cmake` package at a
# pinned version, into .tools/cmake of this repository (git ignores it). scripts/cmake_path.sh
# tells the other scripts which cmake to use. Where nvcc exists, the pinned kernel libraries of the
# FLASHINFER and CUDNN backends (scripts/kernel_libraries.txt) into .tools/kernel-libs. The Python
# binding's pinned nanobind, pytest and NumPy (scripts/python_tools.txt) into .tools/nanobind and
# .tools/python-test (ATTNKIT_WITH_PYTHON=OFF skips them).
# Idempotent: on a machine that has everything it changes nothing and needs no network.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/cmake_version.sh

# clang and its sanitizer/libFuzzer runtimes (libclang-rt-dev): test.sh's sanitizer build and fuzz targets.
packages=(cmake ninja-build make g++ googletest libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev
          libopenblas-dev clang libclang-rt-dev)
# ATTNKIT_SETUP=cli (build_cli.sh's CPU-only CLI): only what that build needs, no kernel library and
# no Python or test tool, so that a fresh machine's first command is quick.
cli_only=0
if [[ "${ATTNKIT_SETUP:-all}" == cli ]]; then
  cli_only=1
  packages=(cmake ninja-build make g++ nlohmann-json3-dev libcli11-dev libopenblas-dev)
fi

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$package")
  fi
done

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  sudo=(sudo)
fi

if [[ ${#missing[@]} -gt 0 ]]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup.sh: missing packages (${missing[*]}) and no apt-get: install them by hand" >&2
    exit 1
  fi
  echo "setup.sh: installing ${missing[*]}" >&2
  "${sudo[@]}" apt-get update
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

if [[ $cli_only == 0 ]]; then
  # --- the kernel libraries of the FLASHINFER and CUDNN backends (PyPI wheels, pinned) -----------
  scripts/install_kernel_libraries.sh
  # --- the Python binding's build and test tools (PyPI wheels, pinned) ---------------------------
  scripts/install_python_tools.sh
fi

# --- CMake ---------------------------------------------------------------------------------------
if attnkit_cmake_bin >/dev/null; then
  exit 0
fi

system_version="$(attnkit_cmake_version "$(command -v cmake || echo cmake)")"
echo "setup.sh: CMake ${system_version:-none} is older than $ATTNKIT_CMAKE_MINIMUM;" \
     "installing cmake==$ATTNKIT_CMAKE_PINNED from PyPI into .tools/cmake" >&2
python=python3
if ! "$python" -m pip --version >/dev/null 2>&1; then
  echo "setup.sh: $python has no pip; install it (Debian: apt-get install python3-pip) and run setup.sh again" >&2
  exit 1
fi

# Into a scratch folder first, then renamed into place: an interrupted install leaves no
# half-filled .tools/cmake behind, and an old pinned version is replaced whole.
tools_parent="$(dirname "$ATTNKIT_CMAKE_TOOL_DIR")"
mkdir -p "$tools_parent"
scratch="$(mktemp -d "$tools_parent/cmake.partial.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --quiet --disable-pip-version-check --no-input \
  --no-deps --only-binary=:all: --target "$scratch" "cmake==$ATTNKIT_CMAKE_PINNED"

installed="$(attnkit_cmake_version "$scratch/cmake/data/bin/cmake")"
if [[ "$installed" != "$ATTNKIT_CMAKE_PINNED" || ! -x "$scratch/cmake/data/bin/ctest" ]]; then
  echo "setup.sh: the installed CMake does not run (got '${installed}', want $ATTNKIT_CMAKE_PINNED)" >&2
  exit 1
fi
rm -rf "$ATTNKIT_CMAKE_TOOL_DIR"
mv "$scratch" "$ATTNKIT_CMAKE_TOOL_DIR"
trap - EXIT
echo "setup.sh: CMake $installed installed: $(scripts/cmake_path.sh)/cmake" >&2
