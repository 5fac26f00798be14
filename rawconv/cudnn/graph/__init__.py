"""cuDNN graph (backend) API convolutions on torch CUDA tensors: every engine and knob setting.

Quick use::

    rows = rawconv.cudnn_graph.engines(x, w, padding=1)               # heuristic mode instant
    rows = rawconv.cudnn_graph.engines(x, w, padding=1, heuristic="all", limit=8)
    y = rawconv.cudnn_graph.forward(x, w, padding=1, engine="eng28{k2=3,k3=0}")   # exactly that config
    y = rawconv.cudnn_graph.forward(x, w, b, padding=1, activation="relu")        # fused graph

    with rawconv.cudnn_graph.GraphConvolution(x, w, padding=1) as conv:
        table = conv.autotune(budget_s=10)       # time + check every candidate, ranked
        y = conv.execute(x)                      # one cudnnBackendExecute per call

Terms are cuDNN's: an *operation graph* (here one convolution node, plus pointwise nodes for a
fused bias and activation), *engines* (global indices ``0 .. CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT-1``),
*knobs* of an engine (tile size, split-K, stages, ...), an *engine config* (engine + knob choices),
*heuristic modes* (instant/A, B, FALLBACK) that rank engine configs, an *execution plan* (a
finalized engine config, with its *workspace*), *numerical notes* (TENSOR_CORE,
DOWN_CONVERT_INPUTS, REDUCED_PRECISION_REDUCTION, FFT, WINOGRAD, NONDETERMINISTIC) and *behavior
notes* (RUNTIME_COMPILATION, ...). An engine config is named ``eng<index>{k<knob type>=<value>,...}``
(``eng28`` alone: the engine's default knobs); cudnn-frontend's ``eng28_k2=3_k3=0`` is accepted too.

float32 convolutions run IEEE fp32 unless ``allow_tf32=True``: configs with the TENSOR_CORE
numerical note run fp32 on TF32 tensor cores, and are left out of default selection and autotune
(forcing one by name still runs it). Most engines take NHWC (channels_last) tensors; NCHW graphs
often get no engine at all (``NotSupportedError`` says so).
"""
from __future__ import annotations

import logging
import math
import operator
import re
import threading
import time
from typing import Any, Sequence

import torch

from .. import _cuda, _ffi as _cudnn
from . import _backend_api as B, search as _search
from ...core import guard as _guard, tuning, plans as _budget
from .search import TimedConfig, knob_combinations
from ...core.errors import ArgumentError, ArgumentTypeError, LibraryError, NotSupportedError
from ...core.backend import canonical_direction
from ...core.results import ResultTable
from ...core.plans import PlanCache, PlanLifetime
from ...core import check as _check
from ...core.check import ErrorStats, Tolerance, tolerance_for
from ...core.grad import grad_function as _grad_slot, needs_grad as _needs_grad
from ...core.problem import ConvProblem, check_tensor, empty_like_layout, layout_of, to_layout, dense_strides, shape_only, random_tensor, seed_offset

__all__ = ["EngineConfig", "TimedConfig", "GraphConvolution", "engines", "forward", "backward_data",
           "backward_filter", "clear_cache", "tuning_cache", "save_tuning_cache", "load_tuning_cache",
           "HEURISTIC_MODES", "ACTIVATIONS", "DIRECTIONS", "KNOWN_WRONG", "known_wrong"]

# the names GraphConvolution's parts share live in common.py (the parts import them from there); handed on
# here. SERIALIZE_RTC, environment and reference are not among them: the autotune and _Built read them in
# common.py at call time, and the module type below passes them through (set on the face, they reach it)
from .common import (  # noqa: F401
    log, HEURISTIC_MODES, ACTIVATIONS, DIRECTIONS, DTYPES, ALIGNMENT, UID, _VIRTUAL_UIDS, _ROLES, _OUT_ROLE,
    _ROLE_WORDS, _VENDOR_DIRECTION, _GRAPH_NAMES, KNOWN_WRONG, known_wrong, _NAME_RE, EngineConfig,
    _stream_lock, _VPS_KEPT, _EPILOGUE_ACT, torch_epilogue, _Built, _version, _configs_of)


# ---------------------------------------------------------------------------- helpers


