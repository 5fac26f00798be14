"""rawconv.ops's Python functions (:mod:`rawconv.ops`, the face): :func:`conv`,
:func:`conv_transpose`, :func:`conv_backward_data`, :func:`conv_backward_weights`,
:func:`selected`, :func:`clear_cache`, a training step's choice (:class:`TrainingChoice`,
:func:`split_choice`), and the argument packs the modules keep (:func:`_conv_entry`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from . import autocast as _autocast
from . import ops_autograd as _ag
from . import ops_kernels as _k
from ..core import guard as _guard
from .. import onednn
from ..core.plans import PlanCache, arg_key
from ..core.errors import ArgumentError, ArgumentTypeError, NotSupportedError
from ..core.problem import (ConvProblem, conv_layout, empty_like_layout, int_arg, layout_of, resolve_padding,
                            shape_arg, to_layout, transposed_shapes, tuple_arg)
from .ops_kernels import (_backward_data_cpu, _backward_data_plan, _onednn_plan, _backward_weights_problem, _batched,
                          _bwd_data_op, _check_strings, _forward_cpu_plan, _fwd_op, _get_ident,
                          _grads_of_forward_layout, _padding)
from .ops_autograd import (_Conf, _FwdFn, _add, _autocasting, _below_autograd, _bwd_data_call,
                           _bwd_weights_call, _classic, _compiling, _dispatch_modes, _functorch, _function_mode,
                           _fwad, _grad_like, _legacy_batched, _needs, _no_autocast, _tracing)

FACE = "rawconv.pytorch.ops"   # where this module's public names live (rawconv.ops): pickles, messages

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
_PLAIN = (torch.Tensor, torch.nn.Parameter)


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
            y, entry[2] = _k._forward_cuda_checked(x, w, bias, *args)
            return y
    return _ag._fwd_call(x, w, bias, *args)


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
            gx = _ag._fwd_call(gy, w, None, stride, pb, pa, dil, groups, backend, fwd_choice, precision, "", "")
        if ctx.needs_input_grad[1]:
            gw = _bwd_weights_call(gy, x, list(w.shape), stride, pb, pa, dil, groups, False, backend, wts_choice,
                                 precision)[0]
        gx, gw = _grads_of_forward_layout(gx, gw, x, w)   # 1-D, unbatched, empty batch: torch's layouts
        return gx, gw, None


RawconvConvTranspose.__module__ = FACE   # (the face's, as before the split; the twin copies it)
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
    fwd = _onednn_plan(problem, "forward", prec, onednn.weights_layout(w), c).selected
    y = empty_like_layout(problem.y_shape, problem.layout, x.dtype, "cpu")
    y = y.squeeze(0) if problem.unbatched else y
    data = _backward_data_plan(y, w, tuple(x.shape), s, pb, pa, d, g, bd, prec).selected
    wp = _backward_weights_problem(x, y, tuple(w.shape), s, pb, pa, d, g, bias is not None)
    wts = _onednn_plan(wp, "backward_weights", prec, wp.layout, bw).selected
    return {"forward": fwd.choice, "backward_data": data.choice, "backward_weights": wts.choice}


def clear_cache() -> None:
    """Drop the operators' cached plans and argument packs (rawconv.onednn's plans stay cached there)."""
    _k._cpu_cache.clear()
    _k._cpu_last.clear()
    _conv_cache.clear()
    _k._cuda_last.clear()


TrainingChoice.__module__ = FACE   # (pickles and the API reference name it as rawconv.pytorch.ops.TrainingChoice)
_ConvTransposeJvp.__module__ = FACE

# every public entry point raises only rawconv's exception classes (rawconv._guard)
_guard.guard_module(globals(), "conv", "conv_transpose", "conv_backward_data", "conv_backward_weights", "selected",
                    "split_choice", where=FACE)
