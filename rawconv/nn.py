"""torch.nn modules on pinned oneDNN / cuDNN choices, whole-model conversion, fusion, and a per-layer report.

    import rawconv.nn

    conv = rawconv.nn.Conv2d(64, 64, 3, padding=1, choice="x64:gemm:jit")  # a torch.nn.Conv2d
    y = conv(x)                          # forward on exactly that oneDNN implementation
    conv.cuda()                          # follows the device: cuDNN now (a oneDNN choice is dropped)

    model = rawconv.nn.convert(torchvision_model)                   # every conv swapped, weights kept
    model = rawconv.nn.convert(model.eval(), fuse=True, autotune=x) # BN folded, conv+bias(+add)+ReLU fused,
                                                                    # each distinct problem tuned once
    print(rawconv.nn.describe(model, x))                            # per layer: rawconv vs torch

* :class:`Conv1d` / :class:`Conv2d` / :class:`Conv3d` and :class:`ConvTranspose1d` / ``2d`` / ``3d``
  subclass the torch modules (same constructor, same ``state_dict``, ``isinstance`` holds) and add
  ``backend`` (``"auto"``: by the input's device; ``"onednn"``; ``"cudnn"``), ``choice`` (the
  pinned candidate: a oneDNN implementation name / ``"name@user"`` / position, a cuDNN
  ``"ALGO@math"`` or graph engine config ``"eng28{k2=3}"``), ``backward_choice`` (one value, or
  a ``(data, weights)`` pair) and ``precision`` (``"strict"``, ``"tf32"``, ``"bf16"``, ``"f16"``,
  ``"any"``; :mod:`rawconv.options`). ``impl=`` / ``backward_impl=`` / ``fpmath=`` are the old
  names of ``choice`` / ``backward_choice`` / ``precision`` and still work.
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
import operator
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from . import fused as _fused
from . import onednn
from ._grad import functorch_active as _functorch, has_tangent as _has_tangent
from .errors import ArgumentError, ArgumentTypeError, InternalError, NotSupportedError, RawconvError
from .options import PRECISIONS
from .problem import ConvProblem, shape_only, tuple_arg

__all__ = ["conv", "conv_transpose", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
           "ConvTranspose3d", "ConvBiasAct1d", "ConvBiasAct2d", "ConvBiasAct3d", "convert", "describe",
           "LayerReport", "ConvertReport", "print_table", "BACKENDS", "pinned_choices", "pin_choices",
           "refresh"]

BACKENDS = ("auto", "onednn", "cudnn")


# ---------------------------------------------------------------------------- argument helpers
def _check_backend(backend) -> str:
    if not isinstance(backend, str):
        raise ArgumentTypeError(f"backend must be one of {list(BACKENDS)}, got {type(backend).__name__}")
    if backend not in BACKENDS:
        raise ArgumentError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    return backend


def _check_precision(precision) -> str:
    if not isinstance(precision, str):
        raise ArgumentTypeError(f"precision must be one of {list(PRECISIONS)}, got {type(precision).__name__}")
    if precision not in PRECISIONS:
        raise ArgumentError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    return precision


def _alias(new, old, new_name: str, old_name: str, default=None):
    """``new`` or its old name's value (both given: they must agree)."""
    if old is None:
        return new if new is not None else default
    if new is not None and new != old and new != default:
        raise ArgumentError(f"{new_name}={new!r} and {old_name}={old!r} disagree ({old_name} is the old name of "
                            f"{new_name}); pass one")
    return old


def _check_choice(c: Any, what: str, pair: bool = False) -> Any:
    """``c`` as given when it is a choice the modules and operators take (the rules of
    ``rawconv.ops``' check): None, a name string, or a listed candidate (a oneDNN
    ``Implementation``, a cuDNN ``Algorithm`` / ``EngineConfig``: anything with a string
    ``choice``). ``pair``: also a (data, weights) pair of those (``backward_choice``). Raises
    :class:`ArgumentTypeError` naming ``what`` otherwise; an int position says where positions
    are accepted: a position indexes one problem's listing, which a module or an operator reused
    across shapes cannot honour."""
    if pair and isinstance(c, (tuple, list)):
        if len(c) != 2:
            raise ArgumentError(f"{what} must be one choice or a (data, weights) pair, got {c!r}")
        for i, part in enumerate(c):
            _check_choice(part, f"{what}[{i}]")
        return c
    if c is None or isinstance(c, str) or isinstance(c, onednn.Implementation) or \
            isinstance(getattr(c, "choice", None), str):
        return c
    msg = (f"{what} must be None, a name string or a listed candidate (Implementation, Algorithm, "
           f"EngineConfig), got {type(c).__name__} {c!r}")
    if isinstance(c, int) and not isinstance(c, bool):
        msg += ("; positions are indices into one problem's listing and are accepted only by the backend "
                "function forms (rawconv.onednn.forward(x, w, impl=0), rawconv.cudnn.forward(..., algo=0)): "
                "pass the listed row or its name, e.g. rawconv.onednn.implementations(x, w)[0].name")
    raise ArgumentTypeError(msg)


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


def _norm_padding(padding):
    if isinstance(padding, list):
        return tuple(tuple(p) if isinstance(p, list) else p for p in padding)
    return padding


# ---------------------------------------------------------------------------- backend calls (no autograd)
def _forward(x, w, b, stride, padding, dilation, groups, *, backend, choice=None, precision="strict"):
    bk = _resolve_backend(backend, x.device)
    if bk == "onednn":
        return onednn.forward(x, w, b, stride, padding, dilation, groups, impl=choice, fpmath=precision)
    from . import cudnn

    return cudnn.forward(x, w, b, stride, padding, dilation, groups, choice=choice, precision=precision)


def _backward_data(gy, w, x_shape, stride, padding, dilation, groups, *, backend, choice=None, precision="strict"):
    bk = _resolve_backend(backend, gy.device)
    if bk == "onednn":
        return onednn.backward_data(gy, w, x_shape, stride, padding, dilation, groups, impl=choice, fpmath=precision)
    from . import cudnn

    return cudnn.backward_data(gy, w, x_shape, stride, padding, dilation, groups, choice=choice, precision=precision)


