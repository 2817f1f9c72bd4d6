"""Where a script's setting is said, so that its answer names it the way the user changes it:
one of the script's own command-line flags (its argparse parser's value, traced to the library
call that reads it as `args.<dest>`), or the line of its code that makes that call.

The parser is watched while the script parses its arguments (`record_flags`: each option's
value, whether it was given and how); a library hook, inside the call it patches, asks for the
user's call site (`call_site`: the first frame of the user's own code, and the call expression
there) and for each keyword where its value came from (`CallSite.source`)."""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from autotune.trial.protocol import (
    EQUALS,
    NEGATABLE,
    SWITCH,
    VALUE,
    ScriptFlag,
    without_flag,
)
from autotune.trial.script.errors import ScriptError
from autotune.trial.script.preload import library_roots

_AUTOTUNE = str(Path(__file__).resolve().parents[2]) + os.sep


@dataclass(frozen=True)
class Flag:
    """One option of the script's parser as it parsed the command line."""

    option: str        # as the user writes it: its first long option string
    dest: str
    value: Any
    form: str          # VALUE, EQUALS (given as --flag=VALUE), SWITCH or NEGATABLE
    given: bool        # on the command line (else its default)
    const: Any = None  # a switch's value when it is present
    aliases: tuple[str, ...] = ()  # its other option strings (`-b` for `--batch-size`)
    choices: tuple[Any, ...] = ()  # the values its parser allows (any: none named)


@dataclass(frozen=True)
class Source:
    """Where one setting of the script is said: its own flag (`flag`, written as `form`), a
    flag of the launcher it runs under (`launcher`: accelerate launch's), or a line of its code
    (`file`, `line`, the call there as the code names it); none of them where it was not
    found (the answer then names the library's setting alone)."""

    flag: str | None = None
    form: str = VALUE
    const: Any = None
    launcher: str | None = None
    file: str | None = None
    line: int | None = None
    call: str | None = None
    aliases: tuple[str, ...] = ()  # the flag's other spellings (`-b`), taken out with it

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items()
                if v is not None and v != VALUE and v != ()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Source:
        return cls(**{**data, "aliases": tuple(data.get("aliases", ()))})


def with_flags(argv: Sequence[str], flags: Iterable[ScriptFlag]) -> list[str]:
    """`argv` with each of `flags` set: the flag's own words taken out wherever they are, then
    the new ones added."""
    out = list(argv)
    for flag in flags:
        out = without_flag(out, flag.flag, flag.form, flag.aliases) + flag.words()
    return out


def record_flags(parser: argparse.ArgumentParser, args: Sequence[str] | None,
                 namespace: Any, into: dict[str, Flag]) -> None:
    """Each option of `parser` with the value it parsed from `args` (the command line where
    None) into `namespace`, by its dest."""
    words = list(sys.argv[1:] if args is None else args)
    for action in parser._actions:
        if not action.option_strings or action.dest == argparse.SUPPRESS or \
                not hasattr(namespace, action.dest):
            continue
        form = _form(action)
        if form is None:
            continue
        option = next((o for o in action.option_strings if o.startswith("--")),
                      action.option_strings[0])
        given = [w for w in words if w in action.option_strings or
                 any(w.startswith(f"{o}=") for o in action.option_strings)]
        if form == VALUE and any("=" in w for w in given):
            form = EQUALS
        into[action.dest] = Flag(option, action.dest, getattr(namespace, action.dest), form,
                                 bool(given), getattr(action, "const", None),
                                 tuple(o for o in action.option_strings if o != option),
                                 tuple(action.choices or ()))


def _form(action: argparse.Action) -> str | None:
    """How an option is written, or None for one that sets no single value (help, counts,
    lists)."""
    if isinstance(action, argparse.BooleanOptionalAction):
        return NEGATABLE
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                           argparse._StoreConstAction)):
        return SWITCH
    if type(action) is argparse._StoreAction and action.nargs in (None, "?"):
        return VALUE
    return None


