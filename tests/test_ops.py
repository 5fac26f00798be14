"""rawconv.ops: the torch.library operators (rawconv::conv_forward, conv_backward_data,
conv_backward_weights), their fake kernels and autograd to second order, checked against float64
torch; opcheck; torch.compile(fullgraph=True); the function forms' autograd (no silent detach)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck
from torch.utils._python_dispatch import TorchDispatchMode

import rawconv.ops as ops
from rawconv import ArgumentError, ArgumentTypeError, ConvProblem, NotSupportedError, onednn
from rawconv.check import check, reference, tolerance_for
from rawconv.problem import empty_like_layout, to_layout

pytestmark = pytest.mark.usefixtures("dnnl")

FWD = torch.ops.rawconv.conv_forward.default
BWD_DATA = torch.ops.rawconv.conv_backward_data.default
BWD_WEIGHTS = torch.ops.rawconv.conv_backward_weights.default

# id, x shape, w shape, torch-style arguments, bias, layout of x (and w)
CASES = [
    ("1d-s2-asym-d2-g2-bias", (2, 4, 13), (6, 2, 3), dict(stride=2, padding=[(2, 0)], dilation=2, groups=2), True,
     "nchw"),
    ("2d-cl-s2-g3-asym-dil-bias", (2, 6, 10, 9), (6, 2, 3, 2), dict(stride=2, padding=[(0, 2), (1, 0)],
                                                                   dilation=(2, 1), groups=3), True, "nhwc"),
    ("3d-cl-g2-s121", (2, 4, 5, 6, 5), (4, 2, 2, 3, 3), dict(stride=(1, 2, 1), padding=1, groups=2), False, "nhwc"),
    ("2d-unbatched-same-bias", (4, 7, 7), (6, 4, 3, 3), dict(padding="same"), True, "nchw"),
]
MORE = [
    ("2d-plain", (2, 4, 9, 9), (6, 4, 3, 3), dict(padding=1), False, "nchw"),
    ("2d-depthwise-cl-bias", (2, 4, 8, 8), (4, 1, 3, 3), dict(padding=1, groups=4), True, "nhwc"),
    ("3d-asym-bias", (1, 2, 5, 6, 5), (4, 2, 3, 3, 3), dict(padding=[(1, 0), (0, 2), (1, 1)], dilation=(1, 1, 2)),
     True, "nchw"),
    ("1d-nwc-g2", (2, 4, 12), (4, 2, 3), dict(padding=1, groups=2), False, "nhwc"),
]
ids = [c[0] for c in CASES]
all_ids = ids + [c[0] for c in MORE]


def _tensors(case, dtype=torch.float32, seed=0, requires_grad=True):
    _, xs, ws, kw, has_bias, layout = case
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(xs, generator=g, dtype=torch.float64)
    w = torch.randn(ws, generator=g, dtype=torch.float64) / (ws[1] * ws[2]) ** 0.5
    b = torch.randn(ws[0], generator=g, dtype=torch.float64) if has_bias else None
    if layout == "nhwc" and len(xs) == len(ws):
        x, w = to_layout(x, "nhwc"), to_layout(w, "nhwc")
    x, w = x.to(dtype), w.to(dtype)
    b = b.to(dtype) if b is not None else None
    if requires_grad:
        for t in (x, w, b):
            if t is not None:
                t.requires_grad_()
    return x, w, b, kw


def _problem(x, w, b, kw) -> ConvProblem:
    return ConvProblem.from_torch(x.detach(), w.detach(), None if b is None else b.detach(), **kw)


def _op_args(x, w, kw):
    s, pb, pa, d, g = ops._conv_args(tuple(w.shape[2:]), kw.get("stride", 1), kw.get("padding", 0),
                                     kw.get("dilation", 1), kw.get("groups", 1))
    return [s, pb, pa, d, g]


def _fconv(x, w, b, p: ConvProblem):
    """torch's F.conv on the given tensors (explicit zero-pad first: asymmetric padding)."""
    pad = []
    for bf, af in reversed(list(zip(p.pad_before, p.pad_after))):
        pad += [bf, af]
    xin = F.pad(x, pad) if any(pad) else x
    return {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[p.ndim](xin, w, b, p.stride, 0, p.dilation, p.groups)


def _leaves64(*ts):
    return [t.detach().double().requires_grad_() if t is not None else None for t in ts]


def _close(got, want, rtol, name):
    assert got is not None and want is not None, name
    assert tuple(got.shape) == tuple(want.shape), (name, got.shape, want.shape)
    err = (got.detach().double() - want.detach()).abs().max().item()
    scale = max(want.detach().abs().max().item(), 1e-30)
    assert err <= rtol * scale, f"{name}: max error {err:.3e}, {err / scale:.3e} of max |ref| {scale:.3e}"


# ---------------------------------------------------------------------------- first order, against float64
@pytest.mark.parametrize("case", CASES + MORE, ids=all_ids)
def test_forward_and_gradients_match_float64(case):
    x, w, b, kw = _tensors(case)
    p = _problem(x, w, b, kw)
    y = ops.conv(x, w, b, **kw)
    assert y.grad_fn is not None and type(y.grad_fn).__name__ == "RawconvConvForwardBackward"
    ref, ref_abs = reference(p, "forward", {"x": x, "w": w, "b": b})
    st = check(p, y, ref, ref_abs, tolerance_for(p, "forward"))
    assert st.ok, st
    # memory format follows x (unbatched: one sample of it)
    want_strides = empty_like_layout(p.y_shape, p.layout, y.dtype, "cpu").stride()
    assert (y.unsqueeze(0) if p.unbatched else y).stride() == want_strides
    gy = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).float()
    y.backward(gy)
    for direction, got in (("backward_data", x.grad), ("backward_weights", w.grad)):
        tensors = {"x": x, "w": w, "dy": gy}
        ref, ref_abs = reference(p, direction, tensors)
        st = check(p, got, ref, ref_abs, tolerance_for(p, direction))
        assert st.ok, (direction, st)
    if b is not None:
        db = gy.double().sum([d for d in range(gy.dim()) if d != (0 if p.unbatched else 1)])
        _close(b.grad, db, 1e-5, "db")


