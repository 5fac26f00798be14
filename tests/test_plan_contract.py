"""The plan contract (issue 35): every plan class satisfies :class:`rawconv.core.backend.Plan`, a
backend's plans are reached through :meth:`Backend.plan_for`, and a backend registered from outside
the package (a fake one here, on torch's own convolution) appears in ``compare``, ``rawconv list``,
``rawconv info``, the operators (``rawconv.ops.conv``, ``torch.ops.rawconv.conv_*``), the modules
and ``rawconv.nn.convert`` without a line changed elsewhere."""
from __future__ import annotations

import io
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from rawconv import ConvProblem
from rawconv.core import backend
from rawconv.core.backend import Backend, Candidate, Plan, contract_gaps


def _plan_classes():
    from rawconv.cudnn import Convolution as Legacy
    from rawconv.cudnn.graph import GraphConvolution
    from rawconv.onednn import Convolution
    from rawconv.onednn.fused import FusedConvolution

    return [Convolution, FusedConvolution, Legacy, GraphConvolution]


def _problem(**kw):
    return ConvProblem(**{**dict(n=2, c=3, k=4, in_spatial=(7, 6), kernel=(3, 3), pad_before=(1, 1),
                                 pad_after=(1, 1)), **kw})


@pytest.mark.parametrize("cls", _plan_classes(), ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_every_plan_class_satisfies_the_contract(cls):
    assert contract_gaps(cls) == []


def test_contract_gaps_names_what_is_missing():
    class Half:
        problem = direction = None

        def candidates(self):
            return []

        def select(self, which):   # no choice=
            return which

        def execute(self, x=None, w=None, bias=None, out=None, *, grad_y=None):
            return x

        def free(self):
            pass

    gaps = contract_gaps(Half)
    assert "select() takes no choice=" in gaps and "select() requires ['which']" in gaps
    for missing in ("hot_run", "autotune", "tuning_key", "__enter__"):
        assert f"no method {missing}()" in gaps
    assert "no selected property" in gaps
    assert not isinstance(Half(), Plan)


@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_weights"])
def test_onednn_plan_through_plan_for(direction):
    """The registry's entry makes a plan that is a Plan; hot_run gives execute's result (against
    float64), and tuning_key() is the key autotune stores its choice under."""
    p = _problem(has_bias=direction == "forward")
    be = backend.get("onednn")
    alias = {"forward": "fwd", "backward_data": "bwd_d", "backward_weights": "backward_filter"}[direction]
    plan = be.plan_for(p, alias, {"precision": "strict"})
    with plan:
        assert isinstance(plan, Plan) and plan.direction == direction
        torch.manual_seed(0)
        x, w = torch.randn(p.x_shape), torch.randn(p.w_shape)
        b = torch.randn(p.k) if p.has_bias else None
        dy = torch.randn(p.y_shape)
        xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
        y = F.conv2d(xd, wd, None if b is None else b.double(), padding=1)
        if direction == "forward":
            a, bb, ref = x, w, y.detach()
        elif direction == "backward_data":
            a, bb, ref = dy, w, torch.autograd.grad(y, xd, dy.double())[0]
        else:
            a, bb, ref = x, dy, torch.autograd.grad(y, wd, dy.double())[0]
        for _ in range(3):   # the first call checks; the next ones may take the hot path
            got = plan.hot_run(a, bb, b) if direction == "forward" else plan.hot_run(a, bb)
            got = got[0] if isinstance(got, tuple) else got
            assert (got.double() - ref).abs().max().item() < 1e-4 * max(1.0, ref.abs().max().item())
        rows = plan.autotune(iterations=1, warmup=0, use_cache=False)
        assert rows.record.key == plan.tuning_key() == plan.tuning_record.key
        assert plan.selected.choice == rows[0].impl.choice


# ---------------------------------------------------------------------------- a fake backend
@dataclass(repr=False)
class FakeCandidate(Candidate):
    backend = "fake"
    direction: str
    name: str
    workspace_bytes: int = 0
    known_bad: str = ""

    @property
    def choice(self) -> str:
        return self.name

    @property
    def notes(self) -> tuple:
        return {"fake:torch": ("torch's own",), "fake:fast": ("torch's own, timed faster",)}.get(self.name,
                                                                                               ("off by one",))

    def __str__(self) -> str:
        return self.name


# the fake timing hook's milliseconds: "fake:wrong" the fastest (the driver's check must refuse it),
# then "fake:fast" (the one an autotune selects), then the default "fake:torch"
FAKE_MS = {"fake:torch": 3.0, "fake:fast": 1.0, "fake:wrong": 0.5}
TIMED: list = []   # (direction, candidate) of every call of the fake's timing hook


class FakePlan:
    """Torch's convolution behind the plan contract; ``"fake:wrong"`` adds 1 (compare must catch
    it). Its timing hook (:class:`rawconv.core.autotune.Tunable`) reports :data:`FAKE_MS`, so its
    ``autotune`` (the one driver, :func:`rawconv.core.autotune.drive`) selects ``"fake:fast"``."""

    def __init__(self, problem, direction, options, choice):
        self.problem, self.direction, self.options = problem, direction, options
        self._choice = choice or "fake:torch"
        self.tuning_record = None

    def candidates(self):
        return [FakeCandidate(self.direction, n) for n in ("fake:torch", "fake:fast", "fake:wrong")]

    def time_candidate(self, candidate, call, *, budget_s=None):
        from rawconv.core.autotune import Timing

        assert self._choice == candidate.choice   # the driver selected it first
        self.execute(**call)
        TIMED.append((self.direction, candidate.choice))
        return Timing(FAKE_MS[candidate.choice], FAKE_MS[candidate.choice] * 0.9, 1)

    def select(self, which=None, *, choice=None):
        self._choice = choice or which or "fake:torch"
        return self.selected

    @property
    def selected(self):
        return FakeCandidate(self.direction, self._choice)

    def execute(self, x=None, w=None, bias=None, out=None, *, grad_y=None):
        pad = self.problem.pad_before
        if self.direction == "forward":
            y = F.conv2d(x, w, bias, self.problem.stride, pad)
        elif self.direction == "backward_data":
            y = torch.ops.aten.convolution_backward(grad_y, grad_y.new_empty(self.problem.x_shape), w, None,
                                                    self.problem.stride, pad, (1, 1), False, (0, 0), 1,
                                                    (True, False, False))[0]
        else:
            y = torch.ops.aten.convolution_backward(grad_y, x, x.new_empty(self.problem.w_shape), None,
                                                    self.problem.stride, pad, (1, 1), False, (0, 0), 1,
                                                    (False, True, False))[1]
        return y + 1 if self._choice == "fake:wrong" else y

    def hot_run(self, a, b, bias=None, out=None):
        if self.direction == "forward":
            return self.execute(a, b, bias)
        return self.execute(grad_y=a, w=b) if self.direction == "backward_data" else self.execute(a, grad_y=b)

    def autotune(self, *, budget_s=None, use_cache=None, progress=None):
        from rawconv.core import autotune

        return autotune.drive(self, budget_s, use_cache=use_cache, progress=progress)

    def tuning_key(self):
        from rawconv import tuning

        return tuning.TuningKey.for_backend("fake", self.problem, self.direction, dict(self.options.as_dict()),
                                            environment={"library": "torch (fake)", "library_version": torch.__version__,
                                                         "device": "cpu", "device_arch": ""})

    def free(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()


def _fake_backend(name="fake", device_type="cpu"):
    return Backend(name, device_type, __name__, "torch (fake)",
                   lambda problem, direction="forward", options=None: FakePlan(problem, direction, options,
                                                                               None).candidates(),
                   lambda problem, direction, options, choice: FakePlan(problem, direction, options, choice),
                   lambda: {"version": torch.__version__, "library": "torch's own convolution"},
                   "a backend made in a test", choice_names=r"fake:[a-z]+")


@pytest.fixture
def fake(monkeypatch):
    backend.backends()   # the built-in ones first: the fake comes after them
    be = _fake_backend()
    monkeypatch.setitem(backend._registry, "fake", be)
    return be


def test_fake_backend_satisfies_the_contract(fake):
    assert contract_gaps(FakePlan) == []
    assert fake in backend.backends("cpu") and backend.get("fake") is fake
    assert isinstance(fake.plan_for(_problem(), "forward"), Plan)
    assert "fake" in [b.name for b in backend.backends_naming("fake:torch")]


@pytest.mark.parametrize("direction", ["forward", "backward_weights"])
def test_fake_backend_in_compare(fake, direction):
    """compare's default backends are torch and every registered one: the fake's candidates get
    rows through the plan contract, checked against float64 (its wrong candidate is caught)."""
    from rawconv.compare import compare_problem

    rows = compare_problem(_problem(), iterations=2, warmup=0, direction=direction, include_ref=False,
                           prepack=False, confirm_rounds=0)
    mine = {r.name: r for r in rows if r.backend == "fake"}
    assert set(mine) == {"fake:torch", "fake:fast", "fake:wrong"}
    assert mine["fake:torch"].status == "ok" and mine["fake:torch"].median_ms > 0
    assert mine["fake:wrong"].status == "wrong"
    assert any(r.backend == "onednn" and r.status == "ok" for r in rows)   # the built-in ones as before
    assert mine["fake:torch"].extra["library"] == "torch (fake)"


def test_fake_backend_in_list_and_info(fake, capsys):
    from rawconv.explore import cli, info

    assert cli.main(["list", "--input", "2x3x7x6", "--weight", "4x3x3x3", "--padding", "1", "--device", "cpu",
                     "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert "on fake (torch (fake)):" in out and "fake:torch" in out and "fake:wrong" in out
    assert "x64:gemm:jit" in out or "jit:" in out   # oneDNN's table as before
    collected = info.collect()
    assert collected["fake"]["library"] == "torch's own convolution" and "fake" in collected["backends"]["fake"]



def _float64_grads(x, w, b, gy, padding, stride=1):
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    bd = None if b is None else b.detach().double().requires_grad_()
    y = F.conv2d(xd, wd, bd, stride, padding)
    return (y.detach(), *torch.autograd.grad(y, [t for t in (xd, wd, bd) if t is not None], gy.double()))


def _close(got, ref):
    assert got.shape == ref.shape
    assert (got.double() - ref).abs().max().item() < 1e-4 * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_fake_backend_in_the_operators(fake, layout):
    """``backend="fake"`` in rawconv.ops.conv and the operators: the fake's plans (made by
    plan_for, run through the contract's hot_run) give y and the gradients (against float64), in
    torch's layouts; its choice names select its candidates (the wrong one is run, not replaced)."""
    import rawconv.ops as ops

    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 6, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    if layout == "nhwc":
        x = x.detach().to(memory_format=torch.channels_last).requires_grad_()
    for _ in range(2):   # the second call takes the kernels' cached plans (their fast paths)
        y = ops.conv(x, w, b, padding=1, backend="fake")
        gy = torch.randn_like(y)
        gx, gw, gb = torch.autograd.grad(y, (x, w, b), gy)
        ref = _float64_grads(x, w, b, gy, 1)
        for got, r in zip((y, gx, gw, gb), ref):
            _close(got, r)
        assert y.is_contiguous(memory_format=torch.channels_last) == (layout == "nhwc")
        assert gx.is_contiguous(memory_format=torch.channels_last) == (layout == "nhwc")
    with torch.no_grad():
        wrong = ops.conv(x, w, None, padding=1, backend="fake", choice="fake:wrong")
        _close(wrong - 1, ref[0] - b.detach().double().view(1, -1, 1, 1))
        y0 = torch.ops.rawconv.conv_forward(x, w, None, [1, 1], [1, 1], [1, 1], [1, 1], 1, "fake", "", "strict",
                                            "", "")
        _close(y0, ref[0] - b.detach().double().view(1, -1, 1, 1))
        dx = torch.ops.rawconv.conv_backward_data(gy, w, list(x.shape), [1, 1], [1, 1], [1, 1], [1, 1], 1, "fake",
                                                  "", "strict")
        _close(dx, ref[1])
        dw, db = torch.ops.rawconv.conv_backward_weights(x, gy, list(w.shape), [1, 1], [1, 1], [1, 1], [1, 1], 1,
                                                         True, "fake", "", "strict")
        _close(dw, ref[2])
        _close(db, ref[3])
        # unbatched, as torch's
        yu = ops.conv(x[0], w, b, padding=1, backend="fake")
        _close(yu, ref[0][0])
    from rawconv.core.errors import ArgumentError

    with pytest.raises(ArgumentError, match="fake"):   # a name no backend is registered under names those there are
        ops.conv(x, w, padding=1, backend="fakes")


def test_fake_backend_in_modules_and_convert(fake):
    """``rawconv.nn.Conv2d(..., backend="fake")`` and ``rawconv.nn.convert(model, backend="fake")``:
    the layers run the fake's plans (its wrong choice shows), trained through its backward plans."""
    import rawconv.nn as rnn
    from rawconv.core.errors import ArgumentError

    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 6)
    conv = rnn.Conv2d(3, 4, 3, padding=1, backend="fake")
    assert conv.backend == "fake"
    ref = F.conv2d(x.double(), conv.weight.double(), conv.bias.double(), padding=1)
    _close(conv(x).detach(), ref)
    conv.choice = "fake:wrong"
    _close(conv(x).detach() - 1, ref)
    conv.to("cpu")
    assert conv.backend == "fake"   # a move to its own device keeps it
    with pytest.raises(ArgumentError, match="fake"):
        rnn.Conv2d(3, 4, 3, backend="nope")

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))
    expect = model(x)
    conv_model = rnn.convert(model, backend="fake")
    layers = [m for m in conv_model.modules() if isinstance(m, rnn.Conv2d)]
    assert len(layers) == 2 and all(m.backend == "fake" for m in layers)
    xr = x.clone().requires_grad_()
    out = conv_model(xr)
    _close(out.detach(), expect.detach().double())
    out.sum().backward()
    xe = x.clone().requires_grad_()
    model(xe).sum().backward()
    _close(xr.grad, xe.grad.double())
    _close(layers[0].weight.grad, model[0].weight.grad.double())
    layers[1].choice = "fake:wrong"   # the converted layers run the fake's plans, not torch's
    with torch.no_grad():
        _close(conv_model(x) - 1, expect.detach().double())


# ---------------------------------------------------------------------------- the one autotune driver
def _driver_record(record, choice):
    assert record is not None and record.choice == choice
    assert record.detail["driver"] == "rawconv.core.autotune.drive"
    assert record.error is not None and record.error["ratio"] <= 1.0   # checked against float64


@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_weights"])
def test_fake_backend_autotuned_by_the_driver(fake, direction, fresh_tuning_cache):
    """The fake plan's ``autotune`` is :func:`rawconv.core.autotune.drive`: every candidate run
    and checked against float64, the correct ones timed by the fake's hook, the one it times
    fastest selected ("fake:wrong", timed faster still, is caught by the check and never timed),
    its record stored in the tuning cache under the plan's key."""
    from rawconv import tuning
    from rawconv.core import autotune

    TIMED.clear()
    plan = fake.plan_for(_problem(), direction)
    assert isinstance(plan, autotune.Tunable) and plan.selected.choice == "fake:torch"
    table = plan.autotune(budget_s=30.0, use_cache=False)
    assert plan.selected.choice == "fake:fast"
    assert [(r.name, r.status) for r in table] == [("fake:fast", "ok"), ("fake:torch", "ok"), ("fake:wrong", "wrong")]
    assert table[0].median_ms == FAKE_MS["fake:fast"] and table[1].median_ms == FAKE_MS["fake:torch"]
    assert sorted(TIMED) == [(direction, "fake:fast"), (direction, "fake:torch")]   # (fake:torch not close: once)
    _driver_record(plan.tuning_record, "fake:fast")
    assert tuning.cache().get(plan.tuning_key()) == plan.tuning_record
    # a budget is one number: seconds of wall time; a bad one raises before anything runs
    from rawconv.core.errors import ArgumentError, ArgumentTypeError

    with pytest.raises(ArgumentError, match="budget"):
        autotune.drive(plan, 0)
    with pytest.raises(ArgumentTypeError, match="budget"):
        autotune.drive(plan, "1s")
    with pytest.raises(ArgumentTypeError, match="time_candidate"):
        autotune.drive(object(), 1.0)


def test_fake_backend_autotuned_in_convert_and_the_operators(fake, fresh_tuning_cache):
    """``convert(model, backend="fake", autotune=x)`` (forward and both backward passes) and the
    operators' ``choice="fastest"`` autotune the fake's plans by the driver, with nothing outside
    this file naming it: the report and the layers' pins hold the choice its timing makes fastest,
    and the tuned layers still compute the convolution (against float64)."""
    import rawconv.nn as rnn
    import rawconv.ops as ops

    TIMED.clear()
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 6)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))
    expect = model(x)
    tuned = rnn.convert(model, backend="fake", autotune=x, autotune_budget_s=30.0, autotune_backward=True)
    report = tuned.rawconv_report
    assert [t["choice"] for t in report.tuned] == ["fake:fast", "fake:fast"]
    assert all(t["searched"] and t["backend"] == "fake" and t["median_ms"] == FAKE_MS["fake:fast"]
               for t in report.tuned)
    assert all(t["directions"] == {"forward": "fake:fast", "backward_data": "fake:fast",
                                   "backward_weights": "fake:fast"} for t in report.tuned)
    assert {d for d, _c in TIMED} == {"forward", "backward_data", "backward_weights"}
    pins = rnn.pinned_choices(tuned)
    assert [p["choice"] for p in pins.values()] == ["fake:fast", "fake:fast"]
    _close(tuned(x).detach(), expect.detach().double())

    TIMED.clear()
    w, b = torch.randn(4, 3, 3, 3), torch.randn(4)
    with torch.no_grad():
        y = ops.conv(x, w, b, padding=1, backend="fake", choice="fastest")
    _close(y, F.conv2d(x.double(), w.double(), b.double(), padding=1))
    assert TIMED and {c for _d, c in TIMED} == {"fake:fast", "fake:torch"}


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cudnn", "cudnn_graph"])
def test_cuda_plans_through_plan_for(name):
    """cuDNN's two plans made by the registry's entry: Plans whose hot_run gives the convolution
    (against float64, strict fp32) and whose tuning_key() is the key autotune stores under."""
    p = _problem(device="cuda")
    plan = backend.get(name).plan_for(p, "forward", {"precision": "strict"})
    with plan:
        assert isinstance(plan, Plan) and contract_gaps(type(plan)) == []
        torch.manual_seed(0)
        x, w = torch.randn(p.x_shape, device="cuda"), torch.randn(p.w_shape, device="cuda")
        ref = F.conv2d(x.double(), w.double(), padding=1)
        for _ in range(3):   # the first call checks; the next ones may take the hot path
            y = plan.hot_run(x, w)
            assert (y.double() - ref).abs().max().item() < 1e-3 * ref.abs().max().item()
        if name == "cudnn":
            plan.autotune(iterations=2, warmup=1, use_cache=False, budget_s=5.0)
        else:
            plan.autotune(budget_s=2.0, use_cache=False, seed_from_cache=False)
        assert plan.tuning_record.key == plan.tuning_key()
        assert plan.selected is not None


