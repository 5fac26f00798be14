"""The per-call autotune behind :func:`rawconv.nn.convert`'s ``autotune=`` and ``autotune_new="search"``:
the recording of a model's conv calls, the tuning keys, each backend's search of one problem and
direction (``_tune_one``, ``_search_direction``), the comparison with torch's own kernel
(``_versus_torch``), and :class:`TunedChoice` (the winner pinned on a module, checked against the
oneDNN it runs on). Its settings (``VERSUS_TORCH``, ``GRAPH_BUDGET_S``, ``ONEDNN_TUNE``,
``GRAPH_TUNE``) are read here and set through :mod:`rawconv.pytorch.nn` (its ``_Face``)."""
from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from . import fused as _fused
from . import fusion as _fusion
from . import registered as _registered
from .. import onednn
from ..core.grad import functorch_active as _functorch
from ..core.errors import ArgumentError, InternalError, NotSupportedError, RawconvError
from ..core.problem import ConvProblem, empty_like_layout, shape_only
from ..core import autotune as _autotune, guard as _guard
from .functional import _check_precision, _is_cl, _norm_padding, _pair, _resolve_backend, _transpose_shape

log = logging.getLogger("rawconv.nn")
FACE = "rawconv.pytorch.nn"   # where this module's public names live (rawconv.nn): pickles, messages


# ---------------------------------------------------------------------------- recording
# while convert/describe record the exact calls: (thread id, list of (module, kind, args)) per
# recording, innermost last. Non-empty is the forwards' one fast check; each thread records only
# its own calls (another thread's model running meanwhile is not tuned, nor its choices pinned)
_RECORDING: list = []
_RECORDING_LOCK = threading.Lock()


def _record(module, kind: str, **args) -> None:
    if _RECORDING:
        me = threading.get_ident()
        for tid, calls in reversed(tuple(_RECORDING)):   # a snapshot: other threads push and pop
            if tid == me:
                calls.append((module, kind, args))
                return


@contextlib.contextmanager
def _recording():
    """Record this thread's rawconv convolution calls into the list it yields."""
    entry = (threading.get_ident(), [])
    with _RECORDING_LOCK:
        _RECORDING.append(entry)
    try:
        yield entry[1]
    finally:
        with _RECORDING_LOCK:
            for i in range(len(_RECORDING) - 1, -1, -1):
                if _RECORDING[i] is entry:
                    del _RECORDING[i]
                    break


# ---------------------------------------------------------------------------- autotune
_TUNED: dict = {}   # process-wide: tuning key -> winning choice
_TUNED_ATTR = "_rawconv_tuned"   # module.__dict__: {call signature: TunedChoice}
_NEW_ATTR = "_rawconv_autotune_new"   # module.__dict__: how to search a new problem (autotune_new="search")


@dataclass(frozen=True)
class TunedChoice:
    """What :func:`convert`'s autotune pinned for one problem of one layer.

    ``problem``: the layer's call (:meth:`ConvProblem.describe`; for a transposed layer the
    matching convolution's); ``kind``: ``"conv"``, ``"fused"`` or ``"transpose"``; ``backend``;
    ``choice``: the layer's forward (None: the library's default); ``backward_choice``: ``(grad
    input choice, grad weight choice)`` as the modules take it, or None when the backward passes
    were not searched (the library's defaults run); ``directions``: the same choices by the
    library's direction (``{"forward": .., "backward_data": .., "backward_weights": ..}``; a
    transposed layer's forward is the convolution's backward data and its input gradient a
    forward)."""

    problem: str
    kind: str
    backend: str
    choice: Any
    backward_choice: Any
    directions: dict

    def as_dict(self) -> dict:
        return {"problem": self.problem, "kind": self.kind, "backend": self.backend, "choice": self.choice,
                "backward_choice": self.backward_choice, "directions": dict(self.directions)}


_OFFERED_ON = "_rawconv_offered_on"   # TunedChoice.__dict__: the oneDNN and CPU its choices are known offered on
_HERE: list = []   # this process's oneDNN version and effective ISA (_onednn_here)
_FALLBACK_WARNED: list = []   # a pinned choice not offered here was warned about (once per process)


def _onednn_here() -> str:
    """This process's oneDNN version and effective ISA (``"3.2.0 avx2"``): what decides which
    implementations a pinned choice can name."""
    if not _HERE:
        env = onednn.environment()
        _HERE.append(f"{env['library_version']} {env['device_arch']}")
    return _HERE[0]


