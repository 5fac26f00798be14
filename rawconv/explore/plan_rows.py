"""Listings of any registered backend through the plan contract (issue 35): what ``rawconv list``
shows for a backend that brings no table of its own (:func:`listing`, :func:`print_listings`; its
rows in ``compare`` come from :func:`rawconv.compare.plan_rows`). Nothing here names a backend.
"""
from __future__ import annotations

from typing import Any

from ..core.backend import Backend

__all__ = ["listing", "print_listings"]


def listing(be: Backend, problem: Any, direction: str = "forward", options: Any = None) -> list[str]:
    """One line per candidate of ``be`` for ``problem`` (its stable name, notes, workspace, why
    it is known bad), as ``rawconv list`` prints a backend without a table of its own."""
    plan = be.plan_for(problem, direction, options)
    try:
        cands = list(plan.candidates())
    finally:
        plan.free()
    lines = []
    for c in cands:
        ws = getattr(c, "workspace_bytes", None)
        parts = [c.choice, ", ".join(getattr(c, "notes", ()) or ()), "" if ws is None else f"workspace {ws} B",
                 f"known bad: {c.known_bad}" if getattr(c, "known_bad", "") else ""]
        lines.append("  ".join(p for p in parts if p))
    return lines


def print_listings(console, problem: Any, direction: str = "forward") -> None:
    """``rawconv list``'s lines for the registered backends of the problem's device beyond the
    built-in ones (which have tables of their own): each backend's :func:`listing`, or why not."""
    from ..core.backend import BUILTIN, backends

    for be in backends("cuda" if str(problem.device).startswith("cuda") else "cpu"):
        if be.name in BUILTIN:
            continue
        try:
            lines = listing(be, problem, direction)
        except Exception as exc:  # noqa: BLE001 - one backend's failure to list is shown, not raised
            lines = [f"not listed: {type(exc).__name__}: {exc}"]
        console.print(f"{problem} ({direction}) on {be.name} ({be.library}):")
        for line in lines:
            console.print(f"  {line}")
