"""Measure rawconv's subpackage boundaries (issue 35): private names used across subpackages, import
cycles (imports inside functions counted), modules over the size limit.

    python tools/boundaries.py [--list]

A *subpackage* is ``rawconv.core``, ``rawconv.onednn``, ``rawconv.cudnn`` (with its ``graph`` and
``legacy`` parts), ``rawconv.pytorch``, ``rawconv.explore``, or the top ``rawconv`` modules. A
*private name used across subpackages* is ``from rawconv.X import _name`` (a private function,
class, constant or module) or ``X._name`` where ``X`` names a module of another subpackage
(``from .. import onednn`` then ``onednn._plan``). Private attributes of objects (``plan._hot``)
are not seen: their type is not known without running the code. tests/test_boundaries.py keeps
each measure with an allow-list that may only shrink.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "rawconv"
MAX_LINES = 1000


def module_files(pkg: Path = PKG) -> dict[str, Path]:
    """``rawconv.core.backend`` -> its file, for every module of the package."""
    out = {}
    for f in sorted(pkg.rglob("*.py")):
        parts = list(f.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def subpackage(mod: str) -> str:
    parts = mod.split(".")
    if len(parts) >= 2 and (PKG / parts[1]).is_dir():
        return parts[1]
    return "rawconv"


def _package_of(mod: str, f: Path) -> list[str]:
    parts = mod.split(".")
    return parts if f.name == "__init__.py" else parts[:-1]


def _absolute(node: ast.ImportFrom, pkg: list[str]) -> str:
    if not node.level:
        return node.module or ""
    anchor = pkg[:len(pkg) - node.level + 1]
    return ".".join(anchor + ([node.module] if node.module else []))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def imports(pkg: Path = PKG) -> dict[str, set[str]]:
    """Module -> the rawconv modules it imports (every import, those inside functions too; the
    alias paths of rawconv._aliases resolved)."""
    aliases = {}
    for node in ast.walk(ast.parse((pkg / "_aliases.py").read_text())):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "ALIASES" for t in node.targets):
            aliases = ast.literal_eval(node.value)
    mods = module_files(pkg)
    edges: dict[str, set[str]] = {}
    for mod, f in mods.items():
        pk = _package_of(mod, f)
        out = edges.setdefault(mod, set())
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, pk)
                # ``from X import m``: the module X.m when it is one, else X (a name defined there)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for n in names:
                n = aliases.get(n, n)
                while n and n not in mods:
                    n = n.rpartition(".")[0]
                if n and n != mod and n.startswith("rawconv"):
                    out.add(n)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module, each sorted (Tarjan's, from
    tools/import_layers.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        from import_layers import sccs
    finally:
        sys.path.pop(0)
    return sorted(tuple(c) for c in sccs(sorted(edges), edges))


def private_uses(pkg: Path = PKG) -> list[str]:
    """``"pytorch.ops -> onednn._w_layout"``: each private name a module uses from another
    subpackage's module (once per using module and name), sorted."""
    mods = module_files(pkg)
    found = set()
    for mod, f in mods.items():
        pk = _package_of(mod, f)
        mine = subpackage(mod)
        bound: dict[str, str] = {}   # local name -> a rawconv module of another subpackage
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _absolute(node, pk)
                if not base.startswith("rawconv"):
                    continue
                for a in node.names:
                    full = f"{base}.{a.name}"
                    owner = full if full in mods else base
                    if owner in mods and subpackage(owner) != mine:
                        if _private(a.name):
                            found.add(f"{mod.removeprefix('rawconv.')} -> {base.removeprefix('rawconv.')}.{a.name}")
                        if full in mods:
                            bound[a.asname or a.name] = full
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in mods and subpackage(a.name) != mine and a.asname:
                        bound[a.asname] = a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr):
                target = bound.get(node.value.id)
                if target is not None:
                    found.add(f"{mod.removeprefix('rawconv.')} -> {target.removeprefix('rawconv.')}.{node.attr}")
    return sorted(found)


def long_modules(pkg: Path = PKG, limit: int = MAX_LINES) -> dict[str, int]:
    """Module -> its line count, for the modules over ``limit`` lines."""
    out = {}
    for mod, f in module_files(pkg).items():
        n = len(f.read_text().splitlines())
        if n > limit:
            out[mod.removeprefix("rawconv.")] = n
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    uses = private_uses()
    cyc = cycles(imports())
    longs = long_modules()
    print(f"private names used across subpackages: {len(uses)} "
          f"(in {len({u.split(' -> ')[0] for u in uses})} modules)")
    print(f"import cycles (imports inside functions counted): {len(cyc)} "
          f"({sum(len(c) for c in cyc)} modules in them)")
    for c in cyc:
        print("  " + " ".join(m.removeprefix("rawconv.") for m in c))
    print(f"modules over {MAX_LINES} lines: {len(longs)}")
    for m, n in sorted(longs.items(), key=lambda kv: -kv[1]):
        print(f"  {m}: {n}")
    if "--list" in argv:
        print("\n".join(uses))
    return 0


if __name__ == "__main__":
    sys.exit(main())
