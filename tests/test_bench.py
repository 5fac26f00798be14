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


def test_onednn_autotune_flags_rows_that_waited_for_a_cpu(monkeypatch):
    """autotune times in interleaved rounds; a row whose calls all waited for a CPU (our threads'
    run-queue time, here a fake schedstat reader that grows 10 ms per read) is flagged and warned
    about, and its record says its time is not to be trusted. A busy machine alone (LoadMonitor)
    no longer marks rows that the rounds measured clean."""
    from rawconv import bench, onednn

    busy = bench.LoadReport(1.0, 2, 2, 1.2, 0.6, 3.0)
    monkeypatch.setattr(bench.LoadMonitor, "report", lambda self: busy)
    conv = onednn.Convolution(torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3), padding=1)
    clock = iter(range(10 ** 6))
    monkeypatch.setattr(bench, "_self_wait_seconds", lambda: 0.01 * next(clock))
    with pytest.warns(bench.TimingWarning, match="waited for a CPU"):
        rows = conv.autotune(iterations=2, warmup=0)
    assert rows and all(r.spread >= 1.0 for r in rows) and "median/min" in str(rows[0])
    assert all(r.extra["rounds"]["clean_calls"] == 0 for r in rows if r.ok)
    assert any(f.startswith("waited for a CPU") for f in rows[0].timing_flags)
    assert rows.record.timing["trustworthy"] is False and rows.record.timing["row_flags"]
    # the same with calls that did not wait: no warning, even though the machine looked busy
    monkeypatch.setattr(bench, "_self_wait_seconds", lambda: 0.0)
    conv2 = onednn.Convolution(torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3), padding=1)
    import warnings

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        rows = conv2.autotune(iterations=2, warmup=0)
    assert not any("waited for a CPU" in str(w.message) for w in said)
    assert all(r.extra["rounds"]["clean_calls"] == r.extra["rounds"]["calls"] for r in rows if r.ok)


def test_time_cpu_budget_covers_warmup_and_always_times_once():
    import time

    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.02)

    st = time_cpu(slow, iterations=50, warmup=50, budget_s=0.1)
    assert st.runs == 1 and 2 <= len(calls) <= 12     # warm-up used the budget; one timed call still made
    assert st.min_ms >= 20.0


def _fake_counters(monkeypatch, busy, self_cpu, wait):
    """Make LoadMonitor read ``busy`` / ``self_cpu`` / ``wait`` (pairs: at reset, at report)."""
    from rawconv import bench

    seq = {"busy": list(busy), "self": list(self_cpu), "wait": list(wait)}
    monkeypatch.setattr(bench, "_busy_seconds", lambda cpus: seq["busy"].pop(0))
    monkeypatch.setattr(bench, "_self_cpu_seconds", lambda: seq["self"].pop(0))
    monkeypatch.setattr(bench, "_self_wait_seconds", lambda: seq["wait"].pop(0))
    monkeypatch.setattr(bench, "usable_cpus", lambda: 2)
    monkeypatch.setattr(bench, "loadavg_1min", lambda: 0.3)


def test_a_stray_clock_tick_over_a_short_window_is_not_oversubscription(monkeypatch):
    """/proc/stat counts 10 ms ticks: one tick of another process over a 2 ms window reads as 5
    CPUs. It is capped at the machine's CPUs, not shown, and does not mark the timing unreliable."""
    from rawconv import bench

    _fake_counters(monkeypatch, busy=[100.0, 100.01], self_cpu=[5.0, 5.0], wait=[0.0, 0.0])
    m = bench.LoadMonitor(threads=2)
    m._t0 = bench.time.perf_counter() - 0.002
    r = m.report()
    assert r.seconds < bench.MIN_WINDOW_S and r.other_cpus is not None and r.other_cpus <= r.cpus == 2
    assert not r.other_cpus_known and not r.oversubscribed
    assert "other processes kept" not in r.describe() and "load average 0.3" in r.describe()
    assert bench.timing_warnings(r, [1.0]) == []
    # merged over enough rows (compare's machine_report) the ticks do count: 1 s, one CPU kept busy
    from rawconv.compare import machine_report
    from rawconv.results import Result

    rows = [Result("onednn", "x", "p", status="ok", extra={"machine": bench.LoadReport(0.01, 2, 2, 1.0, 0.0, 0.3)
                                                            .as_dict()}) for _ in range(100)]
    merged = machine_report(rows)
    assert merged.seconds == pytest.approx(1.0) and merged.oversubscribed
    assert "other processes kept 1.0 of 2 CPUs busy" in merged.describe()


