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
import functools
import inspect
import math
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset, default_collate

from autotune.config import CUDA_GRAPH_MODES, FP8_PRECISIONS, TrainConfig
from autotune.errors import AutotuneError, ConfigError, ContractError
from autotune.hardware import describe, unsupported_reason
from autotune.trial import distributed
from autotune.trial.distributed import World
from autotune.trial.float8 import MIN_FEATURES, convert_to_float8
from autotune.trial.optimizers import make_optimizer
from autotune.trial.workload import Workload, call_model, check_loss, loss_from_output

# The profiler range around fetching a micro-batch: what happens there (a new epoch's sampler
# seed read with .item(), say) is data loading, not the model's work.
NEXT_BATCH = "autotune.next_batch"

LossFn = Callable[[nn.Module, Any], torch.Tensor]
ToDevice = Callable[[Any, torch.device], Any]
# float8 precisions compute their large linears in float8 and everything else in bf16.
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16,
                   **{p: torch.bfloat16 for p in FP8_PRECISIONS}}
# Checkpointing must leave the loss and every gradient as they were, up to float rounding (GPU
# kernels with atomics are not bitwise deterministic); a broken recompute is off by far more.
CHECKPOINT_LOSS_RTOL = 1e-3
CHECKPOINT_GRAD_RTOL = 1e-2
# Samples of the batch checkpointing is verified on: enough for batch statistics, small enough
# that the run without checkpointing costs no memory that matters.
CHECK_SAMPLES = 2


