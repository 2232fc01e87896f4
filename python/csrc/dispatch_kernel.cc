// The recorder's entry from PyTorch's dispatcher: one boxed kernel for the PrivateUse1
// dispatch key (remote_accelerator), so that a LazyTensor needs no Python dispatch key.
//
// An op on a LazyTensor passes autograd and ADInplaceOrView as on any device and reaches its
// PrivateUse1 kernel: this file's kernel, registered as the PrivateUse1 fallback (every op with
// no PrivateUse1 kernel: factories with a remote_accelerator device too) and as the PrivateUse1
// kernel of every aten op whose kernel would otherwise be a CompositeExplicitAutograd one (those
// would decompose on the client: `clone` into `empty_like` + `copy_`) and of the composite ops
// kept whole (SDPA, LSTM, GRU: `register_recorder_kernels(extra)`).
//
// The kernel records the call in C++ (frontend/recorder.h), without the GIL. It takes the GIL
// afterwards, with the process lock released, only when the pending graph passed its limit, to
// let the runtime run it (genie.runtime). New tensors are plain torch.Tensors: PyTorch gives them
// Python objects when they reach Python, as it does for any device. Calls the C++ recorder does not take go to genie.python_ops.dispatch(func, args,
// kwargs) with the arguments as __torch_dispatch__ would get them: positional arguments up to
// the last one that differs from its default, keyword-only ones that differ as kwargs, dtypes,
// layouts and memory formats as their Python objects, wrapped numbers as numbers. Its results
// go back on the stack converted by each return's schema type; a Python exception propagates as
// itself (torch's python_error), also through the autograd engine's threads.
//
// genie._C.record_op(func, args, kwargs, host_args=()) is the same C++ recorder for
// genie.python_ops: the op as it is, without routing. genie._C.PartCall records a compiled part's
// genie::call_graph straight from the part's arguments (genie.compile): its capture knows the
// inputs' geometry and the outputs', so the call skips the dispatcher and the plan cache, whose
// per-tensor work on a part's hundreds of arguments (the weights) it would otherwise repeat.
#include <pybind11/pybind11.h>
// pybind11 first: it includes Python.h, which torch's Python headers expect.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_to_copy.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/library.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "device_runtime.h"
#include "frontend/lazy_tensor.h"
#include "frontend/lock.h"
#include "frontend/op_facts.h"
#include "frontend/recorder.h"

namespace genie::python {

using frontend::Outcome;
using frontend::Recorded;

namespace {

/// genie.python_ops's entry point (a strong reference, set once).
struct Entry {
  PyObject* dispatch = nullptr;  // genie.python_ops.dispatch(func, args, kwargs)
};
Entry g_entry;

bool matches(const c10::Argument& arg, c10::TypeKind kind) {
  const auto& t = arg.real_type();
  if (t->kind() == kind) return true;
  if (auto optional = t->cast<c10::OptionalType>()) return optional->getElementType()->kind() == kind;
  return false;
}

/// One argument as __torch_dispatch__ receives it (a new reference).
PyObject* toPython(const c10::Argument& arg, const c10::IValue& value) {
  if (value.isNone()) Py_RETURN_NONE;
  if (value.isTensor()) {
    const at::Tensor& tensor = value.toTensor();
    // A Python number the arg parser wrapped (`x.mul_(0.999)` reaches mul_.Tensor): the number
    // again, as Python dispatch gives it, so that it is recorded as a scalar.
    if (tensor.defined() && tensor.unsafeGetTensorImpl()->is_wrapped_number()) {
      return torch::jit::toPyObject(tensor.item()).release().ptr();
    }
    return THPVariable_Wrap(tensor);
  }
  if (value.isInt()) {
    if (matches(arg, c10::TypeKind::ScalarTypeType)) {
      return Py_NewRef(reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<at::ScalarType>(value.toInt()))));
    }
    if (matches(arg, c10::TypeKind::LayoutType)) {
      return Py_NewRef(reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<at::Layout>(value.toInt()))));
    }
    if (matches(arg, c10::TypeKind::MemoryFormatType)) {
      return Py_NewRef(torch::utils::getTHPMemoryFormat(static_cast<at::MemoryFormat>(value.toInt())));
    }
    return PyLong_FromLongLong(value.toInt());
  }
  if (value.isTensorList() || (value.isList() && matches(arg, c10::TypeKind::ListType))) {
    const auto list = value.toListRef();
    py::object out = py::reinterpret_steal<py::object>(PyList_New(static_cast<Py_ssize_t>(list.size())));
    if (!out) return nullptr;
    for (size_t i = 0; i < list.size(); ++i) {
      PyObject* item = list[i].isTensor() ? THPVariable_Wrap(list[i].toTensor())
                                          : torch::jit::toPyObject(list[i]).release().ptr();
      if (item == nullptr) return nullptr;
      PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), item);
    }
    return out.release().ptr();
  }
  return torch::jit::toPyObject(value).release().ptr();
}

