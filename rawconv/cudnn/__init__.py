"""cuDNN convolutions on torch CUDA tensors (legacy API): list every algo, force one, time it.

Quick use::

    y = rawconv.cudnn.forward(x, w, padding=1)                          # cuDNN's heuristic (_v7), FMA math
    y = rawconv.cudnn.forward(x, w, padding=1, algo="IMPLICIT_PRECOMP_GEMM")   # exactly that algo
    y = rawconv.cudnn.forward(x, w, padding=1, algo="fastest")          # measured by Find, cached
    for row in rawconv.cudnn.algorithms(x, w, padding=1):               # one row per (algo, math type)
        print(row)
    with rawconv.cudnn.Convolution(x, w, padding=1, math="tensor_op") as conv:   # a plan for one problem
        conv.autotune()
        y = conv.execute(x)

Terms are cuDNN's: an *algo* (``cudnnConvolutionFwdAlgo_t`` and the backward ones), a *math type*
(``CUDNN_FMA_MATH`` = IEEE fp32 arithmetic; ``CUDNN_DEFAULT_MATH`` lets fp32 run on TF32 tensor
cores on Ampere and newer; ``CUDNN_TENSOR_OP_MATH``; ``CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION``), a
*workspace* (device scratch memory, bytes), the *heuristic* (``cudnnGet*Algorithm_v7``) and *Find*
(``cudnnFind*AlgorithmEx``: cuDNN times every algo).

rawconv never enables TF32 unless asked: the default math for fp32 and fp64 is ``"fma"``; for
fp16/bf16 it is ``"tensor_op"`` (tensor cores; products are exact and accumulate in fp32).

The graph (backend) API lives in :mod:`rawconv.cudnn_graph`; ``forward(..., engine=...)`` and
:func:`engines` / :class:`EngineConfig` reach it from here.
"""
from __future__ import annotations

import enum
import logging
import math as _math
import threading
from typing import Any, Sequence

import torch

from . import _cuda, _ffi as _cudnn
from ..core import guard as _guard
from ._ffi import ffi
from ..core.errors import ArgumentError, ArgumentTypeError, NotSupportedError
from ..core.plans import PlanCache, PlanLifetime, arg_key
from ..core.backend import canonical_direction
from ..core.results import ResultTable
from ..core.grad import grad_function as _grad_slot, needs_grad as _needs_grad
from ..core.problem import ConvProblem, check_tensor, empty_like_layout, layout_of, to_layout, dense_strides, strides_match, shape_only, torch_names

__all__ = ["Algorithm", "TimedAlgorithm", "RunInfo", "Convolution", "forward", "backward_data",
           "backward_weights", "backward_filter", "candidates", "conv_transpose", "algorithms", "info", "clear_cache", "MATH_TYPES",
           "FwdAlgo", "BwdDataAlgo", "BwdFilterAlgo", "MathType", "DIRECTIONS", "INT32_LIMIT",
           "capabilities"]
# also, lazily from rawconv.cudnn_graph: engines, EngineConfig (see __getattr__ at the end)

# the legacy API's shared names live in legacy/common.py (its parts import them from there); handed on here.
# gpu_time is not among them: the module type below passes it through to legacy/common.py
from .legacy.common import (  # noqa: F401
    log, DIRECTIONS, DTYPES, INT32_LIMIT, MATH_TYPES, _MATH_BY_VALUE, ACTIVATIONS, _ALGO_ENUM, _short, _algo_table,
    ALGOS, FwdAlgo, BwdDataAlgo, BwdFilterAlgo, MathType, _ALGO_ENUMS, Algorithm, TimedAlgorithm, RunInfo,
    weights_layout, _as4d, _math_name, _check_device, _PRECISION_MATH, _math_of, _split_choice, is_graph_choice,
    normalize_choice, resolve_algo, _ACT_FNS, key_options, environment)

# ---------------------------------------------------------------------------- the forward hot path
class _Hot:
    """A forward plan's prepared call for :meth:`Convolution.execute`'s hot path: the tensors' pack
    (:class:`rawconv._cuda.HotArgs`), the :class:`RunInfo`, descriptors and workspace it was made
    with (it holds while they are the plan's), the stream it runs on (the default stream, whose
    workspace the plan keeps; None: any stream, for an algo that needs no workspace), the C
    function with its prepared arguments (alpha/beta pointers, descriptors, algo, workspace
    pointer and size), the bias and activation steps when they run in torch (as the checked path
    runs them), and the ``void *`` casts of the last data pointers."""

    __slots__ = ("args", "info", "descs", "ws", "stream", "index", "fn", "pre", "fused", "bd", "actd", "bview",
                 "act", "casts", "where", "data", "name")

    @classmethod
    def of(cls, plan: "Convolution", info: "RunInfo", pws, x, w, bias, y) -> "_Hot | None":
        """The pack of a checked forward call that ran one cuDNN call on ``x``, ``w``, ``bias`` (or
        None) and ``y`` as they are (the caller checks that), or None (a tensor subclass; an
        unbatched problem, whose checked path returns y without its batch dim even for an x given
        with one)."""
        if plan.problem.unbatched:
            return None
        ws = plan._ws
        if info.workspace_bytes and (ws is None or ws.data_ptr() != int(ffi.cast("uintptr_t", pws))):
            return None   # the workspace was released meanwhile (the byte budget, another thread)
        args = _cuda.HotArgs.of(x, w, bias, y, plan.device_index)
        if args is None:
            return None
        p, L = plan.problem, _cudnn.lib()
        h = cls()
        h.args, h.info, h.descs, h.ws = args, info, plan._descs, ws
        h.stream = None if not info.workspace_bytes else 0   # None: any stream (no workspace to tie it to)
        h.index = plan.device_index
        xd, wd, yd, cd = plan.descriptors(plan.inner.n)
        h.pre = (plan._alpha, xd, wd, cd, info.algo_id, pws, info.workspace_bytes, plan._beta0, yd)
        h.fused = bool(info.fused)
        if h.fused:
            h.fn, h.bd, h.actd = L.cudnnConvolutionBiasActivationForward, plan._bias_desc(), plan._act_desc()
            h.bview = h.act = None
        else:
            h.fn, h.bd, h.actd = L.cudnnConvolutionForward, None, None
            h.bview = None if bias is None else (1, -1) + (1,) * p.ndim
            h.act = None if plan.activation is None else _ACT_FNS[plan.activation]
        h.casts = (None,)
        h.where = f"algo {info.algo}, {p.describe()}"
        return h

    @classmethod
    def of_grad(cls, plan: "Convolution", info: "RunInfo", pws, a, b, out) -> "_Hot | None":
        """The pack of a checked backward call (backward data: ``a`` = grad_y, ``b`` = w, ``out`` =
        dx; backward weights: ``a`` = x, ``b`` = grad_y, ``out`` = dw) that ran one cuDNN call on
        them as they are (the caller checks that), or None (a tensor subclass, an unbatched
        problem). :meth:`run_grad` runs it."""
        if plan.problem.unbatched:
            return None
        ws = plan._ws
        if info.workspace_bytes and (ws is None or ws.data_ptr() != int(ffi.cast("uintptr_t", pws))):
            return None   # the workspace was released meanwhile (the byte budget, another thread)
        args = _cuda.HotArgs.of(a, b, None, out, plan.device_index)
        if args is None:
            return None
        L = _cudnn.lib()
        h = cls()
        h.args, h.info, h.descs, h.ws = args, info, plan._descs, ws
        h.stream = None if not info.workspace_bytes else 0
        h.index = plan.device_index
        xd, wd, yd, cd = plan.descriptors(plan.inner.n)
        h.pre = (plan._alpha, xd, wd, cd, info.algo_id, pws, info.workspace_bytes, plan._beta0, yd)
        h.data = plan.direction == "backward_data"
        h.name = "cudnnConvolutionBackwardData" if h.data else "cudnnConvolutionBackwardFilter"
        h.fn = getattr(L, h.name)
        h.fused, h.bd, h.actd, h.bview, h.act = False, None, None, None, None
        h.casts = (None,)
        h.where = f"algo {info.algo}, {plan.problem.describe()}"
        return h

    def run_grad(self, plan: "Convolution", a, b):
        """Run a backward pack (:meth:`of_grad`) when it is current and ``a``, ``b`` have exactly its
        metadata, on the workspace's stream: one ``cudnnConvolutionBackwardData`` or
        ``cudnnConvolutionBackwardFilter`` into a new dx / dw of the pack's shape and strides;
        returns it, else None (the caller takes the checked path)."""
        if not self.current(plan):
            return None
        plan.used = True   # (the byte budget's sweep: its workspace was used since the last one)
        bound = self.args.bind(a, b, None, None)
        if bound is None:
            return None
        p, out = bound
        hs = _cuda.handle_state(self.index)
        if self.stream is not None and hs.stream != self.stream:
            return None
        c = self.casts
        if c[0] != p:
            cast = ffi.cast
            c = self.casts = (p, cast("void *", p[0]), cast("void *", p[1]), None, cast("void *", p[3]))
        _, pa, pb, _, po = c
        alpha, xd, wd, cd, algo, pws, nws, beta, yd = self.pre
        with plan._launch_lock if self.stream is not None else _cuda.NO_LOCK:   # (Algorithms._launching)
            if self.data:   # (w, grad_y) -> dx
                st = self.fn(hs.ptr, alpha, wd, pb, yd, pa, cd, algo, pws, nws, beta, xd, po)
            else:           # (x, grad_y) -> dw
                st = self.fn(hs.ptr, alpha, xd, pa, yd, pb, cd, algo, pws, nws, beta, wd, po)
        if st:
            raise _cudnn.error(st, self.name, self.where)
        return out

    def current(self, plan: "Convolution") -> bool:
        """Whether the plan still runs what this pack was made with (select, autotune, a new
        workspace or free() make it stale)."""
        return self.info is plan._info and self.descs is plan._descs and self.ws is plan._ws and not plan._freed

    def run(self, plan: "Convolution", x, w, bias, out):
        """Run when the pack is current and the tensors have exactly its metadata
        (:meth:`rawconv._cuda.HotArgs.bind`) on the workspace's stream: one
        ``cudnnConvolutionForward`` (then bias and activation in torch, as the checked path) or
        ``cudnnConvolutionBiasActivationForward``; returns y (or ``out``), else None (the caller
        takes the checked path)."""
        if not self.current(plan):
            return None
        plan.used = True   # (the byte budget's sweep: its workspace was used since the last one)
        if bias is None:
            bias = plan._b
        bound = self.args.bind(plan._x if x is None else x, plan._w if w is None else w, bias, out)
        if bound is None:
            return None
        a, y = bound
        hs = _cuda.handle_state(self.index)
        if self.stream is not None and hs.stream != self.stream:
            return None   # another stream: the checked path takes a workspace for this call
        c = self.casts   # (pointers, their casts): read and replaced as one object
        if c[0] != a:
            cast = ffi.cast
            c = self.casts = (a, cast("void *", a[0]), cast("void *", a[1]), cast("void *", a[2]),
                              cast("void *", a[3]))
        _, px, pw, pb, py = c
        alpha, xd, wd, cd, algo, pws, nws, beta, yd = self.pre
        lock = plan._launch_lock if self.stream is not None else _cuda.NO_LOCK   # (Algorithms._launching)
        if self.fused:
            with lock:
                st = self.fn(hs.ptr, alpha, xd, px, wd, pw, cd, algo, pws, nws, beta, yd, py, self.bd, pb,
                             self.actd, yd, py)
            if st:
                return None   # the checked path: the unfused fallback, or cuDNN's error
        else:
            with lock:
                st = self.fn(hs.ptr, alpha, xd, px, wd, pw, cd, algo, pws, nws, beta, yd, py)
            if st:
                raise _cudnn.error(st, "cudnnConvolutionForward", self.where)
            if self.bview is not None:   # (detached: execute records no autograd, as the fused kernel)
                y.add_((bias.detach() if bias.requires_grad else bias).view(self.bview))
            if self.act is not None:
                self.act(y)
        if out is not None:
            _guard.bump((out,))   # written in place, as torch's out= functions do
        return y


