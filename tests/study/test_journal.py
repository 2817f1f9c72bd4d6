"""The embedded journal file: a torn write or a damaged line is repaired on open (the original
kept beside it), appends start on a fresh line, and the write lock never outlives its holder."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from autotune.cli import main
from autotune.study import journal as journal_module
from autotune.study.results import list_studies, load_study, study_summary
from autotune.study.storage import open_storage

from ..conftest import ROOT

TRIALS = 4


def _finished_trial(study: optuna.Study, micro: int) -> None:
    """A trial recorded as the tuner records one: a parameter, figures, a state."""
    trial = study.ask()
    trial.suggest_int("micro_batch_size", 1, 64, log=True)
    trial.set_user_attr("config", {"micro_batch_size": micro})
    trial.set_user_attr("status", "ok")
    trial.set_user_attr("samples_per_sec", 100.0 * micro)
    study.tell(trial, 100.0 * micro)


@pytest.fixture(scope="module")
def journal_bytes(tmp_path_factory) -> bytes:
    """A real journal: a study with its attributes and TRIALS finished trials."""
    folder = tmp_path_factory.mktemp("written") / "s"
    study = optuna.create_study(study_name="s", storage=open_storage(None, folder),
                                direction="maximize")
    study.set_user_attr("baseline_config", {"micro_batch_size": 1})
    for number in range(TRIALS):
        _finished_trial(study, 2 ** number)
    return (folder / "journal.log").read_bytes()


def _study_with(folder: Path, data: bytes) -> Path:
    """A study folder `s` under `folder` whose journal holds exactly `data`."""
    (folder / "s").mkdir(parents=True)
    (folder / "s" / "journal.log").write_bytes(data)
    return folder / "s" / "journal.log"


def _complete(studies: Path) -> list[tuple[int, float]]:
    return [(t.number, t.value) for t in load_study("s", studies).trials
            if t.state == TrialState.COMPLETE]


def _backups(journal: Path) -> list[Path]:
    return sorted(journal.parent.glob("journal.log.corrupt-*"))


def test_a_torn_last_record_loses_only_that_record_at_every_byte(journal_bytes, tmp_path,
                                                                 caplog) -> None:
    """Cut the journal anywhere inside its last record (the last trial's COMPLETE, as a kill
    or a full disk would): every earlier trial is kept, the original bytes are in the backup,
    and the repaired journal ends on the last complete record."""
    last_start = journal_bytes.rindex(b"\n", 0, len(journal_bytes) - 1) + 1
    earlier = [(n, 100.0 * 2 ** n) for n in range(TRIALS - 1)]
    for cut in range(last_start + 1, len(journal_bytes)):
        caplog.clear()
        torn = journal_bytes[:cut]
        journal = _study_with(tmp_path / str(cut), torn)
        with caplog.at_level(logging.WARNING, logger="autotune"):
            summary = study_summary(load_study("s", tmp_path / str(cut)))
        assert summary.trials == {"COMPLETE": TRIALS - 1, "RUNNING": 1}, cut
        assert _complete(tmp_path / str(cut)) == earlier, cut
        assert journal.read_bytes() == journal_bytes[:last_start], cut
        [backup] = _backups(journal)
        assert backup.read_bytes() == torn, cut
        [warning] = [r.getMessage() for r in caplog.records]
        assert f"a torn record at the end ({cut - last_start} bytes" in warning, cut
        assert backup.name in warning


def test_a_sound_journal_is_left_alone(journal_bytes, tmp_path, caplog) -> None:
    journal = _study_with(tmp_path, journal_bytes)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert len(_complete(tmp_path)) == TRIALS
    assert journal.read_bytes() == journal_bytes
    assert not _backups(journal) and not caplog.records


def test_a_garbage_line_at_the_end_is_dropped_and_every_trial_kept(journal_bytes,
                                                                   tmp_path) -> None:
    damaged = journal_bytes + b"\x00\x00garbage\n"
    journal = _study_with(tmp_path, damaged)
    assert len(_complete(tmp_path)) == TRIALS
    assert journal.read_bytes() == journal_bytes
    assert _backups(journal)[0].read_bytes() == damaged


def test_a_garbage_line_in_the_middle_drops_it_and_what_depends_on_it(journal_bytes, tmp_path,
                                                                      caplog) -> None:
    """An unreadable line could have created a trial: every later id would shift, so nothing
    after it is trusted (the backup keeps it all)."""
    lines = journal_bytes.splitlines(keepends=True)
    second_done = [i for i, line in enumerate(lines) if b'"op_code":6' in line
                   and b'"state":1' in line][1]
    damaged = b"".join(lines[:second_done + 1] + [b"not a record\n"] + lines[second_done + 1:])
    journal = _study_with(tmp_path, damaged)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        assert _complete(tmp_path) == [(0, 100.0), (1, 200.0)]
    assert journal.read_bytes() == b"".join(lines[:second_done + 1])
    assert _backups(journal)[0].read_bytes() == damaged
    after = len(lines) - second_done - 1
    assert f"line {second_done + 2} (not a record) and the {after} lines after it" in \
        caplog.records[0].getMessage()


def test_damaged_lines_that_assigned_no_id_are_dropped_alone(journal_bytes, tmp_path) -> None:
    """An empty line, or a record whose op code is legible and creates nothing, cannot shift
    any later id: only it goes, every trial stays."""
    lines = journal_bytes.splitlines(keepends=True)
    attr = next(i for i, line in enumerate(lines) if b'"samples_per_sec"' in line)
    damaged = lines[:attr] + [lines[attr][:-12] + b"\n", b"\n"] + lines[attr + 1:]
    journal = _study_with(tmp_path, b"".join(damaged))
    assert len(_complete(tmp_path)) == TRIALS
    first = load_study("s", tmp_path).trials[0]
    assert "samples_per_sec" not in first.user_attrs and first.user_attrs["status"] == "ok"
    assert journal.read_bytes() == b"".join(lines[:attr] + lines[attr + 1:])


def test_a_record_glued_onto_a_torn_one_is_kept(journal_bytes, tmp_path) -> None:
    """The issue's case: a torn write, then Optuna's own append glues the next record onto the
    fragment and every read after fails. The fragment goes, the glued record stays."""
    journal = _study_with(tmp_path, journal_bytes + b'{"op_code":8,"worker_id":"w","tri')
    plain = optuna.load_study(study_name="s",
                              storage=JournalStorage(JournalFileBackend(str(journal))))
    plain.set_user_attr("glued", 1)
    with pytest.raises(json.JSONDecodeError):
        plain.set_user_attr("after", 2)  # Optuna cannot read its own journal any more
    assert load_study("s", tmp_path).user_attrs == {"baseline_config": {"micro_batch_size": 1},
                                                    "glued": 1, "after": 2}
    assert len(_complete(tmp_path)) == TRIALS
    optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(journal))))


def test_an_append_after_a_torn_write_starts_on_a_fresh_line(journal_bytes, tmp_path) -> None:
    """Another tuner dies mid-write while this one has the study open: this one's next record
    replaces the fragment instead of being glued onto it."""
    journal = _study_with(tmp_path, journal_bytes)
    study = load_study("s", tmp_path)
    with open(journal, "ab") as f:
        f.write(b'{"op_code":8,"worker_id":"other","trial_id":1,"user_at')
    study.set_user_attr("after", True)
    _finished_trial(study, 64)
    assert journal.read_bytes().startswith(journal_bytes)
    assert _backups(journal)[0].read_bytes().endswith(b'"user_at')
    plain = optuna.load_study(study_name="s",
                              storage=JournalStorage(JournalFileBackend(str(journal))))
    assert plain.user_attrs["after"] is True
    assert len([t for t in plain.trials if t.state == TrialState.COMPLETE]) == TRIALS + 1


def test_show_repairs_once_with_one_warning_line(journal_bytes, tmp_path, capsys) -> None:
    _study_with(tmp_path, journal_bytes[:-40])
    assert main(["show", "s", "--studies-dir", str(tmp_path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["trials"]["COMPLETE"] == TRIALS - 1
    [line] = err.splitlines()
    assert line.startswith("autotune: warning: ") and "journal.log was repaired" in line
    assert main(["show", "s", "--studies-dir", str(tmp_path), "--json"]) == 0
    assert capsys.readouterr().err == ""


def test_an_unreadable_study_hides_no_other(journal_bytes, tmp_path, capsys) -> None:
    """A journal whose record parses but cannot be replayed is not a crash's doing and is not
    repaired: `studies` lists it with the reason beside the others, and the commands that read
    it say so in one line, exit 2."""
    _study_with(tmp_path, journal_bytes)
    bad = tmp_path / "bad" / "journal.log"
    bad.parent.mkdir()
    bad.write_bytes(journal_bytes + b'{"op_code":2,"worker_id":"w","study_id":0}\n')
    rows = {row["study"]: row for row in list_studies(tmp_path)}
    assert rows["s"]["trials"] == TRIALS and not rows["s"].get("error")
    assert "cannot be replayed" in rows["bad"]["error"]
    assert main(["studies", "--studies-dir", str(tmp_path)]) == 0
    listing = capsys.readouterr().out
    assert "bad" in listing and "cannot be read" in listing and " s " in listing
    for command in (["show", "bad"], ["export", "bad"], ["report", "bad"]):
        assert main([*command, "--studies-dir", str(tmp_path)]) == 2, command
        err = capsys.readouterr().err
        assert "cannot be replayed" in err and "Traceback" not in err, command
        assert len(err.strip().splitlines()) == 1, err


def hold_journal_lock(studies: Path) -> subprocess.Popen:
    """Another process holding the study journal's write lock (returns once it does)."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path\n"
        "from autotune.study.storage import open_storage\n"
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
        monkeypatch.setattr(journal_module, "LOCK_GRACE_S", 1.0)
        start = time.monotonic()
        optuna.create_study(study_name="after", storage=open_storage(None, tmp_path))
        assert 1.0 <= time.monotonic() - start < 10
        assert holder.poll() is None  # its lock was never taken from it, only bypassed
    finally:
        holder.kill()
        holder.wait()
