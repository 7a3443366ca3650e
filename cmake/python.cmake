# The Python binding's build dependencies: a Python 3 with its development headers and nanobind,
# pinned in scripts/python_tools.txt and installed by scripts/install_python_tools.sh into
# .tools/nanobind (found through its nanobind-config.cmake; no Python package is imported). The
# option ATTNKIT_WITH_PYTHON is ON by default where both are found; turning it ON by hand without
# them is a configure error that names the install step.
#
# Two ways to name the Python the extension is built for:
#   - the default: FindPython's Interpreter + Development.Module (the python3 on the PATH, or
#     Python_EXECUTABLE / Python_ROOT_DIR hints); its tests run with that interpreter;
#   - ATTNKIT_PYTHON_INCLUDE (cache or environment variable): a folder holding another Python's
#     Python.h (e.g. the device machine's 3.12 headers), with ATTNKIT_PYTHON_EXT_SUFFIX (its
#     sysconfig EXT_SUFFIX, ".cpython-312-x86_64-linux-gnu.so"). No interpreter of that version is
#     needed: the version is read from its patchlevel.h, and the extension's tests are not
#     registered (nothing here can import it).
#
# Defines ATTNKIT_WITH_PYTHON, ATTNKIT_PYTHON_SUMMARY (a line for the configure summary) and, when
# ON, the Python::Module/Python::Interpreter targets and nanobind_add_module().

set(ATTNKIT_PYTHON_INCLUDE "$ENV{ATTNKIT_PYTHON_INCLUDE}" CACHE PATH
    "Build the Python extension against this folder's Python.h instead of the found interpreter's")
set(ATTNKIT_PYTHON_EXT_SUFFIX "$ENV{ATTNKIT_PYTHON_EXT_SUFFIX}" CACHE STRING
    "With ATTNKIT_PYTHON_INCLUDE: that Python's EXT_SUFFIX, e.g. .cpython-312-x86_64-linux-gnu.so")
set(ATTNKIT_NANOBIND_ROOT "${CMAKE_CURRENT_SOURCE_DIR}/.tools/nanobind" CACHE PATH
    "Where scripts/install_python_tools.sh installs the pinned nanobind")
set(ATTNKIT_PYTHON_TEST_TOOLS "${CMAKE_CURRENT_SOURCE_DIR}/.tools/python-test" CACHE PATH
    "Where scripts/install_python_tools.sh installs the pinned pytest and NumPy of tests/python")

file(STRINGS "${CMAKE_CURRENT_SOURCE_DIR}/scripts/python_tools.txt" attnkit_nanobind_pin REGEX "^nanobind nanobind==")
string(REGEX REPLACE ".*==" "" ATTNKIT_NANOBIND_VERSION "${attnkit_nanobind_pin}")

set(attnkit_python_found OFF)
set(attnkit_python_why "")
if(ATTNKIT_PYTHON_INCLUDE)
  set(patchlevel "${ATTNKIT_PYTHON_INCLUDE}/patchlevel.h")
  if(NOT EXISTS "${ATTNKIT_PYTHON_INCLUDE}/Python.h" OR NOT EXISTS "${patchlevel}")
    set(attnkit_python_why "ATTNKIT_PYTHON_INCLUDE=${ATTNKIT_PYTHON_INCLUDE} has no Python.h/patchlevel.h")
  elseif(NOT ATTNKIT_PYTHON_EXT_SUFFIX MATCHES "^\\.(.+)\\.so$")
    set(attnkit_python_why "ATTNKIT_PYTHON_INCLUDE needs ATTNKIT_PYTHON_EXT_SUFFIX (e.g. .cpython-312-x86_64-linux-gnu.so), got '${ATTNKIT_PYTHON_EXT_SUFFIX}'")
  else()
    set(attnkit_python_soabi "${CMAKE_MATCH_1}")
    file(STRINGS "${patchlevel}" version_line REGEX "^#define PY_VERSION ")
    string(REGEX REPLACE ".*\"([0-9]+)\\.([0-9]+)\\.([0-9]+).*\".*" "\\1.\\2.\\3" attnkit_python_version "${version_line}")
    # Debian/Ubuntu headers: include/python3.X/pyconfig.h includes <MULTIARCH/python3.X/pyconfig.h>,
    # which lives beside the python3.X folder (/usr/include/x86_64-linux-gnu/python3.12/); that
    # parent folder is then an include directory too.
    set(attnkit_python_include_dirs "${ATTNKIT_PYTHON_INCLUDE}")
    file(STRINGS "${ATTNKIT_PYTHON_INCLUDE}/pyconfig.h" multiarch_lines REGEX "include <[^>]*-linux-gnu[^>]*/pyconfig\\.h>")
    get_filename_component(include_parent "${ATTNKIT_PYTHON_INCLUDE}" DIRECTORY)
    set(multiarch_header "")
    if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
      foreach(line ${multiarch_lines})
        if(line MATCHES "<(x86_64-linux-gnu/[^>]*pyconfig\\.h)>")
          set(multiarch_header "${CMAKE_MATCH_1}")
        endif()
      endforeach()
    endif()
    if(NOT attnkit_python_version MATCHES "^3\\.[0-9]+\\.[0-9]+$")
      set(attnkit_python_why "no PY_VERSION in ${patchlevel}")
    elseif(multiarch_header AND NOT EXISTS "${include_parent}/${multiarch_header}")
      string(CONCAT attnkit_python_why "${ATTNKIT_PYTHON_INCLUDE}/pyconfig.h includes <${multiarch_header}>, which "
             "is not in ${include_parent} (copy that Python's /usr/include/${multiarch_header} there as well)")
    else()
      if(multiarch_header)
        list(APPEND attnkit_python_include_dirs "${include_parent}")
      endif()
      set(attnkit_python_found ON)
    endif()
  endif()
