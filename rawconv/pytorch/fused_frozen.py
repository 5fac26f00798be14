"""rawconv.fused's frozen modules (:mod:`rawconv.fused`, the face): the weight snapshot of the
modules ``rawconv.nn.convert(..., fuse=True)`` makes (:func:`freeze`, :func:`rebind`), what it
was taken from (:class:`_FrozenState`: taken again when a source changed) and the plans it
carries (:func:`frozen_plans_of`, :func:`_synced`)."""
from __future__ import annotations

import weakref

import torch

from ..core import guard as _guard
from ..core import plans as _plans_mod

FACE = "rawconv.pytorch.fused"   # where this module's public names live (rawconv.fused)

# ---------------------------------------------------------------------------- frozen modules
FROZEN_WEIGHT, FROZEN_BIAS = "_rawconv_frozen_weight", "_rawconv_frozen_bias"   # the modules' buffer names
_FROZEN_PLANS = "_rawconv_frozen_plans"
_FROZEN_STATE = "_rawconv_frozen_state"   # module.__dict__: its _FrozenState
BN_KEY = "_rawconv_bn"   # module.__dict__: the BatchNorm folded into the snapshot (convert(fuse=True)), or absent
_FROZEN_MAX = 64   # plans per frozen module (one per input shape and layout); more: the oldest go
_frozen_dicts = weakref.WeakValueDictionary()   # id -> every frozen module's _PlanDict (for clear_caches)


def _clear_frozen_plans() -> None:
    for d in list(_frozen_dicts.values()):
        d.clear()


_plans_mod.register_clear("rawconv.pytorch.fused:frozen modules' plans", _clear_frozen_plans)

# bumped after every optimizer step in the process (torch.optim's global step hook): fused optimizers
# (Adam(fused=True), fused SGD) update parameters without moving their version counters, so a step is
# itself a sign that frozen snapshots may be stale (rawconv.core.postops.watch_optimizers)
from ..core.postops import OPTIMIZER_EPOCH as _EPOCH, watch_optimizers as _watch_optimizers  # noqa: E402


class _PlanDict(dict):
    """A frozen module's oneDNN plans (problem -> :class:`FusedConvolution` holding the snapshot
    reordered), and its :class:`_FrozenState` (``state``). Copies and pickles of the module start
    with none (plans hold C objects). :func:`rawconv.clear_caches` empties every one (the module
    makes its plans again at its next call); their buffers count against the plans' byte budget
    (:func:`rawconv.set_cache_limit`) as every oneDNN plan's do."""

    state = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _frozen_dicts[id(self)] = self

    def __deepcopy__(self, memo):
        return _PlanDict()

    def __reduce__(self):
        return (_PlanDict, ())


def _unbound_state():
    return _FrozenState(None)


def _fold(w: torch.Tensor, b, bn) -> tuple:
    """(weight, bias) of conv ``w``/``b`` followed by eval-mode BatchNorm ``bn``, computed in float64
    from the tensors as they are now and rounded once to w's dtype (w's memory format)."""
    from torch.nn.utils.fusion import fuse_conv_bn_weights

    def d(t):
        return t.detach().to(torch.float64) if t is not None else None

    fw, fb = fuse_conv_bn_weights(d(w), d(b), d(bn.running_mean), d(bn.running_var), bn.eps, d(bn.weight),
                                  d(bn.bias))
    out_w = torch.empty_like(w, memory_format=torch.preserve_format)
    out_w.copy_(fw.detach())
    return out_w, fb.detach().to(w.dtype)


def _versions(ts) -> list | None:
    try:
        return [(t._version, t.data_ptr()) for t in ts]   # p.data = new_tensor moves only the pointer
    except RuntimeError:   # an inference tensor keeps no version counter: every call takes a new snapshot
        return None


