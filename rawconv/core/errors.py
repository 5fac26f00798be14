"""Exceptions raised by rawconv.

Every error rawconv raises derives from :class:`RawconvError`. Bad arguments also derive from
:class:`ValueError` / :class:`TypeError`, so ordinary ``except ValueError`` code keeps working;
:class:`ArgumentError` is also a :class:`RuntimeError`, the class torch's convolutions raise for
bad shapes, strides and dtypes, so code written for torch (``except RuntimeError``) catches it too.
"""
from __future__ import annotations


class RawconvError(Exception):
    """Base class of every rawconv error."""


class ArgumentError(RawconvError, ValueError, RuntimeError):
    """An argument is wrong (shape, dtype, device, groups, padding...). Raised before any C call.

    Both a :class:`ValueError` and a :class:`RuntimeError`: torch's convolutions raise
    ``RuntimeError`` for what rawconv checks here (an input smaller than the kernel, a channel
    count the weight does not expect, mixed dtypes) and ``ValueError`` for some module arguments
    (``output_size``), so ``except`` clauses written for either keep working."""


class ArgumentTypeError(RawconvError, TypeError):
    """An argument has the wrong Python type. Raised before any C call."""


class LibraryNotFoundError(RawconvError, OSError):
    """A native library (libdnnl, libcudnn) could not be loaded; the message lists every attempt."""

    def __init__(self, library: str, attempts: list[tuple[str, str]]):
        self.library = library
        self.attempts = list(attempts)
        lines = [f"could not load {library}; tried, in order:"]
        lines += [f"  - {where}: {why}" for where, why in self.attempts]
        super().__init__("\n".join(lines))


class LibraryError(RawconvError, RuntimeError):
    """A library call returned an error status.

    Attributes: ``library`` ("oneDNN" or "cuDNN"), ``function`` (the C function), ``status``
    (the integer status), ``status_name`` (e.g. ``"dnnl_invalid_arguments"``), ``detail`` (the
    library's own last-error text, when it has one).
    """

    def __init__(self, library: str, function: str, status: int, status_name: str,
                 detail: str = "", hint: str = ""):
        self.library = library
        self.function = function
        self.status = int(status)
        self.status_name = status_name
        self.detail = detail
        self.hint = hint
        msg = f"{function} failed: {status_name} ({self.status})"
        if detail:
            msg += f": {detail}"
        if hint:
            msg += f" [{hint}]"
        super().__init__(msg)


class NotSupportedError(LibraryError):
    """The library does not offer this algorithm / implementation / engine for this problem.

    Raised both when the library says so (``dnnl_unimplemented``, ``CUDNN_STATUS_NOT_SUPPORTED``)
    and when rawconv knows before calling (a forced implementation absent from the list).
    ``offered`` lists what the library does offer, when known.
    """

    def __init__(self, message: str, *, library: str = "", function: str = "", status: int = 0,
                 status_name: str = "", detail: str = "", offered: list | None = None):
        self.offered = list(offered or [])
        RuntimeError.__init__(self, message)
        self.library, self.function, self.status = library, function, int(status)
        self.status_name, self.detail, self.hint = status_name, detail, ""

    def __str__(self) -> str:  # RuntimeError's str is the message
        return self.args[0]


class KnownBadError(NotSupportedError):
    """A forced implementation is listed in :mod:`rawconv.known_bad` for this problem: the library
    is known to crash, hang or give wrong results there. Raised before any C call that would run
    it; pass ``allow_known_bad=True`` to run it anyway (best in a child process: ``isolate=True``).

    ``entry``: the :class:`rawconv.known_bad.KnownBad` row; ``link``: its public issue (or the
    rawconv test that found it); ``implementation``: the candidate's name.
    """

    def __init__(self, message: str, *, entry=None, implementation: str = "", library: str = "",
                 offered: list | None = None):
        super().__init__(message, library=library, offered=offered)
        self.entry = entry
        self.implementation = implementation
        self.link = getattr(entry, "link", "") or ""


class IsolationError(RawconvError, RuntimeError):
    """The child process that runs candidates in isolation (:mod:`rawconv._isolate`) could not be
    started or did not answer as it should (not a crash of a candidate: that becomes a row status)."""


class AllocationError(RawconvError, MemoryError):
    """Memory for a tensor or buffer rawconv allocates (an output, a layout copy, a reorder
    buffer, a scratchpad, a workspace) could not be had: torch's allocator raised
    (``torch.OutOfMemoryError``, or ``RuntimeError: ... can't allocate memory``) or the problem's
    sizes overflow. A ``MemoryError``, so ``except MemoryError`` code keeps working. The message
    says what was being done; the allocator's own error is chained (``__cause__``)."""


class DeviceNotAvailableError(RawconvError, RuntimeError):
    """The device a call needs is not there: CUDA tensors or a CUDA problem where torch sees no
    GPU (no driver, a CPU build of torch), or a device index beyond the GPUs torch sees."""


class InternalError(RawconvError, RuntimeError):
    """Something rawconv did not expect went wrong below a public function (a bug: please report
    it with the chained exception, ``__cause__``). Raised instead of the raw exception so that
    every public function raises only :class:`RawconvError` subclasses."""


class SlowReferenceWarning(UserWarning):
    """The call about to run will run on oneDNN's reference implementation (``ref:*``, a scalar
    loop) and is estimated to take longer than :data:`rawconv.onednn.plan.SLOW_REFERENCE_SECONDS`
    (:func:`rawconv.onednn.reference_seconds`). Issued before the call; the call still runs."""


class TorchFallbackWarning(RuntimeWarning):
    """A :mod:`rawconv.nn` module ran a call on torch's own kernel because no rawconv library can
    run it (float64 or complex on the CPU, float16 / bfloat16 where this CPU's oneDNN offers none,
    another device than CPU and CUDA...). Issued once per reason per process; the calls are
    counted (``rawconv.nn.torch_fallbacks()``) and named by ``describe()`` and ``convert``'s
    report. A module with a pinned ``choice`` or ``fallback="error"`` raises instead."""


class FileAccessError(RawconvError, OSError):
    """A file rawconv was asked to write (or read) could not be: disk full, permission denied, a
    directory... The OS's error is chained (``__cause__``); ``errno`` and ``filename`` are kept."""

    def __str__(self) -> str:   # the message as given (OSError's str would put errno and filename around it)
        return str(self.args[0]) if self.args else ""


def close_names(name: str, names, n: int = 3) -> list[str]:
    """Up to ``n`` of ``names`` closest to ``name``, ignoring case (``difflib``): the "did you mean"
    of an unknown keyword or a choice a library does not offer."""
    import difflib

    names = list(dict.fromkeys(names))
    lower = {}
    for c in names:
        lower.setdefault(c.lower(), c)
    exact = [c for c in names if c.lower() == name.lower() and c != name]
    if exact:   # the same name in another case: that one
        return exact[:n]
    return [lower[c] for c in difflib.get_close_matches(name.lower(), list(lower), n=n, cutoff=0.6)]
