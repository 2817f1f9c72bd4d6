"""A trial's job (`child`) for a user's training script: run it (`runner`) under a measuring
observer and answer as a model file's trial does: the probe's `ProbeReport` (the script's own
settings as the baseline, the knob values its library cannot be told left out), or a
`Measurement` with the configuration in the script's own terms (`ScriptAnswer`)."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from autotune.config import TrainConfig
from autotune.errors import ContractError
from autotune.options import MeasureSettings
from autotune.trial.protocol import (
    SCRIPT_STARTUP,
    Measurement,
    ProbeReport,
    ScriptAnswer,
    TrialRequest,
)
from autotune.trial.script import terms
from autotune.trial.script.measuring import MeasuringObserver
from autotune.trial.script.runner import ScriptRun, run_script
from autotune.trial.script.session import ScriptTrial
from autotune.trial.training import training_state_bytes

# The probe times the script's own settings for a few steps only: it reads, it does not rank.
PROBE_SETTINGS = {"window_steps": 2, "window_seconds": 0.0, "window_max_steps": 2,
                  "warmup_max_steps": 1, "screen_steps": 0, "profile_steps": 0}
# A dataset without a length (a stream) bounds no micro-batch size.
UNSIZED_DATASET = 1 << 30

Progress = Callable[[str], None]


def script_job(request: TrialRequest, device: torch.device, world_size: int,
               progress: Progress) -> tuple[TrainConfig, Measurement | ProbeReport]:
    """Run the script for `request.job` (measure or probe); the configuration it ran, and the
    job's answer."""
    if request.job not in ("measure", "probe"):
        raise ContractError(f"autotune {request.job} does not take --script yet; use bench")
    probing = request.job == "probe"
    settings = _settings({**request.settings, **(PROBE_SETTINGS if probing else {})})
    observer = MeasuringObserver(settings, device, progress)
    config = None if probing or not request.config else TrainConfig.from_dict(request.config)
    with tempfile.TemporaryDirectory(prefix="autotune-script-") as scratch:
        trial = ScriptTrial(device, observer, Path(scratch), config=config)
        progress(SCRIPT_STARTUP)
        start = time.perf_counter()
        run = run_script(request.model_path, request.script_args or [], trial)
        figures = replace(observer.measurement(run.startup_s),
                          measure_wall_s=time.perf_counter() - start)
    ran = config or run.baseline.config(device.type, world_size)
    if probing:
        return ran, _probe_report(run, observer, request.settings.get("candidates", {}),
                                  device.type, world_size)
    answer = ScriptAnswer(run.baseline.library,
                          terms.changes(ran, run.baseline, device.type, world_size),
                          run.baseline.parsed_by)
    return ran, replace(figures, script_answer=answer)


def _settings(given: dict[str, Any]) -> MeasureSettings:
    known = {f.name for f in dataclasses.fields(MeasureSettings)}
    return MeasureSettings(**{k: v for k, v in given.items() if k in known})


def _probe_report(run: ScriptRun, observer: MeasuringObserver, candidates: dict[str, Any],
                  device_type: str, world_size: int) -> ProbeReport:
    """What the search needs of the script: its own settings, its data and model's size, the
    values its library cannot be told (and the knobs the script keeps to itself)."""
    info = observer.info
    assert info is not None
    parameters = sum(p.numel() for p in info.model.parameters())
    return ProbeReport(
        baseline=run.baseline.knobs, dataset_size=info.dataset_size or UNSIZED_DATASET,
        state_bytes=training_state_bytes(info.model), parameters=parameters,
        left_out=terms.left_out(run.baseline, candidates, device_type, world_size))
