"""Where the time of an 'nhwc:' config on an NCHW problem goes (GPU): the channels_last engine
alone, each layout copy alone (torch copy_), the whole autotuned composite; each timed two ways:
CUDA events around back-to-back calls (rawconv.bench.time_cuda, host gaps included) and with the
GPU held busy while the calls queue (rawconv.bench.time_cuda_queued: GPU time only).

    python benchmarks/diag_relayout.py [--dtype float16] [--layers layer1.0.conv2,layer2.0.downsample.0]
"""
from __future__ import annotations

import argparse


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--layers", default="layer1.0.conv2,layer2.0.downsample.0,layer3.1.conv1")
    ap.add_argument("--budget", type=float, default=3.0)
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from rawconv import cudnn_graph as G
    from rawconv.bench import time_cuda, time_cuda_queued
    from rawconv.presets import resnet50
    from rawconv.problem import to_layout

    probs = {p.name: p for p in resnet50(32, dtype=args.dtype, layout="nchw")}
    for name in args.layers.split(","):
        p = probs[name]
        x, w, _ = p.make_inputs(seed=0, device="cuda")
        pad = p.torch_padding
        cl = G.GraphConvolution.from_problem(p.with_(layout="nhwc", device="cuda:0"))
        cl.autotune(budget_s=args.budget)
        xc, wc = to_layout(x, "nhwc"), to_layout(w, "nhwc")
        yc = cl.execute(xc, wc)
        y = torch.empty(p.y_shape, dtype=x.dtype, device="cuda")
        plan = G.GraphConvolution(x, w, None, p.stride, pad, p.dilation, p.groups)
        plan.select("nhwc:" + cl.selected.name)
        torch.backends.cudnn.benchmark = True
        f_torch = lambda: F.conv2d(x, w, None, p.stride, pad, p.dilation, p.groups)  # noqa: E731
        f_torch()
        fns = {
            "engine alone (NHWC tensors)": lambda: cl.execute(xc, wc, out=yc),
            "x copy_ NCHW->NHWC": lambda: xc.copy_(x),
            "w copy_ NCHW->NHWC": lambda: wc.copy_(w),
            "y copy_ NHWC->NCHW": lambda: y.copy_(yc),
            "x.contiguous(channels_last)": lambda: x.contiguous(memory_format=torch.channels_last),
            "composite plan.execute(x, w, out=y)": lambda: plan.execute(x, w, out=y),
            "torch F.conv2d NCHW": f_torch,
        }
        from rawconv.cudnn import _cuda
        from rawconv.cudnn import _ffi as _cudnn

        ffi, L = _cudnn.ffi, _cudnn.lib()
        alpha, beta = ffi.new("float *", 1.0), ffi.new("float *", 0.0)

        def transform(src, dst):
            sd = _cudnn.tensor_desc(p.dtype, src.shape, src.stride())
            dd = _cudnn.tensor_desc(p.dtype, dst.shape, dst.stride())
            sp, dp = ffi.cast("void *", src.data_ptr()), ffi.cast("void *", dst.data_ptr())

            def run():
                st = L.cudnnTransformTensor(_cuda.handle_for(0), alpha, sd, sp, beta, dd, dp)
                assert st == 0, st
            return run
        xc2, y2 = torch.empty_like(xc), torch.empty_like(y)
        transform(x, xc2)()
        transform(yc, y2)()
        torch.cuda.synchronize()
        assert torch.equal(xc2, xc.copy_(x)) and torch.equal(y2, y.copy_(yc)), "cudnnTransformTensor differs"
        fns["x cudnnTransformTensor NCHW->NHWC"] = transform(x, xc2)
        fns["y cudnnTransformTensor NHWC->NCHW"] = transform(yc, y2)
        mb = sum(t.numel() * t.element_size() for t in (x, w, y)) / 1e6
        print(f"\n{name} {p.describe()} ({cl.selected.name}); x+w+y {mb:.1f} MB")
        for k, fn in fns.items():
            ev = time_cuda(fn, iterations=50, warmup=5)
            q = time_cuda_queued(fn, iterations=50, warmup=5)
            print(f"  {k:<40} events {ev.median_ms:8.4f} ms   queued (GPU only) {q.median_ms:8.4f} ms")


if __name__ == "__main__":
    main()
