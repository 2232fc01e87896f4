"""genie.scheduler: placement of GroupGraphs on clusters (docs/scheduler.md). No genie-node needed:
graphs and clusters are built by hand, the cost model is the scheduler's own."""
from __future__ import annotations

import random

import pytest

from genie.scheduler import (CLIENT_NAME, Cluster, Link, NodeSpec, PlacementError, apply_schedule, calibrate_link,
                             calibrate_node, check_schedule, compute_s, evaluate, fit_hockney, greedy_by_memory,
                             name_sizes, round_robin, schedule, schedule_disaggregated, simulated)
from genie.scheduler.placement import CostArrays
from genie.semantics.groups import CLIENT, Edge, Group, GroupGraph

GB = 10 ** 9


# --- graphs and clusters built by hand -------------------------------------------------------------------------------

class _Builder:
    """Appends groups in topological order; `add` returns the new group's id."""

    def __init__(self, phase: str):
        self.phase, self.groups, self.edges = phase, [], []

    def add(self, kind, flops, accessed, weights=(), weight_bytes=0, state=(), state_bytes=0, act=0, inputs=()):
        gid = len(self.groups)
        self.groups.append(Group(gid, kind, self.phase, (gid,), float(flops), int(accessed), tuple(weights),
                                 int(weight_bytes), tuple(state), int(state_bytes), int(act)))
        self.edges += [Edge(src, gid, int(nbytes)) for src, nbytes in inputs]
        return gid

    def graph(self) -> GroupGraph:
        return GroupGraph(self.groups, self.edges)


def transformer(layers, d=256, seq=128, ctx=None, vocab=4096, phase="prefill", prefix="", tied=True) -> GroupGraph:
    """embedding -> layers x (kv_cache + attention sharing state "kv.i", mlp) -> head (tied to the
    embedding's "wte" when `tied`). float32; seq: tokens this run; ctx: tokens in the cache."""
    b, ctx = _Builder(phase), ctx or seq
    hid, emb = seq * d * 4, vocab * d * 4
    x = b.add("embedding", seq * d, seq * d * 4 + hid, [prefix + "wte"], emb, act=hid, inputs=[(CLIENT, seq * 8)])
    for i in range(layers):
        attn_w, mlp_w, kv = 16 * d * d, 32 * d * d, 2 * ctx * d * 4
        cache = b.add("kv_cache", 2 * seq * d, kv + hid, state=[f"{prefix}kv.{i}"], state_bytes=kv, act=hid,
                      inputs=[(x, hid)])
        attn = b.add("attention", 8 * seq * d * d + 4 * seq * ctx * d, attn_w + kv + 2 * hid, [f"{prefix}h.{i}.attn"],
                     attn_w, [f"{prefix}kv.{i}"], kv, act=3 * hid, inputs=[(x, hid), (cache, kv)])
        x = b.add("mlp", 16 * seq * d * d, mlp_w + 2 * hid, [f"{prefix}h.{i}.mlp"], mlp_w, act=4 * hid,
                  inputs=[(attn, hid)])
    head = prefix + ("wte" if tied else "lm_head")
    out = b.add("ops", 2 * seq * d * vocab, emb + seq * vocab * 4, [head], emb, act=seq * vocab * 4, inputs=[(x, hid)])
    b.edges.append(Edge(out, CLIENT, seq * vocab * 4))
    return b.graph()


def vision(blocks=6, channels=64, hw=56, branches=1) -> GroupGraph:
    """stem -> blocks x (`branches` parallel conv_blocks joined by an "ops" concat) -> head."""
    b = _Builder("vision")
    act = channels * hw * hw * 4
    x = b.add("conv_block", 2 * 9 * 3 * channels * hw * hw, act + 3 * hw * hw * 4, ["stem"], 9 * 3 * channels * 4,
              act=act, inputs=[(CLIENT, 3 * hw * hw * 4)])
    for i in range(blocks):
        w = 9 * channels * channels * 4
        outs = [b.add("conv_block", 2 * 9 * channels * channels * hw * hw, w + 2 * act, [f"block{i}.{j}"], w, act=act,
                      inputs=[(x, act)]) for j in range(branches)]
        x = outs[0] if branches == 1 else b.add("ops", act * branches, 2 * act * branches, act=act,
                                                 inputs=[(o, act) for o in outs])
    head = b.add("ops", 2 * channels * 1000, channels * 1000 * 4 + act, ["fc"], channels * 1000 * 4, act=4000,
                 inputs=[(x, act)])
    b.edges.append(Edge(head, CLIENT, 4000))
    return b.graph()


