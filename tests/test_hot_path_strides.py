"""The hot paths take a tensor whose strides differ from the kept call's only in dims of size 1.

A (N, C, 1, 1) tensor is dense in both formats, and torch hands such a tensor (squeeze-excite's
pooled input, its gradients) with either format's strides from step to step. The hot paths compared
strides exactly, so each such call took the checked path again: in timm's regnety_002 every
squeeze-excite convolution's backward, 52 checked calls per training step on the CPU (and 28 a step
in regnety_016's on an H100, host time 66 ms against torch's 38). The same memory serves (a dim of
size 1 is never stepped), so the plan kept from the first call runs. Each test checks the results
against float64 and counts the checked path's plan lookups."""
from __future__ import annotations

import pytest
import torch

import rawconv.nn as rnn
from rawconv.pytorch import ops_autograd as _oa

pytestmark = pytest.mark.usefixtures("dnnl")


def _other_format(t: torch.Tensor) -> torch.Tensor:
    """The same values with the other format's strides (only the size-1 dims' strides differ)."""
    n, c = t.shape[:2]
    if t.stride() == (c, 1, 1, 1):
        return t.as_strided(t.shape, (c, 1, c, c))
    return t.contiguous().as_strided(t.shape, (c, 1, 1, 1))


def _rel(a, b) -> float:
    return ((a.double() - b).abs().max() / b.abs().max()).item()


def _spied(monkeypatch, module, names) -> list:
    """The calls of ``module``'s functions ``names`` (their names, in call order), recorded."""
    seen = []
    for name in names:
        real = getattr(module, name)

        def spy(*a, _real=real, _name=name, **k):
            seen.append(_name)
            return _real(*a, **k)
        monkeypatch.setattr(module, name, spy)
    return seen


@pytest.fixture
def lookups(monkeypatch):
    """The checked path's plan lookups of the backward (direction names), counted."""
    return _spied(monkeypatch, _oa, ("_backward_data_cpu_plan", "_backward_weights_cpu_plan"))


@pytest.mark.parametrize("bias", [False, True])
def test_squeeze_excite_shaped_gradients_keep_the_backward_plans(lookups, bias):
    torch.manual_seed(0)
    conv = rnn.Conv2d(12, 5, 1, bias=bias).double().float()
    w64 = conv.weight.detach().double()
    b64 = conv.bias.detach().double() if bias else None
    x0 = torch.randn(3, 12, 1, 1)
    g0 = torch.randn(3, 5, 1, 1)
    for step in range(4):
        x = (x0 if step % 2 == 0 else _other_format(x0)).detach().requires_grad_()
        g = g0 if step % 3 == 0 else _other_format(g0)
        conv.zero_grad()
        conv(x).backward(g)
        xr = x0.double().requires_grad_()
        wr = w64.clone().requires_grad_()
        br = b64.clone().requires_grad_() if bias else None
        torch.nn.functional.conv2d(xr, wr, br).backward(g0.double())
        assert _rel(x.grad, xr.grad) < 1e-5 and _rel(conv.weight.grad, wr.grad) < 1e-5, step
        if bias:
            assert _rel(conv.bias.grad, br.grad) < 1e-5
        if step == 0:
            first = len(lookups)
    assert first in (1, 2)   # the first step's plans (data, weights) ...
    assert len(lookups) == first, lookups   # ... and none again for the other format's strides


def test_hot_forward_takes_the_other_formats_strides(monkeypatch):
    """The forward hot path: x of (N, C, 1, 1) with either format's strides runs the pack the first
    call kept (only that first call finds none), with the right values."""
    from rawconv.onednn.plan import Convolution

    answers = []
    real = Convolution._hot_run

    def spy(self, *a, **k):
        y = real(self, *a, **k)
        answers.append(y is not None)
        return y
    monkeypatch.setattr(Convolution, "_hot_run", spy)
    torch.manual_seed(1)
    conv = rnn.Conv2d(16, 8, 1).eval()
    x = torch.randn(2, 16, 1, 1)
    ref = torch.nn.functional.conv2d(x.double(), conv.weight.double(), conv.bias.double())
    with torch.no_grad():
        ys = [conv(t) for t in (x, x, _other_format(x), x, _other_format(x))]
    for y in ys:
        assert _rel(y, ref) < 1e-5
    assert answers and all(answers[1:]), answers


@pytest.mark.gpu
def test_cuda_squeeze_excite_shaped_gradients_keep_the_backward_plans(monkeypatch):
    """The CUDA kernels' kept backward plans (rawconv.cudnn._cuda.HotArgs.bind) likewise: the checked
    path runs in the first step only, the gradients right in every step."""
    from rawconv.pytorch import ops_kernels as _k

    seen = _spied(monkeypatch, _k, ("_backward_data_cuda_checked", "_backward_weights_cuda_checked"))
    torch.manual_seed(0)
    conv = rnn.Conv2d(16, 8, 1).cuda()
    x0, g0 = torch.randn(4, 16, 1, 1, device="cuda"), torch.randn(4, 8, 1, 1, device="cuda")
    for step in range(4):
        x = (x0 if step % 2 == 0 else _other_format(x0)).detach().requires_grad_()
        conv.zero_grad()
        conv(x).backward(g0 if step % 3 == 0 else _other_format(g0))
        xr = x0.cpu().double().requires_grad_()
        wr = conv.weight.detach().cpu().double().requires_grad_()
        torch.nn.functional.conv2d(xr, wr, conv.bias.detach().cpu().double()).backward(g0.cpu().double())
        assert _rel(x.grad.cpu(), xr.grad) < 1e-2 and _rel(conv.weight.grad.cpu(), wr.grad) < 1e-2, step
        if step == 0:
            first = len(seen)
    assert len(seen) == first, seen
