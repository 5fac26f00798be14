"""Raw oneDNN binding: the FFI, the loader, status checks, and descriptor helpers.

No torch semantics here; names follow the oneDNN C API (``cdefs/dnnl.h``, oneDNN 3.2).
The library is loaded on first use, under a lock. ``$RAWCONV_DNNL_LIBRARY`` (an explicit path),
when set, is the only candidate: if it does not load (or is not oneDNN) that is an error naming
the path and the loader's message, never a silent fall-back to another copy. Otherwise, in order:

1. ``<prefix>/lib/libdnnl.so.3`` for ``sys.prefix`` and the venv base (where the
   ``onednn-cpu-gomp`` wheel puts it), and ``<site-packages>/../../../lib`` for ``--target`` installs,
2. the system loader (``libdnnl.so.3``).

``$RAWCONV_DNNL_LIBRARY`` may also name an installed build instead of a path (:data:`BUILDS`,
:func:`builds`): ``onednn-cpu-gomp`` (the default, oneDNN 3.2), ``paddlepaddle`` (the libdnnl that
the paddlepaddle wheel ships, oneDNN 3.6 in paddlepaddle 3.3, GNU OpenMP like the default) or
``onednn`` (the DPC++ ``onednn`` wheels 2024.0-2026.1, oneDNN 3.3-3.13, whose SYCL, TBB and Intel
compiler runtimes are loaded from the library's own folder first: :func:`_preload_runtime`).
"""
from __future__ import annotations

import glob
import os
import threading
from pathlib import Path

import cffi

from ..core import env as _env, loader as _loader
from ..core.errors import LibraryError, NotSupportedError

SONAME = "libdnnl.so.3"
ENV_VAR = "RAWCONV_DNNL_LIBRARY"
# oneDNN 3.2 prints its reasons for rejected arguments ("onednn_verbose,create:check,...") when
# ONEDNN_VERBOSE holds "check" (or "all") as it reads the variable, once, at its first use;
# dnnl_set_verbose (rawconv.onednn.verbose) takes only the levels 0-2, which do not include them.
HINT = ("set ONEDNN_VERBOSE=check (or all) in the environment before the process starts: oneDNN then "
        "prints its own reason on the C stdout as an 'onednn_verbose,create:check,...' line")

ffi = cffi.FFI()
ffi.cdef(_loader.cdefs_text("dnnl.h"))

_lock = threading.Lock()
_state: dict = {}


#: the installed oneDNN builds ``$RAWCONV_DNNL_LIBRARY`` can name: name -> (what it is, file patterns
#: relative to each prefix's ``lib`` ("lib:...") or to each site-packages folder ("site:..."))
BUILDS = {
    "onednn-cpu-gomp": ("oneDNN 3.2 of the onednn-cpu-gomp 2023.2.0 wheel (GNU OpenMP; rawconv's default)",
                        ("lib:libdnnl.so.3.2", "lib:libdnnl.so.3")),
    "paddlepaddle": ("the libdnnl.so.3 the paddlepaddle wheel ships (oneDNN 3.6.2 in paddlepaddle 3.3.1; GNU OpenMP)",
                     ("site:paddle/libs/libdnnl.so.3",)),
    "onednn": ("the DPC++ onednn wheel (2024.0-2026.1: oneDNN 3.3-3.13; SYCL CPU runtime, needs its "
               "intel-sycl-rt, tbb, intel-cmplr-lib-rt and intel-opencl-rt dependencies)",
               ("lib:libdnnl.so.3.[0-9][0-9]", "lib:libdnnl.so.3.[3-9]")),
}


