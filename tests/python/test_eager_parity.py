"""Eager parity (issue 23): for the same bad input, remote_accelerator raises the exception class
eager PyTorch raises on the CPU, with a message that starts with eager's, before anything is
sent; what eager computes (uint8 masks, uint64 scalars, deterministic algorithms, float8 fnuz
dtypes) comes out equal. Each case runs eagerly on the CPU and on the embedded genie-node."""

import warnings

import pytest
import torch

from torch.testing._internal.common_utils import DeterministicGuard

import genie  # noqa: F401

DEV = "remote_accelerator:0"


def _raised(fn, device):
    with pytest.raises(Exception) as info:
        fn(device)
    return info.value


def assert_raises_as_eager(fn):
    """fn(device) raises on the CPU and on the device: the same class, the device's message
    starting with eager's, and nothing sent (the error is raised at the op)."""
    eager = _raised(fn, "cpu")
    before = genie.client_stats()
    remote = _raised(fn, DEV)
    assert type(remote) is type(eager), (type(remote), remote, type(eager), eager)
    assert str(remote).startswith(str(eager)), (str(remote), str(eager))
    assert "remote_accelerator" in str(remote)
    assert genie.client_stats()["round_trips"] == before["round_trips"]


def _t(data, device, **kwargs):
    return torch.tensor(data, **kwargs).to(device)


# ---- errors decidable from shapes and dtypes: raised at the op -----------------------------------

