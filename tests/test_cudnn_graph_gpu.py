"""rawconv.cudnn_graph on a GPU: every engine config cuDNN offers (heuristic modes instant, B,
FALLBACK, plus every engine with its default knobs) for a grid of problems (fp32 IEEE, TF32, fp16,
bf16; NHWC and NCHW; 1-D, 2-D and 3-D; groups; dilation; asymmetric padding), forward and both
backwards, against float64 references computed on the CPU (rawconv.problem / torch autograd),
within the tolerance each config's numerical notes imply. Outputs are pre-filled with NaN.
Forced configs run exactly that engine (engine id read back from the execution plan). Cases G4, G6."""
from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

from rawconv import ConvProblem, tuning
from rawconv.cudnn.graph import search as S
from rawconv import cudnn_graph as G
from rawconv.errors import NotSupportedError
from rawconv.problem import abs_reference, compare_to_reference, conv_reference, empty_like_layout, to_layout

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # conftest skips too; keep collection cheap without a GPU
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def P(**kw) -> ConvProblem:
    base = dict(n=2, c=16, k=32, in_spatial=(10, 10), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1),
                dtype="float16", layout="nhwc", device="cuda:0")
    base.update(kw)
    return ConvProblem(**base)


GRID = {
    "fp32-ieee-nhwc": (P(dtype="float32"), False),
    "fp32-tf32-nhwc": (P(dtype="float32"), True),
    "fp32-ieee-nchw": (P(dtype="float32", layout="nchw"), False),
    "fp16-nhwc": (P(), False),
    "fp16-nchw": (P(layout="nchw"), False),
    "bf16-nhwc": (P(dtype="bfloat16"), False),
    "bf16-nchw": (P(dtype="bfloat16", layout="nchw"), False),
    "fp16-3d-nhwc": (P(c=8, k=16, in_spatial=(5, 6, 7), kernel=(3, 3, 3), pad_before=(1, 1, 1),
                       pad_after=(1, 1, 1)), False),
    "fp32-3d-nhwc": (P(dtype="float32", c=8, k=16, in_spatial=(5, 6, 7), kernel=(3, 3, 3),
                       pad_before=(1, 1, 1), pad_after=(1, 1, 1)), False),
    "fp16-groups-nhwc": (P(groups=4), False),
    "fp16-dilation-nhwc": (P(dilation=(2, 2), pad_before=(2, 2), pad_after=(2, 2)), False),
    "fp32-asym-stride-nhwc": (P(dtype="float32", stride=(2, 2), pad_before=(1, 0), pad_after=(2, 1)), False),
    "bf16-1d-nhwc": (P(dtype="bfloat16", c=4, k=16, in_spatial=(16,), kernel=(3,), stride=(2,), dilation=(2,),
                       pad_before=(1,), pad_after=(2,)), False),
}
BACKWARD = ["fp16-nhwc", "fp32-ieee-nhwc", "bf16-nhwc", "fp32-asym-stride-nhwc", "fp16-groups-nhwc"]

# Wrong results this suite found in cuDNN 9.19 on an H200 (engine global index: what was seen).
# Listed so the suite keeps passing while every other config is still checked; rawconv's
# autotune marks such configs "mismatch" and never selects them.
KNOWN_CUDNN_WRONG = {
    # backward filter, stride 2, pre (1,0) / post (2,1) padding: dw max_rel 1.5 (garbage)
    ("fp32-asym-stride-nhwc", "backward_filter"): {1, 20},
    # fp16 backward data without the REDUCED_PRECISION_REDUCTION note: 7-9x the fp32-accumulation bound
    ("fp16-nhwc", "backward_data"): {2},
    ("fp16-groups-nhwc", "backward_data"): {2},
}


