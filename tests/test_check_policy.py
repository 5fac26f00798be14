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


def _benchmark_spy(monkeypatch):
    """check._reference wrapped: ``(seen, spy)``, ``seen`` the cudnn.benchmark flag at each call."""
    seen = []
    real = check._reference

    def spy(*a, **k):
        seen.append(torch.backends.cudnn.benchmark)
        return real(*a, **k)
    monkeypatch.setattr(check, "_reference", spy)
    return seen, spy


def test_reference_runs_with_cudnn_benchmark_off_and_restores_it(monkeypatch):
    """With torch.backends.cudnn.benchmark on, each new float64 shape would first time cuDNN's
    float64 algorithms: the reference turns it off for its own convolutions, restores it after
    (also when it raises), and still computes the float64 result. (CUDA tensors stood in for:
    the toggle only happens for CUDA references.)"""
    from rawconv import check

    p = ConvProblem.from_benchdnn("mb2ic3ih6oc4oh6kh3ph1")
    x, w, _ = p.make_inputs()
    monkeypatch.setattr(check, "_on_cuda", lambda tensors: True)
    seen, spy = _benchmark_spy(monkeypatch)
    old = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = True
        ref, _ = check.reference(p, "forward", {"x": x, "w": w})
        assert seen == [False] and torch.backends.cudnn.benchmark is True
        want = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
        assert torch.equal(ref, want)

        def boom(*a, **k):
            raise RuntimeError("a float64 convolution failed")
        monkeypatch.setattr(check, "_reference", boom)
        with pytest.raises(RuntimeError, match="float64"):
            check.reference(p, "forward", {"x": x, "w": w})
        assert torch.backends.cudnn.benchmark is True and check._bench_users == 0
        monkeypatch.setattr(check, "_reference", spy)
        torch.backends.cudnn.benchmark = False
        check.reference(p, "forward", {"x": x, "w": w})
        assert seen[-1] is False and torch.backends.cudnn.benchmark is False
    finally:
        torch.backends.cudnn.benchmark = old


def test_reference_keeps_cudnn_benchmark_off_while_another_thread_still_needs_it(monkeypatch):
    """Two threads computing CUDA references at once: the one that ends first must not turn
    cudnn.benchmark back on under the other (its float64 shapes would then be timed by
    cudnnFind). The flag comes back once both are done. (CUDA tensors stood in for: the toggle
    only matters, and only happens, for CUDA references.)"""
    import threading

    p = ConvProblem.from_benchdnn("mb2ic3ih6oc4oh6kh3ph1")
    x, w, _ = p.make_inputs()
    monkeypatch.setattr(check, "_on_cuda", lambda tensors: True)
    a_in, b_in, a_done = threading.Event(), threading.Event(), threading.Event()
    seen = {}
    real = check._reference

    def spy(p_, direction, tensors, activation):
        name = threading.current_thread().name
        if name == "A":
            a_in.set()
            assert b_in.wait(5)
        else:
            b_in.set()
            assert a_done.wait(5)
        seen[name] = torch.backends.cudnn.benchmark
        return real(p_, direction, tensors, activation)
    monkeypatch.setattr(check, "_reference", spy)

    def run_a():
        check.reference(p, "forward", {"x": x, "w": w})
        a_done.set()

    def run_b():
        assert a_in.wait(5)
        check.reference(p, "forward", {"x": x, "w": w})
    old = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = True
        ta, tb = threading.Thread(target=run_a, name="A"), threading.Thread(target=run_b, name="B")
        ta.start(), tb.start()
        ta.join(10), tb.join(10)
        assert seen == {"A": False, "B": False}, seen
        assert torch.backends.cudnn.benchmark is True
    finally:
        torch.backends.cudnn.benchmark = old


