"""DataLoader settings decided from the loader's own measured rate instead of searched.

How fast a DataLoader delivers batches does not depend on the model, so it is measured once
per study, for every (num_workers, prefetch_factor) the space offers, with no model at all.
While some setting outruns the fastest consumption measured so far, every trial gets the
cheapest such setting, whatever the sampler proposed: worker processes cost cores and memory,
and past "fast enough" they buy nothing. Proposals that differ only in the DataLoader then
collapse into one configuration, measured once. When no setting is fast enough the model is
loader-bound: the fastest setting is planned where workers do not take the training's cores,
else the sampler's proposal is measured as it is. On CPU, workers compete with training for the
same cores, so only in-process loading is planned there, unless the loader waits (on storage, a
network) rather than computes: its workers sleep while they wait, and they are planned as on a
GPU (`waits`).
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.config import TrainConfig
from autotune.trial.protocol import LoaderRate

# Worker processes run beside training: their rate must exceed the model's by this factor.
LOADER_MARGIN = 1.5
# Loading in the training process adds to every step: it may take at most this share of one.
IN_PROCESS_SHARE = 0.05


def feeds(rate: LoaderRate, consumption: float) -> bool:
    """Whether this setting keeps a model consuming `consumption` samples/sec fed."""
    if rate.num_workers == 0:
        return consumption / (consumption + rate.samples_per_sec) <= IN_PROCESS_SHARE
    return rate.samples_per_sec >= LOADER_MARGIN * consumption


def choose_loader(rates: Sequence[LoaderRate], consumption: float,
                  workers_share_cores: bool = False) -> LoaderRate | None:
    """The fewest workers (then the smallest prefetch) that feed `consumption`; where none
    does, the fastest setting, unless workers take the cores training runs on (CPU training
    with a loader that computes): their rate alone then does not say they help, so only
    in-process loading is planned, and None where it does not feed."""
    usable = [r for r in rates if not (workers_share_cores and r.num_workers > 0)]
    enough = [r for r in usable if feeds(r, consumption)]
    if enough:
        return min(enough, key=lambda r: (r.num_workers, r.prefetch_factor or 0))
    if workers_share_cores or not usable:
        return None
    return max(usable, key=lambda r: r.samples_per_sec)


def workers_share_cores(device_type: str, rates: Sequence[LoaderRate]) -> bool:
    """Whether DataLoader workers would take the cores training runs on: on CPU, unless the
    loader waits rather than computes."""
    return device_type == "cpu" and not any(r.waits for r in rates)


def apply_loader(config: TrainConfig, rate: LoaderRate) -> TrainConfig:
    """`config` with the chosen loader; workers persist across epochs (no respawn per epoch)."""
    return config.replace(num_workers=rate.num_workers, prefetch_factor=rate.prefetch_factor,
                          persistent_workers=rate.num_workers > 0)


def consumption_rate(samples_per_sec: float | None,
                     data_wait_fraction: float | None) -> float | None:
    """Samples/sec the model alone would take: the measured rate without the data waits."""
    if not samples_per_sec:
        return None
    return samples_per_sec / (1.0 - min(0.95, data_wait_fraction or 0.0))
