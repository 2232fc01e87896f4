"""genie.explain: a program's steps analysed (patterns, phases, residency, costs) and scheduled.

Real models (HuggingFace GPT-2 and BERT built from small configs, random weights), the
embedded genie-node for the recorded path; the captured path runs nothing."""
from __future__ import annotations

import json

import pytest
import torch

import genie
from genie.scheduler import Cluster, NodeSpec

DEV = "remote_accelerator:0"
N_LAYER = 2


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=N_LAYER, n_embd=64, n_head=4, vocab_size=100, n_positions=64)).eval()


PROMPT = torch.tensor([[5, 17, 42, 8, 33, 1]])


@torch.no_grad()
def _generate(model, device, tokens):
    return model.generate(PROMPT.to(device), attention_mask=torch.ones_like(PROMPT).to(device),
                          max_new_tokens=tokens, do_sample=False, eos_token_id=None, pad_token_id=0)


def test_gpt2_generate_shows_prefill_then_decode_with_a_kv_cache_and_attention_in_every_layer():
    cpu = _gpt2()
    expected = _generate(cpu, "cpu", 5)
    remote = _gpt2().to(DEV)
    got = []
    report = genie.explain(lambda: got.append(_generate(remote, DEV, 5).cpu()))
    assert torch.equal(got[0], expected)  # explaining runs the program as it is
    assert report.mode == "recorded" and not report.errors
    model_steps = [s for s in report.steps if s.annotated.count("attention")]
    assert [s.annotated.phase for s in model_steps] == ["prefill"] + ["decode"] * 4
    for step in model_steps:
        assert step.annotated.count("attention") == N_LAYER
        assert step.annotated.count("kv_cache") == N_LAYER
        assert step.annotated.count("mlp") == N_LAYER
    # Residency: the parameters the step reads are weights (all of them: tied embeddings once),
    # the caches the decode step carries are KV caches, the logits an activation.
    decode = model_steps[-1]
    g, a = decode.graph, decode.annotated
    weight_bytes = sum(g.values[v].nbytes for v, cls in a.residency.items() if cls == "weight" and g.values[v].producer < 0)
    assert weight_bytes == sum(p.numel() * p.element_size() for p in cpu.parameters())
    caches = {m.roles["key_cache"] for m in a.matches_of("kv_cache")} | {m.roles["value_cache"] for m in a.matches_of("kv_cache")}
    assert len(caches) == 2 * N_LAYER and all(a.residency[v] == "kv_cache" for v in caches)
    assert all(cls == "activation" for v, cls in a.residency.items() if g.values[v].shape == (1, 1, 100))
    text = str(report)
    assert "prefill" in text and "decode" in text and "kv_cache 2" in text
    # Scheduled on the node it ran on, measured: every group there.
    assert set(report.schedule.placement.values()) == {"remote_accelerator:0"}


def _kv_bytes() -> int:
    return genie.memory_stats(DEV)["resident"].get("StatefulKvCache", 0)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@torch.no_grad()
def test_the_kv_caches_a_program_keeps_are_resident_as_kv_caches_on_the_node(cache):
    # The KV-cache pattern marks them on the wire (residency StatefulKvCache): the node counts
    # exactly the bytes of the caches generate() returns under that class, nothing else.
    model = _gpt2().to(DEV)
    before = _kv_bytes()
    out = model.generate(PROMPT.to(DEV), attention_mask=torch.ones_like(PROMPT).to(DEV), max_new_tokens=4,
                         do_sample=False, eos_token_id=None, pad_token_id=0, return_dict_in_generate=True,
                         cache_implementation=None if cache == "dynamic" else "static")
    layers = out.past_key_values.layers
    assert len(layers) == N_LAYER
    expected = sum(t.numel() * t.element_size() for layer in layers for t in (layer.keys, layer.values))
    assert expected > 0 and _kv_bytes() - before == expected
    del out, layers
    assert _kv_bytes() == before  # freed with the caches


def test_the_connected_cluster_is_measured():
    from genie.scheduler import connected_cluster
    cluster = connected_cluster()
    (node,) = cluster.nodes
    free, total = torch.remote_accelerator.mem_get_info(0)
    assert node.name == "remote_accelerator:0" and node.memory_limit == total and node.device == "cpu"
    assert 1e8 < node.flops_per_s < 1e13 and 1e8 < node.bytes_per_s < 1e12  # a CPU core's range, measured
    link = cluster.link("client", "remote_accelerator:0")
    assert 0 < link.latency_s < 0.05 and link.bytes_per_s > 1e7
    again = connected_cluster().nodes[0]  # rates measured once per process; free memory read each time
    assert (again.flops_per_s, again.bytes_per_s) == (node.flops_per_s, node.bytes_per_s)


def test_a_cpu_module_is_analysed_as_if_remote_without_running(tmp_path):
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    bert = BertModel(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                vocab_size=100)).eval()
    ids = torch.tensor([[1, 5, 7, 9, 2]])
    before = genie.client_stats()["round_trips"]
    report = genie.explain(bert, ids)
    assert genie.client_stats()["round_trips"] == before  # nothing ran on a node
    assert report.mode == "captured" and len(report.steps) == 1
    (step,) = report.steps
    assert step.annotated.phase == "forward"
    assert step.annotated.count("attention") == 2 and step.annotated.count("embedding") == 3
    data = json.loads(report.write_json(tmp_path / "bert.json").read_text())
    assert data["steps"][0]["phase"] == "forward" and data["steps"][0]["flops"] > 0
    assert {m["pattern"] for m in data["steps"][0]["matches"]} >= {"attention", "embedding", "mlp", "norm"}
    dot = report.write_dot(tmp_path / "bert.dot").read_text()
    assert dot.startswith('digraph "forward"') and dot.count("[attention]") >= 2


def test_with_a_cluster_the_largest_step_is_scheduled():
    cluster = Cluster([NodeSpec("a", "cpu", 1 << 30, 1 << 30, 1e11, 1e10), NodeSpec("b", "cpu", 1 << 30, 1 << 30, 2e11, 2e10)])
    report = genie.explain(_gpt2(), PROMPT, cluster=cluster)
    groups = report.largest().annotated.to_groups()
    assert report.schedule is not None and set(report.schedule.placement) == {g.id for g in groups.groups}
    assert set(report.schedule.placement.values()) <= {"a", "b"}
    assert "schedule for latency" in str(report)


def test_the_programs_error_is_raised_and_nothing_keeps_watching():
    from genie import runtime
    x = torch.ones(2, 3).to(DEV)

    def wrong_shapes():
        return (x @ torch.ones(2, 3).to(DEV)).cpu()

    with pytest.raises(RuntimeError, match="aten::mm"):
        genie.explain(wrong_shapes)
    assert runtime._cut_observer is None
    assert torch.equal((x + 1).cpu(), torch.full((2, 3), 2.0))  # the device works on
