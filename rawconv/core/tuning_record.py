"""Tuning keys and records (:mod:`rawconv.tuning`'s :class:`TuningKey`, :class:`TuningRecord`):
what was tuned as structured fields, the choice that won with its times and error, the checks of
every number when a record is made or read, the environment a record was made in
(:func:`register_environment`, :func:`current_environment`), the records of a file's content, and
:func:`replay` (a plan with a record's choice selected)."""
from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable, Iterator

from . import tuning_files as _files
from .backend import BUILTIN as BACKENDS, canonical_direction, known as _known
from .errors import ArgumentError, ArgumentTypeError, NotSupportedError
from .tuning_files import _check_depth, _dumps, _read_json, _write_json

log = logging.getLogger("rawconv.tuning")
FACE = "rawconv.core.tuning"   # where this module's public names live (rawconv.tuning): messages, pickles

SCHEMA = 1                          # TuningRecord JSON schema this rawconv writes and reads
MAX_THREADS = 1024                  # options.threads of a record: the OpenMP count a replay runs on
_C_INT = 2**31 - 1                  # a problem's sizes: the libraries take them as C ints
_INT64 = 2**63 - 1                  # any other integer of a record (JSON allows bignums)
CACHE_FORMAT = "rawconv-tuning-cache"
CACHE_VERSION = 1
_OLD_FORMAT = "rawconv_cudnn_graph_tuning"
_ENV_FIELDS = ("library", "library_version", "device", "device_arch")


class TuningEnvironmentError(ArgumentError):
    """A tuning record was made with another library version or on another device
    (:meth:`TuningRecord.check_environment` with ``strict=True``). ``differences``: the
    ``(field, recorded, current)`` triples that differ."""

    def __init__(self, message: str, differences: list):
        super().__init__(message)
        self.differences = list(differences)


# ---------------------------------------------------------------------------- keys
def _frozen(v, what: str):
    """A JSON-like value made hashable: lists -> tuples, dicts -> _Fields."""
    if isinstance(v, (list, tuple)):
        return tuple(_frozen(i, what) for i in v)
    if isinstance(v, Mapping):
        return _Fields(v, what)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise ArgumentTypeError(f"{what} values must be JSON scalars or lists of them, got {type(v).__name__} {v!r}")


def json_form(v):
    """The JSON form of a value made by :func:`_frozen`."""
    if isinstance(v, tuple):
        return [json_form(i) for i in v]
    if isinstance(v, _Fields):
        return {k: json_form(i) for k, i in v.items()}
    return v


