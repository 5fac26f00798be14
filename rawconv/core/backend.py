"""The contract every backend offers, and the registry front ends iterate.

* One set of direction names: ``"forward"``, ``"backward_data"``, ``"backward_weights"``
  (:func:`canonical_direction` also takes cuDNN's ``"backward_filter"`` and benchdnn's
  ``"fwd"``/``"bwd_d"``/``"bwd_w"``).
* :class:`Candidate`: what every listing returns rows of (oneDNN's ``Implementation``, cuDNN's
  ``Algorithm``, the graph API's ``EngineConfig`` are candidates): ``backend``, ``direction``,
  ``choice`` (the stable name ``choice=`` and ``select()`` take), ``notes``, ``workspace_bytes``,
  ``known_bad`` (why it is in :mod:`rawconv.known_bad`, '' when not).
* :class:`Plan`: what the plans share (lifetime, ``with``, example tensors, a ``repr`` that shows
  the selected candidate and the state).
* :class:`Backend` and :func:`register` / :func:`backends` / :func:`get`: the registry. A backend
  registers itself when its module is imported; :func:`backends` imports the built-in ones.
  ``compare``, the CLI, ``rawconv info`` and the torch operators iterate it instead of naming
  each backend.

Nothing here loads a native library.
"""
from __future__ import annotations

import difflib
import importlib
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import ArgumentError, ArgumentTypeError

__all__ = ["DIRECTIONS", "canonical_direction", "Candidate", "Plan", "Backend", "register", "backends", "get",
           "backends_naming", "spelling_suggestions", "close_names"]

DIRECTIONS = ("forward", "backward_data", "backward_weights")
DIRECTION_ALIASES = {"backward_filter": "backward_weights", "fwd": "forward", "fwd_d": "forward",
                     "fwd_i": "forward", "bwd_d": "backward_data", "bwd_w": "backward_weights",
                     "bwd_wb": "backward_weights", "backward_input": "backward_data",
                     "backward_weight": "backward_weights"}
BUILTIN = ("onednn", "cudnn", "cudnn_graph")
# where each built-in backend lives (imported by backends(); it registers itself at its end)
MODULES = {"onednn": "rawconv.onednn", "cudnn": "rawconv.cudnn", "cudnn_graph": "rawconv.cudnn.graph"}


def canonical_direction(direction: Any) -> str:
    """``direction`` as one of :data:`DIRECTIONS` (aliases: ``"backward_filter"`` is cuDNN's word
    for ``"backward_weights"``; benchdnn's ``"fwd"``, ``"bwd_d"``, ``"bwd_w"``). Raises
    :class:`ArgumentTypeError` / :class:`ArgumentError`."""
    if not isinstance(direction, str):
        raise ArgumentTypeError(f"direction must be a string such as 'forward', got {type(direction).__name__}")
    d = DIRECTION_ALIASES.get(direction, direction)
    if d not in DIRECTIONS:
        raise ArgumentError(f"direction must be one of {list(DIRECTIONS)} (or backward_filter, cuDNN's name "
                            f"for backward_weights), got {direction!r}")
    return d


class Candidate:
    """What every listing's rows are (a mixin of each backend's row dataclass).

    Subclasses provide ``backend`` (a class attribute), ``direction``, ``choice`` (the stable name
    that ``select()`` and the functions' ``choice=`` take), ``notes`` (a tuple of short strings:
    layouts, reorders, math type, numerical and behavior notes...), ``workspace_bytes`` (oneDNN
    scratchpad or cuDNN workspace, None when unknown) and ``known_bad`` (why it is in
    :mod:`rawconv.known_bad` for this problem, '' when it is not)."""

    backend = ""     # no annotations here: dataclass subclasses would take these as field defaults

    @property
    def choice(self) -> str:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    @property
    def notes(self) -> tuple:
        return ()

    def __repr__(self) -> str:
        """One line: the row type and its ``str`` (what a notebook shows for a candidate)."""
        return f"<{type(self).__name__} {' '.join(str(self).split())}>"

    def _repr_html_(self) -> str:
        from .results import ResultTable

        return ResultTable([self])._repr_html_()

    def summary(self) -> dict:
        """The contract's fields as a JSON-friendly dict (plus the backend's own fields)."""
        import dataclasses

        out = {"backend": self.backend, "direction": getattr(self, "direction", ""), "choice": self.choice,
               "notes": list(self.notes), "workspace_bytes": getattr(self, "workspace_bytes", None),
               "known_bad": getattr(self, "known_bad", "") or ""}
        if dataclasses.is_dataclass(self):
            for f in dataclasses.fields(self):
                v = getattr(self, f.name)
                out.setdefault(f.name, list(v) if isinstance(v, tuple) else v)
        return out


