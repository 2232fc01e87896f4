// The recorder's entry from PyTorch's dispatcher: a boxed kernel for the PrivateUse1 dispatch key
// (remote_accelerator), so that a LazyTensor needs no Python dispatch key.
//
// A LazyTensor's TensorImpl carries the PrivateUse1 backend keys only (lazy_wrapper.cc). An op
// on it passes autograd and ADInplaceOrView as on any device and reaches its PrivateUse1 kernel:
//  - this file's kernel, registered as the PrivateUse1 fallback (ops with no PrivateUse1 kernel)
//    and as the PrivateUse1 kernel of every aten op whose kernel would otherwise be a
//    CompositeExplicitAutograd one (those would decompose on the client: `clone` into
//    `empty_like` + `copy_`); the device's own Python kernels (genie.device: factories and
//    `_copy_from`) are left in place;
//  - the kernel records the op: a shape-plan hit in C++ (recorder_fast.cc: `recordCall`), anything
//    else in genie.recorder (Python: transfers, reads, data-dependent and compatibility ops, first
//    calls). It holds the process lock (genie.lazy.lock) while it records, as every entry into
//    the runtimes does.
//
// Arguments reach the recorder as __torch_dispatch__ would get them: positional arguments up to
// the last one that differs from its default, keyword-only arguments that differ from their
// defaults as kwargs, dtypes/layouts/memory formats as their Python objects. The results go back
// on the stack converted by each return's schema type. A Python exception raised while recording
// propagates as itself (torch's python_error), also through the autograd engine's threads.
//
// counters(): {"cpp": ops recorded by the C++ plan path, "python": ops that reached the Python
// recorder} since the process started (genie.client_stats shows them).
#include <pybind11/pybind11.h>
// pybind11 first: it includes Python.h, which torch's Python headers expect.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "py_slots.h"

namespace genie::python {

LazyState* lazyStateOf(const at::Tensor& tensor);  // lazy_wrapper.cc

namespace {

/// genie.lazy.lock and genie.recorder's entry points (strong references, set once by configure).
struct Entry {
  PyObject* lock_acquire = nullptr;  // lock.acquire
  PyObject* lock_release = nullptr;  // lock.release
  PyObject* dispatch = nullptr;      // genie.recorder.dispatch(func, args, kwargs)
  PyObject* record_op = nullptr;     // genie.recorder.record_op(func, args, kwargs, prepared)
  PyObject* lazy_tensor = nullptr;   // genie.lazy.LazyTensor
};
Entry g_entry;

std::atomic<int64_t> g_cpp_ops{0};
std::atomic<int64_t> g_python_ops{0};

bool matches(const c10::Argument& arg, c10::TypeKind kind) {
  const auto& t = arg.real_type();
  if (t->kind() == kind) return true;
  if (auto optional = t->cast<c10::OptionalType>()) return optional->getElementType()->kind() == kind;
  return false;
}

/// The Python object of `tensor`. A LazyTensor's TensorImpl that PyTorch made without Python
/// (a shallow copy: autograd's saved outputs) is wrapped as a LazyTensor, as is a plain
/// torch.Tensor object made for one elsewhere (a LazyTensor adds no fields to torch.Tensor's).
PyObject* wrapTensor(const at::Tensor& tensor) {
  PyObject* obj = THPVariable_Wrap(tensor);
  if (obj == nullptr || lazyStateOf(tensor) == nullptr) return obj;
  if (Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(THPVariableClass) &&
      PyObject_SetAttrString(obj, "__class__", g_entry.lazy_tensor) < 0) {
    Py_DECREF(obj);
    return nullptr;
  }
  return obj;
}

/// One argument as __torch_dispatch__ receives it (a new reference).
PyObject* toPython(const c10::Argument& arg, const c10::IValue& value) {
  if (value.isNone()) Py_RETURN_NONE;
  if (value.isTensor()) {
    const at::Tensor& tensor = value.toTensor();
    // A Python number the arg parser wrapped (`x.mul_(0.999)` reaches mul_.Tensor): the number
    // again, as Python dispatch gives it, so that it is recorded as a scalar.
    if (tensor.unsafeGetTensorImpl()->is_wrapped_number()) return torch::jit::toPyObject(tensor.item()).release().ptr();
    return wrapTensor(tensor);
  }
  if (value.isInt()) {
    if (matches(arg, c10::TypeKind::ScalarTypeType)) {
      PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<at::ScalarType>(value.toInt())));
      Py_INCREF(dtype);
      return dtype;
    }
    if (matches(arg, c10::TypeKind::LayoutType)) {
      PyObject* layout = reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<at::Layout>(value.toInt())));
      Py_INCREF(layout);
      return layout;
    }
    if (matches(arg, c10::TypeKind::MemoryFormatType)) {
      PyObject* format = torch::utils::getTHPMemoryFormat(static_cast<at::MemoryFormat>(value.toInt()));
      Py_INCREF(format);
      return format;
    }
    return PyLong_FromLongLong(value.toInt());
  }
  return torch::jit::toPyObject(value).release().ptr();
}

