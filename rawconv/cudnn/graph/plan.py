"""The graph API's plan (a part of :mod:`rawconv.cudnn_graph`, the face, which hands its names on):
:class:`GraphConvolution` (construction, binding, execution, the "nhwc:" and unfused configs, the
capture probe, lifetime; its graph, engines and selection are the :mod:`.engines` mixin, its autotune
:mod:`.autotune`), its hot path's prepared call :class:`_GraphHot`, and the settings it reads
(:data:`DEFAULT_UNFUSED`, :data:`CAPTURE_PROBE`: set on the face, they are set here)."""
from __future__ import annotations

import math
import operator
import threading
from typing import Any, Sequence

import torch

from .. import _cuda, _ffi as _cudnn
from . import _backend_api as B
from . import common as _o   # known_wrong, read at call time (set on the face, it is set there)
from . import operation as _op   # check_result, read at call time (set on the face, it is set there)
from ...core import guard as _guard, plans as _budget
from .search import TimedConfig
from ...core.errors import ArgumentError, ArgumentTypeError, NotSupportedError
from ...core.check import ErrorStats
from ...core.results import ResultTable
from ...core.plans import PlanLifetime
from ...core.problem import ConvProblem, empty_like_layout, dense_strides
from .common import (ALIGNMENT, DTYPES, HEURISTIC_MODES, _OUT_ROLE, _ROLES, _ROLE_WORDS, _VPS_KEPT, EngineConfig,
                     _Built, _stream_lock, torch_epilogue)
from .operation import OperationGraph, _device_index, _lift, _norm_direction, check_activation, tolerance_args
from .engines import Engines as _Engines, empty_result as _empty_result  # the graph, its engines, selection
from .autotune import Autotune as _Autotune  # the search's entry point, tuning records

FACE = "rawconv.cudnn.graph"   # where this module's names live (rawconv.cudnn_graph): pickles, messages


# the default selection runs a bias-only graph, and a grouped convolution's fused graph, as torch
# does: the convolution-only graph's default config, then torch's ops (GraphConvolution._default_split)
DEFAULT_UNFUSED = True


# probe every config chosen by name (select, autotune's choice, a tuning-cache hit) inside a
# throwaway CUDA-graph capture once, and give one that cannot be captured a capturable stand-in
# for calls made while a capture runs (GraphConvolution._probe_capture)
CAPTURE_PROBE = True


class _GraphHot:
    """A plan's prepared argument pack for :meth:`GraphConvolution.execute`'s hot path, in every
    direction: the finalized plan it ran, the tensors' pack (:class:`rawconv._cuda.HotArgs` over
    the direction's two inputs, the bias and the output: forward ``(x, w, bias, y)``, backward
    data ``(grad_y, w, -, dx)``, backward weights ``(x, grad_y, -, dw)``; each tensor's shape and
    strides as the caller passed it, used as it was: no copy, no unsqueeze; dtype, device, the
    output's shape and strides, 16-byte alignment, the byte extents that reject an ``out``
    overlapping an input) and the order of the data pointers in the variant pack."""

    __slots__ = ("built", "args", "order", "pick")

    # (inputs a, b, bias, out) -> the graph's roles, per direction (see _ROLES)
    _ORDER = {"forward": (0, 1, 3), "backward_data": (3, 1, 0), "backward_weights": (0, 3, 1)}

    @classmethod
    def of(cls, plan: "GraphConvolution", built: "_Built", t: dict, a, b, bias, out) -> "_GraphHot | None":
        """The pack of a checked call that bound ``t`` from inputs ``a``, ``b`` (forward: x, w;
        backward data: grad_y, w; backward weights: x, grad_y), ``bias`` and ``out``, or None when
        a tensor was not used as it is (copied, unsqueezed, a construction tensor) or is a
        subclass, or the graph has other roles (a residual), or the problem is unbatched (the
        checked path returns y without its batch dim even for an x given with one)."""
        d = plan.direction
        if plan.problem.unbatched:
            return None
        roles = tuple(plan._graph.roles)
        if roles != _ROLES[d] and not (d == "forward" and roles == ("x", "w", "y", "b")):
            return None
        ra, rb = {"forward": ("x", "w"), "backward_data": ("dy", "w"), "backward_weights": ("x", "dy")}[d]
        out_role = _OUT_ROLE[d]
        if a is None or b is None or t[ra] is not a or t[rb] is not b or (bias is None) != ("b" not in t) \
                or (bias is not None and t["b"] is not bias) or (out is not None and t[out_role] is not out):
            return None
        args = _cuda.HotArgs.of(a, b, bias, t[out_role], plan.device_index, ALIGNMENT)
        if args is None:
            return None
        h = cls()
        h.built, h.args = built, args
        h.order = cls._ORDER[d] if bias is None else (0, 1, 3, 2)   # (x, w, b, y) -> (x, w, y, b)
        h.pick = operator.itemgetter(*h.order)   # the pointers in the variant pack's order, as one C call
        return h

    def run(self, plan: "GraphConvolution", a, b, bias, out):
        """Run when the tensors have exactly the pack's metadata (:meth:`rawconv._cuda.HotArgs.bind`):
        ``cudnnBackendExecute`` on the variant pack of their pointers; returns the output (or
        ``out``), else None (the caller takes the checked path)."""
        bound = self.args.bind(a, b, bias, out)
        if bound is None:
            return None
        p, y = bound
        plan._run(self.built, self.pick(p))
        if out is not None:
            _guard.bump((out,))   # written in place, as torch's out= functions do
        return y


