"""A oneDNN plan's thread count (``threads=``): "auto" runs problems of fewer than 2**17 FLOPs on one
OpenMP thread (listing, primitive creation and every call), an int fixes the count, None takes the
caller's; the caller's count is restored after each call, results stay right for every count, and the
tuning key records the count."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rawconv import fused, onednn
from rawconv.onednn import _ffi as _dnnl
from rawconv.errors import ArgumentError, ArgumentTypeError

pytestmark = [pytest.mark.filterwarnings("ignore::rawconv.errors.SlowReferenceWarning"),
              pytest.mark.skipif(_dnnl.omp_thread_controls() is None,
                                 reason="this libdnnl is not an OpenMP build: its thread count is not set per plan")]


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _omp():
    return _dnnl.omp_thread_controls()[0]()


def _spy(plan):
    """The OpenMP count in force at each dnnl_primitive_execute of the plan's selected primitive."""
    built = plan._build(plan.selected.index)
    seen = []
    real = built._execute

    def execute(prim, stream, n, args):
        seen.append(_omp())
        return real(prim, stream, n, args)

    built._execute = execute
    return seen


def _spy_omp(monkeypatch, name):
    """The OpenMP count in force at each call of ``rawconv.onednn._ffi.<name>`` (patched for the test)."""
    seen = []
    real = getattr(onednn._dnnl, name)

    def spy(*args):
        seen.append(_omp())
        return real(*args)

    monkeypatch.setattr(onednn._dnnl, name, spy)
    return seen


TINY = (torch.randn(1, 8, 8, 8), torch.randn(8, 8, 3, 3))          # 74 kFLOP
LARGER = (torch.randn(2, 16, 20, 20), torch.randn(24, 16, 3, 3))    # 5.5 MFLOP


def test_auto_resolves_by_the_problems_flops():
    assert onednn.Convolution(*TINY, padding=1).threads == 1
    assert onednn.Convolution(*LARGER, padding=1).threads is None
    assert onednn.Convolution(*TINY, padding=1, threads=None).threads is None
    assert onednn.Convolution(*LARGER, padding=1, threads=3).threads == 3
    p = onednn.Convolution.from_problem(onednn.Convolution(*TINY, padding=1).problem, direction="backward_weights")
    assert p.threads == 1
    assert "threads=1" in repr(onednn.Convolution(*TINY, padding=1))
    assert "threads=caller's" in repr(onednn.Convolution(*LARGER, padding=1))


@pytest.mark.parametrize("bad, exc", [(0, ArgumentError), (-2, ArgumentError), (2**31, ArgumentError),
                                      (10**30, ArgumentError), (True, ArgumentTypeError),
                                      (2.0, ArgumentTypeError), ("many", ArgumentTypeError)])
def test_bad_threads_raise_before_any_c_call(bad, exc, monkeypatch):
    def no_c(*a, **k):
        raise AssertionError("a C call was made")

    monkeypatch.setattr(onednn._dnnl, "call", no_c)
    with pytest.raises(exc, match="threads"):
        onednn.Convolution(*TINY, padding=1, threads=bad)
    with pytest.raises(exc, match="threads"):
        fused.FusedConvolution(*TINY, padding=1, threads=bad)


def test_a_one_thread_plan_runs_on_one_thread_and_restores_the_callers_count(threads):
    torch.set_num_threads(2)
    x, w = TINY
    plan = onednn.Convolution(x, w, padding=1, prepack=True)
    plan.execute(x)
    seen = _spy(plan)
    for _ in range(3):
        y = plan.execute(x)
        assert _omp() == 2 and torch.get_num_threads() == 2
    assert len(seen) >= 3 and set(seen) == {1}   # the primitive and its reorders
    torch.testing.assert_close(y, F.conv2d(x.double(), w.double(), None, 1, 1).float(), rtol=1e-4, atol=1e-4)
    caller = onednn.Convolution(x, w, padding=1, threads=None)
    caller.execute(x)
    seen = _spy(caller)
    caller.execute(x)
    assert 2 in seen   # the convolution primitive (its small reorders run on one thread)


def test_the_implementations_are_listed_under_the_plans_count(threads, monkeypatch):
    torch.set_num_threads(2)
    seen = _spy_omp(monkeypatch, "pd_clone")
    onednn.Convolution(*TINY, padding=1).implementations
    assert seen and set(seen) == {1}
    seen.clear()
    onednn.Convolution(*LARGER, padding=1, threads=3).implementations
    assert seen and set(seen) == {3}
    assert _omp() == 2


