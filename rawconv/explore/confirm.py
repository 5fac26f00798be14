"""compare's confirmation step (:func:`confirm`): torch default, oneDNN's first choice and the
fastest few rows of the first rounds are timed again in fresh rounds; the best of N is chosen
among those few on half of the fresh rounds and its figure is taken from the other half
(:func:`rawconv.bench.pick`).

Why a few and not the one fastest: on a busy machine the first rounds' fastest row was, on 2-3
of 6 problems per run (different problems each time), a row of the same kind as torch's call
that confirmed at ~1.0x where the row that waits least confirmed at ~4x: which one the headline
quoted was luck. Carrying the runners-up into the fresh rounds takes that luck out of the pick;
choosing on the odd rounds and reporting from the even ones keeps the figure free of the
winner's curse (the choice and the figure never share a round). oneDNN's first choice is not
chosen: its figure is from every fresh round, as before.
"""
from __future__ import annotations

import math

from ..core import bench

#: ``best_rawconv``'s weight handlings: "per call" is like for like with torch's call (which reads
#: its weights on every call); "prepacked" is what a weight snapshot reordered once gives
WEIGHT_SETS = {"per call": ("per call", "as given", None), "prepacked": ("prepacked", "as given", None),
               "any": ("per call", "prepacked", "as given", None)}

#: :func:`confirm`'s fresh rounds (default) for torch default, oneDNN's first choice and the
#: carried rows: the headline's figures
CONFIRM_ROUNDS = 9

#: more batches of ``confirm_rounds`` fresh rounds at most, while a reported ratio spreads
#: (:func:`ratio_spread`)
CONFIRM_MORE = 2

#: the fastest rows of the first rounds (per weight handling) carried into the fresh rounds, among
#: which the best of N is chosen there
CONFIRM_CARRY = 3


def ranked(rows: list, weights: str = "any") -> list:
    """The rawconv rows (oneDNN or cuDNN) with status "ok" and a time among ``rows`` whose weight
    handling is in ``WEIGHT_SETS[weights]``, fastest first (median time of the first rounds)."""
    keep = WEIGHT_SETS[weights]
    ok = [r for r in rows if r.backend != "torch" and r.category == "ok" and math.isfinite(r.median_ms)
          and r.extra.get("weights") in keep]
    return sorted(ok, key=lambda r: r.median_ms)


def picked(rows: list, weights: str):
    """The row among ``rows`` that :func:`confirm` chose for ``weights`` ("per call" or
    "prepacked"; ``extra["confirmed"]["picked"]``), None where it chose none."""
    return next((r for r in rows if r.backend != "torch" and r.category == "ok"
                 and weights in ((r.extra.get("confirmed") or {}).get("picked") or {})), None)


def ratio_spread(q) -> bool:
    """A confirmation's per-round ratios (:class:`rawconv.bench.Ratio`) spread: their interquartile
    range above :data:`rawconv.bench.ROUNDS_DISAGREE` of their median."""
    return q is not None and q.value > 0 and (q.hi - q.lo) / q.value > bench.ROUNDS_DISAGREE


