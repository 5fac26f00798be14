"""Fused convolution + bias (+ residual) (+ activation) as ONE library call, and the torch operator over it.

    y = rawconv.fused.conv_bias_act(x, w, b, residual=r, padding=1, activation="relu")
    # = relu(conv(x, w) + b + r), one oneDNN primitive (CPU) or one cuDNN graph (CUDA)

    torch.ops.rawconv.conv_bias_act(x, w, b, r, [1, 1], [1, 1], [1, 1], 1, "silu", "auto", None, "strict")

Activations (:data:`ACTIVATIONS`, torch's names): ``"relu"``, ``"relu6"``, ``"silu"``, ``"gelu"``
(erf), ``"gelu_tanh"`` (torch's ``approximate="tanh"``: never fused as the erf one, nor the other way),
``"hardswish"``, ``"hardsigmoid"``, ``"sigmoid"``, ``"tanh"``, ``"none"``.

* CPU: a oneDNN convolution primitive with the bias inside it and the post-ops ``sum`` (the
  residual, which oneDNN reads from the destination buffer before writing it) then one ``eltwise``
  (:data:`rawconv.onednn.fused.ELTWISE`): oneDNN applies post-ops in the order they are appended,
  so the result is ``act(conv(x, w) + b + r)`` (checked against float64 in tests/test_fused.py and
  tests/test_fused_activations.py). :class:`FusedConvolution` is the plan: a
  :class:`rawconv.onednn.Convolution` whose primitive carries those post-ops (implementations,
  ``select``, ``autotune``, the weight snapshot of ``prepack=True`` as there). oneDNN's ReLU, ReLU6,
  erf-GELU, sigmoid and hardsigmoid do not keep a NaN (or an infinity) as torch does: those run
  fused only where the convolution's result is provably finite, else unfused for that call
  (:data:`rawconv.onednn.fused.NAN_GUARDED`).
* CUDA: one cuDNN graph: convolution, pointwise ``add`` of the bias, pointwise ``add`` of the
  residual (a second input tensor of the graph), one pointwise activation node
  (:class:`ResidualGraphConvolution`; without a residual, :class:`rawconv.cudnn_graph.GraphConvolution`
  with ``activation=...``). Hardswish and hardsigmoid have no pointwise mode: the graph ends before
  them and torch's op runs on its result (:data:`CUDNN_UNFUSED` says why).

The operator ``rawconv::conv_bias_act`` has a fake (meta) kernel computed from the arguments alone
(no library call), so ``torch.compile(fullgraph=True)`` traces it, and a backward (gradients of x,
w, bias and residual through rawconv's own backward-data and backward-weights calls; no double
backward). It is meant for inference (``rawconv.nn.convert(..., fuse=True)`` folds BatchNorm into
the weights, which is only right in eval mode).

Weights: the function form and the operator read the weights on every call (reordered per call
when the implementation wants another layout), as :mod:`rawconv.ops` does. The modules that
``rawconv.nn.convert(..., fuse=True)`` makes are **frozen** (:func:`freeze`): their weight and
bias, with the BatchNorm they refer to folded in, are snapshotted (a copy, as torch's freezing
makes constants) and reordered once per problem; the snapshot is taken again at the next call
whenever what it was taken from changed (:class:`_FrozenState`), and :func:`rawconv.nn.refresh`
takes a new one at once (after a write through ``.data``, which no version counter sees).
"""
from __future__ import annotations

import dataclasses
import threading
import warnings
import weakref
from typing import Any, Optional, Sequence

import torch

from . import autocast as _autocast
from .. import onednn
from ..core.grad import functorch_active as _functorch, has_tangent as _has_tangent
from ..core import plans as _plans_mod
from ..core.plans import PerThread, PlanCache
from ..core.errors import ArgumentError, ArgumentTypeError, NotSupportedError
from ..core.problem import ConvProblem, layout_of, random_tensor, seed_offset
from ..core.postops import ACTIVATIONS, check_activation, check_residual, torch_tail, apply_activation  # noqa: F401
from ..onednn.fused import FusedConvolution  # the oneDNN post-op plan lives there

__all__ = ["conv_bias_act", "FusedConvolution", "ResidualGraphConvolution", "ACTIVATIONS", "BACKENDS",
           "clear_cache"]

BACKENDS = ("auto", "onednn", "cudnn")
PRECISIONS = ("strict", "tf32", "bf16", "f16", "any")


# ---------------------------------------------------------------------------- cuDNN: one graph
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
    _ResidualGraphConvolution.__module__ = __name__
    ResidualGraphConvolution = _ResidualGraphConvolution
    return ResidualGraphConvolution


ResidualGraphConvolution: Any = None   # the class, once _graph_class() made it (needs rawconv.cudnn_graph)


# ---------------------------------------------------------------------------- plan caches and dispatch
_cpu_plans = PlanCache(512)
_gpu_plans = PlanCache(512)
_fast: dict = {}
_plans_mod.register_clear("rawconv.pytorch.fused:_fast", _fast.clear)
_FAST_MAX = 1024


def clear_cache() -> None:
    """Drop the fused plans (oneDNN and cuDNN) the function form and the operator keep."""
    _cpu_plans.clear()
    _gpu_plans.clear()
    _fast.clear()


