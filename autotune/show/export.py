"""The measured configuration in the form a user's trainer takes: YAML/JSON (`TrainConfig`),
Hugging Face `TrainingArguments`, Lightning `Trainer`, or a plain PyTorch training script."""

from __future__ import annotations

import ast
import json
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.config import CUDA_GRAPH_MODES, FP8_PRECISIONS, TrainConfig
from autotune.errors import ConfigError

EXPORT_FORMATS = ("yaml", "json", "hf", "lightning", "torch")

# float8 runs its large linear layers in float8 and the rest under bf16 autocast.
LIGHTNING_PRECISION = {"fp32": "32-true", "tf32": "32-true", "bf16": "bf16-mixed",
                       "fp16": "16-mixed", **dict.fromkeys(FP8_PRECISIONS, "bf16-mixed")}
# The optimizers that replace AdamW: the class autotune measured, TrainingArguments' optim.
OPTIMIZER_CLASSES = {"adafactor": "torch.optim.Adafactor",
                     "adamw_8bit": "bitsandbytes.optim.AdamW8bit"}
HF_OPTIMS = {"adafactor": "adafactor", "adamw_8bit": "adamw_bnb_8bit"}


def export_config(config: TrainConfig, fmt: str, *, model_path: str | Path | None = None,
                  model_args: Mapping[str, Any] | None = None, device: str = "cuda",
                  nproc_per_node: int = 1, convolutional: bool = False) -> str:
    """The recommended configuration as text in one of EXPORT_FORMATS.

    `yaml` and `json` load back with `TrainConfig.load`; `hf`, `lightning` and `torch` are
    Python. `model_path`, `model_args` and `device` shape the `torch` script only: with a model
    file it trains that file's model (the path is written as given), without one it has
    placeholders to fill in. `nproc_per_node` is the number of ranks (torchrun's
    `--nproc-per-node`) a configuration with parallelism ddp or fsdp runs on: the exports launch
    that many, and the global batch counts them. `convolutional` (the model has 2-D or 3-D
    convolutions, as the probe found) adds cudnn.benchmark to the HF and Lightning exports, as
    the trials on CUDA had it.
    """
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; the formats are: "
                          f"{', '.join(EXPORT_FORMATS)}")
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or \
            nproc_per_node < 1:
        raise ConfigError(f"nproc_per_node must be a positive integer, got {nproc_per_node!r}")
    if nproc_per_node > 1 and config.parallelism == "none":
        raise ConfigError(f"nproc_per_node={nproc_per_node} needs parallelism ddp or fsdp: "
                          "several ranks must share the model one way or the other, and this "
                          "configuration has parallelism none")
    if fmt == "yaml":
        return "\n".join(_header(config, nproc_per_node)) + "\n" + config.to_yaml()
    if fmt == "json":  # JSON has no comments, so no header
        return config.to_json()
    if fmt == "hf":
        return _hf_script(config, nproc_per_node, convolutional)
    if fmt == "lightning":
        return _lightning_script(config, nproc_per_node, convolutional)
    return _torch_script(config, model_path, dict(model_args or {}), device, nproc_per_node)


def hf_training_arguments(config: TrainConfig) -> dict[str, Any]:
    """Keyword arguments for `transformers.TrainingArguments` that apply `config`.

    TrainingArguments has no "selective" checkpointing (it checkpoints every layer), no
    foreach/for-loop switch ("adamw_torch" is PyTorch's default, foreach on CUDA), no
    torch.optim.Adafactor (its "adafactor" is transformers' own) and no torchao float8 (bf16
    here, the model converted by hand); the `hf` export says so. `tf32` is True for tf32; for
    the other precisions it is left out (PyTorch's defaults, as measured), except False for
    fp32 with torch_compile, where TrainingArguments would otherwise turn TF32 on by itself.

    Under ddp: the DDP knobs TrainingArguments has (it has no gradient_as_bucket_view), and
    find_unused_parameters False, DDP's default as measured, which Trainer would otherwise turn
    on for most models. Under fsdp: FSDP2 (`fsdp_config` version 2) with reshard_after_forward,
    and activation checkpointing as FSDP's own (`fsdp_config`), which checkpoints inside each
    sharded block as autotune does; `gradient_checkpointing` would all-gather every block again.
    """
    fsdp = config.parallelism == "fsdp"
    args: dict[str, Any] = {
        "per_device_train_batch_size": config.micro_batch_size,
        "gradient_accumulation_steps": config.grad_accum_steps,
        "bf16": _bf16_autocast(config),
        "fp16": config.precision == "fp16",
    }
    if config.precision == "tf32" or (config.precision == "fp32" and
                                      config.compile_mode != "none"):
        args["tf32"] = config.precision == "tf32"
    args.update({
        "gradient_checkpointing": config.activation_checkpointing != "none" and not fsdp,
        "optim": HF_OPTIMS.get(config.optimizer, "adamw_torch_fused"
                               if config.optimizer_impl == "fused" else "adamw_torch"),
        "dataloader_num_workers": config.num_workers,
        "dataloader_prefetch_factor": config.prefetch_factor,  # None whenever workers == 0
        "dataloader_pin_memory": config.pin_memory,
        "dataloader_persistent_workers": config.persistent_workers,
        "torch_compile": config.compile_mode != "none",
        "torch_compile_mode": (None if config.compile_mode in ("none", "default")
                               else config.compile_mode),
    })
    if config.parallelism == "ddp":
        args.update({"ddp_find_unused_parameters": False,
                     "ddp_bucket_cap_mb": config.ddp_bucket_cap_mb,
                     "ddp_static_graph": config.ddp_static_graph})
    elif fsdp:
        fsdp_config: dict[str, Any] = {"version": 2,
                                       "reshard_after_forward": config.fsdp_reshard_after_forward}
        if config.activation_checkpointing != "none":
            fsdp_config["activation_checkpointing"] = True
        args.update({"fsdp": True, "fsdp_config": fsdp_config})
    return args