def _backward_weights(x, gy, w_shape, stride, padding, dilation, groups, *, backend, choice=None,
                      precision="strict"):
    bk = _resolve_backend(backend, x.device)
    gy = _like_layout(gy, x)
    if bk == "onednn":
        return onednn.backward_weights(x, gy, w_shape, stride, padding, dilation, groups, impl=choice,
                                       fpmath=precision)
    from . import cudnn

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
    ``backward_choice``: one value or a ``(data, weights)`` pair; ``precision``: see
    :mod:`rawconv.options`. ``impl`` / ``backward_impl`` / ``fpmath``: the old names.
    Raises :class:`ArgumentError` / :class:`ArgumentTypeError` for bad input (a choice of another
    type, an int position) before any C call and :class:`NotSupportedError` for a choice the
    library does not offer. Wraps the backends' ``forward`` / ``backward_data`` /
    ``backward_weights``.
    """
    choice = _check_choice(_alias(choice, impl, "choice", "impl"), "impl" if impl is not None else "choice")
    backward_choice = _check_choice(_alias(backward_choice, backward_impl, "backward_choice", "backward_impl"),
                                    "backward_impl" if backward_impl is not None else "backward_choice", pair=True)
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
    from .problem import transposed_shapes

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
                      backward_impl=None, fpmath=None):
        self.backend = _check_backend(backend)
        self.choice = _check_choice(_alias(choice, impl, "choice", "impl"), "impl" if impl is not None else "choice")
        self.backward_choice = _check_choice(
            _alias(backward_choice, backward_impl, "backward_choice", "backward_impl"),
            "backward_impl" if backward_impl is not None else "backward_choice", pair=True)
        self.precision = _check_precision(_alias(precision, fpmath, "precision", "fpmath", "strict"))
        self._choice_backend = self._device_backend()

    # old names
    impl = property(lambda self: self.choice, lambda self, v: setattr(self, "choice", v))
    backward_impl = property(lambda self: self.backward_choice, lambda self, v: setattr(self, "backward_choice", v))
    fpmath = property(lambda self: self.precision, lambda self, v: setattr(self, "precision", v))

    def _device_backend(self) -> str:
        dev = self.weight.device if self.weight is not None else torch.device("cpu")
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
        dev = self.weight.device.type
        want = "cudnn" if dev == "cuda" else "onednn" if dev == "cpu" else None
        if want is None:
            return
        if self.backend != "auto" and self.backend != want:
            self.backend = want
        if self._choice_backend != want:
            if self.choice is not None or self.backward_choice is not None:
                warnings.warn(f"{type(self).__name__}: moved to {dev}; the {self._choice_backend} choice "
                              f"{self.choice!r} (backward {self.backward_choice!r}) was dropped (the {want} "
                              "default runs: set .choice or use rawconv.nn.convert(..., autotune=x))",
                              RuntimeWarning, stacklevel=_guard.stacklevel())
            self.choice = self.backward_choice = None
            self._choice_backend = want

    def _padded(self, x):
        """(input, padding) for the library: non-'zeros' padding modes pad in torch first."""
        if self.padding_mode != "zeros":
            return F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode), 0
        return x, self.padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, padding = self._padded(x)
        _record(self, "conv", x=x, padding=padding)
        return conv(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups,
                    backend=self.backend, choice=self.choice, precision=self.precision,
                    backward_choice=self.backward_choice)

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", backend={self.backend!r}, choice={self.choice!r}, "
                f"precision={self.precision!r}")


class _RawconvConvTranspose(_RawconvConv):
    _transposed = True

    def forward(self, x: torch.Tensor, output_size: Sequence[int] | None = None) -> torch.Tensor:
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
        return conv_transpose(x, self.weight, self.bias, self.stride, self.padding, output_padding, self.groups,
                              self.dilation, backend=self.backend, choice=self.choice, precision=self.precision,
                              backward_choice=self.backward_choice)


def _module(base, mixin, doc: str):
    class Module(mixin, base):
        def __init__(self, *args, backend: str = "auto", choice: Any = None, backward_choice: Any = None,
                     precision: str | None = None, impl: Any = None, backward_impl: Any = None,
                     fpmath: str | None = None, **kwargs):
            base.__init__(self, *args, **kwargs)
            self._rawconv_init(backend, choice, backward_choice, precision, impl, backward_impl, fpmath)

    Module.__name__ = Module.__qualname__ = base.__name__
    Module.__module__ = __name__
    Module.__doc__ = (f"``torch.nn.{base.__name__}`` on rawconv: same arguments and state_dict, plus ``backend`` "
                      "(\"auto\" | \"onednn\" | \"cudnn\"), ``choice``, ``backward_choice``, ``precision`` "
                      "(old names ``impl``, ``backward_impl``, ``fpmath``). " + doc)
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
        self.activation = _fused._check_activation(activation)

    def _op_args(self):
        """(stride, padding, dilation) lists as the operator takes them (padding: nd symmetric
        values or 2*nd befores-then-afters), computed once per configuration."""
        key = (self.stride, self.padding, self.dilation, self.padding_mode, self.kernel_size)
        cached = self.__dict__.get("_op_cache")
        if cached is not None and cached[0] == key:
            return cached[1]
        nd = len(self.kernel_size)
        if self.padding_mode != "zeros":
            pads = [0] * nd
        else:
            from .problem import resolve_padding

            pb, pa = resolve_padding(_norm_padding(self.padding), nd, self.kernel_size,
                                     tuple_arg(self.dilation, nd, "dilation", 1), tuple_arg(self.stride, nd, "stride", 1))
            pads = list(pb) + (list(pa) if pa != pb else [])
        args = (list(self.stride), pads, list(self.dilation))
        self.__dict__["_op_cache"] = (key, args)
        return args

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        x, padding = self._padded(x)
        stride, pads, dilation = self._op_args()
        choice = self.choice
        if isinstance(choice, int) and not isinstance(choice, bool):
            choice = str(choice)
        w, b, plans = self.weight, self.bias, None
        if _fused.FROZEN_WEIGHT in self._buffers and not (torch.is_grad_enabled() and (
                w.requires_grad or (b is not None and b.requires_grad))):
            # frozen by convert(fuse=True): the snapshot, unless autograd records through the parameters
            w, b = self._buffers[_fused.FROZEN_WEIGHT], self._buffers[_fused.FROZEN_BIAS]
            plans = True   # looked up on the eager path below (dynamo does not trace a tensor's __dict__)
        if residual is not None and not self._residual_fits(x, residual, stride, pads, dilation):
            # a residual that only broadcasts (or of another dtype/device): added in torch, as the
            # graph before fusion did
            y = torch.ops.rawconv.conv_bias_act(x, w, b, None, stride, pads, dilation, self.groups,
                                                "none", self.backend, None, self.precision)
            y = y + residual
            return torch.relu(y) if self.activation == "relu" else y
        if _RECORDING:
            _record(self, "fused", x=x, padding=padding, residual=residual)
        if not isinstance(x, torch.Tensor):
            raise ArgumentTypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if type(x) is torch.Tensor and not torch.compiler.is_compiling() and not (torch.is_grad_enabled() and (
                x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)
                or (residual is not None and residual.requires_grad))) \
                and not _functorch() and not _has_tangent(x, residual):
            # (a torch.func transform's batched tensors have no data pointer; a forward-mode tangent
            # would be dropped: both go through the operator, which runs or refuses them)
            # eager inference: the operator's kernel directly (the dispatcher's round trip costs host time)
            if plans is True:
                plans = _fused.frozen_plans_of(w)
                if plans is None and w.is_cpu:
                    # a snapshot moved by .to()/.half() (a new tensor): it carries the module's plans from now on
                    plans = self.__dict__.get(_fused._FROZEN_PLANS)
                    if plans is not None:
                        setattr(w, _fused._FROZEN_PLANS, plans)
            return _fused._op_kernel(x, w, b, residual, stride, pads, dilation, self.groups,
                                     self.activation, self.backend, choice, self.precision,
                                     self.__dict__.get("residual_inplace", False), plans)
        if residual is not None and self.__dict__.get("residual_inplace", False) and _fused.RESIDUAL_OP_GUARDED \
                and isinstance(x, torch.Tensor) \
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
        """A fused module from a ``torch.nn.Conv{1,2,3}d`` (its parameters, shared; with ``bn``, a
        BatchNorm in eval mode folded into new weight and bias). Backend/choice/precision default to
        the conv's when it is a rawconv module."""
        if bn is not None:
            conv = _fold_bn(conv, bn)
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.__dict__.update({k: v for k, v in conv.__dict__.items() if k not in ("_parameters", "_buffers",
                                                                                  "_modules")})
        new._parameters = dict(conv._parameters)
        new._buffers = dict(conv._buffers)
        new._modules = dict(conv._modules)
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
    Module.__doc__ = (f"``activation(conv(x) + bias + residual)`` as ONE library call: a ``torch.nn.{base.__name__}`` "
                      "(same constructor and state_dict) plus ``activation`` (\"relu\" | \"none\"), ``backend``, "
                      "``choice``, ``precision``; ``forward(x, residual=None)``. CPU: oneDNN post-ops (sum, "
                      "eltwise_relu); CUDA: one cuDNN graph. Differentiable once (meant for inference).")
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
    ``autotune_s`` (wall seconds of the search)."""

    swapped: list = field(default_factory=list)
    folded: list = field(default_factory=list)
    fused: dict = field(default_factory=dict)
    traced: bool | None = None
    trace_error: str = ""
    tuned: list = field(default_factory=list)
    autotune_s: float = 0.0

    def __str__(self) -> str:
        n = len(self.tuned)
        distinct = len({t["key"] for t in self.tuned})
        searched = sum(1 for t in self.tuned if t["searched"])
        lines = [f"rawconv.nn.convert: {len(self.swapped)} conv modules on rawconv, {len(self.folded)} BatchNorms "
                 f"folded, {len(self.fused)} fused ({', '.join(sorted(set(self.fused.values()))) or 'none'})"]
        if self.traced is False:
            lines.append(f"  torch.fx could not trace the model ({self.trace_error}): module-level fusion only")
        if n:
            lines.append(f"  autotune: {n} layers, {distinct} distinct problems, {searched} searched, "
                         f"{self.autotune_s:.2f} s")
        return "\n".join(lines)


def _swap_module(m: torch.nn.Module, backend, choice, precision) -> torch.nn.Module:
    """``m`` (an exact torch conv class) as the rawconv class, sharing its parameters and buffers."""
    cls = _SWAP[type(m)]
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


def _fold_bn(conv: torch.nn.Module, bn: torch.nn.Module) -> torch.nn.Module:
    """Fold an eval-mode BatchNorm into ``conv`` (new weight and bias Parameters; in place)."""
    from torch.nn.utils.fusion import fuse_conv_bn_weights

    if bn.running_mean is None or bn.running_var is None:
        raise ArgumentError(f"{type(bn).__name__} without running statistics cannot be folded")
    transposed = isinstance(conv, _TORCH_TRANSPOSED)
    d = lambda t: t.detach().double() if t is not None else None   # noqa: E731  (fold in float64)
    w, b = fuse_conv_bn_weights(d(conv.weight), d(conv.bias), d(bn.running_mean), d(bn.running_var), bn.eps,
                                d(bn.weight), d(bn.bias), transpose=transposed)
    old_w = conv.weight
    w = w.detach().to(old_w.dtype)
    if _is_cl(old_w):   # keep the weights' memory format (NHWC plans take NHWC weights as they are)
        w = w.contiguous(memory_format=torch.channels_last if w.dim() == 4 else torch.channels_last_3d)
    conv.weight = torch.nn.Parameter(w, requires_grad=old_w.requires_grad)
    conv.bias = torch.nn.Parameter(b.detach().to(old_w.dtype), requires_grad=old_w.requires_grad)
    return conv


def _fusable_conv(m) -> bool:
    """A forward conv whose forward is torch's or rawconv's (not a user subclass, not fused yet)."""
    return type(m) in _TORCH_CONVS or type(m) in (Conv1d, Conv2d, Conv3d)


def _foldable_conv(m) -> bool:
    return _fusable_conv(m) or type(m) in _TORCH_TRANSPOSED or type(m) in (ConvTranspose1d, ConvTranspose2d,
                                                                           ConvTranspose3d)


_RELU_FUNCS = (torch.relu, torch.relu_, F.relu, getattr(torch.nn.functional, "relu_", F.relu))
_ADD_FUNCS = (operator.add, operator.iadd, torch.add)


def _is_relu(node, modules) -> bool:
    if node.op == "call_module":
        return type(modules.get(node.target)) is torch.nn.ReLU
    if node.op == "call_function":
        return node.target in _RELU_FUNCS and len(node.args) == 1 and not {k for k in node.kwargs if k != "inplace"}
    if node.op == "call_method":
        return node.target in ("relu", "relu_") and len(node.args) == 1 and not node.kwargs
    return False


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
    """torch.fx pattern rewrite: conv -> BatchNorm folded; conv [-> add(residual)] [-> relu] as one
    ConvBiasAct module. Returns the GraphModule."""
    import torch.fx as fx

    class Tracer(fx.Tracer):
        # rawconv's own modules are calls to keep (a model converted before): fx must not trace into
        # their forward, which checks its input is a real tensor
        def is_leaf_module(self, m, qualname):
            return isinstance(m, _RawconvConv) or super().is_leaf_module(m, qualname)

    tracer = Tracer()
    graph = tracer.trace(model)
    gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
    modules = dict(gm.named_modules())
    graph = gm.graph
    calls: dict = {}
    for n in graph.nodes:
        if n.op == "call_module":
            calls[n.target] = calls.get(n.target, 0) + 1
    # BatchNorm folding
    for node in list(graph.nodes):
        if node.op != "call_module" or type(modules.get(node.target)) not in _BATCHNORMS or len(node.args) != 1:
            continue
        src = node.args[0]
        if not (isinstance(src, fx.Node) and src.op == "call_module" and _foldable_conv(modules.get(src.target))
                and len(src.users) == 1 and calls[src.target] == 1 and calls[node.target] == 1):
            continue
        bn = modules[node.target]
        if bn.training or bn.running_mean is None:
            continue
        _fold_bn(modules[src.target], bn)
        node.replace_all_uses_with(src)
        graph.erase_node(node)
        report.folded.append((src.target, node.target))
    # conv [+ residual] [relu] -> one module
    erased = set()
    for node in list(graph.nodes):
        if node in erased or node.op != "call_module" or not _fusable_conv(modules.get(node.target)):
            continue
        if calls[node.target] != 1 or len(node.args) != 1 or node.kwargs:
            continue
        conv_m = modules[node.target]
        if conv_m.weight.dim() - 2 not in _FUSED:
            continue
        last, residual, act, kind, add_node = node, None, "none", [], None
        users = list(node.users)
        if len(users) == 1:
            other = _add_other(users[0], node)
            if other is not None and not _depends_on(other, node):
                residual, last, add_node = other, users[0], users[0]
                kind.append("add")
        nxt = list(last.users)
        if len(nxt) == 1 and _is_relu(nxt[0], modules) and nxt[0].args[0] is last:
            act, last = "relu", nxt[0]
            kind.append("relu")
        name = node.target
        fused = _FUSED[conv_m.weight.dim() - 2].from_conv(
            conv_m, activation=act, backend=backend, choice=_choice_for(choice, name), precision=precision)
        _set_submodule(gm, name, fused)
        modules[name] = fused
        with graph.inserting_before(last):
            new = graph.call_module(name, (node.args[0],) + ((residual,) if residual is not None else ()))
        last.replace_all_uses_with(new)
        # erase the pattern's nodes, last first
        chain = [node] + ([add_node] if add_node is not None else []) + ([last] if act == "relu" else [])
        for n in reversed(chain):
            graph.erase_node(n)
            erased.add(n)
        report.fused[name] = "+".join(kind) or "bias"
    _mark_inplace_residuals(graph, modules)
    graph.lint()
    gm.recompile()
    gm.delete_all_unused_submodules()   # the folded BatchNorms, ReLUs no longer called
    return gm


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


def _fuse_sequential(model, report: ConvertReport, backend, choice, precision) -> None:
    """Module-level fusion where torch.fx cannot trace: inside each nn.Sequential, Conv ->
    BatchNorm -> ReLU runs (BatchNorm folded, ReLU fused; both replaced by nn.Identity)."""
    for seq_name, seq in list(model.named_modules()):
        if not isinstance(seq, torch.nn.Sequential):
            continue
        keys = list(seq._modules)
        i = 0
        while i < len(keys):
            m = seq._modules[keys[i]]
            full = f"{seq_name}.{keys[i]}" if seq_name else keys[i]
            if _fusable_conv(m) and m.weight.dim() - 2 in _FUSED:
                j = i + 1
                if j < len(keys) and type(seq._modules[keys[j]]) in _BATCHNORMS and not seq._modules[keys[j]].training:
                    _fold_bn(m, seq._modules[keys[j]])
                    report.folded.append((full, f"{seq_name}.{keys[j]}" if seq_name else keys[j]))
                    seq._modules[keys[j]] = torch.nn.Identity()
                    j += 1
                act = "none"
                if j < len(keys) and type(seq._modules[keys[j]]) is torch.nn.ReLU:
                    act = "relu"
                    seq._modules[keys[j]] = torch.nn.Identity()
                seq._modules[keys[i]] = _FUSED[m.weight.dim() - 2].from_conv(
                    m, activation=act, backend=backend, choice=_choice_for(choice, full), precision=precision)
                report.fused[full] = "relu" if act == "relu" else "bias"
                i = j
            i += 1


def convert(model: torch.nn.Module, *, inplace: bool = False, backend: str = "auto", choice: Any = None,
            precision: str = "strict", autotune: Any = None, fuse: bool = False, example_input: Any = None,
            autotune_budget_s: float | None = None) -> torch.nn.Module:
    """Run every convolution of ``model`` on rawconv, keeping its weights.

    Every ``torch.nn.Conv1d/2d/3d`` and ``ConvTranspose1d/2d/3d`` (exact classes; subclasses with
    their own forward are left alone) becomes the :mod:`rawconv.nn` module of the same class
    family, sharing parameters and buffers (``state_dict`` keys unchanged). ``inplace=False``
    converts a deep copy. ``backend``, ``precision``: for every layer; ``choice``: one value for
    every layer, a dict {module name: choice} or a callable(name) -> choice.

    ``fuse=True`` (inference: the model must be in eval mode): with torch.fx
    (``symbolic_trace``) every BatchNorm that directly follows a convolution is folded into its
    weight and bias, and each forward convolution becomes one :class:`ConvBiasAct2d` (1d/3d)
    call together with what follows it: a residual ``add`` (``out + identity``: the other operand
    is passed as the residual) and/or a ``relu``. The result is then a ``torch.fx.GraphModule``.
    The model may already be converted (rawconv's conv modules are fx leaf modules: traced as
    calls, then folded and fused like torch's).
    When tracing fails (data-dependent control flow...) a warning says so and only Conv ->
    BatchNorm -> ReLU sequences inside ``nn.Sequential`` are fused (module-level).

    ``autotune``: an example input (a tensor, or a tuple of arguments), or True to use
    ``example_input``: the model runs once on it, every convolution call is recorded, each
    distinct problem (shape, layout, dtype, fusion) is searched ONCE (oneDNN: every
    implementation timed; cuDNN: :meth:`rawconv.cudnn_graph.GraphConvolution.autotune` with
    ``autotune_budget_s`` per problem, default 0.6 s, the best 8 re-timed in 10 groups, tuning
    cache first, the next problem's first runtime compilations started in the background) and
    the winner is pinned as ``choice`` on every layer with that problem. Winners are remembered
    for the process (a second convert of the same problems searches nothing). Backward passes keep the backend's
    default choices. ``model.rawconv_report`` (:class:`ConvertReport`) says what was done.

    Raises :class:`ArgumentError` / :class:`ArgumentTypeError` for bad arguments (a training-mode
    model with ``fuse=True``; ``autotune=True`` without ``example_input``).
    """
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    _check_backend(backend)
    _check_precision(precision)
    for nm, v in (("inplace", inplace), ("fuse", fuse)):
        if not isinstance(v, bool):
            raise ArgumentTypeError(f"{nm} must be True or False, got {v!r}")
    if autotune is True:
        if example_input is None:
            raise ArgumentError("autotune=True needs example_input (or pass the example as autotune=x)")
        autotune = example_input
    elif autotune is False:
        autotune = None
    if autotune_budget_s is not None and (isinstance(autotune_budget_s, bool) or
                                          not isinstance(autotune_budget_s, (int, float)) or autotune_budget_s <= 0):
        raise ArgumentError(f"autotune_budget_s must be a positive number of seconds, got {autotune_budget_s!r}")
    if fuse and model.training:
        raise ArgumentError("fuse=True folds BatchNorm with its running statistics, which is only right for "
                            "inference: call model.eval() first (or convert(..., fuse=False) for training)")
    if not inplace:
        model = copy.deepcopy(model)
    report = ConvertReport()
    if fuse:
        try:
            model = _fuse_fx(model, report, backend, choice, precision)
            report.traced = True
        except Exception as exc:   # noqa: BLE001  (torch.fx raises many types for untraceable code)
            report.traced = False
            report.trace_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            warnings.warn(f"rawconv.nn.convert(fuse=True): torch.fx could not trace {type(model).__name__} "
                          f"({report.trace_error}); fused at module level only (Conv -> BatchNorm -> ReLU inside "
                          "nn.Sequential); residual adds stay in torch", RuntimeWarning, stacklevel=_guard.stacklevel())
            report.folded.clear()
            report.fused.clear()
            _fuse_sequential(model, report, backend, choice, precision)
    for name, m in list(model.named_modules()):
        if type(m) in _SWAP:
            new = _swap_module(m, backend, _choice_for(choice, name), precision)
            if name:
                _set_submodule(model, name, new)
            else:
                model = new
            report.swapped.append(name)
        elif isinstance(m, _RawconvConv):
            report.swapped.append(name)
    if autotune is not None:
        _autotune(model, autotune, report, autotune_budget_s)
    if fuse:
        for m in model.modules():
            if isinstance(m, _ConvBiasAct):
                _fused.freeze(m)
    model.rawconv_report = report
    return model


def refresh(model: torch.nn.Module) -> torch.nn.Module:
    """Take new weight snapshots of the frozen modules in ``model`` (returned, for chaining).

    :func:`convert` with ``fuse=True`` **freezes** the fused modules it makes: their (BN-folded)
    weight and bias are copied at convert time, as torch's freezing makes constants, and
    reordered into the implementation's layout once. A frozen module computes with that copy
    whenever autograd does not record through its parameters (``torch.no_grad()``, inference
    mode, parameters with ``requires_grad=False``); with autograd recording (training) it reads
    its parameters on every call. So after changing a converted model's parameters (loading a
    state_dict, an update, pruning), call ``refresh(model)`` before inference, or the outputs
    stay those of the old weights. Modules that are not frozen are left alone. Raises
    :class:`ArgumentTypeError` when ``model`` is not a ``torch.nn.Module``."""
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    for m in model.modules():
        if _fused.frozen(m):
            _fused.freeze(m)
    return model


# ---------------------------------------------------------------------------- autotune
_TUNED: dict = {}   # process-wide: tuning key -> winning choice


def clear_tuning() -> None:
    """Forget the winners :func:`convert` remembers for this process."""
    _TUNED.clear()


def _as_args(example) -> tuple:
    return tuple(example) if isinstance(example, (tuple, list)) else (example,)


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
    devices = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        ts = list(model.parameters()) + [e[2] for e in saved] + \
            [a for a in _as_args(example) if isinstance(a, torch.Tensor)]
        devices = sorted({t.get_device() for t in ts if t.is_cuda})
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
        if id(m) not in seen:
            seen.add(id(m))
            out.append((m, kind, args))
    return out


def _problem_of(m, kind: str, args: dict) -> ConvProblem:
    x = args["x"]
    if kind == "transpose":
        xb = x.unsqueeze(0) if x.dim() == m.weight.dim() - 1 else x
        _y_shape, core, s, p, d = _transpose_shape(xb, m.weight, m.stride, m.padding, args["output_padding"],
                                                   m.dilation, m.groups)
        fake = shape_only(core, xb)
        if _is_cl(xb):
            fake = fake.contiguous(memory_format=torch.channels_last if xb.dim() == 4 else torch.channels_last_3d)
        return ConvProblem.from_torch(fake, m.weight, None, s, p, d, m.groups)
    return ConvProblem.from_torch(x, m.weight, m.bias, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups)


def _tune_key(m, kind, args, backend, problem) -> tuple:
    dev = ""
    if backend == "cudnn":
        dev = torch.cuda.get_device_name(args["x"].device)
    extra = ()
    if kind == "fused":
        extra = (m.activation, args.get("residual") is not None)
    wl = onednn._w_layout(m.weight)
    return (kind, problem, extra, m.precision, backend, dev, wl)


# convert's cuDNN search per distinct problem (seconds; ResNet-50 has 24, fusion kinds included) and
# its final re-timing (10 groups in 5 interleaved rounds: autotune's default 30 took 0.2 s a problem)
GRAPH_BUDGET_S = 0.6


def _graph_plan(m, kind: str, args: dict):
    """The cuDNN graph plan that :func:`_tune_one` searches for layer ``m``'s recorded call."""
    from . import cudnn_graph as G

    x = args["x"]
    w, b = m.weight.detach(), (m.bias.detach() if m.bias is not None else None)
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
    """The winning candidate's name for layer ``m``'s recorded call. ``info`` (a dict) receives the
    winner's ``median_ms`` / ``min_ms``; ``use_cache=False``: cuDNN searches afresh (no tuning
    cache hit, no seeds from it). ``plan``: cuDNN, the plan :func:`_graph_plan` made (whose
    compilations may have started)."""
    x = args["x"]
    w, b = m.weight.detach(), (m.bias.detach() if m.bias is not None else None)
    prec = m.precision
    if backend == "onednn":
        opts = dict(iterations=3, warmup=1, budget_s=min(budget_s, 1.0) if budget_s else 0.25)   # per implementation
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
                                                   w_layout=onednn._w_layout(w), prepack=False)
            plan._w = w
        rows = plan.autotune(**opts)
        best = rows[0].impl
        if info is not None:
            info.update(median_ms=getattr(rows[0], "median_ms", None), min_ms=getattr(rows[0], "min_ms", None))
        plan.free()
        return f"{best.name}@{best.layouts}"

    budget = budget_s or GRAPH_BUDGET_S
    t0 = time.perf_counter()
    if plan is None:
        plan = _graph_plan(m, kind, args)
    if info is not None:
        info["plan_s"] = time.perf_counter() - t0
    try:
        rows = plan.autotune(budget_s=budget, patience=60, final_iterations=10, **({} if use_cache else
                                                              {"use_cache": False, "seed_from_cache": False}))
        if info is not None:
            info["search_s"] = getattr(plan, "autotune_seconds", None)
            info["from_cache"] = bool(rows) and getattr(rows[0], "phase", "") == "cache"
    except NotSupportedError:
        if kind == "fused":
            raise
        # no graph config runs this problem correctly under the precision asked (e.g. strict fp32,
        # where most graph engines are TF32 tensor-core ones): cuDNN's legacy algos, timed, decide
        from . import cudnn

        direction = "forward" if kind == "conv" else "backward_data"
        legacy = cudnn.Convolution.from_problem(_problem_of(m, kind, args), direction=direction, precision=prec)
        rows = legacy.autotune()
        if info is not None and rows:
            info.update(median_ms=rows[0].median_ms, min_ms=rows[0].min_ms)
        return rows[0].algorithm.choice
    if info is not None and rows:
        info.update(median_ms=getattr(rows[0], "median_ms", None), min_ms=getattr(rows[0], "min_ms", None))
    return plan.selected_name


