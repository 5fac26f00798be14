"""rawconv.cudnn_graph without a GPU: backend descriptors built and finalized up to (not including)
the operation graph, attribute plumbing read back from cuDNN, engine-config names, knob
enumeration, tolerance arguments, the device-side reference, the tuning cache, the autotune search
(rawconv.cudnn.graph.search) driven through its plan interface by fake plans, and bad input rejected before
any C call."""
from __future__ import annotations

import json
import logging
import math
import statistics
import threading
import time

import pytest
import torch
import torch.nn.functional as F

from rawconv import ConvProblem
from rawconv.cudnn import _ffi as _cudnn
from rawconv.cudnn import _cuda
from rawconv.cudnn.graph import _backend_api as B
from rawconv.cudnn.graph import search as S
from rawconv import cudnn_graph as G
from rawconv import tuning
from rawconv.errors import ArgumentError, ArgumentTypeError, LibraryError, NotSupportedError
from rawconv.problem import EPS, ErrorStats, abs_reference, conv_reference
from conftest import load_cudnn_or_fail


@pytest.fixture(scope="module")
def cudnn():
    return load_cudnn_or_fail()


@pytest.fixture
def no_c_calls(monkeypatch):
    """Any C call fails the test: proves input is rejected before the library is touched."""
    def boom():
        raise AssertionError("a C function was called")
    monkeypatch.setattr(_cudnn, "lib", boom)


@pytest.fixture
def memory_cache():
    """The process's tuning cache in memory only (whatever $RAWCONV_TUNING_CACHE says), empty
    before and after the test."""
    tuning.set_cache_file("")
    tuning.cache().clear()
    yield tuning.cache()
    tuning.cache().clear()
    tuning.set_cache_file(None)


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
    assert list(S.knob_combinations([])) == [()]
    combos = list(S.knob_combinations([(2, 0, 2, 1), (3, 0, 1, 1)]))
    assert combos[0] == () and len(combos) == 1 + 3 * 2
    assert combos[1] == ((2, 0), (3, 0)) and combos[-1] == ((2, 2), (3, 1))
    assert S.knob_range(1, 9, 4) == [1, 5, 9]
    assert S.knob_range(3, 3, 0) == [3]
    vals = S.knob_values(0, 1000, 1, 500)
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
    g = G.OperationGraph(p, direction, None, p.layout)
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
    g = G.OperationGraph(p, "forward", act, "nhwc")
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
    # the hot path's packer: the same finalized descriptor, the pointer count checked before any C call
    packer = B.VariantPacker([1, 2, 3])
    assert packer([256, 512, 1024], 0).finalized and packer((256, 512, 2 ** 40), 2 ** 33).kind == "VARIANT_PACK"
    with pytest.raises(ArgumentError):
        packer([256, 512], 0)
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
        G.allows_tf32(False, "fast")


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
    cl = plan.channels_last()
    assert cl is plan.channels_last()
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
def test_tuning_cache_roundtrip(tmp_path, memory_cache):
    G.clear_tuning_cache()
    k1 = _key(_cp((32, 64, 56, 56), (64, 64, 3, 3), 1))
    tuning.cache().put(tuning.TuningRecord(k1, "eng28{k2=3}", {"engine": 28, "knobs": [[2, 3]]}, median_ms=0.1))
    path = tmp_path / "tune.json"
    G.save_tuning_cache(str(path))
    G.clear_tuning_cache()
    assert G.tuning_cache() == {}
    assert G.load_tuning_cache(str(path)) == 1
    assert G.tuning_cache()[k1]["engine"] == "eng28{k2=3}"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"something": 1}))
    with pytest.raises(ArgumentError):
        G.load_tuning_cache(str(bad))
    G.clear_tuning_cache()


def test_reexported_from_rawconv_cudnn():
    from rawconv import cudnn

    assert cudnn.EngineConfig is G.EngineConfig and cudnn.engines is G.engines


class _FakeGraph:
    """Enough of a rawconv.cudnn.graph.search.SearchPlan for the knob strategies, on a synthetic cost landscape."""

    def __init__(self, engines):
        self.engines = engines  # index -> (behavior notes, knob info, cost(knobs) or None = no finalize)
        self.global_count = max(engines) + 1

    def engine_info(self, idx):
        e = self.engines.get(idx)
        if e is None:
            return None
        return ({"numerical_notes": (), "behavior_notes": e[0]}, e[1])

    def make_config(self, engine, knobs=(), numerical_notes=(), behavior_notes=()):
        return G.EngineConfig(engine, knobs, (), tuple(numerical_notes), tuple(behavior_notes))


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
    S.knob_search(fake, rows, trial, left)
    S.random_search(fake, rows, trial, left, seed, set(), False)
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
    cl = plan.channels_last()

    def rows(owner, names, times):
        out = []
        for n, t in zip(names, times):
            ec = G.EngineConfig.parse(n)
            owner._built[ec.name] = G._Built(ec, None, 0, {"engine": ec.engine})
            out.append(G.TimedConfig(ec, t, t, 5, "ok", None, "heuristic"))
        return out

    native = rows(plan, ["eng1", "eng2"], [0.030, 0.031])
    nhwc = rows(cl, [f"eng72{{k17={i}}}" for i in range(1, 6)], [0.010, 0.0105, 0.011, 0.012, 0.013])
    monkeypatch.setattr(S, "search", lambda p, *a, **k: native if p is plan else nhwc if p is cl else pytest.fail())
    monkeypatch.setattr(plan, "_example", lambda seed: {"x": None, "w": None, "b": None})
    monkeypatch.setattr(G, "environment", lambda index: dict(_ENV))
    monkeypatch.setattr(plan, "output", lambda layout=None: torch.empty(plan.problem.y_shape))
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
    monkeypatch.setattr(S, "time_reps", fake_time)
    return plan, cl


def test_relayout_autotune_selects_exactly_the_top_row(cudnn, monkeypatch, memory_cache):
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
    # the choice is recorded: its "nhwc:" name, what it ran in, engine and knobs
    (rec,) = memory_cache.records()
    assert rec.choice == "nhwc:eng72{k17=2}" and rec.layout == "nhwc" and rec.key.options["relayout"]
    assert rec.key.layout == "nchw" and dict(rec.detail)["engine"] == 72 and rec.detail["knobs"] == ((17, 2),)


def test_relayout_autotune_wrong_transforms_fall_back_to_the_nchw_graph(cudnn, monkeypatch, memory_cache):
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
    t = _cuda.check_plan_tensor
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
        built = {"eng72": object()}

    ec72, ec80 = G.EngineConfig(72), G.EngineConfig(80)
    still = "runtime compilation still running after 0.8 s (the budget's end); it finishes in the background"
    assert S.worth_retry(Plan, G.TimedConfig(ec72, status="over budget", detail=still))  # compiled since
    assert not S.worth_retry(Plan, G.TimedConfig(ec80, status="over budget", detail=still))  # still compiling
    assert not S.worth_retry(Plan, G.TimedConfig(ec72, 0.01, 0.01, 5, "ok"))  # tried already
    skipped = G.TimedConfig(ec80, status="over budget", detail="skipped: 8 runtime compilations already running")
    monkeypatch.setattr(S, "_rtc_inflight", {})
    assert S.worth_retry(Plan, skipped)
    monkeypatch.setattr(S, "_rtc_inflight", {(0, f"c{i}"): 0.0 for i in range(S._RTC_WORKERS)})
    assert not S.worth_retry(Plan, skipped)


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

    S.random_search(fake, rows, trial, lambda: len(calls) < 40, 0, {5}, False, None, late)
    assert late_calls and rows["eng5"].status == "ok"
    best = min((r for r in rows.values() if r.status == "ok"), key=lambda r: r.median_ms)
    assert best.config.engine == 5 and dict(best.config.knobs).get(3) == 4, best


