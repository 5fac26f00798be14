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
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import re
import sys
import threading
import time
import types
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.nn.functional as F

from ..core import guard as _guard, plans as _plans
from ..core.errors import ArgumentError, ArgumentTypeError, NotSupportedError, RawconvError
from ..core.problem import ConvProblem, layout_of, shape_only, transposed_shapes, tuple_arg

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

#: fp32 precisions torch's newer API takes for convolutions (``torch.backends.<b>.conv.fp32_precision``)
CUDNN_FP32_PRECISIONS = ("ieee", "tf32", "none")
MKLDNN_FP32_PRECISIONS = ("ieee", "tf32", "bf16", "none")

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


# ============================================================================ flags
def _C(name):
    return getattr(torch._C, name, None)


def _has_fp32_api() -> bool:
    return _C("_get_fp32_precision_getter") is not None and _C("_set_fp32_precision_setter") is not None


def _precision(backend: str, op: str) -> str | None:
    if not _has_fp32_api():
        return None
    try:
        return str(torch._C._get_fp32_precision_getter(backend, op))
    except Exception:  # noqa: BLE001  a private getter: an unknown (backend, op) pair, or changed
        return None


def _legacy_cudnn_tf32() -> bool | None:
    try:
        return bool(torch._C._get_cudnn_allow_tf32())
    except RuntimeError:   # torch refuses when conv and RNN TF32 were set apart through the new API
        return None


def _get_bool(name: str) -> bool | None:
    f = _C(name)
    if f is None:
        return None
    try:
        return bool(f())
    except RuntimeError:
        return None


@dataclass(frozen=True)
class TorchFlags:
    """torch's convolution flags at one moment (:meth:`current`).

    ``mkldnn_enabled`` (``torch.backends.mkldnn.enabled``), ``mkldnn_deterministic``,
    ``mkldnn_conv_fp32_precision`` (``torch.backends.mkldnn.conv.fp32_precision``: ``"none"`` =
    float32, ``"bf16"``, ``"tf32"``, ``"ieee"``; None where this torch lacks that API),
    ``cudnn_enabled``, ``cudnn_benchmark``, ``cudnn_deterministic``, ``cudnn_allow_tf32`` (the
    legacy flag; None when torch refuses to answer because conv and RNN were set apart through
    the new API), ``cudnn_conv_fp32_precision`` (``torch.backends.cudnn.conv.fp32_precision``:
    ``"tf32"``, ``"ieee"``, ``"none"`` = inherit), ``cudnn_conv_tf32`` (whether cuDNN
    convolutions may run float32 on TF32 tensor cores, resolved as torch does: the conv setting,
    else cuDNN's ``"all"``, else the generic one; the legacy flag on a torch without the new API),
    ``threads`` (``torch.get_num_threads()``), ``interop_threads``.
    """

    mkldnn_enabled: bool
    mkldnn_deterministic: bool | None
    mkldnn_conv_fp32_precision: str | None
    cudnn_enabled: bool
    cudnn_benchmark: bool
    cudnn_deterministic: bool
    cudnn_allow_tf32: bool | None
    cudnn_conv_fp32_precision: str | None
    cudnn_conv_tf32: bool | None
    threads: int
    interop_threads: int

    @classmethod
    def current(cls) -> "TorchFlags":
        """The flags in force now (reads torch's getters; changes nothing)."""
        conv = _precision("cuda", "conv")
        if conv is not None:
            eff = next((p for p in (conv, _precision("cuda", "all"), _precision("generic", "all"))
                        if p not in (None, "none")), "none")
            tf32 = eff == "tf32"
        else:
            tf32 = _legacy_cudnn_tf32()
        return cls(mkldnn_enabled=bool(torch.backends.mkldnn.enabled),
                   mkldnn_deterministic=_get_bool("_get_mkldnn_deterministic"),
                   mkldnn_conv_fp32_precision=_precision("mkldnn", "conv"),
                   cudnn_enabled=bool(torch._C._get_cudnn_enabled()),
                   cudnn_benchmark=bool(torch._C._get_cudnn_benchmark()),
                   cudnn_deterministic=bool(torch._C._get_cudnn_deterministic()),
                   cudnn_allow_tf32=_legacy_cudnn_tf32(),
                   cudnn_conv_fp32_precision=conv,
                   cudnn_conv_tf32=tf32,
                   threads=int(torch.get_num_threads()),
                   interop_threads=int(torch.get_num_interop_threads()))

    def summary(self, device: str = "") -> str:
        """A short line; ``device`` ``"cpu"`` or ``"cuda"`` keeps the flags that matter there."""
        on = {True: "on", False: "off", None: "?"}
        cpu = [f"mkldnn {on[self.mkldnn_enabled]}"]
        if self.mkldnn_conv_fp32_precision not in (None, "none"):
            cpu.append(f"mkldnn conv fp32 {self.mkldnn_conv_fp32_precision}")
        if self.mkldnn_deterministic:
            cpu.append("mkldnn deterministic")
        cpu.append(f"{self.threads} thread{'s' if self.threads != 1 else ''}")
        if device.startswith("cpu") and self.cudnn_benchmark:
            cpu.append("cudnn benchmark on: no effect on a CPU call")
        gpu = [f"cudnn {on[self.cudnn_enabled]}", f"benchmark {on[self.cudnn_benchmark]}",
               f"deterministic {on[self.cudnn_deterministic]}", f"conv tf32 {on[self.cudnn_conv_tf32]}"]
        if device.startswith("cpu"):
            return ", ".join(cpu)
        if device.startswith("cuda"):
            return ", ".join(gpu)
        return ", ".join(cpu + gpu)

    def __str__(self) -> str:
        return self.summary()

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _check_opt_bool(value, name: str):
    if value is not None and not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be True, False or None (leave as is), got {value!r}")


