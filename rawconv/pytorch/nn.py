"""torch.nn modules on pinned oneDNN / cuDNN choices, whole-model conversion, fusion, and a per-layer report.

Quick use::

    import rawconv.nn

    conv = rawconv.nn.Conv2d(64, 64, 3, padding=1, choice="x64:gemm:jit")  # a torch.nn.Conv2d
    y = conv(x)                          # forward on exactly that oneDNN implementation
    conv.cuda()                          # follows the device: cuDNN now (a oneDNN choice is dropped)

    model = rawconv.nn.convert(torchvision_model)                   # every conv swapped, weights kept
    model = rawconv.nn.convert(model.eval(), fuse=True, autotune=x) # BN folded, conv+bias(+add)+activation
                                                                    # fused where measured faster, each
                                                                    # distinct problem tuned once and
                                                                    # pinned to that problem
    print(rawconv.nn.describe(model, x))                            # per layer: rawconv vs torch

* :class:`Conv1d` / :class:`Conv2d` / :class:`Conv3d` and :class:`ConvTranspose1d` / ``2d`` / ``3d``
  subclass the torch modules (same constructor, same ``state_dict``, ``isinstance`` holds) and add
  ``backend`` (``"auto"``: by the input's device; ``"onednn"``; ``"cudnn"``), ``choice`` (the
  pinned candidate: a oneDNN implementation name / ``"name@user"`` / position, a cuDNN
  ``"ALGO@math"`` or graph engine config ``"eng28{k2=3}"``), ``backward_choice`` (one value, or
  a ``(data, weights)`` pair) and ``precision`` (``"strict"``, ``"tf32"``, ``"bf16"``, ``"f16"``,
  ``"any"``; :mod:`rawconv.options`). ``impl=`` / ``backward_impl=`` / ``fpmath=``, the old names of
  ``choice`` / ``backward_choice`` / ``precision``, still work and warn (``DeprecationWarning``).
* Transposed convolutions run as the backward-data primitive of the matching convolution
  (oneDNN backward data / cuDNN backward data), ``output_padding`` and ``output_size`` as torch.
* ``padding_mode`` other than ``"zeros"`` (reflect, replicate, circular): the input is padded in
  torch (``F.pad``, as torch's own modules do), then the convolution runs with no padding.
* :class:`ConvBiasAct1d` / ``2d`` / ``3d``: ``act(conv(x) + bias + residual)`` as one call
  (:mod:`rawconv.fused`: oneDNN post-ops on CPU, one cuDNN graph on CUDA).
* :func:`convert`, :func:`describe`: see their docstrings.

The convolutions run through ``rawconv.ops.conv`` (torch.library operators) when that module
exists; until then through this module's autograd functions over :mod:`rawconv.onednn` and
:mod:`rawconv.cudnn` (``USE_OPS`` says which ran; the same arguments either way).
"""
from __future__ import annotations

import contextlib
import copy
import logging
import math
import operator
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from . import autocast as _autocast
from . import fallback as _fallback
from . import fused as _fused
from . import fusion as _fusion
from . import pins as _pins
from .pins import check_choice as _check_choice, choice_library as _choice_library  # noqa: F401
from .pins import is_step as _is_step, split as _split  # noqa: F401
from . import registered as _registered
from .. import onednn
from ..core.autotune import check_budget as _check_budget
from ..core.grad import functorch_active as _functorch, has_tangent as _has_tangent
from ..core.errors import ArgumentError, ArgumentTypeError, InternalError, NotSupportedError, RawconvError
from ..core.guard import applies_function as _applies_function
from ..core.options import PRECISIONS
from ..core.problem import ConvProblem, empty_like_layout, shape_only, tuple_arg

_autocasting = torch._C._is_any_autocast_enabled
log = logging.getLogger("rawconv.nn")

__all__ = ["conv", "conv_transpose", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
           "ConvTranspose3d", "ConvBiasAct1d", "ConvBiasAct2d", "ConvBiasAct3d", "convert", "describe",
           "LayerReport", "ConvertReport", "print_table", "BACKENDS", "pinned_choices", "pin_choices",
           "refresh", "TunedChoice", "AUTOTUNE_NEW", "torch_fallbacks"]

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
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_get_ident = onednn.thread_ident   # (thread, its OpenMP count): the modules' argument packs are per thread
_F32 = torch.float32
_OPS: list = [None]   # rawconv.ops, once loaded (the modules' per-call path)


def _load_ops():
    from . import ops

    _OPS[0] = ops
    return ops


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


# ---------------------------------------------------------------------------- modules
# while convert/describe record the exact calls: (thread id, list of (module, kind, args)) per
# recording, innermost last. Non-empty is the forwards' one fast check; each thread records only
# its own calls (another thread's model running meanwhile is not tuned, nor its choices pinned)
_RECORDING: list = []
_RECORDING_LOCK = threading.Lock()


def _record(module, kind: str, **args) -> None:
    if _RECORDING:
        me = threading.get_ident()
        for tid, calls in reversed(tuple(_RECORDING)):   # a snapshot: other threads push and pop
            if tid == me:
                calls.append((module, kind, args))
                return


@contextlib.contextmanager
def _recording():
    """Record this thread's rawconv convolution calls into the list it yields."""
    entry = (threading.get_ident(), [])
    with _RECORDING_LOCK:
        _RECORDING.append(entry)
    try:
        yield entry[1]
    finally:
        with _RECORDING_LOCK:
            for i in range(len(_RECORDING) - 1, -1, -1):
                if _RECORDING[i] is entry:
                    del _RECORDING[i]
                    break


