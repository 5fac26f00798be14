"""The functional forms of :mod:`rawconv.nn` (:func:`conv`, :func:`conv_transpose`), their argument
checks and the autograd functions they fall back to when :data:`USE_OPS` is off; handed on by
:mod:`rawconv.pytorch.nn`, the module users import."""
from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F

from . import fusion as _fusion
from . import registered as _registered
from .pins import check_choice as _check_choice, split as _split
from .. import onednn
from ..core.errors import ArgumentError, ArgumentTypeError
from ..core.guard import applies_function as _applies_function
from ..core.options import PRECISIONS
from ..core.problem import ConvProblem, shape_only
from ..core import guard as _guard

FACE = "rawconv.pytorch.nn"   # where this module's public names live (rawconv.nn): pickles, messages


BACKENDS = ("auto", "onednn", "cudnn")


# ---------------------------------------------------------------------------- argument helpers
def _check_backend(backend) -> str:
    """``backend`` when the modules take it: one of :data:`BACKENDS` or the name of a backend
    registered in :mod:`rawconv.core.backend` beyond the built-in ones (:mod:`rawconv.pytorch.registered`)."""
    if not isinstance(backend, str):
        raise ArgumentTypeError(f"backend must be one of {list(BACKENDS)}, got {type(backend).__name__}")
    if backend not in BACKENDS and (backend in _registered.BUILTIN or _registered.device_type(backend) is None):
        names = list(BACKENDS) + [n for n in _registered.names() if n not in _registered.BUILTIN]
        raise ArgumentError(f"backend must be one of {names}, got {backend!r}")
    return backend


def _check_precision(precision) -> str:
    if not isinstance(precision, str):
        raise ArgumentTypeError(f"precision must be one of {list(PRECISIONS)}, got {type(precision).__name__}")
    if precision not in PRECISIONS:
        raise ArgumentError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    return precision


def _alias(new, old, new_name: str, old_name: str, default=None):
    """``new`` or its old name's value (both given: they must agree; the old name warns: DeprecationWarning)."""
    if old is None:
        return new if new is not None else default
    warnings.warn(f"{old_name}= is the old name of {new_name}=: pass {new_name}=", DeprecationWarning, stacklevel=4)
    if new is not None and new != old and new != default:
        raise ArgumentError(f"{new_name}={new!r} and {old_name}={old!r} disagree ({old_name} is the old name of "
                            f"{new_name}); pass one")
    return old


def _resolve_backend(backend: str, device: torch.device) -> str:
    """The backend that runs for tensors on ``device`` (raises for a mismatch)."""
    if backend == "auto":
        return "cudnn" if device.type == "cuda" else "onednn"
    if backend == "onednn" and device.type != "cpu":
        raise ArgumentError(f"backend 'onednn' runs on CPU tensors, got tensors on {device} "
                            "(backend='cudnn' or 'auto' for CUDA tensors)")
    if backend == "cudnn" and device.type != "cuda":
        raise ArgumentError(f"backend 'cudnn' runs on CUDA tensors, got tensors on {device} "
                            "(backend='onednn' or 'auto' for CPU tensors)")
    if backend not in BACKENDS and _registered.device_type(backend) != device.type:   # a registered one
        raise ArgumentError(f"backend {backend!r} runs on {_registered.device_type(backend)} tensors, got tensors "
                            f"on {device}")
    return backend


def _pair(choice):
    """``backward_choice`` as (data choice, weights choice)."""
    if isinstance(choice, (tuple, list)):
        if len(choice) != 2:
            raise ArgumentError(f"backward_choice must be one value or a (data, weights) pair, got {choice!r}")
        return choice[0], choice[1]
    return choice, choice


def _is_cl(x: torch.Tensor) -> bool:
    return x.dim() in (4, 5) and not x.is_contiguous() and x.is_contiguous(
        memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)


