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
        if _finite(self.spread) and self.spread > SPREAD_LIMIT:
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
        t = f"{self.median_ms:.4f} ms" if _finite(self.median_ms) else "-"
        mn = f" (min {self.min_ms:.4f})" if _finite(self.min_ms) else ""
        err = f" rel err {self.max_rel:.1e}" if _finite(self.max_rel) else ""
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
    timed = [r for r in rows if r.ran and _finite(r.median_ms)]
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


def _unreliable_banner(rel: dict) -> str:
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
    def _groups(self) -> list[tuple[str, list[Result]]]:
        """The rows (as Results) grouped by problem, in order of first appearance."""
        groups: dict[str, list[Result]] = {}
        for r in map(as_result, self):
            groups.setdefault(r.problem_name, []).append(r)
        return list(groups.items())

    def _text(self) -> str:
        groups = self._groups()
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
        banner = _unreliable_banner(self.reliability())
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
        and text keeps the theme's color, so light and dark themes both read."""
        return _html_table(self)

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
        for an unknown ``kind``, an empty table, or ``ax`` with several panels."""
        from .errors import ArgumentError

        if kind not in ("auto", "bars", "heatmap"):
            raise ArgumentError(f"kind must be 'auto', 'bars' or 'heatmap', got {kind!r}")
        groups = self._groups()
        if not groups:
            raise ArgumentError("nothing to plot: the table has no rows")
        if kind == "auto":
            kind = "bars" if len(groups) <= 6 else "heatmap"
        if kind == "heatmap":
            return _plot_heatmap(self, groups, ax, title, figsize)
        return _plot_bars(self, groups, ax, reference_ms, log, title, figsize)


# ---------------------------------------------------------------------------- cells and formats
def fmt_ms(v) -> str:
    """4 significant digits, no exponent: 0.09440, 23.97, 1234."""
    if not _finite(v):
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
        return (f"{r.median_ms:.4f}" + (" !" if r.ran and r.timing_flags else "")) if _finite(r.median_ms) else "-"
    if col == "min ms":
        return f"{r.min_ms:.4f}" if _finite(r.min_ms) else "-"
    if col == "rel err":
        return f"{r.max_rel:.1e}" if _finite(r.max_rel) else "-"
    if col == "ws B":
        return str(r.workspace_bytes) if r.workspace_bytes is not None else "-"
    if col == "notes":
        text = " ".join(_notes(r).split())
        return text if len(text) <= 70 else text[:67] + "..."
    return ""


def _best_of(rows: list[Result]) -> Result | None:
    """The fastest correct rawconv row of one problem's rows, when there is a choice (two or more
    rows ran): what displays highlight."""
    ok = [r for r in rows if r.ok and not r.reference and _finite(r.median_ms)]
    if sum(r.ran for r in rows) < 2:
        return None
    return min(ok, key=lambda r: r.median_ms) if ok else None


# ---------------------------------------------------------------------------- HTML
# translucent grounds over the theme's own background, text in the theme's color: readable in
# Jupyter's light and dark themes alike
_GREEN_BG = "rgba(46,160,67,0.25)"
_RED_BG = "rgba(229,72,77,0.22)"
_REF_BG = "rgba(128,128,128,0.14)"
_RED_TEXT = "#e5484d"
_WARN_BG = "rgba(245,166,35,0.30)"
_RULE = "1px solid rgba(128,128,128,0.45)"

_HTML_COLS = (  # (header, getter, numeric)
    ("backend", lambda r: r.backend, False),
    ("library", lambda r: r.library, False),
    ("candidate", lambda r: r.name, False),
    ("status", lambda r: r.status, False),
    ("median ms", lambda r: fmt_ms(r.median_ms), True),
    ("min ms", lambda r: fmt_ms(r.min_ms), True),
    ("med/min", lambda r: f"{r.spread:.2f}" if _finite(r.spread) else "-", True),
    ("timing", lambda r: _timing_cell(r), False),
    ("max rel err", lambda r: f"{r.max_rel:.1e}" if _finite(r.max_rel) else "-", True),
    ("workspace", lambda r: fmt_bytes(r.workspace_bytes), True),
    ("GFLOP/s", lambda r: (f"{r.gflops:.1f}" if r.gflops >= 1 or r.gflops == 0 else f"{r.gflops:.3g}")
     if _finite(r.gflops) else "-", True),
    # replayed tuning records (rawconv.compare.replay): what was recorded, and the drift since
    ("recorded ms", lambda r: fmt_ms(r.extra.get("recorded_median_ms")), True),
    ("drift", lambda r: f"{100 * r.extra['drift']:+.1f}%" if _finite(r.extra.get("drift"))
     else "withheld" if r.extra.get("drift_withheld") else "-", True),
    ("recorded rel err", lambda r: f"{r.extra['recorded_max_rel']:.1e}" if _finite(r.extra.get("recorded_max_rel"))
     else "-", True),
    ("detail", lambda r: (r.detail if r.group in ("ok", "wrong", "listed") else (r.message or r.detail)), False),
)


def _timing_cell(r: Result) -> str:
    """A short mark for a row whose time is not to be trusted (HTML; the full reason as a tooltip)."""
    if not (r.ran and r.timing_flags):
        return ""
    from html import escape

    short = "; ".join("busy" if f.startswith("machine") else f.split(":")[0] for f in r.timing_flags)
    return f'<span title="{escape("; ".join(r.timing_flags), quote=True)}">&#9888; {escape(short)}</span>'


def _html_table(table: ResultTable) -> str:
    from html import escape

    groups = table._groups()
    rows = [r for _, rs in groups for r in rs]
    listing = all(r.group == "listed" for r in rows)
    cols = [c for c in _HTML_COLS if c[0] in ("backend", "candidate") or (not listing if c[0] == "status" else
                                                                          any(c[1](r) not in ("", "-", None)
                                                                              for r in rows))]
    td = "padding:2px 8px;text-align:{align};vertical-align:top;border:none;"
    out = ['<div class="rawconv-results" style="overflow-x:auto">',
           '<table style="border-collapse:collapse;font-size:0.9em;font-variant-numeric:tabular-nums;'
           'margin:0;width:auto">']
    banner = _unreliable_banner(table.reliability())
    if table.title or banner:
        out.append(f'<caption style="text-align:left;font-weight:bold;padding:4px 0;caption-side:top">'
                   f'{escape(table.title)}'
                   + (f'<div style="background:{_WARN_BG};font-weight:normal;padding:2px 6px;margin-top:2px">'
                      f'&#9888; {escape(banner)}</div>' if banner else "") + '</caption>')
    out.append("<thead><tr>" + "".join(
        f'<th style="{td.format(align="right" if num else "left")}border-bottom:{_RULE};font-weight:bold;'
        'white-space:nowrap">'
        f'{escape(h)}</th>' for h, _, num in cols) + "</tr></thead><tbody>")
    seen = set()
    for name, rs in groups:
        if len(groups) > 1:
            out.append(f'<tr><th colspan="{len(cols)}" style="{td.format(align="left")}border-top:{_RULE};'
                       f'font-weight:bold;padding-top:6px">{escape(name)}</th></tr>')
        best = _best_of(rs)
        for r in rs:
            html, mark = _html_row(r, best, cols, td)
            seen.update({mark} if mark else set())
            out.append(html)
    out.append("</tbody></table>")
    legend = _html_legend(groups, rows)
    if legend:
        out.append('<div style="font-size:0.8em;margin-top:3px">' + " &nbsp; ".join(legend) + "</div>")
    out.append("</div>")
    return "\n".join(out)


def _html_row(r: Result, best: Result | None, cols: list, td: str) -> tuple[str, str]:
    """One result's ``<tr>`` of :func:`_html_table`: ``r`` styled by its group (``best``: the
    fastest correct result of its problem), one cell per column of ``cols`` (``td``: the cell
    style, ``{align}`` to fill). Returns ``(html, mark)``: the row, and its mark ("fastest
    correct", "outside tolerance" or "")."""
    from html import escape

    style, mark, note = "", "", ""
    if r is best:
        style, mark = f"background:{_GREEN_BG};font-weight:bold;", "fastest correct"
    elif r.group == "wrong":
        style, mark = f"background:{_RED_BG};", "outside tolerance"
    elif r.group in ("not supported", "skipped"):
        style = "opacity:0.55;"
    elif r.group == "failed":   # did not run either, but an error: grey, its status red
        style = "opacity:0.75;"
    if r.reference:
        style += f"font-style:italic;background:{_REF_BG};" if r is not best and r.group != "wrong" \
            else "font-style:italic;"
        note = "torch's own choice" if r.torch_default else "torch"
    cells = []
    for h, get, num in cols:
        text = str(get(r)) if h == "timing" else escape(str(get(r)))
        cstyle = td.format(align="right" if num else "left")
        if h == "candidate":
            if r.reference:
                text = f'&#9670; {text} <span style="opacity:0.7;font-weight:normal">({escape(note)})</span>'
            elif r is best:
                text = f"&#9733; {text}"
        if h == "status" and r.group in ("wrong", "failed"):
            cstyle += f"color:{_RED_TEXT};font-weight:bold;"
        if h in ("timing", "median ms") and r.ran and r.timing_flags:
            cstyle += f"background:{_WARN_BG};"
        if h == "detail":
            cstyle += "max-width:42em;white-space:normal;"
        elif h == "library":
            cstyle += "min-width:7em;max-width:13em;white-space:normal;"
        else:
            cstyle += "white-space:nowrap;"
        cells.append(f'<td style="{cstyle}">{text}</td>')
    title = f' title="{escape(r.message, quote=True)}"' if r.message else ""
    return f'<tr style="{style}"{title}>' + "".join(cells) + "</tr>", mark


def _html_legend(groups: list, rows: list) -> list[str]:
    """The legend of :func:`_html_table`: one ``<span>`` per kind of marking that ``rows`` (of the
    problems ``groups``) show. Returns the spans, empty when nothing is marked."""
    legend = []
    if any(_best_of(rs) is not None for _, rs in groups):
        legend.append(f'<span style="background:{_GREEN_BG};padding:0 4px">&#9733; fastest correct</span>')
    if any(r.group == "wrong" for r in rows):
        legend.append(f'<span style="background:{_RED_BG};padding:0 4px">outside tolerance vs float64</span>')
    if any(r.group in ("not supported", "skipped", "failed") for r in rows):
        legend.append('<span style="opacity:0.55;padding:0 4px">grey: did not run (status says why)</span>')
    if any(r.reference for r in rows):
        legend.append(f'<span style="background:{_REF_BG};font-style:italic;padding:0 4px">&#9670; torch, '
                      "for reference</span>")
    if any(r.ran and r.timing_flags for r in rows):
        legend.append(f'<span style="background:{_WARN_BG};padding:0 4px">&#9888; time not to be trusted '
                      "(waited for a CPU: no clean call in most of its rounds; rounds disagree: its per-round times spread; "
                      "busy: the machine was oversubscribed while it was timed; med/min: wide spread)</span>")
    return legend


# ---------------------------------------------------------------------------- plots
_C_BEST, _C_OK, _C_WRONG, _C_TORCH, _C_REF = "#2ca02c", "#4c78a8", "#d62728", "#9a9a9a", "#ff7f0e"


def _new_figure(figsize):
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=figsize)
    plt.close(fig)   # not pyplot's: a notebook shows it once, as the value returned
    _ipython_png()
    return fig


