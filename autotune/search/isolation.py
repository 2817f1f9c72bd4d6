"""The tuner's side of one trial = one process: start it, wait with a time limit, and turn
however it ended into a `TrialResult`; never raises for anything the trial does.

The parent writes the request file, starts the child in its own session (so a Ctrl-C or a crash
on either side cannot take the other down), captures its output to a log file and waits. The
child is a new interpreter running `autotune.trial.child` or, when the tuner runs a
`forkserver.ForkServer`, a fork of a process that has already imported torch and the model file;
both end the same ways. The child classifies its own exceptions and writes a result file
atomically; a child that dies without one is a `crash`, one that runs past its limit is killed
with its whole process group (DataLoader workers included) and is a `timeout`. No model file is
ever imported here: user code runs only in children.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import IO

from autotune.hardware import trial_device
from autotune.search.forkserver import ForkedChild, ForkServer, ForkServerUnavailable
from autotune.trial.protocol import TrialRequest, TrialResult, TrialStatus

Child = subprocess.Popen | ForkedChild


def run_isolated(request: TrialRequest, time_limit_s: float = 600.0,
                 log_path: str | Path | None = None,
                 on_phase: Callable[[str], None] | None = None,
                 stop: threading.Event | None = None,
                 server: ForkServer | None = None) -> TrialResult:
    """Run `request` in a fresh process (forked from `server` when one is given and alive);
    never raises for anything the child does.

    Setting `stop` (from another thread) kills the child and raises KeyboardInterrupt here,
    as Ctrl-C does in the main thread.
    """
    # The child sees its GPU alone, as cuda:0 (`hardware.trial_device`).
    device, device_env = trial_device(request.device, os.environ)
    request = replace(request, device=device)
    workdir = Path(tempfile.mkdtemp(prefix="autotune-trial-"))
    log = Path(log_path) if log_path else workdir / "trial.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    request_file, result_file, phase_file = (workdir / n for n in
                                             ("request.json", "result.json", "phase"))
    start = time.monotonic()
    with open(log, "ab") as log_file:
        child = _start(request, request_file, result_file, phase_file, log, log_file, server,
                       device_env)
        try:
            timed_out, phase = _wait(child, start + time_limit_s, phase_file, on_phase, stop)
        except BaseException:
            _kill_group(child)
            raise
    wall = time.monotonic() - start
    if timed_out:
        where = f" (in: {phase})" if phase else ""
        result = TrialResult(TrialStatus.TIMEOUT, f"still running after the {time_limit_s:g} s "
                             f"limit{where}; killed with its worker processes")
    elif result_file.exists():
        result = TrialResult(**json.loads(result_file.read_text()))
    elif child.returncode < 0:
        name = signal.Signals(-child.returncode).name
        hint = " (possibly the kernel's OOM killer)" if name == "SIGKILL" else ""
        result = TrialResult(TrialStatus.CRASH, f"killed by {name}{hint}")
    else:
        result = TrialResult(TrialStatus.CRASH, f"exited with code {child.returncode} and no "
                             f"result; see {log}")
    for scratch in (request_file, result_file, phase_file):
        scratch.unlink(missing_ok=True)
    if not any(workdir.iterdir()):
        workdir.rmdir()
    result.log_path, result.wall_s, result.returncode = str(log), wall, child.returncode
    result.phase = phase
    return result


def _start(request: TrialRequest, request_file: Path, result_file: Path, phase_file: Path,
           log: Path, log_file: IO[bytes], server: ForkServer | None,
           device_env: dict[str, str]) -> Child:
    """The child, forked from the server while it lives, else a new interpreter."""
    env = {"PYTHONUNBUFFERED": "1", **device_env}
    if server is not None:
        request_file.write_text(json.dumps({**asdict(request), "parent_pid": server.pid,
                                            "phase_file": str(phase_file)}))
        with contextlib.suppress(ForkServerUnavailable):
            return server.fork(request_file, result_file, log, env)
    request_file.write_text(json.dumps({**asdict(request), "parent_pid": os.getpid(),
                                        "phase_file": str(phase_file)}))
    command = [sys.executable, "-c", "from autotune.trial.child import child_main; child_main()",
               str(request_file), str(result_file)]
    return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, **env})


def _wait(child: Child, deadline: float, phase_file: Path,
          on_phase: Callable[[str], None] | None,
          stop: threading.Event | None) -> tuple[bool, str]:
    """Poll the child until it exits or the deadline passes; report phase changes. Returns
    whether it timed out, and its last phase."""
    phase = ""
    while child.poll() is None:
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt
        if time.monotonic() > deadline:
            _kill_group(child)
            return True, _last_phase(phase_file, phase)
        current = _last_phase(phase_file, phase)
        if current != phase:
            phase = current
            if on_phase is not None:
                on_phase(phase)
        time.sleep(0.1)
    _kill_group(child)
    return False, _last_phase(phase_file, phase)


def _last_phase(phase_file: Path, known: str) -> str:
    """The phase the child wrote last (it may have moved on since the last poll)."""
    current = phase_file.read_text().strip() if phase_file.exists() else ""
    return current or known


def _kill_group(child: Child) -> None:
    """Kill the child and everything it started (DataLoader workers, compile workers)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
