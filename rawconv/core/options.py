"""One options object for what every backend shares, in the style of nvmath-python's ``MatmulOptions``.

    opts = rawconv.Options(precision="tf32", workspace_limit=1 << 28)
    plan = rawconv.cudnn_graph.GraphConvolution(x, w, options=opts)
    plan = rawconv.onednn.Convolution(x, w, options={"precision": "bf16"})   # a dict works too

``precision`` is the one word for what the vendors call the fpmath mode (oneDNN), the math type
(cuDNN's legacy API) and TF32 / down-conversion notes (cuDNN's graph API):

============ ============================ =============================== ================================
precision    oneDNN fpmath mode            cuDNN legacy math type (fp32)    cuDNN graph configs allowed
============ ============================ =============================== ================================
``strict``   ``strict``                   ``fma`` (IEEE)                  no TENSOR_CORE on fp32, no
                                                                          DOWN_CONVERT_INPUTS
``tf32``     ``tf32``                     ``tensor_op`` (TF32)            TENSOR_CORE (TF32) on fp32
``bf16``     ``bf16``                     ``tensor_op_allow_conversion``  also DOWN_CONVERT_INPUTS
``f16``      ``f16``                      ``tensor_op_allow_conversion``  also DOWN_CONVERT_INPUTS
``any``      ``any``                      ``default``                     everything
============ ============================ =============================== ================================

For float16/bfloat16 data, ``strict`` still lets tensor cores run (their products are exact and
accumulate in fp32); only a coarser rounding of the inputs than the data's own is governed here.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import ArgumentError, ArgumentTypeError

__all__ = ["Options", "PRECISIONS", "options_of"]

PRECISIONS = ("strict", "tf32", "bf16", "f16", "any")


#: fields an earlier Options had, which nothing read: where their meaning lives now
REMOVED = {"budget_s": "pass budget_s= to autotune() (seconds of wall time per problem and direction) or "
                       "autotune_budget_s= to rawconv.nn.convert",
           "isolate": "pass isolate= to autotune() or rawconv.compare",
           "timeout_s": "pass isolate={'timeout_s': ...} to autotune() or rawconv.compare",
           "logger": "configure logging.getLogger('rawconv')"}


@dataclass(frozen=True, init=False)
class Options:
    """What every backend's plans and functions share.

    ``precision``: how far inputs may be rounded before the products (see the module table:
    ``"strict"``, ``"tf32"``, ``"bf16"``, ``"f16"``, ``"any"``). ``deterministic``: only
    candidates cuDNN marks deterministic (oneDNN's CPU convolutions are). ``workspace_limit``:
    bytes of workspace / scratchpad a candidate may use (None: no limit). ``allow_known_bad``: let
    a candidate in :mod:`rawconv.known_bad` run when forced. Raises :class:`ArgumentError` /
    :class:`ArgumentTypeError` for bad values, and :class:`ArgumentError` saying where each went
    for the fields nothing read (:data:`REMOVED`: ``budget_s``, ``isolate``, ``timeout_s``,
    ``logger``).
    """

    precision: str = "strict"
    deterministic: bool = False
    workspace_limit: int | None = None
    allow_known_bad: bool = False

    def __init__(self, precision: str = "strict", deterministic: bool = False, workspace_limit: int | None = None,
                 allow_known_bad: bool = False, **removed):
        if removed:
            gone = [k for k in removed if k in REMOVED]
            unknown = sorted(set(removed) - set(gone))
            if unknown:
                raise ArgumentError(f"unknown option(s) {unknown}; Options has {sorted(f.name for f in fields(Options))}")
            raise ArgumentError("; ".join(f"Options has no {k} any more (nothing read it): {REMOVED[k]}" for k in gone))
        for name, v in (("precision", precision), ("deterministic", deterministic),
                        ("workspace_limit", workspace_limit), ("allow_known_bad", allow_known_bad)):
            object.__setattr__(self, name, v)
        self.__post_init__()

    def __post_init__(self):
        if not isinstance(self.precision, str):
            raise ArgumentTypeError(f"precision must be one of {list(PRECISIONS)}, got {type(self.precision).__name__}")
        if self.precision not in PRECISIONS:
            raise ArgumentError(f"precision must be one of {list(PRECISIONS)}, got {self.precision!r}")
        for name in ("deterministic", "allow_known_bad"):
            if not isinstance(getattr(self, name), bool):
                raise ArgumentTypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        wl = self.workspace_limit
        if wl is not None and (isinstance(wl, bool) or not isinstance(wl, int) or wl < 0):
            raise ArgumentError(f"workspace_limit must be None or a number of bytes >= 0, got {wl!r}")

    def with_(self, **changes) -> "Options":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def as_dict(self) -> dict:
        """The fields as JSON-friendly values."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def options_of(options: Any = None, **overrides) -> Options:
    """``options`` as an :class:`Options`: None (the defaults), an :class:`Options`, or a dict of
    its fields; ``overrides`` that are not None replace fields. Raises :class:`ArgumentTypeError`
    for another type and :class:`ArgumentError` naming an unknown key."""
    if options is None:
        opts = Options()
    elif isinstance(options, Options):
        opts = options
    elif isinstance(options, dict):
        opts = Options(**options)   # (an unknown key: ArgumentError naming the fields)
    else:
        raise ArgumentTypeError(f"options must be None, a rawconv.Options or a dict, got {type(options).__name__}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    return opts.with_(**changes) if changes else opts
