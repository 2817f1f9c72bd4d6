"""Patch a library when the script imports it, never before: a Lightning script must not pay
for importing transformers. A finder on `sys.meta_path` hands the named modules a loader that
patches each one right after it has run; a module already imported is patched at once."""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

Patch = Callable[[ModuleType], None]


class _PatchingLoader(importlib.abc.Loader):
    """The module's own loader, then the patch."""

    def __init__(self, loader: Any, patch: Patch) -> None:
        self._loader, self._patch = loader, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name: str) -> Any:  # resources, source, is_package: the loader's own
        return getattr(self._loader, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds the watched modules through the other finders and wraps their loader."""

    def __init__(self, patches: Mapping[str, Patch]) -> None:
        self._patches = dict(patches)

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        patch = self._patches.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


@contextlib.contextmanager
def patched_on_import(patches: Mapping[str, Patch]) -> Iterator[None]:
    """While inside: each module named in `patches` is patched as soon as it is imported (at
    once, if it already is). Patches must be idempotent; they stay after the block ends."""
    for name, patch in patches.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
    finder = _PatchOnImport(patches)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
