// Eager's errors and warnings, checked on the client (frontend/eager_checks.h).
//
// Over 600 lines: every way the client raises or warns as eager does: the per-op checks (the
// `checks` table, whose warn functions warnAsEager reuses), the CPU probe (ProbeTensors) behind
// raiseAsEager, checkUnusualOnCpu and quantizedShapes, and the index-value checks.
#include "frontend/eager_checks.h"

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>
#include <c10/util/safe_numerics.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/quantized/Quantizer.h>
#include <ATen/ops/index.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/result_type.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <limits>
#include <typeinfo>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "frontend/host_eval.h"
#include "frontend/lazy_tensor.h"
#include "frontend/op_facts.h"
#include "frontend/recording.h"
#include "frontend/shapes.h"

namespace genie::frontend {
namespace {

using Sizes = std::vector<int64_t>;

/// What follows eager's message: where Genie raised it.
std::string where(const OpFacts& facts) {
  return " (genie: " + facts.name + " on remote_accelerator, checked on the client)";
}

std::string str(c10::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

/// c10::maybe_wrap_dim(dim, rank, wrap_scalar): `dim` in [-rank, rank), a 0-dim tensor counted as
/// 1-dim when `wrap_scalar`; eager's IndexError otherwise.
int64_t wrapDim(int64_t dim, int64_t rank, bool wrap_scalar, const OpFacts& facts) {
  if (rank <= 0) {
    TORCH_CHECK_INDEX(wrap_scalar, "Dimension specified as ", dim, " but tensor has no dimensions", where(facts));
    rank = 1;
  }
  TORCH_CHECK_INDEX(dim >= -rank && dim < rank, "Dimension out of range (expected to be in range of [", -rank, ", ",
                    rank - 1, "], but got ", dim, ")", where(facts));
  return dim < 0 ? dim + rank : dim;
}

const at::Tensor* tensorAt(const torch::jit::Stack& args, size_t i) {
  if (i >= args.size() || !args[i].isTensor() || !args[i].toTensor().defined()) return nullptr;
  return &args[i].toTensor();
}

/// The broadcast shape of `shapes` (at::infer_size's rule), nullopt when they do not broadcast.
std::optional<Sizes> broadcast(const std::vector<Sizes>& shapes) {
  Sizes out;
  for (const Sizes& s : shapes) {
    if (s.size() > out.size()) out.insert(out.begin(), s.size() - out.size(), 1);
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[out.size() - s.size() + i];
      const int64_t v = s[i];
      if (o == v || v == 1) continue;
      if (o != 1) return std::nullopt;
      o = v;
    }
  }
  return out;
}

/// at::is_expandable_to(shape, desired).
bool expandableTo(c10::IntArrayRef shape, const Sizes& desired) {
  if (shape.size() > desired.size()) return false;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t s = shape[shape.size() - 1 - i];
    if (s != desired[desired.size() - 1 - i] && s != 1) return false;
  }
  return true;
}

// ---- advanced indexing: aten/src/ATen/native/TensorAdvancedIndexing.cpp, IndexingUtils ---------

/// index.Tensor(self, indices), index_put(_)(self, indices, values, accumulate),
/// _index_put_impl_(..., unsafe): make_info's checks (index dtypes, masks' shapes, broadcasting,
/// an index into a dimension of size 0) and, for a put, make_index_put_iterator's (the value
/// broadcasts to the indexing result and has self's dtype). Masks expand to indices of a length
/// only the node knows: what depends on it is left to the node.
void checkIndexing(const OpFacts& facts, const torch::jit::Stack& args, bool put) {
  const at::Tensor* self = tensorAt(args, 0);
  if (self == nullptr || args.size() < 2 || !args[1].isList()) return;
  std::vector<const at::Tensor*> indices;
  for (const c10::IValue& x : args[1].toListRef()) {
    indices.push_back(x.isTensor() && x.toTensor().defined() ? &x.toTensor() : nullptr);
  }
  const int64_t dim = self->dim();
  TORCH_CHECK_INDEX(put || !indices.empty(), "at least one index must be provided", where(facts));
  TORCH_CHECK_INDEX(static_cast<int64_t>(indices.size()) <= dim, "too many indices for tensor of dimension ", dim,
                    " (got ", indices.size(), ")", where(facts));
  bool masks = false;
  for (const at::Tensor* index : indices) {
    if (index == nullptr) continue;
    const at::ScalarType t = index->scalar_type();
    TORCH_CHECK_INDEX(t == at::kLong || t == at::kInt || t == at::kByte || t == at::kBool,
                      "tensors used as indices must be long, int, byte or bool tensors", where(facts));
    masks = masks || t == at::kByte || t == at::kBool;
  }
  // expandTensors: a mask's sizes are those of the dimensions it covers.
  int64_t expanded = 0;
  for (const at::Tensor* index : indices) {
    if (index == nullptr || (index->scalar_type() != at::kByte && index->scalar_type() != at::kBool)) {
      ++expanded;
      continue;
    }
    for (int64_t j = 0; j < index->dim(); ++j) {
      const int64_t src = wrapDim(expanded + j, dim, /*wrap_scalar=*/false, facts);  // eager's self.size(srcIdx)
      TORCH_CHECK_INDEX(index->size(j) == self->size(src), "The shape of the mask ", index->sizes(), " at index ", j,
                        " does not match the shape of the indexed tensor ", self->sizes(), " at index ", src,
                        where(facts));
    }
    expanded += index->dim();
  }
  if (masks) return;  // the rest depends on how many elements the masks select

  std::vector<Sizes> shapes;
  for (const at::Tensor* index : indices) {
    if (index != nullptr) shapes.emplace_back(index->sizes().begin(), index->sizes().end());
  }
  const std::optional<Sizes> replacement = broadcast(shapes);
  if (!replacement) {
    std::string listed;
    for (const Sizes& s : shapes) listed += (listed.empty() ? "" : ", ") + str(s);
    TORCH_CHECK_INDEX(false, "shape mismatch: indexing tensors could not be broadcast together with shapes ", listed,
                      where(facts));
  }
  // AdvancedIndex: an indexed dimension of size 0 with a non-empty index is out of bounds for
  // any index value.
  bool indexed_empty = false;
  for (size_t i = 0; i < indices.size(); ++i) indexed_empty = indexed_empty || (indices[i] != nullptr && self->size(i) == 0);
  bool replacement_empty = false;
  for (int64_t s : *replacement) replacement_empty = replacement_empty || s == 0;
  TORCH_CHECK_INDEX(!(indexed_empty && !shapes.empty() && !replacement_empty),
                    "index is out of bounds for dimension with size 0", where(facts));
  if (!put) return;

  const at::Tensor* value = tensorAt(args, 2);
  if (value == nullptr) return;
  // The indexing result: the broadcast index shape replaces the indexed dimensions, in place
  // when they are adjacent, else in front.
  Sizes result;
  if (shapes.empty()) {
    result.assign(self->sizes().begin(), self->sizes().end());
  } else {
    int64_t first = -1, last = -1;
    bool adjacent = true;
    for (int64_t i = 0; i < static_cast<int64_t>(indices.size()); ++i) {
      if (indices[i] == nullptr) continue;
      if (first < 0) first = i;
      if (last >= 0 && i != last + 1) adjacent = false;
      last = i;
    }
    if (adjacent) {
      result.assign(self->sizes().begin(), self->sizes().begin() + first);
      result.insert(result.end(), replacement->begin(), replacement->end());
      result.insert(result.end(), self->sizes().begin() + last + 1, self->sizes().end());
    } else {
      result = *replacement;
      for (int64_t i = 0; i < dim; ++i) {
        if (i >= static_cast<int64_t>(indices.size()) || indices[i] == nullptr) result.push_back(self->size(i));
      }
    }
  }
  TORCH_CHECK(expandableTo(value->sizes(), result), "shape mismatch: value tensor of shape ", value->sizes(),
              " cannot be broadcast to indexing result of shape ", c10::IntArrayRef(result), where(facts));
  TORCH_CHECK(value->scalar_type() == self->scalar_type(),
              "Index put requires the source and destination dtypes match, got ", self->scalar_type(),
              " for the destination and ", value->scalar_type(), " for the source.", where(facts));
}

// ---- index_fill: aten/src/ATen/native/TensorAdvancedIndexing.cpp index_fill_ -------------------

/// index_fill(_).int_Scalar / .int_Tensor (self, dim, index, value).
void checkIndexFill(const OpFacts& facts, const torch::jit::Stack& args) {
  const at::Tensor* self = tensorAt(args, 0);
  const at::Tensor* index = tensorAt(args, 2);
  if (self == nullptr || index == nullptr || args.size() < 4 || !args[1].isInt()) return;
  bool complex_value = false;
  if (args[3].isTensor()) {  // int_Tensor: the value is read as a Scalar (source.item())
    const at::Tensor& value = args[3].toTensor();
    TORCH_CHECK(value.dim() == 0, "index_fill_ only supports a 0-dimensional value tensor, but got tensor with ",
                value.dim(), " dimension(s).", where(facts));
    complex_value = at::isComplexType(value.scalar_type());
  } else {
    complex_value = args[3].isComplexDouble();
  }
  TORCH_CHECK_INDEX(index->scalar_type() == at::kLong, "index_fill_(): Expected dtype int64 for index.", where(facts));
  TORCH_CHECK(at::isComplexType(self->scalar_type()) || !complex_value,
              "index_fill_(): Converting complex Scalar to non-complex type is not supported", where(facts));
  wrapDim(args[1].toInt(), self->dim(), /*wrap_scalar=*/true, facts);  // a 0-dim self is filled as 1-dim
  TORCH_CHECK(index->dim() <= 1, "Index has to be a vector/scalar", where(facts));
}

// ---- clamp: aten/src/ATen/native/TensorCompare.cpp -------------------------------------------

/// clamp(_)(self, min, max) and its out= and Tensor overloads: torch.clamp's error, where the meta
/// kernel raises ValueError("clamp called but both min and max are none!").
void checkClamp(const OpFacts& facts, const torch::jit::Stack& args) {
  if (args.size() < 3) return;
  auto none = [](const c10::IValue& v) { return v.isNone() || (v.isTensor() && !v.toTensor().defined()); };
  TORCH_CHECK(!(none(args[1]) && none(args[2])), "torch.clamp: At least one of 'min' or 'max' must not be None",
              where(facts));
}

// ---- add/sub alpha: aten/src/ATen/native/BinaryOps.h alpha_check ------------------------------

/// put/put_(self, index, source, accumulate): eager's nondeterminism alert without accumulate
/// (aten/src/ATen/native/TensorAdvancedIndexing.cpp put_), an error or a warning as
/// torch.use_deterministic_algorithms says.
void checkPut(const OpFacts& /*facts*/, const torch::jit::Stack& args) {
  const bool accumulate = args.size() > 3 && args[3].isBool() && args[3].toBool();
  if (!accumulate) at::globalContext().alertNotDeterministic("put_");
}

/// add/sub(_)(self, other, alpha) and their out= and Scalar overloads: alpha's kind must suit the
/// result's dtype (the Python meta kernel raises ValueError, or nothing for bool tensors).
void checkAlpha(const OpFacts& facts, const torch::jit::Stack& args) {
  const at::Tensor* self = tensorAt(args, 0);
  if (self == nullptr || args.size() < 3 || !args[2].isScalar()) return;
  const c10::Scalar alpha = args[2].toScalar();
  at::ScalarType dtype = self->scalar_type();
  auto metaLike = [](const at::Tensor& t) {
    return at::empty(t.sizes(), at::TensorOptions().device(c10::kMeta).dtype(t.scalar_type()));
  };
  if (const at::Tensor* other = tensorAt(args, 1)) {
    dtype = at::result_type(metaLike(*self), isLazy(*other) ? metaLike(*other) : *other);
  } else if (args[1].isScalar()) {
    dtype = at::result_type(metaLike(*self), args[1].toScalar());
  }
  TORCH_CHECK(!alpha.isBoolean() || dtype == at::kBool, "Boolean alpha only supported for Boolean results.",
              where(facts));
  TORCH_CHECK(at::isFloatingType(dtype) || at::isComplexType(dtype) || alpha.isIntegral(/*includeBool=*/true),
              "For integral input tensors, argument alpha must not be a floating point number.", where(facts));
  TORCH_CHECK(at::isComplexType(dtype) || !alpha.isComplex(),
              "For non-complex input tensors, argument alpha must not be a complex number.", where(facts));
}

/// sub(_)(self, other, alpha), rsub (other - self) and their out= and Scalar overloads:
/// sub_check (aten/src/ATen/native/BinaryOps.h), which the meta kernel does not repeat, then
/// checkAlpha.
void checkSub(const OpFacts& facts, const torch::jit::Stack& args) {
  const at::Tensor* self = tensorAt(args, 0);
  if (self != nullptr && args.size() > 1) {
    const at::Tensor* other = tensorAt(args, 1);
    const bool self_bool = self->scalar_type() == at::kBool;
    const bool other_bool = other != nullptr ? other->scalar_type() == at::kBool : args[1].isBool();
    TORCH_CHECK_NOT_IMPLEMENTED(!self_bool || !other_bool,
                                "Subtraction, the `-` operator, with two bool tensors is not supported. "
                                "Use the `^` or `logical_xor()` operator instead.", where(facts));
    TORCH_CHECK_NOT_IMPLEMENTED(!self_bool && !other_bool,
                                "Subtraction, the `-` operator, with a bool tensor is not supported. "
                                "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.",
                                where(facts));
  }
  checkAlpha(facts, args);
}

// ---- resize_: aten/src/ATen/native/Resize.cpp, c10/core/TensorImpl.cpp empty_tensor_restride ----

/// resize_(self, size, memory_format): the byte size and the contiguous strides of `size` must
/// fit in int64 (the meta kernel does not check either).
void checkResize(const OpFacts& facts, const torch::jit::Stack& args) {
  const at::Tensor* self = tensorAt(args, 0);
  if (self == nullptr || args.size() < 2 || !args[1].isIntList()) return;
  const std::vector<int64_t> sizes = args[1].toIntVector();
  // TensorImpl::set_sizes_contiguous: the element count, the strides, then the bytes.
  uint64_t numel = 1;
  for (int64_t s : sizes) {
    TORCH_CHECK(!c10::mul_overflows(numel, static_cast<uint64_t>(std::max<int64_t>(s, 0)), &numel) &&
                    numel <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                "numel: integer multiplication overflow", where(facts));
  }
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 1;) {
    TORCH_CHECK(!c10::mul_overflows(stride, std::max<int64_t>(sizes[i], 1), &stride), "Stride calculation overflowed",
                where(facts));
  }
  try {
    at::detail::computeStorageNbytesContiguous(sizes, self->dtype().itemsize());
  } catch (c10::Error& e) {
    e.add_context(where(facts).substr(2, where(facts).size() - 3));
    throw;
  }
}

