#include "frontend/host_eval.h"

#include <ATen/ScalarOps.h>
#include <ATen/core/List.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "frontend/op_facts.h"
#include "frontend/recording.h"

namespace genie::frontend {
namespace {

std::atomic<bool> g_enabled{true};

// Ops never evaluated on the host (aten names without the namespace, by prefix): uninitialized
// memory, storage tricks, orders of ties that may differ between devices, and ops the node's
// accelerator may refuse for integers (a host answer would hide the node's error).
constexpr std::string_view kDenied[] = {
    "empty", "new_empty", "resize", "set_", "as_strided", "sort", "argsort", "msort", "topk", "kthvalue",
    "unique", "_unique", "mode", "median", "nanmedian", "_local_scalar_dense", "mm", "bmm", "addmm", "matmul",
    "conv", "_conv", "baddbmm", "addbmm", "dot", "vdot", "mv"};

bool exactDtype(at::ScalarType t) { return !at::isFloatingType(t) && !at::isComplexType(t); }

// Ops whose results on floating-point and complex tensors are the same bits on every device
// (aten names without the namespace, whole): they move, select or compare values, or take their
// sign or integer part, and compute nothing that rounds (host_eval.h).
constexpr std::string_view kFloatExact[] = {
    // data movement
    "alias", "detach", "lift_fresh", "view", "_unsafe_view", "reshape", "_reshape_alias", "view_as", "expand",
    "expand_as", "squeeze", "unsqueeze", "t", "transpose", "permute", "select", "slice", "narrow", "unbind", "split",
    "split_with_sizes", "chunk", "flatten", "unflatten", "movedim", "diagonal", "clone", "contiguous", "cat", "stack",
    "index_select", "gather", "take", "index", "masked_select", "nonzero", "flip", "roll", "repeat", "unfold",
    "zeros_like", "ones_like", "full_like", "where", "masked_fill",
    // comparisons and tests
    "eq", "ne", "lt", "le", "gt", "ge", "isfinite", "isnan", "isinf", "isposinf", "isneginf", "signbit",
    "logical_not", "logical_and", "logical_or", "logical_xor", "any", "all", "count_nonzero",
    // sign and integer part
    "abs", "neg", "sign", "ceil", "floor", "trunc"};

bool floatExact(const Node& node) {
  std::string_view name = node.op.schema().name();
  if (name.substr(0, 6) != "aten::") return false;
  name.remove_prefix(6);
  if (name == "round") return node.op.schema().overload_name().empty();  // round.decimals scales: rounds
  if (name == "_to_copy") {  // a conversion to a floating type rounds to nearest, as every device does
    const at::ScalarType out = node.outputs.empty() ? at::kFloat : node.outputs[0]->dtype;
    return at::isFloatingType(out) || at::isComplexType(out) || out == at::kBool;
  }
  for (std::string_view exact : kFloatExact) {
    if (name == exact) return true;
  }
  return false;
}

/// Whether `node` reads or makes a floating-point or complex tensor.
bool touchesFloats(const Node& node) {
  auto floating = [](at::ScalarType t) { return at::isFloatingType(t) || at::isComplexType(t); };
  for (const ValuePtr& v : node.outputs) {
    if (floating(v->dtype)) return true;
  }
  for (const Value* v : node.inputs()) {
    if (floating(v->dtype)) return true;
  }
  for (const c10::IValue& a : node.args) {
    if (a.isTensor() && a.toTensor().defined() && floating(a.toTensor().scalar_type())) return true;
  }
  return false;
}

/// A value's bytes by its sizes (at most kHostEvalMaxBytes to be read whole for a host copy).
bool smallBySizes(const Value& v) {
  if (!v.sized) return false;
  int64_t n = static_cast<int64_t>(c10::elementSize(v.dtype));
  for (int64_t s : v.sizes) n *= s;
  return n <= kHostEvalMaxBytes;
}

bool small(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()) <= kHostEvalMaxBytes; }

bool deniedName(const c10::OperatorHandle& op) {
  std::string_view name = op.schema().name();
  name.remove_prefix(name.find("::") + 2);
  for (std::string_view denied : kDenied) {
    if (name.substr(0, denied.size()) == denied) return true;
  }
  return false;
}

bool opIsExact(const OpFacts& facts, const c10::OperatorHandle& op) {
  if (!facts.writes.empty() || facts.seeded || facts.route == Route::kPython || facts.route == Route::kScalar) {
    return false;
  }
  return !deniedName(op);
}

class Replay;

/// Computes a value on the host. With `dry_run`, only checks that it could (every op exact,
/// every leaf known on the host, within the budget): a read the host cannot answer costs a walk
/// of the graph, not the ops on the way to the first unknown. Failure is a flag, not an
/// exception (an unwind costs more than the walk). With a Replay, values on the replayed storage
/// are the replay's, and nothing computed is kept in Value::host (a memo of this evaluation
/// instead). A dry run given `missing` notes there the resident values without host copies it
/// would need (hostLeaves) instead of failing on them.
class HostEvaluator {
 public:
  explicit HostEvaluator(bool dry_run, Replay* replay = nullptr, std::vector<ValuePtr>* missing = nullptr)
      : dry_run_(dry_run), replay_(replay), missing_(missing) {}

