"""Where does a cold graph-API autotune spend its time? One problem, every step timed.

    python benchmarks/diag_graph_autotune.py [--desc mb32ic128ih56oc128oh28kh3sh2ph1] [--dtype float32] [--budget 20]

Prints the time of the float64 reference, of each heuristic-mode query and of the engine-info
queries, then autotune's rows sorted by the seconds each candidate took (finalization, NaN-filled
check against float64, timing), with the behaviour notes (RUNTIME_COMPILATION...).
"""
from __future__ import annotations

import argparse
import time

from rawconv import ConvProblem, cudnn_graph as G


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--desc", default="mb32ic128ih56oc128oh28kh3sh2ph1")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--budget", type=float, default=20.0)
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--top", type=int, default=15, help="also print the fastest N ok rows")
    args = ap.parse_args()
    p = ConvProblem.from_benchdnn(args.desc, dtype=args.dtype, layout="nhwc").with_(device="cuda")
    x, w, _ = p.make_inputs(device="cuda")
    conv = G.GraphConvolution(x, w, None, p.stride, list(zip(p.pad_before, p.pad_after)), p.dilation, p.groups,
                              allow_tf32=args.tf32)
    t = time.perf_counter()
    G.reference(p, "forward", {"x": x, "w": w, "b": None})
    print(f"{p}\nfloat64 reference: {time.perf_counter() - t:.2f} s")
    for mode in G.HEURISTIC_MODES:
        t = time.perf_counter()
        n = len(conv.heuristic(mode))
        print(f"heuristic {mode}: {n} configs in {time.perf_counter() - t:.3f} s")
    t = time.perf_counter()
    infos = [conv.engine_info(i) for i in range(conv.global_count)]
    print(f"engine_info for {conv.global_count} engines: {time.perf_counter() - t:.3f} s, "
          f"{sum(i is not None for i in infos)} support the graph")
    G.clear_tuning_cache()
    t = time.perf_counter()
    rows = conv.autotune(budget_s=args.budget)
    total = time.perf_counter() - t
    print(f"autotune: {total:.1f} s, {len(conv.last_autotune)} candidates, best {rows[0].name} {rows[0].median_ms:.4f} ms")
    for r in sorted(conv.last_autotune, key=lambda r: -r.seconds)[:15]:
        ms = f"{r.median_ms:.4f}" if r.median_ms is not None else "-"
        print(f"  {r.seconds:7.3f} s  {r.name:<48} {r.phase:<14} {r.status:<13} {ms:>9} ms  "
              f"{','.join(r.config.behavior_notes)}")
    print(f"  statuses: {dict(sorted({s: sum(r.status == s for r in rows) for s in {r.status for r in rows}}.items()))}")
    print("  fastest:")
    for r in rows[:args.top]:
        print(f"    {r}  {','.join(r.config.numerical_notes)} {','.join(r.config.behavior_notes)}")
    print("  engines by best time (status of the default-knob row):")
    best = {}
    for r in rows:
        e = r.config.engine
        if r.status == "ok" and (e not in best or r.median_ms < best[e].median_ms):
            best[e] = r
    for e in sorted({r.config.engine for r in rows}):
        d = next((r for r in rows if r.name == f"eng{e}"), None)
        b = best.get(e)
        print(f"    eng{e:<3} best {b.median_ms if b else float('nan'):.4f} ms "
              f"({sum(r.config.engine == e for r in rows)} tried)  default: "
              f"{d.status + ' ' + d.detail[:90] if d else '-'}")
    print(f"  sum of candidate seconds: {sum(r.seconds for r in conv.last_autotune):.1f} s")


if __name__ == "__main__":
    main()