class _RawconvConv:
    """Mixin: a torch ConvNd / ConvTransposeNd whose forward runs on rawconv."""

    _transposed = False

    def _rawconv_init(self, backend="auto", choice=None, backward_choice=None, precision=None, impl=None,
                      backward_impl=None, fpmath=None, fallback="torch"):
        if fallback not in _fallback.MODES:
            raise ArgumentError(f"fallback must be one of {list(_fallback.MODES)} (\"torch\": what rawconv cannot run "
                                f"runs on torch's own kernel, said once and counted), got {fallback!r}")
        self.fallback = fallback
        self.backend = _check_backend(backend)
        what, bwhat = ("impl" if impl is not None else "choice"), ("backward_impl" if backward_impl is not None
                                                                   else "backward_choice")
        # a pinned training step (a TrainingChoice or a dict per library direction): its forward and backward parts
        choice, backward_choice = _split(_alias(choice, impl, "choice", "impl"),
                                         _alias(backward_choice, backward_impl, "backward_choice", "backward_impl"),
                                         self._transposed)
        self.choice = _check_choice(choice, what)
        self.backward_choice = _check_choice(backward_choice, bwhat, pair=True)
        self.precision = _check_precision(_alias(precision, fpmath, "precision", "fpmath", "strict"))
        self._choice_backend = self._device_backend()
        named = _choice_library(self.choice, "impl" if impl is not None else "choice") or \
            _choice_library(self.backward_choice, "backward_choice")
        if named is not None and self.backend == "auto":
            # a name of the other device's library (a cuDNN algorithm on a module built on the CPU, to
            # be moved with .cuda()): kept for that device; a call on this one says what it needs
            self._choice_backend = named
        w = _fallback.weight_source(self)   # (a parametrized weight is not computed: its forward may change state)
        self.__dict__["_rawconv_device"] = w.device.type if w is not None else "cpu"

    impl = property(lambda self: self.choice, lambda self, v: setattr(self, "choice", v))   # old names
    backward_impl = property(lambda self: self.backward_choice, lambda self, v: setattr(self, "backward_choice", v))
    fpmath = property(lambda self: self.precision, lambda self, v: setattr(self, "precision", v))

    def _device_backend(self) -> str:
        w = _fallback.weight_source(self)   # (a parametrized weight is not computed: its forward may change state)
        dev = w.device if w is not None else torch.device("cpu")
        if self.backend != "auto":
            return self.backend
        return "cudnn" if dev.type == "cuda" else "onednn"

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self._follow_device()
        return out

    def _follow_device(self) -> None:
        """After ``.to()`` / ``.cuda()`` / ``.cpu()``: an explicit backend of the other device
        switches (``"onednn"`` <-> ``"cudnn"``), and pinned choices made for the other backend are
        dropped (with a warning): a oneDNN implementation name means nothing to cuDNN."""
        if not hasattr(self, "backend"):   # during __init__ (torch moves parameters before _rawconv_init)
            return
        dev = _fallback.weight_source(self).device.type
        stayed = self.__dict__.get("_rawconv_device") == dev
        self.__dict__["_rawconv_device"] = dev
        want = "cudnn" if dev == "cuda" else "onednn" if dev == "cpu" else None
        if self.backend not in BACKENDS and _registered.device_type(self.backend) == dev:
            return   # a registered backend of this device (rawconv.pytorch.registered) keeps its choices
        if want is None or (stayed and self.backend in ("auto", want)):
            # (.half(), .float(), .to(dtype): the device stays, and so do choices named for the other
            # device's library, e.g. a cuDNN algorithm on a module built on the CPU to be moved later)
            return
        if self.backend != "auto" and self.backend != want:
            self.backend = want
        if self._choice_backend != want:
            tuned = self.__dict__.get(_TUNED_ATTR)
            if self.choice is not None or self.backward_choice is not None or tuned:
                what = f"choice {self.choice!r} (backward {self.backward_choice!r})"
                if tuned:
                    what += f" and the autotuned choices of {len(tuned)} problem(s)"
                warnings.warn(f"{type(self).__name__}: moved to {dev}; the {self._choice_backend} {what} "
                              f"were dropped (the {want} default runs: set .choice or use "
                              "rawconv.nn.convert(..., autotune=x))", RuntimeWarning, stacklevel=_guard.stacklevel())
            self.choice = self.backward_choice = None
            self.__dict__.pop(_TUNED_ATTR, None)
            self._choice_backend = want

    def __getstate__(self):
        """A pickle without the argument pack of :meth:`forward` (its plans hold the library's
        objects, which neither copies nor pickles): the unpickled module makes its own."""
        state = super().__getstate__()
        state.pop("_rawconv_entry", None)
        return state

    def __deepcopy__(self, memo):
        """A copy (``copy.deepcopy``) as torch's default one (the same class, ``__setstate__`` of
        the deep-copied ``__dict__``), without the argument pack of :meth:`forward`: the copy
        makes its own. Defined here, not left to ``__getstate__``, so that it also holds under
        ``torch.nn.utils.parametrize`` (whose injected class deep-copies ``__dict__`` unless the
        module class has its own ``__deepcopy__``; ``weight_norm``, ``spectral_norm``,
        ``AveragedModel``)."""
        cls = type(self)
        replica = cls.__new__(cls)
        memo[id(self)] = replica
        state = {k: v for k, v in self.__dict__.items() if k != "_rawconv_entry"}
        replica.__setstate__(copy.deepcopy(state, memo))
        return replica

    def _padded(self, x):
        """(input, padding) for the library: non-'zeros' padding modes pad in torch first
        (``F.pad``; its refusal of the input, e.g. a reflect padding not smaller than the input,
        is raised as :class:`ArgumentError` with torch's message: a ``RuntimeError`` as torch's)."""
        if self.padding_mode != "zeros":
            try:
                return F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode), 0
            except (RuntimeError, ValueError, NotImplementedError) as exc:
                new = _guard.translate(exc, f"rawconv.nn.{type(self).__name__}.forward")
                if new is None or not isinstance(new, InternalError):
                    raise
                raise ArgumentError(f"{type(self).__name__}: padding_mode={self.padding_mode!r} with padding "
                                    f"{self._reversed_padding_repeated_twice} on input {tuple(x.shape)}: torch's "
                                    f"F.pad says: {exc}") from exc
        return x, self.padding

    def _tuned_for(self, kind: str, x, extra, args: dict, w=None):
        """(choice, backward_choice) for this call: the module's own ``choice`` / ``backward_choice``
        where set (they apply to every problem), else the autotuned ones of the call's problem (the
        module's :data:`_TUNED_ATTR` table, filled by :func:`convert`'s ``autotune=``), else None
        (the library's default). A problem the autotune did not see is searched now when
        :func:`convert` was given ``autotune_new="search"`` (and nothing is being traced or
        captured), else it runs the default: an autotuned choice is pinned only to the problem it
        was tuned on."""
        choice, bwd = self.choice, self.backward_choice
        if choice is not None and bwd is not None:
            return choice, bwd
        key = _sig_of(kind, x, self.weight if w is None else w, extra)
        if key is not None:
            t = self.__dict__[_TUNED_ATTR].get(key)
            if t is None and self.__dict__.get(_NEW_ATTR) is not None and _can_search_now(x):
                t = _search_new(self, kind, args, key)
            if t is not None:
                if t.backend == "onednn" and t.__dict__.get(_OFFERED_ON) != _onednn_here():
                    t = _offered_here(self, kind, args, key, t)   # tuned on another CPU (or oneDNN)
                return (t.choice if choice is None else choice), (t.backward_choice if bwd is None else bwd)
        return choice, bwd

    def _cast_for(self, x, op: str, residual=None):
        """``(x, w, bias, residual)`` as operator ``rawconv::op``'s autocast kernel casts them (the
        module's parameters), or None outside autocast for x's device (nothing cast)."""
        if _autocasting():
            dev = x.device.type
            if dev in ("cpu", "cuda") and torch.is_autocast_enabled(dev):
                c = _autocast.cast_inputs(op, dev, (x, self.weight, self.bias, residual))
                if c[0] is not x or c[1] is not self.weight:
                    return c
        return None

    def _tuned_on_cast(self, kind: str, x, extra, args: dict, op: str):
        """:meth:`_tuned_for` on the problem the operators run: under autocast, on x (and a fused
        call's residual) and the parameters as operator ``rawconv::op``'s autocast kernel casts
        them, so that a float16 / bfloat16 call looks up (or, with ``autotune_new="search"``,
        searches) its own problem and never gets the choice tuned for the float32 one (which its
        library may not offer)."""
        return self._tuned_cast(kind, x, extra, args, self._cast_for(x, op, args.get("residual")))

    def _tuned_cast(self, kind: str, x, extra, args: dict, c):
        """:meth:`_tuned_on_cast` given ``c``, :meth:`_cast_for`'s result."""
        if c is not None:
            xt, wt, bt, rt = c
            a = dict(args, x=xt, w=wt, b=bt)
            if "residual" in args:
                a["residual"] = rt
            return self._tuned_for(kind, xt, extra, a, wt)
        return self._tuned_for(kind, x, extra, args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if type(x) in _PLAIN_TENSORS and (x.dtype is not _F32 or not (x.is_cpu or x.is_cuda) or not self.in_channels):
            why = _fallback.reason_for(self, x)   # (float32 CPU/CUDA tensors never fall back: no look-up)
            if why is not None:   # float64 on the CPU, complex, no f16 here...: torch's own kernel
                return _fallback.run(self, why, self._torch_base, x)
        try:
            return self._rawconv_forward(x)
        except NotSupportedError as exc:   # the library has no implementation of this problem, none pinned
            if not _fallback.library_refused(exc) or not _fallback.may_fall_back(self) or \
                    self.__dict__.get(_TUNED_ATTR) or type(x) not in _PLAIN_TENSORS:
                raise
            return _fallback.run(self, _fallback.unsupported_reason(exc), self._torch_base, x)

    def _rawconv_forward(self, x: torch.Tensor) -> torch.Tensor:
        d = self.__dict__
        if self.padding_mode == "zeros" and not _RECORDING and type(x) in _PLAIN_TENSORS and USE_OPS \
                and not torch.compiler.is_compiling():
            # the module's own argument pack: validated once per configuration (stride, padding,
            # dilation, groups, backend, choice, precision, backward choice, the weight's shape and
            # the input's device type), then rawconv.ops runs it as rawconv.ops.conv does; one per
            # thread (and OpenMP count), as rawconv.ops keeps its own: the plans it holds are not
            # thread-safe (a plan's memory handles are set per call). An autotuned module's choices
            # are those of this call's problem (its table, as the path below reads it)
            w = self.weight
            ch, bc = self.choice, self.backward_choice
            if d.get(_TUNED_ATTR) is not None:
                ch, bc = self._tuned_on_cast("conv", x, None, {"x": x, "padding": self.padding}, "conv_forward")
            # (a list argument as its values now: one changed in place after this call must not match)
            st, pd, dl = self.stride, self.padding, self.dilation
            if type(st) is list or type(pd) is list or type(dl) is list or type(bc) is list or \
                    (type(pd) is tuple and pd and type(pd[0]) is not int):   # (pairs, maybe lists)
                st, pd, dl, bc = _norm_padding(st), _norm_padding(pd), _norm_padding(dl), _norm_padding(bc)
            key = (st, pd, dl, self.groups, self.backend, ch, self.precision, bc, w.shape, x.is_cuda, x.is_cpu)
            ident = _get_ident()
            packs = d.get("_rawconv_entry")
            e = packs.get(ident) if packs is not None else None
            if e is None or e[0] != key:
                if packs is None or len(packs) >= 64:   # (threads come and go: past 64, start again)
                    packs = d["_rawconv_entry"] = {}
                e = packs[ident] = (key, self._entry(x, w, ch, bc))
            try:
                return (_OPS[0] or _load_ops())._conv_entry(x, w, self.bias, e[1])
            except Exception as exc:
                new = _guard.translate(exc, f"rawconv.nn.{type(self).__name__}.forward")
                if new is None:
                    raise
                raise new from exc
        x, padding = self._padded(x)
        _record(self, "conv", x=x, padding=padding)
        choice, bwd = self.choice, self.backward_choice
        if d.get(_TUNED_ATTR) is not None:
            choice, bwd = self._tuned_on_cast("conv", x, None, {"x": x, "padding": padding}, "conv_forward")
        return conv(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups,
                    backend=self.backend, choice=choice, precision=self.precision, backward_choice=bwd)

    def _entry(self, x, w, choice=None, backward_choice=None) -> list:
        """The argument pack of :func:`rawconv.ops._conv_entry` for this module's configuration
        with ``choice`` and ``backward_choice`` (the module's own, or those autotuned for the
        call's problem), checked as :func:`conv` checks its arguments (raises its errors)."""
        choice = _check_choice(choice, "choice")
        bwd = _check_choice(backward_choice, "backward_choice", pair=True)
        precision = _check_precision(self.precision)
        _check_backend(self.backend)
        _resolve_backend(self.backend, x.device)
        args = _load_ops()._prepare_conv(x, w, self.bias, self.stride, _norm_padding(self.padding), self.dilation,
                                           self.groups, self.backend, choice, precision, bwd)
        return _load_ops()._new_entry(args)

    def extra_repr(self) -> str:
        tuned = self.__dict__.get(_TUNED_ATTR)
        # what convert(autotune=...) pinned (per problem) when choice= itself is not set
        extra = f", tuned={[t.as_dict()['choice'] for t in tuned.values()]!r}" if tuned and self.choice is None else ""
        return (super().extra_repr() + f", backend={self.backend!r}, choice={self.choice!r}{extra}, "
                f"precision={self.precision!r}")


class _RawconvConvTranspose(_RawconvConv):
    _transposed = True

    def forward(self, x: torch.Tensor, output_size: Sequence[int] | None = None) -> torch.Tensor:
        if type(x) in _PLAIN_TENSORS and (x.dtype is not _F32 or not (x.is_cpu or x.is_cuda) or not self.in_channels):
            why = _fallback.reason_for(self, x)
            if why is not None:
                return _fallback.run(self, why, self._torch_base, x, output_size)
        try:
            return self._rawconv_forward(x, output_size)
        except NotSupportedError as exc:
            if not _fallback.library_refused(exc) or not _fallback.may_fall_back(self) or \
                    self.__dict__.get(_TUNED_ATTR) or type(x) not in _PLAIN_TENSORS:
                raise
            return _fallback.run(self, _fallback.unsupported_reason(exc), self._torch_base, x, output_size)

    def _rawconv_forward(self, x: torch.Tensor, output_size: Sequence[int] | None = None) -> torch.Tensor:
        if self.padding_mode != "zeros":
            raise ArgumentError(f"only 'zeros' padding mode is supported for {type(self).__name__}")
        nd = len(self.kernel_size)
        try:   # torch's own computation of output_padding from output_size, with torch's errors
            output_padding = self._output_padding(x, output_size, self.stride, self.padding, self.kernel_size, nd,
                                                  self.dilation)
        except ValueError as exc:   # an output_size no output_padding reaches, or of the wrong length
            raise ArgumentError(f"{type(self).__name__}: {exc}") from None
        except TypeError as exc:    # not a sequence of ints
            raise ArgumentTypeError(f"{type(self).__name__}: output_size must be a sequence of ints or None: "
                                    f"{exc}") from None
        _record(self, "transpose", x=x, output_padding=tuple(output_padding))
        choice, bwd = self.choice, self.backward_choice
        if self.__dict__.get(_TUNED_ATTR) is not None:
            choice, bwd = self._tuned_on_cast("transpose", x, tuple(output_padding),
                                              {"x": x, "output_padding": tuple(output_padding)}, "conv_backward_data")
        return conv_transpose(x, self.weight, self.bias, self.stride, self.padding, output_padding, self.groups,
                              self.dilation, backend=self.backend, choice=choice, precision=self.precision,
                              backward_choice=bwd)


def _module(base, mixin, doc: str):
    class Module(mixin, base):
        def __init__(self, *args, backend: str = "auto", choice: Any = None, backward_choice: Any = None,
                     precision: str | None = None, impl: Any = None, backward_impl: Any = None,
                     fpmath: str | None = None, fallback: str = "torch", **kwargs):
            base.__init__(self, *args, **kwargs)
            self._rawconv_init(backend, choice, backward_choice, precision, impl, backward_impl, fpmath, fallback)

    Module.__name__ = Module.__qualname__ = base.__name__
    Module.__module__ = __name__
    Module._torch_base = base
    Module.__doc__ = (f"``torch.nn.{base.__name__}`` on rawconv: same arguments and state_dict, plus ``backend`` "
                      "(\"auto\" | \"onednn\" | \"cudnn\"), ``choice``, ``backward_choice``, ``precision`` (old "
                      "names ``impl``, ``backward_impl``, ``fpmath``: DeprecationWarning), ``fallback`` (\"torch\": "
                      "a call no rawconv library can run, e.g. float64 on the CPU, runs torch's own kernel, said once "
                      "and counted, :mod:`rawconv.pytorch.fallback`; \"error\": refused). " + doc)
    return Module


_CONV_DOC = "Non-'zeros' padding modes pad in torch first."
_T_DOC = ("Runs as the backward-data primitive of the matching convolution; ``choice`` is a backward-data "
          "candidate; ``backward_choice`` a (forward choice for grad x, backward-weights choice) pair.")
Conv1d = _module(torch.nn.Conv1d, _RawconvConv, _CONV_DOC)
Conv2d = _module(torch.nn.Conv2d, _RawconvConv, _CONV_DOC)
Conv3d = _module(torch.nn.Conv3d, _RawconvConv, _CONV_DOC)
ConvTranspose1d = _module(torch.nn.ConvTranspose1d, _RawconvConvTranspose, _T_DOC)
ConvTranspose2d = _module(torch.nn.ConvTranspose2d, _RawconvConvTranspose, _T_DOC)
ConvTranspose3d = _module(torch.nn.ConvTranspose3d, _RawconvConvTranspose, _T_DOC)


class _ConvBiasAct(_RawconvConv):
    """Mixin: ``act(conv(x) + bias + residual)`` through :func:`rawconv.fused.conv_bias_act`."""

    def _fused_init(self, activation):
        self.activation = _fused.check_activation(activation)

    def _op_args(self):
        """(stride, padding, dilation) lists as the operator takes them (padding: nd symmetric
        values or 2*nd befores-then-afters), computed once per configuration."""
        key = (_norm_padding(self.stride), _norm_padding(self.padding), _norm_padding(self.dilation),
               self.padding_mode, self.kernel_size)   # (lists as their values now: see _RawconvConv.forward)
        cached = self.__dict__.get("_op_cache")
        if cached is not None and cached[0] == key:
            return cached[1]
        nd = len(self.kernel_size)
        if self.padding_mode != "zeros":
            pads = [0] * nd
        else:
            from ..core.problem import resolve_padding

            pb, pa = resolve_padding(_norm_padding(self.padding), nd, self.kernel_size,
                                     tuple_arg(self.dilation, nd, "dilation", 1), tuple_arg(self.stride, nd, "stride", 1))
            pads = list(pb) + (list(pa) if pa != pb else [])
        args = (list(self.stride), pads, list(self.dilation))
        self.__dict__["_op_cache"] = (key, args)
        return args

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if type(x) in _PLAIN_TENSORS and (x.dtype is not _F32 or not (x.is_cpu or x.is_cuda) or not self.in_channels):
            why = _fallback.reason_for(self, x)
            if why is not None:   # torch's convolution, then the BatchNorm, the add and the activation
                _fallback.note(self, why)
                y = self._torch_base._conv_forward(self, x, self.weight, self.bias)
                bn = self.__dict__.get(_fused.BN_KEY)
                y = bn(y) if bn is not None else y
                return _fused.apply_activation(y + residual if residual is not None else y, self.activation)
        x, padding = self._padded(x)
        stride, pads, dilation = self._op_args()
        w, b, d = self.weight, self.bias, self.__dict__
        bn = d.get(_fused.BN_KEY)
        st = d.get(_fused._FROZEN_STATE)
        recording = torch.is_grad_enabled() and (w.requires_grad or (b is not None and b.requires_grad) or (
            bn is not None and any(t is not None and t.requires_grad for t in (bn.weight, bn.bias))))
        compiling = torch.compiler.is_compiling()
        if recording and st is not None and not compiling:
            st.mark_stale()   # an update of the parameters usually follows a forward that records autograd
        frozen = st is not None and not recording and isinstance(w, torch.nn.Parameter)
        if bn is not None and (not frozen or bn.training):
            # a BatchNorm that cannot be folded now (autograd recording through it, batch statistics in
            # training mode, or no snapshot): the convolution, then the BatchNorm module itself, as before fusion
            return self._unfused(x, padding, residual)
        choice, bwd = self.choice, self.backward_choice
        plans = None
        if frozen:
            # frozen by convert(fuse=True): the snapshot (BatchNorm folded in), taken again first when
            # its sources changed; under torch.compile the operator's kernel does that check
            if compiling:
                w, b = self._buffers[_fused.FROZEN_WEIGHT], self._buffers[_fused.FROZEN_BIAS]
            else:
                if not st.fresh(w, b):
                    st.take(self)
                w, b = st.snap
                plans = st.plans
        if d.get(_TUNED_ATTR) is not None and (plans is None or choice is not None or not x.is_cpu):
            # (a frozen module's oneDNN plans resolve the autotuned choice once per problem, when the
            # plan is made: rawconv.fused._run_frozen, through _frozen_choice; no lookup per call)
            choice, bwd = self._tuned_on_cast("fused", x, residual is not None,
                                              {"x": x, "padding": padding, "residual": residual}, "conv_bias_act")
        if recording and bwd is not None:
            # pinned backward choices: the convolution operator carries them (the fused one has none)
            return self._unfused(x, padding, residual, bwd)
        if isinstance(choice, int) and not isinstance(choice, bool):
            choice = str(choice)
        if residual is not None and not self._residual_fits(x, residual, stride, pads, dilation):
            # a residual that only broadcasts (or of another dtype/device): added in torch, as the
            # graph before fusion did
            y = torch.ops.rawconv.conv_bias_act(x, w, b, None, stride, pads, dilation, self.groups,
                                                "none", self.backend, None, self.precision)
            y = y + residual
            return _fused.apply_activation(y, self.activation)
        if _RECORDING:
            _record(self, "fused", x=x, padding=padding, residual=residual, w=w, b=b)
        if not isinstance(x, torch.Tensor):
            raise ArgumentTypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        eager = type(x) is torch.Tensor and not compiling and not _autocasting() and not (torch.is_grad_enabled() and (
            x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)
            or (residual is not None and residual.requires_grad))) and not _functorch() and not _has_tangent(x, residual)
        unfused = d.get(_fusion.UNFUSED_ATTR)
        if unfused and not recording and self.choice is None and not _autocasting():
            # convert(fuse=True, autotune=x) measured this problem faster unfused: the convolution with
            # its bias, then torch's own add and activation (rawconv.pytorch.fusion); a choice set on
            # the module itself (pin_choices) names a fused implementation and runs it
            key = _sig_of("fused", x, self.weight, residual is not None)
            c = unfused.get(key)
            if c is not None:
                if x.is_cpu and (d.get(_UNFUSED_OFFERED_ON) or {}).get(key) != _onednn_here():
                    # (measured on another CPU or oneDNN: a saved model loaded here)
                    c = _unfused_offered_here(self, key, c, {"x": x, "padding": padding, "w": w, "b": b})
                return _fusion.run_unfused(self, x, w, b, residual, stride, pads, dilation, c, plans, eager)
        if eager:
            # (a torch.func transform's batched tensors have no data pointer; a forward-mode tangent
            # would be dropped: both go through the operator, which runs or refuses them)
            # eager inference: the operator's kernel directly (the dispatcher's round trip costs host time)
            return _fused._op_kernel(x, w, b, residual, stride, pads, dilation, self.groups,
                                     self.activation, self.backend, choice, self.precision,
                                     d.get("residual_inplace", False), plans)
        if residual is not None and d.get("residual_inplace", False) and _fused.RESIDUAL_OP_GUARDED \
                and isinstance(x, torch.Tensor) and not _autocasting() \
                and x.device.type == "cpu" and not (torch.is_grad_enabled() and (
                    x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)
                    or residual.requires_grad)):
            # inference through the operator (torch.compile, a mode): the in-place form, so that
            # the residual is not copied into a new output first (convert marked it safe: a fresh
            # intermediate nothing reads afterwards)
            torch.ops.rawconv.conv_bias_act_residual_(x, w, b, residual, stride, pads, dilation, self.groups,
                                                      self.activation, self.backend, choice, self.precision)
            return residual
        return torch.ops.rawconv.conv_bias_act(x, w, b, residual, stride, pads, dilation,
                                               self.groups, self.activation, self.backend, choice, self.precision)

    def _unfused(self, x, padding, residual, bwd=None):
        """``act(bn(conv(x)) + residual)`` as separate calls: the convolution on rawconv's operator
        (differentiable; ``bwd``: the backward choices, else those autotuned for this problem), the
        BatchNorm module itself (batch statistics in training mode, its running statistics
        updated as torch's), the add and the activation in torch."""
        choice, tuned_bwd = self.choice, self.backward_choice
        if self.__dict__.get(_TUNED_ATTR) is not None:
            c = self._cast_for(x, "conv_forward")   # (under autocast: the cast problem's choices)
            choice, tuned_bwd = self._tuned_cast("conv", x, None, {"x": x, "padding": padding}, c)
            if tuned_bwd is None:   # the fused problem's backward passes are this convolution's
                key = _sig_of("fused", x if c is None else c[0], self.weight if c is None else c[1],
                              residual is not None)
                t = self.__dict__[_TUNED_ATTR].get(key) if key is not None else None
                tuned_bwd = t.backward_choice if t is not None else None
        y = conv(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups, backend=self.backend,
                 choice=choice, precision=self.precision, backward_choice=bwd if bwd is not None else tuned_bwd)
        bn = self.__dict__.get(_fused.BN_KEY)
        if bn is not None:
            y = bn(y)
        if residual is not None:
            y = y + residual
        return _fused.apply_activation(y, self.activation)

    def _frozen_choice(self, x, residual):
        """The forward choice of a frozen module's new oneDNN plan for this (padded) input: the
        autotuned one of the problem (searched now with ``autotune_new="search"``), else ``choice``."""
        if self.__dict__.get(_TUNED_ATTR) is None:
            return self.choice
        padding = 0 if self.padding_mode != "zeros" else self.padding
        choice, _ = self._tuned_for("fused", x, residual is not None,
                                    {"x": x, "padding": padding, "residual": residual}, self.weight)
        return str(choice) if isinstance(choice, int) and not isinstance(choice, bool) else choice

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        _fused.rebind(self)   # .to()/.half(): new snapshot buffers, taken again from the converted sources
        return out

    def __setstate__(self, state):
        super().__setstate__(state)
        _fused.rebind(self)   # a copy or an unpickled module: its own state, the snapshot taken again

    def _residual_fits(self, x, r, stride, pads, dilation) -> bool:
        if not isinstance(r, torch.Tensor) or not isinstance(x, torch.Tensor) or r.dtype != x.dtype \
                or r.device != x.device:
            return False
        if x.dim() not in (self.weight.dim(), self.weight.dim() - 1):
            return True   # let the fused call raise the clear error
        shape, _, _ = _fused._out_meta(x, self.weight, stride, pads, dilation)
        return tuple(r.shape) == tuple(shape)

    @classmethod
    def from_conv(cls, conv: torch.nn.Module, *, activation: str = "relu", bn: torch.nn.Module | None = None,
                  backend: str | None = None, choice: Any = None, precision: str | None = None):
        """A fused module from a ``torch.nn.Conv{1,2,3}d`` (its parameters, shared, and never
        changed). ``bn``: a BatchNorm with running statistics that follows the convolution; the
        module then computes ``act(bn(conv(x)) + residual)``: with the BatchNorm folded into the
        weight snapshot once frozen (:func:`rawconv.fused.freeze`, as :func:`convert` does; the
        fold is taken again from the conv's and the BatchNorm's tensors whenever they change), else,
        and whenever the BatchNorm is in training mode or autograd records, as the convolution
        followed by the BatchNorm module itself. The BatchNorm stays where it is (its state_dict
        entries too): the module only refers to it. Backend/choice/precision default to the
        conv's when it is a rawconv module."""
        if bn is not None:
            _check_bn(conv, bn)
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.__dict__.update({k: v for k, v in conv.__dict__.items() if k not in _NOT_COPIED})
        new._parameters = dict(conv._parameters)
        new._buffers = {k: v for k, v in conv._buffers.items() if k not in (_fused.FROZEN_WEIGHT, _fused.FROZEN_BIAS)}
        new._modules = dict(conv._modules)
        if bn is not None:
            new.__dict__[_fused.BN_KEY] = bn
        old = conv if isinstance(conv, _RawconvConv) else None
        new._rawconv_init(backend if backend is not None else (old.backend if old else "auto"),
                          choice if choice is not None else (old.choice if old else None),
                          old.backward_choice if old else None,
                          precision if precision is not None else (old.precision if old else "strict"))
        new._fused_init(activation)
        return new

    def extra_repr(self) -> str:
        return super().extra_repr() + f", activation={self.activation!r}"


def _fused_module(base, name):
    class Module(_ConvBiasAct, base):
        def __init__(self, *args, activation: str = "relu", backend: str = "auto", choice: Any = None,
                     precision: str = "strict", **kwargs):
            base.__init__(self, *args, **kwargs)
            self._rawconv_init(backend, choice, None, precision)
            self._fused_init(activation)

    Module.__name__ = Module.__qualname__ = name
    Module.__module__ = __name__
    Module._torch_base = base
    Module.__doc__ = (f"``activation(conv(x) + bias + residual)`` as ONE library call: a ``torch.nn.{base.__name__}`` "
                      "(same constructor and state_dict) plus ``activation`` (one of rawconv.fused.ACTIVATIONS: "
                      "\"relu\", \"relu6\", \"silu\", \"gelu\", \"gelu_tanh\", \"hardswish\", \"hardsigmoid\", "
                      "\"sigmoid\", \"tanh\", \"none\"), ``backend``, ``choice``, ``precision``; "
                      "``forward(x, residual=None)``. CPU: oneDNN post-ops (sum, eltwise); CUDA: one cuDNN graph "
                      "(hardswish and hardsigmoid in torch after it). Differentiable once (meant for inference).")
    return Module


