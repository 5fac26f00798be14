"""torch.nn modules on pinned oneDNN / cuDNN choices, whole-model conversion, fusion, and a per-layer report.

Quick use::

    import rawconv.nn

    conv = rawconv.nn.Conv2d(64, 64, 3, padding=1, choice="x64:gemm:jit")  # a torch.nn.Conv2d
    y = conv(x)                          # forward on exactly that oneDNN implementation
    conv.cuda()                          # follows the device: cuDNN now (a oneDNN choice is dropped)

    model = rawconv.nn.convert(torchvision_model)                   # every conv swapped, weights kept
    model = rawconv.nn.convert(model.eval(), fuse=True, autotune=x) # BN folded, conv+bias(+add)+activation
                                                                    # fused where measured faster, each
                                                                    # distinct problem tuned once and
                                                                    # pinned to that problem
    print(rawconv.nn.describe(model, x))                            # per layer: rawconv vs torch

* :class:`Conv1d` / :class:`Conv2d` / :class:`Conv3d` and :class:`ConvTranspose1d` / ``2d`` / ``3d``
  subclass the torch modules (same constructor, same ``state_dict``, ``isinstance`` holds) and add
  ``backend`` (``"auto"``: by the input's device; ``"onednn"``; ``"cudnn"``), ``choice`` (the
  pinned candidate: a oneDNN implementation name / ``"name@user"`` / position, a cuDNN
  ``"ALGO@math"`` or graph engine config ``"eng28{k2=3}"``), ``backward_choice`` (one value, or
  a ``(data, weights)`` pair) and ``precision`` (``"strict"``, ``"tf32"``, ``"bf16"``, ``"f16"``,
  ``"any"``; :mod:`rawconv.options`). ``impl=`` / ``backward_impl=`` / ``fpmath=``, the old names of
  ``choice`` / ``backward_choice`` / ``precision``, still work and warn (``DeprecationWarning``).
* Transposed convolutions run as the backward-data primitive of the matching convolution
  (oneDNN backward data / cuDNN backward data), ``output_padding`` and ``output_size`` as torch.
* ``padding_mode`` other than ``"zeros"`` (reflect, replicate, circular): the input is padded in
  torch (``F.pad``, as torch's own modules do), then the convolution runs with no padding.
* :class:`ConvBiasAct1d` / ``2d`` / ``3d``: ``act(conv(x) + bias + residual)`` as one call
  (:mod:`rawconv.fused`: oneDNN post-ops on CPU, one cuDNN graph on CUDA).
* :func:`convert`, :func:`describe`: see their docstrings.

The convolutions run through ``rawconv.ops.conv`` (torch.library operators) when that module
exists; until then through this module's autograd functions over :mod:`rawconv.onednn` and
:mod:`rawconv.cudnn` (``USE_OPS`` says which ran; the same arguments either way).

This module is the face: the code lives in its parts, each handing its names on through here
(``rawconv.nn.X`` as before the split, pickles of saved models included): :mod:`.functional` (``conv``,
``conv_transpose``), :mod:`.modules` (the module classes), :mod:`.search` (the per-call autotune,
:class:`TunedChoice`), :mod:`.convert` (``convert``, fusion, pins), :mod:`.report` (``ConvertReport``,
``LayerReport``), :mod:`.describe`. The settings and hooks a part reads (``USE_OPS``, ``VERSUS_TORCH``,
``GRAPH_BUDGET_S``, ``ONEDNN_TUNE``, ``GRAPH_TUNE``, ...) are set and read here and reach that part
(:func:`rawconv.core.face.route_settings`).
"""
from __future__ import annotations

import logging

from . import fusion as _fusion  # noqa: F401 - rawconv.nn._fusion, as before
from .pins import check_choice as _check_choice, choice_library as _choice_library  # noqa: F401
from .pins import is_step as _is_step, split as _split  # noqa: F401
from . import functional as _functional, modules as _modules, search as _search
from .functional import BACKENDS, conv, conv_transpose, _resolve_backend  # noqa: F401 - handed on
from .search import (TunedChoice, clear_tuning, _RECORDING, _TUNED, _TUNED_ATTR, _UNFUSED_OFFERED_ON,  # noqa: F401
                     _forward_direction, _grad_problems, _onednn_here, _pin_tuned, _problem_of, _record_calls,
                     _tune_key)
from .modules import (Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d,  # noqa: F401
                      ConvBiasAct1d, ConvBiasAct2d, ConvBiasAct3d, _RawconvConv, _RawconvConvTranspose,
                      _ConvBiasAct, _FusedSequential, _fused_modules)
from .report import ConvertReport, LayerReport, DescribeTable, format_table, print_table  # noqa: F401
from .convert import (convert, refresh, torch_fallbacks, pinned_choices, pin_choices, AUTOTUNE_NEW,  # noqa: F401
                      _search_layers, _face_getattr as __getattr__)
from .describe import describe  # noqa: F401
from ..core.face import route_settings as _route_settings

log = logging.getLogger("rawconv.nn")

__all__ = ["conv", "conv_transpose", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
           "ConvTranspose3d", "ConvBiasAct1d", "ConvBiasAct2d", "ConvBiasAct3d", "convert", "describe",
           "LayerReport", "ConvertReport", "print_table", "BACKENDS", "pinned_choices", "pin_choices",
           "refresh", "TunedChoice", "AUTOTUNE_NEW", "torch_fallbacks"]

# name -> the part that reads it: a setting or hook set on this face (``rawconv.nn.VERSUS_TORCH = False``, a
# test's ``monkeypatch.setattr(rawconv.nn, "_tune_one", f)``) is set there, where the part's code reads it
_SETTINGS = {"USE_OPS": _functional, "_autocasting": _modules,
             "VERSUS_TORCH": _search, "GRAPH_BUDGET_S": _search, "ONEDNN_TUNE": _search, "GRAPH_TUNE": _search,
             "_tune_one": _search, "_tune_call": _search, "_search_direction": _search, "_graph_plan": _search}


_route_settings(__name__, _SETTINGS)   # (rawconv.core.face: unittest.mock.patch.object restores them too)
