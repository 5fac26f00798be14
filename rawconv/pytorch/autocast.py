"""Autocast for rawconv's operators, by torch's rule for convolutions.

torch lists ``conv1d/2d/3d`` and ``conv_transpose1d/2d/3d`` among the ops that autocast runs in the
lower precision: under ``torch.autocast(device_type, dtype)`` their floating-point inputs on that
device (float64 excepted) are cast to the autocast dtype (``torch.get_autocast_dtype``: float16 on
CUDA and bfloat16 on CPU by default), and the result comes out in that dtype.
:func:`register` gives rawconv's operators the same kernel on the ``AutocastCPU`` and
``AutocastCUDA`` dispatch keys (and as the Python-dispatcher kernel that ``torch.compile``'s
tracing runs), so a converted model under autocast runs its convolutions as torch's would.

One difference, said by a :class:`RuntimeWarning` once per operator and dtype: oneDNN 3.2 offers
no bfloat16 or float16 convolution on some CPUs (none on AVX2 alone; see
:func:`rawconv.onednn.capabilities`). There the CPU kernel computes in float32 instead of casting
into a dtype it cannot run: the inputs autocast would cast are cast to float32 (so an input that
an earlier autocast op left in bfloat16 meets float32 weights as torch's would meet bfloat16 ones),
and the result is float32.

:func:`cast_inputs` is that rule for front ends that check their tensors before the operator
(:func:`rawconv.ops.conv_transpose`, :func:`rawconv.fused.conv_bias_act`).
"""
from __future__ import annotations

import threading
import warnings

import torch

__all__ = ["register", "cast_inputs"]

_DIRECTION = {"conv_forward": "forward", "conv_backward_data": "backward_data",
              "conv_backward_weights": "backward_weights", "conv_bias_act": "forward"}
_offered: dict = {}   # (direction, dtype) -> (offered?, why not)
_warned: set = set()  # (operator, dtype) said once
_lock = threading.Lock()


@torch.compiler.assume_constant_result   # torch.compile: asked when traced, its answer a constant of the graph
def _cpu_offers(name: str, dtype: torch.dtype) -> bool:
    """Whether oneDNN offers ``dtype`` convolutions of ``rawconv::name``'s direction on this CPU
    (asked once per direction and dtype; a :class:`RuntimeWarning` once per operator when not).
    The probe runs real convolutions: while torch.compile traces (fake tensors, dispatch modes),
    outside those modes."""
    key = (_DIRECTION.get(name, "forward"), dtype)
    found = _offered.get(key)
    if found is None:
        from torch.utils._python_dispatch import _disable_current_modes

        from .. import onednn

        dt = str(dtype)[len("torch."):]
        with _lock, _disable_current_modes():
            try:
                caps = onednn.capabilities()
                ok = caps.offered(key[0], dt)
                found = (ok, "" if ok else caps.reason(key[0], dt))
            except Exception:   # noqa: BLE001  (no oneDNN here: the kernel itself raises why)
                found = (True, "")
            _offered[key] = found
    if not found[0] and (name, dtype) not in _warned:
        _warned.add((name, dtype))
        warnings.warn(f"torch.autocast('cpu', {dtype}): rawconv::{name} computes in float32 on this CPU, its "
                      f"inputs cast to float32 (oneDNN offers no {dtype} convolution here: {found[1]})", RuntimeWarning,
                      stacklevel=_user_level())
    return found[0]


def _user_level() -> int:
    """A warning's stacklevel pointing at the first frame outside rawconv and torch (the user's line)."""
    import sys

    f, level = sys._getframe(2), 2
    while f is not None and f.f_globals.get("__name__", "").split(".")[0] in ("rawconv", "torch"):
        f, level = f.f_back, level + 1
    return level


def _cast(a, dtype: torch.dtype, device_type: str):
    """``a`` in ``dtype`` when autocast would cast it (a floating tensor on ``device_type``, not
    float64), else ``a``."""
    if isinstance(a, torch.Tensor) and a.dtype is not dtype and a.is_floating_point() \
            and a.dtype is not torch.float64 and a.device.type == device_type:
        return a.to(dtype)
    return a


def cast_inputs(name: str, device_type: str, args: tuple) -> tuple:
    """``args`` as ``rawconv::name``'s autocast kernel on ``device_type`` passes them on: the tensors
    autocast casts (:func:`_cast`) in ``torch.get_autocast_dtype(device_type)``, or in float32 on a
    CPU where oneDNN offers no convolution of that dtype for the operator's direction (said once
    by a :class:`RuntimeWarning`); everything else as it is."""
    dtype = torch.get_autocast_dtype(device_type)
    if device_type == "cpu" and not _cpu_offers(name, dtype):
        dtype = torch.float32
    return tuple(_cast(a, dtype, device_type) for a in args)


def register(lib: torch.library.Library, name: str) -> None:
    """Register the autocast kernels of ``rawconv::name`` (CPU and CUDA) on ``lib`` (an IMPL or
    DEF library of the ``rawconv`` namespace)."""
    op = getattr(torch.ops.rawconv, name).default
    for device_type in ("cpu", "cuda"):
        key_name = "Autocast" + torch._C._dispatch_key_for_device(device_type)
        key = getattr(torch._C.DispatchKey, key_name)
        keyset = torch._C.DispatchKeySet(key)

        def autocast_kernel(*args, _device=device_type, _keyset=keyset):
            args_c = cast_inputs(name, _device, args)
            with torch._C._ExcludeDispatchKeyGuard(_keyset):
                return op(*args_c)

        if op.has_kernel_for_dispatch_key(key):
            op.py_kernels.pop(key, None)
        op.py_impl(key)(autocast_kernel)

        def dispatcher_kernel(_keyset, *args, _k=autocast_kernel):
            return _k(*args)

        lib.impl(name, dispatcher_kernel, key_name, with_keyset=True)
