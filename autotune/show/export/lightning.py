"""The Lightning export: the `Trainer` (precision, gradient accumulation, the process group), and
the functions a LightningModule calls for what Trainer has no argument for: the DataLoader, the
optimizer, activation checkpointing, float8, FSDP2's sharding and torch.compile."""

from __future__ import annotations

from collections.abc import Sequence

from autotune.config import FP8_PRECISIONS, TrainConfig
from autotune.errors import ConfigError
from autotune.show.export.common import (
    CUDA_GRAPH_ACCUMULATION,
    CUDNN_BENCHMARK,
    OPTIMIZER_CLASSES,
    accumulates_under_cuda_graphs,
    attention_by_hand,
    autotune_import,
    code,
    comment,
    header,
    mixed_precision_policy,
    py,
    returned,
    script,
    update_rule,
)

# float8 runs its large linear layers in float8 and the rest under bf16 autocast.
LIGHTNING_PRECISION = {"fp32": "32-true", "tf32": "32-true", "bf16": "bf16-mixed",
                       "fp16": "16-mixed", **dict.fromkeys(FP8_PRECISIONS, "bf16-mixed")}

# Lightning skips the gradient sync of non-final micro-steps for DDP only; FSDP2 under gradient
# accumulation gets a strategy that does it too.
FSDP2_STRATEGY = '''
class FSDP2Strategy(pl.strategies.ModelParallelStrategy):
    """Skips the gradient sync of non-final micro-steps, as measured (Lightning does that
    for DDP only)."""

    @contextlib.contextmanager
    def block_backward_sync(self):
        sharded = [m for m in self.model.modules() if isinstance(m, FSDPModule)]
        for module in sharded:
            module.set_requires_gradient_sync(False, recurse=False)
        try:
            yield
        finally:
            for module in sharded:
                module.set_requires_gradient_sync(True, recurse=False)
'''

# The head of `tuned_sharding`: its signature and docstring.
TUNED_SHARDING = '''
def tuned_sharding(module, mesh, blocks=None):
    """FSDP2 as measured: fully_shard on each of `blocks` (those of the largest nn.ModuleList
    unless given) and then on the whole module, then torch.compile."""
'''


def lightning_script(config: TrainConfig, nproc_per_node: int, convolutional: bool,
                     checks: Sequence[str] = ()) -> str:
    """`trainer`, then `tuned_dataloader`, `tuned_optimizer`, `tuned_module` and, under FSDP2,
    `tuned_sharding`: the script's sections in the order a reader meets them."""
    fsdp = config.parallelism == "fsdp"
    if fsdp and config.precision == "fp16":
        raise ConfigError("Lightning has no FSDP2 with fp16 mixed precision: its FSDP2 strategy "
                          "(ModelParallelStrategy) refuses precision 16-mixed; export this "
                          "configuration as hf or torch")
    return script([
        *header(config, nproc_per_node, checks), "#",
        *_usage(config, nproc_per_node),
        *_imports(config),
        *_before_the_trainer(config),
        *_trainer(config, nproc_per_node, convolutional),
        "", "",
        *_dataloader(config),
        "", "",
        *_optimizer(config),
        "", "",
        *_module(config),
        *(["", "", *_sharding(config)] if fsdp else []),
    ])


def _syncs_by_hand(config: TrainConfig) -> bool:
    """Whether the script brings its own FSDP2 strategy (`FSDP2_STRATEGY`)."""
    return config.parallelism == "fsdp" and config.grad_accum_steps > 1


def _usage(config: TrainConfig, nproc_per_node: int) -> list[str]:
    """The header's account of what Trainer takes, what the functions apply, and how to use
    them (and to launch the ranks)."""
    fsdp = config.parallelism == "fsdp"
    group = config.parallelism != "none"
    takes = "the precision, the gradient accumulation and the process group" if group else \
        "the precision and the gradient accumulation"
    optimizer = "the optimizer implementation" if config.optimizer == "adamw" else \
        "the optimizer"
    applies = "activation checkpointing" + ", torchao's float8" * \
        (config.precision in FP8_PRECISIONS) + ", FSDP2's sharding" * fsdp
    lines = [
        *comment(f"Lightning's Trainer takes {takes}. It has no argument for the DataLoader "
                 f"settings, {optimizer}, {applies} or torch.compile: the functions below apply "
                 "those. Use them as"),
        "#     trainer.fit(tuned_module(model), train_dataloaders=tuned_dataloader(dataset))",
    ]
    if fsdp:
        lines += code('''
            # with `return tuned_optimizer(self.parameters())` in your configure_optimizers() and
            # `self.model = tuned_sharding(self.model, self.device_mesh["data_parallel"])`
            # in your configure_model().
            ''')
    else:
        lines.append("# with `return tuned_optimizer(self.parameters())` in your "
                     "configure_optimizers().")
    if group:
        lines += comment(f"Run it as python train.py (Lightning starts the {nproc_per_node} "
                         f"processes) or torchrun --nproc-per-node {nproc_per_node} train.py; "
                         "Lightning gives each rank its share of the data (a "
                         "DistributedSampler).")
    return lines