/// Throws the pending Python exception as torch's python_error, fetched now: the binding that
/// called the dispatcher (or the autograd engine, from its threads) raises it as itself.
[[noreturn]] void throwPythonError() {
  python_error error;
  error.persist();
  throw error;
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

/// The call's arguments as (args, kwargs) for genie.python_ops (with the GIL).
std::pair<py::tuple, py::dict> pythonArguments(const c10::FunctionSchema& schema, torch::jit::Stack* stack) {
  const auto& arguments = schema.arguments();
  const size_t n = arguments.size();
  auto first = stack->end() - static_cast<std::ptrdiff_t>(n);
  const c10::ArrayRef<c10::IValue> values(&*first, n);
  const frontend::ShownArgs shown(schema, values);
  const size_t positional = shown.positional();
  const size_t shown_positional = shown.shownPositional();
  py::tuple args(shown_positional);
  py::dict kwargs;
  for (size_t i = 0; i < shown_positional; ++i) {
    PyObject* a = toPython(arguments[i], values[i]);
    if (a == nullptr) throwPythonError();
    PyTuple_SET_ITEM(args.ptr(), static_cast<Py_ssize_t>(i), a);
  }
  for (size_t i = positional; i < n; ++i) {
    if (!shown[i]) continue;
    py::object a = py::reinterpret_steal<py::object>(toPython(arguments[i], values[i]));
    if (!a || PyDict_SetItemString(kwargs.ptr(), arguments[i].name().c_str(), a.ptr()) < 0) throwPythonError();
  }
  return {std::move(args), std::move(kwargs)};
}

/// genie.python_ops.dispatch(func, args, kwargs): the calls the C++ recorder does not take.
void recordInPython(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  frontend::countPython();
  py::gil_scoped_acquire gil;
  countGilAcquisition();
  TORCH_CHECK(g_entry.dispatch != nullptr, op.operator_name(),
              " on remote_accelerator: genie's recorder is not configured (import genie)");
  const auto& schema = op.schema();
  auto [args, kwargs] = pythonArguments(schema, stack);
  py::handle func = torch::detail::getTorchApiFunction(op);
  PyObject* call[3] = {func.ptr(), args.ptr(), kwargs.ptr()};
  py::object out = py::reinterpret_steal<py::object>(PyObject_Vectorcall(g_entry.dispatch, call, 3, nullptr));
  if (!out) throwPythonError();
  torch::jit::drop(*stack, schema.arguments().size());
  pushResults(schema, out.ptr(), stack);
}

/// The runtime's turn when the pending graph passed its limit (DeviceRuntime::runPending, in
/// C++). Without the lock: takes it.
void afterRecording(const Recorded& recorded, bool wants_run) {
  if (!wants_run) return;
  DeviceRuntime* runtime = DeviceRuntime::of(recorded.recording);
  if (runtime == nullptr) return;  // its session was shut down
  frontend::LockGuard lock;
  runtime->runPending();
}

/// A read answered by the device runtime without Python: aten::_to_copy of a device tensor to
/// the host (converted there as the call asks, unless it pins memory) and
/// aten::_local_scalar_dense (`.item()`). False when Python must take it (the stack is then
/// untouched): another op, a read DeviceRuntime::fetch declines, an empty tensor's `.item()`.
bool readWithoutPython(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  static const c10::OperatorHandle to_copy = c10::Dispatcher::singleton().findSchemaOrThrow("aten::_to_copy", "");
  static const c10::OperatorHandle item =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::_local_scalar_dense", "");
  const bool is_item = op == item;
  if (!is_item && op != to_copy) return false;
  const size_t n = op.schema().arguments().size();
  const c10::IValue* args = stack->data() + (stack->size() - n);
  if (!args[0].isTensor()) return false;
  const at::Tensor& src = args[0].toTensor();
  frontend::LazyState* state = frontend::lazyState(src);
  if (state == nullptr) return false;
  if (is_item && src.numel() == 0) return false;  // eager's error, raised by genie.transfers
  // _to_copy(self, *, dtype, layout, device, pin_memory, non_blocking, memory_format)
  if (!is_item) {
    if (args[3].isNone() || !args[3].toDevice().is_cpu()) return false;
    if (!args[4].isNone() && args[4].toBool()) return false;
    if (!args[2].isNone() && args[2].toLayout() != c10::kStrided) return false;
  }
  DeviceRuntime* runtime = DeviceRuntime::of(&state->recording());
  if (runtime == nullptr || runtime->transfers_in_python) return false;
  std::optional<at::Tensor> out;
  {
    frontend::LockGuard lock;
    out = runtime->fetch(src);
  }
  if (!out) return false;
  c10::IValue result;
  if (is_item) {
    result = out->item();
  } else {
    const auto dtype = args[1].toOptional<at::ScalarType>();
    const auto format = args[6].toOptional<at::MemoryFormat>();
    const bool convert = (dtype && *dtype != out->scalar_type()) || (format && *format != at::MemoryFormat::Preserve);
    result = convert ? at::_to_copy(*out, dtype, std::nullopt, std::nullopt, std::nullopt, false, format) : *out;
  }
  torch::jit::drop(*stack, n);
  stack->push_back(std::move(result));
  return true;
}

/// Whether `tensor` (a host tensor) is an nn.Parameter: put on the node as a weight. Takes the
/// GIL (not the process lock) to read its Python type.
bool isParameter(const at::Tensor& tensor) {
  py::gil_scoped_acquire gil;
  countGilAcquisition();
  PyObject* obj = THPVariable_Wrap(tensor);
  if (obj == nullptr) throwPythonError();
  const bool parameter = PyObject_IsInstance(obj, ParameterClass) == 1;
  Py_DECREF(obj);
  return parameter;
}

/// aten::_to_copy of a host tensor to a remote device whose runtime exists, by the device
/// runtime's upload path (DeviceRuntime::upload) without Python. False when Python must take it
/// (the stack is then untouched): another op, progress bars on, a quantized or non-strided
/// tensor, pinning asked, a device used for the first time.
bool uploadWithoutPython(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  static const c10::OperatorHandle to_copy = c10::Dispatcher::singleton().findSchemaOrThrow("aten::_to_copy", "");
  if (op != to_copy) return false;
  const size_t n = op.schema().arguments().size();
  const c10::IValue* args = stack->data() + (stack->size() - n);
  // _to_copy(self, *, dtype, layout, device, pin_memory, non_blocking, memory_format)
  if (!args[0].isTensor() || args[3].isNone()) return false;
  const at::Tensor& src = args[0].toTensor();
  const c10::Device device = args[3].toDevice();
  if (!src.defined() || !src.is_cpu() || src.layout() != c10::kStrided || src.is_quantized() ||
      device.type() != c10::DeviceType::PrivateUse1) {
    return false;
  }
  if ((!args[2].isNone() && args[2].toLayout() != c10::kStrided) || (!args[4].isNone() && args[4].toBool())) {
    return false;
  }
  const int index = device.index() >= 0 ? device.index() : currentDevice();
  frontend::Recording* recording = frontend::recordingFor(index);
  DeviceRuntime* runtime = recording != nullptr ? DeviceRuntime::of(recording) : nullptr;
  if (runtime == nullptr || runtime->transfers_in_python) return false;
  const uint8_t residency = isParameter(src) ? frontend::kWeight : frontend::kActivation;
  std::optional<at::Tensor> out;
  {
    frontend::LockGuard lock;
    out = runtime->upload(src, residency, src, args[1].toOptional<at::ScalarType>(),
                          args[6].toOptional<at::MemoryFormat>());
    if (!out) return false;
    if (recording->wantsRun()) runtime->runPending();  // `out` holds its value: the run keeps it
  }
  torch::jit::drop(*stack, n);
  stack->push_back(std::move(*out));
  return true;
}

/// Time spent in the kernel (outermost calls), when timing is on (perf/bench_capture.py).
std::atomic<bool> g_timing{false};
std::atomic<int64_t> g_kernel_ns{0};
thread_local int t_depth = 0;

void recordBoxedUntimed(const c10::OperatorHandle& op, torch::jit::Stack* stack);

/// The boxed kernel: records `op` with the arguments on `stack`, leaves its results there.
void recordBoxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (!g_timing.load(std::memory_order_relaxed) || t_depth > 0) {
    recordBoxedUntimed(op, stack);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  ++t_depth;
  try {
    recordBoxedUntimed(op, stack);
  } catch (...) {
    --t_depth;
    throw;
  }
  --t_depth;
  g_kernel_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count(),
                        std::memory_order_relaxed);
}

