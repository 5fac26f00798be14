"""The autotune driver (:func:`drive`) and the tuning-cache half every backend's ``autotune`` runs.

**The driver.** :func:`drive` ``(plan, budget_s)`` autotunes any plan of the contract
(:class:`rawconv.core.backend.Plan`) that also offers the timing hook of :class:`Tunable`
(``time_candidate``): the backend supplies the candidates and the timing, the driver is the
policy (the tuning cache first, the order, the check of each candidate against float64, the
budget, the confirmation of the close contenders, the selection of the winner and its tuning
record). A registered backend whose plans offer the hook is autotuned by it in
:func:`rawconv.nn.convert` (``autotune=``) and the operators (``choice="fastest"``) without
rawconv knowing the backend.

The built-in backends' ``autotune`` keep their own searches for now (timing loops differ:
oneDNN's CPU timer and isolation, cuDNN's ``cudnnFind``, the graph API's budgeted search) and call:

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
import threading
import time
from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

from . import tuning
from .errors import ArgumentError, ArgumentTypeError, NotSupportedError

__all__ = ["wanted", "cached", "keep", "hit_times", "check_budget", "Budget", "Timing", "Tunable", "drive",
           "CLOSE", "CONFIRM_ROUNDS"]

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


# ---------------------------------------------------------------------------- the driver
class Timing(NamedTuple):
    """What a plan's timing hook measured for one candidate: milliseconds per call (the median and
    the fastest of ``runs`` timed calls)."""

    median_ms: float
    min_ms: float
    runs: int


@runtime_checkable
class Tunable(Protocol):
    """What :func:`drive` needs of a plan beyond the contract (:class:`rawconv.core.backend.Plan`:
    ``problem``, ``direction``, ``candidates()``, ``select(choice=)``, ``execute()``,
    ``tuning_key()``): the backend's timing of one candidate."""

    def time_candidate(self, candidate: Any, call: dict, *, budget_s: float | None) -> Timing:
        """Time ``candidate`` (already selected on the plan by the driver, its first call made and
        checked) on the keyword arguments ``call`` of ``execute`` (``x``, ``w``, ``bias``,
        ``grad_y`` as the direction takes them), spending about ``budget_s`` seconds (None: the
        backend's own count of calls; at least one timed call). Returns a :class:`Timing`; raises
        :class:`NotSupportedError` when the candidate cannot run."""


#: the confirmation: the contenders within this factor of the fastest first time (at most 4) ...
CLOSE = 1.15
#: ... are timed again this many rounds, interleaved, and ranked by their best round's median
CONFIRM_ROUNDS = 2


def _example_call(problem: Any, direction: str, seed: int = 0) -> tuple[dict, dict]:
    """``(call, roles)``: random tensors of ``problem`` as ``execute``'s keyword arguments for
    ``direction`` and as :func:`rawconv.core.check.reference`'s roles (x, w, b, dy)."""
    from .problem import random_tensor, seed_offset

    x, w, b = problem.make_inputs(seed=seed)
    dy = random_tensor(problem.y_shape, seed_offset(seed, 3), x.device, x.dtype, problem.layout)
    if direction == "forward":
        return {"x": x, "w": w, "bias": b}, {"x": x, "w": w, **({"b": b} if b is not None else {})}
    if direction == "backward_data":
        return {"grad_y": dy, "w": w}, {"dy": dy, "w": w}
    return {"x": x, "grad_y": dy}, {"x": x, "dy": dy}


def _row(c: Any, plan: Any, status: str = "ok", message: str = "", **kw):
    from .results import Result

    return Result(backend=getattr(c, "backend", ""), name=c.choice, problem=plan.problem, direction=plan.direction,
                  candidate=c, status=status, workspace_bytes=getattr(c, "workspace_bytes", None), message=message,
                  detail=" ".join(getattr(c, "notes", ()) or ()), **kw)


