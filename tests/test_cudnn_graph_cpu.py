"""rawconv.cudnn_graph without a GPU: backend descriptors built and finalized up to (not including)
the operation graph, attribute plumbing read back from cuDNN, engine-config names, knob
enumeration, tolerance arguments, the device-side reference, the tuning cache, and bad input
rejected before any C call."""
from __future__ import annotations

import json
import math
import statistics

import pytest
import torch
import torch.nn.functional as F

from rawconv import ConvProblem, _cudnn
from rawconv import _cudnn_backend as B
from rawconv import cudnn_graph as G
from rawconv.errors import ArgumentError, ArgumentTypeError, LibraryError
from rawconv.problem import EPS, abs_reference, conv_reference


@pytest.fixture(scope="module")
def cudnn():
    try:
        return _cudnn.load()
    except Exception as exc:  # pragma: no cover
        pytest.fail(f"libcudnn.so.9 is a dependency of these tests (torch's CUDA build brings it): {exc}")


@pytest.fixture
def no_c_calls(monkeypatch):
    """Any C call fails the test: proves input is rejected before the library is touched."""
    def boom():
        raise AssertionError("a C function was called")
    monkeypatch.setattr(_cudnn, "lib", boom)


# ---------------------------------------------------------------- names
@pytest.mark.parametrize("name,engine,knobs", [
    ("eng28", 28, ()),
    ("eng28{}", 28, ()),
    ("eng28{k2=3,k3=0}", 28, ((2, 3), (3, 0))),
    ("eng28{k3=0, k2=3}", 28, ((2, 3), (3, 0))),
    ("eng70_k2=4_k18=0", 70, ((2, 4), (18, 0))),
    ("eng0{k14=-1}", 0, ((14, -1),)),
])
def test_engine_names_parse_and_format(name, engine, knobs):
    ec = G.EngineConfig.parse(name)
    assert (ec.engine, ec.knobs) == (engine, knobs)
    assert G.EngineConfig.parse(ec.name) == ec
    assert ec.name == (f"eng{engine}" if not knobs else
                       f"eng{engine}{{" + ",".join(f"k{t}={v}" for t, v in knobs) + "}")


@pytest.mark.parametrize("bad", ["", "eng", "28", "engine28", "eng28{k2}", "eng28{k2=3,}", "eng-1",
                                 "eng28{k2=3,k2=4}", "eng28_k2", "eng28{x2=3}"])
def test_bad_engine_names_rejected(bad, no_c_calls):
    with pytest.raises(ArgumentError):
        G.EngineConfig.parse(bad)


def test_engine_config_equality_ignores_annotations():
    a = G.EngineConfig(5, {3: 1, 2: 0}, ("instant",), ("TENSOR_CORE",))
    b = G.EngineConfig(5, ((2, 0), (3, 1)))
    assert a == b and hash(a) == hash(b) and a.name == "eng5{k2=0,k3=1}"
    assert a.tensor_cores and not b.tensor_cores and a.deterministic
    assert "TILE_SIZE=0" in a.knob_names
    with pytest.raises(ArgumentError):
        G.EngineConfig(-1)
    with pytest.raises(ArgumentTypeError):
        G.EngineConfig.parse(28)


def test_knob_enumeration():
    assert list(G._knob_combinations([])) == [()]
    combos = list(G._knob_combinations([(2, 0, 2, 1), (3, 0, 1, 1)]))
    assert combos[0] == () and len(combos) == 1 + 3 * 2
    assert combos[1] == ((2, 0), (3, 0)) and combos[-1] == ((2, 2), (3, 1))
    assert G._knob_range(1, 9, 4) == [1, 5, 9]
    assert G._knob_range(3, 3, 0) == [3]
    vals = G._knob_values(0, 1000, 1, 500)
    assert 0 in vals and 1000 in vals and 499 in vals and 501 in vals and len(vals) <= 18


# ---------------------------------------------------------------- descriptors, no GPU needed
def test_tensor_descriptor_reads_back(cudnn):
    t = B.tensor(7, [2, 8, 5, 6], [240, 1, 48, 8], "float16", alignment=16)
    assert t.finalized
    assert t.get("TENSOR_DIMENSIONS", "INT64") == [2, 8, 5, 6]
    assert t.get("TENSOR_STRIDES", "INT64") == [240, 1, 48, 8]
    assert t.get_one("TENSOR_UNIQUE_ID", "INT64") == 7
    assert t.get_one("TENSOR_DATA_TYPE", "DATA_TYPE") == _cudnn.enum_value("CUDNN_DATA_HALF")
    assert t.count("TENSOR_DIMENSIONS", "INT64") == 4
    v = B.tensor(101, [2, 8, 5, 6], [240, 1, 48, 8], "float32", virtual=True)
    assert v.get("TENSOR_IS_VIRTUAL", "BOOLEAN", 1) == [True]


def test_convolution_descriptor_reads_back(cudnn):
    c = B.convolution(3, "float32", dilations=[1, 2, 1], strides=[2, 1, 1], pre_paddings=[1, 0, 2],
                      post_paddings=[0, 1, 2])
    assert c.get_one("CONVOLUTION_SPATIAL_DIMS", "INT64") == 3
    assert c.get("CONVOLUTION_DILATIONS", "INT64") == [1, 2, 1]
    assert c.get("CONVOLUTION_FILTER_STRIDES", "INT64") == [2, 1, 1]
    assert c.get("CONVOLUTION_PRE_PADDINGS", "INT64") == [1, 0, 2]
    assert c.get("CONVOLUTION_POST_PADDINGS", "INT64") == [0, 1, 2]
    assert c.get_one("CONVOLUTION_COMP_TYPE", "DATA_TYPE") == _cudnn.enum_value("CUDNN_DATA_FLOAT")


