"""rawconv's autotuned oneDNN implementation (weights prepacked once) vs torch.nn.functional.conv2d.

One process, same thread count for both, fp32, ResNet-50's distinct convolutions at batch 8 (by
default), NCHW and channels_last (both sides get the same layout). Per layer it prints torch's
time, rawconv's time (median ms) and the ratio torch / rawconv; then the geometric mean per
layout; then the per-call host overhead of a cached plan and of ``rawconv.onednn.forward`` against
``F.conv2d`` on a tiny convolution.

The timed rawconv call is ``Convolution.execute(x)`` with src/dst reorders (when the chosen
implementation wants another layout) counted in the time; the search tries every implementation
oneDNN offers with ``format_tag any`` and with the tensors' own src/dst layout.

    python benchmarks/bench_onednn.py [--batch 8] [--threads 2] [--layers 0,1,2] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from rawconv import onednn, presets
from rawconv.bench import geomean
from rawconv.problem import abs_reference, compare_to_reference, to_layout


def timeit(fn, iterations, warmup=3):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def bench_layer(p, layout, iterations, rounds):
    x, w, _ = p.make_inputs(seed=0)
    x = to_layout(x, layout)
    if layout == "nhwc":
        w = w.to(memory_format=torch.channels_last)   # as model.to(memory_format=channels_last) does
    pad = p.pad_before
    torch_fn = lambda: F.conv2d(x, w, None, p.stride, pad, p.dilation, p.groups)  # noqa: E731
    conv = onednn.Convolution(x, w, None, p.stride, pad, p.dilation, p.groups, prepack=True)
    t0 = time.perf_counter()
    rows = conv.autotune(iterations=max(3, iterations // 2), warmup=2)
    tune_s = time.perf_counter() - t0
    y = conv.execute(x)
    err = compare_to_reference(p, y, p.reference(x, w), abs_reference(p, x, w))
    assert err.ok, f"{p.name}: rawconv result outside tolerance: {err}"
    assert y.is_contiguous(memory_format=torch.channels_last if layout == "nhwc" else torch.contiguous_format)
    raw_fn = lambda: conv.execute(x)  # noqa: E731
    # interleave the two sides over several rounds and keep each side's best median
    t_torch, t_raw = [], []
    for _ in range(rounds):
        t_torch.append(timeit(torch_fn, iterations))
        t_raw.append(timeit(raw_fn, iterations))
    conv.free()
    return min(t_torch), min(t_raw), rows[0].impl, tune_s


def overhead(n=3000):
    x = torch.randn(1, 4, 6, 6)
    w = torch.randn(4, 4, 1, 1)
    conv = onednn.Convolution(x, w, prepack=True)
    conv.autotune(iterations=20)
    out = {}
    for name, fn in (("F.conv2d", lambda: F.conv2d(x, w)), ("rawconv plan.execute", lambda: conv.execute(x)),
                     ("rawconv.onednn.forward", lambda: onednn.forward(x, w, impl=conv.selected))):
        for _ in range(200):
            fn()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        out[name] = best
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", default=None, help="comma-separated indices or names (default: all 23)")
    ap.add_argument("--layouts", default="nchw,nhwc")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    problems = presets.resnet50(args.batch)
    if args.layers:
        sel = args.layers.split(",")
        problems = [p for i, p in enumerate(problems) if str(i) in sel or p.name in sel]
    info = onednn.info()
    print(f"oneDNN {info['version']} ({info['cpu_isa']}), torch {torch.__version__} "
          f"(oneDNN {torch.__config__.show().split('MKL-DNN v')[1].split()[0] if 'MKL-DNN v' in torch.__config__.show() else '?'}),"
          f" {torch.get_num_threads()} threads, batch {args.batch}, fp32")
    results = {}
    for layout in args.layouts.split(","):
        print(f"\n== {layout} ==")
        print(f"{'layer':<24}{'shape':<44}{'torch ms':>10}{'rawconv ms':>12}{'ratio':>8}  implementation (tune s)")
        ratios, rows = [], []
        for p in problems:
            tt, tr, impl, tune_s = bench_layer(p, layout, args.iterations, args.rounds)
            ratio = tt / tr
            ratios.append(ratio)
            shape = f"x{p.x_shape} w{p.w_shape} s{p.stride[0]}"
            print(f"{p.name:<24}{shape:<44}{tt:>10.3f}{tr:>12.3f}{ratio:>8.2f}  {impl.name} ({impl.layouts}) ({tune_s:.1f})",
                  flush=True)
            rows.append({"layer": p.name, "torch_ms": tt, "rawconv_ms": tr, "ratio": ratio, "impl": impl.name,
                         "layouts": impl.layouts, "tune_s": tune_s})
        gm = geomean(ratios)
        print(f"{layout}: geometric mean torch/rawconv = {gm:.2f}, min {min(ratios):.2f}, max {max(ratios):.2f}, "
              f"layers below 0.95: {sum(r < 0.95 for r in ratios)}")
        results[layout] = {"geomean": gm, "rows": rows}
    ov = overhead()
    print("\nper-call host time on a tiny conv x(1,4,6,6) w(4,4,1,1), best of 5 x 3000 calls:")
    for k, v in ov.items():
        print(f"  {k:<26} {v:7.2f} us")
    print(f"  plan.execute / F.conv2d = {ov['rawconv plan.execute'] / ov['F.conv2d']:.2f}")
    results["overhead_us"] = ov
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
