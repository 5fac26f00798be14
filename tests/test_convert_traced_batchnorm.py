"""convert(fuse=True) on models whose BatchNorm is a subclass that torch.fx traces into (timm's
``BatchNormAct2d``: ``torch._assert(x.ndim == 4)``, ``F.batch_norm`` on the module's own tensors,
then its own activation module). Before, such a BatchNorm was never folded (the traced call is no
module call), the converted model lost its ``num_batches_tracked`` entries, and in training mode it
kept the running statistics the trace had baked in: a silent wrong forward. Each check is against
the original model (float64 where the output is compared)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import rawconv.nn as rnn
from conftest import randomize_batchnorms
from rawconv.pytorch.modules import bn_forward


class BatchNormAct(nn.BatchNorm2d):
    """What timm's BatchNormAct2d does: a rank check, the batch norm, then its own activation."""

    def __init__(self, c, act=nn.ReLU, eps=1e-5):
        super().__init__(c, eps=eps)
        self.drop = nn.Identity()
        self.act = act()

    def forward(self, x):
        torch._assert(x.ndim == 4, f"expected 4D input (got {x.ndim}D input)")
        training = self.training
        if training and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        x = F.batch_norm(x, self.running_mean if not training else self.running_mean,
                         self.running_var, weight=self.weight, bias=self.bias, training=training,
                         momentum=self.momentum, eps=self.eps)
        return self.act(self.drop(x))


class EpsMismatch(BatchNormAct):
    def forward(self, x):   # the call's eps is not the module's: folding with the module's would be wrong
        return self.act(F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                     self.training, self.momentum, 1e-3))


class Net(nn.Module):
    def __init__(self, bn=BatchNormAct):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.b1 = bn(8, nn.SiLU)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.b2 = bn(8, nn.ReLU)
        self.c3 = nn.Conv2d(8, 4, 1, bias=False)
        self.b3 = bn(4, nn.Identity)

    def forward(self, x):
        y = self.b1(self.c1(x))
        return self.b3(self.c3(self.b2(self.c2(y)))) + y[:, :4]


def _net(bn=BatchNormAct, seed=0):
    torch.manual_seed(seed)
    net = Net(bn)
    with torch.no_grad():
        randomize_batchnorms(net, seed + 1)
    return net.eval()


def _rel(got, want):
    return ((got.detach().double() - want).norm() / want.norm()).item()


def _ref64(net, x):
    with torch.no_grad():
        return copy.deepcopy(net).double()(x.double())


def test_a_traced_batchnorm_subclass_is_folded_and_the_output_is_right():
    net = _net()
    x = torch.randn(2, 3, 12, 12)
    conv = rnn.convert(net, fuse=True)
    rep = conv.rawconv_report
    assert sorted(rep.folded) == [("c1", "b1"), ("c2", "b2"), ("c3", "b3")], rep.folded
    assert rep.fused["c1"] == "silu" and rep.fused["c2"] == "relu", rep.fused
    want = _ref64(net, x)
    with torch.no_grad():
        got, torch_out = conv(x), net(x)
    assert _rel(got, want) <= max(5 * _rel(torch_out, want), 1e-6)
    code = conv.code
    assert "batch_norm" not in code and "_assert" not in code, code


def test_the_converted_model_keeps_the_original_state_dict_and_its_batchnorm_modules():
    net = _net()
    conv = rnn.convert(net, fuse=True)
    assert set(conv.state_dict()) == set(net.state_dict())
    assert type(conv.get_submodule("b1")) is BatchNormAct   # the module itself, num_batches_tracked and all
    assert conv.get_submodule("c1").__dict__["_rawconv_bn"] is conv.get_submodule("b1")
    conv.load_state_dict(net.state_dict())   # strict: no missing or unexpected key


def test_training_mode_after_convert_computes_batch_statistics_as_the_original():
    net, x = _net(), torch.randn(4, 3, 10, 10)
    conv = rnn.convert(net, fuse=True)
    twin = copy.deepcopy(net)   # the original's own training forward, on its own statistics
    conv.train()
    twin.train()
    got, want = conv(x), twin(x)
    assert _rel(got, want.double()) < 1e-5
    for name in ("b1", "b2", "b3"):   # the running statistics moved as the original's did
        a, b = conv.get_submodule(name), twin.get_submodule(name)
        torch.testing.assert_close(a.running_mean, b.running_mean)
        torch.testing.assert_close(a.running_var, b.running_var)
        assert int(a.num_batches_tracked) == int(b.num_batches_tracked) == 1


