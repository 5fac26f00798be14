"""rawconv.bench helpers that need no GPU to check (torch.cuda.synchronize stubbed where used)."""
import torch

from rawconv.bench import geomean, time_cpu, wall_us_per_call


def test_wall_us_per_call_counts_every_call_and_synchronizes_per_loop(monkeypatch):
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append(1))
    calls = []
    us = wall_us_per_call(lambda: calls.append(1), calls=50, repeats=3, warmup=7)
    assert len(calls) == 7 + 50 * 3
    assert len(syncs) == 1 + 3
    assert 0 < us < 1e4


def test_time_cpu_and_geomean():
    st = time_cpu(lambda: sum(range(1000)), iterations=5, warmup=1)
    assert st.runs == 5 and 0 < st.min_ms <= st.median_ms
    assert abs(geomean([2.0, 8.0]) - 4.0) < 1e-12
