"""The NaN guard along a chain of fused convolutions: each fused plan's result carries a bound of
its magnitude, so the next fused plan fed that very tensor skips the guard's read of x, and every
change to the tensor since (a write through torch, new storage, a NaN where the chain started)
sends it back to reading x; the results keep torch eager's NaNs and infinities throughout."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import rawconv.fused as fu
import rawconv.nn as rnn
from rawconv.core import postops as P



def _same_as_torch(y, want, rtol=2e-5):
    assert torch.equal(torch.isnan(y), torch.isnan(want)), (int(torch.isnan(y).sum()), int(torch.isnan(want).sum()))
    fin = torch.isfinite(want)
    assert torch.equal(torch.isinf(y), torch.isinf(want))
    err = (y[fin].double() - want[fin].double()).abs().max().item()
    assert err <= rtol * max(1.0, want[fin].abs().max().item()), err


def _pair(act="relu", seed=0):
    torch.manual_seed(seed)
    x = torch.randn(2, 8, 9, 9)
    w1, b1 = torch.randn(8, 8, 3, 3) * 0.2, torch.randn(8)
    w2, b2 = torch.randn(8, 8, 3, 3) * 0.2, torch.randn(8)
    p1 = fu.FusedConvolution(x, w1, b1, padding=1, activation=act)
    p2 = fu.FusedConvolution(x, w2, b2, padding=1, activation=act)
    ref = lambda t: F.relu(F.conv2d(F.relu(F.conv2d(t, w1, b1, padding=1)), w2, b2, padding=1))  # noqa: E731
    return x, (w1, b1), (w2, b2), p1, p2, ref


def test_the_second_plan_of_a_chain_reads_nothing_and_is_right():
    x, (w1, b1), (w2, b2), p1, p2, ref = _pair()
    assert p1.nan_guard and p2.nan_guard
    y1 = p1.run(x, w1, b1)
    assert p1.bound_reads == 1   # where the chain starts: x read once
    bound = P.carried_bound(y1)
    assert bound is not None and bound >= y1.abs().max().item()   # a true bound of the result
    y2 = p2.run(y1, w2, b2)
    assert p2.bound_reads == 0 and p2.unfused_calls == 0
    torch.testing.assert_close(y2, ref(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("change", ["index_write", "inplace_op", "new_storage", "nan_at_start", "inf_at_start"])
def test_every_change_since_the_write_sends_the_guard_back_to_reading(change):
    """A NaN or an infinity reaching the second plan by any of these routes keeps torch's NaNs."""
    x, (w1, b1), (w2, b2), p1, p2, _ = _pair(seed=3)
    if change in ("nan_at_start", "inf_at_start"):
        x[1, 2, 4, 4] = math.nan if change == "nan_at_start" else math.inf
    y1 = p1.run(x, w1, b1)
    want_in = F.relu(F.conv2d(x, w1, b1, padding=1))
    if change == "index_write":
        y1[0, 1, 2, 2] = math.nan
    elif change == "inplace_op":
        y1.add_(torch.where(torch.arange(y1.numel()).view_as(y1) == 7, math.nan, 0.0))
    elif change == "new_storage":
        other = y1.clone()
        other[0, 0, 0, 0] = math.nan
        y1.data = other
    if change in ("index_write", "inplace_op", "new_storage"):
        want_in = y1.detach().clone()
        assert P.carried_bound(y1) is None
    y2 = p2.run(y1, w2, b2)
    assert p2.bound_reads == 1
    want = F.relu(F.conv2d(want_in, w2, b2, padding=1))
    assert torch.isnan(want).any()
    _same_as_torch(y2, want)


