"""What :func:`rawconv.nn.convert` and :func:`rawconv.nn.pin_choices` check in the choices they are
given, and which convolution modules convert leaves on torch (its report's ``left_on_torch``, and
one warning): helpers of :mod:`rawconv.pytorch.nn`, which passes them what they need."""
from __future__ import annotations

import warnings

from ..core import guard as _guard
from ..core.errors import ArgumentError

__all__ = ["DIRECTIONS", "check_choice_names", "own_computation", "warn_left_on_torch"]

#: a training step's keys (:class:`rawconv.ops.TrainingChoice`, the dict :func:`rawconv.ops.selected` returns)
DIRECTIONS = ("forward", "backward_data", "backward_weights")


def check_choice_names(choice: dict, names: list) -> None:
    """:func:`rawconv.nn.convert`'s ``choice`` dict: every key must be one of ``names`` (the
    model's convolution modules that convert puts on rawconv, or already rawconv's). Raises
    :class:`ArgumentError` naming the keys that are not, and saying so when the dict is a training
    step (keys ``forward`` / ``backward_data`` / ``backward_weights``)."""
    if choice and set(choice) <= set(DIRECTIONS) and not set(choice) & set(names):
        raise ArgumentError(f"convert(choice=...) takes one choice for every layer, a dict {{module name: choice}} "
                            f"or a callable(name) -> choice; this dict's keys {sorted(choice)} are a training step's "
                            "directions, not module names: pass rawconv.ops.TrainingChoice(**step) to pin it on every "
                            "layer, or {module name: step} for some")
    bad = [k for k in choice if k not in names]
    if bad:
        steps = [k for k in bad if k in DIRECTIONS]
        raise ArgumentError(f"convert(choice=...): not convolution modules of this model: {bad}"
                            + (f" ({steps} are a training step's directions: pass rawconv.ops.TrainingChoice(...) "
                               "for every layer, or {module name: step})" if steps else "")
                            + f"; its convolution modules: {names}")


def own_computation(m, torch_classes) -> str | None:
    """Why convert leaves module ``m`` on torch: a subclass of one of ``torch_classes`` (torch's
    conv classes) that computes its own way (its own ``forward``, ``_conv_forward`` or
    ``_output_padding``), or None."""
    if not isinstance(m, tuple(torch_classes)):
        return None
    own = [a for a in ("forward", "_conv_forward", "_output_padding")
           if any(a in vars(k) for k in type(m).__mro__
                  if k not in torch_classes and not k.__module__.startswith("torch.nn."))]
    return (f"{type(m).__module__}.{type(m).__qualname__} defines its own {' / '.join(own) or 'computation'}: "
            "left on torch's convolution")


def warn_left_on_torch(left: dict, model) -> None:
    """One ``RuntimeWarning`` naming the modules of ``model`` in ``left`` (name -> reason), by class."""
    if not left:
        return
    by: dict = {}
    for name, m in model.named_modules():
        if name in left:
            by.setdefault(type(m).__qualname__, []).append(name or "(the model)")
    warnings.warn(f"rawconv.nn.convert left {len(left)} conv module(s) on torch: "
                  + "; ".join(f"{cls} computes its own way (its own forward): {', '.join(ns[:6])}"
                              f"{', ...' if len(ns) > 6 else ''}" for cls, ns in by.items())
                  + " (model.rawconv_report.left_on_torch)", RuntimeWarning, stacklevel=_guard.stacklevel())