def _check_precision(value, name: str, allowed: Sequence[str], where: str):
    if value is None:
        return
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be a str among {list(allowed)} or None, got {type(value).__name__}")
    if value not in allowed:
        raise ArgumentError(f"{name} must be one of {list(allowed)}, got {value!r}")
    if not _has_fp32_api():
        raise NotSupportedError(f"torch {torch.__version__} has no {where}.fp32_precision API "
                                f"(torch 2.9 and newer); use allow_tf32 instead")


@_guard.public(where="rawconv.torch_flags")
@contextlib.contextmanager
def torch_flags(*, mkldnn: bool | None = None, cudnn: bool | None = None, benchmark: bool | None = None,
                deterministic: bool | None = None, allow_tf32: bool | None = None,
                cudnn_fp32_precision: str | None = None, mkldnn_fp32_precision: str | None = None,
                threads: int | None = None):
    """Set torch's convolution flags for a ``with`` block; restore exactly what was there on exit,
    also when the block raises. ``None`` (the default) leaves a flag as it is. Yields the
    :class:`TorchFlags` in force inside the block. Nests.

    * ``mkldnn``: ``torch.backends.mkldnn.enabled`` (False: torch's own CPU code, e.g. ``Slow2d``);
    * ``cudnn``: ``torch.backends.cudnn.enabled`` (False: torch's own CUDA kernels);
    * ``benchmark``: ``torch.backends.cudnn.benchmark`` (time cuDNN's candidates on the first call
      of each shape and keep the fastest);
    * ``deterministic``: ``torch.backends.cudnn.deterministic`` and, where torch has it,
      ``torch.backends.mkldnn.deterministic``;
    * ``allow_tf32``: ``torch.backends.cudnn.allow_tf32`` (the legacy flag: cuDNN convolutions and
      RNNs alike);
    * ``cudnn_fp32_precision``: ``torch.backends.cudnn.conv.fp32_precision`` (``"ieee"``,
      ``"tf32"``, ``"none"`` = inherit), convolutions only; applied after ``allow_tf32``, so it
      wins for convolutions;
    * ``mkldnn_fp32_precision``: ``torch.backends.mkldnn.conv.fp32_precision`` (``"ieee"`` /
      ``"none"``: float32, ``"bf16"``: oneDNN may round float32 inputs to bfloat16, ``"tf32"``);
    * ``threads``: ``torch.set_num_threads`` (a positive int). torch's CPU backend choice depends
      on it: ``Conv1d(64, 64, 1)`` on ``(8, 64, 64)`` runs on ``Mkldnn`` with 2 threads and on
      ``Slow2d`` with 1 (torch 2.13-2.14).

    The two ``*_fp32_precision`` arguments need torch's newer precision API (torch 2.9 and newer:
    ``NotSupportedError`` otherwise). Raises :class:`ArgumentTypeError` / :class:`ArgumentError`
    for bad values before anything changes. Not thread-safe: torch's flags are process-wide
    (``threads`` is per thread in torch), so other threads see the block's flags while it runs.
    Sets through ``torch._C`` (as ``torch.backends.*.flags`` do), so it works under
    ``torch.backends.disable_global_flags()`` too.

    The cuDNN flags (``cudnn``, ``benchmark``, ``allow_tf32``, ``cudnn_fp32_precision``) change
    only CUDA convolutions: set where torch sees no GPU, a ``UserWarning`` says they change nothing
    here; :func:`torch_choice` of a CPU call names them as not applying. A misspelt flag
    (``cudnn_benchmark=``) raises :class:`ArgumentTypeError` naming the flag it may mean and every flag.
    """
    _check_torch_flags(mkldnn, cudnn, benchmark, deterministic, allow_tf32, cudnn_fp32_precision,
                       mkldnn_fp32_precision, threads)
    cuda_only = [n for n, v in (("cudnn", cudnn), ("benchmark", benchmark), ("allow_tf32", allow_tf32),
                                ("cudnn_fp32_precision", cudnn_fp32_precision)) if v is not None]
    if cuda_only and not torch.cuda.is_available():
        warnings.warn(f"rawconv.torch_flags({', '.join(f'{n}=...' for n in cuda_only)}): "
                      f"{'these set' if len(cuda_only) > 1 else 'this sets'} torch.backends.cudnn, which only CUDA "
                      "convolutions read, and torch sees no GPU here: nothing changes for CPU work (the CPU's flags: "
                      "mkldnn=, mkldnn_fp32_precision=, deterministic=, threads=)", UserWarning, stacklevel=3)
    undo: list[Callable[[], None]] = []
    try:
        flags = _set_torch_flags(undo, mkldnn, cudnn, benchmark, deterministic, allow_tf32, cudnn_fp32_precision,
                                 mkldnn_fp32_precision, threads)
    except BaseException:
        _undo(undo)
        raise
    try:
        yield flags
    finally:
        _undo(undo)


