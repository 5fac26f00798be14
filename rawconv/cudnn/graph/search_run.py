"""One search (a part of :mod:`rawconv.cudnn.graph.search`, the face, which hands its names on):
:class:`Search` runs the phases on one plan; :func:`search` and :func:`search_relayout` (the plan and
its channels_last twin) are the entry points. What a test sets on the face is read where it lives:
the timing as ``_sp.time_*`` (:mod:`.search_plan`), the runtime compilations' state as
``_rtc._rtc_inflight`` / ``_rtc.compiling`` (:mod:`.search_rtc`); :func:`search`, set on the face,
is set here, where :func:`search_relayout` calls it."""
from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from typing import Sequence

from ...core import progress as _progress
from ...core.errors import LibraryError, NotSupportedError
from . import search_plan as _sp, search_rtc as _rtc
from .search_plan import RTC, SearchOptions, SearchPlan, TimedConfig, _logged, ranked
from .search_rtc import build_in_background, compile_in_background, rtc_busy, try_late, worth_retry
from .search_phases import knob_search, random_search, seed_configs

log = logging.getLogger("rawconv.search")
OVERTIME_S = 3.0   # Search.overtime: at least this long past the budget when nothing ran correctly in it

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
                if not _rtc.compiling(self.plan) and not (rtc_busy() and skipped()):
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
            return key in _rtc._rtc_inflight or (rtc and ec.name not in self.plan.built and rtc_busy())
        while wait() and time.perf_counter() < self.deadline:
            time.sleep(0.002)
        self.trial(ec, "overtime")

    def retime(self) -> None:
        """The best eight re-timed in 5 interleaved rounds (``final_iterations`` groups in all);
        median of the round medians."""
        top = sorted((r for r in self.rows.values() if r.status == "ok"), key=lambda r: r.median_ms)[:8]
        fns = [self.plan.call_for(self.plan.built[r.config.name], self.tensors, self.out) for r in top]
        medians, mins, runs = _sp.time_interleaved(fns, self.opts.final_iterations)
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
                running = (id(self.plan), ec.name) in _rtc._rtc_inflight
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
        first = _sp.time_once(fn)  # one timed call, whose output is checked
        if self.opts.check:
            err = self.plan.check_output(self.out, b.config, self.ref, self.ref_abs)
        iterations = self.opts.iterations
        if first.median_ms * 1e-3 * (iterations + 3) > self.deadline - time.perf_counter():
            return first, err  # past the budget: one run is enough
        # the first call also loads the kernel's module (CUDA lazy loading): judge by a second
        probe = _sp.time_once(fn)
        best = self.best_ms
        if best is not None and probe.median_ms > max(3 * best, best + 0.05):
            # far slower than the best so far (one call timed alone may include launch time,
            # hence the margin): one run is enough
            return probe, err
        return _sp.time_reps(fn, iterations, warmup=0, first_ms=probe.min_ms), err


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
        medians, mins, runs = _sp.time_interleaved([fn for _, fn in fns], options.final_iterations)
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


Search.__module__ = "rawconv.cudnn.graph.search"   # (the face's, as before the split)
