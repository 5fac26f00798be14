"""The legacy API plan (a part of :mod:`rawconv.cudnn`, the face, which hands its names on):
:class:`Convolution` (construction, execution, the hot path's packs, lifetime; its descriptors, algo
queries and selection are the :mod:`.algorithms` mixin, its timed search :mod:`.autotune`) and
:class:`ResidualBiasActivation` (conv + bias + residual + activation as one legacy call on such a plan)."""
from __future__ import annotations

import math as _math
import threading
from typing import Any

import torch

from .. import _cuda, _ffi as _cudnn
from .._ffi import ffi
from ...core import guard as _guard
from ...core.errors import ArgumentError, ArgumentTypeError, NotSupportedError
from ...core.plans import PlanLifetime
from ...core.backend import canonical_direction
from ...core.results import ResultTable
from ...core.problem import ConvProblem, empty_like_layout, to_layout, dense_strides, strides_match
from .common import (ACTIVATIONS, ALGOS, INT32_LIMIT, RunInfo, _ACT_FNS, _check_device, _math_name, _math_of,
                     _split_choice, resolve_algo, weights_layout)
from .algorithms import Algorithms as _Algorithms  # descriptors, queries, selection
from .autotune import Autotune as _Autotune  # the timed search, tuning records
from .hot import _Hot

FACE = "rawconv.cudnn"   # where this module's names live (rawconv.cudnn): pickles, messages


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
            from ...core.options import options_of

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


# (the face's, as before the split: pickles, the API reference, the guard's messages)
Convolution.__module__ = ResidualBiasActivation.__module__ = FACE

# every public entry point raises only rawconv's exception classes (rawconv._guard)
_guard.guard_module(globals(), "Convolution.__init__", "Convolution.from_problem", "Convolution.execute",
                    "Convolution.__call__", "Convolution.candidates", where=FACE)
