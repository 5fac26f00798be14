"""Raw cuDNN 9 binding: the FFI, the loader, status checks, handles, descriptors, workspaces.

No torch convolution semantics here; names follow the cuDNN C API. One FFI parses
``cdefs/cudnn_graph.h`` (base + backend/graph API) then ``cdefs/cudnn.h`` (legacy subset), so the
graph-API layer (:mod:`rawconv.cudnn_graph`) and the legacy layer (:mod:`rawconv.cudnn`) share it.

One cuDNN per process. The library is loaded on first use, under a lock, from (in order, the first
that loads wins and is recorded as ``found_via``):

1. a ``libcudnn.so.9`` already mapped into the process (a CUDA build of torch loads its own; rawconv
   reuses it: path from ``/proc/self/maps``, opened with ``RTLD_NOLOAD``),
2. ``<site-packages>/nvidia/cudnn/lib/libcudnn.so.9`` (the nvidia-cudnn-cu12 / -cu13 wheels),
3. the system loader (``libcudnn.so.9``).

``$RAWCONV_CUDNN_LIBRARY`` (an explicit path), when set, replaces that search: rawconv then does
not ask torch to load its cuDNN first and loads that file, or raises
:class:`~rawconv.errors.LibraryNotFoundError` naming the path and the loader's message (never a
silent fall-back to another copy); also when another ``libcudnn.so.9`` is already mapped into
the process (one cuDNN per process). When all fail, the error lists every attempt.

Helpers for other modules: :data:`ffi`, :func:`lib`, :func:`load`, :func:`check`, :func:`call`,
:func:`handle`, :func:`data_type`, :func:`status_name`, :func:`workspace`.
"""
from __future__ import annotations

import atexit
import logging
import os
import re
import threading
from pathlib import Path

import cffi

from ..core import env as _env, loader as _loader
from ..core.errors import LibraryError, NotSupportedError

log = logging.getLogger("rawconv")

SONAME = "libcudnn.so.9"
ENV_VAR = "RAWCONV_CUDNN_LIBRARY"
HINT = "set CUDNN_LOGLEVEL_DBG=3 and CUDNN_LOGDEST_DBG=stderr to see cuDNN's own reasons"

CDEFS = (_loader.cdefs_text("cudnn_graph.h"), _loader.cdefs_text("cudnn.h"))
ffi = cffi.FFI()
for _text in CDEFS:
    ffi.cdef(_text)

# every enumerator of the cdefs, name -> value (no library needed): {"CUDNN_FMA_MATH": 3, ...}
ENUMS: dict[str, int] = {}
ENUM_TYPES: dict[str, dict[str, int]] = {}
for _text in CDEFS:
    for _m in re.finditer(r"typedef\s+enum\s*\w*\s*\{([^}]*)\}\s*(\w+)\s*;", _text):
        _items = {n: int(v) for n, v in re.findall(r"(\w+)\s*=\s*(-?\d+)", _m.group(1))}
        ENUM_TYPES[_m.group(2)] = _items
        ENUMS.update(_items)

_lock = threading.Lock()
_state: dict = {}
_tls = threading.local()

# status values of "not supported" (CUDNN_STATUS_NOT_SUPPORTED and its 3000-range sub-codes)
_NOT_SUPPORTED_RANGE = range(3000, 4000)


@atexit.register
def _exiting() -> None:
    _state["exiting"] = True


# ------------------------------------------------------------------ loading
def mapped_path(soname: str = SONAME, maps: str = "/proc/self/maps") -> str | None:
    """Path of ``soname`` when it is already mapped into the process (read from ``maps``), else None."""
    try:
        with open(maps) as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and os.path.basename(parts[5].strip()) == soname:
                    return parts[5].strip()
    except OSError:
        pass
    return None


def candidates(*, maps: str = "/proc/self/maps", site_dirs: list | None = None,
               env: dict | None = None) -> list[tuple[str, str, int | None]]:
    """The ``(how, target, dlopen flags)`` search list, in order (see the module docstring).
    With ``$RAWCONV_CUDNN_LIBRARY`` set, that path is the only candidate (an error from
    :func:`explicit_conflict` comes first when another copy is already mapped).

    ``maps``, ``site_dirs`` and ``env`` can be replaced (tests use fake files)."""
    path = _env.get(ENV_VAR, env)
    if path:
        return [(f"${ENV_VAR}", path, None)]
    out: list[tuple[str, str, int | None]] = []
    mapped = mapped_path(SONAME, maps)
    if mapped:
        out.append(("already loaded in this process", mapped, ffi.RTLD_NOW | ffi.RTLD_NOLOAD))
    else:
        out.append(("already loaded in this process", f"(no {SONAME} in {maps})", -1))
    seen = set()
    for site in (_loader.site_dirs() if site_dirs is None else [Path(s) for s in site_dirs]):
        p = str(Path(site) / "nvidia" / "cudnn" / "lib" / SONAME)
        if p not in seen:
            seen.add(p)
            out.append(("nvidia-cudnn wheel (site-packages/nvidia/cudnn/lib)", p, None))
    out.append(("system loader", SONAME, None))
    return out