_ENV = {"library": "cuDNN", "library_version": "9.19.0", "device": "NVIDIA H200", "device_arch": "sm_90"}


def _cp(x, w, pad=0, dtype="float16", layout="nhwc"):
    """The problem of x shape ``x`` and weight shape ``w`` (stride 1, symmetric ``pad``)."""
    nd = len(x) - 2
    return ConvProblem(n=x[0], c=x[1], k=w[0], in_spatial=tuple(x[2:]), kernel=tuple(w[2:]),
                       pad_before=(pad,) * nd, pad_after=(pad,) * nd, dtype=dtype, layout=layout, device="cuda:0")


def _key(problem, direction="forward", activation=None, device="NVIDIA H200"):
    return tuning.TuningKey("cudnn_graph", direction, problem, activation, {"allow_tf32": False},
                            **dict(_ENV, device=device))


def _rec(key, choice, created="2026-12-01T00:00:00+00:00"):
    """A record of the graph's winner ``choice`` (a config name, "nhwc:" first for one that ran on
    channels_last copies; a name that is no config gets an empty detail)."""
    layout = "nhwc" if choice.startswith("nhwc:") else ""
    try:
        ec = G.EngineConfig.parse(choice.split(":")[-1])
        detail = {"engine": ec.engine, "knobs": [list(k) for k in ec.knobs]}
    except ArgumentError:
        detail = {}
    return tuning.TuningRecord(key, choice, detail, layout, 0.1, 0.1, created=created)


def _seed_names(cache, key, layout=None):
    """The config names cache seeds give the graph search, in order (what autotune passes on)."""
    return [ec.name for ec in G._configs_of(cache.seeds(key, layout=layout))]


def test_cache_seeds_rank_like_problems_first_and_skip_other_gpus_and_directions():
    own = _key(_cp((32, 64, 56, 56), (64, 64, 3, 3), 1))
    cache = tuning.TuningCache()
    for rec in [  # put order = age, oldest first
        _rec(_key(_cp((32, 64, 56, 56), (64, 64, 1, 1))), "eng72{k17=1,k24=4}"),
        _rec(_key(_cp((32, 128, 28, 28), (128, 128, 3, 3), 1, dtype="bfloat16")), "eng58{k25=0}"),
        # a relayout winner of an NCHW problem ran on the channels_last graph: it counts as NHWC
        _rec(_key(_cp((32, 256, 56, 56), (64, 256, 1, 1), layout="nchw")), "nhwc:eng72{k17=1,k24=7}"),
        _rec(_key(_cp((32, 64, 56, 56), (64, 64, 3, 3)), "backward_data"), "eng1"),
        _rec(_key(_cp((32, 64, 56, 56), (64, 64, 3, 3)), device="H100"), "eng2"),
        _rec(_key(_cp((32, 512, 28, 28), (128, 512, 1, 1))), "eng62{k2=1}"),
        _rec(_key(_cp((32, 128, 28, 28), (512, 128, 1, 1))), "eng72{k17=1,k24=4}"),
        _rec(_key(_cp((2, 8, 5, 6, 7), (16, 8, 3, 3, 3))), "eng3"),
        _rec(_key(_cp((32, 64, 56, 56), (64, 64, 3, 3)), activation="relu"), "eng4"),
        _rec(_key(_cp((32, 64, 56, 56), (64, 64, 1, 1), layout="nchw")), "eng5"),
        _rec(own, "eng9"),
        _rec(_key(_cp((32, 64, 28, 28), (64, 64, 3, 3), 1)), "not a name"),
    ]:
        cache.put(rec)
    # like problems (2d fp16 NHWC, no activation), newest first, each once; then the same
    # dimensions and layout; then the rest, newest first
    assert _seed_names(cache, own) == ["eng72{k17=1,k24=4}", "eng62{k2=1}", "eng72{k17=1,k24=7}",
                                       "eng4", "eng58{k25=0}", "eng5", "eng3"]
    # the native graph of an NCHW problem, then its channels_last graph
    own_nchw = _key(_cp((32, 64, 56, 56), (64, 64, 3, 3), 1, layout="nchw"))
    assert _seed_names(cache, own_nchw)[0] == "eng5"
    assert _seed_names(cache, own_nchw, layout="nhwc")[:4] == ["eng9", "eng72{k17=1,k24=4}", "eng62{k2=1}",
                                                               "eng72{k17=1,k24=7}"]
    # a time stamp beats the place in the cache (a cache read from a file is in key order)
    stamped = tuning.TuningCache()
    stamped.put(_rec(_key(_cp((32, 64, 56, 56), (64, 64, 1, 1))), "eng72{k17=1,k24=4}", "2026-12-01T00:00:05+00:00"))
    stamped.put(_rec(_key(_cp((32, 512, 28, 28), (128, 512, 1, 1))), "eng62{k2=1}", "2026-12-01T00:00:09+00:00"))
    for rec in cache.records():  # put after the two, but made earlier
        if rec.key not in stamped:
            stamped.put(rec)
    assert _seed_names(stamped, own)[:2] == ["eng62{k2=1}", "eng72{k17=1,k24=4}"]
    assert _seed_names(tuning.TuningCache(), own) == []


def test_cache_seed_configs_keep_supported_engines_within_the_caps():
    class Fake:
        def engine_info(self, idx):
            if idx == 5:
                return None  # not offered for this graph
            return ({"numerical_notes": (), "behavior_notes": ("RUNTIME_COMPILATION",) if idx == 72 else ()}, [])

        def annotate(self, ec):
            info = self.engine_info(ec.engine)
            return ec.with_(numerical_notes=info[0]["numerical_notes"], behavior_notes=info[0]["behavior_notes"])

    names = ["eng72{k24=1}", "eng5{k1=1}", "not a name", "eng58{k25=0}", "eng72{k24=2}", "eng72{k24=1}",
             "eng72{k24=3}", "eng62{k2=1}", "eng62{k2=2}"]
    # the configs autotune takes from the cache's records (a record that holds none is skipped)
    configs = G._configs_of([_rec(_key(_cp((2, 8, 9, 9), (8, 8, 3, 3))), n) for n in names])
    got = S.seed_configs(Fake(), configs, max_rtc=2, max_other=1)
    assert [ec.name for ec in got] == ["eng72{k24=1}", "eng58{k25=0}", "eng72{k24=2}"]
    assert "RUNTIME_COMPILATION" in got[0].behavior_notes
    # autotune's filters: a config they refuse is dropped before it takes a place under the caps
    plan = Fake()
    plan.allowed = lambda ec, **f: "nondeterministic" if f.get("deterministic_only") and ec.engine == 58 else ""
    got = S.seed_configs(plan, configs, max_rtc=2, max_other=1, filters={"deterministic_only": True})
    assert [ec.name for ec in got] == ["eng72{k24=1}", "eng72{k24=2}", "eng62{k2=1}"]
    # include_runtime_compiled=False: only runtime-compiled engines a heuristic mode proposed
    got = S.seed_configs(plan, configs, filters={}, proposed={58}, include_runtime_compiled=False)
    assert [ec.name for ec in got] == ["eng58{k25=0}", "eng62{k2=1}", "eng62{k2=2}"]
    got = S.seed_configs(plan, configs, filters={}, proposed={72}, include_runtime_compiled=False)
    assert got[0].name == "eng72{k24=1}"


