"""What ``rawconv.nn.convert(fuse=True)`` fuses, and where fusing is measured to win.

* :func:`activation_of_module` / :func:`activation_of_node`: the activation (rawconv's name, one of
  :data:`rawconv.fused.ACTIVATIONS`) a torch module or a torch.fx node computes with torch's exact
  semantics, or None: ``nn.ReLU``, ``F.relu``, ``torch.relu(_)``, ``.relu(_)``, ``clamp(min=0)``;
  ``nn.ReLU6``, ``F.relu6``, ``nn.Hardtanh(0, 6)``, ``F.hardtanh(x, 0, 6)``, ``clamp(0, 6)``;
  ``nn.SiLU``, ``F.silu``; ``nn.GELU()`` / ``F.gelu`` (erf: ``"gelu"``) and
  ``approximate="tanh"`` (``"gelu_tanh"``; the two are never taken one for the other);
  ``nn.Hardswish``, ``F.hardswish``; ``nn.Hardsigmoid``, ``F.hardsigmoid``; ``nn.Sigmoid``,
  ``torch.sigmoid``, ``F.sigmoid``, ``.sigmoid(_)``; ``nn.Tanh``, ``torch.tanh``, ``F.tanh``,
  ``.tanh(_)`` (the ``inplace=True`` forms included: the convolution's output is fresh).
* :func:`measure_cpu`: with ``convert(fuse=True, autotune=x)`` on the CPU, each fused layer's
  call (the fused oneDNN primitive with its post-ops, at its autotuned implementation) is timed
  against the same convolution with only its bias fused (at its own autotuned implementation)
  followed by torch's own ops for the residual add and the activation, interleaved in rounds
  (:func:`rawconv.core.postops.decide_fusion`); the layer keeps the fused call only where it was
  faster by median and by min, else it runs unfused for that problem, and the report says why.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import fused as _fused
from ..core.postops import FusionDecision, apply_activation, decide_fusion

__all__ = ["activation_of_module", "activation_of_node", "measure_cpu", "UNFUSED_ATTR", "clear"]

# ---------------------------------------------------------------------------- matching torch's activations
_MODULES = {nn.ReLU: "relu", nn.ReLU6: "relu6", nn.SiLU: "silu", nn.Hardswish: "hardswish",
            nn.Hardsigmoid: "hardsigmoid", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh"}


def activation_of_module(m) -> str | None:
    """The activation module ``m`` computes (exact class: a subclass may compute something else),
    or None."""
    t = type(m)
    if t in _MODULES:
        return _MODULES[t]
    if t is nn.GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(m.approximate)
    if t is nn.Hardtanh:
        return _clamp_act(m.min_val, m.max_val)
    return None


def _clamp_act(lo, hi) -> str | None:
    """clamp(x, lo, hi) as an activation: relu (lo 0, no hi) or relu6 (0, 6), else None. Both keep
    NaN, as torch's clamp does."""
    if isinstance(lo, bool) or isinstance(hi, bool) or not isinstance(lo, (int, float)) or float(lo) != 0.0:
        return None
    if hi is None:
        return "relu"
    return "relu6" if isinstance(hi, (int, float)) and float(hi) == 6.0 else None


# function -> (activation or a resolver of its bound arguments, its parameter names after the input)
_FUNCTIONS: dict = {
    torch.relu: ("relu", ()), torch.relu_: ("relu", ()), F.relu: ("relu", ("inplace",)),
    F.relu6: ("relu6", ("inplace",)), F.silu: ("silu", ("inplace",)), F.hardswish: ("hardswish", ("inplace",)),
    F.hardsigmoid: ("hardsigmoid", ("inplace",)), torch.sigmoid: ("sigmoid", ()), torch.tanh: ("tanh", ()),
    F.gelu: (lambda a: {"none": "gelu", "tanh": "gelu_tanh"}.get(a.get("approximate", "none")), ("approximate",)),
    F.hardtanh: (lambda a: _clamp_act(a.get("min_val", -1.0), a.get("max_val", 1.0)),
                 ("min_val", "max_val", "inplace")),
    torch.clamp: (lambda a: _clamp_act(a.get("min"), a.get("max")), ("min", "max")),
    torch.clip: (lambda a: _clamp_act(a.get("min"), a.get("max")), ("min", "max")),
}
for _name in ("relu_", "sigmoid_", "tanh_", "clamp_"):
    if hasattr(torch, _name):
        _base = _name[:-1]
        _FUNCTIONS.setdefault(getattr(torch, _name), _FUNCTIONS[getattr(torch, _base)] if _base != "clamp"
                              else _FUNCTIONS[torch.clamp])