def drive(plan: Any, budget_s: float | None = None, *, use_cache: bool | None = None, check: bool = True,
          progress: bool | None = None) -> Any:
    """Autotune ``plan`` (:class:`rawconv.core.backend.Plan` with :class:`Tunable`'s hook) and
    select the winner on it.

    ``budget_s``: seconds of wall time for the whole search of this problem and direction
    (:func:`check_budget`; None: no limit): every candidate still gets its checked first call and
    one timing (its hook gets an even share of 70% of what is left), the confirmation the rest.
    The policy: the tuning cache first (``use_cache``, :func:`wanted`: a hit whose choice still
    selects is selected with nothing timed, one row of phase ``"cache"``); then each candidate of
    ``plan.candidates()`` in the backend's order (known-bad ones skipped) is selected, run once on
    random tensors of the problem and checked against float64 (:func:`rawconv.core.check.reference`,
    :func:`rawconv.core.check.tolerance_for`; ``check=False`` skips the check), a wrong one kept as
    a ``"wrong"`` row and never selected; the correct ones are timed by ``plan.time_candidate``; the
    contenders within :data:`CLOSE` of the fastest (at most 4) are timed again
    :data:`CONFIRM_ROUNDS` more rounds, interleaved, and ranked by their best round's median;
    the winner is selected (``plan.select(choice=...)``) and its
    :class:`~rawconv.core.tuning.TuningRecord` (the confirmation rounds' median: no winner's
    curse) stored in the tuning cache and set as ``plan.tuning_record`` (:func:`keep`).

    Returns a :class:`~rawconv.core.results.ResultTable`: the correct rows fastest first, then the
    wrong ones, then those not timed (``status`` says why). Raises :class:`NotSupportedError` when
    no candidate ran correctly (the plan then runs what it ran before), :class:`ArgumentTypeError`
    for a plan without the hook."""
    from . import progress as _progress
    from .results import ResultTable

    check_budget(budget_s)
    if not isinstance(plan, Tunable):
        raise ArgumentTypeError(f"drive needs a plan with time_candidate(candidate, call, budget_s=) "
                                f"(rawconv.core.autotune.Tunable), got {type(plan).__name__}")
    for name, v in (("check", check), ("use_cache", use_cache)):
        if v is not None and not isinstance(v, bool):
            raise ArgumentTypeError(f"{name} must be True or False, got {v!r}")
    _progress.enabled(progress)   # validates
    key = plan.tuning_key()
    title = f"autotune: {plan.direction} {plan.problem}"
    hit = cached(plan, key, use_cache, lambda rec: ResultTable(
        [_row(plan.select(choice=rec.choice), plan, phase="cache", median_ms=hit_times(rec)[0],
              min_ms=hit_times(rec)[1], message=f"from the tuning cache (recorded {rec.created})")], title=title))
    if hit is not None:
        return hit
    budget = Budget(budget_s)
    with _lock_of(plan):   # one search of a plan at a time: a search selects each candidate in turn
        before = plan.selected
        try:
            rows, wrong, skipped = _search(plan, budget, check, progress)
        except BaseException:
            if before is not None:   # interrupted or nothing ran: the plan runs what it ran before
                plan.select(choice=before.choice)
            raise
        win = rows[0]
        plan.select(choice=win.name)
    table = ResultTable(rows + sorted(wrong, key=lambda r: r.name) + skipped, title=title)
    conf = win.extra.get("confirmed_ms")
    med = sorted(conf)[len(conf) // 2] if conf else win.median_ms
    record = tuning.TuningRecord(key, win.name, {"driver": "rawconv.core.autotune.drive",
                                                 "rounds": 1 + len(conf or ()),
                                                 "budget_s": budget_s if budget_s != math.inf else None},
                                 plan.problem.layout, med, win.min_ms, win.accuracy,
                                 label=getattr(plan.problem, "name", "") or "")
    return keep(plan, table, record)


_LOCKS_LOCK = threading.Lock()


def _lock_of(plan: Any):
    """The lock :func:`drive` holds on ``plan`` for its search (made on first use, kept on the plan;
    one process-wide lock for a plan that takes no attribute)."""
    lock = getattr(plan, "_rawconv_drive_lock", None)
    if lock is None:
        with _LOCKS_LOCK:
            lock = getattr(plan, "_rawconv_drive_lock", None)
            if lock is None:
                lock = threading.RLock()
                try:
                    plan._rawconv_drive_lock = lock
                except AttributeError:   # (__slots__)
                    lock = _LOCKS_LOCK_ANY
    return lock


_LOCKS_LOCK_ANY = threading.RLock()


def _timed(plan: Any, candidate: Any, call: dict, budget_s: float | None) -> Timing:
    """``plan.time_candidate``'s result, checked: finite, non-negative milliseconds and a count."""
    t = plan.time_candidate(candidate, call, budget_s=budget_s)
    try:
        med, mn, runs = float(t.median_ms), float(t.min_ms), int(t.runs)
    except (AttributeError, TypeError, ValueError):
        raise ArgumentTypeError(f"{type(plan).__name__}.time_candidate must return a Timing "
                                f"(median_ms, min_ms, runs), got {t!r}") from None
    if not (0 <= mn <= med < math.inf) or runs < 1:
        raise ArgumentError(f"{type(plan).__name__}.time_candidate returned an impossible timing for "
                            f"{getattr(candidate, 'choice', candidate)!r}: {t!r} (finite ms, min <= median, runs >= 1)")
    return Timing(med, mn, runs)


def _search(plan: Any, budget: Budget, check: bool, progress: Any) -> tuple[list, list, list]:
    """:func:`drive`'s search: ``(rows, wrong, skipped)``, the correct rows ranked."""
    from . import progress as _progress
    from .check import check as _check, reference, tolerance_for

    cands = list(plan.candidates())
    call, roles = _example_call(plan.problem, plan.direction)
    ref = ref_abs = tol = None
    if check and not plan.problem.is_empty:
        ref, ref_abs = reference(plan.problem, plan.direction, roles)
        tol = tolerance_for(plan.problem, plan.direction)
    rows, wrong, skipped = [], [], []
    with _progress.bar(progress, total=len(cands), desc="autotune", unit="candidate") as bar:
        for k, c in enumerate(cands):
            bar.note(c.choice)
            try:
                if getattr(c, "known_bad", ""):
                    skipped.append(_row(c, plan, "known bad", c.known_bad))
                    continue
                t0 = time.perf_counter()
                try:
                    plan.select(choice=c.choice)
                    y = plan.execute(**call)
                    err = None if ref is None else _check(plan.problem, y[0] if isinstance(y, tuple) else y,
                                                          ref, ref_abs, tol)
                    if err is not None and not err.ok:
                        wrong.append(_row(c, plan, "wrong", f"outside tolerance vs float64: max rel err "
                                                            f"{err.max_rel:.2e}", accuracy=err))
                        continue
                    t = _timed(plan, c, call, budget.share(len(cands) - k, 0.7))
                except NotSupportedError as exc:
                    skipped.append(_row(c, plan, "not supported", str(exc)))
                    continue
                rows.append(_row(c, plan, median_ms=t.median_ms, min_ms=t.min_ms, runs=t.runs, accuracy=err,
                                 phase="timed", seconds=time.perf_counter() - t0))
            finally:
                bar.update()
    if not rows:
        why = "; ".join(f"{r.name}: {r.status}" for r in wrong + skipped)
        raise NotSupportedError(f"no candidate could be timed correctly for {plan.problem.describe()}"
                                + (f" ({why})" if why else ""))
    rows.sort(key=lambda r: r.median_ms)
    close = [r for r in rows[:4] if r.median_ms <= rows[0].median_ms * CLOSE]
    if len(close) > 1:   # the confirmation: round after round, interleaved, the best round ranks
        for rnd in range(CONFIRM_ROUNDS):
            for r in close:
                plan.select(choice=r.name)
                t = _timed(plan, r.candidate, call, budget.share(len(close) * (CONFIRM_ROUNDS - rnd)))
                r.extra.setdefault("confirmed_ms", []).append(t.median_ms)
                r.median_ms, r.min_ms, r.runs = min(r.median_ms, t.median_ms), min(r.min_ms, t.min_ms), r.runs + t.runs
                r.phase = "confirmed"
        rows.sort(key=lambda r: r.median_ms)
    return rows, wrong, skipped
