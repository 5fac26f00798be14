"""What a comparison found, in a few numbers: :func:`summary` of compare's rows (per problem, torch
default against rawconv's best like-for-like row, the geometric means, the failures), the rows it
quotes (:func:`best_rawconv`, :func:`first_choice`), the run's timing warnings and the exit code of
``rawconv compare`` (:data:`EXIT_CODES`, :func:`exit_code`)."""
from __future__ import annotations

import math

from ..core.bench import LoadReport, geomean
from .confirm import WEIGHT_SETS, ranked
from .measure import Row, best_rawconv, first_choice

FACE = "rawconv.explore.compare"   # where this module's public names live (rawconv.compare): messages, pickles


def versions_line(libs: dict, problems=()) -> str:
    """Which library and version each side runs, in a few words: ``"torch 2.14.1 (its own oneDNN
    3.12.0) vs rawconv's oneDNN 3.2.0"``."""
    cuda = any(str(getattr(p, "device", "cpu")).startswith("cuda") for p in problems)
    cpu = not problems or any(str(getattr(p, "device", "cpu")) == "cpu" for p in problems)
    sides = []
    if cpu:
        own = f" (its own oneDNN {libs['torch_onednn']})" if libs.get("torch_onednn") else ""
        sides.append(f"{libs['torch']}{own} vs rawconv's {libs.get('onednn')}")
    if cuda:
        own = f" (its cuDNN {libs['torch_cudnn']})" if libs.get("torch_cudnn") else ""
        sides.append(f"{libs['torch']}{own} vs rawconv's {libs.get('cudnn')}")
    return "; ".join(sides)


def machine_report(rows: list[Row]) -> LoadReport | None:
    """What the machine did while ``rows`` were timed (:func:`rawconv.results.machine_report`:
    their load reports merged; a busy stretch inside a long run is not averaged away)."""
    from ..core.results import machine_report as merged

    return merged(rows)


def timing_warnings(rows: list[Row], hint: str | None = None) -> list[str]:
    """Warning lines for ``rows``' timings (:func:`rawconv.results.reliability`): rows timed in
    interleaved rounds that waited for a CPU in most rounds or whose rounds disagree; for rows
    timed otherwise (GPU, isolated), the machine was oversubscribed while they were timed, or
    some median/min spreads exceed the limit (:func:`rawconv.bench.timing_warnings`, which also
    explains ``hint``)."""
    from ..core.results import reliability

    return reliability(rows, hint)["warnings"]


def _geomean_or_none(ratios) -> float | None:
    ratios = [v for v in ratios if v is not None and math.isfinite(v) and v > 0]
    return geomean(ratios) if ratios else None


