#!/usr/bin/env bash
# Builds only the CLI (build/attnkit), installing what is missing first; everything it prints goes to
# stderr, so that the scripts that call it (demo.sh, generate.sh) keep stdout for the program's own.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/setup.sh >&2
# The system cmake when it is new enough, else the one setup.sh installed into .tools/cmake.
cmake="$(./scripts/cmake_path.sh)/cmake"
"$cmake" -S . -B build -G Ninja >&2
"$cmake" --build build --target attnkit_cli -j "$(nproc)" >&2
