"""The module classes of :mod:`rawconv.nn`: :class:`Conv1d` ... :class:`ConvTranspose3d` (torch's modules
on pinned rawconv choices), the fused :class:`ConvBiasAct1d` / ``2d`` / ``3d``, and ``_FusedSequential``
(what :func:`convert` makes of a Sequential torch.fx cannot trace). Their ``__module__`` is
``rawconv.pytorch.nn``, so models saved with them load as before."""
from __future__ import annotations

import copy
import warnings
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from . import autocast as _autocast
from . import fallback as _fallback
from . import fused as _fused
from . import fusion as _fusion
from . import registered as _registered
from .pins import check_choice as _check_choice, choice_library as _choice_library, split as _split
from .. import onednn
from ..core.grad import functorch_active as _functorch, has_tangent as _has_tangent
from ..core.errors import ArgumentError, ArgumentTypeError, InternalError, NotSupportedError
from ..core.problem import tuple_arg
from ..core import guard as _guard
from . import functional as _functional
from .functional import (BACKENDS, _alias, _check_backend, _check_precision, _norm_padding, _resolve_backend, conv,
                         conv_transpose)
from .search import (_NEW_ATTR, _OFFERED_ON, _RECORDING, _TUNED_ATTR, _UNFUSED_OFFERED_ON, _can_search_now,
                     _offered_here, _onednn_here, _record, _search_new, _sig_of, _unfused_offered_here)

FACE = "rawconv.pytorch.nn"   # where this module's public names live (rawconv.nn): pickles, messages


_autocasting = torch._C._is_any_autocast_enabled
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _epilogue_to_inductor(compiling: bool, x, b, choice, activation: str, residual, groups: int):
    """The convolution-only choice a fused layer's call under torch.compile runs, its bias,
    residual and activation then left to inductor as torch ops, or False (the operator runs the
    layer whole). Only on CUDA, for a layer with a bias that cuDNN runs unfused anyway: an
    ``"unfused:<config>"`` choice (``<config>`` is returned), or no choice where cuDNN's default
    splits (rawconv.cudnn.graph's ``_default_split``: a plain conv + bias, a grouped convolution;
    None is returned)."""
    if not compiling or b is None or not getattr(x, "is_cuda", False):
        return False
    if isinstance(choice, str) and choice.strip().lower().startswith("unfused:"):
        return choice.strip()[8:] or None
    if choice is None and ((activation == "none" and residual is None) or groups > 1):
        return None
    return False
_get_ident = onednn.thread_ident   # (thread, its OpenMP count): the modules' argument packs are per thread
_F32 = torch.float32
_OPS: list = [None]   # rawconv.ops, once loaded (the modules' per-call path)


def _load_ops():
    from . import ops

    _OPS[0] = ops
    return ops


