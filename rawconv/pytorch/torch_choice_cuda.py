"""Which kernels torch's CUDA call launched, and which rawconv candidates launch them
(:mod:`rawconv.torch_choice`, the face): the profiler's kernels (:func:`_profile_calls`, set on the
face or here), :func:`match_kernels`, cuDNN's API log (:func:`cudnn_api_log`,
:func:`parse_cudnn_log`) and rawconv's cuDNN candidates profiled once per problem
(:func:`_candidate_kernels`)."""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

from ..core import plans as _plans
from ..core.errors import RawconvError
from ..core.problem import layout_of

@dataclass(frozen=True)
class CandidateKernels:
    """The kernels one rawconv candidate launched: ``backend`` (``"cudnn"``: legacy (algo, math)
    row; ``"cudnn_graph"``: engine config), ``choice`` (the name ``choice=`` / ``select`` take:
    ``"IMPLICIT_PRECOMP_GEMM@tensor_op"``, ``"eng0{k2=4}"``), ``kernels`` (names, launch order,
    each once), ``engine`` (graph engine global index, None for legacy), ``error`` (why it did
    not run; then no kernels)."""

    backend: str
    choice: str
    kernels: tuple = ()
    engine: int | None = None
    error: str = ""


_MARK = "spin_kernel"   # torch.cuda._sleep's kernel: the separator between profiled candidates


def _is_helper(name: str) -> bool:
    """torch's own kernels (copies, fills, bias adds, the separator), never cuDNN's."""
    return "at::native" in name or _MARK in name


def _cuda_events(prof) -> list[tuple[float, str, float]]:
    """(start µs, name, duration µs) of each CUDA kernel a profiler session saw, by start time."""
    out = []
    try:
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                tr = e.time_range
                out.append((float(tr.start), e.name, float(tr.end - tr.start)))
    except Exception:  # noqa: BLE001  older/newer profiler: the raw kineto events
        out = []
    if not out:
        try:
            for e in prof.profiler.kineto_results.events():
                if e.device_type() == torch.autograd.DeviceType.CUDA:
                    out.append((e.start_ns() / 1e3, e.name(), e.duration_ns() / 1e3))
        except Exception:  # noqa: BLE001
            pass
    out.sort(key=lambda t: t[0])
    return out


def _split_segments(events: Sequence[tuple[float, str, float]], n: int) -> list[list[tuple[str, float]]] | None:
    """Kernels between separators: ``events`` (start, name, µs) in GPU order, a separator kernel
    before each of ``n`` calls and one after the last. None unless exactly ``n`` segments are found."""
    segs: list[list[tuple[str, float]]] = []
    cur = None
    for _, name, dur in events:
        if _MARK in name:
            if cur is not None:
                segs.append(cur)
            cur = []
        elif cur is not None:
            cur.append((name, dur))
    return segs if len(segs) == n else None