void recordBoxedUntimed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (uploadWithoutPython(op, stack)) return;
  Recorded recorded = frontend::record(op, *stack, frontend::CallOptions{});
  if (recorded.outcome == Outcome::kPython && readWithoutPython(op, stack)) return;
  switch (recorded.outcome) {
    case Outcome::kRecorded:
      afterRecording(recorded, recorded.wants_run);
      return;
    case Outcome::kComposite:
      op.callBoxedForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd, *stack);
      return;
    case Outcome::kPython:
      recordInPython(op, stack);
      return;
  }
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
  int count = 0;
  g_libraries.push_back(quantizedKernels());  // first: the loop below leaves their ops alone
  // PrivateUse1, and QuantizedPrivateUse1 for quantized LazyTensors (python/csrc/quantized.cc
  // answers their quantizer reads itself).
  for (const c10::DispatchKey key : {c10::DispatchKey::PrivateUse1, c10::DispatchKey::QuantizedPrivateUse1}) {
    auto fallback = std::make_unique<torch::Library>(torch::Library::IMPL, "_", key, __FILE__, __LINE__);
    fallback->fallback(torch::CppFunction::makeFromBoxedFunction<&recordBoxed>());
    g_libraries.push_back(std::move(fallback));
    auto kernels = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const auto& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      auto op = dispatcher.findOp(name);
      if (!op || !op->hasSchema() || op->hasKernelForDispatchKey(key)) continue;
      if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
          !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
        continue;
      }
      if (!hasTensorArgument(op->schema())) continue;  // factories: their empty + fill ops are recorded
      if (name.name == "aten::_test_parallel_materialize") continue;  // the client's COW books: runs here
      const std::string overload =
          name.overload_name.empty() ? name.name.substr(6) : name.name.substr(6) + "." + name.overload_name;
      kernels->impl(overload.c_str(), torch::CppFunction::makeFromBoxedFunction<&recordBoxed>());
      ++count;
    }
    if (key == c10::DispatchKey::PrivateUse1) {
      // Shallow-copy compatibility with the dense backends, so that Module._apply keeps each
      // Parameter and swaps its data (`param.data = moved`), as for CUDA.
      kernels->impl("_has_compatible_shallow_copy_type", TORCH_FN(frontend::hasCompatibleShallowCopyType));
      for (const auto& name : extra) {
        kernels->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&recordBoxed>());
        ++count;
      }
    }
    g_libraries.push_back(std::move(kernels));
  }
  return count;
}

