"""The Hugging Face export: keyword arguments for `transformers.TrainingArguments`, with a
comment wherever TrainingArguments cannot say exactly what was measured."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autotune.config import FP8_PRECISIONS, TrainConfig
from autotune.show.export.common import (
    CUDA_GRAPH_ACCUMULATION,
    CUDNN_BENCHMARK,
    accumulates_under_cuda_graphs,
    attention_by_hand,
    comment,
    header,
    py,
    script,
    update_rule,
)

# TrainingArguments' optim for the optimizers that replace AdamW.
HF_OPTIMS = {"adafactor": "adafactor", "adamw_8bit": "adamw_bnb_8bit"}

# What the HF export says of channels_last, which TrainingArguments has no switch for.
CHANNELS_LAST_BY_HAND = (
    "memory_format=channels_last was measured, which TrainingArguments has no switch for: "
    "before Trainer(...), model = model.to(memory_format=torch.channels_last), and have your "
    "data collator return the images as x.contiguous(memory_format=torch.channels_last)")


def hf_script(config: TrainConfig, nproc_per_node: int, convolutional: bool,
              checks: Sequence[str] = ()) -> str:
    """`training_args`, a dict for TrainingArguments, each argument TrainingArguments cannot
    match exactly with a comment above it; what it has no argument for, said in the header."""
    notes = _notes(config)
    lines = [*header(config, nproc_per_node, checks), "#",
             "# Keyword arguments for transformers.TrainingArguments. Use them as:",
             "#     from transformers import TrainingArguments",
             '#     args = TrainingArguments(output_dir="out", **training_args)']
    if config.parallelism != "none":
        lines += ["# in your training script, and launch it on every rank:",
                  f"#     torchrun --nproc-per-node {nproc_per_node} train.py"]
    if config.precision in FP8_PRECISIONS:
        lines += comment(_float8_by_hand(config))
    if config.memory_format == "channels_last":
        lines += comment(CHANNELS_LAST_BY_HAND)
    if config.attention_backend != "auto":
        lines += comment(attention_by_hand(config, "around trainer.train()"))
    if convolutional:
        lines += comment(f"{CUDNN_BENCHMARK}. TrainingArguments has no switch for it: set "
                         "torch.backends.cudnn.benchmark = True before trainer.train()")
    lines.append("training_args = dict(")
    for key, value in hf_training_arguments(config).items():
        if key in notes:
            lines += comment(notes[key], "    ")
        lines.append(f"    {key}={py(value)},")
    lines.append(")")
    return script(lines)


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


def _float8_by_hand(config: TrainConfig) -> str:
    """How to convert the model to the float8 training measured, which TrainingArguments has
    no switch for."""
    recipe = config.precision.removeprefix("fp8_")
    return (f"precision={config.precision} was measured: torchao's float8 training ({recipe} "
            "scales) of the large linear layers, the rest under bf16 autocast, compiled. "
            "TrainingArguments has no switch for it (accelerate's fp8 with the torchao backend "
            "converts every linear layer divisible by 16 but the first and last): before "
            "Trainer(...), convert the model with autotune.convert_to_float8(model, "
            f"{py(config.precision)}), which is torchao's convert_to_float8_training(model, "
            f"config=Float8LinearConfig.from_recipe_name({py(recipe)})) on the nn.Linear "
            "layers with both sides >= 1024 features and divisible by 16")


def _notes(config: TrainConfig) -> dict[str, str]:
    """Where TrainingArguments cannot say exactly what was measured, or would change it: a
    comment for the argument it is keyed by."""
    notes = _precision_notes(config)
    if config.activation_checkpointing == "selective" and config.parallelism != "fsdp":
        notes["gradient_checkpointing"] = (
            'autotune measured "selective" (every other block); TrainingArguments has no such '
            'mode and checkpoints every layer, which is "full". Newer transformers take '
            'activation_checkpointing=True, activation_checkpointing_kwargs={"every_n_layers": '
            '2} for every other layer')
    optim = _optim_note(config)
    if optim:
        notes["optim"] = optim
    if config.compile_mode == "default":
        notes["torch_compile_mode"] = "None: torch.compile's default mode"
    if accumulates_under_cuda_graphs(config):
        notes["torch_compile_mode"] = CUDA_GRAPH_ACCUMULATION
    return {**notes, **_process_group_notes(config)}


def _precision_notes(config: TrainConfig) -> dict[str, str]:
    """Where TrainingArguments' TF32 switch differs from what was measured."""
    if config.precision == "tf32":
        return {"tf32": "TF32 tensor cores for fp32 matmuls: TrainingArguments raises without "
                        "an Ampere or newer GPU"}
    if config.compile_mode == "none":
        return {}
    if config.precision == "fp32":
        return {"tf32": "IEEE fp32 matmuls, as measured (with torch_compile, TrainingArguments "
                        "would otherwise turn TF32 on); on torch 2.9 and later it also makes "
                        "cuDNN convolutions IEEE fp32, where PyTorch (and the measurement) "
                        "runs them in TF32"}
    if _bf16_autocast(config):
        return {"bf16": "with torch_compile, TrainingArguments also turns on TF32 for the "
                        "matmuls left in fp32, which autotune did not measure"}
    return {}


def _optim_note(config: TrainConfig) -> str | None:
    """What TrainingArguments' optim is, where it is not exactly the optimizer measured."""
    if config.optimizer == "adafactor":
        return (f"{update_rule(config)}. TrainingArguments' \"adafactor\" is transformers' own "
                "Adafactor (transformers.optimization.Adafactor), not torch.optim.Adafactor: for "
                "the one measured, pass Trainer(..., optimizer_cls_and_kwargs=(torch.optim."
                'Adafactor, {"lr": args.learning_rate}))')
    if config.optimizer == "adamw_8bit":
        return (f"{update_rule(config)}. \"adamw_bnb_8bit\" is bitsandbytes' AdamW with 8-bit "
                "state (optim_bits=8), the AdamW8bit measured")
    if config.optimizer_impl != "fused":
        return (f"autotune measured the {config.optimizer_impl} AdamW; TrainingArguments has no "
                'foreach/for_loop switch: "adamw_torch" is torch.optim.AdamW with PyTorch\'s '
                "default implementation, which is foreach on CUDA")
    return None


def _process_group_notes(config: TrainConfig) -> dict[str, str]:
    """What Trainer does otherwise under DDP and FSDP2."""
    notes = {}
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
        notes["fsdp_config"] = ". ".join(_fsdp_notes(config))
    return notes


def _fsdp_notes(config: TrainConfig) -> list[str]:
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
