"""CUDA plan-layer helpers shared by rawconv's cuDNN plans (torch's devices and streams).

The raw layer (:mod:`rawconv._cudnn`) knows cuDNN alone; this module adds what needs torch: one
cuDNN handle per (thread, device), created with that device current and given torch's current
stream on it (``cudnnSetStream`` only when the stream changed); workspaces from torch's caching
allocator; the device guard plan methods run under; the checks of tensors bound to a plan; and
the tensor pack both cuDNN plans' forward hot paths check a call against (:class:`HotArgs`).
Importing it registers torch's own cuDNN as the one :func:`rawconv._cudnn.load` reuses.
"""
from __future__ import annotations

import contextlib
import threading

import torch

from . import _ffi as _cudnn
from ..core import guard as _guard, plans as _plans
from ._ffi import call, ffi
from ..core.errors import ArgumentError, ArgumentTypeError
from ..core.problem import strides_match

_tls = threading.local()


def _torch_cudnn() -> None:
    torch.backends.cudnn.version()   # maps torch's libcudnn.so.9, if it has one


if _torch_cudnn not in _cudnn.PRELOAD:
    _cudnn.PRELOAD.append(_torch_cudnn)


def _raw_stream(device_index: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device_index)


class _Handle:
    """One cuDNN handle (one device, one thread) and the stream last set on it."""

    __slots__ = ("ptr", "device", "stream", "__weakref__")

    def __init__(self, device: int):
        if torch.cuda.is_available():
            with torch.cuda.device(device):
                self.ptr = _cudnn.create_handle()
        else:  # cuDNN says why (CUDNN_STATUS_NOT_INITIALIZED: no device)
            p = ffi.new("cudnnHandle_t *")
            call("cudnnCreate", p, detail=f"device cuda:{device}; torch sees no CUDA device")
            self.ptr = p[0]
        self.device = device
        self.stream = None


def handle(device=None):
    """This thread's cuDNN handle for ``device`` (a torch device, an index, or None for the current
    CUDA device), with torch's current stream on that device set on it (``cudnnSetStream`` only when
    the stream changed since the last call). Created on first use per (device, thread).
    Wraps ``cudnnCreate`` and ``cudnnSetStream``."""
    if device is None:
        idx = torch.cuda.current_device()
    elif isinstance(device, int):
        idx = device
    else:
        idx = device.index if getattr(device, "index", None) is not None else _device_index(device)
    return handle_for(idx)


def _device_index(device) -> int:
    d = torch.device(device)
    return d.index if d.index is not None else torch.cuda.current_device()


def handle_for(idx: int):
    """:func:`handle` for a device index (the fast path the plans use)."""
    return handle_state(idx).ptr


def handle_state(idx: int) -> _Handle:
    """This thread's handle for device index ``idx`` as :func:`handle_for` prepares it, with the
    stream now set on it: ``.ptr`` (the ``cudnnHandle_t``) and ``.stream`` (torch's current raw
    stream on that device). For hot paths that also need the stream (a workspace is tied to one)."""
    handles = getattr(_tls, "handles", None)
    if handles is None:
        handles = _tls.handles = {}
    h = handles.get(idx)
    if h is None:
        h = handles[idx] = _Handle(idx)
        _count_devices()   # a GPU is there: the device guard of the plans' methods may skip itself
    s = _raw_stream(idx)
    if s != h.stream:
        _cudnn.set_stream(h.ptr, s)
        h.stream = s
    return h


def current_stream_of_handle(idx: int) -> int | None:
    """The raw stream last set on this thread's handle for device ``idx`` (None if no handle yet)."""
    h = getattr(_tls, "handles", {}).get(idx)
    return None if h is None else h.stream


def current_device() -> int | None:
    """torch's current CUDA device index for this thread (``cudaGetDevice``), or None where torch
    sees no CUDA driver."""
    try:
        return _get_device()
    except RuntimeError:
        return None


def _no_cuda_build() -> int:
    raise RuntimeError("this torch is a CPU build (no CUDA)")


# torch's cudaGetDevice binding; a CPU build of torch has none (torch._C has no _cuda_getDevice)
_get_device = getattr(torch._C, "_cuda_getDevice", _no_cuda_build)


_ONE_DEVICE = [False]   # set once torch reports exactly one visible CUDA device (see on_plan_device)


def _count_devices() -> None:
    try:
        _ONE_DEVICE[0] = torch.cuda.is_available() and torch.cuda.device_count() == 1
    except Exception:   # noqa: BLE001 - no CUDA: the guard's own checks apply
        _ONE_DEVICE[0] = False


