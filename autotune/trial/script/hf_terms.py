"""What Hugging Face's `TrainingArguments` can say of a configuration (the answer in the
script's own terms), why it cannot say a knob value, and the script's own settings read from the
TrainingArguments it built."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

from autotune.config import FP8_PRECISIONS, TrainConfig, default_optimizer_impl
from autotune.trial.protocol import LeftOut
from autotune.trial.script.session import ScriptBaseline, Settings

LIBRARY = "transformers"
# TrainingArguments' optim for each of autotune's optimizers; AdamW's by implementation.
OPTIMS = {"adafactor": "adafactor", "adamw_8bit": "adamw_bnb_8bit"}
_OPTIMIZERS = {"adafactor": "adafactor", "adamw_bnb_8bit": "adamw_8bit",
               "adamw_8bit": "adamw_8bit"}
# The TrainingArguments field of each batch knob (what a flag the user names sets instead).
FIELDS = {"micro_batch_size": "per_device_train_batch_size",
          "grad_accum_steps": "gradient_accumulation_steps"}
# Checkpointing every other layer (autotune's "selective") is TrainingArguments' every_n_layers.
_SELECTIVE_EVERY = 2


@functools.cache
def checkpointing_field() -> str:
    """TrainingArguments' name for activation checkpointing in the installed transformers:
    `activation_checkpointing` in newer releases (5.24 has it, `gradient_checkpointing` left as
    a deprecated alias), `gradient_checkpointing` alone in older ones (5.17 and 4.x). Its
    `_kwargs` field and the model's `_enable()` method follow the same name."""
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names \
        else "gradient_checkpointing"


@functools.cache
def checkpoints_every_n_layers() -> bool:
    """Whether the installed transformers' models checkpoint every n-th layer alone (the
    `every_n_layers` of their `_enable()`, which 5.24 has and 5.1 does not): autotune's
    "selective" checkpointing."""
    from transformers import PreTrainedModel

    enable = getattr(PreTrainedModel, f"{checkpointing_field()}_enable")
    return "every_n_layers" in inspect.signature(enable).parameters


def _fields_of(knob: str) -> tuple[str, ...]:
    """The fields of a knob a script can keep to itself (`ScriptBaseline.fixed`)."""
    if knob in ("optimizer", "optimizer_impl"):
        return ("optim",)
    if knob == "activation_checkpointing":
        return (checkpointing_field(), f"{checkpointing_field()}_kwargs")
    return ()


def training_arguments(config: TrainConfig, script: Mapping[str, Any],
                       fixed: Iterable[str] = ()) -> dict[str, Any]:
    """The TrainingArguments fields and values that apply `config`, given the script's own
    (`ScriptBaseline.settings["TrainingArguments"]`), less the fields of the `fixed` knobs,
    which stay as the script sets them: the answer in the script's terms."""
    checkpointing = checkpointing_field()
    kwargs = {k: v for k, v in (script.get(f"{checkpointing}_kwargs") or {}).items()
              if k != "every_n_layers"}
    if config.activation_checkpointing == "selective":
        kwargs["every_n_layers"] = _SELECTIVE_EVERY
    fields: dict[str, Any] = {
        "per_device_train_batch_size": config.micro_batch_size,
        "gradient_accumulation_steps": config.grad_accum_steps,
        "bf16": config.precision == "bf16",
        "fp16": config.precision == "fp16",
        checkpointing: config.activation_checkpointing != "none",
        f"{checkpointing}_kwargs": kwargs or None,
        "optim": OPTIMS.get(config.optimizer, "adamw_torch_fused"
                            if config.optimizer_impl == "fused" else "adamw_torch"),
        "dataloader_num_workers": config.num_workers,
        "dataloader_prefetch_factor": config.prefetch_factor,
        "dataloader_pin_memory": config.pin_memory,
        "dataloader_persistent_workers": config.persistent_workers,
        "torch_compile": config.compile_mode != "none",
        "torch_compile_mode": None if config.compile_mode in ("none", "default")
        else config.compile_mode,
    }
    # TF32 where asked; IEEE fp32 matmuls for fp32 where the script (or torch_compile, which
    # turns TF32 on by itself) would have TF32; the mixed precisions keep the script's choice.
    if config.precision == "tf32":
        fields["tf32"] = True
    elif config.precision == "fp32" and (script.get("tf32") or config.compile_mode != "none"):
        fields["tf32"] = False
    if config.parallelism == "ddp":
        fields.update(ddp_bucket_cap_mb=config.ddp_bucket_cap_mb,
                      ddp_static_graph=config.ddp_static_graph)
    for knob in fixed:
        for name in _fields_of(knob):
            fields.pop(name, None)
    return fields


