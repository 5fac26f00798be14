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
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from .bench import TimeStats, geomean, time_cpu, time_cuda_queued
from .errors import RawconvError
from .problem import ConvProblem, abs_reference, compare_to_reference

__all__ = ["Row", "compare_problem", "compare", "real_photo", "inputs_for", "summary"]


@dataclass
class Row:
    """One result line: which code ran, how long it took, how close it came to float64.

    Times in ms (median and min of timed calls after warm-up), ``gflops`` = problem flops /
    median time, ``max_abs``/``max_rel`` against the float64 reference (``max_rel`` = max |err| /
    max |ref|), ``ok`` = every element within the tolerance for its dtype and math,
    ``workspace_bytes`` = oneDNN scratchpad or cuDNN workspace.
    """

    problem: str
    backend: str
    implementation: str
    detail: str = ""
    median_ms: float = float("nan")
    min_ms: float = float("nan")
    runs: int = 0
    gflops: float = float("nan")
    max_abs: float = float("nan")
    max_rel: float = float("nan")
    ok: bool | None = None
    workspace_bytes: int | None = None
    error: str = ""
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for k, v in list(d.items()):
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = None
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
        return str(be).split(".")[-1]
    except Exception as exc:  # pragma: no cover - private API
        return f"unknown ({type(exc).__name__})"


def torch_onednn_trace(fn: Callable[[], object]) -> list[dict]:
    """What torch's own (bundled) oneDNN executes for one call of ``fn``: one dict per primitive
    (``kind``: "convolution" / "reorder", ``impl``: e.g. "jit:avx512_core", ``formats``: the memory
    descriptors as oneDNN's verbose mode prints them). Runs ``fn`` once under
    ``torch.backends.mkldnn.verbose`` with the C stdout redirected to a temporary file.
    Returns ``[]`` when torch's path did not go through oneDNN."""
    import ctypes
    import os
    import sys
    import tempfile

    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                    fn()
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    out = []
    for line in text.splitlines():
        parts = line.split(",")
        if not line.startswith("onednn_verbose") or "exec" not in parts:
            continue
        i = parts.index("exec")
        if len(parts) > i + 4:
            out.append({"kind": parts[i + 2], "impl": parts[i + 3], "formats": parts[i + 5] if len(parts) > i + 5 else ""})
    return out


def _trace_detail(trace: list[dict]) -> str:
    convs = [t for t in trace if t["kind"] == "convolution"]
    if not convs:
        return ""
    fm = {}
    for item in convs[0]["formats"].split():
        role, _, rest = item.partition(":")
        bits = rest.split(":")
        if len(bits) >= 4 and bits[3]:
            fm[role] = bits[3]
    reorders = sum(t["kind"] == "reorder" for t in trace)
    return (f"; torch's oneDNN ran {convs[0]['impl']} (src {fm.get('src', '?')}, weights {fm.get('wei', '?')})"
            f" + {reorders} reorder(s)")


def _measure(problem, label_backend, label_impl, detail, fn, ref, ref_abs, timer, *, tol=None,
             workspace=None, extra=None, slow_s: float | None = None) -> Row:
    row = Row(str(problem.name or problem.describe()), label_backend, label_impl, detail,
              workspace_bytes=workspace, extra=dict(extra or {}, problem=problem.describe(),
                                                     benchdnn=problem.to_benchdnn(), device=problem.device))
    try:
        import time as _time

        t0 = _time.perf_counter()
        y = fn()
        first_s = _time.perf_counter() - t0
        if slow_s is not None and first_s > slow_s:
            # a very slow candidate (oneDNN's ref:any): its first call is its measurement
            stats = TimeStats(first_s * 1e3, first_s * 1e3, first_s * 1e3, 1)
        else:
            stats: TimeStats = timer(fn)
    except RawconvError as exc:
        row.error = f"{type(exc).__name__}: {exc}"
        return row
    except RuntimeError as exc:
        row.error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        return row
    err = compare_to_reference(problem, y, ref, ref_abs, **(tol or {}))
    row.median_ms, row.min_ms, row.runs = stats.median_ms, stats.min_ms, stats.runs
    row.gflops = problem.flops / (stats.median_ms * 1e6) if stats.median_ms > 0 else float("nan")
    row.max_abs, row.max_rel, row.ok = err.max_abs, err.max_rel, err.ok
    return row


