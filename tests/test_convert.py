"""rawconv.nn.convert and describe on small CNNs (BatchNorm, residual blocks, ReLU, ConvTranspose, a
reflect-padded Conv1d), checked against the original model in float64; torch.fx fusion and its
module-level fallback; autotune once per distinct problem; the ResNet-50 benchmark and the training
example at a tiny size."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import rawconv.nn as rnn
from conftest import randomize_batchnorms
from rawconv import ArgumentError, ArgumentTypeError, onednn

pytestmark = pytest.mark.usefixtures("dnnl")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Block(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.c2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        out = self.relu(self.b1(self.c1(x)))
        out = self.b2(self.c2(out))
        out += idt
        return F.relu(out)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.blocks = nn.Sequential(Block(8, 8), Block(8, 8), Block(8, 16, stride=2), Block(16, 16))
        self.up = nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1)
        self.bn_up = nn.BatchNorm2d(8)
        self.head = nn.Conv1d(8, 4, 3, padding=1, padding_mode="reflect")

    def forward(self, x):
        y = torch.relu(self.bn_up(self.up(self.blocks(self.stem(x)))))
        return self.head(y.flatten(2))


def _net(seed=0):
    torch.manual_seed(seed)
    net = Net()
    with torch.no_grad():
        randomize_batchnorms(net, seed + 1)
    return net.eval()


def _close(got, want, rel=2e-5):
    assert got.shape == want.shape, (got.shape, want.shape)
    err = (got.detach().double() - want).abs().max().item()
    assert err <= rel * max(want.abs().max().item(), 1.0), err


def _ref64(net, x):
    import copy
    with torch.no_grad():
        return copy.deepcopy(net).double()(x.double())


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("fuse", [False, True])
def test_converted_model_matches_the_original_in_float64(fuse, layout):
    net = _net()
    x = torch.randn(2, 3, 16, 16)
    if layout == "nhwc":
        x = x.to(memory_format=torch.channels_last)
    ref = _ref64(net, x)
    m = rnn.convert(net, fuse=fuse)
    rep = m.rawconv_report
    assert len(rep.swapped) == 12
    with torch.no_grad():
        _close(m(x), ref)
    # the original is untouched (inplace=False)
    assert type(net.stem[0]) is nn.Conv2d and type(net.up) is nn.ConvTranspose2d
    if not fuse:
        assert list(m.state_dict()) == list(net.state_dict())
        assert type(m.blocks[2].down[0]) is rnn.Conv2d and type(m.up) is rnn.ConvTranspose2d
        assert type(m.head) is rnn.Conv1d and m.head.padding_mode == "reflect"
        assert isinstance(m.up, nn.ConvTranspose2d)
    else:
        assert rep.traced is True
        assert len(rep.folded) == 10   # after the forward convs (bn_up, after the ConvTranspose, stays a call)
        # nothing of the model's state changed: the BatchNorms stay (folded into the snapshots only)
        assert sorted(m.state_dict()) == sorted(net.state_dict())
        called = {n.target for n in m.graph.nodes if n.op == "call_module"}
        assert {n for n in called if isinstance(m.get_submodule(n), nn.BatchNorm2d)} == {"bn_up"}
        assert rep.fused["stem.0"] == "relu"
        assert rep.fused["blocks.0.c1"] == "relu"
        assert rep.fused["blocks.0.c2"] == "add+relu"
        # the add joins whichever of its two convolutions the graph computes first
        assert sorted([rep.fused["blocks.2.down.0"], rep.fused["blocks.2.c2"]]) == ["add+relu", "bias"]
        assert rep.fused["head"] == "bias"
        assert "up" not in rep.fused and type(m.get_submodule("up")) is rnn.ConvTranspose2d
        c2 = m.get_submodule("blocks.0.c2")
        assert type(c2) is rnn.ConvBiasAct2d and c2.activation == "relu"


def test_fuse_on_a_model_already_converted_folds_and_fuses():
    """convert(model) then convert(model, fuse=True): fx keeps rawconv's conv modules as calls (it
    used to trace into them and fail on a Proxy), so BatchNorms fold and bias+ReLU fuse as on the
    torch model."""
    import warnings

    net = _net()
    x = torch.randn(2, 3, 16, 16)
    ref = _ref64(net, x)
    once = rnn.convert(net)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)      # no "torch.fx could not trace" fallback
        m = rnn.convert(once.eval(), fuse=True)
    rep = m.rawconv_report
    assert rep.traced is True and len(rep.swapped) == 12
    assert len(rep.folded) == 10 and rep.fused["stem.0"] == "relu" and rep.fused["blocks.0.c2"] == "add+relu"
    assert type(m.get_submodule("blocks.0.c1")) is rnn.ConvBiasAct2d
    assert [n.target for n in m.graph.nodes if n.op == "call_module"
            and isinstance(m.get_submodule(n.target), nn.BatchNorm2d)] == ["bn_up"]   # the others folded
    with torch.no_grad():
        _close(m(x), ref)
        _close(once(x), ref)                                 # the first conversion is untouched
    assert any(isinstance(mod, nn.BatchNorm2d) for mod in once.modules())


def test_inplace_swaps_the_given_model_and_keeps_its_parameters():
    net = _net()
    w = net.stem[0].weight
    out = rnn.convert(net, inplace=True, precision="strict", choice={"stem.0": "x64:gemm:jit"})
    assert out is net and type(net.stem[0]) is rnn.Conv2d and net.stem[0].weight is w
    assert net.stem[0].choice == "x64:gemm:jit" and net.blocks[0].c1.choice is None
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        _close(net(x), _ref64(_net(), x))


def test_bad_arguments():
    net = _net().train()
    with pytest.raises(ArgumentError, match="eval"):
        rnn.convert(net, fuse=True)
    with pytest.raises(ArgumentTypeError):
        rnn.convert("model")
    with pytest.raises(ArgumentError, match="example_input"):
        rnn.convert(_net(), autotune=True)
    with pytest.raises(ArgumentError, match="backend"):
        rnn.convert(_net(), backend="mkl")
    with pytest.raises(ArgumentError, match="autotune_budget_s"):
        rnn.convert(_net(), autotune_budget_s=0)


class Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU())
        self.b = nn.Conv2d(6, 6, 3, padding=1)

    def forward(self, x):
        y = self.a(x)
        if y.sum() > 0:      # data-dependent control flow: torch.fx cannot trace it
            y = y + self.b(y)
        return y


def test_untraceable_models_fall_back_to_module_level_fusion_and_say_so():
    torch.manual_seed(1)
    net = Untraceable()
    net.a[1].running_mean.uniform_(-0.5, 0.5)
    net.eval()
    x = torch.randn(2, 3, 8, 8)
    ref = _ref64(net, x)
    with pytest.warns(RuntimeWarning, match="could not trace"):
        m = rnn.convert(net, fuse=True)
    rep = m.rawconv_report
    assert rep.traced is False and rep.trace_error
    assert rep.fused == {"a.0": "relu"} and rep.folded == [("a.0", "a.1")]
    # the Sequential computes its run fused; its children stay (state_dict as the model's)
    assert isinstance(m.a, rnn._FusedSequential) and [type(c) for c in m.a] == [rnn.Conv2d, nn.BatchNorm2d, nn.ReLU]
    assert type(m.b) is rnn.Conv2d and sorted(m.state_dict()) == sorted(net.state_dict())
    assert [type(h) for h in m.a.fused_modules()] == [rnn.ConvBiasAct2d]
    with torch.no_grad():
        _close(m(x), ref)
    assert "module-level fusion only" in str(rep)


class Tricky(nn.Module):
    """Patterns the fusion must leave alone or handle: a shared conv, an add whose other operand
    depends on the conv, a residual that only broadcasts, relu_ as a method."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Conv2d(4, 4, 3, padding=1)
        self.c = nn.Conv2d(4, 4, 3, padding=1)
        self.d = nn.Conv2d(4, 4, 1)
        self.scale = nn.Parameter(torch.randn(4, 1, 1))

    def forward(self, x):
        a = self.shared(self.shared(x))          # two call sites: not fused
        c = self.c(a)
        b = c + c * 2                            # other operand depends on the conv: no residual fusion
        e = (self.d(b) + self.scale).relu_()     # broadcasting residual: fused, added in torch at run time
        return e


