"""What an Accelerate script can be told, and where the answer says it: its Accelerator's
settings (`mixed_precision`, `gradient_accumulation_steps`, the dynamo backend and mode) as its
code passes them (that line, or the script's own flag it passes), else as `accelerate launch`'s
flags; DDP's kwargs handler at the Accelerator's line; the micro-batch through the script's own
flag; the DataLoader, the AdamW and checkpointing as in a hand-written loop (`loop_terms`); the
script's own settings read from the Accelerator it built; and why a knob cannot be told."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from autotune.config import COMPILE_MODES, FP8_PRECISIONS, TrainConfig
from autotune.trial.distributed import launched_world_size
from autotune.trial.protocol import CodeChange, LeftOut
from autotune.trial.script import loop_terms
from autotune.trial.script.accelerate import (
    MIXED_PRECISION,
    AcceleratorRecord,
    patch_accelerator,
)
from autotune.trial.script.library import Library
from autotune.trial.script.loop import LoopWatch
from autotune.trial.script.session import ScriptBaseline, Settings, settings_changed
from autotune.trial.script.sources import Source, named_flag

LIBRARY = "accelerate"
LAUNCHER = "accelerate launch"
ACCELERATOR, DDP = "Accelerator", "DistributedDataParallelKwargs"
_PRECISIONS = {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}
_DISTRIBUTED = ("parallelism", "ddp_bucket_cap_mb", "ddp_static_graph",
                "ddp_gradient_as_bucket_view", "fsdp_reshard_after_forward", "fsdp_reduce_dtype")


def read_baseline(watch: LoopWatch) -> ScriptBaseline:
    """The script's own settings: its Accelerator's, and its loop's (`loop_terms`)."""
    trial = watch.trial
    device = trial.device.type
    record: AcceleratorRecord = watch.accelerator
    accelerator = record.accelerator
    baseline = ScriptBaseline(LIBRARY)
    loop_terms.read_batch_sources(watch, baseline, ("micro_batch_size",))
    loop_terms.read_loader(watch, baseline)
    loop_terms.read_optimizer(watch, baseline)
    sources = dict(record.sources)
    named = trial.flag_map.get("grad_accum_steps")
    if named:
        sources["gradient_accumulation_steps"] = named_flag(named, trial.flags,
                                                                  "grad_accum_steps")
    baseline.knobs["grad_accum_steps"] = accelerator.gradient_accumulation_steps
    if record.accumulation_given:
        baseline.fixed["grad_accum_steps"] = ("the script gives its Accelerator a "
                                              "GradientAccumulationPlugin of its own")
    mixed = str(accelerator.mixed_precision)
    precision = _PRECISIONS.get(mixed)
    if precision == "fp32" and device == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        precision = "tf32"
    if precision is None:
        baseline.fixed["precision"] = (f"the script's mixed precision {mixed!r} is Accelerate's "
                                       "own recipe, none of autotune's (no, bf16, fp16)")
    else:
        baseline.knobs["precision"] = precision
    plugin = accelerator.state.dynamo_plugin
    backend = str(plugin.backend.value).lower()
    mode = plugin.mode or "default"
    if backend == "no":
        baseline.knobs["compile_mode"] = "none"
    elif backend == "inductor" and mode in COMPILE_MODES:
        baseline.knobs["compile_mode"] = mode
    else:
        baseline.fixed["compile_mode"] = (f"the script compiles with dynamo backend {backend!r} "
                                          f"(mode {mode!r}), none of autotune's")
    if record.plugin_given:
        baseline.fixed["compile_mode"] = ("the script gives its Accelerator a TorchDynamoPlugin "
                                          "of its own")
    _read_model(watch, baseline)
    _read_distributed(accelerator, baseline)
    baseline.settings[ACCELERATOR] = {"mixed_precision": mixed,
                                      "gradient_accumulation_steps":
                                      accelerator.gradient_accumulation_steps,
                                      "dynamo_backend": backend, "dynamo_mode": mode}
    baseline.said(ACCELERATOR, "", record.site)
    for name, source in sources.items():
        baseline.said(ACCELERATOR, name, source)
    return baseline


def _read_model(watch: LoopWatch, baseline: ScriptBaseline) -> None:
    """Checkpointing of the model it prepares: the model's own switch, or its blocks."""
    model = watch.model
    if model is None:
        baseline.fixed["activation_checkpointing"] = "the script prepares no model"
        return
    loop_terms.read_checkpointing(watch, baseline)
    baseline.settings[loop_terms.MODEL] = {"checkpointing": None}
    if model.built is not None:
        baseline.said(loop_terms.MODEL, "built", model.built)


