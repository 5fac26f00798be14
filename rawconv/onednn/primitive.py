"""The parts of a oneDNN plan that the plan class, its listing and autotune mixins, the fused
plan and the isolated child share: the vocabulary (fpmath modes, algorithms, argument roles),
:class:`Implementation`, one built primitive (:class:`_Built`), the hot paths, the thread
settings, the argument checks, and a tuning key's options. Imports nothing of the package face
(:mod:`rawconv.onednn` hands these names on).
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from . import _ffi as _dnnl
from ._ffi import ffi
from ..core import guard as _guard, plans as _plans
from ..core.backend import Candidate
from ..core.errors import ArgumentError, ArgumentTypeError, NotSupportedError
from ..core.problem import ConvProblem, backward_data_layout, dense_strides, empty_like_layout, int_arg, layout_of, \
    strides_match
from ..core.results import Result

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
        out = (f"[{self.index}] {self.choice:<33} {fm}  reorders={ro}  "
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
            return f"{self.impl.choice:<33} {self.status}" + (f": {self.detail}" if self.detail else "")
        return (f"{self.impl.choice:<33} median {self.median_ms:.4f} ms  min {self.min_ms:.4f} ms"
                f"  median/min {self.spread:.2f}")


def timing_lines(rows) -> list[str]:
    """What is against autotune's timed ``rows``, a line each (:func:`rawconv.core.autotune.drive`
    warns them as :class:`rawconv.bench.TimingWarning` and the tuning record keeps them): for rows
    timed in interleaved rounds, what the rounds measured (:func:`rawconv.results.reliability`:
    rows that waited for a CPU in most rounds, rounds that disagree); for rows timed in a child
    process, :func:`rawconv.bench.timing_warnings` of their spreads (the child's CPU time would
    read as another process's: no load report)."""
    from ..core.bench import timing_warnings

    if rows and all(isinstance(r.extra.get("rounds"), dict) for r in rows):
        from ..core.results import reliability

        return list(reliability(rows)["warnings"])
    return list(timing_warnings(None, [r.spread for r in rows]))


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
