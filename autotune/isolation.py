"""One trial = one fresh process with a time limit; whatever happens comes back as a result.

The parent writes a request file, starts the child in its own session (so a Ctrl-C or a crash
on either side cannot take the other down), captures its output to a log file and waits. The
child is a new interpreter (`python -c ...child_main()`) or, when the tuner runs a
`forkserver.ForkServer`, a fork of a process that has already imported torch and the model file;
both end the same ways. The child runs its job (`JOBS`: a measurement, the capability probe,
the deep profile), classifies its own exceptions (OOM, bad input, unsupported, error) and writes
a result file atomically; a child that dies without one is a `crash`, one that runs past its
limit is killed with its whole process group (DataLoader workers included) and is a `timeout`.
A child whose parent died exits by itself within a couple of seconds, so it never keeps holding
a GPU. No model file is ever imported in the parent: user code runs only in children.
"""

from __future__ import annotations

import contextlib
import importlib
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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from autotune.forkserver import ForkedChild, ForkServer, ForkServerUnavailable
from autotune.hardware import trial_device

Child = subprocess.Popen | ForkedChild

OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory",
               "failed to allocate memory",
               # cuBLAS and cuDNN report their own failed allocations by status name
               "cublas_status_alloc_failed", "cudnn_status_alloc_failed")
# Marker pairs that mean out of memory only together: cublasCreate fails with NOT_INITIALIZED
# when there is no memory left for its handle and workspace (torch's message names the call).
OOM_MARKER_PAIRS = (("cublas_status_not_initialized", "cublascreate"),)


# What a child can be asked to do: module and function, each called as
# fn(workload, config, device, settings, trace_path, progress) -> figures (plain JSON data).
JOBS = {"measure": ("autotune.measure", "measure_job"),
        "probe": ("autotune.probe", "probe_job"),
        "profile": ("autotune.deep_profile", "profile_job")}


@dataclass
class TrialRequest:
    """Everything a child needs for one job; plain JSON data. Knobs `config` leaves out come
    from the model file's BASELINE."""

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
    job: str = "measure"
    # The CPU cores this trial may use (its share when trials run in parallel), or all.
    cpus: list[int] | None = None


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
    config: dict[str, Any] | None = None  # the configuration the child ran, BASELINE applied
    phase: str = ""  # the last phase the child reported: where a timeout or a crash struck

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
        result = TrialResult("timeout", f"still running after the {time_limit_s:g} s "
                             f"limit{where}; killed with its worker processes")
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
    command = [sys.executable, "-c", "from autotune.isolation import child_main; child_main()",
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


def child_main() -> None:
    """Entry point of a trial process started as a new interpreter."""
    run_child(Path(sys.argv[1]), Path(sys.argv[2]))


def run_child(request_file: Path, result_file: Path) -> None:
    """In the trial process: run the job, classify, write the result, exit."""
    raw = json.loads(request_file.read_text())
    _watch_parent(raw.pop("parent_pid"))
    phase_file = Path(raw.pop("phase_file"))
    request = TrialRequest(**raw)
    if request.inductor_cache_dir:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = request.inductor_cache_dir
    if request.cpus:
        # Before torch starts its threads: they, DataLoader workers and compile workers inherit it.
        os.sched_setaffinity(0, request.cpus)
    try:
        result = _run_job(request, lambda phase: _note_phase(phase_file, phase))
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


def _run_job(request: TrialRequest, on_phase: Callable[[str], None]) -> TrialResult:
    import torch

    from autotune.config import ConfigError
    from autotune.hardware import describe, unsupported_reason
    from autotune.training import Unsupported
    from autotune.workload import ContractError, load_workload

    try:
        device = torch.device(request.device)
        if request.threads:
            torch.set_num_threads(request.threads)
        if request.memory_limit_bytes:
            limit_memory(device, request.memory_limit_bytes)
        module, name = JOBS[request.job]
        job = getattr(importlib.import_module(module), name)
        on_phase("loading the model file")
        workload = load_workload(request.model_path, request.model_args)
        config = workload.train_config(request.config, device.type)
        print(f"autotune {request.job}: {config.to_dict()} on {device}", flush=True)
        reason = unsupported_reason(config, describe(device))
        if reason and request.job != "probe":  # the probe finds what the baseline can do
            raise Unsupported(reason)
        figures = job(workload, config, device, request.settings, request.trace_path, on_phase)
        return TrialResult("ok", "measured", figures, config=config.to_dict())
    except (ContractError, ConfigError) as exc:
        return _failed("error", exc, bad_input=True)
    except Unsupported as exc:
        result = _failed("unsupported", exc)
        if exc.knob is not None:  # the setting that cannot run, so no trial tries it again
            result.metrics = {"unsupported_knob": exc.knob, "unsupported_value": exc.value}
        return result
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
        text = str(exc).lower()
        if any(marker in text for marker in OOM_MARKERS) or \
                any(all(m in text for m in pair) for pair in OOM_MARKER_PAIRS):
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
