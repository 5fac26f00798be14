"""compare's headline: the summary's ratios as lines (:func:`headline`; ``compare.headline``).

The figures are always over the same problems, every one where torch default and a rawconv row
both ran within tolerance: a figure over "the problems whose rounds were clean" changed its set
from run to run on a busy machine (6 of 6 problems on a quiet run, 1 of 6 on a loaded one;
17 or 6 of 23), so two runs' figures were means over different problems. How many problems'
headline rows waited for a CPU is said beside the figures, with what those ratios measured.
"""
from __future__ import annotations

__all__ = ["headline"]


def _fig(s: dict, key: str) -> str | None:
    v = s.get(key)
    iv = s.get(key + "_interval")
    return None if v is None else f"{v:.2f}x" + (f" [{iv[0]:.2f}-{iv[1]:.2f}]" if iv else "")


def _rounds_said(s: dict) -> str:
    lo, hi = s.get("confirm_rounds_range") or [s.get("confirm_rounds")] * 2
    if not hi:
        return "fresh"
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def _threads_line(t: dict | None) -> list[str]:
    """The lines that say the problems were timed at fewer threads than asked for (a short one a
    reader skimming the headline sees first), and why."""
    if not t or not t.get("reduced_problems"):
        return []
    used = [n for n in t["used"] if n < t["requested"]]
    n = "/".join(str(v) for v in used)
    other = t.get("other_cpus")
    busy = f" (other processes kept up to {other:.1f} CPUs busy)" if other is not None else ""
    bes = t.get("torch_backends_reduced") or {}
    own = [b for b in bes if b != "Mkldnn"]
    torch_note = (f"; at {n} thread(s) torch's call ran its own {', '.join(own)} on "
                  f"{sum(bes[b] for b in own)} of them, oneDNN on the rest" if own else "")
    cpu_note = ("; a one-thread call is timed by its thread's CPU time, which leaves out the other processes' "
                "time slices" if 1 in used else "")
    again = t.get("retimed_problems") or 0
    again = f" ({again} timed again so: the CPUs were taken while they ran at {t['requested']})" if again else ""
    short = (f"  {n}-THREAD FIGURES on {t['reduced_problems']} of {t['problems']} problem(s), not {t['requested']}-thread "
             f"ones: the machine was busy; compare them with a {n}-thread run, not a quiet machine's "
             f"{t['requested']}-thread one (why, below)")
    return [short, f"  timed at {n} thread(s), not {t['requested']}, on {t['reduced_problems']} of {t['problems']} "
            f"problem(s){again}: the machine could not give {t['requested']} CPUs{busy}, so torch's call and rawconv's "
            f"ran at {n} alike (an OpenMP call of more threads than free CPUs waits a scheduler slice at each "
            f"of its joins: its time would count its joins, not its work)"
            f"{cpu_note}"
            f"{torch_note}; these are {n}-thread "
            f"figures, a quiet machine at {t['requested']} threads gives its own (--threads "
            f"{t['requested']} times at {t['requested']} regardless)"]


