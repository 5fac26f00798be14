"""The autotune search of cuDNN graph plans, over a small plan interface (:class:`SearchPlan`).

:meth:`rawconv.cudnn_graph.GraphConvolution.autotune` validates its arguments
(:class:`SearchOptions`), looks the problem up in the tuning cache (:mod:`rawconv.tuning`) and,
on a miss, runs :func:`search` (or :func:`search_relayout`) on the plan. The search knows a plan
only through :class:`SearchPlan`, so the CPU tests drive it with a fake plan and no cuDNN.

Phases of :func:`search`, while the budget lasts (each logs a debug line on the
``rawconv.search`` logger: trials, rows, best time, seconds):

1. ``heuristic``: the configs of the plan's heuristic modes (instant, B, FALLBACK);
2. ``cache seed``: winners of other problems from the tuning cache (:func:`seed_configs`);
3. ``default knobs``: every engine with its default knobs, runtime-compiled engines last
   (compiled in background threads, :func:`compile_in_background`);
4. ``knob search``: neighbouring knob values of the fastest engines (:func:`knob_search`);
5. ``random knobs``: random knob combinations weighted to the fastest engines, a neighbour
   search (:func:`neighbours`) from each new best (:func:`random_search`);
6. ``late compilations``: runtime compilations that ended after their trial (:func:`try_late`);
7. ``final re-timing``: the best eight re-timed in interleaved rounds.

Rows are :class:`TimedConfig`; :func:`ranked` orders them (``ok`` by median time, then
mismatches, then the rest).
The code lives in its parts, each handing its names on through here (``rawconv.cudnn.graph.search.X``
as before the split): :mod:`.search_plan` (the plan interface, options, rows, timing, knob values),
:mod:`.search_rtc` (runtime compilations in the background), :mod:`.search_phases` (seeds, knob
search, random knobs) and :mod:`.search_run` (:class:`Search`, :func:`search`,
:func:`search_relayout`). What a test sets on this face (the timing functions, the runtime
compilations' state, :func:`search`) is set in the part that reads it
(:func:`rawconv.core.face.route_settings`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import os
import random
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

from ...core import progress as _progress
from ...core.autotune import check_budget as _check_budget
from ...core.errors import ArgumentError, LibraryError, NotSupportedError
from ...core.check import ErrorStats
from ...core.results import Result
from ...core.problem import ConvProblem

log = logging.getLogger("rawconv.search")

__all__ = ["SearchPlan", "Config", "Built", "SearchOptions", "TimedConfig", "Search", "search",
           "search_relayout", "seed_configs", "knob_search", "random_search", "neighbours", "try_late",
           "worth_retry", "compile_in_background", "build_in_background", "time_once", "time_reps",
           "knob_combinations", "knob_range", "knob_values", "ranked"]

from ...core.face import route_settings as _route_settings
from . import search_phases as _phases, search_plan as _plan, search_rtc as _rtc, search_run as _run
from .search_plan import (RTC, Config, Built, SearchPlan, _bad_int, SearchOptions, TimedConfig, ranked,  # noqa: F401
                          _logged, time_once, time_reps, time_interleaved, knob_combinations, knob_range,
                          knob_values)
from .search_rtc import (_RTC_WORKERS, _rtc_lock, _rtc_inflight, rtc_busy, compiling, try_late,  # noqa: F401
                         worth_retry, compile_in_background, PREFETCH, prefetch, build_in_background)
from .search_phases import (seed_configs, _best_by_engine, knob_search, _knob_base, _coordinate_pass,  # noqa: F401
                            neighbours, _RandomDraws, random_search)
from .search_run import OVERTIME_S, Search, search, search_relayout, _end_to_end  # noqa: F401

# name -> the part that reads it: set on this face (a test's monkeypatch.setattr(search, "time_reps", f)),
# it is set there
_SETTINGS = {"time_once": _plan, "time_reps": _plan, "time_interleaved": _plan, "_RTC_WORKERS": _rtc,
             "_rtc_inflight": _rtc, "compiling": _rtc, "search": _run, "search_relayout": _run}
_route_settings(__name__, _SETTINGS)   # (rawconv.core.face: unittest.mock.patch.object restores them too)