def build_paths(name: str) -> list[str]:
    """The files a :data:`BUILDS` name may be, in search order, existing ones only (newest
    version suffix first where a pattern matches several)."""
    _what, pats = BUILDS[name]
    out: list[str] = []
    for pat in pats:
        kind, rel = pat.split(":", 1)
        roots = [p / "lib" for p in _loader.prefixes()] if kind == "lib" else _loader.site_dirs()
        if kind == "lib":
            roots += [s.parent.parent.parent / "lib" for s in _loader.site_dirs()]
        for root in roots:
            found = sorted(glob.glob(str(root / rel)), key=lambda f: [int(v) for v in f.rsplit(".so.", 1)[-1].split(".")
                                                                    if v.isdigit()], reverse=True)
            for f in found:
                f = str(Path(f).resolve())
                if f not in out:
                    out.append(f)
    return out


def builds() -> list[dict]:
    """Every :data:`BUILDS` name with what it is and the files found for it (``paths``; empty
    when that build is not installed). No library is loaded: ``RAWCONV_DNNL_LIBRARY=<name>``
    picks one for the next process, ``rawconv info`` then reports its version."""
    return [{"name": n, "what": what, "paths": build_paths(n)} for n, (what, _p) in BUILDS.items()]


# what a DPC++ build of libdnnl needs besides itself, in dependency order (sonames); each one present
# in the library's own folder is loaded from there first (RTLD_GLOBAL), as LD_LIBRARY_PATH would
_DPCPP_RUNTIME = ("libintlc.so.5", "libsvml.so", "libirng.so", "libimf.so", "libtbb.so.12", "libOpenCL.so.1",
                  "libsycl.so.[0-9]*")
_PRELOADED: list = []


def _preload_runtime(path: str) -> list[str]:
    """Load the SYCL/TBB/compiler runtime libraries found next to ``path`` (a DPC++ build's folder,
    as the ``onednn`` wheel and its dependencies install them) so that libdnnl's own dependencies
    resolve without ``LD_LIBRARY_PATH``; also point ``OCL_ICD_FILENAMES`` at that folder's
    ``libintelocl.so`` (the CPU OpenCL device its SYCL CPU engine needs) unless it is set. Nothing
    happens for a folder without ``libsycl.so.*``. Returns the files loaded."""
    folder = os.path.dirname(os.path.abspath(path))
    if not glob.glob(os.path.join(folder, "libsycl.so.[0-9]*")):
        return []
    done = []
    for soname in _DPCPP_RUNTIME:
        for f in sorted(glob.glob(os.path.join(folder, soname)))[:1]:
            try:
                _PRELOADED.append(ffi.dlopen(f, ffi.RTLD_NOW | ffi.RTLD_GLOBAL))
                done.append(f)
            except OSError:
                pass
    ocl = os.path.join(folder, "libintelocl.so")
    if os.path.exists(ocl) and not os.environ.get("OCL_ICD_FILENAMES"):
        os.environ["OCL_ICD_FILENAMES"] = ocl
    return done


def candidates() -> list[tuple[str, str]]:
    """The ``(how, path)`` search list, in order (see the module docstring): only
    ``$RAWCONV_DNNL_LIBRARY`` when it is set (a path, or a :data:`BUILDS` name: its files)."""
    out: list[tuple[str, str]] = []
    env = _env.get(ENV_VAR)
    if env:
        if os.sep not in env and env in BUILDS:
            paths = build_paths(env)
            if not paths:   # not installed: the places looked at, each recorded as "no such file"
                paths = [str(root / pat.split(":", 1)[1]) for pat in BUILDS[env][1] for root in
                         ([p / "lib" for p in _loader.prefixes()] if pat.startswith("lib:") else _loader.site_dirs())]
            return [(f"${ENV_VAR}={env} ({BUILDS[env][0]})", p) for p in paths]
        return [(f"${ENV_VAR}", env)]
    seen = set()
    for pre in _loader.prefixes():
        p = str(pre / "lib" / SONAME)
        if p not in seen:
            seen.add(p)
            out.append(("onednn-cpu-gomp wheel (sys.prefix/lib)", p))
    for site in _loader.site_dirs():
        # pip install --target DIR puts data files in DIR/lib next to the packages
        for cand in (site / "lib" / SONAME, site.parent.parent.parent / "lib" / SONAME):
            p = str(cand)
            if p not in seen:
                seen.add(p)
                out.append(("onednn-cpu-gomp wheel (next to site-packages)", p))
    out.append(("system loader", SONAME))
    return out


