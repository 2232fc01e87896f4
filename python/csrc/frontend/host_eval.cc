#include "frontend/host_eval.h"

#include <ATen/ScalarOps.h>
#include <ATen/core/List.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <string_view>

#include "frontend/op_facts.h"

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

bool small(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()) <= kHostEvalMaxBytes; }

bool opIsExact(const OpFacts& facts, const c10::OperatorHandle& op) {
  if (!facts.writes.empty() || facts.seeded || facts.route == Route::kPython || facts.route == Route::kScalar) {
    return false;
  }
  std::string_view name = op.schema().name();
  name.remove_prefix(name.find("::") + 2);
  for (std::string_view denied : kDenied) {
    if (name.substr(0, denied.size()) == denied) return false;
  }
  return true;
}

/// Computes a value on the host. With `dry_run`, only checks that it could (every op exact,
/// every leaf known on the host, within the budget): a read the host cannot answer costs a walk
/// of the graph, not the ops on the way to the first unknown. Failure is a flag, not an
/// exception (an unwind costs more than the walk).
class HostEvaluator {
 public:
  explicit HostEvaluator(bool dry_run) : dry_run_(dry_run) {}

  bool failed() const { return failed_; }

  at::Tensor of(Value& value) {
    if (failed_ || value.storage->written) return fail();
    if (value.host.defined()) return value.host;
    Node* node = value.producer;
    if (node == nullptr || budget_ <= 0 || !node->writes.empty()) return fail();
    const OpFacts& facts = node->facts;
    if (!opIsExact(facts, node->op)) return fail();
    for (const ValuePtr& v : node->outputs) {
      if (!exactDtype(v->dtype)) return fail();
    }
    --budget_;
    if (dry_run_) {
      for (const c10::IValue& a : node->args) arg(a);
      return {};
    }
    torch::jit::Stack stack;
    for (size_t i = 0; i < node->args.size(); ++i) {
      const c10::IValue& a = node->args[i];
      if (i < facts.args.size() && facts.args[i] == ArgKind::kTensor && a.isScalar()) {
        at::Tensor number = c10::scalar_to_tensor(a.toScalar());  // a Python number at a Tensor argument
        number.unsafeGetTensorImpl()->set_wrapped_number(true);
        stack.emplace_back(std::move(number));
      } else {
        stack.push_back(arg(a));
      }
    }
    if (failed_) return {};
    try {
      node->op.callBoxed(stack);
    } catch (const std::exception&) {
      return fail();  // the node will report its own error
    }
    std::vector<at::Tensor> outs;
    for (const c10::IValue& out : stack) {
      if (out.isTensor()) {
        outs.push_back(out.toTensor());
      } else if (out.isTensorList()) {
        for (const at::Tensor& t : out.toTensorList()) outs.push_back(t);
      } else {
        return fail();
      }
    }
    if (outs.size() != node->outputs.size()) return fail();
    for (size_t i = 0; i < outs.size(); ++i) {
      Value& v = *node->outputs[i];
      if (outs[i].defined() && outs[i].scalar_type() == v.dtype && small(outs[i])) v.host = outs[i];
    }
    if (!value.host.defined()) return fail();
    return value.host;
  }

 private:
  at::Tensor fail() {
    failed_ = true;
    return {};
  }

  c10::IValue arg(const c10::IValue& a) {
    if (a.isCapsule()) {
      Value* v = valueOf(a);
      if (!exactDtype(v->dtype)) return fail();
      return of(*v);
    }
    if (a.isTensor()) {
      if (a.toTensor().defined() && !exactDtype(a.toTensor().scalar_type())) return fail();
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

  int budget_ = kHostEvalMaxNodes;
  const bool dry_run_;
  bool failed_ = false;
};

}  // namespace

at::Tensor hostValue(Value& value) {
  if (!g_enabled.load(std::memory_order_relaxed) || !exactDtype(value.dtype)) return {};
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

bool keepsHostCopy(at::ScalarType dtype, int64_t nbytes) { return exactDtype(dtype) && nbytes <= kHostEvalMaxBytes; }
void setHostEvalEnabled(bool enabled) { g_enabled.store(enabled, std::memory_order_relaxed); }
bool hostEvalEnabled() { return g_enabled.load(std::memory_order_relaxed); }

}  // namespace genie::frontend
