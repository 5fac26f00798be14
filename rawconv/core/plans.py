"""What every backend's plans share: a bounded cache for the function forms, ``with``, the byte
budget of the buffers plans hold (:func:`set_cache_limit`), and :func:`clear_caches`, which
empties every plan cache of the process at once.

**The byte budget.** A built oneDNN implementation keeps its buffers (reorder buffers in the
implementation's layouts, its scratchpad) between calls, so that a call allocates nothing but
its output; a cuDNN plan keeps its workspace for the device's default stream
(``rawconv.cudnn._cuda.KeptWorkspace``, counted under ``"cuda:N"``). Each new input size makes a new plan with new buffers: over many sizes (detection,
segmentation, variable-length audio) they would add up without end. Every such holder
:func:`charge` s its bytes here; past the limit (:func:`cache_limit`: :func:`set_cache_limit`,
else ``$RAWCONV_CACHE_LIMIT``, else :data:`DEFAULT_CACHE_LIMIT`, 512 MiB; per device) the least recently
used are released (a CLOCK sweep: one used since the last sweep gets a second chance). A released
holder's plan stays valid: its next call builds the implementation again (the primitive mostly
from oneDNN's primitive cache: about 0.1 ms). A workload whose buffers in use exceed the limit
would build again on every call: rawconv warns once when that happens often.
"""
from __future__ import annotations

import gc
import logging
import threading
import warnings
import weakref
from collections import OrderedDict

from . import env as _env

log = logging.getLogger("rawconv.plans")

_caches: weakref.WeakSet = weakref.WeakSet()   # every PlanCache made (each registers itself)
_clearers: list = []   # what else clear_caches() empties: (name, function) registered by their modules

#: The default of :func:`cache_limit`: the bytes of buffers cached plans may hold per device.
DEFAULT_CACHE_LIMIT = 512 << 20
REBUILD_WARNING = 256   # builds again of released buffers before rawconv warns that the limit is too small
TRIM_BYTES = 64 << 20   # released past the limit since glibc was last asked to give memory back (trim_heap)


def _parse_bytes(text: str) -> int:
    """``"1073741824"``, ``"512M"``, ``"2G"``, ``"64k"`` -> bytes (powers of 1024)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    num = t[:-1] if mult != 1 else t
    value = int(float(num) * mult)
    if value < 0:
        raise ValueError(text)
    return value


class _Ledger:
    """The holders of buffers (``owner``: an object with a ``used`` flag and a ``_cache_release()``
    method), their bytes per device, in CLOCK order (see the module notes)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.entries: OrderedDict = OrderedDict()   # id(owner) -> (weakref, bytes, device)
        self.bytes: dict = {}                        # device -> bytes charged
        self.dead: list = []                         # (id, weakref) of owners gone (weakref callbacks)
        self.limit: int | None = None                # set_cache_limit's; None: the environment's or the default
        self.evictions = 0
        self.rebuilds = 0
        self.warned = False
        self.untrimmed = 0   # bytes released since the last trim_heap

    def _gone(self, ref) -> None:   # a weakref callback: may run anywhere (GC), so it only records
        self.dead.append(ref)

    def _prune(self) -> None:
        dead, self.dead = self.dead, []
        for ref in dead:
            key = getattr(ref, "key", None)
            e = self.entries.get(key)
            if e is not None and e[0] is ref:
                del self.entries[key]
                self.bytes[e[2]] -= e[1]


_ledger = _Ledger()


class _Ref(weakref.ref):
    """A weak reference to a charged owner that knows its ledger key (the owner's id when charged)."""

    __slots__ = ("key",)


