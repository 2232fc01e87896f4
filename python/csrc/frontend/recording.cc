#include "frontend/recording.h"

#include <array>
#include <utility>

#include "frontend/cut.h"
#include "frontend/op_facts.h"

namespace genie::frontend {

Recording::Recording(int index)
    : device_index(index), rng_(c10::make_intrusive<Storage>()), graphs_(std::make_unique<GraphCache>()) {
  rng_->live.store(1);  // always live: its writers are never dropped as dead
}

Recording::~Recording() {
  // Nodes may be the only owners of values whose producer they are: clear the back pointers first.
  for (const NodePtr& node : pending_) {
    for (const ValuePtr& v : node->outputs) v->producer = nullptr;
  }
  if (runtime_ref != nullptr && Py_IsInitialized()) {
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_CLEAR(runtime_ref);
    PyGILState_Release(gil);
  }
}

void Recording::append(NodePtr node) {
  for (const StoragePtr& storage : node->writes) ++storage->writes;
  if (async_chunk > 0) {
    switch (node->facts.cache_role) {
      case OpFacts::CacheRole::kWriter: cache_write_open_ = true; break;
      case OpFacts::CacheRole::kAttention: cache_write_open_ = false; break;
      case OpFacts::CacheRole::kNone: break;
    }
  }
  if (logging) log.push_back(node);
  pending_.push_back(std::move(node));
}

bool Recording::dropLast(const Node* node) {
  if (pending_.empty() || pending_.back().get() != node) return false;
  for (const StoragePtr& storage : node->writes) --storage->writes;
  for (const ValuePtr& v : node->outputs) v->producer = nullptr;
  if (logging && !log.empty() && log.back().get() == node) log.pop_back();
  pending_.pop_back();
  return true;
}

bool Recording::wantsRun() const {
  const auto n = static_cast<int64_t>(pending_.size());
  if (n >= max_pending) return true;
  return async_chunk > 0 && connected && n >= async_chunk && (!cache_write_open_ || n >= async_chunk + cache_write_grace);
}

void Recording::noteDead(ValuePtr value) {
  std::lock_guard<std::mutex> lock(dead_mutex_);
  dead_.push_back(std::move(value));
}

void Recording::drainDead() {
  std::vector<ValuePtr> dead;
  {
    std::lock_guard<std::mutex> lock(dead_mutex_);
    dead.swap(dead_);
  }
  for (ValuePtr& v : dead) {
    v->storage->live.fetch_sub(1, std::memory_order_relaxed);
    released(std::move(v));
  }
}

void Recording::released(ValuePtr value) {
  if (value->tensors.fetch_sub(1, std::memory_order_relaxed) == 1 && value->handle) {
    releasing_.push_back(std::move(value));
  }
}

void Recording::noteResident(const ValuePtr& value) {
  if (value->handle) resident_[*value->handle] = value;
}

ValuePtr Recording::residentValue(const wire::Handle& handle) const {
  auto found = resident_.find(handle);
  return found == resident_.end() ? ValuePtr() : found->second;
}

std::vector<wire::Handle> Recording::takeFrees(const HandleSet& in_use) {
  std::vector<wire::Handle> frees;
  std::vector<ValuePtr> waiting;
  for (ValuePtr& v : releasing_) {
    if (!v->handle || v->tensors.load(std::memory_order_relaxed) > 0) continue;  // freed already, or held again
    if (in_use.count(*v->handle) != 0) {
      waiting.push_back(std::move(v));
      continue;
    }
    frees.push_back(*v->handle);
    resident_.erase(*v->handle);
    v->handle.reset();
  }
  releasing_ = std::move(waiting);
  return frees;
}

bool Recording::pendingWrites(const Storage* storage) const {
  for (const NodePtr& node : pending_) {
    for (const StoragePtr& w : node->writes) {
      if (w.get() == storage) return true;
    }
  }
  return false;
}

std::vector<wire::Handle> Recording::liveHandles() const {
  HandleSet live;
  for (const auto& [handle, v] : resident_) {
    if (v->tensors.load(std::memory_order_relaxed) > 0) live.insert(handle);
  }
  for (const NodePtr& node : pending_) {
    for (const Value* v : node->inputs()) {
      if (v->handle) live.insert(*v->handle);
    }
  }
  return {live.begin(), live.end()};
}

void Recording::discardPending(PyObject* error) {
  for (const NodePtr& node : pending_) {
    for (const ValuePtr& v : node->outputs) {
      v->producer = nullptr;
      if (error != nullptr) v->setError(error);
    }
  }
  pending_.clear();
}

std::vector<NodePtr> Recording::takePending() { return std::exchange(pending_, {}); }

void Recording::restorePending(std::vector<NodePtr> nodes) {
  nodes.insert(nodes.end(), std::make_move_iterator(pending_.begin()), std::make_move_iterator(pending_.end()));
  pending_ = std::move(nodes);
}

void Recording::markLost(PyObject* error) {
  for (const auto& [handle, v] : resident_) {
    if (v->tensors.load(std::memory_order_relaxed) > 0) v->setError(error);
  }
  for (const NodePtr& node : pending_) {
    for (const ValuePtr& v : node->outputs) {
      v->setError(error);
      v->producer = nullptr;
    }
  }
  pending_.clear();
  {
    std::lock_guard<std::mutex> lock(dead_mutex_);
    dead_.clear();
  }
  releasing_.clear();
  resident_.clear();
  cache_write_open_ = false;
}

namespace {

constexpr int kMaxDevices = 64;
std::array<RecordingPtr, kMaxDevices>& registry() {
  static auto* r = new std::array<RecordingPtr, kMaxDevices>();
  return *r;
}

}  // namespace

Recording* recordingFor(int index) {
  if (index < 0 || index >= kMaxDevices) return nullptr;
  return registry()[static_cast<size_t>(index)].get();
}

void setRecording(int index, RecordingPtr recording) {
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "remote_accelerator:", index, ": at most ", kMaxDevices,
              " devices");
  registry()[static_cast<size_t>(index)] = std::move(recording);
}

}  // namespace genie::frontend
