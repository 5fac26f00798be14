"""The main job: run one convolution problem through torch and every rawconv implementation.

For each :class:`~rawconv.problem.ConvProblem` :func:`compare_problem` times

* torch's default path (and which backend torch picked: ``torch._C._select_conv_backend``),
* torch with ``torch.backends.mkldnn.enabled=False`` (torch's native CPU code),
* every oneDNN implementation rawconv lists (CPU problems),
* on CUDA problems: torch default, torch with ``cudnn.benchmark=True``, torch with cuDNN
  disabled, and every rawconv cuDNN (algo, math type) pair,

each checked against the float64 reference. :func:`compare` runs a list of problems and
returns :class:`Row` records; the CLI prints them as tables (``rawconv compare``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import warnings

from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from . import _progress
from .bench import LoadMonitor, LoadReport, TimeStats, geomean, time_cpu, time_cuda_queued
from .errors import LibraryNotFoundError, NotSupportedError, RawconvError
from .check import abs_reference, compare_to_reference
from .problem import ConvProblem
from .results import Result, ResultTable, _json_safe, status_group
from .torch_choice import _compare_detail, _trace_detail, conv_backend_name, torch_onednn_trace  # noqa: F401

__all__ = ["Row", "STATUSES", "status_category", "compare_problem", "compare", "real_photo", "inputs_for", "summary", "records", "replay",
           "exit_code", "EXIT_CODES"]


#: The statuses ``compare`` gives a :class:`Row` (each is also its own group in
#: :data:`rawconv.results.STATUSES`, the one status vocabulary of rawconv):
#:
#: ``"ok"``             ran, every element within tolerance of the float64 reference
#: ``"wrong"``          ran, some element outside tolerance (a wrong answer)
#: ``"failed"``         raised an error (a library error other than "not supported", or the
#:                      library did not load: then ``extra["library_not_loaded"]`` is True)
#: ``"not supported"``  the library says it offers nothing for this (``NotSupportedError``:
#:                      ``dnnl_unimplemented``, ``CUDNN_STATUS_NOT_SUPPORTED``; bf16 on an AVX2 CPU)
#: ``"skipped"``        not run on purpose (oneDNN's reference code estimated too slow: ``--ref``)
#:
#: A status is a plain string: any status of :data:`rawconv.results.STATUSES` works, grouped by
#: :func:`status_category` (``"crashed: SIGSEGV"`` and ``"timed out after 30 s"`` count as failed,
#: ``"known bad"`` as skipped); a new kind is one entry there.
STATUSES = ("ok", "wrong", "failed", "not supported", "skipped")


def status_category(status: str) -> str:
    """The group of a row status (:func:`rawconv.results.status_group`): "ok", "wrong", "failed",
    "not supported", "skipped" (or "listed"); an unknown status counts as failed."""
    return status_group(status)


class Row(Result):
    """One result line of ``compare``: a :class:`rawconv.results.Result` (the one row type of
    every listing and measurement), built with this row type's older constructor.

    ``problem``: the problem's name; ``implementation``: the label (:attr:`Result.name`);
    ``status``: what happened (:data:`STATUSES`: "ok", "wrong", "failed", "not supported",
    "skipped"; the reason in ``error``, which is :attr:`Result.message` here). Times in ms (median
    and min of timed calls after warm-up; :attr:`spread` = median / min), ``gflops`` = problem
    flops / median time, ``max_abs``/``max_rel`` against the float64 reference (``max_rel`` = max
    |err| / max |ref|), ``ok`` = every element within the tolerance for its dtype and math,
    ``workspace_bytes`` = oneDNN scratchpad or cuDNN workspace. ``extra["machine"]`` (CPU rows
    that ran): what the rest of the machine did while this row was timed
    (:meth:`rawconv.bench.LoadReport.as_dict`).
    """

    def __init__(self, problem: str, backend: str, implementation: str, detail: str = "",
                 median_ms: float = float("nan"), min_ms: float = float("nan"), runs: int = 0,
                 gflops: float = float("nan"), max_abs: float = float("nan"), max_rel: float = float("nan"),
                 ok: bool | None = None, workspace_bytes: int | None = None, error: str = "",
                 extra: dict | None = None, status: str = ""):
        if not status:
            status = "failed" if error else "ok" if ok else "wrong" if ok is False else "skipped"
        Result.__init__(self, backend, implementation, problem, "forward", None, status, median_ms, min_ms, runs,
                        None, workspace_bytes, detail, error, reference=backend == "torch",
                        extra=dict(extra or {}))
        for name, v in (("gflops", gflops), ("max_abs", max_abs), ("max_rel", max_rel)):
            if not (isinstance(v, float) and math.isnan(v)):
                self.extra[name] = v

    @property
    def error(self) -> str:
        """Why it failed or was not run (:attr:`Result.message`)."""
        return self.message

    @error.setter
    def error(self, value: str) -> None:
        self.message = value

    def as_dict(self) -> dict:
        """``compare``'s JSON row: :meth:`Result.as_dict` plus the older keys (``implementation``,
        ``error``, ``ok``, ``category``, ``extra``'s items)."""
        d = Result.as_dict(self)
        d.update({"implementation": self.name, "error": self.message,
                  "ok": True if self.status == "ok" else False if self.status == "wrong" else None,
                  "category": self.group})
        d["extra"] = _json_safe({k: v for k, v in self.extra.items() if k not in ("gflops", "max_abs", "max_rel")})
        return d