class _RawconvConv:
    """Mixin: a torch ConvNd / ConvTransposeNd whose forward runs on rawconv."""

    _transposed = False

    def _rawconv_init(self, backend="auto", choice=None, backward_choice=None, precision=None, impl=None,
                      backward_impl=None, fpmath=None, fallback="torch"):
        if fallback not in _fallback.MODES:
            raise ArgumentError(f"fallback must be one of {list(_fallback.MODES)} (\"torch\": what rawconv cannot run "
                                f"runs on torch's own kernel, said once and counted), got {fallback!r}")
        self.fallback = fallback
        self.backend = _check_backend(backend)
        what, bwhat = ("impl" if impl is not None else "choice"), ("backward_impl" if backward_impl is not None
                                                                   else "backward_choice")
        # a pinned training step (a TrainingChoice or a dict per library direction): its forward and backward parts
        choice, backward_choice = _split(_alias(choice, impl, "choice", "impl"),
                                         _alias(backward_choice, backward_impl, "backward_choice", "backward_impl"),
                                         self._transposed)
        self.choice = _check_choice(choice, what)
        self.backward_choice = _check_choice(backward_choice, bwhat, pair=True)
        self.precision = _check_precision(_alias(precision, fpmath, "precision", "fpmath", "strict"))
        self._choice_backend = self._device_backend()
        named = _choice_library(self.choice, "impl" if impl is not None else "choice") or \
            _choice_library(self.backward_choice, "backward_choice")
        if named is not None and self.backend == "auto":
            # a name of the other device's library (a cuDNN algorithm on a module built on the CPU, to
            # be moved with .cuda()): kept for that device; a call on this one says what it needs
            self._choice_backend = named
        w = _fallback.weight_source(self)   # (a parametrized weight is not computed: its forward may change state)
        self.__dict__["_rawconv_device"] = w.device.type if w is not None else "cpu"

    impl = property(lambda self: self.choice, lambda self, v: setattr(self, "choice", v))   # old names
    backward_impl = property(lambda self: self.backward_choice, lambda self, v: setattr(self, "backward_choice", v))
    fpmath = property(lambda self: self.precision, lambda self, v: setattr(self, "precision", v))

    def _device_backend(self) -> str:
        w = _fallback.weight_source(self)   # (a parametrized weight is not computed: its forward may change state)
        dev = w.device if w is not None else torch.device("cpu")
        if self.backend != "auto":
            return self.backend
        return "cudnn" if dev.type == "cuda" else "onednn"

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self._follow_device()
        return out

    def _follow_device(self) -> None:
        """After ``.to()`` / ``.cuda()`` / ``.cpu()``: an explicit backend of the other device
        switches (``"onednn"`` <-> ``"cudnn"``), and pinned choices made for the other backend are
        dropped (with a warning): a oneDNN implementation name means nothing to cuDNN."""
        if not hasattr(self, "backend"):   # during __init__ (torch moves parameters before _rawconv_init)
            return
        dev = _fallback.weight_source(self).device.type
        stayed = self.__dict__.get("_rawconv_device") == dev
        self.__dict__["_rawconv_device"] = dev
        want = "cudnn" if dev == "cuda" else "onednn" if dev == "cpu" else None
        if self.backend not in BACKENDS and _registered.device_type(self.backend) == dev:
            return   # a registered backend of this device (rawconv.pytorch.registered) keeps its choices
        if want is None or (stayed and self.backend in ("auto", want)):
            # (.half(), .float(), .to(dtype): the device stays, and so do choices named for the other
            # device's library, e.g. a cuDNN algorithm on a module built on the CPU to be moved later)
            return
        if self.backend != "auto" and self.backend != want:
            self.backend = want
        if self._choice_backend != want:
            tuned = self.__dict__.get(_TUNED_ATTR)
            if self.choice is not None or self.backward_choice is not None or tuned:
                what = f"choice {self.choice!r} (backward {self.backward_choice!r})"
                if tuned:
                    what += f" and the autotuned choices of {len(tuned)} problem(s)"
                warnings.warn(f"{type(self).__name__}: moved to {dev}; the {self._choice_backend} {what} "
                              f"were dropped (the {want} default runs: set .choice or use "
                              "rawconv.nn.convert(..., autotune=x))", RuntimeWarning, stacklevel=_guard.stacklevel())
            self.choice = self.backward_choice = None
            self.__dict__.pop(_TUNED_ATTR, None)
            self._choice_backend = want

    def __getstate__(self):
        """A pickle without the argument pack of :meth:`forward` (its plans hold the library's
        objects, which neither copies nor pickles): the unpickled module makes its own."""
        state = super().__getstate__()
        state.pop("_rawconv_entry", None)
        return state

    def __deepcopy__(self, memo):
        """A copy (``copy.deepcopy``) as torch's default one (the same class, ``__setstate__`` of
        the deep-copied ``__dict__``), without the argument pack of :meth:`forward`: the copy
        makes its own. Defined here, not left to ``__getstate__``, so that it also holds under
        ``torch.nn.utils.parametrize`` (whose injected class deep-copies ``__dict__`` unless the
        module class has its own ``__deepcopy__``; ``weight_norm``, ``spectral_norm``,
        ``AveragedModel``)."""
        cls = type(self)
        replica = cls.__new__(cls)
        memo[id(self)] = replica
        state = {k: v for k, v in self.__dict__.items() if k != "_rawconv_entry"}
        replica.__setstate__(copy.deepcopy(state, memo))
        return replica

    def _padded(self, x):
        """(input, padding) for the library: non-'zeros' padding modes pad in torch first
        (``F.pad``; its refusal of the input, e.g. a reflect padding not smaller than the input,
        is raised as :class:`ArgumentError` with torch's message: a ``RuntimeError`` as torch's)."""
        if self.padding_mode != "zeros":
            try:
                return F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode), 0
            except (RuntimeError, ValueError, NotImplementedError) as exc:
                new = _guard.translate(exc, f"rawconv.nn.{type(self).__name__}.forward")
                if new is None or not isinstance(new, InternalError):
                    raise
                raise ArgumentError(f"{type(self).__name__}: padding_mode={self.padding_mode!r} with padding "
                                    f"{self._reversed_padding_repeated_twice} on input {tuple(x.shape)}: torch's "
                                    f"F.pad says: {exc}") from exc
        return x, self.padding

    def _tuned_for(self, kind: str, x, extra, args: dict, w=None):
        """(choice, backward_choice) for this call: the module's own ``choice`` / ``backward_choice``
        where set (they apply to every problem), else the autotuned ones of the call's problem (the
        module's :data:`_TUNED_ATTR` table, filled by :func:`convert`'s ``autotune=``), else None
        (the library's default). A problem the autotune did not see is searched now when
        :func:`convert` was given ``autotune_new="search"`` (and nothing is being traced or
        captured), else it runs the default: an autotuned choice is pinned only to the problem it
        was tuned on."""
        choice, bwd = self.choice, self.backward_choice
        if choice is not None and bwd is not None:
            return choice, bwd
        key = _sig_of(kind, x, self.weight if w is None else w, extra)
        if key is not None:
            t = self.__dict__[_TUNED_ATTR].get(key)
            if t is None and self.__dict__.get(_NEW_ATTR) is not None and _can_search_now(x):
                t = _search_new(self, kind, args, key)
            if t is not None:
                if t.backend == "onednn" and t.__dict__.get(_OFFERED_ON) != _onednn_here():
                    t = _offered_here(self, kind, args, key, t)   # tuned on another CPU (or oneDNN)
                return (t.choice if choice is None else choice), (t.backward_choice if bwd is None else bwd)
        return choice, bwd

    def _cast_for(self, x, op: str, residual=None):
        """``(x, w, bias, residual)`` as operator ``rawconv::op``'s autocast kernel casts them (the
        module's parameters), or None outside autocast for x's device (nothing cast)."""
        if _autocasting():
            dev = x.device.type
            if dev in ("cpu", "cuda") and torch.is_autocast_enabled(dev):
                c = _autocast.cast_inputs(op, dev, (x, self.weight, self.bias, residual))
                if c[0] is not x or c[1] is not self.weight:
                    return c
        return None

    def _tuned_on_cast(self, kind: str, x, extra, args: dict, op: str):
        """:meth:`_tuned_for` on the problem the operators run: under autocast, on x (and a fused
        call's residual) and the parameters as operator ``rawconv::op``'s autocast kernel casts
        them, so that a float16 / bfloat16 call looks up (or, with ``autotune_new="search"``,
        searches) its own problem and never gets the choice tuned for the float32 one (which its
        library may not offer)."""
        return self._tuned_cast(kind, x, extra, args, self._cast_for(x, op, args.get("residual")))

    def _tuned_cast(self, kind: str, x, extra, args: dict, c):
        """:meth:`_tuned_on_cast` given ``c``, :meth:`_cast_for`'s result."""
        if c is not None:
            xt, wt, bt, rt = c
            a = dict(args, x=xt, w=wt, b=bt)
            if "residual" in args:
                a["residual"] = rt
            return self._tuned_for(kind, xt, extra, a, wt)
        return self._tuned_for(kind, x, extra, args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if type(x) in _PLAIN_TENSORS and (x.dtype is not _F32 or not (x.is_cpu or x.is_cuda) or not self.in_channels):
            why = _fallback.reason_for(self, x)   # (float32 CPU/CUDA tensors never fall back: no look-up)
            if why is not None:   # float64 on the CPU, complex, no f16 here...: torch's own kernel
                return _fallback.run(self, why, self._torch_base, x)
        try:
            return self._rawconv_forward(x)
        except NotSupportedError as exc:   # the library has no implementation of this problem, none pinned
            if not _fallback.library_refused(exc) or not _fallback.may_fall_back(self) or \
                    self.__dict__.get(_TUNED_ATTR) or type(x) not in _PLAIN_TENSORS:
                raise
            return _fallback.run(self, _fallback.unsupported_reason(exc), self._torch_base, x)

    def _rawconv_forward(self, x: torch.Tensor) -> torch.Tensor:
        d = self.__dict__
        if self.padding_mode == "zeros" and not _RECORDING and type(x) in _PLAIN_TENSORS and _functional.USE_OPS \
                and not torch.compiler.is_compiling():
            # the module's own argument pack: validated once per configuration (stride, padding,
            # dilation, groups, backend, choice, precision, backward choice, the weight's shape and
            # the input's device type), then rawconv.ops runs it as rawconv.ops.conv does; one per
            # thread (and OpenMP count), as rawconv.ops keeps its own: the plans it holds are not
            # thread-safe (a plan's memory handles are set per call). An autotuned module's choices
            # are those of this call's problem (its table, as the path below reads it)
            w = self.weight
            ch, bc = self.choice, self.backward_choice
            if d.get(_TUNED_ATTR) is not None:
                ch, bc = self._tuned_on_cast("conv", x, None, {"x": x, "padding": self.padding}, "conv_forward")
            # (a list argument as its values now: one changed in place after this call must not match)
            st, pd, dl = self.stride, self.padding, self.dilation
            if type(st) is list or type(pd) is list or type(dl) is list or type(bc) is list or \
                    (type(pd) is tuple and pd and type(pd[0]) is not int):   # (pairs, maybe lists)
                st, pd, dl, bc = _norm_padding(st), _norm_padding(pd), _norm_padding(dl), _norm_padding(bc)
            key = (st, pd, dl, self.groups, self.backend, ch, self.precision, bc, w.shape, x.is_cuda, x.is_cpu)
            ident = _get_ident()
            packs = d.get("_rawconv_entry")
            e = packs.get(ident) if packs is not None else None
            if e is None or e[0] != key:
                if packs is None or len(packs) >= 64:   # (threads come and go: past 64, start again)
                    packs = d["_rawconv_entry"] = {}
                e = packs[ident] = (key, self._entry(x, w, ch, bc))
            try:
                return (_OPS[0] or _load_ops())._conv_entry(x, w, self.bias, e[1])
            except Exception as exc:
                new = _guard.translate(exc, f"rawconv.nn.{type(self).__name__}.forward")
                if new is None:
                    raise
                raise new from exc
        x, padding = self._padded(x)
        _record(self, "conv", x=x, padding=padding)
        choice, bwd = self.choice, self.backward_choice
        if d.get(_TUNED_ATTR) is not None:
            choice, bwd = self._tuned_on_cast("conv", x, None, {"x": x, "padding": padding}, "conv_forward")
        return conv(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups,
                    backend=self.backend, choice=choice, precision=self.precision, backward_choice=bwd)

    def _entry(self, x, w, choice=None, backward_choice=None) -> list:
        """The argument pack of :func:`rawconv.ops._conv_entry` for this module's configuration
        with ``choice`` and ``backward_choice`` (the module's own, or those autotuned for the
        call's problem), checked as :func:`conv` checks its arguments (raises its errors)."""
        choice = _check_choice(choice, "choice")
        bwd = _check_choice(backward_choice, "backward_choice", pair=True)
        precision = _check_precision(self.precision)
        _check_backend(self.backend)
        _resolve_backend(self.backend, x.device)
        args = _load_ops()._prepare_conv(x, w, self.bias, self.stride, _norm_padding(self.padding), self.dilation,
                                           self.groups, self.backend, choice, precision, bwd)
        return _load_ops()._new_entry(args)

    def extra_repr(self) -> str:
        tuned = self.__dict__.get(_TUNED_ATTR)
        # what convert(autotune=...) pinned (per problem) when choice= itself is not set
        extra = f", tuned={[t.as_dict()['choice'] for t in tuned.values()]!r}" if tuned and self.choice is None else ""
        return (super().extra_repr() + f", backend={self.backend!r}, choice={self.choice!r}{extra}, "
                f"precision={self.precision!r}")


class _RawconvConvTranspose(_RawconvConv):
    _transposed = True

    def forward(self, x: torch.Tensor, output_size: Sequence[int] | None = None) -> torch.Tensor:
        if type(x) in _PLAIN_TENSORS and (x.dtype is not _F32 or not (x.is_cpu or x.is_cuda) or not self.in_channels):
            why = _fallback.reason_for(self, x)
            if why is not None:
                return _fallback.run(self, why, self._torch_base, x, output_size)
        try:
            return self._rawconv_forward(x, output_size)
        except NotSupportedError as exc:
            if not _fallback.library_refused(exc) or not _fallback.may_fall_back(self) or \
                    self.__dict__.get(_TUNED_ATTR) or type(x) not in _PLAIN_TENSORS:
                raise
            return _fallback.run(self, _fallback.unsupported_reason(exc), self._torch_base, x, output_size)

    def _rawconv_forward(self, x: torch.Tensor, output_size: Sequence[int] | None = None) -> torch.Tensor:
        if self.padding_mode != "zeros":
            raise ArgumentError(f"only 'zeros' padding mode is supported for {type(self).__name__}")
        nd = len(self.kernel_size)
        try:   # torch's own computation of output_padding from output_size, with torch's errors
            output_padding = self._output_padding(x, output_size, self.stride, self.padding, self.kernel_size, nd,
                                                  self.dilation)
        except ValueError as exc:   # an output_size no output_padding reaches, or of the wrong length
            raise ArgumentError(f"{type(self).__name__}: {exc}") from None
        except TypeError as exc:    # not a sequence of ints
            raise ArgumentTypeError(f"{type(self).__name__}: output_size must be a sequence of ints or None: "
                                    f"{exc}") from None
        _record(self, "transpose", x=x, output_padding=tuple(output_padding))
        choice, bwd = self.choice, self.backward_choice
        if self.__dict__.get(_TUNED_ATTR) is not None:
            choice, bwd = self._tuned_on_cast("transpose", x, tuple(output_padding),
                                              {"x": x, "output_padding": tuple(output_padding)}, "conv_backward_data")
        return conv_transpose(x, self.weight, self.bias, self.stride, self.padding, output_padding, self.groups,
                              self.dilation, backend=self.backend, choice=choice, precision=self.precision,
                              backward_choice=bwd)


def _module(base, mixin, doc: str):
    class Module(mixin, base):
        def __init__(self, *args, backend: str = "auto", choice: Any = None, backward_choice: Any = None,
                     precision: str | None = None, impl: Any = None, backward_impl: Any = None,
                     fpmath: str | None = None, fallback: str = "torch", **kwargs):
            base.__init__(self, *args, **kwargs)
            self._rawconv_init(backend, choice, backward_choice, precision, impl, backward_impl, fpmath, fallback)

    Module.__name__ = Module.__qualname__ = base.__name__
    Module.__module__ = FACE
    Module._torch_base = base
    Module.__doc__ = (f"``torch.nn.{base.__name__}`` on rawconv: same arguments and state_dict, plus ``backend`` "
                      "(\"auto\" | \"onednn\" | \"cudnn\"), ``choice``, ``backward_choice``, ``precision`` (old "
                      "names ``impl``, ``backward_impl``, ``fpmath``: DeprecationWarning), ``fallback`` (\"torch\": "
                      "a call no rawconv library can run, e.g. float64 on the CPU, runs torch's own kernel, said once "
                      "and counted, :mod:`rawconv.pytorch.fallback`; \"error\": refused). " + doc)
    return Module


_CONV_DOC = "Non-'zeros' padding modes pad in torch first."
_T_DOC = ("Runs as the backward-data primitive of the matching convolution; ``choice`` is a backward-data "
          "candidate; ``backward_choice`` a (forward choice for grad x, backward-weights choice) pair.")
Conv1d = _module(torch.nn.Conv1d, _RawconvConv, _CONV_DOC)
Conv2d = _module(torch.nn.Conv2d, _RawconvConv, _CONV_DOC)
Conv3d = _module(torch.nn.Conv3d, _RawconvConv, _CONV_DOC)
ConvTranspose1d = _module(torch.nn.ConvTranspose1d, _RawconvConvTranspose, _T_DOC)
ConvTranspose2d = _module(torch.nn.ConvTranspose2d, _RawconvConvTranspose, _T_DOC)
ConvTranspose3d = _module(torch.nn.ConvTranspose3d, _RawconvConvTranspose, _T_DOC)


class _ConvBiasAct(_RawconvConv):
    """Mixin: ``act(conv(x) + bias + residual)`` through :func:`rawconv.fused.conv_bias_act`."""

    def _fused_init(self, activation):
        self.activation = _fused.check_activation(activation)

    def _op_args(self):
        """(stride, padding, dilation) lists as the operator takes them (padding: nd symmetric
        values or 2*nd befores-then-afters), computed once per configuration."""
        key = (_norm_padding(self.stride), _norm_padding(self.padding), _norm_padding(self.dilation),
               self.padding_mode, self.kernel_size)   # (lists as their values now: see _RawconvConv.forward)
        cached = self.__dict__.get("_op_cache")
        if cached is not None and cached[0] == key:
            return cached[1]
        nd = len(self.kernel_size)
        if self.padding_mode != "zeros":
            pads = [0] * nd
        else:
            from ..core.problem import resolve_padding

            pb, pa = resolve_padding(_norm_padding(self.padding), nd, self.kernel_size,
                                     tuple_arg(self.dilation, nd, "dilation", 1), tuple_arg(self.stride, nd, "stride", 1))
            pads = list(pb) + (list(pa) if pa != pb else [])
        args = (list(self.stride), pads, list(self.dilation))
        self.__dict__["_op_cache"] = (key, args)
        return args

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if type(x) in _PLAIN_TENSORS and (x.dtype is not _F32 or not (x.is_cpu or x.is_cuda) or not self.in_channels):
            why = _fallback.reason_for(self, x)
            if why is not None:   # torch's convolution, then the BatchNorm, the add and the activation
                _fallback.note(self, why)
                y = self._torch_base._conv_forward(self, x, self.weight, self.bias)
                bn = self.__dict__.get(_fused.BN_KEY)
                y = bn_forward(bn, y) if bn is not None else y
                return _fused.apply_activation(y + residual if residual is not None else y, self.activation)
        x, padding = self._padded(x)
        stride, pads, dilation = self._op_args()
        w, b, d = self.weight, self.bias, self.__dict__
        bn = d.get(_fused.BN_KEY)
        st = d.get(_fused._FROZEN_STATE)
        recording = torch.is_grad_enabled() and (w.requires_grad or (b is not None and b.requires_grad) or (
            bn is not None and any(t is not None and t.requires_grad for t in (bn.weight, bn.bias))))
        compiling = torch.compiler.is_compiling()
        if recording and st is not None and not compiling:
            st.mark_stale()   # an update of the parameters usually follows a forward that records autograd
        frozen = st is not None and not recording and isinstance(w, torch.nn.Parameter)
        if bn is not None and (not frozen or bn.training):
            # a BatchNorm that cannot be folded now (autograd recording through it, batch statistics in
            # training mode, or no snapshot): the convolution, then the BatchNorm module itself, as before fusion
            return self._unfused(x, padding, residual)
        choice, bwd = self.choice, self.backward_choice
        plans = None
        if frozen:
            # frozen by convert(fuse=True): the snapshot (BatchNorm folded in), taken again first when
            # its sources changed; under torch.compile the operator's kernel does that check
            if compiling:
                w, b = self._buffers[_fused.FROZEN_WEIGHT], self._buffers[_fused.FROZEN_BIAS]
            else:
                if not st.fresh(w, b):
                    st.take(self)
                w, b = st.snap
                plans = st.plans
        if d.get(_TUNED_ATTR) is not None and (plans is None or choice is not None or not x.is_cpu):
            # (a frozen module's oneDNN plans resolve the autotuned choice once per problem, when the
            # plan is made: rawconv.fused._run_frozen, through _frozen_choice; no lookup per call)
            choice, bwd = self._tuned_on_cast("fused", x, residual is not None,
                                              {"x": x, "padding": padding, "residual": residual}, "conv_bias_act")
        if recording and bwd is not None:
            # pinned backward choices: the convolution operator carries them (the fused one has none)
            return self._unfused(x, padding, residual, bwd)
        if isinstance(choice, int) and not isinstance(choice, bool):
            choice = str(choice)
        if residual is not None and not self._residual_fits(x, residual, stride, pads, dilation):
            # a residual that only broadcasts (or of another dtype/device): added in torch, as the
            # graph before fusion did
            y = torch.ops.rawconv.conv_bias_act(x, w, b, None, stride, pads, dilation, self.groups,
                                                "none", self.backend, None, self.precision)
            y = y + residual
            return _fused.apply_activation(y, self.activation)
        if _RECORDING:
            _record(self, "fused", x=x, padding=padding, residual=residual, w=w, b=b)
        if not isinstance(x, torch.Tensor):
            raise ArgumentTypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        eager = type(x) is torch.Tensor and not compiling and not _autocasting() and not (torch.is_grad_enabled() and (
            x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)
            or (residual is not None and residual.requires_grad))) and not _functorch() and not _has_tangent(x, residual)
        unfused = d.get(_fusion.UNFUSED_ATTR)
        if unfused and not recording and self.choice is None and not _autocasting():
            # convert(fuse=True, autotune=x) measured this problem faster unfused: the convolution with
            # its bias, then torch's own add and activation (rawconv.pytorch.fusion); a choice set on
            # the module itself (pin_choices) names a fused implementation and runs it
            key = _sig_of("fused", x, self.weight, residual is not None)
            c = unfused.get(key)
            if c is not None:
                if x.is_cpu and (d.get(_UNFUSED_OFFERED_ON) or {}).get(key) != _onednn_here():
                    # (measured on another CPU or oneDNN: a saved model loaded here)
                    c = _unfused_offered_here(self, key, c, {"x": x, "padding": padding, "w": w, "b": b})
                return _fusion.run_unfused(self, x, w, b, residual, stride, pads, dilation, c, plans, eager)
        if eager:
            # (a torch.func transform's batched tensors have no data pointer; a forward-mode tangent
            # would be dropped: both go through the operator, which runs or refuses them)
            # eager inference: the operator's kernel directly (the dispatcher's round trip costs host time)
            return _fused._op_kernel(x, w, b, residual, stride, pads, dilation, self.groups,
                                     self.activation, self.backend, choice, self.precision,
                                     d.get("residual_inplace", False), plans)
        if residual is not None and d.get("residual_inplace", False) and _fused.RESIDUAL_OP_GUARDED \
                and isinstance(x, torch.Tensor) and not _autocasting() \
                and x.device.type == "cpu" and not (torch.is_grad_enabled() and (
                    x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)
                    or residual.requires_grad)):
            # inference through the operator (torch.compile, a mode): the in-place form, so that
            # the residual is not copied into a new output first (convert marked it safe: a fresh
            # intermediate nothing reads afterwards)
            torch.ops.rawconv.conv_bias_act_residual_(x, w, b, residual, stride, pads, dilation, self.groups,
                                                      self.activation, self.backend, choice, self.precision)
            return residual
        conv_only = _epilogue_to_inductor(compiling, x, b, choice, self.activation, residual, self.groups)
        if conv_only is not False:
            # under torch.compile on CUDA, a layer whose bias cuDNN does not fuse (cuDNN's default for a
            # plain conv + bias or a grouped one: torch's way; an "unfused:" choice) hands its bias add,
            # residual add and activation to inductor, which fuses them into the next kernel, as it does
            # for torch's own convolution (it peels the bias off aten.convolution on CUDA); inside the
            # operator they were one more pass over the output each (ConvNeXt-T's depthwise layers)
            y = torch.ops.rawconv.conv_bias_act(x, w, None, None, stride, pads, dilation, self.groups, "none",
                                                self.backend, conv_only, self.precision)
            y = y + b.to(y.dtype).reshape((1, -1) + (1,) * (y.dim() - 2))
            return _fused.apply_activation(y + residual if residual is not None else y, self.activation)
        return torch.ops.rawconv.conv_bias_act(x, w, b, residual, stride, pads, dilation,
                                               self.groups, self.activation, self.backend, choice, self.precision)

    def _unfused(self, x, padding, residual, bwd=None):
        """``act(bn(conv(x)) + residual)`` as separate calls: the convolution on rawconv's operator
        (differentiable; ``bwd``: the backward choices, else those autotuned for this problem), the
        BatchNorm module itself (batch statistics in training mode, its running statistics
        updated as torch's), the add and the activation in torch."""
        choice, tuned_bwd = self.choice, self.backward_choice
        if self.__dict__.get(_TUNED_ATTR) is not None:
            c = self._cast_for(x, "conv_forward")   # (under autocast: the cast problem's choices)
            choice, tuned_bwd = self._tuned_cast("conv", x, None, {"x": x, "padding": padding}, c)
            if tuned_bwd is None:   # the fused problem's backward passes are this convolution's
                key = _sig_of("fused", x if c is None else c[0], self.weight if c is None else c[1],
                              residual is not None)
                t = self.__dict__[_TUNED_ATTR].get(key) if key is not None else None
                tuned_bwd = t.backward_choice if t is not None else None
        y = conv(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups, backend=self.backend,
                 choice=choice, precision=self.precision, backward_choice=bwd if bwd is not None else tuned_bwd)
        bn = self.__dict__.get(_fused.BN_KEY)
        if bn is not None:
            y = bn_forward(bn, y)
        if residual is not None:
            y = y + residual
        return _fused.apply_activation(y, self.activation)

    def _frozen_choice(self, x, residual):
        """The forward choice of a frozen module's new oneDNN plan for this (padded) input: the
        autotuned one of the problem (searched now with ``autotune_new="search"``), else ``choice``."""
        if self.__dict__.get(_TUNED_ATTR) is None:
            return self.choice
        padding = 0 if self.padding_mode != "zeros" else self.padding
        choice, _ = self._tuned_for("fused", x, residual is not None,
                                    {"x": x, "padding": padding, "residual": residual}, self.weight)
        return str(choice) if isinstance(choice, int) and not isinstance(choice, bool) else choice

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        _fused.rebind(self)   # .to()/.half(): new snapshot buffers, taken again from the converted sources
        return out

    def __setstate__(self, state):
        super().__setstate__(state)
        _fused.rebind(self)   # a copy or an unpickled module: its own state, the snapshot taken again

    def _residual_fits(self, x, r, stride, pads, dilation) -> bool:
        if not isinstance(r, torch.Tensor) or not isinstance(x, torch.Tensor) or r.dtype != x.dtype \
                or r.device != x.device:
            return False
        if x.dim() not in (self.weight.dim(), self.weight.dim() - 1):
            return True   # let the fused call raise the clear error
        shape, _, _ = _fused._out_meta(x, self.weight, stride, pads, dilation)
        return tuple(r.shape) == tuple(shape)

    @classmethod
    def from_conv(cls, conv: torch.nn.Module, *, activation: str = "relu", bn: torch.nn.Module | None = None,
                  backend: str | None = None, choice: Any = None, precision: str | None = None):
        """A fused module from a ``torch.nn.Conv{1,2,3}d`` (its parameters, shared, and never
        changed). ``bn``: a BatchNorm with running statistics that follows the convolution; the
        module then computes ``act(bn(conv(x)) + residual)``: with the BatchNorm folded into the
        weight snapshot once frozen (:func:`rawconv.fused.freeze`, as :func:`convert` does; the
        fold is taken again from the conv's and the BatchNorm's tensors whenever they change), else,
        and whenever the BatchNorm is in training mode or autograd records, as the convolution
        followed by the BatchNorm module itself. The BatchNorm stays where it is (its state_dict
        entries too): the module only refers to it. Backend/choice/precision default to the
        conv's when it is a rawconv module. A subclass of torch's BatchNorm (timm's ``BatchNormAct2d``)
        is folded as torch's base class computes it: what its own forward adds after the batch norm
        (an activation) is not part of the module; pass it as ``activation``."""
        if bn is not None:
            _check_bn(conv, bn, subclass=True)
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.__dict__.update({k: v for k, v in conv.__dict__.items() if k not in _NOT_COPIED})
        new._parameters = dict(conv._parameters)
        new._buffers = {k: v for k, v in conv._buffers.items() if k not in (_fused.FROZEN_WEIGHT, _fused.FROZEN_BIAS)}
        new._modules = dict(conv._modules)
        if bn is not None:
            new.__dict__[_fused.BN_KEY] = bn
        old = conv if isinstance(conv, _RawconvConv) else None
        new._rawconv_init(backend if backend is not None else (old.backend if old else "auto"),
                          choice if choice is not None else (old.choice if old else None),
                          old.backward_choice if old else None,
                          precision if precision is not None else (old.precision if old else "strict"))
        new._fused_init(activation)
        return new

    def extra_repr(self) -> str:
        return super().extra_repr() + f", activation={self.activation!r}"


