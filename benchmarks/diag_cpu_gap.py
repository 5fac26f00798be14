"""Where rawconv's CPU models lose to torch.compile with inductor freezing: the convolutions
(library version, implementation, reorders, post-ops) or everything else (the ops inductor fuses).

    python3 benchmarks/diag_cpu_gap.py --threads 8 --batch 4 --models resnet50,convnext_tiny,efficientnet_b0

For each model (random weights, fp32, channels_last, eval, no grad), in one process:

* wall time per batch (interleaved rounds, median and min) of torch eager, torch.compile with
  freezing (the CPU peer), rawconv ``convert(fuse=True, autotune=x)`` eager, the same under
  torch.compile, and under torch.compile with freezing;
* a profile of the compiled-and-frozen torch model and of the compiled rawconv model: the CPU time
  of their convolution ops (torch: ``mkldnn::_convolution_pointwise`` and friends, the prepacked
  oneDNN 3.x calls freezing makes; rawconv: ``rawconv::*``) against everything else, per batch.
  The convolutions' difference is the library and rawconv's use of it; the rest is the
  surrounding ops.
"""
from __future__ import annotations

import argparse
import collections
import copy
import statistics
import sys
import time
import traceback
import warnings

import torch

T0 = time.perf_counter()


def say(*a):
    print(f"[{time.perf_counter() - T0:7.1f}s]", *a, flush=True)


def build(name: str):
    import timm
    import torchvision

    if name in ("resnet50", "efficientnet_b0", "mobilenetv3_large_100", "convnext_tiny", "regnety_016"):
        return timm.create_model(name, pretrained=False)
    return getattr(torchvision.models, name)(weights=None)


def rounds(fns: dict, x, n_rounds: int = 5, per: int = 3) -> dict:
    times = {k: [] for k in fns}
    for _ in range(n_rounds):
        for k, fn in fns.items():
            for _ in range(per):
                t0 = time.perf_counter()
                fn(x)
                times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: (statistics.median(v), min(v)) for k, v in times.items()}


def is_conv(name: str) -> bool:
    n = name.lower()
    return n.startswith("rawconv::") or "convolution" in n or n.startswith("mkldnn::") and "conv" in n


def profile_split(fn, x, reps: int = 5) -> tuple[float, float, dict]:
    """(conv ms, other ms, {conv op name: ms}) per batch, from the self CPU time of profiled ops."""
    from torch.profiler import ProfilerActivity, profile

    fn(x)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn(x)
        wall = (time.perf_counter() - t0) * 1e3 / reps
    conv = collections.Counter()
    for e in prof.key_averages():
        if is_conv(e.key):
            conv[e.key] += e.self_cpu_time_total / 1e3 / reps
    c = sum(conv.values())
    return c, wall - c, dict(conv.most_common(6))


def run_model(name: str, a) -> None:
    import rawconv
    import rawconv.nn

    torch.manual_seed(0)
    m = build(name).eval().to(memory_format=torch.channels_last)
    x = torch.randn(a.batch, 3, a.size, a.size).to(memory_format=torch.channels_last)
    fns = {"torch eager": m}
    with torch.no_grad():
        import torch._inductor.config as ic

        ic.freezing = True
        frozen = torch.compile(copy.deepcopy(m))
        frozen(x)
        ic.freezing = False
        fns["compile+freezing"] = frozen
        t = time.perf_counter()
        r = rawconv.nn.convert(m, fuse=True, autotune=x, autotune_budget_s=a.budget)
        say(f"{name}: convert(fuse, autotune) {time.perf_counter() - t:.1f} s")
        r(x)
        fns["rawconv eager"] = r
        rc = torch.compile(r)
        rc(x)
        fns["rawconv compiled"] = rc
        ic.freezing = True
        try:
            rf = torch.compile(copy.deepcopy(r))
            rf(x)
            fns["rawconv compiled+freezing"] = rf
        except Exception as exc:  # noqa: BLE001
            say(f"{name}: rawconv under compile+freezing: {type(exc).__name__}: {str(exc)[:200]}")
        finally:
            ic.freezing = False
        ref = m(x)
        for k, fn in fns.items():
            y = fn(x)
            err = ((y - ref).abs().max() / ref.abs().max()).item()
            if err > 1e-3:
                say(f"{name}: {k} differs from torch eager by {err:.2e}")
        res = rounds(fns, x)
        peer = res["compile+freezing"][0]
        for k, (med, mn) in res.items():
            say(f"{name:18s} {k:28s} median {med:8.2f} ms  min {mn:8.2f}  peer/this {peer / med:.3f}x")
        for k in ("compile+freezing", "rawconv eager", "rawconv compiled"):
            c, o, top = profile_split(fns[k], x)
            say(f"{name:18s} profile {k:20s} conv ops {c:8.2f} ms  other {o:8.2f} ms  "
                + "; ".join(f"{n} {v:.2f}" for n, v in top.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,convnext_tiny,efficientnet_b0")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--budget", type=float, default=0.3)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    import rawconv

    say(f"torch {torch.__version__}, threads {a.threads}, rawconv oneDNN {rawconv.onednn.capabilities()!s:.60}")
    for name in a.models.split(","):
        try:
            run_model(name, a)
        except Exception:  # noqa: BLE001
            say(f"{name} failed:\n{traceback.format_exc()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