def node(name, flops, bandwidth, memory, device="cuda", free=None, resident=()):
    return NodeSpec(name, device, memory, memory if free is None else free, flops, bandwidth, frozenset(resident))


def cluster(*nodes, client_bw=25e9, client_lat=10e-6, links=()):
    return Cluster(tuple(nodes), tuple(Link(CLIENT_NAME, n.name, client_bw, client_lat) for n in nodes) + tuple(links))


def model_bytes(graph):
    return sum(name_sizes(graph).values())


def placed_on(graph, sched, name):
    """The nodes running groups that read weight/state `name`."""
    return {sched.placement[g.id] for g in graph.groups if name in g.weights + g.state}


def unequal3(memory=64 * GB):
    """An unequal 3-node cluster: a fast GPU, a slower GPU, a CPU; nodes linked at 50 GB/s."""
    fast, slow, cpu = (node("fast", 200e12, 2e12, memory), node("slow", 50e12, 0.8e12, memory),
                       node("cpu", 2e12, 0.1e12, 4 * memory, device="cpu"))
    links = tuple(Link(a, b, 50e9, 3e-6) for a, b in (("fast", "slow"), ("fast", "cpu"), ("slow", "cpu")))
    return cluster(fast, slow, cpu, links=links)


# --- the cost model ------------------------------------------------------------------------------------------------

def test_link_lookup_uses_listed_links_else_the_slower_network_interface():
    c = cluster(node("a", 1e12, 1e11, GB), node("b", 1e12, 1e11, GB), node("c", 1e12, 1e11, GB),
                links=(Link("a", "b", 100e9, 2e-6),))
    c = Cluster(c.nodes, c.links[:2] + (Link(CLIENT_NAME, "c", 1e9, 80e-6),) + c.links[3:])
    assert c.link("b", "a").bytes_per_s == 100e9                     # listed, either order
    est = c.link("a", "c")                                           # not listed: the slower interface
    assert (est.bytes_per_s, est.latency_s) == (1e9, 80e-6)
    assert c.transfer_s("a", "a", 10 ** 9) == 0.0
    assert c.transfer_s("a", "c", 10 ** 6) == pytest.approx(80e-6 + 1e-3)
    bare = Cluster((node("x", 1e12, 1e11, GB),))                     # no client link: the stated default
    assert bare.link(CLIENT_NAME, "x").bytes_per_s == bare.default_bytes_per_s
    with pytest.raises(KeyError):
        c.link("a", "nope")


def test_the_cost_arrays_agree_with_the_cluster_link_rule():
    c = simulated(40, seed=3, rack_size=8)
    costs = CostArrays(GroupGraph([], []), c)
    rng = random.Random(0)
    for _ in range(200):
        i, j = rng.randrange(40), rng.randrange(40)
        expected = c.transfer_s(c.nodes[i].name, c.nodes[j].name, 12345)
        assert costs.arrival(i, 12345)[j] == pytest.approx(expected, rel=1e-12)


def test_evaluate_matches_a_hand_computed_two_node_run():
    b = _Builder("forward")
    g0 = b.add("ops", 1e12, 0, inputs=[(CLIENT, 1000)])       # 1 s on a, 2 s on b
    g1 = b.add("ops", 4e12, 0, inputs=[(g0, 2 * 10 ** 9)])    # 4 s on a, 8 s on b
    b.edges.append(Edge(g1, CLIENT, 10 ** 9))
    c = cluster(node("a", 1e12, 1e12, GB), node("b", 0.5e12, 1e12, GB), client_bw=1e9, client_lat=0.5,
                links=(Link("a", "b", 1e9, 0.25),))
    s = evaluate(b.graph(), c, {g0: "a", g1: "b"})
    # in: 0.5 + 1e-6; g0 ends 1.500001; a->b: 0.25 + 2 s; g1 runs 8 s; out: 0.5 + 1 s
    assert s.finish_s[g0] == pytest.approx(1.500001)
    assert s.start_s[g1] == pytest.approx(3.750001)
    assert s.estimated_s == pytest.approx(3.750001 + 8 + 1.5)
    assert s.period_s == pytest.approx(8.0)                   # b's compute; links carry 1e-6, 2, 1 s
    assert [t.kind for t in s.transfers] == ["input", "activation", "output"]
    assert [[(p.group, p.node, p.strategy) for p in st] for st in s.stages] == [[(0, "a", "sequential")],
                                                                               [(1, "b", "sequential")]]


