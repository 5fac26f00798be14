"""On a GPU: torch's own pick is always a candidate. Convolutions with a bias (ConvNeXt's depthwise
layers) run by default as torch runs them (the convolution-only graph's default config, torch's
pick with cudnn.benchmark off, then the bias added); grouped fused graphs likewise; "unfused:"
configs selected, searched, captured, cached and pinned by convert, each checked against float64.
Speed is shown by benchmarks/diag_depthwise_cuda.py and benchmarks/zoo.py, not asserted here."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import rawconv
from rawconv import cudnn_graph as G

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # conftest skips too; keep collection cheap without a GPU
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def _cl(t):
    return t.contiguous(memory_format=torch.channels_last)


def _dw(n=4, c=96, h=28, k=7, dtype=torch.float16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = _cl(torch.randn(n, c, h, h, device="cuda", dtype=dtype, generator=g))
    w = _cl(torch.randn(c, 1, k, k, device="cuda", dtype=dtype, generator=g) * 0.2)
    b = torch.randn(c, device="cuda", dtype=dtype, generator=g)
    return x, w, b


def _ref(x, w, b, groups, pad, act=None, r=None):
    y = F.conv2d(x.double(), w.double(), None if b is None else b.double(), 1, pad, 1, groups)
    if r is not None:
        y = y + r.double()
    return {None: lambda t: t, "relu": torch.relu, "swish": F.silu, "gelu": F.gelu}[act](y)


def _close(y, ref, dtype):
    tol = 2e-2 if dtype == torch.float16 else 1e-4
    err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
    assert err < tol, f"max error {err:.3g} (relative to max |ref|) over {tol}"


def _torch_engine(fn):
    from rawconv.pytorch.torch_choice import cudnn_api_log, parse_cudnn_log

    fn()
    with cudnn_api_log() as log:
        fn()
        torch.cuda.synchronize()
    assert log.available, log.error
    return parse_cudnn_log(log.messages)["engines"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_a_depthwise_conv_with_bias_runs_torchs_engine_by_default(dtype):
    """The operator with no choice (what rawconv.nn.Conv2d runs) on ConvNeXt's depthwise 7x7 with
    a bias: the convolution-only graph's default config plus torch's bias add, i.e. the cuDNN
    engine torch's own F.conv2d launches (cudnn.benchmark off), right against float64."""
    x, w, b = _dw(dtype=dtype)
    y = rawconv.ops.conv(x, w, b, padding=3, groups=96)
    _close(y, _ref(x, w, b, 96, 3), dtype)
    plan = G.cached_forward_plan(x, w, b, 1, 3, 1, 96, None, None, False, None)
    assert plan.selected_name.startswith("unfused:")
    with rawconv.torch_flags(benchmark=False):
        torch_engines = _torch_engine(lambda: F.conv2d(x, w, b, 1, 3, 1, 96))
    assert torch_engines and plan.engine_id() == torch_engines[0], (plan.selected_name, torch_engines)
    # the module, and again through the operator's hot path
    m = rawconv.nn.Conv2d(96, 96, 7, padding=3, groups=96, device="cuda", dtype=dtype)
    with torch.no_grad():
        m.weight.copy_(w)
        m.bias.copy_(b)
        for _ in range(3):
            _close(m(x), _ref(x, w, b, 96, 3), dtype)


