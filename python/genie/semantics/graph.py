"""`SemGraph`: the neutral graph form that semantic analysis runs on.

A `SemGraph` is a list of `Node`s in program order over `Value`s:

- `Node`: one aten op. `op` is its schema name, with the overload when it is not `default`
  (``"aten::addmm"``, ``"aten::add.Tensor"``, ``"aten::_scaled_dot_product_flash_attention_for_cpu"``);
  `inputs` are the value ids of its tensor arguments in schema order (a tensor list such as
  `cat`'s contributes each element; absent optional tensors contribute nothing), `arg_names`
  names each of them (``"self"``, ``"mat1"``, ``"attn_mask"``: the schema's argument names, or
  ``""`` where the builder did not know); `outputs` are the ids of the tensors it returns;
  `attrs` its non-tensor arguments by name (ints, floats, bools, strings, tuples of those:
  convolution's `stride`/`padding`/`groups`, `dim`, `keepdim`, ...); `writes` the input ids
  it writes in place (`index_copy_`'s `self`); `key` its structural label (the op, the
  written argument positions, the attributes that change what the op does but not shapes,
  see `STRUCTURAL_ATTRS`, and its outputs' ranks): what the analysis cache hashes.
- `Value`: one tensor: `shape` (a tuple of ints), `dtype` (a string such as ``"float32"``),
  `kind` (``"input"``, ``"weight"``, ``"buffer"``, ``"constant"``, ``"activation"``, or
  ``"gradient"`` for an incoming gradient, AOTAutograd's `tangents_*`), `name` (a parameter's,
  buffer's or input's name; ``None`` for activations), `producer` (the index of the node that
  makes it; -1 for graph inputs), `mutated` (an op writes it in place, or the program writes a
  new value for it that outlives the call, e.g. `torch.export`'s buffer mutations).

Records are NamedTuples (small, immutable, slotted: tinygrad's UOp style); a graph is never
changed after it is built.

Builders: `GraphBuilder` (incremental: `input`, `op`, `build`), `SemGraph.from_nodes` (a node
list with op names, input/output ids, shapes and attrs, for adapters from other IRs),
`from_fx` (aten-level FX graphs whose nodes carry ``meta["val"]``: `make_fx`, AOTAutograd,
`torch.export`) and `capture` (traces a callable on CPU tensors and modules with fake tensors).

Over 600 lines: the records and every builder of them: `SemGraph.from_nodes` and `from_fx` build
through `GraphBuilder` and `capture` traces into `from_fx`, so all routes share one normalization
of attributes and dtypes and one `Node.key` (`structural_key`), which the analysis cache hashes.
"""
from __future__ import annotations

import math
import sys
from array import array
from functools import lru_cache
from typing import Any, Iterable, Iterator, Mapping, NamedTuple, Sequence

KINDS = ("input", "weight", "buffer", "constant", "activation", "gradient")

# Attributes that change what an op computes without being a shape: they are part of a node's
# structural label (`Node.key`). Sizes (`view`'s `size`, `arange`'s `end`, `slice`'s bounds) and
# scalar operands are left out, so graphs of one program at other batch sizes and sequence
# lengths share a structure; the analysis never reads the attributes left out.
STRUCTURAL_ATTRS = frozenset({
    "dim", "dims", "dim0", "dim1", "keepdim", "stride", "padding", "dilation", "groups", "transposed",
    "output_padding", "is_causal", "training", "train", "approximate", "reduction", "half_to_float",
    "ceil_mode", "kernel_size", "count_include_pad", "output_mask", "return_debug_mask", "reverse",
    "mode", "equation", "unbiased", "correction",
})

# Ops that only re-describe memory or copy it unchanged: looking "through" them finds where a
# tensor comes from (a weight behind `t`, a cache behind `slice`) or where it goes.
VIEW_OPS = frozenset({
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias", "aten::transpose",
    "aten::t", "aten::permute", "aten::expand", "aten::unsqueeze", "aten::squeeze", "aten::alias",
    "aten::select", "aten::slice", "aten::split", "aten::split_with_sizes", "aten::unbind",
    "aten::chunk", "aten::detach", "aten::as_strided", "aten::narrow", "aten::view_as",
    "aten::expand_as", "aten::unflatten", "aten::flatten", "aten::movedim", "aten::lift_fresh",
    "aten::numpy_T", "aten::mT", "aten::_unsafe_split",
})
# Copies that keep the values (layout or dtype changes): passed through like views, but they move bytes.
COPY_OPS = frozenset({"aten::clone", "aten::contiguous", "aten::_to_copy", "aten::to", "aten::lift_fresh_copy",
                      "aten::_to_dtype", "aten::repeat", "aten::repeat_interleave"})
