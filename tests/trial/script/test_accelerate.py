"""An Accelerate script (in the style of Hugging Face's `*_no_trainer.py` examples) as a trial:
its first Accelerator makes it one, its own settings are read from that Accelerator and its
loop, the trial's knobs go through Accelerate's own settings, its steps are the optimizer steps
the accelerator really takes, nothing is tracked or saved where the user would find it, and the
answer names the script's flags, accelerate launch's and its lines."""

from __future__ import annotations

from pathlib import Path

import torch

from autotune.trial.script.hf_terms import checkpointing_field
from autotune.trial.script.session import ScriptBaseline
from autotune.trial.script.sources import Source
from autotune.trial.script.terms import answer, kept
from tests.conftest import need
from tests.trial.script.steps import run

need("accelerate", "examples")
need("transformers", "examples")

SCRIPT = "accelerate_clm.py"


def _argv(out: Path) -> list[str]:
    return ["--output_dir", str(out), "--checkpointing_steps", "1", "--with_tracking",
            "--report_to", "all"]


def test_its_own_settings_are_read_and_its_accumulated_steps_measured(tmp_path: Path) -> None:
    out = tmp_path / "user_out"
    result, observer = run(SCRIPT, _argv(out), tmp_path / "s", steps=4)
    own = result.baseline
    assert own.library == "accelerate" and observer.info.library == "accelerate"
    assert (own.knobs["micro_batch_size"], own.knobs["grad_accum_steps"]) == (4, 2)
    assert (own.knobs["precision"], own.knobs["compile_mode"]) == ("fp32", "none")
    # an optimizer step every 2 micro-batches (the accelerator's sync_gradients), clipped;
    # its prepared loader fetches a batch ahead, into the first step
    assert observer.samples[1:] == [8] * 3 and max(observer.grad_norms) <= 1.0 * 1.01
    assert all(torch.isfinite(x) for x in observer.losses)
    assert kept(own) == {}  # its batch and accumulation come from its own flags
    sources = own.sources["Accelerator"]
    assert Source.from_dict(sources["gradient_accumulation_steps"]).flag == \
        "--gradient_accumulation_steps"
    assert Source.from_dict(sources["mixed_precision"]).launcher == "--mixed_precision"
    assert Source.from_dict(own.sources["flags"]["micro_batch_size"]).flag == \
        "--per_device_train_batch_size"
    # it made its output_dir, saved its state every step and asked for trackers: nothing of it
    # where the user would find it
    assert not out.exists()


def test_the_trials_knobs_go_through_accelerates_own_settings(tmp_path: Path) -> None:
    out = tmp_path / "user_out"
    probed, _ = run(SCRIPT, _argv(out), tmp_path / "probe", steps=3)
    own = ScriptBaseline.from_dict(probed.baseline.to_dict())
    config = own.config("cpu").replace(micro_batch_size=8, grad_accum_steps=1,
                                       precision="bf16", optimizer_impl="fused",
                                       activation_checkpointing="full", num_workers=1)
    result, observer = run(SCRIPT, _argv(out), tmp_path / "s", config=config, own=own)
    assert observer.samples[1:] == [8] * 2
    assert observer.autocast == {torch.bfloat16}  # Accelerate's own autocast, bf16
    assert observer.info.optimizer.defaults["fused"]
    # the model's own switch, as the installed transformers names it
    field = checkpointing_field()
    assert getattr(observer.info.model, f"is_{field}")
    switch = "activation_checkpointing_enable(every_n_layers=1)" \
        if field == "activation_checkpointing" else "gradient_checkpointing_enable()"
    assert answer(config, own, "cpu").lines() == [
        "--per_device_train_batch_size 8 --gradient_accumulation_steps 1",
        "accelerate launch --mixed_precision bf16",
        f"accelerate_clm.py:64: after it: model.{switch}",
        "accelerate_clm.py:66: DataLoader(..., num_workers=1)",
        "accelerate_clm.py:78: torch.optim.AdamW(..., fused=True)"]
    assert not out.exists()