def _torch_rows(problem, x, w, b, ref, ref_abs, timer) -> list[Row]:
    rows = []
    call = _torch_call(problem, x, w, b)
    # torch's own reduced precision (bf16 conv) rounds like any other implementation
    if problem.device.startswith("cuda"):
        cudnn = torch.backends.cudnn
        fp32_tf32 = problem.dtype == "float32" and cudnn.allow_tf32
        tol = {"compute": "tf32"} if fp32_tf32 else None
        with cudnn.flags(enabled=True, benchmark=False, deterministic=False, allow_tf32=cudnn.allow_tf32):
            rows.append(_measure(problem, "torch", "default", torch_backend(problem, x, w, b), call, ref, ref_abs,
                                 timer, tol=tol))
        with cudnn.flags(enabled=True, benchmark=True, deterministic=False, allow_tf32=cudnn.allow_tf32):
            rows.append(_measure(problem, "torch", "cudnn.benchmark=True", torch_backend(problem, x, w, b), call,
                                 ref, ref_abs, timer, tol=tol))
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
REF_AUTO_MAX_FLOPS = 5e8   # include_ref="auto": oneDNN's ref:any is run only on problems up to this size


def _onednn_rows(problem, x, w, b, ref, ref_abs, timer, *, fpmath="strict", prepack=True,
                 include_ref=True, slow_s=None, allow_known_bad=False, isolate=None, timing=(10, 2, None)) -> list[Row]:
    from . import onednn

    rows = []
    try:
        plan = onednn.Convolution(x, w, b, problem.stride, list(zip(problem.pad_before, problem.pad_after)),
                                  problem.dilation, problem.groups, fpmath=fpmath, prepack=prepack)
        impls = plan.implementations
    except RawconvError as exc:
        return [Row(str(problem.name or problem.describe()), "onednn", "-", error=f"{type(exc).__name__}: {exc}")]
    compute = {"bf16": "bfloat16", "f16": "float16", "tf32": "tf32", "any": "bfloat16"}.get(fpmath)
    for impl in impls:
        if impl.name.startswith("ref") and not include_ref:
            continue
        if impl.name.startswith("ref") and include_ref == "auto" and problem.flops > REF_AUTO_MAX_FLOPS:
            rows.append(Row(str(problem.name or problem.describe()), "onednn", f"[{impl.index}] {impl.name}",
                            f"{impl.layouts}; not run: oneDNN's reference code runs at ~0.1-1 GFLOP/s and this "
                            f"problem is {problem.flops / 1e9:.1f} GFLOP (use --ref)", error="skipped (slow reference)",
                            workspace_bytes=impl.scratchpad_bytes))
            continue
        if impl.known_bad and not allow_known_bad:
            rows.append(Row(str(problem.name or problem.describe()), "onednn", f"[{impl.index}] {impl.name}",
                            f"{impl.layouts}; not run: known bad ({impl.known_bad}; --allow-known-bad runs it)",
                            error="skipped (known bad)", workspace_bytes=impl.scratchpad_bytes))
            continue
        reorders = ",".join(_ROLE.get(r, r) + ("(once)" if r == "w" and prepack else "")
                            for r in impl.reorders) or "none"
        detail = (f"{impl.layouts}; src {impl.formats.get('x')} weights {impl.formats.get('w')} "
                  f"dst {impl.formats.get('y')}; reorders {reorders}")
        extra = {"index": impl.index, "layouts": impl.layouts, "formats": impl.formats,
                 "reorders": list(impl.reorders), "fpmath": fpmath}
        if isolate:   # run below, all in one child process; the row keeps its place
            rows.append((impl, detail, extra))
            continue
        plan.select(impl.index, allow_known_bad=allow_known_bad)
        rows.append(_measure(problem, "onednn", f"[{impl.index}] {impl.name}", detail,
                             lambda: plan.execute(x, w, b), ref, ref_abs, timer,
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
                             benchdnn=problem.to_benchdnn(), device=problem.device))
        if res["status"] != "ok":   # "crashed: SIGSEGV", "timed out after 60 s", ...: failures
            st = {"known bad": "skipped (known bad)"}.get(res["status"], res["status"])
            row.error = st + (f": {res['detail']}" if res["detail"] else "")
        else:
            err = compare_to_reference(problem, res["output"], ref, ref_abs, **({"compute": compute} if compute else {}))
            row.median_ms, row.min_ms, row.runs = res["median_ms"], res["min_ms"], res["runs"]
            row.gflops = problem.flops / (row.median_ms * 1e6) if row.median_ms > 0 else float("nan")
            row.max_abs, row.max_rel, row.ok = err.max_abs, err.max_rel, err.ok
        rows[i] = row


