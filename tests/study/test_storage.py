"""Where a study lives: study names, storage that cannot be opened, and PostgreSQL however its
URL is spelt (the embedded journal's own tests are in test_journal.py)."""

from __future__ import annotations

import subprocess
import sys

import optuna
import pytest

from autotune.cli import main
from autotune.study.storage import open_storage, validate_study_name, with_postgres_driver

from ..conftest import TINY_MLP


@pytest.mark.parametrize(("name", "ok"), [("mlp", True), ("mlp-v2.1", True), ("a/b", False),
                                          ("..", False), ("x..y", False), ("", False)])
def test_study_names(name: str, ok: bool) -> None:
    if ok:
        assert validate_study_name(name) == name
    else:
        with pytest.raises(ValueError, match="study name"):
            validate_study_name(name)


def test_unwritable_study_folder_and_malformed_storage_exit_2(tmp_path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert main(["run", *TINY_MLP, "--studies-dir", str(blocker / "studies")]) == 2
    err = capsys.readouterr().err
    assert "cannot write the study folder" in err and "Traceback" not in err
    for url in ("not-a-url", "postgresql//host/db", "nosuchdb://x"):
        code = main(["run", *TINY_MLP, "--studies-dir", str(tmp_path), "--storage", url])
        err = capsys.readouterr().err
        assert code == 2, (url, err)
        assert "cannot open storage" in err and "Traceback" not in err
    assert not any(tmp_path.rglob("journal.log"))


@pytest.mark.parametrize(("url", "expected"), [
    ("postgresql://u:pw@host/db", "postgresql+psycopg2://u:pw@host/db"),
    ("postgres://u:pw@host:5432/db", "postgresql+psycopg2://u:pw@host:5432/db"),
    ("postgresql+psycopg2://u:pw@host/db", "postgresql+psycopg2://u:pw@host/db"),
    ("postgresql+psycopg://u:pw@host/db", "postgresql+psycopg://u:pw@host/db"),
    ("sqlite:///postgresql://x.db", "sqlite:///postgresql://x.db"),
])
def test_a_postgres_url_without_a_driver_gets_psycopg2(url: str, expected: str) -> None:
    assert with_postgres_driver(url) == expected


@pytest.mark.slow
def test_every_spelling_of_a_postgres_url_reaches_the_server(postgres, tmp_path,
                                                             capsys) -> None:
    """What the postgres extra installs serves `postgresql://`, `postgres://` and
    `postgresql+psycopg2://` alike, and none of them shows the password."""
    explicit = postgres.url
    assert explicit.startswith("postgresql+psycopg2://")
    spellings = [explicit, explicit.replace("postgresql+psycopg2://", "postgresql://"),
                 explicit.replace("postgresql+psycopg2://", "postgres://")]
    for number, url in enumerate(spellings):
        study = optuna.create_study(study_name=f"spelling-{number}",
                                    storage=open_storage(url, tmp_path), direction="maximize")
        study.add_trial(optuna.trial.create_trial(value=float(number)))
        assert main(["studies", "--storage", url]) == 0
        listed = capsys.readouterr()
        assert all(f"spelling-{n}" in listed.out for n in range(number + 1)), listed.err
        assert postgres.password not in listed.out + listed.err
    reloaded = optuna.load_study(study_name="spelling-0",
                                 storage=open_storage(spellings[2], tmp_path))
    assert reloaded.trials[0].value == 0.0


@pytest.mark.slow
def test_tuners_opening_a_new_database_at_once_all_get_it(postgres, tmp_path) -> None:
    """Each creates Optuna's tables; the ones PostgreSQL turns away wait and find them made."""
    url = postgres.new_database("race")
    opener = ("import sys; from pathlib import Path; "
              "from autotune.study.storage import open_storage; "
              "open_storage(sys.argv[1], Path('.'), retry_s=0)")
    openers = [subprocess.Popen([sys.executable, "-c", opener, url], cwd=tmp_path,
                                stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for process in openers:
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