def _autotune(model, example, report: ConvertReport, budget_s) -> None:
    """Search each distinct problem of ``model``'s convolutions once and pin the winners. On cuDNN,
    while one problem is searched, the next one's first runtime compilations (cuDNN's top
    heuristic configs, which a fused graph mostly consists of) run in background threads
    (:func:`rawconv._search.prefetch`), unless the previous problem came from the tuning cache."""
    from . import _search

    t0 = time.perf_counter()
    names = {id(m): n for n, m in model.named_modules()}
    layers = []
    for m, kind, args in _record_calls(model, example):
        backend = _resolve_backend(m.backend, args["x"].device)
        problem = _problem_of(m, kind, args)
        layers.append((m, kind, args, backend, problem, _tune_key(m, kind, args, backend, problem)))
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
                    _search.prefetch(plan)
                except (RawconvError, RuntimeError):   # its own search says what is wrong
                    plans.pop(key, None)
            return

    for i, (m, kind, args, backend, problem, key) in enumerate(layers):
        searched = False
        t1 = time.perf_counter()
        note = ""
        info: dict = {}
        if key in _TUNED:
            choice = _TUNED[key]
        else:
            if backend == "cudnn" and not last_from_cache:
                ahead(i)
            try:
                choice = _tune_one(m, kind, args, backend, budget_s, info=info, plan=plans.pop(key, None))
            except NotSupportedError as exc:   # nothing could be timed: the backend's default stays
                choice, note = None, f"not tuned: {exc}"
            last_from_cache = info.get("from_cache", False)
            _TUNED[key] = choice
            searched = True
        m.choice = choice
        m._choice_backend = backend
        report.tuned.append({"name": names.get(id(m), "?"), "kind": kind, "problem": problem.describe(),
                             "backend": backend, "choice": choice, "searched": searched,
                             "seconds": time.perf_counter() - t1, "key": key, "note": note, **info})
    report.autotune_s = time.perf_counter() - t0


