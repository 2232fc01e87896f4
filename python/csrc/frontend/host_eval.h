// Host evaluation: a read the host can answer exactly, without a round trip to the node.
//
// Programs often read small integer values derived from tensors they uploaded themselves
// (HuggingFace checks `attention_mask.all()` before choosing an attention path; `generate`
// checks `(input_ids < 0).any()`). A value's host copy (Value::host) is its exact contents,
// known on the host: small integer uploads are their own (genie.runtime sets them), and a
// pending value whose subgraph reads only values with host copies is computed on the host's CPU
// when the program reads it, if every op of it is exact: integer or bool tensors only (in and
// out: integer arithmetic and comparisons give the same bits on every device, floating point
// does not), deterministic (no random op, no `empty`, no sort whose tie order may differ),
// writing nothing, every tensor at most kMaxBytes. The node still runs those ops when the
// program uses the values there: host evaluation only answers reads. A storage that a recorded
// op writes never gets host copies again (Storage::written): a write would make copies of its
// views stale. Off with GENIE_HOST_EVAL=0 (genie.config), which sends every read to the node.
#pragma once

#include <ATen/core/Tensor.h>

#include "frontend/ir.h"

namespace genie::frontend {

class Recording;

inline constexpr int64_t kHostEvalMaxBytes = 64 * 1024;  // larger tensors are never kept or computed on the host
inline constexpr int kHostEvalMaxNodes = 64;              // ops one read may evaluate on the host

/// `value`'s exact contents computed on the host, or an undefined tensor (then the node must
/// answer). Values computed on the way keep their host copies. Under the process lock.
at::Tensor hostValue(Value& value);
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
