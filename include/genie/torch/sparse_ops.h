// genie::sparse_parts: a tensor's sparse COO parts as dense tensors, so that a sparse result made
// on the node reaches the client as tensors the wire carries.
//
//   genie::sparse_parts(Tensor self) -> (Tensor indices, Tensor values, Tensor facts)
//
// For a sparse COO `self`: its `_indices()` (int64 [sparse_dim, nnz]) and `_values()` ([nnz,
// dense sizes...], self's dtype), both views of self's parts, and `facts`, an int64 [4 + dim]
// tensor (1, sparse_dim, dense_dim, is_coalesced, sizes...). For any other layout: an empty int64 [0] tensor,
// `self` itself, and facts (0, 0, 0, 0). The client (genie.sparse) records it after each op that
// has a sparse argument and reads `facts` with the results: an op's output layout is known only
// once it ran (aten::add gives a sparse result for two sparse arguments, a dense one for a dense
// and a sparse).
//
// The schema, for the two sides that include torch: the node defines the op with its kernel
// (src/node/executor.cc; CompositeExplicitAutograd: every backend, sparse ones included), the
// Python extension the schema only.
#pragma once

namespace genie::sparse {

inline constexpr const char* kPartsSchema = "sparse_parts(Tensor self) -> (Tensor indices, Tensor values, Tensor facts)";

}  // namespace genie::sparse
