"""ConvProblem: shapes, padding, benchdnn strings and validation, against torch itself."""
from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import rawconv.problem
from rawconv import ArgumentError, ArgumentTypeError, ConvProblem
from rawconv.problem import compare_to_reference, abs_reference, layout_of

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


@st.composite
def problems(draw):
    nd = draw(st.integers(1, 3))
    groups = draw(st.sampled_from([1, 2, 3]))
    c = groups * draw(st.integers(1, 3))
    k = groups * draw(st.integers(1, 3))
    kernel = tuple(draw(st.integers(1, 4)) for _ in range(nd))
    dil = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    pad = tuple(draw(st.integers(0, 3)) for _ in range(nd))
    size = tuple(max(draw(st.integers(1, 9)), d * (kk - 1) + 1 - 2 * p) for kk, d, p in zip(kernel, dil, pad))
    n = draw(st.integers(1, 3))
    return nd, n, c, k, groups, kernel, dil, stride, pad, size


@settings(max_examples=150, deadline=None)
@given(problems())
def test_output_shape_matches_torch(args):
    nd, n, c, k, g, kernel, dil, stride, pad, size = args
    x = torch.empty((n, c) + size, device="meta")
    w = torch.empty((k, c // g) + kernel, device="meta")
    p = ConvProblem.from_torch(x, w, None, stride, pad, dil, g)
    y = CONV[nd](x, w, None, stride, pad, dil, g)
    assert p.y_shape == tuple(y.shape)
    assert p.w_shape == tuple(w.shape)


@settings(max_examples=60, deadline=None)
@given(problems())
def test_benchdnn_round_trip(args):
    nd, n, c, k, g, kernel, dil, stride, pad, size = args
    p = ConvProblem(n=n, c=c, k=k, in_spatial=size, kernel=kernel, stride=stride, dilation=dil,
                    pad_before=pad, pad_after=pad, groups=g)
    q = ConvProblem.from_benchdnn(p.to_benchdnn())
    assert (q.n, q.c, q.k, q.groups, q.in_spatial, q.kernel, q.stride, q.dilation) == \
        (p.n, p.c, p.k, p.groups, p.in_spatial, p.kernel, p.stride, p.dilation)
    assert q.pad_before == p.pad_before
    assert q.out_spatial == p.out_spatial


def test_benchdnn_example():
    p = ConvProblem.from_benchdnn("mb8ic64ih56oc64oh56kh3ph1")
    assert p.x_shape == (8, 64, 56, 56) and p.w_shape == (64, 64, 3, 3)
    assert p.y_shape == (8, 64, 56, 56) and p.pad_before == (1, 1) == p.pad_after
    q = ConvProblem.from_benchdnn("g32mb2ic32iw100oc32ow50kw3sw2pw1dw1_nmyconv")
    assert q.ndim == 1 and q.groups == 32 and q.dilation == (2,) and q.name == "myconv"
    assert q.y_shape == (2, 32, 50)
    r = ConvProblem.from_benchdnn("mb1ic4id8ih8iw8oc8kd3kh3kw3pd1ph1pw1")
    assert r.ndim == 3 and r.y_shape == (1, 8, 8, 8, 8)


@pytest.mark.parametrize("bad", ["", "mb8", "mb8ic64ih56oc64oh56kh3ph1zz9", "ic64xx3oc3", "hello"])
def test_benchdnn_rejects_garbage(bad):
    with pytest.raises(ArgumentError):
        ConvProblem.from_benchdnn(bad)


def test_same_padding_follows_torch():
    x = torch.randn(2, 3, 9, 10, dtype=torch.float64)
    w = torch.randn(4, 3, 4, 3, dtype=torch.float64)
    p = ConvProblem.from_torch(x, w, padding="same", dilation=(2, 1))
    assert p.pad_before == (3, 1) and p.pad_after == (3, 1)
    w2 = torch.randn(4, 3, 2, 4, dtype=torch.float64)
    p2 = ConvProblem.from_torch(x, w2, padding="same")
    with warnings.catch_warnings():   # torch: an even kernel needs a zero-padded copy (what we compare with)
        warnings.filterwarnings("ignore", message=r".*padding='same' with even kernel", category=UserWarning)
        want = F.conv2d(x, w2, padding="same")
    torch.testing.assert_close(p2.reference(x, w2), want, rtol=0, atol=1e-12)
    assert p2.pad_before == (0, 1) and p2.pad_after == (1, 2)


def test_asymmetric_reference_equals_padded_torch():
    x = torch.randn(1, 1, 32, 64, dtype=torch.float64)
    w = torch.randn(1, 1, 2, 4, dtype=torch.float64)
    p = ConvProblem.from_torch(x, w, stride=(2, 1), padding=((0, 0), (1, 2)))
    ref = F.conv2d(F.pad(x, (1, 2, 0, 0)), w, stride=(2, 1))
    assert p.y_shape == tuple(ref.shape)
    torch.testing.assert_close(p.reference(x, w), ref, rtol=0, atol=0)


def test_unbatched_and_layouts():
    x = torch.randn(3, 8, 8)
    w = torch.randn(4, 3, 3, 3)
    p = ConvProblem.from_torch(x, w)
    assert p.unbatched and p.x_shape == (1, 3, 8, 8)
    xc = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    assert layout_of(xc) == "nhwc" and ConvProblem.from_torch(xc, w).layout == "nhwc"
    assert ConvProblem.from_torch(xc.contiguous(), w).layout == "nchw"


@pytest.mark.parametrize("make, exc, words", [
    (lambda: (torch.randn(2, 4, 8, 8), torch.randn(6, 2, 3, 3), {"groups": 3}), ArgumentError, "groups=3"),
    (lambda: (torch.randn(2, 4, 8, 8), torch.randn(6, 3, 3, 3), {}), ArgumentError, "input channels"),
    (lambda: (torch.randn(2, 4), torch.randn(6, 4, 3, 3), {}), ArgumentError, "must be 4-D"),
    (lambda: (torch.randn(2, 4, 2, 2), torch.randn(6, 4, 3, 3), {}), ArgumentError, "smaller than the dilated kernel"),
    (lambda: (torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3).double(), {}), ArgumentError, "same dtype"),
    (lambda: (torch.ones(2, 4, 8, 8, dtype=torch.int32), torch.ones(6, 4, 3, 3, dtype=torch.int32), {}),
     ArgumentError, "dtype"),
    (lambda: (torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3), {"stride": 0}), ArgumentError, "stride"),
    (lambda: (torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3), {"padding": "full"}), ArgumentError, "padding"),
    (lambda: (torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3), {"padding": "same", "stride": 2}),
     ArgumentError, "strided"),
    (lambda: (torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3), {"padding": ((1, 2),)}), ArgumentError, "pair"),
    (lambda: (torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3), {"bias": torch.randn(5)}), ArgumentError, "bias"),
    (lambda: ([1.0], torch.randn(6, 4, 3, 3), {}), ArgumentTypeError, "torch.Tensor"),
    (lambda: (torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3), {"groups": 0}), ArgumentError, "groups"),
    (lambda: (torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3), {"dilation": (1, 2, 3)}), ArgumentError, "dilation"),
])
def test_bad_input_is_rejected(make, exc, words):
    x, w, kw = make()
    bias = kw.pop("bias", None)
    with pytest.raises(exc, match=words):
        ConvProblem.from_torch(x, w, bias, **kw)


