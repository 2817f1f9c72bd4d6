"""A hand-written training loop as a trial: measured where its optimizer steps (its own
accumulation, clipping and schedule in each step), its own settings read from what it built and
ran, the trial's knobs applied without changing what it computes (its batch through its own
flags, the rest where it builds its loader, optimizer and model), nothing it writes reaching
the user's files, and the answer at its own flags and lines."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from autotune.config import TrainConfig
from autotune.trial.script.errors import NeverTrained, ScriptError
from autotune.trial.script.session import ScriptBaseline
from autotune.trial.script.terms import answer, kept, left_out
from autotune.trial.training import Unsupported
from tests.conftest import need
from tests.trial.script.steps import run

NANOGPT = "loop_nanogpt.py"
FACTORY = "loop_optimizer_factory.py"
TIMM_STYLE = "loop_timm_style.py"
NAMED = {"micro_batch_size": "--batch_size", "grad_accum_steps": "--gradient_accumulation_steps"}


def _probe(script: str, argv: list[str], scratch: Path,
           flag_map: dict[str, str] | None = None) -> ScriptBaseline:
    """The script's own settings as its probe reads them (checks included)."""
    result, _ = run(script, argv, scratch, steps=3, flag_map=flag_map,
                    candidates={"activation_checkpointing": ["full"], "precision": ["bf16"]})
    return ScriptBaseline.from_dict(result.baseline.to_dict())


def test_a_hand_written_loop_is_measured_where_its_optimizer_steps(tmp_path: Path) -> None:
    out = tmp_path / "user_out"
    result, observer = run(NANOGPT, ["--out_dir", str(out), "--grad_clip", "0.001",
                                     "--eval_interval", "2"], tmp_path / "s", steps=5)
    own = result.baseline
    assert own.library == "loop" and observer.info.library == "loop"
    assert (own.knobs["micro_batch_size"], own.knobs["grad_accum_steps"]) == (8, 2)
    assert (own.knobs["precision"], own.knobs["optimizer_impl"]) == ("fp32", "for_loop")
    # each step: 2 micro-batches of 8 sequences, its loss, the loop's own clipping and its
    # learning rate set by hand (rising through the warm-up)
    assert observer.samples == [16] * 5 and all(torch.isfinite(x) for x in observer.losses)
    assert max(observer.grad_norms) <= 0.001 * 1.01
    assert observer.lrs == sorted(observer.lrs) and len(set(observer.lrs)) == 5
    assert result.stopped_by_observer and result.steps == 5 and observer.ended
    assert result.startup_s > 0
    # it made its out_dir and saved checkpoints every 2 steps: none in the user's folder
    assert not out.exists()
    # its micro-batch and accumulation are its own arithmetic, with no flag named for them
    assert set(kept(own)) == {"micro_batch_size", "grad_accum_steps"}
    assert "--arg micro_batch_size=--FLAG" in kept(own)["micro_batch_size"]


def test_a_configuration_reaches_the_loop_and_the_answer_names_its_flags_and_lines(
        tmp_path: Path) -> None:
    argv = ["--out_dir", str(tmp_path / "out")]
    own = _probe(NANOGPT, argv, tmp_path / "probe", NAMED)
    assert kept(own) == {} and own.refused == {}
    config = own.config("cpu").replace(micro_batch_size=4, grad_accum_steps=4, precision="bf16",
                                       optimizer_impl="fused", activation_checkpointing="full")
    result, observer = run(NANOGPT, argv, tmp_path / "s", config=config, own=own,
                           flag_map=NAMED)
    assert observer.samples == [16] * 3  # 4 micro-batches of 4, through its own flags
    assert observer.autocast == {torch.bfloat16}
    assert observer.info.optimizer.defaults["fused"]
    # its param groups kept (weight decay on the matrices only)
    assert [g["weight_decay"] for g in observer.info.optimizer.param_groups] == [0.1, 0.0]
    assert all("forward" in vars(block) for block in observer.info.model.h)  # checkpointed
    lines = answer(config, own, "cpu").lines()
    assert lines == [
        "--batch_size 4 --gradient_accumulation_steps 4",
        "loop_nanogpt.py:132: wrap model(...) in with torch.autocast('cpu', "
        "dtype=torch.bfloat16):",
        "loop_nanogpt.py:101: after it: from autotune import apply_activation_checkpointing; "
        "apply_activation_checkpointing(model, 'full')",
        "loop_nanogpt.py:98: torch.optim.AdamW(..., fused=True)"]
    assert not (tmp_path / "out").exists()


def test_a_named_flag_that_does_not_set_the_batch_is_unsupported(tmp_path: Path) -> None:
    argv = ["--out_dir", str(tmp_path / "out")]
    named = {"micro_batch_size": "--n_embd"}  # a flag of the script's, but not its batch
    own = _probe(NANOGPT, argv, tmp_path / "probe", named)
    config = own.config("cpu").replace(micro_batch_size=16, grad_accum_steps=1)
    with pytest.raises(Unsupported, match="with the script's flags set so, its loop ran 16 "
                                          "samples in 2 backward passes"):
        run(NANOGPT, argv, tmp_path / "s", config=config, own=own, flag_map=named)


