"""The runtime of one remote device: its node connection, and when and how its graph runs.

One `Runtime` per `remote_accelerator:N`, each with its own `genie._C.Client` session and its
`Recording` (python/csrc/frontend/recording.h: the pending graph and the books of its values,
kept by the C++ recorder). This layer is the C++ client's only user; it holds the policy:

- Requests. A materialization is one request: `_execute(returned, described)` takes a *cut*
  (the passes of python/csrc/frontend/cut.h: the live pending nodes, lowering, scalar lifting,
  output specs and frees), marks its KV caches and gradients (residency StatefulKvCache and
  Gradient, as genie.semantics finds them in a structure's first cut: `set_residency_analysis`),
  registers its graph once per structure, and runs it with RunGraph. Outputs the program still holds stay resident under fresh 128-bit
  handles; only `returned` values' bytes come back.
- Asynchronous runs. When the pending graph passes `async_chunk` nodes (the recorder calls
  `run_pending`), it is sent as an asynchronous run (`run_graph_async`: no round trip): the node
  executes it while the program records the next ops, as a CUDA stream runs kernels while the
  host enqueues more. Past `max_pending` nodes it runs synchronously. So a long loop that never
  reads a value does not grow without limit.
- Errors. A failed run marks the values it would have produced as lost (using one re-raises the
  error) and leaves everything else usable; a lost connection marks every value of the session
  lost, and the next use reconnects (or restarts the embedded node). With host copies kept
  (`genie.init(keep_host_copy=True)`), a lost connection is recovered instead: the runtime
  connects again and replays its lineage (`genie.lineage`), and the request goes on. A failed
  asynchronous run is reported at the next read or synchronization (as CUDA reports a kernel's
  error): it raises the run's GenieRemoteError (naming its op), and the values that run and
  every request sent after it would have kept are lost (`_reap_async`).
- Threads: every entry into the runtimes (the recorder's kernel, the `genie` API) holds `lock`,
  the process lock (genie.lazy), so threads that use remote devices at once are serialized op
  by op, as one CUDA stream serializes their kernels; each thread's values are its own.

Over 400 lines: the Runtime and the process-wide registry that makes runtimes (with its fork and
GC policy) are one unit; the connection and its error policy are in genie.connection, uploads in genie.uploads, the
node's random generator in genie.rng (mixins of Runtime); the registry of runtimes and the fork
and GC policy at the end of this module.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import time
import warnings

import torch

from . import _C, config, host_eval, progress  # noqa: F401 - host_eval: GENIE_HOST_EVAL applied at import
from . import record as _record
from . import python_ops  # noqa: F401 - configures the C++ recorder's Python entry points at import
from .connection import Connection
from .errors import GenieConnectionError, GenieError
from .graph import KEEP_AND_DESCRIBE, RETURN, RETURN_AND_KEEP, Value
from .lazy import lock
from .rng import RngOps
from .uploads import Uploads


class Runtime(Connection, Uploads, RngOps):
    """One remote device. Call its methods holding `lock`."""


    def __init__(self, index: int, connect, keep_host_copy: bool = False, auth_token: str = "") -> None:
        self.index = index
        self.device = torch.device("remote_accelerator", index)
        # The node's token: another node presents it to put tensors into this session (node to
        # node moves, genie.transfers).
        self.auth_token = auth_token
        self.recording = _C.Recording(index, self)
        # The runtime in C++ (python/csrc/device_runtime.h): reads, runs, the runs in flight.
        # This object is its policy, called only off the fast path (see the hooks below).
        self.native = _C.DeviceRuntime(self.recording)
        self.native.analyse_residency = _residency_analysis is not None
        self.native.observe = _cut_observer is not None
        self.native.transfers_in_python = progress.enabled()  # module moves and large reads, with bars
        Connection.__init__(self, connect, keep_host_copy)
        self.native.lineage = self.lineage is not None
        RngOps.__init__(self)

    def _check_not_forked(self) -> None:
        check_not_forked(str(self.device))

    @staticmethod
    def _async_chunk_for(client) -> int:
        return async_chunk_for(client.device, client.address)

    @property
    def max_in_flight(self) -> int:
        """Asynchronous runs outstanding before the program waits for them (default 32)."""
        return self.native.max_in_flight

    @max_in_flight.setter
    def max_in_flight(self, n: int) -> None:
        self.native.max_in_flight = n

    @property
    def in_flight(self) -> list[int]:
        """The request ids of the asynchronous runs in flight (the C++ runtime's)."""
        return self.native.in_flight

    @property
    def _deferred(self) -> "BaseException | None":
        """An asynchronous run's error waiting to be raised at the next request that waits."""
        return self.native.deferred

    # ---- the pending graph --------------------------------------------------------------

    @property
    def pending(self) -> list:
        """The pending nodes, in program order (a copy)."""
        return self.recording.pending

    @property
    def max_pending(self) -> int:
        """Nodes; the pending graph runs when it grows past this (default 20,000)."""
        return self.recording.max_pending

    @max_pending.setter
    def max_pending(self, n: int) -> None:
        self.recording.max_pending = n

    @property
    def async_chunk(self) -> int:
        """Nodes recorded before the live pending graph is sent as an asynchronous run; 0: never.
        Set at each connection by `async_chunk_for`."""
        return self.recording.async_chunk

    @async_chunk.setter
    def async_chunk(self, n: int) -> None:
        self.recording.async_chunk = n

    def value_of(self, tensor) -> Value:
        """The value a LazyTensor holds; raises it error if it is lost."""
        value = _C.lazy_value(tensor)
        if value.error is not None:
            raise value.error
        return value

    def run_pending(self) -> None:
        """The pending graph passed `async_chunk` or `max_pending` nodes: an asynchronous run, or a
        run now (the recorder's kernel does this in C++; Python callers use this)."""
        self.native.run_pending()

    def _execute(self, returned: list[Value], described: list[Value]) -> tuple[dict, dict]:
        """One request: runs the live pending graph (DeviceRuntime.materialize); returns ({value:
        host tensor} of `returned`, {value: (dtype, shape, strides, offset)} of `described`)."""
        tensors, descs = self.native.materialize(list(returned), list(described))
        return dict(zip(returned, tensors)), dict(zip(described, descs))

    def _execute_async(self) -> None:
        """Sends the live pending graph as an asynchronous run (DeviceRuntime.materialize_async):
        outputs a live tensor holds stay resident; its errors are raised at the next request that
        waits. At most `max_in_flight` runs are outstanding."""
        self.native.materialize_async()

    # ---- the policy: called by the C++ runtime off its fast path -------------------------

    def _cut_taken(self, cut, outputs: list[Value]) -> None:
        """A cut before it is sent: its structure's residency (genie.semantics: KV caches,
        gradients) on its first cut, and the cut observer."""
        if cut.needs_residency and _residency_analysis is not None:
            self.recording.set_residency(cut, _residency_analysis(cut, outputs))
        if _cut_observer is not None:
            _cut_observer(self.device, cut.nodes, outputs)

    def _put(self, handle: bytes, data: torch.Tensor, residency: int) -> None:
        self.lineage.put([(handle, data, residency)])

    def _graph_registered(self, graph_id: bytes, graph_bytes: bytes) -> None:
        self.lineage.graph(graph_id, graph_bytes)

    def _ran(self, cut, request_id: "int | None") -> None:
        """A run was sent (`request_id`: an asynchronous one's), into the lineage."""
        if request_id is not None:
            self._lineage_entry[request_id] = len(self.lineage.entries)
        self.lineage.run(cut.request(), cut.weights)

    def _runs_failed_after(self, request_id: int) -> None:
        """The asynchronous run `request_id` failed: the lineage forgets it and what followed."""
        if request_id in self._lineage_entry:
            self.lineage.forget_runs_after(self._lineage_entry[request_id])
        self._lineage_entry.clear()

    def _prune_lineage(self) -> None:
        """After a run that waited: no asynchronous run names an entry now."""
        self._lineage_entry.clear()
        self.lineage.maybe_prune(set(self.recording.live_handles()))

    def flush(self) -> None:
        """Runs every live pending op and waits for the asynchronous runs (genie.synchronize);
        with nothing pending, sends the batched frees and waits for the node's Ack (so that
        `memory_allocated` then counts them)."""
        self.recording.drain_dead()
        if self.recording.pending_count:
            self._execute([], [])
            return
        frees = self.recording.take_frees([]) if self.recording.has_released and self.client is not None else []
        if frees:
            self._call("free", frees, True)  # waits: the Ack reports the resident bytes after them
            if self.lineage is not None:
                self.lineage.free(frees)
        elif self.native.busy:
            failed = self._reap_async()
            if failed is not None:
                raise failed

    # ---- materialization ----------------------------------------------------------------

    def fetch(self, tensor) -> torch.Tensor:
        """The tensor's values on the host (runs what it depends on, in one request). A value the
        host can compute exactly (genie.host_eval) is answered without a request, unless
        asynchronous runs are in flight (their failures are reported at reads); so is one it
        can compute from small resident values, which are then read whole in one request and
        kept as their host copies (`host_answer`)."""
        if progress.large_read(tensor):
            return self._read_in_slices(tensor)
        out = self.native.fetch(tensor)  # in C++ (what the recorder's kernel calls for a read)
        if out is not None:
            return out
        value = self.value_of(tensor)
        host = self.host_answer(value)
        if host is not None:
            out = host.clone()  # the program may change what it read; the host copy stays
        elif value.node is None and not self.recording.pending_writes(value.storage):
            (out,) = self._call("get", [value.handle])
        else:
            returned, _ = self._execute([value], [])
            out = returned[value]
        if out.shape != tensor.shape:
            # Same elements in another shape (a 0-dim value travels as [1]): the wrapper's shape.
            # Different element counts mean the meta kernel and the node's kernel disagree
            # (native_batch_norm in eval mode: meta says save_mean [C], CPU returns [0]): the
            # node ran the op, so its result is what the program reads.
            if out.numel() == tensor.numel():
                out = out.reshape(tensor.shape)
        return out

    def host_answer(self, value: Value) -> "torch.Tensor | None":
        """`value`'s exact contents computed on the host (genie.host_eval), or None. When the
        host could compute them from small resident values it has no copies of (a tensor being
        printed: PyTorch's formatting reads each element through exact ops), those are read
        whole in one request first and kept as their host copies, so the reads that follow
        need none. None while asynchronous runs are in flight (their failures surface at reads)."""
        return self._on_host(self.recording.host_value, self.recording.host_leaves, value)

    def host_outputs(self, node) -> "list[torch.Tensor] | None":
        """The pending node's outputs computed on the host (an op whose outputs its values decide,
        such as masked_select), reading small resident inputs whole first as `host_answer`
        does; None when the host cannot."""
        return self._on_host(self.recording.host_outputs, self.recording.host_leaves_of, node)

    def _on_host(self, compute, leaves_of, what):
        """compute(what) on the host; when it fails for want of small resident values
        (leaves_of(what)), those are read whole (one GetTensors), kept as their host copies, and
        it is tried again. None while asynchronous runs are in flight."""
        if self.native.busy:
            return None
        out = compute(what)
        if out is None:
            leaves = leaves_of(what)
            if leaves:
                for value, tensor in zip(leaves, self._call("get", [v.handle for v in leaves])):
                    value.host = tensor.reshape(value.shape)
                out = compute(what)
        return out

    def host_copy(self, tensor) -> "torch.Tensor | None":
        """The tensor's exact values if the host knows them without a request (genie.host_eval:
        small integer and bool uploads and what is computed from them); None otherwise. Used
        for eager's value checks at the op (genie.compat); the result must not be changed."""
        if self.native.busy:
            return None
        host = self.recording.host_value(self.value_of(tensor))
        if host is None or host.numel() != tensor.numel():
            return None
        return host.reshape(tensor.shape)

    def _read_in_slices(self, tensor) -> torch.Tensor:
        """The values of a large contiguous tensor (genie.progress.large_read), read in
        progress.CHUNK_BYTES slices, one request each, with a progress bar: contiguous, on the
        host, in the tensor's shape and dtype."""
        flat = tensor.detach().view(-1)
        out = torch.empty(flat.numel(), dtype=tensor.dtype)
        size = tensor.element_size()
        per = max(1, progress.CHUNK_BYTES // size)
        with progress.bar(out.numel() * size, f"genie: reading {tuple(tensor.shape)} from {tensor.device}") as shown:
            for start in range(0, out.numel(), per):
                part = self.fetch(flat[start:start + per])
                out[start:start + part.numel()].copy_(part.reshape(-1))
                shown.update(part.numel() * size)
        return out.view(tensor.shape)

    def describe(self, values: list[Value]) -> list[tuple]:
        """Runs the pending graph keeping `values` resident; returns their descriptors."""
        _, described = self._execute([], values)
        return [described[v] for v in values]

    def run_scalar_op(self, func, args: tuple, kwargs: dict):
        """An op that returns a Python scalar (aten::equal, ...): runs now, returns it. Raises
        PyTorch's device error for tensors of another device."""
        for a in (*args, *kwargs.values()):
            for t in a if isinstance(a, (list, tuple)) else (a,):
                if isinstance(t, torch.Tensor) and t.device != self.device and not (t.dim() == 0 and t.is_cpu):
                    raise RuntimeError("Expected all tensors to be on the same device, but found at least two "
                                       f"devices, {self.device} and {t.device}!")
                if _C.is_lazy(t):
                    self.value_of(t)  # a lost value raises its error
        node = self.recording.append_node(func, args, kwargs, [torch.float32])
        value = node.outputs[0]
        returned, _ = self._execute([value], [])
        result = returned[value].item()
        return bool(result) if str(func._schema.returns[0].type) == "bool" else result

    # ---- information --------------------------------------------------------------------

    def stats(self, parts=()) -> dict:
        """The node's Stats (genie._C.Client.stats); `parts`: graph ids (hex) of compiled parts
        whose facts its "parts" list gives."""
        return self._call("stats", [bytes.fromhex(g) for g in parts])

    def counters(self) -> dict:
        if self.client is None:
            return {"bytes_sent": 0, "bytes_received": 0, "messages_sent": 0, "round_trips": 0, "async_runs": 0,
                    "node_exec_us": 0}
        return self.client.counters()

    def close(self) -> None:
        if self.client is not None:
            try:
                self.flush()
            except GenieError:
                pass
            self.client.close()
            self.client = None
            self.native.detach()
            self.recording.connected = False
        self.session_serial += 1  # what was registered is gone with the session


ASYNC_CHUNK = 256  # nodes per asynchronous run, where they pay (see async_chunk_for)


def async_chunk_for(device: str, address: str) -> int:
    """Nodes per asynchronous run for a node with `device` at `address` ("host:port"):
    `GENIE_ASYNC_CHUNK` if set, else 0 (off) for a CPU node on this host, else ASYNC_CHUNK.

    Off there because a CPU node on the same host computes on the cores the program records
    on (docs/perf/models.md measures it); a GPU node, or a node on another host, computes beside
    the program."""
    chunk = config.get("GENIE_ASYNC_CHUNK")
    if chunk is not None:
        return chunk
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    return 0 if device == "cpu" and loopback else ASYNC_CHUNK


def locked(function):
    """`function`, holding `lock` (an entry point into the runtimes)."""

    @functools.wraps(function)
    def entry(*args, **kwargs):
        with lock:
            return function(*args, **kwargs)

    return entry


_runtimes: dict[int, Runtime] = {}

# Called as f(device, nodes, outputs) with each cut a runtime sends, before it is sent (genie.
# semantics.recorded: the analysis of every step); None when nothing watches.
_cut_observer = None


def set_cut_observer(observer) -> None:
    """Makes every runtime call `observer(device, nodes, outputs)` with each cut it sends: the
    recorder's nodes of the step (genie.graph.Node, program order) and the Values that leave it
    (read, or kept resident for live tensors).
    None: no observer. The observer runs under the process lock; what it raises is the step's."""
    global _cut_observer
    _cut_observer = observer
    for runtime in _runtimes.values():
        runtime.native.observe = observer is not None


# Called as f(cut, outputs) -> {wire value id: residency class} with a structure's first cut:
# its KV caches and gradients (genie.semantics.recorded.residency_ids, installed by `import genie`).
_residency_analysis = None


def set_residency_analysis(analysis) -> None:
    """Makes every runtime call `analysis(cut, outputs)` (the cut and the Values that leave it)
    with the first cut of each graph structure; the {wire value id: class} it returns are the
    residency of those values in that cut and every later one of the structure (no call then).
    None: no value is marked. It runs under the process lock; what it raises is the step's."""
    global _residency_analysis
    _residency_analysis = analysis
    for runtime in _runtimes.values():
        runtime.native.analyse_residency = analysis is not None


@locked
def manual_seed_all(seed: int) -> None:
    """torch.manual_seed(seed) for every remote device (`torch.remote_accelerator.manual_seed_all`)."""
    RngOps.seed_all(seed)
    for runtime in _runtimes.values():
        runtime.manual_seed(seed)


def runtime_for(device: torch.device) -> Runtime:
    """The runtime of `remote_accelerator:N` (connecting on first use: `genie.init`); without
    an index, of this thread's current device (`torch.remote_accelerator.current_device()`)."""
    index = device.index if device.index is not None else _C.current_device()
    runtime = _runtimes.get(index)
    if runtime is None:
        with lock:
            runtime = _runtimes.get(index)
            if runtime is None:
                runtime = _make_runtime(index)
                _runtimes[index] = runtime
                _tune_gc_once()
    return runtime


# Capture calls up through these (genie.record's hooks).
_record._runtime_for = runtime_for
_record._runtime_exists = lambda index: index in _runtimes
# The runtime of device index i for this process's session: genie._session.make_runtime, which
# genie._session installs when it is imported (the session layer is above this one).
_make_runtime = None


_gc_tuned = False


def _tune_gc_once() -> None:
    """On the process's first use of a remote device, Python's cyclic GC is tuned (each change
    can be turned off; docs/configuration.md):

    - `GENIE_GC_FREEZE` (default on): collect garbage, then move every object alive now
      (torch, transformers, the model being moved) to the permanent generation (`gc.freeze`,
      as vLLM does after loading a model), so that full collections, which traverse every
      object in the process, skip them. Frozen objects are still freed by reference counting;
      only cyclic garbage among them is never collected, hence the collection first.
    - `GENIE_GC_THRESHOLD` (default 50,000; 0 leaves it): the youngest generation's threshold
      is raised to it (never lowered), so a model step's Python objects are freed by reference
      counting before a young collection traverses them. Cyclic garbage waits longer: at most
      that many objects more."""
    global _gc_tuned
    if _gc_tuned:
        return
    _gc_tuned = True
    import gc
    threshold = config.get("GENIE_GC_THRESHOLD")
    young, *older = gc.get_threshold()
    if threshold > young:
        gc.set_threshold(threshold, *older)
    if not config.get("GENIE_GC_FREEZE"):
        return
    import atexit
    gc.collect()
    gc.freeze()
    # At exit the frozen objects go back to the GC, so that interpreter shutdown finalizes
    # them as it would have (extensions such as nanobind's check that nothing leaked).
    atexit.register(gc.unfreeze)


def all_runtimes() -> list[Runtime]:
    return list(_runtimes.values())


def _after_fork_in_child() -> None:
    """`os.fork` (and multiprocessing's fork start method) copies the parent's runtimes and
    their clients into the child, but the connections, the node's sessions and the progress
    threads stay the parent's. The child never uses or destroys them: destroying a copied UCX
    worker aborts (UCX checks the pid) and would say Goodbye for the parent. Each client is
    leaked on purpose (one reference more, never dropped); then every runtime refuses further
    use (`Runtime.connection`, `check_not_forked`)."""
    import ctypes
    global _forked_from
    _forked_from = os.getppid()
    lock._at_fork_reinit()  # another thread of the parent may have held it
    for runtime in _runtimes.values():
        if runtime.client is not None:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(runtime.client))
            runtime.client = None
        runtime.native.forget_in_flight()
        runtime.native.detach()


os.register_at_fork(after_in_child=_after_fork_in_child)


_forked_from: int | None = None  # in a forked child: the parent's pid


def check_not_forked(what: str) -> None:
    """Raises GenieConnectionError naming `what` in a forked child: the parent holds the
    connections and the tensors on remote_accelerator; a forked child can neither use them nor
    make new ones (UCX does not survive fork)."""
    if _forked_from is not None:
        raise GenieConnectionError(
            f"{what}: this process (pid {os.getpid()}) is a fork of pid {_forked_from}, which holds the "
            "connections and the tensors on remote_accelerator; a forked child cannot use them, nor make new "
            "ones (UCX does not survive fork). Start processes that use remote_accelerator with the 'spawn' "
            "start method")


def reset_runtimes() -> None:
    _runtimes.clear()
    _C.forget_recordings()