def _offered(m, kind: str, args: dict, direction: str, choice: str, activation: str | None = None) -> str | None:
    """None when oneDNN offers ``choice`` here for layer ``m``'s call in library ``direction``, else
    the name of what runs instead (oneDNN's first choice). Lists the implementations once.
    ``activation``: a fused call's post-op activation when not the module's (``"none"``: the
    convolution with its bias alone, as a call measured faster unfused runs it)."""
    prec = _check_precision(m.precision)
    if direction == _forward_direction(kind):
        problem, wl = _problem_of(m, kind, args), onednn.weights_layout(m.weight)
    else:
        problem, wl = _grad_problems(m, kind, args, "onednn")[direction]
    if kind == "fused" and direction == "forward":
        plan = _fused.FusedConvolution.for_problem(problem, residual=args.get("residual") is not None,
                                                   activation=activation or m.activation, fpmath=prec, w_layout=wl)
    else:
        plan = onednn.Convolution.from_problem(problem, direction=direction, fpmath=prec, w_layout=wl)
    try:
        try:
            plan.select(choice)
            return None
        except NotSupportedError:   # (KnownBadError too)
            first = plan.selected
            return f"{first.name}@{first.layouts}"
    finally:
        plan.free()


def _offered_here(m, kind: str, args: dict, key, t: "TunedChoice") -> "TunedChoice":
    """``t`` (an autotuned oneDNN pin of layer ``m``, made with another oneDNN or on another CPU:
    a saved model loaded elsewhere, ``ONEDNN_MAX_CPU_ISA``) checked against what oneDNN offers
    here, once per process: a choice it does not offer for its problem is dropped (oneDNN's first
    choice runs that direction), with one ``RuntimeWarning`` per process naming the layer, the
    pinned choice and what runs instead (the others are logged on ``rawconv.nn``). The checked pin
    replaces ``t`` in the layer's table and is returned."""
    here = _onednn_here()
    dirs = dict(t.directions)
    dropped = []
    for direction, choice in t.directions.items():
        if choice is None:
            continue
        instead = _offered(m, kind, args, direction, str(choice))
        if instead is not None:
            dirs[direction] = None
            dropped.append((direction, choice, instead))
    if dropped:
        fwd = _forward_direction(kind)
        bwd = t.backward_choice
        if bwd is not None:
            pair = (dirs.get("forward"), dirs.get("backward_weights")) if kind == "transpose" else \
                (dirs.get("backward_data"), dirs.get("backward_weights"))
            bwd = None if pair == (None, None) else pair
        t = TunedChoice(t.problem, t.kind, t.backend, dirs.get(fwd), bwd, dirs)
        _say_fallback(m, t.problem, dropped)
    object.__setattr__(t, _OFFERED_ON, here)
    table = m.__dict__.get(_TUNED_ATTR)
    if table is not None and key in table:
        table[key] = t
    return t


def _say_fallback(m, problem: str, dropped: list) -> None:
    """Say that layer ``m``'s pins ``dropped`` (``(direction, pinned, instead)``) are not offered
    here: logged on ``rawconv.nn``, and the first time in the process a ``RuntimeWarning``."""
    here = _onednn_here()
    what = "; ".join(f"{d} {c!r} -> oneDNN's first choice {i!r}" for d, c, i in dropped)
    msg = (f"rawconv.nn: {type(m).__name__} ({problem}) was autotuned to implementations that oneDNN "
           f"{here.split()[0]} does not offer on this CPU (effective ISA {here.split()[-1]}): {what}; these run "
           "instead (convert(model, autotune=...) here tunes for this CPU)")
    log.info(msg)
    if not _FALLBACK_WARNED:
        _FALLBACK_WARNED.append(True)
        warnings.warn(msg + ". Other layers whose pins are not offered here fall back the same way without "
                      "another warning (logged on 'rawconv.nn'; rawconv.nn.describe(model) shows what runs)",
                      RuntimeWarning, stacklevel=_guard.stacklevel())


_UNFUSED_OFFERED_ON = "_rawconv_unfused_offered_on"   # module.__dict__: {call key: where its unfused choice is offered}


def _unfused_offered_here(m, key, choice: str, args: dict) -> str:
    """The unfused choice ``choice`` of layer ``m``'s call ``key`` (:data:`rawconv.pytorch.fusion.UNFUSED_ATTR`:
    convert measured it faster unfused), checked once per process against what oneDNN offers here as
    :func:`_offered_here` checks the autotuned pins: one not offered is replaced in the table by
    oneDNN's first choice (the call stays unfused), said as there. ``args``: the call's x, padding,
    w and b."""
    here = _onednn_here()
    checked = m.__dict__.setdefault(_UNFUSED_OFFERED_ON, {})
    instead = _offered(m, "fused", args, "forward", str(choice), activation="none")
    if instead is not None:
        table = m.__dict__.get(_fusion.UNFUSED_ATTR)
        if table is not None and key in table:
            table[key] = instead
        _say_fallback(m, _problem_of(m, "fused", args).describe() + ", run unfused", [("forward", choice, instead)])
        choice = instead
    checked[key] = here
    return choice


