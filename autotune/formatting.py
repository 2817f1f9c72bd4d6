"""Human units for figures and configurations: one spelling everywhere they are shown."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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


def format_rate(value: float | None, spread: float | None = None) -> str:
    """Samples/sec, with its ± where it has one."""
    if value is None:
        return "n/a"
    return f"{value:,.1f} ± {spread:,.1f}" if spread is not None else f"{value:,.1f}"


def format_disturbance(other_cpu_share: float | None) -> str:
    """Why a timed window was disturbed, in a few words."""
    if other_cpu_share is None:
        return "disturbed (other processes on the device)"
    return f"disturbed (other processes used {other_cpu_share:.0%} of the CPUs)"


def short_config(config: Mapping[str, Any]) -> str:
    """The knobs that differ from PyTorch's defaults, compactly."""
    parts = [f"mb={config['micro_batch_size']}x{config['grad_accum_steps']}", config["precision"]]
    if config["activation_checkpointing"] != "none":
        parts.append(f"ckpt={config['activation_checkpointing']}")
    parts.append(config["optimizer_impl"])
    if config["num_workers"]:
        parts.append(f"workers={config['num_workers']}/pf={config['prefetch_factor']}"
                     + ("/persist" if config["persistent_workers"] else ""))
    if config["pin_memory"]:
        parts.append("pin")
    if config["compile_mode"] != "none":
        parts.append(f"compile={config['compile_mode']}")
    return " ".join(str(p) for p in parts)
