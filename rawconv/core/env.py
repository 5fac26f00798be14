"""Every ``RAWCONV_*`` environment variable, declared once as data (:data:`KNOBS`), and the getters
rawconv reads them through (no other module reads ``os.environ`` for a ``RAWCONV_`` name;
``tests/test_env.py`` checks it).

Each :class:`Knob` has its ``name``, ``type`` (``"path"``: a file path, unset or empty = none;
``"switch"``: on unless ``0``/``false``/``no``/``off``; ``"text"``: the string as set), ``default``
(what an unset variable means), ``meaning``, the module that reads it (``read_by``) and ``scope``
(``"rawconv"``: read by the package; ``"tests"``: read by the test suite, a tool or the example
notebook only, listed so that every name has one home). :func:`table` gives the rows a documentation page
is generated from.

    >>> from rawconv.core import env
    >>> env.get("RAWCONV_PROGRESS")          # True unless RAWCONV_PROGRESS=0 (false, no, off)
    True
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["Knob", "KNOBS", "get", "knob", "table"]

_OFF = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Knob:
    """One environment variable: ``name``, ``type`` (``"path"``, ``"switch"``, ``"text"``),
    ``default`` (the value an unset variable gives), ``meaning``, ``read_by``, ``scope``."""

    name: str
    type: str
    default: Any
    meaning: str
    read_by: str
    scope: str = "rawconv"


KNOBS: tuple[Knob, ...] = (
    Knob("RAWCONV_DNNL_LIBRARY", "path", None,
         "The libdnnl.so.3 to load (its full path): the only candidate when set; unset, rawconv searches the "
         "onednn-cpu-gomp wheel, the venv and the system (rawconv.info() says which was found and how).",
         "rawconv.onednn._ffi"),
    Knob("RAWCONV_CUDNN_LIBRARY", "path", None,
         "The libcudnn.so.9 to load (its full path): the only candidate when set (an error when another copy is "
         "already mapped in the process); unset, the copy torch loaded, then the nvidia-cudnn wheels, then the "
         "system.", "rawconv.cudnn._ffi"),
    Knob("RAWCONV_TUNING_CACHE", "path", None,
         "The JSON file the process's tuning cache (rawconv.tuning.cache()) is read from and written to; unset: "
         "in memory only (rawconv.tuning.set_cache_file overrides it).", "rawconv.core.tuning"),
    Knob("RAWCONV_CUDNN_TUNING_CACHE", "path", None,
         "The older name of RAWCONV_TUNING_CACHE, still read when that one is unset.", "rawconv.core.tuning"),
    Knob("RAWCONV_CACHE_LIMIT", "text", None,
         "The bytes of buffers (reorder buffers, scratchpads) rawconv's cached CPU plans may hold in all, as an "
         "int or with a K, M or G suffix (\"512M\"); unset: rawconv.core.plans.DEFAULT_CACHE_LIMIT (512 MiB). "
         "Past it the least recently used are released (rawconv.set_cache_limit overrides it).",
         "rawconv.core.plans"),
    Knob("RAWCONV_NAN_GUARD", "switch", True,
         "0 (false, no, off): fused oneDNN activations that can drop a NaN (relu, relu6, gelu, hardsigmoid, "
         "sigmoid: rawconv.onednn.fused.NAN_GUARDED) run fused on every call without reading x first, as torch.compile "
         "with inductor freezing runs them (a NaN through a fused ReLU may come out as 0); unset: guarded, torch "
         "eager's results (rawconv.onednn.fused.NAN_GUARD overrides it).", "rawconv.onednn.fused"),
    Knob("RAWCONV_PROGRESS", "switch", True,
         "0 (false, no, off) turns every automatic progress bar off (progress=True still shows one).",
         "rawconv.core.progress"),
    Knob("RAWCONV_ISOLATE_CRASH", "text", None,
         "A test aid for crash isolation: in an isolated child, running the oneDNN candidate of that name "
         "(\"name\" or \"name@layouts\") calls os.abort() first, so --isolate can be checked end to end.",
         "rawconv.onednn.isolated"),
    Knob("RAWCONV_ISOLATED_CHILD", "text", None,
         "Set to 1 by rawconv in the environment of its isolation children (rawconv.core.isolate); rawconv "
         "reads it nowhere (a child's code can tell where it runs).", "rawconv.core.isolate"),
    Knob("RAWCONV_EXPLORE_SMALL", "switch", False,
         "1: the example notebook examples/explore.ipynb picks a small layer and few repetitions (its test sets it).",
         "examples/explore.ipynb", scope="tests"),
    Knob("RAWCONV_FUZZ_EXAMPLES", "text", "40", "How many examples tests/test_fuzz.py draws per property.",
         "tests/test_fuzz.py", scope="tests"),
    Knob("RAWCONV_FUZZ_SEED", "text", None, "The seed of tests/test_fuzz.py's draws (to replay a failure).",
         "tests/test_fuzz.py", scope="tests"),
    Knob("RAWCONV_TORCH_CONV_TESTS", "path", None,
         "PyTorch's test_convolution.py for tools/run_torch_conv_tests.py (default: its cached download).",
         "tools/run_torch_conv_tests.py", scope="tests"),
    Knob("RAWCONV_TEST_DIST_OUT", "path", None, "Where tests/test_distributed.py's spawned ranks write their results.",
         "tests/test_distributed.py", scope="tests"),
)

_BY_NAME = {k.name: k for k in KNOBS}


def knob(name: str) -> Knob:
    """The declared :class:`Knob` called ``name``; raises ``KeyError`` for an undeclared name (a
    new variable is declared in :data:`KNOBS` first)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in rawconv.core.env.KNOBS") from None


def get(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of the declared variable ``name`` in ``environ`` (default ``os.environ``), typed:
    a ``"path"`` is the string, None when unset or empty; a ``"switch"`` is False for ``0``,
    ``false``, ``no``, ``off`` (any case, spaces ignored), its default when unset, True otherwise;
    a ``"text"`` is the string, None when unset or empty."""
    k = knob(name)
    raw = (os.environ if environ is None else environ).get(name)
    if k.type == "switch":
        if raw is None:
            return k.default
        return raw.strip().lower() not in _OFF
    return raw or k.default


def table(scope: str | None = None) -> list[dict]:
    """The knobs as rows (``name``, ``type``, ``default``, ``meaning``, ``read_by``, ``scope``),
    optionally of one scope: what the documentation's environment page lists."""
    return [dict(name=k.name, type=k.type, default=k.default, meaning=k.meaning, read_by=k.read_by, scope=k.scope)
            for k in KNOBS if scope is None or k.scope == scope]
