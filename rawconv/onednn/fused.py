"""oneDNN's fused convolution: a forward primitive with the bias inside it and the post-ops ``sum``
(a residual) then one ``eltwise`` (the activation), ``y = act(conv(x, w) + b + r)``:
:class:`FusedConvolution`, the plan behind :func:`rawconv.fused.conv_bias_act` on CPU (what the torch
operator and the frozen modules of ``rawconv.nn.convert(..., fuse=True)`` run).

The activations and the oneDNN 3.2 eltwise algorithm each one is (:data:`ELTWISE`; alpha and beta as
``dnnl_post_ops_append_eltwise`` takes them)::

    relu         eltwise_relu       (0, 0)         relu6       eltwise_clip_v2   (0, 6)
    silu         eltwise_swish      (1, 0)         gelu        eltwise_gelu_erf  (0, 0)
    gelu_tanh    eltwise_gelu_tanh  (0, 0)         hardswish   eltwise_hardswish (1/6, 1/2)
    hardsigmoid  eltwise_hardsigmoid (1/6, 1/2)    sigmoid     eltwise_logistic  (0, 0)
    tanh         eltwise_tanh       (0, 0)

**NaN and infinity.** torch keeps a NaN through every activation (``relu(nan) = nan``) and maps
``relu(-inf) = 0``. oneDNN 3.2 does not always (measured on every implementation it offers, float32
and bfloat16, tests/test_fused_activations.py): its JIT ``eltwise_relu`` is ``max(x, 0)`` with the
NaN-dropping operand order (NaN -> 0), its reference and gemm implementations compute ``x > 0 ? x :
alpha * x`` (-inf -> NaN), ``eltwise_clip_v2`` turns NaN into 0 everywhere, the reference
``eltwise_logistic`` turns NaN into 0, and the JIT ``eltwise_gelu_erf`` gives NaN for +inf. Those
activations (:data:`NAN_GUARDED`) run fused only when the convolution's result is provably finite
(:func:`rawconv.core.postops.conv_bound`: no NaN or infinity in x, w, the bias or the residual,
and no overflow possible); otherwise that call runs the convolution with the bias and residual but
without the activation (a second plan, made on first need) and torch's own activation after it.
The bound of x costs one read of x (its 2-norm), except where x is, unchanged, the result of a
fused plan: each result carries the bound of its magnitude (:func:`rawconv.core.postops.carry_bound`),
so a chain of fused convolutions (a converted model's) reads x only where the chain starts or the
bound has grown too large, not at every layer. (Not under torch.compile: the operators' kernels
reached through torch's dispatcher drop the bounds x and the residual carry,
:func:`rawconv.core.postops.forget_bound`, since inductor rewrites dead buffers in place unseen.) SiLU, tanh-GELU, hardswish and tanh gave torch's result for
NaN, +-inf and finite inputs on every implementation, and run fused always.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from .plan import Convolution, check_device
from .primitive import _Built, _check_no_overlap, _omp_threads, _set_handle_int, weights_layout
from . import _ffi as _dnnl
from ..core import env as _env
from ..core.errors import ArgumentError, ArgumentTypeError
from ..core.postops import OPTIMIZER_EPOCH, watch_optimizers, check_activation, check_residual, torch_tail, \
    apply_activation, carried_bound, \
    carry_bound, conv_bound, vector_bound, weight_bound
from ..core.problem import ConvProblem, dense_strides, empty_like_layout, strides_match

__all__ = ["FusedConvolution", "ELTWISE", "NAN_GUARDED", "activation_of_post_ops"]

#: activation -> (oneDNN eltwise algorithm without its ``dnnl_eltwise_`` prefix, alpha, beta)
ELTWISE = {
    "relu": ("relu", 0.0, 0.0),
    "relu6": ("clip_v2", 0.0, 6.0),
    "silu": ("swish", 1.0, 0.0),
    "gelu": ("gelu_erf", 0.0, 0.0),
    "gelu_tanh": ("gelu_tanh", 0.0, 0.0),
    "hardswish": ("hardswish", 1.0 / 6.0, 0.5),      # x * max(0, min(1, alpha * x + beta)) in oneDNN 3.x
    "hardsigmoid": ("hardsigmoid", 1.0 / 6.0, 0.5),  # max(0, min(1, alpha * x + beta))
    "sigmoid": ("logistic", 0.0, 0.0),
    "tanh": ("tanh", 0.0, 0.0),
}
_BY_ALG = {alg: act for act, (alg, _a, _b) in ELTWISE.items()}

#: activations oneDNN 3.2 does not compute as torch does for a NaN or an infinity (module notes):
#: fused only where the convolution's result is provably finite
NAN_GUARDED = frozenset({"relu", "relu6", "gelu", "hardsigmoid", "sigmoid"})
#: Whether plans made from now on guard the activations of :data:`NAN_GUARDED` (torch eager's NaN
#: and infinity results, one read of x per call). False: fused on every call as torch.compile with
#: inductor freezing runs them (its oneDNN drops the same NaNs). ``RAWCONV_NAN_GUARD=0`` sets it at import.
NAN_GUARD: bool = bool(_env.get("RAWCONV_NAN_GUARD"))


def activation_of_post_ops(post_ops) -> str:
    """The activation a post-op chain (``[("sum", scale), ("eltwise", alg, alpha, beta)]``, as
    tuning records keep it) computes: ``"none"`` without an eltwise. Raises
    :class:`ArgumentError` for an eltwise that is none of :data:`ELTWISE`'s."""
    for op in post_ops or ():
        if op[0] == "eltwise":
            act = _BY_ALG.get(op[1])
            if act is None or tuple(float(v) for v in op[2:4]) != ELTWISE[act][1:]:
                raise ArgumentError(f"post-op {tuple(op)!r} is no activation rawconv fuses")
            return act
    return "none"


