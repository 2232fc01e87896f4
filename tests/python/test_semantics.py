"""Semantic analysis (genie.semantics) on real models traced with fake tensors: patterns,
phases, residency, costs against PyTorch's flop counter, the two-level cache and the
scheduler's group graph. Pure analysis: no genie-node, no download."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from genie.semantics import (CLIENT, AnalysisCache, GraphBuilder, Pattern, SemGraph, analyze,  # noqa: E402
                             capture, estimate_time_s, from_fx, register, to_groups, unregister, wl_hash)
from genie.semantics.cost import node_cost  # noqa: E402
from genie.semantics.graph import renumbered  # noqa: E402
from genie.semantics.patterns import Match  # noqa: E402

N_LAYER = 3


@pytest.fixture(scope="module")
def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=N_LAYER, n_embd=64, n_head=4)
    return GPT2LMHeadModel(cfg).eval()


def static_cache(model, max_len=32, batch=1):
    from transformers import StaticCache

    cfg = model.config
    cache = StaticCache(config=cfg, max_cache_len=max_len)
    cache.early_initialization(batch, cfg.n_head, cfg.n_embd // cfg.n_head, torch.float32, torch.device("cpu"))
    return cache


@pytest.fixture(scope="module")
def gpt2_steps(gpt2):
    """Prefill (6 tokens) and decode (1 token) graphs of one StaticCache, and the cache."""
    cache = static_cache(gpt2)
    prefill = capture(gpt2, torch.arange(6)[None], cache=cache, use_cache=True)
    decode = capture(gpt2, torch.tensor([[7]]), cache=cache, use_cache=True)
    return prefill, decode, cache


def fresh(graph):
    return AnalysisCache().analyze(graph)


def named_inputs(graph):
    return {graph.values[v].name: v for v in graph.inputs}


# ---- LLM: GPT-2 with a KV cache ----------------------------------------------------------------

def test_gpt2_static_cache_prefill_then_decode(gpt2_steps):
    prefill, decode, cache = gpt2_steps
    for graph, phase, q_len in ((prefill, "prefill", 6), (decode, "decode", 1)):
        ann = fresh(graph)
        assert ann.phase == phase
        assert ann.count("attention") == N_LAYER
        assert ann.count("kv_cache") == N_LAYER
        att = {m.anchor: m for m in ann.matches_of("attention")}
        inputs = named_inputs(graph)
        for layer, kv in enumerate(sorted(ann.matches_of("kv_cache"), key=lambda m: m.anchor)):
            assert kv.detail["attention"] in att                    # it feeds an attention
            assert kv.roles["key_cache"] == inputs[f"cache.layers[{layer}].keys"]
            assert kv.roles["value_cache"] == inputs[f"cache.layers[{layer}].values"]
            assert kv.detail["write"] == "index_copy_" and kv.detail["new_len"] == q_len
            assert kv.confidence >= 0.9
            a = att[kv.detail["attention"]]
            assert (a.detail["q_len"], a.detail["kv_len"], a.detail["heads"]) == (q_len, 32, 4)
        forward = [p for p, r in zip(ann.node_phases, ann.regions) if r == "forward"]
        assert set(forward) == {phase}
    # capture ran nothing on the real cache
    assert all(not layer.keys.any() and int(layer.cumulative_length) == 0 for layer in cache.layers)


def test_gpt2_residency(gpt2, gpt2_steps):
    _, decode, _ = gpt2_steps
    ann = fresh(decode)
    inputs = named_inputs(decode)
    for name, _ in gpt2.named_parameters():
        assert ann.residency[inputs[name]] == "weight", name
    for layer in range(N_LAYER):
        for which in ("keys", "values"):
            vid = inputs[f"cache.layers[{layer}].{which}"]
            assert ann.residency[vid] == "kv_cache" and ann.residency_class(vid) == 2
    logits = decode.outputs[0]
    assert decode.values[logits].shape == (1, 1, gpt2.config.vocab_size)
    assert ann.residency[logits] == "activation" and ann.residency_class(logits) == 0
    # every index_copy_ result is the cache itself
    for n in decode.nodes:
        if n.op == "aten::index_copy_":
            assert ann.residency[n.outputs[0]] == "kv_cache"


def test_gpt2_dynamic_cache_decode_uses_cat(gpt2):
    with torch.no_grad():
        past = gpt2(torch.arange(5)[None], use_cache=True).past_key_values   # a real prefill
    graph = capture(gpt2, torch.tensor([[5]]), cache=past, use_cache=True)
    ann = fresh(graph)
    kvs = ann.matches_of("kv_cache")
    assert len(kvs) == N_LAYER and {m.detail["write"] for m in kvs} == {"cat"}
    assert {m.detail["cache_len"] for m in kvs} == {5}
    assert ann.phase == "decode"
    assert all(ann.residency[m.roles["key_cache"]] == "kv_cache" for m in kvs)


def test_llama_gqa_swiglu_rmsnorm():
    """LLaMA-style blocks: grouped-query attention (query heads folded for SDPA in decode), the
    gated MLP (SwiGLU) and RMSNorm as transformers writes it (pow, mean, rsqrt, mul)."""
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1000)
    model = LlamaForCausalLM(cfg).eval()
    cache = StaticCache(config=cfg, max_cache_len=32)
    cache.early_initialization(1, 2, 16, torch.float32, torch.device("cpu"))
    for ids, phase in ((torch.arange(5)[None], "prefill"), (torch.tensor([[3]]), "decode")):
        ann = fresh(capture(model, ids, cache=cache, use_cache=True))
        assert ann.phase == phase
        assert ann.count("attention") == ann.count("kv_cache") == 2
        assert {(m.detail["heads"], m.detail["q_len"]) for m in ann.matches_of("attention")} == {(4, ids.shape[1])}
        assert {m.detail["heads"] for m in ann.matches_of("kv_cache")} == {2}
        mlps = ann.matches_of("mlp")
        assert len(mlps) == 2 and all(m.detail["gated"] and m.detail["activation"] == "silu" for m in mlps)
        assert all(sum(ann.graph.nodes[i].base == "aten::mm" for i in m.nodes) == 3 for m in mlps)
        norms = ann.matches_of("norm")
        assert len(norms) == 2 * 2 + 1 and {m.detail["kind"] for m in norms} == {"rms_norm"}


def test_export_functional_kv_cache_buffers():
    """torch.export's functional graph: index_put of a buffer it mutates (graph signature)."""
    class CachedAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(32, 32) for _ in range(3))
            self.register_buffer("kc", torch.zeros(1, 4, 16, 8))
            self.register_buffer("vc", torch.zeros(1, 4, 16, 8))

        def forward(self, x, pos):
            b, length, _ = x.shape
            q, k, v = (p(x).view(b, length, 4, 8).transpose(1, 2) for p in (self.q, self.k, self.v))
            self.kc.index_copy_(2, pos, k)
            self.vc.index_copy_(2, pos, v)
            return F.scaled_dot_product_attention(q, self.kc, self.vc)

    ep = torch.export.export(CachedAttention(), (torch.randn(1, 1, 32), torch.tensor([3]))).run_decompositions()
    graph = from_fx(ep)
    inputs = named_inputs(graph)
    assert graph.values[inputs["kc"]].mutated and graph.values[inputs["q.weight"]].kind == "weight"
    ann = fresh(graph)
    assert ann.count("attention") == 1 and ann.count("kv_cache") == 1
    assert ann.phase == "decode"
    assert ann.residency[inputs["kc"]] == ann.residency[inputs["vc"]] == "kv_cache"
    assert ann.residency[inputs["k.weight"]] == "weight" and ann.residency[inputs["x"]] == "activation"


