#include "frontend/recorder.h"

#include <ATen/Context.h>
#include <ATen/core/List.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/quantized/QTensorImpl.h>
#include <c10/util/SmallVector.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "frontend/device_storage.h"
#include "frontend/eager_checks.h"
#include "frontend/host_eval.h"
#include "frontend/lazy_tensor.h"
#include "frontend/lock.h"
#include "frontend/op_facts.h"
#include "frontend/shapes.h"

namespace genie::frontend {
namespace {

std::atomic<int64_t> g_cpp{0};
std::atomic<int64_t> g_python{0};
std::atomic<int64_t> g_rule{0};
std::atomic<int64_t> g_meta{0};

[[noreturn]] void deviceError(const c10::Device& a, const c10::Device& b) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", a, " and ",
              b, "!");
}

/// A Python number the arg parser wrapped as a tensor (`x * 0.5`), as the number again: it is
/// recorded as a scalar, as Python dispatch would see it.
c10::IValue numberOf(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kDouble: return *t.const_data_ptr<double>();
    case at::kLong: return *t.const_data_ptr<int64_t>();
    case at::kBool: return *t.const_data_ptr<bool>();
    case at::kComplexDouble: return *t.const_data_ptr<c10::complex<double>>();
    default: return t.item();
  }
}

/// The arguments of one call, walked once under the process lock: the plan's key, the node's
/// arguments, and the device they are on.
class Walk {
 public:
  Walk(const c10::OperatorHandle& op, const OpFacts& facts, const CallOptions& options)
      : key(op), facts_(facts), options_(options) {}

  KeyBuilder key;
  std::vector<c10::IValue> args;
  Recording* recording = nullptr;

  /// False when Python must take the call (a lost value: Python raises its error; an argument of
  /// a kind the recorder does not know). Throws PyTorch's device errors.
  bool run(const c10::IValue* first, size_t n) {
    args.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const c10::IValue& a = first[i];
      const ArgKind kind = i < facts_.args.size() ? facts_.args[i] : ArgKind::kOther;
      switch (kind) {
        case ArgKind::kTensor: {
          c10::IValue converted;
          if (!tensor(a, static_cast<int>(i), converted)) return false;
          args.push_back(std::move(converted));
          break;
        }
        case ArgKind::kTensorList:
        case ArgKind::kOptionalTensorList: {
          if (!a.isList()) return false;
          const auto list = a.toListRef();
          c10::impl::GenericList out(c10::AnyType::get());
          out.reserve(list.size());
          key.add(KeyBuilder::kTensorList, static_cast<int64_t>(list.size()));
          for (const c10::IValue& x : list) {
            c10::IValue converted;
            if (!tensor(x, static_cast<int>(i), converted)) return false;
            out.push_back(std::move(converted));
          }
          args.emplace_back(std::move(out));
          break;
        }
        case ArgKind::kGenerator:
          if (!a.isNone()) {
            // Random ops draw from the node's generator (seeded by torch.manual_seed); a local
            // generator cannot reach it. PyTorch's error for a generator of another device:
            TORCH_CHECK(false, "Expected a 'remote_accelerator' device type for generator but found '",
                        a.toGenerator().device().type(),
                        "' (genie: random ops draw from the node's generator; seed it with torch.manual_seed)");
          }
          key.add(KeyBuilder::kNone);
          args.emplace_back();
          break;
        default:
          if (!key.addValue(a)) return false;
          args.push_back(a);
      }
    }
    if (host_ && recording != nullptr) deviceError(recording->device(), host_device_);
    return true;
  }

 private:
  bool tensor(const c10::IValue& a, int index, c10::IValue& out) {
    if (a.isNone() || (a.isTensor() && !a.toTensor().defined())) {
      key.add(KeyBuilder::kNone);
      out = c10::IValue();
      return true;
    }
    if (!a.isTensor()) return false;
    const at::Tensor& t = a.toTensor();
    if (LazyState* impl = lazyState(t)) {
      Recording* rec = &impl->recording();
      if (recording != nullptr && recording != rec) deviceError(recording->device(), rec->device());
      recording = rec;
      const ValuePtr& value = impl->value();
      if (!value || value->lost()) return false;  // Python raises the value's error
      key.addLazy(t);
      out = capsuleOf(value);
      return true;
    }
    if (t.is_cpu() && !writes(index) && !t.is_quantized()) {  // a quantized one has no inline form: device error
      if (t.unsafeGetTensorImpl()->is_wrapped_number() && t.scalar_type() != at::kUInt64) {
        key.add(KeyBuilder::kWrapped, static_cast<int64_t>(t.scalar_type()));
        out = numberOf(t);
        return true;
      }
      if (std::find(options_.host_args.begin(), options_.host_args.end(), index) != options_.host_args.end()) {
        key.addHost(t);
        out = t.detach().contiguous().clone();
        return true;
      }
      // A constant: travels inline with the run; a snapshot, as eager reads it now. So does a
      // Python int above 2**63-1 (a uint64 wrapped number), which no wire scalar holds.
      if (t.dim() == 0) {
        key.add(KeyBuilder::kConstant, static_cast<int64_t>(t.scalar_type()));
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        out = t.detach().clone();
        return true;
      }
    }
    host_ = true;  // a host (or other device's) tensor beside device tensors, or written: PyTorch's device error
    host_device_ = t.device();
    out = c10::IValue();
    return true;
  }

  bool writes(int index) const {
    return std::find(facts_.writes.begin(), facts_.writes.end(), index) != facts_.writes.end();
  }

  const OpFacts& facts_;
  const CallOptions& options_;
  bool host_ = false;
  c10::Device host_device_{c10::kCPU};
};

