"""What the legacy API's plan (:class:`rawconv.cudnn.Convolution`), its parts
(:mod:`rawconv.cudnn.legacy.algorithms`, :mod:`rawconv.cudnn.legacy.autotune`) and the function forms
share: the algo and math-type tables, the row types (:class:`Algorithm`, :class:`TimedAlgorithm`,
:class:`RunInfo`), the choice and precision helpers, the GPU timer and the tuning key's options and
environment. The face (:mod:`rawconv.cudnn`) hands these names on; the parts import them from here, not
from the face.

``gpu_time`` is read here at call time (``common.gpu_time``): set it on the face
(``rawconv.cudnn.gpu_time = f``), whose module type passes it on to this module.
"""
from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Sequence

import torch

from .. import _ffi as _cudnn
from ...core.errors import ArgumentError
from ...core.backend import Candidate, canonical_direction
from ...core.results import Result
from ...core.problem import ConvProblem, layout_of

log = logging.getLogger("rawconv.cudnn")
DIRECTIONS = ("forward", "backward_data", "backward_weights")   # "backward_filter" is accepted as cuDNN's alias
DTYPES = ("float32", "float16", "bfloat16", "float64")
INT32_LIMIT = 2 ** 31 - 1  # cuDNN's legacy descriptors hold int32 dims and strides
MATH_TYPES = {"default": "CUDNN_DEFAULT_MATH", "tensor_op": "CUDNN_TENSOR_OP_MATH",
              "tensor_op_allow_conversion": "CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION", "fma": "CUDNN_FMA_MATH"}
_MATH_BY_VALUE = {_cudnn.enum_value(v): k for k, v in MATH_TYPES.items()}
ACTIVATIONS = ("identity", "relu", "sigmoid", "tanh", "elu")
_ALGO_ENUM = {"forward": ("cudnnConvolutionFwdAlgo_t", "CUDNN_CONVOLUTION_FWD_ALGO_"),
              "backward_data": ("cudnnConvolutionBwdDataAlgo_t", "CUDNN_CONVOLUTION_BWD_DATA_ALGO_"),
              "backward_weights": ("cudnnConvolutionBwdFilterAlgo_t", "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_")}


def _short(name: str, prefix: str) -> str:
    s = name[len(prefix):]
    return "ALGO_" + s if s[:1].isdigit() else s


def _algo_table(direction: str) -> dict[int, str]:
    ctype, prefix = _ALGO_ENUM[direction]
    return {v: _short(n, prefix) for n, v in _cudnn.enum_items(ctype).items() if not n.endswith("_COUNT")}


ALGOS = {d: _algo_table(d) for d in DIRECTIONS}
ALGOS["backward_filter"] = ALGOS["backward_weights"]
FwdAlgo = enum.IntEnum("FwdAlgo", {n: v for v, n in ALGOS["forward"].items()})
BwdDataAlgo = enum.IntEnum("BwdDataAlgo", {n: v for v, n in ALGOS["backward_data"].items()})
BwdFilterAlgo = enum.IntEnum("BwdFilterAlgo", {n: v for v, n in ALGOS["backward_weights"].items()})
MathType = enum.IntEnum("MathType", {k.upper(): _cudnn.enum_value(v) for k, v in MATH_TYPES.items()})
_ALGO_ENUMS = {"forward": FwdAlgo, "backward_data": BwdDataAlgo, "backward_weights": BwdFilterAlgo,
               "backward_filter": BwdFilterAlgo}