def _pad_arg(padding, nd: int):
    """The operator's ``int[]`` padding (nd symmetric values, or 2*nd: all befores then all afters)
    as rawconv's padding argument."""
    if isinstance(padding, (str, int)):
        return padding
    pad = list(padding)
    if len(pad) == 2 * nd:
        return tuple((pad[i], pad[nd + i]) for i in range(nd))
    return tuple(pad)


def _backend_of(backend: str, device: torch.device) -> str:
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ArgumentError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        return "cudnn" if device.type == "cuda" else "onednn"
    if backend == "onednn" and device.type != "cpu":
        raise ArgumentError(f"backend 'onednn' runs on CPU tensors, got tensors on {device}")
    if backend == "cudnn" and device.type != "cuda":
        raise ArgumentError(f"backend 'cudnn' runs on CUDA tensors, got tensors on {device}")
    return backend


def plan_for(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
             stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1, *, activation: str = "relu",
             backend: str = "auto", choice: Any = None, precision: str = "strict"):
    """The cached plan :func:`conv_bias_act` runs for these arguments: a :class:`FusedConvolution`
    (oneDNN) or a cuDNN graph plan (:class:`rawconv.cudnn_graph.GraphConvolution` /
    :class:`ResidualGraphConvolution`). Validates everything (``ArgumentError`` /
    ``ArgumentTypeError`` before any C call)."""
    activation = check_activation(activation)
    if precision not in PRECISIONS:
        raise ArgumentError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    if not isinstance(x, torch.Tensor):
        raise ArgumentTypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    bk = _backend_of(backend, x.device)
    problem = ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups)
    if residual is not None:
        check_residual(residual, problem)
    if choice is not None and not isinstance(choice, (str, int)) or isinstance(choice, bool):
        raise ArgumentTypeError(f"choice must be None, a name or a position, got {choice!r}")
    has_r = residual is not None
    if bk == "onednn":
        if isinstance(choice, str) and choice.isdigit():
            choice = int(choice)   # a position in the implementation list
        # the weights are read (reordered) on every call: no copy of them is kept across calls
        key = (problem, has_r, activation, choice, precision, onednn.weights_layout(w), onednn.thread_ident())
        plan = _cpu_plans.get(key)
        if plan is None or plan._freed:
            plan = FusedConvolution.for_problem(problem, residual=has_r, activation=activation, impl=choice,
                                                fpmath=precision, w_layout=onednn.weights_layout(w), prepack=False)
            _cpu_plans.put(key, plan)
        return plan
    from ..cudnn import graph as G

    if problem.dtype not in G.DTYPES:
        raise ArgumentError(f"cuDNN graphs take {list(G.DTYPES)}, got {problem.dtype}")
    allow_tf32 = precision != "strict"
    key = (problem, has_r, activation, choice, allow_tf32, threading.get_ident())
    plan = _gpu_plans.get(key)
    if plan is None or plan._freed:
        # an activation cuDNN's graphs have no pointwise mode for ends the graph before it: torch's
        # own op runs on the graph's result (CUDNN_UNFUSED says why)
        act = None if activation == "none" or activation in CUDNN_UNFUSED else activation
        if has_r:
            plan = _graph_class().for_problem(problem, activation=act, allow_tf32=allow_tf32)
        else:
            plan = G.GraphConvolution.from_problem(problem, activation=act, allow_tf32=allow_tf32)
        if choice is not None:
            plan.select(choice)   # a forced config that does not finalize raises (NotSupportedError)
        elif not problem.is_empty:
            try:
                plan._current()   # cuDNN's default config for this graph
            except NotSupportedError as exc:
                plan = _CudaFallback(problem, activation, precision, str(exc))
        if activation in CUDNN_UNFUSED and not isinstance(plan, _CudaFallback):
            plan.torch_activation = activation   # (_run applies it to the graph's result)
        _gpu_plans.put(key, plan)
    return plan


#: activations cuDNN's graph API (cuDNN 9) has no pointwise mode for, and why they run in torch after
#: the graph (conv + bias + residual) instead of inside it. RELU_FWD with an upper clip (ReLU6), SWISH_FWD
#: (SiLU, beta 1), GELU_FWD (erf), GELU_APPROX_TANH_FWD, SIGMOID_FWD and TANH_FWD fuse.
CUDNN_UNFUSED = {
    "hardswish": "no HARDSWISH pointwise mode; x * relu6(x + 3) / 6 as a chain of pointwise nodes needs scalar "
                 "constant tensors (pass-by-value) that rawconv's graphs do not build",
    "hardsigmoid": "no HARDSIGMOID pointwise mode; relu6(x + 3) / 6 as a chain needs scalar constant tensors "
                   "(pass-by-value) that rawconv's graphs do not build",
}


