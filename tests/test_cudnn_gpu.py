"""rawconv.cudnn on a GPU: every algo x math type, forward and both backwards, against float64
references; fp32/fp16/bf16, NCHW/NHWC, 1-D/2-D/3-D, groups, dilation, asymmetric padding; cases
G1-G7 of shared/cases/README.md. Outputs are pre-filled with NaN so unwritten elements show."""
from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

from rawconv import ConvProblem, cudnn
from rawconv.errors import ArgumentError, NotSupportedError
from rawconv.problem import EPS, abs_reference, compare_to_reference, empty_like_layout, to_layout

pytestmark = pytest.mark.gpu

MAX_WS = 1 << 30


def _compute(dtype: str, math: str) -> str | None:
    """The input precision the tolerance assumes for a (dtype, reported math type) row."""
    if dtype == "float32" and math in ("default", "tensor_op"):
        return "tf32"
    if dtype == "float32" and math == "tensor_op_allow_conversion":
        return "float16"  # may down-convert to fp16/bf16 on tensor cores
    return None


def _factor(algo: str) -> float:
    # transform algos (Winograd, FFT) round in the transformed domain: their error does not shrink
    # with a short reduction (depthwise 3x3: L = 9), so they get a wider bound
    return 64.0 if ("FFT" in algo or "WINOGRAD" in algo) else 1.0


def _nan(shape, layout, dtype, wl=None):
    t = empty_like_layout(shape, wl or layout, dtype, "cuda")
    return t.fill_(float("nan"))


def _grads64(p: ConvProblem, x, w, gy, use_abs=False):
    """float64 CPU gradients (dx, dw) of the forward problem by autograd (asymmetric padding too)."""
    f = (lambda t: t.detach().abs()) if use_abs else (lambda t: t.detach())
    x64 = f(x).to("cpu", torch.float64).requires_grad_()
    w64 = f(w).to("cpu", torch.float64).requires_grad_()
    pad = []
    for b, a in reversed(list(zip(p.pad_before, p.pad_after))):
        pad += [b, a]
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[p.ndim]
    y = conv(F.pad(x64, pad), w64, None, p.stride, 0, p.dilation, p.groups)
    y.backward(f(gy).to("cpu", torch.float64))
    return x64.grad, w64.grad


