"""Inside one CUDA-graph capture: inputs allocated in the capture, dropped right after rawconv's call,
their memory then overwritten by later allocations of the same capture. Does the replayed output
still equal eager (the call's kernels read their inputs before the next work on the stream)? For the
fused residual graph (cuDNN's runtime-compiled eng4) and a plain convolution plan.

    python benchmarks/diag_capture_free.py
"""
from __future__ import annotations

import os
import sys

import torch

if __package__ in (None, ""):
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from rawconv import cudnn_graph as G  # noqa: E402
from rawconv import fused  # noqa: E402
from rawconv.problem import ConvProblem  # noqa: E402


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max()).item()


def main():
    cl = torch.channels_last
    p = ConvProblem(n=8, c=64, k=256, in_spatial=(56, 56), kernel=(1, 1), dtype="float16", layout="nhwc",
                    has_bias=True, device="cuda:0")
    w = torch.randn(p.w_shape, device="cuda", dtype=torch.half).contiguous(memory_format=cl) * 0.1
    b = torch.randn(256, device="cuda", dtype=torch.half)
    xs = torch.randn(p.x_shape, device="cuda", dtype=torch.half).contiguous(memory_format=cl)
    rs = torch.randn(p.y_shape, device="cuda", dtype=torch.half).contiguous(memory_format=cl)
    res_plan = fused._graph_class().for_problem(p, activation="relu")
    conv_plan = G.GraphConvolution.from_problem(p, activation="relu")
    for name, call in (("residual " + res_plan.selected_name, lambda x, r: res_plan.run(x, w, b, r)),
                       ("conv+bias+relu " + conv_plan.selected_name, lambda x, r: conv_plan.execute(x, w, b))):
        want = call(xs, rs).clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            call(xs, rs)
        torch.cuda.current_stream().wait_stream(s)
        for churn in (0, 1, 4):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                x = xs * 1   # allocated in the capture
                r = rs * 1
                y = call(x, r)
                del x, r   # their blocks go back to the graph's pool...
                junk = [torch.full(p.x_shape, 1e4, device="cuda", dtype=torch.half) for _ in range(churn)]
                junk += [torch.full(p.y_shape, 1e4, device="cuda", dtype=torch.half) for _ in range(churn)]
                del junk   # ...and are written by later work of the same capture
            g.replay()
            torch.cuda.synchronize()
            print(f"{name:44s} churn {churn}: replay vs eager {rel(y, want):.1e}", flush=True)


if __name__ == "__main__":
    main()
