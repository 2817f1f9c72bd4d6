"""Warm paired turns: the confirmation's candidates and the baseline each kept warm in a process
of its own (`autotune.trial.warm`), taking turns of a fraction of a second, so that a pair is
measured seconds apart on the same machine instead of minutes apart in fresh processes (the
way tango and Rust's paired benchmarking alternate two versions on a noisy machine).

All the processes live at once, so they are used only where the device holds them all (the
sum of the candidates' peaks in their search trials, against the memory a trial may use); else,
or when one fails to start, the confirmation keeps its fresh-process rounds and says why.

A warm process forks from the trials' fork server where one runs (torch, autotune and the model
file or the script's libraries imported already: a process group's ranks, and a study whose
trials start fresh, start new interpreters), and talks with the tuner over a socket it connects
to; a new interpreter talks over its stdin and stdout.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

import torch

from autotune.config import TrainConfig
from autotune.errors import RunFailed
from autotune.hardware import describe, host_available_memory
from autotune.search.forkserver import (
    TRIAL_ENVIRONMENT,
    ForkedChild,
    ForkServer,
    ForkServerUnavailable,
)
from autotune.search.isolation import (
    absolute_path,
    group_command,
    group_environment,
    launch_device,
)
from autotune.search.runner import MeasureJob, ProcessRunner
from autotune.study.confirmation import WARM_TURNS, Run
from autotune.study.records import config_key
from autotune.trial.protocol import (
    LOADER_BOUND_SHARE,
    LOADER_TURN_SLACK,
    Measurement,
    ScriptAnswer,
    TrialRequest,
    TrialStatus,
    WarmTurn,
    loader_turn_steps,
    prefetched_steps,
)

# Of the memory a trial may use, what the warm processes together may take (the rest: the
# tuner, and what a peak measured once leaves out).
MEMORY_HEADROOM = 0.8
# A warm round costs seconds where a fresh one costs a process start each: this many warm rounds
# at least for each fresh round asked for (--confirm-repeats); beyond them, time caps the race.
WARM_ROUNDS_PER_ROUND = 4
WARM_MAX_ROUNDS = 400
# The warm processes are started only where the plan allows more rounds than this: one or two
# fresh rounds cost less than starting them.
WARM_WORTH_ROUNDS = 2
STOP_WAIT_S = 2.0
# The share of warm rounds disturbed by another process's load from which the load is taken as
# the machine's state: rounds whose every turn saw it are then kept.
STEADY_LOAD_SHARE = 0.75
# A turn: at least this many optimizer steps and seconds, long enough for the host clock and
# the synchronisation at its edges to vanish, short enough for a pair every second or so.
TURN_STEPS = 1
TURN_SECONDS = 0.5


class WarmUnavailable(RunFailed):
    """A warm process did not start or stopped answering: fresh rounds instead."""


class WarmRunEnded(WarmUnavailable):
    """A script's own run ended during its warm process's turn: another may take its place."""


class WarmOutOfTime(WarmUnavailable):
    """The run's time budget ended before the warm processes were ready: no round fits, fresh
    or warm."""


def _wait_s(time_limit_s: float, ends_by: float | None) -> float:
    """How long to wait for a warm process: its time limit, cut at the budget's end."""
    if ends_by is None:
        return time_limit_s
    left = ends_by - time.monotonic()
    if left <= 0:
        raise WarmOutOfTime("the run's time budget ended before the warm processes were ready")
    return min(time_limit_s, left)


def turn_seconds(step_s: float | None) -> float:
    """What one turn takes: `TURN_STEPS` steps of `step_s`, at least `TURN_SECONDS`."""
    return max(TURN_SECONDS, TURN_STEPS * (step_s or 0.0))


