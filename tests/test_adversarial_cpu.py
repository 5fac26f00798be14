"""Adversarial tests of the CPU side (rawconv.onednn, ConvProblem, compare, the CLI).

The promise under test: bad input gets a clear rawconv exception (ArgumentError / ArgumentTypeError /
NotSupportedError / LibraryError) before any C call, never a crash or a raw Python/torch/cffi error;
every result matches a float64 reference.

The tests after the "defects" line cover defects a QA pass found; each is fixed and must stay fixed.
"""
from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rawconv import (ArgumentError, ArgumentTypeError, ConvProblem, NotSupportedError, RawconvError,
                     onednn)
from rawconv.problem import abs_reference, compare_to_reference, to_layout

pytestmark = pytest.mark.usefixtures("dnnl")

# what a caller may legitimately get for bad input
CLEAN = (ArgumentError, ArgumentTypeError, NotSupportedError)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _check_all_impls(x, w, b=None, **kw):
    """Every implementation oneDNN lists gives a result within the float64 tolerance."""
    p = ConvProblem.from_torch(x, w, b, **kw)
    ref, ra = p.reference(x, w, b), abs_reference(p, x, w, b)
    impls = onednn.implementations(x, w, b, **kw)
    assert impls
    for impl in impls:
        y = onednn.forward(x, w, b, impl=impl.index, **kw)
        assert tuple(y.shape) == tuple(ref.shape), f"{impl}"
        st = compare_to_reference(p, y, ref, ra)
        assert st.ok, f"{p}: {impl}: {st}"


# =============================================================================== correct today
WEIRD = [
    # channel multiplier (groups == C, K = 3*C), stride 2, asymmetric padding
    ("chan-mult", (1, 3, 10, 11), (9, 1, 3, 2), dict(groups=3, stride=2, padding=[(0, 2), (2, 0)])),
    ("1x1-s2", (2, 16, 9, 9), (8, 16, 1, 1), dict(stride=2)),
    ("1x1-s3-pad", (1, 8, 7, 7), (8, 8, 1, 1), dict(stride=3, padding=2)),
    ("dil+stride", (1, 4, 17, 15), (6, 4, 3, 3), dict(stride=2, dilation=3, padding=1)),
    ("pad>kernel-asym", (1, 2, 4, 4), (3, 2, 3, 1), dict(padding=[(7, 0), (0, 6)])),
    ("stride>input", (1, 3, 5, 5), (2, 3, 3, 3), dict(stride=10, padding=1)),
    ("kernel==padded", (1, 3, 3, 3), (2, 3, 5, 5), dict(padding=1)),
    ("big-dilation", (1, 2, 6, 6), (2, 2, 2, 2), dict(dilation=9, padding=5)),
    ("1d", (2, 5, 17), (4, 5, 4), dict(stride=3, padding=[(2, 1)], dilation=2)),
    ("3d-groups-asym", (1, 4, 5, 6, 7), (4, 2, 2, 3, 1), dict(groups=2, stride=(2, 1, 3),
                                                             padding=[(1, 0), (0, 1), (2, 2)])),
    ("same-even-dil", (1, 3, 8, 8), (4, 3, 4, 2), dict(padding="same", dilation=(1, 3))),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("name, xs, ws, kw", WEIRD, ids=[c[0] for c in WEIRD])
def test_weird_but_valid_forward_every_impl_matches_float64(name, xs, ws, kw, layout, dtype, requires_onednn):
    requires_onednn("forward", dtype)
    g = _gen(len(name))
    x = to_layout(torch.randn(xs, generator=g).to(dtype), layout)
    w = (torch.randn(ws, generator=g) / math.sqrt(ws[1] * math.prod(ws[2:]))).to(dtype)
    b = torch.randn(ws[0], generator=g).to(dtype)
    _check_all_impls(x, w, b, **kw)


def _strided_inputs():
    g = _gen(3)
    base = torch.randn(2, 3, 12, 12, generator=g)
    w = torch.randn(4, 3, 3, 3, generator=g)
    yield "sliced", base[:, :, ::2, 1::2], w
    yield "expanded-x", torch.randn(1, 3, 1, 1, generator=g).expand(2, 3, 6, 6), w
    yield "expanded-w", base, torch.randn(1, 3, 1, 1, generator=g).expand(4, 3, 3, 3)
    yield "permuted", torch.randn(2, 6, 6, 3, generator=g).permute(0, 3, 2, 1), \
        torch.randn(3, 3, 4, 3, generator=g).permute(2, 1, 0, 3)
    yield "odd-batch-stride", torch.randn(1, 3, 6, 6, generator=g).as_strided((1, 3, 6, 6), (999, 36, 6, 1)), w
    yield "cl-size1-dims", torch.randn(2, 4, 6, 1, generator=g).to(memory_format=torch.channels_last), \
        torch.randn(4, 4, 3, 1, generator=g).to(memory_format=torch.channels_last)
    yield "cl-weights-only", base, w.to(memory_format=torch.channels_last)
    yield "from-numpy", torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)), w
    buf = np.zeros(2 * 3 * 8 * 8 * 4 + 1, dtype=np.uint8)
    mis = torch.from_numpy(np.frombuffer(buf.data, dtype=np.float32, count=2 * 3 * 8 * 8, offset=1).reshape(2, 3, 8, 8))
    mis.copy_(torch.randn(2, 3, 8, 8, generator=g))
    yield "misaligned-numpy", mis, w
    yield "requires-grad", base.clone().requires_grad_(), w.clone().requires_grad_()


