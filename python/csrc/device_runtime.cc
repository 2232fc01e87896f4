// The device runtime (device_runtime.h): reads, runs, asynchronous runs and their failures,
// uploads.
//
// Over 600 lines: the methods of one class, DeviceRuntime; reads, runs and uploads share its
// client, its runs in flight and one recovery loop per request, which splitting would scatter.
#include "device_runtime.h"

#include <torch/csrc/Exceptions.h>

#include <chrono>
#include <mutex>
#include <unordered_map>

#include <torch/csrc/autograd/python_variable.h>

#include "bindings.h"
#include "frontend/host_eval.h"
#include "frontend/lock.h"
#include "frontend/op_facts.h"
#include "frontend/recorder.h"
#include "frontend/shapes.h"
#include "frontend/lazy_tensor.h"
#include "wire_tensors.h"

namespace genie::python {

using frontend::Cut;
using frontend::LoweredInput;
using frontend::ValuePtr;

namespace {

std::atomic<int64_t> g_policy_calls{0};
std::atomic<int64_t> g_gil{0};
std::atomic<int64_t> g_wait_ns{0};
std::atomic<int64_t> g_requests{0};
std::atomic<int64_t> g_cut_ns{0};
std::atomic<int64_t> g_materialize_ns{0};

/// Adds the time of its scope to `total` (ns).
class Timed {
 public:
  explicit Timed(std::atomic<int64_t>& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~Timed() {
    total_.fetch_add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count(),
        std::memory_order_relaxed);
  }

 private:
  std::atomic<int64_t>& total_;
  std::chrono::steady_clock::time_point start_;
};

/// Holds the GIL for its lifetime, taking it only when this thread does not hold it already.
class Gil {
 public:
  Gil() : taken_(!PyGILState_Check()) {
    if (taken_) {
      state_ = PyGILState_Ensure();
      countGilAcquisition();
    }
  }
  ~Gil() {
    if (taken_) PyGILState_Release(state_);
  }
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;

 private:
  bool taken_;
  PyGILState_STATE state_{};
};

/// Releases the GIL for its lifetime when this thread holds it (a request's wait), and counts
/// the wait.
class Waiting {
 public:
  Waiting() : saved_(PyGILState_Check() ? PyEval_SaveThread() : nullptr), start_(std::chrono::steady_clock::now()) {}
  ~Waiting() {
    g_wait_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_)
                            .count(),
                        std::memory_order_relaxed);
    g_requests.fetch_add(1, std::memory_order_relaxed);
    if (saved_ != nullptr) {
      PyEval_RestoreThread(saved_);
      countGilAcquisition();
    }
  }
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;

 private:
  PyThreadState* saved_;
  std::chrono::steady_clock::time_point start_;
};

/// Raises `error` (a Python exception object) as torch's python_error. GIL held.
[[noreturn]] void raise(py::handle error) {
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  python_error e;
  e.persist();
  throw e;
}

/// Raises the pending Python exception as torch's python_error. GIL held.
[[noreturn]] void raisePending() {
  python_error e;
  e.persist();
  throw e;
}

bool isConnectionLoss(const Status& status) {
  return status.code() == StatusCode::kPeerUnreachable || status.code() == StatusCode::kTimeout;
}

int64_t opIndexOf(const Status& status) {
  const RemoteDetail* remote = status.remote();
  return remote != nullptr ? remote->op_index : -1;
}

/// A RunGraph's arguments from a prepared cut: the one builder of a recorded run's request.
RunRequest requestOf(const Cut& cut) {
  RunRequest out;
  wire::RunGraphArgs& run = out.run;
  run.graph_id = *cut.prepared.graph_id;
  for (size_t i = 0; i < cut.lowered.inputs.size(); ++i) {
    const LoweredInput& input = cut.lowered.inputs[i];
    if (input.kind == LoweredInput::kWeight) continue;  // bound in the graph
    wire::InputBindingArgs binding;
    binding.input = static_cast<uint32_t>(i);
    if (input.kind == LoweredInput::kHandle) {
      binding.handle = *input.value->handle;
    } else {
      binding.inline_tensor = out.addInline(outgoingOf(input.tensor, "inline input " + std::to_string(i)));
    }
    run.inputs.push_back(std::move(binding));
  }
  for (const auto& [slot, number] : cut.prepared.scalars) {
    wire::ScalarBindingArgs scalar;
    scalar.slot = slot;
    if (number.is_float) {
      scalar.value = number.d;
    } else {
      scalar.value = number.i;
    }
    run.scalars.push_back(scalar);
  }
  for (const auto& row : cut.specs) {
    wire::OutputSpecArgs spec;
    spec.value = row.value_id;
    spec.action = static_cast<wire::OutputAction>(row.action);
    if (row.handle) spec.handle = *row.handle;
    spec.residency = static_cast<wire::Residency>(row.residency);
    if (!cut.colocation_group.empty() && spec.residency == wire::Residency::StatefulKvCache) {
      spec.colocation = wire::ColocationArgs{cut.colocation_group, cut.colocation_bytes};
    }
    run.outputs.push_back(spec);
  }
  run.free = cut.frees;
  return out;
}