PROBLEMS = [
    dict(n=2, c=8, k=16, in_spatial=(12, 12), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1)),
    dict(n=2, c=8, k=8, in_spatial=(11, 9), kernel=(3, 3), stride=(2, 1), dilation=(2, 1),
         pad_before=(2, 1), pad_after=(2, 1), groups=2),
    dict(n=2, c=16, k=16, in_spatial=(10, 10), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1), groups=16),
    dict(n=2, c=4, k=8, in_spatial=(6, 7, 5), kernel=(3, 3, 3), pad_before=(1, 1, 1), pad_after=(1, 1, 1)),
    dict(n=3, c=8, k=8, in_spatial=(20,), kernel=(5,), stride=(2,), dilation=(2,), pad_before=(3,), pad_after=(3,)),
    dict(n=2, c=8, k=16, in_spatial=(13, 13), kernel=(3, 3), stride=(2, 2), pad_before=(1, 0), pad_after=(0, 2)),
]
IDS = ["2d", "2d-s-d-g", "2d-depthwise", "3d", "1d", "2d-asym"]


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("spec", PROBLEMS, ids=IDS)
@pytest.mark.parametrize("direction", cudnn.DIRECTIONS)
def test_every_algo_and_math_type(spec, dtype, layout, direction):
    p = ConvProblem(dtype=dtype, layout=layout, device="cuda", **spec)
    x, w, _ = p.make_inputs(seed=3)
    if layout == "nhwc":
        w = to_layout(w, "nhwc")
    gy = to_layout(torch.randn(p.y_shape, dtype=torch.float64).to(p.torch_dtype), layout).cuda()
    probe = cudnn.Convolution.from_problem(p, direction=direction, w_layout=layout)
    rows = [r for r in probe.algorithms("heuristic", "all") if r.ok and r.workspace_bytes <= MAX_WS]
    assert rows, f"cuDNN lists no usable {direction} algo for {p.describe()}"
    if direction == "forward":
        ref, ref_abs, tp = p.reference(x, w), abs_reference(p, x, w), p
    elif direction == "backward_data":
        ref, _ = _grads64(p, x, w, gy)
        ref_abs, _ = _grads64(p, x, w, gy, use_abs=True)
        tp = types.SimpleNamespace(dtype=p.dtype, reduction_length=(p.k // p.groups) * int(torch.tensor(p.kernel).prod()))
    else:
        _, ref = _grads64(p, x, w, gy)
        _, ref_abs = _grads64(p, x, w, gy, use_abs=True)
        tp = types.SimpleNamespace(dtype=p.dtype, reduction_length=p.n * int(torch.tensor(p.out_spatial).prod()))
    failures, ran = [], 0
    for r in rows:
        plan = cudnn.Convolution.from_problem(p, direction=direction, w_layout=layout, algo=r.algo_id,
                                              math=r.requested_math)
        try:
            if direction == "forward":
                out = _nan(p.y_shape, layout, p.torch_dtype)
                y, info = plan.execute(x, w, out=out, return_info=True)
            elif direction == "backward_data":
                out = _nan(p.x_shape, layout, p.torch_dtype)
                y, info = plan.execute(grad_y=gy, w=w, out=out, return_info=True)
            else:
                out = _nan(p.w_shape, layout, p.torch_dtype)
                y, info = plan.execute(x, grad_y=gy, out=out, return_info=True)
        except NotSupportedError as exc:  # listed by the heuristic but refused at run time: say so
            failures.append(f"{r.algo}/{r.requested_math}: NotSupported at run: {exc}")
            continue
        torch.cuda.synchronize()
        ran += 1
        assert info.algo_id == r.algo_id and info.math == r.requested_math
        factor = _factor(r.algo)
        if direction != "forward" and dtype in ("float16", "bfloat16") and r.algo in ("ALGO_0", "ALGO_1"):
            # seen with cuDNN 9.19 on the H200: these backward algos round partial sums to the data
            # type (fp16/bf16), so their bound uses the data type's epsilon for the accumulation
            factor *= EPS[dtype] / EPS["float32"]
        st = compare_to_reference(tp, y, ref, ref_abs, compute=_compute(dtype, info.math_reported), factor=factor)
        if not st.ok and factor > 1 and st.nan == 0 and ("FFT" in r.algo or "WINOGRAD" in r.algo):
            # transform algos spread rounding over every output, also where the exact result is 0
            # (e.g. dx positions no gradient reaches): check them normwise instead
            L = max(tp.reduction_length, 1)
            eps = EPS["float32"] if dtype == "float32" else EPS[dtype]
            if st.max_abs <= factor * 4 * eps * L ** 0.5 * float(ref_abs.abs().max()):
                continue
        if not st.ok:
            failures.append(f"{r.algo}/{r.requested_math} (reported {info.math_reported}): {st}")
    assert ran > 0
    assert not failures, f"{p.describe()} {direction}:\n" + "\n".join(failures)


def test_function_forms_and_default_fma():
    p = ConvProblem(n=4, c=16, k=32, in_spatial=(14, 14), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1),
                    device="cuda", has_bias=True)
    x, w, b = p.make_inputs(seed=1)
    ref, ref_abs = p.reference(x, w, b), abs_reference(p, x, w, b)
    for algo in (None, "fastest", "IMPLICIT_GEMM"):
        y, info = cudnn.forward(x, w, b, padding=1, algo=algo, return_info=True)
        assert info.math == "fma" and info.math_reported == "fma", info
        assert compare_to_reference(p, y, ref, ref_abs).ok
    # fused bias + relu
    y, info = cudnn.forward(x, w, b, padding=1, activation="relu", return_info=True)
    assert info.fused in (True, False)
    assert compare_to_reference(p, y, ref.clamp_min(0), ref_abs).ok
    # identity fused only with IMPLICIT_PRECOMP_GEMM
    y, info = cudnn.forward(x, w, b, padding=1, algo="IMPLICIT_PRECOMP_GEMM", activation="identity",
                            return_info=True)
    assert compare_to_reference(p, y, ref, ref_abs).ok
    # a second call hits the cached plan and gives the same bits
    assert torch.equal(cudnn.forward(x, w, b, padding=1), cudnn.forward(x, w, b, padding=1))


def test_backward_functions_and_transpose_match_torch():
    x = torch.randn(2, 6, 9, 9, device="cuda", dtype=torch.float64)
    w = torch.randn(6, 4, 3, 3, device="cuda", dtype=torch.float64)
    y = cudnn.conv_transpose(x, w, stride=2, padding=1, output_padding=1, groups=2)
    ref = F.conv_transpose2d(x.cpu(), w.cpu(), stride=2, padding=1, output_padding=1, groups=2)
    assert y.shape == ref.shape
    torch.testing.assert_close(y.cpu(), ref, rtol=1e-10, atol=1e-10)
    xf, wf = torch.randn(2, 4, 8, 8, device="cuda"), torch.randn(6, 2, 3, 3, device="cuda")
    gy = torch.randn(2, 6, 8, 8, device="cuda")
    dx = cudnn.backward_data(gy, wf, xf.shape, padding=1, groups=2)
    dw = cudnn.backward_filter(xf, gy, wf.shape, padding=1, groups=2)
    torch.testing.assert_close(dx.cpu().double(), torch.nn.grad.conv2d_input(xf.shape, wf.cpu().double(),
                               gy.cpu().double(), padding=1, groups=2), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dw.cpu().double(), torch.nn.grad.conv2d_weight(xf.cpu().double(), wf.shape,
                               gy.cpu().double(), padding=1, groups=2), rtol=1e-4, atol=1e-3)


def test_forced_unsupported_algo_names_the_supported_ones():
    x, w = torch.randn(8, 64, 56, 56, device="cuda"), torch.randn(64, 64, 3, 3, device="cuda")
    bad = None
    rows = cudnn.algorithms(x, w, padding=1, mode="heuristic", math="fma")
    ok = {r.algo for r in rows if r.ok}
    for name in cudnn.ALGOS["forward"].values():
        if name not in ok:
            bad = name
            break
    if bad is None:
        pytest.skip("every forward algo is supported here")
    with pytest.raises(NotSupportedError) as info:
        cudnn.forward(x, w, padding=1, algo=bad, math="fma")
    assert bad in str(info.value) and info.value.offered
    assert set(info.value.offered) <= ok


def test_empty_tensors_return_torch_result():
    w = torch.randn(3, 3, 3, 3, device="cuda")
    y = cudnn.forward(torch.randn(0, 3, 3, 3, device="cuda"), w)
    assert y.shape == (0, 3, 1, 1)
    w2, b = torch.randn(32, 32, 2, 2, device="cuda"), torch.randn(32, device="cuda")
    y = cudnn.forward(torch.randn(2, 32, 0, 5, device="cuda"), w2, b, padding=1)
    assert y.shape == (2, 32, 1, 6)
    torch.testing.assert_close(y, b.view(1, -1, 1, 1).expand(2, 32, 1, 6))


def test_other_stream_and_workspace_limit():
    x, w = torch.randn(4, 32, 28, 28, device="cuda"), torch.randn(32, 32, 3, 3, device="cuda")
    ref = F.conv2d(x.double(), w.double(), padding=1)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y, info = cudnn.forward(x, w, padding=1, workspace_limit=0, return_info=True)
    s.synchronize()
    assert info.workspace_bytes == 0
    torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=1e-4)


