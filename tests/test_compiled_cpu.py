"""A converted model under torch.compile with inductor on the CPU (the zoo's ``rawconv_compile``
variant: freezing, no_grad): the code inductor generates around ``rawconv::conv_bias_act`` (no copy
of a result into another layout: the fake kernel's strides are the real kernel's), and torch
eager's NaNs kept where inductor writes a dead intermediate's memory in place."""
from __future__ import annotations

import math
import re
import shutil

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import rawconv.nn as rnn

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="inductor's CPU backend needs a C++ compiler")


def _compiled(m, *args):
    """``torch.compile(m)`` with inductor freezing (benchmarks/zoo.py's CPU recipe), compiled by a first
    call under no_grad; returns (the compiled callable, the generated wrapper code)."""
    import torch._inductor.config as icfg
    from torch._inductor.utils import run_and_get_code

    c = torch.compile(m, options={"freezing": True})
    with icfg.patch(freezing=True), torch.no_grad():
        _, codes = run_and_get_code(c, *args)
    return c, "\n".join(codes)


class _Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + x)


def _chain():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), _Block(16),
                      _Block(16)).eval()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.uniform_(0.5, 1.5)
    return m


@pytest.mark.parametrize("fmt", ["channels_last", "contiguous"])
def test_inductor_puts_no_copy_around_the_fused_operator(fmt):
    """Conv+BN+ReLU blocks with residuals, converted (fuse=True) and compiled: the generated code
    calls the fused operators on each other's results as they are (no clone, no copy into another
    layout, no as_strided view, no aten convolution left), its results right against float64."""
    mf = {"channels_last": torch.channels_last, "contiguous": torch.contiguous_format}[fmt]
    m = _chain().to(memory_format=mf)
    x = torch.randn(2, 3, 12, 12).to(memory_format=mf)
    c, code = _compiled(rnn.convert(m, fuse=True), x)
    body = code[code.index("def call("):]
    calls = re.findall(r"torch\.ops\.rawconv\.(\w+)\.default\(", body)
    assert calls.count("conv_bias_act") == 3 and calls.count("conv_bias_act_residual_") == 2, calls
    for bad in (".clone(", "copy_(", "as_strided(", ".contiguous(", "convolution", "mkldnn"):
        assert bad not in body, bad
    with torch.no_grad():
        y = c(x)
        want = m.double()(x.double())
    assert y.is_contiguous(memory_format=mf)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,fmt", [((2, 8, 9, 9), "nchw"), ((2, 8, 9, 9), "nhwc"), ((8, 9, 9), "nchw"),
                                       ((2, 8, 5, 6, 7), "ndhwc"), ((2, 8, 11), "nchw")])
def test_the_fake_kernel_gives_the_real_results_strides(shape, fmt):
    """The operator's fake kernel (what inductor plans buffers by) and its CPU kernel return the same
    shape and strides for NCHW, channels-last, unbatched, 3-D and 1-D inputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.manual_seed(1)
    nd = {4: 2, 5: 3}.get(len(shape), 1 if shape == (2, 8, 11) else 2)
    x = torch.randn(shape)
    if fmt == "nhwc":
        x = x.to(memory_format=torch.channels_last)
    elif fmt == "ndhwc":
        x = x.to(memory_format=torch.channels_last_3d)
    w = torch.randn((8, 8) + (3,) * nd) * 0.1
    b = torch.randn(8)
    args = (b, None, [1] * nd, [1] * nd, [1] * nd, 1, "relu", "auto", None, "strict")
    with torch.no_grad():
        y = torch.ops.rawconv.conv_bias_act(x, w, *args)
    with FakeTensorMode() as mode:
        fy = torch.ops.rawconv.conv_bias_act(mode.from_tensor(x), mode.from_tensor(w), mode.from_tensor(b),
                                             *args[1:])
    assert tuple(fy.shape) == tuple(y.shape) and fy.stride() == y.stride(), (fy.stride(), y.stride())
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    torch.testing.assert_close(y.double(), F.relu(conv(x.double(), w.double(), b.double(), padding=1)),
                               rtol=1e-5, atol=1e-5)


def test_a_nan_made_in_a_compiled_graph_between_two_fused_convolutions_stays_nan():
    """``relu(conv(x))`` then ``* g`` (an infinity in g makes NaNs and infinities) then
    ``relu(conv(.))``: inductor computes the product in place in the first result's memory (its
    version counter does not move), so the bound the first fused plan left there no longer holds; the
    second fused ReLU must still give torch's NaNs (the kernel reached through the dispatcher drops
    the carried bounds and reads x)."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x, g):
            return F.relu(self.c2(F.relu(self.c1(x)) * g))

    torch.manual_seed(2)
    m = M().eval().to(memory_format=torch.channels_last)
    x = torch.randn(1, 8, 10, 10).to(memory_format=torch.channels_last)
    g = torch.ones(1, 8, 1, 1)
    c, code = _compiled(rnn.convert(m, fuse=True), x, g)
    g[0, 3] = math.inf
    with torch.no_grad():
        want = m(x, g)
        assert torch.isnan(want).any()
        for _ in range(2):
            y = c(x, g)
            assert torch.equal(torch.isnan(y), torch.isnan(want)), (int(torch.isnan(y).sum()),
                                                                    int(torch.isnan(want).sum()))
            fin = torch.isfinite(want)
            torch.testing.assert_close(y[fin], want[fin], rtol=1e-5, atol=1e-5)


def test_eager_and_compiled_calls_of_an_autotuned_model_share_each_layers_plan():
    """convert(fuse=True, autotune=x): the eager call resolves each layer's autotuned choice when its
    plan is made, the compiled graph passes it to the operator; both reach the same plan (one weight
    snapshot reordered per layer, not one per way of calling), and give the same results."""
    from rawconv.onednn.fused import FusedConvolution
    from rawconv.pytorch import fused as fu, fusion as _fusion

    m = _chain().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 12, 12).to(memory_format=torch.channels_last)
    with torch.no_grad():
        rm = rnn.convert(m, fuse=True, autotune=x, autotune_budget_s=0.05)
    frozen = [mod for mod in rm.modules() if fu.FROZEN_WEIGHT in mod._buffers]
    assert len(frozen) == 5
    for mod in frozen:   # every layer fused (what convert measured unfused runs its own choice either way)
        mod.__dict__.pop(_fusion.UNFUSED_ATTR, None)
    c, code = _compiled(rm, x)
    fu._clear_frozen_plans()   # the plans made from here on: by the compiled calls first, then the eager ones
    assert re.search(r"rawconv\.conv_bias_act\w*\.default\([^)]*'[\w:@]+', 'strict'\)", code), \
        "the compiled graph passes no autotuned choice: nothing to check"
    with torch.no_grad():
        c(x)
    snaps = []
    orig = FusedConvolution._snapshot

    def counting(self, *a, **k):
        snaps.append(self)
        return orig(self, *a, **k)

    FusedConvolution._snapshot = counting
    try:
        with torch.no_grad():
            outs = [c(x), rm(x), c(x), rm(x)]
    finally:
        FusedConvolution._snapshot = orig
    assert snaps == [], f"{len(snaps)} weight snapshots taken by the eager calls after the compiled call's"
    for mod in frozen:
        plans = {id(p) for p in mod.__dict__[fu._FROZEN_PLANS].values()}
        assert len(plans) == 1, (mod, list(mod.__dict__[fu._FROZEN_PLANS]))
    want = m.double()(x.double())
    for y in outs:
        torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(outs[0], outs[1])
