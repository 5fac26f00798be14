"""Does a cuDNN execution plan stay right when it runs twice inside one CUDA-graph capture, or runs
eagerly between replays? Per engine kind (runtime-compiled fusion engine vs precompiled), on the
residual graph act(conv(x, w) + b + r) of a ResNet-50 layer, fp16 channels_last.

    python benchmarks/diag_capture_rtc.py

E1 one plan, two calls (other tensors) in one capture; E2 one call captured, then an eager call of
the same plan on other tensors, then replay; E3 as E1 with a separately finalized execution plan per
call; E4 finalizing an execution plan while a capture is open. Each: max relative error of the
replayed outputs against the eager ones.

Measured on the H200 (cuDNN 9.19, 2026-12-03): E1, E2, E3 exact (0.0) for the runtime-compiled
eng4 configs (the only ones cuDNN offers for this graph); E4 invalidates the capture
(cudaErrorStreamCaptureInvalidated): a plan must never be finalized inside a capture.
"""
from __future__ import annotations

import os
import sys

import torch

if __package__ in (None, ""):
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from rawconv import _cuda  # noqa: E402
from rawconv import _cudnn_backend as B  # noqa: E402
from rawconv import cudnn_graph as G  # noqa: E402
from rawconv import fused  # noqa: E402
from rawconv.problem import ConvProblem  # noqa: E402


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max()).item()


def tensors(p, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    cl = torch.channels_last
    x = torch.randn(p.x_shape, device="cuda", dtype=torch.half, generator=g).contiguous(memory_format=cl)
    r = torch.randn(p.y_shape, device="cuda", dtype=torch.half, generator=g).contiguous(memory_format=cl)
    return x, r


def main():
    p = ConvProblem(n=8, c=64, k=256, in_spatial=(56, 56), kernel=(1, 1), dtype="float16", layout="nhwc",
                    has_bias=True, device="cuda:0")
    w = torch.randn(p.w_shape, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last) * 0.1
    b = torch.randn(256, device="cuda", dtype=torch.half)
    cls = fused._graph_class()
    plan = cls.for_problem(p, activation="relu")
    configs = plan.engines(("instant", "b", "fallback"), limit=None, finalize=True)
    rtc = [c for c in configs if c.finalizes and "RUNTIME_COMPILATION" in c.behavior_notes]
    pre = [c for c in configs if c.finalizes and "RUNTIME_COMPILATION" not in c.behavior_notes]
    print("default:", plan.selected_name, "| rtc:", [c.name for c in rtc[:4]], "| precompiled:", [c.name for c in pre[:4]])
    cases = [("default", plan.selected_name)] + [("rtc", c.name) for c in rtc[:2]] + [("pre", c.name) for c in pre[:2]]
    (x1, r1), (x2, r2) = tensors(p, 1), tensors(p, 2)
    for kind, name in cases:
        pl = cls.for_problem(p, activation="relu")
        pl.select(name)
        e1 = pl.run(x1, w, b, r1).clone()
        e2 = pl.run(x2, w, b, r2).clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            pl.run(x1, w, b, r1)
            pl.run(x2, w, b, r2)
        torch.cuda.current_stream().wait_stream(s)
        res = {}
        for tag in ("",):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                o1 = pl.run(x1, w, b, r1)
                o2 = pl.run(x2, w, b, r2)
            g.replay()
            torch.cuda.synchronize()
            res["E1 two calls" + tag] = max(rel(o1, e1), rel(o2, e2))
            g2 = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g2):
                o3 = pl.run(x1, w, b, r1)
            pl.run(x2, w, b, r2)   # eager, other tensors, between capture and replay
            torch.cuda.synchronize()
            g2.replay()
            torch.cuda.synchronize()
            res["E2 eager between" + tag] = rel(o3, e1)
        # E3: a separately finalized execution plan for the second call
        ec = pl._current().config
        graph = pl._graph_desc()
        h = _cuda.handle_for(0)
        extra = B.execution_plan(h, B.engine_config(B.engine(graph, ec.engine), ec.knobs))
        b2 = G._Built(ec, extra, B.plan_workspace(extra), {})
        g3 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g3):
            o4 = pl.run(x1, w, b, r1)
            pl._pending_r = r2
            try:
                t, o5 = pl._bind(x2, w, b, None, None)
            finally:
                pl._pending_r = None
            pl._run(b2, tuple(t[r].data_ptr() for r in pl._graph.roles))
        g3.replay()
        torch.cuda.synchronize()
        res["E3 own plan per call"] = max(rel(o4, e1), rel(o5, e2))
        try:
            g4 = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g4):
                late = B.execution_plan(h, B.engine_config(B.engine(graph, ec.engine), ec.knobs))
                b3 = G._Built(ec, late, B.plan_workspace(late), {})
                pl._pending_r = r1
                try:
                    t, o6 = pl._bind(x1, w, b, None, None)
                finally:
                    pl._pending_r = None
                pl._run(b3, tuple(t[r].data_ptr() for r in pl._graph.roles))
            g4.replay()
            torch.cuda.synchronize()
            res["E4 finalize in capture"] = rel(o6, e1)
        except Exception as exc:  # noqa: BLE001
            res["E4 finalize in capture"] = f"{type(exc).__name__}: {str(exc)[:120]}"
            torch.cuda.synchronize()
        print(f"{kind:8s} {name:32s} " + "  ".join(f"{k}={v:.1e}" if isinstance(v, float) else f"{k}={v}"
                                                for k, v in res.items()), flush=True)


if __name__ == "__main__":
    main()