def _mapped_path(soname: str) -> str | None:
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if line.rstrip().endswith(soname) or f"/{soname}" in line:
                    return line.split(None, 5)[-1].strip()
    except OSError:
        pass
    return None


def load() -> _loader.Loaded:
    """Load libdnnl (once per process, thread-safe) and return what was loaded.

    Raises :class:`~rawconv.errors.LibraryNotFoundError` listing every attempt with the
    dynamic loader's message; with ``$RAWCONV_DNNL_LIBRARY`` set, the one attempt at that path.
    """
    loaded = _state.get("loaded")
    if loaded is not None:
        return loaded
    with _lock:
        loaded = _state.get("loaded")
        if loaded is None:
            # no torch here (raw layer): rawconv.onednn imports torch before any load, so that torch's
            # libgomp.so.1 is the OpenMP runtime libdnnl binds to (one OpenMP pool per process)
            cands = candidates()
            label = "oneDNN (libdnnl.so.3)"
            if cands[0][0].startswith(f"${ENV_VAR}"):
                label = _loader.explicit_label(label, ENV_VAR, _env.get(ENV_VAR))
                for _how, p in cands:
                    if os.sep in p and os.path.exists(p):
                        _preload_runtime(p)
            loaded = _loader.try_load(ffi, label, cands, symbol="dnnl_version")
            if os.sep not in loaded.path:
                loaded.path = _mapped_path(SONAME) or loaded.path
            else:
                loaded.path = str(Path(loaded.path).resolve())
            _state["loaded"] = loaded
    return loaded


def lib():
    """The cffi library object (loads on first call)."""
    loaded = _state.get("loaded")
    return (loaded or load()).lib


def status_name(status: int) -> str:
    """``dnnl_status_t`` name for an integer status, from the declarations alone."""
    return ffi.string(ffi.cast("dnnl_status_t", status))


def unimplemented_hint() -> str:
    """The hint of a ``dnnl_unimplemented`` error. oneDNN 3.2 says nothing about it, whatever
    ONEDNN_VERBOSE holds: its convolutions have no dispatch messages (the library's strings
    hold "create:check" lines for bad arguments only). So the hint names what can tell:
    :func:`rawconv.onednn.capabilities`, with the version and the effective ISA."""
    try:
        ver, isa = version()["version"], effective_cpu_isa()
    except Exception:  # noqa: BLE001  (a hint must never raise)
        ver, isa = "?", "?"
    text = f"oneDNN {ver} on CPU ISA {isa}; rawconv.onednn.capabilities() shows which dtypes and fpmath modes it offers here"
    if ver.startswith("3.2."):
        return text + " (oneDNN 3.2 prints no reason for dnnl_unimplemented, even with ONEDNN_VERBOSE=all)"
    return text + "; ONEDNN_VERBOSE=dispatch, set before the process starts, may print oneDNN's reasons on the C stdout"


_OMP: list = []


def omp_thread_controls():
    """``(omp_get_max_threads, omp_set_num_threads)`` of the OpenMP runtime libdnnl runs on, or None
    when libdnnl is not an OpenMP build (``dnnl_version().cpu_runtime``) or the symbols are not
    found. The symbols are looked up through libdnnl's own handle (``dlsym`` searches its
    dependencies), so they are those of the very runtime its parallel regions use (torch's
    ``libgomp.so.1`` when torch was imported first). ``omp_set_num_threads`` sets the calling
    thread's value only (OpenMP's ``nthreads-var`` is per task). Cached after the first call."""
    if _OMP:
        return _OMP[0]
    controls = None
    try:
        L = lib()
        if int(L.dnnl_version().cpu_runtime) == 2:   # DNNL_RUNTIME_OMP
            omp = cffi.FFI()
            omp.cdef("int omp_get_max_threads(void); void omp_set_num_threads(int);")
            h = omp.dlopen(_state["loaded"].path)
            controls = (h.omp_get_max_threads, h.omp_set_num_threads, h, omp)
    except Exception:  # noqa: BLE001  (no OpenMP runtime to ask: callers then leave the thread count alone)
        controls = None
    _OMP.append(controls)
    return controls


