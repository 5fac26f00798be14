"""The legacy API's function forms and caches (a part of :mod:`rawconv.cudnn`, the face, which hands
its names on): the plan caches (:func:`cached_plan`, :func:`cached_forward_plan`, :func:`clear_cache`),
:func:`forward`, :func:`backward_data`, :func:`backward_weights`, :func:`conv_transpose`,
:func:`algorithms`, :func:`candidates` and :func:`capabilities`. What a test patches on the face
(``grad_problem``, ``cached_plan``, ``backward_data``, ``backward_weights``) is set here
(:func:`rawconv.core.face.route_settings`), where these functions read it."""
from __future__ import annotations

import threading
from typing import Any, Sequence

import torch

from .. import _cuda, _ffi as _cudnn
from ...core import guard as _guard
from ...core.errors import ArgumentError, ArgumentTypeError, NotSupportedError
from ...core.plans import PlanCache, arg_key
from ...core.backend import canonical_direction
from ...core.grad import grad_function as _grad_slot, needs_grad as _needs_grad
from ...core.problem import ConvProblem, check_tensor, layout_of, shape_only, torch_names
from .common import Algorithm, _check_device, normalize_choice, weights_layout
from .plan import Convolution

FACE = "rawconv.cudnn"   # where this module's names live (rawconv.cudnn): messages

# ---------------------------------------------------------------------------- plan caches and functions
_cache = PlanCache(256)
_fast = PlanCache(256)


def cached_plan(problem: ConvProblem, direction: str, w_layout: str, algo, math, deterministic, workspace_limit,
                activation) -> Convolution:
    """The legacy-API plan for ``problem``, ``direction`` (weights in ``w_layout``), ``algo``,
    ``math`` type, ``deterministic``, ``workspace_limit`` (bytes) and ``activation``, from the plan
    cache or made. Raises as :class:`Convolution`."""
    key = (problem, direction, w_layout, algo, math, deterministic, workspace_limit, activation)
    plan = _cache.get(key)
    if plan is None:
        plan = Convolution.from_problem(problem, direction=direction, w_layout=w_layout, algo=algo, math=math,
                                        deterministic=deterministic, workspace_limit=workspace_limit,
                                        activation=activation)
        _cache.put(key, plan)
    return plan


def clear_cache() -> None:
    """Drop every cached plan (descriptors, chosen algos, workspaces) used by the function forms."""
    _cache.clear()
    _fast.clear()


def _graph(name: str):
    try:
        from .. import graph as cudnn_graph
    except ImportError as exc:
        raise NotSupportedError(f"the cuDNN graph API (rawconv.cudnn_graph) is not available: {exc}",
                                library="cuDNN") from None
    fn = getattr(cudnn_graph, name, None)
    if fn is None:
        raise NotSupportedError(f"rawconv.cudnn_graph has no {name}() (the graph API is not available for "
                                f"this direction yet)", library="cuDNN")
    return fn


def _fast_key(tag, *parts):
    """The function forms' fast-path key: ``(tag, *parts)`` when it hashes, else None. Callers pass
    the user's non-tensor arguments through :func:`rawconv._plans.arg_key` (1, 1.0 and True, a list
    and a tuple are told apart: a plan is never reused for an argument its checks would refuse)."""
    try:
        key = (tag,) + parts
        hash(key)
        return key
    except TypeError:
        return None


def _forward_key(x, w, bias, stride, padding, dilation, groups, algo, math, deterministic, workspace_limit,
                 activation):
    """:func:`forward`'s fast-path key (tensors' metadata and the arguments after :func:`normalize_choice`),
    or None when it does not hash. Raises AttributeError for an argument that is not a tensor."""
    return _fast_key("f", x.shape, x.stride(), x.dtype, x.device, w.shape, w.stride(), w.dtype, w.device,
                     None if bias is None else (bias.shape, bias.dtype, bias.device), arg_key(stride),
                     arg_key(padding), arg_key(dilation), arg_key(groups), arg_key(algo), arg_key(math),
                     arg_key(deterministic), arg_key(workspace_limit), arg_key(activation))


