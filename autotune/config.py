"""`TrainConfig`: every training knob autotune can turn, one name each, used everywhere.

The same names appear on the CLI (`--set knob=value`), as Optuna parameters, and in the
exported files, so a configuration moves between them without translation.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
CHECKPOINTING = ("none", "selective", "full")
OPTIMIZER_IMPLS = ("for_loop", "foreach", "fused")
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")

CHOICES: dict[str, tuple[str, ...]] = {
    "precision": PRECISIONS,
    "activation_checkpointing": CHECKPOINTING,
    "optimizer_impl": OPTIMIZER_IMPLS,
    "compile_mode": COMPILE_MODES,
}


class ConfigError(ValueError):
    """A configuration that is malformed or contradicts itself: bad input, not a failed trial."""


@dataclass(frozen=True)
class TrainConfig:
    """One training configuration. Defaults are what PyTorch does when nothing is said."""

    micro_batch_size: int = 1
    grad_accum_steps: int = 1
    precision: str = "fp32"
    activation_checkpointing: str = "none"
    optimizer_impl: str = "for_loop"
    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False
    compile_mode: str = "none"

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigError("invalid configuration: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Every reason this configuration is invalid on any device (empty when valid)."""
        out = []
        for name in ("micro_batch_size", "grad_accum_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                out.append(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int):
            out.append(f"num_workers must be an integer, got {self.num_workers!r}")
        elif self.num_workers < 0:
            out.append(f"num_workers must be >= 0, got {self.num_workers}")
        for name, choices in CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                out.append(f"{name} must be one of {', '.join(choices)}; got {value!r}")
        for name in ("pin_memory", "persistent_workers"):
            if not isinstance(getattr(self, name), bool):
                out.append(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.prefetch_factor is not None:
            if isinstance(self.prefetch_factor, bool) or not isinstance(self.prefetch_factor, int):
                out.append(f"prefetch_factor must be an integer, got {self.prefetch_factor!r}")
            elif self.prefetch_factor < 1:
                out.append(f"prefetch_factor must be >= 1, got {self.prefetch_factor}")
            elif self.num_workers == 0:
                out.append("prefetch_factor needs num_workers > 0 (the main process does not "
                           "prefetch)")
        if self.persistent_workers is True and self.num_workers == 0:
            out.append("persistent_workers needs num_workers > 0")
        return out

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
        return cls.from_dict(read_yaml(path, "config") or {}, base)


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


def knob_names() -> list[str]:
    return [f.name for f in fields(TrainConfig)]


def _unknown_message(unknown: Iterable[Any]) -> str:
    # str(): a YAML file can have non-string keys (`8: ...`), which must not crash the message
    return (f"unknown knob(s) {', '.join(sorted(map(str, unknown)))}; the knobs are: "
            f"{', '.join(knob_names())}")


def default_optimizer_impl(device_type: str) -> str:
    """What `torch.optim.AdamW()` picks when not told: foreach on CUDA, a for-loop elsewhere."""
    return "foreach" if device_type == "cuda" else "for_loop"


def from_baseline(baseline: Mapping[str, Any] | None, device_type: str) -> TrainConfig:
    """The user's own settings (`BASELINE`), with PyTorch's defaults for what it leaves out."""
    base = TrainConfig(optimizer_impl=default_optimizer_impl(device_type))
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


# --- exporters: the measured configuration in the form a user's trainer takes ---------------

EXPORT_FORMATS = ("yaml", "json", "hf", "lightning", "torch")

LIGHTNING_PRECISION = {"fp32": "32-true", "tf32": "32-true", "bf16": "bf16-mixed",
                       "fp16": "16-mixed"}


def export_config(config: TrainConfig, fmt: str, *, model_path: str | Path | None = None,
                  model_args: Mapping[str, Any] | None = None, device: str = "cuda") -> str:
    """The recommended configuration as text in one of EXPORT_FORMATS.

    `yaml` and `json` load back with `TrainConfig.load`; `hf`, `lightning` and `torch` are
    Python. `model_path`, `model_args` and `device` shape the `torch` script only: with a model
    file it trains that file's model (the path is written as given), without one it has
    placeholders to fill in.
    """
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; the formats are: "
                          f"{', '.join(EXPORT_FORMATS)}")
    if fmt == "yaml":
        return "\n".join(_header(config)) + "\n" + config.to_yaml()
    if fmt == "json":  # JSON has no comments, so no header
        return config.to_json()
    if fmt == "hf":
        return _hf_script(config)
    if fmt == "lightning":
        return _lightning_script(config)
    return _torch_script(config, model_path, dict(model_args or {}), device)


def hf_training_arguments(config: TrainConfig) -> dict[str, Any]:
    """Keyword arguments for `transformers.TrainingArguments` that apply `config`.

    TrainingArguments has no "selective" checkpointing (it checkpoints every layer) and no
    foreach/for-loop switch ("adamw_torch" is PyTorch's default, foreach on CUDA); the `hf`
    export says so next to those keys. `tf32` is left out for bf16/fp16 and False for fp32,
    because TrainingArguments turns TF32 on by itself with torch_compile unless told.
    """
    args: dict[str, Any] = {
        "per_device_train_batch_size": config.micro_batch_size,
        "gradient_accumulation_steps": config.grad_accum_steps,
        "bf16": config.precision == "bf16",
        "fp16": config.precision == "fp16",
    }
    if config.precision in ("fp32", "tf32"):
        args["tf32"] = config.precision == "tf32"
    args.update({
        "gradient_checkpointing": config.activation_checkpointing != "none",
        "optim": "adamw_torch_fused" if config.optimizer_impl == "fused" else "adamw_torch",
        "dataloader_num_workers": config.num_workers,
        "dataloader_prefetch_factor": config.prefetch_factor,  # None whenever workers == 0
        "dataloader_pin_memory": config.pin_memory,
        "dataloader_persistent_workers": config.persistent_workers,
        "torch_compile": config.compile_mode != "none",
        "torch_compile_mode": (None if config.compile_mode in ("none", "default")
                               else config.compile_mode),
    })
    return args


def _header(config: TrainConfig) -> list[str]:
    """Comment lines naming the tool and every knob, so an exported file says what it holds."""
    knobs = " ".join(f"{name}={value}" for name, value in config.to_dict().items())
    return ["# Generated by autotune from the measured configuration:",
            *(f"#   {line}" for line in textwrap.wrap(knobs, width=92, break_long_words=False,
                                                      break_on_hyphens=False))]


def _comment(text: str, indent: str = "") -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(text, width=96 - len(indent))]