def _ipython_png() -> None:
    """In IPython, make sure a returned ``Figure`` displays as a PNG whatever matplotlib backend is
    active (the inline backend registers this formatter; Agg, set by ``MPLBACKEND``, does not)."""
    import sys

    if "IPython" not in sys.modules:
        return
    try:
        from IPython import get_ipython
        from matplotlib.figure import Figure

        ip = get_ipython()
        if ip is None:
            return
        fmt = ip.display_formatter.formatters["image/png"]
        try:
            fmt.lookup_by_type(Figure)
        except KeyError:
            from IPython.core.pylabtools import print_figure

            fmt.for_type(Figure, lambda fig: print_figure(fig, "png", bbox_inches="tight"))
    except Exception:  # noqa: BLE001 - display is a convenience; the figure is returned either way
        return


def _label(r: Result, backends: set) -> str:
    if r.backend == "torch":
        return f"torch: {r.name}"
    return f"{r.backend}: {r.name}" if len(backends) > 1 else r.name


def _plot_bars(table, groups, ax, reference_ms, log, title, figsize):
    from .errors import ArgumentError

    if ax is not None and len(groups) > 1:
        raise ArgumentError(f"ax= draws one panel, and this table has {len(groups)} problems: pass ax=None "
                            "(one panel each) or kind='heatmap'")
    heights = [max(len(rs), 1) * 0.3 + 1.1 for _, rs in groups]
    if ax is None:
        fig = _new_figure(figsize or (10, sum(heights)))
        axes = fig.subplots(len(groups), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    else:
        fig, axes = ax.figure, [ax]
    for a, (name, rs) in zip(axes, groups):
        if len(groups) > 1 or not table.title:
            head = name
        else:   # one problem: the table's title, naming the problem when the title does not
            head = table.title if not name or name in table.title else f"{name} ({table.title})"
        _bars_panel(a, rs, head, reference_ms, log)
    banner = _unreliable_banner(table.reliability())
    head = title or (table.title if len(groups) > 1 else "")   # one panel: its title names the table already
    if head or banner:
        fig.suptitle("\n".join(t for t in (head, _wrap_banner(banner)) if t), color="#b00000" if banner else None,
                     fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    return fig


def _wrap_banner(banner: str, width: int = 110) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(banner, width)) if banner else ""


def _bars_panel(ax, rows, title, reference_ms, log):
    backends = {r.backend for r in rows if r.backend != "torch"}
    ref = next((r for r in rows if r.torch_default and r.ran and _finite(r.median_ms)), None)
    ref_ms = reference_ms if reference_ms is not None else (ref.median_ms if ref is not None else None)
    ran = sorted((r for r in rows if r.ran and _finite(r.median_ms) and not (r is ref and reference_ms is None)),
                 key=lambda r: r.median_ms)
    not_run = [r for r in rows if not (r.ran and _finite(r.median_ms))]
    best = _best_of(rows)
    times = [r.median_ms for r in ran] + ([ref_ms] if ref_ms else [])
    mins = [r.min_ms for r in ran if _finite(r.min_ms) and r.min_ms > 0]
    lo, hi = (min(times + mins), max(times)) if times else (1.0, 1.0)
    use_log = log if log is not None else (lo > 0 and hi / lo > 10)
    _bars_draw(ax, ran, not_run, best)
    _bars_yaxis(ax, ran, not_run, backends)
    if use_log:
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        ax.set_xscale("log")
        ax.set_xlim(lo / 1.6, hi * 4.0)
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    elif times:
        ax.set_xlim(0, hi * 1.3)
    if ref_ms:
        ax.axvline(ref_ms, color=_C_REF, linestyle="--", linewidth=1.5)
        if ref is not None and reference_ms is None and ref.timing_flags:
            ax.annotate("torch default (!) " + _flag_word(ref), (ref_ms, -0.5),
                        xytext=(3, -2), textcoords="offset points", va="top", ha="left", fontsize=7,
                        color=_C_REF)
    ax.set_xlabel("median time per call (ms)" + (", log scale" if use_log else ""), fontsize=8.5)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title(title, fontsize=9.5, loc="left")
    ax.grid(axis="x", alpha=0.3, which="both" if use_log else "major")
    ax.set_axisbelow(True)
    _bars_legend(ax, ran, best, ref, ref_ms, reference_ms)


def _bars_draw(ax, ran: list, not_run: list, best) -> None:
    """Draw :func:`_bars_panel`'s bars on ``ax``: one per result of ``ran`` (sorted, fastest first;
    ``best`` in green, wrong ones hatched red) with its min mark and time, then a line per result
    of ``not_run`` saying why. Returns None."""
    from matplotlib.transforms import blended_transform_factory

    ys = list(range(len(ran) + len(not_run)))
    for y, r in zip(ys, ran):
        if r.group == "wrong":
            color, hatch = _C_WRONG, "///"
        elif r.backend == "torch":
            color, hatch = _C_TORCH, None
        else:
            color, hatch = (_C_BEST if r is best else _C_OK), None
        ax.barh(y, r.median_ms, color=color, hatch=hatch, edgecolor="white" if hatch else color, height=0.7,
                linewidth=0.5)
        if _finite(r.min_ms):
            ax.plot([r.min_ms], [y], marker="|", color="black", markersize=11, markeredgewidth=1.6)
        tag = f"{fmt_ms(r.median_ms)} ms"
        if r.timing_flags:
            tag += "  (!) " + _flag_word(r)
        if r.group == "wrong":
            tag += f"  WRONG (rel err {r.max_rel:.1e})" if _finite(r.max_rel) else "  WRONG"
        ax.annotate(tag, (r.median_ms, y), xytext=(5, 0), textcoords="offset points", va="center", ha="left",
                    fontsize=7.5, color=_C_WRONG if r.group == "wrong" else "#333333")
    trans = blended_transform_factory(ax.transAxes, ax.transData)
    for y, r in zip(ys[len(ran):], not_run):
        why = _short(r.message.replace("not run: ", "")) if r.message else ""
        ax.text(0.01, y, f"not run: {r.status}" + (f" ({why})" if why and why != r.status else ""),
                transform=trans, va="center", ha="left", fontsize=7.5, color="#777777", style="italic")


def _bars_yaxis(ax, ran: list, not_run: list, backends: set) -> None:
    """Label :func:`_bars_panel`'s rows on ``ax``'s y axis (``ran``, then ``not_run``; ``backends``:
    the rawconv backends shown, named when more than one), greyed when not run, red when wrong.
    Returns None."""
    n = len(ran) + len(not_run)
    ys = list(range(n))
    labels = [_label(r, backends) + (" (torch's own)" if r.torch_default else "") for r in ran] + \
             [_label(r, backends) for r in not_run]
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=8)
    for t, r in zip(ax.get_yticklabels(), ran + not_run):
        if not (r.ran and _finite(r.median_ms)):
            t.set_color("#888888")
        elif r.group == "wrong":
            t.set_color(_C_WRONG)
    ax.set_ylim(n - 0.5, -0.5)