def _inputs(p: ConvProblem, seed=0):
    x, w, _ = p.make_inputs(seed=seed, device="cuda")
    w = to_layout(w, p.layout)
    g = torch.Generator().manual_seed(seed + 7)
    dy = to_layout(torch.randn(p.y_shape, generator=g, dtype=torch.float64).to(p.torch_dtype), p.layout).cuda()
    return x, w, dy


def _references(p: ConvProblem, direction, x, w, dy):
    """float64 references on the CPU, independent of rawconv.cudnn_graph.reference()."""
    if direction == "forward":
        return conv_reference(p, x, w), abs_reference(p, x, w)
    pad = []
    for b, a in reversed(list(zip(p.pad_before, p.pad_after))):
        pad += [b, a]
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[p.ndim]
    x64, w64, dy64 = (t.detach().cpu().double() for t in (x, w, dy))
    out = []
    for sign in (False, True):
        xx = (x64.abs() if sign else x64).requires_grad_(True)
        ww = (w64.abs() if sign else w64).requires_grad_(True)
        yy = conv(F.pad(xx, pad), ww, None, p.stride, 0, p.dilation, p.groups)
        gx, gw = torch.autograd.grad(yy, (xx, ww), dy64.abs() if sign else dy64)
        out.append(gx if direction == "backward_data" else gw)
    return out[0], out[1]


def _run_all(name: str, direction: str):
    p, tf32 = GRID[name]
    x, w, dy = _inputs(p)
    ref, ref_abs = _references(p, direction, x, w, dy)
    plan = G.GraphConvolution.from_problem(p, direction=direction, allow_tf32=tf32)
    rows = plan.engines(("instant", "b", "fallback"), finalize=True)
    rows += [r for r in plan.engines("all", limit=1, finalize=True) if r not in rows]
    ran, bad = [], []
    out_shape = {"forward": p.y_shape, "backward_data": p.x_shape, "backward_filter": p.w_shape}[direction]
    for ec in rows:
        if not ec.finalizes:
            continue
        if p.dtype == "float32" and not tf32 and ec.tensor_cores:
            continue  # would run as TF32: covered by the tf32 rows (forcing still works, tested below)
        plan.select(ec)
        assert plan.engine_id() == ec.engine, f"{ec.name}: plan runs engine {plan.engine_id()}"
        out = empty_like_layout(out_shape, p.layout, p.torch_dtype, "cuda").fill_(float("nan"))
        if direction == "forward":
            plan.execute(x, w, out=out)
        elif direction == "backward_data":
            plan.execute(grad_y=dy, w=w, out=out)
        else:
            plan.execute(x, grad_y=dy, out=out)
        torch.cuda.synchronize()
        st = compare_to_reference(p, out, ref, ref_abs, **G.tolerance_args(p, ec.numerical_notes, direction))
        ran.append(ec.name)
        if not st.ok and ec.engine not in KNOWN_CUDNN_WRONG.get((name, direction), ()):
            bad.append(f"{ec.name} [{','.join(ec.numerical_notes)}]: {st}")
        elif not st.ok:
            print(f"known cuDNN wrong result: {name} {direction} {ec.name}: {st}")
    return p, rows, ran, bad


@pytest.mark.parametrize("name", list(GRID))
def test_every_forward_engine_config_matches_float64(name):
    p, rows, ran, bad = _run_all(name, "forward")
    assert not bad, f"{len(bad)} of {len(ran)} configs outside tolerance: " + "; ".join(bad)
    if p.layout == "nhwc":
        assert ran, f"no engine config ran for NHWC {p.describe()}: {[str(r) for r in rows]}"


@pytest.mark.parametrize("direction", ["backward_data", "backward_filter"])
@pytest.mark.parametrize("name", BACKWARD)
def test_every_backward_engine_config_matches_float64(name, direction):
    p, rows, ran, bad = _run_all(name, direction)
    assert not bad, f"{len(bad)} of {len(ran)} configs outside tolerance: " + "; ".join(bad)
    assert ran, f"no engine config ran for {direction} {p.describe()}"


