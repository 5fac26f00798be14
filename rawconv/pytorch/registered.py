"""The torch operators' and modules' way to a backend by the registry (issue 35): a backend
registered with :func:`rawconv.core.backend.register` (beyond the built-in ``onednn``, ``cudnn``,
``cudnn_graph``) runs as ``backend="<its name>"`` in :func:`rawconv.ops.conv`, the operators
``torch.ops.rawconv.conv_*``, :mod:`rawconv.nn`'s modules and :func:`rawconv.nn.convert`.

Its plans are reached through :meth:`Backend.plan_for <rawconv.core.backend.Backend.plan_for>`
alone and run through the plan contract (:class:`rawconv.core.backend.Plan`: ``hot_run``, which
checks its tensors itself); :class:`OperatorPlan` gives such a plan the shape the operators'
plan caches hold (batched tensors in, the result in torch's layout and the operator's form out).
:func:`tune` autotunes such a plan (``convert(..., autotune=x)``, ``choice="fastest"``) by the one
driver, :func:`rawconv.core.autotune.drive`, when its plans offer the timing hook
(:class:`rawconv.core.autotune.Tunable`), else by the plan's own ``autotune(budget_s=)``.
"""
from __future__ import annotations

from typing import Any

import torch

from ..core import autotune as _autotune, backend as _backend
from ..core.errors import ArgumentError
from ..core.problem import (ConvProblem, backward_data_layout, check_tensor, dense_strides, empty_like_layout,
                            shape_only, strides_match)

BUILTIN = ("auto", "onednn", "cudnn", "cudnn_graph")


def names() -> tuple[str, ...]:
    """Every name ``backend=`` takes: ``"auto"`` and each registered backend's (built-in ones first)."""
    return ("auto",) + tuple(b.name for b in _backend.backends())


def device_type(name: str) -> str | None:
    """The device type (``"cpu"``, ``"cuda"``) backend ``name`` runs on; None for ``"auto"`` or a
    name no backend is registered under."""
    if name == "auto":
        return None
    be = next((b for b in _backend.backends() if b.name == name), None)   # (the built-in ones registered first)
    return None if be is None else be.device_type


def check(name: Any) -> str:
    """``name`` when ``backend=`` takes it (:func:`names`); raises :class:`ArgumentError` naming
    those it takes otherwise (a non-string: the caller's type check comes first)."""
    if name == "auto" or device_type(name) is not None:
        return name
    raise ArgumentError(f"backend must be one of {list(names())}, got {name!r}")


def backward_data_problem(grad_y, w, x_shape, stride, padding, dilation, groups) -> ConvProblem:
    """The forward problem of a backward-data call on any device (x of ``x_shape``, ``padding``
    one (before, after) pair per spatial dim), its layout dx's (torch's rule,
    :func:`rawconv.problem.backward_data_layout`); raises rawconv's errors for bad input."""
    x_shape = tuple(int(s) for s in x_shape)
    problem = ConvProblem.from_torch(shape_only(x_shape, grad_y, "x_shape"), w, None, stride, padding, dilation, groups)
    check_tensor(problem, grad_y, "grad_y", problem.y_shape)
    lay = backward_data_layout(grad_y.unsqueeze(0) if problem.unbatched else grad_y, w)
    return problem if lay == problem.layout else problem.with_(layout=lay)


