"""One model over several nodes, placed by the scheduler: `genie.place` and `genie.disaggregate`.

    placed = genie.place(model, input_ids)             # a CPU model and an example input
    print(placed)                                      # which block runs where, and why
    logits = model(input_ids.to(placed.home)).logits   # runs over the nodes it was placed on

    served = genie.disaggregate(model, input_ids)      # prefill on one node, decode on another
    tokens = model.generate(input_ids.to(served.home), max_new_tokens=32)

    model.to("remote_accelerator")                     # two or more nodes: defer(model)
    tokens = model.generate(input_ids.to("remote_accelerator"), max_new_tokens=32)
    print(placement_of(model))                         # placed by its first call

`place(model, *example)`: `genie.semantics.capture` traces one call of the CPU model on fake
tensors (nothing runs), the analysis groups its ops (patterns, costs, the weights each group
reads), `genie.scheduler.schedule` places the groups on the cluster (default: every
`remote_accelerator` this process is configured with, measured by `connected_cluster`) for the
goal, and the model is moved to match, one *block* at a time:

- blocks: each element of a `ModuleList`, `ModuleDict` or `Sequential` (a transformer layer, a
  ResNet bottleneck), and each other module holding parameters or buffers of its own that is
  in no block. A block is never split: the glue between its submodules (residual adds) stays
  on one node. It goes to the node where the schedule put most of its weight bytes; a block
  without weights runs where its inputs are.
- a forward pre-hook on each placed block moves the tensors it is given (positional and
  keyword arguments, through tuples, lists and dicts) to its node, each tensor once per call
  of the model (a mask every layer is given crosses once per node): node to node when they are
  on another node (`transfers._node_to_node`: the bytes never pass through this process), an
  upload when they are on the host. Weights never move between nodes once placed (a tied weight
  is on one node with every block that reads it: the scheduler co-locates what shares a
  weight); activations and caches made by a block stay on its node (a KV cache with its
  attention).
- co-location hints on the wire (schemas/genie.fbs Colocation): on each of its nodes the
  model's weights, uploaded as its blocks move, and the KV caches its runs keep there carry
  one group (`colocation_group(model)`) with the bytes the schedule keeps on that node. The
  node admits the group whole (a group that no longer fits, say another client took the
  memory since the cluster was measured, is refused with OutOfMemory before any of its bytes
  are stored), refuses to send its tensors to another node, and reports it in
  `memory_stats()["colocation"]`. One group per node at a time: the latest placement on a
  node names the caches made there.
- a forward hook on the model moves its tensor outputs to `home` (the node of the first
  block, or the device of the first remote tensor argument of a call), so that a caller such
  as `generate()` sees one device.

The schedule actually run (block granularity) is evaluated by the same cost model and kept as
`Placement.realized`; `Placement.schedule` is the scheduler's own. The placement is for the
shapes and memory at the time of the call: a node that joins later changes later placements
only.

`disaggregate(model, example_ids)`: the policy of `genie.scheduler.schedule_disaggregated`
(prefill where it computes fastest, decode where a step is fastest, on two nodes when two can
hold a phase): the model's weights on the decode node, a copy on the prefill node; the model's
forward runs a call without a filled cache (the prefill) on the prefill node, then moves every
layer's keys and values (`transformers.DynamicCache`: in one SendTensors) and the outputs node
to node to the decode node, once; later calls (decode steps) run on the decode node.

`defer(model, goal)`: the model stays on the host until its first call, which places it as
`place` does with that call's arguments as the example; `module.to("remote_accelerator")` (no
index) defers when this process has two or more nodes (genie.device's `Module.to`). Its
outputs go to the device current when it was deferred at every call; `placement_of(model)`
is the Placement once placed.

Errors: ValueError for a model with parameters off the host, or an unknown goal;
`genie.scheduler.PlacementError` when the model fits on no placement (naming the group, the
bytes it needs and the largest free memory), when moving whole blocks would overfill a node,
or when it would put a tied weight on two nodes (nothing is moved then); capture's errors for
a model it cannot trace; GenieRemoteError (OutOfMemory naming the co-location group) when a
node refuses its group (the blocks moved so far go back to the host); GenieConnectionError for
an unreachable node.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from .scheduler import Cluster, PlacementError, check_schedule, connected_cluster, schedule, schedule_disaggregated
from .scheduler.schedule import GOALS, evaluate
from .runtime import locked, runtime_for
from .semantics import analyze, capture
from .transfers import move_many

_DEVICE = "remote_accelerator"
_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)


@dataclass
class Placement:
    """A model placed over nodes by `place` (see the module docstring).

    `blocks`: {module path: device} for every placed block ("" is the model itself when it is
    one block). `schedule`: the scheduler's ExecutionSchedule of the captured call's groups;
    `realized`: the same groups placed as the blocks run them, with its estimate (s).
    `cluster`: the Cluster it was placed on. `home`: where the model's outputs are returned."""

    model: torch.nn.Module
    blocks: dict[str, torch.device]
    schedule: object
    realized: object
    cluster: Cluster
    home: torch.device
    group: str = ""  # its co-location group on each of its nodes (`colocation_group`)
    _hooks: list = field(default_factory=list, repr=False)
    _memo: dict = field(default_factory=dict, repr=False)  # the current call's moves (see _move)

    def devices(self) -> list[torch.device]:
        """The devices the blocks run on, in the order of first use."""
        return list(dict.fromkeys(self.blocks.values()))

    def remove(self) -> None:
        """Removes the hooks (the weights stay where they are) and the co-location hint: later
        KV caches on its nodes carry no group."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for device in self.devices():
            if self.group:
                _colocate(device, None, 0, only_if=self.group)

    def __str__(self) -> str:
        runs: list[tuple[torch.device, list[str]]] = []
        for path, dev in self.blocks.items():
            if runs and runs[-1][0] == dev:
                runs[-1][1].append(path)
            else:
                runs.append((dev, [path]))
        lines = [f"genie.place: {len(self.blocks)} block(s) on {len(self.devices())} node(s), home {self.home}; "
                 f"estimate {self.realized.estimated_s * 1e3:.2f} ms per call "
                 f"(scheduler's own {self.schedule.estimated_s * 1e3:.2f} ms, {self.schedule.algorithm})"]
        for dev, paths in runs:
            shown = paths if len(paths) <= 4 else paths[:2] + [f"... {len(paths) - 3} more ..."] + paths[-1:]
            lines.append(f"  {dev}: " + ", ".join(p or "(model)" for p in shown))
        return "\n".join(lines)


def _blocks(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The model's blocks (module docstring) in registration order."""
    out: list[tuple[str, torch.nn.Module]] = []

    def visit(path: str, mod: torch.nn.Module) -> None:
        if isinstance(mod, _CONTAINERS):
            for name, child in mod.named_children():
                child_path = f"{path}.{name}" if path else name
                if isinstance(child, _CONTAINERS):
                    visit(child_path, child)
                else:
                    out.append((child_path, child))
        elif any(True for _ in mod.parameters(recurse=False)) or any(True for _ in mod.buffers(recurse=False)):
            out.append((path, mod))
        else:
            for name, child in mod.named_children():
                visit(f"{path}.{name}" if path else name, child)

    visit("", model)
    return out


