"""ResNet-50's fused residual convolutions, relu(conv(x, w) + bias + r), on the GPU: the cuDNN graph
(conv -> add bias -> add residual -> relu, autotuned as convert(fuse=True, autotune=x) tunes it)
against the legacy API's ``cudnnConvolutionBiasActivationForward`` with the residual as its ``z``
(y = relu(alpha1 * conv + alpha2 * z + bias), alpha2 = 1; one call), per legacy algo, and against
the bare convolution (the floor of any fused form). GPU time per call (calls queued behind a busy
GPU), error of each against torch in float32.

    python benchmarks/diag_residual_legacy.py [--budget 1.0] [--dtype float16]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

if __package__ in (None, ""):
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from rawconv import _cuda, _cudnn  # noqa: E402
from rawconv import cudnn as legacy  # noqa: E402
from rawconv.bench import time_cuda_queued  # noqa: E402
from rawconv.cudnn._ffi import ffi  # noqa: E402
from rawconv.problem import ConvProblem  # noqa: E402
from rawconv.pytorch import fused  # noqa: E402

# ResNet-50 b32: the residual convolutions (conv3 of each bottleneck), input and output channels, size
CASES = [(64, 256, 56), (128, 512, 28), (256, 1024, 14), (512, 2048, 7)]


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# ResNet-50 b32's fused convolutions without a residual: (C, K, size, kernel, stride, relu)
PLAIN = [(64, 64, 56, 1, 1, True), (64, 64, 56, 3, 1, True), (64, 256, 56, 1, 1, False), (256, 64, 56, 1, 1, True),
         (256, 128, 56, 1, 1, True), (128, 128, 56, 3, 2, True), (256, 512, 56, 1, 2, False),
         (512, 128, 28, 1, 1, True), (128, 128, 28, 3, 1, True), (512, 256, 28, 1, 1, True),
         (256, 256, 28, 3, 2, True), (512, 1024, 28, 1, 2, False), (1024, 256, 14, 1, 1, True),
         (256, 256, 14, 3, 1, True), (1024, 512, 14, 1, 1, True), (512, 512, 14, 3, 2, True),
         (1024, 2048, 14, 1, 2, False), (2048, 512, 7, 1, 1, True), (512, 512, 7, 3, 1, True)]


def plain(args):
    """relu(conv + b) (or conv + b): the autotuned graph against the legacy fused call (no z)."""
    from rawconv import cudnn_graph as G

    dt, cl = getattr(torch, args.dtype), torch.channels_last
    L = _cudnn.lib()
    tot_g = tot_l = 0.0
    for c, k, s, ks, st, relu in PLAIN:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(args.batch, c, s, s, device="cuda", generator=g, dtype=dt).contiguous(memory_format=cl)
        w = (torch.randn(k, c, ks, ks, device="cuda", generator=g, dtype=dt) / (c * ks * ks) ** 0.5).contiguous(
            memory_format=cl)
        b = torch.randn(k, device="cuda", generator=g, dtype=dt)
        pad = ks // 2
        act = "relu" if relu else None
        gp = G.GraphConvolution(x, w, b, stride=st, padding=pad, activation=act)
        gp.autotune(budget_s=args.budget)
        tg = time_cuda_queued(lambda: gp.execute(x, w, b), iterations=20, warmup=3, repeats=7).median_ms
        line = f"   x {tuple(x.shape)} w {tuple(w.shape)} s{st} {act or 'bias'}: graph {gp.selected_name:<44} {tg * 1e3:7.1f} us"
        try:
            plan = legacy.Convolution(x, w, b, st, pad, algo="IMPLICIT_PRECOMP_GEMM", activation=act, precision="strict")
            y0 = plan.execute(x, w, b)
            info = plan._info or plan.info
            if not info.fused:
                raise RuntimeError("not fused")
            tl = time_cuda_queued(lambda: plan.execute(x, w, b), iterations=20, warmup=3, repeats=7).median_ms
            e = rel(y0, gp.execute(x, w, b))
            line += f" | legacy {tl * 1e3:7.1f} us (vs graph {e:.1e}) ratio {tg / tl:.2f}"
            tot_g, tot_l = tot_g + tg, tot_l + min(tl, tg)
        except Exception as exc:  # noqa: BLE001
            line += f" | legacy {type(exc).__name__}: {str(exc)[:80]}"
            tot_g, tot_l = tot_g + tg, tot_l + tg
        print(line, flush=True)
    print(f"   sum over the distinct problems: graph {tot_g * 1e3:.1f} us, best of both {tot_l * 1e3:.1f} us")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=1.0)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--plain", action="store_true", help="the fused convolutions without a residual instead")
    args = ap.parse_args()
    if args.plain:
        return plain(args)
    dt = getattr(torch, args.dtype)
    cl = torch.channels_last
    torch.backends.cudnn.benchmark = True
    for c, k, s in CASES:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(args.batch, c, s, s, device="cuda", generator=g, dtype=dt).contiguous(memory_format=cl)
        w = (torch.randn(k, c, 1, 1, device="cuda", generator=g, dtype=dt) / c ** 0.5).contiguous(memory_format=cl)
        b = torch.randn(k, device="cuda", generator=g, dtype=dt)
        r = torch.randn(args.batch, k, s, s, device="cuda", generator=g, dtype=dt).contiguous(memory_format=cl)
        ref = torch.relu(F.conv2d(x.float(), w.float(), b.float()) + r.float())
        print(f"== x {tuple(x.shape)} w {tuple(w.shape)} {args.dtype} channels_last", flush=True)
        # the fused graph, as convert(fuse=True, autotune=x) builds and tunes it
        problem = ConvProblem.from_torch(x, w, b)
        gp = fused._graph_class().for_problem(problem, activation="relu", allow_tf32=False)
        try:
            gp.autotune(budget_s=args.budget)
        except Exception as exc:  # noqa: BLE001
            print(f"   graph autotune failed: {type(exc).__name__}: {str(exc)[:200]}")
        try:
            y = gp.run(x, w, b, r)
            t = time_cuda_queued(lambda: gp.run(x, w, b, r), iterations=20, warmup=3, repeats=7).median_ms
            print(f"   graph {gp.selected_name:<40} {t * 1e3:8.1f} us  err {rel(y, ref):.1e}", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"   graph: {type(exc).__name__}: {str(exc)[:200]}")
        # bare convolution (torch's cudnn.benchmark choice)
        F.conv2d(x, w)
        t = time_cuda_queued(lambda: F.conv2d(x, w), iterations=20, warmup=3, repeats=7).median_ms
        print(f"   bare F.conv2d (no bias, no residual)            {t * 1e3:8.1f} us", flush=True)
        # legacy fused with z = residual, per algo
        L = _cudnn.lib()
        for algo in ("IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "FFT", "FFT_TILING", "WINOGRAD_NONFUSED"):
            try:
                plan = legacy.Convolution(x, w, b, algo=algo, activation="relu", precision="strict")
                plan.execute(x, w, b)
                info = plan._info or plan.info
                if not info.fused:
                    print(f"   legacy {algo:<24} not fused by cuDNN")
                    continue
                xd, wd, yd, cd = plan.descriptors(args.batch)
                h = _cuda.handle_for(plan.device_index)
                ws = _cuda.workspace(info.workspace_bytes, x.device) if info.workspace_bytes else None
                pws = ffi.cast("void *", ws.data_ptr()) if ws is not None else ffi.NULL
                y = torch.empty_like(r)
                cast = ffi.cast
                bd, ad = plan._bias_desc(), plan._act_desc()
                one = ffi.new("float *", 1.0)

                def call():
                    st = L.cudnnConvolutionBiasActivationForward(
                        h, one, xd, cast("void *", x.data_ptr()), wd, cast("void *", w.data_ptr()), cd, info.algo_id,
                        pws, info.workspace_bytes, one, yd, cast("void *", r.data_ptr()), bd,
                        cast("void *", b.data_ptr()), ad, yd, cast("void *", y.data_ptr()))
                    if st:
                        raise _cudnn.error(st, "cudnnConvolutionBiasActivationForward", algo)
                call()
                torch.cuda.synchronize()
                e = rel(y, ref)
                t = time_cuda_queued(call, iterations=20, warmup=3, repeats=7).median_ms
                print(f"   legacy {algo:<24} z=residual {t * 1e3:8.1f} us  err {e:.1e}  ws {info.workspace_bytes}",
                      flush=True)
                if algo == "IMPLICIT_PRECOMP_GEMM":
                    extra(call, y, x, w, b, r, "legacy")
                    extra(lambda: gp.run(x, w, b, r, out=y), y, x, w, b, r, "graph ")
            except Exception as exc:  # noqa: BLE001
                print(f"   legacy {algo:<24} {type(exc).__name__}: {str(exc)[:160]}")


def extra(call, y, x, w, b, r, label):
    """Host us per call (GPU held busy: launches never wait), the kernels one call launches, and the
    result when the call is queued right behind a kernel that rewrites its input x (cuDNN's eng4
    read its input early there: rawconv's barrier), against torch in float32."""
    import time
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    torch.cuda._sleep(int(3e8))
    n = 100
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = [e.name[:70] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    x2 = torch.randn_like(x)
    ref2 = torch.relu(F.conv2d(x2.float(), w.float(), b.float()) + r.float())
    errs = []
    for _ in range(3):
        x.normal_()
        torch.cuda.synchronize()
        torch.cuda._sleep(int(1e8))
        x.copy_(x2)   # the kernel right ahead of the call writes its input
        call()
        torch.cuda.synchronize()
        errs.append(rel(y, ref2))
    print(f"   {label} host {host:6.1f} us/call; kernels {names}; queued behind a write of x: max err "
          f"{max(errs):.1e}", flush=True)


if __name__ == "__main__":
    main()
