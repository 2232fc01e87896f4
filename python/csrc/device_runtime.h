// DeviceRuntime: one remote device's runtime, in C++: its pending graph (a Recording), the
// client of its node's session, and the asynchronous runs in flight. A read is one call:
// fetch() (the recorder's kernel calls it for `.cpu()`, `.item()`, `.tolist()` without
// Python) or materialize() (genie.runtime's binding):
//   drain the dead tensors -> the cut (frontend/cut.h: liveness, lowering, scalar lifting, the
//   request) -> register the graph if its structure is new -> RunGraph, waiting without the
//   GIL -> commit (kept values resident) -> report failed asynchronous runs.
// An upload is one call too, the one path from host memory to the node: upload() (the kernel
// calls it for `.to(device)`) and put() (one PutTensors; tied weights once per host bytes).
// Python (genie.runtime.Runtime, "the policy") keeps what is decided rather than computed, and
// is called only off the fast path: connecting (no client attached), a structure's first cut
// when residency analysis is on (genie.semantics), a cut observer, the lineage of
// keep_host_copy, and a lost connection (recover or mark everything lost). Flags say which of
// these the policy wants, so that a read of a registered graph makes no call into Python.
//
// Errors: a failed request raises the genie.errors exception of its status (wire_tensors.h
// errorOf) as torch's python_error, so it propagates as itself through the dispatcher and
// through genie._C's bindings. A failed run marks what it lost (frontend/cut.h fail); a failed
// asynchronous run poisons the runs sent after it, as a CUDA error the work queued behind it.
//
// Threads: every method is called with the process lock held (frontend/lock.h), with or without
// the GIL; the GIL is released while a request waits and taken only to raise an error or to
// call the policy.
#pragma once

#include <pybind11/pybind11.h>

#include <ATen/core/Tensor.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/StorageImpl.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "frontend/cut.h"
#include "frontend/recording.h"
#include "genie/client/client.h"

namespace genie::python {

namespace py = pybind11;

/// Process-wide counts of the runtime's crossings (genie._C.runtime_counters; tests count them
/// per read).
struct RuntimeCounters {
  int64_t policy_calls = 0;      // calls from C++ into Python policy (genie.runtime.Runtime)
  int64_t gil_acquisitions = 0;  // times the runtime and the recorder's kernel took the GIL
  int64_t wait_ns = 0;           // time spent waiting for the node's replies (ns)
  int64_t requests = 0;          // requests that waited for a reply
  int64_t cut_ns = 0;            // in the cut's passes (frontend/cut.h takeCut), ns
  int64_t materialize_ns = 0;    // in materialize(), waits included, ns
};
RuntimeCounters runtimeCounters();
/// Counts one GIL acquisition (the recorder's kernel's own, dispatch_kernel.cc).
void countGilAcquisition();

class DeviceRuntime {
 public:
  /// The runtime of `recording`'s device; its policy is the recording's genie.runtime.Runtime
  /// (Recording::runtime_ref, a weak reference).
  explicit DeviceRuntime(frontend::RecordingPtr recording);
  ~DeviceRuntime();
  DeviceRuntime(const DeviceRuntime&) = delete;
  DeviceRuntime& operator=(const DeviceRuntime&) = delete;

  frontend::Recording& recording() const { return *recording_; }

  /// The session's client (genie.runtime.Runtime.connection attaches it); detach() at a lost
  /// connection or close, which also forgets the runs in flight.
  void attach(std::shared_ptr<client::Client> client);
  void detach();
  bool attached() const { return client_ != nullptr; }

  // What the policy wants to see (see the top of this file); kept up to date by genie.runtime.
  bool analyse_residency = false;  // a structure's first cut goes to policy._cut_taken
  bool observe = false;            // every cut goes to policy._cut_taken
  bool lineage = false;            // graphs and runs go to policy._graph_registered / _ran
  /// The recorder's kernel hands reads and uploads to genie.transfers (progress bars).
  bool transfers_in_python = false;
  int64_t max_in_flight = 32;      // asynchronous runs outstanding before the program waits

