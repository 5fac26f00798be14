"""The layered package (issue 23): the import contract, the old module paths as aliases, the seams.

``lint-imports`` (import-linter, in the ``test`` extra) checks the contracts in pyproject.toml:
explore > pytorch > onednn | cudnn > core, front ends through the backends' faces, raw bindings
without torch. The old flat paths (``rawconv.nn``, ``rawconv._cuda``...) must stay the SAME module
objects as their new homes, so that monkeypatching through either name is seen by both.
"""
from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import rawconv
from rawconv._aliases import ALIASES

ROOT = Path(__file__).resolve().parents[1]
PKG = Path(rawconv.__file__).resolve().parent


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(PKG.parent)] + sys.path))


def test_lint_imports_contracts_kept():
    exe = Path(sys.executable).parent / "lint-imports"
    assert exe.exists(), f"{exe} is missing: pip install import-linter (rawconv's test extra)"
    r = subprocess.run([str(exe), "--no-cache"], cwd=PKG.parent, capture_output=True, text=True, timeout=300,
                       env=_env())
    summary = [line for line in r.stdout.splitlines() if "KEPT" in line or "BROKEN" in line or "Contracts:" in line]
    print("\n".join(summary))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert any(line.startswith("Contracts:") and "0 broken" in line for line in summary), r.stdout[-2000:]


@pytest.mark.filterwarnings("ignore:rawconv._[a-z_]+ is a private path:DeprecationWarning")
@pytest.mark.parametrize("old,new", sorted(ALIASES.items()))
def test_old_path_is_the_same_module(old, new):
    a, b = importlib.import_module(old), importlib.import_module(new)
    assert a is b
    assert sys.modules[old] is b
    assert getattr(rawconv, old.rpartition(".")[2]) is b   # rawconv.nn, rawconv._cuda as attributes too
    assert b.__spec__.name == new and b.__name__ == new    # the alias did not take over its spec


def test_monkeypatch_through_old_path_is_seen_by_new(monkeypatch):
    import rawconv.cudnn.graph as graph
    import rawconv.cudnn_graph as old

    sentinel = object()
    monkeypatch.setattr("rawconv.cudnn_graph.known_wrong", sentinel)
    assert graph.known_wrong is sentinel and old.known_wrong is sentinel
    monkeypatch.undo()
    assert graph.known_wrong is not sentinel


@pytest.mark.filterwarnings("ignore:rawconv._[a-z_]+ is a private path:DeprecationWarning")
def test_from_imports_of_old_paths():
    from rawconv import _cuda, _dnnl, cudnn_graph, fused, nn, ops  # noqa: F401
    from rawconv.fused import FusedConvolution
    from rawconv.onednn.fused import FusedConvolution as F2

    assert FusedConvolution is F2
    assert nn is importlib.import_module("rawconv.pytorch.nn") and _dnnl.__name__ == "rawconv.onednn._ffi"


def test_package_imports_no_old_path():
    """No module of the package imports through an alias: the layers' rules see every edge."""
    bad = []
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        pkg = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = pkg[:len(pkg) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            for n in names:
                if n in ALIASES:
                    bad.append(f"{rel}:{node.lineno} imports {n} (now {ALIASES[n]})")
    assert not bad, "\n".join(bad)


def test_python_m_old_path_runs_the_module():
    r = subprocess.run([sys.executable, "-m", "rawconv.torch_choice", "--help"], capture_output=True, text=True,
                       timeout=300, env=_env(), cwd=PKG.parent)
    assert r.returncode == 0 and "usage: python -m rawconv.torch_choice" in r.stdout, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "rawconv", "--version"], capture_output=True, text=True, timeout=300,
                       env=_env(), cwd=PKG.parent)
    assert r.returncode == 0 and rawconv.__version__ in r.stdout + r.stderr, r.stderr[-2000:]