@pytest.mark.parametrize("name, x, w", list(_strided_inputs()), ids=[t[0] for t in _strided_inputs()])
def test_odd_strides_and_sources_give_torchs_result(name, x, w):
    y = onednn.forward(x, w, padding=1)
    want = F.conv2d(x.detach(), w.detach(), padding=1)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-4)


def test_unbatched_1d_2d_3d_match_torch():
    g = _gen(5)
    for conv, xs, ws in ((F.conv1d, (3, 9), (4, 3, 3)), (F.conv2d, (3, 8, 8), (4, 3, 3, 3)),
                         (F.conv3d, (3, 4, 5, 6), (4, 3, 3, 3, 3))):
        x, w, b = torch.randn(xs, generator=g), torch.randn(ws, generator=g), torch.randn(ws[0], generator=g)
        y = onednn.forward(x, w, b, padding=1)
        torch.testing.assert_close(y, conv(x, w, b, padding=1), rtol=1e-5, atol=1e-4)


def test_backward_passes_match_float64_autograd_every_impl():
    g = _gen(7)
    kw = dict(groups=2, stride=2, dilation=2, padding=(1, 2))
    x = torch.randn(2, 4, 11, 10, generator=g)
    w = torch.randn(6, 2, 3, 3, generator=g) / 4
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    b64 = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    y64 = F.conv2d(x64, w64, b64, **kw)
    gy = torch.randn(y64.shape, generator=g)
    gx_ref, gw_ref, gb_ref = torch.autograd.grad(y64, (x64, w64, b64), gy.double())
    for impl in onednn.implementations(x, w, **kw, direction="backward_data"):
        gx = onednn.backward_data(gy, w, x.shape, impl=impl.index, **kw)
        torch.testing.assert_close(gx.double(), gx_ref, rtol=1e-4, atol=1e-4, msg=str(impl))
    for impl in onednn.implementations(x, w, torch.zeros(6), **kw, direction="backward_weights"):
        gw, gb = onednn.backward_weights(x, gy, w.shape, impl=impl.index, bias=True, **kw)
        torch.testing.assert_close(gw.double(), gw_ref, rtol=1e-4, atol=1e-4, msg=str(impl))
        torch.testing.assert_close(gb.double(), gb_ref, rtol=1e-4, atol=1e-4, msg=str(impl))


def test_forward_from_four_threads_same_and_different_problems_stays_correct():
    g = _gen(11)
    probs = [((2, 8, 12, 12), (8, 8, 3, 3), dict(padding=1)),
             ((1, 4, 9, 9), (6, 2, 3, 3), dict(groups=2, stride=2)),
             ((2, 16, 7, 7), (16, 1, 3, 3), dict(groups=16, padding=1)),
             ((1, 3, 20, 20), (4, 3, 5, 5), dict(dilation=2, padding=3))]
    data = []
    for xs, ws, kw in probs:
        x, w = torch.randn(xs, generator=g), torch.randn(ws, generator=g)
        data.append((x, w, kw, F.conv2d(x, w, **kw)))
    errors = []

    def worker(tid):
        try:
            for it in range(40):
                i = 0 if it % 2 else (tid + it) % 4     # half on one shared problem, half mixed
                x, w, kw, ref = data[i]
                y = onednn.forward(x, w, **kw)
                if not torch.allclose(y, ref, rtol=1e-4, atol=1e-4):
                    errors.append((tid, it, i, float((y - ref).abs().max())))
        except Exception as exc:  # noqa: BLE001
            errors.append((tid, repr(exc)))

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[:5]


