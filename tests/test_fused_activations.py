"""The activations real models use, fused (issue 33) with torch's NaN and infinity semantics (issue
36 item 7): oneDNN post-ops for each activation against float64 and torch eager (float32, and
bfloat16 where oneDNN offers it), NaN / infinity in the input, the weights, the bias and the residual
against torch eager on every implementation oneDNN offers, the operator's backward,
``convert(fuse=True)`` of models and torchvision building blocks using each activation, the measured
fuse-or-not decision and its report, the cuDNN graphs' pointwise descriptors (finalized without a
GPU) and, marked ``gpu``, the cuDNN graphs on a GPU against float64 and torch."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import rawconv.fused as fu
import rawconv.nn as rnn
from rawconv.core import check as C
from rawconv.core import postops as P
from rawconv.core.errors import ArgumentError, ArgumentTypeError
from rawconv.onednn import fused as OF
from rawconv.pytorch import fusion as FZ
from conftest import load_cudnn_or_fail, requires_onednn

pytestmark = pytest.mark.usefixtures("dnnl")
ACTS = [a for a in P.ACTIVATIONS if a != "none"]
TORCH = {"relu": torch.relu, "relu6": F.relu6, "silu": F.silu, "gelu": F.gelu,
         "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "hardswish": F.hardswish,
         "hardsigmoid": F.hardsigmoid, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "none": lambda t: t}


def _check64(y, x, w, b, r, act, padding=1, groups=1, dtype="float32"):
    """y against the float64 act(conv + b + r) under rawconv's one tolerance policy."""
    from rawconv import ConvProblem

    p = ConvProblem.from_torch(x, w, b, 1, padding, 1, groups)
    t = {"x": x, "w": w, "b": b}
    ref, ref_abs = C.reference(p, "forward", t)
    if r is not None:
        ref, ref_abs = ref + r.double(), ref_abs + r.double().abs()
    ref = C.ACTIVATION_REFERENCE[act](ref) if act != "none" else ref
    tol = C.tolerance_for(p, "forward", activation=act)
    stats = C.check(p, y, ref, ref_abs, tol)
    assert stats.ok, (act, stats)
    return stats


def _same_as_torch(y, want, rtol=2e-5):
    """Equal NaN positions, equal infinities (with their signs), finite values close."""
    assert y.shape == want.shape
    assert torch.equal(torch.isnan(y), torch.isnan(want)), (int(torch.isnan(y).sum()), int(torch.isnan(want).sum()))
    inf = torch.isinf(want)
    assert torch.equal(torch.isinf(y), inf)
    assert torch.equal(y[inf], want[inf])
    fin = torch.isfinite(want)
    if fin.any():
        err = (y[fin].double() - want[fin].double()).abs().max().item()
        assert err <= rtol * max(1.0, want[fin].abs().max().item()), err


# ---------------------------------------------------------------------------- the activations fused
def test_activation_names_and_eltwise_table():
    assert set(OF.ELTWISE) == set(ACTS)
    assert P.check_activation("swish") == "silu" and P.check_activation(None) == "none"
    assert P.check_activation("identity") == "none" and P.check_activation("gelu_erf") == "gelu"
    for bad in ("mish", "GELU", "gelu-tanh", "leaky_relu"):
        with pytest.raises(ArgumentError, match="activation"):
            P.check_activation(bad)
    with pytest.raises(ArgumentTypeError):
        P.check_activation(1)
    # the post-op chain a tuning record keeps names its activation back, alpha and beta included
    for act, (alg, a, b) in OF.ELTWISE.items():
        assert OF.activation_of_post_ops([("sum", 1.0), ("eltwise", alg, a, b)]) == act
    with pytest.raises(ArgumentError):
        OF.activation_of_post_ops([("eltwise", "hardswish", 0.0, 0.0)])   # oneDNN 2.x's meaning: not torch's
    assert OF.activation_of_post_ops([("sum", 1.0)]) == "none"


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_each_activation_fused_matches_float64_and_torch(act, residual, layout):
    torch.manual_seed(len(act) * 3 + residual)
    x, w, b = torch.randn(2, 8, 9, 9) * 2, torch.randn(16, 8, 3, 3) * 0.3, torch.randn(16)
    r = torch.randn(2, 16, 9, 9) * 2 if residual else None
    if layout == "nhwc":
        x = x.to(memory_format=torch.channels_last)
        r = r.to(memory_format=torch.channels_last) if r is not None else None
    plan = fu.FusedConvolution(x, w, b, padding=1, residual=residual, activation=act)
    # the activation is the primitive's own eltwise post-op (not torch's after it)
    assert plan._post_ops[-1] == ("eltwise",) + OF.ELTWISE[act]
    y = plan.run(x, w, b, r)
    assert plan.unfused_calls == 0   # finite data: the fused primitive ran, also for the NaN-guarded ones
    _check64(y, x, w, b, r, act)
    z = F.conv2d(x, w, b, padding=1) + (r if r is not None else 0)
    _same_as_torch(y, TORCH[act](z), rtol=4e-6 if act != "hardswish" else 8e-6)
    # the function form and the operator compute the same
    torch.testing.assert_close(fu.conv_bias_act(x, w, b, r, padding=1, activation=act), y, rtol=0, atol=0)
    if layout == "nhwc":
        assert y.is_contiguous(memory_format=torch.channels_last)


