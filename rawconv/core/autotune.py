"""The one autotune driver of the three backends: the tuning-cache half that every plan's
``autotune`` shared as three copies (look the key up, select a hit as a one-row table, store the
choice's record and hang it on the plan and the table).

A backend's ``autotune`` keeps its own search (timing loops differ: oneDNN's CPU timer and
isolation, cuDNN's ``cudnnFind``, the graph API's budgeted search) and calls:

* :func:`cached` first: the table of a tuning-cache hit for its key, or None (search);
* :func:`keep` last: the record of the search's choice, stored and attached; returns the table.

**The budget.** ``budget_s`` has one meaning in every autotuner and in ``convert``: seconds of wall
time for one problem and direction (the whole search: checks, timing rounds, confirmation), checked
by :func:`check_budget` and spent through a :class:`Budget`. Every candidate still gets its checked
first call and at least one timed call, so a budget shorter than those calls is overrun (see
docs/guides/tuning.md).

Nothing here names a backend.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable

from . import tuning
from .errors import ArgumentError, ArgumentTypeError, NotSupportedError

__all__ = ["wanted", "cached", "keep", "hit_times", "check_budget", "Budget"]

log = logging.getLogger("rawconv.tuning")


def wanted(use_cache: Any, *, file_default: bool = True) -> bool:
    """Whether an autotune reads the tuning cache: ``use_cache`` True; None (automatic): when a
    cache file is configured (:func:`rawconv.tuning.cache_file`), unless ``file_default`` is False
    (then None reads nothing)."""
    return bool(use_cache or (use_cache is None and file_default and tuning.cache_file()))


def cached(plan: Any, key: tuning.TuningKey, use_cache: Any, from_hit: Callable, *, file_default: bool = True):
    """The autotune table of the tuning cache's record for ``key`` (``from_hit(record)`` selects its
    choice on ``plan`` and returns a one-row table), with the record on ``plan.tuning_record`` and
    the table's ``record``; None when the cache is not read (:func:`wanted`), holds no record for
    ``key``, or the record's choice no longer selects (``from_hit`` raised
    :class:`NotSupportedError` / :class:`ArgumentError`, or returned None): the caller searches."""
    if not wanted(use_cache, file_default=file_default):
        return None
    hit = tuning.cache().get(key)
    if hit is None:
        return None
    try:
        table = from_hit(hit)
    except (NotSupportedError, ArgumentError) as exc:
        log.debug("tuning cache: %s no longer selects (%s): searching", hit.choice, exc)
        return None
    if table is not None:
        plan.tuning_record = table.record = hit
    return table


def keep(plan: Any, table: Any, record: tuning.TuningRecord):
    """Store autotune's ``record`` in the process's tuning cache (and its file, when one is
    configured), set it as ``plan.tuning_record`` and ``table.record``; return ``table``."""
    tuning.cache().put(record)
    plan.tuning_record = table.record = record
    return table


def hit_times(hit: tuning.TuningRecord) -> tuple[float, float]:
    """A record's (median, min) milliseconds, NaN where it holds none (a cache row's times)."""
    return (hit.median_ms if hit.median_ms is not None else math.nan,
            hit.min_ms if hit.min_ms is not None else math.nan)


def check_budget(budget_s: Any, name: str = "budget_s", *, none_ok: bool = True) -> float | None:
    """The one check of an autotune budget (seconds of wall time for one problem and direction): a
    positive int or float, or None where ``none_ok`` (the caller's default applies). Returns it;
    raises :class:`ArgumentTypeError` for another type and :class:`ArgumentError` for a value
    that is not positive (NaN included), naming ``name``."""
    if budget_s is None and none_ok:
        return None
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)):
        raise ArgumentTypeError(f"{name} must be a positive number of seconds (wall time per problem and direction)"
                                f"{' or None' if none_ok else ''}, got {budget_s!r}")
    if not budget_s > 0:
        raise ArgumentError(f"{name} must be a positive number of seconds (wall time per problem and direction), "
                            f"got {budget_s!r}")
    return budget_s


class Budget:
    """An autotune's budget being spent: ``seconds`` of wall time (None: no limit) from when it
    was made (``time.perf_counter``)."""

    def __init__(self, seconds: float | None):
        self.seconds = check_budget(seconds)
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float | None:
        """Seconds left (0 when spent; None: no limit)."""
        return None if self.seconds is None else max(0.0, self.seconds - self.elapsed())

    def share(self, n: int, fraction: float = 1.0, floor: float = 1e-3) -> float | None:
        """Seconds one of ``n`` candidates still to time may spend: ``fraction`` of what is left,
        split evenly, at least ``floor`` (each candidate still gets its timed calls' minimum);
        None without a limit."""
        left = self.left()
        if left is None:
            return None
        return max(floor, left * fraction / max(1, n))
