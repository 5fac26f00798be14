"""oneDNN convolutions on torch CPU tensors: list every implementation, force one, time it.

Quick use::

    y = rawconv.onednn.forward(x, w, padding=1)                       # oneDNN's first choice
    for impl in rawconv.onednn.implementations(x, w, padding=1):       # all it offers
        print(impl)
    y = rawconv.onednn.forward(x, w, padding=1, impl="x64:gemm:jit")     # exactly that one (names depend
                                                                       # on the CPU; this one is everywhere)
    print(rawconv.onednn.capabilities())                               # dtypes/fpmath offered on this CPU

    with rawconv.onednn.Convolution(x, w, padding=1, prepack=True) as conv:   # a plan for one problem
        best = conv.autotune(iterations=20)                            # time every implementation
        y = conv.execute(x)                                            # on a snapshot of w, reordered once
    rawconv.onednn.flush_denormals(True)                               # FTZ/DAZ on every oneDNN thread

Terms are oneDNN's: a *primitive descriptor* per *implementation* (``impl``), *format tags*
(``any`` lets the implementation choose its blocked layout, which then costs *reorders*), a
user *scratchpad*, the *fpmath mode*.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Sequence

import torch

from . import _ffi as _dnnl
from ..core import guard as _guard, known_bad as _known_bad  # noqa: F401 - rawconv.onednn._known_bad, as before
from ..core.grad import grad_function as _grad_slot, needs_grad as _needs_grad
from ._ffi import ffi
from ..core.errors import ArgumentError, ArgumentTypeError, NotSupportedError
from ..core.backend import Candidate
from ..core import plans as _plans
from ..core.plans import PlanCache, PlanLifetime, arg_key
from ..core.results import Result, ResultTable
from ..core.problem import ConvProblem, check_tensor, int_arg, empty_like_layout, layout_of, shape_arg, to_layout, dense_strides, strides_match, shape_only, torch_names
from ..core.problem import backward_data_layout

log = logging.getLogger("rawconv.onednn")

__all__ = ["Implementation", "Convolution", "forward", "backward_data", "backward_weights",
           "implementations", "candidates", "info", "verbose", "clear_cache", "FPMATH_MODES", "ALGORITHMS",
           "capabilities", "flush_denormals", "reference_seconds", "SLOW_REFERENCE_SECONDS"]

from .primitive import FPMATH_MODES, ALGORITHMS, DTYPES, _ARGS, _ROLE_NAMES, Implementation, TimedImplementation, timing_lines, weights_layout, _weights_md, _weights_any_md, _ptr, _check_choice, check_fpmath, _check_algorithm, _words, _check_direction, _check_allow, _VERSION, library_version, _check_impl, _check_no_overlap, _check_out, _ambiguous, _backward_data_layout, _GUARD_BYTE, _Built, _INLINE_ELEMENTS, INLINE_FLOPS, _MAX_THREADS, _check_threads, plan_threads, _threads_text, _omp_threads, _SET_HANDLE, _SNAP_GENERATION, _PLAIN, _increment_version, _Hot, _GRAD_ROLES, _GradHot, _extent, _set_handle_int, _FPMATH_COMPUTE, key_options  # noqa: F401,E402 - handed on
from .plan import Convolution, _restride, _empty_result, MAX_TENSOR_ELEMENTS, _check_sizes, check_device, _REF_RATES, _REF_RATES_LOCK, _valid_pairs, _ref_features, _ref_calibration, _ref_time, _ref_model, reference_seconds, _warn_if_slow_reference  # noqa: F401,E402 - handed on



from . import plan as _plan_mod  # noqa: E402
from ..core.face import route_settings as _route_settings  # noqa: E402
# SLOW_REFERENCE_SECONDS set on this face (rawconv.onednn.SLOW_REFERENCE_SECONDS = 30) reaches rawconv.onednn.plan
_route_settings(__name__, {"SLOW_REFERENCE_SECONDS": _plan_mod})

# ---------------------------------------------------------------------------- plan cache and functions
_cache = PlanCache(256)


def cached_plan(problem: ConvProblem, direction: str, algorithm: str, fpmath: str, w_layout: str, impl: Any,
                allow_known_bad: bool = False) -> Convolution:
    """The plan the function forms and torch operators run for ``problem``, ``direction``,
    ``algorithm``, ``fpmath`` mode, weights layout and ``impl`` (a choice; None: oneDNN's first), from
    the plan cache (keyed with this thread, :func:`thread_ident`) or made (``prepack=False``; the
    weights reordered per call). Raises :class:`ArgumentError` / :class:`NotSupportedError` as
    :class:`Convolution` does."""
    _check_direction(direction)
    _check_algorithm(algorithm)
    check_fpmath(fpmath)
    impl = _check_impl(impl)
    _check_allow(allow_known_bad)
    key = (problem, direction, algorithm, fpmath, w_layout,
           impl if not isinstance(impl, Implementation) else (impl.name, impl.layouts, tuple(impl.formats.items())),
           allow_known_bad, thread_ident())
    plan = _cache.get(key)
    if plan is None:
        log.debug("plan cache miss: %s %s fpmath=%s choice=%s", direction, problem.describe(), fpmath, impl)
        plan = Convolution.from_problem(problem, direction=direction, algorithm=algorithm, fpmath=fpmath,
                                        w_layout=w_layout, impl=impl, prepack=False, allow_known_bad=allow_known_bad)
        _cache.put(key, plan)
    return plan


def clear_cache() -> None:
    """Drop every cached plan used by the function forms."""
    _cache.clear()
    _fast_plans.clear()
    _last_plans.clear()


def flush_primitive_cache() -> None:
    """Empty oneDNN's own primitive cache (its JIT-compiled primitives, up to its capacity, 1024 by
    default) when the library is loaded: its capacity set to 0, then back, never inside another
    thread's listing or primitive creation (:func:`_ffi.flush_primitive_cache`); a plan listed
    before it lists again before it creates its next primitive (``_ffi._CacheGuard``). Wraps
    ``dnnl_get_primitive_cache_capacity``, ``dnnl_set_primitive_cache_capacity``."""
    if _dnnl._state.get("loaded") is not None:
        _dnnl.flush_primitive_cache()


# clear_caches empties it also while other threads build plans (_ffi._CacheGuard says how)
_plans.register_clear("rawconv.onednn:oneDNN's primitive cache", _dnnl.clear_primitive_cache)


def forward(x: torch.Tensor = None, w: torch.Tensor = None, bias: torch.Tensor | None = None, stride: Any = 1,
            padding: Any = 0, dilation: Any = 1, groups: int = 1, *, impl: Any = None,
            algorithm: str = "direct", fpmath: str = "strict", out: torch.Tensor | None = None,
            allow_known_bad: bool = False, choice: Any = None, precision: str | None = None,
            options: Any = None, return_info: bool = False, input: torch.Tensor | None = None,
            weight: torch.Tensor | None = None):
    """oneDNN forward convolution with the semantics of ``torch.nn.functional.conv{1,2,3}d``.

    ``x``: (N, C, *spatial) or unbatched (C, *spatial), CPU, float32 / bfloat16 / float16 (where
    the CPU supports it), NCHW or channels_last (used in place). ``w``: (K, C/groups, *kernel).
    ``bias``: (K,). ``padding``: int, tuple, ``"same"``/``"valid"`` or one ``(before, after)``
    pair per spatial dim. ``impl``: None (oneDNN's first choice), an int position in
    :func:`implementations`, or a name such as ``"x64:gemm:jit"`` (names carry the ISA they need,
    e.g. ``"brgconv:avx512_core"`` only on AVX-512 CPUs: see :func:`implementations`). ``fpmath``: "strict",
    "bf16", "f16", "tf32", "any" (oneDNN fpmath mode). Returns y (N, K, *out) in torch's memory format (channels_last when x or w is).

    Raises :class:`ArgumentError` / :class:`ArgumentTypeError` for bad input (before any C call),
    :class:`NotSupportedError` when the forced implementation is not offered (naming those that
    are), :class:`~rawconv.errors.KnownBadError` when it is known bad for this problem
    (:mod:`rawconv.known_bad`; ``allow_known_bad=True`` runs it anyway). A first choice
    (``impl=None``) that is known bad is replaced by the next one, with a ``RuntimeWarning``.
    Wraps ``dnnl_convolution_forward_primitive_desc_create`` and ``dnnl_primitive_execute``.
    Tensors that require grad (grad mode on) run as :func:`rawconv.ops.conv` (autograd recorded).
    rawconv's words work too: ``choice`` (= ``impl``: a position, a name or ``"name@layouts"``, an
    :class:`Implementation`), ``precision`` (= ``fpmath``), ``options`` (:class:`rawconv.Options`).
    torch's names work too: ``input=`` / ``weight=`` (``F.conv2d``'s) for ``x`` / ``w``.
    ``return_info=True`` returns ``(y, Implementation)``: the implementation that ran (name,
    layouts, formats, reorders, scratchpad), as :func:`rawconv.cudnn.forward` returns its ``RunInfo``.
    """
    try:   # rawconv._guard.public's translation, inline (one frame less on the hot path)
        if x is None or w is None or input is not None or weight is not None:
            x, w = torch_names(x, w, input, weight, "rawconv.onednn.forward")
        if return_info is not False:
            return _forward_info(x, w, bias, stride, padding, dilation, groups, impl, algorithm, fpmath, out,
                                 allow_known_bad, choice, precision, options, return_info)
        if choice is not None or precision is not None or options is not None:
            impl, fpmath, allow_known_bad = _words(impl, choice, fpmath, precision, options, allow_known_bad)
        if _needs_grad(x, w, bias):   # record a differentiable op, never a silent detach
            _onednn_function = _grad_slot("onednn")
            return _onednn_function("forward", x, w, bias, stride, padding, dilation, groups, impl=impl,
                                    algorithm=algorithm, fpmath=fpmath, out=out, allow_known_bad=allow_known_bad)
        try:   # hot path: the plan of the last call with these arguments, when the tensors fit it exactly
            akey = (w.shape, stride if type(stride) is int else _key(stride),
                    padding if type(padding) is int else _key(padding), dilation if type(dilation) is int else _key(dilation),
                    groups if type(groups) is int else _key(groups), impl if impl is None or type(impl) is int else _key(impl),
                    algorithm if type(algorithm) is str else _key(algorithm), fpmath if type(fpmath) is str else _key(fpmath),
                    allow_known_bad if type(allow_known_bad) is bool else _key(allow_known_bad), thread_ident())
            plan = _last_plans.get(akey)
        except Exception:   # noqa: BLE001  (not tensors, unhashable options...: the paths below say what is wrong)
            akey = plan = None
        if plan is not None:
            y = plan._hot_run(x, w, bias, out)
            if y is not None:
                return y
        try:   # fast path: the same call signature as an earlier call reuses its plan without re-validation
            # the key tells the argument types apart (True == 1 == 1.0 in Python): a key matches only
            # arguments of the same types as a call that passed validation
            key = (x.shape, x.stride(), x.dtype, x.device, w.shape, w.stride(), w.dtype, w.device, bias is None,
                   stride if type(stride) is int else _key(stride), padding if type(padding) is int else _key(padding),
                   dilation if type(dilation) is int else _key(dilation), groups if type(groups) is int else _key(groups),
                   impl if impl is None or type(impl) is int else _key(impl),
                   algorithm if type(algorithm) is str else _key(algorithm),
                   fpmath if type(fpmath) is str else _key(fpmath), _key(allow_known_bad), thread_ident())
            plan = _fast_plans.get(key)
        except Exception:   # noqa: BLE001  (not tensors, unhashable options...: the slow path says what is wrong)
            key = plan = None
        if plan is None or plan._freed:
            problem = ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups)
            check_device(problem)
            plan = cached_plan(problem, "forward", algorithm, fpmath, weights_layout(w), impl, allow_known_bad)
            if key is not None:
                _fast_plans.put(key, plan)
        elif bias is not None and not _bias_fits(bias, x, plan.problem.k):
            ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups)   # raises the clear error
        y = plan.execute(x, w, bias, out)
        if akey is not None:
            _last_plans.put(akey, plan)
        return y
    except Exception as exc:
        new = _guard.translate(exc, "rawconv.onednn.forward")
        if new is None:
            raise
        raise new from exc


forward.__rawconv_public__ = True


def _forward_info(x, w, bias, stride, padding, dilation, groups, impl, algorithm, fpmath, out, allow_known_bad,
                  choice, precision, options, return_info) -> tuple:
    """:func:`forward` with ``return_info``: ``(y, Implementation)``, the implementation its plan
    selected (the same selection the call runs: oneDNN's first choice, or ``impl``)."""
    if not isinstance(return_info, bool):
        raise ArgumentTypeError(f"return_info must be True or False, got {return_info!r}")
    if choice is not None or precision is not None or options is not None:
        impl, fpmath, allow_known_bad = _words(impl, choice, fpmath, precision, options, allow_known_bad)
    problem = ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups)
    check_device(problem)
    plan = cached_plan(problem, "forward", algorithm, fpmath, weights_layout(w), impl, allow_known_bad)
    if _needs_grad(x, w, bias):   # recorded by the operator, which selects the same way
        y = forward(x, w, bias, stride, padding, dilation, groups, impl=impl, algorithm=algorithm, fpmath=fpmath,
                    out=out, allow_known_bad=allow_known_bad)
    else:
        y = plan.execute(x, w, bias, out)
    return y, plan.selected

