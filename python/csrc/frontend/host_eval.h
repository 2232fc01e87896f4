// Host evaluation: a read the host can answer exactly, without a round trip to the node.
//
// Programs often read small integer values derived from tensors they uploaded themselves
// (HuggingFace checks `attention_mask.all()` before choosing an attention path; `generate`
// checks `(input_ids < 0).any()`; PyTorch's tensor printing reads every element of what it
// prints). A value's host copy (Value::host) is its exact contents, known on the host: small
// integer uploads are their own (genie.runtime sets them; an upload's snapshot in the graph is one
// only when it is an integer one), so is a small value the runtime read whole from the node
// (hostLeaves), and a pending value whose subgraph reads only values with host copies is
// computed on the host's CPU when the program reads it, if every op of it is exact:
//  - on integer and bool tensors, any op (integer arithmetic and comparisons give the same bits
//    on every device);
//  - on floating-point and complex tensors, only ops that compute nothing that rounds: they
//    move, select or compare values, or take their sign or integer part (kFloatExact; not
//    arithmetic, reductions such as sum, nor min/max, whose choice between 0.0 and -0.0 may
//    differ between devices);
// and deterministic (no random op, no `empty`, no sort whose tie order may differ), writing
// nothing, every tensor at most kHostEvalMaxBytes. The node still runs those ops when the program
// uses the values there: host evaluation only answers reads. A storage that a recorded op writes
// never gets host copies again (Storage::written): a write would make copies of its views stale.
// Off with GENIE_HOST_EVAL=0 (genie.config), which sends every read to the node.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "frontend/ir.h"

namespace genie::frontend {

class Recording;

inline constexpr int64_t kHostEvalMaxBytes = 64 * 1024;  // larger tensors are never kept or computed on the host
inline constexpr int kHostEvalMaxNodes = 64;              // ops one read may evaluate on the host

/// `value`'s exact contents computed on the host, or an undefined tensor (then the node must
/// answer). Values computed on the way keep their host copies. Under the process lock.
at::Tensor hostValue(Value& value);
/// The resident values without host copies that hostValue(value) lacks when it could compute
/// `value` with them: each small (at most kHostEvalMaxBytes), on a storage no recorded op
/// writes. Empty when hostValue needs none, or when the host could not compute `value` anyway.
/// The runtime reads them whole (one request) and keeps them as their host copies. Under the
/// process lock.
std::vector<ValuePtr> hostLeaves(Value& value);
/// The outputs of pending `node` (an op whose outputs only its values decide: masked_select)
/// computed on the host, or nullopt; hostLeavesOf(node) as hostLeaves. Under the process lock.
std::optional<std::vector<at::Tensor>> hostOutputs(Node& node);
std::vector<ValuePtr> hostLeavesOf(Node& node);
/// `value`'s exact contents as of now for eager's value checks at the op (an index out of range,
/// eager_checks.h checkIndexValues), or an undefined tensor when the host cannot tell: hostValue,
/// and for a value on a storage that recorded ops wrote (Storage::written), a replay on the host
/// of the op that made the storage and of every write to it, in program order, when all of
/// those writes are still pending in `recording` (at most 16) and exact as above, and read
/// nothing another write changed. The replay keeps nothing: it answers checks, never reads (a
/// read of a written storage still goes to the node). Under the process lock.
at::Tensor checkedHostValue(Value& value, const Recording& recording);
/// Whether a host tensor of `dtype` and `nbytes` may be a value's host copy.
bool keepsHostCopy(at::ScalarType dtype, int64_t nbytes);
void setHostEvalEnabled(bool enabled);
bool hostEvalEnabled();

}  // namespace genie::frontend