bool isDefault(const c10::Argument& arg, const c10::IValue& value) {
  const auto& fallback = arg.default_value();
  return fallback.has_value() && !value.isTensor() && *fallback == value;
}

/// Throws the pending Python exception as torch's python_error, fetched now: the binding that
/// called the dispatcher (or the autograd engine, from its threads) raises it as itself.
[[noreturn]] void throwPythonError() {
  python_error error;
  error.persist();
  throw error;
}

/// Holds genie.lazy.lock for its lifetime (with the GIL held).
class LockHeld {
 public:
  LockHeld() {
    PyObject* r = PyObject_CallNoArgs(g_entry.lock_acquire);
    if (r == nullptr) throwPythonError();
    Py_DECREF(r);
  }
  ~LockHeld() {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);  // the recorder's error, kept across the call
    PyObject* r = PyObject_CallNoArgs(g_entry.lock_release);
    if (r == nullptr) PyErr_Clear();  // released by the same thread: cannot fail
    Py_XDECREF(r);
    PyErr_Restore(type, value, traceback);
  }
  LockHeld(const LockHeld&) = delete;
  LockHeld& operator=(const LockHeld&) = delete;
};

/// Records the call: genie.lazy's former __torch_dispatch__ body. A new reference or nullptr
/// with a Python error set.
PyObject* record(PyObject* func, PyObject* args, PyObject* kwargs) {
  Ref out(recordCall(func, args, kwargs));
  if (!out) return nullptr;
  if (out.get() == Py_NotImplemented) {
    g_python_ops.fetch_add(1, std::memory_order_relaxed);
    PyObject* call[3] = {func, args, kwargs};
    return PyObject_Vectorcall(g_entry.dispatch, call, 3, nullptr);
  }
  if (PyTuple_CheckExact(out.get())) {  // the prepared call of a plan miss or a general plan
    g_python_ops.fetch_add(1, std::memory_order_relaxed);
    PyObject* call[4] = {func, args, kwargs, out.get()};
    return PyObject_Vectorcall(g_entry.record_op, call, 4, nullptr);
  }
  g_cpp_ops.fetch_add(1, std::memory_order_relaxed);
  return out.release();
}

void pushResults(const c10::FunctionSchema& schema, PyObject* out, torch::jit::Stack* stack) {
  const auto& returns = schema.returns();
  if (returns.empty()) return;
  if (returns.size() == 1) {
    torch::jit::push(*stack, torch::jit::toIValue(out, returns[0].real_type()));
    return;
  }
  if (!PyTuple_Check(out) || PyTuple_GET_SIZE(out) != static_cast<Py_ssize_t>(returns.size())) {
    TORCH_CHECK(false, schema.operator_name(), ": the recorder returned ", Py_TYPE(out)->tp_name, ", expected a tuple of ",
                returns.size());
  }
  for (size_t i = 0; i < returns.size(); ++i) {
    torch::jit::push(*stack, torch::jit::toIValue(PyTuple_GET_ITEM(out, i), returns[i].real_type()));
  }
}

/// The boxed kernel: records `op` with the arguments on `stack`, leaves its results there.
void recordBoxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  py::gil_scoped_acquire gil;
  TORCH_CHECK(g_entry.dispatch != nullptr, op.operator_name(),
              " on remote_accelerator: genie's recorder is not configured (import genie)");
  const auto& schema = op.schema();
  const auto& arguments = schema.arguments();
  const size_t n = arguments.size();
  auto first = stack->end() - static_cast<std::ptrdiff_t>(n);
  size_t kwarg_start = n;
  for (size_t i = 0; i < n; ++i) {
    if (arguments[i].kwarg_only()) {
      kwarg_start = i;
      break;
    }
  }
  size_t positional = kwarg_start;
  while (positional > 0 && isDefault(arguments[positional - 1], first[positional - 1])) --positional;
  Ref args(PyTuple_New(static_cast<Py_ssize_t>(positional)));
  Ref kwargs(PyDict_New());
  if (!args || !kwargs) throwPythonError();
  for (size_t i = 0; i < positional; ++i) {
    PyObject* a = toPython(arguments[i], first[i]);
    if (a == nullptr) throwPythonError();
    PyTuple_SET_ITEM(args.get(), static_cast<Py_ssize_t>(i), a);
  }
  for (size_t i = kwarg_start; i < n; ++i) {
    if (isDefault(arguments[i], first[i])) continue;
    Ref a(toPython(arguments[i], first[i]));
    if (!a || PyDict_SetItemString(kwargs.get(), arguments[i].name().c_str(), a.get()) < 0) throwPythonError();
  }
  py::handle func = torch::detail::getTorchApiFunction(op);
  Ref out;
  {
    LockHeld held;
    out.reset(record(func.ptr(), args.get(), kwargs.get()));
  }
  if (!out) throwPythonError();
  torch::jit::drop(*stack, n);
  pushResults(schema, out.get(), stack);
}

