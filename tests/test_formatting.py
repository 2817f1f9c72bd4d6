"""Human units: one spelling for every figure a user reads."""

from __future__ import annotations

from autotune.config import TrainConfig
from autotune.formatting import (
    describe_changes,
    format_bytes,
    format_disturbance,
    format_percent,
    format_rate,
    format_seconds,
    mfu_basis,
    mfu_figure,
    short_config,
)
from autotune.trial.flops import COMPILED


def test_figures_read_in_the_unit_that_suits_them() -> None:
    assert format_bytes(512) == "512 B" and format_bytes(3 * 2**30) == "3.00 GiB"
    assert format_seconds(0.0042) == "4.20 ms" and format_seconds(90) == "90.00 s"
    assert format_seconds(600) == "10.0 min"
    assert format_percent(0.125) == "12.5%" and format_rate(1234.56, 7.0) == "1,234.6 ± 7.0"
    assert [f(None) for f in (format_bytes, format_seconds, format_percent, format_rate)] == \
        ["n/a"] * 4
    assert format_disturbance(0.47) == "disturbed (other processes used 47% of the CPUs)"


def test_a_configuration_in_one_line_names_only_what_differs_from_pytorch() -> None:
    plain = TrainConfig(micro_batch_size=8)
    assert short_config(plain) == "mb=8x1 fp32 for_loop"
    tuned = TrainConfig(micro_batch_size=8, grad_accum_steps=4, precision="bf16",
                        activation_checkpointing="selective", optimizer_impl="fused",
                        num_workers=2, prefetch_factor=4, persistent_workers=True,
                        compile_mode="default")
    assert short_config(tuned) == ("mb=8x4 bf16 ckpt=selective fused workers=2/pf=4/persist "
                                   "compile=default")


def test_a_change_of_optimizer_says_it_changes_the_update_rule_and_float8_its_scales():
    baseline = TrainConfig(optimizer_impl="foreach")
    changed = TrainConfig(optimizer="adamw_8bit", precision="fp8_rowwise",
                          compile_mode="default")
    # the AdamW implementation means nothing under another optimizer: not named as a change
    assert describe_changes(changed, baseline) == \
        "float8 (rowwise scales) + 8-bit AdamW (another update rule) + torch.compile"
    assert short_config(changed) == "mb=1x1 fp8_rowwise adamw_8bit compile=default"


def test_mfu_on_cuda_says_what_it_divided_and_on_cpu_why_there_is_none() -> None:
    basis = mfu_basis(4.21e9, "counted", 989e12, "the bf16 data-sheet peak")
    assert basis == ("4.21 GFLOP a sample (counted) x samples/sec over 989 TFLOP/s, the bf16 "
                     "data-sheet peak")
    assert mfu_figure(0.394, "cuda:0", basis) == ("39.4%", basis)
    assert mfu_figure(None, "cpu") == ("n/a on CPU", "no peak FLOP/s to divide by: MFU needs "
                                       "CUDA")
    # on CUDA, the half that was missing
    assert mfu_basis(None, None, 989e12, "the bf16 data-sheet peak").startswith(
        "no FLOPs a sample")
    # and why a script's step was not counted, where it was not
    assert mfu_basis(None, COMPILED, 989e12, "the bf16 data-sheet peak") == (
        "no FLOPs a sample (not counted: the step runs torch.compile'd code, which a FLOP "
        "counter cannot see)")
    assert mfu_basis(4.21e9, "given", None, None).startswith("no peak FLOP/s for this GPU")
