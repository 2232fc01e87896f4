"""Sparse COO tensors on remote_accelerator (genie.sparse): made on the device or moved there,
ops with a sparse argument run on the node, results equal eager's on the CPU, values, dtypes,
layouts, coalesced flags and views alike. Each case runs on the CPU and on the embedded node."""

import pytest
import torch

import genie

DEV = "remote_accelerator:0"


def _dense(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 5, generator=g)
    return x * (torch.rand(4, 5, generator=g) > 0.5)


def _same(remote, local):
    assert remote.layout == local.layout and remote.dtype == local.dtype and remote.shape == local.shape
    if local.layout == torch.sparse_coo:
        assert remote.is_coalesced() == local.is_coalesced()
        assert remote.sparse_dim() == local.sparse_dim() and remote.dense_dim() == local.dense_dim()
        remote, local = remote.to_dense(), local.to_dense()
    torch.testing.assert_close(remote.cpu(), local, rtol=0, atol=0)


@pytest.mark.parametrize("case", [
    lambda d, x: x.to(d).to_sparse(),
    lambda d, x: x.to(d).to_sparse(1),
    lambda d, x: x.to_sparse().to(d),
    lambda d, x: torch.sparse_coo_tensor(torch.tensor([[0, 2], [1, 3]]).to(d), torch.tensor([1.5, -2.]).to(d), (4, 5)),
    lambda d, x: x.to(d).to_sparse() + x.to(d).to_sparse(),  # sparse + sparse: sparse, not coalesced
    lambda d, x: x.to(d) + x.to(d).to_sparse(),  # dense + sparse: dense
    lambda d, x: x.to(d).to_sparse() * 2.5,  # a wrapped number
    lambda d, x: torch.div(x.to(torch.int64).to(d).to_sparse(), 2),  # int / int: the default float dtype
    lambda d, x: (x.to(d).to_sparse() + x.to(d).to_sparse()).coalesce(),
    lambda d, x: x.to(d).to_sparse().t(),
    lambda d, x: torch.sparse.sum(x.to(d).to_sparse(), dim=0),
    lambda d, x: torch.sparse.mm(x.to(d).to_sparse(), x.t().contiguous().to(d)),
], ids=["to_sparse", "to_sparse-sparse_dim", "cpu-sparse-to", "sparse_coo_tensor", "add-sparse-sparse",
        "add-dense-sparse", "mul-scalar", "div-int", "coalesce", "t", "sparse.sum", "sparse.mm"])
def test_sparse_results_equal_eager(case):
    _same(case(DEV, _dense()), case("cpu", _dense()))


def test_in_place_ops_and_views_keep_eagers_aliasing():
    def run(d):
        s = _dense().to(d).to_sparse()
        s.mul_(3)  # in place on a sparse tensor: it takes the node's parts
        s.add_(s)
        pairs = torch.sparse_coo_tensor(torch.tensor([[0, 2], [0, 1]]), torch.tensor([[2., 3.], [4., 5.]]),
                                        (3, 3, 2)).to(d)
        as_complex = torch.view_as_complex(pairs)  # a view: its values are a view of pairs' values
        shared = as_complex._values().untyped_storage().data_ptr() == pairs._values().untyped_storage().data_ptr()
        return s, as_complex, shared, as_complex._base is pairs

    got, want = run(DEV), run("cpu")
    _same(got[0], want[0])
    _same(got[1], want[1])
    assert got[2:] == want[2:] == (True, True)


def test_errors_are_eagers_and_lose_nothing_else():
    x = _dense().to(DEV)
    pending = x * 2  # recorded before the failing op: it must survive the failure
    with pytest.raises(RuntimeError, match="Sparse division requires a scalar or zero-dim dense tensor divisor"):
        x.to_sparse().div_(x)
    torch.testing.assert_close(pending.cpu(), _dense() * 2)
    with pytest.raises(NotImplementedError, match="sparse compressed tensors .* are not supported"):
        x.to_sparse_csr()


def test_sparse_ops_run_on_the_node_not_on_the_host():
    s = _dense().to(DEV).to_sparse()
    before = genie.client_stats()
    total = torch.sparse.sum(s + s)
    assert genie.client_stats()["round_trips"] > before["round_trips"]  # each op ran on the node
    torch.testing.assert_close(total.cpu(), (_dense() * 2).sum())


def test_sparse_csr_tensors_are_built_and_read_member_by_member():
    crow, col, values = torch.tensor([0, 1, 2]), torch.tensor([1, 0]), torch.tensor([1.0, 2.0])
    t = torch.sparse_csr_tensor(crow.to(DEV), col.to(DEV), values.to(DEV), size=(2, 2))
    assert (t.layout, t.device.type, t.shape, t._nnz()) == (torch.sparse_csr, "remote_accelerator", (2, 2), 2)
    assert torch.equal(t.crow_indices().cpu(), crow)
    assert torch.equal(t.col_indices().cpu(), col)
    assert torch.equal(t.values().cpu(), values)
    assert torch.equal(t.cpu().to_dense(), torch.sparse_csr_tensor(crow, col, values, size=(2, 2)).to_dense())
    with pytest.raises(NotImplementedError, match="aten::_to_dense: sparse compressed tensors .* are not supported"):
        t.to_dense()
