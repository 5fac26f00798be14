"""rawconv.cudnn_graph (autotuned engine configs) against torch with cudnn.benchmark=True, on a GPU.

One process per GPU. For each layout (channels_last "nhwc", "nchw"), precision (fp32 IEEE, TF32,
fp16, bf16) and ResNet-50 layer (the 23 distinct convolutions of ``rawconv.presets.resnet50``,
batch 32): torch's time with ``torch.backends.cudnn.benchmark = True`` (and ``allow_tf32`` as the
precision says), rawconv's autotuned best (``--budget`` seconds per layer, cold), both timed on
the GPU: CUDA events around groups of back-to-back calls queued while the GPU is held busy
(``rawconv.bench.time_cuda_queued``), so that the host's launch time, measured apart below, is
left out, in interleaved rounds (torch, rawconv, torch, ...; median of the round medians, so that
clock drift hits both alike), the ratio torch / rawconv, the
geometric mean per precision and layout, the autotune seconds per layer cold and warm
(tuning-cache hit), and the per-call host overhead of a cached plan against ``F.conv2d``.

``--relayout``: NCHW layers autotune with ``relayout=True`` (the channels_last graph's configs,
run on channels_last copies with the output copied back, compete end to end, copies timed). The
best config of the NCHW graph alone is then timed in the same rounds too, and its ratio printed
in the column ``own graph``.

    python benchmarks/bench_cudnn_graph.py [--budget 8] [--layers 23] [--layouts nhwc,nchw] [--json out.json]
    python benchmarks/bench_cudnn_graph.py --summary a.json b.json     # one table from several runs

Two GPUs: run one process per layout with ``CUDA_VISIBLE_DEVICES=0`` / ``=1`` and ``--json``, then
``--summary``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter, defaultdict

# six layers as in shared/LIBRARY-FACTS.md's probe first, then the rest of ResNet-50 in network order
PREFERRED = ["layer1.0.conv1", "layer1.0.conv2", "layer1.0.conv3", "layer2.0.conv2", "layer3.1.conv2",
             "layer4.0.conv3"]
MODES = {"fp32": ("float32", False), "tf32": ("float32", True), "fp16": ("float16", False),
         "bf16": ("bfloat16", False)}


def layers(batch: int, dtype: str, layout: str, count: int, only: str | None = None):
    from rawconv.presets import resnet50

    probs = resnet50(batch, dtype=dtype, layout=layout)
    byname = {p.name: p for p in probs}
    order = [byname[n] for n in PREFERRED if n in byname] + [p for p in probs if p.name not in PREFERRED]
    if only:
        names = only.split(",")
        order = [p for p in order if p.name in names]
    return order[:count]


def interleaved(fns: dict, iters: int, rounds: int = 5) -> dict:
    """Median GPU ms per call for each callable: CUDA events around groups of back-to-back calls
    queued behind a GPU sleep (``rawconv.cudnn.graph.search.time_reps``), ``rounds`` rounds alternating the callables; the median
    of the round medians."""
    from rawconv.cudnn.graph.search import time_reps

    per = defaultdict(list)
    for _ in range(rounds):
        for name, fn in fns.items():
            per[name].append(time_reps(fn, max(2, iters // rounds), warmup=2).median_ms)
    return {name: statistics.median(v) for name, v in per.items()}


def host_overhead(n: int = 3000, repeats: int = 5) -> dict:
    """Per-call host time (µs) of back-to-back calls, one synchronize at the end: a tiny fp16 NHWC
    problem so that the GPU is never the bottleneck. Best of ``repeats`` loops of ``n`` calls."""
    import torch
    import torch.nn.functional as F
    from rawconv import cudnn_graph as G
    from rawconv.bench import wall_us_per_call
    from rawconv.problem import to_layout

    x = to_layout(torch.randn(1, 8, 8, 8, device="cuda", dtype=torch.float16), "nhwc")
    w = to_layout(torch.randn(8, 8, 1, 1, device="cuda", dtype=torch.float16), "nhwc")
    torch.backends.cudnn.benchmark = True
    plan = G.GraphConvolution(x, w)
    plan.autotune(budget_s=2.0)
    y = torch.empty_like(F.conv2d(x, w))
    out = {}
    for name, fn in (("F.conv2d(x, w)", lambda: F.conv2d(x, w)),
                     ("rawconv plan.execute(x, w)", lambda: plan.execute(x, w)),
                     ("rawconv plan.execute(x, w, out=y)", lambda: plan.execute(x, w, out=y)),
                     ("rawconv cudnn_graph.forward(x, w, engine=...)",
                      lambda: G.forward(x, w, engine=plan.selected))):
        out[name] = wall_us_per_call(fn, n, repeats)
    # rawconv's own Python part: the same call with cudnnBackendExecute replaced by a no-op
    from rawconv.cudnn import _ffi as _cudnn

    real_lib = _cudnn.lib

    class _NoExecute:
        def __init__(self, lib):
            self._lib = lib

        def __getattr__(self, name):
            return getattr(self._lib, name)

        @staticmethod
        def cudnnBackendExecute(*args):
            return 0

    stub = _NoExecute(real_lib())
    _cudnn.lib = lambda: stub
    try:
        out["rawconv plan.execute(x, w, out=y), cudnnBackendExecute stubbed"] = wall_us_per_call(
            lambda: plan.execute(x, w, out=y), n, repeats)
    finally:
        _cudnn.lib = real_lib
    return out


def run(args) -> list:
    import torch
    import torch.nn.functional as F
    from rawconv import cudnn_graph as G
    from rawconv.cudnn import _ffi as _cudnn
    from rawconv.problem import to_layout

    dev = torch.cuda.get_device_name()
    print(f"# {dev}, torch {torch.__version__}, cuDNN {_cudnn.version()['version']} (torch's: "
          f"{torch.backends.cudnn.version()}), batch {args.batch}, budget {args.budget} s/layer, "
          f"patience {args.patience}, cache seeds {'off' if args.no_cache_seeds else 'on'}", flush=True)
    results = []
    for layout in args.layouts.split(","):
        for mode in args.modes.split(","):
            dtype, tf32 = MODES[mode]
            ratios, own_ratios = [], []
            print(f"\n## {mode} {layout}", flush=True)
            print(f"{'layer':<22} {'problem':<44} {'torch ms':>9} {'rawconv ms':>10} {'ratio':>6} "
                  f"{'own graph':>9} {'cold s':>6} {'warm s':>7} {'cands':>5}  best config [notes]", flush=True)
            for p in layers(args.batch, dtype, layout, args.layers, args.only):
                x, w, _ = p.make_inputs(seed=0, device="cuda")
                w = to_layout(w, layout)
                torch.backends.cudnn.benchmark = True
                torch.backends.cudnn.allow_tf32 = tf32
                pad = p.torch_padding
                f_torch = lambda: F.conv2d(x, w, None, p.stride, pad, p.dilation, p.groups)  # noqa: E731
                for _ in range(3):
                    f_torch()  # the first call runs torch's own benchmark search
                plan = G.GraphConvolution(x, w, None, p.stride, pad, p.dilation, p.groups, allow_tf32=tf32)
                t0 = time.perf_counter()
                relayout = args.relayout and layout == "nchw"
                try:
                    table = plan.autotune(budget_s=args.budget, patience=args.patience, relayout=relayout,
                                          seed_from_cache=not args.no_cache_seeds)
                except Exception as exc:  # report and go on
                    print(f"{p.name:<22} autotune failed: {exc}", flush=True)
                    results.append({"layer": p.name, "mode": mode, "layout": layout, "error": str(exc)})
                    continue
                cold = time.perf_counter() - t0
                y = torch.empty_like(f_torch())
                fns = {"torch": f_torch, "rawconv": lambda: plan.execute(x, w, out=y)}
                own = next((r for r in table if r.status == "ok" and not r.layout), None)
                plan_own = None
                if table[0].layout and own is not None:  # the best of the layer's own graph, same rounds
                    plan_own = G.GraphConvolution(x, w, None, p.stride, pad, p.dilation, p.groups,
                                                  allow_tf32=tf32, engine=own.config)
                    y_own = torch.empty_like(y)
                    fns["own graph"] = lambda: plan_own.execute(x, w, out=y_own)
                times = interleaved(fns, args.iters)
                t_torch, t_raw = times["torch"], times["rawconv"]
                t_own = times.get("own graph", t_raw if not table[0].layout else float("nan"))
                plan2 = G.GraphConvolution(x, w, None, p.stride, pad, p.dilation, p.groups, allow_tf32=tf32)
                t0 = time.perf_counter()
                table2 = plan2.autotune(budget_s=args.budget, patience=args.patience, relayout=relayout,
                                        seed_from_cache=not args.no_cache_seeds)
                warm = time.perf_counter() - t0
                if table2[0].phase != "cache":
                    print(f"  (warning: the second autotune of {p.name} did not hit the tuning cache)", flush=True)
                best = table[0]
                ratio = t_torch / t_raw
                ratios.append(ratio)
                own_ratios.append(t_torch / t_own)
                n_ok = sum(r.status == "ok" for r in table)
                phase_s = defaultdict(float)
                for r in table:
                    phase_s[r.phase] += r.seconds
                print(f"{p.name:<22} {p.describe()[:44]:<44} {t_torch:9.4f} {t_raw:10.4f} {ratio:6.2f} "
                      f"{t_torch / t_own:9.2f} {cold:6.1f} {warm:7.3f} {n_ok:>5}  {best.name} "
                      f"[{','.join(best.config.numerical_notes)}] ({best.phase})", flush=True)
                results.append({"layer": p.name, "mode": mode, "layout": layout, "problem": p.describe(),
                                "torch_ms": t_torch, "rawconv_ms": t_raw, "ratio": ratio, "cold_s": cold,
                                "relayout": relayout, "own_graph_ms": t_own, "own_graph_ratio": t_torch / t_own,
                                "warm_s": warm, "best": best.name, "best_phase": best.phase,
                                "best_detail": best.detail,
                                "notes": list(best.config.numerical_notes), "candidates_ok": n_ok,
                                "candidates": len(table),
                                "mismatches": sum(r.status == "mismatch" for r in table),
                                "mismatch_configs": [r.name for r in table if r.status == "mismatch"][:20],
                                "seconds_by_phase": dict(phase_s),
                                "statuses": dict(Counter(r.status for r in table)),
                                "best_by_engine": best_by_engine(table)})
                plan.free()
                plan2.free()
                if plan_own is not None:
                    plan_own.free()
                if args.json:  # after every layer, so that a run cut short keeps what it measured
                    with open(args.json, "w") as f:
                        json.dump(results, f, indent=1)
            if ratios:
                print(f"geomean torch/rawconv {mode} {layout}: {geomean(ratios):.3f}  (min {min(ratios):.2f}, "
                      f"{len(ratios)} layers; own graph only: {geomean(own_ratios):.3f})", flush=True)
    if not args.no_overhead:
        print("\n## per-call host overhead (µs, tiny fp16 NHWC problem, back-to-back calls, best of 5 x 3000)")
        oh = host_overhead()
        for k, v in oh.items():
            print(f"{k:<48} {v:7.2f} µs")
        results.append({"host_overhead_us": oh})
    return results


def best_by_engine(table, n: int = 8) -> dict:
    """The fastest "ok" row of each engine (graph prefix kept), the ``n`` fastest engines: name -> ms."""
    best = {}
    for r in table:
        if r.status != "ok":
            continue
        key = ("nhwc:" if r.layout else "") + f"eng{r.config.engine}"
        if key not in best or r.median_ms < best[key][1]:
            best[key] = (r.name, r.median_ms)
    return dict(sorted(best.values(), key=lambda v: v[1])[:n])


def geomean(values) -> float:
    from rawconv.bench import geomean as g
    return g(values)


def _lay(r: dict) -> str:
    """A result's layout column: "nhwc", "nchw" or "nchw+relayout"."""
    return r["layout"] + ("+relayout" if r.get("relayout") else "")


