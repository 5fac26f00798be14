"""What rawconv's torch.nn modules cannot run runs on torch's own kernel: said once, counted, reported.

:mod:`rawconv.nn`'s modules are drop-in torch.nn modules: whatever ``torch.nn.Conv2d`` accepts,
they accept. A call that no rawconv library can run (float64 or complex tensors on the CPU, where
oneDNN 3.2 has no such convolution; float16 / bfloat16 where this CPU's oneDNN offers none; tensors
on another device than CPU and CUDA; an input with no channels, which torch answers with an empty
tensor) runs on the torch class's own ``forward`` instead, with torch's results and torch's errors,
and:

* a :class:`~rawconv.errors.TorchFallbackWarning` says so, once per reason per process, naming why;
* it is counted, per reason (:func:`counts`, ``rawconv.nn.torch_fallbacks()``) and per module (the
  module's ``torch_fallbacks`` attribute: {reason: calls});
* :func:`rawconv.nn.describe` shows such a layer as ``torch (fallback): <reason>`` and
  :func:`rawconv.nn.convert`'s report lists the layers (``report.fallback``).

A module with a pinned ``choice`` / ``backward_choice`` never falls back: the pinned candidate was
asked for, so rawconv's error says why it cannot run. ``rawconv.nn.Conv2d(..., fallback="error")``
(or ``module.fallback = "error"``) refuses instead of falling back too.
"""
from __future__ import annotations

import collections
import threading
import warnings

import torch

from .. import onednn
from ..core.errors import NotSupportedError, TorchFallbackWarning

__all__ = ["MODES", "reason_for", "reason_for_parameters", "run", "note", "counts", "reset", "unsupported_reason",
           "may_fall_back", "library_refused"]

MODES = ("torch", "error")   # a module's ``fallback``: run torch's kernel, or raise rawconv's error

_COUNTS: collections.Counter = collections.Counter()   # reason -> calls run on torch's kernel
_WARNED: set = set()
_LOCK = threading.Lock()
_CAPS: dict = {}   # (dtype, directions) -> reason or None, from oneDNN's capabilities (probed once)


def _cpu_half_reason(dtype: torch.dtype, directions: tuple) -> str | None:
    key = (dtype, directions)
    if key not in _CAPS:
        caps = onednn.capabilities()
        why = None
        for d in directions:
            row = caps.row(d, dtype)
            if not row.offered and not row.reference:
                why = caps.reason(d, dtype)
                break
        _CAPS[key] = why
    return _CAPS[key]


def _reason(device_type: str, dtype: torch.dtype, in_channels: int, transposed: bool, needs_grad: bool) -> str | None:
    if device_type not in ("cpu", "cuda"):
        return f"{device_type} tensors: rawconv runs CPU (oneDNN) and CUDA (cuDNN) tensors"
    if in_channels == 0:
        return ("a module with in_channels=0: torch answers with its Empty backend (an empty output) or its "
                "own errors, which rawconv keeps")
    if dtype.is_complex:
        return f"{dtype}: oneDNN and cuDNN have no complex convolution"
    if device_type == "cpu":
        if dtype == torch.float64:
            return "float64 on the CPU: oneDNN 3.2 has no float64 convolution"
        if dtype in (torch.float16, torch.bfloat16):
            first = "backward_data" if transposed else "forward"
            rest = ("forward" if transposed else "backward_data", "backward_weights") if needs_grad else ()
            return _cpu_half_reason(dtype, (first,) + rest)
    return None


def may_fall_back(m) -> bool:
    """Whether module ``m`` may run a call on torch's kernel: no pinned choice, ``fallback="torch"``."""
    return getattr(m, "fallback", "torch") == "torch" and m.choice is None and m.backward_choice is None


def reason_for(m, x) -> str | None:
    """Why module ``m`` runs this call on torch's kernel (one line), or None (rawconv runs it, or
    raises its own error: a pinned choice, ``fallback="error"``, mixed dtypes, a non-tensor)."""
    if not isinstance(x, torch.Tensor) or not may_fall_back(m) or x.dtype != m.weight.dtype:
        return None
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or m.weight.requires_grad)
    return _reason(x.device.type, x.dtype, getattr(m, "in_channels", 1), m._transposed, needs_grad)