// ---- heaviside: aten/src/ATen/native/BinaryOps.cpp heaviside's meta function ------------------

/// heaviside(_)(self, values) and heaviside.out: the Python meta kernel accepts complex tensors
/// and promotes mixed dtypes.
void checkHeaviside(const OpFacts& facts, const torch::jit::Stack& args) {
  const at::Tensor* self = tensorAt(args, 0);
  const at::Tensor* values = tensorAt(args, 1);
  if (self == nullptr || values == nullptr) return;
  const at::Tensor* out = tensorAt(args, 2);
  TORCH_CHECK_NOT_IMPLEMENTED(!self->is_complex() && !values->is_complex() && (out == nullptr || !out->is_complex()),
                              "heaviside is not yet implemented for complex tensors.", where(facts));
  TORCH_CHECK(self->scalar_type() == values->scalar_type(),
              "heaviside is not yet implemented for tensors with different dtypes.", where(facts));
}

// ---- searchsorted/bucketize: aten/src/ATen/native/BucketizationUtils.h's warnings -------------

/// searchsorted(sorted_sequence, self, ..., sorter) and bucketize(self, boundaries, ...): eager
/// copies a non-contiguous input, boundary or sorter tensor and says so once per program (one
/// TORCH_WARN_ONCE per kind, shared by both ops as eager's are); the node's kernel warns where
/// the program cannot see it.
void warnNonContiguousBuckets(const OpFacts& facts, const torch::jit::Stack& args) {
  auto strided = [&](size_t i) {
    return i < args.size() && args[i].isTensor() && args[i].toTensor().defined() && !args[i].toTensor().is_contiguous();
  };
  const bool bucketize = facts.name.rfind("aten::bucketize", 0) == 0;
  const size_t input = bucketize ? 0 : 1;
  const size_t boundary = bucketize ? 1 : 0;
  if (strided(input)) {
    TORCH_WARN_ONCE("torch.searchsorted(): input value tensor is non-contiguous, this will lower the performance due "
                    "to extra data copy when converting non-contiguous tensor to contiguous, please use contiguous "
                    "input value tensor if possible. This message will only appear once per program.");
  }
  if (strided(boundary)) {
    TORCH_WARN_ONCE("torch.searchsorted(): boundary tensor is non-contiguous, this will lower the performance due "
                    "to extra data copy when converting non-contiguous tensor to contiguous, please use contiguous "
                    "boundary tensor if possible. This message will only appear once per program.");
  }
  if (!bucketize && args.size() > 5 && strided(5)) {  // searchsorted's sorter
    TORCH_WARN_ONCE("torch.searchsorted(): sorter tensor is non-contiguous, this will lower the performance due "
                    "to extra data copy when converting non-contiguous tensor to contiguous, please use contiguous "
                    "sorter tensor if possible. This message will only appear once per program.");
  }
}

