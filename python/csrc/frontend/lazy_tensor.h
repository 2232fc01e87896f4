// LazyTensor's TensorImpl: a tensor on remote_accelerator that owns no memory.
//
// Its key set is PrivateUse1's (QuantizedPrivateUse1's for a quantized dtype; plus the autograd
// and autocast keys every device tensor has) and holds no Python key, so an op on it passes autograd as on any device and reaches the
// recorder's PrivateUse1 kernel (dispatch_kernel.cc). It carries the geometry shape inference
// computed (sizes, strides, storage offset, dtype, conjugate and negative bits), a storage of
// the byte size that geometry needs at a device address of its own (device_storage.h; a view
// shares its base's storage, so `untyped_storage().data_ptr()` tells storages apart as on CUDA),
// and its recording state: the Value it holds now (in-place ops rebind it) and the Recording of
// its device.
//
// Lifetime without the GIL or the process lock: attaching a tensor to a value counts it
// (Value::tensors, Storage::live: atomics); the destructor hands the value to
// Recording::noteDead, which only queues it (its own mutex); the runtime counts it down at its
// next request. PyTorch's shallow copies (autograd's saved outputs, `detach` inside kernels)
// are tensors of their own on the same value.
//
// It derives from PyTorch's QTensorImpl, whose quantizer a quantized one holds (null for other
// dtypes): PyTorch's device-generic code reads a quantized tensor's quantizer by casting its
// TensorImpl to QTensorImpl (TensorBase::quantizer(), `_to_copy`), and so reads it right.
//
// Inference tensors: a view is an inference tensor exactly when its base is one, as PyTorch
// makes views (a slice of a module buffer taken in torch.inference_mode() stays a normal tensor).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/quantized/QTensorImpl.h>
#include <c10/core/TensorImpl.h>

#include "frontend/ir.h"
#include "frontend/shapes.h"

namespace genie::frontend {

class Recording;

class LazyTensorImpl final : public at::QTensorImpl {
 public:
  LazyTensorImpl(c10::Storage storage, caffe2::TypeMeta dtype, ValuePtr value, c10::intrusive_ptr<Recording> recording);
  ~LazyTensorImpl() override;

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                                              bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                                              bool allow_tensor_metadata_change) const override;
  /// `tensor.data = other` (VariableHooks::set_data): this tensor takes `other`'s geometry and
  /// holds its value (Module.half() converts parameters so). Takes the process lock.
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

  /// The value it holds now. Read under the process lock (an in-place op may rebind it).
  const ValuePtr& value() const { return value_; }
  Recording& recording() const { return *recording_; }
  const c10::intrusive_ptr<Recording>& recordingPtr() const { return recording_; }
  /// Holds `value` from now on: counted on it (and on its storage, if another), the old one
  /// counted down and queued for freeing if it was resident and nobody holds it. Under the
  /// process lock.
  void rebind(ValuePtr value);
  /// Gives it `desc`'s sizes, strides and offset (an out= op that resized it). The dtype cannot
  /// change: RuntimeError.
  void setGeometry(const Desc& desc);
  // quantizer() and set_quantizer_() (QTensorImpl): a quantized tensor's quantizer (per-tensor
  // affine, or unknown for `empty(dtype=quint8)`), what its q_scale, q_zero_point and qscheme
  // kernels answer (python/csrc/quantized.cc). Null for other dtypes.

 private:
  template <typename Version>
  c10::intrusive_ptr<c10::TensorImpl> copy(Version&& version_counter, bool allow_tensor_metadata_change) const;

  const char* tensorimpl_type_name() const override { return "LazyTensorImpl"; }

  ValuePtr value_;
  c10::intrusive_ptr<Recording> recording_;
};

/// The LazyTensorImpl of `tensor`, or nullptr for any other tensor.
LazyTensorImpl* lazyImpl(const at::Tensor& tensor);
inline bool isLazy(const at::Tensor& tensor) { return lazyImpl(tensor) != nullptr; }

/// A new LazyTensor holding `value` with geometry `desc` on `recording`'s device. `base`: the
/// tensor it is a view of (it shares its storage and inference status), or nullptr.
at::Tensor makeLazy(const ValuePtr& value, const Desc& desc, const c10::intrusive_ptr<Recording>& recording,
                    const at::Tensor* base);

}  // namespace genie::frontend
