"""The tuner's side of one trial = one process: start it, wait with a time limit, and turn
however it ended into a `TrialResult`; never raises for anything the trial does.

The parent writes the request file, starts the child in its own session (so a Ctrl-C or a crash
on either side cannot take the other down), captures its output to a log file and waits. The
child is a new interpreter running `autotune.trial.child` or, when the tuner runs a
`forkserver.ForkServer`, a fork of a process that has already imported torch and the model file;
both end the same ways. The child classifies its own exceptions and writes a result file
atomically; a child that dies without one is a `crash`, one that runs past its limit is killed
with its whole process group (DataLoader workers included) and is a `timeout`. No model file is
ever imported here: user code runs only in children. A training script's run works in a scratch
folder inside the trial's folder in the temp directory; that folder goes however the trial
ends, a timeout or an interruption included.

A trial of a process group (`nproc_per_node` > 1) is PyTorch's own launcher,
`python -m torch.distributed.run --standalone`, starting that many ranks of the child (never
forked: each rank is a fresh interpreter); the tuner never joins the group. Each rank writes its
result and its pid; the trial's result is the first rank's failure (OOM, error...) naming the
rank, else rank 0's figures, which cover the group. A time limit, a Ctrl-C or a finished trial
kills the launcher's process group and every rank's (their DataLoader workers with them).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import IO

from autotune.hardware import group_device_env, trial_device
from autotune.search.forkserver import (
    TRIAL_ENVIRONMENT,
    ForkedChild,
    ForkServer,
    ForkServerUnavailable,
)
from autotune.trial.protocol import (
    TrialRequest,
    TrialResult,
    TrialStatus,
    rank_pid_path,
    rank_result_path,
)

Child = subprocess.Popen | ForkedChild
# Told the child's phase and its seconds so far at every poll: True ends it as a timeout.
Watch = Callable[[str, float], bool]
# How a rank's result reads when its collective failed because another rank went away: torch's
# distributed errors, and gloo's transport errors (raised as plain RuntimeErrors).
COLLECTIVE_ERRORS = ("DistError", "DistBackendError", "DistNetworkError", "DistStoreError")
PEER_GONE = ("gloo/transport", "Connection reset by peer", "Connection closed by peer")


def run_isolated(request: TrialRequest, time_limit_s: float = 600.0,
                 log_path: str | Path | None = None,
                 on_phase: Callable[[str], None] | None = None,
                 stop: threading.Event | None = None,
                 server: ForkServer | None = None,
                 watch: Watch | None = None) -> TrialResult:
    """Run `request` in a fresh process (forked from `server` when one is given and alive);
    never raises for anything the child does.

    Setting `stop` (from another thread) kills the child and raises KeyboardInterrupt here,
    as Ctrl-C does in the main thread. `watch` is told the child's phase and seconds so far at
    every poll; True ends the child as a timeout. The trial's files in the temp directory (and
    a script's scratch folder) are removed however it ends, an interruption included.
    """
    device, device_env = launch_device(request)
    workdir = Path(tempfile.mkdtemp(prefix="autotune-trial-"))
    scratch = workdir / "scratch"
    # A script works in a scratch folder (its current directory): the paths it is given
    # must not depend on the current directory.
    request = replace(request, device=device, trace_path=absolute_path(request.trace_path),
                      inductor_cache_dir=absolute_path(request.inductor_cache_dir),
                      scratch_dir=str(scratch) if request.target.works_in_scratch else None)
    log = Path(log_path) if log_path else workdir / "trial.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    request_file, result_file, phase_file = (workdir / n for n in
                                             ("request.json", "result.json", "phase"))
    ranks = request.nproc_per_node
    start = time.monotonic()
    try:
        with open(log, "ab") as log_file:
            child = _start(request, request_file, result_file, phase_file, log, log_file,
                           server, device_env)
            try:
                timed_out, phase = _wait(child, start, time_limit_s, phase_file, on_phase,
                                         stop, result_file, ranks, watch)
            except BaseException:
                _kill_group(child, result_file, ranks)
                raise
        wall = time.monotonic() - start
        rank_results = _rank_results(result_file, ranks) if ranks > 1 else []
        missing = [r for r in range(ranks) if not rank_result_path(result_file, r).exists()] \
            if ranks > 1 else []
        if timed_out:
            where = f" (in: {phase})" if phase else ""
            every = f"all {ranks} ranks" if ranks > 1 else "its worker processes"
            result = TrialResult(TrialStatus.TIMEOUT, f"still running after the "
                                 f"{time_limit_s:g} s limit{where}; killed with {every}")
        elif ranks > 1:
            result = _group_result(rank_results, missing, ranks, child.returncode, log)
        elif result_file.exists():
            result = TrialResult.from_json(json.loads(result_file.read_text()))
        elif child.returncode < 0:
            name = signal.Signals(-child.returncode).name
            hint = " (possibly the kernel's OOM killer)" if name == "SIGKILL" else ""
            result = TrialResult(TrialStatus.CRASH, f"killed by {name}{hint}")
        else:
            result = TrialResult(TrialStatus.CRASH, f"exited with code {child.returncode} and "
                                 f"no result; see {log}")
    finally:
        _remove_trial_files(workdir, log)
    return replace(result, log_path=str(log), wall_s=wall, returncode=child.returncode,
                   phase=phase)


def launch_device(request: TrialRequest) -> tuple[str, dict[str, str]]:
    """The device a trial's process is told, and the environment that makes it so: its GPU
    alone, as cuda:0 (`hardware.trial_device`); a process group's ranks each their own GPU,
    of its devices or of all this process sees."""
    if request.nproc_per_node == 1:
        return trial_device(request.device, os.environ)
    if request.group_devices:
        return "cuda", group_device_env(request.group_devices, os.environ)
    return request.device, {}


def group_command(request: TrialRequest, module: str, *args: str) -> list[str]:
    """torchrun starting `module` as each of the request's ranks: standalone on this node (a
    free port of its own, so groups run side by side), no restarts: a rank that fails ends
    them all."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={request.nproc_per_node}", "--max-restarts=0",
            "--monitor-interval=0.2", "-m", module, *args]