class _Fields(Mapping):
    """A read-only, hashable mapping of str to JSON-like values (equality and hash do not depend
    on the key order, which is kept for display)."""

    __slots__ = ("_d", "_h")

    def __init__(self, d: Mapping, what: str = "field"):
        if not isinstance(d, Mapping):
            raise ArgumentTypeError(f"{what} must be a mapping, got {type(d).__name__}")
        if not all(isinstance(k, str) for k in d):
            raise ArgumentTypeError(f"{what} keys must be str, got {sorted(map(repr, d))}")
        self._d = {k: _frozen(d[k], what) for k in d}
        self._h = hash(tuple(sorted(self._d.items(), key=lambda kv: kv[0])))

    def __getitem__(self, k):
        return self._d[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        return self._h

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    def __repr__(self) -> str:
        return repr(json_form(self))


def _problem_fields(problem) -> dict:
    """The fields of a ConvProblem (or a dict of them) as a key holds them: no ``name``; the
    device type only (``"cuda:1"`` -> ``"cuda"``)."""
    if dataclasses.is_dataclass(problem) and not isinstance(problem, type):
        d = {f.name: getattr(problem, f.name) for f in dataclasses.fields(problem)}
    elif isinstance(problem, Mapping):
        d = dict(problem)
    else:
        raise ArgumentTypeError(f"problem must be a ConvProblem or a dict of its fields, got {type(problem).__name__}")
    d.pop("name", None)
    if isinstance(d.get("device"), str):
        d["device"] = d["device"].split(":", 1)[0]
    return d


@dataclass(frozen=True)
class TuningKey:
    """What was tuned (hashable; equal keys mean the same tuning question).

    ``backend``: one of :data:`BACKENDS` or registered now (:func:`rawconv.core.backend.known`);
    ``direction``: canonical (:func:`rawconv._backend.canonical_direction`);
    ``problem``: the :class:`~rawconv.problem.ConvProblem` fields as a read-only mapping (a
    ConvProblem or a dict is accepted; ``name`` and the device index are dropped); ``activation``:
    a fused activation or None; ``options``: the options and filters in force (names and JSON
    scalars, e.g. ``allow_tf32``, ``workspace_limit``, ``deterministic_only``); ``library`` /
    ``library_version``: e.g. ``"cuDNN"``, ``"9.19.0"``; ``device`` / ``device_arch``: e.g.
    ``"NVIDIA H200"``, ``"sm_90"``, or ``"cpu"``, ``"avx512_core_amx"``.
    Raises :class:`ArgumentError` / :class:`ArgumentTypeError` for fields it cannot hold."""

    backend: str
    direction: str
    problem: Mapping
    activation: str | None = None
    options: Mapping = field(default_factory=dict)
    library: str = ""
    library_version: str = ""
    device: str = ""
    device_arch: str = ""

    def __post_init__(self):
        if not _known(self.backend):
            raise ArgumentError(f"backend must be one of {list(BACKENDS)} or a registered one, got {self.backend!r}")
        object.__setattr__(self, "direction", canonical_direction(self.direction))
        object.__setattr__(self, "problem", _Fields(_problem_fields(self.problem), "problem"))
        object.__setattr__(self, "options", _Fields(self.options, "options"))
        if self.activation is not None and not isinstance(self.activation, str):
            raise ArgumentTypeError(f"activation must be None or a str, got {self.activation!r}")
        for name in _ENV_FIELDS:
            if not isinstance(getattr(self, name), str):
                raise ArgumentTypeError(f"{name} must be a str, got {getattr(self, name)!r}")

    # what the seed ranking compares
    @property
    def ndim(self) -> int:
        """Spatial dimensions of the problem (1, 2 or 3)."""
        return len(self.problem.get("in_spatial", ()))

    @property
    def dtype(self) -> str:
        return self.problem.get("dtype", "")

    @property
    def layout(self) -> str:
        return self.problem.get("layout", "")

    def environment(self) -> dict:
        """``{"library", "library_version", "device", "device_arch"}`` of this key."""
        return {k: getattr(self, k) for k in _ENV_FIELDS}

    def conv_problem(self):
        """The :class:`~rawconv.problem.ConvProblem` this key describes (device as recorded:
        ``"cuda"``, ``"cpu"``)."""
        from .problem import ConvProblem

        return ConvProblem(**json_form(self.problem))

    @classmethod
    def for_backend(cls, backend: str, problem, direction: str = "forward", options: Mapping | None = None,
                    activation: str | None = None, environment: Mapping | None = None) -> "TuningKey":
        """The key of a tuning question asked of ``backend`` here: ``environment`` (the library,
        its version and the device; default: what the backend reports now,
        :func:`current_environment`, which loads its library) completes the fields."""
        env = dict(environment) if environment is not None else current_environment(backend)
        return cls(backend, direction, problem, activation, dict(options or {}),
                   **{k: str(env.get(k, "")) for k in _ENV_FIELDS})

    def __str__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in json_form(self.options).items())
        act = f" + {self.activation}" if self.activation else ""
        return (f"{self.backend} {self.direction} {_describe(self)}{act}"
                + (f" [{opts}]" if opts else "")
                + f"; {self.library} {self.library_version} on {self.device} ({self.device_arch})")

    def __repr__(self) -> str:
        return f"<TuningKey {self}>"

    def to_dict(self) -> dict:
        return {"backend": self.backend, "direction": self.direction, "problem": json_form(self.problem),
                "activation": self.activation, "options": json_form(self.options),
                **self.environment()}

    @classmethod
    def from_dict(cls, d: Mapping) -> "TuningKey":
        if not isinstance(d, Mapping):
            raise ArgumentTypeError(f"a tuning key is a JSON object, got {type(d).__name__}")
        missing = [k for k in ("backend", "direction", "problem") if k not in d]
        if missing:
            raise ArgumentError(f"tuning key lacks {missing}")
        return cls(d["backend"], d["direction"], d["problem"], d.get("activation"), d.get("options") or {},
                   **{k: d.get(k, "") for k in _ENV_FIELDS})