// ---- std/var: aten/src/ATen/native/ReduceOps.cpp std_var_out's warning ----------------------

/// std, var, std_mean, var_mean (.default, .dim, .correction): eager warns when the degrees of
/// freedom (elements per output element, less the correction) are <= 0; the meta kernel does not.
void warnDegreesOfFreedom(const OpFacts& facts, const torch::jit::Stack& args) {
  const at::Tensor* self = tensorAt(args, 0);
  if (self == nullptr) return;
  const std::string_view name = facts.name;
  const std::string_view overload = name.substr(name.find('.') == std::string_view::npos ? name.size() : name.find('.') + 1);
  std::optional<std::vector<int64_t>> dims;  // nullopt: every dimension
  double correction = 1;
  if (overload == "dim" || overload == "correction") {
    if (args.size() > 1 && args[1].isIntList()) dims = args[1].toIntVector();
    if (overload == "dim" && args.size() > 2 && args[2].isBool()) correction = args[2].toBool() ? 1 : 0;
    if (overload == "correction" && args.size() > 2 && args[2].isScalar()) correction = args[2].toScalar().toDouble();
  } else if (overload.empty() || overload == "default" || name.find('.') == std::string_view::npos) {
    if (args.size() > 1 && args[1].isBool()) correction = args[1].toBool() ? 1 : 0;
  } else {
    return;  // names overloads: left to the node
  }
  const int64_t rank = self->dim();
  std::vector<bool> reduced(static_cast<size_t>(std::max<int64_t>(rank, 1)), !dims || dims->empty());
  if (dims) {
    for (int64_t d : *dims) {
      if (rank == 0 && (d == 0 || d == -1)) continue;
      if (d < -rank || d >= rank) return;  // the meta kernel raises eager's error
      reduced[static_cast<size_t>(d < 0 ? d + rank : d)] = true;
    }
  }
  int64_t out = 1;
  for (int64_t i = 0; i < rank; ++i) out *= reduced[static_cast<size_t>(i)] ? 1 : self->size(i);
  const double factor = out == 0 ? 0 : static_cast<double>(self->numel()) / static_cast<double>(out);
  const std::string_view fname = name.substr(6, name.find('.') == std::string_view::npos ? std::string_view::npos
                                                                                       : name.find('.') - 6);
  if (factor - correction <= 0) {
    TORCH_WARN(fname, "(): degrees of freedom is <= 0. Correction should be strictly less than the reduction factor "
               "(input numel divided by output numel).");
  }
}

