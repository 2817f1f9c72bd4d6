"""Hugging Face `transformers.Trainer` in a script trial: the trial's knobs applied through
`TrainingArguments` before the Trainer builds its Accelerator (mixed precision is fixed there),
the script's own settings read from the TrainingArguments it built, its side effects turned off,
and its own training loop measured through a `TrainerCallback`.

The base class is patched, so subclasses (TRL's SFTTrainer) go through it. transformers is never
imported here: the patches are installed when the script imports it (`imports`)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from autotune.trial.script.errors import check_device
from autotune.trial.script.hf_terms import (
    FIELDS,
    LIBRARY,
    changes,
    read_baseline,
    run_steps,
    training_arguments,
    unexpressed,
)
from autotune.trial.script.library import Library
from autotune.trial.script.observer import StepTally, TrainInfo, TrainingDone, dataset_size
from autotune.trial.script.session import ScriptBaseline, ScriptTrial, current
from autotune.trial.script.sources import call_site, named_flag
from autotune.trial.script.worst_batch import only
from autotune.trial.training import Unsupported

# Nothing the script's own run would write or send: no output, checkpoints, evaluation, hub
# pushes or experiment trackers, no progress bar; and no batch size halved on an OOM, which must
# be the trial's result.
_QUIET = {"save_strategy": "no", "eval_strategy": "no", "load_best_model_at_end": False,
          "eval_on_start": False, "push_to_hub": False, "report_to": "none",
          "disable_tqdm": True, "auto_find_batch_size": False, "enable_jit_checkpoint": False}
_PARSERS = ("parse_args_into_dataclasses", "parse_dict", "parse_json_file", "parse_yaml_file")


def patch_trainer(module: ModuleType, library: Library) -> None:
    """`transformers.trainer`: Trainer.__init__ takes the trial's TrainingArguments, and
    Trainer.train runs measured and then ends the script."""
    trainer_cls = module.Trainer
    if getattr(trainer_cls, "_autotune_patched", False):
        return
    init, train = trainer_cls.__init__, trainer_cls.train
    signature, train_signature = inspect.signature(init), inspect.signature(train)
    callback_cls = _callback_class(module.TrainerCallback)

    @functools.wraps(init)
    def patched_init(self: Any, *args: Any, **kwargs: Any) -> None:
        trial = current()
        if trial is None or trial.training:
            init(self, *args, **kwargs)
            return
        trial.library = library  # its Accelerator, optimizer and DataLoader are the Trainer's
        bound = signature.bind(self, *args, **kwargs)
        own_arguments = bound.arguments.get("args") or \
            module.TrainingArguments(output_dir="tmp_trainer")
        baseline = read_baseline(own_arguments, trial.device.type, bound.arguments.get("model"))
        bound.arguments["args"], settings = _trial_arguments(trial, own_arguments, baseline)
        init(*bound.args, **bound.kwargs)
        baseline.run_steps = run_steps(own_arguments, dataset_size(self.train_dataset))
        check_device(trial.script, self.args.device, trial.device, "TrainingArguments takes the "
                     "GPU where there is one, the CPU with use_cpu=True")
        self._autotune_trial = (baseline, settings)

    @functools.wraps(train)
    def patched_train(self: Any, *args: Any, **kwargs: Any) -> Any:
        trial = current()
        prepared = getattr(self, "_autotune_trial", None)
        if trial is None or trial.training or prepared is None:
            return train(self, *args, **kwargs)
        startup_s = trial.training_called()
        trial.baseline, trial.settings = prepared
        for knob, flag in trial.flag_map.items():
            trial.baseline.said("TrainingArguments", FIELDS[knob],
                                named_flag(flag, trial.flags, knob))
        if trial.worst is not None:
            self.train_dataset = only(self.train_dataset, trial.worst)
        tally = StepTally()
        self.add_callback(callback_cls(trial, self, tally, startup_s))
        _tally_micro_steps(self, tally)
        _keep_train_loader(self)
        bound = train_signature.bind(self, *args, **kwargs)
        bound.arguments.pop("resume_from_checkpoint", None)  # never the user's checkpoint
        train(*bound.args, **bound.kwargs)
        trial.observer.on_train_end()
        raise TrainingDone

    trainer_cls.__init__, trainer_cls.train = patched_init, patched_train
    trainer_cls._autotune_patched = True


def patch_arguments(module: ModuleType, library: Library) -> None:
    """`transformers.training_args`: where each TrainingArguments field the script passes is
    said (its own flag, or the line), recorded as it builds them."""
    cls = module.TrainingArguments
    if getattr(cls, "_autotune_patched", False):
        return
    post_init = cls.__post_init__

    @functools.wraps(post_init)
    def patched_post_init(self: Any, *args: Any, **kwargs: Any) -> Any:
        trial = current()
        if trial is not None and not trial.training and trial.library in (None, library) and \
                "_autotune_sources" not in vars(self):
            site = call_site(sys._getframe(1), self)
            if site is not None:
                where = trial.folder
                sources = {"": site.code(where).to_dict()}
                for keyword in site.call.keywords if site.call is not None else ():
                    if keyword.arg:
                        sources[keyword.arg] = site.source(keyword.arg, trial.flags,
                                                           where).to_dict()
                self._autotune_sources = sources
        return post_init(self, *args, **kwargs)

    cls.__post_init__ = patched_post_init
    cls._autotune_patched = True


def patch_parser(module: ModuleType, library: Library) -> None:
    """`transformers.hf_argparser`: remember which TrainingArguments came from the command line
    (or a JSON/YAML file, or a dict), and which exception was the parser's."""
    parser_cls = module.HfArgumentParser
    if getattr(parser_cls, "_autotune_patched", False):
        return
    for name in _PARSERS:
        setattr(parser_cls, name, _recording_parse(getattr(parser_cls, name), name))
    parser_cls._autotune_patched = True