def _check_torch_flags(mkldnn, cudnn, benchmark, deterministic, allow_tf32, cudnn_fp32_precision,
                       mkldnn_fp32_precision, threads) -> None:
    """Check :func:`torch_flags`'s arguments before anything changes. Returns None; raises
    :class:`ArgumentTypeError` / :class:`ArgumentError` on the first bad one, and
    :class:`NotSupportedError` for a ``*_fp32_precision`` torch has no API for."""
    for v, n in ((mkldnn, "mkldnn"), (cudnn, "cudnn"), (benchmark, "benchmark"), (deterministic, "deterministic"),
                 (allow_tf32, "allow_tf32")):
        _check_opt_bool(v, n)
    _check_precision(cudnn_fp32_precision, "cudnn_fp32_precision", CUDNN_FP32_PRECISIONS, "torch.backends.cudnn.conv")
    _check_precision(mkldnn_fp32_precision, "mkldnn_fp32_precision", MKLDNN_FP32_PRECISIONS,
                     "torch.backends.mkldnn.conv")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ArgumentError(f"threads must be a positive int or None, got {threads!r}")


def _change(undo: list, get, set_, value) -> None:
    """Set one torch flag through ``set_`` to ``value``, appending to ``undo`` what puts back the
    value ``get`` read first. Returns None."""
    old = get()
    set_(value)
    undo.append(lambda: set_(old))


def _change_precision(undo: list, backend: str, op: str, value: str) -> None:
    """Set torch's fp32 precision of ``backend``'s ``op`` to ``value`` (the newer precision API),
    appending to ``undo`` what puts back the old one. Returns None."""
    C = torch._C
    old = C._get_fp32_precision_getter(backend, op)
    C._set_fp32_precision_setter(backend, op, value)
    undo.append(lambda: C._set_fp32_precision_setter(backend, op, old))


def _change_allow_tf32(undo: list, allow_tf32: bool) -> None:
    """Set ``torch.backends.cudnn.allow_tf32`` (the legacy flag), appending to ``undo`` what puts
    back the legacy flag and, with torch's newer precision API, cuDNN's conv and RNN precisions.
    Returns None."""
    C = torch._C
    if _has_fp32_api():
        # the legacy setter writes a legacy flag and cuDNN's conv and RNN precisions; torch's
        # legacy getter then refuses to answer if the new API alone puts the precisions back
        # (it compares them with the legacy flag): undo through the legacy setter, then fix
        # any precision that still differs through the new API
        old_legacy = _legacy_cudnn_tf32()
        olds = [(op, C._get_fp32_precision_getter("cuda", op)) for op in ("conv", "rnn")]
        C._set_cudnn_allow_tf32(allow_tf32)

        def put_back(old_legacy=old_legacy, olds=olds):
            if old_legacy is not None:
                C._set_cudnn_allow_tf32(old_legacy)
            for op, v in olds:
                if C._get_fp32_precision_getter("cuda", op) != v:
                    C._set_fp32_precision_setter("cuda", op, v)
        undo.append(put_back)
    else:
        _change(undo, C._get_cudnn_allow_tf32, C._set_cudnn_allow_tf32, allow_tf32)


