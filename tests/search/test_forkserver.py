"""The fork server: torch and the model file imported once, a fresh process forked per trial
and per warm process, and nothing left running once the tuner closes it."""

from __future__ import annotations

import json
import os
import time

import pytest

from autotune.options import MeasureSettings
from autotune.search.forkserver import ForkServer, ForkServerUnavailable
from autotune.search.warm import WarmRounds
from autotune.target import ModelFile
from autotune.trial.protocol import TrialRequest

from ..conftest import TINY_SOURCE


def _job(tmp_path, name: str, parent_pid: int, **settings) -> tuple:
    """A request file for a short trial of model.py, and where its result will go."""
    request, result = tmp_path / f"{name}.json", tmp_path / f"{name}.result.json"
    asked = TrialRequest(ModelFile(str(tmp_path / "model.py")), config={"micro_batch_size": 8},
                         device="cpu", settings=MeasureSettings(**{
                             "window_steps": 2, "window_seconds": 0.1, "window_max_seconds": 0.5,
                             "warmup_max_seconds": 2, "profile_steps": 0, **settings}))
    request.write_text(json.dumps({**asked.to_json(), "parent_pid": parent_pid,
                                   "phase_file": str(tmp_path / f"{name}.phase")}))
    return request, result


def test_children_are_forked_measured_and_reaped(write_model, tmp_path) -> None:
    path = write_model(TINY_SOURCE)
    with ForkServer(str(path), tmp_path / "server.log", 120) as server:
        assert server.preloaded
        children = []
        for name in ("a", "b"):
            # the request names the server as the parent the child watches
            request, result = _job(tmp_path, name, server.pid)
            children.append((server.fork(request, result, tmp_path / f"{name}.log", {}),
                             result))
        for child, result in children:
            assert child.wait(120) == 0
            assert json.loads(result.read_text())["status"] == "ok"
        assert children[0][0].pid != children[1][0].pid


def test_a_closed_server_refuses_work_and_ends_its_children(write_model, tmp_path) -> None:
    path = write_model(TINY_SOURCE)
    server = ForkServer(str(path), tmp_path / "server.log", 120)
    request, result = _job(tmp_path, "slow", server.pid, window_seconds=600,
                           window_max_seconds=600)
    child = server.fork(request, result, tmp_path / "slow.log", {})
    phase = tmp_path / "slow.phase"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "timing" not in (
            phase.read_text() if phase.exists() else ""):
        time.sleep(0.1)
    assert _alive(child.pid) and "timing" in phase.read_text()  # mid-measurement
    server.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child.pid):
        time.sleep(0.1)
    assert not _alive(child.pid)
    with pytest.raises(ForkServerUnavailable):
        server.fork(request, result, tmp_path / "again.log", {})


def test_a_model_file_that_fails_to_import_is_left_to_the_trial_to_report(
        write_model, tmp_path) -> None:
    path = write_model("raise RuntimeError('no driver here')\n")
    with ForkServer(str(path), tmp_path / "server.log", 120) as server:
        assert not server.preloaded
        request, result = _job(tmp_path, "broken", server.pid)
        assert server.fork(request, result, tmp_path / "broken.log", {}).wait(120) == 0
        answer = json.loads(result.read_text())
        assert answer["status"] == "error" and answer["bad_input"]
        assert "no driver here" in answer["message"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has ended
        return stat.read().split(")")[-1].split()[0] != "Z"


def _parent_of(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


def test_a_warm_process_forks_from_the_server_and_a_gone_server_leaves_a_new_interpreter(
        write_model, tmp_path) -> None:
    """A confirmation's warm process forks from its trials' server (torch and the model file
    imported once), takes its turns over its socket, and ends at `stop`; with the server gone,
    the next starts as a new interpreter of its own."""
    path = write_model(TINY_SOURCE)
    request = TrialRequest(ModelFile(str(path)), config={"micro_batch_size": 8}, device="cpu",
                           settings=MeasureSettings(window_steps=2, window_seconds=0.1,
                                                    warmup_max_seconds=2, profile_steps=0))
    server = ForkServer(str(path), tmp_path / "server.log", 120)
    parents = []
    for name in ("forked", "fresh"):
        rounds = WarmRounds([request], [tmp_path / f"{name}.log"], 120, server=server)
        warm = rounds.processes[0].process
        try:
            parents.append(_parent_of(warm.pid))
            runs = [rounds.turn(0) for _ in range(2)]
        finally:
            rounds.close()
        assert all(run is not None and run.samples_per_sec > 0 for run in runs)
        assert not os.path.exists(f"/proc/{warm.pid}")
        server.close()
    assert parents == [server.pid, os.getpid()]
