"""The module paths of the flat layout (before issue 23), kept as aliases of the same module objects.

``import rawconv.cudnn_graph`` gives ``rawconv.cudnn.graph`` itself (``is``, not a copy), so that code
and tests that import, monkeypatch or pickle through an old path keep working; ``python -m
rawconv.torch_choice`` runs the module it names. A meta path finder does it (no stub files: the old
paths hold no code, and no layer imports them; ``tests/test_layers.py`` checks both).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

# old path -> the module it names now
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


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path as the module it names now (the same object, its own ``__spec__`` kept)."""

    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
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
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