def _fused_module(base, name):
    class Module(_ConvBiasAct, base):
        def __init__(self, *args, activation: str = "relu", backend: str = "auto", choice: Any = None,
                     precision: str = "strict", **kwargs):
            base.__init__(self, *args, **kwargs)
            self._rawconv_init(backend, choice, None, precision)
            self._fused_init(activation)

    Module.__name__ = Module.__qualname__ = name
    Module.__module__ = FACE
    Module._torch_base = base
    Module.__doc__ = (f"``activation(conv(x) + bias + residual)`` as ONE library call: a ``torch.nn.{base.__name__}`` "
                      "(same constructor and state_dict) plus ``activation`` (one of rawconv.fused.ACTIVATIONS: "
                      "\"relu\", \"relu6\", \"silu\", \"gelu\", \"gelu_tanh\", \"hardswish\", \"hardsigmoid\", "
                      "\"sigmoid\", \"tanh\", \"none\"), ``backend``, ``choice``, ``precision``; "
                      "``forward(x, residual=None)``. CPU: oneDNN post-ops (sum, eltwise); CUDA: one cuDNN graph "
                      "(hardswish and hardsigmoid in torch after it). Differentiable once (meant for inference).")
    return Module


ConvBiasAct1d = _fused_module(torch.nn.Conv1d, "ConvBiasAct1d")
ConvBiasAct2d = _fused_module(torch.nn.Conv2d, "ConvBiasAct2d")
ConvBiasAct3d = _fused_module(torch.nn.Conv3d, "ConvBiasAct3d")

