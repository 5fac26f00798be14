"""The pieces of the CUDA plans' forward hot paths that need no GPU (issue 15, "the cost of a
pinned call"): the out= overlap test on data pointers (rawconv.cudnn._cuda.out_overlaps) against
rawconv.core.guard's check on the tensors, the tensor pack (rawconv.cudnn._cuda.HotArgs), the legacy
function form's fast-path key (rawconv.cudnn._forward_key), and the operator's CUDA cache keeping
the backends apart."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from rawconv import cudnn, ops
from rawconv.cudnn import _cuda
from rawconv.core import guard as _guard
from rawconv.core.plans import PlanCache
from rawconv.errors import ArgumentError


def _overlaps_by_guard(out, inputs) -> bool:
    try:
        _guard.check_no_overlap(out, [(str(i), t) for i, t in enumerate(inputs)])
    except ArgumentError:
        return True
    return False


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12), st.integers(1, 3)), min_size=4, max_size=4),
       st.booleans())
def test_out_overlaps_agrees_with_the_guard(views, no_bias):
    """Views (offset, size, stride) of one buffer as x, w, bias and out: the pointer test says what
    rawconv.core.guard.check_no_overlap says of the tensors (no bias: pointer 0, extent 0)."""
    buf = torch.zeros(100)
    ts = [buf.as_strided((n,), (s,), off) for off, n, s in views]
    if no_bias:
        ts[2] = None
    ptrs = tuple(0 if t is None else t.data_ptr() for t in ts)
    ext = tuple(0 if t is None else _guard.extent(t) for t in ts)
    assert _cuda.out_overlaps(ptrs, ext) == _overlaps_by_guard(ts[3], ts[:3])


@pytest.mark.parametrize("ptrs, ext, want", [
    ((0, 100, 0, 200), (100, 50, 0, 40), False),     # disjoint
    ((0, 100, 0, 100), (100, 50, 0, 40), True),      # out starts where w starts
    ((0, 100, 0, 60), (100, 50, 0, 40), True),       # out straddles x's end
    ((0, 100, 0, 150), (100, 50, 0, 40), False),     # out starts where w ends (touching is not sharing)
    ((0, 100, 0, 40), (100, 50, 0, 0), False),       # an empty out shares nothing
    ((0, 100, 300, 310), (100, 50, 20, 10), True),   # out inside the bias
])
def test_out_overlaps_cases(ptrs, ext, want):
    assert _cuda.out_overlaps(ptrs, ext) is want


def test_hot_args_refuses_subclasses_and_cpu_tensors():
    class Sub(torch.Tensor):
        pass

    x, w, y = torch.randn(1, 2, 4, 4), torch.randn(3, 2, 3, 3), torch.empty(1, 3, 2, 2)
    assert _cuda.HotArgs.of(x.as_subclass(Sub), w, None, y, 0) is None
    assert _cuda.HotArgs.of(x, w, torch.randn(3).as_subclass(Sub), y, 0) is None
    h = _cuda.HotArgs.of(x, w, None, y, 0)
    assert h is not None and h.b is None and h.ext == (x.numel() * 4, w.numel() * 4, 0, y.numel() * 4)
    assert h.x == (x.shape, x.stride()) and h.y_strides == y.stride()
    # a pack of cuda:0: CPU tensors of the same metadata never bind (the checked path says why)
    assert h.bind(x, w, None, None) is None
    assert h.bind(x, w, None, y) is None
    assert h.bind("not a tensor", w, None, None) is None


def test_legacy_forward_key_tells_apart_what_python_finds_equal():
    """rawconv.cudnn.forward reuses a plan by this key without validating again: arguments its
    checks would refuse (padding=True, 1.0) must not meet the key of an accepted one (padding=1)."""
    x, w = torch.randn(1, 2, 4, 4), torch.randn(3, 2, 3, 3)

    def key(**kw):
        a = dict(stride=1, padding=1, dilation=1, groups=1, algo=None, math=None, deterministic=False,
                 workspace_limit=None, activation=None)
        a.update(kw)
        return cudnn._forward_key(x, w, None, *a.values())

    assert key() == key() and hash(key()) == hash(key())
    base = key()
    for kw in ({"padding": True}, {"padding": 1.0}, {"stride": True}, {"stride": 1.0}, {"groups": True},
               {"groups": 1.0}, {"dilation": True}, {"dilation": (1, 1)}, {"math": "fma"}, {"activation": "relu"}):
        assert key(**kw) != base, kw
    # equal in Python, not to the checks: a bool where an int is taken, an int for False
    assert key(algo=True) != key(algo=1) and key(workspace_limit=True) != key(workspace_limit=1)
    assert key(deterministic=0) != key(deterministic=False)
    assert key(padding=[1, 1]) != key(padding=(1, 1))   # a list is keyed too (it hashes as arg_key's)
    assert key(padding=[1, 1]) == key(padding=[1, 1])
    assert key(padding={"a": 1}) is None                # does not hash: the checked path each call
    assert cudnn._forward_key(x, w, torch.randn(3), *[1, 1, 1, 1, None, None, False, None, None]) != base
    with pytest.raises(AttributeError):
        cudnn._forward_key("x", w, None, 1, 1, 1, 1, None, None, False, None, None)


def test_the_operator_cuda_cache_keys_on_the_backend(monkeypatch):
    """ops._cuda_last holds legacy and graph plans: the same arguments on the two backends must
    not meet (each would run the other's plan). CPU tensors reach the CUDA kernel's checks and
    are refused, after the cache was asked."""
    class Recorder(PlanCache):
        def __init__(self):
            super().__init__()
            self.keys = []

        def get(self, key):
            self.keys.append(key)
            return None

    rec = Recorder()
    monkeypatch.setattr(ops, "_cuda_last", rec)
    x, w = torch.randn(1, 2, 4, 4), torch.randn(3, 2, 3, 3)
    for backend in ("cudnn", "cudnn_graph", "cudnn"):
        with pytest.raises(ArgumentError, match="CUDA tensors"):
            ops._forward_cuda(x, w, None, [1, 1], [1, 1], [1, 1], [1, 1], 1, backend, "", "strict", "", "")
    assert len(rec.keys) == 3 and rec.keys[0] == rec.keys[2] and rec.keys[0] != rec.keys[1]


def _stub_plan(unbatched: bool):
    """What _Hot.of / _GraphHot.of read of a plan, without a GPU."""
    import types

    from rawconv.problem import ConvProblem

    p = ConvProblem(n=1, c=2, k=3, in_spatial=(4, 4), kernel=(3, 3), unbatched=unbatched)
    d = object()
    return types.SimpleNamespace(
        problem=p, direction="forward", device_index=0, _descs={}, _ws=object(), inner=types.SimpleNamespace(n=1),
        descriptors=lambda n: (d, d, d, d), _alpha=None, _beta0=None, activation=None,
        _graph=types.SimpleNamespace(roles=("x", "w", "y")), _x=None, _w=None, _b=None)


@pytest.mark.parametrize("unbatched", [False, True])
def test_no_hot_pack_for_an_unbatched_problem(cudnn_lib, unbatched):
    """An unbatched plan takes an x with its batch dim of 1 as it is, and its checked path then
    returns y without that dim: a pack made from such a call would return the (1, K, ...) y on
    every later call. So neither CUDA plan makes a pack for an unbatched problem (the checked
    path each call, as with an unbatched x); a batched one gets its pack."""
    from rawconv import cudnn_graph

    plan = _stub_plan(unbatched)
    x, w, y = torch.randn(1, 2, 4, 4), torch.randn(3, 2, 3, 3), torch.empty(1, 3, 2, 2)
    info = cudnn.RunInfo("forward", "IMPLICIT_GEMM", 0, "fma", "fma", 0, True, None)
    legacy = cudnn._Hot.of(plan, info, None, x, w, None, y)
    graph = cudnn_graph._GraphHot.of(plan, None, {"x": x, "w": w, "y": y}, x, w, None, None)
    assert (legacy is None) is unbatched and (graph is None) is unbatched


def _stub_grad_plan(direction: str, unbatched: bool = False):
    """What _Hot.of_grad reads of a legacy backward plan, without a GPU."""
    plan = _stub_plan(unbatched)
    plan.direction = direction
    return plan


@pytest.mark.parametrize("direction, fn", [("backward_data", "cudnnConvolutionBackwardData"),
                                           ("backward_weights", "cudnnConvolutionBackwardFilter")])
def test_legacy_backward_pack(cudnn_lib, direction, fn):
    """The legacy plan's backward pack (issue 38): the direction's cuDNN call, the inputs' and the
    output's metadata as the checked call passed them; none for an unbatched problem (its checked
    path returns dx without the batch dim); CPU tensors of the same metadata never run it."""
    info = cudnn.RunInfo(direction, "ALGO_0", 0, "fma", "fma", 0, True, None)
    a, b, out = torch.randn(1, 3, 2, 2), torch.randn(3, 2, 3, 3), torch.empty(1, 2, 4, 4)
    assert cudnn._Hot.of_grad(_stub_grad_plan(direction, True), info, None, a, b, out) is None
    plan = _stub_grad_plan(direction)
    h = cudnn._Hot.of_grad(plan, info, None, a, b, out)
    assert h is not None and h.name == fn and h.data is (direction == "backward_data")
    assert h.args.x == (a.shape, a.stride()) and h.args.w == (b.shape, b.stride()) and h.args.b is None
    assert h.args.y_shape == out.shape and h.stream is None   # no workspace: any stream
    plan._info, plan._freed = info, False
    assert h.current(plan)
    assert h.run_grad(plan, a, b) is None   # a pack of cuda:0: the checked path says why


class _FakeLegacyPlan:
    """A legacy plan as ops' CUDA backward kernels use it: execute (the checked call) and _hot_call."""

    def __init__(self, result):
        self.result, self.executed, self.hot = result, 0, []

    def execute(self, x=None, w=None, bias=None, out=None, *, grad_y=None, return_info=False):
        self.executed += 1
        return self.result

    def _hot_call(self, a, b, bias):
        self.hot.append((a, b, bias))
        return self.result.clone()