def turn_price_s(config: TrainConfig | None, measured: Measurement | None) -> float:
    """What one warm turn of `config` takes, from its search trial's figures (`measured`; the
    least turn where there are none): `turn_seconds` of its step; with loader workers, the
    untimed steps that drain what they queued (`protocol.prefetched_steps`, each the step less
    its wait for data), and, where its window waited on them (`protocol.LOADER_BOUND_SHARE`),
    the batches of each a turn then spans (`protocol.loader_turn_steps`), within the turn's
    cap."""
    step_s = measured.step_time_median_s if measured else None
    least = turn_seconds(step_s)
    if measured is None or not step_s or config is None or not config.num_workers:
        return least
    waits = measured.data_wait_fraction or 0.0
    timed = least
    if waits >= LOADER_BOUND_SHARE:
        timed = max(least, min(TURN_SECONDS * LOADER_TURN_SLACK,
                               loader_turn_steps(config) * step_s))
    return timed + prefetched_steps(config) * step_s * (1 - waits)


class PairJudge:
    """Which rounds of warm turns are pairs: every turn clean; or, on a machine busy in most
    rounds so far (`STEADY_LOAD_SHARE`: a load that stays), every turn under the load. A round
    where a load fell on some turns (a load that comes and goes by the second: a compile, an
    install beside the run) is taken again: with steps several times slower under a load on
    2 cores, a turn half under it would decide the interval."""

    def __init__(self) -> None:
        self.rounds = self.disturbed = 0

    def keeps(self, runs: Sequence[Run | None]) -> bool:
        flags = {run.disturbed for run in runs if run is not None}
        self.rounds += 1
        self.disturbed += True in flags
        if flags <= {False}:
            return True
        return flags == {True} and self.disturbed >= STEADY_LOAD_SHARE * self.rounds


def memory_holds(peaks: Sequence[float | None], capacity: int | None) -> bool:
    """Whether a device of `capacity` bytes holds a warm process of each peak at once: every
    peak known, and their sum within `MEMORY_HEADROOM` of it."""
    if capacity is None or not peaks or any(not peak for peak in peaks):
        return False
    return sum(peaks) <= capacity * MEMORY_HEADROOM


def device_capacity(device: str, memory_limit_bytes: int | None) -> int | None:
    """The memory the warm processes share: the trial's limit where one is set (the machine
    the user tunes for), else the GPU's memory, or the host memory available now on CPU."""
    if memory_limit_bytes:
        return memory_limit_bytes
    torch_device = torch.device(device)
    if torch_device.type == "cuda":
        return describe(torch_device).total_memory_bytes
    return host_available_memory()