def pinned_choices(model: torch.nn.Module) -> dict:
    """What every rawconv convolution module of ``model`` is pinned to: ``{module name: {"module":
    class name, "backend": the backend its weights' device runs ("onednn" / "cudnn"), "choice",
    "backward_choice", "precision"}}`` in ``named_modules`` order (None: the backend's default
    choice). What :func:`convert` (``autotune=``) and :func:`rawconv.distributed.convert` pinned."""
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, _RawconvConv):
            out[name] = {"module": type(m).__name__, "backend": m._device_backend(), "choice": m.choice,
                         "backward_choice": m.backward_choice, "precision": m.precision}
    return out


def pin_choices(model: torch.nn.Module, choices: dict, *, backend: str | None = None) -> None:
    """Pin ``choices`` (``{module name: choice}``; a choice is what ``choice=`` takes, None for the
    backend's default) on the rawconv convolution modules of ``model`` named there; the choices
    belong to ``backend`` (``"onednn"`` / ``"cudnn"``; default: each module's device's), so a later
    ``.to()`` to the other device drops them as usual. Nothing is checked against the library
    here: a choice it does not offer raises :class:`NotSupportedError` at the module's first call.
    Raises :class:`ArgumentError` naming a name that is not a rawconv convolution module of
    ``model`` (nothing is pinned then)."""
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(choices, dict):
        raise ArgumentTypeError(f"choices must be a dict {{module name: choice}}, got {type(choices).__name__}")
    if backend is not None and backend not in ("onednn", "cudnn"):
        raise ArgumentError(f"backend must be 'onednn', 'cudnn' or None, got {backend!r}")
    mods = dict(model.named_modules())
    bad = [n for n in choices if not isinstance(mods.get(n), _RawconvConv)]
    if bad:
        raise ArgumentError(f"not rawconv convolution modules of this model: {bad} (rawconv.nn.convert swaps "
                            f"torch's; these are: {[n for n, m in mods.items() if isinstance(m, _RawconvConv)]})")
    for n, c in choices.items():
        m = mods[n]
        m.choice = c
        m._choice_backend = backend or m._device_backend()