def test_a_named_flag_the_scripts_parser_does_not_have_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match="--arg micro_batch_size=--bs: the script's parser "
                                          "has no --bs"):
        _probe(NANOGPT, ["--out_dir", str(tmp_path / "out")], tmp_path / "p",
               {"micro_batch_size": "--bs"})


def test_loader_settings_go_to_the_loader_the_loop_trains_from(tmp_path: Path) -> None:
    out = tmp_path / "user_out"
    argv = ["--out", str(out), "--batch_size", "32"]
    own = _probe("loop_dataloader.py", argv, tmp_path / "probe")
    assert own.knobs["micro_batch_size"] == 32 and own.knobs["num_workers"] == 0
    assert "micro_batch_size" not in kept(own)  # its DataLoader's batch_size is --batch_size
    config = own.config("cpu").replace(num_workers=1, micro_batch_size=64, grad_accum_steps=1)
    with pytest.raises(Unsupported):  # accumulation is the loop's own: no flag sets it
        run("loop_dataloader.py", argv, tmp_path / "x", config=config.replace(
            micro_batch_size=16, grad_accum_steps=2), own=own)
    scratch = tmp_path / "s"
    result, observer = run("loop_dataloader.py", argv, scratch, config=config, own=own)
    assert observer.samples == [64] * 3 and observer.lrs[0] > observer.lrs[-1]  # its schedule
    written = scratch / "elsewhere" / out.resolve().relative_to("/") / "loaders.json"
    assert json.loads(written.read_text()) == {"train": 1, "eval": 0}
    assert not out.exists()
    assert answer(config, own, "cpu").lines() == [
        "--batch_size 64", "loop_dataloader.py:26: DataLoader(..., num_workers=1)"]


def test_values_the_loop_cannot_be_told_are_left_out_with_why(tmp_path: Path) -> None:
    own = _probe(NANOGPT, ["--out_dir", str(tmp_path / "out")], tmp_path / "probe")
    found = {(x.knob, x.value): x.reason for x in left_out(own, {
        "precision": ("bf16", "fp16"), "num_workers": (0, 2), "optimizer": ("adafactor",),
        "memory_format": ("channels_last",)}, "cpu")}
    assert set(found) == {("precision", "fp16"), ("num_workers", 2), ("optimizer", "adafactor"),
                          ("memory_format", "channels_last")}
    assert "GradScaler" in found["precision", "fp16"]
    assert "without a torch DataLoader" in found["num_workers", 2]


def test_a_script_that_builds_an_optimizer_and_never_steps_it_is_told_so(
        tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent('''
        import torch
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(2, 4)).sum().backward()
        '''))
    with pytest.raises(NeverTrained, match="ended without Trainer.train, Trainer.fit or a "
                                           "torch.optim optimizer's first step"):
        run(script, [], tmp_path / "s")


def test_an_optimizer_a_library_builds_from_parameter_groups_is_the_loops(
        tmp_path: Path) -> None:
    """timm's create_optimizer_v2, LightningCLI's instantiate_class: the script's parameter
    groups go to a library's function, which builds the torch optimizer. The loop is still
    found from its steps and the model among the script's variables; the foreach/fused knob,
    which autotune sets where the script builds an AdamW, is left out with why."""
    for opt in ("SGD", "AdamW"):
        result, observer = run(FACTORY, ["--opt", f"torch.optim.{opt}"], tmp_path / opt,
                               steps=3)
        own = result.baseline
        assert own.library == "loop" and observer.samples == [16] * 3
        assert own.knobs["micro_batch_size"] == 16 and own.knobs["precision"] == "fp32"
        assert own.sources["flags"]["micro_batch_size"]["flag"] == "--batch-size"
        assert {"precision", "compile_mode"}.isdisjoint(own.fixed), "the model was found"
        assert own.fixed["optimizer_impl"].startswith(
            f"the loop steps the {opt} that instantiate_class built; autotune sets the "
            "implementation (foreach/fused)")


def test_a_short_option_named_for_the_batch_sets_it_however_the_command_line_wrote_it(
        tmp_path: Path) -> None:
    """`--arg micro_batch_size=-b` for a script run with `--batch-size 8`: the trial's
    micro-batch replaces it as `-b`."""
    argv, named = ["--batch-size", "8"], {"micro_batch_size": "-b"}
    own = _probe(FACTORY, argv, tmp_path / "probe", named)
    assert own.knobs["micro_batch_size"] == 8
    assert own.sources["flags"]["micro_batch_size"]["flag"] == "-b"
    config = own.config("cpu").replace(micro_batch_size=32)
    _, observer = run(FACTORY, argv, tmp_path / "trial", config=config, own=own, flag_map=named)
    assert observer.samples == [32] * 3


