"""oneDNN candidates run in a child process (:mod:`rawconv.core.isolate`'s workers): the child's side
(:mod:`.isolated_child`: build the plan, plain or fused, run one implementation) and the parent's (:class:`_OnednnSession`, :func:`run_onednn_candidates`, what
``implementations(..., isolate=True)``, ``Convolution.autotune(..., isolate=True)`` and ``rawconv compare
--isolate`` call). A crash or hang in the child is a row status; this process lives on."""
from __future__ import annotations

import math
import time
from typing import Mapping, Sequence

from ..core.errors import ArgumentError, ArgumentTypeError
from ..core.isolate import DEFAULT_TIMEOUT_S, Isolation, Outcome, give_worker, take_worker

__all__ = ["run_onednn_candidates"]


GUARD_BYTES = 1 << 20
"""The guard band after the scratchpad and each reorder buffer in a child (bytes): oneDNN #6035 wrote up
to 5696 B past a scratchpad."""

CRASH_ENV = "RAWCONV_ISOLATE_CRASH"
"""A test aid for the isolation path: in a child process, running the oneDNN candidate named by this
variable (``"name"`` or ``"name@layouts"``) calls ``os.abort()`` first, so that ``--isolate`` can be
checked end to end (the row says ``crashed: SIGABRT``; the parent goes on). Read in the child only."""



# ---------------------------------------------------------------------------- oneDNN candidates
def _compute_of(fpmath: str):
    return {"bf16": "bfloat16", "f16": "float16", "tf32": "tf32", "any": "bfloat16"}.get(fpmath)


def _check_output(problem, direction: str, tensors: dict, out, fpmath: str, cache: dict):
    """(parent) Error statistics of a candidate's output against float64 -> (max_abs, max_rel, ok)."""
    import torch

    from ..core.check import EPS, check, reference, tolerance_for

    d = direction
    if "ref" not in cache:
        ref_t = {"x": tensors.get("x"), "w": tensors.get("w"), "b": tensors.get("bias"), "dy": tensors.get("grad_y")}
        cache["ref"] = reference(problem, d, ref_t)
        cache["tol"] = tolerance_for(problem, d, compute=_compute_of(fpmath))
    ref, ref_abs = cache["ref"]
    db = None
    if isinstance(out, tuple):
        out, db = out
    st = check(problem, out, ref, ref_abs, cache["tol"])
    ok, max_abs, max_rel = st.ok, st.max_abs, st.max_rel
    if db is not None:   # backward_weights with bias: db = grad_y summed over batch and space
        dy = tensors["grad_y"].detach().to(torch.float64)
        if problem.unbatched and dy.dim() == problem.ndim + 1:
            dy = dy.unsqueeze(0)
        dims = [0] + list(range(2, dy.dim()))
        rb, rb_abs = dy.sum(dims), dy.abs().sum(dims)
        L = max(problem.n * math.prod(problem.out_spatial), 1)
        eps = EPS[problem.dtype]
        bound = eps * rb.abs() + 4 * EPS["float32"] * math.sqrt(L) * rb_abs + 1e-30
        diff = (db.detach().to(torch.float64) - rb).abs()
        ok = ok and bool(torch.isfinite(diff).all()) and bool((diff <= bound).all())
        max_abs = max(max_abs, float(diff.max()) if diff.numel() else 0.0)
    return max_abs, max_rel, ok


def _example_inputs(problem, direction: str, x=None, w=None, b=None, grad_y=None, w_layout: str = "nchw") -> dict:
    """The tensors a plan of ``direction`` executes on (``Convolution.execute`` keywords); those
    not given are drawn at random with a fixed seed (``problem.make_inputs``)."""
    import torch

    from ..core.problem import to_layout

    if x is None or w is None:
        x0, w0, b0 = problem.make_inputs(seed=1)
        x = x0 if x is None else x
        w = w0 if w is None else w
        b = b0 if b is None else b
        if w_layout == "nhwc":
            w = to_layout(w, "nhwc")
    if direction == "forward":
        return {"x": x, "w": w, "bias": b if problem.has_bias else None}
    if grad_y is None:
        g = torch.Generator().manual_seed(2)
        grad_y = to_layout(torch.randn(problem.y_shape, generator=g, dtype=torch.float64).to(problem.torch_dtype),
                           problem.layout)
    if direction == "backward_data":
        return {"grad_y": grad_y, "w": w}
    return {"x": x, "grad_y": grad_y}