_get_num_threads = torch.get_num_threads


def thread_ident():
    """The cache keys' thread part: (this Python thread, its OpenMP thread count). Plans are not
    thread-safe, and a ``threads=None`` plan runs on at most the count it listed its
    implementations under, so a call after ``torch.set_num_threads`` raised the count gets a new
    plan rather than the old, capped one."""
    return (threading.get_ident(), _get_num_threads())
_fast_plans = PlanCache(256)
_last_plans = PlanCache(256)    # arguments (no tensors) -> the plan of the last call with them


_key = arg_key


def _bias_fits(bias, x, k: int) -> bool:
    try:
        return (isinstance(bias, torch.Tensor) and bias.dtype == x.dtype and bias.device == x.device
                and not bias.is_nested and bias.shape == (k,))
    except Exception:   # noqa: BLE001
        return False


def implementations(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
                    padding: Any = 0, dilation: Any = 1, groups: int = 1, *, direction: str = "forward",
                    algorithm: str = "direct", fpmath: str = "strict", isolate: Any = False,
                    allow_known_bad: bool = False, precision: str | None = None) -> ResultTable:
    """Every implementation oneDNN offers for this convolution, in oneDNN's order, without duplicates
    (a :class:`rawconv.results.ResultTable` of :class:`Implementation` rows).

    Arguments as in :func:`forward` (for ``direction="backward_data"``/``"backward_weights"`` pass
    the forward problem's x and w). Each :class:`Implementation` gives its name, the layouts it
    wants, the reorders it implies, its scratchpad bytes, and ``known_bad`` (the issue link) for
    one :mod:`rawconv.known_bad` lists for this problem. Wraps ``dnnl_primitive_desc_next_impl``.

    ``isolate=True`` (or an :class:`rawconv._isolate.Isolation` / a dict: ``timeout_s``
    (default 60), ``env`` (extra environment for the child), ``threads``) lists them in a child
    process and runs each once there on these tensors (backward directions: a seeded random
    grad_y), checked against float64 here: each row's ``status`` is ``"ok"``, ``"wrong"``,
    ``"crashed: SIGSEGV"`` (any signal), ``"timed out after 60 s"``, ``"not supported"``,
    ``"known bad"`` (not run unless ``allow_known_bad=True``) or ``"failed"``, with ``detail``.
    This process survives whatever the library does there.

    The memory layout is the forward's (torch's rule: channels last when x or w is, see
    :func:`rawconv.problem.conv_layout`). For ``"backward_data"`` it is the layout
    :func:`backward_data` takes for a grad_y in that layout (channels last when grad_y or w is;
    a grad_y whose shape cannot tell NCHW from NHWC, one output channel or a 1x1 output with
    batch 1, counts as NCHW, as in torch). The positions and the :class:`Implementation` objects
    of this list select the same implementations there.
    """
    from ..core.backend import canonical_direction

    if isinstance(direction, str):
        direction = canonical_direction(direction)
    _check_direction(direction)
    _check_allow(allow_known_bad)
    if precision is not None:
        _, fpmath, _ = _words(None, None, fpmath, precision, None, False)
    from ..core import isolate as _isolate
    from . import isolated as _isolated

    iso = _isolate.options(isolate)
    problem = ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups)
    check_device(problem)
    if direction == "backward_data":
        lay = _backward_data_layout(problem.layout, problem, w)
        if lay != problem.layout:
            problem = problem.with_(layout=lay)
    if iso is None:
        return cached_plan(problem, direction, algorithm, fpmath, weights_layout(w), None).implementations
    _check_algorithm(algorithm)
    check_fpmath(fpmath)
    wl = weights_layout(w) if direction != "backward_weights" else "nchw"
    xx = x.unsqueeze(0) if problem.unbatched and x.dim() == problem.ndim + 1 else x
    rows = _isolated.run_onednn_candidates(problem, xx, w, bias, direction=direction, iterations=1, warmup=0,
                                          timeout_s=iso.timeout_s, env=iso.env, threads=iso.threads,
                                          fpmath=fpmath, algorithm=algorithm, allow_known_bad=allow_known_bad,
                                          w_layout=wl)
    import dataclasses

    return ResultTable([dataclasses.replace(r["implementation"], status=r["status"], detail=r["detail"]) for r in rows],
                       title=f"oneDNN implementations (run isolated): {direction} {problem}")