def _like_layout(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if _is_cl(like):
        return t.contiguous(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d)
    return t.contiguous()


_norm_padding = _fusion.norm_padding   # lists as tuples (see there)


# ---------------------------------------------------------------------------- backend calls (no autograd)
def _forward(x, w, b, stride, padding, dilation, groups, *, backend, choice=None, precision="strict"):
    bk = _resolve_backend(backend, x.device)
    if bk == "onednn":
        return onednn.forward(x, w, b, stride, padding, dilation, groups, impl=choice, fpmath=precision)
    from .. import cudnn

    return cudnn.forward(x, w, b, stride, padding, dilation, groups, choice=choice, precision=precision)


def _backward_data(gy, w, x_shape, stride, padding, dilation, groups, *, backend, choice=None, precision="strict"):
    bk = _resolve_backend(backend, gy.device)
    if bk == "onednn":
        return onednn.backward_data(gy, w, x_shape, stride, padding, dilation, groups, impl=choice, fpmath=precision)
    from .. import cudnn

    return cudnn.backward_data(gy, w, x_shape, stride, padding, dilation, groups, choice=choice, precision=precision)


def _backward_weights(x, gy, w_shape, stride, padding, dilation, groups, *, backend, choice=None,
                      precision="strict"):
    bk = _resolve_backend(backend, x.device)
    gy = _like_layout(gy, x)
    if bk == "onednn":
        return onednn.backward_weights(x, gy, w_shape, stride, padding, dilation, groups, impl=choice,
                                       fpmath=precision)
    from .. import cudnn

    return cudnn.backward_weights(x, gy, w_shape, stride, padding, dilation, groups, choice=choice,
                                  precision=precision)


def _bias_grad(gy: torch.Tensor, nd: int) -> torch.Tensor:
    dims = [0] + list(range(2, gy.dim())) if gy.dim() == nd + 2 else list(range(1, gy.dim()))
    acc = torch.float64 if gy.dtype == torch.float64 else torch.float32
    return gy.sum(dims, dtype=acc).to(gy.dtype)


class _Conv(torch.autograd.Function):
    """Forward on the pinned choice; backward through the same backend's backward-data and
    backward-weights calls (``backward_choice``). Once differentiable."""

    @staticmethod
    def forward(ctx, x, w, b, stride, padding, dilation, groups, backend, choice, bwd_choice, precision):
        y = _forward(x, w, b, stride, padding, dilation, groups, backend=backend, choice=choice, precision=precision)
        ctx.save_for_backward(x, w)
        ctx.conf = (stride, padding, dilation, groups, backend, bwd_choice, precision, b is not None)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        stride, padding, dilation, groups, backend, bwd_choice, precision, has_b = ctx.conf
        d_choice, w_choice = _pair(bwd_choice)
        gy = _like_layout(gy, x)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _backward_data(gy, w, tuple(x.shape), stride, padding, dilation, groups, backend=backend,
                                choice=d_choice, precision=precision)
        if ctx.needs_input_grad[1]:
            gw = _backward_weights(x, gy, tuple(w.shape), stride, padding, dilation, groups, backend=backend,
                                   choice=w_choice, precision=precision)
            if isinstance(gw, tuple):
                gw = gw[0]
        if has_b and ctx.needs_input_grad[2]:
            gb = _bias_grad(gy, w.dim() - 2)
        return gx, gw, gb, None, None, None, None, None, None, None, None


def _ops_module():
    """``rawconv.ops`` when it exists and :data:`USE_OPS` is on, else None."""
    if not USE_OPS:
        return None
    try:
        from . import ops
    except ImportError:
        return None
    return ops


USE_OPS = True   # route through rawconv.ops (torch.library operators) when that module exists


@_applies_function
def conv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
         padding: Any = 0, dilation: Any = 1, groups: int = 1, *, backend: str = "auto", choice: Any = None,
         precision: str | None = None, backward_choice: Any = None, impl: Any = None,
         backward_impl: Any = None, fpmath: str | None = None) -> torch.Tensor:
    """``torch.nn.functional.conv{1,2,3}d`` on a pinned oneDNN / cuDNN choice, differentiable (once).

    ``x``: (N, C, *spatial) or unbatched; ``w``: (K, C/groups, *kernel); ``bias``: (K,); CPU
    tensors run on oneDNN, CUDA tensors on cuDNN (``backend="auto"``), or force one with
    ``backend="onednn"|"cudnn"``. ``padding`` also takes ``"same"``/``"valid"`` and one
    ``(before, after)`` pair per spatial dim. ``choice``: the forward candidate, by name (oneDNN
    implementation name such as ``"x64:gemm:jit@any"``; cuDNN ``"ALGO@math"`` or graph engine
    config) or as a listed row (``onednn.implementations(x, w)[i]``); not a position (an index
    into one problem's listing: only the backend function forms such as
    ``rawconv.onednn.forward(x, w, impl=0)`` take those);
    ``backward_choice``: one value or a ``(data, weights)`` pair; or ``choice`` pins the whole
    training step (:class:`rawconv.ops.TrainingChoice` or a dict ``{"forward": ..,
    "backward_data": .., "backward_weights": ..}``); ``precision``: see
    :mod:`rawconv.options`. ``impl`` / ``backward_impl`` / ``fpmath``: the old names (DeprecationWarning).
    Raises :class:`ArgumentError` / :class:`ArgumentTypeError` for bad input (a choice of another
    type, an int position) before any C call and :class:`NotSupportedError` for a choice the
    library does not offer. Wraps the backends' ``forward`` / ``backward_data`` /
    ``backward_weights``.
    """
    what, bwhat = ("impl" if impl is not None else "choice"), ("backward_impl" if backward_impl is not None
                                                               else "backward_choice")
    choice, backward_choice = _split(_alias(choice, impl, "choice", "impl"),
                                     _alias(backward_choice, backward_impl, "backward_choice", "backward_impl"))
    choice = _check_choice(choice, what)
    backward_choice = _check_choice(backward_choice, bwhat, pair=True)
    precision = _check_precision(_alias(precision, fpmath, "precision", "fpmath", "strict"))
    _check_backend(backend)
    padding = _norm_padding(padding)
    if not isinstance(x, torch.Tensor):
        raise ArgumentTypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    _resolve_backend(backend, x.device)   # the backends validate the rest before any C call
    ops = _ops_module()
    if ops is not None:
        return ops.conv(x, w, bias, stride, padding, dilation, groups, backend=backend, choice=choice,
                        precision=precision, backward_choice=backward_choice)
    if not torch.is_grad_enabled() or not (x.requires_grad or w.requires_grad or
                                           (bias is not None and bias.requires_grad)):
        return _forward(x, w, bias, stride, padding, dilation, groups, backend=backend, choice=choice,
                        precision=precision)
    return _Conv.apply(x, w, bias, stride, padding, dilation, groups, backend, choice, backward_choice, precision)


