"""oneDNN plans' autotune: :func:`rawconv.core.autotune.drive` (the one driver: the policy) over
oneDNN's half of the search (:class:`_Search`: the implementations, the plan's own tensors and
fpmath tolerance, timing in interleaved rounds or, isolated, in a child process), its tuning key,
the tuning cache's row and the record's detail. A mixin of :class:`rawconv.onednn.Convolution`
(listing, selection and execution stay there)."""
from __future__ import annotations

from typing import Any

from .primitive import TimedImplementation, _FPMATH_COMPUTE, _check_allow, key_options, timing_lines
from ..core.problem import int_arg
from ..core import autotune as _autotune, guard as _guard
from ..core.errors import ArgumentError, ArgumentTypeError
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
        self._check_live()
        iterations, warmup, allow = self._autotune_args(iterations, warmup, budget_s, check, use_cache, progress,
                                                        allow_known_bad)
        from ..core import isolate as _isolate

        search = _Search(self, _isolate.options(isolate), allow, include_ref, check, iterations, warmup)
        return _autotune.drive(self, budget_s, use_cache=use_cache, check=check, progress=progress, search=search)

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
        row.problem = self.problem
        return ResultTable([row], title=f"oneDNN autotune: {self.direction} {self.problem}")

class _Search(_autotune.Search):
    """oneDNN's half of :meth:`Autotune.autotune`'s search (:class:`rawconv.core.autotune.Search`):
    the implementations (``ref:*`` only with ``include_ref``), the plan's own tensors (with
    ``prepack`` the weight snapshot, reordered once per implementation), the fpmath mode's
    tolerance; each implementation's first call checked here, then every one (the wrong ones too:
    shown, never selected) timed together in interleaved rounds (:func:`rawconv.core.bench.time_rounds`),
    the contenders again in at least 3 fresh rounds. Isolated (``iso``): each implementation run,
    checked and timed in the child process (:mod:`rawconv.onednn.isolated`), the contenders timed
    again 3 rounds there (warmup 1, unchecked) and ranked by their best round."""

    noun = "implementation"
    name = "oneDNN autotune"
    time_wrong = True
    confirm_rounds = 3

    def __init__(self, plan, iso, allow: bool, include_ref: bool, check: bool, iterations: int, warmup: int):
        super().__init__(plan, check)
        self.iso, self.allow_known_bad, self.include_ref = iso, allow, include_ref
        self.iterations, self.warmup = iterations, warmup
        self.together = self.first_call = iso is None
        self.session = None
        self.temporary_snap = False
        self.timed: set = set()   # (isolated) the implementations timed once already

    def key(self):
        # the count the candidates run with: an isolated child's own count for a caller's-count plan
        return self.plan._tuning_key(self.allow_known_bad, self.iso.threads if self.iso is not None else None)

    def from_cache(self, record):
        return self.plan._from_cache(record, self.allow_known_bad)

    def candidates(self) -> list:
        return [i for i in self.plan.implementations if self.include_ref or not i.name.startswith("ref")]

    def selection(self):
        return self.plan._selected   # (None: oneDNN's first choice, resolved on the next call)

    def restore(self, before) -> None:
        # interrupted (KeyboardInterrupt) or failed: the plan runs what it ran before, not the
        # candidate that was being timed, and keeps no candidate's primitive and buffers
        self.plan._restore_selection(before)

    def finish(self, winner) -> None:
        self.plan._restore_selection(winner.index)

    def open(self) -> None:
        plan = self.plan
        tensors, self.call, self.temporary_snap = plan._autotune_tensors()
        # plans with post-ops (rawconv.fused) compute more than the convolution: not checked here
        if self.check and self.iso is None and not plan._post_ops:
            named = {"x": tensors.get("x"), "w": tensors.get("w"), "b": tensors.get("bias"), "dy": tensors.get("grad_y")}
            self.roles = {k: v for k, v in named.items() if v is not None}
            from ..core.check import tolerance_for

            self.tolerance = tolerance_for(plan.problem, plan.direction, compute=_FPMATH_COMPUTE.get(plan.fpmath))
        self.session = plan._autotune_session(tensors, self.iso)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
        if self.temporary_snap:
            self.plan._snap = None
            self.plan._hot = None

    def select(self, candidate) -> None:
        self.plan._selected = candidate.index

    def time(self, candidate, budget_s):
        """Isolated: ``candidate`` run in the child (its first pass checked against float64 there,
        unless the plan has post-ops; a later pass warmup 1, unchecked)."""
        again = candidate.index in self.timed
        self.timed.add(candidate.index)
        r = self.session.run(candidate, iterations=self.iterations, warmup=1 if again else self.warmup,
                             budget_s=budget_s, allow_known_bad=self.allow_known_bad,
                             check=not again and not self.plan._post_ops)
        if r["status"] != "ok":
            raise _autotune.CandidateFailed(r["status"], r["detail"])
        return _autotune.Timing(r["median_ms"], r["min_ms"], r["runs"])

    def time_together(self, candidates: list, budget_s, confirm: bool) -> list:
        """Interleaved rounds (``iterations`` calls each spread over up to 5 rounds; each round
        selects the implementation, untimed, before its calls), ``extra["rounds"]``; the
        confirmation at least 3 fresh rounds, ``extra["confirmed"]`` (``median_ms``, ``rounds``,
        ``flags``, and the contender's time over the pick's, round by round: ``ratio_to_pick``)."""
        from ..core import bench

        plan, call = self.plan, self.call
        rounds, calls = bench.round_plan(self.iterations)

        def run():
            return plan.execute(**call)

        timed = bench.time_rounds({str(i): (run, _select_fn(plan, c.index)) for i, c in enumerate(candidates)},
                                  rounds=max(rounds, 3) if confirm else rounds, calls=calls,
                                  warmup=1 if confirm else min(self.warmup, 1), budget_s=budget_s)
        out = []
        for i in range(len(candidates)):
            t = timed[str(i)]
            st = t.stats()
            if confirm:
                q = bench.ratio(t, timed["0"]) if i else None
                extra = {"confirmed": {"median_ms": st.median_ms, "rounds": t.as_dict(), "flags": t.flags(),
                                       "ratio_to_pick": q.as_dict() if q is not None else None}}
            else:
                extra = {"rounds": t.as_dict()}
            out.append(_autotune.Timing(st.median_ms, st.min_ms, st.runs, extra))
        return out

    def row(self, candidate, status: str = "ok", why: str = ""):
        nan = float("nan")
        return TimedImplementation(candidate, nan, nan, 0, status, why, problem=self.plan.problem)

    def detail(self, row) -> dict:
        impl = row.impl
        return {"impl": impl.name, "layouts": impl.layouts, "index": impl.index, "formats": dict(impl.formats),
                "reorders": list(impl.reorders), "scratchpad_bytes": impl.scratchpad_bytes,
                "weights": "prepacked" if self.plan.prepack and self.plan.direction != "backward_weights" else "per call"}

    def warnings(self, rows: list) -> list[str]:
        return timing_lines(rows)


def _select_fn(plan, index: int):
    """A function that selects implementation ``index`` of ``plan`` (a round's untimed setup)."""
    def select():
        plan._selected = index
    return select


# only rawconv's exceptions leave it (rawconv.core.guard), named as the public method it is
_guard.public_methods("autotune", "tuning_key", owner="rawconv.onednn.Convolution")(Autotune)