def test_unfused_selection_autograd_and_the_fused_graph_agree():
    """An "unfused:" config and the fused graph compute the same layer; the operator with an
    "unfused:" choice is differentiable (the bias gradient by rawconv's backward)."""
    x, w, b = _dw(c=64, h=14, k=3)
    ref = _ref(x, w, b, 64, 1)
    plan = G.GraphConvolution(x, w, b, 1, 1, 1, 64)
    name = plan.unfused().selected_name
    plan.select("unfused:" + name)
    _close(plan.execute(x, w, b), ref, x.dtype)
    y_hot = plan._hot_forward(x, w, b)   # (the operators' hot path)
    if y_hot is not None:
        _close(y_hot, ref, x.dtype)
    xr, wr, br = (t.detach().float().requires_grad_() for t in (x, w, b))
    y = rawconv.ops.conv(xr, wr, br, padding=1, groups=64, choice="unfused:" + name)
    y.square().sum().backward()
    xt, wt, bt = (t.detach().float().requires_grad_() for t in (x, w, b))
    F.conv2d(xt, wt, bt, 1, 1, 1, 64).square().sum().backward()
    for a, t in ((xr, xt), (wr, wt), (br, bt)):
        torch.testing.assert_close(a.grad, t.grad, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("act", ["relu", "swish"])
def test_grouped_fused_graphs_default_to_unfused_and_are_right(act):
    x, w, b = _dw(c=144, h=28, k=3)
    plan = G.GraphConvolution(x, w, b, 1, 1, 1, 144, activation=act)
    assert plan.selected_name.startswith("unfused:")
    _close(plan.execute(x, w, b), _ref(x, w, b, 144, 1, act), x.dtype)


def test_autotune_keeps_torchs_pick_among_its_rows_and_picks_a_right_one():
    """autotune of a bias graph: both halves searched, the convolution-only graph's default (torch's
    pick) is a row, every ok row is right, the selection is the top row and runs right; the tuning
    cache brings the same choice back."""
    x, w, b = _dw(n=8, c=192, h=28, k=7)
    plan = G.GraphConvolution(x, w, b, 1, 3, 1, 192)
    rows = plan.autotune(budget_s=2.0, use_cache=False)
    names = [r.name for r in rows]
    assert any(n.startswith("unfused:") for n in names)
    assert any("torch's pick" in (r.detail or "") for r in rows), names
    assert rows[0].status == "ok" and plan.selected_name == rows[0].name
    _close(plan.execute(x, w, b), _ref(x, w, b, 192, 3), x.dtype)
    rec = plan.tuning_record
    again = G.GraphConvolution(x, w, b, 1, 3, 1, 192)
    again.autotune(budget_s=2.0)
    assert again.selected_name == plan.selected_name == rec.choice


def test_unfused_residual_graph_and_capture():
    """A residual graph's "unfused:" config (conv alone, then bias, residual and ReLU by torch) is
    right eagerly and replayed from a CUDA graph on new data."""
    from rawconv.pytorch import fused as FU

    x, w, b = _dw(c=32, h=14, k=3)
    w = _cl(torch.randn(32, 32, 3, 3, device="cuda", dtype=torch.float16) * 0.1)
    r = _cl(torch.randn(4, 32, 14, 14, device="cuda", dtype=torch.float16))
    R = FU._graph_class()
    plan = R.for_problem(rawconv.ConvProblem.from_torch(x, w, b, 1, 1), activation="relu")
    plan.select("unfused:" + plan.unfused().selected_name)
    _close(plan.run(x, w, b, r), _ref(x, w, b, 1, 1, "relu", r), x.dtype)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        plan.run(x, w, b, r)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = plan.run(x, w, b, r)
    x.copy_(torch.randn_like(x))
    r.copy_(torch.randn_like(r))
    g.replay()
    torch.cuda.synchronize()
    _close(y, _ref(x, w, b, 1, 1, "relu", r), x.dtype)


def test_conv_only_runtime_compiled_config_is_right_behind_a_writer_without_barrier():
    """The barrier kernel is gone for convolution-only graphs: eng5 (runtime compiled, the depthwise
    engine torch runs) queued right behind a kernel writing its input, GPU held busy so that the
    two meet, gives the right result every time."""
    x, w, b = _dw(n=16, c=96, h=56, k=7)
    srcs = [_cl(torch.randn_like(x)) for _ in range(3)]
    refs = [_ref(s_, w, None, 96, 3) for s_ in srcs]
    plan = G.GraphConvolution(x, w, None, 1, 3, 1, 96)
    if plan.selected.engine != 5 or "RUNTIME_COMPILATION" not in plan.selected.behavior_notes:
        pytest.skip(f"the default here is {plan.selected_name}, not the runtime-compiled eng5")
    assert not plan._current().serialize
    y = plan.output()
    for i in range(12):
        torch.cuda._sleep(1_000_000)
        x.copy_(srcs[i % 3])
        plan.execute(x, w, out=y)
        torch.cuda.synchronize()
        _close(y, refs[i % 3], x.dtype)


def test_convert_autotune_reports_torch_and_keeps_outputs_right():
    """convert(fuse=True, autotune=x) of a ConvNeXt-style block (depthwise 7x7 with bias, a pointwise
    MLP) and of a conv-BN-ReLU stack: every searched layer is compared with torch's own call
    (torch_ms, rawconv_ms, vs_torch, torch_engine in the report), outputs right."""
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(96, 96, 7, padding=3, groups=96), torch.nn.Conv2d(96, 192, 1),
                                torch.nn.GELU(), torch.nn.Conv2d(192, 96, 1),
                                torch.nn.Conv2d(96, 96, 3, padding=1, bias=False), torch.nn.BatchNorm2d(96),
                                torch.nn.ReLU(), torch.nn.Conv2d(96, 96, 3, padding=1, groups=96, bias=False),
                                torch.nn.BatchNorm2d(96), torch.nn.ReLU())
    block = block.cuda().half().eval().to(memory_format=torch.channels_last)
    x = _cl(torch.randn(8, 96, 28, 28, device="cuda", dtype=torch.float16))
    import copy

    with torch.no_grad():
        ref = copy.deepcopy(block).double()(x.double()).float()
        m = rawconv.nn.convert(block, fuse=True, autotune=x, autotune_budget_s=0.5)
        y = m(x)
    err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
    assert err < 2e-2, err
    rep = m.rawconv_report
    searched = [t for t in rep.tuned if t["searched"]]
    assert searched and all("vs_torch" in t or "vs_torch_note" in t for t in searched), rep.table()
    assert "torch / rawconv" in str(rep)
    assert "ratio" in rep.table().splitlines()[0]


def test_r3d_nchw_fused_autotune_runs():
    """torchvision's r3d_18 on NCHW tensors, convert(fuse=True, autotune=x): InternalError before
    (a fused 3-D layer with no cuDNN graph was prefetched); now it converts and is right."""
    tv = pytest.importorskip("torchvision")
    m = tv.models.video.r3d_18(weights=None).cuda().eval()
    x = torch.randn(1, 3, 8, 56, 56, device="cuda")
    import copy

    with torch.no_grad():
        ref = copy.deepcopy(m).double()(x.double())
        c = rawconv.nn.convert(m, fuse=True, autotune=x, autotune_budget_s=0.2)
        y = c(x)
    err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
    assert err < 1e-3, err
