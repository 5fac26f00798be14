"""The autotune driver (:func:`drive`) and the tuning-cache half every backend's ``autotune`` runs.

**The driver.** :func:`drive` ``(plan, budget_s, search=)`` autotunes any plan of the contract
(:class:`rawconv.core.backend.Plan`): the backend supplies the candidates, the tensors and the
timing (a :class:`Search`; its defaults serve a plan offering :class:`Tunable`'s hook,
``time_candidate``), the driver is the policy (the tuning cache first, the order, the check of
each candidate against float64, the budget's shares, the confirmation of the close contenders,
the ranking, the previous selection kept on failure or interrupt, the selection of the winner and
its tuning record). oneDNN's ``Convolution.autotune`` runs it (timing in interleaved rounds, or one
candidate at a time in a child process); a registered backend whose plans offer the hook is
autotuned by it in :func:`rawconv.nn.convert` (``autotune=``) and the operators
(``choice="fastest"``) without rawconv knowing the backend.

cuDNN's autotunes keep their own searches for now (``cudnnFind``, the graph API's budgeted
search) and call:

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
from .errors import ArgumentError, ArgumentTypeError, NotSupportedError, RawconvError

__all__ = ["wanted", "cached", "keep", "hit_times", "check_budget", "Budget", "Timing", "Tunable", "Search",
           "CandidateFailed", "drive", "CLOSE", "CONFIRM_ROUNDS", "versus_torch", "SLOWER"]

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
    the fastest of ``runs`` timed calls), and ``extra``: the backend's own fields for the row's
    ``extra`` (e.g. the interleaved rounds' summary)."""

    median_ms: float
    min_ms: float
    runs: int
    extra: dict | None = None


class CandidateFailed(RawconvError):
    """Raised by a timing hook for a candidate that could not be timed for another reason than
    :class:`NotSupportedError` (e.g. it crashed, hung or gave a wrong result in an isolated child
    process): :func:`drive` gives it a row of ``status`` with ``detail`` and never selects it."""

    def __init__(self, status: str, detail: str = ""):
        super().__init__(f"{status}: {detail}" if detail else status)
        self.status, self.detail = status, detail


@runtime_checkable
class Tunable(Protocol):
    """What :func:`drive` needs of a plan beyond the contract (:class:`rawconv.core.backend.Plan`:
    ``problem``, ``direction``, ``candidates()``, ``select(choice=)``, ``execute()``,
    ``tuning_key()``) when no :class:`Search` is given: the backend's timing of one candidate."""

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