def test_a_call_whose_eps_is_not_the_modules_is_not_folded():
    net = _net(EpsMismatch)
    x = torch.randn(2, 3, 12, 12)
    conv = rnn.convert(net, fuse=True)
    assert conv.rawconv_report.folded == []
    want = _ref64(net, x)
    with torch.no_grad():
        assert _rel(conv(x), want) < 1e-5


def test_bn_forward_runs_only_the_base_class_batch_norm():
    bn = _net().b1
    x = torch.randn(2, 8, 5, 5)
    with torch.no_grad():
        want = F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.1, bn.eps)
        torch.testing.assert_close(bn_forward(bn, x), want)
        assert not torch.allclose(bn(x), want)   # the subclass's own forward adds its SiLU


def test_timm_models_fold_every_batchnorm_after_a_conv():
    timm = pytest.importorskip("timm", reason="timm is not installed (pip install 'rawconv[zoo]')")
    torch.manual_seed(0)
    net = timm.create_model("mobilenetv3_small_050", pretrained=False).eval()
    x = torch.randn(1, 3, 64, 64)
    conv = rnn.convert(net, fuse=True)
    bns = [n for n, m in net.named_modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(conv.rawconv_report.folded) == len(bns) > 20
    assert set(conv.state_dict()) == set(net.state_dict())
    want = _ref64(net, x)
    with torch.no_grad():
        assert _rel(conv(x), want) <= max(5 * _rel(net(x), want), 1e-6)


class Dropping(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3, padding=1)
        self.p = 0.5

    def forward(self, x):   # a functional dropout: the trace records training=False
        return F.dropout(self.c(x), self.p, self.training)


def test_a_traced_functional_dropout_follows_the_converted_models_mode():
    net = Dropping().eval()
    conv = rnn.convert(net, fuse=True)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        a, b = conv(x), conv(x)
        torch.testing.assert_close(a, b)   # eval: no dropout
        torch.testing.assert_close(a, net(x))
        conv.train()
        y = conv(x)
    zeros = (y == 0).float().mean().item()
    assert 0.3 < zeros < 0.7, zeros   # training: half the outputs dropped, the rest scaled by 2
    kept = y != 0
    torch.testing.assert_close(y[kept], 2 * a[kept])
    twin = copy.deepcopy(conv)   # the graph's own code: copies keep it
    with torch.no_grad():
        assert (twin(x) == 0).any()
        twin.eval()
        torch.testing.assert_close(twin(x), a)


class TimmBN(nn.BatchNorm2d):
    """timm's BatchNormAct2d.forward (torch's BatchNorm forward cut and pasted, then an activation):
    the eval trace bakes in momentum=None's factor 0.0 and leaves out num_batches_tracked."""

    def __init__(self, c, **kw):
        super().__init__(c, **kw)
        self.act = nn.ReLU()

    def forward(self, x):
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        bn_training = True if self.training else (self.running_mean is None and self.running_var is None)
        keep = not self.training or self.track_running_stats
        x = F.batch_norm(x, self.running_mean if keep else None, self.running_var if keep else None,
                         self.weight, self.bias, bn_training, factor, self.eps)
        return self.act(x)


class Momentum5(TimmBN):
    def forward(self, x):   # its own momentum, not the module's: a fold (torch's forward) would move the stats wrongly
        return self.act(F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                     self.training, 0.5, self.eps))


class PreAct(nn.Module):
    """BatchNorms after another op than a conv (not folded), one of them called twice."""

    def __init__(self, bn=TimmBN, **kw):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(3, 8, 1)
        self.b1 = bn(8, **kw)
        self.shared = bn(8, **kw)

    def forward(self, x):
        return self.b1(self.c1(x) * 2) + self.shared(self.c1(x) - 1) + self.shared(self.c2(x) + 1)