def test_name_sizes_split_a_groups_total_between_its_names():
    b = _Builder("forward")
    b.add("ops", 1, 1, ["w1"], 100)
    b.add("ops", 1, 1, ["w1", "w2", "w3"], 700)               # w1 known: 600 left for w2, w3
    b.add("ops", 1, 1, state=["kv"], state_bytes=50)
    assert name_sizes(b.graph()) == {"w1": 100, "w2": 300, "w3": 300, "kv": 50}


def test_bad_inputs_are_refused_and_an_empty_graph_gives_an_empty_schedule():
    c = unequal3()
    ok = Group(0, "ops", "forward", (0,), 1.0, 1)
    with pytest.raises(ValueError, match="topological"):
        schedule(GroupGraph([ok, Group(1, "ops", "forward", (1,), 1.0, 1)], [Edge(1, 0, 8)]), c)
    with pytest.raises(ValueError, match="ids must be the indices"):
        schedule(GroupGraph([Group(3, "ops", "forward", (0,), 1.0, 1)], []), c)
    with pytest.raises(ValueError, match="goal"):
        schedule(GroupGraph([ok], []), c, goal="fast")
    with pytest.raises(ValueError, match="memory_free"):
        NodeSpec("x", "cuda", 10, 20, 1e12, 1e11)
    empty = schedule(GroupGraph([], []), c)
    assert (empty.placement, empty.stages, empty.transfers, empty.estimated_s) == ({}, [], [], 0.0)


# --- constraints ---------------------------------------------------------------------------------------------------

def test_a_group_goes_where_it_fits_and_a_group_too_big_everywhere_names_itself():
    b = _Builder("forward")
    small = b.add("ops", 1e9, 1e6, ["small"], 10 ** 6, inputs=[(CLIENT, 100)])
    big = b.add("mlp", 1e9, 1e6, ["big"], 3 * GB, act=10 ** 6, inputs=[(small, 100)])
    g = b.graph()
    c = cluster(node("fast", 100e12, 1e12, 2 * GB), node("roomy", 1e12, 1e11, 8 * GB, device="cpu"))
    s = schedule(g, c)
    assert s.placement == {small: "fast", big: "roomy"}       # fast is faster, but big does not fit there
    check_schedule(g, c, s)
    tight = cluster(node("fast", 100e12, 1e12, 2 * GB), node("roomy", 1e12, 1e11, 3 * GB, free=GB, device="cpu"))
    with pytest.raises(PlacementError) as err:
        schedule(g, tight)
    msg = str(err.value)
    assert isinstance(err.value, RuntimeError)
    assert f"group {big} (mlp, forward)" in msg and f"{3 * GB + 10 ** 6} B" in msg
    assert f"largest free memory is {2 * GB} B on 'fast'" in msg


def test_shared_weights_run_on_one_node_under_memory_pressure():
    g = transformer(8)
    total = model_bytes(g)
    c = cluster(node("a", 100e12, 2e12, int(0.55 * total)), node("b", 100e12, 2e12, int(0.55 * total)),
                node("c", 20e12, 1e12, int(0.55 * total)))
    for goal in ("latency", "throughput"):
        s = schedule(g, c, goal)
        check_schedule(g, c, s)
        assert len(s.nodes()) >= 2
        assert len(placed_on(g, s, "wte")) == 1                # embedding and tied head together
        assert s.placement[0] == s.placement[len(g.groups) - 1]


def test_every_kv_cache_runs_with_its_attention():
    g = transformer(6)
    c = unequal3(memory=int(model_bytes(g) * 0.4))
    s = schedule(g, c)
    check_schedule(g, c, s)
    caches = [grp for grp in g.groups if grp.kind == "kv_cache"]
    assert len(caches) == 6
    for cache in caches:
        attention = next(grp for grp in g.groups if grp.kind == "attention" and grp.state == cache.state)
        assert s.placement[cache.id] == s.placement[attention.id]


