"""Errors a user meets and state they rely on (out= versions, training steps, denormals, limits):
issue 13's repros, one test each, as the issue states them (the thorough versions live in
test_out.py, test_prepack.py, test_bad_input.py, test_reference_time.py, test_denormals.py and
test_fuzz.py)."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import rawconv.fused as fu
import rawconv.nn as rnn
from rawconv import ArgumentError, ConvProblem, check, onednn, tuning
from rawconv.onednn import plan as onednn_plan   # the plan class's module (what it reads)
from rawconv.errors import (AllocationError, DeviceNotAvailableError, NotSupportedError, RawconvError,
                            SlowReferenceWarning)

pytestmark = pytest.mark.usefixtures("dnnl")


def test_double_backward_is_not_silently_zero():
    """gx = grad(conv(x, w, padding=1).pow(2).sum(), x, create_graph=True); a gradient penalty on gx
    must give float64's dw (was gx.requires_grad False and dw = 0)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, 6, 6, generator=g, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, generator=g, requires_grad=True)
    gx, = torch.autograd.grad(rnn.conv(x, w, padding=1).pow(2).sum(), x, create_graph=True)
    assert gx.requires_grad
    dw, = torch.autograd.grad(gx.pow(2).sum(), w)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    gx64, = torch.autograd.grad(F.conv2d(x64, w64, padding=1).pow(2).sum(), x64, create_graph=True)
    dw64, = torch.autograd.grad(gx64.pow(2).sum(), w64)
    assert dw64.abs().max() > 1
    assert (dw.double() - dw64).abs().max() <= 1e-5 * dw64.abs().max()


def test_out_bumps_the_version_counter():
    """z = (a * buf).sum(); onednn.forward(x, w, out=buf); z.backward() must raise (was a.grad
    silently equal to the new buf), as after torch's own out= ops."""
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    a = torch.randn(2, 4, 6, 6, requires_grad=True)
    buf = torch.zeros(2, 4, 6, 6)
    z = (a * buf).sum()
    onednn.forward(x, w, out=buf)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()


def test_a_leaf_that_requires_grad_is_refused_as_out():
    with pytest.raises(ArgumentError, match="out requires grad"):
        onednn.forward(torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3),
                       out=torch.zeros(2, 4, 6, 6, requires_grad=True))


def test_fused_adam_training_never_runs_stale_weights():
    """torch.optim.Adam(fused=True) leaves _version alone; with gradients on the later channels only,
    every rawconv path must follow the update (was relative error 0.06-1.86 on prepacked weights)."""
    torch.manual_seed(1)
    x = torch.randn(2, 16, 8, 8)
    conv = rnn.Conv2d(16, 64, 3, padding=1)
    w = conv.weight
    opt = torch.optim.Adam([w], lr=0.5, fused=True)
    plan = onednn.Convolution(x, w.detach(), padding=1)     # built before the steps
    for _ in range(3):
        v = w._version
        g = torch.zeros_like(w)
        g[32:] = 1.0
        w.grad = g
        opt.step()
        assert w._version == v                              # the premise: fused Adam leaves it
        p = ConvProblem.from_torch(x, w.detach(), None, 1, 1)
        ref, ref_abs = check.reference(p, "forward", {"x": x, "w": w})
        for y in (plan.execute(x), onednn.forward(x, w.detach(), padding=1),
                  fu.conv_bias_act(x, w.detach(), None, padding=1, activation="none")):
            assert check.check(p, y, ref, ref_abs).ok
        b_ref, b_abs = check.reference(p.with_(has_bias=True), "forward", {"x": x, "w": w, "b": conv.bias})
        with torch.no_grad():
            assert check.check(p.with_(has_bias=True), conv(x), b_ref, b_abs).ok


def test_conv3d_on_channels_last_3d_trains():
    """rawconv.nn.Conv3d on channels_last_3d input: backward raised RuntimeError (rank 4)."""
    torch.manual_seed(2)
    m = rnn.Conv3d(4, 4, 3, padding=1)
    x = torch.randn(2, 4, 5, 5, 5).to(memory_format=torch.channels_last_3d).requires_grad_()
    m(x).square().sum().backward()
    x64 = x.detach().double().requires_grad_()
    w64 = m.weight.detach().double().requires_grad_()
    F.conv3d(x64, w64, m.bias.detach().double(), padding=1).square().sum().backward()
    assert (x.grad.double() - x64.grad).abs().max() <= 1e-4 * x64.grad.abs().max()
    assert (m.weight.grad.double() - w64.grad).abs().max() <= 1e-4 * w64.grad.abs().max()


@pytest.mark.parametrize("call, exc", [
    (lambda: onednn.Convolution.from_problem(ConvProblem(n=1, c=1, k=1, in_spatial=(4, 4), kernel=(1, 1),
                                                          device="cuda")), ArgumentError),
    (lambda: ConvProblem(n=1, c=1, k=1, in_spatial=(4, 4), kernel=(1, 1), device="banana"), ArgumentError),
    (lambda: tuning.cache().load("/nonexistent/tuning.json"), ArgumentError),
])
def test_raw_exceptions_are_rawconv_errors(call, exc):
    with pytest.raises(exc):
        call()


