"""The one registry of the training libraries a script trial recognises (`LIBRARIES`): each
library's module makes its `Library`, and this is the only place that lists them. Another
library is one module plus one line here, or, from outside autotune, a module named in
`AUTOTUNE_LIBRARIES` (comma-separated, imported in every trial's process) that calls
`register`."""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from types import ModuleType

from autotune.trial.script import accelerate_terms, hf, lightning, loop_terms
from autotune.trial.script.library import Library

# Modules (comma-separated) whose import registers more libraries, in every process that
# runs a script: a trial's environment carries it.
EXTRA_LIBRARIES = "AUTOTUNE_LIBRARIES"

LIBRARIES: dict[str, Library] = {}


def register(library: Library) -> None:
    """Add `library` (by its name: a library registered again replaces the first)."""
    LIBRARIES[library.name] = library


def library_of(name: str) -> Library:
    """The library a script's baseline or answer is tagged with."""
    return LIBRARIES[name]


def patches() -> dict[str, Callable[[ModuleType], None]]:
    """Every library's hooks by the module whose import installs them, each told its library."""
    return {module: functools.partial(hook, library=library) for library in LIBRARIES.values()
            for module, hook in library.patches.items()}


for _library in (hf.HUGGING_FACE, lightning.LIGHTNING, accelerate_terms.ACCELERATE_LOOP,
                 loop_terms.OWN_LOOP):
    register(_library)
for _module in filter(None, os.environ.get(EXTRA_LIBRARIES, "").split(",")):
    importlib.import_module(_module.strip())