def test_resident_weights_pin_their_readers_and_cost_no_new_memory():
    g = transformer(2)
    attn = next(grp for grp in g.groups if "h.1.attn" in grp.weights)
    c = cluster(node("fast", 200e12, 2e12, 64 * GB), node("slow", 20e12, 0.5e12, 64 * GB, resident={"h.1.attn"}))
    s = schedule(g, c)
    check_schedule(g, c, s)
    assert s.placement[attn.id] == "slow"
    assert s.placement[attn.id - 1] == "slow"                 # its kv cache follows it
    assert "h.1.attn" not in s.residency.get("fast", frozenset())
    sizes = name_sizes(g)                                     # the resident weight is not counted again:
    assert s.resident_bytes["slow"] == sum(sizes[x] for x in s.residency["slow"]) - sizes["h.1.attn"]
    with pytest.raises(PlacementError, match="cannot run on one node"):
        schedule(g, cluster(node("a", 1e12, 1e11, 64 * GB, resident={"h.0.attn"}),
                            node("b", 1e12, 1e11, 64 * GB, resident={"kv.0"})))


def test_pinned_groups_stay_and_bad_pins_are_refused():
    g = transformer(3)
    c = unequal3()
    s = schedule(g, c, pinned={4: "cpu"})
    check_schedule(g, c, s, pinned={4: "cpu"})
    assert s.placement[4] == "cpu" and s.placement[5] == "cpu"  # 4 and 5: a kv cache and its attention
    assert schedule(g, c).placement[4] == "fast"
    with pytest.raises(ValueError):
        schedule(g, c, pinned={4: "nowhere"})
    with pytest.raises(PlacementError, match="cannot run on one node"):
        schedule(g, c, pinned={4: "cpu", 5: "slow"})


def test_check_schedule_catches_each_broken_rule():
    g = transformer(2)
    c = unequal3(memory=int(model_bytes(g) * 0.6))
    good = schedule(g, c)
    check_schedule(g, c, good)
    split = dict(good.placement)
    split[2] = "cpu" if split[2] != "cpu" else "slow"           # attention away from its cache
    with pytest.raises(PlacementError, match="'kv.0' is on"):
        check_schedule(g, c, evaluate(g, c, split))
    crammed = evaluate(g, c, {grp.id: "fast" for grp in g.groups})
    with pytest.raises(PlacementError, match="'fast' needs"):
        check_schedule(g, c, crammed)


# --- scenario 1: a model larger than one node ---------------------------------------------------------------------

def test_a_model_larger_than_a_node_is_split_into_stages_by_cost():
    g = transformer(16, d=512, seq=512)
    total = model_bytes(g)
    nodes = [node(f"n{i}", 10e12, 1e12, int(0.75 * total)) for i in range(2)]
    c = cluster(*nodes, client_bw=100e9, client_lat=2e-6, links=(Link("n0", "n1", 100e9, 2e-6),))
    one_node = sum(compute_s(grp, nodes[0]) for grp in g.groups)
    for goal in ("latency", "throughput"):
        s = schedule(g, c, goal)
        check_schedule(g, c, s)
        assert len(s.stages) >= 2 and len(s.nodes()) == 2
        names = {x for grp in g.groups for x in grp.weights + grp.state}
        assert all(len(placed_on(g, s, x)) == 1 for x in names)         # no weight or cache on two nodes
        for n in s.nodes():
            assert s.memory_bytes[n] <= c.node(n).memory_free
    pipe = schedule(g, c, "throughput")
    assert pipe.algorithm == "pipeline-partition"
    assert all(p.strategy == "pipeline" for st in pipe.stages for p in st)
    # balanced by cost: filling the first node up to its memory would leave ~75 % of the work on it
    assert pipe.period_s < 0.6 * one_node
    assert pipe.period_s <= schedule(g, c, "latency").period_s


# --- scenario 2: disaggregated prefill and decode --------------------------------------------------------------------