class _WarmProcess:
    """One warm process and its channel: a process forked by the fork server and its socket, a
    new interpreter and its two pipes, or a process group's ranks started by torchrun, whose
    rank 0 reads and answers the pipes (`trial.warm`)."""

    def __init__(self, request: TrialRequest, log: Path, time_limit_s: float,
                 ends_by: float | None = None, server: ForkServer | None = None) -> None:
        wait_s = _wait_s(time_limit_s, ends_by)
        device, device_env = launch_device(request)
        handle, name = tempfile.mkstemp(prefix="autotune-warm-", suffix=".json")
        os.close(handle)
        self.request_file = Path(name)
        # A script works in a scratch folder (its current directory), removed with the process
        self.scratch = Path(tempfile.mkdtemp(prefix="autotune-warm-script-")) \
            if request.target.works_in_scratch else None
        request = replace(request, device=device,
                          scratch_dir=str(self.scratch) if self.scratch else None,
                          trace_path=absolute_path(request.trace_path),
                          inductor_cache_dir=absolute_path(request.inductor_cache_dir))
        self.request_file.write_text(json.dumps({**request.to_json(), "parent_pid": os.getpid()}))
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        forked = None
        if server is not None and request.nproc_per_node == 1:
            with contextlib.suppress(ForkServerUnavailable):
                forked = self._fork(server, {**TRIAL_ENVIRONMENT, **device_env}, wait_s)
        if forked is not None:
            self.process, self._commands, self._answers = forked
        else:
            command = [sys.executable, "-c",
                       "from autotune.trial.warm import warm_main; warm_main()",
                       str(self.request_file)]
            if request.nproc_per_node > 1:
                command = group_command(request, "autotune.trial.warm", str(self.request_file))
                device_env = {**group_environment(request), **device_env}
            with open(log, "ab") as log_file:
                self.process = subprocess.Popen(
                    command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file,
                    start_new_session=True, text=True,
                    env={**os.environ, "PYTHONUNBUFFERED": "1", **device_env})
            self._commands, self._answers = self.process.stdin, self.process.stdout
        try:
            ready = self._answer(wait_s, ends_by)
            if not ready.get("ready"):
                raise WarmUnavailable(f"{ready.get('error', 'no answer')} (log: {self.log})")
            said = ready.get("script_answer")
            # a script's configuration in its own terms, as its trial's measurement has it
            self.script_answer = ScriptAnswer.from_json(said) if said else None
        except BaseException:
            self.close()
            raise

    def _fork(self, server: ForkServer, env: dict[str, str],
              wait_s: float) -> tuple[ForkedChild, IO[str], IO[str]]:
        """Forked by `server`, connected to a socket of its own (a forked child has no pipe to
        this process); ForkServerUnavailable where the server cannot fork it."""
        folder = Path(tempfile.mkdtemp(prefix="autotune-warm-channel-"))
        try:
            with socket.socket(socket.AF_UNIX) as listener:
                listener.bind(str(folder / "channel"))
                listener.listen(1)
                child = server.fork(self.request_file, folder / "result.json", self.log, env,
                                    channel=str(folder / "channel"))
                deadline = time.monotonic() + wait_s
                while not select.select([listener], [], [], 0.1)[0]:
                    if child.poll() is not None or time.monotonic() > deadline:
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(child.pid, signal.SIGKILL)
                        raise ForkServerUnavailable("the forked warm process never connected")
                connection, _ = listener.accept()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        with connection:  # the files hold the socket open
            return (child, connection.makefile("w", buffering=1, encoding="utf-8"),
                    connection.makefile("r", encoding="utf-8"))

    def turn(self, time_limit_s: float) -> WarmTurn:
        self._send({"steps": TURN_STEPS, "seconds": TURN_SECONDS})
        answer = self._answer(time_limit_s)
        if "error" in answer:
            stopped = WarmRunEnded if answer.get("ended") else WarmUnavailable
            raise stopped(f"{answer['error']} (log: {self.log})")
        return WarmTurn.from_json(answer)

    def trace(self, path: Path, time_limit_s: float) -> str:
        """A profiler trace of a few of its steps, written to `path`."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self._send({"trace": str(path)})
        answer = self._answer(time_limit_s)
        if "error" in answer:
            raise WarmUnavailable(f"{answer['error']} (log: {self.log})")
        return answer["trace"]

    def _send(self, message: object) -> None:
        try:
            self._commands.write(json.dumps(message) + "\n")
            self._commands.flush()
        except (BrokenPipeError, OSError) as exc:
            raise WarmUnavailable(f"the warm process is gone (log: {self.log})") from exc

    def _answer(self, time_limit_s: float, ends_by: float | None = None) -> dict:
        """The next line it says, within the time limit (it says one line per request and
        then waits, so nothing is ever left in the pipe's buffer behind `select`'s back); a
        wait cut at the budget's end `ends_by` that runs out is `WarmOutOfTime`."""
        ready, _, _ = select.select([self._answers], [], [], time_limit_s)
        line = self._answers.readline() if ready else ""
        if not ready and ends_by is not None and time.monotonic() >= ends_by:
            raise WarmOutOfTime("the run's time budget ended while a warm process warmed up "
                                f"(log: {self.log})")
        if not line:
            what = "no answer within the time limit" if not ready else "it exited"
            raise WarmUnavailable(f"the warm process stopped: {what} (log: {self.log})")
        return json.loads(line)

    def close(self) -> None:
        """`stop`, then its whole process group killed (DataLoader workers too)."""
        with contextlib.suppress(WarmUnavailable):
            self._send("stop")
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_WAIT_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        for channel in (self._commands, self._answers):
            with contextlib.suppress(OSError):
                channel.close()
        self.request_file.unlink(missing_ok=True)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


