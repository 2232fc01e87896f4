import os
import pathlib
import socket
import subprocess
import sys
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("GENIE_BUILD_DIR", ROOT / "build")) / "bin"


@pytest.fixture
def genie_bench():
    path = BIN / "genie-bench"
    assert path.exists(), f"{path} is missing: run tools/setup.sh"
    return path


@pytest.fixture
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The C++ extension's tests talk to a real genie-node over loopback (as tools/test.sh does).
os.environ.setdefault("UCX_NET_DEVICES", "lo")
# The embedded node's compiled packages (torch.compile(backend="genie")): kept in the build tree
# between test runs, never in the user's cache.
os.environ.setdefault("GENIE_NODE_COMPILE_CACHE", str(ROOT / "build" / "test-compile-cache"))
os.environ.setdefault("GENIE_NODE_COMPILE_PYTHON", sys.executable)  # the nodes' compile worker: this venv



def pytest_configure(config):
    config.addinivalue_line("markers", "limit(bytes): the --memory-limit of the nodes a test's cluster fixture starts")

class NodeProcess:
    """A genie-node on loopback that a test can kill and start again on the same port:
    `port` 0 lets the OS choose one (then kept for restarts); `token_file`: --auth-token-file;
    `extra_args`: more flags, given at every start."""

    def __init__(self, port: int = 0, token_file: str | None = None, extra_args: list[str] | None = None) -> None:
        self.port = port
        self.token_file = token_file
        self.extra_args = list(extra_args or [])
        self.process = None
        self.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        import re
        command = [str(BIN / "genie-node"), "--listen", self.address, "--log-level", "error"]
        if self.token_file is not None:
            command += ["--auth-token-file", self.token_file]
        command += self.extra_args
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        match = re.match(r"genie-node listening on 127\.0\.0\.1:(\d+)", line)
        assert match, f"genie-node did not start: {line!r}"
        self.port = int(match.group(1))

    def kill(self) -> None:
        import signal
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@pytest.fixture
def genie_node():
    """A real genie-node on 127.0.0.1 (any free port); yields (host, port), then SIGTERM."""
    yield from _genie_node()


@pytest.fixture
def another_genie_node():
    """A second one, for tests with two devices."""
    yield from _genie_node()


def _genie_node():
    import re
    import select
    import subprocess
    import tempfile
    import time

    path = BIN / "genie-node"
    assert path.exists(), f"{path} is missing: run tools/setup.sh"
    log = tempfile.TemporaryFile(mode="w+")
    node = subprocess.Popen([str(path), "--listen", "127.0.0.1:0", "--log-level", "warn"],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        deadline = time.monotonic() + 30
        line = ""
        while not line and time.monotonic() < deadline and node.poll() is None:
            if select.select([node.stdout], [], [], 0.1)[0]:
                line = node.stdout.readline()
        match = re.match(r"genie-node listening on (\S+):(\d+)", line)
        if not match:
            log.seek(0)
            raise RuntimeError(f"genie-node did not start (stdout {line!r}): {log.read()}")
        yield match.group(1), int(match.group(2))
    finally:
        node.terminate()
        try:
            node.wait(timeout=10)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait()
        log.close()


def _ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair: a server at 10.77.0.1 and a client at
    10.77.0.2 (a private /24 that exists only inside the test; nothing leaves the machine).
    Yields server_ns, client_ns, server_ip, server_dev, client_dev. Needs root; skipped otherwise."""
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
