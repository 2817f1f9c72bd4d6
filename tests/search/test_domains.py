"""`search/domains`: the values a search offers on a device, those it refuses and why, and what
the capability probe is sent to try."""

from __future__ import annotations

import sys

import pytest
import torch

from autotune.config import CHOICES, TrainConfig
from autotune.hardware import DeviceInfo, describe
from autotune.options import TuneOptions
from autotune.search.domains import device_domains, device_refusals, probe_candidates
from autotune.search.events import SilentView
from autotune.search.space import SpaceError, build_space

from ..conftest import TINY_SOURCE
from .scripted import scripted

CPU6 = DeviceInfo(type="cpu", index=None, name="test CPU", total_memory_bytes=2**34,
                  cpu_count=6, bf16=True, tf32=False, fused_adamw=True, cuda_graphs=False)


def test_the_values_a_device_refuses_are_grouped_by_reason_and_never_offered():
    info = describe(torch.device("cpu"))
    refused = device_refusals(TrainConfig(), info, attention=True)
    offered = device_domains(TrainConfig(), info, attention=True)
    # one reason, said once for both float8 values, and once for both CUDA-graph modes
    assert [vs for (_, reason), vs in refused.items() if "float8" in reason] == \
        [["fp8_tensorwise", "fp8_rowwise"]]
    assert [vs for (knob, _), vs in refused.items() if knob == "compile_mode"] == \
        [["reduce-overhead", "max-autotune"]]
    assert {v for (k, _), vs in refused.items() if k == "attention_backend" for v in vs} == \
        {"efficient", "cudnn"}
    for (knob, reason), values in refused.items():
        assert reason and not set(values) & set(offered[knob])
    # every candidate value is either offered or refused with a reason
    assert set(offered["precision"]) | {v for (k, _), vs in refused.items()
                                        if k == "precision" for v in vs} == \
        {"fp32", "tf32", "bf16", "fp16", "fp8_tensorwise", "fp8_rowwise"}


def test_the_baselines_own_values_are_offered_with_the_searchs():
    baseline = TrainConfig(num_workers=3, prefetch_factor=3, memory_format="channels_last")
    offered = device_domains(baseline, CPU6)
    assert offered["num_workers"] == (0, 1, 2, 3, 4)
    assert offered["prefetch_factor"] == (2, 3, 4)
    # knobs the search leaves at the baseline's: the model has no convolutions, one process
    assert offered["memory_format"] == ("channels_last",)
    assert offered["parallelism"] == ("none",) and offered["ddp_bucket_cap_mb"] == (25,)
    # a prefetch factor means nothing without workers
    assert device_domains(TrainConfig(), CPU6)["prefetch_factor"] == (2, 4)


def test_the_probe_is_sent_every_value_this_device_runs_but_a_baselines_own(knob_libraries_found):
    sent = probe_candidates(CPU6)
    assert sent["num_workers"] == (0, 1, 2, 4) and sent["prefetch_factor"] == (2, 4)
    assert "fp16" not in sent["precision"] and "fp8_rowwise" not in sent["precision"]
    # every memory format and attention kernel: the probe narrows them by the model
    assert sent["memory_format"] == CHOICES["memory_format"]
    assert sent["attention_backend"] == ("auto", "flash", "math")
    assert sent["parallelism"] == ()
    # other optimizers only where the search may offer them: --allow-optimizer-change
    assert sent["optimizer"] == () and "foreach" in sent["optimizer_impl"]  # the same rule
    assert probe_candidates(CPU6, optimizer_change=True)["optimizer"] == CHOICES["optimizer"]


def test_a_fix_this_cpu_refuses_says_why_without_repeating_itself(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # installing it would not help a CPU
    with pytest.raises(SpaceError) as refused:
        build_space(TrainConfig(micro_batch_size=8), describe(torch.device("cpu")), 64,
                    fixes={"precision": "fp8_tensorwise"})
    message = str(refused.value)
    assert message.startswith("--fix precision=fp8_tensorwise: not on this device: float8 "
                              "training needs a CUDA GPU of compute capability 8.9+")
    assert message.count("fp8_tensorwise") == 1 and "pip install" not in message


class _Notes(SilentView):
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)


def test_a_run_on_this_cpu_says_float8_needs_a_gpu_not_torchao(write_model, tmp_path,
                                                                monkeypatch):
    """The run's line for what this device never tries names the device's reason, once per
    reason, and no install hint where installing would not make the value run."""
    monkeypatch.setitem(sys.modules, "torchao", None)  # the tuner's process lacks torchao
    view = _Notes()
    tuner = scripted(TuneOptions(model_path=str(write_model(TINY_SOURCE)), device="cpu",
                                 studies_dir=str(tmp_path / "studies")), view=view)
    tuner.close()
    lines = [n for n in view.notes if n.startswith("not on this device: precision=fp8")]
    assert lines == [f"not on this device: precision=fp8_tensorwise, fp8_rowwise: float8 "
                     f"training needs a CUDA GPU of compute capability 8.9+ (Ada, Hopper, "
                     f"Blackwell); {describe(torch.device('cpu')).name} is not one"]
    assert not any("pip install" in n for n in view.notes if n.startswith("not on this"))
