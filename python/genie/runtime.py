"""The runtime of one remote device: its node connection, pending graph and materialization.

One `Runtime` per `remote_accelerator:N`, each with its own `genie._C.Client` session.

- `record(node)` appends to the pending graph (program order). The pending graph is bounded:
  past `max_pending` nodes it is executed (`flush`), so a long loop that never reads a value
  does not grow without limit.
- `_execute(returned, described)` is the one request of a materialization: it cuts the
  *live* pending graph (nodes whose outputs a live LazyTensor still holds, ops that write a
  storage some live tensor aliases, and everything those depend on), lowers it
  (`genie.lower`), registers it once per structure, and runs it with RunGraph. Outputs the
  program still holds stay resident under fresh 128-bit handles; only `returned` values'
  bytes come back; handles of dead tensors are freed in the same message (RunGraph.free).
- Dead LazyTensors are noticed by weakref callbacks, which only append to a list; the
  list is drained at the next request (never from inside a callback).

Errors: a failed run marks the values it would have produced as lost (using one re-raises
the error) and leaves everything else usable; a lost connection marks every value of the
session lost, and the next use reconnects (or restarts the embedded node).
"""

from __future__ import annotations

import os
import threading
import weakref

import torch

from .errors import GenieConnectionError, GenieError
from .graph import Node, Storage, Value, op_name
from .lower import GraphCache, encode, lower

RETURN, KEEP, RETURN_AND_KEEP, KEEP_AND_DESCRIBE = 0, 1, 2, 3
KV_CACHE = 2


def new_handle() -> bytes:
    """A fresh unguessable 128-bit handle (the OS's CSPRNG)."""
    return os.urandom(16)


