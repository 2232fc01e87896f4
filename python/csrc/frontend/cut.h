// The passes: from the pending graph to one RunGraph request, in one listed pipeline.
//
// At a read (or when the pending graph grows past its limit) the runtime takes a Cut:
//   1. liveness (liveNodes): the pending nodes the read needs: a node is kept when a live
//      tensor holds one of its outputs, one of its outputs is read or needed by a kept node, or
//      it writes a storage that a live tensor aliases or that a later kept node reads (a write
//      through a view that died before the read: `seq[:, :n] = ids; seq.clone()`, as
//      HuggingFace's beam search does). Dead work is dropped.
//   2. (after lowering) semantic residency: the classes genie.semantics gave the values of the
//      first cut of a structure (KV caches by the KV-cache pattern, gradients by the backward
//      region: wire value id -> class, kept per structure: Python analyses a structure's first
//      cut, GraphCache::rememberResidency) go into this cut's output specs (no Python per step).
//   3. lowering (lower): wire value numbering (graph inputs 0..n-1, then each node's outputs in
//      order), the inputs (weights bound into the graph by handle, other resident values bound
//      per run, 0-dim host tensors inline), and the structural key: the graph with its liftable
//      numbers (int and float arguments, the elements of int, float and Scalar lists) replaced
//      by markers, weight handles included.
//   4. scalar lifting (GraphCache::prepare): per key, the numbers of the first graph seen and
//      the positions that changed since; those travel as scalar inputs, so a decode loop whose
//      positions grow every step registers its graph once or twice and then sends only the
//      changed numbers and its input handles (DESIGN.md: a graph seen before is run by id).
//   5. the request: output specs (read values come back; every value a live tensor holds stays
//      resident under a fresh 128-bit handle), bindings, scalars, and the frees of released
//      handles that this run does not read.
// commit() then makes the kept values resident; fail() keeps what a failed run left usable.
// Everything here runs under the process lock.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "frontend/ir.h"
#include "frontend/recording.h"

namespace genie::frontend {

/// A number of the graph that may travel as a scalar input.
struct Number {
  bool is_float = false;
  int64_t i = 0;
  double d = 0.0;
  bool operator==(const Number& o) const;
};

/// A graph input of a lowered cut.
struct LoweredInput {
  enum Kind : uint8_t { kWeight, kHandle, kInline } kind = kHandle;
  ValuePtr value;     // kWeight, kHandle: the resident value
  at::Tensor tensor;  // kInline: the host tensor (0-dim)
};

/// A lowered cut (step 3).
struct Lowered {
  std::vector<LoweredInput> inputs;
  std::vector<Number> numbers;                      // liftable numbers, in walk order
  std::unordered_map<const c10::TensorImpl*, uint32_t> inline_ids;  // wire value id of each inline host tensor
  std::vector<int64_t> key;                         // the structure (see the top of this file)
  size_t key_hash = 0;
  uint32_t num_inputs = 0;
  uint32_t epoch = 0;  // values carry their numbering under this epoch (Value::lower_epoch)
  /// The wire value id of `v` (an input or an output of the lowered nodes). Valid until the
  /// next lowering; c10::Error after it (a stale cut).
  uint32_t idOf(const Value* v) const;
};

/// Thrown by lower when an input value is lost: the runtime raises the value's error.
struct LostInput : std::runtime_error {
  explicit LostInput(ValuePtr v) : std::runtime_error("lost input"), value(std::move(v)) {}
  ValuePtr value;
};

/// Step 1. `wanted`: values to be read.
std::vector<NodePtr> liveNodes(const std::vector<NodePtr>& pending, const std::vector<Value*>& wanted);
/// Step 3. `extra_inputs`: resident values to read that no node reads. Throws LostInput, or
/// c10::Error for a value that is neither pending nor resident or an argument with no wire form.
Lowered lower(const std::vector<NodePtr>& nodes, const std::vector<ValuePtr>& extra_inputs);
/// The wire Graph of a lowered cut, with the numbers at `lifted` positions as scalar inputs
/// (slot i for the i-th lifted position). Verified (wire::verifyGraph) before it is returned.
/// `name`: Graph.name (empty: none).
std::string encodeGraph(const std::vector<NodePtr>& nodes, const Lowered& lowered, const std::vector<uint32_t>& lifted,
                        const std::string& name = "");

/// A part of a compiled graph (genie.compile), captured once from the ops that computed it.
struct CapturedPart {
  std::string graph;                     // the wire Graph: no scalar inputs, no bound handles
  std::vector<uint32_t> input_ids;       // graph input id of each given input (repeats share one)
  std::vector<at::Tensor> inline_inputs;  // 0-dim host tensors the ops read: the inputs after the given ones
  std::vector<uint32_t> output_ids;      // wire value id of each given output
  std::vector<uint32_t> written;         // positions in the given inputs whose storage the part writes (one per storage)
  size_t num_nodes = 0;
};
/// The pending nodes that compute `outputs` from `inputs` (pending or resident values), lowered
/// with the inputs as graph inputs 0..n-1 (weights too: a part is bound per call) and every
/// number as a literal, with the write-backs: the nodes recorded from `since_seq` on (Node::seq)
/// that write an input's storage (a functionalized graph's copy_ of an updated KV cache or
/// BatchNorm statistic into the input), and the nodes they read from; `written` lists those
/// inputs. A reason instead when the part cannot stand alone: an output aliases an input, an op
/// writes an input before `since_seq` or writes an input and another tensor, or a value it
/// reads is neither an input nor made by its ops. The nodes stay pending (they run as
/// recorded). `name`: the Graph's name (genie.compile: the compile mode, which the node's
/// compile worker reads).
std::variant<CapturedPart, std::string> capturePart(const std::vector<NodePtr>& pending,
                                                    const std::vector<ValuePtr>& inputs,
                                                    const std::vector<ValuePtr>& outputs, const std::string& name,
                                                    int64_t since_seq);

/// Step 4: registered graphs by structure, per connection.
class GraphCache {
 public:
  struct Prepared {
    std::vector<uint32_t> lifted;                 // positions that travel as scalars, ascending
    std::vector<std::pair<uint32_t, Number>> scalars;  // (slot, value) to bind
    std::optional<wire::GraphId> graph_id;        // nullopt: register encodeGraph(..., lifted) first
    /// The structure's semantic residency ((wire value id, class), ids ascending); nullopt: not
    /// analysed yet.
    std::optional<std::vector<std::pair<uint32_t, uint8_t>>> residency;
  };
  Prepared prepare(const Lowered& lowered);
  void remember(const Lowered& lowered, const std::vector<uint32_t>& lifted, const wire::GraphId& graph_id);
  /// Step 2: the semantic residency of `lowered`'s structure ((wire value id, class), ids
  /// ascending), for its later cuts.
  void rememberResidency(const Lowered& lowered, std::vector<std::pair<uint32_t, uint8_t>> classes);
  void clear();
  size_t size() const;

