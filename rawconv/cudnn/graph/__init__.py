"""cuDNN graph (backend) API convolutions on torch CUDA tensors: every engine and knob setting.

Quick use::

    rows = rawconv.cudnn_graph.engines(x, w, padding=1)               # heuristic mode instant
    rows = rawconv.cudnn_graph.engines(x, w, padding=1, heuristic="all", limit=8)
    y = rawconv.cudnn_graph.forward(x, w, padding=1, engine="eng28{k2=3,k3=0}")   # exactly that config
    y = rawconv.cudnn_graph.forward(x, w, b, padding=1, activation="relu")        # fused graph

    with rawconv.cudnn_graph.GraphConvolution(x, w, padding=1) as conv:
        table = conv.autotune(budget_s=10)       # time + check every candidate, ranked
        y = conv.execute(x)                      # one cudnnBackendExecute per call

Terms are cuDNN's: an *operation graph* (here one convolution node, plus pointwise nodes for a
fused bias and activation), *engines* (global indices ``0 .. CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT-1``),
*knobs* of an engine (tile size, split-K, stages, ...), an *engine config* (engine + knob choices),
*heuristic modes* (instant/A, B, FALLBACK) that rank engine configs, an *execution plan* (a
finalized engine config, with its *workspace*), *numerical notes* (TENSOR_CORE,
DOWN_CONVERT_INPUTS, REDUCED_PRECISION_REDUCTION, FFT, WINOGRAD, NONDETERMINISTIC) and *behavior
notes* (RUNTIME_COMPILATION, ...). An engine config is named ``eng<index>{k<knob type>=<value>,...}``
(``eng28`` alone: the engine's default knobs); cudnn-frontend's ``eng28_k2=3_k3=0`` is accepted too.

float32 convolutions run IEEE fp32 unless ``allow_tf32=True``: configs with the TENSOR_CORE
numerical note run fp32 on TF32 tensor cores, and are left out of default selection and autotune
(forcing one by name still runs it). Most engines take NHWC (channels_last) tensors; NCHW graphs
often get no engine at all (``NotSupportedError`` says so).
"""
from __future__ import annotations

import logging
import math
import operator
import re
import threading
import time
from typing import Any, Sequence

import torch

from .. import _cuda, _ffi as _cudnn
from . import _backend_api as B, search as _search
from ...core import guard as _guard, tuning, plans as _budget
from .search import TimedConfig, knob_combinations
from ...core.errors import ArgumentError, ArgumentTypeError, LibraryError, NotSupportedError
from ...core.backend import canonical_direction
from ...core.results import ResultTable
from ...core.plans import PlanCache, PlanLifetime
from ...core import check as _check
from ...core.check import ErrorStats, Tolerance, tolerance_for
from ...core.grad import grad_function as _grad_slot, needs_grad as _needs_grad
from ...core.problem import ConvProblem, check_tensor, empty_like_layout, layout_of, to_layout, dense_strides, shape_only, random_tensor, seed_offset

__all__ = ["EngineConfig", "TimedConfig", "GraphConvolution", "engines", "forward", "backward_data",
           "backward_filter", "clear_cache", "tuning_cache", "save_tuning_cache", "load_tuning_cache",
           "HEURISTIC_MODES", "ACTIVATIONS", "DIRECTIONS", "KNOWN_WRONG", "known_wrong"]

# the names GraphConvolution's parts share live in common.py (the parts import them from there); handed on
# here. SERIALIZE_RTC, environment and reference are not among them: the autotune and _Built read them in
# common.py at call time, and the module type below passes them through (set on the face, they reach it)
from .common import (  # noqa: F401
    log, HEURISTIC_MODES, ACTIVATIONS, DIRECTIONS, DTYPES, ALIGNMENT, UID, _VIRTUAL_UIDS, _ROLES, _OUT_ROLE,
    _ROLE_WORDS, _VENDOR_DIRECTION, _GRAPH_NAMES, KNOWN_WRONG, known_wrong, _NAME_RE, EngineConfig,
    _stream_lock, _VPS_KEPT, _EPILOGUE_ACT, torch_epilogue, _Built, _version, _configs_of)


