"""The search's strategies (a part of :mod:`rawconv.cudnn.graph.search`, the face, which hands its names
on): seeds from the tuning cache (:func:`seed_configs`), the knob search around the fastest engines
(:func:`knob_search`, :func:`neighbours`) and random knob combinations (:func:`random_search`)."""
from __future__ import annotations

import random
from typing import Sequence

from .search_plan import RTC, Config, SearchPlan, TimedConfig, knob_combinations, knob_values

# ---------------------------------------------------------------------------- strategies
def seed_configs(plan: SearchPlan, configs: Sequence[Config], max_rtc: int = 8, max_other: int = 16, *,
                 filters: dict | None = None, proposed: set | None = None,
                 include_runtime_compiled: bool = True) -> list:
    """The configs among ``configs`` (winners of other problems from the tuning cache, best
    first) whose engine this graph supports and that autotune's filters allow (``filters`` as
    :meth:`SearchPlan.allowed` takes them; a runtime-compiled engine outside ``proposed`` only
    with ``include_runtime_compiled``), each once: at most ``max_rtc`` runtime-compiled ones and
    ``max_other`` others."""
    out, n_rtc, n_other, seen = [], 0, 0, set()
    for ec in configs:
        if ec.name in seen or plan.engine_info(ec.engine) is None:
            continue
        seen.add(ec.name)
        ec = plan.annotate(ec)
        if filters is not None and plan.allowed(ec, **filters):
            continue
        rtc = RTC in ec.behavior_notes
        if rtc and not include_runtime_compiled and ec.engine not in (proposed or ()):
            continue
        if rtc:
            if n_rtc >= max_rtc:
                continue
            n_rtc += 1
        else:
            if n_other >= max_other:
                continue
            n_other += 1
        out.append(ec)
    return out


def _best_by_engine(rows: dict) -> list:
    """Each engine's fastest ``ok`` row, fastest first."""
    best = {}
    for r in rows.values():
        if r.status != "ok":
            continue
        e = r.config.engine
        if e not in best or r.median_ms < best[e].median_ms:
            best[e] = r
    return sorted(best.values(), key=lambda r: r.median_ms)


def knob_search(plan: SearchPlan, rows: dict, trial, left, prebuild=None) -> None:
    """Coordinate search over knob values, from the best config of each of the fastest engines
    (six, then three for up to two more rounds while one improves). ``trial(config, phase)``
    tries a config (returns its row or None), ``left()`` says whether the budget lasts,
    ``prebuild(configs)`` compiles runtime-compiled candidates together before they are tried."""
    ranked_ = _best_by_engine(rows)[:6]
    for round_ in range(3):
        improved = False
        for start in ranked_:
            if not left():
                return
            info = plan.engine_info(start.config.engine)
            if info is None or not info[1]:
                continue
            if round_ > 0 and RTC in start.config.behavior_notes:
                continue
            current, base = _knob_base(rows, start, info[1])
            done, better = _coordinate_pass(plan, start.config.engine, info[1], current, base, trial, left, prebuild)
            improved |= better
            if done:
                return
        ranked_ = _best_by_engine(rows)[:3]
        if not improved:
            return


def _knob_base(rows: dict, start: TimedConfig, knobs: list):
    """The row and knob values a knob search of ``start``'s engine starts from: ``start``, or for
    default knobs a heuristic config of the same engine (its fastest ``ok`` one), else each
    knob's minimum."""
    current = rows[start.config.name]
    base = dict(current.config.knobs)
    if not base:
        seeds = [r for r in rows.values() if r.config.engine == start.config.engine and r.config.knobs
                 and r.status == "ok"]
        if seeds:
            current = min(seeds, key=lambda r: r.median_ms)
            base = dict(current.config.knobs)
        else:
            base = {t: lo for t, lo, hi, st in knobs}
    return current, base


def _coordinate_pass(plan, engine: int, knobs: list, current, base: dict, trial, left, prebuild):
    """One pass over ``knobs`` of ``engine``, each knob's values (:func:`knob_values`) tried from
    ``base``, improvements kept. Returns ``(budget ended, improved)``."""
    improved = False
    for t, lo, hi, st in knobs:
        if prebuild is not None:
            prebuild([plan.make_config(engine, tuple({**base, t: v}.items()))
                      for v in knob_values(lo, hi, st, base.get(t, lo)) if v != base.get(t)])
        for v in knob_values(lo, hi, st, base.get(t, lo)):
            if not left():
                return True, improved
            if v == base.get(t):
                continue
            cand = dict(base)
            cand[t] = v
            row = trial(plan.make_config(engine, tuple(cand.items())), "knob search")
            if row is not None and row.status == "ok" and row.median_ms < current.median_ms:
                current, base, improved = row, dict(row.config.knobs), True
    return False, improved


def neighbours(plan: SearchPlan, rows: dict, trial, left, start, knobs, prebuild=None) -> None:
    """One knob at a time, to each neighbouring value, from ``start``, keeping improvements."""
    current = start
    improved = True
    while improved and left():
        improved = False
        base = dict(current.config.knobs)
        engine = current.config.engine
        if prebuild is not None:
            prebuild([plan.make_config(engine, tuple({**base, t: v}.items()))
                      for t, lo, hi, st in knobs for v in (base.get(t, lo) - (st or 1), base.get(t, lo) + (st or 1))
                      if lo <= v <= hi])
        for t, lo, hi, st in knobs:
            step = st if st > 0 else 1
            for v in (base.get(t, lo) - step, base.get(t, lo) + step):
                if not left():
                    return
                if not lo <= v <= hi:
                    continue
                cand = dict(base)
                cand[t] = v
                row = trial(plan.make_config(engine, tuple(cand.items())), "random knobs")
                if row is not None and row.status == "ok" and row.median_ms < current.median_ms:
                    current, improved = row, True
            if improved:
                break