@dataclass(frozen=True)
class CallSite:
    """A call in the user's own code: its frame (alive while the call runs), file, line and
    the call expression, where the file's source has it."""

    frame: FrameType
    file: str
    line: int
    call: ast.Call | None

    @property
    def callee(self) -> str | None:
        """The callee as the code names it (`torch.optim.AdamW`, `DataLoader`)."""
        return ast.unparse(self.call.func) if self.call is not None else None

    def passes(self, keyword: str) -> bool:
        """Whether the call passes `keyword`: by name, or in a `**name` mapping that holds
        it as the call runs."""
        return self.call is not None and (
            any(k.arg == keyword for k in self.call.keywords) or
            any(keyword in spread for spread in self._spreads().values()))

    def source(self, keyword: str, flags: Mapping[str, Flag], where: Path | None = None,
               ) -> Source:
        """Where the call's `keyword` argument comes from: the script's flag where the code
        passes `<parsed args>.<dest>` (by name, or in a `**name` it built as `dict(...)` or
        `{...}` before this line, as timm's `train.py` builds its loaders' arguments) and that
        dest holds the value the parser gave it, else this line (`where`: the folder its file
        is named from)."""
        line = self.code(where)
        if self.call is None:
            return line
        value = next((k.value for k in self.call.keywords if k.arg == keyword), None)
        if value is None:
            value = next((entry for name, spread in self._spreads().items()
                          if keyword in spread and
                          (entry := _mapping_entry(self.file, name, keyword, self.line))
                          is not None), None)
        flag = self._flag(value, flags)
        if flag is None:
            return line
        return Source(flag=flag.option, form=flag.form, const=flag.const,
                      aliases=flag.aliases)

    def _spreads(self) -> dict[str, Mapping[str, Any]]:
        """The call's `**name` arguments, by name, with the mappings they hold as it runs."""
        out = {}
        for keyword in self.call.keywords if self.call is not None else ():
            if keyword.arg is None and isinstance(keyword.value, ast.Name):
                held = self.frame.f_locals.get(keyword.value.id)
                if isinstance(held, Mapping):
                    out[keyword.value.id] = held
        return out

    def code(self, where: Path | None = None) -> Source:
        """This line, its file named from `where` (the script's folder) where it lies there."""
        return Source(file=shown_path(self.file, where), line=self.line, call=self.callee)

    def _flag(self, node: ast.expr | None, flags: Mapping[str, Flag]) -> Flag | None:
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
            return None
        flag = flags.get(node.attr)
        if flag is None:
            return None
        holder = self.frame.f_locals.get(node.value.id, self.frame.f_globals.get(node.value.id))
        value = getattr(holder, node.attr, _MISSING)
        try:
            same = value is flag.value or bool(value == flag.value)
        except Exception:  # noqa: BLE001 - a value that cannot be compared is not the flag's
            same = False
        return flag if same else None


_MISSING = object()


def call_site(frame: FrameType | None, building: Any = None) -> CallSite | None:
    """The user's call that a hook's caller `frame` runs under: `frame` itself, or, for the
    constructor of `building`, the frame that called the first of its `__init__`s (its
    subclasses' and a dataclass's generated one); None where that is not the user's own code
    (a library built it of its own accord, or autotune did)."""
    frame = _outside(frame, building)
    if frame is None or not is_users(frame.f_code.co_filename):
        return None
    call = _call_node(frame)
    return CallSite(frame, frame.f_code.co_filename,
                    call.lineno if call is not None else frame.f_lineno, call)


_CONSTRUCTORS = ("__init__", "__post_init__")


def _outside(frame: FrameType | None, building: Any) -> FrameType | None:
    """`frame`, or, for the constructor of `building`, the first frame outside its
    `__init__`s (its subclasses', a dataclass's generated one, a hook's own wrapper)."""
    while frame is not None and building is not None and \
            frame.f_locals.get("self") is building and (
                frame.f_code.co_name in _CONSTRUCTORS or
                frame.f_code.co_filename.startswith(_AUTOTUNE)):  # a hook's own wrapper
        frame = frame.f_back
    return frame


def factory_site(frame: FrameType | None, building: Any) -> CallSite | None:
    """The script's call of the library function that built `building` (timm's
    `create_optimizer_v2` building a torch SGD from its parameter groups): the first frame of
    the user's own code outward from its constructor; None where autotune's code comes first
    (autotune built it)."""
    return caller_site(_outside(frame, building))


def caller_site(frame: FrameType | None) -> CallSite | None:
    """The user's call that a library's code runs under (`model(x)` under torch's module call
    machinery): the first frame of the user's own code from `frame` outward; None where
    autotune's own code is met first."""
    while frame is not None and not is_users(frame.f_code.co_filename):
        if frame.f_code.co_filename.startswith(_AUTOTUNE):
            return None
        frame = frame.f_back
    return call_site(frame)


def user_frames(frame: FrameType | None) -> list[FrameType]:
    """The frames of the user's own code from `frame` outward."""
    out = []
    while frame is not None:
        if is_users(frame.f_code.co_filename):
            out.append(frame)
        frame = frame.f_back
    return out


def is_users(file: str) -> bool:
    """A file of the user's own: a real file outside every library folder and autotune."""
    return not file.startswith(("<", _AUTOTUNE)) and not file.startswith(_library_roots())


_library_roots = functools.cache(library_roots)


def shown_path(file: str, where: Path | None) -> str:
    """`file` as the answer names it: relative to the script's folder where it lies there."""
    if where is not None:
        try:
            return str(Path(file).resolve().relative_to(where.resolve()))
        except ValueError:
            pass
    return file