# ---- vision: ResNet-50 ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def resnet50():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    return model, capture(model, torch.randn(2, 3, 64, 64))


def test_resnet50_convolution_blocks(resnet50):
    model, graph = resnet50
    ann = fresh(graph)
    convs = sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    blocks = ann.matches_of("conv_block")
    assert convs == 53 and len(blocks) == convs
    conv_nodes = [n.index for n in graph.nodes if n.op == "aten::convolution"]
    assert sorted(b.detail["conv"] for b in blocks) == conv_nodes
    assert all(any(graph.nodes[i].op == "aten::native_batch_norm" for i in b.nodes) for b in blocks)
    stem = blocks[0]
    assert [graph.nodes[i].base for i in stem.nodes] == [
        "aten::convolution", "aten::native_batch_norm", "aten::relu_", "aten::max_pool2d_with_indices"]
    assert stem.detail["kernel"] == (7, 7) and stem.detail["stride"] == (2, 2) and stem.confidence == 0.95
    assert ann.phase == "vision"
    inputs = named_inputs(graph)
    assert ann.residency[inputs["layer1.0.bn1.running_mean"]] == "weight"
    assert ann.residency[inputs["fc.weight"]] == "weight"
    groups = ann.to_groups()
    assert sum(g.kind == "conv_block" for g in groups.groups) == 53