def test_gelu_tanh_is_not_the_erf_gelu():
    """approximate="tanh" differs from the erf GELU by up to ~5e-4 near |x| ~ 2: a fusion of one
    as the other would be caught by the float64 check."""
    x, w = torch.linspace(-4, 4, 2 * 4 * 8 * 8).reshape(2, 4, 8, 8), torch.eye(4).reshape(4, 4, 1, 1)
    y_erf = fu.conv_bias_act(x, w, None, activation="gelu")
    y_tanh = fu.conv_bias_act(x, w, None, activation="gelu_tanh")
    assert (y_erf - y_tanh).abs().max().item() > 1e-4
    torch.testing.assert_close(y_erf, F.gelu(x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y_tanh, F.gelu(x, approximate="tanh"), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act", ["relu", "silu", "gelu", "hardswish", "sigmoid", "relu6"])
def test_each_activation_in_bfloat16_matches_float64(act):
    requires_onednn("forward", "bfloat16")
    torch.manual_seed(7)
    x = torch.randn(2, 16, 8, 8).to(torch.bfloat16).to(memory_format=torch.channels_last)
    w = (torch.randn(32, 16, 3, 3) * 0.2).to(torch.bfloat16)
    b, r = torch.randn(32).to(torch.bfloat16), torch.randn(2, 32, 8, 8).to(torch.bfloat16)
    r = r.to(memory_format=torch.channels_last)
    y = fu.conv_bias_act(x, w, b, r, padding=1, activation=act)
    assert y.dtype == torch.bfloat16
    _check64(y, x, w, b, r, act, dtype="bfloat16")


@pytest.mark.parametrize("act", ACTS)
def test_every_offered_implementation_computes_each_activation(act):
    torch.manual_seed(3)
    x, w, b = torch.randn(1, 16, 7, 7), torch.randn(16, 16, 3, 3) * 0.2, torch.randn(16)
    plan = fu.FusedConvolution(x, w, b, padding=1, activation=act)
    names = []
    for impl in plan.implementations:
        plan.select(impl, allow_known_bad=True)
        _check64(plan.run(x, w, b), x, w, b, None, act)
        names.append(impl.name)
    assert names


# ---------------------------------------------------------------------------- NaN and infinity (issue 36 item 7)
def _poison(t, where, value):
    """A copy of contiguous ``t`` with ``value`` at a few places (a NaN or an infinity)."""
    t = t.clone()
    for i in {"x": [5, 200, 333], "w": [7], "b": [3], "r": [11, 100]}[where]:
        t.view(-1)[i % t.numel()] = value
    return t


@pytest.mark.parametrize("act", ["none"] + ACTS)
@pytest.mark.parametrize("where", ["x", "w", "b", "r"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_follow_torch_eager_on_every_implementation(act, where, value):
    """A NaN or an infinity in x, w, the bias or the residual: the fused call gives torch eager's
    result (NaN kept where torch keeps it, relu(-inf) = 0, ...), on every implementation oneDNN offers.
    On b5b5276 ReLU turned NaN into 0 here (JIT implementations), and -inf into NaN (gemm, ref).
    No padding: whether a NaN weight meets a padded zero (NaN * 0) is each implementation's own
    business (torch's too), not the activation's."""
    torch.manual_seed(11)
    x, w, b = torch.randn(2, 8, 8, 8), torch.randn(8, 8, 3, 3) * 0.3, torch.randn(8)
    r = torch.randn(2, 8, 6, 6)
    t = {"x": x, "w": w, "b": b, "r": r}
    t[where] = _poison(t[where], where, value)
    x, w, b, r = t["x"], t["w"], t["b"], t["r"]
    want = TORCH[act](F.conv2d(x, w, b) + r)
    plan = fu.FusedConvolution(x, w, b, residual=True, activation=act)
    for impl in plan.implementations:
        plan.select(impl, allow_known_bad=True)
        _same_as_torch(plan.run(x, w, b, r), want, rtol=1e-5)
    z = F.conv2d(x, w, b) + r
    assert not torch.isfinite(z).all()   # the activation met a NaN or an infinity
    if act in OF.NAN_GUARDED:
        assert plan.unfused_calls == len(plan.implementations)   # each of those calls ran unfused
    else:
        assert plan.unfused_calls == 0   # fused: oneDNN's own eltwise already gives torch's result


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("act", ["relu", "relu6", "gelu", "sigmoid", "silu"])
def test_nan_and_inf_in_the_input_without_residual_follow_torch(layout, act):
    torch.manual_seed(12)
    x, w, b = torch.randn(2, 16, 10, 10), torch.randn(32, 16, 3, 3) * 0.3, torch.randn(32)
    x[0, 3, 4, 4], x[1, 7, 2, 2], x[1, 2, 8, 8] = math.nan, math.inf, -math.inf
    if layout == "nhwc":
        x = x.to(memory_format=torch.channels_last)
    want = TORCH[act](F.conv2d(x, w, b, padding=1))
    y = fu.conv_bias_act(x, w, b, padding=1, activation=act)
    assert torch.isnan(want).sum() > 100   # (what the issue saw: 144-200 NaNs that became 0)
    _same_as_torch(y, want)


def test_an_overflowing_convolution_of_finite_inputs_runs_unfused():
    """Finite inputs whose sums may overflow float32 (to +inf, -inf, or NaN when both meet, which
    depends on the order of summation): the guard's bound sends the call unfused, so the
    activation is torch's on what the convolution gave (ReLU would turn a NaN or -inf wrongly)."""
    x = torch.full((1, 4, 4, 4), 3e38)
    x[:, 2:] = -3e38
    w = torch.ones(4, 4, 1, 1)
    assert not P.finite_bound(x, P.weight_bound(w))
    plan = fu.FusedConvolution(x, w, None, activation="relu")
    plain = fu.FusedConvolution(x, w, None, activation="none")
    plain.select(plan.selected.name + "@" + plan.selected.layouts)
    y = plan.run(x, w)
    assert plan.unfused_calls == 1
    _same_as_torch(y, torch.relu(plain.run(x, w)))
    ok = torch.randn(1, 4, 4, 4)
    plan.run(ok, w)
    assert plan.unfused_calls == 1   # finite and bounded: fused


def test_finite_bound_is_false_for_every_nan_inf_and_overflow():
    x, w = torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3)
    wb = P.weight_bound(w)
    assert wb >= w.abs().sum((1, 2, 3)).max().item()   # an upper bound of the largest row's 1-norm
    assert P.finite_bound(x, wb, torch.randn(4), torch.randn(2, 4, 5, 5))
    for bad in (math.nan, math.inf, -math.inf):
        for role in ("x", "b", "r"):
            t = {"x": x.clone(), "b": torch.randn(4), "r": torch.randn(2, 4, 5, 5)}
            t[role].view(-1)[1] = bad
            assert not P.finite_bound(t["x"], wb, t["b"], t["r"]), (role, bad)
        w2 = w.clone()
        w2.view(-1)[4] = bad
        assert not P.finite_bound(x, P.weight_bound(w2))
    assert not P.finite_bound(x * 1e36, wb)
    assert P.finite_bound(x.to(memory_format=torch.channels_last)[:, :, 1:, 1:], wb)   # strided views too
    assert P.finite_bound(torch.empty(0, 3, 5, 5), wb)


def test_nan_in_a_frozen_modules_weight_reaches_the_output_as_in_torch():
    """convert(fuse=True): a NaN written into a conv weight (or its BatchNorm) after conversion, and
    a NaN in the input, come out as torch's NaNs, not as zeros."""
    torch.manual_seed(13)
    m = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Conv2d(8, 8, 3, padding=1), nn.ReLU6()).eval()
    c = rnn.convert(m, fuse=True)
    assert set(c.rawconv_report.fused.values()) == {"relu", "relu6"}
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        _same_as_torch(c(x), m(x), rtol=1e-5)
        xn = x.clone()
        xn[1, 2, 3, 3] = math.nan
        _same_as_torch(c(xn), m(xn), rtol=1e-5)
        assert torch.isnan(m(xn)).sum() > 0
        m[0].weight[1, 1, 1, 1] = math.nan
        c.load_state_dict(m.state_dict())   # (written in place: the frozen snapshot is taken again)
        want = m(x)
        assert torch.isnan(want).sum() > 100
        _same_as_torch(c(x), want, rtol=1e-5)


# ---------------------------------------------------------------------------- the operator's backward
@pytest.mark.parametrize("act", ACTS)
def test_operator_gradients_for_each_activation_match_float64(act):
    torch.manual_seed(14)
    x = torch.randn(2, 4, 6, 6, requires_grad=True)
    w = (torch.randn(6, 4, 3, 3) * 0.4).requires_grad_()
    b = torch.randn(6, requires_grad=True)
    r = torch.randn(2, 6, 6, 6, requires_grad=True)
    y = fu.conv_bias_act(x, w, b, r, padding=1, activation=act)
    gy = torch.randn_like(y)
    y.backward(gy)
    leaves = [t.detach().double().requires_grad_() for t in (x, w, b, r)]
    y64 = TORCH[act](F.conv2d(leaves[0], leaves[1], leaves[2], padding=1) + leaves[3])
    y64.backward(gy.double())
    for got, want in zip((x.grad, w.grad, b.grad, r.grad), (t.grad for t in leaves)):
        err = (got.double() - want).abs().max().item()
        assert err <= 5e-5 * max(1.0, want.abs().max().item()), (act, err)


# ---------------------------------------------------------------------------- convert(fuse=True)
class _Chain(nn.Module):
    """conv -> BN -> activation (a module or a function), conv -> BN (+ x) -> activation."""

    def __init__(self, act1, act2):
        super().__init__()
        self.c1, self.b1, self.c2, self.b2 = nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), \
            nn.Conv2d(16, 8, 1), nn.BatchNorm2d(8)
        self.act1, self.act2 = act1, act2

    def forward(self, x):
        y = self.act1(self.b1(self.c1(x)))
        return self.act2(self.b2(self.c2(y)) + x)


def _randomized(m):
    torch.manual_seed(15)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.normal_(0, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.normal_(1, 0.2)
                mod.bias.normal_(0, 0.2)
    return m.eval()


_AS_FX = [  # (activation callable in the model, what convert must fuse it as, or None: not fused)
    (nn.ReLU(inplace=True), "relu"), (nn.ReLU6(), "relu6"), (nn.Hardtanh(0.0, 6.0), "relu6"),
    (nn.SiLU(), "silu"), (nn.SiLU(inplace=True), "silu"), (nn.GELU(), "gelu"),
    (nn.GELU(approximate="tanh"), "gelu_tanh"), (nn.Hardswish(), "hardswish"), (nn.Hardsigmoid(), "hardsigmoid"),
    (nn.Sigmoid(), "sigmoid"), (nn.Tanh(), "tanh"),
    (F.silu, "silu"), (lambda t: F.silu(t, inplace=True), "silu"), (F.gelu, "gelu"),
    (lambda t: F.gelu(t, approximate="tanh"), "gelu_tanh"), (F.hardswish, "hardswish"), (F.relu6, "relu6"),
    (torch.sigmoid, "sigmoid"), (torch.tanh, "tanh"), (lambda t: t.sigmoid(), "sigmoid"),
    (lambda t: t.tanh_(), "tanh"), (lambda t: F.hardtanh(t, 0.0, 6.0), "relu6"),
    (lambda t: torch.clamp(t, 0, 6), "relu6"), (lambda t: t.clamp(min=0), "relu"), (F.hardsigmoid, "hardsigmoid"),
    # not torch's semantics of a fused activation: left alone
    (nn.Hardtanh(-1.0, 1.0), None), (nn.LeakyReLU(0.1), None), (nn.ELU(), None), (lambda t: t.clamp(-1, 1), None),
    (lambda t: F.gelu(t, approximate="none") * 1.0, "gelu"),
]


@pytest.mark.parametrize("i", range(len(_AS_FX)))
def test_convert_fuse_matches_each_activation_form_and_keeps_torchs_result(i):
    act, want_kind = _AS_FX[i]
    m = _randomized(_Chain(act, act))
    x = torch.randn(2, 8, 7, 7)
    c = rnn.convert(m, fuse=True)
    fused = c.rawconv_report.fused
    if want_kind is None:
        assert fused == {"c1": "bias", "c2": "add"}, fused
    else:
        assert fused == {"c1": want_kind, "c2": f"add+{want_kind}"}, fused
        assert c.c1.activation == want_kind
    with torch.no_grad():
        want, got = m(x), c(x)
    assert c.rawconv_report.fusion_measured is False and "fusion not measured" in str(c.rawconv_report)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


def test_module_level_fusion_takes_the_activation_modules_of_a_sequential():
    class Untraceable(nn.Module):   # data-dependent control flow: torch.fx cannot trace it
        def __init__(self):
            super().__init__()
            self.seq = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Hardswish(),
                                     nn.Conv2d(8, 8, 3, padding=1), nn.GELU(approximate="tanh"),
                                     nn.Conv2d(8, 4, 1), nn.Sigmoid())

        def forward(self, x):
            return self.seq(x) if x.sum() > -1e30 else x

    m = _randomized(Untraceable())
    with pytest.warns(RuntimeWarning, match="could not trace"):
        c = rnn.convert(m, fuse=True)
    assert c.rawconv_report.fused == {"seq.0": "hardswish", "seq.3": "gelu_tanh", "seq.5": "sigmoid"}
    x = torch.randn(2, 3, 9, 9)
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x), rtol=2e-5, atol=2e-5)