def test_fusion_leaves_unsafe_patterns_correct():
    torch.manual_seed(2)
    net = Tricky().eval()
    x = torch.randn(2, 4, 6, 6)
    ref = _ref64(net, x)
    m = rnn.convert(net, fuse=True)
    rep = m.rawconv_report
    assert "shared" not in rep.fused and type(m.get_submodule("shared")) is rnn.Conv2d
    assert rep.fused["c"] == "bias" and rep.fused["d"] == "add+relu"
    with torch.no_grad():
        _close(m(x), ref)


def test_autotune_searches_each_distinct_problem_once_and_is_warm_the_second_time():
    rnn.clear_tuning()
    net = _net()
    x = torch.randn(2, 3, 16, 16)
    ref = _ref64(net, x)
    m = rnn.convert(net, fuse=True, autotune=x, autotune_budget_s=0.05)
    tuned = m.rawconv_report.tuned
    assert len(tuned) == 12
    keys = [t["key"] for t in tuned]
    searched = [t for t in tuned if t["searched"]]
    assert len(searched) == len(set(keys)) < len(keys)   # blocks repeat problems
    pinned = rnn.pinned_choices(m)
    for t in tuned:
        assert t["backend"] == "onednn" and "@" in t["choice"]
        assert t["backward_choice"] is None and not t["backward_searched"]   # an eval model: forward only
        mod = m.get_submodule(t["name"])
        assert mod.choice is None   # the winner is pinned to its problem, not to every call of the layer
        assert [e["choice"] for e in pinned[t["name"]]["tuned"]] == [t["choice"]]
        assert pinned[t["name"]]["tuned"][0]["problem"] == t["problem"]
        assert f"choice=None, tuned={[t['choice']]!r}" in repr(mod)   # print(model) shows what was pinned
    with torch.no_grad():
        _close(m(x), ref)
    m2 = rnn.convert(net, fuse=True, autotune=x)
    assert not any(t["searched"] for t in m2.rawconv_report.tuned)
    assert [t["choice"] for t in m2.rawconv_report.tuned] == [t["choice"] for t in tuned]
    assert "12 layers" in str(m2.rawconv_report)


