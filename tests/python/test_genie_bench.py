"""genie-bench as a user runs it: server and client processes on loopback."""
import json
import os
import subprocess
import time

import pytest


def _env(tls):
    env = dict(os.environ, UCX_TLS=tls, UCX_NET_DEVICES="lo")
    return env


def _serve(genie_bench, port, tls):
    server = subprocess.Popen([genie_bench, "--server", "--once", "--port", str(port)], env=_env(tls),
                              stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    return server


@pytest.mark.parametrize("tls", ["tcp", "sm"])
def test_json_results_for_every_test(genie_bench, free_port, tls):
    server = _serve(genie_bench, free_port, tls)
    try:
        out = subprocess.run(
            [genie_bench, "127.0.0.1", "--port", str(free_port), "--tests", "latency,bandwidth,put,get,rate",
             "--sizes", "8,1M", "--iterations", "40", "--warmup", "4", "--json"],
            env=_env(tls), capture_output=True, text=True, timeout=120, check=True)
        assert server.wait(timeout=20) == 0
    finally:
        server.kill()
    results = json.loads(out.stdout)
    assert [(r["test"], r["size"]) for r in results] == [
        ("latency", 8), ("latency", 1 << 20), ("bandwidth", 8), ("bandwidth", 1 << 20),
        ("put", 8), ("put", 1 << 20), ("get", 8), ("get", 1 << 20), ("rate", 0)]
    for r in results:
        assert r["iterations"] == 40
        assert 0 < r["latency_us"] < 1e6
        assert r["rate_per_s"] > 0
        if r["test"] != "rate":
            assert r["bandwidth_mbs"] > 0
    lanes = results[0]["transports"]
    if tls == "tcp":
        assert "am=tcp/lo" in lanes
    else:
        assert "am=tcp" not in lanes and "memory" in lanes


def test_human_table(genie_bench, free_port):
    server = _serve(genie_bench, free_port, "tcp")
    try:
        out = subprocess.run([genie_bench, "127.0.0.1", "--port", str(free_port), "--tests", "latency",
                              "--sizes", "64K", "-n", "20"], env=_env("tcp"), capture_output=True, text=True,
                             timeout=60, check=True)
    finally:
        server.wait(timeout=20)
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("# genie-bench over [")
    assert lines[1].split()[:2] == ["test", "size"]
    assert lines[2].split()[:3] == ["latency", "65536", "20"]


def test_unreachable_server_fails_fast_naming_it(genie_bench, free_port):
    start = time.monotonic()
    out = subprocess.run([genie_bench, "127.0.0.1", "--port", str(free_port)], env=_env("tcp"),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert f"127.0.0.1:{free_port}" in out.stderr
    assert time.monotonic() - start < 10


def test_bad_arguments_are_refused(genie_bench):
    out = subprocess.run([genie_bench, "--tests", "warp"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 2
    assert "unknown test 'warp'" in out.stderr
    out = subprocess.run([genie_bench, "--sizes", "12Q"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 2
    assert "'12Q' is not a size" in out.stderr


def test_print_config_lists_every_setting(genie_bench):
    out = subprocess.run([genie_bench, "--print-config"], env=dict(os.environ, GENIE_PEER_TIMEOUT_MS="750"),
                         capture_output=True, text=True, timeout=10, check=True)
    assert "GENIE_PEER_TIMEOUT_MS=750" in out.stdout
    for name in ["GENIE_UCX_TLS", "GENIE_UCX_NET_DEVICES", "GENIE_CLOSE_TIMEOUT_MS", "GENIE_BUSY_POLL_US",
                 "GENIE_RNDV_THRESHOLD"]:
        assert name + "=" in out.stdout
    bad = subprocess.run([genie_bench, "--print-config"], env=dict(os.environ, GENIE_PEER_TIMEOUT_MS="soon"),
                         capture_output=True, text=True, timeout=10)
    assert bad.returncode == 2 and "GENIE_PEER_TIMEOUT_MS='soon'" in bad.stderr