/// record_op(func, args, kwargs, host_args=()) -> result | NotImplemented.
py::object recordOp(py::handle func, py::tuple args, py::dict kwargs, std::vector<int> host_args) {
  const c10::OperatorHandle op = operatorOf(func);
  torch::jit::Stack stack;
  {
    torch::jit::ToIValueAllowNumbersAsTensors numbers(true);
    stack = torch::jit::createStackForSchema(op.schema(), torch::jit::tuple_slice(std::move(args)),
                                             py::kwargs(std::move(kwargs)), std::nullopt);
  }
  frontend::CallOptions options;
  options.host_args = std::move(host_args);
  options.from_python = true;
  Recorded recorded;
  {
    py::gil_scoped_release no_gil;
    recorded = frontend::record(op, stack, options);
  }
  if (recorded.outcome == Outcome::kComposite) {
    py::gil_scoped_release no_gil;
    op.callBoxedForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd, stack);
  } else if (recorded.outcome != Outcome::kRecorded) {
    return py::reinterpret_borrow<py::object>(Py_NotImplemented);
  }
  const bool wants = recorded.wants_run;
  py::object result = torch::jit::createPyObjectForStack(std::move(stack));
  try {
    afterRecording(recorded, wants);
  } catch (python_error& e) {
    e.restore();
    throw py::error_already_set();
  }
  return result;
}

