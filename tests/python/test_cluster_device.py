"""`remote_accelerator` without an index on a cluster: `module.to("remote_accelerator")` puts a
host model on the cluster, placed by the scheduler at its first call (genie.placed.defer);
`remote_accelerator:N` still pins node N; with one node configured, `.to("remote_accelerator")`
uploads to the current device as before. Real genie-node processes on loopback (the `cluster`
fixture of test_placement: two nodes, the `limit` marker's --memory-limit).
"""
import pytest
import torch

import genie
from conftest import NodeProcess
from genie.placed import deferred_of, placement_of
from test_placement import CONFIG, LIMIT, MODEL_BYTES, _gpt2, _stats, cluster  # noqa: F401 - cluster: a fixture

RA = torch.remote_accelerator


def _ids(seed: int) -> torch.Tensor:
    return torch.randint(0, CONFIG["vocab_size"], (1, 8), generator=torch.Generator().manual_seed(seed))


def _weights(i: int) -> int:
    return _stats(i)["resident"]["PersistentWeight"]


@pytest.mark.limit(LIMIT)
def test_to_remote_accelerator_places_over_the_cluster_at_the_first_call(cluster):
    model, reference = _gpt2()
    ids = _ids(1)
    assert model.to("remote_accelerator") is model
    # Nothing moved: the model is on the host, deferred, and the nodes hold nothing.
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert deferred_of(model) is not None and placement_of(model) is None
    assert [_weights(i) for i in range(2)] == [0, 0]
    assert RA.cluster_memory_allocated() == 0
    with torch.no_grad():
        tokens = model.generate(ids.to("remote_accelerator"), max_new_tokens=12, do_sample=False)
        expected = reference.generate(ids, max_new_tokens=12, do_sample=False)
    assert tokens.device == torch.device("remote_accelerator:0")  # the current device
    assert tokens.cpu().tolist() == expected.tolist()
    placed = placement_of(model)
    assert placed is not None and len(placed.devices()) == 2, str(placed)  # it fits on no single node
    weights = [_weights(i) for i in range(2)]
    assert all(0 < w <= LIMIT for w in weights) and sum(weights) == MODEL_BYTES, weights
    assert RA.cluster_memory_allocated() == RA.memory_allocated(0) + RA.memory_allocated(1) >= MODEL_BYTES
    assert RA.memory_allocated() == RA.memory_allocated(0) <= LIMIT  # None: the current device
    free, total = RA.cluster_mem_get_info()
    assert total == 2 * LIMIT and free == sum(RA.mem_get_info(i)[0] for i in range(2))
    # Placed once: moving it to the cluster again changes nothing, and later calls run there.
    assert model.to("remote_accelerator") is model and placement_of(model) is placed
    with torch.no_grad():
        logits = model(ids.to("remote_accelerator")).logits
    torch.testing.assert_close(logits.cpu(), reference(ids).logits, rtol=1e-4, atol=1e-4)
    assert [_weights(i) for i in range(2)] == weights


@pytest.mark.limit(LIMIT)
def test_outputs_go_to_the_device_current_when_it_was_moved_and_to_cpu_undoes_it(cluster):
    model, reference = _gpt2(seed=3)
    ids = _ids(2)
    with RA.device(1):
        model.to(device=torch.device("remote_accelerator"))
    assert deferred_of(model).home == torch.device("remote_accelerator:1")
    with torch.no_grad():
        tokens = model.generate(ids.to("remote_accelerator:1"), max_new_tokens=8, do_sample=False)
        expected = reference.generate(ids, max_new_tokens=8, do_sample=False)
        assert tokens.device == torch.device("remote_accelerator:1")
        assert tokens.cpu().tolist() == expected.tolist()
        assert model(ids).logits.device == torch.device("remote_accelerator:1")  # a host call too
    assert len(placement_of(model).devices()) == 2
    model.to("cpu")  # off the cluster: the placement's hooks removed, the weights home
    assert deferred_of(model) is None and placement_of(model) is None
    assert all(p.device.type == "cpu" for p in model.parameters())
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-4, atol=1e-4)