# the parts: operation.py (OperationGraph, the checks), plan.py (GraphConvolution, its hot path, the settings
# it reads), functions.py (the function forms, plan and tuning caches); handed on here
from .operation import (_lift, _norm_direction, check_activation, _device_index, tolerance_args,  # noqa: E402,F401
                        check_result, OperationGraph)
from .plan import DEFAULT_UNFUSED, CAPTURE_PROBE, _GraphHot, GraphConvolution  # noqa: E402,F401
from .functions import (ENV_TUNING_FILE, tuning_cache, save_tuning_cache, load_tuning_cache,  # noqa: E402,F401
                        clear_tuning_cache, _plans, _plan, clear_cache, _MATH_TF32, allows_tf32, _problem, forward,
                        cached_forward_plan, _fast_plans, _hashable, _transpose_x_shape, backward_data,
                        backward_filter, backward_weights, cached_grad_plan, _check_tensor, engines)
from .. import library as _library  # noqa: E402 - info(): the loaded cuDNN (not the legacy face)
from . import common as _common, operation as _operation, plan as _plan_part  # noqa: E402
from ...core.face import route_settings as _route_settings  # noqa: E402
from .engines import Engines as _Engines, empty_result as _empty_result  # noqa: E402,F401
from .autotune import Autotune as _Autotune  # noqa: E402,F401

# set on this face (rawconv.cudnn_graph.SERIALIZE_RTC = False, a test's monkeypatch), these reach the part
# that reads them at call time: SERIALIZE_RTC (read by _Built), environment and reference (the autotune) and
# known_wrong (the plan, the engines) rawconv.cudnn.graph.common; check_result rawconv.cudnn.graph.operation;
# CAPTURE_PROBE and DEFAULT_UNFUSED rawconv.cudnn.graph.plan, where GraphConvolution reads them
_SETTINGS = {"SERIALIZE_RTC": _common, "environment": _common, "reference": _common, "known_wrong": _common,
             "check_result": _operation, "CAPTURE_PROBE": _plan_part, "DEFAULT_UNFUSED": _plan_part}
_route_settings(__name__, _SETTINGS)   # (rawconv.core.face: unittest.mock.patch.object restores them too)


# ---------------------------------------------------------------------------- the registry
def _registry_tf32(options: Any) -> bool:
    from ...core.options import options_of

    return options_of(options).precision != "strict"


def _registry_candidates(problem: ConvProblem, direction: str = "forward", options: Any = None) -> ResultTable:
    return GraphConvolution.from_problem(problem, direction=direction,
                                         allow_tf32=_registry_tf32(options)).engines("all", limit=1)


def _registry_plan(problem: ConvProblem, direction: str = "forward", options: Any = None, choice: Any = None):
    return GraphConvolution.from_problem(problem, direction=direction, allow_tf32=_registry_tf32(options),
                                         engine=choice)


def _registry_replay(key, problem: ConvProblem, choice: Any, options: dict):
    """A tuning record's plan (rawconv.tuning.replay): with its fused activation when it had one."""
    if key.activation:
        return GraphConvolution.from_problem(problem, direction=key.direction, activation=key.activation,
                                             engine=choice, allow_tf32=options.get("precision") == "tf32")
    return _registry_plan(problem, key.direction, options, choice)


def _registry_info() -> dict:
    return _library.info()

# (the function forms and the plan's methods are guarded in their parts, rawconv.cudnn.graph.*)

from ...core.backend import Backend as _Backend, register as _register  # noqa: E402

_register(_Backend("cudnn_graph", "cuda", __name__, "cuDNN", _registry_candidates, _registry_plan, _registry_info,
                   "cuDNN's graph (backend) API on CUDA tensors: engines, knobs, heuristic modes",
                   {"candidates": "engines", "choice": "engine", "precision": "allow_tf32",
                    "backward_weights": "backward_filter"}, rows="rawconv.explore.cudnn_rows:cudnn_graph_rows",
                   replay=_registry_replay,
                   # engine configs: "eng28", "eng28{k2=3,k3=0}", on a relayout "nhwc:eng72{...}", "unfused:<config>"
                   choice_names=r"((nhwc|unfused):)*eng[0-9]+(\{[^{}]*\})?"))
