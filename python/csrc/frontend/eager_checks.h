// The shapes layer's checks: errors eager PyTorch raises for a call that its meta kernel does
// not raise, or raises as another exception class.
//
// A call's outputs are inferred on the client by the op's meta kernel (shapes.h), which checks
// what the output's geometry needs and not always more: `index_put_` on meta accepts indices
// that cannot broadcast, `index_fill_` a complex value for a float tensor, and some Python meta
// kernels raise RuntimeError where eager raises IndexError (`x[float_index]`). Each check here
// is one op's part of eager's argument checking (aten/src/ATen/native), decidable from what the
// plan cache is keyed by (descriptors, dtypes, non-tensor values): it raises eager's exception
// class with eager's message, followed by "(genie: <op> on remote_accelerator, checked on the
// client)", before anything is recorded. Checks run on a plan-cache miss only: a hit has the key
// of a call that passed them.
//
// Errors that depend on tensor values (an index out of range) stay the node's: they are raised at
// the next read, as eager's class (genie.errors.remote_error).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <exception>
#include <optional>

#include "frontend/shapes.h"

namespace genie::frontend {

struct OpFacts;

/// Raises eager's error for `op` with the arguments on `args` (the whole schema's arguments, as
/// the recorder got them), if eager raises one that the meta kernel does not: checks by operator
/// (eager_checks.cc `checks`), and raiseAsEager for index_add, index_copy, index_reduce, cummax
/// and cummin. Returns otherwise.
void checkAsEager(const c10::OperatorHandle& op, const OpFacts& facts, const torch::jit::Stack& args);

/// Raises eager's own error for the call, when the meta kernel raised another one (or another
/// class: a Python meta kernel's ValueError where the CPU raises RuntimeError) or none: the
/// call runs on CPU tensors of the arguments' geometry (at most 64 MiB together), once filled
/// with zeros and once with ones, and the CPU's error is raised (its class and message, then
/// "(genie: <op> on remote_accelerator, checked on the client by its CPU kernel)") when both runs
/// raise it alike: such an error depends on shapes and dtypes only. Returns otherwise, and
/// without running anything for ops given a generator or touching quantized or sparse tensors
/// (a random op draws from the CPU's default generator, whose state is restored after). Errors of kernels the CPU lacks (NotImplementedError, "not implemented for
/// '<dtype>'") are not eager's on the node's device and are ignored.
void raiseAsEager(const c10::OperatorHandle& op, const OpFacts& facts, const torch::jit::Stack& args);

/// The outputs of the call when the meta kernel raised `error`, a nondeterminism alert that the
/// node's kernels do not raise: Python meta kernels alert for every device but the CPU (median
/// with indices, histc) as CUDA's kernels do, and a node that runs the CPU's kernels
/// (Recording::cpu_kernels) is the CPU. The meta kernel runs again with deterministic
/// algorithms off (process-wide, for that call). Nothing for any other error or node; what the
/// meta kernel raises then propagates.
std::optional<Shapes> shapesOnCpuKernels(const c10::OperatorHandle& op, const OpFacts& facts,
                                        const torch::jit::Stack& args, const std::exception& error);

/// For index.Tensor, index_put, index_put_, _index_put_impl_ and index_fill(_) (`x[idx]`,
/// `x[idx] = v`; OpFacts::checks_index_values) with integer index tensors whose values the host knows (host_eval.h checkedHostValue: uploaded,
/// or computed from uploads and factories by exact ops, writes included): eager's IndexError
/// for an index out of range ("index 10 is out of bounds for dimension 0 with size 5"), raised
/// at the op with "(genie: <op> on remote_accelerator, checked on the client with the indices'
/// values known on the host)". The CPU's kernel decides, on a zero-filled stand-in of the
/// indexed tensor's sizes. Runs on every call (the values change, the plan-cache key does not);
/// returns otherwise, an index whose values only the node knows included (the node raises
/// then, at the next read). Under the process lock.
void checkIndexValues(const OpFacts& facts, const c10::IValue* first, size_t n);

/// Whether eager's kernel of the operator `name` ("aten::std", without the overload) warns about
/// its arguments where the meta kernel does not: std, var, std_mean and var_mean with no degrees
/// of freedom left; put and put_ without accumulate under torch.use_deterministic_algorithms (its
/// nondeterminism alert: an error, or a warning with warn_only); searchsorted and bucketize of a
/// non-contiguous tensor (eager's copy, said once per program). OpFacts::warns.
bool warnsAsEager(const std::string& name);
/// Eager's warning for the call, if it warns (TORCH_WARN: a Python UserWarning at the call).
/// Runs on every call of an op whose facts say `warns`, plan-cache hits included: eager warns
/// each time.
void warnAsEager(const OpFacts& facts, const c10::IValue* first, size_t n);

/// For an out= call (a keyword-only argument it writes), or a call with a complex tensor, one of
/// more than 64 dimensions or an empty one (`torch.max(x, dim)` over an empty dimension raises
/// IndexError in eager's kernel, not in the meta kernel): raiseAsEager. Those are rare in what the device runs, and Python
/// meta kernels accept many such calls that eager's kernels refuse (`torch.maximum` of complex
/// tensors raises TypeError, `torch.heaviside` NotImplementedError; a reduction over a tensor of
/// 65 dimensions "only tensors with up to 64 dims are supported"). Python meta kernels
/// check out= arguments by the reference's rule (any safe cast), where eager's kernels may
/// require the input's dtype (`torch.neg(float32, out=float64)` raises "Found dtype Double but
/// expected Float") or refuse the op for the dtype (`torch.floor(complex64, out=...)`).
/// Also for a call that writes a tensor overlapping itself (an expanded tensor) or sharing its
/// storage with another argument: eager's memory-overlap checks ("unsupported operation: more
/// than one element of the written-to tensor refers to a single memory location") are op by op,
/// and the probe's tensors on one storage share one CPU buffer. And for an in-place call with an
/// argument of another dtype (a tensor, or a float or complex number for a tensor of a lower
/// category): the meta kernels skip the check that the result type casts to the written tensor.
/// For an out= call that passes, the outputs as the CPU kernel left them: an out= tensor resized
/// from another shape takes the strides eager's TensorIterator gives it (following its inputs'
/// layout, where the Python meta kernels make it contiguous), so the client's geometry is the
/// node's. Nothing otherwise.
std::optional<Shapes> checkUnusualOnCpu(const c10::OperatorHandle& op, const OpFacts& facts,
                                        const torch::jit::Stack& args);

/// Whether the call writes a keyword-only (out=) argument.
bool writesOut(const c10::OperatorHandle& op, const OpFacts& facts);
/// Whether checkUnusualOnCpu runs the CPU probe for this call: then the probe's warnings are the
/// call's, as eager's kernel words them (`index_fill_` of an expanded tensor; an out= tensor
/// resized), and metaShapes drops the meta kernel's.
bool probesAfterMeta(const c10::OperatorHandle& op, const OpFacts& facts, const torch::jit::Stack& args);

/// Whether the call involves quantized tensors: a quantized tensor among its arguments, a
/// quantized dtype argument (`quantize_per_tensor`, a factory such as `_empty_affine_quantized`),
/// or an op that makes one of integers (`_make_per_tensor_quantized_tensor`).
bool isQuantizedCall(const OpFacts& facts, const torch::jit::Stack& args);

/// The outputs of a quantized call (isQuantizedCall), quantizers included, from the CPU's
/// kernels: meta tensors cannot be quantized, so the call runs on CPU tensors of the arguments'
/// geometry and quantizers (ProbeTensors), once with their integer representations filled with
/// zeros and once with ones. Raises the CPU's error (its class and message, then "(genie: <op>
/// on remote_accelerator, checked on the client by its CPU kernel)") when both runs raise, the
/// CPU's "Could not run 'aten::<op>' with arguments from the 'QuantizedCPU' backend" for an op
/// with no quantized kernel included. NotImplementedError naming the op when an output's
/// quantizer differs between the runs (it depends on the values: `quantize_per_tensor_dynamic`),
/// is not per-tensor affine (per-channel quantization is not supported on remote_accelerator),
/// for a view of a quantized tensor as another dtype (`q.view(torch.uint8)`: PyTorch keeps the
/// quantized key set on it, and its quantized kernels would misread it), or when the arguments
/// need more than 64 MiB on the CPU.
Shapes quantizedShapes(const c10::OperatorHandle& op, const OpFacts& facts, const torch::jit::Stack& args);

}  // namespace genie::frontend
