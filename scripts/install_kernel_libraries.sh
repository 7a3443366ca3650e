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

root=.tools/kernel-libs
mkdir -p "$root"
python=python3
while read -r requirement; do
  [[ -z "$requirement" || "$requirement" == \#* ]] && continue
  name="${requirement%%==*}"
  version="${requirement##*==}"
  target="$root/$name"
  marker="$target/.attnkit-installed"
  if [[ -f "$marker" && "$(cat "$marker")" == "$requirement" ]]; then
    continue
  fi
  # Without pip or PyPI the build goes on without this library's backend (its option defaults to
  # OFF then; configure says so), instead of failing the main job.
  if ! "$python" -m pip --version >/dev/null 2>&1; then
    echo "install_kernel_libraries.sh: $python has no pip (Debian: apt-get install python3-pip):" \
         "$requirement not installed, its backend will not be built" >&2
    continue
  fi
  echo "install_kernel_libraries.sh: installing $requirement from PyPI into $target" >&2
  scratch="$(mktemp -d "$root/$name.partial.XXXXXX")"
  trap 'rm -rf "$scratch"' EXIT
  if ! PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --quiet --disable-pip-version-check --no-input \
    --no-deps --only-binary=:all: --target "$scratch" "$requirement"; then
    echo "install_kernel_libraries.sh: could not install $requirement from PyPI (no network?):" \
         "its backend will not be built" >&2
    rm -rf "$scratch"
    trap - EXIT
    continue
  fi
  # The dist-info says what was installed; refuse anything but the pinned version.
  dist="$(find "$scratch" -maxdepth 1 -name '*.dist-info' | head -n 1)"
  got="$(sed -n 's/^Version: //p' "$dist/METADATA" 2>/dev/null | head -n 1)"
  if [[ "$got" != "$version" ]]; then
    echo "install_kernel_libraries.sh: $name installed as version '${got}', want $version" >&2
    exit 1
  fi
  echo "$requirement" >"$scratch/.attnkit-installed"
  rm -rf "$target"
  mv "$scratch" "$target"
  trap - EXIT
done <scripts/kernel_libraries.txt