def summary(rows: list[Row], *, hint: str | None = None) -> dict:
    """Per problem: torch default time, best rawconv time and their ratio; overall geometric means
    of torch default / rawconv over the problems where both have status "ok" (failed, not
    supported, skipped and wrong rows are left out; None when no problem has both):

    * ``geomean_torch_over_best``: like for like with torch's call, which reads its weights on
      every call: the fastest rawconv row that does too (``weights`` "per call" or "as given"),
      **best of N**: ``best_of`` gives N per problem (the rawconv rows that ran within
      tolerance). Where :func:`compare_problem`'s confirmation rounds ran, each problem's figure
      is the median of the ratios taken within each of those fresh rounds (the best was picked
      on other rounds: no winner's curse; ``geomean_torch_over_best_where_picked`` is what the
      rounds it was picked on said); otherwise a selection made on these timings, which
      favours rawconv by the noise alone;
    * ``geomean_torch_over_first_choice``: rawconv's oneDNN first choice, weights per call
      (:func:`first_choice`: one choice each, no selection; None without oneDNN rows);
    * ``geomean_torch_over_best_prepacked``: the fastest row with a weight snapshot reordered
      once (which torch's ``F.conv2d`` cannot do), best of N too; None when no row was prepacked.

    Each has an ``_interval``: a 90% percentile bootstrap interval over the rounds
    (:func:`rawconv.bench.geomean_interval`; None without per-round ratios). Also the rows of
    each status category, ``confirmed_problems``, ``confirm_rounds``, and whether the timings
    can be trusted (``timing_warnings`` empty; ``hint`` ends the oversubscription warning, see
    :func:`timing_warnings`)."""
    by_problem: dict[str, list[Row]] = {}
    for r in rows:
        by_problem.setdefault(r.problem, []).append(r)
    per = []
    got: dict = {"best": [], "first_choice": [], "prepacked": []}
    any_packed = any(r.extra.get("weights") == "prepacked" for r in rows)
    for name, rs in by_problem.items():
        entry, figures = _summary_problem(name, rs, any_packed)
        per.append(entry)
        for k, v in figures.items():
            got[k].append(v)
    ratios = [v for v, _, _ in got["best"]]
    first_ratios = [v for v, _, _ in got["first_choice"]]
    packed_ratios = [v for v, _, _ in got["prepacked"]]
    from ..core.bench import geomean_interval

    def interval(k, clean_only=False):
        lists = [pr for v, pr, c in got[k] if v is not None and (c or not clean_only)]
        if not lists or all(len(pr) < 2 for pr in lists):
            return None
        return list(geomean_interval(lists))

    def clean_mean(k):
        return _geomean_or_none([v for v, _, c in got[k] if c])

    # the problems whose headline rows (best, first choice, prepacked) were all measured in clean rounds
    clean_problems = sum(all(c for v, _, c in (got[k][i] for k in got) if v is not None) and
                         got["best"][i][0] is not None for i in range(len(per)))

    def label(r):
        return f"{r.problem}: {r.backend} {r.implementation}"

    checked = [r for r in rows if r.ran]
    conf = [r.extra["confirmed"]["rounds"]["rounds"] for r in rows if isinstance(r.extra.get("confirmed"), dict)]
    warn = timing_warnings(rows, hint)
    report = machine_report(rows)
    best_of = [p["best_of"] for p in per if p["ratio"] is not None]
    sets = [len(p["confirmed_set"]) for p in per if p["ratio"] is not None and p["confirmed_set"]]
    return {"problems": len(by_problem), "results": len(checked),
            "directions": sorted({r.direction for r in rows}),
            "within_tolerance": sum(r.category == "ok" for r in rows),
            "outside_tolerance": [label(r) + (f": {r.error}" if r.error else "") for r in rows if r.category == "wrong"],
            # a library that did not load is reported once, under libraries_not_loaded
            "failed": [f"{label(r)}: {r.status if r.status != 'failed' else r.error}" for r in rows
                       if r.category == "failed" and not r.extra.get("library_not_loaded")],
            "rawconv_failed": sum(r.category == "failed" and r.backend != "torch" for r in rows),
            "not_supported": [f"{label(r)}: {r.error}" for r in rows if r.category == "not supported"],
            "skipped": [f"{label(r)}: {r.error or r.status}" for r in rows if r.category == "skipped"],
            "libraries_not_loaded": sorted({f"{r.backend}: {r.error}" for r in rows
                                            if r.extra.get("library_not_loaded")}),
            # rawconv rows there, none ran (a problem whose only candidates --no-ref left out has none)
            "no_rawconv_result": [p["problem"] for p in per if p["rawconv_rows"] and not p["rawconv_ran"]],
            "comparable_problems": sum(v is not None for v in ratios),
            "geomean_torch_over_best": _geomean_or_none(ratios),
            "geomean_torch_over_best_interval": interval("best"),
            "geomean_torch_over_best_where_picked": _geomean_or_none(
                [p["ratio_where_picked"] for p in per if p["ratio"] is not None]),
            "best_of": [min(best_of), max(best_of)] if best_of else None,
            "geomean_torch_over_first_choice": _geomean_or_none(first_ratios),
            "geomean_torch_over_first_choice_interval": interval("first_choice"),
            "first_choice_problems": sum(v is not None for v in first_ratios),
            "geomean_torch_over_best_prepacked": _geomean_or_none(packed_ratios),
            "geomean_torch_over_best_prepacked_interval": interval("prepacked"),
            "prepacked_problems": sum(v is not None for v in packed_ratios),
            "confirmed_problems": sum(p["ratio_confirmed"] for p in per if p["ratio"] is not None),
            # the same figures over the problems whose rounds had clean calls (what the headline shows)
            "clean_problems": clean_problems, "geomean_torch_over_best_clean": clean_mean("best"),
            "geomean_torch_over_best_clean_interval": interval("best", True),
            "geomean_torch_over_first_choice_clean": clean_mean("first_choice"),
            "geomean_torch_over_first_choice_clean_interval": interval("first_choice", True),
            "geomean_torch_over_best_prepacked_clean": clean_mean("prepacked"),
            "geomean_torch_over_best_prepacked_clean_interval": interval("prepacked", True),
            "rounds_problems": sum(any(isinstance(r.extra.get("rounds"), dict) for r in rs)
                                   for rs in by_problem.values()),
            "confirm_rounds": max(conf, default=None),
            # the best of N chosen among a few rows on half of the fresh rounds (its figure from the other half)
            "confirmed_set_size": [min(sets), max(sets)] if sets else None,
            "best_changed_by_confirmation": sum(p["best"] != p["best_first_rounds"] for p in per
                                                if p["ratio"] is not None and p["confirmed_set"]),
            "confirm_rounds_range": [min(conf), max(conf)] if conf else None,
            "libraries": sorted({r.library for r in rows if r.library}),
            "timings_trustworthy": not warn, "timing_warnings": warn,
            "machine": report.as_dict() if report is not None else None,
            "threads": _threads_used(by_problem),
            "per_problem": per}


