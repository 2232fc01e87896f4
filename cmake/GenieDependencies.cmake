# Finds Genie's dependencies; nothing is vendored.
#
# UCX (DESIGN.md "UCX is the data plane"), chosen by GENIE_UCX:
#  - pypi (default): PyPI's libucx-cu13 (UCX 1.22: tcp, sm, CUDA; no verbs) from the project's
#    virtual environment (GENIE_PYTHON), found through the ucx.pc it ships. Binaries get an
#    RPATH to its lib/ folder, where UCX also finds its transport modules (lib/ucx/).
#  - system: pkg-config `ucx`, a site's own UCX (Debian's libucx-dev 1.13.1 with verbs here):
#    for RDMA fabrics. The data plane warns at start when it is older than the tested version.
# GENIE_UCX_PKG_CONFIG_PATH names another folder holding a ucx.pc (either mode).

# The Python whose packages (torch, libucx) the C++ side links: the project's virtual
# environment. Under scikit-build-core (pip install), the interpreter that builds the wheel.
if(DEFINED SKBUILD AND Python_EXECUTABLE)
  set(GENIE_PYTHON_DEFAULT "${Python_EXECUTABLE}")
else()
  set(GENIE_PYTHON_DEFAULT "${PROJECT_SOURCE_DIR}/.venv/bin/python")
endif()
set(GENIE_PYTHON "${GENIE_PYTHON_DEFAULT}" CACHE FILEPATH
    "Python whose torch and libucx the C++ side links (the project's virtual environment)")

set(GENIE_UCX "pypi" CACHE STRING "UCX to build with: pypi (the venv's libucx-cu13) or system (pkg-config ucx)")
set_property(CACHE GENIE_UCX PROPERTY STRINGS pypi system)
# The UCX release the tests run on; older ones are warned about at start (transport/src/worker.cc).
set(GENIE_UCX_TESTED_VERSION "1.22.0")
set(GENIE_UCX_PKG_CONFIG_PATH "" CACHE PATH "Extra folder searched for ucx.pc")
find_package(PkgConfig REQUIRED)
set(GENIE_UCX_PC_DIR "${GENIE_UCX_PKG_CONFIG_PATH}")
if(GENIE_UCX STREQUAL "pypi" AND NOT GENIE_UCX_PC_DIR)
  execute_process(
    COMMAND "${GENIE_PYTHON}" -c "import libucx, os; print(os.path.dirname(libucx.__file__), end='')"
    OUTPUT_VARIABLE GENIE_LIBUCX_DIR
    RESULT_VARIABLE GENIE_LIBUCX_FOUND
    ERROR_QUIET)
  if(NOT GENIE_LIBUCX_FOUND EQUAL 0 OR NOT EXISTS "${GENIE_LIBUCX_DIR}/lib/pkgconfig/ucx.pc")
    message(FATAL_ERROR "GENIE_UCX=pypi needs PyPI's libucx-cu13 in ${GENIE_PYTHON}: run tools/setup.sh, "
                        "or pass -DGENIE_PYTHON=/path/to/python, or -DGENIE_UCX=system for pkg-config's ucx")
  endif()
  set(GENIE_UCX_PC_DIR "${GENIE_LIBUCX_DIR}/lib/pkgconfig")
elseif(NOT GENIE_UCX STREQUAL "system" AND NOT GENIE_UCX STREQUAL "pypi")
  message(FATAL_ERROR "GENIE_UCX='${GENIE_UCX}': use pypi or system")
endif()
if(GENIE_UCX_PC_DIR)
  set(ENV{PKG_CONFIG_PATH} "${GENIE_UCX_PC_DIR}:$ENV{PKG_CONFIG_PATH}")
  # Wheels ship .pc files whose prefix is their build machine's: derive the prefix from where
  # the .pc file is instead.
  set(PKG_CONFIG_ARGN --define-prefix)
endif()
# pkg_check_modules caches what it found: look again when the UCX asked for changed.
if(NOT "${GENIE_UCX}|${GENIE_UCX_PC_DIR}" STREQUAL "${GENIE_UCX_CHECKED}")
  unset(__pkg_config_checked_UCX CACHE)
  foreach(library ucp uct ucs ucm)
    unset(pkgcfg_lib_UCX_${library} CACHE)
  endforeach()
  set(GENIE_UCX_CHECKED "${GENIE_UCX}|${GENIE_UCX_PC_DIR}" CACHE INTERNAL "the UCX pkg-config looked for")
endif()
pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)
unset(PKG_CONFIG_ARGN)  # --define-prefix is for the wheel's .pc files only
message(STATUS "UCX ${UCX_VERSION} (GENIE_UCX=${GENIE_UCX}) from ${UCX_PREFIX} (libs: ${UCX_LINK_LIBRARIES})")
if(UCX_VERSION VERSION_LESS GENIE_UCX_TESTED_VERSION)
  message(STATUS "UCX ${UCX_VERSION} is older than the tested ${GENIE_UCX_TESTED_VERSION}: "
                 "the data plane will warn at start")
endif()

if(GENIE_BUILD_NODE)
  # genie-node compares auth tokens in constant time (sodium_memcmp).
  pkg_check_modules(SODIUM REQUIRED IMPORTED_TARGET libsodium)
endif()

find_package(FlatBuffers REQUIRED CONFIG)
find_program(FLATC flatc REQUIRED)
find_package(spdlog REQUIRED CONFIG)
find_package(fmt REQUIRED CONFIG)
find_package(CLI11 REQUIRED CONFIG)
find_package(nlohmann_json REQUIRED CONFIG)
find_package(Threads REQUIRED)

if(GENIE_BUILD_TESTS)
  find_package(GTest REQUIRED CONFIG)
endif()
if(GENIE_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED CONFIG)
endif()

if(GENIE_WITH_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "GENIE_WITH_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER)")
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
endif()