def _torchvision():
    try:
        import torchvision
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"torchvision does not import here: {exc}")
    return torchvision


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "efficientnet_b0"])
def test_convert_fuse_on_torchvision_building_blocks(name):
    """MobileNetV3 (hardswish, ReLU, squeeze-excite with a hardsigmoid gate) and EfficientNet
    (SiLU, squeeze-excite with a sigmoid gate) blocks with random weights: every activation after a
    convolution is fused, and the output is torch's within float32 rounding."""
    tv = _torchvision()
    torch.manual_seed(16)
    full = getattr(tv.models, name)(weights=None)
    m = _randomized(full.features[:4] if name == "mobilenet_v3_small" else full.features[:3])
    x = torch.randn(2, 3, 48, 48)
    c = rnn.convert(m, fuse=True)
    kinds = set(c.rawconv_report.fused.values())
    if name == "mobilenet_v3_small":
        assert {"hardswish", "relu", "hardsigmoid"} <= kinds, kinds
    else:
        assert {"silu", "sigmoid"} <= kinds, kinds
    with torch.no_grad():
        want, got = m(x), c(x)
    err = (got - want).abs().max().item()
    assert err <= 1e-4 * max(1.0, want.abs().max().item()), err


# ---------------------------------------------------------------------------- fused only where it wins
class _FakeStats:
    def __init__(self, median_ms, min_ms):
        self.median_ms, self.min_ms = median_ms, min_ms