def _set_torch_flags(undo: list, mkldnn, cudnn, benchmark, deterministic, allow_tf32, cudnn_fp32_precision,
                     mkldnn_fp32_precision, threads) -> TorchFlags:
    """Set :func:`torch_flags`'s flags that are not None, in order, appending to ``undo`` what
    puts each back (the caller undoes them, also when this raises). Returns the
    :class:`TorchFlags` then in force."""
    C = torch._C
    if mkldnn is not None:
        _change(undo, C._get_mkldnn_enabled, C._set_mkldnn_enabled, mkldnn)
    if cudnn is not None:
        _change(undo, C._get_cudnn_enabled, C._set_cudnn_enabled, cudnn)
    if benchmark is not None:
        _change(undo, C._get_cudnn_benchmark, C._set_cudnn_benchmark, benchmark)
    if deterministic is not None:
        _change(undo, C._get_cudnn_deterministic, C._set_cudnn_deterministic, deterministic)
        if _C("_get_mkldnn_deterministic") is not None and _C("_set_mkldnn_deterministic") is not None:
            _change(undo, C._get_mkldnn_deterministic, C._set_mkldnn_deterministic, deterministic)
    if allow_tf32 is not None:
        _change_allow_tf32(undo, allow_tf32)
    if cudnn_fp32_precision is not None:
        _change_precision(undo, "cuda", "conv", cudnn_fp32_precision)
    if mkldnn_fp32_precision is not None:
        _change_precision(undo, "mkldnn", "conv", mkldnn_fp32_precision)
    if threads is not None:
        _change(undo, torch.get_num_threads, torch.set_num_threads, threads)
    return TorchFlags.current()


def _undo(undo: list) -> None:
    errors = []
    for fn in reversed(undo):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001  restore the rest, then say what failed
            errors.append(exc)
    undo.clear()
    if errors:
        raise RawconvError(f"torch_flags could not restore every flag: {errors}")


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


# ============================================================================ CPU: torch's oneDNN trace
_trace_lock = threading.RLock()


@dataclass(frozen=True)
class OneDNNRun:
    """One primitive torch's bundled oneDNN executed (a line of its verbose trace).

    ``kind``: ``"convolution"``, ``"deconvolution"``, ``"reorder"``...; ``impl``: oneDNN's
    implementation name (``"jit:avx512_core"``); ``prop_kind``: ``"forward_training"``...;
    ``formats``: the memory descriptors as oneDNN prints them; ``attrs``, ``alg``, ``shape``:
    the following fields (``"alg:convolution_direct"``, ``"mb1_ic64oc64_ih56oh56kh3..."``);
    ``time_ms``: oneDNN's own time for the call (ms)."""

    kind: str
    impl: str
    prop_kind: str = ""
    formats: str = ""
    attrs: str = ""
    alg: str = ""
    shape: str = ""
    time_ms: float | None = None

    def format_tags(self) -> dict:
        """``{"src": "aBcd16b", "wei": "ABcd16b16a", "dst": ...}`` (memory format tags; '' when undefined)."""
        return _format_tags(self.formats)

    def __str__(self) -> str:
        fm = self.format_tags()
        bits = [f"{r} {fm[r]}" for r in ("src", "wei", "dst") if fm.get(r)]
        return f"{self.kind} {self.impl}" + (f" ({', '.join(bits)})" if bits else "")


def _format_tags(formats: str) -> dict:
    out = {}
    for item in formats.split():
        fields = item.split(":")
        if len(fields) < 2:
            continue
        role = fields[0]
        if "_" in role and role.split("_")[0] in ("src", "wei", "dst", "bia", "diff"):  # oneDNN 3.2: src_f32::...
            role = role.split("_")[0]
        tag = ""
        if "blocked" in fields:
            i = fields.index("blocked")
            tag = fields[i + 1] if i + 1 < len(fields) else ""
        out[role] = tag
    return out


