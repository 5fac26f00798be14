"""rawconv's convolutions as PyTorch custom operators (``torch.library``), differentiable to any order.

Quick use::

    import rawconv.ops
    y = rawconv.ops.conv(x, w, b, padding=1)                                  # oneDNN on CPU, cuDNN on CUDA
    y = rawconv.ops.conv(x, w, padding=1, choice="brgconv:avx512_core")     # exactly that implementation
    y = rawconv.ops.conv(x, w, padding=1, choice="eng28{k2=3}")             # a cuDNN graph engine config
    y = torch.ops.rawconv.conv_forward(x, w, None, [1, 1], [1, 1], [1, 1], [1, 1], 1,
                                       "auto", "", "strict", "", "")           # the operator itself

Operators (namespace ``rawconv``; schemas exactly as registered)::

    conv_forward(Tensor x, Tensor w, Tensor? bias, int[] stride, int[] pad_before, int[] pad_after,
                 int[] dilation, int groups, str backend, str choice, str precision,
                 str bwd_data_choice, str bwd_weights_choice) -> Tensor
    conv_backward_data(Tensor grad_y, Tensor w, SymInt[] x_shape, int[] stride, int[] pad_before,
                       int[] pad_after, int[] dilation, int groups, str backend, str choice,
                       str precision) -> Tensor
    conv_backward_weights(Tensor x, Tensor grad_y, SymInt[] w_shape, int[] stride, int[] pad_before,
                          int[] pad_after, int[] dilation, int groups, bool bias, str backend,
                          str choice, str precision) -> (Tensor, Tensor)

Arguments, shared by all three:

* tensors as ``torch.nn.functional.conv{1,2,3}d``: ``x`` (N, C, *spatial) or unbatched (C, *spatial),
  ``w`` (K, C/groups, *kernel), ``bias`` (K,), ``grad_y`` (N, K, *out); float32, bfloat16 or
  float16 (oneDNN: where this CPU offers them), also float64 on cuDNN; NCHW or channels_last.
* ``stride``, ``dilation`` (torch's: 1 = none), ``pad_before``, ``pad_after``: one int per spatial dim
  (asymmetric padding is allowed); ``groups``.
* ``backend``: ``"onednn"`` (CPU tensors), ``"cudnn"`` (CUDA tensors: cuDNN's legacy API, or its
  graph API when ``choice`` names an engine config), ``"cudnn_graph"`` (CUDA, graph API always),
  ``"auto"`` (by the tensors' device).
* ``choice``: ``""`` = the library's own first choice (oneDNN's first implementation, cuDNN's
  heuristic), else a stable name: a oneDNN implementation (``"brgconv:avx512_core"``, optionally
  ``"name@any"`` / ``"name@user"``), a cuDNN legacy algorithm ``"ALGO@math"``
  (``"IMPLICIT_PRECOMP_GEMM@fma"``; ``"@tensor_op"`` sets only the math type; ``"fastest"`` runs
  cuDNN's Find once per problem), or a graph engine config (``"eng28{k2=3}"``, ``"nhwc:eng72"``,
  ``"fastest"`` = autotune for ``cudnn_graph``).
* ``precision``: ``"strict"``, ``"tf32"``, ``"bf16"``, ``"f16"``, ``"any"`` (:mod:`rawconv.options`:
  oneDNN's fpmath mode, cuDNN's math type).

Results:

* ``conv_forward``: y (N, K, *out) in torch's memory format for it: channels_last when x **or** w
  is (:func:`rawconv.problem.conv_layout`, torch's ``mkldnn_conv_use_channels_last`` /
  ``cudnn_conv_suggest_memory_format``; never for float64; a 1-D convolution follows w alone); an
  x in another format is copied into it. An unbatched x gives an unbatched y.
* ``conv_backward_data``: dx of ``x_shape``, channels_last when grad_y or w is (torch's cuDNN
  backward-data rule; a grad_y whose shape cannot tell NCHW from NHWC counts as NCHW, as in torch).
* ``conv_backward_weights``: ``(dw, db)``: dw of ``w_shape``, channels_last when x or grad_y is
  (torch's cuDNN backward-weights rule; for 1-D grad_y alone decides); db of shape
  (K,) (grad_y summed over batch and space) when ``bias`` is True, else **an empty tensor of
  shape (0,)** (a schema's output count is fixed; an empty tensor costs nothing and tells the
  caller there is no bias gradient).

Kernels: CPU on cached oneDNN plans (:mod:`rawconv.onednn`, keyed by problem, direction, choice,
precision and thread; weights reordered on every call, never prepacked: an operator cannot know
when a tensor changes behind its back); CUDA on cuDNN's cached plans (:mod:`rawconv.cudnn`,
:mod:`rawconv.cudnn_graph`). Fake (meta) kernels compute shapes, dtypes, devices and strides
from :class:`~rawconv.problem.ConvProblem` (or the same formulas on symbolic sizes) without a
library call, so ``torch.compile(fullgraph=True)`` traces models using the operators.

Autograd (an Autograd kernel, as ``torch.library.register_autograd`` registers one) runs rawconv's
own ops, so gradients of any order come from the same libraries:

* d conv_forward: dx = ``conv_backward_data(gy, w)`` with ``bwd_data_choice``, (dw, db) =
  ``conv_backward_weights(x, gy)`` with ``bwd_weights_choice``;
* d conv_backward_data (linear in grad_y and w): d grad_y = ``conv_forward(g, w)``,
  dw = ``conv_backward_weights(g, grad_y)``;
* d conv_backward_weights (linear in x and grad_y): dx = ``conv_backward_data(grad_y, g_w)``,
  d grad_y = ``conv_forward(x, g_w, g_b)``.

**Backward choices: a pinned training step.** A forward ``choice`` name does not carry over to
the backward passes: the libraries list forward, backward-data and backward-weights candidates
separately (oneDNN names them differently; cuDNN's algorithm enums differ per direction), so there
is no honest mapping. The backward passes run ``bwd_data_choice`` / ``bwd_weights_choice`` when
given, else the library's own first choice for that backward problem: still one fixed candidate
for a given problem, library version and machine (:func:`selected` says which). To pin the whole
training step, pass one :class:`TrainingChoice` or a dict per direction as ``choice``
(``{"forward": ..., "backward_data": ..., "backward_weights": ...}``; what :func:`selected`
returns is such a dict): :func:`conv` and ``rawconv.nn``'s modules then run exactly those three
on every call. The derivatives of the backward operators (second order) run the library's first
choice.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from . import autocast as _autocast
from . import registered as _registered
from ..core import guard as _guard
from .. import onednn
from ..core.plans import PlanCache, arg_key
from ..core.errors import ArgumentError, ArgumentTypeError, NotSupportedError
from ..core.options import PRECISIONS
from ..core.problem import (ConvProblem, backward_data_layout, backward_weights_layout, conv_layout, dense_strides,
                      empty_like_layout, int_arg, layout_of, resolve_padding, shape_arg, shape_only, strides_match,
                      suggests_channels_last, to_layout, transposed_shapes, tuple_arg)

__all__ = ["conv", "conv_transpose", "conv_backward_data", "conv_backward_weights", "selected", "BACKENDS",
           "clear_cache", "TrainingChoice", "split_choice"]

BACKENDS = ("auto", "onednn", "cudnn", "cudnn_graph")
_DEVICE_OF = {"onednn": "cpu", "cudnn": "cuda", "cudnn_graph": "cuda"}

_lib = torch.library.Library("rawconv", "DEF")
_ARGS = "int[] stride, int[] pad_before, int[] pad_after, int[] dilation, int groups"
_lib.define(f"conv_forward(Tensor x, Tensor w, Tensor? bias, {_ARGS}, str backend, str choice, str precision, "
            "str bwd_data_choice, str bwd_weights_choice) -> Tensor")
_lib.define(f"conv_backward_data(Tensor grad_y, Tensor w, SymInt[] x_shape, {_ARGS}, str backend, str choice, "
            "str precision) -> Tensor")
_lib.define(f"conv_backward_weights(Tensor x, Tensor grad_y, SymInt[] w_shape, {_ARGS}, bool bias, str backend, "
            "str choice, str precision) -> (Tensor, Tensor)")

_fwd_op = torch.ops.rawconv.conv_forward.default
_bwd_data_op = torch.ops.rawconv.conv_backward_data.default
_bwd_weights_op = torch.ops.rawconv.conv_backward_weights.default


# ---------------------------------------------------------------------------- argument checks
def _check_strings(backend, choice, precision, device_type: str | None, *choices) -> None:
    """Validate the operator's string arguments (and the backend against the tensors' device)."""
    for v, nm in ((backend, "backend"), (choice, "choice"), (precision, "precision")) + \
            tuple((c, "backward choice") for c in choices):
        if not isinstance(v, str):
            raise ArgumentTypeError(f"{nm} must be a string, got {type(v).__name__}")
    if backend not in BACKENDS:
        _registered.check(backend)   # a backend registered in rawconv.core.backend (or the error naming them)
    if precision not in PRECISIONS:
        raise ArgumentError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    if device_type is not None and backend != "auto":
        runs_on = _DEVICE_OF.get(backend) or _registered.device_type(backend)
        if runs_on != device_type:
            other = "onednn" if device_type == "cpu" else "cudnn"
            raise ArgumentError(f"backend {backend!r} runs on {runs_on.upper()} tensors, got "
                                f"{device_type.upper()} tensors (use backend={other!r} or 'auto')")


def _padding(pad_before, pad_after):
    if len(pad_before) != len(pad_after):
        raise ArgumentError(f"pad_before and pad_after must have one int per spatial dim each, got "
                            f"{list(pad_before)} and {list(pad_after)}")
    return tuple(zip(pad_before, pad_after))


def _device_type(t: torch.Tensor) -> str:
    return t.device.type


def _batched(t: torch.Tensor, unbatched: bool) -> torch.Tensor:
    return t.unsqueeze(0) if unbatched else t


def _layout(t: torch.Tensor) -> str:
    """"nhwc" when ``t`` (batched) is channels-last, else "nchw" (torch-contiguous or other strides)."""
    return "nhwc" if layout_of(t) == "nhwc" else "nchw"


def _dx_layout(grad_y_batched: torch.Tensor, w: torch.Tensor) -> str:
    """dx's layout: channels last when grad_y or w is (torch's rule, :func:`rawconv.problem.backward_data_layout`)."""
    return backward_data_layout(grad_y_batched, w)


def _enforce_layout(t: torch.Tensor, layout: str, unbatched: bool) -> torch.Tensor:
    """``t`` with the dense strides of ``layout`` (a copy only when a library returned others)."""
    tb = _batched(t, unbatched)
    if strides_match(tb, dense_strides(tb.shape, layout)):
        return t
    out = empty_like_layout(tb.shape, layout, t.dtype, t.device)
    out.copy_(tb)
    return out.squeeze(0) if unbatched else out


def _grads_of_forward_layout(gx: torch.Tensor | None, gw: torch.Tensor | None, x: torch.Tensor,
                             w: torch.Tensor) -> tuple:
    """``(dx, dw)`` of an autograd backward in torch's layouts where the backward operators cannot
    see them. ``x``: the forward's input as called (batched or not); None gradients pass through;
    a copy only when a layout differs.

    * An empty batch (N = 0): torch's backward is ``zeros_like(x)``, ``zeros_like(w)``: x's and
      w's own strides (the operators see grad_y, w or x and grad_y, all empty); the gradients as
      computed, re-strided (differentiable, for a double backward).
    * Otherwise torch lays dw out as its forward (x and w: :func:`rawconv.problem.conv_layout`); the
      backward-weights operator reads x and grad_y alone, which misses a channels-last w for a 1-D
      problem (grad_y follows x's NCW there) and for an unbatched call (``x.unsqueeze(0)``, like
      torch's view of it, never suggests channels last).
    """
    unbatched = x.dim() == w.dim() - 1
    if not unbatched and x.shape[0] == 0:   # (copy_: a graph with create_graph=True, as torch's)
        return tuple(g if g is None or g.stride() == t.stride() else torch.empty_like(t).copy_(g)
                     for g, t in ((gx, x), (gw, w)))
    if gw is not None and (unbatched or w.dim() == 3):
        gw = _enforce_layout(gw, conv_layout(_batched(x, unbatched), w), False)
    return gx, gw


# ---------------------------------------------------------------------------- CPU kernels (oneDNN)
_cpu_cache = PlanCache(512)
_get_ident = onednn.thread_ident   # (thread, its OpenMP count): see onednn.thread_ident


def _onednn_choice(choice: str):
    return choice or None


def _forward_cpu_plan(x, w, bias, stride, pad_before, pad_after, dilation, groups, backend, choice, precision,
                      bwd_data_choice, bwd_weights_choice) -> onednn.Convolution:
    """The cached oneDNN forward plan for these arguments (validated on the first call)."""
    try:   # fast path: the same tensors' metadata and arguments as an earlier call reuse its plan
        # (w's dtype must be x's: a call that differs there fails the plan's checks, with the clear error)
        key = (x.shape, x.stride(), x.dtype, w.shape, w.stride(), bias is None, *stride, None, *pad_before, None,
               *pad_after, None, *dilation, groups, backend, choice, precision, _get_ident())
        plan = _cpu_cache.get(key)
    except Exception:   # noqa: BLE001  (the slow path says what is wrong)
        key = plan = None
    if plan is None:
        _check_strings(backend, choice, precision, "cpu", bwd_data_choice, bwd_weights_choice)
        problem = ConvProblem.from_torch(x, w, bias, stride, _padding(pad_before, pad_after), dilation, groups)
        if backend not in BACKENDS:   # a backend of the registry (rawconv.pytorch.registered)
            plan = _registered.plan(backend, "forward", problem, choice, precision)
        else:
            onednn.check_device(problem)
            plan = onednn.cached_plan(problem, "forward", "direct", precision, onednn.weights_layout(w), _onednn_choice(choice))
            plan.selected   # noqa: B018  (resolve the selection now: a bad choice raises before caching)
        if key is not None:
            _cpu_cache.put(key, plan)
    return plan


def _forward_cpu(x, w, bias, stride, pad_before, pad_after, dilation, groups, backend, choice, precision,
                 bwd_data_choice, bwd_weights_choice):
    # the fast path: the plan of the last call with these (non-tensor) arguments on this thread,
    # when the tensors fit its prepared pack exactly (the plan's hot path checks each tensor's
    # type, shape, strides, dtype, device and negative bit on every call); else the checked path
    try:
        akey = (*stride, None, *pad_before, None, *pad_after, None, *dilation, groups, backend, choice, precision,
                bwd_data_choice, bwd_weights_choice, _get_ident())
        plan = _cpu_last.get(akey)
    except Exception:   # noqa: BLE001  (the checked path says what is wrong)
        akey = plan = None
    if plan is not None:
        y = plan._hot_run(x, w, bias, None)
        if y is not None:
            return y
    plan = _forward_cpu_plan(x, w, bias, stride, pad_before, pad_after, dilation, groups, backend, choice, precision,
                             bwd_data_choice, bwd_weights_choice)
    y = plan.execute(x, w, bias)
    if akey is not None:
        _cpu_last.put(akey, plan)
    return y


_cpu_last = PlanCache(512)   # the operator's arguments (no tensors) + thread -> the plan of the last call with them


def _backward_data_plan(grad_y, w, x_shape, stride, pad_before, pad_after, dilation, groups, choice, precision):
    problem = onednn.backward_data_problem(grad_y, w, tuple(x_shape), stride, _padding(pad_before, pad_after),
                                           dilation, groups, False)
    plan = onednn.cached_plan(problem, "backward_data", "direct", precision, onednn.weights_layout(w), _onednn_choice(choice))
    plan.selected   # noqa: B018
    return plan


def _backward_data_cpu(grad_y, w, x_shape, stride, pad_before, pad_after, dilation, groups, backend, choice,
                       precision):
    return _data_result(_backward_data_cpu_plan(grad_y, w, x_shape, stride, pad_before, pad_after, dilation, groups,
                                                backend, choice, precision), grad_y, w)


def _data_result(plan, grad_y, w):
    """dx of backward-data ``plan`` on ``grad_y``, ``w``: its hot path (it checks the tensors),
    else its checked path."""
    dx = plan._grad_hot_run(grad_y, w)
    return dx if dx is not None else plan.execute(grad_y=grad_y, w=w)


def _backward_data_cpu_plan(grad_y, w, x_shape, stride, pad_before, pad_after, dilation, groups, backend, choice,
                            precision):
    """The oneDNN backward-data plan of :func:`_backward_data_cpu`'s arguments (this thread's, from
    the plan cache or made; raises its argument errors)."""
    try:
        key = ("d", grad_y.shape, grad_y.stride(), grad_y.dtype, w.shape, w.stride(), *x_shape, None, *stride, None,
               *pad_before, None, *pad_after, None, *dilation, groups, backend, choice, precision, _get_ident())
        plan = _cpu_cache.get(key)
    except Exception:   # noqa: BLE001
        key = plan = None
    if plan is None:
        _check_strings(backend, choice, precision, "cpu")
        if backend not in BACKENDS:
            plan = _registered.plan(backend, "backward_data", _registered.backward_data_problem(grad_y, w, x_shape,
                                    stride, _padding(pad_before, pad_after), dilation, groups), choice, precision)
        else:
            plan = _backward_data_plan(grad_y, w, x_shape, stride, pad_before, pad_after, dilation, groups, choice,
                                       precision)
        if key is not None:
            _cpu_cache.put(key, plan)
    return plan


def _backward_weights_problem(x, grad_y, w_shape, stride, pad_before, pad_after, dilation, groups, bias):
    """The forward problem of a backward-weights call (checks as :func:`rawconv.onednn.backward_weights`)."""
    if not isinstance(x, torch.Tensor) or not isinstance(grad_y, torch.Tensor):
        raise ArgumentTypeError("x and grad_y must be torch.Tensor")
    w_shape = shape_arg(w_shape, "w_shape", (3, 4, 5))
    if grad_y.is_nested or grad_y.layout != torch.strided:
        raise ArgumentError("grad_y must be a dense (strided) tensor")
    if grad_y.dtype != x.dtype:
        raise ArgumentError(f"grad_y must have x's dtype {x.dtype}, got {grad_y.dtype}")
    if grad_y.device != x.device:
        raise ArgumentError(f"grad_y must be on x's device {x.device}, got {grad_y.device}")
    fake_b = shape_only((w_shape[0],), x) if bias else None
    problem = ConvProblem.from_torch(x, shape_only(w_shape, x, "w_shape"), fake_b, stride, _padding(pad_before, pad_after),
                                     dilation, groups)
    from ..core.problem import check_tensor

    check_tensor(problem, grad_y, "grad_y", problem.y_shape)
    # dw (and the library's x and grad_y) in torch's layout for dw: channels last when x or grad_y is
    lay = backward_weights_layout(_batched(x, problem.unbatched), _batched(grad_y, problem.unbatched))
    return problem if lay == problem.layout else problem.with_(layout=lay)


def _backward_weights_cpu(x, grad_y, w_shape, stride, pad_before, pad_after, dilation, groups, bias, backend,
                          choice, precision):
    plan = _backward_weights_cpu_plan(x, grad_y, w_shape, stride, pad_before, pad_after, dilation, groups, bias,
                                      backend, choice, precision)
    res = plan._grad_hot_run(x, grad_y)   # the plan's hot path (it checks the tensors), else its checked path
    return _weights_result(plan, x, grad_y, bias, res)


def _weights_result(plan, x, grad_y, bias, res, empty_db=True):
    """``(dw, db)`` of backward-weights ``plan`` on ``x``, ``grad_y``: ``res`` (its hot path's
    result) or, when that is None, its checked call's; without a bias db is an empty tensor (the
    operator's schema returns one), or None with ``empty_db=False``."""
    if res is None:
        res = plan.execute(x, grad_y=grad_y)
    dw, db = res if bias else (res, torch.empty(0, dtype=x.dtype) if empty_db else None)
    if plan.problem.is_empty:   # no library call: torch's zeros, in the layout the fake kernel says
        dw = _enforce_layout(dw, plan.problem.layout, False)
    return dw, db


