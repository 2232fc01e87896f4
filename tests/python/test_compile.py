"""torch.compile(backend="genie") (genie.compile, docs/compile.md): Dynamo's graphs split into
node parts and eager parts, run on the embedded node, each model equal to eager CPU and, once
the node has built its AOT Inductor package, run by the package; the backend found by its entry
point without `import genie`; a repeated call is one request; packages survive a node restart
and a corrupted one falls back to the executor."""

import os
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import genie
import genie.compile

DEV = "remote_accelerator:0"


def _stats_delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in ("dynamo_graphs", "recompiles", "graph_breaks", "aten_graphs")}


def _engines_of(stats: dict, first_graph: int) -> dict:
    """Calls per engine of the aten graphs compiled since index `first_graph`."""
    calls = {"node": 0, "recorded": 0, "eager": 0}
    for graph in stats["graphs"][first_graph:]:
        for part in graph["parts"]:
            calls[part["engine"]] += part["calls"]
    return calls


def _package_calls() -> int:
    return genie.memory_stats(DEV)["package_calls"]


def _until_run_by_package(step, parts: int = 1, timeout_s: float = 300.0):
    """Calls `step()` (compiled calls and a read) until the node runs `parts` calls of one step
    by AOT Inductor packages (the first calls run by the executor while the packages are built);
    returns the last result, from a step the packages ran. Fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        before = _package_calls()
        out = step()
        if _package_calls() - before >= parts:
            return out
        stats = genie.memory_stats(DEV)
        assert stats["compile_failures"] == 0 or time.monotonic() < deadline, stats
        assert time.monotonic() < deadline, f"no call ran by a package in {timeout_s} s: {stats}"
        time.sleep(0.5)


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
    assert [p["engine"] for p in graph["parts"]] == ["node"]  # all of it on the node, as one part
    assert "aten.addmm.default" in graph["parts"][0]["ops"]
    assert _engines_of(after, first)["node"] >= 2


def test_mlp_runs_by_the_package_equal_to_eager_cpu(remote_mlp):
    cpu, _, compiled = remote_mlp
    x = torch.randn(5, 8)
    with torch.no_grad():
        out = _until_run_by_package(lambda: compiled(x.to(DEV)).cpu())
    torch.testing.assert_close(out, cpu(x), rtol=1e-5, atol=1e-6)


def test_a_second_call_is_one_request_and_registers_nothing(remote_mlp):
    _, remote, compiled = remote_mlp
    x = torch.randn(5, 8).to(DEV)
    with torch.no_grad():
        for _ in range(2):  # compile, register the graph, lift the scalars that change
            compiled(x).cpu()
        parts_before = _node_part_calls()
        before = genie.client_stats()
        out = compiled(x)
        recorded = genie.client_stats()
        out.cpu()
        after = genie.client_stats()
    assert recorded["messages_sent"] == before["messages_sent"]  # the call itself sends nothing
    assert after["round_trips"] - before["round_trips"] == 1
    assert after["messages_sent"] - before["messages_sent"] == 1
    assert after["graphs_registered"] == before["graphs_registered"]
    calls, dispatched = (a - b for a, b in zip(_node_part_calls(), parts_before))
    assert (calls, dispatched) == (1, 0)  # recorded by the capture's own call, not the dispatcher


def _node_part_calls() -> tuple[int, int]:
    """(calls, of them recorded through the dispatcher) of every captured node part so far."""
    parts = [p for g in genie.compile_stats()["graphs"] for p in g["parts"] if p["engine"] == "node"]
    return sum(p["calls"] for p in parts), sum(p["dispatched"] for p in parts)


def test_a_call_on_a_lost_input_raises_its_error_and_the_next_call_works(remote_mlp):
    cpu, _, compiled = remote_mlp
    x = torch.randn(5, 8)
    with torch.no_grad():
        for _ in range(2):
            compiled(x.to(DEV)).cpu()
        # Row 70 of 5: out of range, found by the node only. The result, of the shape the
        # compiled graph takes, is lost with that error.
        lost = x.to(DEV)[torch.tensor([0.0, 1, 2, 3, 70]).to(DEV).long()]
        with pytest.raises(genie.GenieRemoteError, match="index") as first:
            lost.cpu()
        before = _node_part_calls()
        with pytest.raises(genie.GenieRemoteError) as again:
            compiled(lost).cpu()
        after = _node_part_calls()
        assert str(again.value) == str(first.value)  # the lost value's own error
        assert (after[0] - before[0], after[1] - before[1]) == (1, 1)  # declined by the direct call
        torch.testing.assert_close(compiled(x.to(DEV)).cpu(), cpu(x), rtol=1e-5, atol=1e-6)


def _equals_eager_cpu_then_by_the_package(cpu, remote, x):
    """`remote` compiled with backend="genie" equals `cpu` on `x`, on its first call (the
    executor) and once the node runs it by its package."""
    compiled = torch.compile(remote, backend="genie")
    with torch.no_grad():
        out = compiled(x.to(DEV)).cpu()
        torch.testing.assert_close(out, cpu(x), rtol=1e-4, atol=1e-5)
        out = _until_run_by_package(lambda: compiled(x.to(DEV)).cpu())
    torch.testing.assert_close(out, cpu(x), rtol=1e-4, atol=1e-5)


def test_transformer_block_equals_eager_cpu():
    def block():
        torch.manual_seed(0)
        return torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True).eval()
    _equals_eager_cpu_then_by_the_package(block(), block().to(DEV), torch.randn(2, 5, 16))


def test_conv_block_equals_eager_cpu():
    def block():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                   torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 10)).eval()
    _equals_eager_cpu_then_by_the_package(block(), block().to(DEV), torch.randn(2, 3, 8, 8))


def test_training_steps_equal_eager_cpu():
    def train(device, compile_it):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        run = torch.compile(model, backend="genie") if compile_it else model
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(6, 8, generator=g).to(device), torch.randint(0, 3, (6,), generator=g).to(device)
        losses = []

        def step():
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(run(x), y)
            loss.backward()
            optimizer.step()
            return loss.item()
        for _ in range(3):
            losses.append(step())
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        if compile_it:  # the forward and the backward graph each run by a package, once built
            _until_run_by_package(step, parts=2)
        return losses, state

    first = len(genie.compile_stats()["graphs"])
    cpu_losses, cpu_state = train("cpu", False)
    dev_losses, dev_state = train(DEV, True)
    assert dev_losses == pytest.approx(cpu_losses, rel=1e-5)
    assert cpu_losses[-1] < cpu_losses[0]
    for name in cpu_state:
        torch.testing.assert_close(dev_state[name], cpu_state[name], rtol=1e-5, atol=1e-6, msg=name)
    kinds = {g["kind"] for g in genie.compile_stats()["graphs"][first:]}
    assert {"forward", "backward"} <= kinds  # both graphs compiled
    calls = _engines_of(genie.compile_stats(), first)
    assert calls["node"] + calls["recorded"] >= 6


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
    assert sum(p["engine"] == "node" for p in parts) == 2  # before and after it, on the node


@torch.library.custom_op("genie_compile_test::peek", mutates_args=())
def _peek(state: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return state * 10 + x


@_peek.register_fake
def _(state, x):
    return torch.empty_like(x)


def test_a_write_back_runs_after_an_eager_read_of_the_input():
    """`state.add_(y)` is written back by copy_ at the graph's end, and an eager op reads
    `state` and the first part's `y`: the write-back joins the part after that read (never one
    that runs before it, partition.py), so each call reads the old state and leaves the new one,
    as eager does."""
    def f(state, x):
        y = x * 2
        z = torch.ops.genie_compile_test.peek(state, y)
        state.add_(y)
        return z + y

    state, x = torch.ones(4), torch.arange(4.0)
    remote_state = state.to(DEV)
    compiled = torch.compile(f, backend="genie")
    first = len(genie.compile_stats()["graphs"])
    for _ in range(3):  # the first call captures, the others run the captured parts
        expected = f(state, x)
        torch.testing.assert_close(compiled(remote_state, x.to(DEV)).cpu(), expected)
        torch.testing.assert_close(remote_state.cpu(), state)
    (graph,) = genie.compile_stats()["graphs"][first:]
    assert sorted(p["engine"] for p in graph["parts"]) == ["eager", "node", "node"]
    # The write-back runs in a captured part (the one after the eager read): no eager copy_.
    writer = [p for p in graph["parts"] if "aten.copy_.default" in p["ops"]]
    assert len(writer) == 1 and writer[0]["engine"] == "node" and writer[0]["calls"] == 3


def test_a_write_back_in_a_part_before_a_read_of_its_input_is_found():
    """partition's check on a split graph built by hand: part fused_0 writes input `state` back
    and an op outside reads `state` after fused_0 ran: that write-back is misplaced."""
    import torch.fx
    from genie.compile.partition import _misplaced_write_backs

    sub = torch.fx.Graph()
    p = sub.placeholder("state")
    new = sub.call_function(torch.ops.aten.add.Tensor, (p, 1))
    sub.call_function(torch.ops.aten.copy_.default, (p, new), name="write_back")
    sub.output(new)
    outer = torch.fx.Graph()
    state = outer.placeholder("state")
    part = outer.call_module("fused_0", (state,))
    late = outer.call_function(torch.ops.aten.mul.Tensor, (state, 2))  # reads state after the part
    outer.output((part, late))
    root = torch.nn.Module()
    root.fused_0 = torch.fx.GraphModule(torch.nn.Module(), sub)
    split = torch.fx.GraphModule(root, outer)
    assert _misplaced_write_backs(split) == {"write_back"}
    outer.erase_node(outer.output_node())
    outer.erase_node(late)
    early = outer.call_function(torch.ops.aten.mul.Tensor, (state, 2))
    outer.output((part, early))
    part.prepend(early)  # the read runs before the part now: nothing is misplaced
    assert _misplaced_write_backs(torch.fx.GraphModule(root, outer)) == frozenset()


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
        assert genie.compile_stats()["parts"]["node"] >= 1
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-4000:]


def _tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=64)).eval()


@torch.no_grad()
def _static_cache_decode(model, forward, device, prompt, new_tokens: int) -> torch.Tensor:
    """Greedy decoding with HuggingFace's StaticCache (max_cache_len = prompt + new tokens): the
    prefill eager, then one `forward` per token, each token read back as `generate` does."""
    from transformers import StaticCache
    n = prompt.shape[1]
    cache = StaticCache(config=model.config, max_cache_len=n + new_tokens)
    out = model(input_ids=prompt.to(device), past_key_values=cache, use_cache=True,
                cache_position=torch.arange(n).to(device))
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    tokens = [token.cpu()]
    for i in range(new_tokens - 1):
        out = forward(input_ids=token, past_key_values=cache, cache_position=torch.tensor([n + i]).to(device),
                      use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(token.cpu())
    return torch.cat(tokens, dim=1)


def test_gpt2_decode_with_a_static_kv_cache_runs_by_the_package():
    cpu = _tiny_gpt2()
    prompt = torch.tensor([[5, 17, 42, 8, 33, 1]])
    expected = _static_cache_decode(cpu, cpu, "cpu", prompt, 12)
    remote = _tiny_gpt2().to(DEV)
    compiled = torch.compile(remote, backend="genie", dynamic=False)
    first_stats = genie.compile_stats()
    first = len(first_stats["graphs"])
    before = genie.memory_stats(DEV)["package_calls"]
    deadline = time.monotonic() + 300
    while True:  # whole generations until one ran every decode step by the package
        start = genie.memory_stats(DEV)["package_calls"]
        got = _static_cache_decode(remote, compiled, DEV, prompt, 12)
        assert torch.equal(got, expected)
        if genie.memory_stats(DEV)["package_calls"] - start >= 11:
            break
        assert time.monotonic() < deadline, genie.memory_stats(DEV)
        time.sleep(1.0)
    stats = genie.compile_stats()
    assert stats["recompiles"] - first_stats["recompiles"] <= 1
    graphs = stats["graphs"][first:]
    assert len(graphs) == 1 and graphs[0]["kind"] == "inference"
    # One node part, the cache's in-place updates (index_copy written back by copy_) in it: the
    # part writes its inputs, the whole step is one op; nothing runs eagerly.
    assert [p["engine"] for p in graphs[0]["parts"]] == ["node"]
    assert graphs[0]["parts"][0]["ops"].count("aten.copy_.default") >= 2 * cpu.config.n_layer  # keys, values
    assert genie.memory_stats(DEV)["package_calls"] > before
    assert genie.memory_stats(DEV)["cuda_graph_replays"] == 0  # mode "default", and a CPU node


_RESTART_PROGRAM = textwrap.dedent("""
    import json, sys, time, torch, genie
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()
    x = torch.randn(2, 4)
    remote = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()
    remote.load_state_dict(model.state_dict())
    compiled = torch.compile(remote.to("remote_accelerator:0"), backend="genie")
    wait_for_package = sys.argv[1] == "wait"
    deadline = time.monotonic() + 240
    with torch.no_grad():
        while True:
            out = compiled(x.to("remote_accelerator:0")).cpu()
            torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-6)
            stats = genie.memory_stats()
            calls = stats["package_calls"] + stats["executor_calls"]
            if (stats["package_calls"] if wait_for_package else calls) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        (part,) = genie.explain(compiled, x.to("remote_accelerator:0")).compiled[0]["graphs"][0]["parts"]
    out = {k: stats[k] for k in ("package_calls", "executor_calls", "packages_built", "packages_loaded",
                                 "compile_failures")}
    print(json.dumps(dict(out, part=part["node"])))
