"""A configuration in the terms of the library a script trains with: which of its knob values
the library cannot be told for this script (left out, with why), and what the script must
change to run it (the answer in its own terms)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.trial.protocol import LeftOut
from autotune.trial.script import hf_terms, lightning_terms
from autotune.trial.script.session import ScriptBaseline, Settings

# DataLoader settings that only a loader with worker processes has.
WORKER_SETTINGS = ("prefetch_factor", "persistent_workers")


def unexpressed(config: TrainConfig, baseline: ScriptBaseline, device_type: str,
                world_size: int = 1) -> list[LeftOut]:
    """Each knob value of `config` the script's library cannot be told, with why."""
    terms = hf_terms if baseline.library == hf_terms.LIBRARY else lightning_terms
    return terms.unexpressed(config, baseline, device_type, world_size)


def left_out(baseline: ScriptBaseline, domains: Mapping[str, Iterable[Any]], device_type: str,
             world_size: int = 1) -> list[LeftOut]:
    """Every value in `domains` (knob -> values, as the space offers them) that the script's
    library cannot be told, each tried on the script's own configuration."""
    base = baseline.config(device_type, world_size)
    out = []
    for knob, values in domains.items():
        for value in values:
            # a worker process's settings are tried with one (on a script without workers
            # they would mean nothing, and never be left out)
            start = base.setting("num_workers", 1) if knob in WORKER_SETTINGS and \
                not base.num_workers else base
            try:
                config = start.setting(knob, value)
            except ConfigError:  # a value that needs another knob changed too: not this one's
                continue
            out += [item for item in unexpressed(config, baseline, device_type, world_size)
                    if item.knob == knob]
    return out


def changes(config: TrainConfig, baseline: ScriptBaseline, device_type: str,
            world_size: int = 1) -> Settings:
    """What the script changes to run `config`, by where it is said (TrainingArguments' fields;
    the Trainer's arguments, the DataModule's attributes, torch lines), and to what."""
    if baseline.library == hf_terms.LIBRARY:
        fields = hf_terms.changed_arguments(config, baseline, device_type, world_size)
        return {"TrainingArguments": fields} if fields else {}
    return lightning_terms.changed_settings(config, baseline, device_type)
