"""Device diagnostic (issue 38; the zoo's regnety_016 training step, H100 2026-12-07: kernel time equal to
torch's, 17.8 against 17.2 ms, but a step's GPU time 68.7 against 30.2 ms: the host is the limit): the wall
time of one training step of a converted zoo model beside torch's, with and without autocast, and where
rawconv's host time goes (cProfile of a few steps, sorted by own time).

    python benchmarks/diag_train_host_gpu.py --model regnety_016 [--batch 32] [--steps 5]
"""
import copy, cProfile, os, pstats, sys, time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo  # noqa: E402
from diag_train_gpu import model_and_input  # noqa: E402
import rawconv.nn as rnn  # noqa: E402


def main():
    a, model, x = model_and_input(steps=5, top=35)
    sides = {"torch": copy.deepcopy(model), "rawconv": rnn.convert(copy.deepcopy(model))}

    def step(m, amp):
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            out = zoo.first_tensor(m(x))
        F.mse_loss(out.float(), torch.zeros_like(out, dtype=torch.float32)).backward()
        m.zero_grad(set_to_none=True)

    for amp in (True, False):
        for _ in range(3):
            for m in sides.values():
                step(m, amp)
        torch.cuda.synchronize()
        res = {k: [] for k in sides}
        for _ in range(a.steps):
            for k, m in sides.items():
                t0 = time.perf_counter()
                step(m, amp)
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                res[k].append((t1 - t0, time.perf_counter() - t0))
        for k, v in res.items():
            print(f"amp={amp} {k}: host (enqueue) ms min {min(h for h, _ in v) * 1e3:.2f}, wall ms min "
                  f"{min(w for _, w in v) * 1e3:.2f}", flush=True)
    # which layers take the backward's checked path in a steady step (the cProfile of 2026-12-07: 28 of 140
    # layers per step, each direction, ~0.4-0.5 ms each under the profiler), and whether it kept a plan
    from collections import Counter
    from rawconv.pytorch import ops_kernels as K
    seen = Counter()

    def spy(name):
        real = getattr(K, name)

        def f(*args, **kw):
            out = real(*args, **kw)
            a, b = args[0], args[1]
            seen[(name, tuple(a.shape), a.stride(), tuple(b.shape), b.stride(), args[7], out[-1] is not None,
                  type(out[-1]).__name__)] += 1
            return out
        setattr(K, name, f)
        return real
    reals = {n: spy(n) for n in ("_backward_data_cuda_checked", "_backward_weights_cuda_checked")}
    for _ in range(2):
        step(sides["rawconv"], True)
    torch.cuda.synchronize()
    for n, r in reals.items():
        setattr(K, n, r)
    print("== checked backward calls in 2 steps (direction, a shape/stride, b shape/stride, groups, plan kept, plan type)")
    for k, v in seen.most_common(40):
        print(v, k)
    for amp in (True,):
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(a.steps):
            step(sides["rawconv"], amp)
        torch.cuda.synchronize()
        pr.disable()
        print(f"== cProfile rawconv amp={amp}, {a.steps} steps, by own time", flush=True)
        pstats.Stats(pr).sort_stats("tottime").print_stats(a.top)
        pstats.Stats(pr).sort_stats("cumulative").print_stats(a.top)


if __name__ == "__main__":
    main()
