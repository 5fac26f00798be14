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


def finite(v) -> bool:
    """Whether ``v`` is a finite int or float (not a bool, None or NaN)."""
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
        if p is None or not finite(self.median_ms) or self.median_ms <= 0 or not hasattr(p, "flops"):
            return float("nan")
        return p.flops / (self.median_ms * 1e6)

    @gflops.setter
    def gflops(self, value) -> None:
        self.extra["gflops"] = value

    @property
    def spread(self) -> float:
        """median / min of the timed calls (1.0: steady; well above: noise; NaN with fewer than two runs)."""
        if self.runs <= 1 or not (finite(self.median_ms) and finite(self.min_ms)) or self.min_ms <= 0:
            return float("nan")
        return self.median_ms / self.min_ms

    @property
    def oversubscribed(self) -> bool:
        """The machine was oversubscribed while this row was timed (other processes' CPUs plus our
        threads exceeded ours, or our threads waited for a CPU: ``extra["machine"]``, the
        :class:`~rawconv.bench.LoadReport` of its timing, as ``compare`` and ``replay`` record it)."""
        m = self.extra.get("machine") if isinstance(self.extra, dict) else None
        return bool(isinstance(m, dict) and m.get("oversubscribed"))

    @property
    def unstable(self) -> bool:
        """Its time is not to be trusted: median / min above :data:`rawconv.bench.SPREAD_LIMIT`,
        or the machine was :attr:`oversubscribed` while it was timed (threads descheduled for
        whole scheduler ticks give steady medians many times the quiet time, with median / min
        near 1). :attr:`timing_flags` says which."""
        return bool(self.timing_flags)

    @property
    def timing_flags(self) -> list[str]:
        """Why this row's time is not to be trusted (empty when nothing is known against it). A row
        timed in interleaved rounds (``extra["rounds"]``, :func:`rawconv.bench.time_rounds`) is
        flagged by what its rounds measured: ``"waited for a CPU: ..."`` (most rounds had no call
        during which our threads did not wait for a CPU), ``"rounds disagree: ..."``, and the same
        for its confirmation rounds (``"fresh rounds: ..."``); another row by the machine and its
        spread: ``"machine oversubscribed while timed"``, ``"median/min 2.9"``."""
        from .bench import SPREAD_LIMIT

        rounds = self.extra.get("rounds") if isinstance(self.extra, dict) else None
        if isinstance(rounds, dict):   # timed in interleaved rounds: flagged by what they measured
            out = [str(f) for f in rounds.get("flags") or []]
            conf = self.extra.get("confirmed")
            if isinstance(conf, dict):
                out += [f"fresh rounds: {f}" for f in conf.get("flags") or []]
            return out
        out = []
        if self.oversubscribed:
            out.append("machine oversubscribed while timed")
        if finite(self.spread) and self.spread > SPREAD_LIMIT:
            out.append(f"median/min {self.spread:.1f}")
        return out

    @property
    def library(self) -> str:
        """The library and version that ran this row (``"oneDNN 3.2.0"``; torch's rows: ``"torch
        2.14.1, its oneDNN 3.12.0"``), where the row says (``extra["library"]``), else ''."""
        v = self.extra.get("library") if isinstance(self.extra, dict) else None
        return v if isinstance(v, str) else ""

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

    @property
    def choice(self) -> str:
        """The candidate's stable name (what ``choice=`` and ``select()`` take: the listing row's
        ``choice``, or ``extra["choice"]`` on ``compare`` rows), else :attr:`name`."""
        c = getattr(self.candidate, "choice", None)
        if isinstance(c, str) and c:
            return c
        c = self.extra.get("choice") if isinstance(self.extra, dict) else None
        return c if isinstance(c, str) and c else self.name

    @property
    def torch_default(self) -> bool:
        """torch's own choice (its default path): the reference row of a comparison."""
        return self.backend == "torch" and self.name == "default"

    def as_dict(self) -> dict:
        """JSON-friendly fields (the problem as its description and benchdnn string; NaN as None)."""
        p = self.problem
        acc = self.accuracy
        out = {"problem": self.problem_name, "backend": self.backend, "name": self.name,
               "direction": self.direction, "status": self.status, "group": self.group,
               "median_ms": self.median_ms, "min_ms": self.min_ms, "runs": self.runs, "spread": self.spread,
               "unstable": self.unstable, "oversubscribed": self.oversubscribed,
               "timing_flags": "; ".join(self.timing_flags), "library": self.library, "gflops": self.gflops, "max_abs": self.max_abs, "max_rel": self.max_rel,
               "err_ratio": acc.ratio if acc is not None else None,
               "workspace_bytes": self.workspace_bytes, "detail": self.detail, "message": self.message,
               "phase": self.phase, "seconds": self.seconds, "reference": self.reference, "choice": self.choice}
        if p is not None and not isinstance(p, str):
            out["describe"] = p.describe()
            out["benchdnn"] = p.to_benchdnn(strict=False)
        if self.candidate is not None and hasattr(self.candidate, "summary"):
            out["candidate"] = self.candidate.summary()
        out["extra"] = {k: v for k, v in self.extra.items() if k not in ("gflops", "max_abs", "max_rel")}
        return json_safe(out)

    def __str__(self) -> str:
        t = f"{self.median_ms:.4f} ms" if finite(self.median_ms) else "-"
        mn = f" (min {self.min_ms:.4f})" if finite(self.min_ms) else ""
        err = f" rel err {self.max_rel:.1e}" if finite(self.max_rel) else ""
        why = f": {self.message}" if self.message and self.group not in ("ok", "wrong") else ""
        ref = " [torch's own choice]" if self.reference else ""
        return f"{self.backend:<11} {self.name:<34} {self.status:<14} {t:>12}{mn}{err}{ref}{why}"

    def __repr__(self) -> str:
        return f"<Result {' '.join(str(self).split())}>"

    def _repr_html_(self) -> str:
        return ResultTable([self])._repr_html_()


