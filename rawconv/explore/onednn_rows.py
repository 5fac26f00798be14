"""compare's rows of oneDNN (registered as the ``rows`` of the ``onednn`` backend): every
implementation rawconv lists, with the weights read per call and prepacked, oneDNN's reference
code run, estimated too slow or left out (``include_ref``), known-bad implementations skipped or run
in a child process (``isolate``), each checked against float64."""
from __future__ import annotations

import functools
import math

from ..core.errors import RawconvError
from ..core.check import compare_to_reference
from .measure import Row, _error_row, _measure, _tolerance, libraries, threads

__all__ = ["onednn_rows", "REF_MAX_SECONDS", "PREPACK_MODES"]


_ROLE = {"x": "src", "w": "weights", "b": "bias", "y": "dst", "dy": "diff_dst", "dx": "diff_src",
         "dw": "diff_weights", "db": "diff_bias"}
#: include_ref="auto": oneDNN's reference implementations (ref:any) run only when
#: :func:`rawconv.onednn.reference_seconds` estimates one call at most this many seconds
REF_MAX_SECONDS = 1.0


def _ref_estimate(problem, layouts: str, direction: str = "forward") -> float:
    """Estimated seconds of one call of the ref:any implementation with ``layouts`` (inf when oneDNN
    cannot say)."""
    from .. import onednn

    try:
        return onednn.reference_seconds(problem, direction, layouts)
    except RawconvError:
        return float("inf")


#: ``prepack`` of :func:`compare_problem`: which weight handlings oneDNN's rows are timed with
PREPACK_MODES = {False: ("per call",), True: ("prepacked",), "both": ("per call", "prepacked")}


def _prepack_modes(prepack) -> tuple:
    from ..core.errors import ArgumentError

    try:
        return PREPACK_MODES[prepack]
    except (KeyError, TypeError):
        raise ArgumentError(f"prepack must be True, False or 'both', got {prepack!r}") from None


def _weights_of(impl, direction: str, mode: str) -> str | None:
    """What a oneDNN row does with the weights: "per call" (read and reordered on every call),
    "prepacked" (a snapshot reordered once), "as given" (the implementation takes them in the
    tensor's own layout: no reorder either way, so the two handlings are one row), None
    (backward_weights: the weights are not an input)."""
    if direction == "backward_weights":
        return None
    if "w" not in impl.reorders:
        return "as given"
    return mode


