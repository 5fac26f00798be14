"""Converted models stay right when the model or its inputs change (issue 24).

The breaker's cases, each checked against torch in float64 on the converted model's own state
(its state_dict is the original model's: the same keys, so a torch twin loads it): weights
changed after ``convert(fuse=True)`` (load_state_dict, optimizer steps of every kind, in-place
writes, replaced parameters, parametrizations), the untraceable fallback with a shared conv and
an indexed Sequential, a bfloat16 model converted back to float32, an autotuned model called on
other problems, ``torch.jit.trace`` of a transposed convolution, the ``state_dict`` route of
``torch.load(weights_only=True)``; and ``convert(autotune=)`` searching and pinning the backward
passes per distinct problem.
"""
from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import rawconv.fused as fu
import rawconv.nn as rnn
import rawconv.ops as rops
from rawconv import NotSupportedError, onednn

pytestmark = pytest.mark.usefixtures("dnnl")


# ---------------------------------------------------------------------------- models and references
def _randomize_bn(m, seed):
    g = torch.Generator().manual_seed(seed)
    for mod in m.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            n = mod.num_features
            mod.running_mean.copy_(torch.rand(n, generator=g) - 0.5)
            mod.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            mod.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
            mod.bias.data.copy_(torch.rand(n, generator=g) - 0.5)


def _seq(seed=0):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1))
    with torch.no_grad():
        _randomize_bn(m, seed + 100)
    return m.eval()


class Res(nn.Module):
    """A residual block: conv+BN+ReLU, conv+BN (+ the identity) +ReLU, a 1x1 head."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(4, 8, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(8)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        h = torch.relu(self.b1(self.c1(x)))
        return self.head(torch.relu(self.b2(self.c2(h)) + h))


def _res(seed=0):
    torch.manual_seed(seed)
    m = Res()
    with torch.no_grad():
        _randomize_bn(m, seed + 100)
    return m.eval()


FACTORIES = {"sequential": (_seq, (2, 3, 8, 8)), "residual": (_res, (2, 4, 8, 8))}


def _twin(m, factory):
    """A torch model (float64) with the converted model's state: its reference."""
    t = factory()
    t.load_state_dict(m.state_dict())
    return t.double().train(m.training)


def _rel(got, want) -> float:
    got, want = got.detach().double(), want.detach().double()
    assert got.shape == want.shape, (got.shape, want.shape)
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def _check(m, factory, x, rel=2e-5):
    with torch.no_grad():
        want = _twin(m, factory)(x.double())
        err = _rel(m(x), want)
    assert err <= rel, err


# ---------------------------------------------------------------------------- weights changed after convert(fuse=True)
@pytest.mark.parametrize("kind", list(FACTORIES))
def test_fused_model_keeps_the_original_state_dict_and_loads_new_weights(kind):
    """Before: the folded BatchNorms were gone from the state_dict (the original's checkpoint did
    not load), and the fused model's own state_dict loaded into it left the old snapshot running
    (max rel err 1.39)."""
    factory, shape = FACTORIES[kind]
    x = torch.randn(*shape)
    m = rnn.convert(factory(), fuse=True)
    assert sorted(m.state_dict()) == sorted(factory().state_dict())
    _check(m, factory, x)
    m.load_state_dict(factory(seed=1).state_dict())                        # the original model's checkpoint
    _check(m, factory, x)
    m.load_state_dict(rnn.convert(factory(seed=2), fuse=True).state_dict())   # a converted one's
    _check(m, factory, x)
    with torch.inference_mode():
        m.load_state_dict(factory(seed=3).state_dict())
        want = _twin(m, factory)(x.double())
        assert _rel(m(x), want) <= 2e-5


@pytest.mark.parametrize("kind", list(FACTORIES))
def test_in_place_writes_and_replaced_parameters_are_seen(kind):
    """Before: ``weight.mul_`` after convert(fuse=True) kept the old snapshot (max rel err 2.81)."""
    factory, shape = FACTORIES[kind]
    x = torch.randn(*shape)
    m = rnn.convert(factory(), fuse=True)
    fused = [mod for _n, mod in rnn._fused_modules(m)]
    assert fused and all(fu.frozen(f) for f in fused)
    bns = [mod for mod in m.modules() if isinstance(mod, nn.BatchNorm2d)]
    changes = [
        lambda: fused[0].weight.mul_(2.0),
        lambda: fused[-1].bias.add_(0.5),
        lambda: bns[0].weight.mul_(-1.5),
        lambda: bns[0].running_var.copy_(torch.rand_like(bns[0].running_var) + 2.0),
        lambda: bns[-1].running_mean.sub_(0.3),
        lambda: setattr(fused[0], "weight", nn.Parameter(torch.randn_like(fused[0].weight))),
        lambda: m.load_state_dict({k: v * 0.5 if v.is_floating_point() else v
                                   for k, v in factory(seed=4).state_dict().items()}, assign=True),
    ]
    for change in changes:
        with torch.no_grad():
            m(x)   # a snapshot taken and used
            change()
        _check(m, factory, x)