else()
  find_package(Python 3 QUIET COMPONENTS Interpreter Development.Module)
  if(Python_FOUND)
    set(attnkit_python_found ON)
  else()
    set(attnkit_python_why "no Python 3 interpreter with development headers (Development.Module) found")
  endif()
endif()

# `pip install .` (scikit-build-core sets SKBUILD): nanobind is the pinned one of pyproject.toml's
# build requirements, installed into the build's Python environment, not .tools/nanobind.
if(SKBUILD AND attnkit_python_found AND NOT ATTNKIT_PYTHON_INCLUDE)
  execute_process(COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir
                  OUTPUT_VARIABLE attnkit_nanobind_cmake_dir OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE status)
  if(status EQUAL 0)
    # <root>/nanobind/cmake -> <root>
    get_filename_component(ATTNKIT_NANOBIND_ROOT "${attnkit_nanobind_cmake_dir}/../.." ABSOLUTE)
  endif()
endif()

set(attnkit_nanobind_found OFF)
if(EXISTS "${ATTNKIT_NANOBIND_ROOT}/nanobind/cmake/nanobind-config.cmake")
  set(attnkit_nanobind_found ON)
elseif(attnkit_python_found)
  set(attnkit_python_why "nanobind ${ATTNKIT_NANOBIND_VERSION} is not installed under ${ATTNKIT_NANOBIND_ROOT}")
endif()

set(attnkit_python_default OFF)
if(ATTNKIT_SANITIZE)
  # An instrumented extension needs the sanitizer runtime preloaded into the interpreter; the
  # sanitizer build (cmake/sanitizers.cmake) checks the C++ side only.
  set(attnkit_python_why "ATTNKIT_SANITIZE=${ATTNKIT_SANITIZE}: sanitizer builds leave the binding out")
elseif(attnkit_python_found AND attnkit_nanobind_found)
  set(attnkit_python_default ON)
endif()
option(ATTNKIT_WITH_PYTHON "Build the Python binding (import attnkit; nanobind)" ${attnkit_python_default})

if(ATTNKIT_WITH_PYTHON)
  if(ATTNKIT_SANITIZE)
    message(FATAL_ERROR "ATTNKIT_WITH_PYTHON=ON with ATTNKIT_SANITIZE=${ATTNKIT_SANITIZE}: the extension would need "
            "the sanitizer runtime preloaded into Python; configure with -DATTNKIT_WITH_PYTHON=OFF")
  endif()
  if(NOT attnkit_python_found OR NOT attnkit_nanobind_found)
    message(FATAL_ERROR "ATTNKIT_WITH_PYTHON=ON, but ${attnkit_python_why}; run ./scripts/setup.sh (it installs "
            "the pinned nanobind of scripts/python_tools.txt into .tools/nanobind; Debian: python3-dev for "
            "the headers), or configure with -DATTNKIT_WITH_PYTHON=OFF")
  endif()
  if(ATTNKIT_PYTHON_INCLUDE)
    # Another Python's headers: the targets and variables nanobind reads, made by hand. The
    # interpreter target (nanobind's stub generator would run it; this build does not) is the host's.
    find_program(attnkit_host_python NAMES python3 python REQUIRED)
    add_executable(Python::Interpreter IMPORTED)
    set_target_properties(Python::Interpreter PROPERTIES IMPORTED_LOCATION "${attnkit_host_python}")
    add_library(Python::Module INTERFACE IMPORTED)
    set_target_properties(Python::Module PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${attnkit_python_include_dirs}")
    set(Python_EXECUTABLE "${attnkit_host_python}")
    set(Python_INTERPRETER_ID "Python")
    set(Python_VERSION "${attnkit_python_version}")
    string(REPLACE "." ";" parts "${attnkit_python_version}")
    list(GET parts 0 Python_VERSION_MAJOR)
    list(GET parts 1 Python_VERSION_MINOR)
    set(Python_INCLUDE_DIRS "${attnkit_python_include_dirs}")
    set(Python_SOABI "${attnkit_python_soabi}")
    set(Python_SOSABI "abi3")
    set(ATTNKIT_PYTHON_TESTS OFF)
    set(attnkit_python_for "Python ${Python_VERSION} headers ${ATTNKIT_PYTHON_INCLUDE} (${ATTNKIT_PYTHON_EXT_SUFFIX}); its tests run where that Python is")
  else()
    set(ATTNKIT_PYTHON_TESTS ON)
    set(attnkit_python_for "Python ${Python_VERSION} (${Python_EXECUTABLE})")
  endif()
  find_package(nanobind ${ATTNKIT_NANOBIND_VERSION} EXACT CONFIG REQUIRED
               PATHS "${ATTNKIT_NANOBIND_ROOT}/nanobind/cmake" NO_DEFAULT_PATH)
  set(ATTNKIT_PYTHON_SUMMARY "ON: attnkit._attnkit for ${attnkit_python_for}, nanobind ${nanobind_VERSION}")
else()
  if(attnkit_python_why)
    set(ATTNKIT_PYTHON_SUMMARY "OFF (${attnkit_python_why}; ./scripts/setup.sh installs nanobind)")
  else()
    set(ATTNKIT_PYTHON_SUMMARY "OFF")
  endif()
endif()
