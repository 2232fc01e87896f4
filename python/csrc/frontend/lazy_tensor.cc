#include "frontend/lazy_tensor.h"

#include <ATen/EmptyTensor.h>
#include <ATen/quantized/QTensorImpl.h>
#include <c10/core/InferenceMode.h>

#include <atomic>
#include <optional>
#include <typeinfo>
#include <utility>

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

LazyState::LazyState(ValuePtr value, c10::intrusive_ptr<Recording> recording)
    : value_(std::move(value)), recording_(std::move(recording)) {
  if (value_) attach(*value_);
  recording_->live_tensors.fetch_add(1, std::memory_order_relaxed);
}

LazyState::~LazyState() {
  recording_->live_tensors.fetch_sub(1, std::memory_order_relaxed);
  if (value_) recording_->noteDead(std::move(value_));
}

c10::intrusive_ptr<c10::BackendMeta> LazyState::clone(const c10::intrusive_ptr<c10::BackendMeta>& /*self*/) const {
  ValuePtr value;
  {
    LockGuard lock;  // value_ may be rebound by another thread's in-place op
    value = value_;
  }
  return c10::make_intrusive<LazyState>(std::move(value), recording_);
}

void LazyState::rebind(ValuePtr value) {
  value->tensors.fetch_add(1, std::memory_order_relaxed);
  if (value_ && value_->storage.get() != value->storage.get()) {  // tensor.data = other, a deduplicated weight
    value_->storage->live.fetch_sub(1, std::memory_order_relaxed);
    value->storage->live.fetch_add(1, std::memory_order_relaxed);
  }
  ValuePtr old = std::exchange(value_, std::move(value));
  if (old) recording_->released(std::move(old));
}

LazyState* lazyState(const at::Tensor& tensor) {
  if (!tensor.defined()) return nullptr;
  c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  if (impl->device_type() != c10::DeviceType::PrivateUse1) return nullptr;
  c10::BackendMeta* meta = impl->get_backend_meta();
  if (meta == nullptr || typeid(*meta) != typeid(LazyState)) return nullptr;
  return static_cast<LazyState*>(meta);
}

namespace {

/// A new TensorImpl of `dtype` on `storage` holding `value`: a QTensorImpl for a quantized dtype.
at::Tensor newTensor(c10::Storage storage, at::ScalarType dtype, const ValuePtr& value,
                     const c10::intrusive_ptr<Recording>& recording) {
  const caffe2::TypeMeta meta = c10::scalarTypeToTypeMeta(dtype);
  at::Tensor tensor = c10::isQIntType(dtype)
      ? at::detail::make_tensor<at::QTensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::QuantizedPrivateUse1),
                                                 meta, /*quantizer=*/at::QuantizerPtr())
      : at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), meta);
  tensor.unsafeGetTensorImpl()->set_backend_meta(c10::make_intrusive<LazyState>(value, recording));
  return tensor;
}

void setDesc(const at::Tensor& tensor, const Desc& desc) {
  c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  if (desc.contiguous) {
    impl->set_sizes_contiguous(desc.sizes);
  } else {
    impl->set_sizes_and_strides(desc.sizes, desc.strides, desc.offset);
  }
  if (desc.conj) impl->_set_conj(true);
  if (desc.neg) impl->_set_neg(true);
  if (desc.quantizer) static_cast<at::QTensorImpl*>(impl)->set_quantizer_(desc.quantizer);
}

size_t nbytesOf(const Desc& desc) {
  const auto itemsize = static_cast<size_t>(c10::elementSize(desc.dtype));
  return desc.contiguous ? at::detail::computeStorageNbytesContiguous(desc.sizes, itemsize)
                         : at::detail::computeStorageNbytes(desc.sizes, desc.strides, itemsize, desc.offset);
}

}  // namespace

at::Tensor makeLazy(const ValuePtr& value, const Desc& desc, const c10::intrusive_ptr<Recording>& recording,
                    const at::Tensor* base) {
  const c10::Device device = recording->device();
  const size_t nbytes = nbytesOf(desc);
  // A view shares its base's storage when the base's covers it, and its inference status.
  std::optional<c10::InferenceMode> mode;
  c10::Storage storage;
  if (base != nullptr && base->defined()) {
    const bool base_inference = base->is_inference();
    if (base_inference != c10::InferenceMode::is_enabled()) mode.emplace(base_inference);
    if (base->has_storage() && base->device() == device && base->storage().nbytes() >= nbytes) storage = base->storage();
  }
  if (!storage) storage = newDeviceStorage(nbytes, value, desc, recording);
  at::Tensor tensor = newTensor(std::move(storage), desc.dtype, value, recording);
  setDesc(tensor, desc);
  return tensor;
}

at::Tensor makeLazyOn(const ValuePtr& value, const Desc& desc, const c10::intrusive_ptr<Recording>& recording,
                      c10::Storage storage) {
  at::Tensor tensor = newTensor(std::move(storage), desc.dtype, value, recording);
  setDesc(tensor, desc);
  return tensor;
}

void setGeometry(const at::Tensor& tensor, const Desc& desc) {
  LazyState* state = lazyState(tensor);
  TORCH_CHECK(state != nullptr, "set_geometry: not a remote_accelerator tensor");
  c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  TORCH_CHECK(desc.dtype == impl->dtype().toScalarType(), "an out= op changed the dtype of a remote_accelerator tensor (",
              impl->dtype().toScalarType(), " -> ", desc.dtype, ")");
  impl->set_sizes_and_strides(desc.sizes, desc.strides, desc.offset);
  // A resize that grows past the storage moves it to a new address range, as a resize on the CPU
  // reallocates: its nbytes stay what the geometry needs (untyped_storage().nbytes(), set_).
  const size_t nbytes =
      at::detail::computeStorageNbytes(desc.sizes, desc.strides, c10::elementSize(desc.dtype), desc.offset);
  if (impl->has_storage() && nbytes > impl->storage().nbytes()) {
    c10::Storage grown = newDeviceStorage(nbytes, state->value(), Desc::of(tensor), state->recordingPtr());
    c10::StorageImpl* storage = impl->storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(std::move(grown.unsafeGetStorageImpl()->mutable_data_ptr()));
    storage->set_nbytes(nbytes);
  }
}

bool hasCompatibleShallowCopyType(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) return true;
  // TensorImpl::has_compatible_shallow_copy_type's dense backends, and PrivateUse1.
  constexpr c10::DispatchKeySet kDenseBackends({c10::BackendComponent::CPUBit, c10::BackendComponent::CUDABit,
                                                c10::BackendComponent::MPSBit, c10::BackendComponent::HIPBit,
                                                c10::BackendComponent::XPUBit, c10::BackendComponent::HPUBit,
                                                c10::BackendComponent::MTIABit, c10::BackendComponent::PrivateUse1Bit});
  constexpr c10::DispatchKeySet kDense(c10::DispatchKey::Dense);
  auto dense = [&](c10::DispatchKeySet ks) { return ks.has_any(kDense) && ks.has_any(kDenseBackends); };
  return dense(self.key_set()) && dense(from.key_set());
}

}  // namespace genie::frontend
