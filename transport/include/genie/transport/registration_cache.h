// RegistrationCache: memory registered with UCX once, found again by address.
//
// Registration (ucp_mem_map) is slow on RDMA fabrics, so Genie registers long-lived
// buffers (tensor storage, bench buffers) once and never on the hot path: sends and RMA
// look their memory handle up here. A lookup finds the region that contains
// [address, address + size). Progress thread only (or through Worker::post).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "genie/status.h"
#include "genie/transport/types.h"

typedef struct ucp_context* ucp_context_h;
typedef struct ucp_mem* ucp_mem_h;

namespace genie::transport {

struct MemoryRegion {
  void* address = nullptr;
  size_t size = 0;  // bytes
  MemoryType memory = MemoryType::kHost;
  ucp_mem_h memh = nullptr;
};

class RegistrationCache {
 public:
  explicit RegistrationCache(ucp_context_h context) : context_(context) {}
  ~RegistrationCache();
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;

  /// Registers [address, +size) unless a registered region already contains it.
  /// Errors: kInvalidArgument (null/empty), kOutOfMemory or kInternal from UCX.
  Result<MemoryRegion> registerMemory(void* address, size_t size, MemoryType memory);
  /// Removes the region that starts at `address`. Errors: kNotFound.
  Status deregisterMemory(void* address);
  /// The region containing [address, +size), or nullptr. O(log n).
  const MemoryRegion* find(const void* address, size_t size) const;
  /// Packs the remote key of a registered region for a peer (RemoteBuffer.rkey).
  Result<std::vector<std::byte>> packRkey(const MemoryRegion& region) const;

  size_t regionCount() const { return regions_.size(); }
  uint64_t registrations() const { return registrations_; }  // ucp_mem_map calls so far

 private:
  ucp_context_h context_;
  std::map<uintptr_t, MemoryRegion> regions_;  // by start address
  uint64_t registrations_ = 0;
};

}  // namespace genie::transport