def _p(**kw):
    base = dict(n=2, c=8, k=16, in_spatial=(9, 10), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1),
                dtype="float16", layout="nhwc", device="cuda:0")
    base.update(kw)
    return ConvProblem(**base)


GRAPHS = {
    "2d-nhwc": _p(),
    "2d-nchw-fp32": _p(dtype="float32", layout="nchw"),
    "1d-lifted": _p(in_spatial=(16,), kernel=(3,), stride=(2,), dilation=(2,), pad_before=(1,), pad_after=(2,),
                    dtype="bfloat16"),
    "3d": _p(in_spatial=(4, 5, 6), kernel=(3, 3, 3), pad_before=(1, 1, 1), pad_after=(1, 1, 1)),
    "groups": _p(groups=4),
    "dilation": _p(dilation=(2, 3), pad_before=(2, 3), pad_after=(2, 3)),
    "asym-stride": _p(stride=(2, 3), pad_before=(1, 0), pad_after=(0, 2), dtype="float32"),
    "fp64": _p(dtype="float64", layout="nchw"),
}


@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("direction", G.DIRECTIONS)
def test_graph_operations_finalize_without_gpu(cudnn, name, direction):
    p = GRAPHS[name]
    g = G._Graph(p, direction, None, p.layout)
    assert len(g.ops) == 1 and all(op.finalized for op in g.ops)
    roles = G._ROLES[direction]
    assert g.uids == [G.UID[r] for r in roles]
    dims = {"x": p.x_shape, "dx": p.x_shape, "y": p.y_shape, "dy": p.y_shape, "w": p.w_shape, "dw": p.w_shape}
    for r in roles:
        got = g.tensors[r].get("TENSOR_DIMENSIONS", "INT64")
        assert got == G._lift(dims[r])
        # the strides the torch tensors must have are those torch gives the layout
        want = dims[r]
        t = torch.empty(want)
        if p.layout == "nhwc":
            perm = [0] + list(range(2, len(want))) + [1]
            t = t.permute(perm).contiguous().permute([perm.index(i) for i in range(len(want))])
        assert list(t.stride()) == g.strides[r] or any(s == 1 for s in want)
    pre = g.conv.get("CONVOLUTION_PRE_PADDINGS", "INT64")
    post = g.conv.get("CONVOLUTION_POST_PADDINGS", "INT64")
    lift = [0] if p.ndim == 1 else []
    assert pre == lift + list(p.pad_before) and post == lift + list(p.pad_after)
    assert g.conv.get("CONVOLUTION_DILATIONS", "INT64") == ([1] if p.ndim == 1 else []) + list(p.dilation)
    comp = "CUDNN_DATA_DOUBLE" if p.dtype == "float64" else "CUDNN_DATA_FLOAT"
    assert g.conv.get_one("CONVOLUTION_COMP_TYPE", "DATA_TYPE") == _cudnn.enum_value(comp)


@pytest.mark.parametrize("bias,act,nops", [(True, None, 2), (True, "relu", 3), (False, "gelu", 2)])
def test_fused_graph_has_pointwise_nodes(cudnn, bias, act, nops):
    p = _p(has_bias=bias)
    g = G._Graph(p, "forward", act, "nhwc")
    assert len(g.ops) == nops
    assert g.uids == [1, 2, 3] + ([4] if bias else [])
    assert [op.kind for op in g.ops] == ["OPERATION_CONVOLUTION_FORWARD"] + ["OPERATION_POINTWISE"] * (nops - 1)


def test_bad_output_dims_are_cudnn_bad_param(cudnn):
    x = B.tensor(1, [2, 8, 5, 5], [200, 1, 40, 8], "float16")
    w = B.tensor(2, [8, 8, 3, 3], [72, 1, 24, 8], "float16")
    y = B.tensor(3, [2, 8, 7, 7], [392, 1, 56, 8], "float16")
    c = B.convolution(2, "float32", dilations=[1, 1], strides=[1, 1], pre_paddings=[1, 1], post_paddings=[1, 1])
    with pytest.raises(LibraryError) as ei:
        B.conv_operation("forward", {"X": x, "W": w, "Y": y}, c, "float32")
    assert "cudnnBackendFinalize" in str(ei.value) and "BAD_PARAM" in str(ei.value)


def test_knob_choice_and_variant_pack_plumbing(cudnn):
    kc = B.knob_choice(_cudnn.enum_value("CUDNN_KNOB_TYPE_TILE_SIZE"), 3)
    assert kc.get("KNOB_CHOICE_KNOB_VALUE", "INT64", 1) == [3]
    assert kc.get("KNOB_CHOICE_KNOB_TYPE", "KNOB_TYPE", 1) == [_cudnn.enum_value("CUDNN_KNOB_TYPE_TILE_SIZE")]
    vp = B.variant_pack([1, 2, 3], [256, 512, 1024], 0)
    assert vp.finalized
    # a finalized variant pack cannot be changed: why rawconv keeps one per set of data pointers
    with pytest.raises(LibraryError):
        vp.set("VARIANT_PACK_DATA_POINTERS", "VOID_PTR", [512, 512, 1024])
    assert B.knob_type_name(_cudnn.enum_value("CUDNN_KNOB_TYPE_STAGES")) == "STAGES"
    assert B.enum_name("cudnnBackendNumericalNote_t", _cudnn.enum_value("CUDNN_NUMERICAL_NOTE_TENSOR_CORE"),
                       "CUDNN_NUMERICAL_NOTE_") == "TENSOR_CORE"


