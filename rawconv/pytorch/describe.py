""":func:`rawconv.nn.describe`: per layer of a model, what rawconv and torch run, their error against
float64 and their times."""
from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
import torch.nn.functional as F

from . import fallback as _fallback
from . import fused as _fused
from . import fusion as _fusion
from .. import onednn
from ..core.errors import ArgumentError, ArgumentTypeError, NotSupportedError
from ..core.problem import ConvProblem
from ..core import guard as _guard
from .functional import _norm_padding, _pair, _resolve_backend
from .search import _TUNED_ATTR, _as_args, _call_key, _call_wb, _problem_of, _recording
from .modules import _ConvBiasAct, _RawconvConv, _TORCH_TRANSPOSED, _conv_modules
from .report import DescribeTable, LayerReport
from .convert import _swap_module

FACE = "rawconv.pytorch.nn"   # where this module's public names live (rawconv.nn): pickles, messages


def _torch_equivalent(m, x, residual=None, *, w=None, b=None, output_size=None):
    """What torch computes for layer ``m`` (its own functional ops), with optional other tensors."""
    w = m.weight if w is None else w
    b = m.bias if b is None else b
    nd = w.dim() - 2
    if isinstance(m, _TORCH_TRANSPOSED):
        op = m._output_padding(x, output_size, m.stride, m.padding, m.kernel_size, nd, m.dilation)
        f = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[nd]
        return f(x, w, b, m.stride, m.padding, op, m.groups, m.dilation)
    f = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    if m.padding_mode != "zeros":
        y = f(F.pad(x, m._reversed_padding_repeated_twice, mode=m.padding_mode), w, b, m.stride, 0, m.dilation,
              m.groups)
    else:
        y = f(x, w, b, m.stride, m.padding, m.dilation, m.groups)
    if isinstance(m, _ConvBiasAct):
        bn = m.__dict__.get(_fused.BN_KEY)
        if bn is not None:   # eval mode: the running statistics (what the fold computes)
            def c(t):
                return t.detach().to(device=y.device, dtype=y.dtype) if t is not None else None   # (describe's CPU reference)
            y = F.batch_norm(y, c(bn.running_mean), c(bn.running_var), c(bn.weight), c(bn.bias), False, 0.0, bn.eps)
        if residual is not None:
            y = y + residual
        y = _fused.apply_activation(y, m.activation)
    return y


def _call_choices(m, kind: str, args: dict):
    """(choice, backward_choice, TunedChoice or None, note) of a recorded call: what it ran and why."""
    table = m.__dict__.get(_TUNED_ATTR)
    if not table:
        return m.choice, m.backward_choice, None, ""
    key = _call_key(m, kind, args)
    t = table.get(key) if key is not None else None
    if t is None:
        return m.choice, m.backward_choice, None, (
            f"not a problem this layer was autotuned for ({'; '.join(e.problem for e in table.values())}): "
            + ("the library's default runs" if m.choice is None else f"its own choice {m.choice!r} runs"))
    choice = t.choice if m.choice is None else m.choice
    bwd = t.backward_choice if m.backward_choice is None else m.backward_choice
    note = f"autotuned: {', '.join(f'{d} {c}' for d, c in t.directions.items())}" + (
        "" if bwd is not None else "; backward passes not tuned (the libraries' defaults)")
    if m.choice is not None:
        note += f"; the module's own choice {m.choice!r} runs"
    return choice, bwd, t, note