for _name in ("relu_", "sigmoid", "tanh"):
    if hasattr(F, _name):
        _FUNCTIONS.setdefault(getattr(F, _name), (_name.rstrip("_"), ()))
_METHODS = {"relu": ("relu", ()), "relu_": ("relu", ()), "sigmoid": ("sigmoid", ()), "sigmoid_": ("sigmoid", ()),
            "tanh": ("tanh", ()), "tanh_": ("tanh", ()),
            "clamp": _FUNCTIONS[torch.clamp], "clamp_": _FUNCTIONS[torch.clamp], "clip": _FUNCTIONS[torch.clamp],
            "clip_": _FUNCTIONS[torch.clamp]}


def _bind(node, params) -> dict | None:
    """{parameter: constant} of a call node's arguments after its input, or None when one is not
    a constant (another node) or not a parameter of the function."""
    import torch.fx as fx

    extra = list(node.args[1:])
    if len(extra) > len(params):
        return None
    out = dict(zip(params, extra))
    for k, v in node.kwargs.items():
        if k not in params or k in out:
            return None
        out[k] = v
    if any(isinstance(v, (fx.Node, list, tuple, dict)) for v in out.values()):
        return None
    return out


def activation_of_node(node, modules: dict) -> str | None:
    """The activation a torch.fx node applies to its first argument (``modules``: the graph
    module's submodules by name), or None."""
    if not node.args:
        return None
    if node.op == "call_module":
        m = modules.get(node.target)
        return activation_of_module(m) if len(node.args) == 1 and not node.kwargs else None
    if node.op == "call_function":
        spec = _FUNCTIONS.get(node.target) if _hashable(node.target) else None
    elif node.op == "call_method":
        spec = _METHODS.get(node.target)
    else:
        return None
    if spec is None:
        return None
    act, params = spec
    bound = _bind(node, params)
    if bound is None:
        return None
    return act(bound) if callable(act) else act


def _hashable(t) -> bool:
    try:
        hash(t)
    except TypeError:
        return False
    return True


# ---------------------------------------------------------------------------- fused or not, on the CPU
UNFUSED_ATTR = "_rawconv_unfused"   # module.__dict__: {call key: the convolution's choice} of problems run unfused
_MEMO: dict = {}   # (fused tuning key, residual in place?) -> (decision dict, unfused choice or None)

#: rounds and calls per round of the measurement (:func:`rawconv.core.postops.decide_fusion`), and
#: its budget per problem in seconds (at least 3 rounds are timed)
ROUNDS, ITERATIONS, BUDGET_S = 7, 3, 0.5


def clear() -> None:
    """Forget the decisions measured in this process (``rawconv.nn.clear_tuning`` calls it)."""
    _MEMO.clear()


def _epilogue(y: torch.Tensor, residual, activation: str) -> torch.Tensor:
    """torch's own ops after an unfused convolution: the residual add and the activation, in
    place on the convolution's fresh output (what a model's ``out += identity; relu_(out)`` does)."""
    if residual is not None:
        y.add_(residual)
    return apply_activation(y, activation, inplace=True)


def run_unfused(m, x, w, b, residual, stride, pads, dilation, choice, plans, eager: bool) -> torch.Tensor:
    """Layer ``m``'s call with its epilogue in torch: the convolution with its bias on rawconv
    (``choice``: the convolution's own autotuned one; ``plans``: a frozen module's plans, the
    weights reordered once), then torch's residual add and activation. ``eager``: call the
    operator's kernel directly and write the epilogue in place; else through the operator
    (torch.compile traces it) and out-of-place torch ops."""
    if eager:
        y = _fused._op_kernel(x, w, b, None, stride, pads, dilation, m.groups, "none", m.backend, choice,
                              m.precision, False, plans)
        return _epilogue(y, residual, m.activation)
    y = torch.ops.rawconv.conv_bias_act(x, w, b, None, stride, pads, dilation, m.groups, "none", m.backend,
                                        choice, m.precision)
    if residual is not None:
        y = y + residual
    return apply_activation(y, m.activation)


