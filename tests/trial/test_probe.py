"""The capability probe on real tiny models: the workload's facts, and knob values that fail
or cannot help here left out with their reason."""

from __future__ import annotations

import json

import pytest
import torch

from autotune.config import TrainConfig, loader_settings
from autotune.hardware import describe
from autotune.search.domains import device_domains, probe_candidates
from autotune.trial.probe import probe_job
from autotune.trial.protocol import ProbeReport, ProbeSettings
from autotune.trial.workload import load_workload

from ..conftest import TINY_SOURCE

CPU = torch.device("cpu")
# The tests' measurement windows (conftest.FAST), which time each DataLoader setting as briefly
WINDOW_S = 0.2

NO_BLOCKS = TINY_SOURCE.replace(
    "self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(2))",
    "self.blocks = (nn.Linear(dim, dim),)\n        self.only = self.blocks[0]")

WORKERS_FAIL = TINY_SOURCE + '''

class _MainProcessOnly(torch.utils.data.Dataset):
    def __init__(self, inner):
        self.inner = inner
    def __len__(self):
        return len(self.inner)
    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("this dataset holds a handle only the main process has")
        return self.inner[i]

_build = build_dataset
def build_dataset(dim=8, size=256):
    return _MainProcessOnly(_build(dim, size))
'''

BF16_FAILS = TINY_SOURCE + '''

def loss_fn(model, batch):
    x, y = batch
    out = model(x, y)
    if torch.is_autocast_enabled("cpu"):
        raise NotImplementedError("this model's custom kernel has no bf16 version")
    return out
'''

# Steps of 2 ms in fp32; bf16 steps of 20 ms: a CPU that emulates bf16.
BF16_SLOW = TINY_SOURCE.replace("import torch\n", "import time\nimport torch\n", 1) + '''

_forward = Net.forward
def _paced(self, x, y):
    time.sleep(0.02 if torch.is_autocast_enabled("cpu") else 0.002)
    return _forward(self, x, y)
Net.forward = _paced
'''

# The machine gets busy as the bf16 run starts: from then on every step takes 20 ms.
BUSY_FROM_BF16 = TINY_SOURCE.replace("import torch\n", "import time\nimport torch\n", 1) + '''

_forward = Net.forward
_busy = []
def _paced(self, x, y):
    if torch.is_autocast_enabled("cpu"):
        _busy.append(True)
    time.sleep(0.05 if _busy else 0.002)
    return _forward(self, x, y)
Net.forward = _paced
'''


CONV = """
import torch
from torch import nn

BASELINE = {"micro_batch_size": 8}


def build_model():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 1))


def build_dataset(size=64):
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(size, 3, 8, 8, generator=g),
                                          torch.randn(size, 1, generator=g))


def loss_fn(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)
"""

# A model that flattens its feature maps with .view, which a channels-last tensor refuses.
CONV_VIEWS = CONV.replace("nn.AdaptiveAvgPool2d(1),\n                         nn.Flatten(), "
                          "nn.Linear(8, 1)", "View(), nn.Linear(8 * 8 * 8, 1)") + """

class View(nn.Module):
    def forward(self, x):
        return x.view(x.size(0), -1)
"""


def probe(write_model, source: str, **overrides) -> ProbeReport:
    """The probe's job as the tuner asks for it in a study of short windows: the values a search
    offers here, sent as JSON."""
    workload = load_workload(str(write_model(source)), {})
    config = workload.train_config(overrides, "cpu")
    settings = ProbeSettings.for_window(
        json.loads(json.dumps(probe_candidates(describe(CPU), True))), WINDOW_S)
    report = probe_job(workload, config, CPU, settings, None, lambda p: None)
    return ProbeReport.from_dict(json.loads(json.dumps(report.to_dict())))  # as the pipe does


