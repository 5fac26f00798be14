"""The operators' hot path on a GPU (issue 38): ``torch.ops.rawconv.conv_forward`` /
``conv_backward_data`` / ``conv_backward_weights`` as torch.compile's generated code and eager
autograd call them (through the dispatcher, nothing requiring grad), on cuDNN's legacy and graph
APIs. After a first (checked) call, a call with the same arguments and tensors' metadata runs the
kept plan's prepared call: its result equals the checked path's and torch's (float64 reference),
and it allocates nothing but its output. Needs a CUDA GPU (not run on the CPU-only machine)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rawconv import ops

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

ONE = [1, 1]
_CHECKED = {"forward": "_forward_cuda_checked", "backward_data": "_backward_data_cuda_checked",
            "backward_weights": "_backward_weights_cuda_checked"}


def _tensors(layout: str, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", generator=g).contiguous(memory_format=fmt)
    return rnd(2, 8, 8, 8), rnd(8, 8, 3, 3), rnd(2, 8, 8, 8)


def _call(direction: str, backend: str, x, w, gy, bias=False):
    """The operator of ``direction`` on (x, w, grad_y) as compiled code calls it; dw alone for weights."""
    if direction == "forward":
        return torch.ops.rawconv.conv_forward(x, w, None, ONE, ONE, ONE, ONE, 1, backend, "", "strict", "", "")
    if direction == "backward_data":
        return torch.ops.rawconv.conv_backward_data(gy, w, list(x.shape), ONE, ONE, ONE, ONE, 1, backend, "",
                                                    "strict")
    dw, db = torch.ops.rawconv.conv_backward_weights(x, gy, list(w.shape), ONE, ONE, ONE, ONE, 1, bias, backend, "",
                                                     "strict")
    if bias:
        torch.testing.assert_close(db, gy.double().sum((0, 2, 3)).float(), rtol=1e-5, atol=1e-4)
    else:
        assert db.shape == (0,)
    return dw


def _reference(direction: str, x, w, gy):
    """float64 torch: y, dx or dw."""
    x64, w64, gy64 = x.double(), w.double(), gy.double()
    if direction == "forward":
        return F.conv2d(x64, w64, None, 1, 1).float()
    mask = [direction == "backward_data", direction == "backward_weights", False]
    dx, dw, _ = torch.ops.aten.convolution_backward(gy64, x64, w64, None, ONE, ONE, ONE, False, [0, 0], 1, mask)
    return (dx if direction == "backward_data" else dw).float()


def _torch_fp32(direction: str, x, w, gy):
    """torch's own cuDNN call in float32 (TF32 off), in torch's memory format."""
    if direction == "forward":
        return F.conv2d(x, w, None, 1, 1)
    mask = [direction == "backward_data", direction == "backward_weights", False]
    dx, dw, _ = torch.ops.aten.convolution_backward(gy, x, w, None, ONE, ONE, ONE, False, [0, 0], 1, mask)
    return dx if direction == "backward_data" else dw


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.fixture(autouse=True)
def _strict_torch():
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    ops.clear_cache()
    yield
    torch.backends.cudnn.allow_tf32 = old
    ops.clear_cache()


@pytest.mark.parametrize("backend, layout", [("cudnn", "nchw"), ("cudnn", "nhwc"), ("cudnn_graph", "nhwc"),
                                             ("auto", "nchw"), ("auto", "nhwc")])
@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_weights"])
def test_operator_hot_path_equals_checked_path_and_torch(monkeypatch, backend, layout, direction):
    x, w, gy = _tensors(layout, 0)
    checked = _call(direction, backend, x, w, gy)   # the checked path; the kernel keeps its plan
    assert len(ops._cuda_last) == 1, "the checked call kept no plan for the hot path"
    plan = next(iter(ops._cuda_last._plans.values()))
    _close(checked, _reference(direction, x, w, gy))

    def boom(*a, **k):
        raise AssertionError("the checked path ran")
    with monkeypatch.context() as m:
        m.setattr(ops, _CHECKED[direction], boom)
        hot = _call(direction, backend, x, w, gy)
        assert hot.shape == checked.shape and hot.stride() == checked.stride() and hot.dtype == checked.dtype
        # the same library call on the same data as the checked path, and as torch's
        _close(hot, checked)
        _close(hot, _torch_fp32(direction, x, w, gy))
        # other data, the same metadata: still the hot path, still exact
        x2, w2, gy2 = _tensors(layout, 1)
        _close(_call(direction, backend, x2, w2, gy2), _reference(direction, x2, w2, gy2))
        with torch.no_grad():
            w.mul_(-1)   # read on every call
            x.mul_(-1)
        _close(_call(direction, backend, x, w, gy), _reference(direction, x, w, gy))
        # no allocation but the output (a backward-weights call without a bias also returns its
        # empty db, which takes no memory)
        torch.cuda.synchronize()
        before = torch.cuda.memory_stats()["allocation.all.allocated"]
        keep = _call(direction, backend, x, w, gy)
        n = torch.cuda.memory_stats()["allocation.all.allocated"] - before
        assert n <= (2 if direction == "backward_weights" else 1), f"{n} allocations in one hot call"
        del keep
    assert plan._hot_call(*((x, w, None) if direction == "forward" else (gy, w, None)
                             if direction == "backward_data" else (x, gy, None))) is not None
    # another layout of the same arguments: the checked path (the kept pack does not fit), exact
    other = "nchw" if layout == "nhwc" else "nhwc"
    if backend != "cudnn_graph" or other == "nhwc":
        x3, w3, gy3 = _tensors(other, 2)
        _close(_call(direction, backend, x3, w3, gy3), _reference(direction, x3, w3, gy3))
    torch.cuda.synchronize()


@pytest.mark.parametrize("backend", ["cudnn", "cudnn_graph"])
def test_backward_weights_hot_path_with_bias(backend):
    x, w, gy = _tensors("nhwc", 3)
    for _ in range(3):   # checked, then hot twice
        dw = _call("backward_weights", backend, x, w, gy, bias=True)
        _close(dw, _reference("backward_weights", x, w, gy))


def test_legacy_backward_pack_is_dropped_by_select_and_free():
    """The legacy plan's backward pack holds only while the plan runs what it was made with."""
    from rawconv import cudnn

    x, w, gy = _tensors("nchw", 4)
    for _ in range(2):
        dx = _call("backward_data", "cudnn", x, w, gy)
    plan = next(iter(ops._cuda_last._plans.values()))
    assert isinstance(plan, cudnn.Convolution) and plan._ghot is not None
    assert plan._hot_call(gy, w, None) is not None
    from rawconv.errors import NotSupportedError

    selected = False
    for a in plan.algorithms(mode="heuristic", math="fma"):
        if a.ok and a.algo != plan.info.algo:
            try:
                plan.select(a.algo_id)
            except NotSupportedError:
                continue
            selected = True
            break
    if selected:
        assert plan._hot_call(gy, w, None) is None   # stale: the checked path makes a new one
        _close(plan.execute(grad_y=gy, w=w), _reference("backward_data", x, w, gy))
        _close(plan._hot_call(gy, w, None), _reference("backward_data", x, w, gy))
    _close(dx, _reference("backward_data", x, w, gy))
    plan.free()
    assert plan._hot_call(gy, w, None) is None
    ops.clear_cache()
    cudnn.clear_cache()
    _close(_call("backward_data", "cudnn", x, w, gy), _reference("backward_data", x, w, gy))


def test_compiled_training_step_runs_the_hot_path():
    """A converted layer's training step under torch.compile: the backward graph calls the backward
    operators; the steps after the first match torch's gradients (float64) on the kept plans."""
    import rawconv.nn as rnn

    torch.manual_seed(0)
    m = rnn.convert(torch.nn.Conv2d(8, 8, 3, padding=1, bias=True)).cuda().to(memory_format=torch.channels_last)
    ref = torch.nn.Conv2d(8, 8, 3, padding=1, bias=True).cuda().double()
    with torch.no_grad():
        ref.weight.copy_(m.weight)
        ref.bias.copy_(m.bias)
    step = torch.compile(lambda x: m(x).square().sum())
    for i in range(3):
        x = torch.randn(2, 8, 8, 8, device="cuda").contiguous(memory_format=torch.channels_last)
        m.zero_grad()
        ref.zero_grad()
        step(x).backward()
        ref(x.double()).square().sum().backward()
        _close(m.weight.grad, ref.weight.grad.float())
        _close(m.bias.grad, ref.bias.grad.float())
    assert len(ops._cuda_last) >= 2   # the backward kernels kept their plans
