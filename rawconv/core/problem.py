"""One description of a convolution problem, in torch's terms, shared by every backend.

:class:`ConvProblem` is built and validated once (from torch tensors and torch-style arguments,
from a oneDNN benchdnn descriptor string, or directly) and then passed to oneDNN, cuDNN, the
comparison and the records. Pure Python and torch: no native library is touched here.

Conventions (as in :func:`torch.nn.functional.conv2d`):

* ``x``: input ``(N, C, *spatial)`` (or unbatched ``(C, *spatial)``), ``w``: weight
  ``(K, C // groups, *kernel)``, ``y``: output ``(N, K, *out_spatial)``.
* ``dilation`` counts as torch counts it (1 = none; oneDNN counts 0 for none).
* ``padding`` is symmetric per dim as in torch, ``"same"``/``"valid"``, or, beyond torch, a pair
  ``(before, after)`` per spatial dim for asymmetric padding.
"""
from __future__ import annotations

import math
import numbers
import operator
import re
from functools import cached_property
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import torch

from .errors import ArgumentError, ArgumentTypeError, DeviceNotAvailableError, NotSupportedError
# the layout helpers live in layouts.py; handed on here, where every caller imported them from
from .layouts import (backward_data_layout, backward_weights_layout, conv_layout, dense_strides,  # noqa: F401
                      empty_like_layout, layout_of, strides_match, suggests_channels_last, to_layout)

DTYPES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
}
DTYPE_BY_NAME = {v: k for k, v in DTYPES.items()}
DTYPE_BY_NAME.update({"f32": torch.float32, "fp32": torch.float32, "f16": torch.float16,
                      "fp16": torch.float16, "half": torch.float16, "bf16": torch.bfloat16,
                      "f64": torch.float64, "fp64": torch.float64, "double": torch.float64,
                      "float": torch.float32})
DIRECTIONS = ("forward", "backward_data", "backward_weights")


MAX_DIM = 2 ** 31 - 1      # bound on every size, stride, pad and dilation (oneDNN and cuDNN take int32/int64)
MAX_ELEMENTS = 2 ** 40     # bound on the elements of x, w and y: larger cannot be allocated anyway


def int_arg(v: Any):
    """``v`` as a Python int when it is an integer (int, numpy integer, anything with ``__index__``)
    but not a bool; None otherwise."""
    if type(v) is int:
        return v
    if isinstance(v, (bool, float, str)) or type(v).__name__ in ("bool_", "bool") \
            or (isinstance(v, torch.Tensor) and v.dtype == torch.bool):
        return None
    if hasattr(type(v), "__index__"):
        try:
            return operator.index(v)
        except (TypeError, ValueError, RuntimeError):
            return None
    return None


def torch_names(x: Any, w: Any, input: Any, weight: Any, where: str) -> tuple:
    """``(x, w)`` of a function form that also takes ``torch.nn.functional.conv*d``'s names for them
    (``input=``, ``weight=``). Raises :class:`ArgumentTypeError` when a tensor is given under both
    names or under neither (saying both names)."""
    if input is not None:
        if x is not None:
            raise ArgumentTypeError(f"{where}: got both x and input (torch's name for x); pass one")
        x = input
    if weight is not None:
        if w is not None:
            raise ArgumentTypeError(f"{where}: got both w and weight (torch's name for w); pass one")
        w = weight
    if x is None or w is None:
        missing = [n for n, v in (("x (torch's input)", x), ("w (torch's weight)", w)) if v is None]
        raise ArgumentTypeError(f"{where}: {' and '.join(missing)} must be a torch.Tensor, got None or nothing: pass "
                                "the input and the weight tensors positionally, as x=, w=, or with torch's names "
                                "input=, weight=")
    return x, w


def tuple_arg(value: Any, n: int, name: str, minimum: int) -> tuple[int, ...]:
    """``value`` (an int, or a tuple/list of ``n`` ints; one element repeats) as a tuple of ``n``
    ints, each >= ``minimum`` and below 2**31. Raises :class:`ArgumentTypeError` /
    :class:`ArgumentError` naming ``name``."""
    if isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be an int or a tuple of {n} ints, got {value!r}")
    iv = int_arg(value)
    if iv is not None:
        out = (iv,) * n
    elif isinstance(value, (tuple, list, torch.Size)):
        if len(value) == 1 and n > 1:
            value = tuple(value) * n
        vals = [int_arg(v) for v in value]
        if len(value) != n or any(v is None for v in vals):
            raise ArgumentError(f"{name} must be an int or a tuple of {n} ints, got {value!r}")
        out = tuple(vals)
    else:
        raise ArgumentTypeError(f"{name} must be an int or a tuple of {n} ints, got {type(value).__name__}")
    if any(v < minimum for v in out):
        lead = "non-positive stride is not supported: " if name == "stride" and minimum == 1 else ""   # torch's words
        raise ArgumentError(f"{lead}{name} must be >= {minimum} in every dim, got {out}")
    if any(v > MAX_DIM for v in out):
        raise ArgumentError(f"{name} must be < 2**31 in every dim, got {out}")
    return out


def shape_arg(shape: Any, name: str, ranks: Sequence[int]) -> tuple[int, ...]:
    """A tensor shape given as an argument (``x_shape``, ``w_shape``): a tuple/list/torch.Size of
    non-negative ints below 2**31 whose length is one of ``ranks``. Raises ArgumentTypeError /
    ArgumentError."""
    if not isinstance(shape, (tuple, list, torch.Size)):
        raise ArgumentTypeError(f"{name} must be a tuple of ints, got {type(shape).__name__}")
    vals = [int_arg(s) for s in shape]
    if any(v is None for v in vals):
        raise ArgumentError(f"{name} must be a tuple of ints, got {tuple(shape)!r}")
    if len(vals) not in ranks:
        raise ArgumentError(f"{name} must have {' or '.join(map(str, ranks))} dims, got {tuple(shape)!r}")
    if any(v < 0 or v > MAX_DIM for v in vals):
        raise ArgumentError(f"{name} must be non-negative ints below 2**31, got {tuple(shape)!r}")
    return tuple(vals)


