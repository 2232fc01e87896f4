#include "frontend/lazy_tensor.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <typeinfo>

#include "frontend/device_storage.h"
#include "frontend/lock.h"
#include "frontend/recording.h"

namespace genie::frontend {
namespace {

void attach(Value& value) {
  value.tensors.fetch_add(1, std::memory_order_relaxed);
  value.storage->live.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

LazyTensorImpl::LazyTensorImpl(c10::Storage storage, caffe2::TypeMeta dtype, ValuePtr value,
                               c10::intrusive_ptr<Recording> recording)
    : at::QTensorImpl(std::move(storage),
                      c10::DispatchKeySet(c10::isQIntType(dtype.toScalarType()) ? c10::DispatchKey::QuantizedPrivateUse1
                                                                                : c10::DispatchKey::PrivateUse1),
                      dtype, /*quantizer=*/nullptr),
      value_(std::move(value)),
      recording_(std::move(recording)) {
  if (value_) attach(*value_);
  recording_->live_tensors.fetch_add(1, std::memory_order_relaxed);
}

LazyTensorImpl::~LazyTensorImpl() {
  recording_->live_tensors.fetch_sub(1, std::memory_order_relaxed);
  if (value_) recording_->noteDead(std::move(value_));
}

template <typename Version>
c10::intrusive_ptr<c10::TensorImpl> LazyTensorImpl::copy(Version&& version_counter,
                                                         bool allow_tensor_metadata_change) const {
  ValuePtr value;
  {
    LockGuard lock;  // value_ may be rebound by another thread's in-place op
    value = value_;
  }
  auto impl = c10::make_intrusive<LazyTensorImpl>(storage(), dtype(), std::move(value), recording_);
  impl->set_quantizer_(const_cast<LazyTensorImpl*>(this)->quantizer());
  c10::TensorImpl::copy_tensor_metadata(this, impl.get(), std::forward<Version>(version_counter), allow_tensor_metadata_change);
  impl->refresh_numel();
  impl->refresh_contiguous();
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> LazyTensorImpl::shallow_copy_and_detach(
    const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const {
  return copy(version_counter, allow_tensor_metadata_change);
}

c10::intrusive_ptr<c10::TensorImpl> LazyTensorImpl::shallow_copy_and_detach(
    c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const {
  return copy(std::move(version_counter), allow_tensor_metadata_change);
}

void LazyTensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  auto* other = dynamic_cast<LazyTensorImpl*>(impl.get());
  TORCH_CHECK(other != nullptr && other->recording_.get() == recording_.get(), "data: cannot give a tensor on ",
              device(), " the data of a tensor on ", impl->device());
  c10::TensorImpl::copy_tensor_metadata(impl.get(), this, version_counter(), allow_tensor_metadata_change());
  set_quantizer_(other->quantizer());
  refresh_numel();
  refresh_contiguous();
  LockGuard lock;
  ValuePtr value = other->value_;
  if (value.get() != value_.get()) rebind(std::move(value));
}

void LazyTensorImpl::rebind(ValuePtr value) {
  value->tensors.fetch_add(1, std::memory_order_relaxed);
  if (value_ && value_->storage.get() != value->storage.get()) {  // tensor.data = other, a deduplicated weight
    value_->storage->live.fetch_sub(1, std::memory_order_relaxed);
    value->storage->live.fetch_add(1, std::memory_order_relaxed);
  }
  ValuePtr old = std::exchange(value_, std::move(value));
  if (old) recording_->released(std::move(old));
}

void LazyTensorImpl::setGeometry(const Desc& desc) {
  TORCH_CHECK(desc.dtype == dtype().toScalarType(), "an out= op changed the dtype of a remote_accelerator tensor (",
              dtype().toScalarType(), " -> ", desc.dtype, ")");
  set_sizes_and_strides(desc.sizes, desc.strides, desc.offset);
  // A resize that grows past the storage moves it to a new address range, as a resize on the CPU
  // reallocates: its nbytes stay what the geometry needs (untyped_storage().nbytes(), set_).
  const size_t nbytes =
      at::detail::computeStorageNbytes(desc.sizes, desc.strides, c10::elementSize(desc.dtype), desc.offset);
  if (has_storage() && nbytes > storage().nbytes()) {
    c10::Storage grown = newDeviceStorage(nbytes, device());
    c10::StorageImpl* impl = storage().unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(std::move(grown.unsafeGetStorageImpl()->mutable_data_ptr()));
    impl->set_nbytes(nbytes);
  }
}

LazyTensorImpl* lazyImpl(const at::Tensor& tensor) {
  if (!tensor.defined()) return nullptr;
  c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  if (impl->device_type() != c10::DeviceType::PrivateUse1 || typeid(*impl) != typeid(LazyTensorImpl)) return nullptr;
  return static_cast<LazyTensorImpl*>(impl);
}

at::Tensor makeLazy(const ValuePtr& value, const Desc& desc, const c10::intrusive_ptr<Recording>& recording,
                    const at::Tensor* base) {
  const c10::Device device = recording->device();
  const auto itemsize = static_cast<size_t>(c10::elementSize(desc.dtype));
  const size_t nbytes = desc.contiguous ? at::detail::computeStorageNbytesContiguous(desc.sizes, itemsize)
                                        : at::detail::computeStorageNbytes(desc.sizes, desc.strides, itemsize, desc.offset);
  // A view shares its base's storage when the base's covers it, and its inference status.
  std::optional<c10::InferenceMode> mode;
  c10::Storage storage;
  if (base != nullptr && base->defined()) {
    const bool base_inference = base->is_inference();
    if (base_inference != c10::InferenceMode::is_enabled()) mode.emplace(base_inference);
    if (base->has_storage() && base->device() == device && base->storage().nbytes() >= nbytes) storage = base->storage();
  }
  if (!storage) storage = newDeviceStorage(nbytes, device);
  at::Tensor tensor =
      at::detail::make_tensor<LazyTensorImpl>(std::move(storage), c10::scalarTypeToTypeMeta(desc.dtype), value, recording);
  auto* impl = tensor.unsafeGetTensorImpl();
  if (desc.contiguous) {
    impl->set_sizes_contiguous(desc.sizes);
  } else {
    impl->set_sizes_and_strides(desc.sizes, desc.strides, desc.offset);
  }
  if (desc.conj) impl->_set_conj(true);
  if (desc.neg) impl->_set_neg(true);
  if (desc.quantizer) static_cast<LazyTensorImpl*>(impl)->set_quantizer_(desc.quantizer);
  return tensor;
}

}  // namespace genie::frontend
