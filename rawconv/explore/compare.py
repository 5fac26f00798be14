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
import functools
import json
import math
import warnings

from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from ..core import progress as _progress
from ..core.bench import LoadMonitor, LoadReport, TimeStats, geomean, time_cpu, time_cuda_queued  # noqa: F401
from ..core.errors import LibraryNotFoundError, NotSupportedError, RawconvError
from ..core.options import PRECISIONS
from ..core.check import abs_reference, compare_to_reference
from ..core.problem import ConvProblem
from ..core.results import Result, ResultTable, json_safe, status_group
from .headline import headline  # noqa: F401  (the summary's lines; compare.headline)
from .confirm import CONFIRM_CARRY, CONFIRM_MORE, CONFIRM_ROUNDS, WEIGHT_SETS, confirm, picked, ranked  # noqa: F401
from ..pytorch.torch_choice import compare_detail, trace_detail, conv_backend_name, torch_onednn_trace  # noqa: F401

__all__ = ["Row", "STATUSES", "status_category", "compare_problem", "compare", "real_photo", "inputs_for", "summary", "records", "replay",
           "exit_code", "EXIT_CODES", "grad_output_for", "libraries", "headline", "best_rawconv", "first_choice"]


#: The statuses ``compare`` gives a :class:`Row` (each is also its own group in
#: :data:`rawconv.results.STATUSES`, the one status vocabulary of rawconv)::
#:
#:   "ok"                 ran, every element within tolerance of the float64 reference
#:   "wrong"              ran, some element outside tolerance (a wrong answer)
#:   "failed"             raised an error (a library error other than "not supported", or the
#:                        library did not load: then extra["library_not_loaded"] is True)
#:   "not supported"      the library says it offers nothing for this (NotSupportedError:
#:                        dnnl_unimplemented, CUDNN_STATUS_NOT_SUPPORTED; bf16 on an AVX2 CPU)
#:   "skipped"            not run on purpose (oneDNN's reference code estimated too slow: --ref)
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
                 extra: dict | None = None, status: str = "", direction: str = "forward"):
        if not status:
            status = "failed" if error else "ok" if ok else "wrong" if ok is False else "skipped"
        Result.__init__(self, backend, implementation, problem, direction, None, status, median_ms, min_ms, runs,
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
        d["extra"] = json_safe({k: v for k, v in self.extra.items() if k not in ("gflops", "max_abs", "max_rel")})
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
        from ..core.problem import to_layout

        x = to_layout(img.to(problem.torch_dtype).contiguous(), problem.layout).to(x.device)
    return x, w, b


def grad_output_for(problem: ConvProblem, *, seed: int = 0, device: str | None = None) -> torch.Tensor:
    """The gradient of the output that ``compare`` feeds the backward directions: normal random
    values (float64 draws, seeded with ``seed + 1``) of ``problem.y_shape`` in the problem's
    dtype and memory layout."""
    from ..core.problem import to_layout

    g = torch.Generator().manual_seed(seed + 1)
    dy = torch.randn(problem.y_shape, generator=g, dtype=torch.float64).to(problem.torch_dtype)
    return to_layout(dy, problem.layout).to(device or problem.device)


def _references(problem: ConvProblem, direction: str, x, w, b, dy):
    """(float64 result, its error scale) for ``direction``."""
    if direction == "forward":
        return problem.reference(x, w, b), abs_reference(problem, x, w, b)
    from ..core.check import reference

    tensors = {"dy": dy, "w": w} if direction == "backward_data" else {"x": x, "dy": dy}
    return reference(problem, direction, tensors)


def _tolerance(problem: ConvProblem, direction: str, compute: str | None = None) -> dict:
    """:func:`rawconv.check.tolerance_for`'s keyword arguments for a result of ``direction``."""
    from ..core.check import tolerance_for

    return tolerance_for(problem, direction, compute=compute).kwargs()


# --------------------------------------------------------------------------- torch rows
def _torch_call(problem: ConvProblem, x, w, b, direction: str = "forward", dy=None) -> Callable[[], torch.Tensor]:
    """torch's own call for ``direction``: ``F.conv{1,2,3}d`` forward (asymmetric padding as
    ``F.pad`` first); the backward directions are ``torch.ops.aten.convolution_backward``, what
    autograd calls for a convolution's gradient, with only the input's (backward_data) or the
    weight's (backward_weights) output asked for. Returns the result tensor (dx; dw)."""
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[problem.ndim]
    padlist = []
    for bf, af in reversed(list(zip(problem.pad_before, problem.pad_after))):
        padlist += [bf, af]
    if direction == "forward":
        if problem.symmetric:
            pad = problem.pad_before
            return lambda: conv(x, w, b, problem.stride, pad, problem.dilation, problem.groups)
        return lambda: conv(F.pad(x, padlist), w, b, problem.stride, 0, problem.dilation, problem.groups)
    nd = problem.ndim
    xp = x if problem.symmetric else F.pad(x, padlist)
    pad = list(problem.pad_before) if problem.symmetric else [0] * nd
    data = direction == "backward_data"
    mask = [data, not data, False]
    op = torch.ops.aten.convolution_backward
    args = (list(problem.stride), pad, list(problem.dilation), False, [0] * nd, problem.groups, mask)
    if data and not problem.symmetric:   # the gradient of the padded input, cropped to the input
        crop = (Ellipsis,) + tuple(slice(bf, bf + n) for bf, n in zip(problem.pad_before, problem.in_spatial))
        return lambda: op(dy, xp, w, None, *args)[0][crop]
    return lambda: op(dy, xp, w, None, *args)[0 if data else 1]


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
             workspace=None, extra=None, slow_s: float | None = None, direction: str = "forward",
             setup: Callable[[], object] | None = None, mkldnn: bool | None = None) -> Row:
    """Run one candidate once (which also builds it) and check its result against the float64
    reference; time it with ``timer`` (a function of ``fn`` giving :class:`TimeStats`), or, with
    ``timer=None``, leave the timing to :func:`_time_rounds` (the row keeps ``fn``, ``setup``,
    run untimed before its calls in each round, and ``mkldnn``, torch's mkldnn flag during its
    calls: None leaves the caller's). A candidate whose first call takes longer than ``slow_s`` is timed by one more call
    alone (oneDNN's ref:any). Returns the :class:`Row`."""
    extra = dict(extra or {}, problem=problem.describe(), benchdnn=problem.to_benchdnn(strict=False), device=problem.device)
    name = str(problem.name or problem.describe())
    _progress.note(f"{name}: {label_backend} {label_impl}")
    monitor = LoadMonitor() if problem.device == "cpu" and timer is not None else None
    pending = False
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
            extra["timing"] = "one call (its first took longer than the budget)"
        elif timer is None:
            stats, pending = None, True
        else:
            stats: TimeStats = timer(fn)
    except (RawconvError, RuntimeError) as exc:
        return _error_row(name, label_backend, label_impl, exc, detail, workspace_bytes=workspace, extra=extra,
                          direction=direction)
    if monitor is not None:
        extra["machine"] = monitor.report().as_dict()
    row = Row(name, label_backend, label_impl, detail, workspace_bytes=workspace, extra=extra, direction=direction)
    if pending:
        row._pending = (fn, setup, mkldnn)
    if isinstance(y, tuple):   # backward_weights with a bias: (dw, db); dw is checked
        y = y[0]
    if tuple(y.shape) != tuple(ref.shape):
        # a result of another shape is a wrong answer, not an error of the run (torch's convolution
        # of zero input channels gives (N, 0, *out) where the sum over no channels is the bias)
        if stats is not None:
            row.median_ms, row.min_ms, row.runs = stats.median_ms, stats.min_ms, stats.runs
        row.status, row.error = "wrong", f"shape mismatch: result {tuple(y.shape)}, reference {tuple(ref.shape)}"
        row.detail = f"{row.error}; {row.detail}" if row.detail else row.error   # (the table's notes show it)
        return row
    with threads(1):
        # a few elementwise float64 passes: one thread takes milliseconds, while two OpenMP threads
        # on a busy machine wait for each other (a 4 ms scheduler tick per op)
        err = compare_to_reference(problem, y, ref, ref_abs, **(tol or {}))
    if stats is not None:
        _set_times(row, problem, stats)
    row.max_abs, row.max_rel, row.ok = err.max_abs, err.max_rel, err.ok
    row.status = "ok" if err.ok else "wrong"
    return row