def clear_tuning() -> None:
    """Forget the winners :func:`convert` remembers for this process (and its fused / unfused
    decisions)."""
    _TUNED.clear()
    _fusion.clear()


def _sig_of(kind: str, x, w, extra):
    """The key of a module call's problem in the module's tuned table: what, besides the module's
    own configuration, decides the problem (x's shape, strides and dtype, w's strides, the fused
    residual / the transposed output padding). None when x's sizes are symbolic (torch.compile's
    dynamic shapes: the default choices run there)."""
    shape = x.shape
    if torch.compiler.is_compiling() and not all(type(v) is int for v in shape):
        return None
    return (kind, shape, x.stride(), x.dtype, w.stride(), extra)


def _can_search_now(x) -> bool:
    """Whether a new problem may be searched inside this call (autotune_new="search")."""
    if type(x) is not torch.Tensor or torch.compiler.is_compiling() or torch.jit.is_tracing() or _functorch():
        return False
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        return False
    return True


def _search_new(m, kind: str, args: dict, key):
    """Search module ``m``'s new problem now (autotune_new="search") and pin it. Errors other
    than "not supported" propagate; None when nothing could be searched (the default runs)."""
    opts = m.__dict__[_NEW_ATTR]
    backend = _resolve_backend(m.backend, args["x"].device)
    st = m.__dict__.get(_fused._FROZEN_STATE)
    if kind == "fused" and st is not None:   # what the call computes with: the snapshot (BatchNorm folded in)
        w, b = st.sync()
        if w is not None:
            args = dict(args, w=w, b=b)
    try:   # the search's random tensors come from generators of its own: torch's stream goes on, and no
        # fork_rng (which would hand out again what other threads drew from torch's during the search)
        with torch.no_grad():
            entry = _tune_call(m, kind, args, backend, opts["budget_s"], opts["backward"], {})
    except NotSupportedError:
        return None
    return entry[0]


def _as_args(example) -> tuple:
    return tuple(example) if isinstance(example, (tuple, list)) else (example,)


def _devices_of(model, example, extra=()) -> list:
    """The CUDA devices in use by ``model``'s tensors and the example's (for torch.random.fork_rng)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return []
    ts = list(model.parameters()) + list(model.buffers()) + list(extra) + \
        [a for a in _as_args(example) if isinstance(a, torch.Tensor)]
    return sorted({t.get_device() for t in ts if t.is_cuda})


@contextlib.contextmanager
def _rng_kept(model, example):
    """torch's random number generators (CPU and the CUDA devices in use) as they were after the block."""
    with torch.random.fork_rng(devices=_devices_of(model, example)):
        yield


@contextlib.contextmanager
def _state_kept(model, example):
    """The example's forward leaves no trace on the model or the process: every buffer's values
    (a training-mode BatchNorm updates its running statistics and count) and torch's random
    number generators (dropout draws), CPU and the CUDA devices in use, as they were."""
    saved = []
    for mod in model.modules():
        for name, b in mod._buffers.items():
            if isinstance(b, torch.Tensor):
                saved.append((mod, name, b, b.detach().clone()))
    devices = _devices_of(model, example, [e[2] for e in saved])
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        with torch.no_grad():
            # (every one: batch_norm writes its running statistics without bumping their version)
            for mod, name, b, value in saved:
                if mod._buffers.get(name) is not b:   # rebound by the forward: the original back
                    mod._buffers[name] = b
                with torch.inference_mode(b.is_inference()):   # (an inference tensor: written only there)
                    if b.shape == value.shape:
                        b.copy_(value)
                    else:
                        b.set_(value)


def _record_calls(model, example) -> list:
    """(module, kind, args) of every distinct call (module and problem) of ``model`` on ``example``."""
    with _recording() as calls, torch.no_grad(), _state_kept(model, example):
        try:
            model(*_as_args(example))
        except RawconvError:
            raise
        except Exception as exc:   # noqa: BLE001 - the model's own code: say where it failed
            new = _guard.translate(exc, "rawconv.nn.convert(autotune=...): the model's forward on the example")
            if new is None:
                raise
            if isinstance(new, InternalError):   # not rawconv's bug: the example or the model
                text = str(exc).strip().splitlines()
                new = ArgumentError(f"rawconv.nn.convert(autotune=...): the model's forward on the example input "
                                    f"raised {type(exc).__name__}: {text[0][:300] if text else ''} (nothing was "
                                    "tuned; is the example what the model takes?)")
            raise new from exc
    seen, out = set(), []
    for m, kind, args in calls:
        k = (id(m), _call_key(m, kind, args))
        if k not in seen:
            seen.add(k)
            out.append((m, kind, args))
    return out


