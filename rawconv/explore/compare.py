"""The main job: run one convolution problem through torch and every rawconv implementation.

For each :class:`~rawconv.problem.ConvProblem` :func:`compare_problem` times

* torch's default path (and which backend torch picked: ``torch._C._select_conv_backend``),
* torch with ``torch.backends.mkldnn.enabled=False`` (torch's native CPU code),
* every oneDNN implementation rawconv lists (CPU problems),
* on CUDA problems: torch default, torch with ``cudnn.benchmark=True``, torch with cuDNN
  disabled, and every rawconv cuDNN (algo, math type) pair,

each checked against the float64 reference. :func:`compare` runs a list of problems and
returns :class:`Row` records; the CLI prints them as tables (``rawconv compare``).
"""
from __future__ import annotations

from typing import Callable, Iterable

from ..core import progress as _progress
from ..core.backend import backends as _registered, canonical_direction as _canonical_direction
from ..core.bench import LoadMonitor, LoadReport, TimeStats, geomean, time_cpu, time_cuda_queued  # noqa: F401
from ..core.problem import ConvProblem
from ..core.results import ResultTable
# the parts (this module is their face: ``rawconv.compare.X`` names each of them)
from .headline import headline  # noqa: F401  (the summary's lines; compare.headline)
from .confirm import CONFIRM_CARRY, CONFIRM_MORE, CONFIRM_ROUNDS, WEIGHT_SETS, confirm, picked, ranked  # noqa: F401
from ..pytorch.torch_choice import compare_detail, trace_detail, conv_backend_name, torch_onednn_trace  # noqa: F401
from .measure import (STATUSES, TORCH_WEIGHTS, Row, best_rawconv, first_choice, grad_output_for,  # noqa: F401
                      inputs_for, libraries, real_photo, status_category, threads, torch_backend,
                      _references, _time_rounds, _torch_rows)
from .onednn_rows import PREPACK_MODES, REF_MAX_SECONDS, _prepack_modes, onednn_rows  # noqa: F401
from .cudnn_rows import cudnn_tolerance  # noqa: F401
from .plan_rows import plan_rows
from .run_summary import (EXIT_CODES, exit_code, machine_report, summary, timing_warnings,  # noqa: F401
                          versions_line)
from .records import (_finite_json, record_untrusted, records, replay, replay_summary,  # noqa: F401
                      write_json)

__all__ = ["Row", "STATUSES", "status_category", "compare_problem", "compare", "real_photo", "inputs_for", "summary", "records", "replay",
           "exit_code", "EXIT_CODES", "grad_output_for", "libraries", "headline", "best_rawconv", "first_choice"]


