"""The child's side of :mod:`rawconv.onednn.isolated`: what a :mod:`rawconv.core.isolate` worker runs
by name (:func:`setup`: build the plan, plain or fused, and list its implementations; :func:`run`:
run one implementation and free its buffers). The parent never imports this module: it names these
functions to the worker."""
from __future__ import annotations

import os
import time

from ..core import env as _env
from ..core.isolate import trim_worker_heap
from .isolated import CRASH_ENV, GUARD_BYTES
from .plan import Convolution
from .primitive import _Built

__all__ = ["setup", "run"]


_child_plans: dict = {}


def setup(key, problem, direction, algorithm, fpmath, w_layout, prepack, tensors, plan_threads="auto",
          post_ops=()) -> list:
    """(child) Build the plan of ``problem`` and keep it with ``tensors`` under ``key``; return its
    implementation list (listing runs oneDNN's primitive-descriptor iterator, here in the child).
    ``plan_threads``: the parent plan's ``threads`` argument; ``post_ops``: the parent plan's
    (a :class:`rawconv.fused.FusedConvolution`'s residual ``sum`` and activation ``eltwise``): the
    child builds that same fused primitive, whose implementations and times differ from the
    plain convolution's."""
    _child_plans.clear()
    # a candidate that writes past its scratchpad (oneDNN #6035) writes into a guard band rawconv owns:
    # counted in its own row, instead of corrupting the heap and crashing a later candidate's row
    _Built.guard_bytes = GUARD_BYTES
    if post_ops:
        from .fused import FusedConvolution, activation_of_post_ops

        plan = FusedConvolution.for_problem(problem, residual=any(op[0] == "sum" for op in post_ops),
                                            activation=activation_of_post_ops(post_ops),
                                            fpmath=fpmath, w_layout=w_layout, prepack=prepack, threads=plan_threads)
        plan.allow_known_bad = True
    else:
        plan = Convolution.from_problem(problem, direction=direction, algorithm=algorithm, fpmath=fpmath,
                                        w_layout=w_layout, prepack=prepack, allow_known_bad=True,
                                        threads=plan_threads)
    impls = plan.implementations
    if prepack and "w" in tensors:   # calls run on a snapshot of the weights, reordered once per implementation
        plan.repack(tensors["w"])
        tensors = {k: v for k, v in tensors.items() if k != "w"}
    _child_plans[key] = (plan, tensors)
    return impls



def run(key, impl, iterations: int, warmup: int, budget_s, slow_s, allow_known_bad: bool,
        want_output: bool) -> dict:
    """(child) Select ``impl`` on the plan cached under ``key``, run it (warm-up, then timed calls
    as :func:`rawconv.bench.time_cpu`), free its buffers; return times and, when asked, the last
    output."""
    from ..core.bench import time_cpu

    plan, tensors = _child_plans[key]
    sel = plan.select(impl, allow_known_bad=allow_known_bad)
    i = sel.index
    crash = _env.get(CRASH_ENV)
    if crash and crash in (sel.name, sel.choice):   # a test aid: check the isolation path end to end
        os.abort()
    try:
        t0 = time.perf_counter()
        out = plan.execute(**tensors)
        first = time.perf_counter() - t0
        built = plan._built.get(i)
        overrun = built.overruns() if built is not None else []
        # a write past the scratchpad is not timed further: the result and any later call are not to be trusted
        if overrun or (slow_s is not None and first > slow_s):
            median = mn = first * 1e3
            runs = 1
        elif iterations > 0:
            st = time_cpu(lambda: plan.execute(**tensors), iterations=iterations, warmup=max(warmup - 1, 0),
                          budget_s=budget_s)
            median, mn, runs = st.median_ms, st.min_ms, st.runs
        else:
            median = mn = first * 1e3
            runs = 1
        if not overrun and built is not None:
            overrun = built.overruns()
        res = {"index": i, "median_ms": median, "min_ms": mn, "runs": runs,
               "output": out if want_output else None, "overruns": overrun}
        del out
    finally:
        plan._built.pop(i, None)
        trim_worker_heap()
    return res


