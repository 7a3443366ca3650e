#!/usr/bin/env bash
# Builds only the CLI and runs its demo; arguments are passed to `attnkit demo`.
# Build output goes to stderr so that stdout is the demo's alone.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/setup.sh >&2
# The system cmake when it is new enough, else the one setup.sh installed into .tools/cmake.
cmake="$(./scripts/cmake_path.sh)/cmake"
"$cmake" -S . -B build -G Ninja >&2
"$cmake" --build build --target attnkit_cli -j "$(nproc)" >&2
exec build/attnkit demo "$@"