def _bf16_autocast(config: TrainConfig) -> bool:
    """Whether `config` trains under bf16 autocast (bf16, and float8 for all but the large
    linear layers)."""
    return config.precision in ("bf16", *FP8_PRECISIONS)


def _header(config: TrainConfig, nproc_per_node: int) -> list[str]:
    """Comment lines naming the tool and every knob, so an exported file says what it holds; under
    a process group, also the global batch, which the number of ranks multiplies."""
    knobs = " ".join(f"{name}={value}" for name, value in config.to_dict().items())
    lines = ["# Generated by autotune from the measured configuration:",
             *(f"#   {line}" for line in textwrap.wrap(knobs, width=92, break_long_words=False,
                                                       break_on_hyphens=False))]
    if config.parallelism != "none":
        batch = (f"global batch: micro_batch_size {config.micro_batch_size} x grad_accum_steps "
                 f"{config.grad_accum_steps} x {_ranks(nproc_per_node)} = "
                 f"{config.effective_batch_size * nproc_per_node} samples per step")
        lines += [f"#   {line}" for line in textwrap.wrap(batch, width=92)]
    return lines


def _ranks(nproc_per_node: int) -> str:
    return f"{nproc_per_node} rank{'s' if nproc_per_node > 1 else ''}"


def _comment(text: str, indent: str = "") -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(text, width=96 - len(indent))]


# What the HF export says of channels_last, which TrainingArguments has no switch for.
CHANNELS_LAST_BY_HAND = (
    "memory_format=channels_last was measured, which TrainingArguments has no switch for: "
    "before Trainer(...), model = model.to(memory_format=torch.channels_last), and have your "
    "data collator return the images as x.contiguous(memory_format=torch.channels_last)")


# What the Lightning and HF exports of a convolutional model say of cudnn.benchmark, which
# autotune's trials turn on.
CUDNN_BENCHMARK = ("cudnn.benchmark: matters for models with convolutions (each input shape's "
                   "fastest cuDNN kernel, timed once); autotune set it during its trials on CUDA")


def _update_rule(config: TrainConfig) -> str:
    """What a memory-saving optimizer changes, said wherever an export builds one."""
    return (f"optimizer={config.optimizer} was measured: {OPTIMIZER_CLASSES[config.optimizer]} "
            "in place of AdamW, another update rule, which changes what the model learns; "
            "compare its loss with AdamW's before keeping it")


def _float8_by_hand(config: TrainConfig) -> str:
    """How to convert the model to the float8 training measured, which TrainingArguments has
    no switch for."""
    recipe = config.precision.removeprefix("fp8_")
    return (f"precision={config.precision} was measured: torchao's float8 training ({recipe} "
            "scales) of the large linear layers, the rest under bf16 autocast, compiled. "
            "TrainingArguments has no switch for it (accelerate's fp8 with the torchao backend "
            "converts every linear layer divisible by 16 but the first and last): before "
            "Trainer(...), convert the model with autotune.trial.float8.convert_to_float8(model, "
            f"{_py(config.precision)}), which is torchao's convert_to_float8_training(model, "
            f"config=Float8LinearConfig.from_recipe_name({_py(recipe)})) on the nn.Linear "
            "layers with both sides >= 1024 features and divisible by 16")


def _attention_by_hand(config: TrainConfig, where: str) -> str:
    """What to write for the measured attention kernel, which no trainer has a switch for."""
    kernel = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
              "cudnn": "CUDNN_ATTENTION", "math": "MATH"}[config.attention_backend]
    return (f"attention_backend={config.attention_backend} was measured, which the trainer has "
            f"no switch for: with torch.nn.attention.sdpa_kernel(SDPBackend.{kernel}): {where} "
            "(a transformers model loaded with attn_implementation=\"sdpa\")")


