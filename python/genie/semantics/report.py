"""Readable summaries of an analysed graph (for people; the scheduler reads `to_groups`)."""
from __future__ import annotations

from typing import Any


def _si(x: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.0f} {unit}"


def summary(ann: Any) -> str:
    """Phase, pattern counts (with mean confidence), residency totals and costs, as text."""
    g = ann.graph
    lines = [f"{len(g.nodes)} ops, {len(g.values)} values, phase {ann.phase}, structure {ann.structural_hash[:12]}"]
    by: dict[str, list[float]] = {}
    for m in ann.matches:
        by.setdefault(m.pattern, []).append(m.confidence)
    for name, confs in by.items():
        lines.append(f"  {name:<12} {len(confs):4d}  confidence {sum(confs) / len(confs):.2f}")
    sizes: dict[str, int] = {}
    for vid, cls in ann.residency.items():
        v = g.values[vid]
        if v.producer < 0 or g.nodes[v.producer].base not in ("aten::view", "aten::t", "aten::transpose"):
            sizes[cls] = sizes.get(cls, 0) + v.nbytes
    lines.append("  residency    " + ", ".join(f"{k} {_si(b, 'B')}" for k, b in sorted(sizes.items())))
    c = ann.cost()
    lines.append(f"  cost         {_si(c.flops, 'FLOP')}, {_si(c.bytes, 'B')}, intensity {c.intensity:.1f} FLOP/B")
    return "\n".join(lines)