class WarmRounds:
    """One warm process per configuration, started one after another (each warms up alone),
    then each given one turn that is not counted: the first ones warmed up, then waited idle
    while the others did. `turn(i)` times configuration i once more and gives the `Run` a
    fresh round would. None is waited for past `ends_by` (a time budget's end)."""

    def __init__(self, requests: Sequence[TrialRequest], logs: Sequence[Path],
                 time_limit_s: float, ends_by: float | None = None,
                 server: ForkServer | None = None) -> None:
        self.time_limit_s = time_limit_s
        self._starts = list(zip(requests, logs))
        self._ends_by, self._server = ends_by, server
        self.processes: list[_WarmProcess | None] = []
        self.restarts = 0  # processes started again as their script's own run ended
        try:
            for request, log in self._starts:
                self.processes.append(_WarmProcess(request, log, time_limit_s, ends_by,
                                                   server))
            for index in range(len(self.processes)):
                self._turn(index)
        except BaseException:
            self.close()
            raise

    def _turn(self, index: int) -> WarmTurn:
        """Configuration i's next turn; where its script's own run ended during it (its epochs
        ran out: an Ignite script's 10 epochs lasted 17 rounds), a new process of it in its
        place, settled by a turn, then the turn again: once, as a run that ends again at once
        is too short to take turns."""
        process = self.processes[index]
        assert process is not None
        try:
            return process.turn(self.time_limit_s)
        except WarmRunEnded:
            process.close()
            self.processes[index] = None
            self.restarts += 1
        request, log = self._starts[index]
        self.processes[index] = process = _WarmProcess(request, log, self.time_limit_s,
                                                       self._ends_by, self._server)
        process.turn(self.time_limit_s)
        return process.turn(self.time_limit_s)

    def turn(self, index: int) -> Run | None:
        """A turn's figures as a run; None when its loss stopped being finite (diverged)."""
        turn = self._turn(index)
        if not turn.loss_finite:
            return None
        return Run(status=TrialStatus.OK.value, samples_per_sec=turn.samples_per_sec,
                   objective=turn.samples_per_sec, peak_memory_bytes=turn.peak_memory_bytes,
                   mfu=turn.mfu, disturbed=turn.disturbed, load=turn.load)

    def trace(self, index: int, path: Path) -> str:
        """Configuration i's profiler trace, written to `path` (a fresh round's first run
        leaves one; a turn does not)."""
        return self.processes[index].trace(path, self.time_limit_s)

    def script_answer(self, index: int) -> ScriptAnswer | None:
        """Configuration i in its script's own terms (a script's warm process says it when
        ready; a model file's has none)."""
        process = self.processes[index]
        return process.script_answer if process is not None else None

    def release(self, index: int) -> None:
        """End configuration i's process (no later turn needs it): its memory is freed."""
        process, self.processes[index] = self.processes[index], None
        if process is not None:
            process.close()

    def close(self) -> None:
        for process in self.processes:
            if process is not None:
                process.close()
        self.processes = []


@dataclass(frozen=True)
class WarmStart:
    """What the confirmation and `verify` are handed: how to start warm processes for some
    configurations (a log-name prefix, the budget's end or None), and the memory they share."""

    start: Callable[[Sequence[TrainConfig], str, float | None], WarmRounds]
    capacity: int | None


