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
from . import common as _o   # the names the graph plan shares (not the face: it imports this part)
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
                 progress: bool | None = None, split: bool = True) -> list[TimedConfig]:
        """Search engine configs for the fastest correct one, select it and return the ranked table.

        Candidates, in order, while ``budget_s`` seconds (wall time for this problem and direction,
        finalization included: :func:`rawconv.core.autotune.check_budget`) last:
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
        ``split`` (forward graphs with a bias, an activation or a residual add; default True): half
        the budget searches this fused graph, half its convolution-only graph (:meth:`unfused`),
        whose configs run with torch's own ops after them (the layer as torch runs it); the best
        four of each, and the convolution-only graph's default config (what torch's cuDNN call
        runs with ``cudnn.benchmark`` off: heuristic mode instant's first allowed config), then
        run as :meth:`execute` runs them (torch's ops included, each checked end to end against
        float64 first) in interleaved rounds; the convolution-only rows are named
        ``"unfused:<config>"`` (their ``layout`` starts with ``"unfused"``), the name
        :meth:`select` takes. The fused graph is kept only when it measured faster.
        Whatever the graph, the default config (torch's pick with ``cudnn.benchmark`` off) is
        always a row: when the search did not time it (a compilation the budget did not wait
        for), it is finalized and timed after the search (phase ``"torch's pick"``).
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
                                     seed, include_runtime_compiled, patience, relayout, seed_from_cache, split)
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

        split = self._splits(opts)
        with _progress.bar(progress, desc="cuDNN graph autotune", seconds=budget_s):
            if split:
                table = self._search_split(t_start, budget_s, tensors, ref, ref_abs, opts, seeds, relayout)
            elif relayout:
                cl_seeds = _o._configs_of(store.seeds(key, layout="nhwc")) if opts.seed_from_cache else []
                table = _search.search_relayout(self, t_start, budget_s, tensors, ref, ref_abs, opts, seeds,
                                                cl_seeds)
            else:
                table = _search.search(self, t_start + budget_s, budget_s, tensors, ref, ref_abs, opts, seeds)
            if not split:
                table = self._with_torch_pick(table, tensors, ref, ref_abs, opts)
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

    def _splits(self, opts: _search.SearchOptions) -> bool:
        """Whether an autotune with ``opts`` also searches the convolution-only graph (``"unfused:"``)."""
        return opts.split and self.has_epilogue() and not self.problem.is_empty

    def _default_name(self) -> str | None:
        """The config the default selection runs (heuristic instant's, then fallback's, first
        allowed config that finalizes: what torch's cuDNN call runs with ``cudnn.benchmark`` off,
        rawconv's known-wrong configs skipped), found without changing the selection; None when
        none finalizes."""
        saved = self._selected
        try:
            return self._select_default().config.name
        except NotSupportedError:
            return None
        finally:
            self._selected = saved

    def _torch_pick_row(self, rows, tensors, ref, ref_abs, opts, via=None) -> TimedConfig | None:
        """The row of the default config (:meth:`_default_name`) among ``rows``: found, or
        finalized (a compilation is waited for), checked and timed now and appended; its detail
        says it is torch's pick. None when no default config finalizes."""
        name = self._default_name()
        if name is None:
            return None
        row = next((r for r in rows if r.config.name == name and not r.layout), None)
        if row is None or row.status not in ("ok", "mismatch", "filtered"):
            try:
                b = self.build(name)
            except NotSupportedError:
                return None
            out = self.output()
            call = self.call_for(b, tensors, out)
            if opts.check:
                out.fill_(float("nan"))
                call()
                err = self.check_output(out, b.config, ref, ref_abs)
            else:
                err = None
            st = _search.time_reps(call, opts.iterations, warmup=1)
            fresh = TimedConfig(b.config, st.median_ms, st.min_ms, st.runs,
                                "ok" if err is None or err.ok else "mismatch", err, "torch's pick")
            if row is not None:
                rows.remove(row)
            rows.append(fresh)
            row = fresh
        row.detail = ("torch's pick (cuDNN's default: what torch runs with cudnn.benchmark off)"
                      + (f"; {row.detail}" if row.detail else ""))
        return row

    def _with_torch_pick(self, table, tensors, ref, ref_abs, opts):
        """``table`` (a finished search's rows) with the default config's row in it (see
        :meth:`_torch_pick_row`), ranked again."""
        if self.problem.is_empty:
            return table
        rows = list(table)
        try:
            pick = self._torch_pick_row(rows, tensors, ref, ref_abs, opts)
        except Exception as exc:   # noqa: BLE001  (a search's result stands without the extra row)
            _o.log.debug("torch's pick not timed for %s: %s", self._describe(), exc)
            return table
        return table if pick is None else _search.ranked(rows)

    def _search_split(self, t_start, budget_s, tensors, ref, ref_abs, opts, seeds, relayout):
        """autotune's search of a fused graph (``split``): this graph for half the budget, the
        convolution-only graph (:meth:`unfused`) for the rest, then end to end (see
        :meth:`autotune`). Selects nothing; returns the ranked rows of both."""
        from ...core.errors import LibraryError

        half = budget_s / 2
        try:
            if relayout:
                native = _search.search_relayout(self, t_start, half, tensors, ref, ref_abs, opts, seeds, [])
            else:
                native = _search.search(self, t_start + half, half, tensors, ref, ref_abs, opts, seeds)
        except (NotSupportedError, LibraryError):
            native = []
        unf = self.unfused()
        ut = {"x": tensors["x"], "w": tensors["w"]}
        uref = uabs = None
        if opts.check:
            uref, uabs = _o.reference(unf.problem, "forward", ut)
        end = t_start + budget_s
        try:
            left = max(end - time.perf_counter(), 0.05)
            if relayout and unf.problem.layout == "nchw":
                urows = _search.search_relayout(unf, time.perf_counter(), left, ut, uref, uabs, opts, [], [])
            else:
                urows = _search.search(unf, end, left, ut, uref, uabs, opts, [])
        except (NotSupportedError, LibraryError):
            urows = []
        urows = list(urows)
        pick = None
        try:
            pick = unf._torch_pick_row(urows, ut, uref, uabs, opts)
        except Exception as exc:   # noqa: BLE001
            _o.log.debug("torch's pick not timed for %s: %s", unf._describe(), exc)
        for r in urows:
            r.layout = "unfused" + (f":{r.layout}" if r.layout else "")
        top_u = [r for r in _search.ranked(urows) if r.status == "ok"][:4]
        if pick is not None and pick.status == "ok" and not any(r is pick for r in top_u):
            top_u.append(pick)
        top_n = [r for r in native if r.status == "ok"][:4]
        out = self.output()
        fns, engine_ms = [], []
        for r in top_u:
            fn = self._split_call(unf, r, tensors, out)
            if opts.check:
                out.fill_(float("nan"))
                fn()
                err = self.check_output(out, r.config, ref, ref_abs)
                if not err.ok:
                    r.status, r.error = "mismatch", err
                    r.detail = "wrong end to end (torch's ops after the convolution)"
                    continue
            fns.append((r, fn))
            engine_ms.append(r.median_ms)
        n_unf = len(fns)
        for r in top_n:
            if r.layout == "nhwc":   # (relayout) through the transforms, as execute runs it
                fns.append((r, self.execute_call(self._cl.built[r.config.name], tensors, out, via=self._cl)))
            else:   # (call_for binds a residual graph's residual too)
                fns.append((r, self.call_for(self.built[r.config.name], tensors, out)))
        if fns:
            medians, mins, runs = _search.time_interleaved([fn for _, fn in fns], opts.final_iterations)
            for (r, _fn), med, mn in zip(fns, medians, mins):
                r.median_ms, r.min_ms, r.runs = med, mn, runs
            if n_unf:   # torch's ops' GPU time, measured on those timed end to end, added to the other unfused rows
                import statistics

                extra = statistics.median(max(fns[i][0].median_ms - engine_ms[i], 0.0) for i in range(n_unf))
                timed = {id(fns[i][0]) for i in range(n_unf)}
                for r in urows:
                    if id(r) in timed:
                        r.detail = (r.detail + "; " if r.detail else "") + "timed end to end with torch's ops"
                    elif r.median_ms is not None:
                        r.detail = (r.detail + "; " if r.detail else "") + \
                            f"convolution {r.median_ms:.4f} ms + torch's ops {extra:.4f} ms (measured on the best)"
                        r.median_ms += extra
        return _search.ranked(list(native) + urows)

    def _split_call(self, unf, row, tensors: dict, out):
        """A no-argument callable running the convolution-only config of ``row`` (of ``unf``,
        through its channels_last plan for an ``"unfused:nhwc:"`` row) into ``out``, then torch's
        ops: the layer as an ``"unfused:"`` selection runs it."""
        via = unf._cl if row.layout.endswith("nhwc") else None
        conv = unf.execute_call((via or unf).built[row.config.name], {"x": tensors["x"], "w": tensors["w"]}, out,
                                via=via)
        bias, r, act, nd = tensors.get("b"), tensors.get("r"), self.activation, self.problem.ndim

        def call():
            conv()
            _o.torch_epilogue(out, bias, r, act, nd)
        return call

    def _table(self, rows) -> ResultTable:
        """Autotune's rows as a :class:`rawconv.results.ResultTable` with the problem filled in."""
        out = ResultTable(rows, title=f"cuDNN graph autotune: {self._describe()}")
        for r in out:
            r.problem, r.direction = self.problem, self.direction
        return out

    def _commit(self, top: TimedConfig) -> None:
        """Select autotune's top row: exactly that config runs (a channels_last one through the
        channels_last plan; otherwise that plan, if any, is released)."""
        if top.layout.startswith("unfused"):
            self._select(top.name, warn=False)   # the convolution-only plan's config, then torch's ops
            return
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
    def tuning_key(self) -> tuning.TuningKey:
        """The key :meth:`autotune` with its default arguments stores its choice under (the plan
        contract's, :class:`rawconv.core.backend.Plan`): the defaults read from its signature."""
        import inspect

        self._check_live()
        d = {k: p.default for k, p in inspect.signature(Autotune.autotune).parameters.items() if k != "self"}
        filters = {k: d[k] for k in ("deterministic_only", "no_tensor_cores", "no_down_conversion",
                                     "no_reduced_precision")}
        opts = _search.SearchOptions(d["budget_s"], d["workspace_limit"], filters, d["iterations"],
                                     d["final_iterations"], d["check"], d["use_cache"], d["seed"],
                                     d["include_runtime_compiled"], d["patience"], d["relayout"],
                                     d["seed_from_cache"], d["split"])
        return self._tuning_key(opts, opts.relayout and self.problem.layout == "nchw" and not self.problem.is_empty)

    def _tuning_key(self, opts: _search.SearchOptions, relayout: bool) -> tuning.TuningKey:
        """The tuning cache key of an autotune with ``opts`` on this plan: problem, direction,
        activation, the options and filters in force (``no_tensor_cores`` resolved), cuDNN's
        version and the GPU (:func:`_environment`)."""
        f = dict(opts.filters)
        if f.get("no_tensor_cores") is None:
            f["no_tensor_cores"] = self.problem.dtype == "float32" and not self.allow_tf32
        options = dict(f, allow_tf32=self.allow_tf32, workspace_limit=opts.workspace_limit,
                       include_runtime_compiled=opts.include_runtime_compiled, relayout=relayout)
        if self._splits(opts):
            options["split"] = True
        return tuning.TuningKey("cudnn_graph", self.direction, self.problem, self.activation, options,
                                **_o.environment(self.device_index))

    def _from_cache(self, hit: tuning.TuningRecord) -> ResultTable:
        """A tuning-cache record ``hit`` selected, as autotune's one-row table (phase ``"cache"``);
        raises :class:`NotSupportedError` / :class:`ArgumentError` when its config no longer
        selects (:func:`rawconv.core.autotune.cached` then searches)."""
        ec = self._select(hit.choice, warn=False)
        lay = "nhwc" if self._via else ""
        if self._split:
            lay = "unfused:nhwc" if self._unf._via is not None else "unfused"
        rows = self._table([TimedConfig(ec, hit.median_ms, hit.min_ms, 0, "ok", None, "cache", "from the tuning cache",
                                        layout=lay)])
        self.last_autotune = rows
        return rows

    def _record(self, key: tuning.TuningKey, row: TimedConfig) -> tuning.TuningRecord:
        """The tuning record of autotune's choice ``row``: its name (``select`` takes it), engine,
        knobs, notes and workspace in ``detail``, times and error."""
        ec = row.config
        detail = {"engine": ec.engine, "knobs": [list(k) for k in ec.knobs],
                  "numerical_notes": list(ec.numerical_notes), "behavior_notes": list(ec.behavior_notes),
                  "workspace_bytes": ec.workspace_bytes}
        lay = row.layout.rsplit(":", 1)[-1] if row.layout else ""
        return tuning.TuningRecord(key, row.name, detail, lay if lay in ("nchw", "nhwc") else self.problem.layout,
                                   row.median_ms,
                                   row.min_ms, row.error, label=self.problem.name or "")


# only rawconv's exceptions leave them (rawconv.core.guard), named as the public methods they are
_guard.public_methods("autotune", "tuning_key", owner="rawconv.cudnn.graph.GraphConvolution")(Autotune)