def onednn_rows(problem, x, w, b, ref, ref_abs, timer, *, fpmath="strict", prepack="both",
                 include_ref=True, slow_s=None, ref_max_s: float = REF_MAX_SECONDS, allow_known_bad=False,
                 isolate=None, timing=(10, 2, None), direction="forward", dy=None, libs=None, finalizers=None,
                 **_kw) -> list[Row]:
    """Rows for every oneDNN implementation. ``include_ref``: True runs the reference
    implementations (ref:any), False drops them, "auto" runs them when one call is estimated
    (:func:`rawconv.onednn.reference_seconds`) at most ``ref_max_s`` seconds and otherwise lists
    them as "skipped". ``prepack``: False times each implementation with the weights read (and
    reordered) on every call, as torch's call does; True with a snapshot reordered once; "both"
    gives an implementation whose weights need a reorder one row of each. Known-bad
    implementations get a "known bad" row unless ``allow_known_bad``; ``isolate`` runs the
    candidates in a child process. ``timer=None``: the rows are left for :func:`_time_rounds`
    (each selects its implementation before its calls in a round) and the plan's ``free`` goes
    to ``finalizers`` (a list), to run after them."""
    name = str(problem.name or problem.describe())
    modes = _prepack_modes(prepack)
    library = (libs or libraries())["onednn"]
    try:
        plan, impls = _onednn_plan(problem, x, w, b, fpmath, modes, direction)
    except RawconvError as exc:
        return [_error_row(name, "onednn", "-", exc, f"oneDNN on {problem.describe()}", direction=direction,
                           extra={"library": library})]
    rows = []
    compute = {"bf16": "bfloat16", "f16": "float16", "tf32": "tf32", "any": "bfloat16"}.get(fpmath)
    tol = _tolerance(problem, direction, compute)
    ref_est: dict = {}   # layouts -> the estimate of that ref:* implementation

    def call(mode):
        return _onednn_call(plan, x, w, b, dy, direction, mode)

    for impl in impls:
        label = impl.choice
        base = {"index": impl.index, "choice": impl.choice, "library": library, "vendor_name": impl.name}
        not_run = _onednn_not_run(problem, name, impl, label, base, include_ref, ref_max_s, ref_est,
                                  allow_known_bad, direction)
        if not_run is not None:
            rows += not_run
            continue
        handlings = list(dict.fromkeys(_weights_of(impl, direction, m) for m in modes))
        for weights in handlings:
            reorders = ",".join(_ROLE.get(r, r) + ("(once)" if r == "w" and weights == "prepacked" else "")
                                for r in impl.reorders) or "none"
            detail = (f"{impl.layouts}; " + " ".join(f"{_ROLE.get(k, k)} {v}" for k, v in impl.formats.items())
                      + f"; reorders {reorders}")
            if weights == "as given":
                detail += "; weights used as given (no reorder to save)"
            extra = dict(base, layouts=impl.layouts, formats=impl.formats, reorders=list(impl.reorders),
                         fpmath=fpmath, weights=weights)
            row_label = label + (" (prepacked)" if weights == "prepacked" else "")
            if isolate:   # run below, all in one child process; the row keeps its place
                rows.append((impl, row_label, detail, extra))
                continue
            try:
                plan.select(impl.index, allow_known_bad=allow_known_bad)
            except RawconvError as exc:
                rows.append(_error_row(name, "onednn", row_label, exc, impl.layouts, direction=direction,
                                       extra=extra))
                continue
            rows.append(_measure(problem, "onednn", row_label, detail, call(weights), ref, ref_abs, timer,
                                 tol=tol, workspace=impl.scratchpad_bytes, extra=extra, slow_s=slow_s,
                                 direction=direction, setup=functools.partial(plan.select, impl.index,
                                                                              allow_known_bad=allow_known_bad)))
    if finalizers is not None and timer is None:
        finalizers.append(plan.free)
    else:
        plan.free()
    if isolate:
        _run_isolated(problem, rows, x, w, b, ref, ref_abs, tol, fpmath=fpmath, slow_s=slow_s,
                      allow_known_bad=allow_known_bad, isolate=isolate, timing=timing, direction=direction, dy=dy)
    return rows


def _onednn_plan(problem, x, w, b, fpmath: str, modes, direction: str) -> tuple:
    """The oneDNN plan :func:`onednn_rows` times: built on the tensors for the forward direction,
    from the problem otherwise, with a weight snapshot when a ``"prepacked"`` row is among
    ``modes``. Returns ``(plan, implementations)``; raises :class:`RawconvError` when oneDNN cannot
    make it."""
    from .. import onednn

    if direction == "forward":
        plan = onednn.Convolution(x, w, b, problem.stride, list(zip(problem.pad_before, problem.pad_after)),
                                  problem.dilation, problem.groups, fpmath=fpmath)
    else:
        plan = onednn.Convolution.from_problem(problem, direction=direction, fpmath=fpmath,
                                               w_layout=onednn.weights_layout(w))
    impls = plan.implementations
    if "prepacked" in modes and direction != "backward_weights":
        plan.repack(w)   # a snapshot, reordered once per implementation; calls given w still read w
    return plan, impls


def _onednn_call(plan, x, w, b, dy, direction: str, mode: str):
    """The call :func:`onednn_rows` times for one weights handling ``mode`` (``"prepacked"``: the
    plan's snapshot, else the weights passed on every call). Returns a function of no arguments."""
    packed = mode == "prepacked"
    if direction == "forward":
        return lambda: plan.execute(x, None if packed else w, b)
    if direction == "backward_data":
        return (lambda: plan.execute(grad_y=dy)) if packed else (lambda: plan.execute(grad_y=dy, w=w))
    return lambda: plan.execute(x, grad_y=dy)


