"""The tuning cache (:mod:`rawconv.tuning`): :class:`TuningCache` (records by key, thread-safe,
kept in a file when it has one: merged with what other processes wrote, under a file lock) and the
process's cache (:func:`cache`, in the file :func:`cache_file` names: :func:`set_cache_file`, else
``$RAWCONV_TUNING_CACHE``)."""
from __future__ import annotations

import logging
import os
import threading

from . import env as _env
from .errors import ArgumentError, ArgumentTypeError
from .tuning_files import _UnusableFile, _file_lock, _file_signature, _give_up_on, _read_json, _unusable, _write_json
from .tuning_record import _ENV_FIELDS, CACHE_FORMAT, CACHE_VERSION, TuningKey, TuningRecord, _describe, _records_in

log = logging.getLogger("rawconv.tuning")
FACE = "rawconv.core.tuning"   # where this module's public names live (rawconv.tuning): messages, pickles

ENV_FILE = "RAWCONV_TUNING_CACHE"
ENV_FILE_ALIASES = ("RAWCONV_CUDNN_TUNING_CACHE",)


# ---------------------------------------------------------------------------- the cache
class TuningCache:
    """Tuning records by :class:`TuningKey`, thread-safe. With ``path``, every :meth:`put`
    writes the whole cache there (atomically). Iteration order is insertion order (a put moves
    its key last)."""

    def __init__(self, path=None):
        self.path = None if path is None else os.fspath(path)
        self._records: dict[TuningKey, TuningRecord] = {}
        self._lock = threading.RLock()
        self._seen = None   # the file's signature when this cache last read or wrote it (_file_signature)

    def get(self, key: TuningKey) -> TuningRecord | None:
        """The record stored for ``key``, or None."""
        if not isinstance(key, TuningKey):
            raise ArgumentTypeError(f"key must be a TuningKey, got {type(key).__name__}")
        with self._lock:
            rec = self._records.get(key)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s %s %s: %s", "hit" if rec else "miss", key.backend, key.direction,
                      _describe(key), rec.choice if rec else "not in the cache")
        return rec

    def put(self, record: TuningRecord) -> None:
        """Store ``record`` under its key (replacing one there); then write the file, if any: under
        a lock on it (``fcntl.flock`` of ``<path>.lock``) the records another process or cache
        wrote there since this one last read it are merged in first (per key the newest
        ``created`` wins, this cache's on a tie), then the file is replaced atomically, so that
        concurrent writers keep every record. A file that cannot be written (a read-only or missing
        directory, a device, a FIFO, a disk error) or read back (content rawconv cannot read:
        never overwritten) is given up for the process with one ``RuntimeWarning``: the records stay
        in memory."""
        if not isinstance(record, TuningRecord):
            raise ArgumentTypeError(f"put takes a TuningRecord, got {type(record).__name__}")
        with self._lock:
            self._records.pop(record.key, None)
            self._records[record.key] = record
            log.debug("put %s %s %s: %s", record.key.backend, record.key.direction, _describe(record.key),
                      record.choice)
            if self.path and self.path not in _unusable:
                try:
                    self._write_merged(self.path)
                except (OSError, ArgumentError) as exc:
                    _give_up_on(self.path, exc)

    def _write_merged(self, path: str) -> None:
        """Merge the records of ``path`` (when it changed since this cache last read or wrote it)
        into this cache, then write them all there; under the file's lock (see :meth:`put`)."""
        with _file_lock(path):
            sig = _file_signature(path)
            if sig is not None and sig != self._seen:
                self._merge(_records_in(path, _read_json(path)))
            data = {"format": CACHE_FORMAT, "version": CACHE_VERSION,
                    "records": [r.to_dict() for r in self._records.values()]}
            _write_json(path, data)
            self._seen = _file_signature(path)
        log.debug("saved %d records to %s", len(data["records"]), path)

    def _merge(self, records) -> None:
        """Take ``records`` (another writer's) in: a key this cache lacks is added before its own
        records; a key it holds takes the other record only when that one is newer (``created``)."""
        mine = self._records
        merged = {r.key: r for r in records if r.key not in mine}
        for k, r in mine.items():
            merged[k] = r
        for r in records:
            own = mine.get(r.key)
            if own is not None and own is not r and r.created_ts > own.created_ts:
                merged[r.key] = r
        self._records = merged

    def records(self) -> list[TuningRecord]:
        """Every record, oldest put first."""
        with self._lock:
            return list(self._records.values())

    def clear(self) -> None:
        with self._lock:
            self._records.clear()

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, key) -> bool:
        return key in self._records

    def seeds(self, key: TuningKey, layout: str | None = None) -> list[TuningRecord]:
        """The records of other problems that may seed a search for ``key``: same backend,
        direction, library and version, device and architecture (options and filters may
        differ: the caller filters). Ranked: tier 0, the same spatial dimensions, data type,
        layout (``layout``, default ``key``'s; a record counts by its :attr:`TuningRecord.layout`)
        and activation; tier 1, the same dimensions and layout; tier 2, the rest; newest
        (``created``) first within a tier, then the later put. Each ``choice`` once."""
        layout = layout or key.layout
        same = ("backend", "direction", *_ENV_FIELDS)
        with self._lock:
            recs = list(self._records.values())
        ranked = []
        for order, r in enumerate(reversed(recs)):
            k = r.key
            if k == key or any(getattr(k, f) != getattr(key, f) for f in same):
                continue
            if (k.ndim, k.dtype, r.layout, k.activation) == (key.ndim, key.dtype, layout, key.activation):
                tier = 0
            elif (k.ndim, r.layout) == (key.ndim, layout):
                tier = 1
            else:
                tier = 2
            ranked.append((tier, -r.created_ts, order, r))
        out, seen = [], set()
        for *_, r in sorted(ranked, key=lambda t: t[:3]):
            if r.choice not in seen:
                seen.add(r.choice)
                out.append(r)
        return out

    # ------------------------------------------------------------------ files
    def save(self, path=None) -> None:
        """Write every record to ``path`` (default: :attr:`path`) as a versioned cache file
        (``{"format": "rawconv-tuning-cache", "version": 1, "records": [...]}``), atomically."""
        path = self.path if path is None else path
        if not path:
            raise ArgumentError("save needs a path (this cache has none)")
        with self._lock:
            data = {"format": CACHE_FORMAT, "version": CACHE_VERSION,
                    "records": [r.to_dict() for r in self._records.values()]}
            path = os.fspath(path)
            with _file_lock(path):
                _write_json(path, data)
                if path == self.path:
                    self._seen = _file_signature(path)
        log.debug("saved %d records to %s", len(data["records"]), path)

    def load(self, path, merge: bool = True) -> int:
        """Read the records of ``path`` (a cache file, a record or a list of records) into the cache
        (``merge=False``: replacing what it held); returns how many were read. Raises
        :class:`ArgumentError` naming ``path`` when it is missing, not JSON, of the old format, or
        holds something else; the cache is then unchanged."""
        sig = _file_signature(os.fspath(path))
        records = _records_in(path, _read_json(path))
        with self._lock:
            if not merge:
                self._records.clear()
            for r in records:
                self._records.pop(r.key, None)
                self._records[r.key] = r
            if os.fspath(path) == self.path:
                self._seen = sig
        log.debug("loaded %d records from %s", len(records), os.fspath(path))
        return len(records)


