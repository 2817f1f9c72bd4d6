"""The measurement protocol: the figures mean what the table says they mean."""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from autotune.config import TrainConfig
from autotune.hardware import PeakFlops, describe
from autotune.options import MeasureSettings
from autotune.trial.compile_events import compile_count
from autotune.trial.flops import SampleFlops
from autotune.trial.measure import (
    count_flops_per_sample,
    measure_config,
    measure_setup,
    timed_turn,
    warm_up,
)
from autotune.trial.protocol import LOADER_TURN_ROUNDS, Measurement, WarmTurn
from autotune.trial.training import TrainingSetup, setup_training
from autotune.trial.workload import load_workload

from ..conftest import ROOT, TINY_SOURCE

SETTINGS = MeasureSettings(window_steps=5, window_seconds=0.5, window_max_seconds=1.5,
                           warmup_max_seconds=5, profile_steps=2)


class SlowDataset(torch.utils.data.Dataset):
    """Each sample costs `delay` seconds of loader time, like decoding or augmentation."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __len__(self) -> int:
        return 1024

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay:
            time.sleep(self.delay)
        return torch.full((16,), float(i % 7)), torch.tensor(float(i % 3))


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x).squeeze(1), y)


def warmed(dataset: torch.utils.data.Dataset, config: TrainConfig,
           ) -> tuple[TrainingSetup, Iterator[Any]]:
    """The tiny model on `dataset` in `config`, warmed up as a warm process is: its set-up and
    its batches."""
    setup = setup_training(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)),
                           dataset, config, "cpu", loss_fn=loss_fn)
    batches = setup.batches()
    warm_up(setup, batches, SETTINGS)
    return setup, batches


def measure(delay: float, config: TrainConfig, settings: MeasureSettings = SETTINGS) -> Measurement:
    setup = setup_training(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)),
                           SlowDataset(delay), config, "cpu", loss_fn=loss_fn)
    return measure_setup(setup, settings, describe(torch.device("cpu")))


def test_samples_per_sec_is_samples_over_window_time() -> None:
    m = measure(0.0, TrainConfig(micro_batch_size=8, grad_accum_steps=2))
    assert m.window_steps >= SETTINGS.window_steps
    assert m.window_s >= SETTINGS.window_seconds
    assert m.window_samples == m.window_steps * 16
    assert m.samples_per_sec == m.window_samples / m.window_s
    # Step times partition the window; a loaded machine skews them, so only bounds hold.
    assert 0 < m.step_time_median_s <= m.step_time_p90_s <= m.window_s
    assert m.step_time_median_s <= m.step_time_p90_s
    assert m.time_to_first_step_s > 0 and m.peak_memory_bytes > 0
    assert m.mfu is None and m.device_idle_fraction is None
    assert m.host_syncs_per_step == 0
    assert m.top_operators and m.final_loss is not None


def test_the_window_goes_on_until_the_median_step_time_is_known_or_a_cap() -> None:
    """A loader that sleeps 1 ms per sample gives steady ~8 ms steps: their median is known
    within ±5% long before the cap. Asking for an exact median runs to the step cap."""
    config = TrainConfig(micro_batch_size=8)
    # another process's load never stops the lengthening here (a disturbed window is not
    # lengthened): what is tested is the lengthening itself
    settings = replace(SETTINGS, window_steps=6, window_seconds=0.0, window_precision=0.05,
                       window_max_steps=1000, window_max_seconds=20, profile_steps=0,
                       contention_retries=0, contention_threshold=1.0)
    known = measure(0.001, config, settings)
    assert known.step_time_precision <= 0.05 and 6 <= known.window_steps < 1000
    capped = measure(0.001, config, replace(settings, window_precision=0.0,
                                            window_max_steps=40))
    assert capped.window_steps == 40 and capped.step_time_precision > 0
    assert capped.cpu_threads == torch.get_num_threads()
    assert capped.cpu_affinity == tuple(sorted(os.sched_getaffinity(0)))


def test_data_loading_is_in_the_figure() -> None:
    """A loader that needs 2 ms per sample caps throughput near 500 samples/sec."""
    fast = measure(0.0, TrainConfig(micro_batch_size=8))
    slow = measure(0.002, TrainConfig(micro_batch_size=8))
    assert slow.samples_per_sec < 500
    loader_s = slow.window_steps * 8 * 0.002
    assert slow.data_wait_fraction * slow.window_s >= 0.9 * loader_s
    assert fast.data_wait_fraction < slow.data_wait_fraction


def test_workers_hide_a_slow_loader() -> None:
    inline = measure(0.002, TrainConfig(micro_batch_size=8))
    workers = measure(0.002, TrainConfig(micro_batch_size=8, num_workers=2, prefetch_factor=4,
                                         persistent_workers=True))
    # Both stay loader-bound (the model is tiny); what workers cut is the wait per sample.
    def wait_per_sample(m: dict) -> float:
        return m.data_wait_fraction / m.samples_per_sec

    assert wait_per_sample(workers) < 0.8 * wait_per_sample(inline)
    assert workers.samples_per_sec > 1.3 * inline.samples_per_sec


def test_a_warm_turn_after_an_idle_wait_times_the_loader_it_keeps_while_training() -> None:
    """A warm process waits while the others take their turns, and its loader workers fill
    their queue meanwhile (2 workers x prefetch 8 = 16 batches): its next turn must time the
    rate it keeps while training, not that queue. Turns after a second idle measure within 20%
    of turns taken back to back (timing the queue: 36-43% above). A batch costs its worker 32
    ms, many steps' time even on a loaded host, so the few batches the workers make while the
    queue is drained stay a small share of a turn."""
    config = TrainConfig(micro_batch_size=8, num_workers=2, prefetch_factor=8,
                         persistent_workers=True)
    setup, batches = warmed(SlowDataset(0.004), config)

    def rate(turn) -> float:
        return turn.samples / turn.seconds

    back_to_back, after_idle = [], []
    for _ in range(3):
        back_to_back.append(rate(timed_turn(setup, batches, SETTINGS, 5, 0.6)))
        time.sleep(1.0)
        after_idle.append(rate(timed_turn(setup, batches, SETTINGS, 5, 0.6)))
    assert statistics.median(after_idle) < 1.2 * statistics.median(back_to_back)


def test_a_warm_turn_that_waits_on_its_loaders_workers_spans_many_batches_of_each() -> None:
    """Loader workers each make the next batch in turn: a turn that spans only a few of a
    worker's batches is moved by how far along each was when it began (storage_images, 8
    workers: 0.5 s turns spread 2.5x as much as 2 s ones, and measured 4-6% fast). A turn that
    waits on its workers goes on to `LOADER_TURN_ROUNDS` batches of each; one without workers
    keeps the length asked."""
    def turn(config: TrainConfig):
        setup, batches = warmed(SlowDataset(0.004), config)
        return timed_turn(setup, batches, SETTINGS, 1, 0.25)

    workers = turn(TrainConfig(micro_batch_size=8, num_workers=2, prefetch_factor=2,
                               persistent_workers=True))
    assert workers.samples >= LOADER_TURN_ROUNDS * 2 * 8
    assert turn(TrainConfig(micro_batch_size=8)).samples < LOADER_TURN_ROUNDS * 2 * 8


@pytest.mark.whole_machine
def test_a_warm_turn_that_waits_on_its_loaders_workers_reads_their_rate() -> None:
    """Four workers each make a batch of 8 in 128 ms (250 samples/s in all) for a step of next
    to nothing. After an idle second, as while the other warm processes take their turns, a
    turn asked for 0.1 s reaches its 0.4 s cap and goes on to a whole round of the workers:
    each made as many batches in it, and the turn reads their rate (ended at the cap, mid
    round, such turns read 11-25% low: `benchmarks/results/loader_rounds_toy/`; the sleeps'
    own overhead takes 2-5% off the rate, more on a slow minute)."""
    class Endless(SlowDataset):
        def __len__(self) -> int:
            return 100_000

    config = TrainConfig(micro_batch_size=8, num_workers=4, prefetch_factor=2,
                         persistent_workers=True)
    setup, batches = warmed(Endless(0.016), config)
    rates = []
    for _ in range(3):
        time.sleep(1.0)
        turn = timed_turn(setup, batches, SETTINGS, 1, 0.1)
        assert turn.seconds >= 0.4
        rates.append(turn.samples_per_sec)
    assert 0.9 * 250 <= statistics.median(rates) <= 1.02 * 250, rates


def test_a_warm_turn_has_the_mfu_a_trial_of_its_rate_would_have() -> None:
    """An answer confirmed in warm turns carries its MFU (on CUDA, where a trial's FLOPs and
    peak are known; here both are given): the model's FLOPs a sample times the turn's rate
    over the peak, as a trial's window has it."""
    setup, batches = warmed(SlowDataset(0.0), TrainConfig(micro_batch_size=8))
    flops, peak = SampleFlops(3.0e6, "given"), PeakFlops(1.0e12, "a peak given here")
    turn = timed_turn(setup, batches, SETTINGS, 5, 0.1, flops=flops, peak=peak)
    assert turn.mfu == pytest.approx(3.0e6 * turn.samples_per_sec / 1.0e12)
    assert WarmTurn.from_json(turn.to_json()).mfu == turn.mfu
    assert timed_turn(setup, batches, SETTINGS, 5, 0.1).mfu is None


