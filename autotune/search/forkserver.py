"""The tuner's side of the fork server: a process that has imported torch, autotune and the
model file once (for a training script, the library modules its probe recorded:
`trial/script/preload`) (`autotune.trial.server`) and forks a fresh child for every trial, the
isolation of a new process without paying its imports each time.

No torch operation runs in the server, so a child inherits no OpenMP pool and no CUDA context:
it sets its own threads and initialises its own device (`PYTORCH_NVML_BASED_CUDA_CHECK` keeps a
model file's `torch.cuda.is_available()` from initialising CUDA; a server that finds CUDA
initialised anyway refuses to start, and trials then start as fresh interpreters). A child starts
its own session and writes to its own log; the server reaps it and reports how it ended. The
server ends when the tuner that started it closes its pipe or dies.

The protocol is one JSON object per line: the tuner writes jobs (`id`, request and result files,
log, environment; a warm process's job its socket, `channel`); the server answers
`{"id", "pid"}` when a child is forked and `{"id", "returncode"}` when it has ended.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from autotune.errors import AutotuneError

# How long a forked child may take to report its pid before the server is taken for dead.
FORK_REPLY_S = 30.0
# What every trial process finds in its environment, forked or a fresh interpreter, so that
# both start alike (a script's probe, a fresh interpreter, sees what its forked trials see).
TRIAL_ENVIRONMENT = {"PYTHONUNBUFFERED": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


class ForkServerUnavailable(AutotuneError):
    """The server could not start, or has died: start trials as fresh interpreters."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out  # the imports did not finish in time


class ForkedChild:
    """A child forked by the server, with the part of `subprocess.Popen` that isolation uses."""

    def __init__(self) -> None:
        self._forked, self._ended = threading.Event(), threading.Event()
        self.pid = 0
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode if self._ended.is_set() else None

    def wait(self, timeout: float | None = None) -> int | None:
        self._ended.wait(timeout)
        return self.returncode


class ForkServer:
    """The tuner's side: start the server, fork children through it, close it."""

    def __init__(self, model_path: str | None, log_path: Path, start_timeout_s: float,
                 script_modules: Path | None = None) -> None:
        """A server for the model file at `model_path`, or (None) for a training script: the
        modules `script_modules` lists (a JSON list of module names) imported, never the
        script."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 - held open for the server's life
        env = {**os.environ, **TRIAL_ENVIRONMENT}
        imports = [model_path] if model_path is not None else ["--modules", str(script_modules)]
        self._process = subprocess.Popen(
            [sys.executable, "-c", "from autotune.trial.server import serve; serve()",
             *imports], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            start_new_session=True, env=env)
        self._lock = threading.Lock()
        self._children: dict[int, ForkedChild] = {}
        self._next_id = 0
        self._alive = True
        try:
            hello = _read_line(self._process.stdout, start_timeout_s)
        except TimeoutError:
            self.close()
            what = "the model file" if model_path is not None else "the script's libraries"
            raise ForkServerUnavailable(
                f"importing torch and {what} took more than {start_timeout_s:g} s",
                timed_out=True) from None
        if not hello or not hello.get("ready"):
            self.close()
            raise ForkServerUnavailable((hello or {}).get("reason", "the fork server died"))
        self.preloaded: bool = hello.get("preloaded", False)
        self._reader = threading.Thread(target=self._read, name="autotune-forkserver",
                                        daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def fork(self, request_file: Path, result_file: Path, log: Path,
             env: dict[str, str], channel: str | None = None) -> ForkedChild:
        """A child running the request in `request_file`: a trial, or with a `channel` (a
        socket's path) a warm process that connects to it (`trial.warm.serve_forked`); raises
        ForkServerUnavailable when the server is gone."""
        with self._lock:
            if not self._alive:
                raise ForkServerUnavailable("the fork server has ended")
            child = ForkedChild()
            self._children[self._next_id] = child
            job = {"id": self._next_id, "request": str(request_file),
                   "result": str(result_file), "log": str(log), "env": env,
                   **({"channel": channel} if channel else {})}
            self._next_id += 1
            try:
                self._process.stdin.write((json.dumps(job) + "\n").encode())
                self._process.stdin.flush()
            except OSError:
                self._alive = False
                raise ForkServerUnavailable("the fork server has ended") from None
        if not child._forked.wait(FORK_REPLY_S) or not child.pid:
            raise ForkServerUnavailable("the fork server did not fork the trial")
        return child

    def close(self) -> None:
        """End the server (its running children end with it)."""
        with self._lock:
            self._alive = False
            with contextlib.suppress(OSError):
                self._process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait()
        self._log.close()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self) -> None:
        for raw in self._process.stdout:
            message = json.loads(raw)
            child = self._children.get(message["id"])
            if child is None:
                continue
            if "pid" in message:
                child.pid = message["pid"]
                child._forked.set()
            else:
                child.returncode = message["returncode"]
                child._ended.set()
                self._children.pop(message["id"], None)
        with self._lock:  # the server ended: nothing it forked will report again
            self._alive = False
            for child in self._children.values():
                child._forked.set()
                child._ended.set()
            self._children.clear()


def _read_line(stream: IO[bytes], timeout_s: float) -> dict[str, Any] | None:
    ready, _, _ = select.select([stream], [], [], timeout_s)
    if not ready:
        raise TimeoutError
    line = stream.readline()
    return json.loads(line) if line else None
