"""The cuDNN graph plan's forward hot path (issue 15, "the cost of a pinned call") stays exact on a
GPU: a tensor whose strides changed in place after hot calls, an ``out`` that overlaps an input
after hot calls with the same shapes, an unaligned view, weights updated in place, out='s version
bump. Needs a CUDA GPU (not run on the CPU-only machine)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rawconv import cudnn_graph as G
from rawconv.errors import ArgumentError

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def _ref(x, w, b=None):
    return F.conv2d(x.double(), w.double(), None if b is None else b.double(), 1, 1).float()


def _close(a, b):
    torch.testing.assert_close(a.float(), b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bias", [False, True])
def test_graph_hot_path_follows_in_place_changes(bias):
    x = torch.randn(2, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    b = torch.randn(8, device="cuda") if bias else None
    plan = G.GraphConvolution(x, w, b, padding=1)
    for _ in range(3):
        y = plan.execute(x, w, b)
    assert plan._hot is not None   # the pack was made: the calls above took the hot path
    _close(y, _ref(x, w, b))
    with torch.no_grad():
        w.mul_(-1)   # weights read on every call
    _close(plan.execute(x, w, b), _ref(x, w, b))
    x.as_strided_((2, 8, 8, 8), (512, 1, 64, 8))   # same storage and shape, channels-last strides
    _close(plan.execute(x, w, b), _ref(x, w, b))
    torch.cuda.synchronize()


def test_graph_hot_path_out_rules():
    buf = torch.zeros(4096, device="cuda")
    x = buf[:1024].view(2, 8, 8, 8)
    x.copy_(torch.randn(2, 8, 8, 8))
    w = torch.randn(8, 8, 3, 3, device="cuda")
    plan = G.GraphConvolution(x, w, padding=1)
    out = buf[2048:3072].view(2, 8, 8, 8)
    for _ in range(3):
        assert plan.execute(x, out=out) is out
    _close(out, _ref(x, w))
    v = out._version
    plan.execute(x, out=out)
    assert out._version > v
    with pytest.raises(ArgumentError, match="overlaps"):
        plan.execute(x, out=buf[512:1536].view(2, 8, 8, 8))
    # an address that is not 16-byte aligned: the checked path refuses such an out
    with pytest.raises(ArgumentError):
        plan.execute(x, out=torch.zeros(1025, device="cuda")[1:].view(2, 8, 8, 8))
    # an unaligned input is copied by the checked path, still exact
    xu = torch.zeros(1025, device="cuda")[1:].view(2, 8, 8, 8)
    xu.copy_(x)
    _close(plan.execute(xu), _ref(x, w))
    torch.cuda.synchronize()


@pytest.mark.parametrize("api", ["legacy", "graph"])
def test_negative_views_are_read_as_their_values_and_refused_as_out(api):
    """A torch._neg_view's memory holds the un-negated values, which is what cuDNN would read: the
    checked path resolves inputs to a copy and refuses one as out= (the CPU plans do the same)."""
    from rawconv import cudnn

    x = torch.randn(2, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    plan = (G.GraphConvolution(x, w, padding=1) if api == "graph"
            else cudnn.Convolution(x, w, padding=1, algo="IMPLICIT_GEMM", math="fma"))
    for _ in range(2):   # the hot path first, then a negative view with the same metadata
        _close(plan.execute(x, w), _ref(x, w))
    nx = torch._neg_view(x)
    assert nx.is_neg()
    _close(plan.execute(nx, w), _ref(-x, w))
    out = torch._neg_view(torch.empty(2, 8, 8, 8, device="cuda"))
    with pytest.raises(ArgumentError, match="negative or conjugate view"):
        plan.execute(x, w, out=out)


def test_operator_cuda_last_plan_path_stays_exact():
    """torch.ops.rawconv.conv_forward on cudnn_graph keeps the plan of its last call with the same
    arguments (ops._cuda_last) and runs its hot path: right after in-place stride changes, with and
    without a bias on the same arguments, and for another device index's tensors' key."""
    from rawconv import ops

    ops.clear_cache()
    x = torch.randn(2, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    b = torch.randn(8, device="cuda")
    args = ([1, 1], [1, 1], [1, 1], [1, 1], 1, "cudnn_graph", "", "strict", "", "")
    for _ in range(3):
        y = torch.ops.rawconv.conv_forward(x, w, None, *args)
    assert len(ops._cuda_last) >= 1
    _close(y, _ref(x, w))
    _close(torch.ops.rawconv.conv_forward(x, w, b, *args), _ref(x, w, b))   # bias: another key
    _close(torch.ops.rawconv.conv_forward(x, w, None, *args), _ref(x, w))
    xc = x.contiguous(memory_format=torch.channels_last)
    _close(torch.ops.rawconv.conv_forward(xc, w, None, *args), _ref(x, w))   # other strides: checked path
    x2 = torch.randn(2, 8, 8, 8, device="cuda")
    x2.as_strided_((2, 8, 8, 8), xc.stride())   # strides changed in place on a hot tensor's metadata
    _close(torch.ops.rawconv.conv_forward(x2, w, None, *args), _ref(x2, w))