def test_forced_config_runs_exactly_that_engine_and_knobs():
    p, _ = GRID["fp16-nhwc"]
    x, w, _dy = _inputs(p)
    rows = [r for r in G.engines(x, w, padding=1, heuristic=("instant", "b", "fallback")) if r.finalizes]
    assert len({r.engine for r in rows}) >= 2, [str(r) for r in rows]
    ref, ref_abs = conv_reference(p, x, w), abs_reference(p, x, w)
    for ec in rows:
        y = G.forward(x, w, padding=1, engine=ec.name)
        plan = G._plan(p, "forward", None, False, ec.name)
        back = plan.plan_readback()
        assert back["engine"] == ec.engine and tuple(sorted(back["knobs"].items())) == ec.knobs, (ec.name, back)
        assert compare_to_reference(p, y, ref, ref_abs, **G.tolerance_args(p, ec.numerical_notes)).ok
    # knob neighbours: a config built from a name with changed knobs is what runs
    with pytest.raises(NotSupportedError):
        G.forward(x, w, padding=1, engine="eng9999")


def test_fp32_default_is_ieee_and_tf32_must_be_asked():
    p, _ = GRID["fp32-ieee-nhwc"]
    x, w, _dy = _inputs(p)
    plan = G.GraphConvolution(x, w, padding=1)
    assert "TENSOR_CORE" not in plan.selected.numerical_notes
    y = plan.execute()
    st = compare_to_reference(p, y, conv_reference(p, x, w), abs_reference(p, x, w))
    assert st.ok, st


def test_fused_bias_relu_fp16_nhwc():
    p, _ = GRID["fp16-nhwc"]
    x, w, _dy = _inputs(p)
    b = torch.randn(p.k, device="cuda", dtype=torch.float16)
    y = G.forward(x, w, b, padding=1, activation="relu")
    pb = p.with_(has_bias=True)
    ref = torch.relu(conv_reference(pb, x, w, b))
    st = compare_to_reference(pb, y, ref, abs_reference(pb, x, w, b))
    assert st.ok, st
    assert (y >= 0).all()


def test_fused_activation_unsupported_is_a_clear_error_or_correct():
    p, _ = GRID["fp32-ieee-nchw"]
    x, w, _dy = _inputs(p)
    b = torch.randn(p.k, device="cuda", dtype=torch.float32)
    try:
        y = G.forward(x, w, b, padding=1, activation="tanh")
    except NotSupportedError as exc:
        assert "NHWC" in str(exc) or "finalize" in str(exc)
        return
    pb = p.with_(has_bias=True)
    st = compare_to_reference(pb, y, torch.tanh(conv_reference(pb, x, w, b)), abs_reference(pb, x, w, b))
    assert st.ok, st


def test_backward_data_is_conv_transpose():
    x = to_layout(torch.randn(2, 32, 9, 9, device="cuda", dtype=torch.float16), "nhwc")
    w = to_layout(torch.randn(32, 16, 3, 3, device="cuda", dtype=torch.float16) / 12, "nhwc")
    dx = G.backward_data(x, w, None, stride=2, padding=1, output_padding=1)
    ref = F.conv_transpose2d(x.cpu().double(), w.cpu().double(), None, 2, 1, 1)
    assert tuple(dx.shape) == tuple(ref.shape) == (2, 16, 18, 18)
    assert torch.allclose(dx.cpu().double(), ref, rtol=2e-2, atol=2e-2)