@pytest.mark.parametrize("kwargs, exc", [
    (dict(x=torch.randn(2, 3, 8, 8).int()), ArgumentError),
    (dict(x=torch.randn(2, 3, 8, 8, dtype=torch.complex64)), ArgumentError),
    (dict(x=torch.randn(2, 3, 8, 8).bool()), ArgumentError),
    (dict(x=torch.randn(2, 3, 8, 8).double(), w=torch.randn(4, 3, 3, 3).double()), ArgumentError),
    (dict(x=torch.randn(2, 3, 8, 8, device="meta")), ArgumentError),
    (dict(x=torch.randn(2, 3, 8, 8).to_sparse()), ArgumentError),
    (dict(x=torch.randn(2, 3, 8, 8).to_mkldnn()), ArgumentError),
    (dict(x=torch.randn(3)), ArgumentError),
    (dict(w=torch.randn(4, 3, 3, 3, 3, 3)), ArgumentError),
    (dict(w=torch.randn(4, 3, 0, 3)), ArgumentError),
    (dict(x=torch.randn(2, 3, 2, 2)), ArgumentError),                      # kernel larger than padded input
    (dict(b=torch.randn(4, 1)), ArgumentError),
    (dict(b=torch.randn(4, dtype=torch.float64)), ArgumentError),
    (dict(b=torch.randn(4, device="meta")), ArgumentError),
    (dict(kw=dict(padding=[(1, 1), (1, 1), (1, 1)])), ArgumentError),
    (dict(kw=dict(padding=[(1, -1), (1, 1)])), ArgumentError),
    (dict(kw=dict(padding=[(1, 1), (1, 1.5)])), ArgumentError),
    (dict(kw=dict(padding="SAME")), ArgumentError),
    (dict(kw=dict(padding=None)), ArgumentTypeError),
    (dict(kw=dict(padding="same", stride=2)), ArgumentError),
    (dict(kw=dict(stride=True)), ArgumentTypeError),
    (dict(kw=dict(stride=1.0)), ArgumentTypeError),
    (dict(kw=dict(stride=(1, -1))), ArgumentError),
    (dict(kw=dict(dilation=0)), ArgumentError),
    (dict(kw=dict(groups=-1)), ArgumentError),
    (dict(kw=dict(groups=True)), ArgumentError),
    (dict(kw=dict(groups=2)), ArgumentError),
    (dict(kw=dict(impl=-1)), NotSupportedError),
    (dict(kw=dict(impl=2 ** 100)), NotSupportedError),
    (dict(kw=dict(impl=True)), ArgumentError),
    (dict(kw=dict(impl="winograd:avx9")), NotSupportedError),
    (dict(kw=dict(fpmath="bogus")), ArgumentError),
    (dict(kw=dict(algorithm="fft")), ArgumentError),
    (dict(kw=dict(out=torch.empty(2, 4, 6, 12)[..., ::2])), ArgumentError),
    (dict(kw=dict(out=torch.empty(2, 4, 6, 6, dtype=torch.float16))), ArgumentError),
    (dict(kw=dict(out=torch.empty(2, 4, 6, 6, device="meta"))), ArgumentError),
    (dict(kw=dict(out=torch.empty(2, 4, 6, 1).expand(2, 4, 6, 6))), ArgumentError),
    (dict(kw=dict(out=[1])), ArgumentError),
])
def test_bad_forward_input_raises_a_clean_error(kwargs, exc):
    x = kwargs.get("x", torch.randn(2, 3, 8, 8))
    w = kwargs.get("w", torch.randn(4, 3, 3, 3))
    with pytest.raises(exc):
        onednn.forward(x, w, kwargs.get("b"), **kwargs.get("kw", {}))