class _CudaFallback:
    """When cuDNN offers no engine for the fused graph (NCHW graphs often have none; some
    residual graphs may not fuse): the legacy API's convolution with bias and ReLU
    (``rawconv.cudnn.forward(..., activation="relu")``, fused by
    ``cudnnConvolutionBiasActivationForward`` where cuDNN allows; that call fuses ReLU only), and
    the residual added and any other activation applied in torch (torch's own op). Said once per
    problem by a ``RuntimeWarning``."""

    _freed = False

    def __init__(self, problem: ConvProblem, activation: str, precision: str, why: str):
        import warnings

        self.problem, self.activation, self.precision = problem, activation, precision
        self.selected_name = "legacy (graph not supported)"
        warnings.warn(f"rawconv.fused: cuDNN offers no graph for {activation}(conv + bias [+ residual]) "
                      f"on {problem.describe()} ({why.splitlines()[0][:200]}); running the legacy convolution "
                      "with the bias (and activation) and adding the residual in torch", RuntimeWarning,
                      stacklevel=_guard.stacklevel())

    def run(self, x, w, bias, residual=None):
        from .. import cudnn

        p = self.problem
        pad = tuple(zip(p.pad_before, p.pad_after)) if not p.symmetric else p.pad_before
        if residual is None and self.activation in ("none", "relu"):
            act = None if self.activation == "none" else self.activation
            return cudnn.forward(x, w, bias, p.stride, pad, p.dilation, p.groups, activation=act,
                                 precision=self.precision)
        y = cudnn.forward(x, w, bias, p.stride, pad, p.dilation, p.groups, precision=self.precision)
        if residual is not None:
            y = y + residual
        return apply_activation(y, self.activation, inplace=residual is None)

    execute = run

    def autotune(self, **_kw):
        raise NotSupportedError(f"no cuDNN graph to tune for {self.problem.describe()} (legacy fallback)")


# ---------------------------------------------------------------------------- frozen modules
FROZEN_WEIGHT, FROZEN_BIAS = "_rawconv_frozen_weight", "_rawconv_frozen_bias"   # the modules' buffer names
_FROZEN_PLANS = "_rawconv_frozen_plans"
_FROZEN_STATE = "_rawconv_frozen_state"   # module.__dict__: its _FrozenState
BN_KEY = "_rawconv_bn"   # module.__dict__: the BatchNorm folded into the snapshot (convert(fuse=True)), or absent
_FROZEN_MAX = 64   # plans per frozen module (one per input shape and layout); more: the oldest go
_frozen_dicts = weakref.WeakValueDictionary()   # id -> every frozen module's _PlanDict (for clear_caches)


def _clear_frozen_plans() -> None:
    for d in list(_frozen_dicts.values()):
        d.clear()


_plans_mod.register_clear("rawconv.pytorch.fused:frozen modules' plans", _clear_frozen_plans)

# bumped after every optimizer step in the process (torch.optim's global step hook): fused optimizers
# (Adam(fused=True), fused SGD) update parameters without moving their version counters, so a step is
# itself a sign that frozen snapshots may be stale (rawconv.core.postops.watch_optimizers)
from ..core.postops import OPTIMIZER_EPOCH as _EPOCH, watch_optimizers as _watch_optimizers  # noqa: E402


class _PlanDict(dict):
    """A frozen module's oneDNN plans (problem -> :class:`FusedConvolution` holding the snapshot
    reordered), and its :class:`_FrozenState` (``state``). Copies and pickles of the module start
    with none (plans hold C objects). :func:`rawconv.clear_caches` empties every one (the module
    makes its plans again at its next call); their buffers count against the plans' byte budget
    (:func:`rawconv.set_cache_limit`) as every oneDNN plan's do."""

    state = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _frozen_dicts[id(self)] = self

    def __deepcopy__(self, memo):
        return _PlanDict()

    def __reduce__(self):
        return (_PlanDict, ())


def _unbound_state():
    return _FrozenState(None)


def _fold(w: torch.Tensor, b, bn) -> tuple:
    """(weight, bias) of conv ``w``/``b`` followed by eval-mode BatchNorm ``bn``, computed in float64
    from the tensors as they are now and rounded once to w's dtype (w's memory format)."""
    from torch.nn.utils.fusion import fuse_conv_bn_weights

    def d(t):
        return t.detach().to(torch.float64) if t is not None else None

    fw, fb = fuse_conv_bn_weights(d(w), d(b), d(bn.running_mean), d(bn.running_var), bn.eps, d(bn.weight),
                                  d(bn.bias))
    out_w = torch.empty_like(w, memory_format=torch.preserve_format)
    out_w.copy_(fw.detach())
    return out_w, fb.detach().to(w.dtype)


def _versions(ts) -> list | None:
    try:
        return [(t._version, t.data_ptr()) for t in ts]   # p.data = new_tensor moves only the pointer
    except RuntimeError:   # an inference tensor keeps no version counter: every call takes a new snapshot
        return None


