"""The runtime of one remote device: its node connection, pending graph and materialization.

One `Runtime` per `remote_accelerator:N`, each with its own `genie._C.Client` session.

- `record(node)` appends to the pending graph (program order). Every `async_chunk` nodes
  the live pending graph is sent as an *asynchronous* run (`run_graph_async`: no round trip):
  the node executes it while the program records the next ops, as a CUDA stream runs kernels
  while the host enqueues more. Its outputs the program holds stay resident (their handles are
  set at once); only the next materialization waits. So the pending graph stays bounded and
  a long loop that never reads a value does not grow without limit.
- `_execute(returned, described)` is the one request of a materialization: it cuts the
  *live* pending graph (nodes whose outputs a live LazyTensor still holds, ops that write a
  storage some live tensor aliases, and everything those depend on), lowers it
  (`genie.lower`), registers it once per structure, and runs it with RunGraph. Outputs the
  program still holds stay resident under fresh 128-bit handles; only `returned` values'
  bytes come back; handles of dead tensors are freed in the same message (RunGraph.free).
- Dead LazyTensors are reported by their TensorImpl's destructor, which only appends the value
  to `dead` (no Python code runs); the list is drained at the next request.
- Threads: every entry into the runtimes (an op reaching the recorder's PrivateUse1 kernel, the
  device's PrivateUse1 kernels, the `genie` API) holds `lock`, one reentrant lock per
  process, so threads that use remote devices at once are serialized op by op, as one CUDA
  stream serializes their kernels (their recorded ops interleave in one pending graph; each
  thread's values are its own). TensorImpl destructors never take it.

Errors: a failed run marks the values it would have produced as lost (using one re-raises
the error) and leaves everything else usable; a lost connection marks every value of the
session lost, and the next use reconnects (or restarts the embedded node). With host copies
kept (`genie.init(keep_host_copy=True)`), a lost connection is recovered instead: the runtime
connects again and replays its lineage (`genie.lineage`), and the request goes on. A failed
asynchronous run is reported at the next read or synchronization (as CUDA reports a kernel's
error): it raises the run's GenieRemoteError (naming its op), and the values that run and
every request sent after it would have kept are lost (`_reap_async`).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import time
import warnings
import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from . import _C, config
from .errors import GenieConnectionError, GenieError, GenieRemoteError
from .graph import (KEEP_AND_DESCRIBE, RETURN, RETURN_AND_KEEP, WEIGHT, Constant, Node, Storage, Value,
                    new_handle)
from .host_eval import host_copy_of_upload, host_value
from .lineage import Lineage
from .lazy import lock as _capture_lock  # first: genie.lazy imports genie.recorder at its end
from . import recorder as _recorder  # noqa: I001
from .kv_cache import CACHE_WRITE_GRACE, CACHE_WRITERS, SDPA, annotate_kv_cache
from .lower import Cut, GraphCache, encode, lower, output_specs

class Runtime:
    """One remote device. Not thread-safe: PyTorch programs capture from one thread."""

    # Nodes recorded before the live pending graph is sent as an asynchronous run; 0: never
    # (the pending graph then runs only when read, or synchronously past max_pending). Set
    # at each connection by `async_chunk_for`.
    async_chunk = 0
    max_in_flight = 32  # asynchronous runs outstanding before the program waits for them
    max_pending = 20000  # nodes; the pending graph runs when it grows past this
    inline_max_bytes = 64 * 1024  # host tensors up to this size travel inline with a run

    # Recovery (`lineage` set): how long a lost node may take to come back (s), and how many
    # times one request may be recovered (a request that kills every node it reaches).
    recovery_timeout_s = 60.0
    max_recoveries = 3

    def __init__(self, index: int, connect, keep_host_copy: bool = False) -> None:
        self.index = index
        self.device = torch.device("remote_accelerator", index)
        self._connect = connect  # () -> genie._C.Client
        self.client = None
        # The requests that made the resident state, to rebuild it on a new node (None: off).
        self.lineage: Lineage | None = Lineage() if keep_host_copy else None
        self.pending: list[Node] = []
        self.dead: list[Value] = []
        self.releasing: list[Value] = []  # resident values no tensor holds: their handles get freed
        self._interrupt: KeyboardInterrupt | None = None  # see _request
        # Host bytes of uploaded weights -> (a weak reference to their host storage, their value).
        self._weights: dict[tuple, tuple[StorageWeakRef, weakref.ref]] = {}
        self.graphs = GraphCache()
        self.capture_log: list[Node] | None = None
        self.rng = Storage()  # the node's random generator: written by seeding and seeded ops
        self.rng.live = 1  # always live: its writers are never dropped as dead
        self.in_flight: dict[int, list[Value]] = {}  # asynchronous runs: request id -> values kept
        self._lineage_entry: dict[int, int] = {}  # asynchronous runs: request id -> its lineage entry
        self._deferred: BaseException | None = None  # an asynchronous cut's error, raised at the next wait
        self._cache_write_open = False  # a KV-cache write recorded that attention has not read yet
        # id(cell) -> the Cell of each live LazyTensor; a TensorImpl's destructor removes its
        # cell and appends its value to `dead` (python/csrc/recorder_fast.cc `releaseState`).
        self._refs: dict[int, object] = {}
        self._rng_state_desc: tuple | None = None  # the node generator's state: (shape, strides, offset, dtype)
        if _seed is not None:
            self.manual_seed(_seed)

    # ---- connection ---------------------------------------------------------------------

    def connection(self):
        if self.client is None:
            check_not_forked(str(self.device))  # the client was the parent's (_after_fork_in_child)
            self.client = self._connect()
            self.graphs.clear()
            self._rng_state_desc = None
            self.async_chunk = async_chunk_for(self.client.device, self.client.address)
        return self.client

    def _lost(self, error: BaseException) -> None:
        """The node went away: every value of the session is lost; the next call reconnects."""
        for cell in list(self._refs.values()):
            cell.value.error = error
        for node in self.pending:
            for v in node.outputs:
                v.error = error
        self.pending = []
        self.dead = []
        self.releasing = []
        self.in_flight = {}
        self._lineage_entry = {}
        if self.lineage is not None:
            self.lineage = Lineage()  # of handles that are gone with the node
        self._deferred = None  # superseded by the connection error being raised
        client, self.client = self.client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - already gone
                pass

    def _recover(self, error: GenieConnectionError) -> bool:
        """With a lineage: connects again (the node restarted at its address, or a restarted
        embedded node; for up to `recovery_timeout_s`) and replays the lineage on the new
        session. True when the state is rebuilt; False (the values are then lost) otherwise."""
        if self.lineage is None:
            return False
        old, self.client = self.client, None
        if old is not None:
            try:
                old.close()
            except Exception:  # noqa: BLE001 - already gone
                pass
        deadline = time.monotonic() + self.recovery_timeout_s
        while True:
            try:
                # Not connection(): the graph cache stays (graph ids are content hashes).
                client = self._connect()
                self.lineage.replay(client)
            except GenieConnectionError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.25)
                continue
            except GenieError as replay_error:  # the new node refused the state (out of memory, ...)
                warnings.warn(f"genie: {self.device}: rebuilding the lost state failed: {replay_error}", stacklevel=4)
                return False
            self.client = client
            self.in_flight.clear()  # replayed; their failures were checked there
            warnings.warn(f"genie: {self.device}: the node was lost ({error}); reconnected to {client.address} "
                          f"and rebuilt the resident state from {len(self.lineage.entries)} logged requests",
                          stacklevel=4)
            return True

    def _live_handles(self) -> set[bytes]:
        """Handles the program can still use: held by live tensors or read by pending ops."""
        live = {cell.value.handle for cell in self._refs.values() if cell.value.handle is not None}
        for node in self.pending:
            live.update(v.handle for v in node.inputs() if v.handle is not None)
        return live

    def _request(self, method: str, *args, _recoveries: int = 0):
        """One request to the node that waits for its reply."""
        client = self.connection()
        returned_before = client.completed_calls
        try:
            result = getattr(client, method)(*args)
        except GenieConnectionError as error:
            if _recoveries < self.max_recoveries and self._recover(error):
                return self._request(method, *args, _recoveries=_recoveries + 1)
            self._lost(error)
            raise
        except KeyboardInterrupt as interrupt:
            if client.completed_calls == returned_before:
                raise
            # Ctrl-C while the call waited (without the GIL): Python raises it as the call
            # returns, after the node did the work. The books are kept with the call's result
            # (the client records it) and the interrupt is raised once they agree with the
            # node (`_raise_interrupt`), as a local program's state survives Ctrl-C.
            self._interrupt = interrupt
            result, client.last_result = client.last_result, None
            return result
        # No tensor kept longer than the caller keeps it. Setting a C++ attribute runs no
        # bytecode, where Python would raise a pending interrupt, so none lands before it.
        client.last_result = None
        return result

    def _raise_interrupt(self) -> None:
        """Raises the KeyboardInterrupt `_request` held back, if any."""
        interrupt, self._interrupt = self._interrupt, None
        if interrupt is not None:
            raise interrupt

    def _call(self, method: str, *args):
        """`_request`, then the report of failed asynchronous runs: the first one's error is
        raised (after the request's own error, if it failed too: `raise ... from`)."""
        try:
            result = self._request(method, *args)
        except GenieRemoteError as error:
            failed = self._reap_async()
            if failed is not None:
                raise failed from error
            raise
        self._raise_interrupt()
        failed = self._reap_async()
        if failed is not None:
            raise failed
        return result

    def _reap_async(self, sent_after: list[Value] = ()) -> BaseException | None:
        """After a request that waited, every asynchronous run sent before it has finished.
        Returns the first failure (or an error deferred by `_execute_async`), else None.

        A failed run poisons what was sent after it, as a CUDA error does the work queued
        behind it: the values it and every later run would have kept (and `sent_after`, those
        of the request that just waited) are lost with its error. Later runs may have read
        storage the failed run was to write, so their results cannot be trusted."""
        first, self._deferred = self._deferred, None
        if not self.in_flight or self.client is None:
            self.in_flight.clear()
            return first
        failures = self.client.take_async_failures(True)
        if failures:
            failed_id, error = min(failures, key=lambda f: f[0])  # request ids grow in send order
            if self.lineage is not None and failed_id in self._lineage_entry:
                self.lineage.forget_runs_after(self._lineage_entry[failed_id])
            poisoned = [kept for request_id, kept in self.in_flight.items() if request_id >= failed_id]
            poisoned.append(sent_after)
            for kept in poisoned:
                for v in kept:
                    v.error = error  # the handle stays: freed when the tensor dies
            first = first or error
        self.in_flight.clear()
        self._lineage_entry.clear()
        return first

    # ---- tensors ------------------------------------------------------------------------

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
            self.releasing.append(old)  # freed once no pending op reads it
        tensor._cell.value = value
        value.tensors += 1

    def assign(self, tensor, value: Value) -> None:
        """`tensor.data = other` (other's value is `value`): `tensor` now holds `value`, which
        may live in another storage (Module.half() and Module.to(dtype) convert parameters so)."""
        old = tensor._cell.value
        old.storage.live -= 1
        value.storage.live += 1
        self.rebind(tensor, value)

    def record(self, node: Node) -> None:
        n = len(self.pending)
        if n >= self.max_pending:
            self.flush()
        elif self.async_chunk and n >= self.async_chunk and self.client is not None and (
                not self._cache_write_open or n >= self.async_chunk + CACHE_WRITE_GRACE):
            # Before appending: `node`'s outputs get their tensors only after this returns.
            self._execute_async()
        for storage in node.writes:
            storage.written = True
        self.pending.append(node)
        if self.capture_log is not None:
            self.capture_log.append(node)
        if self.async_chunk:
            op = id(node.op)  # ids: hashing an OpOverload runs Python code
            if op in CACHE_WRITERS:
                self._cache_write_open = True
            elif op in SDPA:
                self._cache_write_open = False

    def _execute_async(self) -> None:
        """Sends the live pending graph as an asynchronous run (no round trip): outputs a live
        tensor holds stay resident under handles set now; nothing comes back. Errors are not
        raised here (from the op being recorded) but at the next request that waits.

        The cut waits while a KV-cache write has not been read by attention yet (at most
        CACHE_WRITE_GRACE more nodes), so that `annotate_kv_cache` sees the write and its
        reader in one cut and keeps the cache as STATEFUL_KV_CACHE. At most `max_in_flight`
        runs are outstanding: past that the program waits for them (as a full CUDA launch
        queue blocks the host)."""
        self._cache_write_open = False
        if len(self.in_flight) >= self.max_in_flight:
            self._deferred = self._reap_async()
        self._drain_dead()
        nodes = self._live_nodes([])
        pending, self.pending = self.pending, []
        try:
            cut = self._prepare_cut(nodes, [], [])
            request_id = self._request("run_graph_async", *cut.request)
        except KeyboardInterrupt:
            self.pending = pending  # Ctrl-C before the request left: nothing ran
            raise
        except BaseException as error:  # noqa: BLE001 - raised at the next request that waits
            if not isinstance(error, GenieConnectionError):
                self.pending = self._after_failure(nodes, pending, error)
            self._deferred = self._deferred or error
            return
        self._release_unneeded(pending)
        cut.keep()
        self.in_flight[request_id] = [v for v, _, _ in cut.kept]
        if self.lineage is not None:
            self._lineage_entry[request_id] = len(self.lineage.entries)
            self.lineage.run(cut.request, cut.weights)
        self._raise_interrupt()

    def manual_seed(self, seed: int) -> None:
        """Seeds the node's generator (`genie::manual_seed`), in program order with the random
        ops around it. `seed` as torch.manual_seed takes it (negative: 0xffff_ffff_ffff_ffff + seed)."""
        seed = int(seed)
        if seed < 0:
            seed += 0xFFFF_FFFF_FFFF_FFFF
        if not 0 <= seed <= 0xFFFF_FFFF_FFFF_FFFF:
            raise RuntimeError(f"manual_seed: seed {seed} is out of range [-0x8000_0000_0000_0000, 0xffff_ffff_ffff_ffff]")
        bits = seed - (1 << 64) if seed >= 1 << 63 else seed  # the uint64's bits as int64 (the schema's int)
        self._record_generator_op("manual_seed", bits)

    def _record_generator_op(self, name: str, *args, dtype: torch.dtype | None = None) -> Value | None:
        """Records `genie::<name>(device, *args)`, which writes the node's generator (in order
        with the random ops); returns its output value when it has one (`dtype`)."""
        node = Node(_genie_op(name), (self.device, *args), {}, 0 if dtype is None else 1, writes=(self.rng,))
        value = None if dtype is None else Value(node, 0, Storage(), dtype)
        node.outputs = () if value is None else (value,)
        self.record(node)
        return value

    def get_rng_state(self):
        """The node generator's state at this point of the program (`genie::get_rng_state`), as
        a uint8 LazyTensor: recorded like a random op, in order. Its size is the node's
        generator's, asked once per connection (one round trip); later calls record only."""
        from .lazy import LazyTensor
        value = self._record_generator_op("get_rng_state", dtype=torch.uint8)
        if self._rng_state_desc is None:
            ((_, shape, strides, offset),) = self.describe([value])
            self._rng_state_desc = (tuple(shape), tuple(strides), offset, torch.uint8)
        return LazyTensor(self._rng_state_desc, value, self)

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restores the node generator's state (`genie::set_rng_state`), in program order:
        `state` as get_rng_state returned it (on the device), or a host uint8 tensor."""
        from .lazy import LazyTensor
        if isinstance(state, LazyTensor):
            if state._runtime is not self:
                raise RuntimeError(f"set_rng_state: a state of {state.device} given to {self.device}")
            arg = self.value_of(state)
        else:
            arg = Constant(state.detach().to(torch.uint8).contiguous().clone())
        self._record_generator_op("set_rng_state", arg)

    def upload(self, cpu: torch.Tensor, residency: int, storage: Storage | None = None) -> Value:
        """Puts a host tensor on the node now (one PutTensors); returns its resident value."""
        handle = new_handle()
        data = cpu.detach()
        if data.requires_grad or isinstance(data, torch.nn.Parameter):
            data = data.data
        self._request("put", [(handle, data, residency)])  # no report of failed runs here: the handle would leak
        if self.lineage is not None:
            self.lineage.put([(handle, data, residency)])
        value = Value(None, 0, storage or Storage(), data.dtype, handle=handle, residency=residency)
        value.host = host_copy_of_upload(data)
        if self._interrupt is not None:
            self.releasing.append(value)  # no tensor will hold it: freed with the next request
            self._raise_interrupt()
        return value

    def upload_tensor(self, cpu: torch.Tensor, residency: int):
        """A new LazyTensor holding a copy of host tensor `cpu` (contiguous)."""
        from .lazy import LazyTensor
        data = cpu if cpu.storage_offset() == 0 and cpu.is_contiguous() else cpu.contiguous()
        return LazyTensor((tuple(data.shape), data.stride(), 0, data.dtype), self.upload(data, residency), self)

    def copy_from_host(self, dst, src: torch.Tensor, residency: int) -> None:
        """`dst.copy_(src)` for a host `src`. Parameters and tensors over `inline_max_bytes`
        are put on the node now; smaller ones travel inline with the next run (no round
        trip). A freshly made `dst` (`tensor.to(device)`) simply becomes the uploaded value."""
        data = src
        same_layout = (src.dtype == dst.dtype and src.shape == dst.shape and src.stride() == dst.stride()
                       and src.storage_offset() == 0 and src.device.type == "cpu")
        if not same_layout or not src.is_contiguous():
            data = torch.empty_strided(dst.shape, dst.stride(), dtype=dst.dtype)
            data.copy_(src)
        elif src.requires_grad:
            data = src.detach()
        value = dst._cell.value
        fresh = (value.node is not None and id(value.node.op) in _FRESH_OPS and value.tensors == 1
                 and value.storage.live == 1 and dst.storage_offset() == 0)
        inline = residency != WEIGHT and data.numel() * data.element_size() <= self.inline_max_bytes
        if fresh and self.pending and self.pending[-1] is value.node:
            self.pending.pop()  # the empty tensor is never needed
            if self.capture_log and self.capture_log[-1] is value.node:
                self.capture_log.pop()
        if inline:
            source = Constant(data.clone() if data is src else data)  # a snapshot, as .to() makes
            if fresh:
                node = Node(_ALIAS, (source,), {}, 1)
            else:
                node = Node(_COPY, (value, source), {}, 1, writes=(value.storage,))
            new_value = Value(node, 0, value.storage, dst.dtype)
            node.outputs = (new_value,)
            self.record(node)
            if fresh:
                new_value.host = host_copy_of_upload(source.tensor, snapshot=False)  # already a snapshot
            self.rebind(dst, new_value)
            return
        if fresh:
            self.rebind(dst, self._upload_weight_once(src, data, residency, value.storage))
            return
        uploaded = self.upload(data, residency)
        node = Node(_COPY, (value, uploaded), {}, 1, writes=(value.storage,))
        new_value = Value(node, 0, value.storage, dst.dtype)
        node.outputs = (new_value,)
        self.record(node)
        self.rebind(dst, new_value)
        # No tensor holds `uploaded`: count it as one that already died, so its handle is
        # freed once the copy has run.
        uploaded.tensors += 1
        uploaded.storage.live += 1
        self.dead.append(uploaded)

    def _upload_weight_once(self, src: torch.Tensor, data: torch.Tensor, residency: int, storage: Storage) -> Value:
        """Uploads `data`; a weight whose host bytes were uploaded before (tied weights: GPT-2's
        lm_head and wte are one Parameter, moved once per module by `module.to`) gets the value
        already resident, so it travels and occupies node memory once.

        The host bytes are named by their storage's address, offset, shape, strides, dtype and
        version, and the entry holds a weak reference to that storage: once it is freed, a new
        storage at the same address (the next model's weights) is not mistaken for it."""
        if residency != WEIGHT:
            return self.upload(data, residency, storage=storage)
        host = src.untyped_storage()
        key = (host.data_ptr(), src.storage_offset(), tuple(src.shape), src.stride(), src.dtype, src._version)
        entry = self._weights.get(key)
        if entry is not None and not entry[0].expired():
            known = entry[1]()
            if known is not None and known.handle is not None and known.error is None:
                return known
        value = self.upload(data, residency, storage=storage)
        if len(self._weights) >= 4096:  # forget the weights whose host storage or value is gone
            self._weights = {k: e for k, e in self._weights.items() if not e[0].expired() and e[1]() is not None}
        self._weights[key] = (StorageWeakRef(host), weakref.ref(value))
        return value

    # ---- materialization ----------------------------------------------------------------

    def fetch(self, tensor) -> torch.Tensor:
        """The tensor's values on the host (runs what it depends on, in one request). A value the
        host can compute exactly (`genie.host_eval`) is answered without a request, unless
        asynchronous runs are in flight (their failures are reported at reads)."""
        value = self.value_of(tensor)
        host = host_value(value) if not self.in_flight and self._deferred is None else None
        if host is not None:
            out = host.clone()  # the program may change what it read; the host copy stays
        elif value.node is None and not self._pending_writes(value.storage):
            (out,) = self._call("get", [value.handle])
        else:
            returned, _ = self._execute([value], [])
            out = returned[id(value)]
        if out.shape != tensor.shape:
            # Same elements in another shape (a 0-dim value travels as [1]): the wrapper's shape.
            # Different element counts mean the meta kernel and the node's kernel disagree
            # (native_batch_norm in eval mode: meta says save_mean [C], CPU returns [0]): the
            # node ran the op, so its result is what the program reads.
            if out.numel() == tensor.numel():
                out = out.reshape(tensor.shape)
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
        """Runs every live pending op and waits for the asynchronous runs (genie.synchronize)."""
        self._drain_dead()
        if self.pending:
            self._execute([], [])
            return
        frees = self._take_frees(set()) if self.releasing and self.client is not None else []
        if frees:
            self._call("free", frees)
            if self.lineage is not None:
                self.lineage.free(frees)
        elif self.in_flight or self._deferred is not None:
            failed = self._reap_async()
            if failed is not None:
                raise failed

    def _pending_writes(self, storage: Storage) -> bool:
        return any(storage in node.writes for node in self.pending)

    def _drain_dead(self) -> None:
        dead, self.dead = self.dead, []
        for v in dead:
            v.tensors -= 1
            v.storage.live -= 1
            if v.tensors == 0 and v.handle is not None:
                self.releasing.append(v)

    def _take_frees(self, in_use: set[bytes]) -> list[bytes]:
        """Handles of released values that no op about to run reads; the rest wait."""
        frees, waiting = [], []
        for v in self.releasing:
            if v.handle is None or v.tensors > 0:
                continue  # already freed, or held again
            if v.handle in in_use:
                waiting.append(v)
            else:
                frees.append(v.handle)
                v.handle = None
        self.releasing = waiting
        return frees

    def _live_nodes(self, wanted: list[Value]) -> list[Node]:
        """The pending nodes a read of `wanted` or a live tensor needs, in program order: a
        node is kept when a live tensor holds one of its outputs, one of its outputs is wanted
        or needed by a kept node, or it writes a storage that a live tensor aliases or that a
        later kept node reads. The last case is a write through a view that dies before the
        read: `seq[:, :n] = ids` (a `copy_` into a slice of `seq`), then `seq.clone()`, with
        `seq` dead by the time of the cut (HuggingFace's beam search). One walk backwards over
        the pending nodes, in C++ (`genie._C.live_nodes`, python/csrc/cut_fast.cc)."""
        return _C.live_nodes(self.pending, wanted)

    def _prepare_cut(self, nodes: list[Node], returned: list[Value], described: list[Value]) -> Cut:
        """Lowers a cut, registers its graph if its structure is new, and builds the RunGraph's
        arguments (input bindings, changed scalars, output specs with fresh handles, frees)."""
        lowered = lower(nodes, [v for v in returned if v.node is None])
        annotate_kv_cache(nodes)
        self.connection()  # (re)connecting clears the graph cache: before consulting it
        lifted, scalars, graph_id = self.graphs.prepare(lowered)
        if graph_id is None:
            graph_bytes = encode(lowered, lifted)
            graph_id = self._request("register_graph", graph_bytes)
            self.graphs.remember(lowered, lifted, graph_id)
            if self.lineage is not None:
                self.lineage.graph(graph_id, graph_bytes)
        bindings = [(i, obj) for i, (kind, obj) in enumerate(lowered.inputs) if kind != "weight"]
        frees = self._take_frees({obj for kind, obj in lowered.inputs if kind != "inline"})
        specs, spec_values, kept = output_specs(nodes, lowered.value_ids, returned, described)
        weights = tuple(obj for kind, obj in lowered.inputs if kind == "weight")
        return Cut((graph_id, bindings, scalars, specs, frees), spec_values, kept, weights)

    def _execute(self, returned: list[Value], described: list[Value]) -> tuple[dict, dict]:
        self._drain_dead()
        nodes = self._live_nodes(returned + described)
        pending, self.pending = self.pending, []
        try:
            cut = self._prepare_cut(nodes, returned, described)
            results = self._request("run_graph", *cut.request)
        except GenieConnectionError:
            raise
        except KeyboardInterrupt:
            self.pending = pending  # Ctrl-C before the request left (see _request): nothing ran
            raise
        except BaseException as error:
            failed = self._reap_async()
            if failed is not None:
                # An earlier asynchronous run failed (likely the cause: this cut may read
                # what it would have made): report that one; this cut is lost with it.
                self._after_failure([], pending, failed)
                raise failed from error
            self.pending = self._after_failure(nodes, pending, error)
            raise
        self._release_unneeded(pending)
        cut.keep()
        if self.lineage is not None:
            self.lineage.run(cut.request, cut.weights)
        self._raise_interrupt()
        failed = self._reap_async([v for v, _, _ in cut.kept])
        if failed is not None:
            raise failed
        if self.lineage is not None:  # no asynchronous run names an entry now
            self.lineage.maybe_prune(self._live_handles())
        out_returned, out_described = {}, {}
        for (_, action, _, _), v, result in zip(cut.request[3], cut.spec_values, results):
            if action in (RETURN, RETURN_AND_KEEP):
                out_returned[id(v)] = result
            elif action == KEEP_AND_DESCRIBE:
                out_described[id(v)] = result
        return out_returned, out_described

    @staticmethod
    def _release_unneeded(pending: list[Node]) -> None:
        """After a cut ran (or was sent): its values no longer have a pending producer; values
        of nodes the cut left out were never needed (dead) and stay without a handle."""
        for node in pending:
            for v in node.outputs:
                v.node = None

    @staticmethod
    def _after_failure(nodes: list[Node], pending: list[Node], error: BaseException) -> list[Node]:
        """What survives a failed run: the failing op (`error.op_index` into `nodes`), what
        depends on it and the ops that already wrote node memory are lost (using their values
        re-raises `error`); pure ops that do not depend on it go back to the pending graph, to
        run with the next request. Without an op index, the whole cut is lost."""
        failed = getattr(error, "op_index", -1)
        if not isinstance(failed, int) or not 0 <= failed < len(nodes):
            for node in pending:
                for v in node.outputs:
                    v.node = None
                    v.error = error
            return []
        lost: set[int] = set()
        for i, node in enumerate(nodes):
            if i == failed or (i < failed and node.writes) or any(id(v) in lost for v in node.inputs()):
                lost.update(id(v) for v in node.outputs)
        survivors = []
        cut = {id(n) for n in nodes}
        for node in pending:
            if id(node) in cut and id(node.outputs[0] if node.outputs else node) in lost:
                for v in node.outputs:
                    v.node = None
                    v.error = error
            elif id(node) in cut:
                survivors.append(node)
        return survivors

    # ---- information --------------------------------------------------------------------

    def stats(self) -> dict:
        return self._call("stats")

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


ASYNC_CHUNK = 256  # nodes per asynchronous run, where they pay (see async_chunk_for)


def async_chunk_for(device: str, address: str) -> int:
    """Nodes per asynchronous run for a node with `device` at `address` ("host:port"):
    `GENIE_ASYNC_CHUNK` if set, else 0 (off) for a CPU node on this host, else ASYNC_CHUNK.

    Why off there: a CPU node on the same host computes on the cores the program records on.
    On the 2-core development VM, asynchronous runs doubled the recording time of a GPT-2
    decode step (15-17 -> 30-42 ms) and made the step no shorter; with client and node pinned
    to separate cores they made it 10-13% shorter (docs/perf/models.md, 2026-11-22, commit
    2b1e133). A GPU node, or a node on another host, computes beside the program."""
    chunk = config.get("GENIE_ASYNC_CHUNK")
    if chunk is not None:
        return chunk
    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    return 0 if device == "cpu" and loopback else ASYNC_CHUNK


# Op sets hold ids (`id(node.op) in ...`): hashing an OpOverload runs Python code.
_FRESH_OPS = frozenset(map(id, (torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default)))
_ALIAS = torch.ops.aten.alias.default
_COPY = torch.ops.aten.copy_.default

lock = _capture_lock  # genie.lazy.lock: see "Threads" above


def locked(function):
    """`function`, holding `lock` (an entry point into the runtimes)."""

    @functools.wraps(function)
    def entry(*args, **kwargs):
        with lock:
            return function(*args, **kwargs)

    return entry


_runtimes: dict[int, Runtime] = {}
_seed: int | None = None  # the last torch.manual_seed: runtimes made later start with it


def _genie_op(name: str):
    """genie-node's own operator `genie::<name>` (defined by genie.device.register())."""
    return getattr(torch.ops.genie, name).default


@locked
def manual_seed_all(seed: int) -> None:
    """torch.manual_seed(seed) for every remote device (`torch.remote_accelerator.manual_seed_all`)."""
    global _seed
    _seed = int(seed)
    for runtime in _runtimes.values():
        runtime.manual_seed(_seed)


def runtime_for(device: torch.device) -> Runtime:
    """The runtime of `remote_accelerator:N` (connecting on first use: `genie.init`); without
    an index, of this thread's current device (`torch.remote_accelerator.current_device()`)."""
    index = device.index if device.index is not None else _C.current_device()
    runtime = _runtimes.get(index)
    if runtime is None:
        runtime = _make_runtime(index)
        _runtimes[index] = runtime
        _tune_gc_once()
    return runtime


_recorder._runtime_for = runtime_for  # capture calls up through it (genie.recorder.runtime_for)
# The runtime of device index i for this process's session: genie._session.make_runtime, which
# genie._session installs when it is imported (the session layer is above this one).
_make_runtime = None


_gc_tuned = False


def _tune_gc_once() -> None:
    """On the process's first use of a remote device, two changes to Python's cyclic GC (each
    can be turned off; docs/configuration.md):

    - `GENIE_GC_FREEZE` (default on): collect garbage, then move every object alive now
      (torch, transformers, the model being moved) to the permanent generation (`gc.freeze`,
      as vLLM does after loading a model). Capture keeps each step's pending graph (nodes,
      values, argument tuples: ~4,000 objects per GPT-2 decode step) alive across young
      collections, so they count toward the next full collection, and a full collection
      traverses every object in the process (430,000 with transformers loaded: 260 ms on the
      development VM, once every ~8 decode steps). Frozen objects are not traversed. They are
      still freed by reference counting; only cyclic garbage among them is never collected,
      hence the collection first.
    - `GENIE_GC_THRESHOLD` (default 50,000; 0 leaves it): the youngest generation's threshold
      is raised to it (never lowered). At Python's 700, recording collected the young
      generation about twice per GPT-2 decode step, traversing the pending graph each time
      (~0.9 ms of a step), and a loop of recorded ops spent ~15% of its time in the GC. A
      step's graph is freed by reference counting once it has run, so with a threshold above
      its size almost no collection runs during recording. Cyclic garbage waits longer: at
      most that many objects more."""
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
        runtime.in_flight = {}


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
