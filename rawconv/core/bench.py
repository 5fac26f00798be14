"""Timers shared by autotune and compare, so that every number in a table means the same thing,
and the checks that say when those numbers are noise.

* :func:`time_cpu`: ``time.perf_counter`` around each call, after warm-up; median and min (ms).
* :func:`time_cuda`: CUDA events around each call on the current stream, after warm-up.
* :func:`usable_cpus`, :func:`default_threads`: how many CPUs this process may use (affinity and
  cgroup quota) and a thread count that does not oversubscribe them.
* :class:`LoadMonitor`: what the rest of the machine did while we timed (CPU time of other
  processes, the time our own threads waited for a CPU, the 1-minute load average), and
  :func:`timing_warnings`, which turns that and the median/min spread into warning lines.
* :func:`time_rounds`: **the measurement that survives load**, used by ``compare``, oneDNN's
  autotune (and so ``convert``'s CPU searches), ``replay``, ``describe`` and the examples:
  several callables timed in interleaved rounds, each call's wall time recorded beside the
  process CPU time and the time our threads waited on a run queue for a CPU; a round's time of a
  candidate is its fastest *clean* call (one during which our threads did not wait for a CPU).
  :func:`ratio` takes ratios within each round, then their median and interquartile range;
  :meth:`Timed.flags` says what was measured against a row (its rounds disagree; it waited for a
  CPU: wall time well above the CPU time it got). Choosing the best of N on one set of rounds
  and reporting it from fresh rounds (``compare``'s confirmation) removes the winner's curse;
  :func:`pick` chooses among a few carried candidates on half of the fresh rounds and reports
  from the other half, so the choice is not left to the luck of the first rounds either.
"""
from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

#: A timed result whose median exceeds its min by more than this factor is "unstable". Measured on
#: a shared 2-core EPYC (rawconv compare, 10 calls per row): rows timed while our threads did not
#: wait for a CPU had median/min 1.04 (median of 86 rows), 1.14 (90th percentile), 1.53 (max); rows
#: timed while they waited more than 60% of the time, 1.51, 27.5 and 112 (527 rows). A busy
#: machine can also give a spread near 1.0, every call a multiple of the 4 ms scheduler tick: the
#: load checks (:class:`LoadReport`), not the spread, catch that.
SPREAD_LIMIT = 1.5

#: The machine counts as oversubscribed when the CPUs other processes kept busy plus the threads
#: we run exceed the CPUs we may use by more than this (a fraction of a CPU: daemons, the shell).
#: 0.3 cried wolf on a quiet 2-core machine (load average 0.5, 0.3 of 2 CPUs busy elsewhere, our
#: waits 1%), marking every `rawconv compare resnet50` run unreliable; one CPU kept busy elsewhere
#: (the case that made timings land on scheduler ticks) is well above 0.5.
OVERSUBSCRIBED_SLACK = 0.5

#: ... or when our threads spent more than this fraction of the wall time (per timing thread)
#: waiting on a run queue for a CPU (``/proc/self/task/*/schedstat``). 5% fired on the same quiet
#: machine (waits of 6-7%: what a time slice for a daemon costs); a busy one measured 30-80%.
WAIT_LIMIT = 0.15

#: /proc/stat counts CPU time in clock ticks (10 ms at USER_HZ 100): over a shorter window one
#: stray tick reads as several CPUs kept busy. Below this many seconds of wall time, the CPU time
#: of other processes is not shown and does not make a report oversubscribed on its own.
MIN_WINDOW_S = 0.1


class TimingWarning(UserWarning):
    """Timings taken while the machine was oversubscribed or with a wide median/min spread."""


@dataclass(frozen=True)
class TimeStats:
    """Times of repeated calls, in milliseconds."""

    median_ms: float
    min_ms: float
    mean_ms: float
    runs: int

    @property
    def spread(self) -> float:
        """median / min (1.0 = every call took the same time; ``nan`` without a positive min)."""
        return spread(self.median_ms, self.min_ms)

    def __str__(self) -> str:
        return (f"median {self.median_ms:.4f} ms, min {self.min_ms:.4f} ms (median/min {self.spread:.2f}) "
                f"over {self.runs} runs")


def spread(median_ms: float, min_ms: float) -> float:
    """median / min of a timing; ``nan`` when either is missing or min is not positive."""
    if not (math.isfinite(median_ms) and math.isfinite(min_ms)) or min_ms <= 0:
        return float("nan")
    return median_ms / min_ms


def _stats(times_s: list[float]) -> TimeStats:
    ms = [t * 1e3 for t in times_s]
    return TimeStats(statistics.median(ms), min(ms), statistics.fmean(ms), len(ms))


def time_cpu(fn: Callable[[], object], iterations: int = 10, warmup: int = 2,
             budget_s: float | None = None) -> TimeStats:
    """Call ``fn`` ``warmup`` times, then time ``iterations`` calls one by one with
    ``time.perf_counter``. With ``budget_s``, stop early once that many seconds were spent in
    all (warm-up included; at least one timed call is always made). Returns :class:`TimeStats`
    in ms."""
    if iterations < 1:
        raise ValueError("iterations must be >= 1")
    start = time.perf_counter()
    for _ in range(max(warmup, 0)):
        fn()
        if budget_s is not None and time.perf_counter() - start > budget_s:
            break
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if budget_s is not None and time.perf_counter() - start > budget_s:
            break
    return _stats(times)