class Unsupported(AutotuneError):
    """This configuration cannot apply to this model or device (not a failure of the run);
    `knob` and `value` name the setting that cannot, where one does, and `together` the other
    settings without which it could (a value pair: a fused AdamW that cannot run with mixed
    precision, say)."""

    def __init__(self, reason: str, knob: str | None = None, value: Any = None,
                 together: Mapping[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.knob, self.value = knob, value
        self.together = dict(together or {})


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
    to_device: ToDevice
    scaler: torch.amp.GradScaler | None = None
    loss_source: str = "loss_fn"
    # The compiled model replays CUDA graphs (reduce-overhead, max-autotune on CUDA).
    cuda_graphs: bool = False
    world: World | None = None  # this rank's place in its process group, if it has one

    def batches(self) -> Iterator[Any]:
        """Micro-batches forever, epoch after epoch, as the user's loop would see them."""
        return distributed.epochs(self.loader)

    def decide(self, flag: bool) -> bool:
        """`flag` as every rank takes it: rank 0's in a process group."""
        return flag if self.world is None else self.world.decide(flag)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return autocast_context(self.config.precision, self.device)

    def attention(self) -> contextlib.AbstractContextManager[Any]:
        return attention_context(self.config.attention_backend)

    def step(self, batches: Iterator[Any]) -> StepResult:
        """One optimizer step over `grad_accum_steps` micro-batches; never syncs the device."""
        accum = self.config.grad_accum_steps
        keep_grads = self.cuda_graphs and accum > 1
        if keep_grads:
            self._allocate_grads()
        total = torch.zeros((), device=self.device)
        data_wait = 0.0
        for micro in range(accum):
            start = time.perf_counter()
            with torch.profiler.record_function(NEXT_BATCH):
                batch = next(batches)
            data_wait += time.perf_counter() - start
            batch = self.to_device(batch, self.device)
            if self.cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()
            with distributed.gradient_sync(self.model, self.config, micro == accum - 1), \
                    self.attention():
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
    to_device: ToDevice | None = None,
    seed: int = 0,
    loss_source: str = "loss_fn",
    world: World | None = None,
) -> TrainingSetup:
    """Apply every knob of `config`; the public entry point for a user's own training loop.

    Without `loss_fn`, the model is called with the batch and its `.loss`, `["loss"]` or
    scalar output is used. Without `to_device(batch, device)`, batches move with
    `move_to_device`. Activation checkpointing is verified on the dataset's first samples
    before it is kept (`apply_verified_checkpointing`). Sets the process-wide TF32 flags
    (`set_matmul_precision`). Under a process group (`world`, as torchrun started it) the model
    is wrapped as `config.parallelism` says, after checkpointing and before compile, and each
    rank loads its own shard of the data. A model with convolutions on CUDA runs with
    `cudnn.benchmark` (PyTorch's tuning guide: each shape's fastest kernel, timed once).
    """
    device = torch.device(device)
    reason = unsupported_reason(config, describe(device))
    if reason:
        raise Unsupported(reason)
    ranks = world.size if world is not None else 1
    if (config.parallelism == "none") != (ranks == 1):
        raise ConfigError(f"parallelism={config.parallelism} cannot train {ranks} rank(s): one "
                          "process takes none, several ddp or fsdp")
    set_matmul_precision(config.precision, device)
    if loss_fn is None:
        def loss_fn(m: nn.Module, batch: Any) -> torch.Tensor:
            return loss_from_output(call_model(m, batch), "the model")
    if to_device is None:
        pinned = config.pin_memory and device.type == "cuda"
        to_device = functools.partial(move_to_device, non_blocking=pinned)
    model = model.to(device).train()
    if device.type == "cuda" and has_convolutions(model):
        torch.backends.cudnn.benchmark = True
    if config.memory_format == "channels_last":
        to_device = _channels_last_batches(to_device)
        to_channels_last(model)
    if config.activation_checkpointing != "none":
        sample = sample_batch(dataset, collate_fn, min(CHECK_SAMPLES, config.micro_batch_size))
        apply_verified_checkpointing(
            model, config.activation_checkpointing, to_device(sample, device),
            lambda m, batch: check_loss(loss_fn(m, batch), loss_source), checkpoint_modules,
            precision=config.precision)
    if config.precision in FP8_PRECISIONS and not convert_to_float8(model, config.precision):
        raise Unsupported(f"no linear layer to run in float8 here: none has both sides >= "
                          f"{MIN_FEATURES} features and divisible by 16 (smaller ones are "
                          "faster in bf16)",
                          knob="precision", value=config.precision)
    if world is not None:
        blocks = list(checkpoint_modules(model)) if checkpoint_modules else \
            repeated_blocks(model)
        model = distributed.wrap_model(model, config, blocks, device)
    optimizer = make_optimizer(model, config, build_optimizer)
    loader = make_loader(dataset, config, device, collate_fn, seed, world)
    scaler = torch.amp.GradScaler(device.type) if config.precision == "fp16" else None
    if config.compile_mode != "none":
        model = torch.compile(model, mode=None if config.compile_mode == "default"
                              else config.compile_mode)
    return TrainingSetup(model=model, optimizer=optimizer, loader=loader, config=config,
                         device=device, loss_fn=loss_fn, to_device=to_device, scaler=scaler,
                         loss_source=loss_source,
                         cuda_graphs=device.type == "cuda" and
                         config.compile_mode in CUDA_GRAPH_MODES, world=world)


def setup_from_workload(workload: Workload, config: TrainConfig, device: torch.device,
                        model: nn.Module | None = None, seed: int = 0,
                        dataset: Dataset | None = None) -> TrainingSetup:
    """`setup_training` with the hooks of a model file (its model and dataset built unless
    given)."""
    return setup_training(
        model if model is not None else workload.build_model(),
        dataset if dataset is not None else workload.build_dataset(), config, device,
        loss_fn=workload.loss_fn(), collate_fn=workload.hook("collate_fn"),
        build_optimizer=workload.hook("build_optimizer"),
        checkpoint_modules=workload.hook("checkpoint_modules"),
        to_device=workload.hook("to_device"), seed=seed, loss_source=str(workload.path),
        world=distributed.current())


def attention_context(backend: str) -> contextlib.AbstractContextManager[Any]:
    """`scaled_dot_product_attention` held to one kernel, or PyTorch's own choice (auto)."""
    if backend == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[backend])


