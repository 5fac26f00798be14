"""What the NaN guard of fused ReLU-family activations costs a converted CPU model, and what the
carried bound (rawconv.core.postops.carry_bound) saves: ``convert(m, fuse=True)`` timed in one
process, in interleaved rounds, three ways:

  carried    the default: each fused result carries a bound of its magnitude; the guard reads x
             only where no fused plan wrote it (the model's input, after a pool, ...)
  per_layer  the guard reads x at every guarded layer (the bound ignored: the behaviour before)
  no_guard   RAWCONV_NAN_GUARD=0: no guard, NaN dropped as torch.compile with inductor freezing does

Prints wall ms per batch (median and min over rounds), the guard's reads of x per batch, and the
ratios to no_guard (the guard's whole cost). CPU only; fp32, channels_last, random weights.

    python benchmarks/bench_nan_guard.py --models resnet50,convnext_tiny,mobilenetv3_large_100 --threads 8
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import rawconv.nn as rnn
from rawconv.onednn import fused as OF


def _model(name):
    import timm
    import torchvision

    if hasattr(torchvision.models, name):
        return getattr(torchvision.models, name)(weights=None)
    return timm.create_model(name, pretrained=False)


def _plans(c):
    from rawconv.onednn.fused import FusedConvolution

    seen = []
    for mod in c.modules():
        for v in vars(mod).values():
            if isinstance(v, dict):
                seen += [p for p in v.values() if isinstance(p, FusedConvolution)]
    return seen


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet50,convnext_tiny,mobilenetv3_large_100")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, b{args.batch} {args.size}x{args.size} fp32 channels_last; "
          f"load average {open('/proc/loadavg').read().split()[0]}")
    real_carried = OF.carried_bound
    for name in args.models.split(","):
        torch.manual_seed(0)
        m = _model(name).eval().to(memory_format=torch.channels_last)
        x = torch.randn(args.batch, 3, args.size, args.size).contiguous(memory_format=torch.channels_last)
        guarded, unguarded = rnn.convert(m, fuse=True), rnn.convert(m, fuse=True)
        variants = {"carried": (guarded, real_carried), "per_layer": (guarded, lambda t: None),
                    "no_guard": (unguarded, real_carried)}
        times = {k: [] for k in variants}
        reads = {}
        with torch.no_grad():
            ref = m(x)
            for k, (mod, cb) in variants.items():   # warm-up, plans made, and the result checked
                OF.carried_bound, OF.NAN_GUARD = cb, k != "no_guard"   # (a plan takes NAN_GUARD when made)
                y = mod(x)
                err = ((y - ref).abs().max() / ref.abs().max()).item()
                assert err < 1e-3, (name, k, err)
            for r in range(args.rounds):
                order = list(variants) if r % 2 == 0 else list(reversed(variants))
                for k in order:
                    mod, cb = variants[k]
                    OF.carried_bound, OF.NAN_GUARD = cb, k != "no_guard"
                    plans = _plans(mod)
                    before = sum(p.bound_reads for p in plans)
                    t = time.perf_counter()
                    mod(x)
                    times[k].append((time.perf_counter() - t) * 1e3)
                    reads[k] = sum(p.bound_reads for p in _plans(mod)) - before
        OF.carried_bound, OF.NAN_GUARD = real_carried, True
        base = statistics.median(times["no_guard"])
        print(f"\n{name}: {len(_plans(guarded))} fused plans")
        for k, v in times.items():
            med = statistics.median(v)
            print(f"  {k:10s} median {med:8.2f} ms  min {min(v):8.2f} ms  reads of x/batch {reads[k]:3d}  "
                  f"no_guard/this {base / med:.3f}x")


if __name__ == "__main__":
    main()