def _bars_legend(ax, ran: list, best, ref, ref_ms, reference_ms) -> None:
    """:func:`_bars_panel`'s legend on ``ax``: an entry per kind of bar and mark that ``ran``
    (``best``: the fastest correct; ``ref``: torch's default row, ``ref_ms`` its time or the given
    ``reference_ms``) shows. Returns None."""
    from matplotlib.patches import Patch
    from matplotlib.lines import Line2D

    handles = []
    if best is not None:
        handles.append(Patch(color=_C_BEST, label="fastest correct"))
    if any(r.group == "ok" and r is not best and r.backend != "torch" for r in ran):
        handles.append(Patch(color=_C_OK, label="correct"))
    if any(r.group == "wrong" for r in ran):
        handles.append(Patch(facecolor=_C_WRONG, hatch="///", edgecolor="white", label="outside tolerance"))
    if any(r.backend == "torch" for r in ran):
        handles.append(Patch(color=_C_TORCH, label="torch, other settings"))
    if any(_finite(r.min_ms) for r in ran):
        handles.append(Line2D([], [], marker="|", color="black", linestyle="none", markersize=9, label="min"))
    if ref_ms:
        handles.append(Line2D([], [], color=_C_REF, linestyle="--",
                              label=f"torch default {fmt_ms(ref_ms)} ms" if reference_ms is None
                              else f"reference {fmt_ms(ref_ms)} ms"))
    if any(r.timing_flags for r in ran) or (ref is not None and ref.timing_flags):
        handles.append(Line2D([], [], linestyle="none", label="(!) waited: waited for a CPU (or the machine was\n"
                                                              "oversubscribed) while timed; (!) noisy: its rounds\n"
                                                              "disagree, or median/min wide"))
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0,
                  frameon=False)