py::object wrap(at::Tensor t) { return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t))); }

std::mutex g_registry_mutex;
std::unordered_map<const frontend::Recording*, DeviceRuntime*> g_registry;

}  // namespace

RuntimeCounters runtimeCounters() {
  return {g_policy_calls.load(std::memory_order_relaxed), g_gil.load(std::memory_order_relaxed),
          g_wait_ns.load(std::memory_order_relaxed),      g_requests.load(std::memory_order_relaxed),
          g_cut_ns.load(std::memory_order_relaxed),       g_materialize_ns.load(std::memory_order_relaxed)};
}

void countGilAcquisition() { g_gil.fetch_add(1, std::memory_order_relaxed); }

DeviceRuntime::DeviceRuntime(frontend::RecordingPtr recording) : recording_(std::move(recording)) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  g_registry[recording_.get()] = this;
}

DeviceRuntime::~DeviceRuntime() {
  {
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    auto it = g_registry.find(recording_.get());
    if (it != g_registry.end() && it->second == this) g_registry.erase(it);
  }
  if (deferred_ != nullptr && Py_IsInitialized()) {
    Gil gil;
    Py_CLEAR(deferred_);
  }
  if (client_ && Py_IsInitialized() && PyGILState_Check()) {
    py::gil_scoped_release release;  // the client's last reference may close it: no GIL while it waits
    client_.reset();
  }
}

DeviceRuntime* DeviceRuntime::of(const frontend::Recording* recording) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  auto it = g_registry.find(recording);
  return it == g_registry.end() ? nullptr : it->second;
}

void DeviceRuntime::attach(std::shared_ptr<client::Client> client) { client_ = std::move(client); }

void DeviceRuntime::detach() {
  client_.reset();
  in_flight_.clear();
}

std::vector<uint64_t> DeviceRuntime::inFlight() const {
  std::vector<uint64_t> ids;
  for (const auto& [id, kept] : in_flight_) ids.push_back(id);
  return ids;
}

void DeviceRuntime::forgetInFlight() {
  in_flight_.clear();
  Py_CLEAR(deferred_);
}

py::object DeviceRuntime::callPolicy(const char* name, py::args args) {
  Gil gil;
  g_policy_calls.fetch_add(1, std::memory_order_relaxed);
  PyObject* runtime = recording_->runtime_ref != nullptr ? PyWeakref_GetObject(recording_->runtime_ref) : Py_None;
  if (runtime == nullptr) raisePending();
  if (runtime == Py_None) {
    raise(errorClass("GenieConnectionError")(std::string("remote_accelerator:") +
                                             std::to_string(recording_->device_index) +
                                             ": a tensor of a session that was shut down"));
  }
  try {
    return py::reinterpret_borrow<py::object>(runtime).attr(name)(*args);
  } catch (py::error_already_set& e) {
    e.restore();
    raisePending();
  }
}

client::Client& DeviceRuntime::connection() {
  if (!client_) callPolicy("connection", py::args());  // connects and attaches (genie.connection)
  if (!client_) {
    Gil gil;
    raise(errorClass("GenieConnectionError")("remote_accelerator:" + std::to_string(recording_->device_index) +
                                             ": no connection to its node"));
  }
  return *client_;
}

bool DeviceRuntime::recovered(const Status& status, int attempt, py::object& error) {
  Gil gil;
  error = errorOf(status, client_ ? client_->address() : std::string("genie-node"));
  if (!isConnectionLoss(status)) return false;
  // The policy recovers (lineage: connect again, replay) or marks every value lost.
  return callPolicy("_connection_failed", py::make_tuple(error, attempt)).cast<bool>();
}

