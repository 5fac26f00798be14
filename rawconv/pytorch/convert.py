""":func:`rawconv.nn.convert` (every conv of a model swapped, BatchNorm folded, conv+bias(+add)+activation
fused through torch.fx or per Sequential, each distinct problem autotuned), the twins of plain torch
conv subclasses, :func:`refresh`, :func:`torch_fallbacks`, :func:`pinned_choices` and :func:`pin_choices`."""
from __future__ import annotations

import copy
import operator
import time
import warnings
from typing import Any

import torch

from . import fallback as _fallback
from . import fused as _fused
from . import fusion as _fusion
from . import pins as _pins
from .pins import check_choice as _check_choice, is_step as _is_step, split as _split
from ..core.autotune import check_budget as _check_budget
from ..core.errors import ArgumentError, ArgumentTypeError, NotSupportedError, RawconvError
from ..core import guard as _guard
from . import search as _search_mod
from .functional import _check_backend, _check_precision, _resolve_backend
from .search import (_NEW_ATTR, _TUNED, _TUNED_ATTR, _UNFUSED_OFFERED_ON, _call_key, _onednn_here, _problem_of,
                     _record_calls, _rng_kept, _tune_key)
from .convert_trace import (_drop_rank_asserts, _follow_training_mode, _functional_bn, _mark_literal_training,  # noqa: F401
                            _untrace_batchnorms, _BN_ARGS, _TRAINING_ARG)
from .modules import (Conv1d, Conv2d, Conv3d, _BATCHNORMS, _ConvBiasAct, _FUSED, _FusedSequential, _RawconvConv, _SWAP,
                      _TORCH_CONVS, _check_bn, _conv_modules, _fused_modules)
from .report import ConvertReport

FACE = "rawconv.pytorch.nn"   # where this module's public names live (rawconv.nn): pickles, messages


def _plain_subclass_base(t: type):
    """The torch conv class ``t`` subclasses without changing how it computes (no ``forward``,
    ``_conv_forward`` or ``_output_padding`` of its own, not rawconv's: torchvision's
    ``Conv3DSimple``, which r3d_18 is made of), else None."""
    if t in _SWAP or issubclass(t, _RawconvConv):
        return None
    for base in _SWAP:
        if issubclass(t, base):
            same = all(getattr(t, a, None) is getattr(base, a, None) for a in ("forward", "_conv_forward",
                                                                                 "_output_padding"))
            return base if same else None
    return None


_SUBCLASS_PREFIX = "_Rawconv__"


def _subclass_name(t: type) -> str:
    """An importable name in this module for the rawconv twin of a plain subclass ``t`` (the name
    says where ``t`` lives, so that an unpickling process can make the class again)."""
    return _SUBCLASS_PREFIX + f"{t.__module__}.{t.__qualname__}".replace("_", "_u").replace(".", "_d")


def _subclass_twin(t: type, base: type) -> type:
    """The rawconv twin of ``t`` (a plain subclass of torch's ``base``), made once: a subclass of
    both rawconv's class for ``base`` and ``t`` (``isinstance(m, t)`` still holds, ``t``'s other
    methods stay), computing as rawconv's class; registered in this module, named on the face
    (``rawconv.pytorch.nn``, whose ``__getattr__`` is :func:`_face_getattr`) so that pickles find it."""
    name = _subclass_name(t)
    cls = globals().get(name)
    if cls is None:
        cls = type(t.__name__, (_SWAP[base], t), {"__module__": FACE, "__qualname__": name,
                                                  "__doc__": f"{t.__module__}.{t.__qualname__} on rawconv "
                                                             f"(as {_SWAP[base].__name__})"})
        globals()[name] = cls
    return cls


def _face_getattr(name: str):   # an unpickled model's subclass twin, made again in a fresh process
    if name.startswith(_SUBCLASS_PREFIX):
        import importlib

        path = name[len(_SUBCLASS_PREFIX):].replace("_d", ".").replace("_u", "_")
        mod, _, qual = path.rpartition(".")
        for cut in range(path.count(".")):   # the module part is the longest importable prefix
            try:
                t = importlib.import_module(mod)
                for part in qual.split("."):
                    t = getattr(t, part)
                base = _plain_subclass_base(t) if isinstance(t, type) else None
                if base is not None:
                    return _subclass_twin(t, base)
                break
            except (ImportError, AttributeError):
                mod, _, head = mod.rpartition(".")
                qual = f"{head}.{qual}"
                if not mod:
                    break
    raise AttributeError(f"module {FACE!r} has no attribute {name!r}")


def _swap_class(m: torch.nn.Module):
    """The rawconv class ``m`` becomes, or None: an exact torch conv class's twin, or a plain
    subclass's (:func:`_subclass_twin`)."""
    cls = _SWAP.get(type(m))
    if cls is not None:
        return cls
    base = _plain_subclass_base(type(m))
    return None if base is None else _subclass_twin(type(m), base)


def _swap_module(m: torch.nn.Module, backend, choice, precision) -> torch.nn.Module:
    """``m`` (a torch conv class, or a plain subclass of one: :func:`_swap_class`) as the rawconv
    class, sharing its parameters and buffers."""
    cls = _swap_class(m)
    new = cls.__new__(cls)
    new.__dict__.update(m.__dict__)
    new._rawconv_init(backend, choice, None, precision)
    return new


def _set_submodule(root: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, module)