  bool failed() const { return failed_; }

  at::Tensor of(Value& value);

  /// The node's outputs computed on the host from its arguments (empty when it failed, or on a
  /// dry run). `writes_ok`: a write a Replay applies (its outputs are views of what it wrote).
  std::vector<at::Tensor> run(Node& node, bool writes_ok = false);

  at::Tensor fail() {
    failed_ = true;
    return {};
  }

  /// The host form of one argument: a Value's host contents, a CPU device for the node's, a
  /// list of them.
  c10::IValue arg(const c10::IValue& a);

  /// The seq of the node whose arguments are being read (0: the read that started it).
  int64_t reader() const { return reader_; }

 private:
  int budget_ = kHostEvalMaxNodes;
  const bool dry_run_;
  Replay* const replay_;
  std::vector<ValuePtr>* const missing_;
  bool failed_ = false;
  int64_t reader_ = 0;
  std::unordered_map<const Value*, at::Tensor> memo_;  // with a Replay
  std::unordered_set<const Value*> checked_;           // on a dry run: the values walked
};

/// The contents of one storage that recorded ops wrote, replayed on the host in program order:
/// the op that made it, then every write to it (see checkedHostValue). Reads of it are allowed
/// to the writes themselves while they are applied, and afterwards to ops recorded after the
/// last write; the views on the way share its host buffer, as the node's share its memory.
class Replay {
 public:
  Replay(Storage& storage, const Recording& recording) : storage_(&storage) {
    for (const NodePtr& node : recording.pending()) {
      for (const StoragePtr& w : node->writes) {
        if (w.get() == storage_) {
          writers_.push_back(node.get());
          break;
        }
      }
    }
    // every write still pending (none ran on the node, none was dropped), and few of them
    ok_ = !writers_.empty() && writers_.size() == storage.writes && writers_.size() <= kMaxWrites;
  }

  const Storage* storage() const { return storage_; }

  /// Applies every write in program order, `value` (on the storage) giving the way to the op
  /// that made the storage. False when the host cannot.
  bool apply(Value& value, HostEvaluator& ev) {
    if (!ok_ || !findCreator(value, ev)) return false;
    for (Node* w : writers_) {
      if (w->writes.size() != 1 || !writeIsExact(*w)) return false;
      applying_ = w->seq;
      ev.run(*w, /*writes_ok=*/true);
      if (ev.failed()) return false;
    }
    applying_ = 0;
    return true;
  }

  /// `value`'s contents (a host view of the storage's buffer) read on behalf of ev.reader().
  at::Tensor read(Value& value, HostEvaluator& ev) {
    const int64_t reader = ev.reader();
    const bool allowed = geometry_ > 0 ||  // a view op on the way: geometry, not contents
                         (applying_ != 0 ? reader == applying_ : (reader == 0 || reader > writers_.back()->seq));
    if (!allowed) return ev.fail();
    return viewOf(value, ev);
  }

 private:
  static constexpr size_t kMaxWrites = 16;

  static bool writeIsExact(const Node& node);

