"""Run the user's training script as they run it (`python train.py ARGS`): as `__main__`, with
their arguments in `sys.argv` and its directory first on `sys.path`, in this process, with the
libraries' hooks installed (each library patched when the script imports it). The run ends
when the library's training loop does (`TrainingDone`), so nothing the script does after
training runs; every other ending is one clear message.

The script works in a scratch folder of its own (`working_in`), never in the user's: what it
writes by a relative path to a new file or folder lands there. The folder holds a link to each
entry of the user's, so its relative reads work as before, and an argument that names an
existing path outside the user's folder by a relative path (`../data`) is made absolute."""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune.trial.script.errors import (
    NeverTrained,
    ScriptArgumentsRejected,
    ScriptError,
    ScriptFailed,
    never_trained_message,
)
from autotune.trial.script.imports import patched_on_import
from autotune.trial.script.libraries import patches
from autotune.trial.script.loop import watching_loop
from autotune.trial.script.loop_terms import OWN_LOOP
from autotune.trial.script.observer import TrainingDone
from autotune.trial.script.preload import ImportRecorder, recording_imports
from autotune.trial.script.session import (
    OutputTail,
    ScriptBaseline,
    ScriptTrial,
    Settings,
    active,
    current,
)
from autotune.trial.script.sources import caller_site, record_flags
from autotune.trial.script.worst_batch import loaders_cut
from autotune.trial.script.writes import (
    KeptWrites,
    autotunes_paths,
    kept_in_scratch,
    protected_paths,
)
from autotune.trial.training import Unsupported

# A parser's usage longer than this is left out of its refusal (TrainingArguments' is 20,000
# characters): its own line says what was wrong.
USAGE_SHOWN = 1000


@dataclass(frozen=True)
class ScriptRun:
    """A script run that reached its training: its own start-up (start to Trainer.train/fit),
    its own settings, the settings the trial applied (library terms), the optimizer steps the
    library took, whether the observer stopped it (else the script's training ended first),
    and what it imported (`preload`: asked only by the probe, which tells the fork server of
    the trials what to import ahead; a trial does not pay for the listing)."""

    startup_s: float
    baseline: ScriptBaseline
    settings: Settings
    steps: int
    stopped_by_observer: bool
    imports: ImportRecorder


def run_script(path: str | Path, argv: Sequence[str], trial: ScriptTrial) -> ScriptRun:
    """Run `path` with `argv` until its training has run under `trial` and ended; the script
    works in `trial.scratch_dir` (`working_in`)."""
    given = Path(path)
    path = given.absolute()
    if not path.is_file():
        raise ScriptError(f"training script not found: {given}")
    trial.script, trial.folder = path.name, path.parent
    saved_argv, saved_path = sys.argv, list(sys.path)
    home = Path.cwd()
    sys.argv = [str(path), *absolute_arguments(argv, home)]
    sys.path.insert(0, str(path.resolve().parent))
    trial.started_at = time.perf_counter()
    imports = None
    writes = KeptWrites(trial.scratch_dir, protected_paths(sys.argv[1:]),
                        autotunes_paths(*trial.own_paths))
    try:
        with working_in(trial.scratch_dir / "cwd", home), active(trial), \
                patched_on_import(patches()), _parser_exits_recorded(), \
                _output_kept(trial), kept_in_scratch(writes), \
                watching_loop(trial, path.parent, OWN_LOOP), \
                loaders_cut(trial.worst), recording_imports() as imports, \
                _startup_limited(trial):
            runpy.run_path(str(path), run_name="__main__")
        if trial.training and trial.steps:  # its own loop ended before its measurement did
            trial.observer.on_train_end()
            raise TrainingDone
    except TrainingDone:
        assert trial.baseline is not None and trial.train_called_at is not None
        assert imports is not None
        return ScriptRun(trial.train_called_at - trial.started_at, trial.baseline,
                         trial.settings, trial.steps, trial.stopped_by_observer,
                         imports)
    except (AutotuneError, KeyboardInterrupt):
        raise
    except _StartupLimit:
        raise NeverTrained(_never_trained(trial, ended=False) + (
            "" if trial.loop is not None and trial.loop.seen.trained else
            f"; a start-up longer than {trial.startup_limit_s:.0f} s: --startup-limit 10m") +
            _last_lines(trial.output)) from None
    except SystemExit as exc:
        if trial.training and trial.steps and trial.own_loop and \
                exc.code in (0, None):
            trial.observer.on_train_end()
            assert trial.baseline is not None and trial.train_called_at is not None
            return ScriptRun(trial.train_called_at - trial.started_at, trial.baseline,
                             trial.settings, trial.steps, False, imports)
        if trial.training and (trial.steps or not trial.own_loop):
            raise ScriptFailed(f"{path.name} exited (status {exc.code}) while training") from None
        raise _exit_error(trial, argv, exc) from None
    except BaseException as exc:
        if trial.training:
            raise  # the configuration's own failure (out of memory, say): the trial's result
        if trial.rejected_arguments:
            raise ScriptArgumentsRejected(
                f"{path.name} rejected its arguments: {trial.rejected_arguments}") from None
        raise ScriptFailed(f"{path.name} failed before its training started:\n"
                           f"{script_traceback(exc, path)}") from None
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
    raise NeverTrained(_never_trained(trial, ended=True) + _last_lines(trial.output))