def _tensor_names(model: torch.nn.Module) -> dict[int, str]:
    """{id(tensor): the name capture gives it} for every parameter and buffer (a tied one
    under its first name)."""
    names: dict[int, str] = {}
    for name, t in model.named_parameters():
        names.setdefault(id(t), name)
    for name, t in model.named_buffers():
        names.setdefault(id(t), name)
    return names


def _block_tensors(block: torch.nn.Module) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for t in list(block.parameters()) + list(block.buffers()):
        seen.setdefault(id(t), t)
    return list(seen.values())


def _move(x, device: torch.device, memo: dict | None = None):
    """`x` with every tensor in it (through tuples, lists and dicts) on `device`; other objects
    as they are. Dicts (a ModelOutput included) are updated in place. The tensors that come
    from one other node move together (`transfers.move_many`: one SendTensors). `memo`
    {(id(tensor), device): (tensor, moved)} reuses a move made earlier in the same call (a mask
    or positions that every block on a node is given cross once)."""
    memo = {} if memo is None else memo
    found: list[torch.Tensor] = []
    _tensors(x, device, memo, found)
    for t, moved in zip(found, move_many(found, device) if found else []):
        memo[(id(t), device)] = (t, moved)  # holds t: its id stays unique while the call runs
    return _rebuilt(x, device, memo)


