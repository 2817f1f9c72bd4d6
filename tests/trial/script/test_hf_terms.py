"""A configuration in TrainingArguments' terms, what they cannot say, and the script's own
settings read from the TrainingArguments it built."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from packaging.version import Version
from torch import nn

from autotune.config import TrainConfig
from tests.conftest import need

need("transformers", "examples")

from transformers import TrainingArguments  # noqa: E402

from autotune.trial.script.hf_terms import (  # noqa: E402
    changed_arguments,
    checkpointing_field,
    checkpoints_every_n_layers,
    read_baseline,
    run_steps,
    training_arguments,
    unexpressed,
)

# the installed transformers' name for it: activation_checkpointing, or gradient_checkpointing
CHECKPOINTING = checkpointing_field()


def _args(tmp_path: Path, **fields) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, **fields)


def test_checkpointing_is_named_as_the_installed_transformers_names_it() -> None:
    """transformers 5.17 (the GPU machines' own) has only gradient_checkpointing; newer ones
    activation_checkpointing, with the old name a deprecated alias: reading or setting a field
    the installed release lacks fails every HF script before its training starts."""
    fields = set(TrainingArguments.__dataclass_fields__)
    assert CHECKPOINTING in fields and f"{CHECKPOINTING}_kwargs" in fields
    if "activation_checkpointing" in fields:
        assert CHECKPOINTING == "activation_checkpointing"


def test_the_baseline_is_what_the_trainingarguments_say(tmp_path: Path) -> None:
    args = _args(tmp_path, per_device_train_batch_size=16, gradient_accumulation_steps=4,
                 bf16=True, optim="adamw_torch", dataloader_num_workers=2,
                 **{CHECKPOINTING: True,
                    f"{CHECKPOINTING}_kwargs": {"every_n_layers": 2, "use_reentrant": False}})
    baseline = read_baseline(args, "cpu")
    assert baseline.config("cpu") == TrainConfig(
        micro_batch_size=16, grad_accum_steps=4, precision="bf16",
        activation_checkpointing="selective", optimizer_impl="for_loop", num_workers=2,
        prefetch_factor=None)
    assert baseline.fixed == {}


def test_settings_the_knobs_do_not_have_are_kept_and_said(tmp_path: Path) -> None:
    baseline = read_baseline(_args(tmp_path, optim="sgd"), "cpu", nn.Linear(2, 2))
    assert "'sgd' is none of the optimizers" in baseline.fixed["optimizer_impl"]
    assert f"no {CHECKPOINTING}_enable()" in baseline.fixed["activation_checkpointing"]
    config = baseline.config("cpu")
    assert [x.knob for x in unexpressed(config.replace(activation_checkpointing="full"),
                                        baseline, "cpu")] == ["activation_checkpointing"]
    assert unexpressed(config, baseline, "cpu") == []
    # what the script keeps is never overwritten, whatever the configuration's own value
    fields = training_arguments(config, baseline.settings["TrainingArguments"], baseline.fixed)
    assert "optim" not in fields and CHECKPOINTING not in fields


@pytest.mark.parametrize(("change", "expressible"), [
    ({"optimizer_impl": "for_loop"}, True),   # adamw_torch: PyTorch's default on the CPU
    ({"optimizer_impl": "foreach"}, False),   # no switch for it
    ({"optimizer": "adafactor", "optimizer_impl": "for_loop"}, True),
    ({"precision": "fp8_rowwise"}, False),
    ({"memory_format": "channels_last"}, False),
    ({"attention_backend": "math"}, False),
    # every other layer alone: where the installed transformers' models can (5.24, not 5.1)
    ({"activation_checkpointing": "selective"}, checkpoints_every_n_layers()),
    ({"compile_mode": "max-autotune"}, True),
])
def test_what_trainingarguments_can_say(tmp_path: Path, change: dict,
                                        expressible: bool) -> None:
    baseline = read_baseline(_args(tmp_path), "cpu")
    config = baseline.config("cpu").replace(**change)
    refused = unexpressed(config, baseline, "cpu")
    assert (refused == []) == expressible
    assert all(item.reason for item in refused)


def test_the_answer_is_the_fields_that_change(tmp_path: Path) -> None:
    args = _args(tmp_path, per_device_train_batch_size=8, optim="adamw_torch_fused", **{
        f"{CHECKPOINTING}_kwargs": {"use_reentrant": False}})
    baseline = read_baseline(args, "cpu")
    config = baseline.config("cpu").replace(
        micro_batch_size=16, grad_accum_steps=2, precision="bf16",
        activation_checkpointing="selective", optimizer_impl="for_loop",
        compile_mode="default")
    assert changed_arguments(config, baseline, "cpu") == {
        "per_device_train_batch_size": 16, "gradient_accumulation_steps": 2, "bf16": True,
        CHECKPOINTING: True,
        f"{CHECKPOINTING}_kwargs": {"use_reentrant": False, "every_n_layers": 2},
        "optim": "adamw_torch", "torch_compile": True}
    assert changed_arguments(baseline.config("cpu"), baseline, "cpu") == {}


def test_the_baseline_adamw_is_the_one_transformers_picks_for_this_torch(tmp_path: Path) -> None:
    """transformers 5 defaults optim to the fused AdamW on torch 2.8 and later, to adamw_torch
    (a for-loop on CPU) before: a script that leaves optim alone runs whichever, so that is
    its baseline, and a fused answer says --optim only where the default is not fused."""
    optim = _args(tmp_path).optim
    default = str(getattr(optim, "value", optim))
    fused = Version(torch.__version__.split("+")[0]) >= Version("2.8")
    assert default == ("adamw_torch_fused" if fused else "adamw_torch")
    baseline = read_baseline(_args(tmp_path), "cpu")
    assert baseline.knobs["optimizer_impl"] == ("fused" if fused else "for_loop")
    answer = changed_arguments(baseline.config("cpu").replace(optimizer_impl="fused"), baseline,
                               "cpu")
    assert answer == ({} if fused else {"optim": "adamw_torch_fused"})


def test_an_answer_in_code_names_the_scripts_own_arguments_class(tmp_path: Path) -> None:
    """A seq2seq script builds Seq2SeqTrainingArguments in its code: the line to change is
    that, not TrainingArguments."""
    from transformers import Seq2SeqTrainingArguments

    from autotune.trial.protocol import ScriptAnswer

    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True,
                                    per_device_train_batch_size=8)
    baseline = read_baseline(args, "cpu")
    assert baseline.arguments_class == "Seq2SeqTrainingArguments"
    changes = {"TrainingArguments": changed_arguments(
        baseline.config("cpu").replace(micro_batch_size=16), baseline, "cpu")}
    answer = ScriptAnswer("transformers", changes, None, baseline.arguments_class)
    assert answer.lines() == ["Seq2SeqTrainingArguments(per_device_train_batch_size=16)"]
    assert ScriptAnswer.from_json(asdict(answer)) == answer  # as a study stores it


def test_tf32_is_said_only_where_it_changes_something() -> None:
    tf32 = training_arguments(TrainConfig(precision="tf32"), {})
    assert tf32["tf32"] is True
    assert "tf32" not in training_arguments(TrainConfig(precision="fp32"), {})
    # IEEE fp32 where the script (or torch_compile) would turn TF32 on
    assert training_arguments(TrainConfig(precision="fp32"), {"tf32": True})["tf32"] is False
    assert training_arguments(TrainConfig(compile_mode="default"), {})["tf32"] is False
    assert "tf32" not in training_arguments(TrainConfig(precision="bf16"), {"tf32": True})


def test_an_answer_for_the_cpu_says_nothing_of_tf32(tmp_path: Path) -> None:
    """TF32 is a CUDA matmul mode: a compiled fp32 answer keeps IEEE fp32 on a GPU with
    `tf32=False`, and says nothing of it on the CPU it was measured on."""
    baseline = read_baseline(_args(tmp_path), "cpu")
    compiled = baseline.config("cpu").replace(compile_mode="default")
    assert changed_arguments(compiled, baseline, "cpu") == {"torch_compile": True}
    assert changed_arguments(compiled, baseline, "cuda") == {"torch_compile": True,
                                                             "tf32": False}


@pytest.mark.parametrize("given", [
    {"num_train_epochs": 3, "per_device_train_batch_size": 8},
    {"num_train_epochs": 2.5, "per_device_train_batch_size": 6, "gradient_accumulation_steps": 4},
    {"num_train_epochs": 1, "per_device_train_batch_size": 7, "dataloader_drop_last": True,
     "gradient_accumulation_steps": 2},
    {"max_steps": 17, "per_device_train_batch_size": 4}])
def test_the_scripts_run_is_counted_as_its_trainer_counts_it(tmp_path: Path,
                                                             given: dict) -> None:
    """The optimizer steps of the script's own run: the Trainer's own count (its epochs over
    its data's batches, a step per accumulation, or its max_steps)."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer

    data = [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}] * 53
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True,
                             **given)
    trainer = Trainer(model=GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2,
                                                       vocab_size=8, n_positions=4)),
                      args=args, train_dataset=data)
    *_, max_steps = trainer.set_initial_training_values(args, trainer.get_train_dataloader())
    assert run_steps(args, len(data)) == max_steps