def _set_times(row: Row, problem: ConvProblem, stats: TimeStats) -> None:
    """``row``'s median, min, runs and GFLOP/s from ``stats``."""
    row.median_ms, row.min_ms, row.runs = stats.median_ms, stats.min_ms, stats.runs
    row.gflops = problem.flops / (stats.median_ms * 1e6) if stats.median_ms > 0 else float("nan")


def _round_plan(iterations: int) -> tuple[int, int]:
    """(rounds, calls per round) that spread ``iterations`` timed calls per candidate
    (:func:`rawconv.bench.round_plan`)."""
    from ..core.bench import round_plan

    return round_plan(iterations)


def _time_rounds(problem: ConvProblem, rows: list[Row], *, iterations: int, warmup: int, budget_s: float | None,
                 confirm_rounds: int) -> None:
    """Time the rows :func:`_measure` left pending (``row._pending``) in interleaved rounds
    (:func:`rawconv.bench.time_rounds`) and fill their times, ``extra["rounds"]`` (per-round
    times, wall and CPU time per call, flags), ``extra["ratio"]`` (torch default's time over the
    row's, round by round: :func:`rawconv.bench.ratio`) and ``extra["machine"]``. Then the
    confirmation step (:func:`rawconv.explore.confirm.confirm`): torch default, oneDNN's first
    choice and the fastest few rows of these rounds (weights per call; prepacked) are timed again
    in ``confirm_rounds`` fresh rounds, more where ratios spread; the best of N is chosen among
    those few on half of the fresh rounds and its figure taken from the other half (free of the
    winner's curse, and of the luck of these rounds' order); ``extra["confirmed"]`` holds what
    the fresh rounds measured. Returns None."""
    from ..core import bench

    pend = [(str(i), r) for i, r in enumerate(rows) if getattr(r, "_pending", None) is not None]
    if not pend:
        return
    rounds, calls = _round_plan(iterations)
    old_mk = torch._C._get_mkldnn_enabled()

    def entry(r):
        fn, setup, mk = r._pending

        def prepare():
            torch._C._set_mkldnn_enabled(old_mk if mk is None else mk)
            if setup is not None:
                setup()
        return fn, prepare

    monitor = LoadMonitor()
    try:
        timed = bench.time_rounds({k: entry(r) for k, r in pend}, rounds=rounds, calls=calls, warmup=min(warmup, 1),
                                  budget_s=budget_s)
        machine = monitor.report().as_dict()
        keys = {id(r): k for k, r in pend}
        torch_def = next((r for r in rows if r.torch_default and id(r) in keys), None)
        base = timed[keys[id(torch_def)]] if torch_def is not None else None
        for k, r in pend:
            _set_times(r, problem, timed[k].stats())
            r.extra["rounds"] = timed[k].as_dict()
            r.extra["machine"] = machine
            q = bench.ratio(base, timed[k]) if base is not None and r is not torch_def else None
            if q is not None:
                r.extra["ratio"] = q.as_dict()
        if base is None or confirm_rounds < 1 or torch_def.category != "ok":
            return
        confirm(rows, torch_def, first_choice(rows), keys, entry, calls=calls, budget_s=budget_s,
                confirm_rounds=confirm_rounds)
    finally:
        torch._C._set_mkldnn_enabled(old_mk)
        for _, r in pend:
            del r._pending


