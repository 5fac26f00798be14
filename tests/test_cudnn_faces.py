"""``rawconv.cudnn``, ``rawconv.cudnn_graph`` and ``rawconv.cudnn.graph.search`` are faces: the code lives
in their parts (``cudnn/legacy/{hot,plan,functions}.py``; ``cudnn/graph/{operation,plan,functions}.py``;
``cudnn/graph/search_{plan,rtc,phases,run}.py``), each name handed on through the face as before the
split. A setting or function a test sets on a face (``monkeypatch.setattr(S, "time_reps", f)``) must reach
the part that reads it, and no other part may hold a binding of its own. The parts' CUDA-only paths cannot
run here, so every global name each of their functions reads is checked to resolve in its module. CPU only."""
from __future__ import annotations

import ast
import builtins
import dis
import importlib
import importlib.util
import inspect
import sys
import types

import pytest
import torch

pytest.importorskip("cffi")

from rawconv import cudnn, cudnn_graph  # noqa: E402
from rawconv.cudnn.graph import search as S  # noqa: E402
from rawconv.errors import ArgumentError  # noqa: E402
from conftest import face_routing_tests  # noqa: E402

PARTS = {cudnn: ("rawconv.cudnn.legacy.hot", "rawconv.cudnn.legacy.plan", "rawconv.cudnn.legacy.functions"),
         cudnn_graph: ("rawconv.cudnn.graph.operation", "rawconv.cudnn.graph.plan", "rawconv.cudnn.graph.functions"),
         S: ("rawconv.cudnn.graph.search_plan", "rawconv.cudnn.graph.search_rtc", "rawconv.cudnn.graph.search_phases",
             "rawconv.cudnn.graph.search_run")}
# the parts the faces' routes name besides their own (shared modules the plans' mixins read)
SHARED = {cudnn: ("rawconv.cudnn.legacy.common", "rawconv.cudnn.legacy.algorithms", "rawconv.cudnn.legacy.autotune"),
          cudnn_graph: ("rawconv.cudnn.graph.common", "rawconv.cudnn.graph.engines", "rawconv.cudnn.graph.autotune"),
          S: ()}
ALL_PARTS = sorted({m for face in PARTS for m in PARTS[face] + SHARED[face]})


def _id(p):
    return p.__name__.rpartition(".")[2] if hasattr(p, "__name__") else str(p)


(test_a_name_set_on_the_face_is_set_in_the_part_that_reads_it,
 test_no_other_part_holds_its_own_binding_of_a_setting) = face_routing_tests(PARTS, SHARED)


def _defined(mod) -> list[str]:
    """The module-level names a part defines itself (functions, classes, assignments)."""
    names = []
    for node in ast.parse(inspect.getsource(mod)).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for tg in targets for t in ast.walk(tg) if isinstance(t, ast.Name)]
    return [n for n in dict.fromkeys(names) if n not in ("FACE", "_cls")]


@pytest.mark.parametrize("face", list(PARTS), ids=_id)
def test_the_face_hands_on_every_name_its_parts_define(face):
    """Tests, benchmarks and other modules reach the parts' names (private ones too) through the face,
    as before the split: each is the part's own object there."""
    for p in PARTS[face]:
        mod = importlib.import_module(p)
        for n in _defined(mod):
            assert getattr(face, n) is getattr(mod, n), f"{face.__name__}.{n} is not {p}.{n}"


def test_moved_classes_keep_the_faces_module():
    """Pickles, the API reference and the guard's messages name the classes on the face."""
    for cls in (cudnn.Convolution, cudnn.ResidualBiasActivation, cudnn._Hot):
        assert cls.__module__ == "rawconv.cudnn", cls
    for cls in (cudnn_graph.GraphConvolution, cudnn_graph.OperationGraph, cudnn_graph._GraphHot):
        assert cls.__module__ == "rawconv.cudnn.graph", cls
    for cls in (S.SearchPlan, S.Config, S.Built, S.SearchOptions, S.TimedConfig, S.Search, S._RandomDraws):
        assert cls.__module__ == "rawconv.cudnn.graph.search", cls
    import pickle

    row = S.TimedConfig(cudnn_graph.EngineConfig(4), 0.5, 0.4, 3)
    assert type(pickle.loads(pickle.dumps(row))) is S.TimedConfig


def test_public_entry_points_are_guarded_where_they_live():
    """The function forms and plan methods raise only rawconv's exceptions, as before the split; an
    internal call (conv_transpose -> backward_data) goes through the guarded function."""
    for face, names in ((cudnn, ("forward", "backward_data", "backward_weights", "backward_filter", "conv_transpose",
                                 "algorithms", "candidates", "capabilities", "info")),
                        (cudnn_graph, ("forward", "backward_data", "backward_filter", "backward_weights", "engines",
                                       "tuning_cache", "save_tuning_cache", "load_tuning_cache"))):
        for n in names:
            assert getattr(getattr(face, n), "__rawconv_public__", False), f"{face.__name__}.{n}"
    for cls, meths in ((cudnn.Convolution, ("__init__", "from_problem", "execute", "__call__", "candidates")),
                       (cudnn_graph.GraphConvolution, ("__init__", "from_problem", "execute", "__call__", "candidates",
                                                       "channels_last", "output"))):
        for m in meths:
            attr = cls.__dict__[m]
            attr = getattr(attr, "__func__", getattr(attr, "fget", attr))
            assert getattr(attr, "__rawconv_public__", False), f"{cls.__name__}.{m}"
    from rawconv.cudnn.legacy import functions

    assert functions.conv_transpose.__wrapped__.__globals__["backward_data"] is cudnn.backward_data