def _tensors(x, device, memo, found: list) -> None:
    """Appends to `found` the tensors of `x` not on `device` and not moved already (once each)."""
    if isinstance(x, torch.Tensor):
        if x.device != device and not any(t is x for t in found):
            hit = memo.get((id(x), device))
            if hit is None or hit[0] is not x:
                found.append(x)
    elif isinstance(x, (tuple, list)):
        for y in x:
            _tensors(y, device, memo, found)
    elif isinstance(x, dict):
        for y in x.values():
            _tensors(y, device, memo, found)


def _rebuilt(x, device, memo):
    if isinstance(x, torch.Tensor):
        return x if x.device == device else memo[(id(x), device)][1]
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(_rebuilt(y, device, memo) for y in x)
    if isinstance(x, list):
        return [_rebuilt(y, device, memo) for y in x]
    if isinstance(x, dict):
        for k, v in list(x.items()):
            moved = _rebuilt(v, device, memo)
            if moved is not v:
                x[k] = moved
        return x
    return x


def _check_host(model: torch.nn.Module) -> None:
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.device.type != "cpu":
            raise ValueError(f"genie.place takes a model on the host: {name!r} is on {t.device}")


def place(model: torch.nn.Module, *example_args, goal: str = "latency", cluster: Cluster | None = None,
          devices=None, algorithm=schedule, **example_kwargs) -> Placement:
    """Places `model` (on the host) over the cluster for `goal` ("latency" or "throughput"),
    from one example call `model(*example_args, **example_kwargs)` (host tensors), and moves it
    there (module docstring). `cluster`: a Cluster whose node names are `remote_accelerator:i`
    (default: `connected_cluster(devices)`). `algorithm(groups, cluster, goal)` makes the
    ExecutionSchedule: the scheduler's `schedule` (default), or a baseline such as
    `genie.scheduler.round_robin` for a comparison. Returns the Placement; the model is changed
    in place (its blocks on their nodes, hooks installed). Raises as the module docstring says."""
    return _place(model, example_args, example_kwargs, goal, cluster, devices, algorithm)


def _place(model, example_args, example_kwargs, goal="latency", cluster=None, devices=None, algorithm=schedule,
           home: torch.device | None = None) -> Placement:
    """`place`; with `home`, every call's outputs go to `home` (not to its first remote tensor's device)."""
    _check_host(model)
    groups = analyze(capture(model, *example_args, **example_kwargs)).to_groups()
    cluster = cluster if cluster is not None else connected_cluster(devices)
    sched = algorithm(groups, cluster, goal)
    node_of_name: dict[str, str] = {}
    for g in groups.groups:
        for name in g.weights + g.state:
            node_of_name.setdefault(name, sched.placement[g.id])
    names = _tensor_names(model)
    blocks = _blocks(model)
    block_node: dict[str, str | None] = {}
    for path, block in blocks:
        weight = {}
        for t in _block_tensors(block):
            node = node_of_name.get(names.get(id(t), ""))
            if node is not None:
                weight[node] = weight.get(node, 0) + t.numel() * t.element_size()
        block_node[path] = max(sorted(weight), key=weight.get) if weight else None
    _check_tied(blocks, block_node)
    default = next((n for n in block_node.values() if n is not None), sched.nodes()[0] if sched.nodes() else None)
    if default is None:
        raise PlacementError("the model has no weights and the schedule no node")
    realized = _realized(groups, cluster, sched, node_of_name, names, blocks, block_node, goal)
    check_schedule(groups, cluster, realized)  # whole blocks still fit (else PlacementError, nothing moved)
    placement = Placement(model, {}, sched, realized, cluster, home or _device(default), colocation_group(model))
    for node in dict.fromkeys(n for n in block_node.values() if n is not None):
        _colocate(_device(node), placement.group, realized.resident_bytes.get(node, 0))
    try:
        for path, block in blocks:
            node = block_node[path]
            if node is None:
                continue
            device = _device(node)
            placement.blocks[path] = device
            block.to(device)
            placement._hooks.append(block.register_forward_pre_hook(_inputs_to(device, placement._memo),
                                                                    with_kwargs=True))
    except BaseException:  # a node refused a block (its group no longer fits): back to the host
        placement.remove()
        for path in placement.blocks:  # torch's move itself: a deferred model stays deferred
            model.get_submodule(path)._apply(lambda t: t.to("cpu"))
        raise
    placement._hooks += _home_hooks(model, placement, follow_inputs=home is None)
    return placement


