"""What every backend's plans share: a bounded cache for the function forms, ``with``, and
:func:`clear_caches`, which empties every plan cache of the process at once."""
from __future__ import annotations

import threading
import weakref

_caches: weakref.WeakSet = weakref.WeakSet()   # every PlanCache made (each registers itself)
_clearers: list = []   # what else clear_caches() empties: (name, function) registered by their modules


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
    """``with plan: ...`` calls ``plan.free()`` on the way out. A plan holds the library's objects
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


def register_clear(name: str, clear) -> None:
    """Have :func:`clear_caches` also call ``clear()`` (a cache that is not a :class:`PlanCache`,
    e.g. a plain dict's ``clear``); ``name`` says whose it is (``"module:variable"``)."""
    _clearers.append((name, clear))


def clear_caches() -> int:
    """Empty every plan cache of the process: the function forms' and operators' (every
    :class:`PlanCache`: oneDNN's, cuDNN's legacy and graph plans, the fused plans, the operators'
    argument packs) and what their modules registered (:func:`register_clear`: the fused fast
    path, torch_choice's candidate listings). The tuning cache (records, :func:`rawconv.tuning.cache`)
    stays. The old per-module ``clear_cache()`` functions empty their own part. Returns how many
    caches it emptied. Plans that modules and frozen snapshots hold themselves are not caches: they
    stay with their owners."""
    n = 0
    for cache in list(_caches):
        cache.clear()
        n += 1
    for _name, clear in list(_clearers):
        clear()
        n += 1
    return n