_LIBC: dict = {}


def flush_c_stdout() -> None:
    """``fflush(NULL)``: write out what oneDNN printed on the C stdout (its verbose lines). Through
    a pipe the C stdout is block-buffered and oneDNN does not flush it, so its lines would
    otherwise appear only at exit, after everything Python printed, or never if the process is
    killed. Called before every error :func:`check` raises."""
    try:
        f = _LIBC.get("fflush")
        if f is None:
            cffi_c = cffi.FFI()
            cffi_c.cdef("int fflush(void *stream);")
            c = cffi_c.dlopen(None)
            f = _LIBC["fflush"] = (c.fflush, cffi_c.NULL, c, cffi_c)
        f[0](f[1])
    except Exception:  # noqa: BLE001  (no C library to flush: nothing is buffered there either)
        pass


def check(status: int, function: str, detail: str = "") -> None:
    """Raise for a non-success ``dnnl_status_t``: :class:`NotSupportedError` for
    ``dnnl_unimplemented``, :class:`LibraryError` otherwise (status name, C function, hint).
    Flushes the C stdout first (:func:`flush_c_stdout`), so that oneDNN's verbose lines about
    the failure come out before the error."""
    if status == 0:
        return
    flush_c_stdout()
    name = status_name(status)
    if status == lib().dnnl_unimplemented:
        raise NotSupportedError(
            f"{function} failed: {name} ({status}): oneDNN offers no implementation"
            + (f" for {detail}" if detail else "") + f" [{unimplemented_hint()}]",
            library="oneDNN", function=function, status=status, status_name=name, detail=detail)
    raise LibraryError("oneDNN", function, status, name, detail, HINT)


def call(function: str, *args, detail: str = ""):
    """Call ``lib().<function>(*args)`` and check its status."""
    check(getattr(lib(), function)(*args), function, detail)


# ------------------------------------------------------------------ global objects
def engine():
    """The process's CPU engine (created once). Wraps ``dnnl_engine_create``."""
    eng = _state.get("engine")
    if eng is None:
        with _lock:
            eng = _state.get("engine")
            if eng is None:
                L = lib()
                p = ffi.new("dnnl_engine_t *")
                call("dnnl_engine_create", p, L.dnnl_cpu, 0)
                eng = p[0]  # lives for the whole process: never destroyed (atexit order is unreliable)
                _state["engine"] = eng
    return eng



def _destroyer(name: str):
    """``lib().<name>`` (a ``dnnl_*_destroy`` function) resolved now, for ``ffi.gc``: its callback may
    run at interpreter exit, when cffi can no longer resolve a library function lazily (its
    modules' globals are gone: "Exception ignored from callback for ffi.gc ... 'NoneType' object
    is not callable"); a resolved function is called directly."""
    f = _DESTROYERS.get(name)
    if f is None:
        f = _DESTROYERS[name] = getattr(lib(), name)
    return f


_DESTROYERS: dict = {}

_tls = threading.local()


def stream():
    """This thread's CPU stream on :func:`engine` (oneDNN streams are not thread-safe).
    Wraps ``dnnl_stream_create``."""
    s = getattr(_tls, "stream", None)
    if s is None:
        L = lib()
        p = ffi.new("dnnl_stream_t *")
        call("dnnl_stream_create", p, engine(), L.dnnl_stream_default_flags)
        s = ffi.gc(p[0], _stream_destroy)
        _tls.stream = s
    return s


