"""Run candidates the library may crash on in a child process; a crash or hang becomes a row status.

A oneDNN implementation can take the process down (heap corruption, ``SIGSEGV``) or never return
(oneDNN issue #6035: see :mod:`rawconv.known_bad`). Exploring every implementation from a
notebook must not cost the kernel, so rawconv can run them in a **worker**: a child Python
process that keeps running candidates one by one. When a candidate crashes (a signal:
``SIGSEGV``, ``SIGABRT``..., or an exit) or runs past the timeout (the worker is killed), that
candidate's row says so (``"crashed: SIGABRT"``, ``"timed out after 60 s"``), a fresh worker
takes over and the parent goes on with the next candidate. A oneDNN candidate that writes past its
scratchpad (#6035) or a reorder buffer writes, in the child, into a guard band rawconv checks after the call
(:data:`rawconv.onednn.isolated.GUARD_BYTES`): its own row says ``"wrong"`` with the
byte count, instead of a corrupted heap aborting some later candidate.

Public surface (the usual entry points take ``isolate=``):

* ``rawconv.onednn.implementations(..., isolate=True)``: listed in the child, each implementation
  run once there and checked against float64 in the parent; rows carry ``status``.
* ``rawconv.onednn.Convolution.autotune(..., isolate=True)``: every candidate timed in the child;
  crashed, timed-out and wrong rows are reported, never selected.
* :func:`rawconv.onednn.isolated.run_onednn_candidates`: the same per problem, as dicts, for ``rawconv compare``.
* :func:`run`: any module-level function in a worker (the test hook for injected crashes).

``isolate`` takes ``True`` (defaults), an :class:`Isolation` or a dict of its fields:
``timeout_s`` (per candidate: build, warm-up and timing; default 60 s), ``env`` (extra
environment variables for the child, e.g. ``{"ONEDNN_MAX_CPU_ISA": "AVX2"}``), ``threads``
(torch/OpenMP threads in the child; default the parent's ``torch.get_num_threads()``).

How the child starts: a fresh interpreter (``sys.executable``, fork + exec, as multiprocessing's
"spawn" start method does; never a bare ``fork``, after which OpenMP hangs), inheriting the
parent's environment (``ONEDNN_MAX_CPU_ISA``, ``RAWCONV_DNNL_LIBRARY``, ``OMP_NUM_THREADS``...)
plus ``env``, and the parent's ``sys.path``. Unlike multiprocessing's spawn it does not re-import
the caller's ``__main__`` script (which re-runs a script's unguarded top-level code), and it can
be given its own environment. Messages are pickles over a pair of pipes
(:class:`multiprocessing.connection.Connection`); tensors travel by value. The child's stdout and
stderr go to a temporary file (oneDNN's verbose lines and glibc's last words stay out of the
parent's output); the lines a crashing candidate left there become the row's ``detail``.
Workers are kept (one idle worker per environment and thread count) and reused: starting one
costs a few seconds (importing torch). After each candidate the child frees its buffers and
asks glibc to consolidate the heap (``malloc_trim``), so that heap corruption shows in the
candidate that caused it rather than in the next one.
"""
from __future__ import annotations

import atexit
import math
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .errors import ArgumentError, ArgumentTypeError, IsolationError

__all__ = ["Isolation", "Outcome", "Worker", "run", "options", "shutdown",
           "DEFAULT_TIMEOUT_S", "STATUSES"]

DEFAULT_TIMEOUT_S = 60.0
STARTUP_TIMEOUT_S = 300.0   # a child must be ready (torch and rawconv imported) within this
#: Row statuses (``"crashed: ..."`` carries the signal name or exit code; ``"timed out after N s"``).
STATUSES = ("ok", "wrong", "crashed", "timed out", "not supported", "known bad", "failed")


