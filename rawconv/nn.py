"""Drop-in torch ops and modules that run one pinned oneDNN implementation, with autograd.

    import rawconv.nn

    conv = rawconv.nn.Conv2d(64, 64, 3, padding=1, impl="x64:gemm:jit")      # a torch.nn.Conv2d
    y = conv(x)                         # forward on exactly that oneDNN implementation
    y.sum().backward()                  # grads through oneDNN's backward data / weights primitives

    y = rawconv.nn.conv(x, w, b, padding=1, impl=0)                       # the functional form

CPU tensors only (oneDNN); float32, and bfloat16 where oneDNN offers it on the CPU
(``rawconv.onednn.capabilities()``). The backward passes use oneDNN's first choice
unless ``backward_impl`` names one (a name, or a ``(data_impl, weights_impl)`` pair): forward,
backward-data and backward-weights implementations are listed separately by oneDNN
(:func:`rawconv.onednn.implementations` with ``direction=``).
"""
from __future__ import annotations

from typing import Any

import torch

from . import onednn
from .errors import ArgumentError
from .problem import ConvProblem

__all__ = ["conv", "Conv1d", "Conv2d", "Conv3d"]


class _OneDNNConv(torch.autograd.Function):
    """Autograd function over oneDNN's forward, backward-data and backward-weights primitives."""

    @staticmethod
    def forward(ctx, x, w, b, stride, padding, dilation, groups, impl, bwd_impl, fpmath):
        y = onednn.forward(x, w, b, stride, padding, dilation, groups, impl=impl, fpmath=fpmath)
        ctx.save_for_backward(x, w)
        ctx.conf = (stride, padding, dilation, groups, bwd_impl, fpmath, b is not None)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        stride, padding, dilation, groups, bwd_impl, fpmath, has_b = ctx.conf
        d_impl, w_impl = bwd_impl if isinstance(bwd_impl, tuple) else (bwd_impl, bwd_impl)
        gy = gy.contiguous(memory_format=torch.channels_last) if _is_cl(x) else gy.contiguous()
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = onednn.backward_data(gy, w, tuple(x.shape), stride, padding, dilation, groups,
                                      impl=d_impl, fpmath=fpmath)
        if ctx.needs_input_grad[1] or (has_b and ctx.needs_input_grad[2]):
            res = onednn.backward_weights(x, gy, tuple(w.shape), stride, padding, dilation, groups,
                                          bias=has_b, impl=w_impl, fpmath=fpmath)
            gw, gb = res if has_b else (res, None)
        return gx, gw, gb, None, None, None, None, None, None, None


def _is_cl(x: torch.Tensor) -> bool:
    return x.dim() in (4, 5) and not x.is_contiguous() and x.is_contiguous(
        memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)


def conv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
         padding: Any = 0, dilation: Any = 1, groups: int = 1, *, impl: Any = None,
         backward_impl: Any = None, fpmath: str = "strict") -> torch.Tensor:
    """``torch.nn.functional.conv{1,2,3}d`` on oneDNN, differentiable.

    Shapes, dtypes and arguments as :func:`rawconv.onednn.forward` (``padding`` also takes one
    ``(before, after)`` pair per spatial dim). ``impl`` pins the forward implementation;
    ``backward_impl`` the backward ones (one name/position for both, or a pair). Raises
    :class:`~rawconv.errors.ArgumentError` for bad input and
    :class:`~rawconv.errors.NotSupportedError` for an implementation oneDNN does not offer.
    Wraps ``dnnl_primitive_execute`` on convolution forward / backward primitives.
    """
    if isinstance(padding, list):
        padding = tuple(tuple(p) if isinstance(p, list) else p for p in padding)
    ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups)  # clear errors first
    if not torch.is_grad_enabled() or not (x.requires_grad or w.requires_grad or
                                           (bias is not None and bias.requires_grad)):
        return onednn.forward(x, w, bias, stride, padding, dilation, groups, impl=impl, fpmath=fpmath)
    return _OneDNNConv.apply(x, w, bias, stride, padding, dilation, groups, impl, backward_impl, fpmath)


class _ConvNd:
    """Mixin: a torch ConvNd whose forward runs :func:`conv` (oneDNN, pinned implementation)."""

    def _rawconv_init(self, impl, backward_impl, fpmath):
        if self.padding_mode != "zeros":
            raise ArgumentError(f"rawconv.nn supports padding_mode='zeros' only, got {self.padding_mode!r}")
        if getattr(self, "transposed", False):
            raise ArgumentError("rawconv.nn has no transposed convolution module")
        self.impl, self.backward_impl, self.fpmath = impl, backward_impl, fpmath

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups,
                    impl=self.impl, backward_impl=self.backward_impl, fpmath=self.fpmath)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", impl={self.impl!r}, fpmath={self.fpmath!r}"


def _module(base):
    class Module(_ConvNd, base):
        def __init__(self, *args, impl: Any = None, backward_impl: Any = None, fpmath: str = "strict", **kwargs):
            base.__init__(self, *args, **kwargs)
            self._rawconv_init(impl, backward_impl, fpmath)

    Module.__name__ = Module.__qualname__ = base.__name__
    Module.__doc__ = (f"``torch.nn.{base.__name__}`` running on oneDNN through rawconv: same arguments, plus "
                      "``impl`` (forward implementation: name or position), ``backward_impl`` and ``fpmath``. "
                      "CPU only; ``padding_mode='zeros'``.")
    return Module


Conv1d = _module(torch.nn.Conv1d)
Conv2d = _module(torch.nn.Conv2d)
Conv3d = _module(torch.nn.Conv3d)
