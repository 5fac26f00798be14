"""rawconv.nn: drop-in modules and a differentiable op on pinned oneDNN implementations,
checked against torch autograd in float64."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import rawconv.nn as rnn
from rawconv import ArgumentError, NotSupportedError, onednn

pytestmark = pytest.mark.usefixtures("dnnl")


def _grads64(mod_args, x, w, b, gy, conv):
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    y = conv(x64, w64, b64, **mod_args)
    y.backward(gy.double())
    return y.detach(), x64.grad, w64.grad, b64.grad


@pytest.mark.parametrize("nd, layout", [(1, "nchw"), (2, "nchw"), (2, "nhwc"), (3, "nchw")])
def test_modules_match_torch_autograd(nd, layout):
    torch.manual_seed(nd)
    cls, tconv = {1: (rnn.Conv1d, F.conv1d), 2: (rnn.Conv2d, F.conv2d), 3: (rnn.Conv3d, F.conv3d)}[nd]
    m = cls(6, 8, 3, stride=2, padding=1, dilation=1, groups=2, bias=True)
    ref = {1: torch.nn.Conv1d, 2: torch.nn.Conv2d, 3: torch.nn.Conv3d}[nd](6, 8, 3, stride=2, padding=1, groups=2)
    assert isinstance(m, type(ref)) and "impl=None" in repr(m)
    x = torch.randn((2, 6) + (9,) * nd)
    if layout == "nhwc":
        x = x.to(memory_format=torch.channels_last)
        m = m.to(memory_format=torch.channels_last)
    x.requires_grad_()
    y = m(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    args = dict(stride=2, padding=1, groups=2)
    y64, gx64, gw64, gb64 = _grads64(args, x, m.weight, m.bias, gy, tconv)
    for got, want in ((y, y64), (x.grad, gx64), (m.weight.grad, gw64), (m.bias.grad, gb64)):
        assert got.shape == want.shape
        err = (got.double() - want).abs().max().item()
        assert err <= 1e-5 * max(want.abs().max().item(), 1.0), err


def test_pinned_implementations_and_bad_names():
    x = torch.randn(2, 16, 10, 10, requires_grad=True)
    w = torch.randn(16, 16, 3, 3, requires_grad=True)
    fwd = [i.name for i in onednn.implementations(x.detach(), w.detach(), padding=1)]
    bwd = [i.name for i in onednn.implementations(x.detach(), w.detach(), padding=1, direction="backward_data")]
    for name in dict.fromkeys(fwd[:3]):
        y = rnn.conv(x, w, None, 1, 1, impl=name, backward_impl=(bwd[0], None))
        torch.testing.assert_close(y, F.conv2d(x, w, padding=1), rtol=1e-4, atol=1e-4)
        y.sum().backward()
    with pytest.raises(NotSupportedError, match="offered"):
        rnn.conv(x, w, padding=1, impl="no-such-impl")
    with pytest.raises(ArgumentError):
        rnn.Conv2d(4, 4, 3, padding_mode="reflect")
    with pytest.raises(ArgumentError, match="groups"):
        rnn.conv(x, w, groups=3)


def test_asymmetric_padding_gradients():
    x = torch.randn(1, 3, 12, 10, dtype=torch.float32, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    pad = [(0, 2), (1, 0)]
    y = rnn.conv(x, w, padding=pad)
    gy = torch.randn_like(y)
    y.backward(gy)
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    F.conv2d(F.pad(x64, (1, 0, 0, 2)), w64).backward(gy.double())
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.double(), w64.grad, rtol=1e-5, atol=1e-5)
