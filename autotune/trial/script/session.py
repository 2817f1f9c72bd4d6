"""One script trial as the libraries' hooks see it: what it asks (the knobs, the device, the
observer, where the library's outputs go) and what they found (the script's own settings, the
settings applied). The hooks act only while a trial is active, so patched libraries behave as
they always do anywhere else."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from autotune.config import TrainConfig, from_baseline
from autotune.trial.protocol import WorstBatchSettings
from autotune.trial.script.observer import StepObserver

# Where a library setting is said: TrainingArguments' fields, Trainer's keyword arguments, an
# attribute of the LightningModule or its DataModule, a line of torch.
Settings = dict[str, dict[str, Any]]


def settings_changed(own: Settings, wanted: Settings) -> Settings:
    """Where and what must change from a script's `own` settings to say `wanted`: each place
    whose values differ, with those values only."""
    out: Settings = {}
    for where, values in wanted.items():
        differ = {k: v for k, v in values.items() if own.get(where, {}).get(k, ...) != v}
        if differ:
            out[where] = differ
    return out


@dataclass
class ScriptBaseline:
    """The script's own settings, read from what it built: `knobs` in TrainConfig's names,
    `fixed` the knobs autotune cannot change in this script (with why: the setting the script
    uses has no autotune value, or the library gives no way to set it), `settings` the same in
    the library's own terms, `parsed_by` the HfArgumentParser method its TrainingArguments came
    from (None: written in the code), `arguments_class` their class as the script names it."""

    library: str
    knobs: dict[str, Any] = field(default_factory=dict)
    fixed: dict[str, str] = field(default_factory=dict)
    settings: Settings = field(default_factory=dict)
    parsed_by: str | None = None
    arguments_class: str = "TrainingArguments"
    run_steps: int | None = None  # the optimizer steps of the script's own run, where known
    sources: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    refused: dict[str, dict[str, str]] = field(default_factory=dict)

    def config(self, device_type: str, world_size: int = 1) -> TrainConfig:
        """The baseline as a TrainConfig: PyTorch's defaults where the script says nothing."""
        return from_baseline(self.knobs, device_type, world_size)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScriptBaseline:
        return cls(**data)

    def said(self, where: str, name: str, source: Any) -> None:
        """Record where the setting `name` of `where` is said (a `sources.Source`)."""
        self.sources.setdefault(where, {})[name] = source.to_dict()


class OutputTail:
    """The last lines a script wrote to its stdout and stderr, as it wrote them: what a message
    shows of a script that ended before its training (its own reason for `sys.exit(3)`)."""

    KEEP_CHARS = 8192

    def __init__(self, lines: int = 10) -> None:
        self.count, self._text = lines, ""

    def add(self, text: str) -> None:
        self._text = (self._text + text)[-self.KEEP_CHARS:]

    def lines(self) -> list[str]:
        """The last non-empty lines, of a line a progress bar rewrote (`\\r`) its last state."""
        shown = ([part for part in line.split("\r") if part.strip()][-1:]
                 for line in self._text.split("\n"))
        return [state[0].rstrip() for state in shown if state][-self.count:]


class Claimant(Protocol):
    """The library that claimed a trial's loop, as the trial sees it (a `library.Library`,
    which is made above this module)."""

    @property
    def name(self) -> str: ...

    @property
    def owns_loop(self) -> bool: ...


@dataclass
class ScriptTrial:
    """A request to the hooks (`config` None: the script's own settings, only read) and what
    they found while the script ran."""

    device: torch.device
    observer: StepObserver
    # This run's own folder: the script's current directory (`cwd`) and the library's outputs,
    # instead of the user's own
    scratch_dir: Path
    config: TrainConfig | None = None
    max_steps: int = 1_000_000     # what the library is told: the observer stops it far sooner
    script: str = "the script"
    folder: Path | None = None  # the script's own folder: the answer names files from it
    baseline: ScriptBaseline | None = None
    settings: Settings = field(default_factory=dict)
    started_at: float = field(default_factory=time.perf_counter)
    train_called_at: float | None = None
    stopped_by_observer: bool = False
    steps: int = 0
    rejected_arguments: str | None = None  # the script's argument parser's message
    # The library whose loop the script runs (`libraries.LIBRARIES`; a hand-written loop is
    # one); None until it shows. A trial is told it by the probe.
    library: Claimant | None = None
    # A trial's: the script's own settings as the probe read them (the answer's baseline; the
    # trial's own run reads the settings the trial gave it).
    own: ScriptBaseline | None = None
    candidates: dict[str, Any] = field(default_factory=dict)  # the probe's values to check
    flags: dict[str, Any] = field(default_factory=dict)  # its parser's options, by dest
    flag_map: dict[str, str] = field(default_factory=dict)  # knob -> the user's named flag
    flags_set: list[str] = field(default_factory=list)  # the script's flags the trial set
    loop: Any = None  # the watch on a script's own loop (`trial/script/loop.LoopWatch`)
    own_paths: list[str] = field(default_factory=list)  # autotune's files the trial writes
    printed_help: bool = False  # its parser printed its help (`-- --help`)
    # A worst batch's job: the training data's largest samples, which every micro-batch is made
    # of (`script.worst_batch.only`); None: the training data as the script builds it.
    worst: WorstBatchSettings | None = None
    # A loss run's seed, for a library that seeds the run itself (a Trainer's
    # `TrainingArguments.seed`); None: the script's own.
    seed: int | None = None
    # A probe's: the script is stopped where its training has not started by then, and says
    # what it did (`runner`); None: no limit of its own (the tuner's time limit stops it).
    startup_limit_s: float | None = None
    output: OutputTail = field(default_factory=OutputTail)

    def training_called(self) -> float:
        """Mark the moment the script hands over to the library; its start-up in seconds."""
        if self.train_called_at is None:
            self.train_called_at = time.perf_counter()
        return self.train_called_at - self.started_at

    @property
    def training(self) -> bool:
        return self.train_called_at is not None

    @property
    def own_loop(self) -> bool:
        """Whether the loop may be the script's own (`loop.LoopWatch` watches it): no library
        has claimed it yet, or the one that did leaves the loop to the script."""
        return self.library is None or self.library.owns_loop


_current: ScriptTrial | None = None


def current() -> ScriptTrial | None:
    """The trial the hooks serve now, if any."""
    return _current


@contextlib.contextmanager
def active(trial: ScriptTrial) -> Iterator[ScriptTrial]:
    global _current
    previous, _current = _current, trial
    try:
        yield trial
    finally:
        _current = previous