def _call_key(m, kind: str, args: dict):
    """The key of a recorded call in the module's tuned table (what its forward looks up)."""
    extra = None
    if kind == "fused":
        extra = args.get("residual") is not None
    elif kind == "transpose":
        extra = tuple(args["output_padding"])
    return _sig_of(kind, args["x"], m.weight, extra)


def _call_wb(m, args: dict):
    """(w, b) a recorded call computed with: a fused call's own (a frozen snapshot, BatchNorm folded
    in), else the module's parameters (detached)."""
    if "w" in args:
        w, b = args["w"], args["b"]
    else:
        w, b = m.weight, m.bias
    w, b = _in_dtype_of(args["x"], w, b)
    return w.detach(), (b.detach() if b is not None else None)


def _in_dtype_of(x, w, b=None):
    """``(w, b)`` in x's dtype when they differ (floating point): a call whose x and parameters
    differ in dtype reaches the library only under autocast, which casts them all to one dtype
    (x's, when x is already cast: an earlier autocast op's output); a recorded or searched
    problem is that one. Otherwise as they are (a call outside autocast raises its own error)."""
    if w.dtype != x.dtype and x.is_floating_point() and w.is_floating_point():
        w = w.to(x.dtype)
        b = None if b is None else b.to(x.dtype)
    return w, b


def _problem_of(m, kind: str, args: dict) -> ConvProblem:
    x = args["x"]
    if kind == "transpose":
        xb = x.unsqueeze(0) if x.dim() == m.weight.dim() - 1 else x
        _y_shape, core, s, p, d = _transpose_shape(xb, m.weight, m.stride, m.padding, args["output_padding"],
                                                   m.dilation, m.groups)
        fake = shape_only(core, xb)
        if _is_cl(xb):
            fake = fake.contiguous(memory_format=torch.channels_last if xb.dim() == 4 else torch.channels_last_3d)
        return ConvProblem.from_torch(fake, _call_wb(m, args)[0], None, s, p, d, m.groups)
    w, b = _call_wb(m, args)
    return ConvProblem.from_torch(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups)


def _device_name(backend: str, x) -> str:
    return torch.cuda.get_device_name(x.device) if backend == "cudnn" else ""


def _tune_key(m, kind, args, backend, problem) -> tuple:
    extra, wl = ((m.activation, args.get("residual") is not None) if kind == "fused" else ()), onednn.weights_layout(m.weight)
    return (kind, problem, extra, m.precision, backend, _device_name(backend, args["x"]), wl)


# convert's default cuDNN budget (wall time per problem and direction; ResNet-50 has 24 problems) and each
# autotuner's knobs in convert (the graph's final re-timing 10 groups: autotune's 30 took 0.2 s a problem)
GRAPH_BUDGET_S = 0.6
ONEDNN_TUNE, GRAPH_TUNE = dict(iterations=3, warmup=1), dict(patience=60, final_iterations=10)


def _graph_plan(m, kind: str, args: dict):
    """The cuDNN graph plan that :func:`_tune_one` searches for layer ``m``'s recorded call."""
    from ..cudnn import graph as G

    x = args["x"]
    w, b = _call_wb(m, args)
    allow_tf32 = m.precision != "strict"
    if kind == "conv":
        return G.GraphConvolution(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups,
                                  allow_tf32=allow_tf32)
    if kind == "fused":
        return _fused.plan_for(x, w, b, args.get("residual"), m.stride, _norm_padding(args["padding"]), m.dilation,
                               m.groups, activation=m.activation, backend="cudnn", precision=m.precision)
    return G.GraphConvolution.from_problem(_problem_of(m, kind, args), direction="backward_data",
                                           allow_tf32=allow_tf32)


