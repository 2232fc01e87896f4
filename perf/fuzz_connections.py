#!/usr/bin/env python3
"""Black-box mutational fuzzer of genie-node's connection path, against a real genie-node process.

What it fuzzes: every TCP port the node listens on, that is its own port (UCX's TCP connection
manager: connection requests and their private data, then UCX wireup) and the ports UCX's tcp
transport opened (tcp connection requests, wireup and active messages), and behind them Genie's
admission (Hello, tokens, pre-session limits) and message verification.

How:
  1. Seeds: genuine sessions are captured with tshark on lo (installed with apt-get if missing):
     node_client_peer uploads a tensor once with UCX's default transports and once with
     UCX_TLS=tcp (so wireup and active messages use the tcp transport's ports), and opens and
     closes sessions (--churn). Each TCP stream's client->node bytes become a seed, tagged with
     the kind of port it went to ("cm": the node's own port, "tcp": a tcp-transport port).
  2. For --minutes: a worker picks a seed and a port (mostly one of the seed's kind), mutates the
     bytes (bit flips, interesting bytes, 1/2/4/8-byte length fields set or nudged, truncation,
     splicing with another seed, random inserts, duplicated or deleted chunks; a mutation hits one
     of the client's turns or the whole stream), connects, sends them (turn by turn, waiting for
     the node's answer as a real client does; or with small fixed delays; or cut anywhere; or in
     one write), ends with a close, a half-close or a reset (SO_LINGER 0, possibly before
     everything was sent), reads what comes back for a moment, and closes. --workers
     connections run at once.
  3. Every --check-every seconds the workers pause and the node is checked: its process runs and a
     fresh real session works (node_client_peer --churn 1, alternately with UCX's default
     transports and with UCX_TLS=tcp); its fds, threads and RSS are sampled from /proc. A node
     that died (or stopped answering) is reported as a crash: every input sent since the last
     good check is saved, with the node's stderr, under --crash-dir, and the node is restarted.
     The node runs with UCX_HANDLE_ERRORS=bt, so each crash is named by the frames that faulted
     (or UCX's assertion). `--replay DIR` sends such a directory's inputs to a fresh node again,
     in order.

Only loopback is used (UCX_NET_DEVICES=lo, 127.0.0.1). Prints executions (connections),
executions per second, crashes, and the node's fds/threads/RSS at start, at most and at end.

    python3 perf/fuzz_connections.py [--minutes 5] [--seed 1] [--workers 4]
    python3 perf/fuzz_connections.py --replay /tmp/genie-fuzz-crashes.XXXX/crash-1
Exit status: 0 with no crash, 1 with a crash, 2 when it could not start.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / "build" / "bin"
HOST = "127.0.0.1"


def log(*args):
    print(*args, flush=True)


# ---- the node ---------------------------------------------------------------------------

class Node:
    """A genie-node process on loopback, and what /proc says of it."""

    def __init__(self, binary: Path, workdir: Path, extra_args=()):
        self.stderr_path = workdir / f"node-{int(time.time() * 1000)}.stderr"
        self.stderr = open(self.stderr_path, "w+")
        command = [str(binary), "--listen", f"{HOST}:0", "--log-level", "warn", *extra_args]
        # UCX prints a backtrace when the process dies of a signal: each crash names its frame.
        env = dict(os.environ, UCX_HANDLE_ERRORS=os.environ.get("UCX_HANDLE_ERRORS", "bt"))
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env)
        line = read_line(self.process, 30)
        match = re.match(r"genie-node listening on (\S+):(\d+)", line)
        if not match:
            self.stop()
            raise RuntimeError(f"genie-node did not start ({line!r}): {self.stderr_text()[-2000:]}")
        self.port = int(match.group(2))
        self.pid = self.process.pid
        # UCX's tcp transport opens its ports when the worker starts; wait until they show.
        deadline = time.monotonic() + 10
        while len(self.listening_ports()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        ports = self.listening_ports()
        self.ports = {"cm": [self.port], "tcp": [p for p in ports if p != self.port]}

    def alive(self):
        return self.process.poll() is None

    def listening_ports(self):
        """Every TCP port the node listens on: its own and the ones UCX's tcp transport opened."""
        inodes = set()
        try:
            fds = os.listdir(f"/proc/{self.pid}/fd")
        except OSError:
            return []
        for fd in fds:
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

    def all_ports(self):
        return self.ports["cm"] + self.ports["tcp"]

    def fds(self):
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def threads(self):
        return len(os.listdir(f"/proc/{self.pid}/task"))

    def rss_kib(self):
        with open(f"/proc/{self.pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))

    def cpu_seconds(self):
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def resources(self):
        return {"fds": self.fds(), "threads": self.threads(), "rss_kib": self.rss_kib()}

    def stderr_text(self):
        if not self.stderr.closed:
            self.stderr.flush()
        with open(self.stderr_path, errors="replace") as f:
            return f.read()

    def exit_description(self):
        rc = self.process.poll()
        if rc is None:
            return "running"
        return f"killed by signal {-rc} ({signal.Signals(-rc).name})" if rc < 0 else f"exit code {rc}"

    def crash_signature(self):
        """What killed the node, in one line: the signal, and UCX's assertion or the three frames
        below the signal handler in the backtrace UCX printed."""
        text = self.stderr_text()
        assertion = re.search(r"(\S+\.c:\d+\s+Assertion .*)", text)
        if assertion:   # the numbers after "failed:" vary from input to input: N
            head, _, detail = assertion.group(1).strip().partition("failed:")
            detail = re.sub(r"\b(0x[0-9a-f]+|\d+)\b", "N", detail)
            return f"{self.exit_description()}: {head}failed:{detail}"
        frames = re.findall(r"^\s*\d+\s+(\S+)\((\S*?)(\+0x[0-9a-f]+)\)", text, re.M)
        names = [f"{Path(lib).name}:{fn}" if fn else f"{Path(lib).name}{offset}" for lib, fn, offset in frames]
        # Below UCX's handler and the kernel's signal trampoline (the first libc frame without a
        # symbol): the three frames that faulted.
        for i, (lib, fn, _) in enumerate(frames):
            if "libc.so" in lib and not fn:
                return f"{self.exit_description()} at {' < '.join(names[i + 1:i + 4]) or '?'}"
        return f"{self.exit_description()} (no backtrace)"

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.stderr.close()


def read_line(process, timeout):
    """The next line `process` prints on stdout within `timeout` s ("" if none)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None and not select.select([process.stdout], [], [], 0)[0]:
            return ""
        if select.select([process.stdout], [], [], 0.05)[0]:
            return process.stdout.readline()
    return ""


def peer_env(tls=None, port_range=None):
    env = dict(os.environ)
    env["UCX_NET_DEVICES"] = "lo"
    if tls:
        env["UCX_TLS"] = tls
    else:
        env.pop("UCX_TLS", None)
    if port_range:
        env["UCX_TCP_PORT_RANGE"] = port_range
    return env


def real_session(node: Node, tls=None, timeout=30.0):
    """A fresh genuine session (connect, Hello, Welcome, Goodbye): (ok, what went wrong)."""
    try:
        done = subprocess.run([str(BIN / "node_client_peer"), str(node.port), "--churn", "1"],
                              env=peer_env(tls), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"node_client_peer --churn 1 (UCX_TLS={tls or 'default'}) took over {timeout} s"
    if done.returncode == 0 and done.stdout.strip() == "done 1":
        return True, ""
    return False, (f"node_client_peer --churn 1 (UCX_TLS={tls or 'default'}) exit {done.returncode}: "
                   f"{done.stdout.strip()} {done.stderr.strip()[-500:]}")


# ---- seeds: a genuine session, captured -------------------------------------------------

def ensure_tshark():
    if shutil.which("tshark"):
        return
    log("tshark not found: installing it (apt-get install tshark)")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Best effort (noninteractive takes the default anyway): no setuid dumpcap.
    subprocess.run([*sudo, "debconf-set-selections"], env=env, capture_output=True, text=True,
                   input="wireshark-common wireshark-common/install-setuid boolean false\n")
    install = [*sudo, "apt-get", "install", "-y", "-q", "--no-install-recommends", "tshark"]
    if subprocess.run(install, env=env, stdout=subprocess.DEVNULL).returncode != 0:
        subprocess.run([*sudo, "apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL, check=True)
        subprocess.run(install, env=env, stdout=subprocess.DEVNULL, check=True)
    if not shutil.which("tshark"):
        raise RuntimeError("tshark is still missing after apt-get install")


class Seed:
    def __init__(self, kind, chunks, origin):
        self.kind = kind          # "cm" or "tcp": which of the node's ports it went to
        self.chunks = chunks      # the TCP segments' payloads, in order
        self.data = b"".join(chunks)
        self.origin = origin      # which capture, which stream

    def boundaries(self):
        out, at = [], 0
        for c in self.chunks[:-1]:
            at += len(c)
            out.append(at)
        return out


def capture_seeds(node: Node, workdir: Path):
    """Genuine sessions captured on lo: each client->node TCP stream becomes a Seed."""
    ensure_tshark()
    pcap = workdir / "session.pcap"
    ports = node.all_ports()
    capture_filter = " or ".join(f"tcp port {p}" for p in ports)
    tshark_log = open(workdir / "tshark.stderr", "w+")
    tshark = subprocess.Popen(["tshark", "-q", "-i", "lo", "-f", capture_filter, "-w", str(pcap)],
                              stdout=subprocess.DEVNULL, stderr=tshark_log)
    try:
        deadline = time.monotonic() + 30
        while "Capturing on" not in (workdir / "tshark.stderr").read_text() and time.monotonic() < deadline:
            if tshark.poll() is not None:
                raise RuntimeError(f"tshark exited: {(workdir / 'tshark.stderr').read_text()}")
            time.sleep(0.05)
        time.sleep(0.5)
        sessions = [("default", None, ["4096"]), ("tcp", "tcp", ["4096"]),
                    ("churn", None, ["--churn", "3"]), ("churn-tcp", "tcp", ["--churn", "3"])]
        # Of two tcp-transport peers on one address, the one whose port is lower connects to the
        # other (UCX 1.22): the client's tcp ports are put below the node's, so that the client
        # opens the tcp-transport connections, to the node's ports, as a remote attacker would.
        top = min(node.ports["tcp"]) - 1
        port_range = f"{max(1024, top - 2000)}-{top}" if top > 1100 else None
        for name, tls, args in sessions:
            peer = subprocess.Popen([str(BIN / "node_client_peer"), str(node.port), *args],
                                    env=peer_env(tls, port_range),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            line = read_line(peer, 30).strip()
            if args[0] != "--churn":
                time.sleep(0.3)   # a heartbeat or two
                peer.kill()
            peer.wait()
            if line not in ("ready", "done 3"):
                raise RuntimeError(f"capture session {name}: node_client_peer said {line!r}: {peer.stderr.read()}")
            time.sleep(0.3)
        time.sleep(1.0)
    finally:
        tshark.send_signal(signal.SIGINT)
        try:
            tshark.wait(timeout=20)
        except subprocess.TimeoutExpired:
            tshark.kill()
            tshark.wait()
        tshark_log.close()
    fields = subprocess.run(["tshark", "-r", str(pcap), "-Y", "tcp.len > 0", "-T", "fields",
                             "-e", "tcp.stream", "-e", "tcp.srcport", "-e", "tcp.dstport", "-e", "tcp.payload"],
                            capture_output=True, text=True, check=True).stdout
    streams = {}
    for line in fields.splitlines():
        parts = line.split("\t")
        if len(parts) != 4 or not parts[3]:
            continue
        stream, src, dst, payload = int(parts[0]), int(parts[1]), int(parts[2]), parts[3]
        if dst not in ports or src in ports:
            continue   # node -> client, or a connection the node made itself
        kind = "cm" if dst == node.port else "tcp"
        streams.setdefault(stream, (kind, []))[1].append(bytes.fromhex(payload.replace(":", "")))
    seeds = [Seed(kind, chunks, f"stream {s}") for s, (kind, chunks) in sorted(streams.items())]
    return seeds, pcap


# ---- mutations --------------------------------------------------------------------------

INTERESTING_BYTES = [0x00, 0x01, 0x7F, 0x80, 0xFF, 0x10, 0x40]


def interesting_ints(width, length):
    top = (1 << (8 * width)) - 1
    values = [0, 1, 2, 7, 8, 16, 64, 255, 256, 1024, 2047, 2048, 2049, 4095, 4096, 4097, 65535, 65536,
              0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 32, 1 << 62, 0x7FFFFFFFFFFFFFFF, top,
              length, length - 1, length + 1, 2 * length]
    return [v & top for v in values if v >= 0]


def pick_offset(rng, size, width=1):
    """Mostly near the start (headers and lengths), else anywhere."""
    limit = size - width
    if limit < 0:
        return None
    if rng.random() < 0.5:
        return rng.randint(0, min(limit, 63))
    return rng.randint(0, limit)


def m_flip_bits(rng, data, seeds):
    data = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if data:
            i = pick_offset(rng, len(data))
            data[i] ^= 1 << rng.randrange(8)
    return bytes(data)


def m_set_bytes(rng, data, seeds):
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if data:
            i = pick_offset(rng, len(data))
            data[i] = rng.choice(INTERESTING_BYTES) if rng.random() < 0.7 else rng.randrange(256)
    return bytes(data)


def m_length_field(rng, data, seeds):
    width = rng.choice([1, 2, 4, 4, 8, 8])
    i = pick_offset(rng, len(data), width)
    if i is None:
        return data
    if rng.random() < 0.5 and width > 1:
        i -= i % width   # fields are usually aligned
    order = "little" if rng.random() < 0.85 else "big"
    current = int.from_bytes(data[i:i + width], order)
    top = (1 << (8 * width)) - 1
    if rng.random() < 0.6:
        value = rng.choice(interesting_ints(width, len(data)))
    else:
        value = (current + rng.choice([-1, 1]) * rng.randint(1, 64)) & top
    return data[:i] + value.to_bytes(width, order) + data[i + width:]


def m_truncate(rng, data, seeds):
    return data[:rng.randrange(len(data))] if data else data


def m_splice(rng, data, seeds):
    other = rng.choice(seeds).data
    i = rng.randint(0, len(data))
    j = rng.randint(0, len(other))
    return data[:i] + other[j:] if rng.random() < 0.7 else data + other   # or two streams in one


def m_insert_random(rng, data, seeds):
    size = rng.randint(1, 64) if rng.random() < 0.9 else rng.randint(65, 4096)
    i = rng.randint(0, len(data))
    return data[:i] + rng.randbytes(size) + data[i:]


def m_duplicate_chunk(rng, data, seeds):
    if not data:
        return data
    i = rng.randrange(len(data))
    chunk = data[i:i + rng.randint(1, 512)]
    if rng.random() < 0.5:
        return data[:i] + chunk * rng.randint(2, 16) + data[i + len(chunk):]
    j = rng.randint(0, len(data))
    return data[:j] + chunk + data[j:]


def m_delete_chunk(rng, data, seeds):
    if not data:
        return data
    i = rng.randrange(len(data))
    return data[:i] + data[i + rng.randint(1, 256):]


MUTATOR_LIST = [m_flip_bits, m_set_bytes, m_length_field, m_length_field, m_truncate, m_splice,
                m_insert_random, m_duplicate_chunk, m_delete_chunk]


def mutate_chunks(rng, seed, seeds):
    """The seed's client->node turns (chunks), mutated: a mutation hits one turn (the stream's
    structure kept) or the whole stream (then cut again at the old boundaries that still fit)."""
    chunks = list(seed.chunks)
    mutations = []
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3, 4, 6])):
        mutator = rng.choice(MUTATOR_LIST)
        name = mutator.__name__[2:]
        if len(chunks) > 1 and rng.random() < 0.6:
            k = rng.randrange(len(chunks)) if rng.random() < 0.5 else 0
            chunks[k] = mutator(rng, chunks[k], seeds)
            mutations.append(f"{name}@turn{k}")
        else:
            flat = mutator(rng, b"".join(chunks), seeds)
            bounds, at = [], 0
            for c in chunks[:-1]:
                at += len(c)
                if 0 < at < len(flat):
                    bounds.append(at)
            cuts = [0, *sorted(set(bounds)), len(flat)]
            chunks = [flat[a:b] for a, b in zip(cuts, cuts[1:])]
            mutations.append(name)
    chunks = [c for c in chunks if c]
    total = 0
    for k, c in enumerate(chunks):   # at most 64 KiB in all
        if total + len(c) > 65536:
            chunks = chunks[:k] + [c[:65536 - total]]
            break
        total += len(c)
    return [c for c in chunks if c], mutations


def make_input(rng, seeds, node: Node, ports="both"):
    """One test case: the bytes, the port, how they are delivered. `ports`: "cm" or "tcp" keeps
    to the seeds and ports of that kind; "both" mixes them."""
    candidates = [i for i, s in enumerate(seeds) if ports in ("both", s.kind)]
    seed_index = rng.choice(candidates)
    seed = seeds[seed_index]
    r = rng.random()
    if r < 0.05:
        chunks, mutations = list(seed.chunks), ["none"]
    elif r < 0.08:
        chunks, mutations = [rng.randbytes(rng.randint(1, 5000))], ["random"]
    else:
        chunks, mutations = mutate_chunks(rng, seed, seeds)
    data = b"".join(chunks)
    # The port: mostly one of the seed's kind; sometimes any.
    kind = seed.kind if ports != "both" or rng.random() < 0.8 or not node.ports["tcp"] else rng.choice(["cm", "tcp"])
    port_index = rng.randrange(len(node.ports[kind]))
    # The delivery: turn by turn, waiting for the node's answer after each (as a real client
    # does), or with fixed small delays, or cut anywhere, or in one write.
    style = rng.choices(["turns", "delays", "cut", "burst"], weights=[50, 15, 15, 20])[0]
    splits, at = [], 0
    if style in ("turns", "delays"):
        for c in chunks[:-1]:
            at += len(c)
            splits.append(at)
    elif style == "cut" and len(data) > 1:
        splits = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 7))))
    delays_ms = [rng.choice([0, 1, 5, 20]) for _ in splits] if style != "turns" else [0] * len(splits)
    wait_ms = rng.choice([50, 100, 300]) if style == "turns" else 0
    end = rng.choices(["close", "halfclose", "reset", "reset_early", "hold"], weights=[45, 20, 15, 10, 10])[0]
    reset_at = rng.randint(0, len(data)) if end == "reset_early" else None
    read_s = 1.0 if end == "hold" else rng.choice([0.0, 0.02, 0.05, 0.1, 0.2])
    return {"seed": seed_index, "seed_kind": seed.kind, "mutations": mutations, "kind": kind,
            "port_index": port_index, "style": style, "splits": splits, "delays_ms": delays_ms,
            "wait_reply_ms": wait_ms, "end": end, "reset_at": reset_at, "read_s": read_s}, data


def drain(s, seconds, until_quiet_ms=None):
    """Reads what the node sends for up to `seconds` (or until it has answered and then been
    quiet for `until_quiet_ms`): (bytes read, whether the node closed)."""
    received = 0
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return received, False
        if received and until_quiet_ms is not None:
            left = min(left, until_quiet_ms / 1000)
        if not select.select([s], [], [], left)[0]:
            if received and until_quiet_ms is not None:
                return received, False
            continue
        chunk = s.recv(65536)
        if not chunk:
            return received, True
        received += len(chunk)


def deliver(port, spec, data):
    """Connects, sends, ends as the spec says: (connected, bytes received, node closed first)."""
    try:
        s = socket.create_connection((HOST, port), timeout=5)
    except OSError:
        return False, 0, False
    received, closed = 0, False
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        cuts = [0, *spec["splits"], len(data)]
        limit = spec["reset_at"] if spec["reset_at"] is not None else len(data)
        for k in range(len(cuts) - 1):
            piece = data[cuts[k]:min(cuts[k + 1], limit)]
            if piece:
                s.settimeout(5)
                s.sendall(piece)
                s.setblocking(False)
            if cuts[k + 1] >= limit:
                break
            if spec.get("wait_reply_ms"):
                got, closed = drain(s, spec["wait_reply_ms"] / 1000, until_quiet_ms=10)
                received += got
                if closed:
                    break
            elif spec["delays_ms"][k]:
                time.sleep(spec["delays_ms"][k] / 1000)
        if spec["end"] == "halfclose" and not closed:
            s.shutdown(socket.SHUT_WR)
        if spec["end"] not in ("reset", "reset_early") and not closed:
            got, closed = drain(s, spec["read_s"])
            received += got
    except OSError:
        closed = True   # the node reset or refused: an answer like any other
    finally:
        if spec["end"] in ("reset", "reset_early"):
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        s.close()
    return True, received, closed


# ---- the campaign -----------------------------------------------------------------------

class Campaign:
    def __init__(self, args, seeds, workdir):
        self.args = args
        self.seeds = seeds
        self.workdir = workdir
        self.rng = random.Random(args.seed)
        self.node = None
        self.lock = threading.Lock()
        self.executions = 0
        self.connect_failures = 0
        self.answered = {"cm": 0, "tcp": 0}       # connections the node sent bytes on
        self.closed_by_node = {"cm": 0, "tcp": 0}  # ... that the node closed or reset first
        self.bytes_sent = 0
        self.by_kind = {"cm": 0, "tcp": 0}
        self.crashes = []
        self.checks = 0
        self.batch = []          # every input sent since the last good check, in start order
        self.stop_batch = threading.Event()

    def start_node(self):
        self.node = Node(BIN / "genie-node", self.workdir)
        return self.node

    def worker(self, worker_id, deadline, rng):
        while not self.stop_batch.is_set() and time.monotonic() < deadline:
            node = self.node
            spec, data = make_input(rng, self.seeds, node, self.args.ports)
            port = node.ports[spec["kind"]][spec["port_index"]]
            with self.lock:
                spec["seq"] = len(self.batch)
                spec["worker"] = worker_id
                spec["port"] = port
                spec["t_start"] = time.time()
                self.batch.append((spec, data))
            connected, received, closed = deliver(port, spec, data)
            spec["t_end"] = time.time()
            with self.lock:
                if connected:
                    self.executions += 1
                    self.by_kind[spec["kind"]] += 1
                    self.bytes_sent += len(data)
                    self.answered[spec["kind"]] += received > 0
                    self.closed_by_node[spec["kind"]] += closed
                else:
                    self.connect_failures += 1
            if not node.alive():
                self.stop_batch.set()

    def run_batch(self, seconds):
        self.stop_batch.clear()
        deadline = time.monotonic() + seconds
        threads = [threading.Thread(target=self.worker, args=(i, deadline, random.Random(self.rng.getrandbits(64))))
                   for i in range(self.args.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def check(self):
        """After a batch: (ok, why not). The process runs and a real session works."""
        self.checks += 1
        if not self.node.alive():
            return False, f"genie-node died: {self.node.exit_description()}"
        ok, why = real_session(self.node, tls="tcp" if self.checks % 2 else None)
        if not ok:
            time.sleep(1)
            if not self.node.alive():
                return False, f"genie-node died: {self.node.exit_description()}"
            ok, why2 = real_session(self.node, tls="tcp" if self.checks % 2 else None)
            if not ok:
                return False, f"genie-node does not serve: {why}; again: {why2}"
        return True, ""

    def save_crash(self, why):
        index = len(self.crashes) + 1
        out = Path(self.args.crash_dir) / f"crash-{index}"
        out.mkdir(parents=True, exist_ok=True)
        for spec, data in self.batch:
            (out / f"{spec['seq']:06d}.bin").write_bytes(data)
            (out / f"{spec['seq']:06d}.json").write_text(json.dumps(spec))
        stderr = self.node.stderr_text()
        (out / "node.stderr").write_text(stderr)
        (out / "README").write_text(
            f"{why}\n{len(self.batch)} inputs sent since the last good check, in start order "
            f"(NNNNNN.bin, with NNNNNN.json: port kind, delivery, worker, times).\n"
            f"Replay: python3 perf/fuzz_connections.py --replay {out}\n")
        signature = self.node.crash_signature() if not self.node.alive() else why
        self.crashes.append({"dir": str(out), "why": why, "signature": signature, "inputs": len(self.batch),
                             "stderr_tail": stderr[-3000:]})
        log(f"CRASH {index}: {signature}; {len(self.batch)} inputs saved in {out}")


def settle(node, base, timeout=10.0):
    """Waits until fds and threads are back at most at `base` (the guard and reaper work)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node.fds() <= base["fds"] and node.threads() <= base["threads"]:
            return True
        time.sleep(0.1)
    return False