@pytest.mark.skipif(torch.cuda.is_available(), reason="about a machine without a GPU")
def test_cudnn_plan_without_gpu_is_a_rawconv_error():
    from rawconv import cudnn

    with pytest.raises(DeviceNotAvailableError):
        cudnn.Convolution.from_problem(ConvProblem(n=1, c=1, k=1, in_spatial=(4, 4), kernel=(1, 1), device="cuda"))


def test_malformed_tuning_file_is_an_argument_error(tmp_path):
    f = tmp_path / "t.json"
    f.write_text("{not json")
    with pytest.raises(ArgumentError, match="not valid JSON"):
        tuning.cache().load(f)


def test_allocation_failure_during_restride_is_a_memory_error(monkeypatch):
    def fail(*_a, **_k):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes.")
    monkeypatch.setattr(onednn_plan, "_restride", fail)
    onednn.clear_cache()
    with pytest.raises(AllocationError) as info:
        onednn.forward(torch.randn(2, 3, 8, 8).transpose(2, 3), torch.randn(4, 3, 3, 3))
    assert isinstance(info.value, MemoryError)


@pytest.mark.parametrize("argv", [
    ["list", "mb100000ic3oc4ih1000kh1"],
    ["list", "--input", "1x1x2147483647", "--weight", "1x1x1"],
    ["compare", "--padding", "100000", "--input", "1x3x8x8", "--weight", "4x3x3x3"],
    ["list", "resnet50", "--batch", "100000"],
    ["compare", "--json", "/dev/full", "mb1ic3oc4ih8kh3", "--iterations", "1", "--no-ref", "--device", "cpu"],
    ["compare", "--width", "0", "mb1ic3oc4ih8kh3"],
    ["compare", "--width", "-5", "mb1ic3oc4ih8kh3"],
    ["compare", "--ref", "--no-ref", "mb1ic3oc4ih8kh3"],
    ["list", "mb1ic3oc4ih8kh3", "--layers", "1"],
    ["compare", "--engines", "abc", "--device", "cpu", "mb1ic3oc4ih8kh3"],
])
def test_cli_errors_are_one_line_and_non_zero(argv, capsys):
    from rawconv.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code != 0 and len(err) == 1 and "error:" in err[0]


def test_benchdnn_parser_rejects_what_it_invented():
    with pytest.raises(ArgumentError, match="oh100 would need a trailing pad of 90"):
        ConvProblem.from_benchdnn("ic3oc4ih10oh100")
    with pytest.raises(ArgumentError, match="ih twice"):
        ConvProblem.from_benchdnn("ic3oc4ih10ih12")
    with pytest.raises(ArgumentError, match="x_shape"):
        onednn.backward_data(torch.randn(2, 4, 6, 6), torch.randn(4, 3, 3, 3), (2, 5, 8, 8))
    with pytest.raises(ArgumentError, match="w_shape"):
        onednn.backward_weights(torch.randn(2, 3, 8, 8), torch.randn(2, 4, 6, 6), (4, 5, 3, 3))


def test_padding_2_30_is_refused_and_long_reference_calls_warn(monkeypatch):
    """padding 2**30 ran ref:any for ~20 minutes: its output has more elements than oneDNN is given
    now (refused before any call); a problem that does run on ref:* only warns first."""
    with pytest.raises(NotSupportedError, match="elements"):
        onednn.forward(torch.randn(1, 1, 8), torch.randn(1, 1, 3), padding=2 ** 30)
    p = ConvProblem(n=1, c=1, k=1, in_spatial=(8, 8), kernel=(3, 3), pad_before=(4000, 4000), pad_after=(4000, 4000))
    if not all(i.name.startswith("ref") for i in onednn.Convolution.from_problem(p).implementations):
        pytest.skip("oneDNN offers more than ref:* for this problem here")
    monkeypatch.setattr(onednn_plan, "SLOW_REFERENCE_SECONDS", onednn.reference_seconds(p) / 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowReferenceWarning)
        with pytest.raises(SlowReferenceWarning):
            onednn.forward(torch.randn(1, 1, 8, 8), torch.randn(1, 1, 3, 3), padding=4000)


def test_flush_denormals_is_one_setting_for_every_thread():
    """torch.set_flush_denormal(True) left about half of the outputs subnormal (calling thread
    only); rawconv.onednn.flush_denormals sets every OpenMP thread (tests/test_denormals.py)."""
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.full((8, 16, 16, 16), torch.finfo(torch.float32).tiny / 256)
        w = torch.full((16, 16, 1, 1), 0.5)
        onednn.flush_denormals(True)
        assert torch.count_nonzero(onednn.forward(x, w)) == 0
        onednn.flush_denormals(False)
        assert torch.count_nonzero(onednn.forward(x, w)) == 8 * 16 * 16 * 16
    finally:
        onednn.flush_denormals(False)
        torch.set_num_threads(old)


def test_every_error_is_a_rawconv_error():
    assert issubclass(AllocationError, (RawconvError, MemoryError))
    assert issubclass(DeviceNotAvailableError, (RawconvError, RuntimeError))
