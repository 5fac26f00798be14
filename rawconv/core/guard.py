"""What every public entry point shares: only rawconv's exception classes leave it, and ``out=``
follows torch's rules.

* :func:`public` wraps a public function or method: a :class:`~rawconv.errors.RawconvError` passes
  through; anything else (torch's allocator failing, torch asked for a CUDA device it does not
  have, a device string torch cannot parse, a bug) is translated by :func:`translate` into the
  rawconv class that means the same (:class:`~rawconv.errors.AllocationError` is also a
  ``MemoryError``, ...), the original chained as ``__cause__``. Warnings (also when turned into
  errors) and ``BaseException``s (``KeyboardInterrupt``) pass untouched.
* :func:`check_out` / :func:`bump` apply torch's ``out=`` rules to a tensor rawconv writes in place:
  no autograd through it, no inference tensor outside inference mode, no memory shared with an
  input, and its version counter bumped after the write (so a graph that saved it raises at
  ``backward()``, as after torch's own ``out=`` functions).
"""
from __future__ import annotations

import functools

import torch

from .errors import (AllocationError, ArgumentError, ArgumentTypeError, DeviceNotAvailableError, FileAccessError,
                     InternalError, RawconvError)

__all__ = ["public", "public_methods", "translate", "as_torch_raised", "bad_call", "check_out", "check_no_overlap", "extent", "bump"]

# words of torch's (and the C++ runtime's) allocation failures, in RuntimeError messages
_ALLOC_WORDS = ("can't allocate memory", "out of memory", "not enough memory", "cannot allocate memory",
                "std::bad_alloc", "storage size calculation overflowed", "integer multiplication overflow",
                "numel: integer multiplication overflow", "allocation failed", "too large to allocate")
# torch asked for a CUDA device it does not have
_NO_DEVICE_WORDS = ("found no nvidia driver", "torch not compiled with cuda", "no cuda gpus are available",
                    "cuda driver version is insufficient", "invalid device ordinal", "no cuda-capable device",
                    "cuda driver initialization failed", "cudagetdevicecount")
# a device string torch cannot parse
_BAD_DEVICE_WORDS = ("expected one of cpu", "invalid device string", "device type at start of device string",
                     "invalid device, must be cuda device")
# torch refusing the caller's tensors for autograd (an inference-mode tensor used outside inference mode,
# where a gradient is recorded): the caller's mistake, which torch's own convolutions raise as RuntimeError too
_USER_TENSOR_WORDS = ("inference tensors cannot be saved for backward",
                      "inplace update to inference tensor outside inferencemode")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:500] if text else type(exc).__name__


_TORCH_RAISED = "_rawconv_torch_raised"


def as_torch_raised(exc: BaseException) -> BaseException:
    """``exc``, marked as torch's own answer to the caller (raised by torch's kernel that a
    :mod:`rawconv.nn` module fell back to): :func:`translate` lets it pass as it is."""
    try:
        setattr(exc, _TORCH_RAISED, True)
    except AttributeError:   # (an exception class with __slots__)
        pass
    return exc


def translate(exc: BaseException, where: str) -> RawconvError | None:
    """The rawconv error that means what ``exc`` (raised below ``where``, a public function's
    name) means, or None when ``exc`` must pass as it is (a rawconv error, a warning, a
    ``BaseException`` that is not an ``Exception``, an error of torch's kernel that a module fell
    back to: :func:`as_torch_raised`)."""
    if isinstance(exc, RawconvError) or isinstance(exc, Warning) or not isinstance(exc, Exception) \
            or getattr(exc, _TORCH_RAISED, False):
        return None
    if type(exc).__module__ == "torch.utils.checkpoint":
        # torch's checkpoint signals through rawconv's calls (its saved-tensor hooks run inside an
        # autograd Function's apply): _StopRecomputationError ends a recomputation early and must
        # reach checkpoint itself, CheckpointError is torch's own report
        return None
    msg = _first_line(exc)
    low = str(exc).lower()
    oom = getattr(torch, "OutOfMemoryError", None)
    if isinstance(exc, MemoryError) or (oom is not None and isinstance(exc, oom)) or \
            (isinstance(exc, RuntimeError) and any(w in low for w in _ALLOC_WORDS)):
        return AllocationError(f"{where}: out of memory: {msg}")
    if isinstance(exc, OverflowError):
        return AllocationError(f"{where}: sizes too large to allocate or address: {msg}")
    if isinstance(exc, (RuntimeError, AssertionError)) and any(w in low for w in _NO_DEVICE_WORDS):
        return DeviceNotAvailableError(f"{where}: no such device here: {msg}")
    if isinstance(exc, RuntimeError) and any(w in low for w in _BAD_DEVICE_WORDS):
        return ArgumentError(f"{where}: bad device: {msg}")
    if isinstance(exc, RuntimeError) and any(w in low for w in _USER_TENSOR_WORDS):
        return ArgumentError(f"{where}: {msg}")
    if isinstance(exc, OSError):
        name = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        err = FileAccessError(f"{where}: {exc.strerror or msg}{name}")
        err.errno, err.strerror, err.filename = exc.errno, exc.strerror, exc.filename
        return err
    if _raised_in_callers_code(exc):
        return None   # a hook or callback of the caller's raised it (a saved-tensor pack hook...): theirs, as it is
    return InternalError(f"{where}: unexpected {type(exc).__name__}: {msg} (not an error rawconv checks for: if the "
                         "arguments look right, please report it with this traceback)")