# ---------------------------------------------------------------------------- second order (issue 13)
def test_double_backward_issue_13_repro():
    """gx = grad(conv(x, w, padding=1).pow(2).sum(), x, create_graph=True) must be differentiable, and a
    gradient penalty on gx must give float64's dw (it was silently zero)."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    gx, = torch.autograd.grad(ops.conv(x, w, padding=1).pow(2).sum(), x, create_graph=True)
    assert gx.requires_grad
    dw, = torch.autograd.grad(gx.pow(2).sum(), w)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    gx64, = torch.autograd.grad(F.conv2d(x64, w64, padding=1).pow(2).sum(), x64, create_graph=True)
    dw64, = torch.autograd.grad(gx64.pow(2).sum(), w64)
    assert dw64.abs().max() > 1.0
    _close(gx, gx64, 1e-5, "gx")
    _close(dw, dw64, 1e-4, "dw")


@pytest.mark.parametrize("case", CASES + MORE, ids=all_ids)
def test_double_backward_matches_float64(case):
    """Gradient penalties through both first-order gradients: d/dx, d/dw, d/db of
    |dL/dx|^2 + |dL/dw|^2 with L = sum(conv(x, w, b)^2 * c), against float64 torch autograd."""
    x, w, b, kw = _tensors(case)
    p = _problem(x, w, b, kw)
    c = torch.rand(p.y_shape if not p.unbatched else p.y_shape[1:], generator=torch.Generator().manual_seed(5),
                   dtype=torch.float64)

    def run(conv, xx, ww, bb):
        y = conv(xx, ww, bb)
        loss = (y.pow(2) * c.to(y.dtype)).sum()
        gx, gw = torch.autograd.grad(loss, (xx, ww), create_graph=True)
        assert gx.requires_grad and gw.requires_grad
        penalty = gx.pow(2).sum() + gw.pow(2).sum()
        return (gx, gw) + torch.autograd.grad(penalty, [t for t in (xx, ww, bb) if t is not None])

    got = run(lambda xx, ww, bb: ops.conv(xx, ww, bb, **kw), x, w, b)
    want = run(lambda xx, ww, bb: _fconv(xx, ww, bb, p), *_leaves64(x, w, b))
    for name, g, r in zip(("gx", "gw", "d2x", "d2w", "d2b"), got, want):
        _close(g, r, 1e-5 if name in ("gx", "gw") else 2e-4, name)


def test_backward_ops_double_backward_against_float64():
    """The backward operators used directly (not through conv) are differentiable in both inputs."""
    x, w, b, kw = _tensors(CASES[1])
    p = _problem(x, w, b, kw)
    a = _op_args(x, w, kw)
    gy = torch.randn(p.y_shape, dtype=torch.float32).to(memory_format=torch.channels_last).requires_grad_()
    dx = BWD_DATA(gy, w, list(x.shape), *a, "auto", "", "strict")
    dw, db = BWD_WEIGHTS(x, gy, list(w.shape), *a, True, "onednn", "", "strict")
    loss = dx.pow(2).sum() + dw.pow(2).sum() + db.pow(2).sum()
    got = torch.autograd.grad(loss, (gy, w, x))
    gy64, w64, x64 = (t.detach().double().requires_grad_() for t in (gy, w, x))

    def fwd(xx, ww):
        return _fconv(xx, ww, None, p)
    z = torch.zeros_like(x64, requires_grad=True)
    dx64, = torch.autograd.grad(fwd(z, w64), z, gy64, create_graph=True)
    zw = torch.zeros_like(w64, requires_grad=True)
    dw64, = torch.autograd.grad(fwd(x64, zw), zw, gy64, create_graph=True)
    db64 = gy64.sum((0, 2, 3))
    want = torch.autograd.grad(dx64.pow(2).sum() + dw64.pow(2).sum() + db64.pow(2).sum(), (gy64, w64, x64))
    _close(dx, dx64, 1e-5, "dx")
    _close(dw, dw64, 1e-5, "dw")
    for name, g, r in zip(("d grad_y", "d w", "d x"), got, want):
        _close(g, r, 1e-4, name)


# ---------------------------------------------------------------------------- opcheck
def _opcheck_all(x, w, b, kw):
    p = _problem(x, w, b, kw)
    a = _op_args(x, w, kw)
    results = {"conv_forward": opcheck(FWD, (x, w, b, *a, "auto", "", "strict", "", ""))}
    y = ops.conv(x.detach(), w.detach(), None if b is None else b.detach(), **kw)
    gy = torch.randn_like(y).requires_grad_()
    results["conv_backward_data"] = opcheck(BWD_DATA, (gy, w, list(x.shape), *a, "onednn", "", "strict"))
    for bias in (True, False):
        results[f"conv_backward_weights(bias={bias})"] = opcheck(
            BWD_WEIGHTS, (x, gy, list(w.shape), *a, bias, "onednn", "", "strict"))
    assert p is not None
    return results


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_opcheck_cpu_float32(case):
    x, w, b, kw = _tensors(case)
    for op, res in _opcheck_all(x, w, b, kw).items():
        assert set(res.values()) == {"SUCCESS"}, (op, res)


def _bf16_reason() -> str:
    """Why bf16 opcheck cannot run here ('' when it can): oneDNN must offer a non-reference bf16
    implementation for every direction of a small problem on this CPU."""
    x = torch.randn(2, 8, 6, 6).bfloat16()
    w = torch.randn(8, 8, 3, 3).bfloat16()
    for d in ("forward", "backward_data", "backward_weights"):
        try:
            names = [i.name for i in onednn.implementations(x, w, padding=1, direction=d)]
        except NotSupportedError as exc:
            return f"oneDNN offers no bf16 {d} convolution on this CPU: {exc}"
        if not [n for n in names if not n.startswith("ref")]:
            return f"oneDNN offers only reference bf16 {d} implementations on this CPU ({names})"
    return ""


def test_opcheck_cpu_bfloat16():
    reason = _bf16_reason()
    if reason:
        pytest.skip(reason)
    case = ("2d-bf16", (2, 8, 6, 6), (8, 8, 3, 3), dict(padding=1), True, "nhwc")
    x, w, b, kw = _tensors(case, dtype=torch.bfloat16)
    for op, res in _opcheck_all(x, w, b, kw).items():
        assert set(res.values()) == {"SUCCESS"}, (op, res)
    y = ops.conv(x, w, b, **kw)
    assert y.dtype == torch.bfloat16
    p = _problem(x, w, b, kw)
    ref, ref_abs = reference(p, "forward", {"x": x, "w": w, "b": b})
    assert check(p, y, ref, ref_abs, tolerance_for(p, "forward")).ok


# ---------------------------------------------------------------------------- torch.compile
class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 4, 3, bias=False)

    def forward(self, x):
        y = torch.relu(ops.conv(x, self.c1.weight, self.c1.bias, padding=1, backward_choice=None))
        return ops.conv(y, self.c2.weight, None, stride=2, padding=[(0, 1), (1, 0)]).pow(2).mean()


def _compile_check(backend, make_net=None, x=None):
    """A net (default _Net) compiled with fullgraph=True: its loss and gradients equal eager's, and
    its loss under no_grad too."""
    torch.manual_seed(0)
    net = (make_net or _Net)()
    x = torch.randn(2, 3, 12, 12).to(memory_format=torch.channels_last) if x is None else x
    loss = net(x)
    loss.backward()
    want = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    torch._dynamo.reset()
    cnet = torch.compile(net, fullgraph=True, backend=backend)
    got = cnet(x)
    got.backward()
    _close(got, loss.double(), 1e-5, "loss")
    for g, r in zip((p.grad for p in net.parameters()), want):
        _close(g, r.double(), 1e-4, "grad")
    with torch.no_grad():
        _close(cnet(x), loss.double(), 1e-5, "no-grad loss")


def test_compile_fullgraph_aot_eager():
    """fullgraph=True: tracing raises on any graph break; fake kernels and autograd traced."""
    _compile_check("aot_eager")


@pytest.mark.slow
def test_compile_fullgraph_inductor():
    """The default backend (inductor; compiles C++ for the pointwise parts, ~20 s here)."""
    _compile_check("inductor")


# ---------------------------------------------------------------------------- rawconv::conv_transpose
F_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
# id, x shape, w shape (C_in, C_out/groups, *kernel), torch's arguments, bias, layout
T_CASES = [
    ("1d-s2-op1-g2-bias", (2, 4, 7), (4, 3, 3), dict(stride=2, padding=1, output_padding=1, groups=2), True, "nchw"),
    ("2d-cl-s2-d2-bias", (2, 6, 5, 4), (6, 2, 3, 2), dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2)), True,
     "nhwc"),
    ("3d-s2-op", (1, 4, 3, 4, 3), (4, 2, 2, 3, 2), dict(stride=2, padding=(0, 1, 0), output_padding=(1, 0, 0)),
     False, "nchw"),
    ("2d-unbatched-bias", (4, 5, 5), (4, 3, 3, 3), dict(stride=2, padding=1), True, "nchw"),
]
t_ids = [c[0] for c in T_CASES]


def _t_tensors(case):
    """x, w, bias (C_out = w.shape[1] * groups), kw of a transposed case; every tensor requires grad."""
    _, xs, ws, kw, has_bias, layout = case
    g = torch.Generator().manual_seed(1)
    x = torch.randn(xs, generator=g)
    w = torch.randn(ws, generator=g) / (ws[0] * ws[2]) ** 0.5
    if layout == "nhwc":
        x, w = to_layout(x, "nhwc"), to_layout(w, "nhwc")
    b = torch.randn(ws[1] * kw.get("groups", 1), generator=g) if has_bias else None
    for t in (x, w, b):
        if t is not None:
            t.requires_grad_()
    return x, w, b, kw


@pytest.mark.parametrize("case", T_CASES, ids=t_ids)
def test_conv_transpose_and_its_gradients_to_second_order_match_float64(case):
    x, w, b, kw = _t_tensors(case)
    ft = F_T[w.dim() - 2]
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = None if b is None else b.detach().double().requires_grad_()
    y = ops.conv_transpose(x, w, b, **kw)
    ref = ft(x64, w64, b64, **kw)
    _close(y, ref, 1e-5, "y")
    assert y.is_contiguous(memory_format=torch.channels_last) == (case[-1] == "nhwc")
    gy = torch.randn(ref.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ins, ins64 = [t for t in (x, w, b) if t is not None], [t for t in (x64, w64, b64) if t is not None]
    g = torch.autograd.grad(y, ins, gy.float(), create_graph=True)
    g64 = torch.autograd.grad(ref, ins64, gy, create_graph=True)
    for name, a, r in zip(("gx", "gw", "gb"), g, g64):
        _close(a, r, 1e-4, name)
    # second order: a gradient penalty on gx and gw, differentiated again
    v = torch.randn(x.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    h = torch.autograd.grad((g[0] * v.float()).sum() + g[1].pow(2).sum(), ins[1:2])
    h64 = torch.autograd.grad((g64[0] * v).sum() + g64[1].pow(2).sum(), ins64[1:2])
    _close(h[0], h64[0], 1e-4, "d(penalty)/dw")


def test_conv_transpose_pins_its_backward_choices():
    # backward_choice reaches the gradient calls: a name the library does not offer fails there
    x, w, b, kw = _t_tensors(T_CASES[0])
    y = ops.conv_transpose(x, w, b, **kw, backward_choice=("no-such-impl", ""))
    with pytest.raises(NotSupportedError, match="no-such-impl"):
        y.sum().backward()
    y = ops.conv_transpose(x, w, b, **kw, backward_choice=("", "no-such-impl"))
    with pytest.raises(NotSupportedError, match="no-such-impl"):
        y.sum().backward()
    x.grad = None
    y = ops.conv_transpose(x, w, b, **kw)
    names = [f"{i.name}@{i.layouts}" for i in onednn.implementations(   # grad x: the matching forward conv
        torch.randn(y.shape), w.detach(), stride=2, padding=1, groups=2) if not i.name.startswith("ref")]
    gy = torch.randn(y.shape)
    for name in (names[0], names[-1]):
        gx, = torch.autograd.grad(ops.conv_transpose(x, w, b, **kw, backward_choice=(name, "")), x, gy)
        _close(gx, F.conv1d(gy.double(), w.detach().double(), None, 2, 1, 1, 2), 1e-5, name)


def test_conv_transpose_bad_input_raises_before_any_library_call(monkeypatch):
    from rawconv.onednn import _ffi as _dnnl

    monkeypatch.setattr(_dnnl, "load", lambda *a, **k: pytest.fail("a C call"))
    x, w = torch.randn(2, 4, 5, 5), torch.randn(4, 3, 3, 3)
    for bad, exc, match in [
            (dict(bias=torch.randn(4)), ArgumentError, r"bias must be a \(3,\) tensor"),
            (dict(bias=torch.randn(3).double()), ArgumentError, "dtype"),
            (dict(bias=[1.0, 2.0, 3.0]), ArgumentTypeError, "bias"),
            (dict(output_padding=2, stride=2), ArgumentError, "output_padding"),
            (dict(groups=3), ArgumentError, "groups"),
            (dict(backend="cudnn"), ArgumentError, "CUDA tensors"),
            (dict(choice=3), ArgumentTypeError, "positions"),
            (dict(precision="fp8"), ArgumentError, "precision")]:
        with pytest.raises(exc, match=match):
            ops.conv_transpose(x, w, **bad)
    with pytest.raises(ArgumentError, match="channels"):
        ops.conv_transpose(torch.randn(2, 5, 5, 5), w)


class _TransposeNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        import rawconv.nn as rnn

        self.down = rnn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.up = rnn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.up1 = rnn.ConvTranspose1d(4, 2, 2, stride=2)

    def forward(self, x):
        y = self.up(torch.relu(self.down(x)))
        return self.up1(y.flatten(2)[..., :8]).pow(2).mean()


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compile_fullgraph_with_transposed_modules(backend):
    # rawconv.nn's ConvTranspose modules ran a Python autograd Function calling the backends
    # directly: dynamo could not trace it (fullgraph=True raised). They run rawconv.ops.conv_transpose
    # (the registered operators) now.
    _compile_check(backend, _TransposeNet, torch.randn(2, 3, 8, 8))


# ---------------------------------------------------------------------------- the friendly API and errors
def test_direct_path_and_operator_path_agree():
    """Without autograd, modes or tracers ops.conv skips the dispatcher; with a dispatch mode on, the
    operator is called (the mode sees it) and returns the same values."""
    x, w, b, kw = _tensors(CASES[1], requires_grad=False)
    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    y1 = ops.conv(x, w, b, **kw)
    with Log():
        y2 = ops.conv(x, w, b, **kw)
    assert "rawconv.conv_forward.default" in seen
    assert torch.equal(y1, y2) and y1.stride() == y2.stride()
    with torch.no_grad():
        y3 = ops.conv(x.requires_grad_(), w, b, **kw)
    assert y3.grad_fn is None and torch.equal(y1, y3)


def test_operator_called_directly_matches_friendly_api():
    x, w, b, kw = _tensors(CASES[0])
    y = FWD(x, w, b, *_op_args(x, w, kw), "onednn", "", "strict", "", "")
    torch.testing.assert_close(y, ops.conv(x, w, b, **kw), rtol=0, atol=0)


def test_pinned_choices_run_and_backward_choices_are_used():
    x, w, b, kw = _tensors(MORE[0])
    xd, wd = x.detach(), w.detach()
    fwd = [i for i in onednn.implementations(xd, wd, **kw) if not i.name.startswith("ref")]
    bd = [i for i in onednn.implementations(xd, wd, direction="backward_data", **kw) if not i.name.startswith("ref")]
    bw = [i for i in onednn.implementations(xd, wd, direction="backward_weights", **kw)
          if not i.name.startswith("ref")]
    f, d, wt = fwd[-1], bd[-1], bw[-1]
    ops.clear_cache()
    y = ops.conv(x, w, None, **kw, choice=f, backward_choice=(d.name, f"{wt.name}@{wt.layouts}"))
    y.sum().backward()
    sel = {plan.direction: plan.selected.choice for plan in ops._cpu_cache._plans.values()}
    assert sel == {"forward": f.choice, "backward_data": d.choice, "backward_weights": wt.choice}
    assert ops.selected(x, w, None, **kw, choice=f, backward_choice=(d.name, f"{wt.name}@{wt.layouts}")) == sel
    torch.testing.assert_close(y, F.conv2d(xd, wd, None, 1, 1), rtol=1e-4, atol=1e-4)
    default = ops.selected(x, w, None, **kw)
    assert default["forward"] == onednn.implementations(xd, wd, **kw)[0].choice


@pytest.mark.parametrize("call, exc, words", [
    (lambda x, w: ops.conv(x, w, backend="cudnn"), ArgumentError, "CUDA tensors"),
    (lambda x, w: ops.conv(x, w, backend="tpu"), ArgumentError, "backend must be one of"),
    (lambda x, w: ops.conv(x, w, precision="fp8"), ArgumentError, "precision must be one of"),
    (lambda x, w: ops.conv(x, w, choice="no-such-impl"), NotSupportedError, "offered"),
    (lambda x, w: ops.conv(x, w, choice=3.5), ArgumentTypeError, "choice must be"),
    (lambda x, w: ops.conv(x, w, backward_choice=("a", "b", "c")), ArgumentError, "(data, weights) pair"),
    (lambda x, w: ops.conv(x, w, groups=3), ArgumentError, "groups"),
    (lambda x, w: ops.conv(x, w, padding=[(1, 1)]), ArgumentError, "pair per spatial dim"),
    (lambda x, w: FWD(x, w, None, [1, 1], [1], [1, 1], [1, 1], 1, "auto", "", "strict", "", ""), ArgumentError,
     "pad_before and pad_after"),
    (lambda x, w: FWD(x, w, None, [1, 1], [0, 0], [0, 0], [1, 1], 1, "onednn", "bogus", "strict", "", ""),
     NotSupportedError, "offered"),
    (lambda x, w: FWD(x, w, None, [1, 1], [0, 0], [0, 0], [1, 1], 1, "cudnn", "", "strict", "", ""),
     ArgumentError, "CUDA tensors"),
    (lambda x, w: BWD_DATA(x, w, [2, 4, 9, 9], [1, 1], [0, 0], [0, 0], [1, 1], 1, "onednn", "", "strict"),
     ArgumentError, "grad_y"),
    (lambda x, w: BWD_WEIGHTS(x, x, [6, 4, 3, 3], [1, 1], [0, 0], [0, 0], [1, 1], 1, False, "onednn", "",
                              "strict"), ArgumentError, "grad_y"),
    (lambda x, w: ops.conv_backward_weights(x, x, (6, 4, 3, 3), bias=1), ArgumentTypeError, "bias"),
    (lambda x, w: ops.conv(x.double(), w.double()), ArgumentError, "float64"),
])
def test_bad_input_raises_rawconv_errors_through_the_dispatcher(call, exc, words):
    x = torch.randn(2, 4, 9, 9, requires_grad=True)
    w = torch.randn(6, 4, 3, 3, requires_grad=True)
    with pytest.raises(exc, match=words.replace("(", r"\(").replace(")", r"\)")):
        call(x, w)


def test_fake_kernels_shapes_strides_without_library_calls(monkeypatch):
    """Under FakeTensorMode the operators give the real kernels' shapes, dtypes and strides with no
    oneDNN call (the plan factory is replaced by one that fails)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    reals = {}
    for case in CASES:
        x, w, b, kw = _tensors(case, requires_grad=False)
        y = ops.conv(x, w, b, **kw)
        gy = torch.randn_like(y)
        a = _op_args(x, w, kw)
        reals[case[0]] = (y, BWD_DATA(gy, w, list(x.shape), *a, "auto", "", "strict"),
                          BWD_WEIGHTS(x, gy, list(w.shape), *a, b is not None, "auto", "", "strict"))

    def boom(*args, **kwargs):
        raise AssertionError("a fake kernel called oneDNN")
    monkeypatch.setattr(onednn, "cached_plan", boom)
    with FakeTensorMode() as mode:
        for case in CASES:
            x, w, b, kw = _tensors(case, requires_grad=False)
            fx, fw = mode.from_tensor(x), mode.from_tensor(w)
            fb = mode.from_tensor(b) if b is not None else None
            a = _op_args(x, w, kw)
            y, dx, (dw, db) = reals[case[0]]
            fy = FWD(fx, fw, fb, *a, "auto", "", "strict", "", "")
            fgy = torch.empty_strided(y.shape, y.stride())
            fdx = BWD_DATA(fgy, fw, list(x.shape), *a, "auto", "", "strict")
            fdw, fdb = BWD_WEIGHTS(fx, fgy, list(w.shape), *a, b is not None, "auto", "", "strict")
            for real, fake in ((y, fy), (dx, fdx), (dw, fdw), (db, fdb)):
                assert (fake.shape, fake.stride(), fake.dtype) == (real.shape, real.stride(), real.dtype), case[0]
    assert reals["1d-s2-asym-d2-g2-bias"][2][1].shape == (6,)