  /// Follows `value` back through views of the storage and the writes that return it to the op
  /// that made the storage, whose output becomes the buffer.
  bool findCreator(Value& value, HostEvaluator& ev) {
    Value* v = &value;
    for (int steps = 0; steps < kHostEvalMaxNodes; ++steps) {
      Node* p = v->producer;
      if (p == nullptr) {
        if (!v->host.defined()) return false;  // resident and unknown: the node has it
        creator_ = v;
        root_ = v->host.clone();
        return true;
      }
      Value* aliased = aliasedInput(*v);
      if (aliased == nullptr) {  // a new storage: this op made it
        if (p->seq >= writers_.front()->seq) return false;
        if (uninitialized(*p)) {  // `empty` (torch.ones records empty, then fill_): the first write fills it all
          if (!v->sized || !overwrites(*writers_.front(), *v)) return false;
          creator_ = v;
          root_ = at::zeros(v->sizes, at::TensorOptions().dtype(v->dtype));
          return true;
        }
        std::vector<at::Tensor> outs = ev.run(*p);
        if (ev.failed() || v->index >= outs.size() || !outs[v->index].defined()) return false;
        creator_ = v;
        root_ = outs[v->index];
        return true;
      }
      if (aliased->storage.get() != storage_) return false;
      v = aliased;
    }
    return false;
  }

  /// The argument Value on the same storage that output `v` of its producer aliases (a view) or
  /// is (a write that returns what it wrote); nullptr for a new tensor.
  static Value* aliasedInput(const Value& v) {
    const Node& p = *v.producer;
    const OpFacts& facts = p.facts;
    const size_t r = facts.list_return ? 0 : v.index;
    if (r >= facts.returns.size()) return nullptr;
    const ReturnFacts& ret = facts.returns[r];
    if (ret.kind == ReturnFacts::kNew || ret.arg < 0 || static_cast<size_t>(ret.arg) >= p.args.size()) return nullptr;
    Value* in = valueOf(p.args[ret.arg]);
    return in != nullptr && in->storage == v.storage ? in : nullptr;
  }

  /// A host view of the buffer with `value`'s geometry, made by the same view ops.
  at::Tensor viewOf(Value& value, HostEvaluator& ev) {
    if (&value == creator_) return root_;
    auto it = views_.find(&value);
    if (it != views_.end()) return it->second;
    Node* p = value.producer;
    if (p == nullptr) return ev.fail();
    Value* aliased = aliasedInput(value);
    if (aliased == nullptr) return ev.fail();
    at::Tensor view;
    if (p->facts.returns[p->facts.list_return ? 0 : value.index].kind == ReturnFacts::kWrite) {
      view = viewOf(*aliased, ev);  // what the write returns is what it wrote
    } else {
      if (!viewIsExact(*p)) return ev.fail();
      ++geometry_;
      std::vector<at::Tensor> outs = ev.run(*p);  // a view: reads the buffer's geometry only
      --geometry_;
      if (ev.failed() || value.index >= outs.size()) return ev.fail();
      view = outs[value.index];
    }
    if (!view.defined()) return ev.fail();
    views_.emplace(&value, view);
    return view;
  }

  static bool viewIsExact(const Node& node);

  /// Whether `node` makes uninitialized memory (empty and its kin).
  static bool uninitialized(const Node& node) {
    const std::string& name = node.op.schema().name();
    return name == "aten::empty" || name == "aten::empty_strided" || name == "aten::empty_like" ||
           name == "aten::new_empty" || name == "aten::new_empty_strided";
  }
  /// Whether the write `node` sets every element of `v` whatever it held: fill_, zero_ or copy_
  /// of `v` itself, or an out= op writing `v` (`torch.arange` records `empty`, then arange.out).
  static bool overwrites(const Node& node, const Value& v) {
    if (node.facts.writes.size() != 1) return false;
    const int w = node.facts.writes[0];
    if (static_cast<size_t>(w) >= node.args.size() || valueOf(node.args[w]) != &v) return false;
    const std::string& name = node.op.schema().name();
    return name == "aten::fill_" || name == "aten::zero_" || name == "aten::copy_" ||
           node.schema().arguments()[w].kwarg_only();
  }