def _stream_destroy(s, _lib=None):
    try:
        lib().dnnl_stream_destroy(s)
    except Exception:  # interpreter shutdown
        pass


# ------------------------------------------------------------------ memory descriptors
_MD_DTYPES = {"float32": "dnnl_f32", "float16": "dnnl_f16", "bfloat16": "dnnl_bf16", "float64": "dnnl_f64",
              "uint8": "dnnl_u8"}


def data_type(name: str) -> int:
    return getattr(lib(), _MD_DTYPES[name])


def _md_gc(md):
    return ffi.gc(md, _destroyer("dnnl_memory_desc_destroy"))


def md_strides(dims, dtype: str, strides) -> object:
    """A memory descriptor with explicit strides (in elements). Wraps
    ``dnnl_memory_desc_create_with_strides``."""
    p = ffi.new("dnnl_memory_desc_t *")
    call("dnnl_memory_desc_create_with_strides", p, len(dims), list(dims), data_type(dtype), list(strides),
         detail=f"dims {tuple(dims)} strides {tuple(strides)}")
    return _md_gc(p[0])


def md_tag(dims, dtype: str, tag: str = "any") -> object:
    """A memory descriptor with a format tag (``"any"``, ``"nchw"``, ``"x"``...). Wraps
    ``dnnl_memory_desc_create_with_tag``."""
    L = lib()
    t = L.dnnl_format_tag_any if tag == "any" else getattr(L, "dnnl_" + tag)
    p = ffi.new("dnnl_memory_desc_t *")
    call("dnnl_memory_desc_create_with_tag", p, len(dims), list(dims), data_type(dtype), t,
         detail=f"dims {tuple(dims)} tag {tag}")
    return _md_gc(p[0])


def md_clone(md) -> object:
    """An owned copy of a (borrowed) memory descriptor. Wraps ``dnnl_memory_desc_clone``."""
    p = ffi.new("dnnl_memory_desc_t *")
    call("dnnl_memory_desc_clone", p, md)
    return _md_gc(p[0])


def md_size(md) -> int:
    """Bytes needed by a buffer of this descriptor. Wraps ``dnnl_memory_desc_get_size``."""
    return int(lib().dnnl_memory_desc_get_size(md))


def md_equal(a, b) -> bool:
    """Wraps ``dnnl_memory_desc_equal``."""
    return bool(lib().dnnl_memory_desc_equal(a, b))


def md_query_int(md, what: str) -> int:
    L = lib()
    out = ffi.new("int *")
    call("dnnl_memory_desc_query", md, getattr(L, "dnnl_query_" + what), out)
    return int(out[0])


def md_query_dims(md, what: str) -> list[int]:
    L = lib()
    out = ffi.new("dnnl_dims_t **")
    call("dnnl_memory_desc_query", md, getattr(L, "dnnl_query_" + what), out)
    return [int(v) for v in out[0][0]]


def md_format(md) -> str:
    """The layout as oneDNN's verbose mode writes it: ``"abcd"`` (nchw), ``"acdb"`` (nhwc),
    ``"aBcd16b"`` (blocked), ``"any"``, ``"undef"``. Built from ``dnnl_memory_desc_query``."""
    L = lib()
    if md == ffi.NULL:
        return "undef"
    kind = md_query_int(md, "format_kind")
    if kind == L.dnnl_format_kind_any:
        return "any"
    if kind != L.dnnl_blocked:
        return ffi.string(L.dnnl_fmt_kind2str(kind)).decode()
    nd = md_query_int(md, "ndims_s32")
    if nd == 0:
        return "undef"
    strides = md_query_dims(md, "strides")[:nd]
    nblks = md_query_int(md, "inner_nblks_s32")
    blks = md_query_dims(md, "inner_blks")[:nblks]
    idxs = md_query_dims(md, "inner_idxs")[:nblks]
    letters = "abcdefghijkl"
    order = sorted(range(nd), key=lambda i: (-strides[i], i))
    blocked = set(idxs)
    out = "".join(letters[i].upper() if i in blocked else letters[i] for i in order)
    out += "".join(f"{b}{letters[i]}" for b, i in zip(blks, idxs))
    return out


