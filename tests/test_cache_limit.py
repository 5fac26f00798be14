"""Issue 36, item 1: the buffers rawconv's plans keep between calls are bounded in bytes.

Each built oneDNN implementation keeps reorder buffers and a scratchpad; every new input size
made a new plan with new buffers, bounded only by the caches' entry counts (6.3 GB for 250 sizes
of one layer). Now their bytes count against :func:`rawconv.set_cache_limit` (least recently
used released past it, rebuilt on their plan's next call), and :func:`rawconv.clear_caches`
releases all of them, the frozen modules' of ``convert(fuse=True)`` included. The tests count
the bytes held by every live built implementation (walking the garbage collector's objects, not
rawconv's own accounting).
"""
from __future__ import annotations

import gc
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F

import rawconv
import rawconv.nn as rnn
from rawconv import onednn
from rawconv.core import plans

MB = 1 << 20


def _held() -> tuple[int, int]:
    """(bytes, count) of the buffers of every live built oneDNN implementation in the process."""
    gc.collect()
    n = total = 0
    for o in gc.get_objects():
        if isinstance(o, onednn._Built):
            n += 1
            total += sum(int(a[5].numel()) for a in o.args if a[5] is not None) + int(o.scratchpad.numel())
    return total, n


@pytest.fixture
def limit():
    """Set the plans' byte budget for the test (where rawconv has one), then put it back."""
    setter = getattr(rawconv, "set_cache_limit", None)
    rawconv.clear_caches()

    def set_(nbytes):
        if setter is not None:
            setter(nbytes)

    yield set_
    if setter is not None:
        setter(None)
    rawconv.clear_caches()


def test_many_input_sizes_hold_at_most_the_limit(limit):
    limit(8 * MB)
    torch.manual_seed(0)
    m = rnn.Conv2d(16, 16, 3, padding=1)
    peak = 0
    with torch.no_grad():
        for i in range(48):   # each size's plan keeps ~0.5-1.3 MB of reorder buffers
            x = torch.randn(1, 16, 64 + 2 * i, 64)
            torch.testing.assert_close(m(x), F.conv2d(x, m.weight, m.bias, padding=1), rtol=1e-4, atol=1e-4)
            if i % 8 == 7:
                peak = max(peak, _held()[0])
    largest = 2 * 16 * (64 + 2 * 47) * 64 * 4 + (1 << 16)   # one plan's buffers may exceed what is left
    assert peak <= 8 * MB + largest, f"{peak / MB:.1f} MB held by built implementations"
    info = rawconv.cache_info()
    assert info["limit"] == 8 * MB and info["evictions"] > 0 and info["bytes"]["cpu"] <= 8 * MB + largest
    # the ledger's count is what is really held
    assert abs(info["bytes"]["cpu"] - _held()[0]) <= largest


def test_clear_caches_frees_what_fused_and_converted_models_hold(limit):
    torch.manual_seed(1)
    base = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.Conv2d(8, 8, 3, padding=1)).eval()
    fused = rnn.convert(base, fuse=True)
    plain = rnn.convert(base)
    xs = [torch.randn(2, 8, 20 + 2 * i, 20) for i in range(6)]
    with torch.no_grad():
        for x in xs:
            fused(x)
            plain(x)
    assert _held()[1] > 0
    rawconv.clear_caches()
    assert _held() == (0, 0), "every buffer released, the frozen modules' plans included"
    with torch.no_grad():   # and the models still compute (their plans made again)
        for x in xs[:2]:
            torch.testing.assert_close(fused(x), base(x), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(plain(x), base(x), rtol=1e-4, atol=1e-4)


def test_released_plans_rebuild_right_from_several_threads(limit, monkeypatch):
    limit(0)   # nothing kept but what is being built: every switch of size releases the other
    monkeypatch.setattr(plans, "REBUILD_WARNING", 10)
    monkeypatch.setattr(plans._ledger, "warned", False)
    torch.manual_seed(2)
    w = torch.randn(8, 8, 3, 3)
    xs = [torch.randn(2, 8, 12 + 4 * i, 12) for i in range(3)]
    refs = [F.conv2d(x, w, padding=1) for x in xs]
    plan_list = [onednn.Convolution(x, w, padding=1) for x in xs]
    wrong, errors = [0], []

    def work(k):
        try:
            for j in range(30):
                i = (j + k) % 3
                if not torch.allclose(plan_list[i].execute(xs[i], w), refs[i], rtol=1e-4, atol=1e-4):
                    wrong[0] += 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ts = [threading.Thread(target=work, args=(k,)) for k in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert not errors and wrong[0] == 0
    assert rawconv.cache_info()["rebuilds"] >= 10
    said = [str(w.message) for w in caught if "cache limit" in str(w.message)]
    assert len(said) == 1 and "set_cache_limit" in said[0]


def test_autotune_keeps_only_the_selected_implementation(limit):
    torch.manual_seed(3)
    plan = onednn.Convolution.from_problem(rawconv.ConvProblem.from_torch(torch.empty(2, 8, 16, 16),
                                                                          torch.empty(8, 8, 3, 3), None, 1, 1))
    plan.autotune(iterations=2, warmup=0, use_cache=False)
    assert list(plan._built) == [plan.selected.index]
    assert plan._examples is None, "the search's random tensors are not kept"


def test_cache_limit_setting_and_environment(limit, monkeypatch):
    monkeypatch.setenv("RAWCONV_CACHE_LIMIT", "3M")
    rawconv.set_cache_limit(None)
    assert rawconv.cache_limit() == 3 * MB
    monkeypatch.setenv("RAWCONV_CACHE_LIMIT", "lots")
    with pytest.warns(RuntimeWarning, match="RAWCONV_CACHE_LIMIT"):
        assert rawconv.cache_limit() == plans.DEFAULT_CACHE_LIMIT
    monkeypatch.delenv("RAWCONV_CACHE_LIMIT")
    assert rawconv.cache_limit() == plans.DEFAULT_CACHE_LIMIT == 512 * MB
    rawconv.set_cache_limit(12345)
    assert rawconv.cache_limit() == 12345
    for bad, exc in ((-1, rawconv.ArgumentError), (1.5, rawconv.ArgumentTypeError), ("1G", rawconv.ArgumentTypeError),
                     (True, rawconv.ArgumentTypeError)):
        with pytest.raises(exc):
            rawconv.set_cache_limit(bad)
