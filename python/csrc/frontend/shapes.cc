#include <pybind11/pybind11.h>
// pybind11 first: it includes Python.h, which torch's Python headers expect.
#include "frontend/shapes.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/List.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Exceptions.h>

#include <cctype>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>

#include "frontend/eager_checks.h"
#include "frontend/ir.h"
#include "frontend/lazy_tensor.h"
#include "frontend/op_facts.h"

namespace genie::frontend {

// ---- Desc ---------------------------------------------------------------------------------

at::QuantizerPtr quantizerOf(const at::Tensor& t) {
  // A quantized tensor's TensorImpl is a QTensorImpl (a device tensor's too, lazy_tensor.h); a view of
  // one as another dtype (`q.view(torch.uint8)`) keeps the quantized key set on a plain TensorImpl.
  if (!t.defined() || !c10::isQIntType(t.scalar_type())) return {};
  auto* impl = dynamic_cast<at::QTensorImpl*>(t.unsafeGetTensorImpl());
  return impl != nullptr ? impl->quantizer() : at::QuantizerPtr();
}

Desc Desc::of(const at::Tensor& tensor) {
  Desc d;
  if (!tensor.defined()) return undefined();
  d.sizes.assign(tensor.sizes().begin(), tensor.sizes().end());
  if (tensor.layout() != c10::kStrided) {  // no strides
    d.layout = tensor.layout();
    d.dtype = tensor.scalar_type();
    return d;
  }
  d.strides.assign(tensor.strides().begin(), tensor.strides().end());
  d.offset = tensor.storage_offset();
  d.dtype = tensor.scalar_type();
  d.conj = tensor.is_conj();
  d.neg = tensor.is_neg();
  if (tensor.is_quantized()) d.quantizer = quantizerOf(tensor);  // null unless of a quantized dtype
  d.finish();
  return d;
}

Desc Desc::undefined() {
  Desc d;
  d.defined = false;
  return d;
}

void Desc::finish() {
  contiguous = offset == 0;
  int64_t expected = 1;
  for (size_t i = sizes.size(); contiguous && i-- > 0;) {
    contiguous = strides[i] == expected;
    expected *= std::max<int64_t>(sizes[i], 1);
  }
}

bool Desc::operator==(const Desc& o) const {
  return defined == o.defined && sizes == o.sizes && strides == o.strides && offset == o.offset && dtype == o.dtype &&
         conj == o.conj && neg == o.neg && layout == o.layout &&
         (quantizer == o.quantizer || (quantizer && o.quantizer && quantizer->equalTo(o.quantizer)));
}

namespace {

Desc contiguousDesc(c10::SmallVector<int64_t, 6> sizes, at::ScalarType dtype) {
  Desc d;
  d.sizes = std::move(sizes);
  d.strides.resize(d.sizes.size());
  int64_t stride = 1;
  for (size_t i = d.sizes.size(); i-- > 0;) {
    d.strides[i] = stride;
    stride *= std::max<int64_t>(d.sizes[i], 1);
  }
  d.dtype = dtype;
  d.contiguous = true;
  return d;
}

/// The descriptor of a device tensor argument, or nullopt for anything else.
std::optional<Desc> lazyDesc(const c10::IValue& arg) {
  if (!arg.isTensor()) return std::nullopt;
  const at::Tensor& t = arg.toTensor();
  if (!t.defined() || !isLazy(t)) return std::nullopt;
  return Desc::of(t);
}

// ---- shape rules ----------------------------------------------------------------------------

/// c10::is_channels_last_strides_2d_s4: whether a 4-D tensor's suggest_memory_format() is channels_last.
bool channelsLastLike(const Desc& d) {
  if (d.strides[1] == 0) return false;
  int64_t smallest = 0;
  for (int dim : {1, 3, 2, 0}) {
    if (d.sizes[dim] == 0 || d.strides[dim] < smallest) return false;
    if (dim == 0 && smallest == d.strides[1]) return false;
    smallest = d.sizes[dim] > 1 ? d.strides[dim] * d.sizes[dim] : d.strides[dim];
  }
  return true;
}

/// aten::cat(Tensor[] tensors, int dim=0): same-dtype device tensors of one rank (1-4), equal
/// sizes except along `dim`, none conjugate, negative or channels_last-like (the output is then
/// contiguous, as cat_compute_output_memory_format decides).
std::optional<Shapes> catShapes(const torch::jit::Stack& args) {
  if (args.size() != 2 || !args[0].isTensorList() || !args[1].isInt()) return std::nullopt;
  const auto tensors = args[0].toTensorList();
  if (tensors.empty()) return std::nullopt;
  std::vector<Desc> descs;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !isLazy(t)) return std::nullopt;
    descs.push_back(Desc::of(t));
  }
  const Desc& first = descs[0];
  const auto rank = static_cast<int64_t>(first.sizes.size());
  int64_t dim = args[1].toInt();
  if (rank < 1 || rank > 4 || dim < -rank || dim >= rank) return std::nullopt;
  if (dim < 0) dim += rank;
  int64_t total = 0;
  for (const Desc& d : descs) {
    if (d.dtype != first.dtype || static_cast<int64_t>(d.sizes.size()) != rank || d.conj || d.neg) return std::nullopt;
    if (rank == 1 && d.sizes[0] == 0) return std::nullopt;  // a legacy empty tensor: cat skips it
    for (int64_t i = 0; i < rank; ++i) {
      if (i != dim && d.sizes[i] != first.sizes[i]) return std::nullopt;
    }
    if (rank == 4 && channelsLastLike(d)) return std::nullopt;
    total += d.sizes[dim];
  }
  auto sizes = first.sizes;
  sizes[dim] = total;
  return Shapes{{contiguousDesc(std::move(sizes), first.dtype)}};
}