def _row_of(impl, **kw) -> dict:
    row = {"index": impl.index, "name": impl.name, "layouts": impl.layouts, "formats": dict(impl.formats),
           "reorders": list(impl.reorders), "scratchpad_bytes": impl.scratchpad_bytes,
           "known_bad": impl.known_bad, "status": "", "detail": "", "median_ms": float("nan"),
           "min_ms": float("nan"), "runs": 0, "max_abs": float("nan"), "max_rel": float("nan"), "ok": None,
           "output": None, "implementation": impl}
    row.update(kw)
    return row


class _OnednnSession:
    """(parent) One problem's candidates in a worker: setup (list) once per child, run each."""

    def __init__(self, problem, direction, tensors, *, algorithm="direct", fpmath="strict", w_layout="nchw",
                 prepack=True, iso: Isolation, plan_threads="auto", post_ops=()):
        self.problem, self.direction, self.tensors = problem, direction, tensors
        self.args = (problem, direction, algorithm, fpmath, w_layout, prepack, tensors, plan_threads,
                     tuple(post_ops))
        self.fpmath = fpmath
        self.iso = iso
        self.key = ("onednn", id(self), time.monotonic_ns())
        self.worker = take_worker(iso)
        self.impls = None
        self._ref: dict = {}

    def close(self):
        give_worker(self.iso, self.worker)

    def setup(self) -> Outcome:
        out = self.worker.call("rawconv.onednn.isolated_child:setup", (self.key,) + self.args,
                               timeout_s=self.iso.timeout_s)
        if out.ok:
            self.worker.keys.add(self.key)
            if self.impls is None:
                self.impls = out.value
        return out

    def run(self, impl, *, iterations=1, warmup=0, budget_s=None, slow_s=None, allow_known_bad=False,
            check=True, keep_output=False) -> dict:
        """One candidate -> its row dict (status, times, errors vs float64)."""
        row = _row_of(impl)
        if self.key not in self.worker.keys:
            out = self.setup()
            if not out.ok:
                return self._fail(row, out, "while listing implementations in a fresh worker")
        want = check or keep_output
        out = self.worker.call("rawconv.onednn.isolated_child:run",
                               (self.key, impl, iterations, warmup, budget_s, slow_s, allow_known_bad, want),
                               timeout_s=self.iso.timeout_s)
        if not out.ok:
            return self._fail(row, out)
        v = out.value
        row.update(median_ms=v["median_ms"], min_ms=v["min_ms"], runs=v["runs"], status="ok")
        if v.get("overruns"):
            # (the child's sizes: its thread count may differ from this process's listing)
            where = "; ".join(f"wrote {n} B past its {name}" for name, n in v["overruns"])
            row.update(status="wrong", detail=f"{where} (caught in the child's guard band; in-process it "
                                              f"corrupts the heap)")
            return row
        if check and v["output"] is not None:
            try:
                row["max_abs"], row["max_rel"], row["ok"] = _check_output(self.problem, self.direction, self.tensors,
                                                                         v["output"], self.fpmath, self._ref)
            except Exception as exc:  # noqa: BLE001 - a result of the wrong shape etc.
                row.update(status="failed", detail=f"checking the result: {type(exc).__name__}: {exc}")
                return row
            if not row["ok"]:
                row["status"] = "wrong"
                row["detail"] = f"max rel err {row['max_rel']:.3g} vs float64 (outside tolerance)"
        if keep_output:
            row["output"] = v["output"]
        return row

    @staticmethod
    def _fail(row: dict, out: Outcome, where: str = "") -> dict:
        if out.status == "error":
            e = out.error or {}
            status = "known bad" if e.get("known_bad") else "not supported" if e.get("not_supported") else "failed"
            row.update(status=status, detail=e.get("message", ""))
        else:
            row.update(status=out.status, detail="; ".join(s for s in (where, out.detail) if s))
        return row


def _pick(impls: list, i):
    from .primitive import Implementation

    if isinstance(i, Implementation):
        return i
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(impls):
        raise ArgumentError(f"indices must hold positions 0..{len(impls) - 1} of the implementation list "
                            f"or Implementation objects, got {i!r}")
    return impls[i]


def _onednn_session(problem, direction, tensors, **kw) -> _OnednnSession:
    return _OnednnSession(problem, direction, tensors, **kw)


