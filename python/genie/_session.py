"""Which nodes Genie talks to: `genie.init`, `GENIE_SERVER`, and the embedded node.

`init(server=...)` names one or more nodes ("host:port", a comma-separated list, or a list);
`remote_accelerator:i` is the i-th. With none given and no `GENIE_SERVER`, Genie starts an
*embedded* `genie-node` on loopback (port chosen by the OS, a random auth token in a 0600
file) when a device is first used, and stops it at exit; if it dies, the next use starts
another. Connections are made on first use of a device.

`init(etcd=URL)` or `GENIE_ETCD` makes the nodes those registered in etcd at that moment
(genie.membership), sorted by address.

Environment: `GENIE_SERVER` (nodes), `GENIE_ETCD` and `GENIE_ETCD_PREFIX` (nodes registered in
etcd), `GENIE_AUTH_TOKEN` (token for named nodes),
`GENIE_TIMEOUT_MS` (per-request timeout, default 60000), `GENIE_NODE_BIN` (the genie-node
executable for the embedded node), `GENIE_EMBEDDED_DEVICE` (its device, default "cpu").
"""

from __future__ import annotations

import atexit
import os
import secrets
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

import torch

from . import config
from . import runtime as _runtime
from .errors import GenieConnectionError, GenieError


@dataclass(frozen=True)
class NodeAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_servers(server) -> list[NodeAddress]:
    """"host:port,host:port" or a list of them -> addresses. Raises ValueError naming the bad one."""
    items = server.split(",") if isinstance(server, str) else list(server)
    addresses = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"genie: server '{item}' is not HOST:PORT")
        addresses.append(NodeAddress(host.strip("[]"), int(port)))
    return addresses


# The embedded node's OpenMP spin, in libgomp's wait iterations (GOMP_SPINCOUNT: a worker polls
# this many times, a `pause` instruction each, after a parallel region before it sleeps on a
# futex). libgomp's default, 300,000, lasts milliseconds: after a step the node's worker would
# still hold a core while this process, on the same cores, takes the reply and records its
# next step. 10,000 lasts a fraction of a millisecond, which still covers the gaps between a
# step's kernels. A GOMP_SPINCOUNT or OMP_WAIT_POLICY in the environment is kept. Measured in
# docs/perf/compile.md ("The embedded node's OpenMP spin").
EMBEDDED_GOMP_SPINCOUNT = "10000"


class EmbeddedNode:
    """A genie-node process on loopback owned by this Python process.

    Its environment is this process's, with GENIE_LOG_LEVEL=warn and
    GOMP_SPINCOUNT=EMBEDDED_GOMP_SPINCOUNT where they are unset.
    """

    def __init__(self, device: str = "cpu") -> None:
        from . import _C
        self.binary = config.get("GENIE_NODE_BIN") or _C.node_binary()
        self.device = device
        self.token = secrets.token_hex(16)
        self.process: subprocess.Popen | None = None
        self.address: NodeAddress | None = None
        self._token_file: str | None = None

    def start(self) -> NodeAddress:
        fd, self._token_file = tempfile.mkstemp(prefix="genie-token-")
        with os.fdopen(fd, "w") as f:
            f.write(self.token)
        os.chmod(self._token_file, 0o600)
        env = dict(os.environ)
        env.setdefault("GENIE_LOG_LEVEL", "warn")
        if "GOMP_SPINCOUNT" not in env and "OMP_WAIT_POLICY" not in env:
            env["GOMP_SPINCOUNT"] = EMBEDDED_GOMP_SPINCOUNT
        args = [self.binary, "--listen", "127.0.0.1:0", "--device", self.device, "--auth-token-file", self._token_file]
        # Operator libraries this process loaded (torchvision's ops, through torch.ops.load_library
        # when torchvision is imported): the node loads them too, so graphs may name their ops.
        # A library loaded after the node started is not seen by it (its ops: UnknownOp), nor is
        # one the node cannot load (one that needs libtorch_python: the node warns).
        for library in sorted(torch.ops.loaded_libraries):
            args += ["--try-load-library", library]
        # The node's stdin is a pipe only this process writes to: when this process ends in any
        # way (killed by a signal included), the pipe closes and the node shuts itself down.
        args += ["--watch-fd", "0"]
        # torch.compile's parts are compiled on the node by a worker in this interpreter, which
        # has genie and torch (src/node/compiled_parts.h).
        args += ["--compile-python", sys.executable]
        self.process = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None,
                                        text=True, env=env)
        line = self._read_line(timeout_s=30.0)
        marker = "listening on "
        if marker not in line:
            self.stop()
            raise GenieConnectionError(f"genie: the embedded genie-node ({self.binary}) did not start: {line!r}")
        self.address = parse_servers(line.split(marker, 1)[1].split()[0])[0]
        return self.address

    def _read_line(self, timeout_s: float) -> str:
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        return result[0] if result else ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def disown(self) -> None:
        """In a forked child: the process and its token file are the parent's; forget them.
        The child's copy of the node's stdin is closed, so the node ends with the parent."""
        if self.process is not None and self.process.stdin is not None:
            try:
                self.process.stdin.close()
            except OSError:
                pass
        self.process = None
        self._token_file = None
        self.address = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None and self.process.stdin is not None:
            self.process.stdin.close()
        if self._token_file and os.path.exists(self._token_file):
            os.unlink(self._token_file)
        self._token_file = None


