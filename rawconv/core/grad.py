"""The one check the function forms make before their no-grad fast path (no library, no rawconv.ops import)."""
from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad

_grad_enabled = torch.is_grad_enabled
functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


def needs_grad(a, b, c=None) -> bool:
    """Whether a function form called on ``a``, ``b`` (and ``c``) must go through rawconv's
    operators: one of them requires grad and grad mode is on, one carries a forward-mode tangent
    (``forward_ad.dual_level``; the no-grad path would drop it), or a torch.func transform is
    active (``vmap``'s batched tensors have no data pointer; ``grad``/``jvp`` record through the
    operators). False for non-tensors (the function's own checks then raise the clear error).
    Costs three attribute reads and two calls when nothing requires grad."""
    try:
        return (bool(a.requires_grad or b.requires_grad or (c is not None and c.requires_grad)) and _grad_enabled()) \
            or (_fwad._current_level >= 0 and has_tangent(a, b, c)) or bool(functorch_active())
    except AttributeError:
        return False


def has_tangent(*ts) -> bool:
    """Whether a tensor among ``ts`` carries a forward-mode AD tangent at the current level."""
    return _fwad._current_level >= 0 and any(isinstance(t, torch.Tensor) and _fwad.unpack_dual(t).tangent is not None
                                             for t in ts)


# ---------------------------------------------------------------------------- the grad slot
# A backend's function form given tensors that need grad hands them to the operator layer, which
# records autograd (rawconv.pytorch.ops). Backends sit below that layer and import nothing above
# them: they ask this slot for the function by backend name; rawconv.pytorch.ops fills it when it is
# imported, and the package root (rawconv/__init__.py) sets what loads it on the first need.
_slot: dict = {}
_loader: list = [None]


def fill(backend: str, function) -> None:
    """(operator layer) The function ``backend``'s function forms call for tensors that need grad."""
    _slot[backend] = function


def set_loader(load) -> None:
    """(package root) ``load()`` imports the operator layer, which fills the slot."""
    _loader[0] = load


def grad_function(backend: str):
    """The function the operator layer filled for ``backend`` (importing that layer on first use)."""
    fn = _slot.get(backend)
    if fn is None and _loader[0] is not None:
        _loader[0]()
        fn = _slot.get(backend)
    if fn is None:
        from .errors import InternalError

        raise InternalError(f"no operator registered for {backend!r} tensors that need grad (rawconv.pytorch.ops "
                            "fills rawconv.core.grad's slot when it is imported)")
    return fn
