"""The search space: device limits, batch rules, conditional knobs, narrowing, Optuna's view."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
import warnings

import optuna
import pytest
import torch

from autotune.config import CUDA_GRAPH_MODES, TrainConfig
from autotune.hardware import DeviceInfo, describe, unsupported_reason
from autotune.options import DEFAULT_MAX_GRAD_ACCUM
from autotune.search.space import SearchSpace, SpaceError, build_space, load_space_file

optuna.logging.set_verbosity(optuna.logging.WARNING)

BASELINE = TrainConfig(micro_batch_size=8, grad_accum_steps=4)  # effective batch 32
CPU6 = DeviceInfo(type="cpu", index=None, name="test CPU", total_memory_bytes=2**34,
                  cpu_count=6, bf16=True, tf32=False, fused_adamw=True, cuda_graphs=False)
H100 = DeviceInfo(type="cuda", index=0, name="NVIDIA H100 80GB HBM3",
                  total_memory_bytes=80 * 2**30, cpu_count=16, bf16=True, tf32=True,
                  fused_adamw=True, cuda_graphs=True)
V100 = DeviceInfo(type="cuda", index=0, name="Tesla V100-SXM2-16GB",
                  total_memory_bytes=16 * 2**30, cpu_count=8, bf16=False, tf32=False,
                  fused_adamw=False, cuda_graphs=True)


def enumerate_space(space: SearchSpace) -> list[TrainConfig]:
    """The space spelt out by hand from its domains, to check `grid` and `size` against."""
    d = space.domains
    out = []
    for micro, precision, ckpt, impl, workers, pin, compile_mode in itertools.product(
            d["micro_batch_size"], d["precision"], d["activation_checkpointing"],
            d["optimizer_impl"], d["num_workers"], d["pin_memory"], d["compile_mode"]):
        loader = [(None, False)] if workers == 0 else \
            list(itertools.product(d["prefetch_factor"], d["persistent_workers"]))
        if space.batch_range is None:
            accums = [space.global_batch // micro]
        elif space.fixed_grad_accum is not None:
            accums = [space.fixed_grad_accum]
        else:
            low, high = space.batch_range
            accums = [a for a in range(1, (space.max_grad_accum or high) + 1)
                      if low <= micro * a <= high]
        for (prefetch, persistent), accum in itertools.product(loader, accums):
            out.append(TrainConfig(
                micro_batch_size=micro, grad_accum_steps=accum, precision=precision,
                activation_checkpointing=ckpt, optimizer_impl=impl, num_workers=workers,
                prefetch_factor=prefetch, pin_memory=pin, persistent_workers=persistent,
                compile_mode=compile_mode))
    return out


def sample(space: SearchSpace, n: int, sampler: optuna.samplers.BaseSampler | None = None):
    """`n` asked-and-told trials; returns (params, config) per trial."""
    study = optuna.create_study(sampler=sampler or optuna.samplers.RandomSampler(seed=0))
    out = []
    for _ in range(n):
        trial = study.ask()
        config = space.suggest(trial)
        study.tell(trial, float(config.micro_batch_size))
        out.append((dict(trial.params), config))
    return out


# --- what the device supports ---------------------------------------------------------------

def test_cpu_space_offers_only_what_this_cpu_runs():
    info = describe(torch.device("cpu"))
    space = build_space(BASELINE, info, 1000)
    d = space.domains
    assert "fp16" not in d["precision"] and "tf32" not in d["precision"]
    assert d["pin_memory"] == (False,)
    assert not set(CUDA_GRAPH_MODES) & set(d["compile_mode"])
    assert 0 in d["num_workers"] and max(d["num_workers"]) <= info.cpu_count
    assert space.contains(BASELINE)
    grid = space.grid()
    assert all(unsupported_reason(config, info) is None for config in grid)
    assert len(grid) == space.size() == len(enumerate_space(space))


def test_grid_is_every_configuration_and_nothing_else():
    space = build_space(BASELINE, CPU6, 1000)
    assert space.domains == {
        "micro_batch_size": (2, 4, 8, 16, 32),
        "precision": ("fp32", "bf16"),
        "activation_checkpointing": ("none", "selective", "full"),
        "optimizer": ("adamw",),
        "optimizer_impl": ("for_loop", "foreach", "fused"),
        "num_workers": (0, 1, 2, 4),
        "prefetch_factor": (2, 4),
        "pin_memory": (False,),
        "persistent_workers": (False, True),
        "compile_mode": ("none", "default", "max-autotune-no-cudagraphs"),
        # no convolutions: no memory format; one process: no process group's knobs
        "memory_format": ("contiguous",), "attention_backend": ("auto",),
        "parallelism": ("none",),
        "ddp_bucket_cap_mb": (25,), "ddp_static_graph": (False,),
        "ddp_gradient_as_bucket_view": (False,), "fsdp_reshard_after_forward": (True,),
        "fsdp_reduce_dtype": ("fp32",),
    }
    # 5 micro (1 x 32 is past the accumulation cap of 16) x 2 precisions x 3 checkpointing x
    # 3 optimizers x 3 compile modes x loaders, where loaders = 1 (no workers) + 3 worker
    # counts x 2 prefetch x 2 persistent = 13
    grid = space.grid()
    assert len(grid) == 5 * 2 * 3 * 3 * 3 * 13 == space.size()
    assert set(grid) == set(enumerate_space(space))
    assert len(set(grid)) == len(grid)


def test_a_process_group_searches_its_knobs_each_only_under_its_parallelism():
    space = build_space(BASELINE.replace(parallelism="ddp"), CPU6, 1000, world_size=2,
                        fixes={"precision": "bf16", "num_workers": 0,
                               "activation_checkpointing": "none", "optimizer_impl": "fused",
                               "compile_mode": "none"})
    assert space.domains["parallelism"] == ("ddp", "fsdp")
    grid = space.grid()
    ddp = [c for c in grid if c.parallelism == "ddp"]
    fsdp = [c for c in grid if c.parallelism == "fsdp"]
    # ddp: 3 bucket sizes x static graph x bucket view; fsdp: reshard x reduce dtype (bf16)
    micros = len(space.domains["micro_batch_size"])
    assert len(ddp) == micros * 3 * 2 * 2 and len(fsdp) == micros * 2 * 2
    assert len(grid) == space.size()
    assert all(c.fsdp_reshard_after_forward and c.fsdp_reduce_dtype == "fp32" for c in ddp)
    assert all(c.ddp_bucket_cap_mb == 25 and not c.ddp_static_graph for c in fsdp)
    assert all(not c.problems() for c in grid)


def test_a_convolutional_model_searches_the_memory_format():
    plain = build_space(BASELINE, CPU6, 1000)
    convolutional = build_space(BASELINE, CPU6, 1000, convolutional=True)
    assert convolutional.domains["memory_format"] == ("contiguous", "channels_last")
    assert convolutional.size() == 2 * plain.size()
    assert convolutional.fast_corner(8).memory_format == "channels_last"


def test_a_model_that_calls_attention_searches_the_kernels_this_device_runs():
    assert build_space(BASELINE, CPU6, 1000).domains["attention_backend"] == ("auto",)
    space = build_space(BASELINE, CPU6, 1000, attention=True)
    # efficient and cuDNN attention run on CUDA only
    assert space.domains["attention_backend"] == ("auto", "flash", "math")


def test_other_optimizers_are_searched_only_when_the_user_allows_a_change_of_update_rule():
    assert build_space(BASELINE, CPU6, 1000).domains["optimizer"] == ("adamw",)
    with pytest.raises(SpaceError, match="--allow-optimizer-change"):
        build_space(BASELINE, CPU6, 1000, fixes={"optimizer": "adafactor"})
    allowed = build_space(BASELINE, CPU6, 1000, optimizer_change=True,
                          fixes={"precision": "fp32", "num_workers": 0, "compile_mode": "none",
                                 "activation_checkpointing": "none"})
    assert set(allowed.domains["optimizer"]) >= {"adamw", "adafactor"}
    grid = allowed.grid()
    # the AdamW implementations are searched under AdamW only
    assert {c.optimizer_impl for c in grid if c.optimizer != "adamw"} == {"for_loop"}
    assert {c.optimizer_impl for c in grid if c.optimizer == "adamw"} == \
        {"for_loop", "foreach", "fused"}
    assert len(grid) == allowed.size()


def test_float8_is_offered_on_gpus_that_run_it_and_only_compiled(knob_libraries_found):
    h100 = dataclasses.replace(H100, fp8=True)
    space = build_space(BASELINE, h100, 1000)
    assert {"fp8_tensorwise", "fp8_rowwise"} <= set(space.domains["precision"])
    assert not {"fp8_tensorwise", "fp8_rowwise"} & set(build_space(BASELINE, H100, 1000)
                                                      .domains["precision"])
    assert "fp8_rowwise" not in build_space(BASELINE, CPU6, 1000).domains["precision"]
    eager = TrainConfig(precision="fp8_rowwise")
    assert "runs compiled only" in unsupported_reason(eager, h100)
    assert unsupported_reason(eager.replace(compile_mode="default"), h100) is None
    assert "compute capability 8.9" in unsupported_reason(eager.replace(compile_mode="default"),
                                                          H100)
    # the sampler's compile_mode=none under float8 is a compiled run
    fp8_configs = [c for c in space.grid() if c.precision.startswith("fp8")]
    assert fp8_configs and all(c.compile_mode != "none" for c in fp8_configs)
    assert all(unsupported_reason(c, h100) is None for c in fp8_configs[:50])
    # without a compiled mode to run under, float8 is not offered
    eager_only = build_space(BASELINE, h100, 1000, fixes={"compile_mode": "none"})
    assert not any(p.startswith("fp8") for p in eager_only.domains["precision"])


def test_one_process_cannot_fix_a_process_groups_knob():
    with pytest.raises(SpaceError, match="parallelism"):
        build_space(BASELINE, CPU6, 1000, fixes={"parallelism": "ddp"})


def test_free_batch_grid_is_every_configuration():
    space = build_space(BASELINE, CPU6, 1000, free_batch=(16, 64),
                        fixes={"precision": "fp32", "compile_mode": "none"})
    grid = space.grid()
    assert set(grid) == set(enumerate_space(space))
    assert len(grid) == len(set(grid)) == space.size()


def test_cuda_space_offers_gpu_knobs():
    space = build_space(BASELINE, H100, 1000)
    d = space.domains
    assert d["precision"] == ("fp32", "tf32", "bf16", "fp16")
    assert d["pin_memory"] == (False, True)
    assert {"reduce-overhead", "max-autotune"} <= set(d["compile_mode"])
    assert "fused" in d["optimizer_impl"]
    assert d["num_workers"] == (0, 1, 2, 4, 8, 16)
    assert space.size() == len(enumerate_space(space))


def test_gpu_without_bf16_tf32_or_fused_adamw_is_not_offered_them():
    d = build_space(BASELINE, V100, 1000).domains
    assert d["precision"] == ("fp32", "fp16")
    assert d["optimizer_impl"] == ("for_loop", "foreach")


def test_baselines_own_values_are_in_the_space():
    baseline = TrainConfig(micro_batch_size=8, grad_accum_steps=4, num_workers=3,
                           prefetch_factor=8, persistent_workers=True)
    space = build_space(baseline, CPU6, 1000)
    assert space.domains["num_workers"] == (0, 1, 2, 3, 4)
    assert space.domains["prefetch_factor"] == (2, 4, 8)
    assert space.contains(baseline)


def test_baseline_with_workers_but_default_prefetch_stays_reachable():
    baseline = TrainConfig(micro_batch_size=8, grad_accum_steps=4, num_workers=2)
    space = build_space(baseline, CPU6, 1000)
    assert space.domains["prefetch_factor"] == (None, 2, 4)
    assert space.contains(baseline)


def test_baseline_value_the_device_refuses_is_left_out():
    baseline = TrainConfig(micro_batch_size=8, grad_accum_steps=4, pin_memory=True)
    space = build_space(baseline, CPU6, 1000)
    assert space.domains["pin_memory"] == (False,)
    assert not space.contains(baseline)
    assert space.describe()["baseline_in_space"] is False


# --- batch rules ----------------------------------------------------------------------------

def test_effective_batch_is_kept_over_random_trials():
    space = build_space(BASELINE, CPU6, 1000)
    results = sample(space, 200)
    for params, config in results:
        assert config.micro_batch_size * config.grad_accum_steps == 32
        assert "grad_accum_steps" not in params
        assert space.contains(config)
    assert len({config.micro_batch_size for _, config in results}) == 5


def test_global_batch_uses_divisors_that_fit_the_dataset():
    space = build_space(BASELINE, CPU6, 20, global_batch=48)
    assert space.domains["micro_batch_size"] == (3, 4, 6, 8, 12, 16)
    for _, config in sample(space, 200):
        assert config.effective_batch_size == 48
        assert config.micro_batch_size <= 20
    # the baseline trains with 32 per step, so it is not in a space that keeps 48
    assert space.params_for(BASELINE) is None


def test_free_batch_keeps_products_in_range():
    space = build_space(BASELINE, CPU6, 1000, free_batch=(16, 64))
    assert space.free_batch and space.global_batch is None
    assert space.domains["micro_batch_size"] == (1, 2, 4, 8, 16, 32, 64)
    results = sample(space, 200)
    for params, config in results:
        assert 16 <= config.effective_batch_size <= 64
        assert params["grad_accum_steps"] == config.grad_accum_steps
    assert len({config.effective_batch_size for _, config in results}) > 10


def test_free_batch_micro_sizes_respect_the_dataset_and_the_baseline():
    baseline = TrainConfig(micro_batch_size=12, grad_accum_steps=2)
    assert build_space(baseline, CPU6, 20, free_batch=(16, 64)).domains["micro_batch_size"] \
        == (1, 2, 4, 8, 12, 16)


def test_free_batch_with_fixed_grad_accum_searches_micro_only():
    space = build_space(BASELINE, CPU6, 1000, free_batch=(16, 64),
                        fixes={"grad_accum_steps": 4})
    assert space.domains["micro_batch_size"] == (4, 8, 16)
    for params, config in sample(space, 50):
        assert config.grad_accum_steps == 4 and "grad_accum_steps" not in params


def test_grad_accum_range_follows_the_micro_batch():
    space = build_space(BASELINE, CPU6, 1000, free_batch=(16, 64))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(50):
        trial = study.ask()
        config = space.suggest(trial)
        dist = trial.distributions["grad_accum_steps"]
        low = math.ceil(16 / config.micro_batch_size)
        high = min(64 // config.micro_batch_size, DEFAULT_MAX_GRAD_ACCUM)
        assert (dist.low, dist.high) == (low, high)
        study.tell(trial, 1.0)


def test_accumulation_is_capped_unless_the_user_asks_for_more():
    baseline = TrainConfig(micro_batch_size=1, grad_accum_steps=64)
    space = build_space(baseline, CPU6, 1000, max_grad_accum=8)
    assert space.domains["micro_batch_size"] == (1, 8, 16, 32, 64), "baseline's 64 stays"
    assert build_space(BASELINE, CPU6, 1000, fixes={"micro_batch_size": 1}) \
        .domains["micro_batch_size"] == (1,)
    free = build_space(BASELINE, CPU6, 1000, free_batch=(16, 1024), max_grad_accum=4)
    assert free.domains["micro_batch_size"] == (4, 8, 16, 32, 64, 128, 256, 512)
    assert free.accum_range(4) == (4, 4)


# --- conditional knobs ----------------------------------------------------------------------

def test_prefetch_and_persistent_workers_only_with_workers():
    results = sample(build_space(BASELINE, CPU6, 1000), 200)
    seen = set()
    for params, config in results:
        if config.num_workers == 0:
            assert "prefetch_factor" not in params and "persistent_workers" not in params
            assert config.prefetch_factor is None and config.persistent_workers is False
        else:
            assert params["prefetch_factor"] == config.prefetch_factor
            assert params["persistent_workers"] == config.persistent_workers
        seen.add(config.num_workers > 0)
    assert seen == {False, True}


# --- params_for and enqueueing --------------------------------------------------------------

@pytest.mark.parametrize("baseline, kwargs", [
    (BASELINE, {}),
    (TrainConfig(micro_batch_size=8, grad_accum_steps=4, num_workers=2, persistent_workers=True,
                 precision="bf16", compile_mode="default"), {}),
    (BASELINE, {"free_batch": (16, 64)}),
])
def test_enqueued_baseline_comes_back_exactly(baseline, kwargs):
    space = build_space(baseline, CPU6, 1000, **kwargs)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(3):  # some history first, as in a resumed study
        trial = study.ask()
        space.suggest(trial)
        study.tell(trial, 1.0)
    study.enqueue_trial(space.params_for(baseline))
    assert space.suggest(study.ask()) == baseline


@pytest.mark.parametrize("config", [
    TrainConfig(micro_batch_size=8, grad_accum_steps=2),                     # batch 16, not 32
    TrainConfig(micro_batch_size=8, grad_accum_steps=4, precision="fp16"),   # not on CPU
    TrainConfig(micro_batch_size=8, grad_accum_steps=4, pin_memory=True),    # single-valued knob
    TrainConfig(micro_batch_size=8, grad_accum_steps=4, num_workers=5),      # not a domain value
])
def test_configs_outside_the_space_have_no_params(config):
    space = build_space(BASELINE, CPU6, 1000)
    assert space.params_for(config) is None
    assert not space.contains(config)


def test_free_batch_params_for_checks_the_accum_range():
    space = build_space(BASELINE, CPU6, 1000, free_batch=(16, 64))
    assert space.params_for(TrainConfig(micro_batch_size=8, grad_accum_steps=9)) is None
    assert space.params_for(TrainConfig(micro_batch_size=8, grad_accum_steps=8)) == {
        "micro_batch_size": 8, "grad_accum_steps": 8, "precision": "fp32",
        "activation_checkpointing": "none", "optimizer_impl": "for_loop", "num_workers": 0,
        "compile_mode": "none"}


# --- narrowing ------------------------------------------------------------------------------

def test_fix_narrows_a_knob_to_one_value():
    space = build_space(BASELINE, CPU6, 1000, fixes={"precision": "bf16"})
    assert space.domains["precision"] == ("bf16",)
    for params, config in sample(space, 50):
        assert config.precision == "bf16" and "precision" not in params
    # the user's word wins over the baseline's fp32
    assert not space.contains(BASELINE)


def test_fix_accepts_text_values():
    space = build_space(BASELINE, CPU6, 1000, fixes={"micro_batch_size": "4",
                                                     "persistent_workers": "true"})
    assert space.domains["micro_batch_size"] == (4,)
    assert space.domains["persistent_workers"] == (True,)


def test_space_file_narrows(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("micro_batch_size: [4, 8]\ncompile_mode: none\n")
    space = build_space(BASELINE, CPU6, 1000, space_file=path)
    assert space.domains["micro_batch_size"] == (4, 8)
    assert space.domains["compile_mode"] == ("none",)
    for _, config in sample(space, 50):
        assert config.micro_batch_size in (4, 8) and config.effective_batch_size == 32
        assert config.compile_mode == "none"


def test_micro_batches_of_which_none_keeps_the_effective_batch_are_refused(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("micro_batch_size: [2, 4]\n")
    with pytest.raises(SpaceError, match="no micro_batch_size keeps the effective batch at 7"):
        build_space(BASELINE, CPU6, 1000, global_batch=7, space_file=path)


def test_fix_picks_one_of_the_space_files_values(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("precision: [fp32, bf16]\n")
    space = build_space(BASELINE, CPU6, 1000, space_file=path, fixes={"precision": "fp32"})
    assert space.domains["precision"] == ("fp32",)


@pytest.mark.parametrize(("listed", "fix"), [("micro_batch_size: [8, 16]", "micro_batch_size=32"),
                                             ("precision: bf16", "precision=fp32")])
def test_fix_outside_the_space_files_list_names_both(tmp_path, listed, fix):
    path = tmp_path / "space.yaml"
    path.write_text(listed + "\n")
    knob, value = fix.split("=")
    with pytest.raises(SpaceError) as raised:
        build_space(BASELINE, CPU6, 1000, space_file=path, fixes={knob: value})
    message = str(raised.value)
    assert f"--fix {fix}" in message and str(path) in message
    assert str(load_space_file(path)[knob]) in message


def test_load_space_file_types_values(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("precision: bf16\npin_memory: 'false'\nprefetch_factor: [none, '4', 2]\n"
                    "num_workers: ['2', 4]\n")
    assert load_space_file(path) == {"precision": ["bf16"], "pin_memory": [False],
                                     "prefetch_factor": [None, 4, 2], "num_workers": [2, 4]}


def test_space_without_workers_switches_the_loader_knobs_off():
    space = build_space(BASELINE, CPU6, 1000, fixes={"num_workers": 0})
    assert space.domains["prefetch_factor"] == (None,)
    assert space.domains["persistent_workers"] == (False,)


# --- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"fixes": {"foo": 1}}, "--fix foo=1: unknown knob 'foo'"),
    ({"fixes": {"precision": "fp8"}}, "precision must be one of fp32, tf32, bf16, fp16, "
                                      "fp8_tensorwise, fp8_rowwise; got 'fp8'"),
    ({"fixes": {"precision": "fp16"}}, "--fix precision=fp16: not on this device: fp16 needs"),
    ({"fixes": {"pin_memory": True}},
     "--fix pin_memory=True: not on this device: pinned memory only speeds up copies to a CUDA "
     "device"),
    ({"fixes": {"micro_batch_size": 7}}, "micro_batch_size=7 does not divide 32"),
    ({"fixes": {"micro_batch_size": 0}}, "micro_batch_size must be a positive integer"),
    ({"fixes": {"grad_accum_steps": 5}}, "grad_accum_steps=5 does not divide 32"),
    ({"fixes": {"micro_batch_size": 8, "grad_accum_steps": 2}},
     "micro_batch_size=8 needs grad_accum_steps=4"),
    ({"global_batch": 64, "fixes": {"micro_batch_size": 128}},
     "micro_batch_size=128 does not divide 64"),
    ({"free_batch": (16, 64), "fixes": {"grad_accum_steps": 100}},
     "no micro_batch_size puts the effective batch in --free-batch-size 16:64"),
    ({"fixes": {"num_workers": 0, "prefetch_factor": 4}},
     "prefetch_factor is narrowed to [4], but it means something only when num_workers > 0"),
])
def test_bad_input_is_a_space_error(kwargs, message):
    with pytest.raises(SpaceError, match=re.escape(message)):
        build_space(BASELINE, CPU6, 1000, **kwargs)


def test_micro_batch_larger_than_dataset_is_refused():
    with pytest.raises(SpaceError, match="more than the dataset's 20 samples"):
        build_space(BASELINE, CPU6, 20, fixes={"micro_batch_size": 32})


def test_empty_dataset_is_refused():
    with pytest.raises(SpaceError, match="at least one sample"):
        build_space(BASELINE, CPU6, 0)


@pytest.mark.parametrize("text, message", [
    ("foo: [1]\n", "unknown knob 'foo'"),
    ("compile_mode: [none, turbo]\n", "compile_mode must be one of"),
    ("precision: [fp32, fp16]\n", "precision=fp16: not on this device: fp16 needs"),
    ("micro_batch_size: [5, 7]\n", "micro_batch_size=5 does not divide 32; micro_batch_size=7"),
    ("precision: []\n", "precision: lists no values"),
    ("- fp32\n- bf16\n", "must be a mapping of knob"),
    ("", "must be a mapping of knob"),
    ("precision: [fp32\n", "is not valid YAML"),
    ("num_workers: [true]\n", "num_workers must be an integer"),
])
def test_bad_space_file_is_a_space_error(tmp_path, text, message):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError, match=re.escape(message)):
        build_space(BASELINE, CPU6, 1000, space_file=path)


def test_missing_space_file_is_a_space_error(tmp_path):
    with pytest.raises(SpaceError, match="space file not found"):
        load_space_file(tmp_path / "absent.yaml")


def test_free_batch_with_several_grad_accum_values_is_refused(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("grad_accum_steps: [1, 2]\n")
    with pytest.raises(SpaceError, match="fix it to one value"):
        build_space(BASELINE, CPU6, 1000, free_batch=(16, 64), space_file=path)


# --- Optuna's view of the space -------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [{}, {"free_batch": (16, 64)}])
@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_optuna_accepts_the_space_across_trials(kwargs, sampler):
    space = build_space(BASELINE, H100, 1000, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        chosen = (optuna.samplers.RandomSampler(seed=0) if sampler == "random" else
                  optuna.samplers.TPESampler(seed=0, multivariate=True, group=True,
                                             n_startup_trials=10))
    # a categorical whose choices changed between trials would raise here
    for _, config in sample(space, 100, chosen):
        assert space.contains(config)


def test_describe_is_json():
    space = build_space(BASELINE, CPU6, 1000, free_batch=(16, 64))
    summary = json.loads(json.dumps(space.describe()))
    assert summary["mode"] == "free-batch"
    assert summary["batch_range"] == [16, 64]
    assert summary["grad_accum_steps"]["8"] == [2, 8]
    assert summary["size"] == space.size()
    assert summary["baseline_in_space"] is True


def test_fast_corner_takes_each_knobs_usually_fastest_value_the_device_offers():
    cpu = build_space(BASELINE, CPU6, 1000).fast_corner(16)
    assert (cpu.micro_batch_size, cpu.grad_accum_steps) == (16, 2)  # effective batch kept
    assert (cpu.precision, cpu.activation_checkpointing, cpu.optimizer_impl) == \
        ("bf16", "none", "fused")
    assert (cpu.num_workers, cpu.compile_mode) == (BASELINE.num_workers, BASELINE.compile_mode)
    old_gpu = build_space(BASELINE, V100, 1000).fast_corner(8)  # no bf16, no fused AdamW
    assert (old_gpu.precision, old_gpu.optimizer_impl) == ("fp16", "foreach")
    fixed = build_space(BASELINE, H100, 1000, fixes={"precision": "fp32"}).fast_corner(32)
    assert fixed.precision == "fp32" and fixed.grad_accum_steps == 1
    free = build_space(BASELINE, CPU6, 1000, free_batch=(16, 64)).fast_corner(4)
    assert free.grad_accum_steps == 8  # the baseline's 32 samples per step, within range
