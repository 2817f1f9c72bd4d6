"""A configuration in the terms of the loop a script trains with (a Hugging Face or Lightning
Trainer, an Accelerator, or its own hand-written loop): which of its knob values the script
cannot be told (left out, with why), what the script must change to run it, and the answer as
the user applies it (`answer`): the script's own flags where a setting comes from one, else
accelerate launch's flags, else the lines of its code."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.trial.protocol import CodeChange, LeftOut, ScriptAnswer, ScriptFlag
from autotune.trial.script import accelerate_terms
from autotune.trial.script.libraries import library_of
from autotune.trial.script.session import ScriptBaseline, Settings
from autotune.trial.script.sources import Source

# DataLoader settings that only a loader with worker processes has.
WORKER_SETTINGS = ("prefetch_factor", "persistent_workers")
# The knobs no probe candidate covers, which a script can keep to itself as a whole.
BATCH_KNOBS = ("micro_batch_size", "grad_accum_steps")

def unexpressed(config: TrainConfig, baseline: ScriptBaseline, device_type: str,
                world_size: int = 1) -> list[LeftOut]:
    """Each knob value of `config` the script's library cannot be told, with why."""
    return library_of(baseline.library).unexpressed(config, baseline, device_type, world_size)


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
                not base.num_workers and "num_workers" not in baseline.fixed else base
            try:
                config = start.setting(knob, value)
            except ConfigError:  # a value that needs another knob changed too: not this one's
                continue
            out += [item for item in unexpressed(config, baseline, device_type, world_size)
                    if item.knob == knob]
    return out


def kept(baseline: ScriptBaseline) -> dict[str, str]:
    """The batch knobs the script keeps as a whole, with why (no probe candidate covers
    them: the search fixes them at the script's own values)."""
    return {k: baseline.fixed[k] for k in BATCH_KNOBS if k in baseline.fixed}


def changes(config: TrainConfig, baseline: ScriptBaseline, device_type: str,
            world_size: int = 1) -> Settings:
    """What the script changes to run `config`, by where it is said (TrainingArguments' fields;
    the Trainer's arguments, the DataModule's attributes, an Accelerator's, a DataLoader's,
    torch lines), and to what."""
    return library_of(baseline.library).changes(config, baseline, device_type, world_size)


def answer(config: TrainConfig, baseline: ScriptBaseline, device_type: str,
           world_size: int = 1) -> ScriptAnswer:
    """The configuration as the user applies it to the script: each change through the
    script's own flag where the setting comes from one, accelerate launch's flag where the
    launcher sets it, else at the line of the code that says it (a line to add, where the
    script has none)."""
    changed = changes(config, baseline, device_type, world_size)
    library = library_of(baseline.library)
    plain = ScriptAnswer(baseline.library, changed, baseline.parsed_by,
                         baseline.arguments_class, trained_with=library.script,
                         export_format=library.export_format)
    if plain.on_command_line:  # every setting is a flag of HfArgumentParser's
        return plain
    add = library.additions
    script_flags: dict[str, ScriptFlag] = {}
    launcher_flags: dict[str, ScriptFlag] = {}
    lines: dict[tuple[str | None, int | None, str | None], dict[str, Any]] = {}
    code: list[CodeChange] = []
    for where, values in changed.items():
        place = baseline.sources.get(where, {})
        routed = {}
        for name, value in values.items():
            source = Source.from_dict(place[name]) if name in place else None
            if source is not None and source.flag:
                script_flags[source.flag] = ScriptFlag(source.flag, value, source.form,
                                                       source.const, source.aliases)
            elif source is not None and source.launcher:
                if value is not None:
                    launcher_flags[source.launcher] = ScriptFlag(source.launcher, value)
            else:
                routed[name] = (value, source)
        added = add(where, {n: v for n, (v, _) in routed.items()}, baseline, device_type) \
            if routed else None
        if added is not None:
            code += added
            continue
        for name, (value, source) in routed.items():
            at = source if source is not None and source.file else \
                Source.from_dict(place[""]) if "" in place else None
            key = (at.file, at.line, at.call) if at is not None else (None, None, where)
            lines.setdefault(key, {})[name] = value
    for (file, line, call), values in lines.items():
        code.append(_code_change(file, line, call, values, plain))
    return replace(plain, routed=True, script_flags=tuple(script_flags.values()),
                   launcher=accelerate_terms.LAUNCHER if launcher_flags else None,
                   launcher_flags=tuple(launcher_flags.values()), code=tuple(code))


def _code_change(file: str | None, line: int | None, call: str | None,
                 values: dict[str, Any], plain: ScriptAnswer) -> CodeChange:
    """A call's keyword arguments to change at its line; where the line is unknown, the place
    as the answer always named it (`TrainingArguments(bf16=True)`, an assignment's target
    wrapped)."""
    if file is not None:
        return CodeChange(file, line, call, values)
    where = call or ""
    return CodeChange(None, None, text=ScriptAnswer(
        plain.library, {where: values}, None, plain.arguments_class).keyword_lines()[0])

