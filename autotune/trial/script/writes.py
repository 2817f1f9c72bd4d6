"""Nothing a script writes reaches the user's files: what it writes to a path its arguments name
(an absolute `--out_dir /data/run1`), or through one of the scratch folder's links to the user's
folder (an `out/` that was there already), is written under the scratch folder instead, and
what it reads back of it is read from there. A hand-written loop has no setting that turns its
checkpoints and outputs off, as Hugging Face's and Lightning's trainers have.

Python's own ways to write are watched while the run lasts (`open`, `os.open`, `os.mkdir`,
`os.makedirs`, `os.replace` and `os.rename`, `torch.save`), and `os.stat` for the paths moved,
so that a folder the script made is there when it looks (`os.makedirs(out, exist_ok=True)`);
everything else (caches, the temp directory, the inductor cache) is written where it says."""

from __future__ import annotations

import builtins
import contextlib
import io
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

_WRITING = ("w", "a", "x", "+")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class KeptWrites:
    """Where a path the script writes lands: itself, or its place under `scratch/elsewhere`."""

    def __init__(self, scratch: Path, protected: Iterable[Path],
                 autotunes: Iterable[Path] = ()) -> None:
        self.scratch = Path(os.path.realpath(scratch))
        self.overlay = self.scratch / "elsewhere"
        self.protected = tuple(Path(os.path.realpath(p)) for p in protected
                               if not _inside(Path(os.path.realpath(p)), self.scratch))
        # autotune's own files (the trial's trace, the compile caches): never moved
        self.autotunes = (self.scratch, *(Path(os.path.realpath(p)) for p in autotunes))
        self.moved = False  # whether anything was written elsewhere yet

    def target(self, path: Any) -> Any:
        """`path` where a write to it lands (unchanged where it is not the user's)."""
        text = _text(path)
        if text is None:
            return path
        given = Path(os.path.abspath(text))
        real = Path(os.path.realpath(given))
        if any(_inside(real, own) for own in self.autotunes):
            return path
        through_link = _inside(given, self.scratch)
        if not through_link and not any(_inside(real, root) for root in self.protected):
            return path
        self.moved = True
        return str(self.overlay / real.relative_to(real.anchor))

    def read(self, path: Any) -> Any:
        """`path` where a read of it finds what the script wrote there (unchanged otherwise)."""
        if not self.moved:
            return path
        moved = self.target(path)
        return moved if moved is not path and os.path.lexists(moved) else path


def autotunes_paths(*given: str | os.PathLike | None) -> list[Path]:
    """autotune's own folders a trial writes to while the script runs: those given (the
    trace's), and the compile caches the environment names."""
    names = [*given, *(os.environ.get(v) for v in ("TORCHINDUCTOR_CACHE_DIR",
                                                    "TRITON_CACHE_DIR"))]
    return [Path(n) for n in names if n]


def protected_paths(argv: Iterable[str]) -> list[Path]:
    """The absolute paths among a script's arguments (`--out /x`, `--out=/x`): what it may
    write to that is the user's."""
    out = []
    for word in argv:
        value = word.partition("=")[2] if word.startswith("-") and "=" in word else word
        if os.path.isabs(value):
            out.append(Path(value))
    return out


@contextlib.contextmanager
def kept_in_scratch(writes: KeptWrites) -> Iterator[KeptWrites]:
    """While inside, the script's writes to the user's paths land under the scratch folder."""
    saved = {(module, name): getattr(module, name) for module, name in _PATCHED}
    originals = {key: saved[target] for key, target in _KEYS.items()}

    def opened(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if isinstance(mode, str) and any(c in mode for c in _WRITING):
            file = _made_parent(writes.target(file), file)
        else:
            file = writes.read(file)
        return originals["open"](file, mode, *args, **kwargs)

    def os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        path = _made_parent(writes.target(path), path) if flags & _WRITE_FLAGS else \
            writes.read(path)
        return originals["os_open"](path, flags, *args, **kwargs)

    def one_path(name: str) -> Callable[..., Any]:
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            return originals[name](_made_parent(writes.target(path), path), *args, **kwargs)
        return call

    def two_paths(name: str) -> Callable[..., Any]:
        def call(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
            return originals[name](writes.read(src), _made_parent(writes.target(dst), dst),
                                   *args, **kwargs)
        return call

    def stat(path: Any, *args: Any, **kwargs: Any) -> Any:
        return originals["stat"](path if isinstance(path, int) else writes.read(path),
                                 *args, **kwargs)

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        return originals["save"](obj, _made_parent(writes.target(f), f), *args, **kwargs)

    replacements = {"open": opened, "os_open": os_open, "mkdir": one_path("mkdir"),
                    "makedirs": one_path("makedirs"), "replace": two_paths("replace"),
                    "rename": two_paths("rename"), "stat": stat, "save": save}
    for key, function in replacements.items():
        for module, name in _TARGETS[key]:
            setattr(module, name, function)
    try:
        yield writes
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


def _made_parent(target: Any, given: Any) -> Any:
    """`target`, its folder made where it was moved under the scratch folder."""
    if target is not given:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
    return target


def _text(path: Any) -> str | None:
    if isinstance(path, (str, os.PathLike)) and not isinstance(path, io.IOBase):
        text = os.fspath(path)
        return text if isinstance(text, str) else os.fsdecode(text)
    if isinstance(path, bytes):
        return os.fsdecode(path)
    return None


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


# Each function replaced, by the module attributes it is reached through.
_TARGETS: dict[str, tuple[tuple[Any, str], ...]] = {
    "open": ((builtins, "open"), (io, "open")), "os_open": ((os, "open"),),
    "mkdir": ((os, "mkdir"),), "makedirs": ((os, "makedirs"),),
    "replace": ((os, "replace"),), "rename": ((os, "rename"),), "stat": ((os, "stat"),),
    "save": ((torch, "save"), (torch.serialization, "save")),
}
_KEYS = {key: targets[0] for key, targets in _TARGETS.items()}
_PATCHED = tuple(target for targets in _TARGETS.values() for target in targets)