_LIBRARY_ROOTS = frozenset({"rawconv", "torch", "torchvision", "numpy", "cffi", "_cffi_backend", "pycparser",
                            "functorch", "sympy", "tqdm", "rich"})


_APPLY_SITES: set = set()   # code objects of rawconv's functions that apply an autograd Function


def applies_function(fn):
    """Mark ``fn`` (a rawconv function) as one that applies an autograd Function, whose apply runs
    the caller's saved-tensor hooks: an exception those hooks raise passes through rawconv's guard
    as it is (see :func:`_raised_in_callers_code`). Returns ``fn`` itself (no wrapper, no cost)."""
    _APPLY_SITES.add(fn.__code__)
    return fn


def _raised_in_callers_code(exc: BaseException) -> bool:
    """Whether ``exc`` was raised in a hook of the caller's that torch ran during rawconv's call:
    the innermost frame of its traceback belongs to a module that is neither rawconv, torch, a
    library they use, nor the standard library, and the frames before it are torch's (none from
    torch 2.14, whose ``Function.apply`` is C; torch's Python ``Function.apply`` before that)
    down to a rawconv function marked by :func:`applies_function` (an autograd Function's apply
    runs the saved-tensor hooks, e.g. a ``torch.autograd.graph.saved_tensors_hooks`` pack
    function). Such an exception passes through as it is, as torch lets it; code that rawconv
    itself called stays rawconv's to report."""
    import sys

    tb = exc.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    if len(frames) < 2:
        return False

    def root(frame) -> str:
        return (frame.f_globals.get("__name__") or "").split(".")[0]
    last = root(frames[-1])
    if not last or last in _LIBRARY_ROOTS or last in sys.stdlib_module_names:
        return False
    i = len(frames) - 2
    while i > 0 and root(frames[i]) == "torch":
        i -= 1
    return root(frames[i]) == "rawconv" and frames[i].f_code in _APPLY_SITES


def bad_call(fn, args, kwargs, exc: BaseException, where: str) -> ArgumentTypeError | None:
    """For a ``TypeError`` raised by calling ``fn(*args, **kwargs)``: an
    :class:`~rawconv.errors.ArgumentTypeError` (a ``TypeError``) when the arguments do not fit
    ``fn``'s signature (an unknown keyword, a missing or surplus argument: the caller's mistake,
    which Python reports before ``fn`` runs), else None (a ``TypeError`` raised inside ``fn``
    stays an internal error). Costs nothing until something raised."""
    if not isinstance(exc, TypeError) or isinstance(exc, RawconvError):
        return None
    import inspect

    try:
        sig = inspect.signature(fn)
    except ValueError:   # no signature to check against (a builtin)
        return None
    unknown = unknown_keywords(sig, kwargs, where)
    if unknown:
        return ArgumentTypeError(unknown)
    try:
        sig.bind(*args, **kwargs)
    except TypeError as bind_exc:
        return ArgumentTypeError(f"{where}: {bind_exc}")
    return None


# torch's (and other libraries') names for what rawconv's functions call otherwise
TORCH_NAMES = {"input": "x", "weight": "w", "grad_output": "grad_y", "input_size": "x_shape",
               "weight_size": "w_shape", "cudnn_benchmark": "benchmark", "cudnn_deterministic": "deterministic",
               "cudnn_enabled": "cudnn", "mkldnn_enabled": "mkldnn", "num_threads": "threads",
               "algorithm": "algo", "algo": "impl", "impl": "choice", "fpmath": "precision", "math": "precision"}