bool broadcastsTo(const Desc& d, const int64_t (&target)[4]) {
  if (d.sizes.size() > 4) return false;
  for (size_t i = 0; i < d.sizes.size(); ++i) {
    const int64_t s = d.sizes[d.sizes.size() - 1 - i];
    if (s != 1 && s != target[3 - i]) return false;
  }
  return true;
}

/// aten::scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
/// is_causal=False, *, scale=None, enable_gqa=False) for 4-D floating query (B, H, L, E), key
/// (B, H, S, E) and value (B, H, S, Ev) of one dtype, none conjugate or negative, no dropout or
/// GQA, and an optional bool or same-dtype mask that broadcasts to (B, H, L, S): a contiguous
/// (B, H, L, Ev) output of query's dtype.
std::optional<Shapes> sdpaShapes(const torch::jit::Stack& args) {
  if (args.size() != 8) return std::nullopt;
  auto q = lazyDesc(args[0]), k = lazyDesc(args[1]), v = lazyDesc(args[2]);
  if (!q || !k || !v) return std::nullopt;
  if (!args[4].isDouble() || args[4].toDouble() != 0.0 || !args[5].isBool()) return std::nullopt;
  if (!args[7].isBool() || args[7].toBool()) return std::nullopt;
  const bool is_causal = args[5].toBool();
  if (!at::isFloatingType(q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype) return std::nullopt;
  if (q->conj || q->neg || k->conj || k->neg || v->conj || v->neg) return std::nullopt;
  if (q->sizes.size() != 4 || k->sizes.size() != 4 || v->sizes.size() != 4) return std::nullopt;
  const auto &qs = q->sizes, &ks = k->sizes, &vs = v->sizes;
  if (qs[0] != ks[0] || qs[1] != ks[1] || ks[0] != vs[0] || ks[1] != vs[1] || qs[3] != ks[3] || ks[2] != vs[2]) {
    return std::nullopt;
  }
  for (const auto* s : {&qs, &ks, &vs}) {
    for (int64_t x : *s) {
      if (x == 0) return std::nullopt;
    }
  }
  if (!args[3].isNone()) {
    if (is_causal) return std::nullopt;
    auto mask = lazyDesc(args[3]);
    if (!mask || (mask->dtype != at::kBool && mask->dtype != q->dtype) || mask->conj || mask->neg) return std::nullopt;
    const int64_t target[4] = {qs[0], qs[1], qs[2], ks[2]};
    if (!broadcastsTo(*mask, target)) return std::nullopt;
  }
  return Shapes{{contiguousDesc({qs[0], qs[1], qs[2], vs[3]}, q->dtype)}};
}

// ---- meta inference -----------------------------------------------------------------------

at::Tensor metaOf(const at::Tensor& t) {
  if (!t.defined() || !isLazy(t)) return t;
  const auto options = at::TensorOptions().device(c10::kMeta).dtype(t.scalar_type());
  at::Tensor meta;
  const int64_t offset = t.storage_offset();
  const int64_t held = storageElements(t);
  if (offset == 0 && held <= static_cast<int64_t>(t.numel())) {  // the common case: a contiguous tensor
    meta = at::empty_strided(t.sizes(), t.strides(), options);
  } else {
    meta = at::empty({held}, options).as_strided(t.sizes(), t.strides(), offset);
  }
  if (t.is_conj()) meta.unsafeGetTensorImpl()->_set_conj(true);
  if (t.is_neg()) meta.unsafeGetTensorImpl()->_set_neg(true);
  return meta;
}

c10::IValue metaArg(const c10::IValue& arg) { return mapTensors(arg, metaOf, c10::Device(c10::kMeta)); }

bool mentionsMeta(const std::string& text) {
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower.find("meta") != std::string::npos || text.find("data-dependent") != std::string::npos;
}

std::string context(const c10::OperatorHandle& op) {
  return "genie: " + opNameOf(op) + " on remote_accelerator, checked on the client by its meta kernel";
}

/// The Python error set now (a Python meta kernel's): NeedsNode when it says that only the node
/// can know the outputs (NotImplementedError, or a RuntimeError about meta tensors or
/// data-dependent shapes), else it again, as torch's python_error. With the GIL held.
[[noreturn]] void classifyPythonError(const c10::OperatorHandle& op) {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  bool needs_node = PyErr_GivenExceptionMatches(type, PyExc_NotImplementedError) != 0;
  std::string text;
  if (value != nullptr) {
    if (PyObject* s = PyObject_Str(value)) {
      if (const char* c = PyUnicode_AsUTF8(s)) text = c;
      Py_DECREF(s);
    }
    PyErr_Clear();
  }
  if (!needs_node && PyErr_GivenExceptionMatches(type, PyExc_RuntimeError) != 0) needs_node = mentionsMeta(text);
  if (needs_node) {
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    throw NeedsNode(text);
  }
  // Eager's exception, its message followed by where Genie met it.
  PyObject* again = PyObject_CallFunction(type, "s", (text + " (" + context(op) + ")").c_str());
  if (again != nullptr && PyExceptionInstance_Check(again)) {
    PyErr_SetObject(type, again);
    Py_DECREF(again);
  } else {
    Py_XDECREF(again);
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
    type = value = traceback = nullptr;
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
  python_error error;
  error.persist();
  throw error;
}

void flatten(const c10::IValue& out, std::vector<Desc>& descs) {
  if (out.isTensor()) {
    descs.push_back(Desc::of(out.toTensor()));
  } else if (out.isNone()) {
    descs.push_back(Desc::undefined());
  } else if (out.isTensorList()) {
    for (const at::Tensor& t : out.toTensorList()) descs.push_back(Desc::of(t));
  } else if (out.isList()) {
    for (const c10::IValue& x : out.toListRef()) flatten(x, descs);
  }
}

}  // namespace

int64_t storageElements(const at::Tensor& t) {
  int64_t span = 1;
  for (size_t i = 0; i < t.sizes().size(); ++i) {
    if (t.sizes()[i] == 0) span = 0;
    if (span > 0) span += (t.sizes()[i] - 1) * t.strides()[i];
  }
  const int64_t held = t.has_storage() ? static_cast<int64_t>(t.storage().nbytes()) / t.element_size() : 0;
  return std::max(t.storage_offset() + span, held);
}

c10::IValue mapTensors(const c10::IValue& arg, const std::function<at::Tensor(const at::Tensor&)>& f,
                       c10::Device device) {
  if (arg.isTensor()) return f(arg.toTensor());
  if (arg.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : arg.toTensorList()) out.push_back(f(t));
    return out;
  }
  if (arg.isList()) {
    const auto list = arg.toList();
    bool tensors = false;
    for (const c10::IValue& x : list) tensors = tensors || x.isTensor();
    if (!tensors) return arg;
    c10::List<std::optional<at::Tensor>> out;
    for (const c10::IValue& x : list) {
      const bool defined = x.isTensor() && x.toTensor().defined();
      out.push_back(defined ? std::optional<at::Tensor>(f(x.toTensor())) : std::nullopt);
    }
    return out;
  }
  if (arg.isDevice() && arg.toDevice().type() == c10::DeviceType::PrivateUse1) return device;
  return arg;
}

