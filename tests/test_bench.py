"""rawconv.bench helpers that need no GPU to check (torch.cuda.synchronize stubbed where used)."""
import pytest
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


def test_spread_and_geomean_ignore_what_cannot_be_compared():
    import math

    from rawconv.bench import TimeStats, spread

    assert spread(3.0, 1.5) == 2.0 and math.isnan(spread(1.0, 0.0)) and math.isnan(spread(float("nan"), 1.0))
    assert TimeStats(2.0, 1.0, 1.5, 4).spread == 2.0 and "median/min 2.00" in str(TimeStats(2.0, 1.0, 1.5, 4))
    assert geomean([2.0, float("nan"), 8.0, 0.0]) == geomean([2.0, 8.0])
    assert math.isnan(geomean([]))


def test_usable_cpus_and_default_threads_do_not_oversubscribe():
    import os

    from rawconv.bench import default_threads, usable_cpus

    n = usable_cpus()
    assert 1 <= n <= len(os.sched_getaffinity(0))
    assert 1 <= default_threads() <= min(n, torch.get_num_threads())


def test_load_monitor_sees_another_process_burn_a_cpu():
    """A child spinning for 1 s on our CPUs shows up as CPU time of other processes."""
    import subprocess
    import sys

    from rawconv.bench import LoadMonitor

    m = LoadMonitor(threads=1)
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.0: pass"])
    child.wait(timeout=60)
    r = m.report()
    assert r.seconds >= 1.0 and r.cpus >= 1 and r.threads == 1
    if r.other_cpus is None:
        pytest.skip("no /proc/stat on this system: other processes' CPU time is unknown")
    assert r.other_cpus > 0.3, r        # the child alone used about one CPU for most of the window
    assert r.waited is None or r.waited >= 0
    assert "other processes kept" in r.describe() and r.as_dict()["other_cpus"] == r.other_cpus


def test_timing_warnings_name_the_cause():
    from rawconv.bench import SPREAD_LIMIT, LoadReport, timing_warnings

    quiet = LoadReport(1.0, 2, 2, 0.05, 0.0, 0.2)
    assert not quiet.oversubscribed and timing_warnings(quiet, [1.01, 1.1]) == []
    busy = LoadReport(1.0, 2, 2, 1.0, 0.4, 3.0)            # one CPU taken by another process, 2 threads
    assert busy.oversubscribed
    lines = timing_warnings(busy, [1.0], hint="--threads 1")
    assert len(lines) == 1 and "oversubscribed" in lines[0] and "--threads 1" in lines[0]
    waited = LoadReport(1.0, 2, 1, 0.0, 0.5, 1.0)          # our one thread waited half the time
    assert waited.oversubscribed
    lines = timing_warnings(quiet, [1.0, SPREAD_LIMIT * 2, float("nan")])
    assert len(lines) == 1 and "1 of 2" in lines[0]


def test_onednn_autotune_reports_spread_and_warns_when_oversubscribed(monkeypatch):
    from rawconv import bench, onednn

    busy = bench.LoadReport(1.0, 2, 2, 1.2, 0.6, 3.0)
    monkeypatch.setattr(bench.LoadMonitor, "report", lambda self: busy)
    conv = onednn.Convolution(torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3), padding=1)
    with pytest.warns(bench.TimingWarning, match="oversubscribed"):
        rows = conv.autotune(iterations=2, warmup=0)
    assert rows and all(r.spread >= 1.0 for r in rows) and "median/min" in str(rows[0])


def test_time_cpu_budget_covers_warmup_and_always_times_once():
    import time

    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.02)

    st = time_cpu(slow, iterations=50, warmup=50, budget_s=0.1)
    assert st.runs == 1 and 2 <= len(calls) <= 12     # warm-up used the budget; one timed call still made
    assert st.min_ms >= 20.0