def test_load_monitor_never_reports_more_cpus_than_the_machine_has(monkeypatch):
    from rawconv import bench

    # 0.5 s window, 3 s of other processes' CPU time counted (e.g. CPUs outside a cgroup quota)
    _fake_counters(monkeypatch, busy=[100.0, 103.0], self_cpu=[5.0, 5.0], wait=[0.0, 0.0])
    m = bench.LoadMonitor(threads=1)
    m._t0 = bench.time.perf_counter() - 0.5
    r = m.report()
    assert r.other_cpus_known and r.other_cpus == 2.0 and r.oversubscribed
    assert "other processes kept 2.0 of 2 CPUs busy while 1 thread timed" in r.describe()
    # one tick over a 0.5 s window on a quiet machine: 0.02 CPUs, sound timings
    _fake_counters(monkeypatch, busy=[100.0, 100.01], self_cpu=[5.0, 5.0], wait=[0.0, 0.0])
    m = bench.LoadMonitor(threads=2)
    m._t0 = bench.time.perf_counter() - 0.5
    r = m.report()
    assert r.other_cpus == pytest.approx(0.02, abs=1e-3) and not r.oversubscribed


def test_the_suggested_fix_differs_from_the_current_setting():
    from rawconv.bench import LoadReport, load_hint, suggested_threads, timing_warnings

    # 2 threads on 2 CPUs; nothing else busy but our threads waited: fewer threads is no advice
    waited = LoadReport(1.0, 2, 2, 0.1, 0.6, 2.5)
    assert waited.oversubscribed and suggested_threads(waited) == 2
    lines = timing_warnings(waited, [], hint="--threads {threads} or a quiet machine")
    assert len(lines) == 1 and lines[0].endswith("(a quiet machine)") and "--threads 2" not in lines[0]
    assert "set_num_threads" not in timing_warnings(waited, [])[0]
    one = LoadReport(1.0, 2, 1, 1.8, 0.3, 3.0)                   # already one thread
    assert load_hint(one) == "a quiet machine"
    # one CPU taken by another process while 2 threads timed: 1 thread would fit
    busy = LoadReport(1.0, 2, 2, 1.0, 0.4, 3.0)
    assert load_hint(busy) == "torch.set_num_threads(1) or a quiet machine"
    assert "(--threads 1 or a quiet machine)" in timing_warnings(busy, [], hint="--threads {threads} or a quiet machine")[0]


def test_pytest_configuration_silences_timing_warnings_but_pytest_warns_sees_them(tmp_path):
    """The project's pytest configuration filters rawconv's TimingWarning (autotune on a shared
    machine), while a test asserting it with pytest.warns still passes."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    (tmp_path / "test_tw.py").write_text(
        "import warnings, pytest\n"
        "from rawconv.bench import TimingWarning\n"
        "def test_noise():\n    warnings.warn('machine oversubscribed', TimingWarning)\n"
        "def test_asserted():\n"
        "    with pytest.warns(TimingWarning, match='unstable'):\n"
        "        warnings.warn('unstable timings', TimingWarning)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                          os.path.join(root, "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=120).stdout
    summary = out.strip().splitlines()[-1]
    assert "2 passed" in summary and "warning" not in summary, out


def test_a_quiet_two_core_machine_is_not_called_oversubscribed():
    """What `rawconv compare resnet50` measured on a quiet 2-core machine (load average 0.5) must
    not mark a run unreliable; one CPU kept busy elsewhere, or our threads waiting a third of the
    time (what a busy run measured), must."""
    from rawconv.bench import LoadReport

    quiet = [LoadReport(3.0, 2, 2, 0.3, 0.02, 0.7), LoadReport(3.0, 2, 2, 0.1, 0.14, 0.5)]
    assert not any(r.oversubscribed for r in quiet)
    assert LoadReport(3.0, 2, 2, 1.0, 0.02, 1.2).oversubscribed
    assert LoadReport(3.0, 2, 2, 0.1, 0.6, 2.5).oversubscribed
    assert LoadReport(3.0, 2, 1, 1.7, None, 2.9).oversubscribed