def confirm(rows: list, torch_def, first, keys: dict, entry, *, calls: int, budget_s: float | None,
            confirm_rounds: int) -> None:
    """The confirmation step of ``rows`` (one problem's, timed in the first rounds; ``keys``:
    ``id(row)`` -> its name in those rounds, ``entry(row)`` its ``(fn, setup)``): torch default
    (``torch_def``), oneDNN's first choice (``first``, or None) and the :data:`CONFIRM_CARRY`
    fastest rows per weight handling ("per call", "prepacked") are timed again in
    ``confirm_rounds`` fresh interleaved rounds (consecutive rounds in pairs of one order), up to
    :data:`CONFIRM_MORE` more batches of as many while the first choice's or a chosen row's
    ratio spreads (:func:`ratio_spread`). Per weight handling, the best of N is chosen among its
    carried rows on the odd fresh rounds and its figure taken from the even ones
    (:func:`rawconv.bench.pick`). Each timed row's ``extra["confirmed"]`` holds ``median_ms``,
    ``rounds``, ``flags``, ``machine``, ``ratio`` (torch default / it over every fresh round),
    ``carried`` (the weight handlings it was carried for) and ``picked`` ({weight handling:
    ``Pick.as_dict()`` plus ``among``, the carried rows' names}). Returns None."""
    carried = {}
    for w in ("per call", "prepacked"):
        top = ranked(rows, w)
        # the first rounds' fastest was timed in them (not a row timed elsewhere): carry it and the next
        carried[w] = [r for r in top if id(r) in keys][:CONFIRM_CARRY] if top and id(top[0]) in keys else []
    timed_rows = list({id(r): r for r in [first] + carried["per call"] + carried["prepacked"]
                       if r is not None and id(r) in keys}.values())
    if not timed_rows:
        return
    monitor = bench.LoadMonitor()
    split = any(len(v) > 1 for v in carried.values())
    # a few rows, the headline's: every one in every round (at least one call each, however busy the
    # machine), more tries per round for a call during which our threads did not wait for a CPU
    cands = {keys[id(r)]: entry(r) for r in [torch_def] + timed_rows}
    import torch

    kw = dict(rounds=confirm_rounds, calls=calls, retries=3 * calls, budget_s=budget_s, min_rounds=confirm_rounds,
              sit_out=False, pairs=split, one_thread=torch.get_num_threads() == 1)
    again = bench.time_rounds(cands, warmup=1, **kw)
    base = again[keys[id(torch_def)]]

    def picks():
        return {w: bench.pick(base, again, [keys[id(r)] for r in rs]) for w, rs in carried.items() if rs}

    # where a reported ratio spreads (a busy machine: some rounds' calls waited for whole scheduler
    # slices, others not), up to CONFIRM_MORE more batches of fresh rounds: the median of a spread
    # sample moves from run to run, of a larger one less
    for _ in range(CONFIRM_MORE):
        spread = [p.ratio for p in picks().values()]
        if first is not None and id(first) in keys:
            spread.append(bench.ratio(base, again[keys[id(first)]]))
        if not any(ratio_spread(q) for q in spread):
            break
        more = bench.time_rounds(cands, warmup=0, **kw)
        for k, t in more.items():
            again[k].rounds.extend(t.rounds)
    machine = monitor.report().as_dict()
    torch_def.extra["confirmed"] = {"median_ms": base.stats().median_ms, "rounds": base.as_dict(),
                                    "flags": base.flags(), "machine": machine}
    name = {keys[id(r)]: r.implementation for r in timed_rows}
    got = {w: dict(p.as_dict(), among=[name[keys[id(r)]] for r in carried[w]],
                   choice={name[k]: q for k, q in p.as_dict()["choice"].items()})
           for w, p in picks().items()}
    for r in timed_rows:
        k = keys[id(r)]
        t = again[k]
        q = bench.ratio(base, t)
        r.extra["confirmed"] = {"median_ms": t.stats().median_ms, "rounds": t.as_dict(), "flags": t.flags(),
                                "ratio": q.as_dict() if q is not None else None, "machine": machine,
                                "carried": [w for w, rs in carried.items() if any(x is r for x in rs)],
                                "picked": {w: p for w, p in got.items() if p["name"] == k}}


def confirmed_line(rows) -> str:
    """The lines under a problem's table that give what its confirmation rounds measured: torch
    default / each confirmed row (median and interquartile range of the per-round ratios over
    every fresh round), then per weight handling the rows carried, what each read on the rounds
    the choice used, the row chosen and its figure from the other rounds; or ''."""
    conf = [(r, r.extra["confirmed"]) for r in rows if r.backend != "torch" and isinstance(r.extra.get("confirmed"), dict)
            and isinstance(r.extra["confirmed"].get("ratio"), dict)]
    if not conf:
        return ""
    n = conf[0][1]["rounds"]["rounds"]
    parts = []
    for r, c in conf:
        q = c["ratio"]
        parts.append(f"{r.implementation} {q['value']:.2f}x [{q['lo']:.2f}-{q['hi']:.2f}]"
                     + (" (waited for a CPU)" if any(f.startswith("waited") for f in c.get("flags") or []) else ""))
    out = [f"  confirmed on {n} fresh rounds (torch default / row, median [interquartile range] of the per-round "
           f"ratios): " + "; ".join(parts)]
    for r, c in conf:
        for w, p in (c.get("picked") or {}).items():
            q = p.get("ratio")
            fig = f"{q['value']:.2f}x [{q['lo']:.2f}-{q['hi']:.2f}]" if isinstance(q, dict) else "-"
            if p.get("rounds") != "even":
                out.append(f"  best {w}: {r.implementation} (the only row carried), {fig} over every fresh round")
                continue
            read = ", ".join(f"{k} {v['value']:.2f}x" if isinstance(v, dict) else f"{k} -"
                             for k, v in p["choice"].items())
            out.append(f"  best {w}: the {len(p['among'])} fastest of the first rounds, on the odd fresh rounds "
                       f"{read}: {r.implementation}, {fig} on the even ones (the headline's figure)")
    return "\n".join(out)
