import os
import pathlib
import socket

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