def unknown_keywords(sig, kwargs: dict, where: str) -> str:
    """A message for the keywords in ``kwargs`` that ``sig`` does not take ('' when there are none),
    each with what the caller may mean: the parameter of the same meaning under torch's name
    (``input`` -> ``x``, ``cudnn_benchmark`` -> ``benchmark``) or the closest names, ignoring case,
    then every keyword the function takes."""
    import inspect

    from .errors import close_names

    params = [n for n, p in sig.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return ""
    bad = [k for k in kwargs if k not in params]
    if not bad:
        return ""
    parts = []
    for k in bad:
        mean = TORCH_NAMES.get(k)
        near = [mean] if mean in params else close_names(k, params)
        parts.append(f"{k!r}" + (f" (did you mean {' or '.join(map(repr, near))}?)" if near else ""))
    kw_ok = [n for n in params if sig.parameters[n].kind != inspect.Parameter.POSITIONAL_ONLY]
    return (f"{where}: unexpected keyword argument{'s' if len(bad) > 1 else ''} {', '.join(parts)}; it takes: "
            f"{', '.join(kw_ok)}")


def public(fn=None, *, where: str | None = None):
    """Decorator: ``fn`` raises only rawconv's exception classes (see :func:`translate`). The
    wrapper costs one Python call frame; the original is ``wrapper.__wrapped__``."""
    if fn is None:
        return lambda f: public(f, where=where)
    name = where or f"{fn.__module__}.{fn.__qualname__}"

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RawconvError:
            raise
        except Exception as exc:
            new = bad_call(fn, args, kwargs, exc, name) or translate(exc, name)
            if new is None:
                raise
            raise new from exc

    wrapper.__rawconv_public__ = True
    return wrapper


def public_methods(*names: str, owner: str | None = None):
    """Class decorator: wrap the named methods (and properties' getters) of the class with
    :func:`public` (methods defined on the class itself; inherited ones are wrapped where defined).
    ``owner``: the public class's path the errors name (a mixin's methods: ``"rawconv.onednn.Convolution"``)."""
    def deco(cls):
        done = {}   # id(original) -> wrapper: aliases (__call__ = execute) stay one object
        for n in names:
            attr = cls.__dict__.get(n)
            if attr is None:
                continue
            where = f"{owner or cls.__module__ + '.' + cls.__qualname__}.{n}"
            if id(attr) in done:
                setattr(cls, n, done[id(attr)])
                continue
            if isinstance(attr, property):
                setattr(cls, n, property(public(attr.fget, where=where), attr.fset, attr.fdel, attr.__doc__))
            elif isinstance(attr, classmethod):
                setattr(cls, n, classmethod(public(attr.__func__, where=where)))
            elif isinstance(attr, staticmethod):
                setattr(cls, n, staticmethod(public(attr.__func__, where=where)))
            elif callable(attr) and not getattr(attr, "__rawconv_public__", False):
                setattr(cls, n, public(attr, where=where))
            done[id(attr)] = cls.__dict__[n]
        return cls
    return deco


# ---------------------------------------------------------------------------- out=
def _span(t: torch.Tensor):
    """(first byte, one past the last byte) of the memory ``t`` can touch; None when empty."""
    if t.numel() == 0:
        return None
    start = t.data_ptr()
    extent = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))
    return start, start + (extent + 1) * t.element_size()


def extent(t: torch.Tensor) -> int:
    """Bytes from ``t``'s first element to one past its last (0 when empty): with its shape and
    strides fixed, two tensors' overlap is decided by their data pointers alone."""
    span = _span(t)
    return 0 if span is None else span[1] - span[0]


def check_no_overlap(out: torch.Tensor, inputs) -> None:
    """``out`` must not share memory with an input (``inputs``: (name, tensor or None) pairs):
    implementations read their inputs while writing. Raises :class:`ArgumentError`."""
    so = _span(out)
    if so is None:
        return
    for name, t in inputs:
        if t is None or not isinstance(t, torch.Tensor) or t.device != out.device:
            continue
        st = _span(t)
        if st is not None and st[0] < so[1] and so[0] < st[1]:
            raise ArgumentError(f"out overlaps {name} in memory; pass a separate output tensor (or none)")


