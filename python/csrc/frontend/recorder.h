// The capture layer's recorder: one boxed aten call on LazyTensors becomes one Node, in C++,
// without the GIL.
//
// For an ordinary op:
//  1. devices: the tensors are on one remote_accelerator device; 0-dim host tensors join them
//     as constants and Python numbers the arg parser wrapped as numbers (PyTorch's rule);
//     anything else raises PyTorch's "Expected all tensors to be on the same device" error;
//  2. the plan: output descriptors from the plan cache, keyed by the operator and the
//     arguments' descriptors and values (shapes.h); on a miss they are inferred (a shape rule,
//     else the meta kernel) with the process lock released, since a meta kernel may be Python;
//  3. the node: appended to the device's pending graph (Recording::append); a view output
//     shares its argument's storage; an in-place or out= op returns the very tensor it wrote,
//     rebound to the node's output (and resized when an out= op resized it); a seeded op writes
//     the device's generator.
// Data movement between host and device is the device runtime's (python/csrc/device_runtime.h:
// uploads, reads), which the kernel calls before this; Python (genie.python_ops) takes what
// neither does: the rest of the data movement (quantized tensors, progress bars, node to node),
// reads, ops whose outputs only the node can describe (no meta kernel, data-dependent shapes),
// ops returning Python scalars, compatibility ops, and ops outside aten/prims/genie (Python
// custom ops). Ops PyTorch would decompose (CompositeImplicitAutograd, reached only under
// torch.inference_mode()) are decomposed as PyTorch would, each resulting op recorded.
//
// Thread safety: record() takes the process lock (lock.h) and never the GIL while it holds it.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>

#include <vector>

#include "frontend/recording.h"
#include "frontend/shapes.h"

namespace genie::frontend {

/// What record() did with a call.
enum class Outcome : uint8_t {
  kRecorded,   // the results replace the arguments on the stack
  kPython,     // genie.python_ops must take it; the stack is untouched
  kComposite,  // decompose it (CompositeImplicitAutograd); the stack is untouched
};

/// Host tensors up to this many bytes move to the device inline with the next run (bytes).
inline constexpr int64_t kInlineUploadBytes = 64 * 1024;

struct CallOptions {
  /// Argument indices where a host tensor is taken by design (a packed sequence's batch_sizes):
  /// it travels inline, and its values are part of the plan's key.
  std::vector<int> host_args;
  /// Called from genie.python_ops, which decided already: record the op as it is (no routing).
  bool from_python = false;
};

struct Recorded {
  Outcome outcome = Outcome::kPython;
  /// The tensors made for the outputs (for their Python objects), and the recording, whose
  /// runtime may have to run the pending graph now (Recording::wantsRun).
  c10::SmallVector<at::Tensor, 2> fresh;
  Recording* recording = nullptr;
  bool wants_run = false;  // Recording::wantsRun() after this call, read under the lock
};

/// Records `op` with its arguments, the last `op.schema().arguments().size()` IValues of
/// `stack`. Throws PyTorch's errors for invalid calls (devices, shapes: the meta kernel's own).
Recorded record(const c10::OperatorHandle& op, torch::jit::Stack& stack, const CallOptions& options);

/// Records `op` with `args` (every schema argument; device tensors as LazyTensors, alone or in
/// lists) whose outputs the caller knows: `outputs`, one descriptor per output (a Tensor[] return
/// flat). No routing, plan key or shape inference: for a compiled part's genie::call_graph, whose
/// capture described its outputs. The results go to `results`, as the schema returns them.
/// Outcome kPython, nothing recorded, when a tensor argument is not a LazyTensor, holds no value
/// or a lost one, or the tensors are on several devices: the dispatcher's path then raises the
/// error. Takes the process lock; the caller may hold the GIL (tensors made here have no Python
/// object yet: Recorded::fresh).
Recorded recordKnown(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args, const std::vector<Desc>& outputs,
                     std::vector<c10::IValue>& results);

/// Ops recorded in C++ and handed to Python since the process started (genie.client_stats), and
/// how the plan-cache misses were answered: by a shape rule or by the meta kernel.
struct RecorderCounters {
  int64_t cpp = 0;
  int64_t python = 0;
  int64_t rule = 0;
  int64_t meta = 0;
};
RecorderCounters recorderCounters();
void countPython();

}  // namespace genie::frontend
