"""``compare``'s rows of cuDNN's two APIs (registered as the ``rows`` of the ``cudnn`` and
``cudnn_graph`` backends): the legacy API's every (algo, math type) from ``cudnnFind``, the graph
API's engine configs (with ``engines``), each checked against float64 and timed on the GPU."""
from __future__ import annotations

from ..core.errors import RawconvError
from .measure import Row, _error_row, _measure, libraries

__all__ = ["cudnn_rows", "cudnn_graph_rows", "cudnn_tolerance"]


def cudnn_tolerance(dtype: str, math_reported: str, algo: str = "") -> dict:
    """Tolerance arguments (for :func:`~rawconv.check.compare_to_reference`) for a cuDNN result:
    fp32 under the default / tensor-op math types may run on TF32 tensor cores, under
    ``tensor_op_allow_conversion`` on fp16/bf16 ones; transform algos (Winograd, FFT) round in the
    transformed domain, so their bound is 64x wider."""
    compute = None
    if dtype == "float32" and math_reported in ("default", "tensor_op"):
        compute = "tf32"
    elif dtype == "float32" and math_reported == "tensor_op_allow_conversion":
        compute = "float16"
    factor = 64.0 if ("FFT" in algo.upper() or "WINOGRAD" in algo.upper()) else 1.0
    return {"compute": compute, "factor": factor}


def _cuda_exec(plan, direction, x, w, b, dy):
    """The call of a cuDNN plan for ``direction`` (every call reads its tensors as given)."""
    if direction == "forward":
        return lambda: plan.execute(x, w, b)
    if direction == "backward_data":
        return lambda: plan.execute(grad_y=dy, w=w)
    return lambda: plan.execute(x, grad_y=dy)


def cudnn_rows(problem, x, w, b, ref, ref_abs, timer, engines=None, *, direction="forward", dy=None, libs=None,
                **_kw) -> list[Row]:
    name = str(problem.name or problem.describe())
    library = (libs or libraries())["cudnn"]
    try:
        from .. import cudnn
    except Exception as exc:  # pragma: no cover - import errors are bugs, shown as a row
        return [Row(name, "cudnn", "-", error=f"{type(exc).__name__}: {exc}", status="failed", direction=direction)]
    rows: list[Row] = []
    pad = list(zip(problem.pad_before, problem.pad_after))
    weights = None if direction == "backward_weights" else "as given"
    try:
        if direction == "forward":
            plan = cudnn.Convolution(x, w, b, problem.stride, pad, problem.dilation, problem.groups)
        else:
            from ..core.problem import layout_of

            plan = cudnn.Convolution.from_problem(problem, direction=direction,
                                                  w_layout="nhwc" if layout_of(w) == "nhwc" else "nchw")
        algos = plan.algorithms(mode="find", math="all")
    except RawconvError as exc:
        return [_error_row(name, "cudnn", "-", exc, f"cuDNN on {problem.describe()}", direction=direction,
                           extra={"library": library})]
    run = _cuda_exec(plan, direction, x, w, b, dy)
    for a in algos:
        label = f"{a.algo}@{a.math}"   # the candidate's one name (what choice= takes)
        if not a.ok:
            rows.append(Row(name, "cudnn", label, error=f"not supported here ({a.status})",
                            status="not supported", workspace_bytes=a.workspace_bytes, direction=direction,
                            extra={"library": library}))
            continue
        try:
            info = plan.select(a.algo_id, a.requested_math or a.math)
        except RawconvError as exc:
            rows.append(_error_row(name, "cudnn", label, exc, direction=direction, extra={"library": library}))
            continue
        detail = (f"math set {info.math}, reported {info.math_reported}; "
                  f"{'deterministic' if info.deterministic else 'non-deterministic'}"
                  + ("; fused bias" if info.fused else "") + (f"; {'; '.join(info.notes)}" if info.notes else ""))
        tol = cudnn_tolerance(problem.dtype, info.math_reported, info.algo)
        if direction != "forward":
            from ..core.check import tolerance_for

            tol = tolerance_for(problem, direction, compute=tol["compute"], algorithm=info.algo).kwargs()
        label = f"{info.algo}@{info.math}"
        rows.append(_measure(problem, "cudnn", label, detail, run, ref, ref_abs, timer, tol=tol,
                             workspace=info.workspace_bytes, direction=direction,
                             extra={"choice": f"{info.algo}@{info.math}", "algo": info.algo,
                                    "algo_id": info.algo_id, "math": info.math,
                                    "math_reported": info.math_reported, "deterministic": info.deterministic,
                                    "find_ms": a.time_ms, "library": library, "weights": weights}))
    plan.free()
    return rows


def cudnn_graph_rows(problem, x, w, b, ref, ref_abs, timer, engines=None, *, direction="forward", dy=None,
                      libs=None, **_kw) -> list[Row]:
    """Rows for cuDNN graph-API engine configs: ``engines="all"`` (every engine with its default
    knobs, plus the heuristic modes' configs) or an int N (the first N of heuristic modes
    instant, b and fallback); none without ``engines``."""
    if not engines:
        return []
    name = str(problem.name or problem.describe())
    library = (libs or libraries())["cudnn"]
    try:
        from ..cudnn import graph as G
    except Exception as exc:  # pragma: no cover - an import error is a bug: show it as a row
        return [Row(name, "cudnn-graph", "-", error=f"{type(exc).__name__}: {exc}", status="failed",
                    direction=direction)]
    pad = list(zip(problem.pad_before, problem.pad_after))
    rows: list[Row] = []
    weights = None if direction == "backward_weights" else "as given"
    try:
        if direction == "forward":
            plan = G.GraphConvolution(x, w, b, problem.stride, pad, problem.dilation, problem.groups,
                                      allow_tf32=True)
        else:
            plan = G.GraphConvolution.from_problem(problem, direction=direction, allow_tf32=True)
        if str(engines) == "all":
            configs = plan.engines("all", limit=1)
        else:
            configs = plan.engines(list(G.HEURISTIC_MODES), limit=None)[: int(engines)]
    except (RawconvError, ValueError) as exc:
        return [_error_row(name, "cudnn-graph", "-", exc, direction=direction, extra={"library": library})]
    run = _cuda_exec(plan, direction, x, w, b, dy)
    for cfg in configs:
        label = cfg.name
        notes = ",".join(cfg.numerical_notes) or "-"
        detail = f"notes {notes}; heuristic {','.join(cfg.heuristics) or '-'}"
        if cfg.finalizes is False:
            rows.append(Row(name, "cudnn-graph", label, detail, error=cfg.error or "does not finalize",
                            status="not supported", direction=direction, extra={"library": library}))
            continue
        try:
            plan.select(cfg)
        except RawconvError as exc:
            rows.append(_error_row(name, "cudnn-graph", label, exc, detail, direction=direction,
                                   extra={"library": library}))
            continue
        rows.append(_measure(problem, "cudnn-graph", label, detail, run, ref, ref_abs,
                             timer, tol=G.tolerance_args(problem, cfg.numerical_notes, direction),
                             workspace=cfg.workspace_bytes, direction=direction,
                             extra={"choice": cfg.name, "engine": cfg.engine, "knobs": list(cfg.knobs),
                                    "numerical_notes": list(cfg.numerical_notes),
                                    "behavior_notes": list(cfg.behavior_notes), "library": library,
                                    "weights": weights}))
    plan.free()
    return rows
