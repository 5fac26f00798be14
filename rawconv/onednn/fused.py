"""oneDNN's fused convolution: a forward primitive with the bias inside it and the post-ops ``sum``
(a residual) then ``eltwise_relu``, ``y = act(conv(x, w) + b + r)``: :class:`FusedConvolution`, the plan
behind :func:`rawconv.fused.conv_bias_act` on CPU (what the torch operator and the frozen modules of
``rawconv.nn.convert(..., fuse=True)`` run)."""
from __future__ import annotations

from typing import Any

import torch

from .. import onednn
from ..core.errors import ArgumentError, ArgumentTypeError
from ..core.postops import _check_activation, _check_residual, _torch_tail
from ..core.problem import ConvProblem, dense_strides, empty_like_layout, strides_match

__all__ = ["FusedConvolution"]


# ---------------------------------------------------------------------------- oneDNN: post-ops
class _FusedBuilt(onednn._Built):
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
            _dnnl.check(onednn._set_handle_int()(umem, self._lastp[self.roles.index("y")]),
                        "dnnl_memory_set_data_handle")
            _dnnl.check(_dnnl.lib().dnnl_primitive_execute(rprim, stream, 2, rargs), "dnnl_primitive_execute",
                        self.impl.name + " (residual reorder)")
        super()._run_now(stream, packed)


class FusedConvolution(onednn.Convolution):
    """A oneDNN forward convolution plan with the bias in the primitive and post-ops for a residual
    add (``sum``) and an activation (``eltwise_relu``): ``y = act(conv(x, w) + b + r)``.

    ``FusedConvolution(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
    residual=False, activation="relu", impl=None, fpmath="strict", prepack=False, threads="auto")``: arguments as
    :class:`rawconv.onednn.Convolution`; ``residual`` (bool): whether :meth:`run` takes a residual
    tensor of y's shape; ``activation``: ``"relu"`` or ``"none"``. :meth:`run` ``(x, w=None,
    bias=None, residual=None)`` returns y in x's layout. ``implementations``, ``select``,
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
        onednn._check_device(problem)
        self._setup(residual, activation)
        self._init(problem, "forward", "direct", fpmath, onednn._w_layout(w), prepack, threads=threads)
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
        onednn._check_device(problem)
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
        activation = _check_activation(activation)
        self.residual, self.activation = residual, activation
        ops = []
        if residual:
            ops.append(("sum", 1.0))
        if activation == "relu":
            ops.append(("eltwise", "relu", 0.0, 0.0))
        self._post_ops = tuple(ops)

    def _build(self, i: int):
        b = self._built.get(i)
        if b is None:
            with onednn._omp_threads(self._pd_threads()):   # as Convolution._build: the primitive cache's key
                b = _FusedBuilt(self, self._impls[i], self._pds[i])
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
            return _torch_tail(torch.zeros(p.y_shape, dtype=p.torch_dtype), bias if bias is not None else self._b,
                               residual, self.activation, p)
        if residual is None:
            return self.execute(x, w, bias)
        r = _check_residual(residual, p)
        if inplace and r.numel() and strides_match(r, dense_strides(p.y_shape, p.layout)) and not r.is_neg() \
                and not r.is_conj():
            try:
                onednn._check_no_overlap(r, (("x", x if x is not None else self._x), ("w", w if w is not None else
                                                                                       self._w), ("bias", bias)))
            except ArgumentError:
                pass
            else:
                self.execute(x, w, bias, out=r)
                return residual
        y = empty_like_layout(p.y_shape, p.layout, p.torch_dtype, "cpu")
        y.copy_(r)
        self.execute(x, w, bias, out=y)
        return y.squeeze(0) if p.unbatched else y

    def _hot_run(self, x, w, bias, out):
        """The plain plan's hot path skips the residual's reorder into a blocked destination that
        the ``sum`` post-op reads: plans with a residual always take the checked path."""
        if self.residual:
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

_guard.guard_module(globals(), "FusedConvolution.__init__", "FusedConvolution.for_problem", "FusedConvolution.run")
