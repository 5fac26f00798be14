"""What a comparison leaves behind: its JSON (:func:`write_json`), the tuning records of each
problem's fastest correct rawconv row (:func:`records`), and their replay (:func:`replay`: each
record's choice run again, checked against float64, its drift from the recorded time;
:func:`replay_summary`)."""
from __future__ import annotations

import dataclasses
import json
import math
import warnings
from typing import Iterable

import torch

from ..core import progress as _progress
from ..core.bench import LoadMonitor, geomean, time_cuda_queued
from ..core.errors import NotSupportedError, RawconvError
from ..core.check import compare_to_reference
from ..core.problem import ConvProblem
from ..core.results import Result, ResultTable
from .measure import Row, best_rawconv, threads
from . import run_summary as _run_summary
from .run_summary import machine_report, timing_warnings

FACE = "rawconv.explore.compare"   # where this module's public names live (rawconv.compare): messages, pickles


def write_json(path: str, rows: list[Row], meta: dict, problems: list[ConvProblem] | None = None, *,
               summary: dict | None = None) -> None:
    """Write rows + summary (``summary`` or :func:`summary` of ``rows``) + environment (+ the
    problems, as dataclass fields) to ``path`` as JSON. Non-finite floats are written as null."""
    data = {"meta": meta, "summary": summary if summary is not None else _run_summary.summary(rows),
            "rows": [r.as_dict() for r in rows]}
    if problems is not None:
        data["problems"] = [dict(dataclasses.asdict(p), describe=p.describe(), benchdnn=p.to_benchdnn(strict=False),
                                 flops=p.flops, y_shape=p.y_shape) for p in problems]
    with open(path, "w") as f:
        json.dump(_finite_json(data), f, indent=1, default=str, allow_nan=False)


def _finite_json(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite_json(x) for x in v]
    return v


# --------------------------------------------------------------------------- tuning records
_REGISTRY_NAME = {"cudnn-graph": "cudnn_graph"}   # compare's row label -> the backend registry's name