def changed_arguments(config: TrainConfig, baseline: ScriptBaseline, device_type: str,
                      world_size: int = 1) -> dict[str, Any]:
    """The TrainingArguments fields whose value must change from the script's own to say
    `config` (the script's own values are `baseline.settings["TrainingArguments"]`); TF32 is
    a CUDA matmul mode, said only of an answer for CUDA."""
    script = baseline.settings["TrainingArguments"]
    new = training_arguments(config, script, baseline.fixed)
    own = training_arguments(baseline.config(device_type, world_size), script, baseline.fixed)
    return {k: v for k, v in new.items() if v != own.get(k, script.get(k))
            and (k != "tf32" or device_type == "cuda")}


def changes(config: TrainConfig, baseline: ScriptBaseline, device_type: str,
            world_size: int = 1) -> Settings:
    """What the script changes to run `config`: its TrainingArguments' fields."""
    fields = changed_arguments(config, baseline, device_type, world_size)
    return {"TrainingArguments": fields} if fields else {}


def unexpressed(config: TrainConfig, baseline: ScriptBaseline, device_type: str,
                world_size: int = 1) -> list[LeftOut]:
    """Each knob value of `config` (other than the script's own) that TrainingArguments cannot
    say for this script, with why."""
    base = baseline.config(device_type, world_size).to_dict()
    values = config.to_dict()
    out = []
    for knob, value in values.items():
        if value == base[knob]:
            continue
        reason = baseline.fixed.get(knob) or _reason(knob, value, values, device_type)
        if reason:
            out.append(LeftOut(knob, value, reason))
    return out


def _reason(knob: str, value: Any, values: Mapping[str, Any], device_type: str) -> str | None:
    """Why TrainingArguments cannot say `knob=value`, or None where it can."""
    if knob == "precision" and value in FP8_PRECISIONS:
        return ("TrainingArguments has no float8 training: torchao's convert_to_float8_training "
                "is a change to the model, not a setting")
    if knob == "optimizer_impl" and values["optimizer"] == "adamw" and value != "fused" and \
            value != default_optimizer_impl(device_type):
        return (f"TrainingArguments' optim has no {value} AdamW on {device_type}: adamw_torch is "
                "torch.optim.AdamW with PyTorch's default implementation (foreach on CUDA, a "
                "for-loop elsewhere), adamw_torch_fused the fused one, and optim_args do not "
                "reach torch's AdamW")
    if knob == "activation_checkpointing" and value == "selective" and \
            not checkpoints_every_n_layers():
        return ("this transformers checkpoints every layer or none: every other layer alone "
                "is its models' every_n_layers, in later releases")
    if knob == "memory_format":
        return ("TrainingArguments has no memory format: channels_last is the model's and the "
                "batches' own, which autotune does not change in a script")
    if knob == "attention_backend":
        return ("not yet: a transformers model's attention kernel is its attn_implementation, "
                "chosen when the script builds the model, before the Trainer")
    if knob == "ddp_gradient_as_bucket_view":
        return ("TrainingArguments has no gradient_as_bucket_view: Trainer builds DDP's "
                "arguments from its ddp_* fields alone")
    if knob.startswith("fsdp") or (knob == "parallelism" and value == "fsdp"):
        return "not yet: FSDP in script trials is not built"
    return None


