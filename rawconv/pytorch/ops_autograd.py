"""rawconv.ops's autograd (:mod:`rawconv.ops`, the face): the operators' autograd Functions
(first and higher order, forward mode, torch.func), the Autograd kernels registered for them, the
operators called from Python (:func:`_fwd_call`...), and the direct backward of a call made
without the dispatcher (:func:`_direct_backward`). Reads the kernels' checked paths as
``_k.NAME`` (a hook patched on the face is set in :mod:`.ops_kernels`)."""
from __future__ import annotations

import torch

from . import autocast as _autocast
from . import ops_kernels as _k
from ..core import guard as _guard
from ..core.errors import NotSupportedError
from ..core.problem import conv_layout, dense_strides, strides_match, suggests_channels_last, to_layout
from .ops_kernels import (_backward_data_cpu, _backward_data_cpu_plan, _backward_data_cuda, _backward_weights_cpu,
                          _backward_weights_cpu_plan, _backward_weights_cuda, _batched, _bias_grad_of, _bwd_data_op,
                          _bwd_weights_op, _data_result, _forward_cpu, _forward_cuda, _fwd_op, _get_ident,
                          _grads_of_forward_layout, _layout, _lib, _weights_result)

_grad_enabled = torch.is_grad_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_mode = torch._C._is_torch_function_mode_enabled
_functorch = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
_tracing = torch._C._get_tracing_state
# a legacy vmap's BatchedTensor (torch.autograd.grad(..., is_grads_batched=True), autograd.functional's
# vectorize=True, torch._vmap_internals._vmap) has no storage: only the dispatcher (its batched
# fallback) runs an operator on one
_legacy_batched = getattr(torch._C._functorch, "is_legacy_batchedtensor", lambda t: False)
_compiling = torch.compiler.is_compiling
_autocasting = torch._C._is_any_autocast_enabled

# ---------------------------------------------------------------------------- autograd
# Registered as torch.library.register_autograd registers (an Autograd kernel that applies an
# autograd.Function whose forward redispatches below autograd), written out here: torch's generated
# kernel re-fills the schema's defaults on every call (40% of a grad-mode call on a tiny problem),
# and when the only key left below autograd is the backend's, the kernel is called directly (what
# the redispatch would do), saving a second trip through the dispatcher.
_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_CPU_ONLY = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_CUDA_ONLY = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
_below_autograd = torch._C._AutoDispatchBelowAutograd


_KEYSETS: dict = {}   # keyset.raw_repr() -> 1 (only CPU left below autograd), 2 (only CUDA), 0 (other keys)


def _run_below_autograd(op, cpu_kernel, cuda_kernel, keyset, args):
    """``op(*args)`` below autograd: the backend's kernel directly when only its key is left below
    autograd in ``keyset``, else a redispatch; ``keyset`` None (an autograd Function applied from
    Python under a torch.func transform): the operator called under ``_AutoDispatchBelowAutograd``."""
    if keyset is None:
        with _below_autograd():
            return op(*args)
    raw = keyset.raw_repr()
    kind = _KEYSETS.get(raw)
    if kind is None:
        rest = keyset & _AFTER_AUTOGRAD
        kind = 1 if rest == _CPU_ONLY else 2 if rest == _CUDA_ONLY else 0
        if len(_KEYSETS) < 256:
            _KEYSETS[raw] = kind
    if kind == 1:
        return cpu_kernel(*args)
    if kind == 2:
        return cuda_kernel(*args)
    with _below_autograd():
        return op.redispatch(keyset & _AFTER_AUTOGRAD, *args)


def _grad_like(g: torch.Tensor, x: torch.Tensor, unbatched: bool, w: torch.Tensor | None = None) -> torch.Tensor:
    """``g`` dense in the forward's output layout (incoming gradients may be expanded or oddly
    strided): with ``w``, torch's (:func:`rawconv.problem.conv_layout` of x and w; dx and dw then
    come out in it, as torch's); without, x's (rawconv.fused's operator, whose y is in x's)."""
    xb = _batched(x, unbatched)
    if (conv_layout(xb, w) if w is not None else _layout(xb)) == "nhwc":
        if g.dim() in (4, 5):
            g = g.contiguous(memory_format=torch.channels_last if g.dim() == 4 else torch.channels_last_3d)
            if w is not None and g.is_cpu and g.numel() and not suggests_channels_last(g):
                # strides that fit both formats (one channel, a 1x1 output): the backward operators
                # read the layout from grad_y, torch's CPU backward from x and w; the same memory
                # viewed with channels-last strides says so
                g = g.as_strided(g.shape, dense_strides(g.shape, "nhwc"))
            return g
        return to_layout(g, "nhwc") if g.dim() == 3 else g.contiguous()
    return g.contiguous()


