#!/usr/bin/env bash
# Builds only the CLI and runs its demo; arguments are passed to `attnkit demo`.
# Build output goes to stderr so that stdout is the demo's alone.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dir="$(./scripts/build_cli.sh)"
exec "$dir/attnkit" demo "$@"
