"""One training step on the CPU: torch eager against ``rawconv.nn.convert(model)`` with the backward
passes' default choices (no pins: on channels-last tensors oneDNN's first choice on the tensors' own
layouts, :meth:`rawconv.onednn.Convolution.first_on_tensor_layouts`) and against the same model with
every layer's forward and backward passes pinned to oneDNN's first choice (``layouts=any``, the default before
2026-12-07), in one process, the three taking turns in rounds (timm models, random weights).

    python benchmarks/bench_train_cpu_defaults.py [--models efficientnet_b0,convnext_tiny] [--batch 1]
        [--size 128] [--threads 2] [--rounds 7]

Per model: ms per step (min and median over the rounds) of each side, and torch / side (above 1:
the side is faster); the step is forward, MSE loss against a fixed random target, backward, SGD with
momentum (as benchmarks/zoo.py's ``train_model``), channels_last, fp32.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings

import torch
import torch.nn.functional as F

import rawconv.nn as rnn
from rawconv import ops
from rawconv.onednn.listing import Listing


def first_choice_pins(model: torch.nn.Module, x: torch.Tensor) -> None:
    """Pin every converted convolution's forward and backward passes to oneDNN's first choice (what
    ran by default before the default took the tensors' own layouts)."""
    seen = []

    def hook(m, inp, out):
        seen.append((m, inp[0].detach()))

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    rule = Listing.first_on_tensor_layouts
    Listing.first_on_tensor_layouts = lambda self: self._first_choice(self.allow_known_bad)
    try:
        for m, xin in seen:
            sel = ops.selected(xin, m.weight.detach(), None, m.stride, m.padding, m.dilation, m.groups)
            m.choice = sel["forward"]
            m.backward_choice = (sel["backward_data"], sel["backward_weights"])
    finally:
        Listing.first_on_tensor_layouts = rule


def main() -> None:
    import timm

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="efficientnet_b0,convnext_tiny")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cl = torch.channels_last
    print(f"torch {torch.__version__}, threads {args.threads}, batch {args.batch}, size {args.size}, fp32, channels_last")
    for name in args.models.split(","):
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False).train().to(memory_format=cl)
        x = torch.randn(args.batch, 3, args.size, args.size).contiguous(memory_format=cl)
        with torch.no_grad():
            tgt = torch.randn_like(copy.deepcopy(model).eval()(x))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sides = {"torch": copy.deepcopy(model), "rawconv": rnn.convert(copy.deepcopy(model)),
                     "rawconv first-choice": rnn.convert(copy.deepcopy(model))}
            first_choice_pins(sides["rawconv first-choice"], x)

        def stepper(m):
            opt = torch.optim.SGD(m.parameters(), lr=1e-4, momentum=0.9)

            def step():
                opt.zero_grad(set_to_none=True)
                F.mse_loss(m(x), tgt).backward()
                opt.step()
            return step

        steps = {k: stepper(m) for k, m in sides.items()}
        for s in steps.values():
            s()
            s()
        ts: dict = {k: [] for k in steps}
        for _ in range(args.rounds):
            for k, s in steps.items():
                t0 = time.perf_counter()
                s()
                ts[k].append((time.perf_counter() - t0) * 1e3)
        med_t = statistics.median(ts["torch"])
        for k, v in ts.items():
            med = statistics.median(v)
            print(f"{name:24s} {k:22s} min {min(v):8.2f} ms  median {med:8.2f} ms  torch/side {med_t / med:5.2f}x "
                  f"(min {min(ts['torch']) / min(v):5.2f}x)", flush=True)


if __name__ == "__main__":
    main()
