"""What Lightning can be told of a configuration, and where: the Trainer's arguments
(precision, accumulation), the attributes Lightning's own batch-size finder sets (the batch size,
and the DataLoader settings where the script's DataModule reads them from attributes), an
AdamW's implementation, torch.compile and TF32 around the Trainer; and why a knob cannot be."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from autotune.config import FP8_PRECISIONS, TrainConfig
from autotune.trial.distributed import launched_world_size
from autotune.trial.protocol import LeftOut
from autotune.trial.script.session import ScriptBaseline, ScriptTrial, Settings, settings_changed
from autotune.trial.training import Unsupported

LIBRARY = "lightning"
PRECISIONS = {"32-true": "fp32", "bf16-mixed": "bf16", "16-mixed": "fp16"}
TRAINER_PRECISION = {"fp32": "32-true", "tf32": "32-true", "bf16": "bf16-mixed",
                     "fp16": "16-mixed"}
# The attributes Lightning's batch-size finder looks for (`lightning_hasattr`), by the knob
# each one says.
ATTRIBUTE_KNOBS = {"batch_size": "micro_batch_size", "num_workers": "num_workers",
                   "prefetch_factor": "prefetch_factor", "pin_memory": "pin_memory",
                   "persistent_workers": "persistent_workers"}
# How a trial compiles a LightningModule, and the line the answer gives: its forward, not the
# module (compiling the module compiles training_step too, where `self.log` fails dynamo).
COMPILED_FORWARD = "model.forward = torch.compile"
# What is learnt, and applied, only once fit() has started: the attributes, compile (the model
# fit() is given), the optimizer (configure_optimizers()); every other knob is the Trainer's.
# What a DataLoader with workers prefetches when the script does not say.
DATALOADER_PREFETCH = 2
LATE_KNOBS = (*ATTRIBUTE_KNOBS.values(), "compile_mode", "optimizer", "optimizer_impl")


def unexpressed(config: TrainConfig, baseline: ScriptBaseline, device_type: str,
                world_size: int = 1, knobs: Iterable[str] | None = None) -> list[LeftOut]:
    """Each knob value of `config` (other than the script's own; of `knobs` only, if given)
    that Lightning cannot be told for this script, with why."""
    base = baseline.config(device_type, world_size).to_dict()
    values = config.to_dict()
    out = []
    for knob in knobs or values:
        value = values[knob]
        if value == base[knob] or (knob == "prefetch_factor" and base[knob] is None and
                                   value == DATALOADER_PREFETCH):
            continue
        reason = baseline.fixed.get(knob) or _reason(knob, value)
        if reason:
            out.append(LeftOut(knob, value, reason))
    return out


def _reason(knob: str, value: Any) -> str | None:
    """Why Lightning cannot be told `knob=value` in any script, or None where it can."""
    if knob == "precision" and value in FP8_PRECISIONS:
        return ("Lightning's precision has no torchao float8 training (its transformer-engine "
                "precision is NVIDIA's)")
    if knob == "activation_checkpointing":
        return ("Lightning's Trainer has no activation checkpointing setting: it is the "
                "LightningModule's own code (torch.utils.checkpoint in its forward)")
    if knob == "optimizer":
        return ("the LightningModule builds its optimizer in configure_optimizers(); autotune "
                "changes an AdamW's implementation there, never the optimizer")
    if knob == "memory_format":
        return ("Lightning has no memory format setting: channels_last is the model's and the "
                "batches' own, which autotune does not change in a script")
    if knob == "attention_backend":
        return ("not yet: Lightning has no setting for the kernel behind "
                "scaled_dot_product_attention")
    if knob in ("parallelism", "ddp_bucket_cap_mb", "ddp_static_graph",
                "ddp_gradient_as_bucket_view", "fsdp_reshard_after_forward", "fsdp_reduce_dtype"):
        return ("not yet: under several ranks a Lightning script trial runs the script's own "
                "strategy (DDP under torchrun) as it is; its settings and FSDP are not set")
    return None


def settings(config: TrainConfig, baseline: ScriptBaseline) -> Settings:
    """Where and how the script says `config`: the Trainer's arguments, the attributes its
    DataModule (or LightningModule) reads, and the lines of torch around them."""
    precision = baseline.settings["Trainer"]["precision"] if "precision" in baseline.fixed \
        else TRAINER_PRECISION[config.precision]
    out: Settings = {"Trainer": {"precision": precision,
                                 "accumulate_grad_batches": config.grad_accum_steps}}
    values = config.to_dict()
    for holder, attributes in baseline.settings.items():
        for attribute in attributes:
            knob = ATTRIBUTE_KNOBS.get(attribute)
            if knob is not None and knob not in baseline.fixed:
                out.setdefault(holder, {})[attribute] = values[knob]
    if config.precision == "tf32" or baseline.knobs.get("precision") == "tf32":
        out["torch.set_float32_matmul_precision"] = {
            "precision": "high" if config.precision == "tf32" else "highest"}
    if config.compile_mode != "none" and "compile_mode" not in baseline.fixed:
        out[COMPILED_FORWARD] = {"mode": None if config.compile_mode == "default"
                                 else config.compile_mode}
    if config.optimizer == "adamw" and "optimizer_impl" not in baseline.fixed:
        out["torch.optim.AdamW"] = {"foreach": config.optimizer_impl == "foreach",
                                    "fused": config.optimizer_impl == "fused"}
    return out


def changes(config: TrainConfig, baseline: ScriptBaseline, device_type: str,
            world_size: int = 1) -> Settings:
    """Where and what must change from the script's own settings to say `config`."""
    own = settings(baseline.config(device_type), baseline)
    return settings_changed(own, settings(config, baseline))


def refuse(trial: ScriptTrial, baseline: ScriptBaseline, knobs: Iterable[str]) -> None:
    """Raise `Unsupported` for the first of `knobs` the trial asks for and Lightning cannot."""
    if trial.config is None:
        return
    refused = unexpressed(trial.config, baseline, trial.device.type, launched_world_size(),
                          knobs=knobs)
    if refused:
        raise Unsupported(refused[0].describe(), refused[0].knob, refused[0].value)
