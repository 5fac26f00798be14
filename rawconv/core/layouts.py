"""Memory layouts of convolution tensors, as torch decides them: which layout a tensor is in
(:func:`layout_of`), torch's channels-last rule for y, dx and dw (:func:`conv_layout`,
:func:`backward_data_layout`, :func:`backward_weights_layout`), dense strides of a layout, and new or
relaid tensors in one (:func:`empty_like_layout`, :func:`to_layout`). ``"nchw"``: channels first
(torch-contiguous); ``"nhwc"``: channels last (channels_last / channels_last_3d / NWC).
Pure Python and torch. :mod:`rawconv.core.problem` hands these names on.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .errors import ArgumentTypeError


def layout_of(t: torch.Tensor) -> str:
    """``"nchw"`` (channels first, including any dense torch-contiguous tensor) or ``"nhwc"``
    (channels last: stride of dim 1 is 1 and it is the innermost). Other strides give ``"strided"``."""
    if t.dim() < 3:
        return "nchw"
    if t.is_contiguous():
        return "nchw"
    c = t.shape[1]
    # channels last: C innermost, then the spatial dims in order, then N
    order = [1] + list(range(t.dim() - 1, 1, -1)) + [0]
    expected, ok = 1, True
    for d in order:
        if t.shape[d] != 1 and t.stride(d) != expected:
            ok = False
            break
        expected *= t.shape[d]
    if ok and c >= 1:
        return "nhwc"
    return "strided"


def suggests_channels_last(t: torch.Tensor) -> bool:
    """torch's ``suggest_memory_format(t)`` is ``channels_last`` (4-D) / ``channels_last_3d`` (5-D):
    c10's ``is_channels_last_strides_2d/3d`` on ``t``'s sizes and strides, which resolves the
    ambiguous cases as torch does (a tensor whose strides fit both formats, e.g. one channel or
    ``N x 1 x 1 x 1``, is NCHW; a zero channel stride or an empty dim is NCHW). False for other
    ranks (torch has no channels-last format for 3-D tensors). Raises :class:`ArgumentTypeError`
    for a non-tensor."""
    _tensors(t)
    nd = t.dim()
    if nd not in (4, 5):
        return False
    sizes, strides = t.shape, t.stride()
    if strides[1] == 0:
        return False
    low = 0
    for d in ((1, 3, 2, 0) if nd == 4 else (1, 4, 3, 2, 0)):
        if sizes[d] == 0 or strides[d] < low:
            return False
        if d == 0 and low == strides[1]:   # N111 / N11W-like: torch falls back to NCHW
            return False
        low = strides[d]
        if sizes[d] > 1:
            low *= sizes[d]
    return True


def _tensors(*ts) -> None:
    for t in ts:
        if not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(f"expected a torch.Tensor, got {type(t).__name__}")


def _suggests(t: torch.Tensor) -> bool:
    """:func:`suggests_channels_last` with 1-D convolution tensors (N, C, L) seen as torch sees them
    there: viewed as (N, C, 1, L)."""
    return suggests_channels_last(t.unsqueeze(2) if t.dim() == 3 else t)


def conv_layout(x: torch.Tensor, w: torch.Tensor) -> str:
    """The memory format torch gives a convolution's output y, as rawconv follows it: ``"nhwc"``
    (channels_last / channels_last_3d / NWC for 1-D) or ``"nchw"``. torch's rule
    (``mkldnn_conv_use_channels_last`` on the CPU, ``cudnn_conv_suggest_memory_format`` on CUDA,
    ``aten/src/ATen/native/ConvUtils.h``): channels last when x **or** w suggests it
    (:func:`suggests_channels_last`); never for float64 (both disable NHWC for double); for a 1-D
    convolution torch makes x contiguous and views w as (K, C/g, 1, k), so w alone decides.
    ``x`` batched (N, C, *spatial); zero-stride stand-ins (:func:`rawconv.core.problem.shape_only`) suggest nothing.
    An empty batch (N = 0) is ``"nchw"``: torch sends it to no library (``ConvBackend::Empty``),
    whose y is contiguous (its backward's dx and dw are ``zeros_like(x)`` and ``zeros_like(w)``).
    torch's autograd on the CPU gives dx and dw this layout too. Raises :class:`ArgumentTypeError`
    for a non-tensor."""
    _tensors(x, w)
    if x.dtype == torch.float64 or w.dtype == torch.float64 or (x.dim() > 2 and x.shape[0] == 0):
        return "nchw"
    if w.dim() == 3:
        return "nhwc" if _suggests(w) else "nchw"
    return "nhwc" if suggests_channels_last(x) or suggests_channels_last(w) else "nchw"


def backward_data_layout(grad_y: torch.Tensor, w: torch.Tensor) -> str:
    """The memory format of dx from ``grad_y`` (batched) and ``w``: channels last when either
    suggests it (torch's ``cudnn_convolution_backward_input`` rule; a 1-D grad_y counts as
    (N, K, 1, L)); ``"nchw"`` for float64. Raises :class:`ArgumentTypeError` for a non-tensor."""
    _tensors(grad_y, w)
    if grad_y.dtype == torch.float64 or w.dtype == torch.float64:
        return "nchw"
    return "nhwc" if _suggests(grad_y) or _suggests(w) else "nchw"


def backward_weights_layout(x: torch.Tensor, grad_y: torch.Tensor) -> str:
    """The memory format of dw from ``x`` and ``grad_y`` (both batched): channels last when either
    suggests it (torch's ``cudnn_convolution_backward_weight`` rule); for a 1-D convolution
    grad_y alone decides (torch makes x contiguous there); ``"nchw"`` for float64. Raises
    :class:`ArgumentTypeError` for a non-tensor."""
    _tensors(x, grad_y)
    if x.dtype == torch.float64 or grad_y.dtype == torch.float64:
        return "nchw"
    if grad_y.dim() == 3:
        return "nhwc" if _suggests(grad_y) else "nchw"
    return "nhwc" if suggests_channels_last(x) or suggests_channels_last(grad_y) else "nchw"


def dense_strides(shape: Sequence[int], layout: str) -> list[int]:
    """Element strides of a dense tensor of ``shape`` in ``layout``: ``"nchw"`` (row-major) or
    ``"nhwc"`` (channels last: dim 1 innermost, then the spatial dims, then dim 0)."""
    nd = len(shape)
    order = list(range(nd - 1, -1, -1)) if layout == "nchw" else [1] + list(range(nd - 1, 1, -1)) + [0]
    strides, acc = [0] * nd, 1
    for d in order:
        strides[d] = acc
        acc *= max(int(shape[d]), 1)
    return strides


def strides_match(t: torch.Tensor, strides: Sequence[int]) -> bool:
    """True when ``t``'s strides equal ``strides`` in every dim of size > 1."""
    return all(s == 1 or st == want for s, st, want in zip(t.shape, t.stride(), strides))


_LAYOUT_STRIDES: dict = {}   # (shape, layout) -> dense strides (empty_like_layout's, on every output)


def empty_like_layout(shape: Sequence[int], layout: str, dtype: torch.dtype,
                      device: torch.device | str) -> torch.Tensor:
    """A new tensor of ``shape`` in ``layout`` (``"nchw"`` or ``"nhwc"``: channels last for 3 or
    more dims), for outputs: torch's dense strides of that memory format (:func:`dense_strides`)."""
    shape = tuple(shape)
    if not all(type(s) is int for s in shape):   # symbolic sizes (fake kernels under dynamic shapes)
        if layout == "nhwc" and len(shape) >= 3:
            perm = [0] + list(range(2, len(shape))) + [1]
            t = torch.empty([shape[i] for i in perm], dtype=dtype, device=device)
            return t.permute([perm.index(i) for i in range(len(shape))])
        return torch.empty(shape, dtype=dtype, device=device)
    key = (shape, layout)
    st = _LAYOUT_STRIDES.get(key)
    if st is None:
        st = dense_strides(key[0], layout if layout == "nhwc" and len(key[0]) >= 3 else "nchw")
        if len(_LAYOUT_STRIDES) < 4096:
            _LAYOUT_STRIDES[key] = st
    return torch.empty_strided(key[0], st, dtype=dtype, device=device)


def to_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``t`` (N, C, *spatial) with its memory in ``layout`` ("nchw" or "nhwc"); a no-op when it is."""
    if layout == "nhwc" and t.dim() >= 3:
        if layout_of(t) == "nhwc":
            return t
        perm = [0] + list(range(2, t.dim())) + [1]
        return t.permute(perm).contiguous().permute([perm.index(i) for i in range(t.dim())])
    return t.contiguous()


# every public entry point raises only rawconv's exception classes (rawconv._guard)
from . import guard as _guard  # noqa: E402

_guard.guard_module(globals(), "suggests_channels_last", "conv_layout", "backward_data_layout",
                    "backward_weights_layout")
