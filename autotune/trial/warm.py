"""A warm process: one configuration built once and kept steady, timed in short turns on
request, so that the confirmation can pair candidates close in time (tango's alternation)
instead of starting a fresh process for every run.

Forked by the fork server the trials fork from, where one runs (`serve_forked`: its channel a
socket the tuner listens on), else started by name by `autotune.search.warm` (`python -c "from
autotune.trial.warm import warm_main; warm_main()" REQUEST`: its channel its stdin and stdout),
with the same `TrialRequest` a trial gets. It builds the set-up, warms up until steady and says
so on its channel: one JSON line `{"ready": true}` (or `{"error": ...}`). Then each line
`{"steps": N, "seconds": S}` is answered with one `WarmTurn` line (at least N optimizer steps
and S seconds), and each line `{"trace": PATH}` with `{"trace": PATH}` once the profiler's trace
of a few steps is written there (what a fresh run's profiler window leaves for the report),
until `stop`, the channel's end, or the tuner that started it is gone. Whatever the model file
prints goes to the log, never into the answers.
A training script's request runs the script itself, its own loop taking the turns
(`autotune.trial.script.turns`); where the script's own run ends during a turn, the turn is
answered `{"error": ..., "ended": true}` (`ScriptRunEnded`), and the tuner may start another.

A process group's warm process is torchrun's ranks of this module (`-m autotune.trial.warm`):
they join the group as a trial's ranks do, rank 0 alone reads the commands and tells the
others (`_commands`), every rank takes every turn, and rank 0 answers with the group's figures
(`measure.timed_turn`).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from autotune.errors import RunFailed
from autotune.target import Script
from autotune.trial.child import limit_memory, place_rank, watch_parent, watch_tuner
from autotune.trial.protocol import TrialRequest

STOP = "stop"
# How long a group's ranks wait for the tuner's next command: the tuner starts the other warm
# processes, and races, between them; a tuner that is gone ends the ranks (`watch_tuner`).
COMMAND_WAIT = datetime.timedelta(days=1)


def warm_main() -> None:
    """Entry point of a warm process started as a new interpreter, or of each rank of a warm
    process group (torchrun's)."""
    rank, ranks = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    answers = os.fdopen(os.dup(1), "w", buffering=1) if rank == 0 else None
    os.dup2(2, 1)  # the model file's prints go to the log, never into the answers
    request_file = Path(sys.argv[1])
    request, tuner_pid = _read_request(request_file, remove=ranks == 1)
    # A rank's parent is torchrun's agent, which outlives a killed tuner.
    (watch_tuner if ranks > 1 else watch_parent)(tuner_pid)
    place_rank(request, rank, ranks)
    failed = _serve_or_say(request, sys.stdin, answers, tuner_pid,
                           request_file if rank == 0 else None)
    # No teardown (DataLoader workers and compile pools can hang it); a failed rank exits
    # non-zero, so that torchrun stops the others instead of leaving them waiting.
    os._exit(1 if failed and ranks > 1 else 0)


class ScriptRunEnded(RunFailed):
    """A script's own run ended (its epochs or steps ran out) while its warm process took a
    turn: not a failure of the configuration, and a new process of it may take its place."""


def serve_forked(request_file: Path, channel: str) -> None:
    """Entry point of a warm process forked by the fork server (`trial.server`), its prints
    already in its log: its commands and answers on the tuner's socket at `channel`. It ends
    with the server, which ends with the tuner, or at the socket's end."""
    request, tuner_pid = _read_request(request_file, remove=True)
    watch_parent(os.getppid())
    place_rank(request, 0, 1)
    with socket.socket(socket.AF_UNIX) as connection:
        connection.connect(channel)
        commands = connection.makefile("r", encoding="utf-8")
        answers = connection.makefile("w", buffering=1, encoding="utf-8")
        _serve_or_say(request, commands, answers, tuner_pid)
    os._exit(0)


def _read_request(request_file: Path, remove: bool) -> tuple[TrialRequest, int]:
    """The request and the tuner's pid; the file `remove`d once read (nothing left if the
    tuner is killed; a group's rank 0 removes it once every rank has read it)."""
    raw = json.loads(request_file.read_text())
    if remove:
        request_file.unlink(missing_ok=True)
    tuner_pid = raw.pop("parent_pid")
    raw.pop("phase_file", None)
    return TrialRequest.from_json(raw), tuner_pid


def _serve_or_say(request: TrialRequest, commands: IO[str], answers: IO[str] | None,
                  tuner_pid: int, request_file: Path | None = None) -> bool:
    """`serve`; whether it failed, which the answers say (the tuner falls back to fresh
    rounds) and the log shows."""
    failed = False
    try:
        serve(request, commands, answers, tuner_pid, request_file)
    except ScriptRunEnded as exc:
        failed = True
        print(f"autotune warm: {exc}", flush=True)
        _say(answers, {"error": str(exc), "ended": True})
    except BaseException as exc:
        failed = True
        traceback.print_exception(exc)
        _say(answers, {"error": f"{type(exc).__name__}: {exc}"[:2000]})
    sys.stderr.flush()
    return failed


def serve(request: TrialRequest, commands: IO[str], answers: IO[str] | None,
          tuner_pid: int | None = None, request_file: Path | None = None) -> None:
    """Build and warm up the configuration, say it is ready, then answer turns until `stop`
    (timed with the tuner's other warm processes as its own, not a load). Of a process group,
    every rank serves, rank 0 alone reads `commands`, answers, and removes the group's
    `request_file` once every rank has joined."""
    import torch
    import torch.distributed as dist

    from autotune.hardware import describe, peak_flops
    from autotune.options import MeasureSettings
    from autotune.trial.distributed import join, rank_device
    from autotune.trial.measure import build_setup, timed_turn, traced_turn, warm_up
    from autotune.trial.workload import load_workload

    settings = request.settings
    if not isinstance(settings, MeasureSettings):
        raise ValueError(f"a warm process times a measurement, not a {request.job}")
    if request.inductor_cache_dir:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = request.inductor_cache_dir
    world = join(torch.device(request.device).type)
    group = None
    if world is not None:
        world.gather(None)  # every rank has read the request
        if request_file is not None:
            request_file.unlink(missing_ok=True)
        group = dist.new_group(backend="gloo", timeout=COMMAND_WAIT)
    told = _commands(commands, group)
    device = rank_device(torch.device(request.device), world)
    if request.threads:
        torch.set_num_threads(request.threads)
    if request.memory_limit_bytes:
        limit_memory(device, request.memory_limit_bytes)
    match request.target:
        case Script():  # the script's own loop takes the turns
            from autotune.trial.script.job import answer_of, run_under, trained_config
            from autotune.trial.script.turns import TurnObserver

            ranks = world.size if world else 1
            observer = TurnObserver(settings, device, told,
                                    lambda message: _say(answers, message), tuner_pid,
                                    trained_config(request, device.type, ranks),
                                    answer_of(request, device.type, ranks))
            run_under(request, request.target, device, world.size if world else 1, observer,
                      lambda phase: None)
            if not observer.ready:
                raise RuntimeError("the script's training ended before its steps were steady")
            if not observer.stopped:
                raise ScriptRunEnded(
                    f"the script's own run ended after {observer.steps} optimizer steps, "
                    "during a turn: a longer run of it (more epochs or steps) keeps its warm "
                    "process for every round")
            return
    workload = load_workload(request.target.path, request.target.args)
    config = workload.train_config(request.config, device.type, world.size if world else 1)
    setup, flops, _ = build_setup(workload, config, device, lambda phase: None)
    peak = peak_flops(describe(device), config.precision) if flops else None
    batches = setup.batches()
    setup.step(batches)
    warm = warm_up(setup, batches, settings)
    print(f"autotune warm: {config.to_dict()} on {device}, steady={warm.steady} after "
          f"{len(warm.times)} steps", flush=True)
    _say(answers, {"ready": True})
    for command in told:
        if command == STOP:
            return
        if "trace" in command:
            traced_turn(setup, batches, max(1, settings.profile_steps), command["trace"])
            _say(answers, {"trace": command["trace"]})
            continue
        turn = timed_turn(setup, batches, settings, int(command["steps"]),
                          float(command["seconds"]), tuner_pid, flops, peak)
        _say(answers, turn.to_json())


def _commands(lines: IO[str], group: Any | None) -> Iterator[Any]:
    """The tuner's commands in order, the end of its pipe as `STOP`; of a process group, on
    every rank: rank 0 reads them and tells the others over `group`, a gloo group that waits
    as long as the tuner may (`COMMAND_WAIT`)."""
    import torch.distributed as dist

    while True:
        box: list[Any] = [STOP]
        if group is None or dist.get_rank() == 0:
            line = lines.readline()
            box[0] = json.loads(line) if line else STOP
        if group is not None:
            dist.broadcast_object_list(box, src=0, group=group)
        yield box[0]


def _say(answers: IO[str] | None, message: Any) -> None:
    """One line to the tuner (a group's rank 0 alone has the pipe)."""
    if answers is None:
        return
    answers.write(json.dumps(message) + "\n")
    answers.flush()


if __name__ == "__main__":
    warm_main()
