"""Errors: each names what failed; afterwards the program's local state is intact."""

import os
import signal
import time

import pytest
import torch

import genie
from genie import GenieConnectionError, GenieRemoteError

DEV = "remote_accelerator:0"


def test_shape_error_names_the_op():
    a = torch.ones(3, 4, device=DEV)
    b = torch.ones(5, 6, device=DEV)
    with pytest.raises(RuntimeError, match="aten::mm"):
        a @ b
    assert (a + 1).sum().item() == 24  # still works


def test_remote_error_names_op_and_index():
    x = torch.arange(4.0).to(DEV)
    index = torch.tensor([7.0]).to(DEV).long()  # out of range, made on the node from a float: only it knows
    y = x * 2
    bad = y[index]
    with pytest.raises(GenieRemoteError) as info:
        bad.cpu()
    err = info.value
    assert err.code == "TorchError" and err.op_index >= 0 and "index" in err.op_name
    assert "out of bounds" in err.node_message or "index" in err.node_message
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]  # state intact, next call works
    with pytest.raises(GenieRemoteError):
        bad.cpu()  # the lost value keeps its error


def test_an_error_only_the_node_can_see_is_the_class_eager_raises():
    weight, index = torch.randn(4, 3), torch.tensor([1, 7])  # 7: out of range, known to the node only
    with pytest.raises(IndexError) as eager:
        torch.index_select(weight, 0, index)
    picked = torch.index_select(weight.to(DEV), 0, index.to(DEV))
    with pytest.raises(IndexError) as remote:
        picked.cpu()
    err = remote.value
    assert isinstance(err, GenieRemoteError) and err.error_class == "c10::IndexError"
    assert err.node_message == str(eager.value)  # eager's own text
    assert str(eager.value) in str(err) and "aten::index_select" in str(err)


def test_unreachable_node_raises_connection_error_quickly(free_port):
    try:
        genie.init(server=f"127.0.0.1:{free_port}")
        start = time.monotonic()
        with pytest.raises(GenieConnectionError, match=f"127.0.0.1:{free_port}"):
            torch.ones(2, device=DEV).cpu()
        assert time.monotonic() - start < 2.5
    finally:
        genie.shutdown()
    assert torch.ones(2, device=DEV).sum().item() == 2.0  # embedded node again


def test_node_killed_mid_run():
    x = torch.randn(256, 256).to(DEV)
    x.cpu()
    node = genie._session.session().embedded
    assert node is not None and node.alive()
    os.kill(node.process.pid, signal.SIGKILL)
    node.process.wait()
    start = time.monotonic()
    with pytest.raises(GenieConnectionError):
        for _ in range(3):
            (x @ x).sum().item()
    assert time.monotonic() - start < 5
    with pytest.raises(GenieConnectionError):
        x.cpu()  # x lived on the dead node
    y = torch.randn(4, 4)
    assert torch.equal(y.to(DEV).cpu(), y)  # the next call starts a new embedded node


@pytest.mark.parametrize("async_chunk", [0, 64], ids=["sync", "async-runs"])
def test_node_killed_while_a_request_waits(async_chunk):
    # The node dies while the client waits for its reply (not before the request was sent):
    # the wait ends with GenieConnectionError once the connection's failure is detected
    # (peer timeout ~1 s), not at the request timeout (60 s). With asynchronous runs, the
    # node dies while it runs them (the read waits behind them).
    import threading
    from genie.runtime import runtime_for
    x = torch.randn(1024, 1024).to(DEV)
    x.cpu()
    runtime_for(torch.device(DEV)).async_chunk = async_chunk
    node = genie._session.session().embedded
    assert node is not None and node.alive()
    y = x
    for _ in range(200):  # seconds of work on the node
        y = y @ x
        y = y / y.norm()
    killer = threading.Timer(0.5, lambda: os.kill(node.process.pid, signal.SIGKILL))
    start = time.monotonic()
    killer.start()
    try:
        with pytest.raises(GenieConnectionError):
            y.sum().item()
    finally:
        killer.join()
        node.process.wait()
    assert 0.4 < time.monotonic() - start < 5
    z = torch.randn(3, 3)
    assert torch.equal(z.to(DEV).cpu(), z)  # a new embedded node


FORK_PROGRAM = r"""
import os, sys, torch, genie
dev = "remote_accelerator:0"
x = torch.arange(4.0, device=dev) * 2
x.cpu()  # resident: the session is connected
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # the child reports, then exits normally: atexit handlers and finalizers run
    os.close(read)
    report = []
    for attempt in (lambda: (x + 1).cpu(), lambda: torch.ones(2, device=dev).cpu()):
        try:
            attempt()
            report.append("no error")
        except genie.GenieConnectionError as error:
            report.append("fork" in str(error) and "spawn" in str(error))
    os.write(write, repr(report).encode())
    sys.exit(0)
os.close(write)
_, status = os.waitpid(pid, 0)
with os.fdopen(read) as f:
    print("child", os.waitstatus_to_exitcode(status), f.read())
print("parent", (x + 1).cpu().tolist())
"""