def _threads_used(by_problem: dict) -> dict | None:
    """The thread counts the problems were timed at (``extra["threads"]``, from
    :func:`rawconv.compare.compare`): ``requested``, ``used`` (the counts, sorted),
    ``reduced_problems`` (timed at fewer threads than requested because other processes kept the
    CPUs busy), ``problems`` (those that say), ``torch_backends_reduced`` (torch's backend in those,
    by count: at 1 thread torch runs 1x1 convolutions on its own Slow2d, not oneDNN),
    ``retimed_problems`` (timed again at fewer threads: the CPUs were taken while they ran at the
    count asked for) and
    ``other_cpus`` (the most CPUs other processes kept busy in the loads judged). None when no
    row says."""
    fits = {}
    backends: dict = {}
    for name, rs in by_problem.items():
        t = next((r.extra["threads"] for r in rs if isinstance(r.extra.get("threads"), dict)), None)
        if t is None:
            continue
        fits[name] = t
        if t.get("reduced"):
            d = next((r.detail for r in rs if r.backend == "torch" and r.implementation == "default"), "")
            be = (d or "?").split(";")[0].split(" ")[0]
            backends[be] = backends.get(be, 0) + 1
    if not fits:
        return None
    other = [t["load"]["other_cpus"] for t in fits.values()
             if t.get("reduced") and isinstance(t.get("load"), dict) and t["load"].get("other_cpus") is not None]
    return {"requested": max(t["requested"] for t in fits.values()),
            "used": sorted({t["threads"] for t in fits.values()}),
            "reduced_problems": sum(bool(t.get("reduced")) for t in fits.values()), "problems": len(fits),
            "retimed_problems": sum(bool(t.get("retimed")) for t in fits.values()),
            "torch_backends_reduced": backends, "other_cpus": max(other) if other else None}


def _confirmed_ratio(r: Row | None, weights: str | None = None) -> dict | None:
    """The ratio torch default / ``r`` measured in the confirmation rounds (``extra["confirmed"]``:
    where it was chosen there for ``weights``, from the rounds the choice did not use), else in
    the rounds it was chosen on (``extra["ratio"]``); None when neither was measured."""
    if r is None:
        return None
    c = r.extra.get("confirmed")
    p = (c.get("picked") or {}).get(weights) if isinstance(c, dict) else None
    if isinstance(p, dict) and isinstance(p.get("ratio"), dict):
        return dict(p["ratio"], confirmed=True)
    if isinstance(c, dict) and isinstance(c.get("ratio"), dict):
        return dict(c["ratio"], confirmed=True)
    q = r.extra.get("ratio")
    return dict(q, confirmed=False) if isinstance(q, dict) else None