def test_grad_slot_filled_by_the_operator_layer_on_first_need():
    """A backend's function form given tensors that need grad reaches rawconv.pytorch.ops through the
    slot in rawconv.core.grad, importing that layer on first need (fresh process: not imported yet)."""
    code = (
        "import sys, torch\n"
        "import rawconv.onednn as o\n"
        "assert 'rawconv.pytorch.ops' not in sys.modules, 'imported too early'\n"
        "torch.manual_seed(0)\n"
        "x = torch.randn(1, 2, 5, 5, requires_grad=True)\n"
        "w = torch.randn(3, 2, 3, 3, requires_grad=True)\n"
        "y = o.forward(x, w, padding=1)\n"
        "assert 'rawconv.pytorch.ops' in sys.modules and y.grad_fn is not None\n"
        "gx, gw = torch.autograd.grad(y.sum(), (x, w))\n"
        "xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()\n"
        "rx, rw = torch.autograd.grad(torch.nn.functional.conv2d(xd, wd, padding=1).sum(), (xd, wd))\n"
        "print(float((gx.double() - rx).abs().max()), float((gw.double() - rw).abs().max()))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=_env(),
                       cwd=PKG.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    dx, dw = map(float, r.stdout.split())
    assert dx < 1e-4 and dw < 1e-4   # float32 against float64


def test_grad_slot_without_operator_layer_raises_clearly(monkeypatch):
    from rawconv.core import grad
    from rawconv.errors import InternalError

    monkeypatch.setattr(grad, "_slot", {})
    monkeypatch.setattr(grad, "_loader", [None])
    with pytest.raises(InternalError, match="rawconv.pytorch.ops"):
        grad.grad_function("onednn")


def test_tuning_replay_goes_through_the_registry(monkeypatch):
    """rawconv.tuning.replay (core) builds a record's plan through the backend's registered replay
    (it names no backend module); without one, through the backend's plan()."""
    from rawconv import ConvProblem, onednn, tuning
    from rawconv.core import backend

    p = ConvProblem(n=1, c=2, k=3, in_spatial=(5, 5), kernel=(3, 3), pad_before=(1, 1), pad_after=(1, 1))
    key = tuning.TuningKey.for_backend("onednn", p, "forward", onednn.key_options("strict"))
    rec = tuning.TuningRecord(key, "x64:gemm:jit@any", {})
    be = backend.get("onednn")
    seen = []
    monkeypatch.setattr(be, "replay", lambda k, problem, choice, options: seen.append((k.backend, choice, options))
                        or "a plan")
    assert tuning.replay(rec) == "a plan" and seen == [("onednn", "x64:gemm:jit@any", {"precision": "strict"})]
    monkeypatch.setattr(be, "replay", None)
    monkeypatch.setattr(be, "plan", lambda problem, direction, options, choice: ("plan()", direction, choice))
    assert tuning.replay(rec) == ("plan()", "forward", "x64:gemm:jit@any")


def test_old_private_paths_warn_and_public_ones_do_not(monkeypatch):
    """An old private path (``rawconv._dnnl``) still gives its module, with a DeprecationWarning
    naming the home, pointing at the importing line; the public alias paths import silently."""
    import warnings

    from rawconv import _aliases

    assert "rawconv._dnnl" in _aliases.DEPRECATED and "rawconv.nn" not in _aliases.DEPRECATED
    assert all(not k.rpartition(".")[2].startswith("_") for k in set(ALIASES) - _aliases.DEPRECATED)
    for old in ("rawconv._dnnl", "rawconv._search", "rawconv.nn"):   # as if never imported (restored after)
        monkeypatch.delitem(sys.modules, old, raising=False)
        monkeypatch.delattr(rawconv, old.rpartition(".")[2], raising=False)
    with pytest.warns(DeprecationWarning, match=r"rawconv\._dnnl is a private path .* import rawconv\.onednn\._ffi") as rec:
        mod = importlib.import_module("rawconv._dnnl")
    assert rec[0].filename == __file__   # the importing line (import_module's caller), not importlib's
    assert mod is importlib.import_module("rawconv.onednn._ffi")
    with pytest.warns(DeprecationWarning, match=r"rawconv\._search .* rawconv\.cudnn\.graph\.search") as rec:
        exec("from rawconv import _search", {})
    assert rec[0].filename == "<string>"   # the importing line, not importlib's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert importlib.import_module("rawconv.nn") is importlib.import_module("rawconv.pytorch.nn")