def run_onednn_candidates(problem, x=None, w=None, b=None, *, grad_y=None, direction: str = "forward",
                          indices: Sequence | None = None, iterations: int = 10, warmup: int = 2,
                          budget_s: float | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                          fpmath: str = "strict", algorithm: str = "direct", prepack: bool = True,
                          allow_known_bad: bool = False, slow_s: float | None = None, check: bool = True,
                          keep_output: bool = False, w_layout: str | None = None,
                          env: Mapping[str, str] | None = None, threads: int | None = None) -> list[dict]:
    """List and run oneDNN's implementations for ``problem`` in a worker process, one row each.

    ``problem``: a :class:`~rawconv.ConvProblem` (CPU). Tensors: forward ``x``, ``w``, ``b``
    (drawn with ``problem.make_inputs(seed=1)`` when None); backward_data ``grad_y``, ``w``;
    backward_weights ``x``, ``grad_y`` (random, seeded, when None). ``direction``: "forward",
    "backward_data", "backward_weights". ``indices``: positions in the child's list or
    :class:`rawconv.onednn.Implementation` objects (matched by name, layouts, formats), None for
    all. Each candidate: ``warmup`` untimed and up to ``iterations`` timed calls, at most
    ``budget_s`` seconds of timing (:func:`rawconv.bench.time_cpu`); a first call slower than
    ``slow_s`` is the measurement alone (oneDNN's ``ref:any``). ``timeout_s``: per candidate.
    Known-bad candidates are not run unless ``allow_known_bad``. ``check``: compare the output
    with float64 here in the parent (``max_abs``, ``max_rel``, ``ok``; ``"wrong"`` when outside
    tolerance); ``keep_output``: return it (``output``: the result tensor, or ``(dw, db)``).
    ``env``/``threads``: the child's extra environment and thread count (default: the parent's).

    Returns one dict per candidate, in the child's list order: ``index``, ``name``, ``layouts``,
    ``formats``, ``reorders``, ``scratchpad_bytes``, ``known_bad`` (issue link or ""),
    ``status`` (``"ok"``, ``"wrong"``, ``"crashed: SIGSEGV"``, ``"timed out after 60 s"``,
    ``"not supported"``, ``"known bad"``, ``"failed"``), ``detail`` (error text, a crash's last
    log lines), ``median_ms``/``min_ms`` (NaN when it did not run), ``runs``, ``max_abs``,
    ``max_rel``, ``ok`` (None when not checked), ``output``, ``implementation`` (the
    :class:`~rawconv.onednn.Implementation`). When listing itself crashes or fails, one row with
    ``name`` "-" says so. Raises :class:`~rawconv.errors.ArgumentError` for bad arguments
    (``indices`` out of range: once the list is known) and :class:`~rawconv.errors.IsolationError`
    when no worker can be started.
    """
    from .primitive import _check_direction
    from ..core.problem import ConvProblem

    if not isinstance(problem, ConvProblem):
        raise ArgumentTypeError(f"problem must be a ConvProblem, got {type(problem).__name__}")
    _check_direction(direction)
    for nm, v in (("iterations", iterations), ("warmup", warmup)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if nm == "iterations" else 0):
            raise ArgumentError(f"{nm} must be an int >= {1 if nm == 'iterations' else 0}, got {v!r}")
    iso = Isolation(timeout_s=timeout_s, env=env, threads=threads)
    wl = w_layout or "nchw"
    tensors = _example_inputs(problem, direction, x, w, b, grad_y, wl)
    s = _OnednnSession(problem, direction, tensors, algorithm=algorithm, fpmath=fpmath, w_layout=wl,
                       prepack=prepack, iso=iso)
    try:
        out = s.setup()
        if not out.ok:
            from .primitive import Implementation

            row = _row_of(Implementation(-1, "-", "-", {}, (), 0, direction))
            return [_OnednnSession._fail(row, out, "while listing implementations")]
        impls = s.impls
        chosen = impls if indices is None else [_pick(impls, i) for i in indices]
        rows = []
        for impl in chosen:
            if impl.known_bad and not allow_known_bad:
                rows.append(_row_of(impl, status="known bad",
                                    detail=f"not run (allow_known_bad=True runs it): {impl.known_bad}"))
                continue
            rows.append(s.run(impl, iterations=iterations, warmup=warmup, budget_s=budget_s, slow_s=slow_s,
                              allow_known_bad=allow_known_bad, check=check, keep_output=keep_output))
        return rows
    finally:
        s.close()