def _hf_notes(config: TrainConfig) -> dict[str, str]:
    """Where TrainingArguments cannot say exactly what was measured, or would change it."""
    notes = {}
    if config.precision == "tf32":
        notes["tf32"] = "TF32 tensor cores for fp32 matmuls: TrainingArguments raises without " \
                        "an Ampere or newer GPU"
    elif config.precision == "fp32" and config.compile_mode != "none":
        notes["tf32"] = "IEEE fp32 matmuls, as measured (with torch_compile, TrainingArguments " \
                        "would otherwise turn TF32 on); on torch 2.9 and later it also makes " \
                        "cuDNN convolutions IEEE fp32, where PyTorch (and the measurement) " \
                        "runs them in TF32"
    elif _bf16_autocast(config) and config.compile_mode != "none":
        notes["bf16"] = "with torch_compile, TrainingArguments also turns on TF32 for the " \
                        "matmuls left in fp32, which autotune did not measure"
    if config.activation_checkpointing == "selective" and config.parallelism != "fsdp":
        notes["gradient_checkpointing"] = (
            'autotune measured "selective" (every other block); TrainingArguments has no such '
            'mode and checkpoints every layer, which is "full". Newer transformers take '
            'activation_checkpointing=True, activation_checkpointing_kwargs={"every_n_layers": '
            '2} for every other layer')
    if config.optimizer == "adafactor":
        notes["optim"] = (
            f"{_update_rule(config)}. TrainingArguments' \"adafactor\" is transformers' own "
            "Adafactor (transformers.optimization.Adafactor), not torch.optim.Adafactor: for "
            "the one measured, pass Trainer(..., optimizer_cls_and_kwargs=(torch.optim."
            'Adafactor, {"lr": args.learning_rate}))')
    elif config.optimizer == "adamw_8bit":
        notes["optim"] = (f"{_update_rule(config)}. \"adamw_bnb_8bit\" is bitsandbytes' AdamW "
                          "with 8-bit state (optim_bits=8), the AdamW8bit measured")
    elif config.optimizer_impl != "fused":
        notes["optim"] = (
            f"autotune measured the {config.optimizer_impl} AdamW; TrainingArguments has no "
            'foreach/for_loop switch: "adamw_torch" is torch.optim.AdamW with PyTorch\'s '
            "default implementation, which is foreach on CUDA")
    if config.compile_mode == "default":
        notes["torch_compile_mode"] = "None: torch.compile's default mode"
    if accumulates_under_cuda_graphs(config):
        notes["torch_compile_mode"] = CUDA_GRAPH_ACCUMULATION
    if config.parallelism == "ddp":
        notes["ddp_find_unused_parameters"] = (
            "False, as measured (DDP's default): Trainer would otherwise turn it on, an extra "
            "pass over the autograd graph every step, unless the model is a transformers model "
            "that checkpoints its activations")
    if config.ddp_gradient_as_bucket_view:
        notes["ddp_bucket_cap_mb"] = (
            "autotune measured gradient_as_bucket_view=True (gradients as views into DDP's "
            "buckets: one copy and its memory less); TrainingArguments has no such argument, "
            "as Trainer builds accelerate's DistributedDataParallelKwargs from the ddp_* "
            "arguments alone, so its DDP copies the gradients into the buckets")
    if config.parallelism == "fsdp":
        notes["fsdp_config"] = ". ".join(_hf_fsdp_notes(config))
    return notes


def _hf_fsdp_notes(config: TrainConfig) -> list[str]:
    """What accelerate's FSDP2, as TrainingArguments configures it, does otherwise."""
    notes = ['FSDP2 (version 2): accelerate shards each layer of the model\'s '
             '_no_split_modules (a transformers model\'s repeated blocks) and then the whole '
             'model, as autotune did (for another model add "transformer_layer_cls_to_wrap": '
             '["YourBlock"]); it also gives the input embedding and the output layer shards of '
             'their own, which autotune did not']
    if config.activation_checkpointing == "selective":
        notes.append('Its activation_checkpointing checkpoints every sharded layer ("full"); '
                     'autotune measured "selective" (every other block), which fsdp_config '
                     'has no setting for')
    if config.precision == "bf16" and config.fsdp_reduce_dtype == "fp32":
        notes.append("With bf16=True accelerate's FSDP2 keeps the parameters in bf16 and "
                     "reduces the gradients in bf16 too (MixedPrecisionPolicy(param_dtype="
                     "bfloat16, reduce_dtype=bfloat16)); autotune measured them reduced in fp32 "
                     "(reduce_dtype=float32), which TrainingArguments cannot ask for")
    elif config.precision in ("fp16", *FP8_PRECISIONS):
        half, dtype = ("fp16", "float16") if config.precision == "fp16" else ("bf16", "bfloat16")
        notes.append(f"With {half}=True accelerate's FSDP2 casts the parameters to {half} and "
                     f"reduces the gradients in {half} (MixedPrecisionPolicy(param_dtype={dtype}, "
                     f"reduce_dtype={dtype})); autotune measured fp32 parameters under {half} "
                     "autocast, which TrainingArguments cannot ask for")
    return notes


# What a trainer must do that autotune's train step does (`training.TrainingSetup.step`).
CUDA_GRAPH_ACCUMULATION = (
    "CUDA graphs with gradient accumulation: every parameter needs a .grad allocated before "
    "the first backward and zeroed, not freed, between steps (zero_grad(set_to_none=False)), "
    "as autotune's measurement did; a trainer that frees .grad (zero_grad's default) stops "
    "with 'accessing gradient tensor output of CUDAGraphs that has been overwritten'")


def accumulates_under_cuda_graphs(config: TrainConfig) -> bool:
    return config.compile_mode in CUDA_GRAPH_MODES and config.grad_accum_steps > 1