def cached_forward_plan(x, w, bias, stride, padding, dilation, groups, algo, math, deterministic, workspace_limit,
                        activation) -> Convolution:
    """The cached forward plan of :func:`forward`'s arguments (after :func:`normalize_choice`): found by
    :func:`_forward_key` (no validation, no heuristic query: the plan keeps its chosen algo), else
    built, validated and cached."""
    try:
        key = _forward_key(x, w, bias, stride, padding, dilation, groups, algo, math, deterministic, workspace_limit,
                           activation)
    except AttributeError:
        key = None
    plan = _fast.get(key) if key is not None else None
    if plan is None:
        problem = ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups)
        _check_device(problem)
        plan = cached_plan(problem, "forward", weights_layout(w, problem), algo, math, deterministic, workspace_limit, activation)
        if key is not None:
            _fast.put(key, plan)
    return plan


def forward(x: torch.Tensor = None, w: torch.Tensor = None, bias: torch.Tensor | None = None, stride: Any = 1,
            padding: Any = 0, dilation: Any = 1, groups: int = 1, *, algo: Any = None, math: str | None = None,
            deterministic: bool = False, workspace_limit: int | None = None, activation: str | None = None,
            out: torch.Tensor | None = None, engine: Any = None, return_info: bool = False, choice: Any = None,
            precision: str | None = None, input: torch.Tensor | None = None, weight: torch.Tensor | None = None):
    """cuDNN forward convolution with the semantics of ``torch.nn.functional.conv{1,2,3}d``.

    ``x``: (N, C, *spatial) or unbatched (C, *spatial), CUDA, float32 / float16 / bfloat16 / float64,
    NCHW or channels_last (taken as they are). ``w``: (K, C/groups, *kernel). ``bias``: (K,).
    ``padding``: int, tuple, ``"same"``/``"valid"`` or one ``(before, after)`` pair per dim.
    ``algo``: None (cuDNN's heuristic, ``cudnnGetConvolutionForwardAlgorithm_v7``), ``"fastest"``
    (measured by ``cudnnFindConvolutionForwardAlgorithmEx``, cached per problem), or a name
    (``"IMPLICIT_PRECOMP_GEMM"``, ``"WINOGRAD_NONFUSED"``, ...) or enum value forcing that algo.
    ``math``: ``"fma"`` (IEEE; default for fp32/fp64), ``"tensor_op"`` (default for fp16/bf16; TF32 for
    fp32), ``"tensor_op_allow_conversion"``, ``"default"`` (cuDNN's: TF32 for fp32 on Ampere+).
    ``deterministic``: only deterministic algos. ``workspace_limit``: bytes. ``activation``:
    ``"relu"``, ``"identity"``, ``"sigmoid"``, ``"tanh"``, ``"elu"``; with a bias, relu/identity run
    fused (``cudnnConvolutionBiasActivationForward``) when cuDNN allows, else unfused (RunInfo says).
    ``engine``: run through the graph API instead (:mod:`rawconv.cudnn_graph`). ``choice``:
    rawconv's word for what runs: an :class:`Algorithm` row or ``"ALGO@math"`` (legacy API), or a
    graph engine config name (``"eng28{k2=3}"``: graph API). ``precision``: rawconv's word for the
    math type (:mod:`rawconv.options`: ``"strict"`` = the dtype's default, ``"tf32"``,
    ``"bf16"``/``"f16"``, ``"any"``). Returns y (N, K, *out) in x's layout, or ``(y, RunInfo)``
    with ``return_info``.

    Raises :class:`ArgumentError` / :class:`ArgumentTypeError` for bad input (before any C call;
    CPU tensors are pointed to :mod:`rawconv.onednn`), :class:`NotSupportedError` for a forced
    algo cuDNN does not support here (naming those it does) or tensors past the int32 limit.
    Wraps ``cudnnConvolutionForward``. Tensors that require grad (grad mode on) run as
    :func:`rawconv.ops.conv` (autograd recorded; ``out``, ``return_info``, ``activation``,
    ``deterministic`` and ``workspace_limit`` are then refused with :class:`ArgumentError`).
    torch's names work too: ``input=`` / ``weight=`` (``F.conv2d``'s) for ``x`` / ``w``.
    """
    if x is None or w is None or input is not None or weight is not None:
        x, w = torch_names(x, w, input, weight, "rawconv.cudnn.forward")
    if _needs_grad(x, w, bias):   # record a differentiable op, never a silent detach
        _cudnn_function = _grad_slot("cudnn")
        return _cudnn_function("forward", x, w, bias, stride, padding, dilation, groups, algo=algo, math=math,
                               deterministic=deterministic, workspace_limit=workspace_limit, out=out, engine=engine,
                               return_info=return_info, choice=choice, precision=precision, activation=activation)
    algo, math, engine = normalize_choice("forward", algo, choice, math, precision, engine)
    if engine is not None:
        kw = {k: v for k, v in (("math", math), ("out", out), ("activation", activation)) if v is not None}
        return _graph("forward")(x, w, bias, stride, padding, dilation, groups, engine=engine, **kw)
    plan = cached_forward_plan(x, w, bias, stride, padding, dilation, groups, algo, math, deterministic, workspace_limit,
                               activation)
    return plan.execute(x, w, bias, out, return_info=return_info)



