"""The model file's code runs only in child processes: the probe and trials through one fork
server, a file that hangs or breaks ends within the limit with one message."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

import autotune.search.runner
from autotune.config import TrainConfig
from autotune.errors import ContractError
from autotune.options import MeasureSettings
from autotune.search.runner import (
    STARTUP_GRACE_S,
    MeasureJob,
    ProbeFailed,
    ProcessRunner,
    StartupWatch,
)
from autotune.target import ModelFile, Script
from autotune.trial.protocol import FIRST_STEP, SCRIPT_STARTUP

from ..conftest import TINY_SOURCE

SETTINGS = MeasureSettings(window_steps=2, window_seconds=0.1, warmup_max_seconds=2,
                           profile_steps=0)


def runner(path: Path, directory: Path, settings: MeasureSettings = SETTINGS) -> ProcessRunner:
    phases: list[str] = []
    made = ProcessRunner(ModelFile(str(path)), directory, settings, memory_limit_bytes=None,
                         core_shares=None, on_phase=lambda text, number: phases.append(text))
    made.phases = phases
    return made


def test_the_model_file_is_imported_once_for_the_probe_and_every_trial(write_model,
                                                                      tmp_path) -> None:
    imports = tmp_path / "imports.txt"
    path = write_model(f"import os\nopen({str(imports)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
                       + TINY_SOURCE)
    made = runner(path, tmp_path / "study", replace(SETTINGS, profile_steps=1))
    try:
        report = made.probe("cpu", 120)
        results = [made.measure(TrainConfig(micro_batch_size=8),
                                MeasureJob(f"trial-{i}", 120, "cpu", profile=i == 0))
                   for i in range(2)]
    finally:
        made.close()
    assert report.dataset_size == 256
    assert [r.status for r in results] == ["ok", "ok"]
    assert [bool(r.measurement.top_operators) for r in results] == [True, False]
    assert len(imports.read_text().split()) == 1, "imported in the fork server only"
    assert (tmp_path / "study" / "logs" / "trial-1.log").exists()


@pytest.mark.slow
def test_a_build_dataset_that_never_returns_ends_within_the_limit(write_model, tmp_path) -> None:
    path = write_model(TINY_SOURCE.replace(
        "def build_dataset(dim=8, size=256):", "def build_dataset(dim=8, size=256):\n"
        "    while True:\n        pass"))
    made = runner(path, tmp_path)
    start = time.monotonic()
    try:
        with pytest.raises(ProbeFailed, match=r"timeout.*in: building the dataset"):
            made.probe("cpu", 8)
    finally:
        made.close()
    assert time.monotonic() - start < 60  # the limit, and importing torch in the fork server


@pytest.mark.slow
def test_a_model_file_whose_import_hangs_is_named(write_model, tmp_path) -> None:
    path = write_model("import time\ntime.sleep(3600)\n" + TINY_SOURCE)
    made = runner(path, tmp_path)
    try:
        with pytest.raises(ProbeFailed, match="did not finish within 6 s"):
            made.probe("cpu", 6)
    finally:
        made.close()


def test_a_contract_violation_in_the_probe_is_bad_input(write_model, tmp_path) -> None:
    path = write_model(TINY_SOURCE.replace("return Net(dim)", "return 'not a module'"))
    made = runner(path, tmp_path)
    try:
        with pytest.raises(ContractError, match="must return a torch.nn.Module"):
            made.probe("cpu", 120)
    finally:
        made.close()


def test_a_scripts_probe_tells_its_wait_and_stops_at_the_start_up_limit() -> None:
    """While the script has not reached its trainer, a line every 30 s; the end where the
    script did not stop itself at the limit (`STARTUP_GRACE_S` after it); once it trains, the
    start-up limit no longer applies."""
    told: list[str] = []
    watch = StartupWatch("train.py", 100, told.append)
    assert [watch(phase, s) for phase, s in
            [("", 5), (SCRIPT_STARTUP, 29), (SCRIPT_STARTUP, 31), (SCRIPT_STARTUP, 45),
             (SCRIPT_STARTUP, 61)]] == [False] * 5
    assert told == [f"probing: train.py has run {s} s, not yet at its Trainer.train, "
                    "Trainer.fit or a torch.optim optimizer's first step (the probe stops it "
                    "at 100 s: --startup-limit)" for s in (30, 60)]
    assert not watch(SCRIPT_STARTUP, 100) and not watch.stopped
    assert watch(SCRIPT_STARTUP, 100 + STARTUP_GRACE_S) and watch.stopped
    assert not StartupWatch("train.py", 100, told.append)(FIRST_STEP, 500)


def test_a_script_that_never_reaches_its_trainer_is_stopped_at_the_start_up_limit(
        tmp_path: Path, monkeypatch) -> None:
    """The wait told to whoever watches (every 30 s: here every second), then the end, where
    the script stops itself and says what it saw."""
    monkeypatch.setattr(autotune.search.runner, "STARTUP_PROGRESS_S", 1.0)
    script = tmp_path / "train.py"
    script.write_text("import time\ntime.sleep(600)\n")
    told: list[str] = []
    made = ProcessRunner(Script(str(script)), tmp_path / "study", SETTINGS,
                         memory_limit_bytes=None, core_shares=None,
                         on_phase=lambda text, number: None, startup_limit_s=4,
                         on_note=told.append)
    start = time.monotonic()
    try:
        with pytest.raises(ContractError, match=r"^train.py ran [45] s and never reached "
                                                r"Trainer.train, Trainer.fit or a torch.optim "
                                                r"optimizer's first step; a loop without a "
                                                r"torch.optim optimizer: write a model file "
                                                r"\(README\); a start-up longer than 4 s: "
                                                r"--startup-limit 10m$"):
            made.probe("cpu", 120)
    finally:
        made.close()
    assert time.monotonic() - start < 4 + STARTUP_GRACE_S, "the script stopped itself"
    assert told and told[0].startswith("probing: train.py has run 1 s, not yet at its ")
