// Quantized tensors on remote_accelerator: the client's half.
//
// A quantized tensor on the device is a QTensorImpl whose dtype is quantized (torch.quint8,
// qint8, qint32, quint4x2, quint2x4): its key set is QuantizedPrivateUse1's and it carries its
// quantizer as PyTorch's QTensorImpl does (frontend/lazy_tensor.h). Per-tensor affine only.
// Every op on it reaches the recorder (dispatch_kernel.cc registers the recorder's kernel as the
// QuantizedPrivateUse1 fallback); its outputs and their quantizers come from the CPU's quantized
// kernels (frontend/eager_checks.h quantizedShapes) and the node runs the op on its own quantized
// tensors. What only reads the quantizer is answered here, without the node: q_scale,
// q_zero_point, qscheme, quantizer, set_quantizer_. Reads of the values go through int_repr
// (genie.transfers).
#include <ATen/core/Tensor.h>
#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <memory>

#include "bindings.h"
#include "frontend/lazy_tensor.h"

namespace genie::python {
namespace {

using frontend::lazyState;

/// The QTensorImpl of a quantized device tensor, or nullptr.
at::QTensorImpl* qImpl(const at::Tensor& self) {
  return lazyState(self) != nullptr ? dynamic_cast<at::QTensorImpl*>(self.unsafeGetTensorImpl()) : nullptr;
}

at::QuantizerPtr quantizerOf(const at::Tensor& self, const char* op) {
  at::QTensorImpl* impl = qImpl(self);
  at::QuantizerPtr q = impl != nullptr ? impl->quantizer() : at::QuantizerPtr();
  TORCH_CHECK(q, op, ": the quantizer of this remote_accelerator tensor is unknown");
  return q;
}

const at::PerTensorAffineQuantizer& affineOf(const at::Tensor& self, const char* op) {
  const at::QuantizerPtr q = quantizerOf(self, op);
  const auto* affine = dynamic_cast<const at::PerTensorAffineQuantizer*>(q.get());
  // The CPU's message for a tensor of another quantization scheme (q_scale_quant).
  TORCH_CHECK(affine != nullptr, "Expected quantizer to be PerTensorAffineQuantizer");
  return *affine;  // the tensor holds it
}

double qScale(const at::Tensor& self) { return affineOf(self, "aten::q_scale").scale(); }

int64_t qZeroPoint(const at::Tensor& self) { return affineOf(self, "aten::q_zero_point").zero_point(); }

at::QScheme qScheme(const at::Tensor& self) { return quantizerOf(self, "aten::qscheme")->qscheme(); }

/// quantizer(self) -> Quantizer (boxed: the Quantizer type has no unboxed schema inference).
void quantizer(const c10::OperatorHandle& /*op*/, torch::jit::Stack* stack) {
  const at::Tensor self = torch::jit::pop(*stack).toTensor();
  torch::jit::push(*stack, c10::IValue(quantizerOf(self, "aten::quantizer")));
}

/// set_quantizer_(self, quantizer) -> self (boxed, as above). PyTorch's own code sets a quantizer
/// equal to the one the tensor has (`_to_copy` restores it after `copy_`). Another one would
/// change how the node's tensor reads: NotImplementedError.
void setQuantizer(const c10::OperatorHandle& /*op*/, torch::jit::Stack* stack) {
  const at::QuantizerPtr quantizer = torch::jit::pop(*stack).toQuantizer();
  const at::Tensor self = torch::jit::pop(*stack).toTensor();
  at::QTensorImpl* impl = qImpl(self);
  TORCH_CHECK(impl != nullptr, "aten::set_quantizer_: expected a quantized remote_accelerator tensor");
  const at::QuantizerPtr held = impl->quantizer();
  if (!(held && quantizer && held->equalTo(quantizer))) {
    TORCH_CHECK_NOT_IMPLEMENTED(!held || !quantizer, "aten::set_quantizer_: giving a remote_accelerator tensor "
                                "another quantizer is not supported; quantize it again (torch.quantize_per_tensor)");
    impl->set_quantizer_(quantizer);
  }
  torch::jit::push(*stack, self);
}

}  // namespace
}  // namespace genie::python

namespace genie::python {

std::unique_ptr<torch::Library> quantizedKernels() {
  auto m = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::QuantizedPrivateUse1,
                                            __FILE__, __LINE__);
  m->impl("q_scale", TORCH_FN(qScale));
  m->impl("q_zero_point", TORCH_FN(qZeroPoint));
  m->impl("qscheme", TORCH_FN(qScheme));
  m->impl("quantizer", torch::CppFunction::makeFromBoxedFunction<&quantizer>());
  m->impl("set_quantizer_", torch::CppFunction::makeFromBoxedFunction<&setQuantizer>());
  return m;
}

}  // namespace genie::python
