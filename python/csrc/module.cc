// genie._C: the module, its errors, and Client, a thin binding of genie::client::Client (the
// C++ client of genie-node; Python never re-implements the transport). Every blocking call
// releases the GIL while it waits. Status values become the exceptions of genie.errors
// (imported lazily; RuntimeError if it cannot be imported):
//   kPeerUnreachable, kTimeout          -> GenieConnectionError (message names host:port)
//   kRemote (the node's Error reply)    -> genie.errors.remote_error(...): a GenieRemoteError that is
//                                          also the class eager raises (IndexError, ...)
//   anything else                       -> GenieError
// Argument mistakes raise TypeError / ValueError before anything is sent.
//
// No spdlog here: torch ships its own fmt (genie/log.h is safe).
//
// Over 600 lines: the Client binding (every request of genie::client with its argument checks,
// conversions and docstrings) and the module's init, which adds every file's bindings.
#include <array>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
// pybind11 first: it includes Python.h, which torch's Python headers expect.
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <type_traits>
#include <string>
#include <vector>

#include "bindings.h"
#include "wire_tensors.h"
#include "genie/client/client.h"
#include "genie/log.h"
#include "genie/transport/config.h"
#include "genie/wire/torch_dtype.h"

#ifndef GENIE_SOURCE_DIR
#define GENIE_SOURCE_DIR ""
#endif

namespace genie::python {
namespace {

using client::Client;

wire::Residency residencyOf(py::handle obj, const std::string& what) {
  const int64_t r = py::cast<int64_t>(obj);
  if (r < 0 || r > static_cast<int64_t>(wire::Residency::MAX)) {
    throw py::value_error(what + ": residency " + std::to_string(r) + " is not 0..3");
  }
  return static_cast<wire::Residency>(r);
}

py::tuple tupleOf(py::handle obj, size_t n, const std::string& what) {
  if (!PyTuple_Check(obj.ptr()) && !PyList_Check(obj.ptr())) {
    throw py::type_error(what + ": expected a tuple of " + std::to_string(n) + ", got " + typeName(obj));
  }
  py::tuple t = py::tuple(py::reinterpret_borrow<py::sequence>(obj));
  if (t.size() != n) {
    throw py::value_error(what + ": expected a tuple of " + std::to_string(n) + ", got " + std::to_string(t.size()) +
                          " items");
  }
  return t;
}

/// Runs `f` without the GIL (the client's blocking calls).
template <typename F>
auto withoutGil(F&& f) {
  py::gil_scoped_release release;
  return f();
}

std::string at(const char* what, size_t i) { return std::string(what) + "[" + std::to_string(i) + "]"; }

// ---- Client -----------------------------------------------------------------------------

class PyClient {
 public:
  PyClient(const std::string& host, int port, const std::string& name, const std::string& auth_token,
           int64_t timeout_ms)
      : address_(host + ":" + std::to_string(port)) {
    if (port <= 0 || port > 65535) throw py::value_error("port " + std::to_string(port) + " is not 1..65535");
    if (timeout_ms <= 0) throw py::value_error("timeout_ms must be positive");
    auto transport = transport::WorkerConfig::fromEnvironment();
    if (!transport) raiseStatus(transport.status(), address_);
    client::ClientOptions options;
    options.name = name;
    options.auth_token = auth_token;
    options.timeout = std::chrono::milliseconds(timeout_ms);
    options.transport = *transport;
    auto connected = withoutGil([&] { return Client::connect(host, static_cast<uint16_t>(port), options); });
    if (!connected) raiseStatus(connected.status(), address_);
    client_ = std::move(*connected);
  }

  ~PyClient() {
    if (!client_) return;
    if (_Py_IsFinalizing()) {  // no GIL juggling at interpreter exit
      client_->close();
      return;
    }
    py::gil_scoped_release release;
    client_->close();
  }

  const std::string& address() const { return address_; }
  py::bytes sessionId() const { return bytesOfId(live().sessionId()); }
  const std::string& device() const { return live().welcome().device; }
  const std::string& nodeName() const { return live().welcome().node_name; }
  uint64_t memoryLimit() const { return live().welcome().memory_limit; }
  py::dict residentStat() const {
    const client::ResidentStat r = live().residentStat();
    py::dict out;
    out["current"] = r.current;
    out["peak"] = r.peak;
    out["allocated"] = r.allocated;
    out["freed"] = r.freed;
    return out;
  }
  void resetResidentPeak() { live().resetResidentPeak(); }
  void resetResidentAccumulated() { live().resetResidentAccumulated(); }

