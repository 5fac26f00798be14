"""Drop-in parity with torch.nn's conv modules (issue 37) and errors that name the right keyword.

* What no rawconv library can run (float64 and complex on the CPU, float16 where this CPU's oneDNN
  has none, a module with no input channels) runs on torch's own kernel: the same values and errors
  as torch's module, one TorchFallbackWarning per reason, counted, in describe() and convert's report.
  A pinned choice, or fallback="error", refuses instead.
* Keywords: torch's F.conv2d names (input=, weight=) work in the function forms; an unknown keyword
  names the one meant and every one taken; onednn.forward(return_info=True); torch_flags' cuDNN flags
  on a machine without a GPU warn.
* choice= names: a name no backend's grammar fits is refused when the module is built (with the
  spelling meant); a name oneDNN does not offer gets a "did you mean" at the first call; a cuDNN name on
  CPU tensors says it is one and needs CUDA tensors.
* The command line names a problem given by --input/--weight by its benchdnn descriptor, not "cli".
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import rawconv
import rawconv.nn as rnn
from rawconv import onednn
from rawconv.errors import ArgumentError, ArgumentTypeError, NotSupportedError, TorchFallbackWarning
from rawconv.pytorch import fallback


@pytest.fixture(autouse=True)
def _fresh_counts():
    fallback.reset()
    yield
    fallback.reset()


@pytest.mark.parametrize("cls,shape,kw", [
    (rnn.Conv1d, (2, 3, 11), {"padding": "same", "dilation": 2}),
    (rnn.Conv2d, (3, 9, 10), {"padding": 1, "padding_mode": "reflect"}),          # unbatched, reflect
    (rnn.Conv2d, (2, 3, 9, 10), {"padding": "same", "padding_mode": "circular"}),
    (rnn.Conv3d, (1, 3, 5, 6, 7), {"stride": 2, "groups": 3}),
    (rnn.ConvTranspose2d, (2, 3, 5, 6), {"stride": 2, "output_padding": 1}),
])
def test_float64_on_the_cpu_runs_on_torchs_kernel_with_torchs_values(cls, shape, kw):
    torch.manual_seed(0)
    k = 3
    m = cls(3, 6, k, dtype=torch.float64, **kw)
    t = cls._torch_base(3, 6, k, dtype=torch.float64, **kw)
    t.load_state_dict(m.state_dict())
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    with pytest.warns(TorchFallbackWarning, match="float64 on the CPU: oneDNN 3.2 has no float64 convolution"):
        y = m(x)
    y2 = m(x)   # said once per reason
    ref = t(x)
    assert y.dtype == torch.float64 and y.shape == ref.shape
    torch.testing.assert_close(y, ref, rtol=0, atol=0)   # the same kernel: the same bits
    torch.testing.assert_close(y2, ref, rtol=0, atol=0)
    (gx,) = torch.autograd.grad(y.sum(), x)
    (gref,) = torch.autograd.grad(ref.sum(), x)
    torch.testing.assert_close(gx, gref)
    why = "float64 on the CPU: oneDNN 3.2 has no float64 convolution"
    assert rnn.torch_fallbacks() == {why: 2} and m.torch_fallbacks == {why: 2}


def test_warned_once_per_reason_per_process():
    m1 = rnn.Conv2d(3, 4, 3, dtype=torch.float64)
    m2 = rnn.Conv2d(3, 4, 3, dtype=torch.float64)
    x = torch.randn(1, 3, 8, 8, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        m1(x), m2(x), m1(x)
    fb = [w for w in said if issubclass(w.category, TorchFallbackWarning)]
    assert len(fb) == 1, [str(w.message) for w in fb]
    assert fb[0].filename == __file__, fb[0].filename   # points at the line that called the module
    assert rnn.torch_fallbacks() == {"float64 on the CPU: oneDNN 3.2 has no float64 convolution": 3}
    model = torch.nn.Sequential(m1, m2)
    assert set(rnn.torch_fallbacks(model)) == {"0", "1"}


def test_complex_and_empty_channels_follow_torch():
    m = rnn.Conv1d(3, 4, 10, dtype=torch.complex64)
    x = torch.randn(1, 3, 4, dtype=torch.complex64)
    with pytest.raises(RuntimeError, match=r"Kernel size can't be greater than actual input size"), \
            pytest.warns(TorchFallbackWarning, match="complex"):
        m(x)   # torch's own error, as torch's module raises it (not rawconv's translation)
    m = rnn.Conv1d(0, 8, 2, stride=2)
    t = torch.nn.Conv1d(0, 8, 2, stride=2)
    t.load_state_dict(m.state_dict())
    x = torch.randn(2, 0, 15)
    with pytest.warns(TorchFallbackWarning, match="in_channels=0"):
        y = m(x)
    assert y.shape == t(x).shape == (2, 0, 7)   # torch's Empty backend's answer, kept


def test_float16_where_onednn_has_none_runs_on_torch():
    caps = onednn.capabilities()
    row = caps.row("forward", torch.float16)
    if row.offered or row.reference:
        pytest.skip(f"oneDNN offers float16 here: {caps.reason('forward', torch.float16)}")
    m = rnn.Conv2d(3, 4, 3, dtype=torch.float16)
    x = torch.randn(1, 3, 8, 8, dtype=torch.float16)
    with pytest.warns(TorchFallbackWarning, match="float16 forward"):
        y = m(x)
    torch.testing.assert_close(y, torch.nn.Conv2d.forward(m, x), rtol=0, atol=0)


def test_a_problem_the_library_refuses_at_the_call_falls_back_too(monkeypatch):
    """What the capabilities probe does not predict (a shape the library has no implementation for):
    oneDNN's own refusal (dnnl_unimplemented) at the call runs torch's kernel, with oneDNN's words;
    rawconv's own NotSupportedError (a tracer, a mode) does not."""
    caps = onednn.capabilities()
    row = caps.row("forward", torch.float16)
    if row.offered or row.reference:
        pytest.skip(f"oneDNN offers float16 here: {caps.reason('forward', torch.float16)}")
    monkeypatch.setattr(fallback, "_reason", lambda *a: None)   # the probe says nothing: the call finds out
    m = rnn.Conv2d(3, 4, 3, dtype=torch.float16)
    x = torch.randn(1, 3, 8, 8, dtype=torch.float16)
    with pytest.warns(TorchFallbackWarning, match=r"the library offers no implementation for this problem \("
                                                  r"dnnl_convolution_forward_primitive_desc_create failed"):
        y = m(x)
    torch.testing.assert_close(y, torch.nn.Conv2d.forward(m, x), rtol=0, atol=0)
    assert not fallback.library_refused(NotSupportedError("torch.jit.trace cannot record it"))


