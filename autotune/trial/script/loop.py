"""A script's own training loop in a trial: one written by hand (in the style of nanoGPT's
`train.py`), or one an Accelerator drives. torch is watched, the script is never changed.

- The DataLoaders the script builds are seen as it builds them (`DataLoader.__init__`: its own
  settings and the line, the values from its flags), and the trial's loader settings go to the
  one its loop trains from (the probe found its line), at construction, as the script would
  write them. The batches a loader delivers while gradients are on are its training batches:
  their rows are a step's samples, the time it took to fetch them its wait for data.
- An AdamW (or Adam) the script builds takes the trial's implementation (`foreach`/`fused`)
  at construction, over the same parameter groups.
- The model is the module whose parameters the first optimizer holds, found among the script's
  variables when it builds that optimizer; the trial's precision (bf16 autocast around its
  forward), `torch.compile` of its forward and activation checkpointing of its repeated blocks
  are applied to it there.
- The training starts at the first forward, with gradients on, of a module holding those
  parameters (so the first step's time has the compile in it); each backward is a micro-batch
  and its loss; each step of that optimizer (PyTorch's own step hooks: an Accelerator's
  optimizer steps only when it syncs the gradients) is an optimizer step told to the
  observer, which ends the loop when its measurement is done (`TrainingDone`).
- What the script does outside its training is no step's time (`training_clock`): from its
  training loader's running out (an epoch's end), or a forward of its model with gradients
  off (an evaluation), to its next training batch, loader epoch, forward with gradients on
  or backward.

The script is claimed a hand-written loop at that start, unless a Trainer or an Accelerator
claimed it first (`ScriptTrial.library`). Under torchrun a trial's rank has joined the group
before the script runs: the script's own `init_process_group` finds it joined."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from autotune.config import default_optimizer_impl
from autotune.trial import training_clock
from autotune.trial.script.library import Library
from autotune.trial.script.loop_model import apply_checkpointing, apply_model_knobs, probe_checks
from autotune.trial.script.loop_patches import patched
from autotune.trial.script.observer import TrainInfo, TrainingDone, rows
from autotune.trial.script.session import ScriptTrial, current
from autotune.trial.script.sightings import Sightings
from autotune.trial.script.sources import (
    CallSite,
    Source,
    assignment_line,
    caller_site,
    shown_path,
    user_frames,
)
from autotune.trial.training import (
    Unsupported,
)

LOADER_ARGUMENTS = ("batch_size", "num_workers", "prefetch_factor", "pin_memory",
                    "persistent_workers")
# Where a loop's settings are said (the places of `ScriptBaseline.settings`): its own flags,
# the DataLoader its loop trains from, its optimizer, and its model.
FLAGS, LOADER, OPTIMIZER, MODEL = "flags", "DataLoader", "optimizer", "model"


@dataclass
class LoaderRecord:
    """A DataLoader the script built: its own settings, where each is said, its line."""

    own: dict[str, Any]
    sources: dict[str, Source]
    site: Source
    iterable: bool
    dataset_size: int | None = None
    # What its batches are made of: its dataset and collate function (what the probe sizes).
    dataset: Any = None
    collate: Callable[[list[Any]], Any] | None = None
    # Built inside a library's function the script called (timm's `create_loader`): its name,
    # and the settings that call does not pass (nowhere in the script to set them).
    factory: str | None = None
    unpassed: tuple[str, ...] = ()


@dataclass
class OptimizerRecord:
    """An optimizer the script built: its parameters, its class as the script names it, its
    own implementation (an Adam's), where each of its settings is said, and its line."""

    optimizer: torch.optim.Optimizer
    params: set[int]
    where: str
    site: Source
    impl: str | None = None
    sources: dict[str, Source] = field(default_factory=dict)


@dataclass
class ModelRecord:
    """The module whose parameters the optimizer steps, the name the script gives it, and the
    line that builds it (where the answer adds what goes after it)."""

    module: nn.Module
    name: str | None
    built: Source | None


class LoopWatch:
    """What a trial sees of, and sets in, a script's own loop (see the module's docstring)."""

    def __init__(self, trial: ScriptTrial, where: Path, own_loop: Library) -> None:
        self.trial, self.where = trial, where  # `where`: the script's folder, to name files
        self.own_loop = own_loop  # the library of a loop no other library claims
        self.train_loader: LoaderRecord | None = None
        self.optimizers: dict[int, OptimizerRecord] = {}
        self.main: OptimizerRecord | None = None
        self.model: ModelRecord | None = None
        self.forward_site: Source | None = None  # the loop's call of the model
        self.script_compiled: Source | None = None
        self.autocast: torch.dtype | None = None  # the script's own, around the forward
        self.started = self.done = False
        self.startup_s = 0.0
        self.loader_rows = self.forward_rows = self.backwards = 0
        self.wait_s = 0.0
        self.loss: torch.Tensor | None = None
        self.checked = self.checking = False
        self._first_forward: Any = None
        self._handles: list[Any] = []
        # What an Accelerate loop adds: its Accelerator, as `accelerate` records it.
        self.accelerator: Any = None
        # What the script did before the training started (a probe's message says it).
        self.seen = Sightings()
        if trial.config is None:
            self.seen.watch_forwards(lambda: trial.training)

    @property
    def _library(self) -> Library:
        """The library whose loop this is: the one that claimed it, else a hand-written loop."""
        return self.trial.library or self.own_loop

    def ours(self) -> bool:
        """Whether what torch does now is the trial's own loop's, still being watched."""
        return current() is self.trial and self.trial.own_loop and not self.done

    # -- what the script builds ------------------------------------------------------------

    def loader_built(self, loader: DataLoader, arguments: dict[str, Any],
                     site: CallSite, factory: bool = False) -> dict[str, Any]:
        """Record a DataLoader the script builds (a `factory`: a library's function the script
        called at `site` built it); the arguments the trial changes in it."""
        own = {name: arguments.get(name) for name in LOADER_ARGUMENTS}
        if own["num_workers"] == 0:
            own["prefetch_factor"], own["persistent_workers"] = None, False
        record = LoaderRecord(own, {n: site.source(n, self.trial.flags, self.where)
                                    for n in LOADER_ARGUMENTS}, site.code(self.where),
                              isinstance(arguments.get("dataset"), IterableDataset))
        if factory:
            record.factory = site.callee or "a library's function"
            record.unpassed = tuple(n for n in LOADER_ARGUMENTS[1:] if not site.passes(n)
                                    and not record.sources[n].flag)
        loader._autotune_loader = record  # type: ignore[attr-defined]
        self.seen.loaders.append(f"{record.site.file}:{record.site.line}, batch_size "
                                 f"{own['batch_size']}")
        return self._loader_changes(record)

    def _loader_changes(self, record: LoaderRecord) -> dict[str, Any]:
        trial, config = self.trial, self.trial.config
        own = trial.own
        if config is None or own is None or not trial.own_loop:
            return {}
        line = own.sources.get(LOADER, {}).get("")
        if line is None or (line.get("file"), line.get("line")) != \
                (record.site.file, record.site.line):
            return {}
        asked = {"num_workers": config.num_workers,
                 "prefetch_factor": config.prefetch_factor if config.num_workers else None,
                 "pin_memory": config.pin_memory and trial.device.type == "cuda",
                 "persistent_workers": config.persistent_workers and config.num_workers > 0}
        changed = {k: v for k, v in asked.items() if v != record.own[k]}
        if changed.get("num_workers") and record.iterable and not record.own["num_workers"]:
            raise Unsupported(f"num_workers={config.num_workers}: the loop's DataLoader reads an "
                              "IterableDataset, which each worker would read whole",
                              "num_workers", config.num_workers)
        return changed

    def optimizer_built(self, optimizer: torch.optim.Optimizer, site: CallSite,
                        factory: bool = False) -> None:
        """Record an optimizer the script built (at `site`; a `factory`: a library's function
        the script called there built it), find the model it steps, and apply the trial's
        model knobs there."""
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        name = type(optimizer).__name__
        where = f"the {name} that {site.callee or 'a library'} built" if factory else \
            site.callee or name
        record = OptimizerRecord(optimizer, params, where, site.code(self.where))
        pending = getattr(optimizer, "_autotune_impl", None)
        if pending is not None:
            record.impl, record.sources = pending
        self.optimizers[id(optimizer)] = record
        if self.model is None:
            self.model = _stepped_model(params, user_frames(site.frame), self.where)
            if self.model is not None and not self._library.prepares_model:
                apply_model_knobs(self.trial, self.model.module)
        if self._first_forward is None and not self.started:
            self._first_forward = nn.modules.module.register_module_forward_pre_hook(
                self._forward_started)

    def adam_changes(self, optimizer: torch.optim.Optimizer, arguments: Mapping[str, Any],
                     site: CallSite) -> dict[str, Any]:
        """An Adam or AdamW the script builds: its own implementation read, and the
        `foreach`/`fused` the trial gives it instead."""
        flags = {"foreach": arguments.get("foreach"), "fused": arguments.get("fused")}
        impl = "fused" if flags["fused"] else "foreach" if flags["foreach"] else \
            "for_loop" if flags["foreach"] is False else default_optimizer_impl(
                self.trial.device.type)
        sources = {n: site.source(n, self.trial.flags, self.where) for n in flags}
        optimizer._autotune_impl = (impl, sources)  # type: ignore[attr-defined]
        trial, config, own = self.trial, self.trial.config, self.trial.own
        if config is None or own is None or not trial.own_loop or \
                config.optimizer_impl == impl:
            return {}
        line = own.sources.get(OPTIMIZER, {}).get("")
        if line is None or (line.get("file"), line.get("line")) != (
                site.code(self.where).file, site.line):
            return {}
        return {"foreach": config.optimizer_impl == "foreach",
                "fused": config.optimizer_impl == "fused"}

    def script_compiles(self, site: CallSite) -> None:
        """The script calls torch.compile itself (its model, or a function)."""
        if self.script_compiled is None:
            self.script_compiled = site.code(self.where)

    def prepared(self, model: nn.Module) -> None:
        """An Accelerator prepared `model`: it is the model, checkpointed as the trial asks
        (its precision and compile are the Accelerator's)."""
        if self.model is None or self.model.module is not model:
            built = self.model.built if self.model is not None else None
            self.model = ModelRecord(model, self.model.name if self.model else None, built)
        apply_checkpointing(self.trial, self.model.module)

    # -- the loop's own steps ----------------------------------------------------------------

    def _forward_started(self, module: nn.Module, inputs: Any) -> None:
        """The global forward pre-hook until the training starts: its first forward, with
        gradients on, of a module holding the optimizers' parameters."""
        if not self.trial.own_loop or self.started:
            self._stop_watching_forwards()
            return
        if not torch.is_grad_enabled() or not self._holds_parameters(module):
            return
        self._stop_watching_forwards()
        self.start(module, caller_site(sys._getframe(1)))
        self.forward_rows += rows(inputs)

    def _holds_parameters(self, module: nn.Module) -> bool:
        params = set().union(*(r.params for r in self.optimizers.values()))
        return any(id(p) in params for p in module.parameters())

    def _stop_watching_forwards(self) -> None:
        if self._first_forward is not None:
            self._first_forward.remove()
            self._first_forward = None

    def start(self, module: nn.Module | None, site: CallSite | None) -> None:
        """The training starts: the script's start-up ends here, its settings are read, and
        the observer is told."""
        trial = self.trial
        library = trial.library = self._library
        self.seen.stop()
        self.started = True
        self.startup_s = trial.training_called()
        if module is not None:
            self._handles.append(module.register_forward_pre_hook(self._counted,
                                                                  with_kwargs=True))
            if torch.is_autocast_enabled(trial.device.type):
                self.autocast = torch.get_autocast_dtype(trial.device.type)
        if site is not None:
            self.forward_site = site.code(self.where)
        if self.model is None and module is not None:
            self.model = ModelRecord(_unwrapped(module), None, None)
        assert library.read_loop is not None
        trial.baseline = library.read_loop(self)
        self._precision_flags()
        model = self.model.module if self.model is not None else _holder(self.optimizers)
        optimizer = next(iter(self.optimizers.values())).optimizer if self.optimizers else None
        loader = self.train_loader
        info = TrainInfo(library.name, trial.device, model, optimizer,
                         trial.baseline.knobs.get("micro_batch_size", 0),
                         trial.baseline.knobs.get("grad_accum_steps", 1), self.startup_s,
                         trial.settings, _dataset_size(loader),
                         dataset=loader.dataset if loader is not None else None,
                         collate=loader.collate if loader is not None else None)
        trial.observer.on_train_start(info)

    def _precision_flags(self) -> None:
        """TF32 on CUDA as the trial asks, set once the script has set its own."""
        config = self.trial.config
        if config is None or self.trial.device.type != "cuda" or \
                self.trial.own is None or "precision" in self.trial.own.fixed:
            return
        torch.backends.cuda.matmul.allow_tf32 = config.precision == "tf32"

    def _counted(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        if not torch.is_grad_enabled():  # the model evaluated: outside its training
            if not self.done and not self.checking:
                training_clock.pause()
            return
        training_clock.resume()
        self.forward_rows += rows((args, kwargs))
        if not self.checked:
            self.checked = True
            if self.trial.config is None and self.model is not None and \
                    not self.script_compiled:
                self.checking = True
                try:
                    probe_checks(self.trial, self.model.module, args, kwargs, self.autocast)
                finally:
                    self.checking = False

    def delivered(self, loader: LoaderRecord | None, batch: Any, wait_s: float) -> None:
        """A batch a DataLoader delivered while gradients are on: a training batch."""
        if self.done or loader is None:
            return
        training_clock.resume()
        if self.train_loader is None:
            self.train_loader = loader
        if loader is self.train_loader:
            self.loader_rows += rows(batch)
            self.wait_s += wait_s

    def exhausted(self, loader: LoaderRecord | None) -> None:
        """The training loader's batches ran out: its epoch ended, and what the script does
        until it asks for the next (its evaluation, its checkpoints) is outside its training."""
        if self.started and not self.done and loader is not None and \
                loader is self.train_loader:
            training_clock.pause()

    def iterating(self, loader: LoaderRecord | None) -> None:
        """A loader's epoch begins: the training loader's resumes the training."""
        if loader is not None and loader is self.train_loader:
            training_clock.resume()

    def backward(self, tensor: torch.Tensor) -> None:
        """A backward pass of the loop: a micro-batch, and its loss."""
        if not self.started and not self.checking:
            self.seen.backwards += 1
        if not self.done and not self.checking and (self.started or self.optimizers):
            training_clock.resume()  # however the loop got its batch (`itertools.cycle`)
            self.backwards += 1
            if tensor.numel() == 1:
                loss = tensor.float().reshape(())
                self.loss = loss if self.loss is None else self.loss + loss

    def step_started(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer step; the training starts here where no forward started it."""
        if not self.started and id(optimizer) not in self.optimizers:
            self.seen.steps[type(optimizer).__name__] += 1
        if not self.started and not self.done and self.trial.own_loop and \
                id(optimizer) in self.optimizers:
            self._stop_watching_forwards()
            self.start(None, None)

    def step_done(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer step done: the observer is told, and may end the loop."""
        if not self.started or self.done or not self.trial.own_loop:
            return
        if self.main is None:
            self.main = self.optimizers.get(id(optimizer))
        if self.main is None or self.main.optimizer is not optimizer:
            return
        trial = self.trial
        samples = self.loader_rows or self.forward_rows
        micro_steps = self.backwards
        trial.steps += 1
        if trial.steps == 2:  # the first step after the one the training started in
            self._check_batch(samples, micro_steps)
        if trial.config is None and trial.baseline is not None and micro_steps:
            own = self.train_loader.own.get("batch_size") if self.train_loader else None
            trial.baseline.knobs["grad_accum_steps"] = trial.baseline.knobs.get(
                "grad_accum_steps") or micro_steps
            accum = trial.baseline.knobs["grad_accum_steps"]
            trial.baseline.knobs["micro_batch_size"] = own or max(1, samples // accum)
        loss, wait_s = self.loss, self.wait_s
        self.loader_rows = self.forward_rows = self.backwards = 0
        self.wait_s, self.loss = 0.0, None
        if trial.observer.on_step_end(samples, loss, wait_s):
            trial.stopped_by_observer = self.done = True
            trial.observer.on_train_end()
            raise TrainingDone

    def _check_batch(self, samples: int, micro_steps: int) -> None:
        """A trial that changed the micro-batch or accumulation (through the script's flags)
        must find them in the loop's steps."""
        config, own = self.trial.config, self.trial.own
        if config is None or own is None or not samples:
            return
        if (config.micro_batch_size, config.grad_accum_steps) == \
                (own.knobs.get("micro_batch_size"), own.knobs.get("grad_accum_steps")):
            return
        if samples != config.effective_batch_size or micro_steps != config.grad_accum_steps:
            raise Unsupported(
                f"micro_batch_size={config.micro_batch_size}, grad_accum_steps="
                f"{config.grad_accum_steps}: with the script's flags set so, its loop ran "
                f"{samples} samples in {micro_steps} backward passes an optimizer step",
                "micro_batch_size", config.micro_batch_size)

    def finish(self) -> None:
        """The run is over: every hook this watch added to the script's objects removed."""
        self._stop_watching_forwards()
        self.seen.stop()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _unwrapped(module: nn.Module) -> nn.Module:
    """The module inside a DistributedDataParallel or torch.compile wrapper."""
    while True:
        inner = getattr(module, "_orig_mod", None) or (
            getattr(module, "module", None) if type(module).__name__ in
            ("DistributedDataParallel", "DataParallel") else None)
        if not isinstance(inner, nn.Module):
            return module
        module = inner


def _stepped_model(params: set[int], frames: list[Any], where: Path) -> ModelRecord | None:
    """The module that holds the most of `params`, among the variables of the user's frames
    (the outermost where several hold as many), with the name the script gives it and the
    line that builds it."""
    found: dict[int, tuple[nn.Module, list[tuple[str, Any]]]] = {}
    for frame in frames:
        for name, value in [*frame.f_locals.items(), *frame.f_globals.items()]:
            if isinstance(value, nn.Module):
                module = _unwrapped(value)
                found.setdefault(id(module), (module, []))[1].append((name, frame))
    scored = [(sum(id(p) in params for p in m.parameters()), m, names)
              for m, names in found.values()]
    scored = [s for s in scored if s[0]]
    if not scored:
        return None
    best = max(s[0] for s in scored)
    top = [s for s in scored if s[0] == best]
    outer = [s for s in top if not any(o[1] is not s[1] and any(c is s[1] for c in o[1].modules())
                                       for o in top)]
    _, module, names = (outer or top)[0]
    named = [(n, f) for n, f in names if n != "self"]
    if not named:
        return ModelRecord(module, None, None)
    name, frame = named[-1]  # the outermost frame's name: where the script built it
    line = assignment_line(frame.f_code.co_filename, name)
    built = Source(file=shown_path(frame.f_code.co_filename, where), line=line, call=name) \
        if line else None
    return ModelRecord(module, name, built)


def _holder(optimizers: Mapping[int, OptimizerRecord]) -> nn.Module:
    """A module holding the optimizers' parameters, where no model of the script's was found
    (for the parameter count)."""
    params = [p for r in optimizers.values() for g in r.optimizer.param_groups
              for p in g["params"]]
    return nn.ParameterList(params)


def _dataset_size(loader: LoaderRecord | None) -> int | None:
    return loader.dataset_size if loader is not None else None


@contextlib.contextmanager
def watching_loop(trial: ScriptTrial, where: Path, own_loop: Library) -> Iterator[LoopWatch]:
    """While inside, torch is watched for the script's own loop (see the module's docstring,
    and `loop_patches` for the entry points); every patch is taken back after. `own_loop`: the
    library of a loop no library claims (a hand-written one)."""
    watch = LoopWatch(trial, where, own_loop)
    trial.loop = watch
    try:
        with patched(watch):
            yield watch
    finally:
        watch.finish()
