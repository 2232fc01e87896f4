"""Two hosts on one machine: genie-bench across network namespaces joined by a veth pair.

The namespaces and their addresses (10.77.0.1 and 10.77.0.2 on a private /24) exist only
inside this test; no traffic leaves the machine. Needs root (ip netns); skipped otherwise.
"""
import json
import os
import subprocess
import time
import uuid

import pytest


def _ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def two_hosts():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = uuid.uuid4().hex[:6]
    a, b = f"genie-a-{tag}", f"genie-b-{tag}"
    va, vb = f"gva{tag}", f"gvb{tag}"
    if _ip("netns", "add", a).returncode != 0:
        pytest.skip("ip netns add is not permitted here")
    try:
        assert _ip("netns", "add", b).returncode == 0
        setup = [
            ["link", "add", va, "type", "veth", "peer", "name", vb],
            ["link", "set", va, "netns", a],
            ["link", "set", vb, "netns", b],
            ["-n", a, "addr", "add", "10.77.0.1/24", "dev", va],
            ["-n", b, "addr", "add", "10.77.0.2/24", "dev", vb],
            ["-n", a, "link", "set", va, "up"],
            ["-n", b, "link", "set", vb, "up"],
            ["-n", a, "link", "set", "lo", "up"],
            ["-n", b, "link", "set", "lo", "up"],
        ]
        for step in setup:
            out = _ip(*step)
            assert out.returncode == 0, f"ip {' '.join(step)}: {out.stderr}"
        yield {"server_ns": a, "client_ns": b, "server_ip": "10.77.0.1", "server_dev": va, "client_dev": vb}
    finally:
        _ip("netns", "del", a)
        _ip("netns", "del", b)


def test_genie_bench_between_two_hosts_over_tcp(genie_bench, two_hosts):
    env = dict(os.environ, UCX_TLS="tcp")
    env.pop("UCX_NET_DEVICES", None)
    port = "13777"
    server = subprocess.Popen(["ip", "netns", "exec", two_hosts["server_ns"], str(genie_bench), "--server",
                               "--once", "--port", port], env=env, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.7)
        out = subprocess.run(["ip", "netns", "exec", two_hosts["client_ns"], str(genie_bench),
                              two_hosts["server_ip"], "--port", port, "--tests", "latency,bandwidth,put,get",
                              "--sizes", "8,1M", "-n", "30", "-w", "3", "--json"],
                             env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert server.wait(timeout=20) == 0
    finally:
        server.kill()
    results = json.loads(out.stdout)
    assert len(results) == 8
    assert all(r["latency_us"] > 0 and r["bandwidth_mbs"] > 0 for r in results)
    # The data crossed the veth pair, not loopback.
    assert f"tcp/{two_hosts['client_dev']}" in results[0]["transports"]
