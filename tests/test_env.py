"""One home for every RAWCONV_* environment variable (rawconv.core.env) and one rawconv.clear_caches()."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

import rawconv
from rawconv.core import env

PKG = Path(rawconv.__file__).resolve().parent
ROOT = PKG.parent


def _sources(*folders):
    for folder in folders:
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_every_rawconv_variable_named_anywhere_is_declared():
    names = set()
    for f in list(_sources("rawconv", "tests", "benchmarks", "examples", "tools")) + sorted(ROOT.glob("examples/*.ipynb")):
        names |= set(re.findall(r"\bRAWCONV_[A-Z0-9_]*[A-Z0-9]\b", f.read_text()))
    names.discard("RAWCONV_NOPE")   # this file's undeclared example
    declared = {k.name for k in env.KNOBS}
    assert names - declared == set(), f"declare these in rawconv.core.env.KNOBS: {sorted(names - declared)}"
    assert len(declared) == len(env.KNOBS)   # one declaration per name
    for k in env.KNOBS:
        assert k.type in ("path", "switch", "text") and k.scope in ("rawconv", "tests") and k.meaning and k.read_by


def _environ_reads(tree: ast.AST):
    """Every os.environ.get(...) / os.getenv(...) / os.environ[...] read in a module, with its argument."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if (f.attr == "get" and isinstance(f.value, ast.Attribute) and f.value.attr == "environ") or \
                    (f.attr == "getenv" and isinstance(f.value, ast.Name) and f.value.id == "os"):
                yield node.lineno, node.args[0] if node.args else None
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "environ" \
                and isinstance(node.ctx, ast.Load):
            yield node.lineno, node.slice


def test_no_module_but_env_reads_a_rawconv_variable():
    """rawconv reads its variables only through rawconv.core.env: elsewhere os.environ is read only
    for another program's variable, by its literal name (COLUMNS...)."""
    bad = []
    for f in _sources("rawconv"):
        if f == PKG / "core" / "env.py":
            continue
        for line, arg in _environ_reads(ast.parse(f.read_text())):
            literal = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            if not literal or arg.value.startswith("RAWCONV_"):
                bad.append(f"{f.relative_to(ROOT)}:{line}: {ast.unparse(arg) if arg is not None else '?'}")
    assert not bad, "read these through rawconv.core.env.get:\n" + "\n".join(bad)


def test_getters_are_typed():
    assert env.get("RAWCONV_PROGRESS", {}) is True
    for off in ("0", "false", " No ", "OFF"):
        assert env.get("RAWCONV_PROGRESS", {"RAWCONV_PROGRESS": off}) is False
    assert env.get("RAWCONV_PROGRESS", {"RAWCONV_PROGRESS": "1"}) is True
    assert env.get("RAWCONV_TUNING_CACHE", {}) is None
    assert env.get("RAWCONV_TUNING_CACHE", {"RAWCONV_TUNING_CACHE": ""}) is None
    assert env.get("RAWCONV_TUNING_CACHE", {"RAWCONV_TUNING_CACHE": "/x.json"}) == "/x.json"
    with pytest.raises(KeyError, match="not declared"):
        env.get("RAWCONV_NOPE", {})
    rows = env.table("rawconv")
    assert {r["name"] for r in rows} >= {"RAWCONV_DNNL_LIBRARY", "RAWCONV_CUDNN_LIBRARY", "RAWCONV_TUNING_CACHE",
                                         "RAWCONV_PROGRESS"}
    assert all(r["scope"] == "rawconv" for r in rows)


def test_reads_go_through_env(monkeypatch):
    """The package's behaviour follows the variables as before (now read through env.get)."""
    from rawconv import tuning
    from rawconv.core import progress as _progress

    monkeypatch.setenv("RAWCONV_PROGRESS", "off")
    assert _progress.enabled(None) is False and _progress.enabled(True) is True
    tuning.set_cache_file(None)
    monkeypatch.delenv("RAWCONV_TUNING_CACHE", raising=False)
    monkeypatch.setenv("RAWCONV_CUDNN_TUNING_CACHE", "/old/name.json")
    assert tuning.cache_file() == "/old/name.json"
    monkeypatch.setenv("RAWCONV_TUNING_CACHE", "/new/name.json")
    assert tuning.cache_file() == "/new/name.json"
    monkeypatch.setenv("RAWCONV_TUNING_CACHE", "")
    assert tuning.cache_file() == "/old/name.json"


def test_clear_caches_empties_every_plan_cache():
    from rawconv import cudnn, cudnn_graph, fused, onednn, ops, torch_choice
    from rawconv.core import plans

    torch.manual_seed(0)
    x, w, b = torch.randn(1, 4, 6, 6), torch.randn(5, 4, 3, 3), torch.randn(5)
    y = onednn.forward(x, w, padding=1)
    ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    assert (y.double() - ref).abs().max() < 1e-4
    ops.conv(x, w, None, 1, 1, 1, 1)
    fused.conv_bias_act(x, w, b, padding=1)
    torch_choice._cand_cache["k"] = "v"
    fused._fast["k"] = "v"
    module_caches = {"onednn": (onednn._cache, onednn._fast_plans, onednn._last_plans),
                     "cudnn": (cudnn._cache, cudnn._fast), "cudnn_graph": (cudnn_graph._plans, cudnn_graph._fast_plans),
                     "fused": (fused._cpu_plans, fused._gpu_plans),
                     "ops": (ops._cpu_cache, ops._cpu_last, ops._cuda_last, ops._conv_cache)}
    every = [c for cs in module_caches.values() for c in cs]
    assert len(every) == 13 and all(c in plans._caches for c in every)
    assert sum(len(c) for c in every) > 0
    n = rawconv.clear_caches()
    assert n >= 15
    assert [len(c) for c in every] == [0] * len(every)
    assert torch_choice._cand_cache == {} and fused._fast == {}
    # the caches fill again and give the same result
    assert torch.equal(onednn.forward(x, w, padding=1), y)
    # the old per-module functions still empty their part
    assert len(onednn._cache) + len(onednn._last_plans) + len(onednn._fast_plans) > 0
    onednn.clear_cache()
    assert len(onednn._cache) == len(onednn._fast_plans) == len(onednn._last_plans) == 0
