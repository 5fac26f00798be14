"""The fused operator's direct path (``torch.ops.rawconv.conv_bias_act``): its Autograd kernel calls the
Python kernel itself when nothing needs autograd and nothing sits between Autograd and the backend
(rawconv.pytorch.fused._direct), and takes torch's generated path otherwise. Each test checks which
path ran (a spy on ``_direct``) and what it computed (float64 references, or torch's generated path
on the same arguments: the same kernel, so the same bits)."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import rawconv.fused as fu
import rawconv.nn as rnn
from rawconv.errors import NotSupportedError
from rawconv.pytorch import autocast as _autocast
from rawconv.pytorch import fused as _fused_mod

pytestmark = pytest.mark.usefixtures("dnnl")
OP = torch.ops.rawconv.conv_bias_act.default


@pytest.fixture
def spy(monkeypatch):
    """The answers of ``_direct`` during the test (True: the kernel was called directly)."""
    seen = []
    real = _fused_mod._direct

    def recording(keyset, args, *more):
        ok = real(keyset, args, *more)
        seen.append(ok)
        return ok
    monkeypatch.setattr(_fused_mod, "_direct", recording)
    return seen


def _generic(monkeypatch, fn):
    """``fn()`` with the direct path switched off (torch's generated Autograd kernel, then the backend)."""
    with monkeypatch.context() as mp:
        mp.setattr(_fused_mod, "_direct", lambda keyset, args, *more: False)
        return fn()


def _inputs(seed=0, layout=torch.channels_last, residual=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 6, 9, 8, generator=g).contiguous(memory_format=layout)
    w = torch.randn(10, 6, 3, 3, generator=g)
    b = torch.randn(10, generator=g)
    r = torch.randn(2, 10, 9, 8, generator=g) if residual else None
    return x, w, b, r


def _args(x, w, b, r, act="relu"):
    return (x, w, b, r, [1, 1], [1, 1], [1, 1], 1, act, "auto", None, "strict")


def _ref(x, w, b, r):
    y = F.conv2d(x.double(), w.double(), b.double(), padding=1)
    return torch.relu(y + r.double() if r is not None else y)


def _close(got, want, rel=2e-5):
    assert got.shape == want.shape
    err = (got.detach().double() - want).abs().max().item()
    assert err <= rel * max(want.abs().max().item(), 1.0), err


@pytest.mark.parametrize("layout", [torch.channels_last, torch.contiguous_format])
@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("grad_mode", [False, True])
def test_direct_path_gives_torchs_paths_result_in_the_same_layout(spy, monkeypatch, layout, residual, grad_mode):
    x, w, b, r = _inputs(1, layout, residual)
    with torch.set_grad_enabled(grad_mode):   # grad mode on, nothing requires grad: no autograd either
        y = OP(*_args(x, w, b, r))
        assert spy == [True]
        y_generic = _generic(monkeypatch, lambda: OP(*_args(x, w, b, r)))
    assert not y.requires_grad and y.grad_fn is None
    assert torch.equal(y, y_generic) and y.stride() == y_generic.stride()
    assert y.is_contiguous(memory_format=layout)
    assert y.data_ptr() not in [t.data_ptr() for t in (x, w, b, r) if t is not None]   # a new tensor, as torch's
    _close(y, _ref(x, w, b, r))


def test_frozen_modules_buffers_take_the_direct_path_and_follow_their_sources(spy):
    torch.manual_seed(2)
    net = torch.nn.Sequential(torch.nn.Conv2d(6, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).eval()
    with torch.no_grad():
        net[1].running_mean.uniform_(-1, 1)
        net[1].running_var.uniform_(0.5, 2)
    m = rnn.convert(net, fuse=True)
    fm = next(mm for mm in m.modules() if fu.FROZEN_WEIGHT in mm._buffers)
    x = torch.randn(1, 6, 8, 8).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        m(x)
        W, B = fm._buffers[fu.FROZEN_WEIGHT], fm._buffers[fu.FROZEN_BIAS]
        y = OP(*_args(x, W, B, None))
        assert spy and all(spy)
        torch.testing.assert_close(y, net(x), rtol=1e-4, atol=1e-4)
        fm.weight.mul_(2)   # a source changed in place: the snapshot is taken again at the next call
        y2 = OP(*_args(x, W, B, None))
        want = torch.relu(net[1](F.conv2d(x, fm.weight, fm.bias, padding=1)))
    torch.testing.assert_close(y2, want, rtol=1e-4, atol=1e-4)
    assert (y2 - y).abs().max() > 0.1


def test_requires_grad_takes_torchs_path_and_gradients_match_float64(spy):
    x, w, b, r = _inputs(3, torch.channels_last)
    leaves = [t.clone().requires_grad_() for t in (x, w, b, r)]
    y = OP(*_args(*leaves))
    assert spy == [False] and y.grad_fn is not None
    gy = torch.randn_like(y)
    y.backward(gy)
    ref = [t.detach().double().requires_grad_() for t in (x, w, b, r)]
    y64 = torch.relu(F.conv2d(ref[0], ref[1], ref[2], padding=1) + ref[3])
    y64.backward(gy.double())
    _close(y, y64.detach())
    for got, want in zip(leaves, ref):
        _close(got.grad, want.grad)
    # one tensor that requires grad is enough to need autograd; under no_grad none does
    wg = w.clone().requires_grad_()
    assert OP(*_args(x, wg, b, r)).grad_fn is not None and spy[-1] is False
    with torch.no_grad():
        assert OP(*_args(x, wg, b, r)).grad_fn is None and spy[-1] is True


def test_autocast_is_honoured_on_the_direct_path(spy, monkeypatch):
    x, w, b, r = _inputs(4, torch.channels_last, residual=False)
    _autocast._warned.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # (where oneDNN has no bfloat16 convolution: said once)
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
            y = OP(*_args(x, w, b, None))
            y_generic = _generic(monkeypatch, lambda: OP(*_args(x, w, b, None)))
            y_plain = fu.conv_bias_act(x, w, b, padding=1)
    assert spy and spy[0] is True
    assert y.dtype == y_generic.dtype == y_plain.dtype
    assert torch.equal(y, y_generic)
    if y.dtype == torch.bfloat16:   # the inputs were cast: the result of bfloat16-rounded inputs
        r16 = lambda t: t.to(torch.bfloat16).double()  # noqa: E731
        want = torch.relu(F.conv2d(r16(x), r16(w), r16(b), padding=1))
        torch.testing.assert_close(y.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
    else:
        assert y.dtype == torch.float32
        _close(y, _ref(x, w, b, None))


def test_torch_compile_fullgraph_traces_with_fake_tensors_then_runs_directly(spy):
    x, w, b, r = _inputs(5, torch.channels_last)

    def f(x, w, b, r):
        return OP(*_args(x, w, b, r)) * 2

    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        y0 = cf(x, w, b, r)   # traced with fake tensors (the Python key): torch's path to the fake kernel
        assert False in spy
        del spy[:]
        y = cf(x, w, b, r)
    assert spy == [True]   # the compiled graph's call on real tensors (its first run may be under a mode)
    assert torch.equal(y, y0)
    _close(y, 2 * _ref(x, w, b, r))


def test_torch_func_and_forward_ad_are_still_refused(spy):
    x, w, b, r = _inputs(6, torch.contiguous_format)
    with pytest.raises(NotSupportedError, match="torch.func"):
        torch.func.grad(lambda t: OP(*_args(t, w, b, r)).sum())(x)
    with pytest.raises(NotSupportedError, match="forward-mode"):
        torch.func.jvp(lambda t: OP(*_args(t, w, b, r)), (x,), (torch.ones_like(x),))
    import torch.autograd.forward_ad as fwad

    with torch.no_grad(), fwad.dual_level():
        dual = fwad.make_dual(x, torch.ones_like(x))
        with pytest.raises(NotSupportedError, match="forward-mode"):
            OP(*_args(dual, w, b, r))
    assert True not in spy   # never the direct path under a transform


def test_vmap_runs_per_sample_on_plain_slices(spy, monkeypatch):
    # torch's batching fallback unwraps the batched tensors and calls the operator once per sample on
    # plain tensors, with the functorch layer set aside: the direct path then does what torch's would
    x, w, b, r = _inputs(7, torch.contiguous_format)
    f = torch.func.vmap(lambda t, s: OP(*_args(t[None], w, b, s[None]))[0])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # (torch: no batching rule, the per-sample fallback)
        y = f(x, r)
        y_generic = _generic(monkeypatch, lambda: f(x, r))
    assert len(spy) == x.shape[0]
    assert torch.equal(y, y_generic)
    _close(y, _ref(x, w, b, r))


def test_a_torch_dispatch_mode_sees_the_operator(spy):
    x, w, b, r = _inputs(8, torch.channels_last)
    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Log():
        y = OP(*_args(x, w, b, r))
    assert OP in seen and spy[0] is False
    _close(y, _ref(x, w, b, r))


class _Logged(torch.Tensor):
    """A wrapper subclass that records every operator that reaches its ``__torch_dispatch__``."""
    seen: list = []

    @staticmethod
    def __new__(cls, t):
        return torch.Tensor._make_wrapper_subclass(cls, t.shape, strides=t.stride(), dtype=t.dtype, device=t.device)

    def __init__(self, t):
        self.t = t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(func)
        unwrap = lambda a: a.t if isinstance(a, _Logged) else a  # noqa: E731
        out = func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})
        return _Logged(out) if isinstance(out, torch.Tensor) else out


def test_a_tensor_subclass_gets_its_dispatch(spy):
    x, w, b, r = _inputs(9, torch.channels_last)
    _Logged.seen = []
    with torch.no_grad():
        y = OP(*_args(_Logged(x), w, b, r))
    assert isinstance(y, _Logged) and OP in _Logged.seen and spy[0] is False
    _close(y.t, _ref(x, w, b, r))
    # a subclass without __torch_dispatch__ (a Parameter) is no plain tensor either: torch's path, same result
    with torch.no_grad():
        yp = OP(*_args(torch.nn.Parameter(x, requires_grad=False), w, b, r))
    assert spy[-1] is False
    _close(yp, _ref(x, w, b, r))


def test_a_kernel_disabled_or_registered_elsewhere_takes_torchs_path(spy):
    x, w, b, r = _inputs(10, torch.contiguous_format)
    with torch.no_grad():
        with fu._conv_bias_act_op.set_kernel_enabled("cpu", False):
            y = OP(*_args(x, w, b, r))
        assert spy[-1] is False
        y2 = OP(*_args(x, w, b, r))
        assert spy[-1] is True
    assert torch.equal(y, y2)


RES_OP = torch.ops.rawconv.conv_bias_act_residual_.default


@pytest.mark.parametrize("layout", [torch.channels_last, torch.contiguous_format])
def test_inplace_residual_operator_direct_path_writes_and_bumps_the_version_as_torchs(spy, monkeypatch, layout):
    x, w, b, r = _inputs(11, layout)
    want = _ref(x, w, b, r)
    r1, r2 = r.clone(), r.clone()
    with torch.no_grad():
        v1 = r1._version
        assert RES_OP(*_args(x, w, b, r1)) is None
        assert spy == [True]
        v2 = r2._version
        _generic(monkeypatch, lambda: RES_OP(*_args(x, w, b, r2)))
    assert torch.equal(r1, r2)
    _close(r1, want)
    assert r1._version - v1 == r2._version - v2 > 0   # readers of the residual see it changed, as on torch's path


def test_inplace_residual_operator_keeps_its_refusals_and_modes(spy):
    x, w, b, r = _inputs(12, torch.contiguous_format)
    with pytest.raises(NotSupportedError, match="records no gradient"):
        RES_OP(*_args(x, w.clone().requires_grad_(), b, r.clone()))
    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    r1 = r.clone()
    with torch.no_grad(), Log():
        RES_OP(*_args(x, w, b, r1))
    assert RES_OP in seen and spy == [False]
    _close(r1, _ref(x, w, b, r))