def test_pinned_choice_and_fallback_error_refuse():
    x = torch.randn(1, 3, 8, 8, dtype=torch.float64)
    with pytest.raises(ArgumentError, match="no float64 convolution"):
        rnn.Conv2d(3, 4, 3, dtype=torch.float64, choice="x64:gemm:jit")(x)
    with pytest.raises(ArgumentError, match="no float64 convolution"):
        rnn.Conv2d(3, 4, 3, dtype=torch.float64, fallback="error")(x)
    with pytest.raises(ArgumentError, match=r"fallback must be one of \['torch', 'error'\]"):
        rnn.Conv2d(3, 4, 3, fallback="no")
    assert rnn.torch_fallbacks() == {}


def test_float32_never_falls_back():
    m = rnn.Conv2d(3, 4, 3)
    x = torch.randn(2, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TorchFallbackWarning)
        y = m(x)
    torch.testing.assert_close(y, F.conv2d(x, m.weight, m.bias), rtol=1e-4, atol=1e-4)
    assert rnn.torch_fallbacks() == {} and "torch_fallbacks" not in m.__dict__


def test_convert_reports_and_describe_names_the_fallback_layers():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3)).double().eval()
    x = torch.randn(1, 3, 10, 10, dtype=torch.float64)
    ref = model(x)
    with pytest.warns(TorchFallbackWarning):
        conv = rnn.convert(model, autotune=x)
    rep = conv.rawconv_report
    why = "float64 on the CPU: oneDNN 3.2 has no float64 convolution"
    assert rep.fallback == {"0": why, "2": why}
    assert f"2 layer(s) run on torch's own kernel: {why}" in str(rep)
    torch.testing.assert_close(conv(x), ref, rtol=0, atol=0)
    rows = rnn.describe(conv, x, iterations=2)
    assert [r.rawconv_backend for r in rows] == ["torch (fallback)"] * 2
    assert all(why in r.note for r in rows) and why in str(rows)
    fused = rnn.convert(model, fuse=True)   # a fused module falls back too: conv, then its activation
    torch.testing.assert_close(fused(x), ref, rtol=0, atol=0)