def test_a_loop_that_trains_without_a_torch_optimizer_is_told_what_the_probe_saw(
        tmp_path: Path) -> None:
    """A loop that steps its parameters by hand trains, and autotune cannot attach to it: the
    message says so, with what the probe saw, not that it never reached its training."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent('''
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=16)
        model = torch.nn.Linear(4, 1)
        for x, y in loader:
            torch.nn.functional.mse_loss(model(x), y).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None
        '''))
    with pytest.raises(NeverTrained, match=r"^train.py ran \d+ s and trained, but autotune could "
                                           r"not attach to its loop \(it saw 1 DataLoader built "
                                           r"\(train.py:4, batch_size 16\); 4 forward passes "
                                           r"with gradients on; 4 backward passes\): "):
        run(script, [], tmp_path / "s")


def test_a_loop_whose_training_ends_before_the_measurement_is_still_read(
        tmp_path: Path) -> None:
    result, observer = run(NANOGPT, ["--out_dir", str(tmp_path / "o"), "--max_iters", "2"],
                           tmp_path / "s", steps=5)
    assert observer.samples == [16, 16] and not result.stopped_by_observer and observer.ended
    assert result.baseline.knobs["micro_batch_size"] == 8


def test_a_configuration_a_loop_cannot_take_is_refused_as_the_trials(tmp_path: Path) -> None:
    own = ScriptBaseline("loop", knobs={"micro_batch_size": 8, "grad_accum_steps": 2},
                         fixed={"precision": "its own autocast"})
    config = TrainConfig(micro_batch_size=8, grad_accum_steps=2, precision="bf16")
    assert [x.knob for x in left_out(own, {"precision": ("bf16",)}, "cpu")] == ["precision"]
    assert answer(config, own, "cpu").changes == {}  # nothing the loop can be told changes


STATEFUL = '''
import torch
from torch import nn

class Counting(nn.Module):
    """A block whose output depends on how often it ran: recomputing it changes it."""
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return torch.relu(self.linear(x)) * (1 + 0.5 * (self.calls % 2))

model = nn.Sequential(*(Counting() for _ in range(3)))
optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
for _ in range(1000):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
'''


def test_the_probe_refuses_checkpointing_that_changes_what_the_loop_learns(
        tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(STATEFUL).replace("LR", "1e-3"))
    own = _probe(str(script), [], tmp_path / "probe")
    assert "changes what this model learns" in own.refused["activation_checkpointing"]["full"]
    found = left_out(own, {"activation_checkpointing": ("none", "full")}, "cpu")
    assert [(x.knob, x.value) for x in found] == [("activation_checkpointing", "full")]


def test_a_loop_whose_loss_goes_non_finite_is_measured_so(tmp_path: Path) -> None:
    from autotune.options import MeasureSettings
    from autotune.target import Script
    from autotune.trial.protocol import TrialRequest
    from autotune.trial.script.job import script_job

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(STATEFUL).replace("LR", "1e30"))
    request = TrialRequest(Script(str(script)), config={"micro_batch_size": 4}, device="cpu",
                           settings=MeasureSettings(window_steps=2, window_seconds=0.0,
                                                    screen_steps=0, warmup_max_steps=2,
                                                    profile_steps=0))
    _, figures = script_job(request, request.target, torch.device("cpu"), 1,
                            lambda phase: None)
    assert figures.loss_finite is False


def test_a_scripts_own_amp_and_compile_flags_say_those_knobs(tmp_path: Path) -> None:
    """A script with its own AMP and compile flags (timm's `--amp --amp-dtype`,
    `--torchcompile`), its model made by a library's factory: a bf16 trial sets the script's
    `--amp`, its own autocast runs and autotune wraps nothing around the model; the answer
    names the script's flags, with no line to add."""
    need("transformers", "examples")
    argv = ["--output", str(tmp_path / "out")]
    own = _probe(TIMM_STYLE, argv, tmp_path / "probe", {"micro_batch_size": "--batch-size"})
    assert own.knobs["precision"] == "fp32" and "precision" not in own.fixed
    config = own.config("cpu")
    assert answer(config.replace(precision="bf16", compile_mode="default"), own,
                  "cpu").lines() == ["--amp --amp-dtype bfloat16 --torchcompile inductor"]
    assert answer(config.replace(compile_mode="max-autotune"), own, "cpu").lines() == [
        "--torchcompile inductor --torchcompile-mode max-autotune"]
    result, observer = run(TIMM_STYLE, argv, tmp_path / "s", config=config.replace(
        precision="bf16"), own=own, flag_map={"micro_batch_size": "--batch-size"})
    model = observer.info.model
    assert type(model).__name__ == "BertForSequenceClassification"
    assert observer.autocast == {torch.bfloat16} and "forward" not in vars(model)
