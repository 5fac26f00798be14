"""Host cost of applying a torch.autograd.Function: the setup_context style (forward apart) against
the combined style (forward(ctx, ...)), the two styles rawconv.pytorch.ops uses (see ``_classic``).

    python benchmarks/diag_function_apply.py

Both Functions do the same trivial work (a view); best per-call time of 15 rounds of 2000 applies,
the two interleaved in one process, with grad on and under no_grad.
"""
from __future__ import annotations

import time

import torch


class SetupContextStyle(torch.autograd.Function):
    @staticmethod
    def forward(how, x, w, b, conf):
        return x.view_as(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[1], inputs[2])

    @staticmethod
    def backward(ctx, g):
        return None, g, None, None, None


class CombinedStyle(torch.autograd.Function):
    @staticmethod
    def forward(ctx, how, x, w, b, conf):
        ctx.save_for_backward(x, w)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return None, g, None, None, None


def best_us(rounds=15, calls=2000):
    x = torch.randn(4, requires_grad=True)
    w = torch.randn(4, requires_grad=True)
    best = {}
    for _ in range(rounds):
        for fn in (SetupContextStyle, CombinedStyle):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn.apply(None, x, w, None, 1)
            best[fn.__name__] = min(best.get(fn.__name__, float("inf")), (time.perf_counter() - t0) / calls * 1e6)
    return best


def main():
    print(f"torch {torch.__version__}")
    for label, ctx in (("grad on", torch.enable_grad), ("no_grad", torch.no_grad)):
        with ctx():
            b = best_us()
        print(f"{label:8s} setup_context style {b['SetupContextStyle']:7.1f} us   combined style "
              f"{b['CombinedStyle']:7.1f} us   ratio {b['SetupContextStyle'] / b['CombinedStyle']:.2f}x")


if __name__ == "__main__":
    main()