/// Registrations live for the process (the dispatcher keeps pointers into them).
std::vector<std::unique_ptr<torch::Library>> g_libraries;

bool hasTensorArgument(const c10::FunctionSchema& schema) {
  for (const auto& arg : schema.arguments()) {
    const auto& t = arg.real_type();
    if (t->isSubtypeOf(*c10::TensorType::get()) || t->isSubtypeOf(*c10::OptionalType::ofTensor()) ||
        t->isSubtypeOf(*c10::ListType::ofTensors()) || t->isSubtypeOf(*c10::ListType::ofOptionalTensors())) {
      return true;
    }
  }
  return false;
}

/// register_kernels(extra): the fallback, and this kernel for every aten op that has a tensor
/// argument, a CompositeExplicitAutograd(NonFunctional) kernel and no PrivateUse1 kernel, plus
/// `extra` (aten op names "name.overload": composite ops kept whole). Returns how many ops got it.
int registerKernels(const std::vector<std::string>& extra) {
  TORCH_CHECK(g_libraries.empty(), "genie._C.register_recorder_kernels: already registered");
  auto fallback = std::make_unique<torch::Library>(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1,
                                                   __FILE__, __LINE__);
  fallback->fallback(torch::CppFunction::makeFromBoxedFunction<&recordBoxed>());
  g_libraries.push_back(std::move(fallback));
  auto kernels = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                                  __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  int count = 0;
  for (const auto& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasSchema() || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
      continue;
    }
    if (!hasTensorArgument(op->schema())) continue;  // factories: their empty + fill ops are recorded
    const std::string overload = name.overload_name.empty() ? name.name.substr(6) : name.name.substr(6) + "." + name.overload_name;
    kernels->impl(overload.c_str(), torch::CppFunction::makeFromBoxedFunction<&recordBoxed>());
    ++count;
  }
  for (const auto& name : extra) {
    kernels->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&recordBoxed>());
    ++count;
  }
  g_libraries.push_back(std::move(kernels));
  return count;
}

}  // namespace

void bindDispatchFallback(py::module_& m) {
  m.def(
      "configure_fallback",
      [](py::object lazy_tensor, py::object lock, py::object dispatch, py::object record_op) {
        g_entry.lazy_tensor = lazy_tensor.release().ptr();
        g_entry.lock_acquire = py::object(lock.attr("acquire")).release().ptr();
        g_entry.lock_release = py::object(lock.attr("release")).release().ptr();
        g_entry.dispatch = dispatch.release().ptr();
        g_entry.record_op = record_op.release().ptr();
      },
      "configure_fallback(LazyTensor, lock, dispatch, record_op): the tensor class, the process lock and genie.recorder's entry points the "
      "PrivateUse1 kernel calls (genie.lazy calls it once at import).");
  m.def("register_recorder_kernels", &registerKernels, py::arg("extra"),
        "register_recorder_kernels(extra: list[str]) -> int: registers the recorder as remote_accelerator's "
        "PrivateUse1 fallback and as the PrivateUse1 kernel of the aten ops that would otherwise decompose "
        "(CompositeExplicitAutograd) and of `extra` ('name.overload'); returns how many ops got a kernel. "
        "RuntimeError when called twice.");
  m.def("recorder_counters", [] {
    py::dict d;
    d["cpp"] = g_cpp_ops.load(std::memory_order_relaxed);
    d["python"] = g_python_ops.load(std::memory_order_relaxed);
    return d;
  }, "recorder_counters() -> {'cpp': int, 'python': int}: ops recorded by the C++ plan path and by the Python "
     "recorder since the process started.");
}

}  // namespace genie::python