@pytest.mark.parametrize("opt", ["sgd", "sgd_foreach", "sgd_fused", "adam", "adam_fused"])
def test_training_steps_then_eval_use_the_trained_weights(opt):
    """Before: .train(), a few optimizer steps, then eval ran the snapshot taken at convert time
    (max rel err 1.47e-1). Fused optimizers move no version counter: the optimizer step hook sees
    them. The converted model trains as the original (its BatchNorms run in training mode as
    torch's): the same steps on the torch model agree."""
    factory, shape = FACTORIES["residual"]
    x, target = torch.randn(*shape), torch.randn(2, 4, 8, 8)
    m, t = rnn.convert(factory(), fuse=True), factory()
    with torch.no_grad():
        m(x)   # the snapshot is taken and used once before training

    def make(params):
        kw = {"sgd": {}, "sgd_foreach": {"foreach": True}, "sgd_fused": {"fused": True}, "adam": {},
              "adam_fused": {"fused": True}}[opt]
        if opt.startswith("sgd"):
            return torch.optim.SGD(params, lr=0.05, momentum=0.9, **kw)
        return torch.optim.Adam(params, lr=1e-3, **kw)

    om, ot = make(m.parameters()), make(t.parameters())
    m.train()
    t.train()
    for _ in range(3):
        for model, o in ((m, om), (t, ot)):
            o.zero_grad()
            F.mse_loss(model(x), target).backward()
            o.step()
    m.eval()
    t.eval()
    _check(m, factory, x)   # the converted model computes with its weights as they are now
    with torch.no_grad():
        assert _rel(m(x), t(x)) <= (1e-4 if opt.startswith("sgd") else 2e-2)   # and trained as torch did
    assert int(m.get_submodule("b1").num_batches_tracked) == 3


@pytest.mark.parametrize("how", ["parametrizations", "hooks"])
def test_spectral_norm_on_a_fused_frozen_module(how):
    """Before: spectral_norm applied to a fused, frozen module left its snapshot of the raw
    weight running (max rel err 2.89e-1). A weight computed on each call is not a parameter: the
    module reads it live."""
    factory, shape = FACTORIES["sequential"]
    x = torch.randn(*shape)
    m = rnn.convert(factory(), fuse=True)
    name = "3"
    f = m.get_submodule(name)
    with torch.no_grad():
        m(x)
    if how == "parametrizations":
        torch.nn.utils.parametrizations.spectral_norm(f)
    else:
        torch.nn.utils.spectral_norm(f)
    m.eval()
    with torch.no_grad():
        y = m(x)
        w = f.weight.detach().double()   # what spectral_norm computes (eval: no power iteration)
        bn1, bn4 = m.get_submodule("1"), m.get_submodule("4")
        x64 = x.double()
        h = torch.relu(F.batch_norm(F.conv2d(x64, m.get_submodule("0").weight.double(), None, padding=1),
                                    *(t.double() for t in (bn1.running_mean, bn1.running_var, bn1.weight,
                                                           bn1.bias)), False, 0.0, bn1.eps))
        h = torch.relu(F.batch_norm(F.conv2d(h, w, f.bias.double(), padding=1),
                                    *(t.double() for t in (bn4.running_mean, bn4.running_var, bn4.weight,
                                                           bn4.bias)), False, 0.0, bn4.eps))
        want = F.conv2d(h, m.get_submodule("6").weight.double(), m.get_submodule("6").bias.double())
    assert _rel(y, want) <= 2e-5


def test_a_write_through_data_alone_needs_refresh_and_refresh_writes_in_place():
    """The one change no version counter sees (as for autograd): a write through ``.data`` with
    no optimizer step and no training forward. refresh() takes the new snapshot into the same
    buffers, so a compiled model computes with it too."""
    factory, shape = FACTORIES["sequential"]
    x = torch.randn(*shape)
    m = rnn.convert(factory(), fuse=True)
    f = m.get_submodule("0")
    snap = f._buffers[fu.FROZEN_WEIGHT]
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        compiled(x)
        f.weight.data.mul_(2.0)
        rnn.refresh(m)
        assert f._buffers[fu.FROZEN_WEIGHT] is snap
        want = _twin(m, factory)(x.double())
        assert _rel(compiled(x), want) <= 2e-5 and _rel(m(x), want) <= 2e-5


