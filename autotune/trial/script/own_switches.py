"""A hand-written loop's own switches for what autotune would otherwise add around its model:
its AMP flag (timm's `--amp` with `--amp-dtype`, a `--bf16` switch) and its compile flag
(timm's `--torchcompile [BACKEND]` with `--torchcompile-mode`, a `--compile` switch),
recognised in its parser by their names.

Where the script has one and its user left it off, a trial sets it as the answer would: the
script's own autocast or torch.compile runs (its loss scaling, its compile of the whole
model), autotune adds none around the model, and the answer names the flag, so the user is
told to use the script's `--amp`, not to wrap its forward. Where the user turned it on,
the loop watch sees the script's own autocast or compile and the knob is the script's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.config import TrainConfig
from autotune.trial.protocol import EQUALS, NEGATABLE, SWITCH, VALUE
from autotune.trial.script.session import ScriptBaseline
from autotune.trial.script.sources import Flag, Source

# Where the answer says them: the script's own flags, by their role.
SWITCHES = "switches"
AMP, AMP_DTYPE, BF16, COMPILE, COMPILE_MODE = "amp", "amp_dtype", "bf16", "compile", "mode"
# Their names in a parser (argparse's dest), by role.
_NAMES = {AMP: ("amp", "use_amp"), AMP_DTYPE: ("amp_dtype",), BF16: ("bf16",),
          COMPILE: ("torchcompile", "torch_compile", "compile"),
          COMPILE_MODE: ("torchcompile_mode", "torch_compile_mode", "compile_mode")}
_BF16_NAMES = ("bfloat16", "bf16")
_SWITCH_FORMS = (SWITCH, NEGATABLE)
_VALUE_FORMS = (VALUE, EQUALS)  # `--amp-dtype bfloat16`, `--amp-dtype=bfloat16`


def read(flags: Mapping[str, Flag], baseline: ScriptBaseline) -> None:
    """The script's AMP and compile flags, where its parser has them and the knob is not the
    script's already (`baseline.fixed`): their own values and where each is said; compile
    modes the script has no flag for refused, with why."""
    found = {role: next((flags[n] for n in names if n in flags), None)
             for role, names in _NAMES.items()}
    own: dict[str, Any] = {}
    if "precision" not in baseline.fixed:
        bf16, amp, dtype = found[BF16], found[AMP], found[AMP_DTYPE]
        if bf16 is not None and bf16.form in _SWITCH_FORMS:
            own[BF16] = _said(baseline, BF16, bf16)
        elif amp is not None and amp.form in _SWITCH_FORMS and dtype is not None and \
                dtype.form in _VALUE_FORMS and _bf16_value(dtype) is not None:
            own[AMP] = _said(baseline, AMP, amp)
            own[AMP_DTYPE] = _said(baseline, AMP_DTYPE, dtype, _bf16_value(dtype))
    switch = found[COMPILE]
    if "compile_mode" not in baseline.fixed and switch is not None and not switch.value:
        own[COMPILE] = _said(baseline, COMPILE, switch)
        mode = found[COMPILE_MODE]
        if mode is not None and mode.form in _VALUE_FORMS:
            own[COMPILE_MODE] = _said(baseline, COMPILE_MODE, mode)
        else:
            for value in ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
                baseline.refused.setdefault("compile_mode", {})[value] = (
                    f"the script's {switch.option} compiles in torch.compile's default mode, "
                    "and it has no flag for another")
    if own:
        baseline.settings[SWITCHES] = own


def expresses(own: ScriptBaseline, knob: str) -> bool:
    """Whether the script's own switch says `knob` ("precision", "compile_mode"): autotune
    then adds nothing of its own for it around the model."""
    said = own.sources.get(SWITCHES, {})
    return bool(said.keys() & ({AMP, BF16} if knob == "precision" else {COMPILE}))


def values(config: TrainConfig, own: ScriptBaseline) -> dict[str, Any]:
    """The script's switches set as `config` asks (its own values where it asks nothing)."""
    out = dict(own.settings.get(SWITCHES, {}))
    sources = own.sources.get(SWITCHES, {})
    if BF16 in out:
        out[BF16] = config.precision == "bf16"
    elif AMP in out and config.precision == "bf16":
        out[AMP], out[AMP_DTYPE] = sources[AMP].get("const", True), sources[AMP_DTYPE]["const"]
    if COMPILE in out and config.compile_mode != "none":
        const = sources[COMPILE].get("const")
        form = sources[COMPILE].get("form", VALUE)
        out[COMPILE] = const if form == SWITCH else True if form == NEGATABLE else \
            const or "inductor"
        default = config.compile_mode == "default" and out.get(COMPILE_MODE) in (None, "default")
        if COMPILE_MODE in out and not default:
            out[COMPILE_MODE] = config.compile_mode
    return out


def _said(baseline: ScriptBaseline, role: str, flag: Flag, on: Any = None) -> Any:
    """Record where `role` is said (the flag, as the user writes it, with the value that turns
    it on: a switch's const, a dtype flag's spelling of bf16) and give its own value."""
    source = Source(flag=flag.option, form=flag.form, const=flag.const if on is None else on,
                    aliases=flag.aliases)
    baseline.said(SWITCHES, role, source)
    return flag.value


def _bf16_value(dtype: Flag) -> str | None:
    """How the dtype flag spells bf16: among its choices, or torch's name where it has none."""
    if not dtype.choices:
        return "bfloat16"
    return next((str(c) for c in dtype.choices if str(c) in _BF16_NAMES), None)
