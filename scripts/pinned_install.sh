# Sourced by scripts/install_kernel_libraries.sh and scripts/install_python_tools.sh: the one way
# attnkit installs pinned PyPI wheels, into a folder of .tools/ of this checkout, never into a
# Python environment.
#
# pinned_install LABEL PYTHON TARGET MARKER REQUIREMENT...
#   Leaves TARGET alone when TARGET/.attnkit-installed holds exactly MARKER (then no network is
#   needed). Otherwise runs `PYTHON -m pip install --no-deps --only-binary=:all: --target` for every
#   REQUIREMENT (name==version) into a scratch folder beside TARGET, checks that each installed
#   dist-info names its pinned version, writes MARKER and renames the scratch folder into place, so
#   an interrupted install leaves nothing half-filled and another version is replaced whole.
#   Returns 1, after saying why on stderr (LABEL first), when PYTHON has no pip or pip cannot install
#   the set (no network): the caller decides whether to go on without it. Exits 1 when pip
#   installed a version other than the pinned one.
pinned_install() {
  local label=$1 python=$2 target=$3 marker=$4
  shift 4
  local requirements=("$@")
  if [[ -f "$target/.attnkit-installed" && "$(cat "$target/.attnkit-installed")" == "$marker" ]]; then
    return 0
  fi
  if ! "$python" -m pip --version >/dev/null 2>&1; then
    echo "$label: $python has no pip (Debian: apt-get install python3-pip): ${requirements[*]} not installed" >&2
    return 1
  fi
  echo "$label: installing ${requirements[*]} from PyPI into $target" >&2
  mkdir -p "$(dirname "$target")"
  local scratch
  scratch="$(mktemp -d "$target.partial.XXXXXX")"
  if ! PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --quiet --disable-pip-version-check --no-input \
    --no-deps --only-binary=:all: --target "$scratch" "${requirements[@]}"; then
    echo "$label: could not install ${requirements[*]} from PyPI (no network?)" >&2
    rm -rf "$scratch"
    return 1
  fi
  local requirement name version dist got
  for requirement in "${requirements[@]}"; do
    name="${requirement%%==*}"
    version="${requirement##*==}"
    dist="$(find "$scratch" -maxdepth 1 -iname "$(echo "$name" | tr - _)-*.dist-info" | head -n 1)"
    got="$(sed -n 's/^Version: //p' "$dist/METADATA" 2>/dev/null | head -n 1)"
    if [[ "$got" != "$version" ]]; then
      echo "$label: $name installed as version '${got}', want $version" >&2
      rm -rf "$scratch"
      exit 1
    fi
  done
  echo "$marker" >"$scratch/.attnkit-installed"
  rm -rf "$target"
  mv "$scratch" "$target"
}
