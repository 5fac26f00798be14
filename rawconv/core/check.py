"""Checking results against float64: the reference, ONE tolerance policy, error statistics.

Every backend, ``compare``, autotune and the tests judge a result the same way:

* :func:`reference` (any direction, on the tensors' device) and :func:`conv_reference` (forward,
  on the CPU) compute the float64 result, and the same computation on ``|inputs|``, which scales
  the rounding error each output element may carry.
* :func:`tolerance_for` is the policy: from the problem, the direction, the precision the inputs
  are rounded to (TF32, bf16, fp16 math), the numerical notes of a cuDNN engine, the algorithm
  family (direct, Winograd, FFT) and a fused activation, it gives a :class:`Tolerance`.
* :func:`check` compares a result with the reference under a :class:`Tolerance` and returns
  :class:`ErrorStats`.

The bound for one output element is::

    |y - ref| <= eps_out*|ref| + eps_mid*conv(|x|, |w|) + (2*eps_in + 4*eps_acc*sqrt(L)) * conv(|x|, |w|) * factor

``eps_out``: rounding of the output dtype (2^-23 for float32); ``eps_mid``: one rounding of a
partial result to a float16/bfloat16 output type (the convolution before its bias is added, a
split reduction's partial sums: on the H200 cuDNN's IMPLICIT_GEMM forward with bias and ALGO_0
backward data in 16-bit types exceed ``eps_out*|ref|`` by 1.2-1.3x on reductions of 1-4 terms;
0 for float32/float64 outputs); ``eps_in``: inputs rounded before the products (``compute``
"tf32" 2^-10, "bfloat16" 2^-8, "float16" 2^-11; 0 when used as they are; TF32 is a unit in the
10th bit, not half of one, because tensor cores may truncate float32 inputs rather than round
them: cuDNN's ALGO_1 backward weights on float32 with default math on the H200 erred by 1.09x a
round-to-nearest bound on a one-term reduction); ``eps_acc``: float32 accumulation (fp16's when fp16 compute); ``L``: the forward reduction
length C/groups*prod(kernel). ``factor`` carries what the formula does not: another direction's
reduction length (backward data: K/groups*prod(kernel); backward weights: N*prod(out)), an
accumulation in the data type (cuDNN's REDUCED_PRECISION_REDUCTION), transform algorithms (their
transforms round in another domain: ``min(64, 8*max(1, 64/L))``, i.e. 8x for reductions of 64 and
more, up to 64x for depthwise-like short ones) and a smooth activation after the convolution
(GELU, SiLU, ELU, sigmoid, tanh: 1.2x; hardswish, whose slope reaches 1.5: 1.6x).
Pure torch: no native library is touched here.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Sequence

import torch

from .errors import ArgumentError, ArgumentTypeError

# ``p`` below is a rawconv.core.problem.ConvProblem, read by its fields (this module imports no
# problem: ConvProblem.reference and the names rawconv.problem still serves come from here)
_PROBLEM_FIELDS = ("x_shape", "w_shape", "y_shape", "k", "ndim", "stride", "dilation", "groups",
                   "pad_before", "pad_after", "in_spatial", "unbatched", "reduction_length")

__all__ = ["EPS", "ErrorStats", "Tolerance", "tolerance_for", "check", "reference", "conv_reference",
           "abs_reference", "tolerance", "compare_to_reference", "TRANSFORM_NOTES"]

EPS = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float64": 2.0 ** -53,
       "tf32": 2.0 ** -10}   # TF32: 10 explicit bits, truncated by tensor cores (not rounded): a whole unit
COMPUTE_NAMES = {"tf32": "tf32", "bf16": "bfloat16", "bfloat16": "bfloat16", "f16": "float16",
                 "float16": "float16", "fp16": "float16"}
TRANSFORM_NOTES = frozenset({"FFT", "WINOGRAD", "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6", "WINOGRAD_TILE_13x13"})
# activations computed by approximations (exp, erf, tanh polynomials) or with a slope above 1: their
# result may carry a little more than the convolution's rounding (hardswish's slope reaches 1.5 at x=3)
_SMOOTH_ACTIVATIONS = {"gelu": 1.2, "gelu_tanh": 1.2, "swish": 1.2, "silu": 1.2, "elu": 1.2, "sigmoid": 1.2,
                       "tanh": 1.2, "hardswish": 1.6, "hardsigmoid": 1.2}


@dataclass(frozen=True)
class ErrorStats:
    """Error of a result against the float64 reference.

    ``max_abs``: max |y - ref|; ``max_rel``: max_abs / max |ref| (normwise); ``ratio``: the largest
    |y - ref| / tolerance over all elements (<= 1 passes); ``nan``: count of non-finite outputs.
    """

    max_abs: float
    max_rel: float
    ratio: float
    nan: int

    @property
    def ok(self) -> bool:
        return self.nan == 0 and self.ratio <= 1.0


@dataclass(frozen=True)
class Tolerance:
    """How far a result may be from float64: ``compute`` (the precision inputs are rounded to before
    the products: ``"tf32"``, ``"bfloat16"``, ``"float16"`` or None), ``factor`` (>= 1, see the module
    notes), ``out_dtype`` (the result's dtype when it differs from the problem's)."""

    compute: str | None = None
    factor: float = 1.0
    out_dtype: str | None = None

    def kwargs(self) -> dict:
        """As keyword arguments of :func:`tolerance` / :func:`compare_to_reference`."""
        out = {"factor": self.factor}
        if self.compute:
            out["compute"] = self.compute
        if self.out_dtype:
            out["out_dtype"] = self.out_dtype
        return out

    def bound(self, p: "ConvProblem", ref: torch.Tensor, ref_abs: torch.Tensor) -> torch.Tensor:
        """The per-element bound (a tensor of ``ref``'s shape and device)."""
        return tolerance(p, ref_abs, ref, compute=self.compute, out_dtype=self.out_dtype, factor=self.factor)


def _reduction_length(p: "ConvProblem", direction: str) -> int:
    if direction == "backward_data":
        return max((p.k // p.groups) * math.prod(p.kernel), 1)
    if direction in ("backward_weights", "backward_filter"):
        return max(p.n * math.prod(p.out_spatial), 1)
    return max(p.reduction_length, 1)


def transform_factor(reduction_length: int) -> float:
    """The widening for transform algorithms (Winograd, FFT): 8x for reductions of 64 terms and
    more, rising to 64x for short ones (a depthwise 3x3 reduces 9 terms, and the transforms'
    rounding does not shrink with it)."""
    return min(64.0, 8.0 * max(1.0, 64.0 / max(reduction_length, 1)))


def tolerance_for(p: "ConvProblem", direction: str = "forward", *, compute: str | None = None,
                  notes: Sequence[str] = (), algorithm: str = "", activation: str | None = None) -> Tolerance:
    """The tolerance policy: the :class:`Tolerance` for a result of ``p`` in ``direction``.

    ``compute``: the precision inputs are rounded to ("tf32", "bf16"/"bfloat16", "f16"/"float16";
    None or the data type: as they are). ``notes``: cuDNN numerical notes (``TENSOR_CORE`` on
    float32 data means TF32 inputs; ``DOWN_CONVERT_INPUTS`` on float32 bf16 at worst;
    ``REDUCED_PRECISION_REDUCTION`` accumulation in fp16/bf16; ``FFT``/``WINOGRAD*`` transforms).
    ``algorithm``: a vendor algorithm name; names containing FFT or WINOGRAD are transforms too.
    ``activation``: a fused activation after the convolution. Raises :class:`ArgumentError` for an
    unknown ``compute`` or direction."""
    if direction not in ("forward", "backward_data", "backward_weights", "backward_filter"):
        raise ArgumentError(f"direction must be forward, backward_data or backward_weights, got {direction!r}")
    if compute is not None:
        if compute not in COMPUTE_NAMES and compute not in ("float32", "float64"):
            raise ArgumentError(f"compute must be one of {sorted(set(COMPUTE_NAMES.values()))} or None, got {compute!r}")
        compute = COMPUTE_NAMES.get(compute, compute)
    notes = set(notes)
    acc = EPS["float64"] if p.dtype == "float64" else EPS["float32"]
    if p.dtype == "float32":
        if "TENSOR_CORE" in notes and compute is None:
            compute = "tf32"
        if "DOWN_CONVERT_INPUTS" in notes:
            compute = "bfloat16"
    if "REDUCED_PRECISION_REDUCTION" in notes and p.dtype in ("float16", "bfloat16"):
        compute = p.dtype
        acc = EPS[p.dtype]
    # what tolerance() assumes (it widens only for a compute type other than the data's), against
    # what this direction and these notes imply: the ratio goes into the factor
    widened = bool(compute) and compute not in (p.dtype, "float32", "float64")
    eps_in = EPS[compute] if widened else 0.0
    L_fwd = max(p.reduction_length, 1)
    L = _reduction_length(p, direction)
    assumed_acc = EPS["float64"] if p.dtype == "float64" else EPS["float32"]
    if widened and compute == "float16":
        assumed_acc = max(assumed_acc, EPS["float16"])
    factor = (2 * eps_in + 4 * acc * math.sqrt(L)) / (2 * eps_in + 4 * assumed_acc * math.sqrt(L_fwd))
    factor = max(factor, 1.0)
    up = algorithm.upper()
    if notes & TRANSFORM_NOTES or "FFT" in up or "WINOGRAD" in up or up.startswith("WINO"):
        factor *= transform_factor(L)
    if activation in _SMOOTH_ACTIVATIONS:
        factor *= _SMOOTH_ACTIVATIONS[activation]
    return Tolerance(compute, factor)


def tolerance(p: "ConvProblem", ref_abs: torch.Tensor, ref: torch.Tensor, *, compute: str | None = None,
              out_dtype: str | None = None, factor: float = 1.0) -> torch.Tensor:
    """Per-element error bound for a result of problem ``p`` (the formula of the module notes, with
    ``L`` the forward reduction length). Prefer :func:`tolerance_for`, which fills ``compute`` and
    ``factor`` from what ran."""
    out = out_dtype or p.dtype
    eps_out = EPS[out] if out != "float32" else EPS["float32"] * 2
    eps_in = 0.0
    eps_acc = EPS["float64"] if p.dtype == "float64" else EPS["float32"]
    if compute and compute not in (p.dtype, "float32", "float64"):
        eps_in = EPS[compute]
        if compute == "float16":
            eps_acc = max(eps_acc, EPS["float16"])
    L = max(p.reduction_length, 1)
    eps_mid = EPS[out] if out in ("float16", "bfloat16") else 0.0
    bound = eps_out * ref.abs() + eps_mid * ref_abs + (2 * eps_in + 4 * eps_acc * math.sqrt(L)) * ref_abs * factor
    return bound + 1e-30 + EPS[p.dtype] * 1e-3


def check(p: "ConvProblem", y: torch.Tensor, ref: torch.Tensor, ref_abs: torch.Tensor,
          tol: Tolerance | None = None) -> ErrorStats:
    """Error statistics of ``y`` against the float64 ``ref`` under ``tol`` (default: the direct
    algorithm's bound at the data's own precision), computed on ``ref``'s device. ``y`` may be
    unbatched for an unbatched problem. Raises :class:`ArgumentError` when the shapes differ."""
    if not isinstance(y, torch.Tensor):
        raise ArgumentTypeError(f"result must be a torch.Tensor, got {type(y).__name__}")
    tol = tol or Tolerance()
    y64 = y.detach().to(ref.device, torch.float64)
    if getattr(p, "unbatched", False) and y64.dim() == ref.dim() - 1:
        y64 = y64.unsqueeze(0)
    if tuple(y64.shape) != tuple(ref.shape):
        raise ArgumentError(f"result shape {tuple(y64.shape)} differs from the reference's {tuple(ref.shape)}")
    if y64.numel() == 0:
        return ErrorStats(0.0, 0.0, 0.0, 0)
    finite = torch.isfinite(y64)
    diff = (y64 - ref).abs()
    diff = torch.where(torch.isfinite(diff), diff, torch.full_like(diff, float("inf")))
    bound = tol.bound(p, ref, ref_abs)
    vals = torch.stack([(~finite).sum().to(torch.float64), diff.max(), ref.abs().max(),
                        (diff / bound).max()]).tolist()
    nan, max_abs, denom, ratio = vals
    return ErrorStats(max_abs, max_abs / denom if denom > 0 else max_abs, ratio, int(nan))


def compare_to_reference(p: "ConvProblem", y: torch.Tensor, ref: torch.Tensor, ref_abs: torch.Tensor,
                         **tol_kw) -> ErrorStats:
    """:func:`check` with the tolerance given as :func:`tolerance`'s keyword arguments
    (``compute``, ``out_dtype``, ``factor``)."""
    return check(p, y, ref, ref_abs, Tolerance(**tol_kw))


# ---------------------------------------------------------------------------- references
def _torch_conv(nd: int):
    import torch.nn.functional as F
    return {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]


def _check_ref_tensor(t, name: str, shapes) -> None:
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_nested or t.layout != torch.strided:
        raise ArgumentError(f"{name} must be a dense (strided) tensor")
    if not t.is_floating_point():
        raise ArgumentError(f"{name} must be a real floating tensor, got {t.dtype}")
    if tuple(t.shape) not in shapes:
        raise ArgumentError(f"{name} must have shape {' or '.join(map(str, shapes))} for this problem, "
                            f"got {tuple(t.shape)}")


def _pad_list(p: "ConvProblem") -> list[int]:
    pad = []
    for b, a in reversed(list(zip(p.pad_before, p.pad_after))):
        pad += [b, a]
    return pad


def conv_reference(p: "ConvProblem", x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """float64 forward convolution on the CPU, asymmetric padding included (zero-pad first).

    ``x`` of the problem's ``x_shape``, or for an unbatched problem also ``(C, *spatial)``: then
    the result is unbatched too ``(K, *out)``, as :func:`rawconv.onednn.forward` returns it.
    Raises :class:`ArgumentError` / :class:`ArgumentTypeError` for tensors that do not fit."""
    import torch.nn.functional as F
    xs = (p.x_shape,) + ((p.x_shape[1:],) if p.unbatched else ())
    _check_ref_tensor(x, "x", xs)
    _check_ref_tensor(w, "w", (p.w_shape,))
    if bias is not None:
        _check_ref_tensor(bias, "bias", ((p.k,),))
    x64 = x.detach().to("cpu", torch.float64)
    squeeze = p.unbatched and x64.dim() == p.ndim + 1
    if squeeze:
        x64 = x64.unsqueeze(0)
    w64 = w.detach().to("cpu", torch.float64)
    b64 = bias.detach().to("cpu", torch.float64) if bias is not None else None
    if p.is_empty:
        y = torch.zeros(p.y_shape, dtype=torch.float64)
        y = y + b64.view(1, -1, *([1] * p.ndim)) if b64 is not None else y
    else:
        pad = _pad_list(p)
        xp = F.pad(x64, pad) if any(pad) else x64
        y = _torch_conv(p.ndim)(xp, w64, b64, p.stride, 0, p.dilation, p.groups)
    return y.squeeze(0) if squeeze else y


def abs_reference(p: "ConvProblem", x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """float64 conv of |x| and |w| (+|bias|): the scale each output's rounding error is bounded by."""
    return conv_reference(p, x.detach().abs(), w.detach().abs(), bias.detach().abs() if bias is not None else None)


def _swish(t):
    return t * torch.sigmoid(t)


def _gelu_tanh(t):
    return torch.nn.functional.gelu(t, approximate="tanh")


#: float64 references of the fused activations, by rawconv's names (torch's functions: ``"gelu"`` is
#: the erf GELU, ``"gelu_tanh"`` torch's ``approximate="tanh"``; ``"silu"`` = ``"swish"``)
ACTIVATION_REFERENCE = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
                        "elu": torch.nn.functional.elu, "gelu": torch.nn.functional.gelu, "swish": _swish,
                        "silu": torch.nn.functional.silu, "gelu_tanh": _gelu_tanh,
                        "hardswish": torch.nn.functional.hardswish, "hardsigmoid": torch.nn.functional.hardsigmoid,
                        "relu6": torch.nn.functional.relu6}


_ROLES = {"forward": ("x", "w"), "backward_data": ("dy", "w"), "backward_weights": ("x", "dy")}
_bench_lock = threading.Lock()
_bench_users = 0        # CUDA references running, in every thread (under _bench_lock)
_bench_saved = False    # cudnn.benchmark as the first of them found it


def _on_cuda(tensors: dict) -> bool:
    return any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors.values())


def reference(p: "ConvProblem", direction: str, tensors: dict, *, activation: str | None = None):
    """The float64 result and its error scale (the same computation on |inputs|) for ``direction``,
    on the tensors' own device (torch's float64 convolution; asymmetric padding by zero-padding
    first, as :func:`conv_reference` does). ``tensors``: forward ``x``, ``w``, optional ``b``;
    backward_data ``dy``, ``w``; backward_weights ``x``, ``dy`` (real floating tensors of the
    problem's shapes; an unbatched problem's ``x`` / ``dy`` may lack the batch dim).
    ``activation``: forward only, one of :data:`ACTIVATION_REFERENCE`. Returns
    ``(ref, ref_abs)`` float64 tensors in (N, K, *out) / (N, C, *in) / (K, C/g, *k) shape.
    Raises :class:`ArgumentTypeError` / :class:`ArgumentError` for arguments that do not fit.

    On CUDA tensors it runs with ``torch.backends.cudnn.benchmark`` off: with it on, every new
    float64 shape would first time cuDNN's float64 algorithms (``cudnnFind``): on an H200, up to
    617 ms for a ResNet-50 layer's first call against 3.6 ms with it off
    (``benchmarks/results/h200_1gpu_custom_ops/diag-reference-time.log``). The flag is
    process-wide: it stays off while any thread computes a CUDA reference and comes back (when it
    was on) after the last one ends, also when one raises; another thread's convolutions
    meanwhile run without benchmark mode, and a thread that turns it off meanwhile sees it on
    again after. CPU references leave it alone."""
    global _bench_users, _bench_saved
    if isinstance(p, type) or not all(hasattr(p, f) for f in _PROBLEM_FIELDS):
        raise ArgumentTypeError(f"p must be a ConvProblem, got {type(p).__name__}")
    if direction == "backward_filter":
        direction = "backward_weights"
    if direction not in _ROLES:
        raise ArgumentError(f"direction must be forward, backward_data or backward_weights, got {direction!r}")
    if not isinstance(tensors, dict):
        raise ArgumentTypeError(f"tensors must be a dict of tensors by role ({', '.join(_ROLES[direction])}), "
                                f"got {type(tensors).__name__}")
    if activation is not None and activation not in ACTIVATION_REFERENCE:
        raise ArgumentError(f"activation must be None or one of {sorted(ACTIVATION_REFERENCE)}, got {activation!r}")
    unb = ((p.x_shape[1:],), (p.y_shape[1:],)) if p.unbatched else ((), ())
    shapes = {"x": (p.x_shape,) + unb[0], "dy": (p.y_shape,) + unb[1], "w": (p.w_shape,), "b": ((p.k,),)}
    roles = _ROLES[direction] + (("b",) if direction == "forward" and tensors.get("b") is not None else ())
    for role in roles:
        if tensors.get(role) is None:
            raise ArgumentError(f"{direction} reference needs tensors {' and '.join(_ROLES[direction])}; "
                                f"{role} is missing")
        _check_ref_tensor(tensors[role], role, shapes[role])
    if not _on_cuda(tensors):
        return _reference(p, direction, tensors, activation)
    with _bench_lock:
        if _bench_users == 0:
            _bench_saved = torch._C._get_cudnn_benchmark()
            if _bench_saved:
                torch._C._set_cudnn_benchmark(False)
        _bench_users += 1
    try:
        return _reference(p, direction, tensors, activation)
    finally:
        with _bench_lock:
            _bench_users -= 1
            if _bench_users == 0 and _bench_saved:
                torch._C._set_cudnn_benchmark(True)


def _reference(p: "ConvProblem", direction: str, tensors: dict, activation: str | None):
    """:func:`reference`'s computation, its arguments already checked there (``direction`` one of
    forward, backward_data, backward_weights)."""
    import torch.nn.functional as F

    conv = _torch_conv(p.ndim)
    pad = _pad_list(p)

    def t64(name):
        t = tensors[name].detach().to(torch.float64)
        if p.unbatched and name in ("x", "dy") and t.dim() == p.ndim + 1:
            t = t.unsqueeze(0)
        return t

    def fwd(x, w, b=None):
        xp = F.pad(x, pad) if any(pad) else x
        return conv(xp, w, b, p.stride, 0, p.dilation, p.groups)

    with torch.no_grad():
        if direction == "forward":
            x, w = t64("x"), t64("w")
            b = t64("b") if tensors.get("b") is not None else None
            ref = fwd(x, w, b)
            ref_abs = fwd(x.abs(), w.abs(), b.abs() if b is not None else None)
            if activation:
                ref = ACTIVATION_REFERENCE[activation](ref)
            return ref, ref_abs

    # the backward directions: aten's convolution_backward (what autograd runs for the forward
    # above; no autograd graph, so also under torch.inference_mode), the padding cropped off dx
    nd = p.ndim
    xp_shape = p.x_shape[:2] + tuple(i + b + a for i, b, a in zip(p.in_spatial, p.pad_before, p.pad_after))

    def bwd(dy, x, w, mask):
        return torch.ops.aten.convolution_backward(dy, x, w, None, list(p.stride), [0] * nd, list(p.dilation),
                                                   False, [0] * nd, p.groups, mask)

    with torch.no_grad():
        dy = t64("dy")
        if direction == "backward_data":
            w = t64("w")
            zero = torch.zeros(xp_shape, dtype=torch.float64, device=dy.device)
            crop = (slice(None), slice(None)) + tuple(slice(b, b + i) for b, i in zip(p.pad_before, p.in_spatial))
            return tuple(bwd(g, zero, wv, [True, False, False])[0][crop]
                         for g, wv in ((dy, w), (dy.abs(), w.abs())))
        x = t64("x")
        zero = torch.zeros(p.w_shape, dtype=torch.float64, device=dy.device)
        return tuple(bwd(g, F.pad(xv, pad) if any(pad) else xv, zero, [False, True, False])[1]
                     for g, xv in ((dy, x), (dy.abs(), x.abs())))
