"""The device runtime in C++ (python/csrc/device_runtime.h): a read of a graph already registered
is one call, with no call from C++ into Python and at most one GIL acquisition, counted here.

Counted per read: the `genie._C` functions and methods Python calls (sys.setprofile's c_call
events), the calls the C++ runtime makes into its Python policy and the recorder's calls into
Python (`genie._C.runtime_counters`, `genie.client_stats`), and the GIL acquisitions of the
runtime and the recorder's kernel."""

from __future__ import annotations

import sys

import pytest
import torch

import genie
from genie import _C

DEV = "remote_accelerator:0"


class _BindingCalls:
    """Counts the calls Python makes into genie._C while active."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _profile(self, frame, event, arg) -> None:
        if event != "c_call":
            return
        owner = getattr(arg, "__self__", None)
        module = getattr(arg, "__module__", None) or type(owner).__module__
        if module == "genie._C" or type(owner).__module__ == "genie._C":
            self.calls.append(getattr(arg, "__qualname__", repr(arg)))

    def __enter__(self):
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)


def _crossings(read):
    """(genie._C calls from Python, policy calls, recorder calls into Python, GIL acquisitions,
    requests) of one call of `read`, and its result."""
    before, stats = _C.runtime_counters(), genie.client_stats()
    with _BindingCalls() as calls:
        out = read()
    after, stats_after = _C.runtime_counters(), genie.client_stats()
    return (calls.calls, after["policy_calls"] - before["policy_calls"],
            stats_after["ops_handled_python"] - stats["ops_handled_python"],
            after["gil_acquisitions"] - before["gil_acquisitions"], after["requests"] - before["requests"]), out


@pytest.mark.parametrize("read", ["item", "cpu", "tolist"])
def test_a_read_of_a_registered_graph_is_one_request_without_python(read):
    torch.manual_seed(0)
    w = torch.randn(16, 16)
    x = torch.randn(4, 16)
    wd = w.to(DEV)
    xd = x.to(DEV)
    expected = (x @ w).relu().sum(0)
    reads = {"item": lambda t: t[1].item(), "cpu": lambda t: t.cpu(), "tolist": lambda t: t.tolist()}
    for _ in range(2):  # the structure's first cut registers its graph (and is analysed)
        reads[read]((xd @ wd).relu().sum(0))
    y = (xd @ wd).relu().sum(0)
    if read == "item":
        y = y[1]  # recorded before the read: the read is `.item()` alone
    (calls, policy, python_ops, gil, requests), out = _crossings(
        {"item": y.item, "cpu": y.cpu, "tolist": y.tolist}[read])
    # The read itself goes torch -> the recorder's kernel -> the C++ runtime: no genie._C call
    # from Python, nothing back into Python, one request.
    assert calls == []
    assert (policy, python_ops, requests) == (0, 0, 1)
    assert gil <= 1
    want = {"item": expected[1].item(), "cpu": expected, "tolist": expected.tolist()}[read]
    if read == "cpu":
        assert torch.allclose(out, want, atol=1e-5)
    else:
        assert out == pytest.approx(want, abs=1e-5)


def test_materialize_is_one_binding_call():
    from genie.runtime import runtime_for
    runtime = runtime_for(torch.device(DEV))
    xd = torch.arange(6.0).to(DEV)
    for _ in range(2):
        (xd * 2).sum().item()
    value = genie.lazy.value_of((xd * 2).sum())
    (calls, policy, python_ops, gil, requests), (tensors, described) = _crossings(
        lambda: runtime.native.materialize([value], []))
    assert len(calls) == 1 and calls[0].endswith(".materialize"), calls
    assert (policy, python_ops, requests) == (0, 0, 1)
    assert gil <= 1
    assert tensors[0].item() == 30.0 and described == []


def test_asynchronous_runs_are_sent_from_cpp_and_their_failures_reported_at_the_read(monkeypatch):
    from genie.runtime import runtime_for
    runtime = runtime_for(torch.device(DEV))
    monkeypatch.setattr(runtime.recording, "async_chunk", 8)
    x = torch.ones(4).to(DEV)
    for _ in range(3):  # registers the chunk's structure
        for _ in range(20):
            x = x + 1
        x.sum().item()
    sent = genie.client_stats()["async_runs"]
    before = _C.runtime_counters()
    y = torch.ones(4).to(DEV)
    for _ in range(20):
        y = y + 1
    assert y.sum().item() == 84.0
    after = _C.runtime_counters()
    assert after["policy_calls"] == before["policy_calls"]  # sent by the recorder's kernel, in C++
    assert genie.client_stats()["async_runs"] >= sent + 2


def test_module_to_puts_each_weight_once_without_python():
    """`module.to(device)` moves each parameter through the recorder's kernel into the C++
    runtime's upload path: no call into Python, one PutTensors per distinct weight (a tied weight
    once), and the device copies read back as the host's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(32, 8), torch.nn.Linear(8, 32, bias=False))
    model[1].weight = model[0].weight  # tied, as GPT-2's lm_head and wte
    expected = [p.detach().clone() for p in model.parameters()]
    genie.synchronize()
    before, stats = _C.runtime_counters(), genie.client_stats()
    model.to(DEV)
    after, stats_after = _C.runtime_counters(), genie.client_stats()
    assert stats_after["ops_handled_python"] == stats["ops_handled_python"]
    assert after["policy_calls"] == before["policy_calls"]
    assert after["requests"] - before["requests"] == 1  # the tied weight once
    assert model[1].weight is model[0].weight
    assert [torch.equal(p.cpu(), e) for p, e in zip(model.parameters(), expected)] == [True]