// ---- pow: aten/src/ATen/native/Pow.cpp pow's meta function (Tensor_Scalar) --------------------

/// pow(_)(self, Scalar exponent) and its out=: an integer tensor to a negative integer power.
void checkPow(const OpFacts& facts, const torch::jit::Stack& args) {
  const at::Tensor* self = tensorAt(args, 0);
  if (self == nullptr || args.size() < 2 || !args[1].isScalar()) return;
  const c10::Scalar exponent = args[1].toScalar();
  TORCH_CHECK(!(at::isIntegralType(self->scalar_type(), /*includeBool=*/true) && exponent.isIntegral(true) &&
                exponent.toLong() < 0),
              "Integers to negative integer powers are not allowed.", where(facts));
}

// ---- nonzero.out: aten/src/ATen/native/TensorAdvancedIndexing.cpp nonzero_out_cpu ----------------

void checkNonzeroOut(const OpFacts& facts, const torch::jit::Stack& args) {
  const at::Tensor* out = tensorAt(args, 1);
  if (out == nullptr) return;
  TORCH_CHECK(out->scalar_type() == at::kLong, "nonzero: Expected out tensor to have scalar type Long but got scalar type",
              out->scalar_type(), where(facts));
}

// ---- the CPU probe: eager's own error for a call the meta kernel answers differently -----------

/// The probe's size limit: all its tensors together, bytes.
constexpr int64_t kProbeBytes = int64_t{64} << 20;

/// Whether the node of the call's tensors runs the CPU's kernels (Recording::cpu_kernels).
bool onCpuKernels(const torch::jit::Stack& args) {
  for (const c10::IValue& x : args) {
    if (x.isTensor() && isLazy(x.toTensor())) return lazyState(x.toTensor())->recording().cpu_kernels.load();
    if (x.isList()) {
      for (const c10::IValue& y : x.toListRef()) {
        if (y.isTensor() && isLazy(y.toTensor())) return lazyState(y.toTensor())->recording().cpu_kernels.load();
      }
    }
  }
  return false;
}

/// The CPU tensors of one probe run. LazyTensors on one storage get views of one CPU buffer, so
/// that the CPU sees the aliasing eager would (in-place ops on overlapping arguments).
class ProbeTensors {
 public:
  ProbeTensors(const torch::jit::Stack& args, double fill) : fill_(fill) {
    for (const c10::IValue& arg : args) mapTensors(arg, [&](const at::Tensor& t) { measure(t); return t; }, c10::Device(c10::kCPU));
    TORCH_CHECK(fits(), "probe too large");
  }
  /// Whether the CPU tensors of `args` fit in kProbeBytes together.
  static bool fits(const torch::jit::Stack& args) {
    ProbeTensors sizes(args);
    return sizes.fits();
  }
  c10::IValue arg(const c10::IValue& a) {
    return mapTensors(a, [&](const at::Tensor& t) { return of(t); }, c10::Device(c10::kCPU));
  }

 private:
  struct Base {
    int64_t nbytes = 0;
    at::Tensor bytes;  // uint8 [nbytes], made at first use
  };

  explicit ProbeTensors(const torch::jit::Stack& args) : fill_(0) {
    for (const c10::IValue& arg : args) mapTensors(arg, [&](const at::Tensor& t) { measure(t); return t; }, c10::Device(c10::kCPU));
  }
  bool fits() const {
    int64_t bytes = 0;
    for (const auto& [storage, base] : bases_) bytes += base.nbytes;
    return bytes <= kProbeBytes;
  }

  void measure(const at::Tensor& t) {
    if (!t.defined() || !isLazy(t)) return;
    const int64_t itemsize = static_cast<int64_t>(c10::elementSize(t.scalar_type()));
    const int64_t nbytes = (storageElements(t) * itemsize + 15) / 16 * 16;  // whole elements of any dtype
    Base& base = bases_[t.storage().unsafeGetStorageImpl()];
    base.nbytes = std::max(base.nbytes, nbytes);
  }