def test_backward_weights_without_bias_returns_an_empty_db():
    x, w, b, kw = _tensors(MORE[0], requires_grad=False)
    y = ops.conv(x, w, None, **kw)
    dw, db = BWD_WEIGHTS(x, torch.randn_like(y), list(w.shape), *_op_args(x, w, kw), False, "auto", "", "strict")
    assert db.shape == (0,) and dw.shape == w.shape
    assert torch.is_tensor(ops.conv_backward_weights(x, torch.randn_like(y), w.shape, padding=1))


# ---------------------------------------------------------------------------- function forms (issue 10)
def test_onednn_function_forms_record_autograd():
    x, w, b, kw = _tensors(CASES[1])
    p = _problem(x, w, b, kw)
    y = onednn.forward(x, w, b, **kw)
    assert y.grad_fn is not None
    gy = torch.randn_like(y)
    y.backward(gy)
    ref, ref_abs = reference(p, "backward_data", {"w": w, "dy": gy})
    assert check(p, x.grad, ref, ref_abs, tolerance_for(p, "backward_data")).ok
    # the no-grad path is unchanged: no graph, same values
    with torch.no_grad():
        y0 = onednn.forward(x, w, b, **kw)
    assert y0.grad_fn is None and torch.equal(y0, y.detach())
    assert onednn.forward(x.detach(), w.detach(), b.detach(), **kw).grad_fn is None
    # an int position selects the same implementation as without grad
    y1 = onednn.forward(x, w, b, **kw, impl=0)
    assert y1.grad_fn is not None and torch.equal(y1.detach(), y0)
    # backward functions on tensors that require grad: differentiable (to second order)
    gyr = gy.clone().to(memory_format=torch.channels_last).requires_grad_()
    dx = onednn.backward_data(gyr, w, tuple(x.shape), **kw)
    dw, db = onednn.backward_weights(x, gyr, tuple(w.shape), **kw, bias=True)
    assert dx.grad_fn is not None and dw.grad_fn is not None and db.grad_fn is not None
    assert dw.is_contiguous()   # as without grad
    with torch.no_grad():
        dx0 = onednn.backward_data(gyr, w, tuple(x.shape), **kw)
        dw0, db0 = onednn.backward_weights(x, gyr, tuple(w.shape), **kw, bias=True)
    assert torch.equal(dx.detach(), dx0) and dx.stride() == dx0.stride()
    assert torch.equal(dw.detach(), dw0) and dw.stride() == dw0.stride() and torch.equal(db.detach(), db0)
    g1, g2 = torch.autograd.grad((dx.pow(2).sum() + dw.pow(2).sum()), (gyr, w))
    assert g1.shape == gy.shape and g2.shape == w.shape


