"""rawconv.fused's plans and dispatch (:mod:`rawconv.fused`, the face): the plan caches,
:func:`plan_for` (a oneDNN :class:`FusedConvolution` or a cuDNN graph plan per problem), the
legacy fallback on CUDA (:class:`_CudaFallback`), and the operator's kernel (:func:`_op_kernel`,
a frozen module's own plans included: :func:`_run_frozen`)."""
from __future__ import annotations

import threading
from typing import Any

import torch

from .. import onednn
from ..core import guard as _guard
from ..core import plans as _plans_mod
from ..core.plans import PlanCache
from ..core.errors import ArgumentError, ArgumentTypeError, NotSupportedError
from ..core.problem import ConvProblem, layout_of
from ..core.postops import apply_activation, check_activation, check_residual, torch_tail
from ..onednn.fused import FusedConvolution  # the oneDNN post-op plan lives there
from .fused_graph import _graph_class
from .fused_frozen import _FROZEN_MAX

FACE = "rawconv.pytorch.fused"   # where this module's public names live (rawconv.fused)

BACKENDS = ("auto", "onednn", "cudnn")
PRECISIONS = ("strict", "tf32", "bf16", "f16", "any")

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


def _run_frozen(plans: dict, x, w, bias, residual, stride, pad, dilation, groups, activation, choice, precision,
                residual_inplace):
    """A frozen module's call on oneDNN: its own plan for this problem, with the snapshot ``w``
    (the module's buffer) as the plan's weight snapshot, reordered once, and again when the buffer
    was changed in place (its version counter moved). Returns the result in the operator's memory
    format (:func:`_out_format`, kept on the plan when it is made: the key holds x's shape and strides)."""
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
        ident = None if key is None else key[:12] + (index,) + key[13:]   # the choice as the implementation run
        plan = _twin(plans, ident, w)
        if plan is None:
            plan = FusedConvolution.for_problem(generic.problem, residual=generic.residual, activation=activation,
                                                impl=index, fpmath=precision,
                                                w_layout=onednn.weights_layout(w), prepack=True)
            plan._op_format = _out_format(x, w)
            plan._frozen_ident = ident
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
    return _in_format(plan.run(x, None, bias, residual, inplace=residual_inplace), plan._op_format)


def _twin(plans: dict, ident, w):
    """The plan a frozen module already made for the same problem and implementation under another
    spelling of its choice, or None. Its eager calls pass no choice (the autotuned one is resolved
    when the plan is made) while under torch.compile the choice is resolved when the model is traced
    and passed on: without this, each layer kept two plans, and two reordered copies of its weights,
    when run both ways. Only a plan whose weight snapshot is ``w`` itself is shared (else each call
    would take its snapshot again)."""
    if ident is None:
        return None
    for p in plans.values():
        if getattr(p, "_frozen_ident", None) == ident and not p._freed and p._snap is not None and p._snap[0] is w:
            return p
    return None


def _run(x, w, bias, residual, stride, padding, dilation, groups, activation, backend, choice, precision,
         residual_inplace=False, frozen_plans=None):
    """The operator's result (in its memory format, :func:`_out_format`) on the cached plan for these
    arguments: a frozen module's own (:func:`_run_frozen`) or the one :func:`plan_for` gives, found
    by a key of what can change between calls (the format kept beside it)."""
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
        entry = _fast.get(key)
    except TypeError:
        key = entry = None
    plan, fmt = entry if entry is not None else (None, None)
    if plan is None or plan._freed:
        plan = plan_for(x, w, bias, residual, stride, pad, dilation, groups, activation=activation,
                        backend=backend, choice=choice, precision=precision)
        fmt = _out_format(x, w)
        if key is not None:
            if len(_fast) >= _FAST_MAX:
                _fast.clear()
            _fast[key] = (plan, fmt)
    return _in_format(_execute(plan, x, w, bias, residual, activation, residual_inplace), fmt)


def _execute(plan, x, w, bias, residual, activation, residual_inplace):
    """``plan``'s result for these tensors (in the plan's layout)."""
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


def _out_format(x, w):
    """The memory format the operator gives its result in (as its fake kernel, :func:`_out_meta`):
    channels last (``channels_last`` / ``channels_last_3d``) for a batched 4-D or 5-D ``x`` that is
    channels last, else contiguous; None (the result as the plan gives it) for an unbatched ``x``
    or one of fewer than 3 dims. A function of x's rank, shape and strides and w's rank, which the
    plan caches' keys hold: computed once per cached plan, not per call."""
    xd = x.dim()
    if xd == w.dim() - 1 or xd < 3:
        return None
    if xd in (4, 5) and layout_of(x) == "nhwc":
        return torch.channels_last if xd == 4 else torch.channels_last_3d
    return torch.contiguous_format


def _in_format(y, fmt):
    """``y``, made dense in memory format ``fmt`` when it is not (None: as it is)."""
    if fmt is not None and not y.is_contiguous(memory_format=fmt):
        return y.contiguous(memory_format=fmt)
    return y


def _op_kernel(x, w, bias, residual, stride, padding, dilation, groups, activation, backend, choice, precision,
               residual_inplace=False, frozen_plans=None):
    """The operator's kernel (also called directly by the modules in eager inference, where
    ``residual_inplace`` lets the oneDNN path write the result into the residual's memory, and
    a frozen module passes its snapshot as ``w``/``bias`` with its own plans, ``frozen_plans``).
    The result is in x's memory format (:func:`_out_format`)."""
    return _run(x, w, bias, residual, stride, padding, dilation, groups, activation, backend, choice, precision,
                residual_inplace, frozen_plans)


# every public entry point raises only rawconv's exception classes (rawconv._guard)
_guard.guard_module(globals(), "plan_for", where=FACE)