def test_a_parameter_given_new_storage_through_data_is_seen_without_refresh():
    """``p.data = new_tensor`` (EMA and weight-clipping code): the same Parameter object on new
    storage moves no version counter; its data pointer moves, and the frozen snapshot is taken
    again (a breaker's run: outputs off by ~30 before). Weight and a folded BatchNorm's statistics."""
    factory, shape = FACTORIES["sequential"]
    x = torch.randn(*shape)
    m = rnn.convert(factory(), fuse=True)
    conv, bn = m.get_submodule("0"), m.get_submodule("1")
    with torch.no_grad():
        m(x)
        conv.weight.data = torch.randn_like(conv.weight) * 0.2
        assert _rel(m(x), _twin(m, factory)(x.double())) <= 2e-5
        bn.running_mean.data = bn.running_mean + 1.0
        assert _rel(m(x), _twin(m, factory)(x.double())) <= 2e-5


def test_compiled_fused_model_sees_new_weights_without_refresh():
    factory, shape = FACTORIES["residual"]
    x = torch.randn(*shape)
    m = rnn.convert(factory(), fuse=True)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        compiled(x)
        m.load_state_dict(factory(seed=5).state_dict())
        want = _twin(m, factory)(x.double())
        assert _rel(compiled(x), want) <= 2e-5


def test_copies_moves_and_layouts_keep_their_own_fresh_snapshot():
    factory, shape = FACTORIES["residual"]
    x = torch.randn(*shape)
    m = rnn.convert(factory(), fuse=True)
    with torch.no_grad():
        m(x)
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert sorted(other.state_dict()) == sorted(m.state_dict())
        with torch.no_grad():
            other.get_submodule("b1").weight.mul_(3.0)   # the copy's own BatchNorm
        _check(other, factory, x)
        _check(m, factory, x)                            # the original is not the copy
    cl = copy.deepcopy(m).to(memory_format=torch.channels_last)
    _check(cl, factory, x.to(memory_format=torch.channels_last))


@pytest.mark.parametrize("convert_dtype", [torch.bfloat16, torch.float32])
def test_a_model_converted_to_bfloat16_and_back_is_refolded(convert_dtype):
    """Before: fuse=True on a bfloat16 model, converted back to float32, ran BatchNorm-folded
    weights rounded to bfloat16 (max rel err 1.77e-3 where float32 gives 1e-7): the fold is now
    taken from the (converted) conv and BatchNorm tensors, in float64, rounded once."""
    factory, shape = FACTORIES["residual"]
    x = torch.randn(*shape)
    src = factory().to(convert_dtype)
    m = rnn.convert(src, fuse=True).to(torch.bfloat16).float()
    want = factory().to(convert_dtype).bfloat16().float().double()
    with torch.no_grad():
        assert _rel(m(x), want(x.double())) <= 2e-5


# ---------------------------------------------------------------------------- the untraceable fallback
class Indexed(nn.Module):
    """Untraceable (data-dependent control flow), and indexes its Sequential."""

    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU())

    def forward(self, x):
        if x.sum() > 1e9:
            return x
        return self.seq[0](x) + self.seq(x)


