#!/usr/bin/env bash
# Installs the pinned tools of the Python binding (scripts/python_tools.txt: nanobind for the
# build, pytest and NumPy for tests/python) from PyPI into .tools/<folder> of this checkout,
# never into a Python environment: `pip install --no-deps --only-binary=:all: --target`.
# Idempotent: a folder whose marker names exactly its pinned set (and the Python it was installed
# for) is left alone and needs no network; anything else is replaced whole (installed into a
# scratch folder first, then renamed into place).
# A tool that cannot be installed (no pip, no network) is reported and skipped, not fatal here: a
# user's build then goes on without the binding (the configure summary says why). CI cannot miss
# it: ./scripts/test.sh configures with ATTNKIT_WITH_PYTHON=ON, which stops without nanobind, and a
# missing pytest/NumPy makes the Python tests fail. ATTNKIT_WITH_PYTHON=OFF in the environment skips
# this script.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ "${ATTNKIT_WITH_PYTHON:-ON}" == "OFF" ]]; then
  echo "install_python_tools.sh: ATTNKIT_WITH_PYTHON=OFF: the Python binding's tools are not installed" >&2
  exit 0
fi

python="${ATTNKIT_PYTHON:-python3}"
if ! "$python" -m pip --version >/dev/null 2>&1; then
  echo "install_python_tools.sh: $python has no pip (Debian: apt-get install python3-pip): the Python" \
       "binding's tools are not installed, the binding will not be built" >&2
  exit 0
fi
python_version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

root=.tools
mkdir -p "$root"
folders="$(sed -e 's/#.*//' scripts/python_tools.txt | awk 'NF == 2 { print $1 }' | uniq)"
for folder in $folders; do
  mapfile -t requirements < <(sed -e 's/#.*//' scripts/python_tools.txt | awk -v f="$folder" 'NF == 2 && $1 == f { print $2 }')
  target="$root/$folder"
  marker="$target/.attnkit-installed"
  want="python $python_version: ${requirements[*]}"
  if [[ -f "$marker" && "$(cat "$marker")" == "$want" ]]; then
    continue
  fi
  echo "install_python_tools.sh: installing ${requirements[*]} from PyPI into $target" >&2
  scratch="$(mktemp -d "$root/$folder.partial.XXXXXX")"
  trap 'rm -rf "$scratch"' EXIT
  if ! PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --quiet --disable-pip-version-check --no-input \
    --no-deps --only-binary=:all: --target "$scratch" "${requirements[@]}"; then
    echo "install_python_tools.sh: could not install ${requirements[*]} from PyPI (no network?):" \
         "the Python binding (or its tests) will not be built" >&2
    rm -rf "$scratch"
    trap - EXIT
    continue
  fi
  # Each dist-info must name its pinned version.
  for requirement in "${requirements[@]}"; do
    name="${requirement%%==*}"
    version="${requirement##*==}"
    dist="$(find "$scratch" -maxdepth 1 -iname "$(echo "$name" | tr - _)-*.dist-info" | head -n 1)"
    got="$(sed -n 's/^Version: //p' "$dist/METADATA" 2>/dev/null | head -n 1)"
    if [[ "$got" != "$version" ]]; then
      echo "install_python_tools.sh: $name installed as version '${got}', want $version" >&2
      exit 1
    fi
  done
  echo "$want" >"$scratch/.attnkit-installed"
  rm -rf "$target"
  mv "$scratch" "$target"
  trap - EXIT
done