# ---------------------------------------------------------------------------- the process's cache
_cache = TuningCache()
_cache_lock = threading.Lock()
_configured: list = [None]   # set_cache_file's path; None: the environment decides


def set_cache_file(path) -> None:
    """Keep the process's tuning cache (:func:`cache`) in ``path``: loaded from it on next use
    (when it exists) and written after each put. ``""``: in memory only, whatever the
    environment says; ``None``: back to ``$RAWCONV_TUNING_CACHE`` (or
    ``$RAWCONV_CUDNN_TUNING_CACHE``)."""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"path must be a str, a path or None, got {type(path).__name__}")
    _configured[0] = None if path is None else os.fspath(path)


def cache_file() -> str | None:
    """The file the process's tuning cache lives in: :func:`set_cache_file`'s path, else
    ``$RAWCONV_TUNING_CACHE``, else ``$RAWCONV_CUDNN_TUNING_CACHE``; None for none."""
    path = _configured[0]
    if path is None:
        for name in (ENV_FILE, *ENV_FILE_ALIASES):
            path = _env.get(name)
            if path:
                break
    return path or None


def cache() -> TuningCache:
    """The process's :class:`TuningCache`. When the configured file (:func:`cache_file`) changed
    since the last call, that file is read into it first (when it exists; a missing file is
    created by the next put). Raises :class:`ArgumentError` naming the file when its content
    cannot be read (not JSON, the old format, a record out of limits, nested too deeply...); the
    cache then keeps its previous file. A location that cannot be used at all (not a regular
    file: ``/dev/zero``, a FIFO; unreadable; larger than :data:`MAX_FILE_BYTES`) is given up for
    the process with one ``RuntimeWarning``, never waited on: the cache stays in memory, as it
    does when a later put cannot write the file (:meth:`TuningCache.put`)."""
    path = cache_file()
    if path in _unusable:   # given up (see below): in memory only
        path = None
    if path != _cache.path:
        with _cache_lock:
            if path != _cache.path:
                if path and os.path.lexists(path):
                    try:
                        _cache.load(path, merge=True)
                    except _UnusableFile as exc:   # not a regular file, unreadable: never waited on
                        _give_up_on(path, exc)
                        path = None
                _cache.path = path
                log.debug("tuning cache file: %s", path or "none (in memory only)")
    return _cache


# every public entry point raises only rawconv's exception classes (rawconv._guard)
from . import guard as _guard  # noqa: E402

TuningCache.__module__ = FACE
_guard.guard_module(globals(), "cache", "set_cache_file", "TuningCache.save", "TuningCache.load", where=FACE)
