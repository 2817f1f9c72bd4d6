"""The torch export: a runnable training script built on `setup_training`, the code the trials
ran, for the study's model file or with placeholders to fill in. Under ddp or fsdp each rank of a
process group runs it, its `main()` from `torch_group`."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.show.export.common import (
    autotune_import,
    code,
    comment,
    header,
    main_with_arguments,
    py,
    script,
    update_rule,
)
from autotune.show.export.torch_group import group_main, group_preamble, one_process_config
from autotune.target import ModelFile

# What the script says of cudnn.benchmark, which its setup_training turns on itself.
SETUP_BENCHMARK = ("setup_training applies the knobs, and on CUDA sets "
                   "torch.backends.cudnn.benchmark = True for a model with convolutions, as "
                   "autotune's trials did")

# Without a model file, what the user writes.
FILL_IN = '''
# --- FILL IN: your model, dataset and loss --------------------------------------------------
def build_model() -> nn.Module:
    raise NotImplementedError("FILL IN: return your model (on CPU, in fp32)")


def build_dataset() -> torch.utils.data.Dataset:
    raise NotImplementedError("FILL IN: return your map-style Dataset")


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    raise NotImplementedError("FILL IN: return the scalar loss of one batch")
# --- end of FILL IN -------------------------------------------------------------------------
'''

# One process's loop, after `setup`: setup_training's own step, the loss logged now and then.
TRAIN_LOOP = '''
batches = setup.batches()
for step in range(1, args.steps + 1):
    result = setup.step(batches)
    if step % LOG_EVERY == 0 or step == args.steps:  # float() waits for the device
        print(f"step {step}: loss {float(result.loss):.4f}", flush=True)
'''


def torch_script(config: TrainConfig, model: ModelFile | None, device: str,
                 nproc_per_node: int, checks: Sequence[str] = ()) -> str:
    """Docstring and imports, the configuration as constants, the model file's model (or FILL
    IN), and `main()`: set up, then train, on one process or on each rank of a group."""
    model_path = model.path if model is not None else None
    group = config.parallelism != "none"
    lines = header(config, nproc_per_node, checks)
    if config.optimizer != "adamw":
        lines += comment(update_rule(config))
    lines += group_preamble(config, model_path, nproc_per_node) if group else \
        _preamble(model_path)
    lines += ["", "CONFIG = TrainConfig.from_dict({",
              *(f"    {py(name)}: {py(value)}," for name, value in config.to_dict().items()),
              "})"]
    if group:
        lines += one_process_config(config)
    if model is not None:
        lines += [f"MODEL_PATH = {py(model.path)}", f"MODEL_ARGS = {_args_literal(model.args)}"]
    lines.append("LOG_EVERY = 10")
    if model_path is None:
        lines += ["", "", *code(FILL_IN)]
    setup = _setup(model_path, group)
    if group:
        lines += group_main(config, model_path, device, setup)
    else:
        lines += [*main_with_arguments(device, "cpu, cuda or cuda:N"), *setup,
                  *code(TRAIN_LOOP, "    ")]
    return script([*lines, "", "", 'if __name__ == "__main__":', "    main()"])


def _args_literal(model_args: dict[str, Any]) -> str:
    """A model file's arguments as the Python literal the script holds, which must read back
    as itself."""
    literal = py(model_args)
    try:
        plain = ast.literal_eval(literal) == model_args
    except (ValueError, SyntaxError):
        plain = False
    if not plain:
        raise ConfigError(f"model_args must be plain values (numbers, strings, booleans) to "
                          f"be written into a script, got {model_args!r}")
    return literal


def _preamble(model_path: str | Path | None) -> list[str]:
    """The docstring and imports of the script one process runs."""
    lines = code('''
        """Train with the configuration autotune measured, in a plain PyTorch loop.

        Run: python this_file.py [--steps 100] [--device cpu|cuda|cuda:N]
        """
        import argparse

        import torch
        ''')
    if model_path is None:
        return [*lines, "from torch import nn", "",
                *autotune_import(["TrainConfig", "setup_training"])]
    return [*lines, "", *autotune_import(["TrainConfig", "load_workload", "setup_from_workload"])]


def _setup(model_path: str | Path | None, group: bool) -> list[str]:
    """The lines of `main()` that build `setup` from the model, for one process (`CONFIG`) or
    for one rank, which wraps the model itself (`ONE_PROCESS`)."""
    config = "ONE_PROCESS" if group else "CONFIG"
    lines = comment(SETUP_BENCHMARK, "    ")
    if model_path is None:
        return [*lines, "    # add collate_fn=... if your dataset needs one",
                f"    setup = setup_training(build_model(), build_dataset(), {config}, "
                f"{'device' if group else 'args.device'}, loss_fn=loss_fn)"]
    return [*lines, "    workload = load_workload(MODEL_PATH, MODEL_ARGS)",
            f"    setup = setup_from_workload(workload, {config}, "
            f"{'device' if group else 'torch.device(args.device)'})"]