/// A compiled part's call by its capture (genie.compile's ExecutorPart): genie::call_graph
/// recorded straight from the part's arguments, without the dispatcher, the plan cache or the
/// meta kernel, since the capture knows the inputs' geometry and the outputs' descriptors. See
/// the binding's docstring.
class PartCall {
 public:
  PartCall(std::string graph, std::vector<int64_t> output_ids, std::vector<int> arg_of_input,
           std::vector<at::Tensor> constants, std::vector<int> written, const std::vector<at::Tensor>& inputs,
           const std::vector<at::Tensor>& outputs)
      : op_(c10::Dispatcher::singleton().findSchemaOrThrow("genie::call_graph", "")),
        graph_(std::move(graph)),
        output_ids_(c10::List<int64_t>(output_ids)),
        arg_of_input_(std::move(arg_of_input)),
        constants_(std::move(constants)),
        written_(std::move(written)) {
    TORCH_CHECK(inputs.size() == arg_of_input_.size() + constants_.size(), "PartCall: ", inputs.size(),
                " input tensors for ", arg_of_input_.size(), " arguments and ", constants_.size(), " constants");
    for (const at::Tensor& t : inputs) {
      inputs_.push_back({{t.sizes().begin(), t.sizes().end()}, {t.strides().begin(), t.strides().end()}, t.scalar_type()});
    }
    for (const at::Tensor& t : outputs) {  // as genie::call_graph's meta kernel makes them: fresh, offset 0
      frontend::Desc d;
      d.sizes.assign(t.sizes().begin(), t.sizes().end());
      d.strides.assign(t.strides().begin(), t.strides().end());
      d.dtype = t.scalar_type();
      d.finish();
      outputs_.push_back(std::move(d));
    }
  }

  py::object call(const py::tuple& args) const {
    const auto n_args = static_cast<size_t>(PyTuple_GET_SIZE(args.ptr()));
    const bool grad = c10::GradMode::is_enabled();
    const at::Tensor* tensor = nullptr;
    auto take = [&](int k) {
      if (k < 0 || static_cast<size_t>(k) >= n_args) return false;
      PyObject* obj = PyTuple_GET_ITEM(args.ptr(), k);
      if (!THPVariable_Check(obj)) return false;
      tensor = &THPVariable_Unpack(obj);
      return tensor->defined() && !(grad && tensor->requires_grad());
    };
    c10::List<at::Tensor> inputs;
    inputs.reserve(inputs_.size());
    for (size_t i = 0; i < arg_of_input_.size(); ++i) {
      if (!take(arg_of_input_[i]) || !inputs_[i].matches(*tensor)) return notImplemented();
      inputs.push_back(*tensor);
    }
    for (const at::Tensor& c : constants_) inputs.push_back(c);
    c10::List<at::Tensor> written;
    written.reserve(written_.size());
    for (int k : written_) {
      if (!take(k)) return notImplemented();
      written.push_back(*tensor);
    }
    std::vector<c10::IValue> stack{graph_, output_ids_, inputs, written};
    std::vector<c10::IValue> results;
    const Recorded recorded = frontend::recordKnown(op_, stack, outputs_, results);
    if (recorded.outcome != Outcome::kRecorded) return notImplemented();
    for (const at::Tensor& t : written) {  // an in-place write, as the autograd kernel counts one
      if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
    }
    afterRecording(recorded, recorded.wants_run);
    return torch::jit::toPyObject(results.at(0));
  }

 private:
  struct Geometry {
    std::vector<int64_t> sizes, strides;
    at::ScalarType dtype;
    bool matches(const at::Tensor& t) const {
      return t.scalar_type() == dtype && t.sizes().equals(sizes) && t.strides().equals(strides);
    }
  };
  static py::object notImplemented() { return py::reinterpret_borrow<py::object>(Py_NotImplemented); }

  c10::OperatorHandle op_;
  c10::IValue graph_, output_ids_;
  std::vector<int> arg_of_input_;
  std::vector<at::Tensor> constants_;
  std::vector<int> written_;
  std::vector<Geometry> inputs_;
  std::vector<frontend::Desc> outputs_;
};

}  // namespace