# ---------------------------------------------------------------------------- the plan
from .legacy import common as _common  # noqa: E402
from ..core.face import route_settings as _route_settings  # noqa: E402


# gpu_time set on this face (rawconv.cudnn.gpu_time = f, a test's monkeypatch) reaches
# rawconv.cudnn.legacy.common, where the legacy autotune reads it at call time
_route_settings(__name__, {"gpu_time": _common})

from .legacy.algorithms import Algorithms as _Algorithms  # noqa: E402 - descriptors, queries, selection
from .legacy.autotune import Autotune as _Autotune  # noqa: E402 - the timed search, tuning records


class Convolution(_Algorithms, _Autotune, PlanLifetime):
    """A cuDNN (legacy API) convolution plan for one problem, in the style of nvmath-python's ``Matmul``.

    ``Convolution(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, *, algo=None,
    math=None, deterministic=False, workspace_limit=None, activation=None)``: ``x`` (N, C, *spatial)
    or unbatched, ``w`` (K, C/groups, *kernel), CUDA tensors of float32, float16, bfloat16 or float64,
    NCHW or channels_last (taken as they are); 1-D runs as 2-D with a unit height. ``padding`` as in
    torch, or one ``(before, after)`` pair per dim (asymmetric padding costs an explicit pad copy:
    cuDNN's legacy API pads symmetrically).

    Holds the tensor/filter/convolution descriptors, the chosen algo and its workspace (from torch's
    caching allocator, reused across calls). ``algorithms()`` lists (algo, math type) rows;
    ``autotune()`` times the usable ones with CUDA events and selects the fastest; ``select(algo)``
    forces one; ``execute(...)`` runs on torch's current stream; ``free()`` / ``with`` releases.
    ``info`` (:class:`RunInfo`) says what runs.

    Raises :class:`ArgumentError` for bad input before any C call, :class:`NotSupportedError` when
    cuDNN does not support the forced algo for this problem (naming those it supports),
    :class:`LibraryError` for other cuDNN failures. Wraps ``cudnnConvolutionForward``,
    ``cudnnConvolutionBackwardData``, ``cudnnConvolutionBackwardFilter``,
    ``cudnnConvolutionBiasActivationForward`` and the algo queries.
    """

    def __init__(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                 stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1, *,
                 algo: Any = None, math: str | None = None, deterministic: bool = False,
                 workspace_limit: int | None = None, activation: str | None = None, choice: Any = None,
                 precision: str | None = None, options: Any = None):
        problem = ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups)
        self._init(problem, "forward", weights_layout(w, problem), algo, math, deterministic, workspace_limit, activation,
                   choice, precision, options)
        self._x, self._w, self._b = x, w, bias

    @classmethod
    def from_problem(cls, problem: ConvProblem, *, direction: str = "forward", w_layout: str | None = None,
                     algo: Any = None, math: str | None = None, deterministic: bool = False,
                     workspace_limit: int | None = None, activation: str | None = None, choice: Any = None,
                     precision: str | None = None, options: Any = None) -> "Convolution":
        """A plan from a :class:`ConvProblem` (``direction`` "forward", "backward_data" or
        "backward_weights" (alias "backward_filter")); no tensors needed until :meth:`execute`."""
        if not isinstance(problem, ConvProblem):
            raise ArgumentTypeError(f"problem must be a ConvProblem, got {type(problem).__name__}")
        self = cls.__new__(cls)
        self._init(problem, direction, w_layout or problem.layout, algo, math, deterministic,
                   workspace_limit, activation, choice, precision, options)
        self._x = self._w = self._b = None
        return self

    def _init(self, problem, direction, w_layout, algo, math, deterministic, workspace_limit, activation,
              choice=None, precision=None, options=None):
        direction = canonical_direction(direction)
        if options is not None:
            from ..core.options import options_of

            opt = options_of(options)
            deterministic = deterministic or opt.deterministic
            workspace_limit = workspace_limit if workspace_limit is not None else opt.workspace_limit
        algo, math = _split_choice(direction, algo, choice, _math_of(math, precision, options))
        self.device_index = _check_device(problem)
        if workspace_limit is not None and (not isinstance(workspace_limit, int) or workspace_limit < 0):
            raise ArgumentError(f"workspace_limit must be None or a number of bytes >= 0, got {workspace_limit!r}")
        if activation is not None and activation not in ACTIVATIONS:
            raise ArgumentError(f"activation must be None or one of {list(ACTIVATIONS)}, got {activation!r}")
        if activation is not None and direction != "forward":
            raise ArgumentError("activation applies to the forward direction only")
        if algo is not None and algo != "fastest":
            algo_id = resolve_algo(direction, algo)
        else:
            algo_id = None
        self.problem = problem
        self.direction = direction
        self.w_layout = w_layout
        self.math = _math_name(math, problem.dtype)
        self.deterministic = bool(deterministic)
        self.workspace_limit = workspace_limit
        self.activation = activation
        self._algo_request = algo
        self._lock = threading.Lock()
        self._launch_lock = threading.Lock()   # launches on the kept workspace (Algorithms._launching)
        self._freed = False
        self._rows: dict = {}
        self._info: RunInfo | None = None
        self._ws = None         # the default stream's workspace (see _workspace)
        self._pws_stable = False
        self._fused: bool | None = None
        self._hot: _Hot | None = None   # the forward hot path's prepared call (see execute)
        self._ghot: _Hot | None = None  # a backward plan's prepared call (the operators' hot path, _hot_call)
        self.notes: list[str] = []
        p = problem
        # asymmetric padding: cuDNN pads symmetrically; pad the rest explicitly (a copy)
        sym = tuple(min(b, a) for b, a in zip(p.pad_before, p.pad_after))
        self._extra = tuple((b - s, a - s) for b, a, s in zip(p.pad_before, p.pad_after, sym))
        self._asym = any(e != (0, 0) for e in self._extra)
        if self._asym:
            self.inner = p.with_(in_spatial=tuple(i + e[0] + e[1] for i, e in zip(p.in_spatial, self._extra)),
                                 pad_before=sym, pad_after=sym)
            self.notes.append(f"asymmetric padding {p.pad_before}/{p.pad_after}: explicit pad of the input, "
                              f"cuDNN pads {sym}")
        else:
            self.inner = p
        self._alpha = ffi.new("double *" if p.dtype == "float64" else "float *", 1.0)
        self._beta0 = ffi.new("double *" if p.dtype == "float64" else "float *", 0.0)
        self._beta1 = ffi.new("double *" if p.dtype == "float64" else "float *", 1.0)
        # int32 limit of the legacy descriptors: split the batch, or refuse naming the limit
        ip = self.inner
        per_sample = max(_math.prod(ip.x_shape[1:]), _math.prod(ip.y_shape[1:]), 1)
        wn = _math.prod(ip.w_shape)
        if per_sample > INT32_LIMIT or wn > INT32_LIMIT:
            big = "one sample of x or y" if per_sample > INT32_LIMIT else "w"
            raise NotSupportedError(
                f"cuDNN's legacy API describes tensors with int32 dims and strides: at most 2^31-1 = "
                f"{INT32_LIMIT} elements per tensor, and {big} of {p.describe()} has "
                f"{max(per_sample, wn)}; split the problem (rawconv splits the batch only)",
                library="cuDNN")
        self.batch_chunk = max(1, min(ip.n, INT32_LIMIT // per_sample)) if ip.n else 1
        if self.batch_chunk < ip.n:
            self.notes.append(f"{ip.n} samples run in chunks of {self.batch_chunk} (int32 element limit)")
        self._descs: dict[int, tuple] = {}
        self._cdesc_by_math: dict[str, object] = {}
        self._xs = tuple(dense_strides(p.x_shape, p.layout))
        self._ys = tuple(dense_strides(p.y_shape, p.layout))
        self._wst = tuple(dense_strides(p.w_shape, w_layout))
        self._algo_id = algo_id
        self.tuning_record = None   # autotune's choice (rawconv.tuning.TuningRecord)

    # ------------------------------------------------------------------ execution
    def _prep(self, name: str, t, shape, strides, is_out: bool = False) -> torch.Tensor:
        t = _cuda.check_plan_tensor(self.problem, t, name, shape, self.device_index,
                                     ("x", "y", "grad_y", "dx", "out"), is_out)
        if t.stride() != strides and not strides_match(t, strides):
            if is_out:
                raise ArgumentError(f"out ({name}) must have strides {tuple(strides)} (the plan's layout), "
                                    f"got {t.stride()}")
            t = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)
        return t

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        pad = []
        for b, a in reversed(self._extra):
            pad += [b, a]
        return to_layout(torch.nn.functional.pad(x, pad), self.problem.layout)

    @_cuda.on_plan_device
    def execute(self, x: torch.Tensor | None = None, w: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, out: torch.Tensor | None = None, *,
                grad_y: torch.Tensor | None = None, return_info: bool = False):
        """Run the selected algo on torch's current stream and return the result.

        forward: ``execute(x, w=None, bias=None, out=None)`` -> y (N, K, *out) in x's layout.
        backward_data: ``execute(grad_y=dy, w=w, out=None)`` -> dx (N, C, *in).
        backward_filter: ``execute(x, grad_y=dy, out=None)`` -> dw (K, C/groups, *kernel) in the
        plan's weight layout. ``None`` for x/w/bias uses the tensors given at construction. With
        ``return_info``, returns ``(result, RunInfo)``. Raises :class:`ArgumentError` when tensors
        do not fit the plan. Wraps ``cudnnConvolutionForward`` / ``cudnnConvolutionBiasActivationForward``
        / ``cudnnConvolutionBackwardData`` / ``cudnnConvolutionBackwardFilter``.

        Forward hot path: after a call that passed its tensors to cuDNN as they are (no copy, no
        unsqueeze, no explicit padding, one batch chunk), a call whose tensors have exactly that
        call's metadata (type, shape, strides, dtype, device, no negative bit; ``out`` not
        overlapping an input) on the same stream costs the one cuDNN call (plus the bias and
        activation steps when they run in torch), its arguments prepared once; any other call
        takes the checks below.
        """
        hot = self._hot
        if hot is not None and grad_y is None:
            y = hot.run(self, x, w, bias, out)
            if y is not None:
                return (y, hot.info) if return_info else y
        if self._freed:
            raise ArgumentError("this Convolution plan was freed")
        p = self.problem
        d = self.direction
        if x is None and d != "backward_data":
            x = self._x
        if w is None and d != "backward_weights":
            w = self._w
        if bias is None:
            bias = self._b
        if d == "forward":
            if x is None or w is None:
                raise ArgumentError("execute needs x and w (none were given at construction)")
            if p.has_bias != (bias is not None):
                raise ArgumentError("this plan was built " + ("with a bias: pass bias" if p.has_bias else
                                                              "without a bias; build one with bias to use it"))
        elif d == "backward_data":
            if grad_y is None or w is None:
                raise ArgumentError("backward_data needs grad_y and w")
        elif grad_y is None or x is None:
            raise ArgumentError("backward_weights (backward_filter) needs x and grad_y")
        if out is not None:   # torch's out= rules, before anything is written
            shape, xs = {"forward": (p.y_shape, self._ys), "backward_data": (p.x_shape, self._xs)}.get(
                d, (p.w_shape, self._wst))
            self._prep("out", out, shape, xs, True)
            ins = {"forward": (("x", x), ("w", w), ("bias", bias)), "backward_data": (("grad_y", grad_y), ("w", w))}
            _guard.check_out(out, ins.get(d, (("x", x), ("grad_y", grad_y))), "rawconv.cudnn.Convolution.execute")
        if p.is_empty:
            res = self._empty(x, w, bias, out)
            if out is not None:
                _guard.bump((out,))
                res = out
            return (res, self._info) if return_info else res
        info = self._info or self.info
        h = _cuda.handle_for(self.device_index)
        keep, pws, stable = self._workspace(_cuda.current_stream_of_handle(self.device_index))
        self._pws_stable = stable
        run = (self._run_forward if d == "forward" else self._run_backward_data if d == "backward_data"
               else self._run_backward_weights)
        with self._launching(keep, stable):
            result = run(h, info, pws, x, w, bias, out, grad_y)
        del keep   # (a per-call workspace goes back to the allocator after the launch)
        if out is not None:
            _guard.bump((out,))   # written in place, as torch's out= functions do
            result = out
        elif p.unbatched and d != "backward_weights":
            result = result.squeeze(0)
        return (result, self._info) if return_info else result

    __call__ = execute

    @_cuda.on_plan_device
    def _hot_forward(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None):
        """The forward hot path alone (see :meth:`execute`): y when the tensors fit the prepared
        call exactly, else None (the caller then takes :meth:`execute`). For the operator's CUDA
        kernel, which keeps the plan of its last call with the same arguments."""
        hot = self._hot
        return None if hot is None else hot.run(self, x, w, bias, None)

    @_cuda.on_plan_device
    def _hot_call(self, a, b, bias):
        """The operators' hot-path entry in every direction (see
        :meth:`rawconv.cudnn_graph.GraphConvolution._hot_call`): forward ``(x, w, bias)``; backward
        data ``(grad_y, w, None)``; backward weights ``(x, grad_y, None)``. The result when the
        tensors fit the prepared call of an earlier checked call exactly (a backward one: the
        whole batch in one cuDNN call, symmetric padding, every tensor used as passed), else None
        (the caller then takes the checked path)."""
        if self.direction == "forward":
            hot = self._hot
            return None if hot is None else hot.run(self, a, b, bias, None)
        g = self._ghot
        return None if g is None or bias is not None else g.run_grad(self, a, b)

    def _chunks(self):
        """``(start, size)`` of each batch chunk (int32 element limit) and its descriptors."""
        n, b = self.inner.n, self.batch_chunk
        for s in range(0, n, b):
            yield s, min(b, n - s), self.descriptors(min(b, n - s))

    def _run_forward(self, h, info: RunInfo, pws, x, w, bias, out, _grad_y):
        """execute() forward: ``cudnnConvolutionForward`` per batch chunk, or
        ``cudnnConvolutionBiasActivationForward`` when bias (+ activation) fuse; else those in torch."""
        p, L, cast, nws, algo = self.problem, _cudnn.lib(), ffi.cast, info.workspace_bytes, info.algo_id
        x0, w0 = x, w
        x = self._prep("x", x, p.x_shape, self._xs)
        w = self._prep("w", w, p.w_shape, self._wst)
        y = empty_like_layout(p.y_shape, p.layout, p.torch_dtype, x.device) if out is None else \
            self._prep("out", out, p.y_shape, self._ys, True)
        if self._asym:
            x = self._pad(x)
        fused = info.fused
        bt = None
        if fused:
            bt = self._prep("bias", bias, (p.k,), (1,))
            act = self._act_desc()
            bd = self._bias_desc()
        pw = cast("void *", w.data_ptr())
        whole = self.batch_chunk >= self.inner.n
        for s, size, (xd, wd, yd, cd) in self._chunks():
            xs = x if whole else x[s:s + size]
            ys = y if whole else y[s:s + size]
            if fused:
                st = L.cudnnConvolutionBiasActivationForward(
                    h, self._alpha, xd, cast("void *", xs.data_ptr()), wd, pw, cd, algo, pws, nws,
                    self._beta0, yd, cast("void *", ys.data_ptr()), bd, cast("void *", bt.data_ptr()), act, yd,
                    cast("void *", ys.data_ptr()))
                if st:
                    err = _cudnn.error(st, "cudnnConvolutionBiasActivationForward", p.describe())
                    if isinstance(err, NotSupportedError) and s == 0:
                        self._fused = False  # fall back to unfused for good
                        self._info = info = RunInfo(info.direction, info.algo, info.algo_id, info.math,
                                                    info.math_reported, info.workspace_bytes,
                                                    info.deterministic, False,
                                                    info.notes + ("fused bias+activation not supported: unfused",))
                        fused = False
                    else:
                        raise err
            if not fused:
                st = L.cudnnConvolutionForward(h, self._alpha, xd, cast("void *", xs.data_ptr()), wd, pw, cd, algo,
                                               pws, nws, self._beta0, yd, cast("void *", ys.data_ptr()))
                if st:
                    raise _cudnn.error(st, "cudnnConvolutionForward", f"algo {info.algo}, {p.describe()}")
        if not fused:
            if bias is not None:
                bt = self._prep("bias", bias, (p.k,), (1,))
                # detached: execute records no autograd (a y whose graph reached the bias alone
                # would give db and silently no dx, dw), as the fused kernel and the other plans
                y.add_((bt.detach() if bt.requires_grad else bt).view(1, -1, *([1] * p.ndim)))
            if self.activation is not None:
                _ACT_FNS[self.activation](y)
        hot = self._hot
        if (hot is None or not hot.current(self)) and whole and x is x0 and w is w0 and bt is bias \
                and (out is None or y is out) and y.stride() == self._ys and self._pws_stable:
            # every tensor went to cuDNN as the caller passed it, y as the checked path makes it
            self._hot = _Hot.of(self, info, pws, x, w, bias, y)
        return y

    def _run_backward_data(self, h, info: RunInfo, pws, _x, w, _bias, out, grad_y):
        """execute() backward data: ``cudnnConvolutionBackwardData`` per batch chunk (asymmetric
        padding: into a padded dx, then the inner part)."""
        p, L, cast, nws, algo = self.problem, _cudnn.lib(), ffi.cast, info.workspace_bytes, info.algo_id
        w0 = w
        dy = self._prep("grad_y", grad_y, p.y_shape, self._ys)
        w = self._prep("w", w, p.w_shape, self._wst)
        if self._asym:
            dx_full = empty_like_layout(self.inner.x_shape, p.layout, p.torch_dtype, dy.device)
            dx = None if out is None else self._prep("out", out, p.x_shape, self._xs, True)
        else:
            dx_full = dx = empty_like_layout(p.x_shape, p.layout, p.torch_dtype, dy.device) if out is None \
                else self._prep("out", out, p.x_shape, self._xs, True)
        pw = cast("void *", w.data_ptr())
        whole = self.batch_chunk >= self.inner.n
        for s, size, (xd, wd, yd, cd) in self._chunks():
            dys = dy if whole else dy[s:s + size]
            dxs = dx_full if whole else dx_full[s:s + size]
            st = L.cudnnConvolutionBackwardData(h, self._alpha, wd, pw, yd, cast("void *", dys.data_ptr()), cd,
                                                algo, pws, nws, self._beta0, xd, cast("void *", dxs.data_ptr()))
            if st:
                raise _cudnn.error(st, "cudnnConvolutionBackwardData", f"algo {info.algo}, {p.describe()}")
        if self._asym:
            sl = [slice(None), slice(None)] + [slice(e[0], e[0] + i) for e, i in zip(self._extra, p.in_spatial)]
            if dx is None:
                dx = to_layout(dx_full[tuple(sl)], p.layout)
            else:
                dx.copy_(dx_full[tuple(sl)])
        elif whole and out is None and dy is grad_y and w is w0:
            self._keep_grad_pack(info, pws, dy, w, dx)
        return dx

    def _keep_grad_pack(self, info: RunInfo, pws, a, b, out) -> None:
        """After a checked backward call that gave cuDNN ``a``, ``b`` and a new ``out`` as they are
        (whole batch, symmetric padding) on the plan's stable workspace: keep its pack for
        :meth:`_hot_call` unless a current one is kept."""
        g = self._ghot
        if (g is None or not g.current(self)) and self._pws_stable:
            self._ghot = _Hot.of_grad(self, info, pws, a, b, out)

    def _run_backward_weights(self, h, info: RunInfo, pws, x, _w, _bias, out, grad_y):
        """execute() backward weights: ``cudnnConvolutionBackwardFilter`` per batch chunk, the
        chunks accumulated into dw (beta 1 after the first)."""
        p, L, cast, nws, algo = self.problem, _cudnn.lib(), ffi.cast, info.workspace_bytes, info.algo_id
        x0 = x
        x = self._prep("x", x, p.x_shape, self._xs)
        dy = self._prep("grad_y", grad_y, p.y_shape, self._ys)
        dw = empty_like_layout(p.w_shape, self.w_layout, p.torch_dtype, x.device) if out is None else \
            self._prep("out", out, p.w_shape, self._wst, True)
        if self._asym:
            x = self._pad(x)
        pdw = cast("void *", dw.data_ptr())
        whole = self.batch_chunk >= self.inner.n
        for s, size, (xd, wd, yd, cd) in self._chunks():
            xs = x if whole else x[s:s + size]
            dys = dy if whole else dy[s:s + size]
            st = L.cudnnConvolutionBackwardFilter(h, self._alpha, xd, cast("void *", xs.data_ptr()), yd,
                                                  cast("void *", dys.data_ptr()), cd, algo, pws, nws,
                                                  self._beta0 if s == 0 else self._beta1, wd, pdw)
            if st:
                raise _cudnn.error(st, "cudnnConvolutionBackwardFilter", f"algo {info.algo}, {p.describe()}")
        if whole and out is None and x is x0 and dy is grad_y:   # (padded: x is the pad's copy)
            self._keep_grad_pack(info, pws, x, dy, dw)
        return dw

    def _bias_desc(self):
        bd = self._descs.get("bias")
        if bd is None:
            nd = 4 if self.inner.ndim <= 2 else 5
            dims = [1, self.problem.k] + [1] * (nd - 2)
            bd = self._descs["bias"] = _cudnn.tensor_desc(self.problem.dtype, dims, dense_strides(dims, "nchw"))
        return bd

    def _act_desc(self):
        ad = self._descs.get("act")
        if ad is None:
            ad = self._descs["act"] = _cudnn.activation_desc(self.activation or "identity")
        return ad

    def _empty(self, x, w, bias, out):
        """Zero-sized problems: torch's result, no cuDNN call (shared/cases C1, GPU twin)."""
        p = self.problem
        dev = self.problem.device
        if self.direction == "forward":
            y = out if out is not None else empty_like_layout(p.y_shape, p.layout, p.torch_dtype, dev)
            y.zero_()
            if bias is not None and y.numel():
                y += bias.view(1, -1, *([1] * p.ndim))
            if self.activation is not None and y.numel():
                _ACT_FNS[self.activation](y)
            return y.squeeze(0) if p.unbatched else y
        if self.direction == "backward_data":
            dx = out if out is not None else empty_like_layout(p.x_shape, p.layout, p.torch_dtype, dev)
            dx.zero_()
            return dx.squeeze(0) if p.unbatched else dx
        dw = out if out is not None else empty_like_layout(p.w_shape, self.w_layout, p.torch_dtype, dev)
        return dw.zero_()

    def _example_tensors(self) -> dict:
        t = getattr(self, "_example", None)
        if t is None:
            p = self.inner
            g = torch.Generator(device=p.device).manual_seed(0)
            dev = p.device

            def rnd(shape, layout):
                return to_layout(torch.randn(shape, generator=g, device=dev, dtype=torch.float32)
                                 .to(p.torch_dtype), layout)
            t = {"x": rnd(p.x_shape, p.layout), "w": rnd(p.w_shape, self.w_layout),
                 "dy": rnd(p.y_shape, p.layout)}
            self._example = t
        return t

    # ------------------------------------------------------------------ lifetime
    def _check_live(self):
        if self._freed:
            raise ArgumentError("this Convolution plan was freed")

    def free(self) -> None:
        """Release descriptors, the workspace and tensor references. Idempotent."""
        self._descs = {}
        self._cdesc_by_math = {}
        self._ws = None
        self._hot = self._ghot = None
        self._example = None
        self._exec_example = None
        self._x = self._w = self._b = None
        self._freed = True

    def __repr__(self) -> str:
        if self._freed:
            return "<rawconv.cudnn.Convolution (freed)>"
        if self._info is not None:
            algo = f"{self._info.algo}@{self._info.math_reported}"
        elif self._algo_id is not None:
            algo = f"{ALGOS[self.direction][self._algo_id]}@{self.math} (forced, not checked yet)"
        else:
            algo = "cuDNN's heuristic (" + ("Find" if self._algo_request == "fastest" else "_v7") + ", not queried yet)"
        return (f"<rawconv.cudnn.Convolution {self.direction} {self.problem.describe()} math={self.math} "
                f"choice={algo}>")

    def candidates(self, mode: str = "find", math: str | None = "all") -> ResultTable:
        """:meth:`algorithms` (every backend's plan has ``candidates()``)."""
        return self.algorithms(mode, math)


# ---------------------------------------------------------------------------- plan caches and functions
_cache = PlanCache(256)
_fast = PlanCache(256)


def cached_plan(problem: ConvProblem, direction: str, w_layout: str, algo, math, deterministic, workspace_limit,
                activation) -> Convolution:
    """The legacy-API plan for ``problem``, ``direction`` (weights in ``w_layout``), ``algo``,
    ``math`` type, ``deterministic``, ``workspace_limit`` (bytes) and ``activation``, from the plan
    cache or made. Raises as :class:`Convolution`."""
    key = (problem, direction, w_layout, algo, math, deterministic, workspace_limit, activation)
    plan = _cache.get(key)
    if plan is None:
        plan = Convolution.from_problem(problem, direction=direction, w_layout=w_layout, algo=algo, math=math,
                                        deterministic=deterministic, workspace_limit=workspace_limit,
                                        activation=activation)
        _cache.put(key, plan)
    return plan


def clear_cache() -> None:
    """Drop every cached plan (descriptors, chosen algos, workspaces) used by the function forms."""
    _cache.clear()
    _fast.clear()


def _graph(name: str):
    try:
        from . import graph as cudnn_graph
    except ImportError as exc:
        raise NotSupportedError(f"the cuDNN graph API (rawconv.cudnn_graph) is not available: {exc}",
                                library="cuDNN") from None
    fn = getattr(cudnn_graph, name, None)
    if fn is None:
        raise NotSupportedError(f"rawconv.cudnn_graph has no {name}() (the graph API is not available for "
                                f"this direction yet)", library="cuDNN")
    return fn


def _fast_key(tag, *parts):
    """The function forms' fast-path key: ``(tag, *parts)`` when it hashes, else None. Callers pass
    the user's non-tensor arguments through :func:`rawconv._plans.arg_key` (1, 1.0 and True, a list
    and a tuple are told apart: a plan is never reused for an argument its checks would refuse)."""
    try:
        key = (tag,) + parts
        hash(key)
        return key
    except TypeError:
        return None


def _forward_key(x, w, bias, stride, padding, dilation, groups, algo, math, deterministic, workspace_limit,
                 activation):
    """:func:`forward`'s fast-path key (tensors' metadata and the arguments after :func:`normalize_choice`),
    or None when it does not hash. Raises AttributeError for an argument that is not a tensor."""
    return _fast_key("f", x.shape, x.stride(), x.dtype, x.device, w.shape, w.stride(), w.dtype, w.device,
                     None if bias is None else (bias.shape, bias.dtype, bias.device), arg_key(stride),
                     arg_key(padding), arg_key(dilation), arg_key(groups), arg_key(algo), arg_key(math),
                     arg_key(deterministic), arg_key(workspace_limit), arg_key(activation))


def cached_forward_plan(x, w, bias, stride, padding, dilation, groups, algo, math, deterministic, workspace_limit,
                        activation) -> Convolution:
    """The cached forward plan of :func:`forward`'s arguments (after :func:`normalize_choice`): found by
    :func:`_forward_key` (no validation, no heuristic query: the plan keeps its chosen algo), else
    built, validated and cached."""
    try:
        key = _forward_key(x, w, bias, stride, padding, dilation, groups, algo, math, deterministic, workspace_limit,
                           activation)
    except AttributeError:
        key = None
    plan = _fast.get(key) if key is not None else None
    if plan is None:
        problem = ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups)
        _check_device(problem)
        plan = cached_plan(problem, "forward", weights_layout(w, problem), algo, math, deterministic, workspace_limit, activation)
        if key is not None:
            _fast.put(key, plan)
    return plan


