"""Device diagnostic (issue 33/38: the zoo's regnety_016 training step, H100 2026-12-07: rawconv 68.7 ms
of GPU time against torch's 30.2): where a converted model's training step spends its GPU time, beside
torch's, kernel by kernel (torch.profiler), for one zoo model built as benchmarks/zoo.py builds it.

    python benchmarks/diag_train_gpu.py --model regnety_016 [--batch 32] [--steps 3] [--top 25]
"""
import argparse
import copy
import os
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo  # noqa: E402
import rawconv.nn as rnn  # noqa: E402


def model_and_input(steps: int, top: int):
    """``(args, model, x)``: the command line (``--model --batch --size --steps --top``), the zoo model
    built as benchmarks/zoo.py builds it (random weights, randomized, train mode, on CUDA, channels_last)
    and its input; ``cudnn.benchmark`` on. Shared with diag_train_host_gpu.py."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="regnety_016")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--top", type=int, default=top)
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    spec = {**zoo.SPECS, **zoo.EXTRA_SPECS}[a.model]
    torch.manual_seed(0)
    model = spec.build()
    zoo.randomize(model)
    shape = zoo.input_shape(spec.kind, a.batch, a.size)
    fmt = zoo.memory_format(len(shape))
    model = model.train().cuda().to(memory_format=fmt)
    return a, model, torch.randn(shape, device="cuda").contiguous(memory_format=fmt)


def main():
    a, model, x = model_and_input(steps=3, top=25)
    sides = {"torch": copy.deepcopy(model), "torch_benchmark_off": copy.deepcopy(model),
             "rawconv": rnn.convert(copy.deepcopy(model))}

    def step(m):
        with torch.autocast("cuda", dtype=torch.float16):
            out = zoo.first_tensor(m(x))
        F.mse_loss(out.float(), torch.zeros_like(out, dtype=torch.float32)).backward()
        m.zero_grad(set_to_none=True)

    for name, m in sides.items():
        torch.backends.cudnn.benchmark = name != "torch_benchmark_off"
        for _ in range(3):
            step(m)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(a.steps):
                step(m)
            torch.cuda.synchronize()
        ev = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        total = sum(e.self_device_time_total for e in ev) / a.steps / 1e3
        print(f"== {name}: {total:.3f} ms of kernel time per step ({a.model}, b{a.batch}, autocast fp16)", flush=True)
        for e in sorted(ev, key=lambda e: -e.self_device_time_total)[:a.top]:
            print(f"{e.self_device_time_total / a.steps / 1e3:9.3f} ms {e.count // a.steps:5d}x  {e.key[:150]}")
    torch.backends.cudnn.benchmark = True
    print(rnn.describe(sides["rawconv"], x, timing=False), flush=True)


if __name__ == "__main__":
    main()