# --------------------------------------------------------------------------- inputs
def real_photo(size: tuple[int, int], channels: int = 3) -> torch.Tensor:
    """matplotlib's sample photo (Grace Hopper, 600x512 RGB), resized to ``size`` (H, W) and
    normalized with the ImageNet mean/std, as a (1, channels, H, W) float32 tensor."""
    from matplotlib import cbook, image

    path = cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    img = torch.from_numpy(image.imread(path).copy()).float().div(255.0)   # (600, 512, 3)
    img = img.permute(2, 0, 1).unsqueeze(0)
    img = F.interpolate(img, size=size, mode="bilinear", align_corners=False, antialias=True)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    img = (img - mean) / std
    if channels != 3:
        reps = math.ceil(channels / 3)
        img = img.repeat(1, reps, 1, 1)[:, :channels]
    return img


def inputs_for(problem: ConvProblem, *, photo: bool = False, seed: int = 0, device: str | None = None):
    """x, w, bias for ``problem``: random (normal x, w scaled by 1/sqrt(reduction length)), or,
    with ``photo`` on a 2-D problem, x = the sample photo resized to the problem (each batch
    element the same photo) and w = Kaiming-normal random weights."""
    x, w, b = problem.make_inputs(seed=seed, device=device or problem.device)
    if photo and problem.ndim == 2 and not problem.is_empty and min(problem.in_spatial) > 0:
        img = real_photo(problem.in_spatial, problem.c).expand(problem.n, -1, -1, -1)
        from .problem import to_layout

        x = to_layout(img.to(problem.torch_dtype).contiguous(), problem.layout).to(x.device)
    return x, w, b


# --------------------------------------------------------------------------- torch rows
def _torch_call(problem: ConvProblem, x, w, b) -> Callable[[], torch.Tensor]:
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[problem.ndim]
    if problem.symmetric:
        pad = problem.pad_before
        return lambda: conv(x, w, b, problem.stride, pad, problem.dilation, problem.groups)
    padlist = []
    for bf, af in reversed(list(zip(problem.pad_before, problem.pad_after))):
        padlist += [bf, af]
    return lambda: conv(F.pad(x, padlist), w, b, problem.stride, 0, problem.dilation, problem.groups)


def torch_backend(problem: ConvProblem, x, w, b) -> str:
    """The backend torch picks for this call (``torch._C._select_conv_backend``), e.g. ``Mkldnn``."""
    try:
        xx = x
        pad = list(problem.pad_before)
        if not problem.symmetric:
            padlist = []
            for bf, af in reversed(list(zip(problem.pad_before, problem.pad_after))):
                padlist += [bf, af]
            xx, pad = F.pad(x, padlist), [0] * problem.ndim
        be = torch._C._select_conv_backend(xx, w, b, list(problem.stride), pad, list(problem.dilation),
                                           False, [0] * problem.ndim, problem.groups)
        return conv_backend_name(be)
    except Exception as exc:  # pragma: no cover - private API
        return f"unknown ({type(exc).__name__})"


def _error_row(problem_name: str, backend: str, impl: str, exc: BaseException, detail: str = "", **kw) -> Row:
    """A row for a candidate that raised: "not supported" for :class:`NotSupportedError`,
    "failed" otherwise (``extra["library_not_loaded"]`` for :class:`LibraryNotFoundError`)."""
    text = str(exc).strip()
    if isinstance(exc, RuntimeError) and not isinstance(exc, RawconvError):
        text = text.splitlines()[0] if text else ""
    row = Row(problem_name, backend, impl, detail, error=f"{type(exc).__name__}: {text}",
              status="not supported" if isinstance(exc, NotSupportedError) else "failed", **kw)
    if isinstance(exc, LibraryNotFoundError):
        row.extra["library_not_loaded"] = True
    return row


def _measure(problem, label_backend, label_impl, detail, fn, ref, ref_abs, timer, *, tol=None,
             workspace=None, extra=None, slow_s: float | None = None) -> Row:
    extra = dict(extra or {}, problem=problem.describe(), benchdnn=problem.to_benchdnn(strict=False), device=problem.device)
    name = str(problem.name or problem.describe())
    _progress.note(f"{name}: {label_backend} {label_impl}")
    monitor = LoadMonitor() if problem.device == "cpu" else None
    try:
        import time as _time

        t0 = _time.perf_counter()
        y = fn()
        first_s = _time.perf_counter() - t0
        if slow_s is not None and first_s > slow_s:
            # a very slow candidate (oneDNN's ref:any, or any one on a busy machine): one more call is
            # its measurement (the first also built the primitive: JIT code, weight reorders)
            t0 = _time.perf_counter()
            y = fn()
            one = (_time.perf_counter() - t0) * 1e3
            stats = TimeStats(one, one, one, 1)
        else:
            stats: TimeStats = timer(fn)
    except (RawconvError, RuntimeError) as exc:
        return _error_row(name, label_backend, label_impl, exc, detail, workspace_bytes=workspace, extra=extra)
    if monitor is not None:
        extra["machine"] = monitor.report().as_dict()
    row = Row(name, label_backend, label_impl, detail, workspace_bytes=workspace, extra=extra)
    with threads(1):
        # a few elementwise float64 passes: one thread takes milliseconds, while two OpenMP threads
        # on a busy machine wait for each other (a 4 ms scheduler tick per op)
        err = compare_to_reference(problem, y, ref, ref_abs, **(tol or {}))
    row.median_ms, row.min_ms, row.runs = stats.median_ms, stats.min_ms, stats.runs
    row.gflops = problem.flops / (stats.median_ms * 1e6) if stats.median_ms > 0 else float("nan")
    row.max_abs, row.max_rel, row.ok = err.max_abs, err.max_rel, err.ok
    row.status = "ok" if err.ok else "wrong"
    return row