def test_fast_path_still_validates_bias_and_rejects_a_bad_one_after_a_good_call():
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    onednn.forward(x, w, torch.randn(4))
    for bad in (torch.randn(4, dtype=torch.float64), torch.randn(4, device="meta"), torch.randn(5)):
        with pytest.raises(ArgumentError):
            onednn.forward(x, w, bad)


def test_plan_lifecycle_and_plan_argument_checks():
    x, w = torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3)
    conv = onednn.Convolution(x, w)
    torch.testing.assert_close(conv.execute(), F.conv2d(x, w))
    for kwargs in (dict(x=torch.randn(1, 2, 6, 6)), dict(x=x, w=w.double()), dict(x=x, bias=torch.randn(2)),
                   dict(x=np.zeros((1, 2, 5, 5), dtype=np.float32)), dict(x=x, out=torch.empty(1, 2, 3, 3).transpose(2, 3))):
        with pytest.raises(ArgumentError):
            conv.execute(**kwargs)
    conv.free()
    conv.free()                                        # idempotent
    assert "freed" in repr(conv)
    for call in (conv.execute, conv.autotune, lambda: conv.select(0), lambda: conv.implementations):
        with pytest.raises(ArgumentError):
            call()
    with onednn.Convolution(x, w) as c2:
        c2.execute()
    with pytest.raises(ArgumentError):
        c2.execute()


