"""The graph API's function forms and caches (a part of :mod:`rawconv.cudnn_graph`, the face, which hands
its names on): the tuning cache's functions, the plan caches (:func:`cached_forward_plan`,
:func:`cached_grad_plan`, :func:`clear_cache`), :func:`forward`, :func:`backward_data`,
:func:`backward_filter` (:func:`backward_weights`) and :func:`engines`."""
from __future__ import annotations

import math
import threading
from typing import Any, Sequence

import torch

from . import common as _common
from ...core import guard as _guard, tuning
from ...core.errors import ArgumentError, ArgumentTypeError
from ...core.plans import PlanCache
from ...core.grad import grad_function as _grad_slot, needs_grad as _needs_grad
from ...core.problem import ConvProblem, check_tensor, layout_of, shape_only
from .common import DTYPES, EngineConfig
from .operation import _device_index, _norm_direction, check_activation
from .plan import GraphConvolution

FACE = "rawconv.cudnn.graph"   # where this module's names live (rawconv.cudnn_graph): messages

# ---------------------------------------------------------------------------- tuning cache
ENV_TUNING_FILE = "RAWCONV_CUDNN_TUNING_CACHE"  # the older name of rawconv.tuning.ENV_FILE, still read


tuning.register_environment("cudnn_graph", lambda: _common.environment(torch.cuda.current_device()))


def tuning_cache() -> dict:
    """A snapshot of the cuDNN graph records in the process's tuning cache
    (:func:`rawconv.tuning.cache`, which holds :class:`rawconv.tuning.TuningRecord` objects):
    :class:`~rawconv.tuning.TuningKey` -> ``{"engine": the chosen config's name, "median_ms": ...,
    "min_ms": ..., "t": when (seconds since the epoch), "record": the TuningRecord}``. Keys hold the
    direction, problem, activation, allow_tf32, filters, workspace limit, cuDNN version and GPU.
    With ``$RAWCONV_TUNING_CACHE`` (or ``$RAWCONV_CUDNN_TUNING_CACHE``) set to a JSON file, the
    cache is loaded from there on first use and written back after each autotune."""
    return {r.key: {"engine": r.choice, "median_ms": r.median_ms, "min_ms": r.min_ms, "t": r.created_ts, "record": r}
            for r in tuning.cache().records() if r.key.backend == "cudnn_graph"}


def save_tuning_cache(path: str) -> None:
    """Write the tuning cache to a JSON file (:meth:`rawconv.tuning.TuningCache.save`)."""
    tuning.cache().save(path)


def load_tuning_cache(path: str, *, merge: bool = True) -> int:
    """Read a JSON file written by :func:`save_tuning_cache` into the cache; returns the number
    of records read. Raises :class:`ArgumentError` naming the file when it is missing, not JSON,
    of another (or the old) format (:meth:`rawconv.tuning.TuningCache.load`)."""
    return tuning.cache().load(path, merge=merge)


def clear_tuning_cache() -> None:
    """Empty the in-memory tuning cache (every backend's records; a cache file is rewritten by
    the next put)."""
    tuning.cache().clear()


# ---------------------------------------------------------------------------- function forms
_plans = PlanCache(256)


def _plan(problem: ConvProblem, direction: str, activation, allow_tf32: bool, engine) -> GraphConvolution:
    ekey = engine.name if isinstance(engine, EngineConfig) else engine
    if ekey is not None and not isinstance(ekey, (str, int)) or isinstance(ekey, bool):
        raise ArgumentTypeError(f"engine must be None, 'fastest', a name, an index or an EngineConfig, got {engine!r}")
    key = (problem, direction, activation, allow_tf32, ekey, threading.get_ident())
    plan = _plans.get(key)
    if plan is None:
        plan = GraphConvolution.from_problem(problem, direction=direction, activation=activation,
                                             allow_tf32=allow_tf32)
        if engine in ("fastest", "autotune"):
            plan.autotune()
        elif engine is not None:
            plan.select(engine)
        _plans.put(key, plan)
    return plan


def clear_cache() -> None:
    """Drop every cached plan used by the function forms (the tuning cache stays)."""
    _plans.clear()
    _fast_plans.clear()


_MATH_TF32 = {"fma": False, "ieee": False, "tensor_op": True, "tensor_op_allow_conversion": True, "default": True,
              "tf32": True}