def _choice_for(choice, name: str):
    if isinstance(choice, dict):
        return choice.get(name)
    if callable(choice):
        return choice(name)
    return choice


def _foldable_bn(conv, bn, *, subclass: bool = False) -> bool:
    try:
        _check_bn(conv, bn, subclass=subclass)
    except ArgumentError:
        return False
    return not bn.training


def _fusable_conv(m) -> bool:
    """A forward conv whose forward is torch's or rawconv's (not a user subclass that computes its
    own way, not fused yet)."""
    t = type(m)
    if t in _TORCH_CONVS or t in (Conv1d, Conv2d, Conv3d):
        return True
    base = _plain_subclass_base(t)
    if base is not None:
        return base in _TORCH_CONVS
    return isinstance(m, (Conv1d, Conv2d, Conv3d)) and not isinstance(m, _ConvBiasAct) and \
        t.__qualname__.startswith(_SUBCLASS_PREFIX)


_ADD_FUNCS = (operator.add, operator.iadd, torch.add)


def _add_other(node, src):
    """The other operand when ``node`` is ``src + other`` (tensor, no alpha), else None."""
    import torch.fx as fx

    if node.kwargs:
        return None
    is_add = (node.op == "call_function" and node.target in _ADD_FUNCS) or \
             (node.op == "call_method" and node.target in ("add", "add_"))
    if not is_add or len(node.args) != 2:
        return None
    a, b = node.args
    other = b if a is src else a if b is src else None
    if other is None or other is src or not isinstance(other, fx.Node):
        return None
    return other


def _depends_on(node, target) -> bool:
    import torch.fx as fx

    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n is target:
            return True
        if n in seen:
            continue
        seen.add(n)
        todo.extend(a for a in n.all_input_nodes if isinstance(a, fx.Node))
    return False


def _fuse_fx(model, report: ConvertReport, backend, choice, precision):
    """torch.fx pattern rewrite: conv -> BatchNorm folded; conv [-> add(residual)] [-> activation] as one
    ConvBiasAct module (the activations of :func:`rawconv.pytorch.fusion.activation_of_node`).
    Returns the GraphModule."""
    import torch.fx as fx

    class Tracer(fx.Tracer):
        # rawconv's own modules are calls to keep (a model converted before): fx must not trace into
        # their forward, which checks its input is a real tensor
        def is_leaf_module(self, m, qualname):   # (and plain subclasses of torch's convs: convert swaps them)
            return isinstance(m, _RawconvConv) or _plain_subclass_base(type(m)) is not None or \
                super().is_leaf_module(m, qualname)

    tracer = Tracer()
    graph = tracer.trace(model)
    _mark_literal_training(graph, model, Tracer)
    gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
    modules = dict(gm.named_modules())
    graph = gm.graph
    calls: dict = {}
    for n in graph.nodes:
        if n.op == "call_module":
            calls[n.target] = calls.get(n.target, 0) + 1

    def fusable(n) -> bool:   # a conv node that the second pass makes one fused module
        m = modules.get(n.target) if n.op == "call_module" else None
        return (m is not None and _fusable_conv(m) and m.weight.dim() - 2 in _FUSED and calls[n.target] == 1
                and len(n.args) == 1 and not n.kwargs)

    # nn.Identity calls (timm's drop_block / aa / drop_path placeholders between a BatchNorm and its
    # activation) compute nothing: dropped, so that the chain around them fuses as torch's freezing fuses it
    for n in list(graph.nodes):
        if n.op == "call_module" and type(modules.get(n.target)) is torch.nn.Identity and len(n.args) == 1 \
                and not n.kwargs and isinstance(n.args[0], fx.Node):
            n.replace_all_uses_with(n.args[0])
            graph.erase_node(n)
    _drop_rank_asserts(graph, fusable)
    bns = _fold_batchnorms_fx(graph, modules, calls, fusable, report, dict(model.named_modules()))
    _fuse_chains_fx(gm, modules, fusable, bns, report, backend, choice, precision)
    _mark_inplace_residuals(graph, modules)
    originals = dict(model.named_modules())
    kept = _untrace_batchnorms(graph, originals)
    _follow_training_mode(graph)
    graph.lint()
    gm.recompile()
    gm.delete_all_unused_submodules()   # activations no longer called
    for bn_name, bn in [*bns.values(), *kept.items()]:   # the BatchNorms stay, where they were: state_dict as the model's
        gm.add_submodule(bn_name, bn)
    for name, bn in originals.items():   # one fx traced into and left as a bare copy of the tensors it read
        if isinstance(bn, torch.nn.modules.batchnorm._BatchNorm) and name not in kept and \
                type(dict(gm.named_modules()).get(name)) is torch.nn.Module:
            gm.add_submodule(name, bn)
    return gm