ConvBiasAct1d = _fused_module(torch.nn.Conv1d, "ConvBiasAct1d")
ConvBiasAct2d = _fused_module(torch.nn.Conv2d, "ConvBiasAct2d")
ConvBiasAct3d = _fused_module(torch.nn.Conv3d, "ConvBiasAct3d")

_TORCH_CONVS = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
_TORCH_TRANSPOSED = (torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)
_SWAP = {torch.nn.Conv1d: Conv1d, torch.nn.Conv2d: Conv2d, torch.nn.Conv3d: Conv3d,
         torch.nn.ConvTranspose1d: ConvTranspose1d, torch.nn.ConvTranspose2d: ConvTranspose2d,
         torch.nn.ConvTranspose3d: ConvTranspose3d}
_FUSED = {1: ConvBiasAct1d, 2: ConvBiasAct2d, 3: ConvBiasAct3d}
_BATCHNORMS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)


# ---------------------------------------------------------------------------- convert
@dataclass
class ConvertReport:
    """What :func:`convert` did: ``swapped`` (module names now on rawconv), ``folded`` (conv, batchnorm
    pairs), ``fused`` (module name -> "relu" / "add+relu" / "add" / "bias"), ``traced`` (whether torch.fx
    traced the model; False: module-level fusion only, ``trace_error`` says why), ``tuned`` (one dict
    per conv layer: name, kind, problem, backend, choice, searched, seconds, note; for a searched one
    also the winner's ``median_ms`` / ``min_ms`` (GPU or wall ms per call) and, on cuDNN, ``plan_s``
    (seconds to set up the plan: graph, heuristics) and ``search_s`` (the autotune's own seconds)),
    ``autotune_s`` (wall seconds of the search), ``backward`` (whether the backward passes were
    searched too: ``autotune_backward``), ``autotune_new`` (what a problem the example did not
    show runs: ``"default"`` or ``"search"``). Each ``tuned`` entry (one per layer and distinct
    problem) also holds ``backward_choice`` (the pair pinned for its backward passes, None: the
    libraries' defaults), ``directions`` (every pinned choice by library direction) and
    ``backward_searched``.

    ``fusion`` (module name -> dict; ``fuse=True`` with ``autotune=``, oneDNN layers): whether the
    fused call was measured faster than the same convolution with only its bias fused followed by
    torch's own add and activation (:func:`rawconv.pytorch.fusion.measure_cpu`): ``decision``
    (``"fused"`` / ``"unfused"``), ``fused_ms`` / ``unfused_ms`` (median ms per call over the
    rounds), ``fused_min_ms`` / ``unfused_min_ms``, ``rounds``, ``reason``, ``fused_choice`` /
    ``unfused_choice``, ``measured`` (False: the decision of an earlier layer of the same problem);
    or ``{"decision": ..., "reason": ...}`` where it was not measured here (cuDNN layers: their graph
    autotune's choice, an ``"unfused:"`` config or a fused one; nothing to unfuse). ``fusion_measured``: False when ``fuse=True`` had no example input to measure on
    (every fusable layer fused, as before).

    ``fallback`` (layer name -> reason): the layers whose calls run on torch's own kernel because no
    rawconv library can run them (their parameters' dtype or device: float64 on the CPU, a
    float16 model where this CPU's oneDNN has no float16...; or seen so during the autotune's
    example run): :mod:`rawconv.pytorch.fallback`.

    ``left_on_torch`` (layer name -> reason): the conv modules convert did not put on rawconv: a
    subclass of torch's conv class that computes its own way (its own ``forward``,
    ``_conv_forward`` or ``_output_padding``: timm's ``StdConv2d``, ``Conv2dSame``); a
    ``RuntimeWarning`` names them too."""

    swapped: list = field(default_factory=list)
    folded: list = field(default_factory=list)
    fused: dict = field(default_factory=dict)
    traced: bool | None = None
    trace_error: str = ""
    tuned: list = field(default_factory=list)
    autotune_s: float = 0.0
    backward: bool = False
    autotune_new: str = "default"
    timing_warnings: list = field(default_factory=list)   # each search's TimingWarning text (a busy machine)
    fusion: dict = field(default_factory=dict)
    fusion_measured: bool | None = None
    fallback: dict = field(default_factory=dict)   # layer name -> why its calls run on torch's own kernel
    left_on_torch: dict = field(default_factory=dict)   # layer name -> why convert left that conv module alone

    def __str__(self) -> str:
        n = len(self.tuned)
        distinct = len({t["key"] for t in self.tuned})
        searched = sum(1 for t in self.tuned if t["searched"])
        lines = [f"rawconv.nn.convert: {len(self.swapped)} conv modules on rawconv, {len(self.folded)} BatchNorms "
                 f"folded, {len(self.fused)} fused ({', '.join(sorted(set(self.fused.values()))) or 'none'})"]
        if self.traced is False:
            lines.append(f"  torch.fx could not trace the model ({self.trace_error}): module-level fusion only")
        if self.left_on_torch:
            names = list(self.left_on_torch)
            lines.append(f"  {len(names)} conv module(s) left on torch (a subclass with its own forward): "
                         f"{', '.join(names[:6])}{', ...' if len(names) > 6 else ''}")
        if self.fallback:
            by: dict = {}
            for name, why in self.fallback.items():
                by.setdefault(why, []).append(name or "(the model)")
            for why, names in by.items():
                lines.append(f"  {len(names)} layer(s) run on torch's own kernel: {why} ({', '.join(names[:6])}"
                             f"{', ...' if len(names) > 6 else ''})")
        if n:
            lines.append(f"  autotune: {n} layers, {distinct} distinct problems, {searched} searched, "
                         f"{self.autotune_s:.2f} s")
            if self.backward:
                bs = sum(1 for t in self.tuned if t.get("backward_searched"))
                lines.append(f"  backward passes (data, weights) pinned per problem too; {bs} layers searched new "
                             "backward problems")
            else:
                lines.append("  backward passes not searched (autotune_backward=False): the libraries' defaults")
            lines.append("  other problems (batch size, layout, dtype, size) than the example's: "
                         + ("searched at their first call" if self.autotune_new == "search"
                            else "the libraries' defaults (autotune_new='search' searches them)"))
            vs = [t for t in self.tuned if t.get("searched") and t.get("vs_torch")]
            if vs:
                g = math.exp(sum(math.log(t["vs_torch"]) for t in vs) / len(vs))
                worst = min(vs, key=lambda t: t["vs_torch"])
                slow = sum(1 for t in vs if t["vs_torch"] < 0.97)
                lines.append(f"  against torch's own call (cudnn.benchmark on), GPU time, {len(vs)} searched problems: "
                             f"geomean {g:.3f}x (torch / rawconv), {slow} more than 3% slower than torch, worst "
                             f"{worst['vs_torch']:.3f}x ({worst['name']}: rawconv {worst['choice']}, torch "
                             f"{worst.get('torch_engine', '?')}); per layer: report.table()")
        lines += self._fusion_lines()
        return "\n".join(lines)

    def table(self) -> str:
        """One line per searched layer: what rawconv runs, what torch ran (its cuDNN engine, with
        ``cudnn.benchmark`` on), both GPU times and their ratio (torch / rawconv), and any note."""
        rows = [f"{'layer':<28} {'kind':<6} {'rawconv runs':<34} {'torch runs':<11} {'rawconv ms':>10} "
                f"{'torch ms':>9} {'ratio':>6}"]
        for t in self.tuned:
            if not t.get("searched"):
                continue
            ratio = t.get("vs_torch")
            rows.append(f"{t['name'][:28]:<28} {t['kind']:<6} {str(t['choice'])[:34]:<34} "
                        f"{str(t.get('torch_engine', '-')):<11} "
                        f"{t.get('rawconv_ms', float('nan')):>10.4f} {t.get('torch_ms', float('nan')):>9.4f} "
                        f"{(f'{ratio:.3f}' if ratio else '-'):>6}"
                        + (f"  {t['vs_torch_note']}" if t.get("vs_torch_note") else ""))
        return "\n".join(rows)

    def _fusion_lines(self) -> list:
        if self.fused and self.fusion_measured is False:
            return ["  fusion not measured (no example input; convert(..., autotune=x) keeps a fused layer only "
                    "where it is measured faster): every fusable layer fused"]
        if not self.fusion_measured:
            return []
        timed = [k for k, e in self.fusion.items() if "fused_ms" in e]
        unf = [k for k in timed if self.fusion[k]["decision"] == "unfused"]
        out = [f"  fusion measured on {len(timed)} layers (fused vs conv + bias, then torch's add and activation): "
               f"{len(timed) - len(unf)} kept fused, {len(unf)} unfused"]
        out += [f"    {k}: unfused: {self.fusion[k].get('reason', '')}" for k in unf]
        return out


def _plain_subclass_base(t: type):
    """The torch conv class ``t`` subclasses without changing how it computes (no ``forward``,
    ``_conv_forward`` or ``_output_padding`` of its own, not rawconv's: torchvision's
    ``Conv3DSimple``, which r3d_18 is made of), else None."""
    if t in _SWAP or issubclass(t, _RawconvConv):
        return None
    for base in _SWAP:
        if issubclass(t, base):
            same = all(getattr(t, a, None) is getattr(base, a, None) for a in ("forward", "_conv_forward",
                                                                                 "_output_padding"))
            return base if same else None
    return None


_SUBCLASS_PREFIX = "_Rawconv__"


def _subclass_name(t: type) -> str:
    """An importable name in this module for the rawconv twin of a plain subclass ``t`` (the name
    says where ``t`` lives, so that an unpickling process can make the class again)."""
    return _SUBCLASS_PREFIX + f"{t.__module__}.{t.__qualname__}".replace("_", "_u").replace(".", "_d")


def _subclass_twin(t: type, base: type) -> type:
    """The rawconv twin of ``t`` (a plain subclass of torch's ``base``), made once: a subclass of
    both rawconv's class for ``base`` and ``t`` (``isinstance(m, t)`` still holds, ``t``'s other
    methods stay), computing as rawconv's class; registered in this module so that pickles find it."""
    name = _subclass_name(t)
    cls = globals().get(name)
    if cls is None:
        cls = type(t.__name__, (_SWAP[base], t), {"__module__": __name__, "__qualname__": name,
                                                  "__doc__": f"{t.__module__}.{t.__qualname__} on rawconv "
                                                             f"(as {_SWAP[base].__name__})"})
        globals()[name] = cls
    return cls


def __getattr__(name: str):   # an unpickled model's subclass twin, made again in a fresh process
    if name.startswith(_SUBCLASS_PREFIX):
        import importlib

        path = name[len(_SUBCLASS_PREFIX):].replace("_d", ".").replace("_u", "_")
        mod, _, qual = path.rpartition(".")
        for cut in range(path.count(".")):   # the module part is the longest importable prefix
            try:
                t = importlib.import_module(mod)
                for part in qual.split("."):
                    t = getattr(t, part)
                base = _plain_subclass_base(t) if isinstance(t, type) else None
                if base is not None:
                    return _subclass_twin(t, base)
                break
            except (ImportError, AttributeError):
                mod, _, head = mod.rpartition(".")
                qual = f"{head}.{qual}"
                if not mod:
                    break
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _swap_class(m: torch.nn.Module):
    """The rawconv class ``m`` becomes, or None: an exact torch conv class's twin, or a plain
    subclass's (:func:`_subclass_twin`)."""
    cls = _SWAP.get(type(m))
    if cls is not None:
        return cls
    base = _plain_subclass_base(type(m))
    return None if base is None else _subclass_twin(type(m), base)


def _swap_module(m: torch.nn.Module, backend, choice, precision) -> torch.nn.Module:
    """``m`` (a torch conv class, or a plain subclass of one: :func:`_swap_class`) as the rawconv
    class, sharing its parameters and buffers."""
    cls = _swap_class(m)
    new = cls.__new__(cls)
    new.__dict__.update(m.__dict__)
    new._rawconv_init(backend, choice, None, precision)
    return new


def _set_submodule(root: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, module)


def _choice_for(choice, name: str):
    if isinstance(choice, dict):
        return choice.get(name)
    if callable(choice):
        return choice(name)
    return choice


# what a fused module does not take over from the conv it is made from (its own state, its tables)
_NOT_COPIED = ("_parameters", "_buffers", "_modules", "_rawconv_tuned", "_rawconv_autotune_new",
               _fused._FROZEN_STATE, _fused._FROZEN_PLANS, _fused.BN_KEY, "residual_inplace")


def _check_bn(conv: torch.nn.Module, bn: torch.nn.Module) -> None:
    """Raise ArgumentError unless ``bn`` can be folded after ``conv`` (a BatchNorm of the conv's
    spatial rank over its output channels, with running statistics)."""
    nd = conv.weight.dim() - 2
    if type(bn) not in _BATCHNORMS or _BATCHNORMS.index(type(bn)) != nd - 1:
        raise ArgumentError(f"bn must be a torch.nn.BatchNorm{nd}d after a {nd}-d convolution, got {type(bn).__name__}")
    if bn.running_mean is None or bn.running_var is None:
        raise ArgumentError(f"{type(bn).__name__} without running statistics cannot be folded")
    if bn.num_features != conv.out_channels:
        raise ArgumentError(f"{type(bn).__name__}({bn.num_features}) does not match the convolution's "
                            f"{conv.out_channels} output channels")


def _foldable_bn(conv, bn) -> bool:
    try:
        _check_bn(conv, bn)
    except ArgumentError:
        return False
    return not bn.training


def _fusable_conv(m) -> bool:
    """A forward conv whose forward is torch's or rawconv's (not a user subclass that computes its
    own way, not fused yet)."""
    t = type(m)
    if t in _TORCH_CONVS or t in (Conv1d, Conv2d, Conv3d):
        return True
    base = _plain_subclass_base(t)
    if base is not None:
        return base in _TORCH_CONVS
    return isinstance(m, (Conv1d, Conv2d, Conv3d)) and not isinstance(m, _ConvBiasAct) and \
        t.__qualname__.startswith(_SUBCLASS_PREFIX)


_ADD_FUNCS = (operator.add, operator.iadd, torch.add)


def _add_other(node, src):
    """The other operand when ``node`` is ``src + other`` (tensor, no alpha), else None."""
    import torch.fx as fx

    if node.kwargs:
        return None
    is_add = (node.op == "call_function" and node.target in _ADD_FUNCS) or \
             (node.op == "call_method" and node.target in ("add", "add_"))
    if not is_add or len(node.args) != 2:
        return None
    a, b = node.args
    other = b if a is src else a if b is src else None
    if other is None or other is src or not isinstance(other, fx.Node):
        return None
    return other


def _depends_on(node, target) -> bool:
    import torch.fx as fx

    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n is target:
            return True
        if n in seen:
            continue
        seen.add(n)
        todo.extend(a for a in n.all_input_nodes if isinstance(a, fx.Node))
    return False


def _fuse_fx(model, report: ConvertReport, backend, choice, precision):
    """torch.fx pattern rewrite: conv -> BatchNorm folded; conv [-> add(residual)] [-> activation] as one
    ConvBiasAct module (the activations of :func:`rawconv.pytorch.fusion.activation_of_node`).
    Returns the GraphModule."""
    import torch.fx as fx

    class Tracer(fx.Tracer):
        # rawconv's own modules are calls to keep (a model converted before): fx must not trace into
        # their forward, which checks its input is a real tensor
        def is_leaf_module(self, m, qualname):   # (and plain subclasses of torch's convs: convert swaps them)
            return isinstance(m, _RawconvConv) or _plain_subclass_base(type(m)) is not None or \
                super().is_leaf_module(m, qualname)

    tracer = Tracer()
    graph = tracer.trace(model)
    gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
    modules = dict(gm.named_modules())
    graph = gm.graph
    calls: dict = {}
    for n in graph.nodes:
        if n.op == "call_module":
            calls[n.target] = calls.get(n.target, 0) + 1

    def fusable(n) -> bool:   # a conv node that the second pass makes one fused module
        m = modules.get(n.target) if n.op == "call_module" else None
        return (m is not None and _fusable_conv(m) and m.weight.dim() - 2 in _FUSED and calls[n.target] == 1
                and len(n.args) == 1 and not n.kwargs)

    # nn.Identity calls (timm's drop_block / aa / drop_path placeholders between a BatchNorm and its
    # activation) compute nothing: dropped, so that the chain around them fuses as torch's freezing fuses it
    for n in list(graph.nodes):
        if n.op == "call_module" and type(modules.get(n.target)) is torch.nn.Identity and len(n.args) == 1 \
                and not n.kwargs and isinstance(n.args[0], fx.Node):
            n.replace_all_uses_with(n.args[0])
            graph.erase_node(n)
    bns = _fold_batchnorms_fx(graph, modules, calls, fusable, report)
    _fuse_chains_fx(gm, modules, fusable, bns, report, backend, choice, precision)
    _mark_inplace_residuals(graph, modules)
    graph.lint()
    gm.recompile()
    gm.delete_all_unused_submodules()   # activations no longer called
    for bn_name, bn in bns.values():   # the folded BatchNorms stay, where they were: state_dict as the model's
        gm.add_submodule(bn_name, bn)
    return gm