def test_onednn_function_forms_refuse_what_autograd_cannot_record():
    x = torch.randn(1, 4, 6, 6, requires_grad=True)
    w = torch.randn(4, 4, 3, 3)
    out = torch.empty(1, 4, 4, 4)
    with pytest.raises(ArgumentError, match="out="):
        onednn.forward(x, w, out=out)
    with pytest.raises(ArgumentError, match="algorithm="):
        onednn.forward(x, w, algorithm="winograd")
    with torch.no_grad():
        assert onednn.forward(x, w, out=out) is out


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_modules_style_training_step_agrees_with_torch(layout):
    """A few SGD steps of a two-layer CNN through ops.conv against the same in torch (float32)."""
    torch.manual_seed(1)
    ref = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 2, 3))
    mine = [p.detach().clone().requires_grad_() for p in ref.parameters()]
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    x = torch.randn(4, 3, 10, 10).to(memory_format=fmt)
    for _ in range(3):
        loss_ref = ref(x).pow(2).mean()
        loss = ops.conv(torch.relu(ops.conv(x, mine[0], mine[1], padding=1)), mine[2], mine[3]).pow(2).mean()
        ref.zero_grad()
        loss_ref.backward()
        loss.backward()
        with torch.no_grad():
            for p, q in zip(ref.parameters(), mine):
                assert abs(loss.item() - loss_ref.item()) <= 1e-5 * abs(loss_ref.item())
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)
                p -= 0.1 * p.grad
                q -= 0.1 * q.grad
                q.grad = None