def explicit_conflict(path: str, maps: str = "/proc/self/maps") -> str | None:
    """Why ``$RAWCONV_CUDNN_LIBRARY=path`` cannot be honoured in this process, or None: another
    ``libcudnn.so.9`` (not the same file) is already mapped, e.g. torch's own (a CUDA build of
    torch maps it at ``import torch``), and ``path`` is a shared library that would load beside it."""
    mapped = mapped_path(SONAME, maps)
    if not mapped or not os.path.isfile(path):
        return None   # nothing to clash with, or nothing to load: the loader says so
    try:
        if os.path.samefile(mapped, path):
            return None
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return None   # dlopen refuses it without loading anything: its own message is clearer
    except OSError:
        pass
    return (f"this process has already loaded another {SONAME} ({mapped}, e.g. by torch); one cuDNN per "
            f"process: point {ENV_VAR} at that file, unset it, or set it before anything loads cuDNN")


def search(cands: list[tuple[str, str, int | None]], label: str | None = None) -> _loader.Loaded:
    """Try each candidate in order (``flags == -1`` marks a candidate that is only reported).
    Raises :class:`~rawconv.errors.LibraryNotFoundError` listing every attempt."""
    from ..core.errors import LibraryNotFoundError

    attempts: list[tuple[str, str]] = []
    for how, target, flags in cands:
        if flags == -1:
            attempts.append((how, target))
            continue
        try:
            loaded = _loader.try_load(ffi, "cuDNN", [(how, target)], flags, symbol="cudnnGetVersion")
        except LibraryNotFoundError as exc:
            attempts += exc.attempts
            continue
        loaded.attempts = attempts + loaded.attempts
        return loaded
    raise LibraryNotFoundError(label or f"cuDNN ({SONAME})", attempts)


def load() -> _loader.Loaded:
    """Load libcudnn (once per process, thread-safe) and return what was loaded
    (``lib``, ``path``, ``found_via``, ``attempts``).

    The :data:`PRELOAD` hooks run first: :mod:`rawconv._cuda` (imported by rawconv's cuDNN plans)
    asks torch for its cuDNN (``torch.backends.cudnn.version()``), so that a CUDA build of torch
    maps its own copy and rawconv reuses it. Raises
    :class:`~rawconv.errors.LibraryNotFoundError` listing every attempt."""
    loaded = _state.get("loaded")
    if loaded is not None:
        return loaded
    with _lock:
        loaded = _state.get("loaded")
        if loaded is None:
            explicit = _env.get(ENV_VAR)
            if explicit:
                from ..core.errors import LibraryNotFoundError

                label = _loader.explicit_label(f"cuDNN ({SONAME})", ENV_VAR, explicit)
                why = explicit_conflict(explicit)
                if why:
                    raise LibraryNotFoundError(label, [(f"${ENV_VAR}: {explicit}", why)])
                loaded = search(candidates(), label)
            else:
                for pre in PRELOAD:   # e.g. torch maps its own libcudnn.so.9 first (rawconv._cuda)
                    try:
                        pre()
                    except Exception as exc:  # pragma: no cover
                        log.debug("rawconv: cuDNN preload %s failed: %s", pre, exc)
                loaded = search(candidates())
            if os.sep not in loaded.path:
                loaded.path = mapped_path(SONAME) or loaded.path
            else:
                loaded.path = str(Path(loaded.path).resolve())
            log.debug("rawconv: cuDNN %s from %s (%s)", loaded.lib.cudnnGetVersion(), loaded.path,
                      loaded.found_via)
            _state["loaded"] = loaded
    return loaded


def lib():
    """The cffi library object (loads on first call)."""
    loaded = _state.get("loaded")
    return (loaded or load()).lib


# ------------------------------------------------------------------ statuses
def status_name(status: int) -> str:
    """``cudnnStatus_t`` name of an integer status, from the declarations alone (first name
    the header gives a value; e.g. 3000 -> ``CUDNN_STATUS_NOT_SUPPORTED``)."""
    name = ffi.string(ffi.cast("cudnnStatus_t", int(status)))
    return name if isinstance(name, str) else f"CUDNN_STATUS_{int(status)}"