def test_G4_asymmetric_padding_stride2():
    """onnxruntime #26274: f32 x (1,32,416,416), w (64,32,3,3), stride 2, pad before (1,1), after (0,0)."""
    x = torch.randn(1, 32, 416, 416, device="cuda")
    w = torch.randn(64, 32, 3, 3, device="cuda") / 17
    want = F.conv2d(F.pad(x.double(), (1, 0, 1, 0)), w.double(), stride=2)
    for layout in ("nhwc", "nchw"):
        xx, ww = to_layout(x, layout), to_layout(w, layout)
        try:
            y = G.forward(xx, ww, stride=2, padding=((1, 0), (1, 0)))
        except NotSupportedError as exc:
            assert layout == "nchw" and "NHWC" in str(exc), exc
            continue
        assert tuple(y.shape) == (1, 64, 208, 208)
        p = ConvProblem.from_torch(xx, ww, None, 2, ((1, 0), (1, 0)))
        st = compare_to_reference(p, y, want.cpu(), abs_reference(p, xx, ww))
        assert st.ok, st


def test_G6_bf16_1d_stride_dilation_same_style_padding():
    """jax #37922: bf16 1-D x (2,4,16), w (16,4,3), stride 2, dilation 2, padding left 1, right 2."""
    x = torch.randn(2, 4, 16, device="cuda").to(torch.bfloat16)
    w = (torch.randn(16, 4, 3, device="cuda") / 3).to(torch.bfloat16)
    for layout in ("nhwc", "nchw"):
        xx, ww = to_layout(x, layout), to_layout(w, layout)
        p = ConvProblem.from_torch(xx, ww, None, 2, ((1, 2),), 2)
        try:
            y = G.forward(xx, ww, stride=2, padding=((1, 2),), dilation=2)
        except NotSupportedError as exc:
            assert layout == "nchw" and "NHWC" in str(exc), exc
            continue
        assert tuple(y.shape) == (2, 16, 8)
        st = compare_to_reference(p, y, conv_reference(p, xx, ww), abs_reference(p, xx, ww))
        assert st.ok, st


def test_autotune_checks_ranks_and_caches():
    p, _ = GRID["fp16-nhwc"]
    x, w, _dy = _inputs(p)
    G.clear_tuning_cache()
    plan = G.GraphConvolution(x, w, padding=1)
    table = plan.autotune(budget_s=3.0)
    ok = [r for r in table if r.status == "ok"]
    assert ok and table[0].status == "ok"
    assert [r.median_ms for r in ok] == sorted(r.median_ms for r in ok)
    assert plan.selected.name == table[0].name
    assert all(r.error is not None and r.error.ok for r in ok)
    assert plan.engine_id() == table[0].config.engine
    y = plan.execute()
    st = compare_to_reference(p, y, conv_reference(p, x, w), abs_reference(p, x, w),
                              **G.tolerance_args(p, plan.selected.numerical_notes))
    assert st.ok, st
    t0 = time.perf_counter()
    again = G.GraphConvolution(x, w, padding=1).autotune(budget_s=3.0)
    assert time.perf_counter() - t0 < 1.0
    assert again[0].phase == "cache" and again[0].name == table[0].name
    # filters are honoured
    det = G.GraphConvolution(x, w, padding=1).autotune(budget_s=2.0, deterministic_only=True, workspace_limit=0,
                                                       use_cache=False)
    for r in det:
        if r.status == "ok":
            assert r.config.deterministic and r.config.workspace_bytes == 0


def test_cached_plan_execute_reuses_variant_pack():
    p, _ = GRID["fp16-nhwc"]
    x, w, _dy = _inputs(p)
    plan = G.GraphConvolution(x, w, padding=1)
    y = torch.empty_like(plan.execute())
    plan.execute(x, w, out=y)
    b = plan._selected
    n = len(b.vps)
    for _ in range(10):
        plan.execute(x, w, out=y)
    assert len(b.vps) == n