class _FrozenState:
    """What a frozen module's snapshot was taken from, to take a new one when any of it changed.

    The sources: the module's ``weight`` and ``bias`` parameters and, when a BatchNorm is folded
    in (``module.__dict__[BN_KEY]``), its weight, bias, running statistics, batch count and ``eps``. The
    snapshot is stale when a source is another object than the one snapshotted (a parameter
    replaced: ``m.weight = Parameter(...)``, ``load_state_dict(assign=True)``, a BatchNorm moved
    alone), when any source's version counter moved (every in-place write through autograd's
    view of the tensor: ``load_state_dict``, optimizer steps, ``mul_``, a BatchNorm's training
    forward counting its batches) or data pointer moved (``p.data = new_tensor``), after any optimizer
    step (fused optimizers move no version counter), after the module's ``_apply`` (``.to()``, ``.cuda()``) and
    after a forward that recorded autograd through the parameters (an update through ``.data``
    usually follows one). In-place writes through ``.data`` alone, with no optimizer step and no training
    forward, are the one change it cannot see (nor can autograd): :func:`rawconv.nn.refresh`.

    :meth:`sync` takes a new snapshot when stale: the same buffer tensors written in place when
    shape, dtype and device still fit (compiled graphs and the plans keep working on them), new
    ones otherwise. The module is held weakly; copies and pickles get an unbound state that the
    module's ``__setstate__`` replaces."""

    __slots__ = ("module", "srcs", "tens", "vers", "epoch", "plans", "bn", "eps", "snap", "__weakref__")

    def __init__(self, module):
        self.module = weakref.ref(module) if module is not None else _no_module
        self.srcs: tuple = (None, None)
        self.tens: list = []
        self.vers = None
        self.epoch = -1   # stale until the first snapshot
        self.bn = None
        self.eps = None   # the BatchNorm's eps the fold used
        self.snap = (None, None)   # the buffers (FROZEN_WEIGHT, FROZEN_BIAS) as last taken
        self.plans = _PlanDict()
        self.plans.state = self

    def __deepcopy__(self, memo):
        return _FrozenState(None)

    def __reduce__(self):
        return (_unbound_state, ())

    def mark_stale(self) -> None:
        self.epoch = -1

    def fresh(self, w, b) -> bool:
        """Whether the snapshot was taken from ``w`` / ``b`` (the module's weight and bias now) and
        the BatchNorm as they are now (see the class notes). The eager hot path's one check."""
        srcs = self.srcs
        if self.epoch != _EPOCH[0] or w is not srcs[0] or b is not srcs[1]:
            return False
        bn = self.bn
        if bn is not None and (bn._buffers.get("running_mean") is not srcs[4]
                               or bn._parameters.get("weight") is not srcs[2] or bn.eps != self.eps):
            return False
        try:
            return self.vers == [(t._version, t.data_ptr()) for t in self.tens]
        except RuntimeError:   # an inference tensor keeps no version counter
            return False

    def sync(self, w=None, b=None):
        """The snapshot ``(weight, bias)`` to compute with: the module's buffers, taken again first
        when stale. ``w``/``b``: the tensors a caller was handed (an operator's kernel under
        torch.compile gets the buffers as they were traced): returned as they are when fresh."""
        m = self.module()
        if m is None:
            return w, b
        p = m._parameters
        if not self.fresh(p.get("weight"), p.get("bias")) or self.bn is not m.__dict__.get(BN_KEY):
            self.take(m)
        elif w is not None:
            return w, b
        return self.snap

    def choice_for(self, x, residual):
        """The choice a new plan of the module's takes for this call (its autotuned one for the
        problem, :meth:`rawconv.nn._ConvBiasAct._frozen_choice`), or None."""
        m = self.module()
        resolve = getattr(m, "_frozen_choice", None) if m is not None else None
        return resolve(x, residual) if resolve is not None else None

    def take(self, m) -> None:
        """Take module ``m``'s snapshot from its sources now (in place where the buffers fit)."""
        p = m._parameters
        w, b = p.get("weight"), p.get("bias")
        if w is None:   # the weight is no longer a parameter (a parametrization): the module reads it live
            return
        bn = m.__dict__.get(BN_KEY)
        _watch_optimizers()
        epoch = _EPOCH[0]
        with torch.no_grad():
            if bn is not None:
                fw, fb = _fold(w, b, bn)
                srcs = (w, b, bn._parameters.get("weight"), bn._parameters.get("bias"),
                        bn._buffers.get("running_mean"), bn._buffers.get("running_var"),
                        bn._buffers.get("num_batches_tracked"))
            else:
                fw, fb = w.detach(), (b.detach() if b is not None else None)
                srcs = (w, b)
            tens = [t for t in srcs if t is not None]
            vers = _versions(tens)
            old_w, old_b = m._buffers.get(FROZEN_WEIGHT), m._buffers.get(FROZEN_BIAS)
            new_w = _into(old_w, fw)
            new_b = None if fb is None else _into(old_b, fb)
        replaced = new_w is not old_w or new_b is not old_b
        for name, t in ((FROZEN_WEIGHT, new_w), (FROZEN_BIAS, new_b)):
            if name in m._buffers:
                m._buffers[name] = t
            else:
                m.register_buffer(name, t, persistent=False)
        if replaced:
            self.plans.clear()
        # the snapshot carries its plans (and this state): the operator's kernel finds them on the
        # weight it is given (under torch.compile the module's buffer reaches the kernel as the same
        # tensor), so compiled models keep each layer's weights reordered once, and fresh, too
        setattr(new_w, _FROZEN_PLANS, self.plans)
        m.__dict__[_FROZEN_PLANS] = self.plans
        self.srcs, self.tens, self.vers, self.bn, self.snap = srcs, tens, vers, bn, (new_w, new_b)
        self.eps = bn.eps if bn is not None else None
        self.epoch = epoch


def _no_module():
    return None


def _into(old, new: torch.Tensor) -> torch.Tensor:
    """``new``'s values in ``old`` (written in place) when shape, dtype, device and layout fit, else a
    copy of ``new`` (its memory format kept)."""
    if old is not None and old.shape == new.shape and old.dtype == new.dtype and old.device == new.device \
            and old.stride() == new.stride() and not old.is_inference():
        old.copy_(new)
        return old
    return new.detach().clone(memory_format=torch.preserve_format)


