"""Left-out values and the answer, whichever library the script trains with."""

from __future__ import annotations

from autotune.trial.protocol import LeftOut
from autotune.trial.script.session import ScriptBaseline
from autotune.trial.script.sources import Source
from autotune.trial.script.terms import answer, changes, left_out


def test_every_value_the_library_cannot_be_told_is_left_out_with_its_reason() -> None:
    baseline = ScriptBaseline("transformers", knobs={"micro_batch_size": 8,
                                                     "optimizer_impl": "fused"})
    domains = {"optimizer_impl": ("for_loop", "foreach", "fused"),
               "memory_format": ("contiguous", "channels_last"),
               "micro_batch_size": (4, 8, 16)}
    found = left_out(baseline, domains, "cpu")
    assert [(x.knob, x.value) for x in found] == [("optimizer_impl", "foreach"),
                                                  ("memory_format", "channels_last")]
    assert all(isinstance(x, LeftOut) and x.reason for x in found)


def test_a_knob_the_script_keeps_leaves_out_every_other_value() -> None:
    baseline = ScriptBaseline("lightning", knobs={"micro_batch_size": 10},
                              fixed={"micro_batch_size": "no batch_size attribute"})
    found = left_out(baseline, {"micro_batch_size": (4, 10, 16)}, "cpu")
    assert [(x.value, x.reason) for x in found] == [(4, "no batch_size attribute"),
                                                    (16, "no batch_size attribute")]


def test_worker_settings_a_script_without_workers_cannot_be_told_are_left_out() -> None:
    """A Lightning script whose DataModule has a num_workers attribute but none for prefetch
    or persistence: with workers its loader prefetches the DataLoader's default 2 and keeps
    no workers; other values would cost trials the script refuses (the bar's Lightning
    study lost one of its five to prefetch_factor=4)."""
    baseline = ScriptBaseline("lightning", knobs={"num_workers": 0},
                              fixed={"prefetch_factor": "no prefetch_factor attribute",
                                     "persistent_workers": "no persistent_workers attribute"})
    found = left_out(baseline, {"prefetch_factor": (2, 4), "persistent_workers": (False, True)},
                     "cpu")
    assert [(x.knob, x.value) for x in found] == [("prefetch_factor", 4),
                                                  ("persistent_workers", True)]


def test_the_answer_in_the_scripts_own_terms() -> None:
    baseline = ScriptBaseline("transformers", knobs={"micro_batch_size": 8}, settings={
        "TrainingArguments": {"per_device_train_batch_size": 8, "tf32": None}})
    config = baseline.config("cpu").replace(micro_batch_size=16)
    assert changes(config, baseline, "cpu") == {
        "TrainingArguments": {"per_device_train_batch_size": 16}}
    assert changes(baseline.config("cpu"), baseline, "cpu") == {}
    assert ScriptBaseline.from_dict(baseline.to_dict()) == baseline


def test_each_change_is_routed_to_the_scripts_flag_the_launcher_or_its_line() -> None:
    """Where the probe found each setting said: a flag of the script's, accelerate launch's,
    the line of the call (its other keywords at the same line), or nowhere (the library's
    setting alone, as answers always named it)."""
    baseline = ScriptBaseline("transformers", knobs={"micro_batch_size": 8,
                                                     "grad_accum_steps": 2}, settings={
        "TrainingArguments": {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2,
                              "bf16": False, "tf32": None}})
    baseline.said("TrainingArguments", "", Source(file="train.py", line=40,
                                                  call="TrainingArguments"))
    baseline.said("TrainingArguments", "per_device_train_batch_size", Source(flag="--bs"))
    config = baseline.config("cpu").replace(micro_batch_size=16, grad_accum_steps=1,
                                            precision="bf16")
    routed = answer(config, baseline, "cpu")
    assert routed.routed and routed.flags() == ["--bs", "16"]
    assert routed.lines() == [
        "--bs 16", "train.py:40: TrainingArguments(..., gradient_accumulation_steps=1, "
        "bf16=True)"]
    baseline.sources.clear()
    assert answer(config, baseline, "cpu").lines() == [
        "TrainingArguments(per_device_train_batch_size=16, gradient_accumulation_steps=1, "
        "bf16=True)"]
    parsed = ScriptBaseline.from_dict({**baseline.to_dict(),
                                       "parsed_by": "parse_args_into_dataclasses"})
    assert not answer(config, parsed, "cpu").routed  # HfArgumentParser's flags, as always
