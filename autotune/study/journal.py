"""The embedded storage's file: Optuna's journal, its lock, and its repair after a torn write.

A journal is one JSON record per line, appended under a lock. A writer killed mid-write (or a
full disk) leaves a last line with no newline: the record being written, which no reader has
applied. Optuna's reader skips such a line, but its writer then glues the next record onto it,
and from then on every read fails. So, as a database would after a crash, the journal is
checked when it is opened and before every append that follows a torn write: what cannot be
replayed is dropped, the original is kept beside it as `journal.log.corrupt-<time>`, and one
warning says what was dropped. A crash at any byte loses only the record being written.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._file import BaseJournalFileLock
from optuna.storages.journal._storage import JournalOperation

from autotune.errors import ConfigError

# How long the journal's lock may be held before a waiting tuner takes a fresh one.
LOCK_GRACE_S = 30.0
_log = logging.getLogger(__name__)
# How Optuna writes every record: `json.dumps({"op_code": ..., ...}, separators=(",", ":"))`.
_RECORD_START = b'{"op_code":'
_OP_CODE = re.compile(rb'\s*\{"op_code":(\d+)[,}]')
_OPS = {int(op): op.name.lower() for op in JournalOperation}
# A record names its study and trial by id, and an id is a position among these records: drop
# one of them and every later record could land on another study's or trial's entry.
_ASSIGNS_IDS = {JournalOperation.CREATE_STUDY, JournalOperation.DELETE_STUDY,
                JournalOperation.CREATE_TRIAL}


class JournalError(ConfigError):
    """A journal that cannot be read or repaired as it stands (exit 2: name the file)."""


def open_journal(path: Path) -> JournalStorage:
    """Optuna's journal storage on the file at `path` (created if missing), repaired first if
    a torn write or a damaged line would stop Optuna from reading it."""
    lock = JournalLock(f"{path}.flock")
    try:
        damaged = path.exists() and bool(scan(path.read_bytes()).dropped)
    except OSError as exc:
        raise JournalError(f"cannot read {path}: {exc.strerror or exc}") from None
    if damaged:
        try:
            with locked(lock):  # read again under the lock: a writer may just have finished
                repair(path)
        except OSError as exc:
            raise JournalError(f"{path} has a torn or damaged record and cannot be repaired: "
                               f"{exc.strerror or exc}") from None
    try:
        return JournalStorage(_JournalFile(str(path), lock))
    except OSError as exc:
        raise JournalError(f"cannot open {path}: {exc.strerror or exc}") from None
    except Exception as exc:  # Optuna's replay of a record that parses but means nothing
        raise JournalError(f"{path} cannot be replayed ({type(exc).__name__}: {exc}); the "
                           "study cannot be read as it stands") from None


@dataclass
class Scan:
    """A journal's bytes sorted into the records to keep and what to drop, in words."""

    kept: list[bytes] = field(default_factory=list)  # whole lines, newline included
    dropped: list[str] = field(default_factory=list)


def scan(data: bytes) -> Scan:
    """Which lines of a journal replay, and which must go.

    A torn last line (no newline) is the record being written when a writer died: dropped.
    A line that is a torn record with a complete one glued on (what Optuna's own append leaves
    after a torn write) keeps the complete record. Any other line that is not a record cannot
    come from a crash (damage, an edit): it is dropped alone when it provably assigned no id
    (an empty line, or a record whose op code is still legible and is not a create or delete);
    otherwise it and everything after it are dropped, because a lost create shifts every later
    id and replaying the rest would attach one trial's figures to another's configuration (as
    PostgreSQL's recovery does, replay stops at the first record it cannot trust). Each dropped
    byte stays in the backup.
    """
    result = Scan()
    lines = data.split(b"\n")
    for number, line in enumerate(lines[:-1], start=1):
        if _is_record(line):
            result.kept.append(line + b"\n")
            continue
        glued = _glued_record(line)
        if glued is not None:
            result.kept.append(glued + b"\n")
            result.dropped.append(f"the torn start of line {number} ({len(line) - len(glued)} "
                                  "bytes, an interrupted write)")
            continue
        harmless = _harmless(line)
        if harmless is not None:
            result.dropped.append(f"line {number} ({harmless})")
            continue
        after = len(lines) - 1 - number
        result.dropped.append(f"line {number} (not a record)" + (
            f" and the {after} lines after it, whose studies and trials depend on what it was"
            if after else ""))
        return result
    if lines[-1]:
        result.dropped.append(f"a torn record at the end ({len(lines[-1])} bytes with no "
                              "newline: a write cut off by a crash or a full disk)")
    return result