def _backward_weights_cpu_plan(x, grad_y, w_shape, stride, pad_before, pad_after, dilation, groups, bias, backend,
                               choice, precision):
    """The oneDNN backward-weights plan of :func:`_backward_weights_cpu`'s arguments (this
    thread's, from the plan cache or made; raises its argument errors)."""
    try:
        key = ("w", x.shape, x.stride(), x.dtype, grad_y.shape, grad_y.stride(), *w_shape, None, *stride, None,
               *pad_before, None, *pad_after, None, *dilation, groups, bias, backend, choice, precision, _get_ident())
        plan = _cpu_cache.get(key)
    except Exception:   # noqa: BLE001
        key = plan = None
    if plan is None:
        _check_strings(backend, choice, precision, "cpu")
        if not isinstance(bias, bool):
            raise ArgumentTypeError(f"bias must be True or False, got {bias!r}")
        problem = _backward_weights_problem(x, grad_y, w_shape, stride, pad_before, pad_after, dilation, groups, bias)
        if backend not in BACKENDS:
            plan = _registered.plan(backend, "backward_weights", problem, choice, precision)
        else:
            onednn.check_device(problem)
            # dw comes out in the problem's layout (torch's rule: x or grad_y channels last)
            plan = onednn.cached_plan(problem, "backward_weights", "direct", precision, problem.layout,
                                _onednn_choice(choice))
            plan.selected   # noqa: B018
        if key is not None:
            _cpu_cache.put(key, plan)
    return plan


# ---------------------------------------------------------------------------- CUDA kernels (cuDNN)
def _legacy_choice(choice: str):
    """``(choice, math)`` for rawconv.cudnn's function forms: ``"@tensor_op"`` sets the math only."""
    if choice.startswith("@"):
        return None, choice[1:]
    return (choice or None), None


_GRAPH_MATH = {"strict": None, "tf32": "tensor_op", "bf16": "tensor_op_allow_conversion",
               "f16": "tensor_op_allow_conversion", "any": "default"}


def _api(backend: str, choice: str) -> str:
    """Which cuDNN API a CUDA kernel runs: ``"graph"`` for backend ``"cudnn_graph"``, for a graph
    engine config's name (``"eng28{k2=3}"``, ``"nhwc:eng72"``) and for ``"auto"`` with no choice
    (the graph API first, as torch's own convolutions; ``"auto"`` falls back to the legacy API
    when cuDNN offers no engine config for the graph); ``"legacy"`` for backend ``"cudnn"`` and
    for a legacy algorithm's name (``"IMPLICIT_PRECOMP_GEMM@fma"``, ``"@tensor_op"``,
    ``"fastest"`` = cuDNN's Find)."""
    if backend == "cudnn_graph":
        return "graph"
    from .. import cudnn

    if cudnn.is_graph_choice(choice):
        return "graph"
    return "graph" if backend == "auto" and not choice else "legacy"


def _graph_default(plan, backend: str, choice: str):
    """``plan`` with its default engine config finalized, or None for backend ``"auto"`` with no
    choice when cuDNN offers none for this graph (the caller then runs the legacy API)."""
    if backend != "auto" or choice or plan.problem.is_empty:
        return plan
    try:
        plan._current()
    except NotSupportedError:
        return None
    return plan


def _forward_cuda(x, w, bias, stride, pad_before, pad_after, dilation, groups, backend, choice, precision,
                  bwd_data_choice, bwd_weights_choice):
    # y comes out in ConvProblem.layout from both APIs (torch's rule, rawconv.problem.conv_layout,
    # which the fake kernel follows): no check needed here.
    # The fast path, as on the CPU: the plan of the last call with these (non-tensor) arguments,
    # backend, bias presence, device and thread, when the tensors fit its prepared call exactly
    # (checked per call by the plan's hot path: cudnn_graph's or the legacy cudnn's); else the
    # checked path below
    try:
        akey = (*stride, None, *pad_before, None, *pad_after, None, *dilation, groups, backend, choice, precision,
                bwd_data_choice, bwd_weights_choice, bias is None, x.get_device(), _thread())
        plan = _cuda_last.get(akey)
    except Exception:   # noqa: BLE001  (the checked path says what is wrong)
        akey = plan = None
    if plan is not None:
        y = plan._hot_call(x, w, bias)
        if y is not None:
            return y
    y, plan = _forward_cuda_checked(x, w, bias, stride, pad_before, pad_after, dilation, groups, backend, choice,
                                    precision, bwd_data_choice, bwd_weights_choice)
    if akey is not None:
        _cuda_last.put(akey, plan)
    return y


