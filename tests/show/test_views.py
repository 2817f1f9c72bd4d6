"""What the person watching a study sees: a line per event, or a live panel."""

from __future__ import annotations

import io

import optuna
from rich.console import Console

from autotune.config import TrainConfig
from autotune.search.events import StudyView
from autotune.show.views import LiveView, PlainView
from autotune.study.records import TrialRecord
from autotune.study.storage import open_storage
from autotune.trial.protocol import Measurement, TrialStatus

from ..study.test_results import _told


def _console() -> Console:
    return Console(file=io.StringIO(), width=120, force_terminal=False)


def test_plain_view_writes_one_line_per_event() -> None:
    console = _console()
    view: StudyView = PlainView(console)
    config = TrainConfig(micro_batch_size=8, precision="bf16")
    view.trial_started(3, config, "search", "cpu")
    view.phase("warming up", 3)
    view.trial_finished(TrialRecord(
        number=3, status=TrialStatus.OK, config=config,
        measurement=Measurement(samples_per_sec=1234.5, peak_memory_bytes=2**30)))
    view.trial_finished(TrialRecord(number=4, status=TrialStatus.OOM, config=config,
                                    message="CUDA out of memory"))
    view.note("the space is exhausted")
    assert console.file.getvalue().splitlines() == [
        "trial 3 (search) on cpu: mb=8x1 bf16 for_loop",
        "trial 3: ok  1234.5 samples/s, peak 1.00 GiB",
        "trial 4: oom  CUDA out of memory",
        "the space is exhausted"]


def test_live_view_shows_the_best_so_far_and_the_running_trials(tmp_path) -> None:
    study = optuna.create_study(study_name="s", storage=open_storage(None, tmp_path),
                                direction="maximize")
    config = TrainConfig(micro_batch_size=8)
    _told(study, config, "ok", 100.0, role="baseline")
    _told(study, config.replace(precision="bf16"), "ok", 150.0)
    console = _console()
    view = LiveView(console, study, budget=4, time_budget=lambda: None, measured=lambda: 2)
    with view:
        view.trial_started(2, config.replace(optimizer_impl="fused"), "search", "cpu")
        view.phase("warming up", 2)
        view.time_left("about 2.0 min left: 2 more search trials")
        console.print(view._render())
    text = console.file.getvalue()
    assert "best so far: trial 1, 150.0 samples/s, mb=8x1 bf16 for_loop" in text
    assert "trial 2 (search) on cpu: mb=8x1 fp32 fused — warming up" in text
    assert "2/4" in text and "about 2.0 min left: 2 more search trials" in text
