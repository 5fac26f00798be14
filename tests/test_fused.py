"""rawconv.fused: act(conv + bias + residual) as one oneDNN primitive with post-ops (CPU) or one cuDNN
graph (GPU), the torch operator rawconv::conv_bias_act (opcheck, fake kernel, torch.compile, autograd),
ConvBiasAct modules, and the residual node of the cuDNN graph built without a GPU."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import rawconv.fused as fu
import rawconv.nn as rnn
from rawconv import ArgumentError, ArgumentTypeError, ConvProblem
from rawconv.onednn import _ffi as _dnnl
from rawconv.errors import NotSupportedError
from conftest import load_cudnn_or_fail

pytestmark = pytest.mark.usefixtures("dnnl")
CONVF = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _ref(x, w, b, r, stride, padding, dilation, groups, act):
    """float64 act(conv + b + r); padding: torch's, or ((before, after), ...) pairs."""
    nd = w.dim() - 2
    x64 = x.detach().double()
    if isinstance(padding, tuple) and padding and isinstance(padding[0], tuple):
        pad = []
        for bf, af in reversed(padding):
            pad += [bf, af]
        x64, padding = F.pad(x64, pad), 0
    y = CONVF[nd](x64, w.detach().double(), b.detach().double() if b is not None else None, stride, padding,
                  dilation, groups)
    if r is not None:
        y = y + r.detach().double()
    return torch.relu(y) if act == "relu" else y


def _close(got, want, rel=2e-5):
    assert got.shape == want.shape, (got.shape, want.shape)
    err = (got.detach().double() - want).abs().max().item()
    assert err <= rel * max(want.abs().max().item(), 1.0), err


CASES = [  # nd, layout, stride, padding, dilation, groups, residual, activation
    (2, "nchw", 1, 1, 1, 1, True, "relu"),
    (2, "nhwc", 1, 1, 1, 1, True, "relu"),
    (2, "nchw", 2, 1, 1, 2, False, "relu"),
    (2, "nhwc", 1, 0, 2, 1, True, "none"),
    (2, "nchw", 1, ((0, 2), (1, 0)), 1, 1, True, "relu"),
    (1, "nchw", 1, 1, 1, 1, True, "relu"),
    (3, "nchw", 1, 1, 1, 1, True, "relu"),
    (2, "nchw", 1, 1, 1, 1, False, "none"),
]