@contextlib.contextmanager
def working_in(scratch: Path, home: Path) -> Iterator[Path]:
    """The script's current directory for its run: `scratch`, made with a link to each entry
    of `home` (the user's folder), so relative reads find the user's files and relative writes
    of new files stay out of it; `home` again afterwards."""
    scratch.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError), os.scandir(home) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                (scratch / entry.name).symlink_to(entry.path)
    os.chdir(scratch)
    try:
        yield scratch
    finally:
        os.chdir(home)


def absolute_arguments(argv: Sequence[str], home: Path) -> list[str]:
    """`argv` with each argument (or `--flag=` value) that names an existing file or folder
    outside `home` by a path relative to it (`../data`) made absolute: from the scratch folder
    it would name nothing. Paths inside `home` stay as given, the scratch folder's links find
    them."""
    def absolute(text: str) -> str:
        if not text.startswith(".."):
            return text
        target = Path(os.path.normpath(home / text))
        try:
            return str(target) if target.exists() and not target.is_relative_to(home) else text
        except (OSError, ValueError):
            return text

    out = []
    for arg in argv:
        flag, equals, value = arg.partition("=")
        out.append(f"{flag}={absolute(value)}" if arg.startswith("-") and equals
                   else absolute(arg))
    return out


def script_traceback(exc: BaseException, path: Path) -> str:
    """The exception as Python prints it, from the script's own first frame on (autotune's
    and runpy's frames left out; a syntax error as its file, line and caret)."""
    error = traceback.TracebackException.from_exception(exc)
    frames = list(error.stack)
    script = str(path.resolve())
    # No frame of the script's (a syntax error in it): none of autotune's or runpy's either.
    first = next((i for i, f in enumerate(frames) if str(Path(f.filename).resolve()) == script),
                 len(frames))
    error.stack = traceback.StackSummary.from_list(frames[first:])
    return "".join(error.format()).rstrip()


def _exit_error(trial: ScriptTrial, argv: Sequence[str], exc: SystemExit) -> AutotuneError:
    """A script that exited before its training: its parser refused the arguments (the trial's
    flags: a value it cannot run), it printed its help, or it exited by itself (its last lines
    say why)."""
    given = " ".join(argv) or "no arguments"
    if trial.rejected_arguments and trial.flags_set:
        return Unsupported(f"{' '.join(trial.flags_set)}: {trial.script}'s parser refuses "
                           f"them: {trial.rejected_arguments.strip().splitlines()[-1]}")
    if trial.rejected_arguments:
        return ScriptArgumentsRejected(f"{trial.script} rejected its arguments ({given}):\n"
                                       f"{trial.rejected_arguments.rstrip()}")
    if trial.printed_help:
        return ScriptError(f"{trial.script} printed its help and exited ({given}): the "
                           f"arguments after -- are {trial.script}'s own; autotune's are "
                           "before it (autotune run --help)")
    if exc.code in (0, None):
        return NeverTrained(_never_trained(trial, ended=True) + _last_lines(trial.output))
    if not isinstance(exc.code, int):  # sys.exit("reason"): Python prints it, status 1
        return ScriptFailed(f"{trial.script} exited before its training started: {exc.code}")
    return ScriptFailed(f"{trial.script} exited with status {exc.code} before its training "
                        f"started{_last_lines(trial.output)}")