Cut DeviceRuntime::prepare(const std::vector<ValuePtr>& returned, const std::vector<ValuePtr>& described) {
  connection();  // (re)connecting clears the graph cache: before the cut consults it
  Cut cut;
  try {
    Timed timed(g_cut_ns);
    cut = frontend::takeCut(*recording_, returned, described);
  } catch (const frontend::LostInput& lost) {  // what was pending is lost with it
    Gil gil;
    py::object error = py::reinterpret_borrow<py::object>(lost.value->error);
    recording_->discardPending(error.ptr());
    raise(error);
  }
  const bool first = !cut.prepared.residency.has_value();
  if ((first && analyse_residency) || observe) {
    Gil gil;
    py::list outputs;
    for (const ValuePtr& v : returned) outputs.append(py::cast(v));
    for (const ValuePtr& v : cut.kept) outputs.append(py::cast(v));
    try {
      callPolicy("_cut_taken", py::make_tuple(py::cast(&cut, py::return_value_policy::reference), outputs));
    } catch (...) {
      frontend::restore(*recording_, cut);
      throw;
    }
  }
  if (!cut.prepared.graph_id) registerGraph(cut);
  return cut;
}

void DeviceRuntime::registerGraph(Cut& cut) {
  const std::string graph = frontend::encodeGraph(cut.nodes, cut.lowered, cut.prepared.lifted);
  for (int attempt = 0;; ++attempt) {
    Result<wire::GraphId> id = [&] {
      Waiting waiting;
      return connection().registerGraph({reinterpret_cast<const std::byte*>(graph.data()), graph.size()});
    }();
    if (id) {
      cut.prepared.graph_id = *id;
      recording_->graphs().remember(cut.lowered, cut.prepared.lifted, *id);
      if (lineage) callPolicy("_graph_registered", py::make_tuple(bytesOfId(*id), py::bytes(graph)));
      return;
    }
    py::object error;
    if (recovered(id.status(), attempt, error)) continue;
    // The node refused the graph (an op it lacks): like a failed run.
    Gil gil;
    frontend::fail(*recording_, cut, isConnectionLoss(id.status()) ? -1 : opIndexOf(id.status()), error.ptr());
    raise(error);
  }
}

void DeviceRuntime::failCut(Cut& cut, const Status& status, py::object error) {
  Gil gil;
  if (isConnectionLoss(status)) {
    frontend::fail(*recording_, cut, -1, error.ptr());
    raise(error);
  }
  // An earlier asynchronous run that failed is likely the cause (this cut may read what it
  // would have made): that one is raised, and this cut is lost with it.
  py::object failed = py::reinterpret_steal<py::object>(reapAsync({}));
  if (failed) {
    frontend::fail(*recording_, cut, -1, failed.ptr());
    PyException_SetCause(failed.ptr(), error.release().ptr());
    raise(failed);
  }
  frontend::fail(*recording_, cut, opIndexOf(status), error.ptr());
  raise(error);
}

DeviceRuntime::Results DeviceRuntime::materialize(const std::vector<ValuePtr>& returned,
                                                  const std::vector<ValuePtr>& described) {
  Timed timed(g_materialize_ns);
  recording_->drainDead();
  Cut cut = prepare(returned, described);
  RunRequest request = requestOf(cut);
  Result<client::RunReply> reply = Status(StatusCode::kInternal, "not sent");
  for (int attempt = 0;; ++attempt) {
    {
      Waiting waiting;
      reply = connection().runGraphReply(request.run, request.payload());
    }
    if (reply) break;
    py::object error;
    if (recovered(reply.status(), attempt, error)) continue;
    failCut(cut, reply.status(), std::move(error));
  }
  frontend::commit(*recording_, cut);
  if (lineage) {
    callPolicy("_ran", py::make_tuple(py::cast(&cut, py::return_value_policy::reference), py::none()));
  }
  reapAfterWait(cut.kept);
  if (lineage) callPolicy("_prune_lineage", py::args());

  Results out;
  out.returned.resize(returned.size());
  out.described.resize(described.size());
  size_t next_returned = 0, next_described = 0;
  for (size_t i = 0; i < cut.specs.size(); ++i) {
    const frontend::OutputRow& row = cut.specs[i];
    const frontend::Value* v = cut.spec_values[i].get();
    auto place = [&](const std::vector<ValuePtr>& asked, auto& slots, const auto& result) {
      for (size_t k = 0; k < asked.size(); ++k) {
        if (asked[k].get() == v) slots[k] = result;
      }
    };
    if (row.action == frontend::OutputAction::kReturn || row.action == frontend::OutputAction::kReturnAndKeep) {
      if (next_returned >= reply->outputs.tensors.size()) {
        Gil gil;
        raise(errorClass("GenieError")("genie-node " + client_->address() +
                                       " answered RunGraph with fewer returned outputs than asked for"));
      }
      place(returned, out.returned, tensorOf(reply->outputs, next_returned++));
    } else if (row.action == frontend::OutputAction::kKeepAndDescribe) {
      if (next_described >= reply->described.size()) {
        Gil gil;
        raise(errorClass("GenieError")("genie-node " + client_->address() +
                                       " answered RunGraph with fewer described outputs than asked for"));
      }
      place(described, out.described, reply->described[next_described++].desc);
    }
  }
  return out;
}