  void put(const py::list& items) {
    std::vector<OutgoingTensor> tensors;
    std::vector<wire::TensorSlotArgs> slots;
    std::vector<uint64_t> offsets;
    wire::PayloadLayout layout;
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string what = at("put: items", i);
      const bool hinted = (PyTuple_Check(items[i].ptr()) || PyList_Check(items[i].ptr())) && py::len(items[i]) == 5;
      py::tuple item = tupleOf(items[i], hinted ? 5 : 3, what);
      wire::TensorSlotArgs slot;
      slot.handle = idOf<wire::Handle>(item[0], what + " handle");
      tensors.push_back(outgoingOf(item[1], what + " tensor"));
      slot.residency = residencyOf(item[2], what);
      if (hinted && !item[3].is_none()) {
        std::string group = py::cast<std::string>(item[3]);
        if (group.empty() || group.size() > wire::kMaxColocationGroupBytes) {
          throw py::value_error(what + ": co-location group of " + std::to_string(group.size()) + " bytes, not 1.." +
                                std::to_string(wire::kMaxColocationGroupBytes));
        }
        slot.colocation = wire::ColocationArgs{std::move(group), py::cast<uint64_t>(item[4])};
      }
      slot.desc = tensors.back().desc;
      slot.payload_offset = layout.add(tensors.back().nbytes);
      offsets.push_back(slot.payload_offset);
      slots.push_back(std::move(slot));
    }
    if (slots.empty()) return;
    check(withoutGil([&] {
      if (tensors.size() == 1) {  // one tensor: sent straight from its storage
        return live().putTensors(slots, {tensors[0].bytes, tensors[0].nbytes});
      }
      return live().putTensors(slots, payloadParts(tensors, offsets));  // no staging copy
    }));
  }