def _hf_script(config: TrainConfig, nproc_per_node: int, convolutional: bool) -> str:
    notes = _hf_notes(config)
    lines = [*_header(config, nproc_per_node), "#",
             "# Keyword arguments for transformers.TrainingArguments. Use them as:",
             "#     from transformers import TrainingArguments",
             '#     args = TrainingArguments(output_dir="out", **training_args)']
    if config.parallelism != "none":
        lines += ["# in your training script, and launch it on every rank:",
                  f"#     torchrun --nproc-per-node {nproc_per_node} train.py"]
    if config.precision in FP8_PRECISIONS:
        lines += _comment(_float8_by_hand(config))
    if config.memory_format == "channels_last":
        lines += _comment(CHANNELS_LAST_BY_HAND)
    if config.attention_backend != "auto":
        lines += _comment(_attention_by_hand(config, "around trainer.train()"))
    if convolutional:
        lines += _comment(f"{CUDNN_BENCHMARK}. TrainingArguments has no switch for it: set "
                          "torch.backends.cudnn.benchmark = True before trainer.train()")
    lines.append("training_args = dict(")
    for key, value in hf_training_arguments(config).items():
        if key in notes:
            lines += _comment(notes[key], "    ")
        lines.append(f"    {key}={_py(value)},")
    lines.append(")")
    return "\n".join(lines) + "\n"