# ---------------------------------------------------------------------------- oneDNN: post-ops
class _FusedBuilt(_Built):
    """One built implementation of a :class:`FusedConvolution`. With a residual and an
    implementation whose destination layout differs from the user's (a blocked ``dst``), the
    residual is first reordered from the user's output tensor into the implementation's
    destination buffer: the ``sum`` post-op reads that buffer."""

    def __init__(self, plan: "FusedConvolution", impl, pd):
        super().__init__(plan, impl, pd)
        self.pre = None
        if plan.residual:
            from . import _ffi as _dnnl
            from ._ffi import ffi

            L = _dnnl.lib()
            for role, _arg, mem, _is_out, reorder, _buf in self.args:
                if role == "y" and reorder is not None:
                    rpd = _dnnl.reorder_pd(plan.user_md["y"], _dnnl.pd_md(pd, "dst"))
                    rprim = _dnnl.primitive(rpd)
                    umem = _dnnl.memory(plan.user_md["y"])
                    rargs = ffi.new("dnnl_exec_arg_t[2]")
                    rargs[0].arg, rargs[1].arg = L.DNNL_ARG_FROM, L.DNNL_ARG_TO
                    rargs[0].memory, rargs[1].memory = umem, mem
                    self.pre = (rprim, umem, rargs)

    def _run_now(self, stream, packed) -> None:
        # the residual's reorder runs first, under the thread count run_ptrs set for the whole call
        # (and under its lock: the residual's memory handle takes y's pointer of this call)
        if self.pre is not None:
            from . import _ffi as _dnnl

            rprim, umem, rargs = self.pre
            _dnnl.check(_set_handle_int()(umem, self._lastp[self.roles.index("y")]),
                        "dnnl_memory_set_data_handle")
            _dnnl.check(_dnnl.lib().dnnl_primitive_execute(rprim, stream, 2, rargs), "dnnl_primitive_execute",
                        self.impl.name + " (residual reorder)")
        super()._run_now(stream, packed)


