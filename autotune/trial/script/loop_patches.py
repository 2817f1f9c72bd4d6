"""The torch entry points through which a trial's loop watch (`trial/script/loop.LoopWatch`)
sees a script's own loop: one table (`ENTRY_POINTS`), each entry an attribute of torch and the
wrapper the watch puts there, patched and restored from that table (`patched`), with
PyTorch's optimizer step hooks beside it. Each wrapper calls the original, and tells the watch
only while the script's loop is the trial's own (`LoopWatch.ours`)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from autotune.trial.script.observer import dataset_size
from autotune.trial.script.session import current
from autotune.trial.script.sources import call_site, factory_site
from autotune.trial.training import Unsupported


class Watch(Protocol):
    """What the entry points tell: a trial's loop watch (`trial/script/loop.LoopWatch`)."""

    trial: Any
    started: bool

    def ours(self) -> bool: ...
    def loader_built(self, loader: DataLoader, arguments: dict[str, Any],
                     site: Any, factory: bool = False) -> dict[str, Any]: ...
    def delivered(self, loader: Any, batch: Any, wait_s: float) -> None: ...
    def iterating(self, loader: Any) -> None: ...
    def exhausted(self, loader: Any) -> None: ...
    def optimizer_built(self, optimizer: torch.optim.Optimizer, site: Any,
                        factory: bool = False) -> None: ...
    def adam_changes(self, optimizer: torch.optim.Optimizer, arguments: Any,
                     site: Any) -> dict[str, Any]: ...
    def backward(self, tensor: torch.Tensor) -> None: ...
    def script_compiles(self, site: Any) -> None: ...
    def step_started(self, optimizer: torch.optim.Optimizer) -> None: ...
    def step_done(self, optimizer: torch.optim.Optimizer) -> None: ...


# The optimizer classes whose implementation (`foreach`/`fused`) a trial sets.
ADAM = ("Adam", "AdamW")

Wrapper = Callable[[Watch, Callable[..., Any]], Callable[..., Any]]


@dataclass(frozen=True)
class EntryPoint:
    """An attribute of torch the watch wraps: `owner.name`, and how (`wrap(watch, original)`
    gives what goes in its place)."""

    owner: Any
    name: str
    wrap: Wrapper


@contextlib.contextmanager
def _refused_as(changed: dict[str, Any],
                refused: Callable[[Exception], Unsupported]) -> Iterator[None]:
    """Around the script's constructor called with the trial's `changed` arguments: where it
    refuses them, the trial's value is `Unsupported` (`refused` says why), not the script's
    error. (A context, not a call: the constructor's caller must stay the wrapper, whose frame
    `sources.call_site` steps over.)"""
    try:
        yield
    except Exception as exc:
        if not changed:
            raise
        raise refused(exc) from None


def _loader_init(watch: Watch, original: Callable[..., Any]) -> Callable[..., Any]:
    """A DataLoader the script builds (at its line, or through a library's function, timm's
    `create_loader`): recorded, with the trial's loader settings where it is the one the loop
    trains from."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init(self: DataLoader, *args: Any, **kwargs: Any) -> None:
        frame = sys._getframe(1)
        watching = watch.ours() and not watch.started
        site = call_site(frame, self) if watching else None
        factory = watching and site is None
        if factory:
            site = factory_site(frame, self)
        if site is None:
            original(self, *args, **kwargs)
            return
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        changed = watch.loader_built(self, dict(bound.arguments), site, factory)
        knob = next(iter(changed), "")
        bound.arguments.update(changed)
        with _refused_as(changed, lambda exc: Unsupported(
                f"{knob}={changed[knob]}: the script's DataLoader refuses it: {exc}", knob,
                changed[knob])):
            original(*bound.args, **bound.kwargs)
        record = self._autotune_loader  # type: ignore[attr-defined]
        record.dataset_size, record.dataset, record.collate = \
            dataset_size(self.dataset), self.dataset, self.collate_fn

    return init


def _loader_iter(watch: Watch, original: Callable[..., Any]) -> Callable[..., Any]:
    """A recorded DataLoader's iterator carries its record, for its batches; the watch is told
    an epoch of it begins."""

    @functools.wraps(original)
    def iterate(self: DataLoader) -> Any:
        record = getattr(self, "_autotune_loader", None)
        if watch.ours():
            watch.iterating(record)
        iterator = original(self)
        if record is not None:
            with contextlib.suppress(AttributeError):
                iterator._autotune_loader = record
        return iterator

    return iterate


def _next_batch(watch: Watch, original: Callable[..., Any]) -> Callable[..., Any]:
    """A batch delivered while gradients are on: a training batch, and its wait; the watch is
    told where a loader's batches run out (an epoch's end)."""

    @functools.wraps(original)
    def next_batch(self: Any) -> Any:
        if not watch.ours() or not torch.is_grad_enabled():
            return original(self)
        record = getattr(self, "_autotune_loader", None)
        start = time.perf_counter()
        try:
            batch = original(self)
        except StopIteration:
            watch.exhausted(record)
            raise
        watch.delivered(record, batch, time.perf_counter() - start)
        return batch

    return next_batch


def _optimizer_init(watch: Watch, original: Callable[..., Any]) -> Callable[..., Any]:
    """Any torch optimizer the script builds before its loop starts, recorded: at the line that
    builds it, or, where a library built it (timm's `create_optimizer_v2`, parameter groups
    and all), at the script's call of that library."""

    @functools.wraps(original)
    def init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if watch.ours() and not watch.started:
            frame = sys._getframe(1)
            site = call_site(frame, self)
            if site is not None:
                watch.optimizer_built(self, site)
            elif (site := factory_site(frame, self)) is not None:
                watch.optimizer_built(self, site, factory=True)

    return init