def _lift(shape: Sequence[int]) -> list[int]:
    """1-D (N, C, W) -> (N, C, 1, W): cuDNN's convolution engines take 4-D and 5-D tensors."""
    shape = list(shape)
    return shape[:2] + [1] + shape[2:] if len(shape) == 3 else shape


def _norm_direction(direction: str) -> str:
    """rawconv's direction name (:func:`rawconv._backend.canonical_direction`)."""
    return canonical_direction(direction)


def check_activation(activation, direction: str, has_bias: bool) -> str | None:
    if activation in (None, "identity", "none"):
        activation = None
    elif activation not in ACTIVATIONS:
        raise ArgumentError(f"activation must be None or one of {list(ACTIVATIONS)}, got {activation!r}")
    if direction != "forward" and (activation or has_bias):
        raise ArgumentError("bias and activation fuse into forward graphs only")
    return activation


def _device_index(p: ConvProblem) -> int:
    d = torch.device(p.device)
    if d.type != "cuda":
        raise ArgumentError(f"rawconv.cudnn_graph runs on CUDA tensors; got tensors on {p.device} "
                            "(use rawconv.onednn for CPU tensors)")
    return d.index if d.index is not None else torch.cuda.current_device()


def tolerance_args(p: ConvProblem, notes: Sequence[str], direction: str = "forward",
                   activation: str | None = None) -> dict:
    """Keyword arguments for :func:`rawconv.check.tolerance` that the numerical ``notes`` of an
    engine config imply for problem ``p`` (:func:`rawconv.check.tolerance_for`, the one policy)."""
    return tolerance_for(p, direction, notes=notes, activation=activation).kwargs()


def check_result(p: ConvProblem, y: torch.Tensor, ref: torch.Tensor, ref_abs: torch.Tensor, **tol_kw) -> ErrorStats:
    """:func:`rawconv.check.check` with :func:`rawconv.check.tolerance` keyword arguments."""
    return _check.check(p, y, ref, ref_abs, Tolerance(**tol_kw))


# ---------------------------------------------------------------------------- the graph
class OperationGraph:
    """The backend descriptors of one problem's graph: tensors, convolution, operations
    (built without a GPU) and, on demand, the operation graph (needs a handle)."""

    def __init__(self, p: ConvProblem, direction: str, activation: str | None, w_layout: str,
                 residual: bool = False):
        # residual (forward only): y = act(conv(x, w) + b + r), r a tensor of y's shape and layout
        # (uid UID["r"]), added by one more pointwise node before the activation
        if residual and direction != "forward":
            raise ArgumentError("a residual add fuses into forward graphs only")
        self.problem, self.direction, self.activation = p, direction, activation
        self.residual = residual
        compute = "float64" if p.dtype == "float64" else "float32"
        self.compute = compute
        lay = p.layout
        nd = max(p.ndim, 2)
        lift = p.ndim == 1
        shapes = {"x": p.x_shape, "y": p.y_shape, "w": p.w_shape}
        shapes.update(dx=p.x_shape, dy=p.y_shape, dw=p.w_shape)
        self.strides = {}       # role -> strides the torch tensor must have (its own rank)
        self.tensors = {}       # role -> tensor descriptor
        for role in _ROLES[direction]:
            shape = shapes[role]
            layout = w_layout if role in ("w", "dw") else lay
            st = dense_strides(shape, layout)
            self.strides[role] = st
            gshape, gst = _lift(shape), dense_strides(_lift(shape), layout)
            self.tensors[role] = B.tensor(UID[role], gshape, gst, p.dtype, alignment=ALIGNMENT)
        pre, post = list(p.pad_before), list(p.pad_after)
        st, dil = list(p.stride), list(p.dilation)
        if lift:
            pre, post, st, dil = [0] + pre, [0] + post, [1] + st, [1] + dil
        self.conv = B.convolution(nd, compute, dilations=dil, strides=st, pre_paddings=pre, post_paddings=post)
        ops = []
        named = {_GRAPH_NAMES[r]: t for r, t in self.tensors.items()}
        if direction == "forward" and (p.has_bias or activation or residual):
            ydesc = self.tensors["y"]
            ygshape = _lift(p.y_shape)
            ygst = dense_strides(ygshape, lay)
            v1 = B.tensor(_VIRTUAL_UIDS[0], ygshape, ygst, compute, alignment=ALIGNMENT, virtual=True)
            ops.append(B.conv_operation("forward", {**named, "Y": v1}, self.conv, compute))
            cur = v1
            if p.has_bias:
                bshape = [1, p.k] + [1] * nd
                self.strides["b"] = [1]
                self.tensors["b"] = B.tensor(UID["b"], bshape, dense_strides(bshape, lay), p.dtype,
                                             alignment=ALIGNMENT)
                nxt = ydesc if not (activation or residual) else B.tensor(
                    _VIRTUAL_UIDS[1], ygshape, ygst, compute, alignment=ALIGNMENT, virtual=True)
                ops.append(B.pointwise_operation(B.pointwise("add", compute), cur, nxt, self.tensors["b"]))
                cur = nxt
            if residual:
                self.strides["r"] = dense_strides(p.y_shape, lay)
                self.tensors["r"] = B.tensor(UID["r"], ygshape, ygst, p.dtype, alignment=ALIGNMENT)
                nxt = ydesc if not activation else B.tensor(_VIRTUAL_UIDS[2], ygshape, ygst, compute,
                                                            alignment=ALIGNMENT, virtual=True)
                ops.append(B.pointwise_operation(B.pointwise("add", compute), cur, nxt, self.tensors["r"]))
                cur = nxt
            if activation:
                ops.append(B.pointwise_operation(B.pointwise(activation, compute), cur, ydesc))
        else:
            ops.append(B.conv_operation(_VENDOR_DIRECTION.get(direction, direction), named, self.conv, compute))
        self.ops = ops
        extra = [r for r in ("b", "r") if r in self.tensors]
        self.uids = [UID[r] for r in _ROLES[direction]] + [UID[r] for r in extra]
        self.roles = list(_ROLES[direction]) + extra
        self.packer = None   # its B.VariantPacker (made on the first execute: it needs the library)
        self.graph = None
        self.global_count = None

    def build(self, handle) -> B.Descriptor:
        """The finalized operation graph (``CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR``)."""
        if self.graph is None:
            self.graph = B.operation_graph(handle, self.ops)
            self.global_count = B.engine_global_count(self.graph)
        return self.graph


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