@pytest.mark.parametrize("call", [
    lambda: B.tensor(-1, [1, 1, 1, 1], [1, 1, 1, 1], "float32"),
    lambda: B.tensor(1, [1, 1, 1, 1], [1, 1, 1], "float32"),
    lambda: B.tensor(1, [1, 0, 1, 1], [1, 1, 1, 1], "float32"),
    lambda: B.tensor(1, [1, 1], [1, 1], "float32"),
    lambda: B.tensor(1, [1, 1, 1, 1], [1, 1, 1, 1], "int4"),
    lambda: B.tensor(1, [1, 1, 1, 1], [1, 1, 1, 1], "float32", alignment=2),
    lambda: B.tensor(1, [1, 1.5, 1, 1], [1, 1, 1, 1], "float32"),
    lambda: B.convolution(2, "float32", dilations=[0, 1], strides=[1, 1], pre_paddings=[0, 0], post_paddings=[0, 0]),
    lambda: B.convolution(2, "float32", dilations=[1, 1], strides=[1], pre_paddings=[0, 0], post_paddings=[0, 0]),
    lambda: B.convolution(4, "float32", dilations=[1] * 4, strides=[1] * 4, pre_paddings=[0] * 4,
                          post_paddings=[0] * 4),
    lambda: B.convolution(2, "float32", dilations=[1, 1], strides=[1, 1], pre_paddings=[-1, 0], post_paddings=[0, 0]),
    lambda: B.heuristics(None, "c"),
    lambda: B.pointwise("softmax"),
    lambda: B.engine(None, -1),
    lambda: B.knob_choice(2, 1.5),
    lambda: B.conv_operation("sideways", {}, None, "float32"),
    lambda: B.conv_operation("forward", {"X": None}, None, "float32"),
    lambda: B.variant_pack([1, 2], [0], 0),
    lambda: B.const("CUDNN_NO_SUCH_THING"),
])
def test_bad_descriptor_input_rejected_before_any_c_call(no_c_calls, call):
    with pytest.raises((ArgumentError, ArgumentTypeError)):
        call()


def test_attribute_types_checked_before_c_call(cudnn):
    t = B.tensor(1, [1, 1, 1, 1], [1, 1, 1, 1], "float32")
    with pytest.raises(ArgumentTypeError):
        t.set("TENSOR_UNIQUE_ID", "INT64", "1")
    with pytest.raises(ArgumentTypeError):
        t.set("TENSOR_UNIQUE_ID", "BACKEND_DESCRIPTOR", 1)
    with pytest.raises(ArgumentError):
        t.set("TENSOR_UNIQUE_ID", "INT128", 1)
    with pytest.raises(ArgumentError):
        t.set("TENSOR_UNIQUE_ID", "INT64", 2 ** 70)
    with pytest.raises(ArgumentError):
        t.get("TENSOR_UNIQUE_ID", "BACKEND_DESCRIPTOR")


# ---------------------------------------------------------------- plan-level input checks
def test_plan_rejects_bad_input_before_any_c_call(no_c_calls):
    x, w = torch.randn(2, 8, 9, 9), torch.randn(16, 8, 3, 3)
    with pytest.raises(ArgumentError, match="CUDA"):
        G.GraphConvolution(x, w)
    with pytest.raises(ArgumentError, match="CUDA"):
        G.forward(x, w)
    p = _p()
    with pytest.raises(ArgumentError):
        G.GraphConvolution.from_problem(p, direction="sideways")
    with pytest.raises(ArgumentError):
        G.GraphConvolution.from_problem(p, activation="softmax")
    with pytest.raises(ArgumentError):
        G.GraphConvolution.from_problem(p, direction="backward_data", activation="relu")
    with pytest.raises(ArgumentTypeError):
        G.GraphConvolution.from_problem(p, allow_tf32="yes")
    with pytest.raises(ArgumentTypeError):
        G.GraphConvolution.from_problem("not a problem")
    with pytest.raises(ArgumentError):
        G._tf32(False, "fast")


def test_plan_argument_checks_on_a_cpu_built_graph(cudnn):
    """The descriptors of a CUDA problem build on the CPU; execute rejects mismatching tensors."""
    plan = G.GraphConvolution.from_problem(_p())
    with pytest.raises(ArgumentError, match="shape"):
        plan._prepare("x", torch.empty(1, 2, 3, 4), plan.problem.x_shape)
    with pytest.raises(ArgumentError, match="must be"):
        plan._prepare("x", torch.empty(plan.problem.x_shape), plan.problem.x_shape)
    with pytest.raises(ArgumentTypeError):
        plan._prepare("x", [1, 2], plan.problem.x_shape)
    with pytest.raises(ArgumentError):
        plan.autotune(budget_s=0)
    with pytest.raises(ArgumentError):
        plan.autotune(workspace_limit=-1)
    for bad in (0, -3, True, 2.5):
        with pytest.raises(ArgumentError, match="patience"):
            plan.autotune(patience=bad)
    with pytest.raises(ArgumentError, match="include_runtime_compiled"):
        plan.autotune(include_runtime_compiled="yes")
    with pytest.raises(ArgumentError, match="seed"):
        plan.autotune(seed=1.5)
    with pytest.raises(ArgumentError):
        plan.engines("sometimes")
    with pytest.raises(ArgumentError):
        plan.engines("all", limit=0)
    with pytest.raises(ArgumentTypeError):
        plan.select(2.5)
    plan.free()
    plan.free()
    with pytest.raises(ArgumentError, match="freed"):
        plan.select(0)