def cudnn_tolerance(dtype: str, math_reported: str, algo: str = "") -> dict:
    """Tolerance arguments (for :func:`~rawconv.problem.compare_to_reference`) for a cuDNN result:
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
        return [Row(name, "cudnn", "-", error=f"{type(exc).__name__}: {exc}")]
    rows: list[Row] = []
    pad = list(zip(problem.pad_before, problem.pad_after))
    try:
        plan = cudnn.Convolution(x, w, b, problem.stride, pad, problem.dilation, problem.groups)
        algos = plan.algorithms(mode="find", math="all")
    except RawconvError as exc:
        return [Row(name, "cudnn", "-", error=f"{type(exc).__name__}: {exc}")]
    for a in algos:
        label = f"{a.algo} math={a.math}"
        if not a.ok:
            rows.append(Row(name, "cudnn", label, error=f"not supported here ({a.status})",
                            workspace_bytes=a.workspace_bytes))
            continue

        def run(a=a):
            return plan.execute(x, w, b)

        try:
            info = plan.select(a.algo_id, a.requested_math or a.math)
        except RawconvError as exc:
            rows.append(Row(name, "cudnn", label, error=f"{type(exc).__name__}: {exc}"))
            continue
        detail = (f"math set {info.math}, reported {info.math_reported}; "
                  f"{'deterministic' if info.deterministic else 'non-deterministic'}"
                  + ("; fused bias" if info.fused else "") + (f"; {'; '.join(info.notes)}" if info.notes else ""))
        rows.append(_measure(problem, "cudnn", label, detail, run, ref, ref_abs, timer,
                             tol=cudnn_tolerance(problem.dtype, info.math_reported, info.algo),
                             workspace=info.workspace_bytes,
                             extra={"algo": info.algo, "algo_id": info.algo_id, "math": info.math,
                                    "math_reported": info.math_reported, "deterministic": info.deterministic,
                                    "find_ms": a.time_ms}))
    plan.free()
    if engines:
        rows += _cudnn_graph_rows(problem, x, w, b, ref, ref_abs, timer, engines)
    return rows


def _cudnn_graph_rows(problem, x, w, b, ref, ref_abs, timer, engines) -> list[Row]:
    """Rows for cuDNN graph-API engine configs: ``engines="all"`` (every engine with its default
    knobs, plus the heuristic modes' configs) or an int N (the first N of heuristic modes
    instant, b and fallback)."""
    name = str(problem.name or problem.describe())
    try:
        from . import cudnn_graph as G
    except Exception as exc:  # pragma: no cover - an import error is a bug: show it as a row
        return [Row(name, "cudnn-graph", "-", error=f"{type(exc).__name__}: {exc}")]
    pad = list(zip(problem.pad_before, problem.pad_after))
    rows: list[Row] = []
    try:
        plan = G.GraphConvolution(x, w, b, problem.stride, pad, problem.dilation, problem.groups, allow_tf32=True)
        if str(engines) == "all":
            configs = plan.engines("all", limit=1)
        else:
            configs = plan.engines(list(G.HEURISTIC_MODES), limit=None)[: int(engines)]
    except (RawconvError, ValueError) as exc:
        return [Row(name, "cudnn-graph", "-", error=f"{type(exc).__name__}: {exc}")]
    for cfg in configs:
        label = cfg.name
        notes = ",".join(cfg.numerical_notes) or "-"
        detail = f"notes {notes}; heuristic {','.join(cfg.heuristics) or '-'}"
        if cfg.finalizes is False:
            rows.append(Row(name, "cudnn-graph", label, detail, error=cfg.error or "does not finalize"))
            continue
        try:
            plan.select(cfg)
        except RawconvError as exc:
            rows.append(Row(name, "cudnn-graph", label, detail, error=f"{type(exc).__name__}: {exc}"))
            continue
        rows.append(_measure(problem, "cudnn-graph", label, detail, lambda: plan.execute(x, w, b), ref, ref_abs,
                             timer, tol=G.tolerance_args(problem, cfg.numerical_notes),
                             workspace=cfg.workspace_bytes,
                             extra={"engine": cfg.engine, "knobs": list(cfg.knobs),
                                    "numerical_notes": list(cfg.numerical_notes),
                                    "behavior_notes": list(cfg.behavior_notes)}))
    plan.free()
    return rows


# --------------------------------------------------------------------------- driver
def compare_problem(problem: ConvProblem, *, x=None, w=None, b=None, iterations: int = 10, warmup: int = 2,
                    budget_s: float = 0.5, backends: Iterable[str] = ("torch", "onednn", "cudnn"),
                    photo: bool = False, fpmath: str = "strict", prepack: bool = True,
                    include_ref: bool = True, engines: str | int | None = None, allow_known_bad: bool = False,
                    isolate=None) -> list[Row]:
    """Time and check ``problem`` on torch and every rawconv implementation; returns :class:`Row` s.

    ``iterations``/``warmup``: timed and untimed calls per candidate; ``budget_s``: seconds of
    timing per candidate at most (slow reference implementations stop early, at least one timed
    call each). CPU problems run on oneDNN, ``cuda`` problems on cuDNN. oneDNN implementations
    that :mod:`rawconv.known_bad` lists get a "known bad" row unless ``allow_known_bad``;
    ``isolate`` (True, or ``rawconv._isolate.Isolation``/dict) runs them in a child process
    where a crash or hang becomes the row's error.
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
    if not on_gpu and "onednn" in backends:
        rows += _onednn_rows(problem, x, w, b, ref, ref_abs, timer, fpmath=fpmath, prepack=prepack,
                             include_ref=include_ref, slow_s=budget_s, allow_known_bad=allow_known_bad,
                             isolate=isolate, timing=(iterations, warmup, budget_s))
    if on_gpu and "cudnn" in backends:
        rows += _cudnn_rows(problem, x, w, b, ref, ref_abs, timer, engines=engines)
    return rows


