"""What a hand-written loop can be told, and where the answer says it: the script's own flags
for its micro-batch and accumulation (only those: they are the loop's arithmetic), its own AMP
and compile switches where it has them (`own_switches`), the DataLoader its loop trains from
and its AdamW at the lines that build them, and the lines to add around its model (bf16
autocast around the forward, `torch.compile` of the forward, where no switch of its own says
them; activation checkpointing after it is built, TF32 on CUDA); the script's own settings read
from what its loop really did; and why a knob cannot be told."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from autotune.config import FP8_PRECISIONS, TrainConfig
from autotune.trial.protocol import CodeChange, LeftOut
from autotune.trial.script import own_switches
from autotune.trial.script.library import Library
from autotune.trial.script.loop import FLAGS, LOADER, MODEL, OPTIMIZER, LoopWatch
from autotune.trial.script.own_switches import SWITCHES
from autotune.trial.script.session import ScriptBaseline, Settings, settings_changed
from autotune.trial.script.sources import Source, named_flag

LIBRARY = "loop"

BATCH_KNOBS = ("micro_batch_size", "grad_accum_steps")
LOADER_KNOBS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")
_NO_MODEL = ("no module holding the optimizer's parameters was found among the script's "
             "variables when it built its optimizer, so autotune has no model to set it on")


def read_baseline(watch: LoopWatch) -> ScriptBaseline:
    """The script's own settings, from what its loop built and ran (read as its training
    starts; its micro-batch and accumulation from its first steps)."""
    trial = watch.trial
    device = trial.device.type
    baseline = ScriptBaseline(LIBRARY)
    read_batch_sources(watch, baseline)
    read_loader(watch, baseline)
    read_optimizer(watch, baseline)
    read_model(watch, baseline, device)
    return baseline


def read_batch_sources(watch: LoopWatch, baseline: ScriptBaseline,
                       knobs: Iterable[str] = BATCH_KNOBS) -> None:
    """The flags that set the loop's micro-batch and accumulation: the user's named ones
    (`--arg`), else the flag the training DataLoader's `batch_size` comes from; without one
    the loop keeps its own."""
    trial = watch.trial
    loader = watch.train_loader
    for knob in knobs:
        named = trial.flag_map.get(knob)
        source = named_flag(named, trial.flags, knob) if named else None
        if source is None and knob == "micro_batch_size" and loader is not None and \
                loader.sources["batch_size"].flag:
            source = loader.sources["batch_size"]
        if source is not None:
            baseline.said(FLAGS, knob, source)
        else:
            what = "micro-batch" if knob == "micro_batch_size" else "accumulation"
            baseline.fixed[knob] = (
                f"the loop's {what} is its own arithmetic: name the script's flag that sets it "
                f"(--arg {knob}=--FLAG) to tune it")
    if loader is not None and loader.own.get("batch_size"):
        baseline.knobs["micro_batch_size"] = loader.own["batch_size"]


def read_loader(watch: LoopWatch, baseline: ScriptBaseline) -> None:
    """The training DataLoader's own settings and where each is said."""
    loader = watch.train_loader
    if loader is None:
        for knob in LOADER_KNOBS:
            baseline.fixed[knob] = ("the loop reads its batches without a torch DataLoader, "
                                    "so it has no workers to set")
        return
    own = loader.own
    pinned = bool(own["pin_memory"]) and watch.trial.device.type == "cuda"
    baseline.knobs.update(num_workers=own["num_workers"], pin_memory=pinned,
                          prefetch_factor=own["prefetch_factor"] if own["num_workers"] else None,
                          persistent_workers=bool(own["persistent_workers"]))
    baseline.settings[LOADER] = {k: own[k] for k in LOADER_KNOBS}
    baseline.said(LOADER, "", loader.site)
    for name, source in loader.sources.items():
        baseline.said(LOADER, name, source)
    for knob in loader.unpassed:
        baseline.fixed[knob] = (f"the loop's DataLoader is built inside {loader.factory}, "
                                f"and the script's call of it does not name {knob}")
    if loader.iterable and not own["num_workers"]:
        baseline.fixed["num_workers"] = ("the loop's DataLoader reads an IterableDataset, "
                                         "which each worker would read whole")