def test_a_float32_model_converted_then_doubled_falls_back_and_back():
    model = rnn.convert(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)))
    x = torch.randn(1, 3, 8, 8)
    y32 = model(x)
    with pytest.warns(TorchFallbackWarning):
        y64 = model.double()(x.double())
    torch.testing.assert_close(y64.float(), y32, rtol=1e-4, atol=1e-4)
    assert rnn.torch_fallbacks(model) == {"0": {"float64 on the CPU: oneDNN 3.2 has no float64 convolution": 1}}


# ---------------------------------------------------------------------------- keywords
def test_function_forms_take_torchs_names():
    x, w, b = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    y = onednn.forward(input=x, weight=w, bias=b, padding=1)
    torch.testing.assert_close(y, F.conv2d(x, w, b, padding=1), rtol=1e-4, atol=1e-4)
    with pytest.raises(ArgumentTypeError, match=r"got both x and input \(torch's name for x\)"):
        onednn.forward(x, w, input=x)
    with pytest.raises(ArgumentTypeError, match=r"x \(torch's input\) must be a torch.Tensor, got None or nothing"):
        onednn.forward(weight=w)


def test_unknown_keywords_name_the_one_meant_and_every_one_taken():
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    with pytest.raises(ArgumentTypeError, match=r"'grad_output' \(did you mean 'grad_y'\?\).*it takes: grad_y, w, "):
        onednn.backward_data(grad_output=x, w=w, x_shape=x.shape)
    with pytest.raises(ArgumentTypeError, match=r"'pading' \(did you mean 'padding'\?\)"):
        onednn.implementations(x, w, pading=1)
    with pytest.raises(ArgumentTypeError, match=r"'cudnn_benchmark' \(did you mean 'benchmark'\?\); it takes: "
                                                r"mkldnn, cudnn, benchmark, deterministic"):
        with rawconv.torch_flags(cudnn_benchmark=True):
            pass


def test_onednn_forward_return_info_names_the_implementation_that_ran():
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    y, info = onednn.forward(x, w, padding=1, impl="x64:gemm:jit", return_info=True)
    assert isinstance(info, onednn.Implementation) and info.name == "x64:gemm:jit"
    torch.testing.assert_close(y, F.conv2d(x, w, padding=1), rtol=1e-4, atol=1e-4)
    y, info = onednn.forward(x, w, return_info=True)
    assert info.name == onednn.implementations(x, w)[0].name   # oneDNN's first choice
    with pytest.raises(ArgumentTypeError, match="return_info must be True or False"):
        onednn.forward(x, w, return_info="yes")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the warning is for machines where torch sees no GPU")
def test_cudnn_flags_around_cpu_work_warn_and_torch_choice_says_so():
    x, w = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)
    with pytest.warns(UserWarning, match=r"torch_flags\(benchmark=...\).*only CUDA convolutions read"):
        with rawconv.torch_flags(benchmark=True):
            c = rawconv.torch_choice(x, w)
    assert "cudnn benchmark on: no effect on a CPU call" in str(c)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with rawconv.torch_flags(mkldnn=True, threads=1):   # CPU flags: nothing to say
            pass


# ---------------------------------------------------------------------------- choice names
def test_a_choice_no_grammar_fits_is_refused_at_construction_with_the_spelling_meant():
    with pytest.raises(ArgumentError, match=r"choice='JIT:AVX512_CORE' is not a name of any rawconv backend: did "
                                            r"you mean 'jit:avx512_core'\?"):
        rnn.Conv2d(3, 4, 3, choice="JIT:AVX512_CORE")
    with pytest.raises(ArgumentError, match=r"did you mean 'IMPLICIT_GEMM@fma'\?"):
        rnn.Conv2d(3, 4, 3, choice="implicit_gemm@FMA")
    with pytest.raises(ArgumentError, match=r"backward_choice\[1\]='nope' is not a name"):
        rnn.Conv2d(3, 4, 3, backward_choice=("x64:gemm:jit", "nope"))


