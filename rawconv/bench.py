"""Timers shared by autotune and compare, so that every number in a table means the same thing.

* :func:`time_cpu`: ``time.perf_counter`` around each call, after warm-up; median and min (ms).
* :func:`time_cuda`: CUDA events around each call on the current stream, after warm-up.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class TimeStats:
    """Times of repeated calls, in milliseconds."""

    median_ms: float
    min_ms: float
    mean_ms: float
    runs: int

    def __str__(self) -> str:
        return f"median {self.median_ms:.4f} ms, min {self.min_ms:.4f} ms over {self.runs} runs"


def _stats(times_s: list[float]) -> TimeStats:
    ms = [t * 1e3 for t in times_s]
    return TimeStats(statistics.median(ms), min(ms), statistics.fmean(ms), len(ms))


def time_cpu(fn: Callable[[], object], iterations: int = 10, warmup: int = 2,
             budget_s: float | None = None) -> TimeStats:
    """Call ``fn`` ``warmup`` times, then time ``iterations`` calls one by one with
    ``time.perf_counter``. With ``budget_s``, stop early once that many seconds were spent
    timing (at least one timed call is always made). Returns :class:`TimeStats` in ms."""
    if iterations < 1:
        raise ValueError("iterations must be >= 1")
    start = time.perf_counter()
    for _ in range(max(warmup, 0)):
        fn()
        if budget_s is not None and time.perf_counter() - start > budget_s:
            break
    times = []
    t_begin = time.perf_counter()
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if budget_s is not None and time.perf_counter() - t_begin > budget_s:
            break
    return _stats(times)


def time_cuda(fn: Callable[[], object], iterations: int = 20, warmup: int = 3,
              budget_s: float | None = None) -> TimeStats:
    """Time ``fn`` with CUDA events on the current stream: ``warmup`` calls, then
    ``iterations`` calls each between a pair of events; median and min of the elapsed times (ms).
    With ``budget_s``, stop early once that many seconds of wall time were spent."""
    import torch

    if iterations < 1:
        raise ValueError("iterations must be >= 1")
    for _ in range(max(warmup, 0)):
        fn()
    torch.cuda.synchronize()
    events = []
    t_begin = time.perf_counter()
    for _ in range(iterations):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        events.append((a, b))
        if budget_s is not None and time.perf_counter() - t_begin > budget_s:
            break
    torch.cuda.synchronize()
    return _stats([a.elapsed_time(b) / 1e3 for a, b in events])


def time_cuda_queued(fn: Callable[[], object], iterations: int = 20, warmup: int = 3,
                     repeats: int = 3) -> TimeStats:
    """GPU time per call of ``fn`` (ms), free of host gaps: the GPU is held busy
    (``torch.cuda._sleep``) while ``iterations`` calls are queued, and CUDA events around the
    queued calls time only the GPU work. Returns :class:`TimeStats` over ``repeats`` loops (each
    value a per-call mean over the loop). Use it to compare kernels whose host cost per call
    exceeds their GPU time (small problems; cuDNN's legacy entry points): per-call event pairs
    would time the host instead."""
    import torch

    if iterations < 1:
        raise ValueError("iterations must be >= 1")
    t0 = time.perf_counter()
    for _ in range(max(warmup, 1)):
        fn()
    host = (time.perf_counter() - t0) / max(warmup, 1)
    torch.cuda.synchronize()
    cycles = int(min(max(4 * host * iterations * 2e9, 5e5), 2e9))   # ~2 GHz: 4x the host time of the loop
    per = []
    for _ in range(repeats):
        torch.cuda._sleep(cycles)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iterations):
            fn()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) / iterations)
    per.sort()
    return TimeStats(per[len(per) // 2], per[0], sum(per) / len(per), len(per) * iterations)


def wall_us_per_call(fn: Callable[[], object], calls: int = 2000, repeats: int = 5, warmup: int = 100) -> float:
    """Microseconds per call of ``fn``: ``warmup`` calls, then the best of ``repeats`` loops of
    ``calls`` back-to-back calls with one ``torch.cuda.synchronize`` at the end of each (bounded
    by the slower of host and GPU; for a tiny problem, the host's cost per call)."""
    import torch

    for _ in range(max(warmup, 0)):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def geomean(values) -> float:
    """Geometric mean of positive values."""
    import math

    vals = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else float("nan")