# --------------------------------------------------------------------------- driver
def compare_problem(problem: ConvProblem, *, x=None, w=None, b=None, iterations: int = 10, warmup: int = 2,
                    budget_s: float = 0.5, backends: Iterable[str] | None = None,
                    photo: bool = False, fpmath: str = "strict", prepack: bool | str = "both",
                    include_ref: bool | str = True, ref_max_s: float = REF_MAX_SECONDS,
                    engines: str | int | None = None, allow_known_bad: bool = False, isolate=None,
                    direction: str = "forward", dy=None, libs: dict | None = None,
                    confirm_rounds: int = CONFIRM_ROUNDS) -> list[Row]:
    """Time and check ``problem`` on torch and every rawconv implementation; returns :class:`Row` s.

    ``direction``: "forward" (``F.conv{1,2,3}d``), "backward_data" (the input's gradient) or
    "backward_weights" (the weight's; "backward_filter" too): torch's rows run
    ``torch.ops.aten.convolution_backward`` (what autograd calls) for that output alone, rawconv's
    the library's backward primitives, all on the same gradient of the output (``dy``, default
    :func:`grad_output_for`) and checked against float64 (:func:`rawconv.check.reference`).

    ``iterations``/``warmup``: timed and untimed calls per candidate; ``budget_s``: seconds of
    timing per candidate at most (at least one timed call per round; a candidate whose first
    call, which also builds it, takes longer is timed by one more call alone). CPU problems run on
    oneDNN, ``cuda`` problems on cuDNN. On the CPU every candidate is run and checked first, then
    all are timed together in interleaved rounds (:func:`rawconv.bench.time_rounds`: up to
    :data:`rawconv.bench.MAX_ROUNDS` rounds sharing ``iterations`` calls per candidate; a call during which our
    threads waited for a CPU is tried again; each row's time is the median over rounds of its
    fastest clean call, ``extra["rounds"]`` says what was measured and ``extra["ratio"]`` holds
    torch default's time over the row's, taken within each round); then torch default,
    oneDNN's first choice and the best rows chosen on those rounds are timed again in
    ``confirm_rounds`` fresh rounds (``extra["confirmed"]``: the figures :func:`summary` and the
    headline use; 0 leaves the step out). CUDA problems are timed per candidate (GPU time, calls
    queued behind a GPU sleep). ``prepack`` (oneDNN): "both" (default) times each
    implementation whose weights need a reorder twice, with the weights read and reordered on
    every call (as torch's call does: the like-for-like row) and with a snapshot reordered once
    (a second row, labelled "(prepacked)"); False only the first, True only the second.
    ``include_ref``: oneDNN's reference implementations run (True), are dropped (False), or
    ("auto") run when one call is estimated at most ``ref_max_s`` seconds and are listed as
    "skipped" otherwise. oneDNN implementations that :mod:`rawconv.known_bad` lists get a "known
    bad" row unless ``allow_known_bad``; ``isolate`` (True, or ``rawconv._isolate.Isolation``/dict)
    runs them in a child process where a crash or hang becomes the row's status ("crashed:
    SIGSEGV", "timed out after N s"). Every row names the library and version that ran it
    (``extra["library"]``, :func:`libraries`) and what it did with the weights
    (``extra["weights"]``: "per call", "prepacked", "as given", None for backward_weights).
    ``backends``: the names whose rows run (None: ``"torch"`` and every registered backend,
    :func:`rawconv.core.backend.backends`; those of the problem's device run); a backend without
    a rows function of its own gets :func:`plan_rows`' rows, through its plans.
    Raises :class:`~rawconv.errors.ArgumentError` for an unknown direction or ``prepack``.
    """
    direction = _canonical_direction(direction)
    _prepack_modes(prepack)
    if direction != "forward" and problem.unbatched:
        problem = problem.with_(unbatched=False)
    if x is None:
        x, w, b = inputs_for(problem, photo=photo)
    if direction != "forward" and x.dim() == problem.ndim + 1:
        x = x.unsqueeze(0)
    if direction != "forward" and dy is None:
        dy = grad_output_for(problem, device=x.device)
    libs = libs or libraries()
    ref, ref_abs = _references(problem, direction, x, w, b, dy)
    on_gpu = problem.device.startswith("cuda")
    if on_gpu:
        # pure GPU time per call (calls queued behind a GPU sleep): host overheads differ by
        # entry point (cuDNN's legacy calls cost 50-150 us of host time) and would hide the kernels
        timer = lambda fn: time_cuda_queued(fn, iterations=iterations, warmup=warmup)  # noqa: E731
    else:   # CPU: every candidate is checked first, then all are timed together in interleaved rounds
        timer = None
    backends = ("torch", *(be.name for be in _registered())) if backends is None else tuple(backends)
    rows: list[Row] = []
    finalizers: list = []
    try:
        if "torch" in backends:
            rows += _torch_rows(problem, x, w, b, ref, ref_abs, timer, direction=direction, dy=dy, libs=libs)
        opts = dict(fpmath=fpmath, prepack=prepack, include_ref=include_ref, slow_s=budget_s, ref_max_s=ref_max_s,
                    allow_known_bad=allow_known_bad, isolate=isolate, timing=(iterations, warmup, budget_s),
                    engines=engines, direction=direction, dy=dy, libs=libs, finalizers=finalizers)
        for be in _registered("cuda" if on_gpu else "cpu"):   # every registered backend of this device
            fn = (be.rows_function() or plan_rows(be)) if be.name in backends else None
            if fn is not None:
                rows += fn(problem, x, w, b, ref, ref_abs, timer, **opts)
        if timer is None:
            _progress.note(f"{problem.name or problem.describe()}: interleaved rounds")
            _time_rounds(problem, rows, iterations=iterations, warmup=warmup, budget_s=budget_s,
                         confirm_rounds=confirm_rounds)
    finally:
        for r in rows:   # a run stopped part-way: nothing keeps the plans alive
            r.__dict__.pop("_pending", None)
        for free in finalizers:
            free()
    return rows