def calls_attention(fn: Callable[[], Any]) -> bool:
    """Whether `fn` calls `scaled_dot_product_attention`: what an attention kernel changes."""
    from torch.overrides import TorchFunctionMode

    seen = []

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            if getattr(func, "__name__", "") == "scaled_dot_product_attention":
                seen.append(func)
            return func(*args, **(kwargs or {}))

    with Watch():
        fn()
    return bool(seen)


def has_convolutions(model: nn.Module) -> bool:
    """Whether the model has 2-D or 3-D convolutions: what a memory format changes."""
    return any(isinstance(m, (nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d, nn.ConvTranspose3d))
               for m in model.modules())


def channels_last(value: Any) -> Any:
    """A 4-D (5-D) floating-point tensor as channels_last (channels_last_3d); else unchanged."""
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() in (4, 5):
        return value.contiguous(memory_format=torch.channels_last if value.dim() == 4
                                else torch.channels_last_3d)
    return value


def to_channels_last(model: nn.Module) -> None:
    """Every 4-D and 5-D parameter and buffer of `model` stored channels-last, in place, as
    PyTorch's guide does with `model.to(memory_format=torch.channels_last)` (which leaves 3-D
    convolutions' 5-D weights as they are)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = channels_last(tensor.data)


def _channels_last_batches(to_device: ToDevice) -> ToDevice:
    """`to_device`, then the batch's images (4-D and 5-D float tensors) channels-last."""
    def moved(batch: Any, device: torch.device) -> Any:
        return move_to_device(to_device(batch, device), device, convert=channels_last)

    return moved


def autocast_context(precision: str, device: torch.device,
                     ) -> contextlib.AbstractContextManager[Any]:
    """bf16/fp16 autocast on `device`, or nothing for fp32 and tf32."""
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def sample_batch(dataset: Dataset, collate_fn: Callable[[list[Any]], Any] | None,
                 size: int) -> Any:
    """The dataset's first `size` samples collated as the loader collates them."""
    samples = [dataset[i] for i in range(min(size, len(dataset)))]
    return (collate_fn or default_collate)(samples)


def set_matmul_precision(precision: str, device: torch.device) -> None:
    """TF32 tensor cores in fp32 matmuls only for `tf32`; for every other precision PyTorch's
    defaults (IEEE fp32 matmuls, TF32 cuDNN convolutions), which is what the user's own code
    runs, so the baseline is measured as it really runs.

    Set through `allow_tf32`, the one API every torch from 2.6 has; torch 2.9 and later keep
    their newer `fp32_precision` settings in step with it, so both APIs (and inductor, which
    reads both) see one consistent state.
    """
    if device.type != "cuda":
        return
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = True


def make_loader(dataset: Dataset, config: TrainConfig, device: torch.device,
                collate_fn: Callable[[list[Any]], Any] | None = None,
                seed: int = 0, world: World | None = None) -> DataLoader:
    """A shuffling DataLoader with full batches only, so every step sees the same shapes; under
    a process group, over this rank's shard."""
    ranks = world.size if world is not None else 1
    if len(dataset) // ranks < config.micro_batch_size:
        shard = f", {len(dataset) // ranks} per rank" if ranks > 1 else ""
        raise ConfigError(f"micro_batch_size={config.micro_batch_size} is larger than the "
                          f"dataset ({len(dataset)} samples{shard})")
    workers = config.num_workers
    sampler = distributed.sampler(dataset, world, seed) if world is not None else None
    return DataLoader(
        dataset, batch_size=config.micro_batch_size, shuffle=sampler is None, drop_last=True,
        sampler=sampler,
        num_workers=workers, collate_fn=collate_fn,
        pin_memory=config.pin_memory and device.type == "cuda",
        prefetch_factor=config.prefetch_factor if workers > 0 else None,
        persistent_workers=config.persistent_workers and workers > 0,
        generator=torch.Generator().manual_seed(seed) if sampler is None else None)


