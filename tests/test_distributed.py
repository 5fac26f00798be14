"""rawconv.distributed: one tuning decision shared by every rank under torch.distributed, and cuDNN
plans on the right device.

CPU (CI): two processes on the gloo backend (oneDNN): both strategies pin the same choices on
every rank, the consistency table matches, a choice changed on one rank is reported, an
environment difference is refused (or warned), differing problems and a failed search raise on
every rank; the DDP example's losses equal a single-process run within its tolerance. Pure parts
(assignment, table, argument checks, the cuDNN device guard and the plan's device check on fake
CUDA tensors) run in this process. GPU variants are marked ``gpu``; the two-GPU ones skip unless
``torch.cuda.device_count() >= 2``.

The two-process runs start fresh interpreters (``python this_file.py --spawn``, then
``torch.multiprocessing.spawn``) so that this process keeps no process group and its thread count.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import warnings

import pytest
import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "ddp_small_cnn.py")


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    return env


# ---------------------------------------------------------------------------- the two-rank scenario
def _tiny(seed: int = 0) -> nn.Module:
    """3 convolutions, 2 distinct problems (layers 2 and 4 share one)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1))


def _rel_err(model, ref_model, x) -> float:
    with torch.no_grad():
        y = model(x).double()
        ref = ref_model(x.double())
    return ((y - ref).abs().max() / ref.abs().max()).item()


def _api_scenarios(rank: int, world: int) -> None:
    """Every scenario on this rank of an initialized process group (collectives in the same order
    on both ranks); what happened goes to ``$RAWCONV_TEST_DIST_OUT/rank<N>.json``. Run by the
    DDP example's workers before their training (its ``hook``)."""
    import rawconv.distributed as rd
    import rawconv.nn as rnn
    from rawconv.bench import TimingWarning
    from rawconv.errors import ArgumentError
    from rawconv.tuning import TuningEnvironmentError

    warnings.simplefilter("ignore", TimingWarning)
    out: dict = {"rank": rank}
    try:
        model = _tiny()
        ref64 = copy.deepcopy(model).double()
        x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1))

        for strategy in ("one", "split"):
            rnn.clear_tuning()                  # both strategies search (no process memo)
            m = rd.convert(model, x, strategy=strategy)
            rep = m.rawconv_distributed
            table = rd.check_consistent(m)
            out[strategy] = {"choices": rnn.pinned_choices(m), "tuned_by": [p["tuned_by"] for p in rep.problems],
                             "problem_layers": [p["layers"] for p in rep.problems],
                             "searched_here": [t["name"] for t in m.rawconv_report.tuned if t["searched"]],
                             "records": [r.to_dict() for r in rep.records], "shared_s": rep.shared_s,
                             "tune_s": rep.tune_s, "full_autotune_s": rep.full_autotune_s,
                             "table": table.rows(), "consistent": table.consistent, "table_text": str(table),
                             "report_text": str(rep), "rel_err": _rel_err(m, ref64, x),
                             "original_untouched": all(type(c) is nn.Conv2d for c in model if isinstance(c, nn.Conv2d))}
        m = rd.convert(model, x, strategy="one")   # memo: nothing searched, same choices
        out["memo"] = {"choices": rnn.pinned_choices(m),
                       "searched": [p["searched"] for p in m.rawconv_distributed.problems]}

        # a deliberately different choice on rank 1
        if rank == 1:
            old = rnn.pinned_choices(m)["2"]["choice"]
            rnn.pin_choices(m, {"2": "x64:gemm:jit@any" if old != "x64:gemm:jit@any" else "ref:any@any"})
        table = rd.check_consistent(m)
        out["perturbed"] = {"consistent": table.consistent, "differing": table.differing, "rows": table.rows(),
                            "text": str(table)}
        try:
            rd.check_consistent(m, raise_on_mismatch=True)
        except rd.InconsistentChoicesError as exc:
            out["perturbed"]["raised"] = str(exc)

        # rank 1 pretends another oneDNN ISA
        real = rd.environment
        if rank == 1:
            rd.environment = lambda backend, device=None: dict(real(backend, device), device_arch="avx2_pretend")
        try:
            rd.convert(model, x)
        except TuningEnvironmentError as exc:
            out["env_error"] = {"message": str(exc), "differences": [list(d) for d in exc.differences]}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.simplefilter("ignore", TimingWarning)
            m = rd.convert(model, x, environment="warn")
        out["env_warn"] = {"warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
                           "choices": rnn.pinned_choices(m)}
        rd.environment = real

        # another batch size on rank 1
        xb = x if rank == 0 else torch.randn(3, 3, 12, 12)
        try:
            rd.convert(model, xb)
        except ArgumentError as exc:
            out["shape_error"] = str(exc)

        # the search fails on the tuning rank
        rnn.clear_tuning()
        real_tune = rnn._tune_one
        if rank == 0:
            def boom(*a, **k):
                raise RuntimeError("injected failure")
            rnn._tune_one = boom
        try:
            rd.convert(model, x)
        except rd.DistributedTuningError as exc:
            out["tune_error"] = {"message": str(exc), "failures": [list(f) for f in exc.failures]}
        rnn._tune_one = real_tune
    finally:
        with open(os.path.join(os.environ["RAWCONV_TEST_DIST_OUT"], f"rank{rank}.json"), "w") as f:
            json.dump(out, f)