# ---- MiniLM (BERT) -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def minilm_config():
    from transformers import BertConfig

    from genie.demo.models import minilm_model_dir

    return BertConfig.from_pretrained(minilm_model_dir())   # all-MiniLM-L6-v2's own architecture


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_minilm_attention_and_embeddings(minilm_config, impl):
    from transformers import BertModel

    torch.manual_seed(0)
    cfg = minilm_config
    cfg._attn_implementation = impl
    model = BertModel(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 9))
    graph = capture(model, ids, attention_mask=torch.ones_like(ids))
    ann = fresh(graph)
    layers, heads = cfg.num_hidden_layers, cfg.num_attention_heads
    assert (layers, heads) == (6, 12)
    attention = ann.matches_of("attention")
    assert len(attention) == layers
    assert {(m.detail["heads"], m.detail["q_len"], m.detail["kv_len"], m.detail["head_dim"])
            for m in attention} == {(heads, 9, 9, 32)}
    assert {m.detail["kind"] for m in attention} == {"sdpa" if impl == "sdpa" else "matmul_softmax"}
    emb = ann.matches_of("embedding")
    assert sorted(m.detail["num_embeddings"] for m in emb) == sorted(
        [cfg.vocab_size, cfg.max_position_embeddings, cfg.type_vocab_size])
    assert ann.count("mlp") == layers and {m.detail["activation"] for m in ann.matches_of("mlp")} == {"gelu"}
    assert ann.count("norm") == 2 * layers + 1
    assert ann.count("kv_cache") == 0 and ann.phase == "forward"


# ---- training: backward, optimizer, gradients ----------------------------------------------------

def small_cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10)).eval()


def sgd_step(net, x, y):
    """One SGD step: gradients by torch.func.grad, updates in place into the parameters."""
    params = dict(net.named_parameters())
    buffers = dict(net.named_buffers())

    def loss(p):
        return F.cross_entropy(torch.func.functional_call(net, {**p, **buffers}, (x,)), y)

    grads = torch.func.grad(loss)(params)
    for name, p in params.items():
        p.sub_(0.1 * grads[name])
    return grads


def test_training_step_phases_and_residency():
    net = small_cnn()
    graph = capture(sgd_step, net, torch.randn(4, 3, 8, 8), torch.tensor([1, 2, 3, 4]))
    ann = fresh(graph)
    assert ann.phase == "backward"
    by_op = {}
    for n in graph.nodes:
        by_op.setdefault(n.base, []).append(n.index)
    for i in by_op["aten::convolution_backward"] + by_op["aten::native_batch_norm_backward"]:
        assert ann.node_phases[i] == "backward"
        assert all(ann.residency[o] == "gradient" for o in graph.nodes[i].outputs)
    assert [ann.node_phases[i] for i in by_op["aten::sub_"]] == ["optimizer"] * 6
    assert ann.node_phases[by_op["aten::convolution"][0]] == "vision"
    assert ann.node_phases[by_op["aten::addmm"][0]] == "vision"   # the head of a conv net
    inputs = named_inputs(graph)
    for name, _ in net.named_parameters():
        assert ann.residency[inputs[f"args[0].{name}"]] == "weight"
    assert ann.residency[inputs["args[0].1.running_var"]] == "weight"
    assert len(graph.outputs) == 6 and all(ann.residency[o] == "gradient" for o in graph.outputs)
    relu = graph.nodes[by_op["aten::relu"][0]].outputs[0]
    assert ann.residency[relu] == "activation"
    for i in by_op["aten::sub_"]:
        assert ann.residency[graph.nodes[i].outputs[0]] == "weight"   # the updated parameter


