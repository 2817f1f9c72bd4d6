"""Which values of each knob a search offers on a device, before the user narrows them: the
values `hardware` says this device runs, of those worth a try for this model and study.

`device_domains` is what a search offers, the baseline's own values among them (every space
holds its baseline); `device_refusals` says why this device refuses the rest. The capability
probe, in the trial's process, is sent the values it tries (`probe_candidates`): it reads the
baseline itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autotune.config import CHOICES, DISTRIBUTED_KNOBS, TrainConfig
from autotune.hardware import DeviceInfo, value_reason

# The DataLoader prefetch factors a search tries besides the baseline's own.
PREFETCH_FACTORS = (2, 4)
# Gradient bucket sizes DDP is tried with: smaller buckets start reducing sooner in backward,
# larger ones send fewer messages (25 MiB is DDP's default).
DDP_BUCKET_CAPS_MB = (5, 25, 100)


def device_domains(baseline: TrainConfig, info: DeviceInfo, world_size: int = 1,
                   convolutional: bool = False, attention: bool = False,
                   optimizer_change: bool = False) -> dict[str, tuple]:
    """Every value of each knob (the batch sizes aside) that this device runs, the baseline's
    own among them: what a search offers before the user narrows it. The knobs of a process
    group are offered only to one of `world_size` > 1, memory formats only to a model with
    convolutions, attention kernels only to one that calls `scaled_dot_product_attention`,
    other optimizers only where the user allows a change of what the model learns
    (`optimizer_change`)."""
    return _runnable(_candidates(info, world_size, convolutional, attention, optimizer_change,
                                 baseline), info)


def device_refusals(baseline: TrainConfig, info: DeviceInfo, world_size: int = 1,
                    convolutional: bool = False, attention: bool = False,
                    optimizer_change: bool = False) -> dict[tuple[str, str], list[Any]]:
    """The values `device_domains` leaves out because this device (or this environment) cannot
    run them, by knob and reason: what a user is told was never tried, and why."""
    out: dict[tuple[str, str], list[Any]] = {}
    for knob, values in _candidates(info, world_size, convolutional, attention,
                                    optimizer_change, baseline).items():
        for value in values:
            reason = value_reason(knob, value, info)
            if reason is not None:
                out.setdefault((knob, reason), []).append(value)
    return out


def probe_candidates(info: DeviceInfo, optimizer_change: bool = False) -> dict[str, tuple]:
    """What the capability probe tries (`trial/probe`): `device_domains` of one process, but
    without a baseline's own values (the probe reads the baseline: it tries the values besides
    its own, and times its own DataLoader setting with the others) and with every memory
    format and attention kernel (it narrows them by what the model turns out to be). Other
    optimizers only under --allow-optimizer-change (`optimizer_change`), the one search that
    offers them: a step of each is time no other run would use. A study keeps one space, so a
    study probed without them is never searched with them."""
    return _runnable(_candidates(info, 1, convolutional=True, attention=True,
                                 optimizer_change=optimizer_change), info)


def _candidates(info: DeviceInfo, world_size: int, convolutional: bool, attention: bool,
                optimizer_change: bool, baseline: TrainConfig | None = None,
                ) -> dict[str, Sequence[Any]]:
    """Each knob's values worth asking the device about, for this model and study: with
    `baseline`, its own among them; without, the values besides any baseline's own."""
    def own(knob: str) -> list[Any]:
        return [getattr(baseline, knob)] if baseline is not None else []

    group = world_size > 1
    workers = baseline is not None and baseline.num_workers > 0
    candidates: dict[str, Sequence[Any]] = {
        **CHOICES,
        "pin_memory": (False, True),
        "persistent_workers": (False, True),
        "num_workers": sorted({0, *powers_of_two(info.cpu_count), *own("num_workers")}),
        # the baseline may leave prefetch_factor at None (the DataLoader's default) with workers
        "prefetch_factor": sorted(
            {*PREFETCH_FACTORS, *(own("prefetch_factor") if workers else [])},
            key=lambda v: (v is not None, v or 0)),
        "parallelism": ("ddp", "fsdp") if group else ("none",),
        "ddp_bucket_cap_mb": sorted({*DDP_BUCKET_CAPS_MB, *own("ddp_bucket_cap_mb")}),
        "ddp_static_graph": (False, True),
        "ddp_gradient_as_bucket_view": (False, True),
        "fsdp_reshard_after_forward": (True, False),
    }
    if not group:
        candidates.update({k: tuple(own(k)) for k in DISTRIBUTED_KNOBS})
    if not convolutional:
        candidates["memory_format"] = tuple(own("memory_format"))
    if not attention:
        candidates["attention_backend"] = tuple(own("attention_backend"))
    if not optimizer_change:
        candidates["optimizer"] = tuple(own("optimizer"))
    return candidates


def powers_of_two(limit: int) -> list[int]:
    """1, 2, 4, ... up to `limit` inclusive."""
    return [2**i for i in range(max(limit, 0).bit_length())]


def _runnable(values: Mapping[str, Sequence[Any]], info: DeviceInfo) -> dict[str, tuple]:
    """Each knob's values that this device runs."""
    return {knob: tuple(v for v in these if value_reason(knob, v, info) is None)
            for knob, these in values.items()}