def records(rows: Iterable[Row], problems: Iterable[ConvProblem], *, fpmath: str = "strict",
            allow_known_bad: bool = False, threads: int | None = None, hint: str | None = None) -> list:
    """The :class:`rawconv.tuning.TuningRecord` of the fastest correct rawconv row of each problem
    (problems where none ran correctly get none), among the rows that read their weights on every
    call as :mod:`rawconv.nn`'s modules and the function forms do (``detail["weights"]`` says
    which; a run of prepacked rows only records its fastest with ``"prepacked"``, which
    :func:`replay` honours): its backend, the problem (``problems`` gives
    the fields; rows name it), the rows' direction, the candidate's stable name
    (``row.choice``: ``"jit:avx2@any"``, ``"IMPLICIT_PRECOMP_GEMM@fma"``, ``"eng72{k24=4}"``),
    the options ``compare`` ran it with (oneDNN: ``fpmath``, weights layout, ``threads``: the
    plan's count, one for a problem under 2**17 FLOPs, else the count the problem was timed at
    (compare's thread fit, ``row.extra["threads"]``, where it timed fewer), else ``threads``, default
    torch's current count; cuDNN: the math type set), the library version and device, its
    median time (from the confirmation rounds where they ran: picked on other rounds) and min
    time (over those rounds too: never above the median), its error against float64, the layer's name as ``label``, and ``timing``:
    whether the run's timings (:func:`rawconv.results.reliability` of ``rows``; ``hint`` ends its
    oversubscription warning) and this row's own (:attr:`Result.timing_flags`) can be trusted,
    so that :func:`replay` withholds a drift against a noisy time.
    :func:`rawconv.tuning.replay` (or ``rawconv replay FILE``) runs exactly that choice again."""
    from ..core import tuning
    from ..core.results import reliability

    rows = list(rows)
    run = reliability(rows, hint)
    by_key = {(str(p.name or p.describe()), p.device): p for p in problems}
    groups: dict = {}
    for r in rows:
        groups.setdefault((r.problem_name, r.extra.get("device", "cpu"), r.direction), []).append(r)
    out = []
    env_cache: dict = {}
    for (name, device, direction), rs in groups.items():
        p = by_key.get((name, device))
        best = best_rawconv(rs, "per call") or best_rawconv(rs, "prepacked")
        if p is None or best is None:
            continue
        backend = _REGISTRY_NAME.get(best.backend, best.backend)
        ex = best.extra
        if backend == "onednn":
            from .. import onednn

            plan_threads = onednn.plan_threads("auto", p)   # compare's plans take the default threads="auto"
            fit = ex.get("threads")   # compare's thread fit: the count the problem was timed at, if it chose one
            timed = fit.get("threads") if isinstance(fit, dict) and fit.get("reduced") else threads
            options = onednn.key_options(fpmath, "direct", "nchw", allow_known_bad,
                                         timed if plan_threads is None else plan_threads)
            detail = {"impl": best.choice.partition("@")[0], "layouts": ex.get("layouts"), "index": ex.get("index"),
                      "formats": ex.get("formats"), "reorders": ex.get("reorders"),
                      "scratchpad_bytes": best.workspace_bytes, "weights": ex.get("weights")}
            env = None
        elif backend == "cudnn":
            from .. import cudnn

            options = cudnn.key_options(ex.get("math") or "fma")
            detail = {k: ex.get(k) for k in ("algo", "algo_id", "math", "math_reported", "deterministic")}
            detail["workspace_bytes"] = best.workspace_bytes
            env = env_cache.setdefault((backend, device), cudnn.environment(torch.device(device).index))
        elif backend == "cudnn_graph":
            from ..cudnn import graph as cudnn_graph

            options = {"allow_tf32": True}
            detail = {k: ex.get(k) for k in ("engine", "knobs", "numerical_notes", "behavior_notes")}
            detail["workspace_bytes"] = best.workspace_bytes
            env = env_cache.setdefault((backend, device), cudnn_graph.environment(torch.device(device).index or 0))
        else:   # a backend registered later: its choice and the environment it reports
            options, detail, env = {}, {}, None
        key = tuning.TuningKey.for_backend(backend, p, direction, options, environment=env)
        err = {"max_abs": best.max_abs, "max_rel": best.max_rel, "ratio": None}
        err = {k: (v if v is None or math.isfinite(v) else None) for k, v in err.items()}
        flags = best.timing_flags
        timing = {"trustworthy": bool(run["trustworthy"] is not False and not flags),
                  "run_trustworthy": run["trustworthy"], "run_warnings": list(run["warnings"]),
                  "row_flags": flags, "machine": best.extra.get("machine")}
        # the time fresh rounds measured where they ran (the best was picked on others: no winner's curse)
        conf = best.extra.get("confirmed")
        med = conf["median_ms"] if isinstance(conf, dict) and conf.get("median_ms") is not None else best.median_ms
        # (the min over every round that timed it: the fresh rounds' median can fall below the first rounds' min)
        low = best.min_ms if med is None or best.min_ms is None else min(best.min_ms, med)
        out.append(tuning.TuningRecord(key, best.choice, _finite_json(detail), p.layout, med, low,
                                       err, label=name, timing=_finite_json(timing)))
    return out


def _record_tolerance(record, problem: ConvProblem) -> dict:
    """:func:`rawconv.check.tolerance_for`'s arguments for a result of ``record``'s choice."""
    from ..core.check import tolerance_for

    k, d = record.key, record.detail
    opts = k.options
    if k.backend == "onednn":
        compute = {"bf16": "bfloat16", "f16": "float16", "tf32": "tf32", "any": "bfloat16"}.get(opts.get("fpmath"))
        return tolerance_for(problem, k.direction, compute=compute).kwargs()
    if k.backend == "cudnn":
        math_rep = d.get("math_reported") or d.get("math") or ""
        compute = None
        if problem.dtype == "float32" and math_rep in ("default", "tensor_op"):
            compute = "tf32"
        elif problem.dtype == "float32" and math_rep == "tensor_op_allow_conversion":
            compute = "float16"
        return tolerance_for(problem, k.direction, compute=compute, algorithm=str(d.get("algo") or "")).kwargs()
    notes = tuple(d.get("numerical_notes") or ())
    return tolerance_for(problem, k.direction, notes=notes, activation=k.activation).kwargs()


