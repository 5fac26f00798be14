"""The choices :mod:`rawconv.nn`'s modules, :func:`rawconv.nn.convert` and
:func:`rawconv.nn.pin_choices` take (their type check, a training step split into its directions,
the library a name is written for, convert's module names), and which convolution modules convert
leaves on torch (its report's ``left_on_torch``, and one warning): helpers of
:mod:`rawconv.pytorch.nn`, which passes them what they need."""
from __future__ import annotations

import warnings
from typing import Any

from .. import onednn
from ..core import guard as _guard
from ..core.errors import ArgumentError, ArgumentTypeError

__all__ = ["DIRECTIONS", "check_choice", "split", "is_step", "choice_library", "check_choice_names", "own_computation",
           "warn_left_on_torch"]

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


def check_choice(c: Any, what: str, pair: bool = False) -> Any:
    """``c`` as given when it is a choice the modules and operators take (the rules of
    ``rawconv.ops``' check): None, a name string, or a listed candidate (a oneDNN
    ``Implementation``, a cuDNN ``Algorithm`` / ``EngineConfig``: anything with a string
    ``choice``). ``pair``: also a (data, weights) pair of those (``backward_choice``). Raises
    :class:`ArgumentTypeError` naming ``what`` otherwise; an int position says where positions
    are accepted: a position indexes one problem's listing, which a module or an operator reused
    across shapes cannot honour."""
    if pair and isinstance(c, (tuple, list)):
        if len(c) != 2:
            raise ArgumentError(f"{what} must be one choice or a (data, weights) pair, got {c!r}")
        for i, part in enumerate(c):
            check_choice(part, f"{what}[{i}]")
        return c
    if c is None or isinstance(c, str) or isinstance(c, onednn.Implementation) or \
            isinstance(getattr(c, "choice", None), str):
        return c
    msg = (f"{what} must be None, a name string or a listed candidate (Implementation, Algorithm, "
           f"EngineConfig), got {type(c).__name__} {c!r}")
    if is_step(c) and not pair:
        msg += ("; a training step (rawconv.ops.TrainingChoice, or a dict per direction) is taken by choice= when "
                "the module is made and by rawconv.nn.pin_choices(model, {name: step}); the attributes take one "
                "direction each: .choice = the forward's, .backward_choice = (backward data's, backward weights')")
    if isinstance(c, int) and not isinstance(c, bool):
        msg += ("; positions are indices into one problem's listing and are accepted only by the backend "
                "function forms (rawconv.onednn.forward(x, w, impl=0), rawconv.cudnn.forward(..., algo=0)): "
                "pass the listed row or its name, e.g. rawconv.onednn.implementations(x, w)[0].name")
    raise ArgumentTypeError(msg)


def split(choice, backward_choice, transposed: bool = False) -> tuple:
    """``(choice, backward_choice)`` with a training step's choice (``rawconv.ops.TrainingChoice``,
    a dict per library direction) split into its forward part and its (data, weights) pair
    (:func:`rawconv.ops.split_choice`); other choices as given."""
    from .ops import split_choice

    return split_choice(choice, backward_choice, transposed=transposed)


def is_step(c) -> bool:
    from .ops import _is_step as is_step

    return is_step(c)


def choice_library(c: Any, what: str) -> str | None:
    """The library a choice string is written for, by its grammar alone (no tensors needed):
    ``"onednn"`` (``"jit:avx2@any"``), ``"cudnn"`` (``"IMPLICIT_PRECOMP_GEMM@fma"``,
    ``"eng28{k2=3}"``), or None (not a string; a (data, weights) pair: its first string). Raises
    :class:`ArgumentError` for a string no backend's grammar fits, with the spelling it may mean
    (``"JIT:AVX512_CORE"``: oneDNN's names are lowercase) and the forms each library's names take."""
    if isinstance(c, (tuple, list)):
        libs = [choice_library(p, f"{what}[{i}]") for i, p in enumerate(c)]
        return next((lib for lib in libs if lib is not None), None)
    if not isinstance(c, str):
        return None
    from ..core.backend import backends_naming, spelling_suggestions

    named = backends_naming(c)
    if named:
        return "cudnn" if named[0].device_type == "cuda" else "onednn"
    near = spelling_suggestions(c)
    raise ArgumentError(
        f"{what}={c!r} is not a name of any rawconv backend" + (f": did you mean {' or '.join(map(repr, near))}?"
                                                                if near else "")
        + " (oneDNN implementations are lowercase 'kind:isa', optionally with '@any' / '@user': 'jit:avx2', "
        "'x64:gemm:jit@any', listed by rawconv.onednn.implementations(x, w); cuDNN algorithms 'ALGO@math': "
        "'IMPLICIT_PRECOMP_GEMM@fma', listed by rawconv.cudnn.algorithms(x, w); cuDNN graph engine configs "
        "'eng28{k2=3}', listed by rawconv.cudnn_graph.engines(x, w))")
