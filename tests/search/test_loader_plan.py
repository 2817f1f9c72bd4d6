"""DataLoader settings from the loader's own rate: the fewest workers that feed the model."""

from __future__ import annotations

from autotune.search.loader_plan import choose_loader, feeds, workers_share_cores
from autotune.trial.loader_rates import waiting_worker_counts
from autotune.trial.protocol import LoaderRate


def test_loader_plan_picks_the_fewest_workers_that_feed_the_model() -> None:
    rates = [LoaderRate(0, None, 10_000.0), LoaderRate(2, 2, 30_000.0),
             LoaderRate(2, 4, 31_000.0), LoaderRate(4, 2, 60_000.0)]
    assert choose_loader(rates, 400.0) == rates[0]        # in-process costs < 5% of a step
    assert choose_loader(rates, 15_000.0) == rates[1]     # 2 workers outrun it by 1.5x
    assert choose_loader(rates, 30_000.0) == rates[3]
    assert choose_loader(rates, 50_000.0) == rates[3]     # loader-bound: the fastest setting
    assert not feeds(rates[0], 1_000.0)
    # On CPU workers take the cores training uses: only in-process loading is planned.
    assert choose_loader(rates, 400.0, workers_share_cores=True) == rates[0]
    assert choose_loader(rates, 15_000.0, workers_share_cores=True) is None




def test_a_loader_that_waits_gets_workers_beyond_the_cores_even_on_cpu() -> None:
    """In-process loading that is on the CPU 5% of its wall time waits (a storage read): its
    workers sleep while they wait, so on a CPU of 2 cores they are timed up to 32 (2 / 0.05 =
    40, capped), and the plan gives workers on CPU as it does on a GPU; a loader that computes
    (on the CPU 90% of its time) gets neither."""
    waiting = [LoaderRate(0, None, 500.0, cpu_share=0.05), LoaderRate(1, 2, 900.0),
               LoaderRate(2, 2, 1_800.0)]
    assert waiting[0].waits
    assert waiting_worker_counts(waiting, cores=2) == [4, 8, 16, 32]
    assert not workers_share_cores("cpu", waiting)
    more = [*waiting, LoaderRate(8, 2, 7_000.0), LoaderRate(16, 2, 13_000.0)]
    # the fewest workers that outrun a model of 4,000 samples/s by 1.5x
    assert choose_loader(more, 4_000.0, workers_share_cores("cpu", more)) == more[3]
    computing = [LoaderRate(0, None, 500.0, cpu_share=0.9), LoaderRate(2, 2, 900.0)]
    assert not computing[0].waits and waiting_worker_counts(computing, cores=2) == []
    assert workers_share_cores("cpu", computing) and not workers_share_cores("cuda", computing)
    assert choose_loader(computing, 4_000.0, workers_share_cores("cpu", computing)) is None