def _check_shape_arg(shape, name):
    if not isinstance(shape, (tuple, list, torch.Size)) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise ArgumentTypeError(f"{name} must be a tuple of non-negative ints, got {shape!r}")


def grad_problem(grad_y, w_or_x, shape, stride, padding, dilation, groups, direction) -> ConvProblem:
    """The forward problem of a backward call (``direction`` ``"backward_data"``: ``grad_y``, w,
    x's ``shape``; ``"backward_weights"``: ``grad_y``, x, w's ``shape``); raises
    :class:`ArgumentTypeError` / :class:`ArgumentError` for bad input, before any C call."""
    if not isinstance(grad_y, torch.Tensor) or not isinstance(w_or_x, torch.Tensor):
        raise ArgumentTypeError("grad_y and " + ("w" if direction == "backward_data" else "x")
                                + " must be torch.Tensor")
    if direction == "backward_data":
        _check_shape_arg(shape, "x_shape")
        problem = ConvProblem.from_torch(shape_only(shape, grad_y, "x_shape"), w_or_x, None, stride, padding,
                                         dilation, groups)
    else:
        _check_shape_arg(shape, "w_shape")
        problem = ConvProblem.from_torch(w_or_x, shape_only(shape, grad_y, "w_shape"), None, stride, padding,
                                         dilation, groups)
    if direction == "backward_data" and grad_y.dim() >= 3 and layout_of(grad_y) == "nhwc":
        problem = problem.with_(layout="nhwc")
    _check_device(problem)
    check_tensor(problem, grad_y, "grad_y", problem.y_shape)
    if grad_y.device != w_or_x.device:
        raise ArgumentError(f"grad_y must be on {w_or_x.device}, got {grad_y.device}")
    return problem


