"""Is the fused default model's CUDA-graph error a workspace-state dependence of cuDNN's engines?

    python benchmarks/diag_capture_ws.py [--batch 8]

Part 1 (eager, default stream, each distinct cuDNN graph plan of convert(resnet50, fuse=True)):
the plan's config and workspace size; run on random tensors, then overwrite the plan's kept
workspace with 0xFF bytes (and then random bytes) and run again: does the output change? An engine
that keeps state in its workspace between executes (or needs it zeroed) changes.

Part 2 (the whole model captured, replay against eager) with the per-call workspace on capture
streams (rawconv's default), zeroed before each call, filled with 0xFF before each call, and the
plan's one kept workspace on every stream (made outside the capture).
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
from rawconv import _cuda, _cudnn  # noqa: E402
from rawconv import _cudnn_backend as B  # noqa: E402
from rawconv import cudnn_graph as G  # noqa: E402
from rawconv import fused as F  # noqa: E402
from bench_resnet50 import build_resnet50, rel_err  # noqa: E402


def make_run(mode):
    def _run(self, b, ptrs):
        hs = _cuda.handle_state(self.device_index)
        keep = None
        if not b.workspace_bytes:
            wp = 0
        elif mode == "persistent" or hs.stream == 0:
            keep = b.default_workspace(self._dev)   # (tensor, address)
            wp = keep[1]
        else:
            keep = _cuda.workspace(b.workspace_bytes, self._dev)
            if mode == "zeroed":
                keep.zero_()
            elif mode == "garbage":
                keep.fill_(255)
            wp = keep.data_ptr()
        key = (ptrs, wp)
        vp = b.vps.get(key)
        if vp is None:
            vp = b.vps[key] = B.variant_pack(self._graph.uids, ptrs, wp)
        status = _cudnn.lib().cudnnBackendExecute(hs.ptr, b.plan.ptr, vp.ptr)
        del keep
        if status:
            raise _cudnn.error(status, "cudnnBackendExecute", b.config.name)
    return _run


def part1(base, x):
    F.clear_cache()
    m = rnn.convert(copy.deepcopy(base), fuse=True)
    with torch.no_grad():
        m(x)
    torch.cuda.synchronize()
    seen = set()
    for key, plan in list(F._gpu_plans._plans.items()):
        if not isinstance(plan, G.GraphConvolution) or id(plan) in seen:
            continue
        seen.add(id(plan))
        b = plan._selected or plan._current()
        p = plan.problem
        g = torch.Generator(device="cuda").manual_seed(1)
        cl = torch.channels_last
        xx = torch.randn(p.x_shape, device="cuda", dtype=torch.half, generator=g).contiguous(memory_format=cl)
        ww = (torch.randn(p.w_shape, device="cuda", dtype=torch.half, generator=g) * 0.05).contiguous(memory_format=cl)
        bb = torch.randn(p.k, device="cuda", dtype=torch.half, generator=g) if p.has_bias else None
        residual = key[1]
        rr = torch.randn(p.y_shape, device="cuda", dtype=torch.half, generator=g).contiguous(memory_format=cl) \
            if residual else None
        run = (lambda: plan.run(xx, ww, bb, rr)) if residual else (lambda: plan.execute(xx, ww, bb))
        y0 = run().clone()
        y1 = run().clone()
        res = [rel_err(y1, y0)]
        if b.workspace is not None:
            b.workspace.fill_(255)
            res.append(rel_err(run(), y0))
            b.workspace.random_(0, 256)
            res.append(rel_err(run(), y0))
            res.append(rel_err(run(), y0))
        torch.cuda.synchronize()
        notes = getattr(b.config, "behavior_notes", "")
        print(f"{'res ' if residual else 'conv'} {p.describe()[:60]:60s} {b.config.name:24s} ws {b.workspace_bytes:>10d} "
              f"{','.join(notes) if isinstance(notes, (list, tuple)) else notes}  again {res[0]:.1e}  "
              + (f"after 0xFF {res[1]:.1e}  after random {res[2]:.1e}  next {res[3]:.1e}" if len(res) > 1 else ""),
              flush=True)


def part2(base, x):
    from diag_capture_rtc2 import whole   # the whole-model capture and replay against eager

    real = G.GraphConvolution._run
    for mode in ("default", "zeroed", "garbage", "persistent"):
        def patch(mode=mode):
            if mode != "default":
                G.GraphConvolution._run = make_run(mode)

            def undo():
                G.GraphConvolution._run = real
            return undo
        whole(base, x, f"part2 {mode}", patch)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--part", default="1,2")
    args = ap.parse_args()
    base, src = build_resnet50()
    base = base.cuda().half().to(memory_format=torch.channels_last)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.half).contiguous(
        memory_format=torch.channels_last)
    print(f"model {src}, batch {args.batch}, cuDNN {torch.backends.cudnn.version()}", flush=True)
    if "1" in args.part:
        part1(base, x)
    if "2" in args.part:
        part2(base, x)


if __name__ == "__main__":
    main()