def parse_onednn_verbose(text: str) -> list[OneDNNRun]:
    """The ``exec`` lines of oneDNN's verbose output (3.2's ``onednn_verbose,exec,cpu,...`` and
    3.12's ``onednn_verbose,v1,primitive,exec,cpu,...``) as :class:`OneDNNRun` records."""
    out = []
    for line in text.splitlines():
        if not line.startswith("onednn_verbose"):
            continue
        parts = line.strip().split(",")
        if "exec" not in parts:
            continue
        i = parts.index("exec")
        if len(parts) <= i + 3:
            continue
        g = (lambda k: parts[i + k] if len(parts) > i + k else "")
        try:
            t = float(parts[-1]) if len(parts) > i + 5 else None
        except ValueError:
            t = None
        out.append(OneDNNRun(kind=g(2), impl=g(3), prop_kind=g(4), formats=g(5), attrs=g(6), alg=g(7),
                             shape=g(8), time_ms=t))
    return out


def _capture_fd1(fn: Callable[[], Any]) -> tuple[Any, str]:
    """Run ``fn`` with file descriptor 1 (C's stdout) pointed at a temporary file; return its
    result and what was written. Python's and C's buffers are flushed before and after; fd 1 is
    restored (also when ``fn`` raises, and when it was closed). Serialized by a lock."""
    import ctypes
    import tempfile

    try:
        libc = ctypes.CDLL(None)
        fflush = libc.fflush
    except (OSError, AttributeError):  # pragma: no cover - no libc symbols
        fflush = None

    def flush_all():
        for s in (sys.stdout, sys.__stdout__):
            try:
                if s is not None:
                    s.flush()
            except (ValueError, OSError):
                pass
        if fflush is not None:
            fflush(None)

    with _trace_lock:
        flush_all()
        closed = False
        try:
            saved = os.dup(1)
        except OSError:
            # fd 1 was closed: hold it with /dev/null while we work (so the temporary file does not
            # get fd 1 itself), close it again afterwards
            closed = True
            fd = os.open(os.devnull, os.O_WRONLY)
            if fd != 1:
                os.dup2(fd, 1)
                os.close(fd)
            saved = os.dup(1)
        try:
            with tempfile.TemporaryFile(mode="w+b") as tmp:
                os.dup2(tmp.fileno(), 1)
                try:
                    result = fn()
                finally:
                    try:
                        if fflush is not None:
                            fflush(None)
                    finally:
                        os.dup2(saved, 1)
                tmp.seek(0)
                text = tmp.read().decode(errors="replace")
        finally:
            os.close(saved)
            if closed:
                os.close(1)
    return result, text


def torch_onednn_trace(fn: Callable[[], object], *, records: bool = False) -> list:
    """What torch's own (bundled) oneDNN executes for one call of ``fn``.

    Runs ``fn`` once under ``torch.backends.mkldnn.verbose(VERBOSE_ON)`` with the C stdout (file
    descriptor 1) redirected to a temporary file (:func:`_capture_fd1`: flushed, restored on
    error, serialized by a lock; output of other threads in that window is captured too, and
    lines that are not oneDNN's are written back to stdout). Returns one dict per primitive
    (``kind``: "convolution" / "reorder"..., ``impl``: e.g. "jit:avx512_core", ``formats``: the
    memory descriptors as oneDNN prints them, and ``prop_kind``, ``attrs``, ``alg``, ``shape``,
    ``time_ms``), or with ``records`` :class:`OneDNNRun` records. ``[]`` when torch's path did not
    go through oneDNN or this torch cannot turn its oneDNN's verbose mode on. ``fn``'s exceptions
    propagate (after fd 1 is restored)."""
    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ctx = torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON)
                ctx.__enter__()
            except (AssertionError, RuntimeError, AttributeError):
                ctx = None
        try:
            fn()
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
        return ctx is not None

    ok, text = _capture_fd1(run)
    other = [ln for ln in text.splitlines(keepends=True) if not ln.startswith("onednn_verbose")]
    if other:
        try:
            sys.stdout.write("".join(other))
        except (ValueError, OSError):  # pragma: no cover
            pass
    runs = parse_onednn_verbose(text) if ok else []
    if records:
        return runs
    return [dataclasses.asdict(r) for r in runs]


def trace_detail(trace: list) -> str:
    """``"; torch's oneDNN ran jit:avx512_core (src aBcd16b, weights ABcd16b16a) + 3 reorder(s)"``
    for a :func:`torch_onednn_trace` result ('' when no convolution ran)."""
    runs = [r if isinstance(r, OneDNNRun) else OneDNNRun(**r) for r in trace]
    convs = [r for r in runs if r.kind in ("convolution", "deconvolution")]
    if not convs:
        return ""
    fm = convs[0].format_tags()
    reorders = sum(r.kind == "reorder" for r in runs)
    return (f"; torch's oneDNN ran {convs[0].impl} (src {fm.get('src') or '?'}, weights {fm.get('wei') or '?'})"
            f" + {reorders} reorder(s)")