class Session:
    """The nodes of this process: addresses, token, the embedded node if any."""

    def __init__(self, servers: list[NodeAddress], auth_token: str, embedded: EmbeddedNode | None,
                 timeout_ms: int, keep_host_copy: bool = False) -> None:
        self.servers = servers
        self.auth_token = auth_token
        self.embedded = embedded
        self.timeout_ms = timeout_ms
        self.keep_host_copy = keep_host_copy  # runtimes keep a lineage to rebuild a lost node's state

    def connect(self, index: int):
        from . import _C
        if index >= len(self.servers):
            raise GenieError(f"remote_accelerator:{index} does not exist: genie has {len(self.servers)} device(s)")
        if self.embedded is not None and not self.embedded.alive():
            self.servers[index] = self.embedded.start()
        address = self.servers[index]
        return _C.Client(address.host, address.port, name=f"genie-python[{os.getpid()}]",
                         auth_token=self.auth_token, timeout_ms=self.timeout_ms)


_session: Session | None = None
_lock = threading.Lock()


def init(server=None, auth_token: str | None = None, timeout_ms: int | None = None,
         keep_host_copy: bool | None = None, etcd: str | None = None) -> Session:
    """Chooses the nodes (see module docstring). Idempotent without arguments."""
    global _session
    _runtime.check_not_forked("genie.init")
    with _lock:
        if _session is not None and server is None and keep_host_copy is None and etcd is None:
            return _session
        if _session is not None:
            _shutdown_locked()
        from . import _C
        server = _servers_from_etcd(server, etcd)
        server = server if server is not None else config.get("GENIE_SERVER")
        timeout_ms = timeout_ms or config.get("GENIE_TIMEOUT_MS")
        if keep_host_copy is None:
            keep_host_copy = config.get("GENIE_KEEP_HOST_COPY")
        if server:
            servers = parse_servers(server)
            if not servers:
                raise ValueError("genie.init: no server given")
            token = auth_token if auth_token is not None else config.get("GENIE_AUTH_TOKEN")
            _session = Session(servers, token, None, timeout_ms, keep_host_copy)
        else:
            node = EmbeddedNode(config.get("GENIE_EMBEDDED_DEVICE"))  # started on first connect
            _session = Session([NodeAddress("127.0.0.1", 0)], node.token, node, timeout_ms, keep_host_copy)
        _C.set_device_count(len(_session.servers))
        return _session


def _servers_from_etcd(server, etcd: str | None):
    """`server`, or the nodes registered in etcd when `etcd` (else `GENIE_ETCD`, unless a server
    is named) gives a URL. Raises ValueError when both name nodes, GenieConnectionError naming
    the URL when etcd cannot be reached or lists none."""
    if server is not None and etcd is not None:
        raise ValueError("genie.init: give server= or etcd=, not both")
    if server is None and etcd is None:
        etcd = config.get("GENIE_ETCD")
        if etcd and config.get("GENIE_SERVER"):
            raise ValueError("genie: GENIE_SERVER and GENIE_ETCD are both set; set one")
    if not etcd:
        return server
    from .membership import addresses_from_etcd  # imported only when etcd is used
    return addresses_from_etcd(etcd, config.get("GENIE_ETCD_PREFIX"))


def session() -> Session:
    return _session if _session is not None else init()


def make_runtime(index: int) -> _runtime.Runtime:
    """The runtime of `remote_accelerator:index` in this process's session (genie.runtime's
    registry calls it through `genie.runtime._make_runtime`)."""
    current = session()
    if index >= len(current.servers):
        raise RuntimeError(f"remote_accelerator:{index} does not exist: genie has {len(current.servers)} device(s)")
    return _runtime.Runtime(index, lambda: current.connect(index), current.keep_host_copy, current.auth_token or "")


_runtime._make_runtime = make_runtime


def _shutdown_locked() -> None:
    global _session
    for runtime in _runtime.all_runtimes():
        try:
            runtime.close()
        except Exception:  # noqa: BLE001 - shutting down
            pass
    _runtime.reset_runtimes()
    if _session is not None and _session.embedded is not None:
        _session.embedded.stop()
    _session = None


def shutdown() -> None:
    """Closes every session and stops the embedded node (also done at exit)."""
    with _lock:
        _shutdown_locked()


atexit.register(shutdown)


def _after_fork_in_child() -> None:
    """A forked child (os.fork, multiprocessing's fork start method, DataLoader workers) owns
    none of the parent's sessions: the embedded node is the parent's (not stopped at the
    child's exit), and any use of remote_accelerator raises (genie.runtime.check_not_forked).
    The lock is made anew: another thread of the parent may have held it."""
    global _session, _lock
    _lock = threading.Lock()
    if _session is not None and _session.embedded is not None:
        _session.embedded.disown()
    _session = None


os.register_at_fork(after_in_child=_after_fork_in_child)