def compare(problems: list[ConvProblem], *, photo_first: bool = True, progress: bool = False,
            on_problem: Callable[[ConvProblem, list[Row]], None] | None = None, **kw) -> list[Row]:
    """:func:`compare_problem` over a list; the first 2-D problem with 3 input channels gets the
    real photo when ``photo_first``. ``on_problem(problem, rows)`` is called after each."""
    out = []
    it = problems
    if progress:
        from tqdm import tqdm

        it = tqdm(problems, desc="problems", unit="conv", leave=False)
    for i, p in enumerate(it):
        rows = compare_problem(p, photo=photo_first and i == 0 and p.ndim == 2 and p.c == 3, **kw)
        out += rows
        if on_problem is not None:
            on_problem(p, rows)
    return out


def best_rawconv(rows: list[Row]) -> Row | None:
    """The fastest correct rawconv row (oneDNN or cuDNN) among ``rows``."""
    ok = [r for r in rows if r.backend != "torch" and r.ok and math.isfinite(r.median_ms)]
    return min(ok, key=lambda r: r.median_ms) if ok else None


def summary(rows: list[Row]) -> dict:
    """Per problem: torch default time, best rawconv time and their ratio; overall geometric mean
    of torch default / best rawconv, and counts of results within / outside tolerance and failures."""
    by_problem: dict[str, list[Row]] = {}
    for r in rows:
        by_problem.setdefault(r.problem, []).append(r)
    per, ratios = [], []
    for name, rs in by_problem.items():
        torch_def = next((r for r in rs if r.backend == "torch" and r.implementation == "default"), None)
        best = best_rawconv(rs)
        ratio = (torch_def.median_ms / best.median_ms) if (torch_def and best and torch_def.ok is not None
                                                              and best.median_ms > 0) else float("nan")
        if math.isfinite(ratio):
            ratios.append(ratio)
        per.append({"problem": name, "torch_ms": torch_def.median_ms if torch_def else None,
                    "best": best.implementation if best else None, "best_ms": best.median_ms if best else None,
                    "ratio": ratio})
    checked = [r for r in rows if r.ok is not None]
    return {"problems": len(by_problem), "results": len(checked), "within_tolerance": sum(bool(r.ok) for r in checked),
            "outside_tolerance": [f"{r.problem}: {r.backend} {r.implementation}" for r in checked if not r.ok],
            "failed": [f"{r.problem}: {r.backend} {r.implementation}: {r.error}" for r in rows
                       if r.error and not r.error.startswith(("skipped", "not supported"))],
            "not_supported": [f"{r.problem}: {r.backend} {r.implementation}" for r in rows
                              if r.error.startswith("not supported")],
            "skipped": [f"{r.problem}: {r.backend} {r.implementation}" for r in rows
                        if r.error.startswith("skipped")],
            "geomean_torch_over_best": geomean(ratios), "per_problem": per}


def write_json(path: str, rows: list[Row], meta: dict, problems: list[ConvProblem] | None = None) -> None:
    """Write rows + summary + environment (+ the problems, as dataclass fields) to ``path`` as JSON."""
    data = {"meta": meta, "summary": summary(rows), "rows": [r.as_dict() for r in rows]}
    if problems is not None:
        data["problems"] = [dict(dataclasses.asdict(p), describe=p.describe(), benchdnn=p.to_benchdnn(),
                                 flops=p.flops, y_shape=p.y_shape) for p in problems]
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=str)


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
