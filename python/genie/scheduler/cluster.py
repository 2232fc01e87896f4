"""The machines a schedule places work on: nodes, the links between them, and the cost model.

A `Cluster` is what the scheduler knows about the `genie-node`s it may use: per node its
memory (bytes), its measured compute rate (FLOP/s) and memory bandwidth (B/s), and the
weights and state already resident there; per link its measured bandwidth (B/s) and latency
(s). The numbers come from measurement (genie.scheduler.calibrate), not from a table.

The cost model (docs/scheduler.md):

- compute: the roofline (Williams, Waterman & Patterson, "Roofline: an insightful visual
  performance model for multicore architectures", CACM 52(4), 2009): a group takes
  ``max(flops / flops_per_s, bytes_accessed / bytes_per_s)`` seconds on a node;
- transfer: the Hockney model (R. W. Hockney, "The communication challenge for MPP: Intel
  Paragon and Meiko CS-2", Parallel Computing 20(3), 1994): ``latency_s + nbytes /
  bytes_per_s`` seconds between two different ends, 0 on the same node.

`CLIENT_NAME` ("client") is the program's process as an end of a link.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

CLIENT_NAME = "client"
DEVICE_KINDS = ("cpu", "cuda")


@dataclass(frozen=True)
class NodeSpec:
    """One `genie-node` and its device.

    `name`: unique, not "client". `device`: "cpu" or "cuda".
    `memory_limit`: the node's memory limit (B). `memory_free`: what is free now (B), after
    the weights and state resident there and whatever else runs there.
    `flops_per_s`: measured compute rate (FLOP/s). `bytes_per_s`: measured memory bandwidth
    (B/s). `resident`: names of weights and state already resident on the node.
    Raises ValueError for a non-positive rate, a negative or inconsistent memory size, an
    unknown device kind or the name "client".
    """

    name: str
    device: str
    memory_limit: int
    memory_free: int
    flops_per_s: float
    bytes_per_s: float
    resident: frozenset[str] = frozenset()

    def __post_init__(self):
        if self.name == CLIENT_NAME or not self.name:
            raise ValueError(f"node name {self.name!r} is reserved or empty")
        if self.device not in DEVICE_KINDS:
            raise ValueError(f"node {self.name!r}: device {self.device!r} is not one of {DEVICE_KINDS}")
        if not 0 <= self.memory_free <= self.memory_limit:
            raise ValueError(f"node {self.name!r}: memory_free {self.memory_free} B is not within "
                             f"[0, memory_limit {self.memory_limit} B]")
        if not (self.flops_per_s > 0 and self.bytes_per_s > 0):
            raise ValueError(f"node {self.name!r}: flops_per_s and bytes_per_s must be positive")
        object.__setattr__(self, "resident", frozenset(self.resident))


@dataclass(frozen=True)
class Link:
    """A measured, symmetric link between ends `a` and `b` (node names or "client").

    `bytes_per_s`: bandwidth (B/s); `latency_s`: one-way latency (s). Raises ValueError for a
    non-positive bandwidth, a negative latency or a link from an end to itself.
    """

    a: str
    b: str
    bytes_per_s: float
    latency_s: float

    def __post_init__(self):
        if self.a == self.b:
            raise ValueError(f"link from {self.a!r} to itself")
        if not self.bytes_per_s > 0 or self.latency_s < 0:
            raise ValueError(f"link {self.a!r}-{self.b!r}: bytes_per_s must be positive and latency_s >= 0")

    def seconds(self, nbytes: int) -> float:
        """The Hockney time of `nbytes` over this link (s)."""
        return self.latency_s + nbytes / self.bytes_per_s


@dataclass(frozen=True)
class Cluster:
    """Nodes (in a fixed order: ties are broken by it) and the measured links.

    Link lookup (`link`): a link listed for the pair (either order) is used as is. A pair of
    nodes with no listed link is estimated from each node's link to the client, taken as its
    network interface on a switched network: the slower bandwidth and the larger latency of
    the two. An end with no client link at all uses `default_bytes_per_s` and
    `default_latency_s` (assumed, not measured: 10 Gb/s Ethernet, 50 µs, overridable).
    Raises ValueError for duplicate node names or a link naming an unknown end.
    """

    nodes: tuple[NodeSpec, ...]
    links: tuple[Link, ...] = ()
    default_bytes_per_s: float = 1.25e9
    default_latency_s: float = 50e-6
    _index: dict = field(init=False, repr=False, compare=False)
    _links: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "links", tuple(self.links))
        index = {}
        for i, node in enumerate(self.nodes):
            if node.name in index:
                raise ValueError(f"duplicate node name {node.name!r}")
            index[node.name] = i
        links = {}
        for link in self.links:
            for end in (link.a, link.b):
                if end != CLIENT_NAME and end not in index:
                    raise ValueError(f"link {link.a!r}-{link.b!r} names an unknown node {end!r}")
            links[(link.a, link.b)] = link
            links[(link.b, link.a)] = link
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_links", links)

    def node(self, name: str) -> NodeSpec:
        """The node called `name`; KeyError if there is none."""
        return self.nodes[self._index[name]]

    def index(self, name: str) -> int:
        """The position of node `name` in `nodes`; KeyError if there is none."""
        return self._index[name]

    def link(self, a: str, b: str) -> Link:
        """The link between ends `a` and `b` (listed, or estimated by the rule in the class
        docstring). ValueError when `a == b`; KeyError for an unknown node."""
        listed = self._links.get((a, b))
        if listed is not None:
            return listed
        for end in (a, b):
            if end != CLIENT_NAME:
                self.node(end)
        if a == b:
            raise ValueError(f"no link from {a!r} to itself")
        if CLIENT_NAME in (a, b):
            return Link(a, b, self.default_bytes_per_s, self.default_latency_s)
        la, lb = self.link(CLIENT_NAME, a), self.link(CLIENT_NAME, b)
        return Link(a, b, min(la.bytes_per_s, lb.bytes_per_s), max(la.latency_s, lb.latency_s))

    def transfer_s(self, a: str, b: str, nbytes: int) -> float:
        """Seconds to move `nbytes` from end `a` to end `b`: 0 when a == b, else Hockney."""
        if a == b:
            return 0.0
        return self.link(a, b).seconds(nbytes)


def compute_s(group, node: NodeSpec) -> float:
    """Roofline time of `group` (a genie.semantics.groups.Group) on `node` (s)."""
    return max(group.flops / node.flops_per_s, group.bytes_accessed / node.bytes_per_s)


# Device classes of the simulated clusters: (device, FLOP/s, B/s, memory B). Orders of
# magnitude of current parts, for benchmarks only; real clusters come from calibrate.
GiB = 1 << 30
_SIMULATED_KINDS = (
    ("cuda", 60e12, 0.9e12, 24 * GiB),
    ("cuda", 150e12, 2.0e12, 40 * GiB),
    ("cuda", 400e12, 3.3e12, 80 * GiB),
    ("cuda", 700e12, 4.8e12, 141 * GiB),
    ("cpu", 2e12, 0.2e12, 256 * GiB),
)
_SIMULATED_NICS = ((1.25e9, 60e-6), (3.125e9, 30e-6), (12.5e9, 10e-6), (50e9, 5e-6))


def simulated(n: int, seed: int = 0, *, rack_size: int = 8, rack_bytes_per_s: float = 100e9,
              rack_latency_s: float = 2e-6, busy_fraction: float = 0.3) -> Cluster:
    """A reproducible heterogeneous cluster of `n` nodes "n0".."n{n-1}" (for benchmarks).

    Each node draws a device class (see `_SIMULATED_KINDS`), a ±20 % spread on its rates, a
    network interface (its client link, `_SIMULATED_NICS`) and, with probability
    `busy_fraction`, up to half of its memory already in use. Nodes in the same rack of
    `rack_size` are joined by listed links of `rack_bytes_per_s` (B/s) and `rack_latency_s`
    (s); other pairs use the Cluster's default rule. The same (n, seed, ...) gives the same
    cluster. Raises ValueError for n < 1 or rack_size < 1.
    """
    if n < 1 or rack_size < 1:
        raise ValueError("simulated: n and rack_size must be at least 1")
    rng = random.Random(seed)
    nodes, links = [], []
    for i in range(n):
        device, flops, bw, mem = rng.choice(_SIMULATED_KINDS)
        used = int(mem * rng.uniform(0, 0.5)) if rng.random() < busy_fraction else 0
        nodes.append(NodeSpec(f"n{i}", device, mem, mem - used, flops * rng.uniform(0.8, 1.2),
                              bw * rng.uniform(0.8, 1.2)))
        nic_bw, nic_lat = rng.choice(_SIMULATED_NICS)
        links.append(Link(CLIENT_NAME, f"n{i}", nic_bw, nic_lat * rng.uniform(0.8, 1.2)))
    for start in range(0, n, rack_size):
        rack = range(start, min(start + rack_size, n))
        links += [Link(f"n{i}", f"n{j}", rack_bytes_per_s, rack_latency_s) for i in rack for j in rack if i < j]
    return Cluster(tuple(nodes), tuple(links))
