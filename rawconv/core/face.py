"""Settings of a package face that live in one of its parts: :func:`route_settings`.

A backend's face (``rawconv.onednn``, ``rawconv.cudnn``, ``rawconv.cudnn_graph``) hands on names that
its parts define; a setting users change on the face (``rawconv.onednn.SLOW_REFERENCE_SECONDS = 30``,
a test's ``monkeypatch.setattr(cudnn, "gpu_time", f)``) must reach the part that reads it at run time.
:func:`route_settings` gives the face's module a type whose properties read and write the part's
attribute. Each routed name also keeps a copy in the face's own ``__dict__``, written by the property,
so that ``unittest.mock.patch.object`` sees an attribute of the module itself and restores it on
leaving its block by setting it (which the property passes on), and ``del`` puts the part's value back
in the copy."""
from __future__ import annotations

import sys
from types import ModuleType

__all__ = ["route_settings"]


def route_settings(module_name: str, routes: dict) -> None:
    """Make each ``name`` of ``routes`` (``{name: part module}``), read or set on the module
    ``module_name``, read or set the part's attribute of that name."""
    face = sys.modules[module_name]
    props = {}
    for name, part in routes.items():
        if not isinstance(part, ModuleType) or not hasattr(part, name):
            raise TypeError(f"route_settings: {part!r} has no setting {name!r}")

        def get(self, _part=part, _name=name):
            return getattr(_part, _name)

        def set_(self, value, _part=part, _name=name):
            setattr(_part, _name, value)
            self.__dict__[_name] = value

        def delete(self, _part=part, _name=name):   # (the copy back to the part's value)
            self.__dict__[_name] = getattr(_part, _name)

        props[name] = property(get, set_, delete, f"{part.__name__}.{name}, set and read through this face")
        face.__dict__[name] = getattr(part, name)
    face.__class__ = type("Face", (type(face),), {"__module__": module_name, **props})
