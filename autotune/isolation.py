"""One trial = one fresh process with a time limit; whatever happens comes back as a result.

The parent writes a request file, starts `python -c ...child_main()` in its own session (so a
Ctrl-C or a crash on either side cannot take the other down), captures its output to a log file
and waits. The child measures, classifies its own exceptions (OOM, bad input, unsupported,
error) and writes a result file atomically; a child that dies without one is a `crash`, one that
runs past its limit is killed with its whole process group (DataLoader workers included) and is
a `timeout`. A child whose parent died exits by itself within a couple of seconds, so it never
keeps holding a GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("ok", "oom", "timeout", "crash", "error", "unsupported")
OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory",
               "failed to allocate memory")


@dataclass
class TrialRequest:
    """Everything a child needs to measure one configuration; plain JSON data."""

    model_path: str
    config: dict[str, Any]
    device: str
    model_args: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    memory_limit_bytes: int | None = None
    trace_path: str | None = None
    threads: int | None = None
    cpus: list[int] | None = None  # pinned to these CPUs (parallel CPU trials)
    inductor_cache_dir: str | None = None


@dataclass
class TrialResult:
    """What became of one trial. `bad_input` marks a contract or config error of the user's."""

    status: str
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    log_path: str | None = None
    wall_s: float = 0.0
    bad_input: bool = False
    returncode: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_isolated(request: TrialRequest, time_limit_s: float = 600.0,
                 log_path: str | Path | None = None,
                 on_phase: Callable[[str], None] | None = None,
                 stop: threading.Event | None = None) -> TrialResult:
    """Measure `request` in a fresh process; never raises for anything the child does.

    Setting `stop` (from another thread) kills the child and raises KeyboardInterrupt here,
    as Ctrl-C does in the main thread.
    """
    workdir = Path(tempfile.mkdtemp(prefix="autotune-trial-"))
    log = Path(log_path) if log_path else workdir / "trial.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    request_file, result_file, phase_file = (workdir / n for n in
                                             ("request.json", "result.json", "phase"))
    request_file.write_text(json.dumps({**asdict(request), "parent_pid": os.getpid(),
                                        "phase_file": str(phase_file)}))
    command = [sys.executable, "-c", "from autotune.isolation import child_main; child_main()",
               str(request_file), str(result_file)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    with open(log, "ab") as log_file:
        child = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        try:
            timed_out = _wait(child, start + time_limit_s, phase_file, on_phase, stop)
        except BaseException:
            _kill_group(child)
            raise
    wall = time.monotonic() - start
    if timed_out:
        result = TrialResult("timeout", f"still running after the {time_limit_s:g} s limit; "
                             "killed with its worker processes")
    elif result_file.exists():
        result = TrialResult(**json.loads(result_file.read_text()))
    elif child.returncode < 0:
        name = signal.Signals(-child.returncode).name
        hint = " (possibly the kernel's OOM killer)" if name == "SIGKILL" else ""
        result = TrialResult("crash", f"killed by {name}{hint}")
    else:
        result = TrialResult("crash", f"exited with code {child.returncode} and no result; "
                             f"see {log}")
    for scratch in (request_file, result_file, phase_file):
        scratch.unlink(missing_ok=True)
    if not any(workdir.iterdir()):
        workdir.rmdir()
    result.log_path, result.wall_s, result.returncode = str(log), wall, child.returncode
    return result


def _wait(child: subprocess.Popen, deadline: float, phase_file: Path,
          on_phase: Callable[[str], None] | None, stop: threading.Event | None) -> bool:
    """Poll the child until it exits or the deadline passes; report phase changes."""
    phase = ""
    while child.poll() is None:
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt
        if time.monotonic() > deadline:
            _kill_group(child)
            return True
        if on_phase is not None and phase_file.exists():
            current = phase_file.read_text().strip()
            if current and current != phase:
                phase = current
                on_phase(phase)
        time.sleep(0.1)
    _kill_group(child)
    return False


def _kill_group(child: subprocess.Popen) -> None:
    """Kill the child and everything it started (DataLoader workers, compile workers)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def child_main() -> None:
    """Entry point of the trial process: measure, classify, write the result, exit."""
    request_file, result_file = Path(sys.argv[1]), Path(sys.argv[2])
    raw = json.loads(request_file.read_text())
    _watch_parent(raw.pop("parent_pid"))
    phase_file = Path(raw.pop("phase_file"))
    request = TrialRequest(**raw)
    if request.inductor_cache_dir:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = request.inductor_cache_dir
    try:
        result = _measure_classified(request, lambda phase: _note_phase(phase_file, phase))
    except MemoryError:
        _lift_memory_limit()
        result = TrialResult("oom", "MemoryError (the process ran out of memory while "
                                    "reporting a failure)")
    tmp = result_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(result.to_dict()))
    tmp.replace(result_file)
    sys.stdout.flush()
    # Skip interpreter teardown: DataLoader workers and compile pools can hang it.
    os._exit(0)


def _measure_classified(request: TrialRequest, on_phase: Callable[[str], None]) -> TrialResult:
    import torch

    from autotune.config import ConfigError, TrainConfig
    from autotune.measure import MeasureSettings, measure_config
    from autotune.training import Unsupported
    from autotune.workload import ContractError, load_workload

    try:
        device = torch.device(request.device)
        if request.cpus:
            os.sched_setaffinity(0, request.cpus)
        if request.threads:
            torch.set_num_threads(request.threads)
        if request.memory_limit_bytes:
            limit_memory(device, request.memory_limit_bytes)
        workload = load_workload(request.model_path, request.model_args)
        config = TrainConfig.from_dict(request.config)
        print(f"autotune trial: {config.to_dict()} on {device}", flush=True)
        start = time.perf_counter()
        measurement = measure_config(workload, config, device,
                                     MeasureSettings(**request.settings), request.trace_path,
                                     on_phase)
        # The rest of the trial's wall time is process start, imports and loading the file.
        metrics = {**measurement.to_dict(), "measure_wall_s": time.perf_counter() - start}
        return TrialResult("ok", "measured", metrics)
    except (ContractError, ConfigError) as exc:
        return _failed("error", exc, bad_input=True)
    except Unsupported as exc:
        return _failed("unsupported", exc)
    except BaseException as exc:
        _lift_memory_limit()
        if is_oom(exc):
            return _failed("oom", exc)
        return _failed("error", exc)


def is_oom(exc: BaseException) -> bool:
    """OOM on any device, also when wrapped (torch.compile re-raises with a cause)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
            return True
        if any(marker in str(exc).lower() for marker in OOM_MARKERS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def limit_memory(device: Any, limit_bytes: int) -> None:
    """Make memory really this small: a per-process fraction on CUDA, an rlimit on CPU.

    On CPU the limit is RLIMIT_DATA (heap and private mappings, the whole process including
    the ~0.2 GiB that importing torch takes), so an allocation beyond it fails as it would on a
    machine that small.
    """
    import torch

    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit_bytes / total), device)
    else:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, hard))


def _lift_memory_limit() -> None:
    """Room to report an out-of-memory failure: only the soft limit was lowered."""
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))


def _failed(status: str, exc: BaseException, bad_input: bool = False) -> TrialResult:
    traceback.print_exception(exc)
    message = str(exc) if bad_input else f"{type(exc).__name__}: {exc}"
    return TrialResult(status, message.strip()[:4000], bad_input=bad_input)


def _note_phase(phase_file: Path, phase: str) -> None:
    print(f"autotune trial: {phase}", flush=True)
    phase_file.write_text(phase)


def _watch_parent(parent_pid: int) -> None:
    """Exit as soon as the process that started this trial is gone."""
    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=watch, name="autotune-parent-watch", daemon=True).start()
