"""Node-to-node transfers: `tensor.to("remote_accelerator:1")` of a tensor on
remote_accelerator:0 goes from node 0 to node 1 (SendTensors) without passing through this
process. Two real genie-node processes on loopback with an auth token; the client sends one
small request; a handle of another session, a wrong token or session id and a dead peer are
refused with errors that name what failed, and the nodes serve on.
"""
import os
import re
import time

import pytest
import torch

import genie
import genie._C as C
from conftest import NodeProcess
from genie.errors import GenieError, GenieRemoteError

TOKEN = "node-to-node-test-token"
DEV0, DEV1 = "remote_accelerator:0", "remote_accelerator:1"


@pytest.fixture
def two_nodes(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    nodes = [NodeProcess(token_file=str(token_file)), NodeProcess(token_file=str(token_file))]
    genie.init(server=",".join(n.address for n in nodes), auth_token=TOKEN)
    yield nodes
    genie.shutdown()
    for n in nodes:
        n.stop()


def _traffic() -> int:
    stats = genie.client_stats()
    return stats["bytes_sent"] + stats["bytes_received"]


def test_a_tensor_moves_node_to_node_and_equals_the_cpu_reference(two_nodes):
    torch.manual_seed(0)
    a = torch.randn(1024, 1024)  # 4 MiB of float32
    expected = (a * 2 + 1).relu()
    x = a.to(DEV0)
    torch.ones(1, device=DEV1).cpu()  # both sessions open before the measurement
    sent0 = genie.memory_stats(DEV0)["peer_bytes_sent"]
    received1 = genie.memory_stats(DEV1)["peer_bytes_received"]
    y = (x * 2 + 1).relu()  # pending on node 0
    before = _traffic()
    z = y.to(DEV1)
    moved = _traffic() - before
    assert z.device == torch.device(DEV1) and z.shape == (1024, 1024) and z.dtype == torch.float32
    assert moved < 64 * 1024, f"{moved} bytes crossed the client for a 4 MiB move"
    assert genie.memory_stats(DEV0)["peer_bytes_sent"] - sent0 >= 4 << 20
    stats1 = genie.memory_stats(DEV1)
    assert stats1["peer_bytes_received"] - received1 >= 4 << 20
    assert stats1["peer_transfers"] >= 1
    assert torch.equal(z.cpu(), expected)
    # The moved tensor is an ordinary tensor of device 1: computed on there.
    assert torch.equal((z - 1).cpu(), expected - 1)
    # A conversion asked on the way is made by node 0 before the move.
    half = y.to(DEV1, dtype=torch.float16)
    assert half.device == torch.device(DEV1) and half.dtype == torch.float16
    assert torch.equal(half.cpu(), expected.half())
    # copy_ into a tensor of device 1 moves node to node too, then copies there.
    dst = torch.zeros(3, device=DEV1)
    before = _traffic()
    dst.copy_(torch.arange(3.0, device=DEV0) + 5)
    assert torch.equal(dst.cpu(), torch.tensor([5.0, 6.0, 7.0]))
    assert _traffic() - before < 64 * 1024


def test_tensors_from_one_node_move_together_in_one_send(two_nodes):
    from genie.transfers import move_many
    torch.manual_seed(0)
    a, b = torch.randn(64, 64), torch.randn(16)
    x = (a.to(DEV0) * 2).relu()  # pending on node 0
    y = b.to(DEV0) + 1
    host = torch.arange(4.0)
    torch.ones(1, device=DEV1).cpu()  # node 1's session open before the count
    sends = genie.memory_stats(DEV0)["peer_transfers"]
    received = genie.memory_stats(DEV1)["peer_bytes_received"]
    moved = move_many([x, y, host, x], torch.device(DEV1))
    # One SendTensors from node 0 carries both tensors (x once); the host tensor does not pass by it.
    assert genie.memory_stats(DEV0)["peer_transfers"] - sends == 1
    assert (64 * 64 + 16) * 4 <= genie.memory_stats(DEV1)["peer_bytes_received"] - received < 2 * 64 * 64 * 4
    assert [t.device for t in moved] == [torch.device(DEV1)] * 4
    assert torch.equal(moved[0].cpu(), (a * 2).relu()) and torch.equal(moved[3].cpu(), (a * 2).relu())
    assert torch.equal(moved[1].cpu(), b + 1) and torch.equal(moved[2].cpu(), host)


def test_a_send_names_only_the_requesting_sessions_handles(two_nodes):
    n0, n1 = two_nodes
    with C.Client("127.0.0.1", n0.port, auth_token=TOKEN) as owner, \
            C.Client("127.0.0.1", n0.port, auth_token=TOKEN) as other, \
            C.Client("127.0.0.1", n1.port, auth_token=TOKEN) as peer:
        mine = os.urandom(16)
        owner.put([(mine, torch.arange(8.0), 0)])
        with pytest.raises(GenieRemoteError) as refused:
            other.send_tensors(n1.address, TOKEN, peer.session_id, [mine], [os.urandom(16)])
        assert refused.value.code == "UnknownHandle"
        assert mine.hex() in str(refused.value)
        # The node serves on, the owner's tensor is there, and the owner may send it.
        assert torch.equal(owner.get([mine])[0], torch.arange(8.0))
        other.ping()
        there = os.urandom(16)
        owner.send_tensors(n1.address, TOKEN, peer.session_id, [mine], [there])
        assert torch.equal(peer.get([there])[0], torch.arange(8.0))


def test_a_wrong_session_id_or_token_is_refused_by_the_peer(two_nodes):
    n0, n1 = two_nodes
    with C.Client("127.0.0.1", n0.port, auth_token=TOKEN) as owner, \
            C.Client("127.0.0.1", n1.port, auth_token=TOKEN) as peer:
        h = os.urandom(16)
        owner.put([(h, torch.ones(4), 0)])
        wrong = os.urandom(16)
        with pytest.raises(GenieRemoteError, match=f"peer {n1.address} refused.*no session {wrong.hex()}") as e:
            owner.send_tensors(n1.address, TOKEN, wrong, [h], [os.urandom(16)])
        assert e.value.code == "Unauthenticated"
        with pytest.raises(GenieRemoteError, match="wrong auth token") as e:
            owner.send_tensors(n1.address, "not-the-token", peer.session_id, [h], [os.urandom(16)])
        assert e.value.code == "Unauthenticated"
        with pytest.raises(ValueError, match="peer_handles"):
            owner.send_tensors(n1.address, TOKEN, peer.session_id, [h], [])
        peer.ping()
        owner.ping()


def test_a_dead_peer_fails_the_move_naming_it_and_node_0_serves_on(two_nodes):
    n0, n1 = two_nodes
    x = torch.arange(1000.0).to(DEV0)
    assert torch.equal((x + 1).to(DEV1).cpu(), torch.arange(1000.0) + 1)  # node 0 is connected to node 1
    n1.kill()
    start = time.monotonic()
    with pytest.raises(GenieError, match=re.escape(n1.address)) as e:
        (x * 3).to(DEV1)
    assert time.monotonic() - start < 5.0
    assert getattr(e.value, "code", "") == "PeerUnreachable", e.value
    assert torch.equal((x * 2).cpu(), torch.arange(1000.0) * 2)
