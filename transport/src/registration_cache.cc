#include "genie/transport/registration_cache.h"

#include <ucp/api/ucp.h>

#include "ucx_util.h"

namespace genie::transport {

RegistrationCache::~RegistrationCache() {
  for (auto& [start, region] : regions_) ucp_mem_unmap(context_, region.memh);
}

Result<MemoryRegion> RegistrationCache::registerMemory(void* address, size_t size, MemoryType memory) {
  if (address == nullptr || size == 0) {
    return GENIE_ERROR(kInvalidArgument, "cannot register {} bytes at {}", size, address);
  }
  if (const MemoryRegion* found = find(address, size)) return *found;
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  params.address = address;
  params.length = size;
  params.memory_type = ucsMemoryType(memory);
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(context_, &params, &memh);
  if (st != UCS_OK) {
    return GENIE_UCX_STATUS(st, "registering {} bytes of {} memory at {}", size, memoryTypeName(memory), address);
  }
  ++registrations_;
  MemoryRegion region{address, size, memory, memh};
  regions_[reinterpret_cast<uintptr_t>(address)] = region;
  return region;
}

Status RegistrationCache::deregisterMemory(void* address) {
  auto it = regions_.find(reinterpret_cast<uintptr_t>(address));
  if (it == regions_.end()) return GENIE_ERROR(kNotFound, "no registered region starts at {}", address);
  ucs_status_t st = ucp_mem_unmap(context_, it->second.memh);
  regions_.erase(it);
  if (st != UCS_OK) return GENIE_UCX_STATUS(st, "deregistering memory at {}", address);
  return Status::ok();
}

const MemoryRegion* RegistrationCache::find(const void* address, size_t size) const {
  if (regions_.empty()) return nullptr;
  auto start = reinterpret_cast<uintptr_t>(address);
  auto it = regions_.upper_bound(start);  // first region starting after address
  if (it == regions_.begin()) return nullptr;
  --it;
  const MemoryRegion& region = it->second;
  if (start + size <= it->first + region.size) return &region;
  return nullptr;
}

Result<std::vector<std::byte>> RegistrationCache::packRkey(const MemoryRegion& region) const {
  void* packed = nullptr;
  size_t size = 0;
  ucs_status_t st = ucp_rkey_pack(context_, region.memh, &packed, &size);
  if (st != UCS_OK) return GENIE_UCX_STATUS(st, "packing the remote key of {}", region.address);
  auto* begin = static_cast<std::byte*>(packed);
  std::vector<std::byte> bytes(begin, begin + size);
  ucp_rkey_buffer_release(packed);
  return bytes;
}

}  // namespace genie::transport
