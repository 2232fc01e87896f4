"""Cluster membership through etcd leases: a real etcd (Debian's etcd-server, /usr/bin/etcd) on
free loopback ports and real genie-node processes started with --etcd. Nodes are listed with
their addresses, genie.init(etcd=...) makes them the devices, a node stopped by SIGTERM leaves
at once (its lease revoked), a killed one when its lease's TTL ends, and an etcd that cannot be
reached is an error naming its URL, for the client and for the node.
"""
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest
import torch

import genie
from conftest import BIN, NodeProcess
from genie.errors import GenieConnectionError
from genie.membership import DEFAULT_PREFIX, nodes_from_etcd

TTL_S = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_key(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


@pytest.fixture
def etcd(tmp_path):
    """The client URL of a fresh etcd of its own (data in tmp_path), killed at the end."""
    binary = shutil.which("etcd") or "/usr/bin/etcd"
    if not os.access(binary, os.X_OK):
        pytest.skip("no etcd binary (Debian's etcd-server: tools/setup.sh installs it)")
    url = f"http://127.0.0.1:{_free_port()}"
    log = open(tmp_path / "etcd.log", "w")
    process = subprocess.Popen(
        [binary, "--data-dir", str(tmp_path / "etcd"), "--listen-client-urls", url, "--advertise-client-urls", url,
         "--listen-peer-urls", f"http://127.0.0.1:{_free_port()}", "--log-level", "error"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                nodes_from_etcd(url)
                break
            except GenieConnectionError:
                assert process.poll() is None, f"etcd exited: {(tmp_path / 'etcd.log').read_text()}"
                assert time.monotonic() < deadline, "etcd did not answer within 10 s"
                time.sleep(0.05)
        yield url
    finally:
        process.kill()
        process.wait()
        log.close()


def _addresses(url: str) -> list[str]:
    return [node["address"] for node in nodes_from_etcd(url)]


def _wait_until_gone(url: str, address: str, timeout_s: float) -> float:
    """Seconds until `address` is no longer listed; fails after `timeout_s`."""
    start = time.monotonic()
    while address in _addresses(url):
        assert time.monotonic() - start < timeout_s, f"{address} still listed after {timeout_s} s"
        time.sleep(0.02)
    return time.monotonic() - start


def test_registered_nodes_are_the_devices_and_leave_by_revoke_or_expiry(etcd, monkeypatch):
    flags = ["--etcd", etcd, "--etcd-ttl-s", str(TTL_S)]
    nodes = [NodeProcess(extra_args=flags), NodeProcess(extra_args=flags)]
    try:
        listed = nodes_from_etcd(etcd)
        expected = sorted((n.address for n in nodes), key=_port_key)
        assert [node["address"] for node in listed] == expected
        by_address = {n.address: n for n in nodes}
        for node in listed:
            assert node["key"] == DEFAULT_PREFIX + node["address"]
            assert node["device"] == "cpu"
            assert node["pid"] == by_address[node["address"]].process.pid
            assert node["memory_total"] > 0 and node["memory_limit"] == 0
            assert node["version"] and node["protocol_version"] >= 1

        # The devices are the registered nodes, sorted by address, read when the session starts.
        genie.init(etcd=etcd)
        try:
            assert genie.device_count() == 2
            assert [genie.get_device(i).address for i in range(2)] == expected
            torch.manual_seed(0)
            a, b = torch.randn(64, 32), torch.randn(32, 16)
            remote = (a.to("remote_accelerator:1") @ b.to("remote_accelerator:1")).relu()
            assert torch.allclose(remote.cpu(), (a @ b).relu())
        finally:
            genie.shutdown()
        # The environment's way, the same nodes; with GENIE_SERVER also set, an error.
        monkeypatch.delenv("GENIE_SERVER", raising=False)
        monkeypatch.setenv("GENIE_ETCD", etcd)
        genie.init()
        try:
            assert genie.device_count() == 2
        finally:
            genie.shutdown()
        monkeypatch.setenv("GENIE_SERVER", expected[0])
        with pytest.raises(ValueError, match="GENIE_SERVER and GENIE_ETCD"):
            genie.init()
        monkeypatch.delenv("GENIE_SERVER")
        monkeypatch.delenv("GENIE_ETCD")

        # SIGTERM: the node revokes its lease, so its key goes at once.
        stopped, killed = nodes
        stopped.process.send_signal(signal.SIGTERM)
        assert _wait_until_gone(etcd, stopped.address, 1.0) < 1.0
        assert stopped.process.wait(timeout=10) == 0
        assert _addresses(etcd) == [killed.address]

        # SIGKILL: nobody revokes; the key stays until the lease's TTL ends.
        killed.kill()
        assert _addresses(etcd) == [killed.address]
        waited = _wait_until_gone(etcd, killed.address, TTL_S + 2.0)
        assert waited > 0.5, f"the key of a killed node went after {waited:.2f} s, before its lease could expire"

        # No node left: a clear error naming etcd's URL.
        with pytest.raises(GenieConnectionError, match=f"no genie-node is registered in etcd at {etcd}"):
            genie.init(etcd=etcd)
    finally:
        genie.shutdown()
        for n in nodes:
            n.stop()


def test_a_node_under_another_prefix_is_not_listed(etcd):
    node = NodeProcess(extra_args=["--etcd", etcd, "--etcd-prefix", "/other-cluster/"])
    try:
        assert nodes_from_etcd(etcd) == []
        assert [n["address"] for n in nodes_from_etcd(etcd, prefix="/other-cluster/")] == [node.address]
    finally:
        node.stop()
    assert nodes_from_etcd(etcd, prefix="/other-cluster/") == []


def test_an_unreachable_etcd_is_an_error_naming_its_url():
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    with pytest.raises(GenieConnectionError, match=f"etcd at {url} cannot be reached"):
        nodes_from_etcd(url)
    with pytest.raises(GenieConnectionError, match=url):
        genie.init(etcd=url)
    genie.shutdown()
    with pytest.raises(ValueError, match="server= or etcd="):
        genie.init(server="127.0.0.1:1", etcd=url)
    # The node: it does not serve unregistered; exit status 1, the URL on standard error.
    node = subprocess.run([str(BIN / "genie-node"), "--listen", "127.0.0.1:0", "--etcd", url],
                          capture_output=True, text=True, timeout=30)
    assert node.returncode == 1, node.stderr
    assert f"cannot register in etcd (--etcd {url})" in node.stderr
    assert "listening on" not in node.stdout