  Storage* const storage_;
  std::vector<Node*> writers_;  // program order
  bool ok_ = false;
  int64_t applying_ = 0;  // the seq of the write being applied
  int geometry_ = 0;      // view ops being run (viewOf)
  Value* creator_ = nullptr;
  at::Tensor root_;
  std::unordered_map<const Value*, at::Tensor> views_;
};

bool Replay::writeIsExact(const Node& node) {
  const OpFacts& facts = node.facts;
  if (facts.seeded || facts.route == Route::kPython || facts.route == Route::kScalar || deniedName(node.op)) {
    return false;
  }
  // aten's writes only, and none whose result depends on the order duplicate indices are
  // written in (which of two values lands may differ between the host and the node)
  static constexpr std::string_view kUnordered[] = {"index_put", "_index_put_impl_", "_unsafe_index_put", "scatter",
                                                    "put", "index_copy", "masked_scatter"};
  std::string_view name = node.op.schema().name();
  if (name.substr(0, 6) != "aten::") return false;
  name.remove_prefix(6);
  for (std::string_view unordered : kUnordered) {
    if (name.substr(0, unordered.size()) == unordered) return false;
  }
  return true;
}

bool Replay::viewIsExact(const Node& node) { return node.writes.empty() && !deniedName(node.op); }

at::Tensor HostEvaluator::of(Value& value) {
  if (failed_) return {};
  if (replay_ != nullptr && value.storage.get() == replay_->storage()) {
    if (dry_run_) return {};
    return replay_->read(value, *this);
  }
  if (value.storage->written()) return fail();
  if (value.host.defined()) return value.host;
  if (replay_ != nullptr) {
    auto it = memo_.find(&value);
    if (it != memo_.end()) return it->second;
  }
  if (dry_run_ && !checked_.insert(&value).second) return {};  // walked already: once per value
  Node* node = value.producer;
  if (node == nullptr) {
    if (missing_ == nullptr || !value.handle || value.lost() || c10::isQIntType(value.dtype) || !smallBySizes(value)) {
      return fail();  // a quantized value travels as its integer representation: not read whole
    }
    for (const ValuePtr& m : *missing_) {
      if (m.get() == &value) return {};
    }
    missing_->push_back(ValuePtr::reclaim_copy(&value));  // resident: read whole, it would do
    return {};
  }
  std::vector<at::Tensor> outs = run(*node);
  if (failed_ || dry_run_) return {};
  for (size_t i = 0; i < outs.size(); ++i) {
    Value& v = *node->outputs[i];
    if (!outs[i].defined() || outs[i].scalar_type() != v.dtype || !small(outs[i])) continue;
    if (replay_ != nullptr) {
      memo_[&v] = outs[i];
    } else {
      v.host = outs[i];
    }
  }
  if (replay_ != nullptr) {
    auto it = memo_.find(&value);
    return it != memo_.end() ? it->second : fail();
  }
  if (!value.host.defined()) return fail();
  return value.host;
}

std::vector<at::Tensor> HostEvaluator::run(Node& node, bool writes_ok) {
  if (failed_ || budget_ <= 0 || (!writes_ok && !node.writes.empty())) {
    fail();
    return {};
  }
  const OpFacts& facts = node.facts;
  if (!writes_ok && !opIsExact(facts, node.op)) {
    fail();
    return {};
  }
  if (touchesFloats(node) && !floatExact(node)) {  // a write too: none of kFloatExact writes
    fail();
    return {};
  }
  --budget_;
  const int64_t outer = reader_;
  reader_ = node.seq;
  torch::jit::Stack stack;
  for (size_t i = 0; i < node.args.size(); ++i) {
    const c10::IValue& a = node.args[i];
    if (i < facts.args.size() && facts.args[i] == ArgKind::kTensor && a.isScalar()) {
      at::Tensor number = c10::scalar_to_tensor(a.toScalar());  // a Python number at a Tensor argument
      number.unsafeGetTensorImpl()->set_wrapped_number(true);
      stack.emplace_back(std::move(number));
    } else {
      stack.push_back(arg(a));
    }
  }
  reader_ = outer;
  if (failed_ || dry_run_) return {};
  try {
    node.op.callBoxed(stack);
  } catch (const std::exception&) {
    fail();  // the node will report its own error
    return {};
  }
  std::vector<at::Tensor> outs;
  for (const c10::IValue& out : stack) {
    if (out.isTensor()) {
      outs.push_back(out.toTensor());
    } else if (out.isTensorList()) {
      for (const at::Tensor& t : out.toTensorList()) outs.push_back(t);
    } else if (!writes_ok) {
      fail();
      return {};
    }
  }
  if (!writes_ok && outs.size() != node.outputs.size()) {
    fail();
    return {};
  }
  return outs;
}

c10::IValue HostEvaluator::arg(const c10::IValue& a) {
  if (a.isCapsule()) return of(*valueOf(a));
  if (a.isTensor()) {
    // A host tensor argument (an inline upload's snapshot, a constant): integers only, as upload
    // host copies are (keepsHostCopy). Floats on the host come from what the node returned.
    const at::Tensor& t = a.toTensor();
    if (t.defined() && !exactDtype(t.scalar_type())) return fail();
    return a;
  }
  if (a.isDevice() && a.toDevice().type() != c10::kCPU) return c10::Device(c10::kCPU);
  if (a.isList() && !a.isIntList() && !a.isDoubleList() && !a.isBoolList()) {
    const auto list = a.toListRef();
    bool tensors = false;
    for (const c10::IValue& x : list) tensors = tensors || x.isCapsule() || x.isTensor();
    if (!tensors) return a;
    bool optional = false;
    for (const c10::IValue& x : list) optional = optional || x.isNone();
    if (optional) {
      c10::List<std::optional<at::Tensor>> out;
      for (const c10::IValue& x : list) out.push_back(x.isNone() ? std::nullopt : std::optional<at::Tensor>(arg(x).toTensor()));
      return out;
    }
    c10::List<at::Tensor> out;
    for (const c10::IValue& x : list) out.push_back(arg(x).toTensor());
    return out;
  }
  return a;
}

}  // namespace