def fuzz(args):
    workdir = Path(tempfile.mkdtemp(prefix="genie-fuzz-conn."))
    log(f"fuzz_connections: seed {args.seed}, {args.workers} workers, {args.minutes} min, work dir {workdir}")
    campaign = Campaign(args, [], workdir)
    node = campaign.start_node()
    log(f"genie-node pid {node.pid}: cm port {node.port}, tcp-transport ports {node.ports['tcp']}")
    seeds, pcap = capture_seeds(node, workdir)
    if not seeds or not any(s.kind == "tcp" for s in seeds) or not any(s.kind == "cm" for s in seeds):
        log(f"seed capture incomplete: {[(s.kind, len(s.data)) for s in seeds]} (pcap {pcap})")
        node.stop()
        return 2
    campaign.seeds = seeds
    seed_dir = workdir / "seeds"
    seed_dir.mkdir()
    for i, s in enumerate(seeds):
        (seed_dir / f"{i:03d}-{s.kind}.bin").write_bytes(s.data)
    log(f"seeds: {len(seeds)} streams from {pcap.name}: "
        + ", ".join(f"{s.kind}:{len(s.data)}B/{len(s.chunks)}seg" for s in seeds))
    ok, why = real_session(node)
    if not ok:
        log(f"no genuine session before fuzzing: {why}")
        node.stop()
        return 2
    time.sleep(3)   # the capture's killed clients are reaped (peer timeout 2 s)
    start = node.resources()
    peak = dict(start)
    instance = {"pid": node.pid, "start": start, "peak": peak}
    instances = [instance]   # one per node process: the first, and one after each crash
    cpu_start = node.cpu_seconds()
    log(f"node at start: fds {start['fds']}, threads {start['threads']}, RSS {start['rss_kib']} KiB")

    began = time.monotonic()
    deadline = began + args.minutes * 60
    fuzz_seconds = 0.0
    restarts = 0
    last_report = began
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        campaign.run_batch(min(args.check_every, deadline - time.monotonic()))
        fuzz_seconds += time.monotonic() - t0
        ok, why = campaign.check()
        if ok:
            sample = node.resources()
            for key in instance["peak"]:
                instance["peak"][key] = max(instance["peak"][key], sample[key])
            campaign.batch = []
        else:
            campaign.save_crash(why)
            instance["end"] = campaign.crashes[-1]["signature"]
            campaign.batch = []
            node.stop()
            restarts += 1
            node = campaign.start_node()
            time.sleep(1)
            instance = {"pid": node.pid, "start": node.resources()}
            instance["peak"] = dict(instance["start"])
            instances.append(instance)
            log(f"genie-node restarted: pid {node.pid}, ports {node.all_ports()}")
        if time.monotonic() - last_report >= 30:
            last_report = time.monotonic()
            r = node.resources()
            log(f"  {time.monotonic() - began:5.0f} s: {campaign.executions} executions, "
                f"{campaign.executions / max(fuzz_seconds, 1e-9):.0f}/s, crashes {len(campaign.crashes)}, "
                f"node fds {r['fds']} threads {r['threads']} RSS {r['rss_kib']} KiB")
    elapsed = time.monotonic() - began

    settled = settle(node, instance["start"])
    time.sleep(0.5)
    cpu_idle_before = node.cpu_seconds()
    time.sleep(2)
    idle_cpu = node.cpu_seconds() - cpu_idle_before
    end = node.resources()
    instance["end"] = end
    ok_final, why_final = real_session(node)
    if not ok_final and not campaign.crashes:
        campaign.crashes.append({"why": f"final session: {why_final}"})
    node_cpu = node.cpu_seconds() - cpu_start if restarts == 0 else None
    node.stop()

    execs = campaign.executions
    log("")
    log(f"executions (connections): {execs} in {elapsed:.0f} s "
        f"({campaign.by_kind['cm']} to the cm port, {campaign.by_kind['tcp']} to tcp-transport ports; "
        f"{campaign.connect_failures} connects refused)")
    log(f"executions/s: {execs / elapsed:.1f} (over the whole run, checks included; "
        f"{execs / max(fuzz_seconds, 1e-9):.1f} while fuzzing)")
    log(f"bytes sent: {campaign.bytes_sent}; connections the node answered with bytes: "
        f"cm {campaign.answered['cm']}, tcp {campaign.answered['tcp']}; that it closed or reset first: "
        f"cm {campaign.closed_by_node['cm']}, tcp {campaign.closed_by_node['tcp']}")
    log(f"liveness checks (real sessions): {campaign.checks}; node restarts: {restarts}")
    log(f"crashes: {len(campaign.crashes)}" + (f" (inputs in {args.crash_dir})" if campaign.crashes else ""))
    kinds = {}
    for c in campaign.crashes:
        kinds.setdefault(c.get("signature", c["why"]), []).append(Path(c.get("dir", "-")).name)
    for signature, dirs in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        log(f"  {len(dirs):4d} x {signature}  [{', '.join(dirs[:5])}{', ...' if len(dirs) > 5 else ''}]")
    if restarts:
        log(f"node processes: {len(instances)} (the first, and one after each crash); the last: pid {instance['pid']}")
    first = instances[0]
    log(f"node fds:     start {first['start']['fds']}, max {max(i['peak']['fds'] for i in instances)}, "
        f"end {end['fds']} (last process: start {instance['start']['fds']})")
    log(f"node threads: start {first['start']['threads']}, max {max(i['peak']['threads'] for i in instances)}, "
        f"end {end['threads']} (last process: start {instance['start']['threads']})")
    log(f"node RSS:     start {first['start']['rss_kib']} KiB, max {max(i['peak']['rss_kib'] for i in instances)} KiB, "
        f"end {end['rss_kib']} KiB (last process: start {instance['start']['rss_kib']} KiB)")
    log(f"fds and threads of the last process back at its start values within 10 s: {'yes' if settled else 'NO'}; "
        f"{idle_cpu:.2f} s of its CPU in 2 s idle after the run"
        + (f"; node CPU {node_cpu:.1f} s over the run" if node_cpu is not None else ""))
    if campaign.crashes or args.keep:
        log(f"kept: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if campaign.crashes else 0


def replay(args):
    """Sends a crash directory's inputs, in order, to a fresh node; says whether it survived."""
    directory = Path(args.replay)
    workdir = Path(tempfile.mkdtemp(prefix="genie-fuzz-replay."))
    node = Node(BIN / "genie-node", workdir)
    log(f"genie-node pid {node.pid}: ports {node.all_ports()}")
    inputs = sorted(directory.glob("*.json"))
    for path in inputs:
        spec = json.loads(path.read_text())
        data = path.with_suffix(".bin").read_bytes()
        ports = node.ports[spec["kind"]]
        deliver(ports[spec["port_index"] % len(ports)], spec, data)
        if not node.alive():
            log(f"genie-node died after {path.name}: {node.crash_signature()}")
            log(node.stderr_text()[-3000:])
            return 1
    time.sleep(1)
    ok, why = real_session(node) if node.alive() else (False, node.exit_description())
    log(f"{len(inputs)} inputs replayed; node {'survived and serves' if ok else 'FAILED: ' + node.crash_signature()}")
    if not ok:
        log(node.stderr_text()[-3000:])
    node.stop()
    shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=4, help="connections at once")
    parser.add_argument("--check-every", type=float, default=10.0, help="seconds of fuzzing between checks")
    parser.add_argument("--crash-dir", help="where inputs that killed the node go (default: a new "
                        "directory under $TMPDIR or /tmp)")
    parser.add_argument("--ports", choices=["both", "cm", "tcp"], default="both",
                        help="fuzz the node's own port (cm: UCX's connection manager), the tcp transport's, or both")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (pcap, seeds, node stderr)")
    parser.add_argument("--replay", metavar="DIR", help="replay a crash directory instead of fuzzing")
    args = parser.parse_args()
    os.environ["UCX_NET_DEVICES"] = "lo"   # loopback only, for the node and every client
    if not args.replay and not args.crash_dir:
        args.crash_dir = tempfile.mkdtemp(prefix="genie-fuzz-crashes.")
    os.environ.pop("UCX_TLS", None)
    for binary in ("genie-node", "node_client_peer"):
        if not (BIN / binary).exists():
            log(f"missing {BIN / binary}: build the project first (tools/setup.sh)")
            return 2
    try:
        return replay(args) if args.replay else fuzz(args)
    except RuntimeError as e:
        log(f"fuzz_connections: {e}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