def candidates(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
               padding: Any = 0, dilation: Any = 1, groups: int = 1, *, direction: str = "forward",
               precision: str | None = None, **kw) -> ResultTable:
    """rawconv's word for :func:`implementations` (every backend has ``candidates``): the same rows,
    each an :class:`Implementation` whose ``choice`` (``"name@layouts"``) ``forward(choice=...)``
    takes."""
    return implementations(x, w, bias, stride, padding, dilation, groups, direction=direction,
                           precision=precision, **kw)


def backward_data(grad_y: torch.Tensor, w: torch.Tensor, x_shape: Sequence[int], stride: Any = 1,
                  padding: Any = 0, dilation: Any = 1, groups: int = 1, *, impl: Any = None,
                  algorithm: str = "direct", fpmath: str = "strict", out: torch.Tensor | None = None,
                  allow_known_bad: bool = False, choice: Any = None, precision: str | None = None,
                  options: Any = None) -> torch.Tensor:
    """Gradient of the forward convolution with respect to its input (oneDNN backward data).

    ``grad_y``: (N, K, *out) in NCHW or channels_last; ``w``: (K, C/groups, *kernel);
    ``x_shape``: the forward input's shape (N, C, *spatial) or unbatched (C, *spatial). Returns
    dx of ``x_shape`` in grad_y's memory format (w's when grad_y's shape cannot tell: one channel,
    or a 1x1 output with batch 1), or ``out``. Same ``impl`` selection as :func:`forward`; the
    positions are those :func:`implementations` lists with ``direction="backward_data"`` for an x
    in grad_y's layout. Known-bad implementations as in :func:`forward` (``allow_known_bad``).
    Wraps ``dnnl_convolution_backward_data_primitive_desc_create`` (with a forward hint).
    Tensors that require grad run as :func:`rawconv.ops.conv_backward_data`. ``choice`` /
    ``precision`` / ``options`` as in :func:`forward`.
    """
    if choice is not None or precision is not None or options is not None:
        impl, fpmath, allow_known_bad = _words(impl, choice, fpmath, precision, options, allow_known_bad)
    if _needs_grad(grad_y, w):
        _onednn_function = _grad_slot("onednn")
        return _onednn_function("backward_data", grad_y, w, x_shape, stride, padding, dilation, groups, impl=impl,
                                algorithm=algorithm, fpmath=fpmath, out=out, allow_known_bad=allow_known_bad)
    problem = backward_data_problem(grad_y, w, x_shape, stride, padding, dilation, groups, False)
    plan = cached_plan(problem, "backward_data", algorithm, fpmath, weights_layout(w), impl, allow_known_bad)
    return plan.execute(grad_y=grad_y, w=w, out=out)


