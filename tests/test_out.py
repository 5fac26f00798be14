"""``out=`` behaves as torch's ``out=`` on every entry point that takes it (issue 13): the version
counter is bumped (a graph that saved the buffer raises at backward, as after torch's own out=
ops), a tensor that requires grad (a leaf included) is refused with grad mode on, an inference
tensor is refused outside inference mode, memory shared with an input is refused, and ``out``
itself is returned holding the float64-checked result.

CPU: rawconv.onednn (forward, backward_data, Convolution.execute in both directions, the fused
plan); GPU (marked ``gpu``): rawconv.cudnn and rawconv.cudnn_graph function forms and plans.
rawconv.ops takes no ``out=`` (its operators are functional), checked here too.
"""
from __future__ import annotations

import inspect

import pytest
import torch

from rawconv import ArgumentError, ConvProblem, check, onednn

X_SHAPE, W_SHAPE = (2, 3, 8, 8), (4, 3, 3, 3)


def _cpu_calls():
    """name -> (make inputs on a device, call(inputs, out), out shape, direction)."""
    def fwd(t, out):
        return onednn.forward(t["x"], t["w"], padding=1, out=out)

    def bwd(t, out):
        return onednn.backward_data(t["dy"], t["w"], X_SHAPE, padding=1, out=out)

    def plan_fwd(t, out):
        return onednn.Convolution(t["x"], t["w"], padding=1).execute(t["x"], t["w"], out=out)

    def plan_fwd_snapshot(t, out):
        return onednn.Convolution(t["x"], t["w"], padding=1, prepack=True).execute(t["x"], out=out)

    def plan_bwd(t, out):
        p = ConvProblem.from_torch(t["x"], t["w"], None, 1, 1)
        return onednn.Convolution.from_problem(p, direction="backward_data").execute(grad_y=t["dy"], w=t["w"], out=out)

    y_shape = (2, 4, 8, 8)
    return {"onednn.forward": (fwd, y_shape, "forward"), "onednn.backward_data": (bwd, X_SHAPE, "backward_data"),
            "Convolution.execute": (plan_fwd, y_shape, "forward"),
            "Convolution(prepack=True).execute": (plan_fwd_snapshot, y_shape, "forward"),
            "Convolution.execute backward_data": (plan_bwd, X_SHAPE, "backward_data")}