def backward_data(grad_y: torch.Tensor, w: torch.Tensor, x_shape: Sequence[int], stride: Any = 1,
                  padding: Any = 0, dilation: Any = 1, groups: int = 1, *, algo: Any = None,
                  math: str | None = None, deterministic: bool = False, workspace_limit: int | None = None,
                  out: torch.Tensor | None = None, engine: Any = None, return_info: bool = False,
                  choice: Any = None, precision: str | None = None):
    """Gradient of the forward convolution with respect to its input (``torch.nn.grad.conv2d_input``).

    ``grad_y``: (N, K, *out), CUDA, NCHW or channels_last; ``w``: (K, C/groups, *kernel);
    ``x_shape``: the forward input's shape (N, C, *spatial). Returns dx of ``x_shape`` in grad_y's
    layout (or ``(dx, RunInfo)``). ``algo``/``math``/``deterministic``/``workspace_limit`` as in
    :func:`forward`, with backward-data algo names (``"ALGO_0"``, ``"ALGO_1"``, ``"FFT"``,
    ``"FFT_TILING"``, ``"WINOGRAD"``, ``"WINOGRAD_NONFUSED"``). Raises as :func:`forward`.
    ``choice``/``precision`` as in :func:`forward`. Wraps ``cudnnConvolutionBackwardData``.
    Tensors that require grad run as :func:`rawconv.ops.conv_backward_data` (as :func:`forward` does).
    """
    if _needs_grad(grad_y, w):
        _cudnn_function = _grad_slot("cudnn")
        return _cudnn_function("backward_data", grad_y, w, x_shape, stride, padding, dilation, groups, algo=algo,
                               math=math, deterministic=deterministic, workspace_limit=workspace_limit, out=out,
                               engine=engine, return_info=return_info, choice=choice, precision=precision)
    algo, math, engine = normalize_choice("backward_data", algo, choice, math, precision, engine)
    if engine is not None:
        kw = {k: v for k, v in (("math", math), ("out", out)) if v is not None}
        return _graph("backward_data")(grad_y, w, x_shape, stride, padding, dilation, groups, engine=engine, **kw)
    try:
        key = _fast_key("d", grad_y.shape, grad_y.stride(), grad_y.dtype, grad_y.device, w.shape, w.stride(),
                        w.dtype, w.device, arg_key(tuple(x_shape)), arg_key(stride), arg_key(padding),
                        arg_key(dilation), arg_key(groups), arg_key(algo), arg_key(math), arg_key(deterministic),
                        arg_key(workspace_limit))
    except (AttributeError, TypeError):
        key = None
    plan = _fast.get(key) if key is not None else None
    if plan is None:
        problem = grad_problem(grad_y, w, x_shape, stride, padding, dilation, groups, "backward_data")
        plan = cached_plan(problem, "backward_data", weights_layout(w, problem), algo, math, deterministic, workspace_limit, None)
        if key is not None:
            _fast.put(key, plan)
    return plan.execute(grad_y=grad_y, w=w, out=out, return_info=return_info)


def backward_weights(x: torch.Tensor, grad_y: torch.Tensor, w_shape: Sequence[int], stride: Any = 1,
                     padding: Any = 0, dilation: Any = 1, groups: int = 1, *, algo: Any = None,
                     math: str | None = None, deterministic: bool = False, workspace_limit: int | None = None,
                     w_layout: str | None = None, out: torch.Tensor | None = None, engine: Any = None,
                     return_info: bool = False, choice: Any = None, precision: str | None = None):
    """Gradient of the forward convolution with respect to its weights (``torch.nn.grad.conv2d_weight``).

    ``x``: (N, C, *spatial), CUDA; ``grad_y``: (N, K, *out) in x's layout; ``w_shape``:
    (K, C/groups, *kernel). Returns dw (in ``w_layout``: "nchw" or "nhwc", default x's layout), or
    ``(dw, RunInfo)``. Algo names: ``"ALGO_0"``, ``"ALGO_1"``, ``"FFT"``, ``"ALGO_3"``,
    ``"WINOGRAD_NONFUSED"``, ``"FFT_TILING"``. Raises as :func:`forward`.
    ``choice``/``precision`` as in :func:`forward`. :func:`backward_filter` is cuDNN's name for it.
    Wraps ``cudnnConvolutionBackwardFilter``. Tensors that require grad run as
    :func:`rawconv.ops.conv_backward_weights` (as :func:`forward` does).
    """
    if _needs_grad(x, grad_y):
        _cudnn_function = _grad_slot("cudnn")
        return _cudnn_function("backward_weights", x, grad_y, w_shape, stride, padding, dilation, groups, algo=algo,
                               math=math, deterministic=deterministic, workspace_limit=workspace_limit, out=out,
                               engine=engine, return_info=return_info, choice=choice, precision=precision,
                               w_layout=w_layout)
    algo, math, engine = normalize_choice("backward_weights", algo, choice, math, precision, engine)
    if engine is not None:
        kw = {k: v for k, v in (("math", math), ("out", out)) if v is not None}
        return _graph("backward_weights")(x, grad_y, w_shape, stride, padding, dilation, groups, engine=engine, **kw)
    if w_layout is not None and w_layout not in ("nchw", "nhwc"):
        raise ArgumentError(f"w_layout must be 'nchw' or 'nhwc', got {w_layout!r}")
    try:
        key = _fast_key("w", x.shape, x.stride(), x.dtype, x.device, grad_y.shape, grad_y.stride(), grad_y.dtype,
                        grad_y.device, arg_key(tuple(w_shape)), arg_key(stride), arg_key(padding),
                        arg_key(dilation), arg_key(groups), arg_key(algo), arg_key(math), arg_key(deterministic),
                        arg_key(workspace_limit), arg_key(w_layout))
    except (AttributeError, TypeError):
        key = None
    plan = _fast.get(key) if key is not None else None
    if plan is None:
        problem = grad_problem(grad_y, x, w_shape, stride, padding, dilation, groups, "backward_weights")
        plan = cached_plan(problem, "backward_weights", w_layout or problem.layout, algo, math, deterministic,
                           workspace_limit, None)
        if key is not None:
            _fast.put(key, plan)
    return plan.execute(x, grad_y=grad_y, out=out, return_info=return_info)