@pytest.mark.parametrize("bn,kw", [(TimmBN, {}), (TimmBN, {"momentum": None}), (Momentum5, {})])
def test_an_unfolded_traced_batchnorm_keeps_its_state_and_trains_as_the_original(bn, kw):
    torch.manual_seed(0)
    net = PreAct(bn, **kw).eval()
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
    conv = rnn.convert(net, fuse=True)
    assert set(conv.state_dict()) == set(net.state_dict())
    conv.load_state_dict(net.state_dict())   # strict: num_batches_tracked is no unexpected key
    twin = copy.deepcopy(net).double().train()
    conv = conv.double().train()
    x = torch.randn(4, 3, 6, 6, dtype=torch.float64)
    for _ in range(3):
        got, want = conv(x), twin(x)
    assert _rel(got, want) < 1e-12
    a, b = conv.state_dict(), twin.state_dict()
    for k in b:   # running statistics and counts moved as the original's did
        torch.testing.assert_close(a[k], b[k], rtol=1e-12, atol=0, msg=k)
    conv.eval()
    twin.eval()
    with torch.no_grad():
        assert _rel(conv(x), twin(x)) < 1e-12


class NoStats(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = TimmBN(4, track_running_stats=False)

    def forward(self, x):   # the trace records training=True: batch statistics in eval too
        return self.bn(self.c(x)) + F.batch_norm(self.c(x), None, None, training=True)


class AlwaysDropping(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):   # F.dropout's default training=True (Monte Carlo dropout): drops in eval too
        return F.dropout(self.c(x), 0.5)


def test_a_recorded_true_training_argument_stays_true_in_eval():
    net = NoStats().eval()
    conv = rnn.convert(net, fuse=True)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        assert _rel(conv(x), _ref64(net, x)) < 1e-5
    drop = rnn.convert(AlwaysDropping().eval(), fuse=True)
    with torch.no_grad():
        a, b = drop(x), drop(x)
    assert not torch.equal(a, b) and 0.3 < (a == 0).float().mean().item() < 0.7


def test_a_converted_model_with_an_unfolded_batchnorm_pickles_whole():
    import io

    net = PreAct().eval()
    conv = rnn.convert(net, fuse=True)
    buf = io.BytesIO()
    torch.save(conv, buf)   # fx traces the pickled code again on load: the BatchNorm call must stay one call
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(back(x), conv(x))


class LiteralEval(nn.Module):
    """training=False written by the model (never its mode), beside one that is its mode."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.frozen = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        f = self.frozen
        y = F.batch_norm(self.c(x), f.running_mean, f.running_var, f.weight, f.bias, False, 0.0, f.eps)
        y = F.dropout(self.c2(y), 0.5, False)   # never drops
        return F.dropout(y, 0.5, self.training)   # drops in training mode


def test_a_training_false_the_model_wrote_stays_as_written():
    torch.manual_seed(0)
    net = LiteralEval().eval()
    with torch.no_grad():
        net.frozen.running_var.uniform_(0.5, 2.0)
        net.frozen.running_mean.uniform_(-0.5, 0.5)
    conv = rnn.convert(net, fuse=True)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(conv(x), net(x))
        conv.train()
        net.train()
        torch.manual_seed(3)
        y = conv(x)
        torch.manual_seed(3)
        want = net(x)
    zeros = (y == 0).float().mean().item()
    assert 0.3 < zeros < 0.7, zeros   # one dropout (the mode's), not two: about half, not three quarters
    torch.testing.assert_close(y, want)   # the frozen BatchNorm kept its running statistics, as the original
    # and its statistics did not move
    assert float(conv.get_submodule("frozen").num_batches_tracked) == 0.0


def test_a_folded_subclass_batchnorm_changed_after_convert_is_seen_at_the_next_call():
    net = _net()
    conv = rnn.convert(net, fuse=True)
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        before = conv(x)
        b1, b2 = conv.get_submodule("b1"), conv.get_submodule("b2")
        b1.running_var.mul_(3.0)                            # in place
        b2.weight.data = b2.weight.data * -2.0              # through .data (a new storage)
        conv.get_submodule("c3").weight.add_(0.25)          # the conv's own weight, in place
        net.load_state_dict(conv.state_dict())   # the original, with the converted model's state now
        want = _ref64(net, x)
        assert _rel(before, want) > 1e-2   # the changes matter: a stale snapshot would show
        assert _rel(conv(x), want) < 1e-5
