"""What reordering the weights on every call costs a training step (issue 13's prepack decision).

A small CNN on rawconv.nn (CPU, one process, ``--threads`` torch/oneDNN threads) is trained for
``--steps`` SGD steps (forward, cross-entropy, backward, update) on random 32x32 images; the time
per step (median and min over the steps after ``--warmup``) is printed for two models:

* ``plain``: ``rawconv.nn.Conv2d`` + ReLU layers (through ``rawconv.ops``);
* ``fused``: ``rawconv.nn.ConvBiasAct2d`` layers (conv + bias + ReLU as one oneDNN primitive,
  through ``rawconv.fused``'s function form / operator).

Run it against two trees to compare them (the rawconv it imports is printed)::

    PYTHONPATH=/path/to/before python benchmarks/bench_prepack_cost.py
    PYTHONPATH=/path/to/after  python benchmarks/bench_prepack_cost.py

``--cache`` (only on a tree that still has the old weight cache: ``onednn._WCHECK``) makes every
plan the training path uses keep reordered weights across calls (``prepack=True``), which is what
a "prepack cache" on the training path would save at most.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

if __package__ in (None, "") and not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rawconv  # noqa: E402
import rawconv.nn as rnn  # noqa: E402
from rawconv import onednn  # noqa: E402


def model(kind: str) -> nn.Module:
    conv = {"plain": lambda *a, **k: nn.Sequential(rnn.Conv2d(*a, **k), nn.ReLU()),
            "fused": lambda *a, **k: rnn.ConvBiasAct2d(*a, **k)}[kind]
    return nn.Sequential(conv(3, 32, 3, padding=1), conv(32, 64, 3, padding=1, stride=2),
                         conv(64, 64, 3, padding=1), conv(64, 128, 3, padding=1, stride=2),
                         conv(128, 128, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))


def time_steps(kind: str, steps: int, warmup: int, batch: int, seed: int = 0) -> list[float]:
    torch.manual_seed(seed)
    m = model(kind)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 32, 32)
    t = torch.randint(0, 10, (batch,))
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(m(x), t)
        loss.backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="plain,fused")
    ap.add_argument("--cache", action="store_true", help="training-path plans keep reordered weights (old tree only)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    label = "the tree's own weight handling"
    if args.cache:
        if not hasattr(onednn, "_WCHECK"):
            print("--cache needs a tree with the old weight cache (onednn._WCHECK)", file=sys.stderr)
            return 2
        orig = onednn.Convolution.from_problem.__func__

        def from_problem(cls, problem, **kw):
            kw["prepack"] = True
            return orig(cls, problem, **kw)
        onednn.Convolution.from_problem = classmethod(from_problem)
        label = "weights cached across calls (old prepack cache on every plan)"
    print(f"rawconv from {os.path.dirname(rawconv.__file__)}; torch {torch.__version__}; {args.threads} thread(s); "
          f"batch {args.batch}; {label}")
    for kind in args.models.split(","):
        ts = time_steps(kind, args.steps, args.warmup, args.batch)
        print(f"  {kind:<6} ms/step: median {statistics.median(ts) * 1e3:.2f}  min {min(ts) * 1e3:.2f}  "
              f"({len(ts)} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
