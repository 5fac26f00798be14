"""Fused convolution + bias (+ residual) (+ activation) as ONE library call, and the torch operator over it.

    y = rawconv.fused.conv_bias_act(x, w, b, residual=r, padding=1, activation="relu")
    # = relu(conv(x, w) + b + r), one oneDNN primitive (CPU) or one cuDNN graph (CUDA)

    torch.ops.rawconv.conv_bias_act(x, w, b, r, [1, 1], [1, 1], [1, 1], 1, "silu", "auto", None, "strict")

Activations (:data:`ACTIVATIONS`, torch's names): ``"relu"``, ``"relu6"``, ``"silu"``, ``"gelu"``
(erf), ``"gelu_tanh"`` (torch's ``approximate="tanh"``: never fused as the erf one, nor the other way),
``"hardswish"``, ``"hardsigmoid"``, ``"sigmoid"``, ``"tanh"``, ``"none"``.

* CPU: a oneDNN convolution primitive with the bias inside it and the post-ops ``sum`` (the
  residual, which oneDNN reads from the destination buffer before writing it) then one ``eltwise``
  (:data:`rawconv.onednn.fused.ELTWISE`): oneDNN applies post-ops in the order they are appended,
  so the result is ``act(conv(x, w) + b + r)`` (checked against float64 in tests/test_fused.py and
  tests/test_fused_activations.py). :class:`FusedConvolution` is the plan: a
  :class:`rawconv.onednn.Convolution` whose primitive carries those post-ops (implementations,
  ``select``, ``autotune``, the weight snapshot of ``prepack=True`` as there). oneDNN's ReLU, ReLU6,
  erf-GELU, sigmoid and hardsigmoid do not keep a NaN (or an infinity) as torch does: those run
  fused only where the convolution's result is provably finite, else unfused for that call
  (:data:`rawconv.onednn.fused.NAN_GUARDED`).
* CUDA: one cuDNN graph: convolution, pointwise ``add`` of the bias, pointwise ``add`` of the
  residual (a second input tensor of the graph), one pointwise activation node
  (:class:`ResidualGraphConvolution`; without a residual, :class:`rawconv.cudnn_graph.GraphConvolution`
  with ``activation=...``). Hardswish and hardsigmoid have no pointwise mode: the graph ends before
  them and torch's op runs on its result (:data:`CUDNN_UNFUSED` says why).

The operator ``rawconv::conv_bias_act`` has a fake (meta) kernel computed from the arguments alone
(no library call), so ``torch.compile(fullgraph=True)`` traces it, and a backward (gradients of x,
w, bias and residual through rawconv's own backward-data and backward-weights calls; no double
backward). It is meant for inference (``rawconv.nn.convert(..., fuse=True)`` folds BatchNorm into
the weights, which is only right in eval mode).

Weights: the function form and the operator read the weights on every call (reordered per call
when the implementation wants another layout), as :mod:`rawconv.ops` does. The modules that
``rawconv.nn.convert(..., fuse=True)`` makes are **frozen** (:func:`freeze`): their weight and
bias, with the BatchNorm they refer to folded in, are snapshotted (a copy, as torch's freezing
makes constants) and reordered once per problem; the snapshot is taken again at the next call
whenever what it was taken from changed (:class:`_FrozenState`), and :func:`rawconv.nn.refresh`
takes a new one at once (after a write through ``.data``, which no version counter sees).

This module is the face: the torch operators and :func:`conv_bias_act` live here; the rest in its
parts, each handing its names on through here (``rawconv.fused.X`` as before the split):
:mod:`.fused_plans` (:func:`plan_for`, the plan caches, the operator's kernel), :mod:`.fused_graph`
(:class:`ResidualGraphConvolution` and its capture stand-in) and :mod:`.fused_frozen` (the frozen
modules' snapshots). The settings a part reads (``CAPTURE_LEGACY_RESIDUAL``, ``_capturing_now``,
``ResidualGraphConvolution`` once made) are set and read here and reach that part
(:func:`rawconv.core.face.route_settings`).
"""
from __future__ import annotations

