"""How far torch's own ResNet-50 gradients (first step, fp32, TF32 off, b32) move when only cuDNN's algorithms change: cudnn.benchmark off, NCHW instead of channels_last (the spread a correct implementation with other kernels can show)."""
import copy, sys, torch
sys.path.append("benchmarks")
from bench_resnet50 import build_resnet50
torch.backends.cudnn.allow_tf32 = False
m, _ = build_resnet50()
m = m.train().cuda().to(memory_format=torch.channels_last)
x = torch.randn(32, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
t = torch.randint(0, 1000, (32,), device="cuda")
res = {}
for name, bench, fmt in (("bench", True, torch.channels_last), ("nobench", False, torch.channels_last), ("nchw", True, torch.contiguous_format)):
    torch.backends.cudnn.benchmark = bench
    mm = copy.deepcopy(m).to(memory_format=fmt)
    loss = torch.nn.functional.cross_entropy(mm(x.contiguous(memory_format=fmt)), t); loss.backward()
    res[name] = {n: p.grad.double() for n, p in mm.named_parameters()}
for other in ("nobench", "nchw"):
    errs = sorted(((res[other][n] - g).norm().item() / g.norm().item(), n) for n, g in res["bench"].items())
    print("torch", other, "vs torch benchmark: worst norm-rel", [(f"{e:.1e}", n) for e, n in errs[-3:]], flush=True)