def _rawconv_runs(m, kind, args, backend, choice=None) -> str:
    """A label of the candidate rawconv runs for this call (asks the library); ``choice``: the
    forward choice the call ran with (:func:`_call_choices`)."""
    x = args["x"]
    w, b = _call_wb(m, args)
    unfused = (m.__dict__.get(_fusion.UNFUSED_ATTR) or {}).get(_call_key(m, kind, args)) \
        if kind == "fused" and m.choice is None else None
    if unfused is not None:   # convert measured this problem faster unfused (rawconv.pytorch.fusion)
        tail = (["add"] if args.get("residual") is not None else []) + \
            ([m.activation] if m.activation != "none" else [])
        return f"unfused (measured faster): conv+bias {unfused}, then torch's {'+'.join(tail)}"
    try:
        if backend == "onednn":
            if kind == "fused":
                plan = _fused.plan_for(x, w, b, args.get("residual"), m.stride, _norm_padding(args["padding"]),
                                       m.dilation, m.groups, activation=m.activation, backend="onednn",
                                       choice=choice, precision=m.precision)
            elif kind == "conv":
                plan = onednn.Convolution(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups,
                                          impl=choice, fpmath=m.precision, prepack=False)
            else:
                plan = onednn.Convolution.from_problem(_problem_of(m, kind, args), direction="backward_data",
                                                       impl=choice, fpmath=m.precision,
                                                       w_layout=onednn.weights_layout(w), prepack=False)
            s = plan.selected
            packed = plan.prepack or (kind == "fused" and _fused.frozen(m))
            ro = [r + ("(prepacked)" if r == "w" and packed else "") for r in s.reorders]
            label = f"{s.name}@{s.layouts}" + (f" reorders={','.join(ro)}" if ro else "")
            if kind == "fused":
                label += f" post-ops={'+'.join(o[0] if o[0] == 'sum' else o[1] for o in plan._post_ops) or 'none'}"
            return label
        if kind == "fused":
            plan = _fused.plan_for(x, w, b, args.get("residual"), m.stride, _norm_padding(args["padding"]), m.dilation,
                                   m.groups, activation=m.activation, backend="cudnn", choice=choice,
                                   precision=m.precision)
            return f"graph {plan.selected_name} (conv+bias{'+add' if args.get('residual') is not None else ''}" \
                   f"{'+' + m.activation if m.activation != 'none' else ''})"
        from .. import cudnn

        if isinstance(choice, str) and cudnn.is_graph_choice(choice):
            return f"graph {choice}"
        if kind == "conv" and (choice is None or choice == "") and m.backend == "auto":
            # what the operator runs with no choice: the graph API's default (cudnn.forward would
            # name the legacy API's heuristic, which only backend="cudnn" runs)
            from ..cudnn import graph as G
            from . import ops as _ops

            try:
                plan = G.cached_forward_plan(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups, None,
                                             None, False, _ops._GRAPH_MATH[m.precision])
                return f"graph {plan.selected_name}"
            except NotSupportedError:
                pass   # no graph config: the legacy API runs it (below)
        if kind == "conv":
            _, info = cudnn.forward(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups,
                                    choice=choice, precision=m.precision, return_info=True)
        else:
            p = _problem_of(m, kind, args)
            xb = x.unsqueeze(0) if x.dim() == w.dim() - 1 else x
            _, info = cudnn.backward_data(xb, w, p.x_shape, p.stride, p.pad_before, p.dilation, p.groups,
                                          choice=choice, precision=m.precision, return_info=True)
        return f"legacy {info.algo}@{info.math}"
    except (NotSupportedError, ArgumentError) as exc:
        return f"(not available: {exc})"


def _torch_backend(m, x) -> str:
    nd = m.weight.dim() - 2
    try:
        xx = x.unsqueeze(0) if x.dim() == nd + 1 else x
        pad = m.padding
        if isinstance(pad, str) or m.padding_mode != "zeros":
            if m.padding_mode != "zeros":
                xx = F.pad(xx, m._reversed_padding_repeated_twice, mode=m.padding_mode)
                pad = (0,) * nd
            else:
                p = ConvProblem.from_torch(xx, m.weight, None, m.stride, pad, m.dilation, m.groups)
                if not p.symmetric:
                    return "?"
                pad = p.pad_before
        transposed = isinstance(m, _TORCH_TRANSPOSED)
        op = list(m.output_padding) if transposed else [0] * nd
        be = torch._C._select_conv_backend(xx, m.weight, m.bias, list(m.stride), list(pad), list(m.dilation),
                                           transposed, op, m.groups)
        return _conv_backend_name(be)
    except Exception as exc:   # noqa: BLE001  (a private API)
        return f"unknown ({type(exc).__name__})"


# torch's ConvBackend enum (aten/src/ATen/native/ConvUtils.h) in order: the Python binding leaves
# MkldnnTranspose (9) unnamed and spells MpsTranspose with a trailing comma
_CONV_BACKENDS = ("CudaDepthwise2d", "CudaDepthwise3d", "Cudnn", "CudnnTranspose", "Empty", "Miopen",
                  "MiopenDepthwise", "MiopenTranspose", "Mkldnn", "MkldnnTranspose", "MkldnnEmpty", "NnpackSpatial",
                  "Overrideable", "Slow2d", "Slow3d", "SlowDilated2d", "SlowDilated3d", "SlowTranspose2d",
                  "SlowTranspose3d", "Winograd3x3Depthwise", "Xnnpack2d", "Mps", "MpsTranspose")