def on_plan_device(method):
    """Decorator for plan methods (``self.device_index``): the method runs with that device current
    for this thread (torch's ``torch.cuda.device`` guard, restored after), as torch's own CUDA ops
    run: a cuDNN handle is tied to the device current when ``cudnnCreate`` ran, kernels launch
    into the current device's context, and a stream of device ``i`` takes launches only while
    ``i`` is current. Without it a plan of ``cuda:1`` called while ``cuda:0`` is current (no
    ``torch.cuda.set_device``; a background thread, whose current device is 0) would launch into
    the wrong context. Costs one ``cudaGetDevice`` when the device is already current; where torch
    sees no CUDA driver the method runs as it is (cuDNN then says why it cannot)."""
    import functools

    get_device, device_guard = _get_device, torch.cuda.device

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        if _ONE_DEVICE[0]:   # one visible GPU: it is always the current one (no cudaGetDevice per call)
            return method(self, *args, **kwargs)
        idx = getattr(self, "device_index", None)   # None: a plan not set up (its method says why)
        try:
            cur = get_device()
        except RuntimeError:   # no CUDA driver, or a CPU build of torch
            return method(self, *args, **kwargs)
        if cur == idx or idx is None:
            return method(self, *args, **kwargs)
        with device_guard(idx):
            return method(self, *args, **kwargs)
    return guarded


# ------------------------------------------------------------------ plan arguments
def check_plan_tensor(p, t, name: str, shape, device_index: int, batched_names, is_out: bool = False) -> "object":
    """``t`` checked against a CUDA plan of problem ``p``: a torch.Tensor of ``shape``, of ``p``'s
    dtype, on ``cuda:device_index`` (:class:`ArgumentTypeError` / :class:`ArgumentError`
    otherwise, before any C call). For an unbatched problem, a tensor named in
    ``batched_names`` given without its batch dim gets one (a view). A negative or conjugate view
    (``torch._neg_view``, ``.conj()``: its memory holds the un-negated values, which is what cuDNN
    reads) is resolved to a copy as an input and refused as an output (``is_out``). Returns the tensor."""
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if p.unbatched and name in batched_names and t.dim() == p.ndim + 1:
        t = t.unsqueeze(0)
    if t.shape != shape:
        raise ArgumentError(f"{name} must have shape {tuple(shape)} for this plan, got {tuple(t.shape)}")
    if t.dtype != p.torch_dtype:
        raise ArgumentError(f"{name} must be {p.torch_dtype} for this plan, got {t.dtype}")
    if not t.is_cuda or t.get_device() != device_index:
        raise ArgumentError(f"{name} must be on cuda:{device_index} for this plan, got {t.device}"
                            + (" (use rawconv.onednn for CPU tensors)" if not t.is_cuda else ""))
    if t.is_neg() or t.is_conj():
        if is_out:
            raise ArgumentError(f"{name} must not be a negative or conjugate view (torch._neg_view, .conj())")
        t = t.resolve_neg().resolve_conj()
    return t


# ------------------------------------------------------------------ workspaces
def workspace(nbytes: int, device) -> "object":
    """A device buffer of at least ``nbytes`` bytes from torch's caching allocator (a uint8 tensor;
    keep it alive while cuDNN may use it). ``nbytes`` 0 gives a 1-byte buffer."""
    return torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=device)


#: The lock of a call that shares nothing with other threads (a reusable no-op context manager)
NO_LOCK = contextlib.nullcontext()


class KeptWorkspace:
    """What keeps a workspace of ``workspace_bytes`` between calls on the device's default stream
    (a graph plan's built engine config): ``ws``, ``(tensor, address)`` or None until the first
    call there; ``lock``: held while a call's launches use it (every thread's default stream is
    the same stream, but two threads' launches would interleave on it, each reading what the
    other's wrote there: :data:`NO_LOCK` elsewhere). Counted in the plans' byte budget from its allocation
    (:func:`rawconv.core.plans.charge`, under the device's name, e.g. ``"cuda:0"``): past the
    budget, or at :func:`rawconv.clear_caches`, the least recently used are released
    (:meth:`_cache_release`); the next call allocates again. A caller holds the pair through its
    launch, so a release from another thread frees the memory only after it."""

    __slots__ = ("ws", "used", "lock", "__weakref__")
    workspace_bytes: int

    def default_workspace(self, device) -> tuple:
        """The default stream's workspace as ``(tensor, address)``, allocated on first use."""
        self.used = True   # (the byte budget's sweep: used since the last one)
        pair = self.ws
        if pair is None:
            t = workspace(self.workspace_bytes, device)
            pair = self.ws = (t, t.data_ptr())
            _plans.charge(self, self.workspace_bytes, str(t.device))
        return pair

    @property
    def workspace(self):
        """The kept workspace tensor, or None."""
        pair = self.ws
        return None if pair is None else pair[0]

    def _cache_release(self) -> None:
        self.ws = None


