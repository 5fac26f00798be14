"""The cuDNN graph plan's forward hot path (issue 15, "the cost of a pinned call") stays exact on a
GPU: a tensor whose strides changed in place after hot calls, an ``out`` that overlaps an input
after hot calls with the same shapes, an unaligned view, weights updated in place, out='s version
bump. Needs a CUDA GPU (not run on the CPU-only machine)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rawconv import cudnn_graph as G
from rawconv.errors import ArgumentError

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def _ref(x, w, b=None):
    return F.conv2d(x.double(), w.double(), None if b is None else b.double(), 1, 1).float()


def _close(a, b):
    torch.testing.assert_close(a.float(), b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bias", [False, True])
def test_graph_hot_path_follows_in_place_changes(bias):
    x = torch.randn(2, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    b = torch.randn(8, device="cuda") if bias else None
    plan = G.GraphConvolution(x, w, b, padding=1)
    for _ in range(3):
        y = plan.execute(x, w, b)
    # the pack was made: the calls above took the hot path (a plain conv + bias runs torch's way by
    # default: the convolution alone on its own plan, whose pack it is, then torch's bias add)
    assert (plan._unf if plan._split or bias else plan)._hot is not None
    _close(y, _ref(x, w, b))
    with torch.no_grad():
        w.mul_(-1)   # weights read on every call
    _close(plan.execute(x, w, b), _ref(x, w, b))
    x.as_strided_((2, 8, 8, 8), (512, 1, 64, 8))   # same storage and shape, channels-last strides
    _close(plan.execute(x, w, b), _ref(x, w, b))
    torch.cuda.synchronize()


def test_graph_hot_path_out_rules():
    buf = torch.zeros(4096, device="cuda")
    x = buf[:1024].view(2, 8, 8, 8)
    x.copy_(torch.randn(2, 8, 8, 8))
    w = torch.randn(8, 8, 3, 3, device="cuda")
    plan = G.GraphConvolution(x, w, padding=1)
    out = buf[2048:3072].view(2, 8, 8, 8)
    for _ in range(3):
        assert plan.execute(x, out=out) is out
    _close(out, _ref(x, w))
    v = out._version
    plan.execute(x, out=out)
    assert out._version > v
    with pytest.raises(ArgumentError, match="overlaps"):
        plan.execute(x, out=buf[512:1536].view(2, 8, 8, 8))
    # an address that is not 16-byte aligned: the checked path refuses such an out
    with pytest.raises(ArgumentError):
        plan.execute(x, out=torch.zeros(1025, device="cuda")[1:].view(2, 8, 8, 8))
    # an unaligned input is copied by the checked path, still exact
    xu = torch.zeros(1025, device="cuda")[1:].view(2, 8, 8, 8)
    xu.copy_(x)
    _close(plan.execute(xu), _ref(x, w))
    torch.cuda.synchronize()


@pytest.mark.parametrize("api", ["legacy", "graph"])
def test_negative_views_are_read_as_their_values_and_refused_as_out(api):
    """A torch._neg_view's memory holds the un-negated values, which is what cuDNN would read: the
    checked path resolves inputs to a copy and refuses one as out= (the CPU plans do the same)."""
    from rawconv import cudnn

    x = torch.randn(2, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    plan = (G.GraphConvolution(x, w, padding=1) if api == "graph"
            else cudnn.Convolution(x, w, padding=1, algo="IMPLICIT_GEMM", math="fma"))
    for _ in range(2):   # the hot path first, then a negative view with the same metadata
        _close(plan.execute(x, w), _ref(x, w))
    nx = torch._neg_view(x)
    assert nx.is_neg()
    _close(plan.execute(nx, w), _ref(-x, w))
    out = torch._neg_view(torch.empty(2, 8, 8, 8, device="cuda"))
    with pytest.raises(ArgumentError, match="negative or conjugate view"):
        plan.execute(x, w, out=out)


def _operator_calls_stay_exact(x, w, b, args):
    """After hot calls of torch.ops.rawconv.conv_forward(x, w, None, *args): with a bias (another
    key), other strides (the checked path), strides changed in place on a tensor of the hot metadata."""
    _close(torch.ops.rawconv.conv_forward(x, w, b, *args), _ref(x, w, b))
    _close(torch.ops.rawconv.conv_forward(x, w, None, *args), _ref(x, w))
    xc = x.contiguous(memory_format=torch.channels_last)
    _close(torch.ops.rawconv.conv_forward(xc, w, None, *args), _ref(x, w))
    x2 = torch.randn(2, 8, 8, 8, device="cuda")
    x2.as_strided_((2, 8, 8, 8), xc.stride())
    _close(torch.ops.rawconv.conv_forward(x2, w, None, *args), _ref(x2, w))


def test_operator_cuda_last_plan_path_stays_exact():
    """torch.ops.rawconv.conv_forward on cudnn_graph keeps the plan of its last call with the same
    arguments (ops._cuda_last) and runs its hot path: right after in-place stride changes, with and
    without a bias on the same arguments, and for another device index's tensors' key."""
    from rawconv import ops

    ops.clear_cache()
    x = torch.randn(2, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    b = torch.randn(8, device="cuda")
    args = ([1, 1], [1, 1], [1, 1], [1, 1], 1, "cudnn_graph", "", "strict", "", "")
    for _ in range(3):
        y = torch.ops.rawconv.conv_forward(x, w, None, *args)
    assert len(ops._cuda_last) >= 1
    _close(y, _ref(x, w))
    _operator_calls_stay_exact(x, w, b, args)


# ---------------------------------------------------------------- the legacy plan's forward hot path
# rawconv.cudnn.Convolution.execute: after a checked call that gave cuDNN its tensors as they are,
# calls with the same tensors' metadata run one prepared cuDNN call (rawconv.cudnn._Hot).
_ACTS = {None: lambda t: t, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}


def _legacy_ref(x, w, b=None, activation=None):
    y = F.conv2d(x.double(), w.double(), None if b is None else b.double(), 1, 1)
    return _ACTS[activation](y).float()


def _checked_path_fails(monkeypatch, plan):
    """From here on the checked forward path of ``plan`` raises: a call that still returns took the hot path."""
    def boom(*a, **k):
        raise AssertionError("the checked path ran")
    monkeypatch.setattr(plan, "_run_forward", boom)


def _same_as_checked(plan, hot, checked):
    if plan.info.deterministic:   # the same cuDNN call on the same data: the same bits
        assert torch.equal(hot, checked)
    else:
        _close(hot, checked)


@pytest.mark.parametrize("bias, activation, algo, layout", [
    (False, None, "IMPLICIT_GEMM", "nchw"),
    (True, None, "IMPLICIT_GEMM", "nchw"),               # bias added in torch (not fused for this algo)
    (True, None, "IMPLICIT_PRECOMP_GEMM", "nchw"),       # cudnnConvolutionBiasActivationForward (identity)
    (True, "relu", "IMPLICIT_GEMM", "nhwc"),             # cudnnConvolutionBiasActivationForward (relu)
    (False, "sigmoid", "IMPLICIT_PRECOMP_GEMM", "nhwc"),  # activation in torch, no bias
    (True, "tanh", "IMPLICIT_GEMM", "nchw"),             # bias and activation in torch
])
def test_legacy_hot_path_equals_the_checked_path(monkeypatch, bias, activation, algo, layout):
    from rawconv import cudnn

    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    x = torch.randn(2, 8, 8, 8, device="cuda").contiguous(memory_format=fmt)
    w = torch.randn(8, 8, 3, 3, device="cuda").contiguous(memory_format=fmt)
    b = torch.randn(8, device="cuda") if bias else None
    plan = cudnn.Convolution(x, w, b, padding=1, algo=algo, math="fma", activation=activation)
    checked = plan.execute(x, w, b)   # the checked path; it makes the pack
    assert plan._hot is not None and plan._hot.info is plan.info
    ref = _legacy_ref(x, w, b, activation)
    _close(checked, ref)
    out = torch.empty_like(checked)
    with monkeypatch.context() as m:
        _checked_path_fails(m, plan)
        hot = plan.execute(x, w, b)
        _same_as_checked(plan, hot, checked)
        assert hot.stride() == checked.stride() and hot.dtype == checked.dtype
        v = out._version
        assert plan.execute(x, w, b, out=out) is out
        assert out._version > v   # written in place, as torch's out= functions do
        _same_as_checked(plan, out, checked)
        y, info = plan.execute(x, w, b, return_info=True)
        assert info is plan.info
        _same_as_checked(plan, y, checked)
        with torch.no_grad():
            w.mul_(-1)   # weights are read on every call
        _close(plan.execute(x, w, b), _legacy_ref(x, w, b, activation))
        x2 = torch.randn_like(x)   # other data, the same metadata
        _close(plan.execute(x2, w, b), _legacy_ref(x2, w, b, activation))
    # same storage and shape, other strides: the checked path (a copy), still exact
    xs = x.clone()
    xs.as_strided_(x.shape, torch.empty_like(x, memory_format=torch.channels_last if layout == "nchw"
                                             else torch.contiguous_format).stride())
    _close(plan.execute(xs, w, b), _legacy_ref(xs, w, b, activation))
    torch.cuda.synchronize()


def test_legacy_hot_path_out_rules(monkeypatch):
    from rawconv import cudnn

    buf = torch.zeros(4096, device="cuda")
    x = buf[:1024].view(2, 8, 8, 8)
    x.copy_(torch.randn(2, 8, 8, 8))
    w = torch.randn(8, 8, 3, 3, device="cuda")
    plan = cudnn.Convolution(x, w, padding=1, algo="IMPLICIT_GEMM", math="fma")
    out = buf[2048:3072].view(2, 8, 8, 8)
    assert plan.execute(x, out=out) is out   # checked: makes the pack
    with monkeypatch.context() as m:
        _checked_path_fails(m, plan)
        for _ in range(2):
            v = out._version
            assert plan.execute(x, out=out) is out
            assert out._version > v
        _close(out, _ref(x, w))
    # an out that overlaps x, with the pack's shapes and strides: the checked path's clear error
    with pytest.raises(ArgumentError, match="overlaps"):
        plan.execute(x, out=buf[512:1536].view(2, 8, 8, 8))
    with pytest.raises(ArgumentError, match="overlaps"):
        plan.execute(x, out=buf[:1024].view(2, 8, 8, 8))
    # an out of other strides is refused (as the checked path always did)
    with pytest.raises(ArgumentError, match="strides"):
        plan.execute(x, out=torch.empty(2, 8, 8, 8, device="cuda").contiguous(memory_format=torch.channels_last))
    # torch's out= rules: no autograd, no inference tensor outside inference mode
    xr = x.detach().clone().requires_grad_()
    with pytest.raises(ArgumentError, match="requires grad"):
        plan.execute(xr, out=out)
    with pytest.raises(ArgumentError, match="requires grad"):
        plan.execute(x, out=torch.zeros(2, 8, 8, 8, device="cuda", requires_grad=True))
    with torch.inference_mode():
        inf = torch.empty(2, 8, 8, 8, device="cuda")
    with pytest.raises(ArgumentError, match="inference"):
        plan.execute(x, out=inf)
    # without out, a tensor that requires grad runs as in the checked path: no autograd recorded
    y = plan.execute(xr)
    assert not y.requires_grad
    _close(y, _ref(x, w))
    # an input at an address that is only 4-byte aligned: taken as it is (the legacy API has no
    # alignment rule), still exact
    xu = torch.zeros(1025, device="cuda")[1:].view(2, 8, 8, 8)
    xu.copy_(x)
    _close(plan.execute(xu), _ref(x, w))
    torch.cuda.synchronize()


def test_legacy_hot_path_mismatches_take_the_checked_path():
    from rawconv import cudnn

    x = torch.randn(2, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    plan = cudnn.Convolution(x, w, padding=1, algo="IMPLICIT_GEMM", math="fma")
    for _ in range(3):
        plan.execute(x, w)
    hot = plan._hot
    assert hot is not None
    with pytest.raises(ArgumentError, match="float32"):
        plan.execute(x.double(), w.double())
    with pytest.raises(ArgumentError, match="cuda:0"):
        plan.execute(x.cpu(), w)
    with pytest.raises(ArgumentError, match="shape"):
        plan.execute(torch.randn(3, 8, 8, 8, device="cuda"), w)
    xc = x.contiguous(memory_format=torch.channels_last)   # other strides: copied by the checked path
    _close(plan.execute(xc, w), _ref(x, w))
    wc = w.contiguous(memory_format=torch.channels_last)
    _close(plan.execute(x, wc), _ref(x, w))

    class Sub(torch.Tensor):
        pass

    _close(plan.execute(x.as_subclass(Sub), w), _ref(x, w))   # a subclass: the checked path
    assert plan._hot is hot   # the calls above did not replace the pack of the plain calls
    _close(plan.execute(x, w), _ref(x, w))
    torch.cuda.synchronize()


def test_legacy_hot_path_follows_streams_select_and_free():
    from rawconv import cudnn

    x = torch.randn(2, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    ref = _ref(x, w)
    plan = cudnn.Convolution(x, w, padding=1, algo="IMPLICIT_GEMM", math="fma")
    for _ in range(3):
        _close(plan.execute(x, w), ref)
    hot = plan._hot
    assert hot is not None and hot.stream in (None, 0)   # any stream (no workspace) or the default one's
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):   # another stream: a workspace per call when the algo needs one, no pack of its own
        ys = [plan.execute(x, w) for _ in range(3)]
        assert plan._hot is hot
    s.synchronize()
    for y in ys:
        _close(y, ref)
    torch.cuda.current_stream().wait_stream(s)
    _close(plan.execute(x, w), ref)
    assert plan._hot is hot
    info = plan.select("IMPLICIT_PRECOMP_GEMM")
    _close(plan.execute(x, w), ref)
    assert plan._hot is not None and plan._hot.info is info   # a new pack for the new algo
    _close(plan.execute(x, w), ref)
    plan.free()
    assert plan._hot is None
    with pytest.raises(ArgumentError, match="freed"):
        plan.execute(x, w)
    torch.cuda.synchronize()


def test_legacy_function_form_and_operator_reuse_the_plan(monkeypatch):
    """rawconv.cudnn.forward finds its plan by the arguments (rawconv.core.plans.arg_key: padding=True
    is refused after padding=1), and torch.ops.rawconv.conv_forward / rawconv.ops.conv with
    backend="cudnn" keep the plan of their last call (ops._cuda_last, the backend in the key) and
    run its hot path."""
    from rawconv import cudnn, ops
    from rawconv.errors import ArgumentTypeError

    ops.clear_cache()
    cudnn.clear_cache()
    x = torch.randn(2, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    b = torch.randn(8, device="cuda")
    for _ in range(3):
        _close(cudnn.forward(x, w, padding=1), _ref(x, w))
    with pytest.raises(ArgumentTypeError):
        cudnn.forward(x, w, padding=True)
    _close(cudnn.forward(x, w, padding=[1, 1]), _ref(x, w))
    args = ([1, 1], [1, 1], [1, 1], [1, 1], 1, "cudnn", "", "strict", "", "")
    y = torch.ops.rawconv.conv_forward(x, w, None, *args)
    legacy = [p for p in ops._cuda_last._plans.values() if isinstance(p, cudnn.Convolution)]
    assert len(legacy) == 1 and legacy[0]._hot is not None
    with monkeypatch.context() as m:
        _checked_path_fails(m, legacy[0])
        for _ in range(2):
            _close(torch.ops.rawconv.conv_forward(x, w, None, *args), _ref(x, w))
            _close(ops.conv(x, w, None, 1, 1, backend="cudnn"), _ref(x, w))
    _close(y, _ref(x, w))
    # the graph backend with the same arguments: its own plan, its own entry
    _close(torch.ops.rawconv.conv_forward(x, w, None, *args[:5], "cudnn_graph", *args[6:]), _ref(x, w))
    kinds = {type(p).__name__ for p in ops._cuda_last._plans.values()}
    assert kinds == {"Convolution", "GraphConvolution"}
    _operator_calls_stay_exact(x, w, b, args)
    _close(ops.conv(x[0], w, None, 1, 1, backend="cudnn"), _ref(x[:1], w)[0])   # unbatched: no pack, exact
    # autograd through the operator after hot calls: the forward runs the hot path inside the
    # autograd Function, the backward runs rawconv's backward operators
    xr = x.detach().clone().requires_grad_()
    y = torch.ops.rawconv.conv_forward(xr, w, None, *args)
    assert y.requires_grad
    g = torch.randn_like(y)
    y.backward(g)
    xd = x.detach().double().requires_grad_()
    F.conv2d(xd, w.double(), None, 1, 1).backward(g.double())
    _close(xr.grad, xd.grad.float())
    torch.cuda.synchronize()


@pytest.mark.parametrize("api", ["legacy", "graph"])
def test_an_unbatched_plan_given_a_batched_x_returns_the_same_shape_every_call(api):
    """An unbatched plan takes x with its batch dim of 1 and returns y without it (the checked
    path): later calls must not switch to the (1, K, ...) y of a hot pack."""
    from rawconv import cudnn
    from rawconv.problem import ConvProblem

    p = ConvProblem(n=1, c=8, k=8, in_spatial=(8, 8), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1),
                    unbatched=True, device="cuda")
    plan = (cudnn.Convolution if api == "legacy" else G.GraphConvolution).from_problem(p)
    x = torch.randn(1, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    shapes = [tuple(plan.execute(x, w).shape) for _ in range(3)]
    assert shapes == [(8, 8, 8)] * 3, shapes
    _close(plan.execute(x, w), _ref(x, w)[0])
    torch.cuda.synchronize()


@pytest.mark.parametrize("activation", [None, "tanh"])
def test_legacy_execute_records_no_autograd_through_a_bias_added_in_torch(activation):
    """The legacy plan adds an unfused bias in torch: with a bias that requires grad (grad mode
    on) its y must not become a graph reaching the bias alone (backward would give db and silently
    no dx, dw); execute records no autograd, as the fused kernel and the other plans, checked and
    hot path alike."""
    from rawconv import cudnn

    x = torch.randn(2, 8, 8, 8, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    b = torch.randn(8, device="cuda", requires_grad=True)
    plan = cudnn.Convolution(x, w, b.detach(), padding=1, activation=activation)
    want = _ref(x, w, b.detach())
    want = torch.tanh(want) if activation else want
    for _ in range(3):
        y = plan.execute(x, w, b)
        assert not y.requires_grad and y.grad_fn is None
        _close(y, want)
    torch.cuda.synchronize()


def test_a_graph_plan_on_two_streams_at_once_stays_exact():
    """Calls of one plan queued on two streams run concurrently: each stream has its own
    workspace (one shared workspace would be written by both kernels at once)."""
    x = [torch.randn(8, 32, 28, 28, device="cuda") for _ in range(2)]
    w = torch.randn(32, 32, 3, 3, device="cuda")
    plan = G.GraphConvolution(x[0], w, padding=1)
    want = [_ref(t, w) for t in x]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    torch.cuda.synchronize()
    outs = [[], []]
    for _ in range(20):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                outs[i].append(plan.execute(x[i], w))
    torch.cuda.synchronize()
    for i in range(2):
        for y in outs[i]:
            _close(y, want[i])
    b = plan._selected or plan._current()
    assert b.workspace is None, "side streams take a workspace per call: the plan keeps none for them"


def test_module_training_steps_reuse_the_entry_backward_plans_and_stay_exact(monkeypatch):
    """A converted module's training steps (grad on, channels_last, TF32 off) keep their CUDA
    backward plans in the module's entry: from the second step on neither backward takes its
    checked path; x, w and grad_y changed in place, a new batch size and a non-dense incoming
    gradient (``y.sum()``'s expanded ones) still give float64's gradients."""
    import rawconv.nn as rnn
    from rawconv import ops

    torch.manual_seed(0)
    m = rnn.Conv2d(8, 16, 3, padding=1, bias=True).cuda().to(memory_format=torch.channels_last)
    checked = {"d": 0, "w": 0}
    for name, k in (("_backward_data_cuda_checked", "d"), ("_backward_weights_cuda_checked", "w")):
        real = getattr(ops, name)

        def spy(*a, _real=real, _k=k):
            checked[_k] += 1
            return _real(*a)
        monkeypatch.setattr(ops, name, spy)

    def step(x, gy):
        m.zero_grad(set_to_none=True)
        xr = x.clone().requires_grad_()
        y = m(xr)
        y.backward(gy)
        x64, w64, b64 = xr.detach().double().requires_grad_(), m.weight.detach().double().requires_grad_(), \
            m.bias.detach().double().requires_grad_()
        F.conv2d(x64, w64, b64, 1, 1).backward(gy.double())
        for got, want in ((y, F.conv2d(x64, w64, b64, 1, 1)), (xr.grad, x64.grad), (m.weight.grad, w64.grad),
                          (m.bias.grad, b64.grad)):
            torch.testing.assert_close(got.double(), want.detach(), rtol=1e-4, atol=1e-3)

    x = torch.randn(4, 8, 10, 10, device="cuda").contiguous(memory_format=torch.channels_last)
    gy = torch.randn(4, 16, 10, 10, device="cuda").contiguous(memory_format=torch.channels_last)
    step(x, gy)
    first = dict(checked)
    for _ in range(3):
        x.mul_(-0.5)
        gy.add_(1.0)
        step(x, gy)
    assert checked == first, "steps after the first ran the entry's backward plans (hot paths)"
    (e,) = [v[1] for v in m.__dict__["_rawconv_entry"].values()]
    assert e[4] is not None and e[5] is not None
    step(torch.randn(3, 8, 10, 10, device="cuda").contiguous(memory_format=torch.channels_last),
         torch.randn(3, 16, 10, 10, device="cuda").contiguous(memory_format=torch.channels_last))
    xr = x.clone().requires_grad_()
    m.zero_grad(set_to_none=True)
    m(xr).sum().backward()   # an expanded (stride 0) gradient: made dense, not read as strides it lacks
    w64 = m.weight.detach().double().requires_grad_()
    x64 = x.double().requires_grad_()
    F.conv2d(x64, w64, None, 1, 1).sum().backward()
    torch.testing.assert_close(xr.grad.double(), x64.grad, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(m.weight.grad.double(), w64.grad, rtol=1e-4, atol=1e-2)