class Shared(nn.Module):
    """Untraceable, with the Sequential's conv module also called on its own."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.seq = nn.Sequential(self.conv, nn.BatchNorm2d(6), nn.ReLU())
        self.other = nn.Sequential(self.conv, nn.ReLU())

    def forward(self, x):
        if x.sum() > 1e9:
            return x
        return self.seq(x) - self.conv(x) + self.other(x)


@pytest.mark.parametrize("cls", [Indexed, Shared])
def test_the_untraceable_fallback_fuses_only_inside_the_sequentials_own_call(cls):
    """Before: the module-level fallback replaced the conv by a fused module with the BatchNorm
    folded into its parameters, so an indexed call (``self.seq[0](x)``: max rel err 1.0) or
    another use of a shared conv (3.9e-1) computed conv+BN+ReLU."""
    torch.manual_seed(7)
    net = cls().eval()
    with torch.no_grad():
        _randomize_bn(net, 8)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        want = copy.deepcopy(net).double()(x.double())
    with pytest.warns(RuntimeWarning, match="could not trace"):
        m = rnn.convert(net, fuse=True)
    assert m.rawconv_report.traced is False and "seq.0" in m.rawconv_report.fused
    assert sorted(m.state_dict()) == sorted(net.state_dict())
    with torch.no_grad():
        assert _rel(m(x), want) <= 2e-5
        m.seq[1].running_mean.add_(0.25)   # a change of the BatchNorm is seen there too
        net.seq[1].running_mean.add_(0.25)
        want = copy.deepcopy(net).double()(x.double())
        assert _rel(m(x), want) <= 2e-5
    m.seq[1] = nn.BatchNorm2d(6).eval()     # a replaced child: the Sequential runs as torch's
    net.seq[1] = copy.deepcopy(m.seq[1])
    with torch.no_grad():
        assert _rel(m(x), copy.deepcopy(net).double()(x.double())) <= 2e-5


# ---------------------------------------------------------------------------- autotuned choices on other problems
def _tuned_model(fuse):
    torch.manual_seed(9)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 1),
                        nn.ReLU(), nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1))
    with torch.no_grad():
        _randomize_bn(net, 10)
    return net.eval()


def _user_layout_winner(monkeypatch):
    """The search picks an implementation on the tensors' own layouts ('@user') where oneDNN offers
    one that is not the reference: offered for channels_last problems, not NCHW ones (on a CPU
    with such an implementation). Returns the list of picks."""
    picks = []

    def fake_autotune(self, *a, **k):
        impls = [i for i in self.implementations if not i.name.startswith("ref")]
        users = [i for i in impls if i.layouts == "user"]
        best = (users or impls)[0]
        self._selected = best.index
        picks.append(best.choice)

        class Row:
            impl, median_ms, min_ms = best, 1.0, 1.0
        return [Row()]
    monkeypatch.setattr(onednn.Convolution, "autotune", fake_autotune)
    return picks


@pytest.mark.parametrize("fuse", [False, True])
def test_a_choice_tuned_on_one_problem_never_refuses_another(fuse, monkeypatch):
    """Before: a model converted with autotune=x raised NotSupportedError ("implementation
    'jit:avx512_core@user' is not offered") when called with another batch size, layout or dtype
    (52 of 52 such calls). A winner applies to the problem it was tuned on; others run the
    library's default (and describe says so)."""
    rnn.clear_tuning()
    picks = _user_layout_winner(monkeypatch)
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    net = _tuned_model(fuse)
    m = rnn.convert(net, fuse=fuse, autotune=x, autotune_budget_s=0.05)
    assert any(p.endswith("@user") for p in picks), picks   # a channels_last-only winner was pinned
    calls = []
    for n in (1, 2, 3, 5):
        for hw in (8, 11):
            base = torch.randn(n, 3, hw, hw)
            calls += [base, base.to(memory_format=torch.channels_last)]
    caps = onednn.capabilities()
    bf16 = all(caps.offered(d, "bfloat16") for d in ("forward", "backward_data"))
    if bf16:   # another dtype (this CPU offers bf16 convolutions)
        calls.append(torch.randn(2, 3, 8, 8).bfloat16())
    clean = 0
    for xx in calls:
        mm = copy.deepcopy(m).bfloat16() if xx.dtype == torch.bfloat16 else m
        with torch.no_grad():
            want = copy.deepcopy(net).double()(xx.double())
            assert _rel(mm(xx), want) <= (2e-2 if xx.dtype == torch.bfloat16 else 2e-5)
        clean += 1
    assert clean == len(calls) >= 16
    rows = rnn.describe(m, torch.randn(3, 3, 8, 8), iterations=1, timing=False, torch_kernels=False)
    assert rows and all("not a problem this layer was autotuned for" in r.note for r in rows), [r.note for r in rows]
    rows = rnn.describe(m, x, iterations=1, timing=False, torch_kernels=False)
    assert all("autotuned:" in r.note for r in rows), [r.note for r in rows]


def test_autotune_new_search_tunes_a_new_problem_at_its_first_call(monkeypatch):
    rnn.clear_tuning()
    picks = _user_layout_winner(monkeypatch)
    net = _tuned_model(True)
    x = torch.randn(2, 3, 8, 8)
    m = rnn.convert(net, fuse=True, autotune=x, autotune_new="search")
    assert m.rawconv_report.autotune_new == "search" and "searched at their first call" in str(m.rawconv_report)
    first = len(picks)
    x2 = torch.randn(3, 3, 8, 8).to(memory_format=torch.channels_last)
    with torch.no_grad():
        assert _rel(m(x2), copy.deepcopy(net).double()(x2.double())) <= 2e-5
        searched = len(picks) - first
        assert searched >= 3   # each layer's new problem, once
        m(x2)
    assert len(picks) - first == searched   # pinned: the second call searches nothing
    pinned = rnn.pinned_choices(m)
    assert all(len(p["tuned"]) == 2 for p in pinned.values()), pinned
    default = rnn.convert(net, fuse=True, autotune=x)
    before = len(picks)
    with torch.no_grad():
        default(x2)
    assert len(picks) == before


# ---------------------------------------------------------------------------- autotune of the backward passes
class Trainable(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = nn.Conv2d(8, 8, 3, padding=1)   # the same problem as c2
        self.up = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        h = torch.relu(self.bn(self.c1(x)))
        return self.up(torch.relu(self.c3(torch.relu(self.c2(h)))))


def _spy_plans(monkeypatch):
    """Every (direction, implementation) rawconv's operators ask oneDNN's plan cache for."""
    seen = []
    real = onednn.cached_plan

    def spy(problem, direction, *args, **kwargs):
        plan = real(problem, direction, *args, **kwargs)
        seen.append((direction, f"{plan.selected.name}@{plan.selected.layouts}", args[-1] if args else None))
        return plan
    monkeypatch.setattr(onednn, "cached_plan", spy)
    return seen


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_autotune_searches_and_pins_the_backward_passes_per_problem(layout, monkeypatch):
    """convert(autotune=x) on a model in training mode searches, per distinct problem, the forward,
    backward-data and backward-weights choices (each once) and the training step runs exactly
    those, on the tensors' layout; gradients as torch's in float64."""
    rnn.clear_tuning()
    searched = []
    real_search = rnn._search_direction

    def count(direction, problem, *a, **k):
        searched.append((direction, problem))
        return real_search(direction, problem, *a, **k)
    monkeypatch.setattr(rnn, "_search_direction", count)
    torch.manual_seed(11)
    net = Trainable()   # training mode: autotune_backward defaults to True
    x = torch.randn(2, 3, 8, 8)
    if layout == "nhwc":
        x = x.to(memory_format=torch.channels_last)
    m = rnn.convert(net, autotune=x, autotune_budget_s=0.05)
    rep = m.rawconv_report
    assert rep.backward is True and "backward passes (data, weights) pinned" in str(rep)
    assert len(searched) == len(set(searched)) == 6   # c1, c2 (= c3), up: two backward problems each
    assert all(p.layout == layout for _d, p in searched)
    by = {t["name"]: t for t in rep.tuned}
    assert set(by) == {"c1", "c2", "c3", "up"}
    for name, t in by.items():
        assert t["backward_choice"] is not None and all(c for c in t["backward_choice"])
        assert set(t["directions"]) == {"forward", "backward_data", "backward_weights"}
    assert by["c2"]["backward_choice"] == by["c3"]["backward_choice"] and not by["c3"]["backward_searched"]
    assert by["up"]["directions"]["backward_data"] == by["up"]["choice"]   # a transposed layer's forward
    assert rnn.pinned_choices(m)["c1"]["tuned"][0]["directions"] == by["c1"]["directions"]
    # the training step runs the pinned choices in each direction
    rops.clear_cache()
    onednn.clear_cache()
    seen = _spy_plans(monkeypatch)
    xg = x.clone().requires_grad_()
    m(xg).square().sum().backward()
    want = {(d, c) for t in rep.tuned for d, c in t["directions"].items()}
    asked = {(d, c) for d, c, _impl in seen}
    assert want <= asked, (want - asked)
    # gradients against torch in float64
    t64 = copy.deepcopy(net).double()
    x64 = x.double().requires_grad_()
    t64(x64).square().sum().backward()
    assert _rel(xg.grad, x64.grad) <= 1e-4
    scale = max(p64.grad.abs().max().item() for p64 in t64.parameters())   # (c1's bias has ~0 gradient: BN)
    for (n, p), (_n, p64) in zip(m.named_parameters(), t64.named_parameters()):
        assert (p.grad.double() - p64.grad).abs().max().item() <= 1e-5 * scale, n
    # the second conversion searches nothing and pins the same
    searched.clear()
    m2 = rnn.convert(net, autotune=x)
    assert not searched and [t["directions"] for t in m2.rawconv_report.tuned] == [t["directions"] for t in rep.tuned]


def test_backward_search_follows_autotune_backward(monkeypatch):
    rnn.clear_tuning()
    searched = []
    monkeypatch.setattr(rnn, "_search_direction", lambda *a, **k: searched.append(a) or "x64:gemm:jit@any")
    torch.manual_seed(12)
    x = torch.randn(2, 3, 8, 8)
    m = rnn.convert(Trainable().eval(), autotune=x, autotune_budget_s=0.05)   # eval: forward only
    assert not searched and m.rawconv_report.backward is False
    assert all(t["backward_choice"] is None for t in m.rawconv_report.tuned)
    assert "backward passes not searched" in str(m.rawconv_report)
    m = rnn.convert(Trainable().eval(), autotune=x, autotune_backward=True)
    assert searched and all(t["backward_choice"] == ("x64:gemm:jit@any",) * 2 for t in m.rawconv_report.tuned)
    searched.clear()
    net = Trainable()
    for p in net.parameters():
        p.requires_grad_(False)
    rnn.convert(net, autotune=x)   # training mode, nothing requires grad: forward only
    assert not searched


# ---------------------------------------------------------------------------- tracing, saving
def test_jit_trace_of_a_transposed_convolution_says_it_is_not_supported():
    """Before: torch.jit.trace of a converted ConvTranspose raised rawconv's InternalError (torch's
    tracer asserting on the operator's SymInt[] shape). torch.export traces it."""
    m = rnn.convert(nn.Sequential(nn.ConvTranspose2d(3, 4, 3, stride=2)))
    x = torch.randn(2, 3, 5, 5)
    with pytest.raises(NotSupportedError, match="torch.jit.trace"):
        torch.jit.trace(m, (x,))
    ep = torch.export.export(m, (x,))
    with torch.no_grad():
        assert _rel(ep.module()(x), m(x)) == 0.0
    traced = torch.jit.trace(rnn.convert(nn.Sequential(nn.Conv2d(3, 4, 3))), (x,))   # forward convs trace
    assert traced(x).shape == (2, 4, 3, 3)


def test_state_dict_route_with_weights_only_load():
    """torch.load(weights_only=True) refuses a whole pickled model (torch.fx's GraphModule, any
    module class): the state_dict is the route, and it is the original model's."""
    factory, shape = FACTORIES["residual"]
    x = torch.randn(*shape)
    src = rnn.convert(factory(seed=1), fuse=True)
    buf = io.BytesIO()
    torch.save(src, buf)
    buf.seek(0)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(buf, weights_only=True)
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    dst = rnn.convert(factory(seed=2), fuse=True)
    dst.load_state_dict(state)
    plain = factory(seed=3)
    plain.load_state_dict(state)
    with torch.no_grad():
        assert _rel(dst(x), src(x)) <= 1e-6
        assert _rel(dst(x), plain.double()(x.double())) <= 2e-5


@pytest.mark.parametrize("fuse", [False, True])
def test_autotuned_models_compile_and_a_modules_own_choice_wins(fuse, monkeypatch):
    """torch.compile(fullgraph=True) of an autotuned model looks the tuned choice up at trace time
    (static shapes); a choice set on the module (or by pin_choices) applies to every problem."""
    rnn.clear_tuning()
    picks = _user_layout_winner(monkeypatch)
    net = _tuned_model(fuse)
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    m = rnn.convert(net, fuse=fuse, autotune=x)
    assert picks
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    for xx in (x, torch.randn(3, 3, 8, 8)):
        with torch.no_grad():
            assert _rel(compiled(xx), copy.deepcopy(net).double()(xx.double())) <= 2e-5
    name = next(n for n, c in rnn.pinned_choices(m).items() if c["tuned"])
    rnn.pin_choices(m, {name: "ref:any@any"})
    assert rnn.pinned_choices(m)[name]["tuned"] == [] and rnn.pinned_choices(m)[name]["choice"] == "ref:any@any"
    seen = _spy_plans(monkeypatch)
    rops.clear_cache()
    onednn.clear_cache()
    fu.clear_cache()
    for _n, f in rnn._fused_modules(m):
        fu.frozen_state(f).plans.clear()
    with torch.no_grad():
        assert _rel(m(x), copy.deepcopy(net).double()(x.double())) <= 2e-5
    if not fuse:   # the plain modules ask the operators' plan cache (the fused ones their own plans)
        assert any(c.startswith("ref:any") for _d, c, _i in seen)
    else:
        f = m.get_submodule(name)
        assert all(p.selected.name == "ref:any" for p in fu.frozen_state(f).plans.values())


def test_a_search_at_a_new_problems_first_call_leaves_torchs_generator_alone(monkeypatch):
    rnn.clear_tuning()
    net = _tuned_model(False)
    m = rnn.convert(net, autotune=torch.randn(2, 3, 8, 8), autotune_new="search", autotune_budget_s=0.05)
    x = torch.randn(3, 3, 8, 8)
    state = torch.random.get_rng_state()
    with torch.no_grad():
        m(x)   # searches each layer's new problem (random example tensors)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(len(p["tuned"]) == 2 for p in rnn.pinned_choices(m).values())


def test_a_fused_model_trains_on_its_pinned_backward_choices(monkeypatch):
    """convert(fuse=True, autotune=x, autotune_backward=True): the fused modules' backward passes
    (their autograd path: the convolution, then the BatchNorm module) run the pinned choices."""
    rnn.clear_tuning()
    factory, shape = FACTORIES["residual"]
    x = torch.randn(*shape)
    m = rnn.convert(factory(), fuse=True, autotune=x, autotune_backward=True, autotune_budget_s=0.05)
    rep = m.rawconv_report
    assert rep.backward and all(t["backward_choice"] for t in rep.tuned)
    rops.clear_cache()
    onednn.clear_cache()
    seen = _spy_plans(monkeypatch)
    m.train()
    xg = x.clone().requires_grad_()
    m(xg).square().sum().backward()
    want = {(d, c) for t in rep.tuned for d, c in t["directions"].items() if d != "forward"}
    assert want <= {(d, c) for d, c, _i in seen}
    t64 = _twin(m, factory).train()
    x64 = x.double().requires_grad_()
    t64(x64).square().sum().backward()
    assert _rel(xg.grad, x64.grad) <= 1e-4


@pytest.mark.parametrize("new", ["default", "search"])
def test_an_autotuned_model_under_autocast_runs_its_cast_problems(new, monkeypatch):
    """A model converted with autotune=x (float32) and trained under torch.autocast("cpu",
    bfloat16): each call looks up its choice on the problem the operators run (bfloat16), not the
    float32 one; before, the float32 winner (an implementation oneDNN offers only for float32)
    was forced on the bfloat16 call, which raised NotSupportedError. With autotune_new="search"
    the bfloat16 problems are searched at their first call and pinned. Gradients as torch's
    autocast step in float64 terms (bfloat16's tolerance). Conv and ConvTranspose layers."""
    caps = onednn.capabilities()
    if not all(caps.offered(d, "bfloat16") for d in ("forward", "backward_data", "backward_weights")):
        pytest.skip("this CPU's oneDNN 3.2 offers no bfloat16 convolutions (autocast computes in float32)")
    rnn.clear_tuning()
    picks = _user_layout_winner(monkeypatch)
    torch.manual_seed(3)
    net = Trainable()
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    m = rnn.convert(copy.deepcopy(net), autotune=x, autotune_budget_s=0.05, autotune_new=new)
    assert any(p.endswith("@user") for p in picks), picks   # float32 winners bfloat16 does not offer
    first = len(picks)
    xg = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(xg)
    assert y.dtype == torch.bfloat16
    y.float().square().sum().backward()
    searched = len(picks) - first
    assert (searched > 0) == (new == "search")
    tuned = rnn.pinned_choices(m)
    assert all(len(p["tuned"]) == (2 if new == "search" else 1) for p in tuned.values()), tuned
    t = copy.deepcopy(net)
    xt = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yt = t(xt)
    yt.float().square().sum().backward()
    assert _rel(y, yt) <= 3e-2
    assert _rel(xg.grad, xt.grad) <= 5e-2


def _fused_net(bn: bool):
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 16, 3, padding=1)] + ([nn.BatchNorm2d(16)] if bn else []) + [nn.ReLU(),
                                                                                       nn.Conv2d(16, 16, 3, padding=1),
                                                                                       nn.ReLU()]
    return nn.Sequential(*layers).eval()


