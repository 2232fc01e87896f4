"""Measuring the cost model's inputs: a device's compute rate and memory bandwidth, a link's
latency and bandwidth (genie.scheduler.cluster's NodeSpec and Link).

- `calibrate_node(device)`: times chains of 1 and `chain` float32 matmuls (n x n) and of
  copies of `copy_bytes` on a torch device; the rate is the slope between the two chain
  lengths, so a fixed cost per measurement (a lazy device's round trip, a kernel launch)
  cancels. Copy bandwidth counts the bytes read and written (STREAM's "Copy" convention:
  J. D. McCalpin, "Memory bandwidth and machine balance in current high performance
  computers", IEEE TCCA Newsletter, 1995).
- `calibrate_link(send_fn, sizes)`: fits the Hockney model t = alpha + n / beta (R. W.
  Hockney, Parallel Computing 20(3), 1994) to the best-of times of `send_fn(n)` by least
  squares: alpha is the latency (s), beta the bandwidth (B/s).

The timing code is device-generic: `sync(tensor)` must return only once the work producing
`tensor` is done. The default does nothing on "cpu" (eager) and elsewhere reads one element
back to the host, which forces a lazy device (remote_accelerator) to run what is pending;
`torch.remote_accelerator.synchronize` or `torch.cuda.synchronize` can be passed instead.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

from .cluster import NodeSpec


def default_sync(device) -> Callable:
    """A no-op for "cpu"; otherwise a callback reading one element of its tensor to the host."""
    if str(device) == "cpu":
        return lambda tensor: None
    return lambda tensor: tensor.reshape(-1)[:1].cpu()


def calibrate_node(device="cpu", *, sync: Callable | None = None, matmul_n: int = 1024, copy_bytes: int = 64 << 20,
                   chain: int = 4, repeats: int = 3,
                   clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """(flops_per_s (FLOP/s), bytes_per_s (B/s)) of `device` (a torch.device or its string).

    FLOP/s: 2 * matmul_n**3 FLOP per float32 matmul, from the best of `repeats` timings of
    chains of 1 and of `chain` dependent matmuls (written alternately into two buffers: the
    device holds four matmul_n^2 tensors whatever the chain). B/s: 2 * copy_bytes per copy of a float32
    buffer of `copy_bytes`, likewise. Raises ValueError for chain < 2 or repeats < 1, and
    RuntimeError when a longer chain never takes longer (a `sync` that does not wait).
    """
    import torch

    if chain < 2 or repeats < 1:
        raise ValueError("chain must be at least 2 and repeats at least 1")
    device = torch.device(device)
    sync = sync or default_sync(device)
    a = torch.randn(matmul_n, matmul_n, device=device)
    b = torch.randn(matmul_n, matmul_n, device=device) / matmul_n ** 0.5  # keeps the chain's values bounded

    outs = (torch.empty_like(a), torch.empty_like(a))  # a chain alternates two results: memory stays 4 n^2

    def matmuls(k):
        c = a
        for i in range(k):
            c = torch.mm(c, b, out=outs[i % 2])
        sync(c)

    src = torch.empty(copy_bytes // 4, device=device).fill_(1.0)
    dst = torch.empty_like(src)

    def copies(k):
        for _ in range(k):
            dst.copy_(src)
        sync(dst)

    flops = _rate(matmuls, 2.0 * matmul_n ** 3, chain, repeats, clock)
    bandwidth = _rate(copies, 2.0 * (copy_bytes // 4) * 4, chain, repeats, clock)
    return flops, bandwidth


_CLEAR = 0.25  # how much longer than one run a chain's best time must be for its slope to count


def _rate(run: Callable[[int], None], work: float, chain: int, repeats: int, clock, rounds: int = 4,
          longer: int = 2) -> float:
    """Work per second from the slope between chains of 1 and `chain` runs (best times).
    The slope is taken once the longer chain's best time exceeds the short one's by more than
    `_CLEAR` of it: a difference within a round trip's jitter (small work, a noisy machine)
    would give any rate, up to absurd ones. Until then, up to `rounds` rounds of `repeats` more
    timings each are taken, keeping the best, and then, `longer` times, the same with a chain 4
    times longer. The last chain's slope is returned if it is longer at all; only a chain that
    never takes longer than one, however long, raises."""
    run(1)  # warm-up: allocation, first-call costs, a lazy graph's registration
    one = float("inf")
    for attempt in range(longer + 1):
        many = float("inf")
        run(chain)  # warm-up of this chain length (a lazy device registers its graph)
        for _ in range(rounds):
            one = min(one, _best(lambda: run(1), repeats, clock))
            many = min(many, _best(lambda: run(chain), repeats, clock))
            if many > one * (1 + _CLEAR):
                return work * (chain - 1) / (many - one)
        if attempt < longer:
            chain *= 4
    if many > one:
        return work * (chain - 1) / (many - one)
    raise RuntimeError(f"a chain of {chain} took {many:.3g} s, not longer than one ({one:.3g} s), in "
                       f"{rounds * repeats} timings of each: does sync wait for the work?")



def _best(fn: Callable[[], None], repeats: int, clock) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def calibrate_link(send_fn: Callable[[int], object], sizes: Sequence[int] = (1 << 10, 1 << 16, 1 << 20, 1 << 24), *,
                   repeats: int = 3, clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """(latency_s (s), bytes_per_s (B/s)) of a link, from timing `send_fn(n)` for each n in
    `sizes` (B; best of `repeats`) and fitting t = latency_s + n / bytes_per_s by least
    squares (a negative intercept is taken as 0). `send_fn` must return once n bytes have
    arrived. Raises ValueError for fewer than two distinct sizes or when the time does not
    grow with the size.
    """
    if len(set(sizes)) < 2 or repeats < 1:
        raise ValueError("calibrate_link needs at least two distinct sizes and repeats >= 1")
    times = [_best(lambda n=n: send_fn(n), repeats, clock) for n in sizes]
    alpha, slope = fit_hockney(list(sizes), times)
    return alpha, 1.0 / slope


def fit_hockney(sizes: Sequence[int], times: Sequence[float]) -> tuple[float, float]:
    """Least-squares (alpha (s), seconds per byte) of t = alpha + n * slope; alpha >= 0.
    Raises ValueError when the slope is not positive."""
    n = len(sizes)
    mean_x, mean_t = sum(sizes) / n, sum(times) / n
    sxx = sum((x - mean_x) ** 2 for x in sizes)
    sxt = sum((x - mean_x) * (t - mean_t) for x, t in zip(sizes, times))
    slope = sxt / sxx if sxx else 0.0
    if not slope > 0:
        raise ValueError(f"transfer times {list(times)} do not grow with the sizes {list(sizes)}")
    return max(0.0, mean_t - slope * mean_x), slope


def measure_node(name: str, device, memory_limit: int, memory_free: int, *, device_kind: str | None = None,
                 resident=frozenset(), **calibrate_kwargs) -> NodeSpec:
    """A NodeSpec for `device` with its rates measured by `calibrate_node` (memory in B).
    `device_kind`: "cpu" or "cuda", the node's own device (for a remote_accelerator, what
    torch.remote_accelerator.get_device_name reports); default: from the device's type."""
    flops, bandwidth = calibrate_node(device, **calibrate_kwargs)
    kind = device_kind or ("cuda" if str(device).startswith("cuda") else "cpu")
    return NodeSpec(name, kind, memory_limit, memory_free, flops, bandwidth, frozenset(resident))
