"""Where a study lives: study names and storage that cannot be opened (the embedded journal's
own tests, its lock's among them, are in test_journal.py)."""

from __future__ import annotations

import pytest

from autotune.storage import validate_study_name

from .conftest import run_cli

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