# ---------------------------------------------------------------------------- transposed convolution
def _transpose_shape(x: torch.Tensor, w: torch.Tensor, stride, padding, output_padding, dilation, groups):
    """(y_shape, core_shape, stride, padding pairs, dilation) of a transposed convolution of batched
    ``x``: the matching convolution's backward data computes ``core_shape`` with that padding, and
    ``y_shape - core_shape`` zeros follow in each dim (:func:`rawconv.problem.transposed_shapes`)."""
    from ..core.problem import transposed_shapes

    if isinstance(padding, str):
        raise ArgumentError(f"a transposed convolution takes numeric padding (as torch), got {padding!r}")
    y_shape, core, s, pb, pa, d, _g = transposed_shapes(tuple(x.shape), tuple(w.shape), stride, padding,
                                                        output_padding, dilation, groups)
    return y_shape, core, s, tuple(zip(pb, pa)), d


class _ConvTranspose(torch.autograd.Function):
    """y = backward_data(grad_y=x); grad x = forward conv of grad y; grad w = backward_weights
    with grad y as the input and x as the output gradient. Once differentiable."""

    @staticmethod
    def forward(ctx, x, w, b, stride, padding, y_shape, dilation, groups, backend, choice, bwd_choice, precision):
        y = _backward_data(x, w, y_shape, stride, padding, dilation, groups, backend=backend, choice=choice,
                           precision=precision)
        if b is not None:
            y = y + b.view(1, -1, *([1] * (w.dim() - 2)))
            y = _like_layout(y, x)
        ctx.save_for_backward(x, w)
        ctx.conf = (stride, padding, dilation, groups, backend, bwd_choice, precision, b is not None)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        stride, padding, dilation, groups, backend, bwd_choice, precision, has_b = ctx.conf
        x_choice, w_choice = _pair(bwd_choice)
        gy = _like_layout(gy, x)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _forward(gy, w, None, stride, padding, dilation, groups, backend=backend, choice=x_choice,
                          precision=precision)
        if ctx.needs_input_grad[1]:
            gw = _backward_weights(gy, _like_layout(x, gy), tuple(w.shape), stride, padding, dilation, groups,
                                   backend=backend, choice=w_choice, precision=precision)
            if isinstance(gw, tuple):
                gw = gw[0]
        if has_b and ctx.needs_input_grad[2]:
            gb = _bias_grad(gy, w.dim() - 2)
        return gx, gw, gb, None, None, None, None, None, None, None, None, None