@pytest.mark.parametrize("name,direction", sorted(KNOWN_CUDNN_WRONG))
def test_default_selection_skips_known_wrong_engines_and_is_right(name, direction):
    p, tf32 = GRID[name]
    # the suite's own list and rawconv's must agree for these problems
    for e in KNOWN_CUDNN_WRONG[(name, direction)]:
        assert G.known_wrong(p, direction, e), f"rawconv.cudnn_graph.KNOWN_WRONG misses engine {e} for {name}"
    x, w, dy = _inputs(p)
    ref, ref_abs = _references(p, direction, x, w, dy)
    plan = G.GraphConvolution.from_problem(p, direction=direction, allow_tf32=tf32)
    assert plan.selected.engine not in KNOWN_CUDNN_WRONG[(name, direction)]
    out_shape = {"backward_data": p.x_shape, "backward_filter": p.w_shape}[direction]
    out = empty_like_layout(out_shape, p.layout, p.torch_dtype, "cuda").fill_(float("nan"))
    if direction == "backward_data":
        plan.execute(grad_y=dy, w=w, out=out)
    else:
        plan.execute(x, grad_y=dy, out=out)
    torch.cuda.synchronize()
    st = compare_to_reference(p, out, ref, ref_abs,
                              **G.tolerance_args(p, plan.selected.numerical_notes, direction))
    assert st.ok, f"default {plan.selected.name}: {st}"
    with pytest.warns(RuntimeWarning, match="wrong results"):
        try:
            plan.select(min(KNOWN_CUDNN_WRONG[(name, direction)]))
        except NotSupportedError:
            pass


def _wait_for_background_compilation(limit_s=120.0):
    t0 = time.perf_counter()
    while S._rtc_inflight and time.perf_counter() - t0 < limit_s:
        time.sleep(0.05)
    assert not S._rtc_inflight, f"runtime compilations still running after {limit_s} s: {S._rtc_inflight}"


def test_runtime_compiled_engines_build_in_the_background_and_run_right():
    p, _ = GRID["fp16-nhwc"]
    x, w, _dy = _inputs(p)
    _wait_for_background_compilation()
    plan = G.GraphConvolution(x, w, padding=1)
    rtc = [i for i in range(plan.global_count)
           if plan.engine_info(i) is not None and "RUNTIME_COMPILATION" in plan.engine_info(i)[0]["behavior_notes"]]
    if not rtc:
        pytest.skip("this cuDNN offers no runtime-compiled engine for the graph")
    ref, ref_abs = conv_reference(p, x, w), abs_reference(p, x, w)
    ran = 0
    for idx in rtc:
        ec = plan.annotate(G.EngineConfig(idx))
        try:
            b, why = S.build_in_background(plan, ec, 120.0)
        except NotSupportedError:
            continue
        assert b is not None, why
        plan.select(b.config)
        assert plan.engine_id() == idx
        y = plan.execute().clone()
        torch.cuda.synchronize()
        st = compare_to_reference(p, y, ref, ref_abs, **G.tolerance_args(p, b.config.numerical_notes))
        assert st.ok, f"{b.config.name}: {st}"
        ran += 1
    assert ran, f"no runtime-compiled engine among {rtc} finalized"
    # a timeout shorter than any compilation: the caller is told, the build finishes in the background
    plan2 = G.GraphConvolution(x, w, padding=1)
    ec = plan2.annotate(G.EngineConfig(rtc[0]))
    b, why = S.build_in_background(plan2, ec, 1e-6)
    assert (b is None and "still running" in why) or b is not None
    _wait_for_background_compilation()
    assert ec.name in plan2._built or ec.name in plan2._failed  # the background build finished and was kept
    # several at once: each finalizes (or fails) as it would alone
    plan3 = G.GraphConvolution(x, w, padding=1)
    cfgs = [plan3.annotate(G.EngineConfig(i)) for i in rtc]
    S.compile_in_background(plan3, cfgs, 120.0)
    _wait_for_background_compilation()
    for ec in cfgs:
        assert (ec.name in plan3._built) == (ec.name in plan._built), ec.name