def _tune_one(m, kind: str, args: dict, backend: str, budget_s: float | None, *, info: dict | None = None,
              use_cache: bool = True, plan=None) -> str:
    """The winning forward candidate's name for layer ``m``'s recorded call. ``info`` (a dict)
    receives the winner's ``median_ms`` / ``min_ms``; ``use_cache=False``: cuDNN searches afresh
    (no tuning cache hit, no seeds from it). ``plan``: cuDNN, the plan :func:`_graph_plan` made
    (whose compilations may have started)."""
    if backend not in _registered.BUILTIN:   # a registered backend: rawconv.core.autotune.drive on its plan
        return _registered.tune(backend, _forward_direction(kind), _problem_of(m, kind, args), m.precision,
                                budget_s, info)
    x, (w, b), prec = args["x"], _call_wb(m, args), m.precision
    if backend == "onednn":
        opts = dict(ONEDNN_TUNE, budget_s=budget_s)   # wall time for the problem (None: no limit)
        if kind == "conv":   # the modules read their weights per call: timed with the weight reorder
            plan = onednn.Convolution(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups,
                                      fpmath=prec)
        elif kind == "fused":   # convert(fuse=True) freezes these: timed on a snapshot, reordered once
            plan = _fused.FusedConvolution(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups,
                                           residual=args.get("residual") is not None, activation=m.activation,
                                           fpmath=prec, prepack=True)
        else:
            problem = _problem_of(m, kind, args)
            plan = onednn.Convolution.from_problem(problem, direction="backward_data", fpmath=prec,
                                                   w_layout=onednn.weights_layout(w), prepack=False)
            plan._w = w
        try:
            rows = plan.autotune(**opts)
        finally:
            plan.free()
        best = rows[0].impl
        if info is not None:
            info.update(median_ms=getattr(rows[0], "median_ms", None), min_ms=getattr(rows[0], "min_ms", None))
        choice = f"{best.name}@{best.layouts}"
        if info is not None and kind in ("conv", "fused") and VERSUS_TORCH:
            choice = _versus_torch_onednn(m, kind, args, choice, info)
        return choice

    budget = budget_s or GRAPH_BUDGET_S
    t0 = time.perf_counter()
    if plan is None:
        plan = _graph_plan(m, kind, args)
    if info is not None:
        info["plan_s"] = time.perf_counter() - t0
    try:
        rows = plan.autotune(budget_s=budget, **GRAPH_TUNE, **({} if use_cache else
                                                              {"use_cache": False, "seed_from_cache": False}))
        if info is not None:
            info["search_s"] = getattr(plan, "autotune_seconds", None)
            info["from_cache"] = bool(rows) and getattr(rows[0], "phase", "") == "cache"
    except NotSupportedError:
        if kind == "fused":
            raise
        # no graph config runs this problem correctly under the precision asked (e.g. strict fp32,
        # where most graph engines are TF32 tensor-core ones): cuDNN's legacy algos, timed, decide
        from .. import cudnn

        direction = "forward" if kind == "conv" else "backward_data"
        legacy = cudnn.Convolution.from_problem(_problem_of(m, kind, args), direction=direction, precision=prec)
        rows = legacy.autotune(budget_s=budget)
        if info is not None and rows:
            info.update(median_ms=rows[0].median_ms, min_ms=rows[0].min_ms)
        return rows[0].algorithm.choice
    if info is not None and rows:
        info.update(median_ms=getattr(rows[0], "median_ms", None), min_ms=getattr(rows[0], "min_ms", None))
    if info is not None and kind in ("conv", "fused") and VERSUS_TORCH:
        try:
            info.update(_versus_torch(m, kind, args, plan))
        except (RawconvError, RuntimeError) as exc:   # the tuned choice stands; the report says why
            info["vs_torch_note"] = f"not compared with torch: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    return plan.selected_name


# convert(autotune=...) on CUDA times each searched layer's pinned call against torch's own call
VERSUS_TORCH = True


def _versus_torch_onednn(m, kind: str, args: dict, choice: str, info: dict) -> str:
    """The choice to pin for a searched oneDNN layer after :func:`rawconv.pytorch.versus_cpu.versus_torch_cpu`
    timed it against torch's own call (and torch's pick, where rawconv's measured slower); ``info``
    gets what torch runs and both times. A failure leaves the search's choice, with a note."""
    from .versus_cpu import versus_torch_cpu

    x, r, prec = args["x"], args.get("residual"), m.precision
    w, b = _call_wb(m, args)
    pad = _norm_padding(args["padding"])
    plans = []

    def ours_for(c):
        if kind == "fused":
            p = _fused.FusedConvolution(x, w, b, m.stride, pad, m.dilation, m.groups, residual=r is not None,
                                        activation=m.activation, fpmath=prec, prepack=True, impl=c)
            plans.append(p)
            return (lambda: p.run(x, None, b, r)) if r is not None else (lambda: p.execute(x))
        p = onednn.Convolution(x, w, b, m.stride, pad, m.dilation, m.groups, fpmath=prec, impl=c)
        plans.append(p)
        return lambda: p.execute(x, w, b)
    try:
        with torch.no_grad():
            new, out = versus_torch_cpu(_torch_peer(m, kind, args, _problem_of(m, kind, args)), ours_for, choice,
                                        dict(x=x, w=w, bias=b, stride=m.stride, padding=pad, dilation=m.dilation,
                                             groups=m.groups))
    except (RawconvError, RuntimeError) as exc:   # the search's choice stands; the report says why
        info["vs_torch_note"] = f"not compared with torch: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        return choice
    finally:
        for p in plans:
            p.free()
    info.update(out)
    return new