# ---------------------------------------------------------------------------- result rows
@dataclass(frozen=True, repr=False)
class Algorithm(Candidate):
    """One row of :func:`algorithms` / :func:`candidates`: an (algo, math type) pair as cuDNN reports it.

    ``algo``: name without the C prefix (``"IMPLICIT_PRECOMP_GEMM"``, ``"ALGO_1"``); ``algo_id``:
    its enum value; ``math``: the math type cuDNN reports for this row (``"fma"``, ``"default"``,
    ``"tensor_op"``, ``"tensor_op_allow_conversion"``); ``status``: ``cudnnStatus_t`` name
    (``CUDNN_STATUS_SUCCESS`` when usable); ``time_ms``: measured by Find (ms; None for the
    heuristic); ``workspace_bytes``; ``deterministic``; ``mode``: "find" or "heuristic";
    ``requested_math``: the math type set on the convolution descriptor for the query.
    """

    direction: str
    algo: str
    algo_id: int
    math: str
    status: str
    time_ms: float | None
    workspace_bytes: int
    deterministic: bool
    mode: str = "heuristic"
    requested_math: str = ""

    backend = "cudnn"

    @property
    def choice(self) -> str:
        """The stable name :meth:`Convolution.select` and ``choice=`` take: ``"ALGO@math"``,
        e.g. ``"IMPLICIT_PRECOMP_GEMM@fma"``."""
        return f"{self.algo}@{self.math}"

    @property
    def notes(self) -> tuple:
        return (f"math={self.math}", "deterministic" if self.deterministic else "non-deterministic")

    @property
    def ok(self) -> bool:
        return self.status == "CUDNN_STATUS_SUCCESS"

    def __str__(self) -> str:
        t = f"{self.time_ms:9.4f} ms" if self.time_ms is not None and self.time_ms >= 0 else "        - ms"
        st = "ok" if self.ok else self.status.replace("CUDNN_STATUS_", "")
        return (f"{self.algo:<24} math={self.math:<26} {st:<22} {t}  workspace={self.workspace_bytes} B  "
                f"{'deterministic' if self.deterministic else 'non-deterministic'}")


class TimedAlgorithm(Result):
    """A row of :meth:`Convolution.autotune`: a :class:`rawconv.results.Result` of the cuDNN
    legacy backend (the algo and math type, GPU times in ms), built with this row type's older
    constructor."""

    def __init__(self, algorithm: Algorithm, median_ms: float, min_ms: float, runs: int, *,
                 problem: ConvProblem | None = None):
        Result.__init__(self, "cudnn", algorithm.choice, problem, algorithm.direction, algorithm, "ok", median_ms,
                        min_ms, runs, None, algorithm.workspace_bytes,
                        " ".join(algorithm.notes))

    def __str__(self) -> str:
        a = self.algorithm
        return (f"{a.algo:<24} math={a.math:<26} median {self.median_ms:.4f} ms  min {self.min_ms:.4f} ms  "
                f"workspace={a.workspace_bytes} B")


@dataclass(frozen=True)
class RunInfo:
    """What ran: ``algo`` (name) and ``algo_id``, ``math`` (the math type set on the descriptor),
    ``math_reported`` (the math type cuDNN reports for this algo under it: ``"default"`` for fp32
    means TF32 tensor cores may be used), ``workspace_bytes``, ``deterministic``, ``fused`` (bias
    and activation through ``cudnnConvolutionBiasActivationForward``; False when applied
    separately; None when there is neither), ``notes`` (explicit padding copies, batch splitting)."""

    direction: str
    algo: str
    algo_id: int
    math: str
    math_reported: str
    workspace_bytes: int
    deterministic: bool
    fused: bool | None = None
    notes: tuple = ()

    @property
    def tf32_possible(self) -> bool:
        return self.math_reported in ("default", "tensor_op", "tensor_op_allow_conversion")

    def __str__(self) -> str:
        fused = {None: "", True: ", bias fused", False: ", bias not fused"}[self.fused]
        notes = "; " + "; ".join(self.notes) if self.notes else ""
        return (f"{self.direction} {self.algo}@{self.math} (cuDNN reports math {self.math_reported}), workspace "
                f"{self.workspace_bytes} B, {'deterministic' if self.deterministic else 'non-deterministic'}"
                f"{fused}{notes}")

    def __repr__(self) -> str:
        return f"<RunInfo {self}>"