std::optional<Shapes> ruleShapes(const c10::OperatorHandle& op, const OpFacts& facts, const torch::jit::Stack& args) {
  (void)op;
  if (facts.name == "aten::cat") return catShapes(args);
  if (facts.name == "aten::scaled_dot_product_attention") return sdpaShapes(args);
  return std::nullopt;
}

namespace {

/// Drops the warnings of one call, C++ (TORCH_WARN) and Python (`warnings.warn` in a Python meta
/// kernel), while it lives.
class QuietWarnings {
 public:
  QuietWarnings() : guard_(&discard_) {
    pybind11::gil_scoped_acquire gil;
    pybind11::module_ warnings = pybind11::module_::import("warnings");
    catcher_ = warnings.attr("catch_warnings")();
    catcher_.attr("__enter__")();
    warnings.attr("simplefilter")("ignore");
  }
  ~QuietWarnings() {
    pybind11::gil_scoped_acquire gil;
    try {
      catcher_.attr("__exit__")(pybind11::none(), pybind11::none(), pybind11::none());
    } catch (const std::exception&) {
    }
    catcher_ = pybind11::object();
  }
  QuietWarnings(const QuietWarnings&) = delete;
  QuietWarnings& operator=(const QuietWarnings&) = delete;

 private:
  struct Discard final : c10::WarningHandler {
    void process(const c10::Warning& /*warning*/) override {}
  } discard_;
  c10::WarningUtils::WarningHandlerGuard guard_;
  pybind11::object catcher_;
};

}  // namespace