def _lightning_script(config: TrainConfig, nproc_per_node: int, convolutional: bool) -> str:
    fsdp = config.parallelism == "fsdp"
    if fsdp and config.precision == "fp16":
        raise ConfigError("Lightning has no FSDP2 with fp16 mixed precision: its FSDP2 strategy "
                          "(ModelParallelStrategy) refuses precision 16-mixed; export this "
                          "configuration as hf or torch")
    group = config.parallelism != "none"
    takes = "the precision, the gradient accumulation and the process group" if group else \
        "the precision and the gradient accumulation"
    optimizer = "the optimizer implementation" if config.optimizer == "adamw" else \
        "the optimizer"
    float8 = config.precision in FP8_PRECISIONS
    applies = "activation checkpointing" + ", torchao's float8" * float8 + \
        ", FSDP2's sharding" * fsdp
    lines = [
        *_header(config, nproc_per_node), "#",
        *_comment(f"Lightning's Trainer takes {takes}. It has no argument for the DataLoader "
                  f"settings, {optimizer}, {applies} or torch.compile: the "
                  "functions below apply those. Use them as"),
        "#     trainer.fit(tuned_module(model), train_dataloaders=tuned_dataloader(dataset))",
    ]
    if fsdp:
        lines += ["# with `return tuned_optimizer(self.parameters())` in your "
                  "configure_optimizers() and",
                  '# `self.model = tuned_sharding(self.model, self.device_mesh["data_parallel"])`',
                  "# in your configure_model()."]
    else:
        lines.append("# with `return tuned_optimizer(self.parameters())` in your "
                     "configure_optimizers().")
    if group:
        lines += _comment(f"Run it as python train.py (Lightning starts the {nproc_per_node} "
                          f"processes) or torchrun --nproc-per-node {nproc_per_node} train.py; "
                          "Lightning gives each rank its share of the data (a "
                          "DistributedSampler).")
    sync_strategy = fsdp and config.grad_accum_steps > 1
    if sync_strategy:
        lines.append("import contextlib")
    if config.optimizer == "adamw_8bit":
        lines.append("import bitsandbytes")
    lines += [
        "try:",
        "    import lightning.pytorch as pl",
        "except ImportError:",
        "    import pytorch_lightning as pl",
        "import torch",
    ]
    if fsdp:
        names = ["FSDPModule"] * sync_strategy + ["MixedPrecisionPolicy"] * (
            config.precision == "bf16") + ["fully_shard"]
        lines.append(f"from torch.distributed.fsdp import {', '.join(names)}")
    lines.append("from torch.utils.data import DataLoader")
    autotune_imports = []
    if config.activation_checkpointing != "none":
        autotune_imports.append("from autotune import apply_activation_checkpointing")
    if float8:
        autotune_imports.append("from autotune.trial.float8 import convert_to_float8")
    if fsdp:
        autotune_imports += ["from autotune.trial.distributed import callable_blocks",
                             "from autotune.trial.training import repeated_blocks"]
    if autotune_imports:
        lines += ["", *autotune_imports]
    if config.precision == "tf32":
        lines += ["", "# tf32: fp32 weights and activations, TF32 tensor cores in matmuls",
                  'torch.set_float32_matmul_precision("high")']
    if fsdp:
        lines += ["", *_comment(
            "FSDP2 (fully_shard), as autotune measured it, is Lightning's ModelParallelStrategy "
            "with the sharding done in configure_model (tuned_sharding below): its "
            "FSDPStrategy would wrap the model in FSDP1's FullyShardedDataParallel instead")]
    if sync_strategy:
        lines += [
            "",
            "",
            "class FSDP2Strategy(pl.strategies.ModelParallelStrategy):",
            '    """Skips the gradient sync of non-final micro-steps, as measured (Lightning '
            'does that',
            '    for DDP only)."""',
            "",
            "    @contextlib.contextmanager",
            "    def block_backward_sync(self):",
            "        sharded = [m for m in self.model.modules() if isinstance(m, FSDPModule)]",
            "        for module in sharded:",
            "            module.set_requires_gradient_sync(False, recurse=False)",
            "        try:",
            "            yield",
            "        finally:",
            "            for module in sharded:",
            "                module.set_requires_gradient_sync(True, recurse=False)",
            "",
        ]
    lines += [
        "",
        "trainer = pl.Trainer(",
        f"    precision={_py(LIGHTNING_PRECISION[config.precision])},",
        f"    accumulate_grad_batches={config.grad_accum_steps},",
    ]
    if convolutional:
        lines += [*_comment(CUDNN_BENCHMARK, "    "), "    benchmark=True,"]
    if group:
        lines += [f"    devices={nproc_per_node},", "    num_nodes=1,"]
    if config.parallelism == "ddp":
        lines += ["    strategy=pl.strategies.DDPStrategy("
                  f"bucket_cap_mb={config.ddp_bucket_cap_mb}, "
                  f"static_graph={config.ddp_static_graph},",
                  "                                       gradient_as_bucket_view="
                  f"{config.ddp_gradient_as_bucket_view}),"]
    elif fsdp:
        strategy = "FSDP2Strategy" if sync_strategy else "pl.strategies.ModelParallelStrategy"
        lines.append(f"    strategy={strategy}(data_parallel_size={nproc_per_node}, "
                     "tensor_parallel_size=1),")
    lines += [
        ")",
        "",
        "",
        "def tuned_dataloader(dataset, collate_fn=None):",
        '    """The measured DataLoader settings (full batches only: one shape for compile)."""',
        "    return DataLoader(",
        "        dataset,",
        f"        batch_size={config.micro_batch_size},",
        "        shuffle=True,",
        "        drop_last=True,",
        "        collate_fn=collate_fn,",
        f"        num_workers={config.num_workers},",
        f"        prefetch_factor={config.prefetch_factor},",
        f"        pin_memory={config.pin_memory},",
        f"        persistent_workers={config.persistent_workers},",
        "    )",
        "",
        "",
        *_lightning_optimizer(config),
        "",
        "",
        "def tuned_module(module):",
        '    """Activation checkpointing, as measured (torch.compile follows the sharding)."""'
        if fsdp else
        '    """Activation checkpointing and torch.compile, as measured."""',
    ]
    if config.memory_format == "channels_last":
        lines += [*_comment("channels_last, as measured: the weights here; convert the input "
                            "images too, in your LightningModule's on_after_batch_transfer: "
                            "x.contiguous(memory_format=torch.channels_last)", "    "),
                  "    module = module.to(memory_format=torch.channels_last)"]
    if config.attention_backend != "auto":
        lines += _comment(_attention_by_hand(config, "around trainer.fit(...)"), "    ")
    if config.activation_checkpointing != "none":
        which = "every" if config.activation_checkpointing == "full" else "every other"
        lines += [
            *_comment(f"{config.activation_checkpointing}: {which} block of the largest "
                      "nn.ModuleList recomputes its activations in backward, through "
                      "torch.utils.checkpoint.checkpoint(..., use_reentrant=False). If your "
                      "blocks are elsewhere, add checkpoint_modules=lambda m: [your blocks]",
                      "    "),
            f"    apply_activation_checkpointing(module, "
            f"{_py(config.activation_checkpointing)})"]
    if float8:
        lines += [*_comment(f"{config.precision}: torchao's float8 training of the nn.Linear "
                            "layers with both sides >= 1024 features and divisible by 16 "
                            "(convert_to_float8_training, Float8LinearConfig.from_recipe_name("
                            f"{_py(config.precision.removeprefix('fp8_'))})), before "
                            "torch.compile, which it needs", "    "),
                  f"    convert_to_float8(module, {_py(config.precision)})"]
    if accumulates_under_cuda_graphs(config):
        lines += _comment(CUDA_GRAPH_ACCUMULATION + ": allocate them in on_train_start and "
                          "override optimizer_zero_grad in your LightningModule", "    ")
    if fsdp:
        lines += ["    return module", "", "", *_lightning_sharding(config)]
    else:
        lines.append(_returned("module", config))
    return "\n".join(lines) + "\n"


def _lightning_optimizer(config: TrainConfig) -> list[str]:
    """`tuned_optimizer`: AdamW with the measured implementation, or the optimizer that
    replaced it."""
    lines = ["def tuned_optimizer(parameters):"]
    if config.optimizer == "adamw":
        flags = (f"foreach={config.optimizer_impl == 'foreach'}, "
                 f"fused={config.optimizer_impl == 'fused'}")
        return [*lines,
                '    """Keep your own optimizer and learning rate: what was tuned is '
                'foreach=/fused=."""',
                "    return torch.optim.AdamW(parameters, lr=3e-4, weight_decay=0.01,",
                f"                             {flags})"]
    return [*lines,
            '    """The optimizer measured: give it your own learning rate and weight decay."""',
            *_comment(_update_rule(config), "    "),
            f"    return {OPTIMIZER_CLASSES[config.optimizer]}(parameters, lr=3e-4, "
            "weight_decay=0.01)"]