def _onednn_not_run(problem, name: str, impl, label: str, base: dict, include_ref, ref_max_s: float, ref_est: dict,
                    allow_known_bad: bool, direction: str) -> list[Row] | None:
    """Whether :func:`onednn_rows` leaves the implementation ``impl`` out: a reference one
    without ``include_ref``, or (``"auto"``) estimated slower than ``ref_max_s`` per call
    (``ref_est``: the estimates so far, by layouts), or a known-bad one without
    ``allow_known_bad``. Returns None to run it, else the rows to list instead (none for a
    reference implementation left out, one ``"skipped"`` / ``"known bad"`` row otherwise)."""
    if impl.name.startswith("ref") and not include_ref:
        return []
    if impl.name.startswith("ref") and include_ref == "auto":
        if impl.layouts not in ref_est:
            ref_est[impl.layouts] = _ref_estimate(problem, impl.layouts, direction)
        ref_s = ref_est[impl.layouts]
        if ref_s > ref_max_s:
            est = "unknown" if not math.isfinite(ref_s) else f"{ref_s:.1f} s"
            return [Row(name, "onednn", label, f"{impl.layouts}; not run: estimated {est} per call "
                        f"(--ref runs it)", error=f"not run: estimated {est} per call (--ref runs it)",
                        status="skipped", workspace_bytes=impl.scratchpad_bytes, direction=direction,
                        extra=dict(base, estimated_s=ref_s if math.isfinite(ref_s) else None))]
    if impl.known_bad and not allow_known_bad:
        return [Row(name, "onednn", label,
                    f"{impl.layouts}; not run: known bad ({impl.known_bad}; --allow-known-bad runs it)",
                    error="skipped (known bad)", status="known bad", workspace_bytes=impl.scratchpad_bytes,
                    extra=base, direction=direction)]
    return None


def _run_isolated(problem, rows, x, w, b, ref, ref_abs, tol, *, fpmath, slow_s, allow_known_bad,
                  isolate, timing, direction="forward", dy=None) -> None:
    """Run the (impl, label, detail, extra) placeholders of ``rows`` in a child process
    (rawconv._isolate), one child run per weight handling, and put their Rows in place: a crash
    or hang is that row's error ("crashed: SIGSEGV", "timed out after 60 s"), and the comparison
    goes on."""
    from ..core import isolate as _isolate
    from ..onednn.isolated import run_onednn_candidates

    iso = _isolate.options(isolate)
    iterations, warmup, budget_s = timing
    for packed in (False, True):
        todo = [i for i, r in enumerate(rows) if isinstance(r, tuple) and (r[3]["weights"] == "prepacked") == packed]
        if not todo:
            continue
        tensors = ({"x": x, "w": w, "b": b} if direction == "forward" else
                   {"grad_y": dy, "w": w} if direction == "backward_data" else {"x": x, "grad_y": dy})
        results = run_onednn_candidates(
            problem, direction=direction, indices=[rows[i][0] for i in todo], fpmath=fpmath, prepack=packed,
            allow_known_bad=allow_known_bad, slow_s=slow_s, iterations=iterations, warmup=warmup, budget_s=budget_s,
            check=False, keep_output=True, timeout_s=iso.timeout_s, env=iso.env, threads=iso.threads, **tensors)
        for i, res in zip(todo, results):
            impl, label, detail, extra = rows[i]
            row = Row(str(problem.name or problem.describe()), "onednn", label, detail + "; isolated",
                      workspace_bytes=impl.scratchpad_bytes, direction=direction,
                      extra=dict(extra, status=res["status"], problem=problem.describe(),
                                 benchdnn=problem.to_benchdnn(strict=False), device=problem.device))
            if res["status"] != "ok":   # "crashed: SIGSEGV", "timed out after 60 s", ...: failures
                st = {"known bad": "skipped (known bad)"}.get(res["status"], res["status"])
                row.error = st + (f": {res['detail']}" if res["detail"] else "")
                row.status = res["status"]
            else:
                out = res["output"][0] if isinstance(res["output"], tuple) else res["output"]
                with threads(1):
                    err = compare_to_reference(problem, out, ref, ref_abs, **tol)
                row.median_ms, row.min_ms, row.runs = res["median_ms"], res["min_ms"], res["runs"]
                row.gflops = problem.flops / (row.median_ms * 1e6) if row.median_ms > 0 else float("nan")
                row.max_abs, row.max_rel, row.ok = err.max_abs, err.max_rel, err.ok
                row.status = "ok" if err.ok else "wrong"
            rows[i] = row