def test_aot_autograd_forward_and_backward_graphs():
    from torch._functorch.aot_autograd import aot_function
    from functorch.compile import make_boxed_func

    graphs = {}

    def keep(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm
            return make_boxed_func(gm.forward)
        return compiler

    w1 = torch.randn(32, 16, requires_grad=True)
    w2 = torch.randn(8, 32, requires_grad=True)

    def mlp_loss(w1, w2, x):
        return F.linear(F.gelu(F.linear(x, w1)), w2).sum()

    aot_function(mlp_loss, fw_compiler=keep("fw"), bw_compiler=keep("bw"))(w1, w2, torch.randn(4, 16)).backward()
    fw = fresh(from_fx(graphs["fw"], input_kinds=["weight", "weight", "input"]))
    assert fw.phase == "forward" and fw.count("mlp") == 1
    assert fw.matches_of("mlp")[0].detail == {"activation": "gelu", "gated": False, "hidden": 16,
                                              "intermediate": 32, "tokens": 4}
    bw_graph = from_fx(graphs["bw"], backward=True)
    bw = fresh(bw_graph)
    assert bw.phase == "backward" and set(bw.node_phases) == {"backward"}
    tangent = named_inputs(bw_graph)["tangents_1"]
    assert bw_graph.values[tangent].kind == "gradient" and bw.residency[tangent] == "gradient"
    grads = [o for o in bw_graph.outputs if bw_graph.values[o].shape in ((32, 16), (8, 32))]
    assert len(grads) == 2 and all(bw.residency[o] == "gradient" for o in grads)


def test_foreach_optimizer_graph():
    ws = [torch.randn(16, 16) for _ in range(3)]
    gs = [torch.randn(16, 16) for _ in range(3)]

    def update(ws, gs):
        torch._foreach_add_(ws, gs, alpha=-0.01)

    b = capture(update, ws, gs)
    kinds = {n.base for n in b.nodes}
    assert "aten::_foreach_add_" in kinds
    ann = fresh(b)
    assert ann.phase == "optimizer" and set(ann.node_phases) == {"optimizer"}


# ---- costs --------------------------------------------------------------------------------------

def flop_counter_total(fn, *args):
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def counted_flops(graph):
    """Our FLOPs summed over the ops PyTorch's flop counter has formulas for."""
    from torch.utils.flop_counter import FlopCounterMode

    registry = {str(k).replace(".", "::", 1) for k in FlopCounterMode().flop_registry}
    registry = {r if r.startswith("aten::") else f"aten::{r}" for r in registry}
    return sum(node_cost(graph, n).flops for n in graph.nodes if n.base in registry)


@pytest.mark.parametrize("case", ["mm", "addmm", "bmm", "matmul3d", "conv", "conv_grouped", "conv_transposed",
                                  "sdpa", "sdpa_gqa"])
def test_flops_match_pytorch_flop_counter(case):
    torch.manual_seed(0)
    r = torch.randn
    fns = {
        "mm": (lambda a, b: a @ b, r(33, 17), r(17, 9)),
        "addmm": (lambda bias, a, w: F.linear(a, w, bias), r(40), r(12, 24), r(40, 24)),
        "bmm": (torch.bmm, r(3, 7, 5), r(3, 5, 11)),
        "matmul3d": (torch.matmul, r(2, 7, 5), r(5, 6)),
        "conv": (lambda x, w: F.conv2d(x, w, stride=2, padding=1), r(2, 6, 15, 13), r(10, 6, 3, 3)),
        "conv_grouped": (lambda x, w: F.conv2d(x, w, groups=3, dilation=2), r(1, 6, 12, 12), r(9, 2, 3, 3)),
        "conv_transposed": (lambda x, w: F.conv_transpose2d(x, w, stride=2), r(1, 4, 5, 5), r(4, 3, 3, 3)),
        "sdpa": (F.scaled_dot_product_attention, r(2, 3, 5, 8), r(2, 3, 11, 8), r(2, 3, 11, 8)),
        "sdpa_gqa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                     r(1, 8, 4, 16), r(1, 2, 9, 16), r(1, 2, 9, 16)),
    }
    fn, *args = fns[case]
    expected = flop_counter_total(fn, *args)
    graph = capture(fn, *args)
    assert expected > 0
    assert counted_flops(graph) == expected
    assert analyze(graph).cost().flops >= expected   # plus elementwise work the flop counter does not count


def test_backward_flops_match_pytorch_flop_counter():
    net = small_cnn()
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([1, 2, 3, 4])
    params = dict(net.named_parameters())
    buffers = dict(net.named_buffers())

    def grads(p):
        return torch.func.grad(lambda q: F.cross_entropy(torch.func.functional_call(net, {**q, **buffers}, (x,)), y))(p)

    expected = flop_counter_total(grads, params)
    graph = capture(grads, params)
    assert counted_flops(graph) == expected
    # and the SDPA backward formula
    q, k, v = (torch.randn(1, 2, 6, 8, requires_grad=True) for _ in range(3))

    def sdpa_grads(q, k, v):
        return torch.autograd.grad(F.scaled_dot_product_attention(q, k, v).sum(), (q, k, v))

    from torch._functorch.aot_autograd import aot_function
    from functorch.compile import make_boxed_func
    bw = {}

    def keep(gm, _):
        bw["g"] = gm
        return make_boxed_func(gm.forward)

    aot_function(lambda q, k, v: F.scaled_dot_product_attention(q, k, v).sum(),
                 fw_compiler=lambda gm, _: make_boxed_func(gm.forward), bw_compiler=keep)(q, k, v).backward()
    expected = flop_counter_total(sdpa_grads, q, k, v) - flop_counter_total(F.scaled_dot_product_attention, q, k, v)
    graph = from_fx(bw["g"], backward=True)
    assert sum(node_cost(graph, n).flops for n in graph.nodes if n.base.endswith("_backward")) == expected


def test_bytes_and_roofline():
    b = GraphBuilder()
    a = b.input((64, 32), "float32")
    w = b.input((32, 16), "float32", kind="weight", name="w")
    (y,) = b.op("aten::mm", [a, w], [((64, 16), "float32")])
    (t,) = b.op("aten::t", [y], [((16, 64), "float32")])
    cache = b.input((1, 4, 128, 16), "bfloat16", name="cache", mutated=True)
    pos = b.input((1,), "int64")
    new = b.input((1, 4, 1, 16), "bfloat16")
    (c,) = b.op("aten::index_copy_", [cache, pos, new], [((1, 4, 128, 16), "bfloat16")], {"dim": 2},
                writes=[cache])
    g = b.build([t, c])
    mm, view, write = (node_cost(g, n) for n in g.nodes)
    assert mm.flops == 2 * 64 * 32 * 16 and mm.bytes == (64 * 32 + 32 * 16 + 64 * 16) * 4
    assert view == (0.0, 0)
    assert write.bytes == 8 + 2 * (4 * 16 * 2)   # the index, the new row read and written, not the cache
    assert mm.intensity == pytest.approx(mm.flops / mm.bytes)
    assert estimate_time_s(1e12, 1e9, 1e12, 1e12) == pytest.approx(1.0)      # compute bound
    assert estimate_time_s(1e9, 2e12, 1e12, 1e12) == pytest.approx(2.0)      # memory bound
    with pytest.raises(ValueError):
        estimate_time_s(1.0, 1.0, 0.0, 1.0)


# ---- the cache ----------------------------------------------------------------------------------

def ring(pairs):
    """Six inputs and six `add`s of two of them each (every input read twice)."""
    b = GraphBuilder()
    xs = [b.input((4,), "float32") for _ in range(6)]
    outs = [b.op("aten::add.Tensor", [xs[i], xs[j]], [((4,), "float32")])[0] for i, j in pairs]
    return b.build(outs)


def test_wl_equivalent_but_not_isomorphic_graphs_are_not_confused():
    hexagon = ring([(i, (i + 1) % 6) for i in range(6)])
    triangles = ring([(0, 1), (1, 2), (2, 0), (3, 4), (4, 5), (5, 3)])
    assert wl_hash(hexagon) == wl_hash(triangles)   # 1-WL cannot tell them apart
    cache = AnalysisCache()
    cache.analyze(hexagon)
    cache.analyze(triangles)
    s = cache.stats()
    assert (s["l1_hits"], s["l1_misses"], s["l1_collisions"], s["structures"]) == (0, 2, 1, 2)
    cache.analyze(ring([(i, (i + 1) % 6) for i in range(6)]))
    cache.analyze(ring([(3, 4), (4, 5), (5, 3), (0, 1), (1, 2), (2, 0)]))
    assert cache.stats()["l1_hits"] == 2 and cache.stats()["structures"] == 2


def test_cache_serves_reordered_graph_from_level1(gpt2_steps):
    _, decode, _ = gpt2_steps
    shuffled, order, new_ids = renumbered(decode, seed=1)
    assert order != list(range(len(decode.nodes)))
    assert wl_hash(shuffled) == wl_hash(decode)
    cache = AnalysisCache()
    base = cache.analyze(decode)
    other = cache.analyze(shuffled)
    s = cache.stats()
    assert (s["l1_hits"], s["l2_hits"], s["structures"]) == (1, 1, 1)
    position = {old: new for new, old in enumerate(order)}   # decode's node index -> shuffled's
    expected = sorted((m.pattern, tuple(sorted(position[i] for i in m.nodes)),
                       tuple(sorted((k, new_ids[v]) for k, v in m.roles.items()))) for m in base.matches)
    got = sorted((m.pattern, tuple(m.nodes), tuple(sorted(m.roles.items()))) for m in other.matches)
    assert got == expected
    assert other.phase == "decode" and other.cost() == base.cost()
    assert {new_ids[v]: c for v, c in base.residency.items()} == other.residency
    assert [other.node_phases[position[i]] for i in range(len(order))] == list(base.node_phases)


def test_cache_levels_and_shape_details(gpt2):
    cache = AnalysisCache()
    kv = static_cache(gpt2, max_len=24)
    g1 = capture(gpt2, torch.arange(4)[None], cache=kv, use_cache=True)
    g2 = capture(gpt2, torch.arange(9)[None], cache=kv, use_cache=True)
    g3 = capture(gpt2, torch.arange(9)[None], cache=kv, use_cache=True)
    a1, a2, a3 = (cache.analyze(g) for g in (g1, g2, g3))
    s = cache.stats()
    assert (s["l1_misses"], s["l1_hits"], s["l2_misses"], s["l2_hits"]) == (1, 2, 2, 1)
    assert a1.structural_hash == a2.structural_hash and a1.shape_hash != a2.shape_hash == a3.shape_hash
    assert {m.detail["q_len"] for m in a1.matches_of("attention")} == {4}
    assert {m.detail["q_len"] for m in a2.matches_of("attention")} == {9}
    assert a2.cost().flops > a1.cost().flops and a3.cost() == a2.cost()
    lat = s["latency"]
    assert lat["hit"]["n"] == 1 and lat["l1_hit_l2_miss"]["n"] == 1 and lat["miss"]["n"] == 1
    assert lat["hit"]["mean_us"] < lat["miss"]["mean_us"]


# ---- groups for the scheduler -------------------------------------------------------------------

def test_to_groups_for_a_decode_step(gpt2, gpt2_steps):
    _, decode, _ = gpt2_steps
    ann = fresh(decode)
    gg = to_groups(ann)
    assert gg is not None and ann.to_groups().groups == gg.groups
    ops = sorted(i for g in gg.groups for i in g.ops)
    assert ops == list(range(len(decode.nodes)))                       # a partition of the ops
    assert gg.total_flops() == pytest.approx(ann.cost().flops)
    assert [g.id for g in gg.groups] == list(range(len(gg.groups)))
    for e in gg.edges:                                                    # a topological order
        assert e.src == CLIENT or e.dst == CLIENT or e.src < e.dst
        assert e.nbytes > 0
    attention = [g for g in gg.groups if g.kind == "attention"]
    kv = [g for g in gg.groups if g.kind == "kv_cache"]
    assert len(attention) == len(kv) == N_LAYER
    for layer, (a, k) in enumerate(zip(attention, kv)):
        names = {f"cache.layers[{layer}].keys", f"cache.layers[{layer}].values"}
        assert names <= set(a.state) and names <= set(k.state)          # co-location by state name
        assert a.phase == "decode"
    weights = {n for g in gg.groups for n in g.weights}
    assert weights == {n for n, _ in gpt2.named_parameters()}
    pairs = {(e.src, e.dst) for e in gg.edges}
    assert not any((k.id, a.id) in pairs for k, a in zip(kv, attention))   # the cache does not travel
    logits = decode.values[decode.outputs[0]].nbytes
    assert sum(e.nbytes for e in gg.edges if e.dst == CLIENT) == logits
    assert sum(e.nbytes for e in gg.edges if e.src == CLIENT) == 8           # the token id


# ---- extension and builders ---------------------------------------------------------------------

class ResidualAdd(Pattern):
    name = "residual_add"
    ops = frozenset({"aten::add"})

    def match(self, graph):
        out = []
        for n in graph.nodes:   # structure only (ops, kinds, ranks): shapes belong in `describe`
            ranks = {len(graph.values[i].shape) for i in n.inputs}
            if n.base == "aten::add" and len(n.inputs) == 2 and ranks == {3}:
                out.append(Match(self.name, 0.5, (n.index,), {"out": n.outputs[0]}, {}))
        return out


def test_register_a_pattern(gpt2_steps):
    _, decode, _ = gpt2_steps
    assert analyze(decode).count("residual_add") == 0
    register(ResidualAdd())
    try:
        with pytest.raises(ValueError):
            register(ResidualAdd())
        ann = analyze(decode)   # the registry changed: not served from before
        adds = [n.index for n in decode.nodes if n.op == "aten::add.Tensor" and len(n.inputs) == 2
                and all(len(decode.values[i].shape) == 3 for i in n.inputs)]
        assert sorted(m.anchor for m in ann.matches_of("residual_add")) == adds and len(adds) >= 2 * N_LAYER
    finally:
        unregister("residual_add")
    assert analyze(decode).count("residual_add") == 0


def test_from_nodes_and_errors():
    g = SemGraph.from_nodes(
        [{"op": "aten::addmm", "inputs": [10, 11, 12], "outputs": [20]},
         {"op": "aten::relu", "inputs": [20], "outputs": [21]}],
        {10: {"shape": (8,), "kind": "weight", "name": "b"}, 11: {"shape": (4, 16)},
         12: {"shape": (16, 8), "kind": "weight", "name": "w"}, 20: {"shape": (4, 8)}, 21: {"shape": (4, 8)}},
        outputs=[21])
    assert [n.op for n in g.nodes] == ["aten::addmm", "aten::relu"] and g.inputs == (10, 11, 12)
    assert node_cost(g, g.nodes[0]).flops == 2 * 4 * 16 * 8
    with pytest.raises(ValueError, match="not defined"):
        GraphBuilder().op("aten::relu", [5], [((2,), "float32")])        # nodes come in program order
    with pytest.raises(ValueError, match="pass it as an argument"):
        capture(lambda x: x + GLOBAL, torch.randn(3))                     # a global tensor is not found
    with pytest.raises(ValueError, match="meta"):
        from_fx(torch.fx.symbolic_trace(torch.nn.Linear(3, 3)))          # no shapes without fake tensors


GLOBAL = torch.randn(3)