def last_error() -> str:
    """cuDNN's last error text for this thread (``cudnnGetLastErrorString``), '' when none."""
    loaded = _state.get("loaded")
    if loaded is None:
        return ""
    buf = ffi.new("char[]", 1024)
    loaded.lib.cudnnGetLastErrorString(buf, 1024)
    return ffi.string(buf).decode(errors="replace").strip()


def error(status: int, function: str, detail: str = "") -> LibraryError:
    """The exception for a non-success status: :class:`NotSupportedError` for
    ``CUDNN_STATUS_NOT_SUPPORTED*`` (3000-3999), :class:`LibraryError` otherwise. The message holds
    the status name and number, the C function, ``detail``, cuDNN's last-error text and a hint."""
    name = status_name(status)
    text = last_error()
    full = "; ".join(t for t in (detail, text) if t)
    if int(status) in _NOT_SUPPORTED_RANGE:
        msg = f"{function} failed: {name} ({int(status)})"
        if full:
            msg += f": {full}"
        return NotSupportedError(msg + f" [{HINT}]", library="cuDNN", function=function, status=status,
                                 status_name=name, detail=full)
    return LibraryError("cuDNN", function, status, name, full, HINT)


def check(status: int, function: str, detail: str = "") -> None:
    """Raise :func:`error` for a non-zero ``cudnnStatus_t``; return None on success."""
    if status:
        raise error(status, function, detail)


def call(function: str, *args, detail: str = ""):
    """Call ``lib().<function>(*args)`` and :func:`check` its status."""
    check(getattr(lib(), function)(*args), function, detail)


# ------------------------------------------------------------------ enums and types
_DATA_TYPES = {"float32": "CUDNN_DATA_FLOAT", "float16": "CUDNN_DATA_HALF", "bfloat16": "CUDNN_DATA_BFLOAT16",
               "float64": "CUDNN_DATA_DOUBLE", "int8": "CUDNN_DATA_INT8", "int32": "CUDNN_DATA_INT32",
               "uint8": "CUDNN_DATA_UINT8", "int64": "CUDNN_DATA_INT64", "bool": "CUDNN_DATA_BOOLEAN"}


def data_type(name) -> int:
    """``cudnnDataType_t`` value for a dtype name (``"float32"``, ``"float16"``, ``"bfloat16"``,
    ``"float64"``, ...; a torch dtype's ``str`` works too). Needs no library."""
    if not isinstance(name, str):
        name = str(name).replace("torch.", "")
    try:
        return enum_value(_DATA_TYPES[name])
    except KeyError:
        raise ValueError(f"no cuDNN data type for {name!r}; known: {sorted(_DATA_TYPES)}") from None


def enum_value(name: str) -> int:
    """The value of an enumerator declared in the cdefs (e.g. ``"CUDNN_FMA_MATH"``); needs no library."""
    return ENUMS[name]


def enum_items(ctype: str) -> dict[str, int]:
    """Every enumerator of a C enum type (``"cudnnConvolutionFwdAlgo_t"``), in declaration order."""
    return dict(ENUM_TYPES[ctype])


# ------------------------------------------------------------------ handles (raw)
def create_handle():
    """A new cuDNN handle on the current CUDA device (owned: ``cudnnDestroy`` when collected).
    Wraps ``cudnnCreate``; without a GPU cuDNN says why (``CUDNN_STATUS_NOT_INITIALIZED``). The
    per-(thread, device) cache with torch's streams is :mod:`rawconv._cuda`'s."""
    p = ffi.new("cudnnHandle_t *")
    call("cudnnCreate", p)
    return ffi.gc(p[0], _destructor(lib().cudnnDestroy))


def set_stream(handle, stream: int) -> None:
    """``cudnnSetStream(handle, stream)`` (a raw ``cudaStream_t`` as an int)."""
    check(lib().cudnnSetStream(handle, ffi.cast("cudaStream_t", stream)), "cudnnSetStream")


PRELOAD: list = []   # callables run before the first search (rawconv._cuda adds torch's own cuDNN)


# ------------------------------------------------------------------ legacy descriptors
def _gc(ptr, destroy: str):
    L = lib()
    fn = getattr(L, destroy)
    return ffi.gc(ptr, _destructor(fn))


def _destructor(fn):
    """A cffi gc destructor calling ``fn(ptr)``, skipped at interpreter exit (the CUDA context may
    already be gone) and never raising (a destructor's exception is only printed)."""
    st = _state

    def destroy(ptr, fn=fn, st=st):
        try:
            if st is not None and not st.get("exiting"):
                fn(ptr)
        except Exception:  # pragma: no cover - interpreter teardown
            pass

    return destroy


