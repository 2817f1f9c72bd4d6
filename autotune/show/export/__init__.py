"""The measured configuration in the form a user's trainer takes: YAML/JSON (`TrainConfig`),
Hugging Face `TrainingArguments`, Lightning `Trainer`, a plain PyTorch training script, or a
script study's answer in the script's own arguments.

One module per format (`config_file`, `hf`, `lightning`, `torch_script` with `torch_group` for
a process group's ranks, `script_args`), and `common` for what they share. The scripts import
from autotune only what the package hands on (`autotune.__all__`)."""

from __future__ import annotations

from collections.abc import Sequence

from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.options import EXPORT_FORMATS, SCRIPT_EXPORT_FORMATS
from autotune.show.export.config_file import json_file, yaml_file
from autotune.show.export.hf import hf_script, hf_training_arguments
from autotune.show.export.lightning import lightning_script
from autotune.show.export.script_args import script_args_text
from autotune.show.export.torch_script import torch_script
from autotune.target import ModelFile, Script, Target
from autotune.trial.protocol import ScriptAnswer

__all__ = ["EXPORT_FORMATS", "export_config", "hf_training_arguments"]


def export_config(config: TrainConfig, fmt: str, *, target: Target | None = None,
                  device: str = "cuda", nproc_per_node: int = 1, convolutional: bool = False,
                  script_answer: ScriptAnswer | None = None, checks: Sequence[str] = ()) -> str:
    """The recommended configuration as text in one of EXPORT_FORMATS.

    `yaml` and `json` load back with `TrainConfig.load`; `hf`, `lightning` and `torch` are
    Python. `target` and `device` shape the `torch` script only: with a model file it trains
    that file's model with its arguments (the path is written as given), without one (or for a
    training script) it has placeholders to fill in. `nproc_per_node` is the number of ranks
    (torchrun's `--nproc-per-node`) a configuration with parallelism ddp or fsdp runs on: the
    exports launch that many, and the global batch counts them. `convolutional` (the model has
    2-D or 3-D convolutions, as the probe found) adds cudnn.benchmark to the HF and Lightning
    exports, as the trials on CUDA had it. `args` is a script study's answer in the script's
    terms (`script_answer`; a `Script` target gives the whole command with its arguments).
    `checks` are what the study checked of the configuration beyond its speed (its worst
    batch, its loss), a line each: comments in every format but JSON, where they are a key.
    """
    script = model = None
    match target:
        case Script():
            script = target
        case ModelFile():
            model = target
    if fmt in SCRIPT_EXPORT_FORMATS:
        return script_args_text(script_answer, script)
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; the formats are: "
                          f"{', '.join(EXPORT_FORMATS + SCRIPT_EXPORT_FORMATS)}")
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or \
            nproc_per_node < 1:
        raise ConfigError(f"nproc_per_node must be a positive integer, got {nproc_per_node!r}")
    if nproc_per_node > 1 and config.parallelism == "none":
        raise ConfigError(f"nproc_per_node={nproc_per_node} needs parallelism ddp or fsdp: "
                          "several ranks must share the model one way or the other, and this "
                          "configuration has parallelism none")
    if fmt == "yaml":
        return yaml_file(config, nproc_per_node, checks)
    if fmt == "json":
        return json_file(config, checks)
    if fmt == "hf":
        return hf_script(config, nproc_per_node, convolutional, checks)
    if fmt == "lightning":
        return lightning_script(config, nproc_per_node, convolutional, checks)
    return torch_script(config, model, device, nproc_per_node, checks)
