// Staging of CUDA memory through host memory, for a UCX that cannot touch CUDA memory
// itself (Debian's libucx). Compiled to real cudaMemcpy calls with GENIE_WITH_CUDA; without
// it every function returns kUnsupported. Each staged byte is counted
// (Worker::bytesStaged) and the first staging is logged as a warning.
#pragma once

#include <cstddef>

#include "genie/status.h"

namespace genie::transport {

/// True in builds with GENIE_WITH_CUDA.
bool cudaStagingBuilt();
/// cudaMemcpy device -> host of `bytes`. Errors: kUnsupported (no CUDA build), kInternal
/// with CUDA's message.
Status copyDeviceToHost(void* host, const void* device, size_t bytes);
/// cudaMemcpy host -> device of `bytes`. Errors as copyDeviceToHost.
Status copyHostToDevice(void* device, const void* host, size_t bytes);

}  // namespace genie::transport