def _hf_notes(config: TrainConfig) -> dict[str, str]:
    """Where TrainingArguments cannot say exactly what was measured, or would change it."""
    notes = {}
    if config.precision == "tf32":
        notes["tf32"] = "TF32 tensor cores for fp32 matmuls: TrainingArguments raises without " \
                        "an Ampere or newer GPU"
    elif config.precision == "fp32":
        notes["tf32"] = "IEEE fp32 matmuls, as measured (with torch_compile, TrainingArguments " \
                        "would otherwise turn TF32 on)"
    elif config.precision == "bf16" and config.compile_mode != "none":
        notes["bf16"] = "with torch_compile, TrainingArguments also turns on TF32 for the " \
                        "matmuls left in fp32, which autotune did not measure"
    if config.activation_checkpointing == "selective":
        notes["gradient_checkpointing"] = (
            'autotune measured "selective" (every other block); TrainingArguments has no such '
            'mode and checkpoints every layer, which is "full". Newer transformers take '
            'activation_checkpointing=True, activation_checkpointing_kwargs={"every_n_layers": '
            '2} for every other layer')
    if config.optimizer_impl != "fused":
        notes["optim"] = (
            f"autotune measured the {config.optimizer_impl} AdamW; TrainingArguments has no "
            'foreach/for_loop switch: "adamw_torch" is torch.optim.AdamW with PyTorch\'s '
            "default implementation, which is foreach on CUDA")
    if config.compile_mode == "default":
        notes["torch_compile_mode"] = "None: torch.compile's default mode"
    return notes