def colocation_group(model: torch.nn.Module) -> str:
    """The co-location group of a placed model on each of its nodes: its class and identity
    in this process (schemas/genie.fbs Colocation)."""
    return f"{type(model).__name__}#{id(model):x}"


@locked
def _colocate(device: torch.device, group: str | None, nbytes: int, only_if: str | None = None) -> None:
    """The scheduler's co-location hint for `device` (its Recording's colocation_group and
    colocation_bytes): the weights uploaded there from now on and the KV caches its runs keep
    carry `group`, whose `nbytes` the node admits whole; None clears it (when the device's
    group is still `only_if`, if given)."""
    recording = runtime_for(device).recording
    if only_if is not None and recording.colocation_group != only_if:
        return
    recording.colocation_group = group or ""
    recording.colocation_bytes = nbytes if group else 0


def _device(node: str) -> torch.device:
    if not node.startswith(_DEVICE + ":"):
        raise ValueError(f"cluster node {node!r} is not a remote_accelerator:i device")
    return torch.device(node)


def _check_tied(blocks, block_node) -> None:
    where: dict[int, tuple[str, str]] = {}
    for path, block in blocks:
        node = block_node[path]
        if node is None:
            continue
        for t in _block_tensors(block):
            other = where.setdefault(id(t), (path, node))
            if other[1] != node:
                raise PlacementError(f"a weight shared by blocks {other[0]!r} and {path!r} would be on two nodes "
                                     f"({other[1]} and {node})")


def _realized(groups, cluster, sched, node_of_name, names, blocks, block_node, goal):
    """The schedule's groups placed as the blocks run them, evaluated by the cost model."""
    moved: dict[str, str] = {}
    for path, block in blocks:
        for t in _block_tensors(block):
            name = names.get(id(t))
            if name is not None and block_node[path] is not None:
                moved[name] = block_node[path]
    placement: dict[int, str] = {}
    previous = None
    for g in groups.groups:
        node = next((moved.get(n, node_of_name.get(n)) for n in g.weights + g.state if n in moved), None)
        node = node or previous or sched.placement[g.id]
        placement[g.id] = previous = node
    return evaluate(groups, cluster, placement, goal=goal, algorithm=f"blocks of {sched.algorithm}")


def _inputs_to(device: torch.device, memo: dict):
    def hook(module, args, kwargs):
        return _move((args, kwargs), device, memo)  # together: one SendTensors per source node
    return hook


def _home_hooks(model: torch.nn.Module, placement: Placement, follow_inputs: bool = True) -> list:
    """The model's outputs go to `placement.home`, or (`follow_inputs`) to the device of the
    first remote tensor argument of the call."""
    calls: list[torch.device] = []

    def first_remote(x):
        if isinstance(x, torch.Tensor):
            return x.device if x.device.type == _DEVICE else None
        if isinstance(x, (tuple, list)):
            return next((d for d in map(first_remote, x) if d is not None), None)
        if isinstance(x, dict):
            return next((d for d in map(first_remote, x.values()) if d is not None), None)
        return None

    def pre(module, args, kwargs):
        if not calls:
            placement._memo.clear()  # moves are reused within one call of the model only
        calls.append((first_remote((args, kwargs)) if follow_inputs else None) or placement.home)

    def post(module, args, kwargs, output):
        out = _move(output, calls.pop(), placement._memo)
        if not calls:
            placement._memo.clear()
        return out

    return [model.register_forward_pre_hook(pre, with_kwargs=True, prepend=True),
            model.register_forward_hook(post, with_kwargs=True, always_call=False)]