Shapes metaShapes(const c10::OperatorHandle& op, const OpFacts& facts, const torch::jit::Stack& args) {
  Shapes shapes;
  if (facts.returns.empty()) return shapes;  // `-> ()`: nothing to infer (aten::_fused_sgd_ has no meta kernel)
  // A call the CPU probe runs after this warns as eager's kernel does from the probe
  // (eager_checks.h probesAfterMeta), not from the meta kernel: Python meta kernels word the
  // resize warning of an out= call otherwise ("... the required output shape {str(shape)}").
  std::optional<QuietWarnings> quiet;
  if (probesAfterMeta(op, facts, args)) quiet.emplace();
  torch::jit::Stack stack;
  stack.reserve(args.size());
  for (const c10::IValue& arg : args) stack.push_back(metaArg(arg));
  try {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    c10::impl::ExcludeDispatchKeyGuard no_python(
        c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
    op.callBoxed(stack);
  } catch (const c10::NotImplementedError& e) {
    throw NeedsNode(e.what());
  } catch (c10::Error& e) {
    const bool plain = dynamic_cast<c10::IndexError*>(&e) == nullptr && dynamic_cast<c10::ValueError*>(&e) == nullptr &&
                       dynamic_cast<c10::TypeError*>(&e) == nullptr;
    if (plain && mentionsMeta(e.what_without_backtrace())) throw NeedsNode(e.what_without_backtrace());
    e.add_context(context(op));  // eager's message first, then where Genie met it
    throw;
  } catch (python_error& e) {
    pybind11::gil_scoped_acquire gil;
    e.restore();
    classifyPythonError(op);
  } catch (pybind11::error_already_set& e) {
    pybind11::gil_scoped_acquire gil;
    e.restore();
    classifyPythonError(op);
  }
  return shapesOfResults(stack);
}

Shapes shapesOfResults(const torch::jit::Stack& results) {
  Shapes shapes;
  for (const c10::IValue& out : results) flatten(out, shapes.outputs);
  return shapes;
}

// ---- the plan cache -------------------------------------------------------------------------

namespace {
std::vector<int64_t>& threadKeyBuffer() {
  thread_local std::vector<int64_t> buffer;
  return buffer;
}
}  // namespace

KeyBuilder::KeyBuilder(const c10::OperatorHandle& op) : words_(threadKeyBuffer()) {
  words_.clear();
  words_.push_back(reinterpret_cast<int64_t>(&op.schema()));
  // The default dtype decides the dtype of factories and of float scalars' promotion.
  words_.push_back(static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())));
}