def test_relayout_arguments_checked_before_any_c_call(cudnn, monkeypatch):
    """'nhwc:' names only make sense on an NCHW plan; relayout must be a bool."""
    nhwc = G.GraphConvolution.from_problem(_p())
    empty = G.GraphConvolution.from_problem(_p(n=0, layout="nchw"))
    monkeypatch.setattr(_cudnn, "lib", lambda: pytest.fail("a C function was called"))
    with pytest.raises(ArgumentError, match="channels_last already"):
        nhwc.select("nhwc:eng0")
    with pytest.raises(ArgumentError, match="relayout"):
        nhwc.autotune(relayout="yes")
    with pytest.raises(ArgumentError, match="empty"):
        empty.select("nhwc:eng0")


@pytest.mark.parametrize("direction", G.DIRECTIONS)
def test_relayout_plan_is_the_channels_last_graph_of_the_same_problem(cudnn, direction):
    """An NCHW plan's channels_last sibling: same problem but NHWC strides for every tensor; the
    copies it needs per call are the inputs and the output, in bytes."""
    p = _p(layout="nchw", dtype="bfloat16")
    plan = G.GraphConvolution.from_problem(p, direction=direction)
    cl = plan._channels_last()
    assert cl is plan._channels_last()
    assert cl.problem == p.with_(layout="nhwc") and cl.direction == direction
    for role, st in cl._graph.strides.items():
        shape = {"x": p.x_shape, "dx": p.x_shape, "y": p.y_shape, "dy": p.y_shape, "w": p.w_shape,
                 "dw": p.w_shape}[role]
        assert st == list(torch.empty(shape).to(memory_format=torch.channels_last).stride()), role
        assert plan._graph.strides[role] == list(torch.empty(shape).stride()), role
    n = sum(math.prod(s) for s in (p.x_shape, p.w_shape, p.y_shape))
    assert plan.transpose_bytes == 2 * n
    row = G.TimedConfig(G.EngineConfig(72, ((17, 1), (24, 4))), layout="nhwc")
    assert row.name == "nhwc:eng72{k17=1,k24=4}"
    plan.free()
    assert plan._cl is None and cl._freed


def test_transpose_shape_matches_torch():
    for stride, pad, op, dil in [(2, 1, 1, 1), (1, 0, 0, 2), (3, 2, 2, 1), ((2, 1), (0, 1), (1, 0), 1)]:
        gy = torch.empty(2, 8, 7, 6)
        w = torch.empty(8, 4, 3, 3)
        want = F.conv_transpose2d(gy, w, None, stride, pad, op, 1, dil).shape
        assert tuple(G._transpose_x_shape(gy, w, stride, pad, dil, 1, op)) == tuple(want)
    with pytest.raises(ArgumentError):
        G._transpose_x_shape(torch.empty(2, 8, 7, 6), torch.empty(8, 4, 3, 3), 2, 1, 1, 1, 2)


# ---------------------------------------------------------------- numerics helpers
def test_tolerance_args_follow_notes():
    p = _p(dtype="float32")
    assert G.tolerance_args(p, []) == {"factor": 1.0}
    assert G.tolerance_args(p, ["TENSOR_CORE"])["compute"] == "tf32"
    assert G.tolerance_args(p, ["DOWN_CONVERT_INPUTS"])["compute"] == "bfloat16"
    assert G.tolerance_args(p, ["WINOGRAD"])["factor"] == 8.0
    h = _p(dtype="float16")
    kw = G.tolerance_args(h, ["REDUCED_PRECISION_REDUCTION"])
    # tolerance() keeps a float32 accumulation for compute == data type: the factor makes it fp16's
    assert kw["compute"] == "float16" and kw["factor"] == pytest.approx(EPS["float16"] / EPS["float32"])
    bf = _p(dtype="bfloat16")
    kw = G.tolerance_args(bf, ["REDUCED_PRECISION_REDUCTION"])
    assert kw["factor"] == pytest.approx(EPS["bfloat16"] / EPS["float32"])
    # backward filter reduces over N*out: a longer reduction widens the bound by sqrt
    kw = G.tolerance_args(p, [], "backward_filter")
    L, Lf = p.n * math.prod(p.out_spatial), p.reduction_length
    assert kw["factor"] == pytest.approx(math.sqrt(L / Lf)) if L > Lf else kw["factor"] == 1.0


@pytest.mark.parametrize("name", ["2d-nhwc", "1d-lifted", "3d", "groups", "asym-stride"])
def test_device_reference_equals_problem_reference_on_cpu(name):
    p = GRAPHS[name].with_(device="cpu")
    x, w, _ = p.make_inputs(seed=3)
    ref, ref_abs = G.reference(p, "forward", {"x": x, "w": w})
    assert torch.equal(ref, conv_reference(p, x, w))
    assert torch.equal(ref_abs, abs_reference(p, x, w))
    st = G.check_result(p, ref.to(p.torch_dtype), ref, ref_abs)
    assert st.ok and st.nan == 0
    bad = ref.contiguous().clone()
    bad.view(-1)[0] = float("nan")
    assert not G.check_result(p, bad, ref, ref_abs).ok


def test_backward_references_match_autograd():
    p = GRAPHS["asym-stride"].with_(device="cpu", dtype="float64", layout="nchw")
    x, w, _ = p.make_inputs(seed=1)
    dy = torch.randn(p.y_shape, dtype=torch.float64)
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = F.conv2d(F.pad(xx, (0, 2, 1, 0)), ww, None, p.stride)
    gx, gw = torch.autograd.grad(y, (xx, ww), dy)
    dx, _ = G.reference(p, "backward_data", {"dy": dy, "w": w})
    dw, _ = G.reference(p, "backward_filter", {"x": x, "dy": dy})
    assert torch.allclose(dx, gx) and torch.allclose(dw, gw)


