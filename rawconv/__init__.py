"""rawconv: list, force, time and check every convolution algorithm of oneDNN and cuDNN on torch tensors.

The native libraries are called through cffi in ABI mode (``ffi.dlopen``): nothing is compiled,
and nothing is loaded until a backend is first used, so ``import rawconv`` works without them.

* :mod:`rawconv.onednn`: oneDNN (libdnnl.so.3) on CPU tensors: implementations, forcing, plans.
* :mod:`rawconv.cudnn`: cuDNN 9 (libcudnn.so.9) on CUDA tensors.
* :mod:`rawconv.ops`: the convolutions as torch custom operators (``torch.ops.rawconv.*``):
  differentiable to any order, traceable by ``torch.compile``.
* :class:`rawconv.ConvProblem`: the one description of a convolution every backend speaks.
* :func:`rawconv.torch_choice`: what torch itself runs for a convolution (backend, oneDNN
  implementation or cuDNN kernel, the rawconv candidate it maps to); :func:`rawconv.torch_flags`:
  torch's convolution flags for a ``with`` block.
* :func:`rawconv.info`: what was loaded, from where, and how it was found.
"""
from __future__ import annotations

import importlib
import logging

from . import _aliases

_aliases.install()   # the public paths (rawconv.nn, rawconv.ops, rawconv.cudnn_graph...) name the modules' homes

from .core.errors import (AllocationError, ArgumentError, ArgumentTypeError, DeviceNotAvailableError, FileAccessError,
                     InternalError, IsolationError, KnownBadError, LibraryError, LibraryNotFoundError,
                     NotSupportedError, RawconvError, SlowReferenceWarning, TorchFallbackWarning)
from .core.plans import cache_info, cache_limit, clear_caches, set_cache_limit
from .core.problem import ConvProblem
from .core import grad as _grad

# the operator layer (rawconv.pytorch.ops) fills the grad slot the backends' function forms use; it
# is imported on the first call that needs it
_grad.set_loader(lambda: importlib.import_module(".pytorch.ops", __name__))

from .core import results as _results

# the presentation layer (rawconv.explore.render) draws the tables' HTML view and plots, which
# rawconv.core.results does not import; it is imported when a table is first shown
_results.set_render_loader(lambda: importlib.import_module(".explore.render", __name__))

from .core import __version__

# rawconv logs (debug lines per load, plan build, search phase, cache hit) on "rawconv.*" loggers;
# it prints nothing unless the application configures logging
logging.getLogger("rawconv").addHandler(logging.NullHandler())

__all__ = ["ConvProblem", "Options", "RawconvError", "ArgumentError", "ArgumentTypeError", "LibraryError",
           "LibraryNotFoundError", "NotSupportedError", "KnownBadError", "IsolationError", "AllocationError",
           "DeviceNotAvailableError", "InternalError", "FileAccessError", "SlowReferenceWarning",
           "TorchFallbackWarning", "info", "onednn", "cudnn", "torch_choice", "torch_flags", "clear_caches",
           "set_cache_limit", "cache_limit", "cache_info", "__version__"]


def __getattr__(name):  # lazy submodules: rawconv.onednn, rawconv.cudnn
    if name == "Options":   # rawconv.options.Options, the options= object every backend takes
        return importlib.import_module(".options", __name__).Options
    if name in ("onednn", "cudnn", "cudnn_graph", "nn", "ops", "fused", "bench", "compare", "presets", "cli",
                "check", "options", "results", "tuning", "known_bad", "torch_choice", "distributed"):
        # rawconv.torch_choice is the module, and calling it calls torch_choice.torch_choice
        return importlib.import_module(f".{name}", __name__)
    if name in ("torch_flags", "TorchChoice", "TorchFlags"):
        return getattr(importlib.import_module(".torch_choice", __name__), name)
    raise AttributeError(f"module 'rawconv' has no attribute {name!r}")


def info() -> dict:
    """What rawconv runs on, as a dict: rawconv and torch versions, torch's own oneDNN/cuDNN,
    and for each backend the loaded library's version, path and how it was found (or the error
    that says why it could not be loaded). Loads the libraries."""
    from .explore.info import collect

    return collect()
