// Tensors and statuses at the client's edge, shared by the Client binding (module.cc) and the
// device runtime (device_runtime.h): CPU tensors as the wire's descriptors and payload spans
// (no copy), a reply's tensors as CPU tensors over its payload buffer (no copy), and a failed
// Status as the genie.errors exception it becomes in Python.
#pragma once

#include <pybind11/pybind11.h>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "genie/client/client.h"
#include "genie/status.h"
#include "genie/transport/types.h"
#include "genie/wire/codec.h"

namespace genie::python {

namespace py = pybind11;

// ---- errors (GIL held) ----

/// The class `name` of genie.errors, or RuntimeError when that module cannot be imported.
py::object errorClass(const char* name);
/// The genie.errors exception for a failed status:
///   kPeerUnreachable, kTimeout -> GenieConnectionError (the message names `address`, host:port)
///   kRemote (the node's Error) -> genie.errors.remote_error(...): a GenieRemoteError that is also
///                                 the class eager raises for the op's C++ exception (IndexError, ...)
///   anything else              -> GenieError
py::object errorOf(const Status& status, const std::string& address);
/// Raises errorOf(status, address) as a Python exception (py::error_already_set).
[[noreturn]] void raiseStatus(const Status& status, const std::string& address);

// ---- tensors ----

/// A CPU tensor's wire descriptor and the storage span that travels for it.
struct OutgoingTensor {
  at::Tensor tensor;  // keeps the bytes alive while they are sent
  wire::TensorDescArgs desc;
  const std::byte* bytes = nullptr;  // element 0 of the storage span (storage_offset prefix included)
  uint64_t nbytes = 0;
};

/// `t` as it travels: a CPU strided tensor with a wire dtype (conjugate and negative bits
/// resolved). py::value_error / py::type_error naming `what` otherwise. No GIL needed.
OutgoingTensor outgoingOf(at::Tensor t, const std::string& what);
/// The same for a Python object (TypeError when it is not a torch.Tensor). GIL held.
OutgoingTensor outgoingOf(py::handle obj, const std::string& what);
/// The payload of several tensors as the parts it is sent in: each tensor's storage span at
/// its PayloadLayout offset, the padding between them read from a zeroed buffer. No copy.
std::vector<transport::ConstBuffer> payloadParts(std::span<const OutgoingTensor> tensors,
                                                 std::span<const uint64_t> offsets);
/// Lays tensors out in one payload (PayloadLayout offsets) and copies their storage spans into
/// it (small inline inputs of a RunGraph). Call without the GIL.
std::vector<std::byte> gatherPayload(std::span<const OutgoingTensor> tensors, std::span<const uint64_t> offsets,
                                     uint64_t size);
/// A RunGraph's arguments with its inline tensors (small inputs: copied into the message's
/// payload at their PayloadLayout offsets).
struct RunRequest {
  wire::RunGraphArgs run;
  std::vector<OutgoingTensor> inline_tensors;
  std::vector<uint64_t> offsets;
  wire::PayloadLayout layout;
  /// Adds `tensor` as an inline input; returns its slot in the payload.
  wire::TensorSlotArgs addInline(OutgoingTensor tensor);
  std::vector<std::byte> payload() const { return gatherPayload(inline_tensors, offsets, layout.size()); }
};

/// Row-major strides of `shape` (elements).
std::vector<int64_t> contiguousStrides(const std::vector<int64_t>& shape);
/// The torch dtype of a wire dtype; py::value_error for one torch lacks.
c10::ScalarType scalarTypeOf(wire::DType dtype);
/// A CPU tensor over tensor i's bytes in a reply's payload (no copy: the tensor's deleter holds
/// the payload buffer, shared by every tensor of that reply). No GIL needed.
at::Tensor tensorOf(const client::TensorBatch& batch, size_t i);
/// The torch.dtype object of a wire dtype (GIL held).
py::object dtypeObject(wire::DType dtype);
/// (dtype, shape, strides, storage_offset) of a KeepAndDescribe output (GIL held).
py::tuple describe(const wire::TensorDescArgs& desc);

}  // namespace genie::python