# ---------------------------------------------------------------- tuning cache
def test_tuning_cache_roundtrip(tmp_path):
    G.clear_tuning_cache()
    G._tuning_put("k1", {"engine": "eng28{k2=3}", "median_ms": 0.1})
    path = tmp_path / "tune.json"
    G.save_tuning_cache(str(path))
    G.clear_tuning_cache()
    assert G.tuning_cache() == {}
    assert G.load_tuning_cache(str(path)) == 1
    assert G.tuning_cache()["k1"]["engine"] == "eng28{k2=3}"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"something": 1}))
    with pytest.raises(ArgumentError):
        G.load_tuning_cache(str(bad))
    G.clear_tuning_cache()


def test_reexported_from_rawconv_cudnn():
    from rawconv import cudnn

    assert cudnn.EngineConfig is G.EngineConfig and cudnn.engines is G.engines


class _FakeGraph:
    """Enough of a GraphConvolution for the knob search, on a synthetic cost landscape."""

    def __init__(self, engines):
        self.engines = engines  # index -> (behavior notes, knob info, cost(knobs) or None = no finalize)
        self.global_count = max(engines) + 1

    def engine_info(self, idx):
        e = self.engines.get(idx)
        if e is None:
            return None
        return ({"numerical_notes": (), "behavior_notes": e[0]}, e[1])

    _random_search = G.GraphConvolution._random_search
    _neighbours = G.GraphConvolution._neighbours
    _knob_search = G.GraphConvolution._knob_search


def _search(fake, budget_trials, seed=0, rows=None):
    rows = {} if rows is None else rows
    calls = []

    def trial(ec, phase):
        if ec.name in rows:
            return rows[ec.name]
        calls.append(ec)
        cost = fake.engines[ec.engine][2](dict(ec.knobs))
        if cost is None:
            rows[ec.name] = G.TimedConfig(ec, status="not supported", phase=phase)
            return None
        rows[ec.name] = row = G.TimedConfig(ec, cost, cost, 1, "ok", None, phase)
        return row

    def left():
        return len(calls) < budget_trials

    for idx in fake.engines:  # default knobs, as autotune's phase 2
        trial(G.EngineConfig(idx), "default knobs")
    fake._knob_search(rows, trial, left)
    fake._random_search(rows, trial, left, seed, set(), False)
    return rows, calls


def test_knob_search_finds_a_hidden_optimum_within_the_trial_budget():
    # engine 3: the good region is only reachable by changing two knobs together (k2 and k5)
    def cost3(k):
        if not k:
            return 1.0
        if k.get(2, 0) % 3 == 2 and k.get(5, 0) >= 6:
            return 0.5 + 0.01 * abs(k[2] - 5) + 0.01 * (7 - k[5])
        return None if k.get(2, 0) > 6 else 1.0 + 0.01 * k.get(2, 0)

    fake = _FakeGraph({
        1: ((), [(2, 0, 3, 1)], lambda k: 2.0 - 0.1 * k.get(2, 0)),
        3: ((), [(2, 0, 8, 1), (5, 0, 7, 1)], cost3),
        7: ((), [], lambda k: 1.5),
        9: ((), [(1, 0, 3, 1)], lambda k: None),   # never finalizes: dropped after 16 draws
    })
    rows, calls = _search(fake, budget_trials=70)  # fewer than the 86 configs there are
    ok = sorted((r for r in rows.values() if r.status == "ok"), key=lambda r: r.median_ms)
    assert ok[0].config.name == "eng3{k2=5,k5=7}", [str(r) for r in ok[:5]]
    assert len(calls) <= 70
    assert len({c.name for c in calls}) == len(calls), "a config was tried twice"
    assert sum(c.engine == 9 for c in calls) <= 17


def test_knob_search_stops_when_every_combination_was_tried():
    fake = _FakeGraph({0: ((), [(2, 0, 2, 1)], lambda k: 1.0 + k.get(2, 0)),
                       4: ((), [(3, 1, 4, 1)], lambda k: 3.0 - 0.1 * k.get(3, 1))})
    rows, calls = _search(fake, budget_trials=10_000)
    # 2 defaults + 3 + 4 combinations, each once
    assert len(calls) == len({c.name for c in calls}) == 2 + 3 + 4


def test_knob_search_skips_slow_runtime_compiled_engines_it_was_not_told_about():
    fake = _FakeGraph({5: (("RUNTIME_COMPILATION",), [(2, 0, 50, 1)], lambda k: 1.0)})
    rows, calls = _search(fake, budget_trials=500)
    # not proposed by a heuristic: the random phase leaves it alone (the default phase tried it)
    assert rows and not any(r.phase == "random knobs" for r in rows.values())