def _spawn_main(outdir: str) -> None:
    """The DDP example's run (2 ranks, gloo, 1 thread each, strategy split, 3 steps, then the
    single-process reference) with :func:`_api_scenarios` first in its process group; its
    results go to ``outdir/example.json``. One set of fresh interpreters for all the two-rank
    tests."""
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    import ddp_small_cnn as ex

    os.environ["RAWCONV_TEST_DIST_OUT"] = outdir
    res = ex.run(ex.options(steps=3, strategy="split"), hook=_api_scenarios)
    ex.report(res)                       # what the command line prints
    with open(os.path.join(outdir, "example.json"), "w") as f:
        json.dump(res, f)


@pytest.fixture(scope="module")
def two_ranks(dnnl):
    """``(both ranks' outcomes of _api_scenarios, the DDP example's results)``."""
    with tempfile.TemporaryDirectory() as outdir:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--spawn", outdir], env=_env(),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"the two-rank run failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        out = []
        for rank in range(2):
            with open(os.path.join(outdir, f"rank{rank}.json")) as f:
                out.append(json.load(f))
        with open(os.path.join(outdir, "example.json")) as f:
            example = json.load(f)
    return out, example


@pytest.mark.parametrize("strategy", ["one", "split"])
def test_every_rank_pins_the_same_choices(two_ranks, strategy):
    r0, r1 = (r[strategy] for r in two_ranks[0])
    assert set(r0["choices"]) == {"0", "2", "4"}
    assert r0["choices"] == r1["choices"]
    assert all(c["choice"] for c in r0["choices"].values()), r0["choices"]   # every layer pinned
    assert r0["choices"]["2"]["choice"] == r0["choices"]["4"]["choice"]      # one problem, one choice
    assert r0["problem_layers"] == [["0"], ["2", "4"]]
    for r in (r0, r1):
        assert r["consistent"], r["table_text"]
        assert r["rel_err"] < 1e-5, r["rel_err"]           # the pinned model against float64 torch
        assert r["original_untouched"]
        assert r["table"] == r0["table"]                   # every rank computed the same table
        assert [row["rank 0"] for row in r["table"]] == [r0["choices"][n]["choice"] for n in ("0", "2", "4")]
        assert len(r["shared_s"]) == 2 and all(s > 0 for s in r["shared_s"])
        assert r["full_autotune_s"] == pytest.approx(sum(r["tune_s"]))
    if strategy == "one":
        assert r0["tuned_by"] == [0, 0]
        assert r0["searched_here"] == ["0", "2"] and r1["searched_here"] == []
        assert r1["tune_s"][1] == 0.0
    else:   # the larger problem (layer 2/4: 8 input channels) goes first, to rank 0; then rank 1
        assert r0["tuned_by"] == [1, 0]
        assert r0["searched_here"] == ["2"] and r1["searched_here"] == ["0"]
        assert r0["tune_s"][0] > 0 and r0["tune_s"][1] > 0


