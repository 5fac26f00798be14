"""The first training step of ResNet-50 (fp32, TF32 off, b32): each parameter gradient of the converted model and of a second torch run, against torch (normwise and max relative error; the worst four)."""
import copy, sys, torch
sys.path.append("benchmarks")
from bench_resnet50 import build_resnet50
import rawconv.nn as rnn
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = False
m, _ = build_resnet50()
m = m.train().cuda().to(memory_format=torch.channels_last)
x = torch.randn(32, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
t = torch.randint(0, 1000, (32,), device="cuda")
res = {}
for name, mm in (("torch", copy.deepcopy(m)), ("torch2", copy.deepcopy(m)), ("rawconv", rnn.convert(copy.deepcopy(m)))):
    loss = torch.nn.functional.cross_entropy(mm(x), t); loss.backward()
    res[name] = {n: p.grad.double() for n, p in mm.named_parameters()}
for other in ("torch2", "rawconv"):
    errs = sorted(((res[other][n] - g).norm().item() / g.norm().item(), n) for n, g in res["torch"].items())
    print(other, "worst norm-rel:", [(f"{e:.1e}", n) for e, n in errs[-4:]])
    mx = sorted((((res[other][n] - g).abs().max() / g.abs().max()).item(), n) for n, g in res["torch"].items())
    print(other, "worst max-rel:", [(f"{e:.1e}", n) for e, n in mx[-3:]])

# which part: the graph plans' hot packs off; the legacy API
import rawconv.cudnn_graph as G  # noqa: E402
for label, setup in (("no hot packs", lambda: setattr(G._GraphHot, "of", classmethod(lambda cls, *a: None))),
                     ("legacy backend", None)):
    if setup:
        setup()
    mm = rnn.convert(copy.deepcopy(m), backend="cudnn") if label == "legacy backend" else rnn.convert(copy.deepcopy(m))
    loss = torch.nn.functional.cross_entropy(mm(x), t); loss.backward()
    g = {n: p.grad.double() for n, p in mm.named_parameters()}
    errs = sorted(((g[n] - r).norm().item() / r.norm().item(), n) for n, r in res["torch"].items())
    print(label, "worst norm-rel:", [(f"{e:.1e}", n) for e, n in errs[-3:]], flush=True)