def _torch_rows(problem, x, w, b, ref, ref_abs, timer) -> list[Row]:
    rows = []
    call = _torch_call(problem, x, w, b)
    # torch's own reduced precision (bf16 conv) rounds like any other implementation
    if problem.device.startswith("cuda"):
        cudnn = torch.backends.cudnn
        fp32_tf32 = problem.dtype == "float32" and cudnn.allow_tf32
        tol = {"compute": "tf32"} if fp32_tf32 else None
        # the detail names torch's cuDNN kernel and the rawconv candidate(s) it maps to (rawconv.torch_choice)
        with cudnn.flags(enabled=True, benchmark=False, deterministic=False, allow_tf32=cudnn.allow_tf32):
            rows.append(_measure(problem, "torch", "default", torch_backend(problem, x, w, b)
                                 + _compare_detail(problem, x, w, b), call, ref, ref_abs, timer, tol=tol))
        with cudnn.flags(enabled=True, benchmark=True, deterministic=False, allow_tf32=cudnn.allow_tf32):
            rows.append(_measure(problem, "torch", "cudnn.benchmark=True", torch_backend(problem, x, w, b)
                                 + _compare_detail(problem, x, w, b), call, ref, ref_abs, timer, tol=tol))
        with cudnn.flags(enabled=False):
            rows.append(_measure(problem, "torch", "cudnn disabled", torch_backend(problem, x, w, b), call,
                                 ref, ref_abs, timer))
        return rows
    backend = torch_backend(problem, x, w, b)
    if backend == "Mkldnn":
        try:
            call()
            backend += _trace_detail(torch_onednn_trace(call))
        except Exception:  # pragma: no cover - the trace is a bonus; never fail the comparison for it
            pass
    rows.append(_measure(problem, "torch", "default", backend, call, ref, ref_abs, timer))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about oneDNN TF32 on Intel GPUs when flags are set
        ctx = torch.backends.mkldnn.flags(enabled=False)
        ctx.__enter__()
    try:
        rows.append(_measure(problem, "torch", "mkldnn disabled", torch_backend(problem, x, w, b), call,
                             ref, ref_abs, timer))
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ctx.__exit__(None, None, None)
    return rows


# --------------------------------------------------------------------------- backend rows
_ROLE = {"x": "src", "w": "weights", "b": "bias", "y": "dst"}
#: include_ref="auto": oneDNN's reference implementations (ref:any) run only when
#: :func:`rawconv.onednn.reference_seconds` estimates one call at most this many seconds
REF_MAX_SECONDS = 1.0


def _ref_estimate(problem, layouts: str) -> float:
    """Estimated seconds of one call of the ref:any implementation with ``layouts`` (inf when oneDNN
    cannot say)."""
    from . import onednn

    try:
        return onednn.reference_seconds(problem, "forward", layouts)
    except RawconvError:
        return float("inf")