def test_the_workloads_facts_and_the_loader_rates(write_model) -> None:
    report = probe(write_model, TINY_SOURCE)
    assert report.baseline == {"micro_batch_size": 8}
    assert report.dataset_size == 256
    params = 2 * (8 * 8 + 8)
    assert report.parameters == params and report.state_bytes == 4 * 4 * params
    left = report.left_out_values()
    assert "activation_checkpointing" not in left and "num_workers" not in left
    settings = {(r.num_workers, r.prefetch_factor) for r in report.loader_rates}
    assert (0, None) in settings and (1, 2) in settings
    assert all(r.samples_per_sec > 0 for r in report.loader_rates)
    assert report.step_s["fp32"] > 0
    assert ProbeReport.from_dict(report.to_dict()) == report


COUNTS_BUILDS = TINY_SOURCE + """

_build_model = build_model
def build_model(dim=8):
    with open(__file__ + ".builds", "a") as log:
        log.write("built\\n")
    return _build_model(dim)
"""


def test_the_model_is_built_once_and_every_short_run_takes_a_copy(write_model,
                                                                   tmp_path) -> None:
    """GPT-2 small takes seconds to build, and the probe built it again for each of its dozen
    short runs (73 s of probe on an H200). Now it is built once and each run takes a copy of
    it as built: the same facts and values left out as where each run builds its own."""
    report = probe(write_model, COUNTS_BUILDS)
    assert (tmp_path / "model.py.builds").read_text().count("built") == 1
    assert report.parameters == 2 * (8 * 8 + 8) and report.step_s["fp32"] > 0
    def found(report: ProbeReport) -> dict:  # what fails; bf16's speed is the machine's
        return {knob: set(values) for knob, values in report.left_out_values().items()
                if knob != "precision"}

    assert found(report) == found(probe(write_model, TINY_SOURCE))


@pytest.mark.slow
def test_the_loader_settings_timed_are_the_spaces_with_the_baselines_own(write_model) -> None:
    """The probe is sent the values besides a baseline's own; it times the baseline's own
    prefetch factor with every worker count, as the search will offer it."""
    report = probe(write_model, TINY_SOURCE, num_workers=1, prefetch_factor=3)
    offered = device_domains(TrainConfig(num_workers=1, prefetch_factor=3), describe(CPU))
    assert {(r.num_workers, r.prefetch_factor) for r in report.loader_rates} == \
        set(loader_settings(offered))
    assert (1, 3) in set(loader_settings(offered))


def test_checkpointing_without_blocks_is_left_out_with_the_reason(write_model) -> None:
    left = probe(write_model, NO_BLOCKS).left_out_values()["activation_checkpointing"]
    assert set(left) == {"selective", "full"}
    assert "no nn.ModuleList" in left["full"]


def test_workers_that_cannot_load_batches_are_left_out(write_model) -> None:
    report = probe(write_model, WORKERS_FAIL)
    reasons = report.left_out_values()["num_workers"]
    offered = probe_candidates(describe(CPU), True)["num_workers"]
    assert set(reasons) == {n for n in offered if n > 0}
    assert "only the main process has" in reasons[1]
    assert {r.num_workers for r in report.loader_rates} == {0}


def test_a_precision_that_fails_on_this_model_is_left_out(write_model) -> None:
    reasons = probe(write_model, BF16_FAILS).left_out_values()["precision"]
    assert "no bf16 version" in reasons["bf16"] and "fails on this model" in reasons["bf16"]


def test_a_precision_far_slower_than_fp32_on_this_cpu_is_left_out(write_model) -> None:
    report = probe(write_model, BF16_SLOW)
    reason = report.left_out_values()["precision"]["bf16"]
    assert "x slower than fp32 on this CPU" in reason
    assert report.step_s["bf16"] > 2 * report.step_s["fp32"]


def test_a_machine_that_got_busy_after_the_fp32_reference_does_not_leave_bf16_out(
        write_model) -> None:
    """bf16 looks 25 times slower against the fp32 step timed before the machine got busy;
    fp32 timed again right after it is as slow, so bf16 stays in the space. (Busy is 50 ms a
    step: with 20 ms, bf16's own cost on a CPU without native bf16, in a lane's core on a slow
    hour, made it 2.4x the busy fp32's.)"""
    report = probe(write_model, BUSY_FROM_BF16)
    assert report.step_s["bf16"] > 2 * report.step_s["fp32"]  # against the first reference
    assert "precision" not in report.left_out_values()