def _torch_peer(m, kind: str, args: dict, problem: ConvProblem):
    """Torch's own call for a recorded conv or fused call (``F.conv{1,2,3}d`` on the same tensors,
    then, for a fused call, the residual add and the activation by torch's ops): a callable."""
    x = args["x"]
    w, b = _call_wb(m, args)
    r = args.get("residual")
    nd = w.dim() - 2
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    if problem.symmetric:
        pad, pads = problem.pad_before, None
    else:
        pad = 0
        pads = [v for i in reversed(range(nd)) for v in (problem.pad_before[i], problem.pad_after[i])]
    act = m.activation if kind == "fused" else "none"

    def call():
        xx = x if pads is None else F.pad(x, pads)
        y = conv(xx, w, b, problem.stride, pad, problem.dilation, problem.groups)
        if r is not None or act != "none":
            y = _fused.torch_tail(y, None, r, act, problem)
        return y
    return call


def _versus_torch(m, kind: str, args: dict, plan) -> dict:
    """The GPU time of layer ``m``'s recorded call on its tuned cuDNN plan against torch's own call
    (:func:`_torch_peer`, ``cudnn.benchmark`` on: torch's best pick), interleaved in 5 rounds
    (calls queued behind a busy GPU), and the cuDNN engine torch's call ran (cuDNN's API log).
    When rawconv's pinned call measured more than 3% slower, torch's engine (default knobs; after
    the convolution alone, with torch's ops after it, for a plan with a bias, activation or
    residual) is tried and kept if it measured faster. Returns ``torch_ms``, ``rawconv_ms``,
    ``vs_torch`` (torch / rawconv: above 1, rawconv faster), ``torch_engine`` and, when the guard
    changed the choice, ``vs_torch_note``."""
    from .torch_choice import cudnn_api_log, parse_cudnn_log, torch_flags

    x, r = args["x"], args.get("residual")
    w, b = _call_wb(m, args)
    problem = _problem_of(m, kind, args)
    peer = _torch_peer(m, kind, args, problem)

    def ours():
        return plan.run(x, w, b, r) if r is not None else plan.execute(x, w, b)
    out: dict = {}
    with torch.no_grad(), torch_flags(benchmark=True):
        peer()
        peer()   # (the first call timed torch's candidates: cudnn.benchmark)
        with cudnn_api_log() as log:
            peer()
            torch.cuda.synchronize(x.device)
        engines = parse_cudnn_log(log.messages)["engines"] if log.available else ()
        out["torch_engine"] = f"eng{engines[0]}" if engines else ("legacy API" if log.available else "?")
        return _cuda_pick(plan, peer, ours, engines, out)


def _cuda_pick(plan, peer, ours, engines, out: dict) -> dict:
    """:func:`_versus_torch`'s choice on ``plan`` (a cuDNN graph plan, tuned): the policy of
    :func:`rawconv.core.autotune.versus_torch` (as on the CPU), each measurement 10 interleaved
    groups of ``peer`` (torch's call) and ``ours`` (the plan's call) queued behind a busy GPU,
    torch's engine ``engines[0]`` (default knobs; ``unfused:`` for a plan with an epilogue) the
    alternative unless the plan runs it already. The plan is left on the pinned choice. Returns
    ``out`` with the policy's fields."""
    from ..cudnn.graph import search as _search

    before = plan.selected_name
    alts = []
    if engines and not str(before).split("|")[0].endswith(f"eng{engines[0]}"):
        alts = [c for c in torch_engine_configs(plan, engines[0]) if c != before]
    tried = []

    def measure(c):
        if c != before:
            tried.append(c)
            plan.select(c)
        ours()
        (t_ms, r_ms), _mins, _runs = _search.time_interleaved([peer, ours], 10)
        return t_ms, r_ms, (t_ms / r_ms if r_ms else None)
    pick, measured = _autotune.versus_torch(measure, before, alts, word="engine", tries=len(alts))
    if tried and tried[-1] != pick:   # the plan on the pick (the choice, or not the last engine config tried)
        plan.select(pick)
    out.update(measured)
    return out


#: torch's engine under at most this many knob settings (heuristic modes instant, then fallback)
TORCH_ENGINE_CONFIGS = 4


