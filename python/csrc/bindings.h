// Shared pieces of the genie._C extension (python/csrc): one function per file that adds its
// bindings to the module, and the conversions both use. Handles and graph ids cross into
// Python as 16 bytes: `hi` big-endian, then `lo` big-endian, so bytes.hex() equals
// wire::toString().
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/dispatch/Dispatcher.h>

#include "genie/wire/genie_generated.h"

namespace torch {
class Library;
}
namespace genie::client {
class Client;
}

namespace genie::python {

namespace py = pybind11;

/// encode_graph, TensorRef, ScalarSlot (graph_encoder.cc).
void bindGraphEncoder(py::module_& m);
/// configure_recorder, register_recorder_kernels, record_op, recorder_counters, PartCall: the
/// recorder's PrivateUse1 kernel and its Python entries (dispatch_kernel.cc).
void bindDispatchKernel(py::module_& m);
/// Node, Value, Storage, Recording, Cut, the LazyTensor state functions and the process lock
/// (frontend_bindings.cc).
void bindFrontend(py::module_& m);
/// sparse_set_parts, and the SparsePrivateUse1 kernels of PyTorch's device-generic sparse COO
/// functions (sparse.cc).
void bindSparse(py::module_& m);
/// DeviceRuntime and runtime_counters (device_runtime.cc).
void bindDeviceRuntime(py::module_& m);
/// The C++ client of a genie._C.Client (module.cc); TypeError for another object.
std::shared_ptr<client::Client> sharedClientOf(py::handle client);
/// The QuantizedPrivateUse1 kernels that read a quantized LazyTensor's quantizer (q_scale,
/// q_zero_point, qscheme, quantizer, set_quantizer_: quantized.cc), registered with the
/// recorder's kernels (register_recorder_kernels).
std::unique_ptr<torch::Library> quantizedKernels();
/// The operator of an OpOverload (torch.ops.aten.add.Tensor), found by its schema's name;
/// ValueError when none is registered (frontend_bindings.cc).
c10::OperatorHandle operatorOf(py::handle func);
/// The number of remote_accelerator devices c10 reports (device_guard.cc).
void setDeviceCount(int count);
/// This thread's current remote_accelerator device, as c10's device guard keeps it (device_guard.cc).
int currentDevice();
/// Makes `index` this thread's current device; c10::Error (a RuntimeError) past the device count.
void setCurrentDevice(int index);

/// Installs genie.device's accelerator hooks, which torch.accelerator reaches through the
/// device guard (synchronize) and the device allocator (resident_stat, reset_peak_memory_stats,
/// reset_accumulated_memory_stats, empty_cache, mem_get_info) (device_guard.cc).
void setAcceleratorHooks(py::object hooks);

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
