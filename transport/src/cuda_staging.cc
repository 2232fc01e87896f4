#include "cuda_staging.h"

#ifdef GENIE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace genie::transport {

#ifdef GENIE_WITH_CUDA

bool cudaStagingBuilt() { return true; }

Status copyDeviceToHost(void* host, const void* device, size_t bytes) {
  cudaError_t rc = cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost);
  if (rc != cudaSuccess) return GENIE_ERROR(kInternal, "staging {} bytes from the GPU: {}", bytes, cudaGetErrorString(rc));
  return Status::ok();
}

Status copyHostToDevice(void* device, const void* host, size_t bytes) {
  cudaError_t rc = cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice);
  if (rc != cudaSuccess) return GENIE_ERROR(kInternal, "staging {} bytes to the GPU: {}", bytes, cudaGetErrorString(rc));
  return Status::ok();
}

#else

bool cudaStagingBuilt() { return false; }

Status copyDeviceToHost(void*, const void*, size_t bytes) {
  return GENIE_ERROR(kUnsupported, "{} bytes of CUDA memory: this build has no CUDA (GENIE_WITH_CUDA=OFF)", bytes);
}

Status copyHostToDevice(void*, const void*, size_t bytes) {
  return GENIE_ERROR(kUnsupported, "{} bytes of CUDA memory: this build has no CUDA (GENIE_WITH_CUDA=OFF)", bytes);
}

#endif

}  // namespace genie::transport
