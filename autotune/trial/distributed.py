"""A trial as one rank of a process group started by torchrun: join the group, wrap the model
the way users wrap it (DDP, or FSDP2's `fully_shard`), shard the data, and make every decision of
the measurement once, for all ranks.

The ranks of a group must run the same steps, or one waits forever in a collective: every choice
the measurement makes from a clock (warm-up steady yet? window long enough?) is rank 0's, sent to
the others over a CPU (gloo) side group, so deciding never waits on a GPU.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, DistributedSampler

from autotune.config import TrainConfig

# A collective that has not completed after this long has a rank that is gone or stuck: it
# raises instead of hanging (the tuner's time limit is the last resort).
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class World:
    """This process's place in the group."""

    rank: int
    local_rank: int
    size: int
    decisions: Any  # the gloo group every rank-0 decision travels on

    def decide(self, flag: bool) -> bool:
        """Rank 0's `flag`, on every rank."""
        box = torch.tensor([int(flag)], dtype=torch.int32)
        dist.broadcast(box, src=0, group=self.decisions)
        return bool(box.item())

    def gather(self, value: Any) -> list[Any]:
        """`value` of every rank, in rank order, on every rank (plain Python data)."""
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, value, group=self.decisions)
        return out


def decided(flag: bool) -> bool:
    """`flag` as every rank of the group this process joined takes it (rank 0's), or as it is
    where it joined none."""
    world = current()
    return flag if world is None else world.decide(flag)


def launched_world_size() -> int:
    """How many ranks torchrun started this process among (1 when it did not)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


_joined: list[World] = []  # the group this process joined (one at most)


def join(device_type: str) -> World | None:
    """Join the process group torchrun set up for this process (None when alone): NCCL between
    GPUs, gloo on CPU; decisions always on gloo."""
    if launched_world_size() <= 1:
        return None
    local_rank = int(os.environ["LOCAL_RANK"])
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo",
                            timeout=COLLECTIVE_TIMEOUT)
    decisions = dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT) \
        if device_type == "cuda" else dist.group.WORLD
    _joined.append(World(dist.get_rank(), local_rank, dist.get_world_size(), decisions))
    return _joined[-1]


def current() -> World | None:
    """The group this process joined, if any."""
    return _joined[-1] if _joined else None


def rank_device(device: torch.device, world: World | None) -> torch.device:
    """The device of this rank: its own GPU under a group on CUDA."""
    if world is not None and device.type == "cuda":
        return torch.device("cuda", world.local_rank)
    return device


def wrap_model(model: nn.Module, config: TrainConfig, blocks: list[nn.Module],
               device: torch.device) -> nn.Module:
    """The model as the ranks train it: DistributedDataParallel with the DDP knobs, or FSDP2
    `fully_shard` on each of `blocks` (the repeated blocks, as checkpointing finds them) and then
    the root, bf16 parameters under bf16 with the reduce dtype asked for."""
    if config.parallelism == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(
            model, device_ids=ids, bucket_cap_mb=config.ddp_bucket_cap_mb,
            static_graph=config.ddp_static_graph,
            gradient_as_bucket_view=config.ddp_gradient_as_bucket_view)
    if config.parallelism == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy()
        if config.precision == "bf16":
            policy = MixedPrecisionPolicy(
                param_dtype=torch.bfloat16,
                reduce_dtype=torch.bfloat16 if config.fsdp_reduce_dtype == "bf16"
                else torch.float32)
        for block in callable_blocks(blocks):
            fully_shard(block, reshard_after_forward=config.fsdp_reshard_after_forward,
                        mp_policy=policy)
        fully_shard(model, reshard_after_forward=config.fsdp_reshard_after_forward,
                    mp_policy=policy)
    return model


def callable_blocks(blocks: list[nn.Module]) -> list[nn.Module]:
    """The modules FSDP can shard in `blocks`: each block that is called, and in place of a
    container that is never called itself (a block that is an `nn.ModuleList` of a norm, an
    attention and a residual, as x-transformers builds them) its children that hold
    parameters."""
    out: list[nn.Module] = []
    for block in blocks:
        if isinstance(block, (nn.ModuleList, nn.ModuleDict)):
            out += callable_blocks([c for c in block.children()
                                    if any(True for _ in c.parameters())])
        else:
            out.append(block)
    return out


def gradient_sync(model: nn.Module, config: TrainConfig,
                  last: bool) -> contextlib.AbstractContextManager[Any]:
    """Around one micro-step's backward: gradients reduced across ranks only on the last
    micro-step of an optimizer step (DDP's `no_sync()`, FSDP2's
    `set_requires_gradient_sync`)."""
    if config.parallelism == "ddp" and not last:
        return model.no_sync()
    if config.parallelism == "fsdp" and config.grad_accum_steps > 1:
        _fsdp_root(model).set_requires_gradient_sync(last)
    return contextlib.nullcontext()


def _fsdp_root(model: nn.Module) -> Any:
    """The fully_shard'ed root, also under torch.compile's wrapper."""
    return getattr(model, "_orig_mod", model)


def sampler(dataset: Dataset, world: World, seed: int) -> DistributedSampler:
    """Each rank its own shard of every epoch, shuffled, full micro-batches only."""
    return DistributedSampler(dataset, num_replicas=world.size, rank=world.rank, shuffle=True,
                              seed=seed, drop_last=True)


def epochs(loader: Any) -> Iterator[Any]:
    """Micro-batches forever; a DistributedSampler told each new epoch, as users' loops do."""
    epoch = 0
    while True:
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1