def forward(x: torch.Tensor = None, w: torch.Tensor = None, bias: torch.Tensor | None = None, stride: Any = 1,
            padding: Any = 0, dilation: Any = 1, groups: int = 1, *, algo: Any = None, math: str | None = None,
            deterministic: bool = False, workspace_limit: int | None = None, activation: str | None = None,
            out: torch.Tensor | None = None, engine: Any = None, return_info: bool = False, choice: Any = None,
            precision: str | None = None, input: torch.Tensor | None = None, weight: torch.Tensor | None = None):
    """cuDNN forward convolution with the semantics of ``torch.nn.functional.conv{1,2,3}d``.

    ``x``: (N, C, *spatial) or unbatched (C, *spatial), CUDA, float32 / float16 / bfloat16 / float64,
    NCHW or channels_last (taken as they are). ``w``: (K, C/groups, *kernel). ``bias``: (K,).
    ``padding``: int, tuple, ``"same"``/``"valid"`` or one ``(before, after)`` pair per dim.
    ``algo``: None (cuDNN's heuristic, ``cudnnGetConvolutionForwardAlgorithm_v7``), ``"fastest"``
    (measured by ``cudnnFindConvolutionForwardAlgorithmEx``, cached per problem), or a name
    (``"IMPLICIT_PRECOMP_GEMM"``, ``"WINOGRAD_NONFUSED"``, ...) or enum value forcing that algo.
    ``math``: ``"fma"`` (IEEE; default for fp32/fp64), ``"tensor_op"`` (default for fp16/bf16; TF32 for
    fp32), ``"tensor_op_allow_conversion"``, ``"default"`` (cuDNN's: TF32 for fp32 on Ampere+).
    ``deterministic``: only deterministic algos. ``workspace_limit``: bytes. ``activation``:
    ``"relu"``, ``"identity"``, ``"sigmoid"``, ``"tanh"``, ``"elu"``; with a bias, relu/identity run
    fused (``cudnnConvolutionBiasActivationForward``) when cuDNN allows, else unfused (RunInfo says).
    ``engine``: run through the graph API instead (:mod:`rawconv.cudnn_graph`). ``choice``:
    rawconv's word for what runs: an :class:`Algorithm` row or ``"ALGO@math"`` (legacy API), or a
    graph engine config name (``"eng28{k2=3}"``: graph API). ``precision``: rawconv's word for the
    math type (:mod:`rawconv.options`: ``"strict"`` = the dtype's default, ``"tf32"``,
    ``"bf16"``/``"f16"``, ``"any"``). Returns y (N, K, *out) in x's layout, or ``(y, RunInfo)``
    with ``return_info``.

    Raises :class:`ArgumentError` / :class:`ArgumentTypeError` for bad input (before any C call;
    CPU tensors are pointed to :mod:`rawconv.onednn`), :class:`NotSupportedError` for a forced
    algo cuDNN does not support here (naming those it does) or tensors past the int32 limit.
    Wraps ``cudnnConvolutionForward``. Tensors that require grad (grad mode on) run as
    :func:`rawconv.ops.conv` (autograd recorded; ``out``, ``return_info``, ``activation``,
    ``deterministic`` and ``workspace_limit`` are then refused with :class:`ArgumentError`).
    torch's names work too: ``input=`` / ``weight=`` (``F.conv2d``'s) for ``x`` / ``w``.
    """
    if x is None or w is None or input is not None or weight is not None:
        x, w = torch_names(x, w, input, weight, "rawconv.cudnn.forward")
    if _needs_grad(x, w, bias):   # record a differentiable op, never a silent detach
        _cudnn_function = _grad_slot("cudnn")
        return _cudnn_function("forward", x, w, bias, stride, padding, dilation, groups, algo=algo, math=math,
                               deterministic=deterministic, workspace_limit=workspace_limit, out=out, engine=engine,
                               return_info=return_info, choice=choice, precision=precision, activation=activation)
    algo, math, engine = normalize_choice("forward", algo, choice, math, precision, engine)
    if engine is not None:
        kw = {k: v for k, v in (("math", math), ("out", out), ("activation", activation)) if v is not None}
        return _graph("forward")(x, w, bias, stride, padding, dilation, groups, engine=engine, **kw)
    plan = cached_forward_plan(x, w, bias, stride, padding, dilation, groups, algo, math, deterministic, workspace_limit,
                               activation)
    return plan.execute(x, w, bias, out, return_info=return_info)