def _imports(config: TrainConfig) -> list[str]:
    """The script's imports, autotune's last: only the names it hands on."""
    fsdp = config.parallelism == "fsdp"
    lines = []
    if _syncs_by_hand(config):
        lines.append("import contextlib")
    if config.optimizer == "adamw_8bit":
        lines.append("import bitsandbytes")
    lines += code("""
        try:
            import lightning.pytorch as pl
        except ImportError:
            import pytorch_lightning as pl
        import torch
        """)
    if fsdp:
        names = ["FSDPModule"] if _syncs_by_hand(config) else []
        if config.precision == "bf16":
            names.append("MixedPrecisionPolicy")
        lines.append(f"from torch.distributed.fsdp import {', '.join([*names, 'fully_shard'])}")
    lines.append("from torch.utils.data import DataLoader")
    autotune = []
    if config.activation_checkpointing != "none":
        autotune.append("apply_activation_checkpointing")
    if config.precision in FP8_PRECISIONS:
        autotune.append("convert_to_float8")
    if fsdp:
        autotune += ["callable_blocks", "repeated_blocks"]
    return [*lines, "", *autotune_import(autotune)] if autotune else lines


def _before_the_trainer(config: TrainConfig) -> list[str]:
    """TF32 matmuls, set for the process; under FSDP2, why its strategy is
    ModelParallelStrategy (and the one that syncs by hand)."""
    lines = []
    if config.precision == "tf32":
        lines += ["", "# tf32: fp32 weights and activations, TF32 tensor cores in matmuls",
                  'torch.set_float32_matmul_precision("high")']
    if config.parallelism == "fsdp":
        lines += ["", *comment(
            "FSDP2 (fully_shard), as autotune measured it, is Lightning's ModelParallelStrategy "
            "with the sharding done in configure_model (tuned_sharding below): its "
            "FSDPStrategy would wrap the model in FSDP1's FullyShardedDataParallel instead")]
    if _syncs_by_hand(config):
        lines += ["", "", *code(FSDP2_STRATEGY), ""]
    return lines


def _trainer(config: TrainConfig, nproc_per_node: int, convolutional: bool) -> list[str]:
    lines = ["", *code(f"""
        trainer = pl.Trainer(
            precision={py(LIGHTNING_PRECISION[config.precision])},
            accumulate_grad_batches={config.grad_accum_steps},
        """)]
    if convolutional:
        lines += [*comment(CUDNN_BENCHMARK, "    "), "    benchmark=True,"]
    if config.parallelism != "none":
        lines += [f"    devices={nproc_per_node},", "    num_nodes=1,"]
    if config.parallelism == "ddp":
        lines += ["    strategy=pl.strategies.DDPStrategy("
                  f"bucket_cap_mb={config.ddp_bucket_cap_mb}, "
                  f"static_graph={config.ddp_static_graph},",
                  "                                       gradient_as_bucket_view="
                  f"{config.ddp_gradient_as_bucket_view}),"]
    elif config.parallelism == "fsdp":
        strategy = "FSDP2Strategy" if _syncs_by_hand(config) else \
            "pl.strategies.ModelParallelStrategy"
        lines.append(f"    strategy={strategy}(data_parallel_size={nproc_per_node}, "
                     "tensor_parallel_size=1),")
    return [*lines, ")"]