def _fake_timer(costs, calls):
    """A timer that reads the 'time' of a callable from ``costs`` (fn -> (median, min) per round)
    and records the order the callables were timed in."""
    def timer(fn, iterations):
        calls.append(fn)
        return _FakeStats(*costs[fn].pop(0))
    return timer


def test_decide_fusion_compares_medians_and_mins_interleaved():
    def fused():
        pass

    def unfused():
        pass

    calls = []
    d = P.decide_fusion(fused, unfused, rounds=4, timer=_fake_timer(
        {fused: [(1.0, 0.9)] * 4, unfused: [(2.0, 1.8)] * 4}, calls))
    assert d.fused and d.fused_ms == 1.0 and d.unfused_ms == 2.0 and d.rounds == 4
    assert calls == [fused, unfused, unfused, fused, fused, unfused, unfused, fused]   # ABBA
    d = P.decide_fusion(fused, unfused, rounds=3, timer=_fake_timer(
        {fused: [(3.0, 2.5)] * 3, unfused: [(2.0, 1.8)] * 3}, []))
    assert not d.fused and "unfused faster" in d.reason
    # median says fused, min says unfused: not measured faster, so unfused
    d = P.decide_fusion(fused, unfused, rounds=3, timer=_fake_timer(
        {fused: [(1.0, 0.5), (1.0, 0.5), (1.0, 0.5)], unfused: [(2.0, 0.4)] * 3}, []))
    assert not d.fused and "disagree" in d.reason
    # the median of the rounds' medians, the min of their mins: one slow round does not decide
    d = P.decide_fusion(fused, unfused, rounds=5, timer=_fake_timer(
        {fused: [(1.0, 0.9), (9.0, 0.9), (1.0, 0.9), (1.0, 0.9), (1.0, 0.9)], unfused: [(2.0, 1.9)] * 5}, []))
    assert d.fused and d.fused_ms == 1.0 and d.as_dict()["decision"] == "fused"
    with pytest.raises(ArgumentTypeError):
        P.decide_fusion(1, unfused)
    with pytest.raises(ArgumentError):
        P.decide_fusion(fused, unfused, rounds=0)