def _fold_batchnorms_fx(graph, modules: dict, calls: dict, fusable, report: ConvertReport,
                        originals: dict | None = None) -> dict:
    """:func:`_fuse_fx`'s first pass over ``graph`` (``modules``: the graph module's modules by name;
    ``calls``: how often each is called; ``fusable``: whether a conv node will be fused;
    ``originals``: the traced model's own modules by name, where a traced ``F.batch_norm`` call's
    BatchNorm is looked up): each BatchNorm node after a conv that will be fused goes, recorded in
    ``report.folded``. Returns ``{conv name: (BatchNorm name, BatchNorm module)}``."""
    import torch.fx as fx

    # BatchNorm after a conv that will be fused: its node goes, the module stays (its state_dict
    # entries too) and the fused module folds it into its weight snapshot when frozen
    bns: dict = {}
    for node in list(graph.nodes):
        functional = _functional_bn(node, originals if originals is not None else modules)
        if functional is not None:   # a traced F.batch_norm on a BatchNorm (subclass) module's tensors
            bn_name, bn = functional
            src = node.args[0] if node.args else node.kwargs.get("input")
            attrs = [n for n in node.all_input_nodes if n is not src]
            if calls.get(bn_name, 0) or not (isinstance(src, fx.Node) and fusable(src) and len(src.users) == 1) \
                    or not _foldable_bn(modules[src.target], bn, subclass=True):
                continue
        elif node.op == "call_module" and type(modules.get(node.target)) in _BATCHNORMS and len(node.args) == 1 \
                and not node.kwargs:
            bn_name, bn, src, attrs = node.target, modules[node.target], node.args[0], []
            if not (isinstance(src, fx.Node) and fusable(src) and len(src.users) == 1 and calls[node.target] == 1):
                continue
            if not _foldable_bn(modules[src.target], bn):
                continue
        else:
            continue
        bns[src.target] = (bn_name, bn)
        node.replace_all_uses_with(src)
        graph.erase_node(node)
        for a in attrs:   # the get_attr nodes of the functional call's tensors, now unused
            if not a.users:
                graph.erase_node(a)
        report.folded.append((src.target, bn_name))
    return bns


def _fuse_chains_fx(gm, modules: dict, fusable, bns: dict, report: ConvertReport, backend, choice, precision) -> None:
    """:func:`_fuse_fx`'s second pass over ``gm``'s graph: each fusable conv node, with the residual
    add and activation after it, becomes one call of a fused module (its BatchNorm from ``bns`` folded
    in) set in ``gm`` and ``modules``, recorded in ``report.fused``. Returns None."""
    graph = gm.graph
    # conv [+ residual] [activation] -> one module
    erased = set()
    for node in list(graph.nodes):
        if node in erased or not fusable(node):
            continue
        conv_m = modules[node.target]
        last, residual, act, kind, add_node = node, None, "none", [], None
        users = list(node.users)
        if len(users) == 1:
            other = _add_other(users[0], node)
            if other is not None and not _depends_on(other, node):
                residual, last, add_node = other, users[0], users[0]
                kind.append("add")
        nxt = list(last.users)
        a = _fusion.activation_of_node(nxt[0], modules) if len(nxt) == 1 else None
        if a is not None and nxt[0].args[0] is last:
            act, last = a, nxt[0]
            kind.append(a)
        name = node.target
        fused = _FUSED[conv_m.weight.dim() - 2].from_conv(
            conv_m, activation=act, bn=bns.get(name, (None, None))[1], backend=backend,
            choice=_choice_for(choice, name), precision=precision)
        _set_submodule(gm, name, fused)
        modules[name] = fused
        with graph.inserting_before(last):
            new = graph.call_module(name, (node.args[0],) + ((residual,) if residual is not None else ()))
        last.replace_all_uses_with(new)
        # erase the pattern's nodes, last first
        chain = [node] + ([add_node] if add_node is not None else []) + ([last] if act != "none" else [])
        for n in reversed(chain):
            graph.erase_node(n)
            erased.add(n)
        report.fused[name] = "+".join(kind) or "bias"


def _mark_inplace_residuals(graph, modules) -> None:
    """Let a fused module write its result into its residual's memory (eager inference on oneDNN:
    no copy of the residual into a new output) where that is safe: the residual is the fresh
    output of another fused module (not an input, parameter or view), and every other use of it
    comes earlier in the graph, as does every use of what may alias it (a view, ``.contiguous()``,
    a chunk: any node but a fused module that takes it as its input, transitively)."""
    order = {n: i for i, n in enumerate(graph.nodes)}

    def read_after(r, node) -> bool:
        stack, seen = [r], {r}
        while stack:
            t = stack.pop()
            for u in t.users:
                if u is node:
                    continue
                if order[u] > order[node]:
                    return True
                um = modules.get(u.target) if u.op == "call_module" else None
                fresh = isinstance(um, _ConvBiasAct) and u.args[0] is t and t not in u.args[1:]
                if not fresh and u not in seen:   # its result may be a view of r: its users read r
                    seen.add(u)
                    stack.append(u)
        return False

    for node in graph.nodes:
        m = modules.get(node.target) if node.op == "call_module" else None
        if not isinstance(m, _ConvBiasAct) or len(node.args) != 2:
            continue
        r = node.args[1]
        producer = modules.get(r.target) if getattr(r, "op", None) == "call_module" else None
        if isinstance(producer, _ConvBiasAct) and not read_after(r, node):
            m.residual_inplace = True
_HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
               "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
               "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