@pytest.mark.parametrize("case", [
    # index_fill_: a complex value for a real tensor; an index that is not int64; a matrix index
    lambda d: _t([[1., 2.], [4., 5.]], d).index_fill_(1, _t([0], d), 1 + 1j),
    lambda d: _t([[1., 2.], [4., 5.]], d).index_fill_(1, _t([0], d, dtype=torch.int32), 1.),
    lambda d: _t([[1., 2.], [4., 5.]], d).index_fill_(1, _t([[0]], d), 1.),
    lambda d: _t([[1., 2.], [4., 5.]], d).index_fill_(2, _t([0], d), 1.),
    lambda d: _t([[1., 2.], [4., 5.]], d).index_fill_(1, _t([0], d), _t([1.], d)),
    # clamp without bounds: RuntimeError (its meta kernel raises ValueError)
    lambda d: torch.ones(3, device=d).clamp(),
    lambda d: torch.ones(3, device=d).clamp_(),
    # advanced indexing
    lambda d: torch.ops.aten.index.Tensor(torch.ones(3, device=d), []),
    lambda d: _t([1, 2, 3], d)[torch.zeros(0, device=d)],  # a float index
    lambda d: torch.zeros(5, 5, device=d)[[0, 1], [0, 1, 2]],  # indices that do not broadcast
    lambda d: torch.zeros(5, 5, device=d).__setitem__(([0, 1], [0, 1, 2]), 0),
    lambda d: torch.zeros(10, 0, device=d)[:, [0, 1]],  # an index into a dimension of size 0
    lambda d: torch.zeros(3, 4, device=d)[_t([True, False], d)],  # a mask of the wrong shape
    lambda d: torch.zeros(3, 4, device=d).index_put_((_t([0, 1], d),), _t([1., 2., 3.], d)),
    lambda d: torch.zeros(3, 4, device=d).index_put_((_t([0, 1], d),), _t([1, 2, 3, 4], d)),  # dtypes
    lambda d: torch.rand([], device=d).index_put([], _t([1.], d), True),
    # nonzero into an out= tensor of another dtype, or on the host
    lambda d: torch.nonzero(_t([1, 0, 1], d), out=torch.empty(0, device=d)),
    # out= tensors eager's kernels refuse and the meta kernels accept (CPU probe)
    lambda d: torch.neg(_t(1., d), out=torch.empty(0, dtype=torch.float64, device=d)),  # same dtype required
    lambda d: torch.floor(_t(1 + 1j, d), out=torch.empty(0, dtype=torch.complex64, device=d)),  # complex floor
    lambda d: torch.add(_t([1.], d), _t([2.], d), out=torch.empty(0, dtype=torch.int64, device=d)),  # unsafe cast
    lambda d: torch.cat([_t([1.], d)], out=torch.empty(0, dtype=torch.int64, device=d)),
    # the meta kernel's error of another class or text than eager's
    lambda d: _t([1], d).add_(_t([1.5], d)),  # in-place int += float
    lambda d: torch.addcdiv(_t([1], d), _t([2], d), _t([3], d)),  # integer division
    # add/sub alpha: the meta kernel raises ValueError (int), or nothing (bool)
    lambda d: torch.add(_t([1], d), _t([1], d), alpha=1.5),
    lambda d: torch.add(_t([True], d), _t([True], d), alpha=1.5),
    lambda d: torch.sub(_t([1.], d), _t([1.], d), alpha=1j),
    # resize_ past int64: bytes, elements, strides (the meta kernel checks none)
    lambda d: torch.empty((), dtype=torch.float64, device=d).resize_([2, 4, 2**29, 2**29]),
    lambda d: torch.empty((), dtype=torch.float64, device=d).resize_([8, 8, 2**29, 2**29]),
    lambda d: torch.empty((), dtype=torch.float64, device=d).resize_([0, 4, 2**61]),
    # complex tensors and more than 64 dimensions (CPU probe); heaviside's dtypes
    lambda d: torch.maximum(_t([1j], d), _t([1.], d)),  # TypeError
    lambda d: torch.heaviside(_t([1j], d), _t([1.], d)),  # NotImplementedError before the dtype check
    lambda d: torch.heaviside(_t([1.], d), _t([1], d)),
    lambda d: torch.ones([1] * 65, device=d).sum(dim=0),
    lambda d: torch.pow(_t([2], d), -1),  # an integer to a negative integer power
    # memory overlap: a written tensor that overlaps itself or another argument (CPU probe, its
    # tensors on one storage sharing one buffer); a random op's self-overlap
    lambda d: torch.ones(1, device=d).expand(3).copy_(_t([1., 2., 3.], d)),
    lambda d: (lambda y: y.index_put_((_t([2, 1, 0], d),), y[:3]))(_t([1., 2., 3., 4., 5., 6.], d)),
    lambda d: torch.zeros(1, device=d).expand(3).bernoulli_(),
    # ops always probed: index_add's slice shapes, cummax over a dimension an empty tensor lacks
    lambda d: torch.zeros((), device=d).index_add(0, _t([0], d), torch.ones(1, 1, 1, device=d)),
    lambda d: torch.zeros(0, device=d).cummax(-46),
    # masked_scatter_: a mask that does not expand; a source shorter than a host-known mask's ones
    lambda d: torch.zeros(2, device=d).masked_scatter_(torch.ones(2, 1, 2, 1, dtype=torch.bool, device=d),
                                                       torch.ones(4, device=d)),
    lambda d: torch.zeros(4, device=d).masked_scatter_(_t([True, True, True, False], d), torch.ones(2, device=d)),
    lambda d: torch.ops.aten._local_scalar_dense(torch.zeros(0, device=d)),
    lambda d: torch.bucketize(_t([1, 3], d), _t([[1, 2], [3, 4]], d)),  # boundaries of 2 dimensions
    lambda d: torch.searchsorted(_t([1, 2], d), _t([1, 3], d), side="bad"),
    lambda d: torch.searchsorted(_t([1., 2.], d), _t([1.], d), sorter=_t([0.], d)),
], ids=["index_fill-complex", "index_fill-int32-index", "index_fill-matrix-index", "index_fill-dim",
        "index_fill-1d-value", "clamp-no-bounds", "clamp_-no-bounds", "index-no-indices", "index-float-index",
        "getitem-broadcast", "setitem-broadcast", "index-size-0-dim", "index-mask-shape", "index_put-value-shape",
        "index_put-value-dtype", "index_put-0dim-no-indices", "nonzero-out-dtype", "neg-out-dtype",
        "floor-out-complex", "add-out-unsafe-cast", "cat-out-unsafe-cast", "add_-int-float", "addcdiv-int",
        "add-int-float-alpha", "add-bool-float-alpha", "sub-float-complex-alpha", "resize_-bytes-overflow",
        "resize_-numel-overflow", "resize_-stride-overflow", "maximum-complex", "heaviside-complex",
        "heaviside-dtypes", "sum-65-dims", "pow-int-negative", "copy_-into-expanded",
        "index_put_-value-aliasing-self", "bernoulli_-expanded",
        "index_add-slice-shapes", "cummax-empty-dim", "masked_scatter_-mask-shape",
        "masked_scatter_-short-source", "local_scalar_dense-empty", "bucketize-2d-boundaries",
        "searchsorted-side", "searchsorted-sorter-dtype"])
