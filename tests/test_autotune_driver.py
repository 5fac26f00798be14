"""rawconv.core.autotune: the tuning-cache half every backend's autotune runs (one driver, not three
copies), with a fake plan, and through oneDNN's autotune end to end."""
from __future__ import annotations

import math

import pytest
import torch

from rawconv import ConvProblem, onednn, tuning
from rawconv.core import autotune
from rawconv.errors import NotSupportedError


@pytest.fixture(autouse=True)
def fresh_cache(fresh_tuning_cache):
    """The process's tuning cache empty, in memory, before and after (conftest's fresh_tuning_cache)."""
    yield


class _Table(list):
    record = None


class _Plan:
    tuning_record = None


def _key():
    p = ConvProblem(n=1, c=2, k=3, in_spatial=(5, 5), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1))
    return tuning.TuningKey.for_backend("onednn", p, "forward", onednn.key_options("strict"))


def test_cached_reads_only_when_wanted_and_attaches_the_hit(tmp_path):
    key, plan = _key(), _Plan()
    rec = tuning.TuningRecord(key, "x64:gemm:jit@any", {}, median_ms=1.5)
    tuning.cache().put(rec)
    calls = []

    def from_hit(hit):
        calls.append(hit)
        return _Table([hit.choice])

    assert autotune.cached(plan, key, None, from_hit) is None and calls == []   # no file: None reads nothing
    assert autotune.cached(plan, key, False, from_hit) is None and calls == []
    t = autotune.cached(plan, key, True, from_hit)
    assert t == ["x64:gemm:jit@any"] and t.record is rec and plan.tuning_record is rec and calls == [rec]
    tuning.set_cache_file(str(tmp_path / "c.json"))
    assert autotune.wanted(None) and not autotune.wanted(None, file_default=False)
    other = tuning.TuningKey.from_dict(dict(key.to_dict(), direction="backward_data"))
    assert autotune.cached(_Plan(), other, True, from_hit) is None     # a miss


def test_cached_searches_when_the_choice_no_longer_selects():
    key, plan = _key(), _Plan()
    tuning.cache().put(tuning.TuningRecord(key, "gone@any", {}))

    def from_hit(hit):
        raise NotSupportedError(f"{hit.choice} is not offered")

    assert autotune.cached(plan, key, True, from_hit) is None and plan.tuning_record is None


def test_keep_stores_and_attaches(tmp_path):
    tuning.set_cache_file(str(tmp_path / "c.json"))
    key, plan, table = _key(), _Plan(), _Table(["row"])
    rec = tuning.TuningRecord(key, "x64:gemm:jit@any", {}, median_ms=2.0, min_ms=1.0)
    assert autotune.keep(plan, table, rec) is table
    assert table.record is rec and plan.tuning_record is rec and tuning.cache().get(key) == rec
    assert (tmp_path / "c.json").exists()
    assert autotune.hit_times(rec) == (2.0, 1.0)
    assert all(math.isnan(v) for v in autotune.hit_times(tuning.TuningRecord(key, "c", {})))


def test_onednn_autotune_runs_the_driver():
    torch.manual_seed(0)
    x, w = torch.randn(1, 4, 8, 8), torch.randn(4, 4, 3, 3)
    plan = onednn.Convolution(x, w, padding=1)
    first = plan.autotune(iterations=2, warmup=0, use_cache=True)
    assert first.record is plan.tuning_record and tuning.cache().get(plan._tuning_key(False)) == first.record
    again = onednn.Convolution(x, w, padding=1)
    hit = again.autotune(iterations=2, warmup=0, use_cache=True)
    assert len(hit) == 1 and hit[0].phase == "cache" and hit.record == first.record
    assert again.selected.choice == first.record.choice
    ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    assert (again.execute(x, w).double() - ref).abs().max() < 1e-4