def read_optimizer(watch: LoopWatch, baseline: ScriptBaseline) -> None:
    """The optimizer the loop steps: an Adam's or AdamW's implementation, where it is built."""
    record = next(iter(watch.optimizers.values()), None)
    if record is None or record.impl is None:
        what = record.where if record is not None else "no torch.optim optimizer"
        reason = (f"the loop steps {what}; autotune sets the implementation (foreach/fused) "
                  "of a torch.optim.AdamW or Adam only, at the line that builds it")
        baseline.fixed.update(optimizer=reason, optimizer_impl=reason)
        return
    baseline.knobs.update(optimizer="adamw", optimizer_impl=record.impl)
    baseline.settings[OPTIMIZER] = {"foreach": record.impl == "foreach",
                                    "fused": record.impl == "fused"}
    baseline.said(OPTIMIZER, "", record.site)
    for name, source in record.sources.items():
        baseline.said(OPTIMIZER, name, source)


def read_model(watch: LoopWatch, baseline: ScriptBaseline, device: str) -> None:
    """Precision, compile and checkpointing as the loop runs its model."""
    model = watch.model
    if watch.autocast is not None:
        name = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(watch.autocast)
        baseline.knobs["precision"] = name or "fp32"
        baseline.fixed["precision"] = (f"the loop runs its forward under its own autocast "
                                       f"({str(watch.autocast).removeprefix('torch.')}), "
                                       "which autotune leaves as it is")
    elif model is not None and _low_precision_weights(model.module):
        baseline.fixed["precision"] = ("the model's weights are in low precision already: "
                                       "autocast would change nothing")
    else:
        tf32 = device == "cuda" and torch.backends.cuda.matmul.allow_tf32
        baseline.knobs["precision"] = "tf32" if tf32 else "fp32"
    baseline.knobs["compile_mode"] = "none"
    if watch.script_compiled is not None:
        where = watch.script_compiled
        baseline.fixed["compile_mode"] = (f"the script calls torch.compile itself "
                                          f"({where.file}:{where.line})")
    read_checkpointing(watch, baseline)
    if model is None:
        for knob in ("precision", "compile_mode", "activation_checkpointing"):
            baseline.fixed.setdefault(knob, _NO_MODEL)
        return
    own_switches.read(watch.trial.flags, baseline)
    baseline.settings[MODEL] = {"autocast": None, "compile": None, "checkpointing": None}
    if watch.forward_site is not None:
        baseline.said(MODEL, "forward", watch.forward_site)
    if model.built is not None:
        baseline.said(MODEL, "built", model.built)


def read_checkpointing(watch: LoopWatch, baseline: ScriptBaseline) -> None:
    """Whether the model checkpoints its activations already, and its own switch for it (a
    Hugging Face model's), which the answer names."""
    model = watch.model
    if model is None:
        return
    module = model.module
    own = bool(getattr(module, "is_activation_checkpointing", None) if
               hasattr(type(module), "is_activation_checkpointing") else
               getattr(module, "is_gradient_checkpointing", False))
    baseline.knobs["activation_checkpointing"] = "full" if own else "none"
    if own:
        baseline.fixed["activation_checkpointing"] = ("the model checkpoints its activations "
                                                      "itself (its checkpointing switch is on)")
    switch = next((name for name in ("activation_checkpointing_enable",
                                      "gradient_checkpointing_enable")
                   if callable(getattr(module, name, None)) and
                   getattr(module, "supports_gradient_checkpointing", True)), None)
    if switch is not None:
        baseline.said(MODEL, "switch", Source(call=switch))


def _checkpointing(model: str, mode: str, sources: Mapping[str, Any]) -> str:
    """The line that checkpoints the model as the trial did: its own switch where it has one
    (every layer, or every other one), else autotune's over its repeated blocks."""
    switch = sources.get("switch", {}).get("call")
    if switch == "activation_checkpointing_enable":
        return f"{model}.{switch}(every_n_layers={1 if mode == 'full' else 2})"
    if switch == "gradient_checkpointing_enable" and mode == "full":
        return f"{model}.{switch}()"
    return ("from autotune import apply_activation_checkpointing; "
            f"apply_activation_checkpointing({model}, {mode!r})")


def _low_precision_weights(module: Any) -> bool:
    first = next(module.parameters(), None)
    return first is not None and first.dtype in (torch.bfloat16, torch.float16)


def unexpressed(config: TrainConfig, baseline: ScriptBaseline, device_type: str,
                world_size: int = 1,
                reason: Callable[[str, Any], str | None] | None = None) -> list[LeftOut]:
    """Each knob value of `config` (other than the script's own) that the loop cannot be told,
    with why: `reason`, where the loop is driven by a library (Accelerate), says what it
    cannot be told."""
    base = baseline.config(device_type, world_size).to_dict()
    why = reason or _reason
    out = []
    for knob, value in config.to_dict().items():
        if value == base[knob] or (knob == "prefetch_factor" and base[knob] is None and
                                   value == 2):
            continue
        said = baseline.fixed.get(knob) or baseline.refused.get(knob, {}).get(str(value)) \
            or why(knob, value)
        if said:
            out.append(LeftOut(knob, value, said))
    return out