def test_deterministic_is_honoured():
    x, gy = torch.randn(4, 16, 20, 20, device="cuda"), torch.randn(4, 16, 20, 20, device="cuda")
    dw, info = cudnn.backward_filter(x, gy, (16, 16, 3, 3), padding=1, deterministic=True, return_info=True)
    assert info.deterministic
    assert torch.equal(dw, cudnn.backward_filter(x, gy, (16, 16, 3, 3), padding=1, deterministic=True))


def test_tensor_on_wrong_plan_is_rejected():
    plan = cudnn.Convolution(torch.randn(1, 3, 8, 8, device="cuda"), torch.randn(4, 3, 3, 3, device="cuda"))
    with pytest.raises(ArgumentError, match="shape"):
        plan.execute(torch.randn(2, 3, 8, 8, device="cuda"))
    with pytest.raises(ArgumentError, match="dtype|torch.float32"):
        plan.execute(torch.randn(1, 3, 8, 8, device="cuda").half())
    plan.free()
    with pytest.raises(ArgumentError, match="freed"):
        plan.execute()


def test_autotune_plan():
    x, w = torch.randn(8, 32, 28, 28, device="cuda"), torch.randn(64, 32, 3, 3, device="cuda")
    with cudnn.Convolution(x, w, padding=1) as plan:
        rows = plan.autotune(iterations=5, warmup=1)
        assert rows and rows[0].median_ms <= rows[-1].median_ms
        assert plan.info.algo_id == rows[0].algorithm.algo_id
        y = plan.execute()
        torch.testing.assert_close(y.double(), F.conv2d(x.double(), w.double(), padding=1), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- shared/cases G1-G7
def test_G1_fp16_stride2_every_algo_and_math():
    x = torch.arange(1, 9, dtype=torch.float16, device="cuda").view(1, 2, 2, 2)
    w = torch.tensor([1.0, 2.0], dtype=torch.float16, device="cuda").view(1, 2, 1, 1)
    rows = [r for r in cudnn.algorithms(x, w, stride=2, mode="heuristic") if r.ok]
    assert rows
    for r in rows:
        y = cudnn.forward(x, w, stride=2, algo=r.algo_id, math=r.requested_math)
        assert y.shape == (1, 1, 1, 1) and float(y) == 11.0, (r, float(y))


def test_G2_fma_rows_agree():
    x, w = torch.randn(8, 64, 16, 16, device="cuda"), torch.randn(128, 64, 1, 1, device="cuda")
    y = cudnn.forward(x, w)
    y1 = cudnn.forward(x[:1], w)
    assert (y[:1] - y1).abs().max().item() <= 1e-5 * y1.abs().max().item()


def test_G3_past_int32_elements():
    x = torch.empty(1, 514, 2048, 2048, dtype=torch.float16, device="cuda")
    w = torch.randn(1, 514, 3, 3, dtype=torch.float16, device="cuda")
    with pytest.raises(NotSupportedError, match=r"2\^31"):
        cudnn.forward(x, w, padding=1)
    del x
    # a batch past 2^31 whose samples fit: split, and correct
    x = torch.randn(2, 514, 1448, 1448, dtype=torch.float16, device="cuda")
    assert x.numel() > 2 ** 31
    y, info = cudnn.forward(x, w, padding=1, return_info=True)
    assert any("chunks" in n for n in info.notes)
    for i in range(2):
        ref = F.conv2d(x[i:i + 1].float(), w.float(), padding=1)
        err = (y[i:i + 1].float() - ref).abs().max().item()
        assert err <= 2e-2 * ref.abs().max().item(), err
    del x, y


def test_G4_asymmetric_padding():
    x, w = torch.randn(1, 32, 416, 416, device="cuda"), torch.randn(64, 32, 3, 3, device="cuda")
    p = ConvProblem.from_torch(x, w, None, 2, ((1, 0), (1, 0)))
    ref, ref_abs = p.reference(x, w), abs_reference(p, x, w)
    for algo in (None, "fastest"):
        y = cudnn.forward(x, w, stride=2, padding=((1, 0), (1, 0)), algo=algo)
        assert y.shape == (1, 64, 208, 208)
        assert compare_to_reference(p, y, ref, ref_abs).ok
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # torch's default lets conv use TF32
        torch.testing.assert_close(y, F.conv2d(F.pad(x, (1, 0, 1, 0)), w, stride=2), rtol=1e-4, atol=1e-4)


def test_G5_transposed_workspace_listed_and_limit_honoured():
    x = torch.randn(1024, 1, 1024, 1024, dtype=torch.float16, device="cuda")
    w = torch.full((1, 1, 1, 1), 0.5, dtype=torch.float16, device="cuda")
    rows = cudnn.algorithms(torch.empty(1024, 1, 1024, 1024, dtype=torch.float16, device="cuda"), w,
                            direction="backward_data", mode="heuristic")
    assert rows and all(isinstance(r.workspace_bytes, int) for r in rows)
    limit = 64 << 20
    y, info = cudnn.conv_transpose(x, w, workspace_limit=limit, return_info=True)
    assert info.workspace_bytes <= limit
    assert torch.equal(y, x * 0.5)


def test_G6_bf16_1d_same_style_padding():
    x = torch.randn(2, 4, 16, device="cuda").bfloat16()
    w = torch.randn(16, 4, 3, device="cuda").bfloat16()
    p = ConvProblem.from_torch(x, w, None, 2, ((1, 2),), 2)
    y = cudnn.forward(x, w, stride=2, padding=((1, 2),), dilation=2)
    assert y.shape == (2, 16, 8)
    assert compare_to_reference(p, y, p.reference(x, w), abs_reference(p, x, w)).ok


def test_G7_default_math_reported_fma_is_default():
    x, w = torch.randn(8, 64, 56, 56, device="cuda"), torch.randn(64, 64, 3, 3, device="cuda")
    p = ConvProblem.from_torch(x, w, None, 1, 1)
    ref, ref_abs = p.reference(x, w), abs_reference(p, x, w)
    seen = []
    for r in cudnn.algorithms(x, w, padding=1, mode="heuristic", math="default"):
        if not r.ok or r.workspace_bytes > MAX_WS:
            continue
        y, info = cudnn.forward(x, w, padding=1, algo=r.algo_id, math="default", return_info=True)
        assert info.math == "default"
        st = compare_to_reference(p, y, ref, ref_abs, compute="tf32", factor=_factor(r.algo))
        assert st.ok, (r, st)
        seen.append((r.algo, info.math_reported, st.max_abs))
        try:
            yf, infof = cudnn.forward(x, w, padding=1, algo=r.algo_id, return_info=True)  # rawconv default
        except NotSupportedError:
            continue  # this algo has no FMA-math kernel here
        assert infof.math == "fma"
        assert compare_to_reference(p, yf, ref, ref_abs, factor=_factor(r.algo)).ok
    assert seen
    print("G7 default-math rows (algo, reported math, max abs error):", seen)
