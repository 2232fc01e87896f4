// genie._C.make_wrapper: the tensor object of a new LazyTensor, made without
// torch.Tensor._make_wrapper_subclass's argument parser. Recording makes one wrapper per
// recorded output, so this is on the hottest path of capture: _make_wrapper_subclass parses
// fifteen optional arguments from Python keywords each time (~14k instructions per call under
// callgrind, the largest single cost of recording an op in Genie's code).
//
// The tensor is what _make_wrapper_subclass(cls, size, strides=..., storage_offset=...,
// dtype=..., device=remote_accelerator:N) makes (torch/csrc/autograd/python_variable.cpp,
// make_tensor_for_subclass_helper): a TensorImpl on the PrivateUse1 dispatch key whose storage
// has the byte size the geometry needs and no data (the meta allocator), no autograd
// requirement, wrapped as an instance of `cls`, but without the Python dispatch key: its key set
// is PrivateUse1's, so every op on it reaches the recorder's PrivateUse1 kernel
// (dispatch_fallback.cc) after autograd, as an op on a CUDA tensor reaches its CUDA kernel.
//
// Inference tensors: a TensorImpl made inside torch.inference_mode() is an inference tensor (no
// autograd keys, no version counter). PyTorch makes a view with its base's key set instead
// (TensorImpl's VIEW constructor), so a view of a normal tensor taken in inference mode is a
// normal tensor, and the ADInplaceOrView kernel around the op then shares the base's version
// counter with it. A wrapper for a view output is given its `base` and made with the base's
// inference status; without that, a slice of a module buffer in inference mode fails with
// "Cannot set version_counter for inference tensor".
//
// Storages and data pointers: as on any accelerator, a storage's data pointer is a device
// address the host never dereferences. Each new value's storage gets a range of its own in an
// address space that no host mapping can overlap (non-canonical x86-64 addresses, from 2^62:
// a stray host dereference faults at once), and a view shares its base's storage. So
// `untyped_storage().data_ptr()` identifies a storage and `data_ptr()` an element, as on CUDA:
// libraries that tell tied or shared tensors apart that way (transformers' save_pretrained,
// safetensors) work. A storage with a null pointer is an "invalid python storage" to PyTorch,
// whose data_ptr() raises.
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>

#include "bindings.h"

namespace genie::python {
namespace {

/// Reads a tuple or list of Python ints into `out`. Returns false with TypeError set otherwise.
bool readInts(PyObject* seq, const char* what, c10::SmallVector<int64_t, 6>& out) {
  if (!PyTuple_Check(seq) && !PyList_Check(seq)) {
    PyErr_Format(PyExc_TypeError, "make_wrapper: %s must be a tuple or list of ints, got %s", what,
                 Py_TYPE(seq)->tp_name);
    return false;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  out.resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long long v = PyLong_AsLongLong(items[i]);
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Format(PyExc_TypeError, "make_wrapper: %s[%zd] must be an int, got %s", what, i,
                   Py_TYPE(items[i])->tp_name);
      return false;
    }
    out[i] = v;
  }
  return true;
}

/// A LazyTensor's TensorImpl: PrivateUse1 keys, a storage with no host bytes, and the recording
/// state (LazyState). PyTorch copies a TensorImpl's metadata into a new one wherever it detaches
/// a tensor (autograd's saved outputs, `.detach()` inside kernels, `tensor.data`); the copy made
/// here attaches its own count on the same value, so the value stays resident while any copy
/// lives, and each copy's death is reported to the runtime (releaseState).
class LazyTensorImpl final : public c10::TensorImpl {
 public:
  LazyTensorImpl(c10::Storage storage, caffe2::TypeMeta dtype)
      : c10::TensorImpl(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype) {}