def test_describe_lists_every_conv_with_what_each_side_runs():
    net = _net()
    x = torch.randn(1, 3, 8, 8)
    rows = rnn.describe(net, x, iterations=2)
    assert len(rows) == 12 and rows[0].name == "stem.0" and rows[-1].name == "head"   # call order
    names = {r.name for r in rows}
    assert {"stem.0", "blocks.0.c2", "up", "head"} <= names
    offered = {i.name for i in onednn.implementations(torch.randn(1, 3, 8, 8), net.stem[0].weight, padding=1)}
    for r in rows:
        assert r.rawconv_backend == "onednn"
        assert r.rawconv_err is not None and r.rawconv_err < 1e-5
        assert r.torch_err is not None and r.torch_err < 1e-5
        assert r.rawconv_ms > 0 and r.torch_ms > 0
        assert r.torch_backend and "unknown" not in r.torch_backend
    stem = next(r for r in rows if r.name == "stem.0")
    assert stem.rawconv_runs.split("@")[0] in offered
    up = next(r for r in rows if r.name == "up")
    assert "Transpose" in up.torch_backend or "Slow" in up.torch_backend
    table = repr(rows)
    assert table.splitlines()[0].startswith("layer") and len(table.splitlines()) >= len(rows) + 3   # + legend, notes
    fused = rnn.describe(rnn.convert(net, fuse=True), x, iterations=2, timing=False)
    c2 = next(r for r in fused if r.name == "blocks.0.c2")
    assert "residual" in c2.module and "post-ops=sum+relu" in c2.rawconv_runs
    assert c2.rawconv_err < 1e-5 and c2.rawconv_ms is None
    assert "blocks.0.c2" in str(c2)


# ---------------------------------------------------------------- the benchmark and the example at a tiny size
def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_resnet50_benchmark_runs_at_a_tiny_size(capsys):
    bench = _load("benchmarks/bench_resnet50.py", "bench_resnet50")
    model, _ = bench.build_resnet50(base=64)
    assert sum(isinstance(m, nn.Conv2d) for m in model.modules()) == 53
    assert sum(p.numel() for p in model.parameters()) in (25557032,)   # ResNet-50's parameter count
    res = bench.main(["--device", "cpu", "--batch", "1", "--size", "32", "--base-width", "4", "--iterations", "2",
                      "--variants", "eager,rawconv,rawconv_channels_last,rawconv_default", "--no-autotune", "--ref64",
                      "--profile", "1"])
    rows = {r["variant"]: r for r in res["rows"]}
    assert set(rows) == {"eager", "rawconv", "rawconv_channels_last", "rawconv_default"}
    for r in rows.values():
        assert r["wall_ms"] > 0 and 0 < r["min_ms"] <= r["wall_ms"] and r["err_vs_f64"] < 1e-4
    assert rows["rawconv"]["ok"] and rows["rawconv_channels_last"]["ok"]
    out = capsys.readouterr().out
    assert "vs freezing" in out and "53 conv modules on rawconv" in out
    # the oneDNN profile: rawconv's own library's convolutions, per variant and per problem
    assert "oneDNN profile rawconv_channels_last" in out and "rawconv  convolution" in out
    assert "oneDNN ms per batch by primitive" in out


