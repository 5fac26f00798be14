"""The modules' training path (issue 22): a converted module called with grad applies one autograd
Function whose backward calls the backward kernels directly (rawconv.ops._EntryConv). What a
breaker found around it, each checked against torch's own modules: torch's non-reentrant
checkpoint and a caller's saved-tensor hooks see their own exceptions; a backward called under
autocast (with or without create_graph) stays in the forward's dtype, as torch's; a module's
padding given as pairs with a list inside follows that list's in-place changes."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import rawconv.nn as rnn
from rawconv.errors import RawconvError


def _pair(seed=0, **kw):
    torch.manual_seed(seed)
    t = torch.nn.Conv2d(4, 4, 3, padding=1, **kw)
    return t, rnn.convert(copy.deepcopy(t))


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_of_converted_convolutions_gives_torchs_gradients(use_reentrant):
    grads = []
    for m in _pair():
        x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
        checkpoint(lambda t, m=m: m(m(t)), x, use_reentrant=use_reentrant).square().sum().backward()
        grads.append((x.grad, m.weight.grad, m.bias.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


def test_a_saved_tensor_hooks_own_error_reaches_the_caller_as_it_is():
    class PackError(Exception):
        pass

    def pack(t):
        raise PackError("from the caller's pack hook")
    for m in _pair():
        x = torch.randn(1, 4, 8, 8, requires_grad=True)
        with pytest.raises(PackError) as ei, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            m(x)
        assert not isinstance(ei.value, RawconvError)


@pytest.mark.parametrize("create_graph", [False, True])
def test_a_backward_under_autocast_stays_in_the_forwards_dtype(create_graph):
    """The forward in float32 outside autocast, then autograd.grad inside a bfloat16 autocast block:
    torch's convolution backward has no autocast rule, so the gradients are float32's exactly."""
    want = got = None
    for m in _pair(3):
        x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(2), requires_grad=True)
        y = m(x)
        plain = torch.autograd.grad(y.square().sum(), (x, m.weight), retain_graph=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            cast = torch.autograd.grad(y.square().sum(), (x, m.weight), create_graph=create_graph)
        for a, b in zip(plain, cast):
            assert b.dtype == torch.float32
            torch.testing.assert_close(b, a, rtol=0, atol=0)
        want, got = (plain if want is None else want), plain
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


def test_padding_pairs_with_a_list_inside_follow_its_changes():
    m = rnn.Conv2d(3, 6, 3)
    inner = [1, 1]
    m.padding = ((1, 1), inner)
    x = torch.randn(2, 3, 9, 9)
    assert tuple(m(x).shape) == (2, 6, 9, 9)
    inner[1] = 3
    assert tuple(m(x).shape) == (2, 6, 9, 11)