""")


def _run_restart_program(cache: pathlib.Path, mode: str) -> tuple[dict, str]:
    env = dict(os.environ, GENIE_NODE_COMPILE_CACHE=str(cache), GENIE_LOG_LEVEL="warn")
    done = subprocess.run([sys.executable, "-c", _RESTART_PROGRAM, mode], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    import json
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_a_node_restart_reuses_the_package_and_a_corrupted_one_falls_back(tmp_path):
    cache = tmp_path / "packages"
    built, _ = _run_restart_program(cache, "wait")  # a node builds the package
    assert built["packages_built"] == 1 and built["package_calls"] >= 1, built
    # genie.explain names the engine per part: this part's package, built by the node just now.
    (part,) = built["part"]
    assert part["state"] == "package" and part["build_s"] > 0 and not part["from_cache"], part
    assert part["package_calls"] >= 1 and "float32:2,4:" in part["inputs"], part
    assert (cache.stat().st_mode & 0o777) == 0o700
    packages = list(cache.glob("*.pt2"))
    assert len(packages) == 1
    # A new node (a new process) finds it on disk: no compile, run by the package.
    reused, _ = _run_restart_program(cache, "wait")
    assert reused["packages_built"] == 0 and reused["packages_loaded"] == 1 and reused["package_calls"] >= 1, reused
    (part,) = reused["part"]
    assert part["state"] == "package" and part["from_cache"] and part["build_s"] == 0, part
    # Corrupted: the load fails, the reason is logged, the part runs by the executor (and the
    # package is deleted, so that a later node builds it again).
    packages[0].write_bytes(b"not a zip archive" * 64)
    fallen, log = _run_restart_program(cache, "no-wait")
    assert fallen["compile_failures"] == 1 and fallen["package_calls"] == 0 and fallen["executor_calls"] >= 3, fallen
    assert "failed to load" in log and packages[0].name in log, log[-3000:]
    (part,) = fallen["part"]
    assert part["state"] == "executor" and part["reason"].startswith("its package failed to load"), part
    assert part["package_calls"] == 0 and part["executor_calls"] >= 3, part
    assert not packages[0].exists()


def test_a_node_that_stops_while_it_builds_a_package_reports_no_failure(tmp_path):
    cache = tmp_path / "packages"
    stats, log = _run_restart_program(cache, "no-wait")  # exits while the node's worker builds
    assert stats["packages_built"] == 0 and stats["compile_failures"] == 0, stats
    assert list(cache.glob("*.graph")), "the node never started its compile worker"
    assert "compile worker failed" not in log, log[-3000:]  # its shutdown stopped the build: no failure


def test_a_compiled_optimizer_step_equals_eager_cpu():
    def train(device, compile_it):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

        def step(x, y):  # the whole step compiled: forward, backward (a graph break), Adam's update
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            return loss
        run = torch.compile(step, backend="genie") if compile_it else step
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(6, 8, generator=g).to(device), torch.randint(0, 3, (6,), generator=g).to(device)
        losses = [run(x, y).item() for _ in range(4)]
        return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}

    first = len(genie.compile_stats()["graphs"])
    cpu_losses, cpu_state = train("cpu", False)
    dev_losses, dev_state = train(DEV, True)
    assert dev_losses == pytest.approx(cpu_losses, rel=1e-5)
    for name in cpu_state:
        torch.testing.assert_close(dev_state[name], cpu_state[name], rtol=1e-5, atol=1e-6, msg=name)
    graphs = genie.compile_stats()["graphs"][first:]
    # forward, backward, and the optimizer's update as an inference graph, each with node parts
    assert {g["kind"] for g in graphs} >= {"forward", "backward", "inference"}
    assert all(any(p["engine"] == "node" for p in g["parts"]) for g in graphs)


_EVICT_PROGRAM = textwrap.dedent("""
    import json, time, torch, genie
    x = torch.randn(3, 4)
    functions = [lambda t: torch.tanh(t) * 2, lambda t: torch.sigmoid(t) + 3]  # two parts, two packages
    for f in functions:
        compiled = torch.compile(f, backend="genie")
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            before = genie.memory_stats()["package_calls"]
            out = compiled(x.to("remote_accelerator:0")).cpu()
            torch.testing.assert_close(out, f(x))
            if genie.memory_stats()["package_calls"] > before:
                break
            time.sleep(0.3)
    stats = genie.memory_stats()
    print(json.dumps({k: stats[k] for k in ("package_calls", "packages_built", "packages_loaded")}))
