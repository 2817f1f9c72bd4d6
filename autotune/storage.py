"""Where a study lives, and staying in touch with it: the embedded journal file or an Optuna
storage URL, and retries while the database is briefly unreachable.

The embedded default is Optuna's journal file storage: append-only (a tuner killed mid-write
leaves a readable log) and made for several processes at once (writes take a file lock), which
SQLite is not when trials are enqueued. The lock is an flock (`_FileLock`), which the kernel
drops when its holder dies. PostgreSQL (`--storage postgresql://...`) shares a study
across machines.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._file import BaseJournalFileLock

from autotune.config import ConfigError

JOURNAL_FILE = "journal.log"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# How long to keep retrying while the storage is unreachable, backing off from half a second.
DEFAULT_RETRY_S = 60.0
CONNECT_TIMEOUT_S = 10
# How long the journal's lock may be held before a waiting tuner takes a fresh one.
LOCK_GRACE_S = 30.0


class StorageUnavailable(Exception):
    """The storage stayed unreachable through every retry."""


def validate_study_name(name: str) -> str:
    if not _NAME.fullmatch(name) or ".." in name:
        raise ConfigError(f"study name {name!r} must be letters, digits, '.', '_' or '-' (no "
                          "path separators, no '..')")
    return name


def study_dir(studies_dir: str | Path, name: str) -> Path:
    """The folder of an embedded study: its journal, logs, traces and exported files."""
    return Path(studies_dir) / validate_study_name(name)


def trial_id(storage: BaseStorage, study_name: str, number: int) -> int:
    """The storage's id of trial `number`, through the storage's public calls."""
    study_id = storage.get_study_id_from_name(study_name)
    return storage.get_trial_id_from_study_id_trial_number(study_id, number)


def redact(text: str, url: str | None) -> str:
    """Never echo a storage password."""
    match = re.match(r"[^:/]+://[^:/@]+:([^@]+)@", url or "")
    return text.replace(match.group(1), "***") if match else text


def backoff(total_s: float) -> tuple[float, ...]:
    """Delays doubling from 0.5 s (at most 30 s each) that add up to about `total_s`."""
    delays: list[float] = []
    while sum(delays) < total_s:
        delays.append(min(30.0, 0.5 * 2 ** len(delays), total_s - sum(delays)))
    return tuple(delays)


def open_storage(url: str | None, directory: Path, create: bool = True,
                 retry_s: float = DEFAULT_RETRY_S) -> BaseStorage:
    """The embedded journal file under the study's folder, or any Optuna storage URL, with
    every call retried while the storage is briefly unreachable."""
    if url:
        try:
            backend = _rdb(url)
        except Exception as exc:
            raise ConfigError(f"cannot open storage: {redact(str(exc), url)}") from None
        return _Retrying(backend, url, backoff(retry_s))
    journal = directory / JOURNAL_FILE
    if not create and not journal.exists():
        raise ConfigError(f"no study at {directory} (no {JOURNAL_FILE}); run `autotune run` "
                          "first or pass --storage")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        backend = JournalStorage(JournalFileBackend(str(journal), _FileLock(f"{journal}.flock")))
    except OSError as exc:
        raise ConfigError(f"cannot write the study folder {directory}: "
                          f"{exc.strerror or exc}") from None
    return _Retrying(backend, None, backoff(retry_s))


class _FileLock(BaseJournalFileLock):
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


def _same_file(path: str, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _rdb(url: str) -> BaseStorage:
    if not re.match(r"^[a-z][a-z0-9+]*://", url):
        raise ValueError("a storage URL looks like postgresql://user:password@host/db or "
                         "sqlite:///path.db")
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("postgresql"):
        kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    return optuna.storages.get_storage(RDBStorage(url, engine_kwargs=kwargs))


_LOST_CONNECTION = ("OperationalError", "InterfaceError", "DisconnectionError", "TimeoutError",
                    "PendingRollbackError")


def is_transient(exc: BaseException | None) -> bool:
    """A lost connection or an unreachable file, as opposed to a wrong call; Optuna wraps the
    database's errors, so what caused (or was being handled during) one counts too."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        kind = type(exc)
        if isinstance(exc, OSError) or kind.__module__.startswith("sqlalchemy") and \
                kind.__name__ in _LOST_CONNECTION:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class _Retrying:
    """A storage whose calls are retried with back-off on transient errors.

    Optuna takes any object as a storage that answers its storage calls; a trial's result is
    only lost if the storage stays away through every retry, and then the error says so.
    """

    def __init__(self, storage: BaseStorage, url: str | None,
                 delays_s: tuple[float, ...]) -> None:
        self._storage, self._url, self._delays_s = storage, url, delays_s

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._storage, name)
        if not callable(attr) or name.startswith("__"):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.retry(lambda: attr(*args, **kwargs))

        return call

    def retry(self, fn: Callable[[], Any]) -> Any:
        for delay in (*self._delays_s, None):
            try:
                return fn()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if delay is None:
                    total = sum(self._delays_s)
                    raise StorageUnavailable(
                        f"the study storage was unreachable for {total:.0f} s: "
                        f"{redact(_root_cause(exc), self._url)}. Every finished trial is in "
                        "the storage; run the same command to continue.") from None
                time.sleep(delay)
        raise AssertionError("unreachable")


def _root_cause(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
