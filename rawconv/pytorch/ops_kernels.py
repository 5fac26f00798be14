"""rawconv.ops's operators (:mod:`rawconv.ops`, the face): the ``torch.library`` schemas of
``rawconv::conv_forward``, ``conv_backward_data`` and ``conv_backward_weights``, their argument
checks, their CPU kernels (oneDNN plans), CUDA kernels (cuDNN graph and legacy plans), fake (meta)
kernels and flop formulas. Each kernel keeps the plan of its last call with the same (non-tensor)
arguments for its hot path, else takes its checked path."""
from __future__ import annotations

import threading

import torch

from . import registered as _registered
from .. import onednn
from ..core.plans import PlanCache
from ..core.errors import ArgumentError, ArgumentTypeError, NotSupportedError
from ..core.options import PRECISIONS
from ..core.problem import (ConvProblem, backward_data_layout, backward_weights_layout, conv_layout, dense_strides,
                            empty_like_layout, int_arg, layout_of, resolve_padding, shape_arg, shape_only,
                            strides_match, tuple_arg)

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
            plan = _onednn_plan(problem, "forward", precision, onednn.weights_layout(w), choice)
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


def _onednn_plan(problem, direction: str, precision: str, w_layout: str, choice: str) -> onednn.Convolution:
    """The operators' cached oneDNN plan of ``direction``: ``choice`` when one is pinned, else the
    implementation torch's oneDNN is asked for (:meth:`rawconv.onednn.Convolution.first_on_tensor_layouts`:
    on channels-last tensors oneDNN's first choice on their own layouts, with no conversion of x and
    y / dy per call), pinned in a plan of its own (the function forms' plan keeps oneDNN's first
    choice). The selection is resolved now: a bad choice raises before the plan is cached."""
    plan = onednn.cached_plan(problem, direction, "direct", precision, w_layout, _onednn_choice(choice))
    if not choice:
        i = plan.first_on_tensor_layouts()
        if i != plan.selected.index:
            plan = onednn.cached_plan(problem, direction, "direct", precision, w_layout, plan.implementations[i])
    plan.selected   # noqa: B018
    return plan


def _backward_data_plan(grad_y, w, x_shape, stride, pad_before, pad_after, dilation, groups, choice, precision):
    problem = onednn.backward_data_problem(grad_y, w, tuple(x_shape), stride, _padding(pad_before, pad_after),
                                           dilation, groups, False)
    return _onednn_plan(problem, "backward_data", precision, onednn.weights_layout(w), choice)


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
            plan = _onednn_plan(problem, "backward_weights", precision, problem.layout, choice)
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
