"""The `args` export: a script study's answer in the script's own terms, as the user applies
it: the flags to add to its command line (HfArgumentParser's, or the script's own flags its
settings come from), accelerate launch's, and the lines of its code to change or add."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from autotune.errors import ConfigError
from autotune.target import Script
from autotune.trial.protocol import ScriptAnswer, without_flag


def script_args_text(answer: ScriptAnswer | None, script: Script | None = None) -> str:
    """The flags to add to the script's command line on one line (nothing when the script's
    own settings won), then a comment with the whole command (under `accelerate launch` with
    its flags, where the answer sets them); then, as comments, each line of the code to change
    or add (the whole command only where the `script` and its arguments are known)."""
    if answer is None:
        raise ConfigError("export --format args is for a study of a training script "
                          "(autotune run --script): this study has no answer in a script's "
                          "terms")
    if not answer.changes:
        return "# keep the script's own settings\n"
    lines = []
    flags, launcher = answer.flags(), answer.launcher_words()
    if flags:
        lines.append(" ".join(flags))
    if (flags or launcher) and script is not None:
        kept = without(script.args, answer.changes.get("TrainingArguments", {})) \
            if answer.on_command_line else list(script.args)
        for flag in answer.script_flags:
            kept = without_flag(kept, flag.flag, flag.form, flag.aliases)
        start = launcher or ["python"]
        lines.append(f"# the whole command: {' '.join([*start, script.path, *kept, *flags])}")
    lines += [f"# change in the code: {line}" for line in answer.code_lines()]
    return "\n".join(lines) + "\n"


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
