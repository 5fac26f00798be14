"""The search's plan interface and rows (a part of :mod:`rawconv.cudnn.graph.search`, the face, which hands
its names on): what the search knows of a plan (:class:`SearchPlan`, :class:`Config`, :class:`Built`),
its options (:class:`SearchOptions`), its rows (:class:`TimedConfig`, :func:`ranked`), the timing
(:func:`time_once`, :func:`time_reps`, :func:`time_interleaved`: set on the face, they are set here,
where the other parts read them) and knob values (:func:`knob_combinations`, :func:`knob_values`)."""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

from ...core.autotune import check_budget as _check_budget
from ...core.errors import ArgumentError
from ...core.check import ErrorStats
from ...core.results import Result
from ...core.problem import ConvProblem

log = logging.getLogger("rawconv.search")
FACE = "rawconv.cudnn.graph.search"   # where this module's names live (the face): pickles, messages

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



# (the face's, as before the split: pickles, the API reference)
for _cls in (Config, Built, SearchPlan, SearchOptions, TimedConfig):
    _cls.__module__ = FACE
del _cls
