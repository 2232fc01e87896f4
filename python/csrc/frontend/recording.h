// Recording: one remote device's pending graph and the books of its values.
//
// Capture appends each recorded Node (append: the graph's only way in, in program order). The
// runtime layer (genie.runtime, Python) decides when the pending graph runs and talks to the
// node; the mechanics are here, in C++, under the process lock:
//  - tensors: a device tensor's LazyState (lazy_tensor.h) and a storage's held value
//    (device_storage.h) count themselves on their value; their deaths are queued (noteDead, any
//    thread, no lock but the queue's) and counted down at the next request (drainDead); a
//    resident value no tensor holds any more is released, and its handle freed with the next
//    request that does not read it (takeFrees);
//  - the cut (cut.h): which pending nodes a read needs, taken out of the pending graph,
//    lowered to a wire graph and run; its kept outputs become resident (commit);
//  - loss: a failed run or a lost node marks the values it concerns lost (their use raises
//    the error), and everything else stays usable.
//
// Device index -> Recording: the registry below, filled by genie.runtime when it makes a
// device's runtime, read by the recorder's kernel without Python.
#pragma once

#include <Python.h>

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "frontend/ir.h"
#include "genie/wire/codec.h"

namespace genie::frontend {

class GraphCache;

using HandleSet = std::unordered_set<wire::Handle, wire::HandleHash, wire::HandleEqual>;

class Recording final : public c10::intrusive_ptr_target {
 public:
  explicit Recording(int device_index);
  ~Recording() override;

  const int device_index;
  c10::Device device() const { return {c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device_index)}; }

  // ---- capture (under the process lock) ----

  /// Appends `node` to the pending graph: the storages it writes are marked written.
  void append(NodePtr node);
  const std::vector<NodePtr>& pending() const { return pending_; }
  /// Removes the last pending node if it is `node` (an `empty` a host copy replaces). True if so.
  bool dropLast(const Node* node);
  /// The device's random generator, as a storage: seeded ops and the generator ops write it,
  /// so none of them is dropped as dead and they run in program order.
  const StoragePtr& rng() const { return rng_; }
  /// True when the pending graph should run now: past max_pending nodes, or (asynchronous runs
  /// on, connected) past async_chunk nodes, unless a KV-cache write waits for the attention that
  /// reads it (at most cache_write_grace more nodes).
  bool wantsRun() const;

  // Settings the runtime layer keeps up to date.
  int64_t async_chunk = 0;
  int64_t max_pending = 20000;
  int64_t cache_write_grace = 64;
  bool connected = false;
  /// The co-location group (schemas/genie.fbs Colocation) of what the scheduler placed on this
  /// device: its KV caches carry it in their output specs (genie.placed sets it; "": none).
  std::string colocation_group;
  uint64_t colocation_bytes = 0;
  /// The node runs the CPU's kernels (its Welcome names device "cpu"): the CPU probe's answers
  /// are then the node's own, "not implemented for" and nondeterminism alerts included
  /// (eager_checks.h). Set by genie.connection at connect; read without the lock.
  std::atomic<bool> cpu_kernels{false};
  /// genie.capture: while set, every appended node is also kept here.
  bool logging = false;
  std::vector<NodePtr> log;

  // ---- tensors ----

  /// `value`'s tensor or storage died (LazyState's destructor, device_storage.h): queued. Any
  /// thread; no lock needed.
  void noteDead(ValuePtr value);
  /// Device tensors of this device alive now (their LazyStates; any thread).
  std::atomic<int64_t> live_tensors{0};
  /// Counts the queued deaths down (under the process lock).
  void drainDead();
  /// A tensor stopped holding `value` (an in-place op rebound it): counted down; a resident
  /// value nobody holds is freed with a later request.
  void released(ValuePtr value);
  /// `value` became resident (an upload, a kept output): known by its handle from now on.
  void noteResident(const ValuePtr& value);
  /// The resident value of `handle`, or nullptr (freed, or never known).
  ValuePtr residentValue(const wire::Handle& handle) const;
  /// Handles of released values that no op about to run reads (`in_use`): they are forgotten
  /// and returned, to be freed on the node. The rest wait.
  std::vector<wire::Handle> takeFrees(const HandleSet& in_use);
  bool hasReleased() const { return !releasing_.empty(); }
  /// True when a pending node writes `storage`.
  bool pendingWrites(const Storage* storage) const;
  /// Handles the program can still use: held by live tensors or read by pending ops.
  std::vector<wire::Handle> liveHandles() const;

  // ---- runs (cut.h) ----

  /// Drops the pending graph: its values are lost with `error` (GIL held), or, with nullptr,
  /// simply gone (a capture-only benchmark).
  void discardPending(PyObject* error);
  /// Takes the pending graph out (the cut runs its live part); `restore` puts it back.
  std::vector<NodePtr> takePending();
  void restorePending(std::vector<NodePtr> nodes);
  /// Registered graphs by structure (per connection).
  GraphCache& graphs() { return *graphs_; }

  // ---- loss ----

  /// The node is gone: every live value and every pending output is lost with `error`; the
  /// pending graph, the queues and the resident values are forgotten. With the GIL held.
  void markLost(PyObject* error);

  /// The genie.runtime.Runtime of this device, as a weak reference (GIL): set by the runtime.
  PyObject* runtime_ref = nullptr;

 private:
  std::vector<NodePtr> pending_;
  std::mutex dead_mutex_;
  std::vector<ValuePtr> dead_;
  std::vector<ValuePtr> releasing_;
  std::unordered_map<wire::Handle, ValuePtr, wire::HandleHash, wire::HandleEqual> resident_;
  StoragePtr rng_;
  bool cache_write_open_ = false;
  std::unique_ptr<GraphCache> graphs_;
};

using RecordingPtr = c10::intrusive_ptr<Recording>;

/// The recording of remote_accelerator:`index`, or nullptr before its runtime exists.
Recording* recordingFor(int index);
/// Registers (or, with nullptr, removes) the recording of device `index`.
void setRecording(int index, RecordingPtr recording);

}  // namespace genie::frontend