def replay(recs, *, iterations: int = 10, warmup: int = 2, budget_s: float = 0.5, seed: int = 0,
           progress: bool | None = None) -> ResultTable:
    """Run exactly the choices of tuning records again (:func:`rawconv.tuning.replay`: the
    backend registry's plan with the recorded choice) on random inputs of each problem, time them
    as ``compare`` does and check them against float64. Returns a
    :class:`~rawconv.results.ResultTable`, one row per record: ``status`` (``ok``, ``wrong``,
    ``not supported`` when the library no longer offers the choice, ``failed``), times and error
    now, and in ``extra`` what was recorded (``recorded_median_ms``, ``recorded_max_rel``),
    ``drift`` (median now / recorded - 1; withheld, with ``drift_withheld`` saying why, for a
    record whose ``timing`` says its time was not to be trusted: :func:`record_untrusted`),
    ``machine`` (on CPU: the
    :class:`~rawconv.bench.LoadReport` of the timing, as for compare's rows, so
    :func:`timing_warnings` and :func:`replay_summary` apply) and ``environment`` (the
    ``(field, recorded, current)`` triples that differ: library version, device). Environment differences do not stop a
    replay here (``rawconv replay --strict`` refuses them first, as
    :meth:`rawconv.tuning.TuningRecord.check_environment` with ``strict=True`` does)."""
    from ..core import tuning
    from ..core.check import reference

    recs = [recs] if isinstance(recs, tuning.TuningRecord) else list(recs)   # what TuningRecord.load gives
    rows = []
    with _progress.bar(progress, total=len(recs), desc="replay", unit="record") as bar:
        for rec in recs:
            k = rec.key
            problem = k.conv_problem().with_(name=rec.label or "")
            name = rec.label or problem.describe()
            bar.note(f"{name}: {rec.choice}")
            rec_rel = rec.error.get("max_rel") if rec.error is not None else None
            extra = {"recorded_median_ms": rec.median_ms, "recorded_min_ms": rec.min_ms, "recorded_max_rel": rec_rel,
                     "choice": rec.choice, "device": problem.device, "library": f"{k.library} {k.library_version}"}
            untrusted = record_untrusted(rec)
            if untrusted:
                extra["drift_withheld"] = untrusted
            try:
                with warnings.catch_warnings(record=True):
                    warnings.simplefilter("always", RuntimeWarning)
                    extra["environment"] = [list(t) for t in rec.check_environment()]
                    plan = tuning.replay(rec)
            except RawconvError as exc:
                rows.append(Result(k.backend, rec.choice, name, k.direction, None,
                                   "not supported" if isinstance(exc, NotSupportedError) else "failed",
                                   message=f"{type(exc).__name__}: {exc}", extra=extra))
                bar.update()
                continue
            row = _replay_one(plan, rec, problem, name, extra, iterations, warmup, budget_s, seed, reference)
            rows.append(row)
            bar.update()
    return ResultTable(rows, title=f"rawconv replay: {len(recs)} record(s)")


def record_untrusted(rec) -> str:
    """Why ``rec``'s recorded time is not to be trusted ('' when nothing is known against it):
    it was made on a run whose timings were unreliable, or its own row's were (the record's
    ``timing``, written by :func:`records`). :func:`replay` reports no drift against it."""
    t = getattr(rec, "timing", None)
    if not t or t.get("trustworthy", True):
        return ""
    flags = list(t.get("row_flags") or [])
    if flags:
        what = f"its time was measured while not to be trusted ({'; '.join(flags)})"
    else:
        run = [w.split(":")[0] for w in (t.get("run_warnings") or [])]
        what = f"it was recorded on a run whose timings were not to be trusted ({'; '.join(run) or 'see the run'})"
    return f"{what}: record it again on a quiet machine"