def backward_weights(x: torch.Tensor, grad_y: torch.Tensor, w_shape: Sequence[int], stride: Any = 1,
                     padding: Any = 0, dilation: Any = 1, groups: int = 1, *, bias: bool = False,
                     impl: Any = None, algorithm: str = "direct", fpmath: str = "strict",
                     allow_known_bad: bool = False, choice: Any = None, precision: str | None = None,
                     options: Any = None):
    """Gradient of the forward convolution with respect to its weights (and bias).

    ``x``: (N, C, *spatial); ``grad_y``: (N, K, *out); ``w_shape``: (K, C/groups, *kernel).
    Returns dw (contiguous), or ``(dw, db)`` with ``bias=True``. Same ``impl`` selection as
    :func:`forward`, known-bad implementations included: ``jit_1x1:*`` on a channels_last x
    with stride > 1 and few input channels is oneDNN issue #6035 (:mod:`rawconv.known_bad`)
    and raises :class:`~rawconv.errors.KnownBadError` unless ``allow_known_bad=True``.
    Wraps ``dnnl_convolution_backward_weights_primitive_desc_create``.
    Tensors that require grad run as :func:`rawconv.ops.conv_backward_weights`. ``choice`` /
    ``precision`` / ``options`` as in :func:`forward`.
    """
    if choice is not None or precision is not None or options is not None:
        impl, fpmath, allow_known_bad = _words(impl, choice, fpmath, precision, options, allow_known_bad)
    if _needs_grad(x, grad_y):
        _onednn_function = _grad_slot("onednn")
        return _onednn_function("backward_weights", x, grad_y, w_shape, stride, padding, dilation, groups,
                                impl=impl, algorithm=algorithm, fpmath=fpmath, bias=bias,
                                allow_known_bad=allow_known_bad)
    if not isinstance(w_shape, (tuple, list, torch.Size)):
        raise ArgumentTypeError(f"w_shape must be a tuple of ints, got {type(w_shape).__name__}")
    if not isinstance(x, torch.Tensor) or not isinstance(grad_y, torch.Tensor):
        raise ArgumentTypeError("x and grad_y must be torch.Tensor")
    if not isinstance(bias, bool):
        raise ArgumentTypeError(f"bias must be True or False (whether to return db), got {type(bias).__name__}")
    w_shape = shape_arg(w_shape, "w_shape", (3, 4, 5))
    if grad_y.is_nested or grad_y.layout != torch.strided:
        raise ArgumentError("grad_y must be a dense (strided) tensor")
    if grad_y.dtype != x.dtype:
        raise ArgumentError(f"grad_y must have x's dtype {x.dtype}, got {grad_y.dtype}")
    fake_b = shape_only((w_shape[0],), x) if bias else None
    problem = ConvProblem.from_torch(x, shape_only(w_shape, x, "w_shape"), fake_b, stride, padding, dilation, groups)
    check_device(problem)
    _check_grad(problem, grad_y, "grad_y", problem.y_shape)
    plan = cached_plan(problem, "backward_weights", algorithm, fpmath, "nchw", impl, allow_known_bad)
    return plan.execute(x, grad_y=grad_y)



