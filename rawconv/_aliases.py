"""The public import paths of rawconv's modules (``rawconv.nn``, ``rawconv.ops``, ``rawconv.cudnn_graph``...),
made as aliases of the modules' homes in the layered package.

**Which path is canonical.** The paths without a leading underscore in :data:`ALIASES`
(``rawconv.nn``, ``rawconv.ops``, ``rawconv.fused``, ``rawconv.cudnn_graph``, ``rawconv.errors``,
``rawconv.problem``, ``rawconv.check``, ``rawconv.options``, ``rawconv.bench``, ``rawconv.results``,
``rawconv.tuning``, ``rawconv.known_bad``, ``rawconv.presets``, ``rawconv.torch_choice``,
``rawconv.distributed``, ``rawconv.compare``, ``rawconv.cli``) are the **public** paths: the README,
the guides and the API pages use them, and they stay. ``rawconv.onednn`` and ``rawconv.cudnn`` are
public as they are. The layered homes (``rawconv.pytorch.nn``, ``rawconv.cudnn.graph``...) are
where the code lives, for the package's own imports (the layers' rules see every edge there;
``tests/test_layers.py`` checks that no module of the package imports through an alias). The paths
with a leading underscore (``rawconv._cuda``, ``rawconv._dnnl``, ``rawconv._search``...) are private
paths of the flat layout before issue 23 (:data:`DEPRECATED`): importing one still gives the module,
with a ``DeprecationWarning`` naming its home (``rawconv._dnnl``: ``rawconv.onednn._ffi``); they
go in a later 0.x release. The package, its tests and benchmarks import the homes.

An alias gives the module object itself (``import rawconv.cudnn_graph`` is ``rawconv.cudnn.graph``,
not a copy), so that monkeypatching or pickling through either path is seen by both; ``python -m
rawconv.torch_choice`` runs the module it names. A meta path finder does it (no stub files: the
paths hold no code).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# public (and old private) path -> the module it names
ALIASES = {
    "rawconv.errors": "rawconv.core.errors",
    "rawconv.problem": "rawconv.core.problem",
    "rawconv.check": "rawconv.core.check",
    "rawconv.options": "rawconv.core.options",
    "rawconv.bench": "rawconv.core.bench",
    "rawconv.results": "rawconv.core.results",
    "rawconv.tuning": "rawconv.core.tuning",
    "rawconv._backend": "rawconv.core.backend",
    "rawconv._guard": "rawconv.core.guard",
    "rawconv._plans": "rawconv.core.plans",
    "rawconv._progress": "rawconv.core.progress",
    "rawconv._grad": "rawconv.core.grad",
    "rawconv._loader": "rawconv.core.loader",
    "rawconv.known_bad": "rawconv.core.known_bad",
    "rawconv.presets": "rawconv.core.presets",
    "rawconv._capabilities": "rawconv.core.capabilities",
    "rawconv._isolate": "rawconv.core.isolate",
    "rawconv._dnnl": "rawconv.onednn._ffi",
    "rawconv._fpenv": "rawconv.onednn.fpenv",
    "rawconv._cudnn": "rawconv.cudnn._ffi",
    "rawconv._cuda": "rawconv.cudnn._cuda",
    "rawconv.cudnn_graph": "rawconv.cudnn.graph",
    "rawconv._cudnn_backend": "rawconv.cudnn.graph._backend_api",
    "rawconv._search": "rawconv.cudnn.graph.search",
    "rawconv.ops": "rawconv.pytorch.ops",
    "rawconv.nn": "rawconv.pytorch.nn",
    "rawconv.fused": "rawconv.pytorch.fused",
    "rawconv._autocast": "rawconv.pytorch.autocast",
    "rawconv.torch_choice": "rawconv.pytorch.torch_choice",
    "rawconv.distributed": "rawconv.pytorch.distributed",
    "rawconv.compare": "rawconv.explore.compare",
    "rawconv.cli": "rawconv.explore.cli",
    "rawconv._info": "rawconv.explore.info",
}

#: the old private paths (a leading underscore): importing one warns (DeprecationWarning)
DEPRECATED = frozenset(k for k in ALIASES if k.rpartition(".")[2].startswith("_"))


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path as the module it names now (the same object, its own ``__spec__`` kept);
    an old private path (:data:`DEPRECATED`) warns once per process, when it is first imported."""

    def __init__(self, target: str, name: str = ""):
        self.target, self.name = target, name

    def create_module(self, spec):
        if self.name in DEPRECATED:
            warnings.warn(f"{self.name} is a private path of rawconv's old flat layout and will go: import "
                          f"{self.target} (its home)", DeprecationWarning, stacklevel=_caller_level())
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self._spec   # the import system set the alias's spec on it: give back its own

    def get_code(self, fullname):
        """What ``python -m <old path>`` runs: the module it names, as ``__main__``."""
        return compile(f"import runpy\nrunpy.run_module({self.target!r}, run_name='__main__', alter_sys=True)\n",
                       f"<rawconv alias {fullname}>", "exec")


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = ALIASES.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new, fullname))


def _caller_level() -> int:
    """The ``stacklevel`` of the frame that imports (the first outside importlib and this module),
    so that the warning names the importing line (``warnings`` itself skips importlib's bootstrap
    frames when it counts)."""
    f, level = sys._getframe(1), 1
    while f is not None:
        name = f.f_code.co_filename
        if "importlib" in name and "_bootstrap" in name:   # not counted by warnings.warn
            f = f.f_back
            continue
        if name != __file__ and not name.endswith(("importlib/__init__.py", "importlib\\__init__.py")):
            return level
        f, level = f.f_back, level + 1
    return level


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
