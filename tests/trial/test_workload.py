"""Each way a model file breaks the contract gets its own clear message and exit 2."""

from __future__ import annotations

import math
import re

import pytest
import torch

from autotune.cli import main
from autotune.errors import ContractError
from autotune.trial.training import setup_from_workload
from autotune.trial.workload import Workload, check_loss, load_workload

from ..conftest import FAST, TEST_MODELS, TINY_SOURCE, run_cli

CPU = torch.device("cpu")


def test_model_args_reach_both_builders(write_model) -> None:
    path = write_model(TINY_SOURCE)
    workload = load_workload(path, {"dim": 5, "size": 10})
    assert workload.build_model().blocks[0].in_features == 5
    assert len(workload.build_dataset()) == 10


LOAD_TIME = {
    "syntax": ("import torch\n\ndef build_model(:\n    pass\n", r"model\.py:3: syntax error"),
    "no_build_model": ("def build_dataset():\n    return [1]\n", r"must define build_model"),
    "no_build_dataset": ("def build_model():\n    return None\n", r"must define build_dataset"),
    "import_raises": ("x = 1\nraise RuntimeError('no GPU driver here')\n",
                      r"model\.py:2: importing the model file raised RuntimeError: no GPU"),
    "bad_baseline": (TINY_SOURCE.replace('"micro_batch_size": 8', '"micro_batch_sise": 8'),
                     r"BASELINE: .*unknown knob\(s\) micro_batch_sise"),
}


@pytest.mark.parametrize("case", sorted(LOAD_TIME))
def test_load_time_violations_say_what_is_wrong(case: str, write_model) -> None:
    source, pattern = LOAD_TIME[case]
    with pytest.raises(ContractError) as raised:
        load_workload(str(write_model(source)), {}).train_config({}, "cpu")
    assert re.search(pattern, " ".join(str(raised.value).split())), raised.value


def test_a_load_time_violation_exits_2_without_traceback(write_model, capsys) -> None:
    path = write_model(LOAD_TIME["import_raises"][0])
    assert main(["bench", "--model", str(path), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert re.search(LOAD_TIME["import_raises"][1], " ".join(err.split())), err


def test_missing_file_and_unknown_model_arg(write_model, capsys) -> None:
    assert main(["bench", "--model", "nowhere/model.py", "--device", "cpu"]) == 2
    assert "model file not found: nowhere/model.py" in capsys.readouterr().err
    path = write_model(TINY_SOURCE)
    assert main(["bench", "--model", str(path), "--device", "cpu", "--model-arg",
                 "dimm=3"]) == 2
    assert "--model-arg dimm: neither build_model nor build_dataset" in capsys.readouterr().err


def test_debug_shows_the_traceback(write_model) -> None:
    path = write_model("def build_dataset():\n    return [1]\n")
    with pytest.raises(ContractError):
        main(["bench", "--model", str(path), "--device", "cpu", "--debug"])


# Violations only a built model and a real batch reveal: found in the trial process.
TRIAL_TIME = {
    "model_not_module": (TINY_SOURCE.replace("return Net(dim)", "return [Net(dim)]"),
                         "build_model() must return a torch.nn.Module, got list"),
    "dataset_not_map_style": (
        TINY_SOURCE.replace("def build_dataset(dim=8, size=256):",
                            "def build_dataset(dim=8, size=256):\n    return 42\n"
                            "\ndef unused(dim=8, size=256):"),
        "build_dataset() must return a map-style Dataset"),
    "empty_dataset": (TINY_SOURCE.replace("size=256", "size=0"), "returned an empty dataset"),
    "batch_not_movable": (
        TINY_SOURCE + "\n\ndef collate_fn(samples):\n    return {'x': object()}\n",
        "batch['x'] is a object, which cannot be moved to cpu"),
    "loss_not_scalar": (
        TINY_SOURCE + "\n\ndef loss_fn(model, batch):\n"
                      "    return model.blocks[0](batch[0])\n",
        "the loss must be a scalar, got a tensor of shape (8, 8)"),
    "loss_without_grad": (
        TINY_SOURCE + "\n\ndef loss_fn(model, batch):\n    return model(*batch).detach()\n",
        "the loss does not require grad"),
    "output_without_loss": (
        TINY_SOURCE.replace("return nn.functional.mse_loss(x.sum(dim=1), y)", "return x"),
        "the model's output (a tensor of shape (8, 8)) has no loss. Define "
        "`def loss_fn(model, batch): ...`"),
}


@pytest.mark.parametrize("case", sorted(TRIAL_TIME))
def test_trial_time_violations_say_what_is_wrong(case: str, write_model) -> None:
    """Found by the first step of a trial's training, as a trial's process takes it."""
    source, message = TRIAL_TIME[case]
    workload = load_workload(str(write_model(source)), {})
    with pytest.raises(ContractError) as raised:
        setup = setup_from_workload(workload, workload.train_config({}, "cpu"), CPU)
        setup.step(setup.batches())
    assert message in " ".join(str(raised.value).split())


@pytest.mark.slow
def test_a_trial_time_violation_exits_2_with_its_message(write_model) -> None:
    source, message = TRIAL_TIME["loss_without_grad"]
    done = run_cli("bench", "--model", str(write_model(source)), "--device", "cpu", *FAST)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in " ".join(done.stderr.split()), done.stderr
    assert "Traceback" not in done.stderr


def trained_losses(workload: Workload, steps: int = 3, **knobs: object) -> list[float]:
    """Each optimizer step's loss when a trial trains the workload at its baseline and knobs."""
    setup = setup_from_workload(workload, workload.train_config(knobs, "cpu"), CPU)
    batches = setup.batches()
    return [setup.step(batches).loss.item() for _ in range(steps)]


@pytest.mark.parametrize("model", ["tiny_dict.py", "tiny_tuple.py"])
def test_users_own_files_run_unchanged(model: str) -> None:
    """Dict batches with an output `.loss`, and tuple batches with a `loss_fn`."""
    losses = trained_losses(load_workload(str(TEST_MODELS / model), {}))
    assert all(math.isfinite(loss) and loss > 0 for loss in losses)


@pytest.mark.parametrize("shape", [(1,), (1, 1)])
def test_a_one_element_loss_is_a_scalar_as_backward_takes_it(shape) -> None:
    loss = check_loss(torch.full(shape, 2.0, requires_grad=True).mul(3), "model.py")
    assert loss.shape == ()
    assert loss.item() == 6.0
    loss.backward()


def test_a_trial_trains_on_a_loss_of_shape_1(write_model) -> None:
    """Hand-written losses often end in shape (1,); backward() takes them, so the tool does."""
    path = write_model(TINY_SOURCE + "\n\ndef loss_fn(model, batch):\n"
                                     "    loss = model(*batch).reshape(1)\n"
                                     "    assert loss.shape == (1,)\n"
                                     "    return loss\n")
    losses = trained_losses(load_workload(str(path), {}), grad_accum_steps=2)
    assert all(math.isfinite(loss) and loss > 0 for loss in losses)