def json_safe(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: json_safe(i) for k, i in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(i) for i in v]
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


def machine_report(rows):
    """What the machine did while ``rows`` were timed: their :class:`~rawconv.bench.LoadReport` s
    (``extra["machine"]``) merged, each weighted by its seconds. When the average looks fine but
    more than a tenth of the timing was oversubscribed, the merge of those rows alone (so a busy
    minute inside a long run is not averaged away). None when no row has a report."""
    from .bench import LoadReport

    ms = [r.extra["machine"] for r in map(as_result, rows)
          if isinstance(r.extra, dict) and isinstance(r.extra.get("machine"), dict)]
    if not ms:
        return None

    def merged(part):
        secs = sum(m["seconds"] for m in part)

        def avg(key):
            vals = [(m[key], m["seconds"]) for m in part if m.get(key) is not None]
            return sum(v * t for v, t in vals) / (sum(t for _, t in vals) or 1e-9) if vals else None

        return LoadReport(secs, max(m["cpus"] for m in part), max(m["threads"] for m in part), avg("other_cpus"),
                          avg("waited"), part[-1].get("loadavg"))

    report = merged(ms)
    over = [m for m in ms if m.get("oversubscribed")]
    if not report.oversubscribed and sum(m["seconds"] for m in over) > 0.1 * report.seconds:
        report = merged(over)
    return report


def reliability(rows, hint: str | None = None) -> dict:
    """Whether the timings of ``rows`` (one run) can be trusted, for every output to carry:
    ``{"trustworthy": bool or None, "warnings": [lines], "machine": LoadReport.as_dict() or None,
    "unreliable_rows": n, "timed_rows": n}``. Rows timed in interleaved rounds
    (``extra["rounds"]``; a row timed by one slow call aside) are judged by what their rounds
    measured (:func:`rawconv.bench.flag_warnings` of their :attr:`Result.timing_flags`: they
    waited for a CPU in most rounds, their rounds disagree); other rows are not trustworthy when
    the machine was oversubscribed while they were timed (:func:`machine_report`) or some
    median/min spreads are wide (:func:`rawconv.bench.timing_warnings`, whose ``hint`` ends the
    first line). None when no row was timed (a listing)."""
    from .bench import flag_warnings, timing_warnings

    rows = [as_result(r) for r in rows]
    timed = [r for r in rows if r.ran and finite(r.median_ms)]
    report = machine_report(rows)
    def in_rounds(r):
        return isinstance(r.extra, dict) and isinstance(r.extra.get("rounds"), dict)

    # interleaved rounds keep the calls during which our threads did not wait for a CPU: a busy
    # machine alone says nothing against those rows, what each one's rounds measured does; the
    # other rows (GPU, isolated, listings) by the machine and their spread, as before
    warn = flag_warnings(r.timing_flags for r in timed if in_rounds(r))
    others = [r for r in rows if not in_rounds(r)]
    if others:
        warn += timing_warnings(machine_report(others), [r.spread for r in others if r.ran], hint=hint)
    return {"trustworthy": (not warn) if timed else None, "warnings": warn,
            "machine": report.as_dict() if report is not None else None,
            "unreliable_rows": sum(r.unstable for r in timed), "timed_rows": len(timed)}


def by_problem(rows) -> list[tuple[str, list[Result]]]:
    """The rows (as Results) grouped by problem name, in order of first appearance."""
    groups: dict[str, list[Result]] = {}
    for r in map(as_result, rows):
        groups.setdefault(r.problem_name, []).append(r)
    return list(groups.items())