@dataclass
class Deferred:
    """A host model moved to the cluster (`defer`, or `model.to("remote_accelerator")` when
    this process has two or more nodes), placed at its first call. `goal`: the scheduler's goal;
    `home`: where its outputs go at every call (the current device when it was deferred);
    `placement`: the Placement its first call made (None before)."""

    model: torch.nn.Module = field(repr=False)
    goal: str
    home: torch.device
    placement: Placement | None = None
    _hook: object = field(default=None, repr=False)
    _placing: bool = field(default=False, repr=False)

    def cancel(self) -> None:
        """The model is no longer on the cluster: the deferral or the placement's hooks are
        removed (the weights stay where they are) and `placement_of(model)` is None."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.placement is not None:
            self.placement.remove()
        self.model.__dict__.pop(_DEFERRED, None)

    def _first_call(self, model, args, kwargs):
        """The forward pre-hook of a deferred model: places it from this call's arguments, then
        lets the call go on through the placement's hooks."""
        if self._placing:  # capture's own trace of the model
            return None
        before = set(model._forward_pre_hooks)
        self._placing = True
        try:
            example_args, example_kwargs = _host_example((args, kwargs))
            self.placement = _place(model, example_args, example_kwargs, goal=self.goal, home=self.home)
        finally:
            self._placing = False
        self._hook.remove()
        self._hook = None
        # torch runs the pre-hooks registered when the call began: the placement's run now.
        for key, hook in list(model._forward_pre_hooks.items()):
            if key not in before:
                args, kwargs = hook(model, args, kwargs) or (args, kwargs)  # all with_kwargs
        return args, kwargs


_DEFERRED = "_genie_deferred"  # the attribute of a deferred model that holds its Deferred


def defer(model: torch.nn.Module, goal: str = "latency") -> Deferred:
    """Puts the host `model` on the cluster without moving anything: at its first call, a
    forward pre-hook places it as `place` does (over every configured node, for `goal`), with
    that call's arguments as the example, removes itself, and the call runs on the placement.
    The example is the call's host tensors as they are, each remote tensor replaced by host
    zeros of its shape and dtype (its value is not read), other objects (an empty cache)
    copied: the trace changes none of the caller's. Every call's outputs go to the device
    current when `defer` is called (what `remote_accelerator` without an index names), so that a caller such as
    `generate()`, which moves the inputs to `model.device`, finds them where its own tensors
    are. A model already deferred keeps its Deferred. Returns the Deferred. Raises ValueError
    for a model with parameters or buffers off the host or for an unknown goal; the first call
    raises what `place` raises (the model stays deferred then)."""
    _check_host(model)
    if goal not in GOALS:
        raise ValueError(f"goal {goal!r} is not one of {GOALS}")
    deferred = model.__dict__.get(_DEFERRED)
    if deferred is None:
        deferred = Deferred(model, goal, torch.device(_DEVICE, torch.remote_accelerator.current_device()))
        # Under torch.compile the hook runs outside Dynamo's trace (a graph break): placing
        # traces the model itself, and the placed model is then compiled anew, block by block.
        first_call = torch.compiler.disable(deferred._first_call, recursive=True)
        deferred._hook = model.register_forward_pre_hook(first_call, with_kwargs=True)
        model.__dict__[_DEFERRED] = deferred
    return deferred


def deferred_of(model: torch.nn.Module) -> Deferred | None:
    """The Deferred of a model on the cluster (`defer`), None for any other model."""
    return model.__dict__.get(_DEFERRED)


def placement_of(model: torch.nn.Module) -> Placement | None:
    """The Placement of a model on the cluster once its first call placed it; None before that
    call and for a model that was not deferred (`defer`)."""
    deferred = deferred_of(model)
    return deferred.placement if deferred is not None else None