def _fuse_sequential(model, report: ConvertReport, backend, choice, precision) -> None:
    """Module-level fusion where torch.fx cannot trace: each ``nn.Sequential`` with Conv ->
    BatchNorm -> activation runs becomes a :class:`_FusedSequential` (its class swapped in place; its
    children, and so the state_dict, unchanged) that computes each run as one fused module when the
    Sequential is called as a whole. The convolutions of those runs are swapped to rawconv's."""
    for seq_name, seq in list(model.named_modules()):
        if type(seq) is not torch.nn.Sequential:
            continue
        keys = list(seq._modules)
        steps, watched, pairs, found = [], [], [], False
        i = 0
        while i < len(keys):
            m = seq._modules[keys[i]]
            full = f"{seq_name}.{keys[i]}" if seq_name else keys[i]
            if _fusable_conv(m) and m.weight.dim() - 2 in _FUSED:
                if _swap_class(m) is not None:
                    m = seq._modules[keys[i]] = _swap_module(m, backend, _choice_for(choice, full), precision)
                j, bn, act = i + 1, None, "none"
                if j < len(keys) and type(seq._modules[keys[j]]) in _BATCHNORMS and \
                        _foldable_bn(m, seq._modules[keys[j]]):
                    bn = seq._modules[keys[j]]
                    report.folded.append((full, f"{seq_name}.{keys[j]}" if seq_name else keys[j]))
                    j += 1
                a = _fusion.activation_of_module(seq._modules[keys[j]]) if j < len(keys) else None
                if a is not None:
                    act = a
                    j += 1
                helper = _FUSED[m.weight.dim() - 2].from_conv(m, activation=act, bn=bn, backend=backend,
                                                              choice=_choice_for(choice, full), precision=precision)
                helper._parameters = m._parameters   # the conv's own dict: a parameter replaced there is seen
                for h in _HOOK_DICTS:
                    if h in helper.__dict__:
                        helper.__dict__[h] = type(helper.__dict__[h])()
                helper.__dict__["_rawconv_helper"] = full + "(fused)"
                steps.append(helper)
                pairs.append((m, helper))
                watched += [seq._modules[k] for k in keys[i:j]]
                report.fused[full] = act if act != "none" else "bias"
                found = True
                i = j
                continue
            steps.append(m)
            i += 1
        if found:
            mods = tuple(seq._modules.values())
            seq.__class__ = _FusedSequential
            seq.__dict__["_rawconv_plan"] = (mods, tuple(map(type, mods)), steps, watched, tuple(pairs))