def _onednn_rows(problem, x, w, b, ref, ref_abs, timer, *, fpmath="strict", prepack=True,
                 include_ref=True, slow_s=None, ref_max_s: float = REF_MAX_SECONDS, allow_known_bad=False,
                 isolate=None, timing=(10, 2, None), **_kw) -> list[Row]:
    """Rows for every oneDNN implementation. ``include_ref``: True runs the reference
    implementations (ref:any), False drops them, "auto" runs them when one call is estimated
    (:func:`rawconv.onednn.reference_seconds`) at most ``ref_max_s`` seconds and otherwise lists
    them as "skipped". Known-bad implementations get a "known bad" row unless
    ``allow_known_bad``; ``isolate`` runs the candidates in a child process."""
    name = str(problem.name or problem.describe())
    try:
        from . import onednn

        plan = onednn.Convolution(x, w, b, problem.stride, list(zip(problem.pad_before, problem.pad_after)),
                                  problem.dilation, problem.groups, fpmath=fpmath, prepack=prepack)
        impls = plan.implementations
    except RawconvError as exc:
        return [_error_row(name, "onednn", "-", exc, f"oneDNN on {problem.describe()}")]
    rows = []
    compute = {"bf16": "bfloat16", "f16": "float16", "tf32": "tf32", "any": "bfloat16"}.get(fpmath)
    ref_est: dict = {}   # layouts -> the estimate of that ref:* implementation
    for impl in impls:
        label = f"[{impl.index}] {impl.name}"
        if impl.name.startswith("ref") and not include_ref:
            continue
        if impl.name.startswith("ref") and include_ref == "auto":
            if impl.layouts not in ref_est:
                ref_est[impl.layouts] = _ref_estimate(problem, impl.layouts)
            ref_s = ref_est[impl.layouts]
            if ref_s > ref_max_s:
                est = "unknown" if not math.isfinite(ref_s) else f"{ref_s:.1f} s"
                rows.append(Row(name, "onednn", label, f"{impl.layouts}; not run: estimated {est} per call "
                                f"(--ref runs it)", error=f"not run: estimated {est} per call (--ref runs it)",
                                status="skipped", workspace_bytes=impl.scratchpad_bytes,
                                extra={"index": impl.index, "choice": impl.choice,
                                       "estimated_s": ref_s if math.isfinite(ref_s) else None}))
                continue
        if impl.known_bad and not allow_known_bad:
            rows.append(Row(name, "onednn", label,
                            f"{impl.layouts}; not run: known bad ({impl.known_bad}; --allow-known-bad runs it)",
                            error="skipped (known bad)", status="known bad", workspace_bytes=impl.scratchpad_bytes,
                            extra={"index": impl.index, "choice": impl.choice}))
            continue
        reorders = ",".join(_ROLE.get(r, r) + ("(once)" if r == "w" and prepack else "")
                            for r in impl.reorders) or "none"
        detail = (f"{impl.layouts}; src {impl.formats.get('x')} weights {impl.formats.get('w')} "
                  f"dst {impl.formats.get('y')}; reorders {reorders}")
        extra = {"index": impl.index, "choice": impl.choice, "layouts": impl.layouts, "formats": impl.formats,
                 "reorders": list(impl.reorders), "fpmath": fpmath}
        if isolate:   # run below, all in one child process; the row keeps its place
            rows.append((impl, detail, extra))
            continue
        try:
            plan.select(impl.index, allow_known_bad=allow_known_bad)
        except RawconvError as exc:
            rows.append(_error_row(name, "onednn", label, exc, impl.layouts))
            continue
        rows.append(_measure(problem, "onednn", label, detail,
                             lambda: plan.execute(x, None if prepack else w, b), ref, ref_abs, timer,
                             tol={"compute": compute} if compute else None,
                             workspace=impl.scratchpad_bytes, extra=extra, slow_s=slow_s))
    plan.free()
    if isolate:
        _run_isolated(problem, rows, x, w, b, ref, ref_abs, compute, fpmath=fpmath, prepack=prepack,
                      slow_s=slow_s, allow_known_bad=allow_known_bad, isolate=isolate, timing=timing)
    return rows


def _run_isolated(problem, rows, x, w, b, ref, ref_abs, compute, *, fpmath, prepack, slow_s, allow_known_bad,
                  isolate, timing) -> None:
    """Run the (impl, detail, extra) placeholders of ``rows`` in a child process (rawconv._isolate)
    and put their Rows in place: a crash or hang is that row's error ("crashed: SIGSEGV",
    "timed out after 60 s"), and the comparison goes on."""
    from . import _isolate

    iso = _isolate.options(isolate)
    todo = [i for i, r in enumerate(rows) if isinstance(r, tuple)]
    iterations, warmup, budget_s = timing
    results = _isolate.run_onednn_candidates(
        problem, x, w, b, indices=[rows[i][0] for i in todo], fpmath=fpmath, prepack=prepack,
        allow_known_bad=allow_known_bad, slow_s=slow_s, iterations=iterations, warmup=warmup, budget_s=budget_s,
        check=False, keep_output=True, timeout_s=iso.timeout_s, env=iso.env, threads=iso.threads)
    for i, res in zip(todo, results):
        impl, detail, extra = rows[i]
        row = Row(str(problem.name or problem.describe()), "onednn", f"[{impl.index}] {impl.name}",
                  detail + "; isolated", workspace_bytes=impl.scratchpad_bytes,
                  extra=dict(extra, status=res["status"], problem=problem.describe(),
                             benchdnn=problem.to_benchdnn(strict=False), device=problem.device))
        if res["status"] != "ok":   # "crashed: SIGSEGV", "timed out after 60 s", ...: failures
            st = {"known bad": "skipped (known bad)"}.get(res["status"], res["status"])
            row.error = st + (f": {res['detail']}" if res["detail"] else "")
            row.status = res["status"]
        else:
            with threads(1):
                err = compare_to_reference(problem, res["output"], ref, ref_abs,
                                           **({"compute": compute} if compute else {}))
            row.median_ms, row.min_ms, row.runs = res["median_ms"], res["min_ms"], res["runs"]
            row.gflops = problem.flops / (row.median_ms * 1e6) if row.median_ms > 0 else float("nan")
            row.max_abs, row.max_rel, row.ok = err.max_abs, err.max_rel, err.ok
            row.status = "ok" if err.ok else "wrong"
        rows[i] = row


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


