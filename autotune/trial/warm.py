"""A warm process: one configuration built once and kept steady, timed in short turns on
request, so that the confirmation can pair candidates close in time (tango's alternation)
instead of starting a fresh process for every run.

Started by name by `autotune.search.warm` (`python -c "from autotune.trial.warm import
warm_main; warm_main()" REQUEST`), with the same `TrialRequest` a trial gets. It builds the
set-up, warms up until steady and says so on its answer channel: one JSON line
`{"ready": true}` (or `{"error": ...}`). Then each line `{"steps": N, "seconds": S}` on stdin
is answered with one `WarmTurn` line (at least N optimizer steps and S seconds), and each line
`{"trace": PATH}` with `{"trace": PATH}` once the profiler's trace of a few steps is written
there (what a fresh run's profiler window leaves for the report), until `stop`, the end of
stdin, or the tuner that started it is gone. The answer channel
is the process's original stdout; whatever the model file prints goes to stderr (the log).
A training script's request runs the script itself, its own loop taking the turns
(`autotune.trial.script.turns`).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import IO, Any

from autotune.target import Script
from autotune.trial.child import limit_memory, watch_parent
from autotune.trial.protocol import TrialRequest

STOP = "stop"


def warm_main() -> None:
    """Entry point of a warm process started as a new interpreter."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the model file's prints go to the log, never into the answers
    request_file = Path(sys.argv[1])
    raw = json.loads(request_file.read_text())
    request_file.unlink(missing_ok=True)  # read once: nothing left if the tuner is killed
    tuner_pid = raw.pop("parent_pid")
    watch_parent(tuner_pid)
    raw.pop("phase_file", None)
    try:
        serve(TrialRequest.from_json(raw), sys.stdin, answers, tuner_pid)
    except BaseException as exc:  # the tuner falls back to fresh rounds, and the log says why
        traceback.print_exception(exc)
        _say(answers, {"error": f"{type(exc).__name__}: {exc}"[:2000]})
    sys.stderr.flush()
    os._exit(0)  # no teardown: DataLoader workers and compile pools can hang it


def serve(request: TrialRequest, commands: IO[str], answers: IO[str],
          tuner_pid: int | None = None) -> None:
    """Build and warm up the configuration, say it is ready, then answer turns until `stop`
    (timed with the tuner's other warm processes as its own, not a load)."""
    import torch

    from autotune.options import MeasureSettings
    from autotune.trial.measure import build_setup, timed_turn, traced_turn, warm_up
    from autotune.trial.workload import load_workload

    settings = request.settings
    if not isinstance(settings, MeasureSettings):
        raise ValueError(f"a warm process times a measurement, not a {request.job}")
    if request.inductor_cache_dir:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = request.inductor_cache_dir
    if request.cpus:
        os.sched_setaffinity(0, request.cpus)
    device = torch.device(request.device)
    if request.threads:
        torch.set_num_threads(request.threads)
    if request.memory_limit_bytes:
        limit_memory(device, request.memory_limit_bytes)
    if isinstance(request.target, Script):  # the script's own loop takes the turns
        from autotune.trial.script.job import run_under
        from autotune.trial.script.turns import TurnObserver

        observer = TurnObserver(settings, device, commands, answers, tuner_pid)
        run_under(request, request.target, device, 1, observer, lambda phase: None)
        if not observer.ready:
            raise RuntimeError("the script's training ended before its steps were steady")
        return
    workload = load_workload(request.target.path, request.target.args)
    config = workload.train_config(request.config, device.type, 1)
    setup, _, _ = build_setup(workload, config, device, lambda phase: None)
    batches = setup.batches()
    setup.step(batches)
    warmup_steps, steady = warm_up(setup, batches, settings)
    print(f"autotune warm: {config.to_dict()} on {device}, steady={steady} after "
          f"{warmup_steps} steps", flush=True)
    _say(answers, {"ready": True})
    for line in commands:
        command = json.loads(line)
        if command == STOP:
            return
        if "trace" in command:
            traced_turn(setup, batches, max(1, settings.profile_steps), command["trace"])
            _say(answers, {"trace": command["trace"]})
            continue
        turn = timed_turn(setup, batches, settings, int(command["steps"]),
                          float(command["seconds"]), tuner_pid)
        _say(answers, turn.to_json())


def _say(answers: IO[str], message: Any) -> None:
    answers.write(json.dumps(message) + "\n")
    answers.flush()


if __name__ == "__main__":
    warm_main()