def convert(model: torch.nn.Module, *, inplace: bool = False, backend: str = "auto", choice: Any = None,
            precision: str = "strict", autotune: Any = None, fuse: bool = False, example_input: Any = None,
            autotune_budget_s: float | None = None, autotune_backward: bool | None = None,
            autotune_new: str = "default") -> torch.nn.Module:
    """Run every convolution of ``model`` on rawconv, keeping its weights.

    Every ``torch.nn.Conv1d/2d/3d`` and ``ConvTranspose1d/2d/3d`` becomes the :mod:`rawconv.nn`
    module of the same class family, sharing parameters and buffers (``state_dict`` keys
    unchanged). A subclass that computes as torch's class (no ``forward`` or ``_conv_forward`` of
    its own, e.g. torchvision's ``Conv3DSimple``) becomes a subclass of both (``isinstance`` with
    the user's class holds, pickles find it); subclasses with their own forward are left alone
    (named in ``report.left_on_torch`` and by a ``RuntimeWarning``). ``inplace=False``
    converts a deep copy. ``backend``, ``precision``: for every layer; ``choice``: one value for
    every layer (a training step: a :class:`rawconv.ops.TrainingChoice`), a dict {module name:
    choice} (every key a convolution module's name: :class:`ArgumentError` otherwise) or a
    callable(name) -> choice. A weight computed by a ``torch.nn.utils.parametrize``
    parametrization is not computed by convert, :func:`pinned_choices` or ``.to()`` (only by the
    module's forward, as torch's): ``spectral_norm``'s power iteration leaves its buffers alone.

    ``fuse=True`` (inference: the model must be in eval mode): with torch.fx
    (``symbolic_trace``) each forward convolution becomes one :class:`ConvBiasAct2d` (1d/3d)
    call together with what follows it: a BatchNorm with running statistics, a residual ``add``
    (``out + identity``: the other operand is passed as the residual) and/or an activation (ReLU,
    ReLU6, SiLU, GELU erf or tanh, hardswish, hardsigmoid, sigmoid, tanh, in their module,
    functional and method forms: :func:`rawconv.pytorch.fusion.activation_of_node`). The
    result is then a ``torch.fx.GraphModule``. With ``autotune`` on the CPU, each fused layer
    is then measured against its unfused form (the convolution with its bias, then torch's own
    add and activation) and keeps the fused call only where that was faster
    (``report.fusion``; :func:`rawconv.pytorch.fusion.measure_cpu`); without an example input every
    fusable layer is fused and the report says fusion was not measured. Nothing of the model's state changes: the
    parameters stay the convolutions' own, each folded BatchNorm stays where it was (only its
    call goes), so ``state_dict`` keys and values are the original model's and
    ``load_state_dict`` of the original's checkpoint works. The fused modules are **frozen**:
    a weight snapshot with the BatchNorm folded in (float64, rounded once to the weights'
    dtype), reordered once per problem; each call first checks that the snapshot still matches
    the parameters and BatchNorm it was taken from (the objects, their version counters,
    optimizer steps, ``.to()``; see :func:`refresh`) and takes a new one when not. With autograd
    recording, or a BatchNorm in training mode, a fused module runs the convolution, then the
    BatchNorm module itself, the add and the activation (train the converted model as the original).
    The model may already be converted (rawconv's conv modules are fx leaf modules).
    When tracing fails (data-dependent control flow...) a warning says so and each
    ``nn.Sequential`` with Conv -> BatchNorm -> activation runs computes each run as one fused module
    when the Sequential itself is called (its children are untouched: called alone, or shared,
    they compute as before; :class:`_FusedSequential`).

    ``autotune``: an example input (a tensor, or a tuple of arguments), or True to use
    ``example_input``: the model runs once on it (no grad), every convolution call is recorded,
    and each distinct problem (shape, strides, dtype, fusion) is searched ONCE, within ``autotune_budget_s``
    seconds of wall time per problem and direction (oneDNN: every implementation checked and timed, no
    limit by default; cuDNN: the graph API's autotune, default 0.6 s, the best 8 re-timed in 10 groups,
    tuning cache first, the next problem's first runtime compilations started in the background; the legacy
    API's algorithms when no graph config runs it). ``autotune_backward``: also search the two backward passes
    of each problem (backward data and backward weights, on the layout the gradients have: the input's),
    each distinct backward problem once; default (None): when
    the model is in training mode and a parameter requires grad (a model about to be trained),
    not for a model in eval mode (inference; ``fuse=True`` models). The winners are pinned **to
    the problem they were tuned on** (per layer, :func:`pinned_choices`): a call of another
    problem (another batch size, layout, dtype, size) runs the library's default choice, or,
    with ``autotune_new="search"``, is searched at its first call (as torch's
    ``cudnn.benchmark``; not while torch.compile, a CUDA graph capture or a tracer runs: the
    default then) and pinned too. Winners are remembered for the process (a second convert of
    the same problems searches nothing). ``model.rawconv_report`` (:class:`ConvertReport`) says
    what was done; :func:`describe` says, per layer and call, what runs and why.

    Raises :class:`ArgumentError` / :class:`ArgumentTypeError` for bad arguments (a training-mode
    model with ``fuse=True``; ``autotune=True`` without ``example_input``).
    """
    autotune, autotune_backward = _convert_args(model, inplace, backend, precision, autotune, fuse, example_input,
                                                autotune_budget_s, autotune_backward, autotune_new)
    if isinstance(choice, dict):   # every key a conv module's name
        _pins.check_choice_names(choice, [n for n, m in model.named_modules()
                                          if _swap_class(m) is not None or isinstance(m, _RawconvConv)])
    if not inplace:
        try:
            model = copy.deepcopy(model)
        except (RuntimeError, TypeError) as exc:   # torch's own refusal to copy this model
            if isinstance(exc, RawconvError):
                raise
            raise ArgumentError(f"convert(inplace=False) converts a copy of the model, and copy.deepcopy of it "
                                f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
                                "(torch.nn.utils.weight_norm / spectral_norm leave a computed weight that torch "
                                "cannot copy: use torch.nn.utils.parametrizations.weight_norm / spectral_norm, "
                                "or convert the model itself with inplace=True)") from exc
    report = ConvertReport()
    traced = False
    if fuse:
        model, traced = _convert_fuse_fx(model, report, backend, choice, precision)
    model = _swap_modules(model, report, backend, choice, precision)
    if fuse and not traced:
        _fuse_sequential(model, report, backend, choice, precision)
    if fuse:
        for _name, m in _fused_modules(model):
            _fused.freeze(m)
    if autotune is not None:
        _autotune(model, autotune, report, autotune_budget_s, autotune_backward, autotune_new, fuse)
    elif fuse:
        report.fusion_measured = False
    for name, m in _conv_modules(model).items():   # what torch's kernel runs (predicted, or seen in the autotune)
        why = _fallback.reason_for_parameters(m) or next(iter(m.__dict__.get("torch_fallbacks") or ()), None)
        if why is not None:
            report.fallback[name] = why
    model.rawconv_report = report
    return model


def _convert_args(model, inplace, backend, precision, autotune, fuse, example_input, autotune_budget_s,
                  autotune_backward, autotune_new) -> tuple:
    """Check :func:`convert`'s arguments, in order, raising :class:`ArgumentTypeError` /
    :class:`ArgumentError` on the first bad one. Returns ``(autotune, autotune_backward)`` resolved:
    the example input to search on (``example_input`` for ``autotune=True``) or None, and whether
    to search the backward passes too (the default, None: a training-mode model with a parameter
    that requires grad)."""
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    _check_backend(backend)
    _check_precision(precision)
    for nm, v in (("inplace", inplace), ("fuse", fuse)):
        if not isinstance(v, bool):
            raise ArgumentTypeError(f"{nm} must be True or False, got {v!r}")
    if autotune_backward is not None and not isinstance(autotune_backward, bool):
        raise ArgumentTypeError(f"autotune_backward must be True, False or None, got {autotune_backward!r}")
    if autotune_new not in AUTOTUNE_NEW:
        raise ArgumentError(f"autotune_new must be one of {list(AUTOTUNE_NEW)}, got {autotune_new!r}")
    if autotune is True:
        if example_input is None:
            raise ArgumentError("autotune=True needs example_input (or pass the example as autotune=x)")
        autotune = example_input
    elif autotune is False:
        autotune = None
    _check_budget(autotune_budget_s, "autotune_budget_s")
    if fuse and model.training:
        raise ArgumentError("fuse=True folds BatchNorm with its running statistics, which is only right for "
                            "inference: call model.eval() first (or convert(..., fuse=False) for training)")
    if autotune_backward is None:
        autotune_backward = model.training and any(p.requires_grad for p in model.parameters())
    return autotune, autotune_backward