void DeviceRuntime::materializeAsync() {
  if (static_cast<int64_t>(in_flight_.size()) >= max_in_flight) {
    Gil gil;
    PyObject* failed = reapAsync({});  // a full launch queue blocks the host, as CUDA's does
    if (failed != nullptr) {
      Py_XDECREF(deferred_);
      deferred_ = failed;
    }
  }
  recording_->drainDead();
  auto defer = [this](py::handle error) {
    Gil gil;
    if (deferred_ == nullptr) deferred_ = py::reinterpret_borrow<py::object>(error).release().ptr();
  };
  Cut cut;
  try {
    cut = prepare({}, {});
  } catch (python_error& e) {  // raised at the next request that waits
    Gil gil;
    e.restore();
    PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (value != nullptr && traceback != nullptr) PyException_SetTraceback(value, traceback);
    py::object error = py::reinterpret_steal<py::object>(value);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    if (error && PyErr_GivenExceptionMatches(error.ptr(), PyExc_KeyboardInterrupt)) raise(error);
    if (error) defer(error);
    return;
  } catch (const c10::Error& e) {  // a cut that cannot be lowered: the RuntimeError Python sees
    Gil gil;
    defer(py::reinterpret_borrow<py::object>(PyExc_RuntimeError)(std::string(e.what_without_backtrace())));
    return;
  }
  RunRequest request = requestOf(cut);
  for (const auto& spec : request.run.outputs) {
    TORCH_CHECK(spec.action == wire::OutputAction::KeepResident,
                "an asynchronous run can only keep outputs resident (", spec.value, ")");
  }
  Result<uint64_t> id = Status(StatusCode::kInternal, "not sent");
  for (int attempt = 0;; ++attempt) {
    id = connection().runGraphAsync(request.run, request.payload());
    if (id) break;
    py::object error;
    if (recovered(id.status(), attempt, error)) continue;
    Gil gil;
    frontend::fail(*recording_, cut, isConnectionLoss(id.status()) ? -1 : opIndexOf(id.status()), error.ptr());
    defer(error);
    return;
  }
  frontend::commit(*recording_, cut);
  in_flight_[*id] = cut.kept;
  if (lineage) {
    callPolicy("_ran", py::make_tuple(py::cast(&cut, py::return_value_policy::reference), *id));
  }
}

void DeviceRuntime::runPending() {
  if (static_cast<int64_t>(recording_->pending().size()) >= recording_->max_pending) {
    materialize({}, {});
  } else if (recording_->wantsRun()) {
    materializeAsync();
  }
}

PyObject* DeviceRuntime::reapAsync(const std::vector<ValuePtr>& sent_after) {
  PyObject* first = deferred_;
  deferred_ = nullptr;
  if (in_flight_.empty() || !client_) {
    in_flight_.clear();
    return first;
  }
  std::vector<client::AsyncFailure> failures;
  {
    Waiting waiting;
    failures = client_->takeAsyncFailures(/*wait=*/true);
  }
  if (!failures.empty()) {
    const client::AsyncFailure* failed = &failures[0];
    for (const auto& f : failures) {
      if (f.request_id < failed->request_id) failed = &f;  // request ids grow in send order
    }
    py::object error = errorOf(failed->status, client_->address());
    if (lineage) callPolicy("_runs_failed_after", py::make_tuple(failed->request_id));
    auto poison = [&](const std::vector<ValuePtr>& kept) {
      for (const ValuePtr& v : kept) v->setError(error.ptr());  // the handle stays: freed when the tensor dies
    };
    for (const auto& [request_id, kept] : in_flight_) {
      if (request_id >= failed->request_id) poison(kept);
    }
    poison(sent_after);
    if (first == nullptr) first = error.release().ptr();
  }
  in_flight_.clear();
  return first;
}