# ---------------------------------------------------------------------------- helpers


def weights_layout(w: torch.Tensor, problem: ConvProblem | None = None) -> str:
    """The filter layout a legacy plan describes: the data's (``problem.layout``) when given: cuDNN's
    legacy algos take the filter in the tensors' format (an NCHW x with an NHWC filter finds no algo
    at all), and weights of another layout are copied per call by :meth:`Convolution.execute`."""
    if problem is not None:
        return problem.layout
    return "nhwc" if w.dim() >= 3 and not w.is_contiguous() and layout_of(w) == "nhwc" else "nchw"


def _as4d(shape: Sequence[int]) -> list[int]:
    """1-D problems run as 2-D with a unit height: (N, C, W) -> (N, C, 1, W)."""
    shape = list(shape)
    return shape[:2] + [1] + shape[2:] if len(shape) == 3 else shape


def _math_name(math: str | None, dtype: str) -> str:
    if math is None:
        return "tensor_op" if dtype in ("float16", "bfloat16") else "fma"
    if not isinstance(math, str) or math not in MATH_TYPES:
        raise ArgumentError(f"math must be one of {list(MATH_TYPES)} (or None), got {math!r}")
    return math


def _check_device(p: ConvProblem) -> int:
    if not p.device.startswith("cuda"):
        raise ArgumentError(f"rawconv.cudnn runs on CUDA tensors; got tensors on {p.device} "
                            "(use rawconv.onednn for CPU tensors)")
    if p.dtype not in DTYPES:
        raise ArgumentError(f"cuDNN backend handles {list(DTYPES)}, got {p.dtype}")
    d = torch.device(p.device)
    return d.index if d.index is not None else torch.cuda.current_device()


_PRECISION_MATH = {"strict": None, "tf32": "tensor_op", "bf16": "tensor_op_allow_conversion",
                   "f16": "tensor_op_allow_conversion", "any": "default"}


def _math_of(math: str | None, precision: str | None, options=None) -> str | None:
    """The math type from ``math`` (cuDNN's word) or ``precision`` (rawconv's, see
    :mod:`rawconv.options`; or ``options.precision``); both given must agree."""
    if options is not None:
        from ...core.options import options_of

        opt = options_of(options)
        if precision is None and opt.precision != "strict":
            precision = opt.precision
    if precision is None:
        return math
    from ...core.options import PRECISIONS

    if precision not in PRECISIONS:
        raise ArgumentError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    m = _PRECISION_MATH[precision]
    if math is not None and m is not None and math != m:
        raise ArgumentError(f"math={math!r} and precision={precision!r} disagree (precision {precision!r} is "
                            f"math {m!r})")
    return math if math is not None else m


def _split_choice(direction: str, algo, choice, math):
    """``choice`` (rawconv's word: an :class:`Algorithm` row or ``"ALGO@math"``) or ``algo``
    (cuDNN's: a name, enum value, ``"fastest"``, None) as ``(algo, math)``."""
    if choice is not None and algo is not None and choice != algo:
        raise ArgumentError(f"choice={choice!r} and algo={algo!r} disagree; pass one (algo is cuDNN's word for choice)")
    c = choice if choice is not None else algo
    if isinstance(c, Algorithm):
        if canonical_direction(c.direction) != canonical_direction(direction):
            raise ArgumentError(f"{c.choice} was listed for {c.direction}, not {direction}")
        c, m = c.algo_id, c.math
    elif isinstance(c, str) and "@" in c:
        c, _, m = c.partition("@")
        _math_name(m, "float32")
    else:
        return c, math
    if math is not None and math != m:
        raise ArgumentError(f"the choice runs math {m!r}, but math={math!r} was given")
    return c, m