def md_data_type(md) -> str:
    L = lib()
    return ffi.string(L.dnnl_dt2str(md_query_int(md, "data_type"))).decode()


# ------------------------------------------------------------------ primitive descriptors
def pd_impl_name(pd) -> str:
    """The implementation name oneDNN reports (``dnnl_query_impl_info_str``), e.g. ``brgconv:avx512_core``."""
    out = ffi.new("const char **")
    call("dnnl_primitive_desc_query", pd, lib().dnnl_query_impl_info_str, 0, out)
    return ffi.string(out[0]).decode()


def pd_md(pd, what: str, index: int = 0):
    """A borrowed memory descriptor of a primitive descriptor (``dnnl_primitive_desc_query_md``);
    NULL-like (format undef) when the primitive has none."""
    L = lib()
    return L.dnnl_primitive_desc_query_md(pd, getattr(L, f"dnnl_query_{what}_md"), index)


def pd_clone(pd):
    """An owned copy of the current implementation of an iterator. Wraps ``dnnl_primitive_desc_clone``."""
    p = ffi.new("dnnl_primitive_desc_t *")
    call("dnnl_primitive_desc_clone", p, pd)
    return ffi.gc(p[0], _destroyer("dnnl_primitive_desc_destroy"))


def pd_gc(raw):
    return ffi.gc(raw, _destroyer("dnnl_primitive_desc_destroy"))


class _CacheGuard:
    """oneDNN's primitive cache against emptying it (:func:`flush_primitive_cache`,
    ``rawconv.clear_caches``) while a primitive descriptor iterator or a primitive creation reads it.

    oneDNN 3.2's iterator (``dnnl_*_primitive_desc_create``, ``dnnl_primitive_desc_next_impl``)
    hands out, for an implementation whose primitive the cache holds, the cached primitive's own
    descriptor, which the cache owns: emptied before ``dnnl_primitive_desc_clone`` copies it, the
    copy is made from freed memory. Measured (2026-12-07, AVX-512 EPYC): the clone of a conv + ReLU
    descriptor lost its post-ops (a fused model's calls returned results without their ReLU,
    ``convert(fuse=True)`` in 2 threads with ``clear_caches`` in a third: 7 of 313 calls), or the
    next ``dnnl_primitive_create`` crashed; deterministic with the cache emptied between
    ``next_impl`` and the clone. ``with _cache_guard:`` spans such a section (sections of several
    threads run at once); :meth:`exclusive` runs a change of the cache's capacity when none runs.
    Descriptors listed before an emptying stay unsafe after it: a conv + ReLU descriptor the
    iterator took from the cache, its primitive created after the cache was emptied, computed
    without its ReLU (10 of 300 plans, one thread) or crashed (``dnnl_primitive_create``,
    segfault, 2 building threads and a third flushing: 2 of 2 runs within 8 s). So every emptying
    counts :attr:`generation`, and a plan lists its descriptors again before it creates a
    primitive from descriptors listed in an older generation (``Listing._fresh_pd``, run in a
    section, where no emptying can come between the check and the creation)."""

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._readers = {}   # thread ident -> its sections running (nested ones counted)
        #: how many times the cache was emptied or its capacity changed (changed by :meth:`exclusive`)
        self.generation = 0

    def __enter__(self):
        me = threading.get_ident()
        with self._cond:   # (held by exclusive() while it runs)
            self._readers[me] = self._readers.get(me, 0) + 1
        return self

    def __exit__(self, *exc):
        me = threading.get_ident()
        with self._cond:
            n = self._readers[me] - 1
            if n:
                self._readers[me] = n
            else:
                del self._readers[me]
                if not self._readers:
                    self._cond.notify_all()

    def inside(self) -> bool:
        """Whether the calling thread runs a section now (a callback from inside a listing)."""
        return threading.get_ident() in self._readers

    def exclusive(self, fn, *args):
        """``fn(*args)`` with no section running and none starting meanwhile (the caller must not
        be inside one: :meth:`inside`)."""
        with self._cond:
            while self._readers:
                self._cond.wait()
            self.generation += 1
            return fn(*args)