import warnings
from typing import Optional, Sequence

import torch

from . import autocast as _autocast
from . import fused_graph as _graph
from ..core.face import route_settings as _route_settings
from ..core.grad import functorch_active as _functorch, has_tangent as _has_tangent
from ..core import guard as _guard
from ..core.errors import ArgumentTypeError, NotSupportedError
from ..core.problem import ConvProblem
from ..core.postops import ACTIVATIONS, check_activation, check_residual, torch_tail, apply_activation, \
    forget_bound  # noqa: F401
from ..onednn.fused import FusedConvolution  # noqa: F401 - the oneDNN post-op plan lives there
from .fused_graph import (_ResidualGraphMixin, _CAPTURE_SEP, _legacy_for_capture, _legacy_checked,  # noqa: F401
                          _graph_class)
from .fused_plans import (BACKENDS, PRECISIONS, _cpu_plans, _gpu_plans, _fast, _FAST_MAX, clear_cache,  # noqa: F401
                          _pad_arg, _backend_of, plan_for, CUDNN_UNFUSED, _CudaFallback, _run_frozen, _run, _out_meta,
                          _op_kernel)
from .fused_frozen import (FROZEN_WEIGHT, FROZEN_BIAS, _FROZEN_PLANS, _FROZEN_STATE, BN_KEY, _FROZEN_MAX,  # noqa: F401
                           _frozen_dicts, _clear_frozen_plans, _EPOCH, _watch_optimizers, _PlanDict, _unbound_state,
                           _fold, _versions, _FrozenState, _no_module, _into, freeze, rebind, frozen, frozen_state,
                           frozen_plans_of, _synced)

__all__ = ["conv_bias_act", "FusedConvolution", "ResidualGraphConvolution", "ACTIVATIONS", "BACKENDS",
           "clear_cache"]



def _conv_bias_act_kernel(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor],
                          residual: Optional[torch.Tensor], stride: Sequence[int], padding: Sequence[int],
                          dilation: Sequence[int], groups: int, activation: str, backend: str, choice: Optional[str],
                          precision: str) -> torch.Tensor:
    """``act(conv(x, w) + bias + residual)`` on oneDNN (CPU) or a cuDNN graph (CUDA). Reached through
    torch's dispatcher (torch.compile's generated code calls it so): the bounds x and the residual
    carry are dropped first (:func:`rawconv.core.postops.forget_bound`: inductor rewrites dead
    buffers in place without a version bump), so the NaN guard reads them."""
    forget_bound(x, residual)
    w, bias, plans = _synced(w, bias)
    return _op_kernel(x, w, bias, residual, stride, padding, dilation, groups, activation, backend, choice, precision,
                      frozen_plans=plans)


# the operator; its backend kernel is _conv_bias_act_kernel, which the Autograd kernel below also calls
# directly when nothing needs autograd and nothing sits between Autograd and the backend (_direct)
_conv_bias_act_op = torch.library.custom_op("rawconv::conv_bias_act", mutates_args=())(_conv_bias_act_kernel)


def _conv_bias_act_residual_kernel(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor],
                                   residual: torch.Tensor, stride: Sequence[int], padding: Sequence[int],
                                   dilation: Sequence[int], groups: int, activation: str, backend: str,
                                   choice: Optional[str], precision: str) -> None:
    """``residual = act(conv(x, w) + bias + residual)``, in place, for inference: oneDNN's ``sum``
    post-op reads and writes the residual's memory, with no copy of it into a new output (when
    the residual is dense in x's memory format and shares no memory with x, w or bias; otherwise
    the result is computed out of place and copied back). Used by :func:`rawconv.nn.convert`'s
    fused modules where the residual is a fresh intermediate that nothing reads afterwards;
    under ``torch.compile`` inductor then keeps it in place (functionalized, reinplaced). No
    autograd: the modules call the out-of-place ``rawconv::conv_bias_act`` when a gradient is
    needed; with grad mode on and an argument that requires grad it raises
    :class:`NotSupportedError` (the overwritten residual would carry no gradient, or a wrong one)."""
    forget_bound(x, residual)   # (as _conv_bias_act_kernel: inductor's in-place reuse moves no version counter)
    w, bias, plans = _synced(w, bias)
    y = _op_kernel(x, w, bias, residual, stride, padding, dilation, groups, activation, backend, choice, precision,
                   residual_inplace=True, frozen_plans=plans)
    if y is not residual:
        with torch.no_grad():
            residual.copy_(y)


