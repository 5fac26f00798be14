"""rawconv.fused's cuDNN residual graph (:mod:`rawconv.fused`, the face):
:class:`ResidualGraphConvolution` (``act(conv(x, w) + b + r)`` as one cuDNN graph, made on first
use by :func:`_graph_class`) and its capture stand-in, cuDNN's legacy fused call
(:func:`_legacy_for_capture`; switch: ``CAPTURE_LEGACY_RESIDUAL``, set on the face or here)."""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..core.plans import PerThread
from ..core.errors import ArgumentError, ArgumentTypeError, NotSupportedError
from ..core.problem import ConvProblem, random_tensor, seed_offset
from ..core.postops import check_residual, torch_tail

FACE = "rawconv.pytorch.fused"   # where this module's public names live (rawconv.fused)


class _ResidualGraphMixin:
    """What :class:`ResidualGraphConvolution` adds to :class:`rawconv.cudnn_graph.GraphConvolution`,
    the class it is mixed into by :func:`_graph_class` (defined there, on first use): the residual
    tensor ``r`` bound, drawn for the autotune and in its float64 check, and in the tuning key;
    :meth:`run` taking the residual; no ``"nhwc:"`` relayout configs. Takes and returns what the
    base class's methods do; ``super()`` is the base class."""
    _pending_r = PerThread()   # the residual of the call in progress: the calling thread's own

    def _describe(self) -> str:
        return super()._describe() + " residual"

    def _has_residual(self) -> bool:
        return True

    def _execute_split(self, x, w, bias, out, grad_y, residual=None):
        r = getattr(self, "_pending_r", None)
        if r is None:
            raise ArgumentError("this plan adds a residual: use run(x, w, bias, residual)")
        return super()._execute_split(x, w, bias, out, grad_y, self._prepare("r", r, self.problem.y_shape))

    def _example(self, seed: int = 0) -> dict:
        t = super()._example(seed)
        p = self.problem
        t["r"] = random_tensor(p.y_shape, seed_offset(seed, 4), f"cuda:{self.device_index}", p.torch_dtype, p.layout)
        self._tune_tensors = t
        self._ref_r = None
        return t

    def _bind(self, x, w, bias, out, grad_y):
        t, result = super()._bind(x, w, bias, out, grad_y)
        r = getattr(self, "_pending_r", None)
        if r is None:
            raise ArgumentError("this plan adds a residual: use run(x, w, bias, residual)")
        t["r"] = self._prepare("r", r, self.problem.y_shape)
        return t, result

    def call_for(self, b, t: dict, out: torch.Tensor):
        self._pending_r = t["r"]
        try:
            bound, _ = self._bind(t.get("x"), t.get("w"), t.get("b"), out, None)
        finally:
            self._pending_r = None
        ptrs = tuple(bound[r].data_ptr() for r in self._graph.roles)
        return lambda: self._run(b, ptrs) or bound

    def check_output(self, out, config, ref, ref_abs):
        from ..core import check as _check

        # autotune's reference has no residual: act(conv + b + r) in float64 on the same
        # example tensors instead (computed once per autotune)
        if self._ref_r is None or self._ref_r[0] is not ref:
            t = self._tune_tensors
            ref0, abs0 = _check.reference(self.problem, "forward", t)
            r64 = t["r"].to(torch.float64)
            refr = ref0 + r64
            if self.activation:
                refr = _check.ACTIVATION_REFERENCE[self.activation](refr)
            self._ref_r = (ref, refr, abs0 + r64.abs())
        return super().check_output(out, config, self._ref_r[1], self._ref_r[2])

    def _tuning_key(self, opts, relayout: bool):
        key = super()._tuning_key(opts, relayout)
        return dataclasses.replace(key, options=dict(key.options, residual=True))

    def channels_last(self):
        raise NotSupportedError("'nhwc:' configs are not offered for residual graphs: pass channels_last tensors")

    def autotune(self, **kw):
        """:meth:`rawconv.cudnn_graph.GraphConvolution.autotune` (``relayout`` is not offered)."""
        if kw.get("relayout"):
            raise NotSupportedError("relayout search is not offered for residual graphs: pass channels_last "
                                    "tensors")
        return super().autotune(**kw)

    _capture_legacy = None   # a rawconv.cudnn.ResidualBiasActivation run instead inside captures (capture_choice)

    @property
    def capture_choice(self) -> str | None:
        """What a call made while torch's current stream is being captured into a CUDA graph runs
        instead of the selected engine config, or None (the selected config runs everywhere).
        Set by :meth:`autotune` (and restored from its tuning record) when cuDNN's legacy fused
        call ``cudnnConvolutionBiasActivationForward`` with the residual as its ``z`` input,
        ``"legacy:IMPLICIT_PRECOMP_GEMM"``, computed the example correctly (float64 check), can be
        captured, passes the search's filters, and ran at least 3% faster on the GPU than what a
        capture would otherwise run (the selected config, or its capture stand-in): on an H100
        (cuDNN 9.19, fp16, ResNet-50's residual layers) it runs cuBLAS-style kernels with the
        epilogue built in, 3-20% faster than the runtime-compiled graph, but costs 140-230 µs of
        host time per call inside cuDNN, which only a captured graph leaves out; eager calls keep
        the graph. Switch: ``rawconv.fused.CAPTURE_LEGACY_RESIDUAL``."""
        alt = self._capture_legacy
        return None if alt is None else alt.name

    @property
    def selected_name(self) -> str:
        """The selected config's name as :meth:`select` takes it; with a :attr:`capture_choice`,
        ``"<config>|capture=<capture choice>"`` (what ``convert(autotune=...)`` pins)."""
        name = super().selected_name
        alt = self._capture_legacy
        return name if alt is None else f"{name}{_CAPTURE_SEP}{alt.name}"

    def _select(self, engine, warn: bool = True, stacklevel: int = 2):
        alt_name = None
        if isinstance(engine, str) and _CAPTURE_SEP in engine:
            from .. import cudnn

            engine, alt_name = engine.split(_CAPTURE_SEP, 1)
            if not alt_name.startswith("legacy:") or alt_name[len("legacy:"):] not in cudnn.FwdAlgo.__members__:
                raise ArgumentError(f"a capture choice names a legacy forward algo ('legacy:IMPLICIT_PRECOMP_GEMM'; "
                                    f"algos: {', '.join(cudnn.FwdAlgo.__members__)}), got {alt_name!r}")
        ec = super()._select(engine, warn, stacklevel + 1)
        self._capture_legacy = None
        if alt_name is not None and CAPTURE_LEGACY_RESIDUAL:
            self._capture_legacy = _legacy_for_capture(self, None, algo=alt_name[len("legacy:"):])
        return ec

    def _autotune_run(self, opts, progress):
        self._search_opts = opts   # (the filters _commit's capture choice must also pass)
        try:
            return super()._autotune_run(opts, progress)
        finally:
            self._search_opts = None

    def _commit(self, top) -> None:
        super()._commit(top)
        self._capture_legacy = None
        if CAPTURE_LEGACY_RESIDUAL and not top.layout:
            self._capture_legacy = _legacy_for_capture(self, top, opts=getattr(self, "_search_opts", None))

    def _record(self, key, row):
        rec = super()._record(key, row)
        alt = self._capture_legacy
        if alt is None:
            return rec
        return dataclasses.replace(rec, detail=dict(rec.detail, capture_choice=alt.name,
                                                    capture_choice_ms=alt.median_ms))

    def _from_cache(self, hit):
        rows = super()._from_cache(hit)
        self._capture_legacy = None
        name = (hit.detail or {}).get("capture_choice")
        if CAPTURE_LEGACY_RESIDUAL and isinstance(name, str) and name.startswith("legacy:"):
            self._capture_legacy = _legacy_for_capture(self, None, algo=name[len("legacy:"):])
        return rows

    def free(self) -> None:
        self._capture_legacy = None
        self._ref_r = self._tune_tensors = None
        super().free()

    def run(self, x, w, bias, residual, out=None) -> torch.Tensor:
        """``act(conv(x, w) + bias + residual)`` (asynchronous, torch's current stream)."""
        p = self.problem
        if p.is_empty:
            return torch_tail(torch.zeros(p.y_shape, dtype=p.torch_dtype, device=residual.device), bias,
                               residual, self.activation or "none", p)
        check_residual(residual, p)
        self._pending_r = residual.unsqueeze(0) if p.unbatched and residual.dim() == p.ndim + 1 else residual
        try:
            alt = self._capture_legacy
            if alt is not None and out is None and _capturing_now(self.device_index):
                t, y = self._bind(x, w, bias, None, None)
                try:
                    alt.call(t)
                except (ArgumentError, ArgumentTypeError):   # tensors the legacy call does not take
                    return self.execute(x, w, bias, out)
                return y
            return self.execute(x, w, bias, out)
        finally:
            self._pending_r = None