def _conv_backend_name(be) -> str:
    name = str(be).split(".")[-1].rstrip(",")
    if "?" in name:
        i = int(be)
        name = _CONV_BACKENDS[i] if 0 <= i < len(_CONV_BACKENDS) else f"ConvBackend({i})"
    return name


def _torch_runs(fn, device) -> str:
    if device.type == "cpu":
        from .torch_choice import torch_onednn_trace

        trace = torch_onednn_trace(fn)
        convs = [t for t in trace if t["kind"] in ("convolution", "deconvolution")]
        if not convs:
            return "(no oneDNN primitive)"
        reorders = sum(t["kind"] == "reorder" for t in trace)
        return f"oneDNN {convs[0]['impl']}" + (f" + {reorders} reorder(s)" if reorders else "") + \
            (f" + {len(trace) - len(convs) - reorders} other" if len(trace) - len(convs) - reorders else "")
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return " + ".join(dict.fromkeys(n[:80] for n in names)) or "(no kernel seen)"
    except Exception as exc:   # noqa: BLE001
        return f"(profiler: {type(exc).__name__})"


def _timer(fn, device, iterations: int) -> float:
    """Median ms per call of ``fn``: CUDA, GPU time with calls queued behind a busy GPU; CPU, as
    ``compare`` times (interleaved rounds of one candidate, each round's fastest clean call)."""
    from ..core import bench

    if device.type == "cuda":
        return bench.time_cuda_queued(fn, iterations=iterations).median_ms
    rounds, calls = bench.round_plan(iterations)
    return bench.time_rounds({"f": fn}, rounds=rounds, calls=calls, warmup=2)["f"].stats().median_ms


def _time_pair(run_rawconv, run_torch, iterations: int) -> tuple:
    """rawconv's and torch's calls of one layer timed together in interleaved rounds
    (:func:`rawconv.bench.time_rounds`: ``iterations`` calls each). Returns ``(rawconv ms, torch
    ms, ratio dict or None, flags)``: each side's median over rounds of its fastest clean call,
    torch / rawconv taken within each round (:func:`rawconv.bench.ratio`), and what was
    measured against them (``"rawconv: waited for a CPU: ..."``)."""
    from ..core import bench

    rounds, calls = bench.round_plan(iterations)
    t = bench.time_rounds({"rawconv": run_rawconv, "torch": run_torch}, rounds=rounds, calls=calls, warmup=2)
    q = bench.ratio(t["torch"], t["rawconv"])
    flags = [f"{k}: {f}" for k in ("rawconv", "torch") for f in t[k].flags()]
    return t["rawconv"].stats().median_ms, t["torch"].stats().median_ms, (q.as_dict() if q else None), flags


def _rel_err(y, ref) -> float:
    y64 = y.detach().to("cpu", torch.float64)
    denom = ref.abs().max().item()
    d = (y64 - ref).abs().max().item()
    return d / denom if denom > 0 else d


def _copied(v):
    return v.detach().clone() if isinstance(v, torch.Tensor) else v


def describe(model: torch.nn.Module, example_input: Any, *, iterations: int = 10, timing: bool = True,
             torch_kernels: bool = True) -> DescribeTable:
    """Each convolution layer of ``model`` on ``example_input``: what rawconv runs and what torch runs.

    The model runs once (no grad) with hooks that record every convolution module's call. For each
    layer (a :class:`LayerReport`): ``problem`` (:meth:`ConvProblem.describe`; transposed layers:
    the matching convolution's problem), what rawconv runs (backend and candidate: oneDNN
    implementation, layouts, reorders, post-ops; cuDNN algo@math or graph engine config; for a
    torch layer, what :func:`convert` would run by default), what torch runs
    (``torch._C._select_conv_backend``; on CPU the implementation torch's own oneDNN ran, from
    its verbose log; on CUDA the kernel names torch's call launched, from ``torch.profiler``,
    with ``torch_kernels``), the median time of each (``iterations`` calls; CUDA: GPU time,
    calls queued behind a busy GPU) and the error of each against float64 (torch's float64
    functional ops on the CPU, fused residual and activation included), what the layer's backward
    passes run in a training step (``backward``: the library's choice per direction, by its one
    name). On the CPU both sides are timed together in interleaved rounds, ``x`` is the median
    of torch / rawconv taken within each round with its interquartile range, and a layer whose
    rounds waited for a CPU or disagree is flagged as ``compare`` flags its rows
    (:class:`rawconv.bench.TimingWarning` warnings, the table's ``warnings`` and timing lines).
    Returns a :class:`DescribeTable` (a list whose repr is a table; :func:`print_table`).
    """
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    names, calls = _record_conv_calls(model, example_input)
    rows = DescribeTable()
    for m, args, kwargs in calls:
        rows.append(_describe_layer(m, args, kwargs, names.get(id(m), "?"), iterations, timing, torch_kernels))
    from ..core.bench import TimingWarning, flag_warnings

    rows.warnings = flag_warnings([r.timing_flags for r in rows if r.ratio is not None])
    for w in rows.warnings:
        warnings.warn(f"rawconv.nn.describe: {w}", TimingWarning, stacklevel=_guard.stacklevel())
    return rows