def test_autotune_budget_holds_with_runtime_compiled_engines():
    """Cold autotune on a stride-2 ResNet-50 layer, where one runtime-compiled engine once took
    21 s to compile: the wall time stays near the budget (the compilation is left running)."""
    from rawconv.presets import resnet50

    _wait_for_background_compilation()
    p = next(q for q in resnet50(32, dtype="float16", layout="nhwc") if q.name == "layer2.0.conv2")
    x, w, _ = p.make_inputs(seed=0, device="cuda")
    w = to_layout(w, "nhwc")
    G.clear_tuning_cache()
    plan = G.GraphConvolution(x, w, None, p.stride, p.torch_padding)
    t0 = time.perf_counter()
    table = plan.autotune(budget_s=4.0, use_cache=False, patience=None)
    took = time.perf_counter() - t0
    assert table[0].status == "ok"
    assert took < 4.0 + 2.0, f"autotune took {took:.1f} s for a 4 s budget"
    print(f"autotune {took:.1f} s; statuses: "
          + str({s: sum(r.status == s for r in table) for s in {r.status for r in table}}))
    _wait_for_background_compilation()


def test_autotune_tries_runtime_compilations_that_end_after_their_trial():
    """Default-knob compilations already running when autotune reaches them are marked
    "over budget" at first; once they finish within the budget they are tried and timed."""
    p, _ = GRID["fp16-nhwc"]
    x, w, _dy = _inputs(p)
    _wait_for_background_compilation()
    G.clear_tuning_cache()
    plan = G.GraphConvolution(x, w, padding=1)
    rtc = [plan.annotate(G.EngineConfig(i)) for i in range(plan.global_count)
           if plan.engine_info(i) is not None and "RUNTIME_COMPILATION" in plan.engine_info(i)[0]["behavior_notes"]]
    if not rtc:
        pytest.skip("this cuDNN offers no runtime-compiled engine for the graph")
    S.compile_in_background(plan, rtc, 0.0)  # started, not waited for
    t0 = time.perf_counter()
    table = plan.autotune(budget_s=8.0, use_cache=False, patience=None, include_runtime_compiled=True)
    rows = {r.name: r for r in table}
    # finalized before the deadline (autotune's starts after t0), a few ms of margin
    stale = [ec.name for ec in rtc if ec.name in rows and rows[ec.name].status == "over budget"
             and ec.name in plan._built and plan._built[ec.name].finalized_at < t0 + 8.0 - 0.05]
    assert not stale, f"compiled within the budget but never tried: {stale}"
    assert any(rows[ec.name].status in ("ok", "mismatch") for ec in rtc if ec.name in rows), \
        [str(rows.get(ec.name)) for ec in rtc]
    _wait_for_background_compilation()


def test_autotune_seeds_from_the_winners_of_other_problems_in_the_tuning_cache(monkeypatch):
    """A config that won for another problem (here: an engine's default knobs that no heuristic
    mode proposes) is tried, as a "cache seed", before the default-knob phase."""
    monkeypatch.delenv(G.ENV_TUNING_FILE, raising=False)  # the in-memory cache alone
    monkeypatch.delenv(tuning.ENV_FILE, raising=False)
    p, _ = GRID["fp16-nhwc"]
    G.clear_tuning_cache()
    a = G.GraphConvolution.from_problem(p)
    a.autotune(budget_s=1.0, patience=20)
    (rec,) = tuning.cache().records()
    b = G.GraphConvolution.from_problem(p.with_(n=4))
    heur = {ec.name for mode in G.HEURISTIC_MODES for ec in b.heuristic(mode)}
    cand = [f"eng{i}" for i in range(b.global_count) if b.engine_info(i) is not None and f"eng{i}" not in heur
            and "RUNTIME_COMPILATION" not in b.engine_info(i)[0]["behavior_notes"]]
    if not cand:
        pytest.skip("every engine's default config is a heuristic one here")
    tuning.cache().put(rec.with_(choice=cand[-1], detail={"engine": int(cand[-1][3:]), "knobs": []}))
    rows = b.autotune(budget_s=2.0, patience=40)
    seeded = [r for r in rows if r.phase == "cache seed"]
    assert [r.name for r in seeded] == [cand[-1]], [str(r) for r in rows[:5]]
    assert seeded[0].status in ("ok", "mismatch", "not supported", "filtered"), seeded[0]
    c = G.GraphConvolution.from_problem(p.with_(n=6))
    assert not any(r.phase == "cache seed" for r in c.autotune(budget_s=1.0, patience=20, seed_from_cache=False))
    G.clear_tuning_cache()