def repair(path: Path) -> None:
    """Rewrite the journal with only what replays, the original kept beside it; the caller
    holds the lock. Does nothing to a sound journal."""
    data = path.read_bytes()
    found = scan(data)
    if not found.dropped:
        return
    backup, repaired = _backup_path(path), path.with_name(f"{path.name}.repaired")
    _write_durably(backup, data)
    _write_durably(repaired, b"".join(found.kept))
    os.replace(repaired, path)
    _sync_folder(path.parent)
    _log.warning("%s was repaired: dropped %s; the original is kept as %s", path,
                 "; ".join(found.dropped), backup.name)


class _JournalFile(JournalFileBackend):
    """Optuna's journal file whose appends always start on a fresh line: a torn record left by
    a writer that died since this file was opened is cut off (via `repair`) before the next
    record is written, never glued onto."""

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs)
        path = Path(self._file_path)
        with locked(self._lock):
            if not _ends_on_a_newline(path):
                repair(path)
            with open(path, "ab") as f:
                f.write(text.encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())


class JournalLock(BaseJournalFileLock):
    """The journal's write lock, as an flock on a side file.

    Optuna's default symlink lock outlives a tuner killed while writing: the others wait 30 s,
    then several may break it at once and, with their release failing, write the same record
    twice (a lost trial re-queued twice, say). The kernel drops an flock with its holder. A
    holder that is alive but frozen (SIGSTOP, a node cut off) keeps it: after LOCK_GRACE_S the
    waiting tuner unlinks the file and locks a fresh one, whose release is always its own.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._held = threading.local()

    def acquire(self) -> bool:
        deadline, delay = time.monotonic() + LOCK_GRACE_S, 0.001
        while True:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() > deadline:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self._path)
                    deadline = time.monotonic() + LOCK_GRACE_S
                time.sleep(delay)
                delay = min(2 * delay, 0.05)
                continue
            except BaseException:
                os.close(fd)
                raise
            if _same_file(self._path, fd):
                self._held.fd = fd
                return True
            os.close(fd)  # the file was replaced while this tuner waited: lock the new one

    def release(self) -> None:
        fd = self._held.fd
        self._held.fd = None
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def locked(lock: BaseJournalFileLock) -> Iterator[None]:
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _is_record(line: bytes) -> bool:
    """A line Optuna's replay can apply: a JSON object with a known op code and a writer."""
    try:
        record = json.loads(line)
    except ValueError:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not UTF-8
        return False
    return isinstance(record, dict) and record.get("op_code") in _OPS and "worker_id" in record


def _glued_record(line: bytes) -> bytes | None:
    """The complete record at the end of a line that starts with a torn one, else None. The
    leftmost record start that parses to the end of the line is the glued record: a later one
    would be a value nested inside it."""
    start = line.find(_RECORD_START, 1)
    while start != -1:
        if _is_record(line[start:]):
            return line[start:]
        start = line.find(_RECORD_START, start + 1)
    return None


def _harmless(line: bytes) -> str | None:
    """Why dropping this damaged line alone leaves every later record's meaning intact, or
    None when that cannot be shown."""
    if not line.strip():
        return "an empty line"
    legible = _OP_CODE.match(line)
    if legible is None or int(legible.group(1)) not in _OPS:
        return None
    op = int(legible.group(1))
    return None if op in _ASSIGNS_IDS else f"a damaged {_OPS[op]} record"


def _ends_on_a_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return True
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _backup_path(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    backup, n = path.with_name(f"{path.name}.corrupt-{stamp}"), 1
    while backup.exists():
        backup, n = path.with_name(f"{path.name}.corrupt-{stamp}-{n}"), n + 1
    return backup


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _same_file(path: str, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False
