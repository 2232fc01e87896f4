// Basic vocabulary of the Genie data plane (transport/): memory types, payloads, callbacks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

#include "genie/status.h"

namespace genie::transport {

/// Where a buffer lives. kCuda needs a build with GENIE_WITH_CUDA and a UCX with CUDA
/// support (e.g. PyPI's libucx-cu13); otherwise it is staged through host memory or refused.
enum class MemoryType : uint8_t { kHost = 0, kCuda = 1 };

std::string_view memoryTypeName(MemoryType type);

/// A contiguous buffer owned by the caller. It must stay valid (and, for receives,
/// untouched) until the operation's callback has run.
struct Buffer {
  void* data = nullptr;
  size_t size = 0;  // bytes
  MemoryType memory = MemoryType::kHost;
};

struct ConstBuffer {
  const void* data = nullptr;
  size_t size = 0;  // bytes
  MemoryType memory = MemoryType::kHost;
};

/// Completion callback of an asynchronous operation. Runs exactly once, on the worker's
/// progress thread (see docs/thread_model.md), with OK or the error that ended the operation
/// (e.g. kPeerUnreachable naming the peer when the endpoint failed, kCancelled on close).
using Callback = std::function<void(Status)>;

}  // namespace genie::transport