def _lightning_sharding(config: TrainConfig) -> list[str]:
    """`tuned_sharding`: FSDP2 on the blocks and the root as measured, then torch.compile."""
    policy = ", mp_policy=policy" if config.precision == "bf16" else ""
    lines = [
        "def tuned_sharding(module, mesh, blocks=None):",
        '    """FSDP2 as measured: fully_shard on each of `blocks` (those of the largest '
        'nn.ModuleList',
        '    unless given) and then on the whole module, then torch.compile."""',
    ]
    if config.precision == "bf16":
        lines.append(f"    policy = {_mixed_precision_policy(config)}")
    reshard = f"reshard_after_forward={config.fsdp_reshard_after_forward}"
    return [
        *lines,
        "    for block in callable_blocks(repeated_blocks(module) if blocks is None else "
        "blocks):",
        f"        fully_shard(block, mesh=mesh, {reshard}{policy})",
        f"    fully_shard(module, mesh=mesh, {reshard}{policy})",
        _returned("module", config),
    ]


def _mixed_precision_policy(config: TrainConfig) -> str:
    """FSDP2's policy under bf16: bf16 parameters, gradients reduced in the measured dtype."""
    reduce = "bfloat16" if config.fsdp_reduce_dtype == "bf16" else "float32"
    return f"MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.{reduce})"


def _compile_call(name: str, config: TrainConfig) -> str | None:
    """`name` compiled as measured (None when measured without torch.compile)."""
    if config.compile_mode == "none":
        return None
    if config.compile_mode == "default":
        return f"torch.compile({name})"
    return f"torch.compile({name}, mode={_py(config.compile_mode)})"


def _returned(name: str, config: TrainConfig) -> str:
    """The line that hands back `name`, compiled as measured."""
    call = _compile_call(name, config)
    if call is None:
        return f"    return {name}  # measured without torch.compile"
    return f"    return {call}"


def _torch_script(config: TrainConfig, model_path: str | Path | None,
                  model_args: dict[str, Any], device: str, nproc_per_node: int) -> str:
    if model_args and model_path is None:
        raise ConfigError("model_args need a model_path: they are the model file's arguments")
    args_literal = _py(model_args)
    try:  # the script holds them as a literal, so they must read back as themselves
        plain = ast.literal_eval(args_literal) == model_args
    except (ValueError, SyntaxError):
        plain = False
    if not plain:
        raise ConfigError(f"model_args must be plain values (numbers, strings, booleans) to "
                          f"be written into a script, got {model_args!r}")
    group = config.parallelism != "none"
    knobs = [f"    {_py(name)}: {_py(value)}," for name, value in config.to_dict().items()]
    lines = _header(config, nproc_per_node)
    if config.optimizer != "adamw":
        lines += _comment(_update_rule(config))
    if group:
        lines += _torch_group_preamble(config, model_path, nproc_per_node)
    else:
        lines += [
            '"""Train with the configuration autotune measured, in a plain PyTorch loop.',
            "",
            "Run: python this_file.py [--steps 100] [--device cpu|cuda|cuda:N]",
            '"""',
            "import argparse",
            "",
            "import torch",
        ]
        if model_path is None:
            lines += ["from torch import nn", "",
                      "from autotune import TrainConfig, setup_training"]
        else:
            lines += ["", "from autotune import TrainConfig, load_workload, setup_from_workload"]
    lines += ["", "CONFIG = TrainConfig.from_dict({", *knobs, "})"]
    if group:
        lines += [*_comment("setup_training applies the knobs of one process: main() joins the "
                            "group and wraps the model, then compiles it, as DDP and "
                            "fully_shard want it compiled after wrapping"),
                  "ONE_PROCESS = TrainConfig.from_dict({",
                  "    knob: value for knob, value in CONFIG.to_dict().items()",
                  '    if knob not in CONFIG.distributed() and knob != "compile_mode"})']
        if config.precision in FP8_PRECISIONS:
            lines += [*_comment("setup_training takes float8 compiled only, and here compile "
                                "follows the wrapping: it gets bf16 (the autocast float8 runs "
                                "the rest under), and main() converts the large linear layers "
                                "to float8 before wrapping"),
                      'ONE_PROCESS = ONE_PROCESS.replace(precision="bf16")']
    if model_path is not None:
        lines += [f"MODEL_PATH = {_py(str(model_path))}", f"MODEL_ARGS = {args_literal}"]
    lines.append("LOG_EVERY = 10")
    setup_config, setup_device = ("ONE_PROCESS", "device") if group else ("CONFIG", "args.device")
    if model_path is None:
        lines += [
            "",
            "",
            "# --- FILL IN: your model, dataset and loss " + "-" * 50,
            "def build_model() -> nn.Module:",
            '    raise NotImplementedError("FILL IN: return your model (on CPU, in fp32)")',
            "",
            "",
            "def build_dataset() -> torch.utils.data.Dataset:",
            '    raise NotImplementedError("FILL IN: return your map-style Dataset")',
            "",
            "",
            "def loss_fn(model: nn.Module, batch) -> torch.Tensor:",
            '    raise NotImplementedError("FILL IN: return the scalar loss of one batch")',
            "# --- end of FILL IN " + "-" * 73,
        ]
        setup = [*_comment(SETUP_BENCHMARK, "    "),
                 "    # add collate_fn=... if your dataset needs one",
                 f"    setup = setup_training(build_model(), build_dataset(), {setup_config}, "
                 f"{setup_device}, loss_fn=loss_fn)"]
    else:
        setup = [*_comment(SETUP_BENCHMARK, "    "),
                 "    workload = load_workload(MODEL_PATH, MODEL_ARGS)",
                 f"    setup = setup_from_workload(workload, {setup_config}, "
                 f"{'device' if group else 'torch.device(args.device)'})"]
    if group:
        lines += _torch_group_main(config, model_path, device, setup)
    else:
        lines += [
            *_main_with_arguments(device, "cpu, cuda or cuda:N"),
            *setup,
            "    batches = setup.batches()",
            "    for step in range(1, args.steps + 1):",
            "        result = setup.step(batches)",
            "        if step % LOG_EVERY == 0 or step == args.steps:  # float() waits for the "
            "device",
            '            print(f"step {step}: loss {float(result.loss):.4f}", flush=True)',
        ]
    lines += ["", "", 'if __name__ == "__main__":', "    main()"]
    return "\n".join(lines) + "\n"


