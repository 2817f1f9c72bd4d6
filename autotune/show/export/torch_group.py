"""The torch export under ddp or fsdp: what one rank of the process group runs. It joins the
group, sets up the model as one process would, wraps it (DDP or FSDP2's fully_shard) and then
compiles it, shards the data, and reduces the gradients on the last micro-step only."""

from __future__ import annotations

from pathlib import Path

from autotune.config import CUDA_GRAPH_MODES, FP8_PRECISIONS, TrainConfig
from autotune.show.export.common import (
    CUDA_GRAPH_ACCUMULATION,
    autotune_import,
    code,
    comment,
    compile_call,
    main_with_arguments,
    mixed_precision_policy,
)

GROUP_WRAPPERS = {"ddp": "DistributedDataParallel", "fsdp": "FSDP2's fully_shard"}

DOCSTRING = '''
"""Train with the configuration autotune measured, in a plain PyTorch loop on each rank of a
process group ({wrapper}).

Run: torchrun --standalone --nproc-per-node {nproc} this_file.py [--steps 100] [--device cpu|cuda]
"""
'''

# Each rank's share of the data, reshuffled every epoch.
SHARDED_DATA = '''
def sharded(loader: DataLoader) -> DataLoader:
    """setup_training's loader, each rank reading its own share of every epoch."""
    sampler = DistributedSampler(loader.dataset, shuffle=True, drop_last=True)
    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler,
                      drop_last=True, collate_fn=loader.collate_fn,
                      num_workers=loader.num_workers, pin_memory=loader.pin_memory,
                      prefetch_factor=loader.prefetch_factor,
                      persistent_workers=loader.persistent_workers)


def epochs(loader: DataLoader):
    """Micro-batches forever, the sampler told each new epoch so that it reshuffles."""
    for epoch in itertools.count():
        loader.sampler.set_epoch(epoch)
        yield from loader
'''

# The start of `main()` after its arguments: this rank's device, and the group joined.
JOIN_GROUP = '''
device = torch.device(args.device)
if device.type == "cuda":
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
# the group's address, this rank and the world size come from torchrun's environment
dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
'''

# The end of each optimizer step: the loss averaged over the ranks, now and then.
LOG_AND_LEAVE = '''
    if step % LOG_EVERY == 0 or step == args.steps:
        dist.all_reduce(total)  # summed over the ranks; float() waits for the device
        if dist.get_rank() == 0:
            print(f"step {step}: loss {float(total) / dist.get_world_size():.4f}",
                  flush=True)
dist.destroy_process_group()
if device.type == "cpu":
    # DDP and fully_shard keep gloo's worker threads alive past the group, and one still letting
    # go of a tensor as the interpreter exits aborts a finished run: leave without teardown
    os._exit(0)
'''


def group_preamble(config: TrainConfig, model_path: str | Path | None,
                   nproc_per_node: int) -> list[str]:
    """The docstring and imports of the script one rank runs."""
    fsdp = config.parallelism == "fsdp"
    lines = code(DOCSTRING.format(wrapper=GROUP_WRAPPERS[config.parallelism],
                                  nproc=nproc_per_node))
    lines.append("import argparse")
    if config.grad_accum_steps > 1:
        lines.append("import contextlib")
    lines += code("""
        import itertools
        import os

        import torch
        import torch.distributed as dist
        """)
    if model_path is None:
        lines.append("from torch import nn")
    if fsdp:
        policy = "MixedPrecisionPolicy, " if config.precision == "bf16" else ""
        lines.append(f"from torch.distributed.fsdp import {policy}fully_shard")
    else:
        lines.append("from torch.nn.parallel import DistributedDataParallel")
    autotune = ["TrainConfig", "make_optimizer", *(
        ["setup_training"] if model_path is None else ["load_workload", "setup_from_workload"])]
    if fsdp:
        autotune += ["callable_blocks", "repeated_blocks"]
    if config.precision in FP8_PRECISIONS:
        autotune.append("convert_to_float8")
    return [*lines, "from torch.utils.data import DataLoader, DistributedSampler", "",
            *autotune_import(autotune)]


def one_process_config(config: TrainConfig) -> list[str]:
    """`ONE_PROCESS`: the knobs setup_training applies, which are those of one process."""
    lines = [*comment("setup_training applies the knobs of one process: main() joins the group "
                      "and wraps the model, then compiles it, as DDP and fully_shard want it "
                      "compiled after wrapping"),
             *code('''
                 ONE_PROCESS = TrainConfig.from_dict({
                     knob: value for knob, value in CONFIG.to_dict().items()
                     if knob not in CONFIG.distributed() and knob != "compile_mode"})
                 ''')]
    if config.precision in FP8_PRECISIONS:
        lines += [*comment("setup_training takes float8 compiled only, and here compile follows "
                           "the wrapping: it gets bf16 (the autocast float8 runs the rest "
                           "under), and main() converts the large linear layers to float8 "
                           "before wrapping"),
                  'ONE_PROCESS = ONE_PROCESS.replace(precision="bf16")']
    return lines


def group_main(config: TrainConfig, model_path: str | Path | None, device: str,
               setup: list[str]) -> list[str]:
    """The helpers and `main()` of one rank: join the group, set up (`setup`'s lines), wrap,
    build the optimizer and compile, then train."""
    return [
        "", "", *code(SHARDED_DATA),
        *_gradient_sync(config),
        *main_with_arguments(device, "cpu or cuda (each rank takes the GPU of its LOCAL_RANK)"),
        *code(JOIN_GROUP, "    "),
        *_same_weights(config),
        *setup,
        *_wrap(config, model_path),
        *_optimizer_and_compile(config, model_path),
        *_train_loop(config),
    ]