def _adam_init(watch: Watch, original: Callable[..., Any]) -> Callable[..., Any]:
    """An Adam or AdamW the script builds: the trial's implementation in place of its own."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        site = call_site(sys._getframe(1), self) if watch.ours() and not watch.started else None
        if site is None or type(self).__name__ not in ADAM:
            original(self, *args, **kwargs)
            return
        bound = signature.bind(self, *args, **kwargs)
        changed = watch.adam_changes(self, bound.arguments, site)
        impl = "fused" if changed.get("fused") else "foreach" if changed.get("foreach") else \
            "for_loop"
        bound.arguments.update(changed)
        with _refused_as(changed, lambda exc: Unsupported(
                f"optimizer_impl={impl}: the script's {type(self).__name__} refuses it: {exc}",
                "optimizer_impl", impl)):
            original(*bound.args, **bound.kwargs)

    return init


def _backward(watch: Watch, original: Callable[..., Any]) -> Callable[..., Any]:
    """A backward pass: a micro-batch of the loop, and its loss."""

    @functools.wraps(original)
    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if watch.ours():
            watch.backward(self.detach())
        return original(self, *args, **kwargs)

    return backward


def _compile(watch: Watch, original: Callable[..., Any]) -> Callable[..., Any]:
    """The script's own torch.compile: where it compiles is recorded."""

    @functools.wraps(original)
    def compile_(*args: Any, **kwargs: Any) -> Any:
        if watch.ours():
            site = call_site(sys._getframe(1))
            if site is not None:
                watch.script_compiles(site)
        return original(*args, **kwargs)

    return compile_


def _init_group(watch: Watch, original: Callable[..., Any]) -> Callable[..., Any]:
    """The script's own `init_process_group` finds the group its rank joined (torchrun
    started it before the script ran)."""

    @functools.wraps(original)
    def init_group(*args: Any, **kwargs: Any) -> None:
        if current() is watch.trial and torch.distributed.is_initialized():
            return None
        return original(*args, **kwargs)

    return init_group


ENTRY_POINTS = (
    EntryPoint(DataLoader, "__init__", _loader_init),
    EntryPoint(DataLoader, "__iter__", _loader_iter),
    EntryPoint(_BaseDataLoaderIter, "__next__", _next_batch),
    EntryPoint(torch.optim.Optimizer, "__init__", _optimizer_init),
    EntryPoint(torch.optim.Adam, "__init__", _adam_init),
    EntryPoint(torch.Tensor, "backward", _backward),
    EntryPoint(torch, "compile", _compile),
    EntryPoint(torch.distributed, "init_process_group", _init_group),
)


@contextlib.contextmanager
def patched(watch: Watch) -> Iterator[None]:
    """Every entry point of `ENTRY_POINTS` wrapped for `watch`, and the optimizer step hooks
    registered, while inside; each original put back after, from the same table."""
    originals = [(entry, getattr(entry.owner, entry.name)) for entry in ENTRY_POINTS]
    for entry, original in originals:
        setattr(entry.owner, entry.name, entry.wrap(watch, original))

    def pre_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if watch.ours():
            watch.step_started(optimizer)

    def post_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if current() is watch.trial:
            watch.step_done(optimizer)

    hooks = [register_optimizer_step_pre_hook(pre_step),
             register_optimizer_step_post_hook(post_step)]
    try:
        yield
    finally:
        for entry, original in originals:
            setattr(entry.owner, entry.name, original)
        for hook in hooks:
            hook.remove()