backward_filter = backward_weights   # cuDNN's name


def conv_transpose(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
                   padding: Any = 0, output_padding: Any = 0, groups: int = 1, dilation: Any = 1, *,
                   algo: Any = None, math: str | None = None, deterministic: bool = False,
                   workspace_limit: int | None = None, out: torch.Tensor | None = None, return_info: bool = False):
    """Transposed convolution with the semantics (and argument order) of
    ``torch.nn.functional.conv_transpose{1,2,3}d``, run as cuDNN backward data.

    ``x``: (N, C_in, *spatial); ``w``: (C_in, C_out/groups, *kernel); ``bias``: (C_out,);
    ``output_padding`` < max(stride, dilation) per dim. Returns (N, C_out, *out) with
    ``out = (in - 1)*stride - 2*padding + dilation*(kernel - 1) + output_padding + 1``.
    Wraps ``cudnnConvolutionBackwardData``.
    """
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ArgumentTypeError("x and w must be torch.Tensor")
    if w.dim() not in (3, 4, 5):
        raise ArgumentError(f"weight must be 3-D, 4-D or 5-D (C_in, C_out/groups, *kernel), got {tuple(w.shape)}")
    nd = w.dim() - 2
    from ...core.problem import tuple_arg as _tuple

    s, p = _tuple(stride, nd, "stride", 1), _tuple(padding, nd, "padding", 0)
    d, op = _tuple(dilation, nd, "dilation", 1), _tuple(output_padding, nd, "output_padding", 0)
    if any(o >= max(si, di) for o, si, di in zip(op, s, d)):
        raise ArgumentError(f"output_padding {op} must be smaller than stride {s} or dilation {d} (as in torch)")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise ArgumentError(f"groups must be a positive int, got {groups!r}")
    unbatched = x.dim() == nd + 1
    xb = x.unsqueeze(0) if unbatched else x
    if xb.dim() != nd + 2:
        raise ArgumentError(f"input must be {nd + 2}-D (N, C_in, *spatial) or unbatched, got {tuple(x.shape)}")
    if xb.shape[1] != w.shape[0]:
        raise ArgumentError(f"input has {xb.shape[1]} channels but weight {tuple(w.shape)} expects {w.shape[0]}")
    outs = tuple((i - 1) * si - 2 * pi + di * (k - 1) + oi + 1
                 for i, si, pi, di, k, oi in zip(xb.shape[2:], s, p, d, w.shape[2:], op))
    if any(o <= 0 for o in outs):
        raise ArgumentError(f"transposed convolution output size {outs} is not positive")
    x_shape = (xb.shape[0], w.shape[1] * groups) + outs
    res = backward_data(xb, w, x_shape, s, p, d, groups, algo=algo, math=math, deterministic=deterministic,
                        workspace_limit=workspace_limit, out=out, return_info=return_info)
    y, info = res if return_info else (res, None)
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (x_shape[1],):
            raise ArgumentError(f"bias must be a tensor of shape ({x_shape[1]},)")
        y.add_(bias.view(1, -1, *([1] * nd)))
    if unbatched:
        y = y.squeeze(0)
    return (y, info) if return_info else y


