"""`TrainConfig`: every training knob autotune can turn, one name each, used everywhere.

The same names appear on the CLI (`--set knob=value`), as Optuna parameters, and in the
exported files, so a configuration moves between them without translation.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import ConfigError

# fp8_*: torchao's float8 training of the large linear layers (tensorwise or rowwise scales),
# everything else under bf16 autocast; on GPUs of compute capability 8.9+, with torch.compile.
FP8_PRECISIONS = ("fp8_tensorwise", "fp8_rowwise")
# Attention kernels CUDA has for 16-bit floats only (and float8's bf16 around its linears).
HALF_ONLY_ATTENTION = ("flash", "cudnn")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", *FP8_PRECISIONS)
CHECKPOINTING = ("none", "selective", "full")
# The optimizer itself: AdamW, or one that keeps less state (torch's Adafactor, bitsandbytes'
# 8-bit AdamW) and so buys a larger micro-batch. A change of what the model learns: searched
# only with --allow-optimizer-change.
OPTIMIZERS = ("adamw", "adafactor", "adamw_8bit")
OPTIMIZER_IMPLS = ("for_loop", "foreach", "fused")
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
# How the ranks of a process group share the model: one process needs none; under several,
# DistributedDataParallel (a whole copy per rank) or FSDP2 (`fully_shard`: parameters sharded).
# channels_last: convolutions' tensors stored NHWC (NDHWC in 3-D), as cuDNN's and oneDNN's
# fastest kernels read them; offered only to models with 2-D or 3-D convolutions.
MEMORY_FORMATS = ("contiguous", "channels_last")
# The kernel behind `scaled_dot_product_attention` (`torch.nn.attention.sdpa_kernel`); auto is
# PyTorch's own choice. Offered only to models that call it.
ATTENTION_BACKENDS = ("auto", "flash", "efficient", "cudnn", "math")
PARALLELISMS = ("none", "ddp", "fsdp")
REDUCE_DTYPES = ("fp32", "bf16")

CHOICES: dict[str, tuple[str, ...]] = {
    "precision": PRECISIONS,
    "activation_checkpointing": CHECKPOINTING,
    "optimizer": OPTIMIZERS,
    "optimizer_impl": OPTIMIZER_IMPLS,
    "compile_mode": COMPILE_MODES,
    "memory_format": MEMORY_FORMATS,
    "attention_backend": ATTENTION_BACKENDS,
    "parallelism": PARALLELISMS,
    "fsdp_reduce_dtype": REDUCE_DTYPES,
}

# What a configuration file autotune wrote may say beside the knobs (best.json's sentence on
# what the study found, and what it checked of the answer beyond its speed): not knobs, and
# left out when the file is read.
VERDICT = "verdict"
CHECKS = "checks"


@dataclass(frozen=True)
class Condition:
    """When a knob means something (`needs`, in words, and as a test of the knobs before it),
    and the value it takes otherwise."""

    needs: str
    holds: Callable[[Mapping[str, Any]], bool]
    otherwise: Any


def _workers(v: Mapping[str, Any]) -> bool:
    return v["num_workers"] > 0


def _adamw(v: Mapping[str, Any]) -> bool:
    return v["optimizer"] == "adamw"


def _ddp(v: Mapping[str, Any]) -> bool:
    return v["parallelism"] == "ddp"


def _fsdp(v: Mapping[str, Any]) -> bool:
    return v["parallelism"] == "fsdp"


def _fsdp_bf16(v: Mapping[str, Any]) -> bool:
    return v["parallelism"] == "fsdp" and v["precision"] == "bf16"


# Knobs that mean something only given others (each after those in the field order), and the
# value they take where they mean nothing.
CONDITIONS: dict[str, Condition] = {
    "optimizer_impl": Condition("optimizer=adamw", _adamw, "for_loop"),
    "prefetch_factor": Condition("num_workers > 0", _workers, None),
    "persistent_workers": Condition("num_workers > 0", _workers, False),
    "ddp_bucket_cap_mb": Condition("parallelism=ddp", _ddp, 25),
    "ddp_static_graph": Condition("parallelism=ddp", _ddp, False),
    "ddp_gradient_as_bucket_view": Condition("parallelism=ddp", _ddp, False),
    "fsdp_reshard_after_forward": Condition("parallelism=fsdp", _fsdp, True),
    "fsdp_reduce_dtype": Condition("parallelism=fsdp and precision=bf16 (parameters in bf16)",
                                   _fsdp_bf16, "fp32"),
}
# The knobs only a process group of several ranks has.
DISTRIBUTED_KNOBS = ("parallelism", "ddp_bucket_cap_mb", "ddp_static_graph",
                     "ddp_gradient_as_bucket_view", "fsdp_reshard_after_forward",
                     "fsdp_reduce_dtype")


@dataclass(frozen=True)
class TrainConfig:
    """One training configuration. Defaults are what PyTorch does when nothing is said."""

    micro_batch_size: int = 1
    grad_accum_steps: int = 1
    precision: str = "fp32"
    activation_checkpointing: str = "none"
    optimizer: str = "adamw"
    optimizer_impl: str = "for_loop"
    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    compile_mode: str = "none"
    memory_format: str = "contiguous"
    attention_backend: str = "auto"
    parallelism: str = "none"
    ddp_bucket_cap_mb: int = 25
    ddp_static_graph: bool = False
    ddp_gradient_as_bucket_view: bool = False
    fsdp_reshard_after_forward: bool = True
    fsdp_reduce_dtype: str = "fp32"

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigError("invalid configuration: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Every reason this configuration is invalid on any device (empty when valid)."""
        values = self.to_dict()
        out = value_problems(values)
        if out:
            return out
        for knob, condition in CONDITIONS.items():
            if values[knob] != condition.otherwise and not condition.holds(values):
                out.append(f"{knob} needs {condition.needs} (it is {values[knob]!r} here)")
        return out

    def distributed(self) -> dict[str, Any]:
        """The knobs of a process group that mean something here (none for one process)."""
        values = self.to_dict()
        return {k: values[k] for k in DISTRIBUTED_KNOBS if self.parallelism != "none" and
                (k not in CONDITIONS or CONDITIONS[k].holds(values))}

    def setting(self, knob: str, value: Any) -> TrainConfig:
        """This configuration with `knob` at `value`, and each knob that then means nothing
        (`CONDITIONS`) at the value it takes otherwise."""
        values = {**self.to_dict(), knob: value}
        for name, condition in CONDITIONS.items():
            if not condition.holds(values):
                values[name] = condition.otherwise
        return TrainConfig(**values)

    @property
    def effective_batch_size(self) -> int:
        """Samples per optimizer step: what the model's training dynamics depend on."""
        return self.micro_batch_size * self.grad_accum_steps

    def replace(self, **changes: Any) -> TrainConfig:
        unknown = set(changes) - set(knob_names())
        if unknown:
            raise ConfigError(_unknown_message(unknown))
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base: TrainConfig | None = None) -> TrainConfig:
        """Build from a mapping of knob values; knobs it leaves out come from `base`."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"a configuration must be a mapping of knob: value, got {data!r}")
        unknown = set(data) - set(knob_names())
        if unknown:
            raise ConfigError(_unknown_message(unknown))
        values = (base or cls()).to_dict()
        values.update(data)
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def save(self, path: str | Path) -> Path:
        """Write as YAML or JSON, chosen by the file's suffix."""
        path = Path(path)
        text = self.to_json() if path.suffix == ".json" else self.to_yaml()
        path.write_text(text)
        return path

    @classmethod
    def load(cls, path: str | Path, base: TrainConfig | None = None) -> TrainConfig:
        """Read a YAML or JSON file (JSON is YAML, so one parser serves both)."""
        return cls.from_dict(knobs_in(read_yaml(path, "config") or {}), base)