# (its Autograd kernel, _residual_op_autograd, calls _conv_bias_act_residual_kernel directly where _direct allows)
_conv_bias_act_residual_op = torch.library.custom_op("rawconv::conv_bias_act_residual_",
                                                     mutates_args=("residual",))(_conv_bias_act_residual_kernel)


@_conv_bias_act_residual_op.register_fake
def _(x, w, bias, residual, stride, padding, dilation, groups, activation, backend, choice, precision):
    return None


def _residual_op_autograd(keyset, *args):
    """The in-place operator's Autograd kernel: torch.library allows no autograd formula for a
    mutating operator, and its default one runs the kernel and records nothing (the overwritten
    residual then carries no gradient, or its old one: silently wrong gradients). Raises
    :class:`NotSupportedError` before any library call when grad mode is on and an argument
    requires grad, or an argument carries a forward-mode tangent; otherwise runs the kernel: itself,
    after bumping the residual's version counter as torch's ADInplaceOrView kernel would, when
    nothing else sits between Autograd and the backend (:func:`_direct`), else below autograd
    through the dispatcher."""
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        raise NotSupportedError("rawconv::conv_bias_act_residual_ overwrites residual and records no gradient: "
                                "with tensors that require grad use rawconv::conv_bias_act (or torch.no_grad())")
    if _has_tangent(*args[:4]):
        raise NotSupportedError("rawconv::conv_bias_act_residual_ has no forward-mode derivative (an argument "
                                "carries a forward_ad / torch.func.jvp tangent, which it would drop)")
    if len(args) == 12 and _direct(keyset, args, _conv_bias_act_residual_op, _PLAIN_INPLACE_KEYSETS):
        _increment_version(args[3])   # (torch's ADInplaceOrView kernel for the mutated argument)
        return _conv_bias_act_residual_kernel(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.rawconv.conv_bias_act_residual_.default.redispatch(
            keyset & torch._C._after_autograd_keyset, *args)


try:
    with warnings.catch_warnings():   # replaces the Autograd kernel torch.library registered for it
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*", category=UserWarning)
        _residual_op_lib = torch.library.Library("rawconv", "IMPL")
        _residual_op_lib.impl("conv_bias_act_residual_", _residual_op_autograd, "Autograd", with_keyset=True)
    RESIDUAL_OP_GUARDED = True
except Exception:  # noqa: BLE001  (a torch without these private hooks: the modules then never call the in-place op)
    RESIDUAL_OP_GUARDED = False


@_conv_bias_act_op.register_fake
def _(x, w, bias, residual, stride, padding, dilation, groups, activation, backend, choice, precision):
    shape, cl, unbatched = _out_meta(x, w, stride, padding, dilation)
    y = x.new_empty(shape)
    if cl and not unbatched and len(shape) in (4, 5):
        y = y.contiguous(memory_format=torch.channels_last if len(shape) == 4 else torch.channels_last_3d)
    return y


# activations whose derivative torch computes from the result (relu, sigmoid, tanh: aten's own
# backward ops); the others need the pre-activation, recomputed in the backward (one more
# convolution: the operator is meant for inference)
_GRAD_FROM_OUTPUT = ("none", "relu", "sigmoid", "tanh")


def _setup_context(ctx, inputs, output):
    x, w, bias, residual, stride, padding, dilation, groups, activation, backend, choice, precision = inputs
    activation = check_activation(activation)
    if activation in _GRAD_FROM_OUTPUT:
        ctx.save_for_backward(x, w, output if activation != "none" else None, None, None)
    else:
        ctx.save_for_backward(x, w, None, bias, residual)
    ctx.conf = (tuple(stride), tuple(padding), tuple(dilation), groups, activation, backend, precision,
                bias is not None, residual is not None)


def _activation_grad(gy, y, z_of, activation: str):
    """dL/dz of ``y = activation(z)`` as torch's own backward ops compute it (``z_of()``: the
    pre-activation, recomputed, for those that need it)."""
    aten = torch.ops.aten
    if activation == "none":
        return gy
    if activation == "relu":
        return aten.threshold_backward(gy, y, 0)
    if activation == "sigmoid":
        return aten.sigmoid_backward(gy, y)
    if activation == "tanh":
        return aten.tanh_backward(gy, y)
    z = z_of()
    if activation == "relu6":
        return aten.hardtanh_backward(gy, z, 0.0, 6.0)
    if activation == "silu":
        return aten.silu_backward(gy, z)
    if activation in ("gelu", "gelu_tanh"):
        return aten.gelu_backward(gy, z, approximate="tanh" if activation == "gelu_tanh" else "none")
    if activation == "hardswish":
        return aten.hardswish_backward(gy, z)
    if activation == "hardsigmoid":
        return aten.hardsigmoid_backward(gy, z)
    raise NotSupportedError(f"no backward for activation {activation!r}")


def _backward(ctx, gy):
    x, w, y, bias, residual = ctx.saved_tensors
    stride, padding, dilation, groups, activation, backend, precision, has_b, has_r = ctx.conf
    if torch.is_grad_enabled():
        raise NotSupportedError("double backward through rawconv::conv_bias_act is not implemented "
                                "(convert(..., fuse=False) for higher-order gradients)")

    def z_of():   # the pre-activation conv(x, w) + b + r, through the operator itself (no activation)
        return torch.ops.rawconv.conv_bias_act(x, w, bias, residual, list(stride), list(padding), list(dilation),
                                               groups, "none", backend, None, precision)

    gz = _activation_grad(gy, y, z_of, activation)
    # through the registered backward operators (their fake kernels let torch.compile trace this
    # backward: a direct library call would ask a FakeTensor for its data pointer)
    from . import ops as _ops

    nd = w.dim() - 2
    pad = list(padding)
    pb, pa = (pad, pad) if len(pad) == nd else (pad[:nd], pad[nd:])
    gz = _ops._grad_like(gz, x, x.dim() == nd + 1)
    gx = gw = gb = gr = None
    if ctx.needs_input_grad[0]:
        gx = _ops._bwd_data_op(gz, w, list(x.shape), list(stride), pb, pa, list(dilation), groups, backend, "",
                               precision)
    if ctx.needs_input_grad[1]:
        gw, _ = _ops._bwd_weights_op(x, gz, list(w.shape), list(stride), pb, pa, list(dilation), groups, False,
                                     backend, "", precision)
    if has_b and ctx.needs_input_grad[2]:
        dims = [0] + list(range(2, gz.dim())) if gz.dim() == nd + 2 else list(range(1, gz.dim()))
        gb = gz.sum(dims, dtype=torch.float32 if gz.dtype != torch.float64 else torch.float64).to(gz.dtype)
    if has_r and ctx.needs_input_grad[3]:
        gr = gz
    return gx, gw, gb, gr, None, None, None, None, None, None, None, None


_conv_bias_act_op.register_autograd(_backward, setup_context=_setup_context)


def _plain_keysets(*extra: str) -> frozenset:
    """The raw dispatch key sets (as the Autograd kernel receives them) of a call whose tensors are
    all plain dense CPU tensors, or all plain dense CUDA tensors, with no mode, transform or
    tracer in the thread's included keys: the backend key and its Autograd key, and the ``extra``
    keys (``ADInplaceOrView``, which a mutating operator's calls carry), nothing else."""
    C = torch._C
    out = set()
    for dev in ("CPU", "CUDA"):
        ks = C.DispatchKeySet(getattr(C.DispatchKey, dev)) | C.DispatchKeySet(getattr(C.DispatchKey, "Autograd" + dev))
        for k in extra:
            ks = ks | C.DispatchKeySet(getattr(C.DispatchKey, k))
        out.add(ks.raw_repr())
    return frozenset(out)


_PLAIN_KEYSETS = _plain_keysets()
_PLAIN_INPLACE_KEYSETS = _plain_keysets("ADInplaceOrView")
_any_requires_grad = getattr(torch._C, "_any_requires_grad", None)
try:
    from torch.autograd.graph import increment_version as _increment_version
except ImportError:   # (an older torch: the in-place operator always takes torch's path)
    _increment_version = None


def _direct(keyset, args, opdef=None, plain=None) -> bool:
    """Whether the Autograd kernel may call :func:`_conv_bias_act_kernel` itself, as the backend
    kernel that torch's path reaches would, skipping torch's redispatch below Autograd (a second trip
    through the dispatcher, converting the twelve arguments again): only when that path would do
    exactly this. No autograd to record (grad mode off, or no tensor argument requires grad); the
    key set is only the tensors' backend (CPU or CUDA) and its Autograd key (a TorchDispatchMode,
    a fake tensor, a tensor subclass with ``__torch_dispatch__``, make_fx, functionalization,
    functorch's layers, a ZeroTensor, the Meta device each add a key: torch's path then runs
    them); every tensor argument is a plain ``torch.Tensor`` (no subclass, not even a Parameter); no
    torch.func transform is active; and the operator's backend kernel is still the one
    registered here (none added with ``register_kernel``, none disabled with
    ``set_kernel_enabled``). Otherwise False: torch's generated kernel runs. ``opdef``/``plain``:
    the in-place residual operator's (its key sets carry ADInplaceOrView)."""
    if keyset.raw_repr() not in (plain or _PLAIN_KEYSETS) or _functorch() or _any_requires_grad is None \
            or (opdef is not None and _increment_version is None):
        return False
    x, w, bias, residual = args[0], args[1], args[2], args[3]
    if type(x) is not torch.Tensor or type(w) is not torch.Tensor \
            or (bias is not None and type(bias) is not torch.Tensor) \
            or (residual is not None and type(residual) is not torch.Tensor):
        return False
    if torch.is_grad_enabled() and _any_requires_grad(x, w, bias, residual):
        return False
    opdef = opdef or _conv_bias_act_op
    return not opdef._disabled_kernel and len(opdef._backend_fns) == 1


def _transform_guard(generated):
    """The out-of-place operator's Autograd kernel: torch's generated one (``register_autograd``)
    drops a forward-mode tangent silently (the result carries none: torch.func.jvp gave zeros) and
    fails inside torch.func's grad transforms with an internal error. Raises
    :class:`NotSupportedError` for those, before any library call; calls the kernel directly when
    nothing needs autograd and nothing sits between Autograd and the backend (:func:`_direct`);
    otherwise runs torch's."""
    def autograd_kernel(keyset, *args, **kwargs):
        if _has_tangent(*args[:4]):
            raise NotSupportedError("rawconv::conv_bias_act has no forward-mode derivative (forward_ad, "
                                    "torch.func.jvp/jacfwd/hessian); use rawconv.ops.conv (differentiable in both "
                                    "modes) and add the bias, residual and activation in torch")
        if not kwargs and len(args) == 12 and _direct(keyset, args):
            return _conv_bias_act_kernel(*args)
        if _functorch() and torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                                            for a in args[:4]):
            raise NotSupportedError("torch.func transforms (grad, vjp, jacrev...) through rawconv::conv_bias_act are "
                                    "not supported (it is meant for inference); use rawconv.ops.conv, which "
                                    "supports them, and add the bias, residual and activation in torch")
        return generated(keyset, *args, **kwargs)
    return autograd_kernel