def unreliable_banner(rel: dict) -> str:
    """One line for a run whose timings are not to be trusted ('' when they are, or unknown)."""
    if rel.get("trustworthy") is not False:
        return ""
    return "UNRELIABLE timings: " + "; ".join(rel["warnings"])


class ResultTable(list):
    """A list of rows with a readable ``repr`` and exports: :class:`Result` rows (autotune, compare)
    or a listing's candidates (oneDNN ``Implementation``, cuDNN ``Algorithm``, ``EngineConfig``:
    shown as ``"listed"`` results, see :func:`as_result`).

    ``title``: what the table is (a problem, a model layer...). Rows keep their order (autotune:
    fastest correct first). ``best()``: the fastest ``ok`` rawconv row; ``to_dicts()``,
    ``to_json(path=None)``, ``to_csv(path=None)``, ``to_pandas()``; ``plot()`` (matplotlib);
    a notebook shows it as an HTML table (``_repr_html_``). Autotune tables carry ``record``:
    the :class:`rawconv.tuning.TuningRecord` of their choice."""

    record = None   # autotune tables: the rawconv.tuning.TuningRecord of the choice it selected

    def __init__(self, rows: Iterable[Result] = (), title: str = ""):
        super().__init__(rows)
        self.title = title

    # ------------------------------------------------------------------ queries
    def best(self) -> Result | None:
        """The fastest row with status ``ok`` that is not a torch reference row (None if none)."""
        ok = [r for r in map(as_result, self) if r.ok and not r.reference and finite(r.median_ms)]
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

    def reliability(self, hint: str | None = None) -> dict:
        """Whether this table's timings can be trusted (:func:`reliability`: ``trustworthy``,
        ``warnings``, ``machine``...). The JSON and CSV exports, the HTML view and the plots
        carry it."""
        return reliability(self, hint)

    def to_json(self, path: str | None = None, **meta) -> str:
        """The rows (and ``meta``) as JSON text, with ``timing``: :meth:`reliability` (whether the
        run's timings can be trusted, and why not); written to ``path`` when given."""
        text = json.dumps(json_safe({"title": self.title, **meta, "timing": self.reliability(),
                                      "rows": self.to_dicts()}), indent=1, default=str)
        if path is not None:
            with open(path, "w") as f:
                f.write(text)
        return text

    def to_csv(self, path: str | None = None) -> str:
        """The rows as CSV text (one column per field of :meth:`Result.as_dict`: per row
        ``unstable`` / ``oversubscribed`` / ``timing_flags``, ``library``), plus, when rows were
        timed, the run's reliability on every row (``run_timings_trustworthy``,
        ``run_timing_warnings``: :meth:`reliability`); written to ``path``."""
        rows = self.to_dicts()
        rel = self.reliability()
        if rel["trustworthy"] is not None:
            for d in rows:
                d["run_timings_trustworthy"] = rel["trustworthy"]
                d["run_timing_warnings"] = " | ".join(rel["warnings"])
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
        df = pd.DataFrame([{k: v for k, v in d.items() if not isinstance(v, (dict, list))}
                           for d in self.to_dicts()])
        df.attrs["timing"] = self.reliability()   # the run's reliability travels with the frame
        return df


    def __getitem__(self, i):
        out = list.__getitem__(self, i)
        return ResultTable(out, self.title) if isinstance(i, slice) else out

    # ------------------------------------------------------------------ display
    def _text(self) -> str:
        groups = by_problem(self)
        multi = len(groups) > 1
        cols = (["problem"] if multi else []) + ["backend", "name", "status", "median ms", "min ms", "rel err",
                                                 "ws B", "notes"]
        rows = [r for _, rs in groups for r in rs]
        cells = [[_cell(r, c) for c in cols] for r in rows]
        # columns no row fills are left out (a listing has no times), except the first three
        keep = [i for i, c in enumerate(cols)
                if c in ("problem", "backend", "name", "status") or any(row[i] not in ("", "-") for row in cells)]
        cols = [cols[i] for i in keep]
        cells = [[row[i] for i in keep] for row in cells]
        widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
        left = {"problem", "backend", "name", "status", "notes"}
        fmt = "  ".join(("{:<%d}" if c in left else "{:>%d}") % w for c, w in zip(cols, widths))
        lines = [self.title] if self.title else []
        lines.append(fmt.format(*cols).rstrip())
        lines += [fmt.format(*row).rstrip() for row in cells]
        if any(r.reference for r in rows):
            lines.append("(* torch's own choice, for reference)")
        if any(r.ran and r.timing_flags for r in rows):
            lines.append("(! time not to be trusted: it waited for a CPU, its rounds disagree, the machine was "
                         "oversubscribed while it was timed, or median/min wide)")
        banner = unreliable_banner(self.reliability())
        if banner:
            lines.append(banner)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self._text()

    def __str__(self) -> str:
        return self._text()

    def _repr_html_(self) -> str:
        """An HTML table (what Jupyter shows): per problem, the fastest correct rawconv row on a
        green ground, rows outside tolerance on a red one, rows that did not run greyed, torch's
        own choice marked as the reference. Colors are translucent over the theme's background
        and text keeps the theme's color, so light and dark themes both read. Drawn by
        :func:`rawconv.explore.render.html_table`."""
        return _renderer().html_table(self)

    # ------------------------------------------------------------------ plots
    def plot(self, ax=None, *, kind: str = "auto", reference_ms: float | None = None, log: bool | None = None,
             title: str | None = None, figsize=None):
        """Plot the rows with matplotlib and return the ``Figure``.

        ``kind``: ``"bars"``: per problem, horizontal bars of each candidate's median time (ms;
        the fastest correct one green, the others blue, torch's own paths grey, rows outside
        tolerance red and hatched), its min time as a tick, torch's default time (or
        ``reference_ms``) as a dashed line, rows that did not run listed at the bottom with
        their status; one panel per problem. ``"heatmap"``: problems x candidates, each cell the
        candidate's median time relative to torch default on that problem (relative to the
        fastest correct row when torch did not run), wrong cells crossed, cells that did not run
        grey, blank where the candidate is not offered. ``"auto"``: bars up to 6 problems,
        heatmap beyond. ``log``: log time axis (default: when times span more than a decade).
        ``ax``: draw into this matplotlib Axes (one problem's bars only). A figure made here is
        closed in pyplot before it is returned, so a notebook shows it once (as the cell's
        value); save it with ``fig.savefig(path)``. Raises :class:`~rawconv.errors.ArgumentError`
        for an unknown ``kind``, an empty table, or ``ax`` with several panels. Drawn by
        :func:`rawconv.explore.render.plot`."""
        return _renderer().plot(self, ax, kind=kind, reference_ms=reference_ms, log=log, title=title,
                                figsize=figsize)


