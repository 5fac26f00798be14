"""The legacy API plan's autotune: every algo ``cudnnFind*`` returns, timed on the GPU, the fastest
selected and recorded (its tuning key, the tuning cache's row and record; the cache half runs
:mod:`rawconv.core.autotune`). A mixin of :class:`rawconv.cudnn.Convolution`."""
from __future__ import annotations

import torch
from .. import _cuda
from ...core import autotune as _autotune
from ...core.errors import ArgumentTypeError
from ...core.errors import NotSupportedError
from ...core.problem import to_layout
from ...core.results import ResultTable
from . import common as _o   # the names the legacy plan shares (not the face: it imports this part)
from ...core import guard as _guard

__all__ = ["Autotune"]


class Autotune:
    """Part of :class:`rawconv.cudnn.Convolution` (see the module's notes)."""

    @_cuda.on_plan_device
    def autotune(self, iterations: int = 20, warmup: int = 3, *, budget_s: float | None = None,
                 math: str | None = None, use_cache: bool | None = None,
                 progress: bool | None = None) -> ResultTable:
        """Time every usable algo (from Find, with this plan's math unless ``math`` names another)
        as GPU time per call (:func:`gpu_time`: CUDA events around calls queued behind a GPU sleep,
        ``repeats`` 3 loops of ``iterations`` calls) on random tensors of the problem, select the
        fastest by median and return the rows (a :class:`~rawconv.results.ResultTable`), fastest
        first. ``budget_s``: seconds of wall time for the search of this problem and direction
        (:func:`rawconv.core.autotune.check_budget`; None, the default: no limit): once spent, the
        algos not yet timed are left out (Find's order, fastest first by cuDNN's own timing;
        at least one algo is timed).

        Tuning records: the choice (``"ALGO@math"``, the math type set on the descriptor) is
        stored as a :class:`rawconv.tuning.TuningRecord` (:attr:`tuning_record`, also the table's
        ``record``) in the tuning cache (:func:`rawconv.tuning.cache`; on disk when
        ``$RAWCONV_TUNING_CACHE`` or :func:`rawconv.tuning.set_cache_file` names a file), keyed by
        the problem, direction, activation, math type, determinism, workspace limit, cuDNN's
        version and the GPU (name, compute capability). ``use_cache``: look the problem up there
        first and, on a hit that still selects, use it without timing (one row, phase
        ``"cache"``); None (the default): only when a cache file is configured. ``progress``: a
        tqdm bar naming the algo being timed (None: when stderr is a terminal or in a Jupyter
        kernel)."""
        from ...core import progress as _progress

        self._check_live()
        _cuda.refuse_in_capture(f"the algo search of {self.problem.describe()}")
        if use_cache is not None and not isinstance(use_cache, bool):
            raise ArgumentTypeError(f"use_cache must be True, False or None, got {use_cache!r}")
        _progress.enabled(progress)   # validates
        budget = _autotune.Budget(budget_s)   # (checks it)
        # what the plan ran before: put back when the search is interrupted (KeyboardInterrupt) or fails
        before = (self._algo_request, self._algo_id, self._info, self._ws, self.math, self._descs)
        try:
            return self._autotune_now(iterations, warmup, math, use_cache, progress, budget)
        except BaseException:
            self._algo_request, self._algo_id, self._info, self._ws, self.math, self._descs = before
            raise

    def _autotune_now(self, iterations, warmup, math, use_cache, progress, budget=None) -> ResultTable:
        """:meth:`autotune` once its arguments are checked (``budget``: a
        :class:`rawconv.core.autotune.Budget`, None: no limit)."""
        from ...core import progress as _progress

        if math is not None and math != self.math:
            self.math = _o._math_name(math, self.problem.dtype)
            self._descs = {}
        key = self._tuning_key()
        hit = _autotune.cached(self, key, use_cache, self._from_cache)
        if hit is not None:
            return hit
        rows = []
        cands = [r for r in self._query("find", self.math) if self._usable(r)]
        seen = set()
        with _progress.bar(progress, total=len({r.algo_id for r in cands}), desc="cuDNN autotune",
                           unit="algo") as bar:
            for r in cands:
                if r.algo_id in seen or (rows and budget is not None and budget.left() == 0):
                    continue
                seen.add(r.algo_id)
                bar.note(r.choice)
                try:
                    self.select(r.algo_id)
                    args = self._exec_args()
                    stats = _o.gpu_time(lambda: self.execute(**args), iterations=iterations, warmup=warmup)
                except NotSupportedError:
                    continue
                finally:
                    bar.update()
                rows.append(_o.TimedAlgorithm(r, stats.median_ms, stats.min_ms, stats.runs, problem=self.problem))
        if not rows:
            raise NotSupportedError("no algo could be timed for " + self.problem.describe(), library="cuDNN")
        rows.sort(key=lambda r: r.median_ms)
        info = self.select(rows[0].algorithm.algo_id)
        out = ResultTable(rows, title=f"cuDNN autotune: {self.direction} {self.problem}")
        return _autotune.keep(self, out, self._record(key, rows[0], info))

    # ------------------------------------------------------------------ tuning records
    def tuning_key(self):
        """The :class:`rawconv.tuning.TuningKey` :meth:`autotune` stores its choice under (the plan
        contract's, :class:`rawconv.core.backend.Plan`)."""
        self._check_live()
        return self._tuning_key()

    def _tuning_key(self):
        """The :class:`rawconv.tuning.TuningKey` of an autotune of this plan (see :meth:`autotune`)."""
        from ...core import tuning

        return tuning.TuningKey.for_backend("cudnn", self.problem, self.direction,
                                            _o.key_options(self.math, self.deterministic, self.workspace_limit),
                                            self.activation, _o.environment(self.device_index))

    def _from_cache(self, hit):
        """A tuning-cache record ``hit`` selected, as autotune's one-row table (phase ``"cache"``);
        raises :class:`NotSupportedError` / :class:`ArgumentError` when its choice no longer selects
        (:func:`rawconv.core.autotune.cached` then searches)."""
        info = self.select(choice=hit.choice)
        algo = _o.Algorithm(self.direction, info.algo, info.algo_id, info.math, "CUDNN_STATUS_SUCCESS", None,
                         info.workspace_bytes, info.deterministic, "cache", info.math)
        row = _o.TimedAlgorithm(algo, *_autotune.hit_times(hit), 0, problem=self.problem)
        row.phase, row.detail = "cache", f"from the tuning cache (recorded {hit.created})"
        return ResultTable([row], title=f"cuDNN autotune: {self.direction} {self.problem}")

    def _record(self, key, row, info: _o.RunInfo):
        """The tuning record of autotune's choice: ``"ALGO@math"`` with the math type set on the
        descriptor (what :meth:`select` takes to rebuild exactly this state)."""
        from ...core import tuning

        detail = {"algo": info.algo, "algo_id": info.algo_id, "math": info.math,
                  "math_reported": info.math_reported, "workspace_bytes": info.workspace_bytes,
                  "deterministic": info.deterministic}
        return tuning.TuningRecord(key, f"{info.algo}@{info.math}", detail, self.problem.layout, row.median_ms,
                                   row.min_ms, None, label=self.problem.name or "")

    def _exec_args(self) -> dict:
        """Tensors of the problem's shapes (the outer problem) for timing."""
        p = self.problem
        ex = getattr(self, "_exec_example", None)
        if ex is None:
            x, w, b = p.make_inputs(seed=1, device=p.device, on_device=True)
            if self.w_layout == "nhwc":
                w = to_layout(w, "nhwc")
            g = torch.Generator(device=p.device).manual_seed(2)   # (torch's own generators stay untouched)
            gy = to_layout(torch.randn(p.y_shape, generator=g, device=p.device, dtype=torch.float32).to(p.torch_dtype),
                           p.layout)
            if p.unbatched:
                x, gy = x.squeeze(0), gy.squeeze(0)
            ex = {"forward": {"x": x, "w": w, "bias": b}, "backward_data": {"grad_y": gy, "w": w},
                  "backward_weights": {"x": x, "grad_y": gy}}[self.direction]
            self._exec_example = ex
        return ex


# only rawconv's exceptions leave them (rawconv.core.guard), named as the public methods they are
_guard.public_methods("autotune", "tuning_key", owner="rawconv.cudnn.Convolution")(Autotune)
