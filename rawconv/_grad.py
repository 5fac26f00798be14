"""The one check the function forms make before their no-grad fast path (no library, no rawconv.ops import)."""
from __future__ import annotations

import torch

_grad_enabled = torch.is_grad_enabled


def needs_grad(a, b, c=None) -> bool:
    """Whether a function form called on ``a``, ``b`` (and ``c``) must record autograd: one of them
    requires grad and grad mode is on. False for non-tensors (the function's own checks then raise
    the clear error). Costs three attribute reads when nothing requires grad."""
    try:
        return bool(a.requires_grad or b.requires_grad or (c is not None and c.requires_grad)) and _grad_enabled()
    except AttributeError:
        return False