# ---------------------------------------------------------------------------- cells and formats
def fmt_ms(v) -> str:
    """4 significant digits, no exponent: 0.09440, 23.97, 1234."""
    if not finite(v):
        return "-"
    if v <= 0:
        return f"{v:.4f}"
    decimals = min(max(3 - math.floor(math.log10(v)), 0), 6)
    return f"{v:.{decimals}f}"


def fmt_bytes(n) -> str:
    if n is None:
        return "-"
    if n < 1024:
        return f"{n} B"
    if n < 1024 ** 2:
        return f"{n / 1024:.0f} KiB"
    return f"{n / 1024 ** 2:.1f} MiB"


def _notes(r: Result) -> str:
    if r.group in ("ok", "wrong"):
        return ""
    if r.group == "listed":
        return r.detail
    return r.message or r.detail


def _cell(r, col: str) -> str:
    r = as_result(r)
    if col == "problem":
        return r.problem_name
    if col == "backend":
        return r.backend
    if col == "name":
        return r.name + (" *" if r.reference else "")
    if col == "status":
        return r.status
    if col == "median ms":
        return (f"{r.median_ms:.4f}" + (" !" if r.ran and r.timing_flags else "")) if finite(r.median_ms) else "-"
    if col == "min ms":
        return f"{r.min_ms:.4f}" if finite(r.min_ms) else "-"
    if col == "rel err":
        return f"{r.max_rel:.1e}" if finite(r.max_rel) else "-"
    if col == "ws B":
        return str(r.workspace_bytes) if r.workspace_bytes is not None else "-"
    if col == "notes":
        text = " ".join(_notes(r).split())
        return text if len(text) <= 70 else text[:67] + "..."
    return ""

# ---------------------------------------------------------------------------- the display slot
# The HTML view and the plots are drawn by rawconv.explore.render, a layer above core, which core
# does not import: the package root (rawconv/__init__.py) sets what loads it, and a table asks for it
# when it is first shown (as rawconv.core.grad's slot does for the operator layer).
_render_loader: list = [None]


def set_render_loader(load) -> None:
    """(package root) ``load()`` imports and returns the module that draws tables
    (:mod:`rawconv.explore.render`: ``html_table(table)``, ``plot(table, ax, **how)``)."""
    _render_loader[0] = load


def _renderer():
    if _render_loader[0] is None:
        from .errors import InternalError

        raise InternalError("no renderer for rawconv's tables (the package root sets rawconv.core.results' "
                            "render loader to rawconv.explore.render)")
    return _render_loader[0]()


# the exports that write files raise only rawconv's exception classes (rawconv._guard): an OSError
# (a directory, a missing folder, a full disk) as FileAccessError, still an OSError
from . import guard as _guard  # noqa: E402

_guard.guard_module(globals(), "ResultTable.to_json", "ResultTable.to_csv")
