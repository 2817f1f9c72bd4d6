"""Every error autotune raises derives from `AutotuneError`, in three families the command line
turns into its exit codes (`cli.exit_code`): bad input (2), a run that cannot go on (1), and an
interruption (130). Errors that never leave autotune (a configuration a device cannot run, a
fork server that died) derive from the base alone."""

from __future__ import annotations


class AutotuneError(Exception):
    """An error autotune raised on purpose, with a message meant for the user."""


class BadInput(AutotuneError):
    """The user's input is wrong: one clear message, exit 2, nothing written to a study."""


class UsageError(BadInput):
    """Bad command-line input."""


class ConfigError(BadInput, ValueError):
    """A configuration, a study name or a file the user named that is malformed or contradicts
    itself: bad input, not a failed trial."""


class ContractError(BadInput):
    """The model file breaks the contract; the message says what to add or change."""


class RunFailed(AutotuneError):
    """The run cannot go on (the probe of the model file failed, the storage stayed
    unreachable): exit 1 with the reason."""


class Interrupted(AutotuneError):
    """Ctrl-C: the running trial was killed and recorded; the study is intact."""


# Where a user whose training loop steps no torch.optim optimizer is sent.
README = "README"
# What a script's training starts with, as a message names it.
TRAINING_START = "Trainer.train, Trainer.fit or a torch.optim optimizer's first step"


def never_trained_message(script: str, seconds: float, ended: bool = False, saw: str = "",
                          trained: bool = False) -> str:
    """For a training script whose training autotune never saw start: `ended` it finished by
    itself, otherwise it was stopped after `seconds` (its start-up limit); `saw`: what the
    trial saw it do, `trained`: that was training (backward passes, optimizer steps), which
    autotune could not attach to. Shared by the trial, which sees a script end or stops it, and
    the tuner, which stops one that runs too long."""
    if trained:
        return (f"{script} ran {seconds:.0f} s and trained, but autotune could not attach to its "
                f"loop ({saw}): it attaches to Trainer.train, Trainer.fit, or the steps of a "
                "torch.optim optimizer that the script builds, itself or through a library's "
                "function")
    how = "ended without" if ended else "never reached"
    return (f"{script} ran {seconds:.0f} s and {how} {TRAINING_START}"
            f"{f' ({saw})' if saw else ''}; a loop without a torch.optim optimizer: write a "
            f"model file ({README})")