def weight_source(m):
    """``m.weight`` as far as its device, dtype and ``requires_grad`` go, without computing it: for a
    weight computed by a ``torch.nn.utils.parametrize`` parametrization, the tensor it is computed
    from (``parametrizations.weight.original``, or ``original0`` of a multi-input one), whose
    forward is never run here (``spectral_norm``'s runs a power iteration that changes its buffers
    in training mode); else ``m.weight`` itself (None without one)."""
    plist = getattr(getattr(m, "parametrizations", None), "weight", None)
    if plist is not None:
        src = getattr(plist, "original", None)
        if src is None:
            src = getattr(plist, "original0", None)
        if isinstance(src, torch.Tensor):
            return src
    return m.weight


def reason_for_parameters(m) -> str | None:
    """:func:`reason_for` as the module's parameters predict it (their device and dtype; the
    gradients when the module is in training mode): what :func:`rawconv.nn.convert` reports."""
    if not may_fall_back(m):
        return None
    w = weight_source(m)
    return _reason(w.device.type, w.dtype, getattr(m, "in_channels", 1), m._transposed,
                   m.training and w.requires_grad)


def library_refused(exc: NotSupportedError) -> bool:
    """Whether ``exc`` is oneDNN's or cuDNN's own refusal of the problem (``dnnl_unimplemented``,
    ``CUDNN_STATUS_NOT_SUPPORTED``...), not rawconv's word on something else it does not support
    (a tracer, a mode, a pinned name)."""
    return getattr(exc, "library", "") in ("oneDNN", "cuDNN") and bool(getattr(exc, "status_name", ""))


def unsupported_reason(exc: NotSupportedError) -> str:
    """The reason line of a call the library refused for its problem (no choice pinned)."""
    text = str(exc).split(" [")[0]
    return f"the library offers no implementation for this problem ({text})"


def note(m, why: str) -> None:
    """Count one call of module ``m`` run on torch's kernel for ``why``; warn the first time ``why``
    is seen in this process."""
    per = m.__dict__.get("torch_fallbacks")
    if per is None:
        per = m.__dict__["torch_fallbacks"] = {}
    with _LOCK:
        per[why] = per.get(why, 0) + 1
        _COUNTS[why] += 1
        first = why not in _WARNED
        _WARNED.add(why)
    if first:
        warnings.warn(f"rawconv.nn.{type(m).__name__}: {why}; such calls run on torch's own kernel (said once per "
                      "reason; counted: rawconv.nn.torch_fallbacks(), the module's torch_fallbacks; describe() and "
                      "convert's report name the layers)", TorchFallbackWarning, stacklevel=_stacklevel())


def _stacklevel() -> int:
    """The warning's ``stacklevel``: the first frame outside rawconv and torch.nn (the line that
    called the module, not torch's ``Module.__call__``)."""
    import sys

    f, level = sys._getframe(1), 1
    while f is not None and f.f_globals.get("__name__", "").startswith(("rawconv.", "torch.nn.")):
        f, level = f.f_back, level + 1
    return level


def run(m, why: str, base, *args):
    """``base.forward(m, *args)``: the torch class's own forward on the module's parameters (its
    padding modes, ``padding="same"``, unbatched inputs, ``output_size``), counted as a fallback.
    torch's errors pass through rawconv's guard as torch raised them."""
    note(m, why)
    from ..core import guard

    try:
        return base.forward(m, *args)
    except Exception as exc:
        raise guard.as_torch_raised(exc)


def counts() -> dict:
    """{reason: calls} run on torch's kernel in this process, most first."""
    with _LOCK:
        return dict(_COUNTS.most_common())


def reset() -> None:
    """Forget the process-wide counts and which reasons were warned about (the modules' own
    ``torch_fallbacks`` stay)."""
    with _LOCK:
        _COUNTS.clear()
        _WARNED.clear()