@pytest.mark.gpu
def test_fake_cuda_backend_in_the_operators_and_modules(monkeypatch):
    """A registered backend of CUDA tensors runs as ``backend="<its name>"`` through the CUDA
    kernels (checked path, then the kept plan's hot form) and a module: y and the gradients
    against float64, in torch's layouts."""
    import rawconv.nn as rnn
    import rawconv.ops as ops

    backend.backends()
    monkeypatch.setitem(backend._registry, "fake_cuda", _fake_backend("fake_cuda", "cuda"))
    torch.manual_seed(0)
    for cl in (False, True):
        x = torch.randn(2, 3, 7, 6, device="cuda")
        if cl:
            x = x.to(memory_format=torch.channels_last)
        x.requires_grad_()
        w = torch.randn(4, 3, 3, 3, device="cuda", requires_grad=True)
        b = torch.randn(4, device="cuda", requires_grad=True)
        for _ in range(2):
            y = ops.conv(x, w, b, padding=1, backend="fake_cuda")
            gy = torch.randn_like(y)
            got = (y, *torch.autograd.grad(y, (x, w, b), gy))
            for g, r in zip(got, _float64_grads(x, w, b, gy, 1)):
                assert (g.double() - r).abs().max().item() < 1e-3 * max(1.0, r.abs().max().item())
            assert y.is_contiguous(memory_format=torch.channels_last) == cl
    conv = rnn.Conv2d(3, 4, 3, padding=1, backend="fake_cuda").cuda()
    assert conv.backend == "fake_cuda"
    xx = torch.randn(2, 3, 7, 6, device="cuda")
    ref = F.conv2d(xx.double(), conv.weight.double(), conv.bias.double(), padding=1)
    assert (conv(xx).double() - ref).abs().max().item() < 1e-3 * ref.abs().max().item()
    with pytest.raises(Exception, match="fake_cuda"):   # CPU tensors on a CUDA backend: a clear error
        ops.conv(xx.cpu(), conv.weight.detach().cpu(), padding=1, backend="fake_cuda")