def _cudnn_rows(problem, x, w, b, ref, ref_abs, timer, engines=None, **_kw) -> list[Row]:
    name = str(problem.name or problem.describe())
    try:
        from . import cudnn
    except Exception as exc:  # pragma: no cover - import errors are bugs, shown as a row
        return [Row(name, "cudnn", "-", error=f"{type(exc).__name__}: {exc}", status="failed")]
    rows: list[Row] = []
    pad = list(zip(problem.pad_before, problem.pad_after))
    try:
        plan = cudnn.Convolution(x, w, b, problem.stride, pad, problem.dilation, problem.groups)
        algos = plan.algorithms(mode="find", math="all")
    except RawconvError as exc:
        return [_error_row(name, "cudnn", "-", exc, f"cuDNN on {problem.describe()}")]
    for a in algos:
        label = f"{a.algo} math={a.math}"
        if not a.ok:
            rows.append(Row(name, "cudnn", label, error=f"not supported here ({a.status})",
                            status="not supported", workspace_bytes=a.workspace_bytes))
            continue

        def run(a=a):
            return plan.execute(x, w, b)

        try:
            info = plan.select(a.algo_id, a.requested_math or a.math)
        except RawconvError as exc:
            rows.append(_error_row(name, "cudnn", label, exc))
            continue
        detail = (f"math set {info.math}, reported {info.math_reported}; "
                  f"{'deterministic' if info.deterministic else 'non-deterministic'}"
                  + ("; fused bias" if info.fused else "") + (f"; {'; '.join(info.notes)}" if info.notes else ""))
        rows.append(_measure(problem, "cudnn", label, detail, run, ref, ref_abs, timer,
                             tol=cudnn_tolerance(problem.dtype, info.math_reported, info.algo),
                             workspace=info.workspace_bytes,
                             extra={"choice": f"{info.algo}@{info.math}", "algo": info.algo,
                                    "algo_id": info.algo_id, "math": info.math,
                                    "math_reported": info.math_reported, "deterministic": info.deterministic,
                                    "find_ms": a.time_ms}))
    plan.free()
    return rows


def _cudnn_graph_rows(problem, x, w, b, ref, ref_abs, timer, engines=None, **_kw) -> list[Row]:
    """Rows for cuDNN graph-API engine configs: ``engines="all"`` (every engine with its default
    knobs, plus the heuristic modes' configs) or an int N (the first N of heuristic modes
    instant, b and fallback); none without ``engines``."""
    if not engines:
        return []
    name = str(problem.name or problem.describe())
    try:
        from . import cudnn_graph as G
    except Exception as exc:  # pragma: no cover - an import error is a bug: show it as a row
        return [Row(name, "cudnn-graph", "-", error=f"{type(exc).__name__}: {exc}", status="failed")]
    pad = list(zip(problem.pad_before, problem.pad_after))
    rows: list[Row] = []
    try:
        plan = G.GraphConvolution(x, w, b, problem.stride, pad, problem.dilation, problem.groups, allow_tf32=True)
        if str(engines) == "all":
            configs = plan.engines("all", limit=1)
        else:
            configs = plan.engines(list(G.HEURISTIC_MODES), limit=None)[: int(engines)]
    except (RawconvError, ValueError) as exc:
        return [_error_row(name, "cudnn-graph", "-", exc)]
    for cfg in configs:
        label = cfg.name
        notes = ",".join(cfg.numerical_notes) or "-"
        detail = f"notes {notes}; heuristic {','.join(cfg.heuristics) or '-'}"
        if cfg.finalizes is False:
            rows.append(Row(name, "cudnn-graph", label, detail, error=cfg.error or "does not finalize",
                            status="not supported"))
            continue
        try:
            plan.select(cfg)
        except RawconvError as exc:
            rows.append(_error_row(name, "cudnn-graph", label, exc, detail))
            continue
        rows.append(_measure(problem, "cudnn-graph", label, detail, lambda: plan.execute(x, w, b), ref, ref_abs,
                             timer, tol=G.tolerance_args(problem, cfg.numerical_notes),
                             workspace=cfg.workspace_bytes,
                             extra={"choice": cfg.name, "engine": cfg.engine, "knobs": list(cfg.knobs),
                                    "numerical_notes": list(cfg.numerical_notes),
                                    "behavior_notes": list(cfg.behavior_notes)}))
    plan.free()
    return rows


