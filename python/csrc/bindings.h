// Shared pieces of the genie._C extension (python/csrc): one function per file that adds its
// bindings to the module, and the conversions both use. Handles and graph ids cross into
// Python as 16 bytes: `hi` big-endian, then `lo` big-endian, so bytes.hex() equals
// wire::toString().
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "genie/wire/genie_generated.h"

namespace genie::python {

namespace py = pybind11;

/// encode_graph, TensorRef, ScalarSlot (graph_encoder.cc).
void bindGraphEncoder(py::module_& m);
/// make_wrapper: a LazyTensor's tensor object without _make_wrapper_subclass (lazy_wrapper.cc).
void bindLazyWrapper(py::module_& m);
/// A LazyTensor's recording state, held by its TensorImpl (lazy_wrapper.cc: LazyTensorImpl), so
/// that PyTorch's shallow copies of the tensor (detach, autograd's saved tensors, set_data) carry
/// it. Strong references, touched with the GIL held: `cell` (a genie.lazy.Cell: the tensor's
/// current genie.graph.Value), `runtime` (its genie.runtime.Runtime), `desc` ((shape, strides,
/// offset, dtype), the shape-cache key part). All null until the recorder attaches them.
struct LazyState {
  PyObject* cell = nullptr;
  PyObject* runtime = nullptr;
  PyObject* desc = nullptr;
};
/// The state of `tensor` (a torch.Tensor object) when its TensorImpl is a LazyTensor's, else
/// nullptr (no Python error set). lazy_wrapper.cc.
LazyState* lazyStateOf(PyObject* tensor);
/// Attaches `copy` to the value `source` holds now, counted as one more tensor on it (a new
/// Cell, registered with the runtime): a shallow copy of a LazyTensor. False with a Python
/// error set on failure. recorder_fast.cc.
bool attachCopy(const LazyState& source, LazyState& copy);
/// The tensor of `state` died: its value is queued as dead in its runtime, and the references
/// are dropped. recorder_fast.cc; with the GIL held, never raises.
void releaseState(LazyState& state);
/// make_wrapper's implementation, for C++ callers: the same arguments, a new reference or
/// nullptr with a Python error set (lazy_wrapper.cc).
PyObject* makeWrapperFast(PyObject* const* args, Py_ssize_t nargs);
/// record_single, prepare_fast, make_lazy, configure_recorder: the recorder's hot path (recorder_fast.cc).
void bindRecorderFast(py::module_& m);
/// recorder_fast.cc's record_single(func, args, kwargs) for C++ callers: the recorded result,
/// the prepared call (a tuple) for the Python recorder, or NotImplemented; nullptr with a Python
/// error set on failure. With the GIL and the process lock held.
PyObject* recordCall(PyObject* func, PyObject* args, PyObject* kwargs);
/// configure_fallback, register_recorder_kernels, recorder_counters: the PrivateUse1 kernel
/// (dispatch_fallback.cc).
void bindDispatchFallback(py::module_& m);
/// live_nodes, lower, configure_cut: the cut of the pending graph (cut_fast.cc).
void bindCutFast(py::module_& m);
/// The number of remote_accelerator devices c10 reports (device_guard.cc).
void setDeviceCount(int count);
/// This thread's current remote_accelerator device, as c10's device guard keeps it (device_guard.cc).
int currentDevice();
/// Makes `index` this thread's current device; c10::Error (a RuntimeError) past the device count.
void setCurrentDevice(int index);

/// The Python type name of `obj` ("int", "Tensor").
inline std::string typeName(py::handle obj) { return Py_TYPE(obj.ptr())->tp_name; }

/// 16 bytes -> Handle or GraphId. TypeError/ValueError naming `what` otherwise.
template <typename Id>
Id idOf(py::handle obj, const std::string& what) {
  if (!PyBytes_Check(obj.ptr())) {
    throw py::type_error(what + ": expected 16 bytes, got " + typeName(obj));
  }
  char* data = nullptr;
  Py_ssize_t size = 0;
  PyBytes_AsStringAndSize(obj.ptr(), &data, &size);
  if (size != 16) throw py::value_error(what + ": expected 16 bytes, got " + std::to_string(size));
  uint64_t hi = 0, lo = 0;
  for (int i = 0; i < 8; ++i) hi = (hi << 8) | static_cast<uint8_t>(data[i]);
  for (int i = 8; i < 16; ++i) lo = (lo << 8) | static_cast<uint8_t>(data[i]);
  return Id(hi, lo);
}

/// Handle or GraphId -> 16 bytes.
template <typename Id>
py::bytes bytesOfId(const Id& id) {
  char data[16];
  for (int i = 0; i < 8; ++i) data[i] = static_cast<char>(id.hi() >> (56 - 8 * i));
  for (int i = 0; i < 8; ++i) data[8 + i] = static_cast<char>(id.lo() >> (56 - 8 * i));
  return py::bytes(data, 16);
}

}  // namespace genie::python
