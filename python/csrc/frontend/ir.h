// The frontend's graph IR: what capture records, the passes read and the runtime runs.
//
//  - Storage: the values that alias one memory region (a tensor, its views, the results of
//    in-place ops on them). An op that writes a storage must run while a live tensor is on it.
//  - Value: one tensor value, produced by a pending Node (output `index`) or resident on the
//    node under a 128-bit handle. Its IR fields (storage, dtype, index) are fixed when it is
//    made. The rest is the runtime's books (where it lives, how many LazyTensors hold it,
//    whether it is lost, its host copy): changed only by Recording (recording.h) and the
//    runtime layer, under the process lock (lock.h).
//  - Node: one recorded op: the operator, every argument of its schema in order (a device
//    tensor as its Value, in an IValue capsule; a 0-dim host tensor as itself, a constant that
//    travels inline; everything else as the IValue the dispatcher gave), its outputs and the
//    storages it writes. Node::make builds it whole, outputs included; it never changes after.
//
// Structure from tinygrad's UOp (tinygrad/uop/ops.py): a small immutable record per op, the
// runtime's state outside it. Ownership: a Node holds its inputs and outputs; a Value points
// back at its producer without owning it, and the Recording clears that pointer when the node
// leaves the pending graph (run or dropped), before the node can die.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>
#include <c10/util/intrusive_ptr.h>

#include <Python.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "genie/wire/genie_generated.h"

namespace genie::frontend {

class Node;
struct OpFacts;

/// RunGraph output actions: schemas/genie.fbs OutputAction, as the generated header defines it.
enum class OutputAction : uint8_t {
  kReturn = static_cast<uint8_t>(wire::OutputAction::Return),
  kKeep = static_cast<uint8_t>(wire::OutputAction::KeepResident),
  kReturnAndKeep = static_cast<uint8_t>(wire::OutputAction::ReturnAndKeep),
  kKeepAndDescribe = static_cast<uint8_t>(wire::OutputAction::KeepAndDescribe),
};
/// Residency classes: schemas/genie.fbs Residency, as the generated header defines it.
enum Residency : uint8_t {
  kActivation = static_cast<uint8_t>(wire::Residency::EphemeralActivation),
  kWeight = static_cast<uint8_t>(wire::Residency::PersistentWeight),
  kKvCache = static_cast<uint8_t>(wire::Residency::StatefulKvCache),
  kGradient = static_cast<uint8_t>(wire::Residency::Gradient),
};

/// Values that alias one memory region.
struct Storage final : c10::intrusive_ptr_target {
  std::atomic<int64_t> live{0};  // LazyTensors whose current value is on this storage
  uint32_t writes = 0;           // recorded ops that write it (Recording::append; dropLast counts one back)
  uint32_t read_epoch = 0;       // scratch of liveNodes (cut.h): read by a kept node in that pass
  /// A recorded op writes it: no value on it has a host copy again.
  bool written() const { return writes > 0; }
};

/// One tensor value (see the top of this file).
class Value final : public torch::CustomClassHolder {
 public:
  Value(c10::intrusive_ptr<Storage> storage, at::ScalarType dtype, uint32_t index, Node* producer);
  ~Value() override;  // drops `error` (taking the GIL: a lost value is rare)

  // ---- the IR ----
  const c10::intrusive_ptr<Storage> storage;
  /// The element type. Set when the value is made, except for an op whose outputs only the node
  /// can describe (then set once from the node's answer, genie.python_ops).
  at::ScalarType dtype;
  const uint32_t index;  // output index in its producer
  /// The sizes, when known (`sized`): set when the value is made (the recorder's shape
  /// inference) or by genie.uploads for an upload; read by semantic analysis (genie.semantics).
  c10::SmallVector<int64_t, 5> sizes;
  bool sized = false;

  // ---- the runtime's books (under the process lock, but `tensors`: atomic) ----
  Node* producer;  // the pending op that makes it; nullptr once it ran or was dropped, or resident
  std::optional<wire::Handle> handle;  // set while resident on the node
  uint8_t residency = kActivation;
  std::atomic<int64_t> tensors{0};  // LazyTensors whose current value this is
  PyObject* error = nullptr;        // a strong reference when lost (a failed run, a lost node)
  at::Tensor host;                  // its exact contents on the host, if known (host evaluation)

