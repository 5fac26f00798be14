"""The contract every backend offers, and the registry front ends iterate.

* One set of direction names: ``"forward"``, ``"backward_data"``, ``"backward_weights"``
  (:func:`canonical_direction` also takes cuDNN's ``"backward_filter"`` and benchdnn's
  ``"fwd"``/``"bwd_d"``/``"bwd_w"``).
* :class:`Candidate`: what every listing returns rows of (oneDNN's ``Implementation``, cuDNN's
  ``Algorithm``, the graph API's ``EngineConfig`` are candidates): ``backend``, ``direction``,
  ``choice`` (the stable name ``choice=`` and ``select()`` take), ``notes``, ``workspace_bytes``,
  ``known_bad`` (why it is in :mod:`rawconv.known_bad`, '' when not).
* :class:`Plan`: the plan contract (a :class:`typing.Protocol`): ``problem``, ``direction``,
  ``candidates()``, ``select(choice=)``, ``selected``, ``execute()``, ``hot_run()``,
  ``autotune(budget_s=)``, ``tuning_key()``, ``free()`` and ``with``; :func:`contract_gaps` checks
  a class against it.
* :class:`Backend` and :func:`register` / :func:`backends` / :func:`get`: the registry. A backend
  registers itself when its module is imported; :func:`backends` imports the built-in ones.
  :meth:`Backend.plan_for` is the entry to a backend's plans. ``compare``, ``rawconv list``,
  ``rawconv info`` and the torch operators iterate it instead of naming each backend.

Nothing here loads a native library.
"""
from __future__ import annotations

import importlib
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

from .errors import ArgumentError, ArgumentTypeError, close_names

__all__ = ["DIRECTIONS", "canonical_direction", "Candidate", "Plan", "contract_gaps", "Backend", "register",
           "backends", "get", "known", "backends_naming", "spelling_suggestions", "close_names"]

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


