"""An Accelerate script (`accelerator.prepare`, `accelerator.accumulate`,
`accelerator.backward`, as Hugging Face's `*_no_trainer.py` examples) in a script trial: its
first `Accelerator(...)` makes it one. The trial's knobs go through Accelerate's own settings,
given to that Accelerator as it is built: its mixed precision, gradient accumulation, the
dynamo plugin (torch.compile), DDP's kwargs handler; the model it prepares is checkpointed there;
its DataLoader's workers and its AdamW's implementation are set where the script builds them
(`loop`). The script's own settings are read from the Accelerator it built (what its code
passes, else what `accelerate launch` put in the environment). Nothing is logged to a tracker,
and what it saves goes to the trial's scratch folder. Its loop is watched as any script's own
loop is (`loop`): a step is each step its optimizer really takes (the accelerator's
`sync_gradients`). Accelerate is never imported here: the patch is installed when the script
imports it."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from autotune.trial.distributed import launched_world_size
from autotune.trial.script.errors import check_device
from autotune.trial.script.library import Library
from autotune.trial.script.session import ScriptTrial, current
from autotune.trial.script.sources import CallSite, Source, call_site
from autotune.trial.training import Unsupported

# accelerate launch's flag for each of the Accelerator's settings it puts in the environment.
LAUNCH_FLAGS = {"mixed_precision": ("--mixed_precision", "ACCELERATE_MIXED_PRECISION"),
                "gradient_accumulation_steps": ("--gradient_accumulation_steps",
                                                "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"),
                "dynamo_backend": ("--dynamo_backend", "ACCELERATE_DYNAMO_BACKEND"),
                "dynamo_mode": ("--dynamo_mode", "ACCELERATE_DYNAMO_MODE")}
MIXED_PRECISION = {"fp32": "no", "tf32": "no", "bf16": "bf16", "fp16": "fp16"}


@dataclass
class AcceleratorRecord:
    """The Accelerator the script built: itself, its line, and where each of its settings is
    said (its code, the script's flag, or accelerate launch's)."""

    accelerator: Any
    site: Source
    sources: dict[str, Source] = field(default_factory=dict)
    plugin_given: bool = False       # the script passes its own TorchDynamoPlugin
    accumulation_given: bool = False  # ... its own GradientAccumulationPlugin


def patch_accelerator(module: ModuleType, library: Library) -> None:
    """`accelerate.accelerator`: the first Accelerator a script trial builds takes the trial's
    settings; prepare_model checkpoints, prepare_data_loader keeps the script's loader known;
    saving goes to the scratch folder."""
    cls = module.Accelerator
    if getattr(cls, "_autotune_patched", False):
        return
    init, prepare_model, prepare_loader = cls.__init__, cls.prepare_model, \
        cls.prepare_data_loader
    signature = inspect.signature(init)

    @functools.wraps(init)
    def patched_init(self: Any, *args: Any, **kwargs: Any) -> None:
        trial = current()
        site = call_site(sys._getframe(1), self) if trial is not None and \
            trial.own_loop and trial.loop is not None and \
            trial.loop.accelerator is None and not trial.training else None
        if site is None:
            init(self, *args, **kwargs)
            return
        assert trial is not None
        trial.library = library
        bound = signature.bind(self, *args, **kwargs)
        record = _record(self, site, bound.arguments, trial)
        changed = _trial_arguments(trial, bound.arguments, record)
        bound.arguments.update(changed)
        _fresh_state()
        try:
            with _environment(changed):
                init(*bound.args, **bound.kwargs)
        except Exception as exc:
            if trial.config is None:
                raise
            raise Unsupported(f"the script's Accelerator refuses the trial's settings "
                              f"({', '.join(f'{k}={v}' for k, v in changed.items())}): "
                              f"{type(exc).__name__}: {exc}") from None
        check_device(trial.script, self.device, trial.device,
                     "its Accelerator takes the GPU where there is one, the CPU with cpu=True")
        trial.loop.accelerator = record

    @functools.wraps(prepare_model)
    def patched_prepare_model(self: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
        trial = current()
        if trial is not None and trial.loop is not None and \
                getattr(trial.loop.accelerator, "accelerator", None) is self and \
                not trial.training:
            trial.loop.prepared(model)
        return prepare_model(self, model, *args, **kwargs)

    @functools.wraps(prepare_loader)
    def patched_prepare_loader(self: Any, data_loader: Any, *args: Any, **kwargs: Any) -> Any:
        prepared = prepare_loader(self, data_loader, *args, **kwargs)
        record = getattr(data_loader, "_autotune_loader", None)
        if record is not None:  # the loader it iterates is built anew: it is the script's
            base = vars(prepared).get("base_dataloader", prepared)
            for loader in (prepared, base):
                loader._autotune_loader = record
        return prepared

    cls.__init__, cls.prepare_model = patched_init, patched_prepare_model
    cls.prepare_data_loader = patched_prepare_loader
    for name in ("save_state", "save_model"):
        setattr(cls, name, _saving_elsewhere(getattr(cls, name)))
    cls._autotune_patched = True


def _record(accelerator: Any, site: CallSite, arguments: dict[str, Any],
            trial: ScriptTrial) -> AcceleratorRecord:
    """Where each of the script's Accelerator settings is said."""
    where = trial.loop.where
    record = AcceleratorRecord(accelerator, site.code(where),
                               plugin_given=arguments.get("dynamo_plugin") is not None,
                               accumulation_given=arguments.get(
                                   "gradient_accumulation_plugin") is not None)
    for name, (flag, _) in LAUNCH_FLAGS.items():
        given = "dynamo_backend" if name == "dynamo_mode" else name
        record.sources[name] = site.source(given, trial.flags, where) \
            if site.passes(given) else Source(launcher=flag)
    return record


