"""Progress bars for long work (``compare`` sweeps, autotune searches), with tqdm.

``progress`` arguments across rawconv take ``None`` (the default: a bar when someone can see it:
stderr is a terminal, or the code runs in a Jupyter kernel that can show tqdm's notebook widget),
``True`` (always) or ``False`` (never). In a Jupyter kernel the bar is tqdm's notebook widget
(``tqdm.notebook``, which needs ipywidgets): without ipywidgets there is no automatic bar there,
because tqdm's text bar on stderr is kept redraw by redraw in the cell's output (a pink block of
bars in the notebook's HTML export). ``progress=True`` in a kernel without ipywidgets still gets
that text bar, at most one redraw a second. Not a terminal and not a notebook (a pipe, a file, a
CI log): no automatic bar. ``$RAWCONV_PROGRESS=0`` turns every automatic bar off.

The innermost active bar is kept in a context variable so that code deep inside the work (one
candidate's measurement, one search trial) can name what it is doing with :func:`note` without
being handed the bar.
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import sys
import time

from . import env as _env
from .errors import ArgumentTypeError

__all__ = ["enabled", "in_notebook", "bar", "note"]

_current: contextvars.ContextVar = contextvars.ContextVar("rawconv_progress", default=None)


def in_notebook() -> bool:
    """True inside a Jupyter (ipykernel) kernel."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython

        ip = get_ipython()
    except Exception:  # noqa: BLE001 - no IPython: not a notebook
        return False
    return ip is not None and hasattr(ip, "kernel")


def enabled(progress) -> bool:
    """Whether to show a bar for a ``progress`` argument (None: automatic, see the module notes).
    Raises :class:`~rawconv.errors.ArgumentTypeError` for anything but None, True or False."""
    if progress is not None and not isinstance(progress, bool):
        raise ArgumentTypeError(f"progress must be None (automatic), True or False, got {progress!r}")
    if progress is not None:
        return progress
    if not _env.get("RAWCONV_PROGRESS"):
        return False
    if in_notebook():
        return _has_widgets()
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _has_widgets() -> bool:
    """ipywidgets is importable (tqdm's notebook widget needs it)."""
    return importlib.util.find_spec("ipywidgets") is not None


def _tqdm_class():
    if in_notebook() and _has_widgets():
        from tqdm.notebook import tqdm

        return tqdm
    from tqdm.std import tqdm

    return tqdm


class _Bar:
    """A tqdm bar (or nothing when disabled) with :meth:`note` and, for time-based work
    (``seconds`` set), a bar of elapsed seconds out of a budget."""

    def __init__(self, show: bool, total=None, desc: str = "", unit: str = "it", seconds: float | None = None):
        self.t0 = time.perf_counter()
        self._shown = 0.0
        self.seconds = seconds
        self.tqdm = None
        if show:
            cls = _tqdm_class()
            kw = dict(total=round(seconds, 1) if seconds is not None else total, desc=desc, leave=False,
                      unit="s" if seconds is not None else unit, dynamic_ncols=True, mininterval=0.2)
            if seconds is not None:
                kw["bar_format"] = "{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s{postfix}"
            if cls.__module__ == "tqdm.std":
                kw["file"] = sys.stderr
                if in_notebook():   # a text bar in a notebook: every redraw is kept in the cell's output
                    kw["mininterval"] = 1.0
            self.tqdm = cls(**kw)

    def note(self, text: str) -> None:
        if self.tqdm is None:
            return
        now = time.perf_counter()
        if self.seconds is not None:
            self.tqdm.n = min(round(now - self.t0, 1), self.tqdm.total or 0)
        self.tqdm.set_postfix_str(text[:60], refresh=False)
        if now - self._shown >= self.tqdm.mininterval:   # a notebook keeps every redraw
            self._shown = now
            self.tqdm.refresh()

    def update(self, n: int = 1) -> None:
        if self.tqdm is not None and self.seconds is None:
            self.tqdm.update(n)

    def write_mode(self):
        """A context in which printing to stdout does not garble the bar (tqdm's external write mode)."""
        if self.tqdm is None:
            return contextlib.nullcontext()
        return type(self.tqdm).external_write_mode()

    def close(self) -> None:
        if self.tqdm is not None:
            self.tqdm.close()
            self.tqdm = None


@contextlib.contextmanager
def bar(progress=None, *, total=None, desc: str = "", unit: str = "it", seconds: float | None = None):
    """A progress bar for the duration of a ``with`` block (``progress``: see :func:`enabled`);
    yields an object with ``note(text)`` (the current item), ``update(n)`` and ``write_mode()``.
    ``seconds``: a time budget; the bar then shows elapsed seconds of it."""
    b = _Bar(enabled(progress), total, desc, unit, seconds)
    token = _current.set(b)
    try:
        yield b
    finally:
        _current.reset(token)
        b.close()


def note(text: str) -> None:
    """Name the current item on the innermost active bar (nothing when there is none)."""
    b = _current.get()
    if b is not None:
        b.note(text)
