"""PyTorch's device-generic accelerator API (`torch.accelerator`) and torch.cuda's memory and
device functions on `torch.remote_accelerator`, against a real embedded genie-node: one case
per function, each checking the node's figures (issue 23, "Eager parity")."""

import collections

import pytest
import torch

import genie
from genie.runtime import runtime_for

DEV = "remote_accelerator:0"
RA = torch.remote_accelerator if hasattr(torch, "remote_accelerator") else None


@pytest.fixture(autouse=True)
def settled():
    """Every earlier test's values freed on the node, so that the figures here are this test's."""
    import gc
    gc.collect()
    torch.randn(1).to(DEV)  # connects
    torch.accelerator.synchronize()
    yield


def _upload(nbytes: int) -> torch.Tensor:
    """A tensor of `nbytes` put on the node now (over 64 KiB: not inline with the next run)."""
    assert nbytes > runtime_for(torch.device(DEV)).inline_max_bytes
    x = torch.randn(nbytes // 4).to(DEV)
    assert runtime_for(torch.device(DEV)).recording.pending_count == 0
    return x


def _node_stats():
    """The node's Stats without the flush genie.memory_stats does first."""
    return runtime_for(torch.device(DEV)).stats()


# ---- torch.accelerator: the device ----------------------------------------------------------


def test_current_accelerator_is_remote_accelerator():
    assert torch.accelerator.current_accelerator() == torch.device("remote_accelerator")
    assert torch.accelerator.current_accelerator(check_available=True).type == "remote_accelerator"


def test_is_available():
    assert torch.accelerator.is_available() is True
    assert RA.is_available() is True


def test_device_count_is_the_nodes():
    assert torch.accelerator.device_count() == genie.device_count() == RA.device_count() >= 1


def test_current_and_set_device_index():
    assert torch.accelerator.current_device_index() == RA.current_device() == 0
    torch.accelerator.set_device_index(0)
    assert torch.accelerator.current_device_index() == 0
    with pytest.raises(RuntimeError, match="does not exist"):
        torch.accelerator.set_device_index(genie.device_count())
    with torch.accelerator.device_index(0):
        assert RA.current_device() == 0


def test_accelerator_synchronize_runs_pending_work():
    runtime = runtime_for(torch.device(DEV))
    x = torch.randn(64, 64).to(DEV)
    ops_before = _node_stats()["ops_executed"]
    y = (x @ x).relu_()
    assert runtime.recording.pending_count > 0
    torch.accelerator.synchronize()
    assert runtime.recording.pending_count == 0
    assert _node_stats()["ops_executed"] > ops_before
    # the value ran on the node: it is resident, and reading it needs no run
    assert runtime.value_of(y).node is None
    z = y + 1
    torch.accelerator.synchronize(0)
    assert runtime.recording.pending_count == 0
    torch.testing.assert_close(z.cpu(), (x.cpu() @ x.cpu()).relu() + 1)


def test_remote_accelerator_synchronize_sends_frees():
    x = _upload(1 << 18)
    base = RA.memory_allocated()
    del x
    assert RA.memory_allocated() == base  # freed with the next request
    RA.synchronize()
    assert RA.memory_allocated() == base - (1 << 18)


# ---- memory: torch.remote_accelerator and torch.accelerator ----------------------------------


def test_memory_allocated_counts_uploads_and_frees():
    base = RA.memory_allocated()
    assert base == _node_stats()["session_resident"]  # the node's figure
    x = _upload(1 << 20)
    assert RA.memory_allocated() == base + (1 << 20)  # from the put's Ack: no round trip
    assert torch.accelerator.memory_allocated() == RA.memory_allocated(DEV) == RA.memory_allocated(0)
    assert _node_stats()["session_resident"] == base + (1 << 20)
    del x
    torch.accelerator.synchronize()
    assert RA.memory_allocated() == base
    assert torch.accelerator.memory_allocated(0) == base


def test_memory_allocated_counts_kept_results_without_a_round_trip():
    x = _upload(1 << 18)
    base = RA.memory_allocated()
    y = x * 2  # a kept output of the next run
    torch.accelerator.synchronize()
    trips = genie.client_stats()["round_trips"]
    assert RA.memory_allocated() == base + (1 << 18)
    assert genie.client_stats()["round_trips"] == trips
    del x, y


def test_memory_allocated_counts_uploads_pending_locally():
    runtime = runtime_for(torch.device(DEV))
    base = RA.memory_allocated()
    trips = genie.client_stats()["round_trips"]
    x = torch.randn(1024).to(DEV)  # 4 KiB: inline with the next run, pending now
    assert runtime.recording.pending_count == 1
    assert RA.memory_allocated() == base + 4096
    assert genie.client_stats()["round_trips"] == trips
    torch.accelerator.synchronize()  # now resident: the node's figure
    assert runtime.recording.pending_count == 0 and RA.memory_allocated() == base + 4096
    assert _node_stats()["session_resident"] == base + 4096
    del x
    torch.accelerator.synchronize()
    assert RA.memory_allocated() == base


def test_max_memory_allocated_keeps_the_peak_until_reset():
    RA.reset_peak_memory_stats()
    base = RA.memory_allocated()
    assert RA.max_memory_allocated() == base
    x = _upload(1 << 20)
    del x
    torch.accelerator.synchronize()
    assert RA.memory_allocated() == base
    assert RA.max_memory_allocated() == base + (1 << 20)
    assert torch.accelerator.max_memory_allocated() == base + (1 << 20)


def test_reset_peak_memory_stats():
    x = _upload(1 << 18)
    del x
    torch.accelerator.synchronize()
    assert RA.max_memory_allocated() > RA.memory_allocated()
    RA.reset_peak_memory_stats(0)
    assert RA.max_memory_allocated() == RA.memory_allocated()
    y = _upload(1 << 18)
    del y
    torch.accelerator.synchronize()
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.accelerator.memory_allocated()


def test_reset_accumulated_memory_stats():
    RA.reset_accumulated_memory_stats()
    assert RA.memory_stats()["allocated_bytes.all.allocated"] == 0
    x = _upload(1 << 18)
    del x
    torch.accelerator.synchronize()
    stats = RA.memory_stats()
    assert stats["allocated_bytes.all.allocated"] == 1 << 18 and stats["allocated_bytes.all.freed"] == 1 << 18
    torch.accelerator.reset_accumulated_memory_stats()
    assert torch.accelerator.memory_stats()["allocated_bytes.all.freed"] == 0


def test_memory_stats_is_torch_cuda_shaped():
    x = _upload(1 << 18)
    stats = RA.memory_stats()
    assert isinstance(stats, collections.OrderedDict) and list(stats) == sorted(stats)
    assert stats["allocated_bytes.all.current"] == RA.memory_allocated()
    assert stats["allocated_bytes.all.peak"] == RA.max_memory_allocated()
    assert stats["reserved_bytes.all.current"] == stats["allocated_bytes.all.current"] > 0
    assert stats["allocated_bytes.small_pool.current"] == 0
    generic = torch.accelerator.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
                "active_bytes.all.current"):
        assert generic[key] == stats[key], key
    del x


