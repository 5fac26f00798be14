"""The autotune search of cuDNN graph plans, over a small plan interface (:class:`SearchPlan`).

:meth:`rawconv.cudnn_graph.GraphConvolution.autotune` validates its arguments
(:class:`SearchOptions`), looks the problem up in the tuning cache (:mod:`rawconv.tuning`) and,
on a miss, runs :func:`search` (or :func:`search_relayout`) on the plan. The search knows a plan
only through :class:`SearchPlan`, so the CPU tests drive it with a fake plan and no cuDNN.

Phases of :func:`search`, while the budget lasts (each logs a debug line on the
``rawconv.search`` logger: trials, rows, best time, seconds):

1. ``heuristic``: the configs of the plan's heuristic modes (instant, B, FALLBACK);
2. ``cache seed``: winners of other problems from the tuning cache (:func:`seed_configs`);
3. ``default knobs``: every engine with its default knobs, runtime-compiled engines last
   (compiled in background threads, :func:`compile_in_background`);
4. ``knob search``: neighbouring knob values of the fastest engines (:func:`knob_search`);
5. ``random knobs``: random knob combinations weighted to the fastest engines, a neighbour
   search (:func:`neighbours`) from each new best (:func:`random_search`);
6. ``late compilations``: runtime compilations that ended after their trial (:func:`try_late`);
7. ``final re-timing``: the best eight re-timed in interleaved rounds.

Rows are :class:`TimedConfig`; :func:`ranked` orders them (``ok`` by median time, then
mismatches, then the rest).
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import os
import random
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

from ...core import progress as _progress
from ...core.autotune import check_budget as _check_budget
from ...core.errors import ArgumentError, LibraryError, NotSupportedError
from ...core.check import ErrorStats
from ...core.results import Result
from ...core.problem import ConvProblem

log = logging.getLogger("rawconv.search")

__all__ = ["SearchPlan", "Config", "Built", "SearchOptions", "TimedConfig", "Search", "search",
           "search_relayout", "seed_configs", "knob_search", "random_search", "neighbours", "try_late",
           "worth_retry", "compile_in_background", "build_in_background", "time_once", "time_reps",
           "knob_combinations", "knob_range", "knob_values", "ranked"]

RTC = "RUNTIME_COMPILATION"  # the behavior note of engines compiled at finalization


# ---------------------------------------------------------------------------- the plan interface
class Config(Protocol):
    """An engine config as the search sees it (:class:`rawconv.cudnn_graph.EngineConfig`):
    engine global index, sorted ``(knob type, value)`` pairs, notes (names without cuDNN's
    prefixes), workspace once finalized, and its name (``eng28{k2=3}``), unique per config."""

    engine: int
    knobs: tuple
    numerical_notes: tuple
    behavior_notes: tuple
    workspace_bytes: int | None

    @property
    def name(self) -> str: ...


class Built(Protocol):
    """A finalized execution plan: its (annotated) config, workspace bytes and when
    finalization returned (``time.perf_counter`` seconds)."""

    config: Any
    workspace_bytes: int
    finalized_at: float


class SearchPlan(Protocol):
    """What the search needs from a graph plan (:class:`rawconv.cudnn_graph.GraphConvolution`
    satisfies it; ``tests/test_cudnn_graph_cpu.py`` fakes it).

    Attributes: ``problem`` (:class:`~rawconv.problem.ConvProblem`), ``direction``
    (``"forward"``, ``"backward_data"``, ``"backward_filter"``), ``activation`` (None or a fused
    activation's name), ``heuristic_modes`` (mode names, in the order the search tries them),
    ``global_count`` (engine indices are ``0 .. global_count - 1``), ``built`` (config name ->
    :class:`Built`, filled by :meth:`build`, also from background threads) and ``failed``
    (config name -> why it did not finalize). ``channels_last`` and ``transpose_bytes`` are used
    by :func:`search_relayout` only.
    """

    problem: ConvProblem
    direction: str
    activation: str | None
    heuristic_modes: Sequence[str]

    @property
    def global_count(self) -> int: ...

    @property
    def built(self) -> Mapping[str, Built]: ...

    @property
    def failed(self) -> Mapping[str, str]: ...

    def heuristic(self, mode: str) -> list:
        """Configs heuristic ``mode`` returns for the graph, best first ([] when it declines)."""

    def engine_info(self, index: int) -> tuple | None:
        """``({"numerical_notes": (...), "behavior_notes": (...)}, [(knob type, min, max, stride), ...])``
        of engine ``index``, or None when it does not support the graph."""

    def make_config(self, engine: int, knobs: Sequence = (), numerical_notes: Sequence[str] = (),
                    behavior_notes: Sequence[str] = ()) -> Config:
        """A config of engine ``engine`` with ``knobs`` (``(type, value)`` pairs; () = defaults)."""

    def annotate(self, config: Config) -> Config:
        """``config`` with its engine's notes filled in (as it is when it has notes)."""

    def allowed(self, config: Config, **filters) -> str:
        """'' when ``config``'s notes pass ``filters`` (:attr:`SearchOptions.filters`), else why not."""

    def build(self, config: Config, *, handle: Any = None) -> Built:
        """Finalize ``config`` (cached in :attr:`built`; failures in :attr:`failed`), on ``handle``
        when given. Raises :class:`~rawconv.errors.NotSupportedError` when it does not finalize."""

    def handle(self) -> Any:
        """The calling thread's library handle for the plan's device (background builds share it)."""

    def output(self, layout: str | None = None) -> Any:
        """A new output tensor of the plan's direction, in ``layout`` (default: the problem's)."""

    def call_for(self, built: Built, tensors: dict, out: Any) -> Callable[[], Any]:
        """A no-argument callable running ``built`` on ``tensors`` (the search's example inputs,
        by role: x, w, b, dy), writing ``out``."""

    def check_output(self, out: Any, config: Config, ref: Any, ref_abs: Any) -> ErrorStats:
        """``out`` against the float64 reference within the tolerance ``config``'s notes imply."""

    def execute_call(self, built: Built, tensors: dict, out: Any, via: "SearchPlan | None" = None
                     ) -> Callable[[], Any]:
        """A callable making one call as ``execute(..., out=out)`` makes it, running ``built`` (of
        ``via``, the channels_last plan, through layout transforms, when given)."""

    def channels_last(self) -> "SearchPlan":
        """The plan of the same problem's channels_last graph (NCHW plans only)."""

    @property
    def transpose_bytes(self) -> int: ...


# ---------------------------------------------------------------------------- options and rows
def _bad_int(v, low: int = 1) -> bool:
    return isinstance(v, bool) or not isinstance(v, int) or v < low


@dataclass(frozen=True)
class SearchOptions:
    """The arguments of :meth:`~rawconv.cudnn_graph.GraphConvolution.autotune` that shape the
    search, checked when made (raises :class:`~rawconv.errors.ArgumentError`). ``filters``: the
    note filters :meth:`SearchPlan.allowed` takes (``deterministic_only``, ``no_tensor_cores``,
    ``no_down_conversion``, ``no_reduced_precision``)."""

    budget_s: float = 10.0
    workspace_limit: int | None = None
    filters: dict = dataclasses.field(default_factory=dict)
    iterations: int = 5
    final_iterations: int = 30
    check: bool = True
    use_cache: bool = True
    seed: int = 0
    include_runtime_compiled: bool = True
    patience: int | None = 200
    relayout: bool = False
    seed_from_cache: bool = True
    split: bool = True

    def __post_init__(self):
        _check_budget(self.budget_s, none_ok=False)   # wall time per problem and direction (the one meaning)
        if self.workspace_limit is not None and _bad_int(self.workspace_limit, 0):
            raise ArgumentError(f"workspace_limit must be None or bytes >= 0, got {self.workspace_limit!r}")
        if self.patience is not None and _bad_int(self.patience):
            raise ArgumentError(f"patience must be None or a positive int, got {self.patience!r}")
        if not isinstance(self.include_runtime_compiled, bool):
            raise ArgumentError(f"include_runtime_compiled must be True or False, got "
                                f"{self.include_runtime_compiled!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ArgumentError(f"seed must be an int, got {self.seed!r}")
        if not isinstance(self.relayout, bool):
            raise ArgumentError(f"relayout must be True or False, got {self.relayout!r}")
        if not isinstance(self.seed_from_cache, bool):
            raise ArgumentError(f"seed_from_cache must be True or False, got {self.seed_from_cache!r}")
        if not isinstance(self.split, bool):
            raise ArgumentError(f"split must be True or False, got {self.split!r}")


class TimedConfig(Result):
    """A row of :meth:`rawconv.cudnn_graph.GraphConvolution.autotune` (exported there as
    ``rawconv.cudnn_graph.TimedConfig``): a :class:`rawconv.results.Result` of the graph backend,
    built with this row type's older constructor.

    ``median_ms``/``min_ms``: GPU times of ``runs`` calls (ms), None when not run;
    ``status``: ``"ok"``, ``"mismatch"`` (ran, but outside the tolerance its notes imply, or
    left NaN), ``"not supported"`` (did not finalize), ``"filtered"`` (notes or workspace outside
    the request), ``"over budget"`` (a runtime compilation the budget did not wait for), ``"error"``;
    ``error``: the :class:`~rawconv.check.ErrorStats` against float64 (:attr:`accuracy`);
    ``phase``: how the search found it (``"heuristic"``, ``"default knobs"``, ``"knob search"``,
    ``"random knobs"``, ``"cache"``); ``layout``: ``""`` for the plan's own graph, ``"nhwc"``
    for a config of the channels_last graph that an NCHW plan runs on channels_last copies
    (``autotune(relayout=True)``; its name then starts with ``"nhwc:"``)."""

    def __init__(self, config: Any, median_ms: float | None = None, min_ms: float | None = None, runs: int = 0,
                 status: str = "ok", error: ErrorStats | None = None, phase: str = "", detail: str = "",
                 seconds: float = 0.0, layout: str = ""):
        Result.__init__(self, "cudnn_graph", config.name, None, getattr(config, "direction", "forward"), config,
                        status, median_ms, min_ms, runs, error, getattr(config, "workspace_bytes", None), detail,
                        detail if status not in ("ok", "mismatch") else "", phase, seconds)
        self.layout = layout

    @property
    def layout(self) -> str:
        return self.extra.get("layout", "")

    @layout.setter
    def layout(self, value: str) -> None:
        self.extra["layout"] = value
        self.name = f"{value}:{self.candidate.name}" if value else self.candidate.name

    def __str__(self) -> str:
        t = "-" if self.median_ms is None else f"{self.median_ms:.4f} ms"
        err = "" if self.error is None else f" err/tol={self.error.ratio:.2g}"
        return (f"{self.name:<28} {t:>12} {self.status:<13}{err} [{self.phase}, {self.seconds:.2f} s] "
                f"{self.detail}").rstrip()


def ranked(rows) -> list[TimedConfig]:
    """Autotune rows: ``ok`` by median time, then mismatches by time, then the rest."""
    rows = list(rows)
    ok = sorted((r for r in rows if r.status == "ok"), key=lambda r: r.median_ms)
    bad = sorted((r for r in rows if r.status == "mismatch"), key=lambda r: r.median_ms)
    return ok + bad + [r for r in rows if r.status not in ("ok", "mismatch")]


# ---------------------------------------------------------------------------- timing and logging
@contextlib.contextmanager
def _logged(name: str, summary: Callable[[], str]):
    """Log ``"<name>: <summary()>, <seconds> s"`` at debug level when the block ends."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: %s, %.3f s", name, summary(), time.perf_counter() - t0)


def time_once(fn):
    """GPU time of one call of ``fn`` (CUDA events; :func:`rawconv.bench.time_cuda`), TimeStats in ms."""
    from ...core.bench import time_cuda

    return time_cuda(fn, iterations=1, warmup=0)


def time_reps(fn, iterations: int, warmup: int = 1, target_ms: float = 0.25, max_reps: int = 32,
              first_ms: float | None = None):
    """GPU time per call of ``fn`` (ms): ``iterations`` groups of ``reps`` back-to-back calls, each
    group queued while the GPU is held busy (:func:`rawconv.bench.time_cuda_queued`) so that CUDA
    events around it time the GPU work alone. Timed one by one, a kernel of ~20 µs measures the
    host's launch time instead, which a loaded host stretches (seen on an H200: the same config
    timed 0.014 and 0.027 ms in two runs). ``reps`` grows until a group lasts about
    ``target_ms``. Host time per call is measured apart (``benchmarks/bench_cudnn_graph.py``).
    Returns per-call TimeStats (ms)."""
    from ...core.bench import time_cuda, time_cuda_queued

    first = first_ms if first_ms is not None else time_cuda(fn, iterations=2, warmup=warmup).min_ms
    reps = max(1, min(max_reps, math.ceil(target_ms / max(first, 1e-4))))
    return time_cuda_queued(fn, iterations=reps, warmup=max(warmup, 1), repeats=iterations)


def time_interleaved(fns: Sequence[Callable], final_iterations: int, rounds: int = 5):
    """Each callable timed in ``rounds`` interleaved rounds (so that clock drift hits each alike):
    ``(medians of the round medians, minimums, runs)`` per callable."""
    per_round = max(2, final_iterations // rounds)
    med: list[list] = [[] for _ in fns]
    mins: list[list] = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            st = time_reps(fn, per_round, warmup=1)
            med[i].append(st.median_ms)
            mins[i].append(st.min_ms)
    return [statistics.median(m) for m in med], [min(m) for m in mins], rounds * per_round


# ---------------------------------------------------------------------------- knob values
def knob_combinations(knobs: list):
    """Default knobs first, then every combination of knob values, in order."""
    yield ()
    if not knobs:
        return
    ranges = [[(t, v) for v in knob_range(lo, hi, st)] for t, lo, hi, st in knobs]
    for combo in itertools.product(*ranges):
        yield combo


def knob_range(lo: int, hi: int, stride: int) -> list[int]:
    if stride <= 0 or hi < lo:
        return [lo]
    return list(range(lo, hi + 1, stride))


def knob_values(lo: int, hi: int, stride: int, current: int, cap: int = 16) -> list[int]:
    """Values to try for one knob: all when few, else ``cap`` spread over the range plus the
    current value's neighbours."""
    vals = knob_range(lo, hi, stride)
    if len(vals) <= cap:
        return vals
    pick = {vals[round(i * (len(vals) - 1) / (cap - 1))] for i in range(cap)}
    step = stride if stride > 0 else 1
    pick |= {v for v in (current - step, current + step) if lo <= v <= hi}
    return sorted(pick)


# ---------------------------------------------------------------------------- runtime compilation
OVERTIME_S = 3.0   # Search.overtime: at least this long past the budget when nothing ran correctly in it
_RTC_WORKERS = max(2, min(8, os.cpu_count() or 2))  # runtime compilations running at once, per process
_rtc_lock = threading.Lock()
_rtc_inflight: dict = {}  # (id(plan), config name) -> perf_counter at its start, while it compiles


def rtc_busy() -> bool:
    """Whether the process already runs ``_RTC_WORKERS`` runtime compilations."""
    return len(_rtc_inflight) >= _RTC_WORKERS


def compiling(plan: SearchPlan) -> bool:
    """Whether a runtime compilation of ``plan`` is running."""
    with _rtc_lock:
        return any(k[0] == id(plan) for k in _rtc_inflight)


def try_late(plan: SearchPlan, late, trial, deadline: float, wait: bool) -> None:
    """Autotune's step 4b: try the rows ``late()`` returns (see :func:`worth_retry`) until
    ``deadline`` (perf_counter s); with ``wait``, while ``plan`` still has runtime compilations
    running, wait for them (5 ms polls) and try what they give."""
    while time.perf_counter() < deadline:
        todo = late()
        for r in todo:
            if time.perf_counter() >= deadline:
                return
            trial(r.config, r.phase)
        if not todo:
            if not wait or not compiling(plan):
                return
            time.sleep(0.005)


def worth_retry(plan: SearchPlan, row: TimedConfig) -> bool:
    """Whether an autotune row deserves another trial: an ``"over budget"`` runtime compilation
    that has finished since (the plan holds its execution plan), or one skipped while
    ``_RTC_WORKERS`` others compiled, now that there is room."""
    return row.status == "over budget" and (
        row.config.name in plan.built or (row.detail.startswith("skipped") and not rtc_busy()))


def compile_in_background(plan: SearchPlan, configs, timeout_s: float) -> list:
    """Finalize runtime-compiled engine configs at once, each in a thread of its own on the calling
    thread's cuDNN handle (as cudnn-frontend's multithreaded plan builds share one handle), at most
    ``_RTC_WORKERS`` in the process at a time (the rest are left for later), and wait at most
    ``timeout_s`` for them. A compilation still running then finishes in the background and the
    plan keeps its result; one that fails is recorded as :meth:`SearchPlan.build` does. Returns
    the names of the configs whose compilation this call started (not those built, failed or
    compiling already, nor those left for later)."""
    with _rtc_lock:
        todo = [ec for ec in configs if ec.name not in plan.built and ec.name not in plan.failed
                and (id(plan), ec.name) not in _rtc_inflight]
        todo = list({ec.name: ec for ec in todo}.values())[:max(0, _RTC_WORKERS - len(_rtc_inflight))]
        now = time.perf_counter()
        for ec in todo:
            _rtc_inflight[(id(plan), ec.name)] = now
    if not todo:
        return []
    handle = plan.handle()

    def work(ec):
        try:
            plan.build(ec, handle=handle)
        except BaseException:  # noqa: BLE001 - build() recorded why in plan.failed
            pass
        finally:
            with _rtc_lock:
                _rtc_inflight.pop((id(plan), ec.name), None)

    # not daemon threads: at exit the interpreter waits for a compilation still inside cuDNN
    # rather than tearing the process down under it
    threads = [threading.Thread(target=work, args=(ec,), name=f"rawconv-rtc-{ec.name}") for ec in todo]
    for t in threads:
        t.start()
    end = time.perf_counter() + timeout_s
    for t in threads:
        t.join(max(0.0, end - time.perf_counter()))
    return [ec.name for ec in todo]


PREFETCH = 2   # prefetch(): compilations started ahead for the next problem (of _RTC_WORKERS)


def prefetch(plan: SearchPlan, n: int = PREFETCH) -> list:
    """Start compiling, in background threads, the runtime-compiled configs among ``plan``'s first
    ``n`` configs of heuristic mode instant that the default filters allow, and return at once
    (the names of those it started: not those built, failed or compiling already). For a
    sequence of searches (``rawconv.nn.convert``'s autotune): the next problem's likely first
    candidates compile on idle CPU cores while this one is timed on the GPU, so that its search
    starts with them built (its trials wait for a compilation already running rather than start
    another). It leaves half of the ``_RTC_WORKERS`` (rounded up) free for the search in
    progress: on a host with few cores the prefetch would otherwise take every worker, and that
    search's runtime-compiled candidates would all be skipped."""
    if n < 1:
        return []
    todo = []
    for ec in plan.heuristic("instant")[:n]:
        if RTC in ec.behavior_notes and not plan.allowed(ec):   # autotune's default filters
            todo.append(ec)
    todo = [ec for ec in todo if ec.name not in plan.built and ec.name not in plan.failed
            and (id(plan), ec.name) not in _rtc_inflight]
    room = _RTC_WORKERS - (_RTC_WORKERS + 1) // 2 - len(_rtc_inflight)
    return compile_in_background(plan, todo[:max(0, room)], 0.0)


def build_in_background(plan: SearchPlan, ec: Config, timeout_s: float):
    """Finalize one runtime-compiled config through :func:`compile_in_background` (or wait for
    the compilation of it already running), at most ``timeout_s``. Returns ``(built, "")``, or
    ``(None, why)`` when it is still compiling (it finishes in the background) or when the
    process already runs ``_RTC_WORKERS`` compilations. Raises the build's
    :class:`NotSupportedError`."""
    b = plan.built.get(ec.name)
    if b is not None:
        return b, ""
    key = (id(plan), ec.name)
    if key in _rtc_inflight:
        end = time.perf_counter() + timeout_s
        while key in _rtc_inflight and time.perf_counter() < end:
            time.sleep(0.002)
    elif rtc_busy():
        return None, f"skipped: {len(_rtc_inflight)} runtime compilations already running"
    else:
        compile_in_background(plan, [ec], timeout_s)
    b = plan.built.get(ec.name)
    if b is not None:
        return b, ""
    if key in _rtc_inflight:
        return None, (f"runtime compilation still running after {timeout_s:.1f} s (the budget's end); "
                      f"it finishes in the background")
    return plan.build(ec), ""  # it failed: raises NotSupportedError with cuDNN's reason


# ---------------------------------------------------------------------------- strategies
def seed_configs(plan: SearchPlan, configs: Sequence[Config], max_rtc: int = 8, max_other: int = 16, *,
                 filters: dict | None = None, proposed: set | None = None,
                 include_runtime_compiled: bool = True) -> list:
    """The configs among ``configs`` (winners of other problems from the tuning cache, best
    first) whose engine this graph supports and that autotune's filters allow (``filters`` as
    :meth:`SearchPlan.allowed` takes them; a runtime-compiled engine outside ``proposed`` only
    with ``include_runtime_compiled``), each once: at most ``max_rtc`` runtime-compiled ones and
    ``max_other`` others."""
    out, n_rtc, n_other, seen = [], 0, 0, set()
    for ec in configs:
        if ec.name in seen or plan.engine_info(ec.engine) is None:
            continue
        seen.add(ec.name)
        ec = plan.annotate(ec)
        if filters is not None and plan.allowed(ec, **filters):
            continue
        rtc = RTC in ec.behavior_notes
        if rtc and not include_runtime_compiled and ec.engine not in (proposed or ()):
            continue
        if rtc:
            if n_rtc >= max_rtc:
                continue
            n_rtc += 1
        else:
            if n_other >= max_other:
                continue
            n_other += 1
        out.append(ec)
    return out


def _best_by_engine(rows: dict) -> list:
    """Each engine's fastest ``ok`` row, fastest first."""
    best = {}
    for r in rows.values():
        if r.status != "ok":
            continue
        e = r.config.engine
        if e not in best or r.median_ms < best[e].median_ms:
            best[e] = r
    return sorted(best.values(), key=lambda r: r.median_ms)


def knob_search(plan: SearchPlan, rows: dict, trial, left, prebuild=None) -> None:
    """Coordinate search over knob values, from the best config of each of the fastest engines
    (six, then three for up to two more rounds while one improves). ``trial(config, phase)``
    tries a config (returns its row or None), ``left()`` says whether the budget lasts,
    ``prebuild(configs)`` compiles runtime-compiled candidates together before they are tried."""
    ranked_ = _best_by_engine(rows)[:6]
    for round_ in range(3):
        improved = False
        for start in ranked_:
            if not left():
                return
            info = plan.engine_info(start.config.engine)
            if info is None or not info[1]:
                continue
            if round_ > 0 and RTC in start.config.behavior_notes:
                continue
            current, base = _knob_base(rows, start, info[1])
            done, better = _coordinate_pass(plan, start.config.engine, info[1], current, base, trial, left, prebuild)
            improved |= better
            if done:
                return
        ranked_ = _best_by_engine(rows)[:3]
        if not improved:
            return


def _knob_base(rows: dict, start: TimedConfig, knobs: list):
    """The row and knob values a knob search of ``start``'s engine starts from: ``start``, or for
    default knobs a heuristic config of the same engine (its fastest ``ok`` one), else each
    knob's minimum."""
    current = rows[start.config.name]
    base = dict(current.config.knobs)
    if not base:
        seeds = [r for r in rows.values() if r.config.engine == start.config.engine and r.config.knobs
                 and r.status == "ok"]
        if seeds:
            current = min(seeds, key=lambda r: r.median_ms)
            base = dict(current.config.knobs)
        else:
            base = {t: lo for t, lo, hi, st in knobs}
    return current, base


def _coordinate_pass(plan, engine: int, knobs: list, current, base: dict, trial, left, prebuild):
    """One pass over ``knobs`` of ``engine``, each knob's values (:func:`knob_values`) tried from
    ``base``, improvements kept. Returns ``(budget ended, improved)``."""
    improved = False
    for t, lo, hi, st in knobs:
        if prebuild is not None:
            prebuild([plan.make_config(engine, tuple({**base, t: v}.items()))
                      for v in knob_values(lo, hi, st, base.get(t, lo)) if v != base.get(t)])
        for v in knob_values(lo, hi, st, base.get(t, lo)):
            if not left():
                return True, improved
            if v == base.get(t):
                continue
            cand = dict(base)
            cand[t] = v
            row = trial(plan.make_config(engine, tuple(cand.items())), "knob search")
            if row is not None and row.status == "ok" and row.median_ms < current.median_ms:
                current, base, improved = row, dict(row.config.knobs), True
    return False, improved


def neighbours(plan: SearchPlan, rows: dict, trial, left, start, knobs, prebuild=None) -> None:
    """One knob at a time, to each neighbouring value, from ``start``, keeping improvements."""
    current = start
    improved = True
    while improved and left():
        improved = False
        base = dict(current.config.knobs)
        engine = current.config.engine
        if prebuild is not None:
            prebuild([plan.make_config(engine, tuple({**base, t: v}.items()))
                      for t, lo, hi, st in knobs for v in (base.get(t, lo) - (st or 1), base.get(t, lo) + (st or 1))
                      if lo <= v <= hi])
        for t, lo, hi, st in knobs:
            step = st if st > 0 else 1
            for v in (base.get(t, lo) - step, base.get(t, lo) + step):
                if not left():
                    return
                if not lo <= v <= hi:
                    continue
                cand = dict(base)
                cand[t] = v
                row = trial(plan.make_config(engine, tuple(cand.items())), "random knobs")
                if row is not None and row.status == "ok" and row.median_ms < current.median_ms:
                    current, improved = row, True
            if improved:
                break


class _RandomDraws:
    """The state of :func:`random_search`: the engines drawn from, each one's fastest ``ok`` row
    and trials spent (kept up to date as rows come: a scan of every row per draw would cost
    O(rows) each, thousands of times per search), failed draws, exhausted engines."""

    def __init__(self, plan: SearchPlan, rows: dict, trial, seed: int, proposed: set, include_runtime_compiled: bool):
        self.plan, self.rows, self._trial = plan, rows, trial
        self.rng = random.Random(seed)
        self.infos = {}
        for idx in range(plan.global_count):
            info = plan.engine_info(idx)
            if info is None or not info[1]:
                continue
            if RTC in info[0]["behavior_notes"] and idx not in proposed and not include_runtime_compiled:
                continue
            default = rows.get(f"eng{idx}")
            if default is not None and default.status == "filtered" and not default.detail.startswith("workspace"):
                continue  # its notes are outside the request
            self.infos[idx] = info
        self.fails = {idx: 0 for idx in self.infos}
        self.exhausted: set = set()
        self.best: dict = {}    # engine -> its fastest "ok" row
        self.spent: dict = {}   # engine -> (rows, seconds)
        for r in rows.values():
            self.note(r)

    def note(self, r) -> None:
        e = r.config.engine
        n, sec = self.spent.get(e, (0, 0.0))
        self.spent[e] = (n + 1, sec + r.seconds)
        if r.status == "ok" and (e not in self.best or r.median_ms < self.best[e].median_ms):
            self.best[e] = r

    def trial(self, ec, phase):
        """``trial`` with the per-engine state updated."""
        before = self.rows.get(ec.name)
        row = self._trial(ec, phase)
        r = self.rows.get(ec.name)
        if r is not None and r is not before:
            self.note(r)
        return row

    def usable(self, idx) -> bool:
        """Not exhausted, not 16 failed draws without a success, and for a runtime-compiled
        engine, trials averaging under 1 s."""
        if idx in self.exhausted:
            return False
        if self.best.get(idx) is None and self.fails[idx] >= 16:
            return False
        n, sec = self.spent.get(idx, (0, 0.0))
        return not (RTC in self.infos[idx][0]["behavior_notes"] and n and sec / n > 1.0)

    def draw(self, idx):
        """An untried random knob combination of engine ``idx`` (24 tries; then, in a space of at
        most 4096 combinations, the first untried one in order), or None (engine exhausted)."""
        knobs = self.infos[idx][1]
        for _ in range(24):
            combo = []
            for t, lo, hi, st in knobs:
                n = (hi - lo) // st + 1 if st > 0 and hi >= lo else 1
                combo.append((t, lo + st * self.rng.randrange(n) if n > 1 else lo))
            ec = self.plan.make_config(idx, tuple(combo))
            if ec.name not in self.rows:
                return ec
        total = 1
        for t, lo, hi, st in knobs:
            total *= (hi - lo) // st + 1 if st > 0 and hi >= lo else 1
        if total <= 4096:  # small space: take the first untried combination in order
            for combo in knob_combinations(knobs):
                ec = self.plan.make_config(idx, combo)
                if combo and ec.name not in self.rows:
                    return ec
        self.exhausted.add(idx)
        return None

    def round_plan(self) -> list:
        """``(engine, draws)`` for one round: 3 for each of the two fastest engines, 2 for the next
        four, 1 for every other."""
        ranked_ = sorted((idx for idx in self.infos if self.best.get(idx) is not None),
                         key=lambda i: self.best[i].median_ms)
        plan = [(idx, 3 if k < 2 else 2 if k < 6 else 1) for k, idx in enumerate(ranked_)]
        return plan + [(idx, 1) for idx in self.infos if idx not in ranked_]


def random_search(plan: SearchPlan, rows: dict, trial, left, seed: int, proposed: set,
                  include_runtime_compiled: bool, prebuild=None, late=None) -> None:
    """Random knob combinations: per round, 3 draws for each of the two fastest engines, 2 for
    the next four, 1 for every other engine with knobs (one that never finalized is dropped
    after 16 failed draws; a runtime-compiled engine is drawn only while its trials average
    under 1 s). A draw that beats its engine's best by 0.5% starts a neighbour search. After
    each round, the rows ``late(rows)`` returns (compiled since, or skipped) are tried again."""
    st = _RandomDraws(plan, rows, trial, seed, proposed, include_runtime_compiled)
    while left():
        progressed = False
        for idx, n in st.round_plan():
            if not st.usable(idx):
                continue
            batch = {}
            for _ in range(n):
                ec = st.draw(idx)
                if ec is None:
                    break
                batch[ec.name] = ec
            if prebuild is not None and len(batch) > 1:
                prebuild(list(batch.values()))
            for ec in batch.values():
                if not left():
                    return
                if not st.usable(idx):
                    break
                before = st.best.get(idx)
                row = st.trial(ec, "random knobs")
                progressed = True
                if row is None or row.status != "ok":
                    st.fails[idx] += 1
                    continue
                if before is None or row.median_ms < 0.995 * before.median_ms:
                    neighbours(plan, rows, st.trial, left, row, st.infos[idx][1], prebuild)
        if not progressed:
            return
        for r in (late(rows) if late is not None else []):
            if not left():
                break
            # skipped while other runtime compilations ran, or compiled since: try it now
            row = st.trial(r.config, r.phase)
            if row is not None and row.status == "ok":
                neighbours(plan, rows, st.trial, left, row, st.infos.get(row.config.engine, (None, []))[1], prebuild)


# ---------------------------------------------------------------------------- one search
class Search:
    """One search of :meth:`~rawconv.cudnn_graph.GraphConvolution.autotune` on one graph plan,
    until ``deadline`` (perf_counter seconds; ``budget_s`` is the budget it was given, for the
    shares of it that the runtime compilations may take). ``tensors``: example inputs by role;
    ``ref``/``ref_abs``: the float64 reference (None without ``options.check``); ``seeds``:
    configs that won for other problems (tried after the heuristic ones). :meth:`run` returns the
    ranked rows and selects nothing."""

    def __init__(self, plan: SearchPlan, options: SearchOptions, deadline: float, budget_s: float,
                 tensors: dict, ref=None, ref_abs=None, seeds: Sequence = ()):
        self.plan, self.opts = plan, options
        self.deadline, self.budget_s = deadline, budget_s
        self.tensors, self.ref, self.ref_abs, self.seeds = tensors, ref, ref_abs, list(seeds)
        self.out = plan.output()
        self.rows: dict[str, TimedConfig] = {}
        self.best_ms: float | None = None
        self.trials = 0
        # candidates since the best improved by 0.5% (counted from the knob phases on)
        self.stall_count, self.stall_counting, self.stall_best = 0, False, None
        self.proposed: set = set()   # engines a heuristic mode proposed
        # the search phases end a little early: the rest of the budget goes to runtime
        # compilations that ended after their trial gave up on them (see late())
        self.search_end = deadline - min(0.05 * budget_s, 0.5)
        self.seed_end = self.search_end  # the seed phase's compilation limit, set in seed_phase()

    # ------------------------------------------------------------------ the phases
    def run(self) -> list[TimedConfig]:
        p = self.plan
        log.debug("search %s %s: %.2f s, %d seeds", p.direction, p.problem.describe(), self.budget_s,
                  len(self.seeds))
        o = self.opts
        with self.phase("heuristic"):
            self.heuristic_phase()
        with self.phase("cache seed"):
            self.seed_phase()
        with self.phase("default knobs"):
            self.default_phase()
        self.stall_counting, self.stall_best = True, self.best_ms
        with self.phase("knob search"):
            knob_search(p, self.rows, self.trial, self.left, self.prebuild)
        with self.phase("random knobs"):
            random_search(p, self.rows, self.trial, self.left, o.seed, self.proposed, o.include_runtime_compiled,
                          self.prebuild, self.late)
        # configs skipped while runtime compilations ran, or whose compilation ended late;
        # unless patience ended the search, until the deadline as this plan's compilations end
        with self.phase("late compilations"):
            try_late(p, lambda: self.late(self.rows), self.trial, self.deadline, wait=not self.patience_ended())
        if not any(r.status == "ok" for r in self.rows.values()):
            with self.phase("overtime"):
                self.overtime()
        with self.phase("final re-timing"):
            self.retime()
        return ranked(self.rows.values())

    def heuristic_phase(self) -> None:
        for mode in self.plan.heuristic_modes:
            for ec in self.plan.heuristic(mode):
                self.proposed.add(ec.engine)
                if not self.left():
                    break
                self.trial(ec, "heuristic")

    def seed_phase(self) -> None:
        """The winners of other problems in the tuning cache, runtime-compiled ones built together."""
        o = self.opts
        seeded = seed_configs(self.plan, self.seeds, filters=o.filters, proposed=self.proposed,
                              include_runtime_compiled=o.include_runtime_compiled)
        rtc_seeded = [ec for ec in seeded if RTC in ec.behavior_notes]
        # the whole phase's compilations: at most a fifth of the budget (late ones: see late())
        self.seed_end = min(self.search_end, time.perf_counter() + max(0.5, 0.2 * self.budget_s))
        if rtc_seeded and self.left():  # all at once, as many as there are workers free
            compile_in_background(self.plan, rtc_seeded, max(self.seed_end - time.perf_counter(), 0.05))
        for ec in seeded:
            if not self.left():
                break
            self.trial(ec, "cache seed")

    def default_phase(self) -> None:
        """Every engine with default knobs, runtime-compiled ones last: their compilation cannot be
        interrupted (21 s on an H200, cuDNN 9.19, engine 80 on a stride-2 3x3 conv, for a 13 ms
        kernel), so it runs in a background thread that the budget does not wait for."""
        p, o = self.plan, self.opts
        supported = [i for i in range(p.global_count) if p.engine_info(i) is not None]
        is_rtc = {i: RTC in p.engine_info(i)[0]["behavior_notes"] for i in supported}
        supported.sort(key=lambda i: is_rtc[i])
        defaults = {i: p.make_config(i, (), **p.engine_info(i)[0]) for i in supported}
        rtc_defaults = [defaults[i] for i in supported if is_rtc[i] and (i in self.proposed or o.include_runtime_compiled)]
        rtc_defaults = [ec for ec in rtc_defaults if ec.name not in self.rows and not p.allowed(ec, **o.filters)]
        if rtc_defaults and self.left():  # all at once, at most a fifth of the budget
            compile_in_background(p, rtc_defaults, min(max(self.deadline - time.perf_counter(), 0.05),
                                                       max(0.5, 0.2 * self.budget_s)))
        for idx in supported:
            if not self.left():
                break
            ec = defaults[idx]
            if is_rtc[idx] and idx not in self.proposed and not o.include_runtime_compiled:
                self.rows[ec.name] = TimedConfig(ec, status="filtered", phase="default knobs",
                                                 detail="runtime-compiled engine that no heuristic mode proposes "
                                                        "(autotune(include_runtime_compiled=True) tries it)")
                continue
            self.trial(ec, "default knobs")
        for r in self.late(self.rows):  # default-knob compilations that ended since their trial
            if not self.left():
                break
            self.trial(r.config, r.phase)

    def overtime(self) -> None:
        """No candidate ran correctly within the budget: typical of a fused graph on a short budget,
        whose engines are mostly runtime-compiled and compile for longer than the budget gives
        them. Wait for this plan's compilations still running, at most ``OVERTIME_S`` (or twice the
        budget, whichever is longer), trying each as it finishes, then, while none ran correctly,
        finalize the heuristic's configs not yet tried, in order (blocking); the first that runs
        correctly ends it. So the search returns a timed, checked choice rather than none (the
        caller would otherwise compile cuDNN's first heuristic config untimed)."""
        end = time.perf_counter() + max(OVERTIME_S, 2 * self.budget_s)
        self.deadline = self.search_end = end
        ok = lambda: any(r.status == "ok" for r in self.rows.values())   # noqa: E731
        skipped = lambda: any(r.status == "over budget" and r.detail.startswith("skipped")   # noqa: E731
                              for r in self.rows.values())
        while time.perf_counter() < end and not ok():
            todo = self.late(self.rows)
            for r in todo:
                self.trial(r.config, r.phase)
                if ok() or time.perf_counter() >= end:
                    return
            if not todo:
                # this plan's compilations, or the workers other plans' compilations hold
                # (a prefetch, another thread's search) while rows of this one were skipped
                if not compiling(self.plan) and not (rtc_busy() and skipped()):
                    break
                time.sleep(0.005)
        for mode in self.plan.heuristic_modes:
            for ec in self.plan.heuristic(mode):
                if ok() or time.perf_counter() >= end:
                    return
                r = self.rows.get(ec.name)
                if r is None or r.status == "over budget":
                    self.rows.pop(ec.name, None)
                    self._overtime_build(ec)

    def _overtime_build(self, ec) -> None:
        """Finalize ``ec`` (waiting for a compilation of it already running, or for a free worker
        while the process runs ``_RTC_WORKERS`` compilations) and try it."""
        key = (id(self.plan), ec.name)
        rtc = RTC in self.plan.annotate(ec).behavior_notes

        def wait() -> bool:
            return key in _rtc_inflight or (rtc and ec.name not in self.plan.built and rtc_busy())
        while wait() and time.perf_counter() < self.deadline:
            time.sleep(0.002)
        self.trial(ec, "overtime")

    def retime(self) -> None:
        """The best eight re-timed in 5 interleaved rounds (``final_iterations`` groups in all);
        median of the round medians."""
        top = sorted((r for r in self.rows.values() if r.status == "ok"), key=lambda r: r.median_ms)[:8]
        fns = [self.plan.call_for(self.plan.built[r.config.name], self.tensors, self.out) for r in top]
        medians, mins, runs = time_interleaved(fns, self.opts.final_iterations)
        for r, med, mn in zip(top, medians, mins):
            r.median_ms, r.min_ms, r.runs = med, mn, runs

    def phase(self, name: str):
        """A context that logs one debug line when phase ``name`` ends: trials made, rows, best
        time, seconds."""
        n0 = self.trials

        def summary() -> str:
            ok = sum(r.status == "ok" for r in self.rows.values())
            best = "-" if self.best_ms is None else f"{self.best_ms:.4f} ms"
            return f"{self.trials - n0} trials, {len(self.rows)} rows ({ok} ok), best {best}"
        return _logged(name, summary)

    # ------------------------------------------------------------------ budget and retries
    def left(self) -> bool:
        """Whether the search phases go on: before ``search_end`` and patience not spent."""
        return (time.perf_counter() < self.search_end and
                (self.opts.patience is None or not self.stall_counting or self.stall_count < self.opts.patience))

    def patience_ended(self) -> bool:
        p = self.opts.patience
        return p is not None and self.stall_counting and self.stall_count >= p

    def late(self, rows: dict) -> list:
        """Rows worth another trial (:func:`worth_retry`)."""
        return [r for r in rows.values() if worth_retry(self.plan, r)]

    def prebuild(self, configs) -> None:
        """Compile the runtime-compiled ones among ``configs`` at once (worker threads)."""
        todo = []
        for ec in configs:
            ec = self.plan.annotate(ec)
            if RTC in ec.behavior_notes and ec.name not in self.rows and not self.plan.allowed(ec, **self.opts.filters):
                todo.append(ec)
        if len(todo) > 1 and time.perf_counter() < self.search_end:
            compile_in_background(self.plan, todo, max(self.search_end - time.perf_counter(), 0.05))

    # ------------------------------------------------------------------ one candidate
    def trial(self, ec, phase: str) -> TimedConfig | None:
        """Try ``ec`` (unless tried already and not worth a retry): its row (None when it did not
        run), the time spent in ``row.seconds``, the patience count updated."""
        _progress.note(f"{phase}: {getattr(ec, 'name', ec)}")
        old = self.rows.get(ec.name)
        if old is not None and not worth_retry(self.plan, old):
            return old
        t0 = time.perf_counter()
        self.trials += 1
        row = self._trial(ec, phase)
        r = self.rows.get(ec.name)
        if r is not None:
            r.seconds = time.perf_counter() - t0
        if self.stall_counting and r is not None and r.status in ("ok", "mismatch"):
            if self.best_ms is not None and (self.stall_best is None or self.best_ms < 0.995 * self.stall_best):
                self.stall_best, self.stall_count = self.best_ms, 0
            else:
                self.stall_count += 1
        return row

    def _trial(self, ec, phase: str) -> TimedConfig | None:
        ec = self.plan.annotate(ec)
        why = self.plan.allowed(ec, **self.opts.filters)
        if why:
            self.rows[ec.name] = TimedConfig(ec, status="filtered", phase=phase, detail=why)
            return None
        b = self._finalize(ec, phase)
        if b is None:
            return None
        ec = b.config
        limit = self.opts.workspace_limit
        if limit is not None and b.workspace_bytes > limit:
            self.rows[ec.name] = TimedConfig(ec, status="filtered", phase=phase,
                                             detail=f"workspace {b.workspace_bytes} B > limit {limit} B")
            return None
        try:
            stats, err = self._measure(b)
        except LibraryError as exc:
            self.rows[ec.name] = TimedConfig(ec, status="error", phase=phase, detail=str(exc))
            return None
        status = "ok" if err is None or err.ok else "mismatch"
        if status == "ok" and (self.best_ms is None or stats.median_ms < self.best_ms):
            self.best_ms = stats.median_ms
        row = self.rows[ec.name] = TimedConfig(ec, stats.median_ms, stats.min_ms, stats.runs, status, err, phase)
        return row

    def _finalize(self, ec, phase: str):
        """The execution plan of ``ec``, or None with its row recorded (did not finalize, or a
        runtime compilation still running past the time this phase gives it)."""
        try:
            if RTC in ec.behavior_notes and ec.name not in self.plan.built:
                now = time.perf_counter()
                # the search phases leave the reserve (see search_end) to late compilations
                wait = max((self.deadline if now >= self.search_end else self.search_end) - now, 0.05)
                running = (id(self.plan), ec.name) in _rtc_inflight
                if phase == "default knobs":  # an untried engine: do not let it take the budget
                    wait = 0.01 if running else min(wait, max(0.5, 0.2 * self.budget_s))
                elif phase == "cache seed":  # the seeds share one limit
                    wait = 0.01 if running else max(0.01, self.seed_end - now)
                b, why = build_in_background(self.plan, ec, wait)
                if b is None:
                    self.rows[ec.name] = TimedConfig(ec, status="over budget", phase=phase, detail=why)
                return b
            return self.plan.build(ec)
        except NotSupportedError as exc:
            self.rows[ec.name] = TimedConfig(ec, status="not supported", phase=phase,
                                             detail=self.plan.failed.get(ec.name, str(exc)))
            return None

    def _measure(self, b):
        """Run ``b`` once into a NaN-filled output, check it (``options.check``), then time it:
        ``(TimeStats, ErrorStats or None)``. One run is enough past the budget, or when the
        second (warm) run took over 3x the best so far."""
        fn = self.plan.call_for(b, self.tensors, self.out)
        err = None
        if self.opts.check:
            self.out.fill_(float("nan"))
        first = time_once(fn)  # one timed call, whose output is checked
        if self.opts.check:
            err = self.plan.check_output(self.out, b.config, self.ref, self.ref_abs)
        iterations = self.opts.iterations
        if first.median_ms * 1e-3 * (iterations + 3) > self.deadline - time.perf_counter():
            return first, err  # past the budget: one run is enough
        # the first call also loads the kernel's module (CUDA lazy loading): judge by a second
        probe = time_once(fn)
        best = self.best_ms
        if best is not None and probe.median_ms > max(3 * best, best + 0.05):
            # far slower than the best so far (one call timed alone may include launch time,
            # hence the margin): one run is enough
            return probe, err
        return time_reps(fn, iterations, warmup=0, first_ms=probe.min_ms), err


def search(plan: SearchPlan, deadline: float, budget_s: float, tensors: dict, ref, ref_abs,
           options: SearchOptions, seeds: Sequence = ()) -> list[TimedConfig]:
    """The search of :meth:`~rawconv.cudnn_graph.GraphConvolution.autotune` on ``plan`` until
    ``deadline`` (perf_counter seconds): the ranked table (see :class:`Search`); selects nothing."""
    return Search(plan, options, deadline, budget_s, tensors, ref, ref_abs, seeds).run()


# ---------------------------------------------------------------------------- relayout
def search_relayout(plan: SearchPlan, t_start: float, budget_s: float, tensors: dict, ref, ref_abs,
                    options: SearchOptions, seeds: Sequence = (), cl_seeds: Sequence = ()) -> list[TimedConfig]:
    """``autotune(relayout=True)``: this NCHW graph for half the budget, the channels_last graph
    of the same problem for the rest (a graph cuDNN rejects, or a search that fails, leaves the
    other), then the best four of each run as execute runs them (transforms included for the
    channels_last ones, each checked end to end first) and timed in interleaved rounds.
    Selects nothing."""
    from ...core.problem import to_layout
    import torch

    try:
        native = search(plan, t_start + budget_s / 2, budget_s / 2, tensors, ref, ref_abs, options, seeds)
    except (NotSupportedError, LibraryError):
        native = []
    cl_opts = options
    if options.workspace_limit is not None:
        limit = options.workspace_limit - plan.transpose_bytes
        if limit < 0:
            return native
        cl_opts = dataclasses.replace(options, workspace_limit=limit)
    cl = plan.channels_last()
    cl_tensors = {k: (to_layout(v, "nhwc") if isinstance(v, torch.Tensor) and v.dim() >= 3 else v)
                  for k, v in tensors.items()}
    end = t_start + budget_s
    try:
        cl_rows = search(cl, end, max(end - time.perf_counter(), 0.05), cl_tensors, ref, ref_abs, cl_opts, cl_seeds)
    except (NotSupportedError, LibraryError):
        return native
    for r in cl_rows:
        r.layout = "nhwc"
    cl_top = [r for r in cl_rows if r.status == "ok"][:4]
    if not cl_top:
        return ranked(native + cl_rows)
    with _logged("relayout end to end", lambda: f"{len(cl_top)} channels_last configs, "
                 f"{sum(r.status == 'ok' for r in cl_rows)} channels_last rows ok"):
        _end_to_end(plan, cl, native, cl_rows, cl_top, tensors, ref, ref_abs, options)
    return ranked(native + cl_rows)


def _end_to_end(plan, cl, native: list, cl_rows: list, cl_top: list, tensors, ref, ref_abs,
                options: SearchOptions) -> None:
    """The best four channels_last configs (``cl_top``), checked end to end, and the best four of
    ``native`` timed as execute runs them, in interleaved rounds; the other channels_last rows get
    the transforms' time (median over the four) added. On a wrong end-to-end result or a library
    error, the channels_last rows that were ``ok`` are marked instead."""
    out = plan.output()
    fns = []  # (row, callable); rows are not hashable
    try:
        for r in cl_top:
            fn = plan.execute_call(cl.built[r.config.name], tensors, out, via=cl)
            fns.append((r, fn))
            if options.check:  # the whole path: transforms in, engine, transform out
                out.fill_(float("nan"))
                fn()
                err = plan.check_output(out, r.config, ref, ref_abs)
                if not err.ok:  # the engine alone was right: the transform path is wrong
                    for c in cl_rows:
                        if c.status == "ok":
                            c.status, c.error = "mismatch", err
                            c.detail = f"the layout transforms gave wrong results end to end with {r.name}"
                    return
        for r in [r for r in native if r.status == "ok"][:4]:
            fns.append((r, plan.execute_call(plan.built[r.config.name], tensors, out)))
        engine_ms = [r.median_ms for r in cl_top]
        medians, mins, runs = time_interleaved([fn for _, fn in fns], options.final_iterations)
    except LibraryError as exc:  # e.g. cudnnTransformTensor failed: keep the NCHW graph's rows
        for c in cl_rows:
            if c.status == "ok":
                c.status, c.detail = "error", f"end to end: {exc}"
        return
    for (r, _fn), med, mn in zip(fns, medians, mins):
        r.median_ms, r.min_ms, r.runs = med, mn, runs
    # the transforms' GPU time, measured on the best four, added to the engine time of the rest
    copies = statistics.median(max(r.median_ms - e, 0.0) for r, e in zip(cl_top, engine_ms))
    for r in cl_rows:
        if any(r is c for c in cl_top):
            e = engine_ms[next(i for i, c in enumerate(cl_top) if c is r)]
            r.detail = f"timed end to end: engine {e:.4f} ms + transforms {r.median_ms - e:.4f} ms"
        elif r.median_ms is not None:
            r.detail = f"engine {r.median_ms:.4f} ms + transforms {copies:.4f} ms (measured on the best four)"
            r.median_ms += copies
            r.min_ms = (r.min_ms or 0.0) + copies