  ~LazyTensorImpl() override {
    if (state.cell == nullptr && state.runtime == nullptr && state.desc == nullptr) return;
    if (!Py_IsInitialized() || _Py_IsFinalizing()) return;  // the interpreter is gone: nothing to tell
    PyGILState_STATE gil = PyGILState_Ensure();
    releaseState(state);
    PyGILState_Release(gil);
  }

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                                              bool allow_tensor_metadata_change) const override {
    return copy(version_counter, allow_tensor_metadata_change);
  }
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                                              bool allow_tensor_metadata_change) const override {
    return copy(std::move(version_counter), allow_tensor_metadata_change);
  }
  /// `tensor.data = other` (VariableHooks::set_data): this tensor takes `other`'s metadata and
  /// descriptor; genie.lazy.LazyTensor.data rebinds the value.
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override {
    copy_tensor_metadata(impl.get(), this, version_counter(), allow_tensor_metadata_change());
    if (auto* other = dynamic_cast<LazyTensorImpl*>(impl.get()); other != nullptr && other->state.desc != nullptr) {
      PyGILState_STATE gil = PyGILState_Ensure();
      Py_INCREF(other->state.desc);
      Py_XSETREF(state.desc, other->state.desc);
      PyGILState_Release(gil);
    }
  }

  LazyState state;

 private:
  template <typename Version>
  c10::intrusive_ptr<c10::TensorImpl> copy(Version&& version_counter, bool allow_tensor_metadata_change) const {
    auto impl = c10::make_intrusive<LazyTensorImpl>(storage(), dtype());
    copy_tensor_metadata(this, impl.get(), std::forward<Version>(version_counter), allow_tensor_metadata_change);
    impl->refresh_numel();
    impl->refresh_contiguous();
    if (state.cell != nullptr) {
      PyGILState_STATE gil = PyGILState_Ensure();
      const bool ok = attachCopy(state, impl->state);
      if (!ok) {
        python_error error;
        error.persist();
        PyGILState_Release(gil);
        throw error;
      }
      PyGILState_Release(gil);
    }
    return impl;
  }
};

/// The next free device address (see the top of this file). Ranges are 512-byte aligned, as
/// CUDA's allocations are, and never reused: 2^62 bytes outlast any process.
std::atomic<uint64_t> g_next_device_address{uint64_t{1} << 62};

/// A storage of `nbytes` for a new value: a range of its own in the device address space.
c10::Storage newStorage(size_t nbytes, c10::Device device) {
  const uint64_t span = (std::max<uint64_t>(nbytes, 1) + 511) & ~uint64_t{511};
  void* address = reinterpret_cast<void*>(g_next_device_address.fetch_add(span, std::memory_order_relaxed));
  return c10::Storage(c10::Storage::use_byte_size_t{}, nbytes, at::DataPtr(address, device),
                      c10::GetAllocator(c10::kMeta), /*resizable=*/true);
}