def test_a_bound_too_loose_is_read_again_not_run_unfused():
    """A carried bound that cannot prove the result finite (large weights along the chain) makes
    the guard read x itself: finite data still runs fused."""
    x, (w1, b1), (w2, b2), p1, p2, _ = _pair(seed=5)
    y1 = p1.run(x, w1, b1)
    P.carry_bound(y1, P.FINITE_LIMIT / 2)   # a true but useless bound
    y2 = p2.run(y1, w2, b2)
    assert p2.bound_reads == 1 and p2.unfused_calls == 0
    torch.testing.assert_close(y2, F.relu(F.conv2d(y1, w2, b2, padding=1)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act", ["silu", "tanh", "none"])
def test_unguarded_activations_pass_the_bound_on_without_reading(act):
    """SiLU/tanh/no activation need no guard and read nothing; fed a bounded x they pass a bound on
    (capped by the activation's range) to the guarded plan after them."""
    torch.manual_seed(7)
    x = torch.randn(2, 8, 9, 9)
    w, b = torch.randn(8, 8, 3, 3) * 0.2, torch.randn(8)
    first = fu.FusedConvolution(x, w, b, padding=1, activation="relu")
    mid = fu.FusedConvolution(x, w, b, padding=1, activation=act)
    last = fu.FusedConvolution(x, w, b, padding=1, activation="relu")
    y = last.run(mid.run(first.run(x, w, b), w, b), w, b)
    assert (first.bound_reads, mid.bound_reads, last.bound_reads) == (1, 0, 0)
    t = {"silu": F.silu, "tanh": torch.tanh, "none": lambda v: v}[act]
    r = F.relu(F.conv2d(t(F.conv2d(F.relu(F.conv2d(x, w, b, padding=1)), w, b, padding=1)), w, b, padding=1))
    torch.testing.assert_close(y, r, rtol=1e-5, atol=1e-5)
    if act == "tanh":
        assert P.carried_bound(mid.run(x * 1e3, w, b)) is None   # x carries nothing: nothing passed on


def test_a_converted_model_reads_x_where_the_chain_starts_and_keeps_torchs_nans():
    """convert(fuse=True) of conv-bn-relu blocks with a residual: NaNs in the input or written
    into an intermediate result come out as torch's, finite inputs as torch's values."""
    torch.manual_seed(11)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
            self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)

        def forward(self, x):
            return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + x)

    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), Block(), Block()).eval()
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_var.uniform_(0.5, 2.0)
            mod.running_mean.uniform_(-0.2, 0.2)
    c = rnn.convert(m, fuse=True)
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-4)
        xn = x.clone()
        xn[0, 1, 5, 5] = math.nan
        want = m(xn)
        assert torch.isnan(want).any() and not torch.isnan(want).all()
        _same_as_torch(c(xn), want, rtol=1e-4)
        torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-4)   # and finite again after


@pytest.mark.parametrize("role", ["weight", "bias"])
def test_weights_given_new_storage_through_data_are_read_again(role):
    """``w.data = new`` moves neither the tensor object nor its version counter, only its storage:
    the guard's kept bound of the weights (or bias) is taken again, and their NaNs stay torch's."""
    x, (w1, b1), _, p1, _, _ = _pair(seed=7)
    w, b = w1.clone(), b1.clone()
    p1.run(x, w, b)   # the guard's bound of w and b is kept
    t = w if role == "weight" else b
    bad = t.clone()
    bad.view(-1)[3] = math.nan
    v = t._version
    t.data = bad
    assert t._version == v
    y = p1.run(x, w, b)
    want = F.relu(F.conv2d(x, w, b, padding=1))
    assert torch.isnan(want).any()
    _same_as_torch(y, want)


def test_weights_written_by_a_fused_optimizer_step_are_read_again():
    """NaN weights from a fused optimizer step (``torch.optim.SGD(fused=True)``, which writes the
    parameters without moving their version counter) keep torch's NaNs through the fused ReLU."""
    x, (w1, b1), _, _, _, _ = _pair(seed=11)
    w, b = nn.Parameter(w1.clone()), nn.Parameter(b1.clone())
    with torch.no_grad():
        fu.conv_bias_act(x, w, b, padding=1, activation="relu")   # the guard's bound of w is kept
    opt = torch.optim.SGD([w, b], lr=0.1, fused=True)
    w.grad, b.grad = torch.zeros_like(w), torch.zeros_like(b)
    w.grad[0, 0, 1, 1] = math.nan
    opt.step()
    with torch.no_grad():
        y = fu.conv_bias_act(x, w, b, padding=1, activation="relu")
        want = F.relu(F.conv2d(x, w, b, padding=1))
    assert torch.isnan(want).any()
    _same_as_torch(y, want)


def test_the_contracts_hot_run_keeps_torchs_nans():
    """``hot_run`` (the plan contract's one call) on a fused plan whose hot path is set up runs the
    NaN guard as ``execute`` does: a NaN in x stays torch's through the fused ReLU."""
    x, (w1, b1), _, p1, _, _ = _pair(seed=13)
    p1.execute(x, w1, b1)   # the checked call sets the hot path up
    xn = x.clone()
    xn[0, 3, 4, 4] = math.nan
    want = F.relu(F.conv2d(xn, w1, b1, padding=1))
    _same_as_torch(p1.hot_run(xn, w1, b1), want)
    _same_as_torch(p1.hot_run(x, w1, b1), F.relu(F.conv2d(x, w1, b1, padding=1)))


def test_a_carried_tensor_overwritten_through_out_is_read_again():
    """A plain plan writing a NaN result into a tensor that carries a bound (``execute(out=y)``,
    which moves y's version counter as torch's out= functions do): the next fused plan reads it."""
    from rawconv import onednn

    x, (w1, b1), (w2, b2), p1, p2, _ = _pair(seed=17)
    y1 = p1.run(x, w1, b1)
    assert P.carried_bound(y1) is not None
    xn = x.clone()
    xn[0, 0, 4, 4] = math.nan
    plain = onednn.Convolution(xn, w1, b1, padding=1)
    plain.execute(xn, w1, b1, out=y1)
    assert P.carried_bound(y1) is None
    _same_as_torch(p2.run(y1, w2, b2), F.relu(F.conv2d(F.conv2d(xn, w1, b1, padding=1), w2, b2, padding=1)))
    assert p2.bound_reads == 1
