"""Autocast's edge cases (adversarial findings of 2026-12-03, each failed before its fix): an input
already in the lower dtype, transposed convolutions with a bias, the result dtype where the dtype is
offered, CUDA's autocast dtype kept, the first call under torch.compile."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import rawconv.fused as fused
import rawconv.nn as rnn
import rawconv.ops as ops
from rawconv import onednn
from rawconv.pytorch import autocast as _autocast


def _offered(direction: str, dtype) -> bool:
    return onednn.capabilities().offered(direction, str(dtype)[len("torch."):])


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


@pytest.fixture()
def _quiet_autocast():
    _autocast._warned.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


@pytest.mark.usefixtures("_quiet_autocast")
def test_autocast_input_already_in_the_lower_dtype():
    """Under torch.autocast('cpu', bfloat16) a convolution's input often comes out of an earlier
    autocast op (a Linear, torch's own conv) in bfloat16 while the weights are float32: torch casts
    both; rawconv raised 'x and w must have the same dtype' where oneDNN has no bfloat16
    convolution (the kernel kept the inputs' dtypes, which differ). Now: the autocast dtype where
    oneDNN offers it, else float32 for every input (what the warning says)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 7, 7, generator=g).bfloat16()
    w, b = torch.randn(6, 4, 3, 3, generator=g), torch.randn(6, generator=g)
    m = rnn.Conv2d(4, 6, 3, padding=1)
    with torch.no_grad():
        m.weight.copy_(w)
        m.bias.copy_(b)
    offered = _offered("forward", torch.bfloat16)
    want = torch.bfloat16 if offered else torch.float32
    ref = F.conv2d(x.double(), w.bfloat16().double() if offered else w.double(),
                   b.bfloat16().double() if offered else b.double(), padding=1)
    tol = 2e-2 if offered else 1e-5
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outs = {"operator": torch.ops.rawconv.conv_forward(x, w, b, [1, 1], [1, 1], [1, 1], [1, 1], 1, "auto", "",
                                                           "strict", "", ""),
                "ops.conv": ops.conv(x, w, b, padding=1),
                "module": m(x),
                "fused": fused.conv_bias_act(x, w, b, padding=1, activation="none"),
                "fused residual": fused.conv_bias_act(x.float(), w, b, torch.zeros(2, 6, 7, 7).bfloat16(), padding=1,
                                                      activation="none"),
                "conv_backward_data": ops.conv_backward_data(ref.bfloat16(), w, (2, 4, 7, 7), padding=1)}
    for k, y in outs.items():
        assert y.dtype == want, k
        if k != "conv_backward_data":
            assert _rel(y, ref) < tol, k
    dx = F.conv_transpose2d(ref.bfloat16().double(), w.bfloat16().double() if offered else w.double(), padding=1)
    assert _rel(outs["conv_backward_data"], dx) < tol


@pytest.mark.usefixtures("_quiet_autocast")
def test_autocast_conv_transpose_with_bias_and_lower_dtype_input():
    """ops.conv_transpose / nn.ConvTranspose2d checked the bias against x's dtype before autocast
    cast anything: a bfloat16 x (from an earlier autocast op) with the module's float32 bias raised
    'bias must be a (K,) tensor of the input's dtype'; torch casts all three."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 5, 5, generator=g).bfloat16()
    m = rnn.ConvTranspose2d(4, 6, 3, stride=2)
    offered = _offered("backward_data", torch.bfloat16)
    r = (lambda t: t.bfloat16().double()) if offered else (lambda t: t.double())
    ref = F.conv_transpose2d(x.double(), r(m.weight.detach()), r(m.bias.detach()), stride=2)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        ys = [m(x), ops.conv_transpose(x, m.weight, m.bias, stride=2)]
    for y in ys:
        assert y.dtype == (torch.bfloat16 if offered else torch.float32)
        assert _rel(y, ref) < (2e-2 if offered else 1e-5)


def test_autocast_conv_transpose_result_dtype_where_the_dtype_is_offered(monkeypatch):
    """Where the library runs the autocast dtype (a CPU with bfloat16 convolutions; CUDA), torch's
    conv_transpose gives that dtype; rawconv's added the float32 bias to it after the operator, and
    the sum came out float32. Checked with fake tensors (no library call) and the capability
    answer set to 'offered'."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setitem(_autocast._offered, ("backward_data", torch.bfloat16), (True, ""))
    with FakeTensorMode():
        x, w, b = torch.randn(2, 4, 5, 5), torch.randn(4, 6, 3, 3), torch.randn(6)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = ops.conv_transpose(x, w, b, stride=2)
            yt = F.conv_transpose2d(x, w, b, stride=2)
    assert yt.dtype == torch.bfloat16
    assert y.dtype == yt.dtype and y.shape == yt.shape


@pytest.mark.gpu
def test_autocast_cuda_conv_transpose_keeps_the_autocast_dtype():
    """CUDA: nn.ConvTranspose2d under autocast gives float16 (torch's), not float32 from the bias add."""
    m = rnn.ConvTranspose2d(4, 6, 3, stride=2).cuda()
    t = torch.nn.ConvTranspose2d(4, 6, 3, stride=2).cuda()
    t.load_state_dict(m.state_dict())
    x = torch.randn(2, 4, 5, 5, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16), torch.no_grad():
        y, yt = m(x), t(x)
        y2 = m(x.half())
    assert yt.dtype == torch.float16 and y.dtype == torch.float16 and y2.dtype == torch.float16
    assert _rel(y, yt.double()) < 1e-2 and _rel(y2, yt.double()) < 1e-2


@pytest.mark.usefixtures("_quiet_autocast")
def test_autocast_first_call_under_torch_compile(monkeypatch):
    """The autocast kernels ask oneDNN once which dtypes it offers; when that first question came
    while torch.compile traced (fake tensors), the probe's own convolutions failed, the failure was
    cached as 'offered', and the compiled model cast to bfloat16 and raised NotSupportedError at
    run time on a CPU without bfloat16 convolutions (eager first: right)."""
    monkeypatch.setattr(_autocast, "_offered", {})
    torch._dynamo.reset()
    torch.manual_seed(3)
    c = rnn.Conv2d(4, 6, 3, padding=1)
    t = rnn.ConvTranspose2d(6, 4, 3, stride=2)
    fn = torch.compile(lambda x: t(c(x)), backend="aot_eager", fullgraph=True)
    x = torch.randn(2, 4, 5, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        y = fn(x)
    torch._dynamo.reset()
    offered = [_offered(d, torch.bfloat16) for d in ("forward", "backward_data")]
    assert _autocast._offered[("forward", torch.bfloat16)][0] == offered[0]
    assert _autocast._offered[("backward_data", torch.bfloat16)][0] == offered[1]
    if not any(offered):
        assert y.dtype == torch.float32
        p = lambda q: q.detach().double()  # noqa: E731
        ref = F.conv_transpose2d(F.conv2d(x.double(), p(c.weight), p(c.bias), padding=1), p(t.weight), p(t.bias),
                                 stride=2)
        assert _rel(y, ref) < 1e-5
    else:
        assert y.dtype == torch.bfloat16
