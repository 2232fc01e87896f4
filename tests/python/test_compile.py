"""torch.compile(backend="genie") (genie.compile, docs/compile.md): Dynamo's graphs split into
node parts and eager parts, run on the embedded node, each model equal to eager CPU; the
backend found by its entry point without `import genie`; a repeated call is one request."""

import subprocess
import sys
import textwrap

import pytest
import torch

import genie
import genie.compile

DEV = "remote_accelerator:0"


def _stats_delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in ("dynamo_graphs", "recompiles", "graph_breaks", "aten_graphs")}


def _engines_of(stats: dict, first_graph: int) -> dict:
    """Calls per engine of the aten graphs compiled since index `first_graph`."""
    calls = {"executor": 0, "eager": 0}
    for graph in stats["graphs"][first_graph:]:
        for part in graph["parts"]:
            calls[part["engine"]] += part["calls"]
    return calls


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


@pytest.fixture(scope="module")
def remote_mlp():
    """(cpu model, the same on the device, compiled with backend="genie" and dynamic=False)."""
    cpu = _mlp().eval()
    remote = _mlp().eval().to(DEV)
    return cpu, remote, torch.compile(remote, backend="genie", dynamic=False)


def test_mlp_equals_eager_cpu_and_a_new_shape_recompiles(remote_mlp):
    cpu, _, compiled = remote_mlp
    x = torch.randn(5, 8)
    before = genie.compile_stats()
    first = len(before["graphs"])
    with torch.no_grad():
        out = compiled(x.to(DEV))
        assert out.device == torch.device(DEV)  # stays on the device until read
        torch.testing.assert_close(out.cpu(), cpu(x), rtol=1e-5, atol=1e-6)
        again = compiled(torch.randn(7, 8).to(DEV))  # another batch size: guards fail, a recompile
        assert again.shape == (7, 4)
    after = genie.compile_stats()
    delta = _stats_delta(before, after)
    assert delta["recompiles"] >= 1, delta
    graph = after["graphs"][first]
    assert graph["kind"] == "inference" and graph["device"] == DEV
    assert [p["engine"] for p in graph["parts"]] == ["executor"]  # all of it on the node
    assert "aten.addmm.default" in graph["parts"][0]["ops"]
    assert _engines_of(after, first)["executor"] >= 2


def test_a_second_call_is_one_request_and_registers_nothing(remote_mlp):
    _, remote, compiled = remote_mlp
    x = torch.randn(5, 8).to(DEV)
    with torch.no_grad():
        for _ in range(2):  # compile, register the graph, lift the scalars that change
            compiled(x).cpu()
        before = genie.client_stats()
        out = compiled(x)
        recorded = genie.client_stats()
        out.cpu()
        after = genie.client_stats()
    assert recorded["messages_sent"] == before["messages_sent"]  # the call itself sends nothing
    assert after["round_trips"] - before["round_trips"] == 1
    assert after["messages_sent"] - before["messages_sent"] == 1
    assert after["graphs_registered"] == before["graphs_registered"]


def test_transformer_block_equals_eager_cpu():
    def block():
        torch.manual_seed(0)
        return torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True).eval()
    cpu, remote = block(), block().to(DEV)
    x = torch.randn(2, 5, 16)
    compiled = torch.compile(remote, backend="genie")
    with torch.no_grad():
        out = compiled(x.to(DEV)).cpu()
    torch.testing.assert_close(out, cpu(x), rtol=1e-4, atol=1e-5)


def test_conv_block_equals_eager_cpu():
    def block():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                   torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 10)).eval()
    cpu, remote = block(), block().to(DEV)
    x = torch.randn(2, 3, 8, 8)
    compiled = torch.compile(remote, backend="genie")
    with torch.no_grad():
        out = compiled(x.to(DEV)).cpu()
    torch.testing.assert_close(out, cpu(x), rtol=1e-4, atol=1e-5)


