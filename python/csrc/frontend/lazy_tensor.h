// A tensor on remote_accelerator: a plain TensorImpl whose Genie state is its BackendMeta.
//
// A device tensor is a c10::TensorImpl (an at::QTensorImpl for a quantized dtype, as the CPU's
// quantized tensors are) with PrivateUse1's keys (QuantizedPrivateUse1's for a quantized dtype;
// plus the autograd and autocast keys every device tensor has) and no Python key, so an op on it
// passes autograd as on any device and reaches the recorder's PrivateUse1 kernel
// (dispatch_kernel.cc), and its Python object is a plain torch.Tensor (or the nn.Parameter it
// was made as). It carries the geometry shape inference computed (sizes, strides, storage
// offset, dtype, conjugate and negative bits) and a storage of the byte size that geometry needs
// at a device address of its own (device_storage.h; a view shares its base's storage).
//
// Its Genie state, a LazyState, is the TensorImpl's BackendMeta (c10::ExtraMeta): the Value it
// holds now (in-place ops rebind it) and the Recording of its device. PyTorch carries the
// BackendMeta over every shallow copy: TensorImpl::copy_tensor_metadata clones the ExtraMeta,
// whose copy calls LazyState::clone, which makes a new state on the same value. So `detach`,
// `tensor.data`, autograd's saved tensors and `param.data = t` (Module._apply keeps each
// Parameter and swaps its data, VariableHooks::set_data -> shallow_copy_from) all give tensors
// of their own on the same value, whatever TensorImpl class receives them. Nothing of Genie lives
// in the fields of a TensorImpl subclass.
//
// Lifetime without the GIL or the process lock: a LazyState counts itself on its value
// (Value::tensors, Storage::live: atomics); its destructor hands the value to
// Recording::noteDead, which only queues it (its own mutex); the runtime counts it down at its
// next request.
//
// Inference tensors: a view is an inference tensor exactly when its base is one, as PyTorch
// makes views (a slice of a module buffer taken in torch.inference_mode() stays a normal tensor).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include "frontend/ir.h"
#include "frontend/shapes.h"

namespace genie::frontend {

class Recording;

/// The Genie state of one device tensor (its TensorImpl's BackendMeta; see the top of this file).
class LazyState final : public c10::BackendMeta {
 public:
  LazyState(ValuePtr value, c10::intrusive_ptr<Recording> recording);
  ~LazyState() override;
  /// A shallow copy of the tensor (copy_tensor_metadata): a new state on the same value. Takes
  /// the process lock (another thread's in-place op may rebind this one).
  c10::intrusive_ptr<c10::BackendMeta> clone(const c10::intrusive_ptr<c10::BackendMeta>& self) const override;

  /// The value it holds now. Read under the process lock (an in-place op may rebind it).
  const ValuePtr& value() const { return value_; }
  Recording& recording() const { return *recording_; }
  const c10::intrusive_ptr<Recording>& recordingPtr() const { return recording_; }
  /// Holds `value` from now on: counted on it (and on its storage, if another), the old one
  /// counted down and queued for freeing if it was resident and nobody holds it. Under the
  /// process lock.
  void rebind(ValuePtr value);

 private:
  ValuePtr value_;
  c10::intrusive_ptr<Recording> recording_;
};

/// The LazyState of `tensor`, or nullptr for any other tensor.
LazyState* lazyState(const at::Tensor& tensor);
inline bool isLazy(const at::Tensor& tensor) { return lazyState(tensor) != nullptr; }

/// A new device tensor holding `value` with geometry `desc` on `recording`'s device. `base`: the
/// tensor it is a view of (it shares its storage when that covers the geometry, and its inference
/// status), or nullptr. A tensor with a storage of its own gets a new one, which holds `value`
/// (device_storage.h). Under the process lock.
at::Tensor makeLazy(const ValuePtr& value, const Desc& desc, const c10::intrusive_ptr<Recording>& recording,
                    const at::Tensor* base);
/// The same on an existing storage (`torch.UntypedStorage` read as a tensor). Under the process lock.
at::Tensor makeLazyOn(const ValuePtr& value, const Desc& desc, const c10::intrusive_ptr<Recording>& recording,
                      c10::Storage storage);

/// Gives device tensor `tensor` `desc`'s sizes, strides and offset (an out= op that resized it;
/// a storage it outgrew moves to a new address range, which holds the tensor's value). The dtype
/// cannot change: RuntimeError. Under the process lock.
void setGeometry(const at::Tensor& tensor, const Desc& desc);

/// aten::_has_compatible_shallow_copy_type(self, from) for PrivateUse1: PyTorch's rule
/// (TensorImpl::has_compatible_shallow_copy_type) with remote_accelerator among the dense
/// backends, so that a dense CPU tensor and a dense device tensor may take each other's data
/// (`param.data = t`, Module._apply), as a CPU and a CUDA tensor may.
bool hasCompatibleShallowCopyType(const at::Tensor& self, const at::Tensor& from);

}  // namespace genie::frontend
