"""`export --format args`: a script study's answer as its user applies it, the flags to add to
the script's command line or the keyword arguments to change in its code."""

from __future__ import annotations

import pytest

from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.show.export import export_config
from autotune.show.export.script_args import script_args_text, without
from autotune.target import ModelFile, Script
from autotune.trial.protocol import SWITCH, CodeChange, Measurement, ScriptAnswer, ScriptFlag

CHANGES = {"TrainingArguments": {"per_device_train_batch_size": 16, "bf16": True,
                                 "optim": "adamw_torch_fused", "tf32": False}}


def test_a_script_that_parses_its_arguments_gets_the_flags_to_add() -> None:
    answer = ScriptAnswer("transformers", CHANGES, "parse_args_into_dataclasses")
    text = script_args_text(answer, Script("train.py", ("--output_dir", "out",
                                                        "--per_device_train_batch_size", "4")))
    assert text.splitlines() == [
        "--per_device_train_batch_size 16 --bf16 --optim adamw_torch_fused --tf32 False",
        "# the whole command: python train.py --output_dir out --per_device_train_batch_size "
        "16 --bf16 --optim adamw_torch_fused --tf32 False"]


def test_settings_in_code_get_the_keyword_arguments_to_change() -> None:
    answer = ScriptAnswer("lightning", {"Trainer": {"precision": "bf16-mixed"},
                                       "DataModule": {"batch_size": 32}})
    assert script_args_text(answer) == ("# change in the code: Trainer(precision='bf16-mixed')\n"
                                        "# change in the code: DataModule(batch_size=32)\n")
    assert answer.lines() == ["Trainer(precision='bf16-mixed')", "DataModule(batch_size=32)"]


def test_the_scripts_own_settings_kept() -> None:
    for parsed_by in ("parse_args_into_dataclasses", None):
        answer = ScriptAnswer("transformers", {}, parsed_by)
        assert script_args_text(answer, Script("train.py")) == \
            "# keep the script's own settings\n"
        assert answer.lines() == []


def test_a_model_files_study_has_no_args_to_export() -> None:
    with pytest.raises(ConfigError, match="export --format args is for a study of a training "
                                          "script"):
        export_config(TrainConfig(), "args")


def test_a_script_studys_export_knows_its_target_is_a_script() -> None:
    """The whole command is the script's with its own arguments; a torch script written for
    a script study has the model to fill in, never the training script as a model file."""
    script = Script("/w/train.py", ("--output_dir", "out"))
    answer = ScriptAnswer("transformers", CHANGES, "parse_args_into_dataclasses")
    text = export_config(TrainConfig(), "args", target=script, script_answer=answer)
    assert "# the whole command: python /w/train.py --output_dir out " in text
    torch_text = export_config(TrainConfig(), "torch", target=script, device="cpu")
    assert "train.py" not in torch_text and "def build_model" in torch_text
    model = export_config(TrainConfig(), "torch", target=ModelFile("/w/m.py"), device="cpu")
    assert 'MODEL_PATH = "/w/m.py"' in model


def test_the_flags_the_answer_sets_leave_the_command() -> None:
    assert without(["--a", "1", "--bf16", "--b=2", "--c", "3"], ["a", "bf16", "b"]) == \
        ["--c", "3"]


def test_the_answer_travels_in_the_measurement() -> None:
    answer = ScriptAnswer("transformers", CHANGES, "parse_args_into_dataclasses")
    figures = Measurement(samples_per_sec=1.0, script_answer=answer)
    assert Measurement.from_json(figures.to_json()) == figures
    assert Measurement.from_json(Measurement(samples_per_sec=1.0).to_json()).script_answer \
        is None


ROUTED = ScriptAnswer(
    "accelerate", {"flags": {"micro_batch_size": 8}, "Accelerator": {"mixed_precision": "bf16"},
                   "DataLoader": {"num_workers": 2}, "model": {"compile": "default"}},
    routed=True, script_flags=(ScriptFlag("--batch_size", 8), ScriptFlag("--bf16", True,
                                                                          SWITCH, True)),
    launcher="accelerate launch", launcher_flags=(ScriptFlag("--mixed_precision", "bf16"),),
    code=(CodeChange("train.py", 71, "DataLoader", {"num_workers": 2}),
          CodeChange("train.py", 52, text="after it: model.forward = "
                                          "torch.compile(model.forward)")))


def test_an_answer_at_the_scripts_own_flags_launcher_and_lines() -> None:
    text = script_args_text(ROUTED, Script("train.py", ("--batch_size", "4", "--out", "o")))
    assert text.splitlines() == [
        "--batch_size 8 --bf16",
        "# the whole command: accelerate launch --mixed_precision bf16 train.py --out o "
        "--batch_size 8 --bf16",
        "# change in the code: train.py:71: DataLoader(..., num_workers=2)",
        "# change in the code: train.py:52: after it: model.forward = "
        "torch.compile(model.forward)"]
    assert ROUTED.lines() == [
        "--batch_size 8 --bf16", "accelerate launch --mixed_precision bf16",
        "train.py:71: DataLoader(..., num_workers=2)",
        "train.py:52: after it: model.forward = torch.compile(model.forward)"]
    assert ROUTED.flags() == ["--batch_size", "8", "--bf16"]


def test_a_routed_answer_travels_in_the_measurement_and_an_old_one_reads_as_before() -> None:
    figures = Measurement(samples_per_sec=1.0, script_answer=ROUTED)
    assert Measurement.from_json(figures.to_json()) == figures
    old = {"library": "lightning", "changes": {"Trainer": {"precision": "bf16-mixed"}},
           "parsed_by": None}
    assert ScriptAnswer.from_json(old).lines() == ["Trainer(precision='bf16-mixed')"]