def test_plan_prepacked_weights_follow_in_place_updates():
    g = _gen(13)
    x, w = torch.randn(2, 16, 8, 8, generator=g), torch.randn(16, 16, 3, 3, generator=g)
    conv = onednn.Convolution(x, w, padding=1, impl=0)
    conv.execute()
    w.mul_(2)
    torch.testing.assert_close(conv.execute(), F.conv2d(x, w, padding=1), rtol=1e-5, atol=1e-4)
    with torch.no_grad():
        w.detach().add_(1)
    torch.testing.assert_close(conv.execute(), F.conv2d(x, w, padding=1), rtol=1e-5, atol=1e-4)
    w2 = w.clone()
    torch.testing.assert_close(conv.execute(x, w2), F.conv2d(x, w2, padding=1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("call", [
    lambda: onednn.backward_data(torch.randn(1, 2, 3, 3), torch.randn(2, 2, 3, 3), (1, 2, 6, 6)),
    lambda: onednn.backward_data(torch.randn(1, 2, 3, 3), torch.randn(2, 2, 3, 3), (1, 2, 5, 5, 5)),
    lambda: onednn.backward_data(torch.randn(1, 2, 3, 3), torch.randn(2, 2, 3, 3), torch.tensor([1, 2, 5, 5])),
    lambda: onednn.backward_data(torch.randn(1, 2, 3, 3).double(), torch.randn(2, 2, 3, 3).double(), (1, 2, 5, 5)),
    lambda: onednn.backward_data(torch.randn(1, 2, 3, 3), torch.randn(2, 2, 3, 3), (1, 2, 5, 5), out=torch.randn(1, 2, 3, 3)),
    lambda: onednn.backward_data(torch.randn(1, 2, 3, 3, device="meta"), torch.randn(2, 2, 3, 3), (1, 2, 5, 5)),
    lambda: onednn.backward_weights(torch.randn(1, 2, 5, 5), torch.randn(1, 2, 3, 3), (2, 2, -3, 3)),
    lambda: onednn.backward_weights(torch.randn(1, 2, 5, 5), torch.randn(1, 2, 4, 4), (2, 2, 3, 3)),
    lambda: onednn.backward_weights(torch.randn(1, 2, 5, 5), torch.randn(1, 2, 3, 3).double(), (2, 2, 3, 3)),
    lambda: onednn.backward_weights(torch.randn(1, 2, 5, 5), [torch.randn(1, 2, 3, 3)], (2, 2, 3, 3)),
    lambda: onednn.backward_weights(torch.randn(1, 2, 5, 5), torch.randn(1, 2, 3, 3), "2x2x3x3"),
])
def test_inconsistent_backward_arguments_raise_clean_errors(call):
    with pytest.raises(CLEAN):
        call()


@pytest.mark.parametrize("desc", ["ic3oc2", "ic3oc2ih5kh0", "ic3oc2ih5dh-1", "g3ic4oc3ih5", "   ", "",
                                  "mb2ic3oc2ih5n", "MB2IC3OC2IH5", "ic3oc2oh1kh3ph5", "ic3 oc2 ih5", "ic3oc2ih5xx1"])
def test_malformed_benchdnn_strings_raise_argument_error(desc):
    with pytest.raises(ArgumentError):
        ConvProblem.from_benchdnn(desc)


def test_benchdnn_round_trip_of_ordinary_problems():
    for p in (ConvProblem(n=3, c=4, k=4, in_spatial=(6, 7, 8), kernel=(3, 2, 1), stride=(1, 2, 1)),
              ConvProblem(n=3, c=4, k=4, in_spatial=(9,), kernel=(3,)),
              ConvProblem(n=1, c=4, k=4, in_spatial=(6, 7), kernel=(3, 3), groups=2, dilation=(2, 1), name="foo"),
              ConvProblem(n=1, c=1, k=1, in_spatial=(6, 6), kernel=(3, 3), stride=(2, 2), pad_before=(1, 1),
                          pad_after=(2, 2))):
        q = ConvProblem.from_benchdnn(p.to_benchdnn())
        assert q == p and q.name == p.name and q.out_spatial == p.out_spatial


def _cli(argv):
    from rawconv.cli import main

    try:
        return main(argv)
    except SystemExit as exc:      # argparse errors
        return exc.code


@pytest.mark.parametrize("argv", [
    ["list", "--input", "1x3x5x5", "--weight", "3x3x3x3", "--padding", "0:1"],
    ["list", "--input", "1x3x5x5", "--weight", "3x3x3x3", "--padding", "0:1:2,1:1"],
    ["list", "--input", "1x3x5x5", "--weight", "3x3x3x3", "--padding", "1,0:1"],
    ["list", "--input", "1x3x5x5", "--weight", "3x3x3x3", "--padding=-1"],
    ["list", "--input", "1x3x5x5", "--weight", "3x3x3x3", "--padding", "x"],
    ["list", "--input", "1x3x5x5", "--weight", "3x3x3x3", "--stride", "0"],
    ["list", "--input", "1x3x5x5", "--weight", "3x3x3x3", "--groups", "0"],
    ["list", "--input", "1x3x5x5x", "--weight", "3x3x3x3"],
    ["list", "--input", "1x3x5x5"],
    ["list", "--input", "1x3x5x5", "--weight", "0x3x3x3"],   # K=0 (C=0 is a problem now: y is the bias, as in torch)
    ["list", "--input", "1x3x5x5", "--weight", "3x3x3x3", "--device", "meta"],
    ["list", "resnet50", "--batch", "-1", "--layers", "0"],
    ["list", "resnet50", "--layers", "nope"],
    ["list", "ic3oc3"],
])
def test_cli_malformed_arguments_exit_2_without_traceback(argv, capsys):
    assert _cli(argv) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_cli_zero_batch_compare_runs(capsys):
    assert _cli(["compare", "--input", "0x3x5x5", "--weight", "3x3x3x3", "--iterations", "1", "--device", "cpu",
                 "--no-ref", "--random"]) == 0


# =============================================================================== defects (fixed)
# ---- wrong numerical results ------------------------------------------------------------------
def test_out_aliasing_input_is_rejected_or_correct():
    g = _gen(17)
    x, w = torch.randn(1, 4, 6, 6, generator=g), torch.randn(4, 4, 3, 3, generator=g)
    want = F.conv2d(x, w, padding=1)
    for impl in onednn.implementations(x, w, padding=1):
        xx = x.clone()
        try:
            y = onednn.forward(xx, w, padding=1, impl=impl.index, out=xx)
        except ArgumentError:
            continue
        torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4, msg=str(impl))


def test_backward_weights_bias_of_empty_input_with_nonempty_output():
    g = _gen(19)
    x = torch.randn(1, 1, 0, 5)
    gy = torch.randn(1, 3, 2, 7, generator=g)          # F.conv2d(x, w(3,1,1,1), padding=1) shape
    gw, gb = onednn.backward_weights(x, gy, (3, 1, 1, 1), padding=1, bias=True)
    assert torch.equal(gw, torch.zeros(3, 1, 1, 1))
    torch.testing.assert_close(gb, gy.sum((0, 2, 3)))


def test_negative_bit_views_are_resolved():
    z = torch.randn(1, 1, 1, 1, dtype=torch.complex64, generator=_gen(23))
    x = z.conj().imag                          # public API; is_neg() is True
    assert x.is_neg()
    w = torch.ones(1, 1, 1, 1)
    torch.testing.assert_close(onednn.forward(x, w), F.conv2d(x.resolve_neg(), w))
    xb, wb = torch.randn(1, 2, 5, 5, generator=_gen(1)), torch._neg_view(torch.randn(2, 2, 3, 3, generator=_gen(2)))
    torch.testing.assert_close(onednn.forward(xb, wb), F.conv2d(xb, wb.resolve_neg()), rtol=1e-5, atol=1e-4)


def test_plan_prepacked_weights_follow_updates_through_data():
    g = _gen(29)
    x, w = torch.randn(2, 16, 8, 8, generator=g), torch.randn(16, 16, 3, 3, generator=g)
    conv = onednn.Convolution(x, w, padding=1, impl=0)
    assert "w" in conv.selected.reorders      # weights really are prepacked for this impl
    conv.execute()
    w.data.mul_(3)                             # optimizer-style update
    torch.testing.assert_close(conv.execute(), F.conv2d(x, w, padding=1), rtol=1e-5, atol=1e-4)


def test_empty_problem_plan_checks_its_tensors():
    w, b = torch.randn(2, 2, 1, 1), torch.randn(2)
    conv = onednn.Convolution(torch.randn(1, 2, 0, 5), w, b, padding=1)
    with pytest.raises(ArgumentError):
        conv.execute(torch.randn(9, 9), w, b)
    with pytest.raises(ArgumentError):
        conv.execute(torch.randn(1, 2, 0, 5), w, torch.randn(1))


@pytest.mark.parametrize("out", [torch.empty(7, dtype=torch.int32), torch.empty(0, 2, 3, 3, device="meta"),
                                 torch.empty(5, 5)], ids=["int32", "meta", "shape"])
def test_empty_problem_validates_out(out):
    x, w, b = torch.randn(1, 2, 0, 5), torch.randn(2, 2, 1, 1), torch.randn(2)
    if out.device.type == "meta":
        x = torch.randn(0, 2, 5, 5)
        w = torch.randn(2, 2, 3, 3)
    with pytest.raises(ArgumentError):
        onednn.forward(x, w, b, padding=1 if out.device.type != "meta" else 0, out=out)


def test_unbatched_out_with_one_output_channel_keeps_its_shape():
    x, w = torch.randn(1, 5, 5), torch.randn(1, 1, 3, 3)
    y = onednn.forward(x, w, out=torch.empty(1, 3, 3))
    assert y.shape == F.conv2d(x, w).shape == (1, 3, 3)


def test_backward_data_impl_indices_agree_with_implementations_list():
    x = torch.randn(1, 3, 5, 5).to(memory_format=torch.channels_last)
    w = torch.randn(2, 3, 3, 3)
    kw = dict(stride=10, padding=1)
    gy = to_layout(torch.randn(1, 2, 1, 1), "nhwc")
    impls = onednn.implementations(x, w, **kw, direction="backward_data")
    for impl in impls:
        onednn.backward_data(gy, w, x.shape, impl=impl, **kw)           # the listed one must be runnable
        onednn.backward_data(gy, w, x.shape, impl=impl.index, **kw)     # and its index must not be out of range


def test_from_benchdnn_rejects_inconsistent_output_size():
    with pytest.raises(ArgumentError):
        ConvProblem.from_benchdnn("ic4oc4ih10oh3kh3")


def test_benchdnn_round_trip_with_smaller_trailing_pad():
    p = ConvProblem(n=1, c=1, k=1, in_spatial=(5,), kernel=(3,), pad_before=(2,), pad_after=(0,))
    q = ConvProblem.from_benchdnn(p.to_benchdnn())
    assert q.out_spatial == p.out_spatial and q == p


# ---- raw Python / torch / cffi errors leaking -------------------------------------------------------
def test_fast_path_non_tensor_bias_after_a_good_call():
    x, w = torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3)
    onednn.forward(x, w, torch.randn(2))
    with pytest.raises(ArgumentTypeError):
        onednn.forward(x, w, [1.0, 2.0])