@pytest.mark.parametrize("verdict", ["fused", "unfused"])
def test_convert_autotune_keeps_a_fused_layer_only_where_measured_faster(monkeypatch, verdict):
    """With autotune=x each fused oneDNN layer is measured fused against conv + bias then torch's
    add and activation; the report holds both times and the decision, and the layer runs as
    decided (the decision forced here: the measured times of this machine are noise)."""
    real = P.decide_fusion
    seen = []

    def forced(fused, unfused, **kw):
        d = real(fused, unfused, rounds=3, iterations=1)
        seen.append(d)
        d.fused = verdict == "fused"
        return d

    monkeypatch.setattr(FZ, "decide_fusion", forced)
    rnn.clear_tuning()
    m = _randomized(_Chain(nn.SiLU(), nn.ReLU()))
    x = torch.randn(2, 8, 7, 7)
    c = rnn.convert(m, fuse=True, autotune=x)
    rep = c.rawconv_report
    assert rep.fusion_measured is True and set(rep.fusion) == {"c1", "c2"} and len(seen) == 2
    for name, e in rep.fusion.items():
        assert e["decision"] == verdict and e["fused_ms"] > 0 and e["unfused_ms"] > 0 and e["rounds"] == 3
        assert e["unfused_choice"] and e["measured"] is True
        t = [t for t in rep.tuned if t["name"] == name][0]
        assert t["fusion"] == verdict and t["fused_ms"] == e["fused_ms"] and t["unfused_ms"] == e["unfused_ms"]
    assert (f"2 kept fused, 0 unfused" if verdict == "fused" else "0 kept fused, 2 unfused") in str(rep)
    calls = []
    orig = FZ.run_unfused
    monkeypatch.setattr(FZ, "run_unfused", lambda *a, **k: calls.append(a[0]) or orig(*a, **k))
    with torch.no_grad():
        got, want = c(x), m(x)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    assert len(calls) == (0 if verdict == "fused" else 2)
    # the decision is pinned to the problem: another batch size runs fused (not measured)
    calls.clear()
    with torch.no_grad():
        x3 = torch.randn(3, 8, 7, 7)
        torch.testing.assert_close(c(x3), m(x3), rtol=2e-5, atol=2e-5)
    assert calls == []
    # a second convert of the same problems reuses the decisions (measured=False) without timing
    seen.clear()
    c2 = rnn.convert(m, fuse=True, autotune=x)
    assert not seen and all(e["measured"] is False for e in c2.rawconv_report.fusion.values())
    assert all(e["decision"] == verdict for e in c2.rawconv_report.fusion.values())
    rnn.clear_tuning()


