"""genie.explain's compiled section (docs/compile.md, "What explain shows"): a compiled
transformer block's node part and the patterns genie.semantics finds in its FX graph, the
Dynamo and capture cache hits of a second explain, a graph break and its reason, an op run
eagerly and why. Runs on the embedded genie-node; the node's packages are built in the
background (conftest's cache directory) and never waited for."""
from __future__ import annotations

import json
import math

import torch

import genie
import genie.compile

DEV = "remote_accelerator:0"


class Block(torch.nn.Module):
    """A pre-norm transformer block: attention written out (Q·Kᵀ, softmax, ·V), a GELU MLP."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for y in self.qkv(self.ln1(x)).split(d, dim=-1))
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // self.heads), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


def _block():
    torch.manual_seed(0)
    return Block().eval()


def test_a_compiled_block_shows_its_node_part_its_patterns_and_cache_hits_when_explained_again():
    cpu = _block()
    compiled = torch.compile(_block().to(DEV), backend="genie", dynamic=False)
    x = torch.randn(2, 5, 16)
    got = []
    with torch.no_grad():
        first = genie.explain(lambda: got.append(compiled(x.to(DEV)).cpu()))
        torch.testing.assert_close(got[0], cpu(x), rtol=1e-5, atol=1e-6)  # explaining runs it as it is
        again = genie.explain(compiled, x.to(DEV))  # the compiled module itself: its result is computed

    (function,) = first.compiled
    assert function["name"] == "Block.forward" and function["compiled_now"] and function["device"] == DEV
    assert function["graph_break"] is None
    (graph,) = function["graphs"]
    assert graph["kind"] == "inference" and graph["phase"] == "forward" and graph["analysis_error"] is None
    # genie.semantics on the aten graph the backend received: the attention, the MLP (its
    # weights known as weights from Dynamo's parameters), both layer norms.
    assert graph["patterns"] == {"attention": 1, "mlp": 1, "norm": 2}, graph["patterns"]
    (part,) = graph["parts"]
    assert part["name"] == "fused_0" and part["engine"] == "node" and part["why"] is None
    assert (part["calls"], part["hits"], part["captures"]) == (1, 0, 1)  # captured now: a miss
    text = str(first)
    assert "compiled: 1 function(s)" in text and "fused_0" in text and "Dynamo cache miss" in text
    assert "attention 1, mlp 1, norm 2" in text and f"on {DEV} (one genie::call_graph" in text

    # Again: Dynamo's cache hits (no compile), the part runs its captured graph, one call_graph
    # run on the node by its package or its executor.
    (function,) = again.compiled
    assert not function["compiled_now"]
    (part,) = function["graphs"][0]["parts"]
    assert (part["calls"], part["hits"], part["captures"], part["total_captures"]) == (1, 1, 0, 1)
    node = again.compiled_nodes[DEV]
    assert node["package_calls"] + node["executor_calls"] == 1, node
    # Its node's facts for the part: the one geometry captured, run once by its package or by the
    # executor while the package is built (in the background: not waited for here).
    (fact,) = part["node"]
    assert fact["package_calls"] + fact["executor_calls"] == 1, fact
    assert fact["state"] in ("package", "building") and fact["reason"] == "", fact
    assert "        node: " in str(again)
    assert "Dynamo cache hit" in str(again) and "captured graph runs 1, new captures 0" in str(again)
    assert any(s.graph.op_counts().get("genie::call_graph") for s in again.steps)
    data = json.loads(json.dumps(again.to_dict()))
    assert data["compiled"][0]["graphs"][0]["patterns"]["attention"] == 1


def test_a_graph_break_is_shown_with_its_reason_and_the_function_on_each_side():
    torch.manual_seed(0)
    w = torch.randn(8, 8)

    def f(x, w):
        h = torch.relu(x @ w)
        if h.sum().item() > 0:  # a host read: Dynamo breaks the graph here
            h = h * 2
        return h - 1

    report = genie.explain(torch.compile(f, backend="genie"), torch.rand(4, 8).to(DEV), w.to(DEV))
    before, after = report.compiled
    assert before["name"] == "f" and after["name"].startswith("torch_dynamo_resume_in_f")
    assert "Tensor.item()" in before["graph_break"] and "if h.sum().item() > 0:" in before["break_at"]
    assert after["graph_break"] is None  # its frame returned
    assert any("Tensor.item()" in reason for reason in report.compiled_graph_breaks)
    text = str(report)
    assert "ends at a graph break: Unsupported Tensor.item()" in text and "torch_dynamo_resume_in_f" in text


@torch.library.custom_op("genie_explain_test::scaled", mutates_args=())
def _scaled(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@_scaled.register_fake
def _(x, factor):
    return torch.empty_like(x)


def test_an_op_run_eagerly_says_why():
    def f(x):
        return torch.ops.genie_explain_test.scaled(torch.tanh(x), 3.0) + 1

    x = torch.randn(4, 8)
    report = genie.explain(torch.compile(f, backend="genie"), x.to(DEV))
    (function,) = report.compiled
    parts = function["graphs"][0]["parts"]
    assert [p["engine"] for p in parts if p["engine"] != "eager"] == ["node", "node"]  # before and after it
    (eager,) = [p for p in parts if p["engine"] == "eager"]
    assert eager["calls"] == 1 and "is not an aten operator" in eager["why"]
    assert eager["where"].startswith("eager")
    assert "why: genie_explain_test.scaled.default is not an aten operator" in str(report)


def test_a_program_without_compiled_code_has_no_compiled_section():
    x = torch.ones(3).to(DEV)
    report = genie.explain(lambda: (x * 2).cpu())
    assert report.compiled == [] and report.compiled_nodes == {} and "compiled:" not in str(report)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def test_a_compiled_cpu_model_runs_on_the_node_when_explained():
    compiled = torch.compile(_mlp().eval(), backend="genie")  # CPU parameters: runs on the node
    with torch.no_grad():
        report = genie.explain(compiled, torch.randn(5, 8))
    assert report.mode == "recorded"  # run, not traced on fakes (Dynamo's code cannot be)
    (function,) = report.compiled
    assert function["name"] == "Sequential.forward" and function["host_inputs"] and function["device"] == DEV
    assert function["graphs"][0]["patterns"] == {"mlp": 1}  # the CPU parameters are the MLP's weights
    assert "CPU inputs moved there per call" in str(report)


def test_a_training_step_shows_its_forward_and_backward_graphs():
    compiled = torch.compile(_mlp().to(DEV), backend="genie")
    x = torch.randn(5, 8).to(DEV)
    report = genie.explain(lambda: compiled(x).sum().backward())
    (function,) = report.compiled
    forward, backward = function["graphs"]
    assert (forward["kind"], forward["phase"], forward["patterns"]) == ("forward", "forward", {"mlp": 1})
    assert (backward["kind"], backward["phase"]) == ("backward", "backward")
    # The forward graph returns t(weight) for the backward: that view runs eagerly, and says why.
    eager = [p for p in forward["parts"] if p["engine"] == "eager"]
    assert eager and all("a view of an input that the graph returns" in p["why"] for p in eager)
