"""cuDNN graph plans' "unfused:" configs and torch's own pick, without a GPU (cuDNN's descriptor
functions work without one; whatever needs a handle is stubbed). The GPU side (the configs run,
timed and checked against float64, the depthwise speed) is in tests/test_unfused_gpu.py."""
from __future__ import annotations

import math
import types
import warnings

import pytest
import torch
import torch.nn.functional as F

from rawconv.core.errors import ArgumentError
from rawconv.core.problem import ConvProblem

G = pytest.importorskip("rawconv.cudnn.graph", reason="the cuDNN graph API module needs libcudnn")


def _p(**kw) -> ConvProblem:
    base = dict(n=2, c=8, k=8, in_spatial=(9, 10), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1),
                dtype="float16", layout="nhwc", device="cuda:0")
    base.update(kw)
    return ConvProblem(**base)


@pytest.fixture
def graph_cpu():
    try:
        G.GraphConvolution.from_problem(_p())
    except Exception as exc:   # noqa: BLE001
        pytest.skip(f"cuDNN's descriptor functions are not available here: {exc}")


def test_default_runs_a_bias_only_graph_and_a_grouped_fused_graph_unfused(graph_cpu, monkeypatch):
    """The default selection's rule (GraphConvolution._default_split): a bias alone after the
    convolution runs as torch runs it (conv-only config + torch's add); a grouped convolution
    with any epilogue too (cuDNN offers its generic engine 0 there); a dense fused graph stays
    fused; a convolution alone has nothing to split; DEFAULT_UNFUSED=False turns it off."""
    mk = G.GraphConvolution.from_problem
    assert mk(_p(has_bias=True))._default_split()
    assert mk(_p(has_bias=True, groups=8), activation="relu")._default_split()
    assert mk(_p(has_bias=True, groups=2), activation="swish")._default_split()
    assert not mk(_p(has_bias=True), activation="relu")._default_split()
    assert not mk(_p())._default_split()
    assert not mk(_p(), direction="backward_data")._default_split()
    assert not mk(_p(n=0, has_bias=True))._default_split(), "an empty problem never reaches cuDNN"
    monkeypatch.setattr(G, "DEFAULT_UNFUSED", False)
    assert not mk(_p(has_bias=True))._default_split()


def test_the_unfused_plan_is_the_convolution_alone(graph_cpu):
    plan = G.GraphConvolution.from_problem(_p(has_bias=True, groups=8), activation="gelu")
    unf = plan.unfused()
    assert unf is plan.unfused(), "made once"
    assert unf.problem == plan.problem.with_(has_bias=False)
    assert unf.activation is None and unf.direction == "forward" and not unf.has_epilogue()
    assert len(unf._graph.ops) == 1 and len(plan._graph.ops) == 3
    with pytest.raises(ArgumentError, match="unfused"):
        G.GraphConvolution.from_problem(_p()).unfused()
    with pytest.raises(ArgumentError, match="unfused"):
        G.GraphConvolution.from_problem(_p(), direction="backward_weights").select("unfused:eng5")
    plan.free()
    assert plan._unf is None and unf._freed


def _fake_build(plan, built: list):
    """``plan.build`` stubbed: a finalized config without cuDNN (no GPU here)."""
    def build(config, *, handle=None):
        ec = plan._resolve(config)
        b = plan._built.get(ec.name)
        if b is None:
            b = plan._built[ec.name] = G._Built(ec, None, 0, {"engine": ec.engine}, fused=len(plan._graph.ops) > 1)
            built.append((plan, ec.name))
        return b
    plan.build = build
    plan._probe_capture = lambda b: None


def test_selecting_unfused_and_back(graph_cpu):
    """``select("unfused:<config>")`` selects that config of the convolution-only plan (its name
    round-trips through ``selected_name``, as convert pins it); selecting a fused config after it
    runs the fused graph again; ``"unfused:nhwc:..."`` reaches the convolution-only plan's own
    prefix handling."""
    plan = G.GraphConvolution.from_problem(_p(has_bias=True), activation="relu")
    built: list = []
    _fake_build(plan, built)
    _fake_build(plan.unfused(), built)
    plan.select("unfused:eng5")
    assert plan._split and plan._selected is None
    assert plan.selected_name == "unfused:eng5"
    assert plan.selected.engine == 5 and built[-1] == (plan._unf, "eng5")
    plan.select("eng39{k25=0}")
    assert not plan._split and plan.selected_name == "eng39{k25=0}"
    assert built[-1] == (plan, "eng39{k25=0}")
    with pytest.raises(ArgumentError, match="channels_last"):
        plan.select("unfused:nhwc:eng5")   # the problem is channels_last already: the prefix is refused there