def libraries() -> dict:
    """The libraries and versions a comparison involves, as row labels (``compare`` writes them
    into every row's ``extra["library"]`` and each table's title): ``torch`` ("torch 2.14.1"),
    ``torch_onednn`` (the oneDNN bundled in torch: "3.12.0", None when torch does not say),
    ``torch_cudnn`` (the cuDNN torch uses: "9.24.0", None without one), ``onednn`` (rawconv's:
    "oneDNN 3.2.0", or why it did not load), ``cudnn`` (rawconv's: "cuDNN 9.24.0"; loaded only
    where torch sees a GPU). Never raises."""
    out = {"torch": f"torch {torch.__version__.split('+')[0]}", "torch_onednn": None, "torch_cudnn": None}
    try:
        from ..pytorch.torch_choice import torch_part

        v = torch_part().get("onednn_bundled")
        out["torch_onednn"] = v.split()[0] if v else None
    except Exception:  # noqa: BLE001 - a label: never fail the comparison for it
        pass
    try:
        from .. import onednn

        out["onednn"] = f"oneDNN {onednn.library_version()}"
    except Exception as exc:  # noqa: BLE001
        out["onednn"] = f"oneDNN (not loaded: {type(exc).__name__})"
    out["cudnn"] = "cuDNN"
    if torch.cuda.is_available():
        try:
            v = torch.backends.cudnn.version()
            out["torch_cudnn"] = f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if v else None
            from .. import cudnn

            out["cudnn"] = f"cuDNN {cudnn.library_version()}"
        except Exception:  # noqa: BLE001
            pass
    return out


def _torch_library(libs: dict, backend: str) -> str:
    """The label of what torch ran: its version and, for its oneDNN / cuDNN backends, that
    library's version (torch's own copy)."""
    from ..pytorch.torch_choice import CUDNN_BACKENDS, ONEDNN_BACKENDS

    if backend in ONEDNN_BACKENDS and libs.get("torch_onednn"):
        return f"{libs['torch']}'s oneDNN {libs['torch_onednn']}"
    if backend in CUDNN_BACKENDS and libs.get("torch_cudnn"):
        return f"{libs['torch']}'s cuDNN {libs['torch_cudnn']}"
    return libs["torch"]   # its own code (the row's detail names the backend: Slow2d...)


#: what torch's call does with the weights, in each row's ``extra["weights"]``
TORCH_WEIGHTS = "per call"


def _torch_rows(problem, x, w, b, ref, ref_abs, timer, *, direction="forward", dy=None, libs=None) -> list[Row]:
    rows = []
    libs = libs or libraries()
    call = _torch_call(problem, x, w, b, direction, dy)
    tolerance = _tolerance(problem, direction)
    weights = None if direction == "backward_weights" else TORCH_WEIGHTS
    # torch's own reduced precision (bf16 conv) rounds like any other implementation
    if problem.device.startswith("cuda"):
        cudnn = torch.backends.cudnn
        fp32_tf32 = problem.dtype == "float32" and cudnn.allow_tf32
        tol = _tolerance(problem, direction, "tf32") if fp32_tf32 else tolerance
        backend = torch_backend(problem, x, w, b)
        extra = {"library": _torch_library(libs, backend), "weights": weights}
        # the detail names torch's cuDNN kernel and the rawconv candidate(s) it maps to (rawconv.torch_choice)
        with cudnn.flags(enabled=True, benchmark=False, deterministic=False, allow_tf32=cudnn.allow_tf32):
            rows.append(_measure(problem, "torch", "default", backend
                                 + compare_detail(problem, x, w, b, direction=direction), call, ref, ref_abs, timer,
                                 tol=tol, extra=extra, direction=direction))
        with cudnn.flags(enabled=True, benchmark=True, deterministic=False, allow_tf32=cudnn.allow_tf32):
            rows.append(_measure(problem, "torch", "cudnn.benchmark=True", backend
                                 + compare_detail(problem, x, w, b, direction=direction), call, ref, ref_abs, timer,
                                 tol=tol, extra=extra, direction=direction))
        with cudnn.flags(enabled=False):
            off = torch_backend(problem, x, w, b)
            rows.append(_measure(problem, "torch", "cudnn disabled", off, call, ref, ref_abs, timer, tol=tolerance,
                                 extra={"library": _torch_library(libs, off), "weights": weights},
                                 direction=direction))
        return rows
    backend = torch_backend(problem, x, w, b)
    detail = backend
    if backend == "Mkldnn":
        try:
            call()
            detail += trace_detail(torch_onednn_trace(call))
        except Exception:  # pragma: no cover - the trace is a bonus; never fail the comparison for it
            pass
    if weights:
        detail += "; weights per call"
    rows.append(_measure(problem, "torch", "default", detail, call, ref, ref_abs, timer, tol=tolerance,
                         extra={"library": _torch_library(libs, backend), "weights": weights}, direction=direction))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about oneDNN TF32 on Intel GPUs when flags are set
        ctx = torch.backends.mkldnn.flags(enabled=False)
        ctx.__enter__()
    try:
        off = torch_backend(problem, x, w, b)
        rows.append(_measure(problem, "torch", "mkldnn disabled", off, call, ref, ref_abs, timer, tol=tolerance,
                             extra={"library": _torch_library(libs, off), "weights": weights}, direction=direction,
                             mkldnn=False))
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ctx.__exit__(None, None, None)
    return rows