def _check_shape_arg(shape, name):
    if not isinstance(shape, (tuple, list, torch.Size)) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise ArgumentTypeError(f"{name} must be a tuple of non-negative ints, got {shape!r}")


def grad_problem(grad_y, w_or_x, shape, stride, padding, dilation, groups, direction) -> ConvProblem:
    """The forward problem of a backward call (``direction`` ``"backward_data"``: ``grad_y``, w,
    x's ``shape``; ``"backward_weights"``: ``grad_y``, x, w's ``shape``); raises
    :class:`ArgumentTypeError` / :class:`ArgumentError` for bad input, before any C call."""
    if not isinstance(grad_y, torch.Tensor) or not isinstance(w_or_x, torch.Tensor):
        raise ArgumentTypeError("grad_y and " + ("w" if direction == "backward_data" else "x")
                                + " must be torch.Tensor")
    if direction == "backward_data":
        _check_shape_arg(shape, "x_shape")
        problem = ConvProblem.from_torch(shape_only(shape, grad_y, "x_shape"), w_or_x, None, stride, padding,
                                         dilation, groups)
    else:
        _check_shape_arg(shape, "w_shape")
        problem = ConvProblem.from_torch(w_or_x, shape_only(shape, grad_y, "w_shape"), None, stride, padding,
                                         dilation, groups)
    if direction == "backward_data" and grad_y.dim() >= 3 and layout_of(grad_y) == "nhwc":
        problem = problem.with_(layout="nhwc")
    _check_device(problem)
    check_tensor(problem, grad_y, "grad_y", problem.y_shape)
    if grad_y.device != w_or_x.device:
        raise ArgumentError(f"grad_y must be on {w_or_x.device}, got {grad_y.device}")
    return problem


