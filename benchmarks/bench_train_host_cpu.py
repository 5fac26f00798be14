"""Host cost of one training step's convolution on the CPU: rawconv's module against torch's, in one
process, the rows interleaved in rounds (tiny problem: the library calls take little of the time).

    python benchmarks/bench_train_host_cpu.py [--threads 1] [--rounds 11] [--calls 300]

Rows (µs per call, min and median over the rounds; ratio = torch / rawconv, above 1: rawconv faster):
the forward with grad recorded, forward + backward (``y.backward(gy)``, x and w requiring grad; also for a
module converted with ``autotune=x``, whose pinned choices it runs), and
the two backward kernels alone (rawconv's CPU backward-data plus backward-weights kernels, the ones
its autograd Function calls) against ``torch.ops.aten.convolution_backward`` computing both.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings

import torch

import rawconv.nn as rnn
from rawconv import ops


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cl = torch.channels_last
    x = torch.randn(1, 8, 6, 6).contiguous(memory_format=cl).requires_grad_()
    gy = torch.randn(1, 8, 6, 6).contiguous(memory_format=cl)
    tm = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False).to(memory_format=cl)
    rm = rnn.convert(torch.nn.Conv2d(8, 8, 3, padding=1, bias=False).to(memory_format=cl))
    with torch.no_grad():
        rm.weight.copy_(tm.weight)
    # autotuned (convert(autotune=x): forward and both backward passes searched and pinned)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (a TimingWarning on a busy machine: the choice does not matter here)
        am = rnn.convert(copy.deepcopy(tm).train(), autotune=x.detach())
    w = tm.weight.detach()
    xd = x.detach()
    one = [1, 1]

    def step(m):
        m(x).backward(gy)

    def rawconv_kernels():
        ops._backward_data_cpu(gy, w, [1, 8, 6, 6], one, one, one, one, 1, "auto", "", "strict")
        ops._backward_weights_cpu(xd, gy, [8, 8, 3, 3], one, one, one, one, 1, False, "auto", "", "strict")

    def torch_kernels():
        torch.ops.aten.convolution_backward(gy, xd, w, None, one, one, one, False, [0, 0], 1, [True, True, False])

    pairs = {"forward (grad on)": (lambda: tm(x), lambda: rm(x)),
             "forward + backward": (lambda: step(tm), lambda: step(rm)),
             "fwd + bwd, autotuned": (lambda: step(tm), lambda: step(am)),
             "backward kernels": (torch_kernels, rawconv_kernels)}
    fns = {(row, side): f for row, (ft, fr) in pairs.items() for side, f in (("torch", ft), ("rawconv", fr))}
    for f in fns.values():
        for _ in range(50):
            f()
    res = {k: [] for k in fns}
    for _ in range(args.rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            for _ in range(args.calls):
                f()
            res[k].append((time.perf_counter() - t0) / args.calls * 1e6)
    print(f"torch {torch.__version__}, {args.threads} thread(s), x(1, 8, 6, 6) w(8, 8, 3, 3) padding 1, channels_last; "
          f"{args.rounds} rounds of {args.calls} calls")
    print(f"{'row':20s} {'torch min':>10s} {'rawconv min':>12s} {'torch med':>10s} {'rawconv med':>12s} "
          f"{'ratio (min)':>12s}")
    for row in pairs:
        t, r = res[(row, "torch")], res[(row, "rawconv")]
        print(f"{row:20s} {min(t):10.2f} {min(r):12.2f} {statistics.median(t):10.2f} {statistics.median(r):12.2f} "
              f"{min(t) / min(r):11.2f}x")
    print("µs per call; ratio = torch / rawconv (above 1: rawconv faster)")


if __name__ == "__main__":
    main()