_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: False)


def capture_fails(run) -> str:
    """Why ``run()`` cannot be captured into a CUDA graph, or ``""`` when it can: ``run`` (which
    launches work on torch's current stream) is called once inside a throwaway capture
    (``torch.cuda.CUDAGraph.capture_begin(capture_error_mode="thread_local")``) on a new side
    stream, and the graph is dropped, so nothing it launched ever runs. A failure inside the
    capture (an exception from ``run``, or the capture invalidated, which ``capture_end`` raises)
    is the reason returned; torch clears CUDA's error state when it raises, so later calls are
    unaffected. Must not be called while this thread's current stream is being captured."""
    def reason(exc: Exception) -> str:
        return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    why = ""
    with torch.cuda.stream(s):
        g.capture_begin(capture_error_mode="thread_local")
        try:
            run()
        except Exception as exc:   # noqa: BLE001 - the reason is the result
            why = reason(exc)
        finally:
            try:
                g.capture_end()
            except Exception as exc:   # noqa: BLE001
                why = why or reason(exc)
    torch.cuda.current_stream().wait_stream(s)
    del g
    return why

# ---------------------------------------------------------------------------- stream barriers
# cuDNN 9.19's runtime-compiled fusion engine (eng4, behaviour note RUNTIME_COMPILATION) starts
# before the kernel queued ahead of it on the stream has finished: measured on the H200, a fused
# ResNet-50 whose residual graphs ran on it gave wrong outputs (1e-1 relative) in a CUDA-graph
# replay and in eager calls queued behind a busy GPU, and exact ones with any torch kernel launched
# just before each of its executes (benchmarks/diag_capture_rtc2.py, D10/D13/D14). Such plans
# launch one such kernel first.
_barriers: dict = {}


def make_barrier(idx: int) -> None:
    """The 4-byte device buffer :func:`stream_barrier` writes on device ``idx``, made now (when a
    plan that needs it is finalized: never inside a CUDA-graph capture, whose pool must not own it)."""
    if idx not in _barriers:
        _barriers[idx] = torch.zeros(1, dtype=torch.int32, device=torch.device("cuda", idx))


def stream_barrier(idx: int) -> None:
    """Launch one tiny kernel (a 4-byte fill) on torch's current stream of device ``idx``: the
    next kernel then starts only after everything queued before this one has finished (see the
    note above). Captured into a CUDA graph like any kernel."""
    t = _barriers.get(idx)
    if t is None:
        make_barrier(idx)
        t = _barriers[idx]
    t.zero_()


def refuse_in_capture(what: str) -> None:
    """Raise :class:`~rawconv.errors.NotSupportedError` when torch's current CUDA stream is being
    captured into a CUDA graph (``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``):
    ``what`` (a search that times candidates, allocates example tensors and synchronizes) cannot
    run inside a capture. The fix is a call before capturing (a warm-up), as torch's own
    ``cudnn.benchmark`` needs."""
    try:
        capturing = _capturing()
    except RuntimeError:   # no CUDA driver: nothing is captured
        return
    if capturing:
        from ..core.errors import NotSupportedError

        raise NotSupportedError(f"{what} cannot run while a CUDA graph is being captured (it times candidates and "
                                "synchronizes): run the model once before capturing (a warm-up on a side stream, "
                                "as torch.cuda.graph's docs show), which makes and keeps the choice")


# ------------------------------------------------------------------ forward hot paths
PLAIN = (torch.Tensor, torch.nn.Parameter)   # tensor types a hot path takes as they are


def out_overlaps(ptrs, ext) -> bool:
    """Whether the last tensor of ``ptrs`` (out) shares a byte with another: ``ptrs`` their data
    pointers, ``ext`` their byte extents (:func:`rawconv._guard.extent`; 0 for an absent or empty
    tensor). With each tensor's shape and strides fixed, the pointers alone decide it, as
    :func:`rawconv._guard.check_no_overlap` does from the tensors."""
    o, eo = ptrs[-1], ext[-1]
    if not eo:
        return False
    for q, e in zip(ptrs[:-1], ext[:-1]):
        if e and q < o + eo and o < q + e:
            return True
    return False