try:
    from torch._library.autograd import make_autograd_impl as _make_autograd_impl

    with warnings.catch_warnings():   # wraps the Autograd kernel torch.library registered for it
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*", category=UserWarning)
        _fused_op_lib = torch.library.Library("rawconv", "IMPL")
        _fused_op_lib.impl("conv_bias_act", _transform_guard(_make_autograd_impl(
            torch.ops.rawconv.conv_bias_act.default, _conv_bias_act_op)), "Autograd", with_keyset=True)
except Exception:  # noqa: BLE001  (a torch without this private helper: torch's own kernel stays)
    pass

# autocast: the inputs cast as torch casts a convolution's (rawconv._autocast); the in-place residual
# operator has none (its residual keeps its dtype): the modules call the out-of-place one under autocast
_autocast_lib = torch.library.Library("rawconv", "IMPL")
_autocast.register(_autocast_lib, "conv_bias_act")


def conv_bias_act(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                  residual: torch.Tensor | None = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
                  groups: int = 1, *, activation: str = "relu", backend: str = "auto", choice: Any = None,
                  precision: str = "strict") -> torch.Tensor:
    """``activation(conv(x, w) + bias + residual)`` as one library call (``torch.ops.rawconv.conv_bias_act``).

    ``x``: (N, C, *spatial) or unbatched, NCHW or channels_last; ``w``: (K, C/groups, *kernel);
    ``bias``: (K,) or None; ``residual``: a tensor of the output's shape (N, K, *out) or None;
    ``padding``: int, tuple, ``"same"``/``"valid"`` or one ``(before, after)`` pair per spatial
    dim; ``activation``: one of :data:`ACTIVATIONS` (``"relu"``, ``"silu"``, ``"gelu"``, ...; the
    module notes say where each fuses); ``backend``: ``"auto"`` (by x's device),
    ``"onednn"`` (CPU: float32/bfloat16 where the CPU has it), ``"cudnn"`` (CUDA: one graph;
    float32/float16/bfloat16/float64); ``choice``: the oneDNN implementation (name, ``"name@user"``,
    position) or the cuDNN engine config name (``"eng28{k2=3}"``); ``precision``: ``"strict"``,
    ``"tf32"``, ``"bf16"``, ``"f16"``, ``"any"`` (see :mod:`rawconv.options`). Returns y in x's
    memory format, differentiable once (gradients through rawconv's backward-data and
    backward-weights calls with the backend's default choices).

    Raises :class:`ArgumentError` / :class:`ArgumentTypeError` before any C call for bad input,
    :class:`NotSupportedError` when the library offers no (or not the chosen) implementation for
    the fused primitive. Wraps ``dnnl_primitive_execute`` on a primitive with post-ops, or
    ``cudnnBackendExecute`` on a graph with pointwise nodes.
    """
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ArgumentTypeError(f"x and w must be torch.Tensor, got {type(x).__name__} and {type(w).__name__}")
    activation = check_activation(activation)
    if isinstance(choice, int) and not isinstance(choice, bool):
        choice = str(choice)   # the operator's schema takes a string; positions stay positions
    if torch._C._is_any_autocast_enabled() and x.device.type in ("cpu", "cuda") \
            and torch.is_autocast_enabled(x.device.type):   # as autocast casts the operator's inputs, before the checks
        x, w, bias, residual = _autocast.cast_inputs("conv_bias_act", x.device.type, (x, w, bias, residual))
    problem = ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups)
    if residual is not None:
        check_residual(residual, problem)
    _backend_of(backend, x.device)
    pads = list(problem.pad_before) + (list(problem.pad_after) if not problem.symmetric else [])
    return torch.ops.rawconv.conv_bias_act(x, w, bias, residual, list(problem.stride), pads,
                                           list(problem.dilation), problem.groups, activation, backend,
                                           choice, precision)


# every public entry point raises only rawconv's exception classes (rawconv._guard)
_guard.guard_module(globals(), "conv_bias_act")


# name -> the part that reads it: a setting or hook set on this face (``rawconv.fused.CAPTURE_LEGACY_RESIDUAL =
# False``, a test's ``monkeypatch.setattr(fused, "_capturing_now", f)``) is set there, where the part's code
# reads it; ResidualGraphConvolution is read there too (None until _graph_class() made it)
_SETTINGS = {"CAPTURE_LEGACY_RESIDUAL": _graph, "_capturing_now": _graph, "ResidualGraphConvolution": _graph}

_route_settings(__name__, _SETTINGS)   # (rawconv.core.face: unittest.mock.patch.object restores them too)