def backward_data(grad_y: torch.Tensor, w: torch.Tensor, x_shape: Sequence[int], stride: Any = 1,
                  padding: Any = 0, dilation: Any = 1, groups: int = 1, *, algo: Any = None,
                  math: str | None = None, deterministic: bool = False, workspace_limit: int | None = None,
                  out: torch.Tensor | None = None, engine: Any = None, return_info: bool = False,
                  choice: Any = None, precision: str | None = None):
    """Gradient of the forward convolution with respect to its input (``torch.nn.grad.conv2d_input``).

    ``grad_y``: (N, K, *out), CUDA, NCHW or channels_last; ``w``: (K, C/groups, *kernel);
    ``x_shape``: the forward input's shape (N, C, *spatial). Returns dx of ``x_shape`` in grad_y's
    layout (or ``(dx, RunInfo)``). ``algo``/``math``/``deterministic``/``workspace_limit`` as in
    :func:`forward`, with backward-data algo names (``"ALGO_0"``, ``"ALGO_1"``, ``"FFT"``,
    ``"FFT_TILING"``, ``"WINOGRAD"``, ``"WINOGRAD_NONFUSED"``). Raises as :func:`forward`.
    ``choice``/``precision`` as in :func:`forward`. Wraps ``cudnnConvolutionBackwardData``.
    Tensors that require grad run as :func:`rawconv.ops.conv_backward_data` (as :func:`forward` does).
    """
    if _needs_grad(grad_y, w):
        _cudnn_function = _grad_slot("cudnn")
        return _cudnn_function("backward_data", grad_y, w, x_shape, stride, padding, dilation, groups, algo=algo,
                               math=math, deterministic=deterministic, workspace_limit=workspace_limit, out=out,
                               engine=engine, return_info=return_info, choice=choice, precision=precision)
    algo, math, engine = normalize_choice("backward_data", algo, choice, math, precision, engine)
    if engine is not None:
        kw = {k: v for k, v in (("math", math), ("out", out)) if v is not None}
        return _graph("backward_data")(grad_y, w, x_shape, stride, padding, dilation, groups, engine=engine, **kw)
    try:
        key = _fast_key("d", grad_y.shape, grad_y.stride(), grad_y.dtype, grad_y.device, w.shape, w.stride(),
                        w.dtype, w.device, arg_key(tuple(x_shape)), arg_key(stride), arg_key(padding),
                        arg_key(dilation), arg_key(groups), arg_key(algo), arg_key(math), arg_key(deterministic),
                        arg_key(workspace_limit))
    except (AttributeError, TypeError):
        key = None
    plan = _fast.get(key) if key is not None else None
    if plan is None:
        problem = grad_problem(grad_y, w, x_shape, stride, padding, dilation, groups, "backward_data")
        plan = cached_plan(problem, "backward_data", weights_layout(w, problem), algo, math, deterministic, workspace_limit, None)
        if key is not None:
            _fast.put(key, plan)
    return plan.execute(grad_y=grad_y, w=w, out=out, return_info=return_info)


