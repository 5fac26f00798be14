"""Any registered backend through the plan contract (issue 35): what ``rawconv list`` shows for a
backend that brings no table of its own (:func:`listing`, :func:`print_listings`), and its rows in
``compare`` (:func:`plan_rows`, also ``rawconv.compare.plan_rows``). Nothing here names a backend.
"""
from __future__ import annotations

from typing import Any, Callable

from ..core.backend import Backend
from ..core.options import PRECISIONS
from .measure import _error_row, _measure, _tolerance

__all__ = ["listing", "print_listings", "plan_rows"]


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


# --------------------------------------------------------------------------- compare's rows
def _plan_arguments(direction: str, x, w, b, dy) -> tuple:
    """The plan contract's ``hot_run`` arguments for ``direction``."""
    if direction == "forward":
        return (x, w, b)
    if direction == "backward_data":
        return (dy, w)
    return (x, dy)


def plan_rows(be) -> Callable:
    """``compare``'s rows function for a registered backend ``be`` without one of its own, built on
    the plan contract (:class:`rawconv.core.backend.Plan`): every candidate of
    ``be.plan_for(problem, direction).candidates()``, each in a plan of its own (freed when the
    comparison ends), run through ``hot_run``. ``fpmath`` is passed as the plan's ``precision``
    where it is one of :data:`rawconv.options.PRECISIONS`."""

    def rows(problem, x, w, b, ref, ref_abs, timer, *, direction: str = "forward", dy=None, fpmath: str = "strict",
             finalizers: list | None = None, slow_s: float | None = None, **_other) -> list:
        options = {"precision": fpmath if fpmath in PRECISIONS else "strict"}
        args = _plan_arguments(direction, x, w, b, dy)
        out = []
        try:
            listing_plan = be.plan_for(problem, direction, options)
            try:
                cands = list(listing_plan.candidates())
            finally:
                listing_plan.free()
        except Exception as exc:  # noqa: BLE001 - a backend that cannot list this problem: one row says why
            return [_error_row(str(problem.name or problem.describe()), be.name, "(listing)", exc,
                               direction=direction)]
        for cand in cands:
            try:
                plan = be.plan_for(problem, direction, options, choice=cand.choice)
            except Exception as exc:  # noqa: BLE001 - the row says why
                out.append(_error_row(str(problem.name or problem.describe()), be.name, cand.choice, exc,
                                      direction=direction))
                continue
            if finalizers is not None:
                finalizers.append(plan.free)
            notes = ", ".join(getattr(cand, "notes", ()) or ())
            out.append(_measure(problem, be.name, cand.choice, notes, lambda plan=plan: plan.hot_run(*args), ref,
                                ref_abs, timer, tol=_tolerance(problem, direction),
                                workspace=getattr(cand, "workspace_bytes", None),
                                extra={"library": be.library}, slow_s=slow_s, direction=direction))
        return out

    return rows