def _fold_batchnorms_fx(graph, modules: dict, calls: dict, fusable, report: ConvertReport) -> dict:
    """:func:`_fuse_fx`'s first pass over ``graph`` (``modules``: the graph module's modules by name;
    ``calls``: how often each is called; ``fusable``: whether a conv node will be fused): each
    BatchNorm node after a conv that will be fused goes, recorded in ``report.folded``. Returns
    ``{conv name: (BatchNorm name, BatchNorm module)}``."""
    import torch.fx as fx

    # BatchNorm after a conv that will be fused: its node goes, the module stays (its state_dict
    # entries too) and the fused module folds it into its weight snapshot when frozen
    bns: dict = {}
    for node in list(graph.nodes):
        if node.op != "call_module" or type(modules.get(node.target)) not in _BATCHNORMS or len(node.args) != 1 \
                or node.kwargs:
            continue
        src = node.args[0]
        if not (isinstance(src, fx.Node) and fusable(src) and len(src.users) == 1 and calls[node.target] == 1):
            continue
        bn = modules[node.target]
        if not _foldable_bn(modules[src.target], bn):
            continue
        bns[src.target] = (node.target, bn)
        node.replace_all_uses_with(src)
        graph.erase_node(node)
        report.folded.append((src.target, node.target))
    return bns


def _fuse_chains_fx(gm, modules: dict, fusable, bns: dict, report: ConvertReport, backend, choice, precision) -> None:
    """:func:`_fuse_fx`'s second pass over ``gm``'s graph: each fusable conv node, with the residual
    add and activation after it, becomes one call of a fused module (its BatchNorm from ``bns`` folded
    in) set in ``gm`` and ``modules``, recorded in ``report.fused``. Returns None."""
    graph = gm.graph
    # conv [+ residual] [activation] -> one module
    erased = set()
    for node in list(graph.nodes):
        if node in erased or not fusable(node):
            continue
        conv_m = modules[node.target]
        last, residual, act, kind, add_node = node, None, "none", [], None
        users = list(node.users)
        if len(users) == 1:
            other = _add_other(users[0], node)
            if other is not None and not _depends_on(other, node):
                residual, last, add_node = other, users[0], users[0]
                kind.append("add")
        nxt = list(last.users)
        a = _fusion.activation_of_node(nxt[0], modules) if len(nxt) == 1 else None
        if a is not None and nxt[0].args[0] is last:
            act, last = a, nxt[0]
            kind.append(a)
        name = node.target
        fused = _FUSED[conv_m.weight.dim() - 2].from_conv(
            conv_m, activation=act, bn=bns.get(name, (None, None))[1], backend=backend,
            choice=_choice_for(choice, name), precision=precision)
        _set_submodule(gm, name, fused)
        modules[name] = fused
        with graph.inserting_before(last):
            new = graph.call_module(name, (node.args[0],) + ((residual,) if residual is not None else ()))
        last.replace_all_uses_with(new)
        # erase the pattern's nodes, last first
        chain = [node] + ([add_node] if add_node is not None else []) + ([last] if act != "none" else [])
        for n in reversed(chain):
            graph.erase_node(n)
            erased.add(n)
        report.fused[name] = "+".join(kind) or "bias"


def _mark_inplace_residuals(graph, modules) -> None:
    """Let a fused module write its result into its residual's memory (eager inference on oneDNN:
    no copy of the residual into a new output) where that is safe: the residual is the fresh
    output of another fused module (not an input, parameter or view), and every other use of it
    comes earlier in the graph, as does every use of what may alias it (a view, ``.contiguous()``,
    a chunk: any node but a fused module that takes it as its input, transitively)."""
    order = {n: i for i, n in enumerate(graph.nodes)}

    def read_after(r, node) -> bool:
        stack, seen = [r], {r}
        while stack:
            t = stack.pop()
            for u in t.users:
                if u is node:
                    continue
                if order[u] > order[node]:
                    return True
                um = modules.get(u.target) if u.op == "call_module" else None
                fresh = isinstance(um, _ConvBiasAct) and u.args[0] is t and t not in u.args[1:]
                if not fresh and u not in seen:   # its result may be a view of r: its users read r
                    seen.add(u)
                    stack.append(u)
        return False

    for node in graph.nodes:
        m = modules.get(node.target) if node.op == "call_module" else None
        if not isinstance(m, _ConvBiasAct) or len(node.args) != 2:
            continue
        r = node.args[1]
        producer = modules.get(r.target) if getattr(r, "op", None) == "call_module" else None
        if isinstance(producer, _ConvBiasAct) and not read_after(r, node):
            m.residual_inplace = True


_GEOMETRY = ("stride", "padding", "dilation", "groups", "padding_mode")   # a conv's, copied into its fused module
_HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
               "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
               "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


class _FusedSequential(torch.nn.Sequential):
    """An ``nn.Sequential`` whose Conv -> BatchNorm -> activation runs are computed by fused modules when
    the Sequential itself is called (what :func:`convert` does where torch.fx cannot trace the
    model). Its children are not touched: a child called on its own (``self.seq[0](x)``) or from
    elsewhere (a shared module) computes as before, and the fused path reads the children's own
    parameters and BatchNorm. When the children are no longer those fused (replaced, inserted,
    removed, parametrized), one of a run carries hooks, or a fused convolution's geometry
    (stride, padding, dilation, groups, padding_mode) is no longer its fused module's, the
    Sequential runs as torch's."""

    def forward(self, input):
        plan = self.__dict__.get("_rawconv_plan")
        if plan is None:
            return super().forward(input)
        members, types, steps, watched, pairs = plan
        mods = tuple(self._modules.values())
        if mods != members or tuple(map(type, mods)) != types or any(
                getattr(m, h) for m in watched for h in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                                                         "_backward_pre_hooks")) or any(
                getattr(c, a) != getattr(f, a) for c, f in pairs for a in _GEOMETRY):
            return super().forward(input)
        for step in steps:
            input = step(input)
        return input

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        for h in self.fused_modules():
            _fused.rebind(h)   # the children's tensors moved: the fused modules' snapshots are taken again
        return out

    def fused_modules(self) -> list:
        """The fused modules of this Sequential's runs (not registered as its children)."""
        plan = self.__dict__.get("_rawconv_plan")
        return [st for st in plan[2] if isinstance(st, _ConvBiasAct) and st.__dict__.get("_rawconv_helper")] \
            if plan else []


def _fuse_sequential(model, report: ConvertReport, backend, choice, precision) -> None:
    """Module-level fusion where torch.fx cannot trace: each ``nn.Sequential`` with Conv ->
    BatchNorm -> activation runs becomes a :class:`_FusedSequential` (its class swapped in place; its
    children, and so the state_dict, unchanged) that computes each run as one fused module when the
    Sequential is called as a whole. The convolutions of those runs are swapped to rawconv's."""
    for seq_name, seq in list(model.named_modules()):
        if type(seq) is not torch.nn.Sequential:
            continue
        keys = list(seq._modules)
        steps, watched, pairs, found = [], [], [], False
        i = 0
        while i < len(keys):
            m = seq._modules[keys[i]]
            full = f"{seq_name}.{keys[i]}" if seq_name else keys[i]
            if _fusable_conv(m) and m.weight.dim() - 2 in _FUSED:
                if _swap_class(m) is not None:
                    m = seq._modules[keys[i]] = _swap_module(m, backend, _choice_for(choice, full), precision)
                j, bn, act = i + 1, None, "none"
                if j < len(keys) and type(seq._modules[keys[j]]) in _BATCHNORMS and \
                        _foldable_bn(m, seq._modules[keys[j]]):
                    bn = seq._modules[keys[j]]
                    report.folded.append((full, f"{seq_name}.{keys[j]}" if seq_name else keys[j]))
                    j += 1
                a = _fusion.activation_of_module(seq._modules[keys[j]]) if j < len(keys) else None
                if a is not None:
                    act = a
                    j += 1
                helper = _FUSED[m.weight.dim() - 2].from_conv(m, activation=act, bn=bn, backend=backend,
                                                              choice=_choice_for(choice, full), precision=precision)
                helper._parameters = m._parameters   # the conv's own dict: a parameter replaced there is seen
                for h in _HOOK_DICTS:
                    if h in helper.__dict__:
                        helper.__dict__[h] = type(helper.__dict__[h])()
                helper.__dict__["_rawconv_helper"] = full + "(fused)"
                steps.append(helper)
                pairs.append((m, helper))
                watched += [seq._modules[k] for k in keys[i:j]]
                report.fused[full] = act if act != "none" else "bias"
                found = True
                i = j
                continue
            steps.append(m)
            i += 1
        if found:
            mods = tuple(seq._modules.values())
            seq.__class__ = _FusedSequential
            seq.__dict__["_rawconv_plan"] = (mods, tuple(map(type, mods)), steps, watched, tuple(pairs))


def _fused_modules(model) -> list:
    """(name, module) of every fused module of ``model``: its ConvBiasAct modules and the fused
    modules of its :class:`_FusedSequential` runs (named after their conv, ``"(fused)"`` added)."""
    out = []
    for name, m in model.named_modules():
        if isinstance(m, _ConvBiasAct):
            out.append((name, m))
        if isinstance(m, _FusedSequential):
            out += [(h.__dict__["_rawconv_helper"], h) for h in m.fused_modules()]
    return out


def _conv_modules(model) -> dict:
    """{name: module} of every rawconv convolution module of ``model``, the fused modules of its
    :class:`_FusedSequential` runs included."""
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, _RawconvConv):
            out[name] = m
        if isinstance(m, _FusedSequential):
            out.update((h.__dict__["_rawconv_helper"], h) for h in m.fused_modules())
    return out


def convert(model: torch.nn.Module, *, inplace: bool = False, backend: str = "auto", choice: Any = None,
            precision: str = "strict", autotune: Any = None, fuse: bool = False, example_input: Any = None,
            autotune_budget_s: float | None = None, autotune_backward: bool | None = None,
            autotune_new: str = "default") -> torch.nn.Module:
    """Run every convolution of ``model`` on rawconv, keeping its weights.

    Every ``torch.nn.Conv1d/2d/3d`` and ``ConvTranspose1d/2d/3d`` becomes the :mod:`rawconv.nn`
    module of the same class family, sharing parameters and buffers (``state_dict`` keys
    unchanged). A subclass that computes as torch's class (no ``forward`` or ``_conv_forward`` of
    its own, e.g. torchvision's ``Conv3DSimple``) becomes a subclass of both (``isinstance`` with
    the user's class holds, pickles find it); subclasses with their own forward are left alone
    (named in ``report.left_on_torch`` and by a ``RuntimeWarning``). ``inplace=False``
    converts a deep copy. ``backend``, ``precision``: for every layer; ``choice``: one value for
    every layer (a training step: a :class:`rawconv.ops.TrainingChoice`), a dict {module name:
    choice} (every key a convolution module's name: :class:`ArgumentError` otherwise) or a
    callable(name) -> choice. A weight computed by a ``torch.nn.utils.parametrize``
    parametrization is not computed by convert, :func:`pinned_choices` or ``.to()`` (only by the
    module's forward, as torch's): ``spectral_norm``'s power iteration leaves its buffers alone.

    ``fuse=True`` (inference: the model must be in eval mode): with torch.fx
    (``symbolic_trace``) each forward convolution becomes one :class:`ConvBiasAct2d` (1d/3d)
    call together with what follows it: a BatchNorm with running statistics, a residual ``add``
    (``out + identity``: the other operand is passed as the residual) and/or an activation (ReLU,
    ReLU6, SiLU, GELU erf or tanh, hardswish, hardsigmoid, sigmoid, tanh, in their module,
    functional and method forms: :func:`rawconv.pytorch.fusion.activation_of_node`). The
    result is then a ``torch.fx.GraphModule``. With ``autotune`` on the CPU, each fused layer
    is then measured against its unfused form (the convolution with its bias, then torch's own
    add and activation) and keeps the fused call only where that was faster
    (``report.fusion``; :func:`rawconv.pytorch.fusion.measure_cpu`); without an example input every
    fusable layer is fused and the report says fusion was not measured. Nothing of the model's state changes: the
    parameters stay the convolutions' own, each folded BatchNorm stays where it was (only its
    call goes), so ``state_dict`` keys and values are the original model's and
    ``load_state_dict`` of the original's checkpoint works. The fused modules are **frozen**:
    a weight snapshot with the BatchNorm folded in (float64, rounded once to the weights'
    dtype), reordered once per problem; each call first checks that the snapshot still matches
    the parameters and BatchNorm it was taken from (the objects, their version counters,
    optimizer steps, ``.to()``; see :func:`refresh`) and takes a new one when not. With autograd
    recording, or a BatchNorm in training mode, a fused module runs the convolution, then the
    BatchNorm module itself, the add and the activation (train the converted model as the original).
    The model may already be converted (rawconv's conv modules are fx leaf modules).
    When tracing fails (data-dependent control flow...) a warning says so and each
    ``nn.Sequential`` with Conv -> BatchNorm -> activation runs computes each run as one fused module
    when the Sequential itself is called (its children are untouched: called alone, or shared,
    they compute as before; :class:`_FusedSequential`).

    ``autotune``: an example input (a tensor, or a tuple of arguments), or True to use
    ``example_input``: the model runs once on it (no grad), every convolution call is recorded,
    and each distinct problem (shape, strides, dtype, fusion) is searched ONCE, within ``autotune_budget_s``
    seconds of wall time per problem and direction (oneDNN: every implementation checked and timed, no
    limit by default; cuDNN: the graph API's autotune, default 0.6 s, the best 8 re-timed in 10 groups,
    tuning cache first, the next problem's first runtime compilations started in the background; the legacy
    API's algorithms when no graph config runs it). ``autotune_backward``: also search the two backward passes
    of each problem (backward data and backward weights, on the layout the gradients have: the input's),
    each distinct backward problem once; default (None): when
    the model is in training mode and a parameter requires grad (a model about to be trained),
    not for a model in eval mode (inference; ``fuse=True`` models). The winners are pinned **to
    the problem they were tuned on** (per layer, :func:`pinned_choices`): a call of another
    problem (another batch size, layout, dtype, size) runs the library's default choice, or,
    with ``autotune_new="search"``, is searched at its first call (as torch's
    ``cudnn.benchmark``; not while torch.compile, a CUDA graph capture or a tracer runs: the
    default then) and pinned too. Winners are remembered for the process (a second convert of
    the same problems searches nothing). ``model.rawconv_report`` (:class:`ConvertReport`) says
    what was done; :func:`describe` says, per layer and call, what runs and why.

    Raises :class:`ArgumentError` / :class:`ArgumentTypeError` for bad arguments (a training-mode
    model with ``fuse=True``; ``autotune=True`` without ``example_input``).
    """
    autotune, autotune_backward = _convert_args(model, inplace, backend, precision, autotune, fuse, example_input,
                                                autotune_budget_s, autotune_backward, autotune_new)
    if isinstance(choice, dict):   # every key a conv module's name
        _pins.check_choice_names(choice, [n for n, m in model.named_modules()
                                          if _swap_class(m) is not None or isinstance(m, _RawconvConv)])
    if not inplace:
        try:
            model = copy.deepcopy(model)
        except (RuntimeError, TypeError) as exc:   # torch's own refusal to copy this model
            if isinstance(exc, RawconvError):
                raise
            raise ArgumentError(f"convert(inplace=False) converts a copy of the model, and copy.deepcopy of it "
                                f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
                                "(torch.nn.utils.weight_norm / spectral_norm leave a computed weight that torch "
                                "cannot copy: use torch.nn.utils.parametrizations.weight_norm / spectral_norm, "
                                "or convert the model itself with inplace=True)") from exc
    report = ConvertReport()
    traced = False
    if fuse:
        model, traced = _convert_fuse_fx(model, report, backend, choice, precision)
    model = _swap_modules(model, report, backend, choice, precision)
    if fuse and not traced:
        _fuse_sequential(model, report, backend, choice, precision)
    if fuse:
        for _name, m in _fused_modules(model):
            _fused.freeze(m)
    if autotune is not None:
        _autotune(model, autotune, report, autotune_budget_s, autotune_backward, autotune_new, fuse)
    elif fuse:
        report.fusion_measured = False
    for name, m in _conv_modules(model).items():   # what torch's kernel runs (predicted, or seen in the autotune)
        why = _fallback.reason_for_parameters(m) or next(iter(m.__dict__.get("torch_fallbacks") or ()), None)
        if why is not None:
            report.fallback[name] = why
    model.rawconv_report = report
    return model


def _convert_args(model, inplace, backend, precision, autotune, fuse, example_input, autotune_budget_s,
                  autotune_backward, autotune_new) -> tuple:
    """Check :func:`convert`'s arguments, in order, raising :class:`ArgumentTypeError` /
    :class:`ArgumentError` on the first bad one. Returns ``(autotune, autotune_backward)`` resolved:
    the example input to search on (``example_input`` for ``autotune=True``) or None, and whether
    to search the backward passes too (the default, None: a training-mode model with a parameter
    that requires grad)."""
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    _check_backend(backend)
    _check_precision(precision)
    for nm, v in (("inplace", inplace), ("fuse", fuse)):
        if not isinstance(v, bool):
            raise ArgumentTypeError(f"{nm} must be True or False, got {v!r}")
    if autotune_backward is not None and not isinstance(autotune_backward, bool):
        raise ArgumentTypeError(f"autotune_backward must be True, False or None, got {autotune_backward!r}")
    if autotune_new not in AUTOTUNE_NEW:
        raise ArgumentError(f"autotune_new must be one of {list(AUTOTUNE_NEW)}, got {autotune_new!r}")
    if autotune is True:
        if example_input is None:
            raise ArgumentError("autotune=True needs example_input (or pass the example as autotune=x)")
        autotune = example_input
    elif autotune is False:
        autotune = None
    _check_budget(autotune_budget_s, "autotune_budget_s")
    if fuse and model.training:
        raise ArgumentError("fuse=True folds BatchNorm with its running statistics, which is only right for "
                            "inference: call model.eval() first (or convert(..., fuse=False) for training)")
    if autotune_backward is None:
        autotune_backward = model.training and any(p.requires_grad for p in model.parameters())
    return autotune, autotune_backward