/// The recording a factory call (no device tensor among its arguments) is for: its device
/// argument's. nullptr when there is none or its runtime does not exist yet (Python makes it).
Recording* factoryRecording(const c10::IValue* first, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (!first[i].isDevice()) continue;
    const c10::Device device = first[i].toDevice();
    if (device.type() != c10::DeviceType::PrivateUse1) continue;
    int index = device.index();
    if (index < 0) index = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->getDevice().index();
    return recordingFor(index);
  }
  return nullptr;
}

/// The route of a call whose facts route it conditionally: recorded as it is, or Python.
bool recordsHere(Route route, const c10::IValue* first, size_t n) {
  switch (route) {
    case Route::kToCopy: {  // _to_copy(self, *, dtype, layout, device, pin_memory, non_blocking, memory_format)
      LazyState* src = first[0].isTensor() ? lazyState(first[0].toTensor()) : nullptr;
      if (src == nullptr) return false;
      if (n > 4 && first[4].isBool() && first[4].toBool()) return false;  // pin_memory=True: PyTorch's error
      if (n > 3 && first[3].isDevice()) {
        const c10::Device device = first[3].toDevice();
        return device.type() == c10::DeviceType::PrivateUse1 && device.index() == src->recording().device_index;
      }
      return true;
    }
    case Route::kCopy: {  // copy_(self, src, non_blocking)
      LazyState* dst = first[0].isTensor() ? lazyState(first[0].toTensor()) : nullptr;
      LazyState* src = first[1].isTensor() ? lazyState(first[1].toTensor()) : nullptr;
      return dst != nullptr && src != nullptr && &dst->recording() == &src->recording();
    }
    case Route::kIndex: {
      // Recorded here when the indices are device tensors, None or 0-dim host tensors; Python
      // uploads other host indices, turns uint8 masks into bool ones (eager's deprecation warning)
      // and, for a put of a value with other than one element, bool masks into indices (eager's
      // nonzero: how many elements a mask selects decides whether the value fits).
      if (!first[1].isList()) return false;
      if (!first[0].isTensor() || !isLazy(first[0].toTensor())) return false;  // a host tensor indexed: Python's error
      const c10::IValue* value = n > 2 && first[2].isTensor() ? &first[2] : nullptr;  // index_put's values
      const bool put = value != nullptr && value->toTensor().defined() && value->toTensor().numel() != 1;
      for (const c10::IValue& x : first[1].toListRef()) {
        if (!x.isTensor() || !x.toTensor().defined()) continue;
        const at::Tensor& index = x.toTensor();
        if (!isLazy(index) && index.dim() > 0) return false;
        if (index.scalar_type() == at::kByte || (put && index.scalar_type() == at::kBool)) return false;
      }
      return true;
    }
    default:
      return true;
  }
}

/// Outputs of another layout than strided (sparse CSR from `to_sparse_csr()`: sparse COO takes
/// genie.sparse's path) have no wire form: NotImplementedError naming the op, before it is
/// recorded, for a call that would make one.
void refuseUnsupported(const OpFacts& facts, const std::vector<c10::IValue>& /*args*/, const Shapes& shapes) {
  for (const Desc& d : shapes.outputs) {
    TORCH_CHECK_NOT_IMPLEMENTED(d.layout == c10::kStrided, facts.name, ": ", d.layout,
                                " tensors are not supported on remote_accelerator; use sparse COO (to_sparse()) or "
                                "dense tensors");
  }
}