def _summary_problem(name: str, rs: list[Row], any_packed: bool) -> tuple:
    """:func:`summary`'s figures for one problem ``name`` and its rows ``rs`` (``any_packed``:
    whether any row of the run was prepacked). Returns ``(entry, ratios)``: the ``per_problem``
    dict, and ``{"best", "first_choice", "prepacked": (ratio or None, per-round ratios)}``: torch
    default's time over the best rawconv row, over the first choice and over the best prepacked
    row (None where not comparable): the confirmation rounds' figure where they ran, else the
    rounds' median ratio, else the ratio of median times."""
    torch_def = next((r for r in rs if r.backend == "torch" and r.implementation == "default"), None)
    t_ok = torch_def is not None and torch_def.category == "ok" and torch_def.median_ms > 0
    best = best_rawconv(rs, "per call")
    first = first_choice(rs)
    packed = best_rawconv(rs, "prepacked") if any_packed else None

    def ratio_to(r, weights=None):
        if not t_ok or r is None or not r.median_ms > 0:
            return None, [], None
        q = _confirmed_ratio(r, weights)
        if q is not None and q.get("value") is not None:
            return q["value"], list(q.get("per_round") or [q["value"]]), q
        v = torch_def.median_ms / r.median_ms
        return v, [v], None

    out = {"best": ratio_to(best, "per call"), "first_choice": ratio_to(first), "prepacked": ratio_to(packed, "prepacked")}
    n = sum(r.backend != "torch" and r.category == "ok" and math.isfinite(r.median_ms)
            and r.extra.get("weights") in WEIGHT_SETS["per call"] for r in rs)

    def interval(k):
        q = out[k][2]
        return [q["lo"], q["hi"]] if q is not None else None

    sel = best.extra.get("ratio") if best is not None else None
    entry = {"problem": name, "torch_ms": torch_def.median_ms if torch_def and torch_def.ran else None,
             "torch_status": torch_def.status if torch_def else None,
             "torch_library": torch_def.library if torch_def else None,
             "best": best.implementation if best else None, "best_ms": best.median_ms if best else None,
             "best_library": best.library if best else None, "best_of": n,
             "ratio": out["best"][0], "ratio_interval": interval("best"),
             "ratio_confirmed": bool(out["best"][2] and out["best"][2]["confirmed"]),
             "ratio_where_picked": sel.get("value") if isinstance(sel, dict) and t_ok else None,
             # the rows carried into the confirmation's fresh rounds, the best chosen among them there
             "confirmed_set": _picked(best, "per call").get("among"),
             "best_first_rounds": next((r.implementation for r in ranked(rs, "per call")), None),
             "prepacked_confirmed_set": _picked(packed, "prepacked").get("among"),
             "first_choice": first.implementation if first else None,
             "first_choice_ms": first.median_ms if first else None, "first_choice_ratio": out["first_choice"][0],
             "first_choice_interval": interval("first_choice"),
             "best_prepacked": packed.implementation if packed else None,
             "best_prepacked_ms": packed.median_ms if packed else None,
             "prepacked_ratio": out["prepacked"][0], "prepacked_interval": interval("prepacked"),
             "unstable": bool(out["best"][0] is not None and (torch_def.unstable or best.unstable)),
             "rawconv_rows": sum(r.backend != "torch" for r in rs),
             "rawconv_ran": any(r.backend != "torch" and r.ran for r in rs)}
    # a figure from rounds where both sides had a clean call (bench.ratio's "clean"); one measured
    # without rounds (GPU rows, rows built by hand) is taken as it is
    entry["ratio_clean"] = bool(out["best"][2].get("clean", True)) if out["best"][2] is not None else True
    return entry, {k: (v[0], v[1], bool(v[2].get("clean", True)) if v[2] is not None else True) for k, v in out.items()}


def _picked(r: Row | None, weights: str) -> dict:
    """What the confirmation's choice for ``weights`` said of ``r`` (``{}`` where it chose none)."""
    c = r.extra.get("confirmed") if r is not None else None
    return ((c.get("picked") or {}).get(weights) or {}) if isinstance(c, dict) else {}


#: ``rawconv compare`` exit codes, most severe first (the first that applies is returned).
EXIT_CODES = {
    0: "every result is within tolerance; no rawconv candidate failed",
    1: "a result is outside tolerance (a wrong answer)",
    2: "bad command line or problem (nothing ran), or an error that stopped the run (out of memory, an output "
       "file that cannot be written): one 'rawconv: error:' line says which",
    3: "nothing to compare: a library failed to load, or a problem on which no rawconv candidate ran "
       "(every one listed failed, was not supported or was skipped)",
    4: "a rawconv candidate failed (a library error other than not supported; torch's own failures are "
       "listed but do not count)",
}


def exit_code(s: dict) -> int:
    """The exit code (:data:`EXIT_CODES`) for a :func:`summary`; timing warnings do not change it."""
    if s["outside_tolerance"]:
        return 1
    if s["libraries_not_loaded"] or s["no_rawconv_result"] or s["problems"] == 0:
        return 3
    if s["rawconv_failed"]:
        return 4
    return 0


# every public entry point raises only rawconv's exception classes (rawconv._guard)
from ..core import guard as _guard  # noqa: E402

_guard.guard_module(globals(), "summary", where=FACE)