def test_a_name_not_offered_gets_did_you_mean_at_the_first_call():
    x = torch.randn(1, 3, 8, 8)
    offered = [r.name for r in onednn.implementations(x, torch.randn(4, 3, 3, 3))]
    typo = offered[0][:-1]                       # e.g. "jit:avx512_cor"
    m = rnn.Conv2d(3, 4, 3, choice=typo)         # the grammar fits: known only for a problem
    with pytest.raises(NotSupportedError, match=f"did you mean '{offered[0]}'"):
        m(x)
    with pytest.raises(NotSupportedError, match=f"did you mean '{offered[0]}'"):
        onednn.forward(x, torch.randn(4, 3, 3, 3), impl=offered[0].upper())


def test_a_cudnn_name_on_cpu_tensors_says_it_needs_cuda_and_survives_half():
    m = rnn.Conv2d(3, 4, 3, choice="IMPLICIT_PRECOMP_GEMM@fma")   # for .cuda() later
    with pytest.raises(NotSupportedError, match=r"'IMPLICIT_PRECOMP_GEMM@fma' is a cuDNN algorithm name "
                                                r"\(ALGO@math\): it runs on CUDA tensors"):
        m(torch.randn(1, 3, 8, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.half().float()                         # the device stays: the choice stays
    assert m.choice == "IMPLICIT_PRECOMP_GEMM@fma"
    with pytest.raises(NotSupportedError, match="an engine config of cuDNN's graph API"):
        onednn.forward(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), impl="eng0{k2=1}")


def test_a_onednn_choice_is_still_dropped_when_the_module_changes_device(monkeypatch):
    m = rnn.Conv2d(3, 4, 3, choice="x64:gemm:jit")
    m.__dict__["_rawconv_device"] = "cuda"   # as if it had been on the GPU: now back on the CPU with a cuDNN...
    m._choice_backend = "cudnn"              # ...choice (the move's own rule, without a GPU here)
    m.choice = "IMPLICIT_GEMM@fma"
    with pytest.warns(RuntimeWarning, match="were dropped"):
        m.float()
    assert m.choice is None


# ---------------------------------------------------------------------------- the command line
def test_cli_problem_from_input_and_weight_is_named_by_its_descriptor():
    from rawconv.explore import cli

    ap = cli.build_parser()
    a = ap.parse_args(["compare", "--input", "8x64x56x56", "--weight", "64x64x3x3", "--padding", "1",
                       "--layout", "nhwc"])
    (p,) = cli._problems_on(a, "cpu")
    assert p.name == "mb8ic64ih56iw56oc64oh56ow56kh3kw3ph1pw1 (nhwc)"
    back = rawconv.ConvProblem.from_benchdnn(p.name.split(" ")[0])
    assert (back.x_shape, back.w_shape, back.pad_before, back.pad_after) == \
        (p.x_shape, p.w_shape, p.pad_before, p.pad_after)


# ---------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
def test_gpu_cudnn_name_given_on_the_cpu_runs_after_cuda_and_torch_names_work():
    # kept through the dtype moves on the CPU, then run by cuDNN
    m = rnn.Conv2d(8, 8, 3, padding=1, choice="IMPLICIT_PRECOMP_GEMM@fma").double().float().cuda()
    assert m.choice == "IMPLICIT_PRECOMP_GEMM@fma"
    x = torch.randn(2, 8, 10, 10, device="cuda")
    with torch.no_grad():
        y = m(x)
        ref = F.conv2d(x.double(), m.weight.double(), m.bias.double(), padding=1)
    torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=1e-4)
    from rawconv import cudnn

    xf, wf = x, m.weight.detach()
    torch.testing.assert_close(cudnn.forward(input=xf, weight=wf, padding=1), F.conv2d(xf, wf, padding=1),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_gpu_complex_falls_back_and_float64_runs_on_cudnn():
    m = rnn.Conv2d(3, 4, 3, dtype=torch.complex64, device="cuda")
    x = torch.randn(1, 3, 8, 8, dtype=torch.complex64, device="cuda")
    with pytest.warns(TorchFallbackWarning, match="complex"):
        y = m(x)
    torch.testing.assert_close(y, torch.nn.Conv2d.forward(m, x))
    m = rnn.Conv2d(3, 4, 3, dtype=torch.float64, device="cuda")   # cuDNN takes float64: no fallback
    x = torch.randn(1, 3, 8, 8, dtype=torch.float64, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TorchFallbackWarning)
        y = m(x)
    torch.testing.assert_close(y, F.conv2d(x, m.weight, m.bias))
    assert "torch_fallbacks" not in m.__dict__