def resolve_padding(padding: Any, ndim: int, kernel: Sequence[int], dilation: Sequence[int],
                    stride: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Turn torch-style ``padding`` (plus the asymmetric pair form) into (before, after) tuples.

    ``"same"`` follows torch: total ``dilation*(k-1)``, the extra element after; stride must be 1.
    Raises :class:`ArgumentError` for malformed values.
    """
    if isinstance(padding, str):
        if padding == "valid":
            return (0,) * ndim, (0,) * ndim
        if padding == "same":
            if any(s != 1 for s in stride):
                raise ArgumentError("padding='same' is not supported for strided convolutions (as in torch)")
            total = [d * (k - 1) for k, d in zip(kernel, dilation)]
            before = tuple(t // 2 for t in total)
            return before, tuple(t - b for t, b in zip(total, before))
        raise ArgumentError(f"padding string must be 'same' or 'valid', got {padding!r}")
    if isinstance(padding, (tuple, list)) and padding and all(isinstance(p, (tuple, list)) for p in padding):
        if len(padding) != ndim or not all(len(p) == 2 for p in padding):
            raise ArgumentError(
                f"asymmetric padding must be one (before, after) pair per spatial dim ({ndim}), got {padding!r}")
        before = tuple_arg(tuple(p[0] for p in padding), ndim, "padding (before)", 0)
        after = tuple_arg(tuple(p[1] for p in padding), ndim, "padding (after)", 0)
        return before, after
    p = tuple_arg(padding, ndim, "padding", 0)
    return p, p


def transposed_shapes(x_shape: Sequence[int], w_shape: Sequence[int], stride: Any, padding: Any,
                      output_padding: Any, dilation: Any, groups: Any):
    """A transposed convolution's shapes, as ``torch.nn.functional.conv_transpose{1,2,3}d``:
    ``x_shape`` (N, C_in, *spatial), batched; ``w_shape`` (C_in, C_out/groups, *kernel).

    Returns ``(y_shape, core_shape, stride, pad_before, pad_after, dilation, groups)``: ``y_shape``
    the result's (``(in - 1)*stride - 2*padding + dilation*(kernel - 1) + output_padding + 1`` per
    dim); the matching convolution, whose backward data computes the result, has input
    ``core_shape`` and padding ``pad_before`` (torch's ``padding``) / ``pad_after``. With
    ``output_padding < stride`` (the usual case) that is ``y_shape`` with symmetric padding.
    torch also allows ``output_padding`` up to ``dilation - 1``: the convolution's trailing pad is
    then ``padding - (output_padding - stride + 1)``, and where that would be negative the last
    ``y - core`` positions of each dim are reached by no kernel tap (zeros, then the bias: the
    caller pads them). Sizes may be ints or symbolic sizes. Raises :class:`ArgumentError` /
    :class:`ArgumentTypeError` naming the argument; :class:`NotSupportedError` where no kernel tap
    reaches any output position (the result would be the bias alone)."""
    nd = len(w_shape) - 2
    s, p = tuple_arg(stride, nd, "stride", 1), tuple_arg(padding, nd, "padding", 0)
    d, op = tuple_arg(dilation, nd, "dilation", 1), tuple_arg(output_padding, nd, "output_padding", 0)
    if any(o >= max(si, di) for o, si, di in zip(op, s, d)):
        raise ArgumentError(f"output_padding {op} must be smaller than stride {s} or dilation {d} (as in torch)")
    g = int_arg(groups)
    if isinstance(groups, bool) or g is None or g < 1:
        raise ArgumentError(f"groups must be a positive int, got {groups!r}")
    if len(x_shape) != nd + 2:
        raise ArgumentError(f"input must be {nd + 2}-D (N, C_in, *spatial) or unbatched, got {tuple(x_shape)}")
    if x_shape[1] != w_shape[0]:
        raise ArgumentError(f"input has {x_shape[1]} channels but weight {tuple(w_shape)} expects {w_shape[0]}")
    if w_shape[0] % g:
        raise ArgumentError(f"groups={g} does not divide the input channels {w_shape[0]}")
    outs = tuple((i - 1) * si - 2 * pi + di * (k - 1) + oi + 1
                 for i, si, pi, di, k, oi in zip(x_shape[2:], s, p, d, w_shape[2:], op))
    if any(o <= 0 for o in outs):
        raise ArgumentError(f"transposed convolution output size {outs} is not positive")
    excess = tuple(max(0, oi - (si - 1)) for oi, si in zip(op, s))     # output padding the stride cannot absorb
    pa = tuple(max(0, pi - e) for pi, e in zip(p, excess))
    core = tuple(o - (e - (pi - a)) for o, e, pi, a in zip(outs, excess, p, pa))
    if any(c <= 0 for c in core):
        raise NotSupportedError(f"transposed convolution output {outs} is all output padding (no kernel tap "
                                f"reaches it: output_padding {op}, padding {p}): no convolution to run")
    cout = w_shape[1] * g
    return (x_shape[0], cout) + outs, (x_shape[0], cout) + core, s, p, pa, d, g


def shape_only(shape: Sequence[int], like: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """A zero-stride tensor of ``shape`` (``like``'s dtype and device) used only to describe a
    problem to :meth:`ConvProblem.from_torch`; its memory is never read. ``name``: the caller's
    argument the shape came from (``"x_shape"``, ``"w_shape"``), which from_torch's messages use."""
    t = torch.empty(1, dtype=like.dtype, device=like.device).expand(*[int(s) for s in shape])
    if name:
        t._rawconv_name = name
    return t


@dataclass(frozen=True)
class ConvProblem:
    """One convolution, described once.

    Shapes are batched: an unbatched torch input is recorded with ``unbatched=True`` and ``n=1``.
    ``dilation`` is torch's (1 = none). ``pad_before``/``pad_after`` are per spatial dim.
    ``layout`` is the memory format the convolution runs in, that of y (and of an x in it; an x in
    another format is copied into it): ``"nchw"`` (torch contiguous) or ``"nhwc"``
    (channels_last / channels_last_3d / NWC for 1-D); :meth:`from_torch` sets it by torch's rule
    (:func:`conv_layout`: channels last when x or w is). ``dtype`` is a name: ``"float32"``,
    ``"float16"``, ``"bfloat16"`` or ``"float64"``. ``c`` may be 0 (a convolution over no input
    channels: y is the bias, or zeros); ``k`` may not (as in torch).
    """

    n: int
    c: int
    k: int
    in_spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    pad_before: tuple[int, ...] = ()
    pad_after: tuple[int, ...] = ()
    groups: int = 1
    dtype: str = "float32"
    layout: str = "nchw"
    device: str = "cpu"
    has_bias: bool = False
    unbatched: bool = False
    name: str = field(default="", compare=False)

    def __post_init__(self):
        if not isinstance(self.in_spatial, (tuple, list, torch.Size)):
            raise ArgumentTypeError(
                f"in_spatial must be a tuple of 1 to 3 ints, got {type(self.in_spatial).__name__}")
        nd = len(self.in_spatial)
        if nd not in (1, 2, 3):
            raise ArgumentError(f"only 1-D, 2-D and 3-D convolutions are supported, got {nd} spatial dims")
        for attr, default in (("stride", 1), ("dilation", 1), ("pad_before", 0), ("pad_after", 0)):
            v = getattr(self, attr)
            if isinstance(v, tuple) and len(v) == 0:
                object.__setattr__(self, attr, (default,) * nd)
            else:
                object.__setattr__(self, attr, tuple_arg(v, nd, attr, 1 if attr in ("stride", "dilation") else 0))
        object.__setattr__(self, "in_spatial", tuple_arg(self.in_spatial, nd, "input spatial size", 0))
        object.__setattr__(self, "kernel", tuple_arg(self.kernel, nd, "kernel size", 1))
        dtype = self.dtype
        if isinstance(dtype, torch.dtype) and dtype in DTYPES:
            dtype = DTYPES[dtype]
        if not isinstance(dtype, str):
            raise ArgumentTypeError(f"dtype must be a name such as 'float32', got {type(dtype).__name__}")
        if dtype not in DTYPE_BY_NAME:
            raise ArgumentError(f"unsupported dtype {dtype!r}; rawconv handles {sorted(DTYPES.values())}")
        object.__setattr__(self, "dtype", DTYPES[DTYPE_BY_NAME[dtype]])
        if not isinstance(self.layout, str):
            raise ArgumentTypeError(f"layout must be 'nchw' or 'nhwc', got {type(self.layout).__name__}")
        if self.layout not in ("nchw", "nhwc"):
            raise ArgumentError(f"layout must be 'nchw' or 'nhwc', got {self.layout!r}")
        if not isinstance(self.device, str):
            raise ArgumentTypeError(f"device must be a string such as 'cpu', got {type(self.device).__name__}")
        try:
            torch.device(self.device)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ArgumentError(f"device must be a torch device string such as 'cpu' or 'cuda:0', got "
                                f"{self.device!r} ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") \
                from None
        if not isinstance(self.name, str):
            raise ArgumentTypeError(f"name must be a string, got {type(self.name).__name__}")
        for attr in ("has_bias", "unbatched"):
            if not isinstance(getattr(self, attr), bool):
                raise ArgumentTypeError(f"{attr} must be a bool, got {getattr(self, attr)!r}")
        for attr in ("n", "c", "k", "groups"):
            v = getattr(self, attr)
            iv = int_arg(v)
            if iv is None or iv < (1 if attr == "groups" else 0) or iv > MAX_DIM:
                raise ArgumentError(f"{attr} must be a non-negative int below 2**31 (groups >= 1), got {v!r}")
            object.__setattr__(self, attr, iv)
        if self.c % self.groups or self.k % self.groups:
            raise ArgumentError(
                f"groups={self.groups} must divide both input channels ({self.c}) and output channels ({self.k})")
        if self.k == 0:   # torch refuses K=0 too; C=0 is a convolution over no channels: y = bias (zeros)
            raise ArgumentError(f"Given groups={self.groups}, expected weight to be at least 1 at dimension 0 "
                                f"(output channels K), got K=0")
        padded = [size + pb + pa for size, pb, pa in zip(self.in_spatial, self.pad_before, self.pad_after)]
        for i, (size, ek) in enumerate(zip(padded, self.effective_kernel)):
            if size < ek:   # torch's words first (code written for torch matches them), then which dim
                raise ArgumentError(
                    f"Calculated padded input size per channel: ({' x '.join(map(str, padded))}). Kernel size: "
                    f"({' x '.join(map(str, self.effective_kernel))}). Kernel size can't be greater than actual "
                    f"input size: spatial dim {i}: padded input size {size} is smaller than the dilated "
                    f"kernel size {ek} (kernel {self.kernel[i]}, dilation {self.dilation[i]})")
        for nm, shape in (("input", self.x_shape), ("weight", self.w_shape), ("output", self.y_shape)):
            if math.prod(shape) > MAX_ELEMENTS:
                raise ArgumentError(f"the {nm} would have {math.prod(shape)} elements (shape {shape}), "
                                    f"more than rawconv handles (2**40)")

    # ---------------------------------------------------------------- derived sizes
    @property
    def ndim(self) -> int:
        """Number of spatial dims (1, 2 or 3)."""
        return len(self.in_spatial)

    @cached_property
    def effective_kernel(self) -> tuple[int, ...]:
        return tuple(d * (k - 1) + 1 for k, d in zip(self.kernel, self.dilation))

    @cached_property
    def out_spatial(self) -> tuple[int, ...]:
        return tuple((i + pb + pa - ek) // s + 1 for i, pb, pa, ek, s in
                     zip(self.in_spatial, self.pad_before, self.pad_after, self.effective_kernel, self.stride))

    @cached_property
    def x_shape(self) -> tuple[int, ...]:
        return (self.n, self.c) + self.in_spatial

    @cached_property
    def w_shape(self) -> tuple[int, ...]:
        return (self.k, self.c // self.groups) + self.kernel

    @cached_property
    def y_shape(self) -> tuple[int, ...]:
        return (self.n, self.k) + self.out_spatial

    @cached_property
    def symmetric(self) -> bool:
        return self.pad_before == self.pad_after

    @property
    def torch_padding(self) -> tuple[int, ...]:
        """Padding as torch's conv takes it. Raises ArgumentError when asymmetric."""
        if not self.symmetric:
            raise ArgumentError("asymmetric padding cannot be expressed as torch's conv padding")
        return self.pad_before

    @cached_property
    def is_empty(self) -> bool:
        """True when x or y has no elements (zero batch or spatial size): no library call needed."""
        return math.prod(self.x_shape) == 0 or math.prod(self.y_shape) == 0

    @cached_property
    def reduction_length(self) -> int:
        """Number of products summed into each output element: C/groups * prod(kernel)."""
        return (self.c // self.groups) * math.prod(self.kernel)

    @cached_property
    def flops(self) -> int:
        """Floating-point operations of the forward convolution: 2 * N*K*prod(out) * C/g*prod(kernel)."""
        return 2 * math.prod(self.y_shape) * self.reduction_length

    @cached_property
    def torch_dtype(self) -> torch.dtype:
        return DTYPE_BY_NAME[self.dtype]

    def with_(self, **changes) -> "ConvProblem":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_torch(cls, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                   stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1,
                   *, allow_dtypes: Sequence[str] | None = None, name: str = "") -> "ConvProblem":
        """Describe ``F.conv{1,2,3}d(x, w, bias, stride, padding, dilation, groups)``.

        Checks (raising :class:`ArgumentError` / :class:`ArgumentTypeError`): tensors are torch
        tensors, floating dtypes rawconv handles (``allow_dtypes`` narrows them), x and w have the
        same dtype and device, ranks agree (x is ``(N, C, *s)`` or unbatched ``(C, *s)``, w is
        ``(K, C/groups, *k)``), groups divide the channels, bias is ``(K,)``, the padded input is
        at least the dilated kernel.
        """
        if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
            raise ArgumentTypeError(
                f"x and w must be torch.Tensor, got {type(x).__name__} and {type(w).__name__}")
        for t, nm in ((x, "x"), (w, "w"), (bias, "bias")):
            if t is not None and not isinstance(t, torch.Tensor):
                raise ArgumentTypeError(f"{nm} must be a torch.Tensor, got {type(t).__name__}")
            if t is not None and (t.is_nested or t.layout != torch.strided):
                raise ArgumentError(f"{nm} must be a dense (strided) tensor, got "
                                    f"{'a nested tensor' if t.is_nested else 'layout ' + str(t.layout)}")
        g = int_arg(groups)
        if g is None or g < 1 or g > MAX_DIM:
            raise ArgumentError(f"groups must be a positive int, got {groups!r}")
        groups = g
        xn = getattr(x, "_rawconv_name", "x")        # "x_shape" / "w_shape" when the caller gave a shape
        wn = getattr(w, "_rawconv_name", "weight")
        if w.dim() not in (3, 4, 5):
            raise ArgumentError(f"{wn} must be 3-D, 4-D or 5-D (K, C/groups, *kernel), got shape {tuple(w.shape)}")
        nd = w.dim() - 2
        unbatched = x.dim() == nd + 1
        if x.dim() not in (nd + 1, nd + 2):
            raise ArgumentError(
                f"Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input to conv{nd}d, but got input of size: "
                f"{list(x.shape)}: for a {nd}-D convolution ({wn} {tuple(w.shape)}) "
                f"{'the input' if xn == 'x' else xn} must be {nd + 2}-D (N, C, *spatial) or {nd + 1}-D unbatched, "
                f"got shape {tuple(x.shape)}")
        for t, nm in ((x, "x"), (w, "w")) + (((bias, "bias"),) if bias is not None else ()):
            if not isinstance(t, torch.Tensor):
                raise ArgumentTypeError(f"{nm} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype not in DTYPES:
                raise ArgumentError(f"{nm} has dtype {t.dtype}; rawconv handles {list(DTYPES)}")
            if t.is_sparse or t.layout != torch.strided:
                raise ArgumentError(f"{nm} must be a dense (strided) tensor, got layout {t.layout}")
        if x.dtype != w.dtype:
            raise ArgumentError(f"x and w must have the same dtype, got {x.dtype} and {w.dtype}")
        if bias is not None and bias.dtype != x.dtype:
            raise ArgumentError(f"bias must have the input's dtype {x.dtype}, got {bias.dtype}")
        if x.device != w.device or (bias is not None and bias.device != x.device):
            devs = [str(x.device), str(w.device)] + ([str(bias.device)] if bias is not None else [])
            raise ArgumentError(f"x, w and bias must be on the same device, got {devs}")
        dtype = DTYPES[x.dtype]
        if allow_dtypes is not None and dtype not in allow_dtypes:
            raise ArgumentError(f"dtype {dtype} is not supported here; supported: {list(allow_dtypes)}")
        xs = tuple(x.shape) if not unbatched else (1,) + tuple(x.shape)
        c = xs[1]
        k = w.shape[0]
        if c % groups:
            raise ArgumentError(f"groups={groups} does not divide the input channels C={c} ({xn} {tuple(x.shape)})")
        if k % groups:
            raise ArgumentError(f"groups={groups} does not divide the output channels K={k} ({wn} {tuple(w.shape)})")
        if w.shape[1] * groups != c:
            raise ArgumentError(
                f"Given groups={groups}, weight of size {list(w.shape)}, expected input{list(x.shape)} to have "
                f"{w.shape[1] * groups} channels, but got {c} channels instead: {wn} {tuple(w.shape)} expects "
                f"{w.shape[1] * groups} input channels ({wn}[1] * groups = {w.shape[1]} * {groups}), but {xn} has "
                f"C={c} (shape {tuple(x.shape)})")
        if bias is not None and tuple(bias.shape) != (k,):
            raise ArgumentError(f"bias must have shape ({k},), got {tuple(bias.shape)}")
        kernel = tuple(w.shape[2:])
        if any(s == 0 for s in kernel):
            raise ArgumentError(f"kernel sizes must be positive, got {wn} shape {tuple(w.shape)}")
        s = tuple_arg(stride, nd, "stride", 1)
        d = tuple_arg(dilation, nd, "dilation", 1)
        pb, pa = resolve_padding(padding, nd, kernel, d, s)
        layout = conv_layout(x if not unbatched else x.unsqueeze(0), w)   # torch's rule for y's memory format
        return cls(n=xs[0], c=c, k=k, in_spatial=xs[2:], kernel=kernel, stride=s, dilation=d,
                   pad_before=pb, pad_after=pa, groups=groups, dtype=dtype, layout=layout,
                   device=str(x.device), has_bias=bias is not None, unbatched=unbatched, name=name)

    # ---------------------------------------------------------------- benchdnn descriptors
    _BD_KEYS = ("g", "mb", "ic", "id", "ih", "iw", "oc", "od", "oh", "ow", "kd", "kh", "kw",
                "sd", "sh", "sw", "pd", "ph", "pw", "dd", "dh", "dw")

    @classmethod
    def from_benchdnn(cls, desc: str, *, dtype: str = "float32", layout: str = "nchw",
                      has_bias: bool = False) -> "ConvProblem":
        """Parse a oneDNN benchdnn convolution descriptor, e.g. ``"mb8ic64ih56oc64oh56kh3ph1"``.

        Follows benchdnn's rules: missing width/depth copy height (so the problem is 2-D unless a
        ``d`` key appears, 1-D when only ``w`` keys appear), ``mb`` defaults to 2, stride to 1,
        benchdnn's dilation ``d*`` counts 0 for none (rawconv adds 1), padding is symmetric
        unless the given ``oh`` needs another trailing pad (then the smallest non-negative trailing
        pad that gives ``oh``: how :meth:`to_benchdnn` writes asymmetric padding), an optional
        trailing ``_nNAME`` or ``nNAME`` sets the name. With a stride > 1 several trailing pads
        can give the same output size (the extra pad is never read); the notation cannot tell
        them apart and the symmetric one is taken.

        Raises :class:`ArgumentError`, naming the key, for: a key given twice (``ih10ih12``), an
        unknown key or text that is not ``key<digits>``, a missing ``ic``/``oc``, an output size
        (``oh``/``ow``/``od``) no trailing pad >= 0 can give, and an output size that needs an
        implausible trailing pad: one above max(leading pad, dilated kernel - 1), beyond which
        whole output windows would read nothing but padding (``ic3oc4ih10oh100`` would need a
        trailing pad of 90: it is a typo, not a problem).
        """
        if not isinstance(desc, str) or not desc:
            raise ArgumentError(f"benchdnn descriptor must be a non-empty string, got {desc!r}")
        if not isinstance(dtype, (str, torch.dtype)) or not isinstance(layout, str):
            raise ArgumentTypeError(f"dtype and layout must be strings, got {type(dtype).__name__} and "
                                    f"{type(layout).__name__}")
        name, vals = cls._bd_parse(desc)
        dims, ins, ks, st, pads, dil, outs = cls._bd_sizes(desc, vals)
        after = cls._bd_trailing_pads(desc, dims, ins, ks, st, pads, dil, outs)
        g = vals.get("g", 1)
        return cls(n=vals.get("mb", 2), c=vals["ic"], k=vals["oc"], in_spatial=ins, kernel=ks,
                   stride=st, dilation=dil, pad_before=pads, pad_after=tuple(after), groups=g,
                   dtype=dtype, layout=layout, has_bias=has_bias, name=name)

    @classmethod
    def _bd_parse(cls, desc: str) -> tuple[str, dict[str, int]]:
        """:meth:`from_benchdnn`'s first step: split the descriptor ``desc`` into its optional name
        and its ``key<digits>`` pairs. Returns ``(name, {key: value})``; raises
        :class:`ArgumentError` for text that is not ``key<digits>``, an unknown or repeated key, or a
        missing ``ic``/``oc``."""
        s = desc.strip()
        name = ""
        m = re.search(r"_?n([A-Za-z_\"][^\d]*.*)$", s)
        if m and not re.fullmatch(r"\d+", m.group(1)):
            name = m.group(1).strip('"')
            s = s[: m.start()]
        vals: dict[str, int] = {}
        pos = 0
        for m in re.finditer(r"([a-z]+)(\d+)", s):
            if m.start() != pos or m.group(1) not in cls._BD_KEYS:
                raise ArgumentError(f"cannot parse benchdnn descriptor {desc!r} at {s[pos:]!r}")
            if m.group(1) in vals:
                raise ArgumentError(f"benchdnn descriptor {desc!r} gives {m.group(1)} twice "
                                    f"({m.group(1)}{vals[m.group(1)]} and {m.group(0)}): give each key once")
            vals[m.group(1)] = int(m.group(2))
            pos = m.end()
        if pos != len(s):
            raise ArgumentError(f"cannot parse benchdnn descriptor {desc!r} at {s[pos:]!r}")
        for req in ("ic", "oc"):
            if req not in vals:
                raise ArgumentError(f"benchdnn descriptor {desc!r} lacks {req}")
        return name, vals

    @staticmethod
    def _bd_sizes(desc: str, vals: dict[str, int]) -> tuple:
        """:meth:`from_benchdnn`'s second step: the per-dimension sizes of the parsed keys ``vals``
        (a missing width/depth copies height, benchdnn's dilation + 1, the input sizes from the
        output sizes when only those are given). Returns ``(dims, ins, kernel, stride, pads,
        dilation, outs)``: the dimension letters, then a tuple per quantity (``outs`` holds None
        where not given); raises :class:`ArgumentError` (``desc`` named) for a stride < 1 or
        neither input nor output sizes."""
        has_d = any(k in vals for k in ("id", "od", "kd", "sd", "pd", "dd"))
        has_h = any(k in vals for k in ("ih", "oh", "kh", "sh", "ph", "dh"))
        dims = ("d", "h", "w") if has_d else (("h", "w") if has_h else ("w",))

        def get(prefix, default):
            out = []
            for dname in dims:
                # benchdnn: a missing W copies H, a missing H copies D
                src = {"w": ("h", "d"), "h": ("d",), "d": ()}[dname]
                for cand in (dname,) + src:
                    if prefix + cand in vals:
                        out.append(vals[prefix + cand])
                        break
                else:
                    out.append(default)
            return tuple(out)

        ins, ks = get("i", None), get("k", 1)
        st, pads, dil = get("s", 1), get("p", 0), tuple(v + 1 for v in get("d", 0))
        if any(v < 1 for v in st):   # (before the output sizes below divide by it)
            raise ArgumentError(f"benchdnn descriptor {desc!r}: stride must be >= 1 in every dim, got {st}")
        outs = get("o", None)
        if any(v is None for v in ins):
            if any(v is None for v in outs):
                raise ArgumentError(f"benchdnn descriptor {desc!r} gives neither input nor output sizes")
            ins = tuple((o - 1) * s_ - 2 * p + (k - 1) * d + 1 for o, s_, p, k, d in zip(outs, st, pads, ks, dil))
        return dims, ins, ks, st, pads, dil, outs

    @staticmethod
    def _bd_trailing_pads(desc: str, dims: tuple, ins: tuple, ks: tuple, st: tuple, pads: tuple, dil: tuple,
                          outs: tuple) -> list:
        """:meth:`from_benchdnn`'s third step: the trailing pad of each dimension, the leading pad
        ``pads`` unless a given output size in ``outs`` needs another (then the smallest
        non-negative one that gives it). Returns the pads as a list; raises :class:`ArgumentError`
        (``desc`` named) for an output size no trailing pad can give or one that needs an
        implausible pad."""
        after = list(pads)
        if all(v is not None for v in outs):
            for i, (o, i_, s_, p, k, d) in enumerate(zip(outs, ins, st, pads, ks, dil)):
                ek = (k - 1) * d + 1
                if o >= 1 and (i_ + 2 * p - ek) // s_ + 1 == o:
                    continue                        # the symmetric pad gives o: keep it
                need = (o - 1) * s_ + ek - i_ - p   # smallest trailing pad that reaches o outputs
                after[i] = max(need, 0)
                if o < 1 or (i_ + p + after[i] - ek) // s_ + 1 != o:
                    raise ArgumentError(
                        f"benchdnn descriptor {desc!r}: o{dims[i]}{o} cannot come from i{dims[i]}{i_}, kernel {k}, "
                        f"stride {s_}, dilation {d - 1} (benchdnn's), leading pad {p} with any trailing pad >= 0")
                limit = max(p, ek - 1)
                if after[i] > limit:
                    raise ArgumentError(
                        f"benchdnn descriptor {desc!r}: o{dims[i]}{o} would need a trailing pad of {after[i]} "
                        f"(i{dims[i]}{i_}, kernel {k}, stride {s_}, dilation {d - 1}, leading pad {p}), more than "
                        f"max(leading pad, dilated kernel - 1) = {limit}: output windows would read only padding. "
                        f"Check o{dims[i]} (symmetric padding gives {(i_ + 2 * p - ek) // s_ + 1}) or give "
                        f"p{dims[i]}")
        return after

    def to_benchdnn(self, strict: bool = True) -> str | None:
        """This problem as a benchdnn descriptor (2-D written with h/w, 1-D with w, 3-D with d/h/w).
        Asymmetric padding is written as the leading pad plus explicit output sizes, which
        :meth:`from_benchdnn` reads back as the smallest trailing pad giving that output size, at
        most max(leading pad, dilated kernel - 1). Raises :class:`ArgumentError` (naming the dim
        and both pads) for an asymmetric problem that notation cannot carry: a trailing pad that
        is not the smallest giving its output size (a larger one adds no output: use the
        smallest), or one above that bound; with ``strict=False`` returns None for such a problem
        (records and JSON output, where the description is an extra)."""
        dims = {1: ("w",), 2: ("h", "w"), 3: ("d", "h", "w")}[self.ndim]
        parts = []
        if self.groups != 1:
            parts.append(f"g{self.groups}")
        parts.append(f"mb{self.n}ic{self.c}")
        parts += [f"i{d}{v}" for d, v in zip(dims, self.in_spatial)]
        parts.append(f"oc{self.k}")
        parts += [f"o{d}{v}" for d, v in zip(dims, self.out_spatial)]
        parts += [f"k{d}{v}" for d, v in zip(dims, self.kernel)]
        # every dim is written when one differs from the default, so that nothing is copied on parsing
        if any(v != 1 for v in self.stride):
            parts += [f"s{d}{v}" for d, v in zip(dims, self.stride)]
        if any(v != 0 for v in self.pad_before):
            parts += [f"p{d}{v}" for d, v in zip(dims, self.pad_before)]
        if any(v != 1 for v in self.dilation):
            parts += [f"d{d}{v - 1}" for d, v in zip(dims, self.dilation)]
        out = "".join(parts)
        if not self.symmetric:   # what from_benchdnn derives must be this problem's trailing pad
            rule = ("benchdnn's notation (leading pad + output size) carries only the smallest trailing pad giving "
                    "the output size, at most max(leading pad, dilated kernel - 1)")
            try:
                back = ConvProblem.from_benchdnn(out).pad_after
            except ArgumentError as exc:
                if not strict:
                    return None
                raise ArgumentError(f"{self.describe()} cannot be written as a benchdnn descriptor: {rule} ({exc})") \
                    from None
            for d, b, a, got in zip(dims, self.pad_before, self.pad_after, back):
                if a != got:
                    if not strict:
                        return None
                    raise ArgumentError(
                        f"{self.describe()} cannot be written as a benchdnn descriptor: dim {d} has leading pad {b} "
                        f"and trailing pad {a}, which reads back as trailing pad {got}; {rule}")
        if self.name:
            out += "n" + self.name
        return out

    # ---------------------------------------------------------------- tensors and reference
    def make_inputs(self, *, seed: int = 0, device: str | None = None, scale: float = 1.0, on_device: bool = False):
        """Random x, w (and bias when ``has_bias``) of this problem's shapes, dtype and layout.

        Values are drawn as float64 normal (x) and scaled normal (w ~ 1/sqrt(reduction length)) and
        rounded to the dtype. Returns ``(x, w, bias_or_None)``. ``seed``: an int in
        [-2**63, 2**64); ``scale``: a finite real number multiplying x; ``device``: a torch device
        (string, ``torch.device`` or CUDA index; default the problem's). ``on_device`` (a bool):
        draw on ``device`` itself with a generator of that device (float32 normal, float64 for a
        float64 problem; ``cpu``, ``cuda`` or ``meta``, where the tensors are left uninitialized):
        for large CUDA tensors ~100x faster than the CPU's float64 draw (a (32, 256, 56, 56)
        tensor took ~0.3 s there), same distributions, other values (the same ones again for the
        same seed and device).

        Raises, before allocating: :class:`~rawconv.errors.ArgumentTypeError` /
        :class:`~rawconv.errors.ArgumentError` for bad arguments,
        :class:`~rawconv.errors.DeviceNotAvailableError` for a CUDA device torch does not see,
        :class:`~rawconv.errors.AllocationError` (a ``MemoryError``) when the host (or the GPU, for
        an ``on_device`` CUDA draw) has less memory than that takes.
        """
        from .guard import check_memory

        if not isinstance(on_device, bool):
            raise ArgumentTypeError(f"on_device must be True or False, got {on_device!r}")
        seed = seed_arg(seed)
        scale = scale_arg(scale)
        dev = device_arg(self.device if device is None else device)
        dt = self.torch_dtype
        if on_device:
            shapes = [self.x_shape, self.w_shape] + ([(self.k,)] if self.has_bias else [])
            check_draw_memory(shapes, dev, dt, f"make_inputs(on_device=True) of {self.describe()}")
            x = random_tensor(self.x_shape, seed, dev, dt, self.layout, scale)
            w = random_tensor(self.w_shape, seed_offset(seed, 1), dev, dt, "nchw",
                              1 / math.sqrt(max(self.reduction_length, 1)))
            b = random_tensor((self.k,), seed_offset(seed, 2), dev, dt, "nchw") if self.has_bias else None
            return x, w, b

        es = torch.empty(0, dtype=self.torch_dtype).element_size()
        check_memory((math.prod(self.x_shape) + math.prod(self.w_shape) + self.k) * (8 + es),
                     f"make_inputs of {self.describe()}")
        g = torch.Generator().manual_seed(seed)
        x64 = torch.randn(self.x_shape, generator=g, dtype=torch.float64) * scale
        w64 = torch.randn(self.w_shape, generator=g, dtype=torch.float64) / math.sqrt(max(self.reduction_length, 1))
        b64 = torch.randn(self.k, generator=g, dtype=torch.float64) if self.has_bias else None
        x = to_layout(x64.to(dt), self.layout).to(dev)
        w = w64.to(dt).to(dev)
        b = b64.to(dt).to(dev) if b64 is not None else None
        return x, w, b

    def reference(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """The forward result in float64 on the CPU (torch's own conv on upcast inputs)."""
        from .check import conv_reference

        return conv_reference(self, x, w, bias)

    def describe(self) -> str:
        """A short human-readable description, e.g. ``2d f32 nchw x(8,64,56,56) w(64,64,3,3) s1 p1``."""
        pad = ("p" + ",".join(map(str, self.pad_before)) if self.symmetric else
               "p" + ",".join(f"{b}/{a}" for b, a in zip(self.pad_before, self.pad_after)))
        bits = [f"{self.ndim}d", self.dtype, self.layout,
                "x(" + ",".join(map(str, self.x_shape)) + ")",
                "w(" + ",".join(map(str, self.w_shape)) + ")"]
        if any(v != 1 for v in self.stride):
            bits.append("s" + ",".join(map(str, self.stride)))
        if any(v != 0 for v in self.pad_before + self.pad_after):
            bits.append(pad)
        if any(v != 1 for v in self.dilation):
            bits.append("d" + ",".join(map(str, self.dilation)))
        if self.groups != 1:
            bits.append(f"g{self.groups}")
        if self.has_bias:
            bits.append("bias")
        return " ".join(bits)

    def __str__(self) -> str:
        return (self.name + ": " if self.name else "") + self.describe()


SEED_MIN, SEED_END = -2 ** 63, 2 ** 64   # the seeds torch.Generator.manual_seed takes


def seed_arg(seed: Any, name: str = "seed") -> int:
    """``seed`` as an int that ``torch.Generator.manual_seed`` takes ([-2**63, 2**64)); raises
    :class:`ArgumentTypeError` (not an integer, or a bool) / :class:`ArgumentError` (out of range)."""
    s = int_arg(seed)
    if s is None:
        raise ArgumentTypeError(f"{name} must be an int, got {type(seed).__name__} {seed!r}")
    if not SEED_MIN <= s < SEED_END:
        raise ArgumentError(f"{name} must be in [-2**63, 2**64) (what torch.Generator.manual_seed takes), got {s}")
    return s


def seed_offset(seed: int, i: int) -> int:
    """The ``i``-th seed after ``seed`` (in torch's range, wrapping past 2**64 - 1): the seeds of a draw's other
    tensors (:meth:`ConvProblem.make_inputs`: w, bias; the autotunes' dy, residual)."""
    s = seed + i
    return s - SEED_END if s >= SEED_END else s


def scale_arg(scale: Any, name: str = "scale") -> float:
    """``scale`` as a finite float; raises :class:`ArgumentTypeError` (not a real number, or a
    bool) / :class:`ArgumentError` (NaN or infinite)."""
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise ArgumentTypeError(f"{name} must be a real number, got {type(scale).__name__} {scale!r}")
    v = float(scale)
    if not math.isfinite(v):
        raise ArgumentError(f"{name} must be finite, got {v}")
    return v


def device_arg(device: Any, name: str = "device") -> torch.device:
    """``device`` (a string such as ``"cpu"`` / ``"cuda:1"``, a ``torch.device``, or a CUDA index)
    as a ``torch.device``. Raises :class:`ArgumentTypeError` / :class:`ArgumentError` when torch
    cannot read it, :class:`DeviceNotAvailableError` for a CUDA device torch does not see."""
    if isinstance(device, torch.device):
        d = device
    elif isinstance(device, str) or int_arg(device) is not None:
        try:
            d = torch.device(device if isinstance(device, str) else int_arg(device))
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ArgumentError(f"{name} must be a torch device such as 'cpu' or 'cuda:0', got {device!r} "
                                f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    else:
        raise ArgumentTypeError(f"{name} must be a device string such as 'cpu' or 'cuda:0', a torch.device or a "
                                f"CUDA index, got {type(device).__name__}")
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceNotAvailableError(f"{name} {str(d)!r}: torch sees no CUDA GPU here")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise DeviceNotAvailableError(f"{name} {str(d)!r}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    return d


def check_draw_memory(shapes, device: torch.device, dtype: torch.dtype, what: str) -> None:
    """Raise :class:`~rawconv.errors.AllocationError` before :func:`random_tensor` draws tensors of
    ``shapes`` on ``device`` when that cannot fit: on the CPU, the host's available memory
    (float32/float64 draw + the ``dtype`` result); on CUDA, the device's total memory."""
    from .guard import _gib, check_memory
    from .errors import AllocationError

    if device.type not in ("cpu", "cuda"):
        return
    es = torch.empty(0, dtype=dtype).element_size()
    draw = 8 if dtype == torch.float64 else 4
    nbytes = sum(math.prod(s) for s in shapes) * (draw + es)
    if device.type == "cpu":
        check_memory(nbytes, what)
        return
    total = torch.cuda.get_device_properties(device.index if device.index is not None
                                             else torch.cuda.current_device()).total_memory
    if nbytes > total:
        raise AllocationError(f"{what} needs about {_gib(nbytes)} of GPU memory; {device} has {_gib(total)} in all")


def random_tensor(shape, seed: int, device, dtype: torch.dtype, layout: str = "nchw", scale: float = 1.0) -> torch.Tensor:
    """Normal values of ``shape`` (a tuple of up to 8 non-negative ints) drawn on ``device``
    (``cpu`` or ``cuda``; on ``meta`` an uninitialized tensor) by a generator of that device
    seeded with ``seed`` (an int in [-2**63, 2**64)), as float32 (float64 for a float64
    ``dtype``), times ``scale`` (finite), rounded to ``dtype`` (float32, float16, bfloat16,
    float64, or its name), memory in ``layout`` (``"nchw"`` / ``"nhwc"``). For autotune's example
    tensors: drawn where they are used, no host round trip. Raises, before allocating:
    :class:`ArgumentTypeError` / :class:`ArgumentError` for bad arguments,
    :class:`DeviceNotAvailableError` for a CUDA device torch does not see,
    :class:`AllocationError` when it cannot fit (see :func:`check_draw_memory`)."""
    shape = shape_arg(shape, "shape", range(9))
    if math.prod(shape) > MAX_ELEMENTS:
        raise ArgumentError(f"shape {shape} has {math.prod(shape)} elements, more than rawconv handles (2**40)")
    seed, scale = seed_arg(seed), scale_arg(scale)
    device = device_arg(device)
    if isinstance(dtype, str) and dtype in DTYPE_BY_NAME:
        dtype = DTYPE_BY_NAME[dtype]
    if not isinstance(dtype, torch.dtype):
        raise ArgumentTypeError(f"dtype must be a torch.dtype such as torch.float32, got {type(dtype).__name__}")
    if dtype not in DTYPES:
        raise ArgumentError(f"dtype must be one of {sorted(DTYPES.values())}, got {dtype}")
    if not isinstance(layout, str):
        raise ArgumentTypeError(f"layout must be 'nchw' or 'nhwc', got {type(layout).__name__}")
    if layout not in ("nchw", "nhwc"):
        raise ArgumentError(f"layout must be 'nchw' or 'nhwc', got {layout!r}")
    if device.type == "meta":   # no generator there, and no values to draw
        return to_layout(torch.empty(shape, device=device, dtype=dtype), layout)
    if device.type not in ("cpu", "cuda"):
        raise ArgumentError(f"random_tensor draws on 'cpu' or 'cuda' devices, got {str(device)!r}")
    check_draw_memory([shape], device, dtype, f"random_tensor{shape}")
    g = torch.Generator(device=device).manual_seed(seed)
    draw = torch.float64 if dtype == torch.float64 else torch.float32
    t = torch.randn(shape, generator=g, device=device, dtype=draw)
    if scale != 1.0:
        t.mul_(scale)
    return to_layout(t.to(dtype), layout)


def check_tensor(p: "ConvProblem", t, name: str, shape) -> None:
    """Check that ``t`` is a torch.Tensor of ``shape`` (for an unbatched problem, without its
    leading 1) and of the problem's dtype: :class:`ArgumentTypeError` / :class:`ArgumentError`
    otherwise. Devices are the caller's to check."""
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    tshape = tuple(t.shape) if not p.unbatched else (1,) + tuple(t.shape)
    if tshape != tuple(shape):
        raise ArgumentError(f"{name} must have shape {tuple(shape)} for this problem, got {tuple(t.shape)}")
    if t.dtype != p.torch_dtype:
        raise ArgumentError(f"{name} must be {p.torch_dtype}, got {t.dtype}")


_MOVED = ("EPS", "ErrorStats", "tolerance", "compare_to_reference", "conv_reference", "abs_reference")


def __getattr__(name):  # these moved to rawconv.check; old imports keep working
    if name in _MOVED:
        from . import check

        return getattr(check, name)
    raise AttributeError(f"module 'rawconv.problem' has no attribute {name!r}")


_int = int_arg      # old private names, kept for code outside rawconv that used them
_tuple = tuple_arg


# every public entry point raises only rawconv's exception classes (rawconv._guard)
from . import guard as _guard  # noqa: E402

_guard.guard_module(globals(), "ConvProblem.from_torch", "ConvProblem.from_benchdnn", "ConvProblem.to_benchdnn",
                    "ConvProblem.make_inputs", "ConvProblem.reference", "ConvProblem.with_", "random_tensor")