def warm_start(runner: ProcessRunner, device: str, time_limit_s: float) -> WarmStart:
    """Warm processes for `runner`'s model file or training script on `device` (its settings,
    threads and memory limit; a script's own loop pausing between turns; a process group's
    ranks pausing together), forked from its trials' fork server where one runs. On CPU a
    group's ranks share the host's memory, so each group counts as many peaks as it has
    ranks."""
    ranks = runner.nproc_per_node

    def start(configs: Sequence[TrainConfig], prefix: str, ends_by: float | None) -> WarmRounds:
        jobs = [MeasureJob(f"{prefix}-warm-{i}", time_limit_s, device, profile=False)
                for i in range(len(configs))]
        return WarmRounds([runner.request(c, j) for c, j in zip(configs, jobs)],
                          [runner.directory / "logs" / f"{j.name}.log" for j in jobs],
                          time_limit_s, ends_by,
                          runner.fork_server(time_limit_s) if ranks == 1 else None)

    capacity = device_capacity(device, runner.memory_limit_bytes)
    if capacity is not None and torch.device(device).type == "cpu":
        capacity //= ranks
    return WarmStart(start, capacity)


def warm_or_why(warm: WarmStart | None, configs: Sequence[TrainConfig],
                peaks: Sequence[float | None], prefix: str,
                running: Sequence[float | None] = (),
                ends_by: float | None = None) -> tuple[WarmRounds | None, str]:
    """Warm processes for `configs`, or None; and, in one note, which it is and why. The
    memory must hold them beside those `running` already (their peaks). Past `ends_by` (a
    time budget's end) `WarmOutOfTime` is raised: fresh rounds would not fit either."""
    if warm is None:
        return None, "measuring in fresh-process rounds: warm processes do not run here"
    if not memory_holds([*running, *peaks], warm.capacity):
        peaks = [*running, *peaks]
        need = f"about {sum(p or 0 for p in peaks) / 2**30:.1f} GiB together (their search " \
            "peaks)" if all(peaks) else "memory their search trials did not measure"
        room = f"{warm.capacity / 2**30:.1f} GiB" if warm.capacity else "an unknown amount"
        return None, (f"measuring in fresh-process rounds: {len(peaks)} warm processes "
                      f"would need {need}, and the device has {room} for them")
    began = time.monotonic()
    try:
        rounds = warm.start(configs, prefix, ends_by)
    except WarmOutOfTime:
        raise
    except (WarmUnavailable, OSError) as exc:
        return None, f"measuring in fresh-process rounds: a warm process did not start: {exc}"
    return rounds, (f"measuring in {WARM_TURNS}: {_processes(len(configs))} warmed up in "
                    f"{time.monotonic() - began:.0f} s, each now timed in turns of "
                    f"{TURN_SECONDS:g} s" + (" (longer where one waits on its loader's workers)"
                                             if any(c.num_workers for c in configs) else ""))


def _processes(count: int) -> str:
    return f"{count} process{'es' if count != 1 else ''}"