class _FrozenState:
    """What a frozen module's snapshot was taken from, to take a new one when any of it changed.

    The sources: the module's ``weight`` and ``bias`` parameters and, when a BatchNorm is folded
    in (``module.__dict__[BN_KEY]``), its weight, bias, running statistics, batch count and ``eps``. The
    snapshot is stale when a source is another object than the one snapshotted (a parameter
    replaced: ``m.weight = Parameter(...)``, ``load_state_dict(assign=True)``, a BatchNorm moved
    alone), when any source's version counter moved (every in-place write through autograd's
    view of the tensor: ``load_state_dict``, optimizer steps, ``mul_``, a BatchNorm's training
    forward counting its batches) or data pointer moved (``p.data = new_tensor``), after any optimizer
    step (fused optimizers move no version counter), after the module's ``_apply`` (``.to()``, ``.cuda()``) and
    after a forward that recorded autograd through the parameters (an update through ``.data``
    usually follows one). In-place writes through ``.data`` alone, with no optimizer step and no training
    forward, are the one change it cannot see (nor can autograd): :func:`rawconv.nn.refresh`.

    :meth:`sync` takes a new snapshot when stale: the same buffer tensors written in place when
    shape, dtype and device still fit (compiled graphs and the plans keep working on them), new
    ones otherwise. The module is held weakly; copies and pickles get an unbound state that the
    module's ``__setstate__`` replaces."""

    __slots__ = ("module", "srcs", "tens", "vers", "epoch", "plans", "bn", "eps", "snap", "__weakref__")

    def __init__(self, module):
        self.module = weakref.ref(module) if module is not None else _no_module
        self.srcs: tuple = (None, None)
        self.tens: list = []
        self.vers = None
        self.epoch = -1   # stale until the first snapshot
        self.bn = None
        self.eps = None   # the BatchNorm's eps the fold used
        self.snap = (None, None)   # the buffers (FROZEN_WEIGHT, FROZEN_BIAS) as last taken
        self.plans = _PlanDict()
        self.plans.state = self

    def __deepcopy__(self, memo):
        return _FrozenState(None)

    def __reduce__(self):
        return (_unbound_state, ())

    def mark_stale(self) -> None:
        self.epoch = -1

    def fresh(self, w, b) -> bool:
        """Whether the snapshot was taken from ``w`` / ``b`` (the module's weight and bias now) and
        the BatchNorm as they are now (see the class notes). The eager hot path's one check."""
        srcs = self.srcs
        if self.epoch != _EPOCH[0] or w is not srcs[0] or b is not srcs[1]:
            return False
        bn = self.bn
        if bn is not None and (bn._buffers.get("running_mean") is not srcs[4]
                               or bn._parameters.get("weight") is not srcs[2] or bn.eps != self.eps):
            return False
        try:
            return self.vers == [(t._version, t.data_ptr()) for t in self.tens]
        except RuntimeError:   # an inference tensor keeps no version counter
            return False

    def sync(self, w=None, b=None):
        """The snapshot ``(weight, bias)`` to compute with: the module's buffers, taken again first
        when stale. ``w``/``b``: the tensors a caller was handed (an operator's kernel under
        torch.compile gets the buffers as they were traced): returned as they are when fresh."""
        m = self.module()
        if m is None:
            return w, b
        p = m._parameters
        if not self.fresh(p.get("weight"), p.get("bias")) or self.bn is not m.__dict__.get(BN_KEY):
            self.take(m)
        elif w is not None:
            return w, b
        return self.snap

    def choice_for(self, x, residual):
        """The choice a new plan of the module's takes for this call (its autotuned one for the
        problem, :meth:`rawconv.nn._ConvBiasAct._frozen_choice`), or None."""
        m = self.module()
        resolve = getattr(m, "_frozen_choice", None) if m is not None else None
        return resolve(x, residual) if resolve is not None else None

    def take(self, m) -> None:
        """Take module ``m``'s snapshot from its sources now (in place where the buffers fit)."""
        p = m._parameters
        w, b = p.get("weight"), p.get("bias")
        if w is None:   # the weight is no longer a parameter (a parametrization): the module reads it live
            return
        bn = m.__dict__.get(BN_KEY)
        _watch_optimizers()
        epoch = _EPOCH[0]
        with torch.no_grad():
            if bn is not None:
                fw, fb = _fold(w, b, bn)
                srcs = (w, b, bn._parameters.get("weight"), bn._parameters.get("bias"),
                        bn._buffers.get("running_mean"), bn._buffers.get("running_var"),
                        bn._buffers.get("num_batches_tracked"))
            else:
                fw, fb = w.detach(), (b.detach() if b is not None else None)
                srcs = (w, b)
            tens = [t for t in srcs if t is not None]
            vers = _versions(tens)
            old_w, old_b = m._buffers.get(FROZEN_WEIGHT), m._buffers.get(FROZEN_BIAS)
            new_w = _into(old_w, fw)
            new_b = None if fb is None else _into(old_b, fb)
        replaced = new_w is not old_w or new_b is not old_b
        for name, t in ((FROZEN_WEIGHT, new_w), (FROZEN_BIAS, new_b)):
            if name in m._buffers:
                m._buffers[name] = t
            else:
                m.register_buffer(name, t, persistent=False)
        if replaced:
            self.plans.clear()
        # the snapshot carries its plans (and this state): the operator's kernel finds them on the
        # weight it is given (under torch.compile the module's buffer reaches the kernel as the same
        # tensor), so compiled models keep each layer's weights reordered once, and fresh, too
        setattr(new_w, _FROZEN_PLANS, self.plans)
        m.__dict__[_FROZEN_PLANS] = self.plans
        self.srcs, self.tens, self.vers, self.bn, self.snap = srcs, tens, vers, bn, (new_w, new_b)
        self.eps = bn.eps if bn is not None else None
        self.epoch = epoch