  py::list get(const py::list& handles) {
    std::vector<wire::Handle> ids;
    for (size_t i = 0; i < handles.size(); ++i) ids.push_back(idOf<wire::Handle>(handles[i], at("get: handles", i)));
    py::list out;
    if (ids.empty()) return out;
    auto batch = withoutGil([&] { return live().getTensors(ids); });
    check(batch);
    for (size_t i = 0; i < batch->tensors.size(); ++i) out.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(tensorOf(*batch, i))));
    return out;
  }

  void free(const py::list& handles, bool wait) {
    std::vector<wire::Handle> ids;
    for (size_t i = 0; i < handles.size(); ++i) ids.push_back(idOf<wire::Handle>(handles[i], at("free: handles", i)));
    if (ids.empty()) return;
    check(withoutGil([&] { return live().freeTensors(ids, /*want_reply=*/wait); }));
  }

  py::bytes registerGraph(const py::bytes& graph) {
    std::string_view bytes = graph;
    auto id = withoutGil(
        [&] { return live().registerGraph({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()}); });
    check(id);
    return bytesOfId(*id);
  }

  /// A RunGraph's arguments from run_graph's Python arguments (raises TypeError/ValueError).
  static RunRequest parseRun(const py::bytes& graph_id, const py::list& inputs, const py::list& scalars,
                            const py::list& outputs, const py::list& free) {
    RunRequest parsed;
    wire::RunGraphArgs& run = parsed.run;
    run.graph_id = idOf<wire::GraphId>(graph_id, "run_graph: graph_id");
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::string what = at("run_graph: inputs", i);
      py::tuple item = tupleOf(inputs[i], 2, what);
      wire::InputBindingArgs binding;
      binding.input = py::cast<uint32_t>(item[0]);
      if (PyBytes_Check(item[1].ptr())) {
        binding.handle = idOf<wire::Handle>(item[1], what);
      } else if (THPVariable_Check(item[1].ptr())) {
        binding.inline_tensor = parsed.addInline(outgoingOf(item[1], what));
      } else {
        throw py::type_error(what + ": expected a 16-byte handle or a torch.Tensor, got " + typeName(item[1]));
      }
      run.inputs.push_back(std::move(binding));
    }
    for (size_t i = 0; i < scalars.size(); ++i) {
      const std::string what = at("run_graph: scalars", i);
      py::tuple item = tupleOf(scalars[i], 2, what);
      wire::ScalarBindingArgs scalar;
      scalar.slot = py::cast<uint32_t>(item[0]);
      PyObject* v = item[1].ptr();
      if (PyBool_Check(v)) {
        scalar.value = v == Py_True;
      } else if (PyLong_Check(v)) {
        scalar.value = py::cast<int64_t>(item[1]);
      } else if (PyFloat_Check(v)) {
        scalar.value = PyFloat_AsDouble(v);
      } else {
        throw py::type_error(what + ": expected int, float or bool, got " + typeName(item[1]));
      }
      run.scalars.push_back(scalar);
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      const std::string what = at("run_graph: outputs", i);
      py::tuple item = tupleOf(outputs[i], 4, what);
      wire::OutputSpecArgs spec;
      spec.value = py::cast<uint32_t>(item[0]);
      const int64_t action = py::cast<int64_t>(item[1]);
      if (action < 0 || action > static_cast<int64_t>(wire::OutputAction::MAX)) {
        throw py::value_error(what + ": action " + std::to_string(action) + " is not 0..3");
      }
      spec.action = static_cast<wire::OutputAction>(action);
      if (!item[2].is_none()) {
        spec.handle = idOf<wire::Handle>(item[2], what + " handle");
      } else if (spec.action != wire::OutputAction::Return) {
        throw py::value_error(what + ": action " + std::string(wire::EnumNameOutputAction(spec.action)) +
                              " needs a handle");
      }
      spec.residency = residencyOf(item[3], what);
      run.outputs.push_back(spec);
    }
    for (size_t i = 0; i < free.size(); ++i) run.free.push_back(idOf<wire::Handle>(free[i], at("run_graph: free", i)));

    return parsed;
  }

  py::list runGraph(const py::bytes& graph_id, const py::list& inputs, const py::list& scalars,
                    const py::list& outputs, const py::list& free) {
    return runParsed(parseRun(graph_id, inputs, scalars, outputs, free));
  }

  /// Sends a parsed RunGraph and waits: per output spec, the host tensor (Return,
  /// ReturnAndKeep), the descriptor (KeepAndDescribe) or None.
  py::list runParsed(const RunRequest& parsed) {
    const wire::RunGraphArgs& run = parsed.run;
    auto reply = withoutGil([&] { return live().runGraphReply(run, parsed.payload()); });
    check(reply);
    py::list out;
    size_t returned = 0, described = 0;
    for (const wire::OutputSpecArgs& spec : run.outputs) {
      switch (spec.action) {
        case wire::OutputAction::Return:
        case wire::OutputAction::ReturnAndKeep:
          if (returned >= reply->outputs.tensors.size()) throw malformedReply("returned outputs");
          out.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(tensorOf(reply->outputs, returned++))));
          break;
        case wire::OutputAction::KeepAndDescribe:
          if (described >= reply->described.size()) throw malformedReply("described outputs");
          out.append(describe(reply->described[described++].desc));
          break;
        default:
          out.append(py::none());
      }
    }
    return out;
  }

  uint64_t runGraphAsync(const py::bytes& graph_id, const py::list& inputs, const py::list& scalars,
                         const py::list& outputs, const py::list& free) {
    RunRequest parsed = parseRun(graph_id, inputs, scalars, outputs, free);
    for (size_t i = 0; i < parsed.run.outputs.size(); ++i) {
      if (parsed.run.outputs[i].action != wire::OutputAction::KeepResident) {
        throw py::value_error(at("run_graph_async: outputs", i) + ": an asynchronous run can only keep outputs resident");
      }
    }
    auto id = withoutGil([&] { return live().runGraphAsync(parsed.run, parsed.payload()); });
    check(id);
    return *id;
  }

  py::list takeAsyncFailures(bool wait) {
    auto failures = withoutGil([&] { return live().takeAsyncFailures(wait); });
    py::list out;
    for (const client::AsyncFailure& failure : failures) {
      out.append(py::make_tuple(failure.request_id, errorOf(failure.status, address_)));
    }
    return out;
  }

  py::dict stats(const py::list& part_graphs) {
    std::vector<wire::GraphId> graphs;
    for (size_t i = 0; i < part_graphs.size(); ++i) graphs.push_back(idOf<wire::GraphId>(part_graphs[i], at("stats: parts", i)));
    if (graphs.size() > wire::kMaxStatsParts) {
      throw py::value_error("stats: " + std::to_string(graphs.size()) + " parts, more than " +
                            std::to_string(wire::kMaxStatsParts));
    }
    auto s = withoutGil([&] { return live().stats(graphs); });
    check(s);
    py::dict resident;
    for (const auto& [residency, bytes] : s->resident) resident[wire::EnumNameResidency(residency)] = bytes;
    py::dict out;
    out["sessions"] = s->sessions;
    out["resident"] = resident;
    out["graphs_cached"] = s->graphs_cached;
    out["ops_executed"] = s->ops_executed;
    out["bytes_in"] = s->bytes_in;
    out["bytes_out"] = s->bytes_out;
    out["memory_limit"] = s->memory_limit;
    out["uptime_us"] = s->uptime_us;
    out["session_resident"] = s->session_resident;
    out["device_free"] = s->device_free;
    out["device_total"] = s->device_total;
    out["package_calls"] = s->package_calls;
    out["executor_calls"] = s->executor_calls;
    out["packages_built"] = s->packages_built;
    out["packages_loaded"] = s->packages_loaded;
    out["compile_failures"] = s->compile_failures;
    out["peer_bytes_sent"] = s->peer_bytes_sent;
    out["peer_bytes_received"] = s->peer_bytes_received;
    out["peer_transfers"] = s->peer_transfers;
    out["cuda_graph_replays"] = s->cuda_graph_replays;
    py::dict colocation;
    for (const auto& g : s->colocation) {
      py::dict group;
      group["bytes"] = g.bytes;
      group["resident"] = g.resident;
      colocation[py::str(g.group)] = group;
    }
    out["colocation"] = colocation;
    py::list parts;
    for (const auto& p : s->parts) {
      py::dict part;
      part["graph"] = bytesOfId(p.graph_id);
      part["inputs"] = p.inputs;
      part["state"] = p.state;
      part["package_calls"] = p.package_calls;
      part["executor_calls"] = p.executor_calls;
      part["build_s"] = static_cast<double>(p.build_us) / 1e6;
      part["from_cache"] = p.from_cache;
      part["reason"] = p.reason;
      part["cuda_graph_replays"] = p.cuda_graph_replays;
      parts.append(part);
    }
    out["parts"] = parts;
    return out;
  }

  void sendTensors(const std::string& peer, const std::string& auth_token, const py::bytes& peer_session,
                   const py::list& handles, const py::list& peer_handles) {
    if (handles.size() == 0 || handles.size() != peer_handles.size()) {
      throw py::value_error("send_tensors: " + std::to_string(handles.size()) + " handles and " +
                            std::to_string(peer_handles.size()) + " peer_handles (need as many, at least one)");
    }
    const wire::Handle session = idOf<wire::Handle>(peer_session, "send_tensors: peer_session");
    std::vector<wire::Handle> ids, peer_ids;
    for (size_t i = 0; i < handles.size(); ++i) {
      ids.push_back(idOf<wire::Handle>(handles[i], at("send_tensors: handles", i)));
      peer_ids.push_back(idOf<wire::Handle>(peer_handles[i], at("send_tensors: peer_handles", i)));
    }
    check(withoutGil([&] { return live().sendTensors(peer, auth_token, session, ids, peer_ids); }));
  }

  double ping() {
    std::chrono::steady_clock::duration elapsed{};
    check(withoutGil([&] {
      const auto start = std::chrono::steady_clock::now();
      Status status = live().ping();
      elapsed = std::chrono::steady_clock::now() - start;
      return status;
    }));
    return std::chrono::duration<double>(elapsed).count();
  }

  py::dict counters() const {
    const client::ClientCounters c = live().counters();
    py::dict out;
    out["bytes_sent"] = c.bytes_sent;
    out["bytes_received"] = c.bytes_received;
    out["messages_sent"] = c.messages_sent;
    out["round_trips"] = c.round_trips;
    out["async_runs"] = c.async_runs;
    out["node_exec_us"] = c.node_exec_us;
    return out;
  }

  void close() {
    py::gil_scoped_release release;
    client_->close();
  }

  std::string repr() const {
    return "<genie._C.Client " + address_ + " device=" + client_->welcome().device + " session=" +
           wire::toString(client_->sessionId()) + ">";
  }

 /// The C++ client, shared with the device runtime (device_runtime.h).
  std::shared_ptr<Client> shared() const { return client_; }

 private:
  /// The connected client (the constructor raises when it cannot connect: never null).
  Client& live() const { return *client_; }

  /// Raises for a failed status (GIL held).
  void check(const Status& status) const {
    if (!status) raiseStatus(status, address_);
  }
  template <typename T>
  void check(const Result<T>& result) const {
    check(result.status());
  }

  py::error_already_set malformedReply(const char* what) const {
    PyErr_SetString(errorClass("GenieError").ptr(),
                    ("genie-node " + address_ + " answered RunGraph with fewer " + what + " than asked for").c_str());
    return py::error_already_set();
  }

  std::string address_;
  std::shared_ptr<Client> client_;

 public:
  /// The calls that returned, and the last one's result (see `returning`).
  uint64_t completed_calls = 0;
  py::object last_result = py::none();
};