class _Conf:
    """An operator's non-tensor arguments as ONE opaque input of its autograd Function: torch.func
    flattens a Function's inputs as pytrees (lists and tuples would be leaves wanting a gradient
    each, and the backward's result would not match them)."""

    __slots__ = ("args",)

    def __init__(self, args):
        self.args = tuple(args)


def _add(a, b):
    """a + b where either may be None (a tangent that is zero)."""
    if a is None:
        return b
    return a if b is None else a + b


# The autograd Functions below keep the forward apart from setup_context (torch.func's grad, vjp,
# jacrev, hessian need that) and give the forward-mode derivative (jvp: torch.autograd.forward_ad,
# torch.func.jvp / jacfwd); each operator is bilinear in its two tensors, so a tangent is the
# same operator on (tangent, other) plus on (other, tangent). vmap uses torch's generated rule.
def _no_autocast(backward):
    """An autograd Function's ``backward`` run with autocast off for its gradient's device:
    torch's convolution backward has no autocast rule (it runs in its inputs' dtype), while the
    backward operators it calls here (``rawconv::conv_backward_data`` is also the transposed
    convolution's forward) have autocast kernels, which would cast a float32 backward into the
    autocast dtype when ``backward`` / ``autograd.grad`` is called under ``torch.autocast``."""
    import functools

    @functools.wraps(backward)
    def run(ctx, *grads):
        if _autocasting():
            g = next((t for t in grads if isinstance(t, torch.Tensor)), None)
            if g is not None and g.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(g.device.type):
                with torch.autocast(g.device.type, enabled=False):
                    return backward(ctx, *grads)
        return backward(ctx, *grads)
    return run