def _convert_fuse_fx(model: torch.nn.Module, report: ConvertReport, backend: str, choice, precision: str) -> tuple:
    """:func:`convert`'s ``fuse=True`` with torch.fx (:func:`_fuse_fx`), recording in ``report`` whether
    it traced. Returns ``(model, traced)``: the traced and fused ``GraphModule`` and True, or, when
    tracing fails (a ``RuntimeWarning`` says why; ``report``'s folds and fusions cleared), the
    model unchanged and False."""
    try:
        model = _fuse_fx(model, report, backend, choice, precision)
        report.traced = True
        return model, True
    except Exception as exc:   # noqa: BLE001  (torch.fx raises many types for untraceable code)
        report.traced = False
        report.trace_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        warnings.warn(f"rawconv.nn.convert(fuse=True): torch.fx could not trace {type(model).__name__} "
                      f"({report.trace_error}); fused at module level only (Conv -> BatchNorm -> activation runs of "
                      "each nn.Sequential, when the Sequential is called as a whole); residual adds stay in "
                      "torch", RuntimeWarning, stacklevel=_guard.stacklevel())
        report.folded.clear()
        report.fused.clear()
    return model, False


def _swap_modules(model: torch.nn.Module, report: ConvertReport, backend: str, choice, precision: str
                  ) -> torch.nn.Module:
    """Swap every convolution module of ``model`` of a class rawconv covers for its :mod:`rawconv.nn`
    twin (sharing parameters and buffers), recording in ``report.swapped`` those swapped and those
    already rawconv's. Returns the model (the new module when ``model`` itself is one)."""
    for name, m in list(model.named_modules()):
        if _swap_class(m) is not None:
            new = _swap_module(m, backend, _choice_for(choice, name), precision)
            if name:
                _set_submodule(model, name, new)
            else:
                model = new
            report.swapped.append(name)
        elif isinstance(m, _RawconvConv):
            report.swapped.append(name)
        elif _pins.own_computation(m, _SWAP):
            report.left_on_torch[name] = _pins.own_computation(m, _SWAP)
    _pins.warn_left_on_torch(report.left_on_torch, model)
    return model


AUTOTUNE_NEW = ("default", "search")


def torch_fallbacks(model: torch.nn.Module | None = None) -> dict:
    """Calls that rawconv's modules ran on torch's own kernel (no rawconv library can run them:
    :mod:`rawconv.pytorch.fallback`). Without ``model``: {reason: calls} in this process; with
    it: {layer name: {reason: calls}} for its modules that fell back (each module keeps its own
    counts in its ``torch_fallbacks`` attribute)."""
    if model is None:
        return _fallback.counts()
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
    return {name: dict(m.__dict__["torch_fallbacks"]) for name, m in _conv_modules(model).items()
            if m.__dict__.get("torch_fallbacks")}


def refresh(model: torch.nn.Module) -> torch.nn.Module:
    """Take new weight snapshots of the frozen modules in ``model`` now (returned, for chaining).

    :func:`convert` with ``fuse=True`` **freezes** the fused modules it makes: their weight and
    bias, with the BatchNorm folded in, are copied (as torch's freezing makes constants) and
    reordered into the implementation's layout once. A frozen module computes with that copy
    whenever autograd does not record through its parameters (``torch.no_grad()``, inference
    mode) and takes a new one by itself at its next call when what it was taken from changed:
    another parameter object (``m.weight = Parameter(...)``, ``load_state_dict(assign=True)``),
    an in-place write seen by the tensor's version counter (``load_state_dict``, optimizer steps,
    ``mul_``, a BatchNorm's training forward), any optimizer step in the process (fused
    optimizers move no version counter), ``.to()`` / ``.half()`` / ``.cuda()`` of the model, or a
    forward that recorded autograd through the parameters. What it cannot see: writes through
    ``.data`` (or a numpy view, or the storage) with no optimizer step and no training forward
    around them, and replays of a captured CUDA graph (no Python runs there): call ``refresh``
    after those. ``refresh`` writes the new snapshot into the same buffers when they fit, so a
    compiled or captured model computes with it too. A weight computed by a parametrization or
    ``spectral_norm`` is not a parameter: such a module reads it on every call (unfrozen). Raises
    :class:`ArgumentTypeError` when ``model`` is not a ``torch.nn.Module``."""
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    for _name, m in _fused_modules(model):
        if _fused.frozen(m):
            _fused.freeze(m)
    return model


# ---------------------------------------------------------------------------- autotune
_TUNED: dict = {}   # process-wide: tuning key -> winning choice
_TUNED_ATTR = "_rawconv_tuned"   # module.__dict__: {call signature: TunedChoice}
_NEW_ATTR = "_rawconv_autotune_new"   # module.__dict__: how to search a new problem (autotune_new="search")


@dataclass(frozen=True)
class TunedChoice:
    """What :func:`convert`'s autotune pinned for one problem of one layer.

    ``problem``: the layer's call (:meth:`ConvProblem.describe`; for a transposed layer the
    matching convolution's); ``kind``: ``"conv"``, ``"fused"`` or ``"transpose"``; ``backend``;
    ``choice``: the layer's forward (None: the library's default); ``backward_choice``: ``(grad
    input choice, grad weight choice)`` as the modules take it, or None when the backward passes
    were not searched (the library's defaults run); ``directions``: the same choices by the
    library's direction (``{"forward": .., "backward_data": .., "backward_weights": ..}``; a
    transposed layer's forward is the convolution's backward data and its input gradient a
    forward)."""

    problem: str
    kind: str
    backend: str
    choice: Any
    backward_choice: Any
    directions: dict

    def as_dict(self) -> dict:
        return {"problem": self.problem, "kind": self.kind, "backend": self.backend, "choice": self.choice,
                "backward_choice": self.backward_choice, "directions": dict(self.directions)}


_OFFERED_ON = "_rawconv_offered_on"   # TunedChoice.__dict__: the oneDNN and CPU its choices are known offered on
_HERE: list = []   # this process's oneDNN version and effective ISA (_onednn_here)
_FALLBACK_WARNED: list = []   # a pinned choice not offered here was warned about (once per process)


def _onednn_here() -> str:
    """This process's oneDNN version and effective ISA (``"3.2.0 avx2"``): what decides which
    implementations a pinned choice can name."""
    if not _HERE:
        env = onednn.environment()
        _HERE.append(f"{env['library_version']} {env['device_arch']}")
    return _HERE[0]


def _offered(m, kind: str, args: dict, direction: str, choice: str, activation: str | None = None) -> str | None:
    """None when oneDNN offers ``choice`` here for layer ``m``'s call in library ``direction``, else
    the name of what runs instead (oneDNN's first choice). Lists the implementations once.
    ``activation``: a fused call's post-op activation when not the module's (``"none"``: the
    convolution with its bias alone, as a call measured faster unfused runs it)."""
    prec = _check_precision(m.precision)
    if direction == _forward_direction(kind):
        problem, wl = _problem_of(m, kind, args), onednn.weights_layout(m.weight)
    else:
        problem, wl = _grad_problems(m, kind, args, "onednn")[direction]
    if kind == "fused" and direction == "forward":
        plan = _fused.FusedConvolution.for_problem(problem, residual=args.get("residual") is not None,
                                                   activation=activation or m.activation, fpmath=prec, w_layout=wl)
    else:
        plan = onednn.Convolution.from_problem(problem, direction=direction, fpmath=prec, w_layout=wl)
    try:
        try:
            plan.select(choice)
            return None
        except NotSupportedError:   # (KnownBadError too)
            first = plan.selected
            return f"{first.name}@{first.layouts}"
    finally:
        plan.free()


def _offered_here(m, kind: str, args: dict, key, t: "TunedChoice") -> "TunedChoice":
    """``t`` (an autotuned oneDNN pin of layer ``m``, made with another oneDNN or on another CPU:
    a saved model loaded elsewhere, ``ONEDNN_MAX_CPU_ISA``) checked against what oneDNN offers
    here, once per process: a choice it does not offer for its problem is dropped (oneDNN's first
    choice runs that direction), with one ``RuntimeWarning`` per process naming the layer, the
    pinned choice and what runs instead (the others are logged on ``rawconv.nn``). The checked pin
    replaces ``t`` in the layer's table and is returned."""
    here = _onednn_here()
    dirs = dict(t.directions)
    dropped = []
    for direction, choice in t.directions.items():
        if choice is None:
            continue
        instead = _offered(m, kind, args, direction, str(choice))
        if instead is not None:
            dirs[direction] = None
            dropped.append((direction, choice, instead))
    if dropped:
        fwd = _forward_direction(kind)
        bwd = t.backward_choice
        if bwd is not None:
            pair = (dirs.get("forward"), dirs.get("backward_weights")) if kind == "transpose" else \
                (dirs.get("backward_data"), dirs.get("backward_weights"))
            bwd = None if pair == (None, None) else pair
        t = TunedChoice(t.problem, t.kind, t.backend, dirs.get(fwd), bwd, dirs)
        _say_fallback(m, t.problem, dropped)
    object.__setattr__(t, _OFFERED_ON, here)
    table = m.__dict__.get(_TUNED_ATTR)
    if table is not None and key in table:
        table[key] = t
    return t


def _say_fallback(m, problem: str, dropped: list) -> None:
    """Say that layer ``m``'s pins ``dropped`` (``(direction, pinned, instead)``) are not offered
    here: logged on ``rawconv.nn``, and the first time in the process a ``RuntimeWarning``."""
    here = _onednn_here()
    what = "; ".join(f"{d} {c!r} -> oneDNN's first choice {i!r}" for d, c, i in dropped)
    msg = (f"rawconv.nn: {type(m).__name__} ({problem}) was autotuned to implementations that oneDNN "
           f"{here.split()[0]} does not offer on this CPU (effective ISA {here.split()[-1]}): {what}; these run "
           "instead (convert(model, autotune=...) here tunes for this CPU)")
    log.info(msg)
    if not _FALLBACK_WARNED:
        _FALLBACK_WARNED.append(True)
        warnings.warn(msg + ". Other layers whose pins are not offered here fall back the same way without "
                      "another warning (logged on 'rawconv.nn'; rawconv.nn.describe(model) shows what runs)",
                      RuntimeWarning, stacklevel=_guard.stacklevel())


_UNFUSED_OFFERED_ON = "_rawconv_unfused_offered_on"   # module.__dict__: {call key: where its unfused choice is offered}


def _unfused_offered_here(m, key, choice: str, args: dict) -> str:
    """The unfused choice ``choice`` of layer ``m``'s call ``key`` (:data:`rawconv.pytorch.fusion.UNFUSED_ATTR`:
    convert measured it faster unfused), checked once per process against what oneDNN offers here as
    :func:`_offered_here` checks the autotuned pins: one not offered is replaced in the table by
    oneDNN's first choice (the call stays unfused), said as there. ``args``: the call's x, padding,
    w and b."""
    here = _onednn_here()
    checked = m.__dict__.setdefault(_UNFUSED_OFFERED_ON, {})
    instead = _offered(m, "fused", args, "forward", str(choice), activation="none")
    if instead is not None:
        table = m.__dict__.get(_fusion.UNFUSED_ATTR)
        if table is not None and key in table:
            table[key] = instead
        _say_fallback(m, _problem_of(m, "fused", args).describe() + ", run unfused", [("forward", choice, instead)])
        choice = instead
    checked[key] = here
    return choice


def clear_tuning() -> None:
    """Forget the winners :func:`convert` remembers for this process (and its fused / unfused
    decisions)."""
    _TUNED.clear()
    _fusion.clear()


def _sig_of(kind: str, x, w, extra):
    """The key of a module call's problem in the module's tuned table: what, besides the module's
    own configuration, decides the problem (x's shape, strides and dtype, w's strides, the fused
    residual / the transposed output padding). None when x's sizes are symbolic (torch.compile's
    dynamic shapes: the default choices run there)."""
    shape = x.shape
    if torch.compiler.is_compiling() and not all(type(v) is int for v in shape):
        return None
    return (kind, shape, x.stride(), x.dtype, w.stride(), extra)


def _can_search_now(x) -> bool:
    """Whether a new problem may be searched inside this call (autotune_new="search")."""
    if type(x) is not torch.Tensor or torch.compiler.is_compiling() or torch.jit.is_tracing() or _functorch():
        return False
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        return False
    return True


def _search_new(m, kind: str, args: dict, key):
    """Search module ``m``'s new problem now (autotune_new="search") and pin it. Errors other
    than "not supported" propagate; None when nothing could be searched (the default runs)."""
    opts = m.__dict__[_NEW_ATTR]
    backend = _resolve_backend(m.backend, args["x"].device)
    st = m.__dict__.get(_fused._FROZEN_STATE)
    if kind == "fused" and st is not None:   # what the call computes with: the snapshot (BatchNorm folded in)
        w, b = st.sync()
        if w is not None:
            args = dict(args, w=w, b=b)
    try:   # the search's random tensors come from generators of its own: torch's stream goes on, and no
        # fork_rng (which would hand out again what other threads drew from torch's during the search)
        with torch.no_grad():
            entry = _tune_call(m, kind, args, backend, opts["budget_s"], opts["backward"], {})
    except NotSupportedError:
        return None
    return entry[0]


def _as_args(example) -> tuple:
    return tuple(example) if isinstance(example, (tuple, list)) else (example,)


def _devices_of(model, example, extra=()) -> list:
    """The CUDA devices in use by ``model``'s tensors and the example's (for torch.random.fork_rng)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return []
    ts = list(model.parameters()) + list(model.buffers()) + list(extra) + \
        [a for a in _as_args(example) if isinstance(a, torch.Tensor)]
    return sorted({t.get_device() for t in ts if t.is_cuda})


@contextlib.contextmanager
def _rng_kept(model, example):
    """torch's random number generators (CPU and the CUDA devices in use) as they were after the block."""
    with torch.random.fork_rng(devices=_devices_of(model, example)):
        yield


@contextlib.contextmanager
def _state_kept(model, example):
    """The example's forward leaves no trace on the model or the process: every buffer's values
    (a training-mode BatchNorm updates its running statistics and count) and torch's random
    number generators (dropout draws), CPU and the CUDA devices in use, as they were."""
    saved = []
    for mod in model.modules():
        for name, b in mod._buffers.items():
            if isinstance(b, torch.Tensor):
                saved.append((mod, name, b, b.detach().clone()))
    devices = _devices_of(model, example, [e[2] for e in saved])
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        with torch.no_grad():
            # (every one: batch_norm writes its running statistics without bumping their version)
            for mod, name, b, value in saved:
                if mod._buffers.get(name) is not b:   # rebound by the forward: the original back
                    mod._buffers[name] = b
                with torch.inference_mode(b.is_inference()):   # (an inference tensor: written only there)
                    if b.shape == value.shape:
                        b.copy_(value)
                    else:
                        b.set_(value)


def _record_calls(model, example) -> list:
    """(module, kind, args) of every distinct call (module and problem) of ``model`` on ``example``."""
    with _recording() as calls, torch.no_grad(), _state_kept(model, example):
        try:
            model(*_as_args(example))
        except RawconvError:
            raise
        except Exception as exc:   # noqa: BLE001 - the model's own code: say where it failed
            new = _guard.translate(exc, "rawconv.nn.convert(autotune=...): the model's forward on the example")
            if new is None:
                raise
            if isinstance(new, InternalError):   # not rawconv's bug: the example or the model
                text = str(exc).strip().splitlines()
                new = ArgumentError(f"rawconv.nn.convert(autotune=...): the model's forward on the example input "
                                    f"raised {type(exc).__name__}: {text[0][:300] if text else ''} (nothing was "
                                    "tuned; is the example what the model takes?)")
            raise new from exc
    seen, out = set(), []
    for m, kind, args in calls:
        k = (id(m), _call_key(m, kind, args))
        if k not in seen:
            seen.add(k)
            out.append((m, kind, args))
    return out


def _call_key(m, kind: str, args: dict):
    """The key of a recorded call in the module's tuned table (what its forward looks up)."""
    extra = None
    if kind == "fused":
        extra = args.get("residual") is not None
    elif kind == "transpose":
        extra = tuple(args["output_padding"])
    return _sig_of(kind, args["x"], m.weight, extra)


def _call_wb(m, args: dict):
    """(w, b) a recorded call computed with: a fused call's own (a frozen snapshot, BatchNorm folded
    in), else the module's parameters (detached)."""
    if "w" in args:
        w, b = args["w"], args["b"]
    else:
        w, b = m.weight, m.bias
    w, b = _in_dtype_of(args["x"], w, b)
    return w.detach(), (b.detach() if b is not None else None)


def _in_dtype_of(x, w, b=None):
    """``(w, b)`` in x's dtype when they differ (floating point): a call whose x and parameters
    differ in dtype reaches the library only under autocast, which casts them all to one dtype
    (x's, when x is already cast: an earlier autocast op's output); a recorded or searched
    problem is that one. Otherwise as they are (a call outside autocast raises its own error)."""
    if w.dtype != x.dtype and x.is_floating_point() and w.is_floating_point():
        w = w.to(x.dtype)
        b = None if b is None else b.to(x.dtype)
    return w, b


def _problem_of(m, kind: str, args: dict) -> ConvProblem:
    x = args["x"]
    if kind == "transpose":
        xb = x.unsqueeze(0) if x.dim() == m.weight.dim() - 1 else x
        _y_shape, core, s, p, d = _transpose_shape(xb, m.weight, m.stride, m.padding, args["output_padding"],
                                                   m.dilation, m.groups)
        fake = shape_only(core, xb)
        if _is_cl(xb):
            fake = fake.contiguous(memory_format=torch.channels_last if xb.dim() == 4 else torch.channels_last_3d)
        return ConvProblem.from_torch(fake, _call_wb(m, args)[0], None, s, p, d, m.groups)
    w, b = _call_wb(m, args)
    return ConvProblem.from_torch(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups)


def _device_name(backend: str, x) -> str:
    return torch.cuda.get_device_name(x.device) if backend == "cudnn" else ""