 private:
  struct Family {
    std::vector<Number> base;
    std::vector<bool> lifted;
    std::map<std::vector<uint32_t>, wire::GraphId> ids;
    std::optional<std::vector<std::pair<uint32_t, uint8_t>>> residency;
  };
  struct KeyHash {
    size_t operator()(const std::vector<int64_t>& k) const;
  };
  Family& familyOf(const Lowered& lowered);
  std::unordered_map<std::vector<int64_t>, Family, KeyHash> families_;
  const std::vector<int64_t>* last_key_ = nullptr;
  Family* last_ = nullptr;
};

/// One output spec of a RunGraph.
struct OutputRow {
  uint32_t value_id = 0;
  OutputAction action = OutputAction::kReturn;
  std::optional<wire::Handle> handle;
  uint8_t residency = kActivation;
};

/// A prepared request (step 5) and what the runtime needs to finish it. Dropped without
/// commit, restore or fail (an exception between them), its nodes are dropped as dead ones are:
/// no value points at them any more.
struct Cut {
  Cut() = default;
  Cut(Cut&&) = default;
  Cut& operator=(Cut&&) = default;
  ~Cut();

  std::vector<NodePtr> taken;  // the whole pending graph it was taken from, in program order
  std::vector<NodePtr> nodes;  // the live ones: what runs
  Lowered lowered;
  GraphCache::Prepared prepared;
  std::vector<OutputRow> specs;
  std::vector<ValuePtr> spec_values;  // the value of each spec
  std::vector<ValuePtr> kept;         // the values that get a handle (spec order)
  std::vector<wire::Handle> frees;
  std::string colocation_group;  // the recording's at the cut: its KV-cache outputs' group ("": none)
  uint64_t colocation_bytes = 0;
};

/// Step 2 on a cut: each output spec of a value in `classes` ((wire value id, class), ids
/// ascending) gets that residency class.
void markResidency(Cut& cut, const std::vector<std::pair<uint32_t, uint8_t>>& classes);

/// Steps 1-5 on `recording`'s pending graph (taken out of it). `returned`: values read back;
/// `described`: values kept resident whose descriptors come back. Call drainDead first.
/// Throws as lower; then the pending graph is back as it was.
Cut takeCut(Recording& recording, const std::vector<ValuePtr>& returned, const std::vector<ValuePtr>& described);
/// The run was sent (answered, or asynchronous): the taken nodes leave the pending graph for
/// good and the kept values become resident.
void commit(Recording& recording, Cut& cut);
/// The request was not sent (interrupted before it left): the pending graph is as it was.
void restore(Recording& recording, Cut& cut);
/// The run failed at node `op_index` of cut.nodes (-1: unknown). What it lost (the failing op,
/// the ops before it that wrote memory, everything depending on them; all of it without an
/// index) is marked with `error` (GIL held); the other cut nodes go back to the pending graph.
void fail(Recording& recording, Cut& cut, int64_t op_index, PyObject* error);

/// A fresh unguessable 128-bit handle (the OS's CSPRNG).
wire::Handle newHandle();

}  // namespace genie::frontend