# --------------------------------------------------------------------------- driver
def compare_problem(problem: ConvProblem, *, x=None, w=None, b=None, iterations: int = 10, warmup: int = 2,
                    budget_s: float = 0.5, backends: Iterable[str] = ("torch", "onednn", "cudnn", "cudnn_graph"),
                    photo: bool = False, fpmath: str = "strict", prepack: bool = True,
                    include_ref: bool | str = True, ref_max_s: float = REF_MAX_SECONDS,
                    engines: str | int | None = None, allow_known_bad: bool = False, isolate=None) -> list[Row]:
    """Time and check ``problem`` on torch and every rawconv implementation; returns :class:`Row` s.

    ``iterations``/``warmup``: timed and untimed calls per candidate; ``budget_s``: seconds of
    warm-up and timing per candidate at most (at least one timed call each; a candidate whose
    first call, which also builds it, takes longer is timed by one more call alone). CPU problems
    run on oneDNN, ``cuda`` problems on cuDNN. ``include_ref``: oneDNN's reference
    implementations run (True), are dropped (False), or ("auto") run when one call is estimated
    at most ``ref_max_s`` seconds and are listed as "skipped" otherwise. oneDNN implementations
    that :mod:`rawconv.known_bad` lists get a "known bad" row unless ``allow_known_bad``;
    ``isolate`` (True, or ``rawconv._isolate.Isolation``/dict) runs them in a child process
    where a crash or hang becomes the row's status ("crashed: SIGSEGV", "timed out after N s").
    """
    if x is None:
        x, w, b = inputs_for(problem, photo=photo)
    ref = problem.reference(x, w, b)
    ref_abs = abs_reference(problem, x, w, b)
    on_gpu = problem.device.startswith("cuda")
    if on_gpu:
        # pure GPU time per call (calls queued behind a GPU sleep): host overheads differ by
        # entry point (cuDNN's legacy calls cost 50-150 us of host time) and would hide the kernels
        timer = lambda fn: time_cuda_queued(fn, iterations=iterations, warmup=warmup)  # noqa: E731
    else:
        timer = lambda fn: time_cpu(fn, iterations=iterations, warmup=warmup, budget_s=budget_s)  # noqa: E731
    backends = tuple(backends)
    rows: list[Row] = []
    if "torch" in backends:
        rows += _torch_rows(problem, x, w, b, ref, ref_abs, timer)
    opts = dict(fpmath=fpmath, prepack=prepack, include_ref=include_ref, slow_s=budget_s, ref_max_s=ref_max_s,
                allow_known_bad=allow_known_bad, isolate=isolate, timing=(iterations, warmup, budget_s),
                engines=engines)
    from ._backend import backends as registered

    for be in registered("cuda" if on_gpu else "cpu"):   # every registered backend of this device
        fn = be.rows_function() if be.name in backends else None
        if fn is not None:
            rows += fn(problem, x, w, b, ref, ref_abs, timer, **opts)
    return rows


def compare(problems: list[ConvProblem], *, photo_first: bool = True, progress: bool | None = None,
            on_problem: Callable[[ConvProblem, list[Row]], None] | None = None, **kw) -> ResultTable:
    """:func:`compare_problem` over a list; the first 2-D problem with 3 input channels gets the
    real photo when ``photo_first``. ``on_problem(problem, rows)`` is called after each.
    ``progress``: a tqdm bar over the problems naming the current layer and candidate (None:
    when stderr is a terminal or in a Jupyter kernel; see :mod:`rawconv._progress`). Returns a
    :class:`~rawconv.results.ResultTable` of every row (``.plot()``, ``_repr_html_``, exports)."""
    problems = list(problems)
    out = []
    with _progress.bar(progress, total=len(problems), desc="compare", unit="layer") as bar:
        for i, p in enumerate(problems):
            bar.note(str(p.name or p.describe()))
            rows = compare_problem(p, photo=photo_first and i == 0 and p.ndim == 2 and p.c == 3, **kw)
            out += rows
            bar.update()
            if on_problem is not None:
                with bar.write_mode():
                    on_problem(p, rows)
    return ResultTable(out, title=f"rawconv compare: {len(problems)} problem(s)")


def best_rawconv(rows: list[Row]) -> Row | None:
    """The fastest rawconv row (oneDNN or cuDNN) with status "ok" among ``rows``."""
    ok = [r for r in rows if r.backend != "torch" and r.category == "ok" and math.isfinite(r.median_ms)]
    return min(ok, key=lambda r: r.median_ms) if ok else None


def machine_report(rows: list[Row]) -> LoadReport | None:
    """What the machine did while ``rows`` were timed: their :class:`~rawconv.bench.LoadReport` s
    (``extra["machine"]``) merged, each weighted by its seconds. When the average looks fine but
    more than a tenth of the timing was oversubscribed, the merge of those rows alone (so a busy
    minute inside a long run is not averaged away). None when no row has a report."""
    ms = [r.extra["machine"] for r in rows if isinstance(r.extra.get("machine"), dict)]
    if not ms:
        return None

    def merged(part):
        secs = sum(m["seconds"] for m in part)

        def avg(key):
            vals = [(m[key], m["seconds"]) for m in part if m.get(key) is not None]
            return sum(v * t for v, t in vals) / (sum(t for _, t in vals) or 1e-9) if vals else None

        return LoadReport(secs, max(m["cpus"] for m in part), max(m["threads"] for m in part), avg("other_cpus"),
                          avg("waited"), part[-1].get("loadavg"))

    report = merged(ms)
    over = [m for m in ms if m.get("oversubscribed")]
    if not report.oversubscribed and sum(m["seconds"] for m in over) > 0.1 * report.seconds:
        report = merged(over)
    return report


def timing_warnings(rows: list[Row], hint: str | None = None) -> list[str]:
    """Warning lines for ``rows``' timings (:func:`rawconv.bench.timing_warnings`, which also
    explains ``hint``): the machine was oversubscribed while they were timed, or some median/min
    spreads exceed the limit."""
    from .bench import timing_warnings as tw

    return tw(machine_report(rows), [r.spread for r in rows if r.ran], hint=hint)


