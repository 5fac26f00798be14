"""One result type for every listing and measurement: :class:`Result` rows in a :class:`ResultTable`.

``candidates()`` / ``implementations()`` / ``algorithms()`` / ``engines()`` list candidates;
``autotune()`` and ``compare`` measure them. All of them can be looked at the same way::

    table = plan.autotune()
    table                    # a readable text table in a terminal or notebook (repr)
    table.to_pandas()        # a DataFrame (pandas optional)
    table.to_json("t.json"); table.to_csv("t.csv")
    table.best()             # the fastest correct row

A :class:`Result` is a candidate (or one of torch's own paths, ``backend="torch"``) on one problem
and direction, with a ``status`` (see :data:`STATUSES`), its times (ms: median and min of the timed
calls), its error against float64 (:class:`~rawconv.check.ErrorStats`), its workspace / scratchpad
bytes and notes.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from .check import ErrorStats

__all__ = ["Result", "ResultTable", "STATUSES", "status_group", "as_result"]

# status -> group. Statuses that carry detail start with the group word ("crashed: SIGSEGV",
# "timed out after 60 s").
STATUSES = {
    "ok": "ok",                    # ran, within tolerance of float64
    "wrong": "wrong",              # ran, outside tolerance (or non-finite output)
    "mismatch": "wrong",           # the graph API's older word for "wrong"
    "failed": "failed",            # the library returned an error while running it
    "error": "failed",
    "crashed": "failed",           # crashed the (child) process: "crashed: SIGABRT"
    "timed out": "failed",         # "timed out after 60 s" (child process)
    "not supported": "not supported",   # the library says it does not offer it here
    "skipped": "skipped",          # not run (a slow reference implementation, ...)
    "filtered": "skipped",         # outside the request (notes, workspace limit)
    "over budget": "skipped",      # autotune's budget ended first
    "known bad": "skipped",        # in rawconv.known_bad for this problem
    "listed": "listed",            # listed, not run
}


def status_group(status: str) -> str:
    """The group of a status: ``"ok"``, ``"wrong"``, ``"failed"``, ``"not supported"``,
    ``"skipped"`` or ``"listed"`` (``"crashed: SIGSEGV"`` is ``"failed"``)."""
    if status in STATUSES:
        return STATUSES[status]
    for word, group in STATUSES.items():
        if status.startswith(word):
            return group
    return "failed"


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(repr=False)
class Result:
    """One row: what ran (or was listed), how long it took, how close it came to float64.

    ``backend``: ``"onednn"``, ``"cudnn"``, ``"cudnn_graph"`` or ``"torch"``; ``name``: the
    candidate's stable name (what ``choice=`` takes) or torch's label (``"default"``,
    ``"cudnn.benchmark=True"``); ``problem``: the :class:`~rawconv.problem.ConvProblem` (or its
    name); ``direction``; ``candidate``: the backend's row (``Implementation``, ``Algorithm``,
    ``EngineConfig``) or None; ``status`` (:data:`STATUSES`); ``median_ms`` / ``min_ms``: times
    of ``runs`` timed calls in milliseconds (None or NaN when it did not run); ``accuracy``: the
    :class:`~rawconv.check.ErrorStats` against float64 (``error`` is its old name on autotune
    rows); ``workspace_bytes``; ``detail``: what ran (layouts, math type, notes); ``message``: why
    it failed or was skipped; ``phase`` and ``seconds``: how autotune found it and the wall time it
    spent on it; ``reference``: torch's own choice (a reference row, not a rawconv candidate);
    ``extra``: the backend's own fields.

    The per-backend row types of earlier versions (``onednn.TimedImplementation``,
    ``cudnn.TimedAlgorithm``, ``cudnn_graph.TimedConfig``, ``compare.Row``) are this class with
    their old constructors and attribute names.
    """

    backend: str
    name: str
    problem: Any = None
    direction: str = "forward"
    candidate: Any = None
    status: str = "listed"
    median_ms: float | None = None
    min_ms: float | None = None
    runs: int = 0
    accuracy: ErrorStats | None = None
    workspace_bytes: int | None = None
    detail: str = ""
    message: str = ""
    phase: str = ""
    seconds: float = 0.0
    reference: bool = False
    extra: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ derived
    @property
    def error(self) -> ErrorStats | None:
        """:attr:`accuracy` (autotune rows' name for it)."""
        return self.accuracy

    @error.setter
    def error(self, value) -> None:
        self.accuracy = value

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @ok.setter
    def ok(self, value) -> None:
        if value is not None:
            self.status = "ok" if value else "wrong"

    @property
    def group(self) -> str:
        """:func:`status_group` of :attr:`status`."""
        return status_group(self.status)

    category = group

    @property
    def ran(self) -> bool:
        """It ran and was checked (status group "ok" or "wrong")."""
        return self.group in ("ok", "wrong")

    def _stat(self, name: str):
        if name in self.extra:
            return self.extra[name]
        return getattr(self.accuracy, name) if self.accuracy is not None else float("nan")

    @property
    def max_abs(self) -> float:
        """max |y - ref| (NaN when it was not checked)."""
        return self._stat("max_abs")

    @max_abs.setter
    def max_abs(self, value) -> None:
        self.extra["max_abs"] = value

    @property
    def max_rel(self) -> float:
        """max |y - ref| / max |ref| (NaN when it was not checked)."""
        return self._stat("max_rel")

    @max_rel.setter
    def max_rel(self, value) -> None:
        self.extra["max_rel"] = value

    @property
    def gflops(self) -> float:
        """The problem's flops / median time, in GFLOP/s (NaN when unknown)."""
        if "gflops" in self.extra:
            return self.extra["gflops"]
        p = self.problem
        if p is None or not _finite(self.median_ms) or self.median_ms <= 0 or not hasattr(p, "flops"):
            return float("nan")
        return p.flops / (self.median_ms * 1e6)

    @gflops.setter
    def gflops(self, value) -> None:
        self.extra["gflops"] = value

    @property
    def spread(self) -> float:
        """median / min of the timed calls (1.0: steady; well above: noise; NaN with fewer than two runs)."""
        if self.runs <= 1 or not (_finite(self.median_ms) and _finite(self.min_ms)) or self.min_ms <= 0:
            return float("nan")
        return self.median_ms / self.min_ms

    @property
    def unstable(self) -> bool:
        """median / min above :data:`rawconv.bench.SPREAD_LIMIT`."""
        from .bench import SPREAD_LIMIT

        return _finite(self.spread) and self.spread > SPREAD_LIMIT

    @property
    def problem_name(self) -> str:
        p = self.problem
        if p is None:
            return ""
        if isinstance(p, str):
            return p
        return p.name or p.describe()

    # old names of the per-backend row types
    @property
    def impl(self):
        return self.candidate

    algorithm = config = impl

    @property
    def implementation(self) -> str:
        """:attr:`name` (``compare`` rows' name for it)."""
        return self.name

    @implementation.setter
    def implementation(self, value: str) -> None:
        self.name = value

    def as_dict(self) -> dict:
        """JSON-friendly fields (the problem as its description and benchdnn string; NaN as None)."""
        p = self.problem
        acc = self.accuracy
        out = {"problem": self.problem_name, "backend": self.backend, "name": self.name,
               "direction": self.direction, "status": self.status, "group": self.group,
               "median_ms": self.median_ms, "min_ms": self.min_ms, "runs": self.runs, "spread": self.spread,
               "unstable": self.unstable, "gflops": self.gflops, "max_abs": self.max_abs, "max_rel": self.max_rel,
               "err_ratio": acc.ratio if acc is not None else None,
               "workspace_bytes": self.workspace_bytes, "detail": self.detail, "message": self.message,
               "phase": self.phase, "seconds": self.seconds, "reference": self.reference}
        if p is not None and not isinstance(p, str):
            out["describe"] = p.describe()
            out["benchdnn"] = p.to_benchdnn()
        if self.candidate is not None and hasattr(self.candidate, "summary"):
            out["candidate"] = self.candidate.summary()
        out["extra"] = {k: v for k, v in self.extra.items() if k not in ("gflops", "max_abs", "max_rel")}
        return _json_safe(out)

    def __str__(self) -> str:
        t = f"{self.median_ms:.4f} ms" if _finite(self.median_ms) else "-"
        mn = f" (min {self.min_ms:.4f})" if _finite(self.min_ms) else ""
        err = f" rel err {self.max_rel:.1e}" if _finite(self.max_rel) else ""
        why = f": {self.message}" if self.message and self.group not in ("ok", "wrong") else ""
        ref = " [torch's own choice]" if self.reference else ""
        return f"{self.backend:<11} {self.name:<34} {self.status:<14} {t:>12}{mn}{err}{ref}{why}"

    def __repr__(self) -> str:
        return f"<Result {self}>"


def _json_safe(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _json_safe(i) for k, i in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(i) for i in v]
    return v


def as_result(row) -> "Result":
    """A listing's candidate as a ``"listed"`` :class:`Result` (a Result stays as it is)."""
    if isinstance(row, Result):
        return row
    status = getattr(row, "status", "") or "listed"
    if getattr(row, "known_bad", ""):
        status = "known bad" if status in ("listed", "") else status
    if getattr(row, "finalizes", None) is False:
        status = "not supported"
    if hasattr(row, "ok") and isinstance(getattr(type(row), "ok", None), property) and not row.ok:
        status = "not supported"
    return Result(getattr(row, "backend", ""), getattr(row, "choice", str(row)), None,
                  getattr(row, "direction", "forward"), row, status,
                  getattr(row, "time_ms", None), None, 0, None, getattr(row, "workspace_bytes", None),
                  " ".join(getattr(row, "notes", ())), getattr(row, "detail", "") or getattr(row, "error", "") or "")


_COLUMNS = (("backend", 11), ("name", 34), ("status", 14), ("median ms", 10), ("min ms", 10),
            ("rel err", 8), ("ws B", 10))


def _cell(r, col: str) -> str:
    r = as_result(r)
    if col == "backend":
        return r.backend
    if col == "name":
        return r.name + (" *" if r.reference else "")
    if col == "status":
        return r.status
    if col == "median ms":
        return f"{r.median_ms:.4f}" if _finite(r.median_ms) else "-"
    if col == "min ms":
        return f"{r.min_ms:.4f}" if _finite(r.min_ms) else "-"
    if col == "rel err":
        return f"{r.max_rel:.1e}" if _finite(r.max_rel) else "-"
    if col == "ws B":
        return str(r.workspace_bytes) if r.workspace_bytes is not None else "-"
    return ""


class ResultTable(list):
    """A list of rows with a readable ``repr`` and exports: :class:`Result` rows (autotune, compare)
    or a listing's candidates (oneDNN ``Implementation``, cuDNN ``Algorithm``, ``EngineConfig``:
    shown as ``"listed"`` results, see :func:`as_result`).

    ``title``: what the table is (a problem, a model layer...). Rows keep their order (autotune:
    fastest correct first). ``best()``: the fastest ``ok`` rawconv row; ``to_dicts()``,
    ``to_json(path=None)``, ``to_csv(path=None)``, ``to_pandas()``."""

    def __init__(self, rows: Iterable[Result] = (), title: str = ""):
        super().__init__(rows)
        self.title = title

    # ------------------------------------------------------------------ queries
    def best(self) -> Result | None:
        """The fastest row with status ``ok`` that is not a torch reference row (None if none)."""
        ok = [r for r in map(as_result, self) if r.ok and not r.reference and _finite(r.median_ms)]
        return min(ok, key=lambda r: r.median_ms) if ok else None

    def where(self, **fields) -> "ResultTable":
        """Rows whose attributes equal ``fields`` (e.g. ``status="ok"``, ``backend="onednn"``)."""
        return ResultTable([r for r in self if all(getattr(r, k) == v for k, v in fields.items())], self.title)

    def problems(self) -> list:
        """The distinct problems, in order."""
        out = []
        for r in self:
            if r.problem is not None and r.problem not in out:
                out.append(r.problem)
        return out

    # ------------------------------------------------------------------ exports
    def to_dicts(self) -> list[dict]:
        return [as_result(r).as_dict() for r in self]

    def to_json(self, path: str | None = None, **meta) -> str:
        """The rows (and ``meta``) as JSON text; written to ``path`` when given."""
        text = json.dumps({"title": self.title, **meta, "rows": self.to_dicts()}, indent=1, default=str)
        if path is not None:
            with open(path, "w") as f:
                f.write(text)
        return text

    def to_csv(self, path: str | None = None) -> str:
        """The rows as CSV text (one column per field of :meth:`Result.as_dict`); written to ``path``."""
        rows = self.to_dicts()
        cols: list[str] = []
        for d in rows:
            cols += [k for k in d if k not in cols and not isinstance(d[k], (dict, list))]
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for d in rows:
            w.writerow(d)
        text = buf.getvalue()
        if path is not None:
            with open(path, "w", newline="") as f:
                f.write(text)
        return text

    def to_pandas(self):
        """A ``pandas.DataFrame`` of the rows (pandas is optional: ImportError says so)."""
        try:
            import pandas as pd
        except ImportError as exc:  # pragma: no cover - pandas is installed in the test venv
            raise ImportError("ResultTable.to_pandas needs pandas (pip install pandas)") from exc
        return pd.DataFrame([{k: v for k, v in d.items() if not isinstance(v, (dict, list))}
                             for d in self.to_dicts()])

    # ------------------------------------------------------------------ display
    def _text(self, width: int | None = None) -> str:
        cols = list(_COLUMNS)
        lines = []
        if self.title:
            lines.append(self.title)
        cells = [[_cell(r, c) for c, _ in cols] for r in self]
        widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, (c, _) in enumerate(cols)]
        fmt = "  ".join("{:<%d}" % w if i < 3 else "{:>%d}" % w for i, w in enumerate(widths))
        lines.append(fmt.format(*[c for c, _ in cols]).rstrip())
        for row in cells:
            lines.append(fmt.format(*row).rstrip())
        if any(getattr(r, "reference", False) for r in self):
            lines.append("(* torch's own choice, for reference)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self._text()

    def __str__(self) -> str:
        return self._text()