def apply_activation_checkpointing(
        model: nn.Module, mode: str,
        checkpoint_modules: Callable[[nn.Module], list[nn.Module]] | None = None) -> str:
    """Recompute the activations of repeated blocks in backward instead of storing them.

    `full` checkpoints every block, `selective` every other one. A model with its own mechanism
    uses it: Hugging Face's `activation_checkpointing_enable(every_n_layers=...)` for both
    modes, an older `gradient_checkpointing_enable()` or timm's `set_grad_checkpointing()` for
    `full`. Otherwise the blocks that
    `checkpoint_modules(model)` names, else those of the largest stack (`repeated_blocks`),
    have their forward wrapped in `torch.utils.checkpoint` (a block that is itself a
    `ModuleList`, never called, has its called parts wrapped). Returns how it was applied.
    """
    if mode == "none":
        return "no activation checkpointing"
    own = _own_checkpointing(model, mode)
    if own:
        return own
    # A block that is a container is never called itself: its called parts are checkpointed.
    blocks = distributed.callable_blocks(
        list(checkpoint_modules(model)) if checkpoint_modules else repeated_blocks(model))
    if not blocks:
        found = ("checkpoint_modules(model) returned no modules" if checkpoint_modules else
                 "the model has no nn.ModuleList or nn.Sequential of repeated blocks")
        raise Unsupported(f"activation checkpointing is not applicable: {found}; make "
                          "checkpoint_modules(model) in the model file name the blocks",
                          knob="activation_checkpointing", value=mode)
    chosen = blocks if mode == "full" else blocks[::2]
    _no_key_value_cache(model)
    for block in chosen:
        _checkpoint_forward(block)
    names = {id(m): name for name, m in model.named_modules()}
    listed = ", ".join(names.get(id(b), type(b).__name__) for b in chosen[:4])
    more = ", ..." if len(chosen) > 4 else ""
    return (f"torch.utils.checkpoint around {len(chosen)} of {len(blocks)} blocks "
            f"({listed}{more})")


def _no_key_value_cache(model: nn.Module) -> None:
    """A Hugging Face model that keeps a key/value cache in training (GPT-2 under transformers
    5.17) appends to it in a block's forward and again in its recompute, which then sees keys
    twice as long; its own checkpointing turns the cache off, as this does for training, where
    nothing reads it."""
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", False) is True:
        config.use_cache = False


def _own_checkpointing(model: nn.Module, mode: str) -> str | None:
    """Turn on the model's own checkpointing where it has one for `mode`; how, or None. A
    Hugging Face model that says it has none (`supports_gradient_checkpointing = False`, as
    its ConvNeXt) still has the methods, which raise: its blocks are autotune's to wrap."""
    if getattr(model, "supports_gradient_checkpointing", True) is False:
        return None
    enable = getattr(model, "activation_checkpointing_enable", None)
    if callable(enable) and _takes_keyword(enable, "every_n_layers"):
        every = 1 if mode == "full" else 2
        enable(activation_checkpointing_kwargs={"use_reentrant": False}, every_n_layers=every)
        return f"the model's own activation_checkpointing_enable(every_n_layers={every})"
    if mode != "full":
        return None
    enable = getattr(model, "set_grad_checkpointing", None)
    if callable(enable) and not callable(getattr(model, "gradient_checkpointing_enable", None)):
        enable(True)
        return "the model's own set_grad_checkpointing() (timm's)"
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if not callable(enable):
        return None
    if _takes_keyword(enable, "gradient_checkpointing_kwargs"):
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        enable()
    return "the model's own gradient_checkpointing_enable()"


