"""Finding native libraries and the cdefs text: shared by the oneDNN and cuDNN bindings.

A search is a list of ``(how, path_or_name)`` candidates tried in order; the first that
``ffi.dlopen`` accepts wins and is recorded with ``how`` (``found_via``). When all fail,
:class:`~rawconv.errors.LibraryNotFoundError` lists every attempt and its reason.
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .errors import LibraryNotFoundError

log = logging.getLogger("rawconv")


def cdefs_text(name: str) -> str:
    """Return the text of ``cdefs/<name>``: inside the installed package, or the source tree's."""
    here = Path(__file__).resolve().parent.parent   # the rawconv package (this file is rawconv/core/loader.py)
    for folder in (here / "cdefs", here.parent / "cdefs"):
        p = folder / name
        if p.is_file():
            return p.read_text()
    raise FileNotFoundError(f"cdefs/{name} is missing (looked in {here / 'cdefs'} and {here.parent / 'cdefs'})")


@dataclass
class Loaded:
    """What was loaded: the cffi library object, its path, how it was found, every attempt."""

    lib: object
    path: str
    found_via: str
    attempts: list = field(default_factory=list)


def prefixes() -> list[Path]:
    """``sys.prefix`` and, in a venv, its base (where data files of wheels land), deduplicated."""
    out = []
    for p in (sys.prefix, getattr(sys, "base_prefix", sys.prefix), sys.exec_prefix):
        pp = Path(p)
        if pp not in out:
            out.append(pp)
    return out


def site_dirs() -> list[Path]:
    """Every site-packages folder on ``sys.path`` (wheels such as nvidia-cudnn-cu12 install there)."""
    out = []
    for p in sys.path:
        if p and ("site-packages" in p or "dist-packages" in p):
            pp = Path(p)
            if pp.is_dir() and pp not in out:
                out.append(pp)
    return out


def try_load(ffi, library: str, candidates: list[tuple[str, str]], flags: int | None = None,
             symbol: str | None = None) -> Loaded:
    """Try ``ffi.dlopen`` on each ``(how, target)`` in order. ``target`` is a path or a soname.

    A path that does not exist is recorded as such without calling dlopen. With ``symbol``, a
    library that loads but does not export it (another library under that name) is closed
    again and recorded as such. Raises :class:`LibraryNotFoundError` listing every attempt (the
    dynamic loader's own message for each) when none loads.
    """
    attempts: list[tuple[str, str]] = []
    for how, target in candidates:
        where = f"{how}: {target}"
        if os.sep in target and not os.path.exists(target):
            attempts.append((where, "no such file"))
            log.debug("rawconv: %s: no such file", where)
            continue
        if os.sep in target and os.path.isdir(target):
            attempts.append((where, "is a directory, not a library file"))
            continue
        try:
            lib = ffi.dlopen(target) if flags is None else ffi.dlopen(target, flags)
        except OSError as exc:
            attempts.append((where, str(exc).strip() or "dlopen failed"))
            log.debug("rawconv: %s: %s", where, exc)
            continue
        if symbol is not None:
            try:
                getattr(lib, symbol)
            except AttributeError:
                attempts.append((where, f"loads, but exports no {symbol}: it is not {library}"))
                try:
                    ffi.dlclose(lib)
                except Exception:  # noqa: BLE001  (already closed / not closable: harmless)
                    pass
                continue
        log.debug("rawconv: loaded %s via %s", target, how)
        return Loaded(lib, target, how, attempts + [(where, "loaded")])
    raise LibraryNotFoundError(library, attempts)


def explicit_label(library: str, env_var: str, path: str) -> str:
    """The library name used in the error when an explicit ``$env_var`` does not load: it says
    that rawconv did not fall back to another copy, and how to let it search."""
    return (f"{library} from ${env_var}={path} (set explicitly, so rawconv tried no other copy; "
            f"fix the path, or unset {env_var} to search the usual places)")
