#!/usr/bin/env bash
# Prints the folder that holds the cmake and ctest attnkit builds with: the system's when it is
# at least the version CMakeLists.txt requires, else the one scripts/setup.sh installed into
# .tools/cmake. By hand:  export PATH="$(./scripts/cmake_path.sh):$PATH"
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cmake_version.sh"

if ! attnkit_cmake_bin; then
  echo "cmake_path.sh: no CMake >= $ATTNKIT_CMAKE_MINIMUM (system: $(cmake --version 2>/dev/null | head -n1 || echo none));" \
       "run ./scripts/setup.sh, which installs CMake $ATTNKIT_CMAKE_PINNED into .tools/cmake" >&2
  exit 1
fi