  /// A CPU tensor of `t`'s geometry (sizes, strides, storage offset, dtype, conj/neg bits) on its
  /// storage's buffer, its elements filled with `fill`; `t` itself when it is not a LazyTensor (a
  /// wrapped number, a CPU scalar).
  at::Tensor of(const at::Tensor& t) {
    if (!t.defined() || !isLazy(t)) return t;
    Base& base = bases_.at(t.storage().unsafeGetStorageImpl());
    if (!base.bytes.defined()) base.bytes = at::zeros({base.nbytes}, at::TensorOptions().dtype(at::kByte));
    if (t.is_quantized()) return quantized(t, base.bytes);
    at::Tensor cpu = base.bytes.view(t.scalar_type()).as_strided(t.sizes(), t.strides(), t.storage_offset());
    cpu.fill_(fill_);
    if (t.is_conj()) cpu.unsafeGetTensorImpl()->_set_conj(true);
    if (t.is_neg()) cpu.unsafeGetTensorImpl()->_set_neg(true);
    return cpu;
  }

  /// A quantized CPU tensor of `t`'s geometry and quantizer on `bytes`, its integer
  /// representation filled with `fill`.
  at::Tensor quantized(const at::Tensor& t, const at::Tensor& bytes) {
    const at::ScalarType dtype = t.scalar_type();
    bytes.view(c10::toUnderlying(dtype)).as_strided(t.sizes(), t.strides(), t.storage_offset()).fill_(fill_);
    const at::QuantizerPtr quantizer = quantizerOf(t);
    const auto* affine = dynamic_cast<const at::PerTensorAffineQuantizer*>(quantizer.get());
    at::Tensor cpu = at::from_blob_quantized_per_tensor_affine(
        bytes.data_ptr(), {bytes.numel() / static_cast<int64_t>(c10::elementSize(dtype))}, [](void*) {},
        affine != nullptr ? static_cast<float>(affine->scale()) : 1.0f, affine != nullptr ? affine->zero_point() : 0,
        at::TensorOptions().dtype(dtype));
    cpu = cpu.as_strided(t.sizes(), t.strides(), t.storage_offset());
    if (quantizer) at::set_quantizer_(cpu, quantizer);  // from_blob takes a float scale: the double back
    return cpu;
  }

  const double fill_;
  std::unordered_map<const c10::StorageImpl*, Base> bases_;
};

/// Whether the probe may run `op`: it takes no explicit generator (a random op draws from the
/// CPU's default generator, whose state eagerError restores), writes only LazyTensors, and holds
/// no quantized or sparse tensor.
bool probeable(const OpFacts& facts, const torch::jit::Stack& args) {
  for (size_t i = 0; i < args.size() && i < facts.args.size(); ++i) {
    if (facts.args[i] == ArgKind::kGenerator && !args[i].isNone()) return false;
  }
  for (int w : facts.writes) {
    if (w >= static_cast<int>(args.size())) return false;
    const c10::IValue& x = args[w];
    if (x.isTensor() && x.toTensor().defined() && !isLazy(x.toTensor())) return false;
  }
  bool ok = true;
  auto visit = [&](const at::Tensor& t) {
    if (t.defined() && (c10::isQIntType(t.scalar_type()) || t.layout() != c10::kStrided)) ok = false;
  };
  for (const c10::IValue& x : args) {
    if (x.isTensor()) visit(x.toTensor());
    if (x.isTensorList()) {
      for (const at::Tensor& t : x.toTensorList()) visit(t);
    }
  }
  return ok;
}

/// Restores the CPU's default generator on destruction: a random op run on the CPU must not move
/// the program's CPU random stream.
struct KeepCpuGenerator {
  explicit KeepCpuGenerator(bool seeded) {
    if (seeded) state = at::detail::getDefaultCPUGenerator().get_state();
  }
  ~KeepCpuGenerator() {
    if (state.defined()) {
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      generator.set_state(state);
    }
  }
  at::Tensor state;
};

/// Drops the warnings of a probe run that is not the call's word (the meta kernel's stands).
struct DiscardWarnings final : c10::WarningHandler {
  void process(const c10::Warning& /*warning*/) override {}
};