def group_environment(request: TrialRequest) -> dict[str, str]:
    """On CPU a group's ranks start with one OpenMP thread each, as torchrun would set it
    (`child.place_rank` then gives each as many as its share of the cores)."""
    return {"OMP_NUM_THREADS": "1"} if request.device == "cpu" else {}


def absolute_path(path: str | None) -> str | None:
    """A path the process may use from another current directory (a script's scratch)."""
    return os.path.abspath(path) if path else path


def _remove_trial_files(workdir: Path, log: Path) -> None:
    """The trial's folder in the temp directory goes, unless its log is there (a run given no
    log path keeps it: the result names it)."""
    if workdir in log.parents:
        for entry in workdir.iterdir():
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            elif entry != log:
                entry.unlink(missing_ok=True)
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def _start(request: TrialRequest, request_file: Path, result_file: Path, phase_file: Path,
           log: Path, log_file: IO[bytes], server: ForkServer | None,
           device_env: dict[str, str]) -> Child:
    """The child, forked from the server while it lives, else a new interpreter; a process
    group's ranks through torchrun."""
    env = {**TRIAL_ENVIRONMENT, **device_env}
    if request.nproc_per_node > 1:
        return _start_group(request, request_file, result_file, phase_file, log_file, env)
    if server is not None:
        request_file.write_text(json.dumps({**request.to_json(), "parent_pid": server.pid,
                                            "phase_file": str(phase_file)}))
        with contextlib.suppress(ForkServerUnavailable):
            return server.fork(request_file, result_file, log, env)
    request_file.write_text(json.dumps({**request.to_json(), "parent_pid": os.getpid(),
                                        "phase_file": str(phase_file)}))
    command = [sys.executable, "-c", "from autotune.trial.child import child_main; child_main()",
               str(request_file), str(result_file)]
    return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, **env})


def _start_group(request: TrialRequest, request_file: Path, result_file: Path,
                 phase_file: Path, log_file: IO[bytes], env: dict[str, str]) -> Child:
    """The group's ranks of the child, through torchrun (`group_command`)."""
    request_file.write_text(json.dumps({**request.to_json(), "parent_pid": os.getpid(),
                                        "phase_file": str(phase_file)}))
    command = group_command(request, "autotune.trial.child", str(request_file),
                            str(result_file))
    return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, **group_environment(request), **env})


def _group_result(results: list[TrialResult], missing: list[int], ranks: int,
                  returncode: int | None, log: Path) -> TrialResult:
    """A process group's trial from its ranks': the first rank that failed on its own (a rank
    whose collective failed because a peer died is only a consequence), else a rank that died
    without a result, else rank 0's figures, which cover the group."""
    failed = sorted((r for r in results if r.status != TrialStatus.OK),
                    key=lambda r: (_from_a_peer(r), r.ended_at or 0.0))
    if failed and not (_from_a_peer(failed[0]) and missing):
        first = failed[0]
        return replace(first, message=f"rank {first.rank} of {ranks}: {first.message}")
    if missing:
        return TrialResult(TrialStatus.CRASH, f"rank {missing[0]} of {ranks} died with no result "
                           f"(torchrun exited with code {returncode}); see {log}")
    return next(r for r in results if r.rank == 0)


def _from_a_peer(result: TrialResult) -> bool:
    """A failure torch.distributed raised in a collective: another rank went away."""
    return result.message.startswith(COLLECTIVE_ERRORS) or \
        any(text in result.message for text in PEER_GONE)


def _rank_results(result_file: Path, ranks: int) -> list[TrialResult]:
    return [TrialResult.from_json(json.loads(path.read_text())) for path in
            (rank_result_path(result_file, r) for r in range(ranks)) if path.exists()]


def _wait(child: Child, start: float, time_limit_s: float, phase_file: Path,
          on_phase: Callable[[str], None] | None, stop: threading.Event | None,
          result_file: Path, ranks: int, watch: Watch | None) -> tuple[bool, str]:
    """Poll the child until it exits, the time limit passes or `watch` ends it; report phase
    changes. Returns whether it timed out, and its last phase."""
    phase = ""
    while child.poll() is None:
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt
        elapsed = time.monotonic() - start
        current = _last_phase(phase_file, phase)
        if elapsed > time_limit_s or (watch is not None and watch(current, elapsed)):
            _kill_group(child, result_file, ranks)
            return True, current
        if current != phase:
            phase = current
            if on_phase is not None:
                on_phase(phase)
        time.sleep(0.1)
    _kill_group(child, result_file, ranks)
    return False, _last_phase(phase_file, phase)


def _last_phase(phase_file: Path, known: str) -> str:
    """The phase the child wrote last (it may have moved on since the last poll)."""
    current = phase_file.read_text().strip() if phase_file.exists() else ""
    return current or known


def _kill_group(child: Child, result_file: Path, ranks: int) -> None:
    """Kill the child and everything it started (DataLoader workers, compile workers); of a
    process group, every rank too: torchrun starts each in a session of its own."""
    groups = [child.pid]
    for rank in range(ranks if ranks > 1 else 0):
        with contextlib.suppress(OSError, ValueError):
            groups.append(int(rank_pid_path(result_file, rank).read_text()))
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    child.wait()
