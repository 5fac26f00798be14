"""Do the fused model's cuDNN plans write outside their output, or into their inputs?

    python benchmarks/diag_oob.py [--batches 8,32]

For every distinct cuDNN graph plan of convert(resnet50 fp16 channels_last, fuse=True) (default
configs): the output is a view in the middle of a larger buffer whose 4 MiB before and after hold
a sentinel; x, w, bias and the residual are compared with copies after the call. Prints the bytes
changed outside the output (first and last offsets) and any input changed.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys

import torch

if __package__ in (None, ""):
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rawconv.nn as rnn  # noqa: E402
from rawconv import cudnn_graph as G  # noqa: E402
from rawconv import fused as F  # noqa: E402
from rawconv.problem import dense_strides  # noqa: E402
from bench_resnet50 import build_resnet50  # noqa: E402

PAD = 4 << 20   # bytes of sentinel each side
SENTINEL = 0x5A


def in_buffer(shape, dtype):
    """(buffer uint8, view of shape in channels_last strides starting at PAD)."""
    n = 1
    for s in shape:
        n *= s
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    buf = torch.full((PAD + nbytes + PAD,), SENTINEL, dtype=torch.uint8, device="cuda")
    view = buf[PAD:PAD + nbytes].view(dtype).as_strided(shape, dense_strides(shape, "nhwc"))
    return buf, view, nbytes


def check(plan, residual, batch_label):
    p = plan.problem
    g = torch.Generator(device="cuda").manual_seed(3)
    cl = torch.channels_last
    x = torch.randn(p.x_shape, device="cuda", dtype=torch.half, generator=g).contiguous(memory_format=cl)
    w = (torch.randn(p.w_shape, device="cuda", dtype=torch.half, generator=g) * 0.05).contiguous(memory_format=cl)
    b = torch.randn(p.k, device="cuda", dtype=torch.half, generator=g)
    r = torch.randn(p.y_shape, device="cuda", dtype=torch.half, generator=g).contiguous(memory_format=cl) \
        if residual else None
    copies = [t.clone() for t in (x, w, b) + ((r,) if residual else ())]
    buf, y, nbytes = in_buffer(p.y_shape, torch.half)
    ref = (plan.run(x, w, b, r) if residual else plan.execute(x, w, b)).clone()
    (plan.run(x, w, b, r, out=y) if residual else plan.execute(x, w, b, out=y))
    torch.cuda.synchronize()
    before = (buf[:PAD] != SENTINEL).nonzero()
    after = (buf[PAD + nbytes:] != SENTINEL).nonzero()
    changed = [name for name, t, c in zip(("x", "w", "b", "r"), (x, w, b, r), copies) if not torch.equal(t, c)]
    same = torch.equal(y, ref)
    msg = []
    if before.numel():
        msg.append(f"{before.numel()} B before (from -{PAD - before[0].item()} to -{PAD - before[-1].item()})")
    if after.numel():
        msg.append(f"{after.numel()} B after (offsets +{after[0].item()} .. +{after[-1].item()})")
    if changed:
        msg.append("inputs changed: " + ",".join(changed))
    if not same:
        msg.append(f"out= result differs from the plain call by {(y.float() - ref.float()).abs().max().item():.2e}")
    print(f"{batch_label} {'res ' if residual else 'conv'} {p.describe()[:58]:58s} {plan.selected_name:24s} "
          f"y {nbytes} B: " + ("; ".join(msg) if msg else "clean"), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="8,32")
    args = ap.parse_args()
    base, src = build_resnet50()
    base = base.cuda().half().to(memory_format=torch.channels_last)
    for batch in (int(b) for b in args.batches.split(",")):
        F.clear_cache()
        x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.half).contiguous(
            memory_format=torch.channels_last)
        m = rnn.convert(copy.deepcopy(base), fuse=True)
        with torch.no_grad():
            m(x)
        seen = set()
        for key, plan in list(F._gpu_plans._plans.items()):
            if isinstance(plan, G.GraphConvolution) and id(plan) not in seen:
                seen.add(id(plan))
                check(plan, key[1], f"b{batch}")


if __name__ == "__main__":
    main()