def _converted_all_unfused(monkeypatch, act1, act2):
    """(model, its conversion with every fused layer decided unfused, the example input)."""
    monkeypatch.setattr(FZ, "decide_fusion", lambda f, u, **kw: P.FusionDecision(False, 2.0, 1.0, 2.0, 1.0, 3, "forced"))
    rnn.clear_tuning()
    m = _randomized(_Chain(act1, act2))
    x = torch.randn(2, 8, 7, 7)
    return m, rnn.convert(m, fuse=True, autotune=x), x


def test_an_unfused_layer_runs_through_the_operator_under_torch_compile(monkeypatch):
    m, c, x = _converted_all_unfused(monkeypatch, nn.GELU(), nn.Hardswish())
    assert all(e["decision"] == "unfused" for e in c.rawconv_report.fusion.values())
    f = torch.compile(c, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x), rtol=2e-5, atol=2e-5)
    rnn.clear_tuning()


# ---------------------------------------------------------------------------- cuDNN: descriptors without a GPU
@pytest.fixture(scope="module")
def cudnn():
    return load_cudnn_or_fail()


def _gp(**kw):
    from rawconv import ConvProblem

    base = dict(n=2, c=8, k=16, in_spatial=(9, 9), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1),
                layout="nhwc", dtype="float16", device="cuda:0", has_bias=True)
    base.update(kw)
    return ConvProblem(**base)


@pytest.mark.parametrize("act", ["relu", "relu6", "silu", "swish", "gelu", "gelu_tanh", "sigmoid", "tanh", "elu"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "float32", "bfloat16"])
def test_cudnn_graph_with_each_activation_finalizes_without_gpu(cudnn, monkeypatch, act, residual, dtype):
    from rawconv import cudnn_graph as G
    from rawconv.cudnn.graph import _backend_api as B

    assert act in G.ACTIVATIONS
    sets = []
    orig = B.Descriptor.set

    def spy(self, attr, typ, values):
        if self.kind == "POINTWISE":
            sets.append((attr, typ, values))
        return orig(self, attr, typ, values)

    monkeypatch.setattr(B.Descriptor, "set", spy)
    g = G.OperationGraph(_gp(dtype=dtype), "forward", act, "nhwc", residual=residual)
    assert all(op.finalized for op in g.ops)
    assert [op.kind for op in g.ops] == ["OPERATION_CONVOLUTION_FORWARD"] + ["OPERATION_POINTWISE"] * (2 + residual)
    modes = [v for a, t, v in sets if a == "POINTWISE_MODE"]
    assert modes[-1] == B.const(B.POINTWISE_MODES[act])
    last = sets[[i for i, s in enumerate(sets) if s[0] == "POINTWISE_MODE"][-1]:]
    attrs = {a: v for a, _t, v in last}
    if act in ("relu", "relu6"):   # NaN kept as torch keeps it, the clip of ReLU6 (cuDNN accepted both types)
        assert attrs["POINTWISE_NAN_PROPAGATION"] == B.const("CUDNN_PROPAGATE_NAN")
        assert attrs["POINTWISE_RELU_LOWER_CLIP"] == 0.0
        assert attrs.get("POINTWISE_RELU_UPPER_CLIP") == (6.0 if act == "relu6" else None)
    if act in ("silu", "swish"):
        assert attrs["POINTWISE_SWISH_BETA"] == 1.0
    assert B.POINTWISE_MODES["gelu"] != B.POINTWISE_MODES["gelu_tanh"]