def test_records_carry_the_environment_and_the_choice(two_ranks):
    from rawconv.distributed import environment
    from rawconv.tuning import TuningRecord

    r0 = two_ranks[0][0]["one"]
    recs = [TuningRecord.from_dict(d) for d in r0["records"]]
    assert [r.choice for r in recs] == [r0["choices"][n]["choice"] for n in ("0", "2")]
    here = environment("onednn")
    for r in recs:
        assert r.key.backend == "onednn" and r.key.direction == "forward"
        assert r.key.library == "oneDNN" and r.key.device == "cpu"
        assert r.check_environment(current=here) == []          # made on this machine, same oneDNN
        assert r.median_ms is not None and r.median_ms > 0
        assert r.key.problem["device"] == "cpu"


def test_the_process_memo_keeps_the_shared_choices(two_ranks):
    for r in two_ranks[0]:
        assert r["memo"]["choices"] == two_ranks[0][0]["split"]["choices"]   # split searched last
        assert r["memo"]["searched"] == [False, False]


def test_a_different_choice_on_one_rank_is_reported(two_ranks):
    for r in two_ranks[0]:
        p = r["perturbed"]
        assert not p["consistent"]
        assert p["differing"] == ["2"]
        row = {x["layer"]: x for x in p["rows"]}
        assert row["2"]["differs"] and not row["0"]["differs"] and not row["4"]["differs"]
        assert row["2"]["rank 0"] != row["2"]["rank 1"]
        assert row["2"]["rank 1"] in ("x64:gemm:jit@any", "ref:any@any")
        assert "DIFFERS" in p["text"] and "INCONSISTENT" in p["text"]
        assert "['2']" in p["raised"]                         # raise_on_mismatch raised on both ranks


def test_an_environment_difference_is_refused_on_every_rank_or_warned(two_ranks):
    for r in two_ranks[0]:
        err = r["env_error"]
        assert "device_arch" in err["message"] and "avx2_pretend" in err["message"]
        assert "rank 1" in err["message"]
        assert any(d[0] == "device_arch" and d[2] == "avx2_pretend" for d in err["differences"])
        assert any("avx2_pretend" in w for w in r["env_warn"]["warnings"])
        assert r["env_warn"]["choices"] == two_ranks[0][0]["env_warn"]["choices"]


def test_different_problems_on_the_ranks_raise_on_every_rank(two_ranks):
    for r in two_ranks[0]:
        assert "layer 0" in r["shape_error"] and "rank 1" in r["shape_error"]
        assert "'n': 2" in r["shape_error"] and "'n': 3" in r["shape_error"]


def test_a_failed_search_raises_on_every_rank(two_ranks):
    for r in two_ranks[0]:
        assert "injected failure" in r["tune_error"]["message"]
        assert r["tune_error"]["failures"][0][0] == 0           # rank 0 searched and failed


# ---------------------------------------------------------------------------- the DDP example
def _check_example(res: dict, steps: int) -> None:
    r0, r1 = res["ranks"]
    assert r0["choices"] == r1["choices"] and res["same_choices"]
    assert all(c["choice"] for c in r0["choices"].values()), r0["choices"]   # every layer pinned
    assert len(r0["choices"]) == 5
    assert r0["consistent"] and r1["consistent"] and r0["table"] == r1["table"]   # also through DDP, after training
    assert len(res["steps"]) == steps
    for row in res["steps"]:   # the tolerance: float32 rounding of reductions in another order
        assert abs(row["ddp"] - row["single"]) <= res["rtol"] * abs(row["single"]), row
    assert res["ok"]


