"""Autocast on rawconv's operators (issue 22): under ``torch.autocast("cpu", dtype)`` rawconv's
convolutions (the operators, ``rawconv.ops``, the modules, the fused operator, compiled code) cast
their floating-point inputs to the autocast dtype as torch's convolutions do, where oneDNN offers
that dtype on this CPU; where it does not (oneDNN 3.2 on AVX2 has no bfloat16 convolution), they keep
the inputs' dtype and say so once with a RuntimeWarning. CUDA: tests/test_modes_gpu.py."""
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


def _offered(dtype) -> bool:
    return onednn.capabilities().offered("forward", str(dtype)[len("torch."):])


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 8, 10, 10, generator=g)
    w = torch.randn(16, 8, 3, 3, generator=g)
    b = torch.randn(16, generator=g)
    return x, w, b


def _ref(x, w, b, dtype):
    """float64 convolution of the inputs rounded to ``dtype`` (what a ``dtype`` kernel computes)."""
    r = lambda t: t.to(dtype).double()  # noqa: E731
    return F.conv2d(r(x), r(w), r(b), padding=1)


@pytest.fixture(autouse=True)
def _fresh_warnings():
    _autocast._warned.clear()
    yield


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_entry_point_follows_cpu_autocast(dtype):
    x, w, b = _inputs()
    m = rnn.Conv2d(8, 16, 3, padding=1)
    with torch.no_grad():
        m.weight.copy_(w)
        m.bias.copy_(b)
    calls = {
        "operator": lambda: torch.ops.rawconv.conv_forward(x, w, b, [1, 1], [1, 1], [1, 1], [1, 1], 1, "auto", "",
                                                           "strict", "", ""),
        "rawconv.ops.conv": lambda: ops.conv(x, w, b, padding=1),
        "module": lambda: m(x),
        "fused": lambda: fused.conv_bias_act(x, w, b, padding=1, activation="none"),
    }
    offered = _offered(dtype)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with torch.autocast("cpu", dtype=dtype), torch.no_grad():
            out = {k: f() for k, f in calls.items()}
    said = [r for r in rec if issubclass(r.category, RuntimeWarning) and "autocast" in str(r.message)]
    if offered:
        assert not said
        ref = _ref(x, w, b, dtype)
        for k, y in out.items():
            assert y.dtype == dtype, k
            torch.testing.assert_close(y.double(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item(), msg=k)
    else:
        assert said and "computes in float32" in str(said[0].message)
        ref = F.conv2d(x.double(), w.double(), b.double(), padding=1)
        for k, y in out.items():
            assert y.dtype == torch.float32, k
            torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=1e-4, msg=k)
    # outside autocast: float32 again, no cast
    with torch.no_grad():
        assert ops.conv(x, w, b, padding=1).dtype == torch.float32


def test_autocast_casts_as_torch_does():
    """torch's rule: floating tensors of the autocast device are cast, float64 never, others as they are."""
    a = torch.ones(3)
    assert _autocast._cast(a, torch.bfloat16, "cpu").dtype == torch.bfloat16
    assert _autocast._cast(a.double(), torch.bfloat16, "cpu").dtype == torch.float64
    assert _autocast._cast(a, torch.bfloat16, "cuda") is a   # a CPU tensor under CUDA autocast: as it is
    assert _autocast._cast(a.long(), torch.bfloat16, "cpu").dtype == torch.int64
    assert _autocast._cast("strict", torch.bfloat16, "cpu") == "strict"


def test_autocast_training_step_gradients():
    """Backward under autocast: the parameters (float32) get float32 gradients through the cast, equal
    to torch's autocast gradients within the autocast dtype's tolerance (or to float32's where oneDNN
    has no such convolution here)."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3))
    model = rnn.convert(base, inplace=False)
    x = torch.randn(2, 3, 12, 12)
    dtype = torch.bfloat16
    offered = _offered(dtype)
    grads = {}
    for name, m in (("torch", base), ("rawconv", model)):
        m.zero_grad()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            with torch.autocast("cpu", dtype=dtype, enabled=name == "rawconv" or offered):
                y = m(x)
        y.float().square().sum().backward()
        grads[name] = [p.grad for p in m.parameters()]
        assert all(g.dtype == torch.float32 for g in grads[name])
    tol = 5e-2 if offered else 1e-4
    for a, b in zip(grads["torch"], grads["rawconv"]):
        assert ((a - b).abs().max() / a.abs().max()).item() < tol


def test_compiled_code_casts_as_eager():
    x, w, b = _inputs()
    fn = torch.compile(lambda x, w, b: ops.conv(x, w, b, padding=1), backend="aot_eager", fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
            ye = ops.conv(x, w, b, padding=1)
            yc = fn(x, w, b)
    assert yc.dtype == ye.dtype
    torch.testing.assert_close(yc, ye)


@pytest.mark.parametrize("grad", [False, True])
def test_direct_path_casts_without_the_dispatcher(monkeypatch, grad):
    """Under autocast the modules and rawconv.ops.conv cast the inputs themselves and call the
    kernel (or the autograd Function) directly, as the operator's autocast kernel would have cast
    them: the same dtype and values as the operator, and no call through it."""
    x, w, b = _inputs(3)
    m = rnn.Conv2d(8, 16, 3, padding=1)
    with torch.no_grad():
        m.weight.copy_(w)
        m.bias.copy_(b)
    m.requires_grad_(grad)
    dtype = torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with torch.autocast("cpu", dtype=dtype):
            want = ops._fwd_op(x, w, b, [1, 1], [1, 1], [1, 1], [1, 1], 1, "auto", "", "strict", "", "")

        def refuse(*a):
            raise AssertionError("the direct path went through the operator")
        monkeypatch.setattr(ops, "_fwd_call", refuse)
        with torch.autocast("cpu", dtype=dtype):
            got_m = m(x)
            got_f = ops.conv(x, w, b, padding=1)
    for got in (got_m, got_f):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    if grad:
        assert type(got_m.grad_fn).__name__ == "RawconvConvForwardBackward"
        got_m.float().sum().backward()
        assert m.weight.grad.dtype == torch.float32 and m.weight.grad.abs().sum() > 0