def backward_weights(x: torch.Tensor, grad_y: torch.Tensor, w_shape: Sequence[int], stride: Any = 1,
                     padding: Any = 0, dilation: Any = 1, groups: int = 1, *, algo: Any = None,
                     math: str | None = None, deterministic: bool = False, workspace_limit: int | None = None,
                     w_layout: str | None = None, out: torch.Tensor | None = None, engine: Any = None,
                     return_info: bool = False, choice: Any = None, precision: str | None = None):
    """Gradient of the forward convolution with respect to its weights (``torch.nn.grad.conv2d_weight``).

    ``x``: (N, C, *spatial), CUDA; ``grad_y``: (N, K, *out) in x's layout; ``w_shape``:
    (K, C/groups, *kernel). Returns dw (in ``w_layout``: "nchw" or "nhwc", default x's layout), or
    ``(dw, RunInfo)``. Algo names: ``"ALGO_0"``, ``"ALGO_1"``, ``"FFT"``, ``"ALGO_3"``,
    ``"WINOGRAD_NONFUSED"``, ``"FFT_TILING"``. Raises as :func:`forward`.
    ``choice``/``precision`` as in :func:`forward`. :func:`backward_filter` is cuDNN's name for it.
    Wraps ``cudnnConvolutionBackwardFilter``. Tensors that require grad run as
    :func:`rawconv.ops.conv_backward_weights` (as :func:`forward` does).
    """
    if _needs_grad(x, grad_y):
        _cudnn_function = _grad_slot("cudnn")
        return _cudnn_function("backward_weights", x, grad_y, w_shape, stride, padding, dilation, groups, algo=algo,
                               math=math, deterministic=deterministic, workspace_limit=workspace_limit, out=out,
                               engine=engine, return_info=return_info, choice=choice, precision=precision,
                               w_layout=w_layout)
    algo, math, engine = normalize_choice("backward_weights", algo, choice, math, precision, engine)
    if engine is not None:
        kw = {k: v for k, v in (("math", math), ("out", out)) if v is not None}
        return _graph("backward_weights")(x, grad_y, w_shape, stride, padding, dilation, groups, engine=engine, **kw)
    if w_layout is not None and w_layout not in ("nchw", "nhwc"):
        raise ArgumentError(f"w_layout must be 'nchw' or 'nhwc', got {w_layout!r}")
    try:
        key = _fast_key("w", x.shape, x.stride(), x.dtype, x.device, grad_y.shape, grad_y.stride(), grad_y.dtype,
                        grad_y.device, arg_key(tuple(w_shape)), arg_key(stride), arg_key(padding),
                        arg_key(dilation), arg_key(groups), arg_key(algo), arg_key(math), arg_key(deterministic),
                        arg_key(workspace_limit), arg_key(w_layout))
    except (AttributeError, TypeError):
        key = None
    plan = _fast.get(key) if key is not None else None
    if plan is None:
        problem = grad_problem(grad_y, x, w_shape, stride, padding, dilation, groups, "backward_weights")
        plan = cached_plan(problem, "backward_weights", w_layout or problem.layout, algo, math, deterministic,
                           workspace_limit, None)
        if key is not None:
            _fast.put(key, plan)
    return plan.execute(x, grad_y=grad_y, out=out, return_info=return_info)


backward_filter = backward_weights   # cuDNN's name