/// Whether the call is recorded as its deterministic variant (op_facts.h): while the program has
/// torch.use_deterministic_algorithms(True) in effect, and for index_put with accumulate=True
/// always (CUDA's kernel always sums in a sorted, fixed order; a multi-threaded CPU one does not).
bool deterministicNow(const OpFacts& facts, const c10::IValue* first, size_t n) {
  if (at::globalContext().deterministicAlgorithms()) return true;
  const std::string_view name = facts.name;
  const bool put = name.rfind("aten::index_put", 0) == 0 || name.rfind("aten::_index_put_impl_", 0) == 0 ||
                   name.rfind("aten::_unsafe_index_put", 0) == 0;
  return put && n > 3 && first[3].isBool() && first[3].toBool();
}

/// `inferred` takes the strides and offsets of `eager` (the CPU kernel's outputs of the same
/// call) wherever an output has the same sizes and dtype there: an out= tensor resized from
/// another shape is laid out as eager's TensorIterator lays it out.
void adoptLayouts(Shapes& inferred, const Shapes& eager) {
  for (size_t i = 0; i < inferred.outputs.size() && i < eager.outputs.size(); ++i) {
    Desc& d = inferred.outputs[i];
    const Desc& e = eager.outputs[i];
    if (!d.defined || !e.defined || d.dtype != e.dtype || d.sizes != e.sizes || d.layout != e.layout) continue;
    d.strides = e.strides;
    d.offset = e.offset;
    d.finish();
  }
}

/// Records the node of `op` on `rec` with `node_args` (the schema's arguments, device tensors
/// as Value capsules), whose outputs are `descs`, and makes its results (under the process
/// lock). `first`: the same arguments as the call gave them (device tensors as tensors).
std::vector<c10::IValue> emit(const c10::OperatorHandle& op, const OpFacts& facts, const std::vector<Desc>& descs,
                              Recording& rec, std::vector<c10::IValue> node_args, const c10::IValue* first,
                              Recorded& recorded) {
  RecordingPtr rec_ptr = RecordingPtr::reclaim_copy(&rec);

  std::vector<StoragePtr> writes;
  for (int w : facts.writes) {
    const c10::IValue& a = first[w];
    auto note = [&](const c10::IValue& x) {
      if (!x.isTensor()) return;
      const at::Tensor& t = x.toTensor();
      if (LazyState* state = lazyState(t)) {
        writes.push_back(state->value()->storage);
        if (t.has_storage()) materializeIfCow(t.storage());  // a lazy clone written: its own range
      }
    };
    if (a.isList()) {
      for (const c10::IValue& x : a.toListRef()) note(x);
    } else {
      note(a);
    }
  }
  if (facts.seeded) writes.push_back(rec.rng());

  // Each output: where it lives, and the argument tensor it aliases or writes (if a device tensor).
  c10::SmallVector<OutputSpec, 4> specs;
  c10::SmallVector<const at::Tensor*, 4> sources;
  c10::SmallVector<ReturnFacts::Kind, 4> kinds;
  for (size_t i = 0; i < descs.size(); ++i) {
    const ReturnFacts rf = facts.returns.empty() ? ReturnFacts{}
                                                 : facts.returns[facts.list_return ? 0 : std::min(i, facts.returns.size() - 1)];
    const at::Tensor* source = nullptr;
    if (rf.kind != ReturnFacts::kNew && rf.arg >= 0) {
      const c10::IValue& a = first[rf.arg];
      if (a.isTensor()) {
        source = &a.toTensor();
      } else if (a.isTensorList() || a.isList()) {
        const auto list = a.toListRef();
        if (i < list.size() && list[i].isTensor()) source = &list[i].toTensor();
      }
      if (source != nullptr && !isLazy(*source)) source = nullptr;
    }
    StoragePtr storage = source != nullptr ? lazyState(*source)->value()->storage : c10::make_intrusive<Storage>();
    specs.push_back({std::move(storage), descs[i].defined ? descs[i].dtype : at::kFloat});
    sources.push_back(source);
    kinds.push_back(rf.kind);
  }
  NodePtr node = Node::make(op, facts, std::move(node_args), specs, std::move(writes));
  for (size_t i = 0; i < descs.size(); ++i) {
    if (!descs[i].defined) continue;
    node->outputs[i]->sizes.assign(descs[i].sizes.begin(), descs[i].sizes.end());
    node->outputs[i]->sized = true;
  }
  rec.append(node);

  c10::SmallVector<at::Tensor, 4> outputs;
  for (size_t i = 0; i < descs.size(); ++i) {
    const Desc& desc = descs[i];
    if (!desc.defined) {
      outputs.emplace_back();
    } else if (kinds[i] == ReturnFacts::kWrite && sources[i] != nullptr) {
      lazyState(*sources[i])->rebind(node->outputs[i]);
      if (!(Desc::of(*sources[i]) == desc)) setGeometry(*sources[i], desc);  // a resizing out= op (arange.out into empty(0))
      if (desc.quantizer) {  // copy_ of a quantized tensor gives its quantizer
        if (auto* q = dynamic_cast<at::QTensorImpl*>(sources[i]->unsafeGetTensorImpl())) q->set_quantizer_(desc.quantizer);
      }
      outputs.push_back(*sources[i]);
    } else {
      const at::Tensor* base = kinds[i] == ReturnFacts::kView ? sources[i] : nullptr;
      if (base == nullptr && desc.dtype == at::kComplexHalf) {  // as eager's allocation (empty_generic) warns
        TORCH_WARN_ONCE("ComplexHalf support is experimental and many operators don't support it yet.");
      }
      outputs.push_back(makeLazy(node->outputs[i], desc, rec_ptr, base));
      recorded.fresh.push_back(outputs.back());
    }
  }

  // The results, as the schema returns them.
  std::vector<c10::IValue> results;
  const auto& returns = op.schema().returns();
  results.reserve(returns.size());
  if (facts.list_return) {
    c10::List<at::Tensor> list;
    for (at::Tensor& t : outputs) list.push_back(std::move(t));
    results.emplace_back(std::move(list));
  } else {
    for (size_t r = 0; r < returns.size(); ++r) {
      if (r < outputs.size() && outputs[r].defined()) {
        results.emplace_back(std::move(outputs[r]));
      } else if (returns[r].real_type()->kind() == c10::TypeKind::OptionalType) {
        results.emplace_back();
      } else {
        results.emplace_back(at::Tensor());
      }
    }
  }
  return results;
}

