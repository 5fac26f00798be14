"""The fused default model's CUDA-graph error (issue 22), second round: which plans, shared how?

    python benchmarks/diag_capture_rtc2.py [--batch 8]

D1 two residual plans of DIFFERENT problems (both cuDNN's default runtime-compiled eng4 config) in one
capture; D2 one residual plan called twice in one capture with different x, w, bias and residual;
then the whole converted ResNet-50 (fuse=True, default configs) captured with: D3 a plan per module
(no plan shared by two layers), D4 the residual graphs replaced by the legacy fallback (conv + bias
on cuDNN, the add and ReLU in torch), D5 the conv+bias+ReLU graphs replaced by the legacy fallback,
D6 both. Each: max relative error of the replay against eager.
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
from rawconv import fused as F  # noqa: E402
from rawconv.errors import NotSupportedError  # noqa: E402
from rawconv.problem import ConvProblem  # noqa: E402
from bench_resnet50 import build_resnet50, graph_capture, rel_err  # noqa: E402

CL = torch.channels_last


def rnd(shape, seed, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = torch.randn(shape, device="cuda", dtype=torch.half, generator=g) * scale
    return t.contiguous(memory_format=CL) if t.dim() == 4 else t


def operands(p, seed):
    return (rnd(p.x_shape, seed), rnd(p.w_shape, seed + 1, 0.05), rnd((p.k,), seed + 2), rnd(p.y_shape, seed + 3))


def small(batch):
    cls = F._graph_class()
    pa = ConvProblem(n=batch, c=64, k=256, in_spatial=(56, 56), kernel=(1, 1), dtype="float16", layout="nhwc",
                     has_bias=True, device="cuda:0")
    pb = ConvProblem(n=batch, c=128, k=512, in_spatial=(28, 28), kernel=(1, 1), dtype="float16", layout="nhwc",
                     has_bias=True, device="cuda:0")
    P1, P2 = cls.for_problem(pa, activation="relu"), cls.for_problem(pb, activation="relu")
    A, B, A2 = operands(pa, 10), operands(pb, 20), operands(pa, 30)
    print("configs:", P1.selected_name, P2.selected_name, flush=True)
    eA, eB, eA2 = P1.run(*A).clone(), P2.run(*B).clone(), P1.run(*A2).clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        P1.run(*A), P2.run(*B), P1.run(*A2)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        oA = P1.run(*A)
        oB = P2.run(*B)
    g.replay()
    torch.cuda.synchronize()
    print(f"D1 two problems in one capture: A {rel_err(oA, eA):.1e}  B {rel_err(oB, eB):.1e}", flush=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        oA = P1.run(*A)
        oA2 = P1.run(*A2)
    g.replay()
    torch.cuda.synchronize()
    print(f"D2 one plan, other w/b/x/r: first {rel_err(oA, eA):.1e}  second {rel_err(oA2, eA2):.1e}", flush=True)


def whole(base, x, label, patch=None):
    F.clear_cache()
    undo = patch() if patch else None
    try:
        m = rnn.convert(copy.deepcopy(base), fuse=True)
        with torch.no_grad():
            ref = m(x).clone()
        g, out = graph_capture(m, x)
        g.replay()
        torch.cuda.synchronize()
        e1 = rel_err(out, ref)
        junk = [torch.full((64 << 20,), 1e4 * (i + 1), device="cuda") for i in range(4)]   # churn: 1 GiB
        del junk
        g.replay()
        torch.cuda.synchronize()
        e2 = rel_err(out, ref)
        with torch.no_grad():
            m(x)
        g.replay()
        torch.cuda.synchronize()
        print(f"{label:52s} replay {e1:.1e}  after churn {e2:.1e}  after eager {rel_err(out, ref):.1e}", flush=True)
    except Exception as exc:  # noqa: BLE001
        print(f"{label:52s} failed {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    finally:
        if undo:
            undo()
        F.clear_cache()


def patch_plan_per_module():
    real = F.plan_for

    def plan_for(x, w, bias, residual, *a, **k):
        key = ("per-module", id(w))
        plan = F._gpu_plans.get(key)
        if plan is None or plan._freed:
            saved = dict(F._gpu_plans._plans)
            F._gpu_plans.clear()
            plan = real(x, w, bias, residual, *a, **k)
            F._gpu_plans._plans.update(saved)
            F._gpu_plans.put(key, plan)
        return plan
    class NoStore(dict):
        def __setitem__(self, k, v):
            pass
    real_fast = F._fast
    F.plan_for, F._fast = plan_for, NoStore()

    def undo():
        F.plan_for, F._fast = real, real_fast
    return undo


def patch_fallback(residual: bool, plain: bool):
    cls = F._graph_class()
    real_res = cls.for_problem.__func__
    from rawconv import cudnn_graph as G
    real_from = G.GraphConvolution.from_problem.__func__
    real_current = G.GraphConvolution._current

    def for_problem(c, problem, **k):
        plan = real_res(c, problem, **k)
        plan._rawconv_diag_refuse = residual
        return plan

    def from_problem(c, problem, **k):
        plan = real_from(c, problem, **k)
        if k.get("activation") is not None or problem.has_bias:
            plan._rawconv_diag_refuse = plain and c is G.GraphConvolution
        return plan

    def _current(self):
        if getattr(self, "_rawconv_diag_refuse", False):
            raise NotSupportedError("diag: refused")
        return real_current(self)

    cls.for_problem = classmethod(for_problem)
    G.GraphConvolution.from_problem = classmethod(from_problem)
    G.GraphConvolution._current = _current

    def undo():
        cls.for_problem = classmethod(real_res)
        G.GraphConvolution.from_problem = classmethod(real_from)
        G.GraphConvolution._current = real_current
    return undo


def patch_residual_run(mode):
    cls = F._graph_class()
    real = cls.run
    from rawconv.problem import dense_strides

    def run(self, x, w, bias, residual, out=None):
        if mode == "slack" and out is None:
            shape = self.problem.y_shape
            n = 1
            for s_ in shape:
                n *= s_
            pad = 1 << 20
            buf = torch.empty(pad + 2 * n + pad, dtype=torch.uint8, device=x.device)
            out = buf[pad:pad + 2 * n].view(torch.half).as_strided(shape, dense_strides(shape, "nhwc"))
        if mode == "clone_r":
            residual = residual.clone(memory_format=CL)
        if mode == "clone_x":
            x = x.clone(memory_format=CL)
        if mode == "barrier_before":
            _BAR.zero_()
        y = real(self, x, w, bias, residual, out)
        if mode == "barrier_after":
            _BAR.zero_()
        return y.clone(memory_format=CL) if mode == "clone_y" else y
    cls.run = run

    def undo():
        cls.run = real
    return undo


_BAR = None


def eager_queued(base, x, label, patch=None):
    """The converted model eagerly, once as usual and once with every launch queued behind a busy
    GPU (torch.cuda._sleep first): kernels then run back to back, as in a graph replay."""
    F.clear_cache()
    undo = patch() if patch else None
    try:
        m = rnn.convert(copy.deepcopy(base), fuse=True)
        with torch.no_grad():
            ref = m(x).clone()
            torch.cuda.synchronize()
            errs = []
            for _ in range(3):
                torch.cuda._sleep(200_000_000)
                y = m(x)
                torch.cuda.synchronize()
                errs.append(rel_err(y, ref))
        print(f"{label:52s} eager, queued behind a busy GPU: {' '.join(f'{e:.1e}' for e in errs)}", flush=True)
    finally:
        if undo:
            undo()
        F.clear_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--whole-only", action="store_true")
    args = ap.parse_args()
    if not args.whole_only:
        small(args.batch)
    base, src = build_resnet50()
    base = base.cuda().half().to(memory_format=CL)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.half).contiguous(memory_format=CL)
    import warnings
    warnings.simplefilter("ignore")
    whole(base, x, "baseline (fused, default configs)")
    if not args.whole_only:
        whole(base, x, "D3 a plan per module", patch_plan_per_module)
        whole(base, x, "D4 residual graphs -> legacy fallback", lambda: patch_fallback(True, False))
        whole(base, x, "D5 conv+bias+relu graphs -> legacy fallback", lambda: patch_fallback(False, True))
        whole(base, x, "D6 both -> legacy fallback", lambda: patch_fallback(True, True))
        whole(base, x, "D7 residual outputs with 1 MiB slack each side", lambda: patch_residual_run("slack"))
    whole(base, x, "D8 residual input cloned before the call", lambda: patch_residual_run("clone_r"))
    whole(base, x, "D9 residual output cloned after the call", lambda: patch_residual_run("clone_y"))
    global _BAR
    _BAR = torch.zeros(1, device="cuda")
    whole(base, x, "D10 a 1-element torch kernel before each residual call", lambda: patch_residual_run("barrier_before"))
    whole(base, x, "D11 a 1-element torch kernel after each residual call", lambda: patch_residual_run("barrier_after"))
    whole(base, x, "D12 the conv input x cloned before the residual call", lambda: patch_residual_run("clone_x"))
    eager_queued(base, x, "D13 baseline")
    eager_queued(base, x, "D14 1-element kernel before residual calls", lambda: patch_residual_run("barrier_before"))


if __name__ == "__main__":
    main()
