"""The process-group checks before the search: which values are tried, in what configuration,
and what a failure leaves out (the runner answers as a real group would; a real group's static
graph is left out in tests/end_to_end/test_process_group.py)."""

from __future__ import annotations

from autotune.config import TrainConfig
from autotune.search.group_checks import group_left_out
from autotune.search.runner import MeasureJob
from autotune.trial.protocol import TrialResult, TrialStatus

BASELINE = TrainConfig(micro_batch_size=8, parallelism="ddp")


class Answers:
    """A runner whose group fails where `fails` says (knob value -> status)."""

    def __init__(self, fails: dict[tuple[str, object], TrialStatus]) -> None:
        self.fails, self.asked = fails, []

    def measure(self, config: TrainConfig, job: MeasureJob) -> TrialResult:
        self.asked.append((config, job))
        for (knob, value), status in self.fails.items():
            if getattr(config, knob) == value:
                return TrialResult(status, f"rank 0 of 2: boom from {knob}")
        return TrialResult(TrialStatus.OK, "measured")


def test_each_value_is_tried_once_with_accumulation_as_a_check_run():
    runner = Answers({})
    assert group_left_out(runner, BASELINE, "cpu", 60, bf16=True) == []
    tried = [(c.parallelism, c.ddp_static_graph, c.ddp_gradient_as_bucket_view,
              c.fsdp_reshard_after_forward, c.fsdp_reduce_dtype) for c, _ in runner.asked]
    assert tried == [("fsdp", False, False, True, "fp32"), ("ddp", True, False, True, "fp32"),
                     ("ddp", False, True, True, "fp32"), ("fsdp", False, False, False, "fp32"),
                     ("fsdp", False, False, True, "bf16")]
    assert all(c.grad_accum_steps == 2 and job.check_run for c, job in runner.asked)


def test_a_failing_value_is_left_out_with_its_reason_and_a_hang_says_so():
    runner = Answers({("ddp_static_graph", True): TrialStatus.ERROR,
                      ("ddp_gradient_as_bucket_view", True): TrialStatus.TIMEOUT})
    left = {(x.knob, x.value): x.reason for x in group_left_out(runner, BASELINE, "cpu", 60,
                                                                  bf16=True)}
    assert set(left) == {("ddp_static_graph", True), ("ddp_gradient_as_bucket_view", True)}
    assert "fails with gradient accumulation" in left[("ddp_static_graph", True)]
    assert "boom from ddp_static_graph" in left[("ddp_static_graph", True)]
    assert "did not finish within 60 s" in left[("ddp_gradient_as_bucket_view", True)]


def test_fsdp_failing_skips_its_own_knobs_and_out_of_memory_leaves_nothing_out():
    runner = Answers({("parallelism", "fsdp"): TrialStatus.ERROR,
                      ("ddp_static_graph", True): TrialStatus.OOM})
    left = group_left_out(runner, BASELINE, "cpu", 60, bf16=True)
    assert [(x.knob, x.value) for x in left] == [("parallelism", "fsdp")]
    assert [c.parallelism for c, _ in runner.asked] == ["fsdp", "ddp", "ddp"]


def test_no_bf16_reduction_is_tried_where_the_device_has_no_bf16():
    runner = Answers({})
    group_left_out(runner, BASELINE, "cpu", 60, bf16=False)
    assert all(c.precision != "bf16" for c, _ in runner.asked)


def test_a_value_the_user_left_out_of_the_space_is_not_tried():
    runner = Answers({})
    group_left_out(runner, BASELINE, "cpu", 60, bf16=True,
                   allowed={"ddp_static_graph": (False,), "precision": ("fp32",)})
    tried = [(c.parallelism, c.ddp_static_graph, c.fsdp_reduce_dtype) for c, _ in runner.asked]
    assert ("ddp", True, "fp32") not in tried and ("fsdp", False, "bf16") not in tried
    assert len(tried) == 3
