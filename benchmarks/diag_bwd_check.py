"""Backward data and backward weights of ResNet-50's layer4 problems (b32, fp32 strict, channels_last):
rawconv's operators (graph API default, and legacy) against float64, with the engine each ran."""
import sys
import torch
import torch.nn.functional as F
sys.path.append(".")
import rawconv.ops as ops  # noqa: E402

torch.manual_seed(0)
cl = torch.channels_last
for (c, k, ks, hw, st) in ((512, 512, 3, 7, 1), (2048, 512, 1, 7, 1), (512, 2048, 1, 7, 1), (64, 64, 3, 56, 1)):
    x = torch.randn(32, c, hw, hw, device="cuda").contiguous(memory_format=cl)
    w = (torch.randn(k, c, ks, ks, device="cuda") * 0.05).contiguous(memory_format=cl)
    pad = ks // 2
    y = F.conv2d(x, w, padding=pad)
    gy = torch.randn_like(y).contiguous(memory_format=cl)
    xd, wd, gd = x.double().requires_grad_(), w.double().requires_grad_(), gy.double()
    F.conv2d(xd, wd, padding=pad).backward(gd)
    for backend in ("auto", "cudnn"):
        dx = ops.conv_backward_data(gy, w, x.shape, 1, pad, backend=backend)
        dw = ops.conv_backward_weights(x, gy, w.shape, 1, pad, backend=backend)
        ex = ((dx.double() - xd.grad).norm() / xd.grad.norm()).item()
        ew = ((dw.double() - wd.grad).norm() / wd.grad.norm()).item()
        plans = [p for p in ops._cuda_last._plans.values() if getattr(p, "problem", None) is not None
                 and p.problem.c == c and p.problem.k == k]
        names = sorted({f"{getattr(p, 'direction', '?')}:{getattr(p, 'selected_name', '') or type(p).__name__}" for p in plans})
        print(f"c{c} k{k} {ks}x{ks} {hw}x{hw} {backend:6s} dx err {ex:.1e} dw err {ew:.1e} {names}", flush=True)
