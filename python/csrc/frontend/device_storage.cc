#include "frontend/device_storage.h"

#include <c10/core/impl/COW.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

#include "frontend/recording.h"

namespace genie::frontend {
namespace {

/// The next free device address (device_storage.h).
std::atomic<uint64_t> g_next_device_address{uint64_t{1} << 62};

void* reserveAddressRange(size_t nbytes) {
  const uint64_t span = (std::max<uint64_t>(nbytes, 1) + 511) & ~uint64_t{511};
  return reinterpret_cast<void*>(g_next_device_address.fetch_add(span, std::memory_order_relaxed));
}

/// What a storage holds (device_storage.h), found by its address: its DataPtr's context is its
/// address, as c10's copy-on-write wants of a "simple" DataPtr (COW.cpp materializes the last
/// reference as DataPtr(context, data, ...) and checks that the two are one).
struct HeldStorage {
  uintptr_t address;
  size_t nbytes;
  bool copy = false;  // filled by a COW materialization: never bound to a fresh value
  ValuePtr value;     // once bound
  Desc desc;
  c10::intrusive_ptr<Recording> recording;
};

/// Held storages by address: every storage's, and for slices and noteDeviceStorageCopy. Guarded
/// by g_held_mutex: a storage may die on any thread. Addresses only grow, so a new one goes at
/// the end.
std::mutex g_held_mutex;
std::map<uintptr_t, HeldStorage*> g_held;

void deleteHeldStorage(void* address) {
  HeldStorage* held = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_held_mutex);
    auto found = g_held.find(reinterpret_cast<uintptr_t>(address));
    if (found == g_held.end()) return;
    held = found->second;
    g_held.erase(found);
  }
  if (held->value) held->recording->noteDead(std::move(held->value));  // counted down at the next request
  delete held;
}

/// The HeldStorage of one of these DataPtrs, or nullptr. It lives while the storage does.
HeldStorage* heldOf(const c10::DataPtr& data_ptr) {
  if (data_ptr.get_deleter() != &deleteHeldStorage) return nullptr;
  std::lock_guard<std::mutex> lock(g_held_mutex);
  auto found = g_held.find(reinterpret_cast<uintptr_t>(data_ptr.get_context()));
  return found == g_held.end() ? nullptr : found->second;
}

/// A new address range of `nbytes` and its context.
HeldStorage* newHeld(size_t nbytes) {
  auto* held = new HeldStorage{0, nbytes};
  std::lock_guard<std::mutex> lock(g_held_mutex);  // addresses in the map's order
  held->address = reinterpret_cast<uintptr_t>(reserveAddressRange(nbytes));
  g_held.emplace_hint(g_held.end(), held->address, held);
  return held;
}

/// Counted as a LazyTensor holding it (Recording::noteDead undoes it).
void hold(HeldStorage& held, const ValuePtr& value, const Desc& desc, const c10::intrusive_ptr<Recording>& recording) {
  value->tensors.fetch_add(1, std::memory_order_relaxed);
  value->storage->live.fetch_add(1, std::memory_order_relaxed);
  held.value = value;
  held.desc = desc;
  held.recording = recording;
}

}  // namespace

c10::Storage newDeviceStorage(size_t nbytes, const ValuePtr& value, const Desc& desc,
                              const c10::intrusive_ptr<Recording>& recording) {
  HeldStorage* held = newHeld(nbytes);
  hold(*held, value, desc, recording);
  auto* address = reinterpret_cast<void*>(held->address);
  return c10::Storage(c10::Storage::use_byte_size_t{}, nbytes,
                      at::DataPtr(address, address, &deleteHeldStorage, recording->device()),
                      c10::GetAllocator(c10::DeviceType::PrivateUse1), /*resizable=*/true);
}

c10::DataPtr allocateDeviceStorage(size_t nbytes, c10::Device device) {
  auto* address = reinterpret_cast<void*>(newHeld(nbytes)->address);
  return c10::DataPtr(address, address, &deleteHeldStorage, device);
}

void noteDeviceStorageCopy(void* dest) {
  std::lock_guard<std::mutex> lock(g_held_mutex);
  auto found = g_held.find(reinterpret_cast<uintptr_t>(dest));
  if (found != g_held.end()) found->second->copy = true;
}

bool isSimpleDeviceDataPtr(const c10::DataPtr& data_ptr) {
  return data_ptr.get_deleter() == &deleteHeldStorage && data_ptr.get() == data_ptr.get_context();
}

StorageValue storageValue(const c10::Storage& storage) {
  StorageValue out;
  if (!storage) return out;
  if (c10::impl::cow::is_cow_data_ptr(storage.data_ptr())) return out;  // its bytes are no value's yet
  const HeldStorage* held = heldOf(storage.data_ptr());
  if (held == nullptr) {  // a slice (storage[a:b]) of a held storage?
    const auto address = reinterpret_cast<uintptr_t>(storage.data_ptr().get());
    std::lock_guard<std::mutex> lock(g_held_mutex);
    auto found = g_held.upper_bound(address);
    if (found == g_held.begin()) return out;
    --found;
    if (address + storage.nbytes() > found->first + found->second->nbytes) return out;
    held = found->second;
    out.byte_offset = static_cast<int64_t>(address - found->first);
  }
  if (held->copy) return out;
  if (!held->value) {
    out.state = out.byte_offset == 0 ? StorageValue::kUnbound : StorageValue::kNone;
    return out;
  }
  out.state = StorageValue::kBound;
  out.value = held->value;
  out.desc = held->desc;
  out.recording = held->recording;
  return out;
}

void bindStorageValue(const c10::Storage& storage, const ValuePtr& value, const c10::intrusive_ptr<Recording>& recording) {
  HeldStorage* held = storage ? heldOf(storage.data_ptr()) : nullptr;
  TORCH_CHECK(held != nullptr && !held->copy && !held->value,
              "bind_storage_value: not an unbound storage allocated from the host on remote_accelerator");
  Desc desc;
  desc.sizes = {static_cast<int64_t>(held->nbytes)};
  desc.strides = {1};
  desc.dtype = at::kByte;
  desc.contiguous = true;
  hold(*held, value, desc, recording);
}

void materializeIfCow(const c10::Storage& storage) {
  if (storage && c10::impl::cow::is_cow_data_ptr(storage.data_ptr())) {
    storage.unsafeGetStorageImpl()->mutable_data_ptr();  // c10 materializes: Allocator::clone, copy_data
  }
}

}  // namespace genie::frontend