@dataclass(frozen=True)
class Isolation:
    """How candidates run in a child: ``timeout_s`` per candidate (seconds, > 0), ``env`` (extra
    environment variables for the child), ``threads`` (torch threads there; None = the parent's)."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    env: Mapping[str, str] | None = None
    threads: int | None = None

    def __post_init__(self):
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (t > 0) or not math.isfinite(t):
            raise ArgumentError(f"timeout_s must be a positive number of seconds, got {t!r}")
        if self.env is not None:
            if not isinstance(self.env, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                            for k, v in self.env.items()):
                raise ArgumentTypeError(f"env must be a dict of str to str, got {self.env!r}")
            object.__setattr__(self, "env", dict(self.env))
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise ArgumentError(f"threads must be a positive int or None, got {self.threads!r}")


def options(isolate: Any) -> Isolation | None:
    """``isolate=`` as the entry points take it: False/None -> None; True -> defaults; an
    :class:`Isolation`; a dict of its fields; an options object with ``isolate`` and
    ``timeout_s`` fields (``rawconv.Options``). Raises :class:`ArgumentTypeError` otherwise."""
    if isolate is None or isolate is False:
        return None
    if isolate is True:
        return Isolation()
    if isinstance(isolate, Isolation):
        return isolate
    if isinstance(isolate, Mapping):
        unknown = set(isolate) - {"timeout_s", "env", "threads"}
        if unknown:
            raise ArgumentError(f"isolate takes timeout_s, env and threads; got {sorted(unknown)}")
        return Isolation(**isolate)
    if isinstance(getattr(isolate, "isolate", None), bool) and hasattr(isolate, "timeout_s"):
        # an options object with isolate / timeout_s fields (rawconv.Options)
        return Isolation(timeout_s=isolate.timeout_s) if isolate.isolate else None
    raise ArgumentTypeError(f"isolate must be True/False, a rawconv._isolate.Isolation or a dict, got {isolate!r}")


@dataclass
class Outcome:
    """What one call in a worker came to. ``status``: ``"ok"`` (``value`` holds the return
    value), ``"error"`` (a Python exception in the child: ``error`` holds its ``type`` (qualified
    name), ``message``, ``traceback``, and ``not_supported`` / ``known_bad`` flags),
    ``"crashed: SIGABRT"`` (a signal; ``"crashed: exit code N"`` for an exit), or
    ``"timed out after N s"``. ``detail``: for a crash, the last lines the child wrote to its
    stderr/stdout during the call. ``seconds``: wall time of the call."""

    status: str
    value: Any = None
    error: dict | None = None
    detail: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def died(self) -> bool:
        """The child crashed or was killed for running past the timeout."""
        return self.status.startswith(("crashed", "timed out"))


# ---------------------------------------------------------------------------- the worker process
_BOOT = ("import sys, pickle\n"
         "from multiprocessing.connection import Connection\n"
         "r = Connection(int(sys.argv[1]), writable=False)\n"
         "sys.path[:] = pickle.loads(r.recv_bytes())\n"
         "from rawconv.core.isolate import _child_main\n"
         "_child_main(r, Connection(int(sys.argv[2]), readable=False))\n")


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _fmt_s(s: float) -> str:
    return f"{s:g}"


class Worker:
    """One child process that runs calls one at a time (see the module notes).

    ``Worker(env=None, threads=None)``; :meth:`call` runs ``"module:function"`` there and returns
    an :class:`Outcome`; after a crash or a timeout the worker is dead (:attr:`alive` False) and
    the next :meth:`call` starts a fresh child. :meth:`close` ends it. ``keys`` holds what the
    current child has cached (candidate runners use it to know what to resend after a restart).
    """

    def __init__(self, env: Mapping[str, str] | None = None, threads: int | None = None):
        self.env = dict(env or {})
        self.threads = threads
        self.proc: subprocess.Popen | None = None
        self._send = self._recv = None
        self._log = None
        self.keys: set = set()
        self.calls = 0          # calls answered by the current child
        self.starts = 0         # children started

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the child now (otherwise the first :meth:`call` does). Raises
        :class:`~rawconv.errors.IsolationError` when it cannot be started."""
        if self.alive:
            return
        self._cleanup()
        from multiprocessing.connection import Connection

        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        env = dict(os.environ)
        env.update(self.env)
        env["RAWCONV_ISOLATED_CHILD"] = "1"   # declared in rawconv.core.env
        if self._log is not None:
            self._log.close()
        self._log = tempfile.TemporaryFile(prefix="rawconv-isolate-")
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", _BOOT, str(p2c_r), str(c2p_w)],
                                         pass_fds=(p2c_r, c2p_w), env=env, stdin=subprocess.DEVNULL,
                                         stdout=self._log, stderr=self._log, close_fds=True)
        except OSError as exc:
            for fd in (p2c_r, p2c_w, c2p_r, c2p_w):
                os.close(fd)
            raise IsolationError(f"could not start a worker process ({sys.executable}): {exc}") from exc
        os.close(p2c_r)
        os.close(c2p_w)
        self._send = Connection(p2c_w, readable=False)
        self._recv = Connection(c2p_r, writable=False)
        self.keys = set()
        self.calls = 0
        self.starts += 1
        self._send.send_bytes(pickle.dumps([p for p in sys.path if isinstance(p, str)]))
        # wait for the child to import torch and rawconv: start-up is not part of any call's timeout
        try:
            ready = self._recv.poll(STARTUP_TIMEOUT_S)
            msg = pickle.loads(self._recv.recv_bytes()) if ready else None
        except (OSError, EOFError):
            msg = None
        except BaseException:   # interrupted while it starts: no half-started child is kept
            self.kill()
            raise
        if msg != ("ready",):
            rc = self.proc.poll()
            tail = self._log_tail(0)
            self.kill()
            why = (f"it exited with {rc}" if rc is not None else
                   f"it was not ready after {_fmt_s(STARTUP_TIMEOUT_S)} s")
            raise IsolationError(f"the worker process ({sys.executable}) did not start: {why}"
                                 + (f"; it said: {tail}" if tail else ""))

    def _log_tail(self, since: int, limit: int = 600) -> str:
        if self._log is None:
            return ""
        try:
            self._log.seek(0, os.SEEK_END)
            end = self._log.tell()
            start = max(since, end - limit)
            self._log.seek(start)
            text = self._log.read(end - start).decode("utf-8", "replace")
        except OSError:
            return ""
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return " | ".join(lines[-4:])

    def _log_pos(self) -> int:
        try:
            self._log.seek(0, os.SEEK_END)
            return self._log.tell()
        except (OSError, AttributeError):
            return 0

    def call(self, target: str, args: Sequence = (), kwargs: Mapping | None = None, *,
             timeout_s: float = DEFAULT_TIMEOUT_S) -> Outcome:
        """Run ``target`` (``"package.module:function"``, a module-level function) with ``args``
        and ``kwargs`` in the child; wait at most ``timeout_s`` seconds (then kill the child).
        Arguments and the return value travel by pickle."""
        import torch

        self.start()
        pos = self._log_pos()
        threads = self.threads or torch.get_num_threads()
        t0 = time.perf_counter()
        try:
            try:
                self._send.send_bytes(pickle.dumps(("call", target, tuple(args), dict(kwargs or {}), threads),
                                                   protocol=pickle.HIGHEST_PROTOCOL))
            except (OSError, EOFError, BrokenPipeError):
                return self._died(pos, t0)
            try:
                ready = self._recv.poll(timeout_s)
            except (OSError, EOFError):
                ready = True
            if not ready:
                self.kill()
                return Outcome(f"timed out after {_fmt_s(timeout_s)} s", detail=self._log_tail(pos),
                               seconds=time.perf_counter() - t0)
            try:
                kind, payload = pickle.loads(self._recv.recv_bytes())
            except (OSError, EOFError):
                return self._died(pos, t0)
        except BaseException:
            # interrupted (KeyboardInterrupt, SystemExit...) between the request and its answer: the
            # child may still be running it and would answer it to the next call. Out of step, it
            # is killed; the next call starts a fresh child
            self.kill()
            raise
        self.calls += 1
        dt = time.perf_counter() - t0
        if kind == "ok":
            return Outcome("ok", value=payload, seconds=dt)
        return Outcome("error", error=payload, detail=payload.get("message", ""), seconds=dt)

    def _died(self, pos: int, t0: float) -> Outcome:
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = self.proc.returncode
        detail = self._log_tail(pos)
        self._cleanup()
        if rc is not None and rc < 0:
            status = f"crashed: {_signal_name(rc)}"
        else:
            status = f"crashed: exit code {rc}"
        return Outcome(status, detail=detail, seconds=time.perf_counter() - t0)

    def kill(self) -> None:
        """Kill the child (SIGKILL) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
        self._cleanup()

    def _cleanup(self) -> None:
        for c in (self._send, self._recv):
            if c is not None:
                try:
                    c.close()
                except OSError:
                    pass
        self._send = self._recv = None
        self.keys = set()

    def close(self) -> None:
        """Ask the child to exit (kill it after 5 s). Idempotent."""
        if self.alive and self._send is not None:
            try:
                self._send.send_bytes(pickle.dumps(("exit",)))
                self.proc.wait(timeout=5)
            except (OSError, EOFError, subprocess.TimeoutExpired):
                pass
        self.kill()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __del__(self):  # pragma: no cover - best effort at interpreter exit
        try:
            self.kill()
        except Exception:  # noqa: BLE001
            pass


# idle workers, one per (environment, threads)
_idle: dict = {}
_idle_lock = threading.Lock()


def take_worker(iso: Isolation) -> Worker:
    key = (tuple(sorted((iso.env or {}).items())), iso.threads)
    with _idle_lock:
        w = _idle.pop(key, None)
    if w is not None and w.alive:
        return w
    if w is not None:
        w.close()
    return Worker(iso.env, iso.threads)


def give_worker(iso: Isolation, w: Worker) -> None:
    key = (tuple(sorted((iso.env or {}).items())), iso.threads)
    if not w.alive:
        w.close()
        return
    with _idle_lock:
        old = _idle.pop(key, None)
        _idle[key] = w
    if old is not None and old is not w:
        old.close()


def shutdown() -> None:
    """End every idle worker (also done at interpreter exit)."""
    with _idle_lock:
        ws = list(_idle.values())
        _idle.clear()
    for w in ws:
        w.close()


atexit.register(shutdown)


def _target_name(target: Any) -> str:
    if isinstance(target, str):
        if ":" not in target:
            raise ArgumentError(f"target must be 'module:function', got {target!r}")
        return target
    mod, qual = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if not callable(target) or not mod or not qual or "<" in qual:
        raise ArgumentTypeError(f"target must be a module-level function or 'module:function', got {target!r}")
    return f"{mod}:{qual}"


def run(target: Any, *args, isolate: Any = True, **kwargs) -> Outcome:
    """Call ``target(*args, **kwargs)`` in a worker and return the :class:`Outcome` (the test
    hook for injected crashes: a function that calls ``os.abort()`` comes back as
    ``"crashed: SIGABRT"``, one that sleeps past ``timeout_s`` as ``"timed out after N s"``).
    ``target``: a module-level function or ``"module:function"``; ``isolate``: as the entry
    points take it (``{"timeout_s": 5}``...). The worker is reused by later calls when it lives."""
    iso = options(isolate) or Isolation()
    name = _target_name(target)
    w = take_worker(iso)
    try:
        return w.call(name, args, kwargs, timeout_s=iso.timeout_s)
    finally:
        give_worker(iso, w)


# ---------------------------------------------------------------------------- the child side
def _child_main(recv, send) -> None:
    """The worker's loop (in the child): run calls until told to exit or the parent goes away."""
    import importlib

    import torch  # noqa: F401 - imported before "ready": start-up is not part of any call's timeout

    threads = None
    send.send_bytes(pickle.dumps(("ready",)))
    while True:
        try:
            msg = pickle.loads(recv.recv_bytes())
        except (EOFError, OSError):
            return
        if msg[0] == "exit":
            return
        _, target, args, kwargs, want_threads = msg
        try:
            if want_threads != threads:
                torch.set_num_threads(want_threads)
                threads = want_threads
            mod, _, fn = target.partition(":")
            obj = importlib.import_module(mod)
            for part in fn.split("."):
                obj = getattr(obj, part)
            reply = ("ok", obj(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            from .errors import KnownBadError, NotSupportedError

            reply = ("error", {"type": f"{type(exc).__module__}.{type(exc).__qualname__}",
                               "message": f"{type(exc).__name__}: {exc}",
                               "traceback": traceback.format_exc(limit=8),
                               "not_supported": isinstance(exc, NotSupportedError),
                               "known_bad": isinstance(exc, KnownBadError)})
        try:
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result
            data = pickle.dumps(("error", {"type": type(exc).__name__, "message": f"result not picklable: {exc}",
                                           "traceback": "", "not_supported": False, "known_bad": False}))
        try:
            send.send_bytes(data)
        except (OSError, EOFError):
            return


def trim_worker_heap() -> None:
    """Free what can be freed and let glibc walk its bins (``malloc_trim(0)``): corruption left by
    the candidate that just ran aborts now, in its own row."""
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
