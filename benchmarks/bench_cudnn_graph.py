"""rawconv.cudnn_graph (autotuned engine configs) against torch with cudnn.benchmark=True, on the H200.

One process. For each precision (fp32 IEEE, TF32, fp16, bf16) and each ResNet-50 layer (batch 32,
channels_last by default): torch's time with ``torch.backends.cudnn.benchmark = True`` (and
``allow_tf32`` as the precision says), rawconv's autotuned best (budget per layer), both timed
with CUDA events (:func:`rawconv.bench.time_cuda`, medians), the ratio torch / rawconv, the
geometric mean per precision, the autotune seconds per layer cold and warm (tuning-cache hit), and
the per-call host overhead of a cached plan against ``F.conv2d``.

    python benchmarks/bench_cudnn_graph.py [--budget 8] [--layers 6] [--layouts nhwc,nchw] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

from rawconv import cudnn_graph as G
from rawconv.bench import geomean, time_cuda
from rawconv.problem import to_layout

try:
    from rawconv.presets import resnet50
except ImportError:  # pragma: no cover
    resnet50 = None

# six layers as in shared/LIBRARY-FACTS.md's probe, then the rest of ResNet-50 in network order
PREFERRED = ["layer1.0.conv1", "layer1.0.conv2", "layer1.0.conv3", "layer2.0.conv2", "layer3.1.conv2",
             "layer4.0.conv3"]
MODES = {"fp32": ("float32", False), "tf32": ("float32", True), "fp16": ("float16", False),
         "bf16": ("bfloat16", False)}


def layers(batch: int, dtype: str, layout: str, count: int):
    probs = resnet50(batch, dtype=dtype, layout=layout)
    byname = {p.name: p for p in probs}
    order = [byname[n] for n in PREFERRED if n in byname] + [p for p in probs if p.name not in PREFERRED]
    return order[:count]


def timed(fn, iters: int) -> float:
    """Median GPU ms per call: CUDA events (time_cuda) around groups of back-to-back calls, so that
    a short kernel is not timed together with its launch (same method for torch and rawconv)."""
    return G._time_reps(time_cuda, fn, iters, warmup=3).median_ms


def torch_time(x, w, p, tf32: bool, iters: int) -> float:
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = tf32
    pad = p.torch_padding
    fn = lambda: F.conv2d(x, w, None, p.stride, pad, p.dilation, p.groups)  # noqa: E731
    for _ in range(3):
        fn()  # the first call runs torch's own benchmark search
    return timed(fn, iters)


def host_overhead(n: int = 2000) -> dict:
    """Per-call host time (µs) of back-to-back calls, one synchronize at the end: a tiny fp16 NHWC
    problem so that the GPU is never the bottleneck."""
    x = to_layout(torch.randn(1, 8, 8, 8, device="cuda", dtype=torch.float16), "nhwc")
    w = to_layout(torch.randn(8, 8, 1, 1, device="cuda", dtype=torch.float16), "nhwc")
    torch.backends.cudnn.benchmark = True
    plan = G.GraphConvolution(x, w)
    plan.autotune(budget_s=2.0)
    y = torch.empty_like(F.conv2d(x, w))
    out = {}
    for name, fn in (("F.conv2d", lambda: F.conv2d(x, w)),
                     ("rawconv plan.execute(x, w)", lambda: plan.execute(x, w)),
                     ("rawconv plan.execute(x, w, out=y)", lambda: plan.execute(x, w, out=y)),
                     ("rawconv cudnn_graph.forward(x, w, engine=...)",
                      lambda: G.forward(x, w, engine=plan.selected))):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        out[name] = best
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--budget", type=float, default=8.0, help="autotune seconds per layer (cold)")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--modes", default="fp32,tf32,fp16,bf16")
    ap.add_argument("--layouts", default="nhwc")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-overhead", action="store_true")
    args = ap.parse_args(argv)
    if resnet50 is None:
        print("rawconv.presets.resnet50 is missing", file=sys.stderr)
        return 2
    dev = torch.cuda.get_device_name()
    from rawconv import _cudnn

    print(f"# {dev}, torch {torch.__version__}, cuDNN {_cudnn.version()['version']} (torch's: "
          f"{torch.backends.cudnn.version()}), batch {args.batch}, budget {args.budget} s/layer", flush=True)
    results = []
    for layout in args.layouts.split(","):
        for mode in args.modes.split(","):
            dtype, tf32 = MODES[mode]
            ratios = []
            print(f"\n## {mode} {layout}", flush=True)
            print(f"{'layer':<22} {'problem':<44} {'torch ms':>9} {'rawconv ms':>10} {'ratio':>6} "
                  f"{'cold s':>6} {'warm s':>7} {'cands':>5}  best config [notes]", flush=True)
            for p in layers(args.batch, dtype, layout, args.layers):
                x, w, _ = p.make_inputs(seed=0, device="cuda")
                w = to_layout(w, layout)
                t_torch = torch_time(x, w, p, tf32, args.iters)
                plan = G.GraphConvolution(x, w, None, p.stride, p.torch_padding, p.dilation, p.groups,
                                          allow_tf32=tf32)
                t0 = time.perf_counter()
                try:
                    table = plan.autotune(budget_s=args.budget)
                except Exception as exc:  # report and go on
                    print(f"{p.name:<22} autotune failed: {exc}", flush=True)
                    results.append({"layer": p.name, "mode": mode, "layout": layout, "error": str(exc)})
                    continue
                cold = time.perf_counter() - t0
                y = torch.empty_like(F.conv2d(x, w, None, p.stride, p.torch_padding))
                t_raw = timed(lambda: plan.execute(x, w, out=y), args.iters)
                plan2 = G.GraphConvolution(x, w, None, p.stride, p.torch_padding, p.dilation, p.groups,
                                           allow_tf32=tf32)
                t0 = time.perf_counter()
                table2 = plan2.autotune(budget_s=args.budget)
                warm = time.perf_counter() - t0
                if table2[0].phase != "cache":
                    print(f"  (warning: the second autotune of {p.name} did not hit the tuning cache)", flush=True)
                best = table[0].config
                ratio = t_torch / t_raw
                ratios.append(ratio)
                n_ok = sum(r.status == "ok" for r in table)
                print(f"{p.name:<22} {p.describe()[:44]:<44} {t_torch:9.4f} {t_raw:10.4f} {ratio:6.2f} "
                      f"{cold:6.1f} {warm:7.3f} {n_ok:>5}  {best.name} [{','.join(best.numerical_notes)}]",
                      flush=True)
                results.append({"layer": p.name, "mode": mode, "layout": layout, "problem": p.describe(),
                                "torch_ms": t_torch, "rawconv_ms": t_raw, "ratio": ratio, "cold_s": cold,
                                "warm_s": warm, "best": best.name, "notes": list(best.numerical_notes),
                                "candidates_ok": n_ok, "candidates": len(table),
                                "mismatches": sum(r.status == "mismatch" for r in table)})
                plan.free()
                plan2.free()
            if ratios:
                print(f"geomean torch/rawconv {mode} {layout}: {geomean(ratios):.3f}  (min {min(ratios):.2f}, "
                      f"{len(ratios)} layers)", flush=True)
    if not args.no_overhead:
        print("\n## per-call host overhead (µs, tiny fp16 NHWC problem, back-to-back calls, best of 3)")
        oh = host_overhead()
        for k, v in oh.items():
            print(f"{k:<48} {v:7.2f} µs")
        results.append({"host_overhead_us": oh})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
