"""oneDNN plans' listing and selection: the memory and primitive descriptors of a problem, every
implementation oneDNN's primitive-descriptor iterator offers (``implementations``), and choosing one
(``select``, ``selected``, building its primitive). A mixin of :class:`rawconv.onednn.Convolution`
(execution and lifetime stay there; autotune is :mod:`rawconv.onednn.autotune`)."""
from __future__ import annotations

import logging
import warnings
from typing import Any

import torch

from .primitive import ALGORITHMS, Implementation, _ARGS, _Built, _ROLE_NAMES, _check_allow, _check_impl, \
    _omp_threads, _weights_any_md, _weights_md, library_version
from . import _ffi as _dnnl
from ._ffi import ffi
from ..core import guard as _guard, known_bad as _known_bad, plans as _plans
from ..core.errors import ArgumentError, NotSupportedError
from ..core.problem import ConvProblem, dense_strides
from ..core.results import ResultTable

__all__ = ["Listing"]

log = logging.getLogger("rawconv.onednn")


def _name_hint(impl: str, name: str, names: list) -> str:
    """What follows "not offered" for a name: another library's name for what it is (a cuDNN
    algorithm or engine config needs CUDA tensors), or the offered names it is closest to
    (ignoring case)."""
    from ..core.backend import backends_naming, close_names, spelling_suggestions

    other = [b for b in backends_naming(impl) if b.device_type != "cpu"]
    if other:
        what = "an engine config of cuDNN's graph API" if other[0].name == "cudnn_graph" else \
            "a cuDNN algorithm name (ALGO@math)"
        return (f"; {impl!r} is {what}: it runs on CUDA tensors (backend 'cudnn' or 'auto' with the tensors on a "
                "GPU), and these tensors are on the CPU, where oneDNN runs")
    near = close_names(name, names) or [s.partition("@")[0] for s in spelling_suggestions(impl)
                                        if s.partition("@")[0] in names]
    if near:
        return f"; did you mean {' or '.join(repr(n) for n in near)}? (oneDNN's names are lowercase)" \
            if name != name.lower() else f"; did you mean {' or '.join(repr(n) for n in near)}?"
    return ""