def _hf_script(config: TrainConfig) -> str:
    notes = _hf_notes(config)
    lines = [*_header(config), "#",
             "# Keyword arguments for transformers.TrainingArguments. Use them as:",
             "#     from transformers import TrainingArguments",
             '#     args = TrainingArguments(output_dir="out", **training_args)',
             "training_args = dict("]
    for key, value in hf_training_arguments(config).items():
        if key in notes:
            lines += _comment(notes[key], "    ")
        lines.append(f"    {key}={_py(value)},")
    lines.append(")")
    return "\n".join(lines) + "\n"


def _lightning_script(config: TrainConfig) -> str:
    lines = [
        *_header(config), "#",
        *_comment("Lightning's Trainer takes the precision and the gradient accumulation. It has "
                  "no argument for the DataLoader settings, the optimizer implementation, "
                  "activation checkpointing or torch.compile: the functions below apply those. "
                  "Use them as"),
        "#     trainer.fit(tuned_module(model), train_dataloaders=tuned_dataloader(dataset))",
        "# with `return tuned_optimizer(self.parameters())` in your configure_optimizers().",
        "try:",
        "    import lightning.pytorch as pl",
        "except ImportError:",
        "    import pytorch_lightning as pl",
        "import torch",
        "from torch.utils.data import DataLoader",
    ]
    if config.activation_checkpointing != "none":
        lines += ["", "from autotune.training import apply_activation_checkpointing"]
    if config.precision == "tf32":
        lines += ["", "# tf32: fp32 weights and activations, TF32 tensor cores in matmuls",
                  'torch.set_float32_matmul_precision("high")']
    flags = (f"foreach={config.optimizer_impl == 'foreach'}, "
             f"fused={config.optimizer_impl == 'fused'}")
    lines += [
        "",
        "trainer = pl.Trainer(",
        f"    precision={_py(LIGHTNING_PRECISION[config.precision])},",
        f"    accumulate_grad_batches={config.grad_accum_steps},",
        ")",
        "",
        "",
        "def tuned_dataloader(dataset, collate_fn=None):",
        '    """The measured DataLoader settings (full batches only: one shape for compile)."""',
        "    return DataLoader(",
        "        dataset,",
        f"        batch_size={config.micro_batch_size},",
        "        shuffle=True,",
        "        drop_last=True,",
        "        collate_fn=collate_fn,",
        f"        num_workers={config.num_workers},",
        f"        prefetch_factor={config.prefetch_factor},",
        f"        pin_memory={config.pin_memory},",
        f"        persistent_workers={config.persistent_workers},",
        "    )",
        "",
        "",
        "def tuned_optimizer(parameters):",
        '    """Keep your own optimizer and learning rate: what was tuned is foreach=/fused=."""',
        "    return torch.optim.AdamW(parameters, lr=3e-4, weight_decay=0.01,",
        f"                             {flags})",
        "",
        "",
        "def tuned_module(module):",
        '    """Activation checkpointing and torch.compile, as measured."""',
    ]
    if config.activation_checkpointing != "none":
        which = "every" if config.activation_checkpointing == "full" else "every other"
        lines += [
            *_comment(f"{config.activation_checkpointing}: {which} block of the largest "
                      "nn.ModuleList recomputes its activations in backward, through "
                      "torch.utils.checkpoint.checkpoint(..., use_reentrant=False). If your "
                      "blocks are elsewhere, add checkpoint_modules=lambda m: [your blocks]",
                      "    "),
            f"    apply_activation_checkpointing(module, "
            f"{_py(config.activation_checkpointing)})"]
    if config.compile_mode == "none":
        lines.append("    return module  # measured without torch.compile")
    elif config.compile_mode == "default":
        lines.append("    return torch.compile(module)")
    else:
        lines.append(f"    return torch.compile(module, mode={_py(config.compile_mode)})")
    return "\n".join(lines) + "\n"