/// make_wrapper(cls, shape, strides, storage_offset, dtype, device_index[, base]) -> cls instance.
PyObject* makeWrapper(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 6 && nargs != 7) {
    PyErr_Format(PyExc_TypeError,
                 "make_wrapper(cls, shape, strides, storage_offset, dtype, device_index[, base]) takes 6 or 7 "
                 "arguments, got %zd",
                 nargs);
    return nullptr;
  }
  // The view's base: the wrapper gets its inference status (see the top of this file).
  std::optional<bool> inference;
  const at::Tensor* base = nullptr;
  if (nargs == 7 && args[6] != Py_None) {
    if (!THPVariable_Check(args[6])) {
      PyErr_Format(PyExc_TypeError, "make_wrapper: base must be a torch.Tensor or None, got %s",
                   Py_TYPE(args[6])->tp_name);
      return nullptr;
    }
    base = &THPVariable_Unpack(args[6]);
    const bool base_inference = base->is_inference();
    if (base_inference != c10::InferenceMode::is_enabled()) inference = base_inference;
  }
  PyObject* cls = args[0];
  if (!PyType_Check(cls) || !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls),
                                              reinterpret_cast<PyTypeObject*>(THPVariableClass))) {
    PyErr_Format(PyExc_TypeError, "make_wrapper: cls must be a torch.Tensor subclass, got %s",
                 PyType_Check(cls) ? reinterpret_cast<PyTypeObject*>(cls)->tp_name : Py_TYPE(cls)->tp_name);
    return nullptr;
  }
  c10::SmallVector<int64_t, 6> sizes, strides;
  if (!readInts(args[1], "shape", sizes)) return nullptr;
  const bool has_strides = args[2] != Py_None;
  if (has_strides && !readInts(args[2], "strides", strides)) return nullptr;
  if (has_strides && strides.size() != sizes.size()) {
    PyErr_Format(PyExc_ValueError, "make_wrapper: %zu sizes but %zu strides", sizes.size(), strides.size());
    return nullptr;
  }
  const long long offset = PyLong_AsLongLong(args[3]);
  if (offset == -1 && PyErr_Occurred()) return nullptr;
  if (offset != 0 && !has_strides) {
    PyErr_SetString(PyExc_ValueError, "make_wrapper: a storage offset needs strides");
    return nullptr;
  }
  if (!THPDtype_Check(args[4])) {
    PyErr_Format(PyExc_TypeError, "make_wrapper: dtype must be a torch.dtype, got %s", Py_TYPE(args[4])->tp_name);
    return nullptr;
  }
  const at::ScalarType dtype = reinterpret_cast<THPDtype*>(args[4])->scalar_type;
  const long long index = PyLong_AsLongLong(args[5]);
  if (index == -1 && PyErr_Occurred()) return nullptr;
  const c10::Device device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index));

  at::Tensor tensor;
  {
    const auto itemsize = static_cast<size_t>(c10::elementSize(dtype));
    const size_t nbytes = has_strides
                              ? at::detail::computeStorageNbytes(sizes, strides, itemsize, offset)
                              : at::detail::computeStorageNbytesContiguous(sizes, itemsize);
    // A view shares its base's storage when the base's covers it (a base on this device).
    const bool share = base != nullptr && base->has_storage() && base->device() == device &&
                       base->storage().nbytes() >= nbytes;
    c10::Storage storage = share ? base->storage() : newStorage(nbytes, device);
    std::optional<c10::InferenceMode> mode;  // the TensorImpl constructor reads it
    if (inference) mode.emplace(*inference);
    tensor = at::detail::make_tensor<LazyTensorImpl>(std::move(storage), c10::scalarTypeToTypeMeta(dtype));
    if (has_strides) {
      tensor.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
    } else {
      tensor.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
    }
  }
  return THPVariable_Wrap(tensor, reinterpret_cast<PyTypeObject*>(cls));
  END_HANDLE_TH_ERRORS
}

PyMethodDef g_make_wrapper_def = {
    "make_wrapper", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&makeWrapper)), METH_FASTCALL,
    "make_wrapper(cls, shape, strides, storage_offset, dtype, device_index[, base]) -> cls instance\n\n"
    "A tensor of type `cls` (a torch.Tensor subclass) on "
    "remote_accelerator:device_index that owns no memory: shape and strides (tuples or lists of "
    "ints, elements; strides None for contiguous, then storage_offset must be 0), storage_offset "
    "(elements), dtype (torch.dtype). What torch.Tensor._make_wrapper_subclass makes for these "
    "arguments, without its argument parser. `base` (a tensor, optional): the output is a view of "
    "it and is an inference tensor exactly when `base` is one (as PyTorch's views), also inside "
    "or outside torch.inference_mode(), and shares its storage (one data_ptr). A new value's "
    "storage has a device address of its own, never dereferenced on the host. TypeError/ValueError "
    "for bad arguments."};

}  // namespace

PyObject* makeWrapperFast(PyObject* const* args, Py_ssize_t nargs) { return makeWrapper(nullptr, args, nargs); }

LazyState* lazyStateOf(PyObject* tensor) {
  if (!THPVariable_Check(tensor)) return nullptr;
  auto* impl = dynamic_cast<LazyTensorImpl*>(THPVariable_Unpack(tensor).unsafeGetTensorImpl());
  return impl == nullptr ? nullptr : &impl->state;
}

LazyState* lazyStateOf(const at::Tensor& tensor) {
  auto* impl = dynamic_cast<LazyTensorImpl*>(tensor.unsafeGetTensorImpl());
  return impl == nullptr ? nullptr : &impl->state;
}

void bindLazyWrapper(py::module_& m) {
  m.add_object("make_wrapper",
               py::reinterpret_steal<py::object>(PyCFunction_NewEx(&g_make_wrapper_def, nullptr, m.ptr())));
}

}  // namespace genie::python
