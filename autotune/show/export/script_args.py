"""The `args` export: a script study's answer in the script's own terms, as the user applies
it: the flags to add to its command line (a script whose TrainingArguments come from
HfArgumentParser), or the keyword arguments to change in its code."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from autotune.errors import ConfigError
from autotune.trial.protocol import ScriptAnswer


def script_args_text(answer: ScriptAnswer | None, script: str | None = None,
                     script_args: Sequence[str] | None = None) -> str:
    """For a script that parses its arguments: the flags, on one line (nothing when the script's
    own settings won), then a comment with the whole command. Otherwise the keyword arguments,
    one `Where(name=value)` line per place in the code, as comments."""
    if answer is None:
        raise ConfigError("export --format args is for a study of a training script "
                          "(autotune run --script): this study has no answer in a script's "
                          "terms")
    if not answer.changes:
        return "# keep the script's own settings\n"
    if answer.on_command_line:
        flags = answer.flags()
        lines = [" ".join(flags)]
        if script is not None:
            kept = without(script_args or (), answer.changes.get("TrainingArguments", {}))
            lines.append(f"# the whole command: {' '.join(['python', script, *kept, *flags])}")
        return "\n".join(lines) + "\n"
    return "".join(f"# change in the code: {line}\n" for line in answer.keyword_lines())


def without(argv: Sequence[str], names: Iterable[str]) -> list[str]:
    """The script's arguments less the flags `names` (with their values), which the answer
    sets anew."""
    flags = {f"--{name}" for name in names}
    out: list[str] = []
    skipping = False
    for word in argv:
        if word.split("=", 1)[0] in flags:
            skipping = "=" not in word
            continue
        if skipping and not word.startswith("--"):
            skipping = False
            continue
        skipping = False
        out.append(word)
    return out
