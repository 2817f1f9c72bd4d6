"""What can be wrong with a user's training script, each one clear message: bad input (exit 2),
never a failed trial of a configuration."""

from __future__ import annotations

from typing import Any

from autotune.errors import README, ContractError, never_trained_message

__all__ = ["README", "NeverTrained", "ScriptArgumentsRejected", "ScriptError", "ScriptFailed",
           "WrongDevice", "check_device", "never_trained_message"]


class ScriptError(ContractError):
    """The script cannot be tuned as it is; the message says why and what to do."""


class ScriptFailed(ScriptError):
    """The script raised before its training started (its own traceback is the message)."""


class ScriptArgumentsRejected(ScriptError):
    """The script's argument parser refused the arguments it was given."""


class NeverTrained(ScriptError):
    """The script ended, or ran out of time, without starting a supported trainer."""


class WrongDevice(ScriptError):
    """The script trains on another device than autotune was asked to measure."""


def check_device(script: str, trains_on: Any, asked: Any, decided_by: str) -> None:
    """Raise `WrongDevice` where the script's trainer chose another kind of device than the
    trial's; `decided_by` says what in the script chose it."""
    if trains_on.type != asked.type:
        raise WrongDevice(f"{script} trains on {trains_on}, but autotune was asked to measure on "
                          f"{asked} ({decided_by}); run autotune with --device {trains_on.type}")
