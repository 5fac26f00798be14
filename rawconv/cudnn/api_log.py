"""cuDNN's API log of this thread's calls (``cudnnSetCallback``): what :mod:`rawconv.torch_choice`
reads to name the algorithm or engine torch's own convolution ran."""
from __future__ import annotations

import threading

from . import _ffi as _cudnn

__all__ = ["cudnn_api_log"]

_SEV_MASK = (1 << 1) | (1 << 2) | (1 << 3)   # CUDNN_SEV_ERROR_EN | CUDNN_SEV_WARNING_EN | CUDNN_SEV_INFO_EN
_MAX_LINES = 50_000


def _read_message(ffi, msg) -> list[str]:
    """A cuDNN callback message: lines separated by NUL, ended by an empty line (two NULs)."""
    lines = []
    p = msg
    for _ in range(_MAX_LINES):
        s = ffi.string(p)
        if not s:
            break
        lines.append(s.decode(errors="replace"))
        p = p + len(s) + 1
    return lines


class cudnn_api_log:  # noqa: N801  (a context manager, used like a function)
    """``with cudnn_api_log() as log: ...`` records cuDNN's API log of this thread's calls in the
    block (``log.messages``: one list of lines per message), through ``cudnnSetCallback`` on the
    cuDNN rawconv loaded (the one torch loaded: one per process). The callback that was set
    before is restored on exit. ``log.available`` is False (and nothing is recorded) when cuDNN
    cannot be loaded or refuses the callback. Wraps ``cudnnGetCallback`` / ``cudnnSetCallback``."""

    def __init__(self):
        self.messages: list[list[str]] = []
        self.available = False
        self.error = ""
        self._saved = None

    def __enter__(self):
        try:
            L, ffi = _cudnn.lib(), _cudnn.ffi
            mask, udata, fptr = ffi.new("unsigned *"), ffi.new("void **"), ffi.new("cudnnCallback_t *")
            st = L.cudnnGetCallback(mask, udata, fptr)
            self._saved = (mask[0], udata[0], fptr[0]) if st == 0 else (0, ffi.NULL, ffi.NULL)
            tid = threading.get_native_id()
            msgs = self.messages

            def cb(sev, ud, dbg, msg):
                try:
                    if dbg != ffi.NULL and dbg.tid and int(dbg.tid) != tid:
                        return
                    msgs.append(_read_message(ffi, msg))
                except Exception:  # noqa: BLE001  never raise into cuDNN
                    pass

            self._cb = ffi.callback("void(cudnnSeverity_t, void *, const cudnnDebug_t *, const char *)", cb)
            st = L.cudnnSetCallback(_SEV_MASK, ffi.NULL, self._cb)
            if st != 0:
                self.error = f"cudnnSetCallback returned {_cudnn.status_name(st)}"
                self._saved = None
            else:
                self.available = True
                self._L = L
        except Exception as exc:  # noqa: BLE001  no cuDNN here: the log is a bonus
            self.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            self._saved = None
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            self._L.cudnnSetCallback(*self._saved)
            self._saved = None
        return False