def _forward_cuda_checked(x, w, bias, stride, pad_before, pad_after, dilation, groups, backend, choice, precision,
                          bwd_data_choice, bwd_weights_choice):
    """The CUDA forward's checked path: (y, the plan that ran it)."""
    _check_strings(backend, choice, precision, "cuda", bwd_data_choice, bwd_weights_choice)
    padding = _padding(pad_before, pad_after)
    with torch.no_grad():   # the function forms route tensors that need grad back here
        plan = None
        if backend not in BACKENDS:   # a backend of the registry (rawconv.pytorch.registered)
            plan = _registered.plan(backend, "forward", ConvProblem.from_torch(x, w, bias, stride, padding, dilation,
                                                                               groups), choice, precision)
        elif _api(backend, choice) == "graph":
            from ..cudnn import graph as cudnn_graph

            plan = _graph_default(cudnn_graph.cached_forward_plan(x, w, bias, tuple(stride), padding, tuple(dilation),
                                                                  groups, choice or None, None, False,
                                                                  _GRAPH_MATH[precision]), backend, choice)
        if plan is None:
            from .. import cudnn

            c, m = _legacy_choice(choice)
            algo, math, _engine = cudnn.normalize_choice("forward", None, c, m, precision, None)
            plan = cudnn.cached_forward_plan(x, w, bias, tuple(stride), padding, tuple(dilation), groups, algo, math,
                                             False, None, None)
        return plan.execute(x, w, bias), plan


_cuda_last = PlanCache(512)   # as _cpu_last, for cuDNN plans of every direction (graph and legacy; the
# direction and backend are in the key; the thread's id alone: a cuDNN plan's call does not depend
# on OpenMP's thread count, which the CPU keys hold)
_thread = threading.get_ident


def _backward_data_cuda(grad_y, w, x_shape, stride, pad_before, pad_after, dilation, groups, backend, choice,
                        precision):
    try:   # the fast path, as the forward's
        akey = ("d", *x_shape, None, *stride, None, *pad_before, None, *pad_after, None, *dilation, groups, backend,
                choice, precision, grad_y.get_device(), _thread())
        plan = _cuda_last.get(akey)
    except Exception:   # noqa: BLE001  (the checked path says what is wrong)
        akey = plan = None
    if plan is not None:
        dx = plan._hot_call(grad_y, w, None)
        if dx is not None:
            return dx
    dx, plan = _backward_data_cuda_checked(grad_y, w, x_shape, stride, pad_before, pad_after, dilation, groups,
                                           backend, choice, precision)
    if plan is not None and akey is not None:
        _cuda_last.put(akey, plan)
    return dx


def _backward_data_cuda_checked(grad_y, w, x_shape, stride, pad_before, pad_after, dilation, groups, backend,
                                choice, precision):
    """The CUDA backward data's checked path: ``(dx, plan)``, ``plan`` the plan (graph or legacy)
    whose hot path returns what this call returned (for the caller to keep), else None."""
    _check_strings(backend, choice, precision, "cuda")
    padding = _padding(pad_before, pad_after)
    x_shape = tuple(int(s) for s in x_shape)
    unbatched = len(x_shape) == w.dim() - 1
    gy = _batched(grad_y, unbatched)
    xs = (1,) + x_shape if unbatched else x_shape
    with torch.no_grad():
        plan = None
        if backend not in BACKENDS:
            plan = _registered.plan(backend, "backward_data", _registered.backward_data_problem(grad_y, w, x_shape,
                                    stride, _padding(pad_before, pad_after), dilation, groups), choice, precision)
            return plan.execute(grad_y=grad_y, w=w), plan
        if _api(backend, choice) == "graph":
            from ..cudnn import graph as cudnn_graph

            plan = _graph_default(cudnn_graph.cached_grad_plan("backward_data", gy, w, xs, tuple(stride), padding,
                                                               tuple(dilation), groups, choice or None, False,
                                                               _GRAPH_MATH[precision]), backend, choice)
        if plan is None:   # the legacy API: rawconv.cudnn.backward_data's plan, kept for the hot path
            from .. import cudnn

            c, math = _legacy_choice(choice)
            algo, math, _engine = cudnn.normalize_choice("backward_data", None, c, math, precision, None)
            problem = cudnn.grad_problem(gy, w, xs, tuple(stride), padding, tuple(dilation), groups,
                                         "backward_data")
            plan = cudnn.cached_plan(problem, "backward_data", cudnn.weights_layout(w, problem), algo, math, False, None, None)
        dx = plan.execute(grad_y=gy, w=w)
    raw = dx
    dx = _enforce_layout(dx, _dx_layout(gy, w), False)   # torch's layout, the fake's rule
    keep = plan if dx is raw and not unbatched else None
    return (dx.squeeze(0) if unbatched else dx), keep


def _bias_grad_of(gy: torch.Tensor) -> torch.Tensor:
    """db: grad_y (batched) summed over batch and space, accumulated in float32 (float64 for float64)."""
    return gy.sum([0] + list(range(2, gy.dim())), dtype=torch.float64 if gy.dtype == torch.float64
                  else torch.float32).to(gy.dtype)


def _backward_weights_cuda(x, grad_y, w_shape, stride, pad_before, pad_after, dilation, groups, bias, backend,
                           choice, precision):
    try:   # the fast path, as the forward's
        akey = ("w", *w_shape, None, *stride, None, *pad_before, None, *pad_after, None, *dilation, groups, bias,
                backend, choice, precision, x.get_device(), _thread())
        plan = _cuda_last.get(akey)
    except Exception:   # noqa: BLE001  (the checked path says what is wrong)
        akey = plan = None
    if plan is not None:
        dw = plan._hot_call(x, grad_y, None)
        if dw is not None:
            return dw, (_bias_grad_of(grad_y) if bias else dw.new_empty(0))
    dw, db, plan = _backward_weights_cuda_checked(x, grad_y, w_shape, stride, pad_before, pad_after, dilation,
                                                  groups, bias, backend, choice, precision)
    if plan is not None and akey is not None:
        _cuda_last.put(akey, plan)
    return dw, db


def _backward_weights_cuda_checked(x, grad_y, w_shape, stride, pad_before, pad_after, dilation, groups, bias,
                                   backend, choice, precision):
    """The CUDA backward weights' checked path: ``(dw, db, plan)``, ``plan`` the plan (graph or
    legacy) whose hot path returns this call's dw (for the caller to keep), else None."""
    _check_strings(backend, choice, precision, "cuda")
    p = _backward_weights_problem(x, grad_y, w_shape, stride, pad_before, pad_after, dilation, groups, bias)
    padding = _padding(pad_before, pad_after)
    xb, gy = _batched(x, p.unbatched), _batched(grad_y, p.unbatched)
    with torch.no_grad():
        plan = None
        if backend not in BACKENDS:
            plan = _registered.plan(backend, "backward_weights", p, choice, precision)
            dw, db = _weights_result(plan, x, grad_y, bias, None)
            # (kept for the hot path as the built-in ones: batched calls only, whose db it sums itself)
            return dw, (db if bias else torch.empty(0, dtype=x.dtype, device=x.device)), (None if p.unbatched else plan)
        if _api(backend, choice) == "graph":
            from ..cudnn import graph as cudnn_graph

            plan = _graph_default(cudnn_graph.cached_grad_plan("backward_weights", xb, gy, p.w_shape, tuple(stride),
                                                               padding, tuple(dilation), groups, choice or None, False,
                                                               _GRAPH_MATH[precision]), backend, choice)
        if plan is not None:
            dw = plan.execute(xb, grad_y=gy)
        else:   # the legacy API: rawconv.cudnn.backward_weights's plan, kept for the hot path
            from .. import cudnn

            c, math = _legacy_choice(choice)
            algo, math, _engine = cudnn.normalize_choice("backward_weights", None, c, math, precision, None)
            # the legacy API takes x, grad_y and dw in one layout (a mixed set is NOT_SUPPORTED for
            # every algo): dw's (torch's rule: channels last when x or grad_y is), NCW for a 1-D
            # problem (no channels-last 1-D descriptors there; dw is re-laid out below)
            lay = p.layout if xb.dim() > 3 else "nchw"
            xb, gy = _enforce_layout(xb, lay, False), _enforce_layout(gy, lay, False)
            problem = cudnn.grad_problem(gy, xb, p.w_shape, tuple(stride), padding, tuple(dilation), groups,
                                         "backward_weights")
            plan = cudnn.cached_plan(problem, "backward_weights", lay, algo, math, False, None, None)
            dw = plan.execute(xb, grad_y=gy)
            if xb is not x or gy is not grad_y:   # copies: the hot path (on the tensors as passed) would differ
                plan = None
        raw = dw
        dw = _enforce_layout(dw, p.layout, False)
        db = _bias_grad_of(gy) if bias else torch.empty(0, dtype=x.dtype, device=x.device)
    return dw, db, (plan if dw is raw and not p.unbatched else None)


_lib.impl("conv_forward", _forward_cpu, "CPU")
_lib.impl("conv_backward_data", _backward_data_cpu, "CPU")
_lib.impl("conv_backward_weights", _backward_weights_cpu, "CPU")
_lib.impl("conv_forward", _forward_cuda, "CUDA")
_lib.impl("conv_backward_data", _backward_data_cuda, "CUDA")
_lib.impl("conv_backward_weights", _backward_weights_cuda, "CUDA")


# ---------------------------------------------------------------------------- fake (meta) kernels
def _concrete(*seqs) -> bool:
    return all(type(s) is int for q in seqs for s in q)


def _out_spatial(in_spatial, kernel, stride, pad_before, pad_after, dilation):
    """ConvProblem.out_spatial's formula, on ints or symbolic sizes."""
    return tuple((i + pb + pa - d * (k - 1) - 1) // s + 1
                 for i, k, s, pb, pa, d in zip(in_spatial, kernel, stride, pad_before, pad_after, dilation))


def _fake_args(stride, pad_before, pad_after, dilation, groups, nd):
    s = tuple_arg(list(stride), nd, "stride", 1)
    d = tuple_arg(list(dilation), nd, "dilation", 1)
    pb, pa = resolve_padding(_padding(pad_before, pad_after), nd, (1,) * nd, d, s)
    g = int_arg(groups)
    if g is None or g < 1:
        raise ArgumentError(f"groups must be a positive int, got {groups!r}")
    return s, pb, pa, d, g


@torch.library.register_fake("rawconv::conv_forward")
def _forward_fake(x, w, bias, stride, pad_before, pad_after, dilation, groups, backend, choice, precision,
                  bwd_data_choice, bwd_weights_choice):
    _check_strings(backend, choice, precision, _device_type(x), bwd_data_choice, bwd_weights_choice)
    if _concrete(x.shape, x.stride(), w.shape, w.stride()):
        p = ConvProblem.from_torch(x, w, bias, stride, _padding(pad_before, pad_after), dilation, groups)
        y_shape, layout, unbatched = p.y_shape, p.layout, p.unbatched
    else:   # symbolic sizes: the same formulas, without ConvProblem's int checks (they would specialize)
        nd = w.dim() - 2
        unbatched = x.dim() == nd + 1
        s, pb, pa, d, _ = _fake_args(stride, pad_before, pad_after, dilation, groups, nd)
        xb = _batched(x, unbatched)
        y_shape = (xb.shape[0], w.shape[0]) + _out_spatial(xb.shape[2:], w.shape[2:], s, pb, pa, d)
        layout = conv_layout(xb, w)
    y = empty_like_layout(y_shape, layout, x.dtype, x.device)
    return y.squeeze(0) if unbatched else y