PASSTHROUGH_OPS = VIEW_OPS | COPY_OPS

_ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1, "complex64": 8, "complex128": 16,
    "complex32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1, "qint8": 1, "quint8": 1, "qint32": 4,
}


@lru_cache(maxsize=4096)
def dtype_name(dtype: Any) -> str:
    """`torch.float32` or `"torch.float32"` -> `"float32"` (interned)."""
    return sys.intern(str(dtype).removeprefix("torch."))


@lru_cache(maxsize=None)
def base_name(op: str) -> str:
    """`"aten::add.Tensor"` -> `"aten::add"`; `"aten::add_.Tensor"` -> `"aten::add_"`."""
    ns, sep, rest = op.partition("::")
    return f"{ns}::{rest.partition('.')[0]}" if sep else op.partition(".")[0]


@lru_cache(maxsize=None)
def functional_name(op: str) -> str:
    """The base name without a trailing in-place underscore: `"aten::index_copy_"` -> `"aten::index_copy"`."""
    b = base_name(op)
    return b[:-1] if b.endswith("_") and not b.endswith("__") else b


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype name; raises KeyError for an unknown dtype."""
    try:
        return _ITEMSIZE[dtype]
    except KeyError:
        import torch  # a dtype this table lacks: ask torch once

        size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        _ITEMSIZE[dtype] = size
        return size


_LABEL_IDS: dict[str, int] = {}


def label_id(text: str) -> int:
    """A small int standing for a label (a node key, a kind, a dtype) in this process."""
    v = _LABEL_IDS.get(text)
    if v is None:
        v = _LABEL_IDS[text] = len(_LABEL_IDS)
    return v


def encode_shapes(values: Mapping[int, "Value"], order: Iterable[int]) -> bytes:
    """The shapes and dtypes of `values` in `order`, as int64s: per value its rank, sizes, dtype's
    `label_id`. Equal encodings are equal shapes and dtypes (the analysis cache's level-2 key)."""
    out: list[int] = []
    app, ext = out.append, out.extend
    for v in map(values.__getitem__, order):
        shape = v.shape
        app(len(shape))
        ext(shape)
        app(label_id(v.dtype))
    return array("q", out).tobytes()


class Value(NamedTuple):
    """One tensor value (see the module docstring). `nbytes` is its dense size in bytes."""

    id: int
    shape: tuple[int, ...]
    dtype: str
    kind: str
    name: str | None = None
    producer: int = -1
    mutated: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * itemsize(self.dtype)


class Node(NamedTuple):
    """One aten op in program order (see the module docstring)."""

    index: int
    op: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    arg_names: tuple[str, ...] = ()
    writes: tuple[int, ...] = ()
    key: str = ""

    @property
    def base(self) -> str:
        """The op without its overload (`"aten::add"`)."""
        return base_name(self.op)

    def attr(self, name: str, default: Any = None) -> Any:
        """The attribute `name`, or `default` where the op has none of that name."""
        for k, v in self.attrs:
            if k == name:
                return v
        return default

    def input_named(self, name: str) -> int | None:
        """The value id of the tensor argument `name` (schema name), or None."""
        for vid, arg in zip(self.inputs, self.arg_names):
            if arg == name:
                return vid
        return None


def _normalize_attr(v: Any) -> Any:
    """Attributes as hashable plain data: lists become tuples, dtypes and other objects strings."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return tuple(_normalize_attr(x) for x in v)
    return dtype_name(v) if "dtype" in type(v).__name__ else str(v)


def structural_key(op: str, attrs: Iterable[tuple[str, Any]], write_positions: Iterable[int] = (),
                   ranks: Iterable[int] = ()) -> str:
    """A node's structural label: op, written argument positions, the `STRUCTURAL_ATTRS` it has
    and the ranks of its outputs (ranks are structure: sizes are not).

    Convolution's and pooling's `stride`/`padding` count; `as_strided`'s `stride` is a shape.
    """
    conv_like = "conv" in op or "pool" in op
    parts = [op]
    for k, v in attrs:
        if k in STRUCTURAL_ATTRS and (conv_like or k not in ("stride", "padding", "kernel_size")):
            parts.append(f"{k}={v!r}")
    w = tuple(write_positions)
    if w:
        parts.append(f"writes={w}")
    parts.append("r=" + ",".join(str(r) for r in ranks))
    return sys.intern("|".join(parts))  # one object per distinct label: cheap to hash and compare


class GraphBuilder:
    """Builds a `SemGraph` op by op, in program order.

        b = GraphBuilder()
        x = b.input((8, 64), "float32")
        w = b.input((64, 64), "float32", kind="weight", name="fc.weight")
        (y,) = b.op("aten::mm", [x, w], [((8, 64), "float32")])
        g = b.build(outputs=[y])

    Value ids are given in creation order unless `vid` is passed (any int, unique per graph).
    """

    def __init__(self) -> None:
        self._values: dict[int, list] = {}
        self._nodes: list[tuple] = []
        self._next = 0
        self._mutated: set[int] = set()

    def _new_id(self, vid: int | None) -> int:
        if vid is None:
            while self._next in self._values:
                self._next += 1
            vid = self._next
            self._next += 1
        elif vid in self._values:
            raise ValueError(f"value id {vid} is defined twice")
        return vid

    def input(self, shape: Sequence[int], dtype: Any = "float32", kind: str = "input", name: str | None = None,
              *, vid: int | None = None, mutated: bool = False) -> int:
        """A graph input of `kind` (one of `KINDS` except "activation"); returns its value id."""
        if kind not in KINDS or kind == "activation":
            raise ValueError(f"input kind must be one of {KINDS[:4] + KINDS[5:]}, not {kind!r}")
        vid = self._new_id(vid)
        self._values[vid] = [tuple(int(s) for s in shape), dtype_name(dtype), kind, name, -1]
        if mutated:
            self._mutated.add(vid)
        return vid

    def op(self, op: str, inputs: Sequence[int], outputs: Sequence[tuple[Sequence[int], Any]],
           attrs: Mapping[str, Any] | Iterable[tuple[str, Any]] = (), *, arg_names: Sequence[str] | None = None,
           writes: Sequence[int] = (), output_ids: Sequence[int] | None = None) -> tuple[int, ...]:
        """Appends one op: `inputs` (value ids), `outputs` as (shape, dtype) pairs, `attrs`.

        `writes`: the input ids it writes in place. Returns the output value ids. Raises
        ValueError for an input id that is not defined yet (nodes must come in program order).
        """
        index = len(self._nodes)
        ins = tuple(int(v) for v in inputs)
        for v in ins:
            if v not in self._values:
                raise ValueError(f"{op}: input value {v} is not defined before node {index}")
        ws = tuple(int(v) for v in writes)
        if not set(ws) <= set(ins):
            raise ValueError(f"{op}: written values {ws} must be among its inputs {ins}")
        items = attrs.items() if isinstance(attrs, Mapping) else attrs
        at = tuple((str(k), _normalize_attr(v)) for k, v in items)
        outs = []
        for i, (shape, dtype) in enumerate(outputs):
            vid = self._new_id(None if output_ids is None else output_ids[i])
            self._values[vid] = [tuple(int(s) for s in shape), dtype_name(dtype), "activation", None, index]
            outs.append(vid)
        names = tuple(arg_names) if arg_names is not None else ("",) * len(ins)
        if len(names) != len(ins):
            raise ValueError(f"{op}: {len(names)} argument names for {len(ins)} inputs")
        key = structural_key(op, at, (ins.index(w) for w in ws), (len(self._values[o][0]) for o in outs))
        self._nodes.append((index, op, ins, tuple(outs), at, names, ws, key))
        self._mutated.update(ws)
        return tuple(outs)

    def mark_mutated(self, vid: int) -> None:
        """Marks a graph input as written by the program (a functional graph's state update)."""
        self._mutated.add(vid)

    def build(self, outputs: Sequence[int] = (), *, backward: bool = False) -> "SemGraph":
        """The finished graph; `outputs` are the value ids the program returns. `backward`: the
        graph is a backward graph (AOTAutograd's), every node is then in the backward phase."""
        mutated = set(self._mutated)
        for vid in self._mutated:  # a write through a view writes the viewed tensor too
            p = self._values[vid][4]
            while p >= 0:
                n = self._nodes[p]
                if base_name(n[1]) not in VIEW_OPS or not n[2]:
                    break
                vid = n[2][0]
                mutated.add(vid)
                p = self._values[vid][4]
        values = {vid: Value(vid, v[0], v[1], v[2], v[3], v[4], vid in mutated)
                  for vid, v in self._values.items()}
        nodes = tuple(Node(*n) for n in self._nodes)
        return SemGraph(nodes, values, tuple(outputs), backward=backward)


class SemGraph:
    """Nodes in program order, the values they read and make, and the program's outputs.

    Built by `GraphBuilder`, `SemGraph.from_nodes`, `from_fx` or `capture`; immutable once
    built. Node `i` is `nodes[i]` (`Node.index == i`). `inputs` are the graph inputs' value ids
    in the order the nodes first read them, then unread ones; `value_order` the inputs then
    every node's outputs in program order.

    Two flat encodings are made when the graph is built (while its records are fresh in memory),
    for the analysis cache to compare graphs by: `structure` (int64s: per input its id, kind,
    written flag and rank; per node its label id (`Node.key`), input ids and output ids; the
    outputs and the backward flag) and `shapes` (`encode_shapes` in `value_order`). Value ids
    must fit in a signed 64-bit int.
    """

    __slots__ = ("nodes", "values", "outputs", "inputs", "backward", "value_order", "structure", "shapes",
                 "_consumers", "_memo")

    def __init__(self, nodes: Sequence[Node], values: Mapping[int, Value], outputs: Sequence[int] = (),
                 *, backward: bool = False) -> None:
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.values: dict[int, Value] = dict(values)
        self.outputs: tuple[int, ...] = tuple(outputs)
        self.backward = bool(backward)
        for i, n in enumerate(self.nodes):
            if n.index != i:
                raise ValueError(f"node {i} has index {n.index}: nodes must be numbered in program order")
        seen: dict[int, None] = {}
        for n in self.nodes:
            for v in n.inputs:
                if self.values[v].producer < 0:
                    seen.setdefault(v)
        for vid, v in self.values.items():
            if v.producer < 0:
                seen.setdefault(vid)
        self.inputs: tuple[int, ...] = tuple(seen)
        order = list(self.inputs)
        for n in self.nodes:
            order.extend(n.outputs)
        self.value_order: tuple[int, ...] = tuple(order)
        self.structure: bytes = self._encode_structure()
        self.shapes: bytes = encode_shapes(self.values, self.value_order)
        self._consumers: dict[int, tuple[int, ...]] | None = None
        self._memo: dict = {}

    def _encode_structure(self) -> bytes:
        out: list[int] = [len(self.inputs)]
        app, ext = out.append, out.extend
        for vid in self.inputs:
            v = self.values[vid]
            ext((vid, label_id(v.kind), v.mutated, len(v.shape)))
        for n in self.nodes:
            ins, outs = n.inputs, n.outputs
            app(label_id(n.key))
            app(len(ins))
            ext(ins)
            app(len(outs))
            ext(outs)
        app(-1)
        ext(self.outputs)
        app(int(self.backward))
        return array("q", out).tobytes()

    # ---- construction from a plain node list -------------------------------------------------

    @classmethod
    def from_nodes(cls, nodes: Iterable[Mapping[str, Any]], values: Mapping[int, Mapping[str, Any]],
                   outputs: Sequence[int] = (), *, backward: bool = False) -> "SemGraph":
        """A graph from plain records (the adapter path for other IRs).

        `nodes`: in program order, each a mapping with `op` (aten name), `inputs` (value ids),
        `outputs` (value ids), optional `attrs` (mapping), `arg_names`, `writes` (ids written in place).
        `values`: value id -> mapping with `shape`, `dtype`, optional `kind` (default "input" for
        values no node makes), `name`, `mutated`. Every id a node reads must be a graph input or
        made by an earlier node; raises ValueError otherwise, KeyError for a missing value record.
        """
        b = GraphBuilder()
        produced = {v for n in nodes for v in n["outputs"]}
        for vid, rec in values.items():
            if vid not in produced:
                b.input(rec["shape"], rec.get("dtype", "float32"), rec.get("kind", "input"), rec.get("name"),
                        vid=vid, mutated=bool(rec.get("mutated", False)))
        for n in nodes:
            outs = [(values[v]["shape"], values[v].get("dtype", "float32")) for v in n["outputs"]]
            b.op(n["op"], n["inputs"], outs, n.get("attrs", ()), arg_names=n.get("arg_names"),
                 writes=n.get("writes", ()), output_ids=list(n["outputs"]))
        return b.build(outputs, backward=backward)

    # ---- queries ----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def value(self, vid: int) -> Value:
        return self.values[vid]

    def producer(self, vid: int) -> Node | None:
        """The node that makes value `vid`, None for a graph input."""
        p = self.values[vid].producer
        return self.nodes[p] if p >= 0 else None

    def consumers(self, vid: int) -> tuple[int, ...]:
        """Indices of the nodes that read value `vid`, in program order."""
        if self._consumers is None:
            cons: dict[int, list[int]] = {}
            for n in self.nodes:
                for v in n.inputs:
                    lst = cons.setdefault(v, [])
                    if not lst or lst[-1] != n.index:
                        lst.append(n.index)
            self._consumers = {v: tuple(c) for v, c in cons.items()}
        return self._consumers.get(vid, ())

    @property
    def op_bases(self) -> frozenset[str]:
        """The distinct ops (without overloads) in the graph."""
        got = self._memo.get("op_bases")
        if got is None:
            got = self._memo["op_bases"] = frozenset(n.base for n in self.nodes)
        return got

    def op_counts(self) -> dict[str, int]:
        """Op name (with overload) -> how many nodes run it."""
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.op] = out.get(n.op, 0) + 1
        return out

    def origin(self, vid: int) -> int:
        """The value `vid` is a view or copy of: walks back through `PASSTHROUGH_OPS` (first input)."""
        while True:
            p = self.values[vid].producer
            if p < 0:
                return vid
            n = self.nodes[p]
            if n.base not in PASSTHROUGH_OPS or not n.inputs:
                return vid
            vid = n.inputs[0]

    def through_views(self, vid: int) -> list[tuple[int, int]]:
        """The nodes that read `vid` or a view/copy of it: (node index, the value it reads).

        Walks forward through `PASSTHROUGH_OPS` (as their first input); the passthrough nodes
        themselves are not listed.
        """
        out: list[tuple[int, int]] = []
        stack = [vid]
        seen = {vid}
        while stack:
            v = stack.pop()
            for c in self.consumers(v):
                n = self.nodes[c]
                if n.base in PASSTHROUGH_OPS and n.inputs and n.inputs[0] == v:
                    for o in n.outputs:
                        if o not in seen:
                            seen.add(o)
                            stack.append(o)
                else:
                    out.append((c, v))
        out.sort()
        return out

    def format(self, limit: int | None = None) -> str:
        """A readable listing: one line per node with its input and output shapes."""
        lines = []
        for vid in self.inputs:
            v = self.values[vid]
            lines.append(f"  %{vid} = {v.kind}{'*' if v.mutated else ''} {v.name or ''} {list(v.shape)} {v.dtype}")
        for n in self.nodes[:limit]:
            outs = ", ".join(f"%{o}{list(self.values[o].shape)}" for o in n.outputs)
            ins = ", ".join(f"%{i}" for i in n.inputs)
            attrs = ", ".join(f"{k}={v}" for k, v in n.attrs)
            lines.append(f"{n.index:4d} {outs} = {n.op}({ins}{'; ' + attrs if attrs else ''})")
        lines.append(f"  return {', '.join(f'%{o}' for o in self.outputs)}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"SemGraph({len(self.nodes)} nodes, {len(self.values)} values, {len(self.inputs)} inputs)"


# ---- from FX ------------------------------------------------------------------------------------

def _fx_op_name(target: Any) -> str:
    """`aten::addmm`, `aten::add.Tensor` for OpOverloads; `module.name` for other callables."""
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
    mod = getattr(target, "__module__", None) or ""
    return f"{mod}.{getattr(target, '__name__', str(target))}".lstrip(".")


def _tensor_spec(val: Any) -> tuple[tuple[int, ...], str] | None:
    """(shape, dtype) of a (fake) tensor; None for anything else."""
    import torch

    if not isinstance(val, torch.Tensor):
        return None
    shape = []
    for s in val.shape:
        try:
            shape.append(int(s))
        except Exception:  # an unbacked symbolic size: its hint where it has one
            hint = getattr(getattr(s, "node", None), "hint", None)
            shape.append(int(hint) if hint is not None else 1)
    return tuple(shape), dtype_name(val.dtype)


def _lookup(spec: Any, placeholder: Any, position: int, default: Any) -> Any:
    if spec is None:
        return default
    if isinstance(spec, Mapping):
        return spec.get(placeholder.target, spec.get(placeholder.name, default))
    return spec[position] if position < len(spec) else default


def from_fx(gm: Any, *, input_kinds: Mapping[str, str] | Sequence[str] | None = None,
            input_names: Mapping[str, str] | Sequence[str] | None = None,
            mutated_inputs: Iterable[str] = (), backward: bool = False) -> SemGraph:
    """A `SemGraph` from an aten-level FX graph whose nodes carry ``meta["val"]`` (fake tensors).

    `gm`: a `torch.fx.GraphModule` (from `make_fx(..., tracing_mode="fake")`, AOTAutograd's
    forward or backward compiler, ...), a `torch.fx.Graph`, or a `torch.export.ExportedProgram`.
    `input_kinds`: per placeholder (a sequence in placeholder order, or a mapping from the
    placeholder's name) one of `KINDS`; by default "input", except AOTAutograd's
    ``tangents_*`` placeholders ("gradient") and, for an ExportedProgram, what its graph
    signature says (parameters -> "weight", buffers -> "buffer", constants -> "constant",
    buffers and inputs it mutates -> mutated). `input_names`: names in the same forms (default:
    the placeholder's name, or the signature's target). `mutated_inputs`: placeholder names the
    program writes (for functional graphs). `backward`: every node is a backward op (pass True
    for AOTAutograd's backward graph).

    Multi-output ops get one value per tensor they return; `getitem` nodes are folded into
    them. Raises ValueError for a call node without a tensor ``meta["val"]`` that produces
    tensors the graph uses (e.g. a plain `symbolic_trace` graph: trace with fake tensors).
    """
    import operator

    import torch

    mutated_names = set(mutated_inputs)
    out_filter: set[int] | None = None
    if isinstance(gm, torch.export.ExportedProgram):
        input_kinds, input_names, mutated_names, out_filter = _export_signature(gm, mutated_names)
        graph = gm.graph_module.graph
        owner = gm.graph_module
    elif isinstance(gm, torch.fx.Graph):
        graph, owner = gm, gm.owning_module
    else:
        graph, owner = gm.graph, gm

    b = GraphBuilder()
    env: dict[Any, int] = {}                       # fx node -> value id
    multi: dict[tuple[Any, int], int] = {}         # (fx node, output index) -> value id
    outputs: list[int] = []
    position = 0
    for n in graph.nodes:
        if n.op == "placeholder":
            spec = _tensor_spec(n.meta.get("val", n.meta.get("example_value")))
            if spec is None:
                position += 1
                continue
            default_kind = "gradient" if str(n.target).startswith("tangents") else "input"
            kind = _lookup(input_kinds, n, position, default_kind)
            name = _lookup(input_names, n, position, str(n.target))
            env[n] = b.input(spec[0], spec[1], kind, name,
                             mutated=n.name in mutated_names or str(n.target) in mutated_names)
            position += 1
        elif n.op == "get_attr":
            t = getattr(owner, n.target, None) if owner is not None else None
            spec = _tensor_spec(t) or _tensor_spec(n.meta.get("val"))
            if spec is not None:
                env[n] = b.input(spec[0], spec[1], "constant", str(n.target))
        elif n.op == "call_function" and n.target is operator.getitem:
            src, idx = n.args[0], n.args[1]
            if (src, idx) in multi:
                env[n] = multi[(src, idx)]
        elif n.op in ("call_function", "call_method", "call_module"):
            _fx_call(b, n, env, multi)
        elif n.op == "output":
            flat: list = []
            torch.fx.node.map_arg(n.args, flat.append)
            for i, o in enumerate(flat):
                if o in env and (out_filter is None or i in out_filter):
                    outputs.append(env[o])
    return b.build(outputs, backward=backward)


def _fx_call(b: GraphBuilder, n: Any, env: dict, multi: dict) -> None:
    """Appends one FX call node (see `from_fx`)."""
    import torch

    val = n.meta.get("val", n.meta.get("example_value"))
    vals = list(val) if isinstance(val, (tuple, list)) else [val]
    specs = [_tensor_spec(v) for v in vals]
    op = _fx_op_name(n.target) if n.op == "call_function" else f"{n.op}:{n.target}"
    inputs: list[int] = []
    names: list[str] = []
    attrs: list[tuple[str, Any]] = []
    writes: list[int] = []
    schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
    if schema is not None:
        for i, arg in enumerate(schema.arguments):
            if i < len(n.args) and not arg.kwarg_only:
                a = n.args[i]
            elif arg.name in n.kwargs:
                a = n.kwargs[arg.name]
            else:
                continue
            ids = _arg_values(a, env)
            if ids is None:
                if a is not None and not isinstance(a, torch.fx.Node):
                    attrs.append((arg.name, a))
                continue
            inputs.extend(ids)
            names.extend([arg.name] * len(ids))
            if arg.alias_info is not None and arg.alias_info.is_write:
                writes.extend(ids)
    else:
        flat: list = []
        torch.fx.node.map_arg((n.args, n.kwargs), flat.append)
        for a in flat:
            if a in env:
                inputs.append(env[a])
                names.append("")
    outs = [(s[0], s[1]) for s in specs if s is not None]
    if not outs and not writes:
        if "val" not in n.meta and "example_value" not in n.meta and n.users:
            raise ValueError(f"FX node {n.name} ({n.target}) has no meta['val']: trace with fake tensors "
                             "(make_fx(..., tracing_mode='fake'), AOTAutograd or torch.export)")
        return  # a symbolic-size computation, an assertion: no tensor made or written
    ids = b.op(op, inputs, outs, attrs, arg_names=names, writes=list(dict.fromkeys(writes)))
    it = iter(ids)
    if isinstance(val, (tuple, list)):
        for i, s in enumerate(specs):
            if s is not None:
                multi[(n, i)] = next(it)
    elif ids:
        env[n] = ids[0]


def _arg_values(a: Any, env: dict) -> list[int] | None:
    """The value ids an argument holds (a tensor or a list of tensors); None if it holds none."""
    import torch

    if isinstance(a, torch.fx.Node):
        return [env[a]] if a in env else None
    if isinstance(a, (list, tuple)) and any(isinstance(x, torch.fx.Node) for x in a):
        ids = [env[x] for x in a if isinstance(x, torch.fx.Node) and x in env]
        return ids or None
    return None


def _export_signature(ep: Any, mutated: set[str]) -> tuple[dict, dict, set, set]:
    """Kinds, names and mutated placeholders from an ExportedProgram's graph signature, and the
    positions of its user outputs (mutations of buffers and inputs are not returned to the program)."""
    from torch.export.graph_signature import InputKind, OutputKind

    sig = ep.graph_signature
    kinds: dict[str, str] = {}
    names: dict[str, str] = {}
    by_target: dict[str, str] = {}
    for spec in sig.input_specs:
        arg = getattr(spec.arg, "name", None)
        if arg is None:
            continue
        kinds[arg] = {InputKind.PARAMETER: "weight", InputKind.BUFFER: "buffer",
                      InputKind.CONSTANT_TENSOR: "constant"}.get(spec.kind, "input")
        names[arg] = spec.target or arg
        by_target[spec.target or arg] = arg
    mutated = set(mutated)
    users: set[int] = set()
    for i, spec in enumerate(sig.output_specs):
        if spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION):
            mutated.add(by_target.get(spec.target, spec.target))
        elif spec.kind == OutputKind.USER_OUTPUT:
            users.add(i)
    return kinds, names, mutated, users


# ---- capture ------------------------------------------------------------------------------------

class _Slot(NamedTuple):
    """A tensor the traced callable reads: where it lives and how to put another in its place."""

    kind: str
    name: str
    tensor: Any
    put: Any  # callable(tensor) -> None


def _walk(obj: Any, path: str, slots: list[_Slot], modules: list[tuple[str, Any]], seen: set[int],
          put: Any, depth: int = 0) -> None:
    """Finds tensors and modules reachable from `obj` through lists, dicts and object attributes."""
    import types

    import torch

    if isinstance(obj, torch.Tensor):
        slots.append(_Slot("input", path, obj, put))
        return
    if id(obj) in seen or depth > 6 or obj is None or isinstance(obj, (str, bytes, int, float, bool, complex)):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        modules.append((path, obj))
        return
    if isinstance(obj, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                        types.MethodType, torch.dtype, torch.device)):
        return
    if isinstance(obj, list):
        for i, x in enumerate(obj):
            _walk(x, f"{path}[{i}]", slots, modules, seen, lambda t, o=obj, i=i: o.__setitem__(i, t), depth + 1)
    elif isinstance(obj, dict):
        for k, x in list(obj.items()):
            _walk(x, f"{path}[{k!r}]", slots, modules, seen, lambda t, o=obj, k=k: o.__setitem__(k, t), depth + 1)
    elif isinstance(obj, tuple):
        for i, x in enumerate(obj):  # tensors directly in a tuple cannot be swapped: only what is inside objects
            if not isinstance(x, torch.Tensor):
                _walk(x, f"{path}[{i}]", slots, modules, seen, None, depth + 1)
    elif hasattr(obj, "__dict__"):
        for k, x in list(vars(obj).items()):
            _walk(x, f"{path}.{k}" if path else k, slots, modules, seen,
                  lambda t, o=obj, k=k: setattr(o, k, t), depth + 1)


