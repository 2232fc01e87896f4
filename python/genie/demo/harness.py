"""Running a workload on a device and checking a device result against the local one.

Shared by ``python -m genie.demo`` and ``perf/bench_models.py``.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch

from . import models
from .measure import Counters, counter_delta, median, median_counters, timed


def quiet_libraries() -> None:
    """Offline, no progress bars, no generation warnings (called before the loaders)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except ImportError:
        pass
    logging.getLogger("sentence_transformers").setLevel(logging.ERROR)


def load(name: str, quick: bool = False, max_new_tokens: int | None = None):
    """The workload ``name`` (``minilm``, ``gpt2``, ``resnet50``); ``quick`` takes fewer inputs."""
    if name == "minilm":
        return models.load_minilm(4 if quick else len(models.SENTENCES))
    if name == "gpt2":
        return models.load_gpt2(max_new_tokens or (4 if quick else 32))
    if name == "resnet50":
        return models.load_resnet50(2 if quick else len(models.PHOTOS))
    raise ValueError(f"unknown model {name!r}: expected one of {', '.join(models.MODEL_NAMES)}")


@dataclass
class RunStats:
    """One run of a workload: result (CPU), wall seconds, counter deltas, and for GPT-2 the decode steps."""
    result: torch.Tensor
    seconds: float
    counters: dict | None
    step_seconds: list = field(default_factory=list)    # seconds per decode step (GPT-2)
    step_counters: list = field(default_factory=list)   # counter deltas per decode step (GPT-2)

    def step_summary(self) -> dict | None:
        """Median seconds and counters per decode step; ``None`` for models without steps."""
        if not self.step_seconds:
            return None
        return {"steps": len(self.step_seconds), "median_s": median(self.step_seconds),
                "counters": median_counters(self.step_counters)}


def run_once(workload, model: torch.nn.Module, device: str, counters: Counters) -> RunStats:
    """Run ``workload`` with ``model`` (already on ``device``); the result is back on the CPU when it returns."""
    if isinstance(workload, models.GPT2):
        snapshots = []
        measured = timed(lambda: workload.run(model, device, hook=lambda step: snapshots.append(counters.snapshot())),
                         counters)
        steps = [counter_delta(a, b) for a, b in zip(snapshots, snapshots[1:])]
        return RunStats(measured.result, measured.seconds, measured.counters,
                        workload.recorders[-1].step_seconds(), steps)
    measured = timed(lambda: workload.run(model, device), counters)
    return RunStats(measured.result, measured.seconds, measured.counters)


def merge(runs: list[RunStats]) -> RunStats:
    """Rounds of one side as one report: the first run's result, the median seconds and
    counters, and every round's decode steps (so a step's median is over all rounds)."""
    return RunStats(runs[0].result, median([r.seconds for r in runs]), median_counters([r.counters for r in runs]),
                    [s for r in runs for s in r.step_seconds], [c for r in runs for c in r.step_counters])


def upload(workload, device: str, counters: Counters):
    """The model moved to ``device`` (a copy; the CPU model stays) and that move measured."""
    measured = timed(lambda: models.to_device(workload.model, device), counters)
    return measured.result, measured


# --------------------------------------------------------------------------------------------
# Checks: the device result against the local one

MINILM_MIN_COSINE = 0.9999


@dataclass
class Check:
    passed: bool
    summary: str                                   # one line for the report table
    lines: list = field(default_factory=list)      # details printed under the table
    details: dict = field(default_factory=dict)    # for --json


def check(workload, local: torch.Tensor, device: torch.Tensor) -> Check:
    if isinstance(workload, models.MiniLM):
        return check_minilm(workload, local, device)
    if isinstance(workload, models.GPT2):
        return check_gpt2(workload, local, device)
    return check_resnet50(workload, local, device)