def test_known_wrong_engines_match_only_their_problems():
    asym = ConvProblem(n=2, c=16, k=32, in_spatial=(10, 10), kernel=(3, 3), stride=(2, 2), pad_before=(1, 0),
                       pad_after=(2, 1), dtype="float32", layout="nhwc")
    sym = ConvProblem(n=2, c=16, k=32, in_spatial=(10, 10), kernel=(3, 3), stride=(2, 2), pad_before=(1, 1),
                      pad_after=(1, 1), dtype="float32", layout="nhwc")
    assert G.known_wrong(asym, "backward_filter", 1) and G.known_wrong(asym, "backward_filter", 20)
    assert not G.known_wrong(asym, "backward_filter", 2)
    assert not G.known_wrong(asym, "forward", 1)
    assert not G.known_wrong(sym, "backward_filter", 1)
    half = ConvProblem(n=2, c=16, k=32, in_spatial=(10, 10), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1),
                       dtype="float16", layout="nhwc")
    assert G.known_wrong(half, "backward_data", 2)
    assert not G.known_wrong(half, "backward_data", 1)
    assert not G.known_wrong(half.with_(dtype="bfloat16"), "backward_data", 2)
    nchw = _p(layout="nchw")
    assert G.known_wrong(nchw, "forward", 71) and not G.known_wrong(nchw, "forward", 72)
    assert not G.known_wrong(nchw.with_(layout="nhwc"), "forward", 71)
    assert not G.known_wrong(nchw, "backward_data", 71)


# ---------------------------------------------------------------- autotune(relayout=True), selection logic
def _relayout_plan(monkeypatch, e2e: dict, wrong: set = frozenset()):
    """An NCHW plan whose two searches, checks and GPU timings are stand-ins: the NCHW graph
    offers eng1/eng2, the channels_last graph five eng72 knob choices (engine times ascending);
    ``e2e`` gives each config's time as execute runs it; configs in ``wrong`` fail the end-to-end
    check. Exercises the choice and the commit, not cuDNN."""
    from rawconv.bench import TimeStats
    from rawconv.problem import ErrorStats

    plan = G.GraphConvolution.from_problem(_p(layout="nchw"))
    cl = plan._channels_last()

    def rows(owner, names, times):
        out = []
        for n, t in zip(names, times):
            ec = G.EngineConfig.parse(n)
            owner._built[ec.name] = G._Built(ec, None, 0, {"engine": ec.engine})
            out.append(G.TimedConfig(ec, t, t, 5, "ok", None, "heuristic"))
        return out

    native = rows(plan, ["eng1", "eng2"], [0.030, 0.031])
    nhwc = rows(cl, [f"eng72{{k17={i}}}" for i in range(1, 6)], [0.010, 0.0105, 0.011, 0.012, 0.013])
    monkeypatch.setattr(plan, "_search", lambda *a, **k: native)
    monkeypatch.setattr(cl, "_search", lambda *a, **k: nhwc)
    monkeypatch.setattr(plan, "_example", lambda seed: {"x": None, "w": None, "b": None})
    monkeypatch.setattr(plan, "_tuning_key", lambda *a: "relayout-test")
    monkeypatch.setattr(plan, "_out_tensor", lambda layout: torch.empty(plan.problem.y_shape))
    bound = {r: torch.empty(1) for r in ("x", "w", "y", "b", "dx", "dy", "dw")}
    monkeypatch.setattr(plan, "_bind", lambda *a: (bound, None))
    last = []
    monkeypatch.setattr(plan, "_run_via", lambda bound, c, b: last.append(("nhwc:" + b.config.name)))
    monkeypatch.setattr(plan, "_run", lambda b, ptrs: last.append(b.config.name))
    monkeypatch.setattr(G, "reference", lambda *a, **k: (None, None))
    monkeypatch.setattr(G, "check_result", lambda *a, **k: ErrorStats(0, 0, 5.0 if last[-1] in wrong else 0.5, 0))

    def fake_time(fn, iterations, warmup=1, **kw):
        fn()
        t = e2e[last[-1]]
        return TimeStats(t, t, t, iterations)
    monkeypatch.setattr(G, "_time_reps", fake_time)
    return plan, cl


def test_relayout_autotune_selects_exactly_the_top_row(cudnn, monkeypatch):
    """The fastest end to end is nhwc k17=2 though k17=1 has the fastest engine: that row tops the
    table and is what runs; the fifth channels_last config (not timed end to end) gets the median
    transform time of the four added to its engine time."""
    e2e = {"nhwc:eng72{k17=1}": 0.032, "nhwc:eng72{k17=2}": 0.028, "nhwc:eng72{k17=3}": 0.031,
           "nhwc:eng72{k17=4}": 0.035, "eng1": 0.040, "eng2": 0.045}
    plan, cl = _relayout_plan(monkeypatch, e2e)
    table = plan.autotune(budget_s=1.0, relayout=True, use_cache=False)
    assert [r.name for r in table] == ["nhwc:eng72{k17=2}", "nhwc:eng72{k17=3}", "nhwc:eng72{k17=1}",
                                       "nhwc:eng72{k17=5}", "nhwc:eng72{k17=4}", "eng1", "eng2"]
    assert plan.selected_name == "nhwc:eng72{k17=2}" and cl._selected is cl._built["eng72{k17=2}"]
    fifth = table[3]
    assert fifth.median_ms == pytest.approx(0.013 + statistics.median([0.022, 0.0175, 0.020, 0.023]))
    assert "measured on the best four" in fifth.detail and "end to end" in table[0].detail


def test_relayout_autotune_wrong_transforms_fall_back_to_the_nchw_graph(cudnn, monkeypatch):
    """One channels_last config wrong end to end (its engine alone passed): every channels_last
    row is marked, and the NCHW graph's best runs, even though a channels_last time is lower."""
    e2e = {"nhwc:eng72{k17=1}": 0.012, "eng1": 0.040, "eng2": 0.045}
    plan, cl = _relayout_plan(monkeypatch, e2e, wrong={"nhwc:eng72{k17=1}"})
    table = plan.autotune(budget_s=1.0, relayout=True, use_cache=False)
    assert table[0].name == "eng1" and plan.selected_name == "eng1" and plan._via is None
    assert all(r.status == "mismatch" for r in table if r.layout == "nhwc")
    assert plan._cl is None and cl._freed, "the unchosen channels_last plan is released"


