// Deterministic variants of the aten ops whose kernels read
// at::globalContext().deterministicAlgorithms(): `genie::deterministic_<name>.<overload>`, the
// aten op's schema under another name. genie-node runs one as the aten op with deterministic
// algorithms on (torch.use_deterministic_algorithms(True, warn_only=True)) and restores the flag
// after; the client (genie._C) defines the schemas only: its recorder records the variant for an
// op called while the program has deterministic algorithms on, so the node's kernel makes the
// choice eager makes (index_copy_ and index_put_ with duplicate indices: the last write wins;
// index_put_ with accumulate=True: a sorted, ordered sum, as CUDA's always is).
//
// Header-only, for the two sides that include torch (the node and the Python extension), so
// that both define the same schemas.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>
#include <string_view>

namespace genie::deterministic {

/// What precedes the aten op's name (without "aten::") in its variant's name.
inline constexpr std::string_view kPrefix = "genie::deterministic_";

/// The aten ops (every overload) that get a variant: those PyTorch lists as acting
/// deterministically under torch.use_deterministic_algorithms(True) (torch/__init__.py), and the
/// factories and resizes that then fill the memory they make.
inline constexpr const char* kOps[] = {
    "aten::index_put_", "aten::index_put", "aten::_index_put_impl_", "aten::_unsafe_index_put",
    "aten::index_copy_", "aten::index_copy", "aten::index_add_", "aten::index_add",
    "aten::scatter_", "aten::scatter", "aten::scatter_add_", "aten::scatter_add",
    "aten::scatter_reduce_", "aten::scatter_reduce", "aten::put_", "aten::put",
    "aten::cumsum", "aten::cumsum_",
    // Uninitialized memory: with deterministic algorithms on (and
    // torch.utils.deterministic.fill_uninitialized_memory, on by default) eager fills it with NaN
    // or the dtype's largest value.
    "aten::empty", "aten::empty_strided", "aten::empty_permuted", "aten::empty_like", "aten::new_empty",
    "aten::new_empty_strided", "aten::resize_",
};

/// "genie::deterministic_index_put_" for "aten::index_put_".
inline std::string variantName(std::string_view aten_name) {
  return std::string(kPrefix) + std::string(aten_name.substr(aten_name.find("::") + 2));
}

/// "aten::index_put_" for "genie::deterministic_index_put_"; empty for any other name.
inline std::string atenName(std::string_view variant_name) {
  if (variant_name.substr(0, kPrefix.size()) != kPrefix) return {};
  return "aten::" + std::string(variant_name.substr(kPrefix.size()));
}

/// Defines the variant of every overload of kOps in `library` (a "genie" fragment): with the
/// kernel `make_kernel()` returns, or, when `make_kernel` is null, the schema only.
inline void defineVariants(torch::Library& library, torch::CppFunction (*make_kernel)()) {
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    bool listed = false;
    for (const char* op : kOps) listed = listed || name.name == op;
    if (!listed) continue;
    const auto handle = dispatcher.findOp(name);
    if (!handle || !handle->hasSchema()) continue;
    c10::FunctionSchema schema = handle->schema().cloneWithName(variantName(name.name), name.overload_name);
    schema.setAliasAnalysis(c10::AliasAnalysisKind::FROM_SCHEMA);
    if (make_kernel != nullptr) {
      library.def(std::move(schema), make_kernel());
    } else {
      library.def(std::move(schema));
    }
  }
}

}  // namespace genie::deterministic