CAPTURE_LEGACY_RESIDUAL = True   # see ResidualGraphConvolution.capture_choice
_CAPTURE_SEP = "|capture="


def _capturing_now(device_index: int | None = None) -> bool:
    """Whether torch's current stream of device ``device_index`` (None: the current device) is
    being captured into a CUDA graph."""
    if device_index is None or torch._C._cuda_getDevice() == device_index:
        return torch.cuda.is_current_stream_capturing()
    with torch.cuda.device(device_index):
        return torch.cuda.is_current_stream_capturing()


def _legacy_for_capture(plan, top, algo: str = "IMPLICIT_PRECOMP_GEMM", opts=None):
    """For residual graph ``plan`` after its autotune selected ``top`` (a search row; None: a tuning
    record named the legacy call, ``algo``): the legacy fused call when it runs the autotune's
    example within the float64 check and can be captured, and (with ``top``) its GPU time
    (queued behind a busy GPU, interleaved with the selected config's, median of 3 rounds) is
    below 97% of the config a capture would otherwise run (the selected one, or its capture
    stand-in); ``opts``: the search's options, whose filters it must pass too (workspace limit,
    no tensor cores, deterministic only, no reduced precision). Returns a
    :class:`rawconv.cudnn.ResidualBiasActivation`, else None. The check's float64 reference and
    example tensors are dropped afterwards (the plan keeps no memory for them)."""
    from .. import cudnn

    p = plan.problem
    try:
        if _capturing_now():   # (nothing can be run and checked inside a capture)
            return None
    except Exception:   # noqa: BLE001  (no CUDA driver, or a CPU build of torch)
        return None
    try:
        alt = cudnn.ResidualBiasActivation(p, plan.activation, plan.allow_tf32, algo)
    except Exception:   # noqa: BLE001  (not offered, not fused, or cuDNN refused: the graph runs everywhere)
        return None
    if opts is not None:
        f, info = opts.filters, alt.info
        no_tc = f.get("no_tensor_cores")
        if no_tc is None:
            no_tc = p.dtype == "float32" and not plan.allow_tf32
        if (opts.workspace_limit is not None and info.workspace_bytes > opts.workspace_limit) \
                or (no_tc and "tensor" in str(info.math)) or (f.get("deterministic_only") and not info.deterministic) \
                or f.get("no_reduced_precision"):
            return None
    try:
        return _legacy_checked(plan, alt, top)
    finally:
        plan._ref_r = plan._tune_tensors = None


