// torch.autocast("remote_accelerator", dtype=...): the AutocastPrivateUse1 kernels. PyTorch
// registers cast policies for its own devices only; a PrivateUse1 backend registers them with
// the op lists and macros PyTorch exports for that purpose (ATen/autocast_mode.h), here the
// same lists as CUDA's: matmuls and convolutions run in the autocast dtype, precision-sensitive
// ops (softmax, norms, exp/log, ...) in float32, mixed-input ops in the widest input type.
// The casts themselves are ordinary ops (aten::_to_copy) that genie records like any other.
// Ops in no list fall through to the next dispatch key.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/library.h>

#ifndef ADD_NS
#define ADD_NS(RAW_OP) at::RAW_OP
#endif

namespace {

// The op lists name ATen's types unqualified (they are written for namespace at).
using at::IntArrayRef;
#if __has_include(<ATen/core/Dimname.h>)  // torch releases with named tensors (2.11) list ops taking them
using at::DimnameList;
#endif
using at::Scalar;
using at::ScalarType;
using at::Tensor;

#define GENIE_AUTOCAST_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define GENIE_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define GENIE_AUTOCAST_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define GENIE_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(GENIE_AUTOCAST_LOWER_PRECISION_FP)
  AT_FORALL_FP32(GENIE_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(GENIE_AUTOCAST_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(GENIE_AUTOCAST_PROMOTE)
}

}  // namespace