def _profile_calls(fns: Sequence[Callable[[], Any]], *, separators: bool = True) -> list[list[tuple[str, float]]] | None:
    """Kernels (name, µs) each of ``fns`` launched, from one ``torch.profiler`` session (CUDA
    activity). With ``separators`` a ``torch.cuda._sleep`` kernel is launched before each call and
    after the last (one stream: GPU order is launch order) and the kernels between them are each
    call's; None when the separators are not all seen. Without, ``fns`` must be one call: all its
    kernels."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for fn in fns:
                if separators:
                    torch.cuda._sleep(1000)
                fn()
            if separators:
                torch.cuda._sleep(1000)
            torch.cuda.synchronize()
    ev = _cuda_events(prof)
    if not separators:
        return [[(name, dur) for _, name, dur in ev]]
    return _split_segments(ev, len(fns))


def _profile_each(fns: Sequence[Callable[[], Any]]) -> list[list[tuple[str, float]]]:
    """:func:`_profile_calls` with separators; when they fail, one session per call."""
    got = _profile_calls(fns) if fns else []
    if got is not None:
        return got
    return [_profile_calls([fn], separators=False)[0] for fn in fns]


def _short(name: str, width: int) -> str:
    name = name[5:] if name.startswith("void ") else name
    return name if len(name) <= width else name[: width - 3] + "..."


def _unique(names: Iterable[str]) -> tuple:
    return tuple(dict.fromkeys(names))


def _cudnn_set(kernels: Iterable[str]) -> frozenset:
    return frozenset(k for k in kernels if not _is_helper(k))


def match_kernels(torch_kernels: Sequence[str], candidates: Sequence[CandidateKernels], *,
                  main_kernel: str = "") -> tuple[str, tuple[str, ...]]:
    """Which candidates ran what torch ran: ``("same kernels", choices)`` (the same set of cuDNN
    kernels, torch's ``at::native`` helpers left out on both sides), else ``("main kernel",
    choices)`` (candidates that launch ``main_kernel``, torch's longest), else ``("none", ())``;
    ``("", ())`` when torch launched no cuDNN kernel."""
    want = _cudnn_set(torch_kernels)
    if not want:
        return "", ()
    ok = [c for c in candidates if not c.error and c.kernels]
    same = _unique(c.choice for c in ok if _cudnn_set(c.kernels) == want)
    if same:
        return "same kernels", same
    if main_kernel and not _is_helper(main_kernel):
        part = _unique(c.choice for c in ok if main_kernel in c.kernels)
        if part:
            return "main kernel", part
    return "none", ()


# ---------------------------------------------------------------- cuDNN's API log (cudnnSetCallback)
def cudnn_api_log():
    """``with cudnn_api_log() as log: ...`` records cuDNN's API log of this thread's calls in the
    block: :class:`rawconv.cudnn.api_log.cudnn_api_log` (imported on first use: importing this
    module loads no cuDNN code)."""
    from ..cudnn.api_log import cudnn_api_log as log

    return log()


_FUNC_RE = re.compile(r"function (\w+)\(\) called")
_ENGINE_RE = re.compile(r"engine_?[iI]d: type=int(?:64_t)?; val=(-?\d+);")
_ALGO_RE = re.compile(r"\balgo: type=\w+; val=CUDNN_CONVOLUTION_(?:FWD|BWD_DATA|BWD_FILTER)_ALGO_(\w+)")


def _algo_short(tail: str) -> str:
    """rawconv's legacy algo name from the C name's tail (``IMPLICIT_PRECOMP_GEMM``, ``0`` -> ``ALGO_0``)."""
    return "ALGO_" + tail if tail[:1].isdigit() else tail


def parse_cudnn_log(messages: Sequence[Sequence[str]]) -> dict:
    """What a cuDNN API log says (:class:`cudnn_api_log` messages): ``functions`` (the cuDNN
    functions called, in order, each once), ``engines`` (engine global indices in the execution
    plans printed with ``cudnnBackendExecute``: the engines that ran, in order, each once),
    ``algos`` (legacy API: the algos passed to ``cudnnConvolution*`` calls, in rawconv's names:
    ``"IMPLICIT_PRECOMP_GEMM"``, ``"ALGO_1"``)."""
    funcs, engines, algos = [], [], []
    for lines in messages:
        if not lines:
            continue
        m = _FUNC_RE.search(lines[0])
        fn = m.group(1) if m else ""
        if fn:
            funcs.append(fn)
        body = "\n".join(lines[1:])
        if fn == "cudnnBackendExecute":
            engines += [int(v) for v in _ENGINE_RE.findall(body) if int(v) >= 0]
        elif fn.startswith("cudnnConvolution"):
            algos += [_algo_short(t) for t in _ALGO_RE.findall(body)]
    return {"functions": _unique(funcs), "engines": _unique(engines), "algos": _unique(algos)}


# ---------------------------------------------------------------- rawconv's candidates on CUDA
_cand_cache: dict = {}
_plans.register_clear("rawconv.pytorch.torch_choice:_cand_cache", _cand_cache.clear)
_CAND_CACHE_SIZE = 64


def _candidate_kernels(c: _Call, limit: int, tf32: bool) -> tuple[CandidateKernels, ...]:
    """Profile each rawconv cuDNN candidate (legacy rows, graph engine configs) once on ``c``'s
    problem: their kernel names. Cached per (problem, direction, tf32, limit)."""
    key = (c.problem, c.direction, tf32, limit, str(c.x.device))
    hit = _cand_cache.get(key)
    if hit is not None:
        return hit
    runs: list[tuple[str, str, int | None, Callable, Callable]] = []   # backend, choice, engine, select, run
    errors: list[CandidateKernels] = []
    plan = _legacy_candidates(c, limit, runs, errors)
    gplan = _graph_candidates(c, limit, tf32, runs, errors)
    out = _profile_candidates(runs)
    order = {ch: i for i, (_, ch, _, _, _) in enumerate(runs)}
    out.sort(key=lambda ck: order.get(ck.choice, 1 << 30))
    res = tuple(errors + out)
    for obj in (plan, gplan):
        if obj is not None:
            try:
                obj.free()
            except Exception:  # noqa: BLE001
                pass
    if len(_cand_cache) >= _CAND_CACHE_SIZE:
        _cand_cache.pop(next(iter(_cand_cache)))
    _cand_cache[key] = res
    return res


def _exec_args(c: _Call) -> dict:
    """The tensors a candidate plan's ``execute`` takes for ``c``'s direction. Returns them by
    argument name."""
    d = c.direction
    if d == "backward_data":   # a transposed forward's input is the matching convolution's dy
        return {"grad_y": c.dy if c.dy is not None else c.x, "w": c.w}
    if d == "backward_weights":
        return {"x": c.xb, "grad_y": c.dy}
    return {"x": c.xb, "w": c.w}


def _legacy_candidates(c: _Call, limit: int, runs: list, errors: list):
    """The legacy API's candidates for ``c``'s problem: up to ``limit`` (algo, math) rows cuDNN
    reports usable, appended to ``runs`` as (backend, choice, engine, select, run); a plan that
    cannot be made goes to ``errors``. Returns the plan (to free), or None."""
    from .. import cudnn as _cd

    p, d = c.problem, c.direction
    plan = None
    # legacy API: (algo, math) rows cuDNN reports usable
    try:
        plan = _cd.Convolution.from_problem(p, direction=d, w_layout=layout_of(c.w) if layout_of(c.w) != "strided"
                                            else "nchw")
        rows = [r for r in plan.algorithms("heuristic", "all") if r.ok][:limit]
        for r in rows:
            runs.append(("cudnn", r.choice, None, (lambda r=r: plan.select(choice=r)),
                         (lambda: plan.execute(**_exec_args(c)))))
    except RawconvError as exc:
        errors.append(CandidateKernels("cudnn", "-", error=f"{type(exc).__name__}: {str(exc).splitlines()[0]}"))
    return plan


def _graph_candidates(c: _Call, limit: int, tf32: bool, runs: list, errors: list):
    """The graph API's candidates for ``c``'s problem: up to ``limit`` of the heuristic configs,
    then every engine with its default knobs, appended to ``runs`` as (backend, choice, engine,
    select, run); a plan that cannot be made goes to ``errors``. Returns the plan (to free), or
    None."""
    from ..cudnn import graph as _cg

    p, d = c.problem, c.direction
    gplan = None
    # graph API: heuristic configs, then every engine with its default knobs
    try:
        gplan = _cg.GraphConvolution.from_problem(p, direction=d, allow_tf32=bool(tf32))
        cfgs = list(gplan.engines(list(_cg.HEURISTIC_MODES), finalize=False))
        if len(cfgs) < limit:
            # then each engine with its default knobs, but not those that compile at plan time (NVRTC:
            # seconds each; torch reaches them only through the heuristics' lists, already above)
            names = {e.name for e in cfgs}
            cfgs += [e for e in gplan.engines("all", limit=1, finalize=False)
                     if e.name not in names and "RUNTIME_COMPILATION" not in e.behavior_notes]
        for ec in cfgs[:limit]:
            runs.append(("cudnn_graph", ec.name, ec.engine, (lambda ec=ec: gplan._select(ec, warn=False)),
                         (lambda: gplan.execute(**_exec_args(c)))))
    except RawconvError as exc:
        errors.append(CandidateKernels("cudnn_graph", "-", error=f"{type(exc).__name__}: {str(exc).splitlines()[0]}"))
    return gplan


def _profile_candidates(runs: list) -> list[CandidateKernels]:
    """Build and run each of ``runs`` (backend, choice, engine, select, run) once outside the
    profiler (plans finalized, workspaces allocated), then profile each that ran. Returns a
    :class:`CandidateKernels` per candidate: its kernel names, or its error."""
    # build and run each once outside the profiler (plans finalized, workspaces allocated)
    ready, out = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for be, choice, eng, sel, run in runs:
            try:
                sel()
                run()
                ready.append((be, choice, eng, sel, run))
            except (RawconvError, RuntimeError) as exc:   # RuntimeError: e.g. torch out of memory for a workspace
                out.append(CandidateKernels(be, choice, engine=eng,
                                            error=f"{type(exc).__name__}: {str(exc).splitlines()[0]}"))
        torch.cuda.synchronize()

        def make(sel, run):
            def f():
                sel()
                run()
            return f

        kernels = _profile_each([make(sel, run) for _, _, _, sel, run in ready]) if ready else []
    for (be, choice, eng, _, _), ks in zip(ready, kernels):
        out.append(CandidateKernels(be, choice, _unique(n for n, _ in ks), eng,
                                    "" if ks else "no kernel seen by the profiler"))
    return out