def _tune_key(m, kind, args, backend, problem) -> tuple:
    extra, wl = ((m.activation, args.get("residual") is not None) if kind == "fused" else ()), onednn.weights_layout(m.weight)
    return (kind, problem, extra, m.precision, backend, _device_name(backend, args["x"]), wl)


# convert's default cuDNN budget (wall time per problem and direction; ResNet-50 has 24 problems) and each
# autotuner's knobs in convert (the graph's final re-timing 10 groups: autotune's 30 took 0.2 s a problem)
GRAPH_BUDGET_S = 0.6
ONEDNN_TUNE, GRAPH_TUNE = dict(iterations=3, warmup=1), dict(patience=60, final_iterations=10)


def _graph_plan(m, kind: str, args: dict):
    """The cuDNN graph plan that :func:`_tune_one` searches for layer ``m``'s recorded call."""
    from ..cudnn import graph as G

    x = args["x"]
    w, b = _call_wb(m, args)
    allow_tf32 = m.precision != "strict"
    if kind == "conv":
        return G.GraphConvolution(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups,
                                  allow_tf32=allow_tf32)
    if kind == "fused":
        return _fused.plan_for(x, w, b, args.get("residual"), m.stride, _norm_padding(args["padding"]), m.dilation,
                               m.groups, activation=m.activation, backend="cudnn", precision=m.precision)
    return G.GraphConvolution.from_problem(_problem_of(m, kind, args), direction="backward_data",
                                           allow_tf32=allow_tf32)


def _tune_one(m, kind: str, args: dict, backend: str, budget_s: float | None, *, info: dict | None = None,
              use_cache: bool = True, plan=None) -> str:
    """The winning forward candidate's name for layer ``m``'s recorded call. ``info`` (a dict)
    receives the winner's ``median_ms`` / ``min_ms``; ``use_cache=False``: cuDNN searches afresh
    (no tuning cache hit, no seeds from it). ``plan``: cuDNN, the plan :func:`_graph_plan` made
    (whose compilations may have started)."""
    if backend not in _registered.BUILTIN:   # a registered backend: rawconv.core.autotune.drive on its plan
        return _registered.tune(backend, _forward_direction(kind), _problem_of(m, kind, args), m.precision,
                                budget_s, info)
    x, (w, b), prec = args["x"], _call_wb(m, args), m.precision
    if backend == "onednn":
        opts = dict(ONEDNN_TUNE, budget_s=budget_s)   # wall time for the problem (None: no limit)
        if kind == "conv":   # the modules read their weights per call: timed with the weight reorder
            plan = onednn.Convolution(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups,
                                      fpmath=prec)
        elif kind == "fused":   # convert(fuse=True) freezes these: timed on a snapshot, reordered once
            plan = _fused.FusedConvolution(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups,
                                           residual=args.get("residual") is not None, activation=m.activation,
                                           fpmath=prec, prepack=True)
        else:
            problem = _problem_of(m, kind, args)
            plan = onednn.Convolution.from_problem(problem, direction="backward_data", fpmath=prec,
                                                   w_layout=onednn.weights_layout(w), prepack=False)
            plan._w = w
        try:
            rows = plan.autotune(**opts)
        finally:
            plan.free()
        best = rows[0].impl
        if info is not None:
            info.update(median_ms=getattr(rows[0], "median_ms", None), min_ms=getattr(rows[0], "min_ms", None))
        return f"{best.name}@{best.layouts}"

    budget = budget_s or GRAPH_BUDGET_S
    t0 = time.perf_counter()
    if plan is None:
        plan = _graph_plan(m, kind, args)
    if info is not None:
        info["plan_s"] = time.perf_counter() - t0
    try:
        rows = plan.autotune(budget_s=budget, **GRAPH_TUNE, **({} if use_cache else
                                                              {"use_cache": False, "seed_from_cache": False}))
        if info is not None:
            info["search_s"] = getattr(plan, "autotune_seconds", None)
            info["from_cache"] = bool(rows) and getattr(rows[0], "phase", "") == "cache"
    except NotSupportedError:
        if kind == "fused":
            raise
        # no graph config runs this problem correctly under the precision asked (e.g. strict fp32,
        # where most graph engines are TF32 tensor-core ones): cuDNN's legacy algos, timed, decide
        from .. import cudnn

        direction = "forward" if kind == "conv" else "backward_data"
        legacy = cudnn.Convolution.from_problem(_problem_of(m, kind, args), direction=direction, precision=prec)
        rows = legacy.autotune(budget_s=budget)
        if info is not None and rows:
            info.update(median_ms=rows[0].median_ms, min_ms=rows[0].min_ms)
        return rows[0].algorithm.choice
    if info is not None and rows:
        info.update(median_ms=getattr(rows[0], "median_ms", None), min_ms=getattr(rows[0], "min_ms", None))
    if info is not None and kind in ("conv", "fused") and VERSUS_TORCH:
        try:
            info.update(_versus_torch(m, kind, args, plan))
        except (RawconvError, RuntimeError) as exc:   # the tuned choice stands; the report says why
            info["vs_torch_note"] = f"not compared with torch: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    return plan.selected_name


# convert(autotune=...) on CUDA times each searched layer's pinned call against torch's own call
VERSUS_TORCH = True


def _torch_peer(m, kind: str, args: dict, problem: ConvProblem):
    """Torch's own call for a recorded conv or fused call (``F.conv{1,2,3}d`` on the same tensors,
    then, for a fused call, the residual add and the activation by torch's ops): a callable."""
    x = args["x"]
    w, b = _call_wb(m, args)
    r = args.get("residual")
    nd = w.dim() - 2
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    if problem.symmetric:
        pad, pads = problem.pad_before, None
    else:
        pad = 0
        pads = [v for i in reversed(range(nd)) for v in (problem.pad_before[i], problem.pad_after[i])]
    act = m.activation if kind == "fused" else "none"

    def call():
        xx = x if pads is None else F.pad(x, pads)
        y = conv(xx, w, b, problem.stride, pad, problem.dilation, problem.groups)
        if r is not None or act != "none":
            y = _fused.torch_tail(y, None, r, act, problem)
        return y
    return call


def _versus_torch(m, kind: str, args: dict, plan) -> dict:
    """The GPU time of layer ``m``'s recorded call on its tuned cuDNN plan against torch's own call
    (:func:`_torch_peer`, ``cudnn.benchmark`` on: torch's best pick), interleaved in 5 rounds
    (calls queued behind a busy GPU), and the cuDNN engine torch's call ran (cuDNN's API log).
    When rawconv's pinned call measured more than 3% slower, torch's engine (default knobs; after
    the convolution alone, with torch's ops after it, for a plan with a bias, activation or
    residual) is tried and kept if it measured faster. Returns ``torch_ms``, ``rawconv_ms``,
    ``vs_torch`` (torch / rawconv: above 1, rawconv faster), ``torch_engine`` and, when the guard
    changed the choice, ``vs_torch_note``."""
    from ..cudnn.graph import search as _search
    from .torch_choice import cudnn_api_log, parse_cudnn_log, torch_flags

    x, r = args["x"], args.get("residual")
    w, b = _call_wb(m, args)
    problem = _problem_of(m, kind, args)
    peer = _torch_peer(m, kind, args, problem)

    def ours():
        return plan.run(x, w, b, r) if r is not None else plan.execute(x, w, b)
    out: dict = {}
    with torch.no_grad(), torch_flags(benchmark=True):
        peer()
        peer()   # (the first call timed torch's candidates: cudnn.benchmark)
        with cudnn_api_log() as log:
            peer()
            torch.cuda.synchronize(x.device)
        engines = parse_cudnn_log(log.messages)["engines"] if log.available else ()
        out["torch_engine"] = f"eng{engines[0]}" if engines else ("legacy API" if log.available else "?")
        ours()
        (t_ms, r_ms), _mins, _runs = _search.time_interleaved([peer, ours], 10)
        out.update(torch_ms=t_ms, rawconv_ms=r_ms, vs_torch=t_ms / r_ms if r_ms else None)
        if r_ms > 1.03 * t_ms and engines and not str(plan.selected_name).split("|")[0].endswith(f"eng{engines[0]}"):
            before = plan.selected_name
            alt = ("unfused:" if plan.has_epilogue() else "") + f"eng{engines[0]}"
            try:
                plan.select(alt)
                ours()
                (t2, a_ms), _mins, _runs = _search.time_interleaved([peer, ours], 10)
            except (RawconvError, RuntimeError) as exc:
                plan.select(before)
                out["vs_torch_note"] = f"slower than torch; torch's engine {alt} did not run: {exc}"
                return out
            if a_ms < r_ms * t2 / t_ms:
                out.update(torch_ms=t2, rawconv_ms=a_ms, vs_torch=t2 / a_ms,
                           vs_torch_note=f"{before} measured {r_ms:.4f} ms against torch's {t_ms:.4f}: torch's "
                                         f"engine {alt} kept instead")
            else:
                plan.select(before)
                out["vs_torch_note"] = f"torch's engine {alt} measured no faster ({a_ms:.4f} ms)"
    return out


def _grad_problems(m, kind: str, args: dict, backend: str) -> dict:
    """``{direction: (problem, weights layout)}`` of the two library calls that layer ``m``'s
    backward runs for this recorded call, as rawconv's operators build them: the gradients in
    x's memory format (:func:`rawconv.ops._grad_like`). A convolution (plain or fused: the
    backward of a fused module's autograd path, the convolution with its own bias):
    ``backward_data`` and ``backward_weights``. A transposed layer (the convolution's backward
    data): ``forward`` (its input's gradient) and ``backward_weights``."""
    from . import ops as _ops

    x = args["x"]
    # (the weight as the call cast it under autocast; a fused call's own "w" is its folded snapshot,
    # while its backward runs on the convolution's weight)
    w = _in_dtype_of(x, (args["w"] if kind != "fused" and "w" in args else m.weight).detach())[0]
    nd = w.dim() - 2
    xb = x.unsqueeze(0) if x.dim() == nd + 1 else x
    lay = _ops._layout(xb)
    cuda = backend == "cudnn"
    if kind == "transpose":
        _y, core, s, pads, d = _transpose_shape(xb, w, m.stride, m.padding, args["output_padding"], m.dilation,
                                                m.groups)
        gy = empty_like_layout(core, lay, xb.dtype, xb.device)   # the layer's output gradient
        fwd = ConvProblem.from_torch(gy, w, None, s, pads, d, m.groups)
        wts = _ops._backward_weights_problem(gy, xb, tuple(w.shape), s, [a for a, _ in pads], [b for _, b in pads],
                                             d, m.groups, False)
        # (cuDNN's legacy plans describe the filter in the data's layout: rawconv.cudnn.weights_layout)
        return {"forward": (fwd, fwd.layout if cuda else onednn.weights_layout(w)), "backward_weights": (wts, wts.layout)}
    p = ConvProblem.from_torch(xb, w, None, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups)
    pads = tuple(zip(p.pad_before, p.pad_after))
    gy = empty_like_layout(p.y_shape, lay, xb.dtype, xb.device)
    if cuda:
        from .. import cudnn

        data = cudnn.grad_problem(gy, w, tuple(xb.shape), p.stride, pads, p.dilation, p.groups, "backward_data")
        wts = cudnn.grad_problem(gy, xb, tuple(w.shape), p.stride, pads, p.dilation, p.groups, "backward_weights")
    else:
        data = onednn.backward_data_problem(gy, w, tuple(xb.shape), p.stride, pads, p.dilation, p.groups, False)
        wts = _ops._backward_weights_problem(xb, gy, tuple(w.shape), p.stride, p.pad_before, p.pad_after,
                                             p.dilation, p.groups, m.bias is not None)
    return {"backward_data": (data, data.layout if cuda else onednn.weights_layout(w)),
            "backward_weights": (wts, wts.layout)}


def _search_direction(direction: str, problem: ConvProblem, w_layout: str, backend: str, precision: str,
                      budget_s: float | None) -> str:
    """The winning candidate's name for ``problem`` in library direction ``direction`` (oneDNN: every implementation
    timed and checked; cuDNN: the graph API's autotune, else the legacy API's algorithms; a registered backend:
    :func:`rawconv.pytorch.registered.tune`). Raises NotSupportedError when nothing could be timed."""
    if backend not in _registered.BUILTIN:
        return _registered.tune(backend, direction, problem, precision, budget_s)
    if backend == "onednn":
        plan = onednn.Convolution.from_problem(problem, direction=direction, fpmath=precision, w_layout=w_layout,
                                               prepack=False)
        try:
            rows = plan.autotune(**ONEDNN_TUNE, budget_s=budget_s)
        finally:
            plan.free()
        return f"{rows[0].impl.name}@{rows[0].impl.layouts}"
    from .. import cudnn
    from ..cudnn import graph as G

    try:
        plan = G.GraphConvolution.from_problem(problem, direction=direction, allow_tf32=precision != "strict")
        plan.autotune(budget_s=budget_s or GRAPH_BUDGET_S, **GRAPH_TUNE)
        return plan.selected_name
    except NotSupportedError:
        legacy = cudnn.Convolution.from_problem(problem, direction=direction, precision=precision, w_layout=w_layout)
        return legacy.autotune(budget_s=budget_s or GRAPH_BUDGET_S)[0].algorithm.choice


def _tune_backward(m, kind: str, args: dict, backend: str, budget_s) -> tuple:
    """(backward_choice pair or None, {direction: choice}, searched?, note) for a recorded call:
    each distinct backward problem searched once per process (:data:`_TUNED`)."""
    out, searched, notes = {}, False, []
    for direction, (p, wl) in _grad_problems(m, kind, args, backend).items():
        key = (direction, p, m.precision, backend, _device_name(backend, args["x"]), wl)
        if key in _TUNED:
            c = _TUNED[key]
        else:
            try:
                c = _search_direction(direction, p, wl, backend, m.precision, budget_s)
            except NotSupportedError as exc:   # nothing could be timed: the library's default runs it
                c = None
                notes.append(f"{direction} not tuned: {exc}")
            _TUNED[key] = c
            searched = True
        out[direction] = c
    pair = (out["forward"] if kind == "transpose" else out["backward_data"], out["backward_weights"])
    return (None if pair == (None, None) else pair), out, searched, "; ".join(notes)


def _forward_direction(kind: str) -> str:
    return "backward_data" if kind == "transpose" else "forward"


def _pin_tuned(m, kind: str, args: dict, entry: TunedChoice) -> None:
    """Pin ``entry`` to the problem of layer ``m``'s recorded call (its tuned table)."""
    table = m.__dict__.get(_TUNED_ATTR)
    if table is None:
        table = m.__dict__[_TUNED_ATTR] = {}
    key = _call_key(m, kind, args)
    if key is not None:
        table[key] = entry
    m._choice_backend = entry.backend
    st = m.__dict__.get(_fused._FROZEN_STATE)
    if st is not None:   # a plan made for this problem before took the choice it had then
        st.plans.clear()


def _tune_call(m, kind: str, args: dict, backend: str, budget_s, backward: bool, info: dict, plan=None) -> tuple:
    """(TunedChoice, forward searched?, backward searched?, note) for one recorded call: the forward
    from the process memo or :func:`_tune_one`, the backward passes (``backward``) by
    :func:`_tune_backward`."""
    problem = _problem_of(m, kind, args)
    key = _tune_key(m, kind, args, backend, problem)
    note = ""
    searched = False
    if m.choice is not None:   # pinned by the module's own choice (every problem): nothing to search
        choice, note = m.choice, "forward pinned by the module's choice"
    elif key in _TUNED:
        choice = _TUNED[key]
    else:
        try:
            choice = _tune_one(m, kind, args, backend, budget_s, info=info, plan=plan)
        except NotSupportedError as exc:   # nothing could be timed: the backend's default stays
            choice, note = None, f"not tuned: {exc}"
        _TUNED[key] = choice
        searched = True
    bwd, bsearched, dirs = None, False, {}
    if backward and m.backward_choice is None:
        bwd, dirs, bsearched, bnote = _tune_backward(m, kind, args, backend, budget_s)
        note = "; ".join(n for n in (note, bnote) if n)
    elif backward:
        bwd, note = m.backward_choice, "; ".join(n for n in (note, "backward pinned by the module's "
                                                                     "backward_choice") if n)
        d, wt = _pair(bwd)
        dirs = {("forward" if kind == "transpose" else "backward_data"): d, "backward_weights": wt}
    directions = {_forward_direction(kind): choice, **dirs}
    entry = TunedChoice(problem.describe(), kind, backend, choice, bwd, directions)
    if backend == "onednn":   # searched (or pinned) here: offered here
        object.__setattr__(entry, _OFFERED_ON, _onednn_here())
    _pin_tuned(m, kind, args, entry)
    return entry, searched, bsearched, note


