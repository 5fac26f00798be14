"""The CPU operators' default choice (nothing pinned), backward passes and forward: on channels-last
tensors, oneDNN's first implementation on the tensors' own layouts (what torch's oneDNN is asked for: no conversion of x and
dy on every call; for a depthwise 5x5 / 7x7 backward-weights not ``x64:gemm:jit`` on NCHW copies),
on NCHW tensors oneDNN's first choice as before; the function forms keep oneDNN's first choice. Every
gradient checked against float64 torch."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import rawconv.nn as rnn
import rawconv.ops as ops
from rawconv import ConvProblem, onednn

pytestmark = pytest.mark.usefixtures("dnnl")

CL = torch.channels_last
# id, x shape, w shape, torch-style arguments
CASES = [
    ("depthwise-7x7", (2, 16, 12, 12), (16, 1, 7, 7), dict(padding=3, groups=16)),
    ("depthwise-5x5-s2", (2, 24, 11, 11), (24, 1, 5, 5), dict(stride=2, padding=2, groups=24)),
    ("pointwise", (2, 16, 9, 9), (24, 16, 1, 1), dict()),
    ("grouped-3x3", (2, 12, 10, 10), (12, 4, 3, 3), dict(padding=1, groups=3)),
    ("stem-3ch-s2", (2, 3, 20, 20), (16, 3, 3, 3), dict(stride=2, padding=1)),
]


def _data_reorders(impl) -> set:
    return {r for r in impl.reorders if r not in ("w", "dw")}


def _by_choice(impls, choice: str):
    got = [i for i in impls if i.choice == choice]
    assert got, f"{choice} not in {[i.choice for i in impls]}"
    return got[0]


def _tensors(xs, ws, layout, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(xs, generator=g)
    w = torch.randn(ws, generator=g)
    if layout == "nhwc":
        x, w = x.contiguous(memory_format=CL), w.contiguous(memory_format=CL)
    return x, w


def _grads_vs_float64(x, w, kw, dy, run):
    """(dx, dw) of ``run`` (a callable of x, w requiring grad) and their normwise errors against float64 torch."""
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    run(xr, wr).backward(dy)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    F.conv2d(x64, w64, None, **kw).backward(dy.double())
    return [((g.double() - r).abs().max() / r.abs().max()).item() for g, r in ((xr.grad, x64.grad), (wr.grad, w64.grad))]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_channels_last_backward_default_runs_on_the_tensors_layouts(case):
    _, xs, ws, kw = case
    x, w = _tensors(xs, ws, "nhwc")
    ops.clear_cache()
    sel = ops.selected(x, w, None, **kw)
    for direction in ("forward", "backward_data", "backward_weights"):
        impls = onednn.implementations(x, w, direction=direction, **kw)
        offered = [i for i in impls if i.layouts == "user" and not i.name.startswith("ref") and not i.known_bad
                   and not _data_reorders(i)]
        if not offered:
            pytest.skip(f"this CPU's oneDNN offers no {direction} on the tensors' own layouts for {case[0]}")
        got = _by_choice(impls, sel[direction])
        first = [i for i in impls if not i.known_bad][0]
        # oneDNN's first on the tensors' layouts (its own order), with no x / dy conversion per call
        assert got.choice == (offered[0].choice if _data_reorders(first) else first.choice)
        assert not _data_reorders(got), (direction, got)
    # what a training step runs is that choice, and its gradients are right
    y = F.conv2d(x, w, None, **kw)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).contiguous(memory_format=CL)
    ops.clear_cache()
    errs = _grads_vs_float64(x, w, kw, dy, lambda a, b: ops.conv(a, b, None, **kw))
    ran = {p.direction: p.selected.choice for p in ops._cpu_cache._plans.values()}
    assert ran == sel
    assert max(errs) < 2e-6, errs
    y64 = F.conv2d(x.double(), w.double(), None, **kw)
    assert ((ops.conv(x, w, None, **kw).double() - y64).abs().max() / y64.abs().max()).item() < 2e-6


def test_depthwise_7x7_weights_gradient_leaves_the_gemm_on_nchw_copies():
    """oneDNN 3.2's first choice for this backward-weights is x64:gemm:jit on NCHW copies of x and dy
    (``layouts=any``); the default no longer runs it (it does on NCHW tensors, as torch's oneDNN)."""
    x, w = _tensors((2, 16, 12, 12), (16, 1, 7, 7), "nhwc")
    kw = dict(padding=3, groups=16)
    impls = onednn.implementations(x, w, direction="backward_weights", **kw)
    if not _data_reorders(impls[0]):
        pytest.skip(f"oneDNN's first choice here converts nothing ({impls[0].choice}): nothing to leave")
    choice = ops.selected(x, w, None, **kw)["backward_weights"]
    assert choice != impls[0].choice
    assert _by_choice(impls, choice).layouts == "user"
    # NCHW tensors: oneDNN's first choice, as before (torch's oneDNN reorders NCHW tensors too)
    xn, wn = _tensors((2, 16, 12, 12), (16, 1, 7, 7), "nchw")
    sel = ops.selected(xn, wn, None, **kw)
    for direction in ("backward_data", "backward_weights"):
        assert sel[direction] == onednn.implementations(xn, wn, direction=direction, **kw)[0].choice


def test_function_forms_keep_onednn_first_choice_beside_the_operators():
    x, w = _tensors((2, 16, 12, 12), (16, 1, 7, 7), "nhwc")
    kw = dict(padding=3, groups=16)
    ops.clear_cache()
    ops.conv(x.requires_grad_(), w.requires_grad_(), None, **kw).sum().backward()
    x, w = x.detach(), w.detach()
    problem = ConvProblem.from_torch(x, w, None, 1, 3, 1, 16)
    plan = onednn.cached_plan(problem, "backward_weights", "direct", "strict", "nhwc", None)
    assert plan.selected.index == 0
    dy = torch.randn(2, 16, 12, 12).contiguous(memory_format=CL)
    dw = onednn.backward_weights(x, dy, w.shape, padding=3, groups=16)
    # with grad recorded the function form runs the same implementation (the same bits)
    dwg = onednn.backward_weights(x.clone().requires_grad_(), dy, w.shape, padding=3, groups=16)
    assert dwg.grad_fn is not None and torch.equal(dwg.detach(), dw)
    dx = onednn.backward_data(dy, w, x.shape, padding=3, groups=16)
    assert torch.equal(onednn.backward_data(dy.clone().requires_grad_(), w, x.shape, padding=3, groups=16).detach(), dx)
    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_()
    F.conv2d(x64, w64, None, padding=3, groups=16).backward(dy.double())
    assert ((dw.double() - w64.grad).abs().max() / w64.grad.abs().max()).item() < 2e-6


def test_converted_depthwise_block_trains_like_float64():
    """A converted channels-last block (depthwise 5x5, pointwise, with bias) through one backward:
    every parameter's gradient against the same block in float64."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 5, padding=2, groups=8), torch.nn.GELU(),
                              torch.nn.Conv2d(8, 12, 1)).to(memory_format=CL)
    x = torch.randn(2, 8, 10, 10).contiguous(memory_format=CL)
    ref = {k: v.double() for k, v in net.state_dict().items()}
    net64 = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 5, padding=2, groups=8), torch.nn.GELU(),
                                torch.nn.Conv2d(8, 12, 1)).double()
    net64.load_state_dict(ref)
    rm = rnn.convert(net)
    ops.clear_cache()
    rm(x).square().sum().backward()
    net64(x.double()).square().sum().backward()
    for (k, p), (_, p64) in zip(rm.named_parameters(), net64.named_parameters()):
        err = ((p.grad.double() - p64.grad).abs().max() / p64.grad.abs().max()).item()
        assert err < 1e-5, (k, err)
    # each backward pass ran without converting x and dy wherever oneDNN offers that
    plans = [p for p in ops._cpu_cache._plans.values() if p.direction != "forward"]
    assert len(plans) == 3, plans   # (x needs no gradient: no backward data for the first layer)
    for p in plans:
        if any(i.layouts == "user" and not i.name.startswith("ref") and not i.known_bad and not _data_reorders(i)
               for i in p.implementations):
            assert not _data_reorders(p.selected), (p.direction, p.problem.describe(), p.selected)
