"""Device diagnostic (the two failing tests of tests/test_convert_right_gpu.py, H200 2026-12-07): per-layer backward errors of the converted Trainable net
of tests/test_convert_right_gpu.py, and the other-batch-size errors, with what each layer ran."""
import copy, os, sys, torch, torch.nn.functional as F
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from test_convert_right_gpu import Trainable, _res, _rel
import rawconv.nn as rnn

def layer_check(m, x, tag):
    store = {}
    def fwd(mod, inp, out, name):
        xi = inp[0]
        if xi.requires_grad:
            xi.register_hook(lambda g, name=name: store.setdefault(name, {}).__setitem__("dx", g.detach().clone()))
        out.register_hook(lambda g, name=name: store.setdefault(name, {}).__setitem__("dy", g.detach().clone()))
        store.setdefault(name, {})["x"] = xi.detach().clone()
    hs = [mod.register_forward_hook(lambda mod, i, o, name=n: fwd(mod, i, o, name)) for n, mod in m.named_modules()
          if n in ("c1", "c2", "c3", "up")]
    xg = x.clone().requires_grad_()
    m(xg).square().sum().backward()
    for h in hs: h.remove()
    for n in ("c1", "c2", "c3", "up"):
        mod, s = m.get_submodule(n), store[n]
        x64 = s["x"].double().requires_grad_()
        w64 = mod.weight.detach().double().requires_grad_()
        if n == "up":
            y64 = F.conv_transpose2d(x64, w64, mod.bias.detach().double(), 2, 1, 1)
        else:
            y64 = F.conv2d(x64, w64, mod.bias.detach().double(), 1, 1)
        y64.backward(s["dy"].double())
        dx_err = _rel(s["dx"], x64.grad) if "dx" in s else None
        print(f"{tag} {n}: dx rel {dx_err}, dw rel {_rel(mod.weight.grad, w64.grad):.2e}, x strides {s['x'].stride()}, "
              f"dy strides {s['dy'].stride()}, backward_choice {getattr(mod, 'backward_choice', None)}", flush=True)
        mod.weight.grad = None

rnn.clear_tuning()
torch.manual_seed(1)
net = Trainable().cuda().to(memory_format=torch.channels_last)
x = torch.randn(8, 16, 16, 16, device="cuda").to(memory_format=torch.channels_last)
m = rnn.convert(net, autotune=x, autotune_budget_s=0.5)
for t in m.rawconv_report.tuned:
    print("tuned", t.get("name"), t.get("kind"), t.get("directions"), flush=True)
layer_check(m, x, "pinned")
m2 = rnn.convert(copy.deepcopy(net))
layer_check(m2, x, "default")

rnn.clear_tuning()
for fuse in (False, True):
    net = _res().cuda()
    x = torch.randn(4, 16, 12, 12, device="cuda").to(memory_format=torch.channels_last)
    m = rnn.convert(net, fuse=fuse, autotune=x, autotune_budget_s=0.3)
    ref = copy.deepcopy(net).cpu().double()
    for n in (1, 4, 7):
        for cl in (False, True):
            xx = torch.randn(n, 16, 12, 12, device="cuda")
            if cl:
                xx = xx.to(memory_format=torch.channels_last)
            with torch.no_grad():
                e = _rel(m(xx), ref(xx.double().cpu()))
            if e > 1e-4:
                print(f"fuse={fuse} n={n} cl={cl}: rel {e:.2e}", flush=True)
                print(rnn.describe(m, xx, timing=False), flush=True)
print("torch allow_tf32 cudnn", torch.backends.cudnn.allow_tf32, "matmul", torch.backends.cuda.matmul.allow_tf32)