def _host_example(x):
    """`x` for a trace on the host: host tensors as they are, other tensors as host zeros of
    their shape and dtype, through tuples, lists and dicts; modules and plain values as they
    are; other objects copied (`copy.deepcopy`)."""
    if isinstance(x, torch.Tensor):
        return x if x.device.type == "cpu" else torch.zeros(x.shape, dtype=x.dtype)
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(_host_example(y) for y in x)
    if isinstance(x, list):
        return [_host_example(y) for y in x]
    if isinstance(x, dict):
        return {k: _host_example(y) for k, y in x.items()}
    if x is None or isinstance(x, (torch.nn.Module, str, bytes, int, float, bool, complex, torch.dtype,
                                   torch.device)):
        return x
    return copy.deepcopy(x)


@dataclass
class Disaggregated:
    """A language model served by `disaggregate`: `prefill` and `decode` devices, the
    scheduler's DisaggregatedSchedule, the prefill copy of the model (`prefill_model`), and
    `kv_moves` (how many caches were moved, prefill to decode)."""

    model: torch.nn.Module
    prefill_model: torch.nn.Module
    prefill: torch.device
    decode: torch.device
    schedule: object
    kv_moves: int = 0

    @property
    def home(self) -> torch.device:
        """Where the model's inputs and outputs live: the decode node."""
        return self.decode

    def __str__(self) -> str:
        return f"genie.disaggregate: prefill on {self.prefill}, decode on {self.decode}\n" + self.schedule.explain()


def disaggregate(model: torch.nn.Module, example_ids: torch.Tensor, *, cluster: Cluster | None = None,
                 decode_steps: int = 32, devices=None) -> Disaggregated:
    """Serves the causal LM `model` (on the host, a transformers model taking `input_ids`,
    `use_cache` and a `DynamicCache` as `cache` or, in older transformers, `past_key_values`) with prefill and decode on two nodes (module docstring).
    `example_ids`: a host prompt (batch, tokens) of the size to plan for; `decode_steps`: the
    decode steps the plan weighs against one prefill. The model's forward is replaced (an
    instance attribute) so that `model(...)` and `model.generate(...)` run disaggregated.
    Raises ValueError for a model off the host, PlacementError when a phase fits on no node."""
    from transformers import DynamicCache

    _check_host(model)
    import inspect
    key = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    with torch.no_grad():
        prefill_graph = capture(model, example_ids, use_cache=True)
        cache = DynamicCache(config=model.config)
        model(example_ids, use_cache=True, **{key: cache})
        decode_graph = capture(model, example_ids[:, -1:], use_cache=True, **{key: cache})
    cluster = cluster if cluster is not None else connected_cluster(devices)
    plan = schedule_disaggregated(analyze(prefill_graph).to_groups(), analyze(decode_graph).to_groups(), cluster,
                                  decode_steps=decode_steps)
    prefill_dev, decode_dev = _device(plan.prefill_node), _device(plan.decode_node)
    prefill_model = copy.deepcopy(model).to(prefill_dev) if prefill_dev != decode_dev else model
    model.to(decode_dev)
    served = Disaggregated(model, prefill_model, prefill_dev, decode_dev, plan)
    forward = model.forward  # the bound method of the model's class

    def disaggregated_forward(*args, **kwargs):
        cache = kwargs.get(key)
        if prefill_dev == decode_dev or (cache is not None and cache.get_seq_length() > 0):
            return forward(*args, **kwargs)
        args, kwargs = _move((args, kwargs), prefill_dev, {})
        out = type(model).forward(prefill_model, *args, **kwargs)
        cache = out.get(key) if isinstance(out, dict) else None
        layers = [layer for layer in getattr(cache, "layers", ()) if getattr(layer, "is_initialized", False)]
        moved = move_many([t for layer in layers for t in (layer.keys, layer.values)], decode_dev)  # one send
        for i, layer in enumerate(layers):
            layer.keys, layer.values, layer.device = moved[2 * i], moved[2 * i + 1], decode_dev
        served.kv_moves += len(layers)
        return _move(out, decode_dev)

    model.forward = disaggregated_forward
    return served