@pytest.mark.parametrize("case", ["fused-backward", "fused-search", "fused-grad-eval", "convert-inside-autocast"])
def test_fused_and_recorded_autotune_follow_autocasts_cast(case):
    """Fused models and the example's recording under torch.autocast("cpu", bfloat16) (a breaker's
    finds, all raising before): a fused model's backward took the float32 fused problem's backward
    choice (NotSupportedError); its search at a new problem's first call met bfloat16 x with the
    float32 weight (ArgumentError); an eval model called with grad under autocast took the float32
    forward choice; convert(autotune=x) inside an autocast region recorded bfloat16 x beside the
    float32 weight. Each now runs as torch's autocast run, to bfloat16's tolerance."""
    caps = onednn.capabilities()
    if not all(caps.offered(d, "bfloat16") for d in ("forward", "backward_data", "backward_weights")):
        pytest.skip("this CPU's oneDNN 3.2 offers no bfloat16 convolutions (autocast computes in float32)")
    rnn.clear_tuning()
    net = _fused_net(bn=case != "fused-grad-eval")
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    ac = lambda: torch.autocast("cpu", dtype=torch.bfloat16)   # noqa: E731
    if case == "convert-inside-autocast":
        with ac():
            m = rnn.convert(copy.deepcopy(net), autotune=x, autotune_budget_s=0.02)
    else:
        m = rnn.convert(copy.deepcopy(net), fuse=True, autotune=x, autotune_budget_s=0.02,
                        autotune_backward=case == "fused-backward",
                        autotune_new="search" if case == "fused-search" else "default")
    res = []
    for mod in (m, net):
        xg = x.clone().requires_grad_()
        with ac():
            y = mod(xg)
        assert y.dtype == torch.bfloat16
        y.float().square().mean().backward()
        res.append((y, xg.grad))
    assert _rel(res[0][0], res[1][0]) <= 3e-2
    assert _rel(res[0][1], res[1][1]) <= 5e-2


