"""Does `rawconv compare resnet50`'s headline repeat on a busy machine? (issue 34's targets)

Runs the main job three times as a subprocess, each writing its JSON summary:

1. on the machine as it is ("idle": nothing started here; other users' work is not stopped, so
   the load average it saw is printed beside it);
2. and 3. back to back, with a background load started here: one spinning process
   (``python -c "while True: pass"``) per CPU this process may use (``--load N`` for another
   count).

For each headline ratio (oneDNN's first choice vs torch, the confirmed best of N vs torch, the
confirmed best prepacked vs torch; each a geometric mean over the problems, with its 90%
bootstrap interval over the rounds) it prints the three runs and whether the targets hold:
the two loaded runs within 5% of each other, each within 10% of the idle run; first for the
figures the headline shows (over every comparable problem), then over the problems whose
headline rows had clean rounds (a set that changes from run to run); and each problem's
confirmed best-of-N ratio, interval and row in the three runs side by side. Also the load average before and after each run, the run's wall time,
the timing warnings (the flags) and how many rows each run flagged.

    python benchmarks/load_repeat.py [--quick] [--load N] [--json out.json] [-- extra compare args]

``--quick``: six of ResNet-50's 23 layers (``--layers 0,2,5,10,15,22``). The targets are the
issue's; a run on a machine shared with other work says what it saw, it does not make the
others stop.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK_LAYERS = "0,2,5,10,15,22"
KEYS = (("first choice", "geomean_torch_over_first_choice"),
        ("best of N (confirmed)", "geomean_torch_over_best"),
        ("best prepacked (confirmed)", "geomean_torch_over_best_prepacked"))
PER_PROBLEM_KEYS = ("problem", "torch_ms", "best", "best_ms", "ratio", "ratio_interval", "ratio_where_picked",
                    "ratio_clean", "first_choice_ratio", "first_choice_interval", "confirmed_set", "best_first_rounds")
REPEAT_TOL = 0.05   # the two loaded runs: each headline ratio within 5% of the other
IDLE_TOL = 0.10     # each loaded run: within 10% of the idle run


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # pragma: no cover - not Linux
        return os.cpu_count() or 1


def loadavg() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:   # pragma: no cover
        return "?"


def spinners(n: int) -> list:
    """``n`` processes that each keep one CPU busy (no memory traffic: pure CPU contention)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def compare_run(label: str, args, extra: list) -> dict:
    """One ``rawconv compare resnet50`` in a subprocess; returns its summary and what it saw."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        cmd = [sys.executable, "-m", "rawconv", "compare", "resnet50", "--quiet", "--json", out]
        if args.quick:
            cmd += ["--layers", QUICK_LAYERS]
        cmd += extra
        before = loadavg()
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
        wall = time.perf_counter() - t0
        after = loadavg()
        if proc.returncode not in (0, 1, 4) or not os.path.exists(out):
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
            raise SystemExit(f"{label}: rawconv compare failed (exit {proc.returncode})")
        with open(out) as f:
            data = json.load(f)
        if args.save_runs:
            os.makedirs(args.save_runs, exist_ok=True)
            with open(os.path.join(args.save_runs, label.replace(" ", "_") + ".json"), "w") as f:
                json.dump(data, f)
    s = data["summary"]
    rows = data["rows"]
    flagged = sum(bool(r.get("timing_flags")) for r in rows if r.get("median_ms") is not None)
    timed = sum(r.get("median_ms") is not None for r in rows)
    lines = proc.stdout.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("torch default / rawconv")), len(lines))
    headline = [ln for ln in lines[start:] if ln.startswith(("torch default / rawconv", "  "))
                and not ln.startswith(("  outside tolerance", "  failed", "  library not loaded", "  no rawconv"))]
    total, clean = s.get("comparable_problems") or 0, s.get("clean_problems") or 0
    return {"label": label, "command": " ".join(cmd[1:]), "wall_s": wall, "loadavg_before": before,
            "loadavg_after": after, "machine": s.get("machine"), "flagged_rows": flagged, "timed_rows": timed,
            "timing_warnings": s.get("timing_warnings") or [], "headline": headline,
            "problems": total, "clean_problems": clean,
            # which row was the best of N where, and what it read: a load can change the answer itself
            "best": collections.Counter(p["best"] for p in s.get("per_problem") or [] if p.get("best")),
            # what the headline shows: every comparable problem, on every run
            "ratios": {name: (s.get(key), s.get(key + "_interval")) for name, key in KEYS},
            # the problems whose headline rows had clean rounds (a set that changes from run to run)
            "clean_only": {name: (s.get(key + "_clean"), s.get(key + "_clean_interval")) for name, key in KEYS},
            "trustworthy": s.get("timings_trustworthy"),
            # the thread counts the problems were timed at (fewer than asked where the machine could not give them)
            "threads": s.get("threads"),
            # per problem, what moves between runs: the best of N's name, its confirmed ratio and interval
            "per_problem": [{k: p.get(k) for k in PER_PROBLEM_KEYS} for p in s.get("per_problem") or []]}


def rel(a, b) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b - 1.0


def report(runs: list, out=print, which: str = "ratios") -> dict:
    """The table of one set of figures (``which``: "ratios", the headline's, over every comparable
    problem, or "clean_only", over the problems whose headline rows had clean rounds) and whether
    the targets hold for it."""
    out("")
    out("headline figures (over every comparable problem: " + ", ".join(f"{r['label']} {r['problems']}" for r in runs)
        + ")" if which == "ratios" else "over the problems whose headline rows had clean rounds (not the same set "
        "from run to run: " + ", ".join(f"{r['label']} {r['clean_problems']} of {r['problems']}" for r in runs) + ")")
    out(f"{'ratio':<28} {'idle':>22} {'loaded 1':>22} {'loaded 2':>22}  {'l1 vs l2':>9} {'l1 vs idle':>10} "
        f"{'l2 vs idle':>10}")
    verdict = {}
    for name, _ in KEYS:
        cells = []
        for r in runs:
            v, iv = r[which][name]
            cells.append("-" if v is None else f"{v:.3f}" + (f" [{iv[0]:.2f}-{iv[1]:.2f}]" if iv else ""))
        v0, v1, v2 = (r[which][name][0] for r in runs)
        d12, d1, d2 = rel(v1, v2), rel(v1, v0), rel(v2, v0)
        ok_repeat = d12 is not None and abs(d12) <= REPEAT_TOL
        ok_idle = d1 is not None and d2 is not None and abs(d1) <= IDLE_TOL and abs(d2) <= IDLE_TOL
        verdict[name] = {"values": [v0, v1, v2], "loaded_vs_loaded": d12, "loaded_vs_idle": [d1, d2],
                         "repeat_ok": ok_repeat if v1 is not None else None,
                         "idle_ok": ok_idle if v0 is not None else None}

        def pct(d):
            return "-" if d is None else f"{100 * d:+.1f}%"
        out(f"{name:<28} {cells[0]:>22} {cells[1]:>22} {cells[2]:>22}  {pct(d12):>9} {pct(d1):>10} {pct(d2):>10}")
    out("")
    for name, v in verdict.items():
        if v["repeat_ok"] is None:
            continue
        out(f"target {name}: loaded runs within {100 * REPEAT_TOL:.0f}% of each other: "
            f"{'yes' if v['repeat_ok'] else 'NO'}; within {100 * IDLE_TOL:.0f}% of idle: "
            f"{'yes' if v['idle_ok'] else 'NO'}")
    return verdict


def per_problem_table(runs: list, out=print) -> None:
    """Each problem's confirmed best-of-N ratio (and which row) in every run, side by side: which
    problems move between runs."""
    out("")
    out("per problem: best of N (confirmed) torch/rawconv [interquartile range of its fresh rounds] row; "
        "* = not from clean rounds; + = chosen in the fresh rounds over the first rounds' fastest")
    out(f"{'problem':<34} " + " ".join(f"{r['label']:>40}" for r in runs))
    names = [p["problem"] for p in runs[0]["per_problem"]]
    for name in names:
        cells = []
        for r in runs:
            p = next((q for q in r["per_problem"] if q["problem"] == name), None)
            if p is None or p.get("ratio") is None:
                cells.append(f"{'-':>40}")
                continue
            iv = p.get("ratio_interval")
            cell = (f"{p['ratio']:.2f}" + (f" [{iv[0]:.2f}-{iv[1]:.2f}]" if iv else "")
                    + ("" if p.get("ratio_clean") else "*")
                    + ("+" if p.get("confirmed_set") and p.get("best") != p.get("best_first_rounds") else "")
                    + f" {str(p.get('best'))[:18]}")
            cells.append(f"{cell:>40}")
        out(f"{name[:34]:<34} " + " ".join(cells))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"six layers only (--layers {QUICK_LAYERS})")
    ap.add_argument("--load", type=int, default=None, help="spinning processes for the loaded runs (default: one "
                                                            "per usable CPU)")
    ap.add_argument("--json", help="write the runs and the verdict to this file")
    ap.add_argument("--save-runs", metavar="DIR", help="keep each run's full `rawconv compare --json` output in DIR "
                                                      "(idle.json, loaded_1.json, loaded_2.json)")
    args, extra = ap.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    n = args.load if args.load is not None else usable_cpus()
    print(f"rawconv compare resnet50{' --layers ' + QUICK_LAYERS if args.quick else ''}: 1 run as the machine is, "
          f"then 2 with {n} spinning process(es); {usable_cpus()} CPUs usable; 1/5/15-minute load average now "
          f"{loadavg()}", flush=True)
    runs = []
    runs.append(compare_run("idle", args, extra))
    procs = spinners(n)
    try:
        time.sleep(1.0)
        for i in (1, 2):
            runs.append(compare_run(f"loaded {i}", args, extra))
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
    for r in runs:
        m = r["machine"] or {}
        other = m.get("other_cpus")
        print(f"{r['label']}: {r['wall_s']:.0f} s; load average before {r['loadavg_before']}, after "
              f"{r['loadavg_after']}; other processes kept {other if other is None else f'{other:.1f}'} of "
              f"{m.get('cpus')} CPUs busy while it timed; {r['flagged_rows']} of {r['timed_rows']} timed rows "
              f"flagged; headline {'trusted' if r['trustworthy'] else 'marked UNRELIABLE'}")
        t = r.get("threads")
        if t:
            print(f"    threads: {t['requested']} asked for; timed at {'/'.join(map(str, t['used']))} "
                  f"({t['reduced_problems']} of {t['problems']} problems at fewer)")
        for line in r["headline"]:
            print(f"    {line}")
        print("    best of N per problem: " + ", ".join(f"{k} {v}" for k, v in r["best"].most_common()))
        for w in r["timing_warnings"]:
            print(f"    warning: {w}")
    per_problem_table(runs)
    verdict = {"headline": report(runs), "clean_only": report(runs, which="clean_only")}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "verdict": verdict, "spinners": n}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
