"""Tuning files (:mod:`rawconv.tuning`): JSON read with its limits (a regular file, at most
:data:`MAX_FILE_BYTES`, nested at most :data:`MAX_DEPTH` levels), written atomically (a temporary
file renamed over the old one), writers of one file taking turns under a file lock (at most
:data:`LOCK_TIMEOUT_S`), and the files this process gave up on (one warning each)."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import threading
import time
import warnings
from collections.abc import Mapping

from . import guard as _guard
from .errors import ArgumentError

log = logging.getLogger("rawconv.tuning")
FACE = "rawconv.core.tuning"   # where this module's public names live (rawconv.tuning): messages, pickles

MAX_FILE_BYTES = 64 << 20           # a tuning file larger than this is refused (about 100k records)
MAX_DEPTH = 16                      # JSON nesting of a record / file (rawconv writes at most 6 levels)
LOCK_TIMEOUT_S = 30.0               # how long a write waits for another process's lock on the file


def _depth(data) -> int:
    """How deeply JSON-like ``data`` nests (a scalar: 0), counted without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, Mapping):
            items = v.values()
        elif isinstance(v, (list, tuple)):
            items = v
        else:
            continue
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            return d
        stack.extend((i, d + 1) for i in items)
    return deepest


def _check_depth(data, what: str) -> None:
    if _depth(data) > MAX_DEPTH:
        raise ArgumentError(f"{what} is nested deeper than {MAX_DEPTH} levels (rawconv.tuning.MAX_DEPTH): not a "
                            "tuning record or cache rawconv wrote")


# ---------------------------------------------------------------------------- files
class _UnusableFile(ArgumentError):
    """The tuning file's location cannot be used at all (not a regular file, unreadable, too large):
    the process's cache then runs in memory only (see :func:`cache`)."""


def _read_json(path):
    """The JSON content of ``path``; :class:`ArgumentError` naming it when it is missing, not a
    regular file (a device, a FIFO: refused before reading, never waited on), larger than
    :data:`MAX_FILE_BYTES`, unreadable, not JSON or nested deeper than :data:`MAX_DEPTH`."""
    p = os.fspath(path)
    try:
        # O_NONBLOCK: opening a FIFO does not wait for a writer; the file is then checked before reading
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ArgumentError(f"tuning file {p!s} does not exist") from None
    except IsADirectoryError:
        raise ArgumentError(f"tuning file {p!s} is a directory") from None
    except OSError as exc:
        raise _UnusableFile(f"cannot read tuning file {p!s}: {exc}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ArgumentError(f"tuning file {p!s} is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise _UnusableFile(f"tuning file {p!s} is not a regular file (a device, a FIFO or a socket): rawconv "
                                "reads and writes tuning records in regular files only")
        if st.st_size > MAX_FILE_BYTES:
            raise _UnusableFile(f"tuning file {p!s} holds {st.st_size} bytes, more than rawconv reads "
                                f"({MAX_FILE_BYTES}: rawconv.tuning.MAX_FILE_BYTES)")
        with open(fd, "rb", closefd=False) as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise _UnusableFile(f"cannot read tuning file {p!s}: {exc}") from None
    finally:
        os.close(fd)
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ArgumentError(f"cannot read tuning file {p!s}: {exc}") from None
    except ValueError as exc:  # json.JSONDecodeError
        raise ArgumentError(f"tuning file {p!s} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ArgumentError(f"tuning file {p!s} is nested too deeply to read: not a tuning file rawconv wrote (a "
                            f"record nests at most {MAX_DEPTH} levels)") from None
    _check_depth(data, f"tuning file {p!s}")
    return data


def _dumps(data, depth: int) -> str:
    """JSON text with line breaks down to ``depth`` levels (0: one line; 1: one field of an object
    per line; 2: one list item (a record) per line); deeper values stay on their line."""
    if depth <= 0 or not isinstance(data, (dict, list)) or not data:
        return json.dumps(data)
    if isinstance(data, list):
        return "[\n" + ",\n".join(" " + _dumps(v, depth - 2) for v in data) + "\n]"
    # a cache file: the header fields on one line each, its records one per line
    return "{\n" + ",\n".join(f" {json.dumps(k)}: " + _dumps(v, depth - 1 if k != "records" else 2)
                               .replace("\n", "\n ") for k, v in data.items()) + "\n}"


def _check_regular(path: str) -> None:
    """Raise :class:`ArgumentError` when ``path`` exists and is not a regular file (the atomic
    rename of a write would replace a device or a directory)."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise ArgumentError(f"{path} exists and is not a regular file: tuning records are written by replacing the "
                            "file (write to a new path)")


def _write_json(path, data, depth: int = 1) -> None:
    """Write ``data`` to ``path`` atomically: into a temporary file beside it, then renamed over it
    (a reader sees the old file or the new one, never half of one); the temporary file is removed
    when the write fails."""
    path = os.fspath(path)
    _check_regular(path)
    tmp = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(_dumps(data, depth) + "\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


@contextlib.contextmanager
def _file_lock(path: str):
    """An exclusive ``fcntl.flock`` on ``<path>.lock`` (created beside the file, left there) for
    the block: writers of one tuning file, in any process or thread, take turns. Waits at most
    :data:`LOCK_TIMEOUT_S` (then raises :class:`_UnusableFile`); no lock where fcntl is missing."""
    _check_regular(path)   # (before a lock file appears beside a device: /dev/null.lock)
    try:
        import fcntl
    except ImportError:   # not POSIX: writes stay atomic, merges are not serialized
        yield
        return
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise _UnusableFile(f"tuning file {path}: another process held its lock ({path}.lock) for "
                                        f"more than {LOCK_TIMEOUT_S:g} s") from None
                time.sleep(0.005)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _file_signature(path: str):
    """What changes when a file is replaced or written: (inode, size, mtime in ns); None when missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_unusable: dict = {}   # tuning file path -> why it cannot be used (warned once; the cache stays in memory)
_unusable_lock = threading.Lock()


def _give_up_on(path: str, why) -> None:
    """Stop using tuning file ``path`` in this process, with one ``RuntimeWarning`` saying why."""
    with _unusable_lock:
        if path in _unusable:
            return
        _unusable[path] = str(why)
    log.debug("tuning cache file %s given up: %s", path, why)
    warnings.warn(f"rawconv's tuning cache file {path} cannot be used ({why}); this process keeps its tuning "
                  "records in memory only", RuntimeWarning, stacklevel=_guard.stacklevel())
