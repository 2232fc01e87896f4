"""What the network can do to genie-node and its clients: garbage, floods of sessions, stopped
peers, cut links, long runs. Real processes on loopback or in network namespaces; bounded.

The figures the assertions hold to (0 extra fds and threads, at most 2 MiB more RSS, a dead
peer seen within 2.5 s) are the reliability issue's acceptance; docs/security.md has the rules.
"""
import json
import os
import random
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from conftest import BIN, _ip

PEER = BIN / "node_client_peer"


# ---- processes ------------------------------------------------------------------------

class Node:
    """A genie-node process: `port`, `pid`, and what /proc says of it."""

    def __init__(self, *args, netns=None, listen="127.0.0.1:0", env=None):
        command = [str(BIN / "genie-node"), "--listen", listen, "--log-level", "warn", *args]
        if netns:
            command = ["ip", "netns", "exec", netns, *command]
        self.log = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                        env=env or os.environ)
        line = _read_line(self.process, 30)
        match = re.match(r"genie-node listening on (\S+):(\d+)", line)
        if not match:
            self.log.seek(0)
            self.stop()
            raise RuntimeError(f"genie-node did not start ({line!r}): {self.log.read()}")
        self.host, self.port = match.group(1), int(match.group(2))
        self.pid = self.process.pid  # `ip netns exec` execs the program: the same process

    def threads(self):
        return len(os.listdir(f"/proc/{self.pid}/task"))

    def fds(self):
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def rss_kib(self):
        with open(f"/proc/{self.pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))

    def cpu_seconds(self):
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def listening_ports(self):
        """Every TCP port the node listens on: its own and the ones UCX's tcp transport opened."""
        inodes = set()
        for fd in os.listdir(f"/proc/{self.pid}/fd"):
            try:
                target = os.readlink(f"/proc/{self.pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        ports = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                for line in f.readlines()[1:]:
                    fields = line.split()
                    if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        return sorted(ports)

    def log_text(self):
        """What the node wrote to stderr so far (warnings and errors)."""
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def _read_line(process, timeout):
    """The next line the process prints within `timeout` s ("" if none; also after it exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([process.stdout], [], [], 0.05)[0]:
            return process.stdout.readline()
    return ""


@pytest.fixture
def node():
    started = []

    def start(*args, **kwargs):
        started.append(Node(*args, **kwargs))
        return started[-1]

    yield start
    for n in started:
        n.stop()


def _client(port, host="127.0.0.1", **kwargs):
    import genie._C as C
    return C.Client(host, port, **kwargs)


def _stop(pid):
    """SIGSTOP `pid` and wait until every one of its threads is stopped (a signal is delivered
    asynchronously: a thread that is running may still answer a message in between)."""
    os.kill(pid, signal.SIGSTOP)

    def stopped():
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in "Tt":
                    return False
        return True
    assert _wait_until(stopped, 5, step=0.001), f"process {pid} did not stop"


def _wait_until(predicate, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


# ---- raw TCP garbage --------------------------------------------------------------------

def _garbage(port, rng):
    """One round of what an attacker or a broken peer sends to a TCP port."""
    payloads = [b"\0" * 64, b"\xff" * 64, b"\xff" * 4096, os.urandom(3000), os.urandom(rng.randrange(1, 9000)),
                struct.pack("<Q", 1 << 62) + b"\0" * 8, struct.pack("<Q", 40) + os.urandom(100), b"GET / HTTP/1.0\r\n\r\n"]
    for payload in payloads:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(payload)
    # Half handshakes: connected, a few bytes or none, left open a while, then closed.
    held = []
    for size in (0, 1, 8, 16):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(os.urandom(size))
        held.append(s)
    # A reset instead of a close.
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(os.urandom(500))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    time.sleep(0.3)
    for s in held:
        s.close()


def _flood(port, count, rng):
    """`count` connections at once, each with random bytes of a random length, then closed."""
    sockets = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(os.urandom(rng.randrange(0, 4096)))
        sockets.append(s)
    for s in sockets:
        s.close()


def _settles(n, fds, threads, timeout=5):
    return _wait_until(lambda: n.fds() <= fds and n.threads() <= threads, timeout, 0.1)


def test_raw_tcp_garbage_leaves_the_node_serving_with_nothing_held(node):
    n = node("--auth-token-file", "/dev/null")
    rng = random.Random(18)
    ports = n.listening_ports()
    assert n.port in ports and len(ports) >= 2, ports  # its own, and UCX tcp's
    # Warm-up round: every kind of garbage on every port, then 500 connections at once.
    for port in ports:
        _garbage(port, rng)
    _flood(n.port, 500, rng)
    time.sleep(2)
    fds, threads, rss = n.fds(), n.threads(), n.rss_kib()
    # The measured round.
    for port in ports:
        _garbage(port, rng)
    _flood(n.port, 500, rng)
    assert n.process.poll() is None, "genie-node died"
    assert _settles(n, fds, threads), f"fds {n.fds()} (was {fds}), threads {n.threads()} (was {threads})"
    assert n.rss_kib() - rss <= 2048, f"RSS grew by {n.rss_kib() - rss} KiB"
    # No core busy while idle (UCX's connection manager spun on stuck sockets before the guard):
    # once the last closes are processed (a loaded 2-core machine may take several seconds: a
    # fresh-clone CI run saw 0.47 s of CPU per 2 s for 8 s), 2 s of idleness use under 0.1 s of
    # CPU. A spinning core never gets there.
    time.sleep(0.5)
    deadline = time.monotonic() + 20
    while True:
        before = n.cpu_seconds()
        time.sleep(2)
        used = n.cpu_seconds() - before
        if used < 0.1 or time.monotonic() > deadline:
            break
    assert used < 0.1, f"{used:.2f} s of CPU in 2 s of idleness"
    # Still serving: a session, a tensor round trip.
    import torch
    with _client(n.port) as c:
        c.put([(b"\1" * 16, torch.arange(10.0), 1)])
        assert torch.equal(c.get([b"\1" * 16])[0], torch.arange(10.0))


CLIENT_AGAINST_GARBAGE = textwrap.dedent("""
    # A client connecting to servers that answer with garbage: each connect must fail with
    # GenieConnectionError within its timeout, and the process must live on.
    import json, os, socket, struct, sys, threading, time
    import genie._C as C
    from genie.errors import GenieConnectionError, GenieError
    answers = [b"\\0" * 64, b"\\xff" * 4096, os.urandom(3000), struct.pack("<Q", 1 << 62), b"", None]
    results = []
    for answer in answers:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        def serve():
            try:
                while True:
                    conn, _ = server.accept()
                    if answer is None:
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        conn.close()  # a reset
                        continue
                    conn.sendall(answer)
                    time.sleep(0.2)
                    conn.close()
            except OSError:
                pass
        threading.Thread(target=serve, daemon=True).start()
        start = time.monotonic()
        try:
            C.Client("127.0.0.1", port, timeout_ms=2000)
            error = None
        except GenieError as e:
            error = type(e).__name__
        results.append({"answer": len(answer) if answer is not None else -1, "error": error,
                        "seconds": time.monotonic() - start})
        server.close()
    print(json.dumps({"results": results, "threads": len(os.listdir("/proc/self/task"))}))
""")


def test_raw_tcp_garbage_from_a_server_fails_the_client_cleanly():
    env = dict(os.environ, GENIE_CONNECT_TIMEOUT_MS="2000", GENIE_LOG_LEVEL="error")
    out = subprocess.run([sys.executable, "-c", CLIENT_AGAINST_GARBAGE], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    for result in report["results"]:
        assert result["error"] == "GenieConnectionError", result
        assert result["seconds"] < 4.5, result  # the connect timeout (2 s) and the close bound
    assert report["threads"] < 50


# ---- sessions -----------------------------------------------------------------------------

def test_two_thousand_sessions_leave_no_threads_or_memory(node):
    n = node()
    warm = subprocess.run([str(PEER), str(n.port), "--churn", "200"], capture_output=True, text=True, timeout=120)
    assert warm.returncode == 0 and warm.stdout.strip() == "done 200", warm.stderr[-2000:]
    time.sleep(1)
    threads, rss = n.threads(), n.rss_kib()
    out = subprocess.run([str(PEER), str(n.port), "--churn", "2000"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "done 2000", out.stderr[-2000:]
    assert _wait_until(lambda: n.threads() <= threads, 5), f"threads {n.threads()}, were {threads}"
    assert n.rss_kib() - rss <= 2048, f"RSS grew by {n.rss_kib() - rss} KiB over 2000 sessions"
    with _client(n.port) as c:
        assert c.stats()["sessions"] == 1


# ---- dead peers -----------------------------------------------------------------------------

def test_a_stopped_node_fails_the_client_within_2_5_s(node):
    from genie.errors import GenieConnectionError
    n = node()
    c = _client(n.port, timeout_ms=60000)
    c.ping()
    _stop(n.pid)
    start = time.monotonic()
    try:
        with pytest.raises(GenieConnectionError):
            c.ping()
        assert time.monotonic() - start < 2.5
    finally:
        os.kill(n.pid, signal.SIGCONT)


def _hold(port, nbytes, *extra, netns=None, host="127.0.0.1"):
    command = [str(PEER), str(port), str(nbytes), "--host", host, *extra]
    if netns:
        command = ["ip", "netns", "exec", netns, *command]
    env = dict(os.environ, GENIE_LOG_LEVEL="error")
    if netns:
        env = dict(env, UCX_TLS="tcp")
        env.pop("UCX_NET_DEVICES", None)
    peer = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert _read_line(peer, 30) == "ready\n"
    return peer


def test_a_stopped_client_has_its_session_freed_within_2_5_s(node):
    n = node()
    peer = _hold(n.port, 1 << 20)
    try:
        with _client(n.port) as observer:
            assert observer.stats()["sessions"] == 2
            _stop(peer.pid)
            start = time.monotonic()

            def freed():
                stats = observer.stats()
                return stats["sessions"] == 1 and sum(stats["resident"].values()) == 0

            assert _wait_until(freed, 2.5, 0.02), observer.stats()
            assert time.monotonic() - start < 2.5
    finally:
        peer.kill()
        peer.wait()


def test_a_cut_link_is_seen_by_both_sides_within_2_5_s(node, two_hosts):
    # The node listens on its veth and on loopback (for the observer on its own host below).
    env = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES=f"lo,{two_hosts['server_dev']}")
    n = node(netns=two_hosts["server_ns"], listen="0.0.0.0:0", env=env)
    peer = _hold(n.port, 1 << 20, "--watch", netns=two_hosts["client_ns"], host=two_hosts["server_ip"])
    # The node's view, from its own host over loopback (the cut veth carries nothing): a client
    # that polls the node's sessions and prints the time when only its own is left.
    observer = subprocess.Popen(["ip", "netns", "exec", two_hosts["server_ns"], sys.executable, "-c", WATCH_SESSIONS,
                                 str(n.port)], stdout=subprocess.PIPE, text=True,
                                env=dict(env, UCX_NET_DEVICES="lo", GENIE_LOG_LEVEL="error"))
    try:
        assert _read_line(observer, 60) == "watching 2\n"  # the peer's session, and its own
        cut = time.time()
        assert _ip("-n", two_hosts["client_ns"], "link", "set", two_hosts["client_dev"], "down").returncode == 0
        lost = _read_line(peer, 3.0)
        client_seconds = time.time() - cut
        freed = _read_line(observer, 3.0)
        assert lost.startswith("lost"), f"the client did not see the cut: {lost!r}"
        assert freed.startswith("freed "), f"the node kept the cut-off session: {freed!r}"
        node_seconds = float(freed.split()[1]) - cut
        assert node_seconds < 2.5 and client_seconds < 2.5, (node_seconds, client_seconds)
    finally:
        for process in (peer, observer):
            process.kill()
            process.wait()


WATCH_SESSIONS = textwrap.dedent("""
    import sys, time
    import genie._C as C
    c = C.Client("127.0.0.1", int(sys.argv[1]))
    print("watching", c.stats()["sessions"], flush=True)
    while c.stats()["sessions"] > 1:
        time.sleep(0.01)
    print("freed", time.time(), flush=True)
""")


# ---- no false positives ---------------------------------------------------------------------

def _matmul_chain(n_ops):
    """A graph of `n_ops` chained 512x512 float32 matmuls x = mm(x, w), written alternately into
    two buffers (aten::mm.out: no memory grows with n_ops). Inputs: x (0), w (1), a buffer (2).
    Returns the graph and the id of its last value."""
    import torch
    import genie._C as C
    nodes, source, target = [], 0, 2
    for i in range(n_ops):
        nodes.append(("aten::mm", "out", [("", C.TensorRef(source)), ("", C.TensorRef(1)),
                                          ("out", C.TensorRef(target))], 1))
        source, target = 3 + i, source
    return C.encode_graph([(torch.float32, None)] * 3, 0, nodes), source


def _busy(seconds):
    """Two busy processes per core for `seconds` (a node compiling, another tenant)."""
    code = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(2 * os.cpu_count())]


def test_a_long_run_a_large_upload_and_a_busy_machine_are_no_dead_peer(node):
    """The default 2 s peer timeout against a 30 s graph run, a 1 GiB upload, and every core
    taken by other processes: the session survives all three, with the right results."""
    import torch
    n = node()
    with _client(n.port, timeout_ms=60000) as c:
        x, w, buffer = torch.randn(512, 512), torch.eye(512), torch.empty(512, 512)
        inputs = [(0, x), (1, w), (2, buffer)]
        # A run of at least 30 s: sized by a calibration for 36 s, run again larger if the
        # machine got faster meanwhile.
        n_ops, seconds = 100, 0.0
        for target in (1.0, 36.0, 36.0):
            if seconds >= 30:
                break
            if seconds:
                n_ops = int(n_ops * target / seconds)
            graph, out = _matmul_chain(n_ops)
            gid = c.register_graph(graph)
            start = time.monotonic()
            (y,) = c.run_graph(gid, inputs, [], [(out, 0, None, 0)])
            seconds = time.monotonic() - start
            torch.testing.assert_close(y, x)  # x @ I, n_ops times
        assert seconds >= 30, f"the long run took {seconds:.1f} s"
        # 1 GiB in one PutTensors, and back.
        big = torch.ones(1 << 28)  # 2^28 float32
        handle = os.urandom(16)
        try:
            c.put([(handle, big, 1)])
        except Exception as error:
            raise AssertionError(f"the 1 GiB upload failed; the node said: {n.log_text()}") from error
        back = c.get([handle])[0]
        assert back.shape == big.shape and float(back[-1]) == 1.0
        del back
        c.free([handle])
        # Every core busy for 6 s while the session idles, then works.
        hogs = _busy(6)
        try:
            time.sleep(6)
            c.ping()
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
        assert c.stats()["sessions"] == 1