class Plan:
    """What every backend's plan shares: ``with`` frees it, :meth:`free` is idempotent, and the
    ``repr`` shows the backend, direction, problem, selected candidate and state."""

    backend: str = ""
    _freed: bool = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def free(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def _check_live(self) -> None:
        if self._freed:
            raise ArgumentError(f"this {type(self).__name__} plan was freed")

    def _selected_label(self) -> str:
        """The selected candidate's stable name, or how one will be chosen."""
        return "?"

    def __repr__(self) -> str:
        mod = type(self).__module__
        if self._freed:
            return f"<{mod}.{type(self).__name__} (freed)>"
        p = getattr(self, "problem", None)
        return (f"<{mod}.{type(self).__name__} {getattr(self, 'direction', '')} {p.describe() if p else ''} "
                f"choice={self._selected_label()}>")


@dataclass
class Backend:
    """One registry entry.

    ``name``: ``"onednn"``, ``"cudnn"``, ``"cudnn_graph"``; ``device_type``: ``"cpu"`` or
    ``"cuda"``; ``module``: the module's import path; ``library``: the vendor library's name;
    ``candidates(problem, direction, options)``: its listing; ``plan(problem, direction, options,
    choice)``: a plan with that choice selected; ``info()``: what was loaded. ``available()`` says
    whether it can run here and, when not, why. ``replay(key, problem, choice, options)``: the
    plan :func:`rawconv.tuning.replay` gives for a record (its :class:`~rawconv.tuning.TuningKey`,
    problem, choice, and the :class:`rawconv.Options` fields the key implies) where the key holds
    more than ``plan`` takes (oneDNN's thread count and post-ops, the graph's activation); None:
    ``plan`` is called. ``choice_names``: a regular expression every choice name of this backend
    matches whole (its grammar: oneDNN's lowercase ``kind:isa[@layouts]``, cuDNN's ``ALGO@math``,
    the graph API's ``eng28{k2=3}``), so that a name can be checked, and a name of another
    backend recognised, before any tensor is seen (:func:`backends_naming`)."""

    name: str
    device_type: str
    module: str
    library: str
    candidates: Callable
    plan: Callable
    info: Callable
    describe: str = ""
    vendor_words: dict = field(default_factory=dict)
    rows: str = ""     # "module:function" giving compare's rows for this backend (see rawconv.compare)
    replay: Callable | None = None   # replay(key, problem, choice, options): a tuning record's plan (see below)
    choice_names: str = ""   # the grammar of this backend's choice names (a regex matched whole); "": any

    def rows_function(self):
        """The function ``compare`` calls for this backend's rows (None when it has none)."""
        if not self.rows:
            return None
        mod, _, fn = self.rows.partition(":")
        return getattr(importlib.import_module(mod), fn)

    def available(self) -> tuple[bool, str]:
        try:
            self.info()
        except Exception as exc:  # noqa: BLE001 - any failure to load means "not here", with why
            return False, f"{type(exc).__name__}: {exc}"
        return True, ""


_registry: dict[str, Backend] = {}
_lock = threading.Lock()


def register(backend: Backend) -> Backend:
    """Add (or replace) a backend in the registry; returns it."""
    if not isinstance(backend, Backend):
        raise ArgumentTypeError(f"register takes a rawconv._backend.Backend, got {type(backend).__name__}")
    with _lock:
        _registry[backend.name] = backend
    return backend


def backends(device_type: str | None = None) -> list[Backend]:
    """The registered backends (the built-in ones imported first), optionally those of one device
    type (``"cpu"``, ``"cuda"``), in registration order. Importing a backend module loads no library."""
    for name in BUILTIN:
        if name not in _registry:
            importlib.import_module(MODULES[name])
    with _lock:
        out = list(_registry.values())
    return [b for b in out if device_type is None or b.device_type == device_type]


def backends_naming(choice: str) -> list[Backend]:
    """The backends (built-in ones imported first) whose choice-name grammar ``choice`` fits, e.g.
    ``[cudnn]`` for ``"IMPLICIT_PRECOMP_GEMM@fma"``, ``[onednn]`` for ``"jit:avx2@any"``, ``[]``
    for ``"JIT:AVX2"`` (oneDNN's names are lowercase). Only the grammar: whether the library offers
    the name for a problem is known once the problem is."""
    if not isinstance(choice, str):
        return []
    return [b for b in backends() if b.choice_names and re.fullmatch(b.choice_names, choice)]


def spelling_suggestions(choice: str) -> list[str]:
    """Spellings of ``choice`` in another case that fit a backend's grammar (``"JIT:AVX512_CORE"``
    -> ``["jit:avx512_core"]``, ``"implicit_gemm@fma"`` -> ``["IMPLICIT_GEMM@fma"]``)."""
    if not isinstance(choice, str):
        return []
    head, at, tail = choice.partition("@")
    seen, out = {choice}, []
    for s in (choice.lower(), choice.upper(), head.upper() + at + tail.lower(), head.lower() + at + tail.lower()):
        if s not in seen:
            seen.add(s)
            if backends_naming(s):
                out.append(s)
    return out


def close_names(name: str, names, n: int = 3) -> list[str]:
    """Up to ``n`` of ``names`` closest to ``name``, ignoring case (``difflib``): the "did you mean"
    of an unknown keyword or a choice a library does not offer."""
    names = list(dict.fromkeys(names))
    lower = {}
    for c in names:
        lower.setdefault(c.lower(), c)
    exact = [c for c in names if c.lower() == name.lower() and c != name]
    if exact:   # the same name in another case: that one
        return exact[:n]
    return [lower[c] for c in difflib.get_close_matches(name.lower(), list(lower), n=n, cutoff=0.6)]


def get(name: str) -> Backend:
    """The backend registered as ``name``; raises :class:`ArgumentError` naming those there are."""
    if not isinstance(name, str):
        raise ArgumentTypeError(f"backend must be a name such as 'onednn', got {type(name).__name__}")
    names = [b.name for b in backends()]
    if name not in _registry:
        raise ArgumentError(f"unknown backend {name!r}; known: {names}")
    return _registry[name]
