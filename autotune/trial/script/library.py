"""What a training library is to a script trial (`Library`): one record per library, made by
the library's own module and listed by `libraries`, so that nothing else names a library or
asks which one it has."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from autotune.config import TrainConfig
from autotune.trial.protocol import CodeChange, LeftOut
from autotune.trial.script.session import ScriptBaseline, Settings

# A library's patch of a module it recognises, told the library it claims a trial's loop for.
Hook = Callable[[ModuleType, "Library"], None]


def no_additions(where: str, values: Mapping[str, Any], baseline: ScriptBaseline,
                 device_type: str) -> list[CodeChange] | None:
    """A library whose every change is said where the script already says it."""
    return None


@dataclass(frozen=True)
class Library:
    """One training library a script may train with. `name` tags a script's baseline and its
    answer (studies store it); `loop` and `script` are what messages call its training loop
    and a script that trains with it; `export_format` is `autotune export`'s format in its
    terms (None: none). `patches` recognise its loop: a module the script imports -> the hook
    that patches it then (the classes are patched where they are defined, so subclasses go
    through them), claiming the trial (`ScriptTrial.library`); a loop of the script's own needs
    none. Its baseline: a Trainer's patch reads it from the Trainer's arguments; a loop the
    script writes (`read_loop` given) is watched by `loop.LoopWatch`, and `read_loop` reads its
    settings there as the training starts (`prepares_model`: the library, not the loop, holds
    the model the trial's model knobs go on, as `Accelerator.prepare` does). Its terms: the knob
    values it cannot be told, with why (`unexpressed`), where and what the script changes to
    run a configuration (`changes`), and the lines a change adds where the script says nothing
    (`additions`). Its worst batch and loss run need no hook of their own: they are observers
    of the `TrainInfo` and steps its patch reports, on the training data cut to the largest
    samples wherever a DataLoader is built (`worst_batch.loaders_cut`; a Trainer that builds
    its loader from a dataset it holds cuts it there, `worst_batch.only`)."""

    name: str
    loop: str
    script: str
    export_format: str | None
    patches: Mapping[str, Hook]
    unexpressed: Callable[[TrainConfig, ScriptBaseline, str, int], list[LeftOut]]
    changes: Callable[[TrainConfig, ScriptBaseline, str, int], Settings]
    additions: Callable[[str, Mapping[str, Any], ScriptBaseline, str],
                        list[CodeChange] | None] = no_additions
    read_loop: Callable[[Any], ScriptBaseline] | None = None  # told the `loop.LoopWatch`
    prepares_model: bool = False

    @property
    def owns_loop(self) -> bool:
        """Whether a script that trains with it writes the loop (watched by `LoopWatch`)."""
        return self.read_loop is not None