def test_ddp_example_matches_a_single_process_run(two_ranks):
    res = two_ranks[1]
    _check_example(res, 3)
    r0 = res["ranks"][0]
    assert r0["backend"] == "gloo" and r0["device"] == "cpu"
    # the same choices, pinned by name there (every problem) and by problem here ("tuned")
    assert {n: dict(c, tuned=None) for n, c in res["single"]["choices"].items()} == \
        {n: dict(c, tuned=None) for n, c in r0["choices"].items()} and not res["single"]["notes"]
    assert all(len(c["tuned"]) == 1 for c in r0["choices"].values())
    assert res["steps"][0]["rel_diff"] <= 1e-6                  # before any update: the mean's rounding only
    tuned_by = {p["tuned_by"] for p in r0["report"]["problems"]}
    assert tuned_by == {0, 1}                                   # split: both ranks searched


# ---------------------------------------------------------------------------- this process: pure parts
def test_convert_refuses_bad_arguments_before_any_collective():
    import rawconv.distributed as rd
    from rawconv.errors import ArgumentError, ArgumentTypeError

    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(ArgumentError, match="strategy"):
        rd.convert(_tiny(), x, strategy="all")
    with pytest.raises(ArgumentError, match="environment"):
        rd.convert(_tiny(), x, environment="ignore")
    with pytest.raises(ArgumentError, match="autotune"):
        rd.convert(_tiny(), x, autotune=x)
    with pytest.raises(ArgumentTypeError, match="model"):
        rd.convert("model", x)
    if not torch.distributed.is_initialized():
        with pytest.raises(ArgumentError, match="init_process_group"):
            rd.convert(_tiny(), x)
        with pytest.raises(ArgumentError, match="init_process_group"):
            rd.check_consistent(_tiny())


def test_split_deals_the_largest_problems_first_to_the_least_loaded_rank():
    from rawconv.distributed import _assign

    probs = [("a", 10), ("b", 100), ("c", 60), ("d", 50), ("e", 5)]
    # b (100) -> 0; c (60) -> 1; d (50) -> 1 (60 < 100); a (10) -> 0 (100 < 110); e: 110 = 110 -> 0
    assert _assign(probs, 2, "split", 0) == [0, 0, 1, 1, 0]
    # b -> 0; c -> 1; d -> 2; a -> 2 (50); e -> 1 (60 = 60, the lower rank)
    assert _assign(probs, 3, "split", 0) == [2, 0, 1, 2, 1]
    assert _assign(probs, 2, "one", 1) == [1] * 5
    assert _assign(probs, 1, "split", 0) == [0] * 5


def test_consistency_table_flags_missing_and_differing_layers():
    from rawconv.distributed import ConsistencyTable, _label

    a = {"module": "Conv2d", "backend": "onednn", "choice": "jit:avx2@any", "backward_choice": None,
         "precision": "strict"}
    b = dict(a, choice="x64:gemm:jit@any")
    pinned = {("c1", 0): a, ("c1", 1): a, ("c2", 0): a, ("c2", 1): b, ("c3", 0): a}
    cells = {(n, r): _label(pinned[(n, r)], False) if (n, r) in pinned else "(missing)"
             for n in ("c1", "c2", "c3") for r in (0, 1)}
    t = ConsistencyTable([0, 1], ["c1", "c2", "c3"], cells, pinned)
    assert t.differing == ["c2", "c3"] and not t.consistent
    text = str(t)
    assert "(missing)" in text and text.count("<- DIFFERS") == 2
    assert _label(dict(a, choice=None, precision="tf32", backward_choice="x"), True) == \
        "onednn:(default) bwd=x precision=tf32"