def check_minilm(workload: models.MiniLM, local: torch.Tensor, device: torch.Tensor) -> Check:
    """Cosine similarity of each sentence's local and device embedding ≥ 0.9999; the 3 closest pairs."""
    local, device = local.float(), device.float()
    cosine = torch.nn.functional.cosine_similarity(local, device, dim=1)
    passed = bool(local.shape == device.shape and torch.isfinite(device).all() and (cosine >= MINILM_MIN_COSINE).all())
    sentences = workload.sentences
    lines = [f"minilm: cosine(local, device) per sentence: min {cosine.min().item():.7f} over {len(sentences)}"]
    for i in torch.nonzero(cosine < MINILM_MIN_COSINE).flatten().tolist():
        lines.append(f"  below {MINILM_MIN_COSINE}: {cosine[i].item():.7f}  {sentences[i]!r}")
    pairs = closest_pairs(device, 3)
    lines.append("minilm: most similar sentence pairs (device embeddings):")
    for score, i, j in pairs:
        lines.append(f"  {score:.3f}  {sentences[i]!r}  ~  {sentences[j]!r}")
    return Check(passed, f"min cos {cosine.min().item():.6f}", lines,
                 {"min_cosine": cosine.min().item(), "cosine": cosine.tolist(),
                  "closest_pairs": [{"score": s, "a": sentences[i], "b": sentences[j]} for s, i, j in pairs]})


def closest_pairs(embeddings: torch.Tensor, k: int) -> list:
    """The ``k`` most similar pairs (i < j) of L2-normalized rows: [(cosine, i, j)], best first."""
    similarity = embeddings @ embeddings.T
    n = similarity.shape[0]
    i, j = torch.triu_indices(n, n, offset=1)
    scores = similarity[i, j]
    best = scores.topk(min(k, scores.numel())).indices
    return [(scores[b].item(), i[b].item(), j[b].item()) for b in best]


def check_gpt2(workload: models.GPT2, local: torch.Tensor, device: torch.Tensor) -> Check:
    """Greedy token ids identical; on a difference, the local top-1/top-2 logit margin where it starts."""
    passed = local.shape == device.shape and torch.equal(local, device)
    lines = [f"gpt2: {local.shape[1]} new tokens, local {'==' if passed else '!='} device"]
    details = {"local_ids": local[0].tolist(), "device_ids": device[0].tolist()}
    if not passed:
        n = min(local.shape[1], device.shape[1])
        differs = (local[0, :n] != device[0, :n]).nonzero().flatten().tolist()
        first = differs[0] if differs else n
        margins = models.gpt2_margins(workload.model, workload.prompt, local)
        margin = margins[first].item() if first < margins.numel() else float("nan")
        lines.append(f"  first difference at step {first}: local {local[0, first:first + 4].tolist()} "
                     f"device {device[0, first:first + 4].tolist()}; local top-1 minus top-2 logit there: {margin:.4g}")
        details.update(first_difference=first, margin_at_first_difference=margin)
    else:
        lines.append(f"  ids: {local[0].tolist()}")
    return Check(passed, "ids equal" if passed else "ids differ", lines, details)


def check_resnet50(workload: models.ResNet50, local: torch.Tensor, device: torch.Tensor) -> Check:
    """Top-5 classes identical (and in the same order) for every image."""
    local, device = local.float(), device.float()
    top_local, top_device = local.topk(5, dim=1).indices, device.topk(5, dim=1).indices
    same = (top_local == top_device).all(dim=1)
    passed = bool(local.shape == device.shape and same.all())
    max_diff = (local - device).abs().max().item() if local.shape == device.shape else float("nan")
    categories = models.imagenet_categories()
    lines = [f"resnet50: top-5 per image, max |logit difference| {max_diff:.3g} (random weights: classes are arbitrary)"]
    for k, photo in enumerate(workload.photos):
        names = ", ".join(categories[c] for c in top_device[k].tolist())
        mark = "" if same[k] else f"   DIFFERS from local: {top_local[k].tolist()}"
        lines.append(f"  {photo:<22} {names}{mark}")
    return Check(passed, f"top-5 equal {int(same.sum())}/{len(same)}", lines,
                 {"max_abs_logit_diff": max_diff, "local_top5": top_local.tolist(), "device_top5": top_device.tolist()})