def test_error_is_eagers(case):
    assert_raises_as_eager(case)


def test_out_tensor_on_the_host_is_a_device_error():
    x = _t([1, 0, 1], DEV)
    with pytest.raises(RuntimeError, match="^Expected all tensors to be on the same device"):
        torch.nonzero(x, out=torch.empty(0, dtype=torch.long))
    assert x.tolist() == [1, 0, 1]


def test_bool_mask_put_of_a_value_that_does_not_fit_raises_at_the_op():
    # Eager finds how many elements the mask selects (nonzero; CUDA synchronizes there too).
    def put(d, values):
        a = torch.arange(4, device=d)
        a[a > -1] = _t(values, d)
        return a

    for values in ([], [1, 2, 3]):
        eager = _raised(lambda d: put(d, values), "cpu")
        remote = _raised(lambda d: put(d, values), DEV)
        assert type(remote) is type(eager) and str(remote).startswith(str(eager))
    assert put(DEV, [5, 6, 7, 8]).tolist() == [5, 6, 7, 8]
    a = torch.arange(4., device=DEV)
    before = genie.client_stats()["round_trips"]
    a[a > 1] = 0.  # a one-element value fits any mask: no synchronization
    assert genie.client_stats()["round_trips"] == before
    assert a.tolist() == [0., 1., 0., 0.]


def test_the_program_goes_on_after_an_error_at_the_op():
    x = torch.arange(6., device=DEV).view(2, 3)
    with pytest.raises(RuntimeError):
        x.index_fill_(1, _t([0], DEV), 2j)
    assert x.index_fill_(1, _t([0], DEV), -1.).tolist() == [[-1., 1., 2.], [-1., 4., 5.]]


@pytest.mark.parametrize("op", [torch.max, torch.min, torch.median, torch.nanmedian, torch.mode])
def test_a_reduction_over_an_empty_dimension_raises_at_the_op(op):
    assert_raises_as_eager(lambda d: op(torch.randn(2, 0, 4).to(d), dim=1))


def test_an_in_place_result_that_cannot_be_cast_raises_at_the_op():
    """Meta kernels skip TensorIterator's check that the result type casts to the written tensor."""
    def times(d):
        y = torch.tensor(3, dtype=torch.int32, device=d)
        y *= torch.tensor(1.5, device=d)

    assert_raises_as_eager(times)
    assert_raises_as_eager(lambda d: torch.arange(3, device=d).add_(1.5))
    assert_raises_as_eager(lambda d: torch.ones(2, device=d).mul_(1j))
    x = torch.tensor(1.5, device=DEV)
    x *= torch.tensor(3, dtype=torch.int32, device=DEV)  # float *= int: eager's 4.5
    assert x.item() == 4.5


# ---- errors that depend on values the host knows: raised at the op ------------------------------

