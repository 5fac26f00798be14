"""compare times a problem at the thread count that fits beside the other processes (issue 34):
bench.fit_threads, compare(fit_threads=True), the summary's ``threads`` and the headline's line,
and a real induced load (one spinning process per CPU) in a child process."""
from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import child_json

from rawconv.core import bench



def test_fit_threads_gives_the_count_the_other_processes_leave():
    from rawconv.bench import LoadReport, fit_threads

    # two spinning processes on a 2-core machine (what load_repeat.py starts): 1 thread fits
    busy = LoadReport(1.0, 2, 2, 2.0, 0.0, 4.0)
    f = fit_threads(2, busy)
    assert f.threads == 1 and f.reduced and f.requested == 2
    assert f.describe().startswith("1 thread, not 2: other processes kept 2.0 of 2 CPUs busy")
    assert f.as_dict()["load"]["other_cpus"] == 2.0 and f.as_dict()["reduced"] is True
    # one CPU kept busy elsewhere on 2: 1; on 4 CPUs with 4 asked for: 3
    assert fit_threads(2, LoadReport(1.0, 2, 2, 1.0, 0.0, 2.0)).threads == 1
    assert fit_threads(4, LoadReport(1.0, 4, 4, 1.0, 0.0, 2.0)).threads == 3
    # a quiet machine (daemons: 0.3 of a CPU) keeps the count asked for, whatever the report's own count
    quiet = LoadReport(1.0, 2, 1, 0.3, 0.9, 0.5)
    f = fit_threads(2, quiet)
    assert f.threads == 2 and not f.reduced and f.describe() == "2 threads"
    # nothing known, a window too short for /proc/stat's ticks, or one thread asked for: no change
    assert fit_threads(2, None).threads == 2
    assert fit_threads(2, LoadReport(0.01, 2, 2, 2.0, 0.0, 4.0)).threads == 2
    assert fit_threads(1, busy).threads == 1 and not fit_threads(1, busy).reduced


def _problems():
    from rawconv.problem import ConvProblem

    # 1x1 and 3x3, large enough (>= 2**17 FLOPs) that rawconv's plans take the caller's count and
    # (input over 20480 elements) that torch runs them on its oneDNN at 2 threads; at 1 thread torch
    # runs the 1x1 on its own Slow2d
    return [ConvProblem(n=1, c=32, k=32, in_spatial=(32, 32), kernel=(1, 1), name="one"),
            ConvProblem(n=1, c=32, k=32, in_spatial=(32, 32), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1),
                        name="three")]


@pytest.fixture
def two_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