_cache_guard = _CacheGuard()


def primitive(pd):
    """Create the primitive of a primitive descriptor (compiles JIT code; reads oneDNN's primitive
    cache, never while it is emptied: :class:`_CacheGuard`). Wraps ``dnnl_primitive_create``."""
    p = ffi.new("dnnl_primitive_t *")
    with _cache_guard:
        call("dnnl_primitive_create", p, pd, detail=pd_impl_name(pd))
    return ffi.gc(p[0], _destroyer("dnnl_primitive_destroy"))


def memory(md, handle=ffi.NULL):
    """A memory object on :func:`engine` with a user handle (``DNNL_MEMORY_NONE`` = NULL by default;
    set the pointer per call with ``dnnl_memory_set_data_handle``). Wraps ``dnnl_memory_create``."""
    p = ffi.new("dnnl_memory_t *")
    call("dnnl_memory_create", p, md, engine(), handle)
    return ffi.gc(p[0], _destroyer("dnnl_memory_destroy"))


def attr(fpmath: int = 0, user_scratchpad: bool = True, post_ops=None):
    """Primitive attributes: scratchpad mode (user), fpmath mode, post-ops. Wraps
    ``dnnl_primitive_attr_create``, ``_set_scratchpad_mode``, ``_set_fpmath_mode``, ``_set_post_ops``."""
    L = lib()
    p = ffi.new("dnnl_primitive_attr_t *")
    call("dnnl_primitive_attr_create", p)
    a = ffi.gc(p[0], _destroyer("dnnl_primitive_attr_destroy"))
    if user_scratchpad:
        call("dnnl_primitive_attr_set_scratchpad_mode", a, L.dnnl_scratchpad_mode_user)
    if fpmath:
        call("dnnl_primitive_attr_set_fpmath_mode", a, fpmath)
    if post_ops is not None:
        call("dnnl_primitive_attr_set_post_ops", a, post_ops)
    return a


def post_ops(ops: list[tuple]) -> object:
    """Post-ops chain from ``[("eltwise", alg_name, alpha, beta), ("sum", scale)]``. Wraps
    ``dnnl_post_ops_create``, ``dnnl_post_ops_append_eltwise``, ``dnnl_post_ops_append_sum``."""
    L = lib()
    p = ffi.new("dnnl_post_ops_t *")
    call("dnnl_post_ops_create", p)
    po = ffi.gc(p[0], _destroyer("dnnl_post_ops_destroy"))
    for op in ops:
        if op[0] == "eltwise":
            call("dnnl_post_ops_append_eltwise", po, getattr(L, "dnnl_eltwise_" + op[1]), float(op[2]), float(op[3]))
        elif op[0] == "sum":
            call("dnnl_post_ops_append_sum", po, float(op[1]), 0, L.dnnl_data_type_undef)
        else:
            raise ValueError(f"unknown post-op {op!r}")
    return po


def reorder_pd(src_md, dst_md):
    """A reorder primitive descriptor from ``src_md`` to ``dst_md`` on the CPU engine. Wraps
    ``dnnl_reorder_primitive_desc_create``."""
    p = ffi.new("dnnl_primitive_desc_t *")
    with _cache_guard:
        call("dnnl_reorder_primitive_desc_create", p, src_md, engine(), dst_md, engine(), attr())
    return pd_gc(p[0])