def freeze(module: torch.nn.Module) -> None:
    """Snapshot a fused module's weight and bias, with its BatchNorm (``module.__dict__[BN_KEY]``)
    folded in, as non-persistent buffers :data:`FROZEN_WEIGHT` / :data:`FROZEN_BIAS` (out of
    ``state_dict``), and keep the snapshot fresh from then on: the module takes a new one at its
    next call whenever a source changed (:class:`_FrozenState` says how that is seen).
    Called by :func:`rawconv.nn.convert` (``fuse=True``) and :func:`rawconv.nn.refresh` (which
    takes a new snapshot now, whatever changed)."""
    st = module.__dict__.get(_FROZEN_STATE)
    if st is None or st.module() is not module:
        st = _FrozenState(module)
        module.__dict__[_FROZEN_STATE] = st
    st.take(module)


def rebind(module: torch.nn.Module) -> None:
    """After a copy, an unpickle or ``_apply`` (``.to()``): a state bound to ``module`` (a copy's
    was unbound) and stale, attached to the current snapshot buffer (``.to()`` made new ones)."""
    if FROZEN_WEIGHT not in module._buffers:
        return
    st = module.__dict__.get(_FROZEN_STATE)
    if st is None or st.module() is not module:
        st = _FrozenState(module)
        module.__dict__[_FROZEN_STATE] = st
    st.mark_stale()
    st.plans.clear()
    module.__dict__[_FROZEN_PLANS] = st.plans
    w = module._buffers.get(FROZEN_WEIGHT)
    st.snap = (w, module._buffers.get(FROZEN_BIAS))
    if w is not None:
        setattr(w, _FROZEN_PLANS, st.plans)


def frozen(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds a weight snapshot (:func:`freeze`)."""
    return FROZEN_WEIGHT in module._buffers


def frozen_state(module: torch.nn.Module):
    """``module``'s :class:`_FrozenState`, or None."""
    return module.__dict__.get(_FROZEN_STATE)


def _run_frozen(plans: dict, x, w, bias, residual, stride, pad, dilation, groups, activation, choice, precision,
                residual_inplace):
    """A frozen module's call on oneDNN: its own plan for this problem, with the snapshot ``w``
    (the module's buffer) as the plan's weight snapshot, reordered once, and again when the buffer
    was changed in place (its version counter moved)."""
    try:
        key = (x.shape, x.stride(), x.dtype, w.shape, w.stride(), bias is None, None if residual is None else
               (residual.shape, residual.stride(), residual.dtype), tuple(stride), pad, tuple(dilation), groups,
               activation, choice, precision, onednn.thread_ident())
        plan = plans.get(key)
    except TypeError:
        key = plan = None
    if plan is None or plan._freed:
        if choice is None and plans.state is not None:   # the module's choice for this problem (autotuned)
            choice = plans.state.choice_for(x, residual)
            if isinstance(choice, str) and choice.isdigit():
                choice = int(choice)
        generic = plan_for(x, w, bias, residual, stride, pad, dilation, groups, activation=activation,
                           backend="onednn", choice=choice, precision=precision)   # validates everything
        # nothing chosen: oneDNN's first choice, on the tensors' own layouts when it offers that kernel
        # there too (no reorder of x and y on every call: FusedConvolution.first_without_data_reorders)
        index = generic.selected.index if choice is not None else generic.first_without_data_reorders()
        plan = FusedConvolution.for_problem(generic.problem, residual=generic.residual, activation=activation,
                                            impl=index, fpmath=precision,
                                            w_layout=onednn.weights_layout(w), prepack=True)
        if key is not None:
            if len(plans) >= _FROZEN_MAX:
                plans.pop(next(iter(plans)))
            plans[key] = plan
    try:
        version = w._version   # a snapshot changed in place (the buffer's .copy_()/.mul_()) is reordered again
    except RuntimeError:   # an inference tensor keeps no version counter
        version = None
    if plan._snap is None or plan._snap[0] is not w or plan.__dict__.get("_frozen_version") != version \
            or version is None:
        plan._snapshot(w, copy=False)
        plan._frozen_version = version
    return plan.run(x, None, bias, residual, inplace=residual_inplace)


def _run(x, w, bias, residual, stride, padding, dilation, groups, activation, backend, choice, precision,
         residual_inplace=False, frozen_plans=None):
    nd = w.dim() - 2
    pad = _pad_arg(padding, nd)
    if frozen_plans is not None and x.device.type == "cpu" and backend in ("auto", "onednn"):
        return _run_frozen(frozen_plans, x, w, bias, residual, stride, pad, dilation, groups, activation, choice,
                           precision, residual_inplace)
    try:
        key = (x.shape, x.stride(), x.dtype, x.device, w.shape, w.stride(), w.dtype,
               None if bias is None else (bias.shape, bias.dtype, bias.device),
               None if residual is None else (residual.shape, residual.dtype, residual.device),
               tuple(stride), pad, tuple(dilation), groups, activation, backend, choice, precision,
               onednn.thread_ident())
        plan = _fast.get(key)
    except TypeError:
        key = plan = None
    if plan is None or plan._freed:
        plan = plan_for(x, w, bias, residual, stride, pad, dilation, groups, activation=activation,
                        backend=backend, choice=choice, precision=precision)
        if key is not None:
            if len(_fast) >= _FAST_MAX:
                _fast.clear()
            _fast[key] = plan
    if isinstance(plan, FusedConvolution):
        return plan.run(x, w, bias, residual, inplace=residual_inplace)
    if isinstance(plan, _CudaFallback):
        return plan.run(x, w, bias, residual)
    if plan.problem.is_empty:
        return torch_tail(torch.zeros(plan.problem.y_shape, dtype=x.dtype, device=x.device), bias, residual,
                           activation, plan.problem)
    y = plan.run(x, w, bias, residual) if residual is not None else plan.execute(x, w, bias)
    tail = getattr(plan, "torch_activation", None)   # an activation the graph does not hold (CUDNN_UNFUSED)
    return apply_activation(y, tail, inplace=True) if tail else y


# ---------------------------------------------------------------------------- the torch operator
def _out_meta(x, w, stride, padding, dilation):
    """(shape, channels_last?) of the operator's result, from the arguments alone."""
    nd = w.dim() - 2
    pad = list(padding)
    if len(pad) == nd:
        pb, pa = pad, pad
    elif len(pad) == 2 * nd:
        pb, pa = pad[:nd], pad[nd:]
    else:
        raise ArgumentError(f"padding must have {nd} or {2 * nd} values, got {pad}")
    unbatched = x.dim() == nd + 1
    xs = list(x.shape) if not unbatched else [1] + list(x.shape)
    out = [(i + b + a - (d * (k - 1) + 1)) // s + 1
           for i, b, a, d, k, s in zip(xs[2:], pb, pa, dilation, w.shape[2:], stride)]
    shape = [xs[0], w.shape[0]] + out
    cl = layout_of(x if not unbatched else x.unsqueeze(0)) == "nhwc"
    return (shape[1:] if unbatched else shape), cl, unbatched


def _op_kernel(x, w, bias, residual, stride, padding, dilation, groups, activation, backend, choice, precision,
               residual_inplace=False, frozen_plans=None):
    """The operator's kernel (also called directly by the modules in eager inference, where
    ``residual_inplace`` lets the oneDNN path write the result into the residual's memory, and
    a frozen module passes its snapshot as ``w``/``bias`` with its own plans, ``frozen_plans``)."""
    y = _run(x, w, bias, residual, stride, padding, dilation, groups, activation, backend, choice, precision,
             residual_inplace, frozen_plans)
    shape, cl, unbatched = _out_meta(x, w, stride, padding, dilation)
    if not unbatched and y.dim() >= 3:
        fmt = (torch.channels_last if y.dim() == 4 else torch.channels_last_3d) if cl and y.dim() in (4, 5) \
            else torch.contiguous_format
        if not y.is_contiguous(memory_format=fmt):
            y = y.contiguous(memory_format=fmt)
    return y


def frozen_plans_of(w: torch.Tensor):
    """The plans a frozen module's weight snapshot carries (see :func:`freeze`), or None."""
    return w.__dict__.get(_FROZEN_PLANS) if not w.requires_grad else None


def _synced(w, bias):
    """(w, bias, plans) for the operators' kernels: a frozen module's snapshot (reached here as the
    traced buffer under torch.compile) retaken first when its sources changed (:class:`_FrozenState`)."""
    plans = frozen_plans_of(w)
    if plans is not None and plans.state is not None:
        w, bias = plans.state.sync(w, bias)
        plans = frozen_plans_of(w)
    return w, bias, plans


@torch.library.custom_op("rawconv::conv_bias_act", mutates_args=())
def _conv_bias_act_op(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], residual: Optional[torch.Tensor],
                      stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], groups: int,
                      activation: str, backend: str, choice: Optional[str], precision: str) -> torch.Tensor:
    """``act(conv(x, w) + bias + residual)`` on oneDNN (CPU) or a cuDNN graph (CUDA)."""
    w, bias, plans = _synced(w, bias)
    return _op_kernel(x, w, bias, residual, stride, padding, dilation, groups, activation, backend, choice, precision,
                      frozen_plans=plans)