void KeyBuilder::addLazy(const at::Tensor& t) {
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  words_.push_back(kLazy);
  words_.push_back(static_cast<int64_t>(t.scalar_type()) | (int64_t{t.is_conj()} << 8) | (int64_t{t.is_neg()} << 9));
  words_.push_back(static_cast<int64_t>(sizes.size()));
  words_.insert(words_.end(), sizes.begin(), sizes.end());
  words_.insert(words_.end(), strides.begin(), strides.end());
  words_.push_back(t.storage_offset());
  if (t.is_quantized()) {  // the outputs' quantizers follow the arguments'
    words_.push_back(kQuantizer);
    const at::QuantizerPtr q = quantizerOf(t);  // null for a view as another dtype
    if (const auto* affine = dynamic_cast<const at::PerTensorAffineQuantizer*>(q.get())) {
      int64_t scale_bits;
      const double scale = affine->scale();
      std::memcpy(&scale_bits, &scale, sizeof scale_bits);
      words_.push_back(scale_bits);
      words_.push_back(affine->zero_point());
    }
  }
}

void KeyBuilder::addHost(const at::Tensor& t) {
  const at::Tensor values = t.to(at::kLong).contiguous();
  words_.push_back(kHost);
  words_.push_back(static_cast<int64_t>(t.scalar_type()));
  words_.push_back(values.numel());
  const int64_t* data = values.data_ptr<int64_t>();
  words_.insert(words_.end(), data, data + values.numel());
}

namespace {

int64_t bitsOf(double d) {
  if (d != d) d = std::numeric_limits<double>::quiet_NaN();  // one NaN
  int64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  return bits;
}

}  // namespace

