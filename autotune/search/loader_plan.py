"""DataLoader settings decided from the loader's own measured rate instead of searched.

How fast a DataLoader delivers batches does not depend on the model, so it is measured once
per study, for every (num_workers, prefetch_factor) the space offers, with no model at all.
While some setting outruns the fastest consumption measured so far, every trial gets the
cheapest such setting, whatever the sampler proposed: worker processes cost cores and memory,
and past "fast enough" they buy nothing. Proposals that differ only in the DataLoader then
collapse into one configuration, measured once. When no setting is fast enough the model is
loader-bound, and the sampler's proposal is measured as it is. On CPU, where workers compete
with training for the same cores, only in-process loading is ever planned.
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
    """The fewest workers (then the smallest prefetch) that feed `consumption`; None when no
    setting does. When workers take the cores training runs on (CPU training), their rate
    alone does not say they help, so only in-process loading is planned."""
    enough = [r for r in rates if feeds(r, consumption)
              and not (workers_share_cores and r.num_workers > 0)]
    return min(enough, key=lambda r: (r.num_workers, r.prefetch_factor or 0), default=None)


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
