"""The trial's side of one trial = one process: run the job asked for (a measurement, the probe,
a profile, a worst batch's peak, a loss run: `JOBS`), classify how it ended,
write the result, exit.

The process is a new interpreter (`child_main`) or a fork of the fork server
(`autotune.trial.server`); either way it runs `run_child`. Under `--nproc-per-node N` it is one
of N ranks torchrun started (`python -m torch.distributed.run ... -m autotune.trial.child`):
each rank joins the group, runs the same job, and writes its own result (`rank_result_path`);
one that fails exits non-zero, so torchrun ends the others at once. It exits by itself within a
couple of seconds when the tuner that started it is gone, so it never keeps holding a GPU. The
model file is imported here, never in the tuner.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.target import Script
from autotune.trial.protocol import (
    TrialRequest,
    TrialResult,
    TrialStatus,
    UnsupportedSetting,
    rank_pid_path,
    rank_result_path,
)

OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory",
               "failed to allocate memory",
               # cuBLAS and cuDNN report their own failed allocations by status name
               "cublas_status_alloc_failed", "cudnn_status_alloc_failed")
# Marker pairs that mean out of memory only together: cublasCreate fails with NOT_INITIALIZED
# when there is no memory left for its handle and workspace (torch's message names the call).
OOM_MARKER_PAIRS = (("cublas_status_not_initialized", "cublascreate"),)


# A result's message at most (the log has it whole), in characters.
MESSAGE_LIMIT = 4000

# What a child can be asked to do: module and function, each called as
# fn(workload, config, device, settings, trace_path, progress) with the request's settings (the
# job's own type: `protocol.JOB_SETTINGS`), and the field of the `TrialResult` its answer goes in.
JOBS = {"measure": ("autotune.trial.measure", "measure_job", "measurement"),
        "probe": ("autotune.trial.probe", "probe_job", "probe"),
        "profile": ("autotune.trial.deep_profile", "profile_job", "profile"),
        "worst_batch": ("autotune.trial.worst_batch", "worst_batch_job", "worst_batch"),
        "loss_run": ("autotune.trial.loss_run", "loss_run_job", "loss_run")}


def child_main() -> None:
    """Entry point of a trial process started as a new interpreter (or as a rank by torchrun)."""
    run_child(Path(sys.argv[1]), Path(sys.argv[2]))


def run_child(request_file: Path, result_file: Path) -> None:
    """In the trial process: run the job, classify, write the result, exit."""
    raw = json.loads(request_file.read_text())
    rank = int(os.environ.get("RANK", "0"))
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    if ranks > 1:
        rank_pid_path(result_file, rank).write_text(str(os.getpid()))
        print(f"autotune rank {rank} of {ranks}: pid {os.getpid()}, GPUs visible: "
              f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'all')}", flush=True)
        result_file = rank_result_path(result_file, rank)
        watch_tuner(raw.pop("parent_pid"))
    else:
        watch_parent(raw.pop("parent_pid"))
    phase_file = Path(raw.pop("phase_file"))
    request = TrialRequest.from_json(raw)
    if request.inductor_cache_dir:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = request.inductor_cache_dir
    place_rank(request, rank, ranks)
    began = time.monotonic()
    note = (lambda phase: _note_phase(phase_file, phase, began)) if rank == 0 else \
        (lambda phase: _say_phase(phase, began))
    try:
        result = _run_job(request, note)
    except MemoryError:
        _lift_memory_limit()
        result = TrialResult(TrialStatus.OOM, "MemoryError (the process ran out of memory while "
                                    "reporting a failure)")
    if ranks > 1:
        result = replace(result, rank=rank, ended_at=time.time())
    tmp = result_file.with_name(result_file.name + ".tmp")
    tmp.write_text(json.dumps(result.to_json()))
    tmp.replace(result_file)
    sys.stdout.flush()
    # Skip interpreter teardown: DataLoader workers and compile pools can hang it. A rank that
    # failed exits non-zero, so that torchrun stops the others instead of leaving them waiting.
    os._exit(0 if ranks == 1 or result.status == TrialStatus.OK else 1)


def place_rank(request: TrialRequest, rank: int, ranks: int) -> None:
    """This process on the trial's cores, a rank of a group on its own share of them with as
    many threads; before torch starts its threads: they, DataLoader workers and compile
    workers inherit it."""
    cpus = rank_cpus(request.cpus or sorted(os.sched_getaffinity(0)), rank, ranks) \
        if ranks > 1 else request.cpus
    if cpus:
        os.sched_setaffinity(0, cpus)
        if ranks > 1:
            request.threads = len(cpus)


def rank_cpus(cpus: list[int], rank: int, ranks: int) -> list[int]:
    """A rank's own share of the trial's cores (all of them shared when there are fewer cores
    than ranks)."""
    if len(cpus) < ranks:
        return cpus
    share = len(cpus) // ranks
    return cpus[rank * share:(rank + 1) * share]


def _run_job(request: TrialRequest, on_phase: Callable[[str], None]) -> TrialResult:
    import torch

    from autotune.errors import ConfigError, ContractError
    from autotune.hardware import describe, unsupported_reason
    from autotune.trial.distributed import join, launched_world_size, rank_device
    from autotune.trial.training import Unsupported
    from autotune.trial.workload import load_workload

    try:
        device = torch.device(request.device)
        device = rank_device(device, join(device.type))
        if request.threads:
            torch.set_num_threads(request.threads)
        if request.memory_limit_bytes:
            limit_memory(device, request.memory_limit_bytes)
        module, name, answer = JOBS[request.job]
        match request.target:
            case Script():  # the user's own script, not a model file
                from autotune.trial.script.job import script_job

                try:
                    config, figures = script_job(request, request.target, device,
                                                 launched_world_size(), on_phase)
                except ConfigError as exc:
                    if request.job == "probe":  # the script's own settings: the user's to fix
                        raise
                    # A trial's knobs the script's library refuses together: this trial's outcome,
                    # not a study-ending mistake of the user's.
                    raise Unsupported(str(exc)) from None
                return TrialResult(TrialStatus.OK, "measured", config=config, **{answer: figures})
        job = getattr(importlib.import_module(module), name)
        on_phase("loading the model file")
        workload = load_workload(request.target.path, request.target.args)
        config = workload.train_config(request.config, device.type, launched_world_size())
        print(f"autotune {request.job}: {config.to_dict()} on {device}", flush=True)
        reason = unsupported_reason(config, describe(device))
        if reason and request.job != "probe":  # the probe finds what the baseline can do
            raise Unsupported(reason)
        figures = job(workload, config, device, request.settings, request.trace_path, on_phase)
        return TrialResult(TrialStatus.OK, "measured", config=config, **{answer: figures})
    except (ContractError, ConfigError) as exc:
        return _failed(TrialStatus.ERROR, exc, bad_input=True)
    except Unsupported as exc:
        result = _failed(TrialStatus.UNSUPPORTED, exc)
        if exc.knob is not None:  # the setting that cannot run, so no trial tries it again
            result = replace(result, unsupported=UnsupportedSetting(exc.knob, exc.value,
                                                                    exc.together))
        return result
    except BaseException as exc:
        _lift_memory_limit()
        if is_oom(exc):
            return _failed(TrialStatus.OOM, exc)
        return _failed(TrialStatus.ERROR, exc)


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
    what importing torch takes: ~0.2 GiB in a CPU build, ~0.75 GiB in a CUDA build), so an
    allocation beyond it fails as it would on a machine that small.
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


def _failed(status: TrialStatus, exc: BaseException, bad_input: bool = False) -> TrialResult:
    traceback.print_exception(exc)
    message = str(exc) if bad_input else f"{type(exc).__name__}: {exc}"
    return TrialResult(status, clipped(message.strip()), bad_input=bad_input)


def clipped(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """`message` within `limit` characters: its start (what failed) and its end (the error's
    own line, after a traceback or a parser's usage), the middle left out where it is long."""
    if len(message) <= limit:
        return message
    head = limit // 4
    tail = limit - head
    return (f"{message[:head].rstrip()}\n[... {len(message) - head - tail:,} characters left "
            f"out ...]\n{message[-tail:].lstrip()}")


def _say_phase(phase: str, began: float) -> None:
    """The phase in the trial's log, with when it began: where a trial's time went, read off
    its log (a GPU's 68-second probe, say)."""
    print(f"autotune trial: {phase} (at {time.monotonic() - began:.1f} s)", flush=True)


def _note_phase(phase_file: Path, phase: str, began: float) -> None:
    _say_phase(phase, began)
    phase_file.write_text(phase)


def watch_parent(parent_pid: int) -> None:
    """Exit as soon as the process that started this trial is gone."""
    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=watch, name="autotune-parent-watch", daemon=True).start()


def watch_tuner(tuner_pid: int) -> None:
    """A rank's parent is torchrun's agent, which outlives a killed tuner: exit as soon as the
    tuner itself is gone (torchrun then ends, as its ranks did), or the agent is."""
    launcher = os.getppid()

    def watch() -> None:
        while True:
            if os.getppid() != launcher:
                os._exit(3)
            try:
                os.kill(tuner_pid, 0)
            except ProcessLookupError:
                os._exit(3)
            except PermissionError:
                pass
            time.sleep(0.5)

    threading.Thread(target=watch, name="autotune-tuner-watch", daemon=True).start()


if __name__ == "__main__":
    child_main()