class FusedConvolution(Convolution):
    """A oneDNN forward convolution plan with the bias in the primitive and post-ops for a residual
    add (``sum``) and an activation (one ``eltwise``, :data:`ELTWISE`): ``y = act(conv(x, w) + b + r)``.

    ``FusedConvolution(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
    residual=False, activation="relu", impl=None, fpmath="strict", prepack=False, threads="auto")``: arguments as
    :class:`rawconv.onednn.Convolution`; ``residual`` (bool): whether :meth:`run` takes a residual
    tensor of y's shape; ``activation``: one of :data:`rawconv.core.postops.ACTIVATIONS` (``"relu"``,
    ``"silu"``, ``"gelu"``, ``"gelu_tanh"``, ``"hardswish"``, ``"relu6"``, ``"sigmoid"``, ``"tanh"``,
    ``"hardsigmoid"``, ``"none"``). :meth:`run` ``(x, w=None, bias=None, residual=None)`` returns y in
    x's layout; an activation of :data:`NAN_GUARDED` checks first that the convolution's result is
    finite, and otherwise computes that call unfused (the module notes). ``implementations``, ``select``,
    ``autotune`` and the weight snapshot (``prepack=True``, :meth:`repack`) work as in the base
    class (the implementations are those oneDNN
    offers for the primitive WITH these post-ops). Raises :class:`ArgumentError` for bad input
    before any C call. Wraps ``dnnl_post_ops_append_sum``, ``dnnl_post_ops_append_eltwise``,
    ``dnnl_primitive_attr_set_post_ops`` and what the base class wraps.
    """

    def __init__(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, *, residual: bool = False,
                 activation: str = "relu", impl: Any = None, fpmath: str = "strict", prepack: bool = False,
                 threads: Any = "auto"):
        problem = ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups)
        check_device(problem)
        self._setup(residual, activation)
        self._init(problem, "forward", "direct", fpmath, weights_layout(w), prepack, threads=threads)
        self._x, self._w, self._b = x, w, bias
        if prepack:
            self._snapshot(w)
        if impl is not None:
            self.select(impl)

    @classmethod
    def for_problem(cls, problem: ConvProblem, *, residual: bool = False, activation: str = "relu",
                    impl: Any = None, fpmath: str = "strict", w_layout: str = "nchw",
                    prepack: bool = False, threads: Any = "auto") -> "FusedConvolution":
        """A plan from a :class:`ConvProblem` (tensors given to :meth:`run`)."""
        if not isinstance(problem, ConvProblem):
            raise ArgumentTypeError(f"problem must be a ConvProblem, got {type(problem).__name__}")
        check_device(problem)
        self = cls.__new__(cls)
        self._setup(residual, activation)
        self._init(problem, "forward", "direct", fpmath, w_layout, prepack, threads=threads)
        self._x = self._w = self._b = None
        if impl is not None:
            self.select(impl)
        return self

    def _setup(self, residual, activation):
        if not isinstance(residual, bool):
            raise ArgumentTypeError(f"residual must be True or False, got {residual!r}")
        activation = check_activation(activation)
        self.residual, self.activation = residual, activation
        ops = []
        if residual:
            ops.append(("sum", 1.0))
        if activation != "none":
            ops.append(("eltwise",) + ELTWISE[activation])
        self._post_ops = tuple(ops)
        self.nan_guard = NAN_GUARD and activation in NAN_GUARDED
        watch_optimizers()      # (once per process: the optimizer step hook the kept weight bound reads)
        self._plain = None      # the plan without the activation, for calls the guard refuses (made on first need)
        self._wbound = {}       # role -> (tensor, its version, bound): the guard's weight and bias factors
        self.unfused_calls = 0  # calls the guard ran unfused (a NaN or an infinity, or an overflow, was possible)
        self.bound_reads = 0    # calls whose x the guard read (no bound carried by x from a fused plan)

    def execute(self, x: torch.Tensor | None = None, w: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, out: torch.Tensor | None = None, *,
                grad_y: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`rawconv.onednn.Convolution.execute` with the post-ops; with a residual, ``out``
        holds it (the ``sum`` post-op reads the destination). For an activation of
        :data:`NAN_GUARDED`: when the convolution's result is not provably finite
        (:func:`rawconv.core.postops.conv_bound` of x, w, the bias and the residual), the call runs
        the convolution with bias and residual but no activation, then torch's activation on the
        result (torch's NaN and infinity semantics). The bound of max|x| is the one a fused plan
        left on x when it wrote it (:func:`rawconv.core.postops.carried_bound`: x unchanged since),
        else x's 2-norm (one read of x, counted in ``bound_reads``); the result carries its own."""
        if grad_y is not None or self._freed or self.problem.is_empty:
            return super().execute(x, w, bias, out, grad_y=grad_y)
        xx = x if x is not None else self._x
        xb = carried_bound(xx)
        if xb is None and not self.nan_guard:   # nothing to check, nothing to pass on
            y = super().execute(x, w, bias, out)
            if out is not None:
                carry_bound(y, None)
            return y
        ww = w if w is not None else (self._snap[0] if self._snap is not None else self._w)
        bb = bias if bias is not None else self._b
        bb = bb if isinstance(bb, torch.Tensor) else None
        total = self._total(xx, xb, ww, bb, out if self.residual and isinstance(out, torch.Tensor) else None)
        if self.nan_guard and not total < math.inf:
            y = self._execute_unguarded(xx, ww, bb, out)
            carry_bound(y, None)
            return y
        y = super().execute(x, w, bias, out)
        carry_bound(y, total, self.activation)
        return y

    __call__ = execute

    def _total(self, x, xb, w, b, r) -> float:
        """:func:`rawconv.core.postops.conv_bound` of this call (``xb``: x's carried bound or None);
        inf when unknown without a read and no read is due (no guard) or any input is not a tensor."""
        if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
            return math.inf
        wb, bb = self._bound("w", w, weight_bound), self._bound("b", b, vector_bound)
        rb = 0.0 if r is None else carried_bound(r)
        if xb is not None and rb is not None:
            total = conv_bound(xb, wb, bb, rb)
            if total < math.inf or not self.nan_guard:
                return total
            xb = rb = None   # carried, but too loose to prove the result finite: read both
        elif not self.nan_guard:
            return math.inf
        self.bound_reads += 1   # the guard's read of what carries no bound
        return conv_bound(vector_bound(x) if xb is None else xb, wb, bb, vector_bound(r) if rb is None else rb)

    def _bound(self, role: str, t, fn) -> float:
        """``fn(t)`` (the guard's bound of the weights or the bias), kept while ``t`` is the same
        tensor at the same version and storage and no optimizer stepped since (a frozen module's
        snapshot; ``t.data = new`` moves only the storage, a fused optimizer step neither)."""
        if t is None:
            return 0.0
        try:   # (an optimizer step: a fused one moves no version counter; watched from the plan's making)
            version = (t._version, t.data_ptr(), OPTIMIZER_EPOCH[0])
        except RuntimeError:   # an inference tensor keeps no version counter: computed on every call
            return fn(t)
        c = self._wbound.get(role)
        if c is not None and c[0] is t and c[1] == version:
            return c[2]
        b = fn(t)
        self._wbound[role] = (t, version, b)
        return b

    def _execute_unguarded(self, x, w, bias, out):
        """One call computed as ``act(conv + b + r)`` with the activation in torch: the plan
        without the eltwise post-op (the same implementation when oneDNN offers it there), then
        torch's activation in place on the result."""
        plain = self._plain
        if plain is None or plain._freed:
            plain = FusedConvolution.for_problem(self.problem, residual=self.residual, activation="none",
                                                 fpmath=self.fpmath, w_layout=self.w_layout, threads=self.threads_arg)
            plain.allow_known_bad = self.allow_known_bad
            if self._selected is not None:
                mine = self.selected
                same = [i for i in plain.implementations if i.name == mine.name and i.layouts == mine.layouts]
                if same:
                    plain.select(same[0].index, allow_known_bad=True)
            self._plain = plain
        self.unfused_calls += 1
        y = plain.execute(x, w, bias, out)
        with torch.no_grad():
            a = apply_activation(y, self.activation, inplace=True)
            if a is not y:   # (GELU has no in-place form)
                y.copy_(a)
        return y

    def free(self) -> None:
        plain, self._plain = self._plain, None
        if plain is not None:
            plain.free()
        self._wbound = {}
        super().free()

    def _build(self, i: int):
        b = self._built.get(i)
        if b is None:
            with _omp_threads(self._pd_threads()), _dnnl._cache_guard:   # as Convolution._build
                b = _FusedBuilt(self, self._impls[i], self._fresh_pd(i))
            self._built[i] = b
            self._count_rebuild(i)
        return b

    def run(self, x: torch.Tensor | None = None, w: torch.Tensor | None = None, bias: torch.Tensor | None = None,
            residual: torch.Tensor | None = None, *, inplace: bool = False) -> torch.Tensor:
        """``act(conv(x, w) + bias + residual)`` on the selected implementation; y in the plan's layout.

        ``inplace``: the result may be written into ``residual`` itself (returned then) when it is a
        dense tensor in the plan's layout that shares no memory with x, w or bias; otherwise the
        residual is copied into a new output first (the ``sum`` post-op reads the destination).
        Raises :class:`ArgumentError` when a residual is missing, unexpected or of the wrong shape/dtype."""
        p = self.problem
        if self.residual != (residual is not None):
            raise ArgumentError("this plan was built " + ("with a residual: pass residual" if self.residual
                                                           else "without a residual"))
        if p.is_empty:
            return torch_tail(torch.zeros(p.y_shape, dtype=p.torch_dtype), bias if bias is not None else self._b,
                               residual, self.activation, p)
        if residual is None:
            return self.execute(x, w, bias)
        r = check_residual(residual, p)
        if inplace and r.numel() and strides_match(r, dense_strides(p.y_shape, p.layout)) and not r.is_neg() \
                and not r.is_conj():
            try:
                _check_no_overlap(r, (("x", x if x is not None else self._x), ("w", w if w is not None else
                                                                                       self._w), ("bias", bias)))
            except ArgumentError:
                pass
            else:
                self.execute(x, w, bias, out=r)
                return residual
        y = empty_like_layout(p.y_shape, p.layout, p.torch_dtype, "cpu")
        y.copy_(r)
        carry_bound(y, carried_bound(r))   # (the copy holds what r held)
        self.execute(x, w, bias, out=y)
        return y.squeeze(0) if p.unbatched else y

    def hot_run(self, a, b, bias=None, out=None):
        """The plan contract's one call (forward: ``a, b`` = x, w) through :meth:`execute`: the NaN
        guard and the carried bound first, then the hot path where it applies."""
        return self.execute(a, b, bias, out)

    def _hot_run(self, x, w, bias, out):
        """The plain plan's hot path; with a residual only when it is given as ``out`` (the ``sum``
        post-op reads the destination; a blocked destination gets the residual reordered in first,
        by :meth:`_FusedBuilt._run_now`, under the call's lock and thread count as on the checked path)."""
        if self.residual and out is None:
            return None
        return super()._hot_run(x, w, bias, out)

    def _example_tensors(self) -> dict:
        t = super()._example_tensors()
        if self.residual:   # the sum post-op reads dst: give it defined values while timing
            t["out"] = empty_like_layout(self.problem.y_shape, self.problem.layout, self.problem.torch_dtype,
                                         "cpu").zero_()
        return t

    def __repr__(self) -> str:
        return super().__repr__().replace("onednn.Convolution", "fused.FusedConvolution")[:-1] + \
            f" residual={self.residual} activation={self.activation}>"


# every public entry point raises only rawconv's exception classes (rawconv.core.guard)
from ..core import guard as _guard  # noqa: E402

_guard.guard_module(globals(), "FusedConvolution.__init__", "FusedConvolution.for_problem", "FusedConvolution.run",
                    "FusedConvolution.execute", "FusedConvolution.__call__")
