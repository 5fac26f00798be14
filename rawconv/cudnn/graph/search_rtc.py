"""The search's runtime compilations (a part of :mod:`rawconv.cudnn.graph.search`, the face, which hands
its names on): engines compiled at finalization run in background threads, at most
``_RTC_WORKERS`` at once per process (:func:`compile_in_background`, :func:`build_in_background`,
:func:`prefetch`), tried late when they end after their trial (:func:`try_late`). ``_RTC_WORKERS``,
``_rtc_inflight`` and :func:`compiling`, set on the face, are set here, where the other parts read them."""
from __future__ import annotations

import os
import threading
import time

from .search_plan import RTC, Config, SearchPlan, TimedConfig

# ---------------------------------------------------------------------------- runtime compilation
_RTC_WORKERS = max(2, min(8, os.cpu_count() or 2))  # runtime compilations running at once, per process
_rtc_lock = threading.Lock()
_rtc_inflight: dict = {}  # (id(plan), config name) -> perf_counter at its start, while it compiles


def rtc_busy() -> bool:
    """Whether the process already runs ``_RTC_WORKERS`` runtime compilations."""
    return len(_rtc_inflight) >= _RTC_WORKERS


def compiling(plan: SearchPlan) -> bool:
    """Whether a runtime compilation of ``plan`` is running."""
    with _rtc_lock:
        return any(k[0] == id(plan) for k in _rtc_inflight)


def try_late(plan: SearchPlan, late, trial, deadline: float, wait: bool) -> None:
    """Autotune's step 4b: try the rows ``late()`` returns (see :func:`worth_retry`) until
    ``deadline`` (perf_counter s); with ``wait``, while ``plan`` still has runtime compilations
    running, wait for them (5 ms polls) and try what they give."""
    while time.perf_counter() < deadline:
        todo = late()
        for r in todo:
            if time.perf_counter() >= deadline:
                return
            trial(r.config, r.phase)
        if not todo:
            if not wait or not compiling(plan):
                return
            time.sleep(0.005)


def worth_retry(plan: SearchPlan, row: TimedConfig) -> bool:
    """Whether an autotune row deserves another trial: an ``"over budget"`` runtime compilation
    that has finished since (the plan holds its execution plan), or one skipped while
    ``_RTC_WORKERS`` others compiled, now that there is room."""
    return row.status == "over budget" and (
        row.config.name in plan.built or (row.detail.startswith("skipped") and not rtc_busy()))


def compile_in_background(plan: SearchPlan, configs, timeout_s: float) -> list:
    """Finalize runtime-compiled engine configs at once, each in a thread of its own on the calling
    thread's cuDNN handle (as cudnn-frontend's multithreaded plan builds share one handle), at most
    ``_RTC_WORKERS`` in the process at a time (the rest are left for later), and wait at most
    ``timeout_s`` for them. A compilation still running then finishes in the background and the
    plan keeps its result; one that fails is recorded as :meth:`SearchPlan.build` does. Returns
    the names of the configs whose compilation this call started (not those built, failed or
    compiling already, nor those left for later)."""
    with _rtc_lock:
        todo = [ec for ec in configs if ec.name not in plan.built and ec.name not in plan.failed
                and (id(plan), ec.name) not in _rtc_inflight]
        todo = list({ec.name: ec for ec in todo}.values())[:max(0, _RTC_WORKERS - len(_rtc_inflight))]
        now = time.perf_counter()
        for ec in todo:
            _rtc_inflight[(id(plan), ec.name)] = now
    if not todo:
        return []
    handle = plan.handle()

    def work(ec):
        try:
            plan.build(ec, handle=handle)
        except BaseException:  # noqa: BLE001 - build() recorded why in plan.failed
            pass
        finally:
            with _rtc_lock:
                _rtc_inflight.pop((id(plan), ec.name), None)

    # not daemon threads: at exit the interpreter waits for a compilation still inside cuDNN
    # rather than tearing the process down under it
    threads = [threading.Thread(target=work, args=(ec,), name=f"rawconv-rtc-{ec.name}") for ec in todo]
    for t in threads:
        t.start()
    end = time.perf_counter() + timeout_s
    for t in threads:
        t.join(max(0.0, end - time.perf_counter()))
    return [ec.name for ec in todo]


PREFETCH = 2   # prefetch(): compilations started ahead for the next problem (of _RTC_WORKERS)


def prefetch(plan: SearchPlan, n: int = PREFETCH) -> list:
    """Start compiling, in background threads, the runtime-compiled configs among ``plan``'s first
    ``n`` configs of heuristic mode instant that the default filters allow, and return at once
    (the names of those it started: not those built, failed or compiling already). For a
    sequence of searches (``rawconv.nn.convert``'s autotune): the next problem's likely first
    candidates compile on idle CPU cores while this one is timed on the GPU, so that its search
    starts with them built (its trials wait for a compilation already running rather than start
    another). It leaves half of the ``_RTC_WORKERS`` (rounded up) free for the search in
    progress: on a host with few cores the prefetch would otherwise take every worker, and that
    search's runtime-compiled candidates would all be skipped."""
    if n < 1:
        return []
    todo = []
    for ec in plan.heuristic("instant")[:n]:
        if RTC in ec.behavior_notes and not plan.allowed(ec):   # autotune's default filters
            todo.append(ec)
    todo = [ec for ec in todo if ec.name not in plan.built and ec.name not in plan.failed
            and (id(plan), ec.name) not in _rtc_inflight]
    room = _RTC_WORKERS - (_RTC_WORKERS + 1) // 2 - len(_rtc_inflight)
    return compile_in_background(plan, todo[:max(0, room)], 0.0)


def build_in_background(plan: SearchPlan, ec: Config, timeout_s: float):
    """Finalize one runtime-compiled config through :func:`compile_in_background` (or wait for
    the compilation of it already running), at most ``timeout_s``. Returns ``(built, "")``, or
    ``(None, why)`` when it is still compiling (it finishes in the background) or when the
    process already runs ``_RTC_WORKERS`` compilations. Raises the build's
    :class:`NotSupportedError`."""
    b = plan.built.get(ec.name)
    if b is not None:
        return b, ""
    key = (id(plan), ec.name)
    if key in _rtc_inflight:
        end = time.perf_counter() + timeout_s
        while key in _rtc_inflight and time.perf_counter() < end:
            time.sleep(0.002)
    elif rtc_busy():
        return None, f"skipped: {len(_rtc_inflight)} runtime compilations already running"
    else:
        compile_in_background(plan, [ec], timeout_s)
    b = plan.built.get(ec.name)
    if b is not None:
        return b, ""
    if key in _rtc_inflight:
        return None, (f"runtime compilation still running after {timeout_s:.1f} s (the budget's end); "
                      f"it finishes in the background")
    return plan.build(ec), ""  # it failed: raises NotSupportedError with cuDNN's reason