def test_an_index_out_of_range_whose_values_the_host_knows_raises_at_the_op():
    """Uploaded indices, and indices made by factories and exact integer writes (torch.ones
    records empty then fill_, torch.arange empty then arange.out; `ind[-1] = 10` a select and a
    fill_), are checked with their values at x[ind], x[ind] = v (index_fill_) and index_put_."""
    def with_written_index(d, fill_at, bad):
        ind = torch.ones(20, dtype=torch.int64, device=d)
        ind[fill_at] = bad
        return ind

    cases = [
        lambda d: torch.zeros(5, device=d)[with_written_index(d, -1, 10)],
        lambda d: torch.zeros(5, device=d).__setitem__(with_written_index(d, 0, 11), 0),
        lambda d: torch.zeros(5, device=d).index_put_((with_written_index(d, 3, -6),), _t(1., d)),
        lambda d: torch.zeros(3, 5, device=d)[:, _t([[0, 7], [1, -9]], d)],
        lambda d: torch.zeros(3, 5, 4, device=d)[_t([2, 1], d), _t([0, 5], d)],
        lambda d: torch.zeros(3, 4, device=d).index_fill_(-1, _t([1, -7], d), 0),
    ]

    def arange_written(d):
        ind = torch.arange(3, device=d)
        ind[2] = -6
        ind.add_(1)  # -5: still out of range for 4
        return torch.zeros(2, 4, device=d)[:, ind]

    for fn in cases + [arange_written]:
        assert_raises_as_eager(fn)
    # in range after the writes: no error, eager's values
    ind = with_written_index(DEV, 2, 4)
    assert torch.arange(5., device=DEV)[ind].cpu().tolist() == torch.arange(5.)[with_written_index("cpu", 2, 4)].tolist()


def test_an_index_only_the_node_knows_is_checked_there():
    """Indices computed from floating-point values (or read from the node) are not known on the
    host: the op is recorded, and the node raises eager's IndexError at the next read."""
    x = torch.zeros(5, device=DEV)
    index = (torch.tensor([2.5, 7.5]).to(DEV)).long()  # 7: only the node computes it
    bad = x[index]  # recorded
    with pytest.raises(IndexError, match="index 7 is out of bounds for dimension 0 with size 5"):
        bad.cpu()
    written = torch.ones(4, dtype=torch.int64, device=DEV)
    written[0] = torch.tensor(7.5).to(DEV).long()  # a write of a value the host does not know
    bad = torch.zeros(5, device=DEV)[written]  # (x is lost with the run that failed)
    with pytest.raises(IndexError, match="index 7 is out of bounds"):
        bad.cpu()


def test_the_replay_of_writes_answers_checks_not_reads():
    """A read of a written storage still goes to the node (host evaluation keeps no copy of a
    written storage); the check's replay leaves no host copy behind."""
    ind = torch.zeros(3, dtype=torch.int64, device=DEV)
    ind[1] = 2
    torch.arange(4., device=DEV)[ind]  # checked with the replayed values
    genie.synchronize()
    before = genie.client_stats()["round_trips"]
    assert ind.tolist() == [0, 2, 0]
    assert genie.client_stats()["round_trips"] == before + 1


# ---- values computed as eager computes them ------------------------------------------------------

def test_uint8_masks_index_as_bool_masks_with_eagers_warning():
    def run(d):
        v = torch.arange(105.).view(5, 7, 3).to(d)
        mask1, mask2 = torch.ByteTensor([1, 0, 1, 1, 0]).to(d), torch.ByteTensor([1, 1, 1]).to(d)
        x = torch.arange(16.).view(4, 4).to(d)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = v[mask1, :, mask2]
            x[torch.ByteTensor([1, 0, 1, 0]).to(d)] = _t([3., 4., 5., 6.], d)
        deprecated = [str(m.message) for m in w if "uint8" in str(m.message)]
        return got.cpu(), x.cpu(), deprecated

    eager, remote = run("cpu"), run(DEV)
    assert torch.equal(remote[0], eager[0]) and torch.equal(remote[1], eager[1])
    assert len(remote[2]) == len(eager[2]) == 3
    assert eager[2][0].startswith(remote[2][0])  # eager's adds "(Triggered internally at ...)"


def test_uint64_scalars_above_int64_max():
    x = torch.zeros(2, dtype=torch.uint64, device=DEV)
    x[0] = 1 << 63
    x[1] = (1 << 64) - 1
    assert [x[0].item(), x[1].item()] == [1 << 63, (1 << 64) - 1]
    assert (x == (1 << 63)).tolist() == [True, False]  # a wrapped uint64 number
    y = torch.zeros(2, device=DEV)
    y.fill_(1 << 63)
    assert y.tolist() == torch.zeros(2).fill_(1 << 63).tolist()