def summary(rows: list[Row], *, hint: str | None = None) -> dict:
    """Per problem: torch default time, best rawconv time and their ratio; overall geometric mean
    of torch default / best rawconv (over problems where both have status "ok": failed, not
    supported, skipped and wrong rows are left out; None when no problem has both), the rows of
    each status category, and whether the timings can be trusted (``timing_warnings`` empty;
    ``hint`` ends the oversubscription warning, see :func:`timing_warnings`)."""
    by_problem: dict[str, list[Row]] = {}
    for r in rows:
        by_problem.setdefault(r.problem, []).append(r)
    per, ratios = [], []
    for name, rs in by_problem.items():
        torch_def = next((r for r in rs if r.backend == "torch" and r.implementation == "default"), None)
        best = best_rawconv(rs)
        comparable = torch_def is not None and torch_def.category == "ok" and best is not None and best.median_ms > 0
        ratio = torch_def.median_ms / best.median_ms if comparable else None
        if ratio is not None and math.isfinite(ratio) and ratio > 0:
            ratios.append(ratio)
        per.append({"problem": name, "torch_ms": torch_def.median_ms if torch_def and torch_def.ran else None,
                    "torch_status": torch_def.status if torch_def else None,
                    "best": best.implementation if best else None, "best_ms": best.median_ms if best else None,
                    "ratio": ratio, "unstable": bool(comparable and (torch_def.unstable or best.unstable)),
                    "rawconv_rows": sum(r.backend != "torch" for r in rs),
                    "rawconv_ran": any(r.backend != "torch" and r.ran for r in rs)})

    def label(r):
        return f"{r.problem}: {r.backend} {r.implementation}"

    checked = [r for r in rows if r.ran]
    warn = timing_warnings(rows, hint)
    report = machine_report(rows)
    return {"problems": len(by_problem), "results": len(checked),
            "within_tolerance": sum(r.category == "ok" for r in rows),
            "outside_tolerance": [label(r) for r in rows if r.category == "wrong"],
            # a library that did not load is reported once, under libraries_not_loaded
            "failed": [f"{label(r)}: {r.status if r.status != 'failed' else r.error}" for r in rows
                       if r.category == "failed" and not r.extra.get("library_not_loaded")],
            "rawconv_failed": sum(r.category == "failed" and r.backend != "torch" for r in rows),
            "not_supported": [f"{label(r)}: {r.error}" for r in rows if r.category == "not supported"],
            "skipped": [f"{label(r)}: {r.error or r.status}" for r in rows if r.category == "skipped"],
            "libraries_not_loaded": sorted({f"{r.backend}: {r.error}" for r in rows
                                            if r.extra.get("library_not_loaded")}),
            # rawconv rows there, none ran (a problem whose only candidates --no-ref left out has none)
            "no_rawconv_result": [p["problem"] for p in per if p["rawconv_rows"] and not p["rawconv_ran"]],
            "comparable_problems": len(ratios),
            "geomean_torch_over_best": geomean(ratios) if ratios else None,
            "timings_trustworthy": not warn, "timing_warnings": warn,
            "machine": report.as_dict() if report is not None else None,
            "per_problem": per}


#: ``rawconv compare`` exit codes, most severe first (the first that applies is returned).
EXIT_CODES = {
    0: "every result is within tolerance; no rawconv candidate failed",
    1: "a result is outside tolerance (a wrong answer)",
    2: "bad command line or problem (nothing ran), or an error that stopped the run (out of memory, an output "
       "file that cannot be written): one 'rawconv: error:' line says which",
    3: "nothing to compare: a library failed to load, or a problem on which no rawconv candidate ran "
       "(every one listed failed, was not supported or was skipped)",
    4: "a rawconv candidate failed (a library error other than not supported; torch's own failures are "
       "listed but do not count)",
}


def exit_code(s: dict) -> int:
    """The exit code (:data:`EXIT_CODES`) for a :func:`summary`; timing warnings do not change it."""
    if s["outside_tolerance"]:
        return 1
    if s["libraries_not_loaded"] or s["no_rawconv_result"] or s["problems"] == 0:
        return 3
    if s["rawconv_failed"]:
        return 4
    return 0