@runtime_checkable
class Plan(Protocol):
    """The plan contract: what every backend's plan class offers (:class:`rawconv.onednn.Convolution`,
    :class:`rawconv.cudnn.Convolution`, :class:`rawconv.cudnn_graph.GraphConvolution` satisfy it;
    ``tests/test_plan_contract.py`` checks each, and :func:`contract_gaps` says what a class lacks).
    A plan is made by its backend's :meth:`Backend.plan_for` for one problem and direction.

    Attributes: ``problem`` (:class:`~rawconv.problem.ConvProblem`), ``direction`` (one of
    :data:`DIRECTIONS`; the graph API's plans say ``"backward_filter"``), ``selected`` (the
    candidate :meth:`execute` runs). ``isinstance(plan, Plan)`` checks a plan object (the
    attributes are set when it is made)."""

    problem: Any
    direction: str

    def candidates(self) -> Any:
        """Every candidate the library offers for the plan's problem and direction (rows of
        :class:`Candidate`), listed without timing."""

    def select(self, *args: Any, choice: Any = None) -> Any:
        """Make ``choice`` (a candidate's stable name, or a row of :meth:`candidates`) the one
        :meth:`execute` runs; returns it (the backend's own description of it)."""

    @property
    def selected(self) -> Any:
        """The candidate :meth:`execute` runs."""

    def execute(self, x: Any = None, w: Any = None, bias: Any = None, out: Any = None, *, grad_y: Any = None) -> Any:
        """Run the selected candidate: forward ``execute(x, w, bias, out)`` -> y, backward data
        ``execute(grad_y=dy, w=w)`` -> dx, backward weights ``execute(x, grad_y=dy)`` -> dw."""

    def hot_run(self, a: Any, b: Any, bias: Any = None, out: Any = None) -> Any:
        """One call on the hot path where it applies (tensors with exactly the metadata of an
        earlier checked call: no checks beyond that, no allocation beyond the output), else
        through :meth:`execute`: ``a, b`` = x, w (forward), grad_y, w (backward data), x,
        grad_y (backward weights). Returns what :meth:`execute` returns."""

    def autotune(self, *args: Any, budget_s: Any = None, use_cache: Any = None, progress: Any = None) -> Any:
        """Time the candidates (checked against float64), select the fastest correct one and
        return the ranked rows; ``budget_s``: seconds of wall time for the problem and direction
        (:func:`rawconv.core.autotune.check_budget`); ``use_cache``: the tuning cache first. The
        choice's record is then ``plan.tuning_record``."""

    def tuning_key(self) -> Any:
        """The :class:`~rawconv.tuning.TuningKey` an ``autotune()`` with its defaults stores its
        choice under (what makes this question distinct: problem, direction, options, library
        version, machine)."""

    def free(self) -> None:
        """Release the library's objects (idempotent); ``with plan:`` calls it on the way out."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> Any: ...


#: the keywords each method of the contract must accept (beyond its positional parameters)
CONTRACT_KEYWORDS = {"select": ("choice",), "execute": ("grad_y", "out"), "autotune": ("budget_s", "use_cache", "progress"),
                     "hot_run": ("bias", "out")}


def contract_gaps(cls: type) -> list[str]:
    """What plan class ``cls`` lacks of :class:`Plan` (checked on the class, without making a plan:
    cuDNN's need a GPU): each method present and callable with the keywords of
    :data:`CONTRACT_KEYWORDS`, ``selected`` readable. [] when it satisfies the contract."""
    import inspect

    gaps = []
    for name in ("candidates", "select", "execute", "hot_run", "autotune", "tuning_key", "free", "__enter__",
                 "__exit__"):
        fn = getattr(cls, name, None)
        if not callable(fn):
            gaps.append(f"no method {name}()")
            continue
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            continue
        params = sig.parameters
        var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        for kw in CONTRACT_KEYWORDS.get(name, ()):
            p = params.get(kw)
            if not var_kw and (p is None or p.kind is p.POSITIONAL_ONLY):
                gaps.append(f"{name}() takes no {kw}=")
        required = [p for p in list(params.values())[1:] if p.default is p.empty
                    and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        allowed_required = {"hot_run": 2}.get(name, 0)
        if name not in ("__exit__",) and len(required) > allowed_required:
            gaps.append(f"{name}() requires {[p.name for p in required]}")
    if not isinstance(getattr(cls, "selected", None), property) and "selected" not in getattr(cls, "__annotations__", {}):
        gaps.append("no selected property")
    return gaps


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
    rows: Any = ""     # "module:function" (or the function) giving compare's rows for this backend (rawconv.compare)
    replay: Callable | None = None   # replay(key, problem, choice, options): a tuning record's plan (see below)
    choice_names: str = ""   # the grammar of this backend's choice names (a regex matched whole); "": any

    def plan_for(self, problem: Any, direction: str = "forward", options: Any = None, choice: Any = None) -> Plan:
        """A plan (:class:`Plan`) of this backend for ``problem`` and ``direction`` (any spelling
        :func:`canonical_direction` takes), with ``options`` (:class:`rawconv.Options`, a dict of
        its fields, or None) and ``choice`` selected (None: the library's first choice). The one
        entry point the front ends reach a backend's plans by. Raises the backend's exceptions."""
        from .options import options_of

        return self.plan(problem, canonical_direction(direction), options_of(options), choice)

    def rows_function(self):
        """The function ``compare`` calls for this backend's rows (None when it has none)."""
        if not self.rows:
            return None
        if callable(self.rows):
            return self.rows
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


def known(name: object) -> bool:
    """Whether ``name`` is a built-in backend's (:data:`BUILTIN`) or one registered now (what a
    :class:`~rawconv.tuning.TuningKey` may name); imports nothing."""
    return name in BUILTIN or (isinstance(name, str) and name in _registry)


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


def get(name: str) -> Backend:
    """The backend registered as ``name``; raises :class:`ArgumentError` naming those there are."""
    if not isinstance(name, str):
        raise ArgumentTypeError(f"backend must be a name such as 'onednn', got {type(name).__name__}")
    names = [b.name for b in backends()]
    if name not in _registry:
        raise ArgumentError(f"unknown backend {name!r}; known: {names}")
    return _registry[name]