# ---------------------------------------------------------------------------- describe
@dataclass
class LayerReport:
    """One convolution layer in :func:`describe`: what rawconv and torch run, their times (median
    ms; CPU: perf_counter per call; CUDA: GPU time with calls queued behind a busy GPU) and their
    errors against float64 (max |y - ref| / max |ref|)."""

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

    @property
    def speedup(self) -> float | None:
        """torch time / rawconv time (> 1: rawconv is faster)."""
        if self.rawconv_ms and self.torch_ms:
            return self.torch_ms / self.rawconv_ms
        return None

    def __str__(self) -> str:
        def f(v, fmt):
            return format(v, fmt) if v is not None else "-"
        return (f"{self.name} [{self.module}] {self.problem}\n"
                f"  rawconv: {self.rawconv_backend} {self.rawconv_runs}  {f(self.rawconv_ms, '.4f')} ms  "
                f"err {f(self.rawconv_err, '.2e')}\n"
                f"  torch:   {self.torch_backend} {self.torch_runs}  {f(self.torch_ms, '.4f')} ms  "
                f"err {f(self.torch_err, '.2e')}" + (f"\n  note: {self.note}" if self.note else ""))


class DescribeTable(list):
    """The rows of :func:`describe` (a list of :class:`LayerReport`) with a table as its repr."""

    def __repr__(self) -> str:
        return format_table(self)

    __str__ = __repr__


