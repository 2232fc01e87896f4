// Sparse COO tensors on remote_accelerator: the client's half.
//
// A sparse tensor on the device is PyTorch's own SparseTensorImpl (dispatch key
// SparsePrivateUse1) whose indices (int64 [sparse_dim, nnz]) and values ([nnz, dense sizes...])
// are LazyTensors. What only reads or rearranges those parts runs here, as PyTorch's
// device-generic sparse kernels registered below (construction, the parts and their counts,
// copy_, clone, empty, resize, zero_): the ops they call on the parts are recorded as any. Every
// other op with a sparse argument reaches genie.sparse's fallback, which runs it on the node.
#include <ATen/SparseTensorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/SparseTensorUtils.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/ccol_indices_native.h>
#include <ATen/ops/col_indices_native.h>
#include <ATen/ops/crow_indices_native.h>
#include <ATen/ops/row_indices_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/sparse_resize_and_clear_native.h>
#include <ATen/ops/sparse_resize_native.h>
#include <ATen/ops/values_native.h>
#include <ATen/ops/zero_native.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "bindings.h"
#include "frontend/lazy_tensor.h"

TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", TORCH_FN(at::native::new_with_dims_and_tensor_sparse_symint));
  m.impl("_sparse_coo_tensor_with_dims", TORCH_FN(at::native::new_with_dims_sparse));
  m.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  m.impl("_values", TORCH_FN(at::native::_values_sparse));
  m.impl("indices", TORCH_FN(at::native::indices_sparse));
  m.impl("values", TORCH_FN(at::native::values_sparse));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_dimI", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("_dimV", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  m.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
  m.impl("copy_", TORCH_FN(at::native::copy_sparse_wrapper_));
  m.impl("clone", TORCH_FN(at::native::clone_sparse));
  m.impl("empty.memory_format", TORCH_FN(at::native::empty_sparse_symint));
  m.impl("sparse_resize_", TORCH_FN(at::native::sparse_resize_));
  m.impl("sparse_resize_and_clear_", TORCH_FN(at::native::sparse_resize_and_clear_));
  m.impl("zero_", TORCH_FN(at::native::zero_sparse_));
}

// Sparse compressed tensors (CSR, CSC, BSR, BSC): PyTorch's SparseCsrTensorImpl (dispatch key
// SparseCsrPrivateUse1) built of LazyTensors by PyTorch's own constructors; their member
// accessors read those parts here. Every other op on one raises NotImplementedError naming it
// (genie.sparse).
TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("crow_indices", TORCH_FN(at::native::crow_indices_sparse_csr));
  m.impl("col_indices", TORCH_FN(at::native::col_indices_sparse_csr));
  m.impl("ccol_indices", TORCH_FN(at::native::ccol_indices_sparse_csr));
  m.impl("row_indices", TORCH_FN(at::native::row_indices_sparse_csr));
  m.impl("values", TORCH_FN(at::native::values_sparse_csr));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse_csr));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse_csr));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse_csr));
}

namespace genie::python {

namespace py = pybind11;

void bindSparse(py::module_& m) {
  m.def(
      "sparse_set_parts",
      [](py::handle self, py::handle indices, py::handle values, int64_t sparse_dim, int64_t dense_dim,
         std::vector<int64_t> sizes, bool coalesced) {
        if (!THPVariable_Check(self.ptr()) || !THPVariable_Check(indices.ptr()) || !THPVariable_Check(values.ptr())) {
          throw py::type_error("sparse_set_parts: expected tensors");
        }
        const at::Tensor& tensor = THPVariable_Unpack(self.ptr());
        TORCH_CHECK(tensor.layout() == c10::kSparse, "sparse_set_parts: expected a sparse COO tensor, got ",
                    tensor.layout());
        auto* impl = at::sparse::get_sparse_impl(tensor);
        impl->raw_resize_(sparse_dim, dense_dim, sizes);
        impl->set_indices_and_values_unsafe(THPVariable_Unpack(indices.ptr()), THPVariable_Unpack(values.ptr()));
        impl->set_coalesced(coalesced);
      },
      "sparse_set_parts(self, indices, values, sparse_dim, dense_dim, sizes, coalesced): a sparse COO tensor "
      "on remote_accelerator takes these parts and geometry (an in-place op's result made on the node).");
}

}  // namespace genie::python
