"""The per-call fast paths (issue 15, "the cost of a pinned call") stay exact: a tensor whose
metadata changed in place after a hot call, an ``out`` that overlaps an input after a hot call with
the same shapes, weights updated in place, and OpenMP's thread count restored after the reorders
that run on the calling thread alone."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rawconv import onednn, ops
from rawconv.onednn import _ffi as _dnnl
from rawconv.errors import ArgumentError

pytestmark = pytest.mark.filterwarnings("ignore::rawconv.errors.SlowReferenceWarning")


def _ref(x, w, b=None, padding=1):
    return F.conv2d(x.double(), w.double(), None if b is None else b.double(), 1, padding).float()


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("prepack", [False, True])
def test_strides_changed_in_place_after_a_hot_call(prepack):
    x = torch.randn(1, 8, 8, 8)
    w = torch.randn(8, 8, 3, 3)
    plan = onednn.Convolution(x, w, padding=1, prepack=prepack)
    for _ in range(3):
        _close(plan.execute(x), _ref(x, w))
    # same storage, same shape, other strides (channels-last order): the hot path must not apply
    x.as_strided_((1, 8, 8, 8), (512, 1, 64, 8))
    _close(plan.execute(x), _ref(x, w))
    # and through the operators' and the function form's caches too
    x2 = torch.randn(1, 8, 8, 8)
    for _ in range(3):
        _close(ops.conv(x2, w, None, 1, 1), _ref(x2, w))
        _close(onednn.forward(x2, w, None, 1, 1), _ref(x2, w))
        _close(torch.ops.rawconv.conv_forward(x2, w, None, [1, 1], [1, 1], [1, 1], [1, 1], 1, "onednn", "",
                                              "strict", "", ""), _ref(x2, w))
    x2.as_strided_((1, 8, 8, 8), (512, 1, 64, 8))
    _close(ops.conv(x2, w, None, 1, 1), _ref(x2, w))
    _close(onednn.forward(x2, w, None, 1, 1), _ref(x2, w))
    _close(torch.ops.rawconv.conv_forward(x2, w, None, [1, 1], [1, 1], [1, 1], [1, 1], 1, "onednn", "",
                                          "strict", "", ""), _ref(x2, w))


def test_weights_updated_in_place_are_seen_without_prepack_and_not_with_it():
    x = torch.randn(1, 8, 8, 8)
    w = torch.randn(8, 8, 3, 3)
    w0 = w.clone()
    live = onednn.Convolution(x, w, padding=1)
    snap = onednn.Convolution(x, w, padding=1, prepack=True)
    for _ in range(3):
        live.execute(x)
        snap.execute(x)
        ops.conv(x, w, None, 1, 1)
    with torch.no_grad():
        w.mul_(-2)
    _close(live.execute(x), _ref(x, w))
    _close(ops.conv(x, w, None, 1, 1), _ref(x, w))
    _close(onednn.forward(x, w, None, 1, 1), _ref(x, w))
    _close(snap.execute(x), _ref(x, w0))   # the snapshot: an explicit copy, until repack()
    snap.repack()
    _close(snap.execute(x), _ref(x, w))


def test_an_overlapping_out_is_refused_after_hot_calls_with_the_same_shapes():
    buf = torch.zeros(2048)
    x = buf[:512].view(1, 8, 8, 8)
    x.copy_(torch.randn(1, 8, 8, 8))
    w = torch.randn(8, 8, 3, 3)
    plan = onednn.Convolution(x, w, padding=1, prepack=True)
    out = buf[1024:1536].view(1, 8, 8, 8)
    for _ in range(3):   # the pointers (x, w, out) are found not to overlap once, then remembered
        assert plan.execute(x, out=out) is out
    _close(out, _ref(x, w))
    for bad in (buf[256:768].view(1, 8, 8, 8), buf[:512].view(1, 8, 8, 8)):
        with pytest.raises(ArgumentError, match="overlaps"):
            plan.execute(x, out=bad)
    v = out._version
    plan.execute(x, out=out)
    assert out._version > v   # out='s version bump stays on the fast path


def test_the_thread_count_is_restored_and_results_agree_across_thread_counts(threads):
    x = torch.randn(1, 8, 8, 8)
    w = torch.randn(8, 8, 3, 3)
    b = torch.randn(8)
    ys = []
    for n in (1, 2):
        torch.set_num_threads(n)
        plan = onednn.Convolution(x, w, b, padding=1)
        for _ in range(3):
            y = plan.execute(x)
            assert torch.get_num_threads() == n
        ops.conv(x, w, b, 1, 1)
        assert torch.get_num_threads() == n
        _close(y, _ref(x, w, b))
        ys.append(y)
    controls = _dnnl.omp_thread_controls()
    if controls is not None:   # the OpenMP runtime libdnnl uses is the one torch sets (one pool per process)
        torch.set_num_threads(2)
        assert controls[0]() == 2


def test_a_bias_of_other_strides_is_not_taken_by_the_hot_path():
    x = torch.randn(1, 8, 8, 8)
    w = torch.randn(8, 8, 3, 3)
    b = torch.randn(8)
    plan = onednn.Convolution(x, w, b, padding=1)
    for _ in range(3):
        plan.execute(x, w, b)
    b2 = torch.randn(16)[::2]   # strided bias: copied by the checked path
    _close(plan.execute(x, w, b2), _ref(x, w, b2))
    _close(ops.conv(x, w, b2, 1, 1), _ref(x, w, b2))


def test_the_fast_paths_still_raise_only_rawconv_errors(monkeypatch):
    from rawconv.errors import AllocationError, InternalError

    x = torch.randn(1, 8, 8, 8)
    w = torch.randn(8, 8, 3, 3)
    plan = onednn.Convolution(x, w, padding=1, prepack=True)
    for _ in range(3):
        plan.execute(x)
        onednn.forward(x, w, None, 1, 1)
        ops.conv(x, w, None, 1, 1)

    def oom():
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")

    monkeypatch.setattr(onednn._dnnl, "stream", oom)   # reached on the hot paths only, past every check
    with pytest.raises(AllocationError, match="rawconv.onednn.Convolution.execute"):
        plan.execute(x)
    with pytest.raises(AllocationError, match="rawconv.onednn.forward"):
        onednn.forward(x, w, None, 1, 1)
    with pytest.raises(AllocationError, match="rawconv.ops.conv"):
        ops.conv(x, w, None, 1, 1)

    def bug():
        raise KeyError("bug")

    monkeypatch.setattr(onednn._dnnl, "stream", bug)
    with pytest.raises(InternalError, match="unexpected KeyError"):
        plan(x)   # __call__ is execute