def test_autotune_refuses_a_non_bool_seed_from_cache():
    plan = object.__new__(G.GraphConvolution)
    plan._freed = False
    with pytest.raises(ArgumentError, match="seed_from_cache"):
        plan.autotune(seed_from_cache="yes")


def test_late_compilations_are_waited_for_until_the_deadline_unless_patience_ended_the_search(monkeypatch):
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

    monkeypatch.setattr(S, "compiling", compiling)
    t0 = time.perf_counter()
    S.try_late(object(), late, trial, t0 + 5.0, wait=True)
    assert tried == ["eng72"] and time.perf_counter() - t0 < 1.0  # tried once it ended, then returned
    # patience ended the search: no waiting for running compilations
    row.status, polls["n"], tried[:] = "over budget", 0, []
    S.try_late(object(), late, trial, time.perf_counter() + 5.0, wait=False)
    assert tried == [] and polls["n"] == 0
    # a compilation that never ends: back at the deadline
    monkeypatch.setattr(S, "compiling", lambda plan: True)
    t0 = time.perf_counter()
    S.try_late(object(), lambda: [], trial, t0 + 0.1, wait=True)
    assert 0.09 < time.perf_counter() - t0 < 0.5


# ---------------------------------------------------------------- the whole search on a fake plan
class _FakePlan:
    """A rawconv.cudnn.graph.search.SearchPlan without cuDNN: ``engines`` index -> (numerical notes, behavior
    notes, knob info, cost(knobs) in ms or None = does not finalize, workspace bytes); heuristic
    modes return ``heuristics[mode]`` (names); configs in ``wrong`` give results outside their
    tolerance. Running a config records it, so the fake timers know its cost."""

    heuristic_modes = G.HEURISTIC_MODES
    allowed = G.GraphConvolution.allowed  # the plan's own note filters
    make_config = _FakeGraph.make_config

    def __init__(self, engines, heuristics=None, wrong=()):
        self.problem, self.direction, self.activation, self.allow_tf32 = _p(), "forward", None, False
        self.engines, self.heuristics, self.wrong = engines, heuristics or {}, set(wrong)
        self.built, self.failed, self.ran, self.builds = {}, {}, [], []
        self.global_count = max(engines) + 1

    def engine_info(self, idx):
        e = self.engines.get(idx)
        return None if e is None else ({"numerical_notes": e[0], "behavior_notes": e[1]}, e[2])

    def heuristic(self, mode):
        return [self.annotate(G.EngineConfig.parse(n)).with_(heuristics=(mode,)) for n in self.heuristics.get(mode, ())]

    def annotate(self, ec):
        info = self.engine_info(ec.engine)
        if ec.numerical_notes or ec.behavior_notes or info is None:
            return ec
        return ec.with_(**info[0])

    def build(self, ec, *, handle=None):
        self.builds.append((ec.name, threading.current_thread().name))
        if ec.name in self.built:
            return self.built[ec.name]
        e = self.engines[ec.engine]
        if e[3](dict(ec.knobs)) is None:
            self.failed[ec.name] = "CUDNN_STATUS_NOT_SUPPORTED"
            raise NotSupportedError(f"{ec.name} does not finalize", library="cuDNN")
        ec = self.annotate(ec).with_(workspace_bytes=e[4], finalizes=True)
        b = self.built[ec.name] = G._Built(ec, None, e[4], {"engine": ec.engine})
        return b

    def handle(self):
        return None

    def output(self, layout=None):
        return torch.empty(4)

    def call_for(self, b, tensors, out):
        def run():
            self.ran.append(b.config)
            out.fill_(1.0)
        return run

    def check_output(self, out, config, ref, ref_abs):
        assert not torch.isnan(out).any(), "checked before it ran"
        return ErrorStats(0.0, 0.0, 5.0 if config.name in self.wrong else 0.5, 0)

    def cost(self):
        ec = self.ran[-1]
        return self.engines[ec.engine][3](dict(ec.knobs))


@pytest.fixture
def fake_timers(monkeypatch):
    """The search's GPU timers replaced: a call "takes" the cost of what it ran on the fake plan
    set as ``fake_timers.plan``."""
    from rawconv.bench import TimeStats

    class Timers:
        plan = None

        def time(self, fn, iterations=1):
            fn()
            c = self.plan.cost()
            return TimeStats(c, c, c, iterations)

    t = Timers()
    monkeypatch.setattr(S, "time_once", lambda fn: t.time(fn))
    monkeypatch.setattr(S, "time_reps", lambda fn, iterations, warmup=1, **kw: t.time(fn, iterations))
    return t


def _landscape():
    return {
        # heuristic engine, knobs; its best is k2=3
        1: ((), (), [(2, 0, 3, 1)], lambda k: 2.0 - 0.2 * k.get(2, 0), 0),
        # a default-knob engine no heuristic proposes, the fastest once its knob k5 is 2
        3: ((), (), [(5, 0, 3, 1)], lambda k: 1.0 - 0.3 * (k.get(5, 0) == 2), 1 << 20),
        # down-converts its inputs: filtered by default
        4: (("DOWN_CONVERT_INPUTS",), (), [], lambda k: 0.1, 0),
        # never finalizes
        6: ((), (), [(1, 0, 1, 1)], lambda k: None, 0),
        # runtime-compiled, proposed by no heuristic mode
        8: ((), ("RUNTIME_COMPILATION",), [], lambda k: 0.9, 0),
        # gives wrong results
        9: ((), (), [], lambda k: 0.05, 0),
    }