def write_json(path: str, rows: list[Row], meta: dict, problems: list[ConvProblem] | None = None, *,
               summary: dict | None = None) -> None:
    """Write rows + summary (``summary`` or :func:`summary` of ``rows``) + environment (+ the
    problems, as dataclass fields) to ``path`` as JSON. Non-finite floats are written as null."""
    data = {"meta": meta, "summary": summary if summary is not None else globals()["summary"](rows),
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


@contextlib.contextmanager
def threads(n: int | None):
    """Temporarily set torch's (and so oneDNN's OpenMP) thread count."""
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


# --------------------------------------------------------------------------- tuning records
_REGISTRY_NAME = {"cudnn-graph": "cudnn_graph"}   # compare's row label -> the backend registry's name


def records(rows: Iterable[Row], problems: Iterable[ConvProblem], *, fpmath: str = "strict",
            allow_known_bad: bool = False, threads: int | None = None) -> list:
    """The :class:`rawconv.tuning.TuningRecord` of the fastest correct rawconv row of each problem
    (problems where none ran correctly get none): its backend, the problem (``problems`` gives
    the fields; rows name it), direction ``forward``, the candidate's stable name
    (``row.choice``: ``"jit:avx2@any"``, ``"IMPLICIT_PRECOMP_GEMM@fma"``, ``"eng72{k24=4}"``),
    the options ``compare`` ran it with (oneDNN: ``fpmath``, weights layout, ``threads``: the
    plan's count, one for a problem under 2**17 FLOPs, else ``threads``, default torch's current
    count; cuDNN: the math type set), the library version and device, its
    median/min time and error against float64, and the layer's name as ``label``.
    :func:`rawconv.tuning.replay` (or ``rawconv replay FILE``) runs exactly that choice again."""
    from . import tuning

    by_key = {(str(p.name or p.describe()), p.device): p for p in problems}
    groups: dict = {}
    for r in rows:
        groups.setdefault((r.problem_name, r.extra.get("device", "cpu")), []).append(r)
    out = []
    env_cache: dict = {}
    for (name, device), rs in groups.items():
        p = by_key.get((name, device))
        best = best_rawconv(rs)
        if p is None or best is None:
            continue
        backend = _REGISTRY_NAME.get(best.backend, best.backend)
        ex = best.extra
        if backend == "onednn":
            from . import onednn

            plan_threads = onednn._plan_threads("auto", p)   # compare's plans take the default threads="auto"
            options = onednn._key_options(fpmath, "direct", "nchw", allow_known_bad,
                                          threads if plan_threads is None else plan_threads)
            detail = {"impl": best.choice.partition("@")[0], "layouts": ex.get("layouts"), "index": ex.get("index"),
                      "formats": ex.get("formats"), "reorders": ex.get("reorders"),
                      "scratchpad_bytes": best.workspace_bytes}
            env = None
        elif backend == "cudnn":
            from . import cudnn

            options = cudnn._key_options(ex.get("math") or "fma")
            detail = {k: ex.get(k) for k in ("algo", "algo_id", "math", "math_reported", "deterministic")}
            detail["workspace_bytes"] = best.workspace_bytes
            env = env_cache.setdefault((backend, device), cudnn._environment(torch.device(device).index))
        elif backend == "cudnn_graph":
            from . import cudnn_graph

            options = {"allow_tf32": True}
            detail = {k: ex.get(k) for k in ("engine", "knobs", "numerical_notes", "behavior_notes")}
            detail["workspace_bytes"] = best.workspace_bytes
            env = env_cache.setdefault((backend, device), cudnn_graph._environment(torch.device(device).index or 0))
        else:   # a backend registered later: its choice and the environment it reports
            options, detail, env = {}, {}, None
        key = tuning.TuningKey.for_backend(backend, p, "forward", options, environment=env)
        err = {"max_abs": best.max_abs, "max_rel": best.max_rel, "ratio": None}
        err = {k: (v if v is None or math.isfinite(v) else None) for k, v in err.items()}
        out.append(tuning.TuningRecord(key, best.choice, _finite_json(detail), p.layout, best.median_ms, best.min_ms,
                                       err, label=name))
    return out


def _record_tolerance(record, problem: ConvProblem) -> dict:
    """:func:`rawconv.check.tolerance_for`'s arguments for a result of ``record``'s choice."""
    from .check import tolerance_for

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
    ``drift`` (median now / recorded - 1), ``machine`` (on CPU: the
    :class:`~rawconv.bench.LoadReport` of the timing, as for compare's rows, so
    :func:`timing_warnings` and :func:`replay_summary` apply) and ``environment`` (the
    ``(field, recorded, current)`` triples that differ: library version, device). Environment differences do not stop a
    replay here (``rawconv replay --strict`` refuses them first, as
    :meth:`rawconv.tuning.TuningRecord.check_environment` with ``strict=True`` does)."""
    from . import tuning
    from .check import reference

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
    from .problem import to_layout

    dy = to_layout(dy, problem.layout).to(dev)
    if k.direction == "forward":
        fn, tensors = (lambda: plan.execute(x, w, b)), {"x": x, "w": w, "b": b}
    elif k.direction == "backward_data":
        fn, tensors = (lambda: plan.execute(grad_y=dy, w=w)), {"dy": dy, "w": w}
    else:
        fn, tensors = (lambda: plan.execute(x, grad_y=dy)), {"x": x, "dy": dy}
    if dev.startswith("cuda"):
        timer = lambda f: time_cuda_queued(f, iterations=iterations, warmup=warmup)  # noqa: E731
    else:
        timer = lambda f: time_cpu(f, iterations=iterations, warmup=warmup, budget_s=budget_s)  # noqa: E731
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
    plan.free()
    ref, ref_abs = reference(problem, k.direction, {n: t for n, t in tensors.items() if t is not None},
                             activation=k.activation)
    with threads(1):
        err = compare_to_reference(problem, y[0] if isinstance(y, tuple) else y, ref, ref_abs,
                                   **_record_tolerance(rec, problem))
    if rec.median_ms:
        extra["drift"] = stats.median_ms / rec.median_ms - 1.0
    return Result(k.backend, rec.choice, name, k.direction, None, "ok" if err.ok else "wrong", stats.median_ms,
                  stats.min_ms, stats.runs, err, None,
                  "", extra=extra)


# every public entry point raises only rawconv's exception classes (rawconv._guard)
from . import _guard  # noqa: E402

_guard.guard_module(globals(), "compare_problem", "compare", "real_photo", "inputs_for", "summary", "write_json",
                    "records", "replay", "replay_summary")