@pytest.mark.parametrize("direction", G.DIRECTIONS)
def test_nhwc_config_on_an_nchw_plan_matches_float64(direction):
    """``"nhwc:<config>"`` on an NCHW plan: NCHW tensors in, an NCHW result out (new or ``out=``),
    right within the config's tolerance; the channels_last graph's engine runs (read back)."""
    p, _ = GRID["fp16-nchw"]
    x, w, dy = _inputs(p)
    ref, ref_abs = _references(p, direction, x, w, dy)
    cl = G.GraphConvolution.from_problem(p.with_(layout="nhwc"), direction=direction)
    name = "nhwc:" + cl.selected.name  # the default selection skips known-wrong engines
    plan = G.GraphConvolution.from_problem(p, direction=direction)
    ec = plan.select(name)
    assert plan.selected_name == name and plan.engine_id() == ec.engine == cl.engine_id()
    out_shape = {"forward": p.y_shape, "backward_data": p.x_shape, "backward_filter": p.w_shape,
                 "backward_weights": p.w_shape}[direction]
    for use_out in (False, True):
        out = empty_like_layout(out_shape, "nchw", p.torch_dtype, "cuda").fill_(float("nan")) if use_out else None
        if direction == "forward":
            r = plan.execute(x, w, out=out)
        elif direction == "backward_data":
            r = plan.execute(grad_y=dy, w=w, out=out)
        else:
            r = plan.execute(x, grad_y=dy, out=out)
        assert r.is_contiguous() and (out is None or r is out)
        st = compare_to_reference(p, r, ref, ref_abs, **G.tolerance_args(p, ec.numerical_notes, direction))
        assert st.ok, (name, st)
    for native in plan.heuristic("instant") + plan.heuristic("fallback"):  # back to the NCHW graph
        try:
            plan.select(native)
            break
        except NotSupportedError:
            continue
    assert plan.selected_name == plan.selected.name == native.name


def test_autotune_relayout_searches_both_graphs_and_caches_the_choice():
    p = P(n=8, c=64, k=64, in_spatial=(28, 28), layout="nchw")
    x, w, _dy = _inputs(p)
    ref, ref_abs = conv_reference(p, x, w), abs_reference(p, x, w)
    G.clear_tuning_cache()
    plan = G.GraphConvolution(x, w, padding=1)
    table = plan.autotune(budget_s=4.0, relayout=True)
    ok = [r for r in table if r.status == "ok"]
    assert {r.layout for r in ok} == {"", "nhwc"}, "both graphs searched"
    assert [r.median_ms for r in ok] == sorted(r.median_ms for r in ok)
    assert all(r.error is not None and r.error.ok for r in ok)
    assert all("transforms" in r.detail for r in ok if r.layout)
    assert plan.selected_name == table[0].name
    y = plan.execute()
    assert y.is_contiguous()
    st = compare_to_reference(p, y, ref, ref_abs, **G.tolerance_args(p, plan.selected.numerical_notes))
    assert st.ok, st
    again = G.GraphConvolution(x, w, padding=1)
    rows = again.autotune(budget_s=4.0, relayout=True)
    assert rows[0].phase == "cache" and rows[0].name == table[0].name == again.selected_name
    y2 = G.forward(x, w, padding=1, engine=table[0].name)
    st = compare_to_reference(p, y2, ref, ref_abs, **G.tolerance_args(p, plan.selected.numerical_notes))
    assert st.ok, st