GROUP_WRAPPERS = {"ddp": "DistributedDataParallel", "fsdp": "FSDP2's fully_shard"}
# What the torch script says of cudnn.benchmark, which its setup_training turns on itself.
SETUP_BENCHMARK = ("setup_training applies the knobs, and on CUDA sets "
                   "torch.backends.cudnn.benchmark = True for a model with convolutions, as "
                   "autotune's trials did")


def _torch_group_preamble(config: TrainConfig, model_path: str | Path | None,
                          nproc_per_node: int) -> list[str]:
    """The docstring and imports of the script one rank of a process group runs."""
    fsdp = config.parallelism == "fsdp"
    lines = [
        '"""Train with the configuration autotune measured, in a plain PyTorch loop on each rank '
        "of a",
        f"process group ({GROUP_WRAPPERS[config.parallelism]}).",
        "",
        f"Run: torchrun --standalone --nproc-per-node {nproc_per_node} this_file.py "
        "[--steps 100] [--device cpu|cuda]",
        '"""',
        "import argparse",
        *(["import contextlib"] if config.grad_accum_steps > 1 else []),
        "import itertools",
        "import os",
        "",
        "import torch",
        "import torch.distributed as dist",
    ]
    if model_path is None:
        lines.append("from torch import nn")
    if fsdp:
        policy = "MixedPrecisionPolicy, " if config.precision == "bf16" else ""
        lines.append(f"from torch.distributed.fsdp import {policy}fully_shard")
    else:
        lines.append("from torch.nn.parallel import DistributedDataParallel")
    setup = "setup_training" if model_path is None else "load_workload, setup_from_workload"
    return [
        *lines,
        "from torch.utils.data import DataLoader, DistributedSampler",
        "",
        f"from autotune import TrainConfig, {setup}",
        *(["from autotune.trial.distributed import callable_blocks"] if fsdp else []),
        *(["from autotune.trial.float8 import convert_to_float8"]
          if config.precision in FP8_PRECISIONS else []),
        "from autotune.trial.optimizers import make_optimizer",
        *(["from autotune.trial.training import repeated_blocks"] if fsdp else []),
    ]


