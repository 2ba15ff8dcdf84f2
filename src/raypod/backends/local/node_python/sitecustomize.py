"""Run at the start of every Python process of a node raypod starts (its directory leads the node's PYTHONPATH):
Ray's agents, its workers, jobs' drivers and notebook kernels.

``import ray`` imports jsonschema, which imports ``rfc3987_syntax`` (where installed: JupyterLab brings it) to
check the ``iri`` format; that module compiles some 35 grammars when imported, about a second of CPU in every
process, and Ray starts several per node. Here it is imported on first use instead: jsonschema gets a stand-in
whose checker loads the real module when an ``iri`` is first validated. Nothing else changes. Then the
sitecustomize this one shadows, if any, runs as it would have.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

DEFERRED = "rfc3987_syntax"
_HERE = os.path.dirname(os.path.abspath(__file__))


class _DeferredImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != DEFERRED or importlib.machinery.PathFinder.find_spec(name) is None:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        def real() -> ModuleType:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            if sys.modules.get(DEFERRED) is module:
                del sys.modules[DEFERRED]
            return importlib.import_module(DEFERRED)

        def is_valid_syntax(*args: Any, **kwargs: Any) -> Any:
            return real().is_valid_syntax(*args, **kwargs)

        def attribute_of_real(name: str) -> Any:
            if name.startswith("__"):  # the import system's own questions (is it a package?) load nothing
                raise AttributeError(name)
            return getattr(real(), name)

        module.is_valid_syntax = is_valid_syntax  # type: ignore[attr-defined]
        module.__getattr__ = attribute_of_real  # type: ignore[method-assign]


def _chain() -> None:
    """Run the sitecustomize this module shadows (a distribution's, a virtual environment's), if there is one."""
    rest = [entry for entry in sys.path if os.path.abspath(entry or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        shadowed = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(shadowed)


sys.meta_path.insert(0, _DeferredImport())
_chain()