# ---------------------------------------------------------------------------- the plan
from .. import library as _library  # noqa: E402 - info(): the loaded cuDNN (not the legacy face)
from . import common as _common  # noqa: E402
from ...core.face import route_settings as _route_settings  # noqa: E402


# SERIALIZE_RTC set on this face (rawconv.cudnn_graph.SERIALIZE_RTC = False) reaches rawconv.cudnn.graph.common,
# where _Built reads it; environment and reference likewise, read there by the autotune. CAPTURE_PROBE and
# DEFAULT_UNFUSED are read by GraphConvolution, here, and stay plain module names.
_route_settings(__name__, {"SERIALIZE_RTC": _common, "environment": _common, "reference": _common})

from .engines import Engines as _Engines, empty_result as _empty_result  # noqa: E402 - the graph, its engines, selection
from .autotune import Autotune as _Autotune  # noqa: E402 - the search's entry point, tuning records


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
                if ec.name == b.config.name or self.allowed(ec) or known_wrong(self.problem, self.direction,
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
        return check_result(self.problem, out, ref, ref_abs,
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




# ---------------------------------------------------------------------------- tuning cache
ENV_TUNING_FILE = "RAWCONV_CUDNN_TUNING_CACHE"  # the older name of rawconv.tuning.ENV_FILE, still read


tuning.register_environment("cudnn_graph", lambda: _common.environment(torch.cuda.current_device()))


def tuning_cache() -> dict:
    """A snapshot of the cuDNN graph records in the process's tuning cache
    (:func:`rawconv.tuning.cache`, which holds :class:`rawconv.tuning.TuningRecord` objects):
    :class:`~rawconv.tuning.TuningKey` -> ``{"engine": the chosen config's name, "median_ms": ...,
    "min_ms": ..., "t": when (seconds since the epoch), "record": the TuningRecord}``. Keys hold the
    direction, problem, activation, allow_tf32, filters, workspace limit, cuDNN version and GPU.
    With ``$RAWCONV_TUNING_CACHE`` (or ``$RAWCONV_CUDNN_TUNING_CACHE``) set to a JSON file, the
    cache is loaded from there on first use and written back after each autotune."""
    return {r.key: {"engine": r.choice, "median_ms": r.median_ms, "min_ms": r.min_ms, "t": r.created_ts, "record": r}
            for r in tuning.cache().records() if r.key.backend == "cudnn_graph"}


def save_tuning_cache(path: str) -> None:
    """Write the tuning cache to a JSON file (:meth:`rawconv.tuning.TuningCache.save`)."""
    tuning.cache().save(path)


def load_tuning_cache(path: str, *, merge: bool = True) -> int:
    """Read a JSON file written by :func:`save_tuning_cache` into the cache; returns the number
    of records read. Raises :class:`ArgumentError` naming the file when it is missing, not JSON,
    of another (or the old) format (:meth:`rawconv.tuning.TuningCache.load`)."""
    return tuning.cache().load(path, merge=merge)


def clear_tuning_cache() -> None:
    """Empty the in-memory tuning cache (every backend's records; a cache file is rewritten by
    the next put)."""
    tuning.cache().clear()


# ---------------------------------------------------------------------------- function forms
_plans = PlanCache(256)


def _plan(problem: ConvProblem, direction: str, activation, allow_tf32: bool, engine) -> GraphConvolution:
    ekey = engine.name if isinstance(engine, EngineConfig) else engine
    if ekey is not None and not isinstance(ekey, (str, int)) or isinstance(ekey, bool):
        raise ArgumentTypeError(f"engine must be None, 'fastest', a name, an index or an EngineConfig, got {engine!r}")
    key = (problem, direction, activation, allow_tf32, ekey, threading.get_ident())
    plan = _plans.get(key)
    if plan is None:
        plan = GraphConvolution.from_problem(problem, direction=direction, activation=activation,
                                             allow_tf32=allow_tf32)
        if engine in ("fastest", "autotune"):
            plan.autotune()
        elif engine is not None:
            plan.select(engine)
        _plans.put(key, plan)
    return plan


def clear_cache() -> None:
    """Drop every cached plan used by the function forms (the tuning cache stays)."""
    _plans.clear()
    _fast_plans.clear()


_MATH_TF32 = {"fma": False, "ieee": False, "tensor_op": True, "tensor_op_allow_conversion": True, "default": True,
              "tf32": True}


def allows_tf32(allow_tf32: bool, math: str | None) -> bool:
    """``math`` (rawconv.cudnn's names: "fma" = IEEE fp32; "tensor_op", "default" = TF32 allowed)
    overrides ``allow_tf32`` when given."""
    if math is None:
        return allow_tf32
    if math not in _MATH_TF32:
        raise ArgumentError(f"math must be one of {list(_MATH_TF32)}, got {math!r}")
    return _MATH_TF32[math]


def _problem(x, w, bias, stride, padding, dilation, groups) -> ConvProblem:
    p = ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups, allow_dtypes=DTYPES)
    _device_index(p)
    return p


def forward(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
            padding: Any = 0, dilation: Any = 1, groups: int = 1, *, engine: Any = None,
            activation: str | None = None, allow_tf32: bool = False, math: str | None = None,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """Forward convolution through the cuDNN graph API, with the semantics of
    ``torch.nn.functional.conv{1,2,3}d`` (then ``activation``).

    ``x``: (N, C, *spatial) or unbatched, CUDA, float32/float16/bfloat16/float64, NCHW or
    channels_last; ``w``: (K, C/groups, *kernel) (used in x's memory format); ``bias``: (K,);
    ``padding``: int, tuple, ``"same"``/``"valid"`` or one ``(before, after)`` pair per spatial
    dim. ``engine``: None (first config of heuristic mode instant that finalizes), ``"fastest"``
    (:meth:`GraphConvolution.autotune`, tuning cache first), a name (``"eng28{k2=3,k3=0}"``), an
    engine index or an :class:`EngineConfig`. ``activation``: fused after the bias as pointwise
    nodes. ``allow_tf32``: let float32 run on TF32 tensor cores. Returns y (N, K, *out) in x's layout.

    Raises :class:`ArgumentError` / :class:`ArgumentTypeError` before any C call for bad input,
    :class:`NotSupportedError` when cuDNN has no engine (or the forced config does not finalize,
    or the fusion is not supported). Wraps ``cudnnBackendExecute``. Tensors that require grad (grad
    mode on) run as :func:`rawconv.ops.conv` with ``backend="cudnn_graph"`` (autograd recorded;
    ``out`` and ``activation`` are then refused with :class:`ArgumentError`).
    """
    if _needs_grad(x, w, bias):   # record a differentiable op, never a silent detach
        _graph_function = _grad_slot("cudnn_graph")
        return _graph_function("forward", x, w, bias, stride, padding, dilation, groups, engine=engine,
                               allow_tf32=allow_tf32, math=math, out=out, activation=activation)
    return cached_forward_plan(x, w, bias, stride, padding, dilation, groups, engine, activation, allow_tf32,
                               math).execute(x, w, bias, out)


def cached_forward_plan(x, w, bias, stride, padding, dilation, groups, engine, activation, allow_tf32, math):
    """The cached forward plan of :func:`forward`'s arguments (built and validated on first use)."""
    try:   # fast path: a call signature seen before reuses its plan without re-validation
        ekey = engine.name if isinstance(engine, EngineConfig) else engine
        key = (x.shape, x.stride(), x.dtype, x.device, w.shape, w.stride(), w.dtype, w.device,
               None if bias is None else (bias.shape, bias.dtype, bias.device), _hashable(stride),
               _hashable(padding), _hashable(dilation), groups, ekey, activation, allow_tf32, math,
               threading.get_ident())
        plan = _fast_plans.get(key)
    except (AttributeError, TypeError):
        key = plan = None
    if plan is None or plan._freed:
        problem = _problem(x, w, bias, stride, padding, dilation, groups)
        act = check_activation(activation, "forward", bias is not None)
        plan = _plan(problem, "forward", act, allows_tf32(allow_tf32, math), engine)
        if key is not None:
            _fast_plans.put(key, plan)
    return plan


_fast_plans = PlanCache(256)


def _hashable(v):
    return tuple(_hashable(i) for i in v) if isinstance(v, list) else v


def _transpose_x_shape(grad_y, w, stride, padding, dilation, groups, output_padding):
    """conv_transpose semantics: the input shape of the forward conv whose output is grad_y."""
    nd = w.dim() - 2
    from ...core.problem import tuple_arg as _tuple, resolve_padding

    s = _tuple(stride, nd, "stride", 1)
    d = _tuple(dilation, nd, "dilation", 1)
    op = _tuple(output_padding, nd, "output_padding", 0)
    if isinstance(padding, str):
        raise ArgumentError("backward_data without x_shape needs numeric padding (as conv_transpose)")
    pb, pa = resolve_padding(padding, nd, tuple(w.shape[2:]), d, s)
    if any(o >= max(si, di) for o, si, di in zip(op, s, d)):
        raise ArgumentError(f"output_padding {op} must be smaller than stride {s} or dilation {d} (as torch)")
    unbatched = grad_y.dim() == nd + 1
    gs = (1,) + tuple(grad_y.shape) if unbatched else tuple(grad_y.shape)
    spatial = tuple((o - 1) * si - b - a + di * (k - 1) + 1 + opp
                    for o, si, b, a, di, k, opp in zip(gs[2:], s, pb, pa, d, w.shape[2:], op))
    shape = (gs[0], w.shape[1] * groups) + spatial
    return shape[1:] if unbatched else shape


def backward_data(grad_y: torch.Tensor, w: torch.Tensor, x_shape: Sequence[int] | None = None, stride: Any = 1,
                  padding: Any = 0, dilation: Any = 1, groups: int = 1, *, output_padding: Any = 0,
                  engine: Any = None, allow_tf32: bool = False, math: str | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Gradient of the forward convolution with respect to its input (cuDNN backward data), which
    is also the transposed convolution (``conv_transpose{1,2,3}d(grad_y, w, None, stride, padding,
    output_padding, groups, dilation)`` when ``x_shape`` is None).

    ``grad_y``: (N, K, *out), NCHW or channels_last; ``w``: (K, C/groups, *kernel);
    ``x_shape``: the forward input's shape (N, C, *spatial), or None to derive it as
    conv_transpose does (``output_padding`` then adds to the trailing side). Returns dx in
    grad_y's layout. ``engine`` as in :func:`forward`. Wraps ``cudnnBackendExecute`` on an
    ``OPERATION_CONVOLUTION_BACKWARD_DATA`` graph."""
    if not isinstance(grad_y, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ArgumentTypeError("grad_y and w must be torch.Tensor")
    if w.dim() not in (3, 4, 5):
        raise ArgumentError(f"weight must be 3-D, 4-D or 5-D, got shape {tuple(w.shape)}")
    if x_shape is None:
        x_shape = _transpose_x_shape(grad_y, w, stride, padding, dilation, groups, output_padding)
    if _needs_grad(grad_y, w):   # as forward: rawconv.ops.conv_backward_data records autograd
        _graph_function = _grad_slot("cudnn_graph")
        return _graph_function("backward_data", grad_y, w, x_shape, stride, padding, dilation, groups,
                               engine=engine, allow_tf32=allow_tf32, math=math, out=out)
    if not isinstance(x_shape, (tuple, list, torch.Size)) or not all(isinstance(s, int) and s >= 0 for s in x_shape):
        raise ArgumentError(f"x_shape must be a tuple of non-negative ints, got {x_shape!r}")
    p = _problem(shape_only(x_shape, grad_y, "x_shape"), w, None, stride, padding, dilation, groups)
    lay = layout_of(grad_y if grad_y.dim() == p.ndim + 2 else grad_y.unsqueeze(0))
    if lay == "nhwc":
        p = p.with_(layout="nhwc")
    _check_tensor(p, grad_y, "grad_y", p.y_shape)
    plan = _plan(p, "backward_data", None, allows_tf32(allow_tf32, math), engine)
    return plan.execute(grad_y=grad_y, w=w, out=out)


def backward_filter(x: torch.Tensor, grad_y: torch.Tensor, w_shape: Sequence[int], stride: Any = 1,
                    padding: Any = 0, dilation: Any = 1, groups: int = 1, *, engine: Any = None,
                    allow_tf32: bool = False, math: str | None = None,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Gradient of the forward convolution with respect to its weights (cuDNN backward filter).

    ``x``: (N, C, *spatial); ``grad_y``: (N, K, *out), both in x's layout; ``w_shape``:
    (K, C/groups, *kernel). Returns dw in x's layout (channels_last for an NHWC x).
    ``engine`` as in :func:`forward`. Wraps ``cudnnBackendExecute`` on an
    ``OPERATION_CONVOLUTION_BACKWARD_FILTER`` graph."""
    if _needs_grad(x, grad_y):   # as forward: rawconv.ops.conv_backward_weights records autograd
        _graph_function = _grad_slot("cudnn_graph")
        return _graph_function("backward_weights", x, grad_y, w_shape, stride, padding, dilation, groups,
                               engine=engine, allow_tf32=allow_tf32, math=math, out=out)
    if not isinstance(x, torch.Tensor) or not isinstance(grad_y, torch.Tensor):
        raise ArgumentTypeError("x and grad_y must be torch.Tensor")
    if not isinstance(w_shape, (tuple, list, torch.Size)) or not all(isinstance(s, int) and s >= 0 for s in w_shape):
        raise ArgumentError(f"w_shape must be a tuple of non-negative ints, got {w_shape!r}")
    p = _problem(x, shape_only(w_shape, x, "w_shape"), None, stride, padding, dilation, groups)
    _check_tensor(p, grad_y, "grad_y", p.y_shape)
    plan = _plan(p, "backward_weights", None, allows_tf32(allow_tf32, math), engine)
    return plan.execute(x, grad_y=grad_y, out=out)


backward_weights = backward_filter   # rawconv's word (backward_filter is cuDNN's)


def cached_grad_plan(direction: str, a, b, shape, stride, padding, dilation, groups, engine, allow_tf32: bool = False,
                     math: str | None = None) -> "GraphConvolution":
    """The cached plan of a backward call, its arguments checked (as :func:`backward_data` /
    :func:`backward_filter` check them): ``direction`` ``"backward_data"`` (``a`` = grad_y, ``b``
    = w, ``shape`` = x_shape; the plan takes grad_y's layout) or ``"backward_weights"`` (``a`` =
    x, ``b`` = grad_y, ``shape`` = w_shape; x's layout). For the operators' CUDA kernels."""
    if direction == "backward_data":
        p = _problem(shape_only(shape, a, "x_shape"), b, None, stride, padding, dilation, groups)
        if layout_of(a if a.dim() == p.ndim + 2 else a.unsqueeze(0)) == "nhwc":
            p = p.with_(layout="nhwc")
        _check_tensor(p, a, "grad_y", p.y_shape)
    else:
        p = _problem(a, shape_only(shape, a, "w_shape"), None, stride, padding, dilation, groups)
        _check_tensor(p, b, "grad_y", p.y_shape)
    return _plan(p, direction, None, allows_tf32(allow_tf32, math), engine)


def _check_tensor(p: ConvProblem, t, name, shape):
    check_tensor(p, t, name, shape)
    if str(t.device) != p.device and torch.device(t.device) != torch.device(p.device):
        raise ArgumentError(f"{name} must be on {p.device}, got {t.device}")


def engines(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
            padding: Any = 0, dilation: Any = 1, groups: int = 1, *, direction: str = "forward",
            heuristic: str | Sequence[str] = "instant", limit: int | None = 16, activation: str | None = None,
            allow_tf32: bool = False, finalize: bool = True) -> list[EngineConfig]:
    """Every engine config cuDNN offers for the convolution (see :meth:`GraphConvolution.engines`).

    Arguments as in :func:`forward` (for ``direction="backward_data"`` / ``"backward_filter"``
    pass the forward problem's x and w: only their shapes, dtype, layout and device matter).
    ``heuristic``: ``"instant"``, ``"b"``, ``"fallback"``, a sequence of them, or ``"all"``
    (every engine index and its knob choices, up to ``limit`` per engine). Each
    :class:`EngineConfig` gives its name, heuristic modes, numerical and behavior notes,
    workspace bytes and whether it finalizes."""
    direction = _norm_direction(direction)
    problem = _problem(x, w, bias, stride, padding, dilation, groups)
    activation = check_activation(activation, direction, bias is not None)
    if direction != "forward":
        problem = problem.with_(has_bias=False)
    plan = _plan(problem, direction, activation, allow_tf32, None)
    return plan.engines(heuristic, limit=limit, finalize=finalize)


# ---------------------------------------------------------------------------- the registry
def _registry_tf32(options: Any) -> bool:
    from ...core.options import options_of

    return options_of(options).precision != "strict"


def _registry_candidates(problem: ConvProblem, direction: str = "forward", options: Any = None) -> ResultTable:
    return GraphConvolution.from_problem(problem, direction=direction,
                                         allow_tf32=_registry_tf32(options)).engines("all", limit=1)


def _registry_plan(problem: ConvProblem, direction: str = "forward", options: Any = None, choice: Any = None):
    return GraphConvolution.from_problem(problem, direction=direction, allow_tf32=_registry_tf32(options),
                                         engine=choice)


def _registry_replay(key, problem: ConvProblem, choice: Any, options: dict):
    """A tuning record's plan (rawconv.tuning.replay): with its fused activation when it had one."""
    if key.activation:
        return GraphConvolution.from_problem(problem, direction=key.direction, activation=key.activation,
                                             engine=choice, allow_tf32=options.get("precision") == "tf32")
    return _registry_plan(problem, key.direction, options, choice)


def _registry_info() -> dict:
    return _library.info()


# every public entry point raises only rawconv's exception classes (rawconv._guard)
_guard.guard_module(globals(), "forward", "backward_data", "backward_filter", "engines", "tuning_cache",
                    "save_tuning_cache", "load_tuning_cache", "GraphConvolution.__init__",
                    "GraphConvolution.from_problem", "GraphConvolution.execute", "GraphConvolution.__call__",
                    "GraphConvolution.candidates", "GraphConvolution.channels_last", "GraphConvolution.output")
backward_weights = backward_filter   # rawconv's word (backward_filter is cuDNN's)

from ...core.backend import Backend as _Backend, register as _register  # noqa: E402

_register(_Backend("cudnn_graph", "cuda", __name__, "cuDNN", _registry_candidates, _registry_plan, _registry_info,
                   "cuDNN's graph (backend) API on CUDA tensors: engines, knobs, heuristic modes",
                   {"candidates": "engines", "choice": "engine", "precision": "allow_tf32",
                    "backward_weights": "backward_filter"}, rows="rawconv.explore.cudnn_rows:cudnn_graph_rows",
                   replay=_registry_replay,
                   # engine configs: "eng28", "eng28{k2=3,k3=0}", on a relayout "nhwc:eng72{...}", "unfused:<config>"
                   choice_names=r"((nhwc|unfused):)*eng[0-9]+(\{[^{}]*\})?"))