def _flat_tensors(out: Any) -> list:
    """The tensors in a result: through tuples, lists and dicts (HF ModelOutputs are dicts)."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for x in out for t in _flat_tensors(x)]
    if isinstance(out, dict):
        return [t for x in out.values() for t in _flat_tensors(x)]
    return []


def capture(fn: Any, *args: Any, **kwargs: Any) -> SemGraph:
    """Traces ``fn(*args, **kwargs)`` with fake tensors into a `SemGraph` (nothing runs, nothing changes).

    `fn`: an `nn.Module`, a bound method of one, or any callable. Tensors it reads are found
    in `args`/`kwargs` (also inside lists, dicts and plain objects such as a
    `transformers.StaticCache`) and in `fn`'s closure; modules found in the same places (and
    `fn` itself) contribute their parameters (kind "weight", named as in `named_parameters`,
    prefixed by where the module was found unless it is `fn`) and buffers (kind "buffer").
    Other tensors are kind "input", named by their path (``"args[0]"``,
    ``"past_key_values.layers[0].keys"``). In-place writes to them (a KV cache's
    `index_copy_`) mark them mutated. Each is replaced by a fake tensor for the trace
    (`torch.func.functional_call` for module state, attribute swaps for objects, restored
    afterwards), so tracing costs no memory for weights and leaves the objects unchanged.

    Traced with `make_fx(tracing_mode="fake")` under `torch.no_grad()` (`torch.func.grad`
    inside `fn` still differentiates). Raises ValueError when `fn` reads a tensor that is
    none of these (a global): pass it as an argument.
    """
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    slots: list[_Slot] = []
    modules: list[tuple[str, Any]] = []
    seen: set[int] = set()
    root = fn if isinstance(fn, torch.nn.Module) else getattr(fn, "__self__", None)
    if isinstance(root, torch.nn.Module):
        modules.append(("", root))
        seen.add(id(root))
    arg_list = list(args)
    kw_dict = dict(kwargs)
    _walk(arg_list, "args", slots, modules, seen, None)
    for k, v in kw_dict.items():
        _walk(v, k, slots, modules, seen, lambda t, k=k: kw_dict.__setitem__(k, t))
    for i, cell in enumerate(getattr(fn, "__closure__", None) or ()):
        try:
            content = cell.cell_contents
        except ValueError:
            continue
        name = fn.__code__.co_freevars[i] if hasattr(fn, "__code__") else f"closure[{i}]"
        _walk(content, name, slots, modules, seen, lambda t, c=cell: setattr(c, "cell_contents", t))
    for s in slots:
        if s.put is None:
            raise ValueError(f"capture: tensor {s.name} sits in a tuple inside an object; pass it another way")

    holder = torch.nn.Module()
    module_names: list[tuple[str, str, str]] = []  # (holder key, display name, kind)
    for i, (path, mod) in enumerate(modules):
        holder.add_module(f"m{i}", mod)
        prefix = f"{path}." if path else ""
        for pname, _ in mod.named_parameters():
            module_names.append((f"m{i}.{pname}", prefix + pname, "weight"))
        for bname, _ in mod.named_buffers():
            module_names.append((f"m{i}.{bname}", prefix + bname, "buffer"))
    state = dict(holder.named_parameters())
    state.update(holder.named_buffers())
    keys = [k for k, _, _ in module_names]
    module_tensors = [state[k] for k in keys]
    slot_tensors = [s.tensor for s in slots]

    def call(a: list, kw: dict) -> Any:
        return fn(*a, **kw)

    holder.forward = call  # type: ignore[method-assign]

    def traced(module_ts: list, slot_ts: list) -> list:
        for s, t in zip(slots, slot_ts):
            s.put(t)
        try:
            out = torch.func.functional_call(holder, dict(zip(keys, module_ts)), (arg_list, kw_dict))
        finally:
            for s in slots:
                s.put(s.tensor)
        return _flat_tensors(out)

    try:
        with torch.no_grad():
            gm = make_fx(traced, tracing_mode="fake")(module_tensors, slot_tensors)
    except AssertionError as e:
        if "FakeTensor" in str(e):
            raise ValueError("capture: the callable reads a tensor that is not an argument, not reachable from "
                             "the arguments or its closure, and not a module's parameter or buffer; pass it as "
                             f"an argument ({e})") from e
        raise
    finally:
        for s in slots:
            s.put(s.tensor)
        del holder.forward
    kinds = [kind for _, _, kind in module_names] + [s.kind for s in slots]
    names = [name for _, name, _ in module_names] + [s.name for s in slots]
    return from_fx(gm, input_kinds=kinds, input_names=names)


def renumbered(graph: SemGraph, seed: int, reorder: bool = True) -> tuple[SemGraph, list[int], dict[int, int]]:
    """The same program as another `SemGraph`: other value ids (random, from `seed`) and, with
    `reorder`, its ops in another topological order. Returns (graph, order: the original index
    of each new node, ids: original value id -> new one). What the analysis cache must treat
    as equal (its tests and perf/bench_semantics.py)."""
    import random
    rng = random.Random(seed)
    order = list(range(len(graph.nodes)))
    if reorder:
        pending = [len({graph.values[v].producer for v in n.inputs if graph.values[v].producer >= 0})
                   for n in graph.nodes]
        ready = [i for i, p in enumerate(pending) if p == 0]
        order = []
        while ready:
            i = ready.pop(rng.randrange(len(ready)))
            order.append(i)
            for r in sorted({c for o in graph.nodes[i].outputs for c in graph.consumers(o)}):
                pending[r] -= 1
                if pending[r] == 0:
                    ready.append(r)
    ids = dict(zip(graph.values, rng.sample(range(10 ** 7), len(graph.values))))
    nodes = [{"op": n.op, "inputs": [ids[v] for v in n.inputs], "outputs": [ids[v] for v in n.outputs],
              "attrs": dict(n.attrs), "arg_names": n.arg_names, "writes": [ids[v] for v in n.writes]}
             for n in (graph.nodes[i] for i in order)]
    values = {ids[vid]: {"shape": v.shape, "dtype": v.dtype, "kind": v.kind, "name": v.name,
                         "mutated": v.mutated and v.producer < 0} for vid, v in graph.values.items()}
    return SemGraph.from_nodes(nodes, values, [ids[o] for o in graph.outputs]), order, ids