# ---------------------------------------------------------------------------- GPU (the lead runs these)
def _gpu_cases():
    return [("2d-nchw", (2, 4, 9, 9), (6, 4, 3, 3), dict(padding=1), True, "nchw"),
            ("2d-cl-g2-s2-asym", (2, 4, 10, 9), (6, 2, 3, 3), dict(stride=2, padding=[(0, 2), (1, 0)], groups=2),
             True, "nhwc"),
            ("3d-cl", (1, 4, 5, 6, 5), (4, 4, 3, 3, 3), dict(padding=1), False, "nhwc"),
            ("1d-unbatched", (4, 11), (6, 4, 3), dict(padding=1), True, "nchw")]


def _gpu_params():
    """(case, backend) pairs: cuDNN's legacy API on every case; the graph API on channels_last ones (most
    graph engines take NHWC only; NCHW graphs often get no engine at all)."""
    return [pytest.param(c, b, id=f"{c[0]}-{b}") for c in _gpu_cases() for b in ("cudnn", "cudnn_graph")
            if b == "cudnn" or c[5] == "nhwc"]


def _cuda(case, dtype=torch.float32):
    x, w, b, kw = _tensors(case, dtype=dtype, requires_grad=False)
    out = [t.cuda().requires_grad_() if t is not None else None for t in (x, w, b)]
    return (*out, kw)