def _tensors(device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(3)
    t = {"x": torch.randn(X_SHAPE, generator=g), "w": torch.randn(W_SHAPE, generator=g),
         "dy": torch.randn(2, 4, 8, 8, generator=g)}
    return {k: v.to(device, dtype) for k, v in t.items()}


def _check_result(out, t, direction):
    p = ConvProblem.from_torch(t["x"].cpu(), t["w"].cpu(), None, 1, 1)
    ref, ref_abs = check.reference(p, direction, {k: v.cpu() for k, v in t.items()})
    assert check.check(p, out.cpu(), ref, ref_abs, check.tolerance_for(p, direction)).ok


def _out_rules(call, shape, direction, device="cpu"):
    t = _tensors(device)
    # 1. the result is written into out, which is returned, and its version counter moves
    buf = torch.zeros(shape, device=device)
    v0 = buf._version
    res = call(t, buf)
    assert res is buf and buf._version > v0
    _check_result(buf, t, direction)
    # 2. the repro: a graph that saved buf raises at backward, as after torch's out= ops
    a = torch.randn(shape, device=device, requires_grad=True)
    z = (a * buf).sum()
    call(t, buf)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()
    # 3. out that requires grad (a leaf, or part of a graph) is refused with grad mode on, as torch does
    leaf = torch.zeros(shape, device=device, requires_grad=True)
    with pytest.raises(ArgumentError, match="requires grad"):
        call(t, leaf)
    with pytest.raises(ArgumentError, match="requires grad"):
        call(t, leaf * 1)
    assert torch.count_nonzero(leaf) == 0                      # refused before anything was written
    with torch.no_grad():                                        # ... and allowed without grad mode, as torch
        assert call(t, leaf) is leaf
    _check_result(leaf.detach(), t, direction)
    # 4. an inference tensor only inside inference mode
    with torch.inference_mode():
        inf = torch.zeros(shape, device=device)
        assert call(t, inf) is inf
    with pytest.raises(ArgumentError, match="inference"):
        call(t, inf)
    # 5. memory shared with an input is refused (out's first 4 elements are the input's last 4)
    src = "x" if direction == "forward" else "dy"
    n_in, n_out = t[src].numel(), torch.Size(shape).numel()
    big = torch.zeros(n_in + n_out, device=device)
    big[:n_in] = t[src].flatten()
    shared = dict(t, **{src: big[:n_in].view(t[src].shape)})
    with pytest.raises(ArgumentError, match="overlaps"):
        call(shared, big[n_in - 4:n_in - 4 + n_out].view(shape))


@pytest.mark.usefixtures("dnnl")
@pytest.mark.parametrize("name", list(_cpu_calls()))
def test_out_follows_torchs_rules_on_cpu(name):
    call, shape, direction = _cpu_calls()[name]
    _out_rules(call, shape, direction)


@pytest.mark.usefixtures("dnnl")
def test_torchs_own_out_ops_raise_as_rawconv_does():
    """The premise: torch's own out= op makes the same backward raise."""
    buf = torch.zeros(3)
    a = torch.randn(3, requires_grad=True)
    z = (a * buf).sum()
    torch.add(torch.ones(3), 1, out=buf)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()
    with pytest.raises(RuntimeError, match="out="):
        torch.add(torch.ones(3), 1, out=torch.zeros(3, requires_grad=True))


@pytest.mark.usefixtures("dnnl")
def test_inputs_that_require_grad_refuse_out_on_plans_too():
    t = _tensors()
    w = t["w"].requires_grad_()
    plan = onednn.Convolution(t["x"], w, padding=1)
    with pytest.raises(ArgumentError, match="requires grad"):
        plan.execute(t["x"], w, out=torch.empty(2, 4, 8, 8))
    with pytest.raises(ArgumentError, match="not differentiable|requires grad"):
        onednn.forward(t["x"], w, padding=1, out=torch.empty(2, 4, 8, 8))


def test_rawconv_ops_take_no_out():
    import rawconv.ops as rops

    for fn in (rops.conv, rops.conv_backward_data, rops.conv_backward_weights):
        assert "out" not in inspect.signature(fn).parameters


# ---------------------------------------------------------------------------- GPU
def _gpu_calls():
    from rawconv import cudnn, cudnn_graph

    def lf(t, out):
        return cudnn.forward(t["x"], t["w"], padding=1, out=out)

    def lb(t, out):
        return cudnn.backward_data(t["dy"], t["w"], X_SHAPE, padding=1, out=out)

    def lplan(t, out):
        return cudnn.Convolution(t["x"], t["w"], padding=1).execute(t["x"], t["w"], out=out)

    def gf(t, out):
        return cudnn_graph.forward(t["x"], t["w"], padding=1, out=out)

    def gb(t, out):
        return cudnn_graph.backward_data(t["dy"], t["w"], X_SHAPE, padding=1, out=out)

    def gplan(t, out):
        return cudnn_graph.GraphConvolution(t["x"], t["w"], padding=1).execute(t["x"], t["w"], out=out)

    y = (2, 4, 8, 8)
    return {"cudnn.forward": (lf, y, "forward"), "cudnn.backward_data": (lb, X_SHAPE, "backward_data"),
            "cudnn.Convolution.execute": (lplan, y, "forward"), "cudnn_graph.forward": (gf, y, "forward"),
            "cudnn_graph.backward_data": (gb, X_SHAPE, "backward_data"),
            "cudnn_graph.GraphConvolution.execute": (gplan, y, "forward")}


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cudnn.forward", "cudnn.backward_data", "cudnn.Convolution.execute",
                                  "cudnn_graph.forward", "cudnn_graph.backward_data",
                                  "cudnn_graph.GraphConvolution.execute"])
def test_out_follows_torchs_rules_on_gpu(name):
    call, shape, direction = _gpu_calls()[name]
    _out_rules(call, shape, direction, device="cuda")