def test_a_new_epochs_sampler_seed_is_not_a_host_sync_of_the_model() -> None:
    """With the whole dataset in one micro-batch every step starts an epoch, whose sampler
    reads its seed with .item(): data loading, not a sync in the user's step."""
    m = measure(0.0, TrainConfig(micro_batch_size=1024))
    assert m.host_syncs_per_step == 0


def tiny_workload(write_model) -> object:
    return load_workload(str(write_model(TINY_SOURCE)), {})


def test_screening_stops_a_slow_configuration_after_its_short_window(write_model) -> None:
    workload = tiny_workload(write_model)
    config = TrainConfig(micro_batch_size=8)
    # a disturbed screening window screens nothing (by design): the load of the tests beside
    # it (the CI's torch matrix runs three at once on two cores) must not count here
    settings = MeasureSettings(window_steps=20, window_seconds=0.5, warmup_max_seconds=2,
                               profile_steps=1, screen_steps=3, contention_threshold=1.0)
    full = measure_config(workload, config, torch.device("cpu"), settings)
    assert not full.screened and full.window_steps >= 20 and full.top_operators
    # 100x below its bar: the first warm-up step ends the warm-up, and one step screens
    screened = measure_config(workload, config, torch.device("cpu"), MeasureSettings(
        **{**vars(settings), "screen_below": full.samples_per_sec * 100}))
    assert screened.screened and not screened.top_operators
    assert (screened.warmup_steps, screened.window_steps) == (1, 1)
    assert screened.samples_per_sec == screened.screen_samples_per_sec
    assert screened.screen_done_s > 0


