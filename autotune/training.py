"""Apply a `TrainConfig` to a model, optimizer and DataLoader, and run the train step.

The trials use exactly this code, and so can a user's own loop, so that what was measured is
what they run:

    setup = setup_training(model, dataset, TrainConfig.load("best.yaml"), "cuda")
    batches = setup.batches()
    for _ in range(num_steps):
        setup.step(batches)
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset

from autotune.config import CUDA_GRAPH_MODES, ConfigError, TrainConfig
from autotune.hardware import describe, unsupported_reason
from autotune.workload import ContractError, Workload, call_model, check_loss, loss_from_output

# The profiler range around fetching a micro-batch: what happens there (a new epoch's sampler
# seed read with .item(), say) is data loading, not the model's work.
NEXT_BATCH = "autotune.next_batch"

LossFn = Callable[[nn.Module, Any], torch.Tensor]
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Unsupported(Exception):
    """This configuration cannot apply to this model or device (not a failure of the run)."""


class BatchTransferError(ContractError):
    """A batch holds something that cannot be moved to the device."""


@dataclass
class StepResult:
    """One optimizer step: its (detached, unsynchronised) loss and what it consumed."""

    loss: torch.Tensor
    samples: int
    data_wait_s: float


@dataclass
class TrainingSetup:
    """Model, optimizer and loader with every knob of `config` applied."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loader: DataLoader
    config: TrainConfig
    device: torch.device
    loss_fn: LossFn
    scaler: torch.amp.GradScaler | None = None
    loss_source: str = "loss_fn"
    # The compiled model replays CUDA graphs (reduce-overhead, max-autotune on CUDA).
    cuda_graphs: bool = False

    def batches(self) -> Iterator[Any]:
        """Micro-batches forever, epoch after epoch, as the user's loop would see them."""
        while True:
            yield from self.loader

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        dtype = AUTOCAST_DTYPES.get(self.config.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def step(self, batches: Iterator[Any]) -> StepResult:
        """One optimizer step over `grad_accum_steps` micro-batches; never syncs the device."""
        accum = self.config.grad_accum_steps
        non_blocking = self.config.pin_memory and self.device.type == "cuda"
        keep_grads = self.cuda_graphs and accum > 1
        if keep_grads:
            self._allocate_grads()
        total = torch.zeros((), device=self.device)
        data_wait = 0.0
        for _ in range(accum):
            start = time.perf_counter()
            with torch.profiler.record_function(NEXT_BATCH):
                batch = next(batches)
            data_wait += time.perf_counter() - start
            batch = move_to_device(batch, self.device, non_blocking)
            if self.cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()
            with self.autocast():
                loss = check_loss(self.loss_fn(self.model, batch), self.loss_source) / accum
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
            else:
                loss.backward()
            total += loss.detach().float()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=not keep_grads)
        return StepResult(total, self.config.micro_batch_size * accum, data_wait)

    def _allocate_grads(self) -> None:
        """Gradients that live outside CUDA-graph memory, for accumulation under CUDA graphs.

        A compiled backward replayed as a CUDA graph writes its gradients into the graph's
        memory pool; with no `.grad` yet, autograd keeps that very tensor as `.grad`, and the
        next micro-batch's replay overwrites it (torch raises "accessing gradient tensor output
        of CUDAGraphs that has been overwritten"). With `.grad` allocated here, autograd adds
        each replay's gradients into it in place and keeps nothing of the pool; the optimizer
        then zeroes it instead of freeing it.
        """
        for p in self.model.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)


def setup_training(
    model: nn.Module,
    dataset: Dataset,
    config: TrainConfig,
    device: str | torch.device = "cuda",
    *,
    loss_fn: LossFn | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    build_optimizer: Callable[..., torch.optim.Optimizer] | None = None,
    checkpoint_modules: Callable[[nn.Module], list[nn.Module]] | None = None,
    seed: int = 0,
) -> TrainingSetup:
    """Apply every knob of `config`; the public entry point for a user's own training loop.

    Without `loss_fn`, the model is called with the batch and its `.loss`, `["loss"]` or
    scalar output is used. Sets the process-wide TF32 flags (`set_matmul_precision`).
    """
    device = torch.device(device)
    reason = unsupported_reason(config, describe(device))
    if reason:
        raise Unsupported(reason)
    set_matmul_precision(config.precision, device)
    model = model.to(device).train()
    apply_activation_checkpointing(model, config.activation_checkpointing, checkpoint_modules)
    optimizer = make_optimizer(model, config.optimizer_impl, build_optimizer)
    loader = make_loader(dataset, config, device, collate_fn, seed)
    scaler = torch.amp.GradScaler(device.type) if config.precision == "fp16" else None
    if config.compile_mode != "none":
        model = torch.compile(model, mode=None if config.compile_mode == "default"
                              else config.compile_mode)
    if loss_fn is None:
        def loss_fn(m: nn.Module, batch: Any) -> torch.Tensor:
            return loss_from_output(call_model(m, batch), "the model")
    return TrainingSetup(model=model, optimizer=optimizer, loader=loader, config=config,
                         device=device, loss_fn=loss_fn, scaler=scaler,
                         cuda_graphs=device.type == "cuda" and
                         config.compile_mode in CUDA_GRAPH_MODES)


