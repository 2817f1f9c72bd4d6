"""A library is patched when a script imports it, and only then."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from autotune.trial.script.imports import patched_on_import


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package `toylib` with a module `toylib.core` that defines `Trainer`."""
    package = tmp_path / "toylib"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "core.py").write_text("class Trainer:\n    def train(self):\n        return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "toylib.core"
    for name in ("toylib.core", "toylib"):
        sys.modules.pop(name, None)


def _patch(module: ModuleType) -> None:
    module.Trainer.train = lambda self: 2


def test_a_module_is_patched_when_it_is_imported_and_not_before(toy: str) -> None:
    with patched_on_import({toy: _patch}):
        assert toy not in sys.modules
        from toylib.core import Trainer
        assert Trainer().train() == 2
    assert all(not hasattr(f, "_patches") for f in sys.meta_path)  # the finder is gone


def test_a_module_imported_already_is_patched_at_once(toy: str) -> None:
    module = importlib.import_module(toy)
    assert module.Trainer().train() == 1
    with patched_on_import({toy: _patch}):
        assert module.Trainer().train() == 2


def test_other_modules_import_as_they_always_do(toy: str) -> None:
    with patched_on_import({"toylib.other": _patch}):
        module = importlib.import_module(toy)
    assert module.Trainer().train() == 1 and module.__spec__.loader.__class__.__name__ != \
        "_PatchingLoader"