class Runtime:
    """One remote device. Not thread-safe: PyTorch programs capture from one thread."""

    max_pending = 20000  # nodes; the pending graph runs when it grows past this

    def __init__(self, index: int, connect) -> None:
        self.index = index
        self.device = torch.device("remote_accelerator", index)
        self._connect = connect  # () -> genie._C.Client
        self.client = None
        self.pending: list[Node] = []
        self.dead: list[Value] = []
        self.to_free: list[bytes] = []
        self.graphs = GraphCache()
        self.capture_log: list[Node] | None = None
        self._refs: set = set()
        self._lock = threading.Lock()

    # ---- connection ---------------------------------------------------------------------

    def connection(self):
        if self.client is None:
            self.client = self._connect()
            self.graphs.clear()
        return self.client

    def _lost(self, error: BaseException) -> None:
        """The node went away: every value of the session is lost; the next call reconnects."""
        for ref in list(self._refs):
            t = ref()
            if t is not None:
                t._cell.value.error = error
        for node in self.pending:
            for v in node.outputs:
                v.error = error
        self.pending = []
        self.dead = []
        self.to_free = []
        client, self.client = self.client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - already gone
                pass

    def _call(self, method: str, *args):
        client = self.connection()
        try:
            return getattr(client, method)(*args)
        except GenieConnectionError as error:
            self._lost(error)
            raise

    # ---- tensors ------------------------------------------------------------------------

    def track(self, ref) -> None:
        self._refs.add(ref)

    def on_tensor_dead(self, cell):
        refs, dead = self._refs, self.dead

        def callback(ref, cell=cell):
            refs.discard(ref)
            dead.append(cell.value)

        return callback

    def value_of(self, tensor) -> Value:
        value = tensor._cell.value
        if value.error is not None:
            raise value.error
        return value

    def rebind(self, tensor, value: Value) -> None:
        """After an in-place op: `tensor` now holds `value` (same storage)."""
        old = tensor._cell.value
        old.tensors -= 1
        if old.tensors == 0 and old.handle is not None:
            self.to_free.append(old.handle)
            old.handle = None
        tensor._cell.value = value
        value.tensors += 1

    def record(self, node: Node) -> None:
        if len(self.pending) >= self.max_pending:
            self.flush()
        self.pending.append(node)
        if self.capture_log is not None:
            self.capture_log.append(node)

    def upload(self, cpu: torch.Tensor, residency: int, storage: Storage | None = None) -> Value:
        """Puts a host tensor on the node now (one PutTensors); returns its resident value."""
        from .lazy import LazyTensor  # noqa: F401 - for type clarity only
        handle = new_handle()
        data = cpu.detach()
        if data.requires_grad or isinstance(data, torch.nn.Parameter):
            data = data.data
        self._call("put", [(handle, data, residency)])
        return Value(None, 0, storage or Storage(), data.dtype, handle=handle, residency=residency)

    def upload_tensor(self, cpu: torch.Tensor, residency: int):
        from .lazy import LazyTensor
        meta = torch.empty_strided(cpu.shape, cpu.stride(), dtype=cpu.dtype, device="meta")
        data = cpu if cpu.storage_offset() == 0 and cpu.is_contiguous() else cpu.contiguous()
        if data is not cpu:
            meta = torch.empty(cpu.shape, dtype=cpu.dtype, device="meta")
        return LazyTensor(meta, self.upload(data, residency), self)

    def copy_from_host(self, dst, src: torch.Tensor, residency: int) -> None:
        """`dst.copy_(src)` for a host `src`: upload, then bind or record the copy."""
        from .recorder import record_op
        from .lazy import LazyTensor
        data = src
        same_layout = (src.dtype == dst.dtype and src.shape == dst.shape and src.stride() == dst.stride()
                       and src.storage_offset() == 0 and src.device.type == "cpu")
        if not same_layout or not _dense(src):
            data = torch.empty_strided(dst.shape, dst.stride(), dtype=dst.dtype)
            data.copy_(src)
        value = dst._cell.value
        fresh = (value.node is not None and value.node.op in _FRESH_OPS and value.tensors == 1
                 and value.storage.live == 1 and dst.storage_offset() == 0)
        if fresh:
            self.rebind(dst, self.upload(data, residency, storage=value.storage))
            return
        meta = torch.empty_strided(data.shape, data.stride(), dtype=data.dtype, device="meta")
        uploaded = LazyTensor(meta, self.upload(data, residency), self)
        record_op(torch.ops.aten.copy_.default, (dst, uploaded), {})

    # ---- materialization ----------------------------------------------------------------

    def fetch(self, tensor) -> torch.Tensor:
        """The tensor's values on the host (runs what it depends on, in one request)."""
        value = self.value_of(tensor)
        if value.node is None and not self._pending_writes(value.storage):
            (out,) = self._call("get", [value.handle])
        else:
            returned, _ = self._execute([value], [])
            out = returned[id(value)]
        meta = tensor._meta
        if tuple(out.shape) != tuple(meta.shape):
            out = out.reshape(meta.shape)
        return out

    def describe(self, values: list[Value]) -> list[tuple]:
        """Runs the pending graph keeping `values` resident; returns their descriptors."""
        _, described = self._execute([], values)
        return [described[id(v)] for v in values]

    def run_scalar_op(self, func, args: tuple, kwargs: dict):
        """An op that returns a Python scalar (aten::equal, ...): runs now, returns it."""
        node = Node(func, args, kwargs, 1)
        value = Value(node, 0, Storage(), torch.float32)
        node.outputs = (value,)
        self.record(node)
        returned, _ = self._execute([value], [])
        result = returned[id(value)].item()
        ret_type = str(func._schema.returns[0].type)
        return bool(result) if ret_type == "bool" else result

    def flush(self) -> None:
        """Runs every live pending op (genie.synchronize)."""
        self._drain_dead()
        if self.pending:
            self._execute([], [])
        elif self.to_free and self.client is not None:
            frees, self.to_free = self.to_free, []
            self._call("free", frees)

    def _pending_writes(self, storage: Storage) -> bool:
        return any(storage in node.writes for node in self.pending)

    def _drain_dead(self) -> None:
        dead, self.dead = self.dead, []
        for v in dead:
            v.tensors -= 1
            v.storage.live -= 1
            if v.tensors == 0 and v.handle is not None:
                self.to_free.append(v.handle)
                v.handle = None

    def _live_nodes(self, wanted: set[int]) -> list[Node]:
        needed = set(wanted)
        keep = []
        for node in reversed(self.pending):
            need = any(o.tensors > 0 or id(o) in needed for o in node.outputs) or any(
                s.live > 0 for s in node.writes)
            if need:
                keep.append(node)
                for v in node.inputs():
                    if v.node is not None:
                        needed.add(id(v))
        keep.reverse()
        return keep

    def _execute(self, returned: list[Value], described: list[Value]) -> tuple[dict, dict]:
        self._drain_dead()
        wanted = {id(v) for v in returned} | {id(v) for v in described}
        nodes = self._live_nodes(wanted)
        pending, self.pending = self.pending, []
        try:
            lowered = lower(nodes, [v for v in returned if v.node is None])
            _annotate_kv_cache(nodes)
            client = self.connection()
            lifted, scalars, graph_id = self.graphs.prepare(lowered)
            if graph_id is None:
                graph_id = self._call("register_graph", encode(lowered, lifted))
                self.graphs.remember(lowered, lifted, graph_id)
            bindings = [(i, obj) for i, (kind, obj) in enumerate(lowered.inputs) if kind != "weight"]
            input_handles = {obj for kind, obj in lowered.inputs if kind != "inline"}
            frees = [h for h in self.to_free if h not in input_handles]
            self.to_free = [h for h in self.to_free if h in input_handles]
            specs, spec_values, kept = _output_specs(nodes, lowered.value_ids, returned, described)
            results = self._call("run_graph", graph_id, bindings, scalars, specs, frees)
            del client
        except GenieConnectionError:
            raise
        except BaseException as error:
            for node in pending:
                for v in node.outputs:
                    v.node = None
                    v.error = error
            raise
        for node in pending:
            for v in node.outputs:
                v.node = None
        for v, handle, residency in kept:
            v.handle = handle
            v.residency = residency
        out_returned, out_described = {}, {}
        for (_, action, _, _), v, result in zip(specs, spec_values, results):
            if action in (RETURN, RETURN_AND_KEEP):
                out_returned[id(v)] = result
            elif action == KEEP_AND_DESCRIBE:
                out_described[id(v)] = result
        return out_returned, out_described

    # ---- information --------------------------------------------------------------------

    def stats(self) -> dict:
        return self._call("stats")

    def counters(self) -> dict:
        if self.client is None:
            return {"bytes_sent": 0, "bytes_received": 0, "messages_sent": 0, "round_trips": 0}
        return self.client.counters()

    def close(self) -> None:
        if self.client is not None:
            try:
                self.flush()
            except GenieError:
                pass
            self.client.close()
            self.client = None