class WarmPool:
    """Warm processes by configuration, kept from one race of the confirmation to the next
    (the race, then the short races of the changes taken back): a later race starts only the
    configurations it lacks, after ending those it no longer needs, so that a compiled
    configuration is not built again for each. After a process stops, no more are started."""

    def __init__(self, warm: WarmStart) -> None:
        self.warm = warm
        self.live: dict[str, tuple[WarmRounds, int, float | None]] = {}
        self.start_s = 0.0  # one process's start, the mean over those started so far
        self.started = 0
        self.broken = False

    def room_for(self, peaks: Sequence[float | None],
                 staying: Collection[TrainConfig] | None = None) -> int:
        """How many of `peaks`, the first first, the memory holds beside the warm processes'
        (those of `staying` alone, where given: the rest end before the new ones start)."""
        kept = None if staying is None else {config_key(c) for c in staying}
        running = [peak for key, (_, _, peak) in self.live.items() if kept is None or key in kept]
        return next((n for n in range(len(peaks), 0, -1)
                     if memory_holds([*running, *peaks[:n]], self.warm.capacity)), 0)

    def turns(self, configs: Sequence[TrainConfig], peaks: Sequence[float | None],
              prefix: str, ends_by: float | None = None,
              skip: Collection[int] = ()) -> tuple[WarmTurns | None, str]:
        """A warm process for each of `configs` but those of `skip` (those already warm kept,
        given one turn that is not counted: they waited while the new ones started), or None;
        and, in one note, which it is and why. `WarmOutOfTime` where the budget ends
        (`ends_by`) first."""
        if self.broken:
            return None, "measuring in fresh-process rounds: a warm process stopped earlier"
        keys = [config_key(c) for c in configs]
        wanted = [key for i, key in enumerate(keys) if i not in skip]
        for key in [k for k in self.live if k not in wanted]:
            rounds, index, _ = self.live.pop(key)
            rounds.release(index)
        new = [i for i, key in enumerate(keys) if i not in skip and key not in self.live]
        kept = len(wanted) - len(new)
        why = f"measuring in {WARM_TURNS}: {_processes(kept)} still warm"
        if new:
            began = time.monotonic()
            try:
                started, why = warm_or_why(
                    self.warm, [configs[i] for i in new], [peaks[i] for i in new], prefix,
                    running=[self.live[k][2] for k in wanted if k in self.live],
                    ends_by=ends_by)
            except WarmOutOfTime:
                self.close()
                raise
            if started is None:
                self.close()
                return None, why
            self.start_s = (self.start_s * self.started + time.monotonic() - began) / \
                (self.started + len(new))
            self.started += len(new)
            for j, i in enumerate(new):
                self.live[keys[i]] = (started, j, peaks[i])
            if kept:
                why += f" ({kept} more still warm)"
        try:
            for i, key in enumerate(keys):
                if i not in new and i not in skip:
                    rounds, index, _ = self.live[key]
                    rounds.turn(index)
        except WarmUnavailable as exc:
            self.close()
            return None, f"measuring in fresh-process rounds: a warm process stopped: {exc}"
        return WarmTurns(self, [None if i in skip else self.live[k][:2]
                                for i, k in enumerate(keys)]), why

    def close(self) -> None:
        for rounds in {id(r): r for r, _, _ in self.live.values()}.values():
            rounds.close()
        self.live = {}


class WarmTurns:
    """The warm processes one race of the confirmation takes turns of, in its entries' order
    (`WarmPool.turns`): `turn(i)` gives entry i's `Run`."""

    def __init__(self, pool: WarmPool,
                 slots: Sequence[tuple[WarmRounds, int] | None]) -> None:
        self.pool, self.slots = pool, list(slots)

    def racing(self) -> list[int]:
        """The entries with a warm process (not those the pool was told to skip)."""
        return [i for i, slot in enumerate(self.slots) if slot is not None]

    def turn(self, index: int) -> Run | None:
        rounds, i = self._slot(index)
        return rounds.turn(i)

    def trace(self, index: int, path: Path) -> str:
        rounds, i = self._slot(index)
        return rounds.trace(i, path)

    def script_answer(self, index: int) -> ScriptAnswer | None:
        rounds, i = self._slot(index)
        return rounds.script_answer(i)

    def restarts(self) -> int:
        """How many of these processes have been started again so far, their script's own run
        ended during a turn (`WarmRounds._turn`)."""
        return sum({id(rounds): rounds.restarts for rounds, _ in filter(None, self.slots)
                    }.values())

    def _slot(self, index: int) -> tuple[WarmRounds, int]:
        slot = self.slots[index]
        if slot is None:
            raise WarmUnavailable(f"entry {index} has no warm process")
        return slot

    def close(self) -> None:
        """A process stopped: warm turns end for the rest of the confirmation."""
        self.pool.broken = True
        self.pool.close()
