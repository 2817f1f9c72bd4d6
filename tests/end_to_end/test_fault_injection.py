"""Bad model files and bad flags, each through the real CLI against an existing study: the right
exit code, one line that says what is wrong (no traceback), and the study's journal left
byte-identical. A file that hangs ends within the limit; a torn journal is repaired."""

from __future__ import annotations

import hashlib
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ..conftest import FAST, TINY_SOURCE, cli, run_cli

pytestmark = pytest.mark.slow

# The hangs must come after the imports, which took a fresh interpreter over 10 s once on a
# lane's core (tests/lanes.py) beside the other lane's test.
LIMIT = ["--trial-time-limit", "20"]

# One file for each way a run ends on a bad file (each file's own message is
# tests/trial/test_workload's): a hang, an exit, an import that raises, a trial's first step.
BAD_FILES = {
    # name: (source, exit code, what the one line says)
    "dataset_loops": (TINY_SOURCE.replace(
        "def build_dataset(dim=8, size=256):",
        "def build_dataset(dim=8, size=256):\n    while True:\n        pass"), 1,
        "timeout"),
    "model_exits": (TINY_SOURCE.replace("return Net(dim)", "import sys\n    sys.exit(0)"), 1,
                    "SystemExit"),
    "import_raises": ("import torch\nraise RuntimeError('no GPU driver here')\n", 2,
                      "importing the model file raised RuntimeError"),
    "loss_not_scalar": (TINY_SOURCE.replace("return nn.functional.mse_loss(x.sum(dim=1), y)",
                                            "return (x.sum(dim=1) - y) ** 2"), 2,
                        "has no loss"),
}

BAD_FLAGS = {
    "zero_trials": (["--trials", "0"], "--trials must be >= 1"),
    "unreadable_timeout": (["--timeout", "soon"], "cannot read 'soon' as a duration"),
    "bad_storage": (["--storage", "not-a-url"], "cannot open storage"),
    "tiny_memory_limit": (["--memory-limit", "1KiB"], "below what the model alone needs"),
    "bad_study_name": (["--study", "a/b"], "study name"),
    "unknown_knob": (["--fix", "micro_batch=4"], "unknown knob(s) micro_batch"),
    "another_space": (["--fix", "optimizer_impl=foreach"], "searched another space"),
    "fix_outside_space": (["--space", "{space}", "--fix", "micro_batch_size=32"],
                          "micro_batch_size"),
}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """A real, finished study of a tiny model: the one every bad input must leave alone."""
    root = tmp_path_factory.mktemp("faults")
    model = root / "tiny.py"
    model.write_text(textwrap.dedent(TINY_SOURCE))
    (root / "space.yaml").write_text("micro_batch_size: [8, 16]\n")
    done = run_cli("run", "--model", str(model), "--device", "cpu", "--studies-dir",
                   str(root / "studies"), "--trials", "1", "--confirm-repeats", "0", *FAST,
                   timeout=600)
    assert done.returncode == 0, done.stderr
    return root


def _one_line_error(done, code: int) -> str:
    assert done.returncode == code, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("autotune: error: "), done.stderr
    return errors[0]


def _run_bad_file(root: Path, name: str) -> tuple[str, object]:
    source, _, _ = BAD_FILES[name]
    model = root / f"{name}.py"
    model.write_text(textwrap.dedent(source))
    return name, run_cli("run", "--model", str(model), "--device", "cpu", "--studies-dir",
                         str(root / "studies"), "--study", "tiny", *FAST, *LIMIT,
                         "--trials", "2", timeout=300)


def test_bad_model_files_leave_the_study_as_it_was(study: Path) -> None:
    journal = study / "studies" / "tiny" / "journal.log"
    before = _sha(journal)
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(pool.map(lambda n: _run_bad_file(study, n), BAD_FILES))
    for name, done in results.items():
        _, code, says = BAD_FILES[name]
        line = _one_line_error(done, code)
        assert says in line, (name, line)
    assert _sha(journal) == before


def test_bad_flags_leave_the_study_as_it_was(study: Path) -> None:
    journal = study / "studies" / "tiny" / "journal.log"
    before = _sha(journal)

    for name, (flags, says) in BAD_FLAGS.items():
        args = [str(study / "space.yaml") if a == "{space}" else a for a in flags]
        done = cli("run", "--model", str(study / "tiny.py"), "--device", "cpu",
                   "--studies-dir", str(study / "studies"), *FAST, *args)
        line = _one_line_error(done, 2)
        assert says in line, (name, line)
    assert _sha(journal) == before


def test_a_model_file_that_prints_megabytes_does_not_flood_the_terminal(study: Path) -> None:
    model = study / "chatty.py"
    model.write_text(textwrap.dedent(TINY_SOURCE.replace(
        "return Net(dim)", "print('x' * 10_000_000)\n    return Net(dim)")))
    done = run_cli("run", "--model", str(model), "--device", "cpu", "--studies-dir",
                   str(study / "chatty-studies"), "--trials", "1", "--confirm-repeats", "0",
                   *FAST, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout) + len(done.stderr) < 100_000
    assert (study / "chatty-studies" / "chatty" / "logs" / "probe.log").stat().st_size > 10**7


def test_profile_of_a_dataset_that_never_returns_ends_within_its_limit(study: Path) -> None:
    model = study / "loops.py"
    model.write_text(textwrap.dedent(BAD_FILES["dataset_loops"][0]))
    done = run_cli("profile", "--model", str(model), "--device", "cpu", "--time-limit", "20",
                   "--out", str(study / "profile-out"), timeout=120)
    line = _one_line_error(done, 1)
    assert "timeout" in line and "building the" in line