def test_torch_epilogue_is_torchs_own_ops_nan_and_inf_included():
    """What an "unfused:" config runs after the convolution: bias, residual and activation by
    torch's own ops, in torch's order, in place; NaN and Inf come out as torch's layers give them
    (relu(nan) = nan: no fused kernel's max(x, 0))."""
    g = torch.Generator().manual_seed(0)
    y0 = torch.randn(2, 4, 5, 6, generator=g)
    y0[0, 0, 0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    b = torch.randn(4, generator=g)
    r = torch.randn(2, 4, 5, 6, generator=g)
    r[1, 2, 3, 4] = float("nan")
    acts = {None: lambda t: t, "relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "elu": F.elu,
            "gelu": F.gelu, "swish": F.silu, "silu": F.silu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
            "relu6": F.relu6}
    assert set(acts) - {None} == set(G.ACTIVATIONS)
    for act, fn in acts.items():
        for bias, res in ((b, None), (b, r), (None, r), (None, None)):
            want = y0.clone()
            if bias is not None:
                want = want + bias.view(1, -1, 1, 1)
            if res is not None:
                want = want + res
            want = fn(want)
            got = y0.clone()
            out = G.torch_epilogue(got, bias, res, act, 2)
            assert out is got, "in place"
            torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    # an unbatched output takes the residual as the operator passes it (batched)
    y1 = y0[0].clone()
    G.torch_epilogue(y1, b, r[:1], "relu", 2)
    torch.testing.assert_close(y1, torch.relu(y0[0] + b.view(-1, 1, 1) + r[0]), equal_nan=True, rtol=0, atol=0)


def test_only_fused_graphs_runtime_compiled_configs_get_a_barrier(graph_cpu):
    """The barrier kernel before a runtime-compiled config (cuDNN 9.19's eng4 starts early in fused
    graphs) is not launched for convolution-only graphs (measured right and 2-2.6 us faster on an
    H100); a fused graph's keeps it, and one without the RUNTIME_COMPILATION note never has one."""
    rtc = G.EngineConfig(5, (), (), (), ("RUNTIME_COMPILATION",))
    plain = G.EngineConfig(28)
    assert G._Built(rtc, None, 0, {}, fused=True).serialize
    assert not G._Built(rtc, None, 0, {}, fused=False).serialize
    assert not G._Built(plain, None, 0, {}, fused=True).serialize
    built: list = []
    conv_only = G.GraphConvolution.from_problem(_p())
    fused = G.GraphConvolution.from_problem(_p(has_bias=True), activation="relu")
    for plan in (conv_only, fused):
        plan._remember(rtc)
        _fake_build(plan, built)
    assert not conv_only.build("eng5").serialize
    assert fused.build("eng5").serialize


def test_convert_autotune_skips_prefetch_of_a_layer_with_no_cudnn_graph(monkeypatch):
    """r3d_18 (NCHW, CUDA) with convert(fuse=True, autotune=x) raised InternalError ('_CudaFallback'
    object has no attribute 'heuristic'): the search compiled the next layer's configs ahead, and a
    fused layer with no cuDNN graph has none. Now such a layer is not prefetched (the legacy API's
    fallback is tuned by nothing and runs as it is)."""
    from rawconv.pytorch import fused as FU
    from rawconv.pytorch import nn as N

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fallback = FU._CudaFallback(_p(has_bias=True), "relu", "strict", "no engine (simulated)")
    monkeypatch.setattr(N, "_graph_plan", lambda m, kind, args: fallback)
    tuned = []

    def tune_call(m, kind, args, backend, budget_s, backward, info, plan=None):
        tuned.append((kind, plan))
        return types.SimpleNamespace(problem="p", choice=None, backward_choice=None, directions={}), True, False, ""
    monkeypatch.setattr(N, "_tune_call", tune_call)
    m = torch.nn.Conv2d(8, 8, 3)
    layers = [(m, "fused", {}, "cudnn", None, ("k", i)) for i in range(3)]
    report = N.ConvertReport()
    N._search_layers(torch.nn.Sequential(m), layers, {id(m): "0"}, report, 0.1, False)
    assert [k for k, _ in tuned] == ["fused"] * 3 and len(report.tuned) == 3


def test_split_search_ranks_both_halves_with_torchs_pick_end_to_end(monkeypatch):
    """autotune's split search (GraphConvolution._search_split) with cuDNN, the GPU timing and the
    two searches stubbed: half the budget each; the convolution-only rows named "unfused:<config>";
    torch's pick (the convolution-only default) timed end to end even when not among the best four;
    an unfused row wrong end to end marked "mismatch"; the fused rows timed as their plan runs them
    (call_for: a residual graph binds its residual there); all ranked by their end-to-end times."""
    from rawconv.cudnn.graph import autotune as A
    from rawconv.cudnn.graph.search import TimedConfig

    def row(name, ms, status="ok"):
        return TimedConfig(G.EngineConfig.parse(name), ms, ms, 5, status)

    budgets = []

    def search(plan, deadline, budget_s, tensors, ref, ref_abs, opts, seeds=()):
        budgets.append((plan.label, round(budget_s, 3)))
        if plan.label == "fused":
            return [row("eng4{k24=26}", 0.040), row("eng0", 0.600)]
        return [row(f"eng57{{k2={i}}}", 0.020 + i * 0.001) for i in range(6)]
    monkeypatch.setattr(A._search, "search", search)
    monkeypatch.setattr(A._o, "reference", lambda p, d, t, **kw: ("REF-conv-only", None))
    e2e = {}   # callable -> its end-to-end time

    def interleaved(fns, final_iterations, rounds=5):
        return [e2e[f] for f in fns], [e2e[f] for f in fns], 10
    monkeypatch.setattr(A._search, "time_interleaved", interleaved)

    class Unf:
        label = "unfused"
        problem = types.SimpleNamespace(layout="nhwc")

        def _torch_pick_row(self, rows, t, ref, ref_abs, opts):
            assert ref == "REF-conv-only"
            pick = row("eng5", 0.030)
            pick.detail = "torch's pick"
            rows.append(pick)
            return pick

    class Plan(A.Autotune):
        label = "fused"
        activation = "relu"
        problem = types.SimpleNamespace(ndim=2)
        _cl = None

        def __init__(self):
            self.built = {"eng4{k24=26}": "B4", "eng0": "B0"}
            self._unf = Unf()

        def unfused(self):
            return self._unf

        def output(self):
            return torch.empty(1)

        def call_for(self, b, t, out):
            fn = lambda: None   # noqa: E731
            e2e[fn] = {"B4": 0.041, "B0": 0.601}[b]
            return fn

        def _split_call(self, unf, r, t, out):
            fn = lambda: None   # noqa: E731
            # end to end: the convolution's time plus 0.012 ms of torch's ops; eng57{k2=1} is wrong
            e2e[fn] = r.median_ms + 0.012
            fn.config = r.config.name
            return fn

        def check_output(self, out, config, ref, ref_abs):
            return types.SimpleNamespace(ok=config.name != "eng57{k2=1}")

    opts = A._search.SearchOptions(budget_s=1.0, check=True)
    rows = Plan()._search_split(0.0, 1.0, {"x": "X", "w": "W", "b": "B", "r": "R"}, "REF", None, opts, [], False)
    assert budgets[0] == ("fused", 0.5), "half the budget to the fused graph"
    assert budgets[1][0] == "unfused"
    names = [r.name for r in rows]
    assert names[0] == "unfused:eng57{k2=0}" and rows[0].median_ms == pytest.approx(0.032)
    assert "unfused:eng5" in names and "eng4{k24=26}" in names
    pick = rows[names.index("unfused:eng5")]
    assert pick.median_ms == pytest.approx(0.042) and "torch's pick" in pick.detail, "timed end to end"
    bad = rows[names.index("unfused:eng57{k2=1}")]
    assert bad.status == "mismatch" and "end to end" in bad.detail
    fused = rows[names.index("eng4{k24=26}")]
    assert fused.median_ms == pytest.approx(0.041)
    # rows not timed end to end get torch's ops' measured time added
    late = rows[names.index("unfused:eng57{k2=5}")]
    assert late.median_ms == pytest.approx(0.025 + 0.012) and "torch's ops" in late.detail
    assert [r.status for r in rows].count("ok") == len(rows) - 1


def test_execute_and_hot_path_of_an_unfused_selection(graph_cpu):
    """execute() of a bias-only graph takes the default "unfused:" path: the convolution-only plan
    computes the convolution (stubbed here: no GPU), torch adds the bias in place; the operators'
    hot path (_hot_forward) does the same when the bias fits and declines (None) when it does not;
    a residual graph's hot path always declines (its residual is not in the pack)."""
    plan = G.GraphConvolution.from_problem(_p(has_bias=True))
    conv = torch.randn(2, 8, 9, 10)
    b = torch.randn(8)
    calls = []

    class Unf:
        def execute(self, x, w, bias, out):
            calls.append(("execute", bias, out))
            return conv.clone()

        def _hot_forward(self, x, w, bias):
            calls.append(("hot", bias))
            return conv.clone()

        def _current(self):
            return types.SimpleNamespace(config=G.EngineConfig(5))

        selected_name = "eng5"

        def free(self):
            pass
    plan._unf = Unf()
    plan._prepare = lambda role, t, shape: t   # (the bias's device check: CUDA tensors only)
    y = plan.execute("x", "w", b)
    torch.testing.assert_close(y, conv + b.view(1, -1, 1, 1))
    assert calls[-1] == ("execute", None, None) and plan._split
    assert plan.selected_name == "unfused:eng5"
    plan._dev = b.device   # (the hot path's bias check compares devices)
    plan.problem = plan.problem.with_(dtype="float32")
    y = plan._hot_forward("x", "w", b)
    torch.testing.assert_close(y, conv + b.view(1, -1, 1, 1))
    assert calls[-1] == ("hot", None)
    assert plan._hot_forward("x", "w", b[:4]) is None, "a bias of another shape takes the checked path"
    assert plan._hot_forward("x", "w", b.double()) is None
    assert plan._hot_forward("x", "w", None) is None
    plan._has_residual = lambda: True
    assert plan._hot_forward("x", "w", b) is None