class RawconvConvForward(torch.autograd.Function):
    """rawconv::conv_forward's autograd: dx by conv_backward_data(gy, w), (dw, db) by
    conv_backward_weights(x, gy), with the pinned backward choices."""

    generate_vmap_rule = True

    @staticmethod
    def forward(how, x, w, bias, conf):
        # how: the dispatch keyset (from the operator's Autograd kernel); an entry of _conv_entry's
        # direct path (a list: its plans' hot paths check the tensors, else the checked kernels run);
        # None: applied from Python under a torch.func transform (see _fwd_call)
        args = conf.args
        if type(how) is list:
            if x.is_cuda:
                plan = how[2]
                y = None if plan is None else plan._hot_forward(x, w, bias)
                if y is None:
                    y, how[2] = _k._forward_cuda_checked(x, w, bias, *args)
                return y
            y = how[1]._hot_run(x, w, bias, None)
            return _forward_cpu(x, w, bias, *args) if y is None else y
        return _run_below_autograd(_fwd_op, _forward_cpu, _forward_cuda, how, (x, w, bias) + args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        how, x, w, bias, conf = inputs
        ctx.save_for_backward(x, w)
        ctx.save_for_forward(x, w)
        ctx.conf = conf.args, bias is not None
        ctx.entry = how if type(how) is list else None

    @staticmethod
    @_no_autocast
    def backward(ctx, gy):
        if ctx.entry is not None and _plain_backward() and not _legacy_batched(gy):
            return _direct_backward(ctx, gy)
        x, w = ctx.saved_tensors
        (stride, pb, pa, dil, groups, backend, _choice, precision, bdc, bwc), has_bias = ctx.conf
        _, nx, nw, nb = ctx.needs_input_grad[:4]
        gy = _grad_like(gy, x, x.dim() == w.dim() - 1, w=w)
        gx = gw = gb = None
        if nx:
            gx = _bwd_data_call(gy, w, list(x.shape), stride, pb, pa, dil, groups, backend, bdc, precision)
        if nw or (has_bias and nb):
            gw, gb = _bwd_weights_call(x, gy, list(w.shape), stride, pb, pa, dil, groups, has_bias, backend, bwc,
                                     precision)
            gw = gw if nw else None
            gb = gb if has_bias and nb else None
        gx, gw = _grads_of_forward_layout(gx, gw, x, w)
        return None, gx, gw, gb, None

    @staticmethod
    def jvp(ctx, _how_t, x_t, w_t, b_t, _conf_t):
        x, w = ctx.saved_tensors
        args, _ = ctx.conf
        t = None
        if x_t is not None or (b_t is not None and w_t is None):
            t = _fwd_call(x_t if x_t is not None else torch.zeros_like(x), w, b_t, *args)
        if w_t is not None:
            t = _add(t, _fwd_call(x, w_t, b_t if t is None else None, *args))
        return t


class RawconvConvBackwardData(torch.autograd.Function):
    """rawconv::conv_backward_data's autograd (linear in grad_y and w): d grad_y = conv_forward(g, w),
    dw = conv_backward_weights(g, grad_y), at the library's first choice."""

    generate_vmap_rule = True

    @staticmethod
    def forward(keyset, grad_y, w, conf):
        return _run_below_autograd(_bwd_data_op, _backward_data_cpu, _backward_data_cuda, keyset,
                                   (grad_y, w) + conf.args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _keyset, grad_y, w, conf = inputs
        ctx.save_for_backward(grad_y, w)
        ctx.save_for_forward(grad_y, w)
        ctx.conf = conf.args

    @staticmethod
    @_no_autocast
    def backward(ctx, g):
        grad_y, w = ctx.saved_tensors
        x_shape, stride, pb, pa, dil, groups, backend, _choice, precision = ctx.conf
        _, ngy, nw = ctx.needs_input_grad[:3]
        unbatched = len(x_shape) == w.dim() - 1
        # as a transposed convolution of grad_y: torch gives both gradients its forward's layout
        g = _grad_like(g, grad_y, unbatched, w=w)
        ggy = gw = None
        if ngy:
            ggy = _fwd_call(g, w, None, stride, pb, pa, dil, groups, backend, "", precision, "", "")
        if nw:
            gw = _bwd_weights_call(g, grad_y, list(w.shape), stride, pb, pa, dil, groups, False, backend, "",
                                 precision)[0]
        # as a transposed convolution of grad_y (1-D, unbatched, an empty batch: torch's layouts; backward
        # weights follows its grad_y there, here grad_y's x)
        ggy, gw = _grads_of_forward_layout(ggy, gw, grad_y, w)
        return None, ggy, gw, None

    @staticmethod
    def jvp(ctx, _keyset_t, gy_t, w_t, _conf_t):
        grad_y, w = ctx.saved_tensors
        t = None
        if gy_t is not None:
            t = _bwd_data_call(gy_t, w, *ctx.conf)
        if w_t is not None:
            t = _add(t, _bwd_data_call(grad_y, w_t, *ctx.conf))
        return t


class RawconvConvBackwardWeights(torch.autograd.Function):
    """rawconv::conv_backward_weights's autograd (linear in x and grad_y): dx = conv_backward_data(grad_y,
    g_w), d grad_y = conv_forward(x, g_w, g_b), at the library's first choice."""

    generate_vmap_rule = True

    @staticmethod
    def forward(keyset, x, grad_y, conf):
        return _run_below_autograd(_bwd_weights_op, _backward_weights_cpu, _backward_weights_cuda, keyset,
                                   (x, grad_y) + conf.args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _keyset, x, grad_y, conf = inputs
        ctx.save_for_backward(x, grad_y)
        ctx.save_for_forward(x, grad_y)
        ctx.conf = conf.args
        ctx.db_shape = tuple(output[1].shape)

    @staticmethod
    @_no_autocast
    def backward(ctx, gdw, gdb):
        x, grad_y = ctx.saved_tensors
        _w_shape, stride, pb, pa, dil, groups, bias, backend, _choice, precision = ctx.conf
        _, nx, ngy = ctx.needs_input_grad[:3]
        gx = ggy = None
        use_b = bias and gdb is not None
        if nx and gdw is not None:
            gx = _bwd_data_call(grad_y, gdw, list(x.shape), stride, pb, pa, dil, groups, backend, "", precision)
        if ngy:
            if gdw is not None:
                ggy = _fwd_call(x, gdw, gdb if use_b else None, stride, pb, pa, dil, groups, backend, "", precision,
                              "", "")
            elif use_b:   # only db is used: d grad_y is gdb broadcast over batch and space
                nd = len(stride)
                shape = ([-1] if grad_y.dim() == nd + 1 else [1, -1]) + [1] * nd
                ggy = gdb.view(shape).expand(grad_y.shape).contiguous()
        return None, gx, ggy, None

    @staticmethod
    def jvp(ctx, _keyset_t, x_t, gy_t, _conf_t):
        x, grad_y = ctx.saved_tensors
        dw_t = db_t = None
        if x_t is not None:
            dw_t = _bwd_weights_call(x_t, grad_y, *ctx.conf)[0]
        if gy_t is not None:
            dw2, db_t = _bwd_weights_call(x, gy_t, *ctx.conf)
            dw_t = _add(dw_t, dw2)
        if db_t is None:   # db does not depend on x
            db_t = torch.zeros(ctx.db_shape, dtype=x.dtype, device=x.device)
        return dw_t, db_t


_fwad = torch.autograd.forward_ad


def _classic(cls):
    """A twin of autograd Function ``cls`` (forward apart from ``setup_context``) in the combined
    style (``forward(ctx, *inputs)`` running both), with the same backward and jvp. Applying a
    Function that defines ``setup_context`` costs torch an ``inspect.signature(...).bind`` of its
    forward on every call (``benchmarks/diag_function_apply.py`` on the 2-core EPYC, torch 2.14: 94 us
    per apply of a trivial Function in that style against 12 us in the combined style; 88 against 8
    under no_grad), once per convolution of a training step. torch.func's transforms need that style, so the classes
    stay for them (the ``_functorch()`` paths) and every other caller applies the twin."""
    fwd, setup = cls.forward, cls.setup_context

    def forward(ctx, *inputs):
        out = fwd(*inputs)
        setup(ctx, inputs, out)
        return out

    body = {"forward": staticmethod(forward), "backward": staticmethod(cls.backward), "__doc__": cls.__doc__,
            "__module__": cls.__module__}
    if "jvp" in vars(cls):
        body["jvp"] = staticmethod(cls.jvp)
    # the same name: grad_fn reads <RawconvConvForwardBackward> either way
    return type(cls.__name__, (torch.autograd.Function,), dict(body, __qualname__=cls.__qualname__))


for _cls in (RawconvConvForward, RawconvConvBackwardData, RawconvConvBackwardWeights):
    _cls.__module__ = "rawconv.pytorch.ops"   # (the face's, as before the split; the twins below copy it)
_FwdFn = _classic(RawconvConvForward)
_BwdDataFn = _classic(RawconvConvBackwardData)
_BwdWeightsFn = _classic(RawconvConvBackwardWeights)


# The operators from Python. Under a torch.func transform (grad, vjp, jacrev, jvp, jacfwd, hessian,
# vmap) functorch applies an autograd.Function only from Python (not from inside a dispatcher
# kernel: "could not find kernel for HigherOrderOperator custom_function_call"), so there the
# Function is applied here and its forward dispatches below autograd.
@_guard.applies_function
def _fwd_call(x, w, bias, *args):
    if _functorch():
        return RawconvConvForward.apply(None, x, w, bias, _Conf(args))
    return _fwd_op(x, w, bias, *args)


@_guard.applies_function
def _bwd_data_call(grad_y, w, *args):
    if _functorch():
        return RawconvConvBackwardData.apply(None, grad_y, w, _Conf(args))
    return _bwd_data_op(grad_y, w, *args)


@_guard.applies_function
def _bwd_weights_call(x, grad_y, *args):
    if _functorch():
        return RawconvConvBackwardWeights.apply(None, x, grad_y, _Conf(args))
    return _bwd_weights_op(x, grad_y, *args)


def _under_transform(op: str) -> None:
    """The operator itself called with a gradient or tangent to record under a torch.func transform."""
    raise NotSupportedError(f"torch.ops.rawconv.{op} called directly under a torch.func transform (grad, jvp, "
                            f"vmap...) records no derivative there: call rawconv.ops.{_PUBLIC_OF[op]} instead "
                            "(it applies the operator's autograd Function from Python, as torch.func requires)")


_PUBLIC_OF = {"conv_forward": "conv", "conv_backward_data": "conv_backward_data",
              "conv_backward_weights": "conv_backward_weights"}


def _needs(a, b, c=None) -> bool:
    """Whether the call must go through the autograd Function: grad mode on and an argument that
    requires grad, or a forward-mode AD level open (its tangents, if any, need the Function's jvp)."""
    return (_grad_enabled() and (a.requires_grad or b.requires_grad or (c is not None and c.requires_grad))) \
        or _fwad._current_level >= 0


# The operators' Autograd kernels: what torch.compile's generated code and eager autograd reach
# through the dispatcher on every call. With nothing to record (grad mode off, as inside a compiled
# graph, or no input requiring grad, no forward-mode level) and only the backend's key left below
# autograd (the keyset's kind already in _KEYSETS), the backend's kernel is called at once: the
# checks of _needs and _run_below_autograd inline, one Python frame less each.
@_guard.applies_function
def _forward_autograd(keyset, x, w, bias, *args):
    if (not _grad_enabled() or not (x.requires_grad or w.requires_grad or (bias is not None and bias.requires_grad))) \
            and _fwad._current_level < 0:
        kind = _KEYSETS.get(keyset.raw_repr())
        if kind == 2:
            return _forward_cuda(x, w, bias, *args)
        if kind == 1:
            return _forward_cpu(x, w, bias, *args)
    else:   # _needs(x, w, bias)
        if _functorch():
            _under_transform("conv_forward")
        return _FwdFn.apply(keyset, x, w, bias, _Conf(args))
    return _run_below_autograd(_fwd_op, _forward_cpu, _forward_cuda, keyset, (x, w, bias) + args)


@_guard.applies_function
def _backward_data_autograd(keyset, grad_y, w, *args):
    if (not _grad_enabled() or not (grad_y.requires_grad or w.requires_grad)) and _fwad._current_level < 0:
        kind = _KEYSETS.get(keyset.raw_repr())
        if kind == 2:
            return _backward_data_cuda(grad_y, w, *args)
        if kind == 1:
            return _backward_data_cpu(grad_y, w, *args)
    else:   # _needs(grad_y, w)
        if _functorch():
            _under_transform("conv_backward_data")
        return _BwdDataFn.apply(keyset, grad_y, w, _Conf(args))
    return _run_below_autograd(_bwd_data_op, _backward_data_cpu, _backward_data_cuda, keyset, (grad_y, w) + args)


@_guard.applies_function
def _backward_weights_autograd(keyset, x, grad_y, *args):
    if (not _grad_enabled() or not (x.requires_grad or grad_y.requires_grad)) and _fwad._current_level < 0:
        kind = _KEYSETS.get(keyset.raw_repr())
        if kind == 2:
            return _backward_weights_cuda(x, grad_y, *args)
        if kind == 1:
            return _backward_weights_cpu(x, grad_y, *args)
    else:   # _needs(x, grad_y)
        if _functorch():
            _under_transform("conv_backward_weights")
        return _BwdWeightsFn.apply(keyset, x, grad_y, _Conf(args))
    return _run_below_autograd(_bwd_weights_op, _backward_weights_cpu, _backward_weights_cuda, keyset,
                               (x, grad_y) + args)


_lib.impl("conv_forward", _forward_autograd, "Autograd", with_keyset=True)
_lib.impl("conv_backward_data", _backward_data_autograd, "Autograd", with_keyset=True)
_lib.impl("conv_backward_weights", _backward_weights_autograd, "Autograd", with_keyset=True)
for _name in ("conv_forward", "conv_backward_data", "conv_backward_weights"):   # torch's rule for convolutions
    _autocast.register(_lib, _name)


def _plain_backward() -> bool:
    """True when an autograd Function's backward may call the kernels directly: no graph of the
    backward recorded (``create_graph``), no dispatch or function mode, no functorch transform, no
    tracer (the gradients then need no dispatcher: convolution backward has no autocast rule)."""
    return (not _grad_enabled() and not _dispatch_modes() and not _function_mode() and not _functorch()
            and _tracing() is None and _fwad._current_level < 0)

def _same_layout(old, lk, x) -> bool:
    """Whether the backward plans kept for ``old`` (a ``(x shape, x strides, w strides, has_bias)``
    key) serve ``lk``: the same but for x's strides in dims of size 1 (a (N, C, 1, 1) input, dense in
    both formats, comes with either format's strides: the same memory, the same plans)."""
    return (old is not None and old[0] == lk[0] and old[2:] == lk[2:] and strides_match(x, old[1]))


def _direct_backward(ctx, gy):
    """:class:`RawconvConvForward`'s backward for a call of :func:`_conv_entry`'s direct path when
    nothing needs the dispatcher (:func:`_plain_backward`): the backward kernels called directly,
    the entry (``ctx.entry``) keeping the backward plans of its last backward with x and w in the
    same layout (their hot paths check the tensors, as the forward's, on the incoming gradient as
    it is; a gradient that does not fit is made dense in torch's layout for x and w first and
    takes the checked path). Returns the Function's gradients."""
    x, w = ctx.saved_tensors
    e = ctx.entry
    (stride, pb, pa, dil, groups, backend, _choice, precision, bdc, bwc), has_bias = ctx.conf
    _, nx, nw, nb = ctx.needs_input_grad[:4]
    gx = gw = gb = g = None
    wants_w = nw or (has_bias and nb)
    lk = (x.shape, x.stride(), w.stride(), has_bias)
    if x.is_cuda:
        if e[7] != lk:   # plans kept for x and w in another layout: their gradients' layout differs
            if not _same_layout(e[7], lk, x):
                e[4] = e[5] = None
            e[7] = lk
        if nx:
            p = e[4]
            gx = None if p is None else p._hot_call(gy, w, None)
            if gx is None:
                g = _grad_like(gy, x, x.dim() == w.dim() - 1, w=w)
                gx, e[4] = _k._backward_data_cuda_checked(g, w, list(x.shape), stride, pb, pa, dil, groups, backend,
                                                       bdc, precision)
        if wants_w:
            p = e[5]
            gw = None if p is None else p._hot_call(x, gy, None)
            if gw is not None:
                gb = _bias_grad_of(gy) if has_bias else None
            else:
                if g is None:
                    g = _grad_like(gy, x, x.dim() == w.dim() - 1, w=w)
                gw, gb, e[5] = _k._backward_weights_cuda_checked(x, g, list(w.shape), stride, pb, pa, dil, groups,
                                                              has_bias, backend, bwc, precision)
    else:   # the same on the CPU: the plans of this thread's last backward, their hot paths first
        k = (_get_ident(), lk)
        c = e[6]
        if c is None or c[0] != k:
            if c is not None and c[0][0] == k[0] and _same_layout(c[0][1], lk, x):
                c[0] = k
            else:
                c = e[6] = [k, None, None]
        if nx:
            p = c[1]
            gx = None if p is None else p._grad_hot_run(gy, w)
            if gx is None:
                g = _grad_like(gy, x, x.dim() == w.dim() - 1, w=w)
                p = c[1] = _backward_data_cpu_plan(g, w, list(x.shape), stride, pb, pa, dil, groups, backend, bdc,
                                                   precision)
                gx = _data_result(p, g, w)
        if wants_w:
            p, gg = c[2], gy
            res = None if p is None else p._grad_hot_run(x, gy)
            if res is None:
                if g is None:
                    g = _grad_like(gy, x, x.dim() == w.dim() - 1, w=w)
                p = c[2] = _backward_weights_cpu_plan(x, g, list(w.shape), stride, pb, pa, dil, groups, has_bias,
                                                      backend, bwc, precision)
                gg, res = g, p._grad_hot_run(x, g)
            gw, gb = _weights_result(p, x, gg, has_bias, res, empty_db=False)
    gx, gw = _grads_of_forward_layout(gx, gw if nw else None, x, w)
    return None, gx, gw, (gb if has_bias and nb else None), None
