// The node's deterministic variants of aten ops (include/genie/torch/deterministic_ops.h).
#pragma once

namespace genie::node {

/// Defines genie::deterministic_<op> for the ops listed there, each running the aten op with
/// deterministic algorithms on. Idempotent; genie-node calls it before serving.
void defineDeterministicOps();

}  // namespace genie::node
