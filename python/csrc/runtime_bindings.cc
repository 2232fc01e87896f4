// genie._C.DeviceRuntime and runtime_counters: the bindings of the device runtime
// (device_runtime.h). Every method takes the process lock; a python_error the runtime raises
// becomes the Python exception it holds.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include "bindings.h"
#include "device_runtime.h"
#include "frontend/lock.h"
#include "wire_tensors.h"

namespace genie::python {

using frontend::ValuePtr;

namespace {

py::object wrapTensor(at::Tensor t) { return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t))); }

std::vector<ValuePtr> valuesOf(const py::sequence& values) {
  std::vector<ValuePtr> out;
  out.reserve(values.size());
  for (py::handle v : values) out.push_back(py::cast<ValuePtr>(v));
  return out;
}

/// Runs `f` holding the process lock, with a python_error raised as the Python exception it holds.
template <typename F>
auto locked(F&& f) {
  try {
    frontend::LockGuard lock;
    return f();
  } catch (python_error& e) {
    e.restore();
    throw py::error_already_set();
  }
}

}  // namespace

void bindDeviceRuntime(py::module_& m) {
  py::class_<DeviceRuntime>(m, "DeviceRuntime", R"doc(One remote device's runtime in C++ (python/csrc/device_runtime.h):
its Recording, its node's client, the asynchronous runs in flight. Each read is one call.)doc")
      .def(py::init<frontend::RecordingPtr>(), py::arg("recording"))
      .def("attach", [](DeviceRuntime& r, py::handle client) { r.attach(sharedClientOf(client)); }, py::arg("client"),
           "Uses `client` (genie._C.Client: the session genie.connection opened) for this device's requests.")
      .def("detach", [](DeviceRuntime& r) { locked([&] { r.detach(); }); },
           "Drops the client (a lost connection, close); the runs in flight are forgotten.")
      .def_property_readonly("attached", &DeviceRuntime::attached)
      .def_readwrite("analyse_residency", &DeviceRuntime::analyse_residency,
                     "A structure's first cut goes to the policy's _cut_taken (genie.semantics' residency).")
      .def_readwrite("observe", &DeviceRuntime::observe, "Every cut goes to the policy's _cut_taken.")
      .def_readwrite("lineage", &DeviceRuntime::lineage,
                     "Graphs and runs go to the policy (_graph_registered, _ran, _runs_failed_after, _prune_lineage).")
      .def_readwrite("transfers_in_python", &DeviceRuntime::transfers_in_python,
                     "Reads and uploads go to genie.transfers (progress bars of module moves and large reads).")
      .def("upload", [](DeviceRuntime& r, const at::Tensor& host, int residency, py::object source) -> py::object {
        at::Tensor src = source.is_none() ? at::Tensor() : THPVariable_Unpack(source.ptr());
        std::optional<at::Tensor> out = locked([&] { return r.upload(host, static_cast<uint8_t>(residency), src); });
        if (!out) return py::none();
        return wrapTensor(std::move(*out));
      }, py::arg("host"), py::arg("residency"), py::arg("source") = py::none(),
         "upload(host, residency, source=None) -> Tensor | None: `host` on this device as .to() makes it: inline with "
         "the next run (an activation up to 64 KiB) or put on the node now (weights once per host bytes of `source`, "
         "or of `host`); None when Python moves it.")
      .def("put", [](DeviceRuntime& r, const at::Tensor& data, int residency, py::object storage, py::object source) {
        frontend::StoragePtr s = storage.is_none() ? frontend::StoragePtr() : storage.cast<frontend::StoragePtr>();
        at::Tensor src = source.is_none() ? at::Tensor() : THPVariable_Unpack(source.ptr());
        return locked([&] { return r.put(data, static_cast<uint8_t>(residency), std::move(s), src); });
      }, py::arg("data"), py::arg("residency"), py::arg("storage") = py::none(), py::arg("source") = py::none(),
         "put(data, residency, storage=None, source=None) -> Value: `data` put on the node now (one PutTensors), "
         "resident on `storage` (None: a new one); a weight put before from `source`'s host bytes is not put again.")
      .def_readwrite("max_in_flight", &DeviceRuntime::max_in_flight,
                     "Asynchronous runs outstanding before the program waits for them.")
      .def("materialize", [](DeviceRuntime& r, py::sequence returned, py::sequence described) {
        auto results = locked([&] { return r.materialize(valuesOf(returned), valuesOf(described)); });
        py::list tensors, descs;
        for (at::Tensor& t : results.returned) tensors.append(wrapTensor(std::move(t)));
        for (const auto& d : results.described) descs.append(describe(d));
        return py::make_tuple(tensors, descs);
      }, py::arg("returned"), py::arg("described"),
         "materialize(returned: list[Value], described: list[Value]) -> (list[Tensor], list[(dtype, shape, strides, "
         "offset)]): one request running the live pending graph; the host tensors of `returned` and the descriptors of "
         "`described` (kept resident), in their orders. Raises a lost input's error, the node's GenieRemoteError, "
         "GenieConnectionError.")
      .def("materialize_async", [](DeviceRuntime& r) { locked([&] { r.materializeAsync(); }); },
           "Sends the live pending graph as an asynchronous run; its errors are raised at the next request that waits.")
      .def("run_pending", [](DeviceRuntime& r) { locked([&] { r.runPending(); }); },
           "The pending graph passed max_pending (runs now) or async_chunk (an asynchronous run).")
      .def("fetch", [](DeviceRuntime& r, const at::Tensor& t) -> py::object {
        std::optional<at::Tensor> out = locked([&] { return r.fetch(t); });
        if (!out) return py::none();
        return wrapTensor(std::move(*out));
      }, py::arg("tensor"),
         "fetch(tensor) -> Tensor | None: the device tensor's values on the host (one request at most); None when "
         "Python reads it (lost, quantized, a read with a progress bar, small resident values to read first).")
      .def("reap_async", [](DeviceRuntime& r, py::sequence sent_after) -> py::object {
        PyObject* failed = locked([&] { return r.reapAsync(valuesOf(sent_after)); });
        if (failed == nullptr) return py::none();
        return py::reinterpret_steal<py::object>(failed);
      }, py::arg("sent_after") = py::list(),
         "Waits for the asynchronous runs; the first failure (its values, later runs' and `sent_after` lost with "
         "it), or the deferred error, or None.")
      .def("forget_in_flight", [](DeviceRuntime& r) { r.forgetInFlight(); },
           "Forgets the runs in flight and the deferred error (a lost node, a fork).")
      .def_property_readonly("busy", &DeviceRuntime::busy,
                             "True while asynchronous runs are in flight or an error of one waits to be raised.")
      .def_property_readonly("in_flight", &DeviceRuntime::inFlight,
                             "The request ids of the asynchronous runs in flight, in send order.")
      .def_property_readonly("deferred", [](const DeviceRuntime& r) -> py::object {
        if (r.deferred() == nullptr) return py::none();
        return py::reinterpret_borrow<py::object>(r.deferred());
      }, "The error of an asynchronous run's preparation, raised at the next request that waits; or None.");
  m.def("runtime_counters", [] {
    const RuntimeCounters c = runtimeCounters();
    py::dict out;
    out["policy_calls"] = c.policy_calls;
    out["gil_acquisitions"] = c.gil_acquisitions;
    out["wait_ns"] = c.wait_ns;
    out["requests"] = c.requests;
    out["cut_ns"] = c.cut_ns;
    out["materialize_ns"] = c.materialize_ns;
    return out;
  }, "runtime_counters() -> dict: process-wide counts: policy_calls (calls from C++ into genie.runtime), "
     "gil_acquisitions (the GIL taken by the runtime and the recorder's kernel), wait_ns (waiting for replies, ns), "
     "requests (requests that waited), cut_ns (in the cut's passes, ns), materialize_ns (in materialize, waits "
     "included, ns).");
}

}  // namespace genie::python
