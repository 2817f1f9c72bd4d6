"""One error base: every exception autotune defines derives from `AutotuneError`, and the
command line turns each family into its exit code."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import autotune
from autotune.cli import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, exit_code
from autotune.errors import (
    AutotuneError,
    BadInput,
    ConfigError,
    ContractError,
    Interrupted,
    RunFailed,
    UsageError,
)
from autotune.search.runner import ProbeFailed
from autotune.study.journal import JournalError
from autotune.study.storage import StorageUnavailable


def _defined_exceptions() -> list[type]:
    found = []
    for info in pkgutil.walk_packages(autotune.__path__, "autotune."):
        if info.name == "autotune.__main__":  # importing it runs the command line
            continue
        module = importlib.import_module(info.name)
        found += [cls for _, cls in inspect.getmembers(module, inspect.isclass)
                  if issubclass(cls, BaseException) and cls.__module__ == info.name]
    return found


def test_every_exception_autotune_defines_derives_from_one_base() -> None:
    defined = _defined_exceptions()
    errors = [c for c in defined if issubclass(c, Exception)]
    assert len(errors) >= 13
    assert [c.__name__ for c in errors if not issubclass(c, AutotuneError)] == []


def test_the_only_signals_that_are_no_errors_stop_a_users_script() -> None:
    """A BaseException that is not an Exception is a signal no script's `except Exception:`
    may swallow; the only ones autotune defines stop the user's script: after its training,
    or where a probe's start-up limit passes before it."""
    assert sorted(c.__name__ for c in _defined_exceptions() if not issubclass(c, Exception)) \
        == ["TrainingDone", "_StartupLimit"]


def test_each_family_has_its_exit_code() -> None:
    for error in (UsageError("x"), ConfigError("x"), ContractError("x"), JournalError("x")):
        assert isinstance(error, BadInput) and exit_code(error) == EXIT_BAD_INPUT
    for error in (RunFailed("x"), StorageUnavailable("x"), ProbeFailed("x")):
        assert exit_code(error) == EXIT_FAILED
    assert exit_code(Interrupted()) == EXIT_INTERRUPTED
