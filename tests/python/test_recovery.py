"""A node lost mid-generation: with host copies kept, the program goes on where it was.

genie.init(keep_host_copy=True): when the node dies, Genie connects again once it is back,
uploads the weights again, replays the runs that made the KV cache (genie.lineage), and the
same unmodified generate() call finishes with the same tokens as on the CPU.
"""
import threading

import pytest
import torch

import genie
from conftest import NodeProcess
from genie import GenieConnectionError
from genie.lineage import Lineage

DEV = "remote_accelerator:0"


@pytest.fixture
def restartable_node(free_port):
    node = NodeProcess(free_port)
    yield node
    genie.shutdown()
    node.stop()


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128)).eval()


class _KillAt:
    """A logits processor that, when the sequence reaches `length`, kills the node and starts
    it again on the same port half a second later (in the background, as an operator would)."""

    def __init__(self, node: NodeProcess, length: int) -> None:
        self.node, self.length, self.fired = node, length, False
        self.restart = None

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] == self.length and not self.fired:
            self.fired = True
            self.node.kill()
            self.restart = threading.Timer(0.5, self.node.start)
            self.restart.start()
        return scores


def test_generation_survives_a_node_killed_and_restarted(restartable_node):
    from transformers import LogitsProcessorList
    model = _gpt2()
    ids = torch.tensor([[5, 17, 42, 9]])
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=10, do_sample=False, pad_token_id=0)
    genie.init(server=f"127.0.0.1:{restartable_node.port}", keep_host_copy=True)
    remote = _gpt2().to(DEV)
    killer = _KillAt(restartable_node, ids.shape[1] + 4)
    with torch.no_grad(), pytest.warns(UserWarning, match="rebuilt the resident state"):
        tokens = remote.generate(ids.to(DEV), max_new_tokens=10, do_sample=False, pad_token_id=0,
                                 logits_processor=LogitsProcessorList([killer]))
    killer.restart.join()
    assert killer.fired
    assert torch.equal(tokens.cpu(), expected)
    # The weights and the new node's state are whole: another generation agrees too.
    with torch.no_grad():
        again = remote.generate(ids.to(DEV), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(again.cpu(), expected[:, :ids.shape[1] + 4])


def test_without_host_copies_a_lost_node_raises_naming_it(restartable_node):
    genie.init(server=f"127.0.0.1:{restartable_node.port}")
    x = torch.arange(6.0).to(DEV) * 2
    x.cpu()
    restartable_node.kill()
    restartable_node.start()
    with pytest.raises(GenieConnectionError, match=f"127.0.0.1:{restartable_node.port}"):
        (x + 1).cpu()


def test_lineage_keeps_what_the_live_handles_need():
    a, b, c, w, gone = (bytes([i]) * 16 for i in range(1, 6))
    lineage = Lineage()
    lineage.put([(w, torch.ones(2), 1)])
    lineage.put([(gone, torch.ones(2), 0)])
    lineage.run((b"g1", [(0, gone)], [], [(3, 1, a, 2)], []), (w,))      # a from gone (and w)
    lineage.run((b"g2", [(0, a)], [], [(4, 1, b, 2), (5, 0, None, 0)], []), (w,))  # b from a
    lineage.free([a])
    lineage.run((b"g3", [(0, torch.zeros(1))], [], [(1, 1, c, 0)], []), ())  # c, not needed
    lineage.free([c, gone])
    lineage.prune({b})
    kinds = [entry[0] for entry in lineage.entries]
    assert kinds == ["put", "put", "run", "run", "free", "free"]
    assert [item[0] for item in lineage.entries[0][1]] == [w]
    assert lineage.entries[3][4] == [(4, 1, b, 2)]  # the returned output is not replayed
    assert lineage.entries[4] == ("free", [a]) and lineage.entries[5] == ("free", [gone])


def test_keeping_the_lineage_sends_no_extra_bytes(restartable_node):
    # The lineage lives in this process: a generation sends the same bytes with it as without.
    ids = torch.tensor([[5, 17, 42, 9]])
    sent = {}
    for keep in (False, True):
        genie.init(server=f"127.0.0.1:{restartable_node.port}", keep_host_copy=keep)
        model = _gpt2().to(DEV)
        with torch.no_grad():
            model.generate(ids.to(DEV), max_new_tokens=6, do_sample=False, pad_token_id=0)
        genie.synchronize()
        sent[keep] = genie.client_stats()["bytes_sent"]
        genie.shutdown()
    assert sent[True] == sent[False]


def test_a_compiled_part_survives_a_node_killed_and_restarted(free_port):
    """A torch.compile part's graph is registered outside the step's recording: the lineage
    registers it again on the new node, so the captured part runs there."""
    node = NodeProcess(free_port, extra_args=["--compile-engine", "executor"])
    try:
        genie.init(server=f"127.0.0.1:{node.port}", keep_host_copy=True)
        torch.manual_seed(0)
        x, w = torch.randn(3, 4), torch.randn(4, 5)
        rx, rw = x.to(DEV), w.to(DEV)
        f = torch.compile(lambda a, b: (a @ b).relu(), backend="genie", dynamic=False)
        first = len(genie.compile_stats()["graphs"])  # other tests' graphs come before
        with torch.no_grad():
            f(rx, rw).cpu()
            f(rx, rw).cpu()  # the captured part: one genie::call_graph naming its registered graph
            node.kill()
            node.start()
            with pytest.warns(UserWarning, match="rebuilt the resident state"):
                out = f(rx, rw).cpu()
        torch.testing.assert_close(out, (x @ w).relu())
        (graph,) = genie.compile_stats()["graphs"][first:]
        assert [(p["engine"], p["calls"], p["dispatched"]) for p in graph["parts"]] == [("node", 3, 0)]
    finally:
        genie.shutdown()
        node.stop()