def _reason(knob: str, value: Any) -> str | None:
    """Why no hand-written loop can be told `knob=value`, or None where it can."""
    if knob == "precision" and value in FP8_PRECISIONS:
        return ("float8 training converts the model's linear layers (torchao's "
                "convert_to_float8_training), a change to the model, not a setting")
    if knob == "precision" and value == "fp16":
        return ("fp16 needs a GradScaler in the loop (its loss scaled before backward, its "
                "gradients unscaled before the step): the loop's own code")
    if knob == "memory_format":
        return ("channels_last is the model's and the batches' own, which autotune does not "
                "change in a script")
    if knob == "attention_backend":
        return "not yet: the kernel behind scaled_dot_product_attention in a script"
    if knob == "optimizer":
        return ("the loop builds its own optimizer; autotune sets an AdamW's implementation "
                "there, never another optimizer")
    if knob in ("parallelism", "ddp_bucket_cap_mb", "ddp_static_graph",
                "ddp_gradient_as_bucket_view", "fsdp_reshard_after_forward", "fsdp_reduce_dtype"):
        return ("not yet: under several ranks a hand-written loop runs its own "
                "DistributedDataParallel as it is")
    return None


def settings(config: TrainConfig, baseline: ScriptBaseline) -> Settings:
    """Where and how the loop says `config`: its flags, its DataLoader's and optimizer's
    arguments, and what is added around its model."""
    out: Settings = {}
    values = config.to_dict()
    flags = {k: values[k] for k in BATCH_KNOBS if k in baseline.sources.get(FLAGS, {})}
    if flags:
        out[FLAGS] = flags
    if LOADER in baseline.settings:
        workers = config.num_workers
        out[LOADER] = {"num_workers": workers,
                       "prefetch_factor": config.prefetch_factor if workers else None,
                       "pin_memory": config.pin_memory,
                       "persistent_workers": config.persistent_workers and workers > 0}
    if OPTIMIZER in baseline.settings:
        out[OPTIMIZER] = {"foreach": config.optimizer_impl == "foreach",
                          "fused": config.optimizer_impl == "fused"}
    if SWITCHES in baseline.settings:
        out[SWITCHES] = own_switches.values(config, baseline)
    if MODEL in baseline.settings:
        switched = own_switches.expresses(baseline, "precision")
        out[MODEL] = {
            "autocast": "bf16" if config.precision == "bf16" and not switched and
            "precision" not in baseline.fixed else None,
            "compile": None if config.compile_mode == "none" or
            own_switches.expresses(baseline, "compile_mode") else config.compile_mode,
            "checkpointing": None if config.activation_checkpointing == "none"
            else config.activation_checkpointing,
            "tf32": config.precision == "tf32"}
    return out


def changes(config: TrainConfig, baseline: ScriptBaseline, device_type: str,
            world_size: int = 1) -> Settings:
    """Where and what must change from the loop's own settings to say `config`."""
    own = settings(baseline.config(device_type), baseline)
    return settings_changed(own, settings(config, baseline))


def additions(where: str, values: Mapping[str, Any], baseline: ScriptBaseline,
              device_type: str) -> list[CodeChange] | None:
    """The lines to add for the changes of the model (`MODEL`'s), where the loop has them;
    None for another place."""
    if where != MODEL:
        return None
    sources = baseline.sources.get(MODEL, {})
    forward = Source.from_dict(sources["forward"]) if "forward" in sources else Source()
    built = Source.from_dict(sources["built"]) if "built" in sources else Source()
    model = built.call or "model"
    out = []
    for name, value in values.items():
        if name == "autocast" and value:
            call = f"{forward.call}(...)" if forward.call else "the model's forward"
            out.append(CodeChange(forward.file, forward.line, text=(
                f"wrap {call} in with torch.autocast({device_type!r}, dtype=torch.bfloat16):")))
        elif name == "compile" and value:
            mode = "" if value == "default" else f", mode={value!r}"
            out.append(CodeChange(built.file, built.line, text=(
                f"after it: {model}.forward = torch.compile({model}.forward{mode})")))
        elif name == "checkpointing" and value:
            out.append(CodeChange(built.file, built.line,
                                  text=f"after it: {_checkpointing(model, value, sources)}"))
        elif name == "tf32":
            out.append(CodeChange(built.file, built.line, text=(
                f"torch.backends.cuda.matmul.allow_tf32 = {bool(value)}")))
    return out


OWN_LOOP = Library(LIBRARY, "own loop", "hand-written training loop", None, {}, unexpressed,
                   changes, additions, read_loop=read_baseline)