def source_line(file: str, line: int) -> str:
    """The text of a line of a file, stripped ('' where it cannot be read)."""
    lines = _source(file)[1]
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def assignment_line(file: str, name: str, before: int | None = None) -> int | None:
    """The line of the first `name = <call>` in `file` (before line `before`, where given):
    where the script builds what it names `name`."""
    tree = _source(file)[0]
    if tree is None:
        return None
    found = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assign)
             and isinstance(node.value, ast.Call)
             and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
             and (before is None or node.lineno <= before)]
    return min(found) if found else None


def argument_flag(file: str | Path, cls: type, parameter: str, value: Any,
                  flags: Mapping[str, Any]) -> Source | None:
    """The script's flag that its code passes as `parameter` where it builds a `cls`
    (`Data(args.batch_size)`, `Data(batch_size=args.batch_size)`), read from its source: for
    an object the library holds, built before the hook could see the call; None where no such
    call passes a flag that holds `value`."""
    tree = _source(str(file))[0]
    if tree is None:
        return None
    try:
        names = [p for p in inspect.signature(cls.__init__).parameters][1:]
    except (TypeError, ValueError):
        names = []
    index = names.index(parameter) if parameter in names else None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or _last_name(node.func) != cls.__name__:
            continue
        given = next((k.value for k in node.keywords if k.arg == parameter), None)
        if given is None and index is not None and index < len(node.args):
            given = node.args[index]
        if isinstance(given, ast.Attribute) and given.attr in flags and \
                flags[given.attr].value == value:
            flag = flags[given.attr]
            return Source(flag=flag.option, form=flag.form, const=flag.const,
                          aliases=flag.aliases)
    return None


def _last_name(node: ast.expr) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) else \
        node.id if isinstance(node, ast.Name) else None


def _call_node(frame: FrameType) -> ast.Call | None:
    """The call expression the frame is running, found by the instruction's position."""
    tree = _source(frame.f_code.co_filename)[0]
    if tree is None:
        return None
    positions = inspect.getframeinfo(frame, context=0).positions
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    if positions is not None and positions.col_offset is not None:
        span = (positions.lineno, positions.col_offset, positions.end_lineno,
                positions.end_col_offset)
        exact = [c for c in calls if (c.lineno, c.col_offset, c.end_lineno,
                                      c.end_col_offset) == span]
        if exact:
            return exact[0]
    line = frame.f_lineno
    around = [c for c in calls if c.lineno <= line <= (c.end_lineno or c.lineno)]
    return max(around, key=lambda c: (c.lineno, c.col_offset)) if around else None


@functools.lru_cache(maxsize=64)
def _parsed(file: str, mtime: float) -> tuple[ast.Module | None, list[str]]:
    try:
        text = Path(file).read_text()
    except (OSError, UnicodeDecodeError):
        return None, []
    try:
        return ast.parse(text), text.splitlines()
    except SyntaxError:
        return None, text.splitlines()


def _mapping_entry(file: str, name: str, key: str, before: int) -> ast.expr | None:
    """The expression `file` gives `key` where it last builds `name` before line `before`
    as `name = dict(key=...)` or `name = {"key": ...}`; None where it does not."""
    tree = _source(file)[0]
    found: list[tuple[int, ast.expr]] = []
    for node in ast.walk(tree) if tree is not None else ():
        if not (isinstance(node, ast.Assign) and node.lineno < before and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets)):
            continue
        built = node.value
        if isinstance(built, ast.Call) and _last_name(built.func) == "dict":
            found += [(node.lineno, k.value) for k in built.keywords if k.arg == key]
        elif isinstance(built, ast.Dict):
            found += [(node.lineno, v) for k, v in zip(built.keys, built.values, strict=True)
                      if isinstance(k, ast.Constant) and k.value == key]
    return max(found, key=lambda item: item[0])[1] if found else None


def _source(file: str) -> tuple[ast.Module | None, list[str]]:
    try:
        return _parsed(file, os.stat(file).st_mtime)
    except OSError:
        return None, []


def named_flag(flag: str, parsed: Mapping[str, Any], knob: str = "") -> Source:
    """How the user's named flag (`--arg KNOB=FLAG`) is written: as the script's parser takes
    it, else as the command line gives it (`--flag=VALUE` where it is not given: argparse and
    `--key=value` configurators both read that). A script whose argparse parser has no such
    flag is bad input."""
    traced = next((f for f in parsed.values() if flag in (f.option, *f.aliases)), None)
    if traced is not None:
        return Source(flag=flag, form=traced.form, const=traced.const, aliases=tuple(
            o for o in (traced.option, *traced.aliases) if o != flag))
    if parsed:
        options = ", ".join(sorted(f.option for f in parsed.values()))
        raise ScriptError(f"--arg {knob}={flag}: the script's parser has no {flag} (its "
                          f"flags: {options})")
    if flag in sys.argv[1:]:
        return Source(flag=flag, form=VALUE)
    return Source(flag=flag, form=EQUALS)