def _output_specs(nodes: list[Node], value_ids: dict[int, int], returned: list[Value], described: list[Value]):
    """RunGraph.outputs for a cut: `returned` values come back (and stay resident if a tensor
    holds them), `described` stay resident and report their descriptors, every other value a
    live tensor holds stays resident. Returns (specs, the value of each spec, kept values)."""
    specs, values, kept = [], [], []

    def add(v: Value, action: int) -> None:
        handle = new_handle() if action != RETURN else None
        specs.append((value_ids[id(v)], action, handle, v.residency))
        values.append(v)
        if handle is not None:
            kept.append((v, handle, v.residency))

    for v in returned:
        add(v, RETURN_AND_KEEP if v.tensors > 0 and v.node is not None else RETURN)
    for v in described:
        add(v, KEEP_AND_DESCRIBE)
    seen = {id(v) for v in values}
    for node in nodes:
        for v in node.outputs:
            if v.tensors > 0 and id(v) not in seen:
                add(v, KEEP)
    return specs, values, kept


def _dense(t: torch.Tensor) -> bool:
    return t.is_contiguous()


_FRESH_OPS = frozenset({torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default})

_SDPA = frozenset({torch.ops.aten.scaled_dot_product_attention.default})
_CACHE_WRITERS = frozenset({torch.ops.aten.cat.default, torch.ops.aten.index_copy_.default,
                            torch.ops.aten.index_copy.default, torch.ops.aten.slice_scatter.default})


def _annotate_kv_cache(nodes: list[Node]) -> None:
    """Semantic pass: values that hold a KV cache get residency STATEFUL_KV_CACHE.

    A KV cache is what attention reads as key or value and a cache-update op (cat along the
    sequence, index_copy_, slice_scatter) produced: seen through views (transpose, expand,
    contiguous, ...), its source is the cat's output.
    """
    for node in nodes:
        if node.op not in _SDPA:
            continue
        for arg in node.args[1:3]:
            v = arg
            for _ in range(8):
                if type(v) is not Value or v.node is None:
                    break
                producer = v.node
                if producer.op in _CACHE_WRITERS:
                    v.residency = KV_CACHE
                    break
                inputs = list(producer.inputs())
                if len(inputs) != 1:
                    break
                v = inputs[0]


_runtimes: dict[int, Runtime] = {}


def runtime_for(device: torch.device) -> Runtime:
    """The runtime of `remote_accelerator:N` (connecting on first use: `genie.init`)."""
    from . import _session
    index = device.index or 0
    runtime = _runtimes.get(index)
    if runtime is None:
        runtime = _session.make_runtime(index)
        _runtimes[index] = runtime
    return runtime


def all_runtimes() -> list[Runtime]:
    return list(_runtimes.values())


def reset_runtimes() -> None:
    _runtimes.clear()