def test_left_out_values_narrow_the_space_and_refuse_a_fix() -> None:
    from autotune.search.space import SpaceError, build_space

    left = {"precision": {"bf16": "20.0x slower than fp32 on this CPU"}}
    space = build_space(TrainConfig(micro_batch_size=8), describe(CPU), 64, left_out=left)
    assert space.domains["precision"] == ("fp32",)
    with pytest.raises(SpaceError, match="20.0x slower"):
        build_space(TrainConfig(micro_batch_size=8), describe(CPU), 64, left_out=left,
                    fixes={"precision": "bf16"})
    # the baseline's own value is never left out: it is the reference
    own = build_space(TrainConfig(micro_batch_size=8, precision="bf16"), describe(CPU), 64,
                      left_out=left)
    assert "bf16" in own.domains["precision"]


def test_memory_formats_are_offered_to_a_model_with_convolutions_only(write_model) -> None:
    assert probe(write_model, TINY_SOURCE).convolutional is False
    report = probe(write_model, CONV)
    assert report.convolutional is True
    assert "memory_format" not in report.left_out_values()


def test_channels_last_that_breaks_the_model_is_left_out_with_the_reason(write_model) -> None:
    left = probe(write_model, CONV_VIEWS).left_out_values()["memory_format"]
    assert set(left) == {"channels_last"}
    assert "view" in left["channels_last"]


ATTENTION = TINY_SOURCE + """

class Attention(nn.Module):
    def __init__(self, dim=8, four_dims=True):
        super().__init__()
        half = dim // 2
        self.qkv, self.head = nn.Linear(half, 3 * half), nn.Linear(half, 1)
        self.four_dims = four_dims

    def forward(self, x, y):
        # one head over a sequence of 2: (batch, heads, sequence, features), as fused kernels
        # want, or with a groups dimension before the heads, which only the math kernel takes
        shape = (x.size(0), 1, 2, -1) if self.four_dims else (x.size(0), 1, 1, 2, -1)
        q, k, v = self.qkv(x.view(shape)).chunk(3, dim=-1)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return nn.functional.mse_loss(self.head(out).flatten(1).mean(dim=1), y)


def build_model(dim=8):
    return Attention(dim, FOUR_DIMS)


FOUR_DIMS = True
"""


def test_attention_kernels_are_offered_to_a_model_that_calls_attention_only(write_model):
    assert probe(write_model, TINY_SOURCE).attention is False
    report = probe(write_model, ATTENTION)
    assert report.attention is True
    assert "attention_backend" not in report.left_out_values()


def test_a_kernel_that_refuses_the_models_shapes_is_left_out_with_the_reason(write_model):
    report = probe(write_model, ATTENTION.replace("FOUR_DIMS = True", "FOUR_DIMS = False"))
    # CPU's flash kernel wants (batch, heads, sequence, features) on every torch (2.14 takes
    # 3-D too, which 2.13 refused); math takes anything
    refused = report.left_out_values()["attention_backend"]
    assert set(refused) == {"flash"}
    assert "backend" in refused["flash"] or "kernel" in refused["flash"]


# A model with a complex parameter: AdamW updates it, torch's Adafactor refuses it.
COMPLEX_PARAMETER = TINY_SOURCE.replace(
    "        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(2))",
    "        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(2))\n"
    "        self.phase = nn.Parameter(torch.ones(dim, dtype=torch.cfloat))").replace(
    "        return nn.functional.mse_loss(x.sum(dim=1), y)",
    "        return nn.functional.mse_loss((x * self.phase).abs().sum(dim=1), y)")