def setup_from_workload(workload: Workload, config: TrainConfig, device: torch.device,
                        model: nn.Module | None = None, seed: int = 0) -> TrainingSetup:
    """`setup_training` with the hooks of a model file."""
    setup = setup_training(
        model if model is not None else workload.build_model(), workload.build_dataset(),
        config, device, loss_fn=workload.loss_fn(), collate_fn=workload.hook("collate_fn"),
        build_optimizer=workload.hook("build_optimizer"),
        checkpoint_modules=workload.hook("checkpoint_modules"), seed=seed)
    setup.loss_source = str(workload.path)
    return setup


def set_matmul_precision(precision: str, device: torch.device) -> None:
    """TF32 tensor cores in fp32 matmuls only for `tf32`; for every other precision PyTorch's
    defaults (IEEE fp32 matmuls, TF32 cuDNN convolutions), which is what the user's own code
    runs, so the baseline is measured as it really runs.

    Set through `allow_tf32`, the one API every torch from 2.4 has; torch 2.9 and later keep
    their newer `fp32_precision` settings in step with it, so both APIs (and inductor, which
    reads both) see one consistent state.
    """
    if device.type != "cuda":
        return
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = True


def make_optimizer(model: nn.Module, impl: str,
                   build_optimizer: Callable[..., torch.optim.Optimizer] | None = None,
                   ) -> torch.optim.Optimizer:
    """The file's optimizer (or AdamW) with the implementation chosen by `foreach=`/`fused=`."""
    flags = {"foreach": impl == "foreach", "fused": impl == "fused"}
    params = [p for p in model.parameters() if p.requires_grad]
    if build_optimizer is not None:
        return build_optimizer(params, **flags)
    return torch.optim.AdamW(params, lr=3e-4, weight_decay=0.01, **flags)


def make_loader(dataset: Dataset, config: TrainConfig, device: torch.device,
                collate_fn: Callable[[list[Any]], Any] | None = None,
                seed: int = 0) -> DataLoader:
    """A shuffling DataLoader with full batches only, so every step sees the same shapes."""
    if len(dataset) < config.micro_batch_size:
        raise ConfigError(f"micro_batch_size={config.micro_batch_size} is larger than the "
                          f"dataset ({len(dataset)} samples)")
    workers = config.num_workers
    return DataLoader(
        dataset, batch_size=config.micro_batch_size, shuffle=True, drop_last=True,
        num_workers=workers, collate_fn=collate_fn,
        pin_memory=config.pin_memory and device.type == "cuda",
        prefetch_factor=config.prefetch_factor if workers > 0 else None,
        persistent_workers=config.persistent_workers and workers > 0,
        generator=torch.Generator().manual_seed(seed))


def apply_activation_checkpointing(
        model: nn.Module, mode: str,
        checkpoint_modules: Callable[[nn.Module], list[nn.Module]] | None = None) -> None:
    """Recompute the activations of repeated blocks in backward instead of storing them.

    `full` wraps every block, `selective` every other one. A model that brings its own
    `gradient_checkpointing_enable()` (Hugging Face) uses that for `full`.
    """
    if mode == "none":
        return
    if mode == "full" and callable(getattr(model, "gradient_checkpointing_enable", None)):
        try:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        except TypeError:
            model.gradient_checkpointing_enable()
        return
    blocks = list(checkpoint_modules(model)) if checkpoint_modules else repeated_blocks(model)
    if not blocks:
        found = ("checkpoint_modules(model) returned no modules" if checkpoint_modules else
                 "the model has no nn.ModuleList of repeated blocks")
        raise Unsupported(f"activation checkpointing is not applicable: {found}; make "
                          "checkpoint_modules(model) in the model file name the blocks")
    for block in blocks if mode == "full" else blocks[::2]:
        _checkpoint_forward(block)


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of the model's largest `nn.ModuleList` (by parameter count)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 1]
    if not lists:
        return []
    largest = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))
    return list(largest)


def _checkpoint_forward(module: nn.Module) -> None:
    inner = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    module.forward = forward


def move_to_device(batch: Any, device: torch.device, non_blocking: bool = False,
                   where: str = "batch") -> Any:
    """Move every tensor in a batch (dicts, tuples, lists, namedtuples, dataclasses)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (str, bytes, int, float, bool, type(None))):
        return batch
    if isinstance(batch, Mapping):
        moved = {k: move_to_device(v, device, non_blocking, f"{where}[{k!r}]")
                 for k, v in batch.items()}
        try:
            return type(batch)(moved)
        except TypeError:  # a constructor that takes something else first (defaultdict)
            if isinstance(batch, MutableMapping):
                clone = copy.copy(batch)
                clone.update(moved)
                return clone
            return moved
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move_to_device(v, device, non_blocking, f"{where}.{name}")
                             for name, v in zip(batch._fields, batch)))
    if isinstance(batch, (tuple, list)):
        return type(batch)(move_to_device(v, device, non_blocking, f"{where}[{i}]")
                           for i, v in enumerate(batch))
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{
            f.name: move_to_device(getattr(batch, f.name), device, non_blocking,
                                   f"{where}.{f.name}")
            for f in dataclasses.fields(batch) if f.init})
    raise BatchTransferError(
        f"{where} is a {type(batch).__name__}, which cannot be moved to {device}; make the "
        "dataset or collate_fn return tensors (in dicts, tuples, lists or dataclasses)")