def _flag_word(r: Result) -> str:
    """One word for why a row's time is not to be trusted: ``waited`` (it waited for a CPU, or the
    machine was oversubscribed while it was timed) or ``noisy`` (rounds disagree, median/min wide)."""
    waited = r.oversubscribed or any(f.startswith(("waited", "fresh rounds: waited")) for f in r.timing_flags)
    return "waited" if waited else "noisy"


def _short(text: str, n: int = 48) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _ratio_text(v: float) -> str:
    """A heatmap cell's ratio in a few characters that never reads as zero: 2 decimals from 0.1 to
    10 (``0.95``, ``2.40``), whole numbers from 10, 2 significant digits below 0.1 (``0.031``,
    ``0.0031``, ``3.1e-05``)."""
    if v >= 10:
        return f"{v:.0f}"
    if v >= 0.1 or v == 0:
        return f"{v:.2f}"
    return f"{v:.2g}"


def _plot_heatmap(table, groups, ax, title, figsize):
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    cols, ratio, state, noisy, best_cell, any_torch = _heatmap_cells(groups)
    if ax is None:
        fig = _new_figure(figsize or (max(7.0, 0.62 * len(cols) + 3.2), max(3.2, 0.42 * len(groups) + 2.9)))
        ax = fig.subplots()
    else:
        fig = ax.figure
    lr = np.log2(ratio)
    finite = lr[np.isfinite(lr)]
    m = max(1.0, float(np.nanmax(np.abs(finite)))) if finite.size else 1.0
    import matplotlib

    cmap = matplotlib.colormaps["RdYlGn_r"].with_extremes(bad=(0.0, 0.0, 0.0, 0.0))
    im = ax.imshow(np.ma.masked_invalid(lr), cmap=cmap, norm=TwoSlopeNorm(0.0, -m, m), aspect="auto",
                   interpolation="nearest")
    _heatmap_marks(ax, ratio, state, noisy, lr, m, best_cell)
    ax.set_xticks(range(len(cols)))
    ax.set_xticklabels(cols, rotation=55, ha="right", rotation_mode="anchor", fontsize=8)
    ax.set_yticks(range(len(groups)))
    ax.set_yticklabels([g for g, _ in groups], fontsize=8)
    ax.set_xticks(np.arange(-0.5, len(cols), 1), minor=True)
    ax.set_yticks(np.arange(-0.5, len(groups), 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=0.6)
    ax.tick_params(which="minor", length=0)
    what = "torch default" if any_torch else "the fastest correct candidate"
    cb = fig.colorbar(im, ax=ax, fraction=0.035, pad=0.02)
    ticks = [t for t in range(-int(np.ceil(m)), int(np.ceil(m)) + 1) if -m <= t <= m]
    cb.set_ticks(ticks)
    cb.set_ticklabels([f"{2.0 ** t:g}x" for t in ticks])
    cb.set_label("time / torch default" if any_torch else "time / fastest", fontsize=8)
    cb.ax.tick_params(labelsize=7)
    banner = _unreliable_banner(table.reliability())
    marks = "; !/dashed red: time not to be trusted" if noisy.any() else ""
    ax.set_title(title or (table.title + "\n" if table.title else "") +
                 f"median time relative to {what} (green: faster, red: slower); boxed: fastest correct; "
                 f"n/r: did not run; blank: not offered{marks}", fontsize=8.5, loc="left")
    if banner:
        fig.suptitle(_wrap_banner(banner, 120), color="#b00000", fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    return fig


def _heatmap_key(r: Result) -> str:
    """A heatmap column's name for the result ``r``: its choice (``(prepacked)`` added for prepacked
    weights), or ``torch: NAME``. Returns the name."""
    if r.backend == "torch":
        return f"torch: {r.name}"
    return r.choice + (" (prepacked)" if isinstance(r.extra, dict) and r.extra.get("weights") == "prepacked" else "")


def _heatmap_cells(groups: list) -> tuple:
    """:func:`_plot_heatmap`'s cells: a row per problem of ``groups``, a column per candidate (torch's
    default rows are the baseline, not columns). Returns ``(cols, ratio, state, noisy, best_cell,
    any_torch)``: the column names; per cell the median time over the baseline's (torch default,
    else the fastest correct; NaN when none), the state (0 absent, 1 ok, 2 wrong, 3 did not run)
    and whether its time is not to be trusted; {row: column} of each problem's fastest correct;
    whether any problem had a torch default."""
    import numpy as np

    cols: list[str] = []
    for _, rs in groups:
        for r in rs:
            k = _heatmap_key(r)
            if not r.torch_default and k not in cols:
                cols.append(k)
    ratio = np.full((len(groups), len(cols)), np.nan)
    state = np.zeros((len(groups), len(cols)), dtype=int)   # 0 absent, 1 ok, 2 wrong, 3 did not run
    noisy = np.zeros((len(groups), len(cols)), dtype=bool)  # its time (or torch default's) not to be trusted
    best_cell = {}
    any_torch = False
    for i, (_, rs) in enumerate(groups):
        ref = next((r for r in rs if r.torch_default and r.ok and _finite(r.median_ms)), None)
        any_torch |= ref is not None
        best = _best_of(rs)
        base = ref.median_ms if ref is not None else (best.median_ms if best is not None else None)
        for r in rs:
            if r.torch_default:
                continue
            j = cols.index(_heatmap_key(r))
            if r.ran and _finite(r.median_ms):
                state[i, j] = 2 if r.group == "wrong" else 1
                noisy[i, j] = bool(r.timing_flags) or bool(ref is not None and ref.timing_flags)
                if base:
                    ratio[i, j] = r.median_ms / base
            else:
                state[i, j] = state[i, j] or 3
            if r is best:
                best_cell[i] = j
    return cols, ratio, state, noisy, best_cell, any_torch


def _heatmap_marks(ax, ratio, state, noisy, lr, m: float, best_cell: dict) -> None:
    """Mark :func:`_plot_heatmap`'s cells on ``ax``: did-not-run and wrong cells patched and
    labelled, ok cells given their ratio (``ratio``; ``lr`` its log2, ``m`` the colour scale's
    bound) when the map is small enough, untrusted times (``noisy``) outlined dashed, each
    problem's fastest correct (``best_cell``) boxed. ``state`` as :func:`_heatmap_cells`. Returns
    None."""
    import numpy as np
    from matplotlib.patches import Rectangle

    n_rows, n_cols = state.shape
    for i in range(n_rows):
        for j in range(n_cols):
            s = state[i, j]
            if s == 3:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="#d0d0d0", edgecolor="white", lw=0.5))
                ax.text(j, i, "n/r", ha="center", va="center", fontsize=7, color="#555555")
            elif s == 2:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="#f6c4c4", edgecolor="white", lw=0.5,
                                       hatch="////"))
                ax.text(j, i, "wrong", ha="center", va="center", fontsize=7, color="#a00000", weight="bold",
                        bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.8})
            elif s == 1 and np.isfinite(ratio[i, j]) and n_rows * n_cols <= 900:
                v = ratio[i, j]
                ax.text(j, i, _ratio_text(v) + ("!" if noisy[i, j] else ""), ha="center", va="center",
                        fontsize=7.5, color="white" if abs(lr[i, j]) > 0.6 * m else "black",
                        style="italic" if noisy[i, j] else "normal")
            if s in (1, 2) and noisy[i, j]:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="#b00000", lw=0.9,
                                       linestyle=(0, (2, 1.5))))
    for i, j in best_cell.items():
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", lw=1.6))


# the exports that write files raise only rawconv's exception classes (rawconv._guard): an OSError
# (a directory, a missing folder, a full disk) as FileAccessError, still an OSError
from . import guard as _guard  # noqa: E402

_guard.guard_module(globals(), "ResultTable.to_json", "ResultTable.to_csv")
