"""Torch's own convolution choice, made visible (:func:`torch_choice`) and controllable (:func:`torch_flags`).

    import rawconv

    c = rawconv.torch_choice(x, w, padding=1)       # what torch runs for F.conv2d(x, w, padding=1)
    print(c)          # Mkldnn: oneDNN jit:avx512_core (src aBcd16b, weights ABcd16b16a) + 3 reorder(s) ...
    c.as_dict()       # the same, JSON-friendly

    with rawconv.torch_flags(mkldnn=False, threads=1):   # torch's conv flags for a block, restored after
        print(rawconv.torch_choice(x, w, padding=1))     # Slow2d: torch's own code

    python -m rawconv.torch_choice --report resnet50 --batch 32 --dtype float16 --layout nhwc --device cuda

(``rawconv.torch_choice`` is this module, and calling it calls :func:`torch_choice`.)

What torch runs is found out three ways, each saying something the others cannot:

* **The backend**: ``torch._C._select_conv_backend`` (a private function torch's own
  ``convolution`` calls) with the same arguments, under the flags in force: ``Mkldnn``,
  ``Slow2d``, ``Cudnn``, ``CudnnTranspose``... It names the code path, not the algorithm.
* **CPU, what torch's own oneDNN ran** (:func:`torch_onednn_trace`): one call under
  ``torch.backends.mkldnn.verbose``, whose ``onednn_verbose,...,exec,...`` lines (written by C code
  to the process's stdout) are captured by pointing file descriptor 1 at a temporary file. It gives
  the implementation name (``jit:avx512_core``, ``brg_conv_fwd:avx512_core``), the memory formats
  and every reorder. torch bundles a newer oneDNN (3.12 in torch 2.14) than rawconv's (3.2): a name
  found in rawconv's list (after torch's renames, e.g. ``brg_conv_fwd`` = ``brgconv``) is the
  same kind of implementation of another version of the library, not the same code.
* **CUDA, which kernels torch's call launched**: ``torch.profiler`` (CUDA activity) around one call
  after a warm-up call (with ``cudnn.benchmark=True`` the first call times many kernels). Each of
  rawconv's candidates is then run once the same way (cuDNN legacy ``(algo, math)`` rows with
  status success from ``cudnn.Convolution(...).algorithms("heuristic")``; graph-API engine configs
  from heuristic modes instant, b and fallback, then every engine with default knobs, up to
  ``limit`` each) to get its kernel names, and torch's call maps to the candidates that launch the
  same set of cuDNN kernels (torch's own helper kernels, ``at::native::*``, left out on both sides),
  else to those that launch torch's longest kernel, else to "no listed config". It cannot tell two
  configs apart that run the same kernels (knobs that do not change the kernel: several matches),
  nor see a config outside the list (raise ``limit``).
* **CUDA, cuDNN's own API log** through ``cudnnSetCallback`` (declared in
  ``cdefs/cudnn_graph.h``, called through rawconv's cffi on the cuDNN torch loaded: one library per
  process, so it sees torch's calls). Each message is the text ``CUDNN_LOGLEVEL_DBG=3`` would log
  (NUL-separated lines, ended by an empty line), delivered at run time with no environment variable
  set before cuDNN starts. It tells which cuDNN functions torch called (graph API
  ``cudnnBackendExecute`` or legacy ``cudnnConvolutionForward``) and, from the execution plan cuDNN
  prints with ``cudnnBackendExecute`` (``engine_id: type=int; val=N;``), the **engine global index**
  torch's cudnn-frontend finalized: exact, but without the knob choices (cuDNN 9.24 prints knob
  choice descriptors as addresses), so it narrows the kernel matches to one engine rather than
  replacing them. With the legacy API it gives the algo (``algo: ...; val=CUDNN_..._ALGO_...``).
  ``CUDNN_LOGLEVEL_DBG=3`` with ``CUDNN_LOGDEST_DBG=file`` writes the same text for the whole
  process, but only when set before cuDNN initializes, and cannot be scoped to one call.

:func:`torch_flags` sets torch's convolution flags for a ``with`` block and restores them (also
after an exception): the first half of "how do I force PyTorch's convolution method?". The second
half is rawconv itself: pin one candidate with :mod:`rawconv.nn` (``choice=``) or :mod:`rawconv.ops`.

The code of each route lives in a part of this module, which hands its names on (``rawconv.torch_choice.X``
as before the split): :mod:`.torch_choice_flags` (:func:`torch_flags`, :class:`TorchFlags`),
:mod:`.torch_choice_cpu` (the oneDNN trace) and :mod:`.torch_choice_cuda` (kernels, cuDNN's API log,
rawconv's candidates); the call, :func:`torch_choice`, :class:`TorchChoice` and the report live here. The
hooks a test sets on this module (``_profile_calls``, ``cudnn_api_log``) are set in the part that reads
them (:func:`rawconv.core.face.route_settings`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import sys
import time
import types
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from . import torch_choice_cuda as _cuda
from ..core.errors import ArgumentError, ArgumentTypeError, RawconvError
from ..core.face import route_settings as _route_settings
from ..core.problem import ConvProblem, layout_of, shape_only, transposed_shapes, tuple_arg
from .torch_choice_flags import (CUDNN_FP32_PRECISIONS, MKLDNN_FP32_PRECISIONS, _C, _has_fp32_api,  # noqa: F401
                                 _precision, _legacy_cudnn_tf32, _get_bool, TorchFlags, _check_opt_bool,
                                 _check_precision, torch_flags, _check_torch_flags, _change, _change_precision,
                                 _change_allow_tf32, _set_torch_flags, _undo, torch_part)
from .torch_choice_cpu import (_trace_lock, OneDNNRun, _format_tags, parse_onednn_verbose, _capture_fd1,  # noqa: F401
                               torch_onednn_trace, trace_detail, _ONEDNN_RENAMES, _torch_onednn_version,
                               _rawconv_onednn_version, _normalize_impl, _TRACE_ROLES, _onednn_matches)
from .torch_choice_cuda import (CandidateKernels, _MARK, _is_helper, _cuda_events, _split_segments,  # noqa: F401
                                _profile_calls, _profile_each, _short, _unique, _cudnn_set, match_kernels,
                                cudnn_api_log, _FUNC_RE, _ENGINE_RE, _ALGO_RE, _algo_short, parse_cudnn_log,
                                _cand_cache, _CAND_CACHE_SIZE, _candidate_kernels, _exec_args, _legacy_candidates,
                                _graph_candidates, _profile_candidates)

__all__ = ["torch_choice", "TorchChoice", "TorchFlags", "torch_flags", "OneDNNRun", "CandidateKernels",
           "torch_onednn_trace", "select_backend", "conv_backend_name", "match_kernels", "parse_cudnn_log",
           "cudnn_api_log", "report", "main"]

log = logging.getLogger("rawconv")

# torch's ConvBackend enum (aten/src/ATen/native/ConvUtils.h), in order: the Python binding leaves
# MkldnnTranspose (9) unnamed and spells MpsTranspose with a trailing comma (torch 2.11-2.14)
CONV_BACKENDS = ("CudaDepthwise2d", "CudaDepthwise3d", "Cudnn", "CudnnTranspose", "Empty", "Miopen",
                 "MiopenDepthwise", "MiopenTranspose", "Mkldnn", "MkldnnTranspose", "MkldnnEmpty", "NnpackSpatial",
                 "Overrideable", "Slow2d", "Slow3d", "SlowDilated2d", "SlowDilated3d", "SlowTranspose2d",
                 "SlowTranspose3d", "Winograd3x3Depthwise", "Xnnpack2d", "Mps", "MpsTranspose")
#: the backends that run torch's bundled oneDNN / cuDNN
ONEDNN_BACKENDS = ("Mkldnn", "MkldnnTranspose", "MkldnnEmpty")
CUDNN_BACKENDS = ("Cudnn", "CudnnTranspose")

DEFAULT_LIMIT = 24


def conv_backend_name(be) -> str:
    """The name of a ``torch._C._ConvBackend`` value (``"Mkldnn"``), including the values torch's
    binding leaves unnamed (``MkldnnTranspose``) or misspells (``MpsTranspose,``)."""
    name = str(be).split(".")[-1].rstrip(",")
    if "?" in name or not name or name[0].isdigit():
        try:
            i = int(be)
        except (TypeError, ValueError):
            return name
        name = CONV_BACKENDS[i] if 0 <= i < len(CONV_BACKENDS) else f"ConvBackend({i})"
    return name


# ============================================================================ the call torch runs
@dataclass
class _Call:
    """One convolution call as torch runs it: the torch function, the arguments
    ``_select_conv_backend`` takes, and the forward problem rawconv's candidates solve."""

    x: torch.Tensor            # the input as torch's convolution() sees it (batched, explicitly padded)
    xb: torch.Tensor           # the caller's input, batched (not padded)
    w: torch.Tensor
    b: torch.Tensor | None
    stride: list
    padding: list
    dilation: list
    transposed: bool
    output_padding: list
    groups: int
    run: Callable[[], torch.Tensor]
    problem: ConvProblem       # forward problem (transposed: the convolution whose backward data it is)
    direction: str             # "forward", "backward_data" (also a transposed forward), "backward_weights"
    describe: str
    dy: torch.Tensor | None = None   # the output's gradient of a backward call (torch_choice(direction=...))

    @property
    def device(self) -> str:
        return str(self.x.device)


