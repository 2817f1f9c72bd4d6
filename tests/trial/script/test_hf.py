"""A Hugging Face training script run as a trial: its own settings read, the trial's applied
through TrainingArguments, its own loop measured and stopped, nothing it would write written."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from autotune.config import TrainConfig
from autotune.trial.script.errors import WrongDevice
from autotune.trial.training import Unsupported
from tests.conftest import need
from tests.trial.script.steps import run

need("transformers", "examples")


def _parser_args(output_dir: Path, *extra: str) -> list[str]:
    return ["--output_dir", str(output_dir), "--per_device_train_batch_size", "4",
            "--gradient_accumulation_steps", "2", "--num_train_epochs", "100", *extra]


def test_the_baseline_is_read_from_the_command_line_and_the_run_ends_when_measured(
        tmp_path: Path) -> None:
    user_dir = tmp_path / "user_output"
    result, observer = run("hf_argparser.py", _parser_args(user_dir, "--save_steps", "1"),
                           tmp_path / "scratch")
    baseline = result.baseline
    assert baseline.parsed_by == "parse_args_into_dataclasses"
    assert baseline.knobs["micro_batch_size"] == 4 and baseline.knobs["grad_accum_steps"] == 2
    assert baseline.config("cpu").effective_batch_size == 8
    assert baseline.settings["TrainingArguments"]["per_device_train_batch_size"] == 4
    # the script asked for 100 epochs; the observer's stop after 3 steps ended it, and nothing
    # after trainer.train() ran (save_model, the marker file)
    assert observer.samples == [8, 8, 8] and result.steps == 3 and result.stopped_by_observer
    assert observer.ended and all(torch.isfinite(loss) for loss in observer.losses)
    assert result.startup_s > 0 and observer.info.startup_s == result.startup_s
    assert not user_dir.exists()


def test_the_baseline_is_read_from_arguments_written_in_the_code(tmp_path: Path) -> None:
    user_dir = tmp_path / "user_output"
    result, observer = run("hf_in_code.py", ["--output-dir", str(user_dir)], tmp_path / "s")
    assert result.baseline.parsed_by is None
    assert result.baseline.knobs["micro_batch_size"] == 4
    assert result.baseline.knobs["grad_accum_steps"] == 2
    # save_steps=1 and logging_steps=1 in the script: still nothing under its output_dir, and
    # neither trainer.save_model() nor trainer.evaluate() after training ran
    assert observer.samples == [8, 8, 8] and not user_dir.exists()


def test_a_configuration_reaches_the_trainer(tmp_path: Path) -> None:
    config = TrainConfig(micro_batch_size=2, grad_accum_steps=3, precision="bf16",
                         optimizer_impl="for_loop", activation_checkpointing="selective")
    result, observer = run("hf_argparser.py", _parser_args(tmp_path / "out"), tmp_path / "s",
                           config=config)
    # seen from inside the run: the batches' rows, the autocast the model ran under, the
    # optimizer Trainer built
    assert observer.samples == [6, 6, 6]
    assert observer.autocast == {torch.bfloat16}
    assert not observer.info.optimizer.defaults["fused"]
    # every other block checkpointed: TrainingArguments' every_n_layers=2
    assert [block.gradient_checkpointing for block in observer.info.model.transformer.h] == \
        [True, False]
    assert (observer.info.micro_batch_size, observer.info.grad_accum_steps) == (2, 3)
    applied = result.settings["TrainingArguments"]
    assert applied["optim"] == "adamw_torch" and applied["bf16"] is True
    assert result.baseline.knobs["micro_batch_size"] == 4  # the script's own, still


def test_each_measured_step_runs_the_trainers_own_gradient_clipping(tmp_path: Path) -> None:
    clipped = run("hf_argparser.py", _parser_args(tmp_path / "a", "--max_grad_norm", "0.001"),
                  tmp_path / "s1")[1]
    assert len(clipped.grad_norms) == 3
    assert max(clipped.grad_norms) <= 0.001 * 1.01
    # the same steps without the script's clipping: a loop that skipped it would look so
    unclipped = run("hf_argparser.py", _parser_args(tmp_path / "b", "--max_grad_norm", "0"),
                    tmp_path / "s2")[1]
    assert min(unclipped.grad_norms) > 0.01


def test_a_knob_value_trainingarguments_cannot_say_is_unsupported(tmp_path: Path) -> None:
    config = TrainConfig(micro_batch_size=4, grad_accum_steps=2, optimizer_impl="foreach")
    with pytest.raises(Unsupported, match="adamw_torch is") as caught:
        run("hf_argparser.py", _parser_args(tmp_path / "out"), tmp_path / "s", config=config)
    assert (caught.value.knob, caught.value.value) == ("optimizer_impl", "foreach")


SUBCLASS = '''
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

class MyTrainer(Trainer):
    """Like TRL's trainers: its own __init__ over Trainer's."""
    def __init__(self, model, args, dataset):
        super().__init__(model, args, train_dataset=dataset)

ids = torch.randint(128, (32, 8))
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=128,
                                   n_positions=8))
# tensorboard is not installed: a Trainer reporting to it would fail before training
args = TrainingArguments(output_dir=OUT, per_device_train_batch_size=2, report_to="tensorboard",
                         logging_steps=1)
MyTrainer(model, args, [{"input_ids": r, "labels": r} for r in ids]).train()
'''


def test_a_trainer_subclass_is_measured_and_reports_to_no_tracker(tmp_path: Path) -> None:
    user_dir = tmp_path / "user_output"
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SUBCLASS).replace("OUT", repr(str(user_dir))))
    result, observer = run(script, [], tmp_path / "scratch", steps=2)
    assert observer.samples == [2, 2] and result.baseline.knobs["micro_batch_size"] == 2
    assert not user_dir.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_script_that_trains_on_another_device_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WrongDevice, match="hf_argparser.py trains on cpu, but autotune was "
                                          "asked to measure on cuda"):
        run("hf_argparser.py", _parser_args(tmp_path / "out"), tmp_path / "s", device="cuda")


def test_settings_from_the_scripts_own_flags_are_answered_as_those_flags(
        tmp_path: Path) -> None:
    """An HF script with argparse flags of its own passed into TrainingArguments: its trials
    set those flags, and the answer names them (`--batch_size 16 --accum 1`), the rest at the
    TrainingArguments line."""
    from autotune.trial.script.session import ScriptBaseline
    from autotune.trial.script.terms import answer

    argv = ["--output_dir", str(tmp_path / "out"), "--batch_size", "8", "--accum", "2"]
    probed, _ = run("hf_own_flags.py", argv, tmp_path / "probe")
    own = ScriptBaseline.from_dict(probed.baseline.to_dict())
    config = own.config("cpu").replace(micro_batch_size=16, grad_accum_steps=1,
                                       precision="bf16")
    result, observer = run("hf_own_flags.py", argv, tmp_path / "s", config=config, own=own)
    assert observer.samples == [16] * 3 and observer.autocast == {torch.bfloat16}
    assert answer(config, own, "cpu").lines() == [
        "--batch_size 16 --accum 1", "hf_own_flags.py:22: TrainingArguments(..., bf16=True)"]
    assert not (tmp_path / "out").exists()