def _record_conv_calls(model: torch.nn.Module, example_input: Any) -> tuple[dict, list]:
    """Run ``model`` once on ``example_input`` (no grad) with hooks on its convolution modules.
    Returns ``(names, calls)``: ``{id(module): name}``, and each module's first call as
    ``(module, args, kwargs)`` with copies of its tensors, in call order."""
    convs = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d) + _TORCH_TRANSPOSED
    names = {}
    calls: list = []
    hooks = []
    mods = [(n, m) for n, m in model.named_modules() if isinstance(m, convs)]
    mods += [(n, m) for n, m in _conv_modules(model).items() if m.__dict__.get("_rawconv_helper")]
    for name, m in mods:
        if isinstance(m, convs):
            names[id(m)] = name

            def hook(mod, args, kwargs):
                # copies: the model's own run goes on after this call and may write into these tensors
                # (a fused module marked residual_inplace adds its result into the residual's memory)
                if not any(c[0] is mod for c in calls):
                    calls.append((mod, tuple(_copied(a) for a in args), {k: _copied(v) for k, v in kwargs.items()}))
            hooks.append(m.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(*_as_args(example_input))
    finally:
        for h in hooks:
            h.remove()
    return names, calls


def _describe_layer(m, args: tuple, kwargs: dict, name: str, iterations: int, timing: bool,
                    torch_kernels: bool) -> LayerReport:
    """:func:`describe`'s row for one recorded call of the convolution module ``m`` (named ``name``;
    ``args``, ``kwargs``: the call's arguments): what rawconv and torch run, their errors against
    float64 and (``timing``) their median times over ``iterations`` calls. Returns the
    :class:`LayerReport`."""
    x = args[0]
    residual = args[1] if len(args) > 1 else kwargs.get("residual")
    output_size = args[1] if isinstance(m, _TORCH_TRANSPOSED) and len(args) > 1 else kwargs.get("output_size")
    rm = m if isinstance(m, _RawconvConv) else _swap_module(copy.copy(m), "auto", None, "strict")
    with torch.no_grad():
        fell_back = _fallback.reason_for(rm, x)
    if fell_back is not None:   # a call no rawconv library runs: torch's own kernel, on both sides
        return _describe_fallback(m, x, residual, output_size, name, fell_back, iterations, timing)
    backend = _resolve_backend(rm.backend, x.device)
    # the exact library call of the rawconv module
    with _recording() as rec, torch.no_grad():
        rm(x, _copied(residual)) if isinstance(rm, _ConvBiasAct) else rm(x) if output_size is None \
            else rm(x, output_size)
    note = ""
    backward = ""
    if rec:
        _, kind, cargs = rec[0]
        problem = _problem_of(rm, kind, cargs).describe()
        choice, bwd, _t, note = _call_choices(rm, kind, cargs)
        runs = _rawconv_runs(rm, kind, cargs, backend, choice)
        backward = _rawconv_backward(rm, kind, cargs, backend, choice, bwd)
    else:
        problem, runs, note = "?", "?", "the call ran outside rawconv's fused path (broadcast residual)"

    scratch = residual.clone() if residual is not None else None

    def run_rawconv(r=None):
        # the residual a fused module may write into: a copy per checked call (r=None), a scratch
        # tensor when timed (what the model's call does, in place where convert allowed it)
        with torch.no_grad():
            if isinstance(rm, _ConvBiasAct):
                return rm(x, residual.clone() if r is None and residual is not None else r)
            return rm(x) if output_size is None else rm(x, output_size)

    def run_torch():
        with torch.no_grad():
            return _torch_equivalent(m, x, residual, output_size=output_size)

    ref = _reference64(m, x, residual, output_size)
    label = type(m).__name__ + (f"({m.activation}{', residual' if residual is not None else ''})"
                                if isinstance(m, _ConvBiasAct) else "")
    row = LayerReport(name, label, problem, backend, runs, _torch_backend(m, x),
                      _torch_runs(run_torch, x.device) if (torch_kernels or x.device.type == "cpu") else "",
                      note=note, backward=backward)
    ran = False
    try:
        row.rawconv_err = _rel_err(run_rawconv(), ref)
        ran = True
        if timing and x.device.type == "cuda":
            row.rawconv_ms = _timer(lambda: run_rawconv(scratch), x.device, iterations)
    except (NotSupportedError, ArgumentError) as exc:
        row.note = (row.note + "; " if row.note else "") + f"rawconv: {exc}"
    row.torch_err = _rel_err(run_torch(), ref)
    if timing and x.device.type == "cuda":
        row.torch_ms = _timer(run_torch, x.device, iterations)
    elif timing:   # the CPU: both sides together, in interleaved rounds
        if ran:
            row.rawconv_ms, row.torch_ms, row.ratio, row.timing_flags = _time_pair(lambda: run_rawconv(scratch),
                                                                                   run_torch, iterations)
        else:
            row.torch_ms = _time_pair(run_torch, run_torch, iterations)[1]
    return row


def _rawconv_backward(m, kind: str, args: dict, backend: str, choice, bwd) -> str:
    """What layer ``m``'s backward passes run for this recorded call, by each candidate's one name
    (oneDNN: the plans :func:`rawconv.ops.selected` builds for ``choice`` and ``bwd``; cuDNN: the
    pinned choices, else "cuDNN's choice at the first call"); '' where it does not say
    (transposed layers)."""
    if kind == "transpose":
        return ""
    pinned = "pinned" if bwd is not None else "the library's first choice (not pinned)"
    if backend != "onednn":
        d, wt = _pair(bwd) if bwd is not None else (None, None)
        return (f"backward_data {d or 'cuDNN picks at the first call'}, backward_weights "
                f"{wt or 'cuDNN picks at the first call'}")
    from .ops import selected

    x = args["x"]
    w, b = _call_wb(m, args)
    try:
        sel = selected(x, w, b, m.stride, _norm_padding(args["padding"]), m.dilation, m.groups,
                       choice=choice if kind == "conv" else None, backward_choice=bwd, precision=m.precision)
    except (NotSupportedError, ArgumentError) as exc:
        return f"(not available: {exc})"
    return f"backward_data {sel['backward_data']}, backward_weights {sel['backward_weights']} ({pinned})"


def _reference64(m, x, residual, output_size):
    """What torch computes for layer ``m``'s call in float64 on the CPU (:func:`describe`'s reference)."""
    x64 = x.detach().to("cpu", torch.float64)
    r64 = residual.detach().to("cpu", torch.float64) if residual is not None else None
    with torch.no_grad():
        return _torch_equivalent(m, x64, r64, w=m.weight.detach().to("cpu", torch.float64),
                                 b=m.bias.detach().to("cpu", torch.float64) if m.bias is not None else None,
                                 output_size=output_size)


def _describe_fallback(m, x, residual, output_size, name: str, why: str, iterations: int,
                       timing: bool) -> LayerReport:
    """:func:`describe`'s row for a call that runs on torch's own kernel (``why``): what torch runs,
    its time and its error against float64 (the CPU's float64 reference is torch's own kernel too:
    no error is computed for a float64 call there)."""
    def run_torch():
        with torch.no_grad():
            return _torch_equivalent(m, x, residual, output_size=output_size)

    problem = f"{x.dtype} {x.device.type} x{tuple(x.shape)} w{tuple(m.weight.shape)}"
    runs = _torch_backend(m, x)
    row = LayerReport(name, type(m).__name__, problem, "torch (fallback)", f"{runs}: {why}", runs,
                      "torch's own kernel", note=f"runs on torch's own kernel: {why}")
    if x.dtype != torch.float64 and not x.dtype.is_complex and x.device.type in ("cpu", "cuda"):
        row.torch_err = row.rawconv_err = _rel_err(run_torch(), _reference64(m, x, residual, output_size))
    if timing and x.device.type in ("cpu", "cuda"):
        row.torch_ms = row.rawconv_ms = _timer(run_torch, x.device, iterations)
    return row


# every public entry point raises only rawconv's exception classes (rawconv._guard)
_guard.guard_module(globals(), "describe", where=FACE)
