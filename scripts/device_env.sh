# Sourced by the scripts that run on the GPU machine: makes the cuDNN library findable for binaries
# built with the CUDNN backend (ATTNKIT_WITH_CUDNN), which link libcudnn.so.9. That machine's CUDA
# toolkit has no cuDNN; its PyTorch wheel ships one (nvidia-cudnn, 9.19.0 on 2026-12-01, the
# version the build machine's toolkit has), so its folder goes on LD_LIBRARY_PATH when present.
cudnn_lib="$(python3 -c 'import os, nvidia.cudnn as c; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null || true)"
if [[ -n "$cudnn_lib" && -d "$cudnn_lib" ]]; then
  export LD_LIBRARY_PATH="$cudnn_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
elif ! ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9'; then
  echo "device_env.sh: no libcudnn.so.9 found (neither Python's nvidia.cudnn nor the system's);" \
       "binaries built with ATTNKIT_WITH_CUDNN will not start" >&2
fi
unset cudnn_lib
# Shared libraries build_device.sh carries beside the binaries (Debian's Google Benchmark).
if [[ -d build-device/lib ]]; then
  export LD_LIBRARY_PATH="$PWD/build-device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# The backends of BACKENDS (default "VARLEN FLASHINFER CUDNN") that build-device/attnkit registers,
# one per line; each one the build lacks is reported on stderr. An entry may pin a kernel variant
# (FLASHINFER:fa3-paged, as attnkit_attention_bench --backend takes it); bench_dir_name gives the
# folder name of its results (FLASHINFER_fa3-paged).
built_backends() {
  local backend registered
  registered="$(build-device/attnkit backends 2>/dev/null)"
  for backend in ${BACKENDS:-VARLEN FLASHINFER CUDNN}; do
    if grep -q "^${backend%%:*}"$'\t' <<<"$registered"; then
      echo "$backend"
    else
      echo "skip $backend: not in this build (build-device/attnkit backends)" >&2
    fi
  done
}
bench_dir_name() { echo "${1//:/_}"; }