def replay_summary(rows, *, hint: str | None = None) -> dict:
    """What a :func:`replay` table says in numbers: ``records``, ``within_tolerance``,
    ``outside_tolerance`` / ``failed`` (labels), ``geomean_drift`` (geometric mean of median now /
    recorded over the records that ran within tolerance, minus 1; None without any), and, as
    :func:`summary` does for compare, ``timings_trustworthy`` / ``timing_warnings``
    (:func:`timing_warnings`: the machine was oversubscribed, or median/min spreads are wide) and
    ``machine``."""
    rows = list(rows)
    warn = timing_warnings(rows, hint)
    report = machine_report(rows)
    ratios = [1.0 + r.extra["drift"] for r in rows
              if r.group == "ok" and isinstance(r.extra.get("drift"), float) and math.isfinite(r.extra["drift"])]
    gm = geomean(ratios) if ratios else float("nan")

    def label(r):
        return f"{r.problem_name}: {r.backend} {r.name}"

    return {"records": len(rows), "within_tolerance": sum(r.group == "ok" for r in rows),
            "drift_withheld": [f"{label(r)}: {r.extra['drift_withheld']}" for r in rows
                               if r.extra.get("drift_withheld")],
            "outside_tolerance": [label(r) for r in rows if r.group == "wrong"],
            "failed": [f"{label(r)}: {r.status}: {r.message}" for r in rows if r.group in ("failed", "not supported")],
            "geomean_drift": gm - 1.0 if math.isfinite(gm) else None,
            "timings_trustworthy": not warn, "timing_warnings": warn,
            "machine": report.as_dict() if report is not None else None}


def _replay_one(plan, rec, problem, name, extra, iterations, warmup, budget_s, seed, reference) -> Result:
    k = rec.key
    dev = problem.device
    x, w, b = problem.make_inputs(seed=seed, device=dev)
    g = torch.Generator().manual_seed(seed + 1)
    dy = torch.randn(problem.y_shape, generator=g, dtype=torch.float64).to(problem.torch_dtype)
    from ..core.problem import to_layout

    dy = to_layout(dy, problem.layout).to(dev)
    packed = (rec.detail or {}).get("weights") == "prepacked" and k.direction != "backward_weights"
    if packed:   # recorded with a weight snapshot reordered once: replayed the same way
        plan.repack(w)
    if k.direction == "forward":
        fn, tensors = (lambda: plan.execute(x, None if packed else w, b)), {"x": x, "w": w, "b": b}
    elif k.direction == "backward_data":
        fn, tensors = ((lambda: plan.execute(grad_y=dy)) if packed else (lambda: plan.execute(grad_y=dy, w=w)),
                       {"dy": dy, "w": w})
    else:
        fn, tensors = (lambda: plan.execute(x, grad_y=dy)), {"x": x, "dy": dy}
    rounds = None
    if dev.startswith("cuda"):
        timer = lambda f: time_cuda_queued(f, iterations=iterations, warmup=warmup)  # noqa: E731
    else:   # the CPU: as compare times its rows, in rounds, each round's fastest clean call (a one-thread
        # plan, as compare at one thread: by its thread's CPU time)
        from ..core.bench import round_plan, time_rounds

        one = torch.get_num_threads() == 1 or getattr(plan, "threads", None) == 1

        def timer(f):
            nonlocal rounds
            n, calls = round_plan(iterations)
            t = time_rounds({"record": f}, rounds=n, calls=calls, warmup=warmup, budget_s=budget_s,
                            one_thread=one)["record"]
            rounds = t.as_dict()
            return t.stats()
    # as compare's _measure: what the rest of the machine did while this record was timed
    monitor = LoadMonitor() if dev == "cpu" else None
    try:
        y = fn()
        stats = timer(fn)
    except RawconvError as exc:
        plan.free()
        return Result(k.backend, rec.choice, name, k.direction, None,
                      "not supported" if isinstance(exc, NotSupportedError) else "failed",
                      message=f"{type(exc).__name__}: {exc}", extra=extra)
    if monitor is not None:
        extra["machine"] = monitor.report().as_dict()
    if rounds is not None:
        extra["rounds"] = rounds
    plan.free()
    ref, ref_abs = reference(problem, k.direction, {n: t for n, t in tensors.items() if t is not None},
                             activation=k.activation)
    with threads(1):
        err = compare_to_reference(problem, y[0] if isinstance(y, tuple) else y, ref, ref_abs,
                                   **_record_tolerance(rec, problem))
    if rec.median_ms and not extra.get("drift_withheld"):
        extra["drift"] = stats.median_ms / rec.median_ms - 1.0
    return Result(k.backend, rec.choice, name, k.direction, None, "ok" if err.ok else "wrong", stats.median_ms,
                  stats.min_ms, stats.runs, err, None,
                  "", extra=extra)


# every public entry point raises only rawconv's exception classes (rawconv._guard)
from ..core import guard as _guard  # noqa: E402

_guard.guard_module(globals(), "write_json", "records", "replay", "replay_summary", where=FACE)