def test_training_example_losses_agree_at_a_tiny_size():
    ex = _load("examples/train_small_cnn.py", "train_small_cnn")
    res = ex.run(steps=3, batch=4, crop=16, width=4, log=lambda *a: None)
    assert set(res) == {"torch", "rawconv (first)", "rawconv (gemm)", "_worst_rel", "_warnings"}
    # timed as compare times (lockstep steps, flags from what was measured), each ratio within its steps
    assert res["rawconv (first)"]["ratio"]["lo"] <= res["rawconv (first)"]["ratio"]["value"] \
        <= res["rawconv (first)"]["ratio"]["hi"] and isinstance(res["_warnings"], list)
    assert res["_worst_rel"] <= 1e-4
    assert res["torch"]["losses"][0] > 0


# ---------------------------------------------------------------- GPU (the lead runs these on the device machine)
@pytest.mark.gpu
def test_cuda_fused_convert_matches_eager_in_fp16():
    net = _net().cuda().half().to(memory_format=torch.channels_last)
    x = torch.randn(4, 3, 32, 32, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    with torch.no_grad():
        want = net(x)
    m = rnn.convert(net, fuse=True, autotune=x, autotune_budget_s=1.0)
    assert all(t["backend"] == "cudnn" for t in m.rawconv_report.tuned)
    with torch.no_grad():
        got = m(x)
    ref = _ref64(_net(), x.float().cpu())
    _close(got.float().cpu(), ref, rel=2e-2)
    _close(want.float().cpu(), ref, rel=2e-2)
    rows = rnn.describe(m, x, iterations=3)
    assert all(r.rawconv_backend == "cudnn" for r in rows)


class LaterUse(nn.Module):
    """A fused conv's output used as a residual AND again after the add: it must not be overwritten."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(4, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 3, padding=1)
        self.c = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        ya = torch.relu(self.a(x))
        yb = torch.relu(self.b(ya) + ya)     # ya's other use (b's input) comes first: may be overwritten
        yc = torch.relu(self.c(yb) + yb)     # yb is used again below: must not be overwritten
        return yc + yb


def test_in_place_residuals_only_where_no_later_use_reads_them():
    torch.manual_seed(3)
    net = LaterUse().eval()
    x = torch.randn(2, 4, 6, 6)
    ref = _ref64(net, x)
    m = rnn.convert(net, fuse=True)
    assert m.rawconv_report.fused == {"a": "relu", "b": "add+relu", "c": "add+relu"}
    assert m.get_submodule("b").__dict__.get("residual_inplace") is True
    assert not m.get_submodule("c").__dict__.get("residual_inplace", False)
    with torch.no_grad():
        _close(m(x), ref)
    # the in-place path writes into the residual's memory, and says so by returning it
    b = m.get_submodule("b")
    r = torch.relu(torch.randn(2, 4, 6, 6))
    r_copy = r.clone()
    with torch.no_grad():
        y = b(torch.randn(2, 4, 6, 6), r)
    assert y.data_ptr() == r.data_ptr() and not torch.equal(r, r_copy)
    # the operator itself (and anything that needs gradients) stays functional
    with torch.no_grad():
        y2 = torch.ops.rawconv.conv_bias_act(torch.randn(2, 4, 6, 6), b.weight, b.bias, r_copy, [1, 1], [1, 1],
                                             [1, 1], 1, "relu", "auto", None, "strict")
    assert y2.data_ptr() != r_copy.data_ptr()


class AliasLater(nn.Module):
    """A fused conv's output used as a residual while a view of it (taken earlier) is read after."""

    def __init__(self, alias):
        super().__init__()
        self.alias = alias
        self.a = nn.Conv2d(4, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        ya = torch.relu(self.a(x))
        if self.alias == "view":
            v = ya.view(ya.shape[0], -1)
        elif self.alias == "contiguous":
            v = ya.contiguous()   # ya itself
        else:
            v = torch.chunk(ya, 2, dim=1)[1]
        yb = torch.relu(self.b(ya) + ya)
        return yb, v * 2


@pytest.mark.parametrize("alias", ["view", "contiguous", "chunk"])
@pytest.mark.parametrize("run", ["eager", "aot_eager"])
def test_a_residual_read_later_through_an_alias_is_not_overwritten(alias, run):
    torch.manual_seed(4)
    net = AliasLater(alias).eval()
    x = torch.randn(2, 4, 6, 6)
    with torch.no_grad():
        want = [t.double() for t in net(x)]
    m = rnn.convert(net, fuse=True)
    assert m.rawconv_report.fused == {"a": "relu", "b": "add+relu"}
    assert not m.get_submodule("b").__dict__.get("residual_inplace", False)
    f = m if run == "eager" else torch.compile(m, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        got = f(x)
    for g, w in zip(got, want):
        _close(g, w)


def test_autotune_records_only_its_own_threads_calls():
    """convert(autotune=x) records the convolution calls of the example's forward. Another
    thread running another converted model meanwhile must not be recorded: its layers were tuned
    and their choices re-pinned from the converting thread (and a forward that checked the
    recording list as the converting thread emptied it could fail with IndexError)."""
    import threading
    import time

    class Slow(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(4, 4, 3, padding=1)

        def forward(self, x):
            y = self.c(x)
            time.sleep(0.3)   # the other thread's forwards run meanwhile
            return self.c(y)

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 1))
    other = rnn.convert(plain)
    xo = torch.randn(1, 3, 9, 9)
    want_other = _ref64(plain, xo)
    stop, errors, runs = threading.Event(), [], [0]

    def run_other():
        try:
            while not stop.is_set():
                with torch.no_grad():
                    _close(other(xo), want_other)
                runs[0] += 1
        except BaseException as exc:   # noqa: BLE001 - reported below
            errors.append(exc)
    t = threading.Thread(target=run_other)
    t.start()
    try:
        rnn.clear_tuning()
        net = Slow()
        x = torch.randn(2, 4, 8, 8)
        m = rnn.convert(net, autotune=x, autotune_budget_s=0.05)
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors
    assert runs[0] > 0, "the other thread never ran during the recording"
    assert [r["name"] for r in m.rawconv_report.tuned] == ["c"]
    assert [mod.choice for mod in other] == [None, None], "another thread's model was re-pinned"
    assert not rnn._RECORDING
    with torch.no_grad():
        _close(m(x), _ref64(net, x))


def test_autotune_on_a_model_whose_forward_raises_says_so_and_changes_nothing():
    """The example's forward raising is the model's (or the example's) doing: an ArgumentError
    that says so, the original exception chained, no recording left behind, the given model
    unchanged (inplace=False); a rawconv error inside the forward passes as it is."""
    class Boom(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(4, 4, 3)

        def forward(self, x):
            self.c(x)
            raise ValueError("the model's own check failed")

    net = Boom()
    with pytest.raises(ArgumentError, match="forward on the example input raised ValueError: the model's own") as info:
        rnn.convert(net, autotune=torch.randn(2, 4, 8, 8))
    assert isinstance(info.value.__cause__, ValueError)
    assert type(net.c) is nn.Conv2d and not rnn._RECORDING
    seq = nn.Sequential(nn.Conv2d(4, 4, 3))
    with pytest.raises(ArgumentError, match="input channels"):   # rawconv's own message, not rewrapped
        rnn.convert(seq, autotune=torch.randn(2, 5, 8, 8))
    assert type(seq[0]) is nn.Conv2d and not rnn._RECORDING


def test_autotune_example_forward_leaves_the_model_and_the_rng_as_they_were():
    """convert(autotune=x) runs the model once on the example to record its convolutions. On a
    training-mode model that forward updated every BatchNorm's running statistics and count (the
    converted model then computed something else than the original in eval mode) and drew from
    torch's generator (dropout): both are restored."""
    import copy

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.5),
                        nn.Conv2d(8, 4, 1))
    orig = copy.deepcopy(net)
    x = torch.randn(2, 3, 8, 8)
    rng = torch.random.get_rng_state()
    for inplace in (False, True):
        rnn.clear_tuning()
        before = {k: v.clone() for k, v in net.state_dict().items()}
        m = rnn.convert(net, autotune=x, autotune_budget_s=0.05, inplace=inplace)
        assert torch.equal(torch.random.get_rng_state(), rng), "the example's dropout drew from torch's generator"
        for k, v in m.state_dict().items():
            assert torch.equal(v, before[k]), k
        assert int(m[1].num_batches_tracked) == 0 and m.rawconv_report.tuned
    with torch.no_grad():
        _close(m.eval()(x), _ref64(orig.eval(), x))


def test_describe_checks_fused_residual_layers_on_the_inputs_the_model_saw():
    """describe() on a fused model whose residual layer writes into its residual (residual_inplace):
    the captured inputs are copies and every checked call gets its own residual, so torch's and
    rawconv's errors against float64 are both tiny, with and without timing (they read 1.4e-1 and
    1.9 for torch before: the residual had been overwritten by the model's own call)."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(4, 8, 3, padding=1)
            self.b = torch.nn.Conv2d(8, 8, 3, padding=1)
            self.c = torch.nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x):
            h = torch.relu(self.a(x))
            return torch.relu(self.c(torch.relu(self.b(h))) + h)

    torch.manual_seed(0)
    m = rnn.convert(M().eval(), fuse=True)
    assert m.c.__dict__.get("residual_inplace"), "the case under test: the residual layer writes in place"
    x = torch.randn(2, 4, 12, 12)
    for timing in (False, True):
        rows = rnn.describe(m, x, timing=timing, iterations=2)
        assert len(rows) == 3
        for r in rows:
            assert r.rawconv_err < 1e-5 and r.torch_err < 1e-5, (r.name, r.rawconv_err, r.torch_err)
    text = str(rows)
    assert "x: torch ms / rawconv ms" in text and "post-ops=sum+relu" in text


def test_convert_says_busy_machine_timings_once(monkeypatch):
    """On a busy machine each search warns (rawconv.bench.TimingWarning); convert(autotune=) says it
    once, summed up, and keeps every search's text in the report (a 6-conv model printed 6 two-line
    warnings before)."""
    import warnings

    from rawconv import onednn
    from rawconv.bench import TimingWarning

    real = onednn.Convolution.autotune

    def noisy(self, *a, **k):
        warnings.warn("timings of this search: machine oversubscribed", TimingWarning)
        return real(self, *a, **k)
    monkeypatch.setattr(onednn.Convolution, "autotune", noisy)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1))
    x = torch.randn(1, 3, 10, 10)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        m = rnn.convert(model.eval(), autotune=x, autotune_budget_s=0.05)
    timing = [w for w in said if issubclass(w.category, TimingWarning)]
    n = len(m.rawconv_report.timing_warnings)
    assert n >= 3, "one per search at least (3 distinct problems)"
    assert len(timing) == 1 and f"{n} of the searches" in str(timing[0].message), [str(w.message) for w in said]


def test_convert_leaves_parametrized_weights_state_alone():
    # breaker D2: convert, pinned_choices and .to() computed a parametrized conv's .weight (its
    # parametrization's forward) outside forward; spectral_norm's runs a power iteration per
    # computation in training mode, so converting changed _u/_v and the outputs
    import torch.nn.utils.parametrize as P
    from torch.nn.utils.parametrizations import spectral_norm

    import rawconv.nn

    calls = []

    class Count(torch.nn.Module):
        def forward(self, w):
            calls.append(1)
            return w

    m = torch.nn.Conv2d(4, 4, 3)
    P.register_parametrization(m, "weight", Count())   # (torch checks it once here)
    calls.clear()
    r = rawconv.nn.convert(m)
    rawconv.nn.pinned_choices(torch.nn.Sequential(r))
    r.to("cpu")
    assert calls == []
    r(torch.randn(1, 4, 8, 8))
    assert len(calls) == 1   # as torch's forward

    torch.manual_seed(0)
    a = torch.nn.Sequential(spectral_norm(torch.nn.Conv2d(8, 8, 3, padding=1)), torch.nn.ReLU(),
                            spectral_norm(torch.nn.ConvTranspose2d(8, 4, 3, padding=1)))   # train mode
    before = {k: v.clone() for k, v in a.state_dict().items()}
    b = rawconv.nn.convert(a)
    rawconv.nn.pinned_choices(b)
    b.to("cpu")
    for k, v in b.state_dict().items():
        assert torch.equal(v, before[k]), k
    x = torch.randn(2, 8, 12, 12)
    for _ in range(2):   # each forward: one power iteration in both
        ya, yb = a(x), b(x)
        assert torch.allclose(ya, yb, rtol=1e-4, atol=1e-5)
    a.eval(), b.eval()
    assert torch.allclose(a(x), b(x), rtol=1e-4, atol=1e-5)