@_applies_function
def conv_transpose(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
                   padding: Any = 0, output_padding: Any = 0, groups: int = 1, dilation: Any = 1, *,
                   backend: str = "auto", choice: Any = None, precision: str = "strict",
                   backward_choice: Any = None) -> torch.Tensor:
    """``torch.nn.functional.conv_transpose{1,2,3}d`` (same argument order) as the backward-data
    primitive of the matching convolution, on a pinned choice, differentiable (once).

    ``x``: (N, C_in, *spatial) or unbatched; ``w``: (C_in, C_out/groups, *kernel); ``bias``:
    (C_out,); ``output_padding`` < max(stride, dilation) per dim. Output spatial size
    ``(in - 1)*stride - 2*padding + dilation*(kernel - 1) + output_padding + 1``. ``choice``: a
    backward-data candidate (oneDNN implementation of backward data, cuDNN backward-data algo or
    graph config); ``backward_choice``: ``(forward choice for grad x, backward-weights choice)``.
    Raises :class:`ArgumentError` / :class:`ArgumentTypeError` before any C call for bad input.
    Wraps the backends' ``backward_data`` (and ``forward`` / ``backward_weights`` for gradients).
    """
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ArgumentTypeError(f"x and w must be torch.Tensor, got {type(x).__name__} and {type(w).__name__}")
    if w.dim() not in (3, 4, 5):
        raise ArgumentError(f"weight must be 3-D, 4-D or 5-D (C_in, C_out/groups, *kernel), got {tuple(w.shape)}")
    _check_backend(backend)
    precision = _check_precision(precision)
    choice, backward_choice = _split(choice, backward_choice, transposed=True)
    _check_choice(choice, "choice")
    _check_choice(backward_choice, "backward_choice", pair=True)
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise ArgumentTypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    ops = _ops_module()
    if ops is not None and hasattr(ops, "conv_transpose"):
        return ops.conv_transpose(x, w, bias, stride, padding, output_padding, groups, dilation, backend=backend,
                                  choice=choice, precision=precision, backward_choice=backward_choice)
    unbatched = x.dim() == w.dim() - 1
    xb = x.unsqueeze(0) if unbatched else x
    y_shape, core, s, p, d = _transpose_shape(xb, w, stride, padding, output_padding, dilation, groups)
    if bias is not None and (tuple(bias.shape) != (y_shape[1],) or bias.dtype != x.dtype or bias.device != x.device):
        raise ArgumentError(f"bias must be a ({y_shape[1]},) tensor of the input's dtype and device, got "
                            f"{tuple(bias.shape)} {bias.dtype} on {bias.device}")
    # the matching convolution's checks (dtype, device, channels) before any C call
    ConvProblem.from_torch(shape_only(core, xb), w, None, s, p, d, groups)
    _resolve_backend(backend, x.device)
    if core != y_shape:   # output padding past stride - 1: zeros no kernel tap reaches, then the bias
        b_core = None
    else:
        b_core = bias
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (b_core is not None and b_core.requires_grad)):
        y = _ConvTranspose.apply(xb, w, b_core, s, p, core, d, groups, backend, choice, backward_choice, precision)
    else:
        y = _backward_data(xb, w, core, s, p, d, groups, backend=backend, choice=choice, precision=precision)
        if b_core is not None:
            y = _like_layout(y + b_core.view(1, -1, *([1] * (w.dim() - 2))), xb)
    if core != y_shape:
        pad = []
        for o, k in reversed(list(zip(y_shape[2:], core[2:]))):
            pad += [0, o - k]
        y = F.pad(y, pad)
        if bias is not None:
            y = y + bias.view(1, -1, *([1] * (w.dim() - 2)))
        y = _like_layout(y, xb)
    return y.squeeze(0) if unbatched else y


# every public entry point raises only rawconv's exception classes (rawconv._guard)
_guard.guard_module(globals(), "conv", "conv_transpose", where=FACE)
