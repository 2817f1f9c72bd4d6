"""The fork server process: import torch, autotune's measurement and the model file once (for a
training script, the library modules its probe recorded, never the script: `script/preload`),
then fork a fresh trial process (`child.run_child`), or a warm process (`warm.serve_forked`), for
every job the tuner sends (`autotune.search.forkserver` is the tuner's side and says what the
protocol is).

No torch operation runs here, so a child inherits no OpenMP pool and no CUDA context. Imports
that start a thread or change the environment would give a fork what a fresh interpreter lacks:
the server then refuses to start. A child starts its own session and writes to its own log; the
server reaps it and reports how it ended. It ends, and ends its children, when the tuner closes
its pipe or dies.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any

from autotune.trial.child import run_child
from autotune.trial.script.preload import changed_variables, import_modules
from autotune.trial.warm import serve_forked


def serve() -> None:
    """Entry point of the server: import once, then fork a child per job until told to stop.
    Its arguments: a model file, or `--modules FILE` (a JSON list) for a training script."""
    parent = os.getppid()
    out = sys.stdout.buffer
    import torch
    import torch._dynamo  # noqa: F401  (every optimizer's constructor imports it: 1.7 s a trial)

    import autotune.trial.measure  # noqa: F401
    from autotune.trial.workload import preload

    script = sys.argv[1] == "--modules"
    environment = dict(os.environ)  # as a fresh trial's, which imports the above too
    if script:
        imported, failed = import_modules(json.loads(Path(sys.argv[2]).read_text()))
        preloaded, what = imported > 0, "the script's library modules"
        if failed:
            print(f"left to each trial ({len(failed)} would not import here): "
                  f"{', '.join(failed)}", file=sys.stderr, flush=True)
    else:
        preloaded, what = preload(sys.argv[1]), "the model file"
    refusal = _unlike_a_fresh_interpreter(environment if script else None, what)
    if torch.cuda.is_initialized():
        refusal = f"importing {what} initialised CUDA, which a forked trial cannot use"
    if refusal:
        _say(out, {"ready": False, "reason": refusal})
        return
    _say(out, {"ready": True, "preloaded": preloaded})
    children: dict[int, int] = {}
    stdin = sys.stdin.buffer
    while True:
        if os.getppid() != parent:
            _end(children)
        for pid, job_id in list(children.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                del children[pid]
                _say(out, {"id": job_id, "returncode": os.waitstatus_to_exitcode(status)})
        ready, _, _ = select.select([stdin], [], [], 0.1)
        if not ready:
            continue
        line = stdin.readline()
        if not line:
            _end(children)
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_forked(job)
        children[pid] = job["id"]
        _say(out, {"id": job["id"], "pid": pid})


def _run_forked(job: dict[str, Any]) -> None:
    """In the forked child: a session, a log and an environment of its own, then the trial."""
    try:
        os.setsid()
        log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
        os.environ.update(job["env"])
        if "channel" in job:
            serve_forked(Path(job["request"]), job["channel"])
        else:
            run_child(Path(job["request"]), Path(job["result"]))
    except BaseException:
        traceback.print_exc()
    os._exit(1)


def _unlike_a_fresh_interpreter(environment: dict[str, str] | None, what: str) -> str | None:
    """Why a fork would start unlike a fresh interpreter: a thread the imports started (a fork
    copies none of it, locks held included), or, for a script (`environment`: the server's at
    its start), a variable they set, which the script's first lines would see."""
    if threading.active_count() > 1:
        names = ", ".join(t.name for t in threading.enumerate() if t is not
                          threading.main_thread())
        return f"importing {what} started threads ({names}), which a fork does not copy"
    changed = [] if environment is None else changed_variables(environment)
    if changed:
        return f"importing {what} changed the environment ({', '.join(changed)})"
    return None


def _say(out: IO[bytes], message: dict[str, Any]) -> None:
    out.write((json.dumps(message) + "\n").encode())
    out.flush()


def _end(children: dict[int, int]) -> None:
    """The tuner is gone or done: end every running child's session, then this process."""
    for pid in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while children and time.monotonic() < deadline:
        for pid in list(children):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    del children[pid]
        time.sleep(0.05)
    os._exit(0)
