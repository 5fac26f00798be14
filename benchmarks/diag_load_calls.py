"""What does a loaded machine do to each call of compare's rounds? (issue 34: the best of N's headline)

Runs :func:`rawconv.compare.compare_problem` on a few ResNet-50 layers, once as the machine is
and once beside ``--load`` spinning processes (default: one per usable CPU), and records every
timed call of the rounds (``bench.time_rounds`` wrapped): wall time, process CPU time and the
time our threads waited for a CPU. For the confirmation rounds of each problem it prints, per
estimator of a round's time (the fastest clean call, else the fastest call: what bench uses; the
fastest call's wall time minus its waits per thread; CPU time per thread), the median over
rounds of torch default / the row, as the machine was and loaded, and how far apart.

    python benchmarks/diag_load_calls.py [--layers 0,2,5,10,15,22] [--load N] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from rawconv.core import bench, presets  # noqa: E402
from rawconv.explore import compare as cmp  # noqa: E402


def record_problem(problem) -> dict:
    """compare_problem on ``problem``; returns each time_rounds call's per-call data by row label."""
    seen = []
    orig = bench.time_rounds

    def wrapped(candidates, **kw):
        out = orig(candidates, **kw)
        seen.append(out)
        return out
    bench.time_rounds = wrapped
    try:
        rows = cmp.compare_problem(problem)
    finally:
        bench.time_rounds = orig
    label = {str(i): ("torch default" if r.torch_default else r.implementation) for i, r in enumerate(rows)}
    phases = []
    for timed in seen:
        phases.append({label[k]: [[(c.wall_s, c.cpu_s, c.wait_s) for c in rnd] for rnd in t.rounds]
                       for k, t in timed.items()})
    first = cmp.first_choice(rows)
    best = cmp.best_rawconv(rows, "per call")
    return {"problem": problem.name, "phases": phases, "first": first.implementation if first else None,
            "best": best.implementation if best else None}


def estimators(threads: int):
    def clean_or_min(rnd):
        cl = [w for w, c, s in rnd if bench.Call(w, c, s).clean]
        return min(cl or [w for w, _, _ in rnd])

    def wall_minus_wait(rnd):
        return min(max(w - (s or 0.0) / threads, 1e-9) for w, _, s in rnd)

    def cpu_per_thread(rnd):
        return min(c / threads for _, c, _ in rnd)
    return {"bench (clean, else min wall)": clean_or_min, "min(wall - wait/threads)": wall_minus_wait,
            "min(cpu/threads)": cpu_per_thread}


def ratios(phase: dict, row: str, est) -> list[float]:
    base = phase["torch default"]
    return [est(a) / est(b) for a, b in zip(base, phase[row]) if a and b]


def run(layers, load: int, threads: int) -> list[dict]:
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    try:
        if procs:
            time.sleep(1.0)
        ps = presets.get("resnet50", 1)
        ps = [p for i, p in enumerate(ps) if str(i) in layers]
        return [record_problem(p) for p in ps]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="0,2,5,10,15,22")
    ap.add_argument("--load", type=int, default=None)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    n = args.load if args.load is not None else bench.usable_cpus()
    threads = torch.get_num_threads()
    layers = set(args.layers.split(","))
    print(f"threads {threads}; load average {os.getloadavg()}", flush=True)
    res = {}
    for label, k in (("as is", 0), ("loaded", n)):
        t0 = time.perf_counter()
        res[label] = run(layers, k, threads)
        print(f"{label}: {time.perf_counter() - t0:.0f} s, load average {os.getloadavg()}", flush=True)
    ests = estimators(threads)
    for a, b in zip(res["as is"], res["loaded"]):
        print(f"\n{a['problem']}: best as is {a['best']}, loaded {b['best']}; first choice {a['first']}")
        for row in sorted({a["best"], b["best"], a["first"]} - {None}):
            for name, est in ests.items():
                cells = []
                for r in (a, b):
                    conf = r["phases"][-1]
                    if row in conf:
                        v = ratios(conf, row, est)
                        cells.append(f"{statistics.median(v):6.2f} [{min(v):.2f}-{max(v):.2f}]")
                    else:
                        cells.append(f"{'-':>6}")
                print(f"  {row[:26]:<26} {name:<28} as is {cells[0]:<22} loaded {cells[1]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