def value_problems(values: Mapping[str, Any]) -> list[str]:
    """What is wrong with each knob value on its own, for the knobs `values` holds (a knob
    that needs another, like prefetch_factor needing workers, is `TrainConfig.problems`')."""
    out = []
    for name in ("micro_batch_size", "grad_accum_steps", "ddp_bucket_cap_mb"):
        value = values.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            out.append(f"{name} must be a positive integer, got {value!r}")
    workers = values.get("num_workers", 0)
    if isinstance(workers, bool) or not isinstance(workers, int):
        out.append(f"num_workers must be an integer, got {workers!r}")
    elif workers < 0:
        out.append(f"num_workers must be >= 0, got {workers}")
    for name, choices in CHOICES.items():
        if name in values and values[name] not in choices:
            out.append(f"{name} must be one of {', '.join(choices)}; got {values[name]!r}")
    for name in ("pin_memory", "persistent_workers", "ddp_static_graph",
                 "ddp_gradient_as_bucket_view", "fsdp_reshard_after_forward"):
        if not isinstance(values.get(name, False), bool):
            out.append(f"{name} must be true or false, got {values[name]!r}")
    prefetch = values.get("prefetch_factor")
    if prefetch is not None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int):
            out.append(f"prefetch_factor must be an integer, got {prefetch!r}")
        elif prefetch < 1:
            out.append(f"prefetch_factor must be >= 1, got {prefetch}")
    return out