def _convert_fuse_fx(model: torch.nn.Module, report: ConvertReport, backend: str, choice, precision: str) -> tuple:
    """:func:`convert`'s ``fuse=True`` with torch.fx (:func:`_fuse_fx`), recording in ``report`` whether
    it traced. Returns ``(model, traced)``: the traced and fused ``GraphModule`` and True, or, when
    tracing fails (a ``RuntimeWarning`` says why; ``report``'s folds and fusions cleared), the
    model unchanged and False."""
    try:
        model = _fuse_fx(model, report, backend, choice, precision)
        report.traced = True
        return model, True
    except Exception as exc:   # noqa: BLE001  (torch.fx raises many types for untraceable code)
        report.traced = False
        report.trace_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        warnings.warn(f"rawconv.nn.convert(fuse=True): torch.fx could not trace {type(model).__name__} "
                      f"({report.trace_error}); fused at module level only (Conv -> BatchNorm -> activation runs of "
                      "each nn.Sequential, when the Sequential is called as a whole); residual adds stay in "
                      "torch", RuntimeWarning, stacklevel=_guard.stacklevel())
        report.folded.clear()
        report.fused.clear()
    return model, False


def _swap_modules(model: torch.nn.Module, report: ConvertReport, backend: str, choice, precision: str
                  ) -> torch.nn.Module:
    """Swap every convolution module of ``model`` of a class rawconv covers for its :mod:`rawconv.nn`
    twin (sharing parameters and buffers), recording in ``report.swapped`` those swapped and those
    already rawconv's. Returns the model (the new module when ``model`` itself is one)."""
    for name, m in list(model.named_modules()):
        if _swap_class(m) is not None:
            new = _swap_module(m, backend, _choice_for(choice, name), precision)
            if name:
                _set_submodule(model, name, new)
            else:
                model = new
            report.swapped.append(name)
        elif isinstance(m, _RawconvConv):
            report.swapped.append(name)
        elif _pins.own_computation(m, _SWAP):
            report.left_on_torch[name] = _pins.own_computation(m, _SWAP)
    _pins.warn_left_on_torch(report.left_on_torch, model)
    return model


AUTOTUNE_NEW = ("default", "search")


def torch_fallbacks(model: torch.nn.Module | None = None) -> dict:
    """Calls that rawconv's modules ran on torch's own kernel (no rawconv library can run them:
    :mod:`rawconv.pytorch.fallback`). Without ``model``: {reason: calls} in this process; with
    it: {layer name: {reason: calls}} for its modules that fell back (each module keeps its own
    counts in its ``torch_fallbacks`` attribute)."""
    if model is None:
        return _fallback.counts()
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
    return {name: dict(m.__dict__["torch_fallbacks"]) for name, m in _conv_modules(model).items()
            if m.__dict__.get("torch_fallbacks")}


def refresh(model: torch.nn.Module) -> torch.nn.Module:
    """Take new weight snapshots of the frozen modules in ``model`` now (returned, for chaining).

    :func:`convert` with ``fuse=True`` **freezes** the fused modules it makes: their weight and
    bias, with the BatchNorm folded in, are copied (as torch's freezing makes constants) and
    reordered into the implementation's layout once. A frozen module computes with that copy
    whenever autograd does not record through its parameters (``torch.no_grad()``, inference
    mode) and takes a new one by itself at its next call when what it was taken from changed:
    another parameter object (``m.weight = Parameter(...)``, ``load_state_dict(assign=True)``),
    an in-place write seen by the tensor's version counter (``load_state_dict``, optimizer steps,
    ``mul_``, a BatchNorm's training forward), any optimizer step in the process (fused
    optimizers move no version counter), ``.to()`` / ``.half()`` / ``.cuda()`` of the model, or a
    forward that recorded autograd through the parameters. What it cannot see: writes through
    ``.data`` (or a numpy view, or the storage) with no optimizer step and no training forward
    around them, and replays of a captured CUDA graph (no Python runs there): call ``refresh``
    after those. ``refresh`` writes the new snapshot into the same buffers when they fit, so a
    compiled or captured model computes with it too. A weight computed by a parametrization or
    ``spectral_norm`` is not a parameter: such a module reads it on every call (unfrozen). Raises
    :class:`ArgumentTypeError` when ``model`` is not a ``torch.nn.Module``."""
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    for _name, m in _fused_modules(model):
        if _fused.frozen(m):
            _fused.freeze(m)
    return model