def _pair_order(key) -> tuple:
    """Sort key of a (precision, layout) pair: precisions in MODES order."""
    return list(MODES).index(key[0]), key[1]


def _table(title: str, cols):
    from rich.table import Table

    t = Table(title=title)
    for col in cols:
        t.add_column(col, justify="right" if col not in ("precision", "layout") else "left")
    return t


def summary(results: list) -> None:
    """Per (precision, layout): geomean, min and max ratio, layers below 1.0, cold/warm autotune s."""
    from rich.console import Console

    rows = [r for r in results if "ratio" in r]
    failed = [r for r in results if "error" in r]
    t = _table("torch (cudnn.benchmark=True) time / rawconv.cudnn_graph autotuned time",
               ("precision", "layout", "layers", "geomean", "min", "max", "below 1.0", "own graph geomean",
                "cold s (median/max)", "warm s (max)"))
    keys = sorted({(r["mode"], _lay(r)) for r in rows}, key=_pair_order)
    for mode, layout in keys:
        rs = [r for r in rows if r["mode"] == mode and _lay(r) == layout]
        own = [r.get("own_graph_ratio", float("nan")) for r in rs]
        own_s = f"{geomean(own):.3f}" if all(o == o for o in own) else "-"
        ratios = [r["ratio"] for r in rs]
        below = [f"{r['layer']} {r['ratio']:.2f}" for r in rs if r["ratio"] < 1.0]
        cold = [r["cold_s"] for r in rs]
        t.add_row(mode, layout, str(len(rs)), f"{geomean(ratios):.3f}", f"{min(ratios):.2f}", f"{max(ratios):.2f}",
                  f"{len(below)}" + (f": {', '.join(below)}" if below else ""), own_s,
                  f"{statistics.median(cold):.1f} / {max(cold):.1f}", f"{max(r['warm_s'] for r in rs):.3f}")
    Console(width=200).print(t)
    for r in failed:
        print(f"failed: {r['mode']} {r['layout']} {r['layer']}: {r['error'][:200]}")
    for r in results:
        if "host_overhead_us" in r:
            print("host overhead per call (µs): " + ", ".join(f"{k} {v:.2f}" for k, v in r["host_overhead_us"].items()))


