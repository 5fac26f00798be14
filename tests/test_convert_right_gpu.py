"""Issue 24 on CUDA (the lead runs these on the device machine): converted models stay right when
the weights or the inputs change, and convert(autotune=x) searches and pins the backward passes
per distinct problem, on the tensors' layout (channels_last models: channels_last backward
problems), through cuDNN's graph API (the legacy API where no graph config runs a problem)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import rawconv.nn as rnn

pytestmark = pytest.mark.gpu


def _randomize_bn(m, seed):
    g = torch.Generator().manual_seed(seed)
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            n = mod.num_features
            mod.running_mean.copy_(torch.rand(n, generator=g) - 0.5)
            mod.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            mod.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
            mod.bias.data.copy_(torch.rand(n, generator=g) - 0.5)


class Res(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(c)
        self.head = nn.Conv2d(c, 8, 1)

    def forward(self, x):
        h = torch.relu(self.b1(self.c1(x)))
        return self.head(torch.relu(self.b2(self.c2(h)) + h))


def _res(seed=0):
    torch.manual_seed(seed)
    m = Res()
    with torch.no_grad():
        _randomize_bn(m, seed + 100)
    return m.eval()


class Trainable(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn = nn.BatchNorm2d(32)
        self.c2 = nn.Conv2d(32, 32, 3, padding=1)
        self.c3 = nn.Conv2d(32, 32, 3, padding=1)
        self.up = nn.ConvTranspose2d(32, 16, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        h = torch.relu(self.bn(self.c1(x)))
        return self.up(torch.relu(self.c3(torch.relu(self.c2(h)))))


def _rel(got, want) -> float:
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return ((got - want).abs().max() / want.abs().max()).item()


def _cpu64(m):
    """The converted model's own state in a float64 torch twin on the CPU."""
    t = _res()
    t.load_state_dict({k: v.cpu() for k, v in m.state_dict().items()})
    return t.double().eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_fused_model_follows_weight_changes(dtype):
    cl = torch.channels_last
    m = rnn.convert(_res().cuda().to(dtype).to(memory_format=cl), fuse=True)
    x = torch.randn(4, 16, 12, 12, device="cuda", dtype=dtype).to(memory_format=cl)
    tol = 1e-4 if dtype == torch.float32 else 2e-2

    def check():
        with torch.no_grad():
            assert _rel(m(x), _cpu64(m)(x.double().cpu())) <= tol

    check()
    m.load_state_dict(_res(1).to(dtype).state_dict())
    check()
    with torch.no_grad():
        m.get_submodule("c1").weight.mul_(-1.5)
        m.get_submodule("b2").running_var.add_(1.0)
    check()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3, fused=True)   # moves no version counter
    m.train()
    F.mse_loss(m(x).float(), torch.zeros(4, 8, 12, 12, device="cuda")).backward()
    opt.step()
    m.eval()
    check()


