# The third-party kernel libraries of the FLASHINFER and CUDNN backends, found where
# scripts/install_kernel_libraries.sh put the pinned PyPI wheels (.tools/kernel-libs/<name>, the
# versions of scripts/kernel_libraries.txt); no Python package is imported. Each backend is an
# option, ON by default where CUDA is built and its library is installed; turning one ON by hand
# without its library is a configure error that names the install step.
#
# Defines, for each found library, an INTERFACE target with its include directories:
#   attnkit_flashinfer_headers  FlashInfer's framework-free headers with the CUTLASS and CCCL they
#                               ship (the bundled CCCL before CUDA's own: FlashInfer needs a newer
#                               cuda::fast_mod_div than CUDA 13.0 has)
#   attnkit_cudnn_frontend      cuDNN's header-only C++ frontend, linking the toolkit's cuDNN and NVRTC
# and ATTNKIT_KERNEL_LIBRARIES_SUMMARY, one line per backend for the configure summary.

set(ATTNKIT_KERNEL_LIBS_ROOT "${CMAKE_CURRENT_SOURCE_DIR}/.tools/kernel-libs" CACHE PATH
    "Where scripts/install_kernel_libraries.sh installs the pinned kernel libraries")
file(STRINGS "${CMAKE_CURRENT_SOURCE_DIR}/scripts/kernel_libraries.txt" attnkit_pins REGEX "^[^#].*==")

# attnkit_pinned_library(<name> <out_dir_var> <out_version_var>): the library's folder and version
# when the pinned version is installed, else empty.
function(attnkit_pinned_library name dir_var version_var)
  set(${dir_var} "" PARENT_SCOPE)
  set(${version_var} "" PARENT_SCOPE)
  foreach(pin ${attnkit_pins})
    string(REPLACE "==" ";" parts "${pin}")
    list(GET parts 0 pin_name)
    list(GET parts 1 pin_version)
    if(pin_name STREQUAL name)
      set(dir "${ATTNKIT_KERNEL_LIBS_ROOT}/${name}")
      if(EXISTS "${dir}/.attnkit-installed")
        file(READ "${dir}/.attnkit-installed" installed)
        string(STRIP "${installed}" installed)
        if(installed STREQUAL pin)
          set(${dir_var} "${dir}" PARENT_SCOPE)
          set(${version_var} "${pin_version}" PARENT_SCOPE)
        endif()
      endif()
    endif()
  endforeach()
endfunction()

attnkit_pinned_library(flashinfer-python attnkit_flashinfer_dir attnkit_flashinfer_version)
attnkit_pinned_library(nvidia-cudnn-frontend attnkit_cudnn_frontend_dir attnkit_cudnn_frontend_version)

set(attnkit_flashinfer_default OFF)
set(attnkit_cudnn_default OFF)
if(ATTNKIT_HAVE_CUDA AND attnkit_flashinfer_dir)
  set(attnkit_flashinfer_default ON)