void DeviceRuntime::reapAfterWait(const std::vector<ValuePtr>& sent_after) {
  if (!busy()) return;
  Gil gil;
  py::object failed = py::reinterpret_steal<py::object>(reapAsync(sent_after));
  if (failed) raise(failed);
}

std::vector<at::Tensor> DeviceRuntime::get(const std::vector<wire::Handle>& handles) {
  for (int attempt = 0;; ++attempt) {
    Result<client::TensorBatch> batch = [&] {
      Waiting waiting;
      return connection().getTensors(handles);
    }();
    if (batch) {
      std::vector<at::Tensor> out;
      for (size_t i = 0; i < batch->tensors.size(); ++i) out.push_back(tensorOf(*batch, i));
      reapAfterWait({});
      return out;
    }
    py::object error;
    if (recovered(batch.status(), attempt, error)) continue;
    Gil gil;
    py::object failed = py::reinterpret_steal<py::object>(reapAsync({}));
    if (failed) {
      PyException_SetCause(failed.ptr(), error.release().ptr());
      raise(failed);
    }
    raise(error);
  }
}

std::optional<at::Tensor> DeviceRuntime::fetch(const at::Tensor& tensor) {
  frontend::LazyState* state = frontend::lazyState(tensor);
  if (state == nullptr || lineage || tensor.is_quantized()) return std::nullopt;
  ValuePtr value = state->value();
  if (!value || value->lost()) return std::nullopt;  // Python raises its error
  at::Tensor out;
  if (!busy()) {  // with runs in flight, their failures are reported at reads: no host answers
    at::Tensor host = frontend::hostValue(*value);
    if (!host.defined()) {
      // Small resident values the host could compute it from (a tensor being printed:
      // PyTorch's formatting reads each element through exact ops) are read whole in one
      // request and kept as their host copies, so the reads that follow need none.
      std::vector<ValuePtr> leaves = frontend::hostLeaves(*value);
      if (!leaves.empty()) {
        std::vector<wire::Handle> handles;
        for (const ValuePtr& leaf : leaves) handles.push_back(*leaf->handle);
        std::vector<at::Tensor> read = get(handles);
        for (size_t i = 0; i < leaves.size() && i < read.size(); ++i) {
          leaves[i]->host = leaves[i]->sized ? read[i].reshape(leaves[i]->sizes) : read[i];
        }
        host = frontend::hostValue(*value);
      }
    }
    if (host.defined()) out = host.clone();  // the program may change what it read; the host copy stays
  }
  if (!out.defined()) {
    if (!value->pending() && value->handle && !recording_->pendingWrites(value->storage.get())) {
      out = std::move(get({*value->handle}).at(0));
    } else {
      out = std::move(materialize({value}, {}).returned.at(0));
    }
  }
  // Same elements in another shape (a 0-dim value travels as [1]): the tensor's shape. Different
  // element counts mean the meta kernel and the node's kernel disagree (native_batch_norm in
  // eval mode); the node ran the op, so its result is what the program reads.
  if (out.sizes() != tensor.sizes() && out.numel() == tensor.numel()) out = out.reshape(tensor.sizes());
  return out;
}

// ---- uploads ----------------------------------------------------------------------------