def test_compare_times_both_sides_at_the_count_that_fits(monkeypatch, two_threads):
    """With a busy sample before the first problem, every row of it runs at 1 thread (torch's call
    and rawconv's plans see torch.get_num_threads() == 1 while built, checked and timed); the next
    problem is judged on what the machine did during the first (here: quiet again), so it runs at
    the count asked for. The caller's count is restored."""
    from rawconv import compare
    from rawconv.explore import compare as cmp

    requested = torch.get_num_threads()
    seen = []
    orig = cmp.compare_problem

    def spy(p, **kw):
        seen.append((p.name, torch.get_num_threads()))
        return orig(p, **kw)

    class Quiet:
        def __init__(self, threads=None):
            self.threads = threads

        def report(self):
            return bench.LoadReport(2.0, 2, requested, 0.0, 0.0, 0.3)

    monkeypatch.setattr(cmp, "compare_problem", spy)
    monkeypatch.setattr(cmp, "LoadMonitor", Quiet)
    monkeypatch.setattr(bench, "sample_load", lambda s=0.3, t=None: bench.LoadReport(0.3, 2, requested, 2.0, 0.0, 4.0))
    rows = compare.compare(_problems(), iterations=2, warmup=0, budget_s=0.5, include_ref=False, progress=False,
                           confirm_rounds=2, fit_threads=True)
    assert seen == [("one", 1), ("three", requested)]
    assert torch.get_num_threads() == requested
    one = [r for r in rows if r.problem == "one"]
    assert all(r.extra["threads"]["threads"] == 1 and r.extra["threads"]["reduced"] for r in one)
    assert all(r.extra["threads"]["threads"] == requested and not r.extra["threads"]["reduced"]
               for r in rows if r.problem == "three")
    # torch's own choice at 1 thread: its Slow2d for a 1x1 convolution, named in the row and the headline
    torch_one = next(r for r in one if r.torch_default)
    assert torch_one.detail.startswith("Slow2d")
    assert next(r for r in rows if r.problem == "three" and r.torch_default).detail.startswith("Mkldnn")
    # at 1 thread a call's time is its thread's CPU time ("mixed": some calls by wall time, where another
    # thread of ours worked during them, as an OpenMP worker can); at 2, its wall time
    assert all(r.extra["rounds"]["measure"] in ("thread CPU", "mixed") for r in one if "rounds" in r.extra)
    assert torch_one.extra["confirmed"]["rounds"]["measure"] in ("thread CPU", "mixed")
    assert all(r.extra["rounds"]["measure"] == "wall" for r in rows if r.problem == "three" and "rounds" in r.extra)
    s = compare.summary(rows)
    t = s["threads"]
    assert t == {"requested": requested, "used": [1, requested], "reduced_problems": 1, "problems": 2,
                 "retimed_problems": 0, "torch_backends_reduced": {"Slow2d": 1}, "other_cpus": 2.0}
    text = "\n".join(compare.headline(s))
    assert f"timed at 1 thread(s), not {requested}, on 1 of 2 problem(s)" in text
    assert "torch's call and rawconv's ran at 1 alike" in text and "its own Slow2d on 1 of them" in text
    assert "a one-thread call is timed by its thread's CPU time" in text
    # the tuning records say the count each problem was timed at (replay runs it so), min never above median
    recs = {r.label: r for r in compare.records(rows, _problems())}
    assert recs["one"].key.options["threads"] == 1 and recs["three"].key.options["threads"] == requested
    assert all(r.min_ms <= r.median_ms for r in recs.values())
    # quiet before, busy while it ran at the count asked for: timed again at the count that fits
    seen.clear()
    monkeypatch.setattr(bench, "sample_load", lambda s=0.3, t=None: bench.LoadReport(0.3, 2, requested, 0.0, 0.0, 0.2))
    monkeypatch.setattr(Quiet, "report", lambda self: bench.LoadReport(2.0, 2, requested, 1.5, 0.5, 3.0))
    rows = compare.compare(_problems()[1:], iterations=2, warmup=0, budget_s=0.5, include_ref=False, progress=False,
                           confirm_rounds=2, fit_threads=True)
    assert seen == [("three", requested), ("three", 1)]
    assert all(r.extra["threads"]["threads"] == 1 and r.extra["threads"]["retimed"] for r in rows)
    s = compare.summary(rows)
    assert s["threads"]["retimed_problems"] == 1 and s["threads"]["torch_backends_reduced"] == {"Mkldnn": 1}
    text = "\n".join(compare.headline(s))
    assert f"on 1 of 1 problem(s) (1 timed again so: the CPUs were taken while they ran at {requested})" in text
    assert "Slow2d" not in text
    # without fit_threads nothing is judged: every problem at the count asked for, and the headline is silent
    seen.clear()
    rows = compare.compare(_problems()[:1], iterations=2, warmup=0, budget_s=0.5, include_ref=False, progress=False,
                           confirm_rounds=0)
    assert seen == [("one", requested)] and not compare.summary(rows)["threads"]["reduced_problems"]
    assert "timed at" not in "\n".join(compare.headline(compare.summary(rows)))


_CHILD = r"""
import json, os, subprocess, sys, time
import torch
cpus = sorted(os.sched_getaffinity(0))[:2]
os.sched_setaffinity(0, set(cpus))
torch.set_num_threads(2)
from rawconv import bench, compare
from rawconv.problem import ConvProblem
if bench.sample_load(0.2, 2).other_cpus is None:
    print(json.dumps({"skip": "no /proc/stat here"})); sys.exit(0)
spin = [subprocess.Popen([sys.executable, "-c", "import os; os.sched_setaffinity(0, {%d}); exec('while True: pass')" % c])
        for c in cpus]
try:
    time.sleep(0.5)
    p = ConvProblem(n=1, c=32, k=32, in_spatial=(28, 28), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1), name="p")
    rows = compare.compare([p], iterations=4, warmup=0, budget_s=1.0, include_ref=False, progress=False,
                           confirm_rounds=2, fit_threads=True)
    s = compare.summary(rows)
    print(json.dumps({"threads": [r.extra["threads"] for r in rows], "summary": s["threads"],
                      "headline": compare.headline(s), "after": torch.get_num_threads()}))
finally:
    for q in spin:
        q.kill()
"""