def test_reference_of_cpu_tensors_leaves_cudnn_benchmark_alone_and_checks_its_arguments(monkeypatch):
    """cudnn.benchmark is process-wide: a reference on CPU tensors (oneDNN's autotune) has no
    reason to flip it under another thread's GPU work. Bad arguments are rawconv's errors, not
    KeyError / AttributeError from inside."""
    from rawconv.errors import ArgumentTypeError

    p = ConvProblem.from_benchdnn("mb2ic3ih6oc4oh6kh3ph1")
    x, w, _ = p.make_inputs()
    dy = torch.randn(p.y_shape)
    seen, _ = _benchmark_spy(monkeypatch)
    old = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = True
        check.reference(p, "forward", {"x": x, "w": w})
        assert seen == [True] and torch.backends.cudnn.benchmark is True
        for direction, tensors, exc, words in [
                ("forward", {"x": x}, ArgumentError, "w"),
                ("backward_data", {"w": w}, ArgumentError, "dy"),
                ("backward_weights", {"x": x, "dy": None}, ArgumentError, "dy"),
                ("forward", {"x": [1.0], "w": w}, ArgumentTypeError, "x"),
                ("forward", {"x": x[:, :2], "w": w}, ArgumentError, "shape"),
                ("forward", {"x": x, "w": w, "b": torch.randn(3)}, ArgumentError, "b"),
                ("backward_data", {"dy": dy[:, :, :3], "w": w}, ArgumentError, "shape"),
                ("forward", {"x": x.int(), "w": w}, ArgumentError, "floating"),
                ("forward", None, ArgumentTypeError, "dict"),
                ("sideways", {"x": x, "w": w}, ArgumentError, "direction")]:
            with pytest.raises(exc, match=words):
                check.reference(p, direction, tensors)
        with pytest.raises(ArgumentError, match="activation"):
            check.reference(p, "forward", {"x": x, "w": w}, activation="banana")
        with pytest.raises(ArgumentTypeError, match="ConvProblem"):
            check.reference("mb2ic3ih6oc4oh6kh3ph1", "forward", {"x": x, "w": w})
        assert torch.backends.cudnn.benchmark is True
        ref, _ = check.reference(p, "backward_filter", {"x": x, "dy": dy})   # the old name still works
        assert ref.shape == p.w_shape
    finally:
        torch.backends.cudnn.benchmark = old


@pytest.mark.parametrize("desc", ["mb2ic4ih7oc6oh4kh3sh2ph1", "mb2ic4iw9oc4kw3dw1pw1g2", "mb1ic2id5ih4iw4oc3kd2kh1kw3"])
def test_backward_references_under_inference_mode_and_without_grad(desc):
    """The backward references are aten's convolution_backward, no autograd graph: they work
    under torch.inference_mode (they raised 'element 0 of tensors does not require grad', so a
    backward plan's autotune failed there) and agree with autograd's vector-Jacobian product of
    the float64 forward (asymmetric padding included: the pad's gradient is the crop)."""
    import torch.nn.functional as F

    p = ConvProblem.from_benchdnn(desc)
    p = p.with_(pad_after=tuple(a + 1 for a in p.pad_after))   # asymmetric
    x, w, _ = p.make_inputs(seed=2)
    dy = torch.randn(p.y_shape)
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[p.ndim]
    pad = []
    for b, a in reversed(list(zip(p.pad_before, p.pad_after))):
        pad += [b, a]
    x64, w64, dy64 = (x.double().requires_grad_(), w.double().requires_grad_(), dy.double())
    y = conv(F.pad(x64, pad), w64, None, p.stride, 0, p.dilation, p.groups)
    want_dx, want_dw = torch.autograd.grad(y, (x64, w64), dy64)
    for ctx in (torch.inference_mode, torch.no_grad, torch.enable_grad):
        with ctx():
            dx, dx_abs = check.reference(p, "backward_data", {"dy": dy, "w": w})
            dw, dw_abs = check.reference(p, "backward_weights", {"x": x, "dy": dy})
        torch.testing.assert_close(dx, want_dx, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(dw, want_dw, rtol=1e-12, atol=1e-12)
        assert (dx_abs >= dx.abs() - 1e-12).all() and (dw_abs >= dw.abs() - 1e-12).all()
        assert not dx.requires_grad and not dw.requires_grad


def test_backward_autotune_under_inference_mode(dnnl):
    """A backward plan's autotune checks each result against the float64 reference: under
    torch.inference_mode too."""
    from rawconv import onednn

    p = ConvProblem.from_benchdnn("mb2ic3ih6oc4oh6kh3ph1")
    with torch.inference_mode():
        for direction in ("backward_data", "backward_weights"):
            rows = onednn.Convolution.from_problem(p, direction=direction).autotune(iterations=1, warmup=0)
            assert rows[0].status == "ok", rows[0]