def _trial_arguments(trial: ScriptTrial, arguments: dict[str, Any],
                     record: AcceleratorRecord) -> dict[str, Any]:
    """The Accelerator's arguments the trial gives it: nothing tracked, saved in the scratch
    folder, on the trial's device, and the trial's knobs that differ from the script's own."""
    from accelerate.utils import (
        DistributedDataParallelKwargs,
        ProjectConfiguration,
        TorchDynamoPlugin,
    )

    scratch = str(trial.scratch_dir / "accelerate")
    out: dict[str, Any] = {"log_with": None}
    if arguments.get("project_config") is not None:
        out["project_config"] = ProjectConfiguration(project_dir=scratch)
    else:
        out["project_dir"] = scratch
    if trial.device.type == "cpu":
        out["cpu"] = True
    config, own = trial.config, trial.own
    if config is None or own is None:
        return out
    base = own.knobs
    if config.precision != base.get("precision"):
        out["mixed_precision"] = MIXED_PRECISION[config.precision]
    if config.grad_accum_steps != base.get("grad_accum_steps"):
        if record.accumulation_given:
            raise Unsupported("grad_accum_steps: the script gives its Accelerator a "
                              "GradientAccumulationPlugin of its own", "grad_accum_steps",
                              config.grad_accum_steps)
        out["gradient_accumulation_steps"] = config.grad_accum_steps
    if config.compile_mode != base.get("compile_mode", "none"):
        out.pop("dynamo_backend", None)
        arguments.pop("dynamo_backend", None)
        out["dynamo_plugin"] = TorchDynamoPlugin(
            backend="no" if config.compile_mode == "none" else "inductor",
            mode=None if config.compile_mode in ("none", "default") else config.compile_mode)
    if config.parallelism == "ddp" and config.distributed() != {
            k: base.get(k) for k in config.distributed()}:
        handlers = [h for h in arguments.get("kwargs_handlers") or []
                    if not isinstance(h, DistributedDataParallelKwargs)]
        own_ddp = next((h for h in arguments.get("kwargs_handlers") or []
                        if isinstance(h, DistributedDataParallelKwargs)), None)
        kept = own_ddp.to_kwargs() if own_ddp is not None else {}
        out["kwargs_handlers"] = [*handlers, DistributedDataParallelKwargs(**{
            **kept, "bucket_cap_mb": config.ddp_bucket_cap_mb,
            "static_graph": config.ddp_static_graph,
            "gradient_as_bucket_view": config.ddp_gradient_as_bucket_view})]
    return out


def _fresh_state() -> None:
    """Accelerate's shared state as a new process has it: the script's first Accelerator is
    this run's, whatever an earlier run in the same process left (its state is built once)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=launched_world_size() <= 1)
    GradientState._reset_state()


@contextlib.contextmanager
def _environment(changed: dict[str, Any]) -> Iterator[None]:
    """accelerate launch's variable for the accumulation wins over the Accelerator's argument:
    it says the trial's while the Accelerator is built."""
    name = LAUNCH_FLAGS["gradient_accumulation_steps"][1]
    value, saved = changed.get("gradient_accumulation_steps"), os.environ.get(name)
    if value is not None and saved is not None:
        os.environ[name] = str(value)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved


def _saving_elsewhere(save: Any) -> Any:
    """Accelerator.save_state/save_model, into the trial's scratch folder, never the
    script's own output directory."""
    @functools.wraps(save)
    def saved(self: Any, *args: Any, **kwargs: Any) -> Any:
        trial = current()
        if trial is None or trial.loop is None or trial.loop.accelerator is None:
            return save(self, *args, **kwargs)
        folder = str(trial.scratch_dir / "accelerate" / "saved")
        bound = inspect.signature(save).bind(self, *args, **kwargs)
        for name in ("output_dir", "save_directory"):
            if name in inspect.signature(save).parameters:
                bound.arguments[name] = folder
        return save(*bound.args, **bound.kwargs)

    return saved