@pytest.mark.parametrize("good, bad", [(dict(stride=1), dict(stride=True)), (dict(stride=1), dict(stride=1.0)),
                                       (dict(groups=1), dict(groups=1.0)), (dict(impl=0), dict(impl=False))],
                         ids=["stride-bool", "stride-float", "groups-float", "impl-bool"])
def test_validation_does_not_depend_on_earlier_calls(good, bad):
    x, w = torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3)
    onednn.forward(x, w, **good)
    with pytest.raises(CLEAN):
        onednn.forward(x, w, **bad)


@pytest.mark.parametrize("kw", [dict(fpmath=[]), dict(algorithm={}), dict(impl=[0])], ids=["fpmath", "algorithm", "impl"])
def test_unhashable_options_raise_clean_errors(kw):
    with pytest.raises(CLEAN):
        onednn.forward(torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3), **kw)


def test_unhashable_direction_raises_clean_error():
    with pytest.raises(CLEAN):
        onednn.implementations(torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3), direction=["forward"])


@pytest.mark.parametrize("kw", [dict(stride=2 ** 64), dict(padding=2 ** 31), dict(padding=[(0, 2 ** 64), (0, 0)]),
                                dict(padding=2 ** 29)], ids=["stride", "padding", "padding-after", "padding-storage"])