# torch's oneDNN (3.x newer) renamed some implementations rawconv's oneDNN 3.2 lists (a newer build
# loaded through RAWCONV_DNNL_LIBRARY has the new names: both sides are compared normalized)
_ONEDNN_RENAMES = (("brg_conv_fwd", "brgconv"), ("brg_conv_bwd_d", "brgconv_bwd_d"),
                   ("brg_conv_bwd_w", "brgconv_bwd_w"), ("brg_deconv", "brgdeconv"))


@functools.lru_cache(maxsize=1)
def _torch_onednn_version() -> str:
    """The oneDNN version bundled in torch ("3.12.0"; '' when torch does not say)."""
    try:
        v = torch_part().get("onednn_bundled")
        return v.split()[0] if v else ""
    except Exception:  # noqa: BLE001 - a label
        return ""


def _rawconv_onednn_version() -> str:
    try:
        from .. import onednn

        return onednn.library_version()
    except Exception:  # noqa: BLE001 - a label
        return "?"


def _normalize_impl(name: str) -> str:
    for new, old in _ONEDNN_RENAMES:
        if name.startswith(new):
            return old + name[len(new):]
    return name


#: per direction, rawconv's roles for the memory descriptors torch's oneDNN trace names src and wei
#: (its backward primitives print the gradients under the forward names: diff_src as src...)
_TRACE_ROLES = {"forward": ("x", "w"), "backward_data": ("dx", "w"), "backward_weights": ("x", "dw")}


def _onednn_matches(c: _Call, conv: OneDNNRun) -> tuple[str, tuple[str, ...], str]:
    """rawconv oneDNN 3.2 implementations (of the call's direction) with the name torch's oneDNN
    ran: (match, choices, note)."""
    if c.transposed:
        return "", (), "transposed: not matched against rawconv's oneDNN list"
    try:
        from .. import onednn

        p = c.problem
        if c.direction == "forward":
            plan = onednn.Convolution(c.xb, c.w, None, p.stride, list(zip(p.pad_before, p.pad_after)), p.dilation,
                                      p.groups)
        else:
            plan = onednn.Convolution.from_problem(p.with_(layout="nhwc" if layout_of(c.x) == "nhwc" else p.layout),
                                                   direction=c.direction, w_layout=onednn.weights_layout(c.w))
        impls = plan.implementations
    except RawconvError as exc:
        return "", (), f"rawconv's oneDNN: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    want = _normalize_impl(conv.impl)
    fm = conv.format_tags()
    src_role, wei_role = _TRACE_ROLES[c.direction]
    same, name_only = [], []
    for im in impls:
        if _normalize_impl(im.name) != want:   # (rawconv's oneDNN may be a newer build, with the new names too)
            continue
        choice = getattr(im, "choice", None) or f"{im.name}@{im.layouts}"   # the name choice= takes
        if choice in same or choice in name_only:
            continue
        if fm.get("src") == im.formats.get(src_role) and fm.get("wei") == im.formats.get(wei_role):
            same.append(choice)
        else:
            name_only.append(choice)
    if same:
        return "same name and layouts", tuple(same + name_only), ""
    if name_only:
        return "same name", tuple(name_only), ""
    return "none", (), ""


# ============================================================================ CUDA: kernels, candidates, API log
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
    lg = cudnn_api_log() if cudnn_log else None

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


def torch_part() -> dict:
    """torch's build as ``rawconv info`` shows it: version, threads, its oneDNN (bundled version) and cuDNN."""
    cfg = torch.__config__.show()
    m = re.search(r"MKL-DNN v([\d.]+) \(Git Hash (\w+)\)", cfg)
    out = {"version": torch.__version__, "threads": torch.get_num_threads(),
           "mkldnn_available": torch.backends.mkldnn.is_available(),
           "mkldnn_enabled": torch.backends.mkldnn.enabled,
           "onednn_bundled": (m.group(1) + " (" + m.group(2)[:8] + ")") if m else None,
           "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    try:
        out["cudnn_version"] = torch.backends.cudnn.version()
    except Exception as exc:  # pragma: no cover
        out["cudnn_version"] = f"unavailable ({exc})"
    return out


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


if __name__ != "__main__":
    sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