def conv_transpose(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
                   padding: Any = 0, output_padding: Any = 0, groups: int = 1, dilation: Any = 1, *,
                   algo: Any = None, math: str | None = None, deterministic: bool = False,
                   workspace_limit: int | None = None, out: torch.Tensor | None = None, return_info: bool = False):
    """Transposed convolution with the semantics (and argument order) of
    ``torch.nn.functional.conv_transpose{1,2,3}d``, run as cuDNN backward data.

    ``x``: (N, C_in, *spatial); ``w``: (C_in, C_out/groups, *kernel); ``bias``: (C_out,);
    ``output_padding`` < max(stride, dilation) per dim. Returns (N, C_out, *out) with
    ``out = (in - 1)*stride - 2*padding + dilation*(kernel - 1) + output_padding + 1``.
    Wraps ``cudnnConvolutionBackwardData``.
    """
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ArgumentTypeError("x and w must be torch.Tensor")
    if w.dim() not in (3, 4, 5):
        raise ArgumentError(f"weight must be 3-D, 4-D or 5-D (C_in, C_out/groups, *kernel), got {tuple(w.shape)}")
    nd = w.dim() - 2
    from ..core.problem import tuple_arg as _tuple

    s, p = _tuple(stride, nd, "stride", 1), _tuple(padding, nd, "padding", 0)
    d, op = _tuple(dilation, nd, "dilation", 1), _tuple(output_padding, nd, "output_padding", 0)
    if any(o >= max(si, di) for o, si, di in zip(op, s, d)):
        raise ArgumentError(f"output_padding {op} must be smaller than stride {s} or dilation {d} (as in torch)")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise ArgumentError(f"groups must be a positive int, got {groups!r}")
    unbatched = x.dim() == nd + 1
    xb = x.unsqueeze(0) if unbatched else x
    if xb.dim() != nd + 2:
        raise ArgumentError(f"input must be {nd + 2}-D (N, C_in, *spatial) or unbatched, got {tuple(x.shape)}")
    if xb.shape[1] != w.shape[0]:
        raise ArgumentError(f"input has {xb.shape[1]} channels but weight {tuple(w.shape)} expects {w.shape[0]}")
    outs = tuple((i - 1) * si - 2 * pi + di * (k - 1) + oi + 1
                 for i, si, pi, di, k, oi in zip(xb.shape[2:], s, p, d, w.shape[2:], op))
    if any(o <= 0 for o in outs):
        raise ArgumentError(f"transposed convolution output size {outs} is not positive")
    x_shape = (xb.shape[0], w.shape[1] * groups) + outs
    res = backward_data(xb, w, x_shape, s, p, d, groups, algo=algo, math=math, deterministic=deterministic,
                        workspace_limit=workspace_limit, out=out, return_info=return_info)
    y, info = res if return_info else (res, None)
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (x_shape[1],):
            raise ArgumentError(f"bias must be a tensor of shape ({x_shape[1]},)")
        y.add_(bias.view(1, -1, *([1] * nd)))
    if unbatched:
        y = y.squeeze(0)
    return (y, info) if return_info else y


def algorithms(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
               padding: Any = 0, dilation: Any = 1, groups: int = 1, *, direction: str = "forward",
               mode: str = "find", math: str | None = "all", deterministic: bool = False,
               workspace_limit: int | None = None) -> list[Algorithm]:
    """Every (algo, math type) row cuDNN reports for this convolution (:class:`Algorithm`: name,
    status, time in ms measured by Find, workspace bytes, determinism, math type).

    Arguments as in :func:`forward`; for ``direction="backward_data"`` / ``"backward_filter"`` pass
    the forward problem's x and w. ``mode``: ``"find"`` (``cudnnFind*AlgorithmEx``: runs and times
    each algo) or ``"heuristic"`` (``cudnnGet*Algorithm_v7``). ``math``: ``"all"`` (every math type
    set in turn, rows merged), one math type, or None (the dtype's default). ``workspace_limit``
    caps the workspace Find may use (bytes).
    """
    direction = canonical_direction(direction)
    problem = ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups)
    _check_device(problem)
    if problem.is_empty:
        return []
    plan = cached_plan(problem, direction, weights_layout(w, problem), None, None if math == "all" else math, deterministic,
                       workspace_limit, None)
    return plan.algorithms(mode, math)


def candidates(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
               padding: Any = 0, dilation: Any = 1, groups: int = 1, *, direction: str = "forward",
               mode: str = "find", math: str | None = "all", deterministic: bool = False,
               workspace_limit: int | None = None) -> list[Algorithm]:
    """rawconv's word for :func:`algorithms` (every backend has ``candidates``); the same rows."""
    return algorithms(x, w, bias, stride, padding, dilation, groups, direction=direction, mode=mode, math=math,
                      deterministic=deterministic, workspace_limit=workspace_limit)


# ---------------------------------------------------------------------------- info and graph re-exports
from .library import info, library_version  # noqa: E402,F401 - handed on


class ResidualBiasActivation:
    """``act(conv(x, w) + bias + z)`` as ONE legacy cuDNN call: ``cudnnConvolutionBiasActivationForward``
    with a residual tensor ``z`` of y's shape and layout (``y = act(alpha1 * conv + alpha2 * z + bias)``,
    alpha1 = alpha2 = 1), on a :class:`Convolution` plan of ``problem`` forced to ``algo``
    (``"IMPLICIT_PRECOMP_GEMM"``, ...). ``activation``: ``"relu"`` or None (identity, which cuDNN
    fuses only with ``IMPLICIT_PRECOMP_GEMM``); ``allow_tf32``: the plan's precision "tf32", else
    "strict". :attr:`name` is ``"legacy:<algo>"``.

    :meth:`call` takes tensors already checked against the problem (roles ``x``, ``w``, ``b``,
    ``r`` (z) and ``y``, in the problem's layout, as a fused graph plan binds them) and launches on
    torch's current stream; its workspace is the plan's on the default stream, else this call's
    from torch's caching allocator (capture-safe). cuDNN spends 140-230 µs of host time per call
    here (H100 host, cuDNN 9.19): meant for CUDA-graph captures (``rawconv.fused``'s capture choice).

    Raises :class:`NotSupportedError` for another activation, an unbatched or empty problem, an algo
    cuDNN does not offer or does not fuse with the bias and activation, or a problem the plan would
    pad or split by batch. Wraps ``cudnnConvolutionBiasActivationForward``."""

    def __init__(self, problem: ConvProblem, activation: str | None, allow_tf32: bool, algo: str):
        if not isinstance(problem, ConvProblem):
            raise ArgumentTypeError(f"problem must be a ConvProblem, got {type(problem).__name__}")
        if not isinstance(allow_tf32, bool) or not isinstance(algo, str):
            raise ArgumentTypeError(f"allow_tf32 must be a bool and algo a name, got {allow_tf32!r}, {algo!r}")
        if activation not in (None, "relu") or problem.unbatched or problem.is_empty:
            raise NotSupportedError(f"no legacy fused residual call for {activation} on {problem.describe()}")
        self.plan = plan = Convolution.from_problem(problem, activation=activation, algo=algo,
                                                    precision="tf32" if allow_tf32 else "strict")
        info = plan.info
        if not info.fused or plan._asym or plan.batch_chunk < problem.n:
            raise NotSupportedError(f"cuDNN does not fuse {algo} with bias and {activation or 'identity'} in one call "
                                    f"for {problem.describe()}")
        self.name = "legacy:" + algo
        self.device_index = plan.device_index
        self.info = info
        self.descs = plan.descriptors(problem.n) + (plan._bias_desc(), plan._act_desc())
        self.one = ffi.new("double *" if problem.dtype == "float64" else "float *", 1.0)
        self.median_ms: float | None = None   # its GPU time when a search timed it

    @staticmethod
    def _on_device(v: torch.Tensor, index: int) -> bool:
        return v.is_cuda and v.get_device() == index

    def _check(self, t) -> None:
        """Every tensor of ``t`` as the descriptors describe it (shape, dtype, device, dense strides
        in the problem's layout, bias contiguous) and y apart from every input's storage; else
        :class:`ArgumentError` (before any cuDNN call)."""
        plan = self.plan
        p = plan.problem
        if not isinstance(t, dict):
            raise ArgumentTypeError(f"call takes a dict of tensors by role (x, w, b, r, y), got {type(t).__name__}")
        want = {"x": (p.x_shape, p.layout), "w": (p.w_shape, plan.w_layout), "b": ((p.k,), "nchw"),
                "r": (p.y_shape, p.layout), "y": (p.y_shape, p.layout)}
        for role, (shape, layout) in want.items():
            v = t.get(role)
            if type(v) not in (torch.Tensor, torch.nn.Parameter):
                raise ArgumentTypeError(f"{role}: a CUDA tensor expected, got {type(v).__name__}")
            if tuple(v.shape) != tuple(shape) or v.dtype != p.torch_dtype or not self._on_device(v, plan.device_index) \
                    or not strides_match(v, dense_strides(shape, layout)) or v.is_neg() or v.is_conj():
                raise ArgumentError(f"{role} must be a dense {layout} {p.torch_dtype} tensor of shape {tuple(shape)} on "
                                    f"cuda:{plan.device_index} ({self.name} on {p.describe()}); got shape "
                                    f"{tuple(v.shape)}, strides {v.stride()}, {v.dtype} on {v.device}")
        store = {r: t[r].untyped_storage().data_ptr() for r in want}
        if store["y"] in (store["x"], store["w"], store["b"], store["r"]):
            raise ArgumentError("y must not share memory with x, w, b or r")

    @_cuda.on_plan_device
    def call(self, t: dict) -> None:
        """One call on the tensors ``t`` (roles x, w, b, r, y; each checked against the problem:
        :class:`ArgumentError` / :class:`ArgumentTypeError` when one does not fit), on torch's
        current stream."""
        self._check(t)
        plan, info = self.plan, self.info
        h = _cuda.handle_for(plan.device_index)
        keep, pws, stable = plan._workspace(_cuda.current_stream_of_handle(plan.device_index))
        xd, wd, yd, cd, bd, ad = self.descs
        cast, one = ffi.cast, self.one
        with plan._launching(keep, stable):
            st = _cudnn.lib().cudnnConvolutionBiasActivationForward(
                h, one, xd, cast("void *", t["x"].data_ptr()), wd, cast("void *", t["w"].data_ptr()), cd,
                info.algo_id, pws, info.workspace_bytes, one, yd, cast("void *", t["r"].data_ptr()), bd,
                cast("void *", t["b"].data_ptr()), ad, yd, cast("void *", t["y"].data_ptr()))
        del keep
        if st:
            raise _cudnn.error(st, "cudnnConvolutionBiasActivationForward", f"{self.name} on {plan.problem.describe()}")

    def capture_fails(self, t: dict) -> str:
        """Why :meth:`call` on ``t`` cannot run inside a CUDA-graph capture, or ``""``
        (``rawconv._cuda.capture_fails``: once, inside a throwaway capture)."""
        return _cuda.capture_fails(lambda: self.call(t))