def _dataloader(config: TrainConfig) -> list[str]:
    return code(f'''
        def tuned_dataloader(dataset, collate_fn=None):
            """The measured DataLoader settings (full batches only: one shape for compile)."""
            return DataLoader(
                dataset,
                batch_size={config.micro_batch_size},
                shuffle=True,
                drop_last=True,
                collate_fn=collate_fn,
                num_workers={config.num_workers},
                prefetch_factor={config.prefetch_factor},
                pin_memory={config.pin_memory},
                persistent_workers={config.persistent_workers},
            )
        ''')


def _optimizer(config: TrainConfig) -> list[str]:
    """`tuned_optimizer`: AdamW with the measured implementation, or the optimizer that
    replaced it."""
    if config.optimizer == "adamw":
        flags = (f"foreach={config.optimizer_impl == 'foreach'}, "
                 f"fused={config.optimizer_impl == 'fused'}")
        return code(f'''
            def tuned_optimizer(parameters):
                """Keep your own optimizer and learning rate: what was tuned is foreach=/fused=."""
                return torch.optim.AdamW(parameters, lr=3e-4, weight_decay=0.01,
                                         {flags})
            ''')
    return [
        "def tuned_optimizer(parameters):",
        '    """The optimizer measured: give it your own learning rate and weight decay."""',
        *comment(update_rule(config), "    "),
        f"    return {OPTIMIZER_CLASSES[config.optimizer]}(parameters, lr=3e-4, "
        "weight_decay=0.01)"]


def _module(config: TrainConfig) -> list[str]:
    """`tuned_module`: what is applied to the model itself, then torch.compile (which, under
    FSDP2, follows the sharding in `tuned_sharding`)."""
    fsdp = config.parallelism == "fsdp"
    lines = ["def tuned_module(module):",
             '    """Activation checkpointing, as measured (torch.compile follows the sharding)."""'
             if fsdp else '    """Activation checkpointing and torch.compile, as measured."""']
    if config.memory_format == "channels_last":
        lines += [*comment("channels_last, as measured: the weights here; convert the input "
                           "images too, in your LightningModule's on_after_batch_transfer: "
                           "x.contiguous(memory_format=torch.channels_last)", "    "),
                  "    module = module.to(memory_format=torch.channels_last)"]
    if config.attention_backend != "auto":
        lines += comment(attention_by_hand(config, "around trainer.fit(...)"), "    ")
    if config.activation_checkpointing != "none":
        which = "every" if config.activation_checkpointing == "full" else "every other"
        lines += [
            *comment(f"{config.activation_checkpointing}: {which} block of the largest "
                     "nn.ModuleList recomputes its activations in backward, through "
                     "torch.utils.checkpoint.checkpoint(..., use_reentrant=False). If your "
                     "blocks are elsewhere, add checkpoint_modules=lambda m: [your blocks]",
                     "    "),
            f"    apply_activation_checkpointing(module, {py(config.activation_checkpointing)})"]
    if config.precision in FP8_PRECISIONS:
        lines += [*comment(f"{config.precision}: torchao's float8 training of the nn.Linear "
                           "layers with both sides >= 1024 features and divisible by 16 "
                           "(convert_to_float8_training, Float8LinearConfig.from_recipe_name("
                           f"{py(config.precision.removeprefix('fp8_'))})), before "
                           "torch.compile, which it needs", "    "),
                  f"    convert_to_float8(module, {py(config.precision)})"]
    if accumulates_under_cuda_graphs(config):
        lines += comment(CUDA_GRAPH_ACCUMULATION + ": allocate them in on_train_start and "
                         "override optimizer_zero_grad in your LightningModule", "    ")
    return [*lines, "    return module" if fsdp else returned("module", config)]


def _sharding(config: TrainConfig) -> list[str]:
    """`tuned_sharding`: FSDP2 on the blocks and the root as measured, then torch.compile."""
    policy = ", mp_policy=policy" if config.precision == "bf16" else ""
    reshard = f"reshard_after_forward={config.fsdp_reshard_after_forward}"
    lines = code(TUNED_SHARDING)
    if config.precision == "bf16":
        lines.append(f"    policy = {mixed_precision_policy(config)}")
    return [
        *lines,
        *code(f"""
            for block in callable_blocks(repeated_blocks(module) if blocks is None else blocks):
                fully_shard(block, mesh=mesh, {reshard}{policy})
            fully_shard(module, mesh=mesh, {reshard}{policy})
            """, "    "),
        returned("module", config),
    ]