def _call_of(x, w, bias, stride, padding, dilation, groups, transposed, output_padding) -> _Call:
    if not isinstance(transposed, bool):
        raise ArgumentTypeError(f"transposed must be a bool, got {transposed!r}")
    if not transposed:
        p = ConvProblem.from_torch(x, w, bias, stride, padding, dilation, groups)
        nd = p.ndim
        if output_padding is not None and any(tuple_arg(output_padding, nd, "output_padding", 0)):
            raise ArgumentError("output_padding applies to transposed convolutions only (transposed=True)")
        conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
        xx = xb = x.unsqueeze(0) if p.unbatched else x
        if p.symmetric:
            pad = list(p.pad_before)
            run = (lambda: conv(x, w, bias, p.stride, pad, p.dilation, p.groups))
        else:
            padlist = []
            for bf, af in reversed(list(zip(p.pad_before, p.pad_after))):
                padlist += [bf, af]
            xx, pad = F.pad(xx, padlist), [0] * nd
            run = (lambda: conv(F.pad(x, padlist), w, bias, p.stride, 0, p.dilation, p.groups))
        return _Call(xx, xb, w, bias, list(p.stride), pad, list(p.dilation), False, [0] * nd, p.groups, run,
                     p.with_(has_bias=False), "forward", p.describe())
    # transposed: x (N, C_in, *s), w (C_in, C_out/groups, *k)
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ArgumentTypeError(f"x and w must be torch.Tensor, got {type(x).__name__} and {type(w).__name__}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise ArgumentTypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    if w.dim() not in (3, 4, 5):
        raise ArgumentError(f"weight must be 3-D, 4-D or 5-D (C_in, C_out/groups, *kernel), got {tuple(w.shape)}")
    nd = w.dim() - 2
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ArgumentError(f"groups must be a positive int, got {groups!r}")
    if isinstance(padding, str):
        raise ArgumentError("a transposed convolution takes numeric padding (as torch), got a string")
    s, pd = tuple_arg(stride, nd, "stride", 1), tuple_arg(padding, nd, "padding", 0)
    d, op = tuple_arg(dilation, nd, "dilation", 1), tuple_arg(output_padding, nd, "output_padding", 0)
    if any(o >= max(si, di) for o, si, di in zip(op, s, d)):
        raise ArgumentError(f"output_padding {op} must be smaller than stride {s} or dilation {d} (as in torch)")
    unbatched = x.dim() == nd + 1
    xx = x.unsqueeze(0) if unbatched else x
    if xx.dim() != nd + 2:
        raise ArgumentError(f"input must be {nd + 2}-D (N, C_in, *spatial) or unbatched, got {tuple(x.shape)}")
    if xx.shape[1] != w.shape[0] or w.shape[0] % groups:
        raise ArgumentError(f"input has {xx.shape[1]} channels; weight {tuple(w.shape)} with groups={groups} "
                            f"expects {w.shape[0]} (a multiple of groups)")
    if x.dtype != w.dtype or x.device != w.device:
        raise ArgumentError(f"x and w must share dtype and device, got {x.dtype}/{x.device} and {w.dtype}/{w.device}")
    # the matching convolution (output padding past stride - 1 shortens its input: see transposed_shapes)
    y_shape, core, _s, pb, pa, _d, _g = transposed_shapes(tuple(xx.shape), tuple(w.shape), s, pd, op, d, groups)
    cout = y_shape[1]
    if bias is not None and tuple(bias.shape) != (cout,):
        raise ArgumentError(f"bias must have shape ({cout},), got {tuple(bias.shape)}")
    p = ConvProblem.from_torch(shape_only(core, xx), w, None, s, tuple(zip(pb, pa)), d, groups)
    if layout_of(xx) == "nhwc":
        p = p.with_(layout="nhwc")
    convt = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[nd]
    run = (lambda: convt(x, w, bias, s, pd, op, groups, d))
    desc = "transposed " + p.describe().replace(f"x({','.join(map(str, p.x_shape))})",
                                                 f"x({','.join(map(str, xx.shape))})", 1)
    if any(op):
        desc += " op" + ",".join(map(str, op))
    return _Call(xx, xx, w, bias, list(s), list(pd), list(d), True, list(op), groups, run, p, "backward_data", desc)


def _backward_call(c: _Call, direction: str) -> _Call:
    """``c`` (a forward call) turned into its ``direction`` gradient as autograd computes it:
    ``torch.ops.aten.convolution_backward`` for the input's (backward_data) or the weight's
    (backward_weights) gradient alone, on a seeded random gradient of the output (``c.dy``, in
    x's dtype, device and memory format)."""
    from ..core.problem import to_layout

    g = torch.Generator().manual_seed(1)
    dy = torch.randn(c.problem.y_shape, generator=g, dtype=torch.float64).to(c.x.dtype)
    dy = to_layout(dy, "nhwc" if layout_of(c.x) == "nhwc" else "nchw").to(c.x.device)
    data = direction == "backward_data"
    mask = [data, not data, False]
    op = torch.ops.aten.convolution_backward
    x, w = c.x, c.w
    args = (c.stride, c.padding, c.dilation, False, c.output_padding, c.groups, mask)

    def run():
        return op(dy, x, w, None, *args)[0 if data else 1]

    desc = f"{c.describe} ({direction}: aten.convolution_backward)"
    return dataclasses.replace(c, run=run, direction=direction, describe=desc, dy=dy)


def select_backend(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
                   padding: Any = 0, dilation: Any = 1, groups: int = 1, *, transposed: bool = False,
                   output_padding: Any = 0) -> str:
    """The backend torch selects for this call under the flags in force (e.g. ``"Mkldnn"``,
    ``"Slow2d"``, ``"Cudnn"``): ``torch._C._select_conv_backend``. Arguments as ``F.conv{1,2,3}d``
    (``transposed=True``: as ``F.conv_transpose{1,2,3}d``, ``w`` (C_in, C_out/groups, *k)).
    Raises :class:`ArgumentError` / :class:`ArgumentTypeError` for bad input."""
    return _select(_call_of(x, w, bias, stride, padding, dilation, groups, transposed, output_padding))[0]


def _select(c: _Call) -> tuple[str, int | None]:
    try:
        be = torch._C._select_conv_backend(c.x, c.w, c.b, c.stride, c.padding, c.dilation, c.transposed,
                                           c.output_padding, c.groups)
    except Exception as exc:  # noqa: BLE001  a private API: say so rather than fail
        return f"unknown ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})", None
    try:
        idx = int(be)
    except (TypeError, ValueError):
        idx = None
    return conv_backend_name(be), idx


# ============================================================================ the result
@dataclass(frozen=True)
class TorchChoice:
    """What torch runs for one convolution call (:func:`torch_choice`).

    ``backend``: ``torch._C._select_conv_backend``'s answer, by name (``"Mkldnn"``, ``"Slow2d"``,
    ``"Cudnn"``...; ``backend_index`` its enum value); ``device``; ``problem``: the call
    (:meth:`ConvProblem.describe`); ``flags``: :class:`TorchFlags` in force.

    CPU: ``onednn``: the primitives torch's oneDNN executed (:class:`OneDNNRun`: convolution,
    reorders), empty when torch did not go through oneDNN.

    CUDA: ``kernels``: the kernels torch's call launched (``torch.profiler``; launch order, each
    once); ``main_kernel``: the longest of them (GPU time); ``cudnn_functions`` and
    ``cudnn_engines`` / ``cudnn_algos``: from cuDNN's API log (:func:`parse_cudnn_log`);
    ``candidates``: each profiled rawconv candidate's kernels (:class:`CandidateKernels`).

    ``direction``: ``"forward"``, ``"backward_data"`` or ``"backward_weights"`` (what was asked
    of :func:`torch_choice`; the backward directions are torch's
    ``aten.convolution_backward`` for that gradient alone, and ``matches`` are rawconv's
    candidates of that direction).

    ``match``: how ``matches`` were found: ``"same kernels"``, ``"main kernel"`` (CUDA),
    ``"same name and layouts"``, ``"same name"`` (CPU: rawconv's oneDNN 3.2 list), ``"none"``
    (torch ran something no listed candidate runs), ``""`` (not looked for); ``matches``: the
    rawconv choices (names ``choice=`` takes), narrowed to the engine(s) cuDNN's log names when
    that leaves any (``"engine"`` is then added to ``match``). ``notes``: what could not be found.
    """

    backend: str
    device: str
    problem: str
    flags: TorchFlags
    backend_index: int | None = None
    onednn: tuple = ()
    kernels: tuple = ()
    main_kernel: str = ""
    cudnn_functions: tuple = ()
    cudnn_engines: tuple = ()
    cudnn_algos: tuple = ()
    candidates: tuple = ()
    match: str = ""
    matches: tuple = ()
    notes: tuple = ()
    direction: str = "forward"

    @property
    def maps_to_listed(self) -> bool:
        """torch's call maps to at least one rawconv candidate."""
        return bool(self.matches)

    @property
    def convolution(self) -> OneDNNRun | None:
        """The convolution primitive torch's oneDNN ran (CPU), else None."""
        return next((r for r in self.onednn if r.kind in ("convolution", "deconvolution")), None)

    def ran(self, width: int = 160) -> str:
        """What ran inside the backend, in a few words (kernel names cut to ``width`` characters)."""
        if self.device.startswith("cuda"):
            if not self.kernels:
                return "(no kernel seen)"
            main = self.main_kernel or self.kernels[0]
            more = len(_cudnn_set(self.kernels) - {main})
            return _short(main, width) + (f" (+{more} more)" if more else "")
        conv = self.convolution
        if conv is None:
            return "torch's own code" if self.backend not in ONEDNN_BACKENDS else "(no oneDNN primitive seen)"
        fm = conv.format_tags()
        reorders = sum(r.kind == "reorder" for r in self.onednn)
        others = len(self.onednn) - reorders - 1
        v = _torch_onednn_version()
        return (f"torch's oneDNN{' ' + v if v else ''}: oneDNN {conv.impl} "
                f"(src {fm.get('src') or '?'}, weights {fm.get('wei') or '?'})"
                + (f" + {reorders} reorder(s)" if reorders else "") + (f" + {others} other" if others else ""))

    def mapped(self) -> str:
        """The matched rawconv candidates, in a few words (on the CPU naming rawconv's oneDNN
        version: a same-named implementation of another version is different code)."""
        if not self.match:
            return ""
        if not self.matches:
            return "no listed config" if self.device.startswith("cuda") else "not in rawconv's list"
        shown = ", ".join(self.matches[:3]) + (f" (+{len(self.matches) - 3})" if len(self.matches) > 3 else "")
        if not self.device.startswith("cuda"):
            return f"{shown} ({self.match}, in rawconv's oneDNN {_rawconv_onednn_version()}: other code)"
        return f"{shown} ({self.match})"

    def __str__(self) -> str:
        s = ("" if self.direction == "forward" else f"{self.direction}: ") + f"{self.backend}: {self.ran()}"
        if self.cudnn_engines:
            s += f" [engine {', '.join(map(str, self.cudnn_engines))}]"
        m = self.mapped()
        if m:
            s += f" -> rawconv {m}"
        return s + f"  [{self.flags.summary(self.device)}]"

    def as_dict(self) -> dict:
        """JSON-friendly: every field (records as dicts, tuples as lists) plus ``summary`` (str)."""
        def conv(v):
            if dataclasses.is_dataclass(v):
                return {k: conv(x) for k, x in dataclasses.asdict(v).items()}
            if isinstance(v, (tuple, list)):
                return [conv(x) for x in v]
            if isinstance(v, float) and not math.isfinite(v):
                return None
            return v
        d = {f.name: conv(getattr(self, f.name)) for f in dataclasses.fields(self)}
        d["summary"] = str(self)
        return d


def torch_choice(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, *, transposed: bool = False,
                 output_padding: Any = 0, candidates: bool = True, limit: int = DEFAULT_LIMIT,
                 cudnn_log: bool = True, direction: str = "forward") -> TorchChoice:
    """What torch runs for ``F.conv{1,2,3}d(x, w, bias, stride, padding, dilation, groups)`` (or,
    with ``transposed=True``, ``F.conv_transpose{1,2,3}d(x, w, bias, stride, padding,
    output_padding, groups, dilation)``) under the torch flags in force (see :func:`torch_flags`).

    ``direction``: ``"forward"`` (that call), ``"backward_data"`` or ``"backward_weights"``
    (``"backward_filter"`` too): the gradient of that convolution's input or weight, as autograd
    computes it in ``loss.backward()``: ``torch.ops.aten.convolution_backward`` with only that
    output asked for, on a seeded random gradient of the output (torch selects the backend for
    the backward as for the forward). Transposed calls: forward only (a transposed
    convolution's forward is the backward_data of a convolution: ask for that instead).

    ``x``: (N, C, *spatial) or unbatched, ``w``: (K, C/groups, *kernel) (transposed: (C_in,
    C_out/groups, *kernel)), float tensors on the CPU or a CUDA device, any memory format.
    ``padding``: as torch (int, tuple, ``"same"``, ``"valid"``) or one ``(before, after)`` pair
    per dim (run by torch as ``F.pad`` then the convolution, as rawconv's ``compare`` does).

    Runs torch's call: on the CPU twice (a warm-up, then one under oneDNN's verbose trace); on
    CUDA twice (a warm-up, then one under ``torch.profiler``), both under cuDNN's API log when
    ``cudnn_log``; then, with ``candidates`` and a cuDNN backend, each rawconv cuDNN candidate
    (legacy rows, graph engine configs; at most ``limit`` of each) once to build it and once
    profiled, to map torch's kernels to candidates (cached per problem). On the CPU, with
    ``candidates``, the convolution torch's oneDNN ran is looked up by name in rawconv's oneDNN
    3.2 list. See the module docstring for what each route can and cannot tell. Under
    ``torch.no_grad()``.

    Returns :class:`TorchChoice`. Raises :class:`ArgumentError` / :class:`ArgumentTypeError` for
    bad input before anything runs; torch's own errors propagate. Calls
    ``torch._C._select_conv_backend``; on CUDA ``cudnnSetCallback`` and the cuDNN calls of
    :mod:`rawconv.cudnn` / :mod:`rawconv.cudnn_graph`.
    """
    if not isinstance(candidates, bool) or not isinstance(cudnn_log, bool):
        raise ArgumentTypeError("candidates and cudnn_log must be bools")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ArgumentError(f"limit must be a positive int, got {limit!r}")
    from ..core.backend import canonical_direction

    direction = canonical_direction(direction)
    if direction != "forward" and transposed is True:
        raise ArgumentError("direction applies to convolutions (transposed=False): a transposed convolution's "
                            "forward is the backward_data of the convolution with the same weight")
    c = _call_of(x, w, bias, stride, padding, dilation, groups, transposed, output_padding)
    if direction != "forward":
        c = _backward_call(c, direction)
    flags = TorchFlags.current()
    backend, index = _select(c)
    notes: list[str] = []
    with torch.no_grad():
        if c.x.device.type == "cuda":
            with torch.cuda.device(c.x.device):   # separators, synchronize: on the tensors' GPU
                return _cuda_choice(c, flags, backend, index, candidates, limit, cudnn_log, notes)
        c.run()
        runs = tuple(torch_onednn_trace(c.run, records=True))
    match, matches = "", ()
    conv = next((r for r in runs if r.kind in ("convolution", "deconvolution")), None)
    if conv is not None and candidates:
        match, matches, note = _onednn_matches(c, conv)
        if note:
            notes.append(note)
    if backend in ONEDNN_BACKENDS and conv is None:
        notes.append("torch selected oneDNN but its verbose trace showed no convolution")
    return TorchChoice(backend, c.device, c.describe, flags, index, onednn=runs, match=match, matches=matches,
                       notes=tuple(notes), direction=direction)


def _cuda_choice(c: _Call, flags, backend, index, candidates, limit, cudnn_log, notes) -> TorchChoice:
    # warm-up: builds torch's plan (with cudnn.benchmark, times candidates); its log is not kept
    c.run()
    torch.cuda.synchronize()
    lg = _cuda.cudnn_api_log() if cudnn_log else None

    def profiled():
        with (lg if lg is not None else contextlib.nullcontext()):
            c.run()

    prof = _profile_each([profiled])
    ks = prof[0] if prof else []
    kernels = _unique(n for n, _ in ks)
    dur: dict[str, float] = {}
    for n, t in ks:
        dur[n] = dur.get(n, 0.0) + t
    cud = [n for n in kernels if not _is_helper(n)]
    main = max(cud, key=lambda n: dur[n]) if cud else ""
    parsed = {"functions": (), "engines": (), "algos": ()}
    if lg is not None:
        if lg.available:
            parsed = parse_cudnn_log(lg.messages)
            if not parsed["functions"]:
                notes.append("cuDNN's API log saw no cuDNN call in the profiled call")
        else:
            notes.append(f"cuDNN's API log unavailable: {lg.error}")
    if not kernels:
        notes.append("the profiler saw no CUDA kernel")
    match, matches, cands = "", (), ()
    if candidates and backend in CUDNN_BACKENDS and cud:
        try:
            cands = _candidate_kernels(c, limit, bool(flags.cudnn_conv_tf32))
        except RawconvError as exc:
            notes.append(f"rawconv candidates: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        if cands and not any(not k.error for k in cands):
            notes.append("no rawconv candidate ran: " + "; ".join(f"{k.backend} {k.choice}: {k.error}"
                                                                 for k in cands[:3]))
        else:
            match, matches = match_kernels(kernels, cands, main_kernel=main)
            matches, match = _narrow(matches, match, cands, parsed)
    return TorchChoice(backend, c.device, c.describe, flags, index, kernels=kernels, main_kernel=main,
                       cudnn_functions=tuple(parsed["functions"]), cudnn_engines=tuple(parsed["engines"]),
                       cudnn_algos=tuple(parsed["algos"]), candidates=cands, match=match, matches=matches,
                       notes=tuple(notes), direction="forward" if c.transposed else c.direction)


def _narrow(matches: tuple, match: str, cands: Sequence[CandidateKernels], parsed: dict) -> tuple[tuple, str]:
    """Keep the kernel matches cuDNN's log agrees with (graph: the engine torch executed; legacy:
    the algo torch passed), when that leaves any."""
    if not matches:
        return matches, match
    if parsed.get("engines"):
        by_engine = {ck.choice: ck.engine for ck in cands}
        narrowed = tuple(m for m in matches if by_engine.get(m) in parsed["engines"])
        if narrowed:
            return narrowed, match + ", engine"
    if parsed.get("algos"):
        narrowed = tuple(m for m in matches if "@" in m and m.split("@")[0] in parsed["algos"])
        if narrowed:
            return narrowed, match + ", algo"
    return matches, match


def compare_detail(problem: ConvProblem, x, w, b, *, limit: int = 16, direction: str = "forward") -> str:
    """For ``compare``'s torch rows on CUDA: ``"; torch ran <kernel> = rawconv <choices>"`` ('' when
    nothing could be found; never raises)."""
    try:
        pad = list(zip(problem.pad_before, problem.pad_after))
        ch = torch_choice(x, w, b, problem.stride, pad, problem.dilation, problem.groups, limit=limit,
                          direction=direction)
    except Exception:  # noqa: BLE001  a bonus: never fail the comparison for it
        return ""
    if not ch.kernels:
        return ""
    out = f"; torch ran {ch.ran()}"
    if ch.cudnn_engines:
        out += f" [engine {', '.join(map(str, ch.cudnn_engines))}]"
    m = ch.mapped()
    return out + (f" = rawconv {m}" if m else "")


# ============================================================================ the report
def report(problems: Sequence[ConvProblem], *, device: str | None = None, limit: int = DEFAULT_LIMIT,
           candidates: bool = True, out=None, seed: int = 0,
           direction: str = "forward") -> list[tuple[ConvProblem, TorchChoice | None, str]]:
    """:func:`torch_choice` (of ``direction``) for each problem (random inputs of its shapes, dtype
    and layout on ``device``), printed to ``out`` (default stdout) as one block per layer (with the
    seconds it took) as soon as it is done, and a final count.
    Returns ``[(problem, choice or None, error), ...]``."""
    out = out or sys.stdout
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    flags = TorchFlags.current()
    print(_header(dev, flags) + ("" if direction == "forward" else f"; direction {direction}"), file=out,
          flush=True)
    rows = []
    width = len(str(len(problems)))
    for i, p in enumerate(problems, 1):
        x, w, b = p.make_inputs(device=dev, seed=seed)
        t0 = time.perf_counter()
        try:
            ch = torch_choice(x, w, b, p.stride, list(zip(p.pad_before, p.pad_after)), p.dilation, p.groups,
                              candidates=candidates, limit=limit, direction=direction)
            err = ""
        except (RawconvError, RuntimeError) as exc:
            ch, err = None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        rows.append((p, ch, err))
        pad = " " * (2 * width + 4)
        print(f"[{i:>{width}}/{len(problems)}] {p.name or '-'}  {p.describe()}  ({time.perf_counter() - t0:.1f} s)",
              file=out)
        if ch is None:
            print(f"{pad}failed: {err}", file=out, flush=True)
            continue
        print(f"{pad}torch: {ch.backend}; " + ("kernel " if dev.startswith("cuda") else "") + ch.ran()
              + (f"; cuDNN log: engine {', '.join(map(str, ch.cudnn_engines))}" if ch.cudnn_engines else "")
              + (f"; cuDNN log: {', '.join(ch.cudnn_algos)}" if ch.cudnn_algos else ""), file=out)
        if ch.match:
            what = "rawconv candidate(s)" if dev.startswith("cuda") else "rawconv oneDNN 3.2"
            profiled = sum(1 for k in ch.candidates if not k.error)
            extra = f" [{profiled} candidates profiled]" if dev.startswith("cuda") else ""
            print(f"{pad}{what}: {ch.mapped()}{extra}", file=out)
        for n in ch.notes:
            print(f"{pad}note: {n}", file=out)
        out.flush()
    print(_final_count(rows, dev), file=out, flush=True)
    return rows


def _header(dev: str, flags: TorchFlags) -> str:
    bits = [f"torch {torch.__version__}"]
    if dev.startswith("cuda"):
        try:
            bits.append(f"cuDNN {torch.backends.cudnn.version()}")
            bits.append(torch.cuda.get_device_name(torch.device(dev)))
        except Exception:  # noqa: BLE001
            pass
    else:
        try:
            v = torch_part().get("onednn_bundled")
            if v:
                bits.append(f"torch's oneDNN {v}")
        except Exception:  # noqa: BLE001
            pass
        bits.append(_cpu_name())
    return "torch's choice, " + ", ".join(b for b in bits if b) + f"; flags: {flags.summary(dev)}"


def _cpu_name() -> str:
    from rawconv.onednn import cpu_model

    return cpu_model()


def _final_count(rows, dev: str) -> str:
    done = [ch for _, ch, _ in rows if ch is not None]
    m = len(rows)
    if dev.startswith("cuda"):
        n = sum(ch.maps_to_listed for ch in done)
        same = sum(ch.match.startswith("same kernels") for ch in done)
        main = sum(ch.match.startswith("main kernel") for ch in done)
        return (f"{n} of {m} layers: torch's kernel maps to a listed config ({same} with the same kernel set, "
                f"{main} by its main kernel); {sum(ch.backend in CUDNN_BACKENDS for ch in done)} ran on cuDNN")
    onednn = sum(ch.convolution is not None for ch in done)
    n = sum(ch.maps_to_listed for ch in done)
    same = sum(ch.match == "same name and layouts" for ch in done)
    return (f"{onednn} of {m} layers: torch ran its oneDNN; {n} of {m}: torch's oneDNN implementation is in "
            f"rawconv's oneDNN list ({same} with the same layouts)")

def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rawconv.torch_choice --report resnet50 [--batch N] [--dtype D] [--layout L]
    [--device cpu|cuda] [--limit N] [--no-candidates] [--threads N] [--benchmark] [--json FILE]``."""
    import argparse
    import json

    from ..core import presets

    ap = argparse.ArgumentParser(prog="python -m rawconv.torch_choice",
                                 description="What torch runs for each convolution of a preset network: the "
                                             "backend, torch's oneDNN implementation (CPU) or cuDNN kernel (CUDA), "
                                             "and the rawconv candidate it maps to.")
    ap.add_argument("--report", required=True, choices=sorted(presets.PRESETS), help="preset network")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--layout", default="nchw", choices=["nchw", "nhwc"])
    ap.add_argument("--device", default=None, help="cpu or cuda[:i] (default: cuda when torch sees one)")
    ap.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                    help=f"rawconv candidates profiled per cuDNN API (legacy, graph) (default {DEFAULT_LIMIT})")
    ap.add_argument("--no-candidates", action="store_true", help="do not look for matching rawconv candidates")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for the run (torch_flags)")
    ap.add_argument("--benchmark", action="store_true", help="torch.backends.cudnn.benchmark=True for the run")
    ap.add_argument("--json", default=None, help="write the results as JSON to this file")
    ap.add_argument("--direction", default="forward",
                    choices=["forward", "backward_data", "backward_weights", "backward_filter"],
                    help="forward (default), or the gradient of the input (backward_data) or of the weight "
                         "(backward_weights), as autograd computes it (aten.convolution_backward)")
    a = ap.parse_args(argv)
    if a.batch < 1 or a.limit < 1 or (a.threads is not None and a.threads < 1):
        ap.error("--batch, --limit and --threads must be positive")
    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dev.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")
    problems = presets.get(a.report, a.batch, dtype=a.dtype, layout=a.layout)
    with torch_flags(threads=a.threads, benchmark=True if a.benchmark else None):
        rows = report(problems, device=dev, limit=a.limit, candidates=not a.no_candidates, direction=a.direction)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"preset": a.report, "batch": a.batch, "dtype": a.dtype, "layout": a.layout, "device": dev,
                       "direction": a.direction,
                       "summary": _final_count(rows, dev),
                       "layers": [{"name": p.name, "problem": p.describe(), "error": err,
                                   "choice": ch.as_dict() if ch is not None else None} for p, ch, err in rows]},
                      f, indent=1)
    return 0 if all(ch is not None for _, ch, _ in rows) else 1


class _CallableModule(types.ModuleType):
    """``rawconv.torch_choice`` is this module; calling it calls :func:`torch_choice`."""

    def __call__(self, *args, **kwargs) -> TorchChoice:
        return torch_choice(*args, **kwargs)


for _cls in (TorchFlags, OneDNNRun, CandidateKernels):   # (pickles and the reference name them here, as before)
    _cls.__module__ = "rawconv.pytorch.torch_choice"

if __name__ != "__main__":
    sys.modules[__name__].__class__ = _CallableModule
    # name -> the part that reads it: a hook set on this module (a test's ``monkeypatch.setattr(tc,
    # "_profile_calls", f)``) is set there, where the part's code reads it
    _SETTINGS = {"_profile_calls": _cuda, "cudnn_api_log": _cuda}
    _route_settings(__name__, _SETTINGS)   # (after the class above: the routed type derives from it)

if __name__ == "__main__":
    sys.exit(main())