std::optional<at::Tensor> DeviceRuntime::upload(const at::Tensor& host, uint8_t residency, const at::Tensor& source,
                                                std::optional<at::ScalarType> dtype,
                                                std::optional<at::MemoryFormat> format) {
  if (!host.defined() || !host.is_cpu() || host.layout() != c10::kStrided || host.is_quantized()) {
    return std::nullopt;
  }
  const at::ScalarType type = dtype.value_or(host.scalar_type());
  at::Tensor data;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    data = host.detach();
    if (type != data.scalar_type()) data = data.to(type);
    if (format && *format != at::MemoryFormat::Preserve) data = data.contiguous(*format);
  }
  const bool converted = type != host.scalar_type() || (format && *format != at::MemoryFormat::Preserve);
  const int64_t nbytes = data.numel() * static_cast<int64_t>(data.element_size());
  frontend::ValuePtr value;
  if (residency != frontend::kWeight && nbytes <= frontend::kInlineUploadBytes) {
    at::Tensor snapshot;  // as eager copies now
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      snapshot = data.clone(at::MemoryFormat::Preserve);
      if (!snapshot.is_non_overlapping_and_dense()) snapshot = snapshot.contiguous();
    }
    static const c10::OperatorHandle alias = c10::Dispatcher::singleton().findSchemaOrThrow("aten::alias", "");
    const frontend::OutputSpec spec{c10::make_intrusive<frontend::Storage>(), type};
    frontend::NodePtr node = frontend::Node::make(alias, frontend::opFacts(alias), {snapshot}, spec, {});
    value = node->outputs[0];
    value->sizes.assign(snapshot.sizes().begin(), snapshot.sizes().end());
    value->sized = true;
    recording_->append(node);
    if (frontend::keepsHostCopy(type, nbytes)) value->host = snapshot;
    data = snapshot;
  } else {
    at::Tensor dense = data;
    if (dense.storage_offset() != 0 || !dense.is_contiguous()) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      dense = dense.contiguous();
    }
    // Keyed by the source's host bytes when nothing was converted (tied weights are put once).
    value = put(dense, residency, nullptr, converted ? at::Tensor() : (source.defined() ? source : host));
    data = dense;
  }
  return frontend::makeLazy(value, frontend::Desc::of(data), recording_, nullptr);
}

frontend::ValuePtr DeviceRuntime::put(const at::Tensor& data, uint8_t residency, frontend::StoragePtr storage,
                                      const at::Tensor& source) {
  std::vector<int64_t> key;
  if (residency == frontend::kWeight && source.defined() && source.has_storage()) {
    const c10::StorageImpl* host = source.storage().unsafeGetStorageImpl();
    key = {reinterpret_cast<int64_t>(host->data()), source.storage_offset(), static_cast<int64_t>(source.scalar_type()),
           static_cast<int64_t>(source.unsafeGetTensorImpl()->version_counter().current_version()), source.dim()};
    key.insert(key.end(), source.sizes().begin(), source.sizes().end());
    key.insert(key.end(), source.strides().begin(), source.strides().end());
    auto it = weights_.find(key);
    if (it != weights_.end() && !it->second.storage.expired()) {
      frontend::ValuePtr known = recording_->residentValue(it->second.handle);
      if (known && !known->lost()) return known;
    }
  }
  OutgoingTensor out = outgoingOf(data, "upload to remote_accelerator:" + std::to_string(recording_->device_index));
  wire::TensorSlotArgs slot;
  slot.handle = frontend::newHandle();
  slot.desc = out.desc;
  slot.residency = static_cast<wire::Residency>(residency);
  if (!recording_->colocation_group.empty() && residency == frontend::kWeight) {  // the scheduler's hint (genie.placed)
    slot.colocation = wire::ColocationArgs{recording_->colocation_group, recording_->colocation_bytes};
  }
  for (int attempt = 0;; ++attempt) {
    Status status = [&] {
      Waiting waiting;
      return connection().putTensors({&slot, 1}, {out.bytes, out.nbytes});
    }();
    if (status) break;
    py::object error;
    if (recovered(status, attempt, error)) continue;
    Gil gil;
    raise(error);  // no report of failed runs here: the handle would leak
  }
  auto value = c10::make_intrusive<frontend::Value>(storage ? std::move(storage) : c10::make_intrusive<frontend::Storage>(),
                                                    data.scalar_type(), 0, nullptr);
  value->handle = slot.handle;
  value->residency = residency;
  value->sizes.assign(data.sizes().begin(), data.sizes().end());
  value->sized = true;
  recording_->noteResident(value);
  if (frontend::keepsHostCopy(data.scalar_type(), static_cast<int64_t>(out.nbytes))) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    value->host = data.clone();
  }
  if (lineage) {
    Gil gil;
    callPolicy("_put", py::make_tuple(bytesOfId(slot.handle), wrap(data), static_cast<int>(residency)));
  }
  if (!key.empty()) {
    if (weights_.size() >= 4096) {  // forget the weights whose host storage or value is gone
      for (auto it = weights_.begin(); it != weights_.end();) {
        it = it->second.storage.expired() || !recording_->residentValue(it->second.handle) ? weights_.erase(it)
                                                                                            : std::next(it);
      }
    }
    weights_.insert_or_assign(key, PutWeight{source.storage().getWeakStorageImpl(), slot.handle});
  }
  return value;
}

}  // namespace genie::python