def read_yaml(path: str | Path, kind: str, error: type[ConfigError] = ConfigError) -> Any:
    """Parse a YAML (or JSON) file the user named, every failure one `error` message."""
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise error(f"{kind} file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {kind} file {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"{kind} file {path} is not valid YAML/JSON: {exc}") from None


# What makes each conditional knob mean something, for `config_with`.
_ENABLING: dict[str, dict[str, Any]] = {
    "optimizer_impl": {"optimizer": "adamw"},
    "prefetch_factor": {"num_workers": 1}, "persistent_workers": {"num_workers": 1},
    "ddp_bucket_cap_mb": {"parallelism": "ddp"}, "ddp_static_graph": {"parallelism": "ddp"},
    "ddp_gradient_as_bucket_view": {"parallelism": "ddp"},
    "fsdp_reshard_after_forward": {"parallelism": "fsdp"},
    "fsdp_reduce_dtype": {"parallelism": "fsdp", "precision": "bf16"},
}


def config_with(knob: str, value: Any) -> TrainConfig:
    """The default configuration but for `knob` (and what makes it mean something, where it
    needs another knob), so that any complaint about it is about `value`."""
    # float8 runs only compiled (torchao's kernels are Triton's), so its precisions are asked
    # of the device with compile on; flash and cuDNN attention in bf16, the only way they run
    enabling = {"compile_mode": "default"} if value in FP8_PRECISIONS else \
        {"precision": "bf16"} if knob == "attention_backend" and value in HALF_ONLY_ATTENTION \
        else {}
    return TrainConfig(**{**_ENABLING.get(knob, {}), **enabling, knob: value})


# Knobs that change the numbers a step computes, not only how fast it runs or in how much
# memory: a configuration that changes any is checked for its loss against the baseline's
# (`search/checks`).
NUMERICS = ("precision", "optimizer", "attention_backend", "compile_mode")


def numerics_changes(config: TrainConfig, baseline: TrainConfig) -> list[str]:
    """The knobs of `NUMERICS` `config` changes from the baseline."""
    return [knob for knob in NUMERICS if getattr(config, knob) != getattr(baseline, knob)]


# Knobs a person changes together, each group one change: the micro-batch with its accumulation,
# and the DataLoader's settings. Every other knob is a change of its own.
CHANGE_GROUPS = (("micro_batch_size", "grad_accum_steps"),
                 ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory"))


def changes(config: TrainConfig, baseline: TrainConfig) -> list[tuple[str, ...]]:
    """What `config` changes from `baseline`, one change each (`CHANGE_GROUPS`), in the knobs'
    order: what the confirmation takes back one at a time. A knob that means nothing in one of
    the two (`CONDITIONS`: AdamW's implementation beside another optimizer) moved with its
    parent, and is that change's, not one of its own."""
    mine, base = config.to_dict(), baseline.to_dict()
    grouped = {knob: group for group in CHANGE_GROUPS for knob in group}
    out: list[tuple[str, ...]] = []
    for knob in knob_names():
        group = grouped.get(knob, (knob,))
        if mine[knob] == base[knob] or group in out:
            continue
        if knob not in grouped and knob in CONDITIONS and \
                not (CONDITIONS[knob].holds(mine) and CONDITIONS[knob].holds(base)):
            continue
        out.append(group)
    return out


def taken_back(config: TrainConfig, change: Sequence[str], baseline: TrainConfig) -> TrainConfig:
    """`config` with one of its `changes` set back to the baseline's values: a knob that then
    means nothing at the value it takes otherwise, and one that means something again (its
    parent taken back) at the baseline's."""
    mine, base = config.to_dict(), baseline.to_dict()
    values = {**mine, **{knob: base[knob] for knob in change}}
    for name, condition in CONDITIONS.items():
        if not condition.holds(values):
            values[name] = condition.otherwise
        elif not condition.holds(mine):
            values[name] = base[name]
    return TrainConfig(**values)


def loader_settings(domains: Mapping[str, Sequence[Any]]) -> list[tuple[int, int | None]]:
    """Every (num_workers, prefetch_factor) of a space; prefetch means nothing without workers."""
    return [(w, p) for w in domains["num_workers"]
            for p in ((None,) if w == 0 else domains["prefetch_factor"])]


def knobs_in(data: Any) -> Any:
    """A configuration file's mapping less what autotune wrote beside the knobs."""
    return {k: v for k, v in data.items() if k not in (VERDICT, CHECKS)} \
        if isinstance(data, Mapping) else data


def knob_names() -> list[str]:
    return [f.name for f in fields(TrainConfig)]


def _unknown_message(unknown: Iterable[Any]) -> str:
    # str(): a YAML file can have non-string keys (`8: ...`), which must not crash the message
    return (f"unknown knob(s) {', '.join(sorted(map(str, unknown)))}; the knobs are: "
            f"{', '.join(knob_names())}")


def default_optimizer_impl(device_type: str) -> str:
    """What `torch.optim.AdamW()` picks when not told: foreach on CUDA, a for-loop elsewhere."""
    return "foreach" if device_type == "cuda" else "for_loop"


def from_baseline(baseline: Mapping[str, Any] | None, device_type: str,
                  world_size: int = 1) -> TrainConfig:
    """The user's own settings (`BASELINE`), with PyTorch's defaults for what it leaves out:
    under several ranks, DistributedDataParallel (what a torchrun script wraps its model in)."""
    base = TrainConfig(optimizer_impl=default_optimizer_impl(device_type),
                       parallelism="ddp" if world_size > 1 else "none")
    if (baseline or {}).get("optimizer", "adamw") != "adamw":
        base = base.replace(optimizer_impl=CONDITIONS["optimizer_impl"].otherwise)
    return TrainConfig.from_dict(baseline or {}, base)


def parse_value(knob: str, text: str) -> Any:
    """Turn the text of `--set knob=value` into the knob's type, with a clear error."""
    if knob not in knob_names():
        raise ConfigError(_unknown_message([knob]))
    field_type = {f.name: f.type for f in fields(TrainConfig)}[knob]
    if "bool" in field_type:
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{knob} must be true or false, got {text!r}")
    if "int" in field_type:
        if "None" in field_type and text.strip().lower() in ("none", "null", ""):
            return None
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{knob} must be an integer, got {text!r}") from None
    return text.strip()


def parse_assignments(items: Iterable[str]) -> dict[str, Any]:
    """Parse `knob=value` strings (from `--set`) into typed knob values."""
    out: dict[str, Any] = {}
    for item in items:
        knob, sep, text = item.partition("=")
        if not sep or not knob.strip():
            raise ConfigError(f"expected knob=value, got {item!r}")
        out[knob.strip()] = parse_value(knob.strip(), text)
    return out