bool KeyBuilder::addValue(const c10::IValue& v) {
  if (v.isNone()) {
    words_.push_back(kNone);
  } else if (v.isBool()) {
    add(kBool, v.toBool());
  } else if (v.isInt()) {
    add(kInt, v.toInt());
  } else if (v.isDouble()) {
    add(kDouble, bitsOf(v.toDouble()));
  } else if (v.isComplexDouble()) {
    const auto c = v.toComplexDouble();
    add(kComplex, bitsOf(c.real()));
    words_.push_back(bitsOf(c.imag()));
  } else if (v.isString()) {
    add(kString, static_cast<int64_t>(std::hash<std::string_view>()(v.toStringView())));
  } else if (v.isSymInt()) {
    add(kInt, v.toSymInt().expect_int());
  } else if (v.isIntList()) {
    const auto list = v.toIntList();
    add(kIntList, static_cast<int64_t>(list.size()));
    for (int64_t x : list) words_.push_back(x);
  } else if (v.isDoubleList()) {
    const auto list = v.toDoubleList();
    add(kDoubleList, static_cast<int64_t>(list.size()));
    for (double x : list) words_.push_back(bitsOf(x));
  } else if (v.isBoolList()) {
    const auto list = v.toBoolList();
    add(kBoolList, static_cast<int64_t>(list.size()));
    for (bool x : list) words_.push_back(x);
  } else if (v.isDevice()) {
    add(kDevice, static_cast<int64_t>(v.toDevice().type()));
    words_.push_back(v.toDevice().index());
  } else if (v.isList()) {  // SymInt[], and Scalar[] (numbers of any kind: `_foreach_mul.ScalarList`)
    const auto list = v.toListRef();
    const bool ints = std::all_of(list.begin(), list.end(), [](const c10::IValue& x) { return x.isInt() || x.isSymInt(); });
    add(ints ? kIntList : kScalarList, static_cast<int64_t>(list.size()));
    for (const c10::IValue& x : list) {
      if (ints) {
        words_.push_back(x.isInt() ? x.toInt() : x.toSymInt().expect_int());
      } else if (x.isInt() || x.isDouble() || x.isBool() || x.isComplexDouble()) {
        if (!addValue(x)) return false;  // tagged: 2 and 2.0 promote differently
      } else {
        return false;
      }
    }
  } else {
    return false;
  }
  return true;
}

size_t hashWords(c10::ArrayRef<int64_t> words) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ words.size();
  for (int64_t w : words) {
    h ^= static_cast<uint64_t>(w);
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 32;
  }
  return static_cast<size_t>(h);
}

KeyView KeyBuilder::finish() { return KeyView{words_, hashWords(words_)}; }

namespace {

// Heterogeneous lookup: a KeyView finds a PlanKey without copying the words.
struct KeyHash {
  using is_transparent = void;
  size_t operator()(const PlanKey& k) const { return k.hash; }
  size_t operator()(const KeyView& k) const { return k.hash; }
};
struct KeyEqual {
  using is_transparent = void;
  static bool same(c10::ArrayRef<int64_t> a, c10::ArrayRef<int64_t> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(int64_t)) == 0;
  }
  bool operator()(const PlanKey& a, const PlanKey& b) const { return a.hash == b.hash && same(a.words, b.words); }
  bool operator()(const KeyView& a, const PlanKey& b) const { return a.hash == b.hash && same(a.words, b.words); }
  bool operator()(const PlanKey& a, const KeyView& b) const { return a.hash == b.hash && same(a.words, b.words); }
};

using PlanMap = std::unordered_map<PlanKey, std::unique_ptr<Plan>, KeyHash, KeyEqual>;

PlanMap& plans() {
  static auto* p = new PlanMap();
  return *p;
}

}  // namespace

const Plan* PlanCache::find(const KeyView& key) const {
  auto found = plans().find(key);
  return found == plans().end() ? nullptr : found->second.get();
}

const Plan* PlanCache::insert(const KeyView& key, Plan plan) {
  auto& p = plans();
  if (p.size() >= kMaxPlans) p.clear();
  auto found = p.find(key);
  if (found != p.end()) return found->second.get();
  PlanKey owned{std::vector<int64_t>(key.words.begin(), key.words.end()), key.hash};
  return p.emplace(std::move(owned), std::make_unique<Plan>(std::move(plan))).first->second.get();
}

size_t PlanCache::size() const { return plans().size(); }
void PlanCache::clear() { plans().clear(); }

PlanCache& planCache() {
  static PlanCache cache;
  return cache;
}

}  // namespace genie::frontend