def is_graph_choice(c) -> bool:
    """Whether a choice names a graph-API engine config (``"eng28{k2=3}"``, ``"nhwc:eng72"``,
    ``"unfused:eng5"``, an ``EngineConfig``): those run through :mod:`rawconv.cudnn_graph`."""
    if isinstance(c, str):
        return c.startswith(("eng", "nhwc:eng", "unfused:"))
    return type(c).__name__ == "EngineConfig"


def normalize_choice(direction, algo, choice, math, precision, engine):
    """``(algo, math, engine)`` from the function forms' keywords: a graph choice becomes ``engine``."""
    if choice is not None and is_graph_choice(choice):
        if engine is not None and engine != choice:
            raise ArgumentError(f"choice={choice!r} and engine={engine!r} disagree; pass one")
        return algo, _math_of(math, precision), choice
    algo, math = _split_choice(direction, algo, choice, _math_of(math, precision))
    return algo, math, engine


def resolve_algo(direction: str, algo) -> int:
    """The ``cudnnConvolution*Algo_t`` value of ``algo`` (its name, e.g. ``"IMPLICIT_GEMM"``, or
    its int) for ``direction``; raises :class:`ArgumentTypeError` / :class:`ArgumentError`."""
    direction = canonical_direction(direction)
    table = ALGOS[direction]
    if isinstance(algo, bool) or not isinstance(algo, (int, str)):
        raise ArgumentError(f"algo must be None, 'fastest', a name or an int, got {algo!r}")
    if isinstance(algo, int):
        if algo not in table:
            raise ArgumentError(f"algo {algo} is not a {direction} algo; known: "
                                + ", ".join(f"{v}={n}" for v, n in table.items()))
        return int(algo)
    s = algo.strip().upper()
    _, prefix = _ALGO_ENUM[direction]
    for v, n in table.items():
        full = prefix + (n[5:] if n.startswith("ALGO_") and n[5:].isdigit() else n)
        if s in (n, full) or (n.startswith("ALGO_") and s == n[5:]):
            return v
    raise ArgumentError(f"unknown {direction} algo {algo!r}; known: {', '.join(table.values())}")


_ACT_FNS = {"relu": torch.relu_, "sigmoid": torch.sigmoid_, "tanh": torch.tanh_,
            "elu": lambda t: torch.nn.functional.elu(t, inplace=True), "identity": lambda t: t}


def gpu_time(fn, iterations: int = 20, warmup: int = 3, repeats: int = 3):
    """GPU time per call of ``fn`` (ms), free of host gaps: :func:`rawconv.bench.time_cuda_queued`.
    cuDNN's legacy entry points cost far more host time per call than their kernels take on small
    problems (see benchmarks/bench_overhead_cuda.py), so per-call event pairs would time the host."""
    from ...core.bench import time_cuda_queued

    return time_cuda_queued(fn, iterations=iterations, warmup=warmup, repeats=repeats)


def key_options(math: str, deterministic: bool = False, workspace_limit: int | None = None) -> dict:
    """The options of a legacy cuDNN tuning key: the math type set on the descriptor,
    determinism, workspace limit."""
    return {"math": math, "deterministic": bool(deterministic), "workspace_limit": workspace_limit}


def environment(device_index: int | None = None) -> dict:
    """The library and device a cuDNN tuning key records: ``{"library": "cuDNN",
    "library_version": "9.19.0", "device": "NVIDIA H200", "device_arch": "sm_90"}`` (needs the GPU)."""
    idx = torch.cuda.current_device() if device_index is None else device_index
    major, minor = torch.cuda.get_device_capability(idx)
    return {"library": "cuDNN", "library_version": _cudnn.version()["version"],
            "device": torch.cuda.get_device_name(idx), "device_arch": f"sm_{major}{minor}"}


# every public entry point raises only rawconv's exception classes (rawconv._guard)
from ...core import guard as _guard  # noqa: E402

_guard.guard_module(globals(), "gpu_time")
