# Finds Genie's dependencies; nothing is vendored.
#
# UCX comes from pkg-config `ucx`: Debian's libucx-dev by default. To use another build
# (e.g. PyPI's CUDA-aware libucx-cu13), point GENIE_UCX_PKG_CONFIG_PATH (or PKG_CONFIG_PATH)
# at the folder that holds its ucx.pc.
find_package(PkgConfig REQUIRED)
set(GENIE_UCX_PKG_CONFIG_PATH "" CACHE PATH "Extra folder searched for ucx.pc (e.g. libucx-cu13's)")
if(GENIE_UCX_PKG_CONFIG_PATH)
  set(ENV{PKG_CONFIG_PATH} "${GENIE_UCX_PKG_CONFIG_PATH}:$ENV{PKG_CONFIG_PATH}")
  # Wheels (libucx-cu13) ship .pc files whose prefix is their build machine's: derive the
  # prefix from where the .pc file is instead.
  set(PKG_CONFIG_ARGN --define-prefix)
endif()
pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)
message(STATUS "UCX ${UCX_VERSION} from ${UCX_PREFIX} (libs: ${UCX_LINK_LIBRARIES})")

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