class _StartupLimit(BaseException):
    """Raised into a probe's script whose training has not started by its start-up limit, so
    that it stops where it is and says what it saw (not an Exception: a script's `except
    Exception:` does not swallow it)."""


@contextlib.contextmanager
def _startup_limited(trial: ScriptTrial) -> Iterator[None]:
    """While inside, a script whose training has not started after `trial.startup_limit_s`
    is stopped (`_StartupLimit`, from a timer signal in the main thread); no limit where there
    is none, or off the main thread."""
    limit = trial.startup_limit_s
    if limit is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        if not trial.training:
            raise _StartupLimit

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _never_trained(trial: ScriptTrial, ended: bool) -> str:
    """The message for a script whose training autotune never saw start, with what it saw."""
    seen = trial.loop.seen if trial.loop is not None else None
    return never_trained_message(trial.script, time.perf_counter() - trial.started_at, ended,
                                 seen.describe() if seen is not None else "",
                                 seen is not None and seen.trained)


def _last_lines(output: OutputTail) -> str:
    """What the script wrote last, to follow a message (nothing where it wrote nothing)."""
    lines = output.lines()
    return "; its last lines:\n" + "\n".join(f"  {line}" for line in lines) if lines else ""


class _Tee:
    """A stream that passes what the script writes on and, until its training starts (no
    message shows it after), keeps its last lines."""

    def __init__(self, stream: Any, trial: ScriptTrial) -> None:
        self._stream, self._trial = stream, trial

    def write(self, text: str) -> int:
        if not self._trial.training:
            self._trial.output.add(text)
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _output_kept(trial: ScriptTrial) -> Iterator[None]:
    """The script's stdout and stderr, as written, kept in `trial.output` while it runs."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Tee(sys.stdout, trial), _Tee(sys.stderr, trial)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


@contextlib.contextmanager
def _parser_exits_recorded() -> Iterator[None]:
    """argparse's refusal (its message, after its usage where that is short) kept for the
    message, whether it printed its help, and each value it parsed (`sources.record_flags`:
    what the answer names a setting by)."""
    original_exit, original_help = argparse.ArgumentParser.exit, \
        argparse.ArgumentParser.print_help
    original_parse = argparse.ArgumentParser.parse_known_args

    def parse_known_args(self: argparse.ArgumentParser, args: Any = None,
                         namespace: Any = None) -> Any:
        parsed = original_parse(self, args, namespace)
        trial = current()
        # the script's own parsers: a library's (HfArgumentParser's) are read where they build
        if trial is not None and not trial.training and caller_site(sys._getframe(1)):
            record_flags(self, args, parsed[0], trial.flags)
        return parsed

    def exit(self: argparse.ArgumentParser, status: int = 0, message: Any = None) -> Any:
        trial = current()
        if trial is not None and status and not trial.training:
            usage = self.format_usage()
            trial.rejected_arguments = (usage if len(usage) <= USAGE_SHOWN else "") + \
                (message or "")
        return original_exit(self, status, message)

    def print_help(self: argparse.ArgumentParser, file: Any = None) -> None:
        trial = current()
        if trial is not None and not trial.training:
            trial.printed_help = True
        original_help(self, file)

    argparse.ArgumentParser.exit = exit  # type: ignore[method-assign]
    argparse.ArgumentParser.print_help = print_help  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.exit = original_exit  # type: ignore[method-assign]
        argparse.ArgumentParser.print_help = original_help  # type: ignore[method-assign]
        argparse.ArgumentParser.parse_known_args = original_parse  # type: ignore[method-assign]
