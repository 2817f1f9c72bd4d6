"""A script's writes to the user's paths (its arguments' absolute ones, or through the scratch
folder's links to the user's folder) land under the scratch folder, and read back from there;
everything else is written where it says."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from autotune.trial.script.writes import KeptWrites, kept_in_scratch, protected_paths


def test_writes_to_the_users_paths_land_in_the_scratch_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, scratch, elsewhere = tmp_path / "home", tmp_path / "scratch", tmp_path / "other"
    (home / "out").mkdir(parents=True)
    (home / "out" / "ckpt.pt").write_text("the user's")
    (scratch / "cwd").mkdir(parents=True)
    (scratch / "cwd" / "out").symlink_to(home / "out")
    named = tmp_path / "run1"
    monkeypatch.chdir(scratch / "cwd")
    assert protected_paths(["--out_dir", str(named), f"--log={elsewhere}", "rel"]) == \
        [named, elsewhere]
    saved = (os.mkdir, torch.save)
    with kept_in_scratch(KeptWrites(scratch, [named])):
        os.makedirs(named, exist_ok=True)
        os.makedirs(named, exist_ok=True)  # it is there now, as the script sees it
        assert named.is_dir()
        torch.save({"step": 1}, named / "ckpt.pt")
        assert torch.load(named / "ckpt.pt") == {"step": 1}
        with open("out/ckpt.pt", "w") as f:  # through a link: the user's file
            f.write("the trial's")
        assert Path("out/ckpt.pt").read_text() == "the trial's"
        Path("out/new").mkdir(parents=True, exist_ok=True)
        Path("local.txt").write_text("scratch")  # the scratch folder's own
        (elsewhere / "x").mkdir(parents=True)  # no argument names it: written where it says
    assert not named.exists()
    assert (home / "out" / "ckpt.pt").read_text() == "the user's"
    assert sorted(p.name for p in (home / "out").iterdir()) == ["ckpt.pt"]
    assert (scratch / "cwd" / "local.txt").read_text() == "scratch"
    assert (elsewhere / "x").is_dir()
    moved = scratch / "elsewhere" / named.resolve().relative_to("/")
    assert (moved / "ckpt.pt").is_file()
    assert (os.mkdir, torch.save) == saved  # every patch taken back


def test_autotunes_own_files_are_never_moved(tmp_path: Path) -> None:
    """An argument naming a folder that holds the study (`--data_dir .`, say): the trial's
    trace and the compile caches inside it are still written where autotune looks."""
    study = tmp_path / "studies" / "train"
    writes = KeptWrites(tmp_path / "scratch", [tmp_path], [study])
    assert writes.target(str(study / "trace.json")) == str(study / "trace.json")
    assert writes.target(str(tmp_path / "out.txt")) != str(tmp_path / "out.txt")
