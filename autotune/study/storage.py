"""Where a study lives, and staying in touch with it: the embedded journal file or an Optuna
storage URL, and retries while the database is briefly unreachable.

The embedded default is Optuna's journal file storage (`journal`): append-only and made for
several processes at once (writes take a file lock), which SQLite is not when trials are
enqueued. PostgreSQL (`--storage postgresql://...`) shares a study across machines.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, RDBStorage

from autotune.errors import ConfigError, RunFailed
from autotune.options import DEFAULT_STORAGE_RETRY_S
from autotune.study.journal import open_journal

JOURNAL_FILE = "journal.log"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
CONNECT_TIMEOUT_S = 10
# Waits before opening a new database again after another tuner won the race to create it.
SCHEMA_RACE_DELAYS_S = (0.5, 1.0, 2.0, 4.0)
_POSTGRES_URL = re.compile(r"postgres(ql)?(\+[a-z0-9]+)?://")
_POSTGRES_BARE = re.compile(r"^postgres(ql)?://")


class StorageUnavailable(RunFailed):
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
                 retry_s: float = DEFAULT_STORAGE_RETRY_S) -> BaseStorage:
    """The embedded journal file under the study's folder, or any Optuna storage URL, with
    every call retried while the storage is briefly unreachable."""
    if url:
        try:
            backend = _rdb(url)
        except ImportError as exc:
            hint = " (psycopg2 comes with the postgres extra: pip install 'autotune[postgres]')" \
                if with_postgres_driver(url).startswith("postgresql+psycopg2://") else ""
            raise ConfigError(f"cannot open storage: {redact(str(exc), url)}{hint}") from None
        except Exception as exc:
            raise ConfigError(f"cannot open storage: {redact(str(exc), url)}") from None
        return _Retrying(backend, url, backoff(retry_s))
    journal = directory / JOURNAL_FILE
    if not create and not journal.exists():
        raise ConfigError(f"no study at {directory} (no {JOURNAL_FILE}); run `autotune run` "
                          "first or pass --storage")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot write the study folder {directory}: "
                          f"{exc.strerror or exc}") from None
    return _Retrying(open_journal(journal), None, backoff(retry_s))


def _rdb(url: str) -> BaseStorage:
    if not re.match(r"^[a-z][a-z0-9+]*://", url):
        raise ValueError("a storage URL looks like postgresql://user:password@host/db or "
                         "sqlite:///path.db")
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if _POSTGRES_URL.match(url):
        kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    for delay in (*SCHEMA_RACE_DELAYS_S, None):
        try:
            return optuna.storages.get_storage(RDBStorage(with_postgres_driver(url),
                                                          engine_kwargs=kwargs))
        except Exception as exc:
            if delay is None or not _lost_schema_race(exc):
                raise
            time.sleep(delay)  # another tuner is creating the tables: they exist once it is done
    raise AssertionError("unreachable: the last attempt returns or raises")


def _lost_schema_race(exc: BaseException) -> bool:
    """Tuners that open a new database at once each create Optuna's tables; PostgreSQL lets one
    win and fails the others' CREATE TABLE on a duplicate key of its catalogue."""
    text = str(exc).lower()
    return type(exc).__name__ in ("IntegrityError", "ProgrammingError") and \
        ("duplicate key" in text or "already exists" in text)


def with_postgres_driver(url: str) -> str:
    """A PostgreSQL URL with no driver named (`postgresql://`, or libpq's `postgres://`, which
    SQLAlchemy no longer reads) as one for psycopg2; any other URL as it is.

    One driver, psycopg2: it is what the `postgres` extra installs, and SQLAlchemy reads a bare
    `postgresql://` as psycopg2 up to 2.0 but as psycopg 3 from 2.1, so the same URL would
    otherwise need another package after an upgrade. A URL that names its driver
    (`postgresql+psycopg://`) keeps it.
    """
    return _POSTGRES_BARE.sub("postgresql+psycopg2://", url, count=1)


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