_TORCH_CONVS = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
_TORCH_TRANSPOSED = (torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)
_SWAP = {torch.nn.Conv1d: Conv1d, torch.nn.Conv2d: Conv2d, torch.nn.Conv3d: Conv3d,
         torch.nn.ConvTranspose1d: ConvTranspose1d, torch.nn.ConvTranspose2d: ConvTranspose2d,
         torch.nn.ConvTranspose3d: ConvTranspose3d}
_FUSED = {1: ConvBiasAct1d, 2: ConvBiasAct2d, 3: ConvBiasAct3d}
_BATCHNORMS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)


def bn_forward(bn: torch.nn.Module, y: torch.Tensor) -> torch.Tensor:
    """The folded BatchNorm ``bn`` of a fused module on ``y``, as torch computes it when the fold
    cannot be used (training mode, autograd recording, a fallback): ``bn(y)`` for torch's own
    BatchNorm classes; for a subclass (folded from a traced ``F.batch_norm`` call on its tensors,
    as timm's ``BatchNormAct2d`` makes: batch norm, then its own activation), the batch norm of
    torch's base class only, since the fused module applies the activation that followed it."""
    t = type(bn)
    if t in _BATCHNORMS:
        return bn(y)
    base = next(b for b in t.__mro__ if b in _BATCHNORMS)
    return base.forward(bn, y)