def _autotune(model, example, report: ConvertReport, budget_s, backward: bool = False,
              new: str = "default", fuse: bool = False) -> None:
    """Search each distinct problem of ``model``'s convolutions once (and, with ``backward``, each
    distinct backward problem) and pin the winners to their problems. On cuDNN, while one
    problem is searched, the next one's first runtime compilations (cuDNN's top heuristic
    configs, which a fused graph mostly consists of) run in background threads
    (:func:`rawconv._search.prefetch`), unless the previous problem came from the tuning cache."""
    t0 = time.perf_counter()
    names = {id(m): n for n, m in _conv_modules(model).items()}
    for m in _conv_modules(model).values():   # a model tuned before: its example forward searches nothing,
        m.__dict__.pop(_NEW_ATTR, None)       # and its old tables go (this convert's problems only)
        m.__dict__.pop(_TUNED_ATTR, None)
    layers = []
    for m, kind, args in _record_calls(model, example):
        backend = _resolve_backend(m.backend, args["x"].device)
        problem = _problem_of(m, kind, args)
        layers.append((m, kind, args, backend, problem, _tune_key(m, kind, args, backend, problem)))
    from ..core.bench import TimingWarning

    with _rng_kept(model, example), warnings.catch_warnings(record=True) as said:
        # the searches' random tensors draw nothing from torch's generators; their timing warnings
        # (one per search on a busy machine) are said once, summed up, below
        warnings.simplefilter("always", TimingWarning)
        _search_layers(model, layers, names, report, budget_s, backward)
        if fuse:
            _measure_fusion(layers, names, report, budget_s)
    for w in said:
        if issubclass(w.category, TimingWarning):
            report.timing_warnings.append(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if report.timing_warnings:
        first = report.timing_warnings[0].splitlines()[0]
        warnings.warn(f"rawconv.nn.convert(autotune=...): {len(report.timing_warnings)} of the searches were "
                      f"timed on a busy machine, so their choices may not hold (the first: {first}); all of them "
                      "are in the report's timing_warnings; convert again on a quiet machine",
                      TimingWarning, stacklevel=_guard.stacklevel())
    if new == "search":   # every convolution module: those the example did not call meet only new problems
        for m in _conv_modules(model).values():
            m.__dict__.setdefault(_TUNED_ATTR, {})
            m.__dict__[_NEW_ATTR] = {"budget_s": budget_s, "backward": backward}
    else:
        for m in _conv_modules(model).values():
            m.__dict__.pop(_NEW_ATTR, None)
    for _name, m in _fused_modules(model):   # their plans resolved the old table's choices
        st = m.__dict__.get(_fused._FROZEN_STATE)
        if st is not None:
            st.plans.clear()
    report.backward = backward
    report.autotune_new = new
    report.autotune_s = time.perf_counter() - t0


def _measure_fusion(layers: list, names: dict, report: ConvertReport, budget_s) -> None:
    """``convert(fuse=True, autotune=x)``: each fused oneDNN layer's recorded call measured fused
    against unfused (:func:`rawconv.pytorch.fusion.measure_cpu`), the outcome pinned to its problem
    and written into ``report.fusion`` and the layer's ``report.tuned`` entries. A cuDNN layer's
    decision is its graph autotune's (fused configs and ``"unfused:"`` ones searched together):
    recorded as such, not measured again here."""
    report.fusion_measured = True
    entries = {}
    for t in report.tuned:
        entries.setdefault((t["name"], t["key"]), []).append(t)
    for m, kind, args, backend, _problem, key in layers:
        if kind != "fused":
            continue
        name = names.get(id(m), "?")
        t = m.__dict__.get(_TUNED_ATTR, {}).get(_call_key(m, kind, args))
        choice = m.choice if m.choice is not None else (t.choice if t is not None else None)
        if backend != "onednn":   # the graph autotune searched fused and "unfused:" configs (its choice says which)
            split = isinstance(choice, str) and choice.startswith("unfused:")
            e = {"decision": "unfused" if split else "fused",
                 "reason": f"cuDNN graph autotune (fused and 'unfused:' configs searched): {choice}"}
        elif not _fused.frozen(m) or m.choice is not None:
            e = {"decision": "fused", "reason": "fusion not measured: " + (
                "the layer is not frozen" if not _fused.frozen(m) else
                "the module's own choice names a fused implementation")}
        else:
            try:
                e, measured = _fusion.measure_cpu(m, args, choice, key, budget_s, _TUNED, _call_key(m, "fused", args))
                e["measured"] = measured
                # an unfused choice made here is offered here (_unfused_offered_here checks one made elsewhere)
                ck = _call_key(m, "fused", args)
                if ck is not None and ck in (m.__dict__.get(_fusion.UNFUSED_ATTR) or {}):
                    m.__dict__.setdefault(_UNFUSED_OFFERED_ON, {})[ck] = _onednn_here()
            except NotSupportedError as exc:   # the plain convolution has no implementation: stays fused
                e = {"decision": "fused", "reason": f"fusion not measured: {exc}"}
        report.fusion[name if name not in report.fusion else f"{name} {_problem.describe()}"] = e
        for t in entries.get((name, key), ()):
            t["fusion"] = e["decision"]
            for k in ("fused_ms", "unfused_ms", "fused_min_ms", "unfused_min_ms"):
                if k in e:
                    t[k] = e[k]


def _search_layers(model, layers: list, names: dict, report: ConvertReport, budget_s, backward: bool) -> None:
    from ..cudnn.graph import search as _search

    plans: dict = {}   # key -> the cuDNN plan made ahead, its compilations started
    last_from_cache = False

    def ahead(i: int) -> None:   # the next distinct cuDNN problem not searched yet, after layer i
        keys = {layers[i][5]}
        for m, kind, args, backend, _, key in layers[i + 1:]:
            if key in _TUNED or key in keys or backend != "cudnn":
                keys.add(key)
                continue
            if key not in plans:
                try:
                    plans[key] = plan = _search_mod._graph_plan(m, kind, args)
                    if isinstance(plan, _fused._CudaFallback):
                        return   # no cuDNN graph for it (the legacy API runs it): nothing to compile ahead
                    _search.prefetch(plan)
                except (RawconvError, RuntimeError):   # its own search says what is wrong
                    plans.pop(key, None)
            return

    for i, (m, kind, args, backend, problem, key) in enumerate(layers):
        t1 = time.perf_counter()
        info: dict = {}
        if key not in _TUNED and backend == "cudnn" and not last_from_cache:
            ahead(i)
        entry, searched, bsearched, note = _search_mod._tune_call(m, kind, args, backend, budget_s, backward, info,
                                                      plan=plans.pop(key, None))
        if searched:
            last_from_cache = info.get("from_cache", False)
        report.tuned.append({"name": names.get(id(m), "?"), "kind": kind, "problem": entry.problem,
                             "backend": backend, "choice": entry.choice, "backward_choice": entry.backward_choice,
                             "directions": dict(entry.directions), "searched": searched,
                             "backward_searched": bsearched, "seconds": time.perf_counter() - t1, "key": key,
                             "note": note, **info})


def pinned_choices(model: torch.nn.Module) -> dict:
    """What every rawconv convolution module of ``model`` is pinned to: ``{module name: {"module":
    class name, "backend": the backend its weights' device runs ("onednn" / "cudnn"), "choice",
    "backward_choice", "precision", "tuned"}}`` in ``named_modules`` order (the fused modules of
    a :class:`_FusedSequential` included, named after their conv with ``"(fused)"``).
    ``"tuned"``: what :func:`convert`'s autotune pinned, one :meth:`TunedChoice.as_dict` per
    problem (a call of another problem runs the default); ``"choice"`` / ``"backward_choice"``: the
    module's own (set by ``choice=`` or :func:`pin_choices`: every problem) when set, else those
    autotuned for its first problem (None: the library's default). What :func:`convert`
    (``autotune=``) and :func:`rawconv.distributed.convert` pinned."""
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    out = {}
    for name, m in _conv_modules(model).items():
        tuned = [t.as_dict() for t in (m.__dict__.get(_TUNED_ATTR) or {}).values()]
        first = tuned[0] if tuned else {}
        out[name] = {"module": type(m).__name__, "backend": m._device_backend(),
                     "choice": m.choice if m.choice is not None else first.get("choice"),
                     "backward_choice": m.backward_choice if m.backward_choice is not None
                     else first.get("backward_choice"), "precision": m.precision, "tuned": tuned}
    return out


def pin_choices(model: torch.nn.Module, choices: dict, *, backend: str | None = None) -> None:
    """Pin ``choices`` (``{module name: choice}``; a choice is what ``choice=`` takes, None for the
    backend's default) on the rawconv convolution modules of ``model`` named there, for every
    problem (what an autotune pinned on those modules is dropped); the choices belong to
    ``backend`` (``"onednn"`` / ``"cudnn"``; default: each module's device's), so a later
    ``.to()`` to the other device drops them as usual. A training step (a
    :class:`rawconv.ops.TrainingChoice` or a dict per direction) pins the forward and both backward
    passes; a forward-only choice or None replaces the module's earlier pins of all three (its
    backward passes run the backend's default again). Nothing is checked against the library
    here: a choice it does not offer raises :class:`NotSupportedError` at the module's first call.
    Raises :class:`ArgumentError` naming a name that is not a rawconv convolution module of
    ``model``, :class:`ArgumentTypeError` for a choice of a type ``choice=`` does not take, and
    :class:`ArgumentError` for a step with unknown directions: all checked before anything is
    pinned (nothing is pinned then)."""
    if not isinstance(model, torch.nn.Module):
        raise ArgumentTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(choices, dict):
        raise ArgumentTypeError(f"choices must be a dict {{module name: choice}}, got {type(choices).__name__}")
    if backend is not None and backend not in ("onednn", "cudnn"):
        raise ArgumentError(f"backend must be 'onednn', 'cudnn' or None, got {backend!r}")
    mods = _conv_modules(model)
    bad = [n for n in choices if n not in mods]
    if bad:
        raise ArgumentError(f"not rawconv convolution modules of this model: {bad} (rawconv.nn.convert swaps "
                            f"torch's; these are: {list(mods)})")
    pins = []   # (module, forward choice, backward pair or None): every entry checked first
    for n, c in choices.items():
        m = mods[n]
        what = f"pin_choices: choices[{n!r}]"
        if c is not None and not isinstance(c, str) and _is_step(c):   # a whole training step
            fwd, bwd = _split(c, None, m._transposed)
            pins.append((m, _check_choice(fwd, what), _check_choice(bwd, what + " (backward)", pair=True)))
        else:   # a forward-only choice or None: the earlier backward pins go too
            pins.append((m, _check_choice(c, what), None))
    for m, fwd, bwd in pins:
        m.choice, m.backward_choice = fwd, bwd
        m.__dict__.pop(_TUNED_ATTR, None)
        m.__dict__.pop(_NEW_ATTR, None)
        m._choice_backend = backend or m._device_backend()
        st = m.__dict__.get(_fused._FROZEN_STATE)
        if st is not None:   # its plans resolved the old choice
            st.plans.clear()


# every public entry point raises only rawconv's exception classes (rawconv._guard)
_guard.guard_module(globals(), "convert", "refresh", "pinned_choices", "pin_choices", "torch_fallbacks", where=FACE)