def test_pin_choices_and_pinned_choices():
    import rawconv.nn as rnn
    from rawconv.errors import ArgumentError

    m = rnn.convert(_tiny())
    rnn.pin_choices(m, {"2": "x64:gemm:jit@any"})
    got = rnn.pinned_choices(m)
    assert list(got) == ["0", "2", "4"]
    assert got["2"]["choice"] == "x64:gemm:jit@any" and got["0"]["choice"] is None
    assert got["2"]["backend"] == "onednn" and got["2"]["module"] == "Conv2d"
    with pytest.raises(ArgumentError, match="not rawconv convolution modules"):
        rnn.pin_choices(m, {"1": "x"})          # the ReLU
    x = torch.randn(1, 3, 8, 8)
    ref = copy.deepcopy(_tiny()).double()
    assert _rel_err(m, ref, x) < 1e-5          # the pinned implementation runs and is right


# ---------------------------------------------------------------------------- cuDNN devices, without a GPU
def test_a_plan_refuses_tensors_of_another_device_naming_both():
    """check_plan_tensor on fake CUDA tensors (torch's FakeTensorMode: no GPU needed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from rawconv import ConvProblem
    from rawconv.cudnn import _cuda
    from rawconv.errors import ArgumentError

    p = ConvProblem(2, 4, 8, (6, 6), (3, 3), device="cuda:0")
    with FakeTensorMode():
        x1 = torch.empty(p.x_shape, device="cuda:1")
        x0 = torch.empty(p.x_shape, device="cuda:0")
    with pytest.raises(ArgumentError, match=r"x must be on cuda:0 for this plan, got cuda:1"):
        _cuda.check_plan_tensor(p, x1, "x", p.x_shape, 0, ("x",))
    assert _cuda.check_plan_tensor(p, x0, "x", p.x_shape, 0, ("x",)) is x0
    with pytest.raises(ArgumentError, match="use rawconv.onednn for CPU tensors"):
        _cuda.check_plan_tensor(p, torch.empty(p.x_shape), "x", p.x_shape, 0, ("x",))


def test_plan_methods_run_with_the_plan_device_current(monkeypatch):
    """The guard sets the plan's device around the call when another is current, restores it,
    and does nothing when it already is (torch's device calls faked: no GPU here)."""
    from rawconv.cudnn import _cuda

    state = {"current": 0, "entered": []}

    class FakeGuard:
        def __init__(self, idx):
            self.idx = idx

        def __enter__(self):
            state["entered"].append(self.idx)
            self.prev, state["current"] = state["current"], self.idx

        def __exit__(self, *exc):
            state["current"] = self.prev

    monkeypatch.setattr(_cuda, "_get_device", lambda: state["current"])
    monkeypatch.setattr(torch.cuda, "device", FakeGuard)

    class Plan:
        def __init__(self, idx):
            self.device_index = idx

        @_cuda.on_plan_device
        def execute(self, v):
            return v, state["current"]

    assert Plan(1).execute("a") == ("a", 1)           # ran on device 1
    assert state["current"] == 0 and state["entered"] == [1]   # and 0 is current again
    assert Plan(0).execute("b") == ("b", 0)
    assert state["entered"] == [1]                     # no guard when the device is current

    def no_driver():
        raise RuntimeError("Found no NVIDIA driver")
    monkeypatch.setattr(_cuda, "_get_device", no_driver)

    class PlanWithoutDriver(Plan):   # the guard reads torch's functions when it decorates
        @_cuda.on_plan_device
        def execute(self, v):
            return v, state["current"]

    assert PlanWithoutDriver(1).execute("c") == ("c", 0)   # no driver: the method runs as it is (cuDNN says why)
    assert state["entered"] == [1]


def test_the_cudnn_plans_are_guarded():
    from rawconv import cudnn, cudnn_graph

    for cls, names in ((cudnn.Convolution, ("_choose", "algorithms", "execute", "autotune")),
                       (cudnn_graph.GraphConvolution, ("heuristic", "engine_info", "build", "engines", "execute",
                                                       "autotune"))):
        for n in names:
            fn = getattr(cls, n)
            if getattr(fn, "__rawconv_public__", False):   # rawconv.core.guard's error wrapper sits outside
                fn = fn.__wrapped__
            assert fn.__code__.co_name == "guarded", f"{cls.__name__}.{n} is not device-guarded"
    assert cudnn_graph.GraphConvolution.__call__ is cudnn_graph.GraphConvolution.execute


# ---------------------------------------------------------------------------- GPU
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices "
                              f"(torch sees {torch.cuda.device_count()})")


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("api", ["legacy", "graph"])
def test_cuda1_tensors_run_on_device_1_handle_and_stream(api):
    """cuda:1 tensors while cuda:0 is current: device 1's handle, on torch's current stream of
    device 1 (a side stream too), right against float64; cuda:0 current again after."""
    from rawconv import cudnn, cudnn_graph
    from rawconv.cudnn import _cuda

    torch.cuda.set_device(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 10, 10, generator=g)
    w = torch.randn(16, 8, 3, 3, generator=g)
    ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    fn = cudnn.forward if api == "legacy" else cudnn_graph.forward
    x1, w1 = x.to("cuda:1"), w.to("cuda:1")
    torch.cuda.set_device(0)
    results = [fn(x1, w1, padding=1)]                    # torch's default stream of device 1
    assert _cuda.current_stream_of_handle(1) == torch.cuda.current_stream(1).cuda_stream
    assert torch.cuda.current_device() == 0
    side = torch.cuda.Stream(device=1)
    side.wait_stream(torch.cuda.current_stream(1))   # x1, w1 were made on the default stream
    with torch.cuda.stream(side):     # makes cuda:1 current and side its current stream ...
        torch.cuda.set_device(0)      # ... cuda:0 current again; side stays cuda:1's current stream
        assert torch.cuda.current_stream(1) == side
        results.append(fn(x1, w1, padding=1))
        assert _cuda.current_stream_of_handle(1) == side.cuda_stream
        assert torch.cuda.current_device() == 0
    side.synchronize()
    torch.cuda.synchronize(1)
    for y in results:
        assert y.device == torch.device("cuda", 1)
        err = ((y.double().cpu() - ref).abs().max() / ref.abs().max()).item()
        assert err < 1e-5, err


