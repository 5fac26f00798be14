"""What every fused convolution (conv + bias (+ residual) (+ activation)) checks, and its result
computed in torch (zero-sized problems: no library call). Shared by the oneDNN post-op plan
(:mod:`rawconv.onednn.fused`), the cuDNN residual graph and the operator (:mod:`rawconv.fused`).

* :data:`ACTIVATIONS`: the activations a fused convolution takes, named as torch names them
  (``"gelu"`` is torch's default, erf-based GELU; ``"gelu_tanh"`` is ``F.gelu(approximate="tanh")``:
  the two are different functions and are never fused one for the other).
* :func:`apply_activation`: torch's own op for each (the tails that run in torch, the fallbacks).
* :func:`finite_bound`: whether a convolution's result is bounded away from overflow (so that it
  holds no NaN and no infinity): the guard that lets a library activation that turns NaN into 0
  (oneDNN's ``eltwise_relu``, ``eltwise_clip``...) run fused only where no NaN or infinity can reach it.
* :func:`decide_fusion`: fused against unfused, timed interleaved in rounds (:class:`FusionDecision`).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from .errors import ArgumentError, ArgumentTypeError
from .problem import ConvProblem, to_layout

ACTIVATIONS = ("none", "relu", "relu6", "silu", "gelu", "gelu_tanh", "hardswish", "hardsigmoid", "sigmoid",
               "tanh")
#: other names taken for the same functions (``"swish"``: SiLU, x * sigmoid(x))
ACTIVATION_ALIASES = {"identity": "none", "swish": "silu", "gelu_erf": "gelu"}

# torch's own ops (out of place, in place): what an unfused tail runs, what the fused result must equal
_TORCH_ACT = {
    "relu": (torch.relu, torch.relu_),
    "relu6": (F.relu6, lambda t: F.relu6(t, inplace=True)),
    "silu": (F.silu, lambda t: F.silu(t, inplace=True)),
    "gelu": (F.gelu, None),
    "gelu_tanh": (lambda t: F.gelu(t, approximate="tanh"), None),
    "hardswish": (F.hardswish, lambda t: F.hardswish(t, inplace=True)),
    "hardsigmoid": (F.hardsigmoid, lambda t: F.hardsigmoid(t, inplace=True)),
    "sigmoid": (torch.sigmoid, torch.sigmoid_),
    "tanh": (torch.tanh, torch.tanh_),
}


def check_activation(activation) -> str:
    if activation is None:
        return "none"
    if not isinstance(activation, str):
        raise ArgumentTypeError(f"activation must be one of {list(ACTIVATIONS)}, got {type(activation).__name__}")
    activation = ACTIVATION_ALIASES.get(activation, activation)
    if activation not in ACTIVATIONS:
        raise ArgumentError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    return activation


def apply_activation(y: torch.Tensor, activation: str, inplace: bool = False) -> torch.Tensor:
    """``activation(y)`` with torch's own op (``"none"``: y itself). ``inplace``: written into y
    where torch has an in-place form (y must then be a fresh tensor nothing else reads, and record
    no autograd); GELU has none and returns a new tensor."""
    if activation == "none":
        return y
    fn, fn_ = _TORCH_ACT[activation]
    return fn_(y) if inplace and fn_ is not None else fn(y)


def check_residual(residual, p: ConvProblem) -> torch.Tensor:
    if not isinstance(residual, torch.Tensor):
        raise ArgumentTypeError(f"residual must be a torch.Tensor, got {type(residual).__name__}")
    r = residual.unsqueeze(0) if p.unbatched and residual.dim() == p.ndim + 1 else residual
    if tuple(r.shape) != tuple(p.y_shape):
        raise ArgumentError(f"residual must have the output's shape {tuple(p.y_shape)}, got {tuple(residual.shape)}")
    if r.dtype != p.torch_dtype:
        raise ArgumentError(f"residual must be {p.torch_dtype} (the input's dtype), got {r.dtype}")
    if str(r.device) != p.device and not (r.device.type == "cuda" and p.device.startswith("cuda")
                                          and torch.device(p.device).index in (None, r.device.index)):
        raise ArgumentError(f"residual must be on {p.device}, got {r.device}")
    if r.is_nested or r.layout != torch.strided:
        raise ArgumentError("residual must be a dense (strided) tensor")
    return r


def torch_tail(z: torch.Tensor, bias, residual, activation: str, p: ConvProblem) -> torch.Tensor:
    """``act(z + bias + residual)`` in torch (zero-sized problems: no library call)."""
    y = to_layout(z, p.layout)
    if bias is not None:
        y = y + bias.view(1, -1, *([1] * p.ndim))
    if residual is not None:
        y = y + check_residual(residual, p)
    y = apply_activation(y, activation)
    y = to_layout(y.contiguous(), p.layout) if p.layout == "nchw" else to_layout(y, p.layout)
    return y.squeeze(0) if p.unbatched else y


# ---------------------------------------------------------------------------- the NaN / overflow guard
#: |conv(x, w) + b + r| stays below this (float32's largest value over 4: the rounding of every
#: partial sum is far inside it), so the library sees no NaN and no infinity before its activation
FINITE_LIMIT = torch.finfo(torch.float32).max / 4


def _norm(t: torch.Tensor) -> float:
    """The 2-norm of a tensor's elements (an upper bound of max|t|), as a Python float: NaN when t
    holds a NaN, inf when it holds an infinity (or its squares overflow: the guard then says "not
    bounded", which is only slower). One pass over t's memory (a dense tensor as one vector, whatever
    its layout), in torch's own threaded reduction (``torch.dot`` goes to the BLAS, whose threads
    measured 8-16x slower than one thread on a loaded 2-core machine); no autograd, no copy."""
    n = t.numel()
    if n == 0:
        return 0.0
    if t.requires_grad:
        t = t.detach()
    if t.is_contiguous():
        flat = t.view(-1)
    elif t.is_contiguous(memory_format=torch.channels_last) or \
            (t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d)):
        flat = t.as_strided((n,), (1,))
    else:
        flat = t.reshape(-1)
    if flat.dtype is not torch.float32 and flat.dtype is not torch.float64:
        return float(torch.linalg.vector_norm(flat, dtype=torch.float32))
    return float(torch.linalg.vector_norm(flat))


def vector_bound(t: torch.Tensor | None) -> float:
    """An upper bound of max|t| (its 2-norm); NaN or inf when t holds a NaN or an infinity; 0 for None."""
    return 0.0 if t is None else _norm(t)


def weight_bound(w: torch.Tensor) -> float:
    """max over output channels k of sum |w[k]| (the factor one output's magnitude can grow by over
    the input's largest one; also the bound of every partial sum), computed exactly. NaN or inf when
    w holds a NaN or an infinity. One pass over w (callers keep it per weight version)."""
    if w.dim() == 0 or w.numel() == 0:
        return 0.0
    w = w.detach()
    if w.dtype is not torch.float32 and w.dtype is not torch.float64:
        w = w.float()
    return float(w.abs().reshape(w.shape[0], -1).sum(1).max())


def conv_bound(x_bound: float, w_bound: float, bias_bound: float = 0.0, residual_bound: float = 0.0) -> float:
    """An upper bound of |conv(x, w) + b + r| over every element and every partial sum, from bounds of
    max|x| (``x_bound``), of the weights' largest row 1-norm (:func:`weight_bound`), of max|b| and
    max|r|; ``math.inf`` when any is NaN or infinite or the bound reaches :data:`FINITE_LIMIT` (the
    result may then hold a NaN or an infinity)."""
    total = x_bound * w_bound + bias_bound + residual_bound
    return total if total < FINITE_LIMIT else math.inf   # (NaN compares False)


def finite_bound(x: torch.Tensor, w_bound: float, bias: torch.Tensor | None = None,
                 residual: torch.Tensor | None = None, *, bias_bound: float | None = None) -> bool:
    """Whether ``conv(x, w) + bias + residual`` is finite in every element and in every partial
    sum of every order of summation: x, bias and residual hold no NaN and no infinity and
    ``max|x| * w_bound + max|bias| + max|residual|`` (each max bounded by the vector's 2-norm) is
    below :data:`FINITE_LIMIT`. ``w_bound``: :func:`weight_bound` of the weights; ``bias_bound``:
    :func:`vector_bound` of the bias when the caller keeps it (else the bias is read). Reads x (and
    the bias and residual) once; False (never a wrong True) when any of them holds a NaN or an
    infinity, or the bound overflows."""
    if not (w_bound == w_bound and w_bound < math.inf):
        return False
    return conv_bound(_norm(x), w_bound, vector_bound(bias) if bias_bound is None else bias_bound,
                      vector_bound(residual)) < math.inf


# Bumped after every optimizer step in the process (torch.optim's global step hook, registered by
# :func:`watch_optimizers` at the first kept bound or frozen snapshot): fused optimizers (Adam(fused=True),
# fused SGD) update parameters without moving their version counters, so a step is itself a sign that
# what was derived from a parameter (a frozen snapshot, the guard's weight bound) may be stale.
OPTIMIZER_EPOCH = [0]
_STEP_HOOK: list = []


def _bump_epoch(*_args, **_kwargs) -> None:
    OPTIMIZER_EPOCH[0] += 1


def watch_optimizers() -> None:
    """Register the optimizer step hook that bumps :data:`OPTIMIZER_EPOCH` (once per process)."""
    if not _STEP_HOOK:
        try:
            # (imported by name: torch 2.14's torch.optim namespace has no `optimizer` attribute)
            from torch.optim.optimizer import register_optimizer_step_post_hook

            _STEP_HOOK.append(register_optimizer_step_post_hook(_bump_epoch))
        except Exception:  # noqa: BLE001  (a torch without the global hook: version counters only)
            _STEP_HOOK.append(None)


# A bound that travels with a fused plan's result, so that the next fused plan fed that very tensor
# need not read it: (version counter, data pointer, bound of max|y|) under this key of the tensor's
# __dict__. Any write through torch moves the version counter (a write through ``.data``, numpy or
# a C library does not: :func:`carry_bound`'s callers overwrite the key whenever they write a result).
_CARRIED = "_rawconv_max_bound"
#: |act(v)| <= this for every v (the others: |act(v)| <= |v|)
ACTIVATION_CAP = {"relu6": 6.0, "sigmoid": 1.0, "hardsigmoid": 1.0, "tanh": 1.0}


def carried_bound(t) -> float | None:
    """The bound of max|t| a fused plan left on ``t`` when it wrote it, while t holds exactly what was
    written (same version counter, same storage); None otherwise (an inference tensor keeps no
    version counter: never)."""
    try:
        c = t.__dict__.get(_CARRIED)
        if c is None or c[0] != t._version or c[1] != t.data_ptr():
            return None
    except (AttributeError, RuntimeError):
        return None
    return c[2]


def forget_bound(*ts) -> None:
    """Drop the bound a fused plan left on each tensor of ``ts`` (None and non-tensors skipped), so
    that the next fused plan reads it. The fused operators' kernels reached through torch's
    dispatcher do this for x and the residual: the code torch.compile generates (inductor) writes
    a result into the memory of a dead intermediate in place (``buf9 = buf2; del buf2  # reuse``)
    without moving its version counter, so a bound left on that tensor by the plan that wrote it
    would describe values no longer there (a NaN made in between would be dropped by a fused ReLU)."""
    for t in ts:
        try:
            d = t.__dict__
        except AttributeError:
            continue
        if _CARRIED in d:
            del d[_CARRIED]


def carry_bound(y, bound: float | None, activation: str = "none") -> None:
    """Leave ``bound`` (of max|conv + b + r|; None or inf: nothing known) on the result ``y`` of
    ``activation`` applied to it, replacing what an earlier write left there."""
    try:
        d = y.__dict__
        if bound is None or not bound < math.inf:
            d.pop(_CARRIED, None)
            return
        d[_CARRIED] = (y._version, y.data_ptr(), min(bound, ACTIVATION_CAP.get(activation, bound)))
    except (AttributeError, RuntimeError):
        pass


# ---------------------------------------------------------------------------- fused or not: measured
@dataclass
class FusionDecision:
    """What :func:`decide_fusion` measured: ``fused`` (True: keep the fused call), the median and
    min over rounds of each variant's time per call (ms), ``rounds``, and ``reason`` (one line)."""

    fused: bool
    fused_ms: float
    unfused_ms: float
    fused_min_ms: float
    unfused_min_ms: float
    rounds: int
    reason: str = ""
    samples: dict = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict:
        return {"decision": "fused" if self.fused else "unfused", "fused_ms": self.fused_ms,
                "unfused_ms": self.unfused_ms, "fused_min_ms": self.fused_min_ms,
                "unfused_min_ms": self.unfused_min_ms, "rounds": self.rounds, "reason": self.reason}


def _time_cpu(fn: Callable[[], object], iterations: int):
    from .bench import time_cpu

    return time_cpu(fn, iterations=iterations, warmup=1)


def decide_fusion(fused: Callable[[], object], unfused: Callable[[], object], *, rounds: int = 5,
                  iterations: int = 3, budget_s: float | None = None,
                  timer: Callable[[Callable[[], object], int], object] | None = None) -> FusionDecision:
    """Time ``fused`` (one call: the fused convolution) against ``unfused`` (one call: the
    convolution at its best choice, then the epilogue as separate ops) interleaved in one process:
    ``rounds`` rounds, each timing ``iterations`` calls of one then the other (the order alternating
    round by round, ABBA, so that drift and warm caches favour neither). Per variant, the median of
    the rounds' medians and the min of their mins (ms per call). The fused call is kept only when
    it is faster by both (a disagreement, a tie: unfused, which is what the model's own ops do).
    ``budget_s``: stop after the round that crosses it (at least 3 rounds, or ``rounds`` if fewer).
    ``timer(fn, iterations)``: returns an object with ``median_ms`` and ``min_ms`` (default:
    :func:`rawconv.core.bench.time_cpu` with one warm-up call; on a GPU pass e.g. a wrapper of
    :func:`rawconv.core.bench.time_cuda_queued`). Generic: it knows nothing of convolutions."""
    if not callable(fused) or not callable(unfused):
        raise ArgumentTypeError("decide_fusion takes two callables (fused, unfused)")
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1 or not isinstance(iterations, int) \
            or isinstance(iterations, bool) or iterations < 1:
        raise ArgumentError(f"rounds and iterations must be positive ints, got {rounds!r}, {iterations!r}")
    timer = timer or _time_cpu
    f_med, f_min, u_med, u_min = [], [], [], []
    t0 = time.perf_counter()
    done = 0
    for r in range(rounds):
        order = ((fused, f_med, f_min), (unfused, u_med, u_min))
        if r % 2:
            order = order[::-1]
        for fn, med, mn in order:
            s = timer(fn, iterations)
            med.append(float(s.median_ms))
            mn.append(float(s.min_ms))
        done += 1
        if budget_s is not None and done >= min(3, rounds) and time.perf_counter() - t0 > budget_s:
            break
    fm, um = statistics.median(f_med), statistics.median(u_med)
    fmin, umin = min(f_min), min(u_min)
    keep = fm < um and fmin < umin
    if keep:
        reason = f"fused faster: median {fm:.4f} vs {um:.4f} ms, min {fmin:.4f} vs {umin:.4f} ms"
    elif fm >= um and fmin >= umin:
        reason = f"unfused faster: median {um:.4f} vs {fm:.4f} ms (fused), min {umin:.4f} vs {fmin:.4f} ms"
    else:
        reason = (f"median and min disagree (fused {fm:.4f}/{fmin:.4f} ms, unfused {um:.4f}/{umin:.4f} ms "
                  "median/min): not measured faster, unfused kept")
    return FusionDecision(keep, fm, um, fmin, umin, done, reason,
                          {"fused_median": f_med, "fused_min": f_min, "unfused_median": u_med, "unfused_min": u_min})