@pytest.mark.parametrize("call", [
    lambda d: _t([True, False], d) - _t([True, True], d),   # two bool tensors
    lambda d: 1 - _t([True, False], d),                     # rsub.Scalar: a bool tensor
    lambda d: _t([True, False], d) - 1,
    lambda d: _t([True, False], d).sub_(True),
    lambda d: torch.rsub(_t([True], d), _t([1.5], d)),
])
def test_subtraction_with_bool_tensors_raises_at_the_op(call):
    assert_raises_as_eager(call)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint64])
def test_clamp_bounds_past_the_dtypes_range(dtype):
    """An upper bound above every value leaves the tensor as it is (an int bound above 2**63-1
    has no wire scalar); a lower bound above every value is eager's error."""
    info = torch.iinfo(dtype)
    big = info.max + 1 if dtype != torch.uint64 else info.max
    for device in ("cpu", DEV):
        x = torch.tensor([info.min, 0, info.max], dtype=dtype).to(device)
        for out in (torch.clamp(x, max=big), torch.clamp_max(x, big), x.clone().clamp_(max=big)):
            assert out.cpu().tolist() == [info.min, 0, info.max], (device, out)
    if dtype != torch.uint64:
        assert_raises_as_eager(lambda d: torch.clamp(_t([1, 2], d, dtype=dtype), min=big))


def test_uint64_scalar_where_no_overload_takes_a_tensor_raises_naming_the_op():
    with pytest.raises(NotImplementedError, match=r"aten::threshold.*2\*\*63-1"):
        torch.nn.functional.threshold(torch.ones(2, device=DEV), 1 << 63, 0.)


def test_deterministic_algorithms_pick_eagers_kernels():
    torch.manual_seed(0)
    x, index, src = torch.zeros(200, 3), torch.randint(200, (4000,)), torch.rand(4000, 3)
    values, positions, base = torch.rand(3000), torch.randint(17, (3000,)), torch.rand(17)
    with_deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        eager = (torch.index_copy(x, 0, index, src), base.index_put((positions,), values))
        remote = (torch.index_copy(x.to(DEV), 0, index.to(DEV), src.to(DEV)),
                  base.to(DEV).index_put((positions.to(DEV),), values.to(DEV)))
    finally:
        torch.use_deterministic_algorithms(with_deterministic)
    # duplicate indices: the last write wins, as in eager's deterministic kernels
    assert torch.equal(remote[0].cpu(), eager[0]) and torch.equal(remote[1].cpu(), eager[1])


def test_accumulating_index_put_sums_in_a_fixed_order():
    # As CUDA's kernel does always: bitwise eager's deterministic sum, whatever the node's threads.
    torch.manual_seed(0)
    a, b, c = torch.randn(64, 32), torch.randint(0, 4, (100_000,)), torch.randn(100_000, 32)
    torch.use_deterministic_algorithms(True)
    try:
        eager = a.clone().index_put_([b], c, accumulate=True)
    finally:
        torch.use_deterministic_algorithms(False)
    remote = a.to(DEV).index_put_([b.to(DEV)], c.to(DEV), accumulate=True)
    assert torch.equal(remote.cpu(), eager)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fnuz, torch.float8_e5m2fnuz])
def test_float8_fnuz_dtypes_travel(dtype):
    x = torch.randn(4, 3).to(dtype)
    index = torch.tensor([2, 0])
    remote = torch.index_select(x.to(DEV), 0, index.to(DEV)).cpu()
    assert remote.dtype == dtype
    assert torch.equal(remote.view(torch.uint8), torch.index_select(x, 0, index).view(torch.uint8))


def test_out_calls_whose_cpu_errors_depend_on_values_run_on_the_node():
    """The CPU probe raises only what eager raises whatever the values: an integer division
    (zero divisors raise on the CPU) and an index_select (index 1 is out of range for a
    dimension of size 1) with valid values give eager's results."""
    def run(d):
        q = torch.empty(0, dtype=torch.int64, device=d)
        torch.div(_t([7, 9], d), _t([2, 4], d), rounding_mode="floor", out=q)
        picked = torch.empty(0, dtype=torch.float64, device=d)
        torch.index_select(_t([[1.], [2.]], d, dtype=torch.float64), 1, _t([0], d), out=picked)
        return q.cpu(), picked.cpu()

    for got, want in zip(run(DEV), run("cpu")):
        assert torch.equal(got, want)


