#!/usr/bin/env bash
# Installs the pinned kernel libraries of scripts/kernel_libraries.txt (FlashInfer's and cuDNN's
# frontend headers, from PyPI wheels) into .tools/kernel-libs/<name> of this checkout, where
# cmake/kernel_libraries.cmake finds them. Only where nvcc exists: without CUDA no backend uses
# them. Idempotent: an installed pinned version is left alone and needs no network; another
# version is replaced whole (installed into a scratch folder first, then renamed into place). A
# library that cannot be installed (no pip, no network) is reported and skipped, not fatal: the
# build then leaves its backend out, and the configure summary says so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

nvcc_found() {
  [[ -n "${CUDACXX:-}" && -x "${CUDACXX}" ]] || command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]
}
if ! nvcc_found; then
  echo "install_kernel_libraries.sh: no nvcc: the FLASHINFER and CUDNN backends are not built, nothing to install" >&2
  exit 0
fi

source scripts/pinned_install.sh
while read -r requirement; do
  [[ -z "$requirement" || "$requirement" == \#* ]] && continue
  # Without pip or PyPI the build goes on without this library's backend (its option defaults to
  # OFF then; configure says so), instead of failing the main job.
  pinned_install install_kernel_libraries.sh python3 ".tools/kernel-libs/${requirement%%==*}" "$requirement" \
    "$requirement" || echo "install_kernel_libraries.sh: the backend of $requirement will not be built" >&2
done <scripts/kernel_libraries.txt