def best_of(results: list) -> None:
    """Per (precision, layout): geomean over layers of median torch ms over the runs / the lowest
    rawconv ms of any run. Runs may come from different processes and GPUs of one kind."""
    from rich.console import Console

    by = defaultdict(lambda: defaultdict(list))
    for r in results:
        if "ratio" in r:
            by[(r["mode"], _lay(r))][r["layer"]].append((r["torch_ms"], r["rawconv_ms"]))
    t = _table("median torch time / fastest rawconv time of any run (per layer), geometric mean",
               ("precision", "layout", "layers", "runs per layer", "geomean", "min", "max"))
    for (mode, lay), layers in sorted(by.items(), key=lambda kv: _pair_order(kv[0])):
        ratios = [statistics.median(t for t, _ in v) / min(x for _, x in v) for v in layers.values()]
        runs = sorted({len(v) for v in layers.values()})
        t.add_row(mode, lay, str(len(layers)), "-".join(map(str, (runs[0], runs[-1]))) if len(runs) > 1
                  else str(runs[0]), f"{geomean(ratios):.3f}", f"{min(ratios):.2f}", f"{max(ratios):.2f}")
    Console(width=200).print(t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--budget", type=float, default=8.0, help="autotune seconds per layer (cold)")
    ap.add_argument("--patience", type=int, default=300, help="autotune(patience=): candidates without gain")
    ap.add_argument("--layers", type=int, default=23)
    ap.add_argument("--only", default=None, help="comma-separated layer names")
    ap.add_argument("--modes", default="fp32,tf32,fp16,bf16")
    ap.add_argument("--layouts", default="nhwc,nchw")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-overhead", action="store_true")
    ap.add_argument("--no-cache-seeds", action="store_true",
                    help="autotune(seed_from_cache=False): no layer's search starts from the winners of "
                         "the layers tuned before it")
    ap.add_argument("--relayout", action="store_true",
                    help="NCHW layers: autotune(relayout=True), the channels_last graph's configs compete too")
    ap.add_argument("--summary", nargs="+", default=None, metavar="JSON",
                    help="print one summary table from earlier --json outputs and exit")
    ap.add_argument("--best-of", action="store_true",
                    help="with --summary over several runs of the same layers: also the ratio of the median "
                         "torch time to the fastest rawconv time any run found, per layer (how far a search "
                         "that always found the best config seen would go)")
    args = ap.parse_args(argv)
    if args.summary:
        results = []
        for path in args.summary:
            with open(path) as f:
                results += json.load(f)
        summary(results)
        if args.best_of:
            best_of(results)
        return 0
    results = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print()
    summary(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