def time_cuda(fn: Callable[[], object], iterations: int = 20, warmup: int = 3,
              budget_s: float | None = None) -> TimeStats:
    """Time ``fn`` with CUDA events on the current stream: ``warmup`` calls, then
    ``iterations`` calls each between a pair of events; median and min of the elapsed times (ms).
    With ``budget_s``, stop early once that many seconds of wall time were spent."""
    import torch

    if iterations < 1:
        raise ValueError("iterations must be >= 1")
    for _ in range(max(warmup, 0)):
        fn()
    torch.cuda.synchronize()
    events = []
    t_begin = time.perf_counter()
    for _ in range(iterations):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        events.append((a, b))
        if budget_s is not None and time.perf_counter() - t_begin > budget_s:
            break
    torch.cuda.synchronize()
    return _stats([a.elapsed_time(b) / 1e3 for a, b in events])


def time_cuda_queued(fn: Callable[[], object], iterations: int = 20, warmup: int = 3,
                     repeats: int = 3) -> TimeStats:
    """GPU time per call of ``fn`` (ms), free of host gaps: the GPU is held busy
    (``torch.cuda._sleep``) while ``iterations`` calls are queued, and CUDA events around the
    queued calls time only the GPU work. Returns :class:`TimeStats` over ``repeats`` loops (each
    value a per-call mean over the loop). Use it to compare kernels whose host cost per call
    exceeds their GPU time (small problems; cuDNN's legacy entry points): per-call event pairs
    would time the host instead."""
    import torch

    if iterations < 1:
        raise ValueError("iterations must be >= 1")
    t0 = time.perf_counter()
    for _ in range(max(warmup, 1)):
        fn()
    host = (time.perf_counter() - t0) / max(warmup, 1)
    torch.cuda.synchronize()
    cycles = int(min(max(4 * host * iterations * 2e9, 5e5), 2e9))   # ~2 GHz: 4x the host time of the loop
    per = []
    for _ in range(repeats):
        torch.cuda._sleep(cycles)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iterations):
            fn()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) / iterations)
    per.sort()
    return TimeStats(per[len(per) // 2], per[0], sum(per) / len(per), len(per) * iterations)


def wall_us_per_call(fn: Callable[[], object], calls: int = 2000, repeats: int = 5, warmup: int = 100) -> float:
    """Microseconds per call of ``fn``: ``warmup`` calls, then the best of ``repeats`` loops of
    ``calls`` back-to-back calls with one ``torch.cuda.synchronize`` at the end of each (bounded
    by the slower of host and GPU; for a tiny problem, the host's cost per call)."""
    import torch

    for _ in range(max(warmup, 0)):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def geomean(values) -> float:
    """Geometric mean of the positive, finite values; ``nan`` when there are none."""
    vals = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else float("nan")


# --------------------------------------------------------------------------- how busy is the machine
def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask (``os.sched_getaffinity``), capped by a
    cgroup v2 CPU quota (``/sys/fs/cgroup/cpu.max``, rounded up) when one is set. At least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def default_threads() -> int:
    """Threads for timing that do not oversubscribe the machine: the CPUs this process may use
    (:func:`usable_cpus`), capped by torch's thread count (``torch.get_num_threads()``, which
    ``OMP_NUM_THREADS`` sets). It does not shrink for other processes' load: that is reported
    (:class:`LoadMonitor`), so runs on one machine stay comparable."""
    import torch

    return max(1, min(usable_cpus(), torch.get_num_threads()))


def _allowed_cpu_ids() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover
        return None


def _busy_seconds(cpus: set[int] | None) -> float | None:
    """Seconds the given CPUs spent busy since boot (/proc/stat: everything but idle and iowait;
    steal counts as busy, the hypervisor took the CPU). None where /proc/stat is unreadable."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        v = [int(t) for t in rest.split()]
        # user nice system idle iowait irq softirq steal (guest is already in user)
        total += sum(v[:8]) - v[3] - v[4]
    return total / hz


def _self_wait_seconds() -> float | None:
    """Seconds this process's threads spent runnable but waiting for a CPU (sum over threads,
    ``/proc/self/task/*/schedstat``, second field, ns). None where schedstat is missing."""
    total, seen = 0, False
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                total += int(f.read().split()[1])
                seen = True
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9 if seen else None


def _self_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def loadavg_1min() -> float | None:
    """The 1-minute load average (``os.getloadavg``), or None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover
        return None


@dataclass(frozen=True)
class LoadReport:
    """What the machine did between two points in time (see :class:`LoadMonitor`).

    ``seconds``: wall time covered; ``cpus``: CPUs this process may use; ``threads``: threads we
    timed with; ``other_cpus``: CPUs kept busy on average by other processes on our CPUs (their
    CPU time / wall time; None without /proc/stat); ``waited``: seconds our threads waited for a
    CPU per second of wall time, summed over threads (None without schedstat; divided by
    ``threads`` it is the fraction of the time a timing thread waited); ``loadavg``: the
    1-minute load average at the end (it lags and counts our own threads too).
    """

    seconds: float
    cpus: int
    threads: int
    other_cpus: float | None
    waited: float | None
    loadavg: float | None

    @property
    def other_cpus_known(self) -> bool:
        """``other_cpus`` was measured over at least :data:`MIN_WINDOW_S` (enough clock ticks of
        /proc/stat to mean something)."""
        return self.other_cpus is not None and self.seconds >= MIN_WINDOW_S

    @property
    def oversubscribed(self) -> bool:
        """Other processes' CPUs plus our threads exceeded our CPUs (beyond
        :data:`OVERSUBSCRIBED_SLACK`), or our threads waited for a CPU more than
        :data:`WAIT_LIMIT` of the time. Other processes' CPUs count only over a window of at least
        :data:`MIN_WINDOW_S`. Falls back to the load average when neither is known."""
        other = self.other_cpus if self.other_cpus_known else None
        if other is None and self.waited is None:
            return self.loadavg is not None and self.loadavg > self.cpus + OVERSUBSCRIBED_SLACK
        busy = other is not None and other + self.threads > self.cpus + OVERSUBSCRIBED_SLACK
        waited = self.waited is not None and self.waited / max(self.threads, 1) > WAIT_LIMIT
        return busy or waited

    def describe(self, timing: bool = True) -> str:
        """One line: e.g. ``other processes kept 1.0 of 2 CPUs busy while 2 threads timed;
        our threads waited for a CPU 31% of the time; 1-minute load average 2.9``.
        ``timing=False``: a sample taken while we did not run (no thread count, no waits)."""
        parts = []
        if self.other_cpus_known:
            parts.append(f"other processes kept {min(self.other_cpus, self.cpus):.1f} of {self.cpus} CPUs busy"
                         + (f" while {self.threads} thread{'s' if self.threads != 1 else ''} timed" if timing else ""))
        if self.waited is not None and timing:
            parts.append(f"our threads waited for a CPU {100 * self.waited / max(self.threads, 1):.0f}% of the time")
        if self.loadavg is not None:
            parts.append(f"1-minute load average {self.loadavg:.1f}")
        return "; ".join(parts)

    def as_dict(self) -> dict:
        return {"seconds": self.seconds, "cpus": self.cpus, "threads": self.threads, "other_cpus": self.other_cpus,
                "waited": self.waited, "loadavg": self.loadavg, "oversubscribed": self.oversubscribed}


class LoadMonitor:
    """Measures what the rest of the machine does while we time: create (or :meth:`reset`) before
    timing, call :meth:`report` after. Reads ``/proc/stat`` (busy time of the CPUs in our affinity
    mask, minus our own CPU time), ``/proc/self/task/*/schedstat`` (time our threads waited on a
    run queue) and ``os.getloadavg``; each read costs microseconds, nothing samples in between."""

    def __init__(self, threads: int | None = None):
        self.threads = threads
        self.reset()

    def reset(self) -> None:
        self._cpus = _allowed_cpu_ids()
        self._t0 = time.perf_counter()
        self._busy0 = _busy_seconds(self._cpus)
        self._self0 = _self_cpu_seconds()
        self._wait0 = _self_wait_seconds()

    def report(self) -> LoadReport:
        import torch

        dt = max(time.perf_counter() - self._t0, 1e-9)
        busy1, self1, wait1 = _busy_seconds(self._cpus), _self_cpu_seconds(), _self_wait_seconds()
        other = None
        cpus = usable_cpus()
        if self._busy0 is not None and busy1 is not None:
            # jiffies are 10 ms: clamp the small negative values rounding gives on short windows, and
            # never more CPUs than there are (a tick or two over a few milliseconds reads as several)
            other = min(float(cpus), max(0.0, ((busy1 - self._busy0) - (self1 - self._self0)) / dt))
        waited = (wait1 - self._wait0) / dt if self._wait0 is not None and wait1 is not None else None
        threads = self.threads if self.threads is not None else torch.get_num_threads()
        return LoadReport(dt, cpus, threads, other, waited, loadavg_1min())


def suggested_threads(report: LoadReport) -> int:
    """Threads that would have fit beside the other processes of ``report`` (at least 1; at most
    ``report.threads``, so equal to it when fewer threads would not help)."""
    other = report.other_cpus if report.other_cpus_known else 0.0
    return max(1, min(report.threads, report.cpus - math.ceil((other or 0) - OVERSUBSCRIBED_SLACK)))


def sample_load(seconds: float = 0.3, threads: int | None = None) -> LoadReport:
    """What the rest of the machine does while we do nothing: a :class:`LoadMonitor` over
    ``seconds`` of sleep (``threads``: the count the report judges; default torch's)."""
    mon = LoadMonitor(threads)
    time.sleep(seconds)
    return mon.report()


@dataclass(frozen=True)
class ThreadFit:
    """:func:`fit_threads`'s answer: ``threads`` to time with, ``requested`` the count asked for,
    ``report`` the load it was judged on (None: not judged)."""

    requested: int
    threads: int
    report: LoadReport | None

    @property
    def reduced(self) -> bool:
        """The machine could not give ``requested`` threads: fewer are used."""
        return self.threads < self.requested

    def describe(self) -> str:
        """e.g. ``1 thread, not 2: other processes kept 2.0 of 2 CPUs busy``."""
        if not self.reduced:
            return f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        why = self.report.describe(timing=False) if self.report is not None else ""
        return (f"{self.threads} thread{'s' if self.threads != 1 else ''}, not {self.requested}"
                + (f": {why}" if why else ""))

    def as_dict(self) -> dict:
        return {"requested": self.requested, "threads": self.threads, "reduced": self.reduced,
                "load": self.report.as_dict() if self.report is not None else None}


def fit_threads(requested: int, report: LoadReport | None) -> ThreadFit:
    """The thread count that fits beside the other processes of ``report``
    (:func:`suggested_threads` judged at ``requested`` threads): ``requested`` when they leave
    room for it (or nothing is known of them), fewer otherwise, at least 1.

    Why: an OpenMP call of k threads joins its threads at the end of each parallel region (oneDNN:
    one per reorder and one per convolution). When the CPUs are taken, a thread waits at each join
    for its partner to get a CPU back, a whole scheduler slice: beside two spinning processes on 2
    cores, a 1.5-3 ms ResNet-50 layer at 2 threads took 60-100 ms (torch's call and oneDNN's first
    choice: 4 parallel regions, 8 context switches per call) and ``x64:gemm:jit`` 15-28 ms (one
    region, 2 switches), while every row at 1 thread took 1.4-2.9 ms, as on a quiet machine
    (``benchmarks/diag_load_threads.py``). Timing both sides at the count that fits measures
    the code; timing at the count asked for measures how many joins a call has."""
    requested = max(1, int(requested))
    if report is None or requested == 1 or not report.other_cpus_known:
        return ThreadFit(requested, requested, report)
    import dataclasses

    return ThreadFit(requested, suggested_threads(dataclasses.replace(report, threads=requested, waited=None)),
                     report)


def load_hint(report: LoadReport, hint: str | None = None) -> str:
    """What to do about an oversubscribed ``report``: ``hint`` with ``{threads}`` replaced by
    :func:`suggested_threads` (default ``"torch.set_num_threads({threads}) or a quiet machine"``),
    or just ``"a quiet machine"`` when that thread count is the one already used (fewer threads
    would not fit, or the run already used one)."""
    hint = hint or "torch.set_num_threads({threads}) or a quiet machine"
    if "{threads}" not in hint:
        return hint
    n = suggested_threads(report)
    return hint.format(threads=n) if n < report.threads else "a quiet machine"


def timing_warnings(report: LoadReport | None, spreads: Iterable[float], *, limit: float = SPREAD_LIMIT,
                    hint: str | None = None) -> list[str]:
    """Warning lines for a set of timings: one when ``report`` says the machine was oversubscribed,
    one when some median/min ``spreads`` exceed ``limit``. Empty when the timings look sound.
    ``hint`` ends the first line (:func:`load_hint`: ``{threads}`` in it becomes
    :func:`suggested_threads`, or the whole hint ``"a quiet machine"`` when that is the thread
    count already used)."""
    out = []
    if report is not None and report.oversubscribed:
        out.append(f"machine oversubscribed: {report.describe()}; times include waits for a CPU "
                   f"({load_hint(report, hint)})")
    sp = [v for v in spreads if math.isfinite(v)]
    wide = [v for v in sp if v > limit]
    if wide:
        out.append(f"unstable timings: {len(wide)} of {len(sp)} timed results have median/min above {limit:g} "
                   f"(worst {max(wide):.1f}); compare min beside median")
    return out


# --------------------------------------------------------------------------- interleaved rounds
#: A call is *clean* when our threads waited on a run queue for a CPU (``/proc/self/task/*/schedstat``,
#: summed over threads) at most this fraction of its wall time plus :data:`CLEAN_SLACK_S`. On a
#: shared 2-core EPYC, a 1-ms convolution at 2 threads beside one busy process took 1.2-1.6 ms in
#: its clean calls and 30-90 ms in the others (each a whole scheduler slice of the other process):
#: the clean calls are the ones that measured the convolution.
CLEAN_WAIT = 0.02
CLEAN_SLACK_S = 20e-6

#: Where schedstat is missing (no run-queue times): a call whose process CPU time is below this
#: fraction of its wall time waited (less than one CPU's worth of work in the time it took).
CPU_SHARE_MIN = 0.5

#: A row whose per-round times have an interquartile range above this fraction of their median is
#: flagged "rounds disagree" (on the quiet EPYC, 2-9% for rows of 0.1-30 ms).
ROUNDS_DISAGREE = 0.25


@dataclass(frozen=True)
class Clock:
    """Where :func:`time_rounds` reads its times (seconds): ``wall`` (``time.perf_counter``),
    ``cpu`` (``time.process_time``: CPU time of every thread of this process), ``wait`` (the
    run-queue time of this process's threads, :func:`_self_wait_seconds`, or None) and ``own``
    (``time.thread_time``: CPU time of the calling thread, read for ``time_rounds(one_thread=True)``).
    Tests pass a fake one."""

    wall: Callable[[], float] = time.perf_counter
    cpu: Callable[[], float] = time.process_time
    wait: Callable[[], float | None] = None   # type: ignore[assignment]  (the schedstat reader)
    own: Callable[[], float] = time.thread_time


#: ``time_rounds(one_thread=True)``: a call's time is the CPU time of the calling thread when the
#: process's CPU time during it was at most this factor of it (plus :data:`CLEAN_SLACK_S`): no other
#: thread of ours worked, so the calling thread did the whole call.
ONE_THREAD_CPU = 1.1


@dataclass(frozen=True)
class Call:
    """One timed call: ``wall_s`` (wall time), ``cpu_s`` (CPU time of this process, all threads),
    ``wait_s`` (time our threads waited for a CPU; None where the OS does not say) and
    ``own_s``: set only for a call timed on one thread (``time_rounds(one_thread=True)``) during
    which no other thread of ours worked, the calling thread's CPU time, which is then the
    call's time (:attr:`time_s`): the work of its one thread, without the time it spent
    descheduled (on a quiet machine the two agree)."""

    wall_s: float
    cpu_s: float
    wait_s: float | None
    own_s: float | None = None

    @property
    def time_s(self) -> float:
        """The call's time: ``own_s`` where set, else ``wall_s``."""
        return self.own_s if self.own_s is not None else self.wall_s

    @property
    def clean(self) -> bool:
        """Its time holds no wait for a CPU: a call timed by its one thread's CPU time
        (``own_s``) always; otherwise our threads did not wait for a CPU during it
        (:data:`CLEAN_WAIT`), or, without run-queue times, its CPU time was at least
        :data:`CPU_SHARE_MIN` of its wall time."""
        if self.own_s is not None:
            return True
        if self.wait_s is None:
            return self.cpu_s >= CPU_SHARE_MIN * self.wall_s
        return self.wait_s <= CLEAN_WAIT * self.wall_s + CLEAN_SLACK_S


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, linearly interpolated; ``nan`` when empty."""
    v = sorted(x for x in values if isinstance(x, (int, float)) and math.isfinite(x))
    if not v:
        return float("nan")
    pos = q * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


@dataclass
class Timed:
    """One candidate's calls in :func:`time_rounds`: ``rounds[r]`` holds its :class:`Call` s of
    round ``r`` (every candidate has one entry per round, so rounds line up across candidates; an
    empty one: a round it sat out, its budget spent)."""

    name: str
    rounds: list = field(default_factory=list)

    @property
    def calls(self) -> list:
        return [c for rnd in self.rounds for c in rnd]

    def round_clean(self) -> list:
        """Per round: whether it had a clean call (None for a round it sat out)."""
        return [any(c.clean for c in rnd) if rnd else None for rnd in self.rounds]

    @property
    def timed_rounds(self) -> int:
        """The rounds in which it was called."""
        return sum(bool(rnd) for rnd in self.rounds)

    def round_ms(self) -> list[float]:
        """Per round, in ms: its fastest clean call, else (every call waited) its fastest call
        (:attr:`Call.time_s`)."""
        out = []
        for rnd in self.rounds:
            clean = [c.time_s for c in rnd if c.clean]
            out.append(1e3 * min(clean or [c.time_s for c in rnd]) if rnd else float("nan"))
        return out

    @property
    def clean_rounds(self) -> int:
        return sum(c is True for c in self.round_clean())

    def stats(self) -> TimeStats:
        """``median_ms``: the median over rounds of :meth:`round_ms` (from the clean rounds when
        most rounds had a clean call); ``min_ms``: the fastest call; ``mean_ms``: the mean of
        every call; ``runs``: the number of calls."""
        per = self._used_round_ms()
        walls = [c.time_s * 1e3 for c in self.calls]
        if not walls:
            nan = float("nan")
            return TimeStats(nan, nan, nan, 0)
        return TimeStats(statistics.median(per), min(walls), statistics.fmean(walls), len(walls))

    def _used_round_ms(self) -> list[float]:
        per, clean = self.round_ms(), self.round_clean()
        timed = [t for t in per if math.isfinite(t)]
        kept = [t for t, c in zip(per, clean) if c]
        return kept if 2 * len(kept) >= len(timed) and kept else timed

    def waited_share(self) -> float | None:
        """The fraction of our threads' run time spent waiting for a CPU over every call:
        wait / (wait + CPU time). None without run-queue times."""
        calls = self.calls
        if not calls or any(c.wait_s is None for c in calls):
            return None
        wait = sum(c.wait_s for c in calls)
        cpu = sum(c.cpu_s for c in calls)
        return wait / (wait + cpu) if wait + cpu > 0 else 0.0

    def wall_cpu_ms(self) -> tuple[float, float]:
        """(median wall time, median process CPU time) per call, in ms."""
        calls = self.calls
        if not calls:
            return float("nan"), float("nan")
        return (statistics.median(c.wall_s for c in calls) * 1e3, statistics.median(c.cpu_s for c in calls) * 1e3)

    def disagreement(self) -> float:
        """Interquartile range of the per-round times over their median (``nan`` below 3 rounds)."""
        per = self._used_round_ms()
        if len(per) < 3:
            return float("nan")
        med = statistics.median(per)
        return (percentile(per, 0.75) - percentile(per, 0.25)) / med if med > 0 else float("nan")

    def flags(self) -> list[str]:
        """What was measured against this candidate's time (empty when nothing):
        ``"waited for a CPU: ..."`` when most rounds had no clean call (its time then includes
        waits: wall time well above the CPU time it got), ``"rounds disagree: ..."`` when its
        per-round times spread (:data:`ROUNDS_DISAGREE`)."""
        out = []
        n = self.timed_rounds
        if n and 2 * self.clean_rounds < n:
            wall, cpu = self.wall_cpu_ms()
            share = self.waited_share()
            why = f"our threads waited {100 * share:.0f}% of their run time; " if share is not None else ""
            out.append(f"{WAITED}: no clean call in {n - self.clean_rounds} of {n} rounds ({why}per call "
                       f"wall {wall:.3g} ms, CPU {cpu:.3g} ms)")
        d = self.disagreement()
        if math.isfinite(d) and d > ROUNDS_DISAGREE:
            per = self._used_round_ms()
            out.append(f"{DISAGREE}: per-round times {percentile(per, 0.25):.3g}-{percentile(per, 0.75):.3g} ms "
                       f"around {statistics.median(per):.3g} ms")
        return out

    def as_dict(self) -> dict:
        """JSON-friendly: rounds, per-round ms and cleanliness, calls, clean calls, median wall and
        CPU ms per call, the waited share and :meth:`flags`."""
        wall, cpu = self.wall_cpu_ms()
        own = sum(c.own_s is not None for c in self.calls)
        return {"rounds": self.timed_rounds, "round_ms": self.round_ms(), "round_clean": self.round_clean(),
                "calls": len(self.calls), "clean_calls": sum(c.clean for c in self.calls),
                "wall_ms": wall, "cpu_ms": cpu, "waited_share": self.waited_share(), "flags": self.flags(),
                # what a call's time is: "wall" time, or its one thread's CPU time ("thread CPU"; "mixed": some)
                "measure": "wall" if not own else "thread CPU" if own == len(self.calls) else "mixed"}


@dataclass(frozen=True)
class Ratio:
    """``base`` time / ``other`` time taken within each round: ``value`` is their median,
    ``lo``/``hi`` their 25th and 75th percentiles (the interquartile range), ``rounds`` how many
    rounds it used, ``clean`` whether those were rounds where both sides had a clean call,
    ``per_round`` the ratios themselves."""

    value: float
    lo: float
    hi: float
    rounds: int
    clean: bool
    per_round: tuple

    def as_dict(self) -> dict:
        return {"value": self.value, "lo": self.lo, "hi": self.hi, "rounds": self.rounds, "clean": self.clean,
                "per_round": list(self.per_round)}

    def __str__(self) -> str:
        return f"{self.value:.2f}x [{self.lo:.2f}-{self.hi:.2f}]"


def ratio(base: Timed, other: Timed) -> Ratio | None:
    """``base``'s time over ``other``'s, round by round (:meth:`Timed.round_ms`), from the rounds
    where both had a clean call when those are at least half of them, else from every round.
    None when no round timed both."""
    bt, ot, bc, oc = base.round_ms(), other.round_ms(), base.round_clean(), other.round_clean()
    pairs = [(a / b, bool(ca and cb)) for a, b, ca, cb in zip(bt, ot, bc, oc)
             if math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0]
    if not pairs:
        return None
    clean = [v for v, c in pairs if c]
    use, is_clean = (clean, True) if clean and 2 * len(clean) >= len(pairs) else ([v for v, _ in pairs], False)
    return Ratio(statistics.median(use), percentile(use, 0.25), percentile(use, 0.75), len(use), is_clean,
                 tuple(use))


def measure_call(fn: Callable[[], object], clock: Clock | None = None) -> tuple[object, Call]:
    """Call ``fn`` once and return ``(its result, the Call)``: wall time, process CPU time and
    the time our threads waited for a CPU during it (what :func:`time_rounds` records per call;
    for a loop of one's own, e.g. a training step per variant in turn, into :class:`Timed`)."""
    clk = clock or Clock()
    wait = clk.wait or _self_wait_seconds
    w0 = wait()
    c0 = clk.cpu()
    t0 = clk.wall()
    out = fn()
    t1 = clk.wall()
    c1 = clk.cpu()
    w1 = wait()
    return out, Call(t1 - t0, c1 - c0, (w1 - w0) if w0 is not None and w1 is not None else None)


#: :func:`round_plan`'s most rounds: ``iterations`` calls per candidate are spread over at most this many
MAX_ROUNDS = 5


def round_plan(iterations: int, max_rounds: int = MAX_ROUNDS) -> tuple[int, int]:
    """``(rounds, calls per round)`` that spread ``iterations`` timed calls per candidate over at
    most ``max_rounds`` interleaved rounds (10 -> 5 rounds of 2; 3 -> 3 of 1)."""
    it = max(1, int(iterations))
    rounds = min(it, max_rounds)
    return rounds, math.ceil(it / rounds)


def time_rounds(candidates, *, rounds: int = 5, calls: int = 2, retries: int | None = None, warmup: int = 1,
                budget_s: float | None = None, min_rounds: int = 3, sit_out: bool = True, pairs: bool = False,
                one_thread: bool = False, clock: Clock | None = None) -> dict[str, Timed]:
    """Time several callables in interleaved rounds: ``candidates`` maps a name to ``fn`` or to
    ``(fn, setup)`` (``setup()`` runs untimed before the candidate's calls in each round, e.g. a
    plan's ``select``). After ``warmup`` untimed calls each, every round calls each candidate in
    turn (the order rotates from round to round) until it has ``calls`` clean calls, or
    ``calls`` calls with at least one clean, or ``calls + retries`` calls (default ``retries =
    calls``): a call during which our threads waited for a CPU is tried again. With
    ``budget_s``, a candidate's calls in one round stop after ``budget_s / rounds`` seconds (at
    least one call), a candidate that has spent ``budget_s`` (its warm-up included) sits out the
    rounds left (after at least one; not with ``sit_out=False``), and after ``min_rounds`` rounds
    the rounds stop once every candidate has (calls that wait for whole scheduler slices on a busy
    machine, a slow reference implementation: fewer calls, each row flagged by what its calls
    measured). With ``pairs``, rounds ``2m`` and ``2m + 1`` share an order (it rotates every
    two rounds), so that the odd and the even rounds (:func:`pick`) see the same orders. Each call
    records wall time (``time.perf_counter``), process CPU time
    (``time.process_time``) and the time our threads waited for a CPU (schedstat). With
    ``one_thread`` (the candidates run on one thread: ``torch.set_num_threads(1)``), also the
    calling thread's CPU time (``time.thread_time``), which becomes the call's time where no
    other thread of ours worked during it (:attr:`Call.own_s`): on a busy machine a one-thread
    call is descheduled now and then, and its wall time then counts the other processes' time
    slices; its thread's CPU time counts its own work only. Returns
    ``{name: Timed}`` in the order given (:meth:`Timed.stats`, :func:`ratio`,
    :meth:`Timed.flags`). Raises ValueError for ``rounds`` or ``calls`` below 1."""
    if rounds < 1 or calls < 1:
        raise ValueError("rounds and calls must be >= 1")
    retries = calls if retries is None else max(0, retries)
    clk = clock or Clock()
    wait = clk.wait or _self_wait_seconds
    items = []
    for name, c in (candidates.items() if isinstance(candidates, dict) else candidates):
        fn, setup = c if isinstance(c, tuple) else (c, None)
        items.append((name, fn, setup))
    out = {name: Timed(name) for name, _, _ in items}
    spent_all = {name: 0.0 for name, _, _ in items}
    for name, fn, setup in items:
        if warmup > 0:
            if setup is not None:
                setup()
            t0 = clk.wall()
            for _ in range(warmup):
                fn()
            spent_all[name] += clk.wall() - t0
    per_round = budget_s / rounds if budget_s else None
    n = len(items)
    for r in range(rounds):
        if budget_s and r >= max(1, min_rounds) and all(v >= budget_s for v in spent_all.values()):
            break
        for k in range(n):
            name, fn, setup = items[(k + (r // 2 if pairs else r)) % n]
            if sit_out and budget_s and spent_all[name] >= budget_s and out[name].timed_rounds:
                out[name].rounds.append([])   # its budget spent: it sits this round out
                continue
            if setup is not None:
                setup()
            got: list = []
            clean = 0
            spent = 0.0
            while True:
                w0 = wait()
                c0 = clk.cpu()
                o0 = clk.own() if one_thread else 0.0
                t0 = clk.wall()
                fn()
                t1 = clk.wall()
                o1 = clk.own() if one_thread else 0.0
                c1 = clk.cpu()
                w1 = wait()
                own = o1 - o0 if one_thread and c1 - c0 <= ONE_THREAD_CPU * (o1 - o0) + CLEAN_SLACK_S else None
                call = Call(t1 - t0, c1 - c0, (w1 - w0) if w0 is not None and w1 is not None else None, own)
                got.append(call)
                clean += call.clean
                spent += call.wall_s
                if (clean >= calls or (clean and len(got) >= calls) or len(got) >= calls + retries
                        or (per_round is not None and spent >= per_round)):
                    break
            out[name].rounds.append(got)
            spent_all[name] += spent
    return out


def fastest(timed: dict, names: Iterable[str] | None = None) -> str | None:
    """The name among ``names`` (default: all) of ``timed`` with the smallest median time
    (:meth:`Timed.stats`); None when none has one."""
    best, best_ms = None, float("inf")
    for n in (names if names is not None else timed):
        ms = timed[n].stats().median_ms
        if math.isfinite(ms) and ms < best_ms:
            best, best_ms = n, ms
    return best


def rounds_of(t: Timed, parity: int) -> Timed:
    """``t`` with only its rounds whose index is ``parity`` modulo 2 (0: the even rounds, the
    first, third, ...; 1: the odd ones); the others are left empty, as rounds it sat out, so that
    :func:`ratio` of two such halves pairs the same rounds."""
    return Timed(t.name, [rnd if i % 2 == parity else [] for i, rnd in enumerate(t.rounds)])


@dataclass(frozen=True)
class Pick:
    """:func:`pick`'s answer: ``name`` the candidate chosen, ``ratio`` base / it over the rounds
    it is reported from (the even ones when there was a choice, ``split``; every round when one
    candidate only), ``choice`` base / each candidate over the rounds the choice used (the odd
    ones; empty without a choice)."""

    name: str | None
    ratio: Ratio | None
    choice: dict
    split: bool

    def as_dict(self) -> dict:
        return {"name": self.name, "ratio": self.ratio.as_dict() if self.ratio is not None else None,
                "choice": {k: (q.as_dict() if q is not None else None) for k, q in self.choice.items()},
                "rounds": "even" if self.split else "all"}


def pick(base: Timed, timed: dict, names: Sequence[str]) -> Pick:
    """Choose among ``names`` (keys of ``timed``, fastest first by the rounds that carried them)
    the one with the largest median ratio ``base`` / it over the odd rounds (the second, fourth,
    ...), and report its ratio over the even rounds only: the choice and the figure never share a
    round, so the noise that made it win does not inflate its figure (no winner's curse), and a
    candidate that the carrying rounds ranked second by luck is still chosen when it is the
    fastest. One name (or none with an odd round): no choice, its ratio over every round. A tie
    keeps the order given. Time them with ``time_rounds(..., pairs=True)`` so that both halves
    see the same call orders."""
    names = [n for n in names if n in timed]
    if not names:
        return Pick(None, None, {}, False)
    choice = {n: ratio(rounds_of(base, 1), rounds_of(timed[n], 1)) for n in names} if len(names) > 1 else {}
    scored = [(q.value, -i, n) for i, (n, q) in enumerate(choice.items()) if q is not None]
    if not scored:
        return Pick(names[0], ratio(base, timed[names[0]]), choice, False)
    name = max(scored)[2]
    return Pick(name, ratio(rounds_of(base, 0), rounds_of(timed[name], 0)), choice, True)


def geomean_interval(per_problem: Sequence[Sequence[float]], *, level: float = 0.9, resamples: int = 400,
                     seed: int = 0) -> tuple[float, float] | None:
    """A percentile bootstrap interval (``level``: 0.9 = the 5th to 95th percentile) for the
    geometric mean over problems of each problem's median per-round ratio: each resample draws
    every problem's per-round ratios with replacement (a fixed ``seed``: the same rounds give
    the same interval). None without any positive ratio."""
    import random

    lists = [[v for v in vs if isinstance(v, (int, float)) and math.isfinite(v) and v > 0] for vs in per_problem]
    lists = [v for v in lists if v]
    if not lists:
        return None
    rng = random.Random(seed)
    vals = []
    for _ in range(resamples):
        logs = 0.0
        for v in lists:
            logs += math.log(statistics.median([v[rng.randrange(len(v))] for _ in v]))
        vals.append(math.exp(logs / len(lists)))
    a = (1.0 - level) / 2
    return percentile(vals, a), percentile(vals, 1.0 - a)


WAITED = "waited for a CPU"    # the start of a row's flag: most of its rounds had no clean call
DISAGREE = "rounds disagree"    # the start of a row's flag: its per-round times spread


def flag_kind(flag: str) -> str | None:
    """What one row flag (:meth:`Timed.flags`, or :attr:`rawconv.results.Result.timing_flags`, where
    a confirmation's flags start ``"fresh rounds: "``) says in one word: ``"waited"``, ``"spread"``
    (rounds disagree, or a median/min above the limit), ``"busy"`` (the machine was oversubscribed)
    or None."""
    f = flag.removeprefix("fresh rounds: ")
    if f.startswith(WAITED):
        return "waited"
    if f.startswith(DISAGREE) or f.startswith("median/min"):
        return "spread"
    return "busy" if "oversubscribed" in f else None


def flag_warnings(flags: Iterable[Sequence[str]]) -> list[str]:
    """Warning lines for rows flagged by what was measured (each item: one row's
    :meth:`Timed.flags`): how many rows waited for a CPU, how many had rounds that disagree."""
    flags = [list(f) for f in flags]
    waited = sum(any(x.startswith(WAITED) for x in f) for f in flags)
    disagree = sum(any(x.startswith(DISAGREE) for x in f) for f in flags)
    out = []
    if waited:
        out.append(f"waited for a CPU: {waited} of {len(flags)} timed results had no clean call (one during which "
                   "our threads did not wait for a CPU) in most rounds: their times include waits")
    if disagree:
        out.append(f"rounds disagree: {disagree} of {len(flags)} timed results have per-round times whose "
                   f"interquartile range exceeds {100 * ROUNDS_DISAGREE:.0f}% of their median")
    return out