# what a fused module does not take over from the conv it is made from (its own state, its tables)
_NOT_COPIED = ("_parameters", "_buffers", "_modules", "_rawconv_tuned", "_rawconv_autotune_new",
               _fused._FROZEN_STATE, _fused._FROZEN_PLANS, _fused.BN_KEY, "residual_inplace")


def _check_bn(conv: torch.nn.Module, bn: torch.nn.Module, *, subclass: bool = False) -> None:
    """Raise ArgumentError unless ``bn`` can be folded after ``conv`` (a BatchNorm of the conv's
    spatial rank over its output channels, with running statistics). ``subclass``: a subclass of
    torch's BatchNorm is taken too (convert's fold of a traced ``F.batch_norm`` call on a subclass's
    tensors, e.g. timm's ``BatchNormAct2d``: only its batch norm is folded, see :func:`bn_forward`)."""
    nd = conv.weight.dim() - 2
    base = _BATCHNORMS[nd - 1] if 1 <= nd <= len(_BATCHNORMS) else None
    if base is None or not (type(bn) is base or (subclass and isinstance(bn, base))):
        raise ArgumentError(f"bn must be a torch.nn.BatchNorm{nd}d after a {nd}-d convolution, got {type(bn).__name__}")
    if bn.running_mean is None or bn.running_var is None:
        raise ArgumentError(f"{type(bn).__name__} without running statistics cannot be folded")
    if bn.num_features != conv.out_channels:
        raise ArgumentError(f"{type(bn).__name__}({bn.num_features}) does not match the convolution's "
                            f"{conv.out_channels} output channels")


