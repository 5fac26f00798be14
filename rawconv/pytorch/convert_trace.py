"""The traced calls :func:`rawconv.nn.convert` (``fuse=True``) rewrites in torch.fx's graph of a model
besides its convolutions: a BatchNorm subclass's ``F.batch_norm`` on its own tensors (folded, or run
on the module), the rank checks between a conv and its BatchNorm, and the ``training`` arguments the
eval-mode trace recorded (:func:`_follow_training_mode`, :func:`_mark_literal_training`)."""
from __future__ import annotations

import operator
import warnings

import torch

from .modules import bn_forward as _bn_forward


_BN_ARGS = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")


def _functional_bn(node, modules: dict, *, sole: bool = True):
    """``(BatchNorm module name, module)`` when ``node`` is a traced ``F.batch_norm`` call in eval
    mode on a BatchNorm module's own tensors (what fx makes of a BatchNorm subclass's forward, e.g.
    timm's ``BatchNormAct2d``, which it traces into), else None. ``sole``: each tensor read by this
    call only (False: a BatchNorm called more than once, whose reads fx shares)."""
    import torch.fx as fx

    if node.op != "call_function" or node.target is not torch.nn.functional.batch_norm or len(node.args) > 8 \
            or node.meta.get(_LITERAL):   # a BatchNorm the model always runs in eval mode: left as written
        return None
    a = dict(zip(_BN_ARGS, node.args))
    if set(a) & set(node.kwargs) or not set(node.kwargs) <= set(_BN_ARGS):
        return None
    a.update(node.kwargs)
    if a.get("training", False) is not False:
        return None
    owner = None
    for part in ("running_mean", "running_var", "weight", "bias"):
        t = a.get(part)
        if t is None and part in ("weight", "bias"):
            name = None   # affine=False: the module's must be None too
        elif isinstance(t, fx.Node) and t.op == "get_attr" and (len(t.users) == 1 or not sole) and t.target.endswith("." + part):
            name = t.target[: -len(part) - 1]
        else:
            return None
        if name is not None:
            if owner not in (None, name):
                return None
            owner = name
    bn = modules.get(owner) if owner is not None else None
    if not isinstance(bn, torch.nn.modules.batchnorm._BatchNorm) or a.get("eps", 1e-5) != bn.eps \
            or a.get("momentum", 0.1) != (0.0 if bn.momentum is None else bn.momentum):   # (torch's eval call's)
        return None
    for part in ("weight", "bias"):   # the call reads the module's own parameters (or neither)
        if (a.get(part) is None) != (getattr(bn, part) is None):
            return None
    return owner, bn


def _untrace_batchnorms(graph, originals: dict) -> dict:
    """Each traced ``F.batch_norm`` call left on a BatchNorm (subclass) module's own tensors (not
    folded: after another op than a conv, as in a pre-activation block) becomes a call of
    :func:`rawconv.pytorch.modules.bn_forward` on the module, which computes in eval mode what the
    trace recorded and in training mode what the module's batch norm computes there (the
    momentum, ``momentum=None``'s cumulative average and ``num_batches_tracked`` included, which
    the eval trace baked in or left out). Returns ``{name: module}`` of those BatchNorms."""
    kept: dict = {}
    for node in list(graph.nodes):
        functional = _functional_bn(node, originals, sole=False)
        if functional is None:
            continue
        bn_name, bn = functional
        src = node.args[0] if node.args else node.kwargs.get("input")
        attrs = [n for n in node.all_input_nodes if n is not src]
        with graph.inserting_before(node), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)   # fx: the module is set in the GraphModule after
            new = graph.call_function(_bn_forward, (graph.get_attr(bn_name), src))
        new.meta["is_wrapped"] = True   # a leaf when fx traces the code again (a pickled model's load)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        for a in attrs:
            if not a.users:
                graph.erase_node(a)
        kept[bn_name] = bn
    return kept


_TRAINING_ARG = {"dropout": 2, "alpha_dropout": 2, "feature_alpha_dropout": 2, "dropout1d": 2, "dropout2d": 2,
                 "dropout3d": 2, "batch_norm": 5, "rrelu": 3}


_LITERAL = "rawconv_literal_training"   # node.meta: the call's training=False is the model's own constant


def _training_pos(n):
    """Where the ``training`` argument of a traced ``torch.nn.functional`` call of :data:`_TRAINING_ARG`
    is (``"training"`` for a keyword, else its position), or None when ``n`` is none or it is not given."""
    name = getattr(n.target, "__name__", "") if n.op == "call_function" else ""
    pos = _TRAINING_ARG.get(name)
    if pos is None or getattr(n.target, "__module__", "") != "torch.nn.functional":
        return None
    return "training" if "training" in n.kwargs else pos if len(n.args) > pos else None


