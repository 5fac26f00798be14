"""The oneDNN plan, :class:`Convolution` (its listing and autotune are the mixins of
:mod:`.listing` and :mod:`.autotune`), and the reference-time estimate its ``ref:*`` calls are
warned by. Imports nothing of the package face (:mod:`rawconv.onednn` hands these names on).
"""
from __future__ import annotations

import math
import threading
import time
import warnings
from typing import Any

import torch

from . import _ffi as _dnnl
from ..core import guard as _guard
from ..core.errors import ArgumentError, ArgumentTypeError, NotSupportedError
from ..core.plans import PlanLifetime
from ..core.problem import ConvProblem, empty_like_layout, strides_match, to_layout
from ..core.results import ResultTable
from .primitive import (DTYPES, Implementation, _Built, _GradHot, _Hot, _PLAIN, _ROLE_NAMES, _SNAP_GENERATION,
                        _check_algorithm, _check_allow, _check_direction, _check_impl, _check_out, _check_threads,
                        _increment_version, _threads_text, _words, check_fpmath, plan_threads, weights_layout)


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
            # (strides compared in the dims of size > 1 when they differ: a (N, C, 1, 1) gradient comes with
            # either format's strides from step to step, and the same memory serves)
            if type(a) not in _PLAIN or a.shape != sa[0] or (a.stride() != sa[1] and not strides_match(a, sa[1])) \
                    or a.dtype is not dt or not a.is_cpu or a.is_neg() or type(b) not in _PLAIN or b.shape != sb[0] \
                    or (b.stride() != sb[1] and not strides_match(b, sb[1])) or b.dtype is not sb[2] \
                    or not b.is_cpu or b.is_neg():
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
            if type(x) not in _PLAIN or x.shape != xs[0] or (x.stride() != xs[1] and not strides_match(x, xs[1])) \
                    or x.dtype is not dt or not x.is_cpu or x.is_neg():
                return None
            if not own:
                ws = hot.w
                if type(w) not in _PLAIN or w.shape != ws[0] or (w.stride() != ws[1] and not strides_match(w, ws[1])) \
                        or w.dtype is not dt or not w.is_cpu or w.is_neg():
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