@pytest.mark.gpu
@two_gpus
def test_a_cuda0_plan_refuses_cuda1_tensors():
    from rawconv import cudnn_graph
    from rawconv.errors import ArgumentError

    x = torch.randn(2, 8, 10, 10, device="cuda:0")
    w = torch.randn(16, 8, 3, 3, device="cuda:0")
    with cudnn_graph.GraphConvolution(x, w, padding=1) as plan:
        with pytest.raises(ArgumentError, match=r"cuda:0 for this plan, got cuda:1"):
            plan.execute(x.to("cuda:1"), w.to("cuda:1"))


def _example(tmp_path, *args, timeout=600) -> dict:
    out = tmp_path / "ddp.json"
    r = subprocess.run([sys.executable, EXAMPLE, "--json", str(out), *args], env=_env(), capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    print(r.stdout)
    return json.loads(out.read_text())


@pytest.mark.gpu
def test_ddp_example_two_processes_share_one_gpu(tmp_path):
    """Single GPU: both ranks on cuda:0 with gloo (NCCL refuses two ranks on one GPU)."""
    res = _example(tmp_path, "--device", "cuda", "--steps", "3", "--backend", "gloo", "--measure-independent")
    r0, r1 = res["ranks"]
    assert r0["device"] == r1["device"] == "cuda:0" and r0["backend"] == "gloo"
    _check_example(res, 3)


@pytest.mark.gpu
@two_gpus
def test_ddp_example_one_gpu_per_rank_with_nccl(tmp_path):
    res = _example(tmp_path, "--device", "cuda", "--steps", "3", "--strategy", "split", "--measure-independent")
    r0, r1 = res["ranks"]
    assert (r0["device"], r1["device"], r0["backend"]) == ("cuda:0", "cuda:1", "nccl")
    _check_example(res, 3)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--spawn":
        _spawn_main(sys.argv[2])
    else:
        sys.exit(f"usage: {sys.argv[0]} --spawn OUTDIR (used by the tests)")