class OperatorPlan:
    """A registered backend's plan as the operators' caches hold plans: ``_hot_run(x, w, bias, out)``
    (forward), ``_grad_hot_run(a, b)`` (backward: dx, or ``(dw, db)`` / dw as the problem has a
    bias or not), ``_hot_call(a, b, bias)`` / ``_hot_forward`` (the CUDA kernels' forms: dx or dw
    alone), ``execute``, ``problem``, ``selected``. The hot forms return None for tensors whose
    metadata differ from the last checked call's (``execute``); each runs the plan's ``hot_run``
    on batched tensors, lays the result out in torch's layout for the operator
    (``problem.layout``) and unbatches it for an unbatched call."""

    __slots__ = ("plan", "problem", "direction", "key")

    def __init__(self, plan, problem: ConvProblem, direction: str):
        self.plan, self.problem, self.direction = plan, problem, direction
        self.key = None   # the tensors' metadata of the last checked call (execute)

    @property
    def selected(self):
        return self.plan.selected

    def _out(self, t: torch.Tensor, squeeze: bool) -> torch.Tensor:
        if not strides_match(t, dense_strides(t.shape, self.problem.layout)):
            t = empty_like_layout(t.shape, self.problem.layout, t.dtype, t.device).copy_(t)
        return t.squeeze(0) if squeeze else t

    def _run(self, a, b, bias=None):
        """The operator's result: y, dx, or ``(dw, db)`` (db None without a bias)."""
        unbatched = self.problem.unbatched
        if unbatched:
            a = a.unsqueeze(0)
            if self.direction == "backward_weights":
                b = b.unsqueeze(0)
        res = self.plan.hot_run(a, b, bias) if self.direction == "forward" else self.plan.hot_run(a, b)
        if self.direction != "backward_weights":
            return self._out(res[0] if isinstance(res, tuple) else res, unbatched)
        dw, db = res if isinstance(res, tuple) else (res, None)
        if self.problem.has_bias and db is None:   # grad_y summed over batch and space (as the CUDA kernels)
            db = b.sum([0] + list(range(2, b.dim())), dtype=torch.float64 if b.dtype == torch.float64
                       else torch.float32).to(b.dtype)
        return self._out(dw, False), db

    def _fits(self, a, b, bias) -> bool:
        """Whether ``a``, ``b`` (and bias's presence) have exactly the metadata of the checked call
        the plan was made for (its problem): else the hot forms return None, and the caller takes
        its checked path (a plan of the tensors' own problem and layout)."""
        try:
            return self.key == (a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, bias is None)
        except AttributeError:   # not tensors: the checked path says what is wrong
            return False

    def _hot_run(self, x, w, bias, out=None):
        return self._run(x, w, bias) if self._fits(x, w, bias) else None

    def _grad_hot_run(self, a, b):
        if not self._fits(a, b, None):
            return None
        res = self._run(a, b)
        return res[0] if self.direction == "backward_weights" and not self.problem.has_bias else res

    def _hot_call(self, a, b, bias=None):
        if not self._fits(a, b, bias):
            return None
        res = self._run(a, b, bias)
        return res[0] if self.direction == "backward_weights" else res

    _hot_forward = _hot_call

    def execute(self, x=None, w=None, bias=None, out=None, *, grad_y=None):
        """The checked call (on the tensors the plan was made for): y, dx, or ``(dw, db)`` /
        dw as the problem has a bias or not. Later calls with tensors of the same metadata may take
        the hot forms."""
        a, b = {"forward": (x, w), "backward_data": (grad_y, w)}.get(self.direction, (x, grad_y))
        self.key = None
        res = self._run(a, b, bias)
        self.key = (a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, bias is None)
        return res[0] if self.direction == "backward_weights" and not self.problem.has_bias else res


def plan(name: str, direction: str, problem: ConvProblem, choice: str, precision: str) -> OperatorPlan:
    """Backend ``name``'s plan (:meth:`Backend.plan_for <rawconv.core.backend.Backend.plan_for>`)
    for the operator's ``problem`` (its ``layout``: the result's, torch's rule) and ``direction``,
    ``choice`` ('' = the library's first) selected (a choice it does not offer raises now) and
    ``precision`` (:class:`rawconv.Options`' ``precision``)."""
    be = _backend.get(name)
    dev = problem.device.split(":")[0]
    if be.device_type != dev:
        raise ArgumentError(f"backend {name!r} runs on {be.device_type.upper()} tensors, got {dev.upper()} tensors")
    if choice == "fastest":   # autotuned (once per problem: the operators cache the plan under this choice)
        p = be.plan_for(problem, direction, {"precision": precision})
        _tuned(p, None)
    else:
        p = be.plan_for(problem, direction, {"precision": precision}, choice or None)
    p.selected   # noqa: B018  (resolve the selection now: a bad choice raises before caching)
    return OperatorPlan(p, problem, direction)


def _tuned(p, budget_s):
    """Autotune plan ``p`` within ``budget_s`` (seconds of wall time for its problem and
    direction; None: no limit): by :func:`rawconv.core.autotune.drive` when it offers the timing
    hook, else by its own ``autotune``. Returns the table (the winner first), the winner selected."""
    if isinstance(p, _autotune.Tunable):
        return _autotune.drive(p, budget_s)
    return p.autotune(budget_s=budget_s)


def tune(name: str, direction: str, problem: ConvProblem, precision: str, budget_s: float | None,
         info: dict | None = None) -> str:
    """The winning choice's name for backend ``name``'s plan of ``problem`` and ``direction``
    (what :func:`rawconv.nn.convert`'s ``autotune=`` pins), autotuned within ``budget_s`` (seconds
    of wall time for the problem and direction; None: no limit). ``info`` (a dict) receives the
    winner's ``median_ms`` / ``min_ms`` (its tuning record is in :func:`rawconv.tuning.cache`). Raises
    :class:`NotSupportedError` when no candidate ran correctly."""
    p = _backend.get(name).plan_for(problem, direction, {"precision": precision})
    try:
        rows = _tuned(p, budget_s)
        choice = p.selected.choice
        if info is not None:
            info.update(median_ms=getattr(rows[0], "median_ms", None), min_ms=getattr(rows[0], "min_ms", None))
    finally:
        p.free()
    return choice
