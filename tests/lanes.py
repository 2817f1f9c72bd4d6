"""The suite in lanes: under pytest-xdist (`-n N`, as CI runs it) each worker runs on its own
share of the cores, and everything its tests start inherits it. A trial times itself against
its own cores' load (autotune/trial/contention.py), so two tests at once never disturb each
other's figures, and the suite uses the cores that a test training on one would leave idle.

A test marked `whole_machine` (it needs every core, or judges the machine's own load) waits
for the other lanes' tests to end, holds them back, and runs on all the cores. Two lock files
do it: each test passes a turnstile and holds the machine shared; a whole-machine test keeps
the turnstile, so no new test starts, and holds the machine alone.

The files go to the lanes in the order `schedule` gives (xdist's own reorder is off): those
with a whole-machine test first, that test first in its file, so that it waits on the other
lane's opening tests, not on a study mid-file (their waits took 132 s of a lane in a 35-minute
run); then the files of real studies, longest first, so that the lanes end on short files."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
import torch

from autotune.hardware import core_shares

# The folder of the lock files, made by the controller and named to its workers.
FOLDER = "AUTOTUNE_TEST_LANES"


def open_lanes(config: pytest.Config) -> None:
    """In the controller of `-n N`: the lock files' folder, removed when the run ends."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", 0):
        return
    folder = tempfile.mkdtemp(prefix="autotune-lanes-")
    os.environ[FOLDER] = folder
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


@dataclass(frozen=True)
class Lane:
    """One worker's share of the cores, and the machine's, which a whole-machine test gets."""

    own: list[int]
    everything: list[int]
    folder: Path

    @classmethod
    def of_this_worker(cls) -> Lane | None:
        """This worker pinned to its share; None outside `-n N`, or with fewer cores than
        lanes (every lane then shares them all)."""
        worker, folder = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get(FOLDER)
        if worker is None or folder is None:
            return None
        everything = sorted(os.sched_getaffinity(0))
        lanes = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
        if lanes > len(everything):
            return None
        lane = int(worker.removeprefix("gw")) % lanes  # a worker that replaced a crashed one
        own = core_shares(lanes)[lane]  # as parallel trials share them
        _run_on(own)
        return cls(own, everything, Path(folder))

    @contextmanager
    def shared(self) -> Iterator[None]:
        turnstile = _locked(self.folder / "turnstile", fcntl.LOCK_EX)
        machine = _locked(self.folder / "machine", fcntl.LOCK_SH)
        turnstile.close()
        try:
            yield
        finally:
            machine.close()

    @contextmanager
    def whole_machine(self) -> Iterator[None]:
        turnstile = _locked(self.folder / "turnstile", fcntl.LOCK_EX)
        machine = _locked(self.folder / "machine", fcntl.LOCK_EX)
        _run_on(self.everything)
        try:
            yield
        finally:
            _run_on(self.own)
            machine.close()
            turnstile.close()


def schedule(items: list[pytest.Item]) -> None:
    """`items` reordered, in place, as the lanes take them: by file, those with a whole-machine
    test first, then those with the most tests marked `slow` (real studies), then those with the
    most tests; in each file its whole-machine tests first, the rest in their order."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)

    def whole(item: pytest.Item) -> bool:
        return item.get_closest_marker("whole_machine") is not None

    def slow(item: pytest.Item) -> bool:
        return item.get_closest_marker("slow") is not None

    def first(tests: list[pytest.Item]) -> tuple[bool, int, int]:
        return (not any(map(whole, tests)), -sum(map(slow, tests)), -len(tests))

    items[:] = [item for tests in sorted(files.values(), key=first)
                for item in sorted(tests, key=lambda item: not whole(item))]


def _run_on(cores: list[int]) -> None:
    """This process on `cores`, and its own torch work (a test that trains in-process) in as
    many threads: torch, imported before the lane pinned itself, sized its threads to every
    core, and two threads on a lane's one core ran in-process tests up to 11x slower (a Trainer
    script's loss runs in one lane, the same minute: 34.2 s with two threads, 3.0 s with one)."""
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))


def _locked(path: Path, kind: int) -> IO[str]:
    """`path` opened and locked; closing it unlocks."""
    handle = path.open("a")
    fcntl.flock(handle, kind)
    return handle