def cache_limit() -> int:
    """The bytes of buffers the cached plans of one device may hold (:func:`set_cache_limit`'s
    value, else ``$RAWCONV_CACHE_LIMIT``, else :data:`DEFAULT_CACHE_LIMIT`: 512 MiB)."""
    limit = _ledger.limit
    if limit is not None:
        return limit
    raw = _env.get("RAWCONV_CACHE_LIMIT")
    if not raw:
        return DEFAULT_CACHE_LIMIT
    seen = _ENV_LIMIT.get(raw)
    if seen is None:   # (read once per value: a bad one warns once)
        try:
            seen = _parse_bytes(raw)
        except (ValueError, OverflowError):
            seen = DEFAULT_CACHE_LIMIT
            warnings.warn(f"RAWCONV_CACHE_LIMIT={raw!r} is not a number of bytes (an int, or with a K, M or G "
                          f"suffix): the default {DEFAULT_CACHE_LIMIT} applies", RuntimeWarning, stacklevel=2)
        _ENV_LIMIT.clear()
        _ENV_LIMIT[raw] = seen
    return seen


_ENV_LIMIT: dict = {}   # $RAWCONV_CACHE_LIMIT as last read -> its bytes


def set_cache_limit(nbytes) -> None:
    """Let the buffers rawconv's plans keep between calls (oneDNN's reorder buffers and
    scratchpads, cuDNN plans' workspaces) hold at most ``nbytes`` bytes per device; the least recently used are released
    past it (now, when already over). ``nbytes``: an int >= 0 (0: nothing is kept between calls
    beyond the implementation in use), or None for ``$RAWCONV_CACHE_LIMIT`` / the default
    (:data:`DEFAULT_CACHE_LIMIT`, 512 MiB). Raises :class:`~rawconv.errors.ArgumentTypeError` /
    :class:`~rawconv.errors.ArgumentError` for anything else."""
    from .errors import ArgumentError, ArgumentTypeError

    if nbytes is not None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int):
            raise ArgumentTypeError(f"set_cache_limit takes an int number of bytes or None, got {nbytes!r}")
        if nbytes < 0:
            raise ArgumentError(f"set_cache_limit takes bytes >= 0, got {nbytes}")
    _ledger.limit = nbytes
    for device in list(_ledger.bytes):
        _release(_over(device, None))


def cache_info() -> dict:
    """What the plans' buffers hold now: ``{"limit": bytes, "bytes": {device: bytes held},
    "holders": how many, "evictions": released past the limit so far, "rebuilds": built again
    after a release}``."""
    with _ledger.lock:
        _ledger._prune()
        return {"limit": cache_limit(), "bytes": {d: n for d, n in _ledger.bytes.items() if n},
                "holders": len(_ledger.entries), "evictions": _ledger.evictions, "rebuilds": _ledger.rebuilds}


def charge(owner, nbytes: int, device: str = "cpu") -> None:
    """Count ``nbytes`` of buffers ``owner`` holds on ``device`` (until it is released or
    collected), then release the least recently used others of that device while over the limit.
    ``owner`` sets its ``used`` attribute on each call and drops its buffers in
    ``_cache_release()`` (called without any lock of rawconv held)."""
    key = id(owner)
    ref = _Ref(owner, _ledger._gone)
    ref.key = key
    with _ledger.lock:
        _ledger._prune()
        old = _ledger.entries.pop(key, None)
        if old is not None:
            _ledger.bytes[old[2]] -= old[1]
        _ledger.entries[key] = (ref, int(nbytes), device)
        _ledger.bytes[device] = _ledger.bytes.get(device, 0) + int(nbytes)
        victims = _over(device, key)
    _release(victims)


def rebuilt() -> None:
    """Count one build again of buffers that were released past the limit; warn once (a
    ``RuntimeWarning``) when that happened :data:`REBUILD_WARNING` times: the limit is smaller
    than what the workload keeps using."""
    with _ledger.lock:
        _ledger.rebuilds += 1
        warn = _ledger.rebuilds >= REBUILD_WARNING and not _ledger.warned
        if warn:
            _ledger.warned = True
    if warn:
        from .guard import stacklevel

        warnings.warn(f"rawconv released and built again plans' buffers {REBUILD_WARNING} times: the buffers this "
                      f"workload keeps using exceed the cache limit ({cache_limit()} bytes), so calls pay for building "
                      "them again; raise it with rawconv.set_cache_limit(bytes) or RAWCONV_CACHE_LIMIT",
                      RuntimeWarning, stacklevel=stacklevel())


