// remote_accelerator storages on the client: device address ranges the host never dereferences.
//
// Every storage gets a range of its own (non-canonical x86-64 addresses from 2^62, 512-byte
// aligned as CUDA's allocations, never reused), so `untyped_storage().data_ptr()` tells
// storages apart as on CUDA and a stray host read faults at once. Its bytes live on the node.
//
// A storage holds the node value of its bytes (its "storage value"), as a CUDA storage owns its
// memory: the entry of its address in a map (its DataPtr's deleter removes it) holds that value,
// counted as a tensor holding it, until the storage dies; the DataPtr's context is the address
// itself, as c10's copy-on-write wants of a "simple" DataPtr. So a tensor set onto it (`aten::set_.source_Storage`: storage reads,
// `storage.copy_`, `torch.tensor(storage)`, tensors rebuilt by torch.load, copy and deepcopy)
// views that value, also after every tensor on it died (`t.untyped_storage()` kept alone):
//  - a storage made for a new tensor (newDeviceStorage) holds that tensor's value, which spans it;
//  - a storage allocated from the host (the device allocator: allocateDeviceStorage:
//    `torch.UntypedStorage(n, device=...)`, `Storage.to(device)`, `torch.load(map_location=...)`)
//    is bound at first use to a new uint8 [nbytes] value (`torch.empty`, genie.lazy.storage_owner).
//
// All these DataPtrs are "simple" for c10's copy-on-write (`Tensor._lazy_clone`): a lazy clone
// wraps them, and a recorded write materializes the COW storage (materializeIfCow): the copy is
// a new address range (the device allocator's allocate; copy_data moves nothing: the node
// cloned the bytes).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>

#include <cstddef>
#include <cstdint>

#include "frontend/ir.h"
#include "frontend/shapes.h"

namespace genie::frontend {

class Recording;

/// The storage of a new tensor of `nbytes` holding `value` (geometry `desc`, spanning the storage)
/// on `recording`'s device: a device address range of its own, which holds `value` until it dies.
c10::Storage newDeviceStorage(size_t nbytes, const ValuePtr& value, const Desc& desc,
                              const c10::intrusive_ptr<Recording>& recording);

/// The device allocator's allocate(n): a new address range whose storage value is bound at
/// first use (bindStorageValue).
c10::DataPtr allocateDeviceStorage(size_t nbytes, c10::Device device);
/// The device allocator's copy_data(dest, src, n) (c10's Allocator::clone, which a COW
/// materialization calls), and a storage lazily cloned (`_lazy_clone`: `dest` is its address):
/// nothing moves on the host; the storage at `dest` is marked a copy, never bound to a fresh
/// value and holding none any more (its bytes are those of the tensors on it, and COW may hand
/// its address to another storage).
void noteDeviceStorageCopy(void* dest);
/// Whether `data_ptr` is simple for COW: one of these storages' own (not a COW wrapper).
bool isSimpleDeviceDataPtr(const c10::DataPtr& data_ptr);

/// A storage's value: the node value holding its bytes, with its geometry and device.
struct StorageValue {
  enum State { kNone, kUnbound, kBound } state = kNone;
  ValuePtr value;
  Desc desc;  // the value's geometry; uint8 [nbytes] for a storage allocated from the host
  c10::intrusive_ptr<Recording> recording;
  int64_t byte_offset = 0;  // where `storage` starts in the value's storage (a slice: storage[a:b])
};
/// The value of `storage`, or of the storage whose address range holds it (a slice); kUnbound
/// for a storage allocated from the host not used yet; kNone when no value is known (a COW
/// storage, a copy, a storage of another kind). Under the process lock.
StorageValue storageValue(const c10::Storage& storage);
/// Binds an unbound storage allocated from the host to `value` (uint8 [nbytes] on `recording`'s
/// device), held until the storage dies. RuntimeError if it is not unbound. Under the process lock.
void bindStorageValue(const c10::Storage& storage, const ValuePtr& value, const c10::intrusive_ptr<Recording>& recording);

/// Before a recorded op writes `storage`: a COW storage (`_lazy_clone`) gets its own address
/// range (or the shared one, when it is the last of its clones), as c10 materializes one.
void materializeIfCow(const c10::Storage& storage);

}  // namespace genie::frontend
