"""Per-call host time on a tiny CUDA convolution: back-to-back calls, one synchronize at the end.

The GPU time of x(1,8,8,8) * w(8,8,3,3) is a few microseconds, so the loop time per call is the
host's. Same problem, same process: F.conv2d, rawconv.cudnn (legacy: cached plan per algo, the
function form), rawconv.cudnn_graph (cached plan, function form), and the custom operator
``torch.ops.rawconv.conv_forward`` / ``rawconv.ops.conv`` on both cuDNN backends.

    python benchmarks/bench_overhead_cuda.py [--calls 2000] [--layout nchw|nhwc]
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from rawconv import cudnn, cudnn_graph
from rawconv.bench import wall_us_per_call


def per_call_us(fn, calls, repeats=5):
    """(wall, host) microseconds per call, best of ``repeats``.

    wall: ``calls`` back-to-back calls, one synchronize at the end (bounded by the slower of host
    and GPU). host: 200 calls queued behind a GPU sleep (``torch.cuda._sleep``), so the loop's time
    is the host's alone (200 calls stay under the launch queue's depth for a few launches a call)."""
    wall = wall_us_per_call(fn, calls, repeats)
    host = float("inf")
    for _ in range(repeats):
        torch.cuda._sleep(int(2e8))   # ~0.1 s of GPU time
        t0 = time.perf_counter()
        for _ in range(200):
            fn()
        host = min(host, (time.perf_counter() - t0) / 200 * 1e6)
        torch.cuda.synchronize()
    return wall, host


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--layout", default="nhwc")
    args = ap.parse_args()
    fmt = torch.channels_last if args.layout == "nhwc" else torch.contiguous_format
    x = torch.randn(1, 8, 8, 8, device="cuda").contiguous(memory_format=fmt)
    w = torch.randn(8, 8, 3, 3, device="cuda").contiguous(memory_format=fmt)
    y = torch.empty_like(F.conv2d(x, w, padding=1))
    rows = [("F.conv2d", per_call_us(lambda: F.conv2d(x, w, padding=1), args.calls))]
    torch.backends.cudnn.benchmark = True
    rows.append(("F.conv2d cudnn.benchmark", per_call_us(lambda: F.conv2d(x, w, padding=1), args.calls)))
    torch.backends.cudnn.benchmark = False
    plan = cudnn.Convolution(x, w, padding=1)
    for a in plan.algorithms(mode="heuristic", math=None):
        if not a.ok:
            continue
        try:
            plan.select(a.algo_id)
        except Exception as exc:  # noqa: BLE001
            rows.append((f"legacy {a.algo}", f"{type(exc).__name__}"))
            continue
        rows.append((f"legacy plan.execute {a.algo}", per_call_us(lambda: plan.execute(x, w), args.calls)))
        rows.append((f"legacy plan.execute(out=) {a.algo}", per_call_us(lambda: plan.execute(x, w, out=y), args.calls)))
    rows.append(("legacy cudnn.forward (heuristic)", per_call_us(lambda: cudnn.forward(x, w, padding=1), args.calls)))
    # the bare C call, every argument prepared once: what cuDNN's legacy entry point itself costs
    from rawconv.cudnn import _cuda
    from rawconv.cudnn import _ffi as _cudnn

    L, ffi = _cudnn.lib(), _cudnn.ffi
    for a in plan.algorithms(mode="heuristic", math=None):
        if not a.ok:
            continue
        info = plan.select(a.algo_id)
        xd, wd, yd, cd = plan.descriptors()
        ws = torch.empty(max(info.workspace_bytes, 1), dtype=torch.uint8, device="cuda")
        h = _cuda.handle_for(0)
        cargs = (h, plan._alpha, xd, ffi.cast("void *", x.data_ptr()), wd, ffi.cast("void *", w.data_ptr()), cd,
                 info.algo_id, ffi.cast("void *", ws.data_ptr()), info.workspace_bytes, plan._beta0, yd,
                 ffi.cast("void *", y.data_ptr()))
        fn = L.cudnnConvolutionForward
        assert fn(*cargs) == 0
        rows.append((f"bare cudnnConvolutionForward {a.algo}", per_call_us(lambda: fn(*cargs), args.calls)))
    g = cudnn_graph.GraphConvolution(x, w, padding=1)
    rows.append((f"graph plan.execute {g.selected.name}", per_call_us(lambda: g.execute(x, w), args.calls)))
    rows.append(("graph plan.execute(out=)", per_call_us(lambda: g.execute(x, w, out=y), args.calls)))
    # cuDNN's own cost per engine config: cudnnBackendExecute alone on a prepared variant pack, for
    # the first heuristic configs (engines differ: a runtime-compiled kernel launches differently),
    # then plan.execute(out=) on the cheapest of them (the difference is rawconv's Python)
    bare = []
    for ec in g.heuristic("instant")[:6]:
        try:
            g.select(ec.name)
            g.execute(x, w, out=y)
        except Exception as exc:  # noqa: BLE001
            rows.append((f"graph {ec.name}", f"{type(exc).__name__}"))
            continue
        b = g._selected
        vp = next(iter(b.vps.values()))
        h, pl = _cuda.handle_for(0), b.plan.ptr
        fn = L.cudnnBackendExecute
        assert fn(h, pl, vp.ptr) == 0
        t = per_call_us(lambda: fn(h, pl, vp.ptr), args.calls)
        rows.append((f"bare cudnnBackendExecute {ec.name}", t))
        bare.append((t[1], ec.name))
    if bare:
        name = min(bare)[1]
        g.select(name)
        rows.append((f"graph plan.execute(out=) {name}", per_call_us(lambda: g.execute(x, w, out=y), args.calls)))
        rows.append((f"graph plan.execute {name}", per_call_us(lambda: g.execute(x, w), args.calls)))
    rows.append(("graph cudnn_graph.forward", per_call_us(lambda: cudnn_graph.forward(x, w, padding=1), args.calls)))
    try:   # the custom operator and its friendly wrapper (issue 15), both backends
        from rawconv import ops
    except ImportError as exc:
        rows.append(("rawconv.ops", f"not available: {exc}"))
        ops = None
    if ops is not None:
        op = torch.ops.rawconv.conv_forward.default
        for backend in ("cudnn", "cudnn_graph"):
            rows.append((f"torch.ops.rawconv.conv_forward {backend}", per_call_us(
                lambda b=backend: op(x, w, None, [1, 1], [1, 1], [1, 1], [1, 1], 1, b, "", "strict", "", ""),
                args.calls)))
            rows.append((f"rawconv.ops.conv {backend}",
                         per_call_us(lambda b=backend: ops.conv(x, w, None, 1, 1, backend=b), args.calls)))
    base_wall, base_host = rows[0][1]
    print(f"per-call time, tiny conv x(1,8,8,8) w(8,8,3,3) {args.layout}: wall = back-to-back loop (best of 5 x "
          f"{args.calls}), host = loop queued behind a GPU sleep (best of 5 x 200)")
    print(f"  {'':<48} {'wall us':>9} {'host us':>9} {'host / torch':>13}")
    for name, v in rows:
        if isinstance(v, tuple):
            print(f"  {name:<48} {v[0]:9.2f} {v[1]:9.2f} {v[1] / base_host:13.2f}")
        else:
            print(f"  {name:<48} {v}")


if __name__ == "__main__":
    main()
