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

The script is claimed a hand-written loop at that start, unless a Trainer or an Accelerator
claimed it first (`ScriptTrial.kind`). Under torchrun a trial's rank has joined the group
before the script runs: the script's own `init_process_group` finds it joined."""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.data import DataLoader, IterableDataset

from autotune.config import default_optimizer_impl
from autotune.trial.script.observer import TrainInfo, TrainingDone, dataset_size, rows
from autotune.trial.script.session import ScriptTrial, current
from autotune.trial.script.sources import (
    CallSite,
    Source,
    assignment_line,
    call_site,
    caller_site,
    shown_path,
    user_frames,
)
from autotune.trial.training import (
    Unsupported,
    apply_activation_checkpointing,
    checkpointing_problem,
    nonfinite_problem,
)

LIBRARY = "loop"
ACCELERATE = "accelerate"
# The kinds of script whose loop is the script's own (the others are a Trainer's).
OWN_LOOPS = (None, LIBRARY, ACCELERATE)
LOADER_ARGUMENTS = ("batch_size", "num_workers", "prefetch_factor", "pin_memory",
                    "persistent_workers")
# Where a loop's settings are said (the places of `ScriptBaseline.settings`): its own flags,
# the DataLoader its loop trains from, its optimizer, and its model.
FLAGS, LOADER, OPTIMIZER, MODEL = "flags", "DataLoader", "optimizer", "model"
_ADAM = ("Adam", "AdamW")


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

    def __init__(self, trial: ScriptTrial, where: Path) -> None:
        self.trial, self.where = trial, where  # `where`: the script's folder, to name files
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
        # What the kind of script adds: an Accelerator's reading of its own settings.
        self.accelerator: Any = None
        self.read_baseline: Callable[[LoopWatch], Any] | None = None

    # -- what the script builds ------------------------------------------------------------

    def loader_built(self, loader: DataLoader, arguments: dict[str, Any],
                     site: CallSite) -> dict[str, Any]:
        """Record a DataLoader the script builds; the arguments the trial changes in it."""
        own = {name: arguments.get(name) for name in LOADER_ARGUMENTS}
        if own["num_workers"] == 0:
            own["prefetch_factor"], own["persistent_workers"] = None, False
        record = LoaderRecord(own, {n: site.source(n, self.trial.flags, self.where)
                                    for n in LOADER_ARGUMENTS}, site.code(self.where),
                              isinstance(arguments.get("dataset"), IterableDataset))
        loader._autotune_loader = record  # type: ignore[attr-defined]
        return self._loader_changes(record)

    def _loader_changes(self, record: LoaderRecord) -> dict[str, Any]:
        trial, config = self.trial, self.trial.config
        own = trial.own
        if config is None or own is None or trial.kind not in (LIBRARY, ACCELERATE):
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

    def optimizer_built(self, optimizer: torch.optim.Optimizer, site: CallSite) -> None:
        """Record an optimizer the script built, find the model it steps, and apply the
        trial's model knobs there."""
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        record = OptimizerRecord(optimizer, params, site.callee or type(optimizer).__name__,
                                 site.code(self.where))
        pending = getattr(optimizer, "_autotune_impl", None)
        if pending is not None:
            record.impl, record.sources = pending
        self.optimizers[id(optimizer)] = record
        if self.model is None:
            self.model = _stepped_model(params, user_frames(site.frame), self.where)
            if self.model is not None and self.trial.kind == LIBRARY:
                self._model_knobs(self.model)
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
        if config is None or own is None or trial.kind not in (LIBRARY, ACCELERATE) or \
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
        self._checkpointing(self.model)

    # -- the loop's own steps ----------------------------------------------------------------

    def _forward_started(self, module: nn.Module, inputs: Any) -> None:
        """The global forward pre-hook until the training starts: its first forward, with
        gradients on, of a module holding the optimizers' parameters."""
        if self.trial.kind not in OWN_LOOPS or self.started:
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
        trial.kind = trial.kind or LIBRARY
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
        assert self.read_baseline is not None
        trial.baseline = self.read_baseline(self)
        self._precision_flags()
        model = self.model.module if self.model is not None else _holder(self.optimizers)
        optimizer = next(iter(self.optimizers.values())).optimizer if self.optimizers else None
        loader = self.train_loader
        info = TrainInfo(trial.kind or LIBRARY, trial.device, model, optimizer,
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
        if not torch.is_grad_enabled():
            return
        self.forward_rows += rows((args, kwargs))
        if not self.checked:
            self.checked = True
            self._probe_checks(args, kwargs)

    def delivered(self, loader: LoaderRecord | None, batch: Any, wait_s: float) -> None:
        """A batch a DataLoader delivered while gradients are on: a training batch."""
        if self.done or loader is None:
            return
        if self.train_loader is None:
            self.train_loader = loader
        if loader is self.train_loader:
            self.loader_rows += rows(batch)
            self.wait_s += wait_s

    def backward(self, tensor: torch.Tensor) -> None:
        """A backward pass of the loop: a micro-batch, and its loss."""
        if not self.done and not self.checking and (self.started or self.optimizers):
            self.backwards += 1
            if tensor.numel() == 1:
                loss = tensor.float().reshape(())
                self.loss = loss if self.loss is None else self.loss + loss

    def step_started(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer step; the training starts here where no forward started it."""
        if not self.started and not self.done and self.trial.kind in OWN_LOOPS and \
                id(optimizer) in self.optimizers:
            self._stop_watching_forwards()
            self.start(None, None)

    def step_done(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer step done: the observer is told, and may end the loop."""
        if not self.started or self.done or self.trial.kind not in OWN_LOOPS:
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
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # -- the trial's knobs on the model --------------------------------------------------------

    def _model_knobs(self, model: ModelRecord) -> None:
        """A hand-written loop's model, as the trial asks: its repeated blocks checkpointed,
        its forward under bf16 autocast and compiled."""
        config, own = self.trial.config, self.trial.own
        if config is None or own is None:
            return
        self._checkpointing(model)
        base = own.knobs
        autocast = config.precision == "bf16" and base.get("precision") != "bf16"
        compiled = config.compile_mode != base.get("compile_mode", "none")
        if not autocast and not compiled:
            return
        module = model.module
        inner = module.forward
        run = inner if not compiled else torch.compile(
            inner, mode=None if config.compile_mode == "default" else config.compile_mode)
        device = self.trial.device.type

        @functools.wraps(inner)
        def forward(*args: Any, **kwargs: Any) -> Any:
            with torch.autocast(device, dtype=torch.bfloat16) if autocast else \
                    contextlib.nullcontext():
                return run(*args, **kwargs)

        module.forward = forward

    def _checkpointing(self, model: ModelRecord) -> None:
        config, own = self.trial.config, self.trial.own
        if config is None or own is None or config.activation_checkpointing == \
                own.knobs.get("activation_checkpointing", "none"):
            return
        apply_activation_checkpointing(model.module, config.activation_checkpointing)

    def _probe_checks(self, args: Any, kwargs: Any) -> None:
        """The probe's checks on the loop's own batch, on a copy of the model: checkpointing
        must leave the loss and every gradient as they were, and bf16 must leave them finite;
        a value that fails is refused, with why."""
        trial = self.trial
        if trial.config is not None or self.model is None or self.script_compiled:
            return
        module = self.model.module

        def loss(model: nn.Module, batch: Any) -> torch.Tensor:
            return _scalar(model(*batch[0], **batch[1]))

        def build() -> nn.Module:
            return copy.deepcopy(module)

        self.checking = True
        try:
            batch = (args, kwargs)
            for mode in trial.candidates.get("activation_checkpointing", ()):
                if mode != "none":
                    problem = checkpointing_problem(build, batch, loss, mode,
                                                    device=trial.device)
                    if problem:
                        self._refuse("activation_checkpointing", mode, problem)
            if "bf16" in trial.candidates.get("precision", ()) and self.autocast is None:
                problem = nonfinite_problem(build, batch, loss, "bf16", trial.device)
                if problem:
                    self._refuse("precision", "bf16", problem)
        except Exception as exc:  # noqa: BLE001 - a model a copy cannot run is left as it is
            for mode in trial.candidates.get("activation_checkpointing", ()):
                if mode != "none":
                    self._refuse("activation_checkpointing", mode, "the probe could not check it "
                                 f"on a copy of the model: {type(exc).__name__}: {exc}")
        finally:
            self.checking = False

    def _refuse(self, knob: str, value: Any, reason: str) -> None:
        baseline = self.trial.baseline
        if baseline is not None:
            baseline.refused.setdefault(knob, {})[str(value)] = reason


def _scalar(output: Any) -> torch.Tensor:
    """A loss from what the model returned: its loss (a one-element tensor, `.loss`, a
    `loss` key, the first one-element tensor of a tuple), else the sum of its first tensor."""
    if isinstance(output, torch.Tensor):
        return output if output.numel() == 1 else output.float().sum()
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    items = list(output.values()) if isinstance(output, Mapping) else \
        list(output) if isinstance(output, (tuple, list)) else []
    tensors = [t for t in items if isinstance(t, torch.Tensor) and t.is_floating_point()]
    single = [t for t in tensors if t.numel() == 1]
    if single:
        return single[0]
    if tensors:
        return tensors[0].float().sum()
    raise TypeError(f"the model returned {type(output).__name__}, with no tensor to check")


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
def watching_loop(trial: ScriptTrial, where: Path,
                  read_baseline: Callable[[LoopWatch], Any]) -> Iterator[LoopWatch]:
    """While inside, torch is watched for the script's own loop (see the module's docstring);
    every patch is taken back after."""
    watch = LoopWatch(trial, where)
    watch.read_baseline = read_baseline
    trial.loop = watch
    loader_init, loader_iter = DataLoader.__init__, DataLoader.__iter__
    next_batch = torch.utils.data.dataloader._BaseDataLoaderIter.__next__
    optimizer_init, adam_init = torch.optim.Optimizer.__init__, torch.optim.Adam.__init__
    backward, compile_ = torch.Tensor.backward, torch.compile
    init_group = torch.distributed.init_process_group
    loader_signature = inspect.signature(loader_init)
    adam_signature = inspect.signature(adam_init)

    def ours() -> bool:
        return current() is trial and trial.kind in OWN_LOOPS and not watch.done

    @functools.wraps(loader_init)
    def patched_loader_init(self: DataLoader, *args: Any, **kwargs: Any) -> None:
        site = call_site(sys._getframe(1), self) if ours() and not watch.started else None
        if site is None:
            loader_init(self, *args, **kwargs)
            return
        bound = loader_signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        changed = watch.loader_built(self, dict(bound.arguments), site)
        bound.arguments.update(changed)
        try:
            loader_init(*bound.args, **bound.kwargs)
        except Exception as exc:
            if not changed:
                raise
            knob = next(iter(changed))
            raise Unsupported(f"{knob}={changed[knob]}: the script's DataLoader refuses it: "
                              f"{exc}", knob, changed[knob]) from None
        record = self._autotune_loader  # type: ignore[attr-defined]
        record.dataset_size, record.dataset, record.collate = \
            dataset_size(self.dataset), self.dataset, self.collate_fn

    @functools.wraps(loader_iter)
    def patched_iter(self: DataLoader) -> Any:
        iterator = loader_iter(self)
        record = getattr(self, "_autotune_loader", None)
        if record is not None:
            with contextlib.suppress(AttributeError):
                iterator._autotune_loader = record
        return iterator

    @functools.wraps(next_batch)
    def patched_next(self: Any) -> Any:
        if not ours() or not torch.is_grad_enabled():
            return next_batch(self)
        start = time.perf_counter()
        batch = next_batch(self)
        watch.delivered(getattr(self, "_autotune_loader", None), batch,
                        time.perf_counter() - start)
        return batch

    @functools.wraps(optimizer_init)
    def patched_optimizer_init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        optimizer_init(self, *args, **kwargs)
        if ours() and not watch.started:
            site = call_site(sys._getframe(1), self)
            if site is not None:
                watch.optimizer_built(self, site)

    @functools.wraps(adam_init)
    def patched_adam_init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        site = call_site(sys._getframe(1), self) if ours() and not watch.started else None
        if site is None or type(self).__name__ not in _ADAM:
            adam_init(self, *args, **kwargs)
            return
        bound = adam_signature.bind(self, *args, **kwargs)
        changed = watch.adam_changes(self, bound.arguments, site)
        bound.arguments.update(changed)
        try:
            adam_init(*bound.args, **bound.kwargs)
        except Exception as exc:
            if not changed:
                raise
            impl = "fused" if changed["fused"] else "foreach" if changed["foreach"] else \
                "for_loop"
            raise Unsupported(f"optimizer_impl={impl}: the script's {type(self).__name__} "
                              f"refuses it: {exc}", "optimizer_impl", impl) from None

    @functools.wraps(backward)
    def patched_backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if ours():
            watch.backward(self.detach())
        return backward(self, *args, **kwargs)

    @functools.wraps(compile_)
    def patched_compile(*args: Any, **kwargs: Any) -> Any:
        if ours():
            site = call_site(sys._getframe(1))
            if site is not None:
                watch.script_compiles(site)
        return compile_(*args, **kwargs)

    @functools.wraps(init_group)
    def patched_init_group(*args: Any, **kwargs: Any) -> None:
        if current() is trial and torch.distributed.is_initialized():
            return None  # the trial's rank joined the group torchrun started before the script
        return init_group(*args, **kwargs)

    def pre_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if ours():
            watch.step_started(optimizer)

    def post_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if current() is trial:
            watch.step_done(optimizer)

    DataLoader.__init__ = patched_loader_init  # type: ignore[method-assign]
    DataLoader.__iter__ = patched_iter  # type: ignore[method-assign]
    torch.utils.data.dataloader._BaseDataLoaderIter.__next__ = patched_next
    torch.optim.Optimizer.__init__ = patched_optimizer_init  # type: ignore[method-assign]
    torch.optim.Adam.__init__ = patched_adam_init  # type: ignore[method-assign]
    torch.Tensor.backward = patched_backward  # type: ignore[method-assign]
    torch.compile = patched_compile  # type: ignore[assignment]
    torch.distributed.init_process_group = patched_init_group
    hooks = [register_optimizer_step_pre_hook(pre_step),
             register_optimizer_step_post_hook(post_step)]
    try:
        yield watch
    finally:
        DataLoader.__init__ = loader_init  # type: ignore[method-assign]
        DataLoader.__iter__ = loader_iter  # type: ignore[method-assign]
        torch.utils.data.dataloader._BaseDataLoaderIter.__next__ = next_batch
        torch.optim.Optimizer.__init__ = optimizer_init  # type: ignore[method-assign]
        torch.optim.Adam.__init__ = adam_init  # type: ignore[method-assign]
        torch.Tensor.backward = backward  # type: ignore[method-assign]
        torch.compile = compile_  # type: ignore[assignment]
        torch.distributed.init_process_group = init_group
        for hook in hooks:
            hook.remove()
        watch.finish()