def _legacy_checked(plan, alt, top):
    """:func:`_legacy_for_capture`'s check, capture probe and timing of ``alt``."""
    from ..core.bench import time_cuda_queued

    with torch.cuda.device(plan.device_index):
        ex = getattr(plan, "_tune_tensors", None) or plan._example(0)
        plan._pending_r = ex["r"]
        try:
            t, y = plan._bind(ex["x"], ex["w"], ex["b"], None, None)
            t2, y2 = plan._bind(ex["x"], ex["w"], ex["b"], None, None)
        finally:
            plan._pending_r = None
        try:
            y.fill_(float("nan"))
            alt.call(t)
            torch.cuda.synchronize()
            ref = plan._ref_r[0] if getattr(plan, "_ref_r", None) is not None else None
            if not plan.check_output(y, plan._selected.config, ref, None).ok:
                return None
            if alt.capture_fails(t):
                return None
            if top is not None:
                b = plan._selected
                mine = plan.call_for(b.capture_alt or b, ex, y2)   # what a capture would run instead
                a, g = [], []
                for _ in range(3):
                    a.append(time_cuda_queued(lambda: alt.call(t), iterations=10, warmup=2, repeats=3).median_ms)
                    g.append(time_cuda_queued(mine, iterations=10, warmup=2, repeats=3).median_ms)
                a_ms, g_ms = sorted(a)[1], sorted(g)[1]
                if a_ms >= 0.97 * g_ms:
                    return None
                alt.median_ms = a_ms
        except Exception:   # noqa: BLE001  (a legacy call that fails here never runs later)
            return None
    return alt


def _graph_class():
    """:class:`ResidualGraphConvolution`, defined on first use (cudnn_graph imports cuDNN lazily,
    but keeping it out of ``import rawconv.fused`` keeps that import light)."""
    global ResidualGraphConvolution
    if isinstance(ResidualGraphConvolution, type):
        return ResidualGraphConvolution
    from ..cudnn import graph as G

    class _ResidualGraphConvolution(_ResidualGraphMixin, G.GraphConvolution):
        """A :class:`rawconv.cudnn_graph.GraphConvolution` whose graph also adds a residual tensor
        of y's shape before the activation: ``y = act(conv(x, w) + b + r)`` (pointwise nodes
        ``add`` (bias), ``add`` (residual, tensor uid 5), then the activation).

        ``ResidualGraphConvolution.for_problem(problem, activation="relu", allow_tf32=False)``;
        :meth:`run` ``(x, w, bias, residual, out=None)``; ``engines``, ``select`` and
        ``autotune`` as the base class (autotune checks every candidate against the float64
        ``act(conv + b + r)`` on a random residual). No ``"nhwc:"`` relayout configs.
        """

        @classmethod
        def for_problem(cls, problem: ConvProblem, *, activation: str | None = "relu",
                        allow_tf32: bool = False) -> "_ResidualGraphConvolution":
            self = cls.from_problem(problem, direction="forward", activation=activation, allow_tf32=allow_tf32)
            if not problem.is_empty:
                self._graph = G.OperationGraph(problem, "forward", self.activation, problem.layout, residual=True)
            return self

    _ResidualGraphConvolution.__name__ = _ResidualGraphConvolution.__qualname__ = "ResidualGraphConvolution"
    _ResidualGraphConvolution.__module__ = FACE
    ResidualGraphConvolution = _ResidualGraphConvolution
    return ResidualGraphConvolution


ResidualGraphConvolution: Any = None   # the class, once _graph_class() made it (needs rawconv.cudnn_graph)