def test_training_steps_equal_eager_cpu():
    def train(device, compile_it):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        run = torch.compile(model, backend="genie") if compile_it else model
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(6, 8, generator=g).to(device), torch.randint(0, 3, (6,), generator=g).to(device)
        losses = []
        for _ in range(3):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(run(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}

    first = len(genie.compile_stats()["graphs"])
    cpu_losses, cpu_state = train("cpu", False)
    dev_losses, dev_state = train(DEV, True)
    assert dev_losses == pytest.approx(cpu_losses, rel=1e-5)
    assert cpu_losses[-1] < cpu_losses[0]
    for name in cpu_state:
        torch.testing.assert_close(dev_state[name], cpu_state[name], rtol=1e-5, atol=1e-6, msg=name)
    kinds = {g["kind"] for g in genie.compile_stats()["graphs"][first:]}
    assert {"forward", "backward"} <= kinds  # both graphs compiled, run by the executor
    assert _engines_of(genie.compile_stats(), first)["executor"] >= 6


def test_cpu_parameters_are_uploaded_once_and_outputs_come_back_to_the_cpu():
    model = _mlp()
    x = torch.randn(3, 8)
    compiled = torch.compile(model, backend="genie")
    out = compiled(x)
    assert out.device.type == "cpu"  # as eager CPU returns it
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-6)
    compiled(x)
    weights = genie.memory_stats(DEV)["resident"].get("PersistentWeight", 0)
    before = genie.client_stats()
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    after = genie.client_stats()
    assert genie.memory_stats(DEV)["resident"].get("PersistentWeight", 0) == weights  # nothing uploaded again
    assert after["round_trips"] - before["round_trips"] == 1  # the input inline, the output back
    # Gradients reach the CPU parameters.
    compiled(x).sum().backward()
    torch.testing.assert_close(model[0].weight.grad.clone(), _cpu_grad(x), rtol=1e-5, atol=1e-6)


def _cpu_grad(x):
    model = _mlp()
    model(x).sum().backward()
    return model[0].weight.grad


def test_a_graph_break_in_the_middle():
    torch.manual_seed(0)
    w = torch.randn(8, 8)
    wd = w.to(DEV)

    def f(x, w):
        h = torch.relu(x @ w)
        if h.sum().item() > 0:  # a host read: Dynamo breaks the graph here
            h = h * 2
        return h - 1

    x = torch.rand(4, 8)
    before = genie.compile_stats()
    out = torch.compile(f, backend="genie")(x.to(DEV), wd).cpu()
    delta = _stats_delta(before, genie.compile_stats())
    torch.testing.assert_close(out, f(x, w), rtol=1e-5, atol=1e-6)
    assert delta["graph_breaks"] >= 1, delta
    assert delta["dynamo_graphs"] >= 2, delta  # the graphs on both sides of the break


@torch.library.custom_op("genie_compile_test::scaled", mutates_args=())
def _scaled(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@_scaled.register_fake
def _(x, factor):
    return torch.empty_like(x)


def test_an_unsupported_op_runs_eagerly():
    torch.manual_seed(0)
    w = torch.randn(8, 8)

    def f(x, w):
        return torch.ops.genie_compile_test.scaled(torch.tanh(x @ w), 3.0) + 1

    x = torch.randn(4, 8)
    first = len(genie.compile_stats()["graphs"])
    out = torch.compile(f, backend="genie")(x.to(DEV), w.to(DEV)).cpu()
    torch.testing.assert_close(out, f(x, w), rtol=1e-5, atol=1e-6)
    parts = [p for g in genie.compile_stats()["graphs"][first:] for p in g["parts"]]
    eager = [p for p in parts if p["engine"] == "eager"]
    assert [p["ops"] for p in eager] == [["genie_compile_test.scaled.default"]] and eager[0]["calls"] == 1
    assert sum(p["engine"] == "executor" for p in parts) == 2  # before and after it, on the node


def test_unknown_options_and_a_wrong_node_raise():
    with pytest.raises(ValueError, match="unknown option.*'bogus'.*accepted: node, mode"):
        genie.compile.parse_options(None, {"bogus": 1})
    with pytest.raises(ValueError, match="unknown mode"):
        genie.compile.parse_options("fastest", None)
    assert genie.compile.parse_options("reduce-overhead", {"node": 0}) == genie.compile.CompileOptions(
        0, "reduce-overhead")
    f = torch.compile(lambda x: x + 1, backend="genie", options={"bogus": 1})
    with pytest.raises(Exception, match="unknown option"):
        f(torch.ones(2).to(DEV))
    g = torch.compile(lambda x: x + 2, backend="genie", options={"node": 3})
    with pytest.raises(Exception, match="options\\['node'\\]=3 but the inputs are on remote_accelerator:0"):
        g(torch.ones(2).to(DEV))


def test_the_backend_is_found_by_its_entry_point_without_import_genie():
    program = textwrap.dedent("""
        import sys, torch
        assert "genie" not in sys.modules
        assert "genie" in torch._dynamo.list_backends()
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        x = torch.randn(3, 4)
        out = torch.compile(model, backend="genie")(x)
        assert "genie" in sys.modules and out.device.type == "cpu"
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-6)
        import genie
        assert genie.compile_stats()["parts"]["executor"] >= 1
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-4000:]