def test_an_induced_load_makes_compare_time_at_one_thread():
    """One spinning process on each of the 2 CPUs the child may use: the child asks for 2
    threads, the machine leaves none free, so its problem is timed at 1 thread and the headline
    says so (a real /proc/stat sample, not a fake)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    out = child_json(_CHILD, timeout=600)
    assert all(t["requested"] == 2 and t["threads"] == 1 and t["load"]["other_cpus"] > 1.0 for t in out["threads"])
    assert out["summary"]["reduced_problems"] == 1 and out["summary"]["used"] == [1]
    assert any("timed at 1 thread(s), not 2, on 1 of 1 problem(s)" in ln for ln in out["headline"])
    assert out["after"] == 2


def test_a_one_thread_call_is_timed_by_its_threads_cpu_time():
    """time_rounds(one_thread=True): a call descheduled for 4 ms of its 5 ms wall time (its CPU
    time 1 ms, all of it the calling thread's) is timed 1 ms and counts as clean; a call during
    which another thread of ours worked too (process CPU 2 ms, the calling thread's 1 ms) keeps
    its wall time and its wait; without one_thread every call keeps its wall time."""
    from rawconv.bench import Clock, ratio, time_rounds

    def clock(calls):
        # per call: (wall, process cpu, own thread cpu, wait); each reader advances on its own
        seq = {"wall": [], "cpu": [], "own": [], "wait": []}
        w = c = o = q = 0.0
        for wall, cpu, own, wait in calls:
            seq["wall"] += [w, w + wall]
            seq["cpu"] += [c, c + cpu]
            seq["own"] += [o, o + own]
            seq["wait"] += [q, q + wait]
            w, c, o, q = w + wall, c + cpu, o + own, q + wait
        return Clock(wall=lambda: seq["wall"].pop(0), cpu=lambda: seq["cpu"].pop(0),
                     own=lambda: seq["own"].pop(0), wait=lambda: seq["wait"].pop(0))

    waited = (5e-3, 1e-3, 1e-3, 4e-3)
    t = time_rounds({"a": lambda: None}, rounds=2, calls=1, retries=0, warmup=0, one_thread=True,
                    clock=clock([waited, waited]))["a"]
    assert t.round_ms() == pytest.approx([1.0, 1.0]) and t.clean_rounds == 2 and t.flags() == []
    assert t.stats().median_ms == pytest.approx(1.0) and t.as_dict()["measure"] == "thread CPU"
    assert t.as_dict()["wall_ms"] == pytest.approx(5.0)   # the wall time is still recorded
    shared = (5e-3, 2e-3, 1e-3, 4e-3)
    t = time_rounds({"a": lambda: None}, rounds=3, calls=1, retries=0, warmup=0, one_thread=True,
                    clock=clock([shared] * 3))["a"]
    assert t.round_ms() == pytest.approx([5.0] * 3) and t.clean_rounds == 0 and t.as_dict()["measure"] == "wall"
    assert t.flags()[0].startswith("waited for a CPU")
    # the ratio of two one-thread rows descheduled differently is the ratio of their work
    base = time_rounds({"a": lambda: None}, rounds=2, calls=1, retries=0, warmup=0, one_thread=True,
                       clock=clock([(40e-3, 2e-3, 2e-3, 38e-3)] * 2))["a"]
    assert ratio(base, time_rounds({"a": lambda: None}, rounds=2, calls=1, retries=0, warmup=0, one_thread=True,
                                   clock=clock([waited, waited]))["a"]).value == pytest.approx(2.0)
    t = time_rounds({"a": lambda: None}, rounds=2, calls=1, retries=0, warmup=0, clock=clock([waited, waited]))["a"]
    assert t.round_ms() == pytest.approx([5.0, 5.0]) and t.as_dict()["measure"] == "wall"


def test_the_cli_fits_threads_unless_threads_is_given(tmp_path, capsys, monkeypatch, two_threads):
    """`rawconv compare` without --threads on a machine whose CPUs are taken (a busy sample):
    the problem runs at 1 thread and the headline and JSON say so; with --threads 2 it runs at 2
    (what was asked for), whatever the load."""
    from rawconv import cli

    busy = bench.LoadReport(0.3, 2, 2, 2.0, 0.0, 4.0)
    monkeypatch.setattr(bench, "sample_load", lambda s=0.3, t=None: busy)
    monkeypatch.setattr(bench.LoadMonitor, "report", lambda self: busy)
    monkeypatch.setattr(bench, "usable_cpus", lambda: 2)
    for extra, want in (([], 1), (["--threads", "2"], 2)):
        out = tmp_path / f"run{want}.json"
        code = cli.main(["compare", "mb1ic32ih32oc32oh32kh3ph1", "--device", "cpu", "--iterations", "2", "--warmup",
                         "0", "--budget", "0.05", "--no-ref", "--quiet", "--confirm-rounds", "2", "--width", "250",
                         "--json", str(out)] + extra)
        assert code == 0
        text = capsys.readouterr().out
        data = json.loads(out.read_text())
        assert {r["extra"]["threads"]["threads"] for r in data["rows"]} == {want}
        assert data["summary"]["threads"]["used"] == [want]
        if want == 1:
            assert "timed at 1 thread(s), not 2, on 1 of 1 problem(s)" in text
            assert "each problem is timed at the thread count that fits" in text
        else:
            assert "timed at 1 thread" not in text and "(--threads 1 or a quiet machine)" in text