  // Scratch of the passes (cut.h), meaningful only while the epoch is the running pass's: no
  // hash maps on the hot path of a cut.
  uint32_t needed_epoch = 0;  // liveNodes: a kept node (or the read) needs it
  uint32_t lower_epoch = 0;   // lower: numbered in this lowering, as `lower_id`
  uint32_t lower_id = 0;      // an input's index, or kProduced | the index among produced values
  static constexpr uint32_t kProduced = 1u << 31;

  bool pending() const { return producer != nullptr; }
  bool lost() const { return error != nullptr; }
  /// Sets (or, with nullptr, clears) the error; with the GIL held.
  void setError(PyObject* error);
  /// "%12.0" for a pending value, "<resident 3fa2c1d0>", "<freed>".
  std::string str() const;
};

using ValuePtr = c10::intrusive_ptr<Value>;
using StoragePtr = c10::intrusive_ptr<Storage>;

/// What Node::make needs per output: the storage it lives in (a new one, or the one of the
/// argument it aliases or writes) and its dtype.
struct OutputSpec {
  StoragePtr storage;
  at::ScalarType dtype;
};

/// One recorded op (see the top of this file).
class Node final : public c10::intrusive_ptr_target {
 public:
  /// The node, its outputs made with it. `args`: every schema argument (Value capsules for
  /// device tensors, see valueOf). `seq`: its position in program order (process-wide).
  static c10::intrusive_ptr<Node> make(c10::OperatorHandle op, const OpFacts& facts, std::vector<c10::IValue> args,
                                       c10::ArrayRef<OutputSpec> outputs, std::vector<StoragePtr> writes);

  const c10::OperatorHandle op;
  const OpFacts& facts;  // what its schema says (op_facts.h)
  const std::vector<c10::IValue> args;
  const c10::SmallVector<ValuePtr, 2> outputs;
  const std::vector<StoragePtr> writes;
  const int64_t seq;
  /// torch.get_default_dtype() when it was recorded: the node runs it with that default.
  const at::ScalarType default_dtype;

  /// The Values this node reads, in argument order (a value read twice appears twice).
  c10::ArrayRef<Value*> inputs() const { return inputs_; }
  const c10::FunctionSchema& schema() const { return op.schema(); }
  /// "aten::add.Tensor" (no ".default").
  std::string opName() const;
  /// "%3.0 = aten::add.Tensor(%1.0, %2.0, 1)".
  std::string str() const;

 private:
  Node(c10::OperatorHandle op, const OpFacts& facts, std::vector<c10::IValue> args, c10::ArrayRef<OutputSpec> outputs,
       std::vector<StoragePtr> writes, int64_t seq);
  c10::SmallVector<Value*, 4> inputs_;
};

using NodePtr = c10::intrusive_ptr<Node>;

/// An argument IValue holding a Value (a device tensor argument).
c10::IValue capsuleOf(const ValuePtr& value);
/// The Value `arg` holds, or nullptr when it holds none.
Value* valueOf(const c10::IValue& arg);
/// Calls f(Value*) for every Value in `arg` (itself, or the elements of a list).
template <typename F>
void forEachValue(const c10::IValue& arg, F&& f) {
  if (arg.isCapsule()) {
    f(valueOf(arg));
  } else if (arg.isList()) {
    for (const c10::IValue& x : arg.toListRef()) {
      if (x.isCapsule()) f(valueOf(x));
    }
  }
}

/// Which of `args` (every argument of `schema`) a call shows, as Python dispatch passes them:
/// positional arguments up to the last one that differs from its default, keyword-only
/// arguments that differ from their defaults. A tensor argument always differs.
class ShownArgs {
 public:
  ShownArgs(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args);
  bool operator[](size_t i) const;
  size_t positional() const { return positional_; }  // arguments before the first keyword-only one
  size_t shownPositional() const { return shown_positional_; }

 private:
  const c10::FunctionSchema& schema_;
  c10::ArrayRef<c10::IValue> args_;
  size_t positional_ = 0;
  size_t shown_positional_ = 0;
};
/// A new epoch for the scratch fields of the passes (under the process lock).
uint32_t nextEpoch();
/// The `seq` the next recorded node gets (program order, process-wide).
int64_t nextSeq();

/// "aten::add.Tensor" for an operator (no ".default").
std::string opNameOf(const c10::OperatorHandle& op);

}  // namespace genie::frontend