def _torch_script(config: TrainConfig, model_path: str | Path | None,
                  model_args: dict[str, Any], device: str) -> str:
    if model_args and model_path is None:
        raise ConfigError("model_args need a model_path: they are the model file's arguments")
    args_literal = "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in model_args.items()) + "}"
    try:  # the script holds them as a literal, so they must read back as themselves
        plain = ast.literal_eval(args_literal) == model_args
    except (ValueError, SyntaxError):
        plain = False
    if not plain:
        raise ConfigError(f"model_args must be plain values (numbers, strings, booleans) to "
                          f"be written into a script, got {model_args!r}")
    knobs = [f"    {_py(name)}: {_py(value)}," for name, value in config.to_dict().items()]
    lines = [
        *_header(config),
        '"""Train with the configuration autotune measured, in a plain PyTorch loop.',
        "",
        "Run: python this_file.py [--steps 100] [--device cpu|cuda|cuda:N]",
        '"""',
        "import argparse",
        "",
        "import torch",
    ]
    if model_path is None:
        lines += ["from torch import nn", "", "from autotune.config import TrainConfig",
                  "from autotune.training import setup_training"]
    else:
        lines += ["", "from autotune.config import TrainConfig",
                  "from autotune.training import setup_from_workload",
                  "from autotune.workload import load_workload"]
    lines += ["", "CONFIG = TrainConfig.from_dict({", *knobs, "})"]
    if model_path is not None:
        lines += [f"MODEL_PATH = {_py(str(model_path))}", f"MODEL_ARGS = {args_literal}"]
    lines.append("LOG_EVERY = 10")
    if model_path is None:
        lines += [
            "",
            "",
            "# --- FILL IN: your model, dataset and loss " + "-" * 50,
            "def build_model() -> nn.Module:",
            '    raise NotImplementedError("FILL IN: return your model (on CPU, in fp32)")',
            "",
            "",
            "def build_dataset() -> torch.utils.data.Dataset:",
            '    raise NotImplementedError("FILL IN: return your map-style Dataset")',
            "",
            "",
            "def loss_fn(model: nn.Module, batch) -> torch.Tensor:",
            '    raise NotImplementedError("FILL IN: return the scalar loss of one batch")',
            "# --- end of FILL IN " + "-" * 73,
        ]
        setup = ["    # add collate_fn=... if your dataset needs one",
                 "    setup = setup_training(build_model(), build_dataset(), CONFIG, "
                 "args.device, loss_fn=loss_fn)"]
    else:
        setup = ["    workload = load_workload(MODEL_PATH, MODEL_ARGS)",
                 "    setup = setup_from_workload(workload, CONFIG, torch.device(args.device))"]
    lines += [
        "",
        "",
        "def main() -> None:",
        "    parser = argparse.ArgumentParser(description=__doc__)",
        '    parser.add_argument("--steps", type=int, default=100, help="optimizer steps")',
        f'    parser.add_argument("--device", default={_py(device)}, help="cpu, cuda or cuda:N")',
        "    args = parser.parse_args()",
        *setup,
        "    batches = setup.batches()",
        "    for step in range(1, args.steps + 1):",
        "        result = setup.step(batches)",
        "        if step % LOG_EVERY == 0 or step == args.steps:  # float() waits for the device",
        '            print(f"step {step}: loss {float(result.loss):.4f}", flush=True)',
        "",
        "",
        'if __name__ == "__main__":',
        "    main()",
    ]
    return "\n".join(lines) + "\n"


def _py(value: Any) -> str:
    """A Python literal for `value`, in double quotes where a string allows it."""
    if isinstance(value, str) and value.isascii() and value.isprintable():
        return json.dumps(value)  # escapes only quotes and backslashes, as Python reads them
    return repr(value)