def _plain_choice(x, w, b, m, padding, budget_s, tuned: dict) -> Any:
    """The autotuned choice (``"name@layouts"``) of the convolution with its bias alone (no
    post-op), on a weight snapshot reordered once, as a frozen module runs it; remembered in
    ``tuned`` (rawconv.nn's process memo) under its own key."""
    from .. import onednn

    plan = _fused.FusedConvolution(x, w, b, m.stride, norm_padding(padding), m.dilation, m.groups, residual=False,
                                   activation="none", fpmath=m.precision, prepack=True)
    key = ("fused", plan.problem, ("none", False), m.precision, "onednn", "", onednn.weights_layout(w))
    if key in tuned:
        plan.free()
        return tuned[key]
    try:
        rows = plan.autotune(iterations=3, warmup=1, budget_s=budget_s)   # wall time for the problem (None: no limit)
        best = rows[0].impl
        choice = f"{best.name}@{best.layouts}"
    finally:
        plan.free()
    tuned[key] = choice
    return choice


def norm_padding(padding):
    """``padding`` (or another argument) with its lists as tuples (a list or tuple of pairs, any of
    them lists: tuples of tuples), so that a list changed in place later is not the value seen now."""
    if isinstance(padding, (list, tuple)) and (type(padding) is list or any(isinstance(p, list) for p in padding)):
        return tuple(tuple(p) if isinstance(p, list) else p for p in padding)
    return padding


def measure_cpu(m, args: dict, fused_choice, fused_key, budget_s, tuned: dict, key=None) -> tuple:
    """Measure layer ``m``'s recorded fused call (``args``: x, padding, residual, w, b as the call
    had them; ``fused_choice``: its autotuned forward choice, ``fused_key``: its tuning key)
    fused against unfused and pin the outcome to the call's problem: unfused ones go into
    ``m.__dict__[UNFUSED_ATTR]`` (what :class:`rawconv.nn.ConvBiasAct2d`'s forward reads).
    Returns ``(entry, measured)``: the report's entry, ``{"decision": "fused" | "unfused",
    "fused_ms", "unfused_ms", "fused_min_ms", "unfused_min_ms", "rounds", "reason",
    "fused_choice", "unfused_choice"}`` (ms per call, each around the operator's kernel as the
    layer's eager forward calls it), or ``{"decision": "fused", "reason": ...}`` when there is
    nothing to unfuse (no residual and no activation: the bias is part of the convolution
    primitive either way); ``measured``: False when the process had measured the same problem
    before (a layer of the same shape: the decision is reused). ``key``: the call's key in the
    module's tables (rawconv.nn's ``_call_key``), under which an unfused choice is pinned."""
    residual = args.get("residual")
    if m.activation == "none" and residual is None:
        return {"decision": "fused", "reason": "nothing to unfuse (conv + bias is one primitive either way)"}, False
    inplace = bool(m.__dict__.get("residual_inplace", False))
    memo_key = (fused_key, inplace)
    hit = _MEMO.get(memo_key)
    measured = hit is None
    if measured:
        hit = _MEMO[memo_key] = _measure(m, args, fused_choice, budget_s, tuned, inplace)
    entry, choice = hit
    table = m.__dict__.get(UNFUSED_ATTR)
    if table is None:
        table = m.__dict__[UNFUSED_ATTR] = {}
    if choice is not None and key is not None:
        table[key] = choice
    else:
        table.pop(key, None)
    if not table:
        m.__dict__.pop(UNFUSED_ATTR, None)
    return dict(entry), measured


def _measure(m, args, fused_choice, budget_s, tuned, inplace) -> tuple:
    x, padding, residual = args["x"], args["padding"], args.get("residual")
    w, b = args["w"], args["b"]
    st = _fused.frozen_state(m)
    plans = st.plans if st is not None else None
    stride, pads, dilation = m._op_args()
    unfused_choice = _plain_choice(x, w, b, m, padding, budget_s, tuned)
    fc = str(fused_choice) if fused_choice is not None and not isinstance(fused_choice, str) else fused_choice
    scratch = residual.clone() if residual is not None and inplace else None

    def fused():
        with torch.no_grad():
            if scratch is not None:
                return _fused._op_kernel(x, w, b, scratch, stride, pads, dilation, m.groups, m.activation,
                                         m.backend, fc, m.precision, True, plans)
            return _fused._op_kernel(x, w, b, residual, stride, pads, dilation, m.groups, m.activation, m.backend,
                                     fc, m.precision, False, plans)

    def unfused():
        with torch.no_grad():
            return run_unfused(m, x, w, b, residual, stride, pads, dilation, unfused_choice, plans, True)

    d: FusionDecision = decide_fusion(fused, unfused, rounds=ROUNDS, iterations=ITERATIONS,
                                      budget_s=min(budget_s, BUDGET_S) if budget_s else BUDGET_S)
    entry = dict(d.as_dict(), unfused_choice=unfused_choice, fused_choice=fc)
    return entry, (None if d.fused else unfused_choice)