/// One run of `op` on CPU tensors filled with `fill`: the c10::Error it raised, or null (it ran,
/// or failed in a way that says nothing of eager's error: too large, not implemented on the CPU).
/// Its warnings reach the program only with `warn`. `results`, if given, receives what the run
/// returned when it ran.
std::exception_ptr probeOnce(const c10::OperatorHandle& op, const torch::jit::Stack& args, double fill,
                             bool cpu_kernels, bool warn, torch::jit::Stack* results) {
  try {
    ProbeTensors tensors(args, fill);
    torch::jit::Stack stack;
    stack.reserve(args.size());
    for (const c10::IValue& arg : args) stack.push_back(tensors.arg(arg));
    try {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      c10::impl::ExcludeDispatchKeyGuard no_python(
          c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
      DiscardWarnings discard;
      std::optional<c10::WarningUtils::WarningHandlerGuard> quiet;
      if (!warn) quiet.emplace(&discard);
      op.callBoxed(stack);
      if (results != nullptr) *results = std::move(stack);
    } catch (const c10::Error& e) {
      // A kernel or a dtype the CPU lacks: eager on the node's device may have it.
      const std::string_view what = e.what_without_backtrace();
      // (A node that runs the CPU's kernels lacks the dtype too: then it is eager's error.)
      if (what.find("Could not run") != std::string_view::npos ||
          (!cpu_kernels && what.find("not implemented for '") != std::string_view::npos)) {
        return nullptr;
      }
      return std::current_exception();
    }
  } catch (...) {
  }
  return nullptr;
}

/// Eager's error for the call when the CPU raises one whatever the values: the same exception
/// class and message with tensors of zeros and of ones (an error that depends on the values, an
/// index out of range or an integer division by zero, differs between the two and is left to
/// the node). Null when there is none. `results`: as probeOnce's, of the run with zeros; `warn`:
/// whether that run's warnings are the call's (probesAfterMeta).
std::exception_ptr eagerError(const c10::OperatorHandle& op, const OpFacts& facts, const torch::jit::Stack& args,
                              torch::jit::Stack* results, bool warn = false) {
  if (!probeable(facts, args)) return nullptr;
  KeepCpuGenerator keep(facts.seeded);
  const bool cpu_kernels = onCpuKernels(args);
  std::exception_ptr zeros = probeOnce(op, args, 0.0, cpu_kernels, warn, results);
  if (!zeros) return nullptr;
  std::exception_ptr ones = probeOnce(op, args, 1.0, cpu_kernels, /*warn=*/false, nullptr);
  if (!ones) return nullptr;
  auto describe = [](const std::exception_ptr& e) -> std::pair<const std::type_info*, std::string> {
    try {
      std::rethrow_exception(e);
    } catch (const c10::Error& error) {
      return {&typeid(error), error.what_without_backtrace()};
    }
  };
  return describe(zeros) == describe(ones) ? zeros : nullptr;
}

[[noreturn]] void raiseEager(const std::exception_ptr& error, const OpFacts& facts) {
  try {
    std::rethrow_exception(error);
  } catch (c10::Error& e) {
    e.add_context("genie: " + facts.name + " on remote_accelerator, checked on the client by its CPU kernel");
    throw;
  }
}

using Check = std::function<void(const OpFacts&, const torch::jit::Stack&)>;

/// Checks by operator name without the overload ("aten::index_put_").
const std::unordered_map<std::string, Check>& checks() {
  static const auto* table = new std::unordered_map<std::string, Check>{
      {"aten::index", [](const OpFacts& f, const torch::jit::Stack& a) { checkIndexing(f, a, /*put=*/false); }},
      {"aten::index_put", [](const OpFacts& f, const torch::jit::Stack& a) { checkIndexing(f, a, /*put=*/true); }},
      {"aten::index_put_", [](const OpFacts& f, const torch::jit::Stack& a) { checkIndexing(f, a, /*put=*/true); }},
      {"aten::_index_put_impl_", [](const OpFacts& f, const torch::jit::Stack& a) { checkIndexing(f, a, /*put=*/true); }},
      {"aten::index_fill", checkIndexFill},
      {"aten::index_fill_", checkIndexFill},
      {"aten::clamp", checkClamp},
      {"aten::clamp_", checkClamp},
      {"aten::resize_", checkResize},
      {"aten::heaviside", checkHeaviside},
      {"aten::pow", checkPow},
      {"aten::pow_", checkPow},
      {"aten::heaviside_", checkHeaviside},
      {"aten::add", checkAlpha},
      {"aten::add_", checkAlpha},
      {"aten::sub", checkSub},
      {"aten::sub_", checkSub},
      {"aten::rsub", checkSub},
  };
  return *table;
}

}  // namespace

/// Ops whose eager checks the meta kernels miss in many forms (index_add's slice shapes,
/// cummax's dimension of an empty tensor, bucketize's boundaries of 2 dimensions,
/// searchsorted's `side` and sorter): always probed on a plan-cache miss.
bool alwaysProbed(const std::string& name) {
  static const auto* names = new std::unordered_set<std::string>{
      "aten::index_add", "aten::index_add_", "aten::index_copy", "aten::index_copy_", "aten::index_reduce",
      "aten::index_reduce_", "aten::cummax", "aten::cummin", "aten::searchsorted", "aten::bucketize"};
  return names->count(name) != 0;
}

void checkAsEager(const c10::OperatorHandle& op, const OpFacts& facts, const torch::jit::Stack& args) {
  const std::string& name = op.schema().name();
  if (alwaysProbed(name)) raiseAsEager(op, facts, args);
  if (name == "aten::nonzero" && op.schema().overload_name() == "out") return checkNonzeroOut(facts, args);
  const auto& table = checks();
  const auto it = table.find(name);
  if (it != table.end()) it->second(facts, args);
}

void raiseAsEager(const c10::OperatorHandle& op, const OpFacts& facts, const torch::jit::Stack& args) {
  if (std::exception_ptr error = eagerError(op, facts, args, nullptr)) raiseEager(error, facts);
}

bool writesOut(const c10::OperatorHandle& op, const OpFacts& facts) {
  const auto& schema = op.schema().arguments();
  for (int w : facts.writes) {
    if (w < static_cast<int>(schema.size()) && schema[w].kwarg_only()) return true;
  }
  return false;
}

namespace {

/// Whether a call that is no out= call is unusual enough for the CPU probe (checkUnusualOnCpu).
bool unusualCall(const OpFacts& facts, const torch::jit::Stack& args) {
  // A written tensor that overlaps itself (an expanded tensor) or another argument: eager's
  // memory-overlap checks (TensorIterator's, index_put's, ...) raise or not, op by op.
  const c10::StorageImpl* written[4] = {};
  size_t n_written = 0;
  for (int w : facts.writes) {
    if (w >= static_cast<int>(args.size()) || !args[w].isTensor()) continue;
    const at::Tensor& t = args[w].toTensor();
    if (!t.defined() || !isLazy(t)) continue;
    if (at::has_internal_overlap(t) == at::MemOverlap::Yes) return true;
    if (n_written < 4) written[n_written++] = t.storage().unsafeGetStorageImpl();
  }
  int on_written = 0;  // tensor arguments on a written storage (the written ones included)
  auto count = [&](const at::Tensor& t) {
    if (n_written == 0 || !t.defined() || !isLazy(t)) return;
    const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    if (std::find(written, written + n_written, s) != written + n_written) ++on_written;
  };
  for (const c10::IValue& x : args) {
    if (x.isTensor()) count(x.toTensor());
    if (x.isList()) {  // Tensor[] and Tensor?[] (index_put's indices)
      for (const c10::IValue& y : x.toListRef()) {
        if (y.isTensor()) count(y.toTensor());
      }
    }
  }
  if (on_written > static_cast<int>(n_written)) return true;
  // An in-place op with an argument of another dtype: the meta kernels skip TensorIterator's
  // check that the result type casts to the written tensor (`int_tensor *= float_tensor`:
  // "result type Float can't be cast to the desired output type Int").
  for (int w : facts.writes) {
    if (w >= static_cast<int>(args.size()) || !args[w].isTensor()) continue;
    const at::Tensor& t = args[w].toTensor();
    if (!t.defined() || !isLazy(t)) continue;
    for (const c10::IValue& x : args) {
      if (x.isTensor() && x.toTensor().defined() && x.toTensor().scalar_type() != t.scalar_type()) return true;
      if ((x.isDouble() && !at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type())) ||
          (x.isComplexDouble() && !at::isComplexType(t.scalar_type()))) {
        return true;
      }
    }
  }
  // Complex tensors, more than 64 dimensions, and empty tensors (eager's kernels check empty
  // inputs in ways the meta kernels miss: `max(x, dim)` over an empty dimension; the probe of
  // an empty tensor costs no memory).
  auto odd = [](const at::Tensor& t) {
    return t.defined() && (at::isComplexType(t.scalar_type()) || t.dim() > 64 || (t.numel() == 0 && isLazy(t)));
  };
  for (const c10::IValue& x : args) {
    if (x.isTensor() && odd(x.toTensor())) return true;
    if (x.isTensorList()) {
      for (const at::Tensor& t : x.toTensorList()) {
        if (odd(t)) return true;
      }
    }
  }
  return false;
}

}  // namespace