def test_check_plan_tensor_shared_by_both_cuda_plans(no_c_calls):
    """One check for rawconv.cudnn and rawconv.cudnn_graph plan arguments: an unbatched problem
    takes its tensors with or without the batch dim; CPU tensors are pointed to rawconv.onednn."""
    p = _p(n=1, unbatched=True, layout="nchw")
    t = _cudnn.check_plan_tensor
    with pytest.raises(ArgumentError, match="rawconv.onednn"):
        t(p, torch.empty(p.x_shape[1:], dtype=torch.float16), "x", p.x_shape, 0, ("x",))
    with pytest.raises(ArgumentError, match="shape"):
        t(p, torch.empty(p.w_shape[1:], dtype=torch.float16), "w", p.w_shape, 0, ("x",))
    with pytest.raises(ArgumentError, match="float16"):
        t(p, torch.empty(p.x_shape), "x", p.x_shape, 0, ("x",))
    with pytest.raises(ArgumentTypeError):
        t(p, None, "x", p.x_shape, 0, ("x",))


def test_a_runtime_compilation_that_ended_late_is_worth_another_trial(monkeypatch):
    class Plan:
        _built = {"eng72": object()}

    ec72, ec80 = G.EngineConfig(72), G.EngineConfig(80)
    still = "runtime compilation still running after 0.8 s (the budget's end); it finishes in the background"
    assert G._worth_retry(Plan, G.TimedConfig(ec72, status="over budget", detail=still))  # compiled since
    assert not G._worth_retry(Plan, G.TimedConfig(ec80, status="over budget", detail=still))  # still compiling
    assert not G._worth_retry(Plan, G.TimedConfig(ec72, 0.01, 0.01, 5, "ok"))  # tried already
    skipped = G.TimedConfig(ec80, status="over budget", detail="skipped: 8 runtime compilations already running")
    monkeypatch.setattr(G, "_rtc_inflight", {})
    assert G._worth_retry(Plan, skipped)
    monkeypatch.setattr(G, "_rtc_inflight", {(0, f"c{i}"): 0.0 for i in range(G._RTC_WORKERS)})
    assert not G._worth_retry(Plan, skipped)


def test_random_search_tries_late_compilations_and_searches_from_them():
    # engine 5 (runtime-compiled, proposed by a heuristic): its default-knob compilation ended
    # late; once tried it is the fastest engine and its knob neighbours are searched
    fake = _FakeGraph({1: ((), [(2, 0, 3, 1)], lambda k: 2.0),
                       5: (("RUNTIME_COMPILATION",), [(3, 0, 4, 1)], lambda k: 1.0 - 0.1 * k.get(3, 0))})
    rows = {}
    calls = []

    def trial(ec, phase):
        old = rows.get(ec.name)
        if old is not None and old.status != "over budget":
            return old
        calls.append(ec)
        cost = fake.engines[ec.engine][2](dict(ec.knobs))
        rows[ec.name] = row = G.TimedConfig(ec, cost, cost, 1, "ok", None, phase)
        return row

    trial(G.EngineConfig(1), "default knobs")
    rows["eng5"] = G.TimedConfig(G.EngineConfig(5, (), ("RUNTIME_COMPILATION",)), status="over budget",
                                 phase="default knobs", detail="runtime compilation still running")
    late_calls = []

    def late(rows):
        late_calls.append(1)
        return [r for r in rows.values() if r.status == "over budget"]

    fake._random_search(rows, trial, lambda: len(calls) < 40, 0, {5}, False, None, late)
    assert late_calls and rows["eng5"].status == "ok"
    best = min((r for r in rows.values() if r.status == "ok"), key=lambda r: r.median_ms)
    assert best.config.engine == 5 and dict(best.config.knobs).get(3) == 4, best


def _key(desc, tail="|tf32=False|ws=None|f|cudnn 9.19.0|NVIDIA H200"):
    return desc + tail