def check_out(out, inputs, fn: str) -> None:
    """torch's ``out=`` rules for ``out``, before anything is written (``fn``: the public
    function's name, for the message; ``inputs``: (name, tensor or None) pairs):

    * with grad mode on, neither ``out`` nor an input may require grad (torch: "functions with
      out=... arguments don't support automatic differentiation"): a leaf that requires grad
      is refused, as is any tensor of an autograd graph;
    * an inference tensor (made under ``torch.inference_mode``) only inside inference mode;
    * no memory shared with an input.

    Raises :class:`ArgumentTypeError` / :class:`ArgumentError`."""
    if not isinstance(out, torch.Tensor):
        raise ArgumentTypeError(f"{fn}: out must be a torch.Tensor or None, got {type(out).__name__}")
    if torch.is_grad_enabled():
        if out.requires_grad:
            what = "a leaf" if out.is_leaf else "part of an autograd graph"
            raise ArgumentError(f"{fn}(..., out=...): out requires grad ({what}); functions with out= do not "
                                "support automatic differentiation "
                                "(as torch's out= functions): pass a tensor that does not require grad, or call "
                                "under torch.no_grad()")
        for name, t in inputs:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                raise ArgumentError(f"{fn}(..., out=...): {name} requires grad; functions with out= do not support "
                                    "automatic differentiation (as torch's out= functions): call it without out=, "
                                    "under torch.no_grad(), or on detached tensors")
    if out.is_inference() and not torch.is_inference_mode_enabled():
        raise ArgumentError(f"{fn}(..., out=...): out is an inference tensor (made under torch.inference_mode) and "
                            "inference mode is off: torch allows no in-place update of it here (clone it first)")
    check_no_overlap(out, inputs)


bump = torch._C._increment_version   # bump((t,)): t's version counter, as torch's in-place ops do


def guard_module(namespace: dict, *names: str, where: str | None = None) -> None:
    """Wrap the public functions ``names`` of a module (``namespace``: its ``globals()``) with
    :func:`public`; ``"Class.method"`` wraps a method (or property, classmethod) of a class
    there. Called once at the end of each public module, so that every caller (other modules
    included) gets the wrapped function. ``where``: the module path errors name (default: the
    module's own; a part of a package face gives the face's, where its names are imported from)."""
    mod = where or namespace["__name__"]
    methods: dict = {}
    for n in names:
        cls_name, _, meth = n.partition(".")
        if meth:
            if meth not in namespace[cls_name].__dict__:
                raise AttributeError(f"{mod}.{n} is not defined there (guard_module)")
            methods.setdefault(cls_name, []).append(meth)
        else:
            fn = namespace[n]
            if not getattr(fn, "__rawconv_public__", False):
                namespace[n] = public(fn, where=f"{mod}.{n}")
    for cls_name, meths in methods.items():   # one pass per class: aliases (__call__ = execute) stay one object
        public_methods(*meths)(namespace[cls_name])


def stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` made by the caller that points at the first frame
    outside the rawconv package (the user's line), however many rawconv frames (wrappers
    included) lie between."""
    import sys

    f = sys._getframe(1)   # the function about to call warnings.warn: stacklevel 1
    level = 1
    while f is not None and (f.f_globals.get("__name__", "") == "rawconv"
                             or f.f_globals.get("__name__", "").startswith("rawconv.")):
        f = f.f_back
        level += 1
    return level


# ---------------------------------------------------------------------------- memory
def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_memory() -> int | None:
    """Bytes this process may still allocate on the host, as far as Linux says: ``MemAvailable``
    of /proc/meminfo, capped by the cgroup's memory limit minus its usage (v2 ``memory.max`` /
    ``memory.current``, v1 ``memory.limit_in_bytes`` / ``memory.usage_in_bytes``). None when
    neither can be read (not Linux)."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    for limit_path, usage_path in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is not None and usage is not None and limit < 2 ** 60:
            room = max(limit - usage, 0)
            avail = room if avail is None else min(avail, room)
            break
    return avail


def _gib(n: float) -> str:
    return f"{n / 2 ** 30:.1f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.0f} MiB"


def check_memory(nbytes: int, what: str) -> None:
    """Raise :class:`~rawconv.errors.AllocationError` (a ``MemoryError``) before allocating
    ``nbytes`` of host memory for ``what`` when the host has less available
    (:func:`available_memory`): Linux overcommits, so such an allocation could otherwise succeed
    and the process be killed (SIGKILL, no message) when the memory is touched."""
    avail = available_memory()
    if avail is not None and nbytes > avail:
        raise AllocationError(f"{what} needs about {_gib(nbytes)} of memory; this host has {_gib(avail)} available "
                              "(MemAvailable, cgroup limit): a smaller problem, or a machine with more memory")
