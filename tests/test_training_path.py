"""The modules' training path (issue 22): a converted module called with grad applies one autograd
Function whose backward calls the backward kernels directly (rawconv.ops._direct_backward). What a
breaker found around it, each checked against torch's own modules: torch's non-reentrant
checkpoint and a caller's saved-tensor hooks see their own exceptions; a backward called under
autocast (with or without create_graph) stays in the forward's dtype, as torch's; a module's
padding given as pairs with a list inside follows that list's in-place changes."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import rawconv.nn as rnn
from rawconv.errors import RawconvError


def _pair(seed=0, **kw):
    torch.manual_seed(seed)
    t = torch.nn.Conv2d(4, 4, 3, padding=1, **kw)
    return t, rnn.convert(copy.deepcopy(t))


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_of_converted_convolutions_gives_torchs_gradients(use_reentrant):
    grads = []
    for m in _pair():
        x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
        checkpoint(lambda t, m=m: m(m(t)), x, use_reentrant=use_reentrant).square().sum().backward()
        grads.append((x.grad, m.weight.grad, m.bias.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


def test_a_saved_tensor_hooks_own_error_reaches_the_caller_as_it_is():
    class PackError(Exception):
        pass

    def pack(t):
        raise PackError("from the caller's pack hook")
    for m in _pair():
        x = torch.randn(1, 4, 8, 8, requires_grad=True)
        with pytest.raises(PackError) as ei, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            m(x)
        assert not isinstance(ei.value, RawconvError)



def test_a_pack_hooks_error_passes_through_a_python_function_apply(monkeypatch):
    """torch before 2.14 applies an autograd Function through a Python ``Function.apply`` (a frame
    of torch's between rawconv's call and the caller's hook): the hook's error still passes as it is."""
    from rawconv.pytorch import ops

    class PackError(Exception):
        pass

    def pack(t):
        raise PackError("from the caller's pack hook")
    real = ops._FwdFn.apply
    space = {"__name__": "torch.autograd.function", "real": real}
    exec("def apply(*args):\n    return real(*args)\n", space)   # a frame of torch's, as 2.11's apply
    monkeypatch.setattr(ops._FwdFn, "apply", staticmethod(space["apply"]))
    for use_ops in (True, False):
        x = torch.randn(1, 4, 8, 8, requires_grad=True)
        m = _pair()[1]
        call = (lambda: ops.conv(x, m.weight, m.bias, padding=1)) if use_ops else (lambda: m(x))
        with pytest.raises(PackError), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            call()


@pytest.mark.parametrize("create_graph", [False, True])
def test_a_backward_under_autocast_stays_in_the_forwards_dtype(create_graph):
    """The forward in float32 outside autocast, then autograd.grad inside a bfloat16 autocast block:
    torch's convolution backward has no autocast rule, so the gradients are float32's exactly."""
    want = got = None
    for m in _pair(3):
        x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(2), requires_grad=True)
        y = m(x)
        plain = torch.autograd.grad(y.square().sum(), (x, m.weight), retain_graph=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            cast = torch.autograd.grad(y.square().sum(), (x, m.weight), create_graph=create_graph)
        for a, b in zip(plain, cast):
            assert b.dtype == torch.float32
            torch.testing.assert_close(b, a, rtol=0, atol=0)
        want, got = (plain if want is None else want), plain
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


def test_padding_pairs_with_a_list_inside_follow_its_changes():
    m = rnn.Conv2d(3, 6, 3)
    inner = [1, 1]
    m.padding = ((1, 1), inner)
    x = torch.randn(2, 3, 9, 9)
    assert tuple(m(x).shape) == (2, 6, 9, 9)
    inner[1] = 3
    assert tuple(m(x).shape) == (2, 6, 9, 11)


@pytest.mark.parametrize("bias", [False, True])
def test_onednn_backward_hot_path_equals_the_checked_path(bias):
    """A oneDNN backward plan's hot path (rawconv.onednn.Convolution._grad_hot_run, taken by the
    operators' CPU backward kernels after a first checked call) gives the checked path's dx, dw
    and db, reads the tensors as they are on every call, and declines tensors whose metadata
    differ (the checked path then restrides them)."""
    from rawconv import onednn

    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 4, 7, 7, generator=g).contiguous(memory_format=torch.channels_last)
    w = torch.randn(6, 4, 3, 3, generator=g).contiguous(memory_format=torch.channels_last)
    gy = torch.randn(2, 6, 7, 7, generator=g).contiguous(memory_format=torch.channels_last)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    b64 = torch.zeros(6, dtype=torch.float64, requires_grad=True) if bias else None

    def want():
        for t in (x64, w64, b64):
            if t is not None:
                t.grad = None
        with torch.no_grad():
            x64.copy_(x)
            w64.copy_(w)
        torch.nn.functional.conv2d(x64, w64, b64, padding=1).backward(gy.double())
        return x64.grad, w64.grad, (b64.grad if bias else None)

    import rawconv
    from rawconv import ops

    rawconv.clear_caches()   # fresh plans (the ones below are cached by problem)
    one = [1, 1]   # the plans the operators' CPU backward kernels make
    bd = ops._backward_data_plan(gy, w, list(x.shape), one, one, one, one, 1, "", "strict")
    assert bd._grad_hot_run(gy, w) is None   # no pack before a checked call
    dx0 = bd.execute(grad_y=gy, w=w)
    prob = ops._backward_weights_problem(x, gy, list(w.shape), one, one, one, one, 1, bias)
    bw = onednn.cached_plan(prob, "backward_weights", "direct", "strict", prob.layout, None)
    r0 = bw.execute(x, grad_y=gy)
    for step in range(3):
        dx = bd._grad_hot_run(gy, w)
        r = bw._grad_hot_run(x, gy)
        assert dx is not None and r is not None
        dw, db = r if bias else (r, None)
        wx, ww, wb = want()
        torch.testing.assert_close(dx.double(), wx, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(dw.double(), ww, rtol=1e-4, atol=1e-3)
        assert dx.stride() == dx0.stride() and dw.stride() == (r0[0] if bias else r0).stride()
        if bias:
            torch.testing.assert_close(db.double(), wb, rtol=1e-4, atol=1e-3)
        with torch.no_grad():   # read on every call
            gy.mul_(-0.5)
            x.add_(1.0)
            w.mul_(2.0)
    assert bd._grad_hot_run(gy.contiguous(), w) is None   # other strides: the checked path's to restride
    assert bw._grad_hot_run(x, gy.double()) is None
    torch.testing.assert_close(bd.execute(grad_y=gy.contiguous(), w=w), bd._grad_hot_run(gy, w))


@pytest.mark.parametrize("bias", [False, True])
def test_converted_modules_cpu_backward_keeps_its_plans_and_stays_right(bias):
    """A converted module's CPU backward runs the backward plans its entry kept from the last
    backward in that thread (their hot paths on the incoming gradient as it is): every backward
    below, with the gradient in the forward's layout, in NCHW, expanded, from another thread, and
    on an empty batch, gives float64's dx, dw and db, in torch's layouts."""
    import threading

    torch.manual_seed(7)
    t = torch.nn.Conv2d(4, 6, 3, padding=1, bias=bias).to(memory_format=torch.channels_last)
    m = rnn.convert(copy.deepcopy(t))
    t64 = copy.deepcopy(t).double()

    def check(x, gy):
        for mod, xin, gin in ((m, x, gy), (t64, x.detach().double(), gy.double())):
            xin = xin.detach().requires_grad_()
            mod.zero_grad(set_to_none=True)
            mod(xin).backward(gin)
            if mod is m:
                got = (xin.grad, m.weight.grad, m.bias.grad if bias else None)
            else:
                want = (xin.grad, t64.weight.grad, t64.bias.grad if bias else None)
        for a, b in zip(got, want):
            if b is not None:
                torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)
        assert got[0].is_contiguous(memory_format=torch.channels_last)
        assert got[1].is_contiguous(memory_format=torch.channels_last)

    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 4, 7, 7, generator=g).contiguous(memory_format=torch.channels_last)
    gy = torch.randn(2, 6, 7, 7, generator=g).contiguous(memory_format=torch.channels_last)
    for _ in range(3):   # the first backward is checked; the later ones run the kept plans' hot paths
        check(x, gy)
        gy = gy * -0.5
    (_key, entry), = m.__dict__["_rawconv_entry"].values()
    kept = entry[6]
    assert kept[1] is not None and kept[2] is not None
    assert kept[1]._grad_hot_run(gy, m.weight.detach()) is not None   # (the plan's pack fits this gradient)
    check(x, gy.contiguous())                                               # NCHW gradient: restrided
    check(x, torch.randn(1, 6, 1, 1, generator=g).expand(2, 6, 7, 7))       # expanded gradient
    check(x, gy)
    errors = []

    def other():
        try:
            check(x * 2, gy)
        except Exception as exc:   # noqa: BLE001 - reported below
            errors.append(exc)
    th = threading.Thread(target=other)
    th.start()
    th.join()
    assert not errors, errors
    check(x, gy)
    check(x[:0], gy[:0])                                                    # empty batch: zeros


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_backward_plans_kept_in_one_entry_follow_x_and_ws_layouts(device):
    """One argument pack (rawconv.ops.conv's, by shapes and arguments, not layouts) serves calls
    with x and w in every layout: a backward after one in another layout gives torch's gradient
    layouts (channels_last when x or w is), not the kept plans' (their packs check only grad_y
    and w, or x and grad_y), and float64's values."""
    from rawconv import ops

    g = torch.Generator().manual_seed(9)
    x0 = torch.randn(2, 4, 6, 6, generator=g)
    w0 = torch.randn(5, 4, 3, 3, generator=g)
    gy = torch.randn(2, 5, 6, 6, generator=g).to(device)   # NCHW, as the caller gives it
    cl = torch.channels_last
    for x_cl, w_cl in ((False, False), (True, False), (False, False), (False, True), (True, True), (False, False)):
        x = (x0.contiguous(memory_format=cl) if x_cl else x0).to(device).requires_grad_()
        w = (w0.contiguous(memory_format=cl) if w_cl else w0).to(device).requires_grad_()
        dx, dw = torch.autograd.grad(ops.conv(x, w, padding=1), (x, w), gy)
        x64, w64 = x0.double().requires_grad_(), w0.double().requires_grad_()
        wx, ww = torch.autograd.grad(torch.nn.functional.conv2d(x64, w64, padding=1), (x64, w64), gy.cpu().double())
        want_cl = x_cl or w_cl
        for name, got, want in (("dx", dx, wx), ("dw", dw, ww)):
            assert got.is_contiguous(memory_format=cl if want_cl else torch.contiguous_format), \
                (name, x_cl, w_cl, got.stride())
            torch.testing.assert_close(got.cpu().double(), want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("make, shape", [
    (lambda: torch.nn.Conv1d(4, 6, 3, stride=2), (2, 4, 9)),
    (lambda: torch.nn.Conv2d(4, 6, 3), (4, 9, 9)),                       # unbatched
    (lambda: torch.nn.Conv3d(4, 6, 3, dilation=2), (1, 4, 9, 9, 9)),
    (lambda: torch.nn.ConvTranspose2d(4, 6, 3, stride=2), (2, 4, 9, 9)),
    (lambda: torch.nn.Conv2d(4, 6, 3, padding=1, groups=2), (2, 4, 9, 9)),
])
def test_flop_counter_counts_rawconvs_operators_as_torchs_convolutions(make, shape):
    """FlopCounterMode counts the forward as torch's convolution and each backward operator as the
    convolution it differentiates: torch's own counts, except that torch counts grad_weight of a
    grouped convolution ``groups`` times (its formula sees all of x's channels), where rawconv's
    is the forward's count."""
    import rawconv.ops  # noqa: F401  (registers the formulas: a FlopCounterMode made before sees them)
    from torch.utils.flop_counter import FlopCounterMode

    t = make()
    r = rnn.convert(copy.deepcopy(t))
    counts = []
    for m in (t, r):
        x = torch.randn(*shape, requires_grad=True)
        with FlopCounterMode(display=False) as fc:
            y = m(x)
        fwd = fc.get_total_flops()
        with FlopCounterMode(display=False) as fc:
            y.sum().backward()
        counts.append((fwd, fc.get_total_flops()))
    (tf, tb), (rf, rb) = counts
    assert rf == tf > 0
    groups = getattr(t, "groups", 1)
    assert rb == 2 * rf and tb == rf + groups * rf   # grad_input + grad_weight


def test_legacy_vmap_batched_gradients_and_inputs_go_through_the_dispatcher():
    """A legacy vmap's BatchedTensor has no storage: ``torch.autograd.grad(..., is_grads_batched=True)``,
    ``autograd.functional.jacobian(..., vectorize=True)`` and ``torch._vmap_internals._vmap`` through a
    converted module or rawconv.ops.conv give float64's results (the operators' batched fallback
    runs them), where the direct path raised InternalError (a breaker's find)."""
    import warnings

    from rawconv import ops

    torch.manual_seed(0)
    t = torch.nn.Conv2d(4, 6, 3, padding=1)
    m = rnn.convert(copy.deepcopy(t))
    t64 = copy.deepcopy(t).double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 8, 8, generator=g)
    gys = torch.randn(3, 2, 6, 8, 8, generator=g)
    x64 = x.double().requires_grad_()
    want = torch.autograd.grad(t64(x64), (x64, t64.weight), gys.double(), is_grads_batched=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch's "There is a performance drop" of its batched fallback
        for f in (m, lambda xr: ops.conv(xr, m.weight, m.bias, padding=1)):
            xr = x.clone().requires_grad_()
            got = torch.autograd.grad(f(xr), (xr, m.weight), gys, is_grads_batched=True)
            for a, b in zip(got, want):
                torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)
        xs = x[:1, :, :4, :4]
        jac = torch.autograd.functional.jacobian(m, xs, vectorize=True)
        jac64 = torch.autograd.functional.jacobian(t64, xs.double(), vectorize=True)
        torch.testing.assert_close(jac.double(), jac64, rtol=1e-4, atol=1e-4)
        y = torch._vmap_internals._vmap(m)(x.unsqueeze(1))
        torch.testing.assert_close(y.squeeze(1).double(), t64(x.double()), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("conv, x_shape, x_cl, w_cl", [
    (lambda: torch.nn.Conv2d(2, 1, 3, stride=2), (3, 2, 7, 7), True, False),   # one output channel
    (lambda: torch.nn.Conv2d(3, 2, 3), (3, 3, 3, 3), False, True),             # a 1x1 output
], ids=["one-channel", "1x1-output"])
def test_gradient_strides_that_fit_both_formats_give_torchs_layouts(conv, x_shape, x_cl, w_cl):
    """An NCHW gradient whose strides also fit channels_last (one output channel, a 1x1 output):
    dx and dw come out channels_last when x or w is, as torch's CPU backward gives them (the
    backward read the layout from the gradient's strides; a breaker's find), with float64's values."""
    cl = torch.channels_last
    torch.manual_seed(0)
    t = conv()
    if w_cl:
        t = t.to(memory_format=cl)
    m = rnn.convert(copy.deepcopy(t))
    t64 = copy.deepcopy(t).double()
    x = torch.randn(x_shape, generator=torch.Generator().manual_seed(1))
    x = x.contiguous(memory_format=cl) if x_cl else x
    res = {}
    for name, mod, xin in (("torch", t, x), ("rawconv", m, x), ("64", t64, x.double())):
        xr = xin.clone(memory_format=torch.preserve_format).requires_grad_()
        y = mod(xr)
        gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(2)).to(y.dtype)   # NCHW strides
        res[name] = torch.autograd.grad(y, (xr, mod.weight), gy)
    for got, want, w64 in zip(res["rawconv"], res["torch"], res["64"]):
        assert got.is_contiguous(memory_format=cl) == want.is_contiguous(memory_format=cl)
        assert got.is_contiguous() == want.is_contiguous(), (got.stride(), want.stride())
        torch.testing.assert_close(got.double(), w64, rtol=1e-4, atol=1e-4)


def test_double_backward_through_a_gradient_viewed_with_channels_last_strides():
    """create_graph through the channels-last view of an ambiguous gradient (one output channel,
    x channels_last): dx, then the gradients of a function of dx, as float64's."""
    cl = torch.channels_last
    torch.manual_seed(0)
    t = torch.nn.Conv2d(2, 1, 3, stride=2)
    m = rnn.convert(copy.deepcopy(t))
    t64 = copy.deepcopy(t).double()
    x = torch.randn(3, 2, 7, 7, generator=torch.Generator().manual_seed(1)).contiguous(memory_format=cl)
    res = []
    for mod, xin in ((m, x), (t64, x.double())):
        xr = xin.clone(memory_format=torch.preserve_format).requires_grad_()
        y = mod(xr)
        gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(2)).to(y.dtype).requires_grad_()
        dx, = torch.autograd.grad(y, xr, gy, create_graph=True)
        dx.square().sum().backward()
        res.append((dx, gy.grad, mod.weight.grad))
    for got, want in zip(*res):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    assert res[0][0].stride() == res[1][0].stride()
