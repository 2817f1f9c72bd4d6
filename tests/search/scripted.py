"""A tuner that starts no process: its `Runner` answers from a script, the probe with a report
as recorded, each trial with what the test's `measure` returns. For tests of the tuner's own
decisions (what it measures next, what it records, what it says)."""

from __future__ import annotations

from collections.abc import Callable

from autotune.config import TrainConfig
from autotune.options import TuneOptions
from autotune.search.runner import MeasureJob
from autotune.search.tuner import Tuner
from autotune.trial.protocol import ProbeReport, TrialResult

Measure = Callable[[TrainConfig, MeasureJob], TrialResult]

# What the probe finds in conftest.TINY_SOURCE: two blocks of Linear(8, 8), 256 samples.
TINY_PROBE = ProbeReport(baseline={"micro_batch_size": 8}, dataset_size=256,
                         state_bytes=4 * 4 * 144, parameters=144,
                         step_s={"fp32": 0.002, "bf16": 0.003})


def no_trials(config: TrainConfig, job: MeasureJob) -> TrialResult:
    raise AssertionError("this test runs no trial")


class ScriptedRunner:
    """The tuner's `Runner` answering from a script: the probe's report as recorded, each
    trial `measure`'s result; no process is started."""

    def __init__(self, report: ProbeReport, measure: Measure) -> None:
        self.report, self.measure = report, measure

    def probe(self, device: str, time_limit_s: float,
              optimizer_change: bool = False) -> ProbeReport:
        return self.report

    def preload(self, probe: ProbeReport) -> str | None:
        return None

    def close(self) -> None:
        """Nothing to end."""


def scripted(options: TuneOptions, measure: Measure = no_trials,
             probe: ProbeReport = TINY_PROBE, **tuner: object) -> Tuner:
    """A tuner whose probe reports `probe` and whose trials `measure` answers."""
    return Tuner(options, runner=ScriptedRunner(probe, measure), **tuner)