def _same_weights(config: TrainConfig) -> list[str]:
    """Under FSDP2 every rank builds the model and shards it: they must start alike."""
    if config.parallelism != "fsdp":
        return []
    return ["    torch.manual_seed(0)  # the same weights on every rank, which each shards"]


def _gradient_sync(config: TrainConfig) -> list[str]:
    """`gradient_sync`, under gradient accumulation: no reduction on the non-final
    micro-steps."""
    if config.grad_accum_steps == 1:
        return []
    lines = ["", "", *code('''
        def gradient_sync(model, last: bool) -> contextlib.AbstractContextManager:
            """Around a micro-step's forward and backward: gradients reduced across the ranks on
            the last micro-step of an optimizer step only."""
        ''')]
    if config.parallelism == "fsdp":
        return [*lines, "    model.set_requires_gradient_sync(last)",
                "    return contextlib.nullcontext()"]
    return [*lines, "    return contextlib.nullcontext() if last else model.no_sync()"]


def _wrap(config: TrainConfig, model_path: str | Path | None) -> list[str]:
    """float8 conversion, then DDP, or fully_shard on each repeated block and on the model."""
    lines = []
    if config.precision in FP8_PRECISIONS:
        lines.append("    convert_to_float8(setup.model, CONFIG.precision)  # before wrapping")
    if config.parallelism == "ddp":
        return [*lines, *code(f"""
            model = DistributedDataParallel(
                setup.model, device_ids=[device.index] if device.type == "cuda" else None,
                bucket_cap_mb={config.ddp_bucket_cap_mb}, static_graph={config.ddp_static_graph},
                gradient_as_bucket_view={config.ddp_gradient_as_bucket_view})
            # the optimizer after wrapping, as for fully_shard, which replaces the parameters
            """, "    ")]
    policy = ", mp_policy=policy" if config.precision == "bf16" else ""
    if config.precision == "bf16":
        lines.append(f"    policy = {mixed_precision_policy(config)}")
    blocks = "repeated_blocks" if model_path is None else \
        '(workload.hook("checkpoint_modules") or repeated_blocks)'
    reshard = f"reshard_after_forward={config.fsdp_reshard_after_forward}"
    return [*lines, *code(f"""
        # fully_shard on each repeated block, then on the whole model
        for block in callable_blocks({blocks}(setup.model)):
            fully_shard(block, {reshard}{policy})
        model = fully_shard(setup.model, {reshard}{policy})
        # the optimizer after wrapping: fully_shard replaced the parameters with shards
        """, "    ")]


def _optimizer_and_compile(config: TrainConfig, model_path: str | Path | None) -> list[str]:
    """The optimizer over the wrapped model's parameters, then the wrapped model compiled."""
    hook = "" if model_path is None else ', workload.hook("build_optimizer")'
    lines = [f"    optimizer = make_optimizer(model, CONFIG{hook})"]
    call = compile_call("model", config)
    if call is not None:
        lines.append(f"    compiled = {call}")
    if config.compile_mode in CUDA_GRAPH_MODES:
        lines.append('    graphs = device.type == "cuda"  # the compiled model replays CUDA graphs')
    return lines


def _train_loop(config: TrainConfig) -> list[str]:
    """The optimizer steps, each `grad_accum_steps` micro-steps; the loss logged now and then."""
    graphs = config.compile_mode in CUDA_GRAPH_MODES
    lines = code("""
        batches = epochs(sharded(setup.loader))
        accum = CONFIG.grad_accum_steps
        for step in range(1, args.steps + 1):
        """, "    ")
    if graphs and config.grad_accum_steps > 1:
        lines += [*comment(CUDA_GRAPH_ACCUMULATION, "        "), *code("""
            for p in model.parameters():
                if graphs and p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
            """, "        ")]
    lines += _micro_steps(config)
    if config.precision == "fp16":
        lines += ["        setup.scaler.step(optimizer)", "        setup.scaler.update()"]
    else:
        lines.append("        optimizer.step()")
    keep = "set_to_none=not graphs" if graphs and config.grad_accum_steps > 1 else ""
    return [*lines, f"        optimizer.zero_grad({keep})", *code(LOG_AND_LEAVE, "    ")]


def _micro_steps(config: TrainConfig) -> list[str]:
    """One optimizer step's forward and backward passes, the loss summed for the log."""
    lines = code("""
        total = torch.zeros((), device=device)
        for micro in range(1, accum + 1):
            batch = setup.to_device(next(batches), device)
        """, "        ")
    if config.compile_mode in CUDA_GRAPH_MODES:
        lines += code("""
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            """, "            ")
    body = "            "
    if config.grad_accum_steps > 1:
        lines.append("            with gradient_sync(model, last=micro == accum):")
        body += "    "
    trained = "model" if compile_call("model", config) is None else "compiled"
    backward = "setup.scaler.scale(loss).backward()" if config.precision == "fp16" \
        else "loss.backward()"
    return [*lines,
            f"{body}with setup.autocast():",
            f"{body}    loss = setup.loss_fn({trained}, batch) / accum",
            f"{body}{backward}",
            "            total += loss.detach().float()"]