def _training_arg(n):
    """The recorded ``training`` argument of such a call (:func:`_training_pos`), or None when ``n`` is
    none or the argument is not a constant bool."""
    pos = _training_pos(n)
    v = None if pos is None else n.kwargs[pos] if pos == "training" else n.args[pos]
    return v if isinstance(v, bool) else None


def _mark_literal_training(graph, model, tracer_cls) -> None:
    """Tell a ``training=False`` the model wrote (``F.dropout(x, p, False)``, a frozen BatchNorm) from
    one that is ``self.training`` as the eval trace recorded it: the model is traced a second time in
    training mode (its modules' flags restored after), and a call whose argument is False in both
    traces, the calls matched in order, is marked (``node.meta``) to stay as written. When the two
    traces' calls do not match one to one (or the second trace fails), nothing is marked: every
    recorded False then follows the model's mode."""
    evals = [n for n in graph.nodes if _training_arg(n) is not None]
    if not any(_training_arg(n) is False for n in evals):
        return
    flags = [(m, m.training) for m in model.modules()]
    try:
        model.train()
        tracer = tracer_cls()
        tracer.proxy_buffer_attributes = True   # a buffer's in-place update (num_batches_tracked) traced, not run
        trains = [n for n in tracer.trace(model).nodes if _training_arg(n) is not None]
    except Exception:   # noqa: BLE001  (torch.fx raises many types for untraceable code)
        return
    finally:
        for m, f in flags:
            m.training = f
    if len(trains) != len(evals) or any(a.target is not b.target for a, b in zip(evals, trains)):
        return
    for a, b in zip(evals, trains):
        if _training_arg(a) is False and _training_arg(b) is False:
            a.meta[_LITERAL] = True


def _training_flag(graph, before):
    """A ``self.training`` read (the GraphModule's own flag) inserted before node ``before``."""
    with graph.inserting_before(before), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # fx: "get_attr ... no underlying reference" (a bool)
        return graph.get_attr("training")


def _follow_training_mode(graph) -> list:
    """Make the traced calls of ``torch.nn.functional`` whose ``training`` argument the trace recorded
    as a constant (a functional dropout, a BatchNorm that was not folded, as timm's modules make)
    read the traced model's own ``training`` flag instead, so ``.train()`` / ``.eval()`` of the
    converted model switch them as they switched the original. Returns the names of the calls."""
    out = []
    for n in list(graph.nodes):
        # the trace is made in eval mode: a recorded True is the model's own constant (F.dropout's
        # default, a BatchNorm without running statistics), never its training flag
        if _training_arg(n) is not False or n.meta.get(_LITERAL):
            continue
        pos, flag = _training_pos(n), _training_flag(graph, n)
        if pos == "training":
            n.kwargs = {**n.kwargs, "training": flag}
        else:
            n.args = n.args[:pos] + (flag,) + n.args[pos + 1:]
        out.append(n.name)
    return out


def _drop_rank_asserts(graph, fusable) -> None:
    """Take out the traced input-rank checks on a fusable conv's output (``torch._assert(x.ndim == 4)``,
    which timm's ``BatchNormAct2d`` makes): they stand between the conv and its BatchNorm. A conv's
    output has the rank the check asks for whenever the input is batched; the fused module checks its
    own input."""
    import torch.fx as fx

    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch._assert or node.users or not node.args:
            continue
        cond = node.args[0]
        if not (isinstance(cond, fx.Node) and cond.op == "call_function" and cond.target is operator.eq
                and len(cond.args) == 2 and len(cond.users) == 1 and isinstance(cond.args[1], int)):
            continue
        rank = cond.args[0]
        if not (isinstance(rank, fx.Node) and rank.op == "call_function" and rank.target is getattr
                and rank.args[1:] == ("ndim",) and isinstance(rank.args[0], fx.Node) and fusable(rank.args[0])):
            continue
        src = rank.args[0]
        conv_w = getattr(graph.owning_module.get_submodule(src.target), "weight", None)
        if conv_w is None or cond.args[1] != conv_w.dim():
            continue
        graph.erase_node(node)
        graph.erase_node(cond)
        for u in list(src.users):   # this check's rank read and the unused ones (its message's)
            if u.op == "call_function" and u.target is getattr and u.args[1:] == ("ndim",) and not u.users:
                graph.erase_node(u)
