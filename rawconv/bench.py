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


def geomean(values) -> float:
    """Geometric mean of positive values."""
    import math

    vals = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else float("nan")