def test_a_forked_child_neither_uses_nor_tears_down_the_parents_session():
    # A fresh interpreter: the child must exit as a program does, not inside pytest.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FORK_PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith(("child", "parent"))]
    assert lines == ["child 0 [True, True]", "parent [1.0, 3.0, 5.0, 7.0]"], done.stdout[-2000:]


OWNER_PROGRAM = r"""
import sys, time, torch, genie
torch.ones(2, device="remote_accelerator:0").cpu()  # starts the embedded node
print(genie._session.session().embedded.process.pid, flush=True)
time.sleep(600)
"""


def _process_gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def test_the_embedded_node_ends_when_its_owner_is_killed():
    # SIGKILL runs no atexit handler: the node sees its --watch-fd pipe close and shuts down.
    import subprocess
    import sys

    owner = subprocess.Popen([sys.executable, "-c", OWNER_PROGRAM], stdout=subprocess.PIPE, text=True)
    node_pid = None
    try:
        node_pid = int(owner.stdout.readline())
        assert not _process_gone(node_pid, within_s=0.5)  # serving while its owner lives
        owner.kill()
        owner.wait()
        # The node was started by the owner, so it is reparented, not our child: poll its pid.
        assert _process_gone(node_pid, within_s=10), f"genie-node {node_pid} outlived its owner"
    finally:
        owner.kill()
        if node_pid is not None and not _process_gone(node_pid, within_s=0):
            os.kill(node_pid, signal.SIGKILL)  # the test failed: leave no node behind


def test_genie_node_refuses_a_watch_fd_that_is_not_open():
    import subprocess
    from genie import _C

    done = subprocess.run([_C.node_binary(), "--listen", "127.0.0.1:0", "--watch-fd", "57"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--watch-fd 57" in done.stderr, done.stderr


INTERRUPT_PROGRAM = r"""
import os, signal, threading, time, torch, genie
dev = "remote_accelerator:0"
x = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(0)).to(dev)
y = x
for _ in range(80):
    y = y @ x
    y = y / y.norm()
threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
start = time.monotonic()
try:
    y.sum().item()  # the node runs the 160 ops (about a second) while the program waits
    print("not interrupted", time.monotonic() - start)
except KeyboardInterrupt:
    print("interrupted")
print("intact", abs(y.norm().item() - 1) < 1e-3, (x[0, :2] * 0 + 1).tolist())
"""


def test_ctrl_c_while_waiting_leaves_the_values_intact():
    # Ctrl-C arrives while the client waits for the node: KeyboardInterrupt is raised (once the
    # reply is in), and the values of that run stay usable (before: each re-raised the
    # KeyboardInterrupt forever).
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", INTERRUPT_PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[-2:] == ["interrupted", "intact True [1.0, 1.0]"], done.stdout[-2000:] + done.stderr[-2000:]


def _long_run(x):
    """About a second of node work behind one read (1024 x 1024 inputs)."""
    y = x
    for _ in range(60):
        y = y @ x
        y = y / y.norm()
    return y


def test_a_run_longer_than_the_timeout_completes_while_the_node_answers():
    # The request timeout bounds how long the node may stay silent, not how long a run may
    # take: a late reply is waited for while the node answers Pings (its progress thread does,
    # during the run). A stopped node answers neither: GenieConnectionError, bounded.
    genie.shutdown()
    try:
        genie.init(timeout_ms=250)
        x = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(0))
        expected = _long_run(x)
        xd = x.to(DEV)
        start = time.monotonic()
        got = _long_run(xd).cpu()
        assert time.monotonic() - start > 0.25  # longer than the timeout, or the test proves nothing
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        node = genie._session.session().embedded
        pending = _long_run(xd)
        os.kill(node.process.pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(GenieConnectionError, match="did not answer"):
                pending.cpu()
            assert time.monotonic() - start < 5
        finally:
            os.kill(node.process.pid, signal.SIGKILL)
            node.process.wait()
    finally:
        genie.shutdown()
    assert torch.ones(2, device=DEV).sum().item() == 2.0  # a default session again


SPIN_PROGRAM = r"""
import genie, torch
torch.ones(2, device="remote_accelerator:0").cpu()  # starts the embedded node
pid = genie._session.session().embedded.process.pid
environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
print([v.decode() for v in environ if v.startswith((b"GOMP_SPINCOUNT=", b"OMP_WAIT_POLICY="))])
"""


@pytest.mark.parametrize("given, passed", [
    ({}, ["GOMP_SPINCOUNT=10000"]),
    ({"GOMP_SPINCOUNT": "1234"}, ["GOMP_SPINCOUNT=1234"]),
    ({"OMP_WAIT_POLICY": "active"}, ["OMP_WAIT_POLICY=active"]),
], ids=["unset", "spincount-given", "wait-policy-given"])
def test_the_embedded_node_gets_a_short_openmp_spin_unless_one_is_given(given, passed):
    # The node shares the program's cores (docs/configuration.md).
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.pop("GENIE_SERVER", None)
    done = subprocess.run([sys.executable, "-c", SPIN_PROGRAM], env={**env, **given}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == repr(passed)