@torch.library.register_fake("rawconv::conv_backward_data")
def _backward_data_fake(grad_y, w, x_shape, stride, pad_before, pad_after, dilation, groups, backend, choice,
                        precision):
    _check_strings(backend, choice, precision, _device_type(grad_y))
    nd = w.dim() - 2
    unbatched = len(x_shape) == nd + 1
    xs = ((1,) + tuple(x_shape)) if unbatched else tuple(x_shape)
    gy = _batched(grad_y, unbatched)
    if _concrete(xs, grad_y.shape, grad_y.stride(), w.shape, w.stride()):
        if grad_y.device.type == "cpu":
            p = onednn.backward_data_problem(grad_y, w, tuple(x_shape), stride, _padding(pad_before, pad_after),
                                             dilation, groups, False)
            layout = p.layout
        else:
            ConvProblem.from_torch(shape_only(xs, grad_y, "x_shape"), w, None, stride, _padding(pad_before, pad_after),
                                   dilation, groups)   # the checks
            layout = _dx_layout(gy, w)
    else:
        _fake_args(stride, pad_before, pad_after, dilation, groups, nd)   # the checks
        layout = _dx_layout(gy, w)
    dx = empty_like_layout(xs, layout, grad_y.dtype, grad_y.device)
    return dx.squeeze(0) if unbatched else dx


@torch.library.register_fake("rawconv::conv_backward_weights")
def _backward_weights_fake(x, grad_y, w_shape, stride, pad_before, pad_after, dilation, groups, bias, backend,
                           choice, precision):
    _check_strings(backend, choice, precision, _device_type(x))
    nd = len(w_shape) - 2
    if _concrete(w_shape, x.shape, x.stride(), grad_y.shape):
        p = _backward_weights_problem(x, grad_y, w_shape, stride, pad_before, pad_after, dilation, groups, bias)
        layout = p.layout
    else:
        unbatched = x.dim() == nd + 1
        layout = backward_weights_layout(_batched(x, unbatched), _batched(grad_y, unbatched))
    dw = empty_like_layout(tuple(w_shape), layout, x.dtype, x.device)
    db = x.new_empty((w_shape[0],) if bias else (0,))
    return dw, db


# ---------------------------------------------------------------------------- autograd
# Registered as torch.library.register_autograd registers (an Autograd kernel that applies an
# autograd.Function whose forward redispatches below autograd), written out here: torch's generated
# kernel re-fills the schema's defaults on every call (40% of a grad-mode call on a tiny problem),
# and when the only key left below autograd is the backend's, the kernel is called directly (what
# the redispatch would do), saving a second trip through the dispatcher.
_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_CPU_ONLY = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_CUDA_ONLY = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
_below_autograd = torch._C._AutoDispatchBelowAutograd


_KEYSETS: dict = {}   # keyset.raw_repr() -> 1 (only CPU left below autograd), 2 (only CUDA), 0 (other keys)


def _run_below_autograd(op, cpu_kernel, cuda_kernel, keyset, args):
    """``op(*args)`` below autograd: the backend's kernel directly when only its key is left below
    autograd in ``keyset``, else a redispatch; ``keyset`` None (an autograd Function applied from
    Python under a torch.func transform): the operator called under ``_AutoDispatchBelowAutograd``."""
    if keyset is None:
        with _below_autograd():
            return op(*args)
    raw = keyset.raw_repr()
    kind = _KEYSETS.get(raw)
    if kind is None:
        rest = keyset & _AFTER_AUTOGRAD
        kind = 1 if rest == _CPU_ONLY else 2 if rest == _CUDA_ONLY else 0
        if len(_KEYSETS) < 256:
            _KEYSETS[raw] = kind
    if kind == 1:
        return cpu_kernel(*args)
    if kind == 2:
        return cuda_kernel(*args)
    with _below_autograd():
        return op.redispatch(keyset & _AFTER_AUTOGRAD, *args)


def _grad_like(g: torch.Tensor, x: torch.Tensor, unbatched: bool, w: torch.Tensor | None = None) -> torch.Tensor:
    """``g`` dense in the forward's output layout (incoming gradients may be expanded or oddly
    strided): with ``w``, torch's (:func:`rawconv.problem.conv_layout` of x and w; dx and dw then
    come out in it, as torch's); without, x's (rawconv.fused's operator, whose y is in x's)."""
    xb = _batched(x, unbatched)
    if (conv_layout(xb, w) if w is not None else _layout(xb)) == "nhwc":
        if g.dim() in (4, 5):
            g = g.contiguous(memory_format=torch.channels_last if g.dim() == 4 else torch.channels_last_3d)
            if w is not None and g.is_cpu and g.numel() and not suggests_channels_last(g):
                # strides that fit both formats (one channel, a 1x1 output): the backward operators
                # read the layout from grad_y, torch's CPU backward from x and w; the same memory
                # viewed with channels-last strides says so
                g = g.as_strided(g.shape, dense_strides(g.shape, "nhwc"))
            return g
        return to_layout(g, "nhwc") if g.dim() == 3 else g.contiguous()
    return g.contiguous()


class _Conf:
    """An operator's non-tensor arguments as ONE opaque input of its autograd Function: torch.func
    flattens a Function's inputs as pytrees (lists and tuples would be leaves wanting a gradient
    each, and the backward's result would not match them)."""

    __slots__ = ("args",)

    def __init__(self, args):
        self.args = tuple(args)


def _add(a, b):
    """a + b where either may be None (a tangent that is zero)."""
    if a is None:
        return b
    return a if b is None else a + b


# The autograd Functions below keep the forward apart from setup_context (torch.func's grad, vjp,
# jacrev, hessian need that) and give the forward-mode derivative (jvp: torch.autograd.forward_ad,
# torch.func.jvp / jacfwd); each operator is bilinear in its two tensors, so a tangent is the
# same operator on (tangent, other) plus on (other, tangent). vmap uses torch's generated rule.
def _no_autocast(backward):
    """An autograd Function's ``backward`` run with autocast off for its gradient's device:
    torch's convolution backward has no autocast rule (it runs in its inputs' dtype), while the
    backward operators it calls here (``rawconv::conv_backward_data`` is also the transposed
    convolution's forward) have autocast kernels, which would cast a float32 backward into the
    autocast dtype when ``backward`` / ``autograd.grad`` is called under ``torch.autocast``."""
    import functools

    @functools.wraps(backward)
    def run(ctx, *grads):
        if _autocasting():
            g = next((t for t in grads if isinstance(t, torch.Tensor)), None)
            if g is not None and g.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(g.device.type):
                with torch.autocast(g.device.type, enabled=False):
                    return backward(ctx, *grads)
        return backward(ctx, *grads)
    return run