def test_huge_integer_arguments_raise_clean_errors(kw):
    with pytest.raises(RawconvError):
        onednn.forward(torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3), **kw)


@pytest.mark.parametrize("x_shape", [(1, 2, -5, 5), (), (1, 2, 5.7, 5), (1, 2, "5", 5)],
                         ids=["negative", "empty", "float", "str"])
def test_backward_data_validates_x_shape(x_shape):
    with pytest.raises(CLEAN):
        onednn.backward_data(torch.randn(1, 2, 3, 3), torch.randn(2, 2, 3, 3), x_shape)


def test_backward_weights_huge_w_shape():
    with pytest.raises(CLEAN):
        onednn.backward_weights(torch.randn(1, 2, 5, 5), torch.randn(1, 2, 3, 3), (2 ** 70, 2, 3, 3))


def test_selected_after_free():
    conv = onednn.Convolution(torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3))
    conv.execute()
    conv.free()
    with pytest.raises(ArgumentError):
        conv.selected


def test_from_problem_type_check():
    with pytest.raises(ArgumentTypeError):
        onednn.Convolution.from_problem("mb1ic2ih5oc2kh3")


@pytest.mark.parametrize("it", [0, -1, "3"])
def test_autotune_bad_iterations(it):
    conv = onednn.Convolution(torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3))
    with pytest.raises(CLEAN):
        conv.autotune(iterations=it)


@pytest.mark.parametrize("kw", [dict(in_spatial=5, kernel=3), dict(in_spatial=None, kernel=(3, 3)),
                                dict(in_spatial=(5, 5), kernel=(3, 3), dtype=[])], ids=["int", "none", "dtype-list"])
def test_conv_problem_constructor_type_errors(kw):
    with pytest.raises(CLEAN):
        ConvProblem(n=1, c=3, k=3, **kw)


def test_from_benchdnn_bad_dtype_type():
    with pytest.raises(CLEAN):
        ConvProblem.from_benchdnn("ic3oc2ih5", dtype=["float32"])


@pytest.mark.parametrize("bad", [lambda: torch.randn(1, 4, 5, 5), lambda: "x"], ids=["shape", "str"])
def test_reference_checks_its_tensors(bad):
    x, w = torch.randn(1, 3, 5, 5), torch.randn(2, 3, 3, 3)
    p = ConvProblem.from_torch(x, w)
    with pytest.raises(CLEAN):
        p.reference(bad(), w)


def test_reference_of_unbatched_problem_has_forwards_shape():
    x, w = torch.randn(3, 5, 5), torch.randn(2, 3, 3, 3)
    p = ConvProblem.from_torch(x, w)
    y = onednn.forward(x, w)
    ref = p.reference(x, w)
    assert ref.shape == y.shape
    assert compare_to_reference(p, y, ref, abs_reference(p, x, w)).ok