def test_error_stats_catch_wrong_and_nan():
    x = torch.randn(2, 4, 8, 8)
    w = torch.randn(6, 4, 3, 3)
    p = ConvProblem.from_torch(x, w)
    ref, ra = p.reference(x, w), abs_reference(p, x, w)
    good = F.conv2d(x, w)
    assert compare_to_reference(p, good, ref, ra).ok
    bad = good.clone()
    bad[0, 0, 0, 0] += 1e-3 * ra[0, 0, 0, 0].item()
    assert not compare_to_reference(p, bad, ref, ra).ok
    nan = good.clone()
    nan[1, 2, 3, 4] = float("nan")
    st_ = compare_to_reference(p, nan, ref, ra)
    assert st_.nan == 1 and not st_.ok


def test_make_inputs_on_device_draws_the_same_distributions_where_the_tensors_live():
    """on_device=True (autotune's examples): drawn by a generator of the target device, so no host
    float64 draw; shapes, dtype, layout and the weights' 1/sqrt(reduction) scale as the CPU draw,
    repeatable per seed."""
    import math

    p = ConvProblem.from_benchdnn("mb4ic16ih20oc32oh20kh3ph1", layout="nhwc", has_bias=True)
    x, w, b = p.make_inputs(seed=3, on_device=True)
    x0, w0, b0 = p.make_inputs(seed=3)
    for a, ref in ((x, x0), (w, w0), (b, b0)):
        assert a.shape == ref.shape and a.dtype == ref.dtype and a.device == ref.device
    assert x.stride() == x0.stride(), "memory in the problem's layout"
    assert not torch.equal(x, x0), "another generator: other values"
    x2, w2, b2 = p.make_inputs(seed=3, on_device=True)
    assert torch.equal(x, x2) and torch.equal(w, w2) and torch.equal(b, b2)
    assert not torch.equal(p.make_inputs(seed=4, on_device=True)[0], x)
    assert abs(x.double().std().item() - 1.0) < 0.05
    want = 1 / math.sqrt(p.reduction_length)
    assert abs(w.double().std().item() / want - 1.0) < 0.1
    h = ConvProblem.from_benchdnn("mb2ic4ih8oc4oh8kh1", dtype="float64")
    assert h.make_inputs(on_device=True)[0].dtype == torch.float64


