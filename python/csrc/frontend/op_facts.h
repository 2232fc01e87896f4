// The ops layer: what an operator's schema says, read once per operator.
//
// For each output: a new tensor, a view of an argument, or an argument the op writes (in-place
// and out= ops return the very tensor they wrote); which arguments it writes; what kind of
// value each argument is; whether it returns tensors at all, draws random numbers
// (`nondeterministic_seeded`) or would decompose on the client (CompositeImplicitAutograd with
// no remote_accelerator kernel: reached only under torch.inference_mode()); and how the
// recorder routes it (recorded in C++, or handed to genie.python_ops in Python).
//
// Read under the process lock (the cache is not otherwise synchronized).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace genie::frontend {

/// How an argument of the schema is read by the recorder.
enum class ArgKind : uint8_t {
  kTensor,              // Tensor or Tensor?
  kTensorList,          // Tensor[]
  kOptionalTensorList,  // Tensor?[]
  kScalarType,          // ScalarType or ScalarType? (an int in the IValue)
  kLayout,              // Layout(?)
  kMemoryFormat,        // MemoryFormat(?)
  kGenerator,           // Generator?
  kOther,               // ints, floats, bools, strings, lists of them, Scalar, Device, ...
};

/// One output of the schema.
struct ReturnFacts {
  enum Kind : uint8_t { kNew, kView, kWrite } kind = kNew;
  int arg = -1;  // the argument it aliases (kView) or writes (kWrite), as a schema index
};

/// How the recorder takes an op (see the top of this file).
enum class Route : uint8_t {
  kRecord,     // recorded in C++
  kPython,     // genie.python_ops (data movement, compatibility ops, ops outside aten/prims/genie)
  kToCopy,     // aten::_to_copy: recorded when it stays on the source's device, else Python
  kCopy,       // aten::copy_: recorded between two tensors of one device, else Python
  kIndex,      // index.Tensor / index_put(_) / _index_put_impl_: recorded unless an index is a host tensor
  kSameValue,  // detach / alias / lift_fresh: a new tensor on the same value, nothing recorded
  kComposite,  // decomposed as PyTorch would (CompositeImplicitAutograd), then each op recorded
  kScalar,     // returns no tensors (aten::equal): genie.python_ops runs it now
};

struct OpFacts {
  std::vector<ReturnFacts> returns;  // per schema return (a Tensor[] return is one entry)
  std::vector<int> writes;           // argument indices it writes (declared, and native_batch_norm's)
  std::vector<ArgKind> args;         // per schema argument
  bool list_return = false;          // returns one Tensor[]
  bool seeded = false;               // tagged nondeterministic_seeded: writes the device's generator
  bool warns = false;                // eager warns about some arguments (eager_checks.h warnsAsEager)
  /// index.Tensor, index_put(_), _index_put_impl_, index_fill(_): eager's bounds check of the
  /// indices' values is made at the op when the host knows them (eager_checks.h checkIndexValues).
  bool checks_index_values = false;
  /// Cache roles, for the asynchronous runs' boundaries (Recording::wantsRun: a run is not cut
  /// between a cache append and the attention that reads it): ops that append to a cache (cat,
  /// index_copy(_), slice_scatter) and attention (scaled_dot_product_attention).
  enum class CacheRole : uint8_t { kNone, kWriter, kAttention } cache_role = CacheRole::kNone;
  Route route = Route::kRecord;
  std::string name;                  // "aten::add.Tensor"
  /// The variant recorded while deterministic algorithms are on (genie::deterministic_<op>,
  /// include/genie/torch/deterministic_ops.h), for the ops whose kernels read that flag.
  std::optional<c10::OperatorHandle> deterministic;
};

/// The facts of `op` (cached; under the process lock).
const OpFacts& opFacts(const c10::OperatorHandle& op);

/// Ops genie.python_ops handles in Python ("aten::_local_scalar_dense", ...): routed kPython.
/// Set once at import by genie.python_ops (configure_recorder); ops already cached are updated in
/// place (nodes refer to their facts). Under the process lock.
void setPythonOps(const std::vector<std::string>& names);

}  // namespace genie::frontend
