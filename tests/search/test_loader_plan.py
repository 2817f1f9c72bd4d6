"""DataLoader settings from the loader's own rate: the fewest workers that feed the model."""

from __future__ import annotations

from autotune.search.loader_plan import choose_loader, feeds
from autotune.trial.protocol import LoaderRate


def test_loader_plan_picks_the_fewest_workers_that_feed_the_model() -> None:
    rates = [LoaderRate(0, None, 10_000.0), LoaderRate(2, 2, 30_000.0),
             LoaderRate(2, 4, 31_000.0), LoaderRate(4, 2, 60_000.0)]
    assert choose_loader(rates, 400.0) == rates[0]        # in-process costs < 5% of a step
    assert choose_loader(rates, 15_000.0) == rates[1]     # 2 workers outrun it by 1.5x
    assert choose_loader(rates, 30_000.0) == rates[3]
    assert choose_loader(rates, 50_000.0) is None         # loader-bound: searched for real
    assert not feeds(rates[0], 1_000.0)
    # On CPU workers take the cores training uses: only in-process loading is planned.
    assert choose_loader(rates, 400.0, workers_share_cores=True) == rates[0]
    assert choose_loader(rates, 15_000.0, workers_share_cores=True) is None