def test_activations_without_a_cudnn_pointwise_mode_are_said_so():
    for act in ("hardswish", "hardsigmoid"):
        assert act in fu.CUDNN_UNFUSED and "pass-by-value" in fu.CUDNN_UNFUSED[act]
    from rawconv import cudnn_graph as G

    assert not set(fu.CUDNN_UNFUSED) & set(G.ACTIVATIONS)
    assert set(ACTS) - set(fu.CUDNN_UNFUSED) <= set(G.ACTIVATIONS)


# ---------------------------------------------------------------------------- GPU (the lead runs these)
def _cuda_ref(x, w, b, r, act):
    z = F.conv2d(x.double(), w.double(), b.double() if b is not None else None, padding=1)
    if r is not None:
        z = z + r.double()
    return C.ACTIVATION_REFERENCE[act](z) if act != "none" else z


@pytest.mark.gpu
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("residual", [False, True])
def test_cuda_each_activation_matches_float64(act, dtype, residual):
    from rawconv import ConvProblem

    torch.manual_seed(21)
    dev = "cuda"
    x = torch.randn(4, 32, 14, 14, device=dev, dtype=dtype).to(memory_format=torch.channels_last)
    w = (torch.randn(64, 32, 3, 3, device=dev, dtype=dtype) * 0.1).to(memory_format=torch.channels_last)
    b = torch.randn(64, device=dev, dtype=dtype)
    r = torch.randn(4, 64, 14, 14, device=dev, dtype=dtype).to(memory_format=torch.channels_last) \
        if residual else None
    y = fu.conv_bias_act(x, w, b, r, padding=1, activation=act)
    assert y.dtype == dtype and y.is_contiguous(memory_format=torch.channels_last)
    plan = fu.plan_for(x, w, b, r, 1, 1, activation=act, backend="cudnn")
    if isinstance(plan, fu._CudaFallback):   # (cuDNN offered no engine for the graph: said by a warning)
        assert plan.activation == act
    elif act in fu.CUDNN_UNFUSED:
        assert getattr(plan, "torch_activation", None) == act and plan.activation is None
    else:
        assert plan.activation == act   # the graph's own pointwise node
    p = ConvProblem.from_torch(x, w, b, 1, 1, 1, 1)
    t = {"x": x, "w": w, "b": b}
    ref, ref_abs = C.reference(p, "forward", t)
    if r is not None:
        ref, ref_abs = ref + r.double(), ref_abs + r.double().abs()
    ref = C.ACTIVATION_REFERENCE[act](ref)
    stats = C.check(p, y, ref, ref_abs, C.tolerance_for(p, "forward", activation=act))
    assert stats.ok, (act, stats)


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["relu", "relu6", "silu", "gelu_tanh", "sigmoid", "tanh", "hardswish"])
@pytest.mark.parametrize("where", ["x", "w"])
def test_cuda_nan_follows_torch(act, where):
    """A NaN in the input or the weights: the fused graph keeps torch's NaNs (the ReLU family's
    pointwise nodes are built with CUDNN_PROPAGATE_NAN). No padding: a NaN weight times a padded
    zero is each kernel's own business, not the activation's."""
    torch.manual_seed(22)
    x = torch.randn(2, 16, 10, 10, device="cuda").to(memory_format=torch.channels_last)
    w = (torch.randn(32, 16, 3, 3, device="cuda") * 0.2).to(memory_format=torch.channels_last)
    b = torch.randn(32, device="cuda")
    if where == "x":
        x[0, 3, 4, 4] = math.nan
    else:
        w[5, 1, 1, 1] = math.nan
    want = TORCH[act](F.conv2d(x, w, b))
    y = fu.conv_bias_act(x, w, b, activation=act)
    assert torch.isnan(want).sum() > 0
    assert torch.equal(torch.isnan(y), torch.isnan(want)), (act, int(torch.isnan(y).sum()), int(torch.isnan(want).sum()))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["mobilenet_v3_small", "efficientnet_b0"])
