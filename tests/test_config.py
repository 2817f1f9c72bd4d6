"""`TrainConfig`: defaults, validation, files, `--set` parsing, and what a CPU can run."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import yaml

from autotune.config import (
    TrainConfig,
    changes,
    from_baseline,
    knob_names,
    parse_assignments,
    taken_back,
)
from autotune.errors import ConfigError
from autotune.hardware import describe, unsupported_reason

ALL_KNOBS = ("micro_batch_size", "grad_accum_steps", "precision", "activation_checkpointing",
             "optimizer", "optimizer_impl", "num_workers", "prefetch_factor", "pin_memory",
             "persistent_workers", "compile_mode", "memory_format", "attention_backend",
             "parallelism",
             "ddp_bucket_cap_mb",
             "ddp_static_graph", "ddp_gradient_as_bucket_view", "fsdp_reshard_after_forward",
             "fsdp_reduce_dtype")


# --- defaults and BASELINE -------------------------------------------------------------------

def test_knob_names_are_the_documented_ones():
    assert tuple(knob_names()) == ALL_KNOBS


def test_an_optimizer_other_than_adamw_has_no_implementation_knob():
    with pytest.raises(ConfigError, match="optimizer_impl needs optimizer=adamw"):
        TrainConfig(optimizer="adafactor", optimizer_impl="fused")
    # a baseline that trains with Adafactor on CUDA does not get AdamW's foreach default
    config = from_baseline({"optimizer": "adafactor"}, "cuda")
    assert (config.optimizer, config.optimizer_impl) == ("adafactor", "for_loop")
    # setting a knob puts the knobs that then mean nothing at their value otherwise
    switched = TrainConfig(optimizer_impl="fused").setting("optimizer", "adamw_8bit")
    assert (switched.optimizer, switched.optimizer_impl) == ("adamw_8bit", "for_loop")


def test_from_baseline_none_gives_pytorch_defaults_on_cpu():
    config = from_baseline(None, "cpu")
    assert config.precision == "fp32"
    assert config.activation_checkpointing == "none"
    assert config.optimizer_impl == "for_loop"
    assert config.num_workers == 0
    assert config.prefetch_factor is None
    assert config.pin_memory is False
    assert config.persistent_workers is False
    assert config.compile_mode == "none"
    assert config.micro_batch_size == 1
    assert config.grad_accum_steps == 1
    assert config.effective_batch_size == 1


def test_from_baseline_defaults_to_foreach_on_cuda():
    # AdamW picks foreach on CUDA when not told, so the user's baseline is foreach there.
    assert from_baseline(None, "cuda").optimizer_impl == "foreach"
    assert from_baseline({}, "cuda").optimizer_impl == "foreach"


def test_baseline_values_override_defaults():
    baseline = {"micro_batch_size": 16, "grad_accum_steps": 4, "precision": "bf16",
                "optimizer_impl": "fused", "num_workers": 2, "prefetch_factor": 3}
    config = from_baseline(baseline, "cuda")
    assert {k: getattr(config, k) for k in baseline} == baseline
    assert config.effective_batch_size == 64
    # knobs the baseline leaves out keep their defaults
    assert config.activation_checkpointing == "none"
    assert config.compile_mode == "none"


def test_unknown_knob_in_baseline_names_it_and_lists_valid_knobs():
    with pytest.raises(ConfigError) as info:
        from_baseline({"micro_batch_size": 8, "batch_size": 8}, "cpu")
    message = str(info.value)
    assert "batch_size" in message
    assert "unknown knob" in message
    for knob in ALL_KNOBS:
        assert knob in message


def test_replace_rejects_unknown_knob_and_revalidates():
    config = TrainConfig(micro_batch_size=4)
    assert config.replace(precision="bf16").precision == "bf16"
    assert config.precision == "fp32"  # frozen: replace makes a new one
    with pytest.raises(ConfigError, match="lr"):
        config.replace(lr=1e-3)
    with pytest.raises(ConfigError, match="micro_batch_size"):
        config.replace(micro_batch_size=0)


# --- validation ------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"prefetch_factor": 2}, "prefetch_factor needs num_workers > 0"),
        ({"persistent_workers": True}, "persistent_workers needs num_workers > 0"),
        ({"micro_batch_size": 0}, "micro_batch_size must be a positive integer"),
        ({"micro_batch_size": 2.5}, "micro_batch_size must be a positive integer"),
        ({"micro_batch_size": "8"}, "micro_batch_size must be a positive integer"),
        ({"micro_batch_size": True}, "micro_batch_size must be a positive integer"),
        ({"grad_accum_steps": -1}, "grad_accum_steps must be a positive integer"),
        ({"num_workers": -1}, "num_workers must be >= 0"),
        ({"num_workers": 1, "prefetch_factor": 0}, "prefetch_factor must be >= 1"),
        ({"pin_memory": "yes"}, "pin_memory must be true or false"),
        ({"optimizer_impl": "sgd"}, "optimizer_impl must be one of for_loop, foreach, fused"),
        ({"compile_mode": "fast"}, "compile_mode must be one of none, default"),
    ],
)
def test_invalid_values_raise_config_error_with_specific_message(changes, expected):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**changes)
    assert expected in str(info.value)


def test_bad_precision_lists_the_choices():
    with pytest.raises(ConfigError) as info:
        TrainConfig(precision="int8")
    message = str(info.value)
    assert "precision" in message and "'int8'" in message
    for choice in ("fp32", "tf32", "bf16", "fp16"):
        assert choice in message


def test_prefetch_and_persistent_workers_are_valid_with_workers():
    config = TrainConfig(num_workers=2, prefetch_factor=4, persistent_workers=True)
    assert config.problems() == []


def test_all_problems_are_reported_at_once():
    with pytest.raises(ConfigError) as info:
        TrainConfig(micro_batch_size=0, num_workers=-2, precision="half")
    message = str(info.value)
    assert "micro_batch_size" in message
    assert "num_workers" in message
    assert "precision" in message


# --- files -----------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
def test_save_load_round_trip(tmp_path, suffix):
    config = TrainConfig(micro_batch_size=12, grad_accum_steps=3, precision="bf16",
                         activation_checkpointing="selective", optimizer_impl="fused",
                         num_workers=2, prefetch_factor=4, pin_memory=True,
                         persistent_workers=True, compile_mode="max-autotune")
    path = config.save(tmp_path / f"best{suffix}")
    assert path.is_file()
    assert TrainConfig.load(path) == config
    # the prefetch_factor=None default survives a round trip as well
    plain = TrainConfig()
    assert TrainConfig.load(plain.save(tmp_path / f"plain{suffix}")) == plain


def test_json_file_is_real_json_and_yaml_file_is_yaml(tmp_path):
    config = TrainConfig(micro_batch_size=8, precision="bf16")
    json_data = json.loads(config.save(tmp_path / "c.json").read_text())
    assert json_data == config.to_dict()
    yaml_text = config.save(tmp_path / "c.yaml").read_text()
    assert not yaml_text.lstrip().startswith("{")
    assert yaml.safe_load(yaml_text) == config.to_dict()


def test_load_partial_file_fills_from_base(tmp_path):
    path = tmp_path / "partial.yaml"
    path.write_text("precision: bf16\nnum_workers: 2\n")
    base = TrainConfig(micro_batch_size=32, grad_accum_steps=2, optimizer_impl="foreach")
    config = TrainConfig.load(path, base)
    assert config == dataclasses.replace(base, precision="bf16", num_workers=2)
    # without a base, the rest are the plain defaults
    assert TrainConfig.load(path) == TrainConfig(precision="bf16", num_workers=2)


def test_load_empty_file_gives_base(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    base = TrainConfig(micro_batch_size=5)
    assert TrainConfig.load(path, base) == base


def test_load_malformed_yaml_is_config_error(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("precision: [bf16\nnum_workers: 2\n")
    with pytest.raises(ConfigError, match="not valid YAML/JSON"):
        TrainConfig.load(path)


def test_load_missing_file_is_config_error(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="config file not found") as info:
        TrainConfig.load(path)
    assert "nope.yaml" in str(info.value)


def test_load_non_mapping_is_config_error(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- precision\n- bf16\n")
    with pytest.raises(ConfigError, match="mapping"):
        TrainConfig.load(path)


def test_load_file_with_unknown_and_non_string_keys_is_config_error(tmp_path):
    path = tmp_path / "odd.yaml"
    path.write_text("precision: bf16\n8: micro_batch_size\nbatchsize: 4\n")
    with pytest.raises(ConfigError) as info:
        TrainConfig.load(path)
    message = str(info.value)
    assert "8" in message and "batchsize" in message
    assert "micro_batch_size" in message


def test_load_invalid_value_in_file_is_config_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"micro_batch_size": 0}))
    with pytest.raises(ConfigError, match="micro_batch_size must be a positive integer"):
        TrainConfig.load(path)


# --- --set knob=value --------------------------------------------------------------------------

def test_parse_assignments_types_values():
    values = parse_assignments(["micro_batch_size=32", "pin_memory=true",
                                "prefetch_factor=none", "precision=bf16"])
    assert values == {"micro_batch_size": 32, "pin_memory": True, "prefetch_factor": None,
                      "precision": "bf16"}
    assert type(values["micro_batch_size"]) is int
    assert type(values["pin_memory"]) is bool
    # and they make a valid configuration
    assert TrainConfig.from_dict(values).micro_batch_size == 32


@pytest.mark.parametrize(
    ("text", "expected"),
    [("false", False), ("False", False), ("0", False), ("off", False), ("no", False),
     ("TRUE", True), ("1", True), ("yes", True), ("on", True)],
)
def test_parse_assignments_bool_spellings(text, expected):
    assert parse_assignments([f"persistent_workers={text}"]) == {"persistent_workers": expected}


def test_parse_assignments_strips_whitespace_and_int_prefetch():
    assert parse_assignments([" num_workers = 4 ", "prefetch_factor=2"]) == {
        "num_workers": 4, "prefetch_factor": 2}


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("pin_memory=maybe", "pin_memory must be true or false"),
        ("micro_batch_size=big", "micro_batch_size must be an integer"),
        ("micro_batch_size=3.5", "micro_batch_size must be an integer"),
        ("micro_batch_size=none", "micro_batch_size must be an integer"),
        ("batch_size=32", "unknown knob(s) batch_size"),
        ("micro_batch_size", "expected knob=value"),
        ("=32", "expected knob=value"),
    ],
)
def test_parse_assignments_errors(item, expected):
    with pytest.raises(ConfigError) as info:
        parse_assignments([item])
    assert expected in str(info.value)


# --- what a CPU can run ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def cpu_info():
    return describe(torch.device("cpu"))


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"precision": "fp16"}, "fp16"),
        ({"precision": "tf32"}, "tf32"),
        ({"pin_memory": True}, "pin_memory"),
        ({"compile_mode": "reduce-overhead"}, "reduce-overhead"),
        ({"compile_mode": "max-autotune"}, "max-autotune"),
    ],
)
def test_cpu_rejects_cuda_only_knobs(cpu_info, changes, expected):
    reason = unsupported_reason(TrainConfig(**changes), cpu_info)
    assert reason is not None
    assert expected in reason


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"precision": "bf16"},
        {"optimizer_impl": "fused"},
        {"optimizer_impl": "foreach"},
        {"optimizer_impl": "for_loop"},
        {"compile_mode": "default"},
        {"compile_mode": "max-autotune-no-cudagraphs"},
        {"activation_checkpointing": "full"},
    ],
)
def test_cpu_accepts_cpu_knobs(cpu_info, changes):
    assert unsupported_reason(TrainConfig(**changes), cpu_info) is None


def test_workers_above_cpu_count_run(cpu_info):
    """A DataLoader that waits on storage is fed by more workers than there are cores (a
    waiting worker takes no CPU): the device refuses no worker count."""
    assert cpu_info.type == "cpu"
    more = TrainConfig(num_workers=4 * cpu_info.cpu_count)
    assert unsupported_reason(more, cpu_info) is None


def test_a_configuration_changes_the_batch_and_the_loader_as_one_change_each():
    """Micro-batch and accumulation are one change, the DataLoader's settings another; every
    other knob is one of its own. Taking one back sets its knobs to the baseline's."""
    base = TrainConfig(micro_batch_size=8, grad_accum_steps=4)
    best = base.replace(micro_batch_size=32, grad_accum_steps=1, num_workers=2,
                        prefetch_factor=4, persistent_workers=True, precision="bf16",
                        compile_mode="default")
    assert changes(best, base) == [("micro_batch_size", "grad_accum_steps"), ("precision",),
                                   ("num_workers", "prefetch_factor", "persistent_workers",
                                    "pin_memory"), ("compile_mode",)]
    assert taken_back(best, ("micro_batch_size", "grad_accum_steps"), base) == \
        best.replace(micro_batch_size=8, grad_accum_steps=4)
    assert taken_back(best, changes(best, base)[2], base) == \
        best.replace(num_workers=0, prefetch_factor=None, persistent_workers=False)
    assert changes(base, base) == []


def test_a_knob_that_moved_with_its_parent_is_the_parents_change():
    """Adafactor in place of foreach AdamW: the implementation means nothing beside Adafactor,
    so the optimizer is one change, and taking it back brings AdamW's implementation back."""
    base = TrainConfig(optimizer_impl="foreach")
    other = base.replace(optimizer="adafactor", optimizer_impl="for_loop", precision="bf16")
    assert changes(other, base) == [("precision",), ("optimizer",)]
    assert taken_back(other, ("optimizer",), base) == base.replace(precision="bf16")