# --- FLOPs -------------------------------------------------------------------------------------

REFERENCE_MODELS = [
    ("models/mlp.py", {"feature_dim": 32, "hidden": 64, "num_samples": 64}, 8),
    ("models/gpt.py", {"n_layer": 2, "n_embd": 64, "n_head": 2, "block_size": 32,
                       "vocab_size": 128, "num_samples": 64}, 4),
    ("models/rgat.py", {"hidden": 32, "heads": 2, "graph_layers": 2, "text_layers": 1,
                        "vocab_size": 256, "num_samples": 64}, 8),
    ("tests/models/naive_attention.py", {}, 4),
    ("tests/models/tiny_dict.py", {}, 4),
]


def flops_of_a_real_batch(workload, micro_batch_size: int) -> float:
    """The count as it was made before: a whole micro-batch through the real model (attention
    through its plain math, whose FLOPs the counter sees on CPU too)."""
    dataset = workload.build_dataset()
    collate = workload.hook("collate_fn") or torch.utils.data.default_collate
    batch = collate([dataset[i] for i in range(micro_batch_size)])
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        workload.loss_fn()(workload.build_model(), batch).backward()
    return counter.get_total_flops() / micro_batch_size


@pytest.mark.parametrize(("path", "args", "micro_batch_size"), REFERENCE_MODELS)
def test_flops_are_counted_on_the_meta_device_as_a_real_batch_counts_them(
        path, args, micro_batch_size) -> None:
    """Counting used to run a whole micro-batch for real on the trial's GPU, in fp32, before
    the trial: its memory then stood in every trial's peak. On meta it costs none."""
    workload = load_workload(ROOT / path, args)
    model = workload.build_model()
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    counted = count_flops_per_sample(workload, TrainConfig(micro_batch_size=micro_batch_size),
                                     model, torch.device("cpu"))
    assert counted == flops_of_a_real_batch(workload, micro_batch_size)
    assert calls == []  # the trial's own model never ran
    if workload.flops_per_sample() and path.endswith("gpt.py"):
        assert counted == workload.flops_per_sample()  # the file's own estimate, exactly