def _over(device: str, keep) -> list:
    """The owners to release so that ``device``'s bytes fit the limit (the caller holds no lock
    of theirs): a CLOCK sweep from the oldest, sparing ``keep`` (the owner just charged); taken
    out of the ledger here."""
    victims = []
    with _ledger.lock:
        limit = cache_limit()
        if _ledger.bytes.get(device, 0) <= limit:
            return victims
        entries = _ledger.entries
        for _sweep in range(2):
            for key in list(entries):
                if _ledger.bytes[device] <= limit:
                    return victims
                e = entries.get(key)
                if e is None or e[2] != device or key == keep:
                    continue
                owner = e[0]()
                if owner is not None and getattr(owner, "used", False):
                    owner.used = False   # a second chance: used since the last sweep
                    entries.move_to_end(key)
                    continue
                del entries[key]
                _ledger.bytes[device] -= e[1]
                if owner is not None:
                    victims.append(owner)
                    _ledger.evictions += 1
                    _ledger.untrimmed += e[1]
    return victims


def _release(victims) -> None:
    """Release ``victims``' buffers; then, once :data:`TRIM_BYTES` were released since the last
    time, :func:`trim_heap` (freed buffers of many sizes leave holes glibc keeps otherwise)."""
    if not victims:
        return
    for owner in victims:
        try:
            owner._cache_release()
        except Exception:  # noqa: BLE001 - releasing is best effort; the buffers go with the owner anyway
            log.debug("releasing %r failed", owner, exc_info=True)
    n = len(victims)
    victims.clear()   # (the last references: the buffers are freed here, unless a call is running on them)
    log.debug("released the buffers of %d plans past the cache limit", n)
    if _ledger.untrimmed >= TRIM_BYTES:
        _ledger.untrimmed = 0
        trim_heap()


def release_all() -> int:
    """Release every charged holder's buffers now; returns how many."""
    with _ledger.lock:
        _ledger._prune()
        victims = [e[0]() for e in _ledger.entries.values()]
        _ledger.entries.clear()
        _ledger.bytes.clear()
    victims = [v for v in victims if v is not None]
    _release(victims)
    return len(victims)


def arg_key(v):
    """A hashable key of an argument that tells apart values Python finds equal (1, 1.0, True) and
    a list from a tuple (the fast-path caches of the function forms and operators key on it); a
    tensor by its values (one changed in place must not match its earlier key)."""
    t = type(v)
    if t is int or t is str or v is None:
        return v
    if t is tuple or t is list:
        return (t, tuple(arg_key(i) for i in v))
    if hasattr(v, "tolist"):   # a tensor (or an array) hashes by identity: keyed by its values now
        return (t, arg_key(v.tolist()))
    return (t, v)


class PlanCache:
    """A thread-safe dict of plans holding at most ``maxsize`` entries (the oldest is dropped
    first). The function forms (``forward``...) keep their plans here, keyed by problem/options."""

    def __init__(self, maxsize: int = 256):
        self.maxsize = maxsize
        self._plans: dict = {}
        self._lock = threading.Lock()
        _caches.add(self)   # so that clear_caches() reaches it

    def get(self, key):
        return self._plans.get(key)

    def put(self, key, plan):
        """Store ``plan`` under ``key`` and return it."""
        with self._lock:
            if len(self._plans) >= self.maxsize:
                self._plans.pop(next(iter(self._plans)), None)
            self._plans[key] = plan
        return plan

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)


