#include "tensor_store.h"

#include <fmt/format.h>

#include <sstream>
#include <string>
#include <vector>

namespace genie::node {
namespace {

std::string layoutName(c10::Layout layout) {
  std::ostringstream out;
  out << layout;
  return out.str();
}

}  // namespace

Status TensorStore::store(const wire::Handle& handle, at::Tensor tensor, wire::Residency residency, bool reserved,
                          const std::string* group) {
  if (tensor.defined() && tensor.layout() != c10::kStrided) {
    return wire::requestError(wire::ErrorCode::TorchError,
                              fmt::format("a {} tensor cannot be kept resident: the node keeps strided tensors "
                                          "(a sparse COO result travels as its parts, genie::sparse_parts)",
                                          layoutName(tensor.layout())));
  }
  if (tensors_.count(handle)) {
    return wire::requestError(wire::ErrorCode::DuplicateHandle,
                              fmt::format("handle {} is already in use", wire::toString(handle)));
  }
  const c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  StorageUse& use = storages_[storage];
  if (use.refs == 0) {
    use.bytes = tensor.storage().nbytes();
    use.residency = residency;
    if (!reserved) {
      if (auto error = memory_.reserve(session_, use.bytes, residency)) {
        storages_.erase(storage);
        return wire::requestError(wire::ErrorCode::OutOfMemory, std::move(*error));
      }
    }
  }
  ++use.refs;
  if (group != nullptr && !group->empty() && use.group.empty()) {
    use.group = *group;
    groups_[*group].resident += use.bytes;
  }
  tensors_.emplace(handle, Entry{std::move(tensor), residency});
  return Status::ok();
}

Status TensorStore::admit(const std::string& group, uint64_t bytes, std::string_view where) {
  if (groups_.count(group)) return Status::ok();
  if (auto error = memory_.wouldFit(session_, bytes)) {
    return wire::requestError(wire::ErrorCode::OutOfMemory,
                              fmt::format("{}: co-location group '{}' of {} bytes does not fit on this node ({}); "
                                          "nothing of it is stored",
                                          where, group, bytes, *error));
  }
  groups_[group].bytes = bytes;
  return Status::ok();
}

const std::string* TensorStore::groupOf(const wire::Handle& handle) const {
  auto it = tensors_.find(handle);
  if (it == tensors_.end()) return nullptr;
  auto use = storages_.find(it->second.tensor.storage().unsafeGetStorageImpl());
  return use == storages_.end() || use->second.group.empty() ? nullptr : &use->second.group;
}

std::vector<wire::StatsArgs::Colocated> TensorStore::colocation() const {
  std::vector<wire::StatsArgs::Colocated> out;
  for (const auto& [name, g] : groups_) out.push_back({name, g.bytes, g.resident});
  return out;
}

bool TensorStore::release(const wire::Handle& handle) {
  auto it = tensors_.find(handle);
  if (it == tensors_.end()) return false;
  const c10::StorageImpl* storage = it->second.tensor.storage().unsafeGetStorageImpl();
  auto use = storages_.find(storage);
  if (use != storages_.end() && --use->second.refs == 0) {
    memory_.release(session_, use->second.bytes, use->second.residency);
    if (!use->second.group.empty()) groups_[use->second.group].resident -= use->second.bytes;
    storages_.erase(use);
  }
  tensors_.erase(it);
  return true;
}

const at::Tensor* TensorStore::find(const wire::Handle& handle) const {
  auto it = tensors_.find(handle);
  return it == tensors_.end() ? nullptr : &it->second.tensor;
}

void TensorStore::clear() {
  std::vector<wire::Handle> handles;
  handles.reserve(tensors_.size());
  for (const auto& [handle, entry] : tensors_) handles.push_back(handle);
  for (const auto& handle : handles) release(handle);
}

}  // namespace genie::node
