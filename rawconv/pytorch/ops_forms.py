"""rawconv.ops's function forms' autograd (:mod:`rawconv.ops`, the face): rawconv.onednn /
rawconv.cudnn / rawconv.cudnn_graph's function forms, given tensors that require grad with grad
mode on, come here through the grad slot (:mod:`rawconv.core.grad`), which this module fills."""
from __future__ import annotations

import torch

from .. import onednn
from ..core.errors import ArgumentError
from ..core.problem import ConvProblem, to_layout
from .ops_kernels import _backward_weights_problem, _batched, _layout
from .ops_functions import _choice_name, _conv_args, conv, conv_backward_data, conv_backward_weights

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
    """The operator's choice for a function form's ``impl``. None: oneDNN's first choice by its name,
    what the function form runs without grad (the operators' default differs on channels-last
    tensors: :func:`rawconv.pytorch.ops_kernels._onednn_plan`)."""
    if impl is None:
        return _choice_name(plan_fn().selected, "impl")
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


# the grad slot (rawconv.core.grad): the backends' function forms hand tensors that need grad to these
from ..core import grad as _grad_slot  # noqa: E402

_grad_slot.fill("onednn", _onednn_function)
_grad_slot.fill("cudnn", _cudnn_function)
_grad_slot.fill("cudnn_graph", _graph_function)