class _Stop(ArgumentError):
    pass


def test_the_legacy_function_forms_read_what_is_patched_on_the_face(monkeypatch):
    """conv_transpose calls backward_data, and backward_data calls grad_problem, through the part's
    globals: patched on the face, the patch is what they call (CPU tensors: the spies stop first)."""
    seen = []

    def spy(name):
        def f(*a, **k):
            seen.append(name)
            raise _Stop(name)
        return f
    x, w = torch.randn(1, 2, 4, 4), torch.randn(2, 3, 3, 3)
    monkeypatch.setattr(cudnn, "backward_data", spy("backward_data"))
    with pytest.raises(_Stop):
        cudnn.conv_transpose(x, w)
    monkeypatch.undo()
    monkeypatch.setattr(cudnn, "grad_problem", spy("grad_problem"))
    with pytest.raises(_Stop):
        cudnn.backward_data(torch.randn(1, 3, 4, 4), torch.randn(3, 2, 3, 3), (1, 2, 6, 6))
    assert seen == ["backward_data", "grad_problem"]


def test_the_search_reads_the_timing_patched_on_the_face(monkeypatch):
    """_end_to_end (search_run.py) times through time_interleaved, patched on the search face."""
    seen = []

    def interleaved(fns, final_iterations, rounds=5):
        seen.append(len(fns))
        raise _Stop("interleaved")
    monkeypatch.setattr(S, "time_interleaved", interleaved)
    from rawconv.cudnn.graph import search_run

    assert search_run._sp.time_interleaved is interleaved
    monkeypatch.undo()
    assert search_run._sp.time_interleaved is not interleaved and S.time_interleaved is search_run._sp.time_interleaved


# ---------------------------------------------------------------------------- every global name resolves
def _codes(co):
    yield co
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            yield from _codes(c)


def _functions(mod):
    """Every function (methods, properties, nested code included) defined in ``mod``'s file."""
    seen = set()

    def fns(obj):
        if isinstance(obj, (classmethod, staticmethod)):
            obj = obj.__func__
        if isinstance(obj, property):
            for f in (obj.fget, obj.fset, obj.fdel):
                if f is not None:
                    yield from fns(f)
            return
        if callable(obj) and hasattr(obj, "__wrapped__"):
            obj = inspect.unwrap(obj)
        if isinstance(obj, types.FunctionType) and obj.__code__.co_filename == mod.__file__ and id(obj) not in seen:
            seen.add(id(obj))
            yield obj
    for v in list(vars(mod).values()):
        if isinstance(v, type):
            for a in vars(v).values():
                yield from fns(a)
        else:
            yield from fns(v)


def _unresolved(mod) -> list[str]:
    bad = []
    for fn in _functions(mod):
        for co in _codes(fn.__code__):
            for ins in dis.get_instructions(co):
                if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval not in fn.__globals__ \
                        and not hasattr(builtins, ins.argval):
                    bad.append(f"{fn.__qualname__}: {ins.argval}")
    return bad


@pytest.mark.parametrize("part", ALL_PARTS + ["rawconv.cudnn", "rawconv.cudnn.graph", "rawconv.cudnn.graph.search"])
def test_every_global_name_a_function_reads_resolves_in_its_module(part):
    """The CUDA-only paths (execute, the hot paths, capabilities, the search's timing) never run
    here: a name a moved function reads that its new module lacks would surface only on a GPU."""
    mod = importlib.import_module(part)
    fns = list(_functions(mod))
    assert fns or part.endswith("search"), f"no function found in {part}"
    assert not _unresolved(mod), f"{part}: names read but not defined there: {_unresolved(mod)}"


def test_the_name_check_sees_a_missing_global(tmp_path, monkeypatch):
    (tmp_path / "_faces_probe.py").write_text(
        "import math\n\nclass K:\n    def m(self):\n        return math.pi + missing_one\n\n"
        "def f():\n    def inner():\n        return missing_two\n    return inner\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        mod = importlib.import_module("_faces_probe")
        assert sorted(_unresolved(mod)) == ["K.m: missing_one", "f: missing_two"]   # (nested code: its function's)
    finally:
        sys.modules.pop("_faces_probe", None)


@pytest.mark.parametrize("part", ALL_PARTS)
def test_every_import_inside_a_function_resolves(part):
    """A moved function's own imports (``from ...core.options import options_of``: one level deeper in
    cudnn/legacy/) resolve from its new module, though the paths that run them need a GPU."""
    mod = importlib.import_module(part)
    pkg = mod.__name__.rpartition(".")[0]
    bad = []
    for fn in ast.walk(ast.parse(inspect.getsource(mod))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for n in ast.walk(fn):
            if isinstance(n, ast.ImportFrom):
                base = importlib.util.resolve_name("." * n.level + (n.module or ""), pkg) if n.level else n.module
                m = importlib.import_module(base)
                for a in n.names:
                    if not hasattr(m, a.name) and importlib.util.find_spec(f"{base}.{a.name}") is None:
                        bad.append(f"{fn.name}: from {base} import {a.name}")
    assert not bad, bad