// ---- module functions -------------------------------------------------------------------

std::string nodeBinary() {
  namespace fs = std::filesystem;
  const fs::path here = fs::path(py::cast<std::string>(py::module_::import("genie._C").attr("__file__"))).parent_path();
  const fs::path installed = here / "bin" / "genie-node";
  const fs::path built = fs::path(GENIE_SOURCE_DIR) / "build" / "bin" / "genie-node";
  for (const fs::path& p : {installed, built}) {
    std::error_code ec;
    if (!p.empty() && fs::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0) return p.string();
  }
  PyErr_SetObject(PyExc_FileNotFoundError,
                  py::str("no genie-node executable: looked for " + installed.string() + " (installed with genie) and " +
                          built.string() + " (the repository's build)")
                      .ptr());
  throw py::error_already_set();
}

}  // namespace

std::shared_ptr<Client> sharedClientOf(py::handle client) { return py::cast<PyClient&>(client).shared(); }

/// Sets a remote_accelerator tensor's sizes, strides and storage offset (device_guard.cc).
void setGeometry(const at::Tensor& tensor, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t storage_offset);

/// A binding of a PyClient method that also records its result in the client before
/// returning it. A KeyboardInterrupt (Ctrl-C while the call waited without the GIL) is raised
/// by the interpreter as the call returns, discarding the result of work the node did; the
/// caller then finds it in `last_result` (`completed_calls` says whether the call returned).
template <typename R, typename... Args>
auto returning(R (PyClient::*method)(Args...)) {
  return [method](PyClient& self, Args... args) -> py::object {
    py::object result = py::none();
    if constexpr (std::is_void_v<R>) {
      (self.*method)(std::forward<Args>(args)...);
    } else if constexpr (std::is_base_of_v<py::object, R>) {
      result = (self.*method)(std::forward<Args>(args)...);
    } else {
      result = py::cast((self.*method)(std::forward<Args>(args)...));
    }
    self.last_result = result;
    ++self.completed_calls;
    return result;
  };
}

