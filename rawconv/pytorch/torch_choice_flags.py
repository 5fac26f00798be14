"""torch's convolution flags (:mod:`rawconv.torch_choice`, the face): :class:`TorchFlags` (the flags
in force) and :func:`torch_flags` (set them for a ``with`` block, restored after), and torch's build
(:func:`torch_part`)."""
from __future__ import annotations

import contextlib
import dataclasses
import re
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..core import guard as _guard
from ..core.errors import ArgumentError, ArgumentTypeError, NotSupportedError, RawconvError

#: fp32 precisions torch's newer API takes for convolutions (``torch.backends.<b>.conv.fp32_precision``)
CUDNN_FP32_PRECISIONS = ("ieee", "tf32", "none")
MKLDNN_FP32_PRECISIONS = ("ieee", "tf32", "bf16", "none")


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