class GraphConvolution(_Engines, _Autotune, PlanLifetime):
    """A cuDNN graph-API convolution plan for one problem, in the style of nvmath-python's ``Matmul``.

    ``GraphConvolution(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
    activation=None, engine=None, allow_tf32=False)``: ``x`` (N, C, *spatial) or unbatched, ``w``
    (K, C/groups, *kernel), CUDA tensors of float32, float16, bfloat16 or float64, NCHW or
    channels_last (the weights are used in x's memory format; NHWC is what most engines take).
    ``padding``: as torch, or one ``(before, after)`` pair per spatial dim. ``bias`` (K,) and
    ``activation`` (:data:`ACTIVATIONS`: ``"relu"``, ``"relu6"``, ``"tanh"``, ``"sigmoid"``,
    ``"elu"``, ``"gelu"``, ``"gelu_tanh"``, ``"silu"`` / ``"swish"``) are fused as pointwise nodes
    of the same graph.

    :meth:`engines` lists engine configs (:class:`EngineConfig`); :meth:`select` forces one;
    :meth:`autotune` times and checks candidates and selects the fastest correct one;
    :meth:`execute` runs the selected plan (cuDNN's first heuristic choice when none was selected);
    :meth:`free` (or ``with``) releases descriptors, workspace and tensor references. A plan runs
    on one stream at a time (its workspace is its own). Built for the backward passes by
    :func:`backward_data` / :func:`backward_filter` via :meth:`from_problem`.

    Raises :class:`~rawconv.errors.ArgumentError` for bad input before any C call,
    :class:`~rawconv.errors.NotSupportedError` when cuDNN offers no engine (or not the forced
    one), :class:`~rawconv.errors.LibraryError` for other cuDNN failures. Wraps
    ``cudnnBackendCreateDescriptor``, ``cudnnBackendSetAttribute``, ``cudnnBackendFinalize``,
    ``cudnnBackendGetAttribute``, ``cudnnBackendExecute``.
    """

    _unf = None      # the convolution-only plan (an "unfused:" config runs on it): see unfused()
    _split = False   # an "unfused:" config is selected


    tuning_record = None   # autotune's choice (rawconv.tuning.TuningRecord)

    def __init__(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, *, activation: str | None = None,
                 engine: Any = None, allow_tf32: bool = False):
        problem = ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups, allow_dtypes=DTYPES)
        self._init(problem, "forward", activation, allow_tf32)
        self._x, self._w, self._b = x, w, bias
        if engine is not None:
            self.select(engine)

    @classmethod
    def from_problem(cls, problem: ConvProblem, *, direction: str = "forward", activation: str | None = None,
                     engine: Any = None, allow_tf32: bool = False) -> "GraphConvolution":
        """A plan from a :class:`~rawconv.problem.ConvProblem` (no tensors needed until :meth:`execute`).
        ``direction``: ``"forward"``, ``"backward_data"``, ``"backward_filter"``."""
        if not isinstance(problem, ConvProblem):
            raise ArgumentTypeError(f"problem must be a ConvProblem, got {type(problem).__name__}")
        self = cls.__new__(cls)
        self._init(problem, direction, activation, allow_tf32)
        self._x = self._w = self._b = None
        if engine is not None:
            self.select(engine)
        return self

    def _init(self, problem, direction, activation, allow_tf32):
        direction = _norm_direction(direction)
        if problem.dtype not in DTYPES:
            raise ArgumentError(f"cuDNN graph convolutions take {list(DTYPES)}, got {problem.dtype}")
        if not isinstance(allow_tf32, bool):
            raise ArgumentTypeError(f"allow_tf32 must be a bool, got {allow_tf32!r}")
        self.problem = problem
        self.direction = direction
        self.activation = check_activation(activation, direction, problem.has_bias and direction == "forward")
        self.allow_tf32 = allow_tf32
        self.device_index = _device_index(problem)
        self._dev = torch.device("cuda", self.device_index)
        # zero-sized problems (shared/cases C1) never reach cuDNN
        self._graph = None if problem.is_empty else OperationGraph(problem, direction, self.activation, problem.layout)
        self._configs: dict[str, EngineConfig] = {}    # name -> listed/known config
        self._built: dict[str, _Built] = {}
        self._failed: dict[str, str] = {}             # name -> why it did not finalize
        self._engine_info: dict[int, tuple | None] = {}  # engine -> (notes dict, knob info) or None
        self._heur: dict[str, list[EngineConfig]] = {}
        self._selected: _Built | None = None
        self._freed = False
        self.last_autotune: list[TimedConfig] | None = None
        self._lock = threading.RLock()
        self._via_lock = threading.Lock()            # calls on the kept channels_last buffers (_run_via)
        self._cl: GraphConvolution | None = None    # the channels_last graph's plan (NCHW plans)
        self._via: GraphConvolution | None = None   # _cl when an "nhwc:" config is selected
        self._bufs: dict | None = None               # the default stream's channels_last buffers ("nhwc:")
        self._want: dict = {}
        self._hot: _GraphHot | None = None           # the hot path's argument pack (see execute)
        self._unf: GraphConvolution | None = None   # the convolution-only plan ("unfused:" configs)
        self._split = False                          # an "unfused:" config is selected (runs on _unf)

    # ------------------------------------------------------------------ execution
    def _prepare(self, role: str, t, shape) -> torch.Tensor:
        t = _cuda.check_plan_tensor(self.problem, t, role, shape, self.device_index, ("x", "y", "dx", "dy"),
                                    is_out=role in ("y", "dx", "dw"))
        want = self._want.get(role)
        if want is None:
            want = self._want[role] = tuple(self._graph.strides[role] if self._graph is not None else
                                            dense_strides(shape, self.problem.layout) if role != "b" else [1])
        st = t.stride()
        ok = st == want or all(s == 1 or a == b for s, a, b in zip(t.shape, st, want))
        if not ok or t.data_ptr() % ALIGNMENT:
            if role in ("y", "dx", "dw"):
                raise ArgumentError(f"out ({role}) must have strides {tuple(want)} (the plan's layout) and a "
                                    f"{ALIGNMENT}-byte aligned address; got strides {t.stride()}, address "
                                    f"{t.data_ptr():#x}")
            fresh = torch.empty_strided(t.shape, want, dtype=t.dtype, device=t.device)
            fresh.copy_(t)
            t = fresh
        return t

    def _run(self, b: _Built, ptrs: tuple) -> None:
        """``cudnnBackendExecute`` of ``b`` on the data pointers ``ptrs`` (the graph's roles in
        order), on torch's current stream, with the workspace :class:`_Built` says."""
        hs = _cuda.handle_state(self.device_index)
        if b.capture_alt is not None and hs.stream != 0 and _cuda._capturing():
            b = b.capture_alt   # this config cannot be captured (see _probe_capture): its stand-in
        keep, lock = None, _cuda.NO_LOCK
        if not b.workspace_bytes:
            wp = 0
        elif hs.stream == 0:   # the default stream (never captured): the plan's own, held through the launch
            keep, lock = b.default_workspace(self._dev), b.lock   # (one thread's launches at a time on it)
            wp = keep[1]
        else:   # a side or capture stream: this call's, from torch's caching allocator
            keep = _cuda.workspace(b.workspace_bytes, self._dev)
            wp = keep.data_ptr()
        vps = b.vps
        key = (ptrs, wp)
        vp = vps.get(key)
        if vp is None:
            if len(vps) >= _VPS_KEPT:
                vps.clear()
            g = self._graph
            if g.packer is None:
                g.packer = B.VariantPacker(g.uids)
            vp = vps[key] = g.packer(ptrs, wp)
        with lock:
            if b.serialize:
                _cuda.stream_barrier(self.device_index)
            status = _cudnn.lib().cudnnBackendExecute(hs.ptr, b.plan.ptr, vp.ptr)
        del keep   # back to the allocator after the launch: reused only by later work on this stream
        if status:
            raise _cudnn.error(status, "cudnnBackendExecute", f"{b.config.name} on {self._describe()}")

    def _probe_capture(self, b: _Built) -> None:
        """Whether ``b`` (a config chosen by name: :meth:`select`, autotune's choice, a tuning-cache
        hit) can run inside a CUDA-graph capture, found once: it runs on example tensors inside a
        throwaway capture (:func:`rawconv._cuda.capture_fails`). Not every config can: on an H100
        (cuDNN 9.19) autotune's choice ``eng25{k2=2,k3=1}`` for backward data (float32 NHWC,
        x (32, 512, 7, 7), w (2048, 512, 1, 1)) returned ``CUDNN_STATUS_INTERNAL_ERROR`` inside a
        capture, invalidating it. For such a config ``b.capture_alt`` becomes the first config of
        heuristic modes instant, then fallback, that can be captured (the filters and known-wrong
        list apply, as for the default selection): a call made while torch's current stream is
        being captured runs that one, every other call the chosen one. Leaves ``b`` unprobed
        inside a capture (none can be nested), for an empty problem, or with ``CAPTURE_PROBE``
        off; warns (``RuntimeWarning``) when no stand-in can be captured either."""
        if not CAPTURE_PROBE or b.capture_why is not None or self._graph is None:
            return
        try:
            if _cuda._capturing():
                return
        except RuntimeError:   # no CUDA driver (a CPU test's fake plan): nothing is ever captured
            return
        with torch.cuda.device(self.device_index):
            self._probe_on_device(b)

    def _probe_on_device(self, b: _Built) -> None:
        """:meth:`_probe_capture` with the plan's device current."""
        t = self._example(0)

        def fails(c: _Built) -> str:
            return _cuda.capture_fails(self.call_for(c, t, self.output()))
        why = b.capture_why = fails(b)
        if not why:
            return
        for mode in ("instant", "fallback"):
            for ec in self.heuristic(mode):
                if ec.name == b.config.name or self.allowed(ec) or _o.known_wrong(self.problem, self.direction,
                                                                                ec.engine):
                    continue
                try:
                    alt = self.build(ec)
                except NotSupportedError:
                    continue
                if alt.capture_why is None:
                    alt.capture_why = fails(alt)
                if not alt.capture_why:
                    b.capture_alt = alt
                    return
        import warnings
        warnings.warn(f"{b.config.name} on {self._describe()} cannot run inside a CUDA-graph capture ({why}) "
                      "and no heuristic config that can was found: capturing a call of it will fail",
                      RuntimeWarning, stacklevel=_guard.stacklevel())

    @_cuda.on_plan_device
    def _hot_forward(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None):
        """The hot path alone (see :meth:`execute`), in any direction: the output when the tensors
        fit the prepared pack exactly, else None (the caller then takes :meth:`execute`). ``x``,
        ``w``: the direction's two inputs (forward x, w; backward data grad_y, w; backward weights
        x, grad_y); ``bias``: the forward's bias or None. For the operators' CUDA kernels, which
        keep the plan of their last call with the same arguments."""
        hot = self._hot
        if hot is not None and hot.built is self._selected and self._via is None and not self._freed:
            return hot.run(self, x, w, bias, None)
        if self._split and not self._freed and self._split_bias_fits(bias) and not self._has_residual():
            y = self._unf._hot_forward(x, w, None)
            return None if y is None else torch_epilogue(y, bias, None, self.activation, self.problem.ndim)
        return None

    _hot_call = _hot_forward   # (every direction)

    @_cuda.on_plan_device
    def execute(self, x: torch.Tensor | None = None, w: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, out: torch.Tensor | None = None, *,
                grad_y: torch.Tensor | None = None) -> torch.Tensor:
        """Run the selected plan on torch's current stream and return the result (asynchronous).

        forward: ``execute(x, w=None, bias=None, out=None)`` -> y (N, K, *out) in x's layout;
        backward_data: ``execute(grad_y=dy, w=w, out=None)`` -> dx (N, C, *in);
        backward_filter: ``execute(x, grad_y=dy, out=None)`` -> dw (K, C/groups, *kernel) in the
        plan's layout. ``None`` for w/bias uses the tensors given at construction. Tensors in
        another layout, or not 16-byte aligned, are copied first (``out`` must fit as it is).
        A cached plan costs one ``cudnnBackendExecute`` plus this argument handling: variant
        packs are kept per set of data pointers. Raises :class:`ArgumentError` when tensors do
        not fit the plan. An ``"nhwc:"`` config (see :meth:`select`) first transforms the inputs
        into channels_last buffers the plan owns (:attr:`transpose_bytes`) and the result back
        (``cudnnTransformTensor``). Wraps ``cudnnBackendExecute``.
        """
        hot = self._hot
        if hot is not None and hot.built is self._selected and self._via is None and not self._freed:
            d = self.direction
            if d == "forward":
                y = None if grad_y is not None else hot.run(self, self._x if x is None else x,
                                                             self._w if w is None else w,
                                                             self._b if bias is None else bias, out)
            elif d == "backward_data":
                y = None if x is not None or bias is not None or w is None else hot.run(self, grad_y, w, None, out)
            else:
                y = None if w is not None or bias is not None or x is None else hot.run(self, x, grad_y, None, out)
            if y is not None:
                return y
        if self._split or (self._selected is None and self._via is None and not self._freed
                           and self._default_split()):
            return self._execute_split(x, w, bias, out, grad_y)
        self._check_live()
        t, result = self._bind(x, w, bias, out, grad_y)
        p = self.problem
        if out is not None:   # torch's out= rules, before anything is written
            out_role = _OUT_ROLE[self.direction]
            _guard.check_out(out, tuple((_ROLE_WORDS.get(r, r), v) for r, v in t.items() if r != out_role),
                             "rawconv.cudnn_graph.GraphConvolution.execute")
        if p.is_empty:
            result = _empty_result(self, result, t.get("b"))
        elif self._via is not None:
            self._run_via(t)
        else:
            b = self._selected or self._select_default()
            self._run(b, tuple(t[r].data_ptr() for r in self._graph.roles))
            if hot is None or hot.built is not b:
                d = self.direction
                if d == "forward":
                    self._hot = _GraphHot.of(self, b, t, self._x if x is None else x, self._w if w is None else w,
                                             self._b if bias is None else bias, out)
                elif d == "backward_data":
                    self._hot = _GraphHot.of(self, b, t, grad_y, w, None, out) if x is None else None
                else:
                    self._hot = _GraphHot.of(self, b, t, x, grad_y, None, out) if w is None else None
        if out is not None:
            _guard.bump((out,))   # written in place, as torch's out= functions do
            return out
        if p.unbatched and self.direction in ("forward", "backward_data") and not p.is_empty:
            return result.squeeze(0)
        return result

    __call__ = execute

    def _bind(self, x, w, bias, out, grad_y) -> tuple[dict, torch.Tensor]:
        """execute()'s arguments checked and in the plan's layout: ({role: tensor}, result)."""
        p, d = self.problem, self.direction
        w = self._w if w is None else w
        t = {}
        if d == "forward":
            x = self._x if x is None else x
            bias = self._b if bias is None else bias
            if x is None or w is None:
                raise ArgumentError("execute needs x and w (none were given at construction)")
            if p.has_bias != (bias is not None):
                raise ArgumentError("this plan was built " + ("with a bias: pass bias" if p.has_bias else
                                                              "without a bias; build one with bias to use it"))
            t["x"] = self._prepare("x", x, p.x_shape)
            t["w"] = self._prepare("w", w, p.w_shape)
            if p.has_bias:
                t["b"] = self._prepare("b", bias, (p.k,))
        elif d == "backward_data":
            if grad_y is None or w is None:
                raise ArgumentError("backward_data needs grad_y and w")
            t["dy"] = self._prepare("dy", grad_y, p.y_shape)
            t["w"] = self._prepare("w", w, p.w_shape)
        else:
            x = self._x if x is None else x
            if grad_y is None or x is None:
                raise ArgumentError("backward_weights (backward_filter) needs x and grad_y")
            t["x"] = self._prepare("x", x, p.x_shape)
            t["dy"] = self._prepare("dy", grad_y, p.y_shape)
        role = _OUT_ROLE[d]
        shape = {"y": p.y_shape, "dx": p.x_shape, "dw": p.w_shape}[role]
        if out is None:
            out = empty_like_layout(shape, p.layout, p.torch_dtype, f"cuda:{self.device_index}")
        t[role] = self._prepare(role, out, shape)
        return t, t[role]

    # ------------------------------------------------------------------ "unfused:" configs
    def has_epilogue(self) -> bool:
        """Whether this is a forward graph with work after the convolution (a bias, an activation
        or a residual add), which an ``"unfused:"`` config runs in torch instead."""
        return self.direction == "forward" and (self.problem.has_bias or self.activation is not None
                                                or self._has_residual())

    def _has_residual(self) -> bool:
        return False   # (ResidualGraphConvolution: True)

    def unfused(self) -> "GraphConvolution":
        """The convolution-only plan of this graph's problem (no bias, activation or residual), made
        once. An ``"unfused:<config>"`` selection runs that config of it, then torch's own ops for
        the rest, in place on the output: ``y += bias`` (as torch's cuDNN convolution adds its
        bias, one more kernel), ``y += residual``, the activation (``torch.relu_``, ...): exactly
        the layer as torch runs it, on an engine config rawconv names. Raises
        :class:`ArgumentError` for a plan with nothing after the convolution."""
        if not self.has_epilogue():
            raise ArgumentError(f"an 'unfused:' config runs a fused graph's convolution alone and its bias, residual "
                                f"and activation in torch; {self._describe()} has none: name the config without "
                                "the prefix")
        if self._unf is None:
            self._unf = GraphConvolution.from_problem(self.problem.with_(has_bias=False), direction="forward",
                                                      allow_tf32=self.allow_tf32)
        return self._unf

    def _default_split(self) -> bool:
        """Whether the default selection (nothing selected, no autotune) runs unfused: a forward
        graph whose only epilogue is a bias (torch's own way: the convolution-only graph's first
        heuristic config, torch's pick with ``cudnn.benchmark`` off, then the bias added), and a
        grouped convolution with any epilogue. Measured on an H100 (cuDNN 9.19,
        ``benchmarks/diag_depthwise_cuda.py``): for depthwise convolutions with a bias cuDNN's
        heuristics offer only the generic engine 0 (600 us for ConvNeXt's first 7x7 layer at
        batch 16, fp16, where torch takes 50 us), and for depthwise conv + bias + ReLU / sigmoid /
        tanh likewise (0.19x torch). :data:`DEFAULT_UNFUSED` = False turns this off. Autotune
        measures both ways and keeps the faster."""
        if not DEFAULT_UNFUSED or not self.has_epilogue() or self.problem.is_empty:
            return False
        return (self.activation is None and not self._has_residual()) or self.problem.groups > 1

    def _split_bias_fits(self, bias) -> bool:
        """The hot path's check of a bias (the convolution-only plan's pack checks x, w and y)."""
        p = self.problem
        if bias is None:
            return not p.has_bias
        return p.has_bias and type(bias) is torch.Tensor and bias.shape == (p.k,) and \
            bias.dtype == p.torch_dtype and bias.device == self._dev

    def _execute_split(self, x, w, bias, out, grad_y, residual=None) -> torch.Tensor:
        """:meth:`execute` of an ``"unfused:"`` selection: the convolution-only plan, then torch's ops
        (``residual``: a residual graph's, checked by it)."""
        self._check_live()
        if grad_y is not None:
            raise ArgumentError("a forward plan takes x, w (and bias), not grad_y")
        self._split = True
        p = self.problem
        bias = self._b if bias is None else bias
        if p.has_bias != (bias is not None):
            raise ArgumentError("this plan was built " + ("with a bias: pass bias" if p.has_bias else
                                                          "without a bias; build one with bias to use it"))
        if bias is not None:
            bias = self._prepare("b", bias, (p.k,))
        y = self.unfused().execute(self._x if x is None else x, self._w if w is None else w, None, out)
        return torch_epilogue(y, bias, residual, self.activation, p.ndim)

    # ------------------------------------------------------------------ "nhwc:" configs
    def _run_via(self, t: dict, cl: "GraphConvolution | None" = None, b: _Built | None = None) -> None:
        """A channels_last config (``b`` of ``cl``; default: the selected one) on ``t`` (this
        plan's layout): inputs transformed into the plan's channels_last buffers, the engine run
        there, the output transformed back."""
        cl = cl or self._via
        hs = _cuda.handle_state(self.device_index)
        h = hs.ptr
        bufs = self._relayout_buffers(hs.stream)
        out_role = _OUT_ROLE[self.direction]
        with self._via_lock if hs.stream == 0 else _cuda.NO_LOCK:   # the kept buffers: as _Built's workspace
            for role in _ROLES[self.direction]:
                if role != out_role:
                    self._transform(h, bufs[role][2], t[role].data_ptr(), bufs[role][3], bufs[role][1])
            ptrs = tuple(bufs[r][0].data_ptr() for r in _ROLES[self.direction])
            if "b" in t:
                ptrs += (t["b"].data_ptr(),)
            cl._run(b or cl._selected or cl._select_default(), ptrs)
            ob = bufs[out_role]
            self._transform(h, ob[3], ob[1], ob[2], t[out_role].data_ptr())

    def _transform(self, handle, src_desc, src_ptr, dst_desc, dst_ptr) -> None:
        ffi = _cudnn.ffi
        status = _cudnn.lib().cudnnTransformTensor(
            handle, self._one, src_desc,
            src_ptr if isinstance(src_ptr, ffi.CData) else ffi.cast("void *", src_ptr), self._zero, dst_desc,
            dst_ptr if isinstance(dst_ptr, ffi.CData) else ffi.cast("void *", dst_ptr))
        if status:
            raise _cudnn.error(status, "cudnnTransformTensor", f"layout copy for {self._describe()}")

    def _relayout_buffers(self, stream: int) -> dict:
        """role -> (channels_last buffer, its void *, descriptor of this plan's layout, descriptor
        of channels_last). On the device's default stream (never captured) made once per plan and
        kept; on any other stream made for this call from torch's caching allocator and given
        back after it (as :class:`_Built`'s workspaces: capture-safe, never shared by two
        streams). 4-D or 5-D descriptors, 1-D problems lifted."""
        if stream != 0:
            return self._make_relayout_buffers()
        bufs = self._bufs
        self.used = True   # (the plans' byte budget, which counts them: _cache_release)
        if bufs is not None:
            return bufs
        with _stream_lock:
            if self._bufs is None:
                self._bufs = self._make_relayout_buffers()
                _budget.charge(self, sum(b[0].numel() * b[0].element_size() for b in self._bufs.values()),
                              str(self._dev))
            return self._bufs

    def _cache_release(self) -> None:   # past the byte budget, or clear_caches: made again at the next call
        self._bufs = None

    def _make_relayout_buffers(self) -> dict:
        p = self.problem
        ffi = _cudnn.ffi
        descs = self.__dict__.get("_relayout_descs")
        if descs is None:   # per plan: the descriptors (no device memory), made once
            one_t = "double *" if p.dtype == "float64" else "float *"
            self._one, self._zero = ffi.new(one_t, 1.0), ffi.new(one_t, 0.0)
            shapes = {"x": p.x_shape, "dx": p.x_shape, "y": p.y_shape, "dy": p.y_shape, "w": p.w_shape,
                      "dw": p.w_shape}
            descs = {}
            for role in _ROLES[self.direction]:
                g = _lift(shapes[role])
                descs[role] = (shapes[role], _cudnn.tensor_desc(p.dtype, g, dense_strides(g, p.layout)),
                               _cudnn.tensor_desc(p.dtype, g, dense_strides(g, "nhwc")))
            self._relayout_descs = descs
        bufs = {}
        for role, (shape, own, cl) in descs.items():
            buf = torch.empty_strided(shape, dense_strides(shape, "nhwc"), dtype=p.torch_dtype, device=self._dev)
            bufs[role] = (buf, ffi.cast("void *", buf.data_ptr()), own, cl)
        return bufs

    @property
    def transpose_bytes(self) -> int:
        """Bytes of the channels_last copies (inputs and output) that a ``"nhwc:"`` config of an
        NCHW plan needs per call, besides its workspace."""
        p = self.problem
        size = torch.empty((), dtype=p.torch_dtype).element_size()
        shapes = {"forward": (p.x_shape, p.w_shape, p.y_shape), "backward_data": (p.y_shape, p.w_shape, p.x_shape),
                  "backward_weights": (p.x_shape, p.y_shape, p.w_shape)}[self.direction]
        return size * sum(math.prod(s) for s in shapes)

    def channels_last(self) -> "GraphConvolution":
        """The plan of this NCHW problem's channels_last (NHWC) graph, made once."""
        p = self.problem
        if p.layout != "nchw":
            raise ArgumentError("an 'nhwc:' config runs an NCHW plan's engine on channels_last copies; this plan "
                                "is channels_last already: name the config without the prefix")
        if p.is_empty:
            raise ArgumentError(f"{self._describe()} is empty (zero batch or spatial size): no cuDNN graph")
        if self._cl is None:
            self._cl = GraphConvolution.from_problem(p.with_(layout="nhwc"), direction=self.direction,
                                                     activation=self.activation, allow_tf32=self.allow_tf32)
        return self._cl

    # ------------------------------------------------------------------ what the search uses (rawconv._search.SearchPlan)
    heuristic_modes = HEURISTIC_MODES

    def handle(self):
        """This thread's cuDNN handle for the plan's device."""
        return _cuda.handle_for(self.device_index)

    @property
    def built(self) -> dict:
        """Config name -> finalized execution plan (what :meth:`build` finalized)."""
        return self._built

    @property
    def failed(self) -> dict:
        """Config name -> why its execution plan did not finalize."""
        return self._failed

    def make_config(self, engine: int, knobs=(), numerical_notes=(), behavior_notes=()) -> EngineConfig:
        """An :class:`EngineConfig` of engine ``engine`` with ``knobs`` (``(type, value)`` pairs)."""
        return EngineConfig(engine, knobs, (), tuple(numerical_notes), tuple(behavior_notes))

    def output(self, layout: str | None = None) -> torch.Tensor:
        """A new result tensor of this plan's direction (y, dx or dw) in ``layout`` (default: the problem's)."""
        p = self.problem
        shape = {"forward": p.y_shape, "backward_data": p.x_shape, "backward_weights": p.w_shape}[self.direction]
        return empty_like_layout(shape, layout or p.layout, p.torch_dtype, f"cuda:{self.device_index}")

    def call_for(self, b: _Built, t: dict, out: torch.Tensor):
        """A no-argument callable running ``b`` on autotune's example tensors ``t``, writing ``out``."""
        bound, _ = self._bind(t.get("x"), t.get("w"), t.get("b"), out, t.get("dy"))
        ptrs = tuple(bound[r].data_ptr() for r in self._graph.roles)
        return lambda: self._run(b, ptrs) or bound

    def execute_call(self, b: _Built, t: dict, out: torch.Tensor, via: "GraphConvolution | None" = None):
        """A no-argument callable making one call as ``execute(..., out=out)`` makes it on
        autotune's example tensors ``t``: arguments bound, then ``b`` run (``b`` of ``via``, the
        channels_last plan, through the layout transforms, when given)."""
        args = (t.get("x"), t.get("w"), t.get("b"), out, t.get("dy"))

        def call():
            bound, _ = self._bind(*args)
            if via is not None:
                self._run_via(bound, via, b)
            else:
                self._run(b, tuple(bound[r].data_ptr() for r in self._graph.roles))
        return call

    def check_output(self, out: torch.Tensor, config: EngineConfig, ref, ref_abs) -> ErrorStats:
        """``out`` against the float64 ``ref`` within the tolerance ``config``'s numerical notes imply."""
        return _op.check_result(self.problem, out, ref, ref_abs,
                            **tolerance_args(self.problem, config.numerical_notes, self.direction, self.activation))

    # ------------------------------------------------------------------ lifetime
    def _check_live(self):
        if self._freed:
            raise ArgumentError("this GraphConvolution plan was freed")

    def free(self) -> None:
        """Release descriptors, plans, workspaces and tensor references. Idempotent."""
        self._built.clear()
        self._selected = None
        self._hot = None
        if self._cl is not None:
            self._cl.free()
        if self._unf is not None:
            self._unf.free()
        self._cl = self._via = self._bufs = self._unf = None
        self._split = False
        self._x = self._w = self._b = None
        self._freed = True

    def __repr__(self) -> str:
        if self._freed:
            return "<rawconv.cudnn_graph.GraphConvolution (freed)>"
        sel = self.selected_name if self._selected is not None or self._via is not None else \
            "the first config of heuristic mode instant that finalizes (not chosen yet)"
        return f"<rawconv.cudnn_graph.GraphConvolution {self._describe()} choice={sel}>"

    def candidates(self, heuristic: str | Sequence[str] = "instant", **kw) -> ResultTable:
        """:meth:`engines` (every backend's plan has ``candidates()``)."""
        return self.engines(heuristic, **kw)


# (the face's, as before the split: pickles, the API reference, the guard's messages)
GraphConvolution.__module__ = _GraphHot.__module__ = FACE

# every public entry point raises only rawconv's exception classes (rawconv._guard)
_guard.guard_module(globals(), "GraphConvolution.__init__", "GraphConvolution.from_problem",
                    "GraphConvolution.execute", "GraphConvolution.__call__", "GraphConvolution.candidates",
                    "GraphConvolution.channels_last", "GraphConvolution.output", where=FACE)