@pytest.mark.parametrize("direction", ["backward_data", "backward_weights"])
def test_operator_keeps_the_legacy_backward_plan(monkeypatch, direction):
    """ops' CUDA backward kernels on backend 'cudnn' keep the legacy plan of their checked call and
    run its hot path (_hot_call) on the next call with the same arguments (issue 38; before, every
    call took rawconv.cudnn's checked function form). CPU tensors, the plan stubbed."""
    ops.clear_cache()
    x, w, gy = torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3), torch.randn(2, 4, 5, 5)
    res = torch.randn(2, 3, 5, 5) if direction == "backward_data" else torch.randn(4, 3, 3, 3)
    fake = _FakeLegacyPlan(res)
    made = []
    monkeypatch.setattr(cudnn, "grad_problem", lambda *a, **k: made.append(a) or ops.ConvProblem.from_torch(
        x, w, None, 1, 1, 1, 1))
    monkeypatch.setattr(cudnn, "cached_plan", lambda *a, **k: fake)
    one = [1, 1]
    if direction == "backward_data":
        def call():
            return ops._backward_data_cuda(gy, w, list(x.shape), one, one, one, one, 1, "cudnn", "", "strict")
    else:
        def call():
            return ops._backward_weights_cuda(x, gy, list(w.shape), one, one, one, one, 1, False, "cudnn", "",
                                              "strict")[0]
    first = call()
    assert fake.executed == 1 and not fake.hot and len(made) == 1 and torch.equal(first, res)
    second = call()
    assert fake.executed == 1 and len(made) == 1, "the second call took the checked path again"
    a, b = (gy, w) if direction == "backward_data" else (x, gy)
    assert len(fake.hot) == 1 and fake.hot[0][0] is a and fake.hot[0][1] is b and fake.hot[0][2] is None
    assert torch.equal(second, res)
    ops.clear_cache()