from ..core import tuning as _tuning  # noqa: E402

_tuning.register_environment("cudnn", environment)


# ---------------------------------------------------------------------------- capabilities
_CAPS: dict = {}
_CAPS_LOCK = threading.Lock()
# (dtype, fpmath key, math type set on the descriptor, layout of the probe)
_CAP_MODES = (("float32", "strict", "fma", "nchw"), ("float32", "tf32", "default", "nchw"),
              ("float16", "strict", "tensor_op", "nhwc"), ("bfloat16", "strict", "tensor_op", "nhwc"),
              ("float64", "strict", "fma", "nchw"))


def capabilities(refresh: bool = False, device: int | None = None):
    """What this cuDNN offers on this GPU, asked of cuDNN: a :class:`rawconv._capabilities.Capabilities`.

    For each direction ("forward", "backward_data", "backward_weights" = cuDNN's backward
    filter) and precision: float32 with ``CUDNN_FMA_MATH`` (IEEE, ``fpmath="strict"``), float32
    with ``CUDNN_DEFAULT_MATH`` (``fpmath="tf32"``: cuDNN may use TF32 tensor cores; counted as
    offered from compute capability 8.0), float16 and bfloat16 with ``CUDNN_TENSOR_OP_MATH``
    (NHWC), float64 with FMA math: the algos the legacy heuristic (``cudnnGet*Algorithm_v7``)
    reports with ``CUDNN_STATUS_SUCCESS`` for a tiny problem (batch 1, 16 -> 16 channels, 8x8,
    3x3, padding 1). Nothing runs on the GPU.

    ``device``: a CUDA device index (default: torch's current device, or 0). Cached per process
    and device (``refresh=True`` probes again). Raises
    :class:`~rawconv.errors.DeviceNotAvailableError` when torch sees no such GPU (before
    ``cudnnCreate``, which would fail with ``CUDNN_STATUS_NOT_INITIALIZED``), and
    :class:`~rawconv.errors.LibraryNotFoundError` when libcudnn cannot be loaded. Wraps
    ``cudnnCreate``, ``cudnnGetConvolution{Forward,BackwardData,BackwardFilter}Algorithm_v7``,
    ``cudnnGetVersion``.
    """
    from ..core.capabilities import Capabilities, CapabilityRow
    from ..core.errors import LibraryError

    if not isinstance(refresh, bool):
        raise ArgumentTypeError(f"refresh must be True or False, got {refresh!r}")
    if device is None:
        idx = torch.cuda.current_device() if torch.cuda.is_available() else 0
    elif isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ArgumentError(f"device must be a CUDA device index (int >= 0) or None, got {device!r}")
    else:
        idx = device
    caps = _CAPS.get(idx)
    if caps is not None and not refresh:
        return caps
    with _CAPS_LOCK:
        caps = _CAPS.get(idx)
        if caps is not None and not refresh:
            return caps
        _cudnn.lib()
        if not torch.cuda.is_available() or idx >= torch.cuda.device_count():
            from ..core.errors import DeviceNotAvailableError

            seen = ("no CUDA GPU" if not torch.cuda.is_available()
                    else f"{torch.cuda.device_count()} CUDA device(s)")
            raise DeviceNotAvailableError(f"rawconv.cudnn.capabilities: torch sees {seen} here, and cuDNN needs "
                                          f"one to answer (device {idx}; cudnnCreate would fail)")
        _cuda.handle_for(idx)
        cc = torch.cuda.get_device_capability(idx)
        platform = f"{torch.cuda.get_device_name(idx)} (compute capability {cc[0]}.{cc[1]})"
        rows = []
        for direction in ("forward", "backward_data", "backward_weights"):
            for dtype, key, math, layout in _CAP_MODES:
                problem = ConvProblem(n=1, c=16, k=16, in_spatial=(8, 8), kernel=(3, 3), pad_before=(1, 1),
                                      pad_after=(1, 1), dtype=dtype, layout=layout, device=f"cuda:{idx}")
                plan = Convolution.from_problem(problem, direction=direction, math=math)
                names, status = [], "ok"
                try:
                    names = list(dict.fromkeys(r.algo for r in plan.algorithms("heuristic", math) if r.ok))
                    if not names:
                        status = "no algo with CUDNN_STATUS_SUCCESS"
                except LibraryError as exc:
                    status = exc.status_name or type(exc).__name__
                finally:
                    plan.free()
                if key == "tf32" and cc[0] < 8 and names:
                    names, status = [], f"no TF32 tensor cores before compute capability 8.0 (this GPU: {cc[0]}.{cc[1]})"
                setting = f"math {math}" + (" (TF32 allowed)" if key == "tf32" else "")
                rows.append(CapabilityRow(direction, dtype, key, tuple(names), (), status, setting, None))
        caps = Capabilities("cuDNN", _cudnn.version()["version"], platform,
                            "n1 c16 k16 8x8 3x3 padding 1 (NCHW for float32/float64, NHWC for float16/bfloat16)",
                            tuple(rows))
        _CAPS[idx] = caps
    return caps


def __getattr__(name):  # lazy re-exports of the graph API: rawconv.cudnn.engines, EngineConfig
    if name in ("engines", "EngineConfig"):
        try:
            from . import graph as cudnn_graph
        except ImportError as exc:
            raise AttributeError(f"rawconv.cudnn.{name} needs rawconv.cudnn_graph, which is not available: "
                                 f"{exc}") from None
        return getattr(cudnn_graph, name)
    raise AttributeError(f"module 'rawconv.cudnn' has no attribute {name!r}")


# ---------------------------------------------------------------------------- the registry
def _registry_candidates(problem: ConvProblem, direction: str = "forward", options: Any = None) -> ResultTable:
    return Convolution.from_problem(problem, direction=direction, options=options).algorithms("find", "all")


def _registry_plan(problem: ConvProblem, direction: str = "forward", options: Any = None, choice: Any = None):
    return Convolution.from_problem(problem, direction=direction, options=options, choice=choice)


# every public entry point raises only rawconv's exception classes (rawconv._guard)
_guard.guard_module(globals(), "forward", "backward_data", "backward_weights", "conv_transpose", "algorithms",
                    "candidates", "info", "capabilities", "Convolution.__init__",
                    "Convolution.from_problem", "Convolution.execute", "Convolution.__call__", "Convolution.candidates")
backward_filter = backward_weights   # cuDNN's name

from ..core.backend import Backend as _Backend, register as _register  # noqa: E402

_register(_Backend("cudnn", "cuda", __name__, "cuDNN", _registry_candidates, _registry_plan, info,
                   "cuDNN's legacy API on CUDA tensors: every (algo, math type)",
                   {"candidates": "algorithms", "choice": "algo", "precision": "math",
                    "backward_weights": "backward_filter"}, rows="rawconv.explore.cudnn_rows:cudnn_rows",
                   # "ALGO@math": an algorithm of cuDNN's enums (any direction), a math type
                   choice_names="(" + "|".join(sorted({n for d in DIRECTIONS for n in ALGOS[d].values()}, key=len,
                                                      reverse=True))
                   + ")(@(" + "|".join(MATH_TYPES) + "))?"))
