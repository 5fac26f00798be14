"""The first training step of ResNet-50 (fp32, TF32 off, batch 32, channels_last, CUDA): how far each
parameter's gradient moves from torch's (with cudnn.benchmark) for

* torch again (cudnn.benchmark's nondeterministic kernels alone), torch without cudnn.benchmark, torch
  on NCHW (only cuDNN's kernels change: the spread a correct implementation with other kernels shows);
* rawconv.nn.convert(model) (graph API), the same without the graph plans' hot packs, and with
  backend="cudnn" (the legacy API).

Per variant the worst four parameters by normwise relative error ||g - g_torch|| / ||g_torch||.

    python benchmarks/diag_train_grads.py

H200, torch 2.11, cuDNN 9.19 (2026-12-03): torch again 1.5e-5, without benchmark 2.8e-5, NCHW
2.6e-2 .. 2.8e-2; rawconv 2.0e-2 .. 2.2e-2, without hot packs the same, legacy API 1.2e-2 .. 1.4e-2.
"""
from __future__ import annotations

import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rawconv.cudnn_graph as G  # noqa: E402
import rawconv.nn as rnn  # noqa: E402
from bench_resnet50 import build_resnet50  # noqa: E402


def grads(model, x, t, benchmark=True):
    torch.backends.cudnn.benchmark = benchmark
    loss = torch.nn.functional.cross_entropy(model(x), t)
    loss.backward()
    return {n: p.grad.double() for n, p in model.named_parameters()}


def main():
    torch.backends.cudnn.allow_tf32 = False
    m, _ = build_resnet50()
    m = m.train().cuda().to(memory_format=torch.channels_last)
    x = torch.randn(32, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    t = torch.randint(0, 1000, (32,), device="cuda")
    ref = grads(copy.deepcopy(m), x, t)
    variants = {
        "torch again": lambda: grads(copy.deepcopy(m), x, t),
        "torch, cudnn.benchmark off": lambda: grads(copy.deepcopy(m), x, t, benchmark=False),
        "torch on NCHW": lambda: grads(copy.deepcopy(m).to(memory_format=torch.contiguous_format), x.contiguous(), t),
        "rawconv": lambda: grads(rnn.convert(copy.deepcopy(m)), x, t),
        "rawconv, legacy API": lambda: grads(rnn.convert(copy.deepcopy(m), backend="cudnn"), x, t),
    }
    for label, run in variants.items():
        g = run()
        errs = sorted(((g[n] - r).norm().item() / r.norm().item(), n) for n, r in ref.items())
        print(f"{label:28s} worst normwise: " + ", ".join(f"{e:.1e} {n}" for e, n in errs[-4:]), flush=True)
    G._GraphHot.of = classmethod(lambda cls, *a: None)   # no hot packs from here on
    g = grads(rnn.convert(copy.deepcopy(m)), x, t)
    errs = sorted(((g[n] - r).norm().item() / r.norm().item(), n) for n, r in ref.items())
    print(f"{'rawconv, no hot packs':28s} worst normwise: " + ", ".join(f"{e:.1e} {n}" for e, n in errs[-4:]))


if __name__ == "__main__":
    main()