@pytest.mark.gpu
@pytest.mark.parametrize("case, backend", _gpu_params())
def test_opcheck_cuda(case, backend):
    x, w, b, kw = _cuda(case)
    a = _op_args(x, w, kw)
    res = [opcheck(FWD, (x, w, b, *a, backend, "", "strict", "", ""))]
    y = ops.conv(x.detach(), w.detach(), None if b is None else b.detach(), **kw, backend=backend)
    gy = torch.randn_like(y).requires_grad_()
    res.append(opcheck(BWD_DATA, (gy, w, list(x.shape), *a, backend, "", "strict")))
    res.append(opcheck(BWD_WEIGHTS, (x, gy, list(w.shape), *a, b is not None, backend, "", "strict")))
    for r in res:
        assert set(r.values()) == {"SUCCESS"}, r


@pytest.mark.gpu
@pytest.mark.parametrize("case, backend", _gpu_params())
def test_double_backward_cuda_matches_float64(case, backend):
    """As the CPU test, on cuDNN (precision strict: no TF32); tolerances leave room for the transform
    algorithms (FFT, Winograd) cuDNN's heuristic may pick; a wrong formula is off by O(1)."""
    x, w, b, kw = _cuda(case)
    p = _problem(x, w, b, kw)
    xc, wc, bc = (t.detach().cpu() if t is not None else None for t in (x, w, b))

    def run(conv, xx, ww, bb):
        y = conv(xx, ww, bb)
        gx, gw = torch.autograd.grad(y.pow(2).sum(), (xx, ww), create_graph=True)
        return (gx, gw) + torch.autograd.grad(gx.pow(2).sum() + gw.pow(2).sum(),
                                              [t for t in (xx, ww, bb) if t is not None])

    with torch.backends.cudnn.flags(allow_tf32=False):
        got = run(lambda xx, ww, bb: ops.conv(xx, ww, bb, **kw, backend=backend), x, w, b)
    want = run(lambda xx, ww, bb: _fconv(xx, ww, bb, p), *_leaves64(xc, wc, bc))
    for name, g, r in zip(("gx", "gw", "d2x", "d2w", "d2b"), got, want):
        _close(g.cpu(), r, 1e-4 if name in ("gx", "gw") else 1e-3, name)