endif()
find_library(ATTNKIT_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
find_path(ATTNKIT_CUDNN_INCLUDE_DIR cudnn_version.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
if(ATTNKIT_HAVE_CUDA AND attnkit_cudnn_frontend_dir AND ATTNKIT_CUDNN_LIBRARY AND ATTNKIT_CUDNN_INCLUDE_DIR)
  set(attnkit_cudnn_default ON)
endif()
option(ATTNKIT_WITH_FLASHINFER "Build the FLASHINFER backend (FlashInfer's kernels)" ${attnkit_flashinfer_default})
option(ATTNKIT_WITH_CUDNN "Build the CUDNN backend (cuDNN's SDPA)" ${attnkit_cudnn_default})

set(attnkit_install_hint "run ./scripts/setup.sh (it installs the pinned kernel libraries of "
    "scripts/kernel_libraries.txt into .tools/kernel-libs where nvcc exists), or configure with")
if(ATTNKIT_WITH_FLASHINFER)
  if(NOT ATTNKIT_HAVE_CUDA OR NOT attnkit_flashinfer_dir)
    message(FATAL_ERROR "ATTNKIT_WITH_FLASHINFER=ON needs CUDA and flashinfer-python as pinned in "
            "scripts/kernel_libraries.txt under ${ATTNKIT_KERNEL_LIBS_ROOT}: ${attnkit_install_hint} "
            "-DATTNKIT_WITH_FLASHINFER=OFF")
  endif()
  set(data "${attnkit_flashinfer_dir}/flashinfer/data")
  add_library(attnkit_flashinfer_headers INTERFACE)
  # BEFORE: the bundled CCCL must shadow the toolkit's.
  target_include_directories(attnkit_flashinfer_headers SYSTEM BEFORE INTERFACE
    "${data}/cccl/libcudacxx/include" "${data}/cccl/cub" "${data}/cccl/thrust"
    "${data}/include" "${data}/cutlass/include"
    # The Hopper (FA3) headers include CUTLASS's utilities too.
    "${data}/cutlass/tools/util/include"
    # The XQA decode's sources (xqa/mha_sm90.cu), compiled by flashinfer_xqa_*.cu.
    "${data}/csrc")
  set(ATTNKIT_FLASHINFER_VERSION "${attnkit_flashinfer_version}")
endif()
if(ATTNKIT_WITH_CUDNN)
  if(NOT ATTNKIT_HAVE_CUDA OR NOT attnkit_cudnn_frontend_dir OR NOT ATTNKIT_CUDNN_LIBRARY)
    message(FATAL_ERROR "ATTNKIT_WITH_CUDNN=ON needs CUDA, the toolkit's cuDNN (found: "
            "'${ATTNKIT_CUDNN_LIBRARY}') and nvidia-cudnn-frontend as pinned in "
            "scripts/kernel_libraries.txt under ${ATTNKIT_KERNEL_LIBS_ROOT}: ${attnkit_install_hint} "
            "-DATTNKIT_WITH_CUDNN=OFF")
  endif()
  file(STRINGS "${ATTNKIT_CUDNN_INCLUDE_DIR}/cudnn_version.h" cudnn_version_lines REGEX "#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ")
  foreach(line ${cudnn_version_lines})
    if(line MATCHES "CUDNN_(MAJOR|MINOR|PATCHLEVEL) +([0-9]+)")
      set(cudnn_${CMAKE_MATCH_1} ${CMAKE_MATCH_2})
    endif()
  endforeach()
  set(ATTNKIT_CUDNN_VERSION "${cudnn_MAJOR}.${cudnn_MINOR}.${cudnn_PATCHLEVEL}")
  set(ATTNKIT_CUDNN_FRONTEND_VERSION "${attnkit_cudnn_frontend_version}")
  add_library(attnkit_cudnn_frontend INTERFACE)
  target_include_directories(attnkit_cudnn_frontend SYSTEM INTERFACE "${attnkit_cudnn_frontend_dir}/include")
  target_link_libraries(attnkit_cudnn_frontend INTERFACE "${ATTNKIT_CUDNN_LIBRARY}" CUDA::nvrtc)
endif()

set(ATTNKIT_KERNEL_LIBRARIES_SUMMARY "")
if(ATTNKIT_WITH_FLASHINFER)
  list(APPEND ATTNKIT_KERNEL_LIBRARIES_SUMMARY "FLASHINFER: flashinfer-python ${ATTNKIT_FLASHINFER_VERSION}")
else()
  list(APPEND ATTNKIT_KERNEL_LIBRARIES_SUMMARY "FLASHINFER: not built")
endif()
if(ATTNKIT_WITH_CUDNN)
  list(APPEND ATTNKIT_KERNEL_LIBRARIES_SUMMARY
       "CUDNN: cuDNN ${ATTNKIT_CUDNN_VERSION}, nvidia-cudnn-frontend ${ATTNKIT_CUDNN_FRONTEND_VERSION}")
else()
  list(APPEND ATTNKIT_KERNEL_LIBRARIES_SUMMARY "CUDNN: not built")
endif()