void bindDispatchKernel(py::module_& m) {
  py::class_<PartCall>(m, "PartCall", R"doc(A compiled part's call, recorded without dispatch.

PartCall(graph, output_ids, arg_of_input, constants, written, inputs, outputs): the part
registered as `graph` (32 hex digits) whose input i is argument `arg_of_input[i]` of a call or,
past them, `constants[i - len(arg_of_input)]` (LazyTensors); its outputs are wire values
`output_ids`; it writes arguments `written` in place. `inputs` (graph input order) and `outputs`:
the tensors of the capture, whose geometry (sizes, strides, dtype) calls must match and whose
outputs' geometry the call's results get.

`call(args: tuple) -> list[Tensor] | NotImplemented` records genie::call_graph(graph, output_ids,
inputs, written) as the dispatcher would (the written arguments' versions counted up), and runs
the pending graph when it passed its limit. NotImplemented, nothing recorded, when an input is
not a LazyTensor of the capture's geometry on one device, holds a lost value, or needs a
gradient (autograd on): the caller then takes torch.ops.genie.call_graph, which raises the
error.)doc")
      .def(py::init<std::string, std::vector<int64_t>, std::vector<int>, std::vector<at::Tensor>, std::vector<int>,
                    const std::vector<at::Tensor>&, const std::vector<at::Tensor>&>(),
           py::arg("graph"), py::arg("output_ids"), py::arg("arg_of_input"), py::arg("constants"), py::arg("written"),
           py::arg("inputs"), py::arg("outputs"))
      .def("call", &PartCall::call, py::arg("args"));
  m.def(
      "configure_recorder",
      [](py::object dispatch, std::vector<std::string> python_ops) {
        g_entry.dispatch = dispatch.release().ptr();
        frontend::LockGuard lock;
        frontend::setPythonOps(python_ops);
      },
      py::arg("dispatch"), py::arg("python_ops"),
      "configure_recorder(dispatch, python_ops): genie.python_ops.dispatch (the calls the C++ recorder does not "
      "take) and the aten ops ('aten::name.overload') always handed to dispatch. genie.python_ops calls it once at "
      "import.");
  m.def("register_recorder_kernels", &registerKernels, py::arg("extra"),
        "register_recorder_kernels(extra: list[str]) -> int: registers the recorder as remote_accelerator's "
        "PrivateUse1 fallback and as the PrivateUse1 kernel of the aten ops that would otherwise decompose "
        "(CompositeExplicitAutograd) and of `extra` ('name.overload'); returns how many ops got a kernel. "
        "RuntimeError when called twice.");
  m.def("record_op", &recordOp, py::arg("func"), py::arg("args"), py::arg("kwargs"),
        py::arg("host_args") = std::vector<int>{},
        "record_op(func, args, kwargs, host_args=()) -> result | NotImplemented\n\n"
        "Records the aten call `func(*args, **kwargs)` as it is (no routing to genie.python_ops's handlers): its "
        "result (LazyTensors as the schema returns them). `host_args`: argument indices where a host tensor is "
        "taken by design (its values are part of the plan's key). NotImplemented when the C++ recorder cannot "
        "record it: an argument's value is lost (genie.python_ops raises its error) or only the node can describe "
        "the outputs. Raises PyTorch's errors for invalid calls.");
  m.def("set_recorder_timing", [](bool on) { g_timing.store(on); },
        "set_recorder_timing(on): whether the PrivateUse1 kernel adds its time (outermost calls, the Python "
        "path included) to recorder_counters()['kernel_ns']. Off by default (two clock reads per op).");
  m.def("recorder_counters", [] {
    const auto c = frontend::recorderCounters();
    py::dict d;
    d["cpp"] = c.cpp;
    d["python"] = c.python;
    d["rule"] = c.rule;
    d["meta"] = c.meta;
    d["kernel_ns"] = g_kernel_ns.load();
    return d;
  }, "recorder_counters() -> {'cpp', 'python', 'rule', 'meta': int}: ops recorded by the C++ recorder and handed "
     "to genie.python_ops since the process started; plan-cache misses answered by a shape rule and by the meta "
     "kernel.");
}

}  // namespace genie::python