@pytest.mark.gpu
@pytest.mark.parametrize("case", T_CASES, ids=t_ids)
@pytest.mark.parametrize("backend", ["cudnn", "cudnn_graph"])
def test_conv_transpose_cuda(case, backend):
    # rawconv.ops.conv_transpose on cuDNN: values and first/second-order gradients against float64
    # on the CPU, and torch.compile(fullgraph=True) of a function using it
    if backend == "cudnn_graph" and case[-1] != "nhwc":
        pytest.skip("graph engines take NHWC (NCHW graphs often get no engine)")
    x, w, b, kw = (t.detach().cuda().requires_grad_() if isinstance(t, torch.Tensor) else t for t in _t_tensors(case))
    ft = F_T[w.dim() - 2]
    x64, w64 = x.detach().cpu().double().requires_grad_(), w.detach().cpu().double().requires_grad_()
    b64 = None if b is None else b.detach().cpu().double().requires_grad_()
    y = ops.conv_transpose(x, w, b, **kw, backend=backend)
    ref = ft(x64, w64, b64, **kw)
    _close(y.cpu(), ref, 1e-4, "y")
    ins, ins64 = [t for t in (x, w, b) if t is not None], [t for t in (x64, w64, b64) if t is not None]
    gy = torch.randn(ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    g = torch.autograd.grad(y, ins, gy.float().cuda(), create_graph=True)
    g64 = torch.autograd.grad(ref, ins64, gy, create_graph=True)
    for name, a, r in zip(("gx", "gw", "gb"), g, g64):
        _close(a.cpu(), r, 1e-3, name)
    h = torch.autograd.grad(g[1].pow(2).sum(), ins[0])
    h64 = torch.autograd.grad(g64[1].pow(2).sum(), ins64[0])
    _close(h[0].cpu(), h64[0], 1e-3, "d|gw|^2/dx")
    fn = torch.compile(lambda a, ww, bb: ops.conv_transpose(a, ww, bb, **kw, backend=backend), fullgraph=True,
                       backend="aot_eager")
    _close(fn(x, w, b).detach().cpu(), ref, 1e-4, "compiled y")


@pytest.mark.gpu
def test_cudnn_function_forms_record_autograd():
    from rawconv import cudnn, cudnn_graph

    x, w, b, kw = _cuda(_gpu_cases()[1])
    for fn in (cudnn.forward, cudnn_graph.forward):
        y = fn(x, w, b, **kw)
        assert y.grad_fn is not None
        gx, = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
        assert gx.requires_grad
        with torch.no_grad():
            assert fn(x, w, b, **kw).grad_fn is None
    with pytest.raises(ArgumentError, match="out="):
        cudnn.forward(x, w, b, **kw, out=torch.empty_like(y))
    with pytest.raises(ArgumentError, match="activation="):
        cudnn_graph.forward(x, w, b, **kw, activation="relu")
    gy = torch.randn_like(y).requires_grad_()
    assert cudnn.backward_data(gy, w, tuple(x.shape), **kw).grad_fn is not None
    assert cudnn.backward_weights(x, gy, tuple(w.shape), **kw).grad_fn is not None
    assert cudnn_graph.backward_filter(x, gy, tuple(w.shape), **kw).grad_fn is not None


# ---------------------------------------------------------------------------- hot paths (per-call cost work)
def test_hot_paths_follow_new_pointers_shapes_and_contents():
    """The hot paths skip checks and handle updates only when nothing changed: new tensors, new
    contents at the same address, other shapes with the same arguments, unbatched input, bias."""
    torch.manual_seed(2)
    w = torch.randn(6, 4, 3, 3)
    b = torch.randn(6)
    plan = onednn.Convolution(torch.randn(2, 4, 9, 9), w, b, padding=1)
    for fn in (lambda x: plan.execute(x, w, b), lambda x: onednn.forward(x, w, b, padding=1),
               lambda x: ops.conv(x, w, b, padding=1)):
        x = torch.randn(2, 4, 9, 9)
        for _ in range(3):
            torch.testing.assert_close(fn(x), F.conv2d(x, w, b, padding=1), rtol=1e-4, atol=1e-4)
            x.mul_(-2)                                      # same address, new contents
        x2 = torch.randn(2, 4, 9, 9)
        torch.testing.assert_close(fn(x2), F.conv2d(x2, w, b, padding=1), rtol=1e-4, atol=1e-4)
    for shape in ((3, 4, 7, 5), (4, 9, 9), (2, 4, 9, 9)):    # other shapes through the same arguments
        x = torch.randn(shape)
        for fn in (onednn.forward, ops.conv):
            y = fn(x, w, b, padding=1)
            torch.testing.assert_close(y, F.conv2d(x, w, b, padding=1), rtol=1e-4, atol=1e-4)
    xc = torch.randn(2, 4, 9, 9).to(memory_format=torch.channels_last)   # same shape, other strides
    yc = onednn.forward(xc, w, b, padding=1)
    assert yc.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(yc, F.conv2d(xc, w, b, padding=1), rtol=1e-4, atol=1e-4)
    with pytest.raises(ArgumentError, match="float32"):
        plan.execute(torch.randn(2, 4, 9, 9).double(), w, b)   # a misfit still gets the checks


def test_hot_path_out_bumps_the_version_and_refuses_overlap():
    torch.manual_seed(3)
    x, w = torch.randn(1, 4, 8, 8), torch.randn(4, 4, 3, 3)
    plan = onednn.Convolution(x, w, padding=1)
    out = torch.empty(1, 4, 8, 8)
    for _ in range(3):   # the first call takes the checked path, the next ones the hot path
        v = out._version
        assert plan.execute(x, out=out) is out and out._version > v
        torch.testing.assert_close(out, F.conv2d(x, w, padding=1), rtol=1e-4, atol=1e-4)
    a = torch.ones(1, 4, 8, 8, requires_grad=True)
    z = (a * out).sum()
    onednn.forward(x, w, padding=1, out=out)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()                                       # as torch's own out= functions
    with pytest.raises(ArgumentError, match="overlaps"):
        plan.execute(x, out=x)
    with pytest.raises(ArgumentError, match="strides"):
        plan.execute(x, out=torch.empty(1, 8, 8, 4).permute(0, 3, 1, 2))


# ---------------------------------------------------------------------------- known-bad implementations
def test_operators_never_run_a_known_bad_implementation():
    """oneDNN #6035 (rawconv.known_bad): the operators' plans refuse it by name before any C call, and a
    function form asked to allow it on tensors that require grad refuses (the operators cannot)."""
    from rawconv.errors import KnownBadError

    x = torch.randn(32, 4, 32, 32).to(memory_format=torch.channels_last)
    gy = torch.randn(32, 8, 16, 16).to(memory_format=torch.channels_last)
    a = ops._conv_args((1, 1), 2, 0, 1, 1)
    p = ops._backward_weights_problem(x, gy, (8, 4, 1, 1), *a, False)
    bad = [r for r in onednn.cached_plan(p, "backward_weights", "direct", "strict", p.layout, None).implementations
           if r.known_bad]
    if not bad:
        pytest.skip("no implementation rawconv.known_bad lists for the #6035 problem is offered on this CPU")
    with pytest.raises(KnownBadError, match="6035"):
        ops.conv_backward_weights(x, gy, (8, 4, 1, 1), stride=2, choice=f"{bad[0].name}@{bad[0].layouts}")
    with pytest.raises(ArgumentError, match="allow_known_bad"):
        onednn.backward_weights(x.requires_grad_(), gy, (8, 4, 1, 1), stride=2, allow_known_bad=True)


# ---------------------------------------------------------------------------- torch.func and forward-mode AD
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_torch_func_grad_jvp_and_per_sample_grads_match_float64(case):
    """torch.func.grad/vjp/jacrev raised InternalError ('an autograd.Function ... must override the
    setup_context staticmethod'); torch.func.jvp returned a zero tangent and forward_ad a None one
    (silently wrong derivatives). The operators' autograd Functions now have setup_context, jvp and
    a vmap rule, applied from Python under a transform."""
    x, w, b, kw = _tensors(case, requires_grad=False)
    p = _problem(x, w, b, kw)
    x64, w64, b64 = (t.double() if t is not None else None for t in (x, w, b))
    g = torch.Generator().manual_seed(1)
    tx, tw = torch.randn(x.shape, generator=g), torch.randn(w.shape, generator=g)

    def loss(ww, xx):
        return ops.conv(xx, ww, b, **kw).square().sum()

    def loss64(ww, xx):
        return _fconv(xx, ww, b64, p).square().sum()

    _close(torch.func.grad(loss)(w, x), torch.func.grad(loss64)(w64, x64), 1e-5, "grad dw")
    _close(torch.func.grad(loss, argnums=1)(w, x), torch.func.grad(loss64, argnums=1)(w64, x64), 1e-5, "grad dx")
    _, t = torch.func.jvp(lambda xx, ww: ops.conv(xx, ww, b, **kw), (x, w), (tx, tw))
    _, t64 = torch.func.jvp(lambda xx, ww: _fconv(xx, ww, b64, p), (x64, w64), (tx.double(), tw.double()))
    _close(t, t64, 1e-5, "jvp")
    with torch.autograd.forward_ad.dual_level():
        fwd = torch.autograd.forward_ad
        y = ops.conv(fwd.make_dual(x, tx), w, b, **kw)
        tan = fwd.unpack_dual(y).tangent
        tan_fn = fwd.unpack_dual(onednn.forward(fwd.make_dual(x, tx), w, b, **kw)).tangent
    want = torch.func.jvp(lambda xx: _fconv(xx, w64, None, p), (x64,), (tx.double(),))[1]
    _close(tan, want, 1e-5, "forward_ad")
    _close(tan_fn, want, 1e-5, "forward_ad through rawconv.onednn.forward")
    if not p.unbatched:   # per-sample gradients: vmap over grad, one sample at a time
        per = torch.func.vmap(torch.func.grad(lambda ww, xx: loss(ww, xx[None])), in_dims=(None, 0))(w, x)
        for i in range(x.shape[0]):
            _close(per[i], torch.func.grad(loss64)(w64, x64[i:i + 1]), 1e-5, f"per-sample grad {i}")


def test_torch_func_hessian_jacfwd_and_the_backward_operators_jvp():
    torch.manual_seed(3)
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 2, 2)
    h = torch.func.hessian(lambda ww: ops.conv(x, ww, padding=1).square().sum())(w)
    h64 = torch.autograd.functional.hessian(lambda ww: F.conv2d(x.double(), ww, padding=1).square().sum(), w.double())
    _close(h, h64, 1e-5, "hessian")
    jf = torch.func.jacfwd(lambda xx: ops.conv(xx, w, padding=1))(x)
    jr = torch.func.jacrev(lambda xx: ops.conv(xx, w, padding=1))(x)
    _close(jf, jr.double(), 1e-6, "jacfwd vs jacrev")
    gy, tgy, tw, tx = (torch.randn(1, 3, 6, 6), torch.randn(1, 3, 6, 6), torch.randn_like(w), torch.randn_like(x))
    _, t = torch.func.jvp(lambda g, ww: ops.conv_backward_data(g, ww, x.shape, padding=1), (gy, w), (tgy, tw))
    _, t64 = torch.func.jvp(lambda g, ww: F.conv_transpose2d(g, ww, padding=1), (gy.double(), w.double()),
                            (tgy.double(), tw.double()))
    _close(t, t64, 1e-5, "jvp of conv_backward_data")

    def dw64(xx, g):
        ww = torch.zeros(w.shape, dtype=torch.float64, requires_grad=True)
        return torch.autograd.grad(F.conv2d(xx, ww, padding=1), ww, g, create_graph=True)[0]
    (_, (tdw, tdb)) = torch.func.jvp(lambda xx, g: ops.conv_backward_weights(xx, g, w.shape, padding=1, bias=True),
                                     (x, gy), (tx, tgy))
    _close(tdw, torch.func.jvp(dw64, (x.double(), gy.double()), (tx.double(), tgy.double()))[1], 1e-5,
           "jvp of conv_backward_weights")
    _close(tdb, tgy.double().sum((0, 2, 3)), 1e-6, "jvp of db")
    for bc in (None, ("x64:gemm:jit@any", "x64:gemm:jit@any")):
        xt, wt = torch.randn(2, 3, 4, 4), torch.randn(3, 2, 3, 3)
        _, t = torch.func.jvp(lambda a, c: ops.conv_transpose(a, c, None, 2, 1, 1, backward_choice=bc), (xt, wt),
                              (torch.ones_like(xt), torch.ones_like(wt)))
        _, t64 = torch.func.jvp(lambda a, c: F.conv_transpose2d(a, c, None, 2, 1, 1), (xt.double(), wt.double()),
                                (torch.ones_like(xt).double(), torch.ones_like(wt).double()))
        _close(t, t64, 1e-5, f"jvp of conv_transpose {bc}")
        g = torch.func.grad(lambda c: ops.conv_transpose(xt, c, None, 2, 1, 1, backward_choice=bc).square().sum())(wt)
        g64 = torch.func.grad(lambda c: F.conv_transpose2d(xt.double(), c, None, 2, 1, 1).square().sum())(wt.double())
        _close(g, g64, 1e-5, f"grad of conv_transpose {bc}")


def test_vmap_of_the_function_forms_and_modules_runs_each_sample():
    """vmap over rawconv.onednn.forward raised InternalError ('Cannot access data pointer of Tensor
    that doesn't have storage'), as did a frozen or fused module's eager inference path."""
    import rawconv.fused as fu
    import rawconv.nn as rnn

    torch.manual_seed(4)
    x, w, b = torch.randn(3, 1, 3, 6, 6), torch.randn(4, 3, 3, 3), torch.randn(4)
    want = F.conv2d(x[:, 0].double(), w.double(), b.double(), padding=1)[:, None]
    _close(torch.func.vmap(lambda xx: onednn.forward(xx, w, b, padding=1))(x), want, 1e-5, "onednn.forward")
    seq = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU()).eval()
    with torch.no_grad():
        seq[0].weight.copy_(w)
        seq[0].bias.copy_(b)
        frozen = rnn.convert(seq, fuse=True)
        _close(torch.func.vmap(frozen)(x), torch.relu(want), 1e-5, "frozen module")
        _close(torch.func.vmap(lambda xx: fu.conv_bias_act(xx, w, b, padding=1))(x), torch.relu(want), 1e-5,
               "conv_bias_act")
