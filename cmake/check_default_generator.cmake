# ctest: configure this project with CMake's default generator (no -G; on Linux: Unix Makefiles)
# into a scratch folder, tests, benchmarks and examples off, and build the attnkit library: where
# nvcc exists that compiles every .cu file as C++20 too. The main build uses Ninja; this proves
# the other generator works as well (Debian's CMake 3.25.1 failed there at generate time).
# Inputs: SOURCE_DIR (repo root), WORK_DIR (scratch), CXX_COMPILER, HAVE_CUDA (ON/OFF) and, with
# CUDA, CUDA_COMPILER and CUDA_ARCHITECTURES (comma-separated): the main build's, so both build the
# same way.
foreach(var SOURCE_DIR WORK_DIR CXX_COMPILER HAVE_CUDA)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_default_generator.cmake needs -D${var}=...")
  endif()
endforeach()

# The default generator, not one chosen through the environment.
unset(ENV{CMAKE_GENERATOR})
unset(ENV{CMAKE_GENERATOR_PLATFORM})
unset(ENV{CMAKE_GENERATOR_TOOLSET})
file(REMOVE_RECURSE ${WORK_DIR})

function(run_step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} failed (${rc}):\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# Build type None (no -O, no -g), not the project's RelWithDebInfo default: the flags do not matter
# here, and unoptimized code without debug info compiles in about 2/3 of Release's CPU time.
set(cuda_args -DATTNKIT_ENABLE_CUDA=${HAVE_CUDA})
if(HAVE_CUDA)
  list(APPEND cuda_args -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER})
  # Through CUDAARCHS (which CMakeLists.txt honours): a list such as "80,90a" (commas, as ctest got
  # it) would not survive as one -D argument.
  string(REPLACE "," ";" archs "${CUDA_ARCHITECTURES}")
  set(ENV{CUDAARCHS} "${archs}")
endif()
run_step("configure (default generator)" ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}
         -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_COMPILER=${CXX_COMPILER} ${cuda_args}
         -DATTNKIT_BUILD_TESTS=OFF -DATTNKIT_BUILD_BENCH=OFF -DATTNKIT_BUILD_EXAMPLES=OFF
         # The third-party kernel libraries' sources build in the main build; not twice on CI.
         -DATTNKIT_WITH_FLASHINFER=OFF -DATTNKIT_WITH_CUDNN=OFF)
file(STRINGS ${WORK_DIR}/CMakeCache.txt generator_line REGEX "^CMAKE_GENERATOR:INTERNAL=")
string(REGEX REPLACE "^CMAKE_GENERATOR:INTERNAL=" "" generator "${generator_line}")
string(FIND "${step_output}" "attnkit: CUDA sources ${HAVE_CUDA}" cuda_line)
if(cuda_line EQUAL -1)
  message(FATAL_ERROR "the scratch configure did not report 'CUDA sources ${HAVE_CUDA}' as the main build did:\n${step_output}")
endif()

cmake_host_system_information(RESULT cores QUERY NUMBER_OF_LOGICAL_CORES)
run_step("build attnkit (${generator})" ${CMAKE_COMMAND} --build ${WORK_DIR} --target attnkit --parallel ${cores})

file(GLOB library ${WORK_DIR}/libattnkit.a)
if(NOT library)
  message(FATAL_ERROR "no libattnkit.a in ${WORK_DIR} after the build:\n${step_output}")
endif()
if(HAVE_CUDA)
  file(GLOB_RECURSE cuda_objects ${WORK_DIR}/CMakeFiles/attnkit.dir/*.cu.o)
  if(NOT cuda_objects)
    message(FATAL_ERROR "CUDA is on but no .cu object was built in ${WORK_DIR}:\n${step_output}")
  endif()
  list(LENGTH cuda_objects cuda_count)
  set(cuda_note ", ${cuda_count} CUDA object(s)")
endif()
message(STATUS "default generator check passed: ${generator} (CMake ${CMAKE_VERSION}) built libattnkit.a${cuda_note}")
file(REMOVE_RECURSE ${WORK_DIR})