def test_cache_seeds_rank_like_problems_first_and_skip_other_gpus_and_directions():
    own = _key("forward 2d float16 nhwc x(32,64,56,56) w(64,64,3,3) p1,1")
    cache = {  # insertion order = age, oldest first
        _key("forward 2d float16 nhwc x(32,64,56,56) w(64,64,1,1)"): {"engine": "eng72{k17=1,k24=4}"},
        _key("forward 2d bfloat16 nhwc x(32,128,28,28) w(128,128,3,3) p1,1"): {"engine": "eng58{k25=0}"},
        # a relayout winner of an NCHW problem ran on the channels_last graph: it counts as NHWC
        _key("forward 2d float16 nchw x(32,256,56,56) w(64,256,1,1)"): {"engine": "nhwc:eng72{k17=1,k24=7}"},
        _key("backward_data 2d float16 nhwc x(32,64,56,56) w(64,64,3,3)"): {"engine": "eng1"},
        _key("forward 2d float16 nhwc x(32,64,56,56) w(64,64,3,3)", "|tf32=False|ws=None|f|cudnn 9.19.0|H100"):
            {"engine": "eng2"},
        _key("forward 2d float16 nhwc x(32,512,28,28) w(128,512,1,1)"): {"engine": "eng62{k2=1}"},
        _key("forward 2d float16 nhwc x(32,128,28,28) w(512,128,1,1)"): {"engine": "eng72{k17=1,k24=4}"},
        _key("forward 3d float16 nhwc x(2,8,5,6,7) w(16,8,3,3,3)"): {"engine": "eng3"},
        _key("forward 2d float16 nhwc x(32,64,56,56) w(64,64,3,3) activation relu"): {"engine": "eng4"},
        _key("forward 2d float16 nchw x(32,64,56,56) w(64,64,1,1)"): {"engine": "eng5"},
        own: {"engine": "eng9"},
        "not a key": {"engine": 3},
    }
    # like problems (2d fp16 NHWC, no activation), newest first, each once; then the same
    # dimensions and layout; then the rest, newest first
    assert G._seed_names(cache, own) == ["eng72{k17=1,k24=4}", "eng62{k2=1}", "eng72{k17=1,k24=7}",
                                         "eng4", "eng58{k25=0}", "eng5", "eng3"]
    # the native graph of an NCHW problem, then its channels_last graph
    own_nchw = _key("forward 2d float16 nchw x(32,64,56,56) w(64,64,3,3) p1,1")
    assert G._seed_names(cache, own_nchw)[0] == "eng5"
    assert G._seed_names(cache, own_nchw, layout="nhwc")[:4] == ["eng9", "eng72{k17=1,k24=4}", "eng62{k2=1}",
                                                                 "eng72{k17=1,k24=7}"]
    # a time stamp beats the place in the cache (a cache read from a file is in key order)
    stamped = dict(cache)
    stamped[_key("forward 2d float16 nhwc x(32,64,56,56) w(64,64,1,1)")] = {"engine": "eng72{k17=1,k24=4}", "t": 5.0}
    stamped[_key("forward 2d float16 nhwc x(32,512,28,28) w(128,512,1,1)")] = {"engine": "eng62{k2=1}", "t": 9.0}
    assert G._seed_names(stamped, own)[:2] == ["eng62{k2=1}", "eng72{k17=1,k24=4}"]
    assert G._seed_names({}, own) == []


def test_cache_seed_configs_keep_supported_engines_within_the_caps():
    class Fake:
        def engine_info(self, idx):
            if idx == 5:
                return None  # not offered for this graph
            return ({"numerical_notes": (), "behavior_notes": ("RUNTIME_COMPILATION",) if idx == 72 else ()}, [])

        def _annotate(self, ec):
            info = self.engine_info(ec.engine)
            return ec.with_(numerical_notes=info[0]["numerical_notes"], behavior_notes=info[0]["behavior_notes"])

        _configs = {}
        _seed_configs = G.GraphConvolution._seed_configs

    names = ["eng72{k24=1}", "eng5{k1=1}", "not a name", "eng58{k25=0}", "eng72{k24=2}", "eng72{k24=1}",
             "eng72{k24=3}", "eng62{k2=1}", "eng62{k2=2}"]
    got = Fake()._seed_configs(names, max_rtc=2, max_other=1)
    assert [ec.name for ec in got] == ["eng72{k24=1}", "eng58{k25=0}", "eng72{k24=2}"]
    assert "RUNTIME_COMPILATION" in got[0].behavior_notes
    # autotune's filters: a config they refuse is dropped before it takes a place under the caps
    plan = Fake()
    plan._allowed = lambda ec, **f: "nondeterministic" if f.get("deterministic_only") and ec.engine == 58 else ""
    got = plan._seed_configs(names, max_rtc=2, max_other=1, filters={"deterministic_only": True})
    assert [ec.name for ec in got] == ["eng72{k24=1}", "eng72{k24=2}", "eng62{k2=1}"]
    # include_runtime_compiled=False: only runtime-compiled engines a heuristic mode proposed
    got = plan._seed_configs(names, filters={}, proposed={58}, include_runtime_compiled=False)
    assert [ec.name for ec in got] == ["eng58{k25=0}", "eng62{k2=1}", "eng62{k2=2}"]
    got = plan._seed_configs(names, filters={}, proposed={72}, include_runtime_compiled=False)
    assert got[0].name == "eng72{k24=1}"


def test_autotune_refuses_a_non_bool_seed_from_cache():
    plan = object.__new__(G.GraphConvolution)
    plan._freed = False
    with pytest.raises(ArgumentError, match="seed_from_cache"):
        plan.autotune(seed_from_cache="yes")


def test_late_compilations_are_waited_for_until_the_deadline_unless_patience_ended_the_search(monkeypatch):
    import time

    row = G.TimedConfig(G.EngineConfig(72), status="over budget", detail="runtime compilation still running")
    polls = {"n": 0}
    tried = []

    def late():
        return [row] if polls["n"] >= 3 and row.status == "over budget" else []

    def compiling(plan):
        polls["n"] += 1
        return polls["n"] <= 3  # this plan's compilation ends after three polls

    def trial(ec, phase):
        tried.append(ec.name)
        row.status = "ok"

    monkeypatch.setattr(G, "_compiling", compiling)
    t0 = time.perf_counter()
    G._try_late(object(), late, trial, t0 + 5.0, wait=True)
    assert tried == ["eng72"] and time.perf_counter() - t0 < 1.0  # tried once it ended, then returned
    # patience ended the search: no waiting for running compilations
    row.status, polls["n"], tried[:] = "over budget", 0, []
    G._try_late(object(), late, trial, time.perf_counter() + 5.0, wait=False)
    assert tried == [] and polls["n"] == 0
    # a compilation that never ends: back at the deadline
    monkeypatch.setattr(G, "_compiling", lambda plan: True)
    t0 = time.perf_counter()
    G._try_late(object(), lambda: [], trial, t0 + 0.1, wait=True)
    assert 0.09 < time.perf_counter() - t0 < 0.5
