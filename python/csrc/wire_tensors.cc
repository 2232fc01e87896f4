// See wire_tensors.h.
#include "wire_tensors.h"

#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <cstring>
#include <memory>

#include "bindings.h"
#include "genie/wire/torch_dtype.h"

namespace genie::python {

// ---- errors -----------------------------------------------------------------------------

/// The class `name` of genie.errors, or RuntimeError when that module cannot be imported.
py::object errorClass(const char* name) {
  try {
    return py::module_::import("genie.errors").attr(name);
  } catch (py::error_already_set&) {
    return py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  }
}

/// The genie.errors exception for a failed status. Call with the GIL held. A kRemote status
/// with the node's RemoteDetail becomes genie.errors.remote_error(...): a GenieRemoteError that
/// is also the Python class eager raises for the op's C++ exception (IndexError, ...).
py::object errorOf(const Status& status, const std::string& address) {
  std::string message = status.message();
  switch (status.code()) {
    case StatusCode::kPeerUnreachable:
    case StatusCode::kTimeout:
      if (message.find(address) == std::string::npos) message = "genie-node " + address + ": " + message;
      return errorClass("GenieConnectionError")(message);
    case StatusCode::kRemote: {
      // Every kRemote status carries the node's detail (wire::remoteStatus).
      py::object make = errorClass("remote_error");
      const RemoteDetail* remote = status.remote();
      if (make.ptr() == PyExc_RuntimeError || remote == nullptr) return make(message);
      return make(message, py::arg("code") = std::string(wire::errorCodeName(static_cast<wire::ErrorCode>(remote->code))),
                  py::arg("op_index") = remote->op_index, py::arg("op_name") = remote->op_name,
                  py::arg("node_message") = remote->message, py::arg("error_class") = remote->error_class);
    }
    default:
      return errorClass("GenieError")(std::string(statusCodeName(status.code())) + ": " + message);
  }
}

/// Raises errorOf(status, ...).
[[noreturn]] void raiseStatus(const Status& status, const std::string& address) {
  py::object error = errorOf(status, address);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

// ---- tensors ----------------------------------------------------------------------------

OutgoingTensor outgoingOf(py::handle obj, const std::string& what) {
  if (!THPVariable_Check(obj.ptr())) throw py::type_error(what + ": expected a torch.Tensor, got " + typeName(obj));
  return outgoingOf(THPVariable_Unpack(obj.ptr()), what);
}

OutgoingTensor outgoingOf(at::Tensor t, const std::string& what) {
  if (!t.defined()) throw py::value_error(what + ": an undefined tensor");
  if (!t.device().is_cpu()) {
    throw py::value_error(what + ": a tensor on " + t.device().str() + "; genie._C sends CPU tensors");
  }
  if (t.layout() != c10::kStrided) throw py::value_error(what + ": only strided (dense) tensors can be sent");
  const wire::DType dtype = wire::wireDTypeOf(t.scalar_type());
  if (dtype == wire::DType::Undefined) {
    throw py::type_error(what + ": dtype " + std::string(c10::toString(t.scalar_type())) + " has no wire dtype");
  }
  if (t.is_conj() || t.is_neg()) t = t.resolve_conj().resolve_neg();  // the bytes must hold the values
  OutgoingTensor out;
  out.desc.dtype = dtype;
  out.desc.shape.assign(t.sizes().begin(), t.sizes().end());
  if (!t.is_contiguous()) out.desc.strides.assign(t.strides().begin(), t.strides().end());
  out.desc.storage_offset = t.storage_offset();
  auto nbytes = wire::tensorSpanBytes(dtype, out.desc.shape, out.desc.strides, out.desc.storage_offset);
  if (!nbytes) throw py::value_error(what + ": " + nbytes.status().message());
  out.nbytes = *nbytes;
  if (out.nbytes > 0) {
    out.bytes = static_cast<const std::byte*>(t.const_data_ptr()) - t.storage_offset() * static_cast<int64_t>(t.itemsize());
  }
  out.tensor = std::move(t);
  return out;
}

/// The payload of several tensors as the parts it is sent in: each tensor's storage span at
/// its PayloadLayout offset, the padding between them read from a zeroed buffer. No copy.
std::vector<transport::ConstBuffer> payloadParts(std::span<const OutgoingTensor> tensors,
                                                 std::span<const uint64_t> offsets) {
  static const std::array<std::byte, wire::kPayloadAlignment> kPadding{};
  std::vector<transport::ConstBuffer> parts;
  uint64_t at = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (offsets[i] > at) parts.push_back({kPadding.data(), offsets[i] - at});  // < kPayloadAlignment
    if (tensors[i].nbytes) parts.push_back({tensors[i].bytes, tensors[i].nbytes});
    at = offsets[i] + tensors[i].nbytes;
  }
  return parts;
}

/// Lays tensors out in one payload (PayloadLayout offsets) and copies their storage spans
/// into it (small inline inputs of a RunGraph). Call without the GIL.
std::vector<std::byte> gatherPayload(std::span<const OutgoingTensor> tensors, std::span<const uint64_t> offsets,
                                     uint64_t size) {
  std::vector<std::byte> payload(size);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].nbytes) std::memcpy(payload.data() + offsets[i], tensors[i].bytes, tensors[i].nbytes);
  }
  return payload;
}

wire::TensorSlotArgs RunRequest::addInline(OutgoingTensor tensor) {
  wire::TensorSlotArgs slot;
  slot.desc = tensor.desc;
  slot.payload_offset = layout.add(tensor.nbytes);
  offsets.push_back(slot.payload_offset);
  inline_tensors.push_back(std::move(tensor));
  return slot;
}

std::vector<int64_t> contiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * std::max<int64_t>(shape[i], 1);
  return strides;
}

c10::ScalarType scalarTypeOf(wire::DType dtype) {
  auto type = wire::torchScalarType(dtype);
  if (!type) throw py::value_error("the node sent a tensor of wire dtype " + std::string(wire::dtypeName(dtype)));
  return *type;
}

/// A CPU tensor over tensor i's bytes in the reply's payload (no copy: the tensor's deleter
/// holds the payload buffer, shared by every tensor of that reply).
at::Tensor tensorOf(const client::TensorBatch& batch, size_t i) {
  const wire::TensorDescArgs& desc = batch.tensors[i].desc;
  const auto options = at::TensorOptions().dtype(scalarTypeOf(desc.dtype)).device(c10::kCPU);
  const std::vector<int64_t> strides = desc.strides.empty() ? contiguousStrides(desc.shape) : desc.strides;
  if (batch.nbytesOf(i) == 0) return at::empty_strided(desc.shape, strides, options);
  std::shared_ptr<std::byte> holder = batch.payload.data;
  return at::for_blob(batch.payload.data.get() + batch.tensors[i].payload_offset, desc.shape)
      .strides(strides)
      .storage_offset(desc.storage_offset)
      .deleter([holder](void*) {})
      .options(options)
      .make_tensor();
}

py::object dtypeObject(wire::DType dtype) {
  return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(scalarTypeOf(dtype))));
}

/// (dtype, shape, strides, storage_offset) of a KeepAndDescribe output.
py::tuple describe(const wire::TensorDescArgs& desc) {
  const std::vector<int64_t> strides = desc.strides.empty() ? contiguousStrides(desc.shape) : desc.strides;
  return py::make_tuple(dtypeObject(desc.dtype), py::tuple(py::cast(desc.shape)), py::tuple(py::cast(strides)),
                        desc.storage_offset);
}


}  // namespace genie::python
