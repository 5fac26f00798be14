"""oneDNN backend: every result is checked against a float64 reference (torch on upcast inputs)."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import rawconv
from rawconv import ArgumentError, ArgumentTypeError, ConvProblem, LibraryError, NotSupportedError, onednn
from rawconv.problem import abs_reference, compare_to_reference, to_layout

pytestmark = pytest.mark.usefixtures("dnnl")

COMPUTE = {"bf16": "bfloat16", "f16": "float16", "tf32": "tf32", "strict": None}


def check(p: ConvProblem, y, x, w, b=None, fpmath="strict"):
    ref = p.reference(x, w, b)
    stats = compare_to_reference(p, y, ref, abs_reference(p, x, w, b), compute=COMPUTE[fpmath])
    assert stats.ok, f"{p}: {stats}"
    return stats


def args_of(p: ConvProblem):
    return dict(stride=p.stride, padding=list(zip(p.pad_before, p.pad_after)), dilation=p.dilation, groups=p.groups)


GRID = [
    # name, x shape, w shape, kwargs
    ("1d", (2, 8, 33), (6, 8, 5), dict(stride=2, padding=2)),
    ("1d-dil-asym", (2, 8, 20), (16, 8, 3), dict(stride=2, dilation=2, padding=[(1, 2)])),
    ("2d", (2, 16, 15, 17), (8, 16, 3, 3), dict(padding=1)),
    ("2d-stride-dil", (2, 16, 21, 19), (24, 16, 3, 2), dict(stride=(2, 3), dilation=(2, 1), padding=(2, 0))),
    ("2d-groups", (2, 12, 10, 10), (18, 4, 3, 3), dict(groups=3, padding=1)),
    ("2d-depthwise", (2, 16, 12, 12), (16, 1, 3, 3), dict(groups=16, padding=1)),
    ("2d-depthwise-mult", (1, 8, 9, 9), (16, 1, 5, 5), dict(groups=8, padding=2, stride=2)),
    ("2d-same", (2, 8, 11, 12), (8, 8, 4, 3), dict(padding="same")),
    ("2d-valid", (2, 8, 11, 12), (8, 8, 4, 3), dict(padding="valid")),
    ("2d-asym", (1, 4, 16, 20), (8, 4, 3, 3), dict(padding=[(0, 2), (1, 0)], stride=2)),
    ("2d-1x1", (2, 64, 14, 14), (32, 64, 1, 1), dict()),
    ("2d-first-layer", (2, 3, 32, 32), (16, 3, 7, 7), dict(stride=2, padding=3)),
    ("3d", (2, 4, 6, 7, 8), (8, 4, 3, 3, 3), dict(padding=1)),
    ("3d-stride-groups", (1, 8, 7, 8, 9), (8, 4, 2, 3, 3), dict(stride=(1, 2, 2), groups=2)),
]


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("name, xs, ws, kw", GRID, ids=[g[0] for g in GRID])
def test_forward_default_f32(name, xs, ws, kw, layout, bias):
    g = torch.Generator().manual_seed(hash(name) % 1000)
    x = to_layout(torch.randn(xs, generator=g), layout)
    w = torch.randn(ws, generator=g) / (ws[1] * ws[2]) ** 0.5
    b = torch.randn(ws[0], generator=g) if bias else None
    p = ConvProblem.from_torch(x, w, b, **kw)
    y = onednn.forward(x, w, b, **kw)
    assert y.shape == p.y_shape
    if layout == "nhwc":
        assert y.is_contiguous(memory_format={3: torch.contiguous_format, 4: torch.channels_last,
                                              5: torch.channels_last_3d}[y.dim()]) or y.dim() == 3
    check(p, y, x, w, b)
    if p.symmetric and not isinstance(kw.get("padding"), list):
        torch.testing.assert_close(y, {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[p.ndim](x, w, b, **kw),
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name, xs, ws, kw", [g for g in GRID if g[0] in ("2d", "2d-groups", "1d", "3d", "2d-1x1")],
                         ids=lambda v: v if isinstance(v, str) else None)
def test_forward_bf16(name, xs, ws, kw, requires_onednn):
    requires_onednn("forward", "bfloat16")
    x = torch.randn(xs).bfloat16()
    w = (torch.randn(ws) / (ws[1] * ws[2]) ** 0.5).bfloat16()
    b = torch.randn(ws[0]).bfloat16()
    p = ConvProblem.from_torch(x, w, b, **kw)
    y = onednn.forward(x, w, b, **kw)
    assert y.dtype == torch.bfloat16
    check(p, y, x, w, b)


def test_forward_f16_works_exactly_where_capabilities_say():
    x = torch.randn(2, 8, 10, 10).half()
    w = torch.randn(8, 8, 3, 3).half()
    p = ConvProblem.from_torch(x, w, padding=1)
    row = onednn.capabilities().row("forward", "float16")
    if not row.implementations and not row.reference:   # nothing at all, e.g. every CPU without AVX-512 FP16
        with pytest.raises(NotSupportedError) as ei:
            onednn.forward(x, w, padding=1)
        assert ei.value.status_name == "dnnl_unimplemented" and "capabilities()" in str(ei.value)
        return
    check(p, onednn.forward(x, w, padding=1), x, w)


def test_fpmath_bf16_on_f32_is_within_bf16_tolerance():
    x = torch.randn(2, 32, 14, 14)
    w = torch.randn(32, 32, 3, 3) / 17
    p = ConvProblem.from_torch(x, w, padding=1)
    y = onednn.forward(x, w, padding=1, fpmath="bf16")
    check(p, y, x, w, fpmath="bf16")
    # and strict fpmath is held to the much tighter f32 bound
    check(p, onednn.forward(x, w, padding=1), x, w)


REPRESENTATIVE = [
    ("2d-f32", (2, 32, 14, 14), (32, 32, 3, 3), dict(padding=1), torch.float32, "nchw"),
    ("2d-f32-nhwc", (2, 32, 14, 14), (48, 32, 3, 3), dict(padding=1, stride=2), torch.float32, "nhwc"),
    ("2d-1x1-nhwc", (2, 64, 7, 7), (32, 64, 1, 1), dict(), torch.float32, "nhwc"),
    ("2d-depthwise", (2, 32, 10, 10), (32, 1, 3, 3), dict(groups=32, padding=1), torch.float32, "nchw"),
    ("2d-bf16", (2, 32, 12, 12), (32, 32, 3, 3), dict(padding=1), torch.bfloat16, "nhwc"),
    ("1d-f32", (2, 16, 40), (16, 16, 5), dict(padding=2, dilation=2), torch.float32, "nchw"),
    ("3d-f32", (1, 16, 6, 6, 6), (16, 16, 3, 3, 3), dict(padding=1), torch.float32, "nchw"),
]


@pytest.mark.parametrize("name, xs, ws, kw, dtype, layout", REPRESENTATIVE, ids=[r[0] for r in REPRESENTATIVE])
def test_every_listed_implementation(name, xs, ws, kw, dtype, layout, requires_onednn):
    requires_onednn("forward", dtype)
    x = to_layout(torch.randn(xs).to(dtype), layout)
    w = (torch.randn(ws) / (ws[1] * ws[2]) ** 0.5).to(dtype)
    b = torch.randn(ws[0]).to(dtype)
    p = ConvProblem.from_torch(x, w, b, **kw)
    impls = onednn.implementations(x, w, b, **kw)
    assert impls, "oneDNN listed nothing"
    assert [i.index for i in impls] == list(range(len(impls)))
    assert any(i.name.startswith("ref") for i in impls)
    for impl in impls:   # none skipped: every listed implementation runs and is checked
        y = onednn.forward(x, w, b, **kw, impl=impl.index)
        check(p, y, x, w, b)
        y2 = onednn.forward(x, w, b, **kw, impl=impl)
        assert torch.equal(y, y2)


def test_force_by_name_and_errors():
    x = torch.randn(2, 16, 12, 12)
    w = torch.randn(16, 16, 3, 3)
    impls = onednn.implementations(x, w, padding=1)
    names = [i.name for i in impls]
    name = names[0]
    plan = onednn.Convolution(x, w, padding=1, impl=name)
    assert plan.selected.name == name
    assert plan.select("ref:any@user").layouts == "user"
    with pytest.raises(NotSupportedError) as ei:
        onednn.forward(x, w, padding=1, impl="nonexistent:avx9000")
    msg = str(ei.value)
    assert "nonexistent:avx9000" in msg and "offered" in msg
    assert all(n in msg for n in set(names))
    assert set(ei.value.offered) == set(names)
    with pytest.raises(NotSupportedError, match="out of range"):
        onednn.forward(x, w, padding=1, impl=len(impls))
    with pytest.raises(ArgumentError):
        onednn.forward(x, w, padding=1, impl=1.5)


def test_implementation_list_is_stable_and_unique():
    x = torch.randn(2, 64, 20, 20)
    w = torch.randn(64, 64, 3, 3)
    onednn.clear_cache()
    first = onednn.implementations(x, w, padding=1)
    onednn.forward(x, w, padding=1)  # now oneDNN's primitive cache holds primitives of the problem
    onednn.clear_cache()
    second = onednn.implementations(x, w, padding=1)
    key = lambda rows: [(r.name, r.layouts, tuple(r.formats.items())) for r in rows]  # noqa: E731
    assert key(first) == key(second)
    assert len(set(key(first))) == len(first)


def test_plan_autotune_execute_prepack_and_free():
    x = torch.randn(4, 32, 16, 16).to(memory_format=torch.channels_last)
    w = torch.randn(32, 32, 3, 3) / 17
    b = torch.randn(32)
    p = ConvProblem.from_torch(x, w, b, padding=1)
    with onednn.Convolution(x, w, b, padding=1) as conv:
        rows = conv.autotune(iterations=3, warmup=1)
        assert rows == sorted(rows, key=lambda r: r.median_ms)
        assert conv.selected == rows[0].impl
        assert all(r.median_ms > 0 for r in rows)
        assert not any(r.impl.name.startswith("ref") for r in rows)
        y = conv.execute(x)
        check(p, y, x, w, b)
        # weights changed in place: the prepacked copy must be refreshed (version counter)
        w.mul_(-2.0)
        y2 = conv.execute(x)
        check(p, y2, x, w, b)
        out = torch.empty_like(y)
        assert conv.execute(x, out=out) is out
        with pytest.raises(ArgumentError, match="shape"):
            conv.execute(torch.randn(3, 32, 16, 16))
        with pytest.raises(ArgumentError, match="float32"):
            conv.execute(x.double())
    conv.free()  # idempotent
    with pytest.raises(ArgumentError, match="freed"):
        conv.execute(x)
    assert "freed" in repr(conv)


def test_plan_from_problem_and_strided_input():
    p = ConvProblem.from_benchdnn("mb2ic16ih10oc8oh10kh3ph1")
    conv = onednn.Convolution.from_problem(p)
    x, w, _ = p.make_inputs(seed=3)
    xs = torch.randn(2, 16, 10, 20)[..., ::2]   # non-dense strides get a copy, not an error
    check(p, conv.execute(xs, w), xs, w)
    check(p, conv.execute(x, w), x, w)


def test_unbatched_input():
    x = torch.randn(8, 9, 9)
    w = torch.randn(4, 8, 3, 3)
    y = onednn.forward(x, w, padding=1)
    assert y.shape == (4, 9, 9)
    torch.testing.assert_close(y, F.conv2d(x, w, padding=1), rtol=1e-4, atol=1e-4)


def _autograd(x, w, b, kw, gy):
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_() if b is not None else None
    conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[x.dim()]
    pad = kw.get("padding", 0)
    if isinstance(pad, list):
        padl = []
        for bf, af in reversed(pad):
            padl += [bf, af]
        kw = dict(kw, padding=0)
        y = conv(F.pad(x64, padl), w64, b64, **kw)
    else:
        y = conv(x64, w64, b64, **kw)
    y.backward(gy.double())
    return x64.grad, w64.grad, (b64.grad if b is not None else None)


BWD = [
    ("2d", (2, 16, 12, 12), (24, 16, 3, 3), dict(padding=1), "nchw"),
    ("2d-stride-dil", (2, 8, 15, 13), (8, 8, 3, 3), dict(stride=2, dilation=2, padding=2), "nhwc"),
    ("2d-groups", (2, 12, 9, 9), (12, 4, 3, 3), dict(groups=3, padding=1), "nchw"),
    ("2d-asym", (1, 4, 16, 20), (8, 4, 3, 3), dict(padding=[(0, 2), (1, 0)], stride=2), "nchw"),
    ("1d", (2, 8, 30), (8, 8, 5), dict(padding=2), "nchw"),
    ("3d", (1, 4, 6, 6, 6), (8, 4, 3, 3, 3), dict(padding=1), "nchw"),
]


def _grad_check(p, got, want, L):
    want = want.double()
    err = (got.double() - want).abs().max().item()
    scale = want.abs().max().item()
    assert err <= 1e-5 * scale + 1e-6 * L ** 0.5, f"{p}: max error {err} (scale {scale})"


@pytest.mark.parametrize("name, xs, ws, kw, layout", BWD, ids=[b[0] for b in BWD])
def test_backward_data_and_weights_vs_autograd(name, xs, ws, kw, layout):
    x = to_layout(torch.randn(xs), layout)
    w = torch.randn(ws) / 5
    b = torch.randn(ws[0])
    p = ConvProblem.from_torch(x, w, b, **kw)
    gy = to_layout(torch.randn(p.y_shape), layout)
    gx_ref, gw_ref, gb_ref = _autograd(x, w, b, kw, gy)
    # every implementation of both backward primitives
    impls_d = onednn.implementations(x, w, **kw, direction="backward_data")
    assert impls_d
    for impl in impls_d:
        gx = onednn.backward_data(gy, w, xs, **kw, impl=impl.index)
        assert gx.shape == xs
        _grad_check(p, gx, gx_ref, ws[0] * w[0, 0].numel())
    impls_w = onednn.implementations(x, w, b, **kw, direction="backward_weights")
    assert impls_w
    for impl in impls_w:
        gw, gb = onednn.backward_weights(x, gy, ws, **kw, bias=True, impl=impl.index)
        assert gw.shape == ws and gb.shape == (ws[0],)
        _grad_check(p, gw, gw_ref, p.n * p.y_shape[2])
        _grad_check(p, gb, gb_ref, p.n * p.y_shape[2])
    gw_only = onednn.backward_weights(x, gy, ws, **kw)
    _grad_check(p, gw_only, gw_ref, p.n * p.y_shape[2])


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("call, exc, words", [
    (lambda: onednn.forward(torch.randn(2, 4, 8, 8, device="meta"), torch.randn(4, 4, 3, 3, device="meta")),
     ArgumentError, "CPU tensors"),
    (lambda: onednn.forward(torch.randn(2, 4, 8, 8).double(), torch.randn(4, 4, 3, 3).double()),
     ArgumentError, "float64"),
    (lambda: onednn.forward(torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3), groups=3), ArgumentError, "groups"),
    (lambda: onednn.forward(torch.randn(2, 4, 8, 8), torch.randn(4, 2, 3, 3)), ArgumentError, "input channels"),
    (lambda: onednn.forward(torch.randn(2, 4, 8, 8), "w"), ArgumentTypeError, "torch.Tensor"),
    (lambda: onednn.forward(torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3), fpmath="fast"), ArgumentError, "fpmath"),
    (lambda: onednn.forward(torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3), algorithm="fft"), ArgumentError,
     "algorithm"),
    (lambda: onednn.forward(torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3), out=torch.empty(2, 4, 5, 5)),
     ArgumentError, "shape"),
    (lambda: onednn.forward(torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3), out=torch.empty(2, 4, 6, 6).double()),
     ArgumentError, "float32"),
    (lambda: onednn.backward_data(torch.randn(2, 4, 5, 5), torch.randn(4, 4, 3, 3), (2, 4, 8, 8)),
     ArgumentError, "grad_y must have shape"),
    (lambda: onednn.backward_weights(torch.randn(2, 4, 8, 8), torch.randn(2, 4, 6, 6), (4, 4, 3)),
     ArgumentError, "must be"),
    (lambda: onednn.backward_weights(torch.randn(2, 4, 8, 8), torch.randn(2, 4, 6, 6), "4x4x3x3"),
     ArgumentTypeError, "w_shape"),
])
def test_bad_input(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_winograd_not_offered_names_the_status():
    x = torch.randn(2, 16, 12, 12)
    w = torch.randn(16, 16, 3, 3)
    try:
        y = onednn.forward(x, w, padding=1, algorithm="winograd")
    except NotSupportedError as exc:   # oneDNN 3.2 removed f32 Winograd
        assert exc.function == "dnnl_convolution_forward_primitive_desc_create"
        assert exc.status_name == "dnnl_unimplemented" and "capabilities()" in str(exc)
        return
    check(ConvProblem.from_torch(x, w, padding=1), y, x, w)


def test_library_error_carries_status_function_and_hint():
    from rawconv.onednn import _ffi as _dnnl

    with pytest.raises(LibraryError) as ei:
        _dnnl.call("dnnl_memory_desc_create_with_tag", _dnnl.ffi.new("dnnl_memory_desc_t *"), 99,
                   [1] * 12, _dnnl.data_type("float32"), _dnnl.lib().dnnl_nchw)
    e = ei.value
    assert e.status_name == "dnnl_invalid_arguments" and e.function == "dnnl_memory_desc_create_with_tag"
    assert re.search(r"dnnl_memory_desc_create_with_tag failed: dnnl_invalid_arguments \(2\)", str(e))
    assert "ONEDNN_VERBOSE" in str(e)


def test_info():
    info = onednn.info()
    assert info["version"].startswith("3.") and len(info["commit"]) >= 8
    assert info["found_via"] and info["path"].endswith("libdnnl.so.3")
    assert info["cpu_isa"] and info["threads"] >= 1
    full = rawconv.info()
    assert full["onednn"]["version"] == info["version"] and full["torch"]["version"] == torch.__version__


def test_inputs_in_nchw_or_channels_last_are_used_in_place(monkeypatch):
    from rawconv import onednn as mod

    def no_copy(*a, **k):
        raise AssertionError("an input was copied although its strides fit")

    monkeypatch.setattr(mod, "_restride", no_copy)
    for fmt in (torch.contiguous_format, torch.channels_last):
        x = torch.randn(2, 8, 9, 9).contiguous(memory_format=fmt)
        w = torch.randn(8, 8, 3, 3).contiguous(memory_format=fmt)
        y = onednn.forward(x, w, padding=1)
        assert y.is_contiguous(memory_format=fmt)
        torch.testing.assert_close(y, F.conv2d(x, w, padding=1), rtol=1e-4, atol=1e-4)
