"""Measure rawconv's import graph against its layers (issue 23): modules, cycles, arrows back up.

    python tools/import_layers.py [SRC_ROOT]

SRC_ROOT is the folder holding the ``rawconv`` package (default: this checkout). Every import counts,
including those inside functions (grimp sees them, as import-linter does). A module's layer is the
subpackage it lives in (``rawconv.core`` 0, ``rawconv.onednn`` / ``rawconv.cudnn`` 1, ``rawconv.pytorch`` 2,
``rawconv.explore`` 3); a module of the flat layout (before the move) gets the layer of the place
:data:`PLACES` moves it to. An arrow back up imports a higher layer, or the other backend. The old
module paths kept as aliases (``rawconv._aliases``) are not counted. Also prints the longest class and
function and the total lines (AST, per ``.py`` file).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

# where each module of the flat layout lives now (the same table as rawconv._aliases.ALIASES)
PLACES = {
    "errors": "core.errors", "problem": "core.problem", "check": "core.check", "options": "core.options",
    "bench": "core.bench", "results": "core.results", "tuning": "core.tuning", "_backend": "core.backend",
    "_guard": "core.guard", "_plans": "core.plans", "_progress": "core.progress", "_grad": "core.grad",
    "_loader": "core.loader", "known_bad": "core.known_bad", "presets": "core.presets",
    "_capabilities": "core.capabilities", "_isolate": "core.isolate",
    "onednn": "onednn", "_dnnl": "onednn._ffi", "_fpenv": "onednn.fpenv",
    "cudnn": "cudnn", "_cudnn": "cudnn._ffi", "_cuda": "cudnn._cuda", "cudnn_graph": "cudnn.graph",
    "_cudnn_backend": "cudnn.graph._backend_api", "_search": "cudnn.graph.search",
    "ops": "pytorch.ops", "nn": "pytorch.nn", "fused": "pytorch.fused", "_autocast": "pytorch.autocast",
    "torch_choice": "pytorch.torch_choice", "distributed": "pytorch.distributed",
    "compare": "explore.compare", "cli": "explore.cli", "_info": "explore.info",
}
RANK = {"core": 0, "onednn": 1, "cudnn": 1, "pytorch": 2, "explore": 3}


def layer(mod: str, flat: bool) -> str | None:
    parts = mod.split(".")
    if len(parts) < 2:
        return None
    if flat:
        new = PLACES.get(parts[1])
        return new.split(".")[0] if new else None
    return parts[1] if parts[1] in RANK else None


def sccs(nodes, edges):
    """Tarjan's strongly connected components (iterative enough for ~60 modules)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in nodes:
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def sizes(pkg: Path):
    lines, best_cls, best_fn = 0, (0, ""), (0, "")
    for f in sorted(pkg.rglob("*.py")):
        text = f.read_text()
        lines += text.count("\n")
        rel = f.relative_to(pkg.parent).with_suffix("").as_posix().replace("/", ".")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                key = best_cls if isinstance(node, ast.ClassDef) else best_fn
                if n > key[0]:
                    if isinstance(node, ast.ClassDef):
                        best_cls = (n, f"{rel}.{node.name}")
                    else:
                        best_fn = (n, f"{rel}.{node.name}")
    return lines, best_cls, best_fn


def main(argv):
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
    sys.path.insert(0, str(root))
    import grimp

    g = grimp.build_graph("rawconv", include_external_packages=False, cache_dir=None)
    flat = not (root / "rawconv" / "core").is_dir()
    mods = sorted(m for m in g.modules if m != "rawconv._aliases")
    edges = {m: sorted(i for i in g.find_modules_directly_imported_by(m) if i != "rawconv._aliases") for m in mods}
    ups = []
    for m in mods:
        lm = layer(m, flat)
        for i in edges[m]:
            li = layer(i, flat)
            if lm is None or li is None or lm == li:
                continue
            if RANK[li] > RANK[lm] or RANK[li] == RANK[lm]:
                ups.append((m, i, f"{lm}->{li}"))
    cyc = sccs(mods, edges)
    packages = sorted({m for m in mods if (root / m.replace(".", "/") / "__init__.py").is_file()})
    lines, cls, fn = sizes(root / "rawconv")
    short = lambda m: m.replace("rawconv.", "", 1)  # noqa: E731
    print(f"layout: {'flat' if flat else 'layered'} ({root})")
    print(f"modules: {len(mods)}; packages (rooms): {len(packages)} {[short(p) for p in packages]}")
    print(f"import edges: {sum(len(v) for v in edges.values())}")
    print(f"cycles (strongly connected, > 1 module): {len(cyc)}")
    for c in cyc:
        print(f"  {len(c)} modules: {' '.join(short(x) for x in c)}")
    print(f"arrows back up (to a higher layer or the other backend): {len(ups)}")
    for m, i, what in ups:
        print(f"  {short(m)} -> {short(i)}  ({what})")
    print(f"lines: {lines}; longest class: {cls[1]} ({cls[0]} lines); longest function: {fn[1]} ({fn[0]} lines)")


if __name__ == "__main__":
    main(sys.argv)