# ---------------------------------------------------------------------------- records
def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _rawconv_version() -> str:
    from . import __version__

    return __version__


def _error_dict(error) -> dict | None:
    if error is None:
        return None
    if isinstance(error, Mapping):
        d = dict(error)
    elif all(hasattr(error, k) for k in ("max_abs", "max_rel", "ratio")):  # ErrorStats or alike
        d = {k: getattr(error, k) for k in ("max_abs", "max_rel", "ratio")}
    else:
        raise ArgumentTypeError(f"error must be a mapping of max_abs, max_rel, ratio (or an ErrorStats) or None, "
                                f"got {type(error).__name__} {error!r}")
    out = {}
    for k in ("max_abs", "max_rel", "ratio"):
        v = d.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ArgumentTypeError(f"error.{k} must be a number, got {v!r}")
        out[k] = None if v is None else float(v)
    return out


def _time(v, name: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ArgumentTypeError(f"{name} must be a number of milliseconds or None, got {v!r}")
    if not math.isfinite(v) or v < 0:   # (a replay's drift divides by it)
        raise ArgumentError(f"{name} must be a finite number of milliseconds >= 0 or None, got {v!r}")
    return float(v)


def _walk_numbers(v, where: str):
    """``(where, number)`` for every int and float inside a JSON-like value (bools are not numbers)."""
    stack = [(where, v)]
    while stack:
        w, v = stack.pop()
        if isinstance(v, bool) or v is None or isinstance(v, str):
            continue
        if isinstance(v, (int, float)):
            yield w, v
        elif isinstance(v, Mapping):
            stack.extend((f"{w}.{k}", i) for k, i in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{w}[{j}]", i) for j, i in enumerate(v))


def _check_numbers(rec: "TuningRecord") -> None:
    """Limits on every number a record holds (it may come from a file: a replay builds a plan from
    it). The problem's sizes are C ints >= 0; ``options.threads`` an int from 1 to
    :data:`MAX_THREADS`; ``options.workspace_limit`` None or an int from 0 to 2**63 - 1; the error
    against float64 finite and >= 0; any other number (options, detail, timing) a finite float or
    an int within int64. Raises :class:`ArgumentError` naming the field."""
    k = rec.key
    for where, v in _walk_numbers(k.problem, "problem"):
        if not isinstance(v, int) or not 0 <= v <= _C_INT:
            raise ArgumentError(f"{where} must be an int from 0 to {_C_INT} (a size the libraries take as a C int), "
                                f"got {v!r}")
    threads = k.options.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or not 1 <= threads <= MAX_THREADS):
        raise ArgumentError(f"options.threads must be None or an int from 1 to {MAX_THREADS} (the OpenMP thread "
                            f"count a replay runs on; rawconv.tuning.MAX_THREADS), got {threads!r}")
    ws = k.options.get("workspace_limit")
    if ws is not None and (isinstance(ws, bool) or not isinstance(ws, int) or not 0 <= ws <= _INT64):
        raise ArgumentError(f"options.workspace_limit must be None or a number of bytes from 0 to 2**63 - 1, "
                            f"got {ws!r}")
    for where, v in _walk_numbers(rec.error, "error"):
        if not math.isfinite(v) or v < 0:
            raise ArgumentError(f"{where} must be a finite number >= 0, got {v!r}")
    for what, value in (("options", k.options), ("detail", rec.detail), ("timing", rec.timing)):
        for where, v in _walk_numbers(value, what):
            if isinstance(v, float) and not math.isfinite(v):
                raise ArgumentError(f"{where} must be a finite number, got {v!r}")
            if isinstance(v, int) and not -_INT64 - 1 <= v <= _INT64:
                raise ArgumentError(f"{where} must fit a 64-bit integer, got {v!r}")
    for name in ("median_ms", "min_ms"):
        v = getattr(rec, name)
        if v is not None and v > 1e9:
            raise ArgumentError(f"{name} must be at most 1e9 ms, got {v!r}")


@dataclass(frozen=True)
class TuningRecord:
    """The outcome of one autotune: ``key`` (:class:`TuningKey`) and the choice.

    ``choice``: the stable candidate name the backend's selection takes (``"eng72{k17=1,k24=4}"``,
    ``"nhwc:eng72{k17=1}"``, ``"IMPLICIT_PRECOMP_GEMM math=fma"``, ``"brgconv:avx512_core@nhwc"``);
    ``detail``: backend-specific, JSON-able (cuDNN graph: ``engine``, ``knobs`` as ``[type, value]``
    pairs, notes, ``workspace_bytes``; legacy cuDNN: ``algo``, ``math``; oneDNN: ``impl``);
    ``label``: what was tuned, for people (a layer's name, ``"layer1.0.conv2"``; not part of the
    key: problems are keyed by their fields); ``timing``: whether its time can be trusted
    (``{"trustworthy": bool, "run_trustworthy", "run_warnings", "row_flags", "machine"}``, as
    :func:`rawconv.compare.records` writes it from the run's load reports; None: not known), so
    that a replay reports no drift against a time measured on a busy machine; ``layout``: the memory layout the chosen candidate
    computes in (the problem's own unless it
    runs on relaid copies, as ``"nhwc:"`` configs do); ``median_ms`` / ``min_ms``: its time per
    call (ms); ``error``: ``{"max_abs", "max_rel", "ratio"}`` against float64 (None when not
    checked); ``created``: ISO 8601 UTC time (default now); ``rawconv_version`` (default this
    one's); ``schema``: :data:`SCHEMA`.

    JSON (:meth:`to_json`) is flat: ``schema``, the key's fields (:meth:`TuningKey.to_dict`),
    then ``choice``, ``layout``, ``detail``, ``median_ms``, ``min_ms``, ``error``, ``created``,
    ``rawconv_version``, ``label`` (docs/guides/tuning.md shows one), and ``timing`` when known.

    :meth:`replay` (or :func:`replay`) builds a plan with exactly this choice selected.
    """

    key: TuningKey
    choice: str
    detail: Mapping = field(default_factory=dict)
    layout: str = ""
    median_ms: float | None = None
    min_ms: float | None = None
    error: Mapping | None = None
    created: str = ""
    rawconv_version: str = ""
    schema: int = SCHEMA
    label: str = field(default="", compare=False)
    timing: Mapping | None = field(default=None, compare=False)

    def __post_init__(self):
        if not isinstance(self.key, TuningKey):
            raise ArgumentTypeError(f"key must be a TuningKey, got {type(self.key).__name__}")
        if not isinstance(self.choice, str) or not self.choice:
            raise ArgumentError(f"choice must be a non-empty str, got {self.choice!r}")
        if self.schema != SCHEMA:
            raise ArgumentError(f"tuning record schema {self.schema!r} is not the one this rawconv reads ({SCHEMA})")
        if not isinstance(self.layout, str):
            raise ArgumentTypeError(f"layout must be a str, got {self.layout!r}")
        if not isinstance(self.label, str):
            raise ArgumentTypeError(f"label must be a str, got {self.label!r}")
        if self.timing is not None:
            if not isinstance(self.timing, Mapping):
                raise ArgumentTypeError(f"timing must be a mapping or None, got {type(self.timing).__name__}")
            if not isinstance(self.timing.get("trustworthy", True), bool):
                raise ArgumentTypeError(f"timing['trustworthy'] must be a bool, got {self.timing.get('trustworthy')!r}")
            for k in ("row_flags", "run_warnings"):   # lines said to people (a replay joins them)
                v = self.timing.get(k)
                if v is not None and (not isinstance(v, (list, tuple)) or not all(isinstance(i, str) for i in v)):
                    raise ArgumentTypeError(f"timing[{k!r}] must be a list of str or None, got {v!r}")
            object.__setattr__(self, "timing", _Fields(self.timing, "timing"))
        object.__setattr__(self, "layout", self.layout or self.key.layout)
        object.__setattr__(self, "detail", _Fields(self.detail, "detail"))
        object.__setattr__(self, "median_ms", _time(self.median_ms, "median_ms"))
        object.__setattr__(self, "min_ms", _time(self.min_ms, "min_ms"))
        err = _error_dict(self.error)
        object.__setattr__(self, "error", None if err is None else _Fields(err, "error"))
        if not isinstance(self.created, str):
            raise ArgumentTypeError(f"created must be an ISO 8601 str, got {self.created!r}")
        object.__setattr__(self, "created", self.created or _now())
        try:
            datetime.datetime.fromisoformat(self.created)
        except ValueError:
            raise ArgumentError(f"created must be an ISO 8601 time, got {self.created!r}") from None
        object.__setattr__(self, "rawconv_version", self.rawconv_version or _rawconv_version())
        _check_numbers(self)

    @property
    def created_ts(self) -> float:
        """``created`` in seconds since the epoch (a time without a zone counts as UTC)."""
        t = datetime.datetime.fromisoformat(self.created)
        if t.tzinfo is None:
            t = t.replace(tzinfo=datetime.timezone.utc)
        return t.timestamp()

    def with_(self, **changes) -> "TuningRecord":
        """A copy with ``changes`` (dataclass fields)."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        return {"schema": self.schema, **self.key.to_dict(), "choice": self.choice, "layout": self.layout,
                "detail": json_form(self.detail), "median_ms": self.median_ms, "min_ms": self.min_ms,
                "error": None if self.error is None else json_form(self.error), "created": self.created,
                "rawconv_version": self.rawconv_version, "label": self.label,
                **({} if self.timing is None else {"timing": json_form(self.timing)})}

    @classmethod
    def from_dict(cls, d: Mapping) -> "TuningRecord":
        """A record from its JSON object. Raises :class:`ArgumentError` for another schema or
        missing / mistyped fields."""
        if not isinstance(d, Mapping):
            raise ArgumentTypeError(f"a tuning record is a JSON object, got {type(d).__name__}")
        _check_depth(d, "the tuning record")
        if "schema" not in d:
            raise ArgumentError("not a tuning record: no 'schema' field")
        if d["schema"] != SCHEMA:
            raise ArgumentError(f"tuning record schema {d['schema']!r} is not the one this rawconv reads ({SCHEMA})")
        if "choice" not in d:
            raise ArgumentError("tuning record lacks 'choice'")
        try:
            return cls(TuningKey.from_dict(d), d["choice"], d.get("detail") or {}, d.get("layout") or "",
                       d.get("median_ms"), d.get("min_ms"), d.get("error"), d.get("created") or "",
                       d.get("rawconv_version") or "", label=d.get("label") or "", timing=d.get("timing"))
        except ArgumentTypeError as exc:  # a JSON file's content: a wrong value, not a wrong call
            raise ArgumentError(str(exc)) from None

    def to_json(self, compact: bool = False) -> str:
        """The record as JSON text: one field per line (``compact``: all on one line)."""
        return _dumps(self.to_dict(), 0 if compact else 1)

    @classmethod
    def from_json(cls, text: str | bytes) -> "TuningRecord":
        """A record from :meth:`to_json`'s text. Raises :class:`ArgumentError` for text that is not
        JSON or not a record."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise ArgumentError(f"not a JSON tuning record: {exc}") from None
        except RecursionError:
            raise ArgumentError(f"not a tuning record: its JSON is nested too deeply to read (a record nests at "
                                f"most {_files.MAX_DEPTH} levels)") from None
        return cls.from_dict(data)

    # ------------------------------------------------------------------ files
    def save(self, path) -> None:
        """Write this record to ``path`` as JSON (replacing the file atomically)."""
        _write_json(path, self.to_dict())

    @staticmethod
    def save_all(records, path) -> None:
        """Write ``records`` (TuningRecords) to ``path`` as a JSON list."""
        records = list(records)
        if not all(isinstance(r, TuningRecord) for r in records):
            raise ArgumentTypeError("save_all takes TuningRecords")
        _write_json(path, [r.to_dict() for r in records], 2)

    @classmethod
    def load(cls, path) -> "TuningRecord | list[TuningRecord]":
        """The record in ``path`` (written by :meth:`save`), or the list of records when the file
        holds a list (:meth:`save_all`) or a tuning cache (:meth:`TuningCache.save`). Raises
        :class:`ArgumentError` naming ``path`` when it is missing, not JSON, of the old format or
        not records."""
        data = _read_json(path)
        if isinstance(data, Mapping) and "schema" in data:
            return _records_in(path, [data])[0]
        return _records_in(path, data)

    # ------------------------------------------------------------------ display
    def __str__(self) -> str:
        k = self.key
        t = f"{self.median_ms:.4g} ms" if self.median_ms is not None else "untimed"
        if self.min_ms is not None:
            t += f" (min {self.min_ms:.4g})"
        err = self.error.get("max_rel") if self.error is not None else None
        err = f", rel err {err:.1e}" if err is not None else ""
        who = f"{self.label}: " if self.label else ""
        return (f"{who}{k.backend} {k.direction} {_describe(k)} -> {self.choice}, {t}{self._timing_note()}{err}; "
                f"{k.library} {k.library_version} on {k.device} ({k.device_arch}), {self.created}")

    def _timing_note(self) -> str:
        """' [timed on a busy machine: ...]' when :attr:`timing` says the time is not to be trusted."""
        t = self.timing
        if t is None or t.get("trustworthy", True):
            return ""
        why = list(t.get("row_flags") or []) or [w.split(":")[0] for w in (t.get("run_warnings") or [])]
        return f" [time not to be trusted: {'; '.join(why) or 'unreliable run'}]"

    def __repr__(self) -> str:
        return f"<TuningRecord {self}>"

    def _repr_html_(self) -> str:
        from html import escape

        k = self.key
        opts = ", ".join(f"{a}={v!r}" for a, v in json_form(k.options).items()) or "-"
        err = ", ".join(f"{a} {v:.2e}" for a, v in self.error.items() if v is not None) if self.error else "-"
        items = [("choice", f"<b>{escape(self.choice)}</b>"), ("what", escape(self.label or "-")),
                 ("backend / direction", escape(f"{k.backend} / {k.direction}")),
                 ("problem", escape(_describe(k) + (f" + {k.activation}" if k.activation else ""))),
                 ("options", escape(opts)),
                 ("time", escape((f"median {self.median_ms:.4g} ms, min {self.min_ms:.4g} ms"
                                  if self.median_ms is not None and self.min_ms is not None else "-")
                                 + self._timing_note())),
                 ("error vs float64", escape(err)),
                 ("library", escape(f"{k.library} {k.library_version}")),
                 ("device", escape(f"{k.device} ({k.device_arch})")),
                 ("made", escape(f"{self.created} by rawconv {self.rawconv_version} (record schema {self.schema})"))]
        td = 'style="padding:1px 8px;text-align:left;border:none;vertical-align:top"'
        rows = "".join(f'<tr><th {td}>{a}</th><td {td}>{b}</td></tr>' for a, b in items)
        return ('<table style="border-collapse:collapse;font-size:0.9em"><caption style="text-align:left;'
                f'font-weight:bold;caption-side:top">tuning record</caption>{rows}</table>')

    # ------------------------------------------------------------------ replay
    def replay(self, strict: bool = False):
        """A plan with exactly this record's choice selected (:func:`replay`)."""
        return replay(self, strict=strict)

    # ------------------------------------------------------------------ environment
    def check_environment(self, strict: bool = False, *, current: Mapping | None = None) -> list:
        """Compare the library (name, version) and device (name, architecture) this record was made
        with to the current ones (``current``: a dict of those fields; default: what the backend
        registered with :func:`register_environment` reports now). Returns the
        ``(field, recorded, current)`` triples that differ ([] when none). When some differ:
        warns (``RuntimeWarning``) saying exactly what, or with ``strict`` raises
        :class:`TuningEnvironmentError` (an :class:`ArgumentError`)."""
        now = dict(current) if current is not None else current_environment(self.key.backend)
        rec = self.key.environment()
        diff = [(k, rec[k], now.get(k, "")) for k in _ENV_FIELDS if rec[k] != now.get(k, "")]
        if diff:
            what = "; ".join(f"{k}: recorded {a!r}, current {b!r}" for k, a, b in diff)
            msg = (f"tuning record {self.choice!r} ({self.key.backend} {self.key.direction}) was made with "
                   f"{rec['library']} {rec['library_version']} on {rec['device']} ({rec['device_arch']}); "
                   f"here it differs: {what}")
            if strict:
                raise TuningEnvironmentError(msg, diff)
            warnings.warn(msg, RuntimeWarning, stacklevel=_guard.stacklevel())
        return diff


# ---------------------------------------------------------------------------- environment probes
_env_probes: dict[str, Callable[[], Mapping]] = {}


def register_environment(backend: str, probe: Callable[[], Mapping]) -> None:
    """Let :meth:`TuningRecord.check_environment` ask ``backend`` for the current library and
    device: ``probe()`` returns ``{"library", "library_version", "device", "device_arch"}`` (the
    values the backend puts in its keys)."""
    if not _known(backend):
        raise ArgumentError(f"backend must be one of {list(BACKENDS)} or a registered one, got {backend!r}")
    if not callable(probe):
        raise ArgumentTypeError("probe must be callable")
    _env_probes[backend] = probe


def current_environment(backend: str) -> dict:
    """The current ``{"library", "library_version", "device", "device_arch"}`` of ``backend`` (its
    module is imported so that it registers; see :func:`register_environment`). Raises
    :class:`NotSupportedError` when the backend registered none, and what the probe raises (e.g.
    no GPU)."""
    if not _known(backend):
        raise ArgumentError(f"backend must be one of {list(BACKENDS)} or a registered one, got {backend!r}")
    if backend not in _env_probes and backend in BACKENDS:
        import importlib

        from .backend import MODULES

        importlib.import_module(MODULES[backend])
    probe = _env_probes.get(backend)
    if probe is None:
        raise NotSupportedError(f"rawconv.{backend} registers no environment probe "
                                "(rawconv.tuning.register_environment): pass current= explicitly")
    return {k: str(v) for k, v in dict(probe()).items() if k in _ENV_FIELDS}


def _records_in(path, data) -> list[TuningRecord]:
    """The records of a file's JSON content ``data``: a cache file, a list of records or one
    record. Raises :class:`ArgumentError` naming ``path`` for anything else, saying so for the
    previous format."""
    p = os.fspath(path)
    if isinstance(data, Mapping) and _OLD_FORMAT in data:
        n = len(data["entries"]) if isinstance(data.get("entries"), Mapping) else 0
        raise ArgumentError(
            f"{p} is a tuning cache of rawconv's old format ({_OLD_FORMAT!r}: {n} entries keyed by "
            "'|'-joined strings), which this rawconv does not read: those keys hold neither the problem's "
            "fields nor the GPU's compute capability, so they cannot be converted faithfully. Move the file "
            f"aside or delete it; autotune writes the new format ({CACHE_FORMAT!r}, version {CACHE_VERSION}).")
    if isinstance(data, Mapping) and "schema" in data:
        items = [data]
    elif isinstance(data, Mapping) and data.get("format") == CACHE_FORMAT:
        if data.get("version") != CACHE_VERSION:
            raise ArgumentError(f"{p} is a tuning cache of version {data.get('version')!r}; this rawconv "
                                f"reads version {CACHE_VERSION}")
        items = data.get("records")
        if not isinstance(items, list):
            raise ArgumentError(f"{p}: 'records' must be a list")
    elif isinstance(data, list):
        items = data
    else:
        raise ArgumentError(f"{p} is not a rawconv tuning file (expected {{'format': {CACHE_FORMAT!r}, ...}}, "
                            "a tuning record or a list of them)")
    out = []
    for i, d in enumerate(items):
        try:
            out.append(TuningRecord.from_dict(d))
        except (ArgumentError, ArgumentTypeError) as exc:
            raise ArgumentError(f"{p}: record {i}: {exc}") from None
    return out


def _describe(key: TuningKey) -> str:
    try:
        return key.conv_problem().describe()
    except Exception:  # noqa: BLE001 - a key of fields ConvProblem does not take: show them
        return repr(key.problem)


# ---------------------------------------------------------------------------- replay
def _replay_options(key: TuningKey) -> dict:
    """The :class:`rawconv.Options` fields (as a dict) a key's backend options imply."""
    o = json_form(key.options)
    out = {}
    if key.backend == "onednn":
        out["precision"] = o.get("fpmath") or "strict"
    elif key.backend == "cudnn_graph":
        out["precision"] = "tf32" if o.get("allow_tf32") else "strict"
    if o.get("deterministic") or o.get("deterministic_only"):
        out["deterministic"] = True
    if o.get("workspace_limit") is not None:
        out["workspace_limit"] = o["workspace_limit"]
    if o.get("allow_known_bad"):
        out["allow_known_bad"] = True
    return out


def replay(record, strict: bool = False):
    """A plan of ``record``'s backend for its problem and direction with exactly its choice
    selected (through the backend registry's ``plan(problem, direction, options, choice)``;
    the options in force when it was tuned: precision, determinism, workspace limit, and on
    oneDNN the OpenMP thread count the plan ran on, the key's ``threads``, as the plan's
    ``threads=``).

    ``record``: a :class:`TuningRecord` or the path of a file holding exactly one. First checks
    the environment (:meth:`TuningRecord.check_environment`): when the library version or the
    device differs, warns (``RuntimeWarning``) saying what differs, or with ``strict`` raises
    :class:`TuningEnvironmentError` before building anything. The plan is built for the
    problem's device type (``"cpu"``; ``"cuda"``: the current GPU); run it with its
    ``execute``. Raises :class:`~rawconv.errors.NotSupportedError` when the library no longer
    offers that choice for the problem (naming what it offers), and what the backend raises."""
    if isinstance(record, (str, os.PathLike)):
        loaded = TuningRecord.load(record)
        if isinstance(loaded, list):
            if len(loaded) != 1:
                raise ArgumentError(f"{os.fspath(record)} holds {len(loaded)} records; replay takes one "
                                    "(TuningRecord.load(path) gives them all)")
            loaded = loaded[0]
        record = loaded
    if not isinstance(record, TuningRecord):
        raise ArgumentTypeError(f"replay takes a TuningRecord or a path, got {type(record).__name__}")
    with warnings.catch_warnings():
        warnings.simplefilter("always", RuntimeWarning)
        with warnings.catch_warnings(record=True) as caught:
            record.check_environment(strict=strict)
    for w in caught:   # re-raised at the caller, not inside rawconv
        warnings.warn(w.message, w.category, stacklevel=3)
    from .backend import get

    key = record.key
    problem = key.conv_problem()
    log.debug("replay %s %s %s: %s", key.backend, key.direction, _describe(key), record.choice)
    be = get(key.backend)
    if be.replay is not None:   # the backend reads what else its key holds (threads, post-ops, activation)
        return be.replay(key, problem, record.choice, _replay_options(key))
    return be.plan(problem, key.direction, _replay_options(key), record.choice)


# every public entry point raises only rawconv's exception classes (rawconv._guard)
from . import guard as _guard  # noqa: E402

TuningKey.__module__ = TuningRecord.__module__ = TuningEnvironmentError.__module__ = FACE
_guard.guard_module(globals(), "current_environment", "TuningKey.from_dict", "TuningKey.conv_problem",
                    "TuningRecord.from_dict", "TuningRecord.from_json", "TuningRecord.save", "TuningRecord.save_all",
                    "TuningRecord.load", "TuningRecord.check_environment", "replay", where=FACE)
