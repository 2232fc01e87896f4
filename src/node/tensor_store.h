// TensorStore: one session's resident tensors on genie-node.
//
// Maps a client's 128-bit handles to tensors. Each storage's bytes count once against the
// session's quota and the node's limit (memory_account.h), however many handles (views) hold
// it; the bytes are released when its last handle goes. Co-location groups (schemas/genie.fbs
// Colocation, the client scheduler's hints): a group is admitted whole (its declared bytes
// must fit when a request first names it), a storage joins the group of the first handle
// stored on it with one, and a storage in a group stays on this node (SendTensors refuses
// it). Not thread-safe: a session's thread
// owns its store (docs/node.md "Sessions").
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "genie/status.h"
#include "genie/wire/codec.h"
#include "memory_account.h"

namespace genie::node {

class TensorStore {
 public:
  /// A store whose bytes are reserved from `memory` for `session` (both outlive the store).
  TensorStore(NodeMemory& memory, SessionMemory& session) : memory_(memory), session_(session) {}
  /// Releases every tensor (and its bytes).
  ~TensorStore() { clear(); }
  TensorStore(const TensorStore&) = delete;
  TensorStore& operator=(const TensorStore&) = delete;

  /// Makes `tensor` resident under `handle`. Its storage's bytes (storage().nbytes()) are
  /// reserved unless another handle holds that storage already, or `reserved` is true (the
  /// caller reserved them, e.g. before receiving a payload). Errors (wire::requestError):
  /// DuplicateHandle (the handle is in use), OutOfMemory (the quota's or the node's limit,
  /// naming both figures).
  /// `group`: the co-location group the tensor joins (admitted before; nullptr or "": none).
  Status store(const wire::Handle& handle, at::Tensor tensor, wire::Residency residency, bool reserved = false,
               const std::string* group = nullptr);
  /// Admits co-location group `group` of `bytes` when it is new to this store: OutOfMemory
  /// (naming the group, `where` and the memory figures) unless `bytes` fit now; a group
  /// admitted before passes (its bytes stay those of its admission).
  Status admit(const std::string& group, uint64_t bytes, std::string_view where);
  /// The co-location group of `handle`'s storage, or nullptr (none, or unknown handle).
  const std::string* groupOf(const wire::Handle& handle) const;
  /// The groups: admitted bytes and resident bytes now.
  std::vector<wire::StatsArgs::Colocated> colocation() const;
  /// Forgets `handle`; its storage's bytes are released with its last handle. False if unknown.
  bool release(const wire::Handle& handle);
  /// The tensor under `handle`, or nullptr.
  const at::Tensor* find(const wire::Handle& handle) const;
  bool contains(const wire::Handle& handle) const { return tensors_.count(handle) != 0; }
  /// The residency class `handle` was stored with; EphemeralActivation if it is unknown.
  wire::Residency residencyOf(const wire::Handle& handle) const {
    auto it = tensors_.find(handle);
    return it == tensors_.end() ? wire::Residency::EphemeralActivation : it->second.residency;
  }
  /// Releases every tensor.
  void clear();
  /// Handles held.
  size_t size() const { return tensors_.size(); }
  /// Distinct storages held (what the bytes are counted by).
  size_t storages() const { return storages_.size(); }

 private:
  struct Entry {
    at::Tensor tensor;
    wire::Residency residency;
  };
  struct StorageUse {
    int refs = 0;
    uint64_t bytes = 0;
    wire::Residency residency;
    std::string group;  // "": none
  };
  struct Group {
    uint64_t bytes = 0;     // admitted with
    uint64_t resident = 0;  // its storages' bytes now
  };
  NodeMemory& memory_;
  SessionMemory& session_;
  std::unordered_map<wire::Handle, Entry, wire::HandleHash, wire::HandleEqual> tensors_;
  std::unordered_map<const c10::StorageImpl*, StorageUse> storages_;  // bytes counted once per storage
  std::map<std::string, Group> groups_;
};

}  // namespace genie::node
