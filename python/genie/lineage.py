"""Lineage: the requests that made a session's resident state, kept to rebuild it on a new node.

With `genie.init(keep_host_copy=True)` (or `GENIE_KEEP_HOST_COPY=1`) each runtime logs, in the
order they reached the node, the requests that changed its resident state: uploads (with the
host tensors they sent), graph runs (graph id, input bindings, scalars, the handles they kept,
the handles they freed) and frees, plus the bytes of every graph it registered. Nothing of it
travels: the log lives in this process, so a decode step sends exactly what it sent without it.

When the node is lost (`GenieConnectionError`), the runtime connects again (the same address
when the node is restarted there, or a restarted embedded node) and `replay`s the log on the
new session: weights are uploaded again from their host copies under the same handles, and the
runs that produced the resident state (a KV cache) run again in order, so that every handle
the program holds means the same tensor as before. The program's request that failed is then
sent again. This is lineage-based recovery as in Spark's RDDs (M. Zaharia et al., NSDI 2012):
lost state is recomputed from the recorded operations that produced it.

`prune(live)` drops what the live handles do not need: walking the log backwards, a run is
needed when it keeps or may write (a handle input) a needed handle, and everything a needed run
reads is needed in turn. Replaying a run is deterministic for the ops inference uses; random
ops draw from the node's generator, which the log's `genie::manual_seed` runs seed again.

Thread safety: used under the runtimes' lock (`genie.runtime.locked`), like its Runtime.
"""

from __future__ import annotations

from .graph import KEEP, RETURN


class Lineage:
    """The log of one runtime's state-changing requests (see the module docstring)."""

    def __init__(self) -> None:
        # ("put", items) | ("run", graph_id, bindings, scalars, specs, frees, weights) | ("free", handles)
        self.entries: list[tuple] = []
        self.graphs: dict[bytes, bytes] = {}  # graph id -> its serialized bytes
        self._pruned_at = 0  # len(entries) after the last prune

    def graph(self, graph_id: bytes, graph_bytes: bytes) -> None:
        self.graphs[graph_id] = graph_bytes

    def put(self, items: list[tuple]) -> None:
        """An upload: [(handle, host tensor, residency)], the tensors as sent (kept alive here)."""
        self.entries.append(("put", list(items)))

    def run(self, request: tuple, weights: tuple) -> None:
        """A run, synchronous or not: `request` as `run_graph` took it; `weights` are the handles
        the graph binds itself (GraphInput.handle). Returned outputs are left out of the replay;
        kept ones are kept again under their handles."""
        graph_id, bindings, scalars, specs, frees = request
        kept = [(value, KEEP, handle, residency) for value, action, handle, residency in specs if action != RETURN]
        self.entries.append(("run", graph_id, list(bindings), list(scalars), kept, list(frees), tuple(weights)))

    def free(self, handles: list[bytes]) -> None:
        self.entries.append(("free", list(handles)))

    def forget_runs_after(self, count: int) -> None:
        """Drops the entries logged after the first `count` (runs that failed asynchronously,
        and everything sent after them, which their failure poisoned)."""
        del self.entries[count:]

    def maybe_prune(self, live: set[bytes]) -> None:
        """Prunes when the log has doubled since the last prune (amortized O(1) per entry)."""
        if len(self.entries) >= max(64, 2 * self._pruned_at):
            self.prune(live)

    def prune(self, live: set[bytes]) -> None:
        """Keeps only the entries that rebuilding the `live` handles needs (see the module
        docstring), and the frees of what those entries make, so that a replay holds no more
        memory at any point than the original did."""
        needed = set(live)
        made: set[bytes] = set()  # handles the kept entries make
        kept: list[tuple] = []
        for entry in reversed(self.entries):
            kind = entry[0]
            if kind == "put":
                items = [item for item in entry[1] if item[0] in needed]
                if items:
                    kept.append(("put", items))
                    made.update(item[0] for item in items)
            elif kind == "run":
                _, _, bindings, _, specs, _, weights = entry
                reads = [obj for _, obj in bindings if isinstance(obj, bytes)]
                if any(spec[2] in needed for spec in specs) or any(h in needed for h in reads):
                    kept.append(entry)
                    made.update(spec[2] for spec in specs)
                    needed.update(reads)
                    needed.update(weights)
            else:
                kept.append(entry)  # filtered below, once `made` is complete
        kept.reverse()
        self.entries = []
        for entry in kept:
            if entry[0] == "free":
                handles = [h for h in entry[1] if h in made]
                if not handles:
                    continue
                entry = ("free", handles)
            self.entries.append(entry)
        self._pruned_at = len(self.entries)

    def replay(self, client) -> None:
        """Rebuilds the logged state on `client`'s (new) session. Raises what the client raises."""
        for graph_id, graph_bytes in self.graphs.items():
            if client.register_graph(graph_bytes) != graph_id:
                raise RuntimeError("genie: a graph registered again got another id")
        for entry in self.entries:
            kind = entry[0]
            if kind == "put":
                client.put(entry[1])
            elif kind == "run":
                _, graph_id, bindings, scalars, specs, frees, _ = entry
                client.run_graph_async(graph_id, bindings, scalars, specs, frees)
            else:
                client.free(entry[1])
        failures = client.take_async_failures(True)
        if failures:
            raise failures[0][1]