def _torch_group_main(config: TrainConfig, model_path: str | Path | None, device: str,
                      setup: list[str]) -> list[str]:
    """The helpers and main() of one rank: join the group, wrap the model, shard the data, and
    accumulate without syncing gradients on non-final micro-steps."""
    fsdp = config.parallelism == "fsdp"
    accum = config.grad_accum_steps
    graphs = config.compile_mode in CUDA_GRAPH_MODES
    lines = [
        "",
        "",
        "def sharded(loader: DataLoader) -> DataLoader:",
        '    """setup_training\'s loader, each rank reading its own share of every epoch."""',
        "    sampler = DistributedSampler(loader.dataset, shuffle=True, drop_last=True)",
        "    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler,",
        "                      drop_last=True, collate_fn=loader.collate_fn,",
        "                      num_workers=loader.num_workers, pin_memory=loader.pin_memory,",
        "                      prefetch_factor=loader.prefetch_factor,",
        "                      persistent_workers=loader.persistent_workers)",
        "",
        "",
        "def epochs(loader: DataLoader):",
        '    """Micro-batches forever, the sampler told each new epoch so that it reshuffles."""',
        "    for epoch in itertools.count():",
        "        loader.sampler.set_epoch(epoch)",
        "        yield from loader",
    ]
    if accum > 1:
        lines += [
            "",
            "",
            "def gradient_sync(model, last: bool) -> contextlib.AbstractContextManager:",
            '    """Around a micro-step\'s forward and backward: gradients reduced across the '
            'ranks on',
            '    the last micro-step of an optimizer step only."""',
        ]
        if fsdp:
            lines += ["    model.set_requires_gradient_sync(last)",
                      "    return contextlib.nullcontext()"]
        else:
            lines.append("    return contextlib.nullcontext() if last else model.no_sync()")
    lines += [
        *_main_with_arguments(device, "cpu or cuda (each rank takes the GPU of its LOCAL_RANK)"),
        "    device = torch.device(args.device)",
        '    if device.type == "cuda":',
        '        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))',
        "        torch.cuda.set_device(device)",
        "    # the group's address, this rank and the world size come from torchrun's environment",
        '    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")',
    ]
    if fsdp:
        lines.append("    torch.manual_seed(0)  # the same weights on every rank, which each "
                     "shards")
    lines += setup
    if config.precision in FP8_PRECISIONS:
        lines.append("    convert_to_float8(setup.model, CONFIG.precision)  # before wrapping")
    if fsdp:
        policy = ", mp_policy=policy" if config.precision == "bf16" else ""
        if config.precision == "bf16":
            lines.append(f"    policy = {_mixed_precision_policy(config)}")
        blocks = "repeated_blocks" if model_path is None else \
            '(workload.hook("checkpoint_modules") or repeated_blocks)'
        reshard = f"reshard_after_forward={config.fsdp_reshard_after_forward}"
        lines += [
            "    # fully_shard on each repeated block, then on the whole model",
            f"    for block in callable_blocks({blocks}(setup.model)):",
            f"        fully_shard(block, {reshard}{policy})",
            f"    model = fully_shard(setup.model, {reshard}{policy})",
            "    # the optimizer after wrapping: fully_shard replaced the parameters with shards",
        ]
    else:
        lines += [
            "    model = DistributedDataParallel(",
            '        setup.model, device_ids=[device.index] if device.type == "cuda" else None,',
            f"        bucket_cap_mb={config.ddp_bucket_cap_mb}, "
            f"static_graph={config.ddp_static_graph},",
            f"        gradient_as_bucket_view={config.ddp_gradient_as_bucket_view})",
            "    # the optimizer after wrapping, as for fully_shard, which replaces the parameters",
        ]
    hook = "" if model_path is None else ', workload.hook("build_optimizer")'
    lines.append(f"    optimizer = make_optimizer(model, CONFIG{hook})")
    trained = "model"
    call = _compile_call("model", config)
    if call is not None:
        trained = "compiled"
        lines.append(f"    compiled = {call}")
    if graphs:
        lines.append('    graphs = device.type == "cuda"  # the compiled model replays CUDA graphs')
    lines += [
        "    batches = epochs(sharded(setup.loader))",
        "    accum = CONFIG.grad_accum_steps",
        "    for step in range(1, args.steps + 1):",
    ]
    if graphs and accum > 1:
        lines += _comment(CUDA_GRAPH_ACCUMULATION, "        ") + [
            "        for p in model.parameters():",
            "            if graphs and p.requires_grad and p.grad is None:",
            "                p.grad = torch.zeros_like(p)"]
    lines += [
        "        total = torch.zeros((), device=device)",
        "        for micro in range(1, accum + 1):",
        "            batch = setup.to_device(next(batches), device)",
    ]
    if graphs:
        lines += ["            if graphs:",
                  "                torch.compiler.cudagraph_mark_step_begin()"]
    body = "            "
    if accum > 1:
        lines.append("            with gradient_sync(model, last=micro == accum):")
        body += "    "
    backward = "setup.scaler.scale(loss).backward()" if config.precision == "fp16" \
        else "loss.backward()"
    lines += [
        f"{body}with setup.autocast():",
        f"{body}    loss = setup.loss_fn({trained}, batch) / accum",
        f"{body}{backward}",
        "            total += loss.detach().float()",
    ]
    if config.precision == "fp16":
        lines += ["        setup.scaler.step(optimizer)", "        setup.scaler.update()"]
    else:
        lines.append("        optimizer.step()")
    keep = "set_to_none=not graphs" if graphs and accum > 1 else ""
    return [
        *lines,
        f"        optimizer.zero_grad({keep})",
        "        if step % LOG_EVERY == 0 or step == args.steps:",
        "            dist.all_reduce(total)  # summed over the ranks; float() waits for the device",
        "            if dist.get_rank() == 0:",
        '                print(f"step {step}: loss {float(total) / dist.get_world_size():.4f}",',
        "                      flush=True)",
        "    dist.destroy_process_group()",
    ]


def _main_with_arguments(device: str, device_help: str) -> list[str]:
    """The script's `main()` up to its parsed arguments: --steps and --device."""
    return ["", "", "def main() -> None:",
            "    parser = argparse.ArgumentParser(description=__doc__)",
            '    parser.add_argument("--steps", type=int, default=100, help="optimizer steps")',
            f"    parser.add_argument(\"--device\", default={_py(device)},",
            f"                        help={_py(device_help)})",
            "    args = parser.parse_args()"]


def _py(value: Any) -> str:
    """A Python literal for `value`, in double quotes where a string allows it."""
    if isinstance(value, str) and value.isascii() and value.isprintable():
        return json.dumps(value)  # escapes only quotes and backslashes, as Python reads them
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in value.items()) + "}"
    return repr(value)