bool probesAfterMeta(const c10::OperatorHandle& op, const OpFacts& facts, const torch::jit::Stack& args) {
  return (writesOut(op, facts) || unusualCall(facts, args)) && probeable(facts, args) && ProbeTensors::fits(args);
}

std::optional<Shapes> checkUnusualOnCpu(const c10::OperatorHandle& op, const OpFacts& facts,
                                        const torch::jit::Stack& args) {
  if (writesOut(op, facts)) {
    torch::jit::Stack results;
    if (std::exception_ptr error = eagerError(op, facts, args, &results, /*warn=*/true)) raiseEager(error, facts);
    if (results.empty()) return std::nullopt;
    return shapesOfResults(results);
  }
  if (unusualCall(facts, args)) {
    if (std::exception_ptr error = eagerError(op, facts, args, nullptr, /*warn=*/true)) raiseEager(error, facts);
  }
  return std::nullopt;
}

std::optional<Shapes> shapesOnCpuKernels(const c10::OperatorHandle& op, const OpFacts& facts,
                                        const torch::jit::Stack& args, const std::exception& error) {
  if (std::string_view(error.what()).find("does not have a deterministic implementation") ==
          std::string_view::npos ||
      !onCpuKernels(args)) {
    return std::nullopt;
  }
  auto& context = at::globalContext();
  const bool warn_only = context.deterministicAlgorithmsWarnOnly();
  context.setDeterministicAlgorithms(false, false);
  try {
    Shapes shapes = metaShapes(op, facts, args);
    context.setDeterministicAlgorithms(true, warn_only);
    return shapes;
  } catch (...) {
    context.setDeterministicAlgorithms(true, warn_only);
    throw;
  }
}