def torch_engine_configs(plan, engine: int) -> list:
    """The configs of cuDNN engine ``engine`` (the one torch's call ran) that ``plan`` can select,
    as torch's ``cudnn.benchmark`` would have timed them: the engine under each knob setting
    cuDNN's heuristics (modes instant, then fallback) offer for the problem, at most
    :data:`TORCH_ENGINE_CONFIGS`, ``"unfused:"`` before each for a plan with an epilogue (torch
    runs the convolution alone); the engine with default knobs when the heuristics offer none
    (on an H100, eng57 with default knobs took 8.6 ms where torch's knob setting of it took
    0.07 ms: the knobs matter)."""
    pre = "unfused:" if plan.has_epilogue() else ""
    names = []
    src = plan.unfused() if pre and hasattr(plan, "unfused") else plan
    for mode in ("instant", "fallback"):
        try:
            cfgs = src.heuristic(mode) if hasattr(src, "heuristic") else ()
        except RawconvError:   # (a mode cuDNN does not answer for this problem: the other, or the default knobs)
            cfgs = ()
        for ec in cfgs:
            if getattr(ec, "engine", None) == engine and ec.name not in names:
                names.append(ec.name)
    return [pre + n for n in (names[:TORCH_ENGINE_CONFIGS] or [f"eng{engine}"])]


def _grad_problems(m, kind: str, args: dict, backend: str) -> dict:
    """``{direction: (problem, weights layout)}`` of the two library calls that layer ``m``'s
    backward runs for this recorded call, as rawconv's operators build them: the gradients in
    x's memory format (:func:`rawconv.ops._grad_like`). A convolution (plain or fused: the
    backward of a fused module's autograd path, the convolution with its own bias):
    ``backward_data`` and ``backward_weights``. A transposed layer (the convolution's backward
    data): ``forward`` (its input's gradient) and ``backward_weights``."""
    from . import ops as _ops

    x = args["x"]
    # (the weight as the call cast it under autocast; a fused call's own "w" is its folded snapshot,
    # while its backward runs on the convolution's weight)
    w = _in_dtype_of(x, (args["w"] if kind != "fused" and "w" in args else m.weight).detach())[0]
    nd = w.dim() - 2
    xb = x.unsqueeze(0) if x.dim() == nd + 1 else x
    lay = _ops._layout(xb)
    cuda = backend == "cudnn"
    if kind == "transpose":
        _y, core, s, pads, d = _transpose_shape(xb, w, m.stride, m.padding, args["output_padding"], m.dilation,
                                                m.groups)
        gy = empty_like_layout(core, lay, xb.dtype, xb.device)   # the layer's output gradient
        fwd = ConvProblem.from_torch(gy, w, None, s, pads, d, m.groups)
        wts = _ops._backward_weights_problem(gy, xb, tuple(w.shape), s, [a for a, _ in pads], [b for _, b in pads],
                                             d, m.groups, False)
        # (cuDNN's legacy plans describe the filter in the data's layout: rawconv.cudnn.weights_layout)
        return {"forward": (fwd, fwd.layout if cuda else onednn.weights_layout(w)), "backward_weights": (wts, wts.layout)}
    p = ConvProblem.from_torch(xb, w, None, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups)
    pads = tuple(zip(p.pad_before, p.pad_after))
    gy = empty_like_layout(p.y_shape, lay, xb.dtype, xb.device)
    if cuda:
        from .. import cudnn

        data = cudnn.grad_problem(gy, w, tuple(xb.shape), p.stride, pads, p.dilation, p.groups, "backward_data")
        wts = cudnn.grad_problem(gy, xb, tuple(w.shape), p.stride, pads, p.dilation, p.groups, "backward_weights")
    else:
        data = onednn.backward_data_problem(gy, w, tuple(xb.shape), p.stride, pads, p.dilation, p.groups, False)
        wts = _ops._backward_weights_problem(xb, gy, tuple(w.shape), p.stride, p.pad_before, p.pad_after,
                                             p.dilation, p.groups, m.bias is not None)
    return {"backward_data": (data, data.layout if cuda else onednn.weights_layout(w)),
            "backward_weights": (wts, wts.layout)}