PYBIND11_MODULE(_C, m) {
  m.doc() =
      "Genie's C++ extension: the client of genie-node (UCX transport, FlatBuffers wire), the graph "
      "encoder, and the remote_accelerator (PrivateUse1) device guard. Handles and graph ids are "
      "16 bytes (hi then lo, big-endian; .hex() is the node's spelling). Errors: genie.errors.";

  // The program's standard output is its own: the client logs to standard error, warnings and
  // errors only unless GENIE_LOG_LEVEL says otherwise (as for the embedded node).
  // torch's python_error (a Python exception carried through C++: the recorder's kernel, the
  // device runtime) is raised as the exception it holds by every binding of this module.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (python_error& e) {
      e.restore();
    }
  });
  genie::logToStderr("genie");
  const char* level = std::getenv("GENIE_LOG_LEVEL");
  if (level == nullptr || !genie::setLogLevel(level)) genie::setLogLevel("warn");

  bindFrontend(m);
  bindDispatchKernel(m);
  bindSparse(m);
  bindDeviceRuntime(m);
  m.def("set_device_count", &setDeviceCount, py::arg("n"),
        "Sets how many remote_accelerator devices c10's PrivateUse1 device guard reports (n >= 1).");
  m.def("set_accelerator_hooks", &setAcceleratorHooks, py::arg("hooks"),
        "Installs the object whose methods answer torch.accelerator for remote_accelerator: "
        "synchronize(i), resident_stat(i) -> {'current', 'peak', 'allocated', 'freed'}, "
        "reset_peak_memory_stats(i), reset_accumulated_memory_stats(i), empty_cache(), mem_get_info(i) -> (free, total).");
  m.def("current_device", &currentDevice,
        "This thread's current remote_accelerator device index (c10's device guard: the one "
        "torch.remote_accelerator.device(i) and c10::DeviceGuard set; 0 at first).");
  m.def("set_current_device", &setCurrentDevice, py::arg("index"),
        "Makes `index` this thread's current remote_accelerator device. RuntimeError past the device count.");
  m.def(
      "set_geometry",
      [](py::handle tensor, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
         int64_t storage_offset) {
        if (!THPVariable_Check(tensor.ptr())) throw py::type_error("set_geometry: expected a Tensor, got " + typeName(tensor));
        setGeometry(THPVariable_Unpack(tensor.ptr()), sizes, strides, storage_offset);
      },
      py::arg("tensor"), py::arg("sizes"), py::arg("strides"), py::arg("storage_offset"),
      "Gives a remote_accelerator tensor (a LazyTensor wrapper) new sizes, strides (elements) and "
      "storage offset (elements), as resize_ does for an out= op that resizes its output. "
      "RuntimeError for a tensor on another device or mismatched lengths.");
  m.def("wire_enum", [](const std::string& name) {
    py::dict out;
    auto add = [&out](const auto& values, auto name_of) {
      for (const auto v : values) out[py::str(name_of(v))] = static_cast<int>(v);
    };
    if (name == "Residency") {
      add(wire::EnumValuesResidency(), wire::EnumNameResidency);
    } else if (name == "OutputAction") {
      add(wire::EnumValuesOutputAction(), wire::EnumNameOutputAction);
    } else if (name == "DType") {
      add(wire::EnumValuesDType(), wire::EnumNameDType);
    } else {
      throw py::value_error("wire_enum: no enum " + name + " (Residency, OutputAction, DType)");
    }
    return out;
  }, py::arg("name"),
        "wire_enum(name) -> {member: int}: an enum of schemas/genie.fbs (Residency, OutputAction, DType) as the "
        "generated header defines it. ValueError for another name.");
  m.def("protocol_version", [] { return wire::kProtocolVersion; },
        "The wire protocol version this extension speaks (int; a node with another refuses Hello).");
  m.def(
      "transport_config",
      [] {
        // The data plane's table (transport/src/config.cc) with this environment's values.
        auto config = transport::WorkerConfig::fromEnvironment();
        py::list rows;
        for (const auto& entry : transport::configTable()) {
          py::dict row;
          row["name"] = entry.env;
          row["type"] = entry.type;
          row["default"] = entry.default_text;
          row["value"] = config ? py::cast(entry.format(*config)) : py::none();
          row["help"] = entry.help;
          rows.append(row);
        }
        if (!config) throw py::value_error(config.status().message());
        return rows;
      },
      "transport_config() -> list[dict]: the data plane's settings (name, type, default, value as "
      "read from the environment, help), from the transport's own table. ValueError naming the "
      "variable when one is invalid.");
  m.def("node_binary", &nodeBinary,
        "Path (str) of a genie-node executable: the one installed next to this module (genie/bin/"
        "genie-node), else <repo>/build/bin/genie-node. FileNotFoundError naming both otherwise.");

  py::class_<PyClient>(m, "Client", R"doc(
A session with one genie-node (UCX; Hello/Welcome on construction).

Client(host: str, port: int, name: str = "genie-python", auth_token: str = "", timeout_ms: int = 60000)
  timeout_ms bounds each request (ms). The transport reads the GENIE_* / UCX_* environment.
  Raises GenieConnectionError (unreachable: names host:port), GenieRemoteError (refused:
  code "Unauthenticated" / "UnsupportedVersion").

Handles are 16 bytes chosen by the caller (e.g. os.urandom(16); all-zero is invalid).
Residency ints: 0 EphemeralActivation, 1 PersistentWeight, 2 StatefulKvCache, 3 Gradient.
Every blocking method releases the GIL while it waits.
)doc")
      .def(py::init<const std::string&, int, const std::string&, const std::string&, int64_t>(), py::arg("host"),
           py::arg("port"), py::arg("name") = "genie-python", py::arg("auth_token") = "",
           py::arg("timeout_ms") = 60000)
      .def_property_readonly("session_id", &PyClient::sessionId,
                             "The session's id (16 bytes, the node's Welcome): what another node's "
                             "send_tensors names as peer_session to put tensors into this session.")
      .def_property_readonly("device", &PyClient::device, "The node's device: \"cpu\", \"cuda:0\".")
      .def_property_readonly("node_name", &PyClient::nodeName, "The node's name.")
      .def_property_readonly("memory_limit", &PyClient::memoryLimit,
                             "This session's memory limit (bytes; 0 = unlimited): the smaller nonzero of "
                             "its quota and the node's limit.")
      .def("resident_stat", &PyClient::residentStat,
           "{'current', 'peak', 'allocated', 'freed'}: this session's resident bytes on the node as of the "
           "last reply that reports them (put, free with a reply, a run, stats), their peak and running "
           "totals since connecting or the resets. No round trip.")
      .def("reset_resident_peak", &PyClient::resetResidentPeak, "The peak becomes the current bytes.")
      .def("reset_resident_accumulated", &PyClient::resetResidentAccumulated,
           "The running totals ('allocated', 'freed') start again at 0.")
      .def_property_readonly("address", &PyClient::address, "\"host:port\" of the node.")
      .def_readonly("completed_calls", &PyClient::completed_calls,
                    "How many put/get/register_graph/run_graph/run_graph_async/send_tensors calls returned.")
      .def_readwrite("last_result", &PyClient::last_result,
                     "The result of the last of those calls to return. When Ctrl-C arrives while a call "
                     "waits, Python raises KeyboardInterrupt as the call returns, after the node did the "
                     "work: the caller recovers the result here (genie.runtime.Runtime._request), and "
                     "sets it to None otherwise (so that it holds no tensor longer).")
      .def("put", returning(&PyClient::put), py::arg("items"), R"doc(
put(items: list[tuple[bytes, torch.Tensor, int]]) -> None

Stores CPU tensors on the node in one PutTensors: (16-byte handle, tensor, residency int), or
(handle, tensor, residency, co-location group str or None, the group's bytes int): the
scheduler's hint (schemas/genie.fbs Colocation; the node refuses a new group that does not fit
with OutOfMemory naming it, and keeps the tensor from SendTensors).
Any dtype with a wire dtype; shape, strides and storage_offset are kept: the bytes sent are the
storage span the view needs (storage_offset prefix included). One tensor is sent straight from
its storage; several from theirs, as one payload (no copy). Conjugate/negative views are resolved.
Raises TypeError/ValueError (not a CPU strided tensor, bad handle/residency), GenieRemoteError
(DuplicateHandle, OutOfMemory, TooLarge), GenieConnectionError.
)doc")
      .def("get", returning(&PyClient::get), py::arg("handles"), R"doc(
get(handles: list[bytes]) -> list[torch.Tensor]

Fetches resident tensors in one GetTensors: CPU tensors with the node's dtype, shape, strides
and storage_offset, wrapping the received buffer without a copy (the tensors of one call share
it: it is freed when the last of them is). Raises GenieRemoteError (UnknownHandle),
GenieConnectionError.
)doc")
      .def("free", &PyClient::free, py::arg("handles"), py::arg("wait") = false, R"doc(
free(handles: list[bytes], wait: bool = False) -> None

Frees resident tensors: one-way FreeTensors (want_reply=false), no round trip; unknown handles
are ignored by the node. With `wait`, waits for the node's Ack (a round trip), which reports
the session's resident bytes after the frees (resident_stat). Raises GenieConnectionError if
the connection is already gone.
)doc")
      .def("register_graph", returning(&PyClient::registerGraph), py::arg("graph"), R"doc(
register_graph(graph: bytes) -> bytes

Registers serialized Graph bytes (encode_graph) and returns the 16-byte graph id (XXH3-128 of
the bytes, computed by the node; registering the same bytes again is cheap). Raises
GenieRemoteError (InvalidMessage, UnknownOp, SchemaMismatch: op_index names the node).
)doc")
      .def("run_graph", returning(&PyClient::runGraph), py::arg("graph_id"), py::arg("inputs"), py::arg("scalars"),
           py::arg("outputs"), py::arg("free") = py::list(), R"doc(
run_graph(graph_id: bytes, inputs, scalars, outputs, free=[]) -> list

inputs:  list[tuple[int, bytes | torch.Tensor]]: (graph input index, 16-byte resident handle, or
         a small CPU tensor sent inline in the payload). Inputs bound in the graph
         (GraphInput.handle) may be left out.
scalars: list[tuple[int, int | float | bool]]: (scalar slot, value).
outputs: list[tuple[int, int, bytes | None, int]]: (value id, action, handle, residency);
         action 0 Return, 1 KeepResident, 2 ReturnAndKeep, 3 KeepAndDescribe (all but Return
         need a handle).
free:    list[bytes]: handles the node frees before binding the inputs (RunGraph.free).
Returns a list aligned with outputs: a CPU torch.Tensor (Return, ReturnAndKeep), a tuple
(dtype: torch.dtype, shape: tuple[int], strides: tuple[int], storage_offset: int)
(KeepAndDescribe), None (KeepResident). Raises GenieRemoteError (UnknownGraph, UnknownHandle,
TorchError with op_index/op_name, OutOfMemory), GenieConnectionError, TypeError/ValueError.
)doc")
      .def("run_graph_async", returning(&PyClient::runGraphAsync), py::arg("graph_id"), py::arg("inputs"), py::arg("scalars"),
           py::arg("outputs"), py::arg("free") = py::list(), R"doc(
run_graph_async(graph_id: bytes, inputs, scalars, outputs, free=[]) -> int

Sends a RunGraph like run_graph and returns its request id at once, without waiting for the
node (no round trip). Every output spec must be KeepResident (action 1): ValueError otherwise.
The node runs a session's requests in order, so the reply of any later call comes after this
run finished; its failure is reported by take_async_failures(). Raises GenieConnectionError
when the node is already unreachable.)doc")
      .def("take_async_failures", &PyClient::takeAsyncFailures, py::arg("wait") = true, R"doc(
take_async_failures(wait=True) -> list[tuple[int, GenieError]]

The asynchronous runs that failed since the last call: (request id, the exception that run
would have raised: GenieRemoteError naming the op, or GenieConnectionError). With wait, first
waits until every run sent so far is answered (at most the request timeout).)doc")
      .def("stats", &PyClient::stats, py::arg("parts") = py::list(), R"doc(
stats(parts=[]) -> dict: the node's statistics: sessions, resident ({residency name: bytes}),
graphs_cached, ops_executed, bytes_in, bytes_out (bytes), memory_limit (bytes, 0 = none),
uptime_us (µs), session_resident, device_free, device_total (bytes), package_calls,
executor_calls, packages_built, packages_loaded, compile_failures, cuda_graph_replays (compiled
parts; the last: package calls run as a replay of the package's CUDA graph),
peer_bytes_sent, peer_bytes_received (bytes, headers and payloads, this node sent to and
received from other nodes: send_tensors), peer_transfers (send_tensors this node served plus
those it received), colocation ({group: {"bytes": admitted with, "resident": bytes now}}: this
session's co-location groups), parts (one dict per compiled part of the graphs `parts` names,
16-byte graph ids, at most 1024: graph, inputs, state "package" / "building" / "executor",
package_calls, executor_calls, build_s (s; 0 when found in the node's cache), from_cache,
reason (why the executor runs it, or why a part that wants a CUDA graph has none),
cuda_graph_replays).
)doc")
      .def("send_tensors", returning(&PyClient::sendTensors), py::arg("peer"), py::arg("auth_token"),
           py::arg("peer_session"), py::arg("handles"), py::arg("peer_handles"), R"doc(
send_tensors(peer: str, auth_token: str, peer_session: bytes, handles: list[bytes], peer_handles: list[bytes]) -> None

Node to node: this client's node sends its resident tensors `handles` (16-byte handles of this
session) straight to the session `peer_session` (16 bytes: that session's Client.session_id) of
the node at `peer` ("host:port", as this client's node reaches it; `auth_token`: that node's
token), where they are stored under `peer_handles` (as many; chosen by the caller) with their
residency. The tensor bytes go from node to node; this client sends one small request and waits
for the node's Ack (blocks until every tensor is stored on the peer). The tensors arrive
contiguous (shape and dtype kept). Raises ValueError (counts differ, none, a handle not 16
bytes), GenieRemoteError: code "UnknownHandle" (a handle not in this session), "PeerUnreachable"
(the peer is down, refused the connection or died: within the transport's peer timeout, 2.25 s by
default; the message names `peer`), the peer's own code ("Unauthenticated" for a wrong token or
session id, "DuplicateHandle", "OutOfMemory"; message "SendTensors: peer HOST:PORT refused: ...");
GenieConnectionError when this client's own node is unreachable.
)doc")
      .def("ping", &PyClient::ping, "ping() -> float: one Ping/Pong round trip, in seconds.")
      .def("counters", &PyClient::counters, R"doc(
counters() -> dict: this client's cumulative traffic: bytes_sent, bytes_received (headers +
payloads of every message, bytes), messages_sent, round_trips (requests that waited for a reply),
async_runs (RunGraphs sent by run_graph_async), node_exec_us (the node's execution time of
every answered RunGraph, µs).
)doc")
      .def("close", &PyClient::close, "Says Goodbye and closes (idempotent; also done when the object dies).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyClient& self, py::args) { self.close(); })
      .def("__repr__", &PyClient::repr);

  bindGraphEncoder(m);
}

}  // namespace genie::python
