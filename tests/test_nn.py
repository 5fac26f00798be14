"""rawconv.nn modules: drop-in torch modules on pinned oneDNN (CPU) / cuDNN (GPU) choices, checked
against torch autograd in float64: convolutions, transposed convolutions, padding modes, aliases,
device following, bad input."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import rawconv.nn as rnn
from rawconv import ArgumentError, ArgumentTypeError, NotSupportedError, onednn

pytestmark = pytest.mark.usefixtures("dnnl")

CONV = {1: (rnn.Conv1d, F.conv1d, torch.nn.Conv1d), 2: (rnn.Conv2d, F.conv2d, torch.nn.Conv2d),
        3: (rnn.Conv3d, F.conv3d, torch.nn.Conv3d)}
TRANSPOSED = {1: (rnn.ConvTranspose1d, F.conv_transpose1d, torch.nn.ConvTranspose1d),
              2: (rnn.ConvTranspose2d, F.conv_transpose2d, torch.nn.ConvTranspose2d),
              3: (rnn.ConvTranspose3d, F.conv_transpose3d, torch.nn.ConvTranspose3d)}


def _close(got, want, rel=2e-5):
    """float32 result vs float64 reference: normwise (max abs error <= rel * max |ref|)."""
    assert got.shape == want.shape, (got.shape, want.shape)
    err = (got.detach().double() - want).abs().max().item()
    assert err <= rel * max(want.abs().max().item(), 1.0), err


def _grads64(fn, x, w, b, gy):
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_() if b is not None else None
    y = fn(x64, w64, b64)
    y.backward(gy.double())
    return y.detach(), x64.grad, w64.grad, (b64.grad if b is not None else None)


@pytest.mark.parametrize("nd, layout", [(1, "nchw"), (2, "nchw"), (2, "nhwc"), (3, "nchw")])
def test_modules_match_torch_autograd(nd, layout):
    torch.manual_seed(nd)
    cls, tconv, tcls = CONV[nd]
    m = cls(6, 8, 3, stride=2, padding=1, dilation=1, groups=2, bias=True)
    assert isinstance(m, tcls) and "choice=None" in repr(m) and "backend='auto'" in repr(m)
    x = torch.randn((2, 6) + (9,) * nd)
    if layout == "nhwc":
        x = x.to(memory_format=torch.channels_last)
        m = m.to(memory_format=torch.channels_last)
    x.requires_grad_()
    y = m(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    y64, gx64, gw64, gb64 = _grads64(lambda a, b_, c: tconv(a, b_, c, stride=2, padding=1, groups=2), x, m.weight,
                                     m.bias, gy)
    for got, want in ((y, y64), (x.grad, gx64), (m.weight.grad, gw64), (m.bias.grad, gb64)):
        _close(got, want)


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_state_dict_is_torchs(nd):
    cls, _, tcls = CONV[nd]
    t = tcls(4, 6, 3, padding=1)
    m = cls(4, 6, 3, padding=1, backend="onednn")
    assert list(m.state_dict()) == list(t.state_dict())
    m.load_state_dict(t.state_dict())
    x = torch.randn((2, 4) + (7,) * nd)
    with torch.no_grad():
        _close(m(x), t.double()(x.double()))
    tc, _, ttc = TRANSPOSED[nd]
    assert list(tc(4, 6, 3).state_dict()) == list(ttc(4, 6, 3).state_dict())


def test_pinned_implementations_and_bad_names():
    x = torch.randn(2, 16, 10, 10, requires_grad=True)
    w = torch.randn(16, 16, 3, 3, requires_grad=True)
    # each candidate by its one name (name@layouts): "ref:any" alone names two rows and is refused
    fwd = [i.choice for i in onednn.implementations(x.detach(), w.detach(), padding=1)]
    bwd = [i.choice for i in onednn.implementations(x.detach(), w.detach(), padding=1, direction="backward_data")]
    wts = [i.choice for i in onednn.implementations(x.detach(), w.detach(), padding=1, direction="backward_weights")]
    ref = F.conv2d(x.detach().double(), w.detach().double(), padding=1)
    grads = []
    for name in dict.fromkeys(fwd[:3]):
        x.grad = w.grad = None
        y = rnn.conv(x, w, None, 1, 1, choice=name, backward_choice=(bwd[-2], wts[0]))
        _close(y, ref)
        y.sum().backward()
        grads.append((x.grad.clone(), w.grad.clone()))
    for gx, gw in grads[1:]:   # other forward implementations, same pinned backward ones: same gradients
        torch.testing.assert_close(gx, grads[0][0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gw, grads[0][1], rtol=1e-5, atol=1e-4)
    with pytest.raises(NotSupportedError, match="offered"):
        rnn.conv(x, w, padding=1, choice="no-such-impl")
    with pytest.raises(NotSupportedError, match="offered"), pytest.deprecated_call(match="old name of choice="):
        rnn.conv(x, w, padding=1, impl="no-such-impl")   # the old name
    with pytest.raises(ArgumentError, match="groups"):
        rnn.conv(x, w, groups=3)


def test_old_names_are_aliases_and_conflicts_are_errors():
    with pytest.warns(DeprecationWarning) as seen:
        m = rnn.Conv2d(4, 4, 3, impl="jit:avx2", fpmath="bf16", backward_impl=("a", "b"))
    assert sorted(str(w.message).split("=")[0] for w in seen) == ["backward_impl", "fpmath", "impl"]
    assert {w.filename for w in seen} == {__file__}   # the warning names the caller's line
    with pytest.warns(DeprecationWarning, match="fpmath= is the old name of precision=") as seen:
        rnn.conv(torch.randn(1, 4, 5, 5), torch.randn(4, 4, 3, 3), fpmath="strict")
    assert seen[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # the new names: no warning
        rnn.Conv2d(4, 4, 3, choice="jit:avx2", precision="bf16", backward_choice=("a", "b"))
    assert (m.choice, m.precision, m.backward_choice) == ("jit:avx2", "bf16", ("a", "b"))
    assert (m.impl, m.fpmath, m.backward_impl) == ("jit:avx2", "bf16", ("a", "b"))
    m.impl = 0
    assert m.choice == 0
    with pytest.raises(ArgumentError, match="disagree"), pytest.deprecated_call():
        rnn.Conv2d(4, 4, 3, impl="jit:avx2", choice="brgconv:avx2")
    with pytest.raises(ArgumentError, match="precision"):
        rnn.Conv2d(4, 4, 3, precision="fp8")
    with pytest.raises(ArgumentError, match="backend"):
        rnn.Conv2d(4, 4, 3, backend="mkl")
    with pytest.raises(ArgumentTypeError):
        rnn.Conv2d(4, 4, 3, backend=1)


def test_choice_type_is_checked_at_construction_and_positions_are_refused():
    """A module refuses a choice of the wrong type when built (it used to show choice=Ellipsis and
    fail at the first forward); an int position is refused by the modules and rawconv.nn.conv with
    a message saying where positions are accepted (onednn.forward, whose listing is one problem's)."""
    for bad, what in ((Ellipsis, "choice"), (1.5, "choice"), (object(), "choice")):
        with pytest.raises(ArgumentTypeError, match=f"^{what} must be None, a name string"):
            rnn.Conv2d(4, 4, 3, choice=bad)
    with pytest.raises(ArgumentTypeError, match=r"backward_choice\[1\] must be"):
        rnn.Conv2d(4, 4, 3, backward_choice=("x64:gemm:jit", ...))
    with pytest.raises(ArgumentTypeError, match="^impl must be .*onednn.forward"), pytest.deprecated_call():
        rnn.Conv2d(4, 4, 3, impl=0)
    with pytest.raises(ArgumentTypeError, match="^choice must be .*onednn.forward"):
        rnn.ConvTranspose2d(4, 4, 3, choice=0)
    x, w = torch.randn(1, 4, 8, 8), torch.randn(4, 4, 3, 3)
    with pytest.raises(ArgumentTypeError, match="^impl must be .*positions are indices"), pytest.deprecated_call():
        rnn.conv(x, w, padding=1, impl=0)
    with pytest.raises(ArgumentTypeError, match="^choice must be"):
        rnn.conv_transpose(x, w, choice=...)
    import rawconv.ops
    with pytest.raises(ArgumentTypeError, match="^choice must be .*positions are indices .*onednn.forward"):
        rawconv.ops.conv(x, w, padding=1, choice=0)
    # what is accepted: a name, a listed row (as is), and positions in the backend function form
    rows = onednn.implementations(x, w, padding=1)
    ref = F.conv2d(x.double(), w.double(), padding=1)
    m = rnn.Conv2d(4, 4, 3, padding=1, bias=False, choice=rows[0])
    m.weight.data.copy_(w)
    assert m.choice is rows[0]
    with torch.no_grad():
        _close(m(x), ref)
        _close(rnn.conv(x, w, padding=1, choice="x64:gemm:jit"), ref)
    _close(onednn.forward(x, w, padding=1, impl=0), ref)


def test_backend_must_match_the_device():
    m = rnn.Conv2d(4, 4, 3)
    m.backend = "cudnn"
    with pytest.raises(ArgumentError, match="CUDA tensors"):
        m(torch.randn(1, 4, 8, 8))
    with pytest.raises(ArgumentError, match="CUDA tensors"):
        rnn.conv(torch.randn(1, 4, 8, 8), torch.randn(4, 4, 3, 3), backend="cudnn")
    with pytest.raises(ArgumentTypeError):
        rnn.conv([1.0], torch.randn(4, 4, 3, 3))


def test_moving_to_the_other_device_switches_backend_and_drops_foreign_choices():
    # built for cuDNN (explicit backend, pinned engine) while on the CPU, then .cpu(): the module
    # follows its device to oneDNN, and the cuDNN choice is dropped with a warning
    m = rnn.Conv2d(4, 4, 3, padding=1, backend="cudnn", choice="eng0")
    with pytest.warns(RuntimeWarning, match="dropped"):
        m.cpu()
    assert m.backend == "onednn" and m.choice is None
    x = torch.randn(1, 4, 6, 6)
    with torch.no_grad():
        _close(m(x), F.conv2d(x.double(), m.weight.double(), m.bias.double(), padding=1))
    # a choice made for the device the module is on survives moves that keep the device
    m2 = rnn.Conv2d(4, 4, 3, choice="x64:gemm:jit")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m2.float().cpu()
    assert m2.choice == "x64:gemm:jit" and m2.backend == "auto"


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("nd", [1, 2])
def test_padding_modes_pad_in_torch_then_convolve(mode, nd):
    torch.manual_seed(3)
    cls, _, tcls = CONV[nd]
    m = cls(3, 5, 3, padding=2 if mode != "reflect" else 1, padding_mode=mode, dilation=1)
    t = tcls(3, 5, 3, padding=2 if mode != "reflect" else 1, padding_mode=mode).double()
    t.load_state_dict(m.state_dict())
    x = torch.randn((2, 3) + (8,) * nd, requires_grad=True)
    y = m(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    x64 = x.detach().double().requires_grad_()
    y64 = t(x64)
    y64.backward(gy.double())
    _close(y, y64)
    _close(x.grad, x64.grad)
    _close(m.weight.grad, t.weight.grad)


@pytest.mark.parametrize("nd, stride, padding, output_padding, dilation, groups", [
    (1, 2, 1, 1, 1, 1), (2, 2, 1, 1, 1, 2), (2, 3, 0, 2, 1, 1), (2, 1, 2, 0, 2, 1), (3, 2, 1, 1, 1, 1)])
def test_transposed_modules_match_torch_autograd(nd, stride, padding, output_padding, dilation, groups):
    torch.manual_seed(nd + stride)
    cls, tfn, tcls = TRANSPOSED[nd]
    m = cls(4, 6, 3, stride=stride, padding=padding, output_padding=output_padding, dilation=dilation,
            groups=groups)
    assert isinstance(m, tcls)
    x = torch.randn((2, 4) + (5,) * nd, requires_grad=True)
    y = m(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    y64, gx64, gw64, gb64 = _grads64(
        lambda a, b_, c: tfn(a, b_, c, stride, padding, output_padding, groups, dilation), x, m.weight, m.bias, gy)
    for got, want in ((y, y64), (x.grad, gx64), (m.weight.grad, gw64), (m.bias.grad, gb64)):
        _close(got, want)


@pytest.mark.parametrize("nd, stride, padding, output_padding, dilation", [
    (1, 1, 0, 1, 2), (2, 1, 0, 2, 3), (2, 2, 0, 2, 3), (2, 1, 1, 2, 3), (3, 1, 2, 1, 2)])
@pytest.mark.parametrize("use_ops", [True, False])
def test_transposed_output_padding_up_to_the_dilation_matches_torch(nd, stride, padding, output_padding, dilation,
                                                                    use_ops, monkeypatch):
    """torch allows output_padding < max(stride, dilation): with output_padding >= stride the matching
    convolution's input is not the result's shape (rawconv raised 'grad_y must have shape ...' for a
    valid torch call). Positions no kernel tap reaches are zeros, then the bias."""
    monkeypatch.setattr(rnn, "USE_OPS", use_ops)
    torch.manual_seed(nd + output_padding)
    cls, tfn, _ = TRANSPOSED[nd]
    m = cls(4, 6, 3, stride=stride, padding=padding, output_padding=output_padding, dilation=dilation)
    x = torch.randn((2, 4) + (4,) * nd, requires_grad=True)
    y = m(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    y64, gx64, gw64, gb64 = _grads64(
        lambda a, b_, c: tfn(a, b_, c, stride, padding, output_padding, 1, dilation), x, m.weight, m.bias, gy)
    for got, want in ((y, y64), (x.grad, gx64), (m.weight.grad, gw64), (m.bias.grad, gb64)):
        _close(got, want)
    with torch.no_grad():
        _close(m(x[0]), y64[0])   # unbatched


def test_transposed_output_that_is_all_output_padding_raises_clearly():
    w = torch.randn(2, 3, 1)
    with pytest.raises(NotSupportedError, match="all output padding"):
        rnn.conv_transpose(torch.randn(1, 2, 1), w, padding=1, output_padding=2, dilation=3)


def test_compiled_transposed_modules_fullgraph_match_torch():
    """torch.compile(fullgraph=True) of a model with rawconv's transposed modules: they ran on the
    function forms (a C call on fake tensors; dynamo stopped at a lock in ConvProblem) instead of the
    operators with fake kernels; also with pinned backward choices and dynamic batch sizes."""
    torch.manual_seed(7)
    m = torch.nn.Sequential(rnn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1),
                            rnn.ConvTranspose2d(3, 2, 3, padding=0, output_padding=2, dilation=3,
                                                backward_choice=("x64:gemm:jit@any", "x64:gemm:jit@any")))
    t = torch.nn.Sequential(torch.nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1),
                            torch.nn.ConvTranspose2d(3, 2, 3, padding=0, output_padding=2, dilation=3)).double()
    t.load_state_dict(m.state_dict())
    torch._dynamo.reset()
    cm = torch.compile(m, fullgraph=True, backend="aot_eager", dynamic=True)
    for n in (2, 3):
        x = torch.randn(n, 4, 5, 6).to(memory_format=torch.channels_last).requires_grad_()
        y = cm(x)
        gy = torch.randn_like(y)
        y.backward(gy)
        x64 = x.detach().double().requires_grad_()
        y64 = t(x64)
        y64.backward(gy.double())
        _close(y, y64)
        _close(x.grad, x64.grad)
        assert y.is_contiguous(memory_format=torch.channels_last)
        for p, q in zip(m.parameters(), t.parameters()):
            _close(p.grad, q.grad, 1e-4)
            p.grad = q.grad = None
    torch._dynamo.reset()


def test_transposed_backward_choice_is_used():
    x = torch.randn(2, 4, 5, 5, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    y = rnn.conv_transpose(x, w, None, 2, 1, 1, backward_choice=("no-such-impl", "x64:gemm:jit@any"))
    with pytest.raises(NotSupportedError, match="no-such-impl"):
        y.sum().backward()


def test_transposed_output_size_channels_last_and_unbatched():
    torch.manual_seed(5)
    m = rnn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, bias=False)
    t = torch.nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, bias=False).double()
    t.load_state_dict(m.state_dict())
    x = torch.randn(2, 4, 6, 5)
    with torch.no_grad():
        y = m(x, output_size=[12, 10])     # output_padding (1, 1) from output_size, as torch
        _close(y, t(x.double(), output_size=[12, 10]))
        xc = x.to(memory_format=torch.channels_last)
        yc = m(xc)
        assert yc.is_contiguous(memory_format=torch.channels_last)
        _close(yc, t(x.double()))
        _close(m(x[0]), t(x[0].double()))   # unbatched
    with pytest.raises(ArgumentError, match="output_padding"):
        rnn.conv_transpose(x, m.weight, output_padding=2, stride=2)
    with pytest.raises(ArgumentError, match="channels"):
        rnn.conv_transpose(torch.randn(1, 5, 4, 4), m.weight)
    with pytest.raises(ArgumentError, match="bias"):
        rnn.conv_transpose(x, m.weight, torch.randn(7))


def test_transposed_choice_pins_a_backward_data_implementation():
    torch.manual_seed(6)
    x = torch.randn(2, 8, 6, 6)
    w = torch.randn(8, 4, 3, 3)
    ref = F.conv_transpose2d(x.double(), w.double(), stride=2, padding=1, output_padding=1)
    # the matching convolution: input of ref's shape, weight w, output of x's shape
    fake_x = torch.empty(ref.shape)
    names = [i.name for i in onednn.implementations(fake_x, w, stride=2, padding=1, direction="backward_data")]
    for name in dict.fromkeys(n for n in names if not n.startswith("ref")):
        y = rnn.conv_transpose(x, w, None, 2, 1, 1, choice=name)
        _close(y, ref)
    with pytest.raises(NotSupportedError, match="offered"):
        rnn.conv_transpose(x, w, None, 2, 1, 1, choice="no-such-impl")


def test_asymmetric_padding_gradients():
    x = torch.randn(1, 3, 12, 10, dtype=torch.float32, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    pad = [(0, 2), (1, 0)]
    y = rnn.conv(x, w, padding=pad)
    gy = torch.randn_like(y)
    y.backward(gy)
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    F.conv2d(F.pad(x64, (1, 0, 0, 2)), w64).backward(gy.double())
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.double(), w64.grad, rtol=1e-5, atol=1e-5)


def test_module_double_backward_matches_float64():
    """A gradient penalty through a module (issue 13: double backward was silently zero): the
    module runs the rawconv operators, whose backward passes are differentiable."""
    torch.manual_seed(3)
    m = rnn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    (gx,) = torch.autograd.grad(m(x).pow(2).sum(), x, create_graph=True)
    assert gx.requires_grad
    (dw,) = torch.autograd.grad(gx.pow(2).sum(), m.weight)
    x64 = x.detach().double().requires_grad_()
    w64, b64 = m.weight.detach().double().requires_grad_(), m.bias.detach().double()
    (gx64,) = torch.autograd.grad(F.conv2d(x64, w64, b64, padding=1).pow(2).sum(), x64, create_graph=True)
    (dw64,) = torch.autograd.grad(gx64.pow(2).sum(), w64)
    assert dw64.abs().max() > 1
    torch.testing.assert_close(dw.double(), dw64, rtol=1e-4, atol=1e-4 * float(dw64.abs().max()))


# ---------------------------------------------------------------- GPU (the lead runs these on the device machine)
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_cuda_modules_match_float64(layout):
    torch.manual_seed(7)
    m = rnn.Conv2d(8, 16, 3, padding=1, stride=2).cuda()
    assert m.backend == "auto"
    x = torch.randn(2, 8, 12, 12, device="cuda")
    if layout == "nhwc":
        x = x.to(memory_format=torch.channels_last)
        m = m.to(memory_format=torch.channels_last)
    x.requires_grad_()
    y = m(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    y64, gx64, gw64, gb64 = _grads64(lambda a, b_, c: F.conv2d(a, b_, c, stride=2, padding=1), x.cpu(),
                                     m.weight.cpu(), m.bias.cpu(), gy.cpu())
    for got, want in ((y, y64), (x.grad, gx64), (m.weight.grad, gw64), (m.bias.grad, gb64)):
        _close(got.cpu(), want)


@pytest.mark.gpu
def test_cuda_move_switches_an_explicit_onednn_module_to_cudnn():
    m = rnn.Conv2d(4, 4, 3, padding=1, backend="onednn", choice="x64:gemm:jit")
    with pytest.warns(RuntimeWarning, match="dropped"):
        m.cuda()
    assert m.backend == "cudnn" and m.choice is None
    x = torch.randn(1, 4, 6, 6, device="cuda")
    with torch.no_grad():
        _close(m(x).cpu(), F.conv2d(x.cpu().double(), m.weight.cpu().double(), m.bias.cpu().double(), padding=1))


@pytest.mark.gpu
def test_cuda_transposed_matches_float64():
    torch.manual_seed(8)
    m = rnn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1).cuda()
    x = torch.randn(2, 4, 7, 7, device="cuda", requires_grad=True)
    y = m(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    y64, gx64, gw64, gb64 = _grads64(lambda a, b_, c: F.conv_transpose2d(a, b_, c, 2, 1, 1), x.cpu(),
                                     m.weight.cpu(), m.bias.cpu(), gy.cpu())
    for got, want in ((y, y64), (x.grad, gx64), (m.weight.grad, gw64), (m.bias.grad, gb64)):
        _close(got.cpu(), want)


def test_module_argument_pack_follows_attribute_changes():
    """A module keeps its checked argument pack per configuration: changing stride, padding,
    dilation, the weight (in place or replaced by another shape), choice or precision after calls
    gives the new configuration's result or its clear error, never the old pack's."""
    import torch.nn.functional as F

    from rawconv.errors import ArgumentError, ArgumentTypeError

    torch.manual_seed(0)
    m = rnn.Conv2d(4, 6, 3, padding=1)
    x = torch.randn(2, 4, 9, 9)

    def check():
        want = F.conv2d(x.double(), m.weight.double(), m.bias.double(), m.stride, m.padding, m.dilation, m.groups)
        torch.testing.assert_close(m(x).double(), want, rtol=1e-4, atol=1e-4)
    for _ in range(2):
        check()
    m.stride = (2, 2)
    check()
    m.padding = (0, 1)
    check()
    m.dilation = (2, 1)
    check()
    with torch.no_grad():
        m.weight.mul_(-2)
    check()
    m.weight = torch.nn.Parameter(torch.randn(6, 4, 1, 1))
    m.kernel_size = (1, 1)
    check()
    m.choice = 3
    with pytest.raises(ArgumentTypeError, match="position"):
        m(x)
    m.choice = None
    m.precision = "bogus"
    with pytest.raises(ArgumentError, match="precision"):
        m(x)
    m.precision = "strict"
    check()
