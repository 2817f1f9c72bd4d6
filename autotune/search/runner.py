"""Where the model file's code runs: in child processes, never in the tuner's own.

A `ProcessRunner` starts a fork server for the model file (torch and the file imported once;
`forkserver`) and runs the capability probe and every trial through `isolation.run_isolated`,
forked from it, or as fresh interpreters when no server can start. A training script's probe is
a fresh interpreter; its trials fork from a server that imported the library modules the probe
recorded (`preload`), never the script. The tuner only sees plain
results; a benchmark can hand it another `Runner` that answers from recorded runs.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from autotune.config import TrainConfig
from autotune.errors import TRAINING_START, ContractError, RunFailed, never_trained_message
from autotune.hardware import describe
from autotune.options import DEFAULT_STARTUP_LIMIT_S, MeasureSettings
from autotune.search.domains import probe_candidates
from autotune.search.forkserver import ForkServer, ForkServerUnavailable
from autotune.search.isolation import run_isolated
from autotune.target import ModelFile, Script, Target
from autotune.trial.protocol import (
    SCRIPT_STARTUP,
    LossRunSettings,
    ProbeReport,
    ProbeSettings,
    TrialRequest,
    TrialResult,
    TrialStatus,
    WorstBatchSettings,
)


@dataclass(frozen=True)
class MeasureJob:
    """One run of a configuration: its log name, time limit and device, and what it is for."""

    name: str
    time_limit_s: float
    device: str
    number: int | None = None
    screen_below: float | None = None
    screen_load: float = 0.0  # the bar's own load: `MeasureSettings.screen_load`
    trace: Path | None = None
    slot: int | None = None  # which of the parallel workers runs it (its share of the cores)
    profile: bool = True  # the profiler window after the timed one (stalls, findings, trace)
    # A run of a paired round (confirmation, verify): the rounds give the figure its precision,
    # so the run times the shortest window that still times steps, and screens nothing.
    round_run: bool = False
    # A check that the configuration runs at all (the probe's, in a process group): one step
    # of warm-up and one timed, nothing else.
    check_run: bool = False
    # A check of what may be recommended (`search.checks`), whose settings' type names its job
    # (`trial.child.JOBS`): a worst batch's or a loss run's; None: a measurement.
    settings: WorstBatchSettings | LossRunSettings | None = None
    # A fresh interpreter, not a fork of the fork server: a fork maps the libraries the
    # server loaded without counting them in its RSS until it touches them, so on CPU only a
    # fresh process's peak is the one a user's own run reaches (the worst batch's).
    fresh: bool = False


# A line every this many seconds while a script's probe waits for the script's trainer.
STARTUP_PROGRESS_S = 30.0
# A script stops itself at its start-up limit and says what it did
# (`ProbeSettings.startup_limit_s`); the tuner ends its probe this much later where it could
# not (stuck in native code, its process's start slower than the limit's slack).
STARTUP_GRACE_S = 15.0
# A round run's timed window, in optimizer steps (at least the window's seconds still).
ROUND_WINDOW_STEPS = 3
# A check run's settings: does it train at all.
CHECK_RUN = {"screen_steps": 0, "warmup_max_steps": 1, "window_steps": 1, "window_max_steps": 1,
             "window_seconds": 0.0, "profile_steps": 0, "contention_retries": 0}


class ProbeFailed(RunFailed):
    """The probe did not finish (a crash, a timeout, an error in the user's code)."""


class StartupWatch:
    """A training script's probe until the script starts its training: a line every
    `STARTUP_PROGRESS_S` (`tell`), and its end `STARTUP_GRACE_S` after `limit_s`, where the
    script did not stop itself at the limit (`stopped`)."""

    def __init__(self, script: str, limit_s: float, tell: Callable[[str], None]) -> None:
        self.script, self.limit_s, self.tell = script, limit_s, tell
        self.told, self.stopped = 0, False

    def __call__(self, phase: str, elapsed: float) -> bool:
        if phase not in ("", SCRIPT_STARTUP):
            return False
        if elapsed >= self.limit_s + STARTUP_GRACE_S:
            self.stopped = True
            return True
        if elapsed >= (self.told + 1) * STARTUP_PROGRESS_S:
            self.told += 1
            self.tell(f"probing: {self.script} has run {self.told * STARTUP_PROGRESS_S:.0f} s, "
                      f"not yet at its {TRAINING_START} (the probe stops it at "
                      f"{self.limit_s:.0f} s: --startup-limit)")
        return False


class Runner(Protocol):
    """Runs the model file's code: the probe once, then trials."""

    def probe(self, device: str, time_limit_s: float,
              optimizer_change: bool = False) -> ProbeReport: ...
    def measure(self, config: TrainConfig, job: MeasureJob) -> TrialResult: ...
    def preload(self, probe: ProbeReport) -> str | None: ...
    def close(self) -> None: ...


class ProcessRunner:
    """The probe and the trials in child processes forked from one fork server."""

    def __init__(self, target: Target, directory: Path,
                 settings: MeasureSettings, *, memory_limit_bytes: int | None,
                 core_shares: list[list[int]] | None,
                 on_phase: Callable[[str, int | None], None],
                 stop: threading.Event | None = None, nproc_per_node: int = 1,
                 groups: dict[str, list[str]] | None = None,
                 startup_limit_s: float = DEFAULT_STARTUP_LIMIT_S,
                 on_note: Callable[[str], None] | None = None) -> None:
        self.target, self.directory = target, directory
        # How long a training script's probe waits for it to reach its trainer.
        self.startup_limit_s = startup_limit_s
        # A script's own settings as its probe read them (where each is said): every trial of
        # it is told them.
        self._script_baseline: dict[str, Any] | None = None
        self.on_note = on_note or (lambda text: None)
        # ranks per trial, and per worker's device the GPUs of its group (--devices)
        self.nproc_per_node, self.groups = nproc_per_node, groups or {}
        self.settings, self.memory_limit_bytes = settings, memory_limit_bytes
        self.core_shares = core_shares
        self.on_phase, self.stop = on_phase, stop
        self._server: ForkServer | None = None
        self._started = False
        self._script_imports: list[str] = []

    def probe(self, device: str, time_limit_s: float,
              optimizer_change: bool = False) -> ProbeReport:
        """The ProbeReport of the model file on `device`, which tries the values a search
        offers there; ContractError for bad input, ProbeFailed when the probe could not finish.
        It runs without the memory limit: it measures what works, not what fits."""
        server = self._fork_server(time_limit_s)
        candidates = probe_candidates(describe(torch.device(device)), optimizer_change)
        request = TrialRequest(self.target, config={}, device=device,
                               settings=ProbeSettings.for_window(
                                   candidates, self.settings.window_seconds,
                                   self.startup_limit_s),
                               inductor_cache_dir=self._inductor_cache(),
                               script_baseline=self._script_baseline)
        script = Path(self.target.path).name
        watch = None  # a script's start-up is watched: a model file's is the fork server's
        match self.target:
            case Script():
                watch = StartupWatch(script, self.startup_limit_s, self.on_note)
        result = run_isolated(request, time_limit_s, self.directory / "logs" / "probe.log",
                              on_phase=lambda text: self.on_phase(text, None), server=server,
                              watch=watch)
        if result.bad_input:
            raise ContractError(result.message)
        if watch is not None and result.status == TrialStatus.TIMEOUT and \
                result.phase in ("", SCRIPT_STARTUP):
            longer = (f"; a start-up longer than {self.startup_limit_s:.0f} s: --startup-limit "
                      "10m" if watch.stopped else "")
            raise ContractError(never_trained_message(script, result.wall_s or time_limit_s) +
                                longer)
        if result.status != "ok":
            raise ProbeFailed(f"the {self.target.noun}'s probe ended as {result.status}: "
                              f"{result.message} (log: {result.log_path})")
        return result.probe

    def preload(self, probe: ProbeReport) -> str | None:
        """Take a training script's library modules from its probe, for the fork server its
        trials fork from; what to tell the user of it (None for a model file)."""
        match self.target:
            case ModelFile():
                return None
        self._script_baseline = probe.script_baseline
        if self.nproc_per_node > 1:
            return ("each rank of a trial starts its own interpreter, torch and the script's "
                    "libraries (torchrun starts them)")
        self._script_imports = list(probe.script_imports)
        changed = probe.script_environment_changed
        held = (f"; imports after it set {', '.join(changed[:3])}"
                f"{' ...' if len(changed) > 3 else ''} in os.environ are each trial's own"
                if changed else "")
        if not self._script_imports:
            return f"each trial starts its own interpreter and imports{held}"
        return (f"trials fork from a process that has imported torch and the "
                f"{len(self._script_imports)} library modules the script imported, never the "
                f"script itself{held}")

    def measure(self, config: TrainConfig, job: MeasureJob) -> TrialResult:
        return run_isolated(self.request(config, job), job.time_limit_s,
                            self.directory / "logs" / f"{job.name}.log",
                            on_phase=lambda text: self.on_phase(text, job.number),
                            stop=self.stop,
                            server=None if job.fresh else self._fork_server(job.time_limit_s))

    def request(self, config: TrainConfig, job: MeasureJob) -> TrialRequest:
        """What a trial process of `job` is asked (a warm process is asked the same)."""
        return TrialRequest(
            self.target, config=config.to_dict(), device=job.device,
            settings=job.settings or replace(
                self.settings, **{"screen_below": job.screen_below,
                                  "screen_load": job.screen_load,
                                  **({} if job.profile else {"profile_steps": 0}),
                                  **(self._round_window() if job.round_run else {}),
                                  **(CHECK_RUN if job.check_run else {})}),
            script_baseline=self._script_baseline,
            memory_limit_bytes=self.memory_limit_bytes,
            trace_path=str(job.trace) if job.trace else None,
            inductor_cache_dir=self._inductor_cache(),
            nproc_per_node=self.nproc_per_node, group_devices=self.groups.get(job.device),
            **self._cores(job.slot))

    def _inductor_cache(self) -> str:
        """Compiled graphs are cached under the study, so each (mode, shapes) compiles once;
        the probe's process is told it too, as a trial's is (what it sees of the environment
        decides what a script's trials may import ahead: `preload`)."""
        return os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(self.directory / "inductor")

    def _round_window(self) -> dict[str, Any]:
        steps = min(ROUND_WINDOW_STEPS, self.settings.window_steps)
        return {"screen_steps": 0, "window_steps": steps, "window_max_steps": steps}

    def _cores(self, slot: int | None) -> dict[str, Any]:
        """The cores of a parallel worker's trial (and as many intra-op threads); none for a
        trial that runs alone (a single worker, or confirmation)."""
        if slot is None or not self.core_shares:
            return {}
        cpus = self.core_shares[slot]
        return {"cpus": cpus, "threads": len(cpus)}

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def fork_server(self, start_timeout_s: float) -> ForkServer | None:
        """The server trials fork from, for warm processes to fork from too (`search.warm`);
        None where trials start as fresh interpreters."""
        return self._fork_server(start_timeout_s)

    def _fork_server(self, start_timeout_s: float) -> ForkServer | None:
        """The fork server, started on first use; None when it cannot start (trials then start
        as fresh interpreters), and for a training script until its probe has said what it
        imports (`preload`): nothing of the script runs before its trial does."""
        if self._started:
            return self._server
        logs = self.directory / "logs"
        model, modules, slow = None, None, ""
        match self.target:
            case Script():
                if not self._script_imports:
                    return None
                logs.mkdir(parents=True, exist_ok=True)
                modules = logs / "script-imports.json"
                modules.write_text(json.dumps(self._script_imports))
                what = "script's libraries"
            case ModelFile(path):
                model, what = path, "model file"
                slow = (f"importing {path} did not finish within {start_timeout_s:g} s (see the "
                        f"log in {logs})")
        self._started = True
        self.on_phase(f"importing torch and the {what}", None)
        try:
            self._server = ForkServer(model, logs / "forkserver.log", start_timeout_s,
                                      script_modules=modules)
        except ForkServerUnavailable as exc:
            if exc.timed_out and slow:  # a model file that does not import: the user's to fix
                raise ProbeFailed(slow) from None
        return self._server