def test_version_counters_follow_eager():
    """`.data` has a version counter of its own (gradcheck perturbs inputs through it), views
    and `detach()` share their base's; in-place ops bump them as on the CPU."""
    def versions(d):
        x = torch.randn(3, 4, device=d, dtype=torch.double, requires_grad=True)
        data = x.data
        entry = data[0, 1]
        entry.add_(1)
        entry.copy_(entry + 1)
        detached = x.detach()
        view = detached[1]
        view.mul_(2)
        return x._version, data._version, entry._version, detached._version, view._version

    assert versions(DEV) == versions("cpu") == (1, 2, 2, 1, 1)


@pytest.mark.parametrize("op", [torch.std, torch.var, torch.std_mean, torch.var_mean])
def test_no_degrees_of_freedom_warns_at_the_op(op):
    def warned(d):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            op(torch.ones(10, 20, device=d), dim=-1, correction=20)
        return [str(w.message).split(" (Triggered")[0] for w in caught if "degrees of freedom" in str(w.message)]

    assert warned(DEV) and warned(DEV)[0] == warned("cpu")[0]


def test_the_default_dtype_applies_on_the_node():
    """Integer true division and Python floats promote to the default dtype, computed on the node
    in it (float64 precision, not float32 cast up)."""
    def run(d):
        x = torch.arange(1, 4, device=d)
        return (torch.div(x, 3) * 1e-10 + 1 - 1).cpu(), (x * 0.1).cpu()

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        got, want = run(DEV), run("cpu")
    finally:
        torch.set_default_dtype(previous)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == torch.float64
        assert torch.equal(g, w)