def _check_grad(problem: ConvProblem, t, name, shape):
    check_tensor(problem, t, name, shape)
    if t.device.type != "cpu":
        raise ArgumentError(f"{name} must be on the CPU, got {t.device}")


def backward_data_problem(grad_y, w, x_shape, stride, padding, dilation, groups, has_bias) -> ConvProblem:
    """The forward problem of a backward-data call (``grad_y``, ``w``, ``x_shape`` and torch's
    arguments), its layout dx's (torch's rule: channels last when grad_y or w is); raises
    :class:`ArgumentTypeError` / :class:`ArgumentError` for bad input, before any C call."""
    if not isinstance(x_shape, (tuple, list, torch.Size)):
        raise ArgumentTypeError(f"x_shape must be a tuple of ints, got {type(x_shape).__name__}")
    if not isinstance(grad_y, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ArgumentTypeError("grad_y and w must be torch.Tensor")
    for t, nm in ((grad_y, "grad_y"), (w, "w")):
        if t.is_nested or t.layout != torch.strided:
            raise ArgumentError(f"{nm} must be a dense (strided) tensor")
    x_shape = shape_arg(x_shape, "x_shape", (w.dim() - 1, w.dim()))
    if grad_y.dtype != w.dtype:
        raise ArgumentError(f"grad_y and w must have the same dtype, got {grad_y.dtype} and {w.dtype}")
    if grad_y.device != w.device:
        raise ArgumentError(f"grad_y and w must be on the same device, got {grad_y.device} and {w.device}")
    fake_x = shape_only(x_shape, grad_y, "x_shape")
    problem = ConvProblem.from_torch(fake_x, w, None, stride, padding, dilation, groups)
    check_device(problem)
    gy = grad_y.unsqueeze(0) if problem.unbatched and grad_y.dim() == problem.ndim + 1 else grad_y
    lay = _backward_data_layout(gy, problem, w)
    if lay != problem.layout:
        problem = problem.with_(layout=lay)
    _check_grad(problem, grad_y, "grad_y", problem.y_shape)
    return problem


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else ``platform.processor()``, else ``"cpu"``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return " ".join(line.split(":", 1)[1].split()) or "cpu"
    except OSError:
        pass
    import platform

    return platform.processor() or "cpu"


def environment() -> dict:
    """The library and device a oneDNN tuning key records: ``{"library": "oneDNN",
    "library_version": "3.2.0", "device": the CPU model, "device_arch": oneDNN's effective ISA}``
    (loads the library). Wraps ``dnnl_version``, ``dnnl_get_effective_cpu_isa``."""
    return {"library": "oneDNN", "library_version": library_version(), "device": cpu_model(),
            "device_arch": _dnnl.effective_cpu_isa()}


from ..core import tuning as _tuning  # noqa: E402

_tuning.register_environment("onednn", environment)


# ---------------------------------------------------------------------------- info
def info() -> dict:
    """What oneDNN rawconv loaded: version, commit, path, how it was found, CPU ISA, threads,
    primitive cache capacity. Loads the library. Wraps ``dnnl_version``, ``dnnl_get_effective_cpu_isa``."""
    loaded = _dnnl.load()
    out = dict(_dnnl.version())
    out.update({"path": loaded.path, "found_via": loaded.found_via, "cpu_isa": _dnnl.effective_cpu_isa(),
                "threads": torch.get_num_threads(), "primitive_cache_capacity": _dnnl.primitive_cache_capacity()})
    return out


def verbose(level: int = 1) -> None:
    """oneDNN's verbose mode (0 off, 1 exec, 2 also creation); printed on the C stdout. Wraps ``dnnl_set_verbose``.
    Raises :class:`ArgumentTypeError` / :class:`ArgumentError` for a level that is not 0, 1 or 2."""
    lv = int_arg(level)
    if lv is None:
        raise ArgumentTypeError(f"verbose level must be an int (0, 1 or 2), got {type(level).__name__}")
    if not 0 <= lv <= 2:
        raise ArgumentError(f"verbose level must be 0, 1 or 2, got {level!r}")
    _dnnl.set_verbose(lv)



# ---------------------------------------------------------------------------- denormals
def flush_denormals(on: bool = True) -> None:
    """Flush subnormal (denormal) floats to zero in oneDNN's computations, or stop doing so.

    oneDNN's kernels follow the MXCSR register of the thread they run on: FTZ (subnormal results
    become 0) and DAZ (subnormal inputs read as 0). ``torch.set_flush_denormal(True)`` sets both
    on the calling thread only, so oneDNN's OpenMP worker threads keep computing with subnormals
    and a call's outputs come out partly flushed (the master thread's share). This sets FTZ and
    DAZ on (``on=True``) or off on EVERY thread of the calling thread's OpenMP team, master
    included, by running glibc's ``fesetenv`` in one OpenMP parallel region of the runtime
    libdnnl uses (threads created later copy the master's setting). It also sets the default
    rounding (to nearest) and exception masks, as every thread has them by default. Calls made
    from another Python thread use that thread's own OpenMP team: call this there too. The
    setting is per process and lasts until changed (``flush_denormals(False)``); it also
    applies to torch's own CPU operators on those threads (one OpenMP runtime).

    Raises :class:`ArgumentTypeError` when ``on`` is not a bool, :class:`NotSupportedError` off
    x86-64 or when the loaded oneDNN does not run on GNU OpenMP (TBB, threadpool, sequential
    builds), :class:`~rawconv.errors.LibraryNotFoundError` when oneDNN cannot be loaded. Wraps
    ``GOMP_parallel`` (the OpenMP runtime libdnnl resolved) and glibc's ``fesetenv``.
    """
    if not isinstance(on, bool):
        raise ArgumentTypeError(f"on must be True or False, got {on!r}")
    from . import fpenv as _fpenv

    loaded = _dnnl.load()
    runtime = _dnnl.version().get("cpu_runtime", "")
    if "OpenMP" not in str(runtime) and "omp" not in str(runtime).lower():
        raise NotSupportedError(f"flush_denormals sets the FP environment of oneDNN's OpenMP threads; this oneDNN "
                                f"runs on {runtime}")
    _fpenv.set_flush(loaded.path, on, torch.get_num_threads())


# ---------------------------------------------------------------------------- capabilities
_CAPS: dict = {}
_CAPS_LOCK = threading.Lock()
# the tiny problem every capability is probed on; no padding, so that every output of the
# down-conversion probe sums whole kernels
CAPABILITY_PROBE = ConvProblem(n=1, c=16, k=16, in_spatial=(6, 6), kernel=(3, 3), dtype="float32", layout="nchw")
# every element of the down-conversion probe's inputs: exact in float32, rounded to 1.0 in
# bfloat16 (8 significant bits), float16 and TF32 (11 each)
_PROBE_VALUE = 1.0 + 2.0 ** -12


def capabilities(refresh: bool = False):
    """What this oneDNN offers on this CPU, asked of oneDNN: a :class:`rawconv._capabilities.Capabilities`.

    For each direction ("forward", "backward_data", "backward_weights") and dtype ("float32",
    "bfloat16", "float16"), and for float32 each fpmath mode ("strict", "bf16", "f16", "tf32",
    "any"): the implementations oneDNN lists for the tiny problem :data:`CAPABILITY_PROBE`
    (primitive descriptors only, as :attr:`Convolution.implementations` lists them), split into
    non-reference ones and ``ref:any``, or the status when it lists nothing
    (``dnnl_unimplemented``: e.g. bfloat16 and float16 on a CPU without AVX-512).

    fpmath modes on float32 are also run: oneDNN 3.2 accepts ``fpmath="bf16"`` on every CPU but
    only some implementations honour it (``brgconv:avx512_core_amx`` on AMX CPUs); the others
    compute in float32 as if it were ``"strict"``, with the same names. So each listed
    non-reference implementation runs the probe on inputs of 1 + 2**-12 (exact in float32,
    1.0 after rounding to bf16, f16 or TF32) and is recorded in ``down_converts`` when its
    result is the rounded inputs' one. On a CPU with AVX-512 (no AMX) and on AVX2, every
    mode's list equals strict's and none down-converts.

    Cached per process (``refresh=True`` probes again); the first call takes about a second.
    Raises :class:`~rawconv.errors.LibraryNotFoundError` when oneDNN cannot be loaded. Wraps
    ``dnnl_convolution_*_primitive_desc_create``, ``dnnl_primitive_desc_next_impl``,
    ``dnnl_get_effective_cpu_isa``, ``dnnl_version`` and, for the fpmath probe,
    ``dnnl_primitive_execute``.
    """
    if not isinstance(refresh, bool):
        raise ArgumentTypeError(f"refresh must be True or False, got {refresh!r}")
    caps = _CAPS.get("caps")
    if caps is None or refresh:
        with _CAPS_LOCK:
            caps = _CAPS.get("caps")
            if caps is None or refresh:
                caps = _probe_capabilities()
                _CAPS["caps"] = caps
    return caps


def _probe_capabilities():
    from ..core.capabilities import DIRECTIONS as CAP_DIRECTIONS, Capabilities, CapabilityRow
    from ..core.errors import LibraryError

    _dnnl.load()
    rows = []
    for direction in CAP_DIRECTIONS:
        for dtype in DTYPES:
            modes = list(FPMATH_MODES) if dtype == "float32" else ["strict"]
            for fm in modes:
                plan = Convolution.from_problem(CAPABILITY_PROBE.with_(dtype=dtype), direction=direction,
                                                fpmath=fm, prepack=False)
                names, status, down = [], "ok", None
                try:
                    impls = plan.implementations
                    names = list(dict.fromkeys(i.name for i in impls))
                    if dtype == "float32" and fm != "strict":
                        down = tuple(n for n in names if not n.startswith("ref") and _rounds_inputs(plan, n))
                except LibraryError as exc:   # NotSupportedError (dnnl_unimplemented) included
                    status = exc.status_name or type(exc).__name__
                finally:
                    plan.free()
                rows.append(CapabilityRow(
                    direction, dtype, fm, tuple(n for n in names if not n.startswith("ref")),
                    tuple(n for n in names if n.startswith("ref")), status,
                    f"fpmath {fm}" if fm != "strict" else "", down))
    v = _dnnl.version()
    return Capabilities("oneDNN", v["version"], _dnnl.effective_cpu_isa(),
                        f"{CAPABILITY_PROBE.describe()}", tuple(rows))


def _rounds_inputs(plan: Convolution, name: str) -> bool:
    """Run implementation ``name`` of ``plan`` (float32, a reduced-precision fpmath mode) on
    inputs of :data:`_PROBE_VALUE` and say whether the result is the one of inputs rounded to
    1.0 (each output is ``count * v * v`` exactly, ``count`` if inputs were rounded)."""
    import torch.nn.functional as F

    p = plan.problem
    plan.select(name)
    v = _PROBE_VALUE
    if plan.direction == "forward":
        y = plan.execute(torch.full(p.x_shape, v), torch.full(p.w_shape, v))
        count = F.conv2d(torch.ones(p.x_shape, dtype=torch.float64), torch.ones(p.w_shape, dtype=torch.float64))
    elif plan.direction == "backward_data":
        y = plan.execute(grad_y=torch.full(p.y_shape, v), w=torch.full(p.w_shape, v))
        count = torch.nn.grad.conv2d_input(p.x_shape, torch.ones(p.w_shape, dtype=torch.float64),
                                           torch.ones(p.y_shape, dtype=torch.float64))
    else:
        y = plan.execute(torch.full(p.x_shape, v), grad_y=torch.full(p.y_shape, v))
        count = torch.nn.grad.conv2d_weight(torch.ones(p.x_shape, dtype=torch.float64), p.w_shape,
                                            torch.ones(p.y_shape, dtype=torch.float64))
    per_product = y.double() / count
    # exact: v * v = 1 + 2**-11 + 2**-24 per product; rounded inputs: 1. A quarter of the gap decides.
    return bool((per_product - v * v).abs().max() > (v * v - 1.0) / 4)


# ---------------------------------------------------------------------------- the registry
def _registry_candidates(problem: ConvProblem, direction: str = "forward", options: Any = None) -> ResultTable:
    impl, fpmath, allow = _words(None, None, "strict", None, options, False)
    return Convolution.from_problem(problem, direction=direction, fpmath=fpmath, prepack=False,
                                    allow_known_bad=allow).implementations


def _registry_plan(problem: ConvProblem, direction: str = "forward", options: Any = None, choice: Any = None,
                   threads: Any = "auto"):
    return Convolution.from_problem(problem, direction=direction, choice=choice, options=options, prepack=False,
                                    threads=threads)


def _replay_threads(recorded) -> Any:
    """The ``threads`` a replayed plan gets for a tuning key's recorded count: that count (the
    plan ran on it when it was tuned), or ``"auto"`` when the key holds none or this libdnnl is
    not an OpenMP build (its count cannot be set per plan)."""
    if isinstance(recorded, bool) or not isinstance(recorded, int) or not 1 <= recorded <= _MAX_THREADS:
        return "auto"
    return recorded if _dnnl.omp_thread_controls() is not None else "auto"


def _registry_replay(key, problem: ConvProblem, choice: Any, options: dict):
    """A tuning record's plan (rawconv.tuning.replay): on the OpenMP count the plan ran on when it
    was tuned (the key's ``threads``), and with its post-ops (a :class:`rawconv.fused.FusedConvolution`:
    bias, residual add ``sum``, activation) when it had some."""
    from ..core.tuning import json_form

    opts = json_form(key.options)
    threads = _replay_threads(opts.get("threads"))
    post_ops = opts.get("post_ops")
    if post_ops:
        from .fused import FusedConvolution, activation_of_post_ops

        kinds = [op[0] for op in post_ops]
        act = activation_of_post_ops(post_ops)
        return FusedConvolution.for_problem(problem, residual="sum" in kinds, activation=act, impl=choice,
                                            fpmath=opts.get("fpmath") or "strict",
                                            w_layout=opts.get("weights_layout") or "nchw", prepack=False,
                                            threads=threads)
    return _registry_plan(problem, key.direction, options, choice, threads=threads)


# every public entry point raises only rawconv's exception classes (rawconv._guard)
_guard.guard_module(globals(), "forward", "backward_data", "backward_weights", "implementations", "candidates",
                    "info", "verbose", "reference_seconds", "capabilities", "flush_denormals", "Convolution.__init__",
                    "Convolution.from_problem", "Convolution.execute", "Convolution.__call__", "Convolution.repack",
                    "Convolution.candidates")

from ..core.backend import Backend as _Backend, register as _register  # noqa: E402

_register(_Backend("onednn", "cpu", __name__, "oneDNN", _registry_candidates, _registry_plan, info,
                   "oneDNN (libdnnl) on CPU tensors: every implementation of a primitive descriptor",
                   {"candidates": "implementations", "choice": "impl", "precision": "fpmath"},
                   rows="rawconv.explore.onednn_rows:onednn_rows", replay=_registry_replay,
                   # implementation names: lowercase "kind:isa" ("jit:avx2", "x64:gemm:jit", "ref:any"), "@layouts"
                   choice_names=r"(?!unfused:|nhwc:)[a-z0-9_.+-]+(:[a-z0-9_.+-]+)+(@(any|user))?"))
