#include "frontend/op_facts.h"

#include <algorithm>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "frontend/eager_checks.h"
#include "frontend/ir.h"
#include "genie/torch/deterministic_ops.h"
#include "genie/torch/sparse_ops.h"

// The deterministic variants' schemas (genie-node has their kernels): the recorder records one
// for an op called while torch.use_deterministic_algorithms(True) is in effect.
TORCH_LIBRARY_FRAGMENT(genie, m) {
  genie::deterministic::defineVariants(m, nullptr);
  m.def(genie::sparse::kPartsSchema);
}

namespace genie::frontend {
namespace {

// Ops that write arguments their schemas do not mark written: aten::native_batch_norm updates
// running_mean and running_var (arguments 3 and 4) in training mode. Without the write, a
// forward whose output is discarded (torch.optim.swa_utils.update_bn) would be dropped as dead.
const std::unordered_map<std::string, std::vector<int>>& undeclaredWrites() {
  static const auto* table = new std::unordered_map<std::string, std::vector<int>>{{"aten::native_batch_norm", {3, 4}}};
  return *table;
}

std::unordered_set<std::string>& pythonOps() {
  static auto* ops = new std::unordered_set<std::string>();
  return *ops;
}

// Keyed by the schema's address: stable while the operator is registered, and a pointer hash.
std::unordered_map<const void*, std::unique_ptr<OpFacts>>& cache() {
  static auto* c = new std::unordered_map<const void*, std::unique_ptr<OpFacts>>();
  return *c;
}

bool isTensor(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::TensorType) return true;
  if (auto optional = t->cast<c10::OptionalType>()) return optional->getElementType()->kind() == c10::TypeKind::TensorType;
  return false;
}

c10::TypeKind elementKind(const c10::TypePtr& t) {
  if (auto optional = t->cast<c10::OptionalType>()) return optional->getElementType()->kind();
  return t->kind();
}

ArgKind argKindOf(const c10::Argument& arg) {
  const auto& t = arg.real_type();
  if (isTensor(t)) return ArgKind::kTensor;
  if (auto list = t->cast<c10::ListType>()) {
    const auto& element = list->getElementType();
    if (element->kind() == c10::TypeKind::TensorType) return ArgKind::kTensorList;
    if (isTensor(element)) return ArgKind::kOptionalTensorList;
    return ArgKind::kOther;
  }
  switch (elementKind(t)) {
    case c10::TypeKind::ScalarTypeType: return ArgKind::kScalarType;
    case c10::TypeKind::LayoutType: return ArgKind::kLayout;
    case c10::TypeKind::MemoryFormatType: return ArgKind::kMemoryFormat;
    case c10::TypeKind::GeneratorType: return ArgKind::kGenerator;
    default: return ArgKind::kOther;
  }
}

/// The alias set of a return: its own, or (a Tensor(a)[] list: split, unbind, chunk) its elements'.
const std::unordered_set<c10::Symbol>* aliasSetOf(const c10::AliasInfo* alias) {
  if (alias == nullptr) return nullptr;
  if (!alias->beforeSets().empty()) return &alias->beforeSets();
  for (const auto& contained : alias->containedTypes()) {
    if (!contained.beforeSets().empty()) return &contained.beforeSets();
  }
  return nullptr;
}

std::unique_ptr<OpFacts> compute(const c10::OperatorHandle& op) {
  auto facts = std::make_unique<OpFacts>();
  const auto& schema = op.schema();
  facts->name = opNameOf(op);
  const auto& arguments = schema.arguments();
  std::unordered_map<c10::Symbol, int> alias_to_arg;
  for (size_t i = 0; i < arguments.size(); ++i) {
    facts->args.push_back(argKindOf(arguments[i]));
    if (const c10::AliasInfo* alias = arguments[i].alias_info()) {
      for (const auto& set : alias->beforeSets()) alias_to_arg.emplace(set, static_cast<int>(i));
      if (alias->isWrite()) facts->writes.push_back(static_cast<int>(i));
    }
  }
  if (auto extra = undeclaredWrites().find(facts->name); extra != undeclaredWrites().end()) {
    for (int w : extra->second) {
      if (std::find(facts->writes.begin(), facts->writes.end(), w) == facts->writes.end()) facts->writes.push_back(w);
    }
  }
  bool tensor_returns = true;
  for (const auto& ret : schema.returns()) {
    const auto& t = ret.real_type();
    if (auto list = t->cast<c10::ListType>(); list && isTensor(list->getElementType())) {
      facts->list_return = true;
    } else if (!isTensor(t)) {
      tensor_returns = false;
    }
    ReturnFacts r;
    if (const auto* set = aliasSetOf(ret.alias_info()); set != nullptr && !set->empty()) {
      auto found = alias_to_arg.find(*set->begin());
      if (found != alias_to_arg.end()) {
        r.arg = found->second;
        r.kind = ret.alias_info()->isWrite() ? ReturnFacts::kWrite : ReturnFacts::kView;
      }
    }
    facts->returns.push_back(r);
  }
  facts->seeded = op.hasTag(at::Tag::nondeterministic_seeded);
  facts->warns = warnsAsEager(schema.name());
  if (schema.name().rfind("aten::", 0) == 0) {
    facts->deterministic = c10::Dispatcher::singleton().findSchema(
        {genie::deterministic::variantName(schema.name()), schema.overload_name()});
  }

  // A deterministic variant plays its aten op's roles.
  const std::string aten = genie::deterministic::atenName(schema.name());
  const std::string name = aten.empty() ? facts->name : aten + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
  if (name == "aten::cat" || name == "aten::index_copy_" || name == "aten::index_copy" || name == "aten::slice_scatter") {
    facts->cache_role = OpFacts::CacheRole::kWriter;
  } else if (name == "aten::scaled_dot_product_attention") {
    facts->cache_role = OpFacts::CacheRole::kAttention;
  }
  facts->checks_index_values = name == "aten::index.Tensor" || name == "aten::index_put" ||
                               name == "aten::index_put_" || name == "aten::_index_put_impl_" ||
                               schema.name() == "aten::index_fill" || schema.name() == "aten::index_fill_";
  const std::string ns = schema.name().substr(0, schema.name().find("::"));
  if (pythonOps().count(name) != 0 || (ns != "aten" && ns != "prims" && ns != "genie")) {
    facts->route = Route::kPython;
  } else if (name == "aten::_to_copy") {
    facts->route = Route::kToCopy;
  } else if (name == "aten::copy_") {
    facts->route = Route::kCopy;
  } else if (name == "aten::index.Tensor" || name == "aten::index_put" || name == "aten::index_put_" ||
             name == "aten::_index_put_impl_") {
    facts->route = Route::kIndex;
  } else if (name == "aten::detach" || name == "aten::alias" || name == "aten::lift_fresh") {
    facts->route = Route::kSameValue;
  } else if (!tensor_returns) {
    facts->route = Route::kScalar;
  } else if (op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
             !op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
    facts->route = Route::kComposite;
  }
  return facts;
}

}  // namespace

const OpFacts& opFacts(const c10::OperatorHandle& op) {
  const void* key = &op.schema();
  auto& c = cache();
  auto found = c.find(key);
  if (found != c.end()) return *found->second;
  return *c.emplace(key, compute(op)).first->second;
}

void setPythonOps(const std::vector<std::string>& names) {
  pythonOps() = std::unordered_set<std::string>(names.begin(), names.end());
  // Nodes keep references to the facts: update the cached ones in place.
  for (auto& [schema, facts] : cache()) {
    auto op = c10::Dispatcher::singleton().findOp(static_cast<const c10::FunctionSchema*>(schema)->operator_name());
    if (op) *facts = std::move(*compute(*op));
  }
}

}  // namespace genie::frontend
