"""oneDNN's fused plan with a residual on its hot path: the residual given as ``out`` (what
``run(..., inplace=True)`` and the in-place operator ``rawconv::conv_bias_act_residual_`` pass) skips
the checked path's per-call checks after the first call, and stays right: NCHW and channels-last
(a blocked destination gets the residual reordered in first), a new residual tensor per call, a
residual that overlaps x falling back to a copy."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rawconv.onednn.fused import FusedConvolution
from rawconv.onednn.plan import Convolution


def _want(x, w, b, r, act):
    y = F.conv2d(x.double(), w.double(), b.double(), padding=1) + r.double()
    return torch.relu(y) if act == "relu" else y


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("act", ["relu", "none"])
def test_in_place_residual_calls_take_the_hot_path_and_are_right(monkeypatch, fmt, act):
    torch.manual_seed(0)
    x = torch.randn(2, 16, 9, 9).to(memory_format=fmt)
    w = (torch.randn(16, 16, 3, 3) * 0.1).to(memory_format=fmt)
    b = torch.randn(16)
    plan = FusedConvolution(x, w, b, padding=1, residual=True, activation=act, prepack=True)
    checked = []
    real = Convolution._execute

    def counting(self, *a, **k):
        checked.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(Convolution, "_execute", counting)
    for i in range(4):
        r = torch.randn(2, 16, 9, 9).to(memory_format=fmt)
        want = _want(x, w, b, r, act)
        y = plan.run(x, None, b, r, inplace=True)
        assert y is r
        torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
    assert len(checked) == 1, checked   # the first call only: the others on the hot path


def test_a_residual_overlapping_x_is_copied_not_overwritten_on_the_hot_path():
    torch.manual_seed(1)
    x = torch.randn(1, 8, 6, 6)
    w, b = torch.randn(8, 8, 3, 3) * 0.1, torch.randn(8)
    plan = FusedConvolution(x, w, b, padding=1, residual=True, activation="relu", prepack=True)
    r = torch.randn(1, 8, 6, 6)
    plan.run(x, None, b, r.clone(), inplace=True)   # (the hot path made)
    x0 = x.clone()
    y = plan.run(x, None, b, x, inplace=True)   # the residual is x itself: computed out of place
    assert y is not x
    torch.testing.assert_close(x, x0)
    torch.testing.assert_close(y.double(), _want(x0, w, b, x0, "relu"), rtol=1e-5, atol=1e-5)