@torch.library.custom_op("rawconv::conv_bias_act_residual_", mutates_args=("residual",))
def _conv_bias_act_residual_op(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], residual: torch.Tensor,
                               stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], groups: int,
                               activation: str, backend: str, choice: Optional[str], precision: str) -> None:
    """``residual = act(conv(x, w) + bias + residual)``, in place, for inference: oneDNN's ``sum``
    post-op reads and writes the residual's memory, with no copy of it into a new output (when
    the residual is dense in x's memory format and shares no memory with x, w or bias; otherwise
    the result is computed out of place and copied back). Used by :func:`rawconv.nn.convert`'s
    fused modules where the residual is a fresh intermediate that nothing reads afterwards;
    under ``torch.compile`` inductor then keeps it in place (functionalized, reinplaced). No
    autograd: the modules call the out-of-place ``rawconv::conv_bias_act`` when a gradient is
    needed; with grad mode on and an argument that requires grad it raises
    :class:`NotSupportedError` (the overwritten residual would carry no gradient, or a wrong one)."""
    w, bias, plans = _synced(w, bias)
    y = _op_kernel(x, w, bias, residual, stride, padding, dilation, groups, activation, backend, choice, precision,
                   residual_inplace=True, frozen_plans=plans)
    if y is not residual:
        with torch.no_grad():
            residual.copy_(y)


@_conv_bias_act_residual_op.register_fake
def _(x, w, bias, residual, stride, padding, dilation, groups, activation, backend, choice, precision):
    return None