def test_search_on_a_fake_plan_runs_every_phase_in_order_and_ranks_what_it_found(fake_timers, caplog):
    plan = _FakePlan(_landscape(), {"instant": ["eng1{k2=0}"], "fallback": ["eng1{k2=1}"]}, wrong={"eng9"})
    fake_timers.plan = plan
    opts = S.SearchOptions(budget_s=30.0, patience=None, include_runtime_compiled=False)
    with caplog.at_level(logging.DEBUG, logger="rawconv.search"):
        table = S.search(plan, time.perf_counter() + 30.0, 30.0, {}, None, None, opts,
                         seeds=[G.EngineConfig(3, ((5, 1),)), G.EngineConfig(5)])  # engine 5: not offered
    rows = {r.name: r for r in table}
    # every phase, in order: heuristic configs, the cache seed, then the engines' default knobs
    first = list(dict.fromkeys(ec.name for ec in plan.ran))[:4]  # each trial runs its config several times
    assert first == ["eng1{k2=0}", "eng1{k2=1}", "eng3{k5=1}", "eng1"], first
    assert rows["eng1{k2=0}"].phase == "heuristic" and rows["eng3{k5=1}"].phase == "cache seed"
    assert "eng5" not in rows, "a seed of an engine the graph does not offer is not tried"
    assert rows["eng3"].phase == "default knobs"
    # the knob searches find both engines' best knobs; the fastest correct config tops the table
    assert table[0].name == "eng3{k5=2}" and table[0].status == "ok" and table[0].median_ms == pytest.approx(0.7)
    assert rows["eng1{k2=3}"].status == "ok"
    assert rows["eng4"].status == "filtered" and "down-converts" in rows["eng4"].detail
    assert rows["eng6"].status == "not supported" and rows["eng6"].detail == "CUDNN_STATUS_NOT_SUPPORTED"
    assert rows["eng8"].status == "filtered" and "include_runtime_compiled" in rows["eng8"].detail
    assert rows["eng9"].status == "mismatch" and rows["eng9"].error.ratio == 5.0
    ok = [r for r in table if r.status == "ok"]
    assert [r.median_ms for r in ok] == sorted(r.median_ms for r in ok)
    assert all(r.runs == 5 * (30 // 5) for r in ok[:8]), "the best eight are re-timed in 5 rounds"
    assert len({ec.name for ec in plan.ran if ec.name != "eng9"}) == len(ok)
    # one debug line per phase, in order
    phases = [m.split(":")[0] for m in caplog.messages[1:]]
    assert phases == ["heuristic", "cache seed", "default knobs", "knob search", "random knobs",
                      "late compilations", "final re-timing"], caplog.messages
    assert "cache seed: 1 trials" in caplog.messages[2]


def test_search_on_a_fake_plan_honours_workspace_limit_patience_and_compiles_in_the_background(fake_timers):
    plan = _FakePlan(_landscape(), {"instant": ["eng1{k2=0}"]})
    fake_timers.plan = plan
    # a flat landscape after the default knobs: patience ends the search after 3 trials
    flat = _FakePlan({1: ((), (), [(2, 0, 9, 1)], lambda k: 1.0, 0)})
    fake_timers.plan = flat
    table = S.search(flat, time.perf_counter() + 30.0, 30.0, {}, None, None, S.SearchOptions(patience=3))
    assert sum(r.phase == "knob search" for r in table) == 3
    assert not any(r.phase == "random knobs" for r in table)
    # workspace limit; the runtime-compiled engine allowed, built in a worker thread
    fake_timers.plan = plan
    opts = S.SearchOptions(workspace_limit=1000, patience=None, include_runtime_compiled=True)
    table = S.search(plan, time.perf_counter() + 30.0, 30.0, {}, None, None, opts)
    rows = {r.name: r for r in table}
    assert rows["eng3"].status == "filtered" and rows["eng3"].detail == f"workspace {1 << 20} B > limit 1000 B"
    assert rows["eng8"].status == "ok" and rows["eng8"].phase == "default knobs"
    assert ("eng8", "rawconv-rtc-eng8") in plan.builds, plan.builds
    assert table[0].name == "eng9", "right on this plan: the fastest config tops the table"
    assert not S.compiling(plan)


def test_search_options_check_their_arguments():
    with pytest.raises(ArgumentError, match="budget_s"):
        S.SearchOptions(budget_s=-1)
    with pytest.raises(ArgumentError, match="workspace_limit"):
        S.SearchOptions(workspace_limit=1.5)
    with pytest.raises(ArgumentError, match="relayout"):
        S.SearchOptions(relayout=1)
    assert S.SearchOptions(workspace_limit=0, patience=None).workspace_limit == 0


def test_graph_plan_satisfies_the_search_protocol(cudnn):
    """Every member of rawconv.cudnn.graph.search.SearchPlan exists on GraphConvolution (built on the CPU)."""
    import inspect

    plan = G.GraphConvolution.from_problem(_p(layout="nchw"))
    members = [n for n, _ in inspect.getmembers(S.SearchPlan) if not n.startswith("_")]
    members += list(S.SearchPlan.__annotations__)
    missing = [n for n in members if not hasattr(type(plan), n) and not hasattr(plan, n)]
    assert not missing and len(members) >= 18, missing
    ec = plan.make_config(72, {24: 4, 17: 1}, ("TENSOR_CORE",))
    assert ec.name == "eng72{k17=1,k24=4}" and ec.tensor_cores
    assert plan.allowed(ec) == "" and plan.built is plan._built and plan.failed is plan._failed


def test_tuning_records_of_the_graph_hold_its_config(cudnn, monkeypatch, memory_cache):
    """autotune's key: problem, direction (canonical), activation, the filters in force
    (no_tensor_cores resolved), cuDNN's version and the GPU; its record: the row's name,
    engine and knobs, times and error."""
    monkeypatch.setattr(G, "environment", lambda index: dict(_ENV))
    p = _p(dtype="float32", has_bias=True)
    plan = G.GraphConvolution.from_problem(p, activation="relu")
    key = plan._tuning_key(S.SearchOptions(workspace_limit=0), False)
    assert key.backend == "cudnn_graph" and key.direction == "forward" and key.activation == "relu"
    assert key.options["no_tensor_cores"] is True and key.options["workspace_limit"] == 0
    assert key.options["allow_tf32"] is False and key.options["relayout"] is False
    assert key.conv_problem() == p.with_(device="cuda") and key.library_version == "9.19.0"
    bw = G.GraphConvolution.from_problem(_p(), direction="backward_filter")
    assert bw._tuning_key(S.SearchOptions(), False).direction == "backward_weights"
    row = G.TimedConfig(G.EngineConfig(72, ((17, 1),), (), ("TENSOR_CORE",)), 0.012, 0.011, 30, "ok",
                        ErrorStats(1e-3, 1e-4, 0.25, 0), "knob search")
    rec = plan._record(key, row)
    assert rec.choice == "eng72{k17=1}" and rec.layout == "nhwc" and rec.median_ms == 0.012
    assert rec.detail["engine"] == 72 and rec.detail["knobs"] == ((17, 1),)
    assert rec.error["ratio"] == 0.25 and rec.key == key
    assert G._configs_of([rec]) == [G.EngineConfig(72, ((17, 1),))]
    back = tuning.TuningRecord.from_json(rec.to_json())
    assert back == rec and G._configs_of([back])[0].name == "eng72{k17=1}"


def test_overtime_waits_for_a_slow_compilation_when_nothing_ran_correctly_within_the_budget(fake_timers, caplog):
    """A fused graph's engines are mostly runtime-compiled; on a short budget none may finish
    compiling in time. The search then waits for them (phase "overtime") rather than returning no
    correct row (convert's autotune would otherwise leave the layer untimed)."""
    engines = {7: ((), ("RUNTIME_COMPILATION",), [], lambda k: 0.5, 0),
               8: ((), ("RUNTIME_COMPILATION",), [], lambda k: 0.4, 0)}
    plan = _FakePlan(engines, {"instant": ["eng7", "eng8"]})
    build = plan.build

    def slow_build(ec, *, handle=None):
        time.sleep(0.4)   # longer than the whole budget
        return build(ec, handle=handle)
    plan.build = slow_build
    fake_timers.plan = plan
    t0 = time.perf_counter()
    opts = S.SearchOptions(budget_s=0.1, patience=None, include_runtime_compiled=True)
    with caplog.at_level(logging.DEBUG, logger="rawconv.search"):
        table = S.search(plan, t0 + 0.1, 0.1, {}, None, None, opts)
    took = time.perf_counter() - t0
    ok = [r for r in table if r.status == "ok"]
    assert ok, [(r.name, r.status, r.detail) for r in table]
    assert ok[0].name in ("eng7", "eng8") and ok[0].median_ms in (0.5, 0.4)
    assert any(m.startswith("overtime:") for m in caplog.messages), caplog.messages
    assert took < S.OVERTIME_S + 1.0, took
    # with a budget that fits the compilations, no overtime
    plan2 = _FakePlan(engines, {"instant": ["eng7", "eng8"]})
    fake_timers.plan = plan2
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="rawconv.search"):
        table = S.search(plan2, time.perf_counter() + 2.0, 2.0, {}, None, None,
                         S.SearchOptions(budget_s=2.0, patience=None, include_runtime_compiled=True))
    assert table[0].name == "eng8" and table[0].status == "ok"
    assert not any(m.startswith("overtime:") for m in caplog.messages)


def test_prefetch_starts_the_top_runtime_compiled_heuristic_configs_and_returns_at_once():
    """convert's autotune compiles the next problem's likely first candidates while this one is
    timed: prefetch() starts them in background threads and does not wait."""
    engines = {7: ((), ("RUNTIME_COMPILATION",), [], lambda k: 0.5, 0),
               8: ((), ("RUNTIME_COMPILATION",), [], lambda k: 0.4, 0),
               9: ((), (), [], lambda k: 0.3, 0)}
    plan = _FakePlan(engines, {"instant": ["eng9", "eng7", "eng8"]})
    build = plan.build

    def slow_build(ec, *, handle=None):
        time.sleep(0.3)
        return build(ec, handle=handle)
    plan.build = slow_build
    t0 = time.perf_counter()
    started = S.prefetch(plan, n=2)
    assert time.perf_counter() - t0 < 0.2, "prefetch waited for the compilation"
    assert started == ["eng7"], "only runtime-compiled configs among the first n"
    assert S.compiling(plan)
    while S.compiling(plan):
        time.sleep(0.01)
    assert "eng7" in plan.built and "eng8" not in plan.built and "eng9" not in plan.built
    assert S.prefetch(plan, n=0) == []


def _rtc_engines():
    return {7: ((), ("RUNTIME_COMPILATION",), [], lambda k: 0.5, 0),
            8: ((), ("RUNTIME_COMPILATION",), [], lambda k: 0.4, 0)}


def _slow_rtc_plan(seconds: float) -> _FakePlan:
    """A fake plan of two runtime-compiled engines (heuristic: eng7, eng8) whose builds take ``seconds``."""
    plan = _FakePlan(_rtc_engines(), {"instant": ["eng7", "eng8"]})
    build = plan.build

    def slow(ec, *, handle=None):
        time.sleep(seconds)
        return build(ec, handle=handle)
    plan.build = slow
    return plan


def test_overtime_waits_for_a_free_worker_when_other_plans_compilations_hold_them_all(fake_timers, monkeypatch,
                                                                                      caplog):
    """Every runtime-compilation worker busy with another plan (the next problem's prefetch,
    another thread's search): this search's runtime-compiled candidates are skipped within the
    budget; the overtime then waits for a worker and compiles them (blocking, as it says) rather
    than return at once with no correct row. A search whose deadline has already passed also
    ends with one timed, checked row."""
    monkeypatch.setattr(S, "_RTC_WORKERS", 2)
    other, engines = _slow_rtc_plan(0.6), _rtc_engines()
    assert S.compile_in_background(other, other.heuristic("instant"), 0.0) == ["eng7", "eng8"]
    assert S.rtc_busy()
    plan = _FakePlan(engines, {"instant": ["eng7", "eng8"]})
    fake_timers.plan = plan
    t0 = time.perf_counter()
    with caplog.at_level(logging.DEBUG, logger="rawconv.search"):
        table = S.search(plan, t0 + 0.1, 0.1, {}, None, None,
                         S.SearchOptions(budget_s=0.1, patience=None, include_runtime_compiled=True))
    took = time.perf_counter() - t0
    ok = [r for r in table if r.status == "ok"]
    assert ok, [(r.name, r.status, r.phase, r.detail) for r in table]
    assert any(m.startswith("overtime:") for m in caplog.messages), caplog.messages
    assert 0.4 < took < S.OVERTIME_S + 1.0, took
    while S.compiling(other):
        time.sleep(0.01)
    late = _FakePlan({9: ((), (), [], lambda k: 0.3, 0)}, {"instant": ["eng9"]})
    fake_timers.plan = late
    t0 = time.perf_counter()
    table = S.search(late, t0 - 1.0, 0.1, {}, None, None, S.SearchOptions(budget_s=0.1, patience=None))
    assert [(r.name, r.status, r.phase) for r in table] == [("eng9", "ok", "overtime")]
    assert time.perf_counter() - t0 < 1.0
    # past its deadline while the workers are busy: the overtime's own builds wait for one
    other.built.clear()
    assert S.compile_in_background(other, other.heuristic("instant"), 0.0) == ["eng7", "eng8"]
    plan = _FakePlan(engines, {"instant": ["eng7", "eng8"]})
    fake_timers.plan = plan
    table = S.search(plan, time.perf_counter() - 1.0, 0.1, {}, None, None,
                     S.SearchOptions(budget_s=0.1, patience=None, include_runtime_compiled=True))
    assert (table[0].name, table[0].status, table[0].phase) == ("eng7", "ok", "overtime")
    while S.compiling(other):
        time.sleep(0.01)


@pytest.mark.parametrize("workers,first", [(2, ["eng7"]), (8, ["eng7", "eng8"])])
def test_prefetch_leaves_half_the_workers_free_and_never_compiles_a_config_twice(monkeypatch, workers, first):
    """prefetch takes at most half of the runtime-compilation workers (rounded down: with two,
    one), so that the search in progress keeps some; it returns only the compilations it started,
    n past the heuristic list is harmless, and a second prefetch of the same plan starts none of
    the same configs again."""
    monkeypatch.setattr(S, "_RTC_WORKERS", workers)
    plan = _slow_rtc_plan(0.2)
    assert S.prefetch(plan, n=50) == first
    assert S.prefetch(plan, n=50) == []
    while S.compiling(plan):
        time.sleep(0.01)
    rest = S.prefetch(plan, n=50)
    assert rest == [n for n in ("eng7", "eng8") if n not in first]
    while S.compiling(plan):
        time.sleep(0.01)
    names = [n for n, _ in plan.builds]
    assert sorted(names) == ["eng7", "eng8"], names
    assert S.prefetch(plan, n=50) == [], "built already"


def test_workspaces_are_kept_on_the_default_stream_only_and_per_call_elsewhere(monkeypatch):
    """Capture safety (CUDA graphs, reduce-overhead's graph trees): a graph plan keeps a workspace
    (and an "nhwc:" config's channels_last buffers) only for the device's default stream, which is
    never captured; on any other stream (a side stream, a capture, a graph tree's warm-up) each call
    takes its own from the allocator and gives it back after the launch, so nothing a plan keeps is
    allocated inside a capture, and two streams never share one. A plan that needs no workspace
    allocates none. (cuDNN and the CUDA handle stubbed; CPU stand-ins for the CUDA buffers: the
    bookkeeping and the variant packs' addresses are what is tested.)"""
    import types

    made, packs, launched = [], [], []

    def fake_workspace(nbytes, device):
        made.append(torch.empty(max(nbytes, 1), dtype=torch.uint8))
        return made[-1]
    monkeypatch.setattr(G._cuda, "workspace", fake_workspace)
    state = types.SimpleNamespace(ptr="handle", stream=0)
    monkeypatch.setattr(G._cuda, "handle_state", lambda idx: state)

    def variant_pack(uids, ptrs, ws_ptr):
        packs.append((ptrs, ws_ptr))
        return types.SimpleNamespace(ptr=len(packs))
    monkeypatch.setattr(G.B, "VariantPacker", lambda uids: lambda ptrs, ws_ptr: variant_pack(uids, ptrs, ws_ptr))
    status = [0]

    class Lib:
        def cudnnBackendExecute(self, h, plan, vp):
            launched.append((h, plan, vp, list(made)))
            return status[0]
    monkeypatch.setattr(G._cudnn, "lib", lambda: Lib())
    plan = G.GraphConvolution.__new__(G.GraphConvolution)
    plan.device_index, plan._dev = 0, torch.device("cpu")
    plan._graph = types.SimpleNamespace(uids=(1, 2, 3), packer=None)
    b = G._Built(G.EngineConfig(3), types.SimpleNamespace(ptr="plan"), 64, {})
    plan._run(b, (10, 20, 30))
    plan._run(b, (10, 20, 30))
    assert len(made) == 1 and b.workspace is made[0], "the default stream: one workspace for the plan's life"
    assert len(packs) == 1 and packs[0] == ((10, 20, 30), made[0].data_ptr())
    assert [v[:3] for v in launched] == [("handle", "plan", 1)] * 2
    state.stream = 222   # a side or capture stream: a workspace per call, none kept
    plan._run(b, (10, 20, 30))
    plan._run(b, (10, 20, 30))
    assert len(made) == 3 and b.workspace is made[0], "per call on another stream, the kept one untouched"
    assert launched[-1][3][-1] is made[2], "the call's own workspace is alive at its launch"
    assert all(ws == made[0].data_ptr() or ws in (made[1].data_ptr(), made[2].data_ptr()) for _, ws in packs)
    assert packs[-1][1] == made[2].data_ptr() or (packs[-1][1] == made[1].data_ptr() == made[2].data_ptr())
    state.stream = 0
    plan._run(b, (10, 20, 30))
    assert launched[-1][2] == 1 and len(made) == 3, "back on the default stream: its workspace and pack again"
    none = G._Built(G.EngineConfig(4), types.SimpleNamespace(ptr="plan0"), 0, {})
    for stream in (0, 333):
        state.stream = stream
        plan._run(none, (10, 20, 30))
    assert len(made) == 3 and none.workspace is None and packs[-1] == ((10, 20, 30), 0), "no workspace: none made"

    p2 = G.GraphConvolution.__new__(G.GraphConvolution)
    p2._bufs, p2._dev = None, torch.device("cpu")
    monkeypatch.setattr(G.GraphConvolution, "_make_relayout_buffers",
                        lambda self: {"x": (torch.empty(8, dtype=torch.float64), "void *", "own", "cl")})
    a = p2._relayout_buffers(0)
    assert p2._relayout_buffers(0) is a, "the default stream's buffers are kept"
    assert p2._relayout_buffers(111) is not a and p2._relayout_buffers(111) is not p2._relayout_buffers(111)
    assert p2._bufs is a
    state.stream = 0
    plan._describe = lambda: "stub"
    status[0] = 3   # CUDNN_STATUS_BAD_PARAM
    with pytest.raises(LibraryError, match="cudnnBackendExecute"):
        plan._run(b, (10, 20, 30))


@pytest.mark.parametrize("relayout", [False, True])
def test_autotune_runs_one_search_within_its_budget(monkeypatch, relayout):
    """GraphConvolution.autotune (its argument checks, then the run) searches once: the one search
    gets the whole budget, its table is what is committed and returned (cuDNN, the example tensors
    and the search itself stubbed; an NCHW plan with relayout runs the two-layout search instead)."""
    import types

    from rawconv.cudnn.graph import autotune as A

    searches, committed = [], []
    row = types.SimpleNamespace(status="ok", name="eng0", detail="", layout="", config=None)

    def search(plan, deadline, budget_s, *rest):
        searches.append(("one", budget_s))
        return [row]

    def search_relayout(plan, t_start, budget_s, *rest):
        searches.append(("relayout", budget_s))
        return [row]
    monkeypatch.setattr(A._search, "search", search)
    monkeypatch.setattr(A._search, "search_relayout", search_relayout)
    monkeypatch.setattr(A._cuda, "refuse_in_capture", lambda what: None)
    monkeypatch.setattr(A._autotune, "keep", lambda plan, table, rec: table)

    class Plan(A.Autotune):
        problem = types.SimpleNamespace(layout="nchw" if relayout else "nhwc", is_empty=False)
        direction, activation = "forward", None

        def _check_live(self):
            pass

        def _tuning_key(self, opts, relayout):
            return None

        def _example(self, seed):
            return {}

        def _commit(self, top):
            committed.append(top)

        def _record(self, key, top):
            return None

        def _table(self, rows):
            return rows

        def _describe(self):
            return "a stubbed plan"

        def has_epilogue(self):   # a convolution alone: no "unfused:" half
            return False

        def _default_name(self):
            return None

    rows = Plan().autotune(budget_s=0.25, check=False, use_cache=False, seed_from_cache=False, progress=False,
                           relayout=relayout)
    assert searches == [("relayout" if relayout else "one", 0.25)], "exactly one search, with the whole budget"
    assert rows == [row] and committed == [row]


def test_a_config_that_cannot_be_captured_runs_its_stand_in_only_inside_a_capture(monkeypatch):
    """The capture probe's bookkeeping (cuDNN, the capture and the CUDA handle stubbed; the real run
    is in tests/test_modes_gpu.py): a selected config the probe rejects gets the first heuristic
    config the filters allow, that finalizes and that the probe accepts as its stand-in; _run
    executes the stand-in only when torch's current stream is being captured, the selected config
    on the default stream and on an uncaptured side stream; a probed config is not probed again;
    the probe is skipped inside a capture and with CAPTURE_PROBE off."""
    import contextlib
    import types

    launched = []
    state = types.SimpleNamespace(ptr="handle", stream=0)
    monkeypatch.setattr(G._cuda, "handle_state", lambda idx: state)
    monkeypatch.setattr(G._cuda, "workspace", lambda n, d: torch.empty(max(n, 1), dtype=torch.uint8))
    monkeypatch.setattr(G.B, "VariantPacker", lambda uids: lambda ptrs, ws: types.SimpleNamespace(ptr=ptrs))

    class Lib:
        def cudnnBackendExecute(self, h, plan, vp):
            launched.append(plan)
            return 0
    monkeypatch.setattr(G._cudnn, "lib", lambda: Lib())
    capturing = [False]
    monkeypatch.setattr(G._cuda, "_capturing", lambda: capturing[0])
    probed = []

    def fails(run):
        probed.append(run)
        return run()   # the stub call below returns the probe's verdict for its config
    monkeypatch.setattr(G._cuda, "capture_fails", fails)
    monkeypatch.setattr(G.torch.cuda, "device", lambda idx: contextlib.nullcontext())

    verdict = {"eng1": "simulated: invalidated", "eng2": "", "eng3": "", "eng4": ""}
    plan = G.GraphConvolution.__new__(G.GraphConvolution)
    plan.device_index, plan._dev = 0, torch.device("cpu")
    plan._graph = types.SimpleNamespace(uids=(1, 2, 3), packer=None)
    cl = torch.channels_last
    plan.problem = ConvProblem.from_torch(torch.empty(2, 4, 5, 5).contiguous(memory_format=cl),
                                          torch.empty(8, 4, 1, 1).contiguous(memory_format=cl))
    plan.direction = "backward_data"
    built = {}

    def build(ec):
        if ec.name == "eng3":
            raise NotSupportedError("does not finalize")
        return built.setdefault(ec.name, G._Built(ec, types.SimpleNamespace(ptr=ec.name), 0, {}))
    plan.build = build
    plan._example = lambda seed: {}
    plan.output = lambda: None
    plan.call_for = lambda b, t, out: (lambda: verdict[b.config.name])
    # heuristic instant: eng1 (the selected one), eng5 (filtered), eng3 (does not finalize), eng2
    plan.heuristic = lambda mode: [G.EngineConfig(i) for i in (1, 5, 3, 2, 4)] if mode == "instant" else []
    plan.allowed = lambda ec: "filtered" if ec.engine == 5 else ""
    sel = build(G.EngineConfig(1))
    plan._probe_capture(sel)
    assert sel.capture_why == "simulated: invalidated" and sel.capture_alt is built["eng2"]
    assert built["eng2"].capture_why == "" and "eng4" not in built, "the first that can, and no further"
    n = len(probed)
    plan._probe_capture(sel)
    assert len(probed) == n, "probed once"
    for stream, capture, ran in ((0, False, "eng1"), (7, False, "eng1"), (7, True, "eng2"), (0, False, "eng1")):
        state.stream, capturing[0] = stream, capture
        plan._run(sel, (10, 20, 30))
        assert launched[-1] == ran, (stream, capture, launched[-1])
    # not probed inside a capture, nor with the probe off
    other = build(G.EngineConfig(4))
    capturing[0] = True
    plan._probe_capture(other)
    capturing[0] = False
    monkeypatch.setattr(G, "CAPTURE_PROBE", False)
    plan._probe_capture(other)
    assert other.capture_why is None and other.capture_alt is None


def test_a_residual_graph_runs_its_legacy_capture_choice_only_inside_a_capture(monkeypatch):
    """The residual graphs' capture choice, its bookkeeping (cuDNN's legacy call
    (rawconv.cudnn.ResidualBiasActivation), the timing, the check and the capture stubbed; the real run is in tests/test_modes_gpu.py): after autotune
    selected a graph config, the legacy fused call becomes the capture choice only when it ran the
    example correctly, can be captured and was under 97% of the config's GPU time (a pinned name
    brings it back without timing); run() calls it only while the stream is being captured; the
    pinned name round-trips through select; none is looked for inside a capture or with the switch
    off."""
    import contextlib
    import types

    from rawconv.core import bench
    from rawconv.pytorch import fused as FU

    calls = []

    class FakeLegacy:
        def __init__(self, problem, activation, allow_tf32, algo):
            if algo != "IMPLICIT_PRECOMP_GEMM":
                raise NotSupportedError("not offered")
            self.name, self.median_ms = "legacy:" + algo, None
            self.info = types.SimpleNamespace(workspace_bytes=1024, math="tensor_op", deterministic=True)

        def call(self, t):
            calls.append("legacy")
            t["y"].fill_(1.0)

        def capture_fails(self, t):
            self.call(t)
            return verdict["capture"]

    times = {"legacy": 0.9, "graph": 1.0}
    verdict = {"ok": True, "capture": ""}
    capturing = [False]
    from rawconv import cudnn as legacy_api

    monkeypatch.setattr(legacy_api, "ResidualBiasActivation", FakeLegacy)
    monkeypatch.setattr(bench, "time_cuda_queued",
                        lambda fn, **kw: (fn(), types.SimpleNamespace(median_ms=times[calls[-1]]))[1])
    monkeypatch.setattr(FU, "_capturing_now", lambda device_index=None: capturing[0])
    monkeypatch.setattr(torch.cuda, "device", lambda idx: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    R = FU._graph_class()
    plan = R.__new__(R)
    cl = torch.channels_last
    x, w = torch.empty(2, 4, 5, 5).contiguous(memory_format=cl), torch.empty(8, 4, 1, 1).contiguous(memory_format=cl)
    plan.problem = ConvProblem.from_torch(x, w, torch.empty(8))
    plan.activation, plan.allow_tf32, plan.device_index, plan._ref_r = "relu", False, 0, None
    example = {"x": x, "w": w, "b": torch.empty(8), "r": torch.empty(2, 8, 5, 5)}
    plan._example = lambda seed: example
    plan._tune_tensors = example
    plan._selected = types.SimpleNamespace(config=types.SimpleNamespace(name="eng4{k24=2}"), capture_alt=None)
    bind = plan._bind = lambda *a: (lambda t: (t, t["y"]))({"y": torch.empty(2, 8, 5, 5)})
    plan.check_output = lambda y, config, ref, ref_abs: types.SimpleNamespace(ok=verdict["ok"] and bool((y == 1).all()))
    plan.call_for = lambda b, t, out: (lambda: calls.append("graph"))
    top = object()
    alt = FU._legacy_for_capture(plan, top)
    assert alt is not None and alt.name == "legacy:IMPLICIT_PRECOMP_GEMM" and alt.median_ms == 0.9
    for change, why in (({"legacy": 0.98}, "not 3% faster"), ({"ok": False}, "wrong"),
                        ({"capture": "simulated: invalidated"}, "cannot be captured")):
        saved = dict(times), dict(verdict)
        (times if "legacy" in change else verdict).update(change)
        assert FU._legacy_for_capture(plan, top) is None, why
        times.update(saved[0])
        verdict.update(saved[1])
    assert FU._legacy_for_capture(plan, top, algo="GEMM") is None, "an algo cuDNN does not offer"
    assert plan._ref_r is None and plan._tune_tensors is None, "the check's memory is dropped"
    # the search's filters apply to the capture choice too
    from rawconv.cudnn.graph import search as S_

    def opts(**f):
        return S_.SearchOptions(workspace_limit=f.pop("workspace_limit", None),
                                filters=dict(dict(no_tensor_cores=False), **f))
    assert FU._legacy_for_capture(plan, top, opts=opts()) is not None
    # (no_tensor_cores=None resolves as the search's default: True for this float32 plan without TF32)
    for f in (dict(workspace_limit=0), dict(no_tensor_cores=True), dict(no_tensor_cores=None),
              dict(no_reduced_precision=True)):
        assert FU._legacy_for_capture(plan, top, opts=opts(**f)) is None, f
    n = len(calls)
    assert FU._legacy_for_capture(plan, None).median_ms is None, "a pinned name: checked, not timed"
    assert "graph" not in calls[n:]
    capturing[0] = True
    assert FU._legacy_for_capture(plan, top) is None, "nothing is run inside a capture"
    capturing[0] = False
    # run(): the graph (execute) outside a capture, the legacy call inside one
    plan._capture_legacy = alt
    plan.execute = lambda *a: calls.append("graph") or "graph result"
    plan._bind = lambda x, w, b, out, gy: ({"y": torch.empty(2, 8, 5, 5)}, "legacy result")
    plan._pending_r = None
    r = torch.empty(2, 8, 5, 5)
    for capture, ran in ((False, "graph"), (True, "legacy"), (False, "graph")):
        capturing[0] = capture
        plan.run(x, w, torch.empty(8), r)
        assert calls[-1] == ran, (capture, calls[-1])
    # tensors the legacy call refuses (its checks, before cuDNN): the graph config runs in the capture
    capturing[0] = True
    refuse = FakeLegacy(None, "relu", False, "IMPLICIT_PRECOMP_GEMM")
    refuse.call = lambda t: (_ for _ in ()).throw(ArgumentError("y must not share memory"))
    plan._capture_legacy = refuse
    assert plan.run(x, w, torch.empty(8), r) == "graph result" and calls[-1] == "graph"
    plan._capture_legacy = alt
    capturing[0] = False
    plan._bind = bind
    # the pinned name: select's base config, then the capture choice looked for again
    picked = []
    monkeypatch.setattr(G.GraphConvolution, "_select", lambda self, e, warn=True, stacklevel=2: picked.append(e))
    monkeypatch.setattr(G.GraphConvolution, "_current", lambda self: plan._selected)
    plan._via = None
    plan._select("eng4{k24=2}|capture=legacy:IMPLICIT_PRECOMP_GEMM")
    assert picked[-1] == "eng4{k24=2}" and plan.capture_choice == "legacy:IMPLICIT_PRECOMP_GEMM"
    assert plan.selected_name == "eng4{k24=2}|capture=legacy:IMPLICIT_PRECOMP_GEMM"
    plan._select("eng4{k24=2}")
    assert plan.capture_choice is None and plan.selected_name == "eng4{k24=2}"
    for bad in ("eng4{k24=2}|capture=eng5", "eng4{k24=2}|capture=legacy:FOO"):
        with pytest.raises(ArgumentError, match="legacy forward algo"):
            plan._select(bad)
    monkeypatch.setattr(FU, "CAPTURE_LEGACY_RESIDUAL", False)
    plan._select("eng4{k24=2}|capture=legacy:IMPLICIT_PRECOMP_GEMM")
    assert plan.capture_choice is None, "switched off"


def test_the_legacy_residual_call_refuses_tensors_that_do_not_fit_before_calling_cudnn(monkeypatch):
    """rawconv.cudnn.ResidualBiasActivation.call (public in the cuDNN face) checks every tensor
    against its problem before cuDNN sees a pointer: shape, dtype, layout strides, device, and that
    y shares no memory with the inputs (r may be x); the constructor refuses a non-problem.
    (The device check comes first on a CPU-only machine: the shape and layout checks are reached
    here with the device check stubbed as passed.)"""
    import types

    from rawconv import cudnn as legacy_api

    with pytest.raises(ArgumentTypeError, match="ConvProblem"):
        legacy_api.ResidualBiasActivation("x(2,4,5,5)", "relu", False, "IMPLICIT_PRECOMP_GEMM")
    cl = torch.channels_last
    x, w = torch.empty(2, 4, 5, 5).contiguous(memory_format=cl), torch.empty(8, 4, 1, 1).contiguous(memory_format=cl)
    p = ConvProblem.from_torch(x, w, torch.empty(8))
    call = legacy_api.ResidualBiasActivation.__new__(legacy_api.ResidualBiasActivation)
    call.name = "legacy:IMPLICIT_PRECOMP_GEMM"
    call.plan = types.SimpleNamespace(problem=p, w_layout="nhwc", device_index=0)
    launched = []
    monkeypatch.setattr(legacy_api._cudnn, "lib", lambda: launched.append(1))
    # CPU tensors stand for the plan's device here (the device check itself: v.is_cuda, v.get_device())
    monkeypatch.setattr(legacy_api.ResidualBiasActivation, "_on_device", staticmethod(lambda v, idx: v.is_cpu))

    def good():
        return {"x": x.clone(memory_format=cl), "w": w.clone(memory_format=cl), "b": torch.empty(8),
                "r": torch.empty(2, 8, 5, 5).contiguous(memory_format=cl),
                "y": torch.empty(2, 8, 5, 5).contiguous(memory_format=cl)}
    call._check(good())   # fits
    bad = [(dict(x=torch.empty(2, 4, 5, 5)), "x must be a dense nhwc"),       # NCHW strides
           (dict(w=torch.empty(8, 4, 3, 3).contiguous(memory_format=cl)), "w must"),
           (dict(b=torch.empty(8, dtype=torch.float64)), "b must"),
           (dict(r=torch.empty(2, 8, 5, 4).contiguous(memory_format=cl)), "r must"),
           (dict(y=[1.0]), "y: a CUDA tensor expected")]
    for change, msg in bad:
        t = dict(good(), **change)
        with pytest.raises((ArgumentError, ArgumentTypeError), match=msg):
            call.call(t)
    t = good()
    t["y"] = t["r"]
    with pytest.raises(ArgumentError, match="must not share memory"):
        call.call(t)
    t = good()
    t["r"] = t["x"] = torch.empty(2, 8, 5, 5).contiguous(memory_format=cl)   # relu(conv(x) + x): both only read
    call.plan.problem = ConvProblem.from_torch(t["x"], torch.empty(8, 8, 1, 1).contiguous(memory_format=cl),
                                              torch.empty(8))
    t["w"] = torch.empty(8, 8, 1, 1).contiguous(memory_format=cl)
    call._check(t)
    with pytest.raises(ArgumentTypeError, match="dict of tensors"):
        call.call([t["x"]])
    assert not launched, "cuDNN was never reached"
