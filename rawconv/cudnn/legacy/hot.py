"""The legacy API plan's hot path (a part of :mod:`rawconv.cudnn`, the face, which hands its names on):
:class:`_Hot`, the prepared call that :meth:`rawconv.cudnn.Convolution.execute` and the operators'
``_hot_call`` run after a checked call that passed its tensors to cuDNN as they are."""
from __future__ import annotations

from .. import _cuda, _ffi as _cudnn
from .._ffi import ffi
from ...core import guard as _guard
from .common import _ACT_FNS

FACE = "rawconv.cudnn"   # where this module's names live (rawconv.cudnn): pickles, messages

# ---------------------------------------------------------------------------- the forward hot path
class _Hot:
    """A forward plan's prepared call for :meth:`Convolution.execute`'s hot path: the tensors' pack
    (:class:`rawconv._cuda.HotArgs`), the :class:`RunInfo`, descriptors and workspace it was made
    with (it holds while they are the plan's), the stream it runs on (the default stream, whose
    workspace the plan keeps; None: any stream, for an algo that needs no workspace), the C
    function with its prepared arguments (alpha/beta pointers, descriptors, algo, workspace
    pointer and size), the bias and activation steps when they run in torch (as the checked path
    runs them), and the ``void *`` casts of the last data pointers."""

    __slots__ = ("args", "info", "descs", "ws", "stream", "index", "fn", "pre", "fused", "bd", "actd", "bview",
                 "act", "casts", "where", "data", "name")

    @classmethod
    def of(cls, plan: "Convolution", info: "RunInfo", pws, x, w, bias, y) -> "_Hot | None":
        """The pack of a checked forward call that ran one cuDNN call on ``x``, ``w``, ``bias`` (or
        None) and ``y`` as they are (the caller checks that), or None (a tensor subclass; an
        unbatched problem, whose checked path returns y without its batch dim even for an x given
        with one)."""
        if plan.problem.unbatched:
            return None
        ws = plan._ws
        if info.workspace_bytes and (ws is None or ws.data_ptr() != int(ffi.cast("uintptr_t", pws))):
            return None   # the workspace was released meanwhile (the byte budget, another thread)
        args = _cuda.HotArgs.of(x, w, bias, y, plan.device_index)
        if args is None:
            return None
        p, L = plan.problem, _cudnn.lib()
        h = cls()
        h.args, h.info, h.descs, h.ws = args, info, plan._descs, ws
        h.stream = None if not info.workspace_bytes else 0   # None: any stream (no workspace to tie it to)
        h.index = plan.device_index
        xd, wd, yd, cd = plan.descriptors(plan.inner.n)
        h.pre = (plan._alpha, xd, wd, cd, info.algo_id, pws, info.workspace_bytes, plan._beta0, yd)
        h.fused = bool(info.fused)
        if h.fused:
            h.fn, h.bd, h.actd = L.cudnnConvolutionBiasActivationForward, plan._bias_desc(), plan._act_desc()
            h.bview = h.act = None
        else:
            h.fn, h.bd, h.actd = L.cudnnConvolutionForward, None, None
            h.bview = None if bias is None else (1, -1) + (1,) * p.ndim
            h.act = None if plan.activation is None else _ACT_FNS[plan.activation]
        h.casts = (None,)
        h.where = f"algo {info.algo}, {p.describe()}"
        return h

    @classmethod
    def of_grad(cls, plan: "Convolution", info: "RunInfo", pws, a, b, out) -> "_Hot | None":
        """The pack of a checked backward call (backward data: ``a`` = grad_y, ``b`` = w, ``out`` =
        dx; backward weights: ``a`` = x, ``b`` = grad_y, ``out`` = dw) that ran one cuDNN call on
        them as they are (the caller checks that), or None (a tensor subclass, an unbatched
        problem). :meth:`run_grad` runs it."""
        if plan.problem.unbatched:
            return None
        ws = plan._ws
        if info.workspace_bytes and (ws is None or ws.data_ptr() != int(ffi.cast("uintptr_t", pws))):
            return None   # the workspace was released meanwhile (the byte budget, another thread)
        args = _cuda.HotArgs.of(a, b, None, out, plan.device_index)
        if args is None:
            return None
        L = _cudnn.lib()
        h = cls()
        h.args, h.info, h.descs, h.ws = args, info, plan._descs, ws
        h.stream = None if not info.workspace_bytes else 0
        h.index = plan.device_index
        xd, wd, yd, cd = plan.descriptors(plan.inner.n)
        h.pre = (plan._alpha, xd, wd, cd, info.algo_id, pws, info.workspace_bytes, plan._beta0, yd)
        h.data = plan.direction == "backward_data"
        h.name = "cudnnConvolutionBackwardData" if h.data else "cudnnConvolutionBackwardFilter"
        h.fn = getattr(L, h.name)
        h.fused, h.bd, h.actd, h.bview, h.act = False, None, None, None, None
        h.casts = (None,)
        h.where = f"algo {info.algo}, {plan.problem.describe()}"
        return h

    def run_grad(self, plan: "Convolution", a, b):
        """Run a backward pack (:meth:`of_grad`) when it is current and ``a``, ``b`` have exactly its
        metadata, on the workspace's stream: one ``cudnnConvolutionBackwardData`` or
        ``cudnnConvolutionBackwardFilter`` into a new dx / dw of the pack's shape and strides;
        returns it, else None (the caller takes the checked path)."""
        if not self.current(plan):
            return None
        plan.used = True   # (the byte budget's sweep: its workspace was used since the last one)
        bound = self.args.bind(a, b, None, None)
        if bound is None:
            return None
        p, out = bound
        hs = _cuda.handle_state(self.index)
        if self.stream is not None and hs.stream != self.stream:
            return None
        c = self.casts
        if c[0] != p:
            cast = ffi.cast
            c = self.casts = (p, cast("void *", p[0]), cast("void *", p[1]), None, cast("void *", p[3]))
        _, pa, pb, _, po = c
        alpha, xd, wd, cd, algo, pws, nws, beta, yd = self.pre
        with plan._launch_lock if self.stream is not None else _cuda.NO_LOCK:   # (Algorithms._launching)
            if self.data:   # (w, grad_y) -> dx
                st = self.fn(hs.ptr, alpha, wd, pb, yd, pa, cd, algo, pws, nws, beta, xd, po)
            else:           # (x, grad_y) -> dw
                st = self.fn(hs.ptr, alpha, xd, pa, yd, pb, cd, algo, pws, nws, beta, wd, po)
        if st:
            raise _cudnn.error(st, self.name, self.where)
        return out

    def current(self, plan: "Convolution") -> bool:
        """Whether the plan still runs what this pack was made with (select, autotune, a new
        workspace or free() make it stale)."""
        return self.info is plan._info and self.descs is plan._descs and self.ws is plan._ws and not plan._freed

    def run(self, plan: "Convolution", x, w, bias, out):
        """Run when the pack is current and the tensors have exactly its metadata
        (:meth:`rawconv._cuda.HotArgs.bind`) on the workspace's stream: one
        ``cudnnConvolutionForward`` (then bias and activation in torch, as the checked path) or
        ``cudnnConvolutionBiasActivationForward``; returns y (or ``out``), else None (the caller
        takes the checked path)."""
        if not self.current(plan):
            return None
        plan.used = True   # (the byte budget's sweep: its workspace was used since the last one)
        if bias is None:
            bias = plan._b
        bound = self.args.bind(plan._x if x is None else x, plan._w if w is None else w, bias, out)
        if bound is None:
            return None
        a, y = bound
        hs = _cuda.handle_state(self.index)
        if self.stream is not None and hs.stream != self.stream:
            return None   # another stream: the checked path takes a workspace for this call
        c = self.casts   # (pointers, their casts): read and replaced as one object
        if c[0] != a:
            cast = ffi.cast
            c = self.casts = (a, cast("void *", a[0]), cast("void *", a[1]), cast("void *", a[2]),
                              cast("void *", a[3]))
        _, px, pw, pb, py = c
        alpha, xd, wd, cd, algo, pws, nws, beta, yd = self.pre
        lock = plan._launch_lock if self.stream is not None else _cuda.NO_LOCK   # (Algorithms._launching)
        if self.fused:
            with lock:
                st = self.fn(hs.ptr, alpha, xd, px, wd, pw, cd, algo, pws, nws, beta, yd, py, self.bd, pb,
                             self.actd, yd, py)
            if st:
                return None   # the checked path: the unfused fallback, or cuDNN's error
        else:
            with lock:
                st = self.fn(hs.ptr, alpha, xd, px, wd, pw, cd, algo, pws, nws, beta, yd, py)
            if st:
                raise _cudnn.error(st, "cudnnConvolutionForward", self.where)
            if self.bview is not None:   # (detached: execute records no autograd, as the fused kernel)
                y.add_((bias.detach() if bias.requires_grad else bias).view(self.bview))
            if self.act is not None:
                self.act(y)
        if out is not None:
            _guard.bump((out,))   # written in place, as torch's out= functions do
        return y


_Hot.__module__ = FACE
