"""Human units for figures and configurations: one spelling everywhere they are shown."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autotune.config import TrainConfig


def format_bytes(value: float | None) -> str:
    if value is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_seconds(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value < 1:
        return f"{value * 1000:.2f} ms"
    if value < 120:
        return f"{value:.2f} s"
    return f"{value / 60:.1f} min"


def format_percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"


def format_flops(value: float) -> str:
    """FLOPs in thousands (3 significant digits): 4.21 GFLOP; a rate adds its own "/s"."""
    for unit in ("FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP"):
        if abs(value) < 1000 or unit == "TFLOP":
            return f"{value:,.3g} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def mfu_basis(flops_per_sample: float | None, flops_source: str | None,
              peak_flops: float | None, peak_source: str | None) -> str:
    """What a CUDA run's MFU divided by what, each saying where it came from, so a reader can
    check the figure; or, where there is none, which of the two was missing."""
    if flops_per_sample is None:
        return f"no FLOPs a sample ({flops_source})" if flops_source else (
            "no FLOPs a sample: neither given (a model file's flops_per_sample) nor counted (a "
            "model file's model, or a step of a training script's loop, under a FLOP counter)")
    if peak_flops is None:
        return "no peak FLOP/s for this GPU: not in the data-sheet table, nor measurable"
    return (f"{format_flops(flops_per_sample)} a sample ({flops_source}) x samples/sec over "
            f"{format_flops(peak_flops)}/s, {peak_source}")


def mfu_figure(mfu: float | None, device: str | None,
               basis: str | None = None) -> tuple[str, str]:
    """MFU as every reader sees it, (value, how): on CUDA the figure and its basis; elsewhere
    why there is none, since a CPU has no peak FLOP/s autotune could divide by."""
    kind = (device or "").split(":")[0]
    if kind == "cuda":
        return format_percent(mfu), basis or "model FLOPs a sample x samples/sec over the peak"
    if not kind:
        return format_percent(mfu), "model FLOPs over the precision's peak (CUDA only)"
    return f"n/a on {kind.upper()}", "no peak FLOP/s to divide by: MFU needs CUDA"


def format_rate(value: float | None, spread: float | None = None) -> str:
    """Samples/sec, with its ± where it has one."""
    if value is None:
        return "n/a"
    return f"{value:,.1f} ± {spread:,.1f}" if spread is not None else f"{value:,.1f}"


def format_disturbance(other_cpu_share: float | None, steady: bool = False) -> str:
    """Why a timed window was disturbed, in a few words (a load in every window the trial
    timed is the machine's steady state, said so)."""
    if other_cpu_share is None:
        return "disturbed (other processes on the device)"
    load = "a steady load: " if steady else ""
    return f"disturbed ({load}other processes used {other_cpu_share:.0%} of the CPUs)"


def short_config(config: TrainConfig) -> str:
    """The knobs that differ from PyTorch's defaults, compactly."""
    c = config
    parts = [f"mb={c.micro_batch_size}x{c.grad_accum_steps}", c.precision]
    if c.activation_checkpointing != "none":
        parts.append(f"ckpt={c.activation_checkpointing}")
    parts.append(c.optimizer_impl if c.optimizer == "adamw" else c.optimizer)
    if c.num_workers:
        parts.append(f"workers={c.num_workers}/pf={c.prefetch_factor}"
                     + ("/persist" if c.persistent_workers else ""))
    if c.pin_memory:
        parts.append("pin")
    if c.compile_mode != "none":
        parts.append(f"compile={c.compile_mode}")
    if c.memory_format != "contiguous":
        parts.append(c.memory_format)
    if c.attention_backend != "auto":
        parts.append(f"attn={c.attention_backend}")
    if c.parallelism != "none":
        values = c.to_dict()
        parts += [_knob_words(k, values[k], c) for k, default in _GROUP_DEFAULTS.items()
                  if values[k] != default and (k == "parallelism" or k.startswith(c.parallelism))]
    return " ".join(str(p) for p in parts)


def describe_changes(config: TrainConfig, baseline: TrainConfig) -> str:
    """What `config` changes from the baseline, in words: `bf16 + fused AdamW`. The batch and
    the loader are one phrase each (micro-batch with its accumulation, workers with prefetch)."""
    values, base = config.to_dict(), baseline.to_dict()
    words = []
    for knob, value in values.items():
        if knob in _PARTNERS.values() or (knob == "optimizer_impl" and config.optimizer != "adamw"):
            continue
        partner = _PARTNERS.get(knob)
        if base[knob] == value and (partner is None or base[partner] == values[partner]):
            continue
        words.append(_knob_words(knob, value, config))
    return " + ".join(words) or "your settings"


# Knobs said together with another: the second means nothing without the first.
_PARTNERS = {"micro_batch_size": "grad_accum_steps", "num_workers": "prefetch_factor"}


def _knob_words(knob: str, value: Any, config: TrainConfig) -> str:
    if knob == "micro_batch_size":
        return f"micro-batch {value} x {config.grad_accum_steps}"
    if knob == "optimizer":
        return _OPTIMIZER_WORDS[value]
    if knob == "precision" and value.startswith("fp8_"):
        return f"float8 ({value.removeprefix('fp8_')} scales)"
    if knob == "optimizer_impl":
        return {"for_loop": "for-loop", "foreach": "foreach", "fused": "fused"}[value] + " AdamW"
    if knob == "activation_checkpointing":
        return "no checkpointing" if value == "none" else f"{value} checkpointing"
    if knob == "compile_mode":
        return "no compile" if value == "none" else \
            "torch.compile" + ("" if value == "default" else f" {value}")
    if knob == "num_workers":
        return "in-process loading" if value == 0 else \
            f"{value} loader worker{'s' if value != 1 else ''}" + \
            (f", prefetch {config.prefetch_factor}" if config.prefetch_factor else "")
    if knob in ("pin_memory", "persistent_workers"):
        return ("" if value else "no ") + knob.replace("_", " ")
    if knob == "attention_backend":
        return "PyTorch's choice of attention kernel" if value == "auto" else \
            f"{value} attention"
    if knob == "memory_format":
        return "channels-last tensors" if value == "channels_last" else "contiguous tensors"
    if knob in _GROUP_KNOBS:
        return _GROUP_KNOBS[knob](value)
    return str(value)


# The optimizers in words; a change of update rule says so.
_OPTIMIZER_WORDS = {"adamw": "AdamW", "adafactor": "Adafactor (another update rule)",
                    "adamw_8bit": "8-bit AdamW (another update rule)"}
# A process group's knobs at PyTorch's defaults, which a short description leaves out.
_GROUP_DEFAULTS = {"parallelism": "none", "ddp_bucket_cap_mb": 25, "ddp_static_graph": False,
                   "ddp_gradient_as_bucket_view": False, "fsdp_reshard_after_forward": True,
                   "fsdp_reduce_dtype": "fp32"}
# A process group's knobs in words.
_GROUP_KNOBS: dict[str, Callable[[Any], str]] = {
    "parallelism": lambda v: {"none": "one process", "ddp": "DDP", "fsdp": "FSDP"}[v],
    "ddp_bucket_cap_mb": lambda v: f"{v} MB buckets",
    "ddp_static_graph": lambda v: "static graph" if v else "dynamic graph",
    "ddp_gradient_as_bucket_view": lambda v: ("" if v else "no ") + "gradients as bucket views",
    "fsdp_reshard_after_forward": lambda v: ("" if v else "no ") + "resharding after forward",
    "fsdp_reduce_dtype": lambda v: f"{v} reduction",
}