def compare(problems: list[ConvProblem], *, photo_first: bool = True, progress: bool | None = None,
            on_problem: Callable[[ConvProblem, list[Row]], None] | None = None, fit_threads: bool = False,
            **kw) -> ResultTable:
    """:func:`compare_problem` over a list (``kw``: its keyword arguments, e.g. ``direction``,
    ``prepack``); the first 2-D problem with 3 input channels gets the real photo when
    ``photo_first``. ``on_problem(problem, rows)`` is called after each.
    ``progress``: a tqdm bar over the problems naming the current layer and candidate (None:
    when stderr is a terminal or in a Jupyter kernel; see :mod:`rawconv._progress`).
    ``fit_threads``: before each CPU problem, judge what the other processes left us (over the
    previous problem, or a 0.3 s sample before the first) and, where the caller's thread count
    (``torch.get_num_threads()``) does not fit beside them, time that problem's rows, torch's
    call and rawconv's alike, at the count that does (:func:`rawconv.bench.fit_threads`; every
    row's ``extra["threads"]`` says which count it ran at and why); a problem timed at the count
    asked for while the other processes took the CPUs is timed again at the count that fits
    (``retimed``). Returns a
    :class:`~rawconv.results.ResultTable` of every row (``.plot()``, ``_repr_html_``, exports),
    whose title names the libraries and versions compared and whose exports carry the run's
    reliability (:meth:`~rawconv.results.ResultTable.reliability`)."""
    import torch

    from ..core import bench

    problems = list(problems)
    direction = _canonical_direction(kw.get("direction", "forward"))
    _prepack_modes(kw.get("prepack", "both"))
    kw.setdefault("libs", libraries())
    out = []
    requested = torch.get_num_threads()
    load = None   # what the other processes did over the previous problem
    with _progress.bar(progress, total=len(problems), desc="compare", unit="layer") as bar:
        for i, p in enumerate(problems):
            bar.note(str(p.name or p.describe()))
            fit = None
            if p.device == "cpu":
                if fit_threads and (load is None or not load.other_cpus_known):
                    load = bench.sample_load(0.3, requested)
                fit = bench.fit_threads(requested, load) if fit_threads else bench.ThreadFit(requested, requested,
                                                                                              None)
            retimed = False
            while True:
                monitor = LoadMonitor(requested)
                with threads(fit.threads if fit is not None and fit.reduced else None):
                    rows = compare_problem(p, photo=photo_first and i == 0 and p.ndim == 2 and p.c == 3, **kw)
                load = monitor.report()
                if not fit_threads or fit is None or fit.reduced or not bench.fit_threads(requested, load).reduced:
                    break
                # the other processes took the CPUs while it ran at the count asked for: its rows timed
                # joins, not work; once more at the count that fits
                fit, retimed = bench.fit_threads(requested, load), True
            if fit is not None:
                for r in rows:
                    r.extra["threads"] = dict(fit.as_dict(), retimed=retimed)
            out += rows
            bar.update()
            if on_problem is not None:
                with bar.write_mode():
                    on_problem(p, rows)
    what = "" if direction == "forward" else f" {direction}"
    return ResultTable(out, title=f"rawconv compare{what}: {len(problems)} problem(s); "
                                  f"{versions_line(kw['libs'], problems)}")


# every public entry point raises only rawconv's exception classes (rawconv._guard)
from ..core import guard as _guard  # noqa: E402

_guard.guard_module(globals(), "compare_problem", "compare", "real_photo", "inputs_for", "summary", "write_json",
                    "records", "replay", "replay_summary", "grad_output_for", "libraries", "headline")