def allows_tf32(allow_tf32: bool, math: str | None) -> bool:
    """``math`` (rawconv.cudnn's names: "fma" = IEEE fp32; "tensor_op", "default" = TF32 allowed)
    overrides ``allow_tf32`` when given."""
    if math is None:
        return allow_tf32
    if math not in _MATH_TF32:
        raise ArgumentError(f"math must be one of {list(_MATH_TF32)}, got {math!r}")
    return _MATH_TF32[math]


def _problem(x, w, bias, stride, padding, dilation, groups) -> ConvProblem:
    p = ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups, allow_dtypes=DTYPES)
    _device_index(p)
    return p


def forward(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
            padding: Any = 0, dilation: Any = 1, groups: int = 1, *, engine: Any = None,
            activation: str | None = None, allow_tf32: bool = False, math: str | None = None,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """Forward convolution through the cuDNN graph API, with the semantics of
    ``torch.nn.functional.conv{1,2,3}d`` (then ``activation``).

    ``x``: (N, C, *spatial) or unbatched, CUDA, float32/float16/bfloat16/float64, NCHW or
    channels_last; ``w``: (K, C/groups, *kernel) (used in x's memory format); ``bias``: (K,);
    ``padding``: int, tuple, ``"same"``/``"valid"`` or one ``(before, after)`` pair per spatial
    dim. ``engine``: None (first config of heuristic mode instant that finalizes), ``"fastest"``
    (:meth:`GraphConvolution.autotune`, tuning cache first), a name (``"eng28{k2=3,k3=0}"``), an
    engine index or an :class:`EngineConfig`. ``activation``: fused after the bias as pointwise
    nodes. ``allow_tf32``: let float32 run on TF32 tensor cores. Returns y (N, K, *out) in x's layout.

    Raises :class:`ArgumentError` / :class:`ArgumentTypeError` before any C call for bad input,
    :class:`NotSupportedError` when cuDNN has no engine (or the forced config does not finalize,
    or the fusion is not supported). Wraps ``cudnnBackendExecute``. Tensors that require grad (grad
    mode on) run as :func:`rawconv.ops.conv` with ``backend="cudnn_graph"`` (autograd recorded;
    ``out`` and ``activation`` are then refused with :class:`ArgumentError`).
    """
    if _needs_grad(x, w, bias):   # record a differentiable op, never a silent detach
        _graph_function = _grad_slot("cudnn_graph")
        return _graph_function("forward", x, w, bias, stride, padding, dilation, groups, engine=engine,
                               allow_tf32=allow_tf32, math=math, out=out, activation=activation)
    return cached_forward_plan(x, w, bias, stride, padding, dilation, groups, engine, activation, allow_tf32,
                               math).execute(x, w, bias, out)


def cached_forward_plan(x, w, bias, stride, padding, dilation, groups, engine, activation, allow_tf32, math):
    """The cached forward plan of :func:`forward`'s arguments (built and validated on first use)."""
    try:   # fast path: a call signature seen before reuses its plan without re-validation
        ekey = engine.name if isinstance(engine, EngineConfig) else engine
        key = (x.shape, x.stride(), x.dtype, x.device, w.shape, w.stride(), w.dtype, w.device,
               None if bias is None else (bias.shape, bias.dtype, bias.device), _hashable(stride),
               _hashable(padding), _hashable(dilation), groups, ekey, activation, allow_tf32, math,
               threading.get_ident())
        plan = _fast_plans.get(key)
    except (AttributeError, TypeError):
        key = plan = None
    if plan is None or plan._freed:
        problem = _problem(x, w, bias, stride, padding, dilation, groups)
        act = check_activation(activation, "forward", bias is not None)
        plan = _plan(problem, "forward", act, allows_tf32(allow_tf32, math), engine)
        if key is not None:
            _fast_plans.put(key, plan)
    return plan


_fast_plans = PlanCache(256)


def _hashable(v):
    return tuple(_hashable(i) for i in v) if isinstance(v, list) else v


def _transpose_x_shape(grad_y, w, stride, padding, dilation, groups, output_padding):
    """conv_transpose semantics: the input shape of the forward conv whose output is grad_y."""
    nd = w.dim() - 2
    from ...core.problem import tuple_arg as _tuple, resolve_padding

    s = _tuple(stride, nd, "stride", 1)
    d = _tuple(dilation, nd, "dilation", 1)
    op = _tuple(output_padding, nd, "output_padding", 0)
    if isinstance(padding, str):
        raise ArgumentError("backward_data without x_shape needs numeric padding (as conv_transpose)")
    pb, pa = resolve_padding(padding, nd, tuple(w.shape[2:]), d, s)
    if any(o >= max(si, di) for o, si, di in zip(op, s, d)):
        raise ArgumentError(f"output_padding {op} must be smaller than stride {s} or dilation {d} (as torch)")
    unbatched = grad_y.dim() == nd + 1
    gs = (1,) + tuple(grad_y.shape) if unbatched else tuple(grad_y.shape)
    spatial = tuple((o - 1) * si - b - a + di * (k - 1) + 1 + opp
                    for o, si, b, a, di, k, opp in zip(gs[2:], s, pb, pa, d, w.shape[2:], op))
    shape = (gs[0], w.shape[1] * groups) + spatial
    return shape[1:] if unbatched else shape


def backward_data(grad_y: torch.Tensor, w: torch.Tensor, x_shape: Sequence[int] | None = None, stride: Any = 1,
                  padding: Any = 0, dilation: Any = 1, groups: int = 1, *, output_padding: Any = 0,
                  engine: Any = None, allow_tf32: bool = False, math: str | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Gradient of the forward convolution with respect to its input (cuDNN backward data), which
    is also the transposed convolution (``conv_transpose{1,2,3}d(grad_y, w, None, stride, padding,
    output_padding, groups, dilation)`` when ``x_shape`` is None).

    ``grad_y``: (N, K, *out), NCHW or channels_last; ``w``: (K, C/groups, *kernel);
    ``x_shape``: the forward input's shape (N, C, *spatial), or None to derive it as
    conv_transpose does (``output_padding`` then adds to the trailing side). Returns dx in
    grad_y's layout. ``engine`` as in :func:`forward`. Wraps ``cudnnBackendExecute`` on an
    ``OPERATION_CONVOLUTION_BACKWARD_DATA`` graph."""
    if not isinstance(grad_y, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ArgumentTypeError("grad_y and w must be torch.Tensor")
    if w.dim() not in (3, 4, 5):
        raise ArgumentError(f"weight must be 3-D, 4-D or 5-D, got shape {tuple(w.shape)}")
    if x_shape is None:
        x_shape = _transpose_x_shape(grad_y, w, stride, padding, dilation, groups, output_padding)
    if _needs_grad(grad_y, w):   # as forward: rawconv.ops.conv_backward_data records autograd
        _graph_function = _grad_slot("cudnn_graph")
        return _graph_function("backward_data", grad_y, w, x_shape, stride, padding, dilation, groups,
                               engine=engine, allow_tf32=allow_tf32, math=math, out=out)
    if not isinstance(x_shape, (tuple, list, torch.Size)) or not all(isinstance(s, int) and s >= 0 for s in x_shape):
        raise ArgumentError(f"x_shape must be a tuple of non-negative ints, got {x_shape!r}")
    p = _problem(shape_only(x_shape, grad_y, "x_shape"), w, None, stride, padding, dilation, groups)
    lay = layout_of(grad_y if grad_y.dim() == p.ndim + 2 else grad_y.unsqueeze(0))
    if lay == "nhwc":
        p = p.with_(layout="nhwc")
    _check_tensor(p, grad_y, "grad_y", p.y_shape)
    plan = _plan(p, "backward_data", None, allows_tf32(allow_tf32, math), engine)
    return plan.execute(grad_y=grad_y, w=w, out=out)


def backward_filter(x: torch.Tensor, grad_y: torch.Tensor, w_shape: Sequence[int], stride: Any = 1,
                    padding: Any = 0, dilation: Any = 1, groups: int = 1, *, engine: Any = None,
                    allow_tf32: bool = False, math: str | None = None,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Gradient of the forward convolution with respect to its weights (cuDNN backward filter).

    ``x``: (N, C, *spatial); ``grad_y``: (N, K, *out), both in x's layout; ``w_shape``:
    (K, C/groups, *kernel). Returns dw in x's layout (channels_last for an NHWC x).
    ``engine`` as in :func:`forward`. Wraps ``cudnnBackendExecute`` on an
    ``OPERATION_CONVOLUTION_BACKWARD_FILTER`` graph."""
    if _needs_grad(x, grad_y):   # as forward: rawconv.ops.conv_backward_weights records autograd
        _graph_function = _grad_slot("cudnn_graph")
        return _graph_function("backward_weights", x, grad_y, w_shape, stride, padding, dilation, groups,
                               engine=engine, allow_tf32=allow_tf32, math=math, out=out)
    if not isinstance(x, torch.Tensor) or not isinstance(grad_y, torch.Tensor):
        raise ArgumentTypeError("x and grad_y must be torch.Tensor")
    if not isinstance(w_shape, (tuple, list, torch.Size)) or not all(isinstance(s, int) and s >= 0 for s in w_shape):
        raise ArgumentError(f"w_shape must be a tuple of non-negative ints, got {w_shape!r}")
    p = _problem(x, shape_only(w_shape, x, "w_shape"), None, stride, padding, dilation, groups)
    _check_tensor(p, grad_y, "grad_y", p.y_shape)
    plan = _plan(p, "backward_weights", None, allows_tf32(allow_tf32, math), engine)
    return plan.execute(x, grad_y=grad_y, out=out)


backward_weights = backward_filter   # rawconv's word (backward_filter is cuDNN's)


def cached_grad_plan(direction: str, a, b, shape, stride, padding, dilation, groups, engine, allow_tf32: bool = False,
                     math: str | None = None) -> "GraphConvolution":
    """The cached plan of a backward call, its arguments checked (as :func:`backward_data` /
    :func:`backward_filter` check them): ``direction`` ``"backward_data"`` (``a`` = grad_y, ``b``
    = w, ``shape`` = x_shape; the plan takes grad_y's layout) or ``"backward_weights"`` (``a`` =
    x, ``b`` = grad_y, ``shape`` = w_shape; x's layout). For the operators' CUDA kernels."""
    if direction == "backward_data":
        p = _problem(shape_only(shape, a, "x_shape"), b, None, stride, padding, dilation, groups)
        if layout_of(a if a.dim() == p.ndim + 2 else a.unsqueeze(0)) == "nhwc":
            p = p.with_(layout="nhwc")
        _check_tensor(p, a, "grad_y", p.y_shape)
    else:
        p = _problem(a, shape_only(shape, a, "w_shape"), None, stride, padding, dilation, groups)
        _check_tensor(p, b, "grad_y", p.y_shape)
    return _plan(p, direction, None, allows_tf32(allow_tf32, math), engine)


def _check_tensor(p: ConvProblem, t, name, shape):
    check_tensor(p, t, name, shape)
    if str(t.device) != p.device and torch.device(t.device) != torch.device(p.device):
        raise ArgumentError(f"{name} must be on {p.device}, got {t.device}")


def engines(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
            padding: Any = 0, dilation: Any = 1, groups: int = 1, *, direction: str = "forward",
            heuristic: str | Sequence[str] = "instant", limit: int | None = 16, activation: str | None = None,
            allow_tf32: bool = False, finalize: bool = True) -> list[EngineConfig]:
    """Every engine config cuDNN offers for the convolution (see :meth:`GraphConvolution.engines`).

    Arguments as in :func:`forward` (for ``direction="backward_data"`` / ``"backward_filter"``
    pass the forward problem's x and w: only their shapes, dtype, layout and device matter).
    ``heuristic``: ``"instant"``, ``"b"``, ``"fallback"``, a sequence of them, or ``"all"``
    (every engine index and its knob choices, up to ``limit`` per engine). Each
    :class:`EngineConfig` gives its name, heuristic modes, numerical and behavior notes,
    workspace bytes and whether it finalizes."""
    direction = _norm_direction(direction)
    problem = _problem(x, w, bias, stride, padding, dilation, groups)
    activation = check_activation(activation, direction, bias is not None)
    if direction != "forward":
        problem = problem.with_(has_bias=False)
    plan = _plan(problem, direction, activation, allow_tf32, None)
    return plan.engines(heuristic, limit=limit, finalize=finalize)


# every public entry point raises only rawconv's exception classes (rawconv._guard)
_guard.guard_module(globals(), "forward", "backward_data", "backward_filter", "engines", "tuning_cache",
                    "save_tuning_cache", "load_tuning_cache", where=FACE)
backward_weights = backward_filter   # rawconv's word (backward_filter is cuDNN's)
