"""What the user's model and this machine can do, found in one short child process before the
baseline, so that the search only ever proposes what works here and is worth trying.

The probe (`probe_job`, run in a child process like a trial) reads the workload's facts (the
file's BASELINE, the dataset's size, the model's training state) and tries, on the user's model
and this machine, each knob value that can fail or be pointless, of those the search would offer
on this device (the tuner's side sends them in the request's `ProbeSettings`, `candidates`):

- precision: bf16 (and fp16 on CUDA) for one short timed run against the baseline's precision;
  a value that fails is left out, and on CPU one more than `SLOWER` times slower than fp32 too
  (a CPU without native bf16 emulates it: it cannot pay back what it costs), against fp32
  timed both before and after it (a machine that got busy in between slows both);
- activation checkpointing: each mode for one step on the dataset's first samples, whose loss
  and gradients must equal the plain model's (a wrapper that changes the model is worse than
  none);
- float8 (offered only on GPUs of compute capability 8.9+): whether any linear layer is large
  enough to gain from it;
- the AdamW implementations and the memory-saving optimizers: one optimizer step each;
- channels_last, for a model with 2-D or 3-D convolutions (the only ones it is offered to):
  one step;
- each attention kernel, for a model that calls `scaled_dot_product_attention` (seen in one
  forward): one step under `sdpa_kernel`, which refuses shapes, masks or dtypes it cannot run;
- torch.compile: the toolchain inductor needs (a C++ compiler on CPU, Triton on CUDA);
- DataLoader workers: a worker process loading two batches (datasets and collate functions
  that cannot be pickled fail here), then every workers/prefetch setting's own rate;
- the samples' sizes (`sample_sizes`): which are the largest, for the worst batch the
  confirmation runs each answer it may give on.

The tuner caches the report in the study under a fingerprint of the model file, its arguments,
the device and torch, and probes again when one of them changes.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autotune.config import FP8_PRECISIONS, TrainConfig, from_baseline, loader_settings
from autotune.hardware import cpu_has_native_bf16, describe, unsupported_reason, usable_cpus
from autotune.trial.child import is_oom
from autotune.trial.float8 import MIN_FEATURES, large_linears
from autotune.trial.loader_rates import measure_loader_rates, waiting_worker_counts
from autotune.trial.optimizers import make_optimizer
from autotune.trial.protocol import LeftOut, ProbeReport, ProbeSettings
from autotune.trial.sample_sizes import sizes_or_none
from autotune.trial.training import (
    CHECK_SAMPLES,
    Unsupported,
    calls_attention,
    checkpointing_problem,
    has_convolutions,
    make_loader,
    move_to_device,
    nonfinite_problem,
    sample_batch,
    setup_from_workload,
    training_state_bytes,
)
from autotune.trial.workload import Workload, check_loss

# A precision this many times slower than fp32 on CPU is left out.
SLOWER = 2.0
# How long each precision is timed for (after one warm-up step), at most.
TIMING_S = 2.0
TIMED_STEPS = 3
# The short runs each take a copy of the first model built, kept on the host where its tensors
# take at most this much: building GPT-2 small took 7.3 s on this project's CPU, a copy 1.8 s,
# and the probe builds one for each of its dozen short runs (73 s of probe on an H200).
PRISTINE_MAX_BYTES = 2 * 2**30

Progress = Callable[[str], None]


def probe_job(workload: Workload, config: TrainConfig, device: torch.device,
              settings: ProbeSettings, trace_path: str | None,
              progress: Progress) -> ProbeReport:
    """A child process's job (`child.JOBS`): the ProbeReport of `workload` on `device`,
    `config` being its baseline."""
    progress("building the dataset")
    dataset = workload.build_dataset()
    trials = _Trials(workload, dataset, device, progress)
    progress("building the model")
    model = trials.model()
    report = ProbeReport(baseline=workload.baseline, dataset_size=len(dataset),
                         state_bytes=training_state_bytes(model),
                         parameters=sum(p.numel() for p in model.parameters()),
                         convolutional=has_convolutions(model))
    del model
    if unsupported_reason(config, describe(device)):  # a BASELINE this device cannot run
        config = from_baseline({"micro_batch_size": config.micro_batch_size,
                                "grad_accum_steps": config.grad_accum_steps}, device.type)
    report.attention = trials.calls_attention()
    offered = _offered(settings.candidates, config, report)
    progress("one baseline step (the reference)")
    try:
        reference = trials.run(config, timed=True)
    except Exception as exc:
        if not is_oom(exc):
            raise
        # The baseline's micro-batch does not fit (the search will find one that does): what
        # works does not depend on it.
        config = config.replace(micro_batch_size=1, grad_accum_steps=1)
        reference = trials.run(config, timed=True)
    report.step_s[config.precision] = reference.step_s
    for check in (_precisions, _float8, _checkpointing, _optimizers, _kernels_and_formats):
        report.left_out += check(trials, config, reference, offered)
    report.step_s.update(trials.step_s)
    report.left_out += _compile_toolchain(device, offered["compile_mode"])
    workers = [n for n in offered["num_workers"] if n > 0]
    report.left_out += _workers(workload, dataset, config, device, progress, workers)
    usable = {(w, p) for w, p in loader_settings(offered)
              if not any(x.knob == "num_workers" and x.value == w for x in report.left_out)}
    progress("timing the DataLoader alone")
    collate = workload.hook("collate_fn")
    consumption = config.micro_batch_size * config.grad_accum_steps / reference.step_s
    report.loader_rates = measure_loader_rates(dataset, collate, config.micro_batch_size,
                                               sorted(usable, key=str), settings.loader_seconds,
                                               consumption)
    # a loader that waits is timed with more workers than cores, where workers can load at all
    more = waiting_worker_counts(report.loader_rates, usable_cpus()) \
        if any(w > 0 for w, _ in usable) else []
    if more:
        progress(f"the DataLoader waits rather than computes: timing {', '.join(map(str, more))}"
                 " workers too")
        prefetch = sorted({p for w, p in usable if w > 0}, key=lambda v: v or 0)
        report.loader_rates += measure_loader_rates(
            dataset, collate, config.micro_batch_size, [(w, p) for w in more for p in prefetch],
            settings.loader_seconds, consumption)
    report.sizes = sizes_or_none(dataset, collate, progress)
    return report


def _offered(candidates: Mapping[str, Sequence[Any]], config: TrainConfig,
             report: ProbeReport) -> dict[str, tuple]:
    """The values worth a try here: those the search sent (`ProbeSettings.candidates`: what it
    offers on this device besides a baseline's own, every optimizer among them), memory formats
    only for a model with convolutions, attention kernels only for one that calls them, and the
    baseline's own DataLoader setting among the others (every space holds its baseline)."""
    offered = {knob: tuple(values) for knob, values in candidates.items()}
    if not report.convolutional:
        offered["memory_format"] = ()
    if not report.attention:
        offered["attention_backend"] = ()
    offered["num_workers"] = tuple(sorted({*offered["num_workers"], config.num_workers}))
    if config.num_workers:
        offered["prefetch_factor"] = tuple(sorted(
            {*offered["prefetch_factor"], config.prefetch_factor},
            key=lambda v: (v is not None, v or 0)))
    return offered


@dataclass
class _Run:
    first_step_s: float
    step_s: float

    def pace(self, timed: bool) -> float:
        """The step time to compare: the timed steps' median, or the first step's."""
        return self.step_s if timed else self.first_step_s


class _Trials:
    """Short runs of one configuration each, on a freshly built model."""

    def __init__(self, workload: Workload, dataset: Any, device: torch.device,
                 progress: Progress) -> None:
        self.workload, self.dataset, self.device, self.progress = \
            workload, dataset, device, progress
        self.step_s: dict[str, float] = {}
        self._pristine: torch.nn.Module | None = None
        self._copies = True

    def model(self) -> torch.nn.Module:
        """A freshly built model: a copy of the first one built, kept as it was built where
        all its tensors are on the host and take at most `PRISTINE_MAX_BYTES`, else (or where
        it does not copy) built again."""
        if self._pristine is not None:
            return copy.deepcopy(self._pristine)
        model = self.workload.build_model()
        tensors = list(itertools.chain(model.parameters(), model.buffers()))
        if self._copies and all(t.device.type == "cpu" for t in tensors) and \
                sum(t.numel() * t.element_size() for t in tensors) <= PRISTINE_MAX_BYTES:
            try:
                self._pristine = copy.deepcopy(model)
            except Exception:  # noqa: BLE001 - a model that does not copy is built each time
                self._copies = False
        return model

    def run(self, config: TrainConfig, timed: bool = False,
            first_step_bound_s: float = math.inf) -> _Run:
        """The first step's time; with `timed`, the median of a few more steps (the first
        step's instead when it took longer than `first_step_bound_s`: a step that slow has
        answered already)."""
        setup = setup_from_workload(self.workload, config, self.device, model=self.model(),
                                    dataset=self.dataset)
        batches = setup.batches()
        begun = time.perf_counter()
        setup.step(batches)
        self._sync()
        first_s = time.perf_counter() - begun
        times: list[float] = []
        start = time.perf_counter()
        timed = timed and first_s <= first_step_bound_s
        while timed and len(times) < TIMED_STEPS and time.perf_counter() - start < TIMING_S:
            begun = time.perf_counter()
            setup.step(batches)
            self._sync()
            times.append(time.perf_counter() - begun)
        return _Run(first_s, statistics.median(times) if times else first_s)

    def nonfinite(self, precision: str) -> str | None:
        """Whether one step under `precision` on the dataset's first samples goes non-finite
        (`training.nonfinite_problem`), in words, or None."""
        self.progress(f"checking the loss under {precision}")
        workload = self.workload
        try:
            return nonfinite_problem(self.model, self.first_batch(),
                                     workload.loss_fn(), precision, self.device)
        except Exception:  # noqa: BLE001 - a failure is the timed run's to report
            return None

    def first_batch(self) -> Any:
        """The dataset's first samples, collated and on the device, as a trial's would be."""
        move = self.workload.hook("to_device") or move_to_device
        return move(sample_batch(self.dataset, self.workload.hook("collate_fn"), CHECK_SAMPLES),
                    self.device)

    def calls_attention(self) -> bool:
        """Whether one forward of a fresh model calls `scaled_dot_product_attention` (before
        anything fails: a model that breaks the contract is told so by the baseline's step,
        next, with its own micro-batch)."""
        model = self.model().to(self.device)
        batch, loss_fn = self.first_batch(), self.workload.loss_fn()

        def forward() -> None:
            with contextlib.suppress(Exception):
                loss_fn(model, batch)

        with torch.no_grad():
            return calls_attention(forward)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _try(trials: _Trials, knob: str, value: Any, config: TrainConfig, timed: bool = False,
         first_step_bound_s: float = math.inf) -> _Run | LeftOut | None:
    """One short run of `config`: its figures, the value left out with the reason it fails,
    or None when it ran out of memory (a memory question, which the search answers)."""
    trials.progress(f"trying {knob}={value}")
    try:
        return trials.run(config, timed=timed, first_step_bound_s=first_step_bound_s)
    except Unsupported as exc:
        return LeftOut(knob, value, str(exc))
    except Exception as exc:  # noqa: BLE001 - any other failure leaves the value out
        if is_oom(exc):
            return None
        return LeftOut(knob, value, f"fails on this model: {_one_line(exc)}")


def _precisions(trials: _Trials, config: TrainConfig, reference: _Run,
                offered: Mapping[str, tuple]) -> list[LeftOut]:
    """Half precisions that fail here, whose loss or gradients are not finite on the dataset's
    first samples, or that are much slower than fp32 on a CPU."""
    out = []
    for precision in offered["precision"]:
        if precision not in ("bf16", "fp16") or precision == config.precision:
            continue
        problem = trials.nonfinite(precision)
        if problem:
            out.append(LeftOut("precision", precision, f"{problem}: training would diverge"))
            continue
        run = _try(trials, "precision", precision, config.replace(precision=precision),
                   timed=True, first_step_bound_s=2 * SLOWER * reference.first_step_s)
        if not isinstance(run, _Run):
            out += [run] if run else []
            continue
        trials.step_s[precision] = run.step_s
        timed = run.step_s != run.first_step_s
        ratio = run.step_s / reference.pace(timed)
        if trials.device.type != "cpu" or config.precision != "fp32" or ratio <= SLOWER:
            continue
        # fp32 timed again right after: a machine that got busy since the reference slowed
        # this run too, and a value left out is never tried again in the study.
        again = trials.run(config, timed=timed)
        ratio = run.step_s / max(reference.pace(timed), again.pace(timed))
        if ratio > SLOWER:
            native = "" if cpu_has_native_bf16() else " (no native bf16)"
            out.append(LeftOut("precision", precision,
                               f"{ratio:.1f}x slower than fp32 on this CPU{native}"))
    return out


def _float8(trials: _Trials, config: TrainConfig, reference: _Run,
            offered: Mapping[str, tuple]) -> list[LeftOut]:
    """float8 precisions (offered only on GPUs that run them) where the model has no linear
    layer large enough to gain from float8: the run would be bf16's with extra casts."""
    wanted = [p for p in offered["precision"] if p in FP8_PRECISIONS and p != config.precision]
    if not wanted:
        return []
    chosen = large_linears()
    if any(chosen(m, name) for name, m in trials.model().named_modules()):
        return []
    return [LeftOut("precision", p, f"no linear layer has both sides >= {MIN_FEATURES} "
                    "features and divisible by 16: float8 would run bf16's matmuls with extra "
                    "casts") for p in wanted]


def _checkpointing(trials: _Trials, config: TrainConfig, reference: _Run,
                   offered: Mapping[str, tuple]) -> list[LeftOut]:
    """Checkpointing modes that fail on this model or change what it learns: one step with
    and without on the dataset's first samples (`training.checkpointing_problem`)."""
    workload, device = trials.workload, trials.device
    batch = trials.first_batch()
    loss_fn = workload.loss_fn()

    def checked_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        return check_loss(loss_fn(model, batch), workload.path)

    out = []
    for mode in offered["activation_checkpointing"]:
        if mode == "none":
            continue
        trials.progress(f"trying activation_checkpointing={mode}")
        try:
            problem = checkpointing_problem(
                trials.model, batch, checked_loss, mode,
                workload.hook("checkpoint_modules"), device, precision=config.precision)
        except Exception as exc:  # noqa: BLE001 - out of memory, or the model's own failure
            if is_oom(exc):
                continue
            raise
        if problem:
            out.append(LeftOut("activation_checkpointing", mode, problem))
    return out


def _optimizers(trials: _Trials, config: TrainConfig, reference: _Run,
                offered: Mapping[str, tuple]) -> list[LeftOut]:
    """AdamW implementations the file's optimizer does not take, or that fail their update on
    this model's parameters: each one's step over the gradients of one forward and backward
    (`_updates_fail`); and other optimizers that fail a training step (each alone)."""
    return (_updates_fail(trials, config, _others(config, offered, "optimizer_impl")) +
            _fail_alone(trials, config, {"optimizer": _others(config, offered, "optimizer")}))


def _updates_fail(trials: _Trials, config: TrainConfig, impls: Sequence[str]) -> list[LeftOut]:
    """The AdamW implementations whose optimizer cannot be built or cannot step, with why: one
    forward and backward on the dataset's first samples answers for all of them, each then
    building its optimizer over the same parameters and taking one step. Where the forward
    or backward itself fails, each is tried in a training step of its own."""
    if not impls:
        return []
    trials.progress(f"trying optimizer_impl={', '.join(impls)} on one backward")
    workload = trials.workload
    try:
        model = trials.model().to(trials.device)
        workload.loss_fn()(model, trials.first_batch()).backward()
    except Exception:  # noqa: BLE001 - a training step of each says what fails
        return _fail_alone(trials, config, {"optimizer_impl": impls})
    out = []
    for impl in impls:
        try:
            make_optimizer(model, config.setting("optimizer_impl", impl),
                           workload.hook("build_optimizer")).step()
        except Exception as exc:  # noqa: BLE001 - any failure leaves the value out
            if not is_oom(exc):
                out.append(LeftOut("optimizer_impl", impl,
                                   f"fails on this model: {_one_line(exc)}"))
    return out


def _kernels_and_formats(trials: _Trials, config: TrainConfig, reference: _Run,
                         offered: Mapping[str, tuple]) -> list[LeftOut]:
    """Memory formats (offered only to a model with convolutions) and attention kernels (only
    to one that calls scaled_dot_product_attention) that fail a step on this model: one step
    answers for a value of each at once (`_fail_together`). On CUDA they are tried in the half
    precision the search offers where the baseline is fp32 or tf32: flash and cuDNN attention
    have no kernel for 32-bit floats, and a search that pairs them with bf16 is what matters."""
    half = next((p for p in ("bf16", "fp16") if p in offered["precision"]), None)
    if trials.device.type == "cuda" and half and config.precision in ("fp32", "tf32"):
        config = config.setting("precision", half)
    return _fail_together(trials, config, {
        knob: _others(config, offered, knob) for knob in ("memory_format", "attention_backend")})


def _others(config: TrainConfig, offered: Mapping[str, tuple], knob: str) -> list[Any]:
    return [value for value in offered[knob] if value != getattr(config, knob)]


def _fail_together(trials: _Trials, config: TrainConfig,
                   values: Mapping[str, Sequence[Any]]) -> list[LeftOut]:
    """The values that fail a step, with the reason, where one step tries a value of each
    knob at once (the first of each together, then the second...): a step that runs answers
    for all its values; only one that fails is taken apart, a value a step, to say which
    fails and why (one that runs out of memory asks a memory question, the search's)."""
    out = []
    for i in range(max(map(len, values.values()), default=0)):
        together = {knob: vs[i] for knob, vs in values.items() if i < len(vs)}
        if len(together) > 1:
            combined = config
            for knob, value in together.items():
                combined = combined.setting(knob, value)
            trials.progress("trying " + ", ".join(f"{k}={v}" for k, v in together.items()))
            if _runs(trials, combined):
                continue
        out += _fail_alone(trials, config, {knob: [value] for knob, value in together.items()})
    return out


def _runs(trials: _Trials, config: TrainConfig) -> bool:
    """Whether one step of `config` runs (any failure: its values are then tried alone)."""
    try:
        trials.run(config)
    except Exception:  # noqa: BLE001 - the values alone say which fails and why
        return False
    return True


def _fail_alone(trials: _Trials, config: TrainConfig,
                values: Mapping[str, Sequence[Any]]) -> list[LeftOut]:
    """The values whose one step, a value a step, fails, with the reason."""
    out = []
    for knob, options in values.items():
        for value in options:
            run = _try(trials, knob, value, config.setting(knob, value))
            out += [run] if isinstance(run, LeftOut) else []
    return out


def _compile_toolchain(device: torch.device, modes: tuple) -> list[LeftOut]:
    """torch.compile needs a C++ compiler for inductor's CPU kernels, Triton for CUDA ones."""
    reason = None
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            reason = "Triton is not installed, which inductor needs for CUDA kernels"
    else:
        from torch._inductor.cpp_builder import get_cpp_compiler

        try:
            get_cpp_compiler()
        except Exception as exc:  # noqa: BLE001 - no compiler, whatever the message
            reason = f"no C++ compiler for inductor's CPU kernels ({exc})"
    if reason is None:
        return []
    return [LeftOut("compile_mode", mode, reason) for mode in modes if mode != "none"]


def _workers(workload: Workload, dataset: Any, config: TrainConfig, device: torch.device,
             progress: Progress, workers: list[int]) -> list[LeftOut]:
    """Worker processes must be able to take the dataset and the collate function."""
    if not workers:
        return []
    progress("trying a DataLoader worker")
    try:
        loader = make_loader(dataset, TrainConfig(micro_batch_size=config.micro_batch_size,
                                                  num_workers=1), device,
                             workload.hook("collate_fn"))
        batches = iter(loader)
        for _ in range(min(2, len(loader))):
            next(batches)
        del batches
    except Exception as exc:  # noqa: BLE001 - any failure leaves workers out
        reason = f"a worker process cannot load batches: {_one_line(exc)}"
        return [LeftOut("num_workers", n, reason) for n in workers]
    return []


def _one_line(exc: BaseException) -> str:
    """An exception in one line: its last, for one re-raised with a traceback in its message
    (a DataLoader worker's)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    text = last if len(lines) > 1 and ":" in last else f"{type(exc).__name__}: {last}"
    return text[:300]
