"""A graph plan's autotune: the entry point of the engine-config search (:mod:`rawconv.cudnn.graph.search`
does the searching), the example tensors, its tuning key, the tuning cache's row and record (the
cache half runs :mod:`rawconv.core.autotune`). A mixin of :class:`rawconv.cudnn_graph.GraphConvolution`."""
from __future__ import annotations

import time
from . import search as _search
from .. import _cuda
from ...core import autotune as _autotune
from ...core import tuning
from ...core.errors import NotSupportedError
from ...core.problem import random_tensor
from ...core.problem import seed_offset
from ...core.problem import to_layout
from ...core.results import ResultTable
from .search import TimedConfig
from .. import graph as _o   # the package face: read at call time (still being defined when this is imported)
from ...core import guard as _guard

__all__ = ["Autotune"]


class Autotune:
    """Part of :class:`rawconv.cudnn.graph.GraphConvolution` (see the module's notes)."""

    # ------------------------------------------------------------------ autotune
    def _example(self, seed: int = 0) -> dict:
        p = self.problem
        dev = f"cuda:{self.device_index}"
        x, w, b = self._x, self._w, self._b
        if x is None or w is None:   # drawn on the GPU: a CPU float64 draw of a ResNet-50 layer's
            # tensors took most of a 0.6 s autotune budget on the H200's host
            x, w, b = p.make_inputs(seed=seed, device=dev, on_device=True)
        w = to_layout(w, p.layout)
        if self.direction == "forward":
            return {"x": x, "w": w, "b": b}
        dy = random_tensor(p.y_shape, seed_offset(seed, 3), dev, p.torch_dtype, p.layout)
        if self.direction == "backward_data":
            return {"dy": dy, "w": w}
        return {"x": x, "dy": dy}

    @_cuda.on_plan_device
    def autotune(self, *, budget_s: float = 10.0, workspace_limit: int | None = None,
                 deterministic_only: bool = False, no_tensor_cores: bool | None = None,
                 no_down_conversion: bool = True, no_reduced_precision: bool = False,
                 iterations: int = 5, final_iterations: int = 30, check: bool = True,
                 use_cache: bool = True, seed: int = 0,
                 include_runtime_compiled: bool = True, patience: int | None = 200,
                 relayout: bool = False, seed_from_cache: bool = True,
                 progress: bool | None = None) -> list[TimedConfig]:
        """Search engine configs for the fastest correct one, select it and return the ranked table.

        Candidates, in order, while ``budget_s`` seconds (wall time, finalization included) last:
        the configs of heuristic modes instant, B and FALLBACK; with ``seed_from_cache``, the
        configs that won for other problems in the tuning cache (same direction, cuDNN and GPU;
        same dimensions, data type, layout and activation first, newest first; only those the
        filters below allow; at most 8 runtime-compiled ones, whose compilations the phase waits
        for at most a fifth of the budget in all, and 16 others; phase ``"cache seed"``): the
        knob values that suit one layer often suit its neighbours, and a runtime-compiled
        engine's default knobs say little about its best ones; every engine with its default
        knobs, runtime-compiled engines last (those no heuristic mode proposes only with
        ``include_runtime_compiled``); then, for
        the fastest few engines (ranked by their first measurement), neighbouring knob values (one
        knob at a time, keeping improvements) from their best config so far; then random knob
        combinations (seeded by ``seed``), drawn more often for the faster engines, each new best
        followed by a neighbour search from it. The search ends when the budget is spent, every
        combination was tried, or ``patience`` candidates in a row (after the default-knob phase)
        brought no gain of 0.5% or more (``None``: use the whole budget). When no candidate ran
        correctly within the budget (a fused graph's engines are mostly runtime-compiled, and their
        compilations can outlast a short budget), the search goes on past it (phase
        ``"overtime"``, at most ``rawconv._search.OVERTIME_S`` = 3 s or twice the budget): it waits
        for the compilations still running and tries each as it ends, then finalizes the heuristic
        configs not yet tried, until one runs correctly.
        Runtime-compiled engines (behavior note RUNTIME_COMPILATION) compile in background threads,
        the values of one knob (or one batch of random draws) at once, at most min(8, CPU count) at
        a time in the process: a compilation still running when the budget ends (or, for an engine's default
        knobs, after a fifth of the budget) is left to finish there (row status ``"over budget"``;
        one took 21 s on an H200 for a 13 ms kernel) while the search goes on, and is tried once
        it has finished (before the knob phases, after each round of random draws, and in the last
        5% of the budget, at most 0.5 s, which the search phases and their compilation waits leave
        for it, waiting there for this plan's compilations still running); runtime-compiled
        candidates met while that many compile are skipped and retried likewise.
        Each candidate: execution plan finalized, output filled with NaN, run once and checked
        against the float64 reference within the tolerance its numerical notes imply (``check``),
        then timed on the GPU (``iterations`` groups of back-to-back calls queued while the GPU is
        held busy, CUDA events around each group, so that the host's launch time is left out;
        median per call; a candidate whose second, warm run took over 3x the
        best so far, or one that would overrun the budget, keeps that single run); the best eight are then
        timed again in 5 interleaved rounds (``final_iterations`` groups in all, so that clock
        drift hits each alike), median of the round medians.

        Filters: ``workspace_limit`` (bytes), ``deterministic_only``, ``no_tensor_cores`` (default:
        True for float32 unless the plan allows TF32), ``no_down_conversion``,
        ``no_reduced_precision``. With ``use_cache`` a problem already in the tuning cache (see
        :func:`tuning_cache`) selects its stored config without searching (one row, phase
        ``"cache"``). Rows: ``ok`` ranked by median time, then mismatches, then the rest.

        ``relayout`` (NCHW plans only): also search the channels_last (NHWC) graph of the same
        problem, whose engines are the tensor-core ones that NCHW graphs mostly lack or run
        through internal transposes. Half the budget goes to each graph. A channels_last config
        runs on channels_last buffers the plan owns (:attr:`transpose_bytes`): the inputs are
        transformed into them and the output back (``cudnnTransformTensor``) on every call. The
        best four configs of each graph then run as :meth:`execute` runs them (transforms
        included; each channels_last one checked against float64 end to end first) and are timed
        on the GPU in interleaved rounds; the other channels_last rows add the transforms' GPU
        time (median over those four) to their engine time (``detail`` says which). The host time
        of the transforms' calls (``cudnnTransformTensor`` costs several µs each) is not in these
        GPU times. Those rows are named ``"nhwc:eng72{k17=1,k24=4}"``, the name :meth:`select`
        and :func:`forward` take, and their :attr:`TimedConfig.layout` is ``"nhwc"``; the top
        row is what gets selected.
        ``progress``: a tqdm bar of the budget's seconds naming the phase and config being tried
        (None: when stderr is a terminal or in a Jupyter kernel; :mod:`rawconv._progress`). The
        choice's :class:`rawconv.tuning.TuningRecord` is :attr:`tuning_record` (and the table's
        ``record``).
        Raises :class:`NotSupportedError` when no candidate runs correctly.
        """
        self._check_live()
        filters = dict(deterministic_only=deterministic_only, no_tensor_cores=no_tensor_cores,
                       no_down_conversion=no_down_conversion, no_reduced_precision=no_reduced_precision)
        opts = _search.SearchOptions(budget_s, workspace_limit, filters, iterations, final_iterations, check, use_cache,
                                     seed, include_runtime_compiled, patience, relayout, seed_from_cache)
        return self._autotune_run(opts, progress)

    def _autotune_run(self, opts: _search.SearchOptions, progress: bool | None) -> list[TimedConfig]:
        """:meth:`autotune` once its arguments are checked (``opts``; ``progress``: the bar): the
        tuning cache's row on a hit, else the search (of both layouts with ``opts.relayout`` on an
        NCHW plan), the best config committed. Returns the ranked table with its record kept; raises
        :class:`NotSupportedError` when no candidate runs correctly."""
        budget_s, seed = opts.budget_s, opts.seed
        relayout = opts.relayout and self.problem.layout == "nchw" and not self.problem.is_empty
        key = self._tuning_key(opts, relayout)
        rows = _autotune.cached(self, key, opts.use_cache, self._from_cache, file_default=False)
        if rows is not None:
            return rows
        store = tuning.cache()
        _cuda.refuse_in_capture(f"the engine-config search of {self._describe()}")
        t_start = time.perf_counter()
        tensors = self._example(seed)
        ref = ref_abs = None
        if opts.check:
            ref, ref_abs = _o.reference(self.problem, self.direction, tensors, activation=self.activation)
        seeds = _o._configs_of(store.seeds(key)) if opts.seed_from_cache else []
        from ...core import progress as _progress

        with _progress.bar(progress, desc="cuDNN graph autotune", seconds=budget_s):
            if relayout:
                cl_seeds = _o._configs_of(store.seeds(key, layout="nhwc")) if opts.seed_from_cache else []
                table = _search.search_relayout(self, t_start, budget_s, tensors, ref, ref_abs, opts, seeds,
                                                cl_seeds)
            else:
                table = _search.search(self, t_start + budget_s, budget_s, tensors, ref, ref_abs, opts, seeds)
        self.last_autotune = table
        self.autotune_seconds = time.perf_counter() - t_start
        if not table or table[0].status != "ok":
            raise NotSupportedError(
                f"autotune found no engine config that runs correctly for {self._describe()}: "
                + "; ".join(f"{r.name}: {r.status} {r.detail}" for r in table[:10]) + self._layout_hint(),
                library="cuDNN")
        self._commit(table[0])
        rec = self._record(key, table[0])
        return _autotune.keep(self, self._table(table), rec)

    def _table(self, rows) -> ResultTable:
        """Autotune's rows as a :class:`rawconv.results.ResultTable` with the problem filled in."""
        out = ResultTable(rows, title=f"cuDNN graph autotune: {self._describe()}")
        for r in out:
            r.problem, r.direction = self.problem, self.direction
        return out

    def _commit(self, top: TimedConfig) -> None:
        """Select autotune's top row: exactly that config runs (a channels_last one through the
        channels_last plan; otherwise that plan, if any, is released)."""
        if top.layout:
            self._cl._selected = self._cl._built[top.config.name]
            self._via = self._cl
        else:
            self._via = None
            self._selected = self._built[top.config.name]
            self._probe_capture(self._selected)
            if self._cl is not None:  # not chosen: release its plans, workspaces and buffers
                self._cl.free()
                self._cl = None
                self._bufs = None

    # ------------------------------------------------------------------ tuning records
    def _tuning_key(self, opts: _search.SearchOptions, relayout: bool) -> tuning.TuningKey:
        """The tuning cache key of an autotune with ``opts`` on this plan: problem, direction,
        activation, the options and filters in force (``no_tensor_cores`` resolved), cuDNN's
        version and the GPU (:func:`_environment`)."""
        f = dict(opts.filters)
        if f.get("no_tensor_cores") is None:
            f["no_tensor_cores"] = self.problem.dtype == "float32" and not self.allow_tf32
        options = dict(f, allow_tf32=self.allow_tf32, workspace_limit=opts.workspace_limit,
                       include_runtime_compiled=opts.include_runtime_compiled, relayout=relayout)
        return tuning.TuningKey("cudnn_graph", self.direction, self.problem, self.activation, options,
                                **_o._environment(self.device_index))

    def _from_cache(self, hit: tuning.TuningRecord) -> ResultTable:
        """A tuning-cache record ``hit`` selected, as autotune's one-row table (phase ``"cache"``);
        raises :class:`NotSupportedError` / :class:`ArgumentError` when its config no longer
        selects (:func:`rawconv.core.autotune.cached` then searches)."""
        ec = self._select(hit.choice, warn=False)
        rows = self._table([TimedConfig(ec, hit.median_ms, hit.min_ms, 0, "ok", None, "cache", "from the tuning cache",
                                        layout="nhwc" if self._via else "")])
        self.last_autotune = rows
        return rows

    def _record(self, key: tuning.TuningKey, row: TimedConfig) -> tuning.TuningRecord:
        """The tuning record of autotune's choice ``row``: its name (``select`` takes it), engine,
        knobs, notes and workspace in ``detail``, times and error."""
        ec = row.config
        detail = {"engine": ec.engine, "knobs": [list(k) for k in ec.knobs],
                  "numerical_notes": list(ec.numerical_notes), "behavior_notes": list(ec.behavior_notes),
                  "workspace_bytes": ec.workspace_bytes}
        return tuning.TuningRecord(key, row.name, detail, row.layout or self.problem.layout, row.median_ms,
                                   row.min_ms, row.error, label=self.problem.name or "")


# only rawconv's exceptions leave them (rawconv.core.guard), named as the public methods they are
_guard.public_methods("autotune", owner="rawconv.cudnn.graph.GraphConvolution")(Autotune)
