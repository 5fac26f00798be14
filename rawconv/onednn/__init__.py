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

import contextlib
import itertools
import logging
import math
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
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

FPMATH_MODES = {"strict": 0, "bf16": 1, "f16": 2, "any": 3, "tf32": 4}
ALGORITHMS = {"direct": "dnnl_convolution_direct", "winograd": "dnnl_convolution_winograd",
              "auto": "dnnl_convolution_auto"}
DTYPES = ("float32", "bfloat16", "float16")

# role -> (exec arg name, primitive-descriptor query, is output)
_ARGS = {
    "forward": [("x", "SRC", "src", False), ("w", "WEIGHTS", "weights", False),
                ("b", "BIAS", "weights:1", False), ("y", "DST", "dst", True)],
    "backward_data": [("dy", "DIFF_DST", "diff_dst", False), ("w", "WEIGHTS", "weights", False),
                      ("dx", "DIFF_SRC", "diff_src", True)],
    "backward_weights": [("x", "SRC", "src", False), ("dy", "DIFF_DST", "diff_dst", False),
                         ("dw", "DIFF_WEIGHTS", "diff_weights", True),
                         ("db", "DIFF_BIAS", "diff_weights:1", True)],
}
_ROLE_NAMES = {"x": "src", "w": "weights", "b": "bias", "y": "dst", "dy": "diff_dst", "dx": "diff_src",
               "dw": "diff_weights", "db": "diff_bias"}


@dataclass(frozen=True, repr=False)
class Implementation(Candidate):
    """One implementation oneDNN offers for a problem.

    ``index``: position in rawconv's list (oneDNN's order for ``format_tag any``, then the
    implementations that take the tensors' own src/dst layout); ``name``: oneDNN's
    implementation string (``dnnl_query_impl_info_str``); ``layouts``: ``"any"`` or ``"user"``
    (src/dst fixed to the tensors' layout, weights ``any``); ``formats``: the layout each tensor
    gets (oneDNN verbose notation: ``abcd`` = NCHW, ``acdb`` = NHWC, ``aBcd16b`` = blocked);
    ``reorders``: tensors converted on every call (weights only once when prepacked);
    ``scratchpad_bytes``: the scratchpad it needs, in bytes; ``known_bad``: the public issue
    (:mod:`rawconv.known_bad`) when this implementation is known to crash, hang or give wrong
    results for this problem, else ""; ``status``/``detail``: set by
    ``implementations(..., isolate=True)`` (``"ok"``, ``"wrong"``, ``"crashed: SIGSEGV"``,
    ``"timed out after 60 s"``, ``"not supported"``, ``"known bad"``, ``"failed"``), else "".
    """

    index: int
    name: str
    layouts: str
    formats: dict = field(compare=False)
    reorders: tuple = ()
    scratchpad_bytes: int = 0
    direction: str = "forward"
    known_bad: str = field(default="", compare=False)
    status: str = field(default="", compare=False)
    detail: str = field(default="", compare=False)

    backend = "onednn"

    @property
    def choice(self) -> str:
        """The stable name :meth:`Convolution.select` and ``choice=`` take: ``"name@layouts"``,
        e.g. ``"brgconv:avx2@any"`` (oneDNN's names repeat across layouts)."""
        return f"{self.name}@{self.layouts}"

    @property
    def workspace_bytes(self) -> int:
        """The scratchpad (oneDNN's word for the workspace) in bytes."""
        return self.scratchpad_bytes

    @property
    def notes(self) -> tuple:
        fm = " ".join(f"{_ROLE_NAMES.get(k, k)}={v}" for k, v in self.formats.items())
        ro = ",".join(_ROLE_NAMES.get(r, r) for r in self.reorders) or "none"
        return (f"layouts={self.layouts}", fm, f"reorders={ro}")

    def __str__(self) -> str:
        fm = " ".join(f"{_ROLE_NAMES.get(k, k)}={v}" for k, v in self.formats.items())
        ro = ",".join(_ROLE_NAMES.get(r, r) for r in self.reorders) or "none"
        out = (f"[{self.index}] {self.name:<28} layouts={self.layouts:<4} {fm}  reorders={ro}  "
               f"scratchpad={self.scratchpad_bytes} B")
        if self.known_bad:
            out += f"  KNOWN BAD: {self.known_bad}"
        if self.status:
            out += f"  status={self.status}" + (f" ({self.detail})" if self.detail and self.status != "ok" else "")
        return out


class TimedImplementation(Result):
    """A row of :meth:`Convolution.autotune`: a :class:`rawconv.results.Result` of the oneDNN
    backend, built with this row type's older constructor (``impl``, times in ms, ``runs``).

    ``status``: ``"ok"`` for a timed row; rows that were not timed follow the timed ones with
    NaN times and ``"known bad"`` (skipped), or, with ``isolate=True``, ``"crashed: SIGSEGV"``,
    ``"timed out after N s"``, ``"wrong"`` (outside tolerance vs float64), ``"not supported"``,
    ``"failed"``; ``detail`` says more."""

    def __init__(self, impl: "Implementation", median_ms: float, min_ms: float, runs: int, status: str = "ok",
                 detail: str = "", *, problem: ConvProblem | None = None):
        Result.__init__(self, "onednn", impl.choice, problem, impl.direction, impl, status, median_ms, min_ms, runs,
                        None, impl.scratchpad_bytes, detail, detail if status != "ok" else "")

    def __str__(self) -> str:
        if self.status != "ok":
            return f"{self.impl.name:<28} ({self.impl.layouts}) {self.status}" + (f": {self.detail}" if self.detail else "")
        return (f"{self.impl.name:<28} ({self.impl.layouts}) median {self.median_ms:.4f} ms  min {self.min_ms:.4f} ms"
                f"  median/min {self.spread:.2f}")


def _warn_timings(monitor, rows) -> list[str]:
    """``warnings.warn`` a line for each thing against autotune's timed rows: for rows timed in
    interleaved rounds, what the rounds measured (:func:`rawconv.results.reliability`: rows that
    waited for a CPU in most rounds, rounds that disagree); for rows timed in a child process,
    :func:`rawconv.bench.timing_warnings` (``monitor`` None there: the child's CPU time would read
    as another process's). Returns the lines (the tuning record keeps them)."""
    import warnings

    from ..core.bench import TimingWarning, timing_warnings

    if rows and all(isinstance(r.extra.get("rounds"), dict) for r in rows):
        # timed in interleaved rounds: flagged by what the rounds measured (rawconv.results.reliability)
        from ..core.results import reliability

        lines = reliability(rows)["warnings"]
    else:
        lines = timing_warnings(monitor.report() if monitor is not None else None, [r.spread for r in rows])
    for line in lines:
        warnings.warn(f"Convolution.autotune: {line}", TimingWarning, stacklevel=_guard.stacklevel())
    return lines


# ---------------------------------------------------------------------------- helpers


def weights_layout(w: torch.Tensor) -> str:
    """The layout oneDNN is told the user's weights ``w`` have: ``"nhwc"`` (channels last, for
    ``w`` of 3 or more dims that is channels last and not also contiguous), else ``"nchw"``."""
    return "nhwc" if w.dim() >= 3 and layout_of(w) == "nhwc" and not w.is_contiguous() else "nchw"