def read_baseline(args: Any, device_type: str, model: Any = None) -> ScriptBaseline:
    """The script's own settings, from the TrainingArguments it built."""
    baseline = ScriptBaseline(LIBRARY, parsed_by=getattr(args, "_autotune_parsed_by", None))
    workers = args.dataloader_num_workers
    baseline.knobs = {
        "micro_batch_size": args.per_device_train_batch_size,
        "grad_accum_steps": args.gradient_accumulation_steps,
        "precision": "bf16" if args.bf16 else "fp16" if args.fp16 else
        "tf32" if args.tf32 else "fp32",
        "num_workers": workers,
        "prefetch_factor": args.dataloader_prefetch_factor if workers > 0 else None,
        "pin_memory": bool(args.dataloader_pin_memory) and device_type == "cuda",
        "persistent_workers": bool(args.dataloader_persistent_workers) and workers > 0,
        "compile_mode": (args.torch_compile_mode or "default") if args.torch_compile else "none",
    }
    field = checkpointing_field()
    every = (getattr(args, f"{field}_kwargs") or {}).get("every_n_layers", 1)
    checkpointing = {1: "full", _SELECTIVE_EVERY: "selective"}.get(every) \
        if getattr(args, field) else "none"
    if checkpointing is None:
        baseline.fixed["activation_checkpointing"] = (
            f"the script checkpoints every {every} layers, which is none of autotune's values "
            "(full: every layer, selective: every other one)")
    elif model is not None and not _can_checkpoint(model):
        baseline.fixed["activation_checkpointing"] = (
            f"the model ({type(model).__name__}) has no {field}_enable() "
            f"that TrainingArguments' {field} could turn on")
    else:
        baseline.knobs["activation_checkpointing"] = checkpointing
    optim = _text(args.optim)
    if optim in ("adamw_torch", "adamw_torch_fused"):
        baseline.knobs["optimizer"] = "adamw"
        baseline.knobs["optimizer_impl"] = "fused" if optim == "adamw_torch_fused" \
            else default_optimizer_impl(device_type)
    elif optim in _OPTIMIZERS:
        baseline.knobs["optimizer"] = _OPTIMIZERS[optim]
    else:
        reason = (f"the script's optim {optim!r} is none of the optimizers autotune measures "
                  "(AdamW, Adafactor, 8-bit AdamW); it stays as the script sets it")
        baseline.fixed.update(optimizer=reason, optimizer_impl=reason)
    if args.world_size > 1:
        baseline.knobs.update(ddp_bucket_cap_mb=args.ddp_bucket_cap_mb or 25,
                              ddp_static_graph=bool(args.ddp_static_graph))
    baseline.arguments_class = type(args).__name__  # Seq2SeqTrainingArguments, TRL's configs
    baseline.settings = {"TrainingArguments": _fields(args, training_arguments(
        baseline.config(device_type, args.world_size), {}))}
    if baseline.parsed_by is None:  # where the script's code says each field it passes
        baseline.sources = {"TrainingArguments": dict(getattr(args, "_autotune_sources", {}))}
    return baseline


def _can_checkpoint(model: Any) -> bool:
    return hasattr(model, f"{checkpointing_field()}_enable") and \
        getattr(model, "supports_gradient_checkpointing", True)


def _fields(args: Any, names: Mapping[str, Any]) -> dict[str, Any]:
    """The script's own values of these TrainingArguments fields (and of tf32)."""
    return {name: _text(getattr(args, name)) for name in [*names, "tf32"]}


def _text(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def run_steps(args: Any, samples: int | None) -> int | None:
    """The optimizer steps the script's own run takes, counted as the Trainer counts them:
    its `max_steps`, else its epochs over its data's batches (a step per accumulation, the
    last one short); None for data without a length."""
    if args.max_steps > 0:
        return int(args.max_steps)
    if samples is None:
        return None
    per_batch = args.per_device_train_batch_size * max(1, args.world_size)
    batches = samples // per_batch if args.dataloader_drop_last else -(-samples // per_batch)
    accum = args.gradient_accumulation_steps
    return math.ceil(args.num_train_epochs * max(-(-batches // accum), 1))
