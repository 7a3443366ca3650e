# Sanitizer and fuzzer builds (CPU only). Included by the top-level CMakeLists.txt after the CUDA
# check and before any target, so that its flags reach the library, the CLI, the tests, the
# benchmarks and the examples alike: a sanitizer must see every translation unit that shares memory
# with the code it checks (an uninstrumented caller hides the overflows it causes).
#
#   ATTNKIT_SANITIZE=address,undefined   -fsanitize= list for the compiler (gcc or clang); undefined
#                                        behaviour aborts (no recovery) so that ctest sees it
#   ATTNKIT_FUZZ=ON                      clang only: coverage instrumentation for libFuzzer and the
#                                        fuzz targets of tests/fuzz/ (linked with -fsanitize=fuzzer)
#
# scripts/test.sh configures such a build (build-sanitize/) beside the main one.

set(ATTNKIT_SANITIZE "" CACHE STRING
    "Build with these sanitizers, a -fsanitize= list such as address,undefined (CPU builds only)")
option(ATTNKIT_FUZZ "Build the libFuzzer targets of tests/fuzz (clang only)" OFF)

if(ATTNKIT_SANITIZE OR ATTNKIT_FUZZ)
  # The CUDA runtime and ASan's shadow memory do not mix without extra runtime options, and device
  # code is not instrumented anyway: these builds are for the host code, which the CPU platform runs.
  if(ATTNKIT_HAVE_CUDA)
    message(FATAL_ERROR "ATTNKIT_SANITIZE / ATTNKIT_FUZZ are for CPU builds: configure with -DATTNKIT_ENABLE_CUDA=OFF")
  endif()
endif()

if(ATTNKIT_SANITIZE)
  if(NOT ATTNKIT_SANITIZE MATCHES "^[a-z,_-]+$")
    message(FATAL_ERROR "ATTNKIT_SANITIZE='${ATTNKIT_SANITIZE}': expected a -fsanitize= list such as address,undefined")
  endif()
  set(attnkit_sanitize_flags -fsanitize=${ATTNKIT_SANITIZE} -fno-omit-frame-pointer)
  if(ATTNKIT_SANITIZE MATCHES "undefined")
    # Report-and-continue would let a test pass through undefined behaviour; abort instead.
    list(APPEND attnkit_sanitize_flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${attnkit_sanitize_flags}>")
  add_link_options(-fsanitize=${ATTNKIT_SANITIZE})
  message(STATUS "attnkit sanitizers: ${ATTNKIT_SANITIZE} (${attnkit_sanitize_flags})")
endif()

if(ATTNKIT_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "ATTNKIT_FUZZ=ON needs clang (libFuzzer); this is ${CMAKE_CXX_COMPILER_ID} "
                        "(${CMAKE_CXX_COMPILER}): configure with CXX=clang++ (Debian: apt-get install clang)")
  endif()
  # The coverage hooks the instrumentation calls are defined by the sanitizer runtimes.
  if(NOT ATTNKIT_SANITIZE)
    message(FATAL_ERROR "ATTNKIT_FUZZ=ON needs ATTNKIT_SANITIZE as well (e.g. -DATTNKIT_SANITIZE=address,undefined): "
                        "a fuzzer without them finds only crashes, not the memory errors that precede them")
  endif()
  # Every target gets the edge coverage libFuzzer steers by; only the fuzz targets link its main.
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>")
  message(STATUS "attnkit fuzz targets: ON (tests/fuzz)")
endif()
