"""Where does a cached graph plan's call spend its host time? Each piece of
``GraphConvolution.execute``'s hot path timed alone, beside the bare ``cudnnBackendExecute`` and
``F.conv2d``, on the tiny problem of bench_overhead_cuda.py.

    python benchmarks/diag_hot_path_cuda.py [--calls 20000]

Host microseconds per call, best of 5 loops; calls that launch GPU work are queued behind a GPU
sleep (as bench_overhead_cuda.py does), so the loop's time is the host's alone.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from rawconv import cudnn_graph
from rawconv.cudnn import _cuda
from rawconv.cudnn import _ffi as _cudnn
from rawconv.core import guard as _guard


def host_us(fn, calls: int, gpu: bool, repeats: int = 5) -> float:
    best = float("inf")
    n = 200 if gpu else calls
    for _ in range(repeats):
        if gpu:
            torch.cuda._sleep(int(2e8))
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
        if gpu:
            torch.cuda.synchronize()
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    cl = torch.channels_last
    x = torch.randn(1, 8, 8, 8, device="cuda").contiguous(memory_format=cl)
    w = torch.randn(8, 8, 3, 3, device="cuda").contiguous(memory_format=cl)
    y = torch.empty_like(F.conv2d(x, w, padding=1))
    g = cudnn_graph.GraphConvolution(x, w, padding=1)
    # the engine config whose bare execute is cheapest among the first heuristic ones
    L = _cudnn.lib()
    best = None
    for ec in g.heuristic("instant")[:6]:
        try:
            g.select(ec.name)
            g.execute(x, w, out=y)
        except Exception:   # noqa: BLE001
            continue
        b = g._selected
        vp = next(iter(b.vps.values()))
        h, pl = _cuda.handle_for(0), b.plan.ptr
        t = host_us(lambda: L.cudnnBackendExecute(h, pl, vp.ptr), args.calls, True)
        if best is None or t < best[0]:
            best = (t, ec.name)
    g.select(best[1])
    g.execute(x, w, out=y)
    g.execute(x, w, out=y)
    b = g._selected
    hot = g._hot
    ptrs = (x.data_ptr(), w.data_ptr(), y.data_ptr())
    vp = b.vps[ptrs]
    h, pl = _cuda.handle_for(0), b.plan.ptr
    rows = []
    gpu = lambda name, fn: rows.append((name, host_us(fn, args.calls, True)))   # noqa: E731
    cpu = lambda name, fn: rows.append((name, host_us(fn, args.calls, False)))   # noqa: E731
    gpu("F.conv2d", lambda: F.conv2d(x, w, padding=1))
    gpu(f"bare cudnnBackendExecute {best[1]}", lambda: L.cudnnBackendExecute(h, pl, vp.ptr))
    gpu("g._run(built, ptrs)", lambda: g._run(b, ptrs))
    gpu("g.execute(x, w, out=y)", lambda: g.execute(x, w, out=y))
    gpu("g.execute(x, w)", lambda: g.execute(x, w))
    gpu("g.execute.__wrapped__ (no error guard)", lambda: type(g).execute.__wrapped__(g, x, w, out=y))
    cpu("torch._C._cuda_getCurrentRawStream(0)", lambda: torch._C._cuda_getCurrentRawStream(0))
    cpu("_cuda.handle_for(0)", lambda: _cuda.handle_for(0))
    cpu("_guard.bump((y,))", lambda: _guard.bump((y,)))
    cpu("torch.empty_strided(y's shape)", lambda: torch.empty_strided(y.shape, y.stride(), dtype=y.dtype,
                                                                       device=y.device))
    cpu("x.shape == s and x.stride() == st", lambda: x.shape == y.shape and x.stride() == y.stride())
    cpu("x.is_cuda, get_device, is_neg, dtype", lambda: (x.is_cuda, x.get_device(), x.is_neg(), x.dtype))
    cpu("3 x data_ptr()", lambda: (x.data_ptr(), w.data_ptr(), y.data_ptr()))
    real = g._run
    g._run = lambda built, p: None   # the hot path's Python alone
    cpu("hot.run(out=y) without the C call", lambda: hot.run(g, x, w, None, y))
    cpu("hot.run() without the C call", lambda: hot.run(g, x, w, None, None))
    cpu("execute(out=y) without the C call", lambda: g.execute(x, w, out=y))
    g._run = real
    print(f"host us per call, tiny conv x(1,8,8,8) w(8,8,3,3) channels_last fp32, engine config {best[1]}")
    for name, t in rows:
        print(f"  {name:<48} {t:8.2f}")


if __name__ == "__main__":
    main()