class PlanLifetime:
    """What every plan class inherits: ``with plan: ...`` calls ``plan.free()`` on the way out, and
    the plan contract's :meth:`hot_run` by direction. A plan holds the library's objects
    (descriptors, primitives, buffers whose addresses they hold), which neither copy nor pickle:
    ``copy.copy``, ``copy.deepcopy``, ``pickle`` and ``torch.save`` of a plan raise
    :class:`~rawconv.errors.ArgumentTypeError` (a ``TypeError``, as pickle's own refusal) saying
    what to keep instead."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __reduce_ex__(self, protocol):
        from .errors import ArgumentTypeError

        name = f"{type(self).__module__}.{type(self).__qualname__}"
        raise ArgumentTypeError(
            f"a {name} plan cannot be copied or pickled: it holds the library's objects (descriptors, primitives, "
            "buffers). Keep what makes one instead: its problem and choice (plan.problem, plan.selected; a new "
            "plan from them, from_problem(problem, direction=..., choice=...)) or its tuning record "
            "(plan.tuning_record.save(path), rawconv.tuning.replay(path))")

    def hot_run(self, a, b, bias=None, out=None):
        """The plan contract's one call by direction (:class:`rawconv.core.backend.Plan`): ``a, b`` =
        x, w (forward), grad_y, w (backward data), x, grad_y (backward weights), through
        :meth:`execute`, whose own hot path applies where the backend has one (a backend with a
        cheaper path of its own overrides this)."""
        d = self.direction
        if d == "forward":
            return self.execute(a, b, bias, out)
        if d == "backward_data":
            return self.execute(grad_y=a, w=b, out=out)
        return self.execute(a, grad_y=b) if out is None else self.execute(a, grad_y=b, out=out)


class PerThread:
    """An attribute whose value is per (instance, thread): ``name = PerThread()`` in a class body;
    None until set. For what a method leaves on a shared object for the calls it makes (a residual
    plan's residual of the call in progress), so that threads sharing the object never read each
    other's."""

    def __set_name__(self, owner, name):
        self.key = "_per_thread_" + name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        return getattr(obj.__dict__.get(self.key), "value", None)

    def __set__(self, obj, value):
        tls = obj.__dict__.get(self.key)
        if tls is None:
            tls = obj.__dict__.setdefault(self.key, threading.local())
        tls.value = value


def register_clear(name: str, clear) -> None:
    """Have :func:`clear_caches` also call ``clear()`` (a cache that is not a :class:`PlanCache`,
    e.g. a plain dict's ``clear``); ``name`` says whose it is (``"module:variable"``)."""
    _clearers.append((name, clear))


def clear_caches() -> int:
    """Empty every plan cache of the process: the function forms' and operators' (every
    :class:`PlanCache`: oneDNN's, cuDNN's legacy and graph plans, the fused plans, the operators'
    argument packs, the frozen modules' own plans of ``convert(fuse=True)``) and what their
    modules registered (:func:`register_clear`: the fused fast path, torch_choice's candidate
    listings, oneDNN's primitive cache: other threads' listings and primitive creations finish
    first, and plans listed before it list again), and release the buffers every plan still held
    (:func:`charge`: a plan kept elsewhere builds them again at its next call). Then the
    garbage is collected and glibc is asked to give freed memory back to the system
    (``malloc_trim``). The tuning cache (records, :func:`rawconv.tuning.cache`) and the modules'
    autotuned choices stay. The old per-module ``clear_cache()`` functions empty their own part.
    Returns how many caches it emptied."""
    n = 0
    for cache in list(_caches):
        cache.clear()
        n += 1
    for _name, clear in list(_clearers):
        clear()
        n += 1
    release_all()
    gc.collect()
    trim_heap()
    return n


def trim_heap() -> None:
    """Ask glibc to return freed heap memory to the system (``malloc_trim(0)``); nothing elsewhere."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):   # not glibc
        pass


# every public entry point raises only rawconv's exception classes (rawconv.core.guard)
from . import guard as _guard  # noqa: E402

_guard.guard_module(globals(), "set_cache_limit", "cache_limit", "cache_info", "clear_caches")
