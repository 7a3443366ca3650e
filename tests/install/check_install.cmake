# ctest: install the build tree to a scratch prefix, then configure, build and run a consumer
# project that finds attnkit only through find_package in that prefix.
# Inputs: SOURCE_DIR (repo root), BUILD_DIR (configured and built tree), WORK_DIR (scratch).
foreach(var SOURCE_DIR BUILD_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_install.cmake needs -D${var}=...")
  endif()
endforeach()

set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/consumer-build)
file(REMOVE_RECURSE ${WORK_DIR})

function(run_step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} failed (${rc}):\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

run_step("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

# Only the scratch prefix may satisfy find_package: no package registries, no build tree.
run_step("consumer configure" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/consumer -B ${consumer_build}
         -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${prefix}
         -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
string(FIND "${step_output}" "attnkit package found at ${prefix}/" found_at)
if(found_at EQUAL -1)
  message(FATAL_ERROR "the consumer did not find attnkit in ${prefix}:\n${step_output}")
endif()

run_step("consumer build" ${CMAKE_COMMAND} --build ${consumer_build})
run_step("consumer run" ${consumer_build}/attnkit_consumer)

# [2 blocks, 4 heads, 16 tokens, 2*64]: a block spans 4*16*128 elements, a token 128, V starts at 64.
set(expected "attnkit consumer: dtype=bfloat16 layout=fused_hnd stride_block=8192 stride_token=128 v_offset=64")
string(STRIP "${step_output}" actual)
if(NOT actual STREQUAL expected)
  message(FATAL_ERROR "consumer output differs\n  expected: ${expected}\n  actual:   ${actual}")
endif()
message(STATUS "install check passed: ${actual}")