@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_weights"])
def test_every_count_gives_the_float64_answer(direction, threads):
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 16, 20, 20, generator=g)
    w = torch.randn(24, 16, 3, 3, generator=g)
    dy = torch.randn(2, 24, 20, 20, generator=g)
    xd, wd, dyd = x.double(), w.double(), dy.double()
    if direction == "forward":
        ref = F.conv2d(xd, wd, None, 1, 1)
    else:
        gx, gw, _ = torch.ops.aten.convolution_backward(dyd, xd, wd, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                        [True, True, False])
        ref = gx if direction == "backward_data" else gw
    for n in (1, 3, None, "auto"):
        plan = onednn.Convolution.from_problem(onednn.Convolution(x, w, padding=1).problem, direction=direction,
                                               threads=n)
        if direction == "forward":
            out = plan.execute(x, w)
        elif direction == "backward_data":
            out = plan.execute(grad_y=dy, w=w)
        else:
            out = plan.execute(x, grad_y=dy)
        out = out[0] if isinstance(out, tuple) else out
        torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-3 * ref.abs().max().item())
        assert _omp() == 2


def test_a_fused_one_thread_plan_with_a_residual(threads):
    torch.set_num_threads(2)
    x, w = TINY
    b = torch.randn(8)
    r = torch.randn(1, 8, 8, 8)
    plan = fused.FusedConvolution(x, w, b, padding=1, residual=True)
    assert plan.threads == 1
    y = plan.run(x, w, b, r)
    ref = torch.relu(F.conv2d(x.double(), w.double(), b.double(), 1, 1) + r.double()).float()
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)
    assert _omp() == 2


def test_the_tuning_key_records_the_plans_count(threads):
    torch.set_num_threads(2)
    fixed = onednn.Convolution(*LARGER, padding=1, threads=3)._tuning_key(False)
    caller = onednn.Convolution(*LARGER, padding=1)._tuning_key(False)
    tiny = onednn.Convolution(*TINY, padding=1)._tuning_key(False)
    assert fixed.options["threads"] == 3
    assert caller.options["threads"] == 2
    assert tiny.options["threads"] == 1


def test_an_isolated_search_records_the_count_its_child_timed_with(threads):
    # a caller's-count plan timed in a child of isolate={"threads": 1} ran there on one thread: its
    # record says so (it said the parent's count), and a later search under that count finds it
    from rawconv import tuning

    torch.set_num_threads(2)
    plan = onednn.Convolution(*LARGER, padding=1)
    assert plan.threads is None
    iso = {"threads": 1, "timeout_s": 60}
    plan.autotune(iterations=1, warmup=0, isolate=iso, use_cache=False)
    assert plan.tuning_record.key.options["threads"] == 1
    assert tuning.cache().get(plan._tuning_key(False, 1)) == plan.tuning_record
    assert plan._tuning_key(False).options["threads"] == 2   # not isolated: this thread's count


def test_replay_runs_on_the_count_the_record_was_tuned_with(threads):
    # a record tuned on 3 threads replays on 3 (it replayed on the caller's count: another thread
    # partition, and bitwise other backward-weights results), a small problem's on 1, fused too
    from rawconv import tuning

    torch.set_num_threads(2)
    x, w = LARGER
    for plan in (onednn.Convolution(x, w, padding=1, threads=3),
                 fused.FusedConvolution(x, w, torch.randn(24), padding=1, activation="relu", threads=3),
                 onednn.Convolution(*TINY, padding=1)):
        plan.autotune(iterations=1, warmup=0, use_cache=False, check=False)
        rec = plan.tuning_record
        again = tuning.replay(rec)
        assert type(again) is type(plan) and again.threads == plan.threads == rec.key.options["threads"]
        assert again.selected.choice == rec.choice
        seen = _spy(again)
        t = again._example_tensors()
        again.execute(**{k: v for k, v in t.items() if k != "out"})
        assert max(seen) == plan.threads and _omp() == 2   # the convolution on it (small reorders on one)
    # a key without a count (older records) replays as "auto"
    rec = rec.with_(key=tuning.TuningKey.from_dict(dict(rec.key.to_dict(), options={
        k: v for k, v in rec.key.options.items() if k != "threads"})))
    assert tuning.replay(rec).threads_arg == "auto"


def _spy_creation(monkeypatch):
    """The OpenMP count in force at each dnnl_primitive_create (convolution and reorders)."""
    return _spy_omp(monkeypatch, "primitive")


def test_a_fused_one_thread_plan_creates_its_primitives_on_one_thread(threads, monkeypatch):
    # oneDNN's primitive cache keys a primitive by the count at its creation: created under the
    # caller's count, the plan could get another descriptor's primitive (another scratchpad size)
    torch.set_num_threads(2)
    x, w = TINY
    b, r = torch.randn(8), torch.randn(1, 8, 8, 8)
    plan = fused.FusedConvolution(x, w, b, padding=1, residual=True)
    assert plan.threads == 1
    seen = _spy_creation(monkeypatch)
    y = plan.run(x, w, b, r)
    assert seen and set(seen) == {1}
    ref = torch.relu(F.conv2d(x.double(), w.double(), b.double(), 1, 1) + r.double()).float()
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)
    assert _omp() == 2


