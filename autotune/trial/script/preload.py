"""Which of a training script's imports a fork server may make before the script runs, and
making them there.

A script's trial pays its interpreter, torch and its library (transformers, Lightning) before
its own code trains: seconds, on a model that trains for a few. The probe (a fresh interpreter)
records the library modules the script had imported when its training began: modules of
installed packages and the standard library, never a file of the user's own (a module
outside every library folder). A library may read the environment when it is imported, so a
script that changes `os.environ` first keeps every import after the change to its own trial.
The fork server imports the recorded modules once (`import_modules`); each trial is a fork of
it, and the script then runs from its first line, as in a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import os
import site
import sys
import sysconfig
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType


class ImportRecorder(importlib.abc.MetaPathFinder):
    """Sees every new import of the script (it finds nothing itself) and keeps the library
    modules imported before the script first changed the environment."""

    def __init__(self) -> None:
        self._environment = dict(os.environ)
        self._before_change: list[str] | None = None
        self._checking = False
        self.changed: list[str] = []  # the variables changed before training, in order seen

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        self.check_environment()
        return None

    def check_environment(self) -> None:
        """The first change to the environment freezes what may be imported ahead (an import
        made while that is read is not looked at again)."""
        if self._before_change is not None or self._checking:
            return
        changed = changed_variables(self._environment)
        if changed:
            self._checking = True
            try:
                self.changed = changed
                self._before_change = library_modules()
            finally:
                self._checking = False

    def modules(self) -> list[str]:
        """The library modules a fork server may import for this script: every one imported so
        far, or those imported before the environment changed."""
        self.check_environment()
        return self._before_change if self._before_change is not None else library_modules()


@contextlib.contextmanager
def recording_imports() -> Iterator[ImportRecorder]:
    """While inside, the script's imports are seen by the recorder that is yielded."""
    recorder = ImportRecorder()
    sys.meta_path.insert(0, recorder)
    try:
        yield recorder
    finally:
        sys.meta_path.remove(recorder)


def library_modules() -> list[str]:
    """The modules imported so far whose files lie in a library folder (installed packages,
    the standard library), autotune's own left out, in the order they were imported; a module
    still being imported (whose own code may be what changed the environment) is left out, and
    so is a module that a deeper one imports anyway (its package)."""
    roots = library_roots()
    # A module's attributes read from its own __dict__: a module-level __getattr__ (PEP 562;
    # transformers' aliases of moved modules) would import on a missing one.
    names = [name for name, module in list(sys.modules.items())
             if isinstance(module, ModuleType) and vars(module).get("__name__") == name
             and name.split(".")[0] != "autotune" and not _initializing(module)
             and _inside(module, roots)]
    parents = {name.rsplit(".", 1)[0] for name in names if "." in name}
    return [name for name in names if name not in parents]


def changed_variables(before: Mapping[str, str]) -> list[str]:
    """The variables of os.environ set, changed or removed since `before`, sorted."""
    now = os.environ
    return sorted(k for k in now.keys() | before.keys() if now.get(k) != before.get(k))


def import_modules(names: Sequence[str]) -> tuple[int, list[str]]:
    """Import `names` in order (in the fork server): how many were imported, and the names
    that failed (the trial imports those itself, as it would anyway)."""
    failed = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - any failure leaves the import to the trial
            failed.append(name)
    return len(names) - len(failed), failed


def library_roots() -> tuple[str, ...]:
    """The folders of installed packages and the standard library, each with a trailing
    separator."""
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    roots.update(site.getsitepackages())
    with contextlib.suppress(AttributeError):
        roots.add(site.getusersitepackages())
    return tuple(str(Path(root).resolve()) + os.sep for root in roots)


def _initializing(module: ModuleType) -> bool:
    return bool(getattr(vars(module).get("__spec__"), "_initializing", False))


def _inside(module: ModuleType, roots: tuple[str, ...]) -> bool:
    file = vars(module).get("__file__")
    if not file:
        return False
    with contextlib.suppress(OSError):
        return str(Path(file).resolve()).startswith(roots)
    return False
