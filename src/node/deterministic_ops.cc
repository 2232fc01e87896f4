// genie::deterministic_<op> on the node (include/genie/torch/deterministic_ops.h): the aten op,
// run with deterministic algorithms on.
#include "deterministic_ops.h"

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <string>

#include "genie/torch/deterministic_ops.h"

namespace genie::node {
namespace {

/// Runs the aten op of the variant `op` with the arguments on `stack`, with
/// torch.use_deterministic_algorithms(True, warn_only=True) in effect; restores the flag after.
/// warn_only: the flag is the process's, and another session's op may run meanwhile (it then
/// gets the deterministic kernels, never an error).
void runDeterministically(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const std::string aten = deterministic::atenName(op.schema().name());
  const c10::OperatorHandle target = c10::Dispatcher::singleton().findSchemaOrThrow(aten.c_str(),
                                                                                     op.schema().overload_name().c_str());
  at::Context& context = at::globalContext();
  const bool was = context.deterministicAlgorithms();
  const bool was_warn_only = context.deterministicAlgorithmsWarnOnly();
  context.setDeterministicAlgorithms(true, /*warn_only=*/!was || was_warn_only);
  struct Restore {
    at::Context& context;
    bool was, was_warn_only;
    ~Restore() { context.setDeterministicAlgorithms(was, was_warn_only); }
  } restore{context, was, was_warn_only};
  target.callBoxed(*stack);
}

torch::CppFunction kernel() { return torch::CppFunction::makeFromBoxedFunction<&runDeterministically>(); }

}  // namespace

void defineDeterministicOps() {
  static std::once_flag once;
  std::call_once(once, [] {
    static auto* library = new torch::Library(torch::Library::FRAGMENT, "genie", std::nullopt, __FILE__, __LINE__);
    deterministic::defineVariants(*library, &kernel);
  });
}

}  // namespace genie::node