def test_each_optimizer_is_tried_and_one_that_fails_is_left_out_with_the_reason(write_model):
    assert "optimizer" not in probe(write_model, TINY_SOURCE).left_out_values()
    left = probe(write_model, COMPLEX_PARAMETER).left_out_values()["optimizer"]
    assert "adamw" not in left
    assert "does not support complex parameters" in left["adafactor"]


# Convolutions and attention in one model: memory formats and attention kernels both offered.
CONV_ATTENTION = CONV.replace('''def build_model():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 1))''', '''class ConvAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 1)

    def forward(self, x):
        maps = self.conv(x)
        flat = maps.reshape(maps.size(0), -1) if RESHAPE else maps.view(maps.size(0), -1)
        tokens = flat.view(x.size(0), 1, 8, 64).transpose(2, 3).contiguous()  # 64 tokens
        out = nn.functional.scaled_dot_product_attention(tokens, tokens, tokens)
        return self.head(out.mean(dim=(1, 2)))


def build_model():
    return ConvAttention()


RESHAPE = True''')


def _probe_steps(write_model, source: str) -> tuple[ProbeReport, list[str]]:
    said: list[str] = []
    workload = load_workload(str(write_model(source)), {})
    settings = ProbeSettings.for_window(probe_candidates(describe(CPU), True), WINDOW_S)
    report = probe_job(workload, workload.train_config({}, "cpu"), CPU, settings, None,
                       said.append)
    return report, [line.removeprefix("trying ") for line in said
                    if line.startswith("trying ") and "DataLoader" not in line]


def test_one_probe_step_answers_for_a_value_of_each_knob_and_a_failure_is_taken_apart(
        write_model) -> None:
    """Memory formats and attention kernels: the first of each in one step, then the second
    of each... Where all run, no value is tried alone. Where the model refuses channels_last
    (it views its feature maps), the step with it is taken apart and only channels_last is
    left out, with its reason."""
    offered = probe_candidates(describe(CPU), True)
    kernels = [k for k in offered["attention_backend"] if k != "auto"]
    report, tried = _probe_steps(write_model, CONV_ATTENTION)
    assert report.convolutional and report.attention
    assert not {"optimizer_impl", "memory_format", "attention_backend"} & \
        set(report.left_out_values())
    first = f"memory_format=channels_last, attention_backend={kernels[0]}"
    assert first in tried
    alone = [t for t in tried if t.startswith(("memory_format", "attention_backend"))]
    assert alone == [first, *(f"attention_backend={k}" for k in kernels[1:])], tried
    report, tried = _probe_steps(write_model, CONV_ATTENTION.replace("RESHAPE = True",
                                                                     "RESHAPE = False"))
    left = report.left_out_values()
    assert set(left["memory_format"]) == {"channels_last"} and "view" in left["memory_format"][
        "channels_last"]
    assert "optimizer_impl" not in left and "attention_backend" not in left
    assert first in tried and {"memory_format=channels_last",
                               f"attention_backend={kernels[0]}"} <= set(tried)


# A model file whose own optimizer has a foreach version and no fused one.
FOREACH_ONLY = TINY_SOURCE + """

def build_optimizer(params, foreach=False, fused=False):
    if fused:
        raise NotImplementedError("this optimizer has no fused version")
    return torch.optim.AdamW(params, lr=1e-3, foreach=foreach)
"""


def test_one_backward_answers_for_every_adamw_implementation(write_model) -> None:
    """The AdamW implementations share one forward and backward, each then building its
    optimizer and taking one step: one the file's optimizer does not take is left out with
    the reason; the others are not."""
    report, tried = _probe_steps(write_model, FOREACH_ONLY)
    assert "optimizer_impl=foreach, fused on one backward" in tried
    assert not [t for t in tried if t.startswith("optimizer_impl") and "backward" not in t]
    left = report.left_out_values()["optimizer_impl"]
    assert set(left) == {"fused"} and "this optimizer has no fused version" in left["fused"]
    report, _ = _probe_steps(write_model, TINY_SOURCE)
    assert "optimizer_impl" not in report.left_out_values()