namespace {

/// `index`'s values if the host knows them (host_eval.h checkedHostValue), as a CPU tensor of
/// its sizes and dtype; a host tensor as itself; undefined otherwise.
at::Tensor knownIndex(const at::Tensor& index) {
  LazyState* lazy = lazyState(index);
  if (lazy == nullptr) return index;
  if (!lazy->value() || index.numel() * static_cast<int64_t>(index.element_size()) > kHostEvalMaxBytes) return {};
  at::Tensor host = checkedHostValue(*lazy->value(), lazy->recording());
  if (!host.defined() || host.sizes() != index.sizes() || host.scalar_type() != index.scalar_type()) return {};
  return host;
}

/// Runs `check` (the CPU's kernel on stand-ins) and raises the IndexError it raises, as eager's.
template <typename F>
void raiseIndexError(const OpFacts& facts, F&& check) {
  try {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    c10::impl::ExcludeDispatchKeyGuard no_python(
        c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
    check();
  } catch (c10::IndexError& e) {
    e.add_context("genie: " + facts.name + " on remote_accelerator, checked on the client with the indices' values "
                  "known on the host");
    throw;
  } catch (const std::exception&) {
    // another error (shapes that do not broadcast): the recorder's checks raise eager's
  }
}

/// index_fill(_)(self, dim, index, value): the CPU's index_fill on a tensor of self's rank whose
/// only dimension of more than one element is `dim`.
void checkIndexFillValues(const OpFacts& facts, const c10::IValue* first, size_t n) {
  if (n < 3 || !first[0].isTensor() || !first[1].isInt() || !first[2].isTensor()) return;
  const at::Tensor& self = first[0].toTensor();
  const at::Tensor& index = first[2].toTensor();
  if (!isLazy(self) || !isLazy(index) || self.dim() == 0 || index.scalar_type() != at::kLong) return;
  const int64_t dim = first[1].toInt();
  if (dim < -self.dim() || dim >= self.dim() || self.size(dim) > (int64_t{1} << 24)) return;
  at::Tensor host = knownIndex(index);
  if (!host.defined()) return;
  std::vector<int64_t> sizes(self.dim(), 1);
  sizes[dim < 0 ? dim + self.dim() : dim] = self.size(dim);
  raiseIndexError(facts, [&] { at::zeros(sizes, at::TensorOptions().dtype(at::kByte)).index_fill_(dim, host, 0); });
}

}  // namespace

void checkIndexValues(const OpFacts& facts, const c10::IValue* first, size_t n) {
  if (facts.name.rfind("aten::index_fill", 0) == 0) return checkIndexFillValues(facts, first, n);
  if (n < 2 || !first[0].isTensor() || !first[1].isList()) return;
  const at::Tensor& self = first[0].toTensor();
  if (!isLazy(self)) return;
  const auto list = first[1].toListRef();
  if (list.size() > static_cast<size_t>(self.dim())) return;  // too many indices: the shapes say so
  c10::List<std::optional<at::Tensor>> indices;
  std::vector<int64_t> sizes;
  bool device_index = false;
  for (size_t d = 0; d < list.size(); ++d) {
    const c10::IValue& x = list[d];
    if (!x.isTensor() || !x.toTensor().defined()) {
      indices.push_back(std::nullopt);
      sizes.push_back(1);  // a whole dimension: its size plays no part in the bounds
      continue;
    }
    const at::Tensor& index = x.toTensor();
    if (index.scalar_type() != at::kLong && index.scalar_type() != at::kInt) return;  // masks: other rules
    sizes.push_back(self.size(static_cast<int64_t>(d)));
    at::Tensor host = knownIndex(index);
    if (!host.defined()) return;
    indices.push_back(host);
    device_index = device_index || isLazy(index);
  }
  if (!device_index) return;
  std::vector<int64_t> shape;  // the indices broadcast: the stand-in's result has as many bytes
  for (const std::optional<at::Tensor>& index : indices) {
    if (!index) continue;
    try {
      shape = shape.empty() ? index->sizes().vec() : at::infer_size(shape, index->sizes());
    } catch (const std::exception&) {
      return;  // indices that do not broadcast: the recorder's checks raise eager's error
    }
  }
  if (c10::multiply_integers(shape) > (int64_t{1} << 24)) return;
  raiseIndexError(facts, [&] { at::index(at::zeros({}, at::TensorOptions().dtype(at::kByte)).expand(sizes), indices); });
}

bool isQuantizedCall(const OpFacts& facts, const torch::jit::Stack& args) {
  // Quantized outputs of integer tensors, with no dtype argument.
  if (facts.name == "aten::_make_per_tensor_quantized_tensor" || facts.name == "aten::_make_per_channel_quantized_tensor") {
    return true;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& x = args[i];
    if (x.isTensor() && x.toTensor().defined() && x.toTensor().is_quantized()) return true;
    if (x.isList()) {
      for (const c10::IValue& y : x.toListRef()) {
        if (y.isTensor() && y.toTensor().defined() && y.toTensor().is_quantized()) return true;
      }
    }
    if (i < facts.args.size() && facts.args[i] == ArgKind::kScalarType && x.isInt() &&
        c10::isQIntType(static_cast<at::ScalarType>(x.toInt()))) {
      return true;
    }
  }
  return false;
}

Shapes quantizedShapes(const c10::OperatorHandle& op, const OpFacts& facts, const torch::jit::Stack& args) {
  TORCH_CHECK_NOT_IMPLEMENTED(ProbeTensors::fits(args), facts.name,
                              ": quantized tensors whose arguments take more than ", kProbeBytes >> 20,
                              " MiB are not supported on remote_accelerator (their outputs are inferred on the "
                              "client's CPU); quantize on the host");
  KeepCpuGenerator keep(facts.seeded);
  auto run = [&](double fill, torch::jit::Stack& results) -> std::exception_ptr {
    try {
      ProbeTensors tensors(args, fill);
      torch::jit::Stack stack;
      stack.reserve(args.size());
      for (const c10::IValue& arg : args) stack.push_back(tensors.arg(arg));
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      c10::impl::ExcludeDispatchKeyGuard no_python(
          c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
      op.callBoxed(stack);
      results = std::move(stack);
      return nullptr;
    } catch (const c10::Error&) {
      return std::current_exception();
    }
  };
  torch::jit::Stack zeros_out, ones_out;
  const std::exception_ptr zeros = run(0.0, zeros_out);
  const std::exception_ptr ones = run(1.0, ones_out);
  if (zeros && ones) raiseEager(zeros, facts);
  // A view as another dtype keeps the quantized key set on a plain TensorImpl, which PyTorch's
  // quantized kernels would later misread (and crash on): refused, as the node refuses it.
  for (const c10::IValue& out : zeros ? ones_out : zeros_out) {
    TORCH_CHECK_NOT_IMPLEMENTED(!out.isTensor() || !out.toTensor().defined() || !out.toTensor().is_quantized() ||
                                    c10::isQIntType(out.toTensor().scalar_type()),
                                facts.name, ": viewing a quantized tensor as a tensor of another dtype is not "
                                "supported on remote_accelerator; use int_repr()");
  }
  Shapes shapes = shapesOfResults(zeros ? ones_out : zeros_out);
  const std::optional<Shapes> other = zeros || ones ? std::nullopt : std::optional<Shapes>(shapesOfResults(ones_out));
  for (size_t i = 0; i < shapes.outputs.size(); ++i) {
    const at::QuantizerPtr& q = shapes.outputs[i].quantizer;
    if (!q) continue;
    TORCH_CHECK_NOT_IMPLEMENTED(dynamic_cast<const at::PerTensorAffineQuantizer*>(q.get()) != nullptr ||
                                    dynamic_cast<const at::UnknownQuantizer*>(q.get()) != nullptr,
                                facts.name, ": ", c10::toString(q->qscheme()),
                                " quantized tensors are not supported on remote_accelerator (per-tensor affine "
                                "only); quantize on the host");
    if (!other) continue;
    const at::QuantizerPtr& q2 = other->outputs[i].quantizer;
    TORCH_CHECK_NOT_IMPLEMENTED(q2 && q->equalTo(q2), facts.name,
                                ": its output's quantization parameters depend on the tensor's values, which "
                                "remote_accelerator does not support; quantize on the host");
  }
  return shapes;
}

bool warnsAsEager(const std::string& name) {
  return name == "aten::std" || name == "aten::var" || name == "aten::std_mean" || name == "aten::var_mean" ||
         name == "aten::put" || name == "aten::put_" || name == "aten::searchsorted" || name == "aten::bucketize";
}

void warnAsEager(const OpFacts& facts, const c10::IValue* first, size_t n) {
  const torch::jit::Stack args(first, first + n);
  if (facts.name.rfind("aten::put", 0) == 0) return checkPut(facts, args);
  if (facts.name.rfind("aten::searchsorted", 0) == 0 || facts.name.rfind("aten::bucketize", 0) == 0) {
    return warnNonContiguousBuckets(facts, args);
  }
  warnDegreesOfFreedom(facts, args);
}

}  // namespace genie::frontend
