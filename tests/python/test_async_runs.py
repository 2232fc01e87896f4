"""Asynchronous runs: the pending graph goes to the node every `async_chunk` recorded ops without
a round trip, and the program only waits when it reads a value (genie.runtime, run_graph_async).

The embedded node is a CPU node on this host, where asynchronous runs are off by default
(`async_chunk_for`): each test turns them on for its runtime with a small chunk.
"""

import pytest
import torch

import genie
from genie import GenieRemoteError
from genie.runtime import ASYNC_CHUNK, async_chunk_for, runtime_for

DEV = "remote_accelerator:0"


@pytest.fixture
def runtime():
    rt = runtime_for(torch.device(DEV))
    rt.connection()
    saved = rt.async_chunk
    rt.async_chunk = 16
    yield rt
    rt.async_chunk = saved


def _chain(x, w, steps):
    for _ in range(steps):
        x = torch.tanh(x @ w) + 0.5 * x
    return x


def test_async_runs_match_cpu_and_need_one_round_trip(runtime):
    torch.manual_seed(0)
    x, w = torch.randn(8, 32), torch.randn(32, 32) / 6
    expected = _chain(x, w, 40)
    xd, wd = x.to(DEV), w.to(DEV)
    for _ in range(2):  # warm-up: registers each chunk's graph once (the first run has xd, wd inline)
        assert torch.equal(_chain(xd, wd, 40).cpu(), expected)
    before = runtime.counters()
    out = _chain(xd, wd, 40).cpu()
    after = runtime.counters()
    assert torch.equal(out, expected)
    assert after["async_runs"] - before["async_runs"] >= 160 // 16 - 1  # 160 ops, 16 per run
    assert after["round_trips"] - before["round_trips"] == 1  # only the read waited
    assert not runtime.in_flight  # the read waited for every run before it


def test_long_loop_stays_bounded(runtime):
    x = torch.ones(4, device=DEV)
    for i in range(3000):
        x = x * 1.0001
        assert len(runtime.pending) <= runtime.async_chunk + 64
        assert len(runtime.in_flight) <= runtime.max_in_flight
    assert x.cpu()[0].item() == pytest.approx(1.0001 ** 3000, rel=1e-4)


def test_async_failure_is_raised_at_the_next_read(runtime):
    x = torch.arange(4.0).to(DEV)
    x.cpu()  # resident before the failing window
    index = torch.tensor([7.0]).to(DEV).long()  # out of range, made on the node from a float: only it knows
    bad = x[index] * 2
    y = x + 1
    for _ in range(40):  # the failing op travels in an asynchronous run, more runs follow it
        y = y + 1
    assert genie.lazy.value_of(bad).node is None and runtime.in_flight  # sent, not waited for
    with pytest.raises(GenieRemoteError) as info:
        y.cpu()
    assert info.value.code == "TorchError" and "index" in info.value.op_name
    for lost in (bad, y):  # values kept by the failed run and the runs after it keep its error
        with pytest.raises(GenieRemoteError, match="index"):
            lost.cpu()
    assert (x * 2).cpu().tolist() == [0.0, 2.0, 4.0, 6.0]  # what was resident before is intact
    assert (torch.ones(3).to(DEV) + 1).cpu().tolist() == [2.0, 2.0, 2.0]  # and the program goes on


def test_synchronize_waits_for_async_runs_and_reports_their_failure(runtime):
    x = torch.arange(4.0).to(DEV)
    index = torch.tensor([9.0]).to(DEV).long()  # out of range, known to the node only
    bad = x[index]
    for _ in range(40):
        bad = bad + 1
    assert runtime.in_flight
    with pytest.raises(GenieRemoteError, match="index"):
        genie.synchronize()
    assert not runtime.in_flight
    genie.synchronize()  # reported once


def test_async_runs_are_off_for_a_cpu_node_on_this_host(monkeypatch):
    monkeypatch.delenv("GENIE_ASYNC_CHUNK", raising=False)
    assert async_chunk_for("cpu", "127.0.0.1:7070") == 0
    assert async_chunk_for("cpu", "[::1]:7070") == 0
    assert async_chunk_for("cpu", "localhost:7070") == 0
    assert async_chunk_for("cuda:0", "127.0.0.1:7070") == ASYNC_CHUNK
    assert async_chunk_for("cpu", "10.0.0.2:7070") == ASYNC_CHUNK
    monkeypatch.setenv("GENIE_ASYNC_CHUNK", "64")
    assert async_chunk_for("cpu", "127.0.0.1:7070") == 64


def test_an_op_the_node_lacks_is_reported_at_the_next_read(runtime):
    # An operator the program has (with a Meta kernel, so capture infers its shape) and
    # genie-node does not: its cut's registration fails while recording goes on; the error
    # is raised at the next read, and the ops that do not depend on it are not lost.
    lib = torch.library.Library("genie_async_test", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: torch.empty_like(x), "Meta")
    x = torch.arange(4.0).to(DEV)
    x.cpu()
    y = x + 1
    bad = torch.ops.genie_async_test.twice(x)
    for _ in range(40):  # the cut holding `twice` is sent while recording goes on
        y = y + 1
    assert runtime._deferred is not None  # the failed registration waits for the next read
    with pytest.raises(GenieRemoteError) as info:
        y.cpu()
    assert info.value.code == "UnknownOp" and "twice" in info.value.op_name
    with pytest.raises(GenieRemoteError, match="twice"):
        bad.cpu()
    assert y.cpu().tolist() == [41.0, 42.0, 43.0, 44.0]  # went back to the pending graph