def headline(s: dict) -> list[str]:
    """The summary's ratios as lines that say what each side did, each with its interval from the
    rounds, and mark a best-of-N selection as such: confirmed on fresh rounds (the figure then
    carries no winner's curse) or, where no rounds ran (GPU rows, rows built by hand), picked on
    the same timings (``rawconv compare`` prints them; docs/guides/compare-cli.md quotes them).
    The figures are over every comparable problem, on every run. Where some problems' headline
    rows waited for a CPU in most of their fresh rounds, a line says how many and what their
    ratios measured, with the figures over the others when there are some; where most did, it
    starts "no figure to trust"."""
    if s["geomean_torch_over_best"] is None:
        return ["torch default / rawconv: no comparable rows (no problem where torch default and a rawconv "
                "candidate both ran within tolerance)"]
    bo = s.get("best_of") or [0, 0]
    n = f"{bo[0]}" if bo[0] == bo[1] else f"{bo[0]}-{bo[1]}"
    mark = "" if s["timings_trustworthy"] else " [UNRELIABLE: see the timing warnings]"
    dirn = "" if s.get("directions", ["forward"]) == ["forward"] else f" ({', '.join(s['directions'])})"
    total = s["comparable_problems"]
    confirmed = s.get("confirmed_problems", 0) == total and total > 0
    rounds = bool(s.get("rounds_problems"))
    clean = s.get("clean_problems", total) if rounds else total
    how = ("time per call, ratio taken within each interleaved round, median over rounds" if rounds
           else "median time")
    out = [f"torch default / rawconv{dirn}, {how}, geometric mean over {total} problem(s){mark}:"]
    out += _threads_line(s.get("threads"))
    if rounds and clean < total:
        out.append(f"  {'no figure to trust: ' if 2 * clean < total else ''}{total - clean} of {total} problems' "
                   "headline rows waited for a CPU in most of their fresh rounds: their ratios say which "
                   "implementation copes best with threads descheduled, not how fast it computes (a quiet "
                   "machine gives other figures; the intervals below are of this run's rounds only)")
    like = []
    first = _fig(s, "geomean_torch_over_first_choice")
    if first is not None:
        like.append(f"oneDNN's first choice {first}")
    best = _fig(s, "geomean_torch_over_best")
    carried = s.get("confirmed_set_size")
    if confirmed and carried and carried[1] > 1:
        picked = s.get("geomean_torch_over_best_where_picked")
        k = f"{carried[0]}" if carried[0] == carried[1] else f"{carried[0]}-{carried[1]}"
        moved = s.get("best_changed_by_confirmation") or 0
        moved = f"; on {moved} problem(s) not the first rounds' fastest" if moved else ""
        like.append(f"best of {n} per problem {best} (the {k} fastest of the first rounds"
                    f"{f', where the chosen read {picked:.2f}x' if picked else ''}, timed again in "
                    f"{_rounds_said(s)} fresh rounds: chosen on the odd ones, this figure from the even ones"
                    f"{moved})")
    elif confirmed:
        picked = s.get("geomean_torch_over_best_where_picked")
        like.append(f"best of {n} per problem {best} (picked on the first rounds"
                    f"{f', where it read {picked:.2f}x' if picked else ''}; this figure is from "
                    f"{_rounds_said(s)} fresh rounds)")
    elif best is not None:
        like.append(f"best of {n} per problem {best} (picked on these timings: a best-of-N favours rawconv by the "
                    "noise alone)")
    both = "weights read on every call by both, as torch's call does" if "backward_weights" not in \
        s.get("directions", []) else "same inputs on every call"
    out.append(f"  like for like ({both}): " + "; ".join(like))
    packed = _fig(s, "geomean_torch_over_best_prepacked")
    if packed is not None:
        out.append(f"  rawconv's weights prepacked (reordered once, which torch's call cannot do): best of {n} "
                   f"{packed}" + (" (confirmed on fresh rounds)" if confirmed else ""))
    if rounds and 0 < clean < total:
        parts = [f"{name} {v}" for name, v in (("first choice", _fig(s, "geomean_torch_over_first_choice_clean")),
                                                (f"best of {n}", _fig(s, "geomean_torch_over_best_clean")),
                                                ("prepacked", _fig(s, "geomean_torch_over_best_prepacked_clean")))
                 if v is not None]
        out.append(f"  over the {clean} problem(s) whose headline rows had clean calls (no wait for a CPU) in most "
                   f"rounds: " + ", ".join(parts))
    if any(s.get(k + "_interval") for k in ("geomean_torch_over_first_choice", "geomean_torch_over_best")):
        out.append("  [a-b]: 90% bootstrap interval over the rounds (each problem's per-round ratios resampled)")
    return out
