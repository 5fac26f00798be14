"""oneDNN plans' autotune: the search over the implementations (checked against float64, timed,
the close contenders timed again), its tuning key, the tuning cache's row and the record. A mixin of
:class:`rawconv.onednn.Convolution` (listing, selection and execution stay there); the cache half
runs :mod:`rawconv.core.autotune`, the driver the three backends share."""
from __future__ import annotations

from typing import Any

from .primitive import TimedImplementation, _FPMATH_COMPUTE, _check_allow, _warn_timings, key_options
from ..core.problem import int_arg
from ..core import autotune as _autotune, guard as _guard
from ..core.errors import ArgumentError, ArgumentTypeError, NotSupportedError
from ..core.results import ResultTable

__all__ = ["Autotune"]


class Autotune:
    """:meth:`autotune` and its parts, for :class:`rawconv.onednn.Convolution`."""

    def autotune(self, iterations: int = 10, warmup: int = 2, *, include_ref: bool = False,
                 budget_s: float | None = None, allow_known_bad: bool | None = None,
                 isolate: Any = False, check: bool = True, use_cache: bool | None = None,
                 progress: bool | None = None) -> ResultTable:
        """Time every implementation on this plan's tensors (random ones of the problem's shape
        when the plan was built from a problem), check each against float64, and select the
        fastest correct one (by median).

        Each implementation is built and run once, its result checked against the float64
        reference (:func:`rawconv.check.reference`, the tolerance of :func:`rawconv.check.tolerance_for`
        for this direction and fpmath mode; ``check=False`` skips it, and plans with post-ops, as
        :class:`rawconv.fused.FusedConvolution`, are not checked here), run ``warmup`` times,
        then timed over ``iterations`` calls (``time.perf_counter``, per call, reorders included;
        with ``prepack`` the calls use the weight snapshot, reordered once per implementation (a
        plan built from a problem without a snapshot snapshots its random example weights for
        the timing only), else the weights are reordered on every call, as the function forms
        do); the correct implementations within 15% of the
        fastest are then timed again over three interleaved rounds and ranked by their best
        round's median. ``ref:any`` is skipped unless ``include_ref`` (it is orders of magnitude
        slower). ``budget_s``: seconds of wall time for the whole search of this problem and direction
        (:func:`rawconv.core.autotune.check_budget`; None, the default: no limit): the timing rounds
        and the confirmation share what the checks leave; every implementation still gets its
        checked first call and at least one timed call per round, so a budget shorter than those
        is overrun. Known-bad
        implementations (:mod:`rawconv.known_bad`) are skipped unless ``allow_known_bad``
        (default: the plan's setting). Returns a :class:`~rawconv.results.ResultTable`: the
        correct rows fastest first (``median_ms``: the best median seen; ``min_ms``: the fastest
        call of any pass; ``spread``: median / min; ``accuracy``: the error against float64), then the rows outside tolerance
        (``"wrong"``, timed, never selected), then the rows that were not timed (``status`` says
        why, NaN times). Warns (:class:`rawconv.bench.TimingWarning`) when other processes
        oversubscribed the CPUs while it timed, or a median/min spread exceeds
        :data:`rawconv.bench.SPREAD_LIMIT`: the ranking may then be noise.

        Tuning records: the choice is stored as a :class:`rawconv.tuning.TuningRecord`
        (:attr:`tuning_record`, also the table's ``record``) in the tuning cache
        (:func:`rawconv.tuning.cache`: in memory, and in its file when one is configured with
        ``$RAWCONV_TUNING_CACHE`` or :func:`rawconv.tuning.set_cache_file`). Its key holds the
        problem, direction, fpmath mode, algorithm, weights layout, torch's thread count, the
        oneDNN version, the CPU model and oneDNN's effective ISA. ``use_cache``: look the
        problem up there first and, on a hit whose choice oneDNN still offers, select it without
        timing anything (one row, phase ``"cache"``); None (the default): only when a cache file
        is configured, so that the first search happens once per machine.

        ``isolate=True`` (or an :class:`rawconv._isolate.Isolation` / dict: ``timeout_s``, ``env``,
        ``threads``) times every candidate in a child process (:mod:`rawconv._isolate`) and
        checks its output against float64 in this process: a candidate that crashes, hangs past
        the timeout or gives a wrong result gets a row with that status and is never selected.
        ``progress``: a tqdm bar naming the implementation being timed (None: when stderr is a
        terminal or in a Jupyter kernel; :mod:`rawconv._progress`).
        Raises :class:`NotSupportedError` when no implementation could be timed correctly.
        """
        from ..core.bench import LoadMonitor

        self._check_live()
        iterations, warmup, allow = self._autotune_args(iterations, warmup, budget_s, check, use_cache, progress,
                                                        allow_known_bad)
        from ..core import isolate as _isolate

        iso = _isolate.options(isolate)
        # the count the candidates run with: an isolated child's own count for a caller's-count plan
        key = self._tuning_key(allow, iso.threads if iso is not None else None)
        hit = _autotune.cached(self, key, use_cache, lambda rec: self._from_cache(rec, allow))
        if hit is not None:
            return hit
        budget = _autotune.Budget(budget_s)   # wall time for the whole search (a cache hit spent none)
        tensors, call, temporary_snap = self._autotune_tensors()
        checked = self._autotune_reference(tensors, check, iso)
        wrong, skipped = [], []
        monitor = LoadMonitor() if iso is None else None
        impls = [i for i in self.implementations if include_ref or not i.name.startswith("ref")]
        before = self._selected
        try:
            session = self._autotune_session(tensors, iso)
            try:
                rows = self._autotune_search(impls, allow, session, call, checked, iterations, warmup,
                                             budget, progress, wrong, skipped)
            finally:
                if session is not None:
                    session.close()
                if temporary_snap:
                    self._snap = None
                    self._hot = None
        except BaseException:
            # interrupted (KeyboardInterrupt) or failed: the plan runs what it ran before, not the
            # candidate that was being timed, and keeps no candidate's primitive and buffers
            self._restore_selection(before)
            raise
        return self._autotune_select(key, monitor, rows, wrong, skipped)

    def _restore_selection(self, index) -> None:
        """Select ``index`` again (None: oneDNN's first choice, resolved on the next call) and drop
        every other built implementation (their primitives and buffers) and the random example
        tensors the search made."""
        self._selected = index
        self._examples = None
        for i in list(self._built):
            if i != index:
                del self._built[i]

    def _autotune_session(self, tensors: dict, iso):
        """The child-process session :meth:`autotune` times in with ``iso`` (the isolation options;
        :mod:`rawconv.onednn.isolated`) on ``tensors``. Returns it, or None when not isolated."""
        from . import isolated as _isolated

        if iso is None:
            return None
        return _isolated._onednn_session(self.problem, self.direction, tensors, algorithm=self.algorithm,
                                         fpmath=self.fpmath, w_layout=self.w_layout, prepack=self.prepack,
                                         iso=iso, plan_threads=self.threads_arg, post_ops=self._post_ops)

    def _autotune_select(self, key, monitor, rows: list, wrong: list, skipped: list) -> ResultTable:
        """Finish :meth:`autotune`: warn about noisy timings (``monitor``), select the fastest of
        ``rows`` (dropping the other built implementations), and keep the table and its record under
        ``key`` (the tuning cache). Returns the table: ``rows``, then ``wrong`` (sorted), then
        ``skipped``."""
        warned = _warn_timings(monitor, rows)
        self._restore_selection(rows[0].impl.index)
        wrong.sort(key=lambda r: r.median_ms)
        out = self._table(rows + wrong + skipped)
        return _autotune.keep(self, out, self._record(key, out[0], warned))

    def _autotune_args(self, iterations, warmup, budget_s, check, use_cache, progress, allow_known_bad) -> tuple:
        """Check :meth:`autotune`'s scalar arguments (``iterations``, ``warmup``, ``budget_s``,
        ``check``, ``use_cache``, ``progress``, ``allow_known_bad``). Returns ``(iterations, warmup,
        allow)``: the counts as ints and the known-bad setting in effect (the plan's when None);
        raises :class:`ArgumentTypeError` / :class:`ArgumentError` on the first bad one."""
        from ..core import progress as _progress

        it, wu = int_arg(iterations), int_arg(warmup)
        if it is None or wu is None:
            raise ArgumentTypeError(f"iterations and warmup must be ints, got {iterations!r} and {warmup!r}")
        if it < 1 or wu < 0:
            raise ArgumentError(f"iterations must be >= 1 and warmup >= 0, got {iterations} and {warmup}")
        _autotune.check_budget(budget_s)
        for name, v in (("check", check), ("use_cache", use_cache)):
            if v is not None and not isinstance(v, bool):
                raise ArgumentTypeError(f"{name} must be True or False, got {v!r}")
        _progress.enabled(progress)   # validates
        allow = self.allow_known_bad if allow_known_bad is None else _check_allow(allow_known_bad)
        return it, wu, allow

    def _autotune_tensors(self) -> tuple[dict, dict, bool]:
        """The tensors :meth:`autotune` times on: the plan's example tensors, with ``prepack`` the
        weight snapshot (snapshotting the example weights when the plan has none). Returns
        ``(tensors, call, temporary_snap)``: every tensor, the ones each call passes (no weights
        with ``prepack``), and whether the snapshot was made here (to drop after the search)."""
        tensors = call = self._example_tensors()
        temporary_snap = False
        if self.prepack and "w" in tensors:   # time as execute(x) runs: on the snapshot, reordered once
            if self._snap is None:
                self._snapshot(tensors["w"])
                temporary_snap = True
            else:
                tensors = dict(tensors, w=self._snap[0])
            call = {k: v for k, v in tensors.items() if k != "w"}
        return tensors, call, temporary_snap

    def _autotune_reference(self, tensors: dict, check: bool, iso) -> tuple:
        """The float64 reference :meth:`autotune` checks each implementation against, for
        ``tensors``. Returns ``(ref, ref_abs, tol)``, all None when nothing is checked here
        (``check=False``, isolated, an empty problem, or a plan with post-ops)."""
        ref = ref_abs = tol = None
        # plans with post-ops (rawconv.fused) compute more than the convolution: not checked here
        if check and iso is None and not self.problem.is_empty and not self._post_ops:
            from ..core.check import reference, tolerance_for

            named = {"x": tensors.get("x"), "w": tensors.get("w"), "b": tensors.get("bias"), "dy": tensors.get("grad_y")}
            ref, ref_abs = reference(self.problem, self.direction, {k: v for k, v in named.items() if v is not None})
            tol = tolerance_for(self.problem, self.direction, compute=_FPMATH_COMPUTE.get(self.fpmath))
        return ref, ref_abs, tol

    def _autotune_search(self, impls, allow, session, call, checked, iterations, warmup, budget, progress,
                         wrong, skipped) -> list:
        """Check each of ``impls`` (:meth:`_autotune_one`; ``checked``: ``(ref, ref_abs, tol)``),
        then time every correct one in interleaved rounds (:meth:`_time_in_rounds`; isolated: each
        timed in the child, the close contenders again: :meth:`_retime_close`), within ``budget``
        (a :class:`rawconv.core.autotune.Budget`: the rounds share 70% of what the checks left,
        the confirmation the rest; isolated, each candidate an even share). Returns the correct
        rows, fastest first; the wrong and untimed ones go to ``wrong`` and ``skipped``. Raises
        :class:`NotSupportedError` when no implementation could be timed correctly."""
        from ..core import progress as _progress
        from ..core.bench import time_cpu

        ref, ref_abs, tol = checked
        rows = []
        with _progress.bar(progress, total=len(impls), desc="oneDNN autotune", unit="impl") as bar:
            for k, impl in enumerate(impls):
                bar.note(impl.choice)
                try:
                    self._autotune_one(impl, allow, session, call, ref, ref_abs, tol, iterations, warmup,
                                       budget.share(len(impls) - k, 0.7), rows, wrong, skipped, time_cpu)
                finally:
                    bar.update()
            if session is None:
                self._time_in_rounds(rows + wrong, call, iterations, warmup, budget.share(len(rows + wrong), 0.7))
        if not rows:
            why = "; ".join(f"{r.impl.name}: {r.status}" for r in wrong + skipped)
            raise NotSupportedError("no implementation could be timed correctly for " + self.problem.describe()
                                    + (f" ({why})" if why else ""))
        rows.sort(key=lambda r: r.median_ms)
        if session is None:
            self._confirm(rows, call, iterations, budget.share(min(4, len(rows))))
            return rows
        return self._retime_close(rows, skipped, session, call, allow, iterations, budget, time_cpu)

    def _time_in_rounds(self, rows: list, call: dict, iterations: int, warmup: int, budget_s) -> None:
        """Time ``rows`` (checked, not yet timed) together in interleaved rounds
        (:func:`rawconv.bench.time_rounds`: ``iterations`` calls each spread over up to 5 rounds;
        each round selects the row's implementation, untimed, before its calls) and fill their
        times and ``extra["rounds"]``. Returns None."""
        from ..core import bench

        if not rows:
            return
        rounds, calls = bench.round_plan(iterations)

        def run():
            return self.execute(**call)

        timed = bench.time_rounds({str(i): (run, _select_fn(self, r.impl.index)) for i, r in enumerate(rows)},
                                  rounds=rounds, calls=calls, warmup=min(warmup, 1), budget_s=budget_s)
        for i, r in enumerate(rows):
            t = timed[str(i)]
            st = t.stats()
            r.median_ms, r.min_ms, r.runs = st.median_ms, st.min_ms, st.runs
            r.extra["rounds"] = t.as_dict()

    def _confirm(self, rows: list, call: dict, iterations: int, budget_s) -> None:
        """The confirmation step: the fastest of ``rows`` (sorted; picked on the first rounds) and
        the close contenders (within 15%, at most 4) timed again in fresh interleaved rounds,
        ``extra["confirmed"]`` holding what those measured (``median_ms``, ``rounds``, ``flags``,
        and the contender's time over the pick's, round by round: ``ratio_to_pick``). The pick
        stays the pick; its record reports the fresh rounds' time (no winner's curse). Returns None."""
        from ..core import bench

        close = [r for r in rows[:4] if r.median_ms <= rows[0].median_ms * 1.15]
        rounds, calls = bench.round_plan(iterations)

        def run():
            return self.execute(**call)

        timed = bench.time_rounds({str(i): (run, _select_fn(self, r.impl.index)) for i, r in enumerate(close)},
                                  rounds=max(rounds, 3), calls=calls, warmup=1, budget_s=budget_s)
        pick = timed["0"]
        for i, r in enumerate(close):
            t = timed[str(i)]
            q = bench.ratio(t, pick) if i else None
            r.extra["confirmed"] = {"median_ms": t.stats().median_ms, "rounds": t.as_dict(), "flags": t.flags(),
                                    "ratio_to_pick": q.as_dict() if q is not None else None}

    def _retime_close(self, rows, skipped, session, call, allow, iterations, budget, time_cpu) -> list:
        """Isolated autotune (each implementation timed in the child process): the close contenders
        (within 15% of the best of ``rows``, sorted) timed again, round after round, and ranked by
        their best round: one noisy pass (a descheduled OpenMP thread) must not decide. Returns the
        rows re-sorted; one that fails when run again goes to ``skipped``. Raises
        :class:`NotSupportedError` when none is left."""
        nan = float("nan")
        close = [r for r in rows[:4] if r.median_ms <= rows[0].median_ms * 1.15]
        if len(close) > 1:
            best = {id(r): r.median_ms for r in close}
            fastest = {id(r): r.min_ms for r in close}   # the fastest single call over every round
            dead = set()
            for rnd in range(3):
                for r in close:
                    if id(r) in dead:
                        continue
                    rr = session.run(r.impl, iterations=iterations, warmup=1,
                                     budget_s=budget.share(len(close) * (3 - rnd)), allow_known_bad=allow, check=False)
                    if rr["status"] != "ok":   # it ran fine before: report what it did now
                        dead.add(id(r))
                        skipped.append(TimedImplementation(r.impl, nan, nan, r.runs, rr["status"],
                                                           "when timed again: " + rr["detail"]))
                        continue
                    best[id(r)] = min(best[id(r)], rr["median_ms"])
                    fastest[id(r)] = min(fastest[id(r)], rr["min_ms"])
            retimed = []
            for r in close:
                if id(r) not in dead:
                    # median: the best round's (ranks them); min: the fastest call of any round
                    t = TimedImplementation(r.impl, best[id(r)], fastest[id(r)], r.runs)
                    t.accuracy = r.accuracy
                    retimed.append(t)
            rows = sorted(retimed + [r for r in rows[len(close):] if id(r) not in dead],
                          key=lambda r: r.median_ms)
            if not rows:
                raise NotSupportedError("no implementation could be timed for " + self.problem.describe())
        return rows

    def _autotune_one(self, impl, allow, session, tensors, ref, ref_abs, tol, iterations, warmup, budget_s,
                      rows, wrong, skipped, time_cpu) -> None:
        """Check and time one implementation for :meth:`autotune`, appending its row (``tensors``:
        :meth:`execute`'s keyword arguments; a plan with a weight snapshot gets none for ``w``)."""
        nan = float("nan")
        if impl.known_bad and not allow:
            skipped.append(TimedImplementation(impl, nan, nan, 0, "known bad", detail=
                                               f"not run (allow_known_bad=True runs it): {impl.known_bad}"))
            return
        if session is not None:
            # plans with post-ops compute more than the convolution the float64 check knows: not
            # checked, as below
            r = session.run(impl, iterations=iterations, warmup=warmup, budget_s=budget_s,
                            allow_known_bad=allow, check=not self._post_ops)
            if r["status"] == "ok":
                rows.append(TimedImplementation(impl, r["median_ms"], r["min_ms"], r["runs"]))
            else:
                skipped.append(TimedImplementation(impl, nan, nan, r["runs"], r["status"], r["detail"]))
            return
        self._selected = impl.index
        err = None
        try:
            if ref is not None:
                from ..core.check import check as _check_result

                y = self.execute(**tensors)
                err = _check_result(self.problem, y[0] if isinstance(y, tuple) else y, ref, ref_abs, tol)
            else:   # the first call builds it (JIT code, reorders): untimed, as a warm-up
                self.execute(**tensors)
        except NotSupportedError as exc:
            skipped.append(TimedImplementation(impl, nan, nan, 0, "not supported", str(exc)))
            return
        # timed afterwards, with the others, in interleaved rounds (_time_in_rounds)
        if err is not None and not err.ok:
            row = TimedImplementation(impl, nan, nan, 0, "wrong",
                                      f"outside tolerance vs float64: max rel err {err.max_rel:.2e}, "
                                      f"{err.ratio:.3g}x the tolerance" + (f", {err.nan} non-finite" if err.nan
                                                                            else ""))
            row.accuracy = err
            wrong.append(row)
            return
        row = TimedImplementation(impl, nan, nan, 0)
        row.accuracy = err
        rows.append(row)

    def _table(self, rows) -> ResultTable:
        out = ResultTable(rows, title=f"oneDNN autotune: {self.direction} {self.problem}")
        for r in out:
            r.problem = self.problem
        return out

    # ------------------------------------------------------------------ tuning records
    def tuning_key(self):
        """The :class:`rawconv.tuning.TuningKey` :meth:`autotune` with its defaults stores its
        choice under (the plan contract's, :class:`rawconv.core.backend.Plan`)."""
        self._check_live()
        return self._tuning_key(self.allow_known_bad)

    def _tuning_key(self, allow_known_bad: bool, timed_threads: int | None = None):
        """The :class:`rawconv.tuning.TuningKey` of an autotune of this plan (see :meth:`autotune`).
        ``timed_threads``: the count a caller's-count plan (``self.threads`` None) is timed with
        when that is not this thread's torch count (an isolated child's ``threads``)."""
        from ..core import tuning

        threads = self.threads if self.threads is not None else timed_threads
        options = key_options(self.fpmath, self.algorithm, self.w_layout, allow_known_bad, threads)
        if self._post_ops:   # a fused plan (rawconv.fused) is another question than the plain convolution
            options["post_ops"] = [list(op) for op in self._post_ops]
        return tuning.TuningKey.for_backend("onednn", self.problem, self.direction, options)

    def _from_cache(self, hit, allow: bool) -> ResultTable:
        """A tuning-cache record ``hit`` selected, as autotune's one-row table (phase ``"cache"``);
        raises :class:`NotSupportedError` / :class:`ArgumentError` when this oneDNN no longer offers
        its choice for the problem (:func:`rawconv.core.autotune.cached` then searches)."""
        from ..core.check import ErrorStats

        self._selected = i = self._resolve(hit.choice, allow)
        impl = self._impls[i]
        row = TimedImplementation(impl, *_autotune.hit_times(hit), 0, "ok",
                                  f"from the tuning cache (recorded {hit.created})")
        row.phase = "cache"
        if hit.error is not None and hit.error.get("max_rel") is not None:
            e = hit.error
            row.accuracy = ErrorStats(e.get("max_abs") or 0.0, e["max_rel"], e.get("ratio") or 0.0, 0)
        return self._table([row])

    def _record(self, key, row, warned=None):
        """The tuning record of autotune's choice ``row``; ``warned``: the timing warnings of the
        autotune (its ``timing``: a time measured while they applied is not one to drift against)."""
        from ..core import tuning

        impl = row.impl
        detail = {"impl": impl.name, "layouts": impl.layouts, "index": impl.index,
                  "formats": dict(impl.formats), "reorders": list(impl.reorders),
                  "scratchpad_bytes": impl.scratchpad_bytes,
                  "weights": "prepacked" if self.prepack and self.direction != "backward_weights" else "per call"}
        conf = row.extra.get("confirmed") if isinstance(row.extra, dict) else None
        flags = list(row.timing_flags)
        timing = None if warned is None else {"trustworthy": not warned and not flags, "run_trustworthy": not warned,
                                              "run_warnings": list(warned), "row_flags": flags}
        # the time of the pick as the fresh rounds measured it (picked on others: no winner's curse)
        med = conf["median_ms"] if isinstance(conf, dict) and conf.get("median_ms") is not None else row.median_ms
        return tuning.TuningRecord(key, impl.choice, detail, self.problem.layout, med, row.min_ms,
                                   row.accuracy, label=self.problem.name or "", timing=timing)


def _select_fn(plan, index: int):
    """A function that selects implementation ``index`` of ``plan`` (a round's untimed setup)."""
    def select():
        plan._selected = index
    return select


# only rawconv's exceptions leave it (rawconv.core.guard), named as the public method it is
_guard.public_methods("autotune", "tuning_key", owner="rawconv.onednn.Convolution")(Autotune)