def _no_module():
    return None


def _into(old, new: torch.Tensor) -> torch.Tensor:
    """``new``'s values in ``old`` (written in place) when shape, dtype, device and layout fit, else a
    copy of ``new`` (its memory format kept)."""
    if old is not None and old.shape == new.shape and old.dtype == new.dtype and old.device == new.device \
            and old.stride() == new.stride() and not old.is_inference():
        old.copy_(new)
        return old
    return new.detach().clone(memory_format=torch.preserve_format)


def freeze(module: torch.nn.Module) -> None:
    """Snapshot a fused module's weight and bias, with its BatchNorm (``module.__dict__[BN_KEY]``)
    folded in, as non-persistent buffers :data:`FROZEN_WEIGHT` / :data:`FROZEN_BIAS` (out of
    ``state_dict``), and keep the snapshot fresh from then on: the module takes a new one at its
    next call whenever a source changed (:class:`_FrozenState` says how that is seen).
    Called by :func:`rawconv.nn.convert` (``fuse=True``) and :func:`rawconv.nn.refresh` (which
    takes a new snapshot now, whatever changed)."""
    st = module.__dict__.get(_FROZEN_STATE)
    if st is None or st.module() is not module:
        st = _FrozenState(module)
        module.__dict__[_FROZEN_STATE] = st
    st.take(module)


def rebind(module: torch.nn.Module) -> None:
    """After a copy, an unpickle or ``_apply`` (``.to()``): a state bound to ``module`` (a copy's
    was unbound) and stale, attached to the current snapshot buffer (``.to()`` made new ones)."""
    if FROZEN_WEIGHT not in module._buffers:
        return
    st = module.__dict__.get(_FROZEN_STATE)
    if st is None or st.module() is not module:
        st = _FrozenState(module)
        module.__dict__[_FROZEN_STATE] = st
    st.mark_stale()
    st.plans.clear()
    module.__dict__[_FROZEN_PLANS] = st.plans
    w = module._buffers.get(FROZEN_WEIGHT)
    st.snap = (w, module._buffers.get(FROZEN_BIAS))
    if w is not None:
        setattr(w, _FROZEN_PLANS, st.plans)


def frozen(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds a weight snapshot (:func:`freeze`)."""
    return FROZEN_WEIGHT in module._buffers


def frozen_state(module: torch.nn.Module):
    """``module``'s :class:`_FrozenState`, or None."""
    return module.__dict__.get(_FROZEN_STATE)


def frozen_plans_of(w: torch.Tensor):
    """The plans a frozen module's weight snapshot carries (see :func:`freeze`), or None."""
    return w.__dict__.get(_FROZEN_PLANS) if not w.requires_grad else None


def _synced(w, bias):
    """(w, bias, plans) for the operators' kernels: a frozen module's snapshot (reached here as the
    traced buffer under torch.compile) retaken first when its sources changed (:class:`_FrozenState`)."""
    plans = frozen_plans_of(w)
    if plans is not None and plans.state is not None:
        w2, bias = plans.state.sync(w, bias)
        if w2 is not w:   # a new snapshot tensor (the same one, retaken in place, carries the same plans)
            plans = frozen_plans_of(w2)
        w = w2
    return w, bias, plans


for _obj in (_PlanDict, _FrozenState, _unbound_state):   # pickles of frozen modules name them on the face
    _obj.__module__ = FACE


# every public entry point raises only rawconv's exception classes (rawconv._guard)
_guard.guard_module(globals(), "freeze", where=FACE)
