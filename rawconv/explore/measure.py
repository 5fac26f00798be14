"""compare's rows and how one is measured: :class:`Row` (a :class:`~rawconv.results.Result`
with compare's fields), the inputs (:func:`inputs_for`, :func:`real_photo`, :func:`grad_output_for`),
the float64 references and tolerances, the measurement of one call against them (``_measure``),
the CPU's interleaved rounds (``_time_rounds``), the libraries' labels (:func:`libraries`) and
torch's own rows (``_torch_rows``). The backends' rows (``onednn_rows``, ``cudnn_rows``,
``plan_rows``) and the driver (:mod:`rawconv.compare`) build on these."""
from __future__ import annotations

import contextlib
import math
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

from ..core import progress as _progress
from ..core.bench import LoadMonitor, TimeStats
from ..core.errors import LibraryNotFoundError, NotSupportedError, RawconvError
from ..core.check import abs_reference, compare_to_reference
from ..core.problem import ConvProblem
from ..core.results import Result, json_safe, status_group
from .confirm import WEIGHT_SETS, confirm, picked, ranked
from ..pytorch.torch_choice import compare_detail, trace_detail, conv_backend_name, torch_onednn_trace

FACE = "rawconv.explore.compare"   # where this module's public names live (rawconv.compare): messages, pickles


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
    the fresh rounds measured. On one thread (``torch.get_num_threads() == 1``: ``--threads 1``,
    or a problem :func:`rawconv.compare.compare` times at one thread on a busy machine) a call's
    time is its thread's CPU time (``time_rounds(one_thread=True)``). Returns None."""
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
                                  budget_s=budget_s, one_thread=torch.get_num_threads() == 1)
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


Row.__module__ = FACE   # pickles name the face (rawconv.compare.Row), where the class is read


# every public entry point raises only rawconv's exception classes (rawconv._guard)
from ..core import guard as _guard  # noqa: E402

_guard.guard_module(globals(), "real_photo", "inputs_for", "grad_output_for", "libraries", where=FACE)