def _autotune(model, example, report: ConvertReport, budget_s, backward: bool = False,
              new: str = "default", fuse: bool = False) -> None:
    """Search each distinct problem of ``model``'s convolutions once (and, with ``backward``, each
    distinct backward problem) and pin the winners to their problems. On cuDNN, while one
    problem is searched, the next one's first runtime compilations (cuDNN's top heuristic
    configs, which a fused graph mostly consists of) run in background threads
    (:func:`rawconv._search.prefetch`), unless the previous problem came from the tuning cache."""
    t0 = time.perf_counter()
    names = {id(m): n for n, m in _conv_modules(model).items()}
    for m in _conv_modules(model).values():   # a model tuned before: its example forward searches nothing,
        m.__dict__.pop(_NEW_ATTR, None)       # and its old tables go (this convert's problems only)
        m.__dict__.pop(_TUNED_ATTR, None)
    layers = []
    for m, kind, args in _record_calls(model, example):
        backend = _resolve_backend(m.backend, args["x"].device)
        problem = _problem_of(m, kind, args)
        layers.append((m, kind, args, backend, problem, _tune_key(m, kind, args, backend, problem)))
    from ..core.bench import TimingWarning

    with _rng_kept(model, example), warnings.catch_warnings(record=True) as said:
        # the searches' random tensors draw nothing from torch's generators; their timing warnings
        # (one per search on a busy machine) are said once, summed up, below
        warnings.simplefilter("always", TimingWarning)
        _search_layers(model, layers, names, report, budget_s, backward)
        if fuse:
            _measure_fusion(layers, names, report, budget_s)
    for w in said:
        if issubclass(w.category, TimingWarning):
            report.timing_warnings.append(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if report.timing_warnings:
        first = report.timing_warnings[0].splitlines()[0]
        warnings.warn(f"rawconv.nn.convert(autotune=...): {len(report.timing_warnings)} of the searches were "
                      f"timed on a busy machine, so their choices may not hold (the first: {first}); all of them "
                      "are in the report's timing_warnings; convert again on a quiet machine",
                      TimingWarning, stacklevel=_guard.stacklevel())
    if new == "search":   # every convolution module: those the example did not call meet only new problems
        for m in _conv_modules(model).values():
            m.__dict__.setdefault(_TUNED_ATTR, {})
            m.__dict__[_NEW_ATTR] = {"budget_s": budget_s, "backward": backward}
    else:
        for m in _conv_modules(model).values():
            m.__dict__.pop(_NEW_ATTR, None)
    for _name, m in _fused_modules(model):   # their plans resolved the old table's choices
        st = m.__dict__.get(_fused._FROZEN_STATE)
        if st is not None:
            st.plans.clear()
    report.backward = backward
    report.autotune_new = new
    report.autotune_s = time.perf_counter() - t0


def _measure_fusion(layers: list, names: dict, report: ConvertReport, budget_s) -> None:
    """``convert(fuse=True, autotune=x)``: each fused oneDNN layer's recorded call measured fused
    against unfused (:func:`rawconv.pytorch.fusion.measure_cpu`), the outcome pinned to its problem
    and written into ``report.fusion`` and the layer's ``report.tuned`` entries. A cuDNN layer's
    decision is its graph autotune's (fused configs and ``"unfused:"`` ones searched together):
    recorded as such, not measured again here."""
    report.fusion_measured = True
    entries = {}
    for t in report.tuned:
        entries.setdefault((t["name"], t["key"]), []).append(t)
    for m, kind, args, backend, _problem, key in layers:
        if kind != "fused":
            continue
        name = names.get(id(m), "?")
        t = m.__dict__.get(_TUNED_ATTR, {}).get(_call_key(m, kind, args))
        choice = m.choice if m.choice is not None else (t.choice if t is not None else None)
        if backend != "onednn":   # the graph autotune searched fused and "unfused:" configs (its choice says which)
            split = isinstance(choice, str) and choice.startswith("unfused:")
            e = {"decision": "unfused" if split else "fused",
                 "reason": f"cuDNN graph autotune (fused and 'unfused:' configs searched): {choice}"}
        elif not _fused.frozen(m) or m.choice is not None:
            e = {"decision": "fused", "reason": "fusion not measured: " + (
                "the layer is not frozen" if not _fused.frozen(m) else
                "the module's own choice names a fused implementation")}
        else:
            try:
                e, measured = _fusion.measure_cpu(m, args, choice, key, budget_s, _TUNED, _call_key(m, "fused", args))
                e["measured"] = measured
                # an unfused choice made here is offered here (_unfused_offered_here checks one made elsewhere)
                ck = _call_key(m, "fused", args)
                if ck is not None and ck in (m.__dict__.get(_fusion.UNFUSED_ATTR) or {}):
                    m.__dict__.setdefault(_UNFUSED_OFFERED_ON, {})[ck] = _onednn_here()
            except NotSupportedError as exc:   # the plain convolution has no implementation: stays fused
                e = {"decision": "fused", "reason": f"fusion not measured: {exc}"}
        report.fusion[name if name not in report.fusion else f"{name} {_problem.describe()}"] = e
        for t in entries.get((name, key), ()):
            t["fusion"] = e["decision"]
            for k in ("fused_ms", "unfused_ms", "fused_min_ms", "unfused_min_ms"):
                if k in e:
                    t[k] = e[k]


def _search_layers(model, layers: list, names: dict, report: ConvertReport, budget_s, backward: bool) -> None:
    from ..cudnn.graph import search as _search

    plans: dict = {}   # key -> the cuDNN plan made ahead, its compilations started
    last_from_cache = False

    def ahead(i: int) -> None:   # the next distinct cuDNN problem not searched yet, after layer i
        keys = {layers[i][5]}
        for m, kind, args, backend, _, key in layers[i + 1:]:
            if key in _TUNED or key in keys or backend != "cudnn":
                keys.add(key)
                continue
            if key not in plans:
                try:
                    plans[key] = plan = _graph_plan(m, kind, args)
                    if isinstance(plan, _fused._CudaFallback):
                        return   # no cuDNN graph for it (the legacy API runs it): nothing to compile ahead
                    _search.prefetch(plan)
                except (RawconvError, RuntimeError):   # its own search says what is wrong
                    plans.pop(key, None)
            return

    for i, (m, kind, args, backend, problem, key) in enumerate(layers):
        t1 = time.perf_counter()
        info: dict = {}
        if key not in _TUNED and backend == "cudnn" and not last_from_cache:
            ahead(i)
        entry, searched, bsearched, note = _tune_call(m, kind, args, backend, budget_s, backward, info,
                                                      plan=plans.pop(key, None))
        if searched:
            last_from_cache = info.get("from_cache", False)
        report.tuned.append({"name": names.get(id(m), "?"), "kind": kind, "problem": entry.problem,
                             "backend": backend, "choice": entry.choice, "backward_choice": entry.backward_choice,
                             "directions": dict(entry.directions), "searched": searched,
                             "backward_searched": bsearched, "seconds": time.perf_counter() - t1, "key": key,
                             "note": note, **info})


def pinned_choices(model: torch.nn.Module) -> dict:
    """What every rawconv convolution module of ``model`` is pinned to: ``{module name: {"module":
    class name, "backend": the backend its weights' device runs ("onednn" / "cudnn"), "choice",
    "backward_choice", "precision", "tuned"}}`` in ``named_modules`` order (the fused modules of
    a :class:`_FusedSequential` included, named after their conv with ``"(fused)"``).
    ``"tuned"``: what :func:`convert`'s autotune pinned, one :meth:`TunedChoice.as_dict` per
    problem (a call of another problem runs the default); ``"choice"`` / ``"backward_choice"``: the
    module's own (set by ``choice=`` or :func:`pin_choices`: every problem) when set, else those
    autotuned for its first problem (None: the library's default). What :func:`convert`
    (``autotune=``) and :func:`rawconv.distributed.convert` pinned."""
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    out = {}
    for name, m in _conv_modules(model).items():
        tuned = [t.as_dict() for t in (m.__dict__.get(_TUNED_ATTR) or {}).values()]
        first = tuned[0] if tuned else {}
        out[name] = {"module": type(m).__name__, "backend": m._device_backend(),
                     "choice": m.choice if m.choice is not None else first.get("choice"),
                     "backward_choice": m.backward_choice if m.backward_choice is not None
                     else first.get("backward_choice"), "precision": m.precision, "tuned": tuned}
    return out


def pin_choices(model: torch.nn.Module, choices: dict, *, backend: str | None = None) -> None:
    """Pin ``choices`` (``{module name: choice}``; a choice is what ``choice=`` takes, None for the
    backend's default) on the rawconv convolution modules of ``model`` named there, for every
    problem (what an autotune pinned on those modules is dropped); the choices belong to
    ``backend`` (``"onednn"`` / ``"cudnn"``; default: each module's device's), so a later
    ``.to()`` to the other device drops them as usual. A training step (a
    :class:`rawconv.ops.TrainingChoice` or a dict per direction) pins the forward and both backward
    passes; a forward-only choice or None replaces the module's earlier pins of all three (its
    backward passes run the backend's default again). Nothing is checked against the library
    here: a choice it does not offer raises :class:`NotSupportedError` at the module's first call.
    Raises :class:`ArgumentError` naming a name that is not a rawconv convolution module of
    ``model``, :class:`ArgumentTypeError` for a choice of a type ``choice=`` does not take, and
    :class:`ArgumentError` for a step with unknown directions: all checked before anything is
    pinned (nothing is pinned then)."""
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(choices, dict):
        raise ArgumentTypeError(f"choices must be a dict {{module name: choice}}, got {type(choices).__name__}")
    if backend is not None and backend not in ("onednn", "cudnn"):
        raise ArgumentError(f"backend must be 'onednn', 'cudnn' or None, got {backend!r}")
    mods = _conv_modules(model)
    bad = [n for n in choices if n not in mods]
    if bad:
        raise ArgumentError(f"not rawconv convolution modules of this model: {bad} (rawconv.nn.convert swaps "
                            f"torch's; these are: {list(mods)})")
    pins = []   # (module, forward choice, backward pair or None): every entry checked first
    for n, c in choices.items():
        m = mods[n]
        what = f"pin_choices: choices[{n!r}]"
        if c is not None and not isinstance(c, str) and _is_step(c):   # a whole training step
            fwd, bwd = _split(c, None, m._transposed)
            pins.append((m, _check_choice(fwd, what), _check_choice(bwd, what + " (backward)", pair=True)))
        else:   # a forward-only choice or None: the earlier backward pins go too
            pins.append((m, _check_choice(c, what), None))
    for m, fwd, bwd in pins:
        m.choice, m.backward_choice = fwd, bwd
        m.__dict__.pop(_TUNED_ATTR, None)
        m.__dict__.pop(_NEW_ATTR, None)
        m._choice_backend = backend or m._device_backend()
        st = m.__dict__.get(_fused._FROZEN_STATE)
        if st is not None:   # its plans resolved the old choice
            st.plans.clear()


# ---------------------------------------------------------------------------- describe
@dataclass
class LayerReport:
    """One convolution layer in :func:`describe`: what rawconv and torch run, their times (ms;
    CPU: both timed together in interleaved rounds, each round's fastest clean call, median over
    rounds; CUDA: GPU time with calls queued behind a busy GPU) and their errors against float64
    (max |y - ref| / max |ref|). ``backward``: what the layer's backward passes run in a
    training step (the library's choice for each, by its one name); ``ratio``: torch's time over
    rawconv's taken within each round (``value``, ``lo``/``hi`` the interquartile range;
    :class:`rawconv.bench.Ratio`); ``timing_flags``: what was measured against those times
    (waited for a CPU, rounds disagree), as ``compare`` flags its rows."""

    name: str
    module: str
    problem: str
    rawconv_backend: str
    rawconv_runs: str
    torch_backend: str
    torch_runs: str
    rawconv_ms: float | None = None
    torch_ms: float | None = None
    rawconv_err: float | None = None
    torch_err: float | None = None
    note: str = ""
    backward: str = ""
    ratio: dict | None = None
    timing_flags: list = field(default_factory=list)

    @property
    def speedup(self) -> float | None:
        """torch time / rawconv time (> 1: rawconv is faster): the median of the per-round ratios
        where the two were timed in rounds, else the ratio of the times."""
        if self.ratio is not None and self.ratio.get("value") is not None:
            return self.ratio["value"]
        if self.rawconv_ms and self.torch_ms:
            return self.torch_ms / self.rawconv_ms
        return None

    def __str__(self) -> str:
        def f(v, fmt):
            return format(v, fmt) if v is not None else "-"
        return (f"{self.name} [{self.module}] {self.problem}\n"
                f"  rawconv: {self.rawconv_backend} {self.rawconv_runs}  {f(self.rawconv_ms, '.4f')} ms  "
                f"err {f(self.rawconv_err, '.2e')}\n"
                + (f"  rawconv backward: {self.backward}\n" if self.backward else "")
                + f"  torch:   {self.torch_backend} {self.torch_runs}  {f(self.torch_ms, '.4f')} ms  "
                f"err {f(self.torch_err, '.2e')}" + (f"\n  note: {self.note}" if self.note else "")
                + "".join(f"\n  timing: {t}" for t in self.timing_flags))


class DescribeTable(list):
    """The rows of :func:`describe` (a list of :class:`LayerReport`) with a table as its repr;
    ``warnings``: the timing warnings of the run (as ``compare`` prints them: rows that waited
    for a CPU in most rounds, rounds that disagree)."""

    warnings: list = []

    def __repr__(self) -> str:
        return format_table(self)

    __str__ = __repr__


def _fmt_x(r: LayerReport) -> str:
    v = r.speedup
    if v is None:
        return "-"
    q = r.ratio
    iv = f" [{q['lo']:.2f}-{q['hi']:.2f}]" if q and q.get("lo") is not None else ""
    return f"{v:.2f}{iv}" + (" !" if r.timing_flags else "")


def format_table(rows: Sequence[LayerReport]) -> str:
    """The rows as a fixed-width table (one line per layer, no cell cut), then what ``x`` means,
    each layer's backward passes and note (why that choice runs there, what failed), and the
    timing warnings (:attr:`DescribeTable.warnings`)."""
    head = ("layer", "module", "problem", "rawconv runs", "ms", "err", "torch runs", "ms", "err", "x [IQR]")
    body = []
    for r in rows:
        def f(v, fmt):
            return format(v, fmt) if v is not None else "-"
        body.append((r.name, r.module, r.problem, f"{r.rawconv_backend}: {r.rawconv_runs}", f(r.rawconv_ms, ".3f"),
                     f(r.rawconv_err, ".1e"), f"{r.torch_backend}: {r.torch_runs}", f(r.torch_ms, ".3f"),
                     f(r.torch_err, ".1e"), _fmt_x(r)))
    widths = [max([len(h)] + [len(b[i]) for b in body]) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()   # noqa: E731
    out = [line(head), line(["-" * w for w in widths])] + [line(b) for b in body]
    out.append("ms: per call (CPU: rawconv and torch timed together in interleaved rounds, each round's fastest call "
               "during which our threads did not wait for a CPU, median over rounds; CUDA: GPU time); err: max "
               "|y - ref| / max |ref| against float64; x: torch ms / rawconv ms (> 1: rawconv faster), the median of "
               "the ratios taken within each round [their interquartile range]; !: time not to be trusted (see the "
               "layer's timing line)")
    out += [f"backward {r.name}: {r.backward}" for r in rows if r.backward]
    out += [f"note {r.name}: {r.note}" for r in rows if r.note]
    out += [f"timing {r.name}: {t}" for r in rows for t in r.timing_flags]
    out += [f"warning: {w}" for w in getattr(rows, "warnings", []) or []]
    return "\n".join(out)


def print_table(rows: Sequence[LayerReport], file=None) -> None:
    """Print :func:`describe`'s rows as a table."""
    print(format_table(rows), file=file)


def _torch_equivalent(m, x, residual=None, *, w=None, b=None, output_size=None):
    """What torch computes for layer ``m`` (its own functional ops), with optional other tensors."""
    w = m.weight if w is None else w
    b = m.bias if b is None else b
    nd = w.dim() - 2
    if isinstance(m, _TORCH_TRANSPOSED):
        op = m._output_padding(x, output_size, m.stride, m.padding, m.kernel_size, nd, m.dilation)
        f = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[nd]
        return f(x, w, b, m.stride, m.padding, op, m.groups, m.dilation)
    f = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    if m.padding_mode != "zeros":
        y = f(F.pad(x, m._reversed_padding_repeated_twice, mode=m.padding_mode), w, b, m.stride, 0, m.dilation,
              m.groups)
    else:
        y = f(x, w, b, m.stride, m.padding, m.dilation, m.groups)
    if isinstance(m, _ConvBiasAct):
        bn = m.__dict__.get(_fused.BN_KEY)
        if bn is not None:   # eval mode: the running statistics (what the fold computes)
            def c(t):
                return t.detach().to(device=y.device, dtype=y.dtype) if t is not None else None   # (describe's CPU reference)
            y = F.batch_norm(y, c(bn.running_mean), c(bn.running_var), c(bn.weight), c(bn.bias), False, 0.0, bn.eps)
        if residual is not None:
            y = y + residual
        y = _fused.apply_activation(y, m.activation)
    return y


def _call_choices(m, kind: str, args: dict):
    """(choice, backward_choice, TunedChoice or None, note) of a recorded call: what it ran and why."""
    table = m.__dict__.get(_TUNED_ATTR)
    if not table:
        return m.choice, m.backward_choice, None, ""
    key = _call_key(m, kind, args)
    t = table.get(key) if key is not None else None
    if t is None:
        return m.choice, m.backward_choice, None, (
            f"not a problem this layer was autotuned for ({'; '.join(e.problem for e in table.values())}): "
            + ("the library's default runs" if m.choice is None else f"its own choice {m.choice!r} runs"))
    choice = t.choice if m.choice is None else m.choice
    bwd = t.backward_choice if m.backward_choice is None else m.backward_choice
    note = f"autotuned: {', '.join(f'{d} {c}' for d, c in t.directions.items())}" + (
        "" if bwd is not None else "; backward passes not tuned (the libraries' defaults)")
    if m.choice is not None:
        note += f"; the module's own choice {m.choice!r} runs"
    return choice, bwd, t, note


def _rawconv_runs(m, kind, args, backend, choice=None) -> str:
    """A label of the candidate rawconv runs for this call (asks the library); ``choice``: the
    forward choice the call ran with (:func:`_call_choices`)."""
    x = args["x"]
    w, b = _call_wb(m, args)
    unfused = (m.__dict__.get(_fusion.UNFUSED_ATTR) or {}).get(_call_key(m, kind, args)) \
        if kind == "fused" and m.choice is None else None
    if unfused is not None:   # convert measured this problem faster unfused (rawconv.pytorch.fusion)
        tail = (["add"] if args.get("residual") is not None else []) + \
            ([m.activation] if m.activation != "none" else [])
        return f"unfused (measured faster): conv+bias {unfused}, then torch's {'+'.join(tail)}"
    try:
        if backend == "onednn":
            if kind == "fused":
                plan = _fused.plan_for(x, w, b, args.get("residual"), m.stride, _norm_padding(args["padding"]),
                                       m.dilation, m.groups, activation=m.activation, backend="onednn",
                                       choice=choice, precision=m.precision)
            elif kind == "conv":
                plan = onednn.Convolution(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups,
                                          impl=choice, fpmath=m.precision, prepack=False)
            else:
                plan = onednn.Convolution.from_problem(_problem_of(m, kind, args), direction="backward_data",
                                                       impl=choice, fpmath=m.precision,
                                                       w_layout=onednn.weights_layout(w), prepack=False)
            s = plan.selected
            packed = plan.prepack or (kind == "fused" and _fused.frozen(m))
            ro = [r + ("(prepacked)" if r == "w" and packed else "") for r in s.reorders]
            label = f"{s.name}@{s.layouts}" + (f" reorders={','.join(ro)}" if ro else "")
            if kind == "fused":
                label += f" post-ops={'+'.join(o[0] if o[0] == 'sum' else o[1] for o in plan._post_ops) or 'none'}"
            return label
        if kind == "fused":
            plan = _fused.plan_for(x, w, b, args.get("residual"), m.stride, _norm_padding(args["padding"]), m.dilation,
                                   m.groups, activation=m.activation, backend="cudnn", choice=choice,
                                   precision=m.precision)
            return f"graph {plan.selected_name} (conv+bias{'+add' if args.get('residual') is not None else ''}" \
                   f"{'+' + m.activation if m.activation != 'none' else ''})"
        from .. import cudnn

        if isinstance(choice, str) and cudnn.is_graph_choice(choice):
            return f"graph {choice}"
        if kind == "conv" and (choice is None or choice == "") and m.backend == "auto":
            # what the operator runs with no choice: the graph API's default (cudnn.forward would
            # name the legacy API's heuristic, which only backend="cudnn" runs)
            from ..cudnn import graph as G
            from . import ops as _ops

            try:
                plan = G.cached_forward_plan(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups, None,
                                             None, False, _ops._GRAPH_MATH[m.precision])
                return f"graph {plan.selected_name}"
            except NotSupportedError:
                pass   # no graph config: the legacy API runs it (below)
        if kind == "conv":
            _, info = cudnn.forward(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups,
                                    choice=choice, precision=m.precision, return_info=True)
        else:
            p = _problem_of(m, kind, args)
            xb = x.unsqueeze(0) if x.dim() == w.dim() - 1 else x
            _, info = cudnn.backward_data(xb, w, p.x_shape, p.stride, p.pad_before, p.dilation, p.groups,
                                          choice=choice, precision=m.precision, return_info=True)
        return f"legacy {info.algo}@{info.math}"
    except (NotSupportedError, ArgumentError) as exc:
        return f"(not available: {exc})"


def _torch_backend(m, x) -> str:
    nd = m.weight.dim() - 2
    try:
        xx = x.unsqueeze(0) if x.dim() == nd + 1 else x
        pad = m.padding
        if isinstance(pad, str) or m.padding_mode != "zeros":
            if m.padding_mode != "zeros":
                xx = F.pad(xx, m._reversed_padding_repeated_twice, mode=m.padding_mode)
                pad = (0,) * nd
            else:
                p = ConvProblem.from_torch(xx, m.weight, None, m.stride, pad, m.dilation, m.groups)
                if not p.symmetric:
                    return "?"
                pad = p.pad_before
        transposed = isinstance(m, _TORCH_TRANSPOSED)
        op = list(m.output_padding) if transposed else [0] * nd
        be = torch._C._select_conv_backend(xx, m.weight, m.bias, list(m.stride), list(pad), list(m.dilation),
                                           transposed, op, m.groups)
        return _conv_backend_name(be)
    except Exception as exc:   # noqa: BLE001  (a private API)
        return f"unknown ({type(exc).__name__})"


# torch's ConvBackend enum (aten/src/ATen/native/ConvUtils.h) in order: the Python binding leaves
# MkldnnTranspose (9) unnamed and spells MpsTranspose with a trailing comma
_CONV_BACKENDS = ("CudaDepthwise2d", "CudaDepthwise3d", "Cudnn", "CudnnTranspose", "Empty", "Miopen",
                  "MiopenDepthwise", "MiopenTranspose", "Mkldnn", "MkldnnTranspose", "MkldnnEmpty", "NnpackSpatial",
                  "Overrideable", "Slow2d", "Slow3d", "SlowDilated2d", "SlowDilated3d", "SlowTranspose2d",
                  "SlowTranspose3d", "Winograd3x3Depthwise", "Xnnpack2d", "Mps", "MpsTranspose")


def _conv_backend_name(be) -> str:
    name = str(be).split(".")[-1].rstrip(",")
    if "?" in name:
        i = int(be)
        name = _CONV_BACKENDS[i] if 0 <= i < len(_CONV_BACKENDS) else f"ConvBackend({i})"
    return name


def _torch_runs(fn, device) -> str:
    if device.type == "cpu":
        from .torch_choice import torch_onednn_trace

        trace = torch_onednn_trace(fn)
        convs = [t for t in trace if t["kind"] in ("convolution", "deconvolution")]
        if not convs:
            return "(no oneDNN primitive)"
        reorders = sum(t["kind"] == "reorder" for t in trace)
        return f"oneDNN {convs[0]['impl']}" + (f" + {reorders} reorder(s)" if reorders else "") + \
            (f" + {len(trace) - len(convs) - reorders} other" if len(trace) - len(convs) - reorders else "")
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return " + ".join(dict.fromkeys(n[:80] for n in names)) or "(no kernel seen)"
    except Exception as exc:   # noqa: BLE001
        return f"(profiler: {type(exc).__name__})"


def _timer(fn, device, iterations: int) -> float:
    """Median ms per call of ``fn``: CUDA, GPU time with calls queued behind a busy GPU; CPU, as
    ``compare`` times (interleaved rounds of one candidate, each round's fastest clean call)."""
    from ..core import bench

    if device.type == "cuda":
        return bench.time_cuda_queued(fn, iterations=iterations).median_ms
    rounds, calls = bench.round_plan(iterations)
    return bench.time_rounds({"f": fn}, rounds=rounds, calls=calls, warmup=2)["f"].stats().median_ms


def _time_pair(run_rawconv, run_torch, iterations: int) -> tuple:
    """rawconv's and torch's calls of one layer timed together in interleaved rounds
    (:func:`rawconv.bench.time_rounds`: ``iterations`` calls each). Returns ``(rawconv ms, torch
    ms, ratio dict or None, flags)``: each side's median over rounds of its fastest clean call,
    torch / rawconv taken within each round (:func:`rawconv.bench.ratio`), and what was
    measured against them (``"rawconv: waited for a CPU: ..."``)."""
    from ..core import bench

    rounds, calls = bench.round_plan(iterations)
    t = bench.time_rounds({"rawconv": run_rawconv, "torch": run_torch}, rounds=rounds, calls=calls, warmup=2)
    q = bench.ratio(t["torch"], t["rawconv"])
    flags = [f"{k}: {f}" for k in ("rawconv", "torch") for f in t[k].flags()]
    return t["rawconv"].stats().median_ms, t["torch"].stats().median_ms, (q.as_dict() if q else None), flags


def _rel_err(y, ref) -> float:
    y64 = y.detach().to("cpu", torch.float64)
    denom = ref.abs().max().item()
    d = (y64 - ref).abs().max().item()
    return d / denom if denom > 0 else d


def _copied(v):
    return v.detach().clone() if isinstance(v, torch.Tensor) else v


def describe(model: torch.nn.Module, example_input: Any, *, iterations: int = 10, timing: bool = True,
             torch_kernels: bool = True) -> DescribeTable:
    """Each convolution layer of ``model`` on ``example_input``: what rawconv runs and what torch runs.

    The model runs once (no grad) with hooks that record every convolution module's call. For each
    layer (a :class:`LayerReport`): ``problem`` (:meth:`ConvProblem.describe`; transposed layers:
    the matching convolution's problem), what rawconv runs (backend and candidate: oneDNN
    implementation, layouts, reorders, post-ops; cuDNN algo@math or graph engine config; for a
    torch layer, what :func:`convert` would run by default), what torch runs
    (``torch._C._select_conv_backend``; on CPU the implementation torch's own oneDNN ran, from
    its verbose log; on CUDA the kernel names torch's call launched, from ``torch.profiler``,
    with ``torch_kernels``), the median time of each (``iterations`` calls; CUDA: GPU time,
    calls queued behind a busy GPU) and the error of each against float64 (torch's float64
    functional ops on the CPU, fused residual and activation included), what the layer's backward
    passes run in a training step (``backward``: the library's choice per direction, by its one
    name). On the CPU both sides are timed together in interleaved rounds, ``x`` is the median
    of torch / rawconv taken within each round with its interquartile range, and a layer whose
    rounds waited for a CPU or disagree is flagged as ``compare`` flags its rows
    (:class:`rawconv.bench.TimingWarning` warnings, the table's ``warnings`` and timing lines).
    Returns a :class:`DescribeTable` (a list whose repr is a table; :func:`print_table`).
    """
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    names, calls = _record_conv_calls(model, example_input)
    rows = DescribeTable()
    for m, args, kwargs in calls:
        rows.append(_describe_layer(m, args, kwargs, names.get(id(m), "?"), iterations, timing, torch_kernels))
    from ..core.bench import TimingWarning, flag_warnings

    rows.warnings = flag_warnings([r.timing_flags for r in rows if r.ratio is not None])
    for w in rows.warnings:
        warnings.warn(f"rawconv.nn.describe: {w}", TimingWarning, stacklevel=_guard.stacklevel())
    return rows


def _record_conv_calls(model: torch.nn.Module, example_input: Any) -> tuple[dict, list]:
    """Run ``model`` once on ``example_input`` (no grad) with hooks on its convolution modules.
    Returns ``(names, calls)``: ``{id(module): name}``, and each module's first call as
    ``(module, args, kwargs)`` with copies of its tensors, in call order."""
    convs = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d) + _TORCH_TRANSPOSED
    names = {}
    calls: list = []
    hooks = []
    mods = [(n, m) for n, m in model.named_modules() if isinstance(m, convs)]
    mods += [(n, m) for n, m in _conv_modules(model).items() if m.__dict__.get("_rawconv_helper")]
    for name, m in mods:
        if isinstance(m, convs):
            names[id(m)] = name

            def hook(mod, args, kwargs):
                # copies: the model's own run goes on after this call and may write into these tensors
                # (a fused module marked residual_inplace adds its result into the residual's memory)
                if not any(c[0] is mod for c in calls):
                    calls.append((mod, tuple(_copied(a) for a in args), {k: _copied(v) for k, v in kwargs.items()}))
            hooks.append(m.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(*_as_args(example_input))
    finally:
        for h in hooks:
            h.remove()
    return names, calls


def _describe_layer(m, args: tuple, kwargs: dict, name: str, iterations: int, timing: bool,
                    torch_kernels: bool) -> LayerReport:
    """:func:`describe`'s row for one recorded call of the convolution module ``m`` (named ``name``;
    ``args``, ``kwargs``: the call's arguments): what rawconv and torch run, their errors against
    float64 and (``timing``) their median times over ``iterations`` calls. Returns the
    :class:`LayerReport`."""
    x = args[0]
    residual = args[1] if len(args) > 1 else kwargs.get("residual")
    output_size = args[1] if isinstance(m, _TORCH_TRANSPOSED) and len(args) > 1 else kwargs.get("output_size")
    rm = m if isinstance(m, _RawconvConv) else _swap_module(copy.copy(m), "auto", None, "strict")
    with torch.no_grad():
        fell_back = _fallback.reason_for(rm, x)
    if fell_back is not None:   # a call no rawconv library runs: torch's own kernel, on both sides
        return _describe_fallback(m, x, residual, output_size, name, fell_back, iterations, timing)
    backend = _resolve_backend(rm.backend, x.device)
    # the exact library call of the rawconv module
    with _recording() as rec, torch.no_grad():
        rm(x, _copied(residual)) if isinstance(rm, _ConvBiasAct) else rm(x) if output_size is None \
            else rm(x, output_size)
    note = ""
    backward = ""
    if rec:
        _, kind, cargs = rec[0]
        problem = _problem_of(rm, kind, cargs).describe()
        choice, bwd, _t, note = _call_choices(rm, kind, cargs)
        runs = _rawconv_runs(rm, kind, cargs, backend, choice)
        backward = _rawconv_backward(rm, kind, cargs, backend, choice, bwd)
    else:
        problem, runs, note = "?", "?", "the call ran outside rawconv's fused path (broadcast residual)"

    scratch = residual.clone() if residual is not None else None

    def run_rawconv(r=None):
        # the residual a fused module may write into: a copy per checked call (r=None), a scratch
        # tensor when timed (what the model's call does, in place where convert allowed it)
        with torch.no_grad():
            if isinstance(rm, _ConvBiasAct):
                return rm(x, residual.clone() if r is None and residual is not None else r)
            return rm(x) if output_size is None else rm(x, output_size)

    def run_torch():
        with torch.no_grad():
            return _torch_equivalent(m, x, residual, output_size=output_size)

    ref = _reference64(m, x, residual, output_size)
    label = type(m).__name__ + (f"({m.activation}{', residual' if residual is not None else ''})"
                                if isinstance(m, _ConvBiasAct) else "")
    row = LayerReport(name, label, problem, backend, runs, _torch_backend(m, x),
                      _torch_runs(run_torch, x.device) if (torch_kernels or x.device.type == "cpu") else "",
                      note=note, backward=backward)
    ran = False
    try:
        row.rawconv_err = _rel_err(run_rawconv(), ref)
        ran = True
        if timing and x.device.type == "cuda":
            row.rawconv_ms = _timer(lambda: run_rawconv(scratch), x.device, iterations)
    except (NotSupportedError, ArgumentError) as exc:
        row.note = (row.note + "; " if row.note else "") + f"rawconv: {exc}"
    row.torch_err = _rel_err(run_torch(), ref)
    if timing and x.device.type == "cuda":
        row.torch_ms = _timer(run_torch, x.device, iterations)
    elif timing:   # the CPU: both sides together, in interleaved rounds
        if ran:
            row.rawconv_ms, row.torch_ms, row.ratio, row.timing_flags = _time_pair(lambda: run_rawconv(scratch),
                                                                                   run_torch, iterations)
        else:
            row.torch_ms = _time_pair(run_torch, run_torch, iterations)[1]
    return row


def _rawconv_backward(m, kind: str, args: dict, backend: str, choice, bwd) -> str:
    """What layer ``m``'s backward passes run for this recorded call, by each candidate's one name
    (oneDNN: the plans :func:`rawconv.ops.selected` builds for ``choice`` and ``bwd``; cuDNN: the
    pinned choices, else "cuDNN's choice at the first call"); '' where it does not say
    (transposed layers)."""
    if kind == "transpose":
        return ""
    pinned = "pinned" if bwd is not None else "the library's first choice (not pinned)"
    if backend != "onednn":
        d, wt = _pair(bwd) if bwd is not None else (None, None)
        return (f"backward_data {d or 'cuDNN picks at the first call'}, backward_weights "
                f"{wt or 'cuDNN picks at the first call'}")
    from .ops import selected

    x = args["x"]
    w, b = _call_wb(m, args)
    try:
        sel = selected(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups,
                       choice=choice if kind == "conv" else None, backward_choice=bwd, precision=m.precision)
    except (NotSupportedError, ArgumentError) as exc:
        return f"(not available: {exc})"
    return f"backward_data {sel['backward_data']}, backward_weights {sel['backward_weights']} ({pinned})"


def _reference64(m, x, residual, output_size):
    """What torch computes for layer ``m``'s call in float64 on the CPU (:func:`describe`'s reference)."""
    x64 = x.detach().to("cpu", torch.float64)
    r64 = residual.detach().to("cpu", torch.float64) if residual is not None else None
    with torch.no_grad():
        return _torch_equivalent(m, x64, r64, w=m.weight.detach().to("cpu", torch.float64),
                                 b=m.bias.detach().to("cpu", torch.float64) if m.bias is not None else None,
                                 output_size=output_size)


def _describe_fallback(m, x, residual, output_size, name: str, why: str, iterations: int,
                       timing: bool) -> LayerReport:
    """:func:`describe`'s row for a call that runs on torch's own kernel (``why``): what torch runs,
    its time and its error against float64 (the CPU's float64 reference is torch's own kernel too:
    no error is computed for a float64 call there)."""
    def run_torch():
        with torch.no_grad():
            return _torch_equivalent(m, x, residual, output_size=output_size)

    problem = f"{x.dtype} {x.device.type} x{tuple(x.shape)} w{tuple(m.weight.shape)}"
    runs = _torch_backend(m, x)
    row = LayerReport(name, type(m).__name__, problem, "torch (fallback)", f"{runs}: {why}", runs,
                      "torch's own kernel", note=f"runs on torch's own kernel: {why}")
    if x.dtype != torch.float64 and not x.dtype.is_complex and x.device.type in ("cpu", "cuda"):
        row.torch_err = row.rawconv_err = _rel_err(run_torch(), _reference64(m, x, residual, output_size))
    if timing and x.device.type in ("cpu", "cuda"):
        row.torch_ms = row.rawconv_ms = _timer(run_torch, x.device, iterations)
    return row


# every public entry point raises only rawconv's exception classes (rawconv._guard)
from ..core import guard as _guard  # noqa: E402

_guard.guard_module(globals(), "conv", "conv_transpose", "convert", "refresh", "describe", "print_table", "pinned_choices",
                    "pin_choices", "torch_fallbacks",
                    "_RawconvConv.forward", "_RawconvConvTranspose.forward", "_ConvBiasAct.forward",
                    "_ConvBiasAct.from_conv")