def test_an_index_pins_that_node_on_a_cluster(cluster):
    model, reference = _gpt2()
    ids = _ids(3)
    model.to("remote_accelerator:1")
    assert deferred_of(model) is None
    assert {p.device for p in model.parameters()} == {torch.device("remote_accelerator:1")}
    assert [_weights(i) for i in range(2)] == [0, MODEL_BYTES]
    with torch.no_grad():
        logits = model(ids.to("remote_accelerator:1")).logits
    assert logits.device == torch.device("remote_accelerator:1")
    torch.testing.assert_close(logits.cpu(), reference(ids).logits, rtol=1e-4, atol=1e-4)


def test_dtype_with_the_cluster_applies_on_the_host_and_another_device_undoes_the_deferral(cluster):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model.to("remote_accelerator", torch.float64)
    assert deferred_of(model) is not None
    assert {(p.device.type, p.dtype) for p in model.parameters()} == {("cpu", torch.float64)}
    model.to(torch.float32)  # dtype only: still deferred
    assert deferred_of(model) is not None and next(model.parameters()).dtype == torch.float32
    model.to("remote_accelerator:0")  # an index: torch's move, the deferral dropped
    assert deferred_of(model) is None and not model._forward_pre_hooks
    assert {p.device for p in model.parameters()} == {torch.device("remote_accelerator:0")}
    assert [_weights(i) for i in range(2)] == [sum(p.numel() * 4 for p in model.parameters()), 0]


@pytest.fixture
def one_node():
    node = NodeProcess()
    genie.init(server=node.address)
    yield node
    genie.shutdown()
    node.stop()


def test_with_one_node_to_remote_accelerator_uploads_to_the_current_device(one_node):
    assert RA.device_count() == 1
    model, reference = _gpt2()
    ids = _ids(4)
    model.to("remote_accelerator")
    assert deferred_of(model) is None and not model._forward_pre_hooks
    assert {p.device for p in model.parameters()} == {torch.device("remote_accelerator:0")}
    assert _weights(0) == MODEL_BYTES and RA.cluster_memory_allocated() == RA.memory_allocated(0) >= MODEL_BYTES
    with torch.no_grad():
        tokens = model.generate(ids.to("remote_accelerator"), max_new_tokens=8, do_sample=False)
        expected = reference.generate(ids, max_new_tokens=8, do_sample=False)
    assert tokens.cpu().tolist() == expected.tolist()


@pytest.mark.limit(LIMIT)
def test_a_compiled_model_on_the_cluster_runs_its_parts_on_the_nodes_the_scheduler_chose(cluster):
    # torch.compile of a model on the cluster: its first call places it (outside Dynamo's trace),
    # then Dynamo compiles it block by block (the placement's moves between nodes are graph
    # breaks), and each block's part is captured on the node the scheduler put it on.
    model, reference = _gpt2(seed=5)
    ids = _ids(5)
    model.to("remote_accelerator")
    compiled = torch.compile(model, backend="genie", dynamic=False)
    first = len(genie.compile_stats()["graphs"])
    with torch.no_grad():
        for _ in range(2):
            logits = compiled(ids.to("remote_accelerator"), use_cache=False).logits
            torch.testing.assert_close(logits.cpu(), reference(ids, use_cache=False).logits, rtol=1e-4, atol=1e-4)
    placed = placement_of(model)
    assert placed is not None and len(placed.devices()) == 2, str(placed)
    graphs = genie.compile_stats()["graphs"][first:]
    on = {g["device"] for g in graphs if any(p["engine"] == "node" for p in g["parts"])}
    assert on == {str(d) for d in placed.devices()}, graphs
    assert sum(_weights(i) for i in range(2)) == MODEL_BYTES  # each weight on one node, once