def tensor_desc(dtype: str, dims, strides):
    """A tensor descriptor (at least 4 dims: cuDNN's Nd convolution takes 4-D or 5-D). Wraps
    ``cudnnCreateTensorDescriptor`` + ``cudnnSetTensorNdDescriptor``."""
    p = ffi.new("cudnnTensorDescriptor_t *")
    call("cudnnCreateTensorDescriptor", p)
    d = _gc(p[0], "cudnnDestroyTensorDescriptor")
    call("cudnnSetTensorNdDescriptor", d, data_type(dtype), len(dims), list(dims), list(strides),
         detail=f"{dtype} dims {tuple(dims)} strides {tuple(strides)}")
    return d


def filter_desc(dtype: str, dims, layout: str = "nchw"):
    """A filter descriptor in ``CUDNN_TENSOR_NCHW`` or ``CUDNN_TENSOR_NHWC`` format. Wraps
    ``cudnnCreateFilterDescriptor`` + ``cudnnSetFilterNdDescriptor``."""
    p = ffi.new("cudnnFilterDescriptor_t *")
    call("cudnnCreateFilterDescriptor", p)
    d = _gc(p[0], "cudnnDestroyFilterDescriptor")
    fmt = enum_value("CUDNN_TENSOR_NHWC" if layout == "nhwc" else "CUDNN_TENSOR_NCHW")
    call("cudnnSetFilterNdDescriptor", d, data_type(dtype), fmt, len(dims), list(dims),
         detail=f"{dtype} dims {tuple(dims)} {layout}")
    return d


def conv_desc(pad, stride, dilation, compute: str, *, groups: int = 1, math: int | None = None):
    """A cross-correlation convolution descriptor (torch's convolution). ``dilation`` as cuDNN
    (and torch) count it: 1 = none. Wraps ``cudnnCreateConvolutionDescriptor``,
    ``cudnnSetConvolutionNdDescriptor``, ``cudnnSetConvolutionGroupCount``, ``cudnnSetConvolutionMathType``."""
    p = ffi.new("cudnnConvolutionDescriptor_t *")
    call("cudnnCreateConvolutionDescriptor", p)
    d = _gc(p[0], "cudnnDestroyConvolutionDescriptor")
    call("cudnnSetConvolutionNdDescriptor", d, len(pad), list(pad), list(stride), list(dilation),
         enum_value("CUDNN_CROSS_CORRELATION"), data_type(compute),
         detail=f"pad {tuple(pad)} stride {tuple(stride)} dilation {tuple(dilation)} compute {compute}")
    if groups != 1:
        call("cudnnSetConvolutionGroupCount", d, int(groups))
    if math is not None:
        call("cudnnSetConvolutionMathType", d, int(math))
    return d


def activation_desc(mode: str, coef: float = 0.0):
    """An activation descriptor (``mode`` as ``"RELU"``, ``"IDENTITY"``, ... ; NaN propagated).
    Wraps ``cudnnCreateActivationDescriptor`` + ``cudnnSetActivationDescriptor``."""
    p = ffi.new("cudnnActivationDescriptor_t *")
    call("cudnnCreateActivationDescriptor", p)
    d = _gc(p[0], "cudnnDestroyActivationDescriptor")
    call("cudnnSetActivationDescriptor", d, enum_value("CUDNN_ACTIVATION_" + mode.upper()),
         enum_value("CUDNN_PROPAGATE_NAN"), float(coef))
    return d


def forward_output_dim(cdesc, xdesc, wdesc, nbdims: int) -> list[int]:
    """cuDNN's own output dims of a forward convolution. Wraps ``cudnnGetConvolutionNdForwardOutputDim``."""
    out = ffi.new("int[]", nbdims)
    call("cudnnGetConvolutionNdForwardOutputDim", cdesc, xdesc, wdesc, nbdims, out)
    return [int(v) for v in out]


# ------------------------------------------------------------------ info
def version() -> dict:
    """Versions as the loaded library reports them: cuDNN (``cudnnGetVersion``, e.g. 91900 ->
    "9.19.0"), the CUDA runtime it was built for (``cudnnGetCudartVersion``), the newest
    device it knows (``cudnnGetMaxDeviceVersion``)."""
    L = lib()
    v = int(L.cudnnGetVersion())
    rt = int(L.cudnnGetCudartVersion())
    out = {"version": f"{v // 10000}.{v % 10000 // 100}.{v % 100}", "version_int": v,
           "cudart_version": f"{rt // 1000}.{rt % 1000 // 10}", "cudart_version_int": rt}
    try:
        out["max_device_version"] = int(L.cudnnGetMaxDeviceVersion())
    except Exception:  # pragma: no cover
        pass
    return out