# ------------------------------------------------------------------ info
# DNNL_RUNTIME_* of oneDNN's headers: 0-512 as include/oneapi/dnnl/dnnl_config.h of 3.2 (and of
# later 3.x) defines them (DPCPP is SYCL's alias); 1024 (Level Zero) is newer (3.13's header).
RUNTIMES = {0: "none", 1: "sequential", 2: "OpenMP", 4: "TBB", 8: "threadpool", 256: "OpenCL", 512: "SYCL",
            1024: "Level Zero"}


def runtime_name(value: int) -> str:
    """The name of a ``DNNL_RUNTIME_*`` value; ``"unknown (N)"`` for one no header rawconv knows defines."""
    return RUNTIMES.get(int(value), f"unknown ({int(value)})")


def version(v=None) -> dict:
    """``dnnl_version()`` as a dict: version string, commit hash, CPU and GPU runtime names
    (:func:`runtime_name`). ``v``: a ``dnnl_version_t`` to describe instead (tests), else the
    loaded library's."""
    if v is None:
        v = lib().dnnl_version()
    return {"version": f"{v.major}.{v.minor}.{v.patch}",
            "commit": ffi.string(v.hash).decode() if v.hash != ffi.NULL else "",
            "cpu_runtime": runtime_name(v.cpu_runtime), "gpu_runtime": runtime_name(v.gpu_runtime)}


def effective_cpu_isa() -> str:
    """``dnnl_get_effective_cpu_isa()`` as its name, e.g. ``"avx512_core_amx"``."""
    L = lib()
    isa = L.dnnl_get_effective_cpu_isa()
    name = ffi.string(ffi.cast("dnnl_cpu_isa_t", isa))
    return name.replace("dnnl_cpu_isa_", "") if isinstance(name, str) else str(isa)


def primitive_cache_capacity() -> int:
    out = ffi.new("int *")
    call("dnnl_get_primitive_cache_capacity", out)
    return int(out[0])


def set_primitive_cache_capacity(n: int) -> None:
    """Wraps ``dnnl_set_primitive_cache_capacity``, while no thread lists implementations or creates
    a primitive (:class:`_CacheGuard`). Raises :class:`LibraryError` when called from inside such
    a section (a callback), where it would wait for itself."""
    if _cache_guard.inside():
        raise LibraryError("oneDNN", "dnnl_set_primitive_cache_capacity", 0, "",
                           "called from inside a listing of implementations or a primitive creation", HINT)
    _cache_guard.exclusive(call, "dnnl_set_primitive_cache_capacity", int(n))


def flush_primitive_cache() -> bool:
    """Empty oneDNN's primitive cache: its capacity set to 0, then back, while no thread lists
    implementations or creates a primitive (:class:`_CacheGuard`). Returns False, doing nothing,
    when called from inside such a section (a callback: a garbage collection, a hook), True
    otherwise. Wraps ``dnnl_get_primitive_cache_capacity``, ``dnnl_set_primitive_cache_capacity``."""
    if _cache_guard.inside():
        return False

    def flush():
        cap = primitive_cache_capacity()
        call("dnnl_set_primitive_cache_capacity", 0)
        call("dnnl_set_primitive_cache_capacity", cap)

    _cache_guard.exclusive(flush)
    return True


def clear_primitive_cache() -> None:
    """:func:`rawconv.clear_caches`'s part: :func:`flush_primitive_cache` when the library is loaded,
    also while other threads build and run plans (:class:`_CacheGuard`: they wait, and relist
    what they listed before it)."""
    if _state.get("loaded") is not None:
        flush_primitive_cache()


def set_verbose(level: int) -> None:
    """Wraps ``dnnl_set_verbose`` (0 none, 1 exec, 2 create+exec). Output goes to C stdout."""
    call("dnnl_set_verbose", int(level))
