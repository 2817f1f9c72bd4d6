"""The studies several end-to-end tests read, each run once per session: every test asserts its
own part of one (its verdict, files, `show`, exports, `verify`, forecast, a resumed run), and a
test that writes to a study writes to its own copy."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..conftest import FAST, ROOT, TINY_MLP, run_cli


@dataclass(frozen=True)
class Finished:
    """A tuner run to its end: its exit code, its stdout, and each line it wrote to stderr with
    the moment (`time.monotonic`) it arrived."""

    returncode: int
    stdout: str
    lines: tuple[tuple[float, str], ...]
    ended: float

    @property
    def stderr(self) -> str:
        return "".join(line for _, line in self.lines)

    def summary(self) -> dict:
        """`run --json`'s summary."""
        return json.loads(self.stdout)


def tune(*args: str, timeout: float = 600) -> Finished:
    """`autotune run ARGS` as a user's shell runs it, its stderr read as it comes."""
    process = subprocess.Popen([sys.executable, "-m", "autotune", "run", *args], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(process.stdout.read()))
    reader.start()
    lines = tuple((time.monotonic(), line) for line in process.stderr)
    returncode = process.wait(timeout=timeout)
    ended = time.monotonic()
    reader.join()
    return Finished(returncode, out[0], lines, ended)


def copy_of(studies: Path, into: Path) -> Path:
    """A copy of a studies folder, for a test that runs on, breaks or records into a study."""
    return Path(shutil.copytree(studies, into / "studies"))


# A study of the tiny MLP with its probe, its baseline and one search trial, unconfirmed: what
# a test of a resumed run, a signal or a torn journal starts from.
TEMPLATE = [*TINY_MLP, *FAST, "--confirm-repeats", "0", "--seed", "5"]


@pytest.fixture(scope="session")
def mlp_template(tmp_path_factory) -> Path:
    """The studies folder of TEMPLATE's study `mlp` after two trials; copy it (`copy_of`) to
    run on."""
    studies = tmp_path_factory.mktemp("template") / "studies"
    done = run_cli("run", *TEMPLATE, "--trials", "2", "--studies-dir", str(studies))
    assert done.returncode == 0, done.stderr
    return studies


@dataclass(frozen=True)
class SearchStudy:
    studies: Path
    run: Finished


@pytest.fixture(scope="session")
def mlp_search(tmp_path_factory) -> SearchStudy:
    """A whole default-shaped run of the tiny MLP: the probe, five trials, a confirmation of
    the best two in two fresh paired rounds (no loss check: tests/end_to_end/test_answer_checks
    checks the loss), the answer and its files."""
    studies = tmp_path_factory.mktemp("search") / "studies"
    run = tune(*TINY_MLP, *FAST, "--studies-dir", str(studies), "--trials", "5", "--seed", "1",
               "--confirm-top", "2", "--confirm-repeats", "2", "--confirm-max-rounds", "2",
               "--no-loss-check", "--json")
    assert run.returncode == 0, run.stderr
    return SearchStudy(studies, run)
