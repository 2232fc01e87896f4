"""Two hosts on one machine: genie-bench across network namespaces joined by a veth pair.

The namespaces and their addresses (10.77.0.1 and 10.77.0.2 on a private /24) exist only
inside this test; no traffic leaves the machine. Needs root (ip netns); skipped otherwise.
"""
import json
import os
import subprocess
import time


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
