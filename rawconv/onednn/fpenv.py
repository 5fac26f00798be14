"""Raw: the x86 floating-point environment (MXCSR's FTZ and DAZ bits) of every OpenMP thread
oneDNN runs on. No torch here.

oneDNN's JIT kernels compute with SSE/AVX instructions, which read the MXCSR register of the
thread they run on: FTZ (flush-to-zero) turns subnormal results into zero, DAZ
(denormals-are-zero) reads subnormal inputs as zero. Each thread has its own MXCSR: setting it on
the calling thread (what ``torch.set_flush_denormal`` does) leaves the OpenMP worker threads of
oneDNN's parallel regions as they were. :func:`set_flush` runs glibc's ``fesetenv`` on every
thread of one OpenMP parallel region of the OpenMP runtime the loaded libdnnl uses (its
``GOMP_parallel``, found through libdnnl's own dependencies), so master and workers all get the
same setting; threads OpenMP creates later copy the creating (master) thread's setting, as POSIX
threads inherit the floating-point environment.

The environment broadcast is the calling thread's (``fegetenv``: x87 control word, rounding mode,
exception masks, MXCSR) with MXCSR's FTZ and DAZ bits set or cleared and the exception flags
cleared: glibc's x86-64 ``fenv_t`` is the 28-byte x87 ``fnstenv`` image followed by MXCSR (32
bytes), checked at first use against the MXCSR the calling thread reports.
"""
from __future__ import annotations

import os
import platform
import threading

import cffi

from ..core.errors import NotSupportedError

ffi = cffi.FFI()
ffi.cdef("""
void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
int omp_get_max_threads(void);
int fesetenv(const void *envp);
int fegetenv(void *envp);
""")

FENV_BYTES, MXCSR_OFFSET, STATUS_OFFSET = 32, 28, 4   # glibc x86-64 fenv_t
MXCSR_FTZ, MXCSR_DAZ, MXCSR_FLAGS = 0x8000, 0x0040, 0x003F

_lock = threading.Lock()
_state: dict = {}


def _libs(dnnl_path: str):
    """(libdnnl opened by this FFI, libm); GOMP_parallel is looked up through libdnnl's handle, so
    it is the OpenMP runtime libdnnl itself resolved, not another copy."""
    libs = _state.get(dnnl_path)
    if libs is None:
        with _lock:
            libs = _state.get(dnnl_path)
            if libs is None:
                if platform.machine().lower() not in ("x86_64", "amd64"):
                    raise NotSupportedError(f"flushing denormals is implemented for x86-64 (MXCSR), not "
                                            f"{platform.machine()}")
                try:
                    dnnl = ffi.dlopen(dnnl_path)
                    libm = ffi.dlopen("libm.so.6")
                    parallel = dnnl.GOMP_parallel
                    max_threads = dnnl.omp_get_max_threads
                    fesetenv = ffi.cast("void (*)(void *)", ffi.addressof(libm, "fesetenv"))
                except (OSError, AttributeError) as exc:
                    raise NotSupportedError(f"the loaded oneDNN ({dnnl_path}) runs no GNU OpenMP runtime rawconv can "
                                            f"reach (GOMP_parallel) or libm has no fesetenv: {exc}") from None
                libs = _state[dnnl_path] = (dnnl, libm, parallel, max_threads, fesetenv)
    return libs


def _env(libm) -> "object":
    buf = ffi.new(f"unsigned char[{FENV_BYTES}]")
    if libm.fegetenv(buf) != 0:
        raise NotSupportedError("fegetenv failed: the floating-point environment cannot be read here")
    return buf


def mxcsr(dnnl_path: str) -> int:
    """The calling thread's MXCSR, read through ``fegetenv``."""
    _dnnl, libm, *_ = _libs(dnnl_path)
    return int(ffi.cast("unsigned int *", _env(libm) + MXCSR_OFFSET)[0])


def set_flush(dnnl_path: str, on: bool, threads: int) -> int:
    """Set FTZ and DAZ on (``on``) or off on every thread of an OpenMP parallel region of
    ``threads`` threads (at least the runtime's ``omp_get_max_threads()`` and the CPU count, so
    that idle threads a larger team made earlier are reached too) of the calling thread's team,
    master included. Returns the number of threads asked for. Raises
    :class:`NotSupportedError` off x86-64 or without a GNU OpenMP runtime in libdnnl's reach."""
    _dnnl, libm, parallel, max_threads, fesetenv = _libs(dnnl_path)
    n = max(int(threads), int(max_threads()), os.cpu_count() or 1, 1)   # every thread the team may already hold
    env = _env(libm)
    word = ffi.cast("unsigned int *", env + MXCSR_OFFSET)
    if word[0] & 0x1F80 != 0x1F80 or word[0] >> 16:
        # the default masks are all set (0x1f80): anything else means the layout is not the one assumed
        raise NotSupportedError(f"unexpected floating-point environment layout (MXCSR read as {word[0]:#x}): "
                                "refusing to set it on oneDNN's threads")
    word[0] = (word[0] | MXCSR_FTZ | MXCSR_DAZ) if on else (word[0] & ~(MXCSR_FTZ | MXCSR_DAZ) & 0xFFFF)
    word[0] = word[0] & ~MXCSR_FLAGS
    ffi.cast("unsigned short *", env + STATUS_OFFSET)[0] = 0   # no x87 exception flags either
    parallel(fesetenv, env, n, 0)
    return n