def test_memory_reserved_is_allocated():
    x = _upload(1 << 18)
    assert RA.memory_reserved() == RA.memory_allocated() == torch.accelerator.memory_reserved() > 0
    assert RA.max_memory_reserved() == RA.max_memory_allocated() == torch.accelerator.max_memory_reserved()
    del x


def test_empty_cache_frees_what_the_program_dropped():
    x = _upload(1 << 18)
    base = RA.memory_allocated()
    del x
    assert RA.memory_allocated() == base
    RA.empty_cache()
    assert RA.memory_allocated() == base - (1 << 18)
    y = _upload(1 << 18)
    del y
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_allocated() == base - (1 << 18)


def test_empty_cache_keeps_what_pending_ops_read():
    runtime = runtime_for(torch.device(DEV))
    x = _upload(1 << 18)
    expected = x.cpu() + 1
    base = RA.memory_allocated()
    y = x + 1  # pending: reads x
    del x
    RA.empty_cache()
    assert runtime.recording.pending_count > 0 and RA.memory_allocated() == base  # x kept: y reads it
    torch.testing.assert_close(y.cpu(), expected)


def test_mem_get_info_is_the_nodes_device():
    free, total = RA.mem_get_info()
    assert 0 < free <= total
    stats = _node_stats()
    if stats["memory_limit"]:
        assert total == stats["memory_limit"]
    else:  # a CPU node without a limit: the host's memory
        with open("/proc/meminfo") as f:
            mem_total = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) * 1024
        assert total == mem_total
    g_free, g_total = torch.accelerator.get_memory_info()
    assert g_total == total and 0 < g_free <= g_total
    assert RA.mem_get_info(0)[1] == total


def test_get_device_name_is_the_nodes_device():
    assert RA.get_device_name() == genie.get_device(0).device == RA.get_device_name(DEV)


def test_get_device_properties():
    props = RA.get_device_properties(0)
    node = genie.get_device(0)
    assert props.name == node.device and props.device == node.device
    assert props.type == "remote_accelerator" and props.node_name == node.node_name
    assert props.total_memory > 0 and props.memory_limit == node.memory_limit
    assert props.total_memory == (node.memory_limit or RA.mem_get_info()[1])
    assert RA.get_device_properties(DEV) == props


# ---- seeds, RNG state and autocast, as on CUDA ------------------------------------------------


def test_manual_seed_reaches_the_node():
    torch.manual_seed(1234)
    a = torch.randn(8, device=DEV).cpu()
    RA.manual_seed(1234)
    b = torch.randn(8, device=DEV).cpu()
    RA.manual_seed_all(4321)
    c = torch.randn(8, device=DEV).cpu()
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_rng_state_round_trips():
    state = RA.get_rng_state()
    a = torch.rand(8, device=DEV).cpu()
    RA.set_rng_state(state)
    b = torch.rand(8, device=DEV).cpu()
    assert torch.equal(a, b)


def test_autocast_casts_matmuls():
    x = torch.randn(4, 8).to(DEV)
    w = torch.randn(8, 2).to(DEV)
    with torch.autocast("remote_accelerator", dtype=torch.bfloat16):
        y = x @ w
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.cpu(), (x.cpu().bfloat16() @ w.cpu().bfloat16()))