def _read_distributed(accelerator: Any, baseline: ScriptBaseline) -> None:
    if launched_world_size() <= 1:
        return
    kind = str(accelerator.distributed_type.value).lower()
    if "multi" not in kind:
        for knob in _DISTRIBUTED:
            baseline.fixed[knob] = (f"the script trains under Accelerate's {kind}, which "
                                    "autotune leaves as it is (not yet: its FSDP and DeepSpeed "
                                    "plugins)")
        return
    handler = accelerator.ddp_handler
    baseline.knobs.update(
        parallelism="ddp", ddp_bucket_cap_mb=getattr(handler, "bucket_cap_mb", 25),
        ddp_static_graph=bool(getattr(handler, "static_graph", False)),
        ddp_gradient_as_bucket_view=bool(getattr(handler, "gradient_as_bucket_view", False)))


def unexpressed(config: TrainConfig, baseline: ScriptBaseline, device_type: str,
                world_size: int = 1) -> list[LeftOut]:
    """Each knob value of `config` (other than the script's own) that the script's
    Accelerator and loop cannot be told, with why."""
    return loop_terms.unexpressed(config, baseline, device_type, world_size, reason=_reason)


def _reason(knob: str, value: Any) -> str | None:
    if knob == "precision" and value in FP8_PRECISIONS:
        return ("Accelerate's fp8 is a recipe of its own (torchao, Transformer Engine or "
                "MS-AMP), not autotune's float8 training")
    if knob == "parallelism" and value == "fsdp" or knob.startswith("fsdp"):
        return "not yet: Accelerate's FSDP plugin in a script trial"
    if knob in ("precision", *_DISTRIBUTED[1:]):
        return None
    return loop_terms._reason(knob, value) if knob != "parallelism" else None


def settings(config: TrainConfig, baseline: ScriptBaseline) -> Settings:
    """Where and how the script says `config`: its Accelerator's settings, its DDP handler,
    and its loop's (`loop_terms`)."""
    out = loop_terms.settings(config, baseline)
    if loop_terms.MODEL in out:
        out[loop_terms.MODEL] = {"checkpointing": out[loop_terms.MODEL]["checkpointing"]}
    own = baseline.settings.get(ACCELERATOR, {})
    compiled = config.compile_mode != "none"
    out[ACCELERATOR] = {
        "mixed_precision": own.get("mixed_precision") if "precision" in baseline.fixed
        else MIXED_PRECISION[config.precision],
        "gradient_accumulation_steps": config.grad_accum_steps,
        "dynamo_backend": "inductor" if compiled else "no",
        "dynamo_mode": config.compile_mode if compiled else own.get("dynamo_mode")}
    if "compile_mode" in baseline.fixed:
        out[ACCELERATOR].update(dynamo_backend=own.get("dynamo_backend"),
                                dynamo_mode=own.get("dynamo_mode"))
    if config.precision == "tf32" or baseline.knobs.get("precision") == "tf32":
        out.setdefault(loop_terms.MODEL, {})["tf32"] = config.precision == "tf32"
    if config.parallelism == "ddp":
        out[DDP] = {"bucket_cap_mb": config.ddp_bucket_cap_mb,
                    "static_graph": config.ddp_static_graph,
                    "gradient_as_bucket_view": config.ddp_gradient_as_bucket_view}
    return out


def changes(config: TrainConfig, baseline: ScriptBaseline, device_type: str,
            world_size: int = 1) -> Settings:
    """Where and what must change from the script's own settings to say `config`."""
    world = launched_world_size()
    own = settings(baseline.config(device_type, world), baseline)
    return settings_changed(own, settings(config, baseline))


def additions(where: str, values: Mapping[str, Any], baseline: ScriptBaseline,
              device_type: str) -> list[CodeChange] | None:
    """The lines to add or change that no flag says: DDP's handler in the Accelerator's
    arguments, checkpointing and TF32 after the model is built; None for another place."""
    if where != DDP:
        return loop_terms.additions(where, values, baseline, device_type)
    line = Source.from_dict(baseline.sources.get(ACCELERATOR, {}).get("", {}))
    arguments = ", ".join(f"{k}={v!r}" for k, v in values.items())
    return [CodeChange(line.file, line.line, text=(
        f"{line.call or ACCELERATOR}(..., kwargs_handlers=[DistributedDataParallelKwargs("
        f"{arguments})])"))]


ACCELERATE_LOOP = Library(LIBRARY, "Accelerate loop", "Accelerate script", None,
                          {"accelerate.accelerator": patch_accelerator}, unexpressed, changes,
                          additions, read_loop=read_baseline, prepares_model=True)