/// The same-value views (detach, alias, lift_fresh): a new tensor on the value of args[0].
std::optional<std::vector<c10::IValue>> sameValue(const c10::IValue* first, Recorded& recorded) {
  if (!first[0].isTensor()) return std::nullopt;
  const at::Tensor& src = first[0].toTensor();
  LazyState* impl = lazyState(src);
  if (impl == nullptr || !impl->value() || impl->value()->lost()) return std::nullopt;
  at::Tensor out = makeLazy(impl->value(), Desc::of(src), impl->recordingPtr(), &src);
  recorded.fresh.push_back(out);
  recorded.recording = &impl->recording();
  return std::vector<c10::IValue>{out};
}

}  // namespace

Recorded record(const c10::OperatorHandle& op, torch::jit::Stack& stack, const CallOptions& options) {
  const size_t n = op.schema().arguments().size();
  TORCH_CHECK(stack.size() >= n, opNameOf(op), ": ", stack.size(), " values on the stack for ", n, " arguments");
  const c10::IValue* first = stack.data() + (stack.size() - n);
  Recorded recorded;
  std::optional<Shapes> inferred;  // outputs inferred without the lock, for the next try
  std::vector<c10::IValue> results;
  while (true) {
    const OpFacts* facts = nullptr;
    {
      LockGuard lock;
      facts = &opFacts(op);
      const Route route = options.from_python ? Route::kRecord : facts->route;
      if (route == Route::kPython || route == Route::kScalar) return recorded;
      if (route == Route::kComposite) {
        recorded.outcome = Outcome::kComposite;
        return recorded;
      }
      if (route == Route::kSameValue) {
        auto same = sameValue(first, recorded);
        if (!same) return recorded;
        results = std::move(*same);
        break;  // nothing recorded: the pending graph did not grow
      }
      if (!recordsHere(route, first, n)) return recorded;
      if (facts->warns && !inferred) warnAsEager(*facts, first, n);  // once: a miss walks again
      if (facts->checks_index_values && !inferred) checkIndexValues(*facts, first, n);  // values: every call
      Walk walk(op, *facts, options);
      if (!walk.run(first, n)) return recorded;
      if (walk.recording == nullptr) walk.recording = factoryRecording(first, n);
      if (walk.recording == nullptr) return recorded;  // a factory for a device whose runtime Python makes
      const KeyView key = walk.key.finish();
      const Plan* plan = planCache().find(key);
      if (plan == nullptr && inferred) plan = planCache().insert(key, Plan{std::move(*inferred)});
      if (plan != nullptr) {
        recorded.recording = walk.recording;
        if (facts->deterministic && deterministicNow(*facts, first, n)) {
          results = emit(*facts->deterministic, opFacts(*facts->deterministic), plan->shapes.outputs,
                         *walk.recording, std::move(walk.args), first, recorded);
        } else {
          results = emit(op, *facts, plan->shapes.outputs, *walk.recording, std::move(walk.args), first, recorded);
        }
        recorded.wants_run = walk.recording->wantsRun();
        break;
      }
    }
    // A miss: infer the outputs with the lock released (a meta kernel may be Python), then walk
    // again (another thread may have changed a value meanwhile) and record.
    const std::vector<c10::IValue> args(first, first + n);
    try {
      if (isQuantizedCall(*facts, args)) {  // no meta tensor is quantized: the CPU's kernels say
        inferred = quantizedShapes(op, *facts, args);
        refuseUnsupported(*facts, args, *inferred);
        continue;
      }
      checkAsEager(op, *facts, args);  // eager's errors that the meta kernel does not raise
      auto rule = ruleShapes(op, *facts, args);
      (rule ? g_rule : g_meta).fetch_add(1, std::memory_order_relaxed);
      if (rule) {
        inferred = std::move(*rule);
      } else {
        try {
          inferred = metaShapes(op, *facts, args);
        } catch (const NeedsNode&) {
          throw;
        } catch (const std::exception& error) {
          raiseAsEager(op, *facts, args);  // the CPU kernel's error where it raises one alike
          inferred = shapesOnCpuKernels(op, *facts, args, error);  // a CUDA-only alert on a CPU node
          if (!inferred) throw;                                     // else the meta kernel's
        } catch (...) {
          raiseAsEager(op, *facts, args);
          throw;
        }
      }
      if (std::optional<Shapes> eager = checkUnusualOnCpu(op, *facts, args)) adoptLayouts(*inferred, *eager);
      refuseUnsupported(*facts, args, *inferred);
    } catch (const NeedsNode&) {
      return recorded;  // the node runs it now and describes its outputs (genie.python_ops)
    }
  }
  if (!options.from_python) g_cpp.fetch_add(1, std::memory_order_relaxed);
  recorded.outcome = Outcome::kRecorded;
  torch::jit::drop(stack, n);  // outside the lock: a tensor dying here may take the GIL (its Python object)
  for (c10::IValue& r : results) stack.push_back(std::move(r));
  return recorded;
}