class Search:
    """The backend's half of one :func:`drive` search: the candidates, the tensors, selecting,
    running and timing one, the rows and the record's detail. :func:`drive` is the policy (the
    cache, the order, the checks, the budget's shares, the confirmation, the ranking, the restore
    on failure, the record); this class's defaults serve a plan of the contract with
    :class:`Tunable`'s hook (random tensors of the problem, ``select(choice=)``, ``execute``,
    ``time_candidate``), and a backend subclasses it for more (oneDNN: its own tensors and
    tolerance, interleaved rounds, a child process).

    Attributes read by the driver: ``together`` (False: each candidate timed alone by
    :meth:`time`, right after its check, and the close contenders re-ranked by their best of
    ``confirm_rounds`` more rounds; True: the checked candidates timed together in interleaved
    rounds by :meth:`time_together`, then the contenders within :data:`CLOSE` of the fastest (the
    fastest at least) timed together again for the record's time, the first ranking kept);
    ``time_wrong`` (a candidate outside tolerance is timed too: shown, never selected);
    ``first_call`` (the driver makes each candidate's first call here, checked against float64:
    False when :meth:`time` runs and checks it elsewhere, as in a child process);
    ``allow_known_bad`` (known-bad candidates are run); ``call`` / ``roles`` / ``tolerance`` (set
    by :meth:`open`: ``execute``'s keyword arguments, the float64 reference's inputs (None: not
    checked here) and the tolerance (None: :func:`rawconv.core.check.tolerance_for`))."""

    together = False
    time_wrong = False
    first_call = True
    allow_known_bad = False
    confirm_rounds = CONFIRM_ROUNDS
    noun = "candidate"
    name = "autotune"

    def __init__(self, plan: Any, check: bool = True):
        self.plan, self.check = plan, check
        self.call: dict = {}
        self.roles: dict | None = None
        self.tolerance: Any = None

    @property
    def title(self) -> str:
        return f"{self.name}: {self.plan.direction} {self.plan.problem}"

    def key(self) -> tuning.TuningKey:
        """The tuning key the search's record goes under."""
        return self.plan.tuning_key()

    def from_cache(self, record: tuning.TuningRecord):
        """``record``'s choice selected, as a one-row table (phase ``"cache"``); raises
        :class:`NotSupportedError` / :class:`ArgumentError` when it no longer selects."""
        from .results import ResultTable

        med, mn = hit_times(record)
        row = _row(self.plan.select(choice=record.choice), self.plan, phase="cache", median_ms=med, min_ms=mn,
                   message=f"from the tuning cache (recorded {record.created})")
        return ResultTable([row], title=self.title)

    def candidates(self) -> list:
        return list(self.plan.candidates())

    def selection(self) -> Any:
        """What the plan runs before the search (given back to :meth:`restore`)."""
        return self.plan.selected

    def restore(self, before: Any) -> None:
        """Make the plan run ``before`` (:meth:`selection`'s) again: the search failed or was interrupted."""
        if before is not None:
            self.plan.select(choice=before.choice)

    def open(self) -> None:
        """Make the search's tensors (:attr:`call`, :attr:`roles`)."""
        self.call, roles = _example_call(self.plan.problem, self.plan.direction)
        self.roles = roles if self.check else None

    def close(self) -> None:
        """Release what :meth:`open` made (after the search, whatever its end)."""

    def select(self, candidate: Any) -> None:
        self.plan.select(choice=candidate.choice)

    def run(self, candidate: Any) -> Any:
        """The selected ``candidate``'s first call (its result is checked)."""
        return self.plan.execute(**self.call)

    def time(self, candidate: Any, budget_s: float | None) -> Timing:
        """Time the selected ``candidate`` alone for about ``budget_s`` seconds (raises
        :class:`NotSupportedError` / :class:`CandidateFailed` when it cannot be timed)."""
        return self.plan.time_candidate(candidate, self.call, budget_s=budget_s)

    def time_together(self, candidates: list, budget_s: float | None, confirm: bool) -> list:
        """Time ``candidates`` together (interleaved rounds, each selected in turn), about
        ``budget_s`` seconds each: a :class:`Timing` per candidate, in order. ``confirm``: the
        confirmation (``candidates[0]`` is the pick). Needed where :attr:`together` is True."""
        raise NotImplementedError

    def finish(self, winner: Any) -> None:
        """Make the plan run the search's ``winner``."""
        self.select(winner)

    def row(self, candidate: Any, status: str = "ok", why: str = ""):
        """A row of the result table for ``candidate`` (the driver fills its times)."""
        return _row(candidate, self.plan, status, why)

    def detail(self, row: Any) -> dict:
        """The backend's part of the winner's record ``detail``."""
        return {}

    def warnings(self, rows: list) -> list[str]:
        """Why the timed ``rows`` (ranked) may not be trusted: each line is warned
        (:class:`rawconv.core.bench.TimingWarning`) and kept in the record's ``timing``."""
        return []


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
          progress: bool | None = None, search: Search | None = None) -> Any:
    """Autotune ``plan`` (:class:`rawconv.core.backend.Plan`) and select the winner on it.

    ``search``: the backend's half (:class:`Search`: candidates, tensors, selecting, running and
    timing one); None: the defaults, for a plan with :class:`Tunable`'s hook.

    ``budget_s``: seconds of wall time for the whole search of this problem and direction
    (:func:`check_budget`; None: no limit): every candidate still gets its checked first call and
    one timing (the first timing shares 70% of what is left evenly), the confirmation the rest.
    The policy: the tuning cache first (``use_cache``, :func:`wanted`: a hit whose choice still
    selects is selected with nothing timed, one row of phase ``"cache"``); then each candidate in
    the backend's order (known-bad ones skipped unless the search allows them) is selected, run
    once and checked against float64 (:func:`rawconv.core.check.reference`, the search's
    tolerance or :func:`rawconv.core.check.tolerance_for`; ``check=False`` skips the check), a
    wrong one kept as a ``"wrong"`` row and never selected; the correct ones are timed (alone,
    or together in interleaved rounds: see :class:`Search`); the contenders within :data:`CLOSE`
    of the fastest (at most 4) are timed again (alone: :attr:`Search.confirm_rounds` rounds,
    interleaved, ranked by their best round, one that fails now dropped; together: one fresh
    interleaved pass, the first ranking kept); the winner is selected and its
    :class:`~rawconv.core.tuning.TuningRecord` (the confirmation's median: no winner's curse;
    ``timing``: the search's timing warnings, each also warned as a
    :class:`rawconv.core.bench.TimingWarning`) stored in the tuning cache and set as
    ``plan.tuning_record`` (:func:`keep`). One search of a plan at a time (a lock kept on it);
    when the search fails or is interrupted (``KeyboardInterrupt`` included) the plan runs what it
    ran before.

    Returns a :class:`~rawconv.core.results.ResultTable`: the correct rows fastest first, then the
    wrong ones, then those not timed (``status`` says why). Raises :class:`NotSupportedError` when
    no candidate ran correctly (the plan then runs what it ran before), :class:`ArgumentTypeError`
    for a plan without the hook and no search."""
    import warnings

    from . import progress as _progress
    from .bench import TimingWarning
    from .guard import stacklevel
    from .results import ResultTable

    check_budget(budget_s)
    if search is None:
        if not isinstance(plan, Tunable):
            raise ArgumentTypeError(f"drive needs a plan with time_candidate(candidate, call, budget_s=) "
                                    f"(rawconv.core.autotune.Tunable), got {type(plan).__name__}")
        search = Search(plan, check)
    for name, v in (("check", check), ("use_cache", use_cache)):
        if v is not None and not isinstance(v, bool):
            raise ArgumentTypeError(f"{name} must be True or False, got {v!r}")
    _progress.enabled(progress)   # validates
    key = search.key()
    hit = cached(plan, key, use_cache, search.from_cache)
    if hit is not None:
        return hit
    budget = Budget(budget_s)
    with _lock_of(plan):   # one search of a plan at a time: a search selects each candidate in turn
        before = search.selection()
        try:
            try:
                search.open()
                rows, wrong, skipped = _search(search, budget, progress)
            finally:
                search.close()
        except BaseException:   # interrupted or nothing ran: the plan runs what it ran before
            search.restore(before)
            raise
        win = rows[0]
        search.finish(win.candidate)
    warned = search.warnings(rows)
    for line in warned:
        warnings.warn(f"{type(plan).__name__}.autotune: {line}", TimingWarning, stacklevel=stacklevel())
    wrong.sort(key=lambda r: (_ms_or_inf(r.median_ms), r.name))   # timed ones (Search.time_wrong) fastest first
    table = ResultTable(rows + wrong + skipped, title=search.title)
    conf = win.extra.get("confirmed_ms")
    med = sorted(conf)[len(conf) // 2] if conf else win.median_ms
    flags = list(win.timing_flags)
    timing = {"trustworthy": not warned and not flags, "run_trustworthy": not warned, "run_warnings": list(warned),
              "row_flags": flags}
    detail = {"driver": "rawconv.core.autotune.drive", "rounds": 1 + len(conf or ()),
              "budget_s": budget_s if budget_s != math.inf else None, **search.detail(win)}
    record = tuning.TuningRecord(key, win.name, detail, plan.problem.layout, med, win.min_ms, win.accuracy,
                                 label=getattr(plan.problem, "name", "") or "", timing=timing)
    return keep(plan, table, record)


def _ms_or_inf(ms: Any) -> float:
    return ms if isinstance(ms, float) and ms == ms else math.inf


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


def _checked(search: Search, candidate: Any, t: Any) -> Timing:
    """A timing hook's result ``t`` checked: finite, non-negative milliseconds and a count."""
    what = type(search.plan).__name__ + (".time_candidate" if type(search) is Search else f" ({type(search).__name__})")
    try:
        med, mn, runs = float(t.median_ms), float(t.min_ms), int(t.runs)
    except (AttributeError, TypeError, ValueError):
        raise ArgumentTypeError(f"{what} must return a Timing (median_ms, min_ms, runs), got {t!r}") from None
    if not (0 <= mn <= med < math.inf) or runs < 1:
        raise ArgumentError(f"{what} returned an impossible timing for {getattr(candidate, 'choice', candidate)!r}: "
                            f"{t!r} (finite ms, min <= median, runs >= 1)")
    return Timing(med, mn, runs, getattr(t, "extra", None))


def _timed_together(search: Search, rows: list, budget_s, confirm: bool) -> list:
    ts = search.time_together([r.candidate for r in rows], budget_s, confirm)
    if len(ts) != len(rows):
        raise ArgumentError(f"{type(search).__name__}.time_together returned {len(ts)} timings for {len(rows)} "
                            f"candidates")
    return [_checked(search, r.candidate, t) for r, t in zip(rows, ts)]


def _fill(r: Any, t: Timing, phase: str) -> None:
    r.median_ms, r.min_ms, r.runs, r.phase = t.median_ms, t.min_ms, t.runs, phase
    r.extra.update(t.extra or {})


def _failed_row(search: Search, c: Any, exc: Exception, prefix: str = ""):
    if isinstance(exc, CandidateFailed):
        return search.row(c, exc.status, prefix + exc.detail)
    return search.row(c, "not supported", prefix + str(exc))


def _search(search: Search, budget: Budget, progress: Any) -> tuple[list, list, list]:
    """:func:`drive`'s search: ``(rows, wrong, skipped)``, the correct rows ranked."""
    from . import progress as _progress
    from .check import check as _check, reference, tolerance_for

    plan = search.plan
    cands = search.candidates()
    ref = ref_abs = tol = None
    if search.roles is not None and search.first_call and not plan.problem.is_empty:
        ref, ref_abs = reference(plan.problem, plan.direction, search.roles)
        tol = search.tolerance if search.tolerance is not None else tolerance_for(plan.problem, plan.direction)
    rows, wrong, skipped = [], [], []
    with _progress.bar(progress, total=len(cands), desc=search.name, unit=search.noun) as bar:
        for k, c in enumerate(cands):
            bar.note(c.choice)
            try:
                if getattr(c, "known_bad", "") and not search.allow_known_bad:
                    skipped.append(search.row(c, "known bad", f"not run (allow_known_bad=True runs it): {c.known_bad}"))
                    continue
                t0 = time.perf_counter()
                err = None
                try:
                    search.select(c)
                    if search.first_call:
                        y = search.run(c)
                        if ref is not None:
                            err = _check(plan.problem, y[0] if isinstance(y, tuple) else y, ref, ref_abs, tol)
                    if err is not None and not err.ok:
                        row = search.row(c, "wrong", f"outside tolerance vs float64: max rel err {err.max_rel:.2e}, "
                                                     f"{err.ratio:.3g}x the tolerance"
                                                     + (f", {err.nan} non-finite" if err.nan else ""))
                        row.accuracy = err
                        wrong.append(row)
                        continue
                    t = None if search.together else _checked(search, c, search.time(c, budget.share(len(cands) - k, 0.7)))
                except (NotSupportedError, CandidateFailed) as exc:
                    skipped.append(_failed_row(search, c, exc))
                    continue
                row = search.row(c)
                row.accuracy = err
                if t is not None:
                    _fill(row, t, "timed")
                row.seconds = time.perf_counter() - t0
                rows.append(row)
            finally:
                bar.update()
        if search.together and rows:
            group = rows + (wrong if search.time_wrong else [])
            for r, t in zip(group, _timed_together(search, group, budget.share(len(group), 0.7), False)):
                _fill(r, t, "timed")
    if not rows:
        why = "; ".join(f"{r.name}: {r.status}" for r in wrong + skipped)
        raise NotSupportedError(f"no {search.noun} could be timed correctly for {plan.problem.describe()}"
                                + (f" ({why})" if why else ""))
    rows.sort(key=lambda r: r.median_ms)
    close = [r for r in rows[:4] if r.median_ms <= rows[0].median_ms * CLOSE]
    if search.together:   # the pick's (and its contenders') fresh time: the record's, no winner's curse
        for r, t in zip(close, _timed_together(search, close, budget.share(len(close)), True)):
            r.extra.setdefault("confirmed_ms", []).append(t.median_ms)
            r.extra.update(t.extra or {})
        return rows, wrong, skipped
    if len(close) > 1:   # the confirmation: round after round, interleaved, the best round ranks
        dead: set = set()
        rounds = search.confirm_rounds
        for rnd in range(rounds):
            for r in close:
                if id(r) in dead:
                    continue
                try:
                    search.select(r.candidate)
                    t = _checked(search, r.candidate, search.time(r.candidate, budget.share(len(close) * (rounds - rnd))))
                except (NotSupportedError, CandidateFailed) as exc:   # it ran before: say what it did now
                    dead.add(id(r))
                    skipped.append(_failed_row(search, r.candidate, exc, "when timed again: "))
                    continue
                r.extra.setdefault("confirmed_ms", []).append(t.median_ms)
                r.median_ms, r.min_ms, r.runs = min(r.median_ms, t.median_ms), min(r.min_ms, t.min_ms), r.runs + t.runs
                r.phase = "confirmed"
        rows = [r for r in rows if id(r) not in dead]
        if not rows:
            raise NotSupportedError(f"no {search.noun} could be timed for {plan.problem.describe()}")
        rows.sort(key=lambda r: r.median_ms)
    return rows, wrong, skipped


# ---------------------------------------------------------------------------- torch's own pick
#: rawconv's pick must measure within this factor of torch's own call, or torch's pick is tried
SLOWER = 1.03


def versus_torch(measure: Callable[[Any], tuple], choice: Any, alternatives: Any, *,
                 word: str = "choice", tries: int = 1) -> tuple[Any, dict]:
    """The one policy for torch's own pick as a candidate, on every device: ``(the choice to pin,
    the report's fields)``.

    ``measure(c)``: ``(torch_ms, rawconv_ms, vs_torch)`` of torch's own call against rawconv's call
    on choice ``c``, timed together (``vs_torch``: torch / rawconv, above 1 rawconv faster; None:
    not measurable); ``choice``: the search's winner; ``alternatives``: rawconv's choices that run
    what torch runs (its oneDNN implementation, its cuDNN engine), other than ``choice``;
    ``word``: what the report calls one (``"implementation"``, ``"engine"``); ``tries``: how many
    of the alternatives to measure, in their order (cuDNN: torch's engine under each knob setting
    its heuristics offer). ``choice`` is measured; when it measured more than :data:`SLOWER` slower
    than torch and there is an alternative, the first ``tries`` are measured the same way and the
    one that measured fastest (relative to torch's call in its own measurement) is pinned if it
    measured faster than ``choice``. The fields: ``torch_ms``, ``rawconv_ms``, ``vs_torch`` (of the
    pinned choice) and, when an alternative was tried, ``vs_torch_note`` (kept, no faster, or did
    not run: a :class:`RawconvError` or ``RuntimeError`` of its measurement; ``choice`` stays). An
    error measuring ``choice`` propagates."""
    t_ms, r_ms, v = measure(choice)
    out: dict = dict(torch_ms=t_ms, rawconv_ms=r_ms, vs_torch=v)
    alts = list(alternatives)[:max(1, int(tries))]
    if v is None or v * SLOWER >= 1 or not alts:
        return choice, out
    best, notes = None, []
    for alt in alts:
        try:
            t2, a_ms, v2 = measure(alt)
        except (RawconvError, RuntimeError) as exc:
            notes.append(f"slower than torch; torch's {word} {alt} did not run: {exc}")
            continue
        if v2 is not None and v2 > (best[3] if best is not None else v):
            best = (alt, t2, a_ms, v2)
        else:
            notes.append(f"torch's {word} {alt} measured no faster ({a_ms:.4f} ms)")
    if best is not None:
        alt, t2, a_ms, v2 = best
        out.update(torch_ms=t2, rawconv_ms=a_ms, vs_torch=v2,
                   vs_torch_note=f"{choice} measured {r_ms:.4f} ms against torch's {t_ms:.4f}: torch's "
                                 f"{word} {alt} kept instead")
        return alt, out
    out["vs_torch_note"] = "; ".join(notes)
    return choice, out
