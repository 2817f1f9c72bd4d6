"""Where a study lives: study names, the embedded journal's lock (a killed or frozen holder does
not stall the others), and storage that cannot be opened."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autotune import storage as storage_module
from autotune.storage import open_storage, validate_study_name

from .conftest import ROOT, run_cli

TINY_MLP = ["--model", "models/mlp.py", "--device", "cpu", "--model-arg", "feature_dim=32",
            "--model-arg", "hidden=64", "--model-arg", "layers=2", "--model-arg",
            "num_samples=4096", "--global-batch-size", "256", "--fix", "compile_mode=none"]


@pytest.mark.parametrize(("name", "ok"), [("mlp", True), ("mlp-v2.1", True), ("a/b", False),
                                          ("..", False), ("x..y", False), ("", False)])
def test_study_names(name: str, ok: bool) -> None:
    if ok:
        assert validate_study_name(name) == name
    else:
        with pytest.raises(ValueError, match="study name"):
            validate_study_name(name)


def hold_journal_lock(studies: Path) -> subprocess.Popen:
    """Another process holding the study journal's write lock (returns once it does)."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from autotune.storage import open_storage\n"
        "open_storage(None, Path(sys.argv[1]))._storage._backend._lock.acquire()\n"
        "print('held', flush=True); time.sleep(120)"), str(studies)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_tuner_killed_while_writing_the_journal_does_not_stall_the_others(tmp_path) -> None:
    """The journal's lock dies with its holder: no 30 s wait, no lock broken by two tuners."""
    holder = hold_journal_lock(tmp_path)
    holder.kill()
    holder.wait()
    start = time.monotonic()
    optuna.create_study(study_name="after", storage=open_storage(None, tmp_path))
    assert time.monotonic() - start < 5
    assert optuna.load_study(study_name="after", storage=open_storage(None, tmp_path))


def test_a_frozen_lock_holder_is_bypassed_after_the_grace_period(tmp_path, monkeypatch) -> None:
    """A tuner stopped while holding the journal's lock (SIGSTOP, a lost node) does not stall
    the others for more than the grace period."""
    holder = hold_journal_lock(tmp_path)
    try:
        monkeypatch.setattr(storage_module, "LOCK_GRACE_S", 1.0)
        start = time.monotonic()
        optuna.create_study(study_name="after", storage=open_storage(None, tmp_path))
        assert 1.0 <= time.monotonic() - start < 10
        assert holder.poll() is None  # its lock was never taken from it, only bypassed
    finally:
        holder.kill()
        holder.wait()


def test_unwritable_study_folder_and_malformed_storage_exit_2(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    done = run_cli("run", *TINY_MLP, "--studies-dir", str(blocker / "studies"))
    assert done.returncode == 2
    assert "cannot write the study folder" in done.stderr and "Traceback" not in done.stderr
    for url in ("not-a-url", "postgresql//host/db", "nosuchdb://x"):
        done = run_cli("run", *TINY_MLP, "--studies-dir", str(tmp_path), "--storage", url)
        assert done.returncode == 2, (url, done.stderr)
        assert "cannot open storage" in done.stderr and "Traceback" not in done.stderr
    assert not any(tmp_path.rglob("journal.log"))