  /// One request: runs the live pending graph. Returns the host tensors of `returned` and the
  /// descriptors of `described` (kept resident), in their orders. Raises (python_error) a lost
  /// input's error, the node's error (what the run would have made is lost), a connection error.
  struct Results {
    std::vector<at::Tensor> returned;
    std::vector<wire::TensorDescArgs> described;
  };
  Results materialize(const std::vector<frontend::ValuePtr>& returned,
                      const std::vector<frontend::ValuePtr>& described);
  /// Sends the live pending graph as an asynchronous run (no round trip); its error, and any
  /// error preparing it, is raised at the next request that waits.
  void materializeAsync();
  /// The recorder's turn: the pending graph passed max_pending (runs now) or async_chunk nodes
  /// (an asynchronous run).
  void runPending();
  /// `tensor`'s values on the host, in one request at most: host evaluation's answer (after
  /// reading the small resident values it needs whole, once), the resident value's bytes
  /// (GetTensors), or materialize(). nullopt when Python must read it (a lost value: its error;
  /// quantized; lineage on).
  std::optional<at::Tensor> fetch(const at::Tensor& tensor);
  // ---- uploads: the one path from host memory to the node ----

  /// `host` (a CPU strided tensor with a wire dtype) as a new tensor on this device, as
  /// `.to(device)` makes it: converted on the host first when `dtype` or `format` asks; an
  /// activation up to kInlineUploadBytes travels inline with the next run (a snapshot, recorded
  /// as aten::alias), anything else is put on the node now (put). `source`: the program's tensor
  /// whose bytes `host` holds (tied weights are put once), or undefined. nullopt for a quantized
  /// tensor (its integer representation travels: genie.transfers) or one not strided on the CPU.
  std::optional<at::Tensor> upload(const at::Tensor& host, uint8_t residency, const at::Tensor& source,
                                   std::optional<at::ScalarType> dtype = std::nullopt,
                                   std::optional<at::MemoryFormat> format = std::nullopt);
  /// Puts `data` on the node now (one PutTensors) and returns its resident value, on `storage`
  /// (nullptr: a new one). A weight carries the recording's co-location group. With `source`
  /// defined, a weight whose host bytes were put before (`source`'s storage, offset, sizes,
  /// strides, dtype and version, while that storage lives) gets the value already resident.
  /// Raises (python_error) the node's error or a connection error.
  frontend::ValuePtr put(const at::Tensor& data, uint8_t residency, frontend::StoragePtr storage,
                         const at::Tensor& source = at::Tensor());

  /// True while asynchronous runs are in flight or an asynchronous error waits to be raised.
  bool busy() const { return !in_flight_.empty() || deferred_ != nullptr; }
  /// Waits for the runs in flight and returns the first failure (or the deferred error) as a
  /// new reference, nullptr if none; the values the failed run and every later run would have
  /// kept, and `sent_after`, are lost with it. GIL held.
  PyObject* reapAsync(const std::vector<frontend::ValuePtr>& sent_after);
  /// Forgets the runs in flight and the deferred error (a lost node, a fork). GIL held.
  void forgetInFlight();
  /// The request ids of the asynchronous runs in flight, in send order.
  std::vector<uint64_t> inFlight() const;
  /// The asynchronous error waiting to be raised at the next wait, or nullptr (borrowed).
  PyObject* deferred() const { return deferred_; }

  /// The runtime of `recording`, or nullptr (its session was shut down, or none was made).
  static DeviceRuntime* of(const frontend::Recording* recording);

 private:
  frontend::Cut prepare(const std::vector<frontend::ValuePtr>& returned,
                        const std::vector<frontend::ValuePtr>& described);
  client::Client& connection();
  /// Calls policy.<name>(*args) with the GIL; raises its exception as python_error.
  py::object callPolicy(const char* name, py::args args);
  /// A failed request's status as its exception, after recovery was tried when the connection
  /// was lost: true when the policy recovered (send again).
  bool recovered(const Status& status, int attempt, py::object& error);
  [[noreturn]] void failCut(frontend::Cut& cut, const Status& status, py::object error);
  void registerGraph(frontend::Cut& cut);
  /// GetTensors of `handles`, with the recovery loop; raises as materialize().
  std::vector<at::Tensor> get(const std::vector<wire::Handle>& handles);
  void reapAfterWait(const std::vector<frontend::ValuePtr>& sent_after);

  frontend::RecordingPtr recording_;
  std::shared_ptr<client::Client> client_;
  std::map<uint64_t, std::vector<frontend::ValuePtr>> in_flight_;  // request id -> values it keeps
  /// Weights put from host bytes: (storage address, offset, sizes, strides, dtype, version) ->
  /// (the host storage, weakly; the handle).
  struct PutWeight {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    wire::Handle handle;
  };
  std::map<std::vector<int64_t>, PutWeight> weights_;
  PyObject* deferred_ = nullptr;  // an asynchronous error raised at the next wait (strong ref)
};

}  // namespace genie::python