""")


def test_the_package_cache_keeps_to_its_size_limit(tmp_path):
    cache = tmp_path / "packages"
    env = dict(os.environ, GENIE_NODE_COMPILE_CACHE=str(cache), GENIE_NODE_COMPILE_CACHE_SIZE="1",
               GENIE_LOG_LEVEL="info")
    done = subprocess.run([sys.executable, "-c", _EVICT_PROGRAM], capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    import json
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    assert stats["packages_built"] == 2 and stats["package_calls"] >= 2, stats
    # A 1-byte cache keeps only the package built last: the first one was evicted (logged).
    assert len(list(cache.glob("*.pt2"))) == 1
    assert "evicted" in done.stderr and "cache limit 1 bytes" in done.stderr, done.stderr[-3000:]


_NEW_SESSION_PROGRAM = textwrap.dedent("""
    import torch, genie
    torch.manual_seed(0)
    f = torch.compile(lambda x, w: (x @ w).relu().sum(0), backend="genie", dynamic=False)
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    with torch.no_grad():
        first = f(x.to("remote_accelerator:0"), w.to("remote_accelerator:0")).cpu()
        again = f(x.to("remote_accelerator:0"), w.to("remote_accelerator:0")).cpu()  # the captured part
        genie.shutdown()  # the node and its registered graphs are gone; the next use starts another
        later = f(x.to("remote_accelerator:0"), w.to("remote_accelerator:0")).cpu()  # Dynamo's cache hit
    expected = (x @ w).relu().sum(0)
    for out in (first, again, later):
        torch.testing.assert_close(out, expected)
    (graph,) = genie.compile_stats()["graphs"]
    (part,) = graph["parts"]
    assert part["engine"] == "node" and part["calls"] == 3 and part["dispatched"] == 0, part
    print("ok")
""")


def test_a_compiled_function_captures_its_parts_again_in_a_new_node_session():
    """A part's graph is registered in one node session: after genie.shutdown, the same compiled
    function (Dynamo's cache hit) captures and registers it again on the new node, instead of
    naming a graph the node does not know."""
    done = subprocess.run([sys.executable, "-c", _NEW_SESSION_PROGRAM], capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, GENIE_NODE_COMPILE_ENGINE="executor"))
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-4000:]