@pytest.mark.parametrize("impl", ["x64:gemm:jit", None])
def test_a_callers_count_plan_keeps_the_count_it_listed_under(impl, threads, monkeypatch):
    # listed on one thread, then torch.set_num_threads(3): its primitive is created (and run) on
    # at most one thread. Created under 3 it was the primitive cache's one of a plan listed under 3
    # (a scratchpad for 3 threads): x64:gemm:jit then wrote past this plan's scratchpad.
    x, w = TINY
    torch.set_num_threads(3)
    other = onednn.Convolution(x, w, padding=1, threads=3, impl=impl)
    other.execute(x)
    torch.set_num_threads(1)
    plan = onednn.Convolution(x, w, padding=1, threads=None, impl=impl)
    plan.implementations
    torch.set_num_threads(3)
    created = _spy_creation(monkeypatch)
    plan.execute(x)
    assert created and set(created) == {1}
    seen = _spy(plan)
    for _ in range(3):
        y = plan.execute(x)
        assert _omp() == 3
    assert seen and set(seen) == {1}
    torch.testing.assert_close(y, F.conv2d(x.double(), w.double(), None, 1, 1).float(), rtol=1e-4, atol=1e-4)
    torch.set_num_threads(1)   # fewer than listed: the caller's count
    seen.clear()
    plan.execute(x)
    assert set(seen) == {1}


def test_a_fused_one_thread_plans_residual_reorder_runs_on_one_thread(threads, monkeypatch):
    torch.set_num_threads(2)
    x, w = TINY
    b, r = torch.randn(8), torch.randn(1, 8, 8, 8)
    plan = fused.FusedConvolution(x, w, b, padding=1, residual=True)
    blocked = [i.index for i in plan.implementations if plan._build(i.index).pre is not None]
    if not blocked:
        pytest.skip("no implementation here computes into a blocked destination (no residual reorder)")
    plan.select(blocked[0])
    seen = []
    real = onednn._dnnl.check

    def check(status, what, *detail, **kw):
        if detail and "residual reorder" in str(detail[0]):
            seen.append(_omp())
        return real(status, what, *detail, **kw)

    monkeypatch.setattr(onednn._dnnl, "check", check)
    y = plan.run(x, w, b, r)
    assert seen == [1] and _omp() == 2
    ref = torch.relu(F.conv2d(x.double(), w.double(), b.double(), 1, 1) + r.double()).float()
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)


def test_cached_plans_are_per_thread_count(threads, monkeypatch):
    """A threads=None plan runs on at most the count it listed under: the call sites' plan caches
    (rawconv.ops, the function forms, the fused operator and frozen modules) keep one plan per
    OpenMP count, so raising torch.set_num_threads gets a plan listed under the new count."""
    import rawconv.nn as rnn
    from rawconv import ops

    listed = []
    real = onednn.Convolution._enumerate

    def spy(self):
        real(self)
        listed.append(self._pd_threads())

    monkeypatch.setattr(onednn.Convolution, "_enumerate", spy)
    w, b = torch.randn(24, 16, 3, 3), torch.randn(24)
    net = torch.nn.Sequential(torch.nn.Conv2d(16, 24, 3, padding=1), torch.nn.ReLU()).eval()
    m = rnn.convert(net, fuse=True)
    sites = ((lambda x: ops.conv(x, w, b, 1, 1), lambda x: F.conv2d(x, w, b, 1, 1)),
             (lambda x: onednn.forward(x, w, b, 1, 1), lambda x: F.conv2d(x, w, b, 1, 1)),
             (lambda x: fused.conv_bias_act(x, w, b, padding=1), lambda x: torch.relu(F.conv2d(x, w, b, 1, 1))),
             (lambda x: m(x), lambda x: net(x)))
    for i, (call, want) in enumerate(sites):
        x = torch.randn(2, 16, 19, 23 + i)   # a shape no other call site or test caches
        new = []
        for n in (1, 1, 2, 2, 1):
            torch.set_num_threads(n)
            listed.clear()
            with torch.no_grad():
                torch.testing.assert_close(call(x), want(x), rtol=1e-4, atol=1e-4)
            assert set(listed) <= {n}   # a plan listed now is listed under the caller's count
            new.append(bool(listed))
        # a plan per count: listed at the first call under each count, reused after
        assert new == [True, False, True, False, False]
