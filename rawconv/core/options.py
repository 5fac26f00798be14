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

import logging
from dataclasses import dataclass, fields, replace
from typing import Any

from .errors import ArgumentError, ArgumentTypeError

__all__ = ["Options", "PRECISIONS", "options_of"]

PRECISIONS = ("strict", "tf32", "bf16", "f16", "any")


@dataclass(frozen=True)
class Options:
    """What every backend's plans and functions share.

    ``precision``: how far inputs may be rounded before the products (see the module table:
    ``"strict"``, ``"tf32"``, ``"bf16"``, ``"f16"``, ``"any"``). ``deterministic``: only
    candidates cuDNN marks deterministic (oneDNN's CPU convolutions are). ``workspace_limit``:
    bytes of workspace / scratchpad a candidate may use (None: no limit). ``budget_s``: seconds an
    autotune may spend (None: the backend's default). ``allow_known_bad``: let a candidate in
    :mod:`rawconv.known_bad` run when forced. ``isolate``: run candidates in a child process (a
    crash becomes a row status). ``timeout_s``: per candidate, in a child process. ``logger``: where
    rawconv's debug lines for this work go (default ``logging.getLogger("rawconv")``).
    Raises :class:`ArgumentError` / :class:`ArgumentTypeError` for bad values.
    """

    precision: str = "strict"
    deterministic: bool = False
    workspace_limit: int | None = None
    budget_s: float | None = None
    allow_known_bad: bool = False
    isolate: bool = False
    timeout_s: float = 60.0
    logger: logging.Logger | None = None

    def __post_init__(self):
        if not isinstance(self.precision, str):
            raise ArgumentTypeError(f"precision must be one of {list(PRECISIONS)}, got {type(self.precision).__name__}")
        if self.precision not in PRECISIONS:
            raise ArgumentError(f"precision must be one of {list(PRECISIONS)}, got {self.precision!r}")
        for name in ("deterministic", "allow_known_bad", "isolate"):
            if not isinstance(getattr(self, name), bool):
                raise ArgumentTypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        wl = self.workspace_limit
        if wl is not None and (isinstance(wl, bool) or not isinstance(wl, int) or wl < 0):
            raise ArgumentError(f"workspace_limit must be None or a number of bytes >= 0, got {wl!r}")
        for name in ("budget_s", "timeout_s"):
            v = getattr(self, name)
            if v is None and name == "budget_s":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ArgumentError(f"{name} must be a positive number of seconds, got {v!r}")
        if self.logger is not None and not isinstance(self.logger, logging.Logger):
            raise ArgumentTypeError(f"logger must be a logging.Logger, got {type(self.logger).__name__}")

    @property
    def log(self) -> logging.Logger:
        return self.logger or logging.getLogger("rawconv")

    def with_(self, **changes) -> "Options":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def as_dict(self) -> dict:
        """The fields as JSON-friendly values (the logger by name)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["logger"] = self.logger.name if self.logger is not None else None
        return out


def options_of(options: Any = None, **overrides) -> Options:
    """``options`` as an :class:`Options`: None (the defaults), an :class:`Options`, or a dict of
    its fields; ``overrides`` that are not None replace fields. Raises :class:`ArgumentTypeError`
    for another type and :class:`ArgumentError` naming an unknown key."""
    if options is None:
        opts = Options()
    elif isinstance(options, Options):
        opts = options
    elif isinstance(options, dict):
        known = {f.name for f in fields(Options)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ArgumentError(f"unknown option(s) {unknown}; Options has {sorted(known)}")
        opts = Options(**options)
    else:
        raise ArgumentTypeError(f"options must be None, a rawconv.Options or a dict, got {type(options).__name__}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    return opts.with_(**changes) if changes else opts
