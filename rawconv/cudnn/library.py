"""The loaded cuDNN library: its version and what was loaded (path, how it was found, the GPU).
Shared by the legacy face (:mod:`rawconv.cudnn`) and the graph API (:mod:`rawconv.cudnn.graph`), so that
neither imports the other for it."""
from __future__ import annotations

import torch

from . import _ffi as _cudnn


def library_version() -> str:
    """The loaded libcudnn's version ("9.19.0"; loads it)."""
    return _cudnn.version()["version"]


def info() -> dict:
    """What cuDNN rawconv loaded: version (``cudnnGetVersion``), the CUDA runtime it was built for
    (``cudnnGetCudartVersion``), path and how it was found, every search attempt, the GPU name and
    compute capability, and whether it is the cuDNN torch uses (``torch.backends.cudnn.version()``)."""
    loaded = _cudnn.load()
    out = dict(_cudnn.version())
    out.update({"path": loaded.path, "found_via": loaded.found_via,
                "attempts": [f"{a}: {b}" for a, b in loaded.attempts]})
    try:
        tv = torch.backends.cudnn.version()
    except Exception:  # pragma: no cover
        tv = None
    out["torch_cudnn_version"] = tv
    out["same_as_torch"] = tv == out["version_int"]
    if torch.cuda.is_available():
        i = torch.cuda.current_device()
        cc = torch.cuda.get_device_capability(i)
        out["gpu"] = torch.cuda.get_device_name(i)
        out["compute_capability"] = f"{cc[0]}.{cc[1]}"
    else:
        out["gpu"] = None
    return out


# every public entry point raises only rawconv's exception classes (rawconv._guard)
from ..core import guard as _guard  # noqa: E402

_guard.guard_module(globals(), "info")