def _residual_op_autograd(keyset, *args):
    """The in-place operator's Autograd kernel: torch.library allows no autograd formula for a
    mutating operator, and its default one runs the kernel and records nothing (the overwritten
    residual then carries no gradient, or its old one: silently wrong gradients). Raises
    :class:`NotSupportedError` before any library call when grad mode is on and an argument
    requires grad, or an argument carries a forward-mode tangent; otherwise runs the kernel below
    autograd."""
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        raise NotSupportedError("rawconv::conv_bias_act_residual_ overwrites residual and records no gradient: "
                                "with tensors that require grad use rawconv::conv_bias_act (or torch.no_grad())")
    if _has_tangent(*args[:4]):
        raise NotSupportedError("rawconv::conv_bias_act_residual_ has no forward-mode derivative (an argument "
                                "carries a forward_ad / torch.func.jvp tangent, which it would drop)")
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.rawconv.conv_bias_act_residual_.default.redispatch(
            keyset & torch._C._after_autograd_keyset, *args)


try:
    with warnings.catch_warnings():   # replaces the Autograd kernel torch.library registered for it
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*", category=UserWarning)
        _residual_op_lib = torch.library.Library("rawconv", "IMPL")
        _residual_op_lib.impl("conv_bias_act_residual_", _residual_op_autograd, "Autograd", with_keyset=True)
    RESIDUAL_OP_GUARDED = True
except Exception:  # noqa: BLE001  (a torch without these private hooks: the modules then never call the in-place op)
    RESIDUAL_OP_GUARDED = False


@_conv_bias_act_op.register_fake
def _(x, w, bias, residual, stride, padding, dilation, groups, activation, backend, choice, precision):
    shape, cl, unbatched = _out_meta(x, w, stride, padding, dilation)
    y = x.new_empty(shape)
    if cl and not unbatched and len(shape) in (4, 5):
        y = y.contiguous(memory_format=torch.channels_last if len(shape) == 4 else torch.channels_last_3d)
    return y


# activations whose derivative torch computes from the result (relu, sigmoid, tanh: aten's own
# backward ops); the others need the pre-activation, recomputed in the backward (one more
# convolution: the operator is meant for inference)
_GRAD_FROM_OUTPUT = ("none", "relu", "sigmoid", "tanh")


def _setup_context(ctx, inputs, output):
    x, w, bias, residual, stride, padding, dilation, groups, activation, backend, choice, precision = inputs
    activation = check_activation(activation)
    if activation in _GRAD_FROM_OUTPUT:
        ctx.save_for_backward(x, w, output if activation != "none" else None, None, None)
    else:
        ctx.save_for_backward(x, w, None, bias, residual)
    ctx.conf = (tuple(stride), tuple(padding), tuple(dilation), groups, activation, backend, precision,
                bias is not None, residual is not None)


def _activation_grad(gy, y, z_of, activation: str):
    """dL/dz of ``y = activation(z)`` as torch's own backward ops compute it (``z_of()``: the
    pre-activation, recomputed, for those that need it)."""
    aten = torch.ops.aten
    if activation == "none":
        return gy
    if activation == "relu":
        return aten.threshold_backward(gy, y, 0)
    if activation == "sigmoid":
        return aten.sigmoid_backward(gy, y)
    if activation == "tanh":
        return aten.tanh_backward(gy, y)
    z = z_of()
    if activation == "relu6":
        return aten.hardtanh_backward(gy, z, 0.0, 6.0)
    if activation == "silu":
        return aten.silu_backward(gy, z)
    if activation in ("gelu", "gelu_tanh"):
        return aten.gelu_backward(gy, z, approximate="tanh" if activation == "gelu_tanh" else "none")
    if activation == "hardswish":
        return aten.hardswish_backward(gy, z)
    if activation == "hardsigmoid":
        return aten.hardsigmoid_backward(gy, z)
    raise NotSupportedError(f"no backward for activation {activation!r}")


def _backward(ctx, gy):
    x, w, y, bias, residual = ctx.saved_tensors
    stride, padding, dilation, groups, activation, backend, precision, has_b, has_r = ctx.conf
    if torch.is_grad_enabled():
        raise NotSupportedError("double backward through rawconv::conv_bias_act is not implemented "
                                "(convert(..., fuse=False) for higher-order gradients)")

    def z_of():   # the pre-activation conv(x, w) + b + r, through the operator itself (no activation)
        return torch.ops.rawconv.conv_bias_act(x, w, bias, residual, list(stride), list(padding), list(dilation),
                                               groups, "none", backend, None, precision)

    gz = _activation_grad(gy, y, z_of, activation)
    # through the registered backward operators (their fake kernels let torch.compile trace this
    # backward: a direct library call would ask a FakeTensor for its data pointer)
    from . import ops as _ops

    nd = w.dim() - 2
    pad = list(padding)
    pb, pa = (pad, pad) if len(pad) == nd else (pad[:nd], pad[nd:])
    gz = _ops._grad_like(gz, x, x.dim() == nd + 1)
    gx = gw = gb = gr = None
    if ctx.needs_input_grad[0]:
        gx = _ops._bwd_data_op(gz, w, list(x.shape), list(stride), pb, pa, list(dilation), groups, backend, "",
                               precision)
    if ctx.needs_input_grad[1]:
        gw, _ = _ops._bwd_weights_op(x, gz, list(w.shape), list(stride), pb, pa, list(dilation), groups, False,
                                     backend, "", precision)
    if has_b and ctx.needs_input_grad[2]:
        dims = [0] + list(range(2, gz.dim())) if gz.dim() == nd + 2 else list(range(1, gz.dim()))
        gb = gz.sum(dims, dtype=torch.float32 if gz.dtype != torch.float64 else torch.float64).to(gz.dtype)
    if has_r and ctx.needs_input_grad[3]:
        gr = gz
    return gx, gw, gb, gr, None, None, None, None, None, None, None, None


