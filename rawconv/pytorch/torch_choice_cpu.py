"""What torch's own oneDNN ran (:mod:`rawconv.torch_choice`, the face): one call under oneDNN's
verbose trace (:func:`torch_onednn_trace`, its lines as :class:`OneDNNRun` records) and the
implementations of rawconv's oneDNN with the same name (:func:`_onednn_matches`)."""
from __future__ import annotations

import dataclasses
import functools
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..core.errors import RawconvError
from ..core.problem import layout_of
from .torch_choice_flags import torch_part

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