def algorithms(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
               padding: Any = 0, dilation: Any = 1, groups: int = 1, *, direction: str = "forward",
               mode: str = "find", math: str | None = "all", deterministic: bool = False,
               workspace_limit: int | None = None) -> list[Algorithm]:
    """Every (algo, math type) row cuDNN reports for this convolution (:class:`Algorithm`: name,
    status, time in ms measured by Find, workspace bytes, determinism, math type).

    Arguments as in :func:`forward`; for ``direction="backward_data"`` / ``"backward_filter"`` pass
    the forward problem's x and w. ``mode``: ``"find"`` (``cudnnFind*AlgorithmEx``: runs and times
    each algo) or ``"heuristic"`` (``cudnnGet*Algorithm_v7``). ``math``: ``"all"`` (every math type
    set in turn, rows merged), one math type, or None (the dtype's default). ``workspace_limit``
    caps the workspace Find may use (bytes).
    """
    direction = canonical_direction(direction)
    problem = ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups)
    _check_device(problem)
    if problem.is_empty:
        return []
    plan = cached_plan(problem, direction, weights_layout(w, problem), None, None if math == "all" else math, deterministic,
                       workspace_limit, None)
    return plan.algorithms(mode, math)


def candidates(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
               padding: Any = 0, dilation: Any = 1, groups: int = 1, *, direction: str = "forward",
               mode: str = "find", math: str | None = "all", deterministic: bool = False,
               workspace_limit: int | None = None) -> list[Algorithm]:
    """rawconv's word for :func:`algorithms` (every backend has ``candidates``); the same rows."""
    return algorithms(x, w, bias, stride, padding, dilation, groups, direction=direction, mode=mode, math=math,
                      deterministic=deterministic, workspace_limit=workspace_limit)


# ---------------------------------------------------------------------------- capabilities
_CAPS: dict = {}
_CAPS_LOCK = threading.Lock()
# (dtype, fpmath key, math type set on the descriptor, layout of the probe)
_CAP_MODES = (("float32", "strict", "fma", "nchw"), ("float32", "tf32", "default", "nchw"),
              ("float16", "strict", "tensor_op", "nhwc"), ("bfloat16", "strict", "tensor_op", "nhwc"),
              ("float64", "strict", "fma", "nchw"))


