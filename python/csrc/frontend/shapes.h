// The shapes layer: tensor descriptors, the plan cache and its key, and output descriptors
// inferred on the client, without a round trip.
//
// A call's outputs (sizes, strides, storage offset, dtype, conjugate and negative bits) follow
// from its operator and its arguments' descriptors and non-tensor values. The recorder keys
// each call by exactly those (PlanKey) and keeps what it inferred (Plan), so a step that repeats
// (a model's forward, a decode step) infers nothing. On a miss:
//  - a shape rule answers for the few ops whose shapes change every decode step and whose
//    inference on meta tensors is slow (aten::scaled_dot_product_attention decomposes into
//    about ten ops on meta; aten::cat along the KV cache); each rule answers exactly what the
//    meta kernel would for the cases it checks, and declines the rest
//    (tests/python/test_shape_rules.py compares them);
//  - else the op runs on meta tensors of the arguments' geometry (the remote device in
//    arguments becomes meta), through the dispatcher. A meta kernel may be Python
//    (torch._meta_registrations): callers run this without the process lock (lock.h).
// An op that has no meta kernel or whose output shape depends on the data (aten::nonzero)
// throws NeedsNode: the node runs it and describes its outputs (genie.python_ops).
#pragma once

#include <ATen/core/QuantizerBase.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <vector>

namespace genie::frontend {

struct OpFacts;

/// A tensor's geometry and element type: what a LazyTensor is made from.
struct Desc {
  c10::SmallVector<int64_t, 6> sizes;
  c10::SmallVector<int64_t, 6> strides;
  int64_t offset = 0;  // storage offset, elements
  at::ScalarType dtype = at::kFloat;
  bool defined = true;  // false: the output is None (an undefined tensor)
  bool conj = false;    // the conjugate bit
  bool neg = false;     // the negative bit
  bool contiguous = false;  // default strides for its sizes and offset 0
  c10::Layout layout = c10::kStrided;  // another layout (sparse): sizes and dtype only, refused by the recorder
  at::QuantizerPtr quantizer;  // a quantized tensor's (per-tensor affine, or unknown for empty()); null otherwise

  static Desc of(const at::Tensor& tensor);
  static Desc undefined();
  /// Sets `contiguous` from sizes, strides and offset.
  void finish();
  bool operator==(const Desc& other) const;
};

/// The quantizer of a tensor of a quantized dtype (a QTensorImpl: PyTorch's quantized tensors
/// and LazyTensors), read without dispatch; null for any other tensor.
at::QuantizerPtr quantizerOf(const at::Tensor& t);

/// The output descriptors of one call, flat (a Tensor[] return contributes one per element).
struct Shapes {
  std::vector<Desc> outputs;
};

/// Thrown by metaShapes when only the node can describe the outputs.
struct NeedsNode : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// `arg` (one schema argument) with each tensor in it (Tensor, Tensor[], Tensor?[]) replaced by
/// `f(tensor)` and a remote_accelerator Device by `device`: the stacks of metaShapes (meta
/// tensors) and of the CPU probe (eager_checks.h).
c10::IValue mapTensors(const c10::IValue& arg, const std::function<at::Tensor(const at::Tensor&)>& f,
                       c10::Device device);

/// How many elements of `t`'s dtype its storage holds for the stacks above: what its geometry
/// spans (offset included), or more when its storage is larger (a resize shrank it, it was set_
/// onto a storage), as as_strided's bounds check reads it.
int64_t storageElements(const at::Tensor& t);

/// A shape rule's answer for `op` with the arguments on `args` (the whole schema's arguments, as
/// the recorder got them), or nothing when no rule covers them.
std::optional<Shapes> ruleShapes(const c10::OperatorHandle& op, const OpFacts& facts, const torch::jit::Stack& args);
/// The outputs of `op` on meta tensors shaped like `args`. Throws what the meta kernel throws
/// (PyTorch's error for invalid arguments), NeedsNode as above. The warnings of a call the CPU
/// probe runs next are dropped: the probe gives eager's (eager_checks.h probesAfterMeta).
Shapes metaShapes(const c10::OperatorHandle& op, const OpFacts& facts, const torch::jit::Stack& args);
/// The descriptors of what a call returned (`results`: its stack after the call, any device).
Shapes shapesOfResults(const torch::jit::Stack& results);

/// The plan cache's key: the operator and, per argument, its descriptor or value (see
/// KeyBuilder). Words, hashed once.
struct PlanKey {
  std::vector<int64_t> words;
  size_t hash = 0;
};
/// The hash of a word sequence (plan keys, graph keys): a multiply-xorshift mix per word.
size_t hashWords(c10::ArrayRef<int64_t> words);

/// A key being looked up: the builder's words, not copied.
struct KeyView {
  c10::ArrayRef<int64_t> words;
  size_t hash = 0;
};

/// Builds a plan key argument by argument, in a buffer of the calling thread's. Every part is
/// tagged with its kind, so that equal numbers of different types (1, 1.0, True), which promote
/// differently, differ.
class KeyBuilder {
 public:
  enum Tag : int64_t {
    kNone = 1, kInt, kDouble, kBool, kComplex, kString, kIntList, kDoubleList, kBoolList, kDevice, kLazy, kQuantizer,
    kConstant, kWrapped, kHost, kTensorList, kOptionalTensorList, kOther, kScalarList
  };
  explicit KeyBuilder(const c10::OperatorHandle& op);
  void add(int64_t word) { words_.push_back(word); }
  void add(Tag tag, int64_t word) {
    words_.push_back(tag);
    words_.push_back(word);
  }
  /// A device tensor's descriptor.
  void addLazy(const at::Tensor& tensor);
  /// A host tensor whose values matter (genie.compat's host tensors): descriptor and values.
  void addHost(const at::Tensor& tensor);
  /// A non-tensor argument. False when it is of a kind the recorder does not key (then Python decides).
  bool addValue(const c10::IValue& value);
  /// The key (valid until this thread builds the next one).
  KeyView finish();

 private:
  std::vector<int64_t>& words_;
};

/// What the recorder keeps per key.
struct Plan {
  Shapes shapes;
};

/// Plans by key; cleared when it passes kMaxPlans. Under the process lock.
class PlanCache {
 public:
  static constexpr size_t kMaxPlans = 200'000;
  const Plan* find(const KeyView& key) const;
  const Plan* insert(const KeyView& key, Plan plan);
  size_t size() const;
  void clear();
};

PlanCache& planCache();

}  // namespace genie::frontend
