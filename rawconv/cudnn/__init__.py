"""cuDNN convolutions on torch CUDA tensors (legacy API): list every algo, force one, time it.

Quick use::

    y = rawconv.cudnn.forward(x, w, padding=1)                          # cuDNN's heuristic (_v7), FMA math
    y = rawconv.cudnn.forward(x, w, padding=1, algo="IMPLICIT_PRECOMP_GEMM")   # exactly that algo
    y = rawconv.cudnn.forward(x, w, padding=1, algo="fastest")          # measured by Find, cached
    for row in rawconv.cudnn.algorithms(x, w, padding=1):               # one row per (algo, math type)
        print(row)
    with rawconv.cudnn.Convolution(x, w, padding=1, math="tensor_op") as conv:   # a plan for one problem
        conv.autotune()
        y = conv.execute(x)

Terms are cuDNN's: an *algo* (``cudnnConvolutionFwdAlgo_t`` and the backward ones), a *math type*
(``CUDNN_FMA_MATH`` = IEEE fp32 arithmetic; ``CUDNN_DEFAULT_MATH`` lets fp32 run on TF32 tensor
cores on Ampere and newer; ``CUDNN_TENSOR_OP_MATH``; ``CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION``), a
*workspace* (device scratch memory, bytes), the *heuristic* (``cudnnGet*Algorithm_v7``) and *Find*
(``cudnnFind*AlgorithmEx``: cuDNN times every algo).

rawconv never enables TF32 unless asked: the default math for fp32 and fp64 is ``"fma"``; for
fp16/bf16 it is ``"tensor_op"`` (tensor cores; products are exact and accumulate in fp32).

The graph (backend) API lives in :mod:`rawconv.cudnn_graph`; ``forward(..., engine=...)`` and
:func:`engines` / :class:`EngineConfig` reach it from here.
"""
from __future__ import annotations

import enum
import logging
import math as _math
import threading
from typing import Any, Sequence

import torch

from . import _cuda, _ffi as _cudnn
from ..core import guard as _guard
from ._ffi import ffi
from ..core.errors import ArgumentError, ArgumentTypeError, NotSupportedError
from ..core.plans import PlanCache, PlanLifetime, arg_key
from ..core.backend import canonical_direction
from ..core.results import ResultTable
from ..core.grad import grad_function as _grad_slot, needs_grad as _needs_grad
from ..core.problem import ConvProblem, check_tensor, empty_like_layout, layout_of, to_layout, dense_strides, strides_match, shape_only, torch_names

__all__ = ["Algorithm", "TimedAlgorithm", "RunInfo", "Convolution", "forward", "backward_data",
           "backward_weights", "backward_filter", "candidates", "conv_transpose", "algorithms", "info", "clear_cache", "MATH_TYPES",
           "FwdAlgo", "BwdDataAlgo", "BwdFilterAlgo", "MathType", "DIRECTIONS", "INT32_LIMIT",
           "capabilities"]
# also, lazily from rawconv.cudnn_graph: engines, EngineConfig (see __getattr__ at the end)

# the legacy API's shared names live in legacy/common.py (its parts import them from there); handed on here.
# gpu_time is not among them: the module type below passes it through to legacy/common.py
from .legacy.common import (  # noqa: F401
    log, DIRECTIONS, DTYPES, INT32_LIMIT, MATH_TYPES, _MATH_BY_VALUE, ACTIVATIONS, _ALGO_ENUM, _short, _algo_table,
    ALGOS, FwdAlgo, BwdDataAlgo, BwdFilterAlgo, MathType, _ALGO_ENUMS, Algorithm, TimedAlgorithm, RunInfo,
    weights_layout, _as4d, _math_name, _check_device, _PRECISION_MATH, _math_of, _split_choice, is_graph_choice,
    normalize_choice, resolve_algo, _ACT_FNS, key_options, environment)

# the parts (rawconv/cudnn/legacy/): hot.py (the hot path's prepared call), plan.py (Convolution,
# ResidualBiasActivation), functions.py (the function forms, plan caches, capabilities); handed on here
from .legacy.hot import _Hot  # noqa: E402,F401
from .legacy.plan import Convolution, ResidualBiasActivation  # noqa: E402,F401
from .legacy.functions import (  # noqa: E402,F401
    _cache, _fast, cached_plan, clear_cache, _graph, _fast_key, _forward_key, cached_forward_plan, forward,
    _check_shape_arg, grad_problem, backward_data, backward_weights, backward_filter, conv_transpose, algorithms,
    candidates, _CAPS, _CAPS_LOCK, _CAP_MODES, capabilities)
from .legacy import common as _common, functions as _functions  # noqa: E402
from ..core.face import route_settings as _route_settings  # noqa: E402
from .legacy.algorithms import Algorithms as _Algorithms  # noqa: E402,F401 - descriptors, queries, selection
from .legacy.autotune import Autotune as _Autotune  # noqa: E402,F401 - the timed search, tuning records

# set on this face (rawconv.cudnn.gpu_time = f, a test's monkeypatch), these reach the part that reads them
# at call time: gpu_time rawconv.cudnn.legacy.common (the legacy autotune), the others
# rawconv.cudnn.legacy.functions (the function forms call each other through their module's globals)
_SETTINGS = {"gpu_time": _common, "grad_problem": _functions, "cached_plan": _functions,
             "backward_data": _functions, "backward_weights": _functions}
_route_settings(__name__, _SETTINGS)   # (rawconv.core.face: unittest.mock.patch.object restores them too)

# ---------------------------------------------------------------------------- info and graph re-exports
from .library import info, library_version  # noqa: E402,F401 - handed on

from ..core import tuning as _tuning  # noqa: E402

_tuning.register_environment("cudnn", environment)


def __getattr__(name):  # lazy re-exports of the graph API: rawconv.cudnn.engines, EngineConfig
    if name in ("engines", "EngineConfig"):
        try:
            from . import graph as cudnn_graph
        except ImportError as exc:
            raise AttributeError(f"rawconv.cudnn.{name} needs rawconv.cudnn_graph, which is not available: "
                                 f"{exc}") from None
        return getattr(cudnn_graph, name)
    raise AttributeError(f"module 'rawconv.cudnn' has no attribute {name!r}")


# ---------------------------------------------------------------------------- the registry
def _registry_candidates(problem: ConvProblem, direction: str = "forward", options: Any = None) -> ResultTable:
    return Convolution.from_problem(problem, direction=direction, options=options).algorithms("find", "all")


def _registry_plan(problem: ConvProblem, direction: str = "forward", options: Any = None, choice: Any = None):
    return Convolution.from_problem(problem, direction=direction, options=options, choice=choice)


# every public entry point raises only rawconv's exception classes (rawconv._guard)
# (the function forms and the plan's methods are guarded in their parts, rawconv.cudnn.legacy.*)
_guard.guard_module(globals(), "info")

from ..core.backend import Backend as _Backend, register as _register  # noqa: E402

_register(_Backend("cudnn", "cuda", __name__, "cuDNN", _registry_candidates, _registry_plan, info,
                   "cuDNN's legacy API on CUDA tensors: every (algo, math type)",
                   {"candidates": "algorithms", "choice": "algo", "precision": "math",
                    "backward_weights": "backward_filter"}, rows="rawconv.explore.cudnn_rows:cudnn_rows",
                   # "ALGO@math": an algorithm of cuDNN's enums (any direction), a math type
                   choice_names="(" + "|".join(sorted({n for d in DIRECTIONS for n in ALGOS[d].values()}, key=len,
                                                      reverse=True))
                   + ")(@(" + "|".join(MATH_TYPES) + "))?"))