class _RandomDraws:
    """The state of :func:`random_search`: the engines drawn from, each one's fastest ``ok`` row
    and trials spent (kept up to date as rows come: a scan of every row per draw would cost
    O(rows) each, thousands of times per search), failed draws, exhausted engines."""

    def __init__(self, plan: SearchPlan, rows: dict, trial, seed: int, proposed: set, include_runtime_compiled: bool):
        self.plan, self.rows, self._trial = plan, rows, trial
        self.rng = random.Random(seed)
        self.infos = {}
        for idx in range(plan.global_count):
            info = plan.engine_info(idx)
            if info is None or not info[1]:
                continue
            if RTC in info[0]["behavior_notes"] and idx not in proposed and not include_runtime_compiled:
                continue
            default = rows.get(f"eng{idx}")
            if default is not None and default.status == "filtered" and not default.detail.startswith("workspace"):
                continue  # its notes are outside the request
            self.infos[idx] = info
        self.fails = {idx: 0 for idx in self.infos}
        self.exhausted: set = set()
        self.best: dict = {}    # engine -> its fastest "ok" row
        self.spent: dict = {}   # engine -> (rows, seconds)
        for r in rows.values():
            self.note(r)

    def note(self, r) -> None:
        e = r.config.engine
        n, sec = self.spent.get(e, (0, 0.0))
        self.spent[e] = (n + 1, sec + r.seconds)
        if r.status == "ok" and (e not in self.best or r.median_ms < self.best[e].median_ms):
            self.best[e] = r

    def trial(self, ec, phase):
        """``trial`` with the per-engine state updated."""
        before = self.rows.get(ec.name)
        row = self._trial(ec, phase)
        r = self.rows.get(ec.name)
        if r is not None and r is not before:
            self.note(r)
        return row

    def usable(self, idx) -> bool:
        """Not exhausted, not 16 failed draws without a success, and for a runtime-compiled
        engine, trials averaging under 1 s."""
        if idx in self.exhausted:
            return False
        if self.best.get(idx) is None and self.fails[idx] >= 16:
            return False
        n, sec = self.spent.get(idx, (0, 0.0))
        return not (RTC in self.infos[idx][0]["behavior_notes"] and n and sec / n > 1.0)

    def draw(self, idx):
        """An untried random knob combination of engine ``idx`` (24 tries; then, in a space of at
        most 4096 combinations, the first untried one in order), or None (engine exhausted)."""
        knobs = self.infos[idx][1]
        for _ in range(24):
            combo = []
            for t, lo, hi, st in knobs:
                n = (hi - lo) // st + 1 if st > 0 and hi >= lo else 1
                combo.append((t, lo + st * self.rng.randrange(n) if n > 1 else lo))
            ec = self.plan.make_config(idx, tuple(combo))
            if ec.name not in self.rows:
                return ec
        total = 1
        for t, lo, hi, st in knobs:
            total *= (hi - lo) // st + 1 if st > 0 and hi >= lo else 1
        if total <= 4096:  # small space: take the first untried combination in order
            for combo in knob_combinations(knobs):
                ec = self.plan.make_config(idx, combo)
                if combo and ec.name not in self.rows:
                    return ec
        self.exhausted.add(idx)
        return None

    def round_plan(self) -> list:
        """``(engine, draws)`` for one round: 3 for each of the two fastest engines, 2 for the next
        four, 1 for every other."""
        ranked_ = sorted((idx for idx in self.infos if self.best.get(idx) is not None),
                         key=lambda i: self.best[i].median_ms)
        plan = [(idx, 3 if k < 2 else 2 if k < 6 else 1) for k, idx in enumerate(ranked_)]
        return plan + [(idx, 1) for idx in self.infos if idx not in ranked_]


def random_search(plan: SearchPlan, rows: dict, trial, left, seed: int, proposed: set,
                  include_runtime_compiled: bool, prebuild=None, late=None) -> None:
    """Random knob combinations: per round, 3 draws for each of the two fastest engines, 2 for
    the next four, 1 for every other engine with knobs (one that never finalized is dropped
    after 16 failed draws; a runtime-compiled engine is drawn only while its trials average
    under 1 s). A draw that beats its engine's best by 0.5% starts a neighbour search. After
    each round, the rows ``late(rows)`` returns (compiled since, or skipped) are tried again."""
    st = _RandomDraws(plan, rows, trial, seed, proposed, include_runtime_compiled)
    while left():
        progressed = False
        for idx, n in st.round_plan():
            if not st.usable(idx):
                continue
            batch = {}
            for _ in range(n):
                ec = st.draw(idx)
                if ec is None:
                    break
                batch[ec.name] = ec
            if prebuild is not None and len(batch) > 1:
                prebuild(list(batch.values()))
            for ec in batch.values():
                if not left():
                    return
                if not st.usable(idx):
                    break
                before = st.best.get(idx)
                row = st.trial(ec, "random knobs")
                progressed = True
                if row is None or row.status != "ok":
                    st.fails[idx] += 1
                    continue
                if before is None or row.median_ms < 0.995 * before.median_ms:
                    neighbours(plan, rows, st.trial, left, row, st.infos[idx][1], prebuild)
        if not progressed:
            return
        for r in (late(rows) if late is not None else []):
            if not left():
                break
            # skipped while other runtime compilations ran, or compiled since: try it now
            row = st.trial(r.config, r.phase)
            if row is not None and row.status == "ok":
                neighbours(plan, rows, st.trial, left, row, st.infos.get(row.config.engine, (None, []))[1], prebuild)


_RandomDraws.__module__ = "rawconv.cudnn.graph.search"   # (the face's, as before the split)
