"""convert() and subclasses of torch's conv modules: one that computes as torch's class (no forward
of its own: torchvision's Conv3DSimple, all but 4 of r3d_18's 20 convolutions) is converted and fused
like the class itself, stays an instance of the user's class, and pickles; one with its own forward
is left alone."""
from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import pytest
import torch

import rawconv.nn as rnn


class PlainConv(torch.nn.Conv2d):
    """A subclass that only adds a method (as torchvision's Conv3DSimple adds get_downsample_stride)."""

    @staticmethod
    def stride_of(s):
        return (s, s)


class OwnForward(torch.nn.Conv2d):
    def forward(self, x):
        return super().forward(x) * 2


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(PlainConv(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               OwnForward(8, 8, 1), PlainConv(8, 4, 3, padding=1)).eval()


@pytest.mark.parametrize("fuse", [False, True])
def test_a_plain_subclass_is_converted_and_an_overriding_one_left_alone(fuse):
    net = _net()
    net[1].running_mean.uniform_(-1, 1)
    net[1].running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        ref = copy.deepcopy(net).double()(x.double())
        c = rnn.convert(net, fuse=fuse)
        y = c(x)
    assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < 1e-5
    mods = dict(c.named_modules())
    own = [m for m in mods.values() if type(m) is OwnForward]
    # a subclass with its own forward is not converted (fuse=True: torch.fx traces through its forward)
    assert len(own) == (0 if fuse else 1) and not any(isinstance(m, OwnForward) and isinstance(m, rnn._RawconvConv)
                                                      for m in mods.values())
    plain = [m for m in mods.values() if isinstance(m, PlainConv)]
    if fuse:   # both PlainConvs fused like nn.Conv2d's (the first with its BatchNorm folded and the ReLU)
        assert c.rawconv_report.fused == {"0": "relu", "4": "bias"} and not plain
    else:
        assert len(plain) == 2
    for m in plain:
        assert isinstance(m, rnn._RawconvConv) and isinstance(m, torch.nn.Conv2d)
        assert m.stride_of(2) == (2, 2), "the user's class's methods stay"
    assert sorted(c.state_dict()) == sorted(net.state_dict()) or fuse


def test_a_converted_plain_subclass_pickles_into_a_fresh_process(tmp_path):
    c = rnn.convert(_net())
    path = tmp_path / "m.pt"
    torch.save(c, path)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        want = c(x)
    torch.save(x, tmp_path / "x.pt")
    torch.save(want, tmp_path / "want.pt")
    code = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(__import__('pathlib').Path(__file__).parent)!r})
        m = torch.load({str(path)!r}, weights_only=False)
        x, want = torch.load({str(tmp_path / 'x.pt')!r}), torch.load({str(tmp_path / 'want.pt')!r})
        import test_convert_subclasses as T
        assert isinstance(m[4], T.PlainConv), type(m[4]).__mro__
        with torch.no_grad():
            torch.testing.assert_close(m(x), want)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=str(__import__("pathlib").Path(__file__).parent.parent))
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_subclasses_with_their_own_forward_are_reported_and_warned():
    # breaker D7: conv subclasses that compute their own way stay on torch; the report and a warning
    # now name them (they said "1 conv modules on rawconv" and nothing else)
    import warnings

    import rawconv.nn

    class WSConv2d(torch.nn.Conv2d):   # weight-standardized, as timm's StdConv2d
        def forward(self, x):
            w = self.weight
            w = (w - w.mean((1, 2, 3), keepdim=True)) / (w.std((1, 2, 3), keepdim=True) + 1e-5)
            return self._conv_forward(x, w, self.bias)

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), WSConv2d(8, 8, 3), torch.nn.Sequential(WSConv2d(8, 8, 3)))
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        m = rawconv.nn.convert(model)
    msgs = [str(w.message) for w in ws if issubclass(w.category, RuntimeWarning) and "left" in str(w.message)]
    assert len(msgs) == 1 and "WSConv2d" in msgs[0] and "1, 2.0" in msgs[0], msgs
    rep = m.rawconv_report
    assert rep.swapped == ["0"] and list(rep.left_on_torch) == ["1", "2.0"]
    assert "WSConv2d defines its own forward" in rep.left_on_torch["1"]
    assert "2 conv module(s) left on torch" in str(rep)
    x = torch.randn(1, 3, 12, 12)
    assert torch.allclose(m(x), model(x), rtol=1e-4, atol=1e-4)
    with warnings.catch_warnings():   # a model without such modules: no warning
        warnings.simplefilter("error")
        assert rawconv.nn.convert(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3))).rawconv_report.left_on_torch == {}
