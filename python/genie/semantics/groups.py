"""The placement graph: what semantic analysis hands the scheduler (genie.scheduler).

A `GroupGraph` is a DAG of `Group`s: each group is one unit the scheduler places on one node
(a pattern instance such as one attention or one convolution block, or a run of ops no pattern
claims), with its costs from shapes. Edges carry the bytes of the activations one group's
outputs give another; `CLIENT` stands for the program's process (inputs come from it, read
results go back to it). Weights and state (KV caches, optimizer state) are named: groups that
read the same weight or state name must run where that tensor is resident (weights are never
moved once resident; a KV cache stays with the attention that reads it).

Units: FLOP for `flops`, bytes for every `*_bytes`. This module imports nothing of torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

CLIENT = -1  # an edge's end that is the client process


@dataclass(frozen=True)
class Group:
    """One unit of placement.

    `id`: its index in `GroupGraph.groups` (groups are in a topological order).
    `kind`: the pattern that made it ("attention", "kv_cache", "conv_block", "mlp", "embedding",
    "norm") or "ops" for ops no pattern claims.
    `phase`: "prefill", "decode", "vision", "forward", "backward" or "optimizer".
    `ops`: indices of its ops in the analysed graph.
    `flops`: floating-point operations its ops perform (FLOP).
    `bytes_accessed`: bytes its ops read and write in memory (B): with `flops`, its arithmetic
    intensity (FLOP/B) for a roofline time estimate.
    `weights` / `weight_bytes`: the weight tensors it reads (names) and their total size (B).
    `state` / `state_bytes`: the KV caches and other state carried across steps it reads or
    writes (names) and their total size (B).
    `activation_bytes`: the peak size of the transient tensors it makes (B).
    """

    id: int
    kind: str
    phase: str
    ops: tuple[int, ...]
    flops: float
    bytes_accessed: int
    weights: tuple[str, ...] = ()
    weight_bytes: int = 0
    state: tuple[str, ...] = ()
    state_bytes: int = 0
    activation_bytes: int = 0

    @property
    def memory_bytes(self) -> int:
        """The memory it needs on its node while it runs (B): weights, state and activations."""
        return self.weight_bytes + self.state_bytes + self.activation_bytes


@dataclass(frozen=True)
class Edge:
    """`nbytes` of tensors group `src` makes and group `dst` reads; `src` or `dst` may be CLIENT."""

    src: int
    dst: int
    nbytes: int


@dataclass
class GroupGraph:
    """Groups in a topological order and the edges between them (and with the client)."""

    groups: list[Group] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)

    def total_flops(self) -> float:
        return sum(g.flops for g in self.groups)

    def preds(self, gid: int) -> list[Edge]:
        """The edges into group `gid`."""
        return [e for e in self.edges if e.dst == gid]