_GEOMETRY = ("stride", "padding", "dilation", "groups", "padding_mode")   # a conv's, copied into its fused module


class _FusedSequential(torch.nn.Sequential):
    """An ``nn.Sequential`` whose Conv -> BatchNorm -> activation runs are computed by fused modules when
    the Sequential itself is called (what :func:`convert` does where torch.fx cannot trace the
    model). Its children are not touched: a child called on its own (``self.seq[0](x)``) or from
    elsewhere (a shared module) computes as before, and the fused path reads the children's own
    parameters and BatchNorm. When the children are no longer those fused (replaced, inserted,
    removed, parametrized), one of a run carries hooks, or a fused convolution's geometry
    (stride, padding, dilation, groups, padding_mode) is no longer its fused module's, the
    Sequential runs as torch's."""

    def forward(self, input):
        plan = self.__dict__.get("_rawconv_plan")
        if plan is None:
            return super().forward(input)
        members, types, steps, watched, pairs = plan
        mods = tuple(self._modules.values())
        if mods != members or tuple(map(type, mods)) != types or any(
                getattr(m, h) for m in watched for h in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                                                         "_backward_pre_hooks")) or any(
                getattr(c, a) != getattr(f, a) for c, f in pairs for a in _GEOMETRY):
            return super().forward(input)
        for step in steps:
            input = step(input)
        return input

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        for h in self.fused_modules():
            _fused.rebind(h)   # the children's tensors moved: the fused modules' snapshots are taken again
        return out

    def fused_modules(self) -> list:
        """The fused modules of this Sequential's runs (not registered as its children)."""
        plan = self.__dict__.get("_rawconv_plan")
        return [st for st in plan[2] if isinstance(st, _ConvBiasAct) and st.__dict__.get("_rawconv_helper")] \
            if plan else []