class Listing:
    """Descriptors, the implementations listing and selection, for :class:`rawconv.onednn.Convolution`."""

    # ------------------------------------------------------------------ descriptors
    def _strides(self):
        """The strides each user tensor must have (pure Python: no library call)."""
        p = self.problem
        xs = dense_strides(p.x_shape, p.layout)
        ys = dense_strides(p.y_shape, p.layout)
        self._user_strides = {"x": xs, "y": ys, "dx": xs, "dy": ys,
                              "w": dense_strides(p.w_shape, self.w_layout),
                              "dw": dense_strides(p.w_shape, self.w_layout), "b": [1], "db": [1]}
        shapes = {"x": p.x_shape, "dx": p.x_shape, "y": p.y_shape, "dy": p.y_shape, "w": p.w_shape, "b": (p.k,)}
        self._fast = {r: (torch.Size(shapes[r]), tuple(self._user_strides[r]), p.torch_dtype) for r in shapes}

    def _described(self) -> ConvProblem:
        """The problem as oneDNN is told it: this one, except that a convolution over zero input
        channels (which oneDNN refuses: ``dnnl_invalid_arguments``) is described with one channel
        per group. Such a problem is empty (no element of x), so no primitive ever runs: every
        call returns torch's result (y = bias or zeros, dx empty, dw zeros) without a library call."""
        p = self.problem
        return p if p.c else p.with_(c=p.groups)

    def _mds(self):
        if self.user_md:
            return
        self._strides()
        p = self._described()
        wmd, _ = _weights_md(p, self.w_layout)
        xmd = _dnnl.md_strides(p.x_shape, p.dtype, dense_strides(p.x_shape, p.layout) if p is not self.problem
                               else self._user_strides["x"])
        ymd = _dnnl.md_strides(p.y_shape, p.dtype, self._user_strides["y"])
        bmd = _dnnl.md_strides([p.k], p.dtype, [1]) if p.has_bias else ffi.NULL
        self.user_md = {"x": xmd, "y": ymd, "dx": xmd, "dy": ymd, "w": wmd, "dw": wmd, "b": bmd, "db": bmd}

    def _create_pd(self, layouts: str):
        """The first primitive descriptor (an iterator over implementations) for ``layouts``
        ``"any"`` (all tensors ``format_tag any``) or ``"user"`` (src/dst as the tensors are)."""
        L = _dnnl.lib()
        p = self._described()
        self._mds()
        if layouts == "any":
            xmd = _dnnl.md_tag(p.x_shape, p.dtype, "any")
            ymd = _dnnl.md_tag(p.y_shape, p.dtype, "any")
        else:
            xmd, ymd = self.user_md["x"], self.user_md["y"]
        wmd = _weights_any_md(p)
        bmd = self.user_md["b"]
        strides = list(p.stride)
        dil = [d - 1 for d in p.dilation]
        pl, pr = list(p.pad_before), list(p.pad_after)
        alg = getattr(L, ALGORITHMS[self.algorithm])
        # _post_ops (subclasses: rawconv.fused): [("sum", scale), ("eltwise", alg, alpha, beta)]
        a = _dnnl.attr(self._fpmath, post_ops=_dnnl.post_ops(self._post_ops) if self._post_ops else None)
        out = ffi.new("dnnl_primitive_desc_t *")
        detail = f"{p.describe()} ({self.direction}, layouts {layouts}, algorithm {self.algorithm}, fpmath {self.fpmath})"
        prop = L.dnnl_forward_inference if self.direction == "forward" else L.dnnl_forward_training
        _dnnl.call("dnnl_convolution_forward_primitive_desc_create", out, _dnnl.engine(), prop, alg,
                   xmd, wmd, bmd, ymd, strides, dil, pl, pr, a, detail=detail)
        fwd = _dnnl.pd_gc(out[0])
        if self.direction == "forward":
            return fwd
        # oneDNN keeps a raw pointer to the forward hint inside the backward iterator and the
        # backward primitive descriptors it yields: the hint lives as long as the plan. It is a
        # clone: the iterator's own descriptor may be the primitive cache's (_dnnl._CacheGuard)
        fwd = _dnnl.pd_clone(fwd)
        self._hints.append(fwd)
        out2 = ffi.new("dnnl_primitive_desc_t *")
        if self.direction == "backward_data":
            _dnnl.call("dnnl_convolution_backward_data_primitive_desc_create", out2, _dnnl.engine(), alg,
                       xmd, wmd, ymd, strides, dil, pl, pr, fwd, a, detail=detail)
        else:
            _dnnl.call("dnnl_convolution_backward_weights_primitive_desc_create", out2, _dnnl.engine(), alg,
                       xmd, wmd, bmd, ymd, strides, dil, pl, pr, fwd, a, detail=detail)
        return _dnnl.pd_gc(out2[0])

    def _enumerate(self):
        with _omp_threads(self.threads):   # oneDNN fixes an implementation's thread partition here
            if self.threads is None:
                ctl = _dnnl.omp_thread_controls()
                self._listed_threads = ctl[0]() if ctl is not None else None
            self._enumerate_now()

    def _pd_threads(self) -> int | None:
        """The OpenMP count the plan's primitive descriptors were created under (its fixed
        :attr:`threads`, or the caller's count when a ``threads=None`` plan listed them); None
        when unknown (not an OpenMP build). Primitives are created under it: oneDNN's primitive
        cache keys a primitive by the count in force at its creation, not by its descriptor's, so
        a primitive created under another count can be another descriptor's, whose scratchpad is
        larger than this plan's (heap corruption)."""
        return self.threads if self.threads is not None else getattr(self, "_listed_threads", None)

    def _enumerate_now(self):
        L = _dnnl.lib()
        rows, pds, seen = [], [], set()
        last_error = None
        with _dnnl._cache_guard:   # the iterator's descriptors may be the primitive cache's own (see there)
            gen = _dnnl._cache_guard.generation
            for layouts in ("any", "user"):
                last_error = self._walk(layouts, rows, pds, seen, L) or last_error
        if not rows:
            raise last_error or NotSupportedError("oneDNN offers no implementation for " + self.problem.describe())
        self._impls, self._pds, self._pds_gen = rows, pds, gen
        log.debug("listed %d implementations for %s %s: %s", len(rows), self.direction, self.problem.describe(),
                  ", ".join(r.choice for r in rows))

    def _walk(self, layouts: str, rows: list, pds: list, seen: set, L):
        """Append the implementations oneDNN lists on ``layouts`` to ``rows`` (their cloned
        descriptors to ``pds``), each (name, formats) once; returns the NotSupportedError when
        oneDNN offers none there."""
        try:
            it = self._create_pd(layouts)
        except NotSupportedError as exc:
            return exc
        while True:
            impl, pd = self._describe(it, layouts, len(rows))
            key = (impl.name, tuple(impl.formats.items()))
            # oneDNN 3.2 repeats the whole list when its primitive cache holds these
            # primitives (shared/cases C3): keep each (name, layouts) once.
            if key not in seen:
                seen.add(key)
                rows.append(impl)
                pds.append(pd)
            if L.dnnl_primitive_desc_next_impl(it) != 0:
                break
        return None

    def _fresh_pd(self, i: int):
        """Implementation ``i``'s descriptor to create its primitive from, called inside a
        ``_dnnl._cache_guard`` section that also spans the creation: the listed one, or, when
        oneDNN's primitive cache was emptied since the listing (its generation moved), the one a new
        listing gives for the same implementation and layouts (a descriptor the iterator took from
        the cache is unsafe once the cache was emptied: ``_dnnl._CacheGuard``)."""
        gen = _dnnl._cache_guard.generation
        if getattr(self, "_pds_gen", gen) == gen:
            return self._pds[i]
        rows, pds = [], []
        with _omp_threads(self._pd_threads()):
            for layouts in ("any", "user"):
                self._walk(layouts, rows, pds, set(), _dnnl.lib())
        fresh = {(r.name, r.layouts, tuple(r.formats.items())): pd for r, pd in zip(rows, pds)}
        new = []
        for r in self._impls:
            pd = fresh.get((r.name, r.layouts, tuple(r.formats.items())))
            if pd is None:
                raise NotSupportedError(f"oneDNN no longer offers {r.choice} for {self.problem.describe()} after its "
                                        "primitive cache was emptied; make the plan again")
            new.append(pd)
        self._pds, self._pds_gen = new, gen
        return new[i]

    def _describe(self, it, layouts: str, index: int):
        pd = _dnnl.pd_clone(it)
        formats, reorders = {}, []
        self._mds()
        for role, _arg, query, is_out in _ARGS[self.direction]:
            if role in ("b", "db") and not self.problem.has_bias:
                continue
            q, _, idx = query.partition(":")
            md = _dnnl.pd_md(pd, q, int(idx or 0))
            formats[role] = _dnnl.md_format(md)
            if not _dnnl.md_equal(md, self.user_md[role]):
                reorders.append(role)
        sp = _dnnl.md_size(_dnnl.pd_md(pd, "scratchpad"))
        name = _dnnl.pd_impl_name(pd)
        bad = self._known_bad(name, formats, layouts)
        impl = Implementation(index, name, layouts, formats, tuple(reorders), sp, self.direction,
                              known_bad=bad.reference if bad is not None else "")
        return impl, pd

    def _known_bad(self, name: str, formats, layouts):
        """The :mod:`rawconv.known_bad` row for implementation ``name`` on this plan, or None."""
        return _known_bad.check("onednn", self.problem, self.direction, name, library_version(), formats=formats,
                                layouts=layouts)

    @property
    def implementations(self) -> ResultTable:
        """Every implementation oneDNN offers for this problem (see :class:`Implementation`),
        without duplicates. Wraps ``dnnl_primitive_desc_next_impl`` / ``dnnl_primitive_desc_clone``."""
        self._check_live()
        if self._impls is None:
            with self._lock:
                if self._impls is None:
                    self._enumerate()
        return ResultTable(self._impls, title=f"oneDNN {_dnnl.version()['version']} implementations: "
                                              f"{self.direction} {self.problem}")

    # ------------------------------------------------------------------ selection
    def _resolve(self, impl: Any, allow_known_bad: bool = False) -> int:
        i = self._resolve_any(impl)
        if impl is None or allow_known_bad:
            return i
        r = self._impls[i]
        if r.known_bad:
            what = f"impl={impl!r}" if not isinstance(impl, Implementation) else f"impl={r.name} ({r.layouts})"
            bad = self._known_bad(r.name, r.formats, r.layouts)
            err = _known_bad.error(bad, self.problem, self.direction, f"{r.name} ({r.layouts})", library_version(),
                                   what=what)
            others = [o for o in self._impls if o.name == r.name and not o.known_bad]
            if others:
                err.args = (err.args[0] + f"; {r.name} with layouts={others[0].layouts} is not affected: "
                            f"impl={r.name + '@' + others[0].layouts!r}",)
            err.offered = [o.name for o in self._impls]
            raise err
        return i

    def _first_choice(self, allow_known_bad: bool) -> int:
        """oneDNN's first choice (position 0), or, when that is known bad and not allowed, the first
        implementation in oneDNN's order that is not (with a RuntimeWarning)."""
        impls = self.implementations
        if allow_known_bad or not impls[0].known_bad:
            return 0
        good = [i for i, r in enumerate(impls) if not r.known_bad]
        first = impls[0]
        if not good:
            raise _known_bad.error(self._known_bad(first.name, first.formats, first.layouts), self.problem,
                                   self.direction, first.name, library_version(),
                                   what="every implementation oneDNN offers is known bad; its first choice")
        alt = impls[good[0]]
        warnings.warn(f"oneDNN's first choice {first.name} ({first.layouts}) is known bad for "
                      f"{self.problem.describe()} ({self.direction}): {first.known_bad}; running [{alt.index}] "
                      f"{alt.name} ({alt.layouts}) instead (allow_known_bad=True keeps oneDNN's first choice)",
                      RuntimeWarning, stacklevel=_guard.stacklevel())
        return good[0]

    def first_without_data_reorders(self) -> int:
        """The position of oneDNN's first choice (:meth:`select` without arguments), or, when that
        one converts x or y on every call (its src/dst formats are not the tensors' own: a blocked
        ``aBcd16b`` or a plain ``abcd`` for channels_last tensors) and oneDNN also offers the same
        implementation on the tensors' own layouts (``layouts="user"``, not known bad), that one:
        the same kernel without the two reorders per call. oneDNN 3.2 lists ``jit:avx512_core`` with
        an NCHW source and a blocked destination first for a channels_last layer of 3 input
        channels (a model's stem; it has no brgconv there, newer builds do) although it runs
        ``jit:avx512_core@user`` on the NHWC tensors as they are; on the 2-core AVX-512 EPYC
        (2026-12-07, min of 40 interleaved calls) 0.33 against 0.45 ms (resnet50's 7x7 stem,
        batch 1, 112x112) and 0.08 against 0.12 ms (a 3x3 stride-2 stem). What the frozen
        modules of ``rawconv.nn.convert(..., fuse=True)`` run when nothing was chosen for them."""
        i = self._first_choice(self.allow_known_bad)
        impls = self.implementations
        first = impls[i]
        data = {r for r in first.reorders if r not in ("w", "dw")}
        if not data or first.layouts == "user":
            return i
        for j, r in enumerate(impls):
            if r.name == first.name and r.layouts == "user" and not r.known_bad and \
                    not {q for q in r.reorders if q not in ("w", "dw")}:
                return j
        return i

    def first_on_tensor_layouts(self) -> int:
        """The position of what torch's oneDNN is asked for on this problem, in this oneDNN: for a
        channels-last problem whose first choice (:meth:`select` without arguments) converts x or
        y (dy, dx) on every call, oneDNN's first implementation on the tensors' own layouts
        (``layouts="user"``: src and dst as the tensors are, weights ``any``, as torch's
        ``mkldnn_convolution`` and its backward call oneDNN on channels-last tensors) that converts
        neither and is neither a reference implementation (``ref:*``) nor known bad; otherwise the
        first choice (torch asks for ``any`` layouts on NCHW tensors too, reordering them). The
        operators of :mod:`rawconv.ops` (so :mod:`rawconv.nn`'s modules) run it in each direction
        when nothing is pinned; the function forms run the first choice.
        Why: oneDNN 3.2's first choice for a backward pass on channels-last tensors converts x and
        dy to a blocked or NCHW layout on every call, and for the weights of a depthwise 5x5 / 7x7
        it is ``x64:gemm:jit`` on NCHW copies. On the 2-core AVX-512 EPYC (2026-12-07, 1 thread,
        batch 2, min of 7 interleaved calls) convnext_tiny's depthwise 7x7 (96 channels, 32x32)
        backward weights: 7.14 ms (``x64:gemm:jit@any``) against 1.88 ms (``jit:avx512_core@user``,
        the kernel torch's oneDNN 3.12 runs; torch 2.46 ms); efficientnet_b0's 5x5 (240, 16x16):
        3.01 against 1.04 ms (torch 1.18); the backward data of its 1x1 from 16 to 96 channels (64x64):
        0.23 against 0.14 ms (torch 0.40); its stem's forward (3 input channels), 0.146 against 0.080 ms."""
        i = self._first_choice(self.allow_known_bad)
        impls = self.implementations
        first = impls[i]
        if self.problem.layout != "nhwc" or first.layouts == "user" or \
                not {r for r in first.reorders if r not in ("w", "dw")}:
            return i
        for j, r in enumerate(impls):
            if r.layouts == "user" and not r.known_bad and not r.name.startswith("ref") and \
                    not {q for q in r.reorders if q not in ("w", "dw")}:
                return j
        return i

    def _resolve_any(self, impl: Any) -> int:
        impl = _check_impl(impl)
        impls = self.implementations
        if impl is None:
            return 0
        if isinstance(impl, Implementation):
            for i, r in enumerate(impls):
                if r.name == impl.name and r.layouts == impl.layouts and r.formats == impl.formats \
                        and r.direction == impl.direction:
                    return i

            def fmt(r):
                return " ".join(f"{_ROLE_NAMES.get(k, k)}={v}" for k, v in r.formats.items())

            same = [r for r in impls if r.name == impl.name and r.layouts == impl.layouts]
            if impl.direction != self.direction:
                why = (f"it was listed for direction {impl.direction!r}, this plan's direction is "
                       f"{self.direction!r}")
            elif same:
                why = (f"it was listed with formats {fmt(impl)}, here {impl.name} ({impl.layouts}) has formats "
                       f"{fmt(same[0])} (another problem or memory layout)")
            else:
                why = "it was listed for another problem"
            raise NotSupportedError(f"implementation {impl.name} ({impl.layouts}) is not offered for "
                                    f"{self.problem.describe()} ({self.direction}): {why}; offered: "
                                    f"{[r.name for r in impls]}",
                                    library="oneDNN", offered=[r.name for r in impls])
        if isinstance(impl, int):
            if not 0 <= impl < len(impls):
                raise NotSupportedError(
                    f"impl={impl} is out of range: oneDNN offers {len(impls)} implementations for "
                    f"{self.problem.describe()}: " + ", ".join(f"{r.index}:{r.name}" for r in impls),
                    library="oneDNN", offered=[r.name for r in impls])
            return impl
        name, _, layouts = impl.partition("@")
        matches = [i for i, r in enumerate(impls) if r.name == name and (not layouts or r.layouts == layouts)]
        if not layouts and len({impls[i].layouts for i in matches}) > 1:
            # a short name that two listed candidates share (ref:any@any and ref:any@user): say which
            listed = ", ".join(f"{impls[i].choice} [{i}]" + (" (known bad)" if impls[i].known_bad else "")
                               for i in matches)
            raise ArgumentError(f"implementation {impl!r} is ambiguous for {self.problem.describe()} "
                                f"({self.direction}): it names {len(matches)} listed candidates: {listed}; pass "
                                f"one of those names (name@layouts) or its position")
        if not matches:
            names = sorted({r.name for r in impls}, key=[r.name for r in impls].index)
            raise NotSupportedError(
                f"implementation {impl!r} is not offered by oneDNN {_dnnl.version()['version']} for "
                f"{self.problem.describe()} ({self.direction}, fpmath {self.fpmath}); offered: {', '.join(names)}"
                + _name_hint(impl, name, names), library="oneDNN", offered=names)
        # several entries with this name: the one with the fewest per-call reorders, then oneDNN's order
        return min(matches, key=lambda i: (len([r for r in impls[i].reorders if r not in ("w",)]), i))

    def select(self, impl: Any = None, *, allow_known_bad: bool | None = None, choice: Any = None) -> Implementation:
        """Select the implementation :meth:`execute` runs: an int position, a name (the canonical
        ``"name@layouts"``, e.g. ``"x64:gemm:jit@any"``, each listed row's ``choice``; or the short
        ``"x64:gemm:jit"`` when one listed candidate has it), an :class:`Implementation` of this
        plan's list, or None for oneDNN's first choice (position 0; when that is known bad, the next
        one that is not, with a ``RuntimeWarning``). Raises
        :class:`~rawconv.errors.ArgumentError` for a short name that names candidates of several
        layouts (``"ref:any"``: ``ref:any@any`` and ``ref:any@user``), listing them,
        :class:`NotSupportedError` naming what oneDNN offers, and
        :class:`~rawconv.errors.KnownBadError` (naming the issue) for an implementation
        :mod:`rawconv.known_bad` lists for this problem, unless ``allow_known_bad`` (default: the
        plan's setting)."""
        if choice is not None:
            if impl is not None and impl != choice:
                raise ArgumentError(f"choice={choice!r} and impl={impl!r} disagree; pass one")
            impl = choice
        allow = self.allow_known_bad if allow_known_bad is None else _check_allow(allow_known_bad)
        i = self._first_choice(allow) if impl is None else self._resolve(impl, allow)
        self._selected = i
        return self._impls[i]

    def hot_run(self, a, b, bias=None, out=None):
        """The plan contract's one call (:class:`rawconv.core.backend.Plan`): forward ``a, b`` = x,
        w; backward data grad_y, w; backward weights x, grad_y. The hot path (metadata of an
        earlier checked call, no further checks) when it applies, else :meth:`execute`."""
        d = self.direction
        if d == "forward":
            y = self._hot_run(a, b, bias, out) if self._hot is not None else None
            return y if y is not None else self.execute(a, b, bias, out)
        r = self._grad_hot_run(a, b) if out is None else None
        if r is not None:
            return r
        return self.execute(grad_y=a, w=b, out=out) if d == "backward_data" else self.execute(a, grad_y=b)

    @property
    def selected(self) -> Implementation:
        """The implementation :meth:`execute` runs (oneDNN's first choice unless selected/autotuned;
        see :meth:`select` for a first choice that is known bad)."""
        self._check_live()
        if self._selected is None:
            self._selected = self._first_choice(self.allow_known_bad)
        return self._impls[self._selected]

    def _build(self, i: int) -> _Built:
        b = self._built.get(i)
        if b is None:
            log.debug("building %s for %s %s", self._impls[i].choice, self.direction, self.problem.describe())
            # the primitive cache's key holds the thread count; no emptying of the cache between
            # the descriptor's check and the primitive's creation (_fresh_pd)
            with _omp_threads(self._pd_threads()), _dnnl._cache_guard:
                b = _Built(self, self._impls[i], self._fresh_pd(i))
            self._built[i] = b
            self._count_rebuild(i)
        return b

    def _count_rebuild(self, i: int) -> None:
        """Tell the plans' byte budget when implementation ``i`` was built again after a release."""
        if i in self._released:
            self._released.discard(i)
            _plans.rebuilt()


# only rawconv's exceptions leave them (rawconv.core.guard), named as the public methods they are
_guard.public_methods("implementations", "select", "selected", "hot_run", owner="rawconv.onednn.Convolution")(Listing)