at::Tensor hostValue(Value& value) {
  if (!g_enabled.load(std::memory_order_relaxed)) return {};
  c10::AutoGradMode no_grad(false);
  c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  HostEvaluator check(/*dry_run=*/true);
  check.of(value);
  if (check.failed()) return {};
  HostEvaluator evaluate(/*dry_run=*/false);
  at::Tensor out = evaluate.of(value);
  return evaluate.failed() ? at::Tensor() : out;
}

std::vector<ValuePtr> hostLeaves(Value& value) {
  std::vector<ValuePtr> missing;
  if (!g_enabled.load(std::memory_order_relaxed) || value.host.defined()) return missing;
  HostEvaluator check(/*dry_run=*/true, nullptr, &missing);
  check.of(value);
  if (check.failed()) missing.clear();
  return missing;
}

std::optional<std::vector<at::Tensor>> hostOutputs(Node& node) {
  if (!g_enabled.load(std::memory_order_relaxed)) return std::nullopt;
  c10::AutoGradMode no_grad(false);
  c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  HostEvaluator check(/*dry_run=*/true);
  check.run(node);
  if (check.failed()) return std::nullopt;
  HostEvaluator evaluate(/*dry_run=*/false);
  std::vector<at::Tensor> outs = evaluate.run(node);
  if (evaluate.failed()) return std::nullopt;
  for (const at::Tensor& t : outs) {
    if (!t.defined() || !small(t)) return std::nullopt;
  }
  return outs;
}

std::vector<ValuePtr> hostLeavesOf(Node& node) {
  std::vector<ValuePtr> missing;
  if (!g_enabled.load(std::memory_order_relaxed)) return missing;
  HostEvaluator check(/*dry_run=*/true, nullptr, &missing);
  check.run(node);
  if (check.failed()) missing.clear();
  return missing;
}

at::Tensor checkedHostValue(Value& value, const Recording& recording) {
  if (!g_enabled.load(std::memory_order_relaxed) || !exactDtype(value.dtype)) return {};
  if (!value.storage->written()) return hostValue(value);
  c10::AutoGradMode no_grad(false);
  c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  Replay replay(*value.storage, recording);
  HostEvaluator evaluate(/*dry_run=*/false, &replay);
  if (!replay.apply(value, evaluate)) return {};
  at::Tensor out = evaluate.of(value);
  return evaluate.failed() || !out.defined() ? at::Tensor() : out.clone();
}

bool keepsHostCopy(at::ScalarType dtype, int64_t nbytes) { return exactDtype(dtype) && nbytes <= kHostEvalMaxBytes; }
void setHostEvalEnabled(bool enabled) { g_enabled.store(enabled, std::memory_order_relaxed); }
bool hostEvalEnabled() { return g_enabled.load(std::memory_order_relaxed); }

}  // namespace genie::frontend