@pytest.mark.parametrize("level", ["x", None, 2 ** 40])
def test_verbose_bad_level(level):
    with pytest.raises(CLEAN):
        onednn.verbose(level)


def test_nested_tensor_input():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = torch.nested.nested_tensor([torch.randn(3, 8, 8), torch.randn(3, 8, 8)])
    with pytest.raises(CLEAN):
        onednn.forward(x, torch.randn(4, 3, 3, 3))


# ---- CLI tracebacks -----------------------------------------------------------------------------
@pytest.mark.parametrize("extra", [["--threads", "0"], ["--iterations", "0"]], ids=["threads0", "iterations0"])
def test_cli_bad_timing_options(extra, capsys):
    assert _cli(["compare", "--input", "1x3x5x5", "--weight", "3x3x3x3", "--device", "cpu", "--no-ref"] + extra) == 2


def test_cli_refuses_a_thread_count_the_process_cannot_create(capsys):
    # breaker D6: --threads 100000 was passed on to OpenMP, which crashed (SIGSEGV); now a usage error
    import os

    cap = max(64, 8 * (os.cpu_count() or 1))   # 8 per CPU, at least 64
    for cmd in (["compare", "--input", "1x3x5x5", "--weight", "3x3x3x3", "--device", "cpu", "--no-ref"],
                ["replay", "missing.json"]):
        assert _cli(cmd + ["--threads", str(cap + 1)]) == 2
        assert "at most 8 threads per CPU" in capsys.readouterr().err   # (more crashed OpenMP: SIGSEGV)
    assert _cli(["compare", "--input", "1x3x5x5", "--weight", "3x3x3x3", "--device", "cpu", "--no-ref", "--iterations",
                 "1", "--warmup", "0", "--budget", "0.05", "--threads", "2"]) == 0


def test_cli_huge_input_shape():
    assert _cli(["list", "--input", "4611686018427387904x3x5x5", "--weight", "3x3x3x3", "--device", "cpu"]) == 2


def test_cli_zero_spatial_compare_with_photo():
    assert _cli(["compare", "--input", "1x3x0x5", "--weight", "3x3x1x1", "--padding", "1", "--iterations", "1",
                 "--device", "cpu", "--no-ref"]) == 0


def test_cli_json_unwritable_path(tmp_path):
    target = str(tmp_path / "missing-dir" / "out.json")
    assert _cli(["compare", "--input", "1x3x5x5", "--weight", "3x3x3x3", "--iterations", "1", "--device", "cpu",
                 "--no-ref", "--random", "--json", target]) == 2


# ---- misleading messages ---------------------------------------------------------------------------
def test_foreign_implementation_message_is_not_self_contradictory():
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    # a forward implementation whose name backward_data lists too (x64:gemm:jit on every CPU): the
    # message must not say "not offered" while its list of offered names holds that very name
    bwd = {i.name for i in onednn.implementations(x, w, direction="backward_data")}
    impl = next(i for i in onednn.implementations(x, w) if i.name in bwd)
    try:
        onednn.backward_data(torch.randn(2, 4, 6, 6), w, x.shape, impl=impl)
    except NotSupportedError as exc:
        assert impl.name not in exc.offered or "format" in str(exc) or "direction" in str(exc), str(exc)


def test_select_none_message():
    # the old message listed None as a valid impl ("impl must be None, ...") and rejected it: None now
    # means what it means everywhere else, oneDNN's first choice
    conv = onednn.Convolution(torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3))
    conv.select(1 if len(conv.implementations) > 1 else 0)
    assert conv.select(None) == conv.implementations[0] and conv.selected == conv.implementations[0]


def test_backward_data_dtype_message_names_grad_y():
    with pytest.raises(ArgumentError) as info:
        onednn.backward_data(torch.randn(1, 2, 3, 3), torch.randn(2, 2, 3, 3).double(), (1, 2, 5, 5))
    assert "grad_y" in str(info.value)


def test_forward_plan_rejects_grad_y():
    x, w = torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3)
    conv = onednn.Convolution(x, w)
    with pytest.raises(ArgumentError):
        conv.execute(grad_y=torch.randn(1, 2, 3, 3))


def test_cli_unknown_preset_message(capsys):
    assert _cli(["list", "resnet51", "--device", "cpu"]) == 2
    assert "resnet50" in capsys.readouterr().err
