"""A converted model in eager mode against the same under torch.compile (inductor freezing), on the CPU,
in one process (issue 33: "rawconv under torch.compile never slower than rawconv eager").

Per model: ``rawconv.nn.convert(model, fuse=True, autotune=x)`` once; a deep copy of it (the same
autotuned choices and fusion decisions, its own plans) for each side of the comparison:

  before   plans made as before commit "share each layer's plan": each layer's eager and compiled
           calls make a plan each (two reordered weight copies per layer)
  after    this tree: one plan per layer and problem, whichever way it is called

Rows, every one called once per round in turn (median and min over rounds, ms per batch):
torch.compile of the model (the peer), then per side its eager and compiled calls, and
``after compiled, no NaN guard`` (the same compiled graph with the fused ReLUs' NaN guard switched
off on its plans, a diagnostic only: it shows what the guard's reads of x cost, the results may
then differ from torch eager for NaN or infinite inputs). Then per compiled/eager: the guard's
reads of x (and of a residual) per batch and the plans per fused layer.

    python benchmarks/bench_compile_cpu.py --models resnet50,efficientnet_b0 --threads 2 --batch 2 --size 160

On a busy machine compare the min columns and the ratios; say the load.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rawconv.nn as rnn  # noqa: E402
from rawconv.onednn.fused import FusedConvolution  # noqa: E402
from rawconv.pytorch import fused as fu, fused_plans as fp  # noqa: E402


def build(name: str):
    if name in ("resnet50", "resnet18"):
        import torchvision
        return getattr(torchvision.models, name)(weights=None)
    import timm
    return timm.create_model(name, pretrained=False)


def compiled(m, x):
    import torch._inductor.config as icfg

    c = torch.compile(m, options={"freezing": True})
    with icfg.patch(freezing=True), torch.no_grad():
        c(x)
    return c


def plans_of(m) -> list:
    out = []
    for mod in m.modules():
        d = mod.__dict__.get(fu._FROZEN_PLANS)
        if d is not None:
            out.append(list(d.values()))
    return out


def unshared(fn):
    """``fn`` with plan sharing off (the state before the change) while it runs."""
    def call():
        keep = fp._twin
        fp._twin = lambda *a, **k: None
        try:
            return fn()
        finally:
            fp._twin = keep
    return call


def unguarded(fn, m):
    """``fn`` with the NaN guard of ``m``'s fused plans off while it runs (diagnostic)."""
    def call():
        ps = [p for layer in plans_of(m) for p in layer if isinstance(p, FusedConvolution) and p.nan_guard]
        for p in ps:
            p.nan_guard = False
        try:
            return fn()
        finally:
            for p in ps:
                p.nan_guard = True
    return call


def reads(fn, m) -> int:
    """The NaN guard's reads during one call of ``fn`` (FusedConvolution.bound_reads of ``m``'s plans)."""
    def total():
        return sum(p.bound_reads for layer in plans_of(m) for p in set(layer) if isinstance(p, FusedConvolution))
    r0 = total()
    fn()
    return total() - r0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet50,efficientnet_b0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--size", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--budget", type=float, default=0.05, help="convert's autotune_budget_s")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch}, size {args.size}, fp32 "
          f"channels_last, {args.rounds} rounds; load average {os.getloadavg()[0]:.2f} at start")
    for name in args.models.split(","):
        torch.manual_seed(0)
        model = build(name).eval().to(memory_format=torch.channels_last)
        x = torch.randn(args.batch, 3, args.size, args.size).to(memory_format=torch.channels_last)
        with torch.no_grad():
            rm = rnn.convert(model, fuse=True, autotune=x, autotune_budget_s=args.budget)
        before, after = copy.deepcopy(rm), copy.deepcopy(rm)
        del rm
        peer = compiled(copy.deepcopy(model), x)
        cb = compiled(before, x)   # (its plans are made by the first calls below, sharing off)
        ca = compiled(after, x)
        fns = {"torch.compile (peer)": lambda: peer(x),
               "before eager": unshared(lambda: before(x)), "before compiled": unshared(lambda: cb(x)),
               "after eager": lambda: after(x), "after compiled": lambda: ca(x),
               "after compiled, no NaN guard": unguarded(lambda: ca(x), after)}
        fu._clear_frozen_plans()
        with torch.no_grad():
            for _ in range(2):
                for f in fns.values():
                    f()
            ts = {k: [] for k in fns}
            for _ in range(args.rounds):
                for k, f in fns.items():
                    t0 = time.perf_counter()
                    f()
                    ts[k].append((time.perf_counter() - t0) * 1e3)
            nread = {k: reads(fns[k], after) for k in ("after eager", "after compiled")}
        st = {k: (statistics.median(v), min(v)) for k, v in ts.items()}
        print(f"\n{name}: ms per batch (median / min)")
        for k, (med, mn) in st.items():
            print(f"  {k:30s} {med:9.2f} {mn:9.2f}")
        for side in ("before", "after"):
            e, c = st[f"{side} eager"], st[f"{side} compiled"]
            p = st["torch.compile (peer)"]
            print(f"  {side}: compiled / eager {c[0] / e[0]:.2f}x (min {c[1] / e[1]:.2f}x); "
                  f"torch.compile / compiled {p[0] / c[0]:.2f}x (min {p[1] / c[1]:.2f}x)")
        g = st["after compiled, no NaN guard"]
        print(f"  NaN guard's share of the compiled call: {1 - g[0] / st['after compiled'][0]:.0%} "
              f"(min {1 - g[1] / st['after compiled'][1]:.0%}); reads of x/residual per batch: "
              f"eager {nread['after eager']}, compiled {nread['after compiled']}")
        per = [len({id(p) for p in layer}) for layer in plans_of(before)]
        per_a = [len({id(p) for p in layer}) for layer in plans_of(after)]
        print(f"  plans per fused layer: before {statistics.mean(per):.2f}, after {statistics.mean(per_a):.2f}")
        print(f"  load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