def _fused_modules(model) -> list:
    """(name, module) of every fused module of ``model``: its ConvBiasAct modules and the fused
    modules of its :class:`_FusedSequential` runs (named after their conv, ``"(fused)"`` added)."""
    out = []
    for name, m in model.named_modules():
        if isinstance(m, _ConvBiasAct):
            out.append((name, m))
        if isinstance(m, _FusedSequential):
            out += [(h.__dict__["_rawconv_helper"], h) for h in m.fused_modules()]
    return out


def _conv_modules(model) -> dict:
    """{name: module} of every rawconv convolution module of ``model``, the fused modules of its
    :class:`_FusedSequential` runs included."""
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, _RawconvConv):
            out[name] = m
        if isinstance(m, _FusedSequential):
            out.update((h.__dict__["_rawconv_helper"], h) for h in m.fused_modules())
    return out


# saved models and pickles name these classes by their face's path (as before the split)
for _cls in (_RawconvConv, _RawconvConvTranspose, _ConvBiasAct, _FusedSequential,):
    _cls.__module__ = FACE


# every public entry point raises only rawconv's exception classes (rawconv._guard)
_guard.guard_module(globals(), "_RawconvConv.forward", "_RawconvConvTranspose.forward", "_ConvBiasAct.forward",
                    "_ConvBiasAct.from_conv", where=FACE)
