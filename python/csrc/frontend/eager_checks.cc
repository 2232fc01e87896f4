#include "frontend/eager_checks.h"

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "frontend/op_facts.h"

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

// ---- nonzero.out: aten/src/ATen/native/TensorAdvancedIndexing.cpp nonzero_out_cpu ----------------

void checkNonzeroOut(const OpFacts& facts, const torch::jit::Stack& args) {
  const at::Tensor* out = tensorAt(args, 1);
  if (out == nullptr) return;
  TORCH_CHECK(out->scalar_type() == at::kLong, "nonzero: Expected out tensor to have scalar type Long but got scalar type",
              out->scalar_type(), where(facts));
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
  };
  return *table;
}

}  // namespace

void checkAsEager(const c10::OperatorHandle& op, const OpFacts& facts, const torch::jit::Stack& args) {
  const std::string& name = op.schema().name();
  if (name == "aten::nonzero" && op.schema().overload_name() == "out") return checkNonzeroOut(facts, args);
  const auto& table = checks();
  const auto it = table.find(name);
  if (it != table.end()) it->second(facts, args);
}

}  // namespace genie::frontend