def _takes_keyword(fn: Callable[..., Any], name: str) -> bool:
    """Whether `fn` accepts the keyword `name` (by name or through `**kwargs`)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def apply_verified_checkpointing(
        model: nn.Module, mode: str, batch: Any, loss_fn: LossFn,
        checkpoint_modules: Callable[[nn.Module], list[nn.Module]] | None = None,
        precision: str = "fp32") -> None:
    """Apply activation checkpointing to `model` only if it changes nothing but memory.

    One forward and backward on `batch` (on the model's device) before applying it and one
    after, from the same weights, buffers and random state: the second must not raise, and its
    loss and gradients must match the first within float tolerance; otherwise `Unsupported`
    says why. Gradients, buffers and the random state are left as they were. A model that fails
    on `batch` even without checkpointing leaves nothing to compare with: checkpointing is then
    applied unchecked, and the real steps report the model's own failure.
    """
    if mode == "none":
        return
    device = next(model.parameters()).device
    try:
        with _left_as_it_was(model, device):
            reference = _loss_and_gradients(model, batch, loss_fn, precision, device)
    except Exception:
        apply_activation_checkpointing(model, mode, checkpoint_modules)
        return
    with _left_as_it_was(model, device):
        how = None
        try:
            how = apply_activation_checkpointing(model, mode, checkpoint_modules)
            checked = _loss_and_gradients(model, batch, loss_fn, precision, device)
        except Unsupported:
            raise
        except Exception as exc:
            applied = f" (with {how})" if how else ""
            raise Unsupported(f"activation checkpointing breaks this model{applied}, which "
                              f"trains without it: {type(exc).__name__}: {exc}",
                              knob="activation_checkpointing", value=mode) from exc
    change = _what_changed(reference, checked)
    if change:
        raise Unsupported(f"activation checkpointing changes what this model learns (with "
                          f"{how}): {change}", knob="activation_checkpointing", value=mode)


def checkpointing_problem(build_model: Callable[[], nn.Module], batch: Any, loss_fn: LossFn,
                          mode: str,
                          checkpoint_modules: Callable[[nn.Module], list[nn.Module]] | None
                          = None, device: str | torch.device = "cpu",
                          precision: str = "fp32") -> str | None:
    """Why activation checkpointing `mode` cannot be used on this model, or None when one step
    on `batch` (already on `device`) trains exactly as it does without it."""
    model = build_model().to(device).train()
    try:
        apply_verified_checkpointing(model, mode, batch, loss_fn, checkpoint_modules, precision)
    except Unsupported as exc:
        return str(exc)
    return None


def nonfinite_problem(build_model: Callable[[], nn.Module], batch: Any, loss_fn: LossFn,
                      precision: str, device: str | torch.device = "cpu") -> str | None:
    """Why training under `precision` goes non-finite at once on this model (its loss or a
    gradient NaN or inf after one forward and backward on `batch`, already on `device`), or
    None when both are finite."""
    model = build_model().to(device).train()
    step = _loss_and_gradients(model, batch, loss_fn, precision, torch.device(device))
    if not math.isfinite(step.loss):
        return f"the loss is {step.loss} under {precision} on the dataset's first samples"
    bad = next((name for name, g in step.gradients.items()
                if g is not None and not bool(torch.isfinite(g).all())), None)
    if bad is not None:
        return (f"the gradient of {bad} is not finite under {precision} on the dataset's first "
                "samples")
    return None


@dataclass
class _OneStep:
    loss: float
    gradients: dict[str, torch.Tensor | None]


def _loss_and_gradients(model: nn.Module, batch: Any, loss_fn: LossFn, precision: str,
                        device: torch.device) -> _OneStep:
    with autocast_context(precision, device):
        loss = loss_fn(model, batch)
    loss.backward()
    return _OneStep(float(loss.detach().float()),
                    {name: None if p.grad is None else p.grad.detach().clone()
                     for name, p in model.named_parameters()})


@contextlib.contextmanager
def _left_as_it_was(model: nn.Module, device: torch.device) -> Iterator[None]:
    """Random state, buffers (batch-norm statistics) and gradients restored on the way out."""
    buffers = [b.detach().clone() for b in model.buffers()]
    devices = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type="cuda"):
        try:
            yield
        finally:
            with torch.no_grad():
                for buffer, saved in zip(model.buffers(), buffers):
                    buffer.copy_(saved)
            model.zero_grad(set_to_none=True)


def _what_changed(reference: _OneStep, checked: _OneStep) -> str | None:
    """The first difference beyond float rounding between two steps, in words."""
    if not math.isfinite(reference.loss):
        return None
    if not math.isclose(checked.loss, reference.loss, rel_tol=CHECKPOINT_LOSS_RTOL,
                        abs_tol=1e-6):
        return f"the loss is {checked.loss:.6g} with it, {reference.loss:.6g} without"
    norms = {name: float(g.float().norm()) for name, g in reference.gradients.items()
             if g is not None}
    scale = math.sqrt(sum(n * n for n in norms.values()))
    for name, want in reference.gradients.items():
        got = checked.gradients.get(name)
        if (got is None) != (want is None):
            return (f"{name} gets {'no' if got is None else 'a'} gradient with it and "
                    f"{'one' if got is None else 'none'} without")
        if want is None:
            continue
        drift = float((got.float() - want.float()).norm())
        if drift > CHECKPOINT_GRAD_RTOL * norms[name] + 1e-6 * scale:
            return f"the gradient of {name} is off by {drift / max(norms[name], 1e-30):.1%}"
    return None


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of the model's largest stack (by parameter count): an `nn.ModuleList`, or an
    `nn.Sequential` of blocks of one kind (timm's stages, a user's `Sequential(*blocks)`; not a
    mixed `Sequential(Linear, ReLU, ...)`)."""
    stacks = [m for m in model.modules() if isinstance(m, (nn.ModuleList, nn.Sequential))
              and len(m) > 1 and (isinstance(m, nn.ModuleList) or len({type(c) for c in m}) == 1)]
    if not stacks:
        return []
    largest = max(stacks, key=lambda m: sum(p.numel() for p in m.parameters()))
    return list(largest)


def _checkpoint_forward(module: nn.Module) -> None:
    inner = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    module.forward = forward


def move_to_device(batch: Any, device: torch.device, non_blocking: bool = False,
                   where: str = "batch",
                   convert: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Any:
    """Move every tensor in a batch to `device`.

    Tensors, objects that move themselves with a `.to(device)` method (PyTorch Geometric
    `Data`/`Batch`/`HeteroData`, Hugging Face `BatchEncoding`, DGL graphs, a user's own class;
    `non_blocking` is passed where `.to` takes it), and dicts, tuples, lists, namedtuples and
    dataclasses of them. Pinning is the DataLoader's (`pin_memory=True` calls `pin_memory()` on
    objects that have one), so it is not repeated here. `convert` is applied to every tensor
    moved (not inside objects that move themselves).
    """
    if isinstance(batch, torch.Tensor):
        moved = batch.to(device, non_blocking=non_blocking)
        return convert(moved) if convert is not None else moved
    if isinstance(batch, (str, bytes, int, float, bool, type(None))):
        return batch
    to = getattr(batch, "to", None)
    if callable(to) and not isinstance(batch, type):
        if _takes_keyword(to, "non_blocking"):
            return to(device, non_blocking=non_blocking)
        return to(device)
    if isinstance(batch, Mapping):
        moved = {k: move_to_device(v, device, non_blocking, f"{where}[{k!r}]", convert)
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
        return type(batch)(*(move_to_device(v, device, non_blocking, f"{where}.{name}", convert)
                             for name, v in zip(batch._fields, batch)))
    if isinstance(batch, (tuple, list)):
        return type(batch)(move_to_device(v, device, non_blocking, f"{where}[{i}]", convert)
                           for i, v in enumerate(batch))
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{
            f.name: move_to_device(getattr(batch, f.name), device, non_blocking,
                                   f"{where}.{f.name}", convert)
            for f in dataclasses.fields(batch) if f.init})
    kind = type(batch).__name__
    raise BatchTransferError(
        f"{where} is a {kind}, which cannot be moved to {device}: it is not a tensor, has no "
        f"to(device) method, and is not a dict, tuple, list or dataclass of such. Give {kind} "
        "a to(device) method, or define `def to_device(batch, device):` in the model file "
        "returning the batch on the device")


def training_state_bytes(model: Any) -> int:
    """What training the model costs before any activation: fp32 weights, their gradients and
    AdamW's two moments."""
    return 4 * sum(p.numel() * p.element_size() for p in model.parameters())
