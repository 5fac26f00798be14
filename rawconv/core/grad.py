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
