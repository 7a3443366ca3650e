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

source scripts/pinned_install.sh
folders="$(sed -e 's/#.*//' scripts/python_tools.txt | awk 'NF == 2 { print $1 }' | uniq)"
for folder in $folders; do
  mapfile -t requirements < <(sed -e 's/#.*//' scripts/python_tools.txt | awk -v f="$folder" 'NF == 2 && $1 == f { print $2 }')
  # The marker records the Python too: NumPy's wheels are that Python's binaries.
  pinned_install install_python_tools.sh "$python" ".tools/$folder" "python $python_version: ${requirements[*]}" \
    "${requirements[@]}" || echo "install_python_tools.sh: the Python binding (or its tests) will not be built" >&2
done