def _weights_md(p: ConvProblem, layout: str):
    """User weights md: (K, C/g, *k) or, grouped, (G, K/g, C/g, *k) with the same strides."""
    shape = list(p.w_shape)
    st = dense_strides(shape, layout)
    if p.groups > 1:
        g = p.groups
        shape = [g, shape[0] // g] + shape[1:]
        st = [st[0] * (p.k // g)] + st
    return _dnnl.md_strides(shape, p.dtype, st), shape


def _weights_any_md(p: ConvProblem):
    shape = list(p.w_shape)
    if p.groups > 1:
        shape = [p.groups, shape[0] // p.groups] + shape[1:]
    return _dnnl.md_tag(shape, p.dtype, "any")


def _ptr(t: torch.Tensor):
    return ffi.cast("void *", t.data_ptr())


def _check_choice(value, choices, name: str):
    """``value`` if it is one of ``choices`` (a str key), else ArgumentTypeError/ArgumentError."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be one of {list(choices)}, got {type(value).__name__}")
    if value not in choices:
        raise ArgumentError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def check_fpmath(fpmath: str) -> int:
    """oneDNN's ``dnnl_fpmath_mode_t`` value of ``fpmath`` (one of :data:`FPMATH_MODES`); raises
    :class:`ArgumentTypeError` / :class:`ArgumentError` otherwise."""
    return FPMATH_MODES[_check_choice(fpmath, FPMATH_MODES, "fpmath")]


def _check_algorithm(algorithm: str) -> str:
    return _check_choice(algorithm, ALGORITHMS, "algorithm")


def _words(impl, choice, fpmath, precision, options, allow_known_bad):
    """rawconv's words (``choice``, ``precision``, ``options``) as oneDNN's (``impl``, ``fpmath``,
    ``allow_known_bad``); both of a pair given must agree. ``precision`` and the fpmath mode share
    their values ("strict", "bf16", "f16", "tf32", "any")."""
    if choice is not None:
        if impl is not None and impl != choice:
            raise ArgumentError(f"choice={choice!r} and impl={impl!r} disagree; pass one (impl is oneDNN's word)")
        impl = choice
    if options is not None:
        from ..core.options import options_of

        opt = options_of(options)
        if precision is None and opt.precision != "strict":
            precision = opt.precision
        allow_known_bad = allow_known_bad or opt.allow_known_bad
    if precision is not None:
        from ..core.options import PRECISIONS

        if precision not in PRECISIONS:
            raise ArgumentError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
        if fpmath != "strict" and fpmath != precision:
            raise ArgumentError(f"precision={precision!r} and fpmath={fpmath!r} disagree; pass one (fpmath is "
                                f"oneDNN's word)")
        fpmath = precision
    return impl, fpmath, allow_known_bad


def _check_direction(direction: str) -> str:
    return _check_choice(direction, _ARGS, "direction")


def _check_allow(allow_known_bad) -> bool:
    if not isinstance(allow_known_bad, bool):
        raise ArgumentTypeError(f"allow_known_bad must be True or False, got {allow_known_bad!r}")
    return allow_known_bad


_VERSION: list = []


def library_version() -> str:
    """The loaded oneDNN's version string ("3.2.0"), asked once (loads the library)."""
    if not _VERSION:
        _VERSION.append(_dnnl.version()["version"])
    return _VERSION[0]


def _check_impl(impl: Any):
    """``impl`` as :meth:`Convolution.select` takes it: None, an int (numpy integers too), a name
    string or an :class:`Implementation`. Raises :class:`ArgumentError` for anything else."""
    if impl is None or type(impl) is int or isinstance(impl, (str, Implementation)):
        return impl
    i = int_arg(impl)
    if i is None:
        raise ArgumentError(f"impl must be None, an int position, a name string or an Implementation, got {impl!r}")
    return i


_check_no_overlap = _guard.check_no_overlap    # out= must not share memory with an input
_check_out = _guard.check_out                  # torch's out= rules (autograd, inference tensors, overlap)


def _ambiguous(shape: Sequence[int]) -> bool:
    """True when a dense tensor of ``shape`` has the same strides in NCHW and NHWC (one channel,
    or all spatial sizes and the batch 1): its layout cannot be told from its strides."""
    if len(shape) < 3:
        return True
    a, b = dense_strides(shape, "nchw"), dense_strides(shape, "nhwc")
    return all(s == 1 or u == v for s, u, v in zip(shape, a, b))


def _backward_data_layout(grad_y, problem: ConvProblem, w: torch.Tensor) -> str:
    """The layout of a backward-data problem (dx's): torch's rule, channels last when grad_y or w is
    (:func:`rawconv.problem.backward_data_layout`). ``grad_y``: the batched tensor, or a layout
    name (``"nchw"``/``"nhwc"``) for a dense grad_y of the problem's y shape in it
    (:func:`implementations` passes the forward's). A y shape whose strides cannot tell NCHW from
    NHWC (:func:`_ambiguous`) counts as NCHW there: what ``to_layout`` and torch's
    ``.contiguous(memory_format=...)`` leave such a contiguous grad_y as."""
    if isinstance(grad_y, str):
        lay = "nchw" if _ambiguous(problem.y_shape) else grad_y
        grad_y = torch.empty_strided(problem.y_shape, dense_strides(problem.y_shape, lay),
                                     dtype=problem.torch_dtype, device="meta")
    return backward_data_layout(grad_y, w)


# ---------------------------------------------------------------------------- one built implementation
_GUARD_BYTE = 0xA5


class _Built:
    """The primitive of one implementation plus its reorders, memory objects and buffers."""

    #: bytes of guard band after the scratchpad and after each reorder buffer, filled with
    #: ``_GUARD_BYTE`` (0 here; an isolation child, :mod:`rawconv.onednn.isolated`, sets it so that a
    #: write past the end of memory rawconv hands the library, as oneDNN issue #6035's past its
    #: scratchpad, is counted by :meth:`overruns` and lands in memory rawconv owns, not in the heap,
    #: where it would surface as a crash of some later candidate)
    guard_bytes = 0

    def _buffer(self, nbytes: int, name: str) -> torch.Tensor:
        """A byte buffer of ``nbytes`` for the library, followed by :attr:`guard_bytes` of guard band
        (registered under ``name`` for :meth:`overruns`) when that is set."""
        g = _Built.guard_bytes if nbytes else 0
        buf = torch.empty(max(nbytes, 1) + g, dtype=torch.uint8)
        if g:
            buf[nbytes:].fill_(_GUARD_BYTE)
            self._guarded.append((name, buf, nbytes))
        return buf

    def overruns(self) -> list:
        """``[(buffer, bytes)]``: how far past the end of each guarded buffer the primitive or its
        reorders wrote (the offset of the last changed guard byte plus one), for the buffers whose
        guard changed; ``buffer``: ``"<size> B scratchpad"`` or ``"<size> B reorder buffer of <role>"``."""
        out = []
        for name, t, n in self._guarded:
            changed = (t[n:] != _GUARD_BYTE).nonzero()
            if changed.numel():
                out.append((f"{n} B {name}", int(changed[-1, 0]) + 1))
        return out

    def __init__(self, plan: "Convolution", impl: Implementation, pd):
        L = _dnnl.lib()
        self.impl = impl
        self.pd = pd
        self._owner = weakref.ref(plan)   # (for _cache_release; the plan holds this object)
        self.used = True   # run since the last sweep of the cache limit (rawconv.core.plans)
        self.prim = _dnnl.primitive(pd)
        self.args = []          # (role, arg id, memory, is_output, reorder or None, buffer or None)
        self._guarded = []      # (name, buffer, size in bytes): the buffers with a guard band after them
        for role, arg, query, is_out in _ARGS[plan.direction]:
            if role in ("b", "db") and not plan.problem.has_bias:
                continue
            q, _, idx = query.partition(":")
            md = _dnnl.pd_md(pd, q, int(idx or 0))
            user_md = plan.user_md[role]
            mem = _dnnl.memory(md)
            reorder = buf = None
            if not _dnnl.md_equal(md, user_md):
                buf = self._buffer(_dnnl.md_size(md), f"reorder buffer of {role}")
                _dnnl.call("dnnl_memory_set_data_handle", mem, _ptr(buf))
                src_md, dst_md = (md, user_md) if is_out else (user_md, md)
                rpd = _dnnl.reorder_pd(src_md, dst_md)
                rprim = _dnnl.primitive(rpd)
                umem = _dnnl.memory(user_md)
                rargs = ffi.new("dnnl_exec_arg_t[2]")
                rargs[0].arg, rargs[1].arg = L.DNNL_ARG_FROM, L.DNNL_ARG_TO
                rargs[0].memory, rargs[1].memory = (mem, umem) if is_out else (umem, mem)
                reorder = (rprim, umem, rargs)
            self.args.append((role, getattr(L, "DNNL_ARG_" + arg), mem, is_out, reorder, buf))
        sp_md = _dnnl.pd_md(pd, "scratchpad")
        sp_bytes = _dnnl.md_size(sp_md)
        self.scratchpad = self._buffer(sp_bytes, "scratchpad")
        self.scratchpad_bytes = sp_bytes
        sp_mem = _dnnl.memory(sp_md, _ptr(self.scratchpad))
        # no scratchpad argument when none is needed (oneDNN's verbose check flags it as unused)
        n = len(self.args) + (1 if sp_bytes else 0)
        self.exec_args = ffi.new(f"dnnl_exec_arg_t[{n}]")
        for i, (role, arg, mem, *_rest) in enumerate(self.args):
            self.exec_args[i].arg = arg
            self.exec_args[i].memory = mem
        if sp_bytes:
            self.exec_args[n - 1].arg = L.DNNL_ARG_SCRATCHPAD
            self.exec_args[n - 1].memory = sp_mem
        self._keep = (sp_mem,)
        self.nargs = n
        # the snapshot generation (Convolution._snap) whose weights the reorder buffer holds; None when
        # it holds none or the weights of a call that passed its own w (reordered again next call)
        self.packed = None
        # the hot path's prepared argument pack: per user tensor (in self.args order) the memory whose
        # handle takes its pointer, the reorder to run (before the primitive for inputs, after it for
        # outputs), and the pointer set last time (an unchanged pointer needs no call)
        self.roles = tuple(a[0] for a in self.args)
        self._steps = tuple((mem if reorder is None else reorder[1], is_out, role == "w",
                             None if reorder is None else reorder[0], None if reorder is None else reorder[2])
                            for role, _arg, mem, is_out, reorder, _buf in self.args)
        self._post = tuple((rp, ra) for _m, is_out, _w, rp, ra in self._steps if is_out and rp is not None)
        # the pointer-keyed fast path (run_ptrs): the memories whose handles take the user tensors'
        # pointers, the input reorders (w's flagged: a snapshot's is skipped while the buffer holds it)
        self._mems = tuple(st[0] for st in self._steps)
        self._pre = tuple((rp, ra, is_w) for _m, is_out, is_w, rp, ra in self._steps if not is_out and rp is not None)
        self._lastp = None
        self._lock = threading.Lock()   # run_ptrs: one call at a time (see there)
        self._set_handle = _set_handle_int()
        self._execute = L.dnnl_primitive_execute
        # oneDNN's CPU streams execute synchronously except with the threadpool runtime
        self._wait = int(L.dnnl_version().cpu_runtime) not in (1, 2, 4)
        # reorders of fewer than _INLINE_ELEMENTS elements run on the calling thread alone (what
        # torch's at::parallel_for does below its grain size): an OpenMP team's start and barrier
        # cost more than such a copy. A reorder only moves data, so its result is the same on any
        # number of threads; the convolution primitive itself runs on the plan's count (below).
        # The plan's fixed thread count (Convolution.threads): every call runs under it
        self._nthr = plan.threads
        # a threads=None plan: the caller's count, but never more than its descriptors were created
        # under (their scratchpad and thread partition are sized for that many threads)
        self._cap = plan._pd_threads() if plan.threads is None else None
        self._ctl = _dnnl.omp_thread_controls() if plan.threads is not None or self._cap is not None else None
        self._omp = None
        if self._pre or self._post:
            small = all(_dnnl.md_size(plan.user_md[role]) < _INLINE_ELEMENTS * plan.problem.torch_dtype.itemsize
                        for role, _a, _m, _o, reorder, _b in self.args if reorder is not None)
            # (a one-thread plan's reorders already run on one thread: nothing to set around them)
            self._omp = _dnnl.omp_thread_controls() if small and plan.threads != 1 else None
        # the buffers count against the plans' byte budget (rawconv.core.plans.charge): past it the
        # least recently used built implementations of any plan are released (_cache_release)
        self.nbytes = sum(int(b.numel()) for *_r, b in self.args if b is not None) + int(self.scratchpad.numel())
        _plans.charge(self, self.nbytes)

    def _cache_release(self) -> None:
        """Drop this built implementation from its plan (past the plans' byte budget, or
        :func:`rawconv.clear_caches`): its buffers and primitive go once no call is running on them;
        the plan builds the implementation again at its next call."""
        plan = self._owner()
        if plan is None:
            return
        i = self.impl.index
        if plan._built.get(i) is self:
            plan._built.pop(i, None)
            plan._released.add(i)
        for name in ("_hot", "_ghot"):
            pack = getattr(plan, name, None)
            if pack is not None and pack.built is self:
                setattr(plan, name, None)

    def run(self, tensors: dict, stream, packed=None) -> None:
        """Run on ``tensors`` (role -> prepared tensor): see :meth:`run_list`."""
        self.run_list([tensors[r] for r in self.roles], stream, packed)

    def run_list(self, ts, stream, packed=None) -> None:
        """Run on the prepared tensors ``ts``, one per role of :attr:`roles` (checked by the caller:
        shape, dtype, strides, device): :meth:`run_ptrs` on their data pointers."""
        self.run_ptrs(tuple([t.data_ptr() for t in ts]), stream, packed)

    def run_ptrs(self, ptrs: tuple, stream, packed=None) -> None:
        """Run on the tensors whose data pointers are ``ptrs`` (a tuple of ints, one per role of
        :attr:`roles`; the caller checked the tensors: shape, dtype, strides, device, and keeps them
        alive during the call). Sets each user memory's handle when its pointer differs from the
        last call's (one tuple comparison when none does), runs the input reorders, the primitive,
        then the output reorders. ``packed``: the generation of the plan's weight snapshot when the
        w pointer is that snapshot's (its reorder then runs once, not again while the buffer holds
        it), else None (the weights are reordered on this call: a caller's tensor may have changed
        in any way since the last). The plan's fixed thread count (:attr:`Convolution.threads`) is set
        around the call; a ``threads=None`` plan runs on the caller's count, at most the count its
        descriptors were listed under. Reorders of small tensors run on the calling thread alone
        (OpenMP's thread count set to 1 around them, then restored). Wraps
        ``dnnl_memory_set_data_handle``, ``dnnl_primitive_execute``, ``omp_set_num_threads`` (and
        ``dnnl_stream_wait`` for an asynchronous runtime). Thread-safe: calls from several threads
        run one at a time (a lock per built implementation; the memory handles, reorder buffers
        and scratchpad are shared state), so a plan shared by threads gives every caller its own
        right result (an uncontended lock: 0.15-0.2 us a call on a 2-core EPYC)."""
        lock = self._lock   # one call at a time: the handles, reorder buffers and scratchpad are this object's
        lock.acquire()
        try:
            self.used = True
            lastp = self._lastp
            if ptrs != lastp:
                self._lastp = None   # until every handle is set (a failure leaves them to be set again)
                set_handle = self._set_handle
                i = 0
                for mem in self._mems:
                    ptr = ptrs[i]
                    if lastp is None or ptr != lastp[i]:
                        st = set_handle(mem, ptr)
                        if st:
                            _dnnl.check(st, "dnnl_memory_set_data_handle")
                    i += 1
                self._lastp = ptrs
            fixed = self._nthr
            if fixed is not None or self._cap is not None:
                ctl = self._ctl
                caller = ctl[0]()
                if fixed is None:
                    fixed = min(caller, self._cap)
                if caller != fixed:
                    ctl[1](fixed)
                    try:
                        self._run_now(stream, packed)
                    finally:
                        ctl[1](caller)
                    return
            self._run_now(stream, packed)
        finally:
            lock.release()

    def _run_now(self, stream, packed) -> None:
        execute = self._execute
        omp = self._omp
        nthr = 1
        if omp is not None:
            nthr = omp[0]()
        pre = self._pre
        if pre:
            if nthr > 1:
                omp[1](1)
            try:
                for rprim, rargs, is_w in pre:
                    if is_w:
                        if packed is not None and self.packed == packed:
                            continue
                        self.packed = None
                    st = execute(rprim, stream, 2, rargs)
                    if st:
                        _dnnl.check(st, "dnnl_primitive_execute", self.impl.name + " (reorder)")
                    if is_w:
                        self.packed = packed
            finally:
                if nthr > 1:
                    omp[1](nthr)
        st = execute(self.prim, stream, self.nargs, self.exec_args)
        if st:
            _dnnl.check(st, "dnnl_primitive_execute", self.impl.name)
        post = self._post
        if post:
            if nthr > 1:
                omp[1](1)
            try:
                for rprim, rargs in post:
                    st = execute(rprim, stream, 2, rargs)
                    if st:
                        _dnnl.check(st, "dnnl_primitive_execute", self.impl.name + " (reorder)")
            finally:
                if nthr > 1:
                    omp[1](nthr)
        if self._wait:
            _dnnl.check(_dnnl.lib().dnnl_stream_wait(stream), "dnnl_stream_wait")


_INLINE_ELEMENTS = 32768   # torch's at::internal::GRAIN_SIZE: below it, torch's loops run on one thread
INLINE_FLOPS = 1 << 17    # threads="auto": a problem of fewer FLOPs runs on one thread (see plan_threads)


_MAX_THREADS = 2**31 - 1   # omp_set_num_threads(int)


def _check_threads(threads):
    """``threads`` as given to a plan: ``"auto"``, None or a positive int that fits a C int."""
    if threads is None or (isinstance(threads, str) and threads == "auto"):
        return threads
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise ArgumentTypeError(f"threads must be 'auto', None or a positive int, got {threads!r}")
    if threads < 1 or threads > _MAX_THREADS:
        raise ArgumentError(f"threads must be 'auto', None or a positive int (at most {_MAX_THREADS}: "
                            f"omp_set_num_threads takes a C int), got {threads}")
    return threads


def plan_threads(threads, problem: ConvProblem) -> int | None:
    """The OpenMP thread count a plan creates and runs its primitives with, or None for the
    calling thread's count at each call (torch's ``torch.get_num_threads()`` on the main thread).

    ``"auto"``: 1 for a problem of fewer than ``INLINE_FLOPS`` (2**17) FLOPs, else None. Such a
    convolution takes a few microseconds on one core, about what an OpenMP team's start and
    barrier cost on a many-core CPU (torch runs its own loops inline below a grain size for the
    same reason). An int: that count. Raises :class:`NotSupportedError` for an int when libdnnl
    is not an OpenMP build (its thread count cannot be set per plan then)."""
    if threads is None:
        return None
    omp = _dnnl.omp_thread_controls()
    if threads == "auto":
        return 1 if omp is not None and problem.flops < INLINE_FLOPS else None
    if omp is None:
        raise NotSupportedError(f"threads={threads}: this libdnnl is not an OpenMP build, so rawconv cannot set its "
                                f"thread count per plan; pass threads=None")
    return threads


def _threads_text(threads) -> str:
    return "caller's" if threads is None else str(threads)


@contextlib.contextmanager
def _omp_threads(n: int | None):
    """OpenMP's thread count set to ``n`` on the calling thread for the block, then restored
    (nothing when ``n`` is None or already in force). Wraps ``omp_set_num_threads``."""
    ctl = _dnnl.omp_thread_controls() if n is not None else None
    caller = ctl[0]() if ctl is not None else None
    if ctl is None or caller == n:
        yield
        return
    ctl[1](n)
    try:
        yield
    finally:
        ctl[1](caller)


_SET_HANDLE = []
_SNAP_GENERATION = itertools.count(1)   # weight snapshots' generations (a reorder buffer holds at most one)
_PLAIN = (torch.Tensor, torch.nn.Parameter)   # tensor types the hot path takes as they are
_increment_version = torch._C._increment_version


class _Hot:
    """A forward plan's prepared argument pack for :meth:`Convolution.execute`'s hot path: the
    selected implementation (index, built primitive), each tensor's (shape, strides, dtype) as the
    caller passed it (``b`` None without a bias), y's shape and strides, and the byte extents used
    to reject an ``out`` that overlaps an input."""

    __slots__ = ("index", "built", "x", "w", "b", "y_shape", "y_strides", "ext", "fit")

    @classmethod
    def of(cls, plan: "Convolution", built: "_Built", x, w, bias) -> "_Hot | None":
        """The pack, or None when a tensor was not used as it is (a copy was made) or is a subclass."""
        p = plan.problem
        if not all(type(t) in _PLAIN for t in (x, w)) or (bias is not None and type(bias) not in _PLAIN):
            return None
        xb = x.unsqueeze(0) if p.unbatched and x.dim() == p.ndim + 1 else x
        if tuple(xb.shape) != p.x_shape or tuple(w.shape) != p.w_shape or x.is_neg() or w.is_neg() \
                or not strides_match(xb, plan._user_strides["x"]) or not strides_match(w, plan._user_strides["w"]):
            return None
        if bias is not None and (tuple(bias.shape) != (p.k,) or bias.is_neg() or not strides_match(bias, [1])):
            return None
        h = cls()
        h.index, h.built = plan._selected, built
        h.x, h.w = (x.shape, x.stride(), x.dtype), (w.shape, w.stride(), w.dtype)
        h.b = (bias.shape, bias.stride(), bias.dtype) if bias is not None else None
        y = empty_like_layout(p.y_shape, p.layout, p.torch_dtype, "cpu")   # what the checked path returns
        y = y.squeeze(0) if p.unbatched else y
        h.y_shape, h.y_strides = y.shape, y.stride()
        h.ext = tuple(_extent(t) for t in (x, w, bias, y))
        h.fit = None   # the last data pointers (x, w, [bias,] out) found not to overlap (see Convolution._hot_run)
        return h

    def overlaps(self, ptrs) -> bool:
        """Whether out shares memory with x, w or bias, from their data pointers ``ptrs``
        ``(x, w, [bias,] out)`` and the packed byte extents (the tensors have the pack's shapes and
        strides, so the pointers alone decide)."""
        eo = self.ext[3]
        if not eo:
            return False
        o = ptrs[-1]
        for q, e in zip(ptrs[:-1], self.ext):
            if e and q < o + eo and o < q + e:
                return True
        return False


_GRAD_ROLES = {"backward_data": ("dy", "w", "dx"), "backward_weights": ("x", "dy", "dw")}


class _GradHot:
    """A backward plan's prepared argument pack for :meth:`Convolution._grad_hot_run`: the selected
    implementation (index, built primitive), the two inputs' (shape, strides, dtype) as the caller
    passed them (backward data: grad_y, w; backward weights: x, grad_y), the output's shape and
    strides (dx or dw), db's shape when the plan has a bias, and the primitive's role order."""

    __slots__ = ("index", "built", "a", "b", "out_shape", "out_strides", "db", "order", "roles")

    @classmethod
    def of(cls, plan: "Convolution", built: "_Built", a, b, tensors: dict) -> "_GradHot | None":
        """The pack of a checked call that used ``a`` and ``b`` as they are (``tensors``: the
        prepared tensors by role), or None (a copy was made, a subclass, an unbatched problem)."""
        roles = _GRAD_ROLES[plan.direction]
        if plan.problem.unbatched or type(a) not in _PLAIN or type(b) not in _PLAIN \
                or tensors.get(roles[0]) is not a or tensors.get(roles[1]) is not b:
            return None
        out = tensors[roles[2]]
        h = cls()
        h.index, h.built, h.roles, h.order = plan._selected, built, roles, tuple(built.roles)
        h.a, h.b = (a.shape, a.stride(), a.dtype), (b.shape, b.stride(), b.dtype)
        h.out_shape, h.out_strides = out.shape, out.stride()
        h.db = tuple(tensors["db"].shape) if "db" in tensors else None
        return h


def _extent(t) -> int:
    """Bytes from a tensor's first element to one past its last (0 when empty or None)."""
    if t is None or t.numel() == 0:
        return 0
    return (sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def _set_handle_int():
    """``dnnl_memory_set_data_handle`` taking the pointer as an integer (``Tensor.data_ptr()``),
    which saves an ``ffi.cast`` per tensor per call (same ABI: a pointer and an intptr_t)."""
    if not _SET_HANDLE:
        _SET_HANDLE.append(ffi.cast("dnnl_status_t(*)(dnnl_memory_t, intptr_t)",
                                    _dnnl.lib().dnnl_memory_set_data_handle))
    return _SET_HANDLE[0]


# ---------------------------------------------------------------------------- the plan
from .autotune import Autotune as _Autotune  # noqa: E402 - the plan's autotune (a mixin)
from .listing import Listing as _Listing  # noqa: E402 - descriptors, listing, selection (a mixin)


class Convolution(_Listing, _Autotune, PlanLifetime):
    """A oneDNN convolution plan for one problem, in the style of nvmath-python's ``Matmul``.

    ``Convolution(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, *, impl=None,
    algorithm="direct", fpmath="strict", prepack=False, threads="auto")``: ``x`` (N, C, *spatial) or unbatched,
    ``w`` (K, C/groups, *kernel), CPU tensors of float32, bfloat16 or float16 (where the CPU has
    it), NCHW or channels_last. ``padding`` as in torch, or one ``(before, after)`` pair per dim.

    **Threads.** oneDNN's OpenMP build fixes an implementation's thread partition when its
    primitive descriptor is created, from the calling thread's OpenMP count, and every call opens
    a parallel region. ``threads``: an int runs this plan (listing, primitive creation, every
    call) on that many OpenMP threads, set on the calling thread around each library call and
    restored; None uses the caller's count as it is (``torch.set_num_threads``), at most the count
    in force when the plan listed its implementations (their partition and scratchpad are sized
    for it: primitives are created under it too, and a call never runs on more); ``"auto"`` (the
    default) is None except for a problem of fewer than 2**17 FLOPs, which runs on one thread (a
    few microseconds of work, about what starting and joining a team costs on a many-core CPU).
    :attr:`threads` holds the resolved count (None: the caller's); the tuning key records it.

    ``implementations`` lists every implementation (:class:`Implementation`); ``autotune()``
    times them and selects the fastest; ``execute(x, w=None, bias=None, out=None)`` runs the
    selected one; ``free()`` (or ``with``) releases the primitives and buffers. Not thread-safe:
    one plan per thread.

    **Weights: read on every call, or an explicit snapshot.** ``execute(x, w=t)`` always reads
    ``t`` as it is now (reordered into the implementation's layout on this call, when the
    implementation wants another layout). ``execute(x)`` without ``w``:

    * ``prepack=False`` (the default): reads the tensor ``w`` given at construction as it is now,
      reordered on every call: an update of it in any way (in place, through ``.data``, a numpy
      view, its storage, a fused optimizer) is seen by the next call.
    * ``prepack=True``: uses a **snapshot** of ``w`` taken at construction (a copy: a constant, as
      torch's freezing makes one), reordered once per selected implementation and kept. Later
      changes of ``w`` are NOT seen until :meth:`repack` (``repack()`` snapshots the construction
      tensor again, ``repack(w2)`` snapshots ``w2``). Meant for inference on fixed weights (it
      saves the weight reorder per call: see docs/guides/prepack.md).

    The function forms (:func:`forward` ...), :mod:`rawconv.ops` and :mod:`rawconv.nn`'s modules
    never keep reordered weights across calls.

    Known-bad implementations (:mod:`rawconv.known_bad`, marked in :attr:`implementations`):
    selecting one raises :class:`~rawconv.errors.KnownBadError` naming the issue unless
    ``allow_known_bad=True`` (here, or on :meth:`select`); when oneDNN's first choice is one,
    the plan runs the next implementation in oneDNN's order that is not, with a
    ``RuntimeWarning`` (``allow_known_bad=True`` keeps the first choice); autotune skips them.

    Also built for the backward passes by :func:`backward_data` / :func:`backward_weights` via
    :meth:`from_problem`. Raises :class:`~rawconv.errors.ArgumentError` for bad input before any
    C call, :class:`~rawconv.errors.NotSupportedError` when oneDNN offers nothing (or not the
    forced impl), :class:`~rawconv.errors.LibraryError` for other oneDNN failures.
    Wraps ``dnnl_convolution_{forward,backward_data,backward_weights}_primitive_desc_create``,
    ``dnnl_primitive_desc_next_impl``, ``dnnl_primitive_create``, ``dnnl_primitive_execute``,
    ``dnnl_reorder_primitive_desc_create``.
    """

    _post_ops: tuple = ()   # oneDNN post-ops of the forward primitive (none here; see rawconv.fused)

    def __init__(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                 stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1, *,
                 impl: Any = None, algorithm: str = "direct", fpmath: str = "strict",
                 prepack: bool = False, allow_known_bad: bool = False, choice: Any = None,
                 precision: str | None = None, options: Any = None, threads: Any = "auto"):
        impl, fpmath, allow_known_bad = _words(impl, choice, fpmath, precision, options, allow_known_bad)
        problem = ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups)
        check_device(problem)
        impl = _check_impl(impl)
        self._init(problem, "forward", algorithm, fpmath, weights_layout(w), prepack, allow_known_bad, threads)
        self._x, self._w, self._b = x, w, bias
        if prepack:
            self._snapshot(w)
        if impl is not None:
            self.select(impl)

    @classmethod
    def from_problem(cls, problem: ConvProblem, *, direction: str = "forward", algorithm: str = "direct",
                     fpmath: str = "strict", w_layout: str = "nchw", impl: Any = None,
                     prepack: bool = False, allow_known_bad: bool = False, choice: Any = None,
                     precision: str | None = None, options: Any = None, threads: Any = "auto") -> "Convolution":
        """A plan from a :class:`ConvProblem` (no tensors needed until :meth:`execute`).
        ``direction``: "forward", "backward_data", "backward_weights" ("backward_filter" too).
        ``prepack=True`` has no weights to snapshot yet: :meth:`repack` ``(w)`` takes the snapshot
        (until then every call needs its ``w``)."""
        impl, fpmath, allow_known_bad = _words(impl, choice, fpmath, precision, options, allow_known_bad)
        from ..core.backend import canonical_direction

        if isinstance(direction, str):
            direction = canonical_direction(direction)
        if not isinstance(problem, ConvProblem):
            raise ArgumentTypeError(f"problem must be a ConvProblem (see ConvProblem.from_benchdnn for a "
                                    f"descriptor string), got {type(problem).__name__}")
        _check_direction(direction)
        if not isinstance(w_layout, str) or w_layout not in ("nchw", "nhwc"):
            raise ArgumentError(f"w_layout must be 'nchw' or 'nhwc', got {w_layout!r}")
        impl = _check_impl(impl)
        check_device(problem)
        self = cls.__new__(cls)
        self._init(problem, direction, algorithm, fpmath, w_layout, prepack, allow_known_bad, threads)
        self._x = self._w = self._b = None
        if impl is not None:
            self.select(impl)
        return self

    def _init(self, problem, direction, algorithm, fpmath, w_layout, prepack, allow_known_bad=False, threads="auto"):
        if problem.dtype not in DTYPES:
            raise ArgumentError(f"oneDNN has no {problem.dtype} convolution: rawconv's oneDNN backend takes float32, and "
                                f"bfloat16 / float16 where this CPU offers them (rawconv.onednn.capabilities() says "
                                f"which); cuDNN (CUDA tensors) takes float64")
        _check_sizes(problem)
        if not isinstance(prepack, bool):
            raise ArgumentTypeError(f"prepack must be True or False, got {prepack!r}")
        self.threads_arg = _check_threads(threads)
        self.threads = plan_threads(self.threads_arg, problem)
        self.allow_known_bad = _check_allow(allow_known_bad)
        self.problem = problem
        self.direction = direction
        self.algorithm = _check_algorithm(algorithm)
        self.fpmath = fpmath
        self._fpmath = check_fpmath(fpmath)
        self.w_layout = w_layout
        self.prepack = prepack
        self._impls: list[Implementation] | None = None
        self._pds: list = []
        self._hints: list = []
        self._built: dict[int, _Built] = {}
        self._released: set = set()   # indices whose built implementation the byte budget released
        self._selected: int | None = None
        self._freed = False
        self._lock = threading.Lock()
        self.user_md = {}
        self._user_strides = {}
        self._fast = {}
        self._hot = None    # the forward hot path's argument pack (see execute)
        self._ghot = None   # the backward hot path's (see _grad_hot_run)
        self._snap = None   # (weights snapshot, its generation) with prepack (see repack)
        self._slow_checked = None   # the selection whose reference-time warning was decided
        self._examples = None
        self.tuning_record = None   # autotune's choice (rawconv.tuning.TuningRecord)

    # ------------------------------------------------------------------ execution
    def _prepare(self, role: str, t: torch.Tensor, shape) -> torch.Tensor:
        fast = self._fast.get(role)
        if fast is not None and type(t) is torch.Tensor and t.dtype is fast[2] and t.shape == fast[0] \
                and t.is_cpu and t.stride() == fast[1] and not t.is_neg():
            return t   # the common case: exactly the plan's shape, dtype and strides
        p = self.problem
        is_out = role in ("y", "dx", "dw", "db")
        name = _ROLE_NAMES[role] if not is_out else f"out ({_ROLE_NAMES[role]})"
        if not isinstance(t, torch.Tensor):
            raise ArgumentError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.is_nested or t.layout != torch.strided:
            raise ArgumentError(f"{name} must be a dense (strided) tensor, got "
                                f"{'a nested tensor' if t.is_nested else 'layout ' + str(t.layout)}")
        if p.unbatched and role in ("x", "y", "dx", "dy") and t.dim() == p.ndim + 1:
            t = t.unsqueeze(0)
        if tuple(t.shape) != tuple(shape):
            raise ArgumentError(f"{name} must have shape {tuple(shape)} for this plan, got {tuple(t.shape)}")
        if t.dtype != p.torch_dtype:
            raise ArgumentError(f"{name} must be {p.torch_dtype} for this plan, got {t.dtype}")
        if t.device.type != "cpu":
            raise ArgumentError(f"{name} must be on the CPU for oneDNN, got {t.device}")
        if t.is_neg() or t.is_conj():
            if is_out:
                raise ArgumentError(f"{name} must not be a negative or conjugate view (torch._neg_view, .conj())")
            t = t.resolve_neg().resolve_conj()   # the memory holds -t: oneDNN reads memory
        if t.numel() and not strides_match(t, self._user_strides[role]):
            if is_out:
                raise ArgumentError(f"out ({_ROLE_NAMES[role]}) must have strides {tuple(self._user_strides[role])} "
                                    f"(the plan's layout), got {t.stride()}")
            t = _restride(t, self._user_strides[role])
        return t

    def execute(self, x: torch.Tensor | None = None, w: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, out: torch.Tensor | None = None, *,
                grad_y: torch.Tensor | None = None) -> torch.Tensor:
        """Run the selected implementation and return the result.

        forward: ``execute(x, w=None, bias=None, out=None)`` -> y (N, K, *out), in the problem's layout.
        backward_data: ``execute(grad_y=dy, w=w, out=None)`` -> dx. backward_weights:
        ``execute(x, grad_y=dy)`` -> dw, or ``(dw, db)`` when the plan has a bias. ``None`` for
        x/bias uses the tensors given at construction; ``None`` for w the weight snapshot with
        ``prepack`` (see the class notes), else the construction tensor as it is now. Output
        buffers may be passed as ``out`` (forward, backward_data; for an unbatched problem of
        either shape), as torch's ``out=``: ``out`` itself is returned, its version counter
        bumped; it must not overlap an input in memory, nor require grad (or an input require
        grad) with grad mode on, nor be an inference tensor outside inference mode
        (:class:`ArgumentError`). Plans record no autograd (:func:`forward` and
        :mod:`rawconv.ops` do). Raises :class:`ArgumentError` when tensors do not fit the plan
        (also for zero-size problems, which need no library call). A forward call whose tensors
        have exactly the shapes, strides and dtypes of an earlier call that used them as they are
        skips the checks (the hot path: one allocation, the library calls). Wraps
        ``dnnl_primitive_execute``.
        """
        try:   # rawconv._guard.public's translation, inline (one frame less on the hot path)
            if self._hot is not None and grad_y is None:
                y = self._hot_run(x, w, bias, out)
                if y is not None:
                    return y
            return self._execute(x, w, bias, out, grad_y)
        except Exception as exc:
            new = _guard.translate(exc, "rawconv.onednn.Convolution.execute")
            if new is None:
                raise
            raise new from exc

    execute.__rawconv_public__ = True

    def _execute(self, x, w, bias, out, grad_y):
        """:meth:`execute`'s checked path."""
        if self._freed:
            raise ArgumentError("this Convolution plan was freed")
        x, w, bias, packed = self._execute_args(x, w, bias, out, grad_y)
        if not self._fast:
            self._strides()
        tensors, result, done = self._execute_tensors(x, w, bias, out, grad_y)
        if done:
            return result
        p = self.problem
        d = self.direction
        if p.is_empty:
            _empty_result(self, tensors)
            return result
        if not self.user_md:
            self._mds()
        built = self._build(self.selected.index)
        if self._slow_checked != self._selected:   # a reference implementation estimated slow: warn first
            _warn_if_slow_reference(self)
        built.run(tensors, _dnnl.stream(), packed)
        if out is not None:
            _increment_version((out,))   # written in place, as torch's out= functions do
        if d == "forward" and (self._hot is None or self._hot.index != self._selected):
            self._hot = _Hot.of(self, built, x, w, bias)
        elif d != "forward" and out is None and (self._ghot is None or self._ghot.index != self._selected):
            self._ghot = _GradHot.of(self, built, *((grad_y, w) if d == "backward_data" else (x, grad_y)), tensors)
        return result

    def _grad_hot_run(self, a, b):
        """The backward hot path (backward data: ``a`` = grad_y, ``b`` = w; backward weights: ``a``
        = x, ``b`` = grad_y): when both have exactly the metadata of an earlier checked call that
        used them as they are, run with no further checks and no allocation beyond the outputs;
        returns dx, dw or ``(dw, db)`` as :meth:`execute` does, or None when the hot path does not
        apply (the caller then takes :meth:`execute`). Every call checks each tensor's type,
        shape, strides, dtype, device and negative bit."""
        g = self._ghot
        if g is None or g.index != self._selected or self._freed or self._built.get(g.index) is not g.built:
            return None
        sa, sb = g.a, g.b
        dt = sa[2]
        try:   # (an unusual tensor may raise on .shape: the checked path says what is wrong)
            if type(a) not in _PLAIN or a.shape != sa[0] or a.stride() != sa[1] or a.dtype is not dt \
                    or not a.is_cpu or a.is_neg() or type(b) not in _PLAIN or b.shape != sb[0] \
                    or b.stride() != sb[1] or b.dtype is not sb[2] or not b.is_cpu or b.is_neg():
                return None
            out = torch.empty_strided(g.out_shape, g.out_strides, dtype=dt)
            ptr = {g.roles[0]: a.data_ptr(), g.roles[1]: b.data_ptr(), g.roles[2]: out.data_ptr()}
            db = None
            if g.db is not None:
                db = torch.empty(g.db, dtype=dt)
                ptr["db"] = db.data_ptr()
            ptrs = tuple([ptr[r] for r in g.order])
        except Exception:   # noqa: BLE001
            return None
        g.built.run_ptrs(ptrs, _dnnl.stream(), None)
        return out if db is None else (out, db)

    def _execute_args(self, x, w, bias, out, grad_y) -> tuple:
        """:meth:`_execute`'s argument check: the tensors this plan's direction takes, those not
        given taken from the plan (its weight snapshot first, then the construction's tensors).
        Returns ``(x, w, bias, packed)`` (``packed``: the snapshot's reordered weights, or None);
        raises :class:`ArgumentError` for a tensor the direction does not take or one it lacks."""
        p = self.problem
        d = self.direction
        packed = None
        if w is None and d != "backward_weights":
            if self._snap is not None:
                w, packed = self._snap
            else:
                w = self._w
        if d == "forward":
            if grad_y is not None:
                raise ArgumentError("a forward plan takes x (and w, bias, out), not grad_y")
            if x is None:
                x = self._x
            if bias is None:
                bias = self._b
            if x is None or w is None:
                raise ArgumentError("execute needs x and w (none were given at construction)")
            if p.has_bias and bias is None:
                raise ArgumentError("this plan was built with a bias: pass bias")
            if not p.has_bias and bias is not None:
                raise ArgumentError("this plan was built without a bias; build one with bias to use it")
        elif d == "backward_data":
            if x is not None or bias is not None:
                raise ArgumentError("a backward_data plan takes grad_y and w (and out), not x or bias")
            if grad_y is None or w is None:
                raise ArgumentError("backward_data needs grad_y and w")
        else:
            if w is not None or bias is not None or out is not None:
                raise ArgumentError("a backward_weights plan takes x and grad_y only (no w, bias or out)")
            if x is None:
                x = self._x
            if grad_y is None or x is None:
                raise ArgumentError("backward_weights needs x and grad_y")
        return x, w, bias, packed

    def _execute_tensors(self, x, w, bias, out, grad_y) -> tuple:
        """:meth:`_execute`'s tensors, prepared for oneDNN (copied or restrided where needed), the
        output allocated unless ``out`` is given. Returns ``(tensors, result, done)``: the tensors
        by oneDNN role, what :meth:`execute` returns, and whether that is already final (an empty
        backward_weights problem, its zero gradients filled in)."""
        p = self.problem
        d = self.direction
        prepare = self._prepare
        tensors = {}
        if d == "forward":
            tensors["x"] = prepare("x", x, p.x_shape)
            tensors["w"] = prepare("w", w, p.w_shape)
            if p.has_bias:
                tensors["b"] = prepare("b", bias, (p.k,))
            if out is None:
                y = empty_like_layout(p.y_shape, p.layout, p.torch_dtype, "cpu")
                tensors["y"] = y
                result = y.squeeze(0) if p.unbatched else y
            else:
                tensors["y"] = prepare("y", out, p.y_shape)
                _check_out(out, (("x", x), ("w", w), ("bias", bias)), "Convolution.execute")
                result = out
        elif d == "backward_data":
            tensors["dy"] = prepare("dy", grad_y, p.y_shape)
            tensors["w"] = prepare("w", w, p.w_shape)
            if out is None:
                dx = empty_like_layout(p.x_shape, p.layout, p.torch_dtype, "cpu")
                tensors["dx"] = dx
                result = dx.squeeze(0) if p.unbatched else dx
            else:
                tensors["dx"] = prepare("dx", out, p.x_shape)
                _check_out(out, (("grad_y", grad_y), ("w", w)), "Convolution.execute")
                result = out
        else:
            tensors["x"] = prepare("x", x, p.x_shape)
            tensors["dy"] = prepare("dy", grad_y, p.y_shape)
            if p.is_empty:
                return tensors, _empty_result(self, tensors), True
            dw = empty_like_layout(p.w_shape, self.w_layout, p.torch_dtype, "cpu")
            tensors["dw"] = dw
            result = dw
            if p.has_bias:
                tensors["db"] = torch.empty(p.k, dtype=p.torch_dtype)
                result = (dw, tensors["db"])
        return tensors, result, False

    def _hot_run(self, x, w, bias, out):
        """The forward hot path: when the tensors have exactly the metadata of an earlier call that used
        them as they are (no copy, no restride), run with no further checks and no allocation beyond
        the output; returns y (or ``out``), or None when the hot path does not apply (the caller then
        takes :meth:`execute`'s checks). Every call checks each tensor's type, shape, strides, dtype,
        device and negative bit (a tensor's metadata can change in place); the plan's own weight
        snapshot (``prepack``) is not checked again (it was when taken, and only :meth:`repack`
        replaces it, which drops this pack). ``out``'s overlap check is keyed on the data
        pointers: with the shapes and strides fixed, the pointers alone decide it."""
        hot = self._hot
        if hot is None or hot.index != self._selected or self._freed or self._built.get(hot.index) is not hot.built:
            return None
        if x is None:
            x = self._x
        packed = None
        own = False
        if w is None:
            snap = self._snap
            if snap is not None:
                w, packed = snap
                own = True
            else:
                w = self._w
        if bias is None:
            bias = self._b
        xs = hot.x
        dt = xs[2]
        try:   # (a nested or otherwise unusual tensor may raise on .shape: the checked path says what is wrong)
            if type(x) not in _PLAIN or x.shape != xs[0] or x.stride() != xs[1] or x.dtype is not dt \
                    or not x.is_cpu or x.is_neg():
                return None
            if not own:
                ws = hot.w
                if type(w) not in _PLAIN or w.shape != ws[0] or w.stride() != ws[1] or w.dtype is not dt \
                        or not w.is_cpu or w.is_neg():
                    return None
            bs = hot.b
            if bs is None:
                if bias is not None:
                    return None
            elif type(bias) not in _PLAIN or bias.shape != bs[0] or bias.stride() != bs[1] or bias.dtype is not dt \
                    or not bias.is_cpu or bias.is_neg():
                return None
            if out is None:
                y = torch.empty_strided(hot.y_shape, hot.y_strides, dtype=dt)
            elif type(out) in _PLAIN and out.shape == hot.y_shape and out.stride() == hot.y_strides \
                    and out.dtype is dt and out.is_cpu and not out.is_neg() and not out.requires_grad \
                    and not out.is_inference() and not x.requires_grad and (own or not w.requires_grad) \
                    and (bias is None or not bias.requires_grad):
                y = out
            else:
                return None
            ptrs = (x.data_ptr(), w.data_ptr(), y.data_ptr()) if bs is None else \
                (x.data_ptr(), w.data_ptr(), bias.data_ptr(), y.data_ptr())
        except Exception:   # noqa: BLE001
            return None
        if out is not None and ptrs != hot.fit:
            if hot.overlaps(ptrs):
                return None   # the checked path raises the clear error
            hot.fit = ptrs
        hot.built.run_ptrs(ptrs, _dnnl.stream(), packed)
        if out is not None:
            _increment_version((out,))   # written in place, as torch's out= functions do
        return y

    def repack(self, w: torch.Tensor | None = None) -> None:
        """Take a new weight snapshot: of ``w`` (which also becomes the plan's construction
        weights), or with ``w=None`` of the weights given at construction (or to the last
        ``repack(w)``) as they are now. :meth:`execute` calls without ``w`` use the snapshot
        from then on (``prepack`` becomes True): it is reordered once per implementation and
        kept, and later changes of the tensor are not seen until the next ``repack``. Forward
        and backward_data plans (backward_weights takes no weights). Raises
        :class:`ArgumentError` when there are no weights to snapshot or ``w`` does not fit the
        plan (shape, dtype, device), before anything changes."""
        self._check_live()
        if self.direction == "backward_weights":
            raise ArgumentError("a backward_weights plan takes no weights: nothing to repack")
        src = self._w if w is None else w
        if src is None:
            raise ArgumentError("this plan has no weights to snapshot: pass repack(w)")
        self._snapshot(src)
        self.prepack = True
        if w is not None:
            self._w = w

    def _snapshot(self, w, copy: bool = True) -> None:
        """Take ``w`` (checked as :meth:`execute` checks it) as the weight snapshot: a copy in the
        plan's weight strides (``copy=False``: ``w`` itself, which the caller promises never to
        change; rawconv.fused's frozen modules own such a tensor) under a new generation."""
        if not self._fast and not self._user_strides:
            self._strides()
        t = self._prepare("w", w, self.problem.w_shape)
        if copy and t is w:
            snap = torch.empty_strided(tuple(t.shape), self._user_strides["w"], dtype=t.dtype)
            with torch.no_grad():
                snap.copy_(t)
        else:
            snap = t
        self._snap = (snap, next(_SNAP_GENERATION))
        self._hot = None

    __call__ = execute

    def _example_tensors(self) -> dict:
        """The tensors autotune times on: the construction ones, else seeded random ones of the
        problem (made once per plan; never taken as the plan's own weights)."""
        p = self.problem
        x, w, b = (self._x, self._w, self._b)
        if x is None and w is None:
            if self._examples is None:
                x, w, b = p.make_inputs(seed=1)
                if self.w_layout == "nhwc":
                    w = to_layout(w, "nhwc")
                self._examples = (x, w, b)
            x, w, b = self._examples
        if self.direction == "forward":
            return {"x": x, "w": w, "bias": b}
        # (a generator of its own: torch's stays untouched, for the caller and its other threads)
        gy = torch.randn(p.y_shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(p.torch_dtype)
        gy = to_layout(gy, p.layout)
        if self.direction == "backward_data":
            return {"grad_y": gy, "w": w}
        return {"x": x, "grad_y": gy}

    # ------------------------------------------------------------------ lifetime
    def _check_live(self):
        if self._freed:
            raise ArgumentError("this Convolution plan was freed")

    def free(self) -> None:
        """Release primitives, buffers and tensor references. Idempotent."""
        self._built.clear()
        self._pds = []
        self._hints = []
        self._impls = None
        self._x = self._w = self._b = None
        self.user_md = {}
        self._freed = True

    def __repr__(self) -> str:
        if self._freed:
            return "<rawconv.onednn.Convolution (freed)>"
        if self._impls is not None and self._selected is not None:
            sel = self._impls[self._selected].choice + (" (built)" if self._selected in self._built else "")
        else:
            sel = "oneDNN's first choice (not listed yet)"
        return (f"<rawconv.onednn.Convolution {self.direction} {self.problem.describe()} "
                f"fpmath={self.fpmath} threads={_threads_text(self.threads)} choice={sel}>")

    def candidates(self) -> ResultTable:
        """:attr:`implementations` (every backend's plan has ``candidates()``)."""
        return self.implementations


def _restride(t: torch.Tensor, strides) -> torch.Tensor:
    out = torch.empty_strided(t.shape, strides, dtype=t.dtype)
    out.copy_(t)
    return out


def _empty_result(plan: Convolution, tensors: dict):
    """Zero-sized problems (shared/cases C1): torch's result without any library call, written
    into the prepared (checked) tensors. backward_weights: returns ``dw`` or ``(dw, db)``; db is
    grad_y summed over N and space (grad_y need not be empty when x is: padding)."""
    p = plan.problem
    d = plan.direction
    if d == "forward":
        y = tensors["y"]
        y.zero_()
        if p.has_bias and y.numel():
            y += tensors["b"].view(1, -1, *([1] * p.ndim))
        return y
    if d == "backward_data":
        tensors["dx"].zero_()
        return tensors["dx"]
    dw = torch.zeros(p.w_shape, dtype=p.torch_dtype)
    if not p.has_bias:
        return dw
    dy = tensors["dy"]
    db = dy.sum([0] + list(range(2, dy.dim())), dtype=torch.float64 if p.dtype == "float64" else torch.float32)
    return dw, db.to(p.torch_dtype)


MAX_TENSOR_ELEMENTS = 2 ** 31 - 2   # elements of x, w or y rawconv gives oneDNN 3.2 (see _check_sizes)


def _check_sizes(p: ConvProblem) -> None:
    """oneDNN 3.2 dies with SIGFPE (an integer division by zero inside libdnnl: the process ends,
    no error) while listing implementations for some problems with a tensor of 2**31 elements or
    more (seen here, all 1x1 forward: x of 2**31 - 1, 2**34 and 2**36 elements, in one or in
    many images; others of 2**31 - 2, 2**32 and 2**34 elements listed fine, as did every one
    tried below). rawconv refuses a problem whose x, w or y has more than
    :data:`MAX_TENSOR_ELEMENTS` elements with :class:`NotSupportedError`, before any C call."""
    for what, shape in (("x", p.x_shape), ("w", p.w_shape), ("y", p.y_shape)):
        if math.prod(shape) > MAX_TENSOR_ELEMENTS:
            raise NotSupportedError(
                f"{p.describe()}: {what} would have {math.prod(shape)} elements; rawconv gives oneDNN 3.2 at most "
                f"{MAX_TENSOR_ELEMENTS} (2**31 - 2) per tensor: beyond, listing its implementations can kill the process (SIGFPE inside "
                "oneDNN)", library="oneDNN")


def check_device(p: ConvProblem):
    """Raise :class:`ArgumentError` unless ``p``'s tensors are CPU tensors (oneDNN's)."""
    if not p.device.startswith("cpu"):
        raise ArgumentError(f"rawconv.onednn runs on CPU tensors; got tensors on {p.device} "
                            "(use rawconv.cudnn for CUDA tensors)")


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


# ---------------------------------------------------------------------------- tuning records
# the precision inputs are rounded to under each fpmath mode (the tolerance of a check)
_FPMATH_COMPUTE = {"bf16": "bfloat16", "f16": "float16", "tf32": "tf32", "any": "bfloat16"}


def key_options(fpmath: str, algorithm: str = "direct", w_layout: str = "nchw", allow_known_bad: bool = False,
                threads: int | None = None) -> dict:
    """The options of a oneDNN tuning key: fpmath mode, algorithm, weights layout and torch's
    thread count (which decides oneDNN's OpenMP threads), plus ``allow_known_bad`` when set."""
    out = {"fpmath": fpmath, "algorithm": algorithm, "weights_layout": w_layout,
           "threads": torch.get_num_threads() if threads is None else threads}
    if allow_known_bad:
        out["allow_known_bad"] = True
    return out


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


# ---------------------------------------------------------------------------- reference-time estimate
_REF_RATES: dict = {}
_REF_RATES_LOCK = threading.Lock()
SLOW_REFERENCE_SECONDS = 10.0   # a call estimated longer than this on ref:* warns first (SlowReferenceWarning)


def _valid_pairs(size: int, out: int, k: int, s: int, d: int, pb: int) -> int:
    """#{(o, j) : 0 <= o < out, 0 <= j < k, 0 <= o*s - pb + j*d < size}: the (output, kernel tap)
    pairs of one spatial dim that read the input, not the padding (O(k), closed form per tap)."""
    if k > 2 ** 24:   # (a kernel that long: count every pair, an upper bound)
        return out * k
    j = torch.arange(k, dtype=torch.int64)
    off = j * d - pb                                        # input index of output 0 at tap j
    lo = torch.where(off >= 0, torch.zeros_like(off), (-off + s - 1) // s)   # first o reading the input
    hi = torch.clamp(torch.div(size - 1 - off, s, rounding_mode="floor"), max=out - 1)   # last one
    return int(torch.clamp(hi - lo + 1, min=0).sum())


def _ref_features(problem: ConvProblem, direction: str) -> tuple[int, int, int]:
    """(elements, taps, valid) of a reference call: the result elements it computes one at a time
    (y, dx or dw), the (element, reduction term) pairs its loops visit, and those that read the
    input rather than padding (the multiply-adds, the same set in every direction)."""
    p = problem
    g = p.groups
    valid_sp = math.prod(_valid_pairs(i, o, k, s, d, b) for i, o, k, s, d, b in
                         zip(p.in_spatial, p.out_spatial, p.kernel, p.stride, p.dilation, p.pad_before))
    valid = p.n * p.k * (p.c // g) * valid_sp
    kk = math.prod(p.kernel)
    if direction == "forward":
        elements = p.n * p.k * math.prod(p.out_spatial)
        taps = elements * (p.c // g) * kk
    elif direction == "backward_data":
        elements = p.n * p.c * math.prod(p.in_spatial)
        taps = elements * (p.k // g) * kk
    else:
        elements = p.k * (p.c // g) * kk
        taps = elements * p.n * math.prod(p.out_spatial)
    return elements, taps, min(valid, taps)


def _ref_calibration(ndim: int) -> list[ConvProblem]:
    """The problems :func:`_ref_model` times: many elements of one term each; many valid terms;
    mostly padding terms; almost nothing (the per-call cost, last)."""
    big, mid, small, pad = {1: (65536, 256, 6, 8192), 2: (256, 16, 4, 64), 3: (40, 6, 3, 12)}[ndim]
    one, nd = (1,) * ndim, ndim
    return [ConvProblem(n=1, c=1, k=4, in_spatial=(big,) * nd, kernel=one),
            ConvProblem(n=1, c=32, k=32, in_spatial=(mid,) * nd, kernel=(3,) * nd, pad_before=one, pad_after=one),
            ConvProblem(n=1, c=1, k=4, in_spatial=(small,) * nd, kernel=(5,) * nd, pad_before=(pad,) * nd,
                        pad_after=(pad,) * nd),
            ConvProblem(n=1, c=1, k=1, in_spatial=(4,) * nd, kernel=one)]


def _ref_time(tiny: ConvProblem, direction: str, repeats: int = 3, layouts: str = "user") -> float | None:
    """Best of ``repeats`` timed calls of ``tiny``'s ref:* implementation with ``layouts``
    (``"any"`` / ``"user"``; the last ref:* listed when none has them) after one untimed call, or
    None when oneDNN offers none."""
    try:
        plan = Convolution.from_problem(tiny, direction=direction)
        refs = [r for r in plan.implementations if r.name.startswith("ref")]
    except NotSupportedError:
        return None
    if not refs:
        return None
    plan.select(next((r.index for r in refs if r.layouts == layouts), refs[-1].index))
    plan._slow_checked = plan._selected   # (no warning while measuring)
    tensors = plan._example_tensors()
    plan.execute(**tensors)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan.execute(**tensors)
        best = min(best, time.perf_counter() - t0)
    plan.free()
    return best


def _ref_model(direction: str, dtype: str, ndim: int, layout: str, threads: int, layouts: str = "user"):
    """(per call, per element, per valid term, per padding term) seconds of oneDNN's reference
    implementation with ``layouts`` (its src/dst as the tensors are, ``"user"``, or as oneDNN
    picks them, ``"any"``: the two can differ tenfold) for this kind of problem: the per-call
    cost is the time of an almost empty problem, the three others are solved from three small
    problems timed here (a few tenths of a second in all, once per process and kind; relative
    errors weigh equally). None when oneDNN offers no ref:* for it."""
    *cal, empty = [c.with_(dtype=dtype, layout=layout) for c in _ref_calibration(ndim)]
    t0 = _ref_time(empty, direction, repeats=5, layouts=layouts)
    if t0 is None:
        return None
    rows, rhs = [], []
    for tiny in cal:
        best = _ref_time(tiny, direction, layouts=layouts)
        if best is None:
            return None
        e, t, v = _ref_features(tiny, direction)
        share = math.ceil(e / threads) / e     # the elements are split over the threads
        work = max(best - t0, best * 0.05)
        rows.append([e * share / work, v * share / work, (t - v) * share / work])
        rhs.append(1.0)
    try:
        sol = torch.linalg.lstsq(torch.tensor(rows, dtype=torch.float64),
                                 torch.tensor(rhs, dtype=torch.float64).unsqueeze(1)).solution.squeeze(1).tolist()
    except RuntimeError:
        return None
    return (t0,) + tuple(max(v, 0.0) for v in sol)


def reference_seconds(problem: ConvProblem, direction: str = "forward", layouts: str | None = None) -> float:
    """Estimated seconds of one call of oneDNN's reference implementation (``ref:any``) on ``problem``.

    ``layouts``: the reference implementation's (``"any"``: src/dst in the layouts oneDNN picks,
    ``"user"``: as the tensors are; see :class:`Implementation`), each calibrated on its own (on
    NCHW the two differ about tenfold); None: the slower of the two.

    oneDNN's reference code computes the result elements (y, dx or dw) one by one, split over
    the threads, each with a scalar loop over its reduction terms; a term whose input index
    falls into the padding is skipped after a bounds check. The time is modelled as
    ``(a * elements + b * valid terms + c * padding terms) * ceil(elements / threads) / elements``,
    with the terms counted exactly for the problem (per spatial dim, in closed form) and ``a``,
    ``b``, ``c`` fitted once per process for each (direction, dtype, spatial rank, layout, thread
    count) on three small problems timed here (about 0.1-0.3 s). Measured against real calls
    on this machine, see docs/guides/reference-implementations.md. Returns ``inf`` when oneDNN
    offers no reference implementation for that kind, 0 for an empty problem. Raises
    :class:`ArgumentError` / :class:`ArgumentTypeError` for a bad direction or problem. Wraps
    what :class:`Convolution` wraps (``dnnl_primitive_execute`` on ``ref:any``).
    """
    from ..core.backend import canonical_direction

    if isinstance(direction, str):
        direction = canonical_direction(direction)
    _check_direction(direction)
    if not isinstance(problem, ConvProblem):
        raise ArgumentTypeError(f"problem must be a ConvProblem, got {type(problem).__name__}")
    if layouts is not None and layouts not in ("any", "user"):
        raise ArgumentError(f"layouts must be 'any', 'user' or None, got {layouts!r}")
    if problem.is_empty:
        return 0.0
    if layouts is None:
        return max(reference_seconds(problem, direction, "any"), reference_seconds(problem, direction, "user"))
    threads = torch.get_num_threads()
    key = (direction, problem.dtype, problem.ndim, problem.layout, threads, layouts)
    if key not in _REF_RATES:
        with _REF_RATES_LOCK:
            if key not in _REF_RATES:
                _REF_RATES[key] = _ref_model(direction, problem.dtype, problem.ndim, problem.layout, threads, layouts)
    model = _REF_RATES[key]
    if model is None:
        return math.inf
    t0, a, b, c = model
    e, t, v = _ref_features(problem, direction)
    return t0 + (a * e + b * v + c * (t - v)) * math.ceil(e / threads) / e


def _warn_if_slow_reference(plan: "Convolution") -> None:
    """Warn (:class:`~rawconv.errors.SlowReferenceWarning`) once per plan and selection, before its
    first call, when the selected implementation is a reference one (``ref:*``) and
    :func:`reference_seconds` estimates a call above :data:`SLOW_REFERENCE_SECONDS`."""
    plan._slow_checked = plan._selected
    impl = plan._impls[plan._selected]
    if not impl.name.startswith("ref"):
        return
    est = reference_seconds(plan.problem, plan.direction, impl.layouts)
    if est > SLOW_REFERENCE_SECONDS:
        from ..core.errors import SlowReferenceWarning

        offered = sorted({i.name for i in plan._impls})
        warnings.warn(SlowReferenceWarning(
            f"rawconv.onednn: this {plan.direction} call runs on oneDNN's reference implementation {impl.name} "
            f"(offered here: {', '.join(offered)}), estimated at {est:.3g} s per call (more than "
            f"{SLOW_REFERENCE_SECONDS:g} s) for {plan.problem.describe()}"), stacklevel=_guard.stacklevel())


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
                   rows="rawconv.explore.compare:_onednn_rows", replay=_registry_replay,
                   # implementation names: lowercase "kind:isa" ("jit:avx2", "x64:gemm:jit", "ref:any"), "@layouts"
                   choice_names=r"(?!unfused:|nhwc:)[a-z0-9_.+-]+(:[a-z0-9_.+-]+)+(@(any|user))?"))