def format_table(rows: Sequence[LayerReport]) -> str:
    """The rows as a fixed-width table (one line per layer)."""
    head = ("layer", "module", "problem", "rawconv runs", "ms", "err", "torch runs", "ms", "err", "x")
    body = []
    for r in rows:
        def f(v, fmt):
            return format(v, fmt) if v is not None else "-"
        body.append((r.name, r.module, r.problem, f"{r.rawconv_backend}: {r.rawconv_runs}", f(r.rawconv_ms, ".3f"),
                     f(r.rawconv_err, ".1e"), f"{r.torch_backend}: {r.torch_runs}", f(r.torch_ms, ".3f"),
                     f(r.torch_err, ".1e"), f(r.speedup, ".2f")))
    widths = [min(max([len(h)] + [len(b[i]) for b in body]), 60) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(str(c)[:w].ljust(w) for c, w in zip(cells, widths))   # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(b) for b in body])


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
        if residual is not None:
            y = y + residual
        if m.activation == "relu":
            y = torch.relu(y)
    return y


def _rawconv_runs(m, kind, args, backend) -> str:
    """A label of the candidate rawconv runs for this call (asks the library)."""
    x = args["x"]
    w, b = m.weight.detach(), (m.bias.detach() if m.bias is not None else None)
    try:
        if backend == "onednn":
            if kind == "fused":
                plan = _fused.plan_for(x, w, b, args.get("residual"), m.stride, _norm_padding(args["padding"]),
                                       m.dilation, m.groups, activation=m.activation, backend="onednn",
                                       choice=m.choice, precision=m.precision)
            elif kind == "conv":
                plan = onednn.Convolution(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups,
                                          impl=m.choice, fpmath=m.precision, prepack=False)
            else:
                plan = onednn.Convolution.from_problem(_problem_of(m, kind, args), direction="backward_data",
                                                       impl=m.choice, fpmath=m.precision,
                                                       w_layout=onednn._w_layout(w), prepack=False)
            s = plan.selected
            packed = plan.prepack or (kind == "fused" and _fused.frozen(m))
            ro = [r + ("(prepacked)" if r == "w" and packed else "") for r in s.reorders]
            label = f"{s.name}@{s.layouts}" + (f" reorders={','.join(ro)}" if ro else "")
            if kind == "fused":
                label += f" post-ops={'+'.join(o[0] if o[0] == 'sum' else o[1] for o in plan._post_ops) or 'none'}"
            return label
        if kind == "fused":
            plan = _fused.plan_for(x, w, b, args.get("residual"), m.stride, _norm_padding(args["padding"]), m.dilation,
                                   m.groups, activation=m.activation, backend="cudnn", choice=m.choice,
                                   precision=m.precision)
            return f"graph {plan.selected_name} (conv+bias{'+add' if args.get('residual') is not None else ''}" \
                   f"{'+relu' if m.activation == 'relu' else ''})"
        from . import cudnn

        if isinstance(m.choice, str) and m.choice.startswith(("eng", "nhwc:eng")):
            return f"graph {m.choice}"
        if kind == "conv":
            _, info = cudnn.forward(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups,
                                    choice=m.choice, precision=m.precision, return_info=True)
        else:
            p = _problem_of(m, kind, args)
            xb = x.unsqueeze(0) if x.dim() == w.dim() - 1 else x
            _, info = cudnn.backward_data(xb, w, p.x_shape, p.stride, p.pad_before, p.dilation, p.groups, choice=m.choice, precision=m.precision,
                                          return_info=True)
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
        from .compare import torch_onednn_trace

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
    from .bench import time_cpu, time_cuda_queued

    if device.type == "cuda":
        return time_cuda_queued(fn, iterations=iterations).median_ms
    return time_cpu(fn, iterations=iterations, warmup=2).median_ms


def _rel_err(y, ref) -> float:
    y64 = y.detach().to("cpu", torch.float64)
    denom = ref.abs().max().item()
    d = (y64 - ref).abs().max().item()
    return d / denom if denom > 0 else d


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
    functional ops on the CPU, fused residual and ReLU included). Returns a
    :class:`DescribeTable` (a list whose repr is a table; :func:`print_table`).
    """
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    convs = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d) + _TORCH_TRANSPOSED
    names = {}
    calls: list = []
    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, convs):
            names[id(m)] = name

            def hook(mod, args, kwargs):
                if not any(c[0] is mod for c in calls):
                    calls.append((mod, tuple(args), dict(kwargs)))
            hooks.append(m.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(*_as_args(example_input))
    finally:
        for h in hooks:
            h.remove()
    rows = DescribeTable()
    for m, args, kwargs in calls:
        x = args[0]
        residual = args[1] if len(args) > 1 else kwargs.get("residual")
        output_size = args[1] if isinstance(m, _TORCH_TRANSPOSED) and len(args) > 1 else kwargs.get("output_size")
        rm = m if isinstance(m, _RawconvConv) else _swap_module(copy.copy(m), "auto", None, "strict")
        backend = _resolve_backend(rm.backend, x.device)
        # the exact library call of the rawconv module
        with _recording() as rec, torch.no_grad():
            rm(x, residual) if isinstance(rm, _ConvBiasAct) else rm(x) if output_size is None else rm(x, output_size)
        note = ""
        if rec:
            _, kind, cargs = rec[0]
            problem = _problem_of(rm, kind, cargs).describe()
            runs = _rawconv_runs(rm, kind, cargs, backend)
        else:
            problem, runs, note = "?", "?", "the call ran outside rawconv's fused path (broadcast residual)"

        def run_rawconv():
            with torch.no_grad():
                if isinstance(rm, _ConvBiasAct):
                    return rm(x, residual)
                return rm(x) if output_size is None else rm(x, output_size)

        def run_torch():
            with torch.no_grad():
                return _torch_equivalent(m, x, residual, output_size=output_size)

        x64 = x.detach().to("cpu", torch.float64)
        r64 = residual.detach().to("cpu", torch.float64) if residual is not None else None
        with torch.no_grad():
            ref = _torch_equivalent(m, x64, r64, w=m.weight.detach().to("cpu", torch.float64),
                                    b=m.bias.detach().to("cpu", torch.float64) if m.bias is not None else None,
                                    output_size=output_size)
        row = LayerReport(names.get(id(m), "?"), type(m).__name__ + (f"({m.activation}"
                                                                        f"{', residual' if residual is not None else ''})"
                                                                        if isinstance(m, _ConvBiasAct) else ""),
                          problem, backend, runs, _torch_backend(m, x),
                          _torch_runs(run_torch, x.device) if (torch_kernels or x.device.type == "cpu") else "",
                          note=note)
        try:
            row.rawconv_err = _rel_err(run_rawconv(), ref)
            if timing:
                row.rawconv_ms = _timer(run_rawconv, x.device, iterations)
        except (NotSupportedError, ArgumentError) as exc:
            row.note = (row.note + "; " if row.note else "") + f"rawconv: {exc}"
        row.torch_err = _rel_err(run_torch(), ref)
        if timing:
            row.torch_ms = _timer(run_torch, x.device, iterations)
        rows.append(row)
    return rows


# every public entry point raises only rawconv's exception classes (rawconv._guard)
from . import _guard  # noqa: E402

_guard.guard_module(globals(), "conv", "conv_transpose", "convert", "refresh", "describe", "print_table", "pinned_choices",
                    "pin_choices",
                    "_RawconvConv.forward", "_RawconvConvTranspose.forward", "_ConvBiasAct.forward",
                    "_ConvBiasAct.from_conv")
