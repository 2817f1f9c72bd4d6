"""Load and check a model file: the model-file contract (README).

A model file is plain Python that never imports autotune. It must define `build_model(**kw)` and
`build_dataset(**kw)`; it may define `loss_fn`, `collate_fn`, `to_device`, `build_optimizer`,
`checkpoint_modules`, `BASELINE` and `flops_per_sample`. Every way a file can break the contract
raises `ContractError` with one message that says what to fix.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from autotune.config import TrainConfig, from_baseline
from autotune.errors import ConfigError, ContractError


@dataclass
class Workload:
    """A loaded model file and the keyword arguments (`--model-arg`) it is built with."""

    path: Path
    module: ModuleType
    model_args: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.stem

    def hook(self, name: str) -> Any:
        """An optional contract function or value, or None."""
        return getattr(self.module, name, None)

    @property
    def baseline(self) -> dict[str, Any]:
        baseline = self.hook("BASELINE") or {}
        if not isinstance(baseline, Mapping):
            raise ContractError(f"{self.path}: BASELINE must be a dict of knob: value, "
                                f"got {type(baseline).__name__}")
        return dict(baseline)

    def train_config(self, overrides: Mapping[str, Any], device_type: str,
                     world_size: int = 1) -> TrainConfig:
        """The file's BASELINE (PyTorch's defaults where it says nothing), `overrides` on top."""
        try:
            base = from_baseline(self.baseline, device_type, world_size)
        except ConfigError as exc:
            raise ContractError(f"{self.path}: BASELINE: {exc}") from None
        return TrainConfig.from_dict(overrides, base)

    def build_model(self) -> nn.Module:
        model = _call(self.module.build_model, self.model_args)
        if not isinstance(model, nn.Module):
            raise ContractError(f"{self.path}: build_model() must return a torch.nn.Module, "
                                f"got {type(model).__name__}")
        return model

    def build_dataset(self) -> torch.utils.data.Dataset:
        dataset = _call(self.module.build_dataset, self.model_args)
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise ContractError(f"{self.path}: build_dataset() must return a map-style Dataset "
                                f"(with __getitem__ and __len__), got {type(dataset).__name__}")
        if len(dataset) == 0:
            raise ContractError(f"{self.path}: build_dataset() returned an empty dataset")
        return dataset

    def loss_fn(self) -> Callable[[nn.Module, Any], torch.Tensor]:
        """The file's `loss_fn`, or the default that reads the loss off the model's output."""
        user = self.hook("loss_fn")
        if user is not None:
            return user
        path = self.path

        def default_loss(model: nn.Module, batch: Any) -> torch.Tensor:
            return loss_from_output(call_model(model, batch), path)

        return default_loss

    def flops_per_sample(self) -> float | None:
        """FLOPs of one training sample (forward and backward) if the file states it."""
        value = self.hook("flops_per_sample")
        if callable(value):
            value = _call(value, self.model_args)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ContractError(f"{self.path}: flops_per_sample must be a positive number, "
                                f"got {value!r}")
        return float(value)


# Model files imported ahead of time in this process (a fork server's), by resolved path.
_PRELOADED: dict[Path, ModuleType] = {}


def preload(path: str | Path) -> bool:
    """Import a model file now, so that processes forked from this one find it imported
    (`load_workload` reuses it); False when it does not import (the trial will say why)."""
    try:
        _PRELOADED[Path(path).resolve()] = _import(Path(path))
    except (ContractError, SystemExit):
        return False
    return True


def load_workload(path: str | Path, model_args: Mapping[str, Any] | None = None) -> Workload:
    """Import a model file and check what can be checked without building anything."""
    path = Path(path)
    if not path.is_file():
        raise ContractError(f"model file not found: {path}")
    module = _PRELOADED.get(path.resolve()) or _import(path)
    for required in ("build_model", "build_dataset"):
        if not callable(getattr(module, required, None)):
            raise ContractError(f"{path} must define {required}(**kw); see the model-file "
                                "contract in the README")
    workload = Workload(path=path, module=module, model_args=dict(model_args or {}))
    _check_model_args(workload)
    return workload


def _import(path: Path) -> ModuleType:
    module_name = f"autotune_model_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ContractError(f"{path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise ContractError(f"{exc.filename or path}:{exc.lineno}: syntax error: {exc.msg}") \
            from None
    except Exception as exc:
        raise ContractError(f"{path}:{_line_in(path, exc)}: importing the model file raised "
                            f"{type(exc).__name__}: {exc}") from None
    return module


def call_model(model: nn.Module, batch: Any) -> Any:
    """Call the model the way the contract says: dict -> **batch, tuple/list -> *batch."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def loss_from_output(output: Any, path: Path | str) -> torch.Tensor:
    """`.loss`, `["loss"]` or a scalar output; anything else says to define `loss_fn`."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, Mapping):
        loss = output.get("loss")
    if loss is None and isinstance(output, torch.Tensor) and output.numel() == 1:
        loss = output
    if loss is None:
        raise ContractError(
            f"{path}: the model's output ({_describe(output)}) has no loss. Define "
            "`def loss_fn(model, batch): ...` returning a scalar tensor in the model file, or "
            "make the model return an object with `.loss`, a dict with 'loss', or a scalar.")
    return loss


def check_loss(loss: Any, path: Path | str) -> torch.Tensor:
    """A loss must be a scalar tensor that backward() can start from; a one-element tensor
    (shape (1,), as many hand-written losses return) is one, as backward() takes it."""
    if not isinstance(loss, torch.Tensor):
        raise ContractError(f"{path}: the loss must be a torch.Tensor, got {_describe(loss)}")
    if loss.numel() != 1:
        raise ContractError(f"{path}: the loss must be a scalar, got a tensor of shape "
                            f"{tuple(loss.shape)}; reduce it (e.g. .mean())")
    if not loss.requires_grad:
        raise ContractError(f"{path}: the loss does not require grad, so backward() cannot "
                            "train anything; compute it from the model's output without "
                            ".detach(), .item() or torch.no_grad()")
    return loss.reshape(())


def _call(fn: Callable[..., Any], model_args: Mapping[str, Any]) -> Any:
    """Call a contract function with the model args its signature accepts."""
    return fn(**_accepted(fn, model_args))


def _accepted(fn: Callable[..., Any], model_args: Mapping[str, Any]) -> dict[str, Any]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return dict(model_args)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return dict(model_args)
    names = {p.name for p in params
             if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)}
    return {k: v for k, v in model_args.items() if k in names}


def _check_model_args(workload: Workload) -> None:
    """Every --model-arg must be taken by build_model or build_dataset, or it is a typo."""
    taken: set[str] = set()
    for fn_name in ("build_model", "build_dataset"):
        taken |= set(_accepted(getattr(workload.module, fn_name), workload.model_args))
    unused = sorted(set(workload.model_args) - taken)
    if unused:
        raise ContractError(f"--model-arg {', '.join(unused)}: neither build_model nor "
                            f"build_dataset in {workload.path} takes such a keyword")


def _line_in(path: Path, exc: BaseException) -> int | str:
    """The line of `path` in the exception's traceback (the deepest one), or '?'."""
    line: int | str = "?"
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve() == path.resolve():
            line = frame.lineno or "?"
    return line


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if dataclasses.is_dataclass(value):
        return f"a {type(value).__name__} dataclass"
    if isinstance(value, Mapping):
        return f"a dict with keys {sorted(map(str, value))}"
    return f"a {type(value).__name__}"
