"""``rawconv.info()`` and ``rawconv info``: what was loaded, from where, how it was found, and what
each library offers on this machine (``capabilities``)."""
from __future__ import annotations

import platform

import torch

from ..pytorch.torch_choice import torch_part


def collect() -> dict:
    from ..core import __version__

    out = {"rawconv": __version__, "python": platform.python_version(), "machine": platform.machine(),
           "torch": torch_part()}
    from ..core.backend import backends

    libraries = {}   # one section per library: cuDNN's two APIs share one
    for be in backends():
        key = {"oneDNN": "onednn", "cuDNN": "cudnn"}.get(be.library, be.name)
        if key in libraries:
            libraries[key].append(be.name)
            continue
        libraries[key] = [be.name]
        try:
            out[key] = be.info()
        except Exception as exc:
            out[key] = {"error": f"{type(exc).__name__}: {exc}"}
    out["backends"] = {k: ", ".join(v) for k, v in libraries.items()}
    out["capabilities"] = capabilities_part(out)
    return out


def _caps_lines(caps) -> dict:
    return {"platform": f"{caps.library} {caps.version} on {caps.platform}", **caps.summary()}


def capabilities_part(collected: dict) -> dict:
    """What each library offers here, one compact line per direction (see
    :meth:`rawconv._capabilities.Capabilities.summary`): oneDNN always, cuDNN where torch sees a GPU.
    A library that did not load is not probed (its error is in its own section)."""
    import importlib

    out: dict = {}
    for name, label in (("onednn", "oneDNN"), ("cudnn", "cuDNN")):
        if name == "cudnn" and not torch.cuda.is_available():
            out[name] = "not probed: torch sees no CUDA device"
        elif "error" in collected.get(name, {}):
            out[name] = f"not probed: {label} did not load (see {name}.error)"
        else:
            try:
                out[name] = _caps_lines(importlib.import_module(f"rawconv.{name}").capabilities())
            except Exception as exc:
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out