def test_prefill_goes_to_compute_decode_to_bandwidth_and_each_cache_moves_once():
    layers = 4
    prefill = transformer(layers, d=512, seq=512, phase="prefill")
    decode = transformer(layers, d=512, seq=1, ctx=512, phase="decode")
    c = cluster(node("bandwidth", 100e12, 4e12, 64 * GB), node("compute", 400e12, 1e12, 64 * GB),
                links=(Link("compute", "bandwidth", 50e9, 3e-6),))
    d = schedule_disaggregated(prefill, decode, c, decode_steps=32)
    assert (d.prefill_node, d.decode_node) == ("compute", "bandwidth")
    assert set(d.prefill.placement.values()) == {"compute"} and set(d.decode.placement.values()) == {"bandwidth"}
    assert sorted(t.name for t in d.kv_transfers) == sorted(f"kv.{i}" for i in range(layers))
    sizes = name_sizes(prefill)
    for t in d.kv_transfers:
        assert (t.src_node, t.dst_node, t.kind) == ("compute", "bandwidth", "kv_cache")
        assert t.nbytes == sizes[t.name] and t.seconds == pytest.approx(3e-6 + t.nbytes / 50e9)
    assert d.estimated_s == pytest.approx(d.prefill.estimated_s + sum(t.seconds for t in d.kv_transfers)
                                          + 32 * d.decode.estimated_s)
    assert "KV cache transfer" in d.explain()
    # swapped capabilities swap the nodes
    swapped = cluster(node("bandwidth", 400e12, 1e12, 64 * GB), node("compute", 100e12, 4e12, 64 * GB))
    d2 = schedule_disaggregated(prefill, decode, swapped)
    assert (d2.prefill_node, d2.decode_node) == ("bandwidth", "compute")
    # one node able to hold the phases: both there, nothing moves
    only = cluster(node("big", 100e12, 2e12, 64 * GB), node("tiny", 400e12, 4e12, GB // 100))
    d3 = schedule_disaggregated(prefill, decode, only)
    assert (d3.prefill_node, d3.decode_node, d3.kv_transfers) == ("big", "big", [])


# --- scenario 3: two clients' models --------------------------------------------------------------------------------

def test_two_clients_models_share_a_cluster_without_exceeding_memory():
    a, b = transformer(6, prefix="a/"), transformer(6, prefix="b/")
    size = model_bytes(a)
    c = cluster(node("fast", 200e12, 2e12, int(1.3 * size)), node("mid", 100e12, 1.5e12, int(1.3 * size)),
                node("slow", 20e12, 0.5e12, int(1.3 * size)))
    first = schedule(a, c)
    check_schedule(a, c, first)
    assert first.nodes() == ["fast"]
    after = apply_schedule(c, first)
    assert after.node("fast").memory_free == c.node("fast").memory_free - first.resident_bytes["fast"]
    assert after.node("fast").resident >= {"a/wte", "a/kv.0"}
    second = schedule(b, after)
    check_schedule(b, after, second)
    assert schedule(b, c).nodes() == ["fast"]                  # on the empty cluster it would all go there,
    assert len(second.nodes()) > 1                             # but the first model's weights left too little
    assert second.memory_bytes.get("fast", 0) <= after.node("fast").memory_free
    for n in c.nodes:
        used = (first.memory_bytes.get(n.name, 0) - _activations(a, first, n.name)
                + second.memory_bytes.get(n.name, 0))
        assert used <= n.memory_free
    for graph, sched in ((a, first), (b, second)):
        for grp in graph.groups:
            if grp.kind == "kv_cache":
                assert sched.placement[grp.id] == sched.placement[grp.id + 1]  # its attention
    final = apply_schedule(after, second)
    assert all(n.memory_free >= 0 for n in final.nodes)


def _activations(graph, sched, node_name):
    return sum(g.activation_bytes for g in graph.groups if sched.placement[g.id] == node_name)


# --- against the baselines, determinism, scale ------------------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: transformer(6), lambda: vision(6), lambda: vision(4, branches=3)])
def test_on_an_unequal_cluster_the_scheduler_beats_or_ties_the_baselines(make):
    g = make()
    c = unequal3()
    for goal in ("latency", "throughput"):
        s = schedule(g, c, goal)
        check_schedule(g, c, s)
        for baseline in (round_robin(g, c, goal), greedy_by_memory(g, c, goal)):
            check_schedule(g, c, baseline)
            assert s.objective() <= baseline.objective()
    rr = round_robin(g, c)
    assert len(rr.nodes()) == 3 and schedule(g, c).estimated_s < rr.estimated_s
    assert set(greedy_by_memory(g, c).nodes()) == {"cpu"}     # the most memory: the cpu node


def test_independent_branches_run_in_parallel_on_two_fast_nodes():
    g = vision(2, channels=256, hw=56, branches=2)
    c = cluster(node("g1", 50e12, 2e12, 64 * GB), node("g2", 50e12, 2e12, 64 * GB), client_bw=50e9,
                links=(Link("g1", "g2", 200e9, 2e-6),))
    s = schedule(g, c)
    check_schedule(g, c, s)
    assert {s.placement[1], s.placement[2]} == {"g1", "g2"}
    assert any(p.strategy == "parallel" for st in s.stages for p in st)
    serial = evaluate(g, c, {grp.id: "g1" for grp in g.groups})
    assert s.estimated_s < serial.estimated_s


def test_the_schedule_is_deterministic():
    g = transformer(10)
    c = simulated(50, seed=7)
    for goal in ("latency", "throughput"):
        one, two = schedule(g, c, goal), schedule(g, c, goal)
        assert one.placement == two.placement and one.order == two.order
        assert one.estimated_s == two.estimated_s and one.explain() == two.explain()
    assert simulated(50, seed=7) == c and simulated(50, seed=8) != c


def test_a_500_group_graph_on_a_1000_node_simulated_cluster():
    g = transformer(166, d=1024, seq=1024)
    assert len(g.groups) == 500
    c = simulated(1000, seed=1)
    for goal in ("latency", "throughput"):
        s = schedule(g, c, goal)
        check_schedule(g, c, s)
        assert s.objective() <= round_robin(g, c, goal).objective()
        assert sorted(s.order) == list(range(500)) and s.estimated_s > 0


def test_the_worked_example_of_the_docs():
    """docs/scheduler.md, "A worked example": the numbers computed there by hand."""
    b = _Builder("prefill")
    emb = b.add("embedding", 1e9, 2e8, ["wte"], 2 * 10 ** 8, act=10 ** 6, inputs=[(CLIENT, 1000)])
    attn = b.add("attention", 4e11, 6e8, ["attn"], 4 * 10 ** 8, ["kv"], 2 * 10 ** 8, act=4 * 10 ** 6,
                 inputs=[(emb, 10 ** 6)])
    mlp = b.add("mlp", 2e11, 8e8, ["mlp"], 8 * 10 ** 8, act=4 * 10 ** 6, inputs=[(attn, 10 ** 6)])
    head = b.add("ops", 4e11, 2e8, ["wte"], 2 * 10 ** 8, act=10 ** 6, inputs=[(mlp, 10 ** 6)])
    b.edges.append(Edge(head, CLIENT, 10 ** 5))
    g = b.graph()
    c = Cluster((NodeSpec("gpu", "cuda", 2 * GB, 15 * 10 ** 8, 100e12, 1e12),
                 NodeSpec("cpu", "cpu", 64 * GB, 64 * GB, 4e12, 2e11)),
                (Link(CLIENT_NAME, "gpu", 1e10, 1e-5), Link(CLIENT_NAME, "cpu", 1e10, 1e-5),
                 Link("gpu", "cpu", 2e10, 5e-6)))
    s = schedule(g, c)
    assert s.algorithm == "heft"
    assert s.placement == {emb: "gpu", attn: "gpu", mlp: "cpu", head: "gpu"}
    assert [round(s.finish_s[x] * 1e6, 1) for x in (emb, attn, mlp, head)] == [210.1, 4210.1, 54265.1, 58320.1]
    assert round(s.estimated_s * 1e6, 1) == 58340.1
    assert round(s.period_s * 1e3, 3) == 50.0
    assert s.memory_bytes == {"gpu": 804 * 10 ** 6, "cpu": 804 * 10 ** 6}
    assert [len(st) for st in s.stages] == [2, 1, 1]
    rr, gm = round_robin(g, c), greedy_by_memory(g, c)
    assert (round(rr.estimated_s * 1e3, 3), round(gm.estimated_s * 1e3, 3)) == (106.34, 251.03)
    assert rr.placement == {emb: "gpu", attn: "cpu", mlp: "gpu", head: "gpu"}
    assert set(gm.placement.values()) == {"cpu"}
    # the other placements that fit: the tied embedding and head on the cpu, or everything there
    alternatives = [evaluate(g, c, {emb: "cpu", attn: "gpu", mlp: "gpu", head: "cpu"}).estimated_s, gm.estimated_s]
    assert [round(t * 1e6, 1) for t in alternatives] == [107140.1, 251030.1]


# --- calibration ---------------------------------------------------------------------------------------------------

class _FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_calibrate_link_fits_latency_and_bandwidth():
    clock = _FakeClock()

    def send(n):
        clock.now += 20e-6 + n / 5e9 + (1e-6 if n == 1024 else 0.0)  # one size a little noisy

    latency, bandwidth = calibrate_link(send, sizes=(1024, 1 << 16, 1 << 20, 1 << 24), clock=clock)
    assert latency == pytest.approx(20e-6, rel=0.05) and bandwidth == pytest.approx(5e9, rel=1e-3)
    assert fit_hockney([0, 100], [1.0, 2.0]) == (1.0, 0.01)
    with pytest.raises(ValueError, match="do not grow"):
        fit_hockney([10, 20, 30], [3.0, 2.0, 1.0])
    with pytest.raises(ValueError):
        calibrate_link(send, sizes=(8, 8))


def test_calibrate_node_measures_a_cpu_through_the_sync_callback():
    import torch

    synced = []
    flops, bandwidth = calibrate_node("cpu", sync=lambda t: synced.append(t.shape), matmul_n=256,
                                      copy_bytes=16 << 20, chain=4, repeats=3)
    assert 1e8 < flops < 1e14 and 1e8 < bandwidth < 1e13
    assert torch.Size([256, 256]) in synced and len(synced) >= 2 * (1 + 3 + 3)
    with pytest.raises(RuntimeError, match="does sync wait"):
        calibrate_node("cpu", matmul_n=8, copy_bytes=1024, clock=lambda: 0.0)


# --- parts of the algorithms ---------------------------------------------------------------------------------------

def test_heft_counts_the_results_transfer_to_the_client():
    from genie.scheduler.placement import heft, prepare
    b = _Builder("forward")
    x = b.add("ops", 1e12, 0, inputs=[(CLIENT, 1000)])
    b.edges.append(Edge(x, CLIENT, 10 ** 9))                  # a large result: 1 GB
    g = b.graph()
    far, near = node("far", 100e12, 1e12, GB), node("near", 50e12, 1e12, GB)   # 10 ms and 20 ms of compute
    c = Cluster((far, near), (Link(CLIENT_NAME, "far", 1e9, 1e-5), Link(CLIENT_NAME, "near", 100e9, 1e-5)))
    s = heft(prepare(g, c), CostArrays(g, c))
    assert s.placement == {x: "near"}                          # 20 ms + 10 ms beats 10 ms + 1 s
    assert s.estimated_s == pytest.approx(1e-5 + 1e-8 + 0.02 + 1e-5 + 0.01)


def test_the_pipeline_prefers_a_chain_of_well_linked_nodes():
    g = transformer(12, d=512, seq=1024)
    lone = [node(f"f{i}", 12e12, 2e12, 64 * GB) for i in range(3)]    # fastest, but 0.5 GB/s to any node
    rack = [node(f"r{i}", 10e12, 2e12, 64 * GB) for i in range(3)]     # a little slower, 100 GB/s between them
    names = [n.name for n in lone + rack]
    links = tuple(Link(a, b, 100e9 if a[0] == b[0] == "r" else 0.5e9, 2e-6) for a in names for b in names if a < b)
    c = cluster(*lone, *rack, client_bw=100e9, client_lat=10e-6, links=links)
    s = schedule(g, c, "throughput")
    check_schedule(g, c, s)
    assert s.algorithm == "pipeline-partition"
    assert len(s.nodes()) == 3 and set(s.nodes()) == {"r0", "r1", "r2"}
    one_fast = sum(compute_s(grp, lone[0]) for grp in g.groups)
    assert s.period_s < 0.5 * one_fast