def test_cuda_convert_fuse_on_torchvision_building_blocks(name):
    tv = _torchvision()
    torch.manual_seed(23)
    full = getattr(tv.models, name)(weights=None)
    m = _randomized(full.features[:4] if name == "mobilenet_v3_small" else full.features[:3]).cuda()
    m = m.to(memory_format=torch.channels_last)
    x = torch.randn(4, 3, 64, 64, device="cuda").to(memory_format=torch.channels_last)
    c = rnn.convert(m, fuse=True)
    with torch.no_grad():
        want, got = m(x), c(x)
    err = (got - want).abs().max().item()
    assert err <= 1e-3 * max(1.0, want.abs().max().item()), err


def test_describe_says_which_layers_run_unfused(monkeypatch):
    _m, c, x = _converted_all_unfused(monkeypatch, nn.SiLU(), nn.ReLU())
    rows = rnn.describe(c, x, timing=False)
    runs = {r.name: r.rawconv_runs for r in rows}
    errs = {r.name: r.rawconv_err for r in rows}
    assert runs["c1"].startswith("unfused (measured faster): conv+bias ") and runs["c1"].endswith("then torch's silu")
    assert runs["c2"].endswith("then torch's add+relu")
    assert all(e is not None and e < 1e-5 for e in errs.values()), errs   # what ran (unfused) against float64
    rnn.clear_tuning()


@pytest.mark.gpu
def test_cuda_convert_autotune_reports_the_graph_autotunes_fusion_decision():
    rnn.clear_tuning()
    m = _randomized(_Chain(nn.SiLU(), nn.ReLU())).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(4, 8, 14, 14, device="cuda").to(memory_format=torch.channels_last)
    c = rnn.convert(m, fuse=True, autotune=x, autotune_budget_s=0.3)
    rep = c.rawconv_report
    assert set(rep.fusion) == {"c1", "c2"}
    for name, e in rep.fusion.items():
        choice = [t for t in rep.tuned if t["name"] == name][0]["choice"]
        assert "cuDNN graph autotune" in e["reason"]
        assert e["decision"] == ("unfused" if str(choice).startswith("unfused:") else "fused")
    with torch.no_grad():
        want, got = m(x), c(x)
    assert (got - want).abs().max().item() <= 1e-3 * max(1.0, want.abs().max().item())
    rnn.clear_tuning()


def test_every_graph_activation_has_torchs_epilogue_for_unfused_configs():
    """An "unfused:<config>" selection of a fused graph runs the activation in torch
    (rawconv.cudnn_graph.torch_epilogue): every graph activation has its torch op there."""
    from rawconv import cudnn_graph as G

    assert set(G.ACTIVATIONS) <= set(G._EPILOGUE_ACT)
    torch.manual_seed(24)
    z, b, r = torch.randn(2, 4, 5, 5) * 3, torch.randn(4), torch.randn(2, 4, 5, 5)
    for act in set(G.ACTIVATIONS) & set(TORCH):
        y = G.torch_epilogue(z.clone(), b, r, act, 2)
        torch.testing.assert_close(y, TORCH[act](z + b.view(-1, 1, 1) + r), rtol=0, atol=0)


def test_nan_guard_off_runs_fused_as_torch_compile_freezing_does(monkeypatch):
    """RAWCONV_NAN_GUARD=0 / rawconv.onednn.fused.NAN_GUARD = False: a NaN-guarded activation runs
    fused on every call (no read of x first), as torch.compile with inductor freezing runs it; the
    JIT implementations then drop the NaN as torch's frozen graph does (measured 2026-12-07: 72 NaNs
    eager, 0 compiled with freezing, conv 3x3 + ReLU, one NaN in x). Finite data stays right."""
    from rawconv.core import env

    assert env.get("RAWCONV_NAN_GUARD", {}) is True and env.get("RAWCONV_NAN_GUARD", {"RAWCONV_NAN_GUARD": "0"}) is False
    torch.manual_seed(13)
    x, w, b = torch.randn(2, 8, 8, 8), torch.randn(8, 8, 3, 3) * 0.3, torch.randn(8)
    xn = x.clone()
    xn[0, 0, 4, 4] = math.nan
    guarded = fu.FusedConvolution(x, w, b, activation="relu")
    monkeypatch.setattr(OF, "NAN_GUARD", False)
    fast = fu.FusedConvolution(x, w, b, activation="relu")
    assert guarded.nan_guard and not fast.nan_guard
    _same_as_torch(guarded.run(xn, w, b), F.relu(F.conv2d(xn, w, b)), rtol=1e-5)   # torch eager's NaNs
    assert guarded.unfused_calls == 1
    y = fast.run(xn, w, b)
    assert fast.unfused_calls == 0   # fused, never checked
    finite = torch.isfinite(F.conv2d(xn, w, b))
    torch.testing.assert_close(y[finite], F.relu(F.conv2d(xn, w, b))[finite], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.run(x, w, b), F.relu(F.conv2d(x, w, b)), rtol=1e-5, atol=1e-5)
