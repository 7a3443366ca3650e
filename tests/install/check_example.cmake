# ctest: build examples/runner_loop the way a user would, as a project of its own that finds
# attnkit only through find_package in an installed prefix, then run it: it runs a 2-layer model
# for 3 steps and exits non-zero when an output differs from its brute-force attention.
# Inputs: SOURCE_DIR (repo root), BUILD_DIR (configured and built tree), WORK_DIR (scratch).
# Optional: PREFIX, an attnkit prefix installed already (e.g. check_install.cmake's
# WORK_DIR/prefix); without it the build tree is installed into WORK_DIR/prefix.
foreach(var SOURCE_DIR BUILD_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_example.cmake needs -D${var}=...")
  endif()
endforeach()

set(example_build ${WORK_DIR}/engine-loop-build)
file(REMOVE_RECURSE ${WORK_DIR})

function(run_step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} failed (${rc}):\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

if(DEFINED PREFIX)
  set(prefix ${PREFIX})
  if(NOT EXISTS ${prefix}/lib/cmake/attnkit/attnkitConfig.cmake AND NOT EXISTS ${prefix}/lib64/cmake/attnkit/attnkitConfig.cmake)
    message(FATAL_ERROR "PREFIX=${prefix} holds no installed attnkit package")
  endif()
else()
  set(prefix ${WORK_DIR}/prefix)
  run_step("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
endif()

# Only the prefix may satisfy find_package: no package registries, no build tree.
run_step("example configure" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/runner_loop -B ${example_build}
         -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${prefix}
         -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
string(FIND "${step_output}" "attnkit package found at ${prefix}/" found_at)
if(found_at EQUAL -1)
  message(FATAL_ERROR "the example did not find attnkit in ${prefix}:\n${step_output}")
endif()

run_step("example build" ${CMAKE_COMMAND} --build ${example_build})
# run_step fails on a non-zero exit: a mismatch against the brute force, or any error.
run_step("example run" ${example_build}/runner_loop)

string(FIND "${step_output}" "runner_loop: all outputs match the brute-force attention" passed_at)
if(passed_at EQUAL -1)
  message(FATAL_ERROR "runner_loop exited 0 without reporting a match:\n${step_output}")
endif()
message(STATUS "example check passed:\n${step_output}")
