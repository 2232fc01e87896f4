// Executor: runs a wire::Graph on libtorch through the ATen dispatcher.
//
// Universal dispatch (DESIGN.md): every node names an operator by schema name and overload
// ("aten::addmm" + "default", "aten::add" + "Tensor") and runs through
// c10::Dispatcher with a boxed call. There are no per-op handlers; the only rewrites are the
// documented ones:
//   - device arguments are replaced by the executor's device;
//   - a scalar return (aten::_local_scalar_dense, ...) becomes a 0-dim CPU tensor value.
//
// compile() resolves each operator once and maps every wire argument onto its schema
// argument (positional, then by keyword name), checking types; run() then only builds the
// IValue stacks. Errors name the op, its index in the graph and the reason (torch's message
// for a TorchError).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "genie/status.h"
#include "genie/wire/codec.h"

namespace genie::node {



/// A value bound to a scalar slot (RunGraph.scalars).
using ScalarSlotValue = std::variant<int64_t, double, bool>;

/// One argument of one node, resolved against the operator's schema.
struct BoundArgument;

/// A graph whose operators and arguments are resolved. Immutable; shareable across runs.
class CompiledGraph {
 public:
  struct Node {
    c10::OperatorHandle op;
    std::string name;                     // "aten::add.Tensor"
    std::vector<BoundArgument> arguments;  // one per schema argument, in schema order
    uint32_t num_outputs = 1;
    uint32_t first_output_value = 0;      // value id of its first output
    /// The default dtype it runs with (wire Node.default_dtype); nullopt: float32.
    std::optional<c10::ScalarType> default_dtype;
  };

  uint32_t numInputs() const { return num_inputs_; }
  /// GraphInput.handle of each input, {0,0} where the input is not bound (size numInputs()).
  /// A bound input defaults, per run, to the running session's resident tensor of that handle.
  const std::vector<wire::Handle>& inputHandles() const { return input_handles_; }
  uint32_t numScalarInputs() const { return num_scalar_inputs_; }
  uint64_t numValues() const { return num_values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  /// The values (ids) that no later op reads once node `index` has run: its arguments read for
  /// the last time and its outputs no op reads.
  const std::vector<uint32_t>& deadAfter(size_t index) const { return dead_after_[index]; }
  /// Whether a node runs with a default dtype other than float32.
  bool setsDefaultDtype() const { return sets_default_dtype_; }

 private:
  friend class Executor;
  std::vector<std::vector<uint32_t>> dead_after_;
  uint32_t num_inputs_ = 0;
  std::vector<wire::Handle> input_handles_;
  uint32_t num_scalar_inputs_ = 0;
  uint64_t num_values_ = 0;
  std::vector<Node> nodes_;
  bool sets_default_dtype_ = false;
};

class Executor {
 public:
  /// `device`: where new tensors are made (device arguments are rewritten to it).
  explicit Executor(c10::Device device);

  c10::Device device() const { return device_; }

  /// Resolves a verified graph (wire::verifyGraph / checkGraph passed). Errors (a Status with
  /// its RemoteDetail: wire code, op index and name): UnknownOp (no such operator or
  /// overload), SchemaMismatch (missing, extra or wrongly typed arguments; output count).
  Result<std::shared_ptr<const CompiledGraph>> compile(const wire::Graph& graph) const;

  /// Runs a compiled graph. `inputs` are the graph's tensor inputs in order; `scalars` fill the
  /// scalar slots. Returns every value of the graph (inputs first, then each node's outputs);
  /// callers keep what they need. With `needed` (value ids the caller reads afterwards), every
  /// other value is dropped after its last use (CompiledGraph::deadAfter), so a run's transient
  /// memory is that of the values live at once, not of all of them; those come back undefined.
  /// `out_of_memory`, when given, is looked at after each op: once
  /// it holds a message (a memory limit was crossed) the run stops with OutOfMemory naming that
  /// op. Errors (a Status with its RemoteDetail): SchemaMismatch (wrong number of inputs or
  /// scalars), TorchError (the op raised: shape mismatch, dtype, ...; the detail keeps torch's
  /// message and the exception's class, "c10::IndexError"), OutOfMemory (the allocator's, or
  /// the limit's), each naming the op.
  Result<std::vector<at::Tensor>> run(const CompiledGraph& graph, std::span<const at::Tensor> inputs,
                                      std::span<const ScalarSlotValue> scalars,
                                      const std::optional<std::string>* out_of_memory = nullptr,
                                      std::optional<std::span<const uint64_t>> needed = std::nullopt) const;

  /// c10::ScalarType of a wire dtype, or nullopt for Undefined / unknown values.
  static std::optional<c10::ScalarType> scalarType(wire::DType dtype);
  /// The wire dtype of a c10::ScalarType, Undefined if it has none.
  static wire::DType wireDType(c10::ScalarType type);

 private:
  c10::Device device_;
};

}  // namespace genie::node