# --------------------------------------------------------------------------- backend rows
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


def _onednn_rows(problem, x, w, b, ref, ref_abs, timer, *, fpmath="strict", prepack="both",
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
    """The oneDNN plan :func:`_onednn_rows` times: built on the tensors for the forward direction,
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
    """The call :func:`_onednn_rows` times for one weights handling ``mode`` (``"prepacked"``: the
    plan's snapshot, else the weights passed on every call). Returns a function of no arguments."""
    packed = mode == "prepacked"
    if direction == "forward":
        return lambda: plan.execute(x, None if packed else w, b)
    if direction == "backward_data":
        return (lambda: plan.execute(grad_y=dy)) if packed else (lambda: plan.execute(grad_y=dy, w=w))
    return lambda: plan.execute(x, grad_y=dy)


def _onednn_not_run(problem, name: str, impl, label: str, base: dict, include_ref, ref_max_s: float, ref_est: dict,
                    allow_known_bad: bool, direction: str) -> list[Row] | None:
    """Whether :func:`_onednn_rows` leaves the implementation ``impl`` out: a reference one
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


# --------------------------------------------------------------------------- any backend's rows
def _plan_arguments(direction: str, x, w, b, dy) -> tuple:
    """The plan contract's ``hot_run`` arguments for ``direction``."""
    if direction == "forward":
        return (x, w, b)
    if direction == "backward_data":
        return (dy, w)
    return (x, dy)


def plan_rows(be) -> Callable:
    """``compare``'s rows function for a registered backend ``be`` without one of its own, built on
    the plan contract (:class:`rawconv.core.backend.Plan`): every candidate of
    ``be.plan_for(problem, direction).candidates()``, each in a plan of its own (freed when the
    comparison ends), run through ``hot_run``. ``fpmath`` is passed as the plan's ``precision``
    where it is one of :data:`rawconv.options.PRECISIONS`."""

    def rows(problem, x, w, b, ref, ref_abs, timer, *, direction: str = "forward", dy=None, fpmath: str = "strict",
             finalizers: list | None = None, slow_s: float | None = None, **_other) -> list:
        options = {"precision": fpmath if fpmath in PRECISIONS else "strict"}
        args = _plan_arguments(direction, x, w, b, dy)
        out = []
        try:
            listing_plan = be.plan_for(problem, direction, options)
            try:
                cands = list(listing_plan.candidates())
            finally:
                listing_plan.free()
        except Exception as exc:  # noqa: BLE001 - a backend that cannot list this problem: one row says why
            return [_error_row(str(problem.name or problem.describe()), be.name, "(listing)", exc,
                               direction=direction)]
        for cand in cands:
            try:
                plan = be.plan_for(problem, direction, options, choice=cand.choice)
            except Exception as exc:  # noqa: BLE001 - the row says why
                out.append(_error_row(str(problem.name or problem.describe()), be.name, cand.choice, exc,
                                      direction=direction))
                continue
            if finalizers is not None:
                finalizers.append(plan.free)
            notes = ", ".join(getattr(cand, "notes", ()) or ())
            out.append(_measure(problem, be.name, cand.choice, notes, lambda plan=plan: plan.hot_run(*args), ref,
                                ref_abs, timer, tol=_tolerance(problem, direction),
                                workspace=getattr(cand, "workspace_bytes", None),
                                extra={"library": be.library}, slow_s=slow_s, direction=direction))
        return out

    return rows


# --------------------------------------------------------------------------- driver
def compare_problem(problem: ConvProblem, *, x=None, w=None, b=None, iterations: int = 10, warmup: int = 2,
                    budget_s: float = 0.5, backends: Iterable[str] | None = None,
                    photo: bool = False, fpmath: str = "strict", prepack: bool | str = "both",
                    include_ref: bool | str = True, ref_max_s: float = REF_MAX_SECONDS,
                    engines: str | int | None = None, allow_known_bad: bool = False, isolate=None,
                    direction: str = "forward", dy=None, libs: dict | None = None,
                    confirm_rounds: int = CONFIRM_ROUNDS) -> list[Row]:
    """Time and check ``problem`` on torch and every rawconv implementation; returns :class:`Row` s.

    ``direction``: "forward" (``F.conv{1,2,3}d``), "backward_data" (the input's gradient) or
    "backward_weights" (the weight's; "backward_filter" too): torch's rows run
    ``torch.ops.aten.convolution_backward`` (what autograd calls) for that output alone, rawconv's
    the library's backward primitives, all on the same gradient of the output (``dy``, default
    :func:`grad_output_for`) and checked against float64 (:func:`rawconv.check.reference`).

    ``iterations``/``warmup``: timed and untimed calls per candidate; ``budget_s``: seconds of
    timing per candidate at most (at least one timed call per round; a candidate whose first
    call, which also builds it, takes longer is timed by one more call alone). CPU problems run on
    oneDNN, ``cuda`` problems on cuDNN. On the CPU every candidate is run and checked first, then
    all are timed together in interleaved rounds (:func:`rawconv.bench.time_rounds`: up to
    :data:`rawconv.bench.MAX_ROUNDS` rounds sharing ``iterations`` calls per candidate; a call during which our
    threads waited for a CPU is tried again; each row's time is the median over rounds of its
    fastest clean call, ``extra["rounds"]`` says what was measured and ``extra["ratio"]`` holds
    torch default's time over the row's, taken within each round); then torch default,
    oneDNN's first choice and the best rows chosen on those rounds are timed again in
    ``confirm_rounds`` fresh rounds (``extra["confirmed"]``: the figures :func:`summary` and the
    headline use; 0 leaves the step out). CUDA problems are timed per candidate (GPU time, calls
    queued behind a GPU sleep). ``prepack`` (oneDNN): "both" (default) times each
    implementation whose weights need a reorder twice, with the weights read and reordered on
    every call (as torch's call does: the like-for-like row) and with a snapshot reordered once
    (a second row, labelled "(prepacked)"); False only the first, True only the second.
    ``include_ref``: oneDNN's reference implementations run (True), are dropped (False), or
    ("auto") run when one call is estimated at most ``ref_max_s`` seconds and are listed as
    "skipped" otherwise. oneDNN implementations that :mod:`rawconv.known_bad` lists get a "known
    bad" row unless ``allow_known_bad``; ``isolate`` (True, or ``rawconv._isolate.Isolation``/dict)
    runs them in a child process where a crash or hang becomes the row's status ("crashed:
    SIGSEGV", "timed out after N s"). Every row names the library and version that ran it
    (``extra["library"]``, :func:`libraries`) and what it did with the weights
    (``extra["weights"]``: "per call", "prepacked", "as given", None for backward_weights).
    ``backends``: the names whose rows run (None: ``"torch"`` and every registered backend,
    :func:`rawconv.core.backend.backends`; those of the problem's device run); a backend without
    a rows function of its own gets :func:`plan_rows`' rows, through its plans.
    Raises :class:`~rawconv.errors.ArgumentError` for an unknown direction or ``prepack``.
    """
    from ..core.backend import canonical_direction

    direction = canonical_direction(direction)
    _prepack_modes(prepack)
    if direction != "forward" and problem.unbatched:
        problem = problem.with_(unbatched=False)
    if x is None:
        x, w, b = inputs_for(problem, photo=photo)
    if direction != "forward" and x.dim() == problem.ndim + 1:
        x = x.unsqueeze(0)
    if direction != "forward" and dy is None:
        dy = grad_output_for(problem, device=x.device)
    libs = libs or libraries()
    ref, ref_abs = _references(problem, direction, x, w, b, dy)
    on_gpu = problem.device.startswith("cuda")
    if on_gpu:
        # pure GPU time per call (calls queued behind a GPU sleep): host overheads differ by
        # entry point (cuDNN's legacy calls cost 50-150 us of host time) and would hide the kernels
        timer = lambda fn: time_cuda_queued(fn, iterations=iterations, warmup=warmup)  # noqa: E731
    else:   # CPU: every candidate is checked first, then all are timed together in interleaved rounds
        timer = None
    from ..core.backend import backends as registered

    backends = ("torch", *(be.name for be in registered())) if backends is None else tuple(backends)
    rows: list[Row] = []
    finalizers: list = []
    try:
        if "torch" in backends:
            rows += _torch_rows(problem, x, w, b, ref, ref_abs, timer, direction=direction, dy=dy, libs=libs)
        opts = dict(fpmath=fpmath, prepack=prepack, include_ref=include_ref, slow_s=budget_s, ref_max_s=ref_max_s,
                    allow_known_bad=allow_known_bad, isolate=isolate, timing=(iterations, warmup, budget_s),
                    engines=engines, direction=direction, dy=dy, libs=libs, finalizers=finalizers)
        for be in registered("cuda" if on_gpu else "cpu"):   # every registered backend of this device
            fn = (be.rows_function() or plan_rows(be)) if be.name in backends else None
            if fn is not None:
                rows += fn(problem, x, w, b, ref, ref_abs, timer, **opts)
        if timer is None:
            _progress.note(f"{problem.name or problem.describe()}: interleaved rounds")
            _time_rounds(problem, rows, iterations=iterations, warmup=warmup, budget_s=budget_s,
                         confirm_rounds=confirm_rounds)
    finally:
        for r in rows:   # a run stopped part-way: nothing keeps the plans alive
            r.__dict__.pop("_pending", None)
        for free in finalizers:
            free()
    return rows


def compare(problems: list[ConvProblem], *, photo_first: bool = True, progress: bool | None = None,
            on_problem: Callable[[ConvProblem, list[Row]], None] | None = None, **kw) -> ResultTable:
    """:func:`compare_problem` over a list (``kw``: its keyword arguments, e.g. ``direction``,
    ``prepack``); the first 2-D problem with 3 input channels gets the real photo when
    ``photo_first``. ``on_problem(problem, rows)`` is called after each.
    ``progress``: a tqdm bar over the problems naming the current layer and candidate (None:
    when stderr is a terminal or in a Jupyter kernel; see :mod:`rawconv._progress`). Returns a
    :class:`~rawconv.results.ResultTable` of every row (``.plot()``, ``_repr_html_``, exports),
    whose title names the libraries and versions compared and whose exports carry the run's
    reliability (:meth:`~rawconv.results.ResultTable.reliability`)."""
    from ..core.backend import canonical_direction

    problems = list(problems)
    direction = canonical_direction(kw.get("direction", "forward"))
    _prepack_modes(kw.get("prepack", "both"))
    kw.setdefault("libs", libraries())
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
    what = "" if direction == "forward" else f" {direction}"
    return ResultTable(out, title=f"rawconv compare{what}: {len(problems)} problem(s); "
                                  f"{versions_line(kw['libs'], problems)}")


def versions_line(libs: dict, problems=()) -> str:
    """Which library and version each side runs, in a few words: ``"torch 2.14.1 (its own oneDNN
    3.12.0) vs rawconv's oneDNN 3.2.0"``."""
    cuda = any(str(getattr(p, "device", "cpu")).startswith("cuda") for p in problems)
    cpu = not problems or any(str(getattr(p, "device", "cpu")) == "cpu" for p in problems)
    sides = []
    if cpu:
        own = f" (its own oneDNN {libs['torch_onednn']})" if libs.get("torch_onednn") else ""
        sides.append(f"{libs['torch']}{own} vs rawconv's {libs.get('onednn')}")
    if cuda:
        own = f" (its cuDNN {libs['torch_cudnn']})" if libs.get("torch_cudnn") else ""
        sides.append(f"{libs['torch']}{own} vs rawconv's {libs.get('cudnn')}")
    return "; ".join(sides)


def best_rawconv(rows: list[Row], weights: str = "any") -> Row | None:
    """The fastest rawconv row (oneDNN or cuDNN) with status "ok" among ``rows``; ``weights``:
    among the rows that read their weights on every call ("per call", like torch's call; rows
    whose implementation takes the weights as given count for both), that use a prepacked
    snapshot ("prepacked"), or all ("any", the default). Where the confirmation step chose one
    for ``weights`` among the fastest few of the first rounds (``extra["confirmed"]["picked"]``),
    that one; otherwise the fastest by the first rounds' median time."""
    got = picked(rows, weights) if weights != "any" else None
    return got if got is not None else next(iter(ranked(rows, weights)), None)


def first_choice(rows: list[Row]) -> Row | None:
    """rawconv's oneDNN first choice (position 0 of oneDNN's list, what ``onednn.forward`` runs
    without ``impl``) with the weights read on every call, when it ran within tolerance: one
    choice against torch's one choice, no selection on the timings."""
    return next((r for r in rows if r.backend == "onednn" and r.extra.get("index") == 0 and r.category == "ok"
                 and math.isfinite(r.median_ms) and r.extra.get("weights") in WEIGHT_SETS["per call"]), None)


def machine_report(rows: list[Row]) -> LoadReport | None:
    """What the machine did while ``rows`` were timed (:func:`rawconv.results.machine_report`:
    their load reports merged; a busy stretch inside a long run is not averaged away)."""
    from ..core.results import machine_report as merged

    return merged(rows)


def timing_warnings(rows: list[Row], hint: str | None = None) -> list[str]:
    """Warning lines for ``rows``' timings (:func:`rawconv.results.reliability`): rows timed in
    interleaved rounds that waited for a CPU in most rounds or whose rounds disagree; for rows
    timed otherwise (GPU, isolated), the machine was oversubscribed while they were timed, or
    some median/min spreads exceed the limit (:func:`rawconv.bench.timing_warnings`, which also
    explains ``hint``)."""
    from ..core.results import reliability

    return reliability(rows, hint)["warnings"]


def _geomean_or_none(ratios) -> float | None:
    ratios = [v for v in ratios if v is not None and math.isfinite(v) and v > 0]
    return geomean(ratios) if ratios else None


def summary(rows: list[Row], *, hint: str | None = None) -> dict:
    """Per problem: torch default time, best rawconv time and their ratio; overall geometric means
    of torch default / rawconv over the problems where both have status "ok" (failed, not
    supported, skipped and wrong rows are left out; None when no problem has both):

    * ``geomean_torch_over_best``: like for like with torch's call, which reads its weights on
      every call: the fastest rawconv row that does too (``weights`` "per call" or "as given"),
      **best of N**: ``best_of`` gives N per problem (the rawconv rows that ran within
      tolerance). Where :func:`compare_problem`'s confirmation rounds ran, each problem's figure
      is the median of the ratios taken within each of those fresh rounds (the best was picked
      on other rounds: no winner's curse; ``geomean_torch_over_best_where_picked`` is what the
      rounds it was picked on said); otherwise a selection made on these timings, which
      favours rawconv by the noise alone;
    * ``geomean_torch_over_first_choice``: rawconv's oneDNN first choice, weights per call
      (:func:`first_choice`: one choice each, no selection; None without oneDNN rows);
    * ``geomean_torch_over_best_prepacked``: the fastest row with a weight snapshot reordered
      once (which torch's ``F.conv2d`` cannot do), best of N too; None when no row was prepacked.

    Each has an ``_interval``: a 90% percentile bootstrap interval over the rounds
    (:func:`rawconv.bench.geomean_interval`; None without per-round ratios). Also the rows of
    each status category, ``confirmed_problems``, ``confirm_rounds``, and whether the timings
    can be trusted (``timing_warnings`` empty; ``hint`` ends the oversubscription warning, see
    :func:`timing_warnings`)."""
    by_problem: dict[str, list[Row]] = {}
    for r in rows:
        by_problem.setdefault(r.problem, []).append(r)
    per = []
    got: dict = {"best": [], "first_choice": [], "prepacked": []}
    any_packed = any(r.extra.get("weights") == "prepacked" for r in rows)
    for name, rs in by_problem.items():
        entry, figures = _summary_problem(name, rs, any_packed)
        per.append(entry)
        for k, v in figures.items():
            got[k].append(v)
    ratios = [v for v, _, _ in got["best"]]
    first_ratios = [v for v, _, _ in got["first_choice"]]
    packed_ratios = [v for v, _, _ in got["prepacked"]]
    from ..core.bench import geomean_interval

    def interval(k, clean_only=False):
        lists = [pr for v, pr, c in got[k] if v is not None and (c or not clean_only)]
        if not lists or all(len(pr) < 2 for pr in lists):
            return None
        return list(geomean_interval(lists))

    def clean_mean(k):
        return _geomean_or_none([v for v, _, c in got[k] if c])

    # the problems whose headline rows (best, first choice, prepacked) were all measured in clean rounds
    clean_problems = sum(all(c for v, _, c in (got[k][i] for k in got) if v is not None) and
                         got["best"][i][0] is not None for i in range(len(per)))

    def label(r):
        return f"{r.problem}: {r.backend} {r.implementation}"

    checked = [r for r in rows if r.ran]
    conf = [r.extra["confirmed"]["rounds"]["rounds"] for r in rows if isinstance(r.extra.get("confirmed"), dict)]
    warn = timing_warnings(rows, hint)
    report = machine_report(rows)
    best_of = [p["best_of"] for p in per if p["ratio"] is not None]
    sets = [len(p["confirmed_set"]) for p in per if p["ratio"] is not None and p["confirmed_set"]]
    return {"problems": len(by_problem), "results": len(checked),
            "directions": sorted({r.direction for r in rows}),
            "within_tolerance": sum(r.category == "ok" for r in rows),
            "outside_tolerance": [label(r) + (f": {r.error}" if r.error else "") for r in rows if r.category == "wrong"],
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
            "comparable_problems": sum(v is not None for v in ratios),
            "geomean_torch_over_best": _geomean_or_none(ratios),
            "geomean_torch_over_best_interval": interval("best"),
            "geomean_torch_over_best_where_picked": _geomean_or_none(
                [p["ratio_where_picked"] for p in per if p["ratio"] is not None]),
            "best_of": [min(best_of), max(best_of)] if best_of else None,
            "geomean_torch_over_first_choice": _geomean_or_none(first_ratios),
            "geomean_torch_over_first_choice_interval": interval("first_choice"),
            "first_choice_problems": sum(v is not None for v in first_ratios),
            "geomean_torch_over_best_prepacked": _geomean_or_none(packed_ratios),
            "geomean_torch_over_best_prepacked_interval": interval("prepacked"),
            "prepacked_problems": sum(v is not None for v in packed_ratios),
            "confirmed_problems": sum(p["ratio_confirmed"] for p in per if p["ratio"] is not None),
            # the same figures over the problems whose rounds had clean calls (what the headline shows)
            "clean_problems": clean_problems, "geomean_torch_over_best_clean": clean_mean("best"),
            "geomean_torch_over_best_clean_interval": interval("best", True),
            "geomean_torch_over_first_choice_clean": clean_mean("first_choice"),
            "geomean_torch_over_first_choice_clean_interval": interval("first_choice", True),
            "geomean_torch_over_best_prepacked_clean": clean_mean("prepacked"),
            "geomean_torch_over_best_prepacked_clean_interval": interval("prepacked", True),
            "rounds_problems": sum(any(isinstance(r.extra.get("rounds"), dict) for r in rs)
                                   for rs in by_problem.values()),
            "confirm_rounds": max(conf, default=None),
            # the best of N chosen among a few rows on half of the fresh rounds (its figure from the other half)
            "confirmed_set_size": [min(sets), max(sets)] if sets else None,
            "best_changed_by_confirmation": sum(p["best"] != p["best_first_rounds"] for p in per
                                                if p["ratio"] is not None and p["confirmed_set"]),
            "confirm_rounds_range": [min(conf), max(conf)] if conf else None,
            "libraries": sorted({r.library for r in rows if r.library}),
            "timings_trustworthy": not warn, "timing_warnings": warn,
            "machine": report.as_dict() if report is not None else None,
            "per_problem": per}


def _confirmed_ratio(r: Row | None, weights: str | None = None) -> dict | None:
    """The ratio torch default / ``r`` measured in the confirmation rounds (``extra["confirmed"]``:
    where it was chosen there for ``weights``, from the rounds the choice did not use), else in
    the rounds it was chosen on (``extra["ratio"]``); None when neither was measured."""
    if r is None:
        return None
    c = r.extra.get("confirmed")
    p = (c.get("picked") or {}).get(weights) if isinstance(c, dict) else None
    if isinstance(p, dict) and isinstance(p.get("ratio"), dict):
        return dict(p["ratio"], confirmed=True)
    if isinstance(c, dict) and isinstance(c.get("ratio"), dict):
        return dict(c["ratio"], confirmed=True)
    q = r.extra.get("ratio")
    return dict(q, confirmed=False) if isinstance(q, dict) else None


def _summary_problem(name: str, rs: list[Row], any_packed: bool) -> tuple:
    """:func:`summary`'s figures for one problem ``name`` and its rows ``rs`` (``any_packed``:
    whether any row of the run was prepacked). Returns ``(entry, ratios)``: the ``per_problem``
    dict, and ``{"best", "first_choice", "prepacked": (ratio or None, per-round ratios)}``: torch
    default's time over the best rawconv row, over the first choice and over the best prepacked
    row (None where not comparable): the confirmation rounds' figure where they ran, else the
    rounds' median ratio, else the ratio of median times."""
    torch_def = next((r for r in rs if r.backend == "torch" and r.implementation == "default"), None)
    t_ok = torch_def is not None and torch_def.category == "ok" and torch_def.median_ms > 0
    best = best_rawconv(rs, "per call")
    first = first_choice(rs)
    packed = best_rawconv(rs, "prepacked") if any_packed else None

    def ratio_to(r, weights=None):
        if not t_ok or r is None or not r.median_ms > 0:
            return None, [], None
        q = _confirmed_ratio(r, weights)
        if q is not None and q.get("value") is not None:
            return q["value"], list(q.get("per_round") or [q["value"]]), q
        v = torch_def.median_ms / r.median_ms
        return v, [v], None

    out = {"best": ratio_to(best, "per call"), "first_choice": ratio_to(first), "prepacked": ratio_to(packed, "prepacked")}
    n = sum(r.backend != "torch" and r.category == "ok" and math.isfinite(r.median_ms)
            and r.extra.get("weights") in WEIGHT_SETS["per call"] for r in rs)

    def interval(k):
        q = out[k][2]
        return [q["lo"], q["hi"]] if q is not None else None

    sel = best.extra.get("ratio") if best is not None else None
    entry = {"problem": name, "torch_ms": torch_def.median_ms if torch_def and torch_def.ran else None,
             "torch_status": torch_def.status if torch_def else None,
             "torch_library": torch_def.library if torch_def else None,
             "best": best.implementation if best else None, "best_ms": best.median_ms if best else None,
             "best_library": best.library if best else None, "best_of": n,
             "ratio": out["best"][0], "ratio_interval": interval("best"),
             "ratio_confirmed": bool(out["best"][2] and out["best"][2]["confirmed"]),
             "ratio_where_picked": sel.get("value") if isinstance(sel, dict) and t_ok else None,
             # the rows carried into the confirmation's fresh rounds, the best chosen among them there
             "confirmed_set": _picked(best, "per call").get("among"),
             "best_first_rounds": next((r.implementation for r in ranked(rs, "per call")), None),
             "prepacked_confirmed_set": _picked(packed, "prepacked").get("among"),
             "first_choice": first.implementation if first else None,
             "first_choice_ms": first.median_ms if first else None, "first_choice_ratio": out["first_choice"][0],
             "first_choice_interval": interval("first_choice"),
             "best_prepacked": packed.implementation if packed else None,
             "best_prepacked_ms": packed.median_ms if packed else None,
             "prepacked_ratio": out["prepacked"][0], "prepacked_interval": interval("prepacked"),
             "unstable": bool(out["best"][0] is not None and (torch_def.unstable or best.unstable)),
             "rawconv_rows": sum(r.backend != "torch" for r in rs),
             "rawconv_ran": any(r.backend != "torch" and r.ran for r in rs)}
    # a figure from rounds where both sides had a clean call (bench.ratio's "clean"); one measured
    # without rounds (GPU rows, rows built by hand) is taken as it is
    entry["ratio_clean"] = bool(out["best"][2].get("clean", True)) if out["best"][2] is not None else True
    return entry, {k: (v[0], v[1], bool(v[2].get("clean", True)) if v[2] is not None else True) for k, v in out.items()}


def _picked(r: Row | None, weights: str) -> dict:
    """What the confirmation's choice for ``weights`` said of ``r`` (``{}`` where it chose none)."""
    c = r.extra.get("confirmed") if r is not None else None
    return ((c.get("picked") or {}).get(weights) or {}) if isinstance(c, dict) else {}


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
            allow_known_bad: bool = False, threads: int | None = None, hint: str | None = None) -> list:
    """The :class:`rawconv.tuning.TuningRecord` of the fastest correct rawconv row of each problem
    (problems where none ran correctly get none), among the rows that read their weights on every
    call as :mod:`rawconv.nn`'s modules and the function forms do (``detail["weights"]`` says
    which; a run of prepacked rows only records its fastest with ``"prepacked"``, which
    :func:`replay` honours): its backend, the problem (``problems`` gives
    the fields; rows name it), the rows' direction, the candidate's stable name
    (``row.choice``: ``"jit:avx2@any"``, ``"IMPLICIT_PRECOMP_GEMM@fma"``, ``"eng72{k24=4}"``),
    the options ``compare`` ran it with (oneDNN: ``fpmath``, weights layout, ``threads``: the
    plan's count, one for a problem under 2**17 FLOPs, else ``threads``, default torch's current
    count; cuDNN: the math type set), the library version and device, its
    median time (from the confirmation rounds where they ran: picked on other rounds) and min
    time, its error against float64, the layer's name as ``label``, and ``timing``:
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
            options = onednn.key_options(fpmath, "direct", "nchw", allow_known_bad,
                                         threads if plan_threads is None else plan_threads)
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
        out.append(tuning.TuningRecord(key, best.choice, _finite_json(detail), p.layout, med, best.min_ms,
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
    else:   # the CPU: as compare times its rows, in rounds, each round's fastest clean call
        from ..core.bench import round_plan, time_rounds

        def timer(f):
            nonlocal rounds
            n, calls = round_plan(iterations)
            t = time_rounds({"record": f}, rounds=n, calls=calls, warmup=warmup, budget_s=budget_s)["record"]
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

_guard.guard_module(globals(), "compare_problem", "compare", "real_photo", "inputs_for", "summary", "write_json",
                    "records", "replay", "replay_summary", "grad_output_for", "libraries", "headline")
