"""The tolerance policy (rawconv.check) on results built by hand with known rounding: what a
legitimate reduced-precision computation produces passes, a wrong term fails."""
import pytest
import torch

from rawconv import check
from rawconv.errors import ArgumentError
from rawconv.problem import ConvProblem


def _problem(dtype, bias):
    g = torch.Generator().manual_seed(7)
    x = (torch.rand(4, 1, 9, generator=g) + 0.5).to(getattr(torch, dtype))   # one-term reductions
    w = (torch.rand(3, 1, 1, generator=g) + 0.5).to(x.dtype)
    b = (torch.rand(3, generator=g) + 0.5).to(x.dtype) if bias else None
    p = ConvProblem.from_torch(x, w, b)
    ref, ref_abs = check.reference(p, "forward", {"x": x, "w": w, "b": b})
    return p, x, w, b, ref, ref_abs


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_conv_rounded_before_bias_passes_a_wrong_term_fails(dtype):
    # cuDNN's legacy forward with bias: the convolution is stored in the data type, then the bias is
    # added and rounded again (two roundings: measured on the H200, 1.28x eps_out*|ref| alone)
    p, x, w, b, ref, ref_abs = _problem(dtype, bias=True)
    t = x.dtype
    conv = (x.double() * w.double().view(1, 3, 1)).to(t)         # rounded to the data type ...
    twice = (conv.double() + b.double().view(1, 3, 1)).to(t)      # ... then the bias, rounded again
    tol = check.tolerance_for(p, "forward")
    assert check.check(p, twice, ref, ref_abs, tol).ok
    wrong = twice.clone()
    wrong[0, 1, 4] = (conv[0, 1, 4].double()).to(t)               # the bias left out of one element
    st = check.check(p, wrong, ref, ref_abs, tol)
    assert not st.ok and st.ratio > 10


def test_tf32_truncated_inputs_pass_only_as_tf32():
    p, x, w, b, ref, ref_abs = _problem("float32", bias=False)

    def trunc(t):   # what a tensor core does to float32 inputs: keep 10 explicit mantissa bits, drop the rest
        return (t.view(torch.int32) & ~((1 << 13) - 1)).view(torch.float32)

    y = (trunc(x).double() * trunc(w).double().view(1, 3, 1)).float()
    assert check.check(p, y, ref, ref_abs, check.tolerance_for(p, "forward", compute="tf32")).ok
    assert not check.check(p, y, ref, ref_abs, check.tolerance_for(p, "forward")).ok   # not as float32


def test_reference_runs_with_cudnn_benchmark_off_and_restores_it(monkeypatch):
    """With torch.backends.cudnn.benchmark on, each new float64 shape would first time cuDNN's
    float64 algorithms: the reference turns it off for its own convolutions, restores it after
    (also when it raises), and still computes the float64 result."""
    from rawconv import check

    p = ConvProblem.from_benchdnn("mb2ic3ih6oc4oh6kh3ph1")
    x, w, _ = p.make_inputs()
    seen = []
    real = check._reference

    def spy(*a, **k):
        seen.append(torch.backends.cudnn.benchmark)
        return real(*a, **k)
    monkeypatch.setattr(check, "_reference", spy)
    old = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = True
        ref, _ = check.reference(p, "forward", {"x": x, "w": w})
        assert seen == [False] and torch.backends.cudnn.benchmark is True
        want = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
        assert torch.equal(ref, want)
        with pytest.raises(ArgumentError):
            check.reference(p, "sideways", {"x": x, "w": w})
        assert torch.backends.cudnn.benchmark is True
        torch.backends.cudnn.benchmark = False
        check.reference(p, "forward", {"x": x, "w": w})
        assert seen[-1] is False and torch.backends.cudnn.benchmark is False
    finally:
        torch.backends.cudnn.benchmark = old