def _search_direction(direction: str, problem: ConvProblem, w_layout: str, backend: str, precision: str,
                      budget_s: float | None) -> str:
    """The winning candidate's name for ``problem`` in library direction ``direction`` (oneDNN: every implementation
    timed and checked; cuDNN: the graph API's autotune, else the legacy API's algorithms; a registered backend:
    :func:`rawconv.pytorch.registered.tune`). Raises NotSupportedError when nothing could be timed."""
    if backend not in _registered.BUILTIN:
        return _registered.tune(backend, direction, problem, precision, budget_s)
    if backend == "onednn":
        plan = onednn.Convolution.from_problem(problem, direction=direction, fpmath=precision, w_layout=w_layout,
                                               prepack=False)
        try:
            rows = plan.autotune(**ONEDNN_TUNE, budget_s=budget_s)
        finally:
            plan.free()
        return f"{rows[0].impl.name}@{rows[0].impl.layouts}"
    from .. import cudnn
    from ..cudnn import graph as G

    try:
        plan = G.GraphConvolution.from_problem(problem, direction=direction, allow_tf32=precision != "strict")
        plan.autotune(budget_s=budget_s or GRAPH_BUDGET_S, **GRAPH_TUNE)
        return plan.selected_name
    except NotSupportedError:
        legacy = cudnn.Convolution.from_problem(problem, direction=direction, precision=precision, w_layout=w_layout)
        return legacy.autotune(budget_s=budget_s or GRAPH_BUDGET_S)[0].algorithm.choice


def _tune_backward(m, kind: str, args: dict, backend: str, budget_s) -> tuple:
    """(backward_choice pair or None, {direction: choice}, searched?, note) for a recorded call:
    each distinct backward problem searched once per process (:data:`_TUNED`)."""
    out, searched, notes = {}, False, []
    for direction, (p, wl) in _grad_problems(m, kind, args, backend).items():
        key = (direction, p, m.precision, backend, _device_name(backend, args["x"]), wl)
        if key in _TUNED:
            c = _TUNED[key]
        else:
            try:
                c = _search_direction(direction, p, wl, backend, m.precision, budget_s)
            except NotSupportedError as exc:   # nothing could be timed: the library's default runs it
                c = None
                notes.append(f"{direction} not tuned: {exc}")
            _TUNED[key] = c
            searched = True
        out[direction] = c
    pair = (out["forward"] if kind == "transpose" else out["backward_data"], out["backward_weights"])
    return (None if pair == (None, None) else pair), out, searched, "; ".join(notes)


def _forward_direction(kind: str) -> str:
    return "backward_data" if kind == "transpose" else "forward"


def _pin_tuned(m, kind: str, args: dict, entry: TunedChoice) -> None:
    """Pin ``entry`` to the problem of layer ``m``'s recorded call (its tuned table)."""
    table = m.__dict__.get(_TUNED_ATTR)
    if table is None:
        table = m.__dict__[_TUNED_ATTR] = {}
    key = _call_key(m, kind, args)
    if key is not None:
        table[key] = entry
    m._choice_backend = entry.backend
    st = m.__dict__.get(_fused._FROZEN_STATE)
    if st is not None:   # a plan made for this problem before took the choice it had then
        st.plans.clear()


def _tune_call(m, kind: str, args: dict, backend: str, budget_s, backward: bool, info: dict, plan=None) -> tuple:
    """(TunedChoice, forward searched?, backward searched?, note) for one recorded call: the forward
    from the process memo or :func:`_tune_one`, the backward passes (``backward``) by
    :func:`_tune_backward`."""
    problem = _problem_of(m, kind, args)
    key = _tune_key(m, kind, args, backend, problem)
    note = ""
    searched = False
    if m.choice is not None:   # pinned by the module's own choice (every problem): nothing to search
        choice, note = m.choice, "forward pinned by the module's choice"
    elif key in _TUNED:
        choice = _TUNED[key]
    else:
        try:
            choice = _tune_one(m, kind, args, backend, budget_s, info=info, plan=plan)
        except NotSupportedError as exc:   # nothing could be timed: the backend's default stays
            choice, note = None, f"not tuned: {exc}"
        _TUNED[key] = choice
        searched = True
    bwd, bsearched, dirs = None, False, {}
    if backward and m.backward_choice is None:
        bwd, dirs, bsearched, bnote = _tune_backward(m, kind, args, backend, budget_s)
        note = "; ".join(n for n in (note, bnote) if n)
    elif backward:
        bwd, note = m.backward_choice, "; ".join(n for n in (note, "backward pinned by the module's "
                                                                     "backward_choice") if n)
        d, wt = _pair(bwd)
        dirs = {("forward" if kind == "transpose" else "backward_data"): d, "backward_weights": wt}
    directions = {_forward_direction(kind): choice, **dirs}
    entry = TunedChoice(problem.describe(), kind, backend, choice, bwd, directions)
    if backend == "onednn":   # searched (or pinned) here: offered here
        object.__setattr__(entry, _OFFERED_ON, _onednn_here())
    _pin_tuned(m, kind, args, entry)
    return entry, searched, bsearched, note


# saved models and pickles name these classes by their face's path (as before the split)
for _cls in (TunedChoice,):
    _cls.__module__ = FACE