def capabilities(refresh: bool = False, device: int | None = None):
    """What this cuDNN offers on this GPU, asked of cuDNN: a :class:`rawconv._capabilities.Capabilities`.

    For each direction ("forward", "backward_data", "backward_weights" = cuDNN's backward
    filter) and precision: float32 with ``CUDNN_FMA_MATH`` (IEEE, ``fpmath="strict"``), float32
    with ``CUDNN_DEFAULT_MATH`` (``fpmath="tf32"``: cuDNN may use TF32 tensor cores; counted as
    offered from compute capability 8.0), float16 and bfloat16 with ``CUDNN_TENSOR_OP_MATH``
    (NHWC), float64 with FMA math: the algos the legacy heuristic (``cudnnGet*Algorithm_v7``)
    reports with ``CUDNN_STATUS_SUCCESS`` for a tiny problem (batch 1, 16 -> 16 channels, 8x8,
    3x3, padding 1). Nothing runs on the GPU.

    ``device``: a CUDA device index (default: torch's current device, or 0). Cached per process
    and device (``refresh=True`` probes again). Raises
    :class:`~rawconv.errors.DeviceNotAvailableError` when torch sees no such GPU (before
    ``cudnnCreate``, which would fail with ``CUDNN_STATUS_NOT_INITIALIZED``), and
    :class:`~rawconv.errors.LibraryNotFoundError` when libcudnn cannot be loaded. Wraps
    ``cudnnCreate``, ``cudnnGetConvolution{Forward,BackwardData,BackwardFilter}Algorithm_v7``,
    ``cudnnGetVersion``.
    """
    from ...core.capabilities import Capabilities, CapabilityRow
    from ...core.errors import LibraryError

    if not isinstance(refresh, bool):
        raise ArgumentTypeError(f"refresh must be True or False, got {refresh!r}")
    if device is None:
        idx = torch.cuda.current_device() if torch.cuda.is_available() else 0
    elif isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ArgumentError(f"device must be a CUDA device index (int >= 0) or None, got {device!r}")
    else:
        idx = device
    caps = _CAPS.get(idx)
    if caps is not None and not refresh:
        return caps
    with _CAPS_LOCK:
        caps = _CAPS.get(idx)
        if caps is not None and not refresh:
            return caps
        _cudnn.lib()
        if not torch.cuda.is_available() or idx >= torch.cuda.device_count():
            from ...core.errors import DeviceNotAvailableError

            seen = ("no CUDA GPU" if not torch.cuda.is_available()
                    else f"{torch.cuda.device_count()} CUDA device(s)")
            raise DeviceNotAvailableError(f"rawconv.cudnn.capabilities: torch sees {seen} here, and cuDNN needs "
                                          f"one to answer (device {idx}; cudnnCreate would fail)")
        _cuda.handle_for(idx)
        cc = torch.cuda.get_device_capability(idx)
        platform = f"{torch.cuda.get_device_name(idx)} (compute capability {cc[0]}.{cc[1]})"
        rows = []
        for direction in ("forward", "backward_data", "backward_weights"):
            for dtype, key, math, layout in _CAP_MODES:
                problem = ConvProblem(n=1, c=16, k=16, in_spatial=(8, 8), kernel=(3, 3), pad_before=(1, 1),
                                      pad_after=(1, 1), dtype=dtype, layout=layout, device=f"cuda:{idx}")
                plan = Convolution.from_problem(problem, direction=direction, math=math)
                names, status = [], "ok"
                try:
                    names = list(dict.fromkeys(r.algo for r in plan.algorithms("heuristic", math) if r.ok))
                    if not names:
                        status = "no algo with CUDNN_STATUS_SUCCESS"
                except LibraryError as exc:
                    status = exc.status_name or type(exc).__name__
                finally:
                    plan.free()
                if key == "tf32" and cc[0] < 8 and names:
                    names, status = [], f"no TF32 tensor cores before compute capability 8.0 (this GPU: {cc[0]}.{cc[1]})"
                setting = f"math {math}" + (" (TF32 allowed)" if key == "tf32" else "")
                rows.append(CapabilityRow(direction, dtype, key, tuple(names), (), status, setting, None))
        caps = Capabilities("cuDNN", _cudnn.version()["version"], platform,
                            "n1 c16 k16 8x8 3x3 padding 1 (NCHW for float32/float64, NHWC for float16/bfloat16)",
                            tuple(rows))
        _CAPS[idx] = caps
    return caps


# every public entry point raises only rawconv's exception classes (rawconv._guard); internal calls
# (conv_transpose -> backward_data) go through the guard, as before the split
_guard.guard_module(globals(), "forward", "backward_data", "backward_weights", "conv_transpose", "algorithms",
                    "candidates", "capabilities", where=FACE)
backward_filter = backward_weights   # cuDNN's name