class RawconvConvForward(torch.autograd.Function):
    """rawconv::conv_forward's autograd: dx by conv_backward_data(gy, w), (dw, db) by
    conv_backward_weights(x, gy), with the pinned backward choices."""

    generate_vmap_rule = True

    @staticmethod
    def forward(how, x, w, bias, conf):
        # how: the dispatch keyset (from the operator's Autograd kernel); an entry of _conv_entry's
        # direct path (a list: its plans' hot paths check the tensors, else the checked kernels run);
        # None: applied from Python under a torch.func transform (see _fwd_call)
        args = conf.args
        if type(how) is list:
            if x.is_cuda:
                plan = how[2]
                y = None if plan is None else plan._hot_forward(x, w, bias)
                if y is None:
                    y, how[2] = _forward_cuda_checked(x, w, bias, *args)
                return y
            y = how[1]._hot_run(x, w, bias, None)
            return _forward_cpu(x, w, bias, *args) if y is None else y
        return _run_below_autograd(_fwd_op, _forward_cpu, _forward_cuda, how, (x, w, bias) + args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        how, x, w, bias, conf = inputs
        ctx.save_for_backward(x, w)
        ctx.save_for_forward(x, w)
        ctx.conf = conf.args, bias is not None
        ctx.entry = how if type(how) is list else None

    @staticmethod
    @_no_autocast
    def backward(ctx, gy):
        if ctx.entry is not None and _plain_backward() and not _legacy_batched(gy):
            return _direct_backward(ctx, gy)
        x, w = ctx.saved_tensors
        (stride, pb, pa, dil, groups, backend, _choice, precision, bdc, bwc), has_bias = ctx.conf
        _, nx, nw, nb = ctx.needs_input_grad[:4]
        gy = _grad_like(gy, x, x.dim() == w.dim() - 1, w=w)
        gx = gw = gb = None
        if nx:
            gx = _bwd_data_call(gy, w, list(x.shape), stride, pb, pa, dil, groups, backend, bdc, precision)
        if nw or (has_bias and nb):
            gw, gb = _bwd_weights_call(x, gy, list(w.shape), stride, pb, pa, dil, groups, has_bias, backend, bwc,
                                     precision)
            gw = gw if nw else None
            gb = gb if has_bias and nb else None
        gx, gw = _grads_of_forward_layout(gx, gw, x, w)
        return None, gx, gw, gb, None

    @staticmethod
    def jvp(ctx, _how_t, x_t, w_t, b_t, _conf_t):
        x, w = ctx.saved_tensors
        args, _ = ctx.conf
        t = None
        if x_t is not None or (b_t is not None and w_t is None):
            t = _fwd_call(x_t if x_t is not None else torch.zeros_like(x), w, b_t, *args)
        if w_t is not None:
            t = _add(t, _fwd_call(x, w_t, b_t if t is None else None, *args))
        return t


class RawconvConvBackwardData(torch.autograd.Function):
    """rawconv::conv_backward_data's autograd (linear in grad_y and w): d grad_y = conv_forward(g, w),
    dw = conv_backward_weights(g, grad_y), at the library's first choice."""

    generate_vmap_rule = True

    @staticmethod
    def forward(keyset, grad_y, w, conf):
        return _run_below_autograd(_bwd_data_op, _backward_data_cpu, _backward_data_cuda, keyset,
                                   (grad_y, w) + conf.args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _keyset, grad_y, w, conf = inputs
        ctx.save_for_backward(grad_y, w)
        ctx.save_for_forward(grad_y, w)
        ctx.conf = conf.args

    @staticmethod
    @_no_autocast
    def backward(ctx, g):
        grad_y, w = ctx.saved_tensors
        x_shape, stride, pb, pa, dil, groups, backend, _choice, precision = ctx.conf
        _, ngy, nw = ctx.needs_input_grad[:3]
        unbatched = len(x_shape) == w.dim() - 1
        # as a transposed convolution of grad_y: torch gives both gradients its forward's layout
        g = _grad_like(g, grad_y, unbatched, w=w)
        ggy = gw = None
        if ngy:
            ggy = _fwd_call(g, w, None, stride, pb, pa, dil, groups, backend, "", precision, "", "")
        if nw:
            gw = _bwd_weights_call(g, grad_y, list(w.shape), stride, pb, pa, dil, groups, False, backend, "",
                                 precision)[0]
        # as a transposed convolution of grad_y (1-D, unbatched, an empty batch: torch's layouts; backward
        # weights follows its grad_y there, here grad_y's x)
        ggy, gw = _grads_of_forward_layout(ggy, gw, grad_y, w)
        return None, ggy, gw, None

    @staticmethod
    def jvp(ctx, _keyset_t, gy_t, w_t, _conf_t):
        grad_y, w = ctx.saved_tensors
        t = None
        if gy_t is not None:
            t = _bwd_data_call(gy_t, w, *ctx.conf)
        if w_t is not None:
            t = _add(t, _bwd_data_call(grad_y, w_t, *ctx.conf))
        return t


class RawconvConvBackwardWeights(torch.autograd.Function):
    """rawconv::conv_backward_weights's autograd (linear in x and grad_y): dx = conv_backward_data(grad_y,
    g_w), d grad_y = conv_forward(x, g_w, g_b), at the library's first choice."""

    generate_vmap_rule = True

    @staticmethod
    def forward(keyset, x, grad_y, conf):
        return _run_below_autograd(_bwd_weights_op, _backward_weights_cpu, _backward_weights_cuda, keyset,
                                   (x, grad_y) + conf.args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _keyset, x, grad_y, conf = inputs
        ctx.save_for_backward(x, grad_y)
        ctx.save_for_forward(x, grad_y)
        ctx.conf = conf.args
        ctx.db_shape = tuple(output[1].shape)

    @staticmethod
    @_no_autocast
    def backward(ctx, gdw, gdb):
        x, grad_y = ctx.saved_tensors
        _w_shape, stride, pb, pa, dil, groups, bias, backend, _choice, precision = ctx.conf
        _, nx, ngy = ctx.needs_input_grad[:3]
        gx = ggy = None
        use_b = bias and gdb is not None
        if nx and gdw is not None:
            gx = _bwd_data_call(grad_y, gdw, list(x.shape), stride, pb, pa, dil, groups, backend, "", precision)
        if ngy:
            if gdw is not None:
                ggy = _fwd_call(x, gdw, gdb if use_b else None, stride, pb, pa, dil, groups, backend, "", precision,
                              "", "")
            elif use_b:   # only db is used: d grad_y is gdb broadcast over batch and space
                nd = len(stride)
                shape = ([-1] if grad_y.dim() == nd + 1 else [1, -1]) + [1] * nd
                ggy = gdb.view(shape).expand(grad_y.shape).contiguous()
        return None, gx, ggy, None

    @staticmethod
    def jvp(ctx, _keyset_t, x_t, gy_t, _conf_t):
        x, grad_y = ctx.saved_tensors
        dw_t = db_t = None
        if x_t is not None:
            dw_t = _bwd_weights_call(x_t, grad_y, *ctx.conf)[0]
        if gy_t is not None:
            dw2, db_t = _bwd_weights_call(x, gy_t, *ctx.conf)
            dw_t = _add(dw_t, dw2)
        if db_t is None:   # db does not depend on x
            db_t = torch.zeros(ctx.db_shape, dtype=x.dtype, device=x.device)
        return dw_t, db_t


_fwad = torch.autograd.forward_ad


def _classic(cls):
    """A twin of autograd Function ``cls`` (forward apart from ``setup_context``) in the combined
    style (``forward(ctx, *inputs)`` running both), with the same backward and jvp. Applying a
    Function that defines ``setup_context`` costs torch an ``inspect.signature(...).bind`` of its
    forward on every call (``benchmarks/diag_function_apply.py`` on the 2-core EPYC, torch 2.14: 94 us
    per apply of a trivial Function in that style against 12 us in the combined style; 88 against 8
    under no_grad), once per convolution of a training step. torch.func's transforms need that style, so the classes
    stay for them (the ``_functorch()`` paths) and every other caller applies the twin."""
    fwd, setup = cls.forward, cls.setup_context

    def forward(ctx, *inputs):
        out = fwd(*inputs)
        setup(ctx, inputs, out)
        return out

    body = {"forward": staticmethod(forward), "backward": staticmethod(cls.backward), "__doc__": cls.__doc__,
            "__module__": cls.__module__}
    if "jvp" in vars(cls):
        body["jvp"] = staticmethod(cls.jvp)
    # the same name: grad_fn reads <RawconvConvForwardBackward> either way
    return type(cls.__name__, (torch.autograd.Function,), dict(body, __qualname__=cls.__qualname__))


_FwdFn = _classic(RawconvConvForward)
_BwdDataFn = _classic(RawconvConvBackwardData)
_BwdWeightsFn = _classic(RawconvConvBackwardWeights)


# The operators from Python. Under a torch.func transform (grad, vjp, jacrev, jvp, jacfwd, hessian,
# vmap) functorch applies an autograd.Function only from Python (not from inside a dispatcher
# kernel: "could not find kernel for HigherOrderOperator custom_function_call"), so there the
# Function is applied here and its forward dispatches below autograd.
@_guard.applies_function
def _fwd_call(x, w, bias, *args):
    if _functorch():
        return RawconvConvForward.apply(None, x, w, bias, _Conf(args))
    return _fwd_op(x, w, bias, *args)


@_guard.applies_function
def _bwd_data_call(grad_y, w, *args):
    if _functorch():
        return RawconvConvBackwardData.apply(None, grad_y, w, _Conf(args))
    return _bwd_data_op(grad_y, w, *args)


@_guard.applies_function
def _bwd_weights_call(x, grad_y, *args):
    if _functorch():
        return RawconvConvBackwardWeights.apply(None, x, grad_y, _Conf(args))
    return _bwd_weights_op(x, grad_y, *args)


def _under_transform(op: str) -> None:
    """The operator itself called with a gradient or tangent to record under a torch.func transform."""
    raise NotSupportedError(f"torch.ops.rawconv.{op} called directly under a torch.func transform (grad, jvp, "
                            f"vmap...) records no derivative there: call rawconv.ops.{_PUBLIC_OF[op]} instead "
                            "(it applies the operator's autograd Function from Python, as torch.func requires)")


_PUBLIC_OF = {"conv_forward": "conv", "conv_backward_data": "conv_backward_data",
              "conv_backward_weights": "conv_backward_weights"}


def _needs(a, b, c=None) -> bool:
    """Whether the call must go through the autograd Function: grad mode on and an argument that
    requires grad, or a forward-mode AD level open (its tangents, if any, need the Function's jvp)."""
    return (_grad_enabled() and (a.requires_grad or b.requires_grad or (c is not None and c.requires_grad))) \
        or _fwad._current_level >= 0


# The operators' Autograd kernels: what torch.compile's generated code and eager autograd reach
# through the dispatcher on every call. With nothing to record (grad mode off, as inside a compiled
# graph, or no input requiring grad, no forward-mode level) and only the backend's key left below
# autograd (the keyset's kind already in _KEYSETS), the backend's kernel is called at once: the
# checks of _needs and _run_below_autograd inline, one Python frame less each.
@_guard.applies_function
def _forward_autograd(keyset, x, w, bias, *args):
    if (not _grad_enabled() or not (x.requires_grad or w.requires_grad or (bias is not None and bias.requires_grad))) \
            and _fwad._current_level < 0:
        kind = _KEYSETS.get(keyset.raw_repr())
        if kind == 2:
            return _forward_cuda(x, w, bias, *args)
        if kind == 1:
            return _forward_cpu(x, w, bias, *args)
    else:   # _needs(x, w, bias)
        if _functorch():
            _under_transform("conv_forward")
        return _FwdFn.apply(keyset, x, w, bias, _Conf(args))
    return _run_below_autograd(_fwd_op, _forward_cpu, _forward_cuda, keyset, (x, w, bias) + args)


@_guard.applies_function
def _backward_data_autograd(keyset, grad_y, w, *args):
    if (not _grad_enabled() or not (grad_y.requires_grad or w.requires_grad)) and _fwad._current_level < 0:
        kind = _KEYSETS.get(keyset.raw_repr())
        if kind == 2:
            return _backward_data_cuda(grad_y, w, *args)
        if kind == 1:
            return _backward_data_cpu(grad_y, w, *args)
    else:   # _needs(grad_y, w)
        if _functorch():
            _under_transform("conv_backward_data")
        return _BwdDataFn.apply(keyset, grad_y, w, _Conf(args))
    return _run_below_autograd(_bwd_data_op, _backward_data_cpu, _backward_data_cuda, keyset, (grad_y, w) + args)


@_guard.applies_function
def _backward_weights_autograd(keyset, x, grad_y, *args):
    if (not _grad_enabled() or not (x.requires_grad or grad_y.requires_grad)) and _fwad._current_level < 0:
        kind = _KEYSETS.get(keyset.raw_repr())
        if kind == 2:
            return _backward_weights_cuda(x, grad_y, *args)
        if kind == 1:
            return _backward_weights_cpu(x, grad_y, *args)
    else:   # _needs(x, grad_y)
        if _functorch():
            _under_transform("conv_backward_weights")
        return _BwdWeightsFn.apply(keyset, x, grad_y, _Conf(args))
    return _run_below_autograd(_bwd_weights_op, _backward_weights_cpu, _backward_weights_cuda, keyset,
                               (x, grad_y) + args)


_lib.impl("conv_forward", _forward_autograd, "Autograd", with_keyset=True)
_lib.impl("conv_backward_data", _backward_data_autograd, "Autograd", with_keyset=True)
_lib.impl("conv_backward_weights", _backward_weights_autograd, "Autograd", with_keyset=True)
for _name in ("conv_forward", "conv_backward_data", "conv_backward_weights"):   # torch's rule for convolutions
    _autocast.register(_lib, _name)


def _register_flop_formulas() -> None:
    """torch.utils.flop_counter.FlopCounterMode counts rawconv's operators as torch's convolutions
    (multiply-adds x 2, bias ignored, torch's ``conv_flop_count``): conv_forward as the forward
    convolution, conv_backward_data and conv_backward_weights each as the convolution they
    differentiate (what torch counts for grad_input and grad_weight)."""
    try:
        from torch.utils.flop_counter import conv_flop_count, register_flop_formula
    except ImportError:   # (a torch without the flop counter's registry)
        return

    def batched(shape, w_shape):
        shape = list(shape)
        return [1] + shape if len(shape) == len(w_shape) - 1 else shape

    @register_flop_formula(torch.ops.rawconv.conv_forward)
    def _forward_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
        return conv_flop_count(batched(x_shape, w_shape), list(w_shape), batched(out_shape, w_shape))

    @register_flop_formula(torch.ops.rawconv.conv_backward_data)
    def _backward_data_flops(gy_shape, w_shape, x_shape, *args, out_shape=None, **kwargs) -> int:
        return conv_flop_count(batched(x_shape, w_shape), list(w_shape), batched(gy_shape, w_shape))

    @register_flop_formula(torch.ops.rawconv.conv_backward_weights)
    def _backward_weights_flops(x_shape, gy_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
        return conv_flop_count(batched(x_shape, w_shape), list(w_shape), batched(gy_shape, w_shape))


_register_flop_formulas()


# ---------------------------------------------------------------------------- the friendly API
def _choice_name(c: Any, what: str) -> str:
    """A choice as the operators take it: None -> "", a string as is, a listed candidate by its name."""
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, onednn.Implementation):
        return f"{c.name}@{c.layouts}"
    name = getattr(c, "choice", None)   # cuDNN Algorithm / EngineConfig rows (rawconv's Candidate)
    if isinstance(name, str):
        return name
    hint = ""
    if isinstance(c, int) and not isinstance(c, bool):
        hint = ("; positions are indices into one problem's listing and are accepted only by the backend "
                "function forms (rawconv.onednn.forward(x, w, impl=0), rawconv.cudnn.forward(..., algo=0)): "
                "pass the listed row or its name")
    raise ArgumentTypeError(f"{what} must be None, a name string or a listed candidate (Implementation, "
                            f"Algorithm, EngineConfig), got {type(c).__name__}{hint}")


#: the library directions a :class:`TrainingChoice` (or a dict ``choice``) names, and their other spellings
DIRECTIONS = ("forward", "backward_data", "backward_weights")
_DIRECTION_KEYS = {"forward": "forward", "backward_data": "backward_data", "backward_weights": "backward_weights",
                   "backward_filter": "backward_weights"}


@dataclass(frozen=True)
class TrainingChoice:
    """One convolution's three library calls pinned together, a training step: ``forward``,
    ``backward_data`` (the input's gradient) and ``backward_weights`` (the weight's and the
    bias's), each a choice as ``choice=`` takes it (a name such as ``"x64:gemm:jit@any"``, a listed
    candidate, or None: the library's first choice for that direction). Pass it (or the same as a
    dict, e.g. what :func:`selected` returns) as ``choice`` to :func:`conv`,
    :func:`rawconv.nn.conv` or a ``rawconv.nn`` module: every call then runs exactly those three.
    Directions are the library's: a transposed convolution's forward is its matching
    convolution's ``backward_data``, its input's gradient a ``forward``."""

    forward: Any = None
    backward_data: Any = None
    backward_weights: Any = None

    @classmethod
    def of(cls, value: Any) -> "TrainingChoice":
        """``value`` (a TrainingChoice, a dict per direction, or an object whose ``directions`` is
        one: :class:`rawconv.nn.TunedChoice`) as a TrainingChoice. Raises
        :class:`~rawconv.errors.ArgumentError` for an unknown direction key, naming the known
        ones, and :class:`~rawconv.errors.ArgumentTypeError` for anything else."""
        if isinstance(value, cls):
            return value
        d = value if isinstance(value, dict) else getattr(value, "directions", None)
        if not isinstance(d, dict):
            raise ArgumentTypeError(f"a training step's choice must be a TrainingChoice or a dict per direction "
                                    f"{{'forward': .., 'backward_data': .., 'backward_weights': ..}}, got "
                                    f"{type(value).__name__}")
        bad = [k for k in d if k not in _DIRECTION_KEYS]
        if bad:
            raise ArgumentError(f"unknown direction(s) {bad} in a training step's choice; known: "
                                f"{', '.join(DIRECTIONS)} (backward_filter: backward_weights)")
        out = {}
        for k, v in d.items():
            key = _DIRECTION_KEYS[k]
            if key in out and out[key] is not None and v is not None and out[key] != v:
                raise ArgumentError(f"the training step's choice names {key} twice ({out[key]!r} and {v!r})")
            out[key] = v if v is not None else out.get(key)
        return cls(**out)

    def as_dict(self) -> dict:
        """``{"forward": .., "backward_data": .., "backward_weights": ..}`` (choices as given)."""
        return {"forward": self.forward, "backward_data": self.backward_data, "backward_weights": self.backward_weights}


def _is_step(choice: Any) -> bool:
    """Whether ``choice`` pins a training step (a :class:`TrainingChoice`, a dict, or an object
    with a ``directions`` dict) rather than one direction."""
    return isinstance(choice, (TrainingChoice, dict)) or isinstance(getattr(choice, "directions", None), dict)


def split_choice(choice: Any, backward_choice: Any = None, *, transposed: bool = False) -> tuple[Any, Any]:
    """``(forward choice, backward_choice)`` as the operators and modules keep them, from a
    ``choice`` that may pin the whole training step (:class:`TrainingChoice`, a dict per
    direction): the forward's, and ``(backward-data choice, backward-weights choice)`` (None
    when neither is pinned). ``transposed``: for a transposed convolution, whose forward is the
    library's backward_data and whose input gradient its forward. Any other ``choice`` comes back
    as it is, with ``backward_choice``. Raises :class:`~rawconv.errors.ArgumentError` when both
    ``choice`` (a training step) and ``backward_choice`` pin the backward passes."""
    if not _is_step(choice):
        return choice, backward_choice
    step = TrainingChoice.of(choice)
    if backward_choice is not None:
        raise ArgumentError("choice pins the whole training step (forward and both backward passes); pass the "
                            f"backward choices there, not also backward_choice={backward_choice!r}")
    if transposed:
        fwd, data = step.backward_data, step.forward
    else:
        fwd, data = step.forward, step.backward_data
    bwd = None if data is None and step.backward_weights is None else (data, step.backward_weights)
    return fwd, bwd


def _backward_choices(backward_choice: Any) -> tuple[str, str]:
    if isinstance(backward_choice, (tuple, list)):
        if len(backward_choice) != 2:
            raise ArgumentError(f"backward_choice must be one choice or a (data, weights) pair, got {backward_choice!r}")
        return (_choice_name(backward_choice[0], "backward_choice[0]"),
                _choice_name(backward_choice[1], "backward_choice[1]"))
    c = _choice_name(backward_choice, "backward_choice")
    return c, c


def _conv_args(kernel: Sequence[int], stride, padding, dilation, groups):
    """Torch-style arguments as the operators' lists: (stride, pad_before, pad_after, dilation, groups)."""
    nd = len(kernel)
    if nd not in (1, 2, 3):
        raise ArgumentError(f"weight must be 3-D, 4-D or 5-D (K, C/groups, *kernel), got {nd + 2}-D")
    s = tuple_arg(stride, nd, "stride", 1)
    d = tuple_arg(dilation, nd, "dilation", 1)
    if isinstance(padding, list):
        padding = tuple(tuple(p) if isinstance(p, list) else p for p in padding)
    pb, pa = resolve_padding(padding, nd, tuple(kernel), d, s)
    g = int_arg(groups)
    if g is None or g < 1:
        raise ArgumentError(f"groups must be a positive int, got {groups!r}")
    return list(s), list(pb), list(pa), list(d), g


_key = arg_key


_conv_cache = PlanCache(512)
_grad_enabled = torch.is_grad_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_mode = torch._C._is_torch_function_mode_enabled
_functorch = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
_tracing = torch._C._get_tracing_state
_PLAIN = (torch.Tensor, torch.nn.Parameter)
# a legacy vmap's BatchedTensor (torch.autograd.grad(..., is_grads_batched=True), autograd.functional's
# vectorize=True, torch._vmap_internals._vmap) has no storage: only the dispatcher (its batched
# fallback) runs an operator on one
_legacy_batched = getattr(torch._C._functorch, "is_legacy_batchedtensor", lambda t: False)
_compiling = torch.compiler.is_compiling
_autocasting = torch._C._is_any_autocast_enabled


def _plain(x, w, bias) -> bool:
    """True when calling the kernel (or the autograd Function) directly is exactly what the operator
    would do, once autocast's casts are made (:func:`_autocast_inputs`): no dispatch or function
    mode, no functorch transform, no tracer, plain tensors (not a legacy vmap's batched ones)."""
    return (type(x) in _PLAIN and type(w) in _PLAIN and (bias is None or type(bias) in _PLAIN)
            and not _dispatch_modes() and not _function_mode() and not _functorch() and _tracing() is None
            and not _legacy_batched(x) and not _legacy_batched(w) and (bias is None or not _legacy_batched(bias)))


def _autocast_inputs(name, x, w, bias):
    """``(x, w, bias)`` as the operator ``rawconv::name``'s autocast kernel passes them on (cast to
    the autocast dtype when autocast is on for x's device; see :mod:`rawconv.pytorch.autocast`)."""
    dev = x.device.type
    if dev in ("cpu", "cuda") and torch.is_autocast_enabled(dev):
        return _autocast.cast_inputs(name, dev, (x, w, bias))
    return x, w, bias


def _plain_backward() -> bool:
    """True when an autograd Function's backward may call the kernels directly: no graph of the
    backward recorded (``create_graph``), no dispatch or function mode, no functorch transform, no
    tracer (the gradients then need no dispatcher: convolution backward has no autocast rule)."""
    return (not _grad_enabled() and not _dispatch_modes() and not _function_mode() and not _functorch()
            and _tracing() is None and _fwad._current_level < 0)


def _prepare_conv(x, w, bias, stride, padding, dilation, groups, backend, choice, precision, backward_choice):
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ArgumentTypeError(f"x and w must be torch.Tensor, got {type(x).__name__} and {type(w).__name__}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise ArgumentTypeError(f"bias must be None or a torch.Tensor, got {type(bias).__name__}")
    args = _conv_args(tuple(w.shape[2:]), stride, padding, dilation, groups)
    c = _choice_name(choice, "choice")
    bd, bw = _backward_choices(backward_choice)
    _check_strings(backend, c, precision, x.device.type, bd, bw)
    return list(args) + [backend, c, precision, bd, bw]


def _new_entry(args) -> list:
    """An argument pack of :func:`_conv_entry`: [the operators' argument list, the CPU plan of the
    last call, the CUDA forward plan of the last call, the arguments as the autograd Function's
    :class:`_Conf`, the CUDA backward-data plan and backward-weights plan of the last backward,
    the CPU backward plans of the last backward as ``[key, data plan, weights plan]``, the CUDA
    plans' key]. A key is x's shape and strides, w's strides and whether the call had a bias (the
    layout torch gives the gradients follows x and w, while a backward plan's pack checks only
    the tensors it reads: grad_y and w, or x and grad_y; one pack serves calls with and without a
    bias), on the CPU also the thread (a backward runs in the thread that called it, which may
    not be the forward's)."""
    return [args, None, None, _Conf(args), None, None, None, None]


@_guard.applies_function
def _conv_entry(x, w, bias, entry):
    """:func:`conv` once its arguments are checked: ``entry`` from :func:`_new_entry` (the plans
    filled here). Runs the kernel (or the autograd Function, given the entry) directly when that
    is exactly what the operator would do (:func:`_plain`; under autocast, on the inputs its kernel
    would cast), else the operator. For the modules too, which keep an entry of their own."""
    args = entry[0]
    if _plain(x, w, bias):
        if _autocasting():
            x, w, bias = _autocast_inputs("conv_forward", x, w, bias)
        if x.is_cpu:
            plan = entry[1]
            if plan is None:
                plan = entry[1] = _forward_cpu_plan(x, w, bias, *args)
            if _needs(x, w, bias):   # what the operator's Autograd kernel does, without the dispatcher
                return _FwdFn.apply(entry, x, w, bias, entry[3])
            y = plan._hot_run(x, w, bias, None)
            if y is not None:
                return y
            plan = entry[1] = _forward_cpu_plan(x, w, bias, *args)
            return plan.execute(x, w, bias)
        if x.is_cuda:
            if _needs(x, w, bias):
                return _FwdFn.apply(entry, x, w, bias, entry[3])
            plan = entry[2]   # the CUDA plan of the last call with these arguments (its hot pack checks the tensors)
            if plan is not None:
                y = plan._hot_forward(x, w, bias)
                if y is not None:
                    return y
            y, entry[2] = _forward_cuda_checked(x, w, bias, *args)
            return y
    return _fwd_call(x, w, bias, *args)


def _direct_backward(ctx, gy):
    """:class:`RawconvConvForward`'s backward for a call of :func:`_conv_entry`'s direct path when
    nothing needs the dispatcher (:func:`_plain_backward`): the backward kernels called directly,
    the entry (``ctx.entry``) keeping the backward plans of its last backward with x and w in the
    same layout (their hot paths check the tensors, as the forward's, on the incoming gradient as
    it is; a gradient that does not fit is made dense in torch's layout for x and w first and
    takes the checked path). Returns the Function's gradients."""
    x, w = ctx.saved_tensors
    e = ctx.entry
    (stride, pb, pa, dil, groups, backend, _choice, precision, bdc, bwc), has_bias = ctx.conf
    _, nx, nw, nb = ctx.needs_input_grad[:4]
    gx = gw = gb = g = None
    wants_w = nw or (has_bias and nb)
    lk = (x.shape, x.stride(), w.stride(), has_bias)
    if x.is_cuda:
        if e[7] != lk:   # plans kept for x and w in another layout: their gradients' layout differs
            e[4] = e[5] = None
            e[7] = lk
        if nx:
            p = e[4]
            gx = None if p is None else p._hot_call(gy, w, None)
            if gx is None:
                g = _grad_like(gy, x, x.dim() == w.dim() - 1, w=w)
                gx, e[4] = _backward_data_cuda_checked(g, w, list(x.shape), stride, pb, pa, dil, groups, backend,
                                                       bdc, precision)
        if wants_w:
            p = e[5]
            gw = None if p is None else p._hot_call(x, gy, None)
            if gw is not None:
                gb = _bias_grad_of(gy) if has_bias else None
            else:
                if g is None:
                    g = _grad_like(gy, x, x.dim() == w.dim() - 1, w=w)
                gw, gb, e[5] = _backward_weights_cuda_checked(x, g, list(w.shape), stride, pb, pa, dil, groups,
                                                              has_bias, backend, bwc, precision)
    else:   # the same on the CPU: the plans of this thread's last backward, their hot paths first
        k = (_get_ident(), lk)
        c = e[6]
        if c is None or c[0] != k:
            c = e[6] = [k, None, None]
        if nx:
            p = c[1]
            gx = None if p is None else p._grad_hot_run(gy, w)
            if gx is None:
                g = _grad_like(gy, x, x.dim() == w.dim() - 1, w=w)
                p = c[1] = _backward_data_cpu_plan(g, w, list(x.shape), stride, pb, pa, dil, groups, backend, bdc,
                                                   precision)
                gx = _data_result(p, g, w)
        if wants_w:
            p, gg = c[2], gy
            res = None if p is None else p._grad_hot_run(x, gy)
            if res is None:
                if g is None:
                    g = _grad_like(gy, x, x.dim() == w.dim() - 1, w=w)
                p = c[2] = _backward_weights_cpu_plan(x, g, list(w.shape), stride, pb, pa, dil, groups, has_bias,
                                                      backend, bwc, precision)
                gg, res = g, p._grad_hot_run(x, g)
            gw, gb = _weights_result(p, x, gg, has_bias, res, empty_db=False)
    gx, gw = _grads_of_forward_layout(gx, gw if nw else None, x, w)
    return None, gx, gw, (gb if has_bias and nb else None), None


def conv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1, padding: Any = 0,
         dilation: Any = 1, groups: int = 1, *, backend: str = "auto", choice: Any = None, precision: str = "strict",
         backward_choice: Any = None) -> torch.Tensor:
    """``torch.nn.functional.conv{1,2,3}d`` on rawconv's operator ``rawconv::conv_forward``, differentiable.

    ``x``: (N, C, *spatial) or unbatched (C, *spatial); ``w``: (K, C/groups, *kernel); ``bias``:
    (K,) or None; same dtype and device (CPU: oneDNN, CUDA: cuDNN). ``padding``: as torch (int,
    tuple, ``"same"``, ``"valid"``) or one ``(before, after)`` pair per spatial dim. ``backend``:
    ``"auto"``, ``"onednn"``, ``"cudnn"``, ``"cudnn_graph"``. ``choice``: None (the library's first
    choice) or a candidate's name (see the module notes) or a listed candidate
    (:class:`rawconv.onednn.Implementation`, cuDNN ``Algorithm`` / ``EngineConfig``).
    ``choice`` may also pin the whole training step: a :class:`TrainingChoice` or a dict
    ``{"forward": .., "backward_data": .., "backward_weights": ..}`` (what :func:`selected`
    returns), which then gives the backward passes' choices too.
    ``precision``: ``"strict"``, ``"tf32"``, ``"bf16"``, ``"f16"``, ``"any"``.
    ``backward_choice``: what the backward passes run: None (each library's first choice), one
    name for both, or a ``(data, weights)`` pair. Returns y (N, K, *out) in torch's memory format for it
    (channels_last when x or w is; see the module notes); x may have zero channels (y is then the bias).

    Raises :class:`~rawconv.errors.ArgumentError` / :class:`~rawconv.errors.ArgumentTypeError`
    for bad input before any library call, :class:`~rawconv.errors.NotSupportedError` for a
    choice the library does not offer (naming those it does). When no autograd graph is recorded
    and no tracer, mode or transform is active, the kernel runs without the dispatcher (same
    result, less host time). Wraps ``dnnl_primitive_execute`` / cuDNN's convolution calls.
    """
    try:   # rawconv._guard.public's translation, inline (one frame less on the hot path)
        if choice is not None and type(choice) is not str and _is_step(choice):   # a pinned training step
            choice, backward_choice = split_choice(choice, backward_choice)
        if _compiling():   # dynamo traces the operator (its fake kernel gives the shapes)
            return _fwd_op(x, w, bias, *_prepare_conv(x, w, bias, stride, padding, dilation, groups, backend, choice,
                                                      precision, backward_choice))
        try:   # the arguments' pack (and the last CPU plan used with it) by the arguments alone
            key = (w.shape, stride if type(stride) is int else _key(stride),
                   padding if type(padding) is int else _key(padding), dilation if type(dilation) is int else _key(dilation),
                   groups if type(groups) is int else _key(groups), backend,
                   choice if choice is None or type(choice) is str else _key(choice), precision,
                   backward_choice if backward_choice is None or type(backward_choice) is str else _key(backward_choice),
                   _get_ident())
            entry = _conv_cache.get(key)
        except Exception:   # noqa: BLE001  (unhashable or not tensors: the slow path says what is wrong)
            key = entry = None
        if entry is None:
            entry = _new_entry(_prepare_conv(x, w, bias, stride, padding, dilation, groups, backend, choice,
                                             precision, backward_choice))
            if key is not None:
                _conv_cache.put(key, entry)
        if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor) or \
                (bias is not None and not isinstance(bias, torch.Tensor)):   # the clear error
            _prepare_conv(x, w, bias, stride, padding, dilation, groups, backend, choice, precision, backward_choice)
        return _conv_entry(x, w, bias, entry)
    except Exception as exc:
        new = _guard.translate(exc, "rawconv.ops.conv")
        if new is None:
            raise
        raise new from exc


conv.__rawconv_public__ = True


def conv_backward_data(grad_y: torch.Tensor, w: torch.Tensor, x_shape: Sequence[int], stride: Any = 1,
                       padding: Any = 0, dilation: Any = 1, groups: int = 1, *, backend: str = "auto",
                       choice: Any = None, precision: str = "strict") -> torch.Tensor:
    """Gradient of :func:`conv` with respect to x, on ``rawconv::conv_backward_data`` (differentiable).

    ``grad_y``: (N, K, *out); ``w``: (K, C/groups, *kernel); ``x_shape``: the forward input's shape
    (N, C, *spatial) or unbatched (C, *spatial). Other arguments as :func:`conv` (``choice`` names a
    backward-data candidate). Returns dx of ``x_shape``, channels_last when grad_y or w is (see the
    module notes). Raises as :func:`conv`.
    """
    if not isinstance(grad_y, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ArgumentTypeError("grad_y and w must be torch.Tensor")
    x_shape = shape_arg(x_shape, "x_shape", (w.dim() - 1, w.dim()))
    s, pb, pa, d, g = _conv_args(tuple(w.shape[2:]), stride, padding, dilation, groups)
    c = _choice_name(choice, "choice")
    _check_strings(backend, c, precision, grad_y.device.type)
    return _bwd_data_call(grad_y, w, list(x_shape), s, pb, pa, d, g, backend, c, precision)


class RawconvConvTranspose(torch.autograd.Function):
    """:func:`conv_transpose` with pinned backward choices: y = conv_backward_data(x, w) (``choice``);
    dx = conv_forward(gy, w) (``backward_choice[0]``), dw = conv_backward_weights(gy, x)
    (``backward_choice[1]``), both differentiable in turn."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, w, conf):
        return _bwd_data_op(x, w, *conf.args[0])

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, conf = inputs
        ctx.save_for_backward(x, w)
        ctx.save_for_forward(x, w)
        ctx.conf = conf.args

    @staticmethod
    @_no_autocast
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        (_core, stride, pb, pa, dil, groups, backend, _choice, precision), fwd_choice, wts_choice = ctx.conf
        gy = _grad_like(gy, x, x.dim() == w.dim() - 1, w=w)
        gx = gw = None
        if ctx.needs_input_grad[0]:
            gx = _fwd_call(gy, w, None, stride, pb, pa, dil, groups, backend, fwd_choice, precision, "", "")
        if ctx.needs_input_grad[1]:
            gw = _bwd_weights_call(gy, x, list(w.shape), stride, pb, pa, dil, groups, False, backend, wts_choice,
                                 precision)[0]
        gx, gw = _grads_of_forward_layout(gx, gw, x, w)   # 1-D, unbatched, empty batch: torch's layouts
        return gx, gw, None


_TransposeFn = _classic(RawconvConvTranspose)


class _ConvTransposeJvp(RawconvConvTranspose):
    """:class:`RawconvConvTranspose` with its forward-mode derivative, applied under forward AD or a
    torch.func transform (dynamo traces no Function that defines a jvp, nor the below-autograd guard:
    compiled code uses the base)."""

    @staticmethod
    def forward(x, w, conf):
        with _below_autograd():   # under a transform the operator's own Autograd kernel must not run again
            return _bwd_data_op(x, w, *conf.args[0])

    @staticmethod
    def jvp(ctx, x_t, w_t, _conf_t):
        x, w = ctx.saved_tensors
        args = ctx.conf[0]
        t = None if x_t is None else _bwd_data_call(x_t, w, *args)
        return _add(t, None if w_t is None else _bwd_data_call(x, w_t, *args))


@_guard.applies_function
def conv_transpose(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
                   padding: Any = 0, output_padding: Any = 0, groups: int = 1, dilation: Any = 1, *,
                   backend: str = "auto", choice: Any = None, precision: str = "strict",
                   backward_choice: Any = None) -> torch.Tensor:
    """``torch.nn.functional.conv_transpose{1,2,3}d`` (same argument order) on ``rawconv::conv_backward_data``
    (the backward data of the matching convolution), differentiable to any order.

    ``x``: (N, C_in, *spatial) or unbatched; ``w``: (C_in, C_out/groups, *kernel); ``bias``:
    (C_out,) or None; ``output_padding`` < max(stride, dilation) per dim, as torch. ``choice``: a
    backward-data candidate; ``backward_choice``: what the gradients run: None (the library's first
    choices), one name for both, or a ``(forward choice for dx, backward-weights choice for dw)``
    pair; or ``choice`` pins the whole training step (:class:`TrainingChoice` / a dict per library
    direction: ``backward_data`` is this call's, ``forward`` its input gradient's). Returns y
    (N, C_out, *out) in torch's memory format (channels_last when x or w is). Traced by ``torch.compile`` (the
    operators' fake kernels). Raises :class:`~rawconv.errors.ArgumentError` /
    :class:`~rawconv.errors.ArgumentTypeError` before any library call for bad input,
    :class:`~rawconv.errors.NotSupportedError` for a choice the library does not offer, and under
    ``torch.jit.trace`` (see below).

    ``torch.jit.trace`` cannot record it: the operator takes the output's shape as a ``SymInt[]``
    argument, which the tracer receives as traced sizes and does not handle (torch's own
    assertion fails inside it); :class:`~rawconv.errors.NotSupportedError` says so before any
    call. ``torch.compile`` and ``torch.export`` trace it (the operators' fake kernels).
    """
    choice, backward_choice = split_choice(choice, backward_choice, transposed=True)
    if _tracing() is not None:
        raise NotSupportedError("torch.jit.trace cannot record rawconv's transposed convolution "
                                "(rawconv.ops.conv_transpose, rawconv.nn.ConvTranspose1d/2d/3d): its operator "
                                "rawconv::conv_backward_data takes the output shape as a SymInt[] argument, which "
                                "TorchScript's tracer does not handle; use torch.compile or torch.export, which "
                                "trace it, or keep torch's ConvTranspose modules in a model you jit.trace")
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ArgumentTypeError(f"x and w must be torch.Tensor, got {type(x).__name__} and {type(w).__name__}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise ArgumentTypeError(f"bias must be None or a torch.Tensor, got {type(bias).__name__}")
    if w.dim() not in (3, 4, 5):
        raise ArgumentError(f"weight must be 3-D, 4-D or 5-D (C_in, C_out/groups, *kernel), got {tuple(w.shape)}")
    if isinstance(padding, str):
        raise ArgumentError(f"a transposed convolution takes numeric padding (as torch), got {padding!r}")
    if _autocasting():
        # as autocast casts the operator's inputs, before the checks and the bias add below (torch casts the bias too)
        x, w, bias = _autocast_inputs("conv_backward_data", x, w, bias)
    nd = w.dim() - 2
    unbatched = x.dim() == nd + 1
    xb = _batched(x, unbatched)
    y_shape, core, s, pb, pa, d, g = transposed_shapes(tuple(xb.shape), tuple(w.shape), stride, padding,
                                                       output_padding, dilation, groups)
    if bias is not None and (tuple(bias.shape) != (y_shape[1],) or bias.dtype != x.dtype or bias.device != x.device):
        raise ArgumentError(f"bias must be a ({y_shape[1]},) tensor of the input's dtype and device, got "
                            f"{tuple(bias.shape)} {bias.dtype} on {bias.device}")
    c = _choice_name(choice, "choice")
    fc, wc = _backward_choices(backward_choice)
    _check_strings(backend, c, precision, x.device.type, fc, wc)
    args = (list(core[1:]) if unbatched else list(core), list(s), list(pb), list(pa), list(d), g, backend, c,
            precision)
    if (fc or wc) and _needs(x, w):
        fn = _ConvTransposeJvp if _fwad._current_level >= 0 or _functorch() else _TransposeFn
        y = fn.apply(x, w, _Conf((args, fc, wc)))
    elif x.is_cpu and not _compiling() and _plain(x, w, bias) and not _needs(x, w):
        y = _backward_data_cpu(x, w, *args)   # the kernel the dispatcher would call (less host time)
    else:
        y = _bwd_data_call(x, w, *args)
    lay = conv_layout(xb, w)   # torch's memory format (x or w channels last; for 1-D, w alone)
    empty = xb.shape[0] == 0   # an empty batch: torch's Empty backend gives a contiguous y (nothing to copy)
    if core == y_shape and bias is None and not empty:
        if w.dim() != 3 or layout_of(_batched(y, unbatched)) == lay:   # 1-D: backward data followed x too
            return y
    if core != y_shape:   # output padding past stride - 1 that no kernel tap reaches: zeros
        pad = []
        for o, k in reversed(list(zip(y_shape[2:], core[2:]))):
            pad += [0, o - k]
        y = torch.nn.functional.pad(y, pad)
    if bias is not None:
        y = y + bias.view(*([-1] if unbatched else [1, -1]), *([1] * nd))
    y = to_layout(_batched(y, unbatched), lay)
    if empty:
        return y.clone(memory_format=torch.contiguous_format)
    return y.squeeze(0) if unbatched else y


def conv_backward_weights(x: torch.Tensor, grad_y: torch.Tensor, w_shape: Sequence[int], stride: Any = 1,
                          padding: Any = 0, dilation: Any = 1, groups: int = 1, *, bias: bool = False,
                          backend: str = "auto", choice: Any = None, precision: str = "strict"):
    """Gradient of :func:`conv` with respect to w (and the bias), on ``rawconv::conv_backward_weights``
    (differentiable).

    ``x``: (N, C, *spatial) or unbatched; ``grad_y``: (N, K, *out); ``w_shape``: (K, C/groups,
    *kernel). Returns dw (channels_last when x or grad_y is), or ``(dw, db)`` with ``bias=True`` (db: (K,)).
    Other arguments as :func:`conv` (``choice`` names a backward-weights candidate). Raises as :func:`conv`.
    """
    if not isinstance(x, torch.Tensor) or not isinstance(grad_y, torch.Tensor):
        raise ArgumentTypeError("x and grad_y must be torch.Tensor")
    if not isinstance(bias, bool):
        raise ArgumentTypeError(f"bias must be True or False (whether to return db), got {type(bias).__name__}")
    w_shape = shape_arg(w_shape, "w_shape", (3, 4, 5))
    s, pb, pa, d, g = _conv_args(tuple(w_shape[2:]), stride, padding, dilation, groups)
    c = _choice_name(choice, "choice")
    _check_strings(backend, c, precision, x.device.type)
    dw, db = _bwd_weights_call(x, grad_y, list(w_shape), s, pb, pa, d, g, bias, backend, c, precision)
    return (dw, db) if bias else dw


def selected(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
             padding: Any = 0, dilation: Any = 1, groups: int = 1, *, backend: str = "auto", choice: Any = None,
             precision: str = "strict", backward_choice: Any = None) -> dict:
    """What :func:`conv` with these arguments runs in a training step, per direction (CPU
    tensors, oneDNN): ``{"forward": name, "backward_data": name, "backward_weights": name}``, each
    the implementation's one name (``"jit:avx512_core@any"``: oneDNN's implementation name and its
    layouts, what ``choice=`` takes and every table shows). Pass the dict back as ``choice`` to
    pin all three. Builds the plans (no convolution is run). Raises as :func:`conv`;
    :class:`~rawconv.errors.NotSupportedError` for CUDA tensors (cuDNN picks at the first call)."""
    choice, backward_choice = split_choice(choice, backward_choice)
    args = _prepare_conv(x, w, bias, stride, padding, dilation, groups, backend, choice, precision,
                         backward_choice)
    s, pb, pa, d, g, _backend, c, prec, bd, bw = args
    if x.device.type != "cpu":
        raise NotSupportedError("selected() reports oneDNN's choices (CPU tensors); cuDNN chooses at the first call "
                                "(see rawconv.cudnn.Convolution.info)")
    x, w = x.detach(), w.detach()
    problem = ConvProblem.from_torch(x, w, bias, s, _padding(pb, pa), d, g)
    fwd = onednn.cached_plan(problem, "forward", "direct", prec, onednn.weights_layout(w), _onednn_choice(c)).selected
    y = empty_like_layout(problem.y_shape, problem.layout, x.dtype, "cpu")
    y = y.squeeze(0) if problem.unbatched else y
    data = _backward_data_plan(y, w, tuple(x.shape), s, pb, pa, d, g, bd, prec).selected
    wp = _backward_weights_problem(x, y, tuple(w.shape), s, pb, pa, d, g, bias is not None)
    wts = onednn.cached_plan(wp, "backward_weights", "direct", prec, wp.layout, _onednn_choice(bw)).selected
    return {"forward": fwd.choice, "backward_data": data.choice, "backward_weights": wts.choice}


def clear_cache() -> None:
    """Drop the operators' cached plans and argument packs (rawconv.onednn's plans stay cached there)."""
    _cpu_cache.clear()
    _cpu_last.clear()
    _conv_cache.clear()
    _cuda_last.clear()


# ---------------------------------------------------------------------------- the function forms' autograd
# rawconv.onednn / rawconv.cudnn / rawconv.cudnn_graph's function forms, given tensors that require
# grad with grad mode on, come here: they record the differentiable operator (never a silent detach),
# or raise for what an operator cannot express (out=, a fused activation, ...), as torch's out= does.
def _refuse(fn: str, **options) -> None:
    for name, (value, default) in options.items():
        if value is not default and (isinstance(value, torch.Tensor) or value != default):
            shown = "a tensor" if isinstance(value, torch.Tensor) else repr(value)
            raise ArgumentError(
                f"{fn}(..., {name}={shown}) is not differentiable, and an argument requires grad: rawconv's "
                f"operators record autograd without {name} (as torch's out= functions refuse autograd); call it "
                f"under torch.no_grad(), on detached tensors, or without {name}")


def _onednn_impl_choice(plan_fn, impl) -> str:
    if impl is None:
        return ""
    if isinstance(impl, (str, onednn.Implementation)):
        return _choice_name(impl, "impl")
    plan = plan_fn()   # an int position: the implementation the no-grad path would run, by its name
    return _choice_name(plan.implementations[plan._resolve(impl)], "impl")


def _onednn_function(direction: str, a, b, c, stride, padding, dilation, groups, *, impl, algorithm, fpmath,
                     out=None, bias=False, allow_known_bad=False):
    """rawconv.onednn.{forward, backward_data, backward_weights} on tensors that require grad (the
    operators never run a known-bad implementation: rawconv.known_bad's check applies)."""
    _refuse(f"rawconv.onednn.{direction}", out=(out, None), algorithm=(algorithm, "direct"),
            allow_known_bad=(allow_known_bad, False))
    onednn.check_fpmath(fpmath)
    if direction == "forward":
        def plan_fn():
            p = ConvProblem.from_torch(a, b, c, stride, padding, dilation, groups)
            return onednn.cached_plan(p, "forward", "direct", fpmath, onednn.weights_layout(b), None)
        return conv(a, b, c, stride, padding, dilation, groups, backend="onednn",
                    choice=_onednn_impl_choice(plan_fn, impl), precision=fpmath)
    if direction == "backward_data":
        def plan_fn():
            p = onednn.backward_data_problem(a, b, c, stride, padding, dilation, groups, False)
            return onednn.cached_plan(p, "backward_data", "direct", fpmath, onednn.weights_layout(b), None)
        return conv_backward_data(a, b, c, stride, padding, dilation, groups, backend="onednn",
                                  choice=_onednn_impl_choice(plan_fn, impl), precision=fpmath)

    def plan_fn():
        s, pb, pa, d, g = _conv_args(tuple(c[2:]), stride, padding, dilation, groups)
        p = _backward_weights_problem(a, b, c, s, pb, pa, d, g, bias)
        return onednn.cached_plan(p, "backward_weights", "direct", fpmath, "nchw", None)
    res = conv_backward_weights(a, b, c, stride, padding, dilation, groups, bias=bias, backend="onednn",
                                choice=_onednn_impl_choice(plan_fn, impl), precision=fpmath)
    # rawconv.onednn.backward_weights returns a contiguous dw (the operator gives torch's layout)
    return (res[0].contiguous(), res[1]) if bias else res.contiguous()


_PRECISION_OF_MATH = {None: "strict", "fma": "strict", "tensor_op": "tf32", "tensor_op_allow_conversion": "bf16",
                      "default": "any"}


def _cudnn_choice(direction: str, algo, choice, math, precision, engine) -> tuple[str, str, str]:
    """(backend, choice, precision) for the operators from rawconv.cudnn's keywords."""
    from .. import cudnn

    algo, math, engine = cudnn.normalize_choice(direction, algo, choice, math, precision, engine)
    if engine is not None:
        name = engine if isinstance(engine, str) else (f"eng{engine}" if isinstance(engine, int) else engine.name)
        return "cudnn_graph", name, _PRECISION_OF_MATH.get(math, "strict")
    if algo is None:
        return "cudnn", ("@" + math) if math else "", "strict"
    name = algo if isinstance(algo, str) else cudnn.ALGOS[canonical(direction)][cudnn.resolve_algo(direction, algo)]
    return "cudnn", name + (("@" + math) if math else ""), "strict"


def canonical(direction: str) -> str:
    from ..core.backend import canonical_direction

    return canonical_direction(direction)


def _cudnn_function(direction: str, a, b, c, stride, padding, dilation, groups, *, algo, math, deterministic,
                    workspace_limit, out, engine, return_info, choice, precision, activation=None, w_layout=None):
    """rawconv.cudnn.{forward, backward_data, backward_weights} on tensors that require grad."""
    _refuse(f"rawconv.cudnn.{direction}", out=(out, None), return_info=(return_info, False),
            activation=(activation, None), deterministic=(deterministic, False),
            workspace_limit=(workspace_limit, None))
    backend, ch, prec = _cudnn_choice(direction, algo, choice, math, precision, engine)
    if direction == "forward":
        return conv(a, b, c, stride, padding, dilation, groups, backend=backend, choice=ch, precision=prec)
    if direction == "backward_data":
        return conv_backward_data(a, b, c, stride, padding, dilation, groups, backend=backend, choice=ch,
                                  precision=prec)
    dw = conv_backward_weights(a, b, c, stride, padding, dilation, groups, backend=backend, choice=ch, precision=prec)
    if w_layout is not None and w_layout != _layout(_batched(a, a.dim() == len(c) - 1)):
        dw = to_layout(dw, w_layout)
    return dw


def _graph_function(direction: str, a, b, c, stride, padding, dilation, groups, *, engine, allow_tf32, math, out,
                    activation=None):
    """rawconv.cudnn_graph.{forward, backward_data, backward_filter} on tensors that require grad."""
    from ..cudnn import graph as cudnn_graph

    _refuse(f"rawconv.cudnn_graph.{direction}", out=(out, None), activation=(activation, None))
    if engine is None:
        name = ""
    elif isinstance(engine, str):
        name = engine
    elif isinstance(engine, int) and not isinstance(engine, bool):
        name = f"eng{engine}"
    else:
        name = _choice_name(engine, "engine")
    prec = "tf32" if cudnn_graph.allows_tf32(allow_tf32, math) else "strict"
    if direction == "forward":
        return conv(a, b, c, stride, padding, dilation, groups, backend="cudnn_graph", choice=name, precision=prec)
    if direction == "backward_data":
        return conv_backward_data(a, b, c, stride, padding, dilation, groups, backend="cudnn_graph", choice=name,
                                  precision=prec)
    return conv_backward_weights(a, b, c, stride, padding, dilation, groups, backend="cudnn_graph", choice=name,
                                 precision=prec)


# every public entry point raises only rawconv's exception classes (rawconv._guard)

_guard.guard_module(globals(), "conv", "conv_transpose", "conv_backward_data", "conv_backward_weights", "selected",
                    "split_choice")


# the grad slot (rawconv.core.grad): the backends' function forms hand tensors that need grad to these
from ..core import grad as _grad_slot  # noqa: E402

_grad_slot.fill("onednn", _onednn_function)
_grad_slot.fill("cudnn", _cudnn_function)
_grad_slot.fill("cudnn_graph", _graph_function)