class HotArgs:
    """The tensors of a CUDA plan's forward hot path (x, w, bias or None, y), as a checked call
    used them (no copy, no unsqueeze): each one's shape and strides as the caller passed it, their
    dtype and device (``cuda:index``), y's shape and strides, the byte extents that tell an ``out``
    overlapping an input, the address alignment the plan needs (1: none), and the last pointers
    found not to overlap. :meth:`bind` takes a later call's tensors when their metadata is exactly
    the pack's; the caller's checked path handles every other case (and raises the clear error)."""

    __slots__ = ("x", "w", "b", "dtype", "index", "device", "y_shape", "y_strides", "ext", "align", "fit")

    @classmethod
    def of(cls, x, w, bias, y, index: int, align: int = 1) -> "HotArgs | None":
        """The pack of a checked call on ``cuda:index`` that passed ``x``, ``w``, ``bias`` (or None)
        and wrote ``y`` as they are; None when one of them is a tensor subclass."""
        if type(x) not in PLAIN or type(w) not in PLAIN or type(y) not in PLAIN \
                or (bias is not None and type(bias) not in PLAIN):
            return None
        h = cls()
        h.x, h.w = (x.shape, x.stride()), (w.shape, w.stride())
        h.b = None if bias is None else (bias.shape, bias.stride())
        h.dtype, h.index, h.device = x.dtype, index, torch.device("cuda", index)
        h.y_shape, h.y_strides = y.shape, y.stride()
        h.ext = tuple(0 if v is None else _guard.extent(v) for v in (x, w, bias, y))
        h.align, h.fit = align, None
        return h

    def bind(self, x, w, bias, out):
        """``((x, w, bias or 0, y) data pointers, y)`` when the tensors have exactly the pack's
        metadata (type, shape, strides, dtype, device, no negative bit, aligned addresses): y is a
        new tensor of the pack's shape and strides, or ``out`` (which must not require grad, be an
        inference tensor, overlap an input, or come with an input that requires grad). Else None."""
        dt, idx = self.dtype, self.index
        xs, ws, bs = self.x, self.w, self.b
        try:   # (an unusual tensor may raise on .shape: the checked path says what is wrong)
            # (strides compared in the dims of size > 1 when they differ: a (N, C, 1, 1) gradient comes with
            # either format's strides from step to step, and the same memory serves)
            if type(x) not in PLAIN or x.shape != xs[0] or (x.stride() != xs[1] and not strides_match(x, xs[1])) \
                    or x.dtype is not dt or not x.is_cuda or x.get_device() != idx or x.is_neg() \
                    or type(w) not in PLAIN or w.shape != ws[0] or (w.stride() != ws[1] and not strides_match(w, ws[1])) \
                    or w.dtype is not dt \
                    or not w.is_cuda or w.get_device() != idx or w.is_neg():
                return None
            if bs is None:
                if bias is not None:
                    return None
                pb = 0
            elif type(bias) not in PLAIN or bias.shape != bs[0] or bias.stride() != bs[1] \
                    or bias.dtype is not dt or not bias.is_cuda or bias.get_device() != idx or bias.is_neg():
                return None
            else:
                pb = bias.data_ptr()
            if out is None:   # (x's dtype and device are the pack's: no keyword arguments to parse)
                y = x.new_empty_strided(self.y_shape, self.y_strides)
            elif type(out) in PLAIN and out.shape == self.y_shape and out.stride() == self.y_strides \
                    and out.dtype is dt and out.is_cuda and out.get_device() == idx and not out.is_neg() \
                    and not out.requires_grad and not out.is_inference() and not x.requires_grad \
                    and not w.requires_grad and (bias is None or not bias.requires_grad):
                y = out
            else:
                return None
            a = (x.data_ptr(), w.data_ptr(), pb, y.data_ptr())
        except Exception:   # noqa: BLE001
            return None
        if self.align > 1 and (a[0] | a[1] | a[2] | a[3]) % self.align:
            return None   # the checked path copies (or refuses an out) that is not aligned
        if out is not None and a != self.fit:
            if out_overlaps(a, self.ext):
                return None   # the checked path raises the clear error
            self.fit = a
        return a, y