@pytest.mark.parametrize("nd, layout, stride, padding, dilation, groups, residual, act", CASES)
def test_conv_bias_act_matches_float64(nd, layout, stride, padding, dilation, groups, residual, act):
    torch.manual_seed(nd * 7 + groups)
    x = torch.randn((2, 8) + (9,) * nd)
    w = torch.randn((16, 8 // groups) + (3,) * nd)
    b = torch.randn(16)
    ref0 = _ref(x, w, b, None, stride, padding, dilation, groups, "none")
    r = torch.randn(ref0.shape) if residual else None
    if layout == "nhwc":
        x = x.to(memory_format=torch.channels_last)
        r = r.to(memory_format=torch.channels_last) if r is not None else None
    y = fu.conv_bias_act(x, w, b, r, stride, padding, dilation, groups, activation=act)
    want = _ref(x, w, b, r, stride, padding, dilation, groups, act)
    _close(y, want)
    if layout == "nhwc":
        assert y.is_contiguous(memory_format=torch.channels_last)
    if act == "relu" and residual:
        # the order of operations is relu(conv + b + r), not relu(conv + b) + r: the two differ here
        other = _ref(x, w, b, None, stride, padding, dilation, groups, "relu") + r.double()
        assert (other - want).abs().max().item() > 1e-3


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_every_offered_implementation_adds_the_residual(layout):
    """Implementations whose destination is blocked get the residual reordered into their buffer
    first (the sum post-op reads it there); the others read it from the output tensor itself."""
    torch.manual_seed(1)
    x = torch.randn(2, 16, 7, 7)
    w = torch.randn(16, 16, 3, 3)
    b = torch.randn(16)
    r = torch.randn(2, 16, 7, 7)
    if layout == "nhwc":
        x, r = x.to(memory_format=torch.channels_last), r.to(memory_format=torch.channels_last)
    want = _ref(x, w, b, r, 1, 1, 1, 1, "relu")
    plan = fu.FusedConvolution(x, w, b, padding=1, residual=True, activation="relu")
    impls = [i for i in plan.implementations if not i.name.startswith("ref")]
    assert impls
    r_before = r.clone()
    for impl in impls:
        plan.select(impl)
        _close(plan.run(x, w, b, r), want)
        # the module's op form, pinned by name@layouts
        _close(fu.conv_bias_act(x, w, b, r, padding=1, choice=f"{impl.name}@{impl.layouts}"), want)
    assert r.equal(r_before)   # the residual itself is not written


def test_fused_plan_autotune_selects_a_correct_implementation():
    torch.manual_seed(2)
    x, w, b = torch.randn(1, 8, 10, 10), torch.randn(8, 8, 3, 3), torch.randn(8)
    r = torch.randn(1, 8, 10, 10)
    plan = fu.FusedConvolution(x, w, b, padding=1, residual=True, activation="relu")
    rows = plan.autotune(iterations=2, warmup=1)
    assert rows and plan.selected == rows[0].impl
    _close(plan.run(x, w, b, r), _ref(x, w, b, r, 1, 1, 1, 1, "relu"))
    assert "residual=True" in repr(plan) and "activation=relu" in repr(plan)


def test_operator_passes_opcheck_on_cpu():
    torch.manual_seed(3)
    x, w, b, r = torch.randn(2, 4, 6, 6), torch.randn(8, 4, 3, 3), torch.randn(8), torch.randn(2, 8, 6, 6)
    args = (x, w, b, r, [1, 1], [1, 1], [1, 1], 1, "relu", "auto", None, "strict")
    res = torch.library.opcheck(torch.ops.rawconv.conv_bias_act.default, args)
    assert set(res.values()) == {"SUCCESS"}, res
    xc = x.to(memory_format=torch.channels_last)
    res = torch.library.opcheck(torch.ops.rawconv.conv_bias_act.default,
                                (xc, w, None, None, [2, 2], [1, 1, 0, 0], [1, 1], 1, "none", "onednn", None, "strict"))
    assert set(res.values()) == {"SUCCESS"}, res
    grad_args = (x.requires_grad_(), w.requires_grad_(), b.requires_grad_(), r.requires_grad_()) + args[4:]
    res = torch.library.opcheck(torch.ops.rawconv.conv_bias_act.default, grad_args,
                                test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    assert set(res.values()) == {"SUCCESS"}, res


def test_fake_kernel_gives_the_real_shape_and_layout():
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(2, 4, 9, 7).to(memory_format=torch.channels_last)
    w = torch.randn(6, 4, 3, 2)
    real = torch.ops.rawconv.conv_bias_act(x, w, None, None, [2, 1], [1, 0, 2, 1], [1, 2], 1, "relu", "auto", None,
                                           "strict")
    with FakeTensorMode() as mode:
        fx, fw = mode.from_tensor(x), mode.from_tensor(w)
        fake = torch.ops.rawconv.conv_bias_act(fx, fw, None, None, [2, 1], [1, 0, 2, 1], [1, 2], 1, "relu", "auto",
                                               None, "strict")
    assert fake.shape == real.shape and fake.stride() == real.stride()
    _close(real, _ref(x, w, None, None, (2, 1), ((1, 2), (0, 1)), (1, 2), 1, "relu"))


def test_torch_compile_fullgraph_traces_the_fused_module():
    torch.manual_seed(4)
    m = rnn.ConvBiasAct2d(4, 8, 3, padding=1).eval()
    x, r = torch.randn(2, 4, 6, 6), torch.randn(2, 8, 6, 6)
    f = torch.compile(m, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        y = f(x, r)
    _close(y, _ref(x, m.weight, m.bias, r, 1, 1, 1, 1, "relu"))


def test_fused_op_gradients_match_float64_and_double_backward_is_refused():
    torch.manual_seed(5)
    x = torch.randn(2, 4, 7, 7, requires_grad=True)
    w = torch.randn(6, 4, 3, 3, requires_grad=True)
    b = torch.randn(6, requires_grad=True)
    r = torch.randn(2, 6, 7, 7, requires_grad=True)
    y = fu.conv_bias_act(x, w, b, r, padding=1)
    gy = torch.randn_like(y)
    y.backward(gy)
    leaves = [t.detach().double().requires_grad_() for t in (x, w, b, r)]
    y64 = torch.relu(F.conv2d(leaves[0], leaves[1], leaves[2], padding=1) + leaves[3])
    y64.backward(gy.double())
    for got, want in zip((x.grad, w.grad, b.grad, r.grad), (t.grad for t in leaves)):
        _close(got, want)
    y = fu.conv_bias_act(x, w, b, r, padding=1)
    with pytest.raises(NotSupportedError, match="double backward"):   # refused, not silently wrong
        torch.autograd.grad(y.sum(), x, create_graph=True)


def test_conv_bias_act_modules_keep_torch_state_dict_and_fall_back_for_broadcast_residuals():
    torch.manual_seed(6)
    m = rnn.ConvBiasAct2d(3, 5, 3, padding=1, activation="relu")
    assert isinstance(m, torch.nn.Conv2d) and "activation='relu'" in repr(m)
    assert list(m.state_dict()) == list(torch.nn.Conv2d(3, 5, 3).state_dict())
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        _close(m(x), _ref(x, m.weight, m.bias, None, 1, 1, 1, 1, "relu"))
        rb = torch.randn(5, 1, 1)   # broadcasts: added in torch after the fused conv + bias
        want = torch.relu(_ref(x, m.weight, m.bias, None, 1, 1, 1, 1, "none") + rb.double())
        _close(m(x, rb), want)
        m1 = rnn.ConvBiasAct1d(3, 4, 3, padding=2, padding_mode="circular", activation="none")
        x1 = torch.randn(2, 3, 9)
        t1 = torch.nn.Conv1d(3, 4, 3, padding=2, padding_mode="circular").double()
        t1.load_state_dict(m1.state_dict())
        _close(m1(x1), t1(x1.double()))
        m3 = rnn.ConvBiasAct3d(2, 3, 3, padding="same")
        x3 = torch.randn(1, 2, 4, 5, 6)
        _close(m3(x3), _ref(x3, m3.weight, m3.bias, None, 1, "same", 1, 1, "relu"))


@pytest.fixture
def no_c_calls(monkeypatch):
    def boom():
        raise AssertionError("a C function was called")
    monkeypatch.setattr(_dnnl, "lib", boom)
    fu.clear_cache()


def test_bad_input_is_rejected_before_any_c_call(no_c_calls):
    x, w, b = torch.randn(2, 4, 6, 6), torch.randn(8, 4, 3, 3), torch.randn(8)
    with pytest.raises(ArgumentError, match="residual must have the output's shape"):
        fu.conv_bias_act(x, w, b, torch.randn(2, 8, 5, 5), padding=1)
    with pytest.raises(ArgumentError, match="residual must be torch.float32"):
        fu.conv_bias_act(x, w, b, torch.randn(2, 8, 6, 6, dtype=torch.float64), padding=1)
    with pytest.raises(ArgumentTypeError):
        fu.conv_bias_act(x, w, b, [1.0], padding=1)
    with pytest.raises(ArgumentError, match="activation"):
        fu.conv_bias_act(x, w, b, activation="mish")
    with pytest.raises(ArgumentError, match="CUDA tensors"):
        fu.conv_bias_act(x, w, b, backend="cudnn")
    with pytest.raises(ArgumentError, match="backend"):
        fu.conv_bias_act(x, w, b, backend="mkl")
    with pytest.raises(ArgumentError, match="groups"):
        fu.conv_bias_act(x, w, b, groups=3)
    with pytest.raises(ArgumentError, match="precision"):
        torch.ops.rawconv.conv_bias_act(x, w, b, None, [1, 1], [1, 1], [1, 1], 1, "relu", "auto", None, "fp8")
    with pytest.raises(ArgumentError, match="padding"):
        torch.ops.rawconv.conv_bias_act(x, w, b, None, [1, 1], [1, 1, 1], [1, 1], 1, "relu", "auto", None, "strict")
    with pytest.raises(ArgumentTypeError):
        fu.FusedConvolution(x, w, b, residual="yes")


def test_unknown_choice_names_what_is_offered():
    x, w = torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3)
    with pytest.raises(NotSupportedError, match="offered"):
        fu.conv_bias_act(x, w, None, choice="no-such-impl")


def test_zero_batch_gives_torchs_result_without_a_library_call():
    w, b = torch.randn(4, 3, 3, 3), torch.randn(4)
    x = torch.randn(0, 3, 5, 5)
    y = fu.conv_bias_act(x, w, b, torch.randn(0, 4, 5, 5), padding=1)
    assert y.shape == (0, 4, 5, 5)


# ---------------------------------------------------------------- the cuDNN graph's residual node (no GPU)
@pytest.fixture(scope="module")
def cudnn():
    return load_cudnn_or_fail()


@pytest.mark.parametrize("bias, act, kinds", [
    (True, "relu", ["add", "add", "relu"]), (False, "relu", ["add", "relu"]), (True, None, ["add", "add"]),
    (False, None, ["add"])])
def test_residual_graph_descriptors_finalize_without_gpu(cudnn, bias, act, kinds):
    from rawconv.cudnn.graph import _backend_api as B
    from rawconv import cudnn_graph as G

    p = ConvProblem(n=2, c=8, k=16, in_spatial=(9, 9), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1),
                    layout="nhwc", dtype="float16", device="cuda:0", has_bias=bias)
    g = G.OperationGraph(p, "forward", act, "nhwc", residual=True)
    assert all(op.finalized for op in g.ops)
    assert [op.kind for op in g.ops] == ["OPERATION_CONVOLUTION_FORWARD"] + ["OPERATION_POINTWISE"] * len(kinds)
    assert g.uids == [1, 2, 3] + ([4] if bias else []) + [5]
    assert g.roles == ["x", "w", "y"] + (["b"] if bias else []) + ["r"]
    # the residual tensor: y's dims and strides, the data type of the data
    assert g.tensors["r"].get("TENSOR_DIMENSIONS", "INT64") == list(p.y_shape)
    assert g.tensors["r"].get("TENSOR_STRIDES", "INT64") == g.tensors["y"].get("TENSOR_STRIDES", "INT64")
    assert g.tensors["r"].get_one("TENSOR_UNIQUE_ID", "INT64") == 5
    assert g.strides["r"] == g.strides["y"]
    del B
    with pytest.raises(ArgumentError, match="forward"):
        G.OperationGraph(p.with_(has_bias=False), "backward_data", None, "nhwc", residual=True)


def test_residual_graph_autotune_checks_candidates_against_the_residual_reference():
    """The search's correctness check (GraphConvolution.check_output) on a residual graph compares
    with act(conv + b + r), not with the base class's act(conv + b): checked on CPU tensors."""
    from rawconv import cudnn_graph as G

    cls = fu._graph_class()
    plan = cls.__new__(cls)   # no GPU here: only what check_output reads
    p = ConvProblem(n=2, c=4, k=6, in_spatial=(5, 5), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1),
                    has_bias=True)
    plan.problem, plan.direction, plan.activation, plan._ref_r = p, "forward", "relu", None
    torch.manual_seed(12)
    t = {"x": torch.randn(p.x_shape), "w": torch.randn(p.w_shape), "b": torch.randn(6), "r": torch.randn(p.y_shape)}
    plan._tune_tensors = t
    base_ref, base_abs = G.reference(p, "forward", t, activation="relu")   # what autotune passes in
    right = _ref(t["x"], t["w"], t["b"], t["r"], 1, 1, 1, 1, "relu").float()
    wrong = _ref(t["x"], t["w"], t["b"], None, 1, 1, 1, 1, "relu").float()
    cfg = G.EngineConfig(0)
    assert plan.check_output(right, cfg, base_ref, base_abs).ok
    assert not plan.check_output(wrong, cfg, base_ref, base_abs).ok


def test_residual_graph_plan_needs_cuda_tensors():
    p = ConvProblem(n=1, c=4, k=4, in_spatial=(6, 6), kernel=(3, 3), device="cpu")
    with pytest.raises(ArgumentError, match="CUDA"):
        fu._graph_class().for_problem(p)


# ---------------------------------------------------------------- GPU (the lead runs these on the device machine)
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("residual", [False, True])
def test_cuda_conv_bias_act_matches_float64(dtype, residual):
    torch.manual_seed(9)
    x = torch.randn(4, 32, 14, 14, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
    w = torch.randn(64, 32, 3, 3, device="cuda", dtype=dtype).to(memory_format=torch.channels_last) * 0.1
    b = torch.randn(64, device="cuda", dtype=dtype)
    r = torch.randn(4, 64, 14, 14, device="cuda", dtype=dtype).to(memory_format=torch.channels_last) \
        if residual else None
    y = fu.conv_bias_act(x, w, b, r, padding=1)
    want = _ref(x.cpu().float(), w.cpu().float(), b.cpu().float(), r.cpu().float() if r is not None else None, 1, 1, 1,
                1, "relu")
    _close(y.cpu(), want, rel=2e-5 if dtype == torch.float32 else 4e-3)
    assert y.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.gpu
def test_cuda_residual_graph_autotune_checks_against_the_residual_reference():
    torch.manual_seed(10)
    x = torch.randn(8, 64, 28, 28, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    w = (torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.float16) * 0.05).to(memory_format=torch.channels_last)
    b = torch.randn(64, device="cuda", dtype=torch.float16)
    r = torch.randn(8, 64, 28, 28, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    plan = fu.plan_for(x, w, b, r, 1, 1, backend="cudnn")
    rows = plan.autotune(budget_s=3, use_cache=False)
    assert rows[0].status == "ok"
    y = plan.run(x, w, b, r)
    _close(y.cpu(), _ref(x.cpu().float(), w.cpu().float(), b.cpu().float(), r.cpu().float(), 1, 1, 1, 1, "relu"),
           rel=4e-3)
    name = plan.selected_name
    y2 = fu.conv_bias_act(x, w, b, r, padding=1, choice=name)
    torch.testing.assert_close(y2, y)


@pytest.mark.gpu
def test_cuda_fused_module_captures_into_a_cuda_graph():
    torch.manual_seed(11)
    m = rnn.ConvBiasAct2d(16, 16, 3, padding=1).cuda().half().to(memory_format=torch.channels_last).eval()
    x = torch.randn(2, 16, 10, 10, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    r = torch.randn_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            m(x, r)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        out = m(x, r)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    want = _ref(x.cpu().float(), m.weight.cpu().float(), m.bias.cpu().float(), r.cpu().float(), 1, 1, 1, 1, "relu")
    _close(out.cpu(), want, rel=4e-3)


def test_layers_of_the_same_shape_read_their_own_weights():
    """The function form keeps no weights across calls: two layers of the same problem share a
    plan, and each call reads (reorders) its own weights, also after an update through .data.
    (Frozen modules' snapshots: tests/test_prepack.py.)"""
    torch.manual_seed(13)
    x = torch.randn(1, 8, 6, 6)
    w1, w2, b = torch.randn(8, 8, 3, 3), torch.randn(8, 8, 3, 3), torch.randn(8)
    assert fu.plan_for(x, w1, b, None, 1, 1) is fu.plan_for(x, w2, b, None, 1, 1)
    for _ in range(2):
        for w in (w1, w2):
            _close(fu.conv_bias_act(x, w, b, padding=1), _ref(x, w, b, None, 1, 1, 1, 1, "relu"))
        w1.data[4:].zero_()


def test_torch_compile_traces_the_fused_backward_too():
    """With grad on, torch.compile traces the fused op's backward with fake tensors: it must go
    through the registered backward operators (a direct library call asked a FakeTensor for its
    data pointer). Gradients of the compiled model equal eager autograd's and float64's."""
    torch.manual_seed(8)
    m = rnn.ConvBiasAct2d(4, 6, 3, padding=1)
    x = torch.randn(2, 4, 7, 7).to(memory_format=torch.channels_last).requires_grad_()
    r = torch.randn(2, 6, 7, 7).to(memory_format=torch.channels_last).requires_grad_()
    f = torch.compile(m, fullgraph=True, backend="aot_eager")
    y = f(x, r)
    gy = torch.randn_like(y)
    y.backward(gy)
    grads = [t.grad.clone() for t in (x, r, m.weight, m.bias)]
    leaves = [t.detach().double().requires_grad_() for t in (x, r, m.weight, m.bias)]
    y64 = torch.relu(F.conv2d(leaves[0], leaves[2], leaves[3], padding=1) + leaves[1])
    y64.backward(gy.double())
    _close(y, y64)
    for got, t in zip(grads, leaves):
        _close(got, t.grad)


def test_inplace_residual_operator_passes_opcheck_and_writes_the_residual():
    torch.manual_seed(11)
    x, w, b = torch.randn(2, 4, 6, 6), torch.randn(8, 4, 3, 3), torch.randn(8)
    for r in (torch.randn(2, 8, 6, 6), torch.randn(2, 8, 6, 6).to(memory_format=torch.channels_last),
              torch.randn(2, 8, 6, 12)[..., ::2]):   # dense, another layout (copied back), strided (copied back)
        want = _ref(x, w, b, r, 1, 1, 1, 1, "relu")
        args = (x, w, b, r, [1, 1], [1, 1], [1, 1], 1, "relu", "auto", None, "strict")
        res = torch.library.opcheck(torch.ops.rawconv.conv_bias_act_residual_.default, args)   # every check
        assert set(res.values()) == {"SUCCESS"}, res
        r2 = r.clone(memory_format=torch.preserve_format) if r.is_contiguous() or \
            r.is_contiguous(memory_format=torch.channels_last) else r
        r2 = r.clone() if r2 is r else r2
        before = r2.data_ptr()
        out = torch.ops.rawconv.conv_bias_act_residual_(x, w, b, r2, [1, 1], [1, 1], [1, 1], 1, "relu", "auto",
                                                        None, "strict")
        assert out is None and r2.data_ptr() == before
        _close(r2, want)


def _resnet_block_model():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.bn0 = torch.nn.BatchNorm2d(8)
            self.c1 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
            self.bn1 = torch.nn.BatchNorm2d(8)
            self.c2 = torch.nn.Conv2d(8, 8, 1, bias=False)
            self.bn2 = torch.nn.BatchNorm2d(8)

        def forward(self, x):
            h = torch.relu(self.bn0(self.stem(x)))
            y = self.bn2(self.c2(torch.relu(self.bn1(self.c1(h)))))
            return torch.relu(y + h)

    torch.manual_seed(12)
    m = Block().eval()
    for bn in (m.bn0, m.bn1, m.bn2):
        bn.running_mean.uniform_(-0.2, 0.2)
        bn.running_var.uniform_(0.5, 1.5)
    return m


def test_compiled_converted_model_keeps_weights_reordered_and_the_residual_in_place():
    m = _resnet_block_model()
    x = torch.randn(2, 3, 12, 12).to(memory_format=torch.channels_last)
    with torch.no_grad():
        want = m(x)
    cm = rnn.convert(m, fuse=True)
    c2 = dict(cm.named_modules())["c2"]
    assert c2.__dict__.get("residual_inplace")
    snap = c2._buffers[fu.FROZEN_WEIGHT]
    plans = fu.frozen_plans_of(snap)
    assert plans is not None and len(plans) == 0
    f = torch.compile(cm, fullgraph=True, backend="aot_eager")
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        for _ in range(2):
            _close(f(x), want, rel=1e-4)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            _close(f(x), want, rel=1e-4)
    names = [e.name for e in prof.events()]
    assert names.count("rawconv::conv_bias_act_residual_") == 1
    # the kernel found the snapshot's own plans: one plan, whose weight snapshot is the buffer itself
    assert len(plans) == 1 and next(iter(plans.values()))._snap[0] is snap


def test_a_moved_snapshot_gets_the_modules_plans_in_eager_inference():
    m = _resnet_block_model()
    x = torch.randn(2, 3, 12, 12)
    cm = rnn.convert(m, fuse=True)
    cm._apply(lambda t: t.clone())   # new tensors, as .to() / .half() / .cuda() make
    c1 = dict(cm.named_modules())["c1"]
    snap = c1._buffers[fu.FROZEN_WEIGHT]
    plans = fu.frozen_plans_of(snap)   # the module's own (emptied: the snapshot is taken again)
    assert plans is not None and plans is c1.__dict__[fu._FROZEN_PLANS] and len(plans) == 0
    with torch.no_grad():
        _close(cm(x), m(x), rel=1e-4)
    assert fu.frozen_plans_of(snap) is plans and len(plans) == 1   # retaken in place: the same buffer


def test_a_snapshot_changed_in_place_is_reordered_again():
    m = _resnet_block_model()
    x = torch.randn(2, 3, 12, 12)
    cm = rnn.convert(m, fuse=True)
    c1 = dict(cm.named_modules())["c1"]
    snap = c1._buffers[fu.FROZEN_WEIGHT]
    f = torch.compile(cm, fullgraph=True, backend="aot_eager")
    for run in (cm, f):
        with torch.no_grad():
            run(x)   # the plan holds the snapshot reordered
            snap.mul_(-0.5)   # the buffer changed in place: the plan's reordered copy is stale
            m.c1.weight.mul_(-0.5)
            _close(run(x), m(x), rel=1e-4)


def test_a_snapshots_plans_tell_calls_with_and_without_a_bias_apart():
    # the kernel finds the plans on the snapshot tensor whatever else the call passes
    cm = rnn.convert(_resnet_block_model(), fuse=True)
    c1 = dict(cm.named_modules())["c1"]
    snap, sb = c1._buffers[fu.FROZEN_WEIGHT], c1._buffers[fu.FROZEN_BIAS]
    h = torch.randn(2, 8, 12, 12)
    with torch.no_grad():
        for b in (sb, None, sb):
            y = torch.ops.rawconv.conv_bias_act(h, snap, b, None, [1, 1], [1, 1], [1, 1], 1, "relu", "auto", None,
                                                "strict")
            _close(y, _ref(h, snap, b, None, 1, 1, 1, 1, "relu"))


@pytest.mark.parametrize("needs", ["residual", "nonleaf_residual", "x", "w", "bias"])
def test_inplace_residual_operator_refuses_to_drop_a_gradient(needs):
    # torch.library allows no autograd formula for a mutating operator: its default one recorded
    # nothing, so the overwritten residual carried no gradient (or its old one) without a word
    torch.manual_seed(13)
    t = {"x": torch.randn(2, 4, 6, 6), "w": torch.randn(8, 4, 3, 3), "bias": torch.randn(8),
         "residual": torch.randn(2, 8, 6, 6)}
    if needs == "nonleaf_residual":
        t["residual"] = torch.randn(2, 8, 6, 6, requires_grad=True) * 1
    else:
        t[needs].requires_grad_(True)
    before = t["residual"].detach().clone()

    def call():
        torch.ops.rawconv.conv_bias_act_residual_(t["x"], t["w"], t["bias"], t["residual"], [1, 1], [1, 1], [1, 1],
                                                  1, "relu", "auto", None, "strict")

    with pytest.raises(NotSupportedError, match="conv_bias_act"):
        call()
    assert torch.equal(t["residual"].detach(), before)   # refused before any library call
    with torch.no_grad():   # no gradient asked for: runs in place
        call()
    _close(t["residual"], _ref(t["x"], t["w"], t["bias"], before, 1, 1, 1, 1, "relu"))


def test_forward_mode_ad_and_torch_func_grad_are_refused_not_dropped():
    """A forward-mode tangent through rawconv::conv_bias_act was dropped (torch.func.jvp returned
    zeros, forward_ad a None tangent: silently wrong), and torch.func.grad raised InternalError.
    Both now raise NotSupportedError before any library call; vmap without grad still runs."""
    import torch.autograd.forward_ad as fwd

    torch.manual_seed(9)
    x, w, b, r = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3), torch.randn(4), torch.randn(2, 4, 6, 6)
    with pytest.raises(NotSupportedError, match="forward-mode"):
        torch.func.jvp(lambda xx: fu.conv_bias_act(xx, w, b, padding=1), (x,), (torch.ones_like(x),))
    with fwd.dual_level(), pytest.raises(NotSupportedError, match="forward-mode"):
        fu.conv_bias_act(x, w, b, fwd.make_dual(r, torch.ones_like(r)), padding=1)
    with pytest.raises(NotSupportedError, match="torch.func"):
        torch.func.grad(lambda ww: fu.conv_bias_act(x, ww, b, padding=1).sum())(w)
    m = rnn.ConvBiasAct2d(3, 4, 3, padding=1)
    with torch.no_grad(), fwd.dual_level(), pytest.raises(NotSupportedError, match="forward-mode"):
        m(fwd.make_dual(x, torch.ones_like(x)))   # the module's eager path went around the operator
    with torch.no_grad(), fwd.dual_level(), pytest.raises(NotSupportedError, match="forward-mode"):
        torch.ops.rawconv.conv_bias_act_residual_(fwd.make_dual(x, torch.ones_like(x)), w, b, r.clone(), [1, 1],
                                                  [1, 1], [1, 1], 1, "relu", "auto", None, "strict")
    with fwd.dual_level():   # a level open, no tangent on these tensors: runs
        y = fu.conv_bias_act(x, w, b, padding=1)
    want = torch.relu(F.conv2d(x.double(), w.double(), b.double(), padding=1))
    assert (y.double() - want).abs().max().item() < 1e-4
