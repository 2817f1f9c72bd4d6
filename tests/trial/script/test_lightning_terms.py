"""A configuration in Lightning's terms, and what Lightning cannot be told."""

from __future__ import annotations

import pytest

from autotune.config import TrainConfig
from autotune.trial.script.lightning_terms import changes, settings, unexpressed
from autotune.trial.script.session import ScriptBaseline


def _baseline(**fixed: str) -> ScriptBaseline:
    """A script with batch_size and num_workers attributes on its DataModule `Data`."""
    return ScriptBaseline(
        "lightning", knobs={"micro_batch_size": 32, "grad_accum_steps": 2},
        fixed=dict(fixed), settings={
            "Trainer": {"precision": "32-true", "accumulate_grad_batches": 2},
            "Data": {"batch_size": 32, "num_workers": 0},
            "torch.optim.AdamW": {"foreach": False, "fused": False}})


def test_the_answer_says_where_each_setting_goes() -> None:
    baseline = _baseline()
    config = baseline.config("cpu").replace(micro_batch_size=8, precision="bf16",
                                            optimizer_impl="fused", compile_mode="default")
    assert settings(config, baseline)["Data"] == {"batch_size": 8, "num_workers": 0}
    assert changes(config, baseline, "cpu") == {
        "Trainer": {"precision": "bf16-mixed"}, "Data": {"batch_size": 8},
        "model.forward = torch.compile": {"mode": None},
        "torch.optim.AdamW": {"fused": True}}
    assert changes(baseline.config("cpu"), baseline, "cpu") == {}


@pytest.mark.parametrize(("change", "expressible"), [
    ({"precision": "fp16"}, True),
    ({"precision": "fp8_tensorwise"}, False),
    ({"activation_checkpointing": "full"}, False),
    ({"optimizer": "adafactor", "optimizer_impl": "for_loop"}, False),
    ({"optimizer_impl": "foreach"}, True),
    ({"memory_format": "channels_last"}, False),
    ({"num_workers": 2}, True),
])
def test_what_lightning_can_be_told(change: dict, expressible: bool) -> None:
    baseline = _baseline()
    refused = unexpressed(baseline.config("cpu").replace(**change), baseline, "cpu")
    assert (refused == []) == expressible


def test_a_setting_the_script_keeps_to_itself_is_left_out_with_its_reason() -> None:
    baseline = _baseline(pin_memory="the script sets it in its own code")
    config = baseline.config("cpu").replace(pin_memory=True)
    [item] = unexpressed(config, baseline, "cpu")
    assert (item.knob, item.value, item.reason) == ("pin_memory", True,
                                                    "the script sets it in its own code")
    assert unexpressed(TrainConfig(micro_batch_size=32, grad_accum_steps=2), baseline,
                       "cpu") == []


def test_a_precision_the_script_keeps_stays_its_own() -> None:
    baseline = _baseline(precision="the script's precision 'bf16-true' is none of autotune's")
    baseline.settings["Trainer"]["precision"] = "bf16-true"
    config = baseline.config("cpu").replace(grad_accum_steps=4)
    assert settings(config, baseline)["Trainer"] == {"precision": "bf16-true",
                                                     "accumulate_grad_batches": 4}
    assert [x.knob for x in unexpressed(config.replace(precision="bf16"), baseline, "cpu")] \
        == ["precision"]
