# Finds the torch of the project's virtual environment (DESIGN.md "One torch"): CMake's
# find_package(Torch) through torch.utils.cmake_prefix_path of GENIE_PYTHON (GenieDependencies).
execute_process(
  COMMAND "${GENIE_PYTHON}" -c "import torch, torch.utils; print(torch.utils.cmake_prefix_path, end='')"
  OUTPUT_VARIABLE GENIE_TORCH_PREFIX
  RESULT_VARIABLE GENIE_TORCH_FOUND
  ERROR_QUIET)
if(NOT GENIE_TORCH_FOUND EQUAL 0)
  message(FATAL_ERROR "GENIE_BUILD_NODE / GENIE_BUILD_PYTHON need torch in ${GENIE_PYTHON}: run tools/setup.sh, "
                      "or pass -DGENIE_PYTHON=/path/to/python, or -DGENIE_BUILD_NODE=OFF; "
                      "pip builds: pip install --no-build-isolation (the extension must match the installed torch)")
endif()
list(APPEND CMAKE_PREFIX_PATH "${GENIE_TORCH_PREFIX}")
# The PyPI wheel is a CUDA build, and its CMake config probes the GPUs to choose nvcc
# architectures unless told: Genie compiles no torch CUDA kernels, so name Hopper and skip it.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
endif()
find_package(Torch REQUIRED CONFIG)
message(STATUS "torch from ${GENIE_TORCH_PREFIX}")

# genie::torch: what a target that includes torch headers links.
#  - libtorch.so pulls libtorch_cuda.so, whose NCCL/cuDNN/... come from the wheel's nvidia/
#    packages (found at run time through its own RPATH); the linker needs them too.
#  - torch ships fmt 12 headers that shadow the system's fmt 9: torch-side code uses them
#    header-only (its symbols live in fmt::v12, apart from the system library's fmt::v9),
#    and must not include spdlog, which is compiled against the system fmt.
get_filename_component(GENIE_SITE_PACKAGES "${GENIE_TORCH_PREFIX}/../../.." ABSOLUTE)
file(GLOB GENIE_NVIDIA_LIB_DIRS LIST_DIRECTORIES true "${GENIE_SITE_PACKAGES}/nvidia/*/lib")
add_library(genie_torch INTERFACE)
add_library(genie::torch ALIAS genie_torch)
target_include_directories(genie_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
target_link_libraries(genie_torch INTERFACE ${TORCH_LIBRARIES})
target_compile_options(genie_torch INTERFACE ${TORCH_CXX_FLAGS})
target_compile_definitions(genie_torch INTERFACE FMT_HEADER_ONLY)
foreach(dir IN LISTS GENIE_NVIDIA_LIB_DIRS)
  target_link_options(genie_torch INTERFACE "LINKER:-rpath-link,${dir}")
endforeach()