_conv_bias_act_op.register_autograd(_backward, setup_context=_setup_context)


def _transform_guard(generated):
    """The out-of-place operator's Autograd kernel: torch's generated one (``register_autograd``)
    drops a forward-mode tangent silently (the result carries none: torch.func.jvp gave zeros) and
    fails inside torch.func's grad transforms with an internal error. Raises
    :class:`NotSupportedError` for those, before any library call; otherwise runs torch's."""
    def autograd_kernel(keyset, *args, **kwargs):
        if _has_tangent(*args[:4]):
            raise NotSupportedError("rawconv::conv_bias_act has no forward-mode derivative (forward_ad, "
                                    "torch.func.jvp/jacfwd/hessian); use rawconv.ops.conv (differentiable in both "
                                    "modes) and add the bias, residual and activation in torch")
        if _functorch() and torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                                            for a in args[:4]):
            raise NotSupportedError("torch.func transforms (grad, vjp, jacrev...) through rawconv::conv_bias_act are "
                                    "not supported (it is meant for inference); use rawconv.ops.conv, which "
                                    "supports them, and add the bias, residual and activation in torch")
        return generated(keyset, *args, **kwargs)
    return autograd_kernel


try:
    from torch._library.autograd import make_autograd_impl as _make_autograd_impl

    with warnings.catch_warnings():   # wraps the Autograd kernel torch.library registered for it
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*", category=UserWarning)
        _fused_op_lib = torch.library.Library("rawconv", "IMPL")
        _fused_op_lib.impl("conv_bias_act", _transform_guard(_make_autograd_impl(
            torch.ops.rawconv.conv_bias_act.default, _conv_bias_act_op)), "Autograd", with_keyset=True)
except Exception:  # noqa: BLE001  (a torch without this private helper: torch's own kernel stays)
    pass

# autocast: the inputs cast as torch casts a convolution's (rawconv._autocast); the in-place residual
# operator has none (its residual keeps its dtype): the modules call the out-of-place one under autocast
_autocast_lib = torch.library.Library("rawconv", "IMPL")
_autocast.register(_autocast_lib, "conv_bias_act")


def conv_bias_act(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                  residual: torch.Tensor | None = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
                  groups: int = 1, *, activation: str = "relu", backend: str = "auto", choice: Any = None,
                  precision: str = "strict") -> torch.Tensor:
    """``activation(conv(x, w) + bias + residual)`` as one library call (``torch.ops.rawconv.conv_bias_act``).

    ``x``: (N, C, *spatial) or unbatched, NCHW or channels_last; ``w``: (K, C/groups, *kernel);
    ``bias``: (K,) or None; ``residual``: a tensor of the output's shape (N, K, *out) or None;
    ``padding``: int, tuple, ``"same"``/``"valid"`` or one ``(before, after)`` pair per spatial
    dim; ``activation``: one of :data:`ACTIVATIONS` (``"relu"``, ``"silu"``, ``"gelu"``, ...; the
    module notes say where each fuses); ``backend``: ``"auto"`` (by x's device),
    ``"onednn"`` (CPU: float32/bfloat16 where the CPU has it), ``"cudnn"`` (CUDA: one graph;
    float32/float16/bfloat16/float64); ``choice``: the oneDNN implementation (name, ``"name@user"``,
    position) or the cuDNN engine config name (``"eng28{k2=3}"``); ``precision``: ``"strict"``,
    ``"tf32"``, ``"bf16"``, ``"f16"``, ``"any"`` (see :mod:`rawconv.options`). Returns y in x's
    memory format, differentiable once (gradients through rawconv's backward-data and
    backward-weights calls with the backend's default choices).

    Raises :class:`ArgumentError` / :class:`ArgumentTypeError` before any C call for bad input,
    :class:`NotSupportedError` when the library offers no (or not the chosen) implementation for
    the fused primitive. Wraps ``dnnl_primitive_execute`` on a primitive with post-ops, or
    ``cudnnBackendExecute`` on a graph with pointwise nodes.
    """
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ArgumentTypeError(f"x and w must be torch.Tensor, got {type(x).__name__} and {type(w).__name__}")
    activation = check_activation(activation)
    if isinstance(choice, int) and not isinstance(choice, bool):
        choice = str(choice)   # the operator's schema takes a string; positions stay positions
    if torch._C._is_any_autocast_enabled() and x.device.type in ("cpu", "cuda") \
            and torch.is_autocast_enabled(x.device.type):   # as autocast casts the operator's inputs, before the checks
        x, w, bias, residual = _autocast.cast_inputs("conv_bias_act", x.device.type, (x, w, bias, residual))
    problem = ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups)
    if residual is not None:
        check_residual(residual, problem)
    _backend_of(backend, x.device)
    pads = list(problem.pad_before) + (list(problem.pad_after) if not problem.symmetric else [])
    return torch.ops.rawconv.conv_bias_act(x, w, bias, residual, list(problem.stride), pads,
                                           list(problem.dilation), problem.groups, activation, backend,
                                           choice, precision)


# every public entry point raises only rawconv's exception classes (rawconv._guard)
from ..core import guard as _guard  # noqa: E402

_guard.guard_module(globals(), "conv_bias_act", "plan_for", "freeze")