def _recording_parse(parse: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(parse)
    def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
        trial = current()
        try:
            parsed = parse(self, *args, **kwargs)
        except Exception as exc:
            if trial is not None:
                trial.rejected_arguments = f"{type(exc).__name__}: {exc}"
            raise
        for item in parsed if isinstance(parsed, tuple) else (parsed,):
            if hasattr(item, "per_device_train_batch_size"):  # TrainingArguments, or a subclass
                item._autotune_parsed_by = name
        return parsed

    return recorded


def _trial_arguments(trial: ScriptTrial, args: Any, baseline: ScriptBaseline,
                     ) -> tuple[Any, dict[str, dict[str, Any]]]:
    """A new TrainingArguments (its __post_init__ run again) with the trial's knobs and no side
    effects, and the knobs' fields as set."""
    script = baseline.settings["TrainingArguments"]
    fields = {}
    if trial.config is not None:
        refused = unexpressed(trial.config, baseline, trial.device.type, args.world_size)
        if refused:
            raise Unsupported(refused[0].describe(), refused[0].knob, refused[0].value)
        fields = training_arguments(trial.config, script, baseline.fixed)
    quiet = {**_QUIET, "output_dir": str(trial.scratch_dir / "transformers"),
             "max_steps": max(args.max_steps, trial.max_steps)}
    if trial.seed is not None:  # a loss run's: the Trainer seeds its sampler and dropout with it
        quiet["seed"] = quiet["data_seed"] = trial.seed
    if trial.device.type == "cpu":
        quiet["use_cpu"] = True  # TrainingArguments' own way to train on the CPU (bf16 there)
    known = {f.name for f in dataclasses.fields(args)}
    quiet = {k: v for k, v in quiet.items() if k in known}  # older transformers lack some
    return dataclasses.replace(args, **fields, **quiet), {"TrainingArguments": {**script, **fields}}


def _tally_micro_steps(trainer: Any, tally: StepTally) -> None:
    """Count each micro-batch's samples and loss, and time the fetching of them, through the
    trainer's own methods (an optimizer step's micro-batches are fetched all at once)."""
    fetch, step = trainer.get_batch_samples, trainer.training_step

    def get_batch_samples(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        batches, items = fetch(*args, **kwargs)
        wait = time.perf_counter() - start
        for i, batch in enumerate(batches):
            tally.add_batch(batch, wait if i == 0 else 0.0)
        return batches, items

    def training_step(*args: Any, **kwargs: Any) -> Any:
        loss = step(*args, **kwargs)
        tally.add_loss(loss)
        return loss

    trainer.get_batch_samples, trainer.training_step = get_batch_samples, training_step


def _keep_train_loader(trainer: Any) -> None:
    """Keep the training DataLoader the Trainer builds (`_autotune_loader`): its dataset, the
    columns the model takes, and its collate function are what its batches are made of."""
    build = trainer.get_train_dataloader

    def get_train_dataloader(*args: Any, **kwargs: Any) -> Any:
        trainer._autotune_loader = build(*args, **kwargs)
        return trainer._autotune_loader

    trainer.get_train_dataloader = get_train_dataloader


@functools.cache
def _callback_class(base: type) -> type:
    """The observer's TrainerCallback (made from transformers' own class, imported by then)."""

    class ObserverCallback(base):  # type: ignore[misc, valid-type]
        def __init__(self, trial: ScriptTrial, trainer: Any, tally: StepTally,
                     startup_s: float) -> None:
            self.trial, self.trainer, self.tally, self.startup_s = \
                trial, trainer, tally, startup_s

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            optimizer = self.trainer.optimizer
            loader = getattr(self.trainer, "_autotune_loader", None)
            self.trial.observer.on_train_start(TrainInfo(
                LIBRARY, args.device, self.trainer.model,
                getattr(optimizer, "optimizer", optimizer), args.per_device_train_batch_size,
                args.gradient_accumulation_steps, self.startup_s, self.trial.settings,
                dataset_size(self.trainer.train_dataset),
                dataset=getattr(loader, "dataset", None),
                collate=getattr(loader, "collate_fn", None)))

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.trial.steps += 1
            if self.tally.report(self.trial.observer):
                self.trial.stopped_by_observer = True
                control.should_training_stop = True

    return ObserverCallback


HUGGING_FACE = Library(
    LIBRARY, "transformers Trainer", "Hugging Face Trainer script", "hf",
    {"transformers.trainer": patch_trainer, "transformers.hf_argparser": patch_parser,
     "transformers.training_args": patch_arguments},
    unexpressed, changes)