def test_a_search_at_first_call_never_rewinds_torchs_generator(monkeypatch):
    """autotune_new="search": what another thread draws from torch's generator while a layer's
    new problem is searched is never handed out again (the search wrapped itself in fork_rng,
    which restored the generator afterwards: a breaker saw 20 of 203 draws repeated in a second
    thread). Simulated deterministically: a draw made inside the search, then one after the call."""
    rnn.clear_tuning()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
    m = rnn.convert(net, autotune=torch.randn(2, 3, 8, 8), autotune_budget_s=0.02, autotune_new="search")
    inside = []
    real = rnn._tune_call

    def tune_call(*a, **k):
        inside.append(torch.rand(1).item())   # as another thread would, during the search
        return real(*a, **k)
    monkeypatch.setattr(rnn, "_tune_call", tune_call)
    with torch.no_grad():
        m(torch.randn(3, 3, 8, 8))   # a new problem: searched now
    assert inside, "no search ran"
    assert torch.rand(1).item() != inside[0]


def test_a_frozen_stem_runs_oneDNNs_kernel_on_the_tensors_own_layout():
    """Issue 33 (CPU): a channels_last stem (3 input channels) for which oneDNN lists first an
    implementation that converts x and y on every call (oneDNN 3.2 on AVX-512: jit:avx512_core with
    an NCHW source and a blocked destination) runs that kernel on the NHWC tensors themselves when
    oneDNN offers it there (``@user``): no reorder per call, the same result."""
    from rawconv.onednn.fused import FusedConvolution

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16),
                              torch.nn.ReLU()).eval()
    with torch.no_grad():
        net[1].running_mean.uniform_(-1, 1)
        net[1].running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 32, 32).to(memory_format=torch.channels_last)
    probe = FusedConvolution(x, net[0].weight, net[0].bias, 2, 1, activation="relu")
    first = probe.implementations[probe._first_choice(False)]
    twin = [r for r in probe.implementations if r.name == first.name and r.layouts == "user"]
    if not ({"x", "y"} & set(first.reorders)) or not twin:
        pytest.skip(f"oneDNN's first choice here, {first.choice} {dict(first.formats)}, needs no reorder of x "
                    f"and y or has no @user twin: nothing to change on this CPU/oneDNN")
    m = rnn.convert(net, fuse=True)
    with torch.no_grad():
        y = m(x)
    f = next(f for _n, f in rnn._fused_modules(m))
    plans = list(fu.frozen_state(f).plans.values())
    assert plans and all(p.selected.choice == twin[0].choice for p in plans), [p.selected.choice for p in plans]
    assert not {"x", "y"} & set(plans[0].selected.reorders)
    assert _rel(y, net.double()(x.double())) <= 2e-5


def test_an_identity_between_batchnorm_and_activation_does_not_stop_fusion():
    """Issue 33 (CPU): timm's ResNet bottleneck computes conv2 -> bn2 -> drop_block -> act2 -> aa with
    nn.Identity placeholders; the ReLU after the Identity was left to torch (an extra pass over the
    output per layer) where torch's freezing fuses it. It fuses now, with the same result."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(8, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.drop_block = nn.Identity()
            self.act = nn.ReLU()
            self.aa = nn.Identity()

        def forward(self, x):
            return self.aa(self.act(self.drop_block(self.bn(self.conv(x)))))

    torch.manual_seed(0)
    net = Block().eval()
    with torch.no_grad():
        net.bn.running_mean.uniform_(-1, 1)
        net.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 8, 12, 12)
    m = rnn.convert(net, fuse=True)
    assert m.rawconv_report.fused == {"conv": "relu"}, m.rawconv_report.fused
    with torch.no_grad():
        assert _rel(m(x), net.double()(x.double())) <= 2e-5