@pytest.mark.parametrize("desc,layout,dtype", [
    ("mb2ic3iw9oc4ow9kw3pw1", "nchw", "float32"), ("mb2ic3iw9oc4ow9kw3pw1", "nhwc", "bfloat16"),
    ("mb2ic4id5ih6iw7oc8kd3kh1kw1g2", "nhwc", "float64"), ("mb2ic4id5ih6iw7oc8kd3kh1kw1g2", "nchw", "float16")])
def test_make_inputs_on_device_matches_the_host_draw_in_shape_dtype_and_layout_1d_3d(desc, layout, dtype):
    """1-D and 3-D problems, every dtype, both layouts, grouped: the device draw gives the host
    draw's shapes, dtypes and strides; a seed near 2**64 wraps (w, b use seed + 1, + 2) instead of
    overflowing torch's manual_seed."""
    p = ConvProblem.from_benchdnn(desc, layout=layout, dtype=dtype, has_bias=True)
    for seed in (0, -5, 2 ** 64 - 1):
        got, want = p.make_inputs(seed=seed, on_device=True), p.make_inputs(seed=seed)
        for a, ref in zip(got, want):
            assert a.shape == ref.shape and a.dtype == ref.dtype and a.stride() == ref.stride()
            assert torch.isfinite(a.double()).all()
    w_wrap = p.make_inputs(seed=2 ** 64 - 1, on_device=True)[1]
    x_zero = rawconv.problem.random_tensor(p.w_shape, 0, "cpu", p.torch_dtype,
                                           scale=1 / math.sqrt(p.reduction_length))
    assert torch.equal(w_wrap, x_zero), "seed 2**64 - 1 + 1 wraps to 0"
    assert rawconv.problem.seed_offset(2 ** 64 - 2, 3) == 1 and rawconv.problem.seed_offset(-5, 3) == -2


def test_make_inputs_unbatched_and_meta_on_device():
    """An unbatched problem draws its (1, C, ...) x as the host path does; on the meta device
    (no generator there) the tensors come uninitialized in the right shapes and layout, as
    the host path's .to('meta') gives."""
    p = ConvProblem(n=1, c=3, k=4, in_spatial=(6, 6), kernel=(3, 3), unbatched=True, layout="nhwc")
    x, w, _ = p.make_inputs(on_device=True)
    x0, w0, _ = p.make_inputs()
    assert x.shape == x0.shape == (1, 3, 6, 6) and x.stride() == x0.stride()
    for on in (True, False):
        xm, wm, _ = p.make_inputs(device="meta", on_device=on)
        assert xm.is_meta and wm.is_meta and xm.shape == x0.shape and xm.stride() == x0.stride()


def test_make_inputs_on_a_cuda_device_too_small_raises_before_drawing(monkeypatch):
    """An on_device CUDA draw larger than the GPU's memory is an AllocationError before any
    generator or tensor is made (torch.cuda faked: this machine may have no GPU)."""
    import types

    from rawconv.errors import AllocationError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=2 ** 30))

    def boom(*a, **k):
        raise AssertionError("drew before checking the memory")
    monkeypatch.setattr(torch, "Generator", boom)
    p = ConvProblem(n=64, c=64, k=64, in_spatial=(128, 128), kernel=(3, 3))   # x: 256 MiB f32 -> 512 MiB drawn
    with pytest.raises(AllocationError, match="GPU memory"):
        p.with_(n=256).make_inputs(device="cuda:0", on_device=True)
    with pytest.raises(AllocationError, match="GPU memory"):
        rawconv.problem.random_tensor((2 ** 28,), 0, "cuda", torch.float32)