def test_cuda_autotune_pins_backward_per_problem_on_the_tensors_layout(monkeypatch):
    # strict float32 throughout (convert, search, the steps): under torch's default allow_tf32=True the
    # pinned configs are TF32 ones, and the training BatchNorm below magnifies TF32's rounding to 7.6e-2
    # of x.grad (H200 and H100, 2026-12-07) where the strict floor it was held to is 1e-6; each layer's
    # own dx/dw on the captured tensors was within 7e-7 of float64 (benchmarks/diag_grad_gpu.py)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    rnn.clear_tuning()
    searched = []
    real = rnn._search_direction

    def count(direction, problem, *a, **k):
        searched.append((direction, problem))
        return real(direction, problem, *a, **k)
    monkeypatch.setattr(rnn, "_search_direction", count)
    torch.manual_seed(1)
    net = Trainable().cuda().to(memory_format=torch.channels_last)   # training mode: backward searched too
    x = torch.randn(8, 16, 16, 16, device="cuda").to(memory_format=torch.channels_last)
    m = rnn.convert(net, autotune=x, autotune_budget_s=0.5)
    rep = m.rawconv_report
    assert rep.backward and all(t["backend"] == "cudnn" for t in rep.tuned)
    assert len(searched) == len(set(searched)) == 6 and all(p.layout == "nhwc" for _d, p in searched)
    for t in rep.tuned:
        assert t["backward_choice"] is not None and all(c for c in t["backward_choice"]), t
    # the backward passes run the pinned choices: the cuDNN function forms are asked for them
    from rawconv import cudnn

    asked = []
    for name in ("backward_data", "backward_weights"):
        fn = getattr(cudnn, name)

        def spy(*a, _fn=fn, _name=name, **k):
            asked.append((_name, k.get("choice")))
            return _fn(*a, **k)
        monkeypatch.setattr(cudnn, name, spy)
    from rawconv import cudnn_graph   # the graph API (engine configs "eng..."): the operators' default

    real_grad_plan = cudnn_graph.cached_grad_plan

    def spy_graph(direction, *a, **k):
        asked.append(({"backward_filter": "backward_weights"}.get(direction, direction), a[7]))   # (.., groups, choice)
        return real_grad_plan(direction, *a, **k)
    monkeypatch.setattr(cudnn_graph, "cached_grad_plan", spy_graph)
    xg = x.clone().requires_grad_()
    m(xg).square().sum().backward()
    pinned = {(d, c) for t in rep.tuned for d, c in t["directions"].items() if d != "forward"}
    got = {(d, c.split("@")[0] if isinstance(c, str) and "@" in c and not c.startswith(("eng", "nhwc:"))
            else c) for d, c in asked}
    want = {(d, c.split("@")[0] if isinstance(c, str) and "@" in c and not c.startswith(("eng", "nhwc:")) else c)
            for d, c in pinned}
    assert want <= got, (want, got)
    # gradients against float64 on the CPU, beside torch's own float32 step (no TF32) as the noise floor:
    # the BatchNorm's training backward subtracts the per-channel mean of a gradient that is mostly that
    # mean, which magnifies every float32 rounding upstream (the H200 run of 2026-12-07 measured 7.6e-2
    # against a fixed 1e-3 bound, torch's own error unmeasured)
    t64 = copy.deepcopy(net).cpu().double()
    x64 = x.detach().cpu().double().requires_grad_()
    t64(x64).square().sum().backward()
    t32 = copy.deepcopy(net)
    xt = x.clone().requires_grad_()
    t32(xt).square().sum().backward()
    floor = _rel(xt.grad, x64.grad)
    assert _rel(xg.grad, x64.grad) <= max(1e-4, 5 * floor), (_rel(xg.grad, x64.grad), floor)
    # another batch size and layout: the default choices, never a refusal
    for xx in (torch.randn(3, 16, 16, 16, device="cuda"), torch.randn(8, 16, 20, 20, device="cuda")):
        with torch.no_grad():
            assert _rel(m(xx), t64(xx.cpu().double())) <= 1e-3


@pytest.mark.parametrize("fuse", [False, True])
def test_cuda_autotuned_model_runs_other_batch_sizes_layouts_and_dtypes(fuse):
    rnn.clear_tuning()
    net = _res().cuda()
    x = torch.randn(4, 16, 12, 12, device="cuda").to(memory_format=torch.channels_last)
    m = rnn.convert(net, fuse=fuse, autotune=x, autotune_budget_s=0.3)
    ref = copy.deepcopy(net).cpu().double()
    tried = 0
    for n in (1, 4, 7):
        for cl in (False, True):
            for dtype in (torch.float32, torch.float16):
                xx = torch.randn(n, 16, 12, 12, device="cuda", dtype=dtype)
                if cl:
                    xx = xx.to(memory_format=torch.channels_last)
                mm = m if dtype == torch.float32 else copy.deepcopy(m).half()
                # float32: 1e-3 (strict math: no TF32; a transform algorithm such as Winograd, which the
                # tolerance policy allows, measured 1.5e-4 and 2.5e-4 here on an H200 on 2026-12-07)
                with torch.no_grad():
                    assert _rel(mm(xx), ref(xx.double().cpu())) <= (1e-3 if dtype == torch.float32 else 2e-2)
                tried += 1
    assert tried == 12


@pytest.mark.parametrize("new", ["default", "search"])
def test_cuda_autotuned_model_trains_under_autocast_on_its_float16_problems(new):
    """convert(autotune=x) on float32, then a training step under torch.autocast("cuda", float16):
    each call takes the choice of its float16 problem (searched at its first call with
    autotune_new="search", else cuDNN's default), never the float32 winner; output and the input's
    gradient as torch's own autocast step (float16's tolerance)."""
    rnn.clear_tuning()
    net = _res().cuda().train()
    x = torch.randn(4, 16, 12, 12, device="cuda").to(memory_format=torch.channels_last)
    m = rnn.convert(copy.deepcopy(net), autotune=x, autotune_budget_s=0.3, autotune_new=new)
    outs = []
    for mod in (m, copy.deepcopy(net)):
        xg = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.float16):
            y = mod(xg)
        assert y.dtype == torch.float16
        y.float().square().sum().backward()
        outs.append((y, xg.grad))
    assert _rel(outs[0][0], outs[1][0]) <= 2e-2
    assert _rel(outs[0][1], outs[1][1]) <= 5e-2
    tuned = rnn.pinned_choices(m)
    assert all(len(p["tuned"]) == (2 if new == "search" else 1) for p in tuned.values()), tuned
