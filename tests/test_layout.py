"""The process boundary is a wall in the tree: what runs in a trial's process never imports the
tuner's side, the read side never imports the search, and no modules import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import autotune

PACKAGE = Path(autotune.__file__).parent
# Each part, and the parts it may import (the top-level modules are shared by all).
MAY_IMPORT = {"trial": {"trial"}, "study": {"study", "trial"},
              "search": {"search", "study", "trial"}, "show": {"show", "study", "trial"}}
BASE = {"config", "errors", "flags", "formatting", "hardware", "options", "stats", "target"}


def _imports() -> dict[str, set[str]]:
    """Each module of autotune and the autotune modules it imports, in functions too."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("autotune."):
                targets.add(node.module)
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("autotune.")}
        graph[name.removesuffix(".__init__")] = targets
    return graph


def _part(module: str) -> str:
    return module.split(".")[1]


def test_each_side_imports_only_what_lies_below_it() -> None:
    graph = _imports()
    assert {_part(m) for m in graph if m.count(".") == 2} == set(MAY_IMPORT)
    for module, targets in graph.items():
        if module.count(".") < 2:
            continue
        part = _part(module)
        wrong = {t for t in targets if t.count(".") >= 2 and _part(t) not in MAY_IMPORT[part]}
        assert not wrong, f"{module} imports {wrong}"
    for name in BASE:
        assert {t for t in graph[f"autotune.{name}"] if t.count(".") >= 2} == set(), name
        assert graph[f"autotune.{name}"] <= {f"autotune.{b}" for b in BASE}, name


def test_no_modules_import_each_other_in_a_circle() -> None:
    graph = _imports()
    visiting, done = set(), set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in visiting, " -> ".join((*path, module))
        if module in done or module not in graph:
            return
        visiting.add(module)
        for target in graph[module]:
            visit(target, (*path, module))
        visiting.discard(module)
        done.add(module)

    for module in graph:
        if module != "autotune":  # the package's face re-exports from below
            visit(module, ())


# Started by name in a process of their own (`python -c "from autotune.trial.child import
# child_main"`, torchrun's `-m autotune.trial.child`), never imported on the tuner's side.
ENTRY_POINTS = {"autotune.trial.child", "autotune.trial.server", "autotune.trial.warm"}


def test_outside_the_trial_process_only_its_protocol_is_imported() -> None:
    """What crosses the process boundary is `trial/protocol`'s typed records: the tuner's side,
    the read side and the display never reach into the trial's own modules. The package's face
    (`autotune/__init__.py`) is the exception: it hands the training functions on to users'
    scripts and to the exported ones."""
    for module, targets in _imports().items():
        if module == "autotune" or module.startswith("autotune.trial"):
            continue
        reached = {t for t in targets if t.startswith("autotune.trial")}
        assert reached <= {"autotune.trial.protocol"}, f"{module} imports {reached}"
    for entry in ENTRY_POINTS:
        assert Path(PACKAGE.parent, *entry.split(".")).with_suffix(".py").is_file(), entry