def test_copy_copy_is_shallow_as_eagers():
    """copy.copy(tensor) shares the storage (writes show in both) and keeps requires_grad."""
    import copy

    def run(d):
        x = torch.tensor([1., 2., 3., 4.], device=d, requires_grad=True)
        y = copy.copy(x)
        with torch.no_grad():
            y.fill_(1)
        return x.detach().cpu(), y.requires_grad, y.is_leaf, y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()

    got, want = run(DEV), run("cpu")
    assert torch.equal(got[0], want[0]) and got[1:] == want[1:] == (True, True, True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
def test_deterministic_mode_fills_uninitialized_memory(dtype):
    """Under torch.use_deterministic_algorithms(True), empty tensors hold NaN or the dtype's
    largest value, as eager's (genie::deterministic_empty... on the node)."""
    made = [
        lambda d: torch.empty(10, 9, device=d, dtype=dtype),
        lambda d: torch.empty(10, 9, out=torch.zeros(1, device=d, dtype=dtype)),
        lambda d: torch.empty_like(torch.zeros(10, 9, device=d, dtype=dtype)),
        lambda d: torch.empty_strided((10, 9), (1, 5), device=d, dtype=dtype),
        lambda d: torch.empty_permuted((2, 3, 5), (1, 0, 2), device=d, dtype=dtype),
    ]
    with_deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        for make in made:
            got, want = make(DEV).cpu(), make("cpu")
            assert torch.equal(got, want) or (dtype.is_floating_point and got.isnan().all() and want.isnan().all())
    finally:
        torch.use_deterministic_algorithms(with_deterministic)


def test_nondeterminism_alerts_are_the_nodes_kernels():
    # put_ without accumulate alerts on every call, as eager's kernel; median with indices and
    # histc alert only on CUDA, and this node runs the CPU's kernels
    x = torch.ones(4, device=DEV)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with DeterministicGuard(True):
            for _ in range(2):  # the second call hits the plan cache
                with pytest.raises(RuntimeError, match="put_ does not have a deterministic implementation"):
                    x.put_(_t([0, 0], DEV), _t([1., 2.], DEV))
            values, indices = torch.median(_t([3., 1., 2.], DEV), 0)
            assert (values.item(), indices.item()) == (2.0, 2)
            assert torch.histc(_t([1., 2., 1.], DEV), bins=2, min=0, max=3).cpu().tolist() == [2.0, 1.0]


def test_host_tensor_indexed_with_device_indices_raises_eagers_rule():
    with pytest.raises(RuntimeError, match=r"indices should be either on cpu or on the same device as the indexed "
                                           r"tensor \(cpu\)"):
        torch.zeros(3, 4)[_t([0, 2], DEV)]


def test_non_contiguous_searchsorted_and_bucketize_warn_as_eager():
    """Eager copies a non-contiguous input, boundary or sorter tensor and says so (once per
    program; always under _set_warnAlways)."""
    def warned(d):
        boundaries = torch.tensor([[1., 4.], [2., 5.], [3., 6.]], device=d).t()[0]  # [1, 2, 3], stride 2
        values = torch.tensor([[1, 3], [2, 0]], device=d).t()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.searchsorted(boundaries, values)
            torch.searchsorted(torch.tensor([3., 1., 2.], device=d), torch.tensor([2.], device=d),
                               sorter=torch.tensor([1, 9, 2, 9, 0, 9], device=d)[::2])
            torch.bucketize(values, boundaries)
        return [str(w.message).split(" (Triggered")[0] for w in caught if "non-contiguous" in str(w.message)]

    torch._C._set_warnAlways(True)
    try:
        assert len(warned("cpu")) == 5 and warned(DEV) == warned("cpu")
    finally:
        torch._C._set_warnAlways(False)


@pytest.mark.parametrize("call", [
    lambda d: torch.add(torch.ones(3, device=d), 1, out=torch.empty(2, device=d)),  # out= resized
    lambda d: torch.rand(1, device=d).expand(6).index_fill_(0, _t([2, 1, 0], d), 1.0),  # expanded
], ids=["out-resized", "index_fill_-expanded"])
def test_a_probed_call_warns_once_as_eager(call):
    """A call the CPU probe runs after its meta kernel warns with eager's kernel's words, once (a
    Python meta kernel words the out= resize warning otherwise; none warns for index_fill_)."""
    def warnings_of(d):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call(d)
        return [str(w.message).split(" (Triggered")[0] for w in caught]

    assert len(warnings_of("cpu")) == 1 and warnings_of(DEV) == warnings_of("cpu")


def test_complex_half_tensors_warn_as_eager():
    torch._C._set_warnAlways(True)
    try:
        with pytest.warns(UserWarning, match="ComplexHalf support is experimental"):
            torch.zeros(2, dtype=torch.chalf, device=DEV)
    finally:
        torch._C._set_warnAlways(False)


@pytest.mark.parametrize("dtype", [torch.bits8, torch.bits16, torch.float4_e2m1fn_x2])
def test_raw_bit_dtypes_travel(dtype):
    raw = torch.ones(64, dtype=torch.uint8, device=DEV)
    raw.view(dtype).zero_()
    assert raw.count_nonzero().item() == 0


def test_a_dtype_the_nodes_cpu_kernels_lack_raises_at_the_op():
    # once connected, the client knows the node runs the CPU's kernels: the probe's "not
    # implemented for" is then eager's error on the node's device
    assert torch.ones(1, device=DEV).cpu().item() == 1.0
    assert_raises_as_eager(lambda d: torch.ones(3, 2, dtype=torch.complex64, device=d).cummax(0))
    assert_raises_as_eager(lambda d: torch.ones(3, dtype=torch.complex64, device=d).erf())


def test_out_tensor_resized_from_empty_is_laid_out_as_eagers():
    # eager's TensorIterator lays a resized out= tensor out as its inputs are; the client's
    # geometry is the node's, so a strided view of it reads what eager reads
    def run(d):
        x = torch.arange(24.).reshape(2, 3, 4).to(d).permute(2, 0, 1)
        r = torch.add(x, x, out=torch.empty(0, device=d))
        e = torch.exp(x, out=torch.empty(0, device=d))
        return r.stride(), e.stride(), torch.as_strided(r, (3,), (1,)).cpu()
    cpu, dev = run("cpu"), run(DEV)
    assert dev[:2] == cpu[:2] and torch.equal(dev[2], cpu[2])