namespace {

/// `a` as a node argument: a LazyTensor (alone or in a Tensor[]) as its Value capsule, anything
/// else as it is. False when a tensor is not a LazyTensor on `rec` (set from the first one) or
/// holds no value or a lost one.
bool knownArgument(const c10::IValue& a, Recording*& rec, c10::IValue& out) {
  auto one = [&rec](const c10::IValue& x, c10::IValue& converted) {
    LazyState* impl = x.isTensor() ? lazyState(x.toTensor()) : nullptr;
    if (impl == nullptr || (rec != nullptr && rec != &impl->recording())) return false;
    rec = &impl->recording();
    const ValuePtr& value = impl->value();
    if (!value || value->lost()) return false;
    converted = capsuleOf(value);
    return true;
  };
  if (a.isTensor()) return one(a, out);
  if (!a.isTensorList()) {
    out = a;
    return true;
  }
  const auto list = a.toListRef();
  c10::impl::GenericList converted(c10::AnyType::get());
  converted.reserve(list.size());
  for (const c10::IValue& x : list) {
    c10::IValue v;
    if (!one(x, v)) return false;
    converted.push_back(std::move(v));
  }
  out = std::move(converted);
  return true;
}

}  // namespace

Recorded recordKnown(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args, const std::vector<Desc>& outputs,
                     std::vector<c10::IValue>& results) {
  Recorded recorded;
  LockGuard lock;
  const OpFacts& facts = opFacts(op);
  TORCH_CHECK(args.size() == op.schema().arguments().size(), facts.name, ": ", args.size(), " arguments for ",
              op.schema().arguments().size());
  Recording* rec = nullptr;
  std::vector<c10::IValue> node_args(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    if (!knownArgument(args[i], rec, node_args[i])) return recorded;
  }
  if (rec == nullptr) return recorded;
  recorded.recording = rec;
  results = emit(op, facts, outputs, *rec, std::move(node_args), args.data(), recorded);
  recorded.wants_run = rec->wantsRun();
  recorded.outcome = Outcome::kRecorded;
  g_cpp.fetch_add(1, std::memory_order_relaxed);
  return recorded;
}

RecorderCounters recorderCounters() {
  return {g_cpp.load(std::memory_order_relaxed), g_python.load(std::memory_order_relaxed),
          g_rule.load(std::memory_order_relaxed), g_meta.load(std::memory_order_relaxed)};
}

void countPython() { g_python.fetch_add(1, std::memory_order_relaxed); }

}  // namespace genie::frontend