def test_a_model_that_cannot_run_on_meta_is_counted_with_two_samples() -> None:
    """sync_loss reads values back with .item(), which meta tensors do not have."""
    workload = load_workload(ROOT / "tests/models/sync_loss.py")
    model = workload.build_model()
    sizes = []
    model.register_forward_hook(lambda m, args, out: sizes.append(len(args[0])))
    counted = count_flops_per_sample(workload, TrainConfig(micro_batch_size=16), model,
                                     torch.device("cpu"))
    assert sizes == [2]
    assert counted == flops_of_a_real_batch(workload, 16)
    assert all(p.grad is None for p in model.parameters())


# --- compiles during warm-up and the window ----------------------------------------------------

class Ragged(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((16,), float(i % 5))


def padded_batches(lengths: list[int]):
    """A collate_fn that pads each batch to the next length in `lengths`, then to the last."""
    calls = iter(lengths)

    def collate(samples: list[torch.Tensor]) -> torch.Tensor:
        length = next(calls, lengths[-1])
        return torch.stack(samples).unsqueeze(1).expand(-1, length, -1).contiguous()

    return collate


def compiled_setup(lengths: list[int]):
    """A model compiled for static shapes (a new length compiles again) with the cheap eager
    backend: what is counted is dynamo's compiling, which is the same for every backend."""
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    setup = setup_training(model, Ragged(), TrainConfig(micro_batch_size=4), "cpu",
                           loss_fn=lambda m, x: m(x).square().mean(),
                           collate_fn=padded_batches(lengths))
    return dataclasses.replace(setup, model=torch.compile(model, backend="eager",
                                                          dynamic=False))


def test_warm_up_is_not_steady_while_the_model_recompiles() -> None:
    setup = compiled_setup([4, 5, 6, 7, 8])
    lenient = MeasureSettings(steady_steps=2, steady_tolerance=100.0, warmup_max_steps=20)
    warm = warm_up(setup, setup.batches(), lenient)
    # five new shapes compile in the first five steps; then two quiet ones are steady
    assert (len(warm.times), warm.steady) == (7, True)


def test_compiles_in_warm_up_and_in_the_window_are_counted() -> None:
    settings = MeasureSettings(window_steps=3, window_max_steps=3, window_seconds=0.0,
                               steady_steps=2, steady_tolerance=100.0, profile_steps=0,
                               screen_steps=0)
    quiet = measure_setup(compiled_setup([4, 5, 6]), settings, describe(torch.device("cpu")))
    assert (quiet.graphs_compiled, quiet.graphs_compiled_in_window) == (3, 0)
    assert quiet.steady
    # shapes that keep changing compile in every window (the second one timed under dynamo's
    # limit of 8 graphs): timed again once, and the figure pays for them
    ragged = measure_setup(compiled_setup(list(range(4, 40))),
                           dataclasses.replace(settings, warmup_max_steps=1),
                           describe(torch.device("cpu")))
    assert not ragged.steady
    assert ragged.graphs_compiled_in_window > 0 and ragged.windows_remeasured == 1
    # CPU records no CUDA graphs; a torch whose compile callbacks announce none (2.6) leaves
    # the count unknown, never a made-up zero
    announces = hasattr(torch._dynamo.callback, "CallbackTrigger")
    assert ragged.cudagraph_recordings_in_window == (0 if announces else None)


def test_a_compile_after_the_warm_up_neither_screens_out_nor_times_the_window() -> None:
    """A new shape after a steady warm-up (a script's smaller last batch of an epoch) compiles
    once: in the screening window it screens nothing out, in the timed window that window is
    timed again and the clean one kept (a long run compiles that graph once)."""
    settings = MeasureSettings(window_steps=3, window_max_steps=3, window_seconds=0.0,
                               steady_steps=2, steady_tolerance=100.0, profile_steps=0,
                               screen_steps=0)
    # warm-up: steps 1-3 (4 compiles, 2-3 steady); window: 4-6, the 6th compiles
    late = measure_setup(compiled_setup([4, 4, 4, 4, 4, 6]), settings,
                         describe(torch.device("cpu")))
    assert (late.graphs_compiled, late.graphs_compiled_in_window) == (2, 0)
    assert late.windows_remeasured == 1
    # far below the bar, the warm-up ends at step 2 and one step screens: it compiles
    screening = dataclasses.replace(settings, screen_steps=3, screen_below=1e12)
    screened = measure_setup(compiled_setup([4, 4, 6]), screening, describe(torch.device("cpu")))
    assert not screened.screened and screened.graphs_compiled_in_window == 0


def test_a_warm_turn_in_which_a_graph_compiled_is_timed_again() -> None:
    """A warm process's turn is a window too: one in which a new shape compiled is timed again
    at once (two more steps here), and the turn answered is the clean one."""
    setup = compiled_setup([4, 4, 6])
    drawn = []

    def counted(batches):
        for batch in batches:
            drawn.append(batch.shape[1])
            yield batch

    batches = counted(setup.batches())
    setup.step(batches)  # compiles for length 4, as a warm process's warm-up does
    before = compile_count()
    turn = timed_turn(setup, batches, MeasureSettings(), steps=2, seconds=0.0)
    assert (compile_count() - before).graphs == 1  # the turn's second step, at length 6
    assert drawn == [4, 4, 6, 6, 6] and turn.samples == 2 * 4


def test_a_model_of_many_small_operators_is_profiled_without_python_frames() -> None:
    """Frames would make its events several times as many, each costly to read back: the
    profiler window leaves them out, says so, and still names the costliest operators."""
    layers = [nn.Linear(2, 2) for _ in range(300)]
    model = nn.Sequential(nn.Linear(16, 2), *layers, nn.Linear(2, 1))
    setup = setup_training(model, SlowDataset(0.0), TrainConfig(micro_batch_size=4), "cpu",
                           loss_fn=loss_fn)
    said: list[str] = []
    measured = measure_setup(setup, replace(SETTINGS, profile_steps=1),
                             describe(torch.device("cpu")), progress=said.append)
    assert any(line.startswith("profiling without Python frames") for line in said), said
    assert measured.top_operators and measured.top_operators[0].share > 0
